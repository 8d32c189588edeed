//! Every raw system call the integration tests make, as safe functions.
//!
//! This is the only module of the tests with `unsafe` code; each block says
//! why it is sound in a `// SAFETY:` comment.
//!
//! * Failures are `Err(errno)` with the exact errno the call set.
//! * Paths are taken as `&CStr` (build them with [`super::cstr`] before the
//!   call) and no wrapper except [`Fd::open`] and [`Dir::read`] allocates,
//!   so the wrappers may be used inside [`in_child`], whose child must not
//!   allocate after `fork`.

use std::ffi::{c_void, CStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::ptr::NonNull;

/// An errno value (`Err(errno)` in syscall results).
pub type Errno = i32;

/// The calling thread's errno.
pub fn errno() -> Errno {
    io::Error::last_os_error().raw_os_error().unwrap_or(-1)
}

/// Maps a `-1`-on-error return to `Err(errno)`.
pub fn chk<T: Into<i64> + Copy>(r: T) -> Result<T, Errno> {
    if r.into() == -1 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// `-1`-on-error `int` return -> `Result<(), Errno>`.
fn unit(r: libc::c_int) -> Result<(), Errno> {
    chk(r).map(|_| ())
}

/// `-1`-on-error `ssize_t` return -> byte count.
fn size(r: libc::ssize_t) -> Result<usize, Errno> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// `NULL` for `None`, else a pointer to the two timestamps.
fn times_ptr(times: Option<&[libc::timespec; 2]>) -> *const libc::timespec {
    times.map_or(std::ptr::null(), |t| t.as_ptr())
}

// ---------------------------------------------------------------------------
// File descriptors

/// An owned file descriptor, closed on drop.
#[derive(Debug)]
pub struct Fd(OwnedFd);

/// `open(2)` without adding any flag (`O_CLOEXEC` is up to the caller).
pub fn open(c: &CStr, flags: i32, mode: u32) -> Result<Fd, Errno> {
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: `fd` was just returned by open(2), so it is open and nothing
    // else owns it.
    Ok(Fd(unsafe { OwnedFd::from_raw_fd(fd) }))
}

impl Fd {
    /// `open(2)` of `p` with `O_CLOEXEC` added.
    pub fn open(p: &Path, flags: i32, mode: u32) -> Result<Fd, Errno> {
        open(&super::cstr(p), flags | libc::O_CLOEXEC, mode)
    }

    /// The descriptor number (for `/proc/self/fd/N`).
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    pub fn read(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        // SAFETY: the pointer/length pair describes `buf`, which is writable
        // and outlives the call.
        size(unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), buf.len()) })
    }

    pub fn write(&self, buf: &[u8]) -> Result<usize, Errno> {
        // SAFETY: the pointer/length pair describes `buf`, which outlives the call.
        size(unsafe { libc::write(self.raw(), buf.as_ptr().cast(), buf.len()) })
    }

    /// One `pread(2)` call into `buf`.
    pub fn pread_into(&self, buf: &mut [u8], off: i64) -> Result<usize, Errno> {
        // SAFETY: the pointer/length pair describes `buf`, which is writable
        // and outlives the call.
        size(unsafe { libc::pread(self.raw(), buf.as_mut_ptr().cast(), buf.len(), off) })
    }

    pub fn pwrite(&self, buf: &[u8], off: i64) -> Result<usize, Errno> {
        // SAFETY: the pointer/length pair describes `buf`, which outlives the call.
        size(unsafe { libc::pwrite(self.raw(), buf.as_ptr().cast(), buf.len(), off) })
    }

    pub fn try_fstat(&self) -> Result<libc::stat, Errno> {
        // SAFETY: `libc::stat` is plain old data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid, writable `struct stat`.
        unit(unsafe { libc::fstat(self.raw(), &mut st) }).map(|_| st)
    }

    pub fn fstatfs(&self) -> Result<libc::statfs, Errno> {
        // SAFETY: `libc::statfs` is plain old data; all-zero is a valid value.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid, writable `struct statfs`.
        unit(unsafe { libc::fstatfs(self.raw(), &mut st) }).map(|_| st)
    }

    pub fn fsync(&self) -> Result<(), Errno> {
        // SAFETY: fsync takes only an integer.
        unit(unsafe { libc::fsync(self.raw()) })
    }

    pub fn ftruncate(&self, len: i64) -> Result<(), Errno> {
        // SAFETY: ftruncate takes only integers.
        unit(unsafe { libc::ftruncate(self.raw(), len) })
    }

    pub fn lseek(&self, off: i64, whence: i32) -> Result<i64, Errno> {
        // SAFETY: lseek takes only integers.
        chk(unsafe { libc::lseek(self.raw(), off, whence) })
    }

    pub fn fallocate(&self, mode: i32, off: i64, len: i64) -> Result<(), Errno> {
        // SAFETY: fallocate takes only integers.
        unit(unsafe { libc::fallocate(self.raw(), mode, off, len) })
    }

    /// `flock(2)`.
    pub fn flock(&self, op: i32) -> Result<(), Errno> {
        // SAFETY: flock takes only integers.
        unit(unsafe { libc::flock(self.raw(), op) })
    }

    /// `fcntl(2)` with a record-lock command (`F_GETLK`, `F_SETLK`,
    /// `F_OFD_SETLK`, ...); `F_GETLK`-style commands update `lock`.
    /// Any other command is refused with `EINVAL` without a call.
    pub fn fcntl_lock(&self, cmd: i32, lock: &mut libc::flock) -> Result<(), Errno> {
        const LOCK_CMDS: [i32; 6] = [
            libc::F_GETLK,
            libc::F_SETLK,
            libc::F_SETLKW,
            libc::F_OFD_GETLK,
            libc::F_OFD_SETLK,
            libc::F_OFD_SETLKW,
        ];
        if !LOCK_CMDS.contains(&cmd) {
            return Err(libc::EINVAL);
        }
        // SAFETY: `cmd` is a record-lock command, whose third argument is a
        // `struct flock *`; `lock` is valid and writable.
        unit(unsafe { libc::fcntl(self.raw(), cmd, lock as *mut libc::flock) })
    }

    pub fn fsetxattr(&self, name: &CStr, val: &[u8], flags: i32) -> Result<(), Errno> {
        // SAFETY: `name` is NUL-terminated and the pointer/length pair
        // describes `val`; both outlive the call.
        unit(unsafe {
            libc::fsetxattr(
                self.raw(),
                name.as_ptr(),
                val.as_ptr().cast(),
                val.len(),
                flags,
            )
        })
    }

    /// `futimens(2)`; `None` sets both times to now.
    pub fn futimens(&self, times: Option<&[libc::timespec; 2]>) -> Result<(), Errno> {
        // SAFETY: the pointer is NULL or points to two valid timespecs.
        unit(unsafe { libc::futimens(self.raw(), times_ptr(times)) })
    }
}

/// `copy_file_range(2)`, updating both offsets; returns the bytes copied.
pub fn copy_file_range(
    src: &Fd,
    off_in: &mut i64,
    dst: &Fd,
    off_out: &mut i64,
    len: usize,
) -> Result<usize, Errno> {
    // SAFETY: both offsets are valid, writable `loff_t`s.
    size(unsafe { libc::copy_file_range(src.raw(), off_in, dst.raw(), off_out, len, 0) })
}

// ---------------------------------------------------------------------------
// Memory mappings

/// A `MAP_SHARED`, read-write mapping of a file, unmapped on drop.
///
/// No Rust reference into the mapping is ever handed out (the file can
/// change under it); data is copied in with [`Mmap::write_at`].
pub struct Mmap {
    ptr: NonNull<c_void>,
    len: usize,
}

impl Mmap {
    pub fn shared_rw(fd: &Fd, len: usize) -> Result<Mmap, Errno> {
        // SAFETY: with a NULL hint the kernel picks an address range that
        // overlaps no existing mapping, so no memory Rust uses is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.raw(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        Ok(Mmap {
            ptr: NonNull::new(p).expect("mmap returned NULL"),
            len,
        })
    }

    /// Copies `data` into the mapping at offset `off` (panics if it does
    /// not fit).
    pub fn write_at(&mut self, off: usize, data: &[u8]) {
        assert!(
            off.checked_add(data.len())
                .is_some_and(|end| end <= self.len),
            "write_at({off}, {} bytes) outside a {}-byte mapping",
            data.len(),
            self.len
        );
        // SAFETY: the destination range lies inside the live, writable
        // mapping (checked above); the mapping is not Rust-owned memory and
        // no reference to it exists, so the copy aliases nothing; `data`
        // cannot overlap it for the same reason.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.ptr.as_ptr().cast::<u8>().add(off),
                data.len(),
            )
        }
    }

    /// `msync(MS_SYNC)` of the whole mapping.
    pub fn msync(&self) -> Result<(), Errno> {
        // SAFETY: the range is exactly the live mapping.
        unit(unsafe { libc::msync(self.ptr.as_ptr(), self.len, libc::MS_SYNC) })
    }

    /// `munmap(2)`, reporting its result.
    pub fn unmap(self) -> Result<(), Errno> {
        let (ptr, len) = (self.ptr, self.len);
        std::mem::forget(self);
        // SAFETY: the range is exactly the live mapping, which `self`
        // owned and which nothing can use any more (`self` is consumed).
        unit(unsafe { libc::munmap(ptr.as_ptr(), len) })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: the range is exactly the live mapping, owned by `self`.
        unsafe { libc::munmap(self.ptr.as_ptr(), self.len) };
    }
}

// ---------------------------------------------------------------------------
// Directory streams

/// An `opendir(3)` stream, closed on drop.
pub struct Dir(NonNull<libc::DIR>);

impl Dir {
    pub fn open(c: &CStr) -> Result<Dir, Errno> {
        // SAFETY: `c` is NUL-terminated and outlives the call.
        let d = unsafe { libc::opendir(c.as_ptr()) };
        NonNull::new(d).map(Dir).ok_or_else(errno)
    }

    /// `telldir(3)`.
    pub fn tell(&mut self) -> i64 {
        // SAFETY: `self.0` is an open directory stream.
        unsafe { libc::telldir(self.0.as_ptr()) }
    }

    /// `seekdir(3)` (to a position from [`Dir::tell`]).
    pub fn seek(&mut self, pos: i64) {
        // SAFETY: `self.0` is an open directory stream; glibc's seekdir
        // only lseeks the descriptor and resets the buffer, for any `pos`.
        unsafe { libc::seekdir(self.0.as_ptr(), pos) }
    }

    /// `rewinddir(3)`.
    pub fn rewind(&mut self) {
        // SAFETY: `self.0` is an open directory stream.
        unsafe { libc::rewinddir(self.0.as_ptr()) }
    }

    /// `readdir(3)`: `Ok(None)` at the end, `Err(errno)` on failure;
    /// otherwise the entry's name (lossily UTF-8) and `d_ino`.
    pub fn read(&mut self) -> Result<Option<(String, u64)>, Errno> {
        // SAFETY: __errno_location returns the calling thread's errno
        // slot, valid for the thread's lifetime.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `self.0` is an open directory stream, used by this
        // thread only (`&mut self`).
        let ent = unsafe { libc::readdir(self.0.as_ptr()) };
        if ent.is_null() {
            return match errno() {
                0 => Ok(None),
                e => Err(e),
            };
        }
        // SAFETY: a non-NULL readdir result points to a valid dirent with a
        // NUL-terminated d_name, valid until the next call on this stream;
        // both fields are copied out before returning.
        let (name, ino) = unsafe {
            (
                CStr::from_ptr((*ent).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
                (*ent).d_ino,
            )
        };
        Ok(Some((name, ino)))
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: `self.0` is an open directory stream, closed only here.
        unsafe { libc::closedir(self.0.as_ptr()) };
    }
}

// ---------------------------------------------------------------------------
// Path-based calls (AT_FDCWD-relative)

pub fn lstat(c: &CStr) -> Result<libc::stat, Errno> {
    // SAFETY: `libc::stat` is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated; `st` is a valid, writable `struct stat`.
    unit(unsafe { libc::lstat(c.as_ptr(), &mut st) }).map(|_| st)
}

pub fn stat(c: &CStr) -> Result<libc::stat, Errno> {
    // SAFETY: `libc::stat` is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated; `st` is a valid, writable `struct stat`.
    unit(unsafe { libc::stat(c.as_ptr(), &mut st) }).map(|_| st)
}

/// The mode as `statx(2)` reports it when asked for `STATX_MODE` only,
/// as `ls -l` and `stat -c %A` ask: a FUSE mount may answer from the
/// attributes it cached.
pub fn statx_mode(c: &CStr) -> Result<u32, Errno> {
    // SAFETY: `libc::statx` is plain old data; all-zero is a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated; `st` is a valid, writable `struct statx`.
    unit(unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MODE,
            &mut st,
        )
    })
    .map(|_| u32::from(st.stx_mode))
}

pub fn statfs(c: &CStr) -> Result<libc::statfs, Errno> {
    // SAFETY: `libc::statfs` is plain old data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated; `st` is a valid, writable `struct statfs`.
    unit(unsafe { libc::statfs(c.as_ptr(), &mut st) }).map(|_| st)
}

pub fn statvfs(c: &CStr) -> Result<libc::statvfs, Errno> {
    // SAFETY: `libc::statvfs` is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated; `st` is a valid, writable `struct statvfs`.
    unit(unsafe { libc::statvfs(c.as_ptr(), &mut st) }).map(|_| st)
}

pub fn access(c: &CStr, how: i32) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated and outlives the call.
    unit(unsafe { libc::access(c.as_ptr(), how) })
}

pub fn chmod(c: &CStr, mode: u32) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated and outlives the call.
    unit(unsafe { libc::chmod(c.as_ptr(), mode) })
}

/// `chown(2)`; `u32::MAX` leaves that id unchanged.
pub fn chown(c: &CStr, uid: u32, gid: u32) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated and outlives the call.
    unit(unsafe { libc::chown(c.as_ptr(), uid, gid) })
}

pub fn lchown(c: &CStr, uid: u32, gid: u32) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated and outlives the call.
    unit(unsafe { libc::lchown(c.as_ptr(), uid, gid) })
}

pub fn truncate(c: &CStr, len: i64) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated and outlives the call.
    unit(unsafe { libc::truncate(c.as_ptr(), len) })
}

pub fn mkdir(c: &CStr, mode: u32) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated and outlives the call.
    unit(unsafe { libc::mkdir(c.as_ptr(), mode) })
}

pub fn mkfifo(c: &CStr, mode: u32) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated and outlives the call.
    unit(unsafe { libc::mkfifo(c.as_ptr(), mode) })
}

pub fn mknod(c: &CStr, mode: u32, dev: libc::dev_t) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated and outlives the call.
    unit(unsafe { libc::mknod(c.as_ptr(), mode, dev) })
}

pub fn unlink(c: &CStr) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated and outlives the call.
    unit(unsafe { libc::unlink(c.as_ptr()) })
}

pub fn rename(a: &CStr, b: &CStr) -> Result<(), Errno> {
    // SAFETY: both paths are NUL-terminated and outlive the call.
    unit(unsafe { libc::rename(a.as_ptr(), b.as_ptr()) })
}

pub fn renameat2(a: &CStr, b: &CStr, flags: u32) -> Result<(), Errno> {
    // SAFETY: both paths are NUL-terminated and outlive the call.
    unit(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

pub fn linkat(a: &CStr, b: &CStr, flags: i32) -> Result<(), Errno> {
    // SAFETY: both paths are NUL-terminated and outlive the call.
    unit(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

/// `utimensat(AT_FDCWD, c, times, flags)`; `None` sets both times to now.
pub fn utimensat(c: &CStr, times: Option<&[libc::timespec; 2]>, flags: i32) -> Result<(), Errno> {
    // SAFETY: `c` is NUL-terminated; the times pointer is NULL or points to
    // two valid timespecs; all outlive the call.
    unit(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times_ptr(times), flags) })
}

/// `lsetxattr(2)` (on a symlink itself).
pub fn lsetxattr(c: &CStr, name: &CStr, val: &[u8], flags: i32) -> Result<(), Errno> {
    // SAFETY: the strings are NUL-terminated and the pointer/length pair
    // describes `val`; all outlive the call.
    unit(unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            name.as_ptr(),
            val.as_ptr().cast(),
            val.len(),
            flags,
        )
    })
}

/// `setxattr(2)` (following symlinks).
pub fn setxattr(c: &CStr, name: &CStr, val: &[u8], flags: i32) -> Result<(), Errno> {
    // SAFETY: the strings are NUL-terminated and the pointer/length pair
    // describes `val`; all outlive the call.
    unit(unsafe {
        libc::setxattr(
            c.as_ptr(),
            name.as_ptr(),
            val.as_ptr().cast(),
            val.len(),
            flags,
        )
    })
}

/// `lgetxattr(2)` into `buf`; an empty `buf` asks for the value's size.
pub fn lgetxattr(c: &CStr, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: the strings are NUL-terminated and the pointer/length pair
    // describes the writable `buf` (with length 0 nothing is written);
    // all outlive the call.
    size(unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })
}

/// `getxattr(2)` (following symlinks) into `buf`.
pub fn getxattr(c: &CStr, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: as for `lgetxattr`.
    size(unsafe {
        libc::getxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })
}

/// `llistxattr(2)` into `buf`; an empty `buf` asks for the list's size.
pub fn llistxattr(c: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `c` is NUL-terminated and the pointer/length pair describes
    // the writable `buf`; both outlive the call.
    size(unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

pub fn lremovexattr(c: &CStr, name: &CStr) -> Result<(), Errno> {
    // SAFETY: both strings are NUL-terminated and outlive the call.
    unit(unsafe { libc::lremovexattr(c.as_ptr(), name.as_ptr()) })
}

// ---------------------------------------------------------------------------
// Processes

/// `umask(2)`; returns the previous mask.
pub fn umask(mask: u32) -> u32 {
    // SAFETY: umask takes only an integer.
    unsafe { libc::umask(mask) }
}

/// `kill(2)`.
pub fn kill(pid: i32, sig: i32) -> Result<(), Errno> {
    // SAFETY: kill takes only integers.
    unit(unsafe { libc::kill(pid, sig) })
}

/// Makes the child spawned by `cmd` get SIGTERM when the spawning thread
/// dies, so a test process dying without running Drop takes it along.
pub fn term_on_parent_death(cmd: &mut Command) {
    // SAFETY: the hook runs in the forked child before exec and only calls
    // prctl(PR_SET_PDEATHSIG), which is async-signal-safe, takes integers
    // and touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
}

/// Ends a forked child without running the parent's destructors or atexit
/// handlers.
fn child_exit(code: i32) -> ! {
    // SAFETY: _exit only ends the process.
    unsafe { libc::_exit(code) }
}

/// Empties the calling thread's capability sets, keeping its ids: root
/// without capabilities, as `setpriv --bounding-set=-all` runs a program
/// as root. For [`in_child`]: no allocation.
pub fn drop_all_capabilities() -> io::Result<()> {
    // struct __user_cap_header_struct, _LINUX_CAPABILITY_VERSION_3.
    let mut header = [0x2008_0522u32, 0];
    // Two struct __user_cap_data_struct (effective, permitted, inheritable).
    let data = [0u32; 6];
    // SAFETY: capset reads a header and two data structs of the sizes
    // given here; dropping capabilities needs no privilege.
    let r = unsafe { libc::syscall(libc::SYS_capset, header.as_mut_ptr(), data.as_ptr()) };
    match r {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Runs `f` in a forked child after switching to uid/gid (`None` keeps
/// root) and returns `f`'s value, which must fit in 0..=253 (use errno
/// values; 0 = success). The test process is multi-threaded, so `f` must
/// only make system calls (the wrappers of this module taking `&CStr`) on
/// data prepared before the call, and not allocate.
pub fn in_child(ids: Option<(u32, u32)>, f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork has no memory-safety preconditions by itself; the child
    // only runs `f` (which per the contract above makes only system calls
    // on data prepared before the fork) and leaves with _exit, never
    // returning into the test harness or running its destructors.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        if let Some((uid, gid)) = ids {
            let g = [gid];
            // SAFETY: `g` is a valid one-element gid array; the other calls
            // take only integers.
            let switched = unsafe {
                libc::setgroups(1, g.as_ptr()) == 0
                    && libc::setresgid(gid, gid, gid) == 0
                    && libc::setresuid(uid, uid, uid) == 0
            };
            if !switched {
                child_exit(254);
            }
        }
        let r = f();
        child_exit(r.clamp(0, 253));
    }
    let mut status = 0;
    // SAFETY: `status` is a valid, writable int.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid);
    let st = ExitStatus::from_raw(status);
    match st.code() {
        Some(254) => panic!("child could not switch to uid/gid {ids:?}"),
        Some(c) => c,
        None => panic!("child died: {st}"),
    }
}

/// A close-on-exec pipe (read end, write end).
pub fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes `fd` descriptor `target` in the child `cmd` starts (and only
/// there: `fd` itself stays close-on-exec, so other children never hold
/// it).
pub fn pass_fd(cmd: &mut Command, fd: &OwnedFd, target: RawFd) {
    let raw = fd.as_raw_fd();
    // SAFETY: the hook runs in the forked child before exec and only calls
    // dup2 and fcntl (async-signal-safe) on integers; dup2's copy is not
    // close-on-exec, so the new program inherits it. Where the descriptor
    // already is `target`, dup2 does nothing and close-on-exec would stay
    // set: the program would start without it (its reader saw EOF at once
    // and a mount "did not become ready", now and then in CI).
    unsafe {
        cmd.pre_exec(move || {
            let done = if raw == target {
                libc::fcntl(target, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, target)
            };
            if done < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Whether `fd` becomes readable within `timeout_ms` (EINTR: not yet).
pub fn readable_within(fd: &OwnedFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, its count, a timeout.
    unsafe { libc::poll(&mut p, 1, timeout_ms) > 0 }
}
