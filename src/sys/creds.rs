//! Per-thread credentials: run a backing-file-system call as the FUSE caller.
//!
//! Linux keeps fsuid, fsgid, supplementary groups and (after
//! `unshare(CLONE_FS)`) the umask per thread, so each request thread can take
//! on its caller's identity without affecting the others. glibc's wrappers
//! for setgroups/setfsuid broadcast to all threads, so the raw syscalls are
//! used instead: rustix's `set_thread_groups` and capability calls issue
//! them directly; setfsuid/setfsgid, which rustix lacks, stay raw
//! `syscall()`s here.

use std::cell::Cell;
use std::io;

use rustix::fs::Mode;
use rustix::process::Gid;
use rustix::thread::{capabilities, set_capabilities, set_thread_groups, CapabilitySet};

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
    /// Set while this thread serves a request whose caller lacks
    /// CAP_FSETID (see [`lacking_fsetid`]).
    static WITHOUT_FSETID: Cell<bool> = const { Cell::new(false) };
}

/// Runs `request` for a caller the kernel reports as lacking CAP_FSETID
/// (its kill-set-ID flags on write, truncate and O_TRUNC open) when
/// `lacks`: calls made as that caller then drop CAP_FSETID, so the
/// backing file system clears set-ID bits as it would for the caller. A
/// non-zero fsuid drops it anyway; this is for root without capabilities,
/// which the ids alone do not tell apart from root.
pub fn lacking_fsetid<T>(lacks: bool, request: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            WITHOUT_FSETID.with(|w| w.set(self.0));
        }
    }
    let _restore = Restore(WITHOUT_FSETID.with(|w| w.replace(lacks)));
    request()
}

/// The capabilities a root caller's calls run without.
fn root_caller_drops() -> CapabilitySet {
    match WITHOUT_FSETID.with(|w| w.get()) {
        true => CapabilitySet::FSETID,
        false => CapabilitySet::empty(),
    }
}

/// Runs `op` as the daemon's root, less what the caller lacks.
fn as_root_caller<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let drops = root_caller_drops();
    let _without = match drops.is_empty() {
        true => None,
        false => Some(WithoutCaps::drop(drops)?),
    };
    op()
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
    let groups: Vec<Gid> = groups.iter().map(|&g| Gid::from_raw(g)).collect();
    set_thread_groups(&groups).map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))
}

/// Gives the calling thread its own umask/cwd, once per thread.
fn unshare_fs_once() -> io::Result<()> {
    if FS_UNSHARED.with(|u| u.get()) {
        return Ok(());
    }
    // SAFETY: CLONE_FS detaches only this thread's umask, cwd and root;
    // chronofs holds no pointer or cached path that depends on sharing
    // them (every backing-tree call is relative to a descriptor).
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FS) }
        .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))?;
    FS_UNSHARED.with(|u| u.set(true));
    Ok(())
}

/// Sets this thread's umask (after giving it a private one); returns the old one.
pub fn set_thread_umask(mask: u32) -> io::Result<u32> {
    unshare_fs_once()?;
    Ok(rustix::process::umask(Mode::from_bits_retain(mask)).bits())
}

/// Reads the supplementary groups of thread `pid` from /proc. The file is
/// read whole, so a list of any length (up to the kernel's 65536) is kept.
pub fn supplementary_groups(pid: u32) -> io::Result<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(parse_groups(&status))
}

/// The ids on the `Groups:` line of a /proc/PID/status text.
fn parse_groups(status: &str) -> Vec<u32> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .unwrap_or("");
    line.split_whitespace()
        .filter_map(|g| g.parse::<u32>().ok())
        .collect()
}

/// Sets or clears `bits` in this thread's effective capability set
/// (capabilities are per thread in Linux); a bit not permitted is never set.
fn set_effective_caps(bits: CapabilitySet, on: bool) -> io::Result<()> {
    let errno = |e: rustix::io::Errno| io::Error::from_raw_os_error(e.raw_os_error());
    let mut sets = capabilities(None).map_err(errno)?;
    if on {
        sets.effective |= bits & sets.permitted;
    } else {
        sets.effective &= !bits;
    }
    set_capabilities(None, sets).map_err(errno)
}

/// Capabilities a daemon running as root keeps even after setfsuid, but
/// that an ordinary caller does not have: CAP_SYS_RESOURCE (reserved
/// blocks, quota limits) and CAP_SYS_ADMIN (trusted.* xattrs).
const PRIVILEGE_CAPS: CapabilitySet = CapabilitySet::SYS_RESOURCE.union(CapabilitySet::SYS_ADMIN);

/// Restores root credentials when dropped.
struct Switched {
    groups_set: bool,
    /// Restored after the ids, as this guard's field.
    dropped_caps: Option<WithoutCaps>,
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

fn switch_to(caller: &Caller, groups: Option<&[u32]>, keep: CapabilitySet) -> io::Result<Switched> {
    let mut guard = Switched {
        groups_set: false,
        dropped_caps: None,
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
        root_caller_drops()
    };
    if !drop_caps.is_empty() {
        guard.dropped_caps = Some(WithoutCaps::drop(drop_caps)?);
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
    as_caller_keeping(caller, CapabilitySet::empty(), op)
}

/// [`as_caller`] for registering a passthrough backing file: the kernel
/// requires CAP_SYS_ADMIN for that, and records the credentials it runs
/// with for the backing file's I/O.
///
/// The kernel keeps one backing per inode: every later passthrough handle
/// of the inode, whoever opens it, writes with these credentials, and a
/// write clears set-ID bits by them. So they never hold CAP_FSETID, a
/// root caller's included: an ordinary user's write to a set-user-ID file
/// kept its bit while root held the file open. The cost falls only on
/// writes through a handle opened before its file became set-ID, the one
/// way a set-ID file gets a passthrough handle: they clear bits root keeps
/// natively. The group stays the caller's (a network file system checks
/// each read and write with these credentials), so a set-group-ID bit
/// without group execute, which grants nothing, is kept by a non-member's
/// write through a member's backing.
pub fn as_backing_registrar<T>(
    caller: &Caller,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    // A non-zero fsuid drops CAP_FSETID with the other file-system
    // capabilities (capabilities(7), "Effect of user ID changes").
    as_caller_keeping(caller, CapabilitySet::SYS_ADMIN, || {
        if caller.uid != 0 {
            return op();
        }
        let _without = WithoutCaps::drop(CapabilitySet::FSETID)?;
        op()
    })
}

/// Effective capabilities dropped from this thread, back when dropped
/// (a panic included).
struct WithoutCaps(CapabilitySet);

impl WithoutCaps {
    fn drop(caps: CapabilitySet) -> io::Result<WithoutCaps> {
        set_effective_caps(caps, false)?;
        Ok(WithoutCaps(caps))
    }
}

impl Drop for WithoutCaps {
    fn drop(&mut self) {
        if let Err(e) = set_effective_caps(self.0, true) {
            tracing::error!("cannot restore capabilities: {e}");
        }
    }
}

fn as_caller_keeping<T>(
    caller: &Caller,
    keep: CapabilitySet,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    if caller.uid == 0 && caller.gid == 0 {
        return as_root_caller(op);
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
        return as_root_caller(op);
    }
    let groups = if caller.pid != 0 {
        supplementary_groups(caller.pid).unwrap_or_default()
    } else {
        Vec::new()
    };
    let _guard = switch_to(caller, Some(&groups), CapabilitySet::empty())?;
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
/// while the process is single-threaded, where the calling thread's groups
/// are the process's.
pub fn clear_process_groups() -> io::Result<()> {
    raw_setgroups(&[])
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's largest list (NGROUPS_MAX, 65536) comes through whole:
    /// nothing in the path has a fixed-size buffer.
    #[test]
    fn a_full_group_list_is_read_whole() {
        let groups: Vec<u32> = (0..65_536u32).map(|g| g * 7 + 1000).collect();
        let line: Vec<String> = groups.iter().map(u32::to_string).collect();
        let status = format!(
            "Name:\tcat\nUid:\t1000\t1000\t1000\t1000\nGroups:\t{} \nNStgid:\t1\n",
            line.join(" ")
        );
        assert_eq!(parse_groups(&status), groups);
    }

    #[test]
    fn no_groups_line_means_no_groups() {
        assert!(parse_groups("Name:\tcat\nGroups:\t\n").is_empty());
        assert!(parse_groups("Name:\tcat\n").is_empty());
    }

    #[test]
    fn this_threads_groups_are_readable() {
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        assert!(supplementary_groups(tid).is_ok());
    }
}
