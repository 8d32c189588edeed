//! History's objects found in the live mount: a view of the past reads
//! an object history has no version of as the mount shows it now, and
//! first compares a directory a branch change may have changed unseen.
//! In a union an object is found as the kernel's lookups find it (its
//! branch's key, a directory's copies), not by steps through the branch
//! root's directories.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::inodes::{Inode, Node};
use super::versioning::{logged, Live};
use super::{InodeNo, Result, Vfs};
use crate::history::{ObjectId, Seq};
use crate::sys::{self, Stat};

impl Vfs {
    /// Before history is asked what directory `obj` held at `at` (a view
    /// of the past): where a branch change at or before `at` may have
    /// changed its entries and history has not compared them since, the
    /// live directory is compared now, as a lookup in it would do. Else
    /// `.history/@now/` right after `branch add` lacked the added
    /// branch's names until the background walk reached them.
    pub(super) fn confirm_for_past(&self, at: Seq, obj: ObjectId) {
        let Some(c) = self.capture() else {
            return;
        };
        if self.union().is_none() || !c.unconfirmed_at(obj, at) {
            return;
        }
        let (dir, held) = match self.live_dir_of(obj) {
            Ok(Some(found)) => found,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("history: directory {obj} not found live: {e}");
                return;
            }
        };
        dir.take_recheck();
        match sys::fstat(dir.fd()) {
            Ok(st) => logged(
                "a directory's entries",
                c.dir_recheck(&Live(self), obj, &st),
            ),
            Err(e) => tracing::error!("history: directory {obj} cannot be checked: {e}"),
        }
        drop(dir);
        self.release_all(held);
    }

    /// Live directory `obj`'s entries are recorded if history holds none
    /// (as before a change in it).
    pub(super) fn record_listing(&self, obj: ObjectId) -> Result<()> {
        match self.capture() {
            Some(c) => Ok(c.before_dir_change(&Live(self), obj)?),
            None => Ok(()),
        }
    }

    /// The live directory that is history's object `obj`, held (to
    /// forget once done).
    fn live_dir_of(&self, obj: ObjectId) -> Result<Option<(Node, Vec<InodeNo>)>> {
        let Some(inode) = self.hold_object(obj, None)? else {
            return Ok(None);
        };
        let ino = inode.ino;
        match self.inodes.node_of(inode) {
            Ok(node) if node.is_dir() => Ok(Some((node, vec![ino]))),
            other => {
                self.release_held(Some(ino));
                other.map(|_| None)
            }
        }
    }

    /// History's object `obj` as the mount shows it now, held (one
    /// reference, as a lookup takes): the inode the mount knows, else
    /// found by its recorded path as the kernel's lookups find it (in a
    /// union: its branch, a directory's copies); `None` where the mount
    /// does not show it there.
    /// `path`: where it is, if known (else its recorded path).
    pub(super) fn hold_object(
        &self,
        obj: ObjectId,
        path: Option<&[Vec<u8>]>,
    ) -> Result<Option<Arc<Inode>>> {
        if let Ok(inode) = self.inodes.get(InodeNo::from(obj)) {
            if let Some(held) = self.inodes.acquire_known(&inode.key) {
                if held.ino == inode.ino {
                    return Ok(Some(held));
                }
                self.release_held(Some(held.ino));
            }
        }
        let Some(history) = self.capture().map(|c| c.history()) else {
            return Ok(None);
        };
        // Its directory is usually known (a listing's): one lookup.
        if let Some((parent, name)) = history.name_at(obj, Seq::MAX)? {
            if self.inodes.get(InodeNo::from(parent)).is_ok() {
                let found = self.hold_child(InodeNo::from(parent), &name)?;
                return Ok(self.held_if(found, obj));
            }
        }
        let recorded;
        let path = match path {
            Some(p) => p,
            None => match history.path_at(obj, Seq::MAX)? {
                Some(p) => {
                    recorded = p;
                    &recorded
                }
                None => return Ok(None),
            },
        };
        let Some(mut held) = self.hold_whole_path(path)? else {
            return Ok(None);
        };
        let last = held.pop();
        self.release_all(held);
        Ok(self.held_if(last, obj))
    }

    /// The inode `found` (held) if it is object `obj`; else released.
    fn held_if(&self, found: Option<InodeNo>, obj: ObjectId) -> Option<Arc<Inode>> {
        match found {
            Some(ino) if ino.object() == obj => {
                let inode = self.inodes.get(ino).ok();
                if inode.is_none() {
                    self.release_held(Some(ino));
                }
                inode
            }
            other => {
                self.release_held(other);
                None
            }
        }
    }

    /// Object `obj`, if the mount shows it at `path` now: a
    /// descriptor of it and its attributes. A view of the past reads an
    /// object history has no version of live; in a union its branch
    /// root's directories are not where it is.
    pub(super) fn find_shown(
        &self,
        obj: ObjectId,
        path: &[Vec<u8>],
    ) -> Result<Option<(OwnedFd, Stat)>> {
        let Some(inode) = self.hold_object(obj, Some(path))? else {
            return Ok(None);
        };
        self.let_go_of(inode.ino).map(Some)
    }

    /// `name` in live directory `dir`, if the mount shows one there now:
    /// its object id, a descriptor of it and its attributes.
    pub(super) fn find_shown_child(
        &self,
        dir: ObjectId,
        name: &[u8],
    ) -> Result<Option<(ObjectId, OwnedFd, Stat)>> {
        let Some(parent) = self.hold_object(dir, None)? else {
            return Ok(None);
        };
        let found = self.hold_child(parent.ino, name);
        self.release_held(Some(parent.ino));
        let Some(ino) = found? else {
            return Ok(None);
        };
        let (fd, st) = self.let_go_of(ino)?;
        Ok(Some((ino.object(), fd, st)))
    }

    /// A descriptor of the held inode `ino` and its attributes, once it
    /// is released (the caller keeps the descriptor, not the inode).
    fn let_go_of(&self, ino: InodeNo) -> Result<(OwnedFd, Stat)> {
        let found = self.node(ino).and_then(|node| {
            let fd = sys::reopen(node.fd(), libc::O_PATH)?;
            let st = sys::fstat(fd.as_fd())?;
            Ok((fd, st))
        });
        self.release_held(Some(ino));
        found
    }

    /// [`Vfs::hold_path`] where every name must be there (`None` if one
    /// is not).
    fn hold_whole_path(&self, path: &[Vec<u8>]) -> Result<Option<Vec<InodeNo>>> {
        let comps: Vec<&[u8]> = path.iter().map(Vec::as_slice).collect();
        let held = self.hold_path(&comps)?;
        if held.len() == comps.len() {
            return Ok(Some(held));
        }
        self.release_all(held);
        Ok(None)
    }

    pub(super) fn release_all(&self, held: Vec<InodeNo>) {
        for ino in held {
            self.release_held(Some(ino));
        }
    }
}
