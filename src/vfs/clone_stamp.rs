//! Which store a branch's clones belong to.
//!
//! A clone's mark names its base by path and instant in the mount's
//! history. Read through another store (the directory mounted again with
//! `-o store=` elsewhere, its store lost, or the branch put in another
//! mount's union), the same path and instant name another file or none:
//! the clone would show another file's bytes, or zeros. So every branch
//! that can receive marks carries the store's id on its root
//! (`union::format::StoreStamp`) before the first mark reaches it, and a
//! mount refuses a branch stamped by another store (`foreign_stamp`).

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd};

use super::{Vfs, VfsError};
use crate::branch::BranchId;
use crate::store::StoreId;
use crate::union::format::{self, StoreStamp, XattrNs};

/// A mount's store and the branches it has stamped.
#[derive(Default)]
pub(super) struct Stamps {
    store: std::sync::OnceLock<StoreId>,
    done: parking_lot::Mutex<HashSet<BranchId>>,
}

impl Vfs {
    /// The store whose history this mount's clones read (set at mount,
    /// before clones are enabled).
    pub fn set_store_id(&self, id: StoreId) {
        if self.clones.stamps.store.set(id).is_err() {
            tracing::warn!("store id set twice; the first stays");
        }
    }

    /// See [`Vfs::set_store_id`].
    pub fn store_id(&self) -> Option<StoreId> {
        self.clones.stamps.store.get().copied()
    }

    /// Stamps every read-write branch of a mount that holds clones (the
    /// branches a mark can be written to), once each. A branch that cannot
    /// take the stamp is reported and left: its clones work, unguarded.
    pub(super) fn stamp_writable_branches(&self) {
        if !self.clones_on() {
            return;
        }
        match self.union() {
            Some(u) => {
                let set = u.set();
                for m in set.members.iter().filter(|m| m.writable()) {
                    self.stamp_branch(m.id, m.root.as_fd());
                }
            }
            None => self.stamp_branch(self.branch.id(), self.branch.root_fd()),
        }
    }

    /// Stamps branch `id` (root `root`) for this mount's store, unless done.
    pub(super) fn stamp_branch(&self, id: BranchId, root: BorrowedFd<'_>) {
        let Some(store) = self.clones.stamps.store.get().copied() else {
            return;
        };
        let mut done = self.clones.stamps.done.lock();
        if done.contains(&id) {
            return;
        }
        let ns = self.clone_ns();
        let stamped = match format::store_stamp(root, ns) {
            Ok(Some(StoreStamp::Store(had))) if had == store => Ok(()),
            Ok(Some(other)) => {
                // Refused at mount and at `branch add`: reached only if
                // the root's xattr changed behind the mount's back.
                tracing::error!(
                    "branch {}: stamped for another store ({other:?}); left",
                    id.0
                );
                Ok(())
            }
            Ok(None) => format::stamp_store(root, ns, store),
            Err(e) => Err(e),
        };
        match stamped {
            Ok(()) => {
                done.insert(id);
            }
            Err(e) => tracing::warn!(
                "branch {}: cannot record that it holds this store's clones ({e}); \
                 another store mounting it would not know",
                id.0
            ),
        }
    }
}

/// Why a mount must not serve branch root `root`, if it must not: the
/// branch holds clones whose shared bytes are in another store's history
/// than `ours` (the mount's store's id, none if it has none yet), or the
/// mount has no history (`history` false) to read them through.
pub fn foreign_stamp(
    root: BorrowedFd<'_>,
    history: bool,
    ours: Option<StoreId>,
) -> Result<Option<String>, VfsError> {
    let ns = XattrNs::for_daemon();
    Ok(match format::store_stamp(root, ns)? {
        None => None,
        Some(StoreStamp::Store(id)) if !history => Some(format!(
            "holds clones (of store {id}), whose files read their shared bytes through \
             that store's history: mount it with history, with that store"
        )),
        Some(StoreStamp::Store(id)) if Some(id) == ours => None,
        Some(StoreStamp::Store(id)) => Some(format!(
            "holds clones of another store (id {id}; this mount's is {}): their files read \
             their shared bytes through that store's history, so mount it with that store \
             (-o store=DIR)",
            ours.map_or_else(|| "new".to_string(), |o| o.to_string())
        )),
        Some(StoreStamp::Unknown) => Some(format!(
            "holds clones of a store whose stamp ({}) this chronofs does not read",
            String::from_utf8_lossy(ns.store_stamp().to_bytes())
        )),
    })
}
