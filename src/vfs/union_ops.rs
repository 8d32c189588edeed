//! Union mounts with several read-write branches: which branch a create
//! goes to (`-o create=`), what a removal does to each branch (`-o
//! delete=`), and the order of multi-branch steps, chosen so that the
//! visible tree changes in one step and a failure before it changes
//! nothing the user sees. docs/ARCHITECTURE.md "Union mounts".

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::inodes::{Layer, Node};
use super::union::{is_absent, is_dir, Found, Union};
use super::{errno, Caller, InodeNo, Result, Stat, Vfs, VfsError};
use crate::branch::BranchId;
use crate::sys::{self, creds};
use crate::union::spec::{CreatePolicy, DeletePolicy};
use crate::union::{copyup, format, merge};

/// A union mount's options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnionOptions {
    pub owner: copyup::OwnerOption,
    pub create: CreatePolicy,
    pub delete: DeletePolicy,
    /// The namespace of the overlay marks (opaque, redirect, the
    /// hard-link index's): `trusted.` unless `-o userxattr`.
    pub xattr_ns: format::XattrNs,
}

/// Where a new name goes: the parent's copy in the chosen branch, and
/// that branch (always named in a union: the upper branch need not be the
/// root's own once modes change).
pub(super) struct Target {
    pub dir: Node,
    pub branch: Option<BranchId>,
}

impl Vfs {
    /// The directory a new name in `parent` is created in, per the
    /// mount's create policy (made, with its missing parents, in the
    /// chosen branch). Outside a union: `parent` itself.
    pub(super) fn create_target(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &CStr,
    ) -> Result<Target> {
        let chosen = match self.union() {
            None => None,
            Some(u) => {
                let dir = self.node(parent)?;
                match u.opts.create {
                    CreatePolicy::Top => None,
                    CreatePolicy::ExistingPath => self.existing_path_branch(&dir, name)?,
                    CreatePolicy::Mfs => self.most_free_branch(&dir, name)?,
                }
                .filter(|b| Some(*b) != u.upper())
            }
        };
        Ok(match chosen {
            Some(b) => Target {
                dir: self.dir_in(caller, parent, b)?,
                branch: Some(b),
            },
            // The upper branch, named: it is the mount's primary one only
            // until a mode change moves it (`branch mode`).
            None => {
                self.visible_in_upper(parent, name)?;
                Target {
                    dir: self.writable_dir(caller, parent)?,
                    branch: self.union().and_then(|u| u.upper()),
                }
            }
        })
    }

    /// EROFS unless a name made in the upper branch would show: a mode
    /// change or `branch add` may leave a read-only branch above it, whose
    /// whiteout of the name would hide the new object, or whose opaque
    /// copy of the directory would hide all the upper branch's entries of
    /// it (a create there succeeded and its file was nowhere to be seen).
    fn visible_in_upper(&self, parent: InodeNo, name: &CStr) -> Result<()> {
        let Some(u) = self.union() else {
            return Ok(());
        };
        let upper = u.upper().ok_or(errno(libc::EROFS))?;
        if u.rank(upper) == 0 {
            return Ok(());
        }
        let dir = self.node(parent)?;
        if !self.free_above(&dir, name, upper)? || !self.reachable(&dir, upper)? {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    /// The highest read-write branch already holding the directory where
    /// `name` would be visible (`None`: none, so the top one).
    fn existing_path_branch(&self, dir: &Node, name: &CStr) -> Result<Option<BranchId>> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        for l in self.layers_of(dir)? {
            if u.writable(l.branch) && self.free_above(dir, name, l.branch)? {
                return Ok(Some(l.branch));
            }
        }
        Ok(None)
    }

    /// The read-write branch with the most free space (statvfs now) where
    /// `name` in `dir` can be made visible; the higher one on a tie.
    fn most_free_branch(&self, dir: &Node, name: &CStr) -> Result<Option<BranchId>> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let mut best: Option<(u64, BranchId)> = None;
        for (b, root) in u.roots() {
            if !u.writable(b) || !self.reachable(dir, b)? || !self.free_above(dir, name, b)? {
                continue;
            }
            let Ok(fs) = sys::fstatvfs(root.as_fd()) else {
                continue;
            };
            let free = fs.f_bavail.saturating_mul(fs.f_frsize);
            if best.is_none_or(|(most, _)| free > most) {
                best = Some((free, b));
            }
        }
        Ok(best.map(|(_, b)| b))
    }

    /// Whether no copy of `dir` above `branch` has anything (a whiteout
    /// included) under `name`: an object made in `branch` is then visible
    /// at once, and nothing hidden resurfaces. A name hidden by a whiteout
    /// is made again where the whiteout is.
    pub(super) fn free_above(&self, dir: &Node, name: &CStr, branch: BranchId) -> Result<bool> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        for l in self.layers_of(dir)? {
            if u.rank(l.branch) >= u.rank(branch) {
                break;
            }
            match sys::fstatat(l.fd.as_fd(), name) {
                Err(e) if is_absent(&e) => continue,
                Err(e) => return Err(e.into()),
                Ok(_) => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Whether a copy of directory `dir` made in `branch` would be one of
    /// its layers: every copy of its parent above `branch` lets a lookup
    /// of its name pass on down (absent there, or a directory neither
    /// opaque nor redirected), and so on up to the root.
    pub(super) fn reachable(&self, dir: &Node, branch: BranchId) -> Result<bool> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        if self.layers_of(dir)?.iter().any(|l| l.branch == branch) {
            return Ok(true);
        }
        let Some((parent, name)) = dir.name() else {
            return Ok(false);
        };
        // A new top copy would not carry the old top's redirect.
        if u.rank(branch) < u.rank(self.inodes.branch_of(&dir.key))
            && format::redirect(dir.fd(), u.ns)?.is_some()
        {
            return Ok(false);
        }
        let parent = self.node(parent)?;
        let cname = sys::cstr(OsStr::from_bytes(&name))?;
        for l in self.layers_of(&parent)? {
            if u.rank(l.branch) >= u.rank(branch) {
                break;
            }
            let st = match sys::fstatat(l.fd.as_fd(), &cname) {
                Err(e) if is_absent(&e) => continue,
                Err(e) => return Err(e.into()),
                Ok(st) => st,
            };
            if !is_dir(&st) {
                return Ok(false);
            }
            let fd = sys::open_path(l.fd.as_fd(), &cname)?;
            if format::is_opaque(fd.as_fd(), u.ns)? || format::redirect(fd.as_fd(), u.ns)?.is_some()
            {
                return Ok(false);
            }
        }
        self.reachable(&parent, branch)
    }

    /// Directory `ino`'s copy in `branch`, made (parents first, as
    /// copy-up makes them) if missing; the inode then lists it among its
    /// layers. Only for a branch [`Vfs::reachable`] accepted.
    fn dir_in(&self, caller: &Caller, ino: InodeNo, branch: BranchId) -> Result<Node> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let node = self.node(ino)?;
        let mut copies = self.layers_of(&node)?;
        if let Some(l) = copies.iter().find(|l| l.branch == branch) {
            return Ok(Node::with_fd(node.inode.clone(), l.fd.clone()));
        }
        let (parent, name) = node.name().ok_or(errno(libc::ESTALE))?;
        let new_parent = self.dir_in(caller, parent, branch)?;
        let lower_parent = self.copy_in(parent, self.inodes.branch_of(&node.key))?;
        let cname = sys::cstr(OsStr::from_bytes(&name))?;
        // The copy is the directory's identity only if it is its top one.
        let top = copies.iter().all(|l| u.rank(l.branch) > u.rank(branch));
        let made = Arc::new(copyup::copy_up_dir_identified(
            lower_parent.as_fd(),
            new_parent.fd(),
            &cname,
            &u.opts.owner.resolve(caller.uid, caller.gid),
            &|_, st| {
                if top {
                    self.inodes.bind_copy(branch, st, ino);
                }
                Ok(())
            },
        )?);
        copies.push(Layer {
            branch,
            fd: made.clone(),
        });
        self.by_rank(&mut copies);
        let top = copies.remove(0);
        let top_fd = sys::reopen(top.fd.as_fd(), libc::O_PATH | libc::O_DIRECTORY)?;
        let st = sys::fstat(top_fd.as_fd())?;
        let inode = self.inodes.rebind(ino, top.branch, top_fd, &st, copies)?;
        // Its link count is shown as 1 from now on (`Vfs::shown`).
        self.attrs_changed(ino);
        Ok(Node::with_fd(inode, made))
    }

    /// Creates `name` in `dir` with `make`, which is told where to make
    /// the object. Over a whiteout that is a hidden temporary name in the
    /// same directory, then the object takes the whiteout's place in one
    /// rename (a directory, made opaque first, by an exchange, and the
    /// whiteout then removed under the temporary name), so the lower
    /// object never shows and a failed create leaves the whiteout as it
    /// was. Returns whether a whiteout gave way.
    pub(super) fn create_over_whiteout<T>(
        &self,
        dir: &Node,
        name: &CStr,
        make: impl FnOnce(MakeAt<'_>) -> Result<T>,
    ) -> Result<(T, bool)> {
        let over_whiteout = self.union().is_some()
            && sys::fstatat(dir.fd(), name).is_ok_and(|st| format::is_whiteout(&st));
        if !over_whiteout {
            return Ok((
                make(MakeAt {
                    dir: dir.fd(),
                    name,
                })?,
                false,
            ));
        }
        let temp = copyup::temp_name();
        let made = make(MakeAt {
            dir: dir.fd(),
            name: &temp,
        })?;
        if let Err(e) = self.replace_whiteout(dir.fd(), &temp, name) {
            let st = sys::fstatat(dir.fd(), &temp);
            let flags = if st.is_ok_and(|st| is_dir(&st)) {
                libc::AT_REMOVEDIR
            } else {
                0
            };
            if let Err(u) = sys::unlinkat(dir.fd(), &temp, flags) {
                tracing::warn!("union: a failed create's temporary stays (fsck removes it): {u}");
            }
            return Err(e);
        }
        Ok((made, true))
    }

    /// Puts object `temp` of `dir` where whiteout `name` is, in one step.
    fn replace_whiteout(&self, dir: BorrowedFd<'_>, temp: &CStr, name: &CStr) -> Result<()> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        if !is_dir(&sys::fstatat(dir, temp)?) {
            // rename replaces the whiteout (a non-directory) atomically.
            return Ok(sys::renameat2(dir, temp, dir, name, 0)?);
        }
        // What the whiteout hid must stay hidden below the new directory.
        let fd = sys::open_path(dir, temp)?;
        format::set_opaque(fd.as_fd(), u.ns)?;
        match sys::renameat2(dir, temp, dir, name, libc::RENAME_EXCHANGE) {
            Ok(()) => {
                if let Err(e) = sys::unlinkat(dir, temp, 0) {
                    tracing::warn!("union: a replaced whiteout stays (fsck removes it): {e}");
                }
                Ok(())
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                // No exchange here: the whiteout goes, then the directory
                // comes, and the whiteout is put back if that fails.
                sys::unlinkat(dir, name, 0)?;
                if let Err(e) = sys::renameat2(dir, temp, dir, name, libc::RENAME_NOREPLACE) {
                    if let Err(w) = format::make_whiteout(dir, name) {
                        tracing::error!("a failed create could not put its whiteout back: {w}");
                    }
                    return Err(e.into());
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Where [`Vfs::create_over_whiteout`]'s `make` makes the object.
pub(super) struct MakeAt<'a> {
    pub dir: BorrowedFd<'a>,
    pub name: &'a CStr,
}

/// The upper branch, where a whiteout hiding a copy in `branch` goes;
/// EROFS when there is none, or it is below `branch` (a mode change put it
/// there): a whiteout hides only what is below it.
pub(super) fn hidable(u: &Union, branch: BranchId) -> Result<BranchId> {
    match u.upper() {
        Some(upper) if u.rank(upper) <= u.rank(branch) => Ok(upper),
        _ => Err(errno(libc::EROFS)),
    }
}

/// One copy of a name being removed: the directory copy holding it, and
/// what it is there.
struct Holder {
    dir: Layer,
    st: Stat,
}

impl Vfs {
    /// Removes `name` from union directory `parent` as the delete policy
    /// says. rmdir refuses a directory whose merged listing is not empty.
    /// Returns the attributes of the object the user saw.
    /// A snapmerge's fold may move or remove the copies it uses meanwhile:
    /// then it starts over with `parent` found again (the removal the user
    /// sees is its last step).
    pub(super) fn union_remove(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        flags: i32,
    ) -> Result<Option<Stat>> {
        self.again_after_fold_of(&[parent], || {
            self.union_remove_once(caller, parent, name, flags)
        })
    }

    fn union_remove_once(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        flags: i32,
    ) -> Result<Option<Stat>> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let cname = sys::cstr(name)?;
        let dir = self.node(parent)?;
        let found = self.walk(&dir, &cname)?.ok_or(errno(libc::ENOENT))?;
        let visible = found.top.2;
        let rmdir = flags & libc::AT_REMOVEDIR != 0;
        match (rmdir, is_dir(&visible)) {
            (true, false) => return Err(errno(libc::ENOTDIR)),
            (false, true) => return Err(errno(libc::EISDIR)),
            _ => {}
        }
        if rmdir {
            self.check_merged_empty(&found, &cname)?;
        }
        if found.top.0 != u.upper().unwrap_or(found.top.0) {
            refuse_protected(found.top.1.as_fd(), &cname, &visible)?;
        }
        match u.opts.delete {
            DeletePolicy::Whiteout => {
                self.remove_from_top(caller, (parent, &cname), &found, flags)?
            }
            DeletePolicy::All => {
                self.remove_everywhere(caller, (parent, &dir), &cname, &found, flags)?
            }
        }
        Ok(Some(visible))
    }

    /// `delete=whiteout`: the name goes from the top read-write branch
    /// only; a whiteout there hides the copies below.
    /// `found`: the lookup of the name just made.
    fn remove_from_top(
        &self,
        caller: &Caller,
        (parent, cname): (InodeNo, &CStr),
        found: &Found,
        flags: i32,
    ) -> Result<()> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let upper = hidable(u, found.top.0)?;
        let dir = self.writable_dir(caller, parent)?;
        let below = self.visible_below(&dir, cname, upper)?;
        // Found in the upper branch: the lookup has just stated that copy
        // (a one-branch union's every remove).
        let in_upper = match found.top {
            (branch, _, st) if branch == upper => Some(st),
            _ => match sys::fstatat(dir.fd(), cname) {
                Ok(st) => Some(st),
                Err(e) if is_absent(&e) => None,
                Err(e) => return Err(e.into()),
            },
        };
        match (&in_upper, below) {
            (Some(st), true) => {
                self.inodes.pin_if_known(&self.inodes.key_in(upper, st))?;
                if flags & libc::AT_REMOVEDIR != 0 {
                    // Orphans first, as the caller: the swap below would
                    // clear them as the daemon. The whiteouts stay until
                    // the swap: lower entries must not show meanwhile.
                    let sub = sys::openat(dir.fd(), cname, OPEN_DIR, 0)?;
                    self.clear_orphans_of(sub.as_fd(), Some(caller))?;
                }
                // One step: the name never shows the lower copy meanwhile.
                // (The kernel has checked the caller may delete it.)
                format::replace_with_whiteout(dir.fd(), cname)?;
            }
            (Some(st), false) => {
                self.inodes.pin_if_known(&self.inodes.key_in(upper, st))?;
                if flags & libc::AT_REMOVEDIR != 0 {
                    self.clear_whiteouts_in(dir.fd(), cname, Some(caller))?;
                }
                creds::as_caller(caller, || sys::unlinkat(dir.fd(), cname, flags))?;
            }
            (None, true) => format::make_whiteout(dir.fd(), cname)?,
            (None, false) => {}
        }
        Ok(())
    }

    /// `delete=all`: the name goes from every read-write branch holding
    /// it; a whiteout in the top read-write branch only where a copy must
    /// stay (read-only, of another kind, or a directory still holding
    /// hidden entries).
    /// With a whiteout it comes first, hiding every copy in one step, and
    /// the read-write copies go after it; without one the hidden copies go
    /// bottom-up and the visible one last. Either way the user sees the
    /// name vanish in one step, and a failure before it changes nothing.
    /// `found`: the lookup of the name just made.
    fn remove_everywhere(
        &self,
        caller: &Caller,
        (parent, dir): (InodeNo, &Node),
        cname: &CStr,
        found: &Found,
        flags: i32,
    ) -> Result<()> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let rmdir = flags & libc::AT_REMOVEDIR != 0;
        let holders = self.holders(dir, cname, found)?;
        let visible = holders.first().ok_or(errno(libc::ENOENT))?;
        if !u.writable(visible.dir.branch) {
            hidable(u, visible.dir.branch)?;
        }
        self.inodes
            .pin_if_known(&self.inodes.key_in(visible.dir.branch, &visible.st))?;
        let mut removable = Vec::with_capacity(holders.len());
        for h in &holders {
            removable.push(
                u.writable(h.dir.branch)
                    && is_dir(&h.st) == is_dir(&visible.st)
                    && (!rmdir || self.only_whiteouts(h, cname)?),
            );
        }
        if removable.iter().all(|r| *r) {
            for h in holders.iter().skip(1).rev() {
                self.remove_copy(caller, h, cname, rmdir)?;
            }
            if rmdir {
                self.clear_whiteouts_in(visible.dir.fd.as_fd(), cname, Some(caller))?;
            }
            let at = visible.dir.fd.as_fd();
            creds::as_caller(caller, || sys::unlinkat(at, cname, flags))?;
            return Ok(());
        }
        let upper = u.upper().ok_or(errno(libc::EROFS))?;
        let top = self.writable_dir(caller, parent)?;
        if rmdir && sys::fstatat(top.fd(), cname).is_ok_and(|st| is_dir(&st)) {
            // Orphans as the caller, before the swap clears them as root
            // (the whiteouts stay until the swap).
            let sub = sys::openat(top.fd(), cname, OPEN_DIR, 0)?;
            self.clear_orphans_of(sub.as_fd(), Some(caller))?;
        }
        format::replace_with_whiteout(top.fd(), cname)?;
        let hidden = holders
            .iter()
            .zip(removable)
            .filter(|(h, r)| *r && h.dir.branch != upper);
        for (h, _) in hidden {
            if let Err(e) = self.remove_copy(caller, h, cname, rmdir) {
                // Hidden by the whiteout: harmless, and the removal the
                // user asked for has happened.
                tracing::warn!("a hidden copy of a removed name stays: {e}");
            }
        }
        Ok(())
    }

    /// Every copy of `name` in `dir`'s layers that the user would see if
    /// the ones above it went, top-down, down to a whiteout.
    /// `found`: the lookup of `name` just made, which has stated the top
    /// copy already (all of them, in a directory with one copy).
    fn holders(&self, dir: &Node, name: &CStr, found: &Found) -> Result<Vec<Holder>> {
        let mut layers = self.layers_of(dir)?;
        if layers.len() == 1 && layers[0].branch == found.top.0 {
            let only = layers.remove(0);
            return Ok(vec![Holder {
                dir: only,
                st: found.top.2,
            }]);
        }
        let ns = self.union().ok_or(VfsError::WrongKind)?.ns;
        let mut out: Vec<Holder> = Vec::new();
        for l in layers {
            let st = match sys::fstatat(l.fd.as_fd(), name) {
                Ok(st) => st,
                Err(e) if is_absent(&e) => continue,
                Err(e) => return Err(e.into()),
            };
            if format::is_whiteout_in(l.fd.as_fd(), name, &st, ns)? {
                break;
            }
            out.push(Holder { dir: l, st });
        }
        Ok(out)
    }

    /// Whether directory copy `h` of `name` holds nothing but whiteouts.
    fn only_whiteouts(&self, h: &Holder, name: &CStr) -> Result<bool> {
        let u = self.union().ok_or(VfsError::WrongKind)?;
        let fd = sys::open_path(h.dir.fd.as_fd(), name)?;
        let listing = merge::read_layer(fd.as_fd(), u.ns)?;
        Ok(listing
            .entries
            .iter()
            .all(|e| e.whiteout || format::is_orphan(&e.name)))
    }

    /// Removes one copy the user does not see (as the daemon: the kernel
    /// checked the caller against the visible one; a crash's orphans in
    /// it go as the caller).
    fn remove_copy(&self, caller: &Caller, h: &Holder, name: &CStr, rmdir: bool) -> Result<()> {
        let flags = if rmdir {
            self.clear_whiteouts_in(h.dir.fd.as_fd(), name, Some(caller))?;
            libc::AT_REMOVEDIR
        } else {
            0
        };
        Ok(sys::unlinkat(h.dir.fd.as_fd(), name, flags)?)
    }

    /// rename in the upper branch; with `whiteout`, the old name is left
    /// a whiteout in the same step (RENAME_WHITEOUT, run by the daemon:
    /// it needs CAP_MKNOD, and the kernel has checked the caller), so the
    /// lower copy never shows there. Where the file system lacks it: the
    /// rename, then a whiteout, and the rename undone if that fails.
    pub(super) fn rename_hiding_old(
        &self,
        caller: &Caller,
        (olddir, old): (&Node, &CStr),
        (newdir, new): (&Node, &CStr),
        flags: u32,
        whiteout: bool,
    ) -> Result<()> {
        let rename = |f: u32| sys::renameat2(olddir.fd(), old, newdir.fd(), new, f);
        if !whiteout {
            return Ok(creds::as_caller(caller, || rename(flags))?);
        }
        match rename(flags | libc::RENAME_WHITEOUT) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {}
            r => return Ok(r?),
        }
        creds::as_caller(caller, || rename(flags))?;
        if let Err(e) = format::make_whiteout(olddir.fd(), old) {
            let back = sys::renameat2(newdir.fd(), new, olddir.fd(), old, libc::RENAME_NOREPLACE);
            if let Err(b) = back {
                tracing::error!("a rename whose whiteout failed could not be undone: {b}");
            }
            return Err(e.into());
        }
        Ok(())
    }
}

/// One branch's usage, for `chronofs status`.
pub struct BranchUsage {
    pub writable: bool,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// Where a create in a directory every branch holds would go now.
    pub creates: bool,
}

impl Vfs {
    /// A union's options and its branches' usage (statvfs of each root,
    /// top first); `None` outside a union.
    pub fn union_usage(&self) -> Option<(UnionOptions, Vec<BranchUsage>)> {
        let u = self.union()?;
        let mut out: Vec<BranchUsage> = u
            .roots()
            .into_iter()
            .zip(u.modes())
            .map(|((_, root), (_, writable))| {
                let fs = sys::fstatvfs(root.as_fd()).ok();
                let frsize = fs.as_ref().map_or(0, |f| f.f_frsize);
                let blocks = |n: fn(&sys::StatFs) -> u64| {
                    fs.as_ref().map_or(0, |f| n(f).saturating_mul(frsize))
                };
                BranchUsage {
                    writable,
                    size_bytes: blocks(|f| f.f_blocks),
                    used_bytes: blocks(|f| f.f_blocks.saturating_sub(f.f_bfree)),
                    free_bytes: blocks(|f| f.f_bavail),
                    creates: false,
                }
            })
            .collect();
        let target = match u.opts.create {
            CreatePolicy::Mfs => out
                .iter()
                .enumerate()
                .filter(|(_, b)| b.writable)
                .max_by_key(|(i, b)| (b.free_bytes, std::cmp::Reverse(*i)))
                .map(|(i, _)| i),
            CreatePolicy::Top | CreatePolicy::ExistingPath => u.upper().map(|b| u.rank(b) as usize),
        };
        if let Some(b) = target.and_then(|i| out.get_mut(i)) {
            b.creates = true;
        }
        Some((u.opts, out))
    }
}

/// EPERM for a lower object made append-only or immutable (`chattr +a`,
/// `+i`), which a native file system refuses to remove: a whiteout would
/// remove it from the union all the same. (A copy-up carries the flags,
/// so the upper copy's own removal and renames are refused by the kernel.)
pub(super) fn refuse_protected(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &CStr,
    st: &Stat,
) -> Result<()> {
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFREG && kind != libc::S_IFDIR {
        return Ok(());
    }
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = sys::openat(dir, name, flags, 0)?;
    if sys::carried_inode_flags(fd.as_fd())? & sys::PROTECTING_INODE_FLAGS != 0 {
        return Err(errno(libc::EPERM));
    }
    Ok(())
}

/// Flags to list a directory of a branch (never through a symlink).
const OPEN_DIR: i32 = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
