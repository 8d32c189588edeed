//! Raw system calls: the one place in chronofs with `unsafe`.
//!
//! Owns: thin, safe wrappers over the Linux calls that `std` does not
//! offer — per-thread credential switching, `*at()` calls on directory
//! descriptors, `getdents64`, xattrs, `renameat2`, `copy_file_range`,
//! `fallocate`, `lseek` with `SEEK_DATA`/`SEEK_HOLE`, file handles.
//! Uses: nothing of chronofs. Must not know about FUSE, inodes or the store.
//!
//! Most calls go through `rustix`, which issues the system call itself
//! and reports the kernel's errno. What rustix does not offer stays here as
//! a small `unsafe` wrapper over `libc`, each with its `SAFETY` reason:
//! setfsuid/setfsgid, name_to_handle_at/open_by_handle_at, truncate(2) by
//! path, fork, signal masks and dispositions, getpwuid_r/getgrgid_r.
//!
//! Every wrapper returns `io::Result` carrying the raw errno, so callers can
//! hand the kernel exactly the error the backing file system gave.
#![allow(unsafe_code)]

pub mod creds;
mod lookup;
pub mod zstd;

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

pub use lookup::{group_id, group_name, user_groups, user_home, user_id, user_name};

/// The current directory, for the `*at()` calls that take a path.
pub const CWD: BorrowedFd<'static> = rfs::CWD;

/// The errno-carrying `io::Error` of a failed rustix call.
fn os_err(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
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

/// chronofs's `struct stat`: libc's, because the views build synthetic
/// ones field by field, which rustix's non-exhaustive `Stat` forbids.
pub type Stat = libc::stat;

pub fn zeroed_stat() -> Stat {
    // SAFETY: `struct stat` is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

fn to_stat(r: &rfs::Stat) -> Stat {
    let mut st = zeroed_stat();
    // The casts only restate the same kernel field in libc's spelling
    // (e.g. `c_ulong` nanoseconds as `c_long`): values are never truncated.
    st.st_dev = r.st_dev as _;
    st.st_ino = r.st_ino as _;
    st.st_nlink = r.st_nlink as _;
    st.st_mode = r.st_mode as _;
    st.st_uid = r.st_uid as _;
    st.st_gid = r.st_gid as _;
    st.st_rdev = r.st_rdev as _;
    st.st_size = r.st_size as _;
    st.st_blksize = r.st_blksize as _;
    st.st_blocks = r.st_blocks as _;
    st.st_atime = r.st_atime as _;
    st.st_atime_nsec = r.st_atime_nsec as _;
    st.st_mtime = r.st_mtime as _;
    st.st_mtime_nsec = r.st_mtime_nsec as _;
    st.st_ctime = r.st_ctime as _;
    st.st_ctime_nsec = r.st_ctime_nsec as _;
    st
}

fn oflags(flags: i32) -> OFlags {
    OFlags::from_bits_retain(flags as u32)
}

fn mode(mode: u32) -> Mode {
    Mode::from_bits_retain(mode)
}

/// `fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`; an empty name stats `dirfd` itself.
pub fn fstatat(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    let flags = AtFlags::SYMLINK_NOFOLLOW
        | if name.is_empty() {
            AtFlags::EMPTY_PATH
        } else {
            AtFlags::empty()
        };
    let st = rfs::statat(dirfd, name, flags).map_err(os_err)?;
    Ok(to_stat(&st))
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    fstatat(fd, c"")
}

/// When the object `fd` refers to was made, in nanoseconds since the
/// epoch; `None` where the file system keeps no birth time.
pub fn birth_time(fd: BorrowedFd<'_>) -> io::Result<Option<i64>> {
    let stx = rfs::statx(fd, c"", AtFlags::EMPTY_PATH, rfs::StatxFlags::BTIME)?;
    if !rfs::StatxFlags::from_bits_retain(stx.stx_mask).contains(rfs::StatxFlags::BTIME) {
        return Ok(None);
    }
    let t = stx.stx_btime;
    Ok(Some(
        t.tv_sec.saturating_mul(1_000_000_000) + i64::from(t.tv_nsec),
    ))
}

/// `openat(dirfd, name, flags | O_CLOEXEC, mode)`; `dirfd` may be [`CWD`].
pub fn openat(
    dirfd: BorrowedFd<'_>,
    name: &CStr,
    flags: i32,
    mode_bits: u32,
) -> io::Result<OwnedFd> {
    rfs::openat(
        dirfd,
        name,
        oflags(flags) | OFlags::CLOEXEC,
        mode(mode_bits),
    )
    .map_err(os_err)
}

/// Opens `name` below `dirfd` as an O_PATH handle without following a
/// trailing symlink, so a symlink in the backing tree can never lead out.
pub fn open_path(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    openat(dirfd, name, libc::O_PATH | libc::O_NOFOLLOW, 0)
}

/// Re-opens an O_PATH handle with real access flags.
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
    let path = proc_fd_path(fd);
    openat(CWD, &path, flags & !libc::O_NOFOLLOW, 0)
}

/// Turns off O_DIRECT on `fd` if it is on: the daemon's own reads and
/// writes use buffers O_DIRECT's alignment rules would refuse (EINVAL).
pub fn drop_o_direct(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = rfs::fcntl_getfl(fd).map_err(os_err)?;
    if flags.contains(OFlags::DIRECT) {
        rfs::fcntl_setfl(fd, flags - OFlags::DIRECT).map_err(os_err)?;
    }
    Ok(())
}

/// The inode flags (chattr(1)) a copy of the file open as `fd` carries:
/// append-only, immutable, synchronous, no-atime, no-dump. None where the
/// file system keeps no flags.
pub fn carried_inode_flags(fd: BorrowedFd<'_>) -> io::Result<u32> {
    use rustix::fs::IFlags;
    let carried =
        IFlags::APPEND | IFlags::IMMUTABLE | IFlags::SYNC | IFlags::NOATIME | IFlags::NODUMP;
    match rfs::ioctl_getflags(fd) {
        Ok(flags) => Ok((flags & carried).bits()),
        Err(e)
            if [
                rustix::io::Errno::NOTTY,
                rustix::io::Errno::OPNOTSUPP,
                rustix::io::Errno::INVAL,
            ]
            .contains(&e) =>
        {
            Ok(0)
        }
        Err(e) => Err(os_err(e)),
    }
}

/// Adds inode flags `flags` (from [`carried_inode_flags`]) to the file
/// open as `fd`.
pub fn add_inode_flags(fd: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
    use rustix::fs::IFlags;
    let now = rfs::ioctl_getflags(fd).map_err(os_err)?;
    rfs::ioctl_setflags(fd, now | IFlags::from_bits_retain(flags)).map_err(os_err)
}

/// `FS_APPEND_FL | FS_IMMUTABLE_FL`: flags no copy may be made around.
pub const PROTECTING_INODE_FLAGS: u32 =
    rustix::fs::IFlags::APPEND.bits() | rustix::fs::IFlags::IMMUTABLE.bits();

/// Whether the file open (read-only) as `fd` is open for writing
/// anywhere, as the kernel counts it: by a descriptor, or by a shared
/// mapping, which keeps the file it was made from open (under FUSE
/// passthrough that is the backing file, out of the daemon's sight).
/// Probed by taking and at once dropping a read lease, which the kernel
/// refuses (EAGAIN) exactly while a writer exists. Errors: leases off
/// (EINVAL) or a file neither owned nor leasable by the caller (EACCES).
pub fn open_for_writing(fd: BorrowedFd<'_>) -> io::Result<bool> {
    ignore_lease_breaks();
    // SAFETY: fcntl on a borrowed, open descriptor with integer arguments.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(true),
            _ => Err(e),
        };
    }
    // SAFETY: as above; drops the lease just taken.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(false)
}

/// A writer that opens a file while `open_for_writing` holds its lease
/// breaks it, and the kernel signals the lease holder with SIGIO, whose
/// default action ends the process. chronofs uses no SIGIO otherwise.
fn ignore_lease_breaks() {
    static IGNORED: std::sync::Once = std::sync::Once::new();
    IGNORED.call_once(|| {
        // SAFETY: installs the ignore disposition; no handler code runs.
        unsafe {
            libc::signal(libc::SIGIO, libc::SIG_IGN);
        }
    });
}

/// `reopen` of a directory: "." below it costs a fraction of the walk
/// through /proc, but needs search permission on the directory, which
/// opening it natively does not; the walk through /proc decides then.
pub fn reopen_dir(fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
    match openat(fd, c".", flags & !libc::O_NOFOLLOW, 0) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => reopen(fd, flags),
        other => other,
    }
}

pub fn mkdirat(dirfd: BorrowedFd<'_>, name: &CStr, mode_bits: u32) -> io::Result<()> {
    rfs::mkdirat(dirfd, name, mode(mode_bits)).map_err(os_err)
}

pub fn mknodat(dirfd: BorrowedFd<'_>, name: &CStr, mode_bits: u32, rdev: u64) -> io::Result<()> {
    // mknod(2) takes no type bits as a regular file; rustix's "unknown"
    // type would instead send all S_IFMT bits and get EINVAL.
    let kind = match mode_bits & libc::S_IFMT {
        0 => rfs::FileType::RegularFile,
        t => rfs::FileType::from_raw_mode(t),
    };
    rfs::mknodat(dirfd, name, kind, Mode::from_raw_mode(mode_bits), rdev).map_err(os_err)
}

pub fn symlinkat(target: &CStr, dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    rfs::symlinkat(target, dirfd, name).map_err(os_err)
}

/// Hard-links the object behind an O_PATH handle. Going through the
/// `/proc/self/fd` link (with AT_SYMLINK_FOLLOW) needs no CAP_DAC_READ_SEARCH,
/// so it works under the caller's credentials.
pub fn link_fd(fd: BorrowedFd<'_>, newdir: BorrowedFd<'_>, newname: &CStr) -> io::Result<()> {
    let path = proc_fd_path(fd);
    rfs::linkat(CWD, &path, newdir, newname, AtFlags::SYMLINK_FOLLOW).map_err(os_err)
}

/// `linkat(olddir, oldname, newdir, newname, 0)`: a symlink at `oldname`
/// is linked itself, never followed.
pub fn linkat(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
) -> io::Result<()> {
    rfs::linkat(olddir, oldname, newdir, newname, AtFlags::empty()).map_err(os_err)
}

/// Opens `path` below `dirfd` (openat2 with RESOLVE_BENEATH and
/// RESOLVE_NO_SYMLINKS): no component may be a symlink or lead out of
/// `dirfd`, whatever others did to the directories on the way.
pub fn open_beneath(dirfd: BorrowedFd<'_>, path: &CStr, flags: i32) -> io::Result<OwnedFd> {
    rfs::openat2(
        dirfd,
        path,
        oflags(flags) | OFlags::CLOEXEC,
        Mode::empty(),
        rfs::ResolveFlags::BENEATH | rfs::ResolveFlags::NO_SYMLINKS,
    )
    .map_err(os_err)
}

pub fn unlinkat(dirfd: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<()> {
    rfs::unlinkat(dirfd, name, AtFlags::from_bits_retain(flags as u32)).map_err(os_err)
}

pub fn renameat2(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: u32,
) -> io::Result<()> {
    rfs::renameat_with(
        olddir,
        oldname,
        newdir,
        newname,
        rfs::RenameFlags::from_bits_retain(flags),
    )
    .map_err(os_err)
}

pub fn readlink_fd(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // An empty path with an O_PATH descriptor reads the link itself.
    let n = rfs::readlinkat_raw(fd, c"", &mut buf[..]).map_err(os_err)?;
    buf.truncate(n);
    Ok(buf)
}

/// chmod of the object behind an O_PATH handle (not a symlink).
pub fn chmod_fd(fd: BorrowedFd<'_>, mode_bits: u32) -> io::Result<()> {
    let path = proc_fd_path(fd);
    rfs::chmod(&*path, mode(mode_bits)).map_err(os_err)
}

/// chown of the object behind an O_PATH handle, symlinks included.
/// `u32::MAX` leaves the id unchanged, as chown(2) does with -1.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    let uid = (uid != u32::MAX).then(|| rustix::fs::Uid::from_raw(uid));
    let gid = (gid != u32::MAX).then(|| rustix::fs::Gid::from_raw(gid));
    rfs::chownat(
        fd,
        c"",
        uid,
        gid,
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(os_err)
}

/// truncate(2) of the object behind an O_PATH handle. rustix has only
/// ftruncate, and opening the file instead would block on a FIFO and
/// check different permissions.
pub fn truncate_fd_path(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    let path = proc_fd_path(fd);
    // SAFETY: NUL-terminated path; no memory is written.
    check(unsafe { libc::truncate(path.as_ptr(), size as libc::off_t) }).map(drop)
}

/// Starts write-back of `len` bytes of `fd` from `offset` and returns
/// without waiting (sync_file_range, SYNC_FILE_RANGE_WRITE): durability
/// still needs fsync, which then has less left to wait for. rustix has no
/// binding.
pub fn start_writeback(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    let (offset, len) = (offset as libc::off64_t, len as libc::off64_t);
    let flags = libc::SYNC_FILE_RANGE_WRITE;
    // SAFETY: no memory is passed; a bad descriptor or range is an errno.
    check(unsafe { libc::sync_file_range(fd.as_raw_fd(), offset, len, flags) }).map(drop)
}

/// Tells the kernel the file will be read from start to end (a larger
/// readahead window).
pub fn advise_sequential(fd: BorrowedFd<'_>) -> io::Result<()> {
    rfs::fadvise(fd, 0, None, rfs::Advice::Sequential).map_err(os_err)
}

pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    rfs::ftruncate(fd, size).map_err(os_err)
}

/// A time for `utimensat`.
#[derive(Clone, Copy, Debug)]
pub enum TimeSpec {
    Omit,
    Now,
    At { secs: i64, nsecs: i64 },
}

impl TimeSpec {
    fn to_timespec(self) -> rustix::fs::Timespec {
        let (tv_sec, tv_nsec) = match self {
            TimeSpec::Omit => (0, rfs::UTIME_OMIT),
            TimeSpec::Now => (0, rfs::UTIME_NOW),
            TimeSpec::At { secs, nsecs } => (secs, nsecs as _),
        };
        rustix::fs::Timespec { tv_sec, tv_nsec }
    }
}

/// utimensat on the object behind an O_PATH handle, symlinks included.
pub fn utimens_fd(fd: BorrowedFd<'_>, atime: TimeSpec, mtime: TimeSpec) -> io::Result<()> {
    let times = rfs::Timestamps {
        last_access: atime.to_timespec(),
        last_modification: mtime.to_timespec(),
    };
    rfs::utimensat(
        fd,
        c"",
        &times,
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(os_err)
}

/// Reads until `buf` is full or the file ends; an error after some bytes
/// were read ends the read short instead of losing them.
pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pread(fd, &mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) if done > 0 => {
                tracing::debug!("short read after error: {e}");
                break;
            }
            Err(e) => return Err(os_err(e)),
        }
    }
    Ok(done)
}

pub fn pwrite(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pwrite(fd, &buf[done..], offset + done as u64) {
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) if done > 0 => break,
            Err(e) => return Err(os_err(e)),
        }
    }
    Ok(done)
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    if datasync {
        rfs::fdatasync(fd)
    } else {
        rfs::fsync(fd)
    }
    .map_err(os_err)
}

/// Flushes the whole file system `fd` lies on: what a sequence of renames
/// across its directories changed is durable once this returns.
pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    rfs::syncfs(fd).map_err(os_err)
}

/// [`syncfs`] of the file system directory `dir` lies on; `dir` may be an
/// `O_PATH` descriptor (which syncfs itself refuses).
pub fn syncfs_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    let opened = openat(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    syncfs(std::os::fd::AsFd::as_fd(&opened))
}

/// [`syncfs_dir`] of every file system the directories `dirs` lie on,
/// once each.
pub fn syncfs_dirs<'a>(dirs: impl IntoIterator<Item = BorrowedFd<'a>>) -> io::Result<()> {
    let mut synced = Vec::new();
    for dir in dirs {
        let dev = fstat(dir)?.st_dev;
        if !synced.contains(&dev) {
            syncfs_dir(dir)?;
            synced.push(dev);
        }
    }
    Ok(())
}

/// A private copy of the file `src` sharing its blocks (FICLONE: btrfs,
/// XFS, bcachefs...), as an unnamed file in directory `dir`, which must be
/// on the same file system. EOPNOTSUPP/EXDEV/EINVAL where cloning is not
/// possible.
pub fn clone_to_tmpfile(src: BorrowedFd<'_>, dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let fd = openat(dir, c".", libc::O_TMPFILE | libc::O_RDWR, 0o600)?;
    rfs::ioctl_ficlone(&fd, src).map_err(os_err)?;
    Ok(fd)
}

pub fn fallocate(fd: BorrowedFd<'_>, mode_bits: i32, offset: u64, len: u64) -> io::Result<()> {
    let flags = rfs::FallocateFlags::from_bits_retain(mode_bits as u32);
    rfs::fallocate(fd, flags, offset, len).map_err(os_err)
}

/// lseek(2) with any `whence` the kernel knows; others are EINVAL, as the
/// kernel answers them.
pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> io::Result<i64> {
    // A negative absolute offset is passed through unchanged (as the same
    // bits), so the kernel, not this wrapper, answers it with EINVAL.
    let pos = match whence {
        libc::SEEK_SET => rfs::SeekFrom::Start(offset as u64),
        libc::SEEK_CUR => rfs::SeekFrom::Current(offset),
        libc::SEEK_END => rfs::SeekFrom::End(offset),
        libc::SEEK_DATA => rfs::SeekFrom::Data(offset as u64),
        libc::SEEK_HOLE => rfs::SeekFrom::Hole(offset as u64),
        _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
    };
    rfs::seek(fd, pos).map(|p| p as i64).map_err(os_err)
}

pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: u64,
) -> io::Result<usize> {
    let (mut off_in, mut off_out) = (off_in, off_out);
    rfs::copy_file_range(
        fd_in,
        Some(&mut off_in),
        fd_out,
        Some(&mut off_out),
        usize::try_from(len).unwrap_or(usize::MAX),
    )
    .map_err(os_err)
}

pub type StatFs = rfs::StatVfs;

pub fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<StatFs> {
    rfs::fstatvfs(fd).map_err(os_err)
}

/// Whether the file system of `fd` shares blocks between files (FICLONE)
/// and journals every metadata change in order, the sharing included
/// (btrfs's transactions, XFS's log): a change made after a FICLONE never
/// survives a crash that the FICLONE does not, so no sync need come
/// between them.
pub fn shares_blocks_in_order(fd: BorrowedFd<'_>) -> bool {
    fs_type_is(fd, &[XFS_MAGIC, BTRFS_MAGIC])
}

const EXT4_MAGIC: i64 = 0xEF53;
const XFS_MAGIC: i64 = 0x5846_5342;
const BTRFS_MAGIC: i64 = 0x9123_683E;
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Whether the file system of `fd` is one of `types` (statfs magics).
fn fs_type_is(fd: BorrowedFd<'_>, types: &[i64]) -> bool {
    match rfs::fstatfs(fd) {
        // `f_type` is an i64 here, narrower on some other architectures.
        #[allow(clippy::unnecessary_cast)]
        Ok(st) => types.contains(&(st.f_type as i64)),
        Err(_) => false,
    }
}

/// Whether the file system of `fd` allocates every block written to,
/// whatever its bytes, and after a crash shows a block allocated only
/// with the data written to it (ordered data or copy-on-write: ext4,
/// XFS, btrfs; tmpfs has no crash): there, a hole where a block was
/// written means its data never reached the disk. Not so where zeros
/// are stored as holes (ZFS with compression) or ordering is unknown.
pub fn holes_mean_unwritten(fd: BorrowedFd<'_>) -> bool {
    fs_type_is(fd, &[EXT4_MAGIC, XFS_MAGIC, BTRFS_MAGIC, TMPFS_MAGIC])
}

/// Whether `path` is the root of a FUSE mount now (its file system is
/// FUSE's): a device number read there names a FUSE connection.
pub fn is_fuse_mount_root(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    let dev = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    let root = path
        .parent()
        .is_some_and(|parent| dev(parent).is_some_and(|d| Some(d) != dev(path)));
    match rfs::statfs(path) {
        #[allow(clippy::unnecessary_cast)]
        Ok(st) => root && st.f_type as i64 == FUSE_SUPER_MAGIC,
        Err(_) => false,
    }
}

/// One entry of a `getdents64` buffer.
pub struct DirEntry {
    pub ino: u64,
    /// The cookie that resumes reading after this entry.
    pub next_offset: i64,
    /// The `DT_*` type, `DT_UNKNOWN` when the file system does not say.
    pub dtype: u8,
    pub name: Vec<u8>,
}

/// The buffer `getdents64` fills; reused across batches.
pub struct DirBuf(Vec<MaybeUninit<u8>>);

impl DirBuf {
    pub fn new(len: usize) -> Self {
        DirBuf(vec![MaybeUninit::uninit(); len])
    }
}

fn dtype(t: rfs::FileType) -> u8 {
    use rfs::FileType as T;
    match t {
        T::RegularFile => libc::DT_REG,
        T::Directory => libc::DT_DIR,
        T::Symlink => libc::DT_LNK,
        T::Fifo => libc::DT_FIFO,
        T::Socket => libc::DT_SOCK,
        T::CharacterDevice => libc::DT_CHR,
        T::BlockDevice => libc::DT_BLK,
        T::Unknown => libc::DT_UNKNOWN,
    }
}

/// Reads the next batch of entries of an open directory: one `getdents64`
/// call, from the descriptor's current position. An empty result means the
/// end of the directory.
pub fn getdents(fd: BorrowedFd<'_>, buf: &mut DirBuf) -> io::Result<Vec<DirEntry>> {
    let mut dir = rfs::RawDir::new(fd, &mut buf.0);
    let mut entries = Vec::new();
    // RawDir refills its buffer on its own; stopping once the buffer is
    // used up keeps this to one batch, so `next_offset` of the last entry
    // is where the descriptor stands.
    while let Some(e) = dir.next() {
        let e = e.map_err(os_err)?;
        entries.push(DirEntry {
            ino: e.ino(),
            next_offset: e.next_entry_cookie() as i64,
            dtype: dtype(e.file_type()),
            name: e.file_name().to_bytes().to_vec(),
        });
        if dir.is_buffer_empty() {
            break;
        }
    }
    Ok(entries)
}

/// getxattr on the object behind an O_PATH handle — symlinks included: the
/// /proc link resolves to the object itself, never through it. `buf` empty
/// asks the size.
pub fn getxattr_fd(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let path = proc_fd_path(fd);
    // rustix answers an empty buffer with 0, not the size: the size query
    // is its own call.
    if buf.is_empty() {
        rfs::getxattr_query(&*path, name)
    } else {
        rfs::getxattr(&*path, name, buf)
    }
    .map_err(os_err)
}

/// getxattr through an open (not O_PATH) descriptor: no `/proc` path
/// walk. `buf` empty asks the size.
pub fn fgetxattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    if buf.is_empty() {
        rfs::fgetxattr_query(fd, name)
    } else {
        rfs::fgetxattr(fd, name, buf)
    }
    .map_err(os_err)
}

/// setxattr through an open (not O_PATH) descriptor: no `/proc` path walk.
pub fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    let flags = rfs::XattrFlags::from_bits_retain(flags as _);
    rfs::fsetxattr(fd, name, value, flags).map_err(os_err)
}

/// removexattr through an open (not O_PATH) descriptor.
pub fn fremovexattr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    rfs::fremovexattr(fd, name).map_err(os_err)
}

/// chmod through an open (not O_PATH) descriptor.
pub fn fchmod(fd: BorrowedFd<'_>, mode_bits: u32) -> io::Result<()> {
    rfs::fchmod(fd, mode(mode_bits)).map_err(os_err)
}

pub fn setxattr_fd(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    let path = proc_fd_path(fd);
    let flags = rfs::XattrFlags::from_bits_retain(flags as _);
    rfs::setxattr(&*path, name, value, flags).map_err(os_err)
}

/// listxattr on the object behind an O_PATH handle; `buf` empty asks the
/// size.
pub fn listxattr_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let path = proc_fd_path(fd);
    // As for getxattr_fd: an empty buffer asks the size.
    if buf.is_empty() {
        rfs::listxattr_query(&*path)
    } else {
        rfs::listxattr(&*path, buf)
    }
    .map_err(os_err)
}

pub fn removexattr_fd(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let path = proc_fd_path(fd);
    rfs::removexattr(&*path, name).map_err(os_err)
}

/// access(2) with the effective (here: fs) ids of the calling thread.
pub fn access_fd(fd: BorrowedFd<'_>, mask: i32) -> io::Result<()> {
    let path = proc_fd_path(fd);
    let access = rfs::Access::from_bits_retain(mask as _);
    rfs::accessat(CWD, &*path, access, AtFlags::EACCESS).map_err(os_err)
}

fn limit_value(v: Option<u64>) -> u64 {
    v.unwrap_or(libc::RLIM_INFINITY)
}

fn limit_of(v: u64) -> Option<u64> {
    (v != libc::RLIM_INFINITY).then_some(v)
}

/// Raises RLIMIT_NOFILE to its hard maximum: the daemon holds one O_PATH
/// descriptor per inode the kernel remembers.
pub fn raise_fd_limit() -> io::Result<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let max = limit_value(getrlimit(Resource::Nofile).maximum);
    let mut want = max;
    if let Ok(text) = std::fs::read_to_string("/proc/sys/fs/nr_open") {
        if let Ok(nr_open) = text.trim().parse::<u64>() {
            want = want.max(nr_open);
        }
    }
    let set = |v: u64| {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit_of(v),
                maximum: limit_of(v),
            },
        )
    };
    if set(want).is_ok() {
        return Ok(want);
    }
    set(max).map_err(os_err)?;
    Ok(max)
}

/// A pidfd of process `pid` (readable once it has exited).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid as i32)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).map_err(os_err)
}

/// Waits up to `timeout` (`None`: for good) for `fd` to become readable;
/// whether it did. For a pidfd that is when every thread of the process
/// has exited, its last files released.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<std::time::Duration>) -> io::Result<bool> {
    let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: pfd is one valid pollfd, and the count passed is 1.
        match check(unsafe { libc::poll(&mut pfd, 1, ms) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok(n) => return Ok(n > 0),
        }
    }
}

pub fn geteuid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// fork(2). Only called before any thread is started.
pub enum Forked {
    Parent(libc::pid_t),
    Child,
}

/// rustix offers no fork (only a raw one for runtimes), so this stays libc's.
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
    rustix::process::setsid().map(drop).map_err(os_err)
}

/// A pipe (read end, write end), both close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(os_err)
}

/// Takes ownership of descriptor `fd`, inherited from the process that
/// started this one (`mount --ready-fd`); EBADF if it is not open. It is
/// made close-on-exec so no child of the daemon keeps it.
pub fn inherited_fd(fd: i32) -> io::Result<OwnedFd> {
    if fd < 3 {
        // 0-2 are stdio: closing one after the report would let the next
        // open take its number.
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: only borrowed for the checks below; ownership is taken once
    // F_GETFD proves the number is an open descriptor.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd as RawFd) };
    let flags = rustix::io::fcntl_getfd(borrowed).map_err(os_err)?;
    rustix::io::fcntl_setfd(borrowed, flags | rustix::io::FdFlags::CLOEXEC).map_err(os_err)?;
    // SAFETY: the descriptor is open (F_GETFD succeeded) and was handed to
    // this process for it alone to use and close.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Points stdin, stdout and stderr at `fd` (used when daemonizing).
pub fn redirect_stdio(fd: BorrowedFd<'_>, stdin_null: BorrowedFd<'_>) -> io::Result<()> {
    rustix::stdio::dup2_stdin(stdin_null).map_err(os_err)?;
    rustix::stdio::dup2_stdout(fd).map_err(os_err)?;
    rustix::stdio::dup2_stderr(fd).map_err(os_err)
}

/// umount2(path, flags) — used to clear a dead mount left by a crashed daemon.
pub fn umount2(path: &CStr, flags: i32) -> io::Result<()> {
    let flags = rustix::mount::UnmountFlags::from_bits_retain(flags as u32);
    rustix::mount::unmount(path, flags).map_err(os_err)
}

/// Moves the calling process into a mount namespace of its own, whose
/// mounts and unmounts neither reach the others nor come from them
/// (`chronofs sandbox`, before it execs the command). Needs
/// CAP_SYS_ADMIN.
pub fn private_mount_namespace() -> io::Result<()> {
    use rustix::thread::UnshareFlags;
    // SAFETY: unshare(CLONE_NEWNS) reads and writes no memory of this
    // process; it gives the calling thread a copy of the mount namespace
    // and its own fs_struct, which the single-threaded CLI does not share.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) }.map_err(os_err)?;
    follow_outside_mounts()
}

/// Makes every mount of this process's (new) mount namespace a slave of
/// the one it was copied from: nothing mounted here is seen outside, and
/// what is mounted or unmounted outside, where the mount is shared
/// (systemd makes `/` so), is here too; a disk unmounted outside is not
/// kept alive for as long as the sandboxed command runs. Where the mounts
/// are private, as on a machine without systemd, nothing propagates
/// either way: the copy of a mount lives until the command ends
/// (docs/ARCHITECTURE.md "Sandboxes").
fn follow_outside_mounts() -> io::Result<()> {
    use rustix::mount::MountPropagationFlags as P;
    rustix::mount::mount_change(c"/", P::DOWNSTREAM | P::REC).map_err(os_err)
}

/// Gives this (single-threaded) process a user namespace in which it keeps
/// its own uid and gid (the only ones mapped: others' files show as the
/// overflow ids, set-ID programs gain nothing), and there a private copy of
/// the mount namespace: an unprivileged user's sandbox. Its mounts are
/// copies from a more privileged namespace, so none of its changes
/// propagates back.
pub fn private_user_namespace() -> io::Result<()> {
    use rustix::thread::UnshareFlags;
    let (uid, gid) = (geteuid(), rustix::process::getegid().as_raw());
    // SAFETY: unshare(CLONE_NEWUSER | CLONE_NEWNS) reads and writes no
    // memory of this process; the kernel requires (and checks) that the
    // process is single-threaded, which the CLI is at this point.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNS) }
        .map_err(os_err)?;
    // Without CAP_SETGID in the parent namespace setgroups(2) must be
    // denied before a gid can be mapped.
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    follow_outside_mounts()
}

/// Whether process `pid` lives in a user namespace and a mount namespace
/// other than this process's (one it made for itself with
/// [`private_user_namespace`]).
pub fn in_own_namespaces(pid: u32) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    for ns in ["user", "mnt"] {
        let ours = std::fs::metadata(format!("/proc/self/ns/{ns}"))?;
        let theirs = std::fs::metadata(format!("/proc/{pid}/ns/{ns}"))?;
        if (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Binds the tree mounted at `from` (resolved here) over `to` (resolved
/// in the mount namespace of process `pid`; root may mount there, the
/// process, in a user namespace of its own, cannot reach `from`). The
/// tree is taken here, before entering that namespace: a path resolved
/// there would be the process's to make, a symlink to any directory
/// included. A thread of its own enters the namespace and ends, so no
/// other thread's view changes.
pub fn bind_mount_in_namespace_of(
    pid: u32,
    from: &std::path::Path,
    to: &std::path::Path,
) -> io::Result<()> {
    use rustix::mount::{MoveMountFlags, OpenTreeFlags};
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))?;
    let tree = rustix::mount::open_tree(
        CWD,
        from,
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(os_err)?;
    let to = to.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("sandbox-bind".into())
        .spawn(move || -> io::Result<()> {
            use rustix::thread::{LinkNameSpaceType, UnshareFlags};
            // SAFETY: unshare(CLONE_FS) reads and writes no memory of this
            // process; it gives this thread its own root, cwd and umask,
            // which setns(CLONE_NEWNS) requires and no other thread sees.
            unsafe { rustix::thread::unshare_unsafe(UnshareFlags::FS) }.map_err(os_err)?;
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(LinkNameSpaceType::Mount),
            )
            .map_err(os_err)?;
            rustix::mount::move_mount(
                &tree,
                c"",
                CWD,
                &to,
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )
            .map_err(os_err)
        })?;
    thread
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// Binds the tree mounted at `from` over `to` (in this mount namespace).
pub fn bind_mount(from: &std::path::Path, to: &std::path::Path) -> io::Result<()> {
    rustix::mount::mount_bind_recursive(from, to).map_err(os_err)
}

/// Mounts the FUSE control file system at /sys/fs/fuse/connections, where
/// a connection can be aborted (many systems mount it at boot; some, this
/// project's CI machine among them, do not).
pub fn mount_fusectl() -> io::Result<()> {
    rustix::mount::mount(
        "fusectl",
        "/sys/fs/fuse/connections",
        "fusectl",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .map_err(os_err)
}

/// Blocks the termination signals in the calling thread (and threads it
/// starts later) and returns a waiter that receives them synchronously.
/// rustix exposes signal masks only through its unsafe runtime module, so
/// these stay libc's.
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

/// Waits for child `pid` and returns its raw wait status.
pub fn waitpid(pid: libc::pid_t) -> io::Result<i32> {
    use rustix::process::{Pid, WaitOptions};
    let pid = Pid::from_raw(pid).ok_or_else(|| io::Error::from_raw_os_error(libc::ECHILD))?;
    match rustix::process::waitpid(Some(pid), WaitOptions::empty()).map_err(os_err)? {
        Some((_, status)) => Ok(status.as_raw()),
        // Only with WNOHANG, which is not passed.
        None => Err(io::Error::from_raw_os_error(libc::ECHILD)),
    }
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
    raw: HandleBytes,
}

/// Handles up to this size, header included, are kept inline: ext4's
/// (8 + 8 bytes), xfs's and tmpfs's (8 + 12) fit, so the inode table
/// holds a handle per remembered inode without an allocation each, in 24
/// bytes.
const INLINE_HANDLE: usize = 22;

#[derive(Clone, Debug, PartialEq, Eq)]
enum HandleBytes {
    /// Length, and the bytes (zero beyond it, so equality is bytewise).
    Inline(u8, [u8; INLINE_HANDLE]),
    Heap(Box<[u8]>),
}

impl HandleBytes {
    fn new(bytes: &[u8]) -> HandleBytes {
        if bytes.len() <= INLINE_HANDLE {
            let mut inline = [0u8; INLINE_HANDLE];
            inline[..bytes.len()].copy_from_slice(bytes);
            HandleBytes::Inline(bytes.len() as u8, inline)
        } else {
            HandleBytes::Heap(bytes.into())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            HandleBytes::Inline(len, bytes) => &bytes[..usize::from(*len)],
            HandleBytes::Heap(bytes) => bytes,
        }
    }
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
            raw: HandleBytes::new(&bytes[..HANDLE_HEADER + payload]),
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
    let raw = handle.raw.as_slice();
    let mut buf = vec![0u32; raw.len().div_ceil(4)];
    for (i, chunk) in raw.chunks(4).enumerate() {
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

/// Bytes the allocator has handed out and not yet had back (glibc's own
/// count, all threads): what memory accounting in tests measures.
pub fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    info.uordblks + info.hblkhd
}

/// Gives the allocator's free pages back to the kernel. glibc returns
/// memory on its own only from the top of a heap, so after a mass free
/// (the kernel forgetting most inodes) resident memory would otherwise
/// stay at its peak.
pub fn release_free_memory() {
    // SAFETY: malloc_trim only releases pages no allocation uses; it
    // takes the allocator's locks itself.
    unsafe { libc::malloc_trim(0) };
}

/// The current soft limit on open files.
pub fn fd_limit() -> u64 {
    limit_value(rustix::process::getrlimit(rustix::process::Resource::Nofile).current)
}

/// The mount flags (ST_*) of the file system holding `path`.
pub fn statvfs_flags(path: &std::path::Path) -> io::Result<u64> {
    Ok(rfs::statvfs(path).map_err(os_err)?.f_flag.bits())
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
    rustix::process::getegid().as_raw()
}

/// Lets SIGPIPE end the process, as for any Unix filter: `chronofs log |
/// head` then stops quietly when `head` exits instead of failing on a
/// write. Only for the CLI's commands, never the daemon (a client that
/// goes away must not kill a mount).
pub fn default_sigpipe() {
    // SAFETY: installs the default disposition; no handler code runs.
    // (rustix offers signal dispositions only in its unsafe runtime module.)
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Credentials of the process at the other end of a Unix socket.
#[derive(Clone, Debug)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Its supplementary groups when it connected (SO_PEERGROUPS; None
    /// where the socket cannot tell): exact, where /proc/PID may since
    /// be another process.
    pub groups: Option<std::sync::Arc<[u32]>>,
}

impl Peer {
    /// This process, as a peer of its own service (its groups are read
    /// from /proc/self, which cannot be another process).
    pub fn this_process() -> Peer {
        Peer {
            uid: geteuid(),
            gid: getegid(),
            pid: std::process::id(),
            groups: None,
        }
    }
}

/// SO_PEERCRED through libc: rustix's `UCred` holds a non-zero `Pid`, but
/// the kernel reports pid 0 for a peer outside this pid namespace.
pub fn peer_credentials(sock: &impl AsRawFd) -> io::Result<Peer> {
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
        groups: peer_groups(sock).ok().map(std::sync::Arc::from),
    })
}

/// SO_PEERGROUPS: the supplementary groups the peer had at connect(2).
fn peer_groups(sock: &impl AsRawFd) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: groups/len describe a writable buffer of the size passed.
        let r = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let count = len as usize / std::mem::size_of::<libc::gid_t>();
        match check(r) {
            Ok(_) => {
                groups.truncate(count);
                return Ok(groups);
            }
            // The kernel says how much room the list needs.
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) && count > groups.len() => {
                groups.resize(count, 0);
            }
            Err(e) => return Err(e),
        }
    }
}

pub fn mkfifo(path: &std::path::Path, mode_bits: u32) -> io::Result<()> {
    rfs::mknodat(CWD, path, rfs::FileType::Fifo, mode(mode_bits), 0).map_err(os_err)
}

/// Sets atime and mtime (ns since the epoch) without following a symlink.
pub fn set_times(path: &std::path::Path, atime_ns: i64, mtime_ns: i64) -> io::Result<()> {
    let ts = |ns: i64| rustix::fs::Timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000) as _,
    };
    let times = rfs::Timestamps {
        last_access: ts(atime_ns),
        last_modification: ts(mtime_ns),
    };
    rfs::utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW).map_err(os_err)
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

/// The run of `fd`'s layout holding `pos`, for a file shown as `size`
/// bytes: `(data, end)`, data or a hole from `pos` up to `end` (always
/// past `pos`); `None` at or past `size`. Where the file system cannot
/// tell, all of it is data; past the backing file's own end, a hole.
pub fn layout_run(fd: BorrowedFd<'_>, pos: u64, size: u64) -> io::Result<Option<(bool, u64)>> {
    if pos >= size {
        return Ok(None);
    }
    let enxio = |e: &io::Error| e.raw_os_error() == Some(libc::ENXIO);
    let at = pos as i64;
    match lseek(fd, at, libc::SEEK_HOLE) {
        Ok(hole) if hole as u64 > pos => Ok(Some((true, (hole as u64).min(size)))),
        Ok(_) => match lseek(fd, at, libc::SEEK_DATA) {
            Ok(data) if data as u64 > pos => Ok(Some((false, (data as u64).min(size)))),
            // Written between the two calls.
            Ok(_) => Ok(Some((true, size))),
            Err(e) if enxio(&e) => Ok(Some((false, size))),
            Err(e) => Err(e),
        },
        Err(e) if enxio(&e) => Ok(Some((false, size))),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(Some((true, size))),
        Err(e) => Err(e),
    }
}

/// The extents `FS_IOC_FIEMAP` fills in per call.
const FIEMAP_BATCH: usize = 64;

/// `struct fiemap` of linux/fiemap.h with room for a batch of extents.
#[repr(C)]
struct Fiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; FIEMAP_BATCH],
}

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// The bytes of `fd`'s file (open for reading) in extents it shares with
/// other files (FIEMAP_EXTENT_SHARED: reflinks, snapshots), counted once
/// per extent and at most its allocated size.
pub fn shared_extent_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const LAST: u32 = 0x1;
    const SHARED: u32 = 0x2000;
    let empty = FiemapExtent {
        logical: 0,
        physical: 0,
        length: 0,
        reserved64: [0; 2],
        flags: 0,
        reserved: [0; 3],
    };
    let (mut shared, mut from) = (0u64, 0u64);
    loop {
        let mut map = Fiemap {
            start: from,
            length: u64::MAX - from,
            flags: 0,
            mapped_extents: 0,
            extent_count: FIEMAP_BATCH as u32,
            reserved: 0,
            extents: [empty; FIEMAP_BATCH],
        };
        // SAFETY: `map` is a `struct fiemap` with room for `extent_count`
        // extents, which is all the kernel writes.
        check(unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FIEMAP, &mut map) })?;
        let got = (map.mapped_extents as usize).min(FIEMAP_BATCH);
        if got == 0 {
            break;
        }
        for e in &map.extents[..got] {
            if e.flags & SHARED != 0 {
                shared += e.length;
            }
        }
        let last = map.extents[got - 1];
        if last.flags & LAST != 0 {
            break;
        }
        from = last.logical + last.length;
    }
    let allocated = fstat(fd)?.st_blocks as u64 * 512;
    Ok(shared.min(allocated))
}

/// FICLONE: makes `dst` share all of `src`'s blocks (btrfs, XFS,
/// bcachefs...). EOPNOTSUPP, EXDEV, EINVAL or ENOTTY where the file
/// systems cannot, with `dst` left as it was.
pub fn ficlone(dst: BorrowedFd<'_>, src: BorrowedFd<'_>) -> io::Result<()> {
    rfs::ioctl_ficlone(dst, src).map_err(os_err)
}

#[cfg(test)]
mod tests {
    /// The groups a peer had when it connected, from the socket itself.
    #[test]
    fn a_peer_s_groups_come_from_the_socket() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = peer_credentials(&a).unwrap();
        let mut mine = rustix::process::getgroups()
            .unwrap()
            .into_iter()
            .map(|g| g.as_raw())
            .collect::<Vec<_>>();
        let mut got = peer.groups.expect("SO_PEERGROUPS").to_vec();
        mine.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, mine);
        assert_eq!(peer.pid, std::process::id());
    }

    use super::*;
    use std::os::fd::AsFd;

    fn scratch() -> Option<(tempfile::TempDir, OwnedFd)> {
        let dir = tempfile::tempdir().ok()?;
        let c = cstr(dir.path().join("f").as_os_str()).ok()?;
        let fd = openat(CWD, &c, libc::O_CREAT | libc::O_RDWR, 0o600).ok()?;
        drop(fd);
        let fd = openat(CWD, &c, libc::O_PATH | libc::O_NOFOLLOW, 0).ok()?;
        Some((dir, fd))
    }

    /// An empty buffer asks the size, as getxattr(2) and listxattr(2) do;
    /// the kernel's vfs relies on it to size its replies.
    #[test]
    fn empty_xattr_buffers_ask_the_size() {
        let Some((_dir, fd)) = scratch() else { return };
        match setxattr_fd(fd.as_fd(), c"user.k", b"three", 0) {
            Ok(()) => {}
            // A temporary directory without user xattrs proves nothing.
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return,
            Err(e) => panic!("setxattr: {e}"),
        }
        assert_eq!(getxattr_fd(fd.as_fd(), c"user.k", &mut []).ok(), Some(5));
        let mut value = [0u8; 5];
        assert_eq!(getxattr_fd(fd.as_fd(), c"user.k", &mut value).ok(), Some(5));
        assert_eq!(&value, b"three");
        let mut small = [0u8; 2];
        let err = getxattr_fd(fd.as_fd(), c"user.k", &mut small).err();
        assert_eq!(err.and_then(|e| e.raw_os_error()), Some(libc::ERANGE));
        let need = listxattr_fd(fd.as_fd(), &mut []).ok();
        assert!(need.is_some_and(|n| n >= b"user.k\0".len()));
    }

    /// Errors carry the kernel's errno unchanged.
    #[test]
    fn errnos_pass_through() {
        let err = fstatat(CWD, c"/nonexistent/chronofs-test").err();
        assert_eq!(err.and_then(|e| e.raw_os_error()), Some(libc::ENOENT));
        let err = lseek(CWD, 0, 12345).err();
        assert_eq!(err.and_then(|e| e.raw_os_error()), Some(libc::EINVAL));
    }

    /// mknod with no type bits makes a regular file, as mknod(2) does.
    #[test]
    fn mknod_without_type_is_a_regular_file() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let Ok(c) = cstr(dir.path().as_os_str()) else {
            return;
        };
        let Ok(dfd) = openat(CWD, &c, libc::O_PATH | libc::O_DIRECTORY, 0) else {
            return;
        };
        assert!(mknodat(dfd.as_fd(), c"r", 0o600, 0).is_ok());
        let st = fstatat(dfd.as_fd(), c"r").ok();
        assert_eq!(st.map(|s| s.st_mode & libc::S_IFMT), Some(libc::S_IFREG));
    }

    /// One getdents call lists a small directory; the next reports its end.
    #[test]
    fn getdents_reads_one_batch_then_the_end() {
        let Ok(dir) = tempfile::tempdir() else { return };
        for n in ["a", "b"] {
            assert!(std::fs::write(dir.path().join(n), b"").is_ok());
        }
        let Ok(c) = cstr(dir.path().as_os_str()) else {
            return;
        };
        let Ok(fd) = openat(CWD, &c, libc::O_RDONLY | libc::O_DIRECTORY, 0) else {
            return;
        };
        let mut buf = DirBuf::new(4096);
        let mut names: Vec<Vec<u8>> = getdents(fd.as_fd(), &mut buf)
            .map(|b| b.into_iter().map(|e| e.name).collect())
            .unwrap_or_default();
        names.sort();
        assert_eq!(names, [&b"."[..], b"..", b"a", b"b"]);
        assert!(getdents(fd.as_fd(), &mut buf).is_ok_and(|b| b.is_empty()));
    }
}
