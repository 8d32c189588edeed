//! Clones (docs/ARCHITECTURE.md "Clones"): `chronofs clone SRC DST` makes
//! DST an independent, writable copy of SRC as of an instant, without
//! copying anything at clone time.
//!
//! A clone's objects are real objects of the writable branch from the
//! start, so every operation on them is the live tree's. Until one has
//! content of its own it carries a *mark* (`XattrNs::clone_mark`, hidden
//! from users as the union's markers are) naming its *base*: the path
//! and instant of the object it copies, which history keeps. A marked
//! directory has not been filled yet: the first operation on its entries
//! fills it with marked copies of the base's entries (attributes, names,
//! xattrs, symlinks, special files: metadata only). A marked file reads
//! the base's bytes (the live file while unchanged, else history's
//! chunks, as a view does) until the first change materialises it: its
//! bytes are copied in and the mark is removed.
//!
//! History records a clone's entries as of the clone's instant (the fill
//! backdates them), so the past shows the clone whole from its start, and
//! a tag `clone:N` keeps the base's instant from retention.

use std::os::fd::{AsFd, BorrowedFd};

use std::collections::HashMap;
use std::sync::Weak;

use super::clone_patch::{PatchMeta, Patched};
use super::inodes::Node;
use super::{errno, InodeNo, Result, Vfs};
use crate::history::access::Who;
use crate::history::Seq;
use crate::sys::{self, Stat, TimeSpec};
use crate::union::format::{self, XattrNs};

/// The mark's format: its value's first byte. Format 1 (the first
/// slice) had no clone id and no root depth; it still reads, and its
/// hard links stay separate files.
const MARK_FORMAT: u8 = 2;
const MARK_FORMAT_1: u8 = 1;
/// Format 2 plus a patch (base length and owned runs) before the path:
/// written only for patched files, so a store without one still opens in
/// a build that reads format 2.
const MARK_FORMAT_PATCH: u8 = 3;
/// A patched file's mark with a fallback for blocks whose data a crash
/// may have dropped (`clone_patch::Fallback`, after the patch), its
/// fixed fields as varints so that it still fits an ext4 inode's own
/// xattr space: written only while a flattened file's copied bytes are
/// not known to be on disk.
const MARK_FORMAT_FALLBACK: u8 = 4;
/// A directory whose entries are still its base's.
const UNFILLED_DIR: u8 = b'D';
/// A file whose bytes are still its base's.
const BASE_FILE: u8 = b'F';
/// A file with some bytes of its own (`clone_patch`).
const PATCHED_FILE: u8 = b'P';
/// Bytes copied per step when a file is materialised.
const COPY_STEP: usize = 1 << 20;

/// What a marked object copies: `path` (from the mount root) as it was
/// at `at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::vfs) struct Mark {
    pub dir: bool,
    pub at: Seq,
    /// Who made the clone: a clone made by anyone but root keeps no
    /// set-user-ID or set-group-ID bit on a file that user does not own
    /// (a copy of a privileged program in their hands, as a hard link
    /// would be, which `protected_hardlinks` refuses).
    pub(in crate::vfs) by: u32,
    /// The clone's id (the number in its tag `clone:N`); 0 for a mark
    /// of format 1, which did not say.
    pub(in crate::vfs) clone_id: u64,
    /// How many leading components of `path` name the clone's source:
    /// the tree whose hard links the clone keeps.
    pub(in crate::vfs) depth: u16,
    pub path: Vec<Vec<u8>>,
    /// A patched file's own bytes (`clone_patch`).
    pub patch: Option<PatchMeta>,
}

impl Mark {
    /// This file's mark reading `base`'s base instead: the same clone and
    /// maker, one level less of chain.
    pub(super) fn rebased(&self, base: &Mark) -> Mark {
        Mark {
            at: base.at,
            depth: base.depth,
            path: base.path.clone(),
            patch: None,
            ..self.clone()
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let (format, kind) = match (self.dir, &self.patch) {
            (true, _) => (MARK_FORMAT, UNFILLED_DIR),
            (false, None) => (MARK_FORMAT, BASE_FILE),
            (false, Some(p)) if p.fallback.is_some() => (MARK_FORMAT_FALLBACK, PATCHED_FILE),
            (false, Some(_)) => (MARK_FORMAT_PATCH, PATCHED_FILE),
        };
        let mut out = vec![format, kind];
        if format == MARK_FORMAT_FALLBACK {
            for v in [
                self.at.get(),
                self.by.into(),
                self.clone_id,
                self.depth.into(),
            ] {
                super::clone_patch::put_varint(&mut out, v);
            }
        } else {
            out.extend_from_slice(&self.at.get().to_le_bytes());
            out.extend_from_slice(&self.by.to_le_bytes());
            out.extend_from_slice(&self.clone_id.to_le_bytes());
            out.extend_from_slice(&self.depth.to_le_bytes());
        }
        if let Some(p) = self.patch.as_ref().filter(|_| !self.dir) {
            p.encode(&mut out);
        }
        out.extend_from_slice(&self.path.join(&b'/'));
        out
    }

    fn decode(b: &[u8]) -> std::result::Result<Mark, String> {
        let [format, kind, rest @ ..] = b else {
            return Err("too short".into());
        };
        let formats = [
            MARK_FORMAT_1,
            MARK_FORMAT,
            MARK_FORMAT_PATCH,
            MARK_FORMAT_FALLBACK,
        ];
        if !formats.contains(format) {
            return Err(format!(
                "format {format}, this build reads formats {MARK_FORMAT_1} to {MARK_FORMAT_FALLBACK}"
            ));
        }
        let patched = [MARK_FORMAT_PATCH, MARK_FORMAT_FALLBACK].contains(format);
        let dir = match (*kind, patched) {
            (UNFILLED_DIR, false) => true,
            (BASE_FILE, false) | (PATCHED_FILE, true) => false,
            (k, _) => return Err(format!("kind {k} in a mark of format {format}")),
        };
        let (at, by, clone_id, depth, path) = match *format {
            MARK_FORMAT_FALLBACK => {
                let (at, rest) = super::clone_patch::take_varint(rest)?;
                let (by, rest) = super::clone_patch::take_varint(rest)?;
                let (clone, rest) = super::clone_patch::take_varint(rest)?;
                let (depth, rest) = super::clone_patch::take_varint(rest)?;
                let by = u32::try_from(by).map_err(|_| "a maker past u32")?;
                let depth = u16::try_from(depth).map_err(|_| "a depth past u16")?;
                (at, by, clone, depth, rest)
            }
            f => {
                let (at, rest) = take::<8>(rest)?;
                let (by, rest) = take::<4>(rest)?;
                let (at, by) = (u64::from_le_bytes(at), u32::from_le_bytes(by));
                if f == MARK_FORMAT_1 {
                    (at, by, 0, 0, rest)
                } else {
                    let (clone, rest) = take::<8>(rest)?;
                    let (depth, rest) = take::<2>(rest)?;
                    let (clone, depth) = (u64::from_le_bytes(clone), u16::from_le_bytes(depth));
                    (at, by, clone, depth, rest)
                }
            }
        };
        let (patch, path) = if patched {
            let (patch, rest) = PatchMeta::decode(path, *format == MARK_FORMAT_FALLBACK)?;
            (Some(patch), rest)
        } else {
            (None, path)
        };
        let path = split_path(path)?;
        if usize::from(depth) > path.len() {
            return Err("a source deeper than the path".into());
        }
        Ok(Mark {
            dir,
            at: Seq::new(at),
            by,
            clone_id,
            depth,
            path,
            patch,
        })
    }

    pub(super) fn child(&self, name: &[u8], dir: bool) -> Mark {
        let mut path = self.path.clone();
        path.push(name.to_vec());
        Mark {
            dir,
            path,
            patch: None,
            ..self.clone()
        }
    }

    /// Who the clone's maker is, for the rule of who may read the past;
    /// `None` for root. Their groups are the group database's (the process
    /// that made the clone is gone when it is filled); a uid it does not
    /// know has none.
    pub(super) fn maker(&self) -> Option<Who> {
        if self.by == 0 {
            return None;
        }
        let (gid, groups) = sys::user_groups(self.by).unwrap_or((u32::MAX, Vec::new()));
        Some(Who::with_groups(self.by, gid, groups))
    }

    /// Whether a copy of an object with `st` in this clone keeps extended
    /// attribute `name`: not file capabilities of a file its maker (other
    /// than root) does not own, which, like set-ID bits, would give them a
    /// privileged program of their own to keep past its fix.
    pub(super) fn keeps_xattr(&self, st: &Stat, name: &[u8]) -> bool {
        self.by == 0 || st.st_uid == self.by || name != b"security.capability"
    }

    /// The mode a copy of an object with `st` gets in this clone.
    pub(super) fn mode_for(&self, st: &Stat) -> u32 {
        let privileged = libc::S_ISUID | libc::S_ISGID;
        let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
        if self.by != 0 && regular && st.st_uid != self.by {
            st.st_mode & !privileged
        } else {
            st.st_mode
        }
    }
}

/// What `chronofs clone` made.
#[derive(Clone, Debug)]
pub struct Cloned {
    pub ino: InodeNo,
    /// The tag that keeps the instant copied.
    pub tag: String,
}

/// The clone state of a mount.
#[derive(Default)]
pub(super) struct Clones {
    /// Set once the mount holds (or may hold) a clone: until then no
    /// operation pays for a mark check.
    on: std::sync::atomic::AtomicBool,
    /// One fill or materialisation at a time: a second caller waits and
    /// then finds the mark gone.
    pub(super) busy: parking_lot::Mutex<()>,
    /// How many files were materialised or patched: a handle opened on a
    /// base knows its file still shows all of it while this has not moved.
    pub(super) epoch: std::sync::atomic::AtomicU64,
    /// Patched files the daemon has met (`clone_patch`).
    /// Patched files in use (`clone_patch`): at most one per inode while
    /// anything holds it, gone (its descriptors closed) when nothing does.
    pub(super) patched: parking_lot::Mutex<HashMap<InodeNo, Weak<Patched>>>,
    /// Operations that can carry a mark to where a walk of the tree has
    /// already been (`Vfs::clone_instants_in_use`).
    pub(super) moves: super::clone_space::Moves,
    /// The store these clones belong to, and the branches that say so.
    pub(super) stamps: super::clone_stamp::Stamps,
    /// Files a read gave their base's blocks (FICLONE moves the backing
    /// file's ctime, which no call can set back): the ctime they showed
    /// before, kept while the backing file's is the one the sharing left.
    /// Otherwise `tar` (ctime compared around its read) and others saw a
    /// change where the user made none.
    pub(super) kept_ctime: parking_lot::Mutex<HashMap<InodeNo, (Ctime, Ctime)>>,
    /// What `Vfs::base_blocks` found, by the mark and size it was for.
    pub(super) base_blocks: parking_lot::Mutex<HashMap<InodeNo, (Mark, u64, i64)>>,
}

/// A ctime: seconds and nanoseconds.
pub(super) type Ctime = (i64, i64);

impl Vfs {
    /// The namespace of the mount's own xattrs.
    pub(super) fn clone_ns(&self) -> XattrNs {
        self.union().map_or_else(XattrNs::for_daemon, |u| u.ns)
    }

    /// Whether the mount holds clones (or did: their tags are in history).
    pub fn clones_on(&self) -> bool {
        self.clones.on.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the mount as holding clones (at mount, if history has a
    /// clone's tag; and when one is made), and its read-write branches as
    /// holding this store's (before any mark is written).
    pub fn enable_clones(&self) {
        self.clones
            .on
            .store(true, std::sync::atomic::Ordering::Release);
        self.stamp_writable_branches();
    }

    /// The mark of `node`, if it has one (read once per inode while it
    /// has none: see `Inode::known_unmarked`).
    pub(super) fn mark_of(&self, node: &Node) -> Result<Option<Mark>> {
        if !self.clones_on() || node.inode.known_unmarked() {
            return Ok(None);
        }
        let mark = self.read_mark(node.fd())?;
        if mark.is_none() {
            node.inode.set_unmarked();
        }
        Ok(mark)
    }

    /// The mark of the backing object `fd`, if it has one.
    pub(super) fn read_mark(&self, fd: BorrowedFd<'_>) -> Result<Option<Mark>> {
        let Some(raw) = format::read_clone_mark(fd, self.clone_ns())? else {
            return Ok(None);
        };
        Mark::decode(&raw).map(Some).map_err(|why| {
            tracing::error!("a clone's mark is damaged ({why}); its base is unknown");
            errno(libc::EIO)
        })
    }

    /// The base a clone's file still reads from, if it does.
    pub(super) fn base_of_file(&self, node: &Node) -> Result<Option<Mark>> {
        if node.kind != libc::S_IFREG {
            return Ok(None);
        }
        Ok(self.mark_of(node)?.filter(|m| !m.dir && m.patch.is_none()))
    }

    /// Before an operation on `dir`'s entries: a clone's directory gets
    /// its base's entries first. Returns whether this call filled it.
    pub(super) fn fill_if_unfilled(&self, dir: &Node) -> Result<bool> {
        if !dir.is_dir() || self.mark_of(dir)?.is_none() {
            return Ok(false);
        }
        let _one = self.clones.busy.lock();
        // Another caller may have filled it meanwhile.
        let Some(mark) = self.mark_of(dir)?.filter(|m| m.dir) else {
            return Ok(false);
        };
        self.fill(dir, &mark)?;
        Ok(true)
    }

    /// A lookup found `entry`: a clone's directory is filled before the
    /// kernel takes its attributes (its link count counts the base's
    /// subdirectories; `find` and `ls -l` see the base's).
    pub(super) fn filled_entry(&self, mut entry: super::Entry) -> Result<super::Entry> {
        if !self.clones_on() || entry.attr.st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Ok(entry);
        }
        if self.fill_if_unfilled(&self.node(entry.attr.ino)?)? {
            entry.attr = self.live_getattr(entry.attr.ino, None)?;
        }
        Ok(entry)
    }

    /// [`Vfs::fill_if_unfilled`] for an inode an operation holds.
    pub(super) fn fill_held(&self, ino: InodeNo) -> Result<()> {
        if !self.clones_on() {
            return Ok(());
        }
        self.fill_if_unfilled(&self.node(ino)?).map(drop)
    }

    /// For a read-only open of `node`: if it is a clone's file that still
    /// shows its base, a view handle on the base, with the count of
    /// materialisations so far.
    pub(super) fn open_base_if_marked(&self, node: &Node) -> Result<Option<(u64, u64)>> {
        let epoch = self.clones.epoch.load(std::sync::atomic::Ordering::Acquire);
        let Some(mark) = self.base_of_file(node)? else {
            return Ok(None);
        };
        // Where the branch can share its base's blocks, the file gets them
        // now and is read by the kernel itself (passthrough), at the
        // base's speed. A read does not write a frozen branch; a small
        // file is read as fast through the daemon (and btrfs copies its
        // inline bytes rather than sharing them).
        let large = sys::fstat(node.fd())?.st_size as u64 >= super::clone_patch::PATCH_MIN;
        if large && !self.in_read_only_branch(node) {
            // Sharing only makes the read faster: whatever stops it, the
            // daemon reads the base.
            match self.materialise_shared(node, false) {
                Ok(true) => return Ok(None),
                Ok(false) => {}
                Err(e) => tracing::debug!("clone: a read-only open shares no blocks: {e}"),
            }
        }
        Ok(Some((self.open_base(mark.at, &mark.path)?.fh, epoch)))
    }

    /// The view handle a read through `fh` goes to: the base, while the
    /// file still shows it. Nothing materialised since the open means it
    /// still does; otherwise its mark says.
    pub(super) fn base_while_marked(&self, fh: u64) -> Result<Option<u64>> {
        if !self.clones_on() {
            return Ok(None);
        }
        let handle = self.handles.get(fh)?;
        let super::inodes::Handle::File {
            ino,
            base: Some((view, epoch)),
            ..
        } = &*handle
        else {
            return Ok(None);
        };
        if self.clones.epoch.load(std::sync::atomic::Ordering::Acquire) == *epoch {
            return Ok(Some(*view));
        }
        let node = self.node(*ino)?;
        Ok(self.base_of_file(&node)?.map(|_| *view))
    }

    /// Gives a clone's file its own bytes (before it changes, or before
    /// anything reads it as a live file): the base's are copied in, made
    /// durable, and only then is the mark removed.
    pub(super) fn materialise(&self, node: &Node) -> Result<()> {
        if self.base_of_file(node)?.is_none() {
            return self.materialise_patched(node);
        }
        let _one = self.clones.busy.lock();
        let Some(mark) = self.base_of_file(node)? else {
            return Ok(());
        };
        let times = sys::fstat(node.fd())?;
        if !self.shared_base_blocks(node, &mark, &times)? {
            let opened = self.open_base(mark.at, &mark.path)?;
            let copied = self.copy_base(opened.fh, node.fd());
            let _ = self.view_release(opened.fh);
            copied?;
        }
        self.unmark_materialised(node, &times)
    }

    /// [`Vfs::materialise`], only where the branch's file system can
    /// share the base's blocks (no copy); false where it cannot. Before a
    /// change (`for_change`), history records the file's state before
    /// from its base's version (no read of the file), and its writes are
    /// tracked from then on (`Inode::shared_at_change`).
    pub(super) fn materialise_shared(&self, node: &Node, for_change: bool) -> Result<bool> {
        if !sys::shares_blocks_in_order(node.fd()) {
            return Ok(false);
        }
        let _one = self.clones.busy.lock();
        let Some(mark) = self.base_of_file(node)? else {
            return Ok(self.mark_of(node)?.is_none());
        };
        let times = sys::fstat(node.fd())?;
        if !self.shared_base_blocks(node, &mark, &times)? {
            return Ok(false);
        }
        self.unmark_materialised(node, &times)?;
        if !for_change {
            let after = sys::fstat(node.fd())?;
            self.clones.kept_ctime.lock().insert(
                node.ino,
                (
                    (after.st_ctime, after.st_ctime_nsec),
                    (times.st_ctime, times.st_ctime_nsec),
                ),
            );
        }
        // After the last step that moves its ctime: history's record must
        // match the file as it now is, or capture would read it whole.
        if for_change {
            let base = self.with_past(|p| {
                p.resolve(&mark.path, mark.at)
                    .map_err(super::views::past_err)
            })?;
            self.baseline_from_base(node, &mark, base.as_ref())?;
            node.inode.set_shared_at_change();
        }
        Ok(true)
    }

    /// Whether `node` (marked `mark`, `times` its attributes) now shares
    /// its base's blocks. The mark may go without a sync in between: on
    /// these file systems the sharing is journaled before the mark's
    /// removal (`sys::shares_blocks_in_order`).
    fn shared_base_blocks(&self, node: &Node, mark: &Mark, times: &Stat) -> Result<bool> {
        if !sys::shares_blocks_in_order(node.fd()) {
            return Ok(false);
        }
        let out = sys::reopen(node.fd(), libc::O_WRONLY)?;
        let size = times.st_size as u64;
        // The unnamed copy is made in the root of the file's branch: the
        // same file system, unless another is mounted below it (then no
        // sharing: EXDEV).
        let root = self
            .union()
            .and_then(|u| u.root_of(self.inodes.branch_of(&node.inode.key)));
        let scratch = root.as_ref().map_or(self.branch.root_fd(), |r| r.as_fd());
        let shared = self.share_base_blocks((mark.at, &mark.path), (out.as_fd(), scratch), size)?;
        // An attempt undone moved the file's times; one never made did
        // not, and setting them anyway would move its ctime, which views
        // and clones of it compare.
        let now = sys::fstat(node.fd())?;
        if !shared && (now.st_mtime, now.st_mtime_nsec) != (times.st_mtime, times.st_mtime_nsec) {
            keep_times(node.fd(), times)?;
        }
        Ok(shared)
    }

    /// The last step of a materialisation: the bytes are the file's own.
    fn unmark_materialised(&self, node: &Node, times: &Stat) -> Result<()> {
        sys::removexattr_fd(node.fd(), self.clone_ns().clone_mark())?;
        node.inode.set_unmarked();
        // Copying the bytes in is not a change the user made (a chmod or a
        // read by history may be what asked for it).
        keep_times(node.fd(), times)?;
        self.clones
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// Copies the base's data into `to` (which has the base's size and no
    /// bytes of its own): only its data runs, so a sparse base keeps its
    /// holes and they cost no reads (a 4 GiB base with 8 KiB of data took
    /// 16 s to copy whole, zeros and all, at a clone's first fallocate).
    fn copy_base(&self, fh: u64, to: BorrowedFd<'_>) -> Result<()> {
        let out = sys::reopen(to, libc::O_WRONLY)?;
        let mut off = 0i64;
        loop {
            let data = match self.view_lseek(fh, off, libc::SEEK_DATA) {
                Ok(at) => at,
                Err(e) if e.errno() == libc::ENXIO => break,
                Err(e) => return Err(e),
            };
            let hole = self.view_lseek(fh, data, libc::SEEK_HOLE)?;
            self.copy_base_run(fh, out.as_fd(), data as u64, hole as u64)?;
            off = hole;
        }
        sys::fsync(out.as_fd(), false)?;
        Ok(())
    }

    fn copy_base_run(&self, fh: u64, out: BorrowedFd<'_>, from: u64, to: u64) -> Result<()> {
        let mut off = from;
        while off < to {
            let step = (to - off).min(COPY_STEP as u64) as u32;
            let buf = self.view_read(fh, off, step)?;
            if buf.is_empty() {
                break;
            }
            super::clone_patch::write_all(out, &buf, off)?;
            off += buf.len() as u64;
        }
        Ok(())
    }
}

/// A mark's path: components joined by `/`, empty for the root.
pub(super) fn split_path(b: &[u8]) -> std::result::Result<Vec<Vec<u8>>, String> {
    if b.is_empty() {
        return Ok(Vec::new());
    }
    let path: Vec<Vec<u8>> = b.split(|c| *c == b'/').map(<[u8]>::to_vec).collect();
    if path.iter().any(|c| c.is_empty()) {
        return Err("an empty path component".into());
    }
    Ok(path)
}

/// The first `N` bytes of `b`, and the rest.
fn take<const N: usize>(b: &[u8]) -> std::result::Result<([u8; N], &[u8]), String> {
    let (head, rest) = b.split_at_checked(N).ok_or("too short")?;
    let head = head.try_into().map_err(|_| "too short")?;
    Ok((head, rest))
}

/// Sets `fd`'s access and modification times back to `st`'s.
pub(super) fn keep_times(fd: BorrowedFd<'_>, st: &Stat) -> Result<()> {
    let at = |secs: i64, nsecs: i64| TimeSpec::At { secs, nsecs };
    sys::utimens_fd(
        fd,
        at(st.st_atime, st.st_atime_nsec),
        at(st.st_mtime, st.st_mtime_nsec),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::clone_patch::Runs;
    use super::*;

    #[test]
    fn a_mark_round_trips_and_a_damaged_one_is_refused() {
        let m = Mark {
            dir: true,
            at: Seq::new(42),
            by: 1000,
            clone_id: 77,
            depth: 1,
            path: vec![b"a".to_vec(), b"b c".to_vec()],
            patch: None,
        };
        assert_eq!(Mark::decode(&m.encode()), Ok(m.clone()));
        let own = Runs::from_pairs(&[(0, 4096), (8192, 12288)]).unwrap_or_default();
        let patched = Mark {
            dir: false,
            patch: Some(PatchMeta {
                base_len: 70000,
                own: own.clone(),
                fallback: None,
            }),
            ..m.clone()
        };
        let bytes = patched.encode();
        assert_eq!(bytes[..2], [3, b'P']);
        assert_eq!(Mark::decode(&bytes), Ok(patched));
        // A flattened file's mark with its crash fallback: format 4.
        let flattened = Mark {
            dir: false,
            patch: Some(PatchMeta {
                base_len: 70000,
                own: own.clone(),
                fallback: Some(super::super::clone_patch::Fallback {
                    at: Seq::new(40),
                    path: vec![b"c1".to_vec(), b"b c".to_vec()],
                }),
            }),
            ..m.clone()
        };
        let four = flattened.encode();
        assert_eq!(four[..2], [4, b'P']);
        // Dookubench's marks once flattened: in an ext4 inode's own
        // xattr space (48 bytes of value beside this name).
        assert!(four.len() <= 40, "{} bytes", four.len());
        assert_eq!(Mark::decode(&four), Ok(flattened));
        let tail = four.len() - b"a/b c".len();
        for cut in 2..tail {
            assert!(Mark::decode(&four[..cut]).is_err(), "cut at {cut}");
        }
        let bytes = Mark {
            dir: false,
            patch: Some(PatchMeta {
                base_len: 70000,
                own,
                fallback: None,
            }),
            ..m
        }
        .encode();
        // A patch mark cut inside its runs.
        let path_at = bytes.len() - b"a/b c".len();
        assert!(Mark::decode(&bytes[..path_at - 1]).is_err());
        let root = Mark {
            dir: false,
            at: Seq::new(1),
            by: 0,
            clone_id: 5,
            depth: 0,
            path: Vec::new(),
            patch: None,
        };
        assert_eq!(Mark::decode(&root.encode()), Ok(root));
        assert!(Mark::decode(&[&[4, b'F'][..], &[0u8; 22]].concat()).is_err());
        assert!(Mark::decode(&[&[2, b'P'][..], &[0u8; 22]].concat()).is_err());
        assert!(Mark::decode(b"").is_err());
        let zeros = [0u8; 22];
        assert!(Mark::decode(&[&[3, b'D'][..], &zeros].concat()).is_err());
        assert!(Mark::decode(&[&[2, b'X'][..], &zeros].concat()).is_err());
        assert!(Mark::decode(&[2, b'D', 0, 0]).is_err());
        assert!(Mark::decode(&[&[2, b'D'][..], &zeros[..20]].concat()).is_err());
        assert!(Mark::decode(&[&[2, b'D'][..], &zeros, b"a//b"].concat()).is_err());
        assert!(Mark::decode(&[&[2, b'D'][..], &zeros].concat()).is_ok());
        // A source deeper than the path.
        let mut deep = zeros;
        deep[20] = 2;
        assert!(Mark::decode(&[&[2, b'D'][..], &deep, b"a"].concat()).is_err());
    }

    /// Marks written by the first slice (format 1: no clone id, no
    /// depth) keep reading.
    #[test]
    fn a_format_1_mark_still_reads() {
        let mut v1 = vec![1, b'F'];
        v1.extend_from_slice(&9u64.to_le_bytes());
        v1.extend_from_slice(&1000u32.to_le_bytes());
        v1.extend_from_slice(b"src/a");
        let m = Mark::decode(&v1).unwrap();
        assert_eq!(
            (m.dir, m.at, m.by, m.clone_id, m.depth),
            (false, Seq::new(9), 1000, 0, 0)
        );
        assert_eq!(m.path, vec![b"src".to_vec(), b"a".to_vec()]);
        let zeros = [0u8; 12];
        assert!(Mark::decode(&[&[1, b'D'][..], &zeros].concat()).is_ok());
        assert!(Mark::decode(&[&[1, b'D'][..], &zeros[..10]].concat()).is_err());
    }
}
