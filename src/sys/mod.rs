//! Raw system calls: the one place in chronofs with `unsafe`.
//!
//! Owns: thin, safe wrappers over the Linux calls that neither `std` nor
//! `libc`'s safe surface offer — per-thread credential switching, `*at()`
//! calls on directory descriptors, `getdents64`, xattrs, `renameat2`,
//! `copy_file_range`, `fallocate`, `lseek` with `SEEK_DATA`/`SEEK_HOLE`.
//! Uses: nothing of chronofs. Must not know about FUSE, inodes or the store.
//!
//! Every wrapper returns `io::Result` carrying the raw errno, so callers can
//! hand the kernel exactly the error the backing file system gave.
#![allow(unsafe_code)]

pub mod creds;

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// Converts a `-1`-on-error return into `io::Result`.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// A name from the kernel or the user as a C string; an interior NUL can
/// never be a valid file name, so it is `EINVAL`.
pub fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The path through which an O_PATH descriptor can be re-opened or used
/// where the kernel offers no fd-relative form. Resolving it never walks a
/// user-controlled string path.
pub fn proc_fd_path(fd: BorrowedFd<'_>) -> CString {
    // The formatted string never contains a NUL byte.
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

pub type Stat = libc::stat;

pub fn zeroed_stat() -> Stat {
    // SAFETY: `struct stat` is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// `fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`; an empty name stats `dirfd` itself.
pub fn fstatat(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    let mut st = zeroed_stat();
    let flags = libc::AT_SYMLINK_NOFOLLOW
        | if name.is_empty() {
            libc::AT_EMPTY_PATH
        } else {
            0
        };
    // SAFETY: valid fd, NUL-terminated name, and `st` is a writable stat buffer.
    check(unsafe { libc::fstatat(dirfd.as_raw_fd(), name.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    fstatat(fd, c"")
}

/// `openat(dirfd, name, flags, mode)` returning an owned descriptor.
pub fn openat(dirfd: RawFd, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: NUL-terminated name; the returned fd is fresh and owned by us.
    let fd = check(unsafe {
        libc::openat(
            dirfd,
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: `fd` was just returned by openat and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `name` below `dirfd` as an O_PATH handle without following a
/// trailing symlink, so a symlink in the backing tree can never lead out.
pub fn open_path(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    openat(dirfd.as_raw_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0)
}

/// Re-opens an O_PATH handle with real access flags.
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
    let path = proc_fd_path(fd);
    openat(libc::AT_FDCWD, &path, flags & !libc::O_NOFOLLOW, 0)
}

pub fn mkdirat(dirfd: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd and NUL-terminated name.
    check(unsafe { libc::mkdirat(dirfd.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

pub fn mknodat(dirfd: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: valid fd and NUL-terminated name.
    check(unsafe { libc::mknodat(dirfd.as_raw_fd(), name.as_ptr(), mode, rdev) }).map(drop)
}

pub fn symlinkat(target: &CStr, dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: NUL-terminated strings and a valid fd.
    check(unsafe { libc::symlinkat(target.as_ptr(), dirfd.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// Hard-links the object behind an O_PATH handle. Going through the
/// `/proc/self/fd` link (with AT_SYMLINK_FOLLOW) needs no CAP_DAC_READ_SEARCH,
/// so it works under the caller's credentials.
pub fn link_fd(fd: BorrowedFd<'_>, newdir: BorrowedFd<'_>, newname: &CStr) -> io::Result<()> {
    let path = proc_fd_path(fd);
    // SAFETY: NUL-terminated strings and valid fds.
    check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            path.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
    .map(drop)
}

pub fn unlinkat(dirfd: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: valid fd and NUL-terminated name.
    check(unsafe { libc::unlinkat(dirfd.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

pub fn renameat2(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: valid fds and NUL-terminated names.
    check(unsafe {
        libc::renameat2(
            olddir.as_raw_fd(),
            oldname.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

pub fn readlink_fd(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: empty path with an O_PATH fd reads the link itself; buf is writable.
    let n = check_size(unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// chmod of the object behind an O_PATH handle (not a symlink).
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let path = proc_fd_path(fd);
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

/// chown of the object behind an O_PATH handle, symlinks included.
/// `u32::MAX` leaves the id unchanged, as chown(2) does with -1.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid fd; AT_EMPTY_PATH operates on the fd itself.
    check(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn truncate_fd_path(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    let path = proc_fd_path(fd);
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::truncate(path.as_ptr(), size as libc::off_t) }).map(drop)
}

pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) }).map(drop)
}

/// A time for `utimensat`: `None` means UTIME_OMIT.
#[derive(Clone, Copy, Debug)]
pub enum TimeSpec {
    Omit,
    Now,
    At { secs: i64, nsecs: i64 },
}

impl TimeSpec {
    fn to_timespec(self) -> libc::timespec {
        match self {
            TimeSpec::Omit => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            TimeSpec::Now => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            },
            TimeSpec::At { secs, nsecs } => libc::timespec {
                tv_sec: secs,
                tv_nsec: nsecs,
            },
        }
    }
}

/// utimensat on the object behind an O_PATH handle, symlinks included.
pub fn utimens_fd(fd: BorrowedFd<'_>, atime: TimeSpec, mtime: TimeSpec) -> io::Result<()> {
    let times = [atime.to_timespec(), mtime.to_timespec()];
    // SAFETY: valid fd and a two-element timespec array.
    check(unsafe {
        libc::utimensat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            times.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let n = check_size(unsafe {
            libc::pread64(
                fd.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off64_t,
            )
        });
        match n {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if done > 0 => {
                tracing::debug!("short read after error: {e}");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

pub fn pwrite(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer and length describe the unwritten tail of `buf`.
        let n = check_size(unsafe {
            libc::pwrite64(
                fd.as_raw_fd(),
                buf[done..].as_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off64_t,
            )
        });
        match n {
            Ok(n) => done += n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    // SAFETY: valid fd.
    let ret = unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    };
    check(ret).map(drop)
}

/// A private copy of the file `src` sharing its blocks (FICLONE: btrfs,
/// XFS, bcachefs...), as an unnamed file in directory `dir`, which must be
/// on the same file system. EOPNOTSUPP/EXDEV/EINVAL where cloning is not
/// possible.
pub fn clone_to_tmpfile(src: BorrowedFd<'_>, dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let fd = openat(dir.as_raw_fd(), c".", libc::O_TMPFILE | libc::O_RDWR, 0o600)?;
    // SAFETY: both are valid descriptors; FICLONE takes the source fd as
    // its argument and reads nothing else.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) })?;
    Ok(fd)
}

pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe {
        libc::fallocate64(
            fd.as_raw_fd(),
            mode,
            offset as libc::off64_t,
            len as libc::off64_t,
        )
    })
    .map(drop)
}

pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: valid fd.
    let ret = unsafe { libc::lseek64(fd.as_raw_fd(), offset, whence) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: u64,
) -> io::Result<usize> {
    let mut off_in = off_in as libc::loff_t;
    let mut off_out = off_out as libc::loff_t;
    // SAFETY: valid fds and pointers to live offset variables.
    check_size(unsafe {
        libc::copy_file_range(
            fd_in.as_raw_fd(),
            &mut off_in,
            fd_out.as_raw_fd(),
            &mut off_out,
            len as usize,
            0,
        )
    })
}

pub type StatFs = libc::statvfs;

pub fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<StatFs> {
    // SAFETY: zeroed statvfs is valid POD and the fd is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and writable buffer.
    check(unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// One entry of a `getdents64` buffer.
pub struct DirEntry {
    pub ino: u64,
    /// The cookie that resumes reading after this entry.
    pub next_offset: i64,
    pub dtype: u8,
    pub name: Vec<u8>,
}

/// Reads the next batch of entries of an open directory.
/// An empty result means the end of the directory.
pub fn getdents(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Vec<DirEntry>> {
    // SAFETY: buf is writable for its whole length.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut entries = Vec::new();
    let mut pos = 0usize;
    let end = n as usize;
    // Layout of struct linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name.
    while pos + 19 <= end {
        let rec = &buf[pos..end];
        let ino = u64::from_ne_bytes(rec[0..8].try_into().unwrap_or_default());
        let off = i64::from_ne_bytes(rec[8..16].try_into().unwrap_or_default());
        let reclen = u16::from_ne_bytes(rec[16..18].try_into().unwrap_or_default()) as usize;
        if reclen == 0 || reclen > rec.len() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let name_bytes = &rec[19..reclen];
        let len = name_bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(name_bytes.len());
        entries.push(DirEntry {
            ino,
            next_offset: off,
            dtype: rec[18],
            name: name_bytes[..len].to_vec(),
        });
        pos += reclen;
    }
    Ok(entries)
}

fn xattr_len(ret: libc::ssize_t) -> io::Result<usize> {
    check_size(ret)
}

/// getxattr on the object behind an O_PATH handle — symlinks included: the
/// /proc link resolves to the object itself, never through it. `buf` empty
/// asks the size.
pub fn getxattr_fd(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let path = proc_fd_path(fd);
    // SAFETY: NUL-terminated strings; buf pointer/len describe a writable region.
    xattr_len(unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })
}

pub fn setxattr_fd(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    let path = proc_fd_path(fd);
    // SAFETY: NUL-terminated strings; value pointer/len describe a readable region.
    check(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

pub fn listxattr_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let path = proc_fd_path(fd);
    // SAFETY: NUL-terminated path; buf pointer/len describe a writable region.
    xattr_len(unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

pub fn removexattr_fd(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let path = proc_fd_path(fd);
    // SAFETY: NUL-terminated strings.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// access(2) with the effective (here: fs) ids of the calling thread.
pub fn access_fd(fd: BorrowedFd<'_>, mask: i32) -> io::Result<()> {
    let path = proc_fd_path(fd);
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::faccessat(libc::AT_FDCWD, path.as_ptr(), mask, libc::AT_EACCESS) })
        .map(drop)
}

/// Raises RLIMIT_NOFILE to its hard maximum: the daemon holds one O_PATH
/// descriptor per inode the kernel remembers.
pub fn raise_fd_limit() -> io::Result<u64> {
    // SAFETY: zeroed rlimit is valid POD.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: writable rlimit buffer.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    let mut want = lim.rlim_max;
    if let Ok(text) = std::fs::read_to_string("/proc/sys/fs/nr_open") {
        if let Ok(nr_open) = text.trim().parse::<u64>() {
            want = want.max(nr_open);
        }
    }
    let new = libc::rlimit {
        rlim_cur: want,
        rlim_max: want,
    };
    // SAFETY: pointer to a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
        return Ok(want);
    }
    let new = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: pointer to a valid rlimit.
    check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) })?;
    Ok(lim.rlim_max)
}

pub fn geteuid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() }
}

/// fork(2). Only called before any thread is started.
pub enum Forked {
    Parent(libc::pid_t),
    Child,
}

pub fn fork() -> io::Result<Forked> {
    // SAFETY: called while the process is single-threaded (before the
    // session starts), so the child may run arbitrary code.
    let pid = unsafe { libc::fork() };
    match pid {
        p if p < 0 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        p => Ok(Forked::Parent(p)),
    }
}

pub fn setsid() -> io::Result<()> {
    // SAFETY: no pointers involved.
    check(unsafe { libc::setsid() }).map(drop)
}

/// A pipe (read end, write end), both close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a two-element array.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Points stdin, stdout and stderr at `fd` (used when daemonizing).
pub fn redirect_stdio(fd: BorrowedFd<'_>, stdin_null: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: valid source fds; targets are the standard descriptors.
    unsafe {
        check(libc::dup2(stdin_null.as_raw_fd(), 0))?;
        check(libc::dup2(fd.as_raw_fd(), 1))?;
        check(libc::dup2(fd.as_raw_fd(), 2))?;
    }
    Ok(())
}

/// umount2(path, flags) — used to clear a dead mount left by a crashed daemon.
pub fn umount2(path: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::umount2(path.as_ptr(), flags) }).map(drop)
}

/// Blocks the termination signals in the calling thread (and threads it
/// starts later) and returns a waiter that receives them synchronously.
pub struct SignalWaiter {
    set: libc::sigset_t,
}

impl SignalWaiter {
    pub fn block_termination_signals() -> io::Result<Self> {
        // SAFETY: sigset_t is POD; the sig* calls only touch `set`.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, sig);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            Ok(SignalWaiter { set })
        }
    }

    /// Waits for one of the blocked signals and returns its number.
    pub fn wait(&self) -> io::Result<i32> {
        let mut sig: libc::c_int = 0;
        // SAFETY: valid sigset and output pointer.
        let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(sig)
    }
}

pub fn waitpid(pid: libc::pid_t) -> io::Result<i32> {
    let mut status = 0;
    // SAFETY: status is a valid output pointer.
    check(unsafe { libc::waitpid(pid, &mut status, 0) })?;
    Ok(status)
}

/// Largest `struct file_handle` payload the kernel produces (MAX_HANDLE_SZ).
const MAX_HANDLE_SZ: usize = 128;
/// Size of `struct file_handle`'s header: handle_bytes (u32) + handle_type (i32).
const HANDLE_HEADER: usize = 8;

/// A persistent, kernel-issued identifier of a file (name_to_handle_at):
/// it can be re-opened later without holding a descriptor, and fails with
/// ESTALE once the object is gone — never silently opens another file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileHandle {
    /// `struct file_handle` as the kernel laid it out, header included.
    raw: Box<[u8]>,
}

/// The handle of the object behind `fd`, and the id of the mount it is on.
pub fn name_to_handle(fd: BorrowedFd<'_>) -> io::Result<(FileHandle, i32)> {
    name_to_handle_at(fd, c"")
}

/// The handle of `name` in directory `dirfd` (a trailing symlink is not
/// followed); an empty name means `dirfd` itself.
pub fn name_to_handle_at(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<(FileHandle, i32)> {
    // u32-aligned buffer holding the header and the largest payload.
    let mut buf = vec![0u32; (HANDLE_HEADER + MAX_HANDLE_SZ) / 4];
    buf[0] = MAX_HANDLE_SZ as u32;
    let mut mount_id: libc::c_int = 0;
    // SAFETY: buf is a writable, aligned file_handle with handle_bytes set to
    // the payload room; mount_id is a valid output pointer.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            dirfd.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr(),
            &mut mount_id as *mut libc::c_int,
            if name.is_empty() {
                libc::AT_EMPTY_PATH
            } else {
                0
            },
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let payload = (buf[0] as usize).min(MAX_HANDLE_SZ);
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok((
        FileHandle {
            raw: bytes[..HANDLE_HEADER + payload].into(),
        },
        mount_id,
    ))
}

/// Opens a handle (needs CAP_DAC_READ_SEARCH: call with root credentials).
pub fn open_by_handle(
    mount_fd: BorrowedFd<'_>,
    handle: &FileHandle,
    flags: i32,
) -> io::Result<OwnedFd> {
    // Copy into an aligned buffer: the kernel reads the header as u32s.
    let mut buf = vec![0u32; handle.raw.len().div_ceil(4)];
    for (i, chunk) in handle.raw.chunks(4).enumerate() {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        buf[i] = u32::from_ne_bytes(word);
    }
    // SAFETY: buf holds a complete file_handle as returned by the kernel.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            buf.as_ptr(),
            flags | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The current soft limit on open files.
pub fn fd_limit() -> u64 {
    // SAFETY: zeroed rlimit is valid POD.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: writable rlimit buffer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } < 0 {
        return 1024;
    }
    lim.rlim_cur
}

/// The mount flags (ST_*) of the file system holding `path`.
pub fn statvfs_flags(path: &std::path::Path) -> io::Result<u64> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: zeroed statvfs is valid POD.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path and a writable buffer.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
    Ok(st.f_flag)
}

/// Every extended attribute of the object behind `fd` (ACLs included),
/// names sorted. Retries when the set grows between the size query and the
/// read.
pub fn xattrs_of(fd: BorrowedFd<'_>) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut names = vec![0u8; 256];
    let len = loop {
        match listxattr_fd(fd, &mut names) {
            Ok(n) => break n,
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => {
                let need = listxattr_fd(fd, &mut [])?;
                names.resize(need.max(names.len() * 2), 0);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
    };
    let mut out = Vec::new();
    for name in names[..len].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut value = vec![0u8; 256];
        let n = loop {
            match getxattr_fd(fd, &cname, &mut value) {
                Ok(n) => break Some(n),
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => {
                    let need = getxattr_fd(fd, &cname, &mut [])?;
                    value.resize(need.max(value.len() * 2), 0);
                }
                // Removed between list and read.
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => break None,
                Err(e) => return Err(e),
            }
        };
        if let Some(n) = n {
            value.truncate(n);
            out.push((name.to_vec(), value));
        }
    }
    out.sort();
    Ok(out)
}

pub fn getegid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getegid() }
}

/// Lets SIGPIPE end the process, as for any Unix filter: `chronofs log |
/// head` then stops quietly when `head` exits instead of failing on a
/// write. Only for the CLI's commands, never the daemon (a client that
/// goes away must not kill a mount).
pub fn default_sigpipe() {
    // SAFETY: installs the default disposition; no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Credentials of the process at the other end of a Unix socket.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

pub fn peer_credentials(sock: &impl std::os::fd::AsRawFd) -> io::Result<Peer> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred/len describe a writable ucred of the size passed.
    check(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok(Peer {
        uid: cred.uid,
        gid: cred.gid,
        pid: cred.pid as u32,
    })
}

/// The login name of `uid`, from the passwd database.
pub fn user_name(uid: u32) -> Option<String> {
    passwd_entry(Ok(uid)).map(|(name, _, _)| name)
}

/// A user's uid and home directory, by login name or number.
pub fn user_home(user: &str) -> Option<(u32, std::path::PathBuf)> {
    passwd_entry(user.parse().map_err(|_| user)).map(|(_, uid, home)| (uid, home))
}

/// A passwd entry (login name, uid, home), by uid or by name.
fn passwd_entry(user: Result<u32, &str>) -> Option<(String, u32, std::path::PathBuf)> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: zeroed passwd is a valid out-parameter.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = match user {
        // SAFETY: pwd, buf and result are valid for the call; buf's length is passed.
        Ok(uid) => unsafe {
            libc::getpwuid_r(
                uid,
                &mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        },
        Err(name) => {
            let name = CString::new(name).ok()?;
            // SAFETY: as above; name is NUL-terminated.
            unsafe {
                libc::getpwnam_r(
                    name.as_ptr(),
                    &mut pwd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut result,
                )
            }
        }
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: on success pw_name and pw_dir point to NUL-terminated
    // strings inside buf.
    let (name, home) = unsafe { (CStr::from_ptr(pwd.pw_name), CStr::from_ptr(pwd.pw_dir)) };
    Some((
        name.to_string_lossy().into_owned(),
        pwd.pw_uid,
        std::path::PathBuf::from(OsStr::from_bytes(home.to_bytes())),
    ))
}

/// The name of group `gid`, from the group database.
pub fn group_name(gid: u32) -> Option<String> {
    let mut buf = vec![0u8; 16384];
    // SAFETY: zeroed group is a valid out-parameter.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: grp, buf and result are valid for the call; buf's length is passed.
    let rc = unsafe {
        libc::getgrgid_r(
            gid,
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: on success gr_name points to a NUL-terminated string inside buf.
    let name = unsafe { CStr::from_ptr(grp.gr_name) };
    Some(name.to_string_lossy().into_owned())
}

pub fn mkfifo(path: &std::path::Path, mode: u32) -> io::Result<()> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::mkfifo(c.as_ptr(), mode) }).map(drop)
}

/// Sets atime and mtime (ns since the epoch) without following a symlink.
pub fn set_times(path: &std::path::Path, atime_ns: i64, mtime_ns: i64) -> io::Result<()> {
    let c = cstr(path.as_os_str())?;
    let ts = |ns: i64| libc::timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000),
    };
    let times = [ts(atime_ns), ts(mtime_ns)];
    // SAFETY: NUL-terminated path; times is an array of two timespecs.
    check(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// The data ranges (offset, length) of a file of `size` bytes, found with
/// SEEK_DATA/SEEK_HOLE; the whole file if the file system cannot tell.
pub fn data_ranges(fd: BorrowedFd<'_>, size: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos: u64 = 0;
    while pos < size {
        let start = match lseek(fd, pos as i64, libc::SEEK_DATA) {
            Ok(s) => s as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(vec![(0, size)]),
            Err(e) => return Err(e),
        };
        let end = match lseek(fd, start as i64, libc::SEEK_HOLE) {
            Ok(e) => (e as u64).min(size),
            Err(_) => size,
        };
        if end > start {
            out.push((start, end - start));
        }
        pos = end.max(start + 1);
    }
    Ok(out)
}
