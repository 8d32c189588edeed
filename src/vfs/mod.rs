//! The vfs: inode and handle tables over a branch, and every file system
//! operation expressed without FUSE types.
//!
//! Owns: the mapping between the numbers the kernel holds (inodes with their
//! lookup counts, open handles) and backing objects; permission-relevant
//! execution of each operation under the caller's identity; the rule that
//! the store stays invisible. Uses: `branch`, `store` (inode map), `sys`.
//! Must not use `fuse` or any `fuser` type: the adapter translates, and tests
//! can drive the vfs without mounting.
//!
//! Each operation first finds the source its inode or handle resolves
//! through (`source.rs`: the live branch stack, or the past of `views/`)
//! and dispatches on that.
//!
//! Where a system call is handled: `namespace.rs` (lookup, create, mkdir,
//! mknod, symlink, link, unlink, rmdir, rename), `attr.rs` (getattr,
//! setattr, readlink, xattrs, access, statfs), `file.rs` (open, read, write,
//! flush, release, fsync, fallocate, lseek, copy_file_range), `dir.rs`
//! (opendir, readdir, readdirplus, releasedir, fsyncdir).

mod attr;
mod branch_modes;
mod branch_set;
mod clone;
mod clone_fill;
mod clone_make;
pub(crate) mod clone_patch;
mod clone_space;
mod clone_stamp;
mod commit;
mod dir;
mod dircache;
mod file;
mod ingest;
mod inode_index;
mod inodes;
mod namespace;
mod past_live;
#[cfg(test)]
mod powercut;
mod source;
mod union;
mod union_links;
mod union_ops;
mod union_redirect;
mod union_rename;
mod versioning;
mod views;

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use crate::sys::creds::Caller;
pub use crate::sys::Stat;
pub use attr::{SetAttr, Xattr};
pub use branch_modes::{BranchInfo, ModeChange};
pub use branch_set::{NewBranch, SetChange, SetChanged};
pub use clone_space::CloneSpace;
pub use clone_stamp::foreign_stamp;
pub use commit::SandboxIds;
pub use dircache::{DirCache, OpenedDir};
pub use file::Opened;
pub use inodes::InodeNo;
pub use union::UnionBranch;
pub use union_ops::{BranchUsage, UnionOptions};
pub use views::ViewConfig;

use crate::branch::DirBranch;
use crate::capture::{Capture, CaptureError};
use crate::history::HistoryError;
use crate::store::{InodeMap, StoreError};
use crate::sys;
use inodes::{HandleTable, InodeTable};

/// Errors of vfs operations. Each maps to one errno, chosen by the variant;
/// an `io::Error` keeps the backing file system's own errno.
#[derive(Debug, thiserror::Error)]
pub enum VfsError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("inode {0} is not known (stale handle)")]
    UnknownInode(u64),
    #[error("file handle {0} is not open")]
    UnknownHandle(u64),
    /// The handle's branch stopped taking its writes (`branch mode
    /// --force`): the descriptor is dead, as on a removed NFS export.
    #[error("file handle {0} was revoked by a branch change")]
    RevokedHandle(u64),
    /// A branch change that open files forbid; the message says which.
    #[error("{0}")]
    BranchBusy(String),
    /// Work that the mount's own changes kept from finishing.
    #[error("{0}")]
    Busy(String),
    #[error("this mount is not a union: it has no branches to change")]
    NotUnion,
    #[error("no branch {0} in this union")]
    NoSuchBranch(String),
    #[error("the name {0:?} is reserved for the chronofs store")]
    Reserved(std::ffi::OsString),
    #[error("operation not valid on this kind of file")]
    WrongKind,
    /// A clone asked of a mount without history.
    #[error("clones need history, and this mount keeps none (-o plain)")]
    NoHistory,
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Recording a change failed (the message says why; the caller sees
    /// its errno).
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error(transparent)]
    Union(#[from] crate::union::UnionError),
}

impl VfsError {
    /// No wildcard arm: a new variant must choose its errno here.
    pub fn errno(&self) -> i32 {
        match self {
            VfsError::Io(e) => crate::store::io_errno(e),
            VfsError::UnknownInode(_) => libc::ESTALE,
            VfsError::UnknownHandle(_) => libc::EBADF,
            VfsError::RevokedHandle(_) => libc::ESTALE,
            VfsError::BranchBusy(_) | VfsError::Busy(_) => libc::EBUSY,
            VfsError::NotUnion => libc::EINVAL,
            VfsError::NoSuchBranch(_) => libc::ENOENT,
            VfsError::Reserved(_) => libc::EPERM,
            VfsError::WrongKind => libc::EINVAL,
            VfsError::NoHistory => libc::EOPNOTSUPP,
            VfsError::Store(e) => e.errno(),
            VfsError::Capture(e) => e.errno(),
            VfsError::History(e) => e.errno(),
            VfsError::Union(e) => e.errno(),
        }
    }

    fn errno_is(&self, errno: i32) -> bool {
        self.errno() == errno
    }
}

/// A vfs refusal as the control service reports it (a branch request's):
/// the errno kept, the message too where a variant carries one.
impl From<VfsError> for crate::history::past::Error {
    fn from(e: VfsError) -> Self {
        use crate::history::past::Error;
        if let VfsError::Union(crate::union::UnionError::Unmergeable(why)) = e {
            return Error::Usage(why);
        }
        match e.errno() {
            libc::EBUSY => Error::Busy(e.to_string()),
            libc::ENOENT => Error::NotFound(e.to_string()),
            libc::EINVAL => Error::Usage(e.to_string()),
            errno => Error::Io(io::Error::from_raw_os_error(errno)),
        }
    }
}

pub type Result<T> = std::result::Result<T, VfsError>;

fn errno(code: i32) -> VfsError {
    VfsError::Io(io::Error::from_raw_os_error(code))
}

/// Tunables of a mount that the vfs acts on.
#[derive(Clone, Debug)]
pub struct VfsConfig {
    pub entry_timeout: Duration,
    pub attr_timeout: Duration,
    pub negative_timeout: Duration,
    pub write_path: WritePath,
    /// `.history/`, version names, audit (with history on).
    pub views: ViewConfig,
    /// How long the kernel may trust names, absent names and attributes
    /// a union's read-only branches give, when another mount writes those
    /// branches (a sandbox's session over its mount's branches); `None`:
    /// the timeouts above.
    pub lower_timeout: Option<Duration>,
}

impl Default for VfsConfig {
    fn default() -> Self {
        VfsConfig {
            entry_timeout: Duration::from_secs(1),
            attr_timeout: Duration::from_secs(1),
            negative_timeout: Duration::from_secs(1),
            write_path: WritePath::Auto,
            views: ViewConfig::default(),
            lower_timeout: None,
        }
    }
}

/// Which path a regular file's I/O takes when the kernel offers
/// passthrough (docs/ARCHITECTURE.md "Per-open write path").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePath {
    /// Passthrough, except in-place updates of files with at least
    /// `capture::TRACK_MIN` bytes of recorded data: those go through the
    /// daemon, whose versions then cost what was written.
    Auto,
    /// Passthrough for every open.
    Passthrough,
    /// Through the daemon for every open (no passthrough, no writeback
    /// cache): the baseline the tracked path is measured against.
    Daemon,
}

/// Attributes of an object as the kernel should see them.
#[derive(Clone, Copy, Debug)]
pub struct Attr {
    pub ino: InodeNo,
    pub st: Stat,
}

impl Attr {
    pub fn kind(&self) -> u32 {
        self.st.st_mode & libc::S_IFMT
    }

    /// A regular file with set-user-ID or set-group-ID: a write, truncation
    /// or O_TRUNC open by an unprivileged caller may clear them on the
    /// backing file without the kernel's cached mode learning it. With
    /// FUSE_HANDLE_KILLPRIV_V2 the kernel leaves the clearing to the file
    /// system and keeps its cached mode; passthrough writes reach the
    /// backing file with no request at all.
    pub fn has_setid(&self) -> bool {
        self.kind() == libc::S_IFREG && self.st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0
    }
}

/// A looked-up object: the kernel now holds one more reference to `attr.ino`.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub attr: Attr,
    /// How long the kernel may trust the name (`None`: the mount's entry
    /// timeout).
    pub entry_ttl: Option<Duration>,
}

pub struct Vfs {
    branch: DirBranch,
    inodes: InodeTable,
    handles: HandleTable,
    cfg: VfsConfig,
    /// Whether the kernel's writeback cache is on (known once the kernel
    /// connection is negotiated): then O_WRONLY opens must be readable (the
    /// kernel reads partial pages) and O_APPEND is handled by the kernel.
    writeback: AtomicBool,
    /// With the writeback cache: held across a write that keeps its
    /// file's mtime and across a setattr of times (`file.rs`,
    /// `Vfs::keeping_kernel_mtime`), by inode number modulo their count.
    mtime_locks: [parking_lot::Mutex<()>; 16],
    /// The kernel connection uses passthrough: handles the vfs allows it
    /// (`Opened::passthrough_ok`) then do their I/O in the kernel.
    passthrough: AtomicBool,
    /// History capture; `None` for `-o plain`.
    capture: Option<Arc<Capture>>,
    ingest: ingest::IngestProgress,
    /// Per inode with open file handles: whether they use passthrough, and
    /// how many there are. The kernel refuses to mix passthrough and cached
    /// opens of one inode, so the first open chooses for all.
    io_modes: parking_lot::Mutex<std::collections::HashMap<InodeNo, file::IoFamily>>,
    /// Told at each release of a handle counted in `io_modes`.
    io_released: parking_lot::Condvar,
    /// Nodes and handles of the time-travel views.
    views: views::Views,
    /// The branches of a union mount (`None`: one branch).
    union: Option<union::Union>,
    /// Told of an inode whose attributes changed outside any reply that
    /// carries them (the FUSE adapter invalidates the kernel's copy).
    attrs_changed: std::sync::OnceLock<AttrsChanged>,
    /// Told of a name the vfs made where no request of the kernel's did
    /// (a clone): the kernel may remember it as absent.
    name_made: std::sync::OnceLock<NameMade>,
    /// Told when a union's branch set changed (`Vfs::on_set_changed`).
    set_changed: std::sync::OnceLock<SetChanged>,
    /// A single directory's [`Vfs::changing`] lock (a union's is its set
    /// lock): a sandbox commit holds it exclusively.
    tree_lock: parking_lot::RwLock<()>,
    /// Clones in this mount (`clone.rs`).
    clones: clone::Clones,
}

/// See [`Vfs::on_name_made`].
pub type NameMade = Box<dyn Fn(InodeNo, &[u8]) + Send + Sync>;

/// See [`Vfs::on_attrs_changed`].
pub type AttrsChanged = Box<dyn Fn(InodeNo) + Send + Sync>;

impl Vfs {
    pub fn new(
        mut branch: DirBranch,
        inomap: InodeMap,
        cfg: VfsConfig,
        capture: Option<Arc<Capture>>,
    ) -> Result<Arc<Vfs>> {
        // A mount with history may hold clones, whose files with several
        // names link to an index there (`clone.rs`), as a union's do.
        if capture.is_some() {
            branch.reserve(OsStr::new(crate::union::index::INDEX_DIR));
        }
        let id = branch.id();
        let mounts = vec![(
            id,
            inodes::BranchMount::of(branch.root_fd(), branch.key_dev()),
        )];
        Vfs::assemble(branch, id, inomap, mounts, cfg, capture, None)
    }

    /// The vfs over `branch` (the root's), with every branch's handle mount.
    fn assemble(
        branch: DirBranch,
        id: crate::branch::BranchId,
        inomap: InodeMap,
        mounts: Vec<(crate::branch::BranchId, inodes::BranchMount)>,
        cfg: VfsConfig,
        capture: Option<Arc<Capture>>,
        union: Option<union::Union>,
    ) -> Result<Arc<Vfs>> {
        let root_fd = sys::reopen(branch.root_fd(), libc::O_PATH | libc::O_DIRECTORY)?;
        let root_st = sys::fstat(root_fd.as_fd())?;
        let layers = union
            .as_ref()
            .map(union::Union::root_layers)
            .unwrap_or_default();
        let inodes = InodeTable::new(id, inomap, root_fd, &root_st, mounts, layers);
        let vfs = Arc::new(Vfs {
            branch,
            inodes,
            handles: HandleTable::default(),
            cfg,
            writeback: AtomicBool::new(false),
            mtime_locks: Default::default(),
            passthrough: AtomicBool::new(false),
            io_modes: parking_lot::Mutex::new(std::collections::HashMap::new()),
            io_released: parking_lot::Condvar::new(),
            capture,
            ingest: ingest::IngestProgress::default(),
            views: views::Views::default(),
            union,
            attrs_changed: std::sync::OnceLock::new(),
            name_made: std::sync::OnceLock::new(),
            set_changed: std::sync::OnceLock::new(),
            tree_lock: parking_lot::RwLock::new(()),
            clones: clone::Clones::default(),
        });
        if let Some(c) = &vfs.capture {
            let weak = Arc::downgrade(&vfs);
            c.set_shown_links(Box::new(move |obj| weak.upgrade()?.shown_links(obj, None)));
        }
        Ok(vfs)
    }

    /// A union of `branches` (top first); the store, if any, lives in the
    /// upper (first read-write) branch, or the top one.
    pub fn new_union(
        mut branches: Vec<UnionBranch>,
        inomap: InodeMap,
        cfg: VfsConfig,
        capture: Option<Arc<Capture>>,
        opts: UnionOptions,
    ) -> Result<Arc<Vfs>> {
        let u = union::Union::new(&branches, opts)?;
        let primary = u.primary();
        let mounts = branches
            .iter()
            .map(|b| {
                let mount = inodes::BranchMount::of(b.branch.root_fd(), b.branch.key_dev());
                (crate::branch::BranchId(b.id), mount)
            })
            .collect();
        let at = branches
            .iter()
            .position(|b| b.id == primary.0)
            .ok_or(VfsError::WrongKind)?;
        // The store's name stays hidden when the root's branch is not the
        // one holding it (modes or branches changed while mounted).
        let store_name = branches
            .iter()
            .find_map(|b| b.branch.reserved_name().map(OsStr::to_os_string));
        let mut branch = branches.swap_remove(at).branch;
        branch.reserve(OsStr::new(crate::union::index::INDEX_DIR));
        if let Some(name) = store_name.filter(|_| branch.reserved_name().is_none()) {
            branch.reserve(&name);
        }
        Vfs::assemble(branch, primary, inomap, mounts, cfg, capture, Some(u))
    }

    pub fn config(&self) -> &VfsConfig {
        &self.cfg
    }

    /// Runs `hook` for every inode whose attributes the vfs changed
    /// where no reply tells the kernel (a union copy-up: owner and mode
    /// per `copyup-owner`, ctime, a directory's link count once it has
    /// layers). The kernel caches live attributes for a day by default
    /// (docs/ARCHITECTURE.md "Cache validity"). Set once; the hook must
    /// not wait for the kernel on a lock a request may hold.
    pub fn on_attrs_changed(&self, hook: AttrsChanged) {
        if self.attrs_changed.set(hook).is_err() {
            tracing::warn!("attribute-change hook set twice; the first stays");
        }
    }

    /// Runs `hook` for a name the vfs made outside any request that
    /// named it (a clone's): the kernel must forget that it was absent.
    pub fn on_name_made(&self, hook: NameMade) {
        if self.name_made.set(hook).is_err() {
            tracing::warn!("name hook set twice; the first stays");
        }
    }

    pub(in crate::vfs) fn name_made(&self, parent: InodeNo, name: &[u8]) {
        if let Some(hook) = self.name_made.get() {
            hook(parent, name);
        }
    }

    /// See [`Vfs::on_attrs_changed`].
    pub(in crate::vfs) fn attrs_changed(&self, ino: InodeNo) {
        if let Some(hook) = self.attrs_changed.get() {
            hook(ino);
        }
    }

    /// How long the kernel may cache these attributes: as long as their
    /// source says (an instant never changes). Set-ID bits are never
    /// cached (see [`Attr::has_setid`]): a stale cached mode would show
    /// them after they were cleared, and exec would honour them.
    pub fn attr_ttl(&self, attr: &Attr) -> Duration {
        if let Some(ttl) = self.source_of(attr.ino).fixed_ttl() {
            ttl
        } else if attr.has_setid() {
            Duration::ZERO
        } else if let Some(ttl) = self.lower_ttl(attr.ino) {
            ttl.min(self.cfg.attr_timeout)
        } else {
            self.cfg.attr_timeout
        }
    }

    /// [`VfsConfig::lower_timeout`] for an inode whose copy in use lies
    /// in a read-only branch of the union (another mount may change it).
    fn lower_ttl(&self, ino: InodeNo) -> Option<Duration> {
        let ttl = self.cfg.lower_timeout?;
        let u = self.union()?;
        let inode = self.inodes.get(ino).ok()?;
        let branch = self.inodes.branch_of(&inode.key);
        (!u.writable(branch)).then_some(ttl)
    }

    /// The timeout for replies that give the name and the attributes one
    /// (create, readdirplus): `entry_ttl`, unless the attributes must not
    /// be cached.
    pub fn entry_and_attr_ttl(&self, attr: &Attr, entry_ttl: Duration) -> Duration {
        if attr.has_setid() {
            Duration::ZERO
        } else {
            entry_ttl
        }
    }

    /// The lock [`Vfs::mtime_locks`] holds for `ino`.
    fn mtime_lock(&self, ino: InodeNo) -> &parking_lot::Mutex<()> {
        &self.mtime_locks[(ino.0 % self.mtime_locks.len() as u64) as usize]
    }

    pub fn writeback(&self) -> bool {
        self.writeback.load(Ordering::Relaxed)
    }

    /// Called once the kernel connection is negotiated.
    pub fn set_writeback(&self, on: bool) {
        self.writeback.store(on, Ordering::Relaxed);
    }

    /// Called once the kernel connection is negotiated.
    pub fn set_passthrough(&self, on: bool) {
        self.passthrough.store(on, Ordering::Relaxed);
    }

    /// Whether `name` (in the root if `in_root`) is chronofs's own and
    /// stays invisible through the mount: the store's directory, and in a
    /// union or with history the hidden names a clone, copy-up or
    /// whiteout swap works under, which a crash can leave behind
    /// (`format::is_hidden_temporary`).
    pub(super) fn is_own_name(&self, in_root: bool, name: &OsStr) -> bool {
        self.branch.is_reserved(in_root, name)
            || (self.hides_temporaries()
                && crate::union::format::is_hidden_temporary(
                    std::os::unix::ffi::OsStrExt::as_bytes(name),
                ))
    }

    /// Whether this mount makes hidden temporaries (a union's copy-ups
    /// and whiteouts, history's clones), and so hides them; in a plain
    /// single-directory mount such names are the user's.
    pub(super) fn hides_temporaries(&self) -> bool {
        self.capture.is_some() || self.union.is_some()
    }

    fn check_name(&self, parent: InodeNo, name: &OsStr) -> Result<()> {
        self.source_of(parent).check_writable()?;
        if self.is_own_name(parent == InodeNo::ROOT, name) {
            return Err(VfsError::Reserved(name.to_os_string()));
        }
        if parent == InodeNo::ROOT && self.views_on() && name == self.cfg.views.dir_name {
            return Err(errno(libc::EEXIST));
        }
        if name.len() > 255 {
            return Err(errno(libc::ENAMETOOLONG));
        }
        Ok(())
    }

    /// The object id (inode number) of a live backing object, if it has
    /// one; never assigns a number.
    pub fn object_of(&self, st: &Stat) -> Option<crate::history::ObjectId> {
        self.inodes.object_of(st)
    }

    /// The name the kernel last reached `obj` by: (parent, name).
    pub fn name_of(
        &self,
        obj: crate::history::ObjectId,
    ) -> Option<(crate::history::ObjectId, Vec<u8>)> {
        let inode = self.inodes.get(obj.into()).ok()?;
        inode.name().map(|(p, n)| (p.object(), n))
    }

    /// Writes pending inode-map entries durably.
    pub fn flush_store(&self) -> Result<()> {
        Ok(self.inodes.flush()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_own_errno() {
        let io = VfsError::Io(io::Error::from_raw_os_error(libc::EXDEV));
        assert_eq!(io.errno(), libc::EXDEV);
        assert_eq!(VfsError::UnknownInode(9).errno(), libc::ESTALE);
        assert_eq!(VfsError::UnknownHandle(9).errno(), libc::EBADF);
        assert_eq!(VfsError::RevokedHandle(9).errno(), libc::ESTALE);
        assert_eq!(VfsError::BranchBusy(String::new()).errno(), libc::EBUSY);
        assert_eq!(VfsError::NotUnion.errno(), libc::EINVAL);
        assert_eq!(VfsError::NoSuchBranch(String::new()).errno(), libc::ENOENT);
        assert_eq!(VfsError::Reserved(".chronofs".into()).errno(), libc::EPERM);
        assert_eq!(VfsError::WrongKind.errno(), libc::EINVAL);
        let store = VfsError::Store(StoreError::IndexBusy("x".into()));
        assert_eq!(store.errno(), libc::EBUSY);
        let capture = VfsError::Capture(CaptureError::TooDeep(1));
        assert_eq!(capture.errno(), libc::ELOOP);
        let history = VfsError::History(HistoryError::SourceShrank);
        assert_eq!(history.errno(), libc::EAGAIN);
    }

    #[test]
    fn a_refusal_reaches_the_control_service_with_its_errno_and_message() {
        use crate::history::past::Error;
        for e in [
            VfsError::BranchBusy("2 file(s) open".into()),
            VfsError::NoSuchBranch("7".into()),
            VfsError::NotUnion,
            VfsError::Reserved(".chronofs".into()),
            VfsError::Io(io::Error::from_raw_os_error(libc::EROFS)),
        ] {
            let (errno, message) = (e.errno(), e.to_string());
            let reported = Error::from(e);
            assert_eq!(reported.errno(), errno, "{reported:?}");
            if !matches!(reported, Error::Io(_)) {
                assert_eq!(reported.to_string(), message);
            }
        }
    }
}
