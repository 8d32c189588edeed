//! Filling a clone's directory (docs/ARCHITECTURE.md "Clones", *Fill on
//! first use*): its base's entries copied in as marked objects
//! (metadata only), recorded in history as of the clone's instant.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::clone::{keep_times, Mark};
use super::inodes::Node;
use super::{errno, Result, Vfs};
use crate::history::access::READ;
use crate::history::past::{Error as PastError, Node as PastNode};
use crate::history::{Binding, Content, Seq};
use crate::sys::{self, Stat};
use crate::union::copyup::{drop_inherited_acls_with, is_copyup_temp, temp_name};
use crate::union::format::{is_chronofs_xattr, is_overlay_xattr, XattrNs};

impl Vfs {
    /// Fills the unfilled directory `dir` with copies of its base's
    /// entries, each made under its own name. Nothing sees them before
    /// the fill ends (every use of the directory fills it first), so a
    /// crash may leave an entry half made: the next fill completes each
    /// entry it finds (`complete_entry`) and removes hidden leftovers
    /// (the copies of linked files are made under a hidden name). The
    /// mark goes only once the entries are durable and recorded.
    pub(super) fn fill(&self, dir: &Node, mark: &Mark) -> Result<()> {
        // Filling is not a change the user made: the times stay the base's.
        let times = sys::fstat(dir.fd())?;
        self.fill_live_base(mark)?;
        let children = self.with_past(|p| {
            let Some(base) = p
                .resolve(&mark.path, mark.at)
                .map_err(super::views::past_err)?
            else {
                // Never silently empty: the clone would lose its entries.
                tracing::error!(
                    "a clone's base {} at #{} is not in history",
                    crate::history::past::show_path(&mark.path),
                    mark.at
                );
                return Err(errno(libc::EIO));
            };
            let names = p
                .names(&base, mark.at, mark.path.is_empty())
                .map_err(super::views::past_err)?;
            let mut out = Vec::with_capacity(names.len());
            let maker = mark.maker();
            for name in names {
                let mut path = mark.path.clone();
                path.push(name.clone());
                let Some(node) = p.resolve(&path, mark.at).map_err(super::views::past_err)? else {
                    continue;
                };
                // Its maker's clone holds what they may read of the past:
                // an entry closed to them since (or then) stays out.
                if let Some(who) = &maker {
                    match p.check(who, &path, mark.at, &node, READ) {
                        Ok(()) => {}
                        Err(PastError::Denied(why)) => {
                            tracing::debug!("clone by uid {}: left out: {why}", mark.by);
                            continue;
                        }
                        Err(e) => return Err(super::views::past_err(e)),
                    }
                }
                out.push((name, node));
            }
            Ok(out)
        })?;
        let rd = sys::reopen_dir(dir.fd(), libc::O_RDONLY)?;
        let found = drop_leftovers(dir.fd(), rd.as_fd())?;
        let inherits = Inherits::of(rd.as_fd())?;
        let mut made = Vec::with_capacity(children.len());
        let mut index = None;
        for (name, base) in children {
            let cname = CString::new(name.clone()).map_err(|_| errno(libc::EINVAL))?;
            let mark = mark.child(&name, false);
            let linked = self.linked_copy(&mark, &base)?;
            match (linked, found.contains(&name)) {
                // A linked name is made by link(2): whole once there. (Its
                // base's link count may have changed since the fill a
                // crash cut short made it as a file of its own.)
                (Some(link), true) => {
                    if !self.links_to_index(dir, &cname, &link.0, &mut index)? {
                        self.complete_entry(dir.fd(), &cname, &base, mark)?;
                    }
                }
                (Some(link), false) => {
                    let to = (dir, cname.as_c_str());
                    self.copy_linked_entry(to, &base, mark, &link, &mut index)?;
                }
                // Made, perhaps in part, by a fill a crash interrupted.
                (None, true) => self.complete_entry(dir.fd(), &cname, &base, mark)?,
                (None, false) => self.make_entry(dir.fd(), &cname, &base, mark, inherits)?,
            }
            made.push((name, cname));
        }
        sys::fsync(rd.as_fd(), false)?;
        self.record_fill(dir, mark.at, &made)?;
        sys::removexattr_fd(dir.fd(), self.clone_ns().clone_mark())?;
        dir.inode.set_unmarked();
        keep_times(dir.fd(), &times)?;
        if let Some(c) = self.capture() {
            c.dir_verified(dir.ino.object(), &sys::fstat(dir.fd())?);
        }
        // Its link count and times may be cached from before.
        self.attrs_changed(dir.ino);
        Ok(())
    }

    /// A clone of a clone: where `mark`'s base is a live directory of
    /// another clone not filled yet, that one is filled first, or its
    /// (empty) listing would be taken for its base's. (The caller holds
    /// `Clones::busy`; each step goes to an earlier clone, so it ends.)
    fn fill_live_base(&self, mark: &Mark) -> Result<()> {
        let base = self.with_past(|p| {
            p.resolve(&mark.path, mark.at)
                .map_err(super::views::past_err)
        })?;
        let Some(PastNode::Live { fd, st, .. }) = base else {
            return Ok(());
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Ok(());
        }
        let Some(base_mark) = self.read_mark(fd.as_fd())?.filter(|m| m.dir) else {
            return Ok(());
        };
        let inode = self.inodes.acquire_new(fd, &st, false)?;
        let filled = self
            .inodes
            .node_of(inode.clone())
            .and_then(|node| self.fill(&node, &base_mark));
        self.inodes.forget(inode.ino, 1);
        filled
    }

    /// History learns a fill's entries as of the clone's instant `at`.
    fn record_fill(&self, dir: &Node, at: Seq, made: &[(Vec<u8>, CString)]) -> Result<()> {
        let Some(c) = self.capture() else {
            return Ok(());
        };
        let mut entries: Vec<(Vec<u8>, Binding)> = Vec::with_capacity(made.len());
        // A union's create policy may have put the clone in any branch.
        let branch = self.inodes.branch_of(&dir.key);
        for (name, cname) in made {
            let fd = sys::open_path(dir.fd(), cname)?;
            let st = sys::fstat(fd.as_fd())?;
            let inode = self.inodes.acquire_new_in(branch, fd, &st, false)?;
            let binding = super::versioning::Live(self).binding_of(&inode);
            inode.set_name(dir.ino, name);
            self.inodes.forget(inode.ino, 1);
            entries.push((name.clone(), binding));
        }
        c.filled(dir.ino.object(), entries, at)?;
        Ok(())
    }

    /// Makes `name` in `dir` a copy of `base` (metadata only: a regular
    /// file gets its size and a mark, a directory a mark), through an
    /// open descriptor where it can (no `/proc` path walks). A failure
    /// removes what it made.
    fn make_entry(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        base: &PastNode,
        mark: Mark,
        inherits: Inherits,
    ) -> Result<()> {
        let copy = self.copy_of(base, mark)?;
        let handle = copy.make(dir, name)?;
        let done = copy.apply(&handle, self.clone_ns(), inherits);
        if done.is_err() {
            let _ = sys::unlinkat(dir, name, copy.unlink_flags());
        }
        done
    }

    /// Completes `name` in `dir`, which a fill a crash interrupted made
    /// as a copy of `base`, perhaps in part (again, all of it but the
    /// object itself: nobody has seen it, and history may know it).
    fn complete_entry(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        base: &PastNode,
        mark: Mark,
    ) -> Result<()> {
        let copy = self.copy_of(base, mark)?;
        let fd = sys::open_path(dir, name)?;
        let kind = sys::fstat(fd.as_fd())?.st_mode & libc::S_IFMT;
        if kind != copy.kind() {
            tracing::error!("a clone's half-made entry is not of its base's type");
            return Err(errno(libc::EIO));
        }
        if kind == libc::S_IFREG {
            sys::truncate_fd_path(fd.as_fd(), copy.st.st_size as u64)?;
        }
        copy.apply(&Handle::Path(fd), self.clone_ns(), Inherits::Maybe)
    }

    /// What a copy of `base` in this clone gets.
    fn copy_of(&self, base: &PastNode, mark: Mark) -> Result<Copy> {
        let (mut st, mut xattrs, target) = describe(base)?;
        xattrs.retain(|(name, _)| mark.keeps_xattr(&st, name));
        st.st_mode = mark.mode_for(&st);
        let ns = self.clone_ns();
        let union = self.union().is_some();
        // In a union the namespace's overlay markers are the union's (a
        // copied one would hide or redirect); elsewhere they are the
        // user's (a layer tree kept in the mount), but for the mount's own.
        xattrs.retain(|(name, _)| match union {
            true => !is_overlay_xattr(name, ns),
            false => !is_chronofs_xattr(name, ns),
        });
        let mark = match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => Some(Mark { dir: true, ..mark }),
            libc::S_IFREG => Some(mark),
            _ => None,
        };
        Ok(Copy {
            st,
            xattrs,
            target,
            mark,
        })
    }

    /// Where `base` is a non-directory with several names, the index entry
    /// every name of it in this clone links to (so that they stay one
    /// file), and the link count the clone shows for it: its names inside
    /// the clone's source then (all of them, where history does not know
    /// each). None in a union mount, whose index is the union's, and for
    /// a mark of format 1, which does not name its clone.
    fn linked_copy(&self, mark: &Mark, base: &PastNode) -> Result<Option<(CString, u32)>> {
        if mark.clone_id == 0 {
            return Ok(None);
        }
        let (obj, mode, nlink) = match base {
            PastNode::Hist { obj, v, .. } => (*obj, v.attrs.mode, v.attrs.nlink),
            PastNode::Live { obj, st, fd } => {
                let obj = match obj {
                    Some(o) => *o,
                    None => self.inodes.number_for(self.inodes.key_of(st))?.object(),
                };
                // A clone's linked copy shows its own count, not the
                // backing one (which counts its index entry).
                let shown = match st.st_nlink > 1 {
                    true => crate::union::index::nlink(fd.as_fd(), self.clone_ns())?,
                    false => None,
                };
                (obj, st.st_mode, shown.unwrap_or(st.st_nlink as u32))
            }
        };
        // Symlinks, devices and FIFOs too, where their index xattrs can
        // be set (`trusted.`): else each name becomes an object of its own.
        if !super::union_links::indexable_kind(mode, self.clone_ns()) || nlink < 2 {
            return Ok(None);
        }
        let source = &mark.path[..usize::from(mark.depth)];
        let within = self.with_past(|p| {
            p.history
                .names_within(obj, mark.at, source, nlink)
                .map_err(|e| super::views::past_err(e.into()))
        })?;
        // Its only name in the clone needs no index.
        if within == Some(1) {
            return Ok(None);
        }
        let entry = format!("clone{}-{:x}", mark.clone_id, obj.get());
        let entry = CString::new(entry).map_err(|_| errno(libc::EINVAL))?;
        Ok(Some((entry, within.unwrap_or(nlink).max(1))))
    }

    /// The hard-link index that takes the linked copies of a clone's
    /// directory `dir` (made if there is none): that of the branch `dir` is
    /// in (a link cannot cross branches), else the one in the mount's root.
    fn clone_link_index(&self, dir: &Node) -> Result<Arc<OwnedFd>> {
        match self.union() {
            Some(u) => u.index_or_make_in(self.inodes.branch_of(&dir.key)),
            None => Ok(Arc::new(crate::union::index::open_or_make(
                self.branch.root_fd(),
            )?)),
        }
    }

    /// Whether `name` in `dir` is a name of hard-link index entry `entry`.
    fn links_to_index(
        &self,
        dir: &Node,
        name: &CStr,
        entry: &CStr,
        index: &mut Option<Arc<OwnedFd>>,
    ) -> Result<bool> {
        let ix = match index {
            Some(fd) => fd,
            None => index.insert(self.clone_link_index(dir)?),
        };
        let named = sys::fstatat(dir.fd(), name)?;
        match sys::fstatat(ix.as_fd(), entry) {
            Ok(st) => Ok((st.st_dev, st.st_ino) == (named.st_dev, named.st_ino)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes `name` in `dir` a name of the clone's copy of `base`, a file
    /// with several names: a link to its index entry, made (a copy with
    /// the link count to show) by the first of its names to be filled.
    /// The entry is durable before any name links to it, so a name never
    /// outlives a crash without it.
    fn copy_linked_entry(
        &self,
        (dir_node, name): (&Node, &std::ffi::CStr),
        base: &PastNode,
        mark: Mark,
        (entry, links): &(CString, u32),
        index: &mut Option<Arc<OwnedFd>>,
    ) -> Result<()> {
        let ix = match index {
            Some(fd) => fd,
            None => index.insert(self.clone_link_index(dir_node)?),
        };
        let ix = ix.as_fd();
        let dir = dir_node.fd();
        let prepared = match sys::open_path(ix, entry) {
            Ok(copy) => {
                let hidden = temp_name();
                sys::link_fd(copy.as_fd(), dir, &hidden)?;
                Prepared {
                    hidden,
                    is_dir: false,
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let prepared = self.prepare_entry(dir, base, mark)?;
                let ns = self.clone_ns();
                let indexed = (|| -> Result<()> {
                    let copy = sys::open_path(dir, &prepared.hidden)?;
                    crate::union::index::set_entry(copy.as_fd(), ns, entry)?;
                    crate::union::index::set_nlink(copy.as_fd(), ns, *links)?;
                    sys::link_fd(copy.as_fd(), ix, entry)?;
                    let ix = sys::reopen_dir(ix, libc::O_RDONLY)?;
                    Ok(sys::fsync(ix.as_fd(), false)?)
                })();
                if let Err(e) = indexed {
                    prepared.discard(dir);
                    return Err(e);
                }
                prepared
            }
            Err(e) => return Err(e.into()),
        };
        let published = prepared.publish(dir, name, false);
        if published.is_err() {
            prepared.discard(dir);
        }
        published
    }

    /// Makes a copy of `base` (metadata only: a regular file gets its size
    /// and a mark, a directory a mark) under a hidden name in `dir`.
    pub(super) fn prepare_entry(
        &self,
        dir: BorrowedFd<'_>,
        base: &PastNode,
        mark: Mark,
    ) -> Result<Prepared> {
        let copy = self.copy_of(base, mark)?;
        let prepared = Prepared {
            hidden: temp_name(),
            is_dir: copy.kind() == libc::S_IFDIR,
        };
        let handle = copy.make(dir, &prepared.hidden)?;
        match copy.apply(&handle, self.clone_ns(), Inherits::Maybe) {
            Ok(()) => Ok(prepared),
            Err(e) => {
                prepared.discard(dir);
                Err(e)
            }
        }
    }
}

/// A copy made under a hidden name, not yet in place.
pub(super) struct Prepared {
    pub(super) hidden: CString,
    pub(super) is_dir: bool,
}

impl Prepared {
    /// Gives it `name` (replacing what is there only if `replace`).
    pub(super) fn publish(
        &self,
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
        replace: bool,
    ) -> Result<()> {
        let flags = if replace { 0 } else { libc::RENAME_NOREPLACE };
        Ok(sys::renameat2(dir, &self.hidden, dir, name, flags)?)
    }

    pub(super) fn discard(&self, dir: BorrowedFd<'_>) {
        let flags = if self.is_dir { libc::AT_REMOVEDIR } else { 0 };
        let _ = sys::unlinkat(dir, &self.hidden, flags);
    }
}

/// A base object's attributes, xattrs and symlink target.
type Described = (Stat, Vec<(Vec<u8>, Vec<u8>)>, Option<Vec<u8>>);

fn describe(base: &PastNode) -> Result<Described> {
    match base {
        PastNode::Hist { v, .. } => {
            let a = &v.attrs;
            let mut st = sys::zeroed_stat();
            st.st_mode = a.mode;
            st.st_uid = a.uid;
            st.st_gid = a.gid;
            st.st_rdev = a.rdev;
            st.st_size = a.size as i64;
            (st.st_atime, st.st_atime_nsec) = (a.atime.sec, i64::from(a.atime.nsec));
            (st.st_mtime, st.st_mtime_nsec) = (a.mtime.sec, i64::from(a.mtime.nsec));
            let target = match &v.content {
                Content::Symlink { target } => Some(target.clone()),
                _ => None,
            };
            Ok((st, v.xattrs.clone(), target))
        }
        PastNode::Live { fd, st, .. } => {
            let target = (st.st_mode & libc::S_IFMT == libc::S_IFLNK)
                .then(|| sys::readlink_fd(fd.as_fd()))
                .transpose()?;
            let xattrs = if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                Vec::new()
            } else {
                sys::xattrs_of(fd.as_fd())?
            };
            Ok((*st, xattrs, target))
        }
    }
}

/// A copy of a base object as a clone's entry: its attributes (the mode
/// the clone gives it), the xattrs it keeps, its symlink target, its own
/// mark (files and directories).
struct Copy {
    st: Stat,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    target: Option<Vec<u8>>,
    mark: Option<Mark>,
}

impl Copy {
    fn kind(&self) -> u32 {
        self.st.st_mode & libc::S_IFMT
    }

    fn unlink_flags(&self) -> i32 {
        match self.kind() == libc::S_IFDIR {
            true => libc::AT_REMOVEDIR,
            false => 0,
        }
    }

    /// Makes the object `name` in `dir`, private to the daemon until
    /// `apply` gives it its attributes (removed again if this fails).
    fn make(&self, dir: BorrowedFd<'_>, name: &CStr) -> Result<Handle> {
        let made = match self.kind() {
            libc::S_IFDIR => {
                sys::mkdirat(dir, name, 0o700)?;
                let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                sys::openat(dir, name, flags, 0).map(Handle::Open)
            }
            libc::S_IFREG => {
                let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW;
                let fd = sys::openat(dir, name, flags, 0o600)?;
                sys::ftruncate(fd.as_fd(), self.st.st_size as u64).map(|()| Handle::Open(fd))
            }
            libc::S_IFLNK => {
                let target = self.target.clone().unwrap_or_default();
                let target = CString::new(target).map_err(|_| errno(libc::EINVAL))?;
                sys::symlinkat(&target, dir, name)?;
                sys::open_path(dir, name).map(Handle::Path)
            }
            kind => {
                sys::mknodat(dir, name, kind | 0o600, self.st.st_rdev)?;
                sys::open_path(dir, name).map(Handle::Path)
            }
        };
        if made.is_err() {
            let _ = sys::unlinkat(dir, name, self.unlink_flags());
        }
        Ok(made?)
    }

    /// Its mark, then owner, xattrs, mode, times: the order in which none
    /// undoes another (chown clears set-id bits; times last). Without the
    /// privilege to give an object away, the daemon's own ownership stays.
    fn apply(&self, to: &Handle, ns: XattrNs, inherits: Inherits) -> Result<()> {
        if let Some(m) = &self.mark {
            to.setxattr(ns.clone_mark(), &m.encode())?;
        }
        let st = &self.st;
        match sys::chown_fd(to.fd(), st.st_uid, st.st_gid) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && sys::geteuid() != 0 => {}
            other => other?,
        }
        if self.kind() != libc::S_IFLNK {
            for (name, value) in &self.xattrs {
                let name = CString::new(name.clone()).map_err(|_| errno(libc::EINVAL))?;
                to.setxattr(&name, value)?;
            }
            // The copy was made in a directory of the clone that may have
            // its base's default ACL, which the copy inherited: its base's
            // own ACLs are the only ones it may keep (an inherited named
            // entry let a third user read a file its base kept from them).
            if inherits == Inherits::Maybe {
                drop_inherited_acls_with(&self.xattrs, |acl| to.removexattr(acl))?;
            }
            to.chmod(st.st_mode & 0o7777)?;
        }
        keep_times(to.fd(), st)
    }
}

/// An object being made: open where its kind allows (its xattrs and mode
/// set through the descriptor), else an O_PATH handle (through `/proc`).
enum Handle {
    Open(OwnedFd),
    Path(OwnedFd),
}

impl Handle {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Handle::Open(fd) | Handle::Path(fd) => fd.as_fd(),
        }
    }

    fn setxattr(&self, name: &CStr, value: &[u8]) -> std::io::Result<()> {
        match self {
            Handle::Open(fd) => sys::fsetxattr(fd.as_fd(), name, value, 0),
            Handle::Path(fd) => sys::setxattr_fd(fd.as_fd(), name, value, 0),
        }
    }

    fn removexattr(&self, name: &CStr) -> std::io::Result<()> {
        match self {
            Handle::Open(fd) => sys::fremovexattr(fd.as_fd(), name),
            Handle::Path(fd) => sys::removexattr_fd(fd.as_fd(), name),
        }
    }

    fn chmod(&self, mode: u32) -> std::io::Result<()> {
        match self {
            Handle::Open(fd) => sys::fchmod(fd.as_fd(), mode),
            Handle::Path(fd) => sys::chmod_fd(fd.as_fd(), mode),
        }
    }
}

/// Whether objects made in a directory may inherit ACLs from it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Inherits {
    Nothing,
    Maybe,
}

impl Inherits {
    /// Only a directory with a default ACL passes ACLs on (acl(5)).
    fn of(dir: BorrowedFd<'_>) -> Result<Inherits> {
        match sys::fgetxattr(dir, c"system.posix_acl_default", &mut []) {
            Ok(_) => Ok(Inherits::Maybe),
            Err(e)
                if [libc::ENODATA, libc::EOPNOTSUPP].contains(&e.raw_os_error().unwrap_or(0)) =>
            {
                Ok(Inherits::Nothing)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Removes what an interrupted fill left under hidden names in `dir`
/// (`rd` open on it; nobody has seen the directory since: every use fills
/// it first), and returns the other names it holds.
fn drop_leftovers(dir: BorrowedFd<'_>, rd: BorrowedFd<'_>) -> Result<HashSet<Vec<u8>>> {
    let mut found = HashSet::new();
    let mut buf = sys::DirBuf::new(64 * 1024);
    loop {
        let batch = sys::getdents(rd, &mut buf)?;
        if batch.is_empty() {
            return Ok(found);
        }
        for e in batch.iter().filter(|e| e.name != b"." && e.name != b"..") {
            if !is_copyup_temp(&e.name) {
                found.insert(e.name.clone());
                continue;
            }
            let name = CString::new(e.name.clone()).map_err(|_| errno(libc::EINVAL))?;
            let is_dir = match e.dtype {
                libc::DT_UNKNOWN => sys::fstatat(dir, &name)
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
                t => t == libc::DT_DIR,
            };
            let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
            sys::unlinkat(dir, &name, flags)?;
        }
    }
}
