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

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use super::clone_patch::{PatchMeta, Patched};
use super::inodes::Node;
use super::{errno, InodeNo, Result, Vfs};
use crate::history::access::{Who, READ};
use crate::history::past::{Error as PastError, Node as PastNode};
use crate::history::{Binding, Content, Seq};
use crate::sys::{self, Stat, TimeSpec};
use crate::union::copyup::{drop_inherited_acls, is_copyup_temp, temp_name};
use crate::union::format::{self, is_chronofs_xattr, is_overlay_xattr, XattrNs};

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

    fn child(&self, name: &[u8], dir: bool) -> Mark {
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
    fn maker(&self) -> Option<Who> {
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
    fn keeps_xattr(&self, st: &Stat, name: &[u8]) -> bool {
        self.by == 0 || st.st_uid == self.by || name != b"security.capability"
    }

    /// The mode a copy of an object with `st` gets in this clone.
    fn mode_for(&self, st: &Stat) -> u32 {
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

    /// Fills the unfilled directory `dir` with copies of its base's
    /// entries: each made under a hidden name, complete, then renamed into
    /// place, so a crash leaves only whole entries (a later fill skips
    /// them) and hidden leftovers (`fsck` removes them). The mark goes
    /// only once the entries are durable and recorded.
    fn fill(&self, dir: &Node, mark: &Mark) -> Result<()> {
        // Filling is not a change the user made: the times stay the base's.
        let times = sys::fstat(dir.fd())?;
        self.fill_live_base(mark)?;
        let children = self.with_past(|p| {
            let Some(base) = p
                .resolve(&mark.path, mark.at)
                .map_err(super::views::past_err)?
            else {
                // Never silently empty: the clone would lose its entries.
                tracing::error!(
                    "a clone's base {} at #{} is not in history",
                    crate::history::past::show_path(&mark.path),
                    mark.at
                );
                return Err(errno(libc::EIO));
            };
            let names = p
                .names(&base, mark.at, mark.path.is_empty())
                .map_err(super::views::past_err)?;
            let mut out = Vec::with_capacity(names.len());
            let maker = mark.maker();
            for name in names {
                let mut path = mark.path.clone();
                path.push(name.clone());
                let Some(node) = p.resolve(&path, mark.at).map_err(super::views::past_err)? else {
                    continue;
                };
                // Its maker's clone holds what they may read of the past:
                // an entry closed to them since (or then) stays out.
                if let Some(who) = &maker {
                    match p.check(who, &path, mark.at, &node, READ) {
                        Ok(()) => {}
                        Err(PastError::Denied(why)) => {
                            tracing::debug!("clone by uid {}: left out: {why}", mark.by);
                            continue;
                        }
                        Err(e) => return Err(super::views::past_err(e)),
                    }
                }
                out.push((name, node));
            }
            Ok(out)
        })?;
        self.drop_leftovers(dir.fd())?;
        let mut made = Vec::with_capacity(children.len());
        let mut index = None;
        for (name, base) in children {
            let cname = CString::new(name.clone()).map_err(|_| errno(libc::EINVAL))?;
            match sys::fstatat(dir.fd(), &cname) {
                // Made by a fill a crash interrupted.
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let mark = mark.child(&name, false);
                    match self.linked_copy(&mark, &base)? {
                        Some(link) => {
                            let to = (dir, cname.as_c_str());
                            self.copy_linked_entry(to, &base, mark, &link, &mut index)?;
                        }
                        None => self.copy_entry(dir.fd(), &cname, &base, mark)?,
                    }
                }
                Err(e) => return Err(e.into()),
            }
            made.push((name, cname));
        }
        let rw = sys::reopen_dir(dir.fd(), libc::O_RDONLY)?;
        sys::fsync(rw.as_fd(), false)?;
        self.record_fill(dir, mark.at, &made)?;
        sys::removexattr_fd(dir.fd(), self.clone_ns().clone_mark())?;
        dir.inode.set_unmarked();
        keep_times(dir.fd(), &times)?;
        if let Some(c) = self.capture() {
            c.dir_verified(dir.ino.object(), &sys::fstat(dir.fd())?);
        }
        // Its link count and times may be cached from before.
        self.attrs_changed(dir.ino);
        Ok(())
    }

    /// A clone of a clone: where `mark`'s base is a live directory of
    /// another clone not filled yet, that one is filled first, or its
    /// (empty) listing would be taken for its base's. (The caller holds
    /// `Clones::busy`; each step goes to an earlier clone, so it ends.)
    fn fill_live_base(&self, mark: &Mark) -> Result<()> {
        let base = self.with_past(|p| {
            p.resolve(&mark.path, mark.at)
                .map_err(super::views::past_err)
        })?;
        let Some(PastNode::Live { fd, st, .. }) = base else {
            return Ok(());
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Ok(());
        }
        let Some(base_mark) = self.read_mark(fd.as_fd())?.filter(|m| m.dir) else {
            return Ok(());
        };
        let inode = self.inodes.acquire_new(fd, &st, false)?;
        let filled = self
            .inodes
            .node_of(inode.clone())
            .and_then(|node| self.fill(&node, &base_mark));
        self.inodes.forget(inode.ino, 1);
        filled
    }

    /// Removes what an interrupted fill left under hidden names (nobody
    /// has seen the directory since: every use fills it first).
    fn drop_leftovers(&self, dir: BorrowedFd<'_>) -> Result<()> {
        let rd = sys::reopen_dir(dir, libc::O_RDONLY)?;
        let mut buf = sys::DirBuf::new(64 * 1024);
        loop {
            let batch = sys::getdents(rd.as_fd(), &mut buf)?;
            if batch.is_empty() {
                return Ok(());
            }
            for e in batch.iter().filter(|e| is_copyup_temp(&e.name)) {
                let name = CString::new(e.name.clone()).map_err(|_| errno(libc::EINVAL))?;
                let is_dir = match e.dtype {
                    libc::DT_UNKNOWN => sys::fstatat(dir, &name)
                        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
                    t => t == libc::DT_DIR,
                };
                let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
                sys::unlinkat(dir, &name, flags)?;
            }
        }
    }

    /// History learns a fill's entries as of the clone's instant `at`.
    fn record_fill(&self, dir: &Node, at: Seq, made: &[(Vec<u8>, CString)]) -> Result<()> {
        let Some(c) = self.capture() else {
            return Ok(());
        };
        let mut entries: Vec<(Vec<u8>, Binding)> = Vec::with_capacity(made.len());
        // A union's create policy may have put the clone in any branch.
        let branch = self.inodes.branch_of(&dir.key);
        for (name, cname) in made {
            let fd = sys::open_path(dir.fd(), cname)?;
            let st = sys::fstat(fd.as_fd())?;
            let inode = self.inodes.acquire_new_in(branch, fd, &st, false)?;
            let binding = super::versioning::Live(self).binding_of(&inode);
            inode.set_name(dir.ino, name);
            self.inodes.forget(inode.ino, 1);
            entries.push((name.clone(), binding));
        }
        c.filled(dir.ino.object(), entries, at)?;
        Ok(())
    }

    /// Makes `name` in `dir` a copy of `base` (metadata only: a regular
    /// file gets its size and a mark, a directory a mark).
    fn copy_entry(
        &self,
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
        base: &PastNode,
        mark: Mark,
    ) -> Result<()> {
        let prepared = self.prepare_entry(dir, base, mark)?;
        let published = prepared.publish(dir, name, false);
        if published.is_err() {
            prepared.discard(dir);
        }
        published
    }

    /// Where `base` is a non-directory with several names, the index entry
    /// every name of it in this clone links to (so that they stay one
    /// file), and the link count the clone shows for it: its names inside
    /// the clone's source then (all of them, where history does not know
    /// each). None in a union mount, whose index is the union's, and for
    /// a mark of format 1, which does not name its clone.
    fn linked_copy(&self, mark: &Mark, base: &PastNode) -> Result<Option<(CString, u32)>> {
        if mark.clone_id == 0 {
            return Ok(None);
        }
        let (obj, mode, nlink) = match base {
            PastNode::Hist { obj, v, .. } => (*obj, v.attrs.mode, v.attrs.nlink),
            PastNode::Live { obj, st, fd } => {
                let obj = match obj {
                    Some(o) => *o,
                    None => self.inodes.number_for(self.inodes.key_of(st))?.object(),
                };
                // A clone's linked copy shows its own count, not the
                // backing one (which counts its index entry).
                let shown = match st.st_nlink > 1 {
                    true => crate::union::index::nlink(fd.as_fd(), self.clone_ns())?,
                    false => None,
                };
                (obj, st.st_mode, shown.unwrap_or(st.st_nlink as u32))
            }
        };
        // Symlinks, devices and FIFOs too, where their index xattrs can
        // be set (`trusted.`): else each name becomes an object of its own.
        if !super::union_links::indexable_kind(mode, self.clone_ns()) || nlink < 2 {
            return Ok(None);
        }
        let source = &mark.path[..usize::from(mark.depth)];
        let within = self.with_past(|p| {
            p.history
                .names_within(obj, mark.at, source, nlink)
                .map_err(|e| super::views::past_err(e.into()))
        })?;
        // Its only name in the clone needs no index.
        if within == Some(1) {
            return Ok(None);
        }
        let entry = format!("clone{}-{:x}", mark.clone_id, obj.get());
        let entry = CString::new(entry).map_err(|_| errno(libc::EINVAL))?;
        Ok(Some((entry, within.unwrap_or(nlink).max(1))))
    }

    /// The hard-link index that takes the linked copies of a clone's
    /// directory `dir` (made if there is none): that of the branch `dir` is
    /// in (a link cannot cross branches), else the one in the mount's root.
    fn clone_link_index(&self, dir: &Node) -> Result<Arc<OwnedFd>> {
        match self.union() {
            Some(u) => u.index_or_make_in(self.inodes.branch_of(&dir.key)),
            None => Ok(Arc::new(crate::union::index::open_or_make(
                self.branch.root_fd(),
            )?)),
        }
    }

    /// Makes `name` in `dir` a name of the clone's copy of `base`, a file
    /// with several names: a link to its index entry, made (a copy with
    /// the link count to show) by the first of its names to be filled.
    /// The entry is durable before any name links to it, so a name never
    /// outlives a crash without it.
    fn copy_linked_entry(
        &self,
        (dir_node, name): (&Node, &std::ffi::CStr),
        base: &PastNode,
        mark: Mark,
        (entry, links): &(CString, u32),
        index: &mut Option<Arc<OwnedFd>>,
    ) -> Result<()> {
        let ix = match index {
            Some(fd) => fd,
            None => index.insert(self.clone_link_index(dir_node)?),
        };
        let ix = ix.as_fd();
        let dir = dir_node.fd();
        let prepared = match sys::open_path(ix, entry) {
            Ok(copy) => {
                let hidden = temp_name();
                sys::link_fd(copy.as_fd(), dir, &hidden)?;
                Prepared {
                    hidden,
                    is_dir: false,
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let prepared = self.prepare_entry(dir, base, mark)?;
                let ns = self.clone_ns();
                let indexed = (|| -> Result<()> {
                    let copy = sys::open_path(dir, &prepared.hidden)?;
                    crate::union::index::set_entry(copy.as_fd(), ns, entry)?;
                    crate::union::index::set_nlink(copy.as_fd(), ns, *links)?;
                    sys::link_fd(copy.as_fd(), ix, entry)?;
                    let ix = sys::reopen_dir(ix, libc::O_RDONLY)?;
                    Ok(sys::fsync(ix.as_fd(), false)?)
                })();
                if let Err(e) = indexed {
                    prepared.discard(dir);
                    return Err(e);
                }
                prepared
            }
            Err(e) => return Err(e.into()),
        };
        let published = prepared.publish(dir, name, false);
        if published.is_err() {
            prepared.discard(dir);
        }
        published
    }

    /// Makes a copy of `base` (metadata only: a regular file gets its size
    /// and a mark, a directory a mark) under a hidden name in `dir`.
    pub(super) fn prepare_entry(
        &self,
        dir: BorrowedFd<'_>,
        base: &PastNode,
        mark: Mark,
    ) -> Result<Prepared> {
        let (mut st, mut xattrs, target) = describe(base)?;
        xattrs.retain(|(name, _)| mark.keeps_xattr(&st, name));
        st.st_mode = mark.mode_for(&st);
        let kind = st.st_mode & libc::S_IFMT;
        let prepared = Prepared {
            hidden: temp_name(),
            is_dir: kind == libc::S_IFDIR,
        };
        let hidden = &prepared.hidden;
        let mut made_mark = None;
        match kind {
            libc::S_IFDIR => {
                sys::mkdirat(dir, hidden, 0o700)?;
                made_mark = Some(Mark { dir: true, ..mark });
            }
            libc::S_IFREG => {
                let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW;
                let fd = sys::openat(dir, hidden, flags, 0o600)?;
                sys::ftruncate(fd.as_fd(), st.st_size as u64)?;
                made_mark = Some(mark);
            }
            libc::S_IFLNK => {
                let t =
                    CString::new(target.unwrap_or_default()).map_err(|_| errno(libc::EINVAL))?;
                sys::symlinkat(&t, dir, hidden)?;
            }
            _ => sys::mknodat(dir, hidden, kind | 0o600, st.st_rdev)?,
        }
        let done = (|| -> Result<()> {
            let fd = sys::open_path(dir, hidden)?;
            if let Some(m) = made_mark {
                sys::setxattr_fd(fd.as_fd(), self.clone_ns().clone_mark(), &m.encode(), 0)?;
            }
            let ns = self.clone_ns();
            let union = self.union().is_some();
            // In a union the namespace's overlay markers are the union's
            // (a copied one would hide or redirect); elsewhere they are
            // the user's (a layer tree kept in the mount), but for the
            // mount's own.
            xattrs.retain(|(name, _)| {
                if union {
                    !is_overlay_xattr(name, ns)
                } else {
                    !is_chronofs_xattr(name, ns)
                }
            });
            set_meta(fd.as_fd(), &st, &xattrs)
        })();
        match done {
            Ok(()) => Ok(prepared),
            Err(e) => {
                prepared.discard(dir);
                Err(e)
            }
        }
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

    fn copy_base(&self, fh: u64, to: BorrowedFd<'_>) -> Result<()> {
        let out = sys::reopen(to, libc::O_WRONLY)?;
        let mut off = 0u64;
        loop {
            let buf = self.view_read(fh, off, COPY_STEP as u32)?;
            if buf.is_empty() {
                break;
            }
            let mut done = 0;
            while done < buf.len() {
                done += sys::pwrite(out.as_fd(), &buf[done..], off + done as u64)?;
            }
            off += buf.len() as u64;
        }
        sys::fsync(out.as_fd(), false)?;
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

/// A copy made under a hidden name, not yet in place.
pub(super) struct Prepared {
    pub(super) hidden: CString,
    pub(super) is_dir: bool,
}

impl Prepared {
    /// Gives it `name` (replacing what is there only if `replace`).
    pub(super) fn publish(
        &self,
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
        replace: bool,
    ) -> Result<()> {
        let flags = if replace { 0 } else { libc::RENAME_NOREPLACE };
        Ok(sys::renameat2(dir, &self.hidden, dir, name, flags)?)
    }

    pub(super) fn discard(&self, dir: BorrowedFd<'_>) {
        let flags = if self.is_dir { libc::AT_REMOVEDIR } else { 0 };
        let _ = sys::unlinkat(dir, &self.hidden, flags);
    }
}

/// A base object's attributes, xattrs and symlink target.
type Described = (Stat, Vec<(Vec<u8>, Vec<u8>)>, Option<Vec<u8>>);

fn describe(base: &PastNode) -> Result<Described> {
    match base {
        PastNode::Hist { v, .. } => {
            let a = &v.attrs;
            let mut st = sys::zeroed_stat();
            st.st_mode = a.mode;
            st.st_uid = a.uid;
            st.st_gid = a.gid;
            st.st_rdev = a.rdev;
            st.st_size = a.size as i64;
            (st.st_atime, st.st_atime_nsec) = (a.atime.sec, i64::from(a.atime.nsec));
            (st.st_mtime, st.st_mtime_nsec) = (a.mtime.sec, i64::from(a.mtime.nsec));
            let target = match &v.content {
                Content::Symlink { target } => Some(target.clone()),
                _ => None,
            };
            Ok((st, v.xattrs.clone(), target))
        }
        PastNode::Live { fd, st, .. } => {
            let target = (st.st_mode & libc::S_IFMT == libc::S_IFLNK)
                .then(|| sys::readlink_fd(fd.as_fd()))
                .transpose()?;
            let xattrs = if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                Vec::new()
            } else {
                sys::xattrs_of(fd.as_fd())?
            };
            Ok((*st, xattrs, target))
        }
    }
}

/// Owner, xattrs, mode, times: the order in which none undoes another
/// (chown clears set-id bits; times last). Without the privilege to give
/// an object away, the daemon's own ownership stays.
fn set_meta(fd: BorrowedFd<'_>, st: &Stat, xattrs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
    match sys::chown_fd(fd, st.st_uid, st.st_gid) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && sys::geteuid() != 0 => {}
        other => other?,
    }
    let symlink = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
    if !symlink {
        for (name, value) in xattrs {
            let name = CString::new(name.clone()).map_err(|_| errno(libc::EINVAL))?;
            sys::setxattr_fd(fd, &name, value, 0)?;
        }
        // The copy was made in a directory of the clone that already has
        // its base's default ACL, which the copy inherited: its base's
        // own ACLs are the only ones it may keep (an inherited named
        // entry let a third user read a file its base kept from them).
        drop_inherited_acls(fd, xattrs)?;
        sys::chmod_fd(fd, st.st_mode & 0o7777)?;
    }
    keep_times(fd, st)
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
