//! Copy-on-abundant-write (docs/ARCHITECTURE.md "Clones: patched
//! files"): a clone's file that is written keeps reading its base's
//! bytes wherever it has none of its own.
//!
//! The first change to a clone's file of at least `PATCH_MIN` bytes does
//! not copy it: its mark becomes a *patch* mark (`Mark::patch`), which
//! says which byte ranges the backing file holds itself (`own`, whole
//! blocks, so a small write costs one block) and up to where the base
//! still shows through (`base_len`: a truncation below it hides the
//! base's bytes for good). Reads merge the two; writes read the rest of
//! the blocks they touch from the base first. Once half the file is its
//! own, or its runs no longer fit a mark, the writer's close copies the
//! rest in and the mark goes (`Vfs::materialise`).
//!
//! Durability: the backing file's data is synced before a mark that
//! claims it is written, so a crash shows, for each block, either the
//! base or data that reached the disk. A crash before the mark is
//! written loses the writes since the last close or fsync, as a crash
//! loses unsynced writes of any file.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::clone::Mark;
use super::views::{data_runs, read_reader_into, run_at, seek_layout, Reader};
use super::{errno, Caller, InodeNo, Result, Stat, Vfs};
use crate::capture::Readable;
use crate::history::past::Node as PastNode;
use crate::history::{Content, History, ObjectId, Seq};
use crate::sys::{self, creds};
use crate::union::format::XattrNs;

/// Smaller files are copied whole at their first change: a patch would
/// save less than its bookkeeping costs.
pub(super) const PATCH_MIN: u64 = 64 << 10;
/// The unit a patch owns: what the backing file system allocates anyway.
const BLOCK: u64 = 4096;
/// Most runs a mark may list (16 bytes each, so the mark fits one xattr
/// block beside its path); a file with more is materialised.
pub(super) const MAX_RUNS: usize = 64;
/// Bytes read from the base per step when the rest is copied in.
const COPY_STEP: u64 = 1 << 20;
/// How far down a chain of never-written clones a first write looks for
/// history's record of what the file shows (`Vfs::base_content`).
const MAX_UNWRITTEN_CHAIN: usize = 64;

/// Disjoint, non-adjacent byte ranges [start, end), by start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Runs(BTreeMap<u64, u64>);

impl Runs {
    pub(super) fn from_pairs(pairs: &[(u64, u64)]) -> std::result::Result<Runs, String> {
        let mut runs = Runs::default();
        let mut last = None;
        for &(s, e) in pairs {
            if s >= e || last.is_some_and(|l| s <= l) {
                return Err("runs out of order".into());
            }
            runs.0.insert(s, e);
            last = Some(e);
        }
        Ok(runs)
    }

    pub(super) fn pairs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|(s, e)| (*s, *e))
    }

    pub(super) fn count(&self) -> usize {
        self.0.len()
    }

    pub(super) fn total(&self) -> u64 {
        self.pairs().map(|(s, e)| e - s).sum()
    }

    /// How many bytes of [start, end) the runs hold.
    pub(super) fn overlap(&self, start: u64, end: u64) -> u64 {
        let first = self.0.range(..=start).next_back().map(|(s, _)| *s);
        let from = first.unwrap_or(start);
        self.0
            .range(from..end)
            .map(|(s, e)| (*e).min(end).saturating_sub((*s).max(start)))
            .sum()
    }

    /// Adds [start, end), merging what it overlaps or touches.
    pub(super) fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.0.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
            }
        }
        let inside: Vec<(u64, u64)> = self.0.range(start..=end).map(|(s, e)| (*s, *e)).collect();
        for (s, e) in inside {
            end = end.max(e);
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }

    /// Drops everything at or past `len`.
    pub(super) fn truncate(&mut self, len: u64) {
        let past: Vec<u64> = self.0.range(len..).map(|(s, _)| *s).collect();
        for s in past {
            self.0.remove(&s);
        }
        if let Some((_, e)) = self.0.range_mut(..len).next_back() {
            *e = (*e).min(len);
        }
    }

    /// The run holding `pos`, or the start of the next one.
    fn at(&self, pos: u64) -> std::result::Result<u64, Option<u64>> {
        match self.0.range(..=pos).next_back() {
            Some((_, &e)) if e > pos => Ok(e),
            _ => Err(self.0.range(pos..).next().map(|(s, _)| *s)),
        }
    }

    /// [start, end) cut where ownership changes: (from, to, own), with
    /// everything from `base_len` on owned.
    pub(super) fn pieces(&self, start: u64, end: u64, base_len: u64) -> Vec<(u64, u64, bool)> {
        let mut out = Vec::new();
        let mut pos = start;
        while pos < end {
            if pos >= base_len {
                out.push((pos, end, true));
                break;
            }
            let (to, own) = match self.at(pos) {
                Ok(run_end) => (run_end.min(end), true),
                Err(next) => (next.unwrap_or(u64::MAX).min(base_len).min(end), false),
            };
            out.push((pos, to, own));
            pos = to;
        }
        out
    }
}

/// What a patch mark adds to a file's mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PatchMeta {
    pub base_len: u64,
    pub own: Runs,
    /// Set by a flattening whose copied bytes were not synced.
    pub fallback: Option<Fallback>,
}

/// What a flattened file's owned blocks read if a crash dropped their
/// data: the base the file had before it was flattened (`at`, `path`:
/// what the file showed then, from history). Without it such a block
/// would read the new base, which the file never showed there. For a
/// block the old base did not own, the two show the same bytes (the old
/// base showed the new one there), so it serves every owned block. Kept
/// until the file's data is synced (fsync(2), another flattening, or a
/// load after a crash that mended it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Fallback {
    pub at: Seq,
    pub path: Vec<Vec<u8>>,
}

impl PatchMeta {
    /// LEB128 varints, small enough that a mark with a few runs stays in
    /// an ext4 inode's own xattr space (a spill costs a 4 KiB block per
    /// file): the base's length, the number of runs, then per run the
    /// blocks since the previous run's end and its length in blocks.
    /// Runs start on a block; each ends on one or at the base's length,
    /// where decoding cuts it. A fallback (mark format 4) follows: its
    /// instant, its path's length and its path.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.base_len);
        encode_runs(&self.own, out);
        if let Some(f) = &self.fallback {
            put_varint(out, f.at.get());
            let path = f.path.join(&b'/');
            put_varint(out, path.len() as u64);
            out.extend_from_slice(&path);
        }
    }

    pub(super) fn decode(
        b: &[u8],
        with_fallback: bool,
    ) -> std::result::Result<(PatchMeta, &[u8]), String> {
        let (base_len, rest) = take_varint(b)?;
        let (own, mut rest) = decode_runs(rest, base_len)?;
        let mut fallback = None;
        if with_fallback {
            let (at, r) = take_varint(rest)?;
            let (n, r) = take_varint(r)?;
            let n = usize::try_from(n).map_err(|_| "a path past the end")?;
            let path = r.get(..n).ok_or("a path past the end")?;
            fallback = Some(Fallback {
                at: Seq::new(at),
                path: super::clone::split_path(path)?,
            });
            rest = &r[n..];
        }
        Ok((
            PatchMeta {
                base_len,
                own,
                fallback,
            },
            rest,
        ))
    }
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn take_varint(b: &[u8]) -> std::result::Result<(u64, &[u8]), String> {
    let mut v: u64 = 0;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((v, &b[i + 1..]));
        }
    }
    Err("a number cut short".into())
}

/// The number of runs, then per run the blocks since the previous run's
/// end and its length in blocks.
fn encode_runs(runs: &Runs, out: &mut Vec<u8>) {
    put_varint(out, runs.count() as u64);
    let mut prev = 0;
    for (s, e) in runs.pairs() {
        put_varint(out, s / BLOCK - prev);
        let blocks = (e - s).div_ceil(BLOCK);
        put_varint(out, blocks);
        prev = s / BLOCK + blocks;
    }
}

/// [`encode_runs`]'s runs, each cut at `base_len`.
fn decode_runs(b: &[u8], base_len: u64) -> std::result::Result<(Runs, &[u8]), String> {
    let (n, mut rest) = take_varint(b)?;
    let mut pairs = Vec::new();
    let mut prev: u64 = 0;
    for _ in 0..n {
        let (gap, r) = take_varint(rest)?;
        let (blocks, r) = take_varint(r)?;
        rest = r;
        let start = prev.checked_add(gap).ok_or("a run past the end")?;
        let end = start.checked_add(blocks).ok_or("a run past the end")?;
        let (s, e) = (start.saturating_mul(BLOCK), end.saturating_mul(BLOCK));
        if blocks == 0 || s >= base_len {
            return Err("a run outside the base".into());
        }
        pairs.push((s, e.min(base_len)));
        prev = end;
    }
    Ok((Runs::from_pairs(&pairs)?, rest))
}

/// A clone's file with bytes of its own and its base's elsewhere, while
/// the daemon knows it (one per inode: every write goes through it).
pub(in crate::vfs) struct Patched {
    /// The backing file, open for reading and writing by the daemon.
    fd: OwnedFd,
    history: Arc<History>,
    ns: XattrNs,
    /// Moves with every change to the bytes: a reader of this file as
    /// another clone's base reads history instead once it has moved.
    generation: AtomicU64,
    /// A thread is copying the rest in (`fill_in_background`).
    filling: std::sync::atomic::AtomicBool,
    /// The backing file system shows an unwritten block as a hole after
    /// a crash (`sys::holes_mean_unwritten`): a mark need not wait for
    /// the data it lists, since a run that did not reach the disk is a
    /// hole and reads the base again.
    holes_mean_unwritten: bool,
    state: Mutex<State>,
}

struct State {
    /// The base (the mark without its patch); a chain is flattened into
    /// it (`Patched::flatten`).
    mark: Mark,
    /// The file's size (every change to it goes through here).
    size: u64,
    base_len: u64,
    own: Runs,
    /// The mark on disk lags `own`/`base_len`.
    dirty: bool,
    /// Materialised: all bytes are the file's own and the mark is gone.
    done: bool,
    base: Reader,
    /// Written with the mark while the bytes a flattening copied in may
    /// not be on disk.
    fallback: Option<Fallback>,
}

impl Patched {
    pub(in crate::vfs) fn size(&self) -> u64 {
        self.state.lock().size
    }

    pub(in crate::vfs) fn is_done(&self) -> bool {
        self.state.lock().done
    }

    pub(in crate::vfs) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Reads as the file shows: its own bytes, and its base's elsewhere.
    pub(in crate::vfs) fn read(&self, offset: u64, size: u32) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; size as usize];
        let n = self.read_into(&mut buf, offset)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// [`Patched::read`] into `buf`; returns the bytes read (short only
    /// at the end of the file).
    pub(in crate::vfs) fn read_into(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut st = self.state.lock();
        self.read_locked(&mut st, buf, offset)
    }

    fn read_locked(&self, st: &mut State, buf: &mut [u8], offset: u64) -> Result<usize> {
        if st.done {
            // Its writes no longer come through here (so `size` is not
            // kept): the backing file holds all of it.
            return Ok(sys::pread(self.fd.as_fd(), buf, offset)?);
        }
        let end = offset.saturating_add(buf.len() as u64).min(st.size);
        if offset >= end {
            return Ok(0);
        }
        let n = (end - offset) as usize;
        for (from, to, own) in st.own.pieces(offset, end, st.base_len) {
            let out = &mut buf[(from - offset) as usize..(to - offset) as usize];
            let got = if own {
                sys::pread(self.fd.as_fd(), out, from)?
            } else {
                read_base_into(&self.history, &mut st.base, out, from)?
            };
            // Short only past an end (a base cut by a crash): zeros.
            out[got..].fill(0);
        }
        Ok(n)
    }

    fn read_vec(&self, st: &mut State, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        let n = self.read_locked(st, &mut buf, offset)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Writes `data` at `offset` as `who`; the blocks it touches below
    /// `base_len` become the file's own, completed with the bytes shown
    /// there before.
    pub(in crate::vfs) fn write(&self, who: &Caller, offset: u64, data: &[u8]) -> Result<usize> {
        let mut st = self.state.lock();
        let end = offset + data.len() as u64;
        self.changed();
        if st.done {
            creds::as_caller(who, || write_all(self.fd.as_fd(), data, offset))?;
            st.size = st.size.max(end);
            return Ok(data.len());
        }
        let (start, stop) = if offset < st.base_len {
            let whole = end.div_ceil(BLOCK) * BLOCK;
            (offset / BLOCK * BLOCK, whole.min(st.base_len).max(end))
        } else {
            (offset, end)
        };
        let mut buf = self.read_vec(&mut st, start, offset - start)?;
        buf.extend_from_slice(data);
        if stop > end {
            buf.extend(self.read_vec(&mut st, end, stop - end)?);
        }
        creds::as_caller(who, || write_all(self.fd.as_fd(), &buf, start))?;
        st.size = st.size.max(end);
        if start < st.base_len {
            let to = stop.min(st.base_len);
            st.own.insert(start, to);
            st.dirty = true;
        }
        Ok(data.len())
    }

    /// Runs `cut`, which truncates the backing file to `size`, under the
    /// file's lock, then notes it: a flattening or a mark written between
    /// the cut and the note (a writer's release arrives after its close
    /// has returned) wrote back what the cut removed, the old size and
    /// base bytes past the new end (found by hand, 2026-11-29).
    pub(in crate::vfs) fn truncate_with<T>(
        &self,
        size: u64,
        cut: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let mut st = self.state.lock();
        let out = cut()?;
        let base_len = st.base_len;
        self.truncated_locked(&mut st, size);
        if st.base_len < base_len {
            // The mark says so before anything can grow the file again: a
            // crash after a cut and a regrowth must not show the base past
            // the cut (metadata is journaled in order, so no sync).
            match self.persist_locked(&mut st, false) {
                // Left to the close, which then gives the file all its
                // bytes.
                Err(e) if mark_too_big(&e) => {}
                other => other?,
            }
        }
        Ok(out)
    }

    /// After the backing file was truncated to `size`: the base no longer
    /// shows past it, even if the file grows again.
    fn truncated_locked(&self, st: &mut State, size: u64) {
        self.changed();
        st.size = size;
        if size < st.base_len {
            st.base_len = size;
            st.own.truncate(size);
            st.dirty = true;
        }
    }

    /// SEEK_DATA/SEEK_HOLE as the file shows: its own blocks are data,
    /// elsewhere the base's layout shows (`cp` and `tar` keep a sparse
    /// base's holes).
    pub(in crate::vfs) fn lseek(&self, offset: i64, whence: i32) -> Result<i64> {
        let mut st = self.state.lock();
        if st.done {
            return Ok(sys::lseek(self.fd.as_fd(), offset, whence)?);
        }
        let size = st.size;
        seek_layout(size, offset, whence, |pos| self.run_at_locked(&mut st, pos))
    }

    /// The run of the file's layout holding `pos` (as `views::run_at`).
    pub(in crate::vfs) fn run_at(&self, pos: u64) -> Result<Option<(bool, u64)>> {
        self.run_at_locked(&mut self.state.lock(), pos)
    }

    fn run_at_locked(&self, st: &mut State, pos: u64) -> Result<Option<(bool, u64)>> {
        if st.done {
            let size = sys::fstat(self.fd.as_fd())?.st_size as u64;
            return Ok(sys::layout_run(self.fd.as_fd(), pos, size)?);
        }
        if pos >= st.base_len {
            return Ok(sys::layout_run(self.fd.as_fd(), pos, st.size)?);
        }
        let limit = match st.own.at(pos) {
            Ok(end) => return Ok((pos < st.size).then(|| (true, end.min(st.size)))),
            Err(next) => next.unwrap_or(u64::MAX).min(st.base_len).min(st.size),
        };
        if pos >= limit {
            return Ok(None);
        }
        // A base cut short by a crash reads zeros past its end.
        let run = run_at(&self.history, &mut st.base, pos)?.unwrap_or((false, limit));
        Ok(Some((run.0, run.1.min(limit))))
    }

    /// Bytes still read from the base.
    fn shared(&self) -> u64 {
        let st = self.state.lock();
        st.base_len.saturating_sub(st.own.total())
    }

    /// Whether enough is the file's own that it should stop sharing.
    pub(in crate::vfs) fn abundant(&self) -> bool {
        let st = self.state.lock();
        !st.done && st.own.total() * 2 >= st.base_len
    }

    /// Writes the mark for what the file owns now, once the bytes it
    /// claims are on disk; `durable`: the mark too (fsync(2)).
    pub(in crate::vfs) fn persist(&self, durable: bool) -> Result<()> {
        self.persist_locked(&mut self.state.lock(), durable)
    }

    fn persist_locked(&self, st: &mut State, durable: bool) -> Result<()> {
        if st.dirty && !st.done && st.own.count() > MAX_RUNS {
            return Err(errno(libc::E2BIG));
        }
        if durable && !st.done && st.fallback.is_some() {
            // The bytes the fallback stands in for are on disk now.
            sys::fsync(self.fd.as_fd(), true)?;
            st.fallback = None;
            st.dirty = true;
        }
        if st.dirty && !st.done {
            if !self.holes_mean_unwritten {
                sys::fsync(self.fd.as_fd(), true)?;
            }
            let mut mark = st.mark.clone();
            mark.patch = Some(PatchMeta {
                base_len: st.base_len,
                own: st.own.clone(),
                fallback: st.fallback.clone(),
            });
            sys::setxattr_fd(self.fd.as_fd(), self.ns.clone_mark(), &mark.encode(), 0)?;
            st.dirty = false;
        }
        if durable {
            sys::fsync(self.fd.as_fd(), false)?;
        }
        Ok(())
    }

    /// The mark catches up with the bytes, after a [`Patched::flatten`]
    /// if `flatten` (the one lock held throughout); more runs than a
    /// mark holds: the file gets all its bytes.
    pub(in crate::vfs) fn flatten_and_persist(&self, flatten: bool) -> Result<()> {
        let mut st = self.state.lock();
        if flatten {
            if let Err(e) = self.flatten(&mut st) {
                // The chain stays as it was: only slower to open.
                tracing::debug!("a clone file's chain of bases stays: {e}");
            }
        }
        let kept = self.persist_locked(&mut st, false);
        drop(st);
        match kept {
            Err(e) if mark_too_big(&e) => self.fill_all(),
            other => other,
        }
    }

    /// A patched file whose base is another clone's live patched file
    /// takes in the bytes that file owns and reads that file's base
    /// instead, so a chain of clones of clones reads one level deep
    /// however long it grows (a cold open resolved a base and read a mark
    /// per level). Only when there are few bytes to take (`COPY_STEP`).
    /// What the file shows does not change, so its readers are not told.
    /// The file's data is synced here; false: nothing to do (the mark
    /// is as it was). Done as the writer's handle is released
    /// (`Vfs::close_handle`), off the path its close waits for: the sync
    /// takes milliseconds.
    fn flatten(&self, st: &mut State) -> Result<bool> {
        let Some((parent, generation)) = st.base.patched_base() else {
            return Ok(false);
        };
        if st.done || parent.filling.load(Ordering::Acquire) {
            return Ok(false);
        }
        let theirs = parent.state.lock();
        if theirs.done || parent.generation() != generation {
            return Ok(false);
        }
        // What this file shows of its base that the base owns.
        let mut take = Vec::new();
        for (from, to, own) in st.own.pieces(0, st.base_len, st.base_len) {
            if !own {
                let owned_there = theirs.own.pieces(from, to, theirs.base_len);
                take.extend(owned_there.into_iter().filter(|p| p.2).map(|p| (p.0, p.1)));
            }
        }
        let base_len = st.base_len.min(theirs.base_len);
        let mut own = st.own.clone();
        for &(from, to) in &take {
            own.insert(from, to);
        }
        own.truncate(base_len);
        let bytes: u64 = take.iter().map(|(from, to)| to - from).sum();
        if bytes > COPY_STEP || own.count() > MAX_RUNS {
            return Ok(false);
        }
        // Taking in bytes it already showed is no change the user made:
        // the file keeps its times (a futimens before the close stays).
        let times = sys::fstat(self.fd.as_fd())?;
        let mut buf = Vec::new();
        for (from, to) in take {
            buf.resize((to - from) as usize, 0);
            let got = sys::pread(parent.fd.as_fd(), &mut buf, from)?;
            buf[got..].fill(0);
            write_all(self.fd.as_fd(), &buf, from)?;
        }
        if let Err(e) = super::clone::keep_times(self.fd.as_fd(), &times) {
            // Only the times: the flattening itself goes on.
            tracing::debug!("a flattened clone file's times moved: {e}");
        }
        let new_base = theirs.base.try_clone()?;
        let parent_mark = theirs.mark.clone();
        drop(theirs);
        // On the new base, a block a crash dropped would read the old
        // base's base, not what the file showed. Where a dropped block is
        // a hole, the mark names the old base as the fallback for owned
        // blocks (the first flattening since the data was last synced: an
        // fdatasync per file was most of a round's writes); elsewhere, and
        // for a second one, the data is synced first; so too where the
        // base gets shorter, since bytes past its end are the file's own
        // with no run naming them, which no fallback covers.
        if self.holes_mean_unwritten && st.fallback.is_none() && base_len >= st.base_len {
            st.fallback = Some(Fallback {
                at: st.mark.at,
                path: st.mark.path.clone(),
            });
        } else {
            sys::fsync(self.fd.as_fd(), true)?;
            // Everything the file holds is on disk now.
            st.fallback = None;
        }
        st.mark = st.mark.rebased(&parent_mark);
        st.base = new_base;
        st.base_len = base_len;
        st.own = own;
        st.dirty = true;
        Ok(true)
    }

    /// Copies in every byte still shared, a step at a time (writes and
    /// reads go on between steps), syncs them and removes the mark. The
    /// bytes the file shows do not change, so readers of it as a base
    /// are not told.
    fn fill_all(&self) -> Result<()> {
        let mut buf = vec![0u8; COPY_STEP as usize];
        loop {
            let mut st = self.state.lock();
            if st.done {
                return Ok(());
            }
            let base_len = st.base_len;
            let next = st
                .own
                .pieces(0, base_len, base_len)
                .into_iter()
                .find(|(_, _, own)| !own);
            let Some((from, to, _)) = next else {
                break;
            };
            // A hole of the base is punched whole, not read: a sparse
            // 4 GiB base took 16 s to fill, zeros read and checked.
            if let Some((false, end)) = run_at(&self.history, &mut st.base, from)? {
                let end = end.min(to);
                if end > from {
                    punch(self.fd.as_fd(), from, end)?;
                    st.own.insert(from, end);
                    continue;
                }
            }
            let step = (to - from).min(COPY_STEP) as usize;
            let got = read_base_into(&self.history, &mut st.base, &mut buf[..step], from)?;
            if got != step {
                tracing::error!("a clone's base is shorter than its mark says");
                return Err(errno(libc::EIO));
            }
            write_data(self.fd.as_fd(), &buf[..step], from)?;
            st.own.insert(from, from + step as u64);
        }
        let mut st = self.state.lock();
        if st.done {
            return Ok(());
        }
        sys::fsync(self.fd.as_fd(), false)?;
        sys::removexattr_fd(self.fd.as_fd(), self.ns.clone_mark())?;
        // The mark's removal durable too: an fdatasync that follows (as
        // for a file with too many runs to mark) would not commit a change
        // to an xattr alone, and a power cut would bring the old mark
        // back over the whole file, showing its base.
        sys::fsync(self.fd.as_fd(), false)?;
        st.done = true;
        Ok(())
    }

    /// [`Patched::fill_all`] on a thread of its own, keeping the file's
    /// times unless the user changed it meanwhile.
    fn fill_in_background(self: &Arc<Self>) {
        if self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        let p = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("clone-fill".into())
            .spawn(move || {
                let before = sys::fstat(p.fd.as_fd());
                let generation = p.generation();
                if let Err(e) = p.fill_all() {
                    tracing::warn!("a clone file could not get its own bytes: {e}");
                    return;
                }
                if let Some(st) = before.ok().filter(|_| p.generation() == generation) {
                    if let Err(e) = super::clone::keep_times(p.fd.as_fd(), &st) {
                        tracing::debug!("a materialised clone file's times: {e}");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no thread to materialise a clone file: {e}");
        }
    }
}

impl Drop for Patched {
    /// The last user is gone (a truncation by path, or writes through a
    /// mapping after the last close): the mark catches up.
    fn drop(&mut self) {
        if let Err(e) = self.flatten_and_persist(false) {
            tracing::warn!("a clone file's patch mark could not be written: {e}");
        }
    }
}

/// The part of runs `own` (below `len`) that backing file `fd` holds
/// data for: a run whose data a crash dropped after its mark was written
/// is a hole, and reads the base as before the write.
fn held(fd: BorrowedFd<'_>, own: &Runs, len: u64) -> Result<Runs> {
    if own.count() == 0 {
        return Ok(own.clone());
    }
    let data = sys::data_ranges(fd, len)?;
    let mut held = Runs::default();
    for (start, end) in own.pairs() {
        for &(at, n) in &data {
            held.insert(start.max(at), end.min(at + n));
        }
    }
    Ok(held)
}

/// The parts of `own` that `kept` (its part the backing file holds data
/// for) lacks.
fn lost_runs(own: &Runs, kept: &Runs) -> Vec<(u64, u64)> {
    own.pairs()
        .flat_map(|(s, e)| kept.pieces(s, e, u64::MAX))
        .filter(|p| !p.2)
        .map(|p| (p.0, p.1))
        .collect()
}

/// The runs do not fit a mark (too many for `MAX_RUNS`, or for the
/// xattr space the file system gives).
fn mark_too_big(e: &super::VfsError) -> bool {
    [libc::E2BIG, libc::ENOSPC, libc::ERANGE].contains(&e.errno())
}

/// The xattrs of backing object `fd` as its file's: a clone's mark and
/// index names are the daemon's.
pub(super) fn xattrs_without_mark(
    fd: BorrowedFd<'_>,
    ns: XattrNs,
) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut all = sys::xattrs_of(fd)?;
    all.retain(|(name, _)| !crate::union::format::is_chronofs_xattr(name, ns));
    Ok(all)
}

fn read_base_into(h: &History, base: &mut Reader, buf: &mut [u8], offset: u64) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let n = read_reader_into(h, base, &mut buf[done..], offset + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

pub(super) fn write_all(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        done += sys::pwrite(fd, &buf[done..], offset + done as u64)?;
    }
    Ok(())
}

/// Zeros from `from` to `to` in the file: a hole punched, or zeros
/// written where the file system punches none.
fn punch(fd: BorrowedFd<'_>, from: u64, to: u64) -> std::io::Result<()> {
    let flags = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    if sys::fallocate(fd, flags, from, to - from).is_ok() {
        return Ok(());
    }
    let zeros = vec![0u8; (to - from).min(COPY_STEP) as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        write_all(fd, &zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// [`write_all`], but where a block of `buf` (4 KiB, aligned in the file)
/// is all zeros a hole is punched instead: a sparse base keeps its holes
/// in its clone (filled in, a 100 MiB file with 4 KiB of data took
/// 100 MiB). Punched, not skipped: a write a crash left unmarked may lie
/// there. Zeros are written where the file system punches no holes.
fn write_data(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> std::io::Result<()> {
    const BLOCK: u64 = 4096;
    let end = offset + buf.len() as u64;
    let part = |from: u64, to: u64| &buf[(from - offset) as usize..(to - offset) as usize];
    let put = |from: u64, to: u64, zero: bool| {
        let punched = zero
            && sys::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                from,
                to - from,
            )
            .is_ok();
        match punched {
            true => Ok(()),
            false => write_all(fd, part(from, to), from),
        }
    };
    let mut run: Option<(u64, bool)> = None;
    let mut at = offset;
    while at < end {
        let next = ((at / BLOCK + 1) * BLOCK).min(end);
        let zero = part(at, next).iter().all(|b| *b == 0);
        match run {
            Some((start, z)) if z != zero => {
                put(start, at, z)?;
                run = Some((at, zero));
            }
            None => run = Some((at, zero)),
            _ => {}
        }
        at = next;
    }
    match run {
        Some((start, zero)) => put(start, end, zero),
        None => Ok(()),
    }
}

/// What capture reads of a clone's file: its base's bytes wherever it
/// has none of its own (the backing file has holes there).
struct CloneContent {
    fd: OwnedFd,
    ns: XattrNs,
    bytes: Bytes,
}

enum Bytes {
    Base {
        history: Arc<History>,
        reader: Mutex<Reader>,
    },
    Patched(Arc<Patched>),
}

impl Readable for CloneContent {
    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        let got = match &self.bytes {
            Bytes::Base { history, reader } => {
                read_base_into(history, &mut reader.lock(), buf, off)
            }
            Bytes::Patched(p) => p.read_into(buf, off),
        }
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        Ok(got)
    }

    fn data_ranges(&self, size: u64) -> std::io::Result<Vec<(u64, u64)>> {
        let runs = data_runs(0, size, |pos| match &self.bytes {
            Bytes::Base { history, reader } => run_at(history, &mut reader.lock(), pos),
            Bytes::Patched(p) => p.run_at(pos),
        })
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        Ok(runs.into_iter().map(|(s, e)| (s, e - s)).collect())
    }

    fn xattrs(&self) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        xattrs_without_mark(self.fd.as_fd(), self.ns)
    }
}

impl Vfs {
    /// What capture reads for inode `ino` (backing object `fd`) if it is
    /// a clone's file that shares bytes with its base.
    pub(in crate::vfs) fn clone_content(
        &self,
        ino: InodeNo,
        fd: BorrowedFd<'_>,
    ) -> Result<Option<Box<dyn Readable>>> {
        if !self.clones_on() {
            return Ok(None);
        }
        let Some(mark) = self.read_mark(fd)?.filter(|m| !m.dir) else {
            return Ok(None);
        };
        let patched = match mark.patch {
            Some(_) => self.patched_with(ino, fd, mark.clone())?,
            None => None,
        };
        let bytes = match patched {
            Some(p) => Bytes::Patched(p),
            None => Bytes::Base {
                history: self
                    .capture()
                    .ok_or(super::VfsError::NoHistory)?
                    .history()
                    .clone(),
                reader: Mutex::new(self.base_reader(mark.at, &mark.path)?),
            },
        };
        let fd = sys::reopen(fd, libc::O_RDONLY)?;
        Ok(Some(Box::new(CloneContent {
            fd,
            ns: self.clone_ns(),
            bytes,
        })))
    }

    /// What a live file (object `obj`, backing object `fd`) shows, if its
    /// backing file holds only part of it: a clone's file (`chronofs cat`
    /// reads the live file through this).
    pub fn live_content(
        &self,
        obj: Option<crate::history::ObjectId>,
        fd: BorrowedFd<'_>,
    ) -> Result<Option<Box<dyn Readable>>> {
        if !self.clones_on() {
            return Ok(None);
        }
        let obj = match obj {
            Some(o) => o,
            None => match self.object_of(&sys::fstat(fd)?) {
                Some(o) => o,
                None => return Ok(None),
            },
        };
        self.clone_content(InodeNo::from(obj), fd)
    }

    /// The patched file behind inode `ino` (backing object `fd`), if its
    /// mark is a patch mark.
    pub(in crate::vfs) fn patched_of_fd(
        &self,
        ino: InodeNo,
        fd: BorrowedFd<'_>,
    ) -> Result<Option<Arc<Patched>>> {
        if let Some(p) = self.known_patched(ino) {
            return Ok(Some(p));
        }
        match self.read_mark(fd)? {
            Some(mark) => self.patched_with(ino, fd, mark),
            None => Ok(None),
        }
    }

    /// [`Vfs::patched_of_fd`] with `fd`'s mark already read.
    pub(in crate::vfs) fn patched_with(
        &self,
        ino: InodeNo,
        fd: BorrowedFd<'_>,
        mark: Mark,
    ) -> Result<Option<Arc<Patched>>> {
        if let Some(p) = self.known_patched(ino) {
            return Ok(Some(p));
        }
        if mark.patch.is_none() {
            return Ok(None);
        }
        let base = self.base_reader(mark.at, &mark.path)?;
        self.patched_from(ino, fd, mark, base).map(Some)
    }

    /// The patched file of inode `ino` (backing object `fd`, patch mark
    /// `mark`), reading its base through `base`.
    fn patched_from(
        &self,
        ino: InodeNo,
        fd: BorrowedFd<'_>,
        mut mark: Mark,
        base: Reader,
    ) -> Result<Arc<Patched>> {
        let meta = mark.patch.take().ok_or(super::VfsError::WrongKind)?;
        let size = sys::fstat(fd)?.st_size as u64;
        let history = self.capture().ok_or(super::VfsError::NoHistory)?.history();
        // A daemon that is not root may not write a read-only file: then
        // nothing writes it through the mount either.
        let rw = sys::reopen(fd, libc::O_RDWR).or_else(|_| sys::reopen(fd, libc::O_RDONLY))?;
        let holes_mean_unwritten = sys::holes_mean_unwritten(rw.as_fd());
        let base_len = meta.base_len.min(size);
        let mut own = meta.own;
        own.truncate(base_len);
        let mut fallback = meta.fallback;
        // The file was truncated below the base's length before this load
        // (by path, whose truncation comes before the patched file is
        // found; or before a crash that the mark did not outlive): the
        // base no longer shows there, even once the file grows again, and
        // the mark must say so.
        let mut dirty = meta.base_len > size;
        if holes_mean_unwritten {
            let kept = held(rw.as_fd(), &own, base_len)?;
            let lost = lost_runs(&own, &kept);
            match &fallback {
                Some(f) if !lost.is_empty() => {
                    // Mended, every owned block holds data again.
                    self.mend(rw.as_fd(), f, &lost)?;
                    fallback = None;
                    dirty = true;
                }
                _ => own = kept,
            }
        }
        let p = Arc::new(Patched {
            fd: rw,
            history: history.clone(),
            ns: self.clone_ns(),
            generation: AtomicU64::new(0),
            filling: Default::default(),
            holes_mean_unwritten,
            state: Mutex::new(State {
                size,
                base_len,
                own,
                dirty,
                done: false,
                base,
                mark,
                fallback,
            }),
        });
        // Made without the table's lock (its base may be patched too); the
        // first one made serves.
        let mut known = self.clones.patched.lock();
        if let Some(first) = known.get(&ino).and_then(Weak::upgrade) {
            // This copy goes unused: dropped, it must not write its mark
            // over the one in use.
            p.state.lock().dirty = false;
            return Ok(first);
        }
        if known.len() >= 256 {
            known.retain(|_, w| w.strong_count() > 0);
        }
        known.insert(ino, Arc::downgrade(&p));
        Ok(p)
    }

    /// A flattened file loaded after a crash that dropped the data of
    /// its owned blocks `lost`: they are read from its fallback (the old
    /// base) and written in, and the file is synced, so the fallback can
    /// go (the caller rewrites the mark).
    fn mend(&self, fd: BorrowedFd<'_>, f: &Fallback, lost: &[(u64, u64)]) -> Result<()> {
        tracing::info!(
            "a flattened clone file lost {} run(s) in a crash: read again from its base",
            lost.len()
        );
        let mut old = self.base_reader(f.at, &f.path)?;
        let history = self.capture().ok_or(super::VfsError::NoHistory)?.history();
        let mut buf = Vec::new();
        for &(s, e) in lost {
            buf.resize((e - s) as usize, 0);
            let got = read_base_into(history, &mut old, &mut buf, s)?;
            buf[got..].fill(0);
            write_all(fd, &buf, s)?;
        }
        sys::fsync(fd, true)?;
        Ok(())
    }

    /// The 512-byte blocks a clone's file (`mark`, `size` bytes) shows
    /// of its base beside its backing file's own: the base's data, not
    /// its holes, so that `cp` and `tar -S` find a sparse base sparse.
    pub(in crate::vfs) fn base_blocks(&self, ino: InodeNo, mark: &Mark, size: u64) -> Result<i64> {
        if let Some((m, s, blocks)) = self.clones.base_blocks.lock().get(&ino) {
            if m == mark && *s == size {
                return Ok(*blocks);
            }
        }
        let history = self.capture().ok_or(super::VfsError::NoHistory)?.history();
        let mut base = self.base_reader(mark.at, &mark.path)?;
        let (base_len, own) = match &mark.patch {
            Some(p) => (p.base_len.min(size), p.own.clone()),
            None => (size, Runs::default()),
        };
        let bytes: u64 = data_runs(0, base_len, |pos| run_at(history, &mut base, pos))?
            .into_iter()
            .map(|(s, e)| e - s - own.overlap(s, e))
            .sum();
        let blocks = bytes.div_ceil(512) as i64;
        let mut known = self.clones.base_blocks.lock();
        if known.len() >= 4096 {
            known.clear();
        }
        known.insert(ino, (mark.clone(), size, blocks));
        Ok(blocks)
    }

    /// `ino` was copied up: a patched file known for it reads and writes
    /// the copy left behind, and the next use loads the new one.
    pub(in crate::vfs) fn forget_patched(&self, ino: InodeNo) {
        self.clones.patched.lock().remove(&ino);
    }

    /// The patched file of `ino` the daemon holds, if any.
    fn known_patched(&self, ino: InodeNo) -> Option<Arc<Patched>> {
        self.clones.patched.lock().get(&ino).and_then(Weak::upgrade)
    }

    /// The patched file `node` is, if it is one.
    pub(in crate::vfs) fn patched(
        &self,
        node: &super::inodes::Node,
    ) -> Result<Option<Arc<Patched>>> {
        if !self.clones_on() || node.kind != libc::S_IFREG || node.inode.known_unmarked() {
            return Ok(None);
        }
        self.patched_of_fd(node.ino, node.fd())
    }

    /// The patched file an open handle reads and writes, if it is one.
    pub(in crate::vfs) fn patched_handle(&self, fh: u64) -> Result<Option<Arc<Patched>>> {
        if !self.clones_on() {
            return Ok(None);
        }
        let handle = self.handles.get(fh)?;
        let super::inodes::Handle::File { patched: held, .. } = &*handle else {
            return Ok(None);
        };
        let known = held.lock().clone();
        let p = match known {
            Some(p) => Some(p),
            // Opened before the file was patched: the handle keeps it from
            // now on, so its reads do not load it again each time.
            None => {
                let found = self.patched(&self.node(handle.ino())?)?;
                if let Some(p) = &found {
                    held.lock().get_or_insert_with(|| p.clone());
                }
                found
            }
        };
        // Once it has all its bytes, its descriptor serves as any file's.
        Ok(p.filter(|p| !p.is_done()))
    }

    /// Before a change to `node`: a clone's file that still reads all of
    /// its base becomes a patched file (its bytes stay shared), or, if it
    /// is small, gets its own bytes at once.
    pub(in crate::vfs) fn before_clone_change(&self, node: &super::inodes::Node) -> Result<()> {
        self.before_clone_change_for(node, false).map(drop)
    }

    /// [`Vfs::before_clone_change`]; for an `open` that will use the
    /// patched file, that file too, made with the base resolved once for
    /// both the baseline and the reads (it was resolved twice).
    pub(in crate::vfs) fn before_clone_change_for(
        &self,
        node: &super::inodes::Node,
        open: bool,
    ) -> Result<Option<Arc<Patched>>> {
        let Some(mark) = self.base_of_file(node)? else {
            return Ok(None);
        };
        let size = sys::fstat(node.fd())?.st_size as u64;
        // Where the branch can share the base's blocks, the file takes
        // them: no patch, and the kernel reads and writes it.
        if self.materialise_shared(node, true)? {
            return Ok(None);
        }
        if size < PATCH_MIN {
            return self.materialise(node).map(|()| None);
        }
        let one = self.clones.busy.lock();
        if self.base_of_file(node)?.is_none() {
            return Ok(None);
        }
        let mut patched = mark;
        patched.patch = Some(PatchMeta {
            base_len: size,
            own: Runs::default(),
            fallback: None,
        });
        // Nothing is the file's own yet: the mark needs no sync.
        sys::setxattr_fd(
            node.fd(),
            self.clone_ns().clone_mark(),
            &patched.encode(),
            0,
        )?;
        // Handles opened on the base now read through the patch.
        self.clones
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let base = self.with_past(|p| {
            p.resolve(&patched.path, patched.at)
                .map_err(super::views::past_err)
        })?;
        self.baseline_from_base(node, &patched, base.as_ref())?;
        drop(one);
        if !open {
            return Ok(None);
        }
        let reader = self.reader_of_base(base, patched.at, &patched.path)?;
        self.patched_from(node.ino, node.fd(), patched, reader)
            .map(Some)
    }

    /// History's record of a clone's file before its first change is its
    /// base's content at the instant (when history holds it): no need to
    /// read the file for it, which would cost the whole file for the
    /// smallest write. `base`: the mark's base, resolved.
    pub(super) fn baseline_from_base(
        &self,
        node: &super::inodes::Node,
        mark: &Mark,
        base: Option<&PastNode>,
    ) -> Result<()> {
        let Some(c) = self.capture() else {
            return Ok(());
        };
        let Some(content) = self.base_content(mark, base)? else {
            return Ok(());
        };
        let st = sys::fstat(node.fd())?;
        let live = super::versioning::Live(self);
        Ok(c.baseline_as(&live, node.ino.object(), &st, content)?)
    }

    /// The content a clone's file shows before its first change, as
    /// history holds it: its base's version at the instant, or, where
    /// the base is itself a clone's file never changed since (history has
    /// no version of it, so it resolves live), that file's base, and so
    /// on down a chain of unwritten clones (the file was read whole).
    fn base_content(&self, mark: &Mark, first: Option<&PastNode>) -> Result<Option<Content>> {
        let (mut at, mut path) = (mark.at, mark.path.clone());
        let mut first = Some(first);
        for _ in 0..MAX_UNWRITTEN_CHAIN {
            let resolved;
            let base = match first.take() {
                Some(node) => node,
                None => {
                    resolved =
                        self.with_past(|p| p.resolve(&path, at).map_err(super::views::past_err))?;
                    resolved.as_ref()
                }
            };
            let next = match base {
                Some(PastNode::Hist { v, .. }) => {
                    let file = matches!(v.content, Content::File { .. });
                    return Ok(file.then(|| v.content.clone()));
                }
                Some(PastNode::Live { fd, st, obj })
                    if st.st_mode & libc::S_IFMT == libc::S_IFREG =>
                {
                    match self.read_mark(fd.as_fd())? {
                        Some(m) => Some(m),
                        None => return self.content_of_unchanged(*obj, st),
                    }
                }
                _ => None,
            };
            // Only a mark with no bytes of the file's own shows its base
            // whole.
            match next.filter(|m| !m.dir && m.patch.is_none()) {
                Some(m) => (at, path) = (m.at, m.path),
                None => return Ok(None),
            }
        }
        Ok(None)
    }

    /// The content of a live file (`obj`, `st` its attributes now) that
    /// has not changed since history's newest version of it: that
    /// version's, as a view of it reads the live file on the same proof.
    fn content_of_unchanged(&self, obj: Option<ObjectId>, st: &Stat) -> Result<Option<Content>> {
        let (Some(obj), Some(c)) = (obj, self.capture()) else {
            return Ok(None);
        };
        let h = c.history();
        let Some((_, v)) = h.latest(obj)? else {
            return Ok(None);
        };
        let file = matches!(v.content, Content::File { .. });
        let same = crate::capture::attrs_of(st).same_state(&v.attrs);
        Ok((file && same).then(|| v.content.clone()))
    }

    /// Gives a patched file all its bytes and drops its mark.
    pub(in crate::vfs) fn materialise_patched(&self, node: &super::inodes::Node) -> Result<()> {
        let Some(p) = self.patched(node)? else {
            return Ok(());
        };
        let times = sys::fstat(node.fd())?;
        p.fill_all()?;
        node.inode.set_unmarked();
        self.clones.patched.lock().remove(&node.ino);
        super::clone::keep_times(node.fd(), &times)
    }

    /// At a writer's close or fsync: the mark catches up with the bytes,
    /// or a file changed enough starts copying the rest in.
    pub(in crate::vfs) fn settle_patched(&self, fh: u64, durable: bool) -> Result<()> {
        let Some(p) = self.patched_handle(fh)? else {
            return Ok(());
        };
        match p.persist(durable) {
            // Little left to copy (a file rewritten from its start): at
            // once, so the file is plain when its writer's close returns.
            Ok(()) if p.abundant() && p.shared() <= COPY_STEP => {
                let node = self.node(self.handles.get(fh)?.ino())?;
                self.materialise_patched(&node)?;
            }
            Ok(()) if p.abundant() => p.fill_in_background(),
            Ok(()) => {}
            // More runs than a mark holds: the file gets all its bytes
            // now (in the background, an exit could lose the writes the
            // mark does not list).
            Err(e) if mark_too_big(&e) => {
                let node = self.node(self.handles.get(fh)?.ino())?;
                self.materialise_patched(&node)?;
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(r: &Runs) -> Vec<(u64, u64)> {
        r.pairs().collect()
    }

    #[test]
    fn runs_merge_what_they_touch_and_truncate_cuts() {
        let mut r = Runs::default();
        r.insert(4096, 8192);
        r.insert(0, 100);
        r.insert(12288, 16384);
        assert_eq!(runs(&r), [(0, 100), (4096, 8192), (12288, 16384)]);
        r.insert(8192, 12288);
        assert_eq!(runs(&r), [(0, 100), (4096, 16384)]);
        r.insert(50, 5000);
        assert_eq!(runs(&r), [(0, 16384)]);
        r.truncate(10000);
        assert_eq!(runs(&r), [(0, 10000)]);
        r.truncate(0);
        assert_eq!(runs(&r), []);
        assert_eq!(
            Runs::from_pairs(&[(5, 9), (1, 3)]),
            Err("runs out of order".into())
        );
        assert_eq!(Runs::from_pairs(&[(1, 1)]), Err("runs out of order".into()));
    }

    #[test]
    fn a_patch_encodes_in_a_few_bytes_and_damage_is_refused() {
        let own = Runs::from_pairs(&[(0, 4096), (8192, 12288), (40960, 70000)]).unwrap_or_default();
        let meta = PatchMeta {
            base_len: 70000,
            own,
            fallback: None,
        };
        let mut bytes = Vec::new();
        meta.encode(&mut bytes);
        assert!(bytes.len() <= 12, "{} bytes", bytes.len());
        assert_eq!(
            PatchMeta::decode(&bytes, false),
            Ok((meta.clone(), &[][..]))
        );
        for cut in 0..bytes.len() {
            assert!(
                PatchMeta::decode(&bytes[..cut], false).is_err(),
                "cut at {cut}"
            );
        }
        // A run of no blocks, or one past the base.
        assert!(PatchMeta::decode(&[100, 1, 0, 0], false).is_err());
        assert!(PatchMeta::decode(&[100, 1, 1, 1], false).is_err());
        assert!(PatchMeta::decode(&[0xff; 11], false).is_err());
    }

    #[test]
    fn pieces_split_own_and_base_and_own_everything_past_base_len() {
        let r = Runs::from_pairs(&[(10, 20), (30, 40)]).unwrap_or_default();
        assert_eq!(
            r.pieces(0, 60, 50),
            [
                (0, 10, false),
                (10, 20, true),
                (20, 30, false),
                (30, 40, true),
                (40, 50, false),
                (50, 60, true)
            ]
        );
        assert_eq!(
            r.pieces(15, 35, 50),
            [(15, 20, true), (20, 30, false), (30, 35, true)]
        );
        assert_eq!(
            r.pieces(0, 25, 12),
            [(0, 10, false), (10, 20, true), (20, 25, true)]
        );
        assert_eq!(r.pieces(5, 5, 50), []);
    }
}
