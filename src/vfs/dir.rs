//! Directories: opendir, readdir, readdirplus, releasedir, fsyncdir.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::dircache::{DirCache, OpenedDir};
use super::inodes::Handle;
use super::{errno, Caller, Entry, InodeNo, Result, Vfs, VfsError};
use crate::sys::{self, creds};

const GETDENTS_BUF: usize = 64 * 1024;

/// The read position of an open directory. Offsets are the backing file
/// system's own cookies, so a seek to any offset the kernel was given
/// resumes exactly there, even after entries were added or removed.
pub struct DirStream {
    fd: OwnedFd,
    /// Offset of the first entry in `pending`.
    pos: i64,
    pending: VecDeque<Dirent>,
    buf: sys::DirBuf,
    /// A union directory's merged listing: entries in cookie order, and
    /// the read position in it. Read at opendir when the kernel is to read
    /// it, else at the first readdir, and again at each rewind after one.
    merged: Option<(Vec<Dirent>, usize)>,
    union: bool,
    served: bool,
    /// The directory's backing key when `fd` was opened: its entries'
    /// numbers are of that branch and device (a copy-up since moves the
    /// inode's key, not this stream).
    key: crate::store::BackingKey,
    /// Access flags `fd` was opened with.
    access: i32,
}

impl DirStream {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A union listing to (re)read before serving `offset`: none yet, or
    /// a rewind after one was served (a rewind shows changes, as natively,
    /// and the kernel caches what it reads from offset 0).
    fn needs_merge(&self, offset: i64) -> bool {
        self.union && (self.merged.is_none() || (offset == 0 && self.served))
    }

    fn seek(&mut self, offset: i64) -> Result<()> {
        if let Some((entries, at)) = &mut self.merged {
            *at = entries.partition_point(|d| d.cookie < offset);
            return Ok(());
        }
        if offset != self.pos || (offset == 0 && self.pending.is_empty()) {
            sys::lseek(self.fd.as_fd(), offset, libc::SEEK_SET)?;
            self.pending.clear();
            self.pos = offset;
        }
        Ok(())
    }

    /// The next entry, reading a new batch when needed. `numbers`, if
    /// given, maps entries to their `d_ino` a batch at a time (entries read
    /// for a readdirplus request carry none yet).
    fn peek(&mut self, numbers: Option<&NumberBatch<'_>>) -> Result<Option<&Dirent>> {
        if let Some((entries, at)) = &self.merged {
            return Ok(entries.get(*at));
        }
        if self.pending.is_empty() {
            let entries = sys::getdents(self.fd.as_fd(), &mut self.buf)?;
            self.pending.extend(entries.into_iter().map(|e| Dirent {
                e,
                ino: None,
                cookie: 0,
            }));
        }
        if let Some(resolve) = numbers {
            if self.pending.front().is_some_and(|d| d.ino.is_none()) {
                let raw: Vec<&sys::DirEntry> = self
                    .pending
                    .iter()
                    .filter(|d| d.ino.is_none())
                    .map(|d| &d.e)
                    .collect();
                let inos = resolve(&raw)?;
                let unresolved = self.pending.iter_mut().filter(|d| d.ino.is_none());
                for (d, ino) in unresolved.zip(inos) {
                    d.ino = Some(ino);
                }
            }
        }
        Ok(self.pending.front())
    }

    fn advance(&mut self) {
        if let Some((_, at)) = &mut self.merged {
            *at += 1;
            return;
        }
        if let Some(d) = self.pending.pop_front() {
            self.pos = d.e.next_offset;
        }
    }
}

/// A raw entry and, for plain readdir, the inode number shown for it.
pub(super) struct Dirent {
    pub e: sys::DirEntry,
    pub ino: Option<InodeNo>,
    /// In a merged listing: the position a seek to it resumes at.
    pub cookie: i64,
}

type NumberBatch<'a> = dyn Fn(&[&sys::DirEntry]) -> Result<Vec<InodeNo>> + 'a;

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
    pub fn opendir(&self, caller: &Caller, ino: InodeNo, flags: i32) -> Result<OpenedDir> {
        self.source_of(ino).opendir(self, caller, flags)
    }

    pub(super) fn live_opendir(
        &self,
        caller: &Caller,
        ino: InodeNo,
        flags: i32,
    ) -> Result<OpenedDir> {
        // No sandbox commit half done is listed.
        let _set = self.changing();
        let inode = self.node(ino)?;
        if !inode.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        self.fill_if_unfilled(&inode)?;
        let (cache, stamp) = self.listing_cache(&inode);
        let access = libc::O_RDONLY | libc::O_DIRECTORY | (flags & libc::O_NOATIME);
        let union = inode.has_layers();
        let fd = match creds::as_caller(caller, || sys::reopen_dir(inode.fd(), access)) {
            Err(e) if union && self.gone_mid_merge(&e) => {
                self.surviving_copy(caller, &inode, access)?
            }
            r => r?,
        };
        self.dir_opened(ino, fd.as_fd());
        // A listing the kernel keeps is not read unless the kernel loses
        // it; one it re-reads is merged now, so errors come from opendir.
        let merged = if union && cache == DirCache::Fresh {
            Some((self.merged_listing(&inode)?, 0))
        } else {
            None
        };
        let stream = DirStream {
            fd,
            pos: 0,
            pending: VecDeque::new(),
            buf: sys::DirBuf::new(GETDENTS_BUF),
            merged,
            union,
            served: false,
            key: inode.key,
            access,
        };
        let fh = self.handles.insert(Handle::Dir {
            ino,
            stream: Mutex::new(stream),
        });
        if cache == DirCache::Fresh {
            inode.listed.store(stamp, Ordering::Release);
        }
        Ok(OpenedDir { fh, cache })
    }

    /// Feeds entries from `offset` on to `add` until it reports the reply
    /// buffer full (returns true) or the directory ends.
    pub fn readdir(
        &self,
        fh: u64,
        offset: i64,
        caller: &Caller,
        mut add: impl FnMut(&DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.handle_source(fh)
            .readdir(self, caller, offset, false, |d, _| add(d))
    }

    pub(super) fn live_readdir(
        &self,
        fh: u64,
        offset: i64,
        caller: &Caller,
        mut add: impl FnMut(&DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let _set = self.changing();
        let handle = self.handles.get(fh)?;
        let dir = handle.ino();
        let key = match &*handle {
            Handle::Dir { stream, .. } => stream.lock().key,
            Handle::File { .. } => return Err(errno(libc::ENOTDIR)),
        };
        let resolve = |batch: &[&sys::DirEntry]| self.dirent_inos(dir, &key, batch);
        self.walk_dir(caller, fh, offset, Some(&resolve), |_, _, d| {
            Ok(add(&DirEntry {
                ino: d.ino.ok_or(VfsError::WrongKind)?,
                offset: d.e.next_offset,
                kind: self.entry_kind(dir, &d.e),
                name: OsStr::from_bytes(&d.e.name),
            }))
        })
    }

    /// An entry's type; where the backing file system does not say
    /// (DT_UNKNOWN: XFS without ftype, some network file systems), from
    /// the entry itself, as `find` and `rm -r` would ask natively (the
    /// kernel has no "unknown" to pass on: it would read as a file, and a
    /// directory would not be descended into). Union listings resolved
    /// it when merging.
    fn entry_kind(&self, dir: InodeNo, e: &sys::DirEntry) -> u32 {
        if e.dtype != libc::DT_UNKNOWN {
            return dtype_to_kind(e.dtype);
        }
        let Ok(name) = std::ffi::CString::new(e.name.clone()) else {
            return 0;
        };
        self.node(dir)
            .ok()
            .and_then(|n| sys::fstatat(n.fd(), &name).ok())
            .map_or(0, |st| st.st_mode & libc::S_IFMT)
    }

    /// Like [`Vfs::readdir`], but each entry (except `.` and `..`) is looked
    /// up and carries attributes; the kernel takes a reference on each entry
    /// that `add` accepts, and entries it refuses are forgotten again.
    pub fn readdirplus(
        &self,
        fh: u64,
        offset: i64,
        caller: &Caller,
        add: impl FnMut(&DirEntry<'_>, Option<&Entry>) -> bool,
    ) -> Result<()> {
        self.handle_source(fh)
            .readdir(self, caller, offset, true, add)
    }

    pub(super) fn live_readdirplus(
        &self,
        fh: u64,
        offset: i64,
        caller: &Caller,
        mut add: impl FnMut(&DirEntry<'_>, Option<&Entry>) -> bool,
    ) -> Result<()> {
        let _set = self.changing();
        let mut added = 0usize;
        // An entry that cannot be looked up ends the reply early: the
        // entries already in it carry references the kernel must receive.
        let mut deferred: Option<VfsError> = None;
        let result = self.walk_dir(caller, fh, offset, None, |vfs, dir_ino, d| {
            let e = &d.e;
            let name = OsStr::from_bytes(&e.name);
            let kind = dtype_to_kind(e.dtype);
            if is_dot(&e.name) {
                let ino = match e.name.as_slice() {
                    b"." => dir_ino,
                    _ if dir_ino == InodeNo::ROOT => InodeNo::ROOT,
                    _ => vfs.parent_hint(&vfs.inodes.node(dir_ino)?),
                };
                let dirent = DirEntry {
                    ino,
                    offset: e.next_offset,
                    kind,
                    name,
                };
                let full = add(&dirent, None);
                added += usize::from(!full);
                return Ok(full);
            }
            let entry = match vfs.lookup(caller, dir_ino, name) {
                Ok(entry) => entry,
                // Removed since getdents saw it: skip, as a fresh read would.
                Err(err) if err.errno_is(libc::ENOENT) => {
                    tracing::debug!("readdirplus skips {name:?} of {dir_ino:?}: {err}");
                    return Ok(false);
                }
                Err(err) if added > 0 => {
                    deferred = Some(err);
                    return Ok(true);
                }
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
            } else {
                added += 1;
            }
            Ok(full)
        });
        if let Some(err) = deferred {
            tracing::debug!("readdirplus stopped early: {err}");
        }
        result
    }

    fn walk_dir(
        &self,
        caller: &Caller,
        fh: u64,
        offset: i64,
        numbers: Option<&NumberBatch<'_>>,
        mut each: impl FnMut(&Vfs, InodeNo, &Dirent) -> Result<bool>,
    ) -> Result<()> {
        let handle = self.handles.get(fh)?;
        let Handle::Dir { ino, stream } = &*handle else {
            return Err(errno(libc::ENOTDIR));
        };
        let mut stream = stream.lock();
        if offset == 0 && stream.served && !stream.union {
            self.restart_if_moved(caller, *ino, &mut stream)?;
        }
        if stream.needs_merge(offset) {
            let dir = self.node(*ino)?;
            stream.merged = Some((self.merged_listing(&dir)?, 0));
        }
        stream.served = true;
        stream.seek(offset)?;
        let in_root = *ino == InodeNo::ROOT;
        // A union directory read as it is (no copies below) may still hold
        // whiteouts: an opaque one a snapmerge folded them into.
        let raw_in_union = !stream.union && self.union().is_some();
        while let Some(d) = stream.peek(numbers)? {
            let hidden = self.is_own_name(in_root, OsStr::from_bytes(&d.e.name))
                || (raw_in_union
                    && d.e.dtype == libc::DT_CHR
                    && self.is_whiteout_at(*ino, &d.e.name));
            if !hidden && each(self, *ino, d)? {
                break;
            }
            stream.advance();
        }
        Ok(())
    }

    /// Whether entry `name` of directory `dir` is a whiteout.
    fn is_whiteout_at(&self, dir: InodeNo, name: &[u8]) -> bool {
        let Ok(cname) = std::ffi::CString::new(name) else {
            return false;
        };
        self.node(dir)
            .ok()
            .and_then(|n| sys::fstatat(n.fd(), &cname).ok())
            .is_some_and(|st| crate::union::format::is_whiteout(&st))
    }

    /// A rewind of a stream whose directory was copied up since it was
    /// opened (a lower directory that took an entry): it reads the
    /// directory as it is now, as a rewind must, merged if it is. (Read on
    /// from where it was, it keeps its branch's listing: entries changed
    /// after opendir may show or not.)
    fn restart_if_moved(
        &self,
        caller: &Caller,
        ino: InodeNo,
        stream: &mut DirStream,
    ) -> Result<()> {
        let inode = self.node(ino)?;
        if inode.key == stream.key {
            return Ok(());
        }
        let access = stream.access;
        stream.fd = creds::as_caller(caller, || sys::reopen_dir(inode.fd(), access))?;
        stream.key = inode.key;
        stream.union = inode.has_layers();
        stream.merged = None;
        stream.pending.clear();
        stream.pos = 0;
        // Stays at 0 and reads from there: no lseek is needed.
        sys::lseek(stream.fd.as_fd(), 0, libc::SEEK_SET)?;
        Ok(())
    }

    /// d_ino for a batch of entries: the numbers stat would show. getdents
    /// gives no device, so entries are taken to be on their directory's,
    /// and of its branch (in a union, a directory whose only copy is in a
    /// lower branch is listed here too).
    fn dirent_inos(
        &self,
        dir: InodeNo,
        dir_key: &crate::store::BackingKey,
        batch: &[&sys::DirEntry],
    ) -> Result<Vec<InodeNo>> {
        let key = |e: &&sys::DirEntry| crate::store::BackingKey {
            branch: dir_key.branch,
            dev: dir_key.dev,
            ino: e.ino,
        };
        let keys: Vec<_> = batch.iter().filter(|e| !is_dot(&e.name)).map(key).collect();
        let mut mapped = self.inodes.numbers_for(&keys)?.into_iter();
        let mut inos = Vec::with_capacity(batch.len());
        for e in batch {
            inos.push(match e.name.as_slice() {
                b"." => dir,
                b".." if dir == InodeNo::ROOT => InodeNo::ROOT,
                b".." => self.parent_hint(&self.node(dir)?),
                _ => mapped.next().ok_or(VfsError::WrongKind)?,
            });
        }
        Ok(inos)
    }

    fn parent_hint(&self, dir: &super::inodes::Node) -> InodeNo {
        let parent = sys::fstatat(dir.fd(), c"..").ok();
        parent
            .map(|st| self.inodes.key_of(&st))
            .and_then(|key| self.inodes.number_for(key).ok())
            .unwrap_or(InodeNo::ROOT)
    }

    pub fn releasedir(&self, fh: u64) -> Result<()> {
        self.handle_source(fh).releasedir(self)
    }
}
