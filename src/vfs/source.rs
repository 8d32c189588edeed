//! What a node resolves through: the stack of sources of
//! docs/ARCHITECTURE.md "Union mounts". Every `Vfs` method resolves its
//! inode or handle here once (`source_of`, `handle_source`) and calls the
//! read-side operation of the answer, or asks `writable()` before a change.
//! A new kind of source (a clone: a `Past` under a fresh writable `Dir`
//! layer) is one more variant whose arms are in this file; the `Vfs`
//! methods do not change.
//!
//! The sources built: the live stack of `Dir` branches (an inode's copy in
//! its branch and, for a union directory, its copies below, `Inode::layers`;
//! its operations are the `live_*` methods of attr.rs, dir.rs, file.rs and
//! namespace.rs, with union.rs), and the past (history as of an instant:
//! the view nodes of `views/`).

use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use super::dir::DirEntry;
use super::dircache::OpenedDir;
use super::views::{self, VIEW_BIT};
use super::{errno, Attr, Caller, Entry, InodeNo, Opened, Result, Vfs, Xattr};

/// The source an inode number resolves through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// The live tree: the stack of `Dir` branches.
    Live(InodeNo),
    /// History as of an instant: a time-travel view node. Read-only.
    Past(InodeNo),
}

/// The source an open file or directory handle reads through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HandleSource {
    Live(u64),
    Past(u64),
}

impl Vfs {
    /// The one place an inode number's source is decided. View numbers are
    /// ephemeral and have a half of the number space of their own (bit 63),
    /// so no table is needed.
    pub(super) fn source_of(&self, ino: InodeNo) -> Source {
        if ino.0 & VIEW_BIT != 0 {
            Source::Past(ino)
        } else {
            Source::Live(ino)
        }
    }

    /// Whether `ino` is a node of the past (a history view).
    pub fn is_view(&self, ino: InodeNo) -> bool {
        matches!(self.source_of(ino), Source::Past(_))
    }

    /// The one place a handle's source is decided (handle numbers are
    /// partitioned as inode numbers are).
    pub(super) fn handle_source(&self, fh: u64) -> HandleSource {
        if fh & VIEW_BIT != 0 {
            HandleSource::Past(fh)
        } else {
            HandleSource::Live(fh)
        }
    }
}

impl Source {
    /// Whether a change may be made through it. A live union node copies
    /// up first, and a union with no read-write branch still answers EROFS
    /// when it tries.
    pub fn writable(self) -> bool {
        match self {
            Source::Live(_) => true,
            Source::Past(_) => false,
        }
    }

    /// EROFS unless a change may be made through it.
    pub fn check_writable(self) -> Result<()> {
        if self.writable() {
            Ok(())
        } else {
            Err(errno(libc::EROFS))
        }
    }

    /// How long the kernel may cache its attributes, if the source fixes
    /// it: an instant never changes.
    pub fn fixed_ttl(self) -> Option<Duration> {
        match self {
            Source::Live(_) => None,
            Source::Past(_) => Some(views::IMMUTABLE_TTL),
        }
    }

    /// `name` in this directory; the kernel takes a reference on it.
    pub fn lookup(self, vfs: &Vfs, caller: &Caller, name: &OsStr) -> Result<Entry> {
        match self {
            Source::Live(dir) => vfs.live_lookup(caller, dir, name),
            Source::Past(dir) => vfs
                .view_lookup(caller, dir, name)
                .inspect(|e| vfs.note_view_name(dir, name, e.attr.ino)),
        }
    }

    pub fn forget(self, vfs: &Vfs, n: u64) {
        match self {
            Source::Live(ino) => vfs.inodes.forget(ino, n),
            Source::Past(ino) => vfs.view_forget(ino, n),
        }
    }

    /// Attributes; `fh`, an open handle of the node, if the request came
    /// through one.
    pub fn getattr(self, vfs: &Vfs, fh: Option<u64>) -> Result<Attr> {
        match self {
            Source::Live(ino) => vfs.live_getattr(ino, fh),
            Source::Past(ino) => vfs.view_getattr(ino),
        }
    }

    pub fn readlink(self, vfs: &Vfs, caller: &Caller) -> Result<Vec<u8>> {
        match self {
            Source::Live(ino) => vfs.live_readlink(ino),
            Source::Past(ino) => vfs.view_readlink(caller, ino),
        }
    }

    pub fn getxattr(self, vfs: &Vfs, caller: &Caller, name: &OsStr, size: u32) -> Result<Xattr> {
        match self {
            Source::Live(ino) => vfs.live_getxattr(caller, ino, name, size),
            Source::Past(ino) => vfs.view_getxattr(caller, ino, name, size),
        }
    }

    pub fn listxattr(self, vfs: &Vfs, caller: &Caller, size: u32) -> Result<Xattr> {
        match self {
            Source::Live(ino) => vfs.live_listxattr(caller, ino, size),
            Source::Past(ino) => vfs.view_listxattr(caller, ino, size),
        }
    }

    /// access(2) for read and search (writing is `writable`'s).
    pub fn access(self, vfs: &Vfs, caller: &Caller, mask: i32) -> Result<()> {
        match self {
            Source::Live(ino) => vfs.live_access(caller, ino, mask),
            // The kernel checks them against the attributes shown.
            Source::Past(_) => Ok(()),
        }
    }

    pub fn opendir(self, vfs: &Vfs, caller: &Caller, flags: i32) -> Result<OpenedDir> {
        match self {
            Source::Live(ino) => vfs.live_opendir(caller, ino, flags),
            Source::Past(ino) => Ok(OpenedDir {
                fh: vfs.view_opendir(caller, ino)?,
                cache: vfs.view_dir_cache(ino),
            }),
        }
    }

    /// Opens a file; opens for writing have asked `writable` first.
    pub fn open(self, vfs: &Vfs, caller: &Caller, flags: i32) -> Result<Opened> {
        match self {
            Source::Live(ino) => vfs.live_open(caller, ino, flags),
            Source::Past(ino) => vfs.view_open(caller, ino),
        }
    }
}

impl HandleSource {
    /// Whether data may be written through it. A handle of a read-only
    /// source is never open for writing: EBADF, as for write(2) on a
    /// descriptor opened O_RDONLY.
    pub fn check_writable(self) -> Result<()> {
        match self {
            HandleSource::Live(_) => Ok(()),
            HandleSource::Past(_) => Err(errno(libc::EBADF)),
        }
    }

    /// Whether the backing file system can copy from it (copy_file_range):
    /// the past may be history's chunks. The kernel then falls back to
    /// read and write.
    pub fn check_copyable(self) -> Result<()> {
        match self {
            HandleSource::Live(_) => Ok(()),
            HandleSource::Past(_) => Err(errno(libc::EOPNOTSUPP)),
        }
    }

    /// Feeds entries from `offset` on to `add` (see `Vfs::readdir` and
    /// `Vfs::readdirplus`: with `plus`, each is looked up).
    pub fn readdir(
        self,
        vfs: &Vfs,
        caller: &Caller,
        offset: i64,
        plus: bool,
        mut add: impl FnMut(&DirEntry<'_>, Option<&Entry>) -> bool,
    ) -> Result<()> {
        match self {
            HandleSource::Live(fh) if plus => vfs.live_readdirplus(fh, offset, caller, add),
            HandleSource::Live(fh) => vfs.live_readdir(fh, offset, caller, |d| add(d, None)),
            HandleSource::Past(fh) => vfs.view_readdir(caller, fh, offset, add, plus),
        }
    }

    pub fn releasedir(self, vfs: &Vfs) -> Result<()> {
        match self {
            HandleSource::Live(fh) => vfs.handles.remove(fh).map(drop),
            HandleSource::Past(fh) => vfs.view_release(fh),
        }
    }

    pub fn read(self, vfs: &Vfs, offset: u64, size: u32) -> Result<Vec<u8>> {
        match self {
            HandleSource::Live(fh) => vfs.live_read(fh, offset, size),
            HandleSource::Past(fh) => vfs.view_read(fh, offset, size),
        }
    }

    pub fn lseek(self, vfs: &Vfs, offset: i64, whence: i32) -> Result<i64> {
        match self {
            HandleSource::Live(fh) => vfs.live_lseek(fh, offset, whence),
            HandleSource::Past(fh) => vfs.view_lseek(fh, offset, whence),
        }
    }

    /// Runs `f` with the descriptor the kernel may read the file from
    /// itself (passthrough).
    pub fn backing<T>(self, vfs: &Vfs, f: impl FnOnce(BorrowedFd<'_>) -> Result<T>) -> Result<T> {
        match self {
            HandleSource::Live(fh) => vfs.with_file(fh, |fd, _| f(fd)),
            HandleSource::Past(fh) => vfs.view_backing(fh, f),
        }
    }

    /// Whether flushes are wanted (see `Vfs::flush`).
    pub fn flush(self, vfs: &Vfs) -> Result<bool> {
        match self {
            HandleSource::Live(fh) => vfs.live_flush(fh),
            // Nothing is written through it: no session ends. But ENOSYS
            // is the kernel's cue to stop sending flushes for the whole
            // mount, live files' included (with the writeback cache it
            // sends them to handles opened FOPEN_NOFLUSH too): the answer
            // must be the mount's.
            HandleSource::Past(_) => Ok(vfs.capture().is_some()),
        }
    }

    /// Closes the handle; returns the live inode it belonged to.
    pub fn release(self, vfs: &Vfs) -> Result<Option<InodeNo>> {
        match self {
            HandleSource::Live(fh) => vfs.live_release(fh),
            HandleSource::Past(fh) => vfs.view_release(fh).map(|()| None),
        }
    }

    pub fn fsync(self, vfs: &Vfs, datasync: bool) -> Result<()> {
        match self {
            HandleSource::Live(fh) => vfs.live_fsync(fh, datasync),
            // An instant is already durable in history.
            HandleSource::Past(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errnos a change through a read-only source gives are the ones
    /// the views gave before the sources existed (pjdfstest and the
    /// time-travel tests compare them).
    #[test]
    fn the_past_refuses_changes_with_its_old_errnos() {
        let past = Source::Past(InodeNo(VIEW_BIT | 5));
        assert!(!past.writable());
        assert_eq!(
            past.check_writable().map_err(|e| e.errno()),
            Err(libc::EROFS)
        );
        assert_eq!(past.fixed_ttl(), Some(views::IMMUTABLE_TTL));
        let live = Source::Live(InodeNo(5));
        assert!(live.writable() && live.check_writable().is_ok());
        assert_eq!(live.fixed_ttl(), None);
        let fh = HandleSource::Past(VIEW_BIT | 1);
        assert_eq!(fh.check_writable().map_err(|e| e.errno()), Err(libc::EBADF));
        assert_eq!(
            fh.check_copyable().map_err(|e| e.errno()),
            Err(libc::EOPNOTSUPP)
        );
        assert!(HandleSource::Live(1).check_writable().is_ok());
    }
}
