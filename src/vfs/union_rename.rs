//! rename and link in a union. An object of a non-primary read-write
//! branch (where `create=mfs|existing-path` put it) moves in place there
//! when nothing in the other branches is involved; otherwise it is brought
//! into the primary branch as a read-only branch's object is (a file
//! copied up, a directory given an upper copy redirected to it) and moved
//! there, so a move across branches is never EXDEV. The copy it leaves
//! behind goes after the one visible step, as `delete=all` removes.

use std::ffi::{CStr, OsStr};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use super::inodes::Node;
use super::union::{is_absent, is_dir};
use super::{errno, Caller, InodeNo, Result, Stat, Vfs, VfsError};
use crate::branch::BranchId;
use crate::sys::{self, creds};
use crate::union::format;
use crate::union::spec::DeletePolicy;

/// An object living in a non-primary read-write branch, before it moves:
/// that branch and its attributes there (its copy is dropped afterwards).
type LeftBehind = Option<(BranchId, Stat)>;

impl Vfs {
    /// rename in a union: the moved object (and, for an exchange, the
    /// target) brought into the upper branch first, the rename done there,
    /// and a whiteout left where the old name lives on below. Returns the
    /// replaced object's attributes, if the target name existed.
    /// A snapmerge's fold may move or remove any copy it uses meanwhile:
    /// then it starts over with them found again (its one visible step is
    /// the last that can fail; what comes before it is done again or
    /// found done).
    pub(super) fn union_rename(
        &self,
        caller: &Caller,
        here: (InodeNo, &OsStr),
        there: (InodeNo, &OsStr),
        flags: u32,
        (moved, target): (InodeNo, Option<InodeNo>),
    ) -> Result<Option<Stat>> {
        let mut used = vec![here.0, there.0, moved];
        used.extend(target);
        self.again_after_fold_of(&used, || {
            self.union_rename_once(caller, here, there, flags, (moved, target))
        })
    }

    fn union_rename_once(
        &self,
        caller: &Caller,
        (parent, name): (InodeNo, &OsStr),
        (newparent, newname): (InodeNo, &OsStr),
        flags: u32,
        (moved, target): (InodeNo, Option<InodeNo>),
    ) -> Result<Option<Stat>> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let upper = u.upper().ok_or(errno(libc::EROFS))?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        self.check_merged_rename(parent, flags, (moved, target))?;
        let here = (parent, name);
        let there = (newparent, newname);
        if let Some(victim) = self.rename_in_branch(caller, here, there, flags, (moved, target))? {
            return Ok(victim);
        }
        let moved_from = self.left_behind(moved)?;
        let target_from = target.map(|t| self.left_behind(t)).transpose()?.flatten();
        let source = self.node(moved)?;
        if source.is_dir() {
            self.prepare_dir_move(caller, moved)?;
        }
        let source = self.node(moved)?;
        let old = sys::cstr(name)?;
        let new = sys::cstr(newname)?;
        let olddir = self.writable_dir(caller, parent)?;
        let below_old = self.visible_below(&olddir, &old, upper)?;
        self.upper_node(caller, moved)?;
        self.name_in_upper(moved, (&olddir, &old))?;
        let newdir = self.writable_dir(caller, newparent)?;
        let target_below = self.visible_below(&newdir, &new, upper)?;
        if source.is_dir() && self.is_within(newparent, moved) {
            return Err(errno(libc::EINVAL));
        }
        if let Some(t) = target {
            self.prepare_target(caller, (newparent, &new), t, exchange, &source)?;
            self.name_in_upper(t, (&newdir, &new))?;
        }
        // A replaced file left in its read-only branch must stay there
        // until the rename is done: a copy-up meanwhile (a write open)
        // would be the object replaced, unpinned and unrecorded.
        let _target_stays = match target {
            Some(t) if !exchange && !self.node(t)?.is_dir() => Some(u.copying_up(t)),
            _ => None,
        };
        let at_new = if exchange {
            None
        } else {
            Some(sys::fstatat(newdir.fd(), &new))
        };
        let over_whiteout = at_new
            .as_ref()
            .is_some_and(|st| st.as_ref().is_ok_and(format::is_whiteout));
        let victim = match at_new {
            Some(st) if !over_whiteout => {
                let hidden = match (target_from, target) {
                    (None, Some(t)) => self.hidden_read_only(t)?,
                    (from, _) => from,
                };
                self.replaced(caller, &newdir, (&new, st), hidden)?
            }
            _ => None,
        };
        let whiteout_old = below_old && !exchange;
        if source.is_dir() && (over_whiteout || target_below) {
            // What lies below the new name stays hidden from the moment
            // the directory lands; at its old place opacity hides nothing
            // (a directory with lower copies is redirected instead).
            hide_below(u.ns, (&olddir, &old))?;
        }
        let target_is_dir = match target {
            Some(t) if exchange => self.node(t)?.is_dir(),
            _ => false,
        };
        if target_is_dir && below_old {
            // The same for the other side of an exchange: a directory of
            // the upper branch alone landing where lower copies lie (as
            // overlayfs marks it opaque); one with lower copies of its own
            // was redirected by `prepare_target`.
            hide_below(u.ns, (&newdir, &new))?;
        }
        self.rename_over(
            caller,
            (&olddir, &old),
            (&newdir, &new),
            flags,
            (whiteout_old, over_whiteout && source.is_dir()),
        )?;
        // (The inode was rebound by the copy-up: not `source`'s any more.)
        self.inodes
            .get(moved)?
            .set_name(newparent, newname.as_encoded_bytes());
        if exchange {
            if let Some(t) = target.and_then(|t| self.inodes.get(t).ok()) {
                t.set_name(parent, name.as_encoded_bytes());
            }
        }
        // The visible tree has changed; what follows only tidies copies
        // nobody sees (a failure there is logged, not returned).
        if let Some((b, st)) = moved_from.filter(|(_, st)| !is_dir(st)) {
            self.drop_hidden_copy(parent, &old, b, &st);
            if whiteout_old {
                self.drop_needless_whiteout(parent, &old);
            }
        }
        if let Some((b, st)) = target_from.filter(|(_, st)| !exchange || !is_dir(st)) {
            self.drop_hidden_copy(newparent, &new, b, &st);
        }
        Ok(victim)
    }

    /// A hard-linked lower file copied up through another of its names
    /// lives in the index: this name of it, still the lower one, gets its
    /// upper link (the same object: nothing visible changes), so the
    /// rename in the upper branch finds it.
    fn name_in_upper(&self, ino: InodeNo, (dir, name): (&Node, &CStr)) -> Result<()> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let node = self.node(ino)?;
        // Only an indexed file can have lost its upper name (reached
        // through the index, as its other lower names are).
        if node.is_dir()
            || Some(self.inodes.branch_of(&node.key)) != u.upper()
            || node.inode.union_nlink().is_none()
        {
            return Ok(());
        }
        match sys::fstatat(dir.fd(), name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                Ok(crate::union::copyup::link_up(node.fd(), dir.fd(), name)?)
            }
            Err(e) => Err(e.into()),
            Ok(_) => Ok(()),
        }
    }

    /// rename(2)'s checks the merged view decides: the target may live in
    /// a branch the upper one's rename would not see. (The kernel checks
    /// them before it asks; in-process callers need them here.)
    fn check_merged_rename(
        &self,
        parent: InodeNo,
        flags: u32,
        (moved, target): (InodeNo, Option<InodeNo>),
    ) -> Result<()> {
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & libc::RENAME_NOREPLACE != 0 && target.is_some() {
            return Err(errno(libc::EEXIST));
        }
        if exchange && target.is_none() {
            return Err(errno(libc::ENOENT));
        }
        // The target an ancestor of the source.
        if target.is_some_and(|t| t != moved && self.is_within(parent, t)) {
            return Err(errno(if exchange {
                libc::EINVAL
            } else {
                libc::ENOTEMPTY
            }));
        }
        Ok(())
    }

    /// The object a (non-exchange) rename to `new` in upper directory
    /// `newdir` replaces, kept reachable for the kernel's open handles: the
    /// upper one, else `hidden`, the one a lower branch holds (hidden by
    /// the rename; a read-write branch's copy goes after it).
    /// `at_new`: the upper name's stat (taken once for this and the
    /// whiteout check).
    fn replaced(
        &self,
        caller: &Caller,
        newdir: &Node,
        (new, at_new): (&CStr, std::io::Result<Stat>),
        hidden: LeftBehind,
    ) -> Result<Option<Stat>> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let upper = u.upper().ok_or(errno(libc::EROFS))?;
        match at_new {
            Ok(st) => {
                self.inodes.pin_if_known(&self.inodes.key_in(upper, &st))?;
                if is_dir(&st) {
                    self.clear_whiteouts_in(newdir.fd(), new, Some(caller))?;
                }
                Ok(Some(st))
            }
            Err(e) if !is_absent(&e) => Err(e.into()),
            Err(_) => match hidden {
                Some((b, st)) => {
                    self.inodes.pin_if_known(&self.inodes.key_in(b, &st))?;
                    Ok(Some(st))
                }
                None => Ok(None),
            },
        }
    }

    /// The one visible step of a rename in the upper branch (the old name
    /// whited out in it with `whiteout_old`). Onto a whiteout a
    /// non-directory replaces it in the rename (NOREPLACE was judged on
    /// the merged view: the whiteout is no target); a directory
    /// (`dir_over_whiteout`) is exchanged with it, and the whiteout, now
    /// at the old name, stays there if something below must stay hidden,
    /// else goes.
    fn rename_over(
        &self,
        caller: &Caller,
        (olddir, old): (&Node, &CStr),
        (newdir, new): (&Node, &CStr),
        flags: u32,
        (whiteout_old, dir_over_whiteout): (bool, bool),
    ) -> Result<()> {
        let merged_flags = flags & !libc::RENAME_NOREPLACE;
        let over_whiteout = sys::fstatat(newdir.fd(), new).is_ok_and(|st| format::is_whiteout(&st));
        if !dir_over_whiteout {
            let flags = if over_whiteout { merged_flags } else { flags };
            return self.rename_hiding_old(
                caller,
                (olddir, old),
                (newdir, new),
                flags,
                whiteout_old,
            );
        }
        let exchanged = creds::as_caller(caller, || {
            sys::renameat2(olddir.fd(), old, newdir.fd(), new, libc::RENAME_EXCHANGE)
        });
        match exchanged {
            Ok(()) => {
                if !whiteout_old {
                    if let Err(e) = sys::unlinkat(olddir.fd(), old, 0) {
                        tracing::warn!("union: a whiteout hiding nothing stays: {e}");
                    }
                }
                Ok(())
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                // No exchange on this file system: the whiteout goes first.
                self.clear_whiteout(newdir, new)?;
                let (o, n) = ((olddir, old), (newdir, new));
                self.rename_hiding_old(caller, o, n, merged_flags, whiteout_old)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The target of a rename, made ready: kinds and emptiness checked;
    /// for an exchange brought into the upper branch (a directory with a
    /// redirect, as a moved one); a replaced read-only copy copied up to
    /// be renamed over (a read-write one is hidden instead).
    fn prepare_target(
        &self,
        caller: &Caller,
        (newparent, new): (InodeNo, &CStr),
        t: InodeNo,
        exchange: bool,
        source: &Node,
    ) -> Result<()> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let tnode = self.node(t)?;
        if exchange {
            if tnode.is_dir() {
                self.prepare_dir_move(caller, t)?;
            }
            self.upper_node(caller, t)?;
            return Ok(());
        }
        // rename(2)'s kinds rule comes before the emptiness one.
        match (source.is_dir(), tnode.is_dir()) {
            (false, true) => return Err(errno(libc::EISDIR)),
            (true, false) => return Err(errno(libc::ENOTDIR)),
            _ => {}
        }
        if tnode.is_dir() {
            if let Some(found) = self.walk(&self.node(newparent)?, new)? {
                self.check_merged_empty(&found, new)?;
            }
        }
        if u.writable(self.inodes.branch_of(&tnode.key)) {
            return Ok(());
        }
        if tnode.is_dir() {
            self.writable_node(caller, t)?;
            return Ok(());
        }
        // A read-only branch's file is hidden by the new name, as a
        // removal hides it: never copied (a large one would fail with
        // ENOSPC), unless its other names count on the index. Not by an
        // upper branch a mode change put below it (EROFS).
        super::union_ops::hidable(u, self.inodes.branch_of(&tnode.key))?;
        if let Some(found) = self.walk(&self.node(newparent)?, new)? {
            super::union_ops::refuse_protected(found.top.1.as_fd(), new, &found.top.2)?;
        }
        self.index_before_unlink(caller, t)
    }

    /// A rename's target still in a read-only branch (hidden by the
    /// rename, not copied up): that branch and its attributes.
    fn hidden_read_only(&self, t: InodeNo) -> Result<LeftBehind> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let node = self.node(t)?;
        let b = self.inodes.branch_of(&node.key);
        if u.writable(b) || node.is_dir() {
            return Ok(None);
        }
        Ok(Some((b, sys::fstat(node.fd())?)))
    }

    /// Where `ino` lives if that is a read-write branch other than the
    /// primary one (a move takes it out of there).
    pub(super) fn left_behind(&self, ino: InodeNo) -> Result<LeftBehind> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let node = self.node(ino)?;
        let b = self.inodes.branch_of(&node.key);
        if Some(b) == u.upper() || !u.writable(b) {
            return Ok(None);
        }
        Ok(Some((b, sys::fstat(node.fd())?)))
    }

    /// Removes the copy of `name` in directory `dir`'s copy in `branch`
    /// if it still is the object `was` (a file with one name, or a
    /// directory holding nothing but whiteouts): hidden since the move, it
    /// would only hold space. Only under `delete=all` (`delete=whiteout`
    /// leaves lower branches alone).
    pub(super) fn drop_hidden_copy(&self, dir: InodeNo, name: &CStr, branch: BranchId, was: &Stat) {
        let r = (|| -> Result<()> {
            let u = self.union().ok_or(VfsError::WrongKind)?;
            if u.opts.delete != DeletePolicy::All {
                return Ok(());
            }
            let Ok(at) = self.copy_in(dir, branch) else {
                return Ok(());
            };
            let st = match sys::fstatat(at.as_fd(), name) {
                Ok(st) => st,
                Err(e) if is_absent(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            // A hard-linked file's other names resolve to its copy up
            // through the index only while it counts as linked: its names
            // stay (hidden, they take no space).
            if (st.st_dev, st.st_ino) != (was.st_dev, was.st_ino)
                || (!is_dir(&st) && st.st_nlink > 1)
            {
                return Ok(());
            }
            let flags = if is_dir(&st) {
                let fd = sys::open_path(at.as_fd(), name)?;
                let listing = crate::union::merge::read_layer(fd.as_fd(), u.ns)?;
                if !listing.entries.iter().all(|e| e.whiteout) {
                    return Ok(());
                }
                self.clear_whiteouts_in(at.as_fd(), name, None)?;
                libc::AT_REMOVEDIR
            } else {
                0
            };
            sys::unlinkat(at.as_fd(), name, flags)?;
            self.inodes.retire(&self.inodes.key_in(branch, &st))?;
            Ok(())
        })();
        if let Err(e) = r {
            tracing::warn!("union: a hidden copy of a moved name stays: {e}");
        }
    }

    /// The upper whiteout at `name` in `dir`, once no copy below it is
    /// left to hide.
    fn drop_needless_whiteout(&self, dir: InodeNo, name: &CStr) {
        let r = (|| -> Result<()> {
            let u = self.union().ok_or(VfsError::WrongKind)?;
            let node = self.node(dir)?;
            let mut layers = self.layers_of(&node)?.into_iter();
            let Some(top) = layers.next().filter(|l| Some(l.branch) == u.upper()) else {
                return Ok(());
            };
            match sys::fstatat(top.fd.as_fd(), name) {
                Ok(st) if format::is_whiteout(&st) => {}
                _ => return Ok(()),
            }
            for l in layers {
                match sys::fstatat(l.fd.as_fd(), name) {
                    Ok(st) if format::is_whiteout(&st) => break,
                    Ok(_) => return Ok(()),
                    Err(e) if is_absent(&e) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(sys::unlinkat(top.fd.as_fd(), name, 0)?)
        })();
        if let Err(e) = r {
            tracing::warn!("union: a whiteout with nothing below stays: {e}");
        }
    }

    /// Renames within the branch holding the moved object when that is a
    /// non-primary read-write branch, both directories have a copy there,
    /// no other branch holds either name (nothing would resurface or stay
    /// hidden) and the object has no lower copies. `None`: not such a case
    /// (the object then moves through the upper branch).
    fn rename_in_branch(
        &self,
        caller: &Caller,
        (parent, name): (InodeNo, &OsStr),
        (newparent, newname): (InodeNo, &OsStr),
        flags: u32,
        (moved, target): (InodeNo, Option<InodeNo>),
    ) -> Result<Option<Option<Stat>>> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let source = self.node(moved)?;
        let branch = self.inodes.branch_of(&source.key);
        if Some(branch) == u.upper() || !u.writable(branch) {
            return Ok(None);
        }
        let old = sys::cstr(name)?;
        let new = sys::cstr(newname)?;
        let (Some(olddir), Some(newdir)) = (
            self.copy_at(parent, branch)?,
            self.copy_at(newparent, branch)?,
        ) else {
            return Ok(None);
        };
        let target_here = match target {
            None => true,
            Some(t) => {
                let t = self.node(t)?;
                self.inodes.branch_of(&t.key) == branch && !t.has_layers()
            }
        };
        let alone = !source.has_layers()
            && flags & libc::RENAME_EXCHANGE == 0
            && target_here
            && !self.visible_below(&self.node(parent)?, &old, branch)?
            && !self.visible_below(&self.node(newparent)?, &new, branch)?
            && self.free_above(&self.node(newparent)?, &new, branch)?;
        if !alone {
            return Ok(None);
        }
        let victim = match sys::fstatat(newdir.fd(), &new) {
            Ok(st) => {
                self.inodes.pin_if_known(&self.inodes.key_in(branch, &st))?;
                if is_dir(&st) {
                    self.clear_whiteouts_in(newdir.fd(), &new, Some(caller))?;
                }
                Some(st)
            }
            Err(_) => None,
        };
        creds::as_caller(caller, || {
            sys::renameat2(olddir.fd(), &old, newdir.fd(), &new, flags)
        })?;
        source.set_name(newparent, newname.as_encoded_bytes());
        Ok(Some(victim))
    }

    /// Directory `dir`'s existing copy in `branch`, if it has one (for
    /// system calls only: its `layers_of` would take that copy for the top).
    fn copy_at(&self, dir: InodeNo, branch: BranchId) -> Result<Option<Node>> {
        let node = self.node(dir)?;
        let copy = self
            .layers_of(&node)?
            .into_iter()
            .find(|l| l.branch == branch);
        Ok(copy.map(|l| Node::with_fd(node.inode.clone(), l.fd)))
    }

    /// For `link`: the object to link and the directory copy to link it
    /// into. An object of a non-primary read-write branch is linked in
    /// place when the new parent has a copy there and nothing above would
    /// hide the new name; otherwise it is brought into the upper branch
    /// first (its copy left below goes, unless it has other names).
    pub(super) fn link_ends(
        &self,
        caller: &Caller,
        ino: InodeNo,
        newparent: InodeNo,
        newname: &CStr,
    ) -> Result<(Node, Node)> {
        let left = match self.union() {
            Some(_) => self.left_behind(ino)?,
            None => None,
        };
        let Some((branch, st)) = left else {
            return Ok((
                self.writable_node(caller, ino)?,
                self.writable_dir(caller, newparent)?,
            ));
        };
        let parent_node = self.node(newparent)?;
        if let Some(dir) = self.copy_at(newparent, branch)? {
            if self.free_above(&parent_node, newname, branch)? {
                return Ok((self.node(ino)?, dir));
            }
        }
        let name = self.node(ino)?.name();
        let node = self.upper_node(caller, ino)?;
        if let Some((parent, name)) = name {
            let cname = sys::cstr(OsStr::from_bytes(&name))?;
            self.drop_hidden_copy(parent, &cname, branch, &st);
        }
        Ok((node, self.writable_dir(caller, newparent)?))
    }
}

/// Makes directory `name` in `dir` opaque unless it is redirected: what
/// lies below the name it is about to take stays hidden.
fn hide_below(ns: format::XattrNs, (dir, name): (&Node, &CStr)) -> Result<()> {
    let fd = sys::open_path(dir.fd(), name)?;
    if format::redirect(fd.as_fd(), ns)?.is_none() {
        format::set_opaque(fd.as_fd(), ns)?;
    }
    Ok(())
}
