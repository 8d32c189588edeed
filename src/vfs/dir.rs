//! Directories: opendir, readdir, readdirplus, releasedir, fsyncdir.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use parking_lot::Mutex;

use super::inodes::Handle;
use super::{errno, Caller, Entry, InodeNo, Result, Vfs};
use crate::sys::{self, creds};

const GETDENTS_BUF: usize = 64 * 1024;

/// The read position of an open directory. Offsets are the backing file
/// system's own cookies, so a seek to any offset the kernel was given
/// resumes exactly there, even after entries were added or removed.
pub struct DirStream {
    fd: OwnedFd,
    /// Offset of the first entry in `pending`.
    pos: i64,
    pending: VecDeque<sys::DirEntry>,
    buf: Vec<u8>,
}

impl DirStream {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn seek(&mut self, offset: i64) -> Result<()> {
        if offset != self.pos || (offset == 0 && self.pending.is_empty()) {
            sys::lseek(self.fd.as_fd(), offset, libc::SEEK_SET)?;
            self.pending.clear();
            self.pos = offset;
        }
        Ok(())
    }

    fn peek(&mut self) -> Result<Option<&sys::DirEntry>> {
        if self.pending.is_empty() {
            let entries = sys::getdents(self.fd.as_fd(), &mut self.buf)?;
            self.pending.extend(entries);
        }
        Ok(self.pending.front())
    }

    fn advance(&mut self) {
        if let Some(e) = self.pending.pop_front() {
            self.pos = e.next_offset;
        }
    }
}

/// One directory entry for the kernel. `offset` resumes after it.
pub struct DirEntry<'a> {
    pub ino: InodeNo,
    pub offset: i64,
    /// S_IFMT bits of the entry's type (0 if unknown).
    pub kind: u32,
    pub name: &'a OsStr,
}

fn dtype_to_kind(dtype: u8) -> u32 {
    match dtype {
        libc::DT_REG => libc::S_IFREG,
        libc::DT_DIR => libc::S_IFDIR,
        libc::DT_LNK => libc::S_IFLNK,
        libc::DT_CHR => libc::S_IFCHR,
        libc::DT_BLK => libc::S_IFBLK,
        libc::DT_FIFO => libc::S_IFIFO,
        libc::DT_SOCK => libc::S_IFSOCK,
        _ => 0,
    }
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

impl Vfs {
    pub fn opendir(&self, caller: &Caller, ino: InodeNo, flags: i32) -> Result<u64> {
        let inode = self.inodes.node(ino)?;
        if !inode.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let access = libc::O_RDONLY | libc::O_DIRECTORY | (flags & libc::O_NOATIME);
        let fd = creds::as_caller(caller, || sys::reopen(inode.fd(), access))?;
        let stream = DirStream {
            fd,
            pos: 0,
            pending: VecDeque::new(),
            buf: vec![0u8; GETDENTS_BUF],
        };
        Ok(self.handles.insert(Handle::Dir {
            ino,
            stream: Mutex::new(stream),
        }))
    }

    /// Feeds entries from `offset` on to `add` until it reports the reply
    /// buffer full (returns true) or the directory ends.
    pub fn readdir(
        &self,
        fh: u64,
        offset: i64,
        mut add: impl FnMut(&DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.walk_dir(fh, offset, |vfs, dir_ino, e| {
            let key = crate::store::BackingKey {
                branch: vfs.branch.id().0,
                dev: 0,
                ino: e.ino,
            };
            let ino = vfs.dirent_ino(dir_ino, key, &e.name)?;
            Ok(add(&DirEntry {
                ino,
                offset: e.next_offset,
                kind: dtype_to_kind(e.dtype),
                name: OsStr::from_bytes(&e.name),
            }))
        })
    }

    /// Like [`Vfs::readdir`], but each entry (except `.` and `..`) is looked
    /// up and carries attributes; the kernel takes a reference on each entry
    /// that `add` accepts, and entries it refuses are forgotten again.
    pub fn readdirplus(
        &self,
        fh: u64,
        offset: i64,
        mut add: impl FnMut(&DirEntry<'_>, Option<&Entry>) -> bool,
    ) -> Result<()> {
        self.walk_dir(fh, offset, |vfs, dir_ino, e| {
            let name = OsStr::from_bytes(&e.name);
            let kind = dtype_to_kind(e.dtype);
            if is_dot(&e.name) {
                let ino = if e.name == b"." {
                    dir_ino
                } else {
                    InodeNo::ROOT
                };
                let dirent = DirEntry {
                    ino,
                    offset: e.next_offset,
                    kind,
                    name,
                };
                return Ok(add(&dirent, None));
            }
            let entry = match vfs.lookup(dir_ino, name) {
                Ok(entry) => entry,
                // Removed since getdents saw it: skip, as a fresh read would.
                Err(err) if err.errno_is(libc::ENOENT) => return Ok(false),
                Err(err) => return Err(err),
            };
            let dirent = DirEntry {
                ino: entry.attr.ino,
                offset: e.next_offset,
                kind: entry.attr.kind(),
                name,
            };
            let full = add(&dirent, Some(&entry));
            if full {
                vfs.forget(entry.attr.ino, 1);
            }
            Ok(full)
        })
    }

    fn walk_dir(
        &self,
        fh: u64,
        offset: i64,
        mut each: impl FnMut(&Vfs, InodeNo, &sys::DirEntry) -> Result<bool>,
    ) -> Result<()> {
        let handle = self.handles.get(fh)?;
        let Handle::Dir { ino, stream } = &*handle else {
            return Err(errno(libc::ENOTDIR));
        };
        let mut stream = stream.lock();
        stream.seek(offset)?;
        let in_root = *ino == InodeNo::ROOT;
        while let Some(e) = stream.peek()? {
            let hidden = self.branch.is_reserved(in_root, OsStr::from_bytes(&e.name));
            if !hidden && each(self, *ino, e)? {
                break;
            }
            stream.advance();
        }
        Ok(())
    }

    /// d_ino for an entry: the number stat would show. getdents gives no
    /// device, so the entry is taken to be on its directory's device.
    fn dirent_ino(
        &self,
        dir: InodeNo,
        mut key: crate::store::BackingKey,
        name: &[u8],
    ) -> Result<InodeNo> {
        if name == b"." {
            return Ok(dir);
        }
        if name == b".." {
            return Ok(if dir == InodeNo::ROOT {
                InodeNo::ROOT
            } else {
                self.parent_hint(&self.inodes.node(dir)?)
            });
        }
        key.dev = self.inodes.get(dir)?.key.dev;
        Ok(self.inodes.number_for(key)?)
    }

    fn parent_hint(&self, dir: &super::inodes::Node) -> InodeNo {
        let parent = sys::fstatat(dir.fd(), c"..").ok();
        parent
            .map(|st| self.inodes.key_of(&st))
            .and_then(|key| self.inodes.number_for(key).ok())
            .unwrap_or(InodeNo::ROOT)
    }

    pub fn releasedir(&self, fh: u64) -> Result<()> {
        self.handles.remove(fh).map(drop)
    }
}
