//! `chronofs undelete PATH`: the instant before PATH's removal, and, for
//! an object of a tree removed whole (`rm -rf dir`, then `undelete
//! dir/sub/f`), the directories on its way, made again as they were then.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::history::Target;
use super::restore::{self, Meta, Verb};
use crate::control::proto::NodeInfo;
use crate::control::{At, Components};
use crate::sys;

/// Where `undelete` finds PATH: the instant just before its removal, its
/// path then (its directory may have been renamed since), and how many of
/// the directories on its way were removed with it (gone now).
struct Deleted {
    at: At,
    src: Components,
    gone_dirs: usize,
}

/// The instant just before `path`'s last deletion, from the deleted list
/// of its parent; failing that, of the nearest directory on its way whose
/// deleted list has the next one holding `path` when it was removed (a
/// tree removed whole: `path` as it was before the `rm -rf` began, also
/// after a part of that tree was undeleted since).
fn before_deletion(t: &Target) -> Result<Deleted> {
    let Some((_, parent)) = t.path.split_last() else {
        bail!("the mount root cannot be deleted");
    };
    let gone_dirs = gone_ancestors(&t.abs, parent.len());
    for level in (0..=parent.len() - gone_dirs).rev() {
        if let Some((at, src)) = deleted_in(t, level)? {
            return Ok(Deleted { at, src, gone_dirs });
        }
    }
    if let Some(at) = before_unlink(t)? {
        let src = t.path.clone();
        return Ok(Deleted { at, src, gone_dirs });
    }
    bail!(
        "{} is not a deleted entry of its directory, nor was it in a directory deleted since \
         (see `chronofs ls --deleted`)",
        t.abs.display()
    )
}

/// For a file no deleted list leads to (its directory was removed again
/// since, after a part of its tree came back): the instant before the
/// file left its path, from its log. Not for a directory: an `rm -rf`
/// had emptied it by then.
fn before_unlink(t: &Target) -> Result<Option<At>> {
    let Ok(log) = t.client().log(&t.path, None, None) else {
        return Ok(None);
    };
    let Some(until) = log.incarnations.iter().rev().find_map(|i| i.until_seq) else {
        return Ok(None);
    };
    let at = At::Seq(until.prev());
    Ok(match t.client().stat(&t.path, &at) {
        Ok(node) if node.kind != "dir" => Some(at),
        _ => None,
    })
}

/// The instant before the last deletion of `t.path[level]` from its
/// directory, where `t.path` then existed, and `t.path` as it was then.
fn deleted_in(t: &Target, level: usize) -> Result<Option<(At, Components)>> {
    let dir = t.path[..level].to_vec();
    let name = &t.path[level];
    let listing = match t.client().list(&dir, &At::Now, true) {
        Ok(l) => l,
        // Not a directory now: nothing was deleted from it.
        Err(_) if level + 1 < t.path.len() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut hits: Vec<_> = listing
        .deleted
        .iter()
        .filter(|e| e.name_bytes() == *name)
        .collect();
    hits.sort_by_key(|e| std::cmp::Reverse(e.deleted_seq));
    for hit in hits {
        let at = At::Seq(hit.restore_seq);
        let mut src = dir_then(t, &dir, &at);
        src.extend(t.path[level..].iter().cloned());
        if level + 1 == t.path.len() || t.client().stat(&src, &at).is_ok() {
            return Ok(Some((at, src)));
        }
    }
    Ok(None)
}

/// The path directory `dir` (its path now) had at `at`: the deleted list
/// is that directory's, whatever its name was then. As it is now if
/// history cannot tell (the read of the entry then says what is wrong).
fn dir_then(t: &Target, dir: &Components, at: &At) -> Components {
    match t.client().follow(dir, &At::Now, at) {
        Ok(f) => f.path.unwrap_or_else(|| dir.clone()),
        Err(_) => dir.clone(),
    }
}

/// How many of the `parents` directories directly above `abs` are gone.
fn gone_ancestors(abs: &Path, parents: usize) -> usize {
    (1..=parents)
        .take_while(|&up| std::fs::symlink_metadata(ancestor(abs, up)).is_err())
        .count()
}

/// Refuses to make `t.path[..=i]` again where the directory it was (at
/// `path` at `at`) lives on under another name: a second copy of a live
/// directory is not what was deleted.
fn refuse_moved(t: &Target, path: &Components, node: &NodeInfo, at: &At, i: usize) -> Result<()> {
    let Some(now) = moved_to(t, path, node, at) else {
        return Ok(());
    };
    let mut there = ancestor(&t.abs, t.path.len());
    there.extend(now.iter().map(|n| OsStr::from_bytes(n)));
    let rest: PathBuf = t.path[i + 1..]
        .iter()
        .map(|n| OsStr::from_bytes(n))
        .collect();
    bail!(
        "{} was not deleted: it is {} now; undelete {} (or use --to DEST)",
        ancestor(&t.abs, t.path.len() - 1 - i).display(),
        there.display(),
        there.join(rest).display()
    )
}

/// Where directory `node`, at `path` at `at`, is now, if it still is.
fn moved_to(t: &Target, path: &Components, node: &NodeInfo, at: &At) -> Option<Components> {
    let now = t.client().follow(path, at, &At::Now).ok()?.path?;
    let live = t.client().stat(&now, &At::Now).ok()?;
    (node.obj.is_some() && live.obj == node.obj && live.kind == "dir").then_some(now)
}

fn ancestor(abs: &Path, up: usize) -> PathBuf {
    let mut p = abs.to_path_buf();
    for _ in 0..up {
        p.pop();
    }
    p
}

/// `undelete PATH` (no `--to`) of an object whose `gone` nearest
/// directories were removed with it: those directories are made again
/// with their attributes then (holding only what is undeleted into them),
/// or, if the undelete fails, removed again.
fn into_gone_dirs(t: &Target, d: &Deleted, json_out: bool) -> Result<()> {
    restore::refuse_unmounted(t, &t.abs)?;
    let resolved = t.client().resolve(&d.at)?;
    let top = t.path.len() - 1 - d.gone_dirs;
    // What each directory was, asked before anything is made; below the
    // level whose deleted list held PATH, its names then are its names now.
    t.client().stat(&d.src, &d.at)?;
    let mut dirs = Vec::new();
    for i in top..t.path.len() - 1 {
        let then = d.src.len() - (t.path.len() - i);
        let node = t.client().node(&d.src[..=then].to_vec(), &d.at)?;
        let shown = ancestor(&t.abs, t.path.len() - 1 - i);
        refuse_moved(t, &d.src[..=then].to_vec(), &node, &d.at, i)?;
        if node.kind != "dir" {
            bail!(
                "{} was a {} then, not a directory; undelete it first",
                shown.display(),
                node.kind
            );
        }
        let name = sys::cstr(OsStr::from_bytes(&t.path[i]))?;
        dirs.push((name, shown, Meta::of_node(&node)?));
    }
    let base = ancestor(&t.abs, d.gone_dirs + 1);
    let base_c = sys::cstr(base.as_os_str())?;
    let open_dir = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let base_fd = sys::openat(sys::CWD, &base_c, open_dir, 0)
        .with_context(|| format!("cannot open {}", base.display()))?;
    let mut made: Vec<(OwnedFd, CString, OwnedFd)> = Vec::new();
    let result = (|| {
        for (name, shown, _) in &dirs {
            let parent = match made.last() {
                Some((_, _, fd)) => sys::reopen_dir(fd.as_fd(), open_dir)?,
                None => sys::reopen_dir(base_fd.as_fd(), open_dir)?,
            };
            // Private until its recorded attributes are set, as restore
            // makes every directory.
            sys::mkdirat(parent.as_fd(), name, 0o700)
                .with_context(|| format!("cannot make {}", shown.display()))?;
            let fd = sys::openat(parent.as_fd(), name, open_dir, 0)
                .with_context(|| format!("cannot open {}", shown.display()))?;
            made.push((parent, name.clone(), fd));
        }
        let n = restore::restore(t, &d.src, &d.at, &t.abs, false)?;
        let is_root = sys::geteuid() == 0;
        // Innermost first: setting a directory's times comes after the
        // changes made in it.
        for ((_, _, fd), (_, shown, meta)) in made.iter().zip(&dirs).rev() {
            restore::set_meta(fd.as_fd(), shown, meta, false, is_root)?;
        }
        anyhow::Ok(n)
    })();
    match result {
        Ok(n) => {
            restore::report(
                t,
                Verb::Undelete,
                resolved,
                &t.abs,
                n + made.len() as u64,
                json_out,
            );
            Ok(())
        }
        Err(e) => {
            for (parent, name, _) in made.iter().rev() {
                // Only if still empty: what another process put there stays.
                let _ = sys::unlinkat(parent.as_fd(), name, libc::AT_REMOVEDIR);
            }
            Err(e)
        }
    }
}

/// `undelete PATH [--to DEST]`.
pub fn run(t: &Target, to: Option<PathBuf>, json_out: bool) -> Result<()> {
    let d = before_deletion(t)?;
    let dest = match to {
        Some(d) => super::history::absolutize(&d)?,
        None => t.abs.clone(),
    };
    if std::fs::symlink_metadata(&dest).is_ok() {
        bail!(
            "{} exists; use --to DEST to undelete elsewhere",
            dest.display()
        );
    }
    if dest == t.abs && d.gone_dirs > 0 {
        return into_gone_dirs(t, &d, json_out);
    }
    restore::run(t, &d.src, Verb::Undelete, &d.at, &dest, json_out)
}
