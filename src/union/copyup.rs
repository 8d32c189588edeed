//! Copy-up: an object of a read-only branch copied into a read-write one,
//! never visible half-copied.
//!
//! The vfs calls these functions with directory descriptors (O_PATH ones
//! are fine) after it has checked the *caller's* permission for the change
//! that needs the copy. The copy itself runs with the daemon's own
//! credentials (root in the default deployment): a caller who may write a
//! file but not its parent directory must still get its copy-up, as with
//! overlayfs. Called on a thread that switched its fs ids (`sys::creds`),
//! the copy runs as that identity instead and the chown of `Owner::Keep`
//! fails with EPERM.
//!
//! Order of a copy, for every kind of object:
//! 1. the object is made where nobody can see it: regular files as an
//!    `O_TMPFILE` in the upper parent, or, where the file system has no
//!    `O_TMPFILE`, under a hidden name `.chronofs-copyup.<16 hex digits>`
//!    (see [`is_copyup_temp`]; `fsck` is to remove orphans a crash leaves);
//!    everything else under such a hidden name;
//! 2. data: `FICLONE` where the file systems share blocks, else
//!    `copy_file_range` over the data ranges only (SEEK_DATA/SEEK_HOLE),
//!    so holes stay holes; plain reads and writes across file systems that
//!    refuse `copy_file_range`;
//! 3. owner, then the xattrs (chown drops `security.capability`), then the
//!    mode (chown drops set-user-ID), then atime and mtime to the
//!    nanosecond; overlayfs's own xattrs (`trusted.overlay.*`,
//!    `user.overlay.*`) are not copied: they describe the lower layer;
//! 4. `linkat` of the tmpfile (through `/proc/self/fd`, which needs no
//!    CAP_DAC_READ_SEARCH) or `renameat2(RENAME_NOREPLACE)` of the hidden
//!    name: EEXIST, never a clobber, if the name appeared meanwhile;
//! 5. the upper parent's atime and mtime are put back as they were before
//!    the copy (overlayfs does the same): a copy-up changes nothing the
//!    user sees in that directory, and a parent copied up just before
//!    keeps the lower directory's times.
//!
//! Durability: copied (not cloned) data is `fdatasync`ed before the link.
//! Without it a crash on a delayed-allocation file system (ext4, XFS) can
//! keep the link, journaled, but not the data, and leave a file of zeros
//! shadowing the intact lower one. The cost is the data's write-back, which
//! `cp` + `sync` pays too (measured in the tests' `bench_1gib`). A clone or
//! an empty file has no data of its own to lose and is not synced; the
//! metadata steps are ordered by the file system's journal before the link.

use std::collections::hash_map::RandomState;
use std::ffi::{CStr, CString};
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use super::Result;
use crate::sys::{self, Stat, TimeSpec};

/// The ownership a copied-up object gets, for one request: the mount's
/// [`OwnerOption`] resolved with the caller's ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Owner {
    /// The lower object's uid, gid and mode.
    #[default]
    Keep,
    /// These ids and permission bits (`mode & 0o7777`). A directory also
    /// gets search permission for every class that may read it, so that
    /// `fixed:…:644` does not make copied-up parents untraversable.
    Fixed { uid: u32, gid: u32, mode: u32 },
    /// The caller's ids, the lower object's mode.
    Caller { uid: u32, gid: u32 },
}

/// The `-o copyup-owner=keep|fixed:UID:GID:MODE|caller` mount option. It
/// is kept apart from [`Owner`] because `caller` names no ids until a
/// request comes: [`OwnerOption::resolve`] supplies them, so an unresolved
/// `caller` can never be applied as uid 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OwnerOption {
    #[default]
    Keep,
    Fixed {
        uid: u32,
        gid: u32,
        mode: u32,
    },
    Caller,
}

impl OwnerOption {
    /// Parses the option's value; errors are one line, naming the option.
    pub fn parse(s: &str) -> std::result::Result<OwnerOption, String> {
        match s {
            "keep" => return Ok(OwnerOption::Keep),
            "caller" => return Ok(OwnerOption::Caller),
            _ => {}
        }
        let Some(rest) = s.strip_prefix("fixed:") else {
            return Err(format!(
                "copyup-owner: expected keep, caller or fixed:UID:GID:MODE, got '{s}'"
            ));
        };
        let parts: Vec<&str> = rest.split(':').collect();
        let [uid, gid, mode] = parts[..] else {
            return Err(format!(
                "copyup-owner: fixed takes UID:GID:MODE (e.g. fixed:1000:1000:644), got '{s}'"
            ));
        };
        Ok(OwnerOption::Fixed {
            uid: parse_id("UID", uid)?,
            gid: parse_id("GID", gid)?,
            mode: parse_mode(mode)?,
        })
    }

    /// The ownership for one request by `uid`/`gid`.
    pub fn resolve(&self, uid: u32, gid: u32) -> Owner {
        match *self {
            OwnerOption::Keep => Owner::Keep,
            OwnerOption::Fixed { uid, gid, mode } => Owner::Fixed { uid, gid, mode },
            OwnerOption::Caller => Owner::Caller { uid, gid },
        }
    }
}

impl fmt::Display for OwnerOption {
    /// The option's value as `parse` reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnerOption::Keep => write!(f, "keep"),
            OwnerOption::Caller => write!(f, "caller"),
            OwnerOption::Fixed { uid, gid, mode } => write!(f, "fixed:{uid}:{gid}:{mode:o}"),
        }
    }
}

fn parse_id(what: &str, s: &str) -> std::result::Result<u32, String> {
    // u32::MAX is chown(2)'s "leave unchanged", never an owner.
    match s.parse::<u32>() {
        Ok(v) if v != u32::MAX => Ok(v),
        _ => Err(format!(
            "copyup-owner: {what} '{s}' is not a number below 4294967295"
        )),
    }
}

fn parse_mode(s: &str) -> std::result::Result<u32, String> {
    match u32::from_str_radix(s, 8) {
        Ok(v) if v <= 0o7777 && !s.is_empty() => Ok(v),
        _ => Err(format!(
            "copyup-owner: MODE '{s}' is not an octal mode from 0 to 7777"
        )),
    }
}

impl Owner {
    /// (uid, gid, permission bits) for a copy of the object `st` describes.
    fn target(&self, st: &Stat) -> (u32, u32, u32) {
        let lower_mode = st.st_mode & 0o7777;
        match *self {
            Owner::Keep => (st.st_uid, st.st_gid, lower_mode),
            Owner::Caller { uid, gid } => (uid, gid, lower_mode),
            Owner::Fixed { uid, gid, mode } if is_kind(st, libc::S_IFDIR) => {
                (uid, gid, (mode & 0o7777) | ((mode & 0o444) >> 2))
            }
            Owner::Fixed { uid, gid, mode } => (uid, gid, mode & 0o7777),
        }
    }
}

/// The prefix of the hidden names copy-up works under.
const TEMP_PREFIX: &[u8] = b".chronofs-copyup.";

/// Whether `name` is one of copy-up's hidden temporary names: the vfs hides
/// them from listings and `fsck` removes them (a crash between creating
/// one and renaming it into place leaves it behind).
pub fn is_copyup_temp(name: &[u8]) -> bool {
    name.strip_prefix(TEMP_PREFIX)
        .is_some_and(|hex| hex.len() == 16 && hex.iter().all(|b| b.is_ascii_hexdigit()))
}

/// A fresh hidden name; collisions are caught by O_EXCL/mkdir/mknod and
/// retried.
fn temp_name() -> CString {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded from the OS once per thread, then varies per
    // instance: enough to make names unpredictable across processes.
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    let name = format!(
        "{}{:016x}",
        String::from_utf8_lossy(TEMP_PREFIX),
        h.finish()
    );
    CString::new(name).unwrap_or_default()
}

/// Whether overlayfs owns this xattr (it describes the lower layer).
fn is_overlay_xattr(name: &[u8]) -> bool {
    name.starts_with(b"trusted.overlay.") || name.starts_with(b"user.overlay.")
}

fn is_kind(st: &Stat, kind: u32) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// Makes directory `name` of `lower_parent` exist in `upper_parent`, with
/// the lower directory's mode, owner (per `owner`), xattrs and times but
/// none of its entries, and returns an O_PATH descriptor of the upper
/// directory. A directory already there is returned as it is; a
/// non-directory there is ENOTDIR. The new directory appears complete (it
/// is prepared under a hidden name and renamed into place).
pub fn copy_up_dir(
    lower_parent: BorrowedFd<'_>,
    upper_parent: BorrowedFd<'_>,
    name: &CStr,
    owner: &Owner,
) -> Result<OwnedFd> {
    Ok(dir_up(lower_parent, upper_parent, name, owner)?)
}

/// Creates every directory of a relative path missing in the upper branch,
/// top-down, and returns an O_PATH descriptor of the deepest. `chain[i]`
/// is (a lower directory holding component i, component i's name): the
/// components may come from different lower branches. Directories already
/// in the upper branch are left as they are; an empty chain returns
/// `upper_root` itself.
pub fn copy_up_parents(
    chain: &[(BorrowedFd<'_>, &CStr)],
    upper_root: BorrowedFd<'_>,
    owner: &Owner,
) -> Result<OwnedFd> {
    let mut dir = open_dir(upper_root, c".")?;
    for (lower_parent, name) in chain {
        dir = dir_up(*lower_parent, dir.as_fd(), name, owner)?;
    }
    Ok(dir)
}

/// Copies the non-directory `name` of `lower_parent` (regular file,
/// symlink, FIFO, socket or device) to the same name in `upper_parent`
/// and returns an O_PATH descriptor of the copy. EEXIST if the upper name
/// exists, before or during the copy; EISDIR for a directory (use
/// [`copy_up_dir`]). On any error nothing new is left in `upper_parent`.
pub fn copy_up_file(
    lower_parent: BorrowedFd<'_>,
    name: &CStr,
    upper_parent: BorrowedFd<'_>,
    owner: &Owner,
) -> Result<OwnedFd> {
    let how = How {
        tmpfile: true,
        sync: true,
    };
    Ok(file_up(lower_parent, name, upper_parent, owner, how)?)
}

/// How a regular file is copied; the tests and the benchmark vary it.
#[derive(Clone, Copy)]
struct How {
    /// Try O_TMPFILE before a hidden name.
    tmpfile: bool,
    /// fdatasync copied data before the link.
    sync: bool,
}

fn open_dir(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    sys::openat(
        dir,
        name,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
}

fn dir_up(
    lower_parent: BorrowedFd<'_>,
    upper_parent: BorrowedFd<'_>,
    name: &CStr,
    owner: &Owner,
) -> io::Result<OwnedFd> {
    match open_dir(upper_parent, name) {
        Err(e) if errno(&e) == libc::ENOENT => {}
        other => return other,
    }
    let lower = open_dir(lower_parent, name)?;
    let st = sys::fstat(lower.as_fd())?;
    let parent = ParentTimes::save(upper_parent)?;
    let (temp, ()) = Hidden::create(upper_parent, true, |n| sys::mkdirat(upper_parent, n, 0o700))?;
    let made = open_dir(upper_parent, &temp.name)
        .and_then(|fd| apply_meta(fd.as_fd(), lower.as_fd(), &st, owner).map(|()| fd))
        .and_then(|fd| temp.publish(name, true).map(|()| fd));
    let result = match made {
        // Made by someone else meanwhile: theirs stands.
        Err(e) if errno(&e) == libc::EEXIST => open_dir(upper_parent, name),
        other => other,
    };
    parent.restore();
    result
}

fn file_up(
    lower_parent: BorrowedFd<'_>,
    name: &CStr,
    upper_parent: BorrowedFd<'_>,
    owner: &Owner,
    how: How,
) -> io::Result<OwnedFd> {
    let lower = sys::open_path(lower_parent, name)?;
    let st = sys::fstat(lower.as_fd())?;
    if is_kind(&st, libc::S_IFDIR) {
        return Err(err(libc::EISDIR));
    }
    match sys::fstatat(upper_parent, name) {
        Ok(_) => return Err(err(libc::EEXIST)),
        Err(e) if errno(&e) == libc::ENOENT => {}
        Err(e) => return Err(e),
    }
    let parent = ParentTimes::save(upper_parent)?;
    let result = if is_kind(&st, libc::S_IFREG) {
        copy_regular(lower.as_fd(), &st, upper_parent, name, owner, how)
    } else {
        copy_special(lower.as_fd(), &st, upper_parent, name, owner)
    };
    parent.restore();
    result
}

/// A directory's atime and mtime, put back after copy-up changed them.
struct ParentTimes<'a> {
    dir: BorrowedFd<'a>,
    st: Stat,
}

impl<'a> ParentTimes<'a> {
    fn save(dir: BorrowedFd<'a>) -> io::Result<Self> {
        Ok(ParentTimes {
            dir,
            st: sys::fstat(dir)?,
        })
    }

    /// Best effort: the copy is made (or failed) already, and wrong
    /// directory times must not turn that into another result.
    fn restore(self) {
        if let Err(e) = set_times(self.dir, &self.st) {
            tracing::debug!("copy-up: parent times not restored: {e}");
        }
    }
}

fn set_times(fd: BorrowedFd<'_>, st: &Stat) -> io::Result<()> {
    let at = |secs: i64, nsecs: i64| TimeSpec::At { secs, nsecs };
    sys::utimens_fd(
        fd,
        at(st.st_atime, st.st_atime_nsec),
        at(st.st_mtime, st.st_mtime_nsec),
    )
}

/// Owner, xattrs, mode, times: the order in which none undoes another.
fn apply_meta(
    fd: BorrowedFd<'_>,
    lower: BorrowedFd<'_>,
    st: &Stat,
    owner: &Owner,
) -> io::Result<()> {
    let (uid, gid, mode) = owner.target(st);
    sys::chown_fd(fd, uid, gid)?;
    copy_xattrs(lower, fd)?;
    // A symlink's mode is fixed at 0777 and chmod would follow it.
    if !is_kind(st, libc::S_IFLNK) {
        sys::chmod_fd(fd, mode)?;
    }
    set_times(fd, st)
}

fn copy_xattrs(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    for (name, value) in sys::xattrs_of(from)? {
        if is_overlay_xattr(&name) {
            continue;
        }
        let name = CString::new(name).map_err(|_| err(libc::EINVAL))?;
        sys::setxattr_fd(to, &name, &value, 0)?;
    }
    Ok(())
}

/// An object under a hidden name in `dir`, removed on drop unless it was
/// published.
struct Hidden<'a> {
    dir: BorrowedFd<'a>,
    name: CString,
    is_dir: bool,
    published: bool,
}

impl<'a> Hidden<'a> {
    /// Runs `make` with fresh hidden names until one is free.
    fn create<T>(
        dir: BorrowedFd<'a>,
        is_dir: bool,
        mut make: impl FnMut(&CStr) -> io::Result<T>,
    ) -> io::Result<(Self, T)> {
        let mut last = err(libc::EEXIST);
        for _ in 0..16 {
            let name = temp_name();
            match make(&name) {
                Ok(v) => {
                    let hidden = Hidden {
                        dir,
                        name,
                        is_dir,
                        published: false,
                    };
                    return Ok((hidden, v));
                }
                Err(e) if errno(&e) == libc::EEXIST => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Renames the object to `name` unless that exists (EEXIST).
    fn publish(mut self, name: &CStr, is_dir: bool) -> io::Result<()> {
        rename_noreplace(self.dir, &self.name, name, is_dir)?;
        self.published = true;
        Ok(())
    }
}

impl Drop for Hidden<'_> {
    fn drop(&mut self) {
        if self.published {
            return;
        }
        let flags = if self.is_dir { libc::AT_REMOVEDIR } else { 0 };
        if let Err(e) = sys::unlinkat(self.dir, &self.name, flags) {
            tracing::warn!("copy-up: temporary {:?} not removed: {e}", self.name);
        }
    }
}

/// renameat2(RENAME_NOREPLACE); where the file system lacks it (EINVAL),
/// a non-directory is hard-linked then unlinked, which refuses an existing
/// name just as well.
fn rename_noreplace(dir: BorrowedFd<'_>, from: &CStr, to: &CStr, is_dir: bool) -> io::Result<()> {
    match sys::renameat2(dir, from, dir, to, libc::RENAME_NOREPLACE) {
        Err(e) if errno(&e) == libc::EINVAL && !is_dir => {
            let old = sys::open_path(dir, from)?;
            link_noreplace(old.as_fd(), dir, to)?;
            sys::unlinkat(dir, from, 0)
        }
        other => other,
    }
}

fn link_noreplace(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // linkat never replaces: EEXIST if the name is taken.
    sys::link_fd(fd, dir, name)
}

/// Symlinks, FIFOs, sockets and devices: made under a hidden name.
fn copy_special(
    lower: BorrowedFd<'_>,
    st: &Stat,
    dir: BorrowedFd<'_>,
    name: &CStr,
    owner: &Owner,
) -> io::Result<OwnedFd> {
    let target = if is_kind(st, libc::S_IFLNK) {
        Some(CString::new(sys::readlink_fd(lower)?).map_err(|_| err(libc::EINVAL))?)
    } else {
        None
    };
    let (kind, rdev) = (st.st_mode & libc::S_IFMT, st.st_rdev);
    let (hidden, ()) = Hidden::create(dir, false, |n| match &target {
        Some(t) => sys::symlinkat(t, dir, n),
        None => sys::mknodat(dir, n, kind | 0o600, rdev),
    })?;
    let fd = sys::open_path(dir, &hidden.name)?;
    apply_meta(fd.as_fd(), lower, st, owner)?;
    hidden.publish(name, false)?;
    Ok(fd)
}

/// A regular file being filled where nobody sees it.
enum TempFile<'a> {
    Unnamed(OwnedFd),
    Named(OwnedFd, Hidden<'a>),
}

impl<'a> TempFile<'a> {
    fn create(dir: BorrowedFd<'a>, try_tmpfile: bool) -> io::Result<Self> {
        if try_tmpfile {
            match sys::openat(dir, c".", libc::O_TMPFILE | libc::O_RDWR, 0o600) {
                Ok(fd) => return Ok(TempFile::Unnamed(fd)),
                // Unsupported by the file system (EOPNOTSUPP) or the
                // kernel (EISDIR, EINVAL): fall back to a hidden name.
                Err(e) if [libc::EOPNOTSUPP, libc::EISDIR, libc::EINVAL].contains(&errno(&e)) => {}
                Err(e) => return Err(e),
            }
        }
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW;
        let (hidden, fd) = Hidden::create(dir, false, |n| sys::openat(dir, n, flags, 0o600))?;
        Ok(TempFile::Named(fd, hidden))
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            TempFile::Unnamed(fd) | TempFile::Named(fd, _) => fd.as_fd(),
        }
    }

    /// Gives the file `name` (EEXIST if taken); returns an O_PATH
    /// descriptor of it, taken before the link so it is this very file.
    fn publish(self, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
        let path_fd = sys::reopen(self.fd(), libc::O_PATH)?;
        match self {
            TempFile::Unnamed(fd) => link_noreplace(fd.as_fd(), dir, name)?,
            TempFile::Named(_, hidden) => hidden.publish(name, false)?,
        }
        Ok(path_fd)
    }
}

fn copy_regular(
    lower: BorrowedFd<'_>,
    st: &Stat,
    dir: BorrowedFd<'_>,
    name: &CStr,
    owner: &Owner,
    how: How,
) -> io::Result<OwnedFd> {
    let src = open_for_read(lower)?;
    let temp = TempFile::create(dir, how.tmpfile)?;
    let size = u64::try_from(st.st_size).unwrap_or(0);
    let cloned = fill(src.as_fd(), temp.fd(), size)?;
    if how.sync && !cloned && size > 0 {
        sys::fsync(temp.fd(), true)?;
    }
    apply_meta(temp.fd(), lower, st, owner)?;
    temp.publish(dir, name)
}

/// Reading must not change the lower atime (the branch is read-only to
/// us): O_NOATIME, which needs ownership or CAP_FOWNER, when allowed.
fn open_for_read(lower: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    match sys::reopen(lower, libc::O_RDONLY | libc::O_NOATIME) {
        Err(e) if errno(&e) == libc::EPERM => sys::reopen(lower, libc::O_RDONLY),
        other => other,
    }
}

/// Fills the empty `dst` with `src`'s `size` bytes; true if by a clone.
fn fill(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, size: u64) -> io::Result<bool> {
    match sys::ficlone(dst, src) {
        Ok(()) => return Ok(true),
        Err(e) if !cannot_clone(&e) => return Err(e),
        Err(_) => {}
    }
    // Setting the size first leaves every range not copied below a hole.
    sys::ftruncate(dst, size)?;
    for (offset, len) in sys::data_ranges(src, size)? {
        copy_range(src, dst, offset, len)?;
    }
    Ok(false)
}

fn cannot_clone(e: &io::Error) -> bool {
    [
        libc::EOPNOTSUPP,
        libc::EXDEV,
        libc::EINVAL,
        libc::ENOTTY,
        libc::ENOSYS,
    ]
    .contains(&errno(e))
}

/// copy_file_range over one range; plain reads and writes when the two
/// file systems refuse it (EXDEV across some pairs, EINVAL/EOPNOTSUPP on
/// a few file systems).
fn copy_range(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let at = offset + done;
        match sys::copy_file_range(src, at, dst, at, len - done) {
            // The source ended early: it shrank since it was measured.
            Ok(0) => return Ok(()),
            Ok(n) => done += n as u64,
            Err(e) if errno(&e) == libc::EINTR => {}
            Err(e) if cannot_clone(&e) => return rw_copy(src, dst, at, len - done),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn rw_copy(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; (1 << 20).min(len as usize)];
    let mut done = 0;
    while done < len {
        let want = buf.len().min((len - done) as usize);
        let n = sys::pread(src, &mut buf[..want], offset + done)?;
        if n == 0 {
            return Ok(());
        }
        write_all(dst, &buf[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// sys::pwrite stops short at an error after some bytes; writing the rest
/// again reports that error (ENOSPC, EIO...).
fn write_all(dst: BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match sys::pwrite(dst, &buf[done..], offset + done as u64)? {
            0 => return Err(err(libc::EIO)),
            n => done += n,
        }
    }
    Ok(())
}
