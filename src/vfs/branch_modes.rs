//! Live changes to a mounted union's branches (issue 17): a branch's mode
//! now; insertion and removal build on the same lock and checks.
//! docs/ARCHITECTURE.md "Live unions".

use parking_lot::RwLockReadGuard;

use super::inodes::Handle;
use super::{Result, Vfs, VfsError};
use crate::branch::BranchId;

/// A branch as `chronofs branch list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchInfo {
    /// Its place in the union, 0 = top (precedence).
    pub position: u32,
    /// Its persistent id (inode-map keys carry it).
    pub id: u32,
    pub writable: bool,
    /// Where copy-ups and `create=top`'s creates go.
    pub upper: bool,
}

/// What a mode change did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModeChange {
    /// The branch had that mode already.
    pub unchanged: bool,
    /// Write handles into it that `--force` revoked.
    pub revoked: usize,
}

/// Which change asks which handles to be given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Blocking {
    /// A branch turning read-only: its writers.
    ReadOnly,
    /// A branch leaving the union: every handle of it.
    Removal,
}

/// Records a union's branches (id, read-write) top first, durably, before
/// a change puts them in force.
pub type RecordSet<'a> =
    dyn Fn(&[(u32, bool)]) -> std::result::Result<(), crate::store::StoreError> + 'a;

impl Vfs {
    /// The branch at `position` (0 = top) of the set in force.
    pub(super) fn branch_at(&self, position: u32) -> Result<BranchId> {
        let u = self.union().ok_or(VfsError::NotUnion)?;
        u.set()
            .members
            .get(position as usize)
            .map(|m| m.id)
            .ok_or_else(|| VfsError::NoSuchBranch(position.to_string()))
    }

    /// Held (shared) for the whole of an operation that may change the
    /// tree or look up a name; a branch change or a sandbox commit waits
    /// for every such operation in flight. Recursive: an operation never
    /// waits behind a queued change while it holds the lock already.
    pub(super) fn changing(&self) -> Option<RwLockReadGuard<'_, ()>> {
        Some(self.tree_lock().read_recursive())
    }

    /// The lock [`Vfs::changing`] takes: a union's set lock, a single
    /// directory's own.
    pub(super) fn tree_lock(&self) -> &parking_lot::RwLock<()> {
        match self.union() {
            Some(u) => &u.set_lock,
            None => &self.tree_lock,
        }
    }

    /// Whether removes and renames go through the union's code: in a
    /// union that is not one directory ([`super::union::Union::is_one_directory`]).
    /// Decided under [`Vfs::changing`].
    pub(super) fn through_union(&self) -> bool {
        self.union()
            .is_some_and(|u| !u.is_one_directory(self.inodes.primary_branch()))
    }

    /// Makes every change made through the mount so far durable: syncfs
    /// of each file system a branch lies on (once each). For tools that
    /// write many files through the mount and promise them on return
    /// (`restore`, `revert`, `undelete`): FUSE passes no syncfs on.
    pub fn sync_branches(&self) -> Result<()> {
        let set = self.union().map(|u| u.set());
        let members = set.iter().flat_map(|s| s.members.iter());
        let roots = members.map(|m| std::os::fd::AsFd::as_fd(&m.root));
        Ok(crate::sys::syncfs_dirs(
            std::iter::once(self.branch.root_fd()).chain(roots),
        )?)
    }

    /// The device number this mount's keys carry for the file system of
    /// branch `id`'s root (a single directory's is branch 0's): another
    /// union over the same directories (a sandbox's) must key them alike.
    pub fn root_key_dev(&self, id: u32) -> Result<u64> {
        let b = crate::branch::BranchId(id);
        let dev = match self.union() {
            Some(u) => {
                let root = u
                    .root_of(b)
                    .ok_or_else(|| VfsError::NoSuchBranch(id.to_string()))?;
                crate::sys::fstat(std::os::fd::AsFd::as_fd(&*root))?.st_dev
            }
            None => crate::sys::fstat(self.branch.root_fd())?.st_dev,
        };
        Ok(self.inodes.key_dev(b, dev))
    }

    /// How the keys of the root's branch carry its device number.
    pub(super) fn root_dev_alias(&self) -> Result<crate::store::DevAlias> {
        let b = self.inodes.primary_branch();
        let live = crate::sys::fstat(self.branch.root_fd())?.st_dev;
        Ok(crate::store::DevAlias::new(
            live,
            self.inodes.key_dev(b, live),
        ))
    }

    /// The union's branches, top first.
    pub fn branches(&self) -> Result<Vec<BranchInfo>> {
        let u = self.union().ok_or(VfsError::NotUnion)?;
        let upper = u.upper();
        Ok(u.modes()
            .into_iter()
            .enumerate()
            .map(|(i, (b, writable))| BranchInfo {
                position: i as u32,
                id: b.0,
                writable,
                upper: upper == Some(b),
            })
            .collect())
    }

    /// Makes the branch at `position` read-write or read-only, at once
    /// for every cached lookup and open file. A branch turning read-only
    /// must take no more writes: refused while files in it are open for
    /// writing, unless `force`, which revokes those handles (ESTALE from
    /// then on); refused in any case while a file of it is open with
    /// kernel passthrough (the daemon cannot revoke it, and a later writer
    /// of the same inode would share its backing file) or open for writing
    /// through the writeback cache (the kernel holds writes the daemon has
    /// not seen).
    ///
    /// `record` is given every branch's id and new mode (top first) once
    /// the change is allowed and before it takes effect: a crash after it
    /// remounts with the new modes, before it with the old.
    pub fn set_branch_mode(
        &self,
        position: u32,
        writable: bool,
        force: bool,
        record: &RecordSet<'_>,
    ) -> Result<ModeChange> {
        let u = self.union().ok_or(VfsError::NotUnion)?;
        if !writable {
            self.await_releases(|| self.branch_at(position).ok(), force, Blocking::ReadOnly);
        }
        let _all = u.set_lock.write();
        let b = self.branch_at(position)?;
        if u.writable(b) == writable {
            return Ok(ModeChange {
                unchanged: true,
                revoked: 0,
            });
        }
        let writers = if writable {
            Vec::new()
        } else {
            self.handles_blocking(b, position, force, Blocking::ReadOnly)?
        };
        let modes: Vec<(u32, bool)> = u
            .modes()
            .into_iter()
            .map(|(id, w)| (id.0, if id == b { writable } else { w }))
            .collect();
        record(&modes)?;
        let revoked = writers.len();
        for fh in writers {
            self.close_revoked(fh);
        }
        u.set_mode(b, writable)?;
        if writable {
            self.stamp_writable_branches();
        }
        tracing::info!(
            "branch {position} is now {}",
            if writable { "read-write" } else { "read-only" }
        );
        Ok(ModeChange {
            unchanged: false,
            revoked,
        })
    }

    /// The handles into branch `b` (at `position`) that the change must
    /// take back and `force` may revoke: its writers when it turns
    /// read-only, every handle when it is removed. An error if any handle
    /// forbids the change.
    pub(super) fn handles_blocking(
        &self,
        b: BranchId,
        position: u32,
        force: bool,
        change: Blocking,
    ) -> Result<Vec<u64>> {
        let OpenIn {
            blocking,
            pinned,
            cached_writers,
        } = self.open_in(b, change);
        if pinned > 0 {
            return Err(VfsError::BranchBusy(format!(
                "{pinned} file(s) of branch {position} are open (for reading too) with kernel \
                 passthrough, which the daemon cannot revoke, not even with --force: a write \
                 through the file would reach this branch; close them first (or mount with -o \
                 passthrough=off)"
            )));
        }
        if cached_writers > 0 {
            return Err(VfsError::BranchBusy(format!(
                "{cached_writers} file(s) of branch {position} are open for writing through the \
                 kernel's writeback cache, which the daemon cannot revoke: close them first (or \
                 mount with -o writeback=off)"
            )));
        }
        if !blocking.is_empty() && !force {
            return Err(VfsError::BranchBusy(format!(
                "{} file(s) of branch {position} are open{}: close them, or use --force \
                 (their descriptors then fail with ESTALE)",
                blocking.len(),
                if change == Blocking::Removal {
                    ""
                } else {
                    " for writing"
                },
            )));
        }
        Ok(blocking)
    }

    /// The open handles into branch `b` that stand in the way of `change`.
    fn open_in(&self, b: BranchId, change: Blocking) -> OpenIn {
        // Under the writeback cache the kernel holds writes the daemon has
        // not seen: a revoked handle's would stay readable in the page
        // cache without ever reaching a branch.
        let cached = self.writeback();
        let mut open = OpenIn::default();
        for (fh, handle) in self.handles.files() {
            let Handle::File {
                ino,
                writes,
                branch,
                ..
            } = &*handle
            else {
                continue;
            };
            if *branch != b.0 {
                continue;
            }
            if self.uses_passthrough(*ino) {
                open.pinned += 1;
            } else if *writes && cached {
                open.cached_writers += 1;
            } else if *writes || change == Blocking::Removal {
                open.blocking.push(fh);
            }
        }
        open
    }

    /// Before a branch change takes the set lock: handles in its way get
    /// a moment to go. The kernel sends a file's release after close(2)
    /// has returned, so a command run right after closing the last
    /// descriptor would otherwise find the file still open. `branch`: the
    /// branch concerned (none: nothing to wait for).
    pub(super) fn await_releases(
        &self,
        branch: impl Fn() -> Option<BranchId>,
        force: bool,
        change: Blocking,
    ) {
        let deadline = std::time::Instant::now() + RELEASE_GRACE;
        loop {
            let seen = self.handles.removals();
            let Some(b) = branch() else {
                return;
            };
            let open = self.open_in(b, change);
            let revocable = force || open.blocking.is_empty();
            if open.pinned == 0 && open.cached_writers == 0 && revocable {
                return;
            }
            if !self.handles.wait_removal(seen, deadline) {
                return;
            }
        }
    }

    /// Closes a handle its owner still holds, as its release would.
    pub(super) fn close_revoked(&self, fh: u64) {
        if let Some(handle) = self.handles.revoke(fh) {
            self.close_handle(handle);
        }
    }
}

/// How long a branch change waits for the releases of files closed just
/// before it (the kernel's release follows close(2) by microseconds).
const RELEASE_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

/// See [`Vfs::open_in`].
#[derive(Default)]
struct OpenIn {
    /// Handles a forced change revokes.
    blocking: Vec<u64>,
    /// Handles the kernel writes through itself (passthrough).
    pinned: usize,
    /// Writers through the kernel's writeback cache.
    cached_writers: usize,
}
