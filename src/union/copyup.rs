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
//!    (see [`is_copyup_temp`]; `chronofs fsck BRANCHES --repair` removes
//!    orphans a crash leaves);
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
//! [`copy_up_file_truncated`] is the same for a change that truncates
//! (open with O_TRUNC, truncate(2)): only the surviving bytes are copied.
//!
//! Durability: copied (not cloned) data is `fdatasync`ed before the link.
//! Without it a crash on a delayed-allocation file system (ext4, XFS) can
//! keep the link, journaled, but not the data, and leave a file of zeros
//! shadowing the intact lower one; overlayfs syncs too (unless mounted
//! `volatile`). Measured on this project's test VM (ext4 on virtio,
//! `bench_copy_up` in the tests, three runs, medians of five): a 1 GiB
//! copy-up takes 0.84, 0.71 and 0.53 s against 0.84, 0.65 and 0.53 s for
//! `cp` + `sync` (ratio 1.00 to 1.08: the write-back is the cost either
//! way; later runs, loaded machine: 1.06-1.07×, until the copy started
//! each chunk's write-back as it went, see [`copy_range`]); a 4 KiB file
//! takes 0.4 to 2.6 ms instead of 0.2 to 0.5 ms, the journal commit. (Without the sync, ext4's O_TMPFILE is most of a small
//! copy; a hidden name is slower still: 0.47 ms against 0.31 ms.)
//! A clone or an empty file has no data of its own to lose and is not
//! synced; the metadata steps are ordered by the file system's journal
//! before the link.
//!
//! Restoring the parent's times (step 5) is not atomic: a name another
//! process creates in that directory during the copy can have its mtime
//! update undone; the vfs should keep other changes to that directory out
//! while it copies up into it, as overlayfs holds the parent's lock.

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
    /// The caller's ids, the lower object's mode; a directory keeps its
    /// owner.
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
            // A directory keeps its owner: owning a sticky or shared
            // directory would let the caller remove others' files in it.
            Owner::Caller { .. } if is_kind(st, libc::S_IFDIR) => {
                (st.st_uid, st.st_gid, lower_mode)
            }
            Owner::Caller { uid, gid } => (uid, gid, lower_mode),
            Owner::Fixed { uid, gid, mode } if is_kind(st, libc::S_IFDIR) => {
                (uid, gid, (mode & 0o7777) | ((mode & 0o444) >> 2))
            }
            Owner::Fixed { uid, gid, mode } => (uid, gid, mode & 0o7777),
        }
    }
}

/// The prefix of the hidden names copy-up works under.
pub(crate) const TEMP_PREFIX: &[u8] = b".chronofs-copyup.";

/// Whether `name` is one of copy-up's hidden temporary names: the vfs hides
/// them from listings and `fsck` removes them (a crash between creating
/// one and renaming it into place leaves it behind).
pub fn is_copyup_temp(name: &[u8]) -> bool {
    name.strip_prefix(TEMP_PREFIX)
        .is_some_and(|hex| hex.len() == 16 && hex.iter().all(|b| b.is_ascii_hexdigit()))
}

/// A fresh hidden name; collisions are caught by O_EXCL/mkdir/mknod and
/// retried. (The vfs also makes an object over a whiteout under one.)
pub fn temp_name() -> CString {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded from the OS once per thread, then varies per
    // instance: enough to make names unpredictable across processes.
    // The first 8 digits are the process's mark: a crash's leftovers
    // are told from work under way by it (`format::is_orphan`).
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    let name = format!(
        "{}{:08x}{:08x}",
        String::from_utf8_lossy(TEMP_PREFIX),
        super::format::process_token(),
        h.finish() as u32
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
// Only the tests copy without a `BeforeVisible` step (the vfs always
// binds the copy first).
#[cfg(test)]
pub fn copy_up_dir(
    lower_parent: BorrowedFd<'_>,
    upper_parent: BorrowedFd<'_>,
    name: &CStr,
    owner: &Owner,
) -> Result<OwnedFd> {
    copy_up_dir_identified(lower_parent, upper_parent, name, owner, &nothing_first)
}

/// Called with the finished copy (a descriptor and its attributes) just
/// before it takes its name: the caller gives the copy its identity (its
/// inode number, a hard-link index entry's marks) first, so that whoever
/// finds the copy by name in between (a listing by the history worker, a
/// lookup of another name, the next mount after a crash) finds it whole.
/// An error leaves no copy.
pub type BeforeVisible<'a> = &'a dyn Fn(BorrowedFd<'_>, &Stat) -> io::Result<()>;

/// A [`BeforeVisible`] step that does nothing.
fn nothing_first(_: BorrowedFd<'_>, _: &Stat) -> io::Result<()> {
    Ok(())
}

/// [`copy_up_dir`] with a [`BeforeVisible`] step (not run when the
/// directory was there already or was made by someone else meanwhile).
pub fn copy_up_dir_identified(
    lower_parent: BorrowedFd<'_>,
    upper_parent: BorrowedFd<'_>,
    name: &CStr,
    owner: &Owner,
    before_visible: BeforeVisible<'_>,
) -> Result<OwnedFd> {
    Ok(dir_up(
        lower_parent,
        upper_parent,
        name,
        owner,
        before_visible,
    )?)
}

/// Creates every directory of a relative path missing in the upper branch,
/// top-down, and returns an O_PATH descriptor of the deepest. `chain[i]`
/// is (a lower directory holding component i, component i's name): the
/// components may come from different lower branches. Directories already
/// in the upper branch are left as they are; an empty chain returns
/// `upper_root` itself. On an error the directories made before it stay:
/// each is complete and shows just what its lower one shows.
pub fn copy_up_parents(
    chain: &[(BorrowedFd<'_>, &CStr)],
    upper_root: BorrowedFd<'_>,
    owner: &Owner,
) -> Result<OwnedFd> {
    let mut dir = open_dir(upper_root, c".")?;
    for (lower_parent, name) in chain {
        dir = dir_up(*lower_parent, dir.as_fd(), name, owner, &nothing_first)?;
    }
    Ok(dir)
}

/// Copies the non-directory `name` of `lower_parent` (regular file,
/// symlink, FIFO, socket or device) to the same name in `upper_parent`
/// and returns an O_PATH descriptor of the copy. EEXIST if the upper name
/// exists, before or during the copy; EISDIR for a directory (use
/// [`copy_up_dir`]). On any error nothing new is left in `upper_parent`.
// Only the tests copy without a `BeforeVisible` step (the vfs always
// binds the copy first).
#[cfg(test)]
pub fn copy_up_file(
    lower_parent: BorrowedFd<'_>,
    name: &CStr,
    upper_parent: BorrowedFd<'_>,
    owner: &Owner,
) -> Result<OwnedFd> {
    copy_up_file_identified(
        lower_parent,
        name,
        upper_parent,
        owner,
        None,
        &nothing_first,
    )
}

/// [`copy_up_file`] with a [`BeforeVisible`] step; `keep`: for a change
/// that truncates the file to that many bytes, only those are copied (see
/// [`copy_up_file_truncated`]).
pub fn copy_up_file_identified(
    lower_parent: BorrowedFd<'_>,
    name: &CStr,
    upper_parent: BorrowedFd<'_>,
    owner: &Owner,
    keep: Option<u64>,
    before_visible: BeforeVisible<'_>,
) -> Result<OwnedFd> {
    Ok(file_up_as(
        lower_parent,
        name,
        (upper_parent, name),
        owner,
        How {
            len: keep,
            ..SYNCED
        },
        before_visible,
    )?)
}

/// A copy of regular file `name` of `lower_parent` (`keep`: only that
/// many bytes) in `upper_parent` with no name: for a change to a file
/// open while no name shows it any more (unlinked, renamed over), which
/// a native file system applies to the nameless file. Nothing to sync: it
/// ends with its last descriptor, after a crash too.
pub fn copy_up_file_unnamed(
    lower_parent: BorrowedFd<'_>,
    name: &CStr,
    upper_parent: BorrowedFd<'_>,
    owner: &Owner,
    keep: Option<u64>,
) -> Result<OwnedFd> {
    let lower = sys::open_path(lower_parent, name)?;
    let st = sys::fstat(lower.as_fd())?;
    if !is_kind(&st, libc::S_IFREG) {
        return Err(err(libc::EEXIST).into());
    }
    let src = open_for_read(lower.as_fd())?;
    let temp = TempFile::create(upper_parent, true)?;
    let size = u64::try_from(st.st_size).unwrap_or(0);
    let len = keep.unwrap_or(size);
    fill(src.as_fd(), temp.fd(), len.min(size), len, false)?;
    apply_meta(temp.fd(), lower.as_fd(), &st, owner)?;
    Ok(temp.unnamed()?)
}

/// [`copy_up_file`] under another name in another directory (a hard
/// link's index entry), with a [`BeforeVisible`] step.
pub fn copy_up_file_as(
    lower_parent: BorrowedFd<'_>,
    name: &CStr,
    (upper_dir, dest): (BorrowedFd<'_>, &CStr),
    owner: &Owner,
    before_visible: BeforeVisible<'_>,
) -> Result<OwnedFd> {
    Ok(file_up_as(
        lower_parent,
        name,
        (upper_dir, dest),
        owner,
        SYNCED,
        before_visible,
    )?)
}

/// Gives the copied-up file `fd` (an index entry) the name `name` in
/// `upper_parent`, whose times stay as they were (a copy-up is not a
/// change of the directory).
pub fn link_up(fd: BorrowedFd<'_>, upper_parent: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    let parent = ParentTimes::save(upper_parent)?;
    let linked = sys::link_fd(fd, upper_parent, name);
    parent.restore();
    Ok(linked?)
}

/// Makes `name` in `dir` a name of `fd` instead of what it named (a
/// link under a temporary name renamed over it), the directory's times
/// kept: the view does not change, only which file holds it.
pub fn replace_by_link(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    let parent = ParentTimes::save(dir)?;
    let tmp = temp_name();
    let r = sys::link_fd(fd, dir, &tmp).and_then(|()| {
        sys::renameat2(dir, &tmp, dir, name, 0).inspect_err(|_| {
            let _ = sys::unlinkat(dir, &tmp, 0);
        })
    });
    parent.restore();
    Ok(r?)
}

/// [`copy_up_file`] for a change that truncates the file to `len` bytes
/// (open with O_TRUNC: 0; truncate(2)): only the bytes that survive the
/// truncation are copied, so an O_TRUNC open of a large lower file costs
/// nothing. The copy has the lower's times; the caller then applies its
/// truncate as on any upper file, which sets mtime and ctime.
pub fn copy_up_file_truncated(
    lower_parent: BorrowedFd<'_>,
    name: &CStr,
    upper_parent: BorrowedFd<'_>,
    owner: &Owner,
    len: u64,
) -> Result<OwnedFd> {
    let how = How {
        tmpfile: true,
        sync: true,
        len: Some(len),
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
    /// The copy's length, if not the lower's.
    len: Option<u64>,
}

/// How copy-up copies a file for a change: crash-safe, whole.
const SYNCED: How = How {
    tmpfile: true,
    sync: true,
    len: None,
};

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
    before_visible: BeforeVisible<'_>,
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
        .and_then(|fd| {
            before_visible(fd.as_fd(), &sys::fstat(fd.as_fd())?)?;
            temp.publish(name, true).map(|()| fd)
        });
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
    file_up_as(
        lower_parent,
        name,
        (upper_parent, name),
        owner,
        how,
        &nothing_first,
    )
}

fn file_up_as(
    lower_parent: BorrowedFd<'_>,
    name: &CStr,
    (upper_parent, dest): (BorrowedFd<'_>, &CStr),
    owner: &Owner,
    how: How,
    before_visible: BeforeVisible<'_>,
) -> io::Result<OwnedFd> {
    let lower = sys::open_path(lower_parent, name)?;
    let st = sys::fstat(lower.as_fd())?;
    if is_kind(&st, libc::S_IFDIR) {
        return Err(err(libc::EISDIR));
    }
    match sys::fstatat(upper_parent, dest) {
        Ok(_) => return Err(err(libc::EEXIST)),
        Err(e) if errno(&e) == libc::ENOENT => {}
        Err(e) => return Err(e),
    }
    let parent = ParentTimes::save(upper_parent)?;
    let result = if is_kind(&st, libc::S_IFREG) {
        copy_regular(
            lower.as_fd(),
            &st,
            (upper_parent, dest),
            owner,
            how,
            before_visible,
        )
    } else {
        copy_special(
            lower.as_fd(),
            &st,
            (upper_parent, dest),
            owner,
            before_visible,
        )
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

/// Gives directory `to` the owner, xattrs (ACLs included, the union's
/// own marks not), mode and times of directory `from`: a snapshot's
/// fresh branch root takes the root the mount showed. Either may be an
/// `O_PATH` descriptor.
pub fn copy_dir_meta(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY;
    let from = sys::reopen(from, flags)?;
    let to = sys::reopen(to, flags)?;
    let st = sys::fstat(from.as_fd())?;
    sys::chown_fd(to.as_fd(), st.st_uid, st.st_gid)?;
    copy_xattrs(from.as_fd(), to.as_fd())?;
    sys::chmod_fd(to.as_fd(), st.st_mode & 0o7777)?;
    set_times(to.as_fd(), &st)
}

fn copy_xattrs(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    let xattrs = sys::xattrs_of(from)?;
    drop_inherited_acls(to, &xattrs)?;
    for (name, value) in xattrs {
        if is_overlay_xattr(&name) {
            continue;
        }
        let must_copy = name.starts_with(b"system.posix_acl_") || name.starts_with(b"security.");
        let name = CString::new(name).map_err(|_| err(libc::EINVAL))?;
        match sys::setxattr_fd(to, &name, &value, 0) {
            // An upper file system without that namespace (user xattrs on
            // an old tmpfs): as overlayfs, the copy goes without it, unless
            // it carries access control.
            Err(e) if errno(&e) == libc::EOPNOTSUPP && !must_copy => {
                tracing::debug!("copy-up: {name:?} not supported by the upper branch, left out");
            }
            r => r?,
        }
    }
    Ok(())
}

/// A default ACL on the upper parent gives the new object ACLs the lower
/// one does not have; the copy must have exactly the lower's.
pub fn drop_inherited_acls(to: BorrowedFd<'_>, lower: &[(Vec<u8>, Vec<u8>)]) -> io::Result<()> {
    drop_inherited_acls_with(lower, |acl| sys::removexattr_fd(to, acl))
}

/// [`drop_inherited_acls`] through `remove` (an open descriptor's
/// `fremovexattr`, say).
pub fn drop_inherited_acls_with(
    lower: &[(Vec<u8>, Vec<u8>)],
    remove: impl Fn(&CStr) -> io::Result<()>,
) -> io::Result<()> {
    for acl in [c"system.posix_acl_access", c"system.posix_acl_default"] {
        if lower.iter().any(|(n, _)| n.as_slice() == acl.to_bytes()) {
            continue;
        }
        match remove(acl) {
            Err(e) if ![libc::ENODATA, libc::EOPNOTSUPP].contains(&errno(&e)) => return Err(e),
            _ => {}
        }
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
    (dir, name): (BorrowedFd<'_>, &CStr),
    owner: &Owner,
    before_visible: BeforeVisible<'_>,
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
    before_visible(fd.as_fd(), &sys::fstat(fd.as_fd())?)?;
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

    /// Keeps the file nameless (a hidden name goes): an O_PATH
    /// descriptor of it, which is all there is of it.
    fn unnamed(self) -> io::Result<OwnedFd> {
        sys::reopen(self.fd(), libc::O_PATH)
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
    (dir, name): (BorrowedFd<'_>, &CStr),
    owner: &Owner,
    how: How,
    before_visible: BeforeVisible<'_>,
) -> io::Result<OwnedFd> {
    let src = open_for_read(lower)?;
    refuse_metacopy(src.as_fd(), name)?;
    // An append-only or immutable file refuses a truncation (the copy
    // would be the truncated file, visible); otherwise its copy takes its
    // flags, so the change is refused by the copy as natively (EPERM).
    // Only root may set them.
    let flags = sys::carried_inode_flags(src.as_fd())?;
    if flags & sys::PROTECTING_INODE_FLAGS != 0 && (how.len.is_some() || sys::geteuid() != 0) {
        return Err(err(libc::EPERM));
    }
    let temp = TempFile::create(dir, how.tmpfile)?;
    let size = u64::try_from(st.st_size).unwrap_or(0);
    let len = how.len.unwrap_or(size);
    let cloned = fill(src.as_fd(), temp.fd(), len.min(size), len, how.sync)?;
    if how.sync && !cloned && len.min(size) > 0 {
        sys::fsync(temp.fd(), true)?;
    }
    apply_meta(temp.fd(), lower, st, owner)?;
    if how.len.is_none() {
        carry_clone_mark(lower, temp.fd())?;
    }
    before_visible(temp.fd(), &sys::fstat(temp.fd())?)?;
    let copy = temp.publish(dir, name)?;
    // Only once it has its name: such a file cannot be linked or renamed.
    if flags != 0 {
        let set = sys::reopen(copy.as_fd(), libc::O_RDONLY | libc::O_NOFOLLOW)
            .and_then(|fd| sys::add_inode_flags(fd.as_fd(), flags));
        if let Err(e) = set {
            tracing::warn!("copy-up: the copy of {name:?} lacks its inode flags {flags:#x}: {e}");
        }
    }
    Ok(copy)
}

/// An overlayfs metacopy file holds none of its bytes (a hole of its
/// size): its copy would make those zeros its data for good. Either
/// namespace: copy-up is not told the union's, and a file marked in
/// either has no bytes of its own.
fn refuse_metacopy(src: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    for ns in [
        super::format::XattrNs::Trusted,
        super::format::XattrNs::User,
    ] {
        if super::format::is_metacopy(src, ns)? {
            tracing::warn!(
                "copy-up of {name:?} refused (EIO): an overlayfs metacopy file, its data in a lower layer chronofs does not follow"
            );
            return Err(err(libc::EIO));
        }
    }
    Ok(())
}

/// A clone's file keeps its shared bytes in history, and its backing
/// file holds only the blocks it owns (holes elsewhere), which the copy
/// kept as they were: with its mark the copy is the same clone's file, at
/// the cost of the blocks it owns (without it, the holes would read as
/// zeros; materialising it in the read-only branch first wrote that
/// branch and copied the whole file). A copy that truncates has no mark
/// to carry: its surviving bytes are not all there.
fn carry_clone_mark(lower: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    for ns in [
        super::format::XattrNs::Trusted,
        super::format::XattrNs::User,
    ] {
        if let Some(mark) = super::format::read_clone_mark(lower, ns)? {
            sys::setxattr_fd(to, ns.clone_mark(), &mark, 0)?;
        }
    }
    Ok(())
}

/// Reading must not change the lower atime (the branch is read-only to
/// us): O_NOATIME, which needs ownership or CAP_FOWNER, when allowed.
fn open_for_read(lower: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    match sys::reopen(lower, libc::O_RDONLY | libc::O_NOATIME) {
        Err(e) if errno(&e) == libc::EPERM => sys::reopen(lower, libc::O_RDONLY),
        other => other,
    }
}

/// Makes the empty `dst` a file of `len` bytes, the first `data` of them
/// `src`'s, the rest a hole; true if by a clone. With `sync`, copied data
/// starts on its way to the disk as it goes (see [`copy_range`]).
fn fill(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    data: u64,
    len: u64,
    sync: bool,
) -> io::Result<bool> {
    let cloned = match sys::ficlone(dst, src) {
        Ok(()) => true,
        Err(e) if !cannot_clone(&e) => return Err(e),
        Err(_) => false,
    };
    // Setting the length first leaves every range not copied below a hole
    // (and cuts a clone to length).
    sys::ftruncate(dst, len)?;
    if !cloned {
        for (offset, n) in sys::data_ranges(src, data)? {
            copy_range(src, dst, offset, n, sync)?;
        }
    }
    Ok(cloned)
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

/// How much is copied before its write-back is started.
const WRITEBACK_CHUNK: u64 = 8 << 20;

/// Copies one range a chunk at a time. With `sync`, each chunk's
/// write-back starts once it is copied, so the disk writes overlap the
/// copying instead of all waiting for the fdatasync before the link (as
/// `cp` + `sync` wait for theirs). Measured with 1 GiB on ext4 on a loop
/// device: the fdatasync after the copy fell from 0.41-0.51 s to
/// 0.19-0.22 s; a copy-up + sync through the mount from 1.06-1.07× to
/// 0.87-0.98× `cp` + `sync` (medians of 5 and 6 interleaved rounds).
fn copy_range(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    offset: u64,
    len: u64,
    sync: bool,
) -> io::Result<()> {
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let want = (end - at).min(WRITEBACK_CHUNK);
        let n = copy_chunk(src, dst, at, want)?;
        if sync && n > 0 {
            // Only a head start: the fdatasync after the copy is what
            // makes the data durable and reports any write error.
            let _ = sys::start_writeback(dst, at, n);
        }
        if n < want {
            // The source ended early: it shrank since it was measured.
            return Ok(());
        }
        at += n;
    }
    Ok(())
}

/// copy_file_range over one chunk; plain reads and writes when the two
/// file systems refuse it (EXDEV across some pairs, EINVAL/EOPNOTSUPP on
/// a few file systems). Returns the bytes copied, fewer at the source's
/// end.
fn copy_chunk(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<u64> {
    let mut done = 0;
    while done < len {
        let at = offset + done;
        match sys::copy_file_range(src, at, dst, at, len - done) {
            Ok(0) => break,
            Ok(n) => done += n as u64,
            Err(e) if errno(&e) == libc::EINTR => {}
            Err(e) if cannot_clone(&e) => return Ok(done + rw_copy(src, dst, at, len - done)?),
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn rw_copy(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<u64> {
    let mut buf = vec![0u8; (1 << 20).min(len as usize)];
    let mut done = 0;
    while done < len {
        let want = buf.len().min((len - done) as usize);
        let n = sys::pread(src, &mut buf[..want], offset + done)?;
        if n == 0 {
            break;
        }
        write_all(dst, &buf[..n], offset + done)?;
        done += n as u64;
    }
    Ok(done)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::time::Instant;

    const KEEP: Owner = Owner::Keep;

    fn c(p: &Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    fn dirfd(p: &Path) -> OwnedFd {
        open_dir(sys::CWD, &c(p)).unwrap()
    }

    fn stat(p: &Path) -> Stat {
        sys::fstatat(sys::CWD, &c(p)).unwrap()
    }

    fn is_root() -> bool {
        sys::geteuid() == 0
    }

    fn names(p: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A lower and an upper directory, with O_PATH descriptors.
    struct Pair {
        _tmp: tempfile::TempDir,
        l: PathBuf,
        u: PathBuf,
        lfd: OwnedFd,
        ufd: OwnedFd,
    }

    fn pair_in(base: &Path) -> Pair {
        let tmp = tempfile::tempdir_in(base).unwrap();
        let (l, u) = (tmp.path().join("lower"), tmp.path().join("upper"));
        std::fs::create_dir(&l).unwrap();
        std::fs::create_dir(&u).unwrap();
        let (lfd, ufd) = (dirfd(&l), dirfd(&u));
        Pair {
            _tmp: tmp,
            l,
            u,
            lfd,
            ufd,
        }
    }

    fn pair() -> Pair {
        pair_in(&std::env::temp_dir())
    }

    /// Times with nanoseconds, atime after mtime and recent, so relatime
    /// leaves the lower atime alone while it is read.
    fn set_odd_times(p: &Path, salt: i64) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        let atime = now - 1_000_000_000_000 + 123_456_789 + salt;
        let mtime = 1_500_000_000_000_000_000 + 987_654_321 + salt;
        sys::set_times(p, atime, mtime).unwrap();
    }

    fn assert_same_meta(lower: &Stat, upper: &Stat) {
        assert_eq!(upper.st_mode, lower.st_mode, "mode");
        assert_eq!((upper.st_uid, upper.st_gid), (lower.st_uid, lower.st_gid));
        assert_eq!(upper.st_rdev, lower.st_rdev, "rdev");
        assert_eq!(upper.st_size, lower.st_size, "size");
        assert_eq!(
            (upper.st_atime, upper.st_atime_nsec),
            (lower.st_atime, lower.st_atime_nsec),
            "atime"
        );
        assert_eq!(
            (upper.st_mtime, upper.st_mtime_nsec),
            (lower.st_mtime, lower.st_mtime_nsec),
            "mtime"
        );
    }

    fn errno_of<T>(r: Result<T>) -> i32 {
        match r {
            Ok(_) => 0,
            Err(e) => e.errno(),
        }
    }

    /// The step before a copy takes its name sees it nameless and can mark
    /// it; a failing step leaves nothing (an index entry is whole before
    /// anyone can find it by name).
    #[test]
    fn a_copy_is_marked_before_it_takes_its_name() {
        let p = pair();
        std::fs::write(p.l.join("f"), b"data").unwrap();
        let mark = |fd: BorrowedFd<'_>, _: &Stat| -> io::Result<()> {
            assert!(!p.u.join("entry").exists(), "named before its step");
            sys::setxattr_fd(fd, c"user.mark", b"whole", 0)
        };
        let at = (p.ufd.as_fd(), c"entry");
        copy_up_file_as(p.lfd.as_fd(), c"f", at, &KEEP, &mark).unwrap();
        let mut buf = [0u8; 16];
        let fd = sys::open_path(p.ufd.as_fd(), c"entry").unwrap();
        let n = sys::getxattr_fd(fd.as_fd(), c"user.mark", &mut buf).unwrap();
        assert_eq!(&buf[..n], b"whole");
        let refuse = |_: BorrowedFd<'_>, _: &Stat| -> io::Result<()> { Err(err(libc::EIO)) };
        let at = (p.ufd.as_fd(), c"other");
        assert!(copy_up_file_as(p.lfd.as_fd(), c"f", at, &KEEP, &refuse).is_err());
        let left: Vec<_> = std::fs::read_dir(&p.u)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["entry"], "a refused copy left something");
    }

    #[test]
    fn owner_option_parses_and_prints() {
        for s in ["keep", "caller", "fixed:1000:100:4755", "fixed:0:0:0"] {
            let o = OwnerOption::parse(s).unwrap();
            assert_eq!(o.to_string(), s);
        }
        assert_eq!(
            OwnerOption::parse("fixed:1:2:0644"),
            Ok(OwnerOption::Fixed {
                uid: 1,
                gid: 2,
                mode: 0o644
            })
        );
        for bad in [
            "",
            "Keep",
            "fixed",
            "fixed:1:2",
            "fixed:1:2:644:9",
            "fixed:a:2:644",
            "fixed:1:-2:644",
            "fixed:4294967295:0:644",
            "fixed:1:2:999",
            "fixed:1:2:17777",
            "fixed:1:2:",
        ] {
            let e = OwnerOption::parse(bad).unwrap_err();
            assert!(e.starts_with("copyup-owner: ") && !e.contains('\n'), "{e}");
        }
        assert_eq!(
            OwnerOption::Caller.resolve(5, 6),
            Owner::Caller { uid: 5, gid: 6 }
        );
        assert_eq!(OwnerOption::Keep.resolve(5, 6), Owner::Keep);
    }

    /// This process's temporaries are work under way; any other is a
    /// crash's (names from before the mark included).
    #[test]
    fn only_other_processes_temporaries_are_orphans() {
        let mine = temp_name();
        assert!(is_copyup_temp(mine.as_bytes()));
        assert!(!super::super::format::is_orphan(mine.as_bytes()));
        let token = format!("{:08x}", super::super::format::process_token());
        let other = if token == "00000000" {
            "00000001"
        } else {
            "00000000"
        };
        let theirs = format!(".chronofs-copyup.{other}89abcdef");
        assert!(super::super::format::is_orphan(theirs.as_bytes()));
        assert!(super::super::format::is_orphan(b".chronofs-wh.4242.7"));
        let own_wh = format!(".chronofs-wh.{token}.7");
        assert!(!super::super::format::is_orphan(own_wh.as_bytes()));
        assert!(!super::super::format::is_orphan(b"plain-name"));
        assert!(!super::super::format::is_orphan(b".chronofs-copyup.short"));
    }

    #[test]
    fn temp_names_are_recognised() {
        let n = temp_name();
        assert!(is_copyup_temp(n.as_bytes()), "{n:?}");
        assert_ne!(temp_name(), n);
        for other in [
            &b".chronofs-copyup."[..],
            b".chronofs-copyup.0123456789abcdeg",
            b".chronofs-copyup.0123456789abcdef0",
            b"chronofs-copyup.0123456789abcdef",
            b"file",
        ] {
            assert!(!is_copyup_temp(other));
        }
    }

    /// Every non-directory kind, under Keep: same type, content or target,
    /// device number, owner, mode (set-user-ID too) and nanosecond times.
    #[test]
    fn every_kind_is_copied_with_its_metadata() {
        let p = pair();
        let root = is_root();
        std::fs::write(p.l.join("reg"), b"hello, lower").unwrap();
        std::os::unix::fs::symlink("../some/target", p.l.join("lnk")).unwrap();
        let mut made = vec!["reg", "lnk"];
        let mut nodes = vec![("fifo", libc::S_IFIFO, 0), ("sock", libc::S_IFSOCK, 0)];
        if root {
            nodes.push(("chr", libc::S_IFCHR, libc::makedev(1, 3)));
            nodes.push(("blk", libc::S_IFBLK, libc::makedev(7, 200)));
        }
        for (n, kind, rdev) in &nodes {
            sys::mknodat(p.lfd.as_fd(), &c(Path::new(n)), kind | 0o640, *rdev).unwrap();
            made.push(n);
        }
        if root {
            sys::chmod_fd(
                sys::open_path(p.lfd.as_fd(), c"reg").unwrap().as_fd(),
                0o4755,
            )
            .unwrap();
            for (i, n) in made.iter().enumerate() {
                let fd = sys::open_path(p.lfd.as_fd(), &c(Path::new(n))).unwrap();
                sys::chown_fd(fd.as_fd(), 1000 + i as u32, 2000 + i as u32).unwrap();
            }
        }
        for (i, n) in made.iter().enumerate() {
            set_odd_times(&p.l.join(n), i as i64);
        }
        for n in &made {
            let before = stat(&p.l.join(n));
            let fd = copy_up_file(p.lfd.as_fd(), &c(Path::new(n)), p.ufd.as_fd(), &KEEP).unwrap();
            let up = stat(&p.u.join(n));
            assert_same_meta(&before, &up);
            assert_eq!(sys::fstat(fd.as_fd()).unwrap().st_ino, up.st_ino, "{n}");
        }
        assert_eq!(std::fs::read(p.u.join("reg")).unwrap(), b"hello, lower");
        let target = std::fs::read_link(p.u.join("lnk")).unwrap();
        assert_eq!(target, Path::new("../some/target"));
        let mut want: Vec<String> = made.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(names(&p.u), want, "no temporary left behind");
        assert_eq!(names(&p.l).len(), made.len(), "lower unchanged");
    }

    #[test]
    fn xattrs_are_copied_but_not_overlays() {
        let p = pair();
        std::fs::write(p.l.join("f"), b"x").unwrap();
        let lf = sys::open_path(p.lfd.as_fd(), c"f").unwrap();
        let mut set = vec![("user.a", &b"one"[..]), ("user.overlay.origin", b"o")];
        if is_root() {
            set.push(("trusted.t", b"two"));
            set.push(("trusted.overlay.opaque", b"y"));
            set.push(("security.chronofs", b"three"));
        }
        for (n, v) in &set {
            if let Err(e) = sys::setxattr_fd(lf.as_fd(), &c(Path::new(n)), v, 0) {
                eprintln!("skipped: {n} not supported here ({e})");
                return;
            }
        }
        let fd = copy_up_file(p.lfd.as_fd(), c"f", p.ufd.as_fd(), &KEEP).unwrap();
        let got = sys::xattrs_of(fd.as_fd()).unwrap();
        let mut want: Vec<(Vec<u8>, Vec<u8>)> = set
            .iter()
            .filter(|(n, _)| !n.contains(".overlay."))
            .map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec()))
            .collect();
        want.sort();
        let got: Vec<_> = got
            .into_iter()
            .filter(|(n, _)| n != b"security.selinux")
            .collect();
        assert_eq!(got, want);
    }

    /// trusted.* xattrs (root only) on a symlink, a FIFO and a directory,
    /// read and written through /proc without following the symlink.
    #[test]
    fn xattrs_of_other_kinds_are_copied() {
        if !is_root() {
            eprintln!("skipped: trusted.* xattrs need root");
            return;
        }
        let p = pair();
        std::os::unix::fs::symlink("target", p.l.join("lnk")).unwrap();
        std::fs::write(p.l.join("target"), b"").unwrap();
        sys::mknodat(p.lfd.as_fd(), c"fifo", libc::S_IFIFO | 0o600, 0).unwrap();
        std::fs::create_dir(p.l.join("dir")).unwrap();
        for n in [c"lnk", c"fifo", c"dir"] {
            let fd = sys::open_path(p.lfd.as_fd(), n).unwrap();
            sys::setxattr_fd(fd.as_fd(), c"trusted.k", n.to_bytes(), 0).unwrap();
            sys::setxattr_fd(fd.as_fd(), c"trusted.overlay.opaque", b"y", 0).unwrap();
        }
        let dir = copy_up_dir(p.lfd.as_fd(), p.ufd.as_fd(), c"dir", &KEEP).unwrap();
        let lnk = copy_up_file(p.lfd.as_fd(), c"lnk", p.ufd.as_fd(), &KEEP).unwrap();
        let fifo = copy_up_file(p.lfd.as_fd(), c"fifo", p.ufd.as_fd(), &KEEP).unwrap();
        for (fd, n) in [(dir, "dir"), (lnk, "lnk"), (fifo, "fifo")] {
            let got = sys::xattrs_of(fd.as_fd()).unwrap();
            let want = vec![(b"trusted.k".to_vec(), n.as_bytes().to_vec())];
            assert_eq!(got, want, "{n}");
        }
        assert!(
            names(&p.u).iter().all(|n| n != "target"),
            "symlink not followed"
        );
    }

    /// A default ACL on the upper parent is not inherited by the copies:
    /// they carry the lower's ACLs (here none, and one) and nothing else.
    #[test]
    fn acls_are_the_lower_ones_not_inherited() {
        let p = pair();
        let setfacl = |args: &[&str], path: &Path| {
            run(Command::new("setfacl").args(args).arg(path)).is_some()
        };
        if !setfacl(&["-d", "-m", "u:1234:rwx"], &p.u) {
            eprintln!("skipped: no setfacl or no ACL support");
            return;
        }
        std::fs::write(p.l.join("plain"), b"").unwrap();
        std::fs::write(p.l.join("acl"), b"").unwrap();
        std::fs::create_dir(p.l.join("dir")).unwrap();
        assert!(setfacl(&["-m", "u:4321:r"], &p.l.join("acl")));
        copy_up_file(p.lfd.as_fd(), c"plain", p.ufd.as_fd(), &KEEP).unwrap();
        copy_up_file(p.lfd.as_fd(), c"acl", p.ufd.as_fd(), &KEEP).unwrap();
        copy_up_dir(p.lfd.as_fd(), p.ufd.as_fd(), c"dir", &KEEP).unwrap();
        for n in ["plain", "acl", "dir"] {
            let fd = sys::open_path(p.ufd.as_fd(), &c(Path::new(n))).unwrap();
            let lfd = sys::open_path(p.lfd.as_fd(), &c(Path::new(n))).unwrap();
            let acls = |fd: &OwnedFd| -> Vec<_> {
                let all = sys::xattrs_of(fd.as_fd()).unwrap();
                all.into_iter()
                    .filter(|(n, _)| n.starts_with(b"system.posix_acl"))
                    .collect()
            };
            assert_eq!(acls(&fd), acls(&lfd), "{n}");
            assert_eq!(
                stat(&p.u.join(n)).st_mode,
                stat(&p.l.join(n)).st_mode,
                "{n}"
            );
        }
    }

    /// chown drops set-user-ID and security.capability: both survive.
    #[test]
    fn privileges_survive_the_chown() {
        if !is_root() {
            eprintln!("skipped: needs root to chown and set capabilities");
            return;
        }
        let p = pair();
        std::fs::write(p.l.join("f"), b"#!/bin/true\n").unwrap();
        let lf = sys::open_path(p.lfd.as_fd(), c"f").unwrap();
        // vfs_cap_data revision 2, CAP_NET_RAW permitted + effective.
        let caps: Vec<u8> = [0x0200_0001u32, 1 << 13, 0, 0, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        sys::chown_fd(lf.as_fd(), 1234, 5678).unwrap();
        sys::setxattr_fd(lf.as_fd(), c"security.capability", &caps, 0).unwrap();
        sys::chmod_fd(lf.as_fd(), 0o6755).unwrap();
        let fd = copy_up_file(p.lfd.as_fd(), c"f", p.ufd.as_fd(), &KEEP).unwrap();
        let st = sys::fstat(fd.as_fd()).unwrap();
        assert_eq!(st.st_mode & 0o7777, 0o6755);
        assert_eq!((st.st_uid, st.st_gid), (1234, 5678));
        let xattrs = sys::xattrs_of(fd.as_fd()).unwrap();
        assert!(xattrs.contains(&(b"security.capability".to_vec(), caps)));
    }

    #[test]
    fn owner_modes_apply_to_the_copy() {
        if !is_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        let p = pair();
        std::fs::write(p.l.join("f"), b"x").unwrap();
        std::fs::create_dir(p.l.join("d")).unwrap();
        for n in [c"f", c"d"] {
            let fd = sys::open_path(p.lfd.as_fd(), n).unwrap();
            sys::chown_fd(fd.as_fd(), 10, 20).unwrap();
            sys::chmod_fd(fd.as_fd(), 0o2751).unwrap();
        }
        let fixed = Owner::Fixed {
            uid: 42,
            gid: 43,
            mode: 0o640,
        };
        let f = copy_up_file(p.lfd.as_fd(), c"f", p.ufd.as_fd(), &fixed).unwrap();
        let st = sys::fstat(f.as_fd()).unwrap();
        assert_eq!((st.st_uid, st.st_gid, st.st_mode & 0o7777), (42, 43, 0o640));
        let d = copy_up_dir(p.lfd.as_fd(), p.ufd.as_fd(), c"d", &fixed).unwrap();
        let st = sys::fstat(d.as_fd()).unwrap();
        assert_eq!((st.st_uid, st.st_gid, st.st_mode & 0o7777), (42, 43, 0o750));
        std::fs::remove_file(p.u.join("f")).unwrap();
        let caller = OwnerOption::Caller.resolve(7, 8);
        let f = copy_up_file(p.lfd.as_fd(), c"f", p.ufd.as_fd(), &caller).unwrap();
        let st = sys::fstat(f.as_fd()).unwrap();
        assert_eq!((st.st_uid, st.st_gid, st.st_mode & 0o7777), (7, 8, 0o2751));
    }

    fn write_at(path: &Path, at: u64, data: &[u8]) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap();
        f.write_all_at(data, at).unwrap();
    }

    fn ranges(p: &Path) -> Vec<(u64, u64)> {
        let f = std::fs::File::open(p).unwrap();
        let size = f.metadata().unwrap().len();
        sys::data_ranges(f.as_fd(), size).unwrap()
    }

    #[test]
    fn sparse_file_keeps_its_holes() {
        let p = pair();
        let lp = p.l.join("sparse");
        write_at(&lp, 0, &[1u8; 65536]);
        write_at(&lp, 32 << 20, &[2u8; 65536]);
        write_at(&lp, (64 << 20) - 1, &[3u8]);
        let before = stat(&lp);
        copy_up_file(p.lfd.as_fd(), c"sparse", p.ufd.as_fd(), &KEEP).unwrap();
        let up = p.u.join("sparse");
        assert_same_meta(&before, &stat(&up));
        assert_eq!(ranges(&up), ranges(&lp));
        assert!(stat(&up).st_blocks <= before.st_blocks, "no hole filled");
        assert!(stat(&up).st_blocks < 1024, "64 MiB mostly holes");
        assert_eq!(std::fs::read(&up).unwrap(), std::fs::read(&lp).unwrap());
    }

    fn pattern(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn large_file_is_copied_exactly() {
        let p = pair();
        let data = pattern(96 << 20, 7);
        std::fs::write(p.l.join("big"), &data).unwrap();
        let fd = copy_up_file(p.lfd.as_fd(), c"big", p.ufd.as_fd(), &KEEP).unwrap();
        assert_eq!(sys::fstat(fd.as_fd()).unwrap().st_size, data.len() as i64);
        let got = std::fs::read(p.u.join("big")).unwrap();
        assert!(blake3::hash(&got) == blake3::hash(&data));
    }

    /// A truncating copy-up copies only what survives: nothing for
    /// O_TRUNC, a prefix when shrinking, the whole file and a hole when
    /// growing; the times are still the lower's.
    #[test]
    fn truncating_copy_up_copies_only_what_survives() {
        let data = pattern(8 << 20, 11);
        for (i, len) in [0u64, 1000, (8 << 20) + 5000].into_iter().enumerate() {
            let p = pair();
            std::fs::write(p.l.join("f"), &data).unwrap();
            set_odd_times(&p.l.join("f"), i as i64);
            let before = stat(&p.l.join("f"));
            let fd =
                copy_up_file_truncated(p.lfd.as_fd(), c"f", p.ufd.as_fd(), &KEEP, len).unwrap();
            let st = sys::fstat(fd.as_fd()).unwrap();
            assert_eq!(st.st_size as u64, len);
            assert_eq!(
                (st.st_mtime, st.st_mtime_nsec),
                (before.st_mtime, before.st_mtime_nsec)
            );
            let got = std::fs::read(p.u.join("f")).unwrap();
            let keep = (len as usize).min(data.len());
            assert!(got[..keep] == data[..keep] && got[keep..].iter().all(|b| *b == 0));
            assert!(
                st.st_blocks as u64 * 512 <= len + (64 << 10),
                "only the survivors"
            );
            assert_eq!(
                std::fs::read(p.l.join("f")).unwrap(),
                data,
                "lower untouched"
            );
        }
    }

    #[test]
    fn named_temporary_is_used_without_tmpfile() {
        let p = pair();
        std::fs::write(p.l.join("f"), pattern(300_000, 3)).unwrap();
        set_odd_times(&p.l.join("f"), 0);
        let before = stat(&p.l.join("f"));
        let how = How {
            tmpfile: false,
            sync: true,
            len: None,
        };
        let fd = file_up(p.lfd.as_fd(), c"f", p.ufd.as_fd(), &KEEP, how).unwrap();
        assert_same_meta(&before, &sys::fstat(fd.as_fd()).unwrap());
        assert_eq!(names(&p.u), ["f"]);
        assert_eq!(std::fs::read(p.u.join("f")).unwrap(), pattern(300_000, 3));
    }

    #[test]
    fn an_existing_upper_name_is_eexist_and_untouched() {
        let p = pair();
        std::fs::write(p.l.join("f"), b"lower").unwrap();
        std::fs::write(p.u.join("f"), b"upper").unwrap();
        let r = copy_up_file(p.lfd.as_fd(), c"f", p.ufd.as_fd(), &KEEP);
        assert_eq!(errno_of(r), libc::EEXIST);
        assert_eq!(std::fs::read(p.u.join("f")).unwrap(), b"upper");
        assert_eq!(names(&p.u), ["f"]);
    }

    /// The name appearing between the check and the link: EEXIST at the
    /// link, the other file kept, no temporary left.
    #[test]
    fn a_name_appearing_during_the_copy_is_not_clobbered() {
        for tmpfile in [true, false] {
            let p = pair();
            let temp = TempFile::create(p.ufd.as_fd(), tmpfile).unwrap();
            std::fs::write(p.u.join("f"), b"theirs").unwrap();
            let r = temp.publish(p.ufd.as_fd(), c"f");
            assert_eq!(r.err().and_then(|e| e.raw_os_error()), Some(libc::EEXIST));
            assert_eq!(std::fs::read(p.u.join("f")).unwrap(), b"theirs");
            assert_eq!(names(&p.u), ["f"]);
        }
        let p = pair();
        std::fs::create_dir(p.l.join("d")).unwrap();
        let r = file_up(
            p.lfd.as_fd(),
            c"d",
            p.ufd.as_fd(),
            &KEEP,
            How {
                tmpfile: true,
                sync: true,
                len: None,
            },
        );
        assert_eq!(r.err().and_then(|e| e.raw_os_error()), Some(libc::EISDIR));
    }

    fn mkdir_with(path: &Path, mode: u32, uid: u32, salt: i64) {
        std::fs::create_dir(path).unwrap();
        let fd = dirfd(path);
        sys::chmod_fd(fd.as_fd(), mode).unwrap();
        if is_root() {
            sys::chown_fd(fd.as_fd(), uid, uid + 100).unwrap();
        }
        set_odd_times(path, salt);
    }

    /// Only missing parents are made, each with the lower's mode, owner
    /// and times, which creating its child does not change; the existing
    /// upper directory keeps its own.
    #[test]
    fn copy_up_parents_makes_only_the_missing_ones() {
        let p = pair();
        mkdir_with(&p.l.join("a"), 0o751, 11, 1);
        mkdir_with(&p.l.join("a/b"), 0o705, 12, 2);
        mkdir_with(&p.l.join("a/b/c"), 0o1777, 13, 3);
        std::fs::write(p.l.join("a/b/c/f"), b"f").unwrap();
        mkdir_with(&p.u.join("a"), 0o777, 1, 4);
        std::fs::write(p.u.join("a/mine"), b"m").unwrap();
        set_odd_times(&p.u.join("a"), 4);
        let upper_a = stat(&p.u.join("a"));
        let lower: Vec<Stat> = ["a", "a/b", "a/b/c"].map(|d| stat(&p.l.join(d))).into();
        let (la, lab) = (dirfd(&p.l.join("a")), dirfd(&p.l.join("a/b")));
        let chain = [
            (p.lfd.as_fd(), c"a"),
            (la.as_fd(), c"b"),
            (lab.as_fd(), c"c"),
        ];
        let deepest = copy_up_parents(&chain, p.ufd.as_fd(), &KEEP).unwrap();
        let c_up = stat(&p.u.join("a/b/c"));
        assert_eq!(sys::fstat(deepest.as_fd()).unwrap().st_ino, c_up.st_ino);
        assert_same_meta(&upper_a, &stat(&p.u.join("a")));
        assert_same_meta(&lower[1], &stat(&p.u.join("a/b")));
        assert_same_meta(&lower[2], &c_up);
        assert_eq!(names(&p.u.join("a")), ["b", "mine"]);
        // Again: everything exists, nothing changes.
        let again = copy_up_parents(&chain, p.ufd.as_fd(), &KEEP).unwrap();
        assert_eq!(sys::fstat(again.as_fd()).unwrap().st_ino, c_up.st_ino);
        assert_same_meta(&lower[1], &stat(&p.u.join("a/b")));
        // A file copied into a just-copied parent keeps the parent's times.
        let cfd = dirfd(&p.l.join("a/b/c"));
        copy_up_file(cfd.as_fd(), c"f", deepest.as_fd(), &KEEP).unwrap();
        assert_same_meta(&lower[2], &stat(&p.u.join("a/b/c")));
        assert_eq!(names(&p.u.join("a/b/c")), ["f"], "no other contents copied");
        let root = copy_up_parents(&[], p.ufd.as_fd(), &KEEP).unwrap();
        assert_eq!(sys::fstat(root.as_fd()).unwrap().st_ino, stat(&p.u).st_ino);
    }

    #[test]
    fn copy_up_dir_over_a_file_is_enotdir() {
        let p = pair();
        std::fs::create_dir(p.l.join("d")).unwrap();
        std::fs::write(p.u.join("d"), b"").unwrap();
        let r = copy_up_dir(p.lfd.as_fd(), p.ufd.as_fd(), c"d", &KEEP);
        assert_eq!(errno_of(r), libc::ENOTDIR);
        assert_eq!(names(&p.u), ["d"]);
    }

    /// A file system mounted for one test; unmounted (and its loop device
    /// detached) on drop.
    struct Mount {
        _tmp: tempfile::TempDir,
        mnt: PathBuf,
        dev: Option<String>,
    }

    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.mnt).status();
            if let Some(dev) = &self.dev {
                let _ = Command::new("losetup").args(["-d", dev]).status();
            }
        }
    }

    fn run(cmd: &mut Command) -> Option<String> {
        let out = cmd.output().ok()?;
        if !out.status.success() {
            eprintln!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
            return None;
        }
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn mount_tmpfs(opts: &str) -> Option<Mount> {
        if !is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        let tmp = tempfile::tempdir().ok()?;
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).ok()?;
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(&mnt))?;
        Some(Mount {
            _tmp: tmp,
            mnt,
            dev: None,
        })
    }

    fn mount_btrfs() -> Option<Mount> {
        if !is_root() || run(Command::new("sh").args(["-c", "command -v mkfs.btrfs"])).is_none() {
            eprintln!("skipped: needs root and mkfs.btrfs");
            return None;
        }
        let tmp = tempfile::tempdir_in("/var/tmp").ok()?;
        let (img, mnt) = (tmp.path().join("img"), tmp.path().join("mnt"));
        std::fs::create_dir(&mnt).ok()?;
        std::fs::File::create(&img).ok()?.set_len(512 << 20).ok()?;
        let dev = run(Command::new("losetup").args(["--find", "--show"]).arg(&img))?;
        let mut m = Mount {
            _tmp: tmp,
            mnt,
            dev: Some(dev.clone()),
        };
        run(Command::new("mkfs.btrfs").args(["-q", &dev]))?;
        if run(Command::new("mount").arg(&dev).arg(&m.mnt)).is_none() {
            // Only the loop device to undo: umount of nothing is harmless.
            m.mnt = PathBuf::new();
            return None;
        }
        Some(m)
    }

    fn free_blocks(p: &Path) -> u64 {
        sys::fstatvfs(dirfd(p).as_fd()).unwrap().f_bfree
    }

    /// A full upper file system fails the copy with ENOSPC and leaves no
    /// trace: no name, no temporary, no space held.
    #[test]
    fn enospc_leaves_nothing_behind() {
        let Some(m) = mount_tmpfs("size=1m") else {
            return;
        };
        let p = pair();
        std::fs::write(p.l.join("big"), pattern(4 << 20, 1)).unwrap();
        std::fs::write(p.l.join("small"), b"fits").unwrap();
        let ufd = dirfd(&m.mnt);
        let free = free_blocks(&m.mnt);
        for tmpfile in [true, false] {
            let how = How {
                tmpfile,
                sync: true,
                len: None,
            };
            let r = file_up(p.lfd.as_fd(), c"big", ufd.as_fd(), &KEEP, how);
            assert_eq!(r.err().and_then(|e| e.raw_os_error()), Some(libc::ENOSPC));
            assert!(names(&m.mnt).is_empty(), "{:?}", names(&m.mnt));
            assert_eq!(free_blocks(&m.mnt), free, "space given back");
        }
        copy_up_file(p.lfd.as_fd(), c"small", ufd.as_fd(), &KEEP).unwrap();
        assert_eq!(names(&m.mnt), ["small"]);
    }

    /// Failures after the object is made (its xattrs overflow the upper
    /// tmpfs's inode space) leave nothing behind, for directories and for
    /// both kinds of temporary file (user xattrs exist on nothing else).
    #[test]
    fn a_failure_after_creation_leaves_nothing_behind() {
        let Some(m) = mount_tmpfs("size=1m,nr_inodes=4") else {
            return;
        };
        let p = pair();
        std::fs::create_dir(p.l.join("d")).unwrap();
        std::fs::write(p.l.join("f"), b"data").unwrap();
        for n in [c"d", c"f"] {
            let fd = sys::open_path(p.lfd.as_fd(), n).unwrap();
            for x in [c"user.a", c"user.b"] {
                sys::setxattr_fd(fd.as_fd(), x, &[7u8; 1500], 0).unwrap();
            }
        }
        let ufd = dirfd(&m.mnt);
        let r = copy_up_dir(p.lfd.as_fd(), ufd.as_fd(), c"d", &KEEP);
        assert_eq!(errno_of(r), libc::ENOSPC);
        for tmpfile in [true, false] {
            let how = How {
                tmpfile,
                sync: true,
                len: None,
            };
            let r = file_up(p.lfd.as_fd(), c"f", ufd.as_fd(), &KEEP, how);
            assert_eq!(r.err().and_then(|e| e.raw_os_error()), Some(libc::ENOSPC));
        }
        assert!(names(&m.mnt).is_empty(), "{:?}", names(&m.mnt));
    }

    fn filefrag(p: &Path) -> String {
        run(Command::new("filefrag").arg("-v").arg(p)).unwrap_or_default()
    }

    /// On btrfs the copy is a reflink: its extents are shared and it takes
    /// about as long for 256 MiB as for nothing.
    #[test]
    fn reflink_shares_extents_on_btrfs() {
        let Some(m) = mount_btrfs() else {
            return;
        };
        let p = pair_in(&m.mnt);
        std::fs::write(p.l.join("big"), pattern(256 << 20, 9)).unwrap();
        sys::fsync(std::fs::File::open(p.l.join("big")).unwrap().as_fd(), false).unwrap();
        let t = Instant::now();
        copy_up_file(p.lfd.as_fd(), c"big", p.ufd.as_fd(), &KEEP).unwrap();
        let took = t.elapsed();
        eprintln!("btrfs reflink copy-up of 256 MiB: {took:?}");
        let frag = filefrag(&p.u.join("big"));
        assert!(frag.contains("shared"), "extents not shared:\n{frag}");
        assert!(took.as_millis() < 200, "{took:?}: not O(1)");
        let got = std::fs::read(p.u.join("big")).unwrap();
        assert!(blake3::hash(&got) == blake3::hash(&pattern(256 << 20, 9)));
        let fd = copy_up_file_truncated(p.lfd.as_fd(), c"big", p.lfd.as_fd(), &KEEP, 4096);
        assert_eq!(errno_of(fd), libc::EEXIST, "never over the lower itself");
        std::fs::remove_file(p.u.join("big")).unwrap();
        let fd = copy_up_file_truncated(p.lfd.as_fd(), c"big", p.ufd.as_fd(), &KEEP, 4096);
        assert_eq!(sys::fstat(fd.unwrap().as_fd()).unwrap().st_size, 4096);
        let got = std::fs::read(p.u.join("big")).unwrap();
        assert!(got[..] == pattern(4096, 9)[..]);
    }

    fn drop_file(p: &Path) {
        std::fs::remove_file(p).unwrap();
        run(&mut Command::new("sync"));
    }

    fn timed(f: impl FnOnce()) -> f64 {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    }

    /// `cargo test --release --lib bench_copy_up -- --ignored --nocapture`:
    /// copy-up of a 1 GiB file on /var/tmp against `cp` + `sync`, and the
    /// price of the fdatasync on small files.
    #[test]
    #[ignore]
    fn bench_copy_up() {
        let p = pair_in(Path::new("/var/tmp"));
        let chunk = pattern(64 << 20, 5);
        {
            use std::io::Write;
            let mut f = std::fs::File::create(p.l.join("big")).unwrap();
            for _ in 0..16 {
                f.write_all(&chunk).unwrap();
            }
        }
        run(&mut Command::new("sync"));
        let (synced, unsynced) = (
            How {
                tmpfile: true,
                sync: true,
                len: None,
            },
            How {
                tmpfile: true,
                sync: false,
                len: None,
            },
        );
        let up = |how: How| {
            file_up(p.lfd.as_fd(), c"big", p.ufd.as_fd(), &KEEP, how).unwrap();
        };
        let (mut ups, mut cps) = (Vec::new(), Vec::new());
        for round in 0..5 {
            // Alternate which goes first, so neither always inherits the
            // other's write-back.
            for first in [round % 2 == 0, round % 2 == 1] {
                if first {
                    ups.push(timed(|| up(synced)));
                } else {
                    cps.push(timed(|| {
                        run(Command::new("cp").arg(p.l.join("big")).arg(p.u.join("big")));
                        run(&mut Command::new("sync"));
                    }));
                }
                drop_file(&p.u.join("big"));
            }
        }
        let t_up_sync = timed(|| {
            up(unsynced);
            run(&mut Command::new("sync"));
        });
        drop_file(&p.u.join("big"));
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        eprintln!("1 GiB copy-up with fdatasync (s): {ups:.2?}");
        eprintln!("1 GiB cp + sync (s):              {cps:.2?}");
        let (u, cp) = (median(&mut ups), median(&mut cps));
        eprintln!(
            "median: copy-up {u:.2} s, cp + sync {cp:.2} s, ratio {:.2}; copy-up without fdatasync, then sync: {t_up_sync:.2} s",
            u / cp
        );
        drop_file(&p.l.join("big"));
        for i in 0..200 {
            std::fs::write(p.l.join(format!("s{i}")), pattern(4096, i)).unwrap();
        }
        run(&mut Command::new("sync"));
        for (label, how) in [("fdatasync", synced), ("no sync", unsynced)] {
            let t = timed(|| {
                for i in 0..200 {
                    let n = c(Path::new(&format!("s{i}")));
                    file_up(p.lfd.as_fd(), &n, p.ufd.as_fd(), &KEEP, how).unwrap();
                }
            });
            eprintln!("4 KiB copy-up, {label}: {:.0} µs each", t * 1e6 / 200.0);
            for i in 0..200 {
                std::fs::remove_file(p.u.join(format!("s{i}"))).unwrap();
            }
        }
    }
}
