//! Attribute operations: getattr, setattr, readlink, xattrs, access, statfs.

use std::ffi::OsStr;
use std::os::fd::AsFd;

use super::inodes::Handle;
use super::{errno, Attr, Caller, InodeNo, Result, Vfs};
use crate::history::Cause;
use crate::sys::{self, creds, TimeSpec};

/// The changes a setattr asks for; `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSpec>,
    pub mtime: Option<TimeSpec>,
    /// An open handle the change came through (ftruncate, fchmod...).
    pub fh: Option<u64>,
}

pub type StatFs = sys::StatFs;

/// An xattr answer: the length alone when the caller asked with size 0.
#[derive(Debug)]
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

impl Xattr {
    fn sized(mut buf: Vec<u8>, asked: u32, len: usize) -> Xattr {
        if asked == 0 {
            Xattr::Size(len as u32)
        } else {
            buf.truncate(len);
            Xattr::Data(buf)
        }
    }

    /// The answer for a value held in memory (a recorded one), with the
    /// kernel's ERANGE when the caller's buffer is too small.
    pub(super) fn of_value(value: Vec<u8>, asked: u32) -> Result<Xattr> {
        if asked != 0 && value.len() > asked as usize {
            return Err(errno(libc::ERANGE));
        }
        let len = value.len();
        Ok(Xattr::sized(value, asked, len))
    }

    /// getxattr of a live object (its O_PATH descriptor), as `caller`.
    pub(super) fn read(
        caller: &Caller,
        fd: std::os::fd::BorrowedFd<'_>,
        name: &OsStr,
        size: u32,
    ) -> Result<Xattr> {
        Xattr::read_with(caller, name, size, |n, buf| sys::getxattr_fd(fd, n, buf))
    }

    /// getxattr through an open descriptor of the object, as `caller`.
    pub(super) fn read_open(
        caller: &Caller,
        fd: std::os::fd::BorrowedFd<'_>,
        name: &OsStr,
        size: u32,
    ) -> Result<Xattr> {
        Xattr::read_with(caller, name, size, |n, buf| sys::fgetxattr(fd, n, buf))
    }

    fn read_with(
        caller: &Caller,
        name: &OsStr,
        size: u32,
        get: impl Fn(&std::ffi::CStr, &mut [u8]) -> std::io::Result<usize>,
    ) -> Result<Xattr> {
        let cname = sys::cstr(name)?;
        let mut buf = vec![0u8; size as usize];
        let n = creds::as_caller(caller, || get(&cname, &mut buf))?;
        Ok(Xattr::sized(buf, size, n))
    }

    /// listxattr of a live object, as `caller`.
    pub(super) fn list(
        caller: &Caller,
        fd: std::os::fd::BorrowedFd<'_>,
        size: u32,
    ) -> Result<Xattr> {
        let mut buf = vec![0u8; size as usize];
        let n = creds::as_caller(caller, || sys::listxattr_fd(fd, &mut buf))?;
        Ok(Xattr::sized(buf, size, n))
    }
}

impl Vfs {
    pub fn getattr(&self, ino: InodeNo, fh: Option<u64>) -> Result<Attr> {
        self.source_of(ino).getattr(self, fh)
    }

    pub(super) fn live_getattr(&self, ino: InodeNo, fh: Option<u64>) -> Result<Attr> {
        if self.clones_on() {
            self.fill_held(ino)?;
        }
        let st = match fh.map(|fh| self.handles.get(fh)) {
            Some(Ok(handle)) => match &*handle {
                Handle::File { fd, .. } => match self.followed(&handle) {
                    Some(copy) => sys::fstat(copy.as_fd())?,
                    None => sys::fstat(fd.as_fd())?,
                },
                Handle::Dir { .. } => self.fstat_shown(ino)?,
            },
            _ => self.fstat_shown(ino)?,
        };
        Ok(Attr {
            ino,
            st: self.shown(ino, st),
        })
    }

    fn fstat_shown(&self, ino: InodeNo) -> Result<super::Stat> {
        self.with_shown_fd(ino, |fd| Ok(sys::fstat(fd)?))
    }

    /// `f` given the descriptor whose attributes `ino` shows: the root's
    /// copy that changes to it go to ([`Vfs::root_copy_shown`]), else its
    /// own.
    pub(super) fn with_shown_fd<T>(
        &self,
        ino: InodeNo,
        f: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> Result<T>,
    ) -> Result<T> {
        match self.root_copy_shown(ino) {
            Some(copy) => f(copy.as_fd()),
            None => f(self.node(ino)?.fd()),
        }
    }

    pub fn setattr(&self, caller: &Caller, ino: InodeNo, set: SetAttr) -> Result<Attr> {
        let _set = self.changing();
        self.source_of(ino).check_writable()?;
        let cause = if set.size.is_some() {
            Cause::Truncate
        } else if set.uid.is_some() || set.gid.is_some() {
            Cause::Chown
        } else if set.mode.is_some() {
            Cause::Chmod
        } else if set.atime.is_some() || set.mtime.is_some() {
            Cause::Utimes
        } else {
            return self.getattr(ino, set.fh);
        };
        if set.size == Some(0) {
            self.before_freeing(None, Some(ino))?;
        } else {
            self.before_change(ino)?;
        }
        let attr = self.apply_setattr(caller, ino, &set)?;
        // Times set by a program (utimensat: touch, touch -m, cp -p, tar),
        // a change of its own. The kernel's writeback cache also sends
        // mtime alone as it flushes the times of its writes: through a
        // write handle (FATTR_FH, which utimensat never names) while one
        // is open, but with none after a rename or unlink of a file no one
        // holds open; there mtime alone stays ambiguous and counts as a
        // flush. The kernel never flushes atime.
        let by_program = set.fh.is_none() && set.size.is_none();
        let set_times = match (set.atime.is_some(), set.mtime.is_some()) {
            (true, true) => true,
            (false, false) => false,
            (true, false) => by_program,
            (false, true) => by_program && !self.writeback(),
        };
        self.after_change_times(caller, ino, cause, set_times);
        Ok(attr)
    }

    fn apply_setattr(&self, caller: &Caller, ino: InodeNo, set: &SetAttr) -> Result<Attr> {
        // History secured the state before (above): a copy-up for a
        // truncate copies only what it keeps.
        let (inode, _) = self.writable_node_for(caller, ino, (false, set.size))?;
        self.mark_attrs_set(&inode)?;
        let fd = inode.fd();
        let is_symlink = inode.kind == libc::S_IFLNK;
        if let Some(mode) = set.mode {
            if is_symlink {
                return Err(errno(libc::EOPNOTSUPP));
            }
            // The kernel has checked ownership and already cleared the
            // set-group-ID bit if the caller may not set it (it knows all of
            // the caller's groups); the mode it sends is applied as is.
            sys::chmod_fd(fd, mode & 0o7777)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            let uid = set.uid.unwrap_or(u32::MAX);
            let gid = set.gid.unwrap_or(u32::MAX);
            creds::as_caller(caller, || sys::chown_fd(fd, uid, gid))?;
        }
        if let Some(size) = set.size {
            let handle = set.fh.and_then(|fh| self.handles.get(fh).ok());
            let old_size = sys::fstat(fd).map_or(0, |st| st.st_size as u64);
            let cut = || -> Result<()> {
                match handle.as_deref() {
                    Some(Handle::File { fd: hfd, .. }) => {
                        creds::as_caller(caller, || sys::ftruncate(hfd.as_fd(), size))?
                    }
                    _ => {
                        if inode.is_dir() {
                            return Err(errno(libc::EISDIR));
                        }
                        creds::as_caller(caller, || sys::truncate_fd_path(fd, size))?
                    }
                }
                Ok(())
            };
            match self.patched(&inode)? {
                Some(p) => p.truncate_with(size, cut)?,
                None => cut()?,
            }
            // What lay past the new end is gone even if the file grows
            // back. Marked once it is gone: a version built in between
            // would take the range and read the bytes still there.
            self.wrote_range(ino, old_size.min(size), u64::MAX);
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let atime = set.atime.unwrap_or(TimeSpec::Omit);
            let mtime = set.mtime.unwrap_or(TimeSpec::Omit);
            // Not between a write's reading and putting back the mtime.
            let _times = self.writeback().then(|| self.mtime_lock(ino).lock());
            match creds::as_caller(caller, || sys::utimens_fd(fd, atime, mtime)) {
                // With the writeback cache the kernel keeps mtime itself and
                // turns touch(1)'s "now" into an explicit time, which only the
                // owner may set. The kernel has already allowed the change
                // (default_permissions), so it is applied as the daemon.
                Err(e) if e.raw_os_error() == Some(libc::EPERM) && self.writeback() => {
                    sys::utimens_fd(fd, atime, mtime)?
                }
                other => other?,
            }
        }
        self.getattr(ino, set.fh)
    }

    /// Before a union directory's own attributes change: its copy says so
    /// (`format::mark_attrs_set`). Before, not after: a crash in between
    /// errs towards the copy's attributes, as without the mark.
    fn mark_attrs_set(&self, node: &super::inodes::Node) -> Result<()> {
        let Some(u) = self.union() else {
            return Ok(());
        };
        if node.is_dir() {
            crate::union::format::mark_attrs_set(node.fd(), u.ns)?;
        }
        Ok(())
    }

    pub fn readlink(&self, caller: &Caller, ino: InodeNo) -> Result<Vec<u8>> {
        self.source_of(ino).readlink(self, caller)
    }

    pub(super) fn live_readlink(&self, ino: InodeNo) -> Result<Vec<u8>> {
        let inode = self.node(ino)?;
        if inode.kind != libc::S_IFLNK {
            return Err(errno(libc::EINVAL));
        }
        Ok(sys::readlink_fd(inode.fd())?)
    }

    /// Reads xattr `name`; `size` 0 asks only for the value's length.
    pub fn getxattr(
        &self,
        caller: &Caller,
        ino: InodeNo,
        name: &OsStr,
        size: u32,
    ) -> Result<Xattr> {
        self.source_of(ino).getxattr(self, caller, name, size)
    }

    pub(super) fn live_getxattr(
        &self,
        caller: &Caller,
        ino: InodeNo,
        name: &OsStr,
        size: u32,
    ) -> Result<Xattr> {
        self.refuse_union_xattr(name)?;
        let node = self.node(ino)?;
        // The kernel asks security.capability at a file's first write and
        // at each chown, while the writer holds it open.
        if let Some(h) = self.handles.open_file(ino, &node.inode.key, &self.inodes) {
            if let Handle::File { fd, .. } = &*h {
                return Xattr::read_open(caller, fd.as_fd(), name, size);
            }
        }
        match self.root_copy_shown(ino) {
            Some(copy) => Xattr::read(caller, copy.as_fd(), name, size),
            None => Xattr::read(caller, node.fd(), name, size),
        }
    }

    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: InodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        let _set = self.changing();
        self.source_of(ino).check_writable()?;
        self.refuse_union_xattr(name)?;
        self.before_change(ino)?;
        let inode = self.writable_node(caller, ino)?;
        self.mark_attrs_set(&inode)?;
        let cname = sys::cstr(name)?;
        // Setting an access ACL may clear the set-group-ID bit for a caller
        // outside the file's group: membership must be known up front.
        let set = || sys::setxattr_fd(inode.fd(), &cname, value, flags);
        if name.as_encoded_bytes() == b"system.posix_acl_access" {
            creds::as_caller_with_groups(caller, set)?;
        } else {
            creds::as_caller(caller, set)?;
        }
        self.after_change(caller, ino, Cause::Xattr);
        Ok(())
    }

    pub fn listxattr(&self, caller: &Caller, ino: InodeNo, size: u32) -> Result<Xattr> {
        self.source_of(ino).listxattr(self, caller, size)
    }

    pub(super) fn live_listxattr(&self, caller: &Caller, ino: InodeNo, size: u32) -> Result<Xattr> {
        if self.union().is_some() || self.clones_on() {
            return self.union_listxattr(caller, ino, size);
        }
        Xattr::list(caller, self.node(ino)?.fd(), size)
    }

    pub fn removexattr(&self, caller: &Caller, ino: InodeNo, name: &OsStr) -> Result<()> {
        let _set = self.changing();
        self.source_of(ino).check_writable()?;
        self.refuse_union_xattr(name)?;
        self.before_change(ino)?;
        let inode = self.writable_node(caller, ino)?;
        self.mark_attrs_set(&inode)?;
        let cname = sys::cstr(name)?;
        creds::as_caller(caller, || sys::removexattr_fd(inode.fd(), &cname))?;
        self.after_change(caller, ino, Cause::Xattr);
        Ok(())
    }

    pub fn access(&self, caller: &Caller, ino: InodeNo, mask: i32) -> Result<()> {
        let source = self.source_of(ino);
        if mask & libc::W_OK != 0 {
            source.check_writable()?;
        }
        source.access(self, caller, mask)
    }

    pub(super) fn live_access(&self, caller: &Caller, ino: InodeNo, mask: i32) -> Result<()> {
        let inode = self.node(ino)?;
        if inode.kind == libc::S_IFLNK {
            return Ok(());
        }
        let copy = self.root_copy_shown(ino);
        let fd = copy.as_ref().map_or(inode.fd(), |c| c.as_fd());
        Ok(creds::as_caller(caller, || sys::access_fd(fd, mask))?)
    }

    /// The file system changes go to, as overlayfs tells: a union's
    /// upper branch's.
    pub fn statfs(&self) -> Result<StatFs> {
        match self.root_copy_shown(InodeNo::ROOT) {
            Some(upper) => Ok(sys::fstatvfs(upper.as_fd())?),
            None => Ok(sys::fstatvfs(self.branch.root_fd())?),
        }
    }
}
