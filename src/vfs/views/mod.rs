//! Time travel in the name space (docs/ARCHITECTURE.md "Time travel"):
//! `.history/` at the mount root, per-file version names in live
//! directories (`f;3`, `f;-1`, `f;@T`) and deleted entries (`DIR/;deleted`).
//!
//! A view node is an object as it was at an instant (a sequence number).
//! Its inode number packs the instant's slot and the object id, so the same
//! object at the same instant always has the same number (hard links stay
//! links) and two instants never share one (`diff -r` compares them).
//! Nothing here changes anything: every modifying call on a view is EROFS.
//! Permission checks are the kernel's (`default_permissions`), made against
//! the attributes shown, which are the object's attributes at the instant,
//! plus the daemon's check of the object as it is now at each open
//! (`access.rs`).

mod access;
mod read;
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
/// persistent map allocates live numbers upward from 1.
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

pub fn is_view(ino: InodeNo) -> bool {
    ino.0 & VIEW_BIT != 0
}

pub fn is_view_fh(fh: u64) -> bool {
    fh & VIEW_BIT != 0
}

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
}

struct Reader {
    obj: ObjectId,
    at: Seq,
    source: Source,
}

enum Source {
    /// The live file, while it still matches the state at the instant.
    Head {
        fd: OwnedFd,
        expect: Attrs,
        latest: Option<Seq>,
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

fn erofs<T>() -> Result<T> {
    Err(errno(libc::EROFS))
}

fn enoent<T>(why: impl std::fmt::Display) -> Result<T> {
    tracing::debug!("history view: {why}");
    Err(errno(libc::ENOENT))
}

fn past_err(e: past::Error) -> VfsError {
    match e {
        past::Error::NotFound(m) | past::Error::Usage(m) => {
            tracing::debug!("history view: {m}");
            errno(libc::ENOENT)
        }
        past::Error::Denied(_) => errno(libc::EACCES),
        past::Error::NotPermitted(_) => errno(libc::EPERM),
        past::Error::History(h) => VfsError::History(h),
        past::Error::Io(e) => VfsError::Io(e),
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

    fn with_past<T>(&self, f: impl FnOnce(&Past) -> Result<T>) -> Result<T> {
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
        let (what, st) = make()?;
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
            Node::Live { fd, st, .. } => {
                let inode = self.inodes.acquire_new(fd, &st, false)?;
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
            let state = State::Hist { v };
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                // A directory's versions are not recorded when entries
                // come and go: its link count is that of its listing.
                st.st_nlink = dir_nlink(self.list_at(at, obj, &state)?.iter().map(|l| l.kind));
            }
            Ok((What::At { at, obj, state }, st))
        })?;
        Ok(entry(st, IMMUTABLE_TTL))
    }

    /// `name` in the mount root, if it is the history directory.
    pub(super) fn lookup_top(&self, caller: &Caller, name: &OsStr) -> Option<Result<Entry>> {
        if !self.views_on() || name != self.cfg.views.dir_name {
            return None;
        }
        if self.hidden_from(caller) {
            return Some(enoent("history is hidden from non-root users (audit)"));
        }
        Some(
            self.hold_view(TOP, || {
                let root = sys::fstat(self.branch.root_fd())?;
                let mut st = sys::zeroed_stat();
                st.st_ino = TOP.0;
                st.st_mode = libc::S_IFDIR | if self.cfg.views.audit { 0o500 } else { 0o555 };
                st.st_nlink = 2;
                st.st_blksize = 4096;
                (st.st_atime, st.st_mtime, st.st_ctime) =
                    (root.st_ctime, root.st_ctime, root.st_ctime);
                Ok((What::Top, st))
            })
            // Under audit every lookup of the name is checked against its
            // caller.
            .map(|st| {
                let ttl = if self.cfg.views.audit {
                    Duration::ZERO
                } else {
                    IMMUTABLE_TTL
                };
                entry(st, ttl)
            }),
        )
    }

    /// A version name (`f;3`, `f;-1`, `f;@T`) or `;deleted` in the live
    /// directory `parent`, tried only when no real entry has that name.
    pub(super) fn lookup_version_name(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
    ) -> Option<Result<Entry>> {
        let sep = &self.cfg.views.sep;
        let bytes = name.as_bytes();
        if !self.views_on() || sep.is_empty() {
            return None;
        }
        let cut = bytes
            .windows(sep.len())
            .rposition(|w| w == sep.as_slice())?;
        let (base, suffix) = (&bytes[..cut], &bytes[cut + sep.len()..]);
        if self.hidden_from(caller) {
            return Some(enoent("history is hidden from non-root users (audit)"));
        }
        if base.is_empty() && suffix == b"deleted" {
            return Some(self.lookup_deleted_dir(parent));
        }
        if base.is_empty() || suffix.is_empty() {
            return None;
        }
        Some(self.lookup_version(parent, base, suffix))
    }

    fn live_path(&self, dir: InodeNo) -> Result<Vec<Vec<u8>>> {
        let mut parts = Vec::new();
        let mut cur = dir;
        while cur != InodeNo::ROOT {
            let Some((parent, name)) = self.inodes.get(cur)?.name() else {
                return enoent(format!("no known path to inode {}", cur.0));
            };
            parts.push(name);
            cur = parent;
            if parts.len() > 4096 {
                return Err(errno(libc::ELOOP));
            }
        }
        parts.reverse();
        Ok(parts)
    }

    fn lookup_version(&self, parent: InodeNo, base: &[u8], suffix: &[u8]) -> Result<Entry> {
        let mut path = self.live_path(parent)?;
        path.push(base.to_vec());
        self.settle_capture();
        let text = std::str::from_utf8(suffix).map_err(|_| errno(libc::ENOENT))?;
        let number = text.strip_prefix('-').unwrap_or(text);
        let (at, node) = if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) {
            let n: i64 = text.parse().map_err(|_| errno(libc::ENOENT))?;
            let node = self.with_past(|p| p.nth_version(&path, n).map_err(past_err))?;
            let Node::Hist { seq, .. } = &node else {
                return Err(VfsError::WrongKind);
            };
            (*seq, node)
        } else if suffix.starts_with(b"@") {
            let Some((at, _)) = parse_instant(suffix) else {
                return enoent(format!("'{text}' is not a version or an instant"));
            };
            self.with_past(|p| {
                let (seq, _) = p.resolve_at(&at).map_err(past_err)?;
                // A version name follows the file: where the path named
                // nothing then, the file it names now, where it was then.
                let mut node = p.resolve(&path, seq).map_err(past_err)?;
                if node.is_none() {
                    let (now, _) = p.resolve_at(&At::Now).map_err(past_err)?;
                    if let Some(then) = p.follow(&path, now, seq).map_err(past_err)? {
                        node = p.resolve(&then, seq).map_err(past_err)?;
                    }
                }
                match node {
                    Some(node) => Ok((seq, node)),
                    None => enoent(format!(
                        "{} did not exist at #{seq}",
                        past::show_path(&path)
                    )),
                }
            })?
        } else {
            return enoent(format!("'{text}' is not a version or an instant"));
        };
        // The name's meaning moves as versions are added, and a real file
        // created with the name must win at once: never cached.
        let e = self.node_at(at, node)?;
        Ok(Entry {
            entry_ttl: Some(Duration::ZERO),
            ..e
        })
    }

    fn lookup_deleted_dir(&self, parent: InodeNo) -> Result<Entry> {
        let dir = self.inodes.node(parent)?;
        if !dir.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let ino = InodeNo(VIEW_BIT | (DELETED_SLOT << OBJ_BITS) | (parent.0 & OBJ_MASK));
        // Its attributes follow the live directory and what is deleted
        // (computed once: listing the deleted entries reads history).
        let st = self.deleted_dir_stat(parent, ino)?;
        self.hold_view(ino, || {
            Ok((
                What::Deleted {
                    dir: parent.object(),
                },
                st,
            ))
        })?;
        Ok(entry(st, Duration::ZERO))
    }

    fn deleted_dir_stat(&self, dir: InodeNo, ino: InodeNo) -> Result<Stat> {
        let live = sys::fstat(self.inodes.node(dir)?.fd())?;
        let mut st = live;
        st.st_ino = ino.0;
        st.st_mode = libc::S_IFDIR | (live.st_mode & 0o555);
        let deleted = self.deleted_entries(dir.object())?;
        st.st_nlink = dir_nlink(deleted.iter().map(|(_, _, n)| n.mode() & libc::S_IFMT));
        Ok(st)
    }

    /// Lookup inside a view directory.
    pub(super) fn view_lookup(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
    ) -> Result<Entry> {
        if self.hidden_from(caller) {
            return enoent("history is hidden from non-root users (audit)");
        }
        let node = self.view(parent)?;
        match &node.what {
            What::Top => self.lookup_instant(name.as_bytes()),
            What::Deleted { dir } => self.lookup_deleted(*dir, name.as_bytes()),
            What::At { at, obj, state } => {
                if node.st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    return Err(errno(libc::ENOTDIR));
                }
                let cur = self.cur_of(*obj, state)?;
                let found = self.with_past(|p| {
                    let Some(next) = p
                        .step(cur, name.as_bytes(), *at, *obj == ROOT)
                        .map_err(past_err)?
                    else {
                        return Ok(None);
                    };
                    p.finish(next, *at).map_err(past_err)
                })?;
                match found {
                    Some(n) => self.node_at(*at, n),
                    None => Err(errno(libc::ENOENT)),
                }
            }
        }
    }

    fn cur_of(&self, obj: ObjectId, state: &State) -> Result<Cur> {
        Ok(match state {
            State::Hist { .. } => Cur::Hist(obj),
            State::Live { inode } => {
                let (fd, st) = self.live_path_fd(inode)?;
                Cur::Live {
                    obj: Some(obj),
                    fd,
                    st,
                }
            }
        })
    }

    /// A fresh O_PATH descriptor of a live inode, with its attributes now.
    fn live_path_fd(&self, inode: &Inode) -> Result<(OwnedFd, Stat)> {
        let fd = sys::reopen(self.inodes.fd(inode)?.as_fd(), libc::O_PATH)?;
        let st = sys::fstat(fd.as_fd())?;
        Ok((fd, st))
    }

    fn lookup_instant(&self, name: &[u8]) -> Result<Entry> {
        let Some((at, fixed)) = parse_instant(name) else {
            return enoent(format!(
                "'{}' is not an instant (@TIME, @-10m, @TAG or @SEQ)",
                past::name_str(name)
            ));
        };
        if !fixed {
            self.settle_capture();
        }
        let node = self.with_past(|p| {
            let (seq, _) = p.resolve_at(&at).map_err(past_err)?;
            let node = p.resolve(&[], seq).map_err(past_err)?;
            Ok((seq, node))
        })?;
        let (seq, Some(node)) = node else {
            return enoent("the root did not exist");
        };
        let e = self.node_at(seq, node)?;
        Ok(Entry {
            entry_ttl: Some(if fixed { IMMUTABLE_TTL } else { Duration::ZERO }),
            ..e
        })
    }

    /// What was deleted in the live directory `dir`: each name's last
    /// object, as it was just before its removal began.
    fn deleted_entries(&self, dir: ObjectId) -> Result<Vec<(Vec<u8>, Seq, Node)>> {
        let live = self.inodes.node(dir.into())?;
        self.settle_capture();
        self.with_past(|p| {
            let Some(((_, _), (last, _))) = p.history.bounds().map_err(|e| past_err(e.into()))?
            else {
                return Ok(Vec::new());
            };
            let present = |n: &[u8]| {
                sys::cstr(OsStr::from_bytes(n))
                    .and_then(|c| sys::fstatat(live.fd(), &c))
                    .is_ok()
            };
            let mut out = Vec::new();
            for d in p.deleted_in(dir, last, &present).map_err(past_err)? {
                let at = p.before_removal(&d).map_err(past_err)?;
                if let Some(node) = p.finish(Cur::Hist(d.obj), at).map_err(past_err)? {
                    out.push((d.name, at, node));
                }
            }
            Ok(out)
        })
    }

    fn lookup_deleted(&self, dir: ObjectId, name: &[u8]) -> Result<Entry> {
        for (n, at, node) in self.deleted_entries(dir)? {
            if n == name {
                return self.node_at(at, node);
            }
        }
        Err(errno(libc::ENOENT))
    }

    /// `.history/`'s entries: tags, and the instants at the ends of recent
    /// hours and days in which something changed.
    fn top_entries(&self) -> Result<Vec<Vec<u8>>> {
        let h = self.history()?;
        let hist = |e: crate::history::HistoryError| past_err(e.into());
        let mut names: Vec<Vec<u8>> = Vec::new();
        for (tag, _) in h.tags().map_err(hist)? {
            names.push(format!("@{tag}").into_bytes());
        }
        let now = crate::history::now_ns();
        const HOUR: i64 = 3_600_000_000_000;
        let mut seen = std::collections::HashSet::new();
        let mut boundaries: Vec<i64> = (0..LISTED_HOURS).map(|k| (now / HOUR - k) * HOUR).collect();
        boundaries.extend((1..=LISTED_DAYS).filter_map(|k| spec::midnight_days_back(k - 1).ok()));
        boundaries.sort_unstable_by(|a, b| b.cmp(a));
        boundaries.dedup();
        let mut instants = Vec::new();
        for b in boundaries {
            if b > now {
                continue;
            }
            let Some(seq) = h.seq_at_time(b).map_err(hist)? else {
                break;
            };
            if seen.insert(seq) {
                instants.push(b);
            }
        }
        instants.reverse();
        names.extend(
            instants
                .into_iter()
                .map(|t| format!("@{}", spec::minute(t)).into_bytes()),
        );
        Ok(names)
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

    pub(super) fn view_readlink(&self, ino: InodeNo) -> Result<Vec<u8>> {
        let node = self.view(ino)?;
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
        let node = self.view(ino)?;
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
            } => Xattr::list(caller, self.inodes.fd(inode)?.as_fd(), size),
            what => {
                let mut list = Vec::new();
                for (name, _) in recorded_xattrs(what, caller) {
                    list.extend_from_slice(name);
                    list.push(0);
                }
                Xattr::of_value(list, size)
            }
        }
    }

    /// A directory at an instant never changes (a removal from history
    /// invalidates what the kernel holds, see `removal.rs`); `.history`
    /// and `;deleted` change with every tag, hour and deletion.
    pub(in crate::vfs) fn view_dir_cache(&self, ino: InodeNo) -> DirCache {
        match self.view(ino).map(|n| matches!(n.what, What::At { .. })) {
            Ok(true) => DirCache::Keep,
            _ => DirCache::Off,
        }
    }

    pub(super) fn view_opendir(&self, caller: &Caller, ino: InodeNo) -> Result<u64> {
        let node = self.view(ino)?;
        self.current(&node)?;
        self.view_permits(caller, &node, crate::history::access::READ)?;
        let entries = match &node.what {
            What::Top => {
                let mut out = Vec::new();
                for name in self.top_entries()? {
                    match self.lookup_instant(&name) {
                        Ok(e) => {
                            self.view_forget(e.attr.ino, 1);
                            out.push(Listed {
                                name,
                                ino: e.attr.ino,
                                kind: libc::S_IFDIR,
                                hist: None,
                            });
                        }
                        Err(e) => {
                            tracing::debug!("history view: listing {}: {e}", past::name_str(&name))
                        }
                    }
                }
                out
            }
            What::Deleted { dir } => {
                let mut out = Vec::new();
                for (name, at, node) in self.deleted_entries(*dir)? {
                    out.push(self.listed(name, at, node)?);
                }
                out
            }
            What::At { at, obj, state } => {
                if node.st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    return Err(errno(libc::ENOTDIR));
                }
                self.list_at(*at, *obj, state)?
            }
        };
        Ok(self.insert_view_handle(ViewHandle::Dir { ino, entries }))
    }

    /// A directory entry for `node`, shown at `at`.
    fn listed(&self, name: Vec<u8>, at: Seq, node: Node) -> Result<Listed> {
        let kind = node.mode() & libc::S_IFMT;
        let (obj, hist) = match node {
            Node::Hist { obj, v, .. } => (obj, Some((at, obj, Arc::new(v)))),
            Node::Live { obj: Some(o), .. } => (o, None),
            Node::Live { st, .. } => (
                self.inodes.number_for(self.inodes.key_of(&st))?.object(),
                None,
            ),
        };
        Ok(Listed {
            name,
            ino: self.view_number(at, obj)?,
            kind,
            hist,
        })
    }

    fn list_at(&self, at: Seq, obj: ObjectId, state: &State) -> Result<Vec<Listed>> {
        let dir = match state {
            State::Hist { v } => Node::Hist {
                obj,
                seq: at,
                v: (**v).clone(),
            },
            State::Live { inode } => {
                let (fd, st) = self.live_path_fd(inode)?;
                Node::Live {
                    obj: Some(obj),
                    fd,
                    st,
                }
            }
        };
        self.with_past(|p| {
            let names = p.names(&dir, at, obj == ROOT).map_err(past_err)?;
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let cur = self.cur_of(obj, state)?;
                let Some(next) = p.step(cur, &name, at, obj == ROOT).map_err(past_err)? else {
                    continue;
                };
                let Some(child) = p.finish(next, at).map_err(past_err)? else {
                    continue;
                };
                out.push(self.listed(name, at, child)?);
            }
            Ok(out)
        })
    }

    /// Feeds a view directory's entries from `offset` on to `add`; with
    /// `plus`, each is looked up (the kernel takes a reference).
    pub(super) fn view_readdir(
        &self,
        caller: &Caller,
        fh: u64,
        offset: i64,
        mut add: impl FnMut(&DirEntry<'_>, Option<&Entry>) -> bool,
        plus: bool,
    ) -> Result<()> {
        let handle = self.view_handle(fh)?;
        let ViewHandle::Dir { ino: dir, entries } = &*handle else {
            return Err(errno(libc::ENOTDIR));
        };
        let start = offset.max(0) as usize;
        let dots = [b".".as_slice(), b"..".as_slice()];
        for i in start..entries.len() + 2 {
            let (name, ino, kind, hist) = match i {
                0 | 1 => (dots[i], *dir, libc::S_IFDIR, None),
                _ => {
                    let l = &entries[i - 2];
                    (l.name.as_slice(), l.ino, l.kind, l.hist.as_ref())
                }
            };
            let dirent = DirEntry {
                ino,
                offset: i as i64 + 1,
                kind,
                name: OsStr::from_bytes(name),
            };
            if !plus || i < 2 {
                if add(&dirent, None) {
                    break;
                }
                continue;
            }
            let found = match hist {
                Some((at, obj, v)) => self.hist_at(*at, *obj, v.clone()),
                None => self.view_lookup(caller, *dir, OsStr::from_bytes(name)),
            }
            .inspect(|e| self.note_view_name(*dir, OsStr::from_bytes(name), e.attr.ino));
            let e = match found {
                Ok(e) => e,
                Err(e) if e.errno_is(libc::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            if add(&dirent, Some(&e)) {
                self.view_forget(e.attr.ino, 1);
                break;
            }
        }
        Ok(())
    }
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
