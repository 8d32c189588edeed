//! Union mounts in the vfs: lookups through a directory's layers, the
//! upper copy a change needs (copy-up), and whiteouts where a removed name
//! lives on in a read-only branch. docs/ARCHITECTURE.md "Union mounts".
//!
//! Outside union mounts none of this runs: `Vfs::union` is `None` and every
//! operation takes the single-branch path.

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::collections::HashSet;

use parking_lot::{Condvar, Mutex, RwLock};

use super::inodes::{Layer, Node};
use super::{errno, Attr, Entry, InodeNo, Result, Stat, Vfs, VfsError};
use crate::branch::{BranchId, DirBranch};
use crate::sys;
use crate::union::{copyup, format, merge};

/// A branch of a union mount as the vfs is given it.
pub struct UnionBranch {
    pub branch: DirBranch,
    pub writable: bool,
    /// The branch's persistent id (`Store::branch_ids`): the vfs's
    /// `BranchId`, which inode-map keys, layers and the hard-link index
    /// carry. Precedence is its place in the list (`BranchSet::rank`).
    pub id: u32,
}

/// One branch of the set in force.
pub(super) struct Member {
    pub(super) id: BranchId,
    pub(super) root: Arc<OwnedFd>,
    /// Read-write now; changes in place (`Vfs::set_branch_mode`).
    writable: AtomicBool,
    /// The branch's hard-link index, once it exists. Every read-write
    /// branch's counts, not only the upper one's: the copies it holds stay
    /// where they are when the upper branch moves (a branch added above, a
    /// mode change), and their lower names must still find them.
    index: RwLock<Option<Arc<OwnedFd>>>,
    /// Its index holds the copy of one of its own files
    /// (`index::holds_own`): a lookup of any regular file in it asks.
    holds_own: AtomicBool,
    /// Keeps other chronofs mounts from folding it (`branch::claim`).
    claim: Option<crate::branch::claim::Claim>,
    /// Its index was written by another union, whose ids its entries'
    /// names carry (this union's id -> that one's): a sandbox's view of
    /// its mount's branches (`Vfs::indexes_written_with`). Unset: this
    /// union's own ids.
    names: std::sync::OnceLock<std::collections::HashMap<u32, u32>>,
}

impl Member {
    pub(super) fn new(id: BranchId, root: Arc<OwnedFd>, writable: bool) -> Arc<Member> {
        let (index, holds_own) = Self::existing_index(id, Some(id.0), &root);
        let claim = crate::branch::claim::claim(root.as_fd())
            .map_err(|e| tracing::warn!("branch id {}: not claimed: {e}", id.0))
            .ok();
        Arc::new(Member {
            id,
            root,
            writable: AtomicBool::new(writable),
            index: RwLock::new(index),
            holds_own: AtomicBool::new(holds_own),
            claim,
            names: std::sync::OnceLock::new(),
        })
    }

    /// The branch to itself while a fold rewrites it: refused (EBUSY, one
    /// line) while another mount uses it. `position` names it.
    pub(super) fn exclusive(
        &self,
        position: usize,
    ) -> Result<Option<crate::branch::claim::Exclusive<'_>>> {
        let busy = |why: String| {
            VfsError::BranchBusy(format!(
                "branch {position} (id {}) {why}: nothing was merged",
                self.id.0
            ))
        };
        let held = match &self.claim {
            Some(c) => match c.exclusive() {
                Ok(held) => Some(held),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Err(busy("is a branch of another chronofs mount".into()))
                }
                Err(e) => return Err(e.into()),
            },
            None => None,
        };
        if let Some(point) = crate::branch::claim::mounts_over(self.root.as_fd())?.first() {
            return Err(busy(format!(
                "is a layer of the mount at {}",
                point.display()
            )));
        }
        Ok(held)
    }

    /// Its index, and whether that holds entries of its own files, which
    /// the index's names call `named` (`None`: never).
    fn existing_index(
        id: BranchId,
        named: Option<u32>,
        root: &OwnedFd,
    ) -> (Option<Arc<OwnedFd>>, bool) {
        // Any branch may be read: one that is not a union's upper branch
        // may hold anything under that name (a copy-up into it would fail
        // and say so).
        let unreadable = |e: std::io::Error| {
            tracing::warn!("union: branch {}: hard-link index unreadable: {e}", id.0);
        };
        match crate::union::index::open_existing(root.as_fd()) {
            Ok(Some(index)) => {
                let own = named.is_some_and(|named| {
                    crate::union::index::holds_own(index.as_fd(), named)
                        .map_err(unreadable)
                        .unwrap_or(false)
                });
                (Some(Arc::new(index)), own)
            }
            Ok(None) => (None, false),
            Err(e) => {
                unreadable(e);
                (None, false)
            }
        }
    }

    /// The branch's index was given entries by something else than a
    /// copy-up (a snapmerge's fold, a sandbox's commit): found again.
    pub(super) fn reopen_index(&self) {
        let (index, own) = Self::existing_index(self.id, self.named_id(self.id), &self.root);
        *self.index.write() = index;
        self.holds_own.store(own, Ordering::Release);
    }

    /// Its index is about to take entries for its own files.
    pub(super) fn assume_own(&self) {
        self.holds_own.store(true, Ordering::Release);
    }

    /// See [`Member::holds_own`].
    pub(super) fn holds_own(&self) -> bool {
        self.holds_own.load(Ordering::Acquire)
    }

    pub(super) fn writable(&self) -> bool {
        self.writable.load(Ordering::Acquire)
    }

    pub(super) fn index(&self) -> Option<Arc<OwnedFd>> {
        self.index.read().clone()
    }

    /// The id branch `b`'s objects go by in this branch's index entries'
    /// names; `None`: the union that wrote them does not have `b`, so
    /// none names its objects.
    pub(super) fn named_id(&self, b: BranchId) -> Option<u32> {
        match self.names.get() {
            Some(names) => names.get(&b.0).copied(),
            None => Some(b.0),
        }
    }

    /// Its index names branches as another union's ids `names` do.
    pub(super) fn set_names(&self, names: std::collections::HashMap<u32, u32>) {
        if self.names.set(names).is_err() {
            tracing::warn!("union: branch {}: index names given twice", self.id.0);
        }
        self.reopen_index();
    }
}

/// The branches in force, top first. Swapped whole by `branch add` and
/// `branch remove` (a new generation); state derived from an older set
/// (an inode's layers) is re-derived at its next use.
pub(super) struct BranchSet {
    pub(super) generation: u32,
    pub(super) members: Vec<Arc<Member>>,
}

/// The rank of a branch that is not in the set: below every member.
pub(super) const UNRANKED: u32 = u32::MAX;

impl BranchSet {
    /// Precedence: 0 is the top; [`UNRANKED`] for a branch not in the set.
    pub(super) fn rank(&self, b: BranchId) -> u32 {
        self.members
            .iter()
            .position(|m| m.id == b)
            .map_or(UNRANKED, |p| p as u32)
    }

    pub(super) fn member(&self, b: BranchId) -> Option<&Arc<Member>> {
        self.members.iter().find(|m| m.id == b)
    }

    /// Every branch's (id, read-write), top first: what the store records.
    pub(super) fn modes(&self) -> Vec<(u32, bool)> {
        self.members
            .iter()
            .map(|m| (m.id.0, m.writable()))
            .collect()
    }

    fn topmost_writable(&self) -> Option<BranchId> {
        self.members.iter().find(|m| m.writable()).map(|m| m.id)
    }
}

/// What the vfs knows of a union mount's branches.
pub struct Union {
    /// The branches in force. A mode changes in place; an insertion or
    /// removal swaps the set (`set_lock` held exclusively).
    set: RwLock<Arc<BranchSet>>,
    /// Where copy-ups (and `create=top`'s creates) go: the highest
    /// read-write branch (`NO_UPPER` if none), following mode changes.
    upper: AtomicU32,
    /// The branch the root inode belongs to, fixed at mount (the upper
    /// one then, else the top): the root's number and key stay put when
    /// modes change; its other copies are its layers. It cannot be
    /// removed while mounted.
    primary: BranchId,
    pub(super) ns: format::XattrNs,
    pub(super) opts: super::union_ops::UnionOptions,
    /// Held shared by every operation that may change the tree or derive
    /// state from the set, for its whole length, and exclusively by a
    /// branch change: nothing decided under the old set lands after the
    /// new one is in force.
    pub(super) set_lock: RwLock<()>,
    /// The branches (upper, lower) a snapmerge is folding one into the
    /// other, until the set without the upper one is in force: a lookup
    /// that saw an object in one and then missed it tries again, and a
    /// redirect followed from the upper one passes over the lower one's
    /// whiteouts ([`Union::folded_whiteout`]).
    fold: Mutex<Option<(BranchId, BranchId)>>,
    /// How many times a fold began or ended: an operation that failed
    /// because of a fold ending just then finds the fold gone when it
    /// looks, and must still try again.
    fold_changes: AtomicU64,
    /// Some member's index holds entries of its own files
    /// (`Member::holds_own`): only then does a lookup of a regular file
    /// with one link look at the member (every lookup passes here).
    any_holds_own: AtomicBool,
    /// Objects being copied up now: a second change to one of them waits
    /// for the first copy instead of making its own (whose link into
    /// place would then fail with EEXIST).
    copying: Mutex<HashSet<InodeNo>>,
    copied: Condvar,
}

/// Marks one object as being copied up, for its guard's lifetime.
pub(super) struct CopyingUp<'a> {
    union: &'a Union,
    ino: InodeNo,
}

impl Drop for CopyingUp<'_> {
    fn drop(&mut self) {
        self.union.copying.lock().remove(&self.ino);
        self.union.copied.notify_all();
    }
}

const NO_UPPER: u32 = u32::MAX;

impl Union {
    pub fn new(branches: &[UnionBranch], opts: super::union_ops::UnionOptions) -> Result<Union> {
        let mut members = Vec::with_capacity(branches.len());
        for b in branches {
            let fd = sys::reopen(b.branch.root_fd(), libc::O_PATH | libc::O_DIRECTORY)?;
            members.push(Member::new(BranchId(b.id), Arc::new(fd), b.writable));
        }
        let set = BranchSet {
            generation: 0,
            members,
        };
        let upper = set.topmost_writable();
        // The branch holding the store, which cannot be removed; else the
        // upper one, else the top.
        let store = branches
            .iter()
            .find(|b| b.branch.reserved_name().is_some())
            .map(|b| BranchId(b.id));
        let primary = store
            .or(upper)
            .unwrap_or_else(|| set.members.first().map_or(BranchId(0), |m| m.id));
        let any_holds_own = set.members.iter().any(|m| m.holds_own());
        Ok(Union {
            set: RwLock::new(Arc::new(set)),
            upper: AtomicU32::new(upper.map_or(NO_UPPER, |b| b.0)),
            primary,
            ns: opts.xattr_ns,
            opts,
            set_lock: RwLock::new(()),
            fold: Mutex::new(None),
            fold_changes: AtomicU64::new(0),
            any_holds_own: AtomicBool::new(any_holds_own),
            copying: Mutex::new(HashSet::new()),
            copied: Condvar::new(),
        })
    }

    /// Whether a snapmerge is folding two branches (see `Union::fold`).
    pub(super) fn merging(&self) -> bool {
        self.fold.lock().is_some()
    }

    pub(super) fn set_fold(&self, fold: Option<(BranchId, BranchId)>) {
        *self.fold.lock() = fold;
        self.fold_changes.fetch_add(1, Ordering::AcqRel);
    }

    /// A mark to pass to [`Vfs::gone_mid_fold`] (see `fold_changes`).
    pub(super) fn fold_mark(&self) -> u64 {
        self.fold_changes.load(Ordering::Acquire)
    }

    /// Whether a redirect followed from branch `from` passes over a
    /// whiteout in `member`: while `from` is folded into `member`. Such a
    /// whiteout was put there by the fold, as the lower copy of one the
    /// renamed directory's own rename left in `from`, or the directory
    /// moved into `member` already (its inode not yet told), where its
    /// redirect is followed from below `member`. Either way the union
    /// showed what lies below it.
    pub(super) fn folded_whiteout(&self, from: BranchId, member: BranchId) -> bool {
        *self.fold.lock() == Some((from, member))
    }

    /// The set in force.
    pub(super) fn set(&self) -> Arc<BranchSet> {
        self.set.read().clone()
    }

    /// Whether member `b`'s index may hold entries of its own files.
    pub(super) fn holds_own(&self, b: BranchId) -> bool {
        self.any_holds_own.load(Ordering::Acquire)
            && self.set().member(b).is_some_and(|m| m.holds_own())
    }

    /// Member `b`'s index was given entries by something else than a
    /// copy-up (a snapmerge's fold, a sandbox's commit): found again.
    /// `assume_own`: entries of its own files may come before the next
    /// look (a fold under way).
    pub(super) fn reopen_index(&self, b: BranchId, assume_own: bool) {
        if let Some(m) = self.set().member(b) {
            m.reopen_index();
            if assume_own {
                m.assume_own();
            }
            if m.holds_own() {
                self.any_holds_own.store(true, Ordering::Release);
            }
        }
    }

    /// Some member's index was found to hold entries of its own files.
    pub(super) fn note_holds_own(&self) {
        if self.set().members.iter().any(|m| m.holds_own()) {
            self.any_holds_own.store(true, Ordering::Release);
        }
    }

    /// Puts `set` in force; the caller holds `set_lock` exclusively.
    pub(super) fn swap_set(&self, set: BranchSet) -> Result<()> {
        if set.members.iter().any(|m| m.holds_own()) {
            self.any_holds_own.store(true, Ordering::Release);
        }
        *self.set.write() = Arc::new(set);
        self.follow_upper();
        Ok(())
    }

    /// The branch the root inode belongs to.
    pub fn primary(&self) -> BranchId {
        self.primary
    }

    /// The root's copies in the other branches.
    pub fn root_layers(&self) -> Vec<Layer> {
        let primary = self.primary();
        self.set()
            .members
            .iter()
            .filter(|m| m.id != primary)
            .map(|m| Layer {
                branch: m.id,
                fd: m.root.clone(),
            })
            .collect()
    }

    /// Every branch's id and root, top first.
    pub fn roots(&self) -> Vec<(BranchId, Arc<OwnedFd>)> {
        self.set()
            .members
            .iter()
            .map(|m| (m.id, m.root.clone()))
            .collect()
    }

    pub(super) fn upper(&self) -> Option<BranchId> {
        match self.upper.load(Ordering::Acquire) {
            NO_UPPER => None,
            b => Some(BranchId(b)),
        }
    }

    pub(super) fn root_of(&self, b: BranchId) -> Option<Arc<OwnedFd>> {
        self.set().member(b).map(|m| m.root.clone())
    }

    /// Precedence of branch `b` (0: top; [`UNRANKED`]: not in the set).
    pub(super) fn rank(&self, b: BranchId) -> u32 {
        self.set.read().rank(b)
    }

    /// Whether nothing lies below branch `b`: an opaque mark or a redirect
    /// there has no lower copy to hide or point to.
    pub(super) fn is_bottom(&self, b: BranchId) -> bool {
        let set = self.set.read();
        set.rank(b) as usize + 1 >= set.members.len()
    }

    /// A union of one branch: nothing is ever copied up.
    pub(super) fn single_branch(&self) -> bool {
        self.set.read().members.len() == 1
    }

    pub(super) fn writable(&self, b: BranchId) -> bool {
        self.set.read().member(b).is_some_and(|m| m.writable())
    }

    /// One read-write branch, the one inode keys name by default
    /// (`primary`), with no hard-link index: the union is that directory.
    /// Removes and renames then take the single-directory mount's path:
    /// nothing lies below to hide or copy up, and no link count is kept
    /// beside the file system's. Stable while `set_lock` is held.
    pub(super) fn is_one_directory(&self, primary: BranchId) -> bool {
        let set = self.set.read();
        matches!(&set.members[..], [m] if m.id == primary && m.writable() && m.index().is_none())
    }

    /// Waits until no other thread copies `ino` up, then marks it as
    /// being copied by this one. Parents are entered while children are
    /// held, never the reverse, so two copy-ups cannot wait on each other.
    pub(super) fn copying_up(&self, ino: InodeNo) -> CopyingUp<'_> {
        let mut copying = self.copying.lock();
        while copying.contains(&ino) {
            self.copied.wait(&mut copying);
        }
        copying.insert(ino);
        CopyingUp { union: self, ino }
    }

    /// Every branch's id and mode now, top first.
    pub(super) fn modes(&self) -> Vec<(BranchId, bool)> {
        self.set()
            .members
            .iter()
            .map(|m| (m.id, m.writable()))
            .collect()
    }

    /// Branch `b`'s hard-link index, if it has one.
    pub(super) fn index_of(&self, b: BranchId) -> Option<Arc<OwnedFd>> {
        self.set().member(b)?.index()
    }

    /// The branches from the top down to branch `b` itself that have an
    /// index, top first: where a copy of one of its linked files may be.
    /// Read-only ones count (a snapshot froze the copies it held), and
    /// `b`'s own (a snapmerge moved the copies of its files into it).
    pub(super) fn indexes_over(&self, b: BranchId) -> Vec<(BranchId, Arc<OwnedFd>)> {
        let set = self.set();
        let upto = set
            .members
            .iter()
            .position(|m| m.id == b)
            .map_or(set.members.len(), |at| at + 1);
        set.members[..upto]
            .iter()
            .filter_map(|m| Some((m.id, m.index()?)))
            .collect()
    }

    /// The index, made in the upper branch if it has none yet.
    pub(super) fn index_or_make(&self) -> Result<Arc<OwnedFd>> {
        self.index_or_make_in(self.upper().ok_or(errno(libc::EROFS))?)
    }

    /// Branch `b`'s index, made if it has none yet (a clone's hard links
    /// live in the branch its create policy put it in).
    pub(super) fn index_or_make_in(&self, b: BranchId) -> Result<Arc<OwnedFd>> {
        let set = self.set();
        let m = set.member(b).ok_or(errno(libc::EROFS))?;
        let mut index = m.index.write();
        if let Some(fd) = &*index {
            return Ok(fd.clone());
        }
        let fd = Arc::new(crate::union::index::open_or_make(m.root.as_fd())?);
        *index = Some(fd.clone());
        Ok(fd)
    }

    /// Sets branch `b`'s mode; the caller holds `set_lock` exclusively.
    /// The upper branch follows.
    pub(super) fn set_mode(&self, b: BranchId, writable: bool) -> Result<()> {
        let set = self.set();
        let m = set.member(b).ok_or(errno(libc::ENOENT))?;
        m.writable.store(writable, Ordering::Release);
        self.follow_upper();
        Ok(())
    }

    /// Makes branch `b` read-only without choosing a new upper branch (a
    /// set swap that follows does); the caller holds `set_lock`
    /// exclusively.
    pub(super) fn freeze(&self, b: BranchId) {
        if let Some(m) = self.set().member(b) {
            m.writable.store(false, Ordering::Release);
        }
    }

    /// Makes the upper branch the set's topmost read-write one.
    fn follow_upper(&self) {
        let upper = self.set().topmost_writable();
        self.upper
            .store(upper.map_or(NO_UPPER, |u| u.0), Ordering::Release);
    }
}

/// What a walk down a directory's layers found under one name.
pub(super) struct Found {
    /// The topmost copy: its branch, the directory holding it, its stat.
    pub(super) top: (BranchId, Arc<OwnedFd>, Stat),
    /// Below a directory: the same directory in lower branches, down to an
    /// opaque one.
    pub(super) lowers: Vec<Layer>,
}

pub(super) fn is_absent(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

pub(super) fn is_dir(st: &Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

impl Vfs {
    pub(super) fn union(&self) -> Option<&Union> {
        self.union.as_ref()
    }

    /// A directory's copies, top-down: its own and its layers. A node
    /// found before the branch set last changed (a caller may hold one
    /// across a swap) is brought up to the set in force first: its own
    /// copy may be in a branch that left the set with its objects moved
    /// to another (snapmerge), and would otherwise be dropped here.
    pub(super) fn layers_of(&self, dir: &Node) -> Result<Vec<Layer>> {
        // A directory reached through its upper copy (the root, once a
        // snapshot moved the upper branch off its own): its own copy is
        // one of its layers too. Taking the upper copy for it left the
        // own copy out, and a name living only there was not seen below
        // the upper branch (a rename left it showing, no whiteout).
        if dir.through_copy() {
            return self.layers_of(&self.node(dir.ino)?);
        }
        if self.union.is_some() && dir.generation() != self.inodes.generation() {
            let fresh = self.node(dir.ino)?;
            if fresh.generation() == self.inodes.generation() {
                return self.layers_of(&fresh);
            }
        }
        let mut all = self.inodes.layers(&dir.inode)?;
        all.push(Layer {
            branch: self.inodes.branch_of(&dir.key),
            fd: dir.fd_arc(),
        });
        self.by_rank(&mut all);
        Ok(all)
    }

    /// Puts copies in precedence order, top first, leaving out those of
    /// branches no longer in the set.
    pub(super) fn by_rank(&self, copies: &mut Vec<Layer>) {
        let Some(u) = self.union() else {
            return;
        };
        let set = u.set();
        copies.retain(|l| set.rank(l.branch) != UNRANKED);
        copies.sort_by_key(|l| set.rank(l.branch));
    }

    /// Walks `name` down the layers of `dir`: whiteouts end it, a
    /// non-directory ends it, an opaque directory ends it.
    pub(super) fn walk(&self, dir: &Node, name: &CStr) -> Result<Option<Found>> {
        self.walk_layers(&self.layers_of(dir)?, name)
    }

    /// [`Vfs::walk`] down a directory's copies `dir` (top-down), which
    /// need not be an inode's (the eager baseline walks without any).
    pub(super) fn walk_layers(&self, dir: &[Layer], name: &CStr) -> Result<Option<Found>> {
        let u = self.union.as_ref().ok_or(VfsError::WrongKind)?;
        let mut found: Option<Found> = None;
        for layer in dir.iter().cloned() {
            let st = match sys::fstatat(layer.fd.as_fd(), name) {
                Ok(st) => st,
                Err(e) if is_absent(&e) => continue,
                Err(e) => return Err(e.into()),
            };
            if format::is_whiteout_in(layer.fd.as_fd(), name, &st, u.ns)? {
                break;
            }
            let opaque_below = |fd: BorrowedFd<'_>| format::is_opaque(fd, u.ns).unwrap_or(false);
            match &mut found {
                None => {
                    let mut stop = !is_dir(&st);
                    let mut lowers = Vec::new();
                    // In the bottom branch there is nothing below to look
                    // for: its directory's marks need not be read.
                    if !stop && !u.is_bottom(layer.branch) {
                        let fd = sys::open_path(layer.fd.as_fd(), name)?;
                        stop = opaque_below(fd.as_fd());
                        if !stop {
                            if let Some(origin) = format::redirect(fd.as_fd(), u.ns)? {
                                // A directory renamed in the union: its lower
                                // copies are where it came from.
                                lowers = self.redirected_lowers(layer.branch, dir, &origin)?;
                                stop = true;
                            }
                        }
                    }
                    found = Some(Found {
                        top: (layer.branch, layer.fd.clone(), st),
                        lowers,
                    });
                    if stop {
                        break;
                    }
                }
                Some(f) => {
                    if !is_dir(&st) {
                        break;
                    }
                    let fd = sys::open_path(layer.fd.as_fd(), name)?;
                    let marked = !u.is_bottom(layer.branch);
                    let opaque = marked && opaque_below(fd.as_fd());
                    // A lower copy renamed in its time (`mv a b`, then a
                    // snapshot; the top copy made later carries no
                    // redirect): the copies below it are where it came
                    // from, as overlayfs follows a redirect in any layer.
                    let origin = match marked && !opaque {
                        true => format::redirect(fd.as_fd(), u.ns)?,
                        false => None,
                    };
                    f.lowers.push(Layer {
                        branch: layer.branch,
                        fd: Arc::new(fd),
                    });
                    if let Some(origin) = origin {
                        f.lowers
                            .extend(self.redirected_lowers(layer.branch, dir, &origin)?);
                        break;
                    }
                    if opaque {
                        break;
                    }
                }
            }
        }
        Ok(found)
    }

    /// Whether directory `dir` is `ancestor` or below it, by the names
    /// the kernel reached each directory by (a directory moved into its
    /// own subtree: EINVAL; the kernel checks it first too).
    pub(super) fn is_within(&self, dir: InodeNo, ancestor: InodeNo) -> bool {
        let mut cur = dir;
        for _ in 0..4096 {
            if cur == ancestor {
                return true;
            }
            match self.inodes.get(cur).ok().and_then(|i| i.name()) {
                Some((parent, _)) if cur != InodeNo::ROOT => cur = parent,
                _ => return false,
            }
        }
        false
    }

    /// Whether `name` resolves to anything in union directory `dir`.
    pub(super) fn lookup_exists(&self, dir: &Node, name: &OsStr) -> Result<bool> {
        if format::is_hidden_temporary(name.as_bytes()) {
            return Ok(false);
        }
        Ok(self.walk(dir, &sys::cstr(name)?)?.is_some())
    }

    /// Whether a snapmerge is folding two branches now, or one began or
    /// ended since `mark` ([`Vfs::fold_mark`]) was taken.
    fn gone_mid_fold(&self, mark: u64) -> bool {
        self.union()
            .is_some_and(|u| u.merging() || u.fold_mark() != mark)
    }

    fn fold_mark(&self) -> u64 {
        self.union().map_or(0, |u| u.fold_mark())
    }

    /// Whether `e` says a directory copy is gone because a snapmerge
    /// running now moved what it held down and removed it.
    pub(super) fn gone_mid_merge(&self, e: &std::io::Error) -> bool {
        e.raw_os_error() == Some(libc::ENOENT) && self.union().is_some_and(|u| u.merging())
    }

    /// A union directory opened for reading when its top copy is
    /// [`Vfs::gone_mid_merge`]: the first of its copies still there.
    pub(super) fn surviving_copy(
        &self,
        caller: &super::Caller,
        dir: &Node,
        access: i32,
    ) -> Result<OwnedFd> {
        for layer in self.layers_of(dir)? {
            let fd = layer.fd.clone();
            match crate::sys::creds::as_caller(caller, || sys::reopen_dir(fd.as_fd(), access)) {
                Ok(fd) => return Ok(fd),
                Err(e) if self.gone_mid_merge(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(errno(libc::ENOENT))
    }

    /// Lookup in a union directory.
    pub(super) fn union_lookup(&self, dir: &Node, name: &OsStr) -> Result<Entry> {
        let mut tries = 0;
        loop {
            let mark = self.fold_mark();
            match self.union_lookup_once(dir, name) {
                // Moved to a lower branch between being found and opened.
                Err(e) if e.errno_is(libc::ENOENT) && tries < 3 && self.gone_mid_fold(mark) => {
                    tries += 1
                }
                r => return r,
            }
        }
    }

    fn union_lookup_once(&self, dir: &Node, name: &OsStr) -> Result<Entry> {
        if !dir.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        if format::is_hidden_temporary(name.as_bytes()) {
            return Err(errno(libc::ENOENT));
        }
        let u = self.union.as_ref().ok_or(VfsError::WrongKind)?;
        // What it finds is stamped with the set in force: none may swap in
        // meanwhile.
        let _set = self.changing();
        let mut cname = sys::cstr(name)?;
        let found = self.walk(dir, &cname)?.ok_or(errno(libc::ENOENT))?;
        let (mut branch, mut parent, mut st) = found.top;
        let indexed = self.indexed_instead(u, branch, &st)?;
        let via_index = indexed.is_some();
        if let Some((index_branch, index, entry, entry_st)) = indexed {
            // Another name of this lower file was copied up: this one
            // shows the copy too.
            (branch, parent, st, cname) = (index_branch, index, entry_st, entry);
        }
        let key = self.inodes.key_in(branch, &st);
        if let Some(inode) = self.inodes.acquire_known(&key) {
            if self.inodes.still_names(&inode, parent.as_fd(), &cname) {
                // Copy-up finds the lower copy by this name.
                inode.set_name(dir.ino, name.as_encoded_bytes());
                let generation = self.inodes.generation();
                if inode.generation() != generation {
                    self.inodes
                        .set_layers(&inode, found.lowers.clone(), generation);
                    if inode.is_dir() {
                        inode.mark_recheck();
                    }
                }
                // Also an inode made elsewhere first (a clone's file a
                // `.history/` lookup reached): its count must follow links.
                // A linked file found in no index is not read again.
                let unnoted = inode.union_nlink().is_none();
                let linked = super::union_links::is_linked(&st, u.ns) && !inode.known_unindexed();
                if unnoted && (via_index || linked) {
                    let node = self.inodes.node_of(inode.clone())?;
                    self.note_if_indexed(u, &inode, (node.fd(), &st), via_index);
                }
                return Ok(Entry {
                    attr: Attr {
                        ino: inode.ino,
                        st: self.shown(inode.ino, st),
                    },
                    entry_ttl: self.union_entry_ttl(u, branch, &st),
                });
            }
            self.inodes.forget(inode.ino, 1);
            self.inodes.detach_key(&inode);
        }
        let moved = match is_dir(&st) && self.inodes.generation() != 0 {
            true => self.dir_moved_up(branch, (&parent, &cname), &found.lowers)?,
            false => None,
        };
        let inode = match moved {
            Some(inode) => inode,
            None => {
                let fd = sys::open_path(parent.as_fd(), &cname)?;
                let st = sys::fstat(fd.as_fd())?;
                let lowers = found.lowers.clone();
                let mut inode = self.inodes.acquire_in(branch, fd, &st, found.lowers)?;
                if inode.key != self.inodes.key_in(branch, &st)
                    && inode.generation() != self.inodes.generation()
                {
                    // The number's inode is a copy in a branch that left
                    // the set (one a snapmerge folded into this one, its
                    // copy possibly gone): it is this object now.
                    let fd = sys::open_path(parent.as_fd(), &cname)?;
                    let st = sys::fstat(fd.as_fd())?;
                    inode = self
                        .inodes
                        .rebind_keeping(inode.ino, branch, fd, &st, lowers)?;
                    self.attrs_changed(inode.ino);
                }
                // Made after a branch set change, a directory's first use
                // compares its entries with history whatever its
                // attributes: the kernel may have forgotten it meanwhile,
                // and with it the mark `Vfs::node` would have set.
                if inode.is_dir() && self.inodes.generation() != 0 {
                    inode.mark_recheck();
                }
                inode
            }
        };
        inode.set_name(dir.ino, name.as_encoded_bytes());
        let node = self.inodes.node_of(inode.clone())?;
        self.note_if_indexed(u, &inode, (node.fd(), &st), via_index);
        Ok(Entry {
            attr: Attr {
                ino: inode.ino,
                st: self.shown(inode.ino, st),
            },
            entry_ttl: self.union_entry_ttl(u, branch, &st),
        })
    }

    /// How long the kernel may trust a name found in `branch`: shorter
    /// where a copy-up may renumber it, or where another mount writes the
    /// branch ([`super::VfsConfig::lower_timeout`]).
    fn union_entry_ttl(&self, u: &Union, branch: BranchId, st: &Stat) -> Option<Duration> {
        let lower = self.cfg.lower_timeout.filter(|_| !u.writable(branch));
        match (splits_at_copy_up(u, branch, st), lower) {
            (Some(split), _) => Some(split),
            (None, Some(ttl)) => Some(ttl.min(self.cfg.entry_timeout)),
            (None, None) => None,
        }
    }

    /// A directory whose top copy is now in `branch` (in `at`) because the
    /// branch set changed, numbered before by one of its `lowers` (a lower
    /// copy has a number only if it was the top one): the inode the kernel
    /// knows it by, rebound to the new top copy, or, when the kernel no
    /// longer knows it, its number given to the new top copy (`None`: the
    /// caller's acquire finds it), so its number stays.
    fn dir_moved_up(
        &self,
        branch: BranchId,
        (parent, name): (&Arc<OwnedFd>, &CStr),
        lowers: &[Layer],
    ) -> Result<Option<Arc<super::inodes::Inode>>> {
        let fd = sys::open_path(parent.as_fd(), name)?;
        let st = sys::fstat(fd.as_fd())?;
        for l in lowers {
            let key = self.inodes.key_in(l.branch, &sys::fstat(l.fd.as_fd())?);
            let Some(known) = self.inodes.acquire_known(&key) else {
                if let Some(ino) = self.inodes.mapped(&key)? {
                    self.inodes.bind_copy(branch, &st, ino);
                    return Ok(None);
                }
                continue;
            };
            if !known.is_dir() {
                self.inodes.forget(known.ino, 1);
                continue;
            }
            let fd = sys::reopen(fd.as_fd(), libc::O_PATH | libc::O_DIRECTORY)?;
            let inode = self
                .inodes
                .rebind_keeping(known.ino, branch, fd, &st, lowers.to_vec())?;
            inode.mark_recheck();
            return Ok(Some(inode));
        }
        Ok(None)
    }

    /// The directory `ino` where a change to its entries goes: itself in a
    /// single-branch mount; in a union its copy in the upper branch, made
    /// (with its missing parents) if it has none yet.
    pub(super) fn writable_dir(&self, caller: &super::Caller, ino: InodeNo) -> Result<Node> {
        self.again_after_fold(ino, || self.writable_dir_once(caller, ino))
    }

    /// Runs `attempt` (a copy-up of `ino`, or of a directory it needs)
    /// again when it failed because a snapmerge's fold moved or removed
    /// what it copies from, once `ino` and its parents are found again
    /// where the fold put them. Mid-move an object may be found nowhere
    /// for a moment (ESTALE, ENOENT): the next try looks again. A fold
    /// that ended before the look still counts (`fold_mark`).
    fn again_after_fold<T>(&self, ino: InodeNo, attempt: impl Fn() -> Result<T>) -> Result<T> {
        self.again_after_fold_of(&[ino], attempt)
    }

    /// [`Vfs::again_after_fold`] for an operation using several objects
    /// (a rename's directories, moved object and target): each is found
    /// again before the next try. Costs one atomic load when it succeeds.
    pub(super) fn again_after_fold_of<T>(
        &self,
        inos: &[InodeNo],
        attempt: impl Fn() -> Result<T>,
    ) -> Result<T> {
        const TRIES: u32 = 8;
        let gone = |e: &VfsError| e.errno_is(libc::ENOENT) || e.errno_is(libc::ESTALE);
        let mut tries = 0;
        loop {
            let mark = self.fold_mark();
            let e = match attempt() {
                Err(e) if gone(&e) => e,
                r => return r,
            };
            if tries >= TRIES || !self.gone_mid_fold(mark) {
                return Err(e);
            }
            tries += 1;
            let mark = self.fold_mark();
            for &ino in inos {
                match self.found_again_mid_merge(ino) {
                    Err(e) if gone(&e) && tries < TRIES && self.gone_mid_fold(mark) => {}
                    r => r?,
                }
            }
        }
    }

    fn writable_dir_once(&self, caller: &super::Caller, ino: InodeNo) -> Result<Node> {
        let node = self.node(ino)?;
        let Some(u) = self.union.as_ref() else {
            return Ok(node);
        };
        let upper = u.upper().ok_or(errno(libc::EROFS))?;
        if self.inodes.branch_of(&node.key) == upper {
            return Ok(node);
        }
        let _one = u.copying_up(ino);
        // Another thread may have copied it while this one waited.
        let node = self.node(ino)?;
        if self.inodes.branch_of(&node.key) == upper {
            return Ok(node);
        }
        let lowers = self.inodes.layers(&node.inode)?;
        if let Some(l) = lowers.iter().find(|l| l.branch == upper) {
            return Ok(Node::with_fd(node.inode.clone(), l.fd.clone()));
        }
        // Below a read-only branch's opaque or redirected copy (or a file)
        // of it, the upper branch's copy would not show, nor anything
        // made or moved into it (a rename into it succeeded and the file
        // was nowhere to be seen).
        if u.rank(upper) > 0 && !self.reachable(&node, upper)? {
            return Err(errno(libc::EROFS));
        }
        let (parent, name) = node.name().ok_or(errno(libc::ESTALE))?;
        let upper_parent = self.writable_dir(caller, parent)?;
        let lower_parent = self.copy_in(parent, self.inodes.branch_of(&node.key))?;
        let cname = sys::cstr(OsStr::from_bytes(&name))?;
        let fd = copyup::copy_up_dir_identified(
            lower_parent.as_fd(),
            upper_parent.fd(),
            &cname,
            &u.opts.owner.resolve(caller.uid, caller.gid),
            &|_, st| {
                self.inodes.bind_copy(upper, st, ino);
                Ok(())
            },
        )?;
        let st = sys::fstat(fd.as_fd())?;
        let mut layers = vec![Layer {
            branch: self.inodes.branch_of(&node.key),
            fd: node.fd_arc(),
        }];
        layers.extend(lowers);
        let inode = self.inodes.rebind(ino, upper, fd, &st, layers)?;
        self.attrs_changed(ino);
        self.inodes.node_of(inode)
    }

    /// The mount root's copy that changes to it go to, when that is not
    /// the root's own: a snapshot or a mode change moved the upper branch
    /// off the primary one. The root shows that copy (a chmod of it shows).
    pub(super) fn root_copy_shown(&self, ino: InodeNo) -> Option<Arc<OwnedFd>> {
        if ino != InodeNo::ROOT {
            return None;
        }
        let u = self.union()?;
        let upper = u.upper()?;
        let node = self.node(ino).ok()?;
        if self.inodes.branch_of(&node.key) == upper {
            return None;
        }
        u.set().member(upper).map(|m| m.root.clone())
    }

    /// The copy of directory `dir` in `branch`.
    pub(super) fn copy_in(&self, dir: InodeNo, branch: BranchId) -> Result<Arc<OwnedFd>> {
        let node = self.node(dir)?;
        self.layers_of(&node)?
            .into_iter()
            .find(|l| l.branch == branch)
            .map(|l| l.fd)
            .ok_or(errno(libc::ESTALE))
    }

    /// The object `ino` where a change to it goes: itself, unless it lives
    /// in a read-only branch of a union: then a copy in the upper branch,
    /// under the same number.
    pub(super) fn writable_node(&self, caller: &super::Caller, ino: InodeNo) -> Result<Node> {
        self.writable_node_for(caller, ino, (false, None))
            .map(|(node, _)| node)
    }

    /// [`Vfs::writable_node`]; for an `open`, with the patched file a
    /// clone's file became (in no union: those are materialised).
    /// `keep`: the change truncates the file to that many bytes (an
    /// O_TRUNC open: 0), so a copy-up copies no more.
    pub(super) fn writable_node_for(
        &self,
        caller: &super::Caller,
        ino: InodeNo,
        (open, keep): (bool, Option<u64>),
    ) -> Result<(Node, Option<std::sync::Arc<super::clone_patch::Patched>>)> {
        // A clone's file copies up with its mark (its own blocks only), and
        // changes where the change goes: never in a read-only branch.
        let node = self.again_after_fold(ino, || {
            self.writable_in_union(caller, ino, self.node(ino)?, keep)
        })?;
        let made = match self.clones_on() {
            true => self.before_clone_change_for(&node, open)?,
            false => None,
        };
        Ok((node, made))
    }

    fn writable_in_union(
        &self,
        caller: &super::Caller,
        ino: InodeNo,
        node: Node,
        keep: Option<u64>,
    ) -> Result<Node> {
        let Some(u) = self.union.as_ref() else {
            return Ok(node);
        };
        if u.writable(self.inodes.branch_of(&node.key)) {
            return Ok(node);
        }
        self.upper_node_keeping(caller, ino, keep)
    }

    /// An overlayfs metacopy file is not opened (EIO): its bytes are a
    /// lower file's, which chronofs does not follow, and its own are a
    /// hole of its size, zeros that a change would keep for good.
    pub(super) fn refuse_metacopy(&self, ino: InodeNo) -> Result<()> {
        let Some(u) = self.union.as_ref() else {
            return Ok(());
        };
        let node = self.node(ino)?;
        if node.kind != libc::S_IFREG {
            return Ok(());
        }
        // Such a file has no blocks (overlayfs only sizes it): the xattr
        // read, a path walk, is for those alone, not every open.
        let st = sys::fstat(node.fd())?;
        if st.st_blocks != 0 || st.st_size == 0 || !format::is_metacopy(node.fd(), u.ns)? {
            return Ok(());
        }
        tracing::warn!(
            "open of {} refused (EIO): an overlayfs metacopy file, its data in a lower layer chronofs does not follow",
            self.shown_path(ino)
        );
        Err(errno(libc::EIO))
    }

    /// The path the kernel last reached `ino` by, for a log line.
    fn shown_path(&self, mut ino: InodeNo) -> String {
        let mut parts = Vec::new();
        // Bounded: a log line must not hang on a parent loop.
        while ino != InodeNo::ROOT && parts.len() < 4096 {
            let Some((parent, name)) = self.node(ino).ok().and_then(|n| n.name()) else {
                parts.push(b"?".to_vec());
                break;
            };
            parts.push(name);
            ino = parent;
        }
        parts.reverse();
        format!("/{}", String::from_utf8_lossy(&parts.join(&b'/')))
    }

    /// Whether a change to `ino` would copy it up from a read-only branch
    /// and could copy only what a truncation keeps of it (a plain regular
    /// file: a clone's file copies up with its mark).
    pub(super) fn copies_up_truncated(&self, ino: InodeNo) -> Result<bool> {
        let Some(u) = self.union.as_ref() else {
            return Ok(false);
        };
        let node = self.node(ino)?;
        Ok(!u.writable(self.inodes.branch_of(&node.key))
            && node.inode.kind == libc::S_IFREG
            && !self.clones_on())
    }

    /// The object `ino`'s copy in the upper branch, made (under the same
    /// number) if it lives in any other branch, read-write ones included:
    /// what a move across branches needs.
    pub(super) fn upper_node(&self, caller: &super::Caller, ino: InodeNo) -> Result<Node> {
        self.again_after_fold(ino, || self.upper_node_keeping(caller, ino, None))
    }

    /// [`Vfs::upper_node`] for a change that keeps only `keep` bytes of
    /// the file: a plain file copies no more (overlayfs's O_TRUNC copy-up);
    /// a hard-linked one, or a clone's, whole.
    fn upper_node_keeping(
        &self,
        caller: &super::Caller,
        ino: InodeNo,
        keep: Option<u64>,
    ) -> Result<Node> {
        let node = self.node(ino)?;
        let u = self.union.as_ref().ok_or(VfsError::WrongKind)?;
        let upper = u.upper().ok_or(errno(libc::EROFS))?;
        if self.inodes.branch_of(&node.key) == upper {
            return Ok(node);
        }
        if node.is_dir() {
            return self.writable_dir(caller, ino);
        }
        // A copy below the object's own (read-only) branch would stay
        // behind it: the next lookup finds the topmost copy, and the change
        // is lost. Nothing writable is above it (a mode change put the
        // upper branch below it).
        if u.rank(upper) > u.rank(self.inodes.branch_of(&node.key)) {
            return Err(errno(libc::EROFS));
        }
        let _one = u.copying_up(ino);
        // Another thread may have copied it while this one waited.
        let node = self.node(ino)?;
        if self.inodes.branch_of(&node.key) == upper {
            return Ok(node);
        }
        let (parent, name) = node.name().ok_or(errno(libc::ESTALE))?;
        let upper_parent = self.writable_dir(caller, parent)?;
        let node_branch = self.inodes.branch_of(&node.key);
        let cname = sys::cstr(OsStr::from_bytes(&name))?;
        let owner = u.opts.owner.resolve(caller.uid, caller.gid);
        let lower_st = sys::fstat(node.fd())?;
        // An index entry of a branch below (the upper one before a
        // snapshot or a branch was added) goes on through the index: its
        // other names reach it there, and follow its copy.
        let indexed = node.inode.union_nlink().is_some();
        if indexed || super::union_links::is_linked(&lower_st, u.ns) {
            // Asked for only when the copy is not of an index entry: the
            // name the node was reached by need not exist in the entry's
            // branch (a name of the lower file the index resolved).
            let lower_parent = || self.copy_in(parent, node_branch);
            let at = (&lower_parent as &dyn Fn() -> _, cname.as_c_str());
            let (fd, st) = self.copy_up_linked(u, &node, at, &upper_parent, &owner)?;
            let n = crate::union::index::nlink(fd.as_fd(), u.ns)?;
            let inode = self.inodes.rebind_linked(ino, upper, fd, &st)?;
            inode.set_union_nlink(n.unwrap_or(lower_st.st_nlink as u32).max(1));
            self.attrs_changed(ino);
            self.forget_patched(ino);
            return self.inodes.node_of(inode);
        }
        let lower_parent = self.copy_in(parent, node_branch)?;
        let keep = keep.filter(|_| !self.clones_on());
        if self.name_shows_other(upper_parent.fd(), &cname)? {
            // Open, but no name shows it any more (removed, or renamed
            // over): the change goes to a copy with no name, as a native
            // file system changes the nameless file.
            let fd = copyup::copy_up_file_unnamed(
                lower_parent.as_fd(),
                &cname,
                upper_parent.fd(),
                &owner,
                keep,
            )?;
            let st = sys::fstat(fd.as_fd())?;
            let inode = self.inodes.rebind(ino, upper, fd, &st, Vec::new())?;
            self.attrs_changed(ino);
            self.forget_patched(ino);
            return self.inodes.node_of(inode);
        }
        let fd = copyup::copy_up_file_identified(
            lower_parent.as_fd(),
            &cname,
            upper_parent.fd(),
            &owner,
            keep,
            &|_, st| {
                self.inodes.bind_copy(upper, st, ino);
                Ok(())
            },
        )?;
        let st = sys::fstat(fd.as_fd())?;
        let inode = self.inodes.rebind(ino, upper, fd, &st, Vec::new())?;
        self.attrs_changed(ino);
        self.forget_patched(ino);
        self.inodes.node_of(inode)
    }

    /// Whether `name` in the upper directory `dir`, where a lower object
    /// would be copied up, holds anything: a whiteout (the object was
    /// removed while open) or another object (a rename over it), which
    /// the name shows instead.
    fn name_shows_other(&self, dir: BorrowedFd<'_>, name: &CStr) -> Result<bool> {
        match sys::fstatat(dir, name) {
            Ok(_) => Ok(true),
            Err(e) if is_absent(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Before a name is created in `dir` (its upper copy): a whiteout there
    /// gives way. Returns whether one did (a directory made in its place
    /// must then be opaque, or the lower one's entries would show).
    pub(super) fn clear_whiteout(&self, dir: &Node, name: &CStr) -> Result<bool> {
        if self.union.is_none() {
            return Ok(false);
        }
        match sys::fstatat(dir.fd(), name) {
            Ok(st) if format::is_whiteout(&st) => {
                sys::unlinkat(dir.fd(), name, 0)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Whether `name` in `dir` is visible from a branch below `upper`
    /// (so removing the upper copy must leave a whiteout).
    pub(super) fn visible_below(&self, dir: &Node, name: &CStr, upper: BranchId) -> Result<bool> {
        let layers = self.layers_of(dir)?;
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let set = u.set();
        let at_or_above = |b: BranchId| set.rank(b) <= set.rank(upper);
        // Nothing below: no name to look for (a one-branch union).
        if layers.iter().all(|l| at_or_above(l.branch)) {
            return Ok(false);
        }
        for layer in layers {
            if at_or_above(layer.branch) {
                if let Ok(st) = sys::fstatat(layer.fd.as_fd(), name) {
                    if format::is_whiteout_in(layer.fd.as_fd(), name, &st, u.ns)? {
                        return Ok(false);
                    }
                }
                continue;
            }
            match sys::fstatat(layer.fd.as_fd(), name) {
                Ok(st) => return Ok(!format::is_whiteout_in(layer.fd.as_fd(), name, &st, u.ns)?),
                Err(e) if is_absent(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
    }

    /// ENOTEMPTY unless every copy of the directory holds nothing a user
    /// would see (whiteouts hide lower entries and are not themselves
    /// entries).
    pub(super) fn check_merged_empty(&self, found: &Found, name: &CStr) -> Result<()> {
        let u = self.union.as_ref().ok_or(VfsError::WrongKind)?;
        let (_, parent, _) = &found.top;
        let top = sys::open_path(parent.as_fd(), name)?;
        let mut listings = vec![merge::read_layer(top.as_fd(), u.ns)?];
        for l in &found.lowers {
            listings.push(merge::read_layer(l.fd.as_fd(), u.ns)?);
        }
        // A hidden temporary is no user's entry: an orphan goes with the
        // directory, one at work keeps the rmdir from succeeding.
        let merged = merge::merge(&listings);
        if merged
            .iter()
            .any(|m| m.layer.is_some() && !format::is_hidden_temporary(&m.name))
        {
            return Err(errno(libc::ENOTEMPTY));
        }
        Ok(())
    }

    /// Removes the whiteouts (and a crash's orphan temporaries) inside
    /// upper directory `name` of `dir`, so that it can be removed (its
    /// merged listing is known empty). Orphans go with `caller`'s identity
    /// when the removal is theirs: a name made to look like one, over
    /// someone else's tree, is not the daemon's to delete as root (then
    /// the directory is not empty: ENOTEMPTY).
    pub(super) fn clear_whiteouts_in(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        caller: Option<&super::Caller>,
    ) -> Result<()> {
        let sub = sys::openat(
            dir,
            name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        // Orphans first: one that may not go (ENOTEMPTY) leaves every
        // whiteout in place, so nothing below shows through. (One listing:
        // a second read of the descriptor would start at its end.)
        let listing = format::entries(sub.as_fd())?;
        self.clear_orphans_among(sub.as_fd(), &listing, caller)?;
        for e in &listing {
            let cn = sys::cstr(OsStr::from_bytes(&e.name))?;
            if sys::fstatat(sub.as_fd(), &cn).is_ok_and(|st| format::is_whiteout(&st)) {
                sys::unlinkat(sub.as_fd(), &cn, 0)?;
            }
        }
        Ok(())
    }

    /// Removes a crash's orphan temporaries in directory `sub` (as
    /// `caller` when given); one the caller may not remove: ENOTEMPTY.
    pub(super) fn clear_orphans_of(
        &self,
        sub: BorrowedFd<'_>,
        caller: Option<&super::Caller>,
    ) -> Result<()> {
        let listing = format::entries(sub)?;
        self.clear_orphans_among(sub, &listing, caller)
    }

    /// [`Vfs::clear_orphans_of`] with `sub`'s entries already read.
    fn clear_orphans_among(
        &self,
        sub: BorrowedFd<'_>,
        listing: &[sys::DirEntry],
        caller: Option<&super::Caller>,
    ) -> Result<()> {
        for e in listing {
            if !format::is_orphan(&e.name) {
                continue;
            }
            let cn = sys::cstr(OsStr::from_bytes(&e.name))?;
            let removed = match caller {
                Some(c) => crate::sys::creds::as_caller(c, || format::remove_orphan(sub, &cn)),
                None => format::remove_orphan(sub, &cn),
            };
            match removed {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                    return Err(errno(libc::ENOTEMPTY));
                }
                Err(e) if is_absent(&e) => {}
                r => r?,
            }
        }
        Ok(())
    }
}

impl Vfs {
    /// A union directory's entries from all its layers, merged by
    /// `union::merge`: each name once, whiteouts hiding names below them
    /// and never shown, in cookie order so offsets survive a reopen. The
    /// layers are read as the daemon, as overlayfs reads them with the
    /// mounter's credentials: the caller's right to list the directory
    /// was checked at opendir, on the copy whose attributes the union
    /// shows (a lower copy's own mode, say root's 0700 under a top copy
    /// chowned to the caller since, is not the directory's).
    pub(super) fn merged_listing(&self, dir: &Node) -> Result<Vec<super::dir::Dirent>> {
        let (merged, keys) = self.merged_entries(&self.layers_of(dir)?)?;
        let mut numbers = self.inodes.numbers_for(&keys)?.into_iter();
        let parent = if dir.ino == InodeNo::ROOT {
            InodeNo::ROOT
        } else {
            dir.name().map_or(InodeNo::ROOT, |(p, _)| p)
        };
        let mut out = Vec::with_capacity(merged.len());
        for m in merged {
            let ino = match (m.layer, m.pos) {
                (Some(_), _) => numbers.next().ok_or(VfsError::WrongKind)?,
                (None, merge::DOT_POS) => dir.ino,
                (None, _) => parent,
            };
            out.push(super::dir::Dirent {
                e: sys::DirEntry {
                    ino: m.ino,
                    next_offset: m.d_off,
                    dtype: m.dtype,
                    name: m.name,
                },
                ino: Some(ino),
                cookie: m.pos,
            });
        }
        Ok(out)
    }
}

impl Vfs {
    /// The union's own xattrs (whiteouts, opaque, redirect) are not the
    /// file's: hidden and refused, as overlayfs does (EOPNOTSUPP).
    pub(super) fn refuse_union_xattr(&self, name: &OsStr) -> Result<()> {
        if self.hidden_xattr(name.as_bytes()) {
            Err(errno(libc::EOPNOTSUPP))
        } else {
            Ok(())
        }
    }

    /// The mount's own xattrs: a union's markers, or a clone's (its mark,
    /// and the names and counts of its hard-link index).
    pub(super) fn hidden_xattr(&self, name: &[u8]) -> bool {
        match &self.union {
            Some(u) => format::is_overlay_xattr(name, u.ns),
            None => self.clones_on() && format::is_chronofs_xattr(name, self.clone_ns()),
        }
    }

    /// listxattr without the mount's own names.
    pub(super) fn union_listxattr(
        &self,
        caller: &super::Caller,
        ino: InodeNo,
        size: u32,
    ) -> Result<super::Xattr> {
        self.with_shown_fd(ino, |fd| self.listxattr_shown(caller, fd, size))
    }

    /// listxattr of backing object `fd` without the mount's own names.
    pub(super) fn listxattr_shown(
        &self,
        caller: &super::Caller,
        fd: std::os::fd::BorrowedFd<'_>,
        size: u32,
    ) -> Result<super::Xattr> {
        let mut buf = Vec::new();
        loop {
            let need = crate::sys::creds::as_caller(caller, || sys::listxattr_fd(fd, &mut []))?;
            buf.resize(need, 0);
            match crate::sys::creds::as_caller(caller, || sys::listxattr_fd(fd, &mut buf)) {
                Ok(n) => {
                    buf.truncate(n);
                    break;
                }
                // Grown meanwhile: ask again.
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let mut shown = Vec::with_capacity(buf.len());
        for name in buf.split(|b| *b == 0).filter(|n| !n.is_empty()) {
            if !self.hidden_xattr(name) {
                shown.extend_from_slice(name);
                shown.push(0);
            }
        }
        if size == 0 {
            return Ok(super::Xattr::Size(shown.len() as u32));
        }
        super::Xattr::of_value(shown, size)
    }
}

impl Vfs {
    /// A union directory's merged entries (read as the daemon) and the
    /// backing keys of those from a layer, in order.
    fn merged_entries(
        &self,
        layers: &[Layer],
    ) -> Result<(Vec<merge::MergedEntry>, Vec<crate::store::BackingKey>)> {
        let u = self.union.as_ref().ok_or(VfsError::WrongKind)?;
        let mut listings = Vec::with_capacity(layers.len());
        let mut devs = Vec::with_capacity(layers.len());
        let mut kept = Vec::with_capacity(layers.len());
        for layer in layers {
            let fd = layer.fd.as_fd();
            let listing = match merge::read_layer(fd, u.ns) {
                // Emptied into the copy below it and removed by a running
                // snapmerge: that copy lists all it held.
                Err(e) if self.gone_mid_merge(&e) => continue,
                r => r?,
            };
            listings.push(listing);
            devs.push(self.inodes.key_dev(layer.branch, sys::fstat(fd)?.st_dev));
            kept.push(layer.clone());
        }
        let layers = &kept[..];
        let mut merged = merge::merge(&listings);
        // A copy-up interrupted by a crash may leave its temporary behind.
        merged.retain(|m| !format::is_hidden_temporary(&m.name));
        let keys: Vec<crate::store::BackingKey> = merged
            .iter()
            .filter_map(|m| {
                let i = m.layer?;
                Some(crate::store::BackingKey {
                    branch: layers[i].branch.0,
                    dev: devs[i],
                    ino: m.ino,
                })
            })
            .collect();
        if self.inodes.generation() != 0 {
            self.keep_moved_dir_numbers(&merged, &keys, (layers, &listings, &devs))?;
        }
        Ok((merged, keys))
    }

    /// After a branch set change, a directory whose top copy is now in
    /// another branch keeps its number in listings too (as `dir_moved_up`
    /// keeps it at lookup): a new top copy with no number of its own gets
    /// the number of the lower copy that had one.
    fn keep_moved_dir_numbers(
        &self,
        merged: &[merge::MergedEntry],
        keys: &[crate::store::BackingKey],
        (layers, listings, devs): (&[Layer], &[merge::LayerListing], &[u64]),
    ) -> Result<()> {
        let named = merged.iter().filter(|m| m.layer.is_some());
        for (m, key) in named.zip(keys) {
            let Some(top) = m.layer else { continue };
            if m.dtype != libc::DT_DIR || self.inodes.mapped(key)?.is_some() {
                continue;
            }
            for (i, listing) in listings.iter().enumerate().skip(top + 1) {
                let Some(e) = listing.entries.iter().find(|e| e.name == m.name) else {
                    continue;
                };
                if e.whiteout || e.dtype != libc::DT_DIR {
                    break;
                }
                let lower = crate::store::BackingKey {
                    branch: layers[i].branch.0,
                    dev: devs[i],
                    ino: e.ino,
                };
                if let Some(ino) = self.inodes.mapped(&lower)? {
                    self.inodes.bind_key(*key, ino);
                    break;
                }
            }
        }
        Ok(())
    }

    /// What history records as a union directory's entries: the merged
    /// view, each entry bound to the branch object it resolves to.
    pub(super) fn union_entries(
        &self,
        dir: &[Layer],
        in_root: bool,
    ) -> Result<Vec<(Vec<u8>, crate::history::Binding)>> {
        let (merged, keys) = self.merged_entries(dir)?;
        let numbers = self.inodes.numbers_for(&keys)?;
        let named = merged.into_iter().filter(|m| m.layer.is_some());
        Ok(named
            .zip(keys.into_iter().zip(numbers))
            .filter(|(m, _)| !self.branch.is_reserved(in_root, OsStr::from_bytes(&m.name)))
            .map(|(m, (key, ino))| {
                let binding = crate::history::Binding {
                    branch: key.branch,
                    dev: key.dev,
                    ino: key.ino,
                    object: ino.object(),
                };
                (m.name, binding)
            })
            .collect())
    }
}

/// The entry timeout of a name that a copy-up through another name may
/// renumber: under `user.` marks a hard-linked lower symlink, device,
/// FIFO or socket cannot be indexed (Linux refuses user xattrs on them),
/// so it splits at copy-up, and its other names then resolve to a new
/// number, in directories the daemon cannot list. The kernel asks again
/// at every use (such objects are rare); every other name keeps the
/// mount's timeout.
fn splits_at_copy_up(u: &Union, branch: BranchId, st: &Stat) -> Option<Duration> {
    let split = u.upper().is_some()
        && !u.writable(branch)
        && st.st_mode & libc::S_IFMT != libc::S_IFDIR
        && !super::union_links::indexable(st, u.ns)
        && st.st_nlink > 1;
    split.then_some(Duration::ZERO)
}
