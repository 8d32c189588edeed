//! `chronofs sandbox`: a command run against a private read-write layer
//! over a mount (issue 17). The daemon serves the sandbox
//! (cli/sandbox_host.rs); this asks it for one, enters a mount namespace
//! of its own in which the sandbox covers the mount point, and execs the
//! command there: the command and its children see the sandbox, every
//! other process the mount as it was. docs/ARCHITECTURE.md "Sandboxes".

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use super::history as h;
use crate::control::{self, proto::SandboxRow, Client};
use crate::sys;

/// The mount point `path` names and its control socket.
fn mount_at(path: &Path) -> Result<(PathBuf, PathBuf)> {
    let abs = path
        .canonicalize()
        .with_context(|| format!("{}", path.display()))?;
    let m = control::mount_of(&abs)
        .filter(|m| m.mount_point == abs)
        .ok_or_else(|| {
            anyhow!(
                "{}: not the mount point of a chronofs mount",
                path.display()
            )
        })?;
    let Some(socket) = control::socket_of(&m, sys::geteuid()) else {
        if control::served_at(&m, sys::geteuid()).is_some() {
            bail!(
                "{}: a bind mount of a chronofs mount; give the mount point the daemon mounted",
                abs.display()
            );
        }
        bail!(
            "the chronofs mount at {} has no control socket",
            abs.display()
        );
    };
    Ok((abs, socket))
}

/// Runs `cmd` in sandbox `id` of the mount at `mnt`, or in a new one.
/// Returns only on failure: the command replaces this process.
pub fn run(mnt: &Path, id: Option<u32>, cmd: &[OsString]) -> Result<()> {
    let Some((prog, args)) = cmd.split_first() else {
        return Err(anyhow::anyhow!(super::UsageError(
            "give the command to run after --: chronofs sandbox MNT -- CMD ARGS...".into()
        )));
    };
    let (mnt, socket) = mount_at(mnt)?;
    // Before a sandbox is made for it.
    if let Some(why) = unrunnable(prog) {
        return Err(why.into());
    }
    // Resolved again inside the namespace: a directory under the mount
    // point then leads into the sandbox.
    let cwd = std::env::current_dir().ok();
    let row = Client::Daemon(&socket).sandbox_start(id)?;
    if sys::geteuid() == 0 {
        let from = row
            .mountpoint
            .as_deref()
            .ok_or_else(|| anyhow!("the daemon did not serve sandbox {}", row.id))?;
        sys::private_mount_namespace().context("cannot make a mount namespace for the sandbox")?;
        sys::bind_mount(Path::new(from), &mnt)
            .with_context(|| format!("cannot put sandbox {} over {}", row.id, mnt.display()))?;
    } else {
        // The sandbox's session lies where only root reaches it: the
        // daemon binds it into this process's own namespace.
        sys::private_user_namespace().context(
            "cannot make a user namespace for the sandbox (are unprivileged user namespaces \
             allowed? sysctl user.max_user_namespaces)",
        )?;
        Client::Daemon(&socket)
            .sandbox_enter(row.id)
            .with_context(|| format!("cannot put sandbox {} over {}", row.id, mnt.display()))?;
    }
    if let Some(cwd) = cwd {
        if let Err(e) = std::env::set_current_dir(&cwd) {
            bail!("{}: {e}", cwd.display());
        }
    }
    eprintln!(
        "chronofs: sandbox {} over {} (chronofs sandbox discard {} throws it away)",
        row.id,
        mnt.display(),
        row.id
    );
    let e = std::process::Command::new(prog).args(args).exec();
    let code = match e.raw_os_error() {
        Some(libc::ENOENT) => super::exit::NOT_FOUND,
        _ => super::exit::CANNOT_RUN,
    };
    Err(super::CannotRun {
        code,
        message: format!("cannot run {}: {e}", prog.to_string_lossy()),
    }
    .into())
}

/// Why `prog` cannot run, as execvp(3) would find it: not found (127),
/// or found but not executable (126).
fn unrunnable(prog: &std::ffi::OsStr) -> Option<super::CannotRun> {
    use std::os::unix::fs::PermissionsExt;
    let file = |p: &Path| std::fs::metadata(p).ok().filter(|m| m.is_file());
    let is_exe = |m: &std::fs::Metadata| m.permissions().mode() & 0o111 != 0;
    let found: Vec<std::fs::Metadata> = if prog.as_encoded_bytes().contains(&b'/') {
        file(Path::new(prog)).into_iter().collect()
    } else {
        let path =
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        std::env::split_paths(&path)
            .filter_map(|dir| file(&dir.join(prog)))
            .collect()
    };
    let shown = prog.to_string_lossy();
    match (found.iter().any(is_exe), found.is_empty()) {
        (true, _) => None,
        (false, true) => Some(super::CannotRun {
            code: super::exit::NOT_FOUND,
            message: format!("cannot run {shown}: no such program"),
        }),
        (false, false) => Some(super::CannotRun {
            code: super::exit::CANNOT_RUN,
            message: format!("cannot run {shown}: not executable"),
        }),
    }
}

#[derive(Serialize)]
struct Listed {
    mount: String,
    #[serde(flatten)]
    row: SandboxRow,
}

/// The sandboxes of the mount at `mnt`, or of every chronofs mount.
fn all_sandboxes(mnt: Option<&Path>) -> Result<Vec<(PathBuf, PathBuf, SandboxRow)>> {
    let mounts = match mnt {
        Some(p) => vec![mount_at(p)?],
        None => control::chronofs_mounts()
            .into_iter()
            .filter_map(|m| {
                Some((
                    m.mount_point.clone(),
                    control::socket_of(&m, sys::geteuid())?,
                ))
            })
            .collect(),
    };
    let mut out = Vec::new();
    for (point, socket) in mounts {
        match Client::Daemon(&socket).sandboxes() {
            Ok(list) => out.extend(
                list.sandboxes
                    .into_iter()
                    .map(|r| (point.clone(), socket.clone(), r)),
            ),
            Err(e) if mnt.is_some() => return Err(e.into()),
            // Another mount (or a sandbox's own): not one to ask.
            Err(_) => {}
        }
    }
    Ok(out)
}

pub fn list(mnt: Option<&Path>, json: bool) -> Result<()> {
    let all = all_sandboxes(mnt)?;
    if json {
        let rows: Vec<Listed> = all
            .into_iter()
            .map(|(point, _, row)| Listed {
                mount: point.to_string_lossy().into_owned(),
                row,
            })
            .collect();
        h::print_json(&rows);
        return Ok(());
    }
    for (point, _, row) in &all {
        let created = jiff::Timestamp::from_nanosecond(i128::from(row.created_ns))
            .map_or_else(|_| "?".to_string(), |t| t.to_string());
        println!(
            "{:>3}  {}  {}  {}  uid {}  changes in {}",
            row.id,
            point.display(),
            created,
            if row.mountpoint.is_some() {
                "served"
            } else {
                "kept"
            },
            row.owner,
            row.branch
        );
    }
    Ok(())
}

/// The mount point and control socket of the mount at `mnt`, or of the
/// one mount that has a sandbox `id`.
fn mount_of_sandbox(id: u32, mnt: Option<&Path>) -> Result<(PathBuf, PathBuf)> {
    Ok(match mnt {
        // The daemon decides (an unreadable sandbox is not listed).
        Some(mnt) => mount_at(mnt)?,
        None => {
            let found: Vec<_> = all_sandboxes(None)?
                .into_iter()
                .filter(|(_, _, r)| r.id == id)
                .collect();
            match found.as_slice() {
                [(point, socket, _)] => (point.clone(), socket.clone()),
                [] => bail!("no sandbox {id} on any chronofs mount"),
                _ => bail!("sandbox {id} exists on several mounts: give --mount MNT"),
            }
        }
    })
}

/// Applies sandbox `id` to its mount; lists the conflicts that stopped
/// it, if any (then the exit status is not 0).
pub fn commit(id: u32, mnt: Option<&Path>, force: bool, json: bool) -> Result<()> {
    let (point, socket) = mount_of_sandbox(id, mnt)?;
    let reply = Client::Daemon(&socket).sandbox_commit(id, force)?;
    if json {
        h::print_json(&reply);
    } else if reply.applied {
        println!(
            "sandbox {id} committed to {}: {} change(s) ({} object(s) moved in, {} removal(s)) \
             in {:.1} ms",
            point.display(),
            reply.changes,
            reply.moved,
            reply.removed,
            reply.elapsed_us as f64 / 1000.0
        );
    } else {
        for path in &reply.conflicts {
            println!("conflict: {path}");
        }
    }
    if !reply.applied {
        bail!(
            "sandbox {id} not committed: {} path(s) it changed were changed on {} too since it \
             was made; nothing was applied (commit --force applies it anyway, its side winning; \
             sandbox discard {id} throws it away)",
            reply.conflicts.len(),
            point.display()
        );
    }
    Ok(())
}

/// Throws sandbox `id` away: of the mount at `mnt`, or of the one mount
/// that has a sandbox `id`.
pub fn discard(id: u32, mnt: Option<&Path>, json: bool) -> Result<()> {
    let (point, socket) = mount_of_sandbox(id, mnt)?;
    let row = Client::Daemon(&socket).sandbox_discard(id)?;
    if json {
        h::print_json(&Listed {
            mount: point.to_string_lossy().into_owned(),
            row,
        });
    } else {
        println!("sandbox {id} of {} discarded", point.display());
    }
    Ok(())
}
