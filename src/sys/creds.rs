//! Per-thread credentials: run a backing-file-system call as the FUSE caller.
//!
//! Linux keeps fsuid, fsgid, supplementary groups and (after
//! `unshare(CLONE_FS)`) the umask per thread, so each request thread can take
//! on its caller's identity without affecting the others. glibc's wrappers
//! for setgroups/setfsuid broadcast to all threads, so the raw syscalls are
//! used instead.

use std::cell::Cell;
use std::io;

/// Who made a request: the ids the kernel reports for the calling thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Thread id of the caller; used to read its supplementary groups.
    pub pid: u32,
}

thread_local! {
    static FS_UNSHARED: Cell<bool> = const { Cell::new(false) };
}

fn raw_setfsuid(uid: u32) {
    // SAFETY: setfsuid takes an integer and only affects the calling thread.
    unsafe {
        libc::syscall(libc::SYS_setfsuid, uid as libc::c_long);
    }
}

fn raw_setfsgid(gid: u32) {
    // SAFETY: setfsgid takes an integer and only affects the calling thread.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid as libc::c_long);
    }
}

fn raw_setgroups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: pointer/length describe a valid gid array; the raw syscall
    // affects only the calling thread.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            groups.len() as libc::c_long,
            groups.as_ptr(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Gives the calling thread its own umask/cwd, once per thread.
fn unshare_fs_once() -> io::Result<()> {
    if FS_UNSHARED.with(|u| u.get()) {
        return Ok(());
    }
    // SAFETY: CLONE_FS unshare only detaches this thread's fs_struct.
    let ret = unsafe { libc::unshare(libc::CLONE_FS) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    FS_UNSHARED.with(|u| u.set(true));
    Ok(())
}

/// Sets this thread's umask (after giving it a private one); returns the old one.
pub fn set_thread_umask(mask: u32) -> io::Result<u32> {
    unshare_fs_once()?;
    // SAFETY: umask cannot fail.
    Ok(unsafe { libc::umask(mask as libc::mode_t) } as u32)
}

/// Reads the supplementary groups of thread `pid` from /proc.
pub fn supplementary_groups(pid: u32) -> io::Result<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .unwrap_or("");
    Ok(line
        .split_whitespace()
        .filter_map(|g| g.parse::<u32>().ok())
        .collect())
}

/// Restores root credentials when dropped.
struct Switched {
    groups_set: bool,
}

impl Drop for Switched {
    fn drop(&mut self) {
        raw_setfsuid(0);
        raw_setfsgid(0);
        if self.groups_set {
            if let Err(e) = raw_setgroups(&[]) {
                tracing::error!("cannot restore supplementary groups: {e}");
            }
        }
    }
}

fn switch_to(caller: &Caller, groups: Option<&[u32]>) -> io::Result<Switched> {
    let mut guard = Switched { groups_set: false };
    if let Some(groups) = groups {
        raw_setgroups(groups)?;
        guard.groups_set = true;
    }
    raw_setfsgid(caller.gid);
    raw_setfsuid(caller.uid);
    Ok(guard)
}

fn is_permission_error(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM))
}

/// Runs `op` with the caller's fsuid/fsgid. Supplementary groups cost a
/// /proc read, so they are fetched only when the first attempt is refused
/// for lack of permission; `op` must be a single call whose failure leaves
/// no trace, so the retry is safe.
pub fn as_caller<T>(caller: &Caller, mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    if caller.uid == 0 && caller.gid == 0 {
        return op();
    }
    let first = {
        let _guard = switch_to(caller, None)?;
        op()
    };
    match first {
        Err(e) if is_permission_error(&e) && caller.pid != 0 => {
            let groups = match supplementary_groups(caller.pid) {
                Ok(g) if !g.is_empty() => g,
                // The caller is gone or has no extra groups: the answer stands.
                _ => return Err(e),
            };
            let _guard = switch_to(caller, Some(&groups))?;
            op()
        }
        other => other,
    }
}

/// Like [`as_caller`], but with the caller's umask applied to creations.
/// Request threads own a private umask, so it is simply left set: every
/// creating request sets its own.
pub fn as_caller_with_umask<T>(
    caller: &Caller,
    umask: u32,
    op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    set_thread_umask(umask)?;
    as_caller(caller, op)
}

/// Empties the supplementary groups of the whole process. Only called
/// while the process is single-threaded.
pub fn clear_process_groups() -> io::Result<()> {
    // SAFETY: an empty list with a null pointer is valid for setgroups.
    let ret = unsafe { libc::setgroups(0, std::ptr::null()) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
