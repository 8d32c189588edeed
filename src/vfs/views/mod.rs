//! Time travel in the name space (docs/ARCHITECTURE.md "Time travel"):
//! `.history/` at the mount root, per-file version names in live
//! directories (`f;3`, `f;-1`, `f;@T`) and deleted entries (`DIR/;deleted`).
//! This is the `Past` source of `source.rs`: its operations are the
//! `view_*` methods, which `Source` and `HandleSource` call.
//!
//! Here: view numbers, the node table, attributes and xattrs. Names in
//! `lookup.rs`, listings in `list.rs`, file reads and handles in `read.rs`,
//! the "as it is now" permission check in `access.rs`, removals from
//! history in `removal.rs`.
//!
//! A view node is an object as it was at an instant (a sequence number).
//! Its inode number packs the instant's slot and the object id, so the same
//! object at the same instant always has the same number (hard links stay
//! links) and two instants never share one (`diff -r` compares them).
//! Nothing here changes anything: the source is not writable, so every
//! modifying call on a view is EROFS.
//! Permission checks are the kernel's (`default_permissions`), made against
//! the attributes shown, which are the object's attributes at the instant,
//! plus the daemon's check of the object as it is now at each open
//! (`access.rs`).

mod access;
mod list;
mod lookup;
mod read;

pub(in crate::vfs) use read::{data_runs, read_reader_into, run_at, seek_layout, LAYOUT_MIN};
mod removal;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use super::dir::DirEntry;
use super::dircache::DirCache;
use super::inodes::Inode;
use super::{errno, Attr, Caller, Entry, InodeNo, Result, Stat, Vfs, VfsError, Xattr};
use crate::capture::attrs_of;
use crate::history::past::{self, Cur, LiveIds, Node, Past};
use crate::history::spec::{self, At};
use crate::history::{Attrs, Content};
use crate::history::{History, Manifest, ObjectId, Seq, Version, ROOT};
use crate::sys;

/// Inode numbers (and handle numbers) of views have this bit set; the
/// persistent map allocates live numbers upward from 1. Only
/// `Vfs::source_of` and `Vfs::handle_source` test it.
pub const VIEW_BIT: u64 = 1 << 63;
const OBJ_BITS: u32 = 40;
const OBJ_MASK: u64 = (1 << OBJ_BITS) - 1;
/// Slot 0 is `.history` itself, slot 1 the deleted-entry listings.
const DELETED_SLOT: u64 = 1;
const FIRST_INSTANT_SLOT: u64 = 2;
const MAX_SLOT: u64 = (1 << (63 - OBJ_BITS)) - 1;
const TOP: InodeNo = InodeNo(VIEW_BIT);

/// What a view shows never changes.
pub(super) const IMMUTABLE_TTL: Duration = Duration::from_secs(24 * 3600);
/// How many hourly and daily instants `ls .history/` offers.
const LISTED_HOURS: i64 = 48;
const LISTED_DAYS: i64 = 31;

/// The time-travel options of a mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewConfig {
    /// The history directory's name in the mount root.
    pub dir_name: OsString,
    /// Separates a file's name from a version (`report.txt;3`).
    pub sep: Vec<u8>,
    /// Only root sees history through the mount.
    pub audit: bool,
}

/// `e`, kept by the kernel no longer than `ttl` (what a caller's check
/// allows others to reuse: [`Vfs::view_search`]).
fn kept_at_most(e: Entry, ttl: Duration) -> Entry {
    Entry {
        entry_ttl: Some(e.entry_ttl.map_or(ttl, |t| t.min(ttl))),
        ..e
    }
}

impl ViewConfig {
    /// Whether `name` holds the version separator: it reads as a version
    /// name (`f;1`, `f;@T`, `;deleted`).
    pub fn holds_sep(&self, name: &[u8]) -> bool {
        let sep = self.sep.as_slice();
        !sep.is_empty() && name.windows(sep.len()).any(|w| w == sep)
    }
}

impl Default for ViewConfig {
    fn default() -> Self {
        ViewConfig {
            dir_name: OsString::from(".history"),
            sep: b";".to_vec(),
            audit: false,
        }
    }
}

#[derive(Default)]
pub(super) struct Views {
    /// Where private clones of live files go (the store directory), if
    /// history has one on the source's file system.
    clone_dir: std::sync::OnceLock<OwnedFd>,
    instants: RwLock<Instants>,
    nodes: RwLock<HashMap<InodeNo, Arc<ViewNode>>>,
    handles: RwLock<HashMap<u64, Arc<ViewHandle>>>,
    next_fh: AtomicU64,
}

/// Instants that have view nodes, by slot.
#[derive(Default)]
struct Instants {
    slot_of: HashMap<Seq, u64>,
    next: u64,
}

struct ViewNode {
    nlookup: AtomicU64,
    what: What,
    /// A private clone of the live file (see `clone_for`): `None` until
    /// the first open decides, then the clone or nothing. Decided once so
    /// that every open of the inode takes the same I/O path.
    clone: Mutex<Option<Option<Arc<OwnedFd>>>>,
    /// The attributes shown (`st_ino` is the view's number).
    st: Stat,
    /// History's removal epoch when the node was last found to show what
    /// history holds (see `current`).
    checked: AtomicU64,
    /// The names the kernel may cache for the node, as (parent, name), so
    /// they can be dropped when history removes what they show.
    names: Mutex<Vec<(InodeNo, Vec<u8>)>>,
}

impl ViewNode {
    /// The instant the node shows and whether its state there is a
    /// removal's (`(0, false)` for the listings, which show no object).
    fn version_at(&self) -> (Seq, bool) {
        match &self.what {
            What::At { at, state, .. } => (*at, matches!(state, State::Hist { v } if v.gone)),
            _ => (Seq::ZERO, false),
        }
    }
}

enum What {
    Top,
    /// The deleted entries of the live directory `dir`.
    Deleted {
        dir: ObjectId,
    },
    At {
        at: Seq,
        obj: ObjectId,
        state: State,
    },
}

enum State {
    Hist {
        v: Arc<Version>,
    },
    /// Unchanged since the instant: the live object is its state. Holds a
    /// reference on the live inode so its descriptor can be re-opened.
    Live {
        inode: Arc<Inode>,
    },
}

enum ViewHandle {
    Dir {
        ino: InodeNo,
        entries: Vec<Listed>,
    },
    File {
        reader: Mutex<Reader>,
        /// The clone the kernel reads directly (FUSE passthrough).
        passthrough: Option<Arc<OwnedFd>>,
    },
}

struct Listed {
    name: Vec<u8>,
    ino: InodeNo,
    kind: u32,
    /// The entry's recorded version and the instant it is shown at, if
    /// it has one (saves resolving the name again for readdirplus).
    hist: Option<(Seq, ObjectId, Arc<Version>)>,
    /// How long the kernel may keep the entry readdirplus gives it
    /// (`view_search`, `deleted_shown`).
    ttl: Duration,
}

pub(in crate::vfs) struct Reader {
    obj: ObjectId,
    at: Seq,
    source: ReadFrom,
}

pub(in crate::vfs) enum ReadFrom {
    /// The live file, while it still matches the state at the instant.
    Head {
        fd: OwnedFd,
        expect: Attrs,
        latest: Option<Seq>,
        /// History's newest change when `latest` was last confirmed: while
        /// nothing newer is recorded, the object's versions are as they
        /// were (one lock instead of an index read per read).
        as_of: Seq,
    },
    /// A live clone's file with bytes of its own and its base's (checked
    /// as `Head` is).
    Patched {
        file: Arc<crate::vfs::clone_patch::Patched>,
        /// Its generation at the instant: every change to its bytes
        /// goes through the daemon and moves it.
        generation: u64,
    },
    Chunks {
        manifest: Manifest,
        /// Offset of each extent.
        starts: Vec<u64>,
        cached: Option<(usize, Vec<u8>)>,
    },
}

/// An entry the kernel may cache for this long, or `None` for the mount's
/// usual timeout.
fn entry(st: Stat, ttl: Duration) -> Entry {
    Entry {
        attr: Attr {
            ino: InodeNo(st.st_ino),
            st,
        },
        entry_ttl: Some(ttl),
    }
}

fn enoent<T>(why: impl std::fmt::Display) -> Result<T> {
    tracing::debug!("history view: {why}");
    Err(errno(libc::ENOENT))
}

pub(in crate::vfs) fn past_err(e: past::Error) -> VfsError {
    match e {
        past::Error::NotFound(m) | past::Error::Usage(m) => {
            tracing::debug!("history view: {m}");
            errno(libc::ENOENT)
        }
        past::Error::Denied(_) => errno(libc::EACCES),
        past::Error::Busy(_) => errno(libc::EBUSY),
        past::Error::NotPermitted(_) => errno(libc::EPERM),
        past::Error::History(h) => VfsError::History(h),
        past::Error::Io(e) => VfsError::Io(e),
    }
}

/// The mode a view shows for a past object's `mode`. A view is read as a
/// `nosuid,nodev` mount is: a program run from the past never gains the
/// set-user-ID or set-group-ID privileges its file had then (they may have
/// been taken away since, or the file deleted for it), and a device node
/// shows no permission bits, since opening one reaches the driver without
/// the daemon's check of the node as it is now; root opens it regardless.
/// A directory keeps its set-group-ID bit: views make nothing in it.
pub(super) fn shown_mode(mode: u32) -> u32 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => mode,
        libc::S_IFCHR | libc::S_IFBLK => mode & (libc::S_IFMT | libc::S_ISVTX),
        _ => mode & !(libc::S_ISUID | libc::S_ISGID),
    }
}

/// A directory's link count: itself, its entry in its parent, and each
/// subdirectory's `..`.
fn dir_nlink(kinds: impl Iterator<Item = u32>) -> libc::nlink_t {
    2 + kinds.filter(|k| *k == libc::S_IFDIR).count() as libc::nlink_t
}

fn stat_of(v: &Version, ino: InodeNo) -> Stat {
    let a = &v.attrs;
    let mut st = sys::zeroed_stat();
    st.st_ino = ino.0;
    st.st_mode = a.mode;
    st.st_nlink = a.nlink.max(1) as _;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_rdev = a.rdev;
    st.st_size = a.size as i64;
    st.st_blksize = 4096;
    st.st_blocks = a.size.div_ceil(512) as i64;
    st.st_atime = a.atime.sec;
    st.st_atime_nsec = i64::from(a.atime.nsec);
    st.st_mtime = a.mtime.sec;
    st.st_mtime_nsec = i64::from(a.mtime.nsec);
    st.st_ctime = a.ctime.sec;
    st.st_ctime_nsec = i64::from(a.ctime.nsec);
    st
}

/// The instant a name under `.history/` means, and whether that meaning
/// is fixed (an absolute time well in the past, or a sequence number) or
/// moves with the clock or with tags (`-10m`, `now`, a tag).
fn parse_instant(name: &[u8]) -> Option<(At, bool)> {
    let spec = std::str::from_utf8(name.strip_prefix(b"@")?).ok()?;
    let at = spec::parse(spec).ok()?;
    let fixed = match &at {
        At::Seq(_) => true,
        At::Time(t) => {
            spec.starts_with(|c: char| c.is_ascii_digit())
                && *t < crate::history::now_ns() - 2_000_000_000
        }
        At::Now | At::Tag(_) => false,
    };
    Some((at, fixed))
}

struct VfsIds<'a>(&'a Vfs);

impl LiveIds for VfsIds<'_> {
    fn identify(&self, st: &Stat) -> Option<ObjectId> {
        self.0.inodes.object_of(st)
    }

    fn find(
        &self,
        obj: ObjectId,
        path: &[Vec<u8>],
    ) -> Option<std::io::Result<Option<(OwnedFd, Stat)>>> {
        self.0.live_find(obj, path)
    }

    fn find_child(
        &self,
        dir: ObjectId,
        name: &[u8],
    ) -> Option<std::io::Result<Option<(ObjectId, OwnedFd, Stat)>>> {
        self.0.live_find_child(dir, name)
    }
}

impl Vfs {
    /// [`LiveIds::find`] for the mount: in a union, object `obj` found as
    /// the mount's lookups find it (the control service's past asks too).
    pub fn live_find(
        &self,
        obj: ObjectId,
        path: &[Vec<u8>],
    ) -> Option<std::io::Result<Option<(OwnedFd, Stat)>>> {
        self.union()?;
        Some(
            self.find_shown(obj, path)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno())),
        )
    }

    /// [`LiveIds::find_child`] for the mount: in a union, `name` in live
    /// directory `dir` as the mount's lookups find it.
    pub fn live_find_child(
        &self,
        dir: ObjectId,
        name: &[u8],
    ) -> Option<std::io::Result<Option<(ObjectId, OwnedFd, Stat)>>> {
        self.union()?;
        Some(
            self.find_shown_child(dir, name)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno())),
        )
    }
}

impl Vfs {
    pub(super) fn views_on(&self) -> bool {
        self.capture.is_some()
    }

    fn history(&self) -> Result<&History> {
        match &self.capture {
            Some(c) => Ok(c.history().as_ref()),
            None => Err(errno(libc::ENOENT)),
        }
    }

    pub(in crate::vfs) fn with_past<T>(&self, f: impl FnOnce(&Past) -> Result<T>) -> Result<T> {
        let ids = VfsIds(self);
        let past = Past {
            history: self.history()?,
            root: self.branch.root_fd(),
            reserved: self.branch.reserved_name(),
            live: &ids,
        };
        f(&past)
    }

    fn hidden_from(&self, caller: &Caller) -> bool {
        self.cfg.views.audit && caller.uid != 0
    }

    fn view(&self, ino: InodeNo) -> Result<Arc<ViewNode>> {
        self.views
            .nodes
            .read()
            .get(&ino)
            .cloned()
            .ok_or(VfsError::UnknownInode(ino.0))
    }

    /// The inode number of `obj` at `at`.
    fn view_number(&self, at: Seq, obj: ObjectId) -> Result<InodeNo> {
        if obj.get() > OBJ_MASK {
            return Err(errno(libc::EOVERFLOW));
        }
        let slot = {
            let known = self.views.instants.read().slot_of.get(&at).copied();
            match known {
                Some(s) => s,
                None => {
                    let mut inst = self.views.instants.write();
                    let next = inst.next.max(FIRST_INSTANT_SLOT);
                    if next > MAX_SLOT {
                        return Err(errno(libc::ENFILE));
                    }
                    let s = *inst.slot_of.entry(at).or_insert(next);
                    if s == next {
                        inst.next = next + 1;
                    }
                    s
                }
            }
        };
        Ok(InodeNo(VIEW_BIT | (slot << OBJ_BITS) | obj.get()))
    }

    /// Registers (or takes one more kernel reference on) a view node.
    fn hold_view(&self, ino: InodeNo, make: impl FnOnce() -> Result<(What, Stat)>) -> Result<Stat> {
        if let Some(n) = self.views.nodes.read().get(&ino) {
            if self.current(n).is_ok() {
                n.nlookup.fetch_add(1, Ordering::AcqRel);
                return Ok(n.st);
            }
        }
        let epoch = self.history().map_or(0, |h| h.removal_epoch());
        let (what, mut st) = make()?;
        st.st_mode = shown_mode(st.st_mode);
        let mut nodes = self.views.nodes.write();
        let mut nlookup = 1;
        if let Some(n) = nodes.get(&ino) {
            if self.current(n).is_ok() {
                n.nlookup.fetch_add(1, Ordering::AcqRel);
                let st = n.st;
                drop(nodes);
                self.drop_what(what);
                return Ok(st);
            }
            // History removed what the old node showed: the new one takes
            // over the kernel's references under the same number.
            nlookup += n.nlookup.load(Ordering::Acquire);
        }
        let names = nodes
            .get(&ino)
            .map(|n| std::mem::take(&mut *n.names.lock()))
            .unwrap_or_default();
        let old = nodes.insert(
            ino,
            Arc::new(ViewNode {
                nlookup: AtomicU64::new(nlookup),
                what,
                st,
                clone: Mutex::new(None),
                checked: AtomicU64::new(epoch),
                names: Mutex::new(names),
            }),
        );
        drop(nodes);
        if let Some(Ok(old)) = old.map(Arc::try_unwrap) {
            self.drop_what(old.what);
        }
        Ok(st)
    }

    fn drop_what(&self, what: What) {
        if let What::At {
            state: State::Live { inode },
            ..
        } = what
        {
            self.inodes.forget(inode.ino, 1);
        }
    }

    pub(super) fn view_forget(&self, ino: InodeNo, n: u64) {
        let Some(node) = self.views.nodes.read().get(&ino).cloned() else {
            return;
        };
        let prev = node.nlookup.fetch_sub(n, Ordering::AcqRel);
        if prev > n {
            return;
        }
        if prev < n {
            node.nlookup.store(0, Ordering::Release);
        }
        drop(node);
        let mut nodes = self.views.nodes.write();
        // A lookup may have revived it between the decrement and the lock.
        if nodes
            .get(&ino)
            .is_some_and(|n| n.nlookup.load(Ordering::Acquire) == 0)
        {
            if let Some(gone) = nodes.remove(&ino) {
                drop(nodes);
                if let Ok(gone) = Arc::try_unwrap(gone) {
                    self.drop_what(gone.what);
                } else {
                    tracing::debug!("view node {} still in use at forget", ino.0);
                }
            }
        }
    }

    /// A node for what a walk found at `at`.
    fn node_at(&self, at: Seq, node: Node) -> Result<Entry> {
        let (obj, state, mut st) = match node {
            Node::Hist { obj, v, .. } => return self.hist_at(at, obj, Arc::new(v)),
            Node::Live { fd, st, obj } => {
                let inode = match (self.union(), obj) {
                    // Its own branch's key, a directory's copies: not the
                    // branch root's.
                    (Some(_), Some(o)) => self.hold_object(o, None)?.ok_or(errno(libc::ENOENT))?,
                    _ => self.inodes.acquire_new(fd, &st, false)?,
                };
                // As the mount shows it: a clone's file with several names
                // counts them, not its link index's entry too.
                let st = self.shown(inode.ino, st);
                (inode.ino.object(), State::Live { inode }, st)
            }
        };
        let ino = match self.view_number(at, obj) {
            Ok(i) => i,
            Err(e) => {
                self.drop_what(What::At { at, obj, state });
                return Err(e);
            }
        };
        st.st_ino = ino.0;
        let what = What::At { at, obj, state };
        let st = self.hold_view(ino, || Ok((what, st)))?;
        Ok(entry(st, IMMUTABLE_TTL))
    }

    /// A node for a recorded version of `obj`, shown at `at`.
    fn hist_at(&self, at: Seq, obj: ObjectId, v: Arc<Version>) -> Result<Entry> {
        let ino = self.view_number(at, obj)?;
        let st = self.hold_view(ino, || {
            let mut st = stat_of(&v, ino);
            let large = v.attrs.size >= read::LAYOUT_MIN;
            if let (Content::File { manifest }, true) = (&v.content, large) {
                // A sparse file's holes hold no blocks: `cp` and `tar -S`
                // look at the count to decide to look for them.
                match self.history()?.manifest(manifest) {
                    Ok(m) => st.st_blocks = read::recorded_data(&m).div_ceil(512) as i64,
                    Err(e) => tracing::debug!("history view: manifest of {obj} unread: {e}"),
                }
            }
            let state = State::Hist { v };
            // A directory's versions are not recorded when entries come
            // and go: its link count is that of its listing, where the
            // file system counts subdirectories at all (btrfs shows 1).
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_nlink != 1 {
                st.st_nlink = dir_nlink(self.list_at(at, obj, &state)?.iter().map(|l| l.kind));
            }
            Ok((What::At { at, obj, state }, st))
        })?;
        Ok(entry(st, IMMUTABLE_TTL))
    }

    pub(super) fn view_getattr(&self, ino: InodeNo) -> Result<Attr> {
        let node = self.view(ino)?;
        self.current(&node)?;
        if let What::Deleted { dir } = node.what {
            let st = self.deleted_dir_stat(dir.into(), ino)?;
            return Ok(Attr { ino, st });
        }
        Ok(Attr { ino, st: node.st })
    }

    /// A link's target is read with no permission on the link itself, but
    /// only along a way the caller may search now, as every other read of
    /// the past (`view_permits` with nothing wanted of the link).
    pub(super) fn view_readlink(&self, caller: &Caller, ino: InodeNo) -> Result<Vec<u8>> {
        let node = self.view(ino)?;
        self.view_permits(caller, &node, 0)?;
        match &node.what {
            What::At {
                state: State::Hist { v },
                ..
            } => match &v.content {
                Content::Symlink { target } => Ok(target.clone()),
                _ => Err(errno(libc::EINVAL)),
            },
            What::At {
                state: State::Live { inode },
                ..
            } if inode.kind == libc::S_IFLNK => {
                Ok(sys::readlink_fd(self.inodes.fd(inode)?.as_fd())?)
            }
            _ => Err(errno(libc::EINVAL)),
        }
    }

    pub(super) fn view_getxattr(
        &self,
        caller: &Caller,
        ino: InodeNo,
        name: &OsStr,
        size: u32,
    ) -> Result<Xattr> {
        // The mount's own names are no more the file's in the past.
        self.refuse_union_xattr(name)?;
        let node = self.view(ino)?;
        if withheld_xattr(&node.st, name.as_bytes()) {
            return Err(errno(libc::ENODATA));
        }
        if name.as_bytes().starts_with(b"user.") {
            // Reading a user attribute needs read permission (the kernel
            // checked it as then): now too, as an open of the view does.
            self.view_permits(caller, &node, crate::history::access::READ)?;
        }
        match &node.what {
            What::At {
                state: State::Live { inode },
                ..
            } => Xattr::read(caller, self.inodes.fd(inode)?.as_fd(), name, size),
            what => {
                let value = recorded_xattrs(what, caller)
                    .find(|(n, _)| n.as_slice() == name.as_bytes())
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| errno(libc::ENODATA))?;
                Xattr::of_value(value, size)
            }
        }
    }

    pub(super) fn view_listxattr(&self, caller: &Caller, ino: InodeNo, size: u32) -> Result<Xattr> {
        let node = self.view(ino)?;
        match &node.what {
            What::At {
                state: State::Live { inode },
                ..
            } => self.listxattr_shown(caller, self.inodes.fd(inode)?.as_fd(), size),
            what => {
                let mut list = Vec::new();
                let shown = recorded_xattrs(what, caller)
                    .filter(|(n, _)| !self.hidden_xattr(n) && !withheld_xattr(&node.st, n));
                for (name, _) in shown {
                    list.extend_from_slice(name);
                    list.push(0);
                }
                Xattr::of_value(list, size)
            }
        }
    }
}

/// The attributes a view withholds as a `nosuid,nodev` mount ignores
/// them (`shown_mode`): file capabilities, which exec would grant as
/// set-ID bits would, and a device node's access ACL, which the kernel
/// checks instead of the mode bits shown.
fn withheld_xattr(st: &Stat, name: &[u8]) -> bool {
    let device = matches!(st.st_mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK);
    name == b"security.capability" || (device && name == b"system.posix_acl_access")
}

/// The xattrs a version recorded that `caller` may see (`trusted.*` is
/// root's alone, as natively).
fn recorded_xattrs<'a>(
    what: &'a What,
    caller: &Caller,
) -> impl Iterator<Item = &'a (Vec<u8>, Vec<u8>)> + 'a {
    let root = caller.uid == 0;
    let list: &'a [(Vec<u8>, Vec<u8>)] = match what {
        What::At {
            state: State::Hist { v },
            ..
        } => &v.xattrs,
        _ => &[],
    };
    list.iter()
        .filter(move |(n, _)| root || !n.starts_with(b"trusted."))
}
