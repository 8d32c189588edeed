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

const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_RESOURCE: u32 = 24;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Sets or clears `bits` (capabilities below 32) in this thread's
/// effective set. Capabilities are per thread in Linux.
fn set_effective_caps(bits: u32, on: bool) -> io::Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array as capget(2) expects for v3.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if on {
        data[0].effective |= bits & data[0].permitted;
    } else {
        data[0].effective &= !bits;
    }
    // SAFETY: as above; only the calling thread's effective set changes.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Capabilities a daemon running as root keeps even after setfsuid, but
/// that an ordinary caller does not have: CAP_SYS_RESOURCE (reserved
/// blocks, quota limits) and CAP_SYS_ADMIN (trusted.* xattrs).
const PRIVILEGE_CAPS: u32 = (1 << CAP_SYS_RESOURCE) | (1 << CAP_SYS_ADMIN);

/// Restores root credentials when dropped.
struct Switched {
    groups_set: bool,
    dropped_caps: u32,
}

impl Drop for Switched {
    fn drop(&mut self) {
        raw_setfsuid(0);
        raw_setfsgid(0);
        if self.dropped_caps != 0 {
            if let Err(e) = set_effective_caps(self.dropped_caps, true) {
                tracing::error!("cannot restore capabilities: {e}");
            }
        }
        if self.groups_set {
            if let Err(e) = raw_setgroups(&[]) {
                tracing::error!("cannot restore supplementary groups: {e}");
            }
        }
    }
}

fn switch_to(caller: &Caller, groups: Option<&[u32]>, keep: u32) -> io::Result<Switched> {
    let mut guard = Switched {
        groups_set: false,
        dropped_caps: 0,
    };
    if let Some(groups) = groups {
        raw_setgroups(groups)?;
        guard.groups_set = true;
    }
    raw_setfsgid(caller.gid);
    raw_setfsuid(caller.uid);
    let drop_caps = if caller.uid != 0 {
        PRIVILEGE_CAPS & !keep
    } else {
        0
    };
    if drop_caps != 0 {
        set_effective_caps(drop_caps, false)?;
        guard.dropped_caps = drop_caps;
    }
    Ok(guard)
}

fn is_permission_error(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM))
}

/// Runs `op` with the caller's fsuid/fsgid. Supplementary groups cost a
/// /proc read, so they are fetched only when the first attempt is refused
/// for lack of permission; `op` must be a single call whose failure leaves
/// no trace, so the retry is safe.
pub fn as_caller<T>(caller: &Caller, op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    as_caller_keeping(caller, 0, op)
}

/// [`as_caller`] for registering a passthrough backing file: the kernel
/// requires CAP_SYS_ADMIN for that, and records the credentials it runs
/// with for the backing file's I/O.
pub fn as_caller_with_admin<T>(
    caller: &Caller,
    op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    as_caller_keeping(caller, 1 << CAP_SYS_ADMIN, op)
}

fn as_caller_keeping<T>(
    caller: &Caller,
    keep: u32,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    if caller.uid == 0 && caller.gid == 0 {
        return op();
    }
    let first = {
        let _guard = switch_to(caller, None, keep)?;
        op()
    };
    match first {
        Err(e) if is_permission_error(&e) && caller.pid != 0 => {
            let groups = match supplementary_groups(caller.pid) {
                Ok(g) if !g.is_empty() => g,
                // The caller is gone or has no extra groups: the answer stands.
                _ => return Err(e),
            };
            let _guard = switch_to(caller, Some(&groups), keep)?;
            op()
        }
        other => other,
    }
}

/// [`as_caller`] with the caller's supplementary groups loaded up front.
/// For calls whose outcome depends on group membership without failing:
/// the kernel silently clears a set-group-ID bit for a non-member.
pub fn as_caller_with_groups<T>(
    caller: &Caller,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    if caller.uid == 0 && caller.gid == 0 {
        return op();
    }
    let groups = if caller.pid != 0 {
        supplementary_groups(caller.pid).unwrap_or_default()
    } else {
        Vec::new()
    };
    let _guard = switch_to(caller, Some(&groups), 0)?;
    op()
}

/// Like [`as_caller`], but with the caller's umask applied to creations.
/// Request threads own a private umask, so it is simply left set: every
/// creating request sets its own.
pub fn as_caller_with_umask<T>(
    caller: &Caller,
    umask: u32,
    mode: u32,
    op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    set_thread_umask(umask)?;
    if mode & libc::S_ISGID != 0 {
        as_caller_with_groups(caller, op)
    } else {
        as_caller(caller, op)
    }
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

/// Checks that this process can take on other users' fs identities (it
/// needs CAP_SETUID and CAP_SETGID); setfsuid reports no error otherwise.
pub fn verify_switching() -> io::Result<()> {
    const PROBE: u32 = 65534;
    raw_setfsgid(PROBE);
    raw_setfsuid(PROBE);
    // SAFETY: setfsuid/setfsgid(-1) change nothing and return the current id.
    let (uid, gid) = unsafe {
        (
            libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long),
            libc::syscall(libc::SYS_setfsgid, -1 as libc::c_long),
        )
    };
    raw_setfsuid(0);
    raw_setfsgid(0);
    if uid != PROBE as libc::c_long || gid != PROBE as libc::c_long {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "cannot act with callers' identities (CAP_SETUID/CAP_SETGID missing)",
        ));
    }
    Ok(())
}
