//! Reading a file as it was: opening a view (a private clone for
//! passthrough where the store's file system can share the live file's
//! blocks), the chunks or live bytes behind it, and its handles.

use super::*;

impl Vfs {
    /// Opens a view file for reading (a view is never writable: the
    /// caller has refused opens for writing).
    pub(in crate::vfs) fn view_open(
        &self,
        caller: &Caller,
        ino: InodeNo,
    ) -> Result<crate::vfs::Opened> {
        let node = self.view(ino)?;
        self.current(&node)?;
        let What::At { at, obj, state } = &node.what else {
            return Err(errno(libc::EISDIR));
        };
        if node.st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(VfsError::WrongKind);
        }
        self.view_permits(caller, &node, crate::history::access::READ)?;
        let reader = self.source_for(*obj, *at, state, &[])?;
        let passthrough = self.clone_for(&node, reader.obj, &reader.source);
        let passthrough_ok = passthrough.is_some();
        let fh = self.insert_view_handle(ViewHandle::File {
            reader: Mutex::new(reader),
            passthrough,
        });
        Ok(crate::vfs::Opened {
            fh,
            passthrough_ok,
            session: false,
            per_write: false,
        })
    }

    /// Gives the views the place for private clones of live files.
    pub fn set_clone_dir(&self, dir: OwnedFd) {
        let _ = self.views.clone_dir.set(dir);
    }

    /// A view of a file unchanged since its instant can be read by the
    /// kernel itself (passthrough, as fast as the live file) only from a
    /// file that can never change: a clone of the live file sharing its
    /// blocks, where the source's file system can make one (FICLONE), made
    /// while the live file still holds the instant's content. Passthrough
    /// on the live file itself would show a later write to it through the
    /// view.
    pub(super) fn clone_for(
        &self,
        node: &ViewNode,
        obj: ObjectId,
        source: &ReadFrom,
    ) -> Option<Arc<OwnedFd>> {
        let mut slot = node.clone.lock();
        if let Some(decided) = &*slot {
            return decided.clone();
        }
        let ReadFrom::Head {
            fd, expect, latest, ..
        } = source
        else {
            return None;
        };
        let dir = self.views.clone_dir.get()?;
        let made = match sys::clone_to_tmpfile(fd.as_fd(), dir.as_fd()) {
            Ok(clone) => {
                // Verified after the clone, as reads are (`view_read`).
                let now = sys::fstat(fd.as_fd()).ok().map(|st| attrs_of(&st));
                let newest = self
                    .history()
                    .ok()
                    .and_then(|h| h.latest(obj).ok())
                    .map(|l| l.map(|(s, _)| s));
                (now.is_some_and(|n| expect.same_state(&n)) && newest == Some(*latest))
                    .then(|| Arc::new(clone))
            }
            Err(e) => {
                tracing::debug!("history view: no clone of object {obj}: {e}");
                None
            }
        };
        *slot = Some(made.clone());
        made
    }

    /// The descriptor the kernel reads a passthrough view file from.
    pub(in crate::vfs) fn view_backing<T>(
        &self,
        fh: u64,
        f: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> Result<T>,
    ) -> Result<T> {
        match &*self.view_handle(fh)? {
            ViewHandle::File {
                passthrough: Some(fd),
                ..
            } => f(fd.as_fd()),
            _ => Err(VfsError::WrongKind),
        }
    }

    pub(super) fn insert_view_handle(&self, h: ViewHandle) -> u64 {
        let fh = VIEW_BIT | (self.views.next_fh.fetch_add(1, Ordering::Relaxed) + 1);
        self.views.handles.write().insert(fh, Arc::new(h));
        fh
    }

    /// Opens `path` as it was at `at` for reading: what a clone's file
    /// that still shows its base reads (the kernel checked the caller's
    /// right to read against the clone's own file).
    pub(in crate::vfs) fn open_base(
        &self,
        at: Seq,
        path: &[Vec<u8>],
    ) -> Result<crate::vfs::Opened> {
        let reader = self.base_reader(at, path)?;
        let fh = self.insert_view_handle(ViewHandle::File {
            reader: Mutex::new(reader),
            passthrough: None,
        });
        Ok(crate::vfs::Opened {
            fh,
            passthrough_ok: false,
            session: false,
            per_write: false,
        })
    }

    pub(in crate::vfs) fn base_reader(&self, at: Seq, path: &[Vec<u8>]) -> Result<Reader> {
        let node = self.with_past(|p| p.resolve(path, at).map_err(past_err))?;
        self.reader_of_base(node, at, path)
    }

    /// Makes `out`, a clone's file of `size` bytes that shows the base at
    /// `path` and `at`, share that base's blocks (FICLONE), where the base
    /// is a live file still holding the instant's bytes on the same file
    /// system; checked after the clone as reads are. The base is cloned
    /// into an unnamed file in `scratch` (a directory on that file
    /// system) first, and only a checked copy goes into `out`: while the
    /// mark stays, the mount shows `out`'s size, which an attempt given up
    /// must not move. False where it cannot (history holds the bytes,
    /// another file system, no FICLONE or O_TMPFILE, the base changed
    /// meanwhile): `out` is untouched.
    pub(in crate::vfs) fn share_base_blocks(
        &self,
        (at, path): (Seq, &[Vec<u8>]),
        (out, scratch): (std::os::fd::BorrowedFd<'_>, std::os::fd::BorrowedFd<'_>),
        size: u64,
    ) -> Result<bool> {
        let mut reader = self.base_reader(at, path)?;
        let obj = reader.obj;
        let ReadFrom::Head {
            fd,
            expect,
            latest,
            as_of,
        } = &mut reader.source
        else {
            return Ok(false);
        };
        if expect.size != size {
            return Ok(false);
        }
        let copy = match sys::clone_to_tmpfile(fd.as_fd(), scratch) {
            Ok(copy) => copy,
            Err(e) => {
                tracing::debug!("clone: no shared blocks for {}: {e}", past::show_path(path));
                return Ok(false);
            }
        };
        let h = self.history()?;
        let now = attrs_of(&sys::fstat(fd.as_fd())?);
        if !(expect.same_state(&now) && unchanged_versions(h, obj, latest, as_of)?) {
            return Ok(false);
        }
        if let Err(e) = sys::ficlone(out, copy.as_fd()) {
            // Perhaps part shared: holes again, at the size the mount
            // shows (the copy has it, so no step moved it).
            tracing::debug!("clone: {} not shared: {e}", past::show_path(path));
            sys::ftruncate(out, size)?;
            sys::fallocate(
                out,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                size,
            )?;
            return Ok(false);
        }
        Ok(true)
    }

    /// [`Vfs::base_reader`] of a base already resolved (`None`: history
    /// does not have it).
    pub(in crate::vfs) fn reader_of_base(
        &self,
        node: Option<Node>,
        at: Seq,
        path: &[Vec<u8>],
    ) -> Result<Reader> {
        let Some(node) = node else {
            tracing::error!(
                "a clone's base {} at #{at} is not in history",
                past::show_path(path)
            );
            return Err(errno(libc::EIO));
        };
        if node.mode() & libc::S_IFMT != libc::S_IFREG {
            return Err(VfsError::WrongKind);
        }
        let (obj, state) = match node {
            Node::Hist { obj, v, .. } => (obj, State::Hist { v: Arc::new(v) }),
            Node::Live { fd, st, .. } => {
                let inode = self.inodes.acquire_new(fd, &st, false)?;
                (inode.ino.object(), State::Live { inode })
            }
        };
        let reader = self.source_for(obj, at, &state, path);
        self.drop_what(What::At { at, obj, state });
        reader
    }

    /// Where an open view file reads from: the live file if it still holds
    /// exactly the content of the instant, else the chunks. A clone's file
    /// that still shows its base reads that base.
    /// `hint`: a path the object had at `at`, where it is likely still.
    pub(super) fn source_for(
        &self,
        obj: ObjectId,
        at: Seq,
        state: &State,
        hint: &[Vec<u8>],
    ) -> Result<Reader> {
        let h = self.history()?;
        let as_of = h.last_seq();
        let latest = h
            .latest(obj)
            .map_err(|e| past_err(e.into()))?
            .map(|(s, _)| s);
        let mut live = match state {
            State::Live { inode } => Some((self.inodes.fd(inode)?, None)),
            State::Hist { v } => {
                let (seq_v, _) = h
                    .object_at(obj, at)
                    .map_err(|e| past_err(e.into()))?
                    .ok_or_else(|| errno(libc::EIO))?;
                if latest != Some(seq_v) {
                    None
                } else {
                    self.with_past(|p| p.live_object_near(obj, hint).map_err(past_err))?
                        .map(|(fd, _)| (Arc::new(fd), Some(v.attrs)))
                }
            }
        };
        if let Some((fd, expect)) = live.as_ref().filter(|_| self.clones_on()) {
            if let Some(mark) = self.read_mark(fd.as_fd())? {
                match self.clone_source(obj, at, fd.as_fd(), expect.as_ref(), mark)? {
                    Some(reader) => return Ok(reader),
                    // Its backing file has holes where the base's bytes
                    // show: history has the instant's.
                    None => live = None,
                }
            }
        }
        let source = match live {
            Some((path_fd, expect)) => self.head(path_fd.as_fd(), expect, latest, as_of)?,
            None => None,
        };
        Ok(Reader {
            obj,
            at,
            source: match source {
                Some(s) => s,
                None => chunk_source(h, obj, at)?,
            },
        })
    }

    /// A reader of a clone's file `fd` (marked `mark`) as it is now, if it
    /// still is as `expect` says.
    fn clone_source(
        &self,
        obj: ObjectId,
        at: Seq,
        fd: std::os::fd::BorrowedFd<'_>,
        expect: Option<&Attrs>,
        mark: crate::vfs::clone::Mark,
    ) -> Result<Option<Reader>> {
        let unchanged = |fd| -> Result<bool> {
            let now = attrs_of(&sys::fstat(fd)?);
            Ok(expect.is_none_or(|e| e.same_state(&now)))
        };
        if mark.dir {
            return Ok(None);
        }
        if mark.patch.is_none() {
            if !unchanged(fd)? {
                return Ok(None);
            }
            return self.base_reader(mark.at, &mark.path).map(Some);
        }
        let Some(file) = self.patched_with(InodeNo::from(obj), fd, mark)? else {
            return Ok(None);
        };
        // Its generation before the check: a write landing between them
        // is then either seen by the check or counted as a later
        // generation, never as the instant's.
        let generation = file.generation();
        if !unchanged(fd)? {
            return Ok(None);
        }
        let source = ReadFrom::Patched { generation, file };
        Ok(Some(Reader { obj, at, source }))
    }

    /// The live file `path_fd` as a source, if it still holds `expect`.
    fn head(
        &self,
        path_fd: std::os::fd::BorrowedFd<'_>,
        expect: Option<Attrs>,
        latest: Option<Seq>,
        as_of: Seq,
    ) -> Result<Option<ReadFrom>> {
        let fd = sys::reopen(path_fd, libc::O_RDONLY)?;
        let now = attrs_of(&sys::fstat(fd.as_fd())?);
        let expect = expect.unwrap_or(now);
        if !expect.same_state(&now) {
            return Ok(None);
        }
        // Views and clones are mostly read whole: a readahead window that
        // keeps the disk busy between requests.
        if let Err(e) = sys::advise_sequential(fd.as_fd()) {
            tracing::debug!("history view: fadvise: {e}");
        }
        Ok(Some(ReadFrom::Head {
            fd,
            expect,
            latest,
            as_of,
        }))
    }

    pub(in crate::vfs) fn view_read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let handle = self.view_handle(fh)?;
        let ViewHandle::File { reader, .. } = &*handle else {
            return Err(errno(libc::EISDIR));
        };
        let mut r = reader.lock();
        let read = read_reader(self.history()?, &mut r, offset, size);
        read
    }

    pub(super) fn view_handle(&self, fh: u64) -> Result<Arc<ViewHandle>> {
        self.views
            .handles
            .read()
            .get(&fh)
            .cloned()
            .ok_or(VfsError::UnknownHandle(fh))
    }

    pub(in crate::vfs) fn view_release(&self, fh: u64) -> Result<()> {
        self.views
            .handles
            .write()
            .remove(&fh)
            .map(drop)
            .ok_or(VfsError::UnknownHandle(fh))
    }

    pub(in crate::vfs) fn view_lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        let handle = self.view_handle(fh)?;
        let ViewHandle::File { reader, .. } = &*handle else {
            return Err(errno(libc::EISDIR));
        };
        let h = self.history()?;
        let mut r = reader.lock();
        let size = match &r.source {
            ReadFrom::Head { expect, .. } => expect.size,
            ReadFrom::Patched { file, .. } => file.size(),
            ReadFrom::Chunks {
                starts, manifest, ..
            } => match (starts.last(), manifest.extents.last()) {
                (Some(s), Some(e)) => s + u64::from(e.len),
                _ => 0,
            },
        };
        seek_layout(size, offset, whence, |pos| run_at(h, &mut r, pos))
    }
}

/// lseek(2)'s SEEK_DATA and SEEK_HOLE in a file of `size` bytes whose
/// layout `run_at` gives (as [`run_at`] does); other whences are EINVAL.
pub(in crate::vfs) fn seek_layout(
    size: u64,
    offset: i64,
    whence: i32,
    mut run_at: impl FnMut(u64) -> Result<Option<(bool, u64)>>,
) -> Result<i64> {
    let want_data = match whence {
        libc::SEEK_DATA => true,
        libc::SEEK_HOLE => false,
        _ => return Err(errno(libc::EINVAL)),
    };
    let mut pos = match u64::try_from(offset) {
        Ok(p) if p < size => p,
        _ => return Err(errno(libc::ENXIO)),
    };
    while let Some((data, end)) = run_at(pos)? {
        if data == want_data {
            return Ok(pos as i64);
        }
        if end <= pos {
            break;
        }
        pos = end;
    }
    // Past the last data, the end of the file is a hole.
    if want_data {
        Err(errno(libc::ENXIO))
    } else {
        Ok(size as i64)
    }
}

/// The data runs (start, end) in [`from`, `to`) of what `run_at` lays
/// out, holes left out.
pub(in crate::vfs) fn data_runs(
    from: u64,
    to: u64,
    mut run_at: impl FnMut(u64) -> Result<Option<(bool, u64)>>,
) -> Result<Vec<(u64, u64)>> {
    let mut runs = Vec::new();
    let mut pos = from;
    while pos < to {
        let Some((data, end)) = run_at(pos)? else {
            break;
        };
        let end = end.min(to);
        if end <= pos {
            break;
        }
        if data {
            runs.push((pos, end));
        }
        pos = end;
    }
    Ok(runs)
}

/// The run of what `r` reads holding `pos`: `(data, end)`, data or a hole
/// from `pos` to `end`; `None` at or past its end. Checked as reads are:
/// a live file that changed since gives way to history's record.
pub(in crate::vfs) fn run_at(h: &History, r: &mut Reader, pos: u64) -> Result<Option<(bool, u64)>> {
    if let Some(run) = on_patched(h, r, |file| file.run_at(pos))? {
        return Ok(run);
    }
    if let Some(run) = on_head(h, r, |fd, expect| {
        Ok(sys::layout_run(fd, pos, expect.size)?)
    })? {
        return Ok(run);
    }
    let ReadFrom::Chunks {
        manifest, starts, ..
    } = &r.source
    else {
        return Err(VfsError::WrongKind);
    };
    Ok(chunk_run(manifest, starts, pos))
}

/// Runs `f` on the live patched file `r` reads, if it does: its answer
/// if the file did not change meanwhile; else (or once materialised,
/// when its writes no longer go through it) `r` reads history's record
/// from now on, and `None`.
fn on_patched<T>(
    h: &History,
    r: &mut Reader,
    f: impl FnOnce(&crate::vfs::clone_patch::Patched) -> Result<T>,
) -> Result<Option<T>> {
    let ReadFrom::Patched { file, generation } = &r.source else {
        return Ok(None);
    };
    let same = |f: &crate::vfs::clone_patch::Patched| f.generation() == *generation && !f.is_done();
    if same(file) {
        let out = f(file)?;
        if same(file) {
            return Ok(Some(out));
        }
    }
    read_history_instead(h, r, "clone file")
}

/// Runs `f` on the live file `r` reads, if it does: its answer if the
/// file still held the instant's bytes afterwards; else `r` reads
/// history's record from now on, and `None`.
fn on_head<T>(
    h: &History,
    r: &mut Reader,
    f: impl FnOnce(std::os::fd::BorrowedFd<'_>, &Attrs) -> Result<T>,
) -> Result<Option<T>> {
    let ReadFrom::Head {
        fd,
        expect,
        latest,
        as_of,
    } = &mut r.source
    else {
        return Ok(None);
    };
    let out = f(fd.as_fd(), expect)?;
    // Checked after: a writer through the mount records the old state
    // before its first write, and any write changes mtime, so unchanged
    // attributes and versions prove what `f` saw was the instant's.
    let now = attrs_of(&sys::fstat(fd.as_fd())?);
    if expect.same_state(&now) && unchanged_versions(h, r.obj, latest, as_of)? {
        return Ok(Some(out));
    }
    read_history_instead(h, r, "object")
}

/// `r`'s live source changed since its instant: it reads history's
/// record from now on.
fn read_history_instead<T>(h: &History, r: &mut Reader, what: &str) -> Result<Option<T>> {
    tracing::debug!("history view: {what} {} changed; reading history", r.obj);
    r.source = chunk_source(h, r.obj, r.at)?;
    Ok(None)
}

/// [`run_at`] in recorded extents (`starts`: each one's offset): an
/// extent without a chunk is a hole.
fn chunk_run(manifest: &Manifest, starts: &[u64], pos: u64) -> Option<(bool, u64)> {
    let mut i = starts.partition_point(|s| *s <= pos).checked_sub(1)?;
    let data = manifest.extents.get(i)?.chunk.is_some();
    let mut end = starts[i] + u64::from(manifest.extents[i].len);
    if end <= pos {
        return None;
    }
    // Neighbours of the same kind are one run.
    while let Some(next) = manifest.extents.get(i + 1) {
        if next.chunk.is_some() != data {
            break;
        }
        i += 1;
        end += u64::from(next.len);
    }
    Some((data, end))
}

/// Smaller files show their size's blocks wherever finding their layout
/// costs a look at their base or its record (a clone's file, a version):
/// on a tree of small files that look doubled the first listing's time,
/// and holes in a file this small save next to nothing.
pub(in crate::vfs) const LAYOUT_MIN: u64 = 64 << 10;

/// Bytes of data (not holes) a recorded file holds.
pub(in crate::vfs) fn recorded_data(manifest: &Manifest) -> u64 {
    manifest
        .extents
        .iter()
        .filter(|e| e.chunk.is_some())
        .map(|e| u64::from(e.len))
        .sum()
}

pub(super) fn chunk_source(h: &History, obj: ObjectId, at: Seq) -> Result<ReadFrom> {
    let Some((_, v)) = h.object_at(obj, at).map_err(|e| past_err(e.into()))? else {
        tracing::error!(
            "history view: object {obj} changed behind the mount since #{at} and history holds no copy"
        );
        return Err(errno(libc::EIO));
    };
    let manifest = match v.content {
        Content::File { manifest } => manifest,
        // Not versioned by policy: the bytes of that instant are gone.
        Content::Unrecorded => return Err(errno(libc::ENODATA)),
        Content::Lost { .. } => {
            tracing::warn!(
                "history view: object {obj} at #{at}: {}",
                crate::history::HistoryError::Lost("its version".into())
            );
            return Err(errno(libc::EIO));
        }
        _ => return Err(VfsError::WrongKind),
    };
    let manifest = h.manifest(&manifest).map_err(|e| past_err(e.into()))?;
    let mut starts = Vec::with_capacity(manifest.extents.len());
    let mut off = 0u64;
    for e in &manifest.extents {
        starts.push(off);
        off += u64::from(e.len);
    }
    Ok(ReadFrom::Chunks {
        manifest,
        starts,
        cached: None,
    })
}

impl Reader {
    /// Another reader of the same bytes from the same place (no history
    /// query: a clone's chain is flattened with its base's reader).
    pub(in crate::vfs) fn try_clone(&self) -> Result<Reader> {
        let source = match &self.source {
            ReadFrom::Head {
                fd,
                expect,
                latest,
                as_of,
            } => ReadFrom::Head {
                fd: fd.try_clone()?,
                expect: *expect,
                latest: *latest,
                as_of: *as_of,
            },
            ReadFrom::Patched { file, generation } => ReadFrom::Patched {
                file: file.clone(),
                generation: *generation,
            },
            ReadFrom::Chunks {
                manifest, starts, ..
            } => ReadFrom::Chunks {
                manifest: manifest.clone(),
                starts: starts.clone(),
                cached: None,
            },
        };
        Ok(Reader {
            obj: self.obj,
            at: self.at,
            source,
        })
    }

    /// The live patched file this reads, with its generation at the
    /// instant, while it is still as it was then.
    pub(in crate::vfs) fn patched_base(
        &self,
    ) -> Option<(Arc<crate::vfs::clone_patch::Patched>, u64)> {
        match &self.source {
            ReadFrom::Patched { file, generation }
                if file.generation() == *generation && !file.is_done() =>
            {
                Some((file.clone(), *generation))
            }
            _ => None,
        }
    }
}

/// Reads `size` bytes at `offset` of what `r` reads.
pub(in crate::vfs) fn read_reader(
    h: &History,
    r: &mut Reader,
    offset: u64,
    size: u32,
) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize];
    let n = read_reader_into(h, r, &mut buf, offset)?;
    buf.truncate(n);
    Ok(buf)
}

pub(super) fn read_chunks(
    h: &History,
    manifest: &Manifest,
    starts: &[u64],
    cached: &mut Option<(usize, Vec<u8>)>,
    offset: u64,
    size: usize,
) -> Result<Vec<u8>> {
    let chunks = h.chunks();
    let mut out = Vec::with_capacity(size);
    let mut i = starts.partition_point(|s| *s <= offset).saturating_sub(1);
    let mut pos = offset;
    while out.len() < size && i < manifest.extents.len() {
        let e = manifest.extents[i];
        let start = starts[i];
        let end = start + u64::from(e.len);
        if pos >= end {
            i += 1;
            continue;
        }
        let from = (pos - start) as usize;
        let take = (end - pos).min((size - out.len()) as u64) as usize;
        match e.chunk {
            None => out.resize(out.len() + take, 0),
            Some(hash) => {
                if cached.as_ref().is_none_or(|(idx, _)| *idx != i) {
                    let data = chunks.get(&hash).map_err(|e| {
                        tracing::error!("history view: {e}");
                        errno(libc::EIO)
                    })?;
                    *cached = Some((i, data));
                }
                let data = cached
                    .as_ref()
                    .map(|(_, d)| d.as_slice())
                    .unwrap_or_default();
                let slice = data
                    .get(from..from + take)
                    .ok_or_else(|| errno(libc::EIO))?;
                out.extend_from_slice(slice);
            }
        }
        pos += take as u64;
        i += 1;
    }
    Ok(out)
}

/// Whether history has recorded no new version of `obj` since `latest`
/// (checked against the index only when anything new was recorded since
/// `as_of`).
fn unchanged_versions(
    h: &History,
    obj: ObjectId,
    latest: &Option<Seq>,
    as_of: &mut Seq,
) -> Result<bool> {
    let seq = h.last_seq();
    if seq == *as_of {
        return Ok(true);
    }
    let newest = h
        .latest(obj)
        .map_err(|e| past_err(e.into()))?
        .map(|(s, _)| s);
    *as_of = seq;
    Ok(newest == *latest)
}

/// [`read_reader`] into `buf`: a patched file (a clone's, read as another
/// clone's base) reads straight into it, however deep its chain of bases.
pub(in crate::vfs) fn read_reader_into(
    h: &History,
    r: &mut Reader,
    buf: &mut [u8],
    offset: u64,
) -> Result<usize> {
    if let Some(n) = on_patched(h, r, |file| file.read_into(buf, offset))? {
        return Ok(n);
    }
    if let Some(n) = on_head(h, r, |fd, _| Ok(sys::pread(fd, buf, offset)?))? {
        return Ok(n);
    }
    let ReadFrom::Chunks {
        manifest,
        starts,
        cached,
    } = &mut r.source
    else {
        return Err(VfsError::WrongKind);
    };
    let got = read_chunks(h, manifest, starts, cached, offset, buf.len())?;
    buf[..got.len()].copy_from_slice(&got);
    Ok(got.len())
}
