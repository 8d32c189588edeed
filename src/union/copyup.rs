//! Copy-up: an object of a read-only branch copied into a read-write one,
//! never visible half-copied.

// Interim versions for the vfs integration; replaced by the full module.
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::Result;
use crate::sys;

#[derive(Clone, Debug, Default)]
pub enum Owner {
    #[default]
    Keep,
}

pub fn copy_up_dir(
    lower_parent: BorrowedFd<'_>,
    upper_parent: BorrowedFd<'_>,
    name: &CStr,
    _owner: &Owner,
) -> Result<OwnedFd> {
    let st = sys::fstatat(lower_parent, name)?;
    match sys::mkdirat(upper_parent, name, st.st_mode & 0o7777) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let fd = sys::open_path(upper_parent, name)?;
    sys::chown_fd(fd.as_fd(), st.st_uid, st.st_gid)?;
    sys::chmod_fd(fd.as_fd(), st.st_mode & 0o7777)?;
    Ok(fd)
}

pub fn copy_up_file(
    lower_parent: BorrowedFd<'_>,
    name: &CStr,
    upper_parent: BorrowedFd<'_>,
    _owner: &Owner,
) -> Result<OwnedFd> {
    let st = sys::fstatat(lower_parent, name)?;
    let src = sys::openat(lower_parent, name, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
    let tmp = sys::openat(upper_parent, c".", libc::O_TMPFILE | libc::O_RDWR, 0o600)?;
    let mut off = 0u64;
    while off < st.st_size as u64 {
        let n = sys::copy_file_range(src.as_fd(), off, tmp.as_fd(), off, st.st_size as u64 - off)?;
        if n == 0 {
            break;
        }
        off += n as u64;
    }
    sys::chown_fd(tmp.as_fd(), st.st_uid, st.st_gid)?;
    sys::chmod_fd(tmp.as_fd(), st.st_mode & 0o7777)?;
    sys::link_fd(tmp.as_fd(), upper_parent, name)?;
    Ok(sys::open_path(upper_parent, name)?)
}
