//! On-disk formats shared with kernel overlayfs: whiteouts, opaque
//! directories and redirects.
//!
//! A branch written by chronofs mounts as an overlayfs layer and the other
//! way round, so every marker here is overlayfs's own, byte for byte:
//!
//! - a **whiteout** is a character device 0/0 with mode 0 (what overlayfs
//!   creates); the newer *xattr whiteout*, a zero-size regular file
//!   carrying `overlay.whiteout` inside a directory whose `overlay.opaque`
//!   is `"x"`, is recognised ([`is_xattr_whiteout`]) but never written;
//! - an **opaque directory** carries `overlay.opaque = "y"`;
//! - a **redirect** is `overlay.redirect` on a renamed directory: the path
//!   it was merged from, absolute from the layer root (`/a/b`, what
//!   overlayfs writes for a move across directories with `redirect_dir=on`)
//!   or a bare name (overlayfs's form for a rename within one directory).
//!
//! **Namespace.** overlayfs reads `trusted.overlay.*` by default and
//! `user.overlay.*` when mounted with `userxattr` (rootless containers'
//! layers). A union mount uses `Trusted` (its daemon runs as root) unless
//! mounted with `-o userxattr`; a branch is then portable to an overlayfs
//! mount with the same choice. `trusted.*` needs CAP_SYS_ADMIN:
//! [`XattrNs::for_daemon`] is what a process outside a mount (the tests,
//! a clone's store stamp) can write.
//!
//! **Privilege.** Whiteouts are device nodes: creating one needs CAP_MKNOD,
//! as in overlayfs. An unprivileged daemon gets `EPERM` from
//! [`make_whiteout`] and [`replace_with_whiteout`].
//!
//! Every function taking a descriptor accepts an `O_PATH` one: xattrs go
//! through `/proc/self/fd` (see `sys::getxattr_fd`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sys::{self, Stat};

/// Which xattr namespace holds the overlay markers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum XattrNs {
    /// `trusted.overlay.*`: overlayfs's default; needs CAP_SYS_ADMIN.
    #[default]
    Trusted,
    /// `user.overlay.*`: overlayfs's `userxattr` (rootless containers'
    /// layers), chosen by `-o userxattr`; an unprivileged process's only
    /// choice.
    User,
}

impl XattrNs {
    /// `Trusted` for a root daemon, `User` otherwise: the namespace this
    /// process can actually write.
    pub fn for_daemon() -> Self {
        if sys::geteuid() == 0 {
            XattrNs::Trusted
        } else {
            XattrNs::User
        }
    }

    /// The namespace's name: `trusted` or `user`.
    pub fn name(self) -> &'static str {
        match self {
            XattrNs::Trusted => "trusted",
            XattrNs::User => "user",
        }
    }

    /// The prefix every overlay xattr of this namespace starts with.
    pub fn prefix(self) -> &'static [u8] {
        match self {
            XattrNs::Trusted => b"trusted.overlay.",
            XattrNs::User => b"user.overlay.",
        }
    }

    pub fn opaque(self) -> &'static CStr {
        match self {
            XattrNs::Trusted => c"trusted.overlay.opaque",
            XattrNs::User => c"user.overlay.opaque",
        }
    }

    pub fn redirect(self) -> &'static CStr {
        match self {
            XattrNs::Trusted => c"trusted.overlay.redirect",
            XattrNs::User => c"user.overlay.redirect",
        }
    }

    pub fn whiteout(self) -> &'static CStr {
        match self {
            XattrNs::Trusted => c"trusted.overlay.whiteout",
            XattrNs::User => c"user.overlay.whiteout",
        }
    }

    /// On a regular file overlayfs (`metacopy=on`) copied up without its
    /// data: the bytes are still the lower file's ([`is_metacopy`]).
    pub fn metacopy(self) -> &'static CStr {
        match self {
            XattrNs::Trusted => c"trusted.overlay.metacopy",
            XattrNs::User => c"user.overlay.metacopy",
        }
    }

    /// chronofs's own: a clone's object that still shows its base
    /// (`vfs/clone.rs`). Under the overlay prefix so that it is hidden
    /// and refused as the union's markers are.
    pub fn clone_mark(self) -> &'static CStr {
        match self {
            XattrNs::Trusted => c"trusted.overlay.chronofs.clone",
            XattrNs::User => c"user.overlay.chronofs.clone",
        }
    }

    /// chronofs's own: see [`StoreStamp`].
    pub fn store_stamp(self) -> &'static CStr {
        match self {
            XattrNs::Trusted => c"trusted.overlay.chronofs.store",
            XattrNs::User => c"user.overlay.chronofs.store",
        }
    }

    /// chronofs's own: see [`mark_attrs_set`].
    pub fn attrs_set(self) -> &'static CStr {
        match self {
            XattrNs::Trusted => c"trusted.overlay.chronofs.attrs",
            XattrNs::User => c"user.overlay.chronofs.attrs",
        }
    }
}

/// What a branch's root says of the store its clones' marks belong to.
/// A mark names its base by path and instant in the mount's history, so
/// read through another store's history it would show another file's
/// bytes (or zeros, where that store knows no clone): a mount refuses a
/// branch stamped by another store. Value: a format byte (1), then the
/// store's id, 8 bytes little endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreStamp {
    Store(crate::store::StoreId),
    /// A stamp this build does not read (another format byte or length).
    Unknown,
}

const STORE_STAMP_FORMAT: u8 = 1;

/// The stamp on branch root `root`, if any.
pub fn store_stamp(root: BorrowedFd<'_>, ns: XattrNs) -> io::Result<Option<StoreStamp>> {
    let Some(value) = read_xattr(root, ns.store_stamp())? else {
        return Ok(None);
    };
    Ok(Some(match value.split_first() {
        Some((&STORE_STAMP_FORMAT, id)) if id.len() == 8 => {
            let mut le = [0u8; 8];
            le.copy_from_slice(id);
            StoreStamp::Store(crate::store::StoreId(u64::from_le_bytes(le)))
        }
        _ => StoreStamp::Unknown,
    }))
}

/// Stamps branch root `root` as holding clones of store `id`, durably
/// (before any mark that needs it can reach the disk).
pub fn stamp_store(root: BorrowedFd<'_>, ns: XattrNs, id: crate::store::StoreId) -> io::Result<()> {
    let mut value = vec![STORE_STAMP_FORMAT];
    value.extend_from_slice(&id.0.to_le_bytes());
    sys::setxattr_fd(root, ns.store_stamp(), &value, 0)?;
    let dir = sys::reopen_dir(root, libc::O_RDONLY)?;
    sys::fsync(dir.as_fd(), false)
}

/// Marks a directory copy whose own attributes (mode, owner, times,
/// xattrs) were set through the union, not only copied from below: a
/// sandbox's commit gives the mount's copy these, and keeps the mount's
/// own where the sandbox only copied them (the mount may have changed
/// them since).
pub fn mark_attrs_set(dir_fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<()> {
    sys::setxattr_fd(dir_fd, ns.attrs_set(), b"y", 0)
}

/// See [`mark_attrs_set`].
pub fn attrs_were_set(dir_fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<bool> {
    Ok(read_xattr(dir_fd, ns.attrs_set())?.is_some())
}

/// Whether xattr `name` is an overlay marker of namespace `ns`, to be
/// hidden from users (overlayfs hides them too: they describe the layer,
/// not the file, and a user who copied one would corrupt a merge).
pub fn is_overlay_xattr(name: &[u8], ns: XattrNs) -> bool {
    name.starts_with(ns.prefix())
}

/// Whether xattr `name` is one of chronofs's own (`overlay.chronofs.*`
/// of namespace `ns`: clone marks, hard-link index names and counts,
/// store stamps), which no user sets or sees, in a union or not.
pub fn is_chronofs_xattr(name: &[u8], ns: XattrNs) -> bool {
    name.strip_prefix(ns.prefix())
        .is_some_and(|rest| rest.starts_with(b"chronofs."))
}

/// A character device 0/0: overlayfs's whiteout.
/// Whether mknod(`mode`, `rdev`) would make what a union reads as a
/// whiteout.
pub fn is_whiteout_dev(mode: u32, rdev: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFCHR && rdev == 0
}

pub fn is_whiteout(st: &Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == 0
}

/// The xattr form of a whiteout: a zero-size regular file carrying
/// `overlay.whiteout`. Only meaningful in a directory marked
/// [`Opacity::XattrWhiteouts`]; `st` is `fd`'s stat, so the common case (not
/// an empty regular file) costs no system call.
pub fn is_xattr_whiteout(fd: BorrowedFd<'_>, st: &Stat, ns: XattrNs) -> io::Result<bool> {
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size != 0 {
        return Ok(false);
    }
    Ok(read_xattr(fd, ns.whiteout())?.is_some())
}

/// Whether `name` in layer directory `dir`, whose stat is `st`, is a
/// whiteout in either form: a character device 0/0, or (in a directory
/// marked [`Opacity::XattrWhiteouts`]) an empty file carrying
/// `overlay.whiteout`. Only an empty regular file costs system calls.
pub fn is_whiteout_in(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    st: &Stat,
    ns: XattrNs,
) -> io::Result<bool> {
    if is_whiteout(st) {
        return Ok(true);
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_size != 0
        || opacity(dir, ns)? != Opacity::XattrWhiteouts
    {
        return Ok(false);
    }
    let fd = sys::open_path(dir, name)?;
    is_xattr_whiteout(fd.as_fd(), st, ns)
}

/// Whether the regular file `fd` is an overlayfs metacopy file: its
/// metadata copied up, its data left in a lower layer (at its
/// `overlay.redirect` or the same path below), its own blocks a hole of
/// the right size. chronofs cannot read such data from where it is, and
/// serving the hole would show (and a change would keep) zeros.
pub fn is_metacopy(fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<bool> {
    Ok(read_xattr(fd, ns.metacopy())?.is_some())
}

/// What a directory's `overlay.opaque` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opacity {
    /// No marker (or one overlayfs would ignore): layers below merge in.
    Merged,
    /// `"y"`: layers below are hidden.
    Opaque,
    /// `"x"`: not opaque, but may hold xattr whiteouts.
    XattrWhiteouts,
}

/// Reads `overlay.opaque`. overlayfs reads a single byte, so any other
/// value, longer ones included, counts as no marker.
pub fn opacity(dir_fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<Opacity> {
    Ok(match read_xattr(dir_fd, ns.opaque())?.as_deref() {
        Some(b"y") => Opacity::Opaque,
        Some(b"x") => Opacity::XattrWhiteouts,
        _ => Opacity::Merged,
    })
}

/// Whether the directory hides the layers below it.
pub fn is_opaque(dir_fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<bool> {
    Ok(opacity(dir_fd, ns)? == Opacity::Opaque)
}

pub fn set_opaque(dir_fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<()> {
    sys::setxattr_fd(dir_fd, ns.opaque(), b"y", 0)
}

/// The directory's redirect, as stored: absolute (`/a/b`, from the layer
/// root) or a bare name in the same parent.
pub fn redirect(dir_fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<Option<Vec<u8>>> {
    read_xattr(dir_fd, ns.redirect())
}

/// Records that this directory merges the lower directory at `abs_path`
/// (from the layer root, starting with `/`, as overlayfs writes it).
pub fn set_redirect(dir_fd: BorrowedFd<'_>, ns: XattrNs, abs_path: &[u8]) -> io::Result<()> {
    if !abs_path.starts_with(b"/") || abs_path.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    sys::setxattr_fd(dir_fd, ns.redirect(), abs_path, 0)
}

/// A clone object's mark (`XattrNs::clone_mark`), if it has one.
pub fn read_clone_mark(fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<Option<Vec<u8>>> {
    read_xattr(fd, ns.clone_mark())
}

/// An xattr's value; `None` where it is absent or the file system has no
/// xattrs at all (then no layer below can be hidden by it either).
fn read_xattr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<Vec<u8>>> {
    // Doubling up to the kernel's XATTR_SIZE_MAX needs no size query, which
    // could itself race with a change.
    let mut buf = vec![0u8; 256];
    loop {
        match sys::getxattr_fd(fd, name, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            Err(e) if is_errno(&e, libc::ERANGE) && buf.len() < XATTR_SIZE_MAX => {
                buf.resize(buf.len() * 2, 0);
            }
            Err(e) if is_errno(&e, libc::ENODATA) || is_errno(&e, libc::EOPNOTSUPP) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        }
    }
}

const XATTR_SIZE_MAX: usize = 65536;

fn is_errno(e: &io::Error, errno: i32) -> bool {
    e.raw_os_error() == Some(errno)
}

/// Creates a whiteout at `name` (EEXIST if the name is taken). Needs
/// CAP_MKNOD: EPERM otherwise.
pub fn make_whiteout(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    sys::mknodat(dirfd, name, libc::S_IFCHR, 0)
}

/// Prefix of the temporary names [`replace_with_whiteout`] uses in the
/// directory itself. Readers hide them ([`is_temporary`]); one left by a
/// crash is safe to remove.
pub const TEMP_PREFIX: &[u8] = b".chronofs-wh.";

/// Whether `name` is one of this module's temporaries.
pub fn is_temporary(name: &[u8]) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// Makes `name` a whiteout, replacing what is there so the name is never
/// missing in between: a non-directory by a rename of a fresh whiteout
/// over it, a directory by `RENAME_WHITEOUT` (or, where the file system
/// lacks it, an exchange with a fresh whiteout), after which the old
/// directory is removed. A directory must hold nothing but whiteouts
/// (ENOTEMPTY before anything changes). An absent name just gets a
/// whiteout; an existing whiteout is left as is. Needs CAP_MKNOD.
pub fn replace_with_whiteout(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let st = match sys::fstatat(dirfd, name) {
        Ok(st) => st,
        Err(e) if is_errno(&e, libc::ENOENT) => return make_whiteout(dirfd, name),
        Err(e) => return Err(e),
    };
    if is_whiteout(&st) {
        return Ok(());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        let tmp = make_temp_whiteout(dirfd)?;
        return sys::renameat2(dirfd, &tmp, dirfd, name, 0).inspect_err(|_| {
            let _ = sys::unlinkat(dirfd, &tmp, 0);
        });
    }
    ensure_only_whiteouts(dirfd, name)?;
    let tmp = swap_dir_for_whiteout(dirfd, name)?;
    if let Err(e) = remove_dir_of_whiteouts(dirfd, &tmp) {
        // The whiteout is in place, which is what the caller asked; the
        // temporary stays hidden from readers until fsck removes it.
        tracing::warn!("leaving whiteout temporary {tmp:?} behind: {e}");
    }
    Ok(())
}

/// A fresh whiteout under an unused temporary name.
fn make_temp_whiteout(dirfd: BorrowedFd<'_>) -> io::Result<CString> {
    loop {
        let tmp = temp_name();
        match make_whiteout(dirfd, &tmp) {
            Err(e) if is_errno(&e, libc::EEXIST) => continue,
            r => return r.map(|()| tmp),
        }
    }
}

/// This process's mark in the hidden temporaries it makes (8 hex digits
/// after the prefix): a temporary without it is no operation's of this
/// process (see [`is_orphan`]).
pub fn process_token() -> u32 {
    static TOKEN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish() as u32
    })
}

/// Whether `name` is a hidden temporary a crash left: one of copy-up's or
/// a clone's (`.chronofs-copyup.*`) or of a whiteout swap
/// (`.chronofs-wh.*`) that this process did not make, so no operation of
/// this process works on it, and the operation of the process that made
/// it never finishes (a branch is written by one mount: `branch::claim`).
/// Such an entry is no user's, yet it would make its directory's rmdir
/// fail with ENOTEMPTY where the user sees an empty directory.
pub fn is_orphan(name: &[u8]) -> bool {
    // A whiteout swap's: `<mark>.<n>`; a copy-up's: `<mark><8 digits>`.
    let mark = match name.strip_prefix(TEMP_PREFIX) {
        Some(rest) => rest.split(|b| *b == b'.').next(),
        None if super::copyup::is_copyup_temp(name) => {
            name.get(super::copyup::TEMP_PREFIX.len()..super::copyup::TEMP_PREFIX.len() + 8)
        }
        None => None,
    };
    mark.is_some_and(|m| m != format!("{:08x}", process_token()).as_bytes())
}

/// Whether `name` is a hidden temporary of any kind: no user's entry.
pub fn is_hidden_temporary(name: &[u8]) -> bool {
    is_temporary(name) || super::copyup::is_copyup_temp(name)
}

/// Removes the orphan `name` in `dir` (see [`is_orphan`]), whatever it
/// holds.
pub fn remove_orphan(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    super::snapmerge::remove_tree(dir, name)
}

/// Removes every orphan temporary in directory `name` of `dirfd`; returns
/// how many. For an rmdir that the backing file system refused with
/// ENOTEMPTY where the user sees nothing.
pub fn clear_orphans_in(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<usize> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let dir = sys::openat(dirfd, name, flags, 0)?;
    let mut removed = 0;
    for e in entries(dir.as_fd())? {
        if !is_hidden_temporary(&e.name) {
            continue;
        }
        let child = CString::new(e.name).map_err(|_| errno(libc::EINVAL))?;
        if is_orphan(child.as_bytes()) {
            tracing::info!("removing {child:?}, a temporary a crash left");
            remove_orphan(dir.as_fd(), &child)?;
            removed += 1;
        }
    }
    Ok(removed)
}

pub(super) fn temp_name() -> CString {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = TEMP_PREFIX.to_vec();
    name.extend_from_slice(format!("{:08x}.{n}", process_token()).as_bytes());
    // Built from a NUL-free prefix and digits.
    CString::new(name).unwrap_or_default()
}

/// Puts a whiteout at directory `name` in one step and returns the
/// temporary name the directory now has.
fn swap_dir_for_whiteout(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<CString> {
    match swap_by_rename_whiteout(dirfd, name) {
        Err(e) if is_errno(&e, libc::EINVAL) || is_errno(&e, libc::EOPNOTSUPP) => {
            swap_by_exchange(dirfd, name)
        }
        r => r,
    }
}

/// RENAME_WHITEOUT: the kernel leaves the whiteout behind in the same step.
fn swap_by_rename_whiteout(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<CString> {
    loop {
        let tmp = temp_name();
        match sys::renameat2(dirfd, name, dirfd, &tmp, libc::RENAME_WHITEOUT) {
            Err(e) if is_errno(&e, libc::EEXIST) || is_errno(&e, libc::ENOTEMPTY) => continue,
            r => return r.map(|()| tmp),
        }
    }
}

/// For file systems without RENAME_WHITEOUT: a fresh whiteout trades
/// places with the directory.
fn swap_by_exchange(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<CString> {
    let tmp = make_temp_whiteout(dirfd)?;
    sys::renameat2(dirfd, &tmp, dirfd, name, libc::RENAME_EXCHANGE)
        .inspect_err(|_| {
            let _ = sys::unlinkat(dirfd, &tmp, 0);
        })
        .map(|()| tmp)
}

/// What an entry of a directory being removed is to its removal.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Child {
    Whiteout,
    /// A crash's temporary ([`is_orphan`]).
    Orphan,
    Entry,
}

/// The names in directory `name` of `dirfd`, `.` and `..` left out, each
/// with what it is.
fn list_children(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<(CString, Child)>> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let dir = sys::openat(dirfd, name, flags, 0)?;
    let mut out = Vec::new();
    for e in entries(dir.as_fd())? {
        let temp = is_hidden_temporary(&e.name);
        let child = CString::new(e.name).map_err(|_| errno(libc::EINVAL))?;
        let kind = if temp || matches!(e.dtype, libc::DT_CHR | libc::DT_UNKNOWN) {
            let st = sys::fstatat(dir.as_fd(), &child)?;
            if is_whiteout(&st) {
                Child::Whiteout
            } else if is_orphan(child.as_bytes()) {
                Child::Orphan
            } else {
                Child::Entry
            }
        } else {
            Child::Entry
        };
        out.push((child, kind));
    }
    Ok(out)
}

/// Every entry of the directory open as `dir` (for reading), `.` and `..`
/// left out.
pub(crate) fn entries(dir: BorrowedFd<'_>) -> io::Result<Vec<sys::DirEntry>> {
    let mut buf = sys::DirBuf::new(32 * 1024);
    let mut out = Vec::new();
    loop {
        let batch = sys::getdents(dir, &mut buf)?;
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(batch.into_iter().filter(|e| !is_dot(&e.name)));
    }
}

fn ensure_only_whiteouts(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    if list_children(dirfd, name)?
        .iter()
        .all(|(_, c)| *c != Child::Entry)
    {
        Ok(())
    } else {
        Err(errno(libc::ENOTEMPTY))
    }
}

/// Removes directory `name`, which holds nothing but whiteouts (and
/// orphan temporaries).
fn remove_dir_of_whiteouts(dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let dir = sys::open_path(dirfd, name)?;
    for (child, kind) in list_children(dirfd, name)? {
        match kind {
            Child::Whiteout => sys::unlinkat(dir.as_fd(), &child, 0)?,
            Child::Orphan => remove_orphan(dir.as_fd(), &child)?,
            Child::Entry => return Err(errno(libc::ENOTEMPTY)),
        }
    }
    sys::unlinkat(dirfd, name, libc::AT_REMOVEDIR)
}

pub(crate) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

fn errno(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn open_dir(path: &Path) -> OwnedFd {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        sys::openat(sys::CWD, &c, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap()
    }

    fn root() -> bool {
        sys::geteuid() == 0
    }

    /// The namespace this test process can write: trusted.* as root.
    fn ns() -> XattrNs {
        XattrNs::for_daemon()
    }

    #[test]
    fn xattr_names_are_overlayfs_ones() {
        assert_eq!(
            XattrNs::Trusted.opaque().to_bytes(),
            b"trusted.overlay.opaque"
        );
        assert_eq!(
            XattrNs::User.redirect().to_bytes(),
            b"user.overlay.redirect"
        );
        assert!(is_overlay_xattr(
            b"trusted.overlay.origin",
            XattrNs::Trusted
        ));
        assert!(!is_overlay_xattr(b"user.overlay.origin", XattrNs::Trusted));
        assert!(!is_overlay_xattr(b"trusted.overlayx", XattrNs::Trusted));
        assert!(is_overlay_xattr(b"user.overlay.opaque", XattrNs::User));
        assert!(!is_overlay_xattr(b"user.other", XattrNs::User));
    }

    #[test]
    fn whiteout_is_a_0_0_char_device() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_dir(dir.path());
        let made = make_whiteout(fd.as_fd(), c"w");
        if !root() {
            assert_eq!(made.unwrap_err().raw_os_error(), Some(libc::EPERM));
            return;
        }
        made.unwrap();
        let st = sys::fstatat(fd.as_fd(), c"w").unwrap();
        assert!(is_whiteout(&st));
        assert_eq!(st.st_mode & 0o7777, 0, "overlayfs creates mode 0");
        std::fs::write(dir.path().join("f"), b"").unwrap();
        assert!(!is_whiteout(&sys::fstatat(fd.as_fd(), c"f").unwrap()));
        let err = make_whiteout(fd.as_fd(), c"f").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
    }

    #[test]
    fn opaque_and_redirect_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_dir(dir.path());
        assert!(!is_opaque(fd.as_fd(), ns()).unwrap());
        assert_eq!(redirect(fd.as_fd(), ns()).unwrap(), None);
        if set_opaque(fd.as_fd(), ns()).is_err() {
            return; // a tmpfs without user xattrs proves nothing
        }
        assert!(is_opaque(fd.as_fd(), ns()).unwrap());
        set_redirect(fd.as_fd(), ns(), b"/a/b").unwrap();
        assert_eq!(redirect(fd.as_fd(), ns()).unwrap().unwrap(), b"/a/b");
        let rel = set_redirect(fd.as_fd(), ns(), b"b").unwrap_err();
        assert_eq!(rel.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn other_opaque_values_are_not_opaque() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_dir(dir.path());
        for (value, want) in [
            (&b"x"[..], Opacity::XattrWhiteouts),
            (b"yes", Opacity::Merged),
            (b"n", Opacity::Merged),
            (b"y", Opacity::Opaque),
        ] {
            if sys::setxattr_fd(fd.as_fd(), ns().opaque(), value, 0).is_err() {
                return;
            }
            assert_eq!(opacity(fd.as_fd(), ns()).unwrap(), want, "{value:?}");
        }
    }

    #[test]
    fn long_redirects_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_dir(dir.path());
        let long: Vec<u8> = std::iter::once(b'/')
            .chain(std::iter::repeat_n(b'a', 1000))
            .collect();
        if set_redirect(fd.as_fd(), ns(), &long).is_err() {
            return;
        }
        assert_eq!(redirect(fd.as_fd(), ns()).unwrap().unwrap(), long);
    }

    #[test]
    fn xattr_whiteout_needs_an_empty_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("e"), b"").unwrap();
        std::fs::write(dir.path().join("full"), b"data").unwrap();
        let d = open_dir(dir.path());
        for (name, want) in [(c"e", true), (c"full", false)] {
            let f = sys::open_path(d.as_fd(), name).unwrap();
            if sys::setxattr_fd(f.as_fd(), ns().whiteout(), b"", 0).is_err() {
                return;
            }
            let st = sys::fstat(f.as_fd()).unwrap();
            assert_eq!(is_xattr_whiteout(f.as_fd(), &st, ns()).unwrap(), want);
        }
        let plain = sys::open_path(d.as_fd(), c".").unwrap();
        let st = sys::fstat(plain.as_fd()).unwrap();
        assert!(!is_xattr_whiteout(plain.as_fd(), &st, ns()).unwrap());
    }

    fn names_in(path: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replace_with_whiteout_covers_each_kind() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink("nowhere", p.join("link")).unwrap();
        std::fs::create_dir(p.join("empty")).unwrap();
        std::fs::create_dir(p.join("whiteouts")).unwrap();
        let fd = open_dir(p);
        let sub = open_dir(&p.join("whiteouts"));
        make_whiteout(sub.as_fd(), c"gone").unwrap();
        for name in [c"file", c"link", c"empty", c"whiteouts", c"absent"] {
            replace_with_whiteout(fd.as_fd(), name).unwrap();
            let st = sys::fstatat(fd.as_fd(), name).unwrap();
            assert!(is_whiteout(&st), "{name:?}");
        }
        // Idempotent on a whiteout.
        replace_with_whiteout(fd.as_fd(), c"file").unwrap();
        assert_eq!(
            names_in(p),
            ["absent", "empty", "file", "link", "whiteouts"],
            "no temporary is left behind"
        );
    }

    #[test]
    fn replace_with_whiteout_keeps_a_populated_directory() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/keep"), b"x").unwrap();
        let fd = open_dir(dir.path());
        let err = replace_with_whiteout(fd.as_fd(), c"d").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTEMPTY));
        assert_eq!(names_in(&dir.path().join("d")), ["keep"]);
        assert_eq!(names_in(dir.path()), ["d"]);
    }

    /// The fallback for file systems without RENAME_WHITEOUT, which this
    /// one has.
    #[test]
    fn exchange_fallback_swaps_in_a_whiteout() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let fd = open_dir(dir.path());
        let tmp = swap_by_exchange(fd.as_fd(), c"d").unwrap();
        assert!(is_whiteout(&sys::fstatat(fd.as_fd(), c"d").unwrap()));
        let moved = sys::fstatat(fd.as_fd(), &tmp).unwrap();
        assert_eq!(moved.st_mode & libc::S_IFMT, libc::S_IFDIR);
        remove_dir_of_whiteouts(fd.as_fd(), &tmp).unwrap();
        assert_eq!(names_in(dir.path()), ["d"]);
    }

    #[test]
    fn temporaries_are_recognised() {
        assert!(is_temporary(temp_name().as_bytes()));
        assert!(!is_temporary(b".chronofs"));
    }
}
