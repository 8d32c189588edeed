//! Hard links of a union's lower branches keep one identity across
//! copy-up: the vfs half of `union::index` (docs/ARCHITECTURE.md "Union
//! mounts"). A non-directory with several names below (a regular file,
//! a symlink, a device, a FIFO or a socket) is copied up into the index
//! and its names resolve there; the inode keeps its number, every name
//! shows the copied-up object, and st_nlink counts the names a user can
//! reach.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::inodes::{Inode, Node};
use super::union::Union;
use super::{errno, InodeNo, Result, Stat, Vfs};
use crate::branch::BranchId;
use crate::store::BackingKey;
use crate::sys;
use crate::union::format::XattrNs;
use crate::union::{copyup, index};

/// Whether an object of this kind can be an index entry of a union whose
/// marks are in `ns`: any non-directory when they are `trusted.`
/// (the entry's xattrs go on symlinks and devices as well), only regular
/// files under `user.`, which Linux refuses on other kinds.
pub(super) fn indexable(st: &Stat, ns: XattrNs) -> bool {
    indexable_kind(st.st_mode, ns)
}

/// [`indexable`] for an object of mode `mode`.
pub(super) fn indexable_kind(mode: u32, ns: XattrNs) -> bool {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => false,
        libc::S_IFREG => true,
        _ => ns == XattrNs::Trusted,
    }
}

/// A lower object whose copy-up must go through the index: an indexable
/// one with more than one name.
pub(super) fn is_linked(st: &Stat, ns: XattrNs) -> bool {
    indexable(st, ns) && st.st_nlink > 1
}

/// An index entry a lookup lands on: (its branch, the index, the entry's
/// name, its stat).
pub(super) type Indexed = (BranchId, Arc<OwnedFd>, CString, Stat);

impl Union {
    /// The name of the entry for the object keyed `key` in branch `b`'s
    /// index, as the union that wrote the index names it; `None`: it
    /// cannot hold one.
    pub(super) fn entry_name_in(&self, b: BranchId, key: &BackingKey) -> Option<CString> {
        let set = self.set();
        let named = match set.member(b) {
            Some(m) => m.named_id(BranchId(key.branch))?,
            None => key.branch,
        };
        Some(index::entry_name(named, key.dev, key.ino))
    }
}

impl Vfs {
    /// The branches `ids` lists (by this union's id) hold indexes another
    /// union wrote, whose entries name each branch by the id `ids` pairs
    /// with it: a sandbox's union over its mount's branches, whose own
    /// ids are its store's. A lookup there looked for names with the
    /// sandbox's ids, found none of the mount's copies, and a change
    /// through another name made a second copy. Call before serving.
    pub fn indexes_written_with(&self, ids: &[(u32, u32)]) {
        let Some(u) = self.union() else {
            return;
        };
        let names: std::collections::HashMap<u32, u32> = ids.iter().copied().collect();
        let set = u.set();
        for (ours, _) in ids {
            if let Some(m) = set.member(BranchId(*ours)) {
                m.set_names(names.clone());
            }
        }
        u.note_holds_own();
    }
}

impl Vfs {
    /// Where a lookup that found `st` (in `branch`) lands instead: the
    /// index entry of a linked lower file one of whose names was copied
    /// up, as (its branch, directory, name, stat). The copy may be in any
    /// read-write branch above, not only the upper one: a branch inserted
    /// above or a mode change moves the upper branch, not the copies.
    pub(super) fn indexed_instead(
        &self,
        u: &Union,
        branch: BranchId,
        st: &Stat,
    ) -> Result<Option<Indexed>> {
        let own = || indexable(st, u.ns) && u.holds_own(branch);
        if !is_linked(st, u.ns) && !own() {
            return Ok(None);
        }
        // An entry may itself have been copied up into a branch added
        // above its own (a rename needs the upper branch): the newest copy
        // is at the end of the chain. Each step goes up, so it ends.
        // (A merged branch's own index may hold the entry of one of its
        // files; each step goes to another file, at most one per branch.)
        let mut found: Option<Indexed> = None;
        let mut at = (branch, *st);
        for _ in 0..u.set().members.len() {
            let Some(hit) = self.entry_over(u, at)? else {
                break;
            };
            if (hit.3.st_dev, hit.3.st_ino) == (at.1.st_dev, at.1.st_ino) {
                break;
            }
            at = (hit.0, hit.3);
            found = Some(hit);
        }
        Ok(found)
    }

    /// The index entry of `st` (found in `branch`) in the branches over it
    /// and its own, the highest first.
    fn entry_over(&self, u: &Union, (branch, st): (BranchId, Stat)) -> Result<Option<Indexed>> {
        let key = self.inodes.key_in(branch, &st);
        for (b, index) in u.indexes_over(branch) {
            // Each index names the object as the union that wrote it does.
            let Some(name) = u.entry_name_in(b, &key) else {
                continue;
            };
            match sys::fstatat(index.as_fd(), &name) {
                Ok(found) => return Ok(Some((b, index, name, found))),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// After an upper object was acquired: if it is an index entry's file,
    /// the inode shows the union's link count from now on.
    /// `via_index`: the lookup came through the index (the entry alone
    /// may hold the copy: no upper name links to it).
    pub(super) fn note_if_indexed(
        &self,
        u: &Union,
        inode: &Inode,
        (fd, st): (BorrowedFd<'_>, &Stat),
        via_index: bool,
    ) {
        if inode.union_nlink().is_some() || (!via_index && !is_linked(st, u.ns)) {
            return;
        }
        if u.index_of(self.inodes.branch_of(&inode.key)).is_none() {
            return;
        }
        match index::nlink(fd, u.ns) {
            Ok(Some(n)) => inode.set_union_nlink(n.max(1)),
            // Found by its own key, it never becomes an index's file: a
            // copy-up that indexes it goes under another key.
            Ok(None) if !via_index => inode.set_unindexed(),
            Ok(None) => {}
            Err(e) => tracing::debug!("union: link count of inode {} unread: {e}", inode.ino.0),
        }
    }

    /// Copy-up of `node`, a linked lower object named `name` in the
    /// directory `lower_parent` gives: its copy becomes the index entry (or
    /// is one already, made through another name), then `name` in
    /// `upper_parent` links to it. An entry of a lower branch's index is
    /// copied from the index, and `lower_parent` is not asked: the name's
    /// directory may have no copy in the entry's branch.
    pub(super) fn copy_up_linked(
        &self,
        u: &Union,
        node: &Node,
        (lower_parent, name): (&dyn Fn() -> Result<Arc<OwnedFd>>, &CStr),
        upper_parent: &Node,
        owner: &copyup::Owner,
    ) -> Result<(OwnedFd, Stat)> {
        let index = u.index_or_make()?;
        let upper = u.upper().ok_or(errno(libc::EROFS))?;
        let entry = u
            .entry_name_in(upper, &node.key)
            .ok_or(errno(libc::EROFS))?;
        let own = self.own_index_entry(u, node)?;
        let lower_dir;
        let (from, lower_links) = match &own {
            Some((dir, own, links)) => ((dir.as_fd(), own.as_c_str()), *links),
            None => {
                lower_dir = lower_parent()?;
                let links = sys::fstat(node.fd())?.st_nlink as u32;
                ((lower_dir.as_fd(), name), links)
            }
        };
        // The entry is whole (its marks, its number) before it has its
        // name: a crash or a lookup of another name in between finds it so.
        let whole_first = |fd: BorrowedFd<'_>, st: &Stat| -> std::io::Result<()> {
            index::set_entry(fd, u.ns, &entry)?;
            index::set_nlink(fd, u.ns, lower_links)?;
            self.inodes.bind_copy(upper, st, node.ino);
            Ok(())
        };
        let copied =
            copyup::copy_up_file_as(from.0, from.1, (index.as_fd(), &entry), owner, &whole_first);
        let fd = match copied {
            Ok(fd) => fd,
            Err(e) if e.errno() == libc::EEXIST => sys::open_path(index.as_fd(), &entry)?,
            Err(e) => return Err(e.into()),
        };
        // The name the inode was last reached by may have been removed
        // since (a whiteout holds it now): the copy is then reached through
        // the index alone, as every other lower name is.
        match sys::fstatat(upper_parent.fd(), name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                self.inodes
                    .bind_copy(upper, &sys::fstat(fd.as_fd())?, node.ino);
                copyup::link_up(fd.as_fd(), upper_parent.fd(), name)?
            }
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let st = sys::fstat(fd.as_fd())?;
        Ok((fd, st))
    }

    /// Where `node` is an entry of its own branch's index (a read-write
    /// branch below the upper one, which was the upper one when the entry
    /// was made): that index, the entry's name and the union's link count.
    /// Its copy-up copies the entry, whatever name it was reached by (the
    /// branch may hold none of them).
    fn own_index_entry(
        &self,
        u: &Union,
        node: &Node,
    ) -> Result<Option<(Arc<OwnedFd>, CString, u32)>> {
        let Some(links) = node.inode.union_nlink() else {
            return Ok(None);
        };
        let Some(index) = u.index_of(self.inodes.branch_of(&node.key)) else {
            return Ok(None);
        };
        let Some(entry) = index::entry(node.fd(), u.ns)? else {
            return Ok(None);
        };
        Ok(Some((index, entry, links)))
    }

    /// Before a name of `ino` goes: a lower file with other names is
    /// copied up through the index first (as overlayfs does), so that the
    /// union's link count has somewhere to live; the removal then takes
    /// the upper name.
    pub(super) fn index_before_unlink(&self, caller: &super::Caller, ino: InodeNo) -> Result<()> {
        let Some(u) = self.union() else {
            return Ok(());
        };
        let node = self.node(ino)?;
        if u.upper().is_none() || u.writable(self.inodes.branch_of(&node.key)) {
            return Ok(());
        }
        // An entry a snapshot froze counts there too: its count must not
        // change in the frozen branch.
        if node.inode.union_nlink().is_none() && !is_linked(&sys::fstat(node.fd())?, u.ns) {
            return Ok(());
        }
        self.writable_node(caller, ino).map(drop)
    }

    /// The link count the mount shows for `obj` (what history records,
    /// and `chronofs ls -l` shows), where a link index's entry makes the
    /// backing file's one more; `None`: the backing file's is right, or
    /// unknown. `fd`: the backing file, read if the kernel never looked
    /// the object up.
    pub fn shown_links(
        &self,
        obj: crate::history::ObjectId,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Option<u32> {
        let union = self.union().is_some();
        if !union && !self.clones_on() {
            return None;
        }
        let Ok(inode) = self.inodes.get(InodeNo::from(obj)) else {
            let n = index::nlink(fd?, self.clone_ns()).ok().flatten()?;
            return Some(n.max(1));
        };
        self.indexed_links(&inode, union)
    }

    /// The count a file in a link index shows: cached, or read once from
    /// a clone's index (a file found in none is remembered as such).
    fn indexed_links(&self, inode: &Arc<Inode>, union: bool) -> Option<u32> {
        if let Some(n) = inode.union_nlink() {
            return Some(n);
        }
        if union || inode.known_unindexed() {
            return None;
        }
        let n = self.clone_links(inode);
        if n.is_none() {
            inode.set_unindexed();
        }
        n
    }

    /// The attributes to show for `ino`: the union's link count for an
    /// indexed file; 1 for a merged directory (copies in several branches:
    /// its subdirectories are not counted anywhere, and the top copy's
    /// count would undercount them, so find(1) could skip some; 1 says
    /// "unknown", as overlayfs shows it).
    /// A clone's file with several names (`clone.rs`) shows its count the
    /// same way.
    pub(super) fn shown(&self, ino: InodeNo, mut st: Stat) -> Stat {
        let union = self.union().is_some();
        if !union && !self.clones_on() {
            return st;
        }
        let Ok(inode) = self.inodes.get(ino) else {
            return st;
        };
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if union && inode.has_layers() {
                st.st_nlink = 1;
            }
        } else if inode.union_nlink().is_some() || is_linked(&st, self.clone_ns()) {
            if let Some(n) = self.indexed_links(&inode, union) {
                st.st_nlink = n.into();
            }
        }
        self.show_base_blocks(&inode, &mut st);
        self.show_kept_ctime(ino, &mut st);
        st
    }

    /// A clone's file a read gave its base's blocks shows the ctime it
    /// had before, until something changes it (`Clones::kept_ctime`).
    fn show_kept_ctime(&self, ino: InodeNo, st: &mut Stat) {
        if !self.clones_on() || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return;
        }
        let mut kept = self.clones.kept_ctime.lock();
        let Some(&(after, before)) = kept.get(&ino) else {
            return;
        };
        if (st.st_ctime, st.st_ctime_nsec) == after {
            (st.st_ctime, st.st_ctime_nsec) = before;
        } else {
            kept.remove(&ino);
        }
    }

    /// A clone's file that reads its base's bytes has a backing file of
    /// holes (all of it, or all but its own blocks): its blocks are its
    /// own and those of the base's data it shows, as a reflink copy's
    /// would be. With the backing file's count alone, `tar -S` took a file
    /// with no blocks for all holes and archived zeros, and `du` showed
    /// none; with a whole file's, `cp` made a copy of a sparse base dense.
    /// A file under `LAYOUT_MIN` bytes shows a whole file's, as before.
    fn show_base_blocks(&self, inode: &Arc<Inode>, st: &mut Stat) {
        let size = st.st_size.max(0) as u64;
        let whole = size.div_ceil(512) as i64;
        if !self.clones_on()
            || st.st_mode & libc::S_IFMT != libc::S_IFREG
            || st.st_blocks >= whole
            || inode.known_unmarked()
        {
            return;
        }
        let Ok(node) = self.inodes.node_of(inode.clone()) else {
            return;
        };
        match self.mark_of(&node) {
            Ok(Some(mark)) if !mark.dir && size < super::views::LAYOUT_MIN => st.st_blocks = whole,
            Ok(Some(mark)) if !mark.dir => {
                st.st_blocks = match self.base_blocks(inode.ino, &mark, size) {
                    Ok(base) => st.st_blocks + base,
                    Err(e) => {
                        tracing::debug!("clone: base blocks of inode {}: {e}", inode.ino.0);
                        whole
                    }
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!("clone: mark of inode {} unread: {e}", inode.ino.0),
        }
    }

    /// The link count a clone's linked copy shows, read from its index
    /// xattr (then kept on the inode).
    fn clone_links(&self, inode: &Arc<Inode>) -> Option<u32> {
        let node = self.inodes.node_of(inode.clone()).ok()?;
        match index::nlink(node.fd(), self.clone_ns()) {
            Ok(Some(n)) => {
                let n = n.max(1);
                inode.set_union_nlink(n);
                Some(n)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::debug!("clone: link count of inode {} unread: {e}", inode.ino.0);
                None
            }
        }
    }

    /// The link index that holds `node`'s entry: its branch's (a union),
    /// or the mount's root's (a clone's linked copy).
    fn link_index_of(&self, node: &Node) -> Result<Option<Arc<OwnedFd>>> {
        match self.union() {
            Some(u) => Ok(u.index_of(self.inodes.branch_of(&node.key))),
            None => Ok(index::open_existing(self.branch.root_fd())?.map(Arc::new)),
        }
    }

    /// After a name of `ino` was added (+1) or removed (-1): an indexed
    /// file's link count follows. Its last name gone, the index entry
    /// goes too.
    pub(super) fn links_changed(&self, ino: InodeNo, delta: i32) -> Result<()> {
        let Ok(inode) = self.inodes.get(ino) else {
            return Ok(());
        };
        let Some(n) = inode.union_nlink() else {
            return Ok(());
        };
        let n = n.saturating_add_signed(delta);
        let node = self.inodes.node_of(inode.clone())?;
        if n == 0 {
            self.drop_index_entry(&node)?;
            return Ok(());
        }
        index::set_nlink(node.fd(), self.clone_ns(), n)?;
        inode.set_union_nlink(n);
        Ok(())
    }

    /// The file has no name left in the union: its index entry would keep
    /// it (and a stale count) alive.
    fn drop_index_entry(&self, node: &Node) -> Result<()> {
        let Some(index) = self.link_index_of(node)? else {
            return Ok(());
        };
        let Some(entry) = index::entry(node.fd(), self.clone_ns())? else {
            return Ok(());
        };
        match sys::unlinkat(index.as_fd(), &entry, 0) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
        // Open descriptors may still stat it: one name fewer than before.
        node.set_union_nlink(0);
        if let Some((branch, dev, ino)) = index::key_of_entry(&entry) {
            self.inodes.retire(&BackingKey { branch, dev, ino })?;
        }
        Ok(())
    }
}

/// An index entry named after an object of a branch a snapmerge folds
/// away, and its name after the same object in the branch it lands in.
struct Renamed {
    index: Arc<OwnedFd>,
    /// The root of the branch holding `index` (synced before the swap).
    root: Arc<OwnedFd>,
    old: CString,
    new: CString,
}

impl Vfs {
    /// Before branch `from` is folded into `to`: every index entry named
    /// after one of `from`'s objects (a copy made over it after a
    /// snapshot) is given a second name, after the key the object has in
    /// `to`, where it keeps its inode. Lookups reach the entry by either
    /// key, during the fold and after it: the entry named only after
    /// `from` was found by no name once the object had moved, and every
    /// name showed the older copy below. Refused before anything changes
    /// where the second name stands for another file already.
    pub(super) fn name_entries_for_fold(
        &self,
        u: &Union,
        moves: (BranchId, BranchId),
    ) -> Result<()> {
        let renamed = self.entries_named_after(u, moves)?;
        for r in &renamed {
            if self.twin_of(r)? == Some(false) {
                return Err(super::VfsError::BranchBusy(format!(
                    "hard-link index entries {} and {} stand for one file with two copies \
                     (`chronofs fsck` the branch list); nothing was merged",
                    r.old.to_string_lossy(),
                    r.new.to_string_lossy()
                )));
            }
        }
        renamed.iter().try_for_each(|r| self.link_twin(u, r))
    }

    /// Once the fold is done, the names after `from`'s keys go (a name
    /// made meanwhile, by a copy-up during the fold, is given its twin
    /// first); returns the roots of the branches whose index changed.
    pub(super) fn drop_folded_entry_names(
        &self,
        u: &Union,
        moves: (BranchId, BranchId),
    ) -> Result<Vec<Arc<OwnedFd>>> {
        let mut roots = Vec::new();
        for r in self.entries_named_after(u, moves)? {
            match self.twin_of(&r)? {
                Some(false) => {
                    tracing::warn!(
                        "snapmerge: index entries {} and {} are two copies of one file; both kept",
                        r.old.to_string_lossy(),
                        r.new.to_string_lossy()
                    );
                    continue;
                }
                Some(true) => {}
                None => self.link_twin(u, &r)?,
            }
            // The entry names itself by its new name now (`link_twin`).
            match sys::unlinkat(r.index.as_fd(), &r.old, 0) {
                Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e.into()),
                _ => roots.push(r.root),
            }
        }
        Ok(roots)
    }

    /// The entries of every member's index named after an object of
    /// `from`, with their names after the same object in `to`.
    fn entries_named_after(
        &self,
        u: &Union,
        (from, to): (BranchId, BranchId),
    ) -> Result<Vec<Renamed>> {
        let mut out = Vec::new();
        for m in u.set().members.iter() {
            let Some(index) = m.index() else {
                continue;
            };
            // A folded branch's index is removed once emptied (reading a
            // removed directory fails with ENOENT).
            let listed = sys::reopen_dir(index.as_fd(), libc::O_RDONLY)
                .and_then(|dir| crate::union::format::entries(dir.as_fd()));
            let entries = match listed {
                Ok(entries) => entries,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            for e in entries {
                let Ok(old) = CString::new(e.name) else {
                    continue;
                };
                if let Some(new) = self.entry_moved_to(&old, (from, to)) {
                    let (index, root) = (index.clone(), m.root.clone());
                    out.push(Renamed {
                        index,
                        root,
                        old,
                        new,
                    });
                }
            }
        }
        Ok(out)
    }

    /// `entry`'s name after the same object in branch `to`, where it names
    /// an object of `from` (both on one file system: the device number
    /// goes through each branch's key device).
    fn entry_moved_to(&self, entry: &CStr, (from, to): (BranchId, BranchId)) -> Option<CString> {
        let (branch, dev, ino) = index::key_of_entry(entry)?;
        if branch != from.0 {
            return None;
        }
        let live = self.inodes.key_dev(from, dev);
        Some(index::entry_name(to.0, self.inodes.key_dev(to, live), ino))
    }

    /// Whether `r`'s new name exists: `Some(true)` as the same file,
    /// `Some(false)` as another one.
    fn twin_of(&self, r: &Renamed) -> Result<Option<bool>> {
        let new = match sys::fstatat(r.index.as_fd(), &r.new) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let old = sys::fstatat(r.index.as_fd(), &r.old)?;
        Ok(Some((old.st_dev, old.st_ino) == (new.st_dev, new.st_ino)))
    }

    /// Links `r`'s new name to its entry, then has the entry name itself
    /// by it (its removal with the last name unlinks that one).
    fn link_twin(&self, u: &Union, r: &Renamed) -> Result<()> {
        match sys::linkat(r.index.as_fd(), &r.old, r.index.as_fd(), &r.new) {
            Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e.into()),
            _ => {}
        }
        let fd = sys::open_path(r.index.as_fd(), &r.new)?;
        if index::entry(fd.as_fd(), u.ns)?.as_deref() == Some(r.old.as_c_str()) {
            index::set_entry(fd.as_fd(), u.ns, &r.new)?;
        }
        Ok(())
    }
}
