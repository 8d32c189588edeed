//! rename of an object that lives in a read-write branch other than the
//! primary one (where `create=mfs|existing-path` put it): done in place
//! in that branch when nothing in the other branches is involved.

use std::ffi::OsStr;

use super::inodes::Node;
use super::union::is_dir;
use super::{errno, Caller, InodeNo, Result, Stat, Vfs, VfsError};
use crate::branch::BranchId;
use crate::sys::{self, creds};

impl Vfs {
    /// Renames within the branch holding the moved object when that is a
    /// non-primary read-write branch, both directories have a copy there,
    /// no other branch holds either name (nothing would resurface or stay
    /// hidden) and the object has no lower copies. `None`: not such a case
    /// (an object in the primary or a read-only branch takes the usual
    /// path); EXDEV for one in another read-write branch that cannot move
    /// in place (tools then copy it, as across file systems).
    pub(super) fn rename_in_branch(
        &self,
        caller: &Caller,
        (parent, name): (InodeNo, &OsStr),
        (newparent, newname): (InodeNo, &OsStr),
        flags: u32,
        (moved, target): (InodeNo, Option<InodeNo>),
    ) -> Result<Option<Option<Stat>>> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let source = self.inodes.node(moved)?;
        let branch = BranchId(source.key.branch);
        if Some(branch) == u.upper || !u.writable(branch) {
            return Ok(None);
        }
        let old = sys::cstr(name)?;
        let new = sys::cstr(newname)?;
        let olddir = self.copy_at(parent, branch)?;
        let newdir = self.copy_at(newparent, branch)?;
        let (Some(olddir), Some(newdir)) = (olddir, newdir) else {
            return Err(errno(libc::EXDEV));
        };
        let target_here = match target {
            None => true,
            Some(t) => {
                let t = self.inodes.node(t)?;
                t.key.branch == branch.0 && !t.has_layers()
            }
        };
        let alone = !source.has_layers()
            && flags & libc::RENAME_EXCHANGE == 0
            && target_here
            && !self.visible_below(&self.inodes.node(parent)?, &old, branch)?
            && !self.visible_below(&self.inodes.node(newparent)?, &new, branch)?
            && self.free_above(&self.inodes.node(newparent)?, &new, branch)?;
        if !alone {
            return Err(errno(libc::EXDEV));
        }
        let victim = match sys::fstatat(newdir.fd(), &new) {
            Ok(st) => {
                self.inodes.pin_if_known(&self.inodes.key_in(branch, &st))?;
                if is_dir(&st) {
                    self.clear_whiteouts_in(newdir.fd(), &new)?;
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
        let node = self.inodes.node(dir)?;
        let copy = self
            .layers_of(&node)?
            .into_iter()
            .find(|l| l.branch == branch);
        Ok(copy.map(|l| Node::with_fd(node.inode.clone(), l.fd)))
    }
}
