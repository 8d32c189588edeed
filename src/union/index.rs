//! The hard-link index: how a regular file with several names in a
//! read-only branch keeps one identity once one of its names is copied up
//! (overlayfs's `index=on`, kept in the upper branch itself).
//!
//! The first copy-up of such a file makes its copy as an entry of a hidden
//! directory in the upper branch ([`INDEX_DIR`]), named after the lower
//! object, and links the copied-up name to it. A lookup of any other name
//! of the lower object finds the entry and resolves to it, so every name
//! shows the copied-up data under one inode number, and a later copy-up of
//! another name is one more link. The entry exists before any name links
//! to it, so a crash in between leaves the lower names resolving to a
//! complete copy.
//!
//! The link count the union shows is the number of names a user can
//! reach, which neither branch's count gives (the upper one counts the
//! index entry and only the names copied up so far; the lower one counts
//! names the union has since removed). It is kept in an overlay-namespace
//! xattr on the entry, shared by all its upper names, and hidden like
//! every overlay xattr.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::format::XattrNs;
use crate::sys;

/// The index's name in the upper branch's root (hidden through the mount).
pub const INDEX_DIR: &str = crate::store::LINK_INDEX_DIR;

/// Whether `name` in a branch root is the index.
pub fn is_index_dir(name: &OsStr) -> bool {
    name == OsStr::new(INDEX_DIR)
}

/// The entry name of the lower object (`branch`, `dev`, `ino`): the same
/// identity the inode map keys it by, so the two agree across remounts.
pub fn entry_name(branch: u32, dev: u64, ino: u64) -> CString {
    // Hex digits and dashes only: never a NUL.
    CString::new(format!("{branch}-{dev:x}-{ino:x}")).unwrap_or_default()
}

/// The lower object an entry name stands for, as (branch, dev, ino).
pub fn key_of_entry(entry: &CStr) -> Option<(u32, u64, u64)> {
    let s = entry.to_str().ok()?;
    let mut parts = s.split('-');
    let branch = parts.next()?.parse().ok()?;
    let dev = u64::from_str_radix(parts.next()?, 16).ok()?;
    let ino = u64::from_str_radix(parts.next()?, 16).ok()?;
    parts.next().is_none().then_some((branch, dev, ino))
}

/// The index directory of upper branch root `root`, made (mode 0700) if
/// it does not exist yet.
pub fn open_or_make(root: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let name = sys::cstr(OsStr::new(INDEX_DIR))?;
    match sys::mkdirat(root, &name, 0o700) {
        // Durable before any entry in it is linked to a name.
        Ok(()) => {
            let dir = sys::reopen(root, libc::O_RDONLY | libc::O_DIRECTORY)?;
            sys::fsync(dir.as_fd(), false)?;
        }
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e),
    }
    sys::openat(
        root,
        &name,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
}

/// The index directory of `root`, if there is one.
pub fn open_existing(root: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    let name = sys::cstr(OsStr::new(INDEX_DIR))?;
    match sys::openat(
        root,
        &name,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether index `index` (of branch `branch`) holds an entry for a file
/// of that branch itself: a fold or a commit moved the copy of one of its
/// files into it, and a name of that file may have become its only one.
pub fn holds_own(index: BorrowedFd<'_>, branch: u32) -> io::Result<bool> {
    let dir = sys::reopen_dir(index, libc::O_RDONLY)?;
    Ok(super::format::entries(dir.as_fd())?.iter().any(|e| {
        CString::new(e.name.as_slice())
            .ok()
            .and_then(|n| key_of_entry(&n))
            .is_some_and(|(b, _, _)| b == branch)
    }))
}

fn nlink_xattr(ns: XattrNs) -> &'static CStr {
    match ns {
        XattrNs::Trusted => c"trusted.overlay.chronofs.nlink",
        XattrNs::User => c"user.overlay.chronofs.nlink",
    }
}

fn entry_xattr(ns: XattrNs) -> &'static CStr {
    match ns {
        XattrNs::Trusted => c"trusted.overlay.chronofs.index",
        XattrNs::User => c"user.overlay.chronofs.index",
    }
}

/// Records on the copy which index entry it is, so that the entry can be
/// removed when the union removes the file's last name (an upper name
/// alone does not tell which lower object it came from).
pub fn set_entry(fd: BorrowedFd<'_>, ns: XattrNs, entry: &CStr) -> io::Result<()> {
    sys::setxattr_fd(fd, entry_xattr(ns), entry.to_bytes(), 0)
}

/// The index entry `fd` is, if it is one.
pub fn entry(fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<Option<CString>> {
    let mut buf = [0u8; 64];
    match sys::getxattr_fd(fd, entry_xattr(ns), &mut buf) {
        Ok(n) => Ok(CString::new(&buf[..n]).ok()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The link count the union shows for an indexed file, if `fd` is one.
pub fn nlink(fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<Option<u32>> {
    let mut buf = [0u8; 16];
    match sys::getxattr_fd(fd, nlink_xattr(ns), &mut buf) {
        Ok(n) => Ok(std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.parse().ok())),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn set_nlink(fd: BorrowedFd<'_>, ns: XattrNs, n: u32) -> io::Result<()> {
    sys::setxattr_fd(fd, nlink_xattr(ns), n.to_string().as_bytes(), 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_round_trip() {
        let name = entry_name(3, 0x803, 0xdead_beef_1234);
        assert_eq!(name.to_str().unwrap(), "3-803-deadbeef1234");
        assert_eq!(key_of_entry(&name), Some((3, 0x803, 0xdead_beef_1234)));
        assert_eq!(key_of_entry(c"3-803"), None);
        assert_eq!(key_of_entry(c"3-803-1-2"), None);
        assert_eq!(key_of_entry(c"x-803-1"), None);
    }
}
