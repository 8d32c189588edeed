//! `chronofs clone`: a clone is made whole under a hidden name, its tag is
//! made durable, and only then is it put in place, in one step
//! (docs/ARCHITECTURE.md "Clones"). An existing DST is replaced as
//! rename(2) replaces a target. In a union the clone lands in the branch
//! the create policy picks, over a whiteout or over a name that other
//! branches hold, as a rename into the union would: a directory clone is
//! made opaque where a lower directory of that name would otherwise merge
//! into it, and a replaced copy a lower read-write branch holds goes after
//! the one visible step, as `delete=all` removes.

use std::ffi::{CStr, OsStr};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use super::clone::{Cloned, Mark};
use super::clone_fill::Prepared;
use super::inodes::Node;
use super::namespace::is_last_name;
use super::union::is_absent;
use super::union_ops::Target;
use super::{errno, Caller, InodeNo, Result, Stat, Vfs, VfsError};
use crate::branch::BranchId;
use crate::history::past::Node as PastNode;
use crate::history::Seq;
use crate::store::BackingKey;
use crate::sys::{self, creds};
use crate::union::format;

/// The object a clone replaces at DST: checked as rename(2) checks a
/// target, its state secured in history, held until the clone is in place.
struct Replaced {
    ino: InodeNo,
    /// Its attributes as the user saw them (a union's or a clone's link
    /// count, not the backing one).
    shown: Stat,
    /// Where it lives when that is a read-write branch of a union other
    /// than the primary one (its copy there goes once the clone hides it).
    left: Option<(BranchId, Stat)>,
}

fn is_dir_mode(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

impl Vfs {
    /// `chronofs clone`: makes `dst` (in directory `dst_parent`) a copy of
    /// mount path `src` as of `at`, as `caller`. Refused where the caller
    /// could not read SRC's top or write DST's directory. An existing DST
    /// is replaced as rename(2) would replace it (a directory only by a
    /// directory, and only if empty), in one step; in a union too, wherever
    /// its branches hold it.
    pub fn clone_path(
        &self,
        caller: &Caller,
        src: &[Vec<u8>],
        at: Seq,
        dst_parent: InodeNo,
        dst_name: &OsStr,
    ) -> Result<Cloned> {
        let _set = self.changing();
        if self.capture().is_none() {
            return Err(VfsError::NoHistory);
        }
        let base = self
            .with_past(|p| p.resolve(src, at).map_err(super::views::past_err))?
            .ok_or_else(|| errno(libc::ENOENT))?;
        self.check_name(dst_parent, dst_name)?;
        let parent = self.node(dst_parent)?;
        self.fill_if_unfilled(&parent)?;
        creds::as_caller(caller, || {
            sys::access_fd(parent.fd(), libc::W_OK | libc::X_OK)
        })?;
        let old = self.replaced_by_clone(caller, &parent, dst_name, &base)?;
        let made = self.make_clone(caller, (&base, src, at), dst_parent, dst_name, old.as_ref());
        self.release_held(old.map(|r| r.ino));
        made
    }

    /// What a clone named `name` in `parent` would replace, if the name
    /// shows anything.
    fn replaced_by_clone(
        &self,
        caller: &Caller,
        parent: &Node,
        name: &OsStr,
        base: &PastNode,
    ) -> Result<Option<Replaced>> {
        let shows = match self.union() {
            Some(_) => self.lookup_exists(parent, name)?,
            None => sys::fstatat(parent.fd(), &sys::cstr(name)?).is_ok(),
        };
        if !shows {
            return Ok(None);
        }
        let Some(ino) = self.hold_named(parent.ino, name)? else {
            return Ok(None);
        };
        match self.check_replaced(caller, parent, name, base, ino) {
            Ok(replaced) => Ok(Some(replaced)),
            Err(e) => {
                self.release_held(Some(ino));
                Err(e)
            }
        }
    }

    /// rename(2)'s checks of a target, in its order: kinds, the sticky
    /// bit, emptiness (the merged view's in a union; a clone's directory
    /// counts its base's entries); then its state is secured in history.
    fn check_replaced(
        &self,
        caller: &Caller,
        parent: &Node,
        name: &OsStr,
        base: &PastNode,
        ino: InodeNo,
    ) -> Result<Replaced> {
        let mut node = self.node(ino)?;
        if self.union().is_some() && !node.is_dir() {
            // A lower file with other names is copied up through the
            // index first, as an unlink does: the union's count of its
            // names needs somewhere to live once this one goes.
            self.index_before_unlink(caller, ino)?;
            node = self.node(ino)?;
        }
        let shown = self.shown(ino, sys::fstat(node.fd())?);
        match (is_dir_mode(base.mode()), is_dir_mode(shown.st_mode)) {
            (true, false) => return Err(errno(libc::ENOTDIR)),
            (false, true) => return Err(errno(libc::EISDIR)),
            _ => {}
        }
        let dir_st = sys::fstat(parent.fd())?;
        if dir_st.st_mode & libc::S_ISVTX != 0
            && caller.uid != 0
            && caller.uid != shown.st_uid
            && caller.uid != dir_st.st_uid
        {
            return Err(errno(libc::EPERM));
        }
        self.fill_held(ino)?;
        let mut left = None;
        if self.union().is_some() {
            if node.is_dir() {
                let cname = sys::cstr(name)?;
                if let Some(found) = self.walk(parent, &cname)? {
                    self.check_merged_empty(&found, &cname)?;
                }
            }
            left = self.left_behind(ino)?;
        }
        self.before_freeing(Some(parent.ino), Some(ino))?;
        Ok(Replaced { ino, shown, left })
    }

    fn make_clone(
        &self,
        caller: &Caller,
        (base, src, at): (&PastNode, &[Vec<u8>], Seq),
        dst_parent: InodeNo,
        dst_name: &OsStr,
        old: Option<&Replaced>,
    ) -> Result<Cloned> {
        let c = self.capture().ok_or(VfsError::NoHistory)?;
        let cname = sys::cstr(dst_name)?;
        self.before_dir_change(dst_parent)?;
        let target = self.create_target(caller, dst_parent, &cname)?;
        self.enable_clones();
        let depth = u16::try_from(src.len()).map_err(|_| errno(libc::ENAMETOOLONG))?;
        let mut mark = Mark {
            dir: false,
            at,
            by: caller.uid,
            clone_id: 0,
            depth,
            path: src.to_vec(),
            patch: None,
        };
        let dir = target.dir.fd();
        let prepared = self.prepare_entry(dir, base, mark.clone())?;
        let acquired = (|| {
            let fd = sys::open_path(dir, &prepared.hidden)?;
            let st = sys::fstat(fd.as_fd())?;
            let inode = match target.branch {
                Some(b) => self.inodes.acquire_new_in(b, fd, &st, true)?,
                None => self.inodes.acquire_new(fd, &st, true)?,
            };
            // The clone's id is its number, known only now.
            mark.dir = is_dir_mode(st.st_mode);
            mark.clone_id = inode.ino.0;
            if st.st_mode & libc::S_IFMT == libc::S_IFREG || mark.dir {
                let node = self.inodes.node_of(inode.clone())?;
                let name = self.clone_ns().clone_mark();
                sys::setxattr_fd(node.fd(), name, &mark.encode(), 0)?;
            }
            Ok::<_, VfsError>(inode)
        })();
        let inode = match acquired {
            Ok(i) => i,
            Err(e) => {
                prepared.discard(dir);
                return Err(e);
            }
        };
        let tag = format!("clone:{}", inode.ino.0);
        // The tag first: a crash after it leaves a tag and no clone, never
        // a clone whose base history may drop, or that the next mount
        // does not know to read through its marks.
        let published = c
            .pin_for_clone(&tag, at)
            .map_err(VfsError::from)
            .and_then(|()| self.publish_clone(&prepared, &target, dst_parent, &cname, old));
        let replaced_here = match published {
            Ok(r) => r,
            Err(e) => {
                prepared.discard(dir);
                let _ = c.unpin_clone(&tag);
                self.inodes.forget(inode.ino, 1);
                return Err(e);
            }
        };
        inode.set_name(target.dir.ino, dst_name.as_bytes());
        // The clone, once reported, survives a power cut.
        let synced =
            sys::reopen_dir(dir, libc::O_RDONLY).and_then(|d| sys::fsync(d.as_fd(), false));
        if let Err(e) = synced {
            tracing::warn!("clone: directory not synced: {e}");
        }
        if let Some(old) = old {
            self.after_clone_replaced(caller, (dst_parent, &cname), old, &target, replaced_here)?;
        }
        let binding = super::versioning::Live(self).binding_of(&inode);
        self.inodes.forget(inode.ino, 1);
        let entry = (dst_name.as_bytes().to_vec(), binding);
        c.cloned(target.dir.ino.object(), entry)?;
        self.dirs_verified(c, &[target.dir.ino]);
        self.attrs_changed(target.dir.ino);
        self.name_made(dst_parent, dst_name.as_bytes());
        Ok(Cloned {
            ino: inode.ino,
            tag,
        })
    }

    /// Puts the prepared clone at `name` in the target directory, over
    /// what is there only if `old` says the name shows something (a
    /// union's whiteout shows nothing and is replaced too). In a union a
    /// directory clone is made opaque first where something below would
    /// merge into it. Returns what it replaced in that directory.
    fn publish_clone(
        &self,
        prepared: &Prepared,
        target: &Target,
        parent: InodeNo,
        name: &CStr,
        old: Option<&Replaced>,
    ) -> Result<Option<Stat>> {
        let dir = target.dir.fd();
        let there = match sys::fstatat(dir, name) {
            Ok(st) => Some(st),
            Err(e) if is_absent(&e) => None,
            Err(e) => return Err(e.into()),
        };
        let whiteout = there.as_ref().is_some_and(format::is_whiteout);
        if let (Some(u), Some(branch)) = (self.union(), target.branch) {
            let below = || self.visible_below(&self.node(parent)?, name, branch);
            if prepared.is_dir && (whiteout || below()?) {
                let fd = sys::open_path(dir, &prepared.hidden)?;
                format::set_opaque(fd.as_fd(), u.ns)?;
            }
            if whiteout && prepared.is_dir {
                self.publish_dir_over_whiteout(prepared, dir, name)?;
                return Ok(None);
            }
        }
        match there {
            None => prepared.publish(dir, name, false)?,
            Some(_) if whiteout => prepared.publish(dir, name, true)?,
            // Made since the checks: rename(2) would have judged it.
            Some(_) if old.is_none() => return Err(errno(libc::EEXIST)),
            Some(st) => {
                // The kernel may hold it open: it must stay reachable.
                self.inodes.pin_if_known(&self.key_in_target(target, &st))?;
                if self.union().is_some() && is_dir_mode(st.st_mode) {
                    // Empty to the user: whiteouts are all it may hold.
                    self.clear_whiteouts_in(dir, name, None)?;
                }
                prepared.publish(dir, name, true)?;
                return Ok(Some(st));
            }
        }
        Ok(None)
    }

    /// A directory cannot be renamed over a whiteout (a character device):
    /// the two are exchanged and the whiteout, now under the hidden name,
    /// goes. Without RENAME_EXCHANGE the whiteout goes first.
    fn publish_dir_over_whiteout(
        &self,
        prepared: &Prepared,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &CStr,
    ) -> Result<()> {
        match sys::renameat2(dir, &prepared.hidden, dir, name, libc::RENAME_EXCHANGE) {
            Ok(()) => {
                if let Err(e) = sys::unlinkat(dir, &prepared.hidden, 0) {
                    tracing::warn!("clone: a hidden whiteout stays: {e}");
                }
                Ok(())
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                sys::unlinkat(dir, name, 0)?;
                prepared.publish(dir, name, false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// After the clone took the place of `old`: history records its
    /// removal, a linked file's count drops, the inode map forgets what
    /// had its last name replaced, and a copy a lower read-write branch
    /// holds goes (what the user saw changed already; a failure there is
    /// logged).
    fn after_clone_replaced(
        &self,
        caller: &Caller,
        (parent, name): (InodeNo, &CStr),
        old: &Replaced,
        target: &Target,
        replaced_here: Option<Stat>,
    ) -> Result<()> {
        let binding = self.binding_of(old.ino);
        // As rename(2)'s target: `chronofs log` says it was overwritten.
        let cause = crate::history::Cause::Overwritten;
        let oname = OsStr::from_bytes(name.to_bytes());
        let gone = is_last_name(&old.shown);
        self.after_remove(caller, parent, oname, old.ino, binding, gone, cause);
        if !is_dir_mode(old.shown.st_mode) {
            self.links_changed(old.ino, -1)?;
        }
        if let Some(st) = replaced_here.filter(is_last_name) {
            self.inodes.retire(&self.key_in_target(target, &st))?;
        }
        if let Some((b, st)) = old.left.filter(|(b, _)| Some(*b) != target.branch) {
            self.drop_hidden_copy(parent, name, b, &st);
        }
        Ok(())
    }

    /// The key of an object in the directory a clone is made in.
    fn key_in_target(&self, target: &Target, st: &Stat) -> BackingKey {
        match target.branch {
            Some(b) => self.inodes.key_in(b, st),
            None => self.inodes.key_of(st),
        }
    }
}
