//! Branches inserted into and removed from a mounted union (issue 17):
//! the set swap, and the re-derivation, at their next use, of what inodes
//! derived from the set before. docs/ARCHITECTURE.md "Live unions".

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::branch_modes::{Blocking, RecordSet};
use super::inodes::{BranchMount, Inode, Node};
use super::union::{is_dir, BranchSet, Member, Union, UNRANKED};
use super::{errno, InodeNo, Result, Vfs, VfsError};
use crate::branch::BranchId;
use crate::sys;
use crate::union::snapmerge::{self, MergeCount};

/// A directory to insert into a mounted union.
pub struct NewBranch {
    /// Its root (O_PATH), opened by the caller.
    pub root: OwnedFd,
    /// Its persistent id (`Store::branch_idents`).
    pub id: u32,
    /// The device number its keys carry for its root's file system.
    pub key_dev: u64,
    pub writable: bool,
    /// Where it goes: 0 = top; past the bottom = the bottom.
    pub position: u32,
}

/// What a branch insertion or removal did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetChange {
    /// Handles into a removed branch that `--force` revoked.
    pub revoked: usize,
    /// The new set's generation.
    pub generation: u32,
}

/// Told that the branch set changed: the kernel must drop every name it
/// caches (the FUSE adapter sends FUSE_NOTIFY_INC_EPOCH). Given
/// `may_block` false, it does only what cannot wait on a request in
/// flight (the epoch, not name-by-name invalidation, which takes the
/// kernel's directory locks) and says whether that did it.
pub type SetChanged = Box<dyn Fn(bool) -> bool + Send + Sync>;

impl Vfs {
    /// The inode `ino` with a descriptor of its object, its union state
    /// re-derived first if the branch set changed since it was found.
    pub(super) fn node(&self, ino: InodeNo) -> Result<Node> {
        let inode = self.inodes.get(ino)?;
        if self.union.is_some() && inode.generation() != self.inodes.generation() {
            // Before its descriptor is needed: the object a handle names
            // may be gone (a directory a snapmerge emptied and removed).
            return self.refresh_for_set(inode);
        }
        self.inodes.node_of(inode)
    }

    /// A copy-up found its object's copy gone while a snapmerge runs (the
    /// fold moved it down, or emptied and removed a directory copy): `ino`
    /// and its ancestors are found again by their names, where they are
    /// now, keeping their numbers, for the copy-up to try again.
    pub(super) fn found_again_mid_merge(&self, ino: InodeNo) -> Result<()> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let mut chain = Vec::new();
        let mut cur = Some(ino);
        while let Some(at) = cur.filter(|i| *i != InodeNo::ROOT && chain.len() < 4096) {
            let inode = self.inodes.get(at)?;
            cur = inode.name().map(|(parent, _)| parent);
            chain.push(inode);
        }
        // Parents first: a child is found again through its parent's copies.
        for inode in chain.into_iter().rev() {
            match inode.is_dir() {
                true => self.refresh_for_set(inode)?,
                false => self.copy_gone(u, &inode)?,
            };
        }
        Ok(())
    }

    /// Brings an inode found under an older branch set up to the one in
    /// force: a non-directory of a removed branch is gone (ESTALE); a
    /// directory's copies are found again by its name, and where its top
    /// copy is now in another branch (one inserted above, or its own
    /// removed) its number moves there, as at copy-up; with no copy left,
    /// or a non-directory above it, it is gone.
    fn refresh_for_set(&self, node: Arc<Inode>) -> Result<Node> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let _set = u.set_lock.read_recursive();
        let generation = self.inodes.generation();
        let own = self.inodes.branch_of(&node.key);
        if node.ino == InodeNo::ROOT {
            self.inodes.set_layers(&node, u.root_layers(), generation);
            node.mark_recheck();
            return self.inodes.node_of(node);
        }
        if !node.is_dir() {
            if u.rank(own) == UNRANKED {
                return self.copy_gone(u, &node);
            }
            node.stamp(generation);
            return self.inodes.node_of(node);
        }
        let Some((parent, name)) = node.name() else {
            if u.rank(own) == UNRANKED {
                return Err(errno(libc::ESTALE));
            }
            let mut layers = self.inodes.layers(&node)?;
            self.by_rank(&mut layers);
            self.inodes.set_layers(&node, layers, generation);
            node.mark_recheck();
            return self.inodes.node_of(node);
        };
        let parent = self.node(parent)?;
        let cname = sys::cstr(OsStr::from_bytes(&name))?;
        let found = self.walk(&parent, &cname)?.ok_or(errno(libc::ESTALE))?;
        let (branch, dir, st) = found.top;
        if !is_dir(&st) {
            return Err(errno(libc::ESTALE));
        }
        if self.inodes.key_in(branch, &st) == node.key {
            self.inodes.set_layers(&node, found.lowers, generation);
            node.mark_recheck();
            return self.inodes.node_of(node);
        }
        let fd = sys::open_path(dir.as_fd(), &cname)?;
        let st = sys::fstat(fd.as_fd())?;
        let inode = self
            .inodes
            .rebind_keeping(node.ino, branch, fd, &st, found.lowers)?;
        self.attrs_changed(node.ino);
        inode.mark_recheck();
        self.inodes.node_of(inode)
    }

    /// A non-directory whose object was in a removed branch: where its name
    /// now resolves to an object that keeps its number (the lower file it
    /// was copied up from, or another copy of a hard-linked one: their keys
    /// keep the number), the inode is that object now, as after a copy-up;
    /// else it is gone (ESTALE).
    fn copy_gone(&self, u: &Union, node: &Inode) -> Result<Node> {
        let stale = || errno(libc::ESTALE);
        let (parent, name) = node.name().ok_or_else(stale)?;
        let parent = self.node(parent)?;
        let mut cname = sys::cstr(OsStr::from_bytes(&name))?;
        let found = self.walk(&parent, &cname)?.ok_or_else(stale)?;
        let (mut branch, mut dir, mut st) = found.top;
        if let Some((b, index, entry, entry_st)) = self.indexed_instead(u, branch, &st)? {
            (branch, dir, st, cname) = (b, index, entry_st, entry);
        }
        if is_dir(&st) || self.inodes.mapped(&self.inodes.key_in(branch, &st))? != Some(node.ino) {
            return Err(stale());
        }
        let fd = sys::open_path(dir.as_fd(), &cname)?;
        let st = sys::fstat(fd.as_fd())?;
        let inode = self
            .inodes
            .rebind_keeping(node.ino, branch, fd, &st, Vec::new())?;
        inode.set_union_nlink(0);
        let node = self.inodes.node_of(inode.clone())?;
        self.note_if_indexed(u, &inode, (node.fd(), &st), true);
        self.attrs_changed(node.ino);
        Ok(node)
    }

    /// Inserts a branch into the mounted union, at once for every cached
    /// lookup (the kernel is told to drop its names) and every later
    /// operation. `record` is given the new set (id, read-write; top
    /// first) before it takes effect.
    pub fn add_branch(&self, new: NewBranch, record: &RecordSet<'_>) -> Result<SetChange> {
        let u = self.union().ok_or(VfsError::NotUnion)?;
        // Held until the member holds its own: a fold elsewhere rewrites
        // the directory in place, which this mount would not see happen.
        let _claim = crate::branch::claim::claim_or_warn(new.root.as_fd(), &"the new branch")
            .map_err(|e| VfsError::BranchBusy(format!("{e}; add it when the fold is done")))?;
        let change = {
            let _all = u.set_lock.write();
            let old = u.set();
            let (id, key_dev) = (BranchId(new.id), new.key_dev);
            if old.member(id).is_some() {
                return Err(VfsError::BranchBusy(format!(
                    "that directory is branch {} of this union already",
                    old.rank(id)
                )));
            }
            let root = Arc::new(new.root);
            let mut members = old.members.clone();
            let at = (new.position as usize).min(members.len());
            members.insert(at, Member::new(id, root.clone(), new.writable));
            let set = BranchSet {
                generation: old.generation.wrapping_add(1),
                members,
            };
            record(&set.modes())?;
            self.note_view_change(Some(id));
            self.inodes
                .add_mount(id, BranchMount::of(root.as_fd(), Some(key_dev)));
            self.put_in_force(u, set)?
        };
        tracing::info!("branch inserted at position {}", new.position);
        self.set_changed();
        Ok(change)
    }

    /// Removes the branch at `position` from the mounted union. Refused
    /// for the root's branch (it holds the store), and while files of the
    /// branch are open, unless `force`, which revokes their handles (ESTALE
    /// from then on); refused in any case for handles the daemon cannot
    /// revoke (see `Vfs::set_branch_mode`).
    pub fn remove_branch(
        &self,
        position: u32,
        force: bool,
        record: &RecordSet<'_>,
    ) -> Result<SetChange> {
        let u = self.union().ok_or(VfsError::NotUnion)?;
        self.await_releases(|| self.branch_at(position).ok(), force, Blocking::Removal);
        let change = {
            let _all = u.set_lock.write();
            let b = self.branch_at(position)?;
            if b == u.primary() {
                return Err(VfsError::BranchBusy(format!(
                    "branch {position} holds the mount's root and its store: it cannot be \
                     removed while mounted (unmount, and mount without it)"
                )));
            }
            let open = self.handles_blocking(b, position, force, Blocking::Removal)?;
            let old = u.set();
            let mut members = old.members.clone();
            members.retain(|m| m.id != b);
            let set = BranchSet {
                generation: old.generation.wrapping_add(1),
                members,
            };
            record(&set.modes())?;
            self.note_view_change(None);
            let revoked = open.len();
            for fh in open {
                self.close_revoked(fh);
            }
            SetChange {
                revoked,
                ..self.put_in_force(u, set)?
            }
        };
        tracing::info!("branch {position} removed");
        self.set_changed();
        Ok(change)
    }

    /// Freezes the upper branch (read-only from now on) and puts `fresh`
    /// on top of the union, read-write, in one change: from then on every
    /// change lands in `fresh`, and the frozen branch keeps the union as it
    /// was. Writers into the frozen branch block it as `branch mode ro`
    /// does (`force` revokes them). `record` is given the new set before it
    /// takes effect. Returns the frozen branch's id.
    pub fn snapshot(
        &self,
        fresh: NewBranch,
        force: bool,
        record: &RecordSet<'_>,
    ) -> Result<(BranchId, SetChange)> {
        let u = self.union().ok_or(VfsError::NotUnion)?;
        self.await_releases(|| u.upper(), force, Blocking::ReadOnly);
        let (frozen, change) = {
            let _all = u.set_lock.write();
            let old = u.set();
            let frozen = u.upper().ok_or_else(|| {
                VfsError::BranchBusy("no branch is read-write: nothing to freeze".into())
            })?;
            let writers =
                self.handles_blocking(frozen, old.rank(frozen), force, Blocking::ReadOnly)?;
            let (id, key_dev) = (BranchId(fresh.id), fresh.key_dev);
            if old.member(id).is_some() {
                return Err(VfsError::BranchBusy(
                    "the new branch is in the union already".into(),
                ));
            }
            let root = Arc::new(fresh.root);
            // The mount's root keeps its owner, mode and ACLs: creates in
            // it go to the fresh root now, as the caller.
            let shown = old.member(frozen).map(|m| m.root.clone());
            if let Some(shown) = shown {
                crate::union::copyup::copy_dir_meta(shown.as_fd(), root.as_fd())?;
            }
            let mut members = old.members.clone();
            members.insert(0, Member::new(id, root.clone(), true));
            let set = BranchSet {
                generation: old.generation.wrapping_add(1),
                members,
            };
            let mut modes = set.modes();
            for m in modes.iter_mut().filter(|(b, _)| *b == frozen.0) {
                m.1 = false;
            }
            record(&modes)?;
            let revoked = writers.len();
            for fh in writers {
                self.close_revoked(fh);
            }
            self.inodes
                .add_mount(id, BranchMount::of(root.as_fd(), Some(key_dev)));
            u.freeze(frozen);
            let change = self.put_in_force(u, set)?;
            (frozen, SetChange { revoked, ..change })
        };
        tracing::info!("snapshot: branch {} frozen", frozen.0);
        self.set_changed();
        Ok((frozen, change))
    }

    /// Folds the read-only branch at `position` into the read-only branch
    /// right below it (`chronofs snapmerge`), then drops it from the set,
    /// while the mount stays in use: every step of the fold keeps the
    /// union's view (`union::snapmerge`), objects keep their numbers (each
    /// moved object's number is bound to its new key before it moves,
    /// and inodes the kernel holds follow at their next use, as after a
    /// removal), and `record` is given the new set before it takes effect.
    /// The caller serialises branch changes: none may make either branch
    /// writable meanwhile. Returns the id of the branch folded away.
    pub fn merge_branch(
        &self,
        position: u32,
        record: &RecordSet<'_>,
    ) -> Result<(BranchId, MergeCount, SetChange)> {
        let u = self.union().ok_or(VfsError::NotUnion)?;
        let (upper, lower, deeper) = {
            let _set = u.set_lock.read_recursive();
            let set = u.set();
            let at = position as usize;
            let (Some(upper), Some(lower)) = (set.members.get(at), set.members.get(at + 1)) else {
                return Err(VfsError::BranchBusy(format!(
                    "branch {position} has no branch below it to merge into"
                )));
            };
            if upper.id == u.primary() {
                return Err(VfsError::BranchBusy(format!(
                    "branch {position} holds the mount's root and its store: it cannot be \
                     merged away while mounted"
                )));
            }
            if let Some((m, p)) = [(upper, at), (lower, at + 1)]
                .into_iter()
                .find(|(m, _)| m.writable())
            {
                return Err(VfsError::BranchBusy(format!(
                    "branch {p} (id {}) is read-write: only frozen branches are merged",
                    m.id.0
                )));
            }
            (upper.clone(), lower.clone(), at + 2 < set.members.len())
        };
        let apart = match sys::fstat(upper.root.as_fd())?.st_dev
            == sys::fstat(lower.root.as_fd())?.st_dev
        {
            false => Some("on different file systems"),
            true if !snapmerge::renames_between(upper.root.as_fd(), lower.root.as_fd())? => {
                Some("on different mounts of one file system (a bind mount?)")
            }
            true => None,
        };
        if let Some(apart) = apart {
            return Err(VfsError::BranchBusy(format!(
                "branch {position} and the branch below it are {apart}: a merge moves objects \
                 by rename (a snapshot's branch is made in the store; keep the store on the \
                 branches' file system and mount to merge it)"
            )));
        }
        let position = position as usize;
        let _upper_held = upper.exclusive(position)?;
        let _lower_held = lower.exclusive(position + 1)?;
        let mut live = Folding {
            vfs: self,
            union: u,
            upper: upper.id,
            lower: lower.id,
            held: None,
        };
        if self.clones_on() {
            // The fold may bring marks down into it.
            self.stamp_branch(lower.id, lower.root.as_fd());
        }
        let moves = (upper.id, lower.id);
        self.name_entries_for_fold(u, moves)?;
        u.set_fold(Some(moves));
        let merged = snapmerge::merge_into(
            upper.root.as_fd(),
            lower.root.as_fd(),
            deeper,
            u.ns,
            &mut live,
        );
        drop(live);
        u.reopen_index(lower.id, false);
        let folded = merged.map_err(VfsError::from).and_then(|count| {
            // The moves must be on the disk before the set without the
            // folded branch is: a power cut in between would leave their
            // entries in a branch the next mount leaves out
            // (tests/powercut_disk.rs). A registry commit's fdatasync does
            // not carry them: it need not commit ext4's journal.
            let renamed = self.drop_folded_entry_names(u, moves)?;
            let roots = [&upper.root, &lower.root].into_iter().chain(&renamed);
            sys::syncfs_dirs(roots.map(|r| r.as_fd()))?;
            let _all = u.set_lock.write();
            // A copy-up since may have named an entry after the folded
            // branch; none can now.
            let late = self.drop_folded_entry_names(u, moves)?;
            sys::syncfs_dirs(late.iter().map(|r| r.as_fd()))?;
            let old = u.set();
            let mut members = old.members.clone();
            members.retain(|m| m.id != upper.id);
            let set = BranchSet {
                generation: old.generation.wrapping_add(1),
                members,
            };
            record(&set.modes())?;
            Ok((count, self.put_in_force(u, set)?))
        });
        // Only now: until the new set is in force, inodes found before
        // still list copies the fold emptied and removed (a renamed
        // directory's origin), and must skip them.
        u.set_fold(None);
        let (count, change) = folded?;
        tracing::info!(
            "snapmerge: branch {} folded into branch {} ({} moved, {} directories merged)",
            upper.id.0,
            lower.id.0,
            count.moved,
            count.merged_dirs
        );
        self.set_changed();
        Ok((upper.id, count, change))
    }

    /// The set in force again, under a new generation: inodes found before
    /// re-derive their layers at next use (their copies moved without the
    /// members changing). The caller holds the set lock exclusively.
    pub(super) fn renew_set(&self, u: &Union) -> Result<SetChange> {
        let old = u.set();
        let same = BranchSet {
            generation: old.generation.wrapping_add(1),
            members: old.members.clone(),
        };
        self.put_in_force(u, same)
    }

    /// The view is about to change with the branch set (the caller holds
    /// the set lock exclusively): history takes the instant, to date the
    /// names the change brings or takes when it finds them
    /// (`capture/branch_changes.rs`). `added`: the branch inserted.
    fn note_view_change(&self, added: Option<BranchId>) {
        let Some(c) = self.capture() else {
            return;
        };
        if let Err(e) = c.branch_changed(added.map(|b| b.0)) {
            tracing::warn!(
                "history: the branch change's instant is not recorded ({e}); the names it \
                 brings or takes are dated when history finds them"
            );
        }
    }

    /// Swaps `set` in; the caller holds the set lock exclusively.
    pub(super) fn put_in_force(&self, u: &Union, set: BranchSet) -> Result<SetChange> {
        let generation = set.generation;
        u.swap_set(set)?;
        self.inodes.set_generation(generation);
        self.stamp_writable_branches();
        Ok(SetChange {
            revoked: 0,
            generation,
        })
    }

    /// Runs `hook` after every change of the union's branch set, outside
    /// the set lock. Set once.
    pub fn on_set_changed(&self, hook: SetChanged) {
        if self.set_changed.set(hook).is_err() {
            tracing::warn!("branch-set hook set twice; the first stays");
        }
    }

    pub(super) fn set_changed(&self) {
        if let Some(hook) = self.set_changed.get() {
            hook(true);
        }
    }

    /// [`Vfs::set_changed`] as far as it can go while operations wait on
    /// a lock the caller holds; whether that was all of it.
    pub(super) fn set_changed_without_blocking(&self) -> bool {
        self.set_changed.get().is_none_or(|hook| hook(false))
    }

    /// Every name the kernel may cache, as (parent, name): what must be
    /// invalidated one by one where the kernel cannot drop them all.
    pub fn known_names(&self) -> Vec<(InodeNo, Vec<u8>)> {
        self.inodes.names()
    }
}

/// The mount's side of a snapmerge's fold: numbers follow the objects,
/// and objects found before are found again where the fold needs it.
struct Folding<'v> {
    vfs: &'v Vfs,
    union: &'v Union,
    upper: BranchId,
    lower: BranchId,
    held: Option<parking_lot::RwLockWriteGuard<'v, ()>>,
}

impl Folding<'_> {
    /// The number `from` had in branch `was` is `to`'s in branch `now`.
    fn keep_number(&self, (was, from): (BranchId, &sys::Stat), (now, to): (BranchId, &sys::Stat)) {
        match self.vfs.inodes.mapped(&self.vfs.inodes.key_in(was, from)) {
            Ok(Some(ino)) => self.vfs.inodes.bind_copy(now, to, ino),
            Ok(None) => {}
            Err(e) => tracing::warn!("snapmerge: an inode number may change: {e}"),
        }
    }
}

impl snapmerge::Live for Folding<'_> {
    fn moved(&mut self, from: &sys::Stat, to: &sys::Stat) {
        self.keep_number((self.upper, from), (self.lower, to));
    }

    fn absorbed(&mut self, from: &sys::Stat, to: &sys::Stat) {
        self.keep_number((self.lower, from), (self.upper, to));
        // The link follows at once: durable first, or a crash leaves the
        // upper copy, which the union shows, without the number.
        if let Err(e) = self.vfs.inodes.flush() {
            tracing::warn!("snapmerge: an inode number may change after a crash: {e}");
        }
    }

    fn refind(&mut self) -> crate::union::Result<()> {
        {
            let _all = self.union.set_lock.write();
            self.vfs.renew_set(self.union).map_err(|e| {
                crate::union::UnionError::Io(std::io::Error::from_raw_os_error(e.errno()))
            })?;
        }
        self.vfs.set_changed();
        Ok(())
    }

    fn index_made(&mut self) {
        // Entries for its own files may come: asked from now on (looked
        // at again once the fold is done).
        self.union.reopen_index(self.lower, true);
    }

    fn hold(&mut self) {
        self.held = Some(self.union.set_lock.write());
    }

    fn release(&mut self) {
        self.held = None;
    }

    fn durable(&mut self) -> crate::union::Result<()> {
        self.vfs.inodes.flush().map_err(|e| {
            crate::union::UnionError::Io(std::io::Error::other(format!(
                "the inode map could not keep the fold's numbers: {e}"
            )))
        })
    }
}
