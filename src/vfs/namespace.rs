//! Name space operations: lookup, forget, mkdir, mknod, symlink, link,
//! unlink, rmdir, rename.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use super::inodes::Node;
use super::union_ops::Target;
use super::{errno, Attr, Caller, Entry, InodeNo, Result, Stat, Vfs};
use crate::branch::BranchId;
use crate::history::Cause;
use crate::sys::{self, creds};
use crate::union::format;

impl Vfs {
    /// Looks `name` up in `parent` and takes a kernel reference on it.
    /// Runs as the daemon: with `default_permissions` the kernel has already
    /// checked search permission on `parent`.
    pub fn lookup(&self, caller: &Caller, parent: InodeNo, name: &OsStr) -> Result<Entry> {
        self.source_of(parent).lookup(self, caller, name)
    }

    /// Runs `f` on the inode the mount shows at `path` (components from
    /// its root), looked up as root (the caller checked its way there);
    /// the references the walk took are dropped after.
    pub(super) fn with_path<T>(
        &self,
        path: &[Vec<u8>],
        f: impl FnOnce(InodeNo) -> Result<T>,
    ) -> Result<T> {
        let root = Caller {
            uid: 0,
            gid: 0,
            pid: 0,
        };
        let mut held = Vec::new();
        let found = path.iter().try_fold(InodeNo::ROOT, |dir, comp| {
            let ino = self.lookup(&root, dir, OsStr::from_bytes(comp))?.attr.ino;
            held.push(ino);
            Ok(ino)
        });
        let out = found.and_then(f);
        for ino in held {
            self.forget(ino, 1);
        }
        out
    }

    /// Lookup in a live directory. A name no real entry has may still be
    /// history's: `.history` in the root, a version name (`f;3`) or
    /// `;deleted` (see `views/lookup.rs`).
    pub(super) fn live_lookup(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
    ) -> Result<Entry> {
        if self.is_own_name(parent == InodeNo::ROOT, name) {
            return Err(errno(libc::ENOENT));
        }
        let dir = self.node(parent)?;
        self.fill_if_unfilled(&dir)?;
        self.recheck_if_marked(&dir);
        let entry = match self.lookup_in(&dir, name) {
            Err(e) if e.errno_is(libc::ENOENT) => {
                let virtual_entry = if parent == InodeNo::ROOT {
                    self.lookup_top(caller, name)
                } else {
                    None
                };
                return match virtual_entry
                    .or_else(|| self.lookup_version_name(caller, parent, name))
                {
                    Some(found) => found.inspect(|e| self.note_view_name(parent, name, e.attr.ino)),
                    None => Err(e),
                };
            }
            other => other?,
        };
        // A clone's directory shows its base's link count once filled.
        let entry = self.filled_entry(entry)?;
        if let Some(c) = self.capture() {
            if let Ok(inode) = self.inodes.get(entry.attr.ino) {
                inode.set_name(parent, name.as_encoded_bytes());
                let first = inode.first_sight();
                let live = super::versioning::Live(self);
                if let Err(e) = c.looked_up(&live, entry.attr.ino.object(), &entry.attr.st, first) {
                    tracing::error!("history: recording an external change failed: {e}");
                }
            }
        }
        Ok(entry)
    }

    pub(super) fn lookup_in(&self, dir: &Node, name: &OsStr) -> Result<Entry> {
        if self.union().is_some() {
            return self.union_lookup(dir, name);
        }
        // No sandbox commit half done is seen.
        let _set = self.changing();
        let cname = sys::cstr(name)?;
        let st = sys::fstatat(dir.fd(), &cname)?;
        let mut reused = false;
        if let Some(inode) = self.inodes.acquire_known(&self.inodes.key_of(&st)) {
            if self.inodes.still_names(&inode, dir.fd(), &cname) {
                return Ok(Entry {
                    attr: Attr {
                        ino: inode.ino,
                        st: self.shown(inode.ino, st),
                    },
                    entry_ttl: None,
                });
            }
            tracing::debug!(
                "backing inode of inode {} was reused behind the mount",
                inode.ino.0
            );
            self.inodes.forget(inode.ino, 1);
            self.inodes.detach_key(&inode);
            reused = true;
        }
        let mut entry = self.register(dir, &cname, reused, None)?;
        entry.attr.st = self.shown(entry.attr.ino, entry.attr.st);
        Ok(entry)
    }

    /// Opens `name` in `dir` and registers it; `fresh` gives it a new
    /// number; `branch`: a union branch other than the default one.
    fn register(
        &self,
        dir: &Node,
        cname: &std::ffi::CStr,
        fresh: bool,
        branch: Option<BranchId>,
    ) -> Result<Entry> {
        let fd = sys::open_path(dir.fd(), cname)?;
        // Stat the descriptor itself: the name may have been replaced since.
        let st = sys::fstat(fd.as_fd())?;
        let inode = match branch {
            Some(b) => self.inodes.acquire_new_in(b, fd, &st, fresh)?,
            None => self.inodes.acquire_new(fd, &st, fresh)?,
        };
        Ok(Entry {
            attr: Attr { ino: inode.ino, st },
            entry_ttl: None,
        })
    }

    pub fn forget(&self, ino: InodeNo, nlookup: u64) {
        self.source_of(ino).forget(self, nlookup);
    }

    /// After a creating call succeeded, registers the new object under a
    /// new number.
    fn register_created(&self, caller: &Caller, at: &Target, name: &OsStr) -> Result<Entry> {
        let dir = &at.dir;
        let entry = self.register(dir, &sys::cstr(name)?, true, at.branch)?;
        self.after_create(caller, dir.ino, name, entry.attr.ino, &entry.attr.st);
        Ok(entry)
    }

    /// In a union, a name a lower branch holds exists even where the
    /// upper directory lacks it: creating it there would shadow that
    /// object instead of failing as on any file system. (The kernel
    /// usually answers EEXIST from its own lookup first.)
    fn refuse_taken(&self, parent: InodeNo, name: &OsStr) -> Result<()> {
        if self.union().is_none() {
            return Ok(());
        }
        let dir = self.node(parent)?;
        if self.lookup_exists(&dir, name)? {
            return Err(errno(libc::EEXIST));
        }
        Ok(())
    }

    pub fn mkdir(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<Entry> {
        let _set = self.changing();
        self.check_name(parent, name)?;
        self.refuse_taken(parent, name)?;
        self.before_dir_change(parent)?;
        let cname = sys::cstr(name)?;
        let at = self.create_target(caller, parent, &cname)?;
        let dir = &at.dir;
        // Over a whiteout the directory is made opaque (create_over_whiteout).
        self.create_over_whiteout(dir, &cname, |at| {
            creds::as_caller_with_umask(caller, umask, mode, || {
                sys::mkdirat(at.dir, at.name, mode)
            })?;
            Ok(())
        })?;
        self.register_created(caller, &at, name)
    }

    pub fn mknod(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Entry> {
        let _set = self.changing();
        self.check_name(parent, name)?;
        self.refuse_taken(parent, name)?;
        self.before_dir_change(parent)?;
        if self.union().is_some() && crate::union::format::is_whiteout_dev(mode, rdev) {
            // A 0/0 character device is a whiteout in a union's branches
            // (overlayfs's format): one made here would vanish. overlayfs
            // refuses it the same way.
            return Err(errno(libc::EPERM));
        }
        let cname = sys::cstr(name)?;
        let at = self.create_target(caller, parent, &cname)?;
        let dir = &at.dir;
        self.create_over_whiteout(dir, &cname, |at| {
            creds::as_caller_with_umask(caller, umask, mode, || {
                sys::mknodat(at.dir, at.name, mode, u64::from(rdev))
            })?;
            Ok(())
        })?;
        self.register_created(caller, &at, name)
    }

    pub fn symlink(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<Entry> {
        let _set = self.changing();
        self.check_name(parent, name)?;
        self.refuse_taken(parent, name)?;
        self.before_dir_change(parent)?;
        let cname = sys::cstr(name)?;
        let at = self.create_target(caller, parent, &cname)?;
        let dir = &at.dir;
        let ctarget = sys::cstr(target)?;
        self.create_over_whiteout(dir, &cname, |at| {
            creds::as_caller(caller, || sys::symlinkat(&ctarget, at.dir, at.name))?;
            Ok(())
        })?;
        self.register_created(caller, &at, name)
    }

    pub fn link(
        &self,
        caller: &Caller,
        ino: InodeNo,
        newparent: InodeNo,
        newname: &OsStr,
    ) -> Result<Entry> {
        let _set = self.changing();
        let _moving = self.clones.moves.start();
        // A link cannot leave a read-only source for a writable one.
        if !self.source_of(ino).writable() {
            return Err(errno(libc::EXDEV));
        }
        self.check_name(newparent, newname)?;
        self.refuse_taken(newparent, newname)?;
        self.before_dir_change(newparent)?;
        self.before_change(ino)?;
        let cname = sys::cstr(newname)?;
        let (inode, dir) = self.link_ends(caller, ino, newparent, &cname)?;
        self.create_over_whiteout(&dir, &cname, |at| {
            creds::as_caller(caller, || sys::link_fd(inode.fd(), at.dir, at.name))?;
            Ok(())
        })?;
        self.links_changed(ino, 1)?;
        // A new name for a known object, not a new object (looked up in
        // the union directory: `dir` may be one of its lower copies).
        let entry = self.lookup_in(&self.node(newparent)?, newname)?;
        inode.set_name(newparent, newname.as_encoded_bytes());
        self.after_link(caller, newparent, newname, entry.attr.ino);
        Ok(entry)
    }

    pub fn unlink(&self, caller: &Caller, parent: InodeNo, name: &OsStr) -> Result<()> {
        self.settle_named(parent, name);
        let _set = self.changing();
        self.remove(caller, parent, name, 0)
            .map_err(|e| self.past_names_are_read_only(parent, name, e))
    }

    pub fn rmdir(&self, caller: &Caller, parent: InodeNo, name: &OsStr) -> Result<()> {
        let _set = self.changing();
        self.remove(caller, parent, name, libc::AT_REMOVEDIR)
            .map_err(|e| self.past_names_are_read_only(parent, name, e))
    }

    /// A name of the past in a live directory (`f;1`, `;deleted`, the
    /// history directory) that the live directory does not hold: removing
    /// or moving it is a change to something read-only (EROFS), not to a
    /// name that is absent (`ls -l 'f;1'` shows it).
    fn past_names_are_read_only(
        &self,
        parent: InodeNo,
        name: &OsStr,
        e: super::VfsError,
    ) -> super::VfsError {
        if e.errno() == libc::ENOENT && self.is_past_name(parent, name) {
            errno(libc::EROFS)
        } else {
            e
        }
    }

    fn remove(&self, caller: &Caller, parent: InodeNo, name: &OsStr, flags: i32) -> Result<()> {
        self.source_of(parent).check_writable()?;
        self.fill_held(parent)?;
        if self.is_own_name(parent == InodeNo::ROOT, name) {
            return Err(errno(libc::ENOENT));
        }
        // A removed name needs no keeping: without history, a union that
        // is one directory holds nothing (its rmdir reads no hold).
        let held = match self.capture.is_none() && !self.through_union() {
            true => None,
            false => self.hold_named(parent, name)?,
        };
        // rmdir of a clone's directory: its base's entries count.
        let filled = match held.filter(|_| flags & libc::AT_REMOVEDIR != 0) {
            Some(dir) => self.fill_held(dir),
            None => Ok(()),
        };
        if let Err(e) = filled.and_then(|()| self.before_freeing(Some(parent), held)) {
            self.release_held(held);
            return Err(e);
        }
        let result = self.remove_held(caller, parent, name, flags, held);
        self.release_held(held);
        result
    }

    fn remove_held(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        flags: i32,
        held: Option<InodeNo>,
    ) -> Result<()> {
        let dir = self.node(parent)?;
        let cname = sys::cstr(name)?;
        // rmdir of a union's directory: one holding only whiteouts is
        // empty to the user.
        let rmdir = flags & libc::AT_REMOVEDIR != 0;
        let victim = if self.through_union() || (rmdir && self.union().is_some()) {
            if let Some(ino) = held.filter(|_| !rmdir) {
                self.index_before_unlink(caller, ino)?;
            }
            let victim = self.union_remove(caller, parent, name, flags)?;
            let victim = victim.map(|st| held.map_or(st, |ino| self.shown(ino, st)));
            if let Some(ino) = held {
                self.links_changed(ino, -1)?;
            }
            victim
        } else {
            let victim = self.pin_victim(&dir, &cname)?;
            let removed = creds::as_caller(caller, || sys::unlinkat(dir.fd(), &cname, flags));
            match removed {
                // A directory the user sees empty may hold a crash's
                // temporary (a copy-up's, a clone's): it goes first.
                Err(e)
                    if rmdir
                        && e.raw_os_error() == Some(libc::ENOTEMPTY)
                        && self.hides_temporaries()
                        && self.clear_orphans_as(caller, dir.fd(), &cname) =>
                {
                    creds::as_caller(caller, || sys::unlinkat(dir.fd(), &cname, flags))?
                }
                r => r?,
            }
            // A clone's linked copy: its count is the one shown.
            match (victim, held) {
                (Some(st), Some(ino)) => {
                    let shown = self.shown(ino, st);
                    self.links_changed(ino, -1)?;
                    Some(shown)
                }
                (victim, _) => victim,
            }
        };
        if let (Some(ino), Some(st)) = (held, victim) {
            let cause = if flags & libc::AT_REMOVEDIR != 0 {
                Cause::Rmdir
            } else {
                Cause::Unlink
            };
            let binding = self.binding_of(ino);
            self.after_remove(caller, parent, name, ino, binding, is_last_name(&st), cause);
        }
        self.retire_if_last(victim)
    }

    /// After the name of `victim` was removed or replaced: if that was its
    /// last name, its inode-map entry goes too (the index would otherwise
    /// keep every file ever seen).
    fn retire_if_last(&self, victim: Option<Stat>) -> Result<()> {
        match victim {
            Some(st) if is_last_name(&st) => Ok(self.inodes.retire(&self.inodes.key_of(&st))?),
            _ => Ok(()),
        }
    }

    /// A name about to be removed or replaced may be the last one of an
    /// object the kernel still holds (open-unlinked files): keep that
    /// object reachable, since a file handle cannot re-open it afterwards.
    /// Returns the victim's attributes, if the name exists.
    fn pin_victim(&self, dir: &Node, name: &std::ffi::CStr) -> Result<Option<Stat>> {
        // Any link count: two hard links may be removed concurrently.
        match sys::fstatat(dir.fd(), name) {
            Ok(st) => {
                self.inodes.pin_if_known(&self.inodes.key_of(&st))?;
                Ok(Some(st))
            }
            Err(_) => Ok(None),
        }
    }

    pub fn rename(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        newparent: InodeNo,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        self.rename_names(caller, parent, name, newparent, newname, flags)
            .map_err(|e| {
                let e = self.past_names_are_read_only(parent, name, e);
                match flags & libc::RENAME_EXCHANGE {
                    0 => e,
                    _ => self.past_names_are_read_only(newparent, newname, e),
                }
            })
    }

    fn rename_names(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        newparent: InodeNo,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        self.settle_named(parent, name);
        self.settle_named(newparent, newname);
        let _set = self.changing();
        let _moving = self.clones.moves.start();
        if !self.source_of(parent).writable() {
            // Out of a read-only source into a writable one is a move across
            // file systems (mv copies instead); within one, a change to it.
            return Err(errno(if self.source_of(newparent).writable() {
                libc::EXDEV
            } else {
                libc::EROFS
            }));
        }
        if self.is_own_name(parent == InodeNo::ROOT, name) {
            return Err(errno(libc::ENOENT));
        }
        // The whiteout RENAME_WHITEOUT leaves is a union's own mark (a 0/0
        // character device hides what lies below): refused as overlayfs
        // does, rather than the name vanishing.
        if flags & libc::RENAME_WHITEOUT != 0 && self.union().is_some() {
            return Err(errno(libc::EINVAL));
        }
        self.check_name(newparent, newname)?;
        self.fill_held(parent)?;
        self.fill_held(newparent)?;
        self.before_dir_change(parent)?;
        if newparent != parent {
            self.before_dir_change(newparent)?;
        }
        let moved = self.hold_named(parent, name)?;
        // In a union that is one directory, without history, the target
        // matters only to an exchange (its name) and to the union's code
        // (`rename_held` holds it then).
        let lazy = self.capture.is_none()
            && flags & libc::RENAME_EXCHANGE == 0
            && self.union().is_some()
            && !self.through_union();
        let target = match if lazy {
            Ok(None)
        } else {
            self.hold_named(newparent, newname)
        } {
            Ok(t) => t,
            Err(e) => {
                self.release_held(moved);
                return Err(e);
            }
        };
        // As create: a name that shows a version is read-only, and the
        // renamed file would hide the version.
        if target.is_none() && self.names_a_version(caller, newparent, newname) {
            self.release_held(moved);
            return Err(errno(libc::EROFS));
        }
        // A clone's directory replaced by the rename must be as empty as
        // it looks: its base's entries count.
        let result = match target.map(|t| self.fill_held(t)) {
            Some(Err(e)) => Err(e),
            _ => self.rename_held(
                caller,
                (parent, name),
                (newparent, newname),
                flags,
                (moved, target),
            ),
        };
        self.release_held(moved);
        self.release_held(target);
        result
    }

    fn rename_held(
        &self,
        caller: &Caller,
        (parent, name): (InodeNo, &OsStr),
        (newparent, newname): (InodeNo, &OsStr),
        flags: u32,
        (moved, target): (Option<InodeNo>, Option<InodeNo>),
    ) -> Result<()> {
        for held in [moved, target].into_iter().flatten() {
            self.before_change(held)?;
        }
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let in_place = match self.through_union() {
            true => None,
            false => self.rename_in_place(caller, (parent, name), (newparent, newname), flags)?,
        };
        // A clone's linked copy replaced: its count is the one shown.
        let in_place = match (in_place, target) {
            (Some(Some(st)), Some(t)) if !exchange && Some(t) != moved => {
                let shown = self.shown(t, st);
                self.links_changed(t, -1)?;
                Some(Some(shown))
            }
            (in_place, _) => in_place,
        };
        let victim = if let Some(victim) = in_place {
            victim
        } else {
            let moved = moved.ok_or(errno(libc::ENOENT))?;
            let late = match target {
                None if !self.through_union() => self.hold_named(newparent, newname)?,
                _ => None,
            };
            let held = (moved, target.or(late));
            let done = self.rename_through_union(
                caller,
                (parent, name),
                (newparent, newname),
                flags,
                held,
            );
            self.release_held(late);
            match done? {
                Some(victim) => victim,
                // Two names of one object: nothing to do (rename(2); the
                // kernel answers it before asking).
                None => return Ok(()),
            }
        };
        // Renaming a name onto another name of the same object changes nothing.
        if let Some(obj) = moved.filter(|m| Some(*m) != target) {
            let victim_info = target.map(|t| {
                let gone = exchange || victim.as_ref().is_some_and(is_last_name);
                (t, self.binding_of(t), gone && !exchange)
            });
            self.after_rename(
                caller,
                (parent, name),
                (newparent, newname),
                obj,
                victim_info,
                exchange,
            );
        }
        self.retire_if_last(victim)
    }
}

impl Vfs {
    /// rename(2) through the union's code. Returns the replaced object's
    /// attributes as the user saw them; `None` when both names are of one
    /// object (nothing to do).
    fn rename_through_union(
        &self,
        caller: &Caller,
        (parent, name): (InodeNo, &OsStr),
        (newparent, newname): (InodeNo, &OsStr),
        flags: u32,
        (moved, target): (InodeNo, Option<InodeNo>),
    ) -> Result<Option<Option<Stat>>> {
        if target == Some(moved) {
            return Ok(None);
        }
        let victim = self.union_rename(
            caller,
            (parent, name),
            (newparent, newname),
            flags,
            (moved, target),
        )?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        Ok(Some(match (victim, target) {
            (Some(st), Some(t)) if !exchange && t != moved => {
                let shown = self.shown(t, st);
                self.links_changed(t, -1)?;
                Some(shown)
            }
            (victim, _) => victim,
        }))
    }

    /// rename(2) in the one directory the mount shows: a single-directory
    /// mount, or a union that is one directory. Returns the replaced
    /// object's attributes; `None` where the union's code must do it: in a
    /// union, a new name that is a whiteout (no target to the user, for
    /// RENAME_NOREPLACE too) or a directory (one holding only whiteouts is
    /// empty to the user).
    fn rename_in_place(
        &self,
        caller: &Caller,
        (parent, name): (InodeNo, &OsStr),
        (newparent, newname): (InodeNo, &OsStr),
        flags: u32,
    ) -> Result<Option<Option<Stat>>> {
        let olddir = self.node(parent)?;
        let newdir = self.node(newparent)?;
        let old = sys::cstr(name)?;
        let new = sys::cstr(newname)?;
        let victim = match flags & libc::RENAME_EXCHANGE {
            0 => self.pin_victim(&newdir, &new)?,
            _ => None,
        };
        let needs_union = |st: &Stat| {
            st.st_mode & libc::S_IFMT == libc::S_IFDIR || crate::union::format::is_whiteout(st)
        };
        if self.union().is_some() && victim.as_ref().is_some_and(needs_union) {
            return Ok(None);
        }
        let rename = || {
            creds::as_caller(caller, || {
                sys::renameat2(olddir.fd(), &old, newdir.fd(), &new, flags)
            })
        };
        match rename() {
            // A target directory the user sees empty may hold a crash's
            // temporary: it goes first, as for rmdir.
            Err(e)
                if e.raw_os_error() == Some(libc::ENOTEMPTY)
                    && self.hides_temporaries()
                    && self.clear_orphans_as(caller, newdir.fd(), &new) =>
            {
                rename()?
            }
            r => r?,
        }
        Ok(Some(victim))
    }
}

/// Whether removing one name of the object with these attributes removes
/// the object (a directory has only one name).
pub(super) fn is_last_name(st: &Stat) -> bool {
    st.st_nlink <= 1 || st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

impl Vfs {
    /// Removes the crash's temporaries in directory `name` of `dir` (what
    /// the user sees empty) with `caller`'s identity: only what they could
    /// remove by hand goes (a name made to look like one, over someone
    /// else's tree, is not the daemon's to delete as root). Whether any
    /// went.
    fn clear_orphans_as(
        &self,
        caller: &Caller,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::CStr,
    ) -> bool {
        creds::as_caller(caller, || format::clear_orphans_in(dir, name)).is_ok_and(|n| n > 0)
    }
}
