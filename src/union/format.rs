//! On-disk formats shared with kernel overlayfs: whiteouts, opaque
//! directories and redirects.

// Interim versions for the vfs integration; replaced by the full module.
use std::io;
use std::os::fd::BorrowedFd;

use crate::sys::{self, Stat};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrNs {
    Trusted,
    User,
}

impl XattrNs {
    pub fn for_daemon() -> XattrNs {
        if sys::geteuid() == 0 {
            XattrNs::Trusted
        } else {
            XattrNs::User
        }
    }

    fn name(self, what: &str) -> std::ffi::CString {
        let prefix = match self {
            XattrNs::Trusted => "trusted",
            XattrNs::User => "user",
        };
        std::ffi::CString::new(format!("{prefix}.overlay.{what}")).unwrap_or_default()
    }
}

pub fn is_whiteout(st: &Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == 0
}

pub fn make_whiteout(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> io::Result<()> {
    sys::mknodat(dir, name, libc::S_IFCHR, 0)
}

pub fn is_opaque(dir: BorrowedFd<'_>, ns: XattrNs) -> io::Result<bool> {
    let mut buf = [0u8; 4];
    match sys::getxattr_fd(dir, &ns.name("opaque"), &mut buf) {
        Ok(n) => Ok(&buf[..n] == b"y"),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA) | Some(libc::ENOTSUP)) => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

pub fn set_opaque(dir: BorrowedFd<'_>, ns: XattrNs) -> io::Result<()> {
    sys::setxattr_fd(dir, &ns.name("opaque"), b"y", 0)
}
