//! `chronofs branch`: a mounted union's branches, listed and changed
//! while mounted (issue 17). The daemon does the change; this asks it.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::history::{self as h, Backend};
use crate::control::proto::BranchRow;

fn daemon_target(mnt: &Path) -> Result<h::Target> {
    let t = h::target(mnt, None)?;
    if matches!(t.backend, Backend::Local(_)) {
        bail!(
            "nothing is mounted at {}: branches change only on a mounted union",
            mnt.display()
        );
    }
    Ok(t)
}

fn show(b: &BranchRow) -> String {
    format!(
        "{:>3}  {}  id {:<3} {}{}{}",
        b.position,
        b.mode,
        b.id,
        b.path,
        if b.upper {
            "  (upper: copy-ups go here)"
        } else {
            ""
        },
        b.snapshot
            .as_deref()
            .map_or_else(String::new, |n| format!("  (snapshot {n})"))
    )
}

pub fn list(mnt: &Path, json: bool) -> Result<()> {
    let reply = daemon_target(mnt)?.client().branches()?;
    if json {
        h::print_json(&reply);
        return Ok(());
    }
    for b in &reply.branches {
        println!("{}", show(b));
    }
    Ok(())
}

/// Inserts DIR into the union at `position` (0 = top, the default).
pub fn add(mnt: &Path, dir: &Path, position: Option<u32>, mode: &str, json: bool) -> Result<()> {
    let writable = parse_mode(mode)?;
    let target = daemon_target(mnt)?;
    let client = target.client();
    let now = client.branches()?.branches;
    // Another user's request goes as it is: the daemon says only root may
    // (the checks below told them about paths first).
    let privileged = crate::sys::geteuid() == 0;
    let dir = match dir.canonicalize() {
        Ok(d) => d,
        Err(_) if !privileged => std::path::absolute(dir)?,
        Err(e) => return Err(e).with_context(|| format!("new branch {}", dir.display())),
    };
    if privileged {
        check_new_branch(mnt, &dir, &now, writable)?;
    }
    let at = position.map_or(0, |p| (p as usize).min(now.len()));
    let dir_text = dir
        .to_str()
        .with_context(|| format!("{}: not a UTF-8 path", dir.display()))?;
    let reply = client.branch_add(dir_text, Some(at as u32), writable)?;
    print_set(
        &reply,
        json,
        &format!("{} added at position {at}", dir.display()),
    );
    Ok(())
}

/// The command's own checks of a new branch, before the daemon's: not
/// the mount point, not nested with a branch, not inside the mount.
fn check_new_branch(mnt: &Path, dir: &Path, now: &[BranchRow], writable: bool) -> Result<()> {
    use crate::union::spec::{Mode, SpecError, UnionSpec};
    use std::os::unix::fs::MetadataExt;
    // The mount itself (the path as the mount shows it): the daemon would
    // serve its own branch, and its first look at it waited for itself.
    let (d, m) = (std::fs::metadata(dir)?, std::fs::metadata(mnt)?);
    if (d.dev(), d.ino()) == (m.dev(), m.ino()) {
        bail!(
            "{} is the mount point itself: a mount cannot be its own branch",
            dir.display()
        );
    }
    if let Some(why) = nesting_refusal(dir, now) {
        bail!(why);
    }
    let mode = if writable { Mode::Rw } else { Mode::Ro };
    match UnionSpec::of_paths(&[(dir, mode)])?.validate(mnt) {
        Err(SpecError::InsideMount { mnt, .. }) => {
            bail!("{} lies inside the mount point {mnt}", dir.display())
        }
        Err(SpecError::MountInside { mnt, .. }) => bail!(
            "the mount point {mnt} lies inside {}: the mount would contain itself",
            dir.display()
        ),
        other => Ok(other?),
    }
}

/// Why `dir` cannot join the union of `branches` (top first): it is one
/// of them, or lies inside or contains one, told by the positions `branch
/// list` shows. A snapshot's fresh branch lies in the store, by default
/// inside SRC: nested by design, it is no reason to refuse another
/// branch, but a new one is still checked against it. Checked by the
/// command and again by the daemon, which other clients reach too.
pub(super) fn nesting_refusal(dir: &Path, branches: &[BranchRow]) -> Option<String> {
    use crate::union::spec::{overlap, Overlap};
    let shown = dir.display();
    // One taken out again (`branch remove --force`) comes back.
    let fresh = crate::store::is_snapshot_branch(dir);
    branches.iter().enumerate().find_map(|(pos, b)| {
        Some(match overlap(dir, Path::new(&b.path))? {
            Overlap::Same => format!("{shown} is already branch {pos} of the union"),
            Overlap::Inside if fresh => return None,
            Overlap::Inside => format!("{shown} lies inside branch {pos} ({})", b.path),
            Overlap::Contains => format!("{shown} contains branch {pos} ({})", b.path),
        })
    })
}

/// Freezes the union's upper branch under a name, a fresh one on top.
pub fn snapshot(mnt: &Path, name: Option<&str>, force: bool, json: bool) -> Result<()> {
    let reply = daemon_target(mnt)?.client().snapshot(name, force)?;
    let what = format!(
        "snapshot {}: the upper branch is frozen; changes now go to {}",
        reply.name, reply.fresh
    );
    report(json, &reply, &reply.set, &what);
    Ok(())
}

/// A set-changing command's reply: as JSON, or the new set under `what`.
fn report(
    json: bool,
    reply: &impl serde::Serialize,
    set: &crate::control::proto::BranchSetReply,
    what: &str,
) {
    if json {
        h::print_json(reply);
    } else {
        print_set(set, false, what);
    }
}

/// Folds frozen branches into the oldest of them.
pub fn snapmerge(mnt: &Path, upto: Option<&str>, json: bool) -> Result<()> {
    let reply = daemon_target(mnt)?.client().snapmerge(upto)?;
    let what = format!(
        "snapmerge: {} folded into snapshot {} ({} objects moved, {} directories merged, \
         {} whiteouts applied)",
        reply.merged.join(", "),
        reply.into,
        reply.moved,
        reply.merged_dirs,
        reply.whiteouts
    );
    report(json, &reply, &reply.set, &what);
    Ok(())
}

/// A branch as the user named it, for the daemon: a position as given, a
/// path made absolute here (the daemon's directory is not the caller's).
fn named(branch: &str) -> String {
    if branch.parse::<u32>().is_ok() {
        return branch.to_string();
    }
    Path::new(branch)
        .canonicalize()
        .ok()
        .and_then(|p| p.to_str().map(str::to_string))
        .unwrap_or_else(|| branch.to_string())
}

/// Takes a branch out of the union.
pub fn remove(mnt: &Path, branch: &str, force: bool, json: bool) -> Result<()> {
    let reply = daemon_target(mnt)?
        .client()
        .branch_remove(&named(branch), force)?;
    print_set(&reply, json, &format!("branch {branch} removed"));
    Ok(())
}

fn print_set(reply: &crate::control::proto::BranchSetReply, json: bool, what: &str) {
    if json {
        h::print_json(reply);
        return;
    }
    match reply.revoked {
        0 => println!("{what}"),
        n => println!("{what}; {n} handle(s) revoked (they now fail with ESTALE)"),
    }
    for b in &reply.branches {
        println!("{}", show(b));
    }
}

fn parse_mode(mode: &str) -> Result<bool> {
    match mode {
        "rw" => Ok(true),
        "ro" => Ok(false),
        other => bail!("unknown mode {other:?}: use ro or rw"),
    }
}

pub fn mode(mnt: &Path, branch: &str, mode: &str, force: bool, json: bool) -> Result<()> {
    let writable = parse_mode(mode)?;
    let reply = daemon_target(mnt)?
        .client()
        .branch_mode(&named(branch), writable, force)?;
    if json {
        h::print_json(&reply);
        return Ok(());
    }
    let b = &reply.branch;
    if !reply.changed {
        println!("branch {} ({}) is already {}", b.position, b.path, b.mode);
        return Ok(());
    }
    println!(
        "branch {} ({}) is now {}{}",
        b.position,
        b.path,
        b.mode,
        match reply.revoked {
            0 => String::new(),
            n => format!("; {n} write handle(s) revoked (they now fail with ESTALE)"),
        }
    );
    Ok(())
}
