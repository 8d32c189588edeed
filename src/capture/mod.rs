//! Capture: turns changes made through the mount into versions.
//!
//! Owns: the rule of what makes a version (one per open→close write
//! session, one per metadata change, the final state at unlink, both sides
//! of a rename), copy-on-change (identical content makes no version), lazy
//! baselines (an object that predates history is recorded just before its
//! first change, a directory together with its whole listing), detection
//! of changes made behind the mount's back, and the ingest worker that
//! builds a session's version after close, off the caller's path.
//! Uses: `history`, `store` (through history), `sys` (reading files,
//! xattrs, process names). Must not use the vfs: the vfs hands in a `Tree`
//! to reach live objects.

mod branch_changes;
mod clones;
pub mod retention;
mod state;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::history::content;
use crate::history::{
    Attrs, Binding, Cause, Content, Dirent, Draft, History, HistoryError, Manifest, ObjectId, Seq,
    Time, Version, Who, ROOT,
};
use crate::sys::{self, Stat};
use branch_changes::Unseen;
use state::Job;
pub use state::Known;

pub type Result<T> = std::result::Result<T, CaptureError>;

/// The deepest directory a baseline walks into: deeper means a loop.
const MAX_DEPTH: usize = 4096;

/// How long a query waits for the release that follows a close(2) when
/// other write handles of the file stay open (the release may be theirs,
/// far off).
const CLOSE_GRACE: Duration = Duration::from_millis(200);

/// How long a query waits for the release that follows the close(2) of a
/// file's last write handle: the kernel sends it after close returns, as a
/// background request that a loaded machine can hold back well past
/// `CLOSE_GRACE` (a CI run saw `f;-1` miss the version just closed).
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Files from this size on, written through the daemon, get versions built
/// from the ranges written (docs/ARCHITECTURE.md "Per-open write path").
/// Measured: a sqlite commit on a 2-15 MiB database took 9-25 ms when
/// each fsync's version read the file whole, 6-7 ms tracked; 300 appends
/// to a 1 MiB log 0.59 s against 0.15 s. Below it a whole read costs
/// about what a few writes through the daemon do.
pub const TRACK_MIN: u64 = 1 << 20;

/// `TRACK_MIN`, or `CHRONOFS_TRACK_MIN` (bytes) for benchmarks that
/// compare thresholds.
pub fn track_min() -> u64 {
    static FORCED: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    FORCED
        .get_or_init(|| {
            std::env::var("CHRONOFS_TRACK_MIN")
                .ok()
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(TRACK_MIN)
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A directory deeper than any walk should meet: the live tree's
    /// parent links form a loop.
    #[error("directory nesting deeper than {0} levels")]
    TooDeep(usize),
    /// A tracked file's previous manifest, which its new version is built
    /// on, cannot be read (yet): the file is read whole next time.
    #[error("the previous version's manifest is not readable yet")]
    PreviousUnreadable,
}

impl CaptureError {
    /// No wildcard arm: a new variant must choose its errno here.
    pub fn errno(&self) -> i32 {
        match self {
            CaptureError::History(e) => e.errno(),
            CaptureError::Io(e) => crate::store::io_errno(e),
            CaptureError::TooDeep(_) => libc::ELOOP,
            // The next try reads the whole file instead.
            CaptureError::PreviousUnreadable => libc::EAGAIN,
        }
    }
}

/// The store's file system has no room (or the quota is spent).
fn is_full(errno: i32) -> bool {
    errno == libc::ENOSPC || errno == libc::EDQUOT
}

#[cfg(test)]
mod errno {
    use super::*;

    #[test]
    fn every_capture_error_has_its_errno() {
        let table = [
            (
                CaptureError::History(HistoryError::Corrupt(String::new())),
                libc::EUCLEAN,
            ),
            (
                CaptureError::Io(io::Error::from_raw_os_error(libc::ESTALE)),
                libc::ESTALE,
            ),
            (CaptureError::TooDeep(MAX_DEPTH), libc::ELOOP),
            (CaptureError::PreviousUnreadable, libc::EAGAIN),
        ];
        for (e, errno) in table {
            assert_eq!(e.errno(), errno, "{e:?}");
        }
    }
}

/// A live file's content as capture reads it: its backing descriptor
/// (attributes, xattrs, whether it is open for writing elsewhere) and its
/// bytes. A clone's file that still shares its base's bytes reads them
/// through the vfs, not from the descriptor.
pub trait Readable: Send + Sync {
    fn fd(&self) -> BorrowedFd<'_>;

    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        sys::pread(self.fd(), buf, off)
    }

    /// The ranges holding data (the rest reads as zeros).
    fn data_ranges(&self, size: u64) -> io::Result<Vec<(u64, u64)>> {
        sys::data_ranges(self.fd(), size)
    }

    fn xattrs(&self) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        sys::xattrs_of(self.fd())
    }
}

impl Readable for OwnedFd {
    fn fd(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

/// The live objects capture reads from, as the vfs sees them.
pub trait Tree {
    fn stat(&self, obj: ObjectId) -> io::Result<Stat>;
    /// The object's content for reading (as the daemon).
    fn open_read(&self, obj: ObjectId) -> io::Result<Box<dyn Readable>>;
    fn readlink(&self, obj: ObjectId) -> io::Result<Vec<u8>>;
    fn xattrs(&self, obj: ObjectId) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// The name the object was last reached by: (parent, name).
    fn parent_of(&self, obj: ObjectId) -> Option<(ObjectId, Vec<u8>)>;
    /// The live entries of a directory with their object ids and bindings.
    fn list(&self, dir: ObjectId) -> io::Result<Vec<(Vec<u8>, Binding)>>;
    fn binding(&self, obj: ObjectId) -> Option<Binding>;
}

/// Capture settings (mount options).
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// A file held open for writing gets a version at least this often.
    pub interval: Duration,
    /// Every write() is its own version (Wayback's comprehensive mode).
    pub every_write: bool,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            interval: Duration::from_secs(60),
            every_write: false,
        }
    }
}

/// A write open between `Capture::session_opening` and
/// `Capture::session_opened`. If it joined an open session, it holds that
/// session open; dropped unused (the open failed), it lets go.
#[must_use]
pub struct Opening<'a> {
    capture: &'a Capture,
    obj: ObjectId,
    joined: bool,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if self.joined {
            self.capture.opener_gone(self.obj);
        }
    }
}

pub struct Capture {
    history: Arc<History>,
    cfg: CaptureConfig,
    state: Mutex<state::Objects>,
    /// Signalled when an object's queued ingests finish.
    idle: Condvar,
    jobs: state::JobQueue,
    /// Serializes baselines so one directory is never listed twice.
    baseline_lock: Mutex<()>,
    comms: Mutex<HashMap<u32, String>>,
    /// The version policy in force (what is versioned at all).
    policy: Arc<retention::PolicyCell>,
    /// The live name of an object (parent, name), from whoever serves the
    /// tree: for the path a policy rule matches.
    namer: parking_lot::RwLock<Option<Namer>>,
    /// The link count the mount shows for an object, where it differs
    /// from its backing file's (a hard-link index's own link).
    shown_links: parking_lot::RwLock<Option<LinkCount>>,
    /// Owner and group names for policy rules.
    owner_names: Mutex<retention::Names>,
    /// The union's branch changes in this mount, to date what they did.
    changes: branch_changes::Changes,
}

/// Whether a file whose last write handle closed is still open for
/// writing elsewhere (`sys::open_for_writing`); when that cannot be told,
/// the session ends as it always did at its last release.
fn written_elsewhere(reader: std::os::fd::BorrowedFd<'_>) -> bool {
    sys::open_for_writing(reader).unwrap_or_else(|e| {
        tracing::debug!("cannot tell whether a closed file is still written: {e}");
        false
    })
}

/// Why a directory's entries are compared with history's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DirCheck {
    /// Looked up or read; history knows it already this mount.
    Seen,
    /// Looked up or read for the first time since mount.
    SeenFirst,
    /// Its union's branch set changed.
    BranchChange,
    /// The mount changed its entries itself.
    Applied,
}

/// Finds an object's live name: (parent, name).
pub type Namer = Box<dyn Fn(ObjectId) -> Option<(ObjectId, Vec<u8>)> + Send + Sync>;

/// The link count an object shows, if the backing file's is not it.
/// Must not call into capture.
pub type LinkCount = Box<dyn Fn(ObjectId) -> Option<u32> + Send + Sync>;

/// Converts a stat into recorded attributes.
pub fn attrs_of(st: &Stat) -> Attrs {
    let t = |sec: i64, nsec: i64| Time {
        sec,
        nsec: nsec as u32,
    };
    Attrs {
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
        nlink: st.st_nlink as u32,
        rdev: st.st_rdev,
        atime: t(st.st_atime, st.st_atime_nsec),
        mtime: t(st.st_mtime, st.st_mtime_nsec),
        ctime: t(st.st_ctime, st.st_ctime_nsec),
        backing_dev: st.st_dev,
        backing_ino: st.st_ino,
    }
}

/// The zstd level for a file's content under `resolved` (no policy: the
/// store's default), or `None` if the policy does not keep it.
fn content_level(resolved: Option<&crate::policy::Resolved>) -> Option<i32> {
    match resolved {
        None => Some(crate::store::chunks::ZSTD_LEVEL),
        Some(r) => r.version.then_some(i32::from(r.compression)),
    }
}

/// Local wall-clock time at `ns` (for policy rules by time of day).
fn local_time(ns: i64) -> jiff::civil::DateTime {
    match jiff::Timestamp::from_nanosecond(i128::from(ns)) {
        Ok(t) => t.to_zoned(crate::history::spec::local_zone()).datetime(),
        Err(_) => jiff::Zoned::now().datetime(),
    }
}

fn empty_manifest() -> Manifest {
    Manifest::default()
}

impl Capture {
    pub fn new(
        history: Arc<History>,
        cfg: CaptureConfig,
        policy: Arc<retention::PolicyCell>,
    ) -> Arc<Capture> {
        let capture = Arc::new(Capture {
            history,
            cfg,
            state: Mutex::new(state::Objects::default()),
            idle: Condvar::new(),
            jobs: state::JobQueue::default(),
            baseline_lock: Mutex::new(()),
            comms: Mutex::new(HashMap::new()),
            policy,
            namer: parking_lot::RwLock::new(None),
            shown_links: parking_lot::RwLock::new(None),
            owner_names: Mutex::new(retention::Names::default()),
            changes: branch_changes::Changes::default(),
        });
        let worker = Arc::downgrade(&capture);
        let spawned = std::thread::Builder::new()
            .name("capture-ingest".into())
            .spawn(move || state::worker_loop(worker));
        if let Err(e) = spawned {
            tracing::error!("cannot start the ingest worker ({e}); sessions are ingested at close");
            capture.jobs.disable();
        }
        capture
    }

    /// How to find objects' live names (for path rules of the policy).
    pub fn set_namer(&self, namer: Namer) {
        *self.namer.write() = Some(namer);
    }

    /// How to find the link count an object shows: versions record it,
    /// not the backing file's, which counts a hard-link index's entry
    /// too (a clone's or a union's file with several names).
    pub fn set_shown_links(&self, links: LinkCount) {
        *self.shown_links.write() = Some(links);
    }

    fn record_shown_links(&self, draft: &mut Draft) {
        let links = self.shown_links.read();
        let Some(links) = links.as_ref() else {
            return;
        };
        for (obj, v) in &mut draft.versions {
            let linked = v.attrs.mode & libc::S_IFMT != libc::S_IFDIR && v.attrs.nlink > 1;
            if let Some(n) = linked.then(|| links(*obj)).flatten() {
                v.attrs.nlink = n;
            }
        }
    }

    /// The object's live path from the mount root, if it can be named:
    /// its bytes, for policy globs to match exactly.
    fn live_path(&self, obj: ObjectId) -> Option<Vec<u8>> {
        let namer = self.namer.read();
        let namer = namer.as_ref()?;
        let mut parts = Vec::new();
        let mut cur = obj;
        while cur != ROOT {
            let (parent, name) = namer(cur)?;
            parts.push(name);
            cur = parent;
            if parts.len() > 4096 {
                return None;
            }
        }
        parts.reverse();
        Some(parts.join(&b'/'))
    }

    /// The zstd level the policy gives the content of file `obj` (in
    /// state `st`) as changed by `who` now, or `None` if it does not keep
    /// the content at all. Decided when a version is built, so a policy
    /// reload applies from the next change on.
    fn content_policy(&self, obj: ObjectId, st: &Stat, who: &Who) -> Option<i32> {
        content_level(self.resolve(obj, st, who).as_ref())
    }

    /// Whether each write to file `obj` (open as `fd`, by `who`) is to be
    /// a version, so its writes must come through the daemon: the mount
    /// option, or a policy rule — evaluated (on the caller's open) only
    /// when some policy file sets that mode.
    pub fn every_write_for(
        &self,
        obj: ObjectId,
        fd: std::os::fd::BorrowedFd<'_>,
        who: impl FnOnce() -> Who,
    ) -> bool {
        use crate::policy::Capture::EveryWrite;
        if self.cfg.every_write {
            return true;
        }
        if !self.policy.get().may_capture(EveryWrite) {
            return false;
        }
        let Ok(st) = sys::fstat(fd) else {
            return false;
        };
        self.resolve(obj, &st, &who())
            .is_some_and(|r| r.capture == EveryWrite)
    }

    /// The policy's settings for file `obj`, or `None` when no policy
    /// file sets anything (the common case costs no evaluation).
    fn resolve(&self, obj: ObjectId, st: &Stat, who: &Who) -> Option<crate::policy::Resolved> {
        let policy = self.policy.get();
        if policy.is_trivial() || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        let path = self.live_path(obj).unwrap_or_default();
        let (owner, group) = {
            let mut names = self.owner_names.lock();
            names.fill(st.st_uid, st.st_gid);
            let owned = |n: Option<&str>| n.map(str::to_owned);
            (owned(names.user(st.st_uid)), owned(names.group(st.st_gid)))
        };
        let subject = crate::policy::Subject {
            path: &path,
            is_dir: false,
            size: st.st_size as u64,
            owner_uid: st.st_uid,
            owner_gid: st.st_gid,
            owner_name: owner.as_deref(),
            group_name: group.as_deref(),
            process: (!who.comm.is_empty()).then_some(who.comm.as_str()),
            local_time: Some(local_time(self.history.now_ns())),
        };
        Some(policy.resolve(&subject))
    }

    /// Who is making a change: the caller and its process name.
    pub fn who(&self, uid: u32, gid: u32, pid: u32) -> Who {
        let comm = {
            let mut comms = self.comms.lock();
            if comms.len() > 4096 {
                comms.clear();
            }
            comms
                .entry(pid)
                .or_insert_with(|| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .map(|s| s.trim_end().to_string())
                        .unwrap_or_default()
                })
                .clone()
        };
        Who {
            uid,
            gid,
            pid,
            comm,
        }
    }

    /// What history holds as the newest state of `obj`, cached.
    /// Whether history's newest version of `obj` records its removal, or
    /// history has none (purged).
    fn removed_from_history(&self, obj: ObjectId) -> Result<bool> {
        Ok(self.history.latest(obj)?.is_none_or(|(_, v)| v.gone))
    }

    fn known(&self, obj: ObjectId) -> Result<Option<Arc<Known>>> {
        if let Some(k) = self.state.lock().known(obj) {
            return Ok(Some(k));
        }
        let Some((_, v)) = self.history.latest(obj)? else {
            return Ok(None);
        };
        let k = Arc::new(Known::from_version(&v));
        self.state.lock().remember(obj, k.clone());
        Ok(Some(k))
    }

    fn commit(&self, mut draft: Draft) -> Result<()> {
        self.record_shown_links(&mut draft);
        let mut remembered = Vec::new();
        for (obj, v) in &draft.versions {
            remembered.push((*obj, v.clone()));
        }
        self.history.commit(draft)?;
        let mut st = self.state.lock();
        for (obj, v) in remembered {
            if v.gone {
                st.forget(obj);
            } else {
                st.remember(obj, Arc::new(Known::from_version(&v)));
            }
        }
        Ok(())
    }

    /// Before `obj` changes: make sure history holds its current state
    /// (its baseline if history never saw it, or what changed behind the
    /// mount's back), so the change can never lose it.
    pub fn before_change(&self, tree: &dyn Tree, obj: ObjectId) -> Result<()> {
        self.history.writable()?;
        self.wait_ingests(obj);
        if self.state.lock().has_writers(obj) {
            // The session's opening already secured the prior state.
            return Ok(());
        }
        let st = tree.stat(obj)?;
        let attrs = attrs_of(&st);
        match self.known(obj)? {
            Some(k) if k.verified.same_state(&attrs) || k.attrs.same_state(&attrs) => Ok(()),
            Some(_) => self.record_state(
                tree,
                obj,
                &st,
                Cause::External,
                &Who::default(),
                true,
                false,
            ),
            None => self.baseline(tree, obj, &st),
        }
    }

    /// A lookup found `obj` with attributes `st`: if history holds a
    /// different state for it, it changed behind the mount's back and the
    /// live state is recorded (cause `external`). `first_sight`: the first
    /// lookup since mount, so history is consulted even if nothing is
    /// cached. A directory's entries are compared (`dir_seen`).
    pub fn looked_up(
        &self,
        tree: &dyn Tree,
        obj: ObjectId,
        st: &Stat,
        first_sight: bool,
    ) -> Result<()> {
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return self.dir_seen(tree, obj, st, first_sight);
        }
        let Some(known) = self.known_at_lookup(obj, first_sight)? else {
            return Ok(());
        };
        let attrs = attrs_of(st);
        if known.attrs.same_state(&attrs) || known.verified.same_state(&attrs) {
            return Ok(());
        }
        {
            let s = self.state.lock();
            if s.has_writers(obj) || s.ingesting(obj) {
                return Ok(());
            }
        }
        tracing::debug!("inode {obj} changed behind the mount; recording it");
        self.record_state(tree, obj, st, Cause::External, &Who::default(), true, false)
    }

    /// What history holds for `obj`, as a lookup needs it: the cached
    /// state, or (on the first sight since mount) history's newest one.
    fn known_at_lookup(&self, obj: ObjectId, first_sight: bool) -> Result<Option<Arc<Known>>> {
        let cached = self.state.lock().known(obj);
        match cached {
            Some(k) => Ok(Some(k)),
            None if first_sight => self.known(obj),
            None => Ok(None),
        }
    }

    /// An entry of `dir` changed through the mount and history recorded
    /// it: the directory's live attributes `st` now go with its recorded
    /// listing (so a later difference means a change behind the mount).
    pub fn dir_verified(&self, dir: ObjectId, st: &Stat) {
        self.state.lock().verified(dir, attrs_of(st));
    }

    /// A directory is being looked up or read through the mount: if its
    /// entries changed behind the mount's back since history last saw
    /// them, the difference is recorded (cause `external`): names that
    /// appeared, and names that vanished (their objects' last recorded
    /// state is all history has of them). Directories history never
    /// recorded need nothing: their live listing is their state.
    pub fn dir_seen(
        &self,
        tree: &dyn Tree,
        dir: ObjectId,
        st: &Stat,
        first_sight: bool,
    ) -> Result<()> {
        let why = match first_sight {
            true => DirCheck::SeenFirst,
            false => DirCheck::Seen,
        };
        self.compare_dir(tree, dir, st, why)
    }

    /// [`Capture::dir_seen`] whatever the directory's attributes say: its
    /// entries changed with no change to them (a union directory whose
    /// branch set changed: names of an inserted branch show, a removed
    /// one's go).
    /// The differences are dated by the branch change that made them
    /// (`branch_changes.rs`).
    pub fn dir_recheck(&self, tree: &dyn Tree, dir: ObjectId, st: &Stat) -> Result<()> {
        self.compare_dir(tree, dir, st, DirCheck::BranchChange)
    }

    /// [`Capture::dir_recheck`] after the mount itself changed the entries
    /// with no operation through it (a sandbox commit): the differences
    /// are its own, dated now.
    pub fn dir_applied(&self, tree: &dyn Tree, dir: ObjectId, st: &Stat) -> Result<()> {
        self.compare_dir(tree, dir, st, DirCheck::Applied)
    }

    fn compare_dir(&self, tree: &dyn Tree, dir: ObjectId, st: &Stat, why: DirCheck) -> Result<()> {
        // A collection must not remove a chunk this build reuses.
        let _building = self.history.building();
        let first_sight = why != DirCheck::Seen;
        let Some(k) = self.known_at_lookup(dir, first_sight)? else {
            return Ok(());
        };
        let attrs = attrs_of(st);
        let whatever_attrs = matches!(why, DirCheck::BranchChange | DirCheck::Applied);
        if !whatever_attrs && (k.verified.same_state(&attrs) || k.attrs.same_state(&attrs)) {
            return Ok(());
        }
        let _one = self.baseline_lock.lock();
        let as_of = self.comparing();
        let recorded: HashMap<Vec<u8>, ObjectId> = self
            .history
            .list_at(dir, Seq::MAX)?
            .unwrap_or_default()
            .into_iter()
            .collect();
        let live = tree.list(dir)?;
        let mut draft = Draft::default();
        let mut present = std::collections::HashSet::new();
        // A recheck finds a branch change's doing; a lookup may find a
        // branch insertion's before the recheck does; what the mount
        // applied itself is its own.
        let unseen = |draft: &mut Draft, d: Dirent, branch| match why {
            DirCheck::BranchChange => self.push_unseen(draft, d, branch, Unseen::Rebound),
            DirCheck::Seen | DirCheck::SeenFirst => self.push_unseen(draft, d, branch, Unseen::New),
            DirCheck::Applied => {
                draft.dirents.push(d);
                Ok(())
            }
        };
        for (name, binding) in live {
            if recorded.get(&name) != Some(&binding.object) {
                let d = Dirent {
                    parent: dir,
                    name: name.clone(),
                    child: Some(binding.object),
                };
                unseen(&mut draft, d, Some(binding.branch))?;
                draft.bind.push(binding);
            }
            present.insert(name);
        }
        for name in recorded.into_keys().filter(|n| !present.contains(n)) {
            let d = Dirent {
                parent: dir,
                name,
                child: None,
            };
            unseen(&mut draft, d, None)?;
        }
        if !draft.dirents.is_empty() || !draft.backdated.is_empty() {
            tracing::debug!("directory {dir} changed behind the mount; recording its entries");
            let v = self.snapshot(tree, dir, st, Cause::External, &Who::default())?;
            draft.versions.push((dir, v));
            self.commit(draft)?;
        }
        self.compared(dir, as_of);
        self.state.lock().verified(dir, attrs);
        Ok(())
    }

    /// Before an entry of directory `dir` is added, removed or renamed:
    /// the directory's listing must be in history.
    pub fn before_dir_change(&self, tree: &dyn Tree, dir: ObjectId) -> Result<()> {
        self.history.writable()?;
        if self.known(dir)?.is_some() {
            return Ok(());
        }
        let _one = self.baseline_lock.lock();
        self.baseline_dir(tree, dir, 0)
    }

    fn baseline(&self, tree: &dyn Tree, obj: ObjectId, st: &Stat) -> Result<()> {
        self.baseline_with(tree, obj, st, None)
    }

    /// A clone's file about to change for the first time, whose bytes
    /// are still its base's `content` (`vfs/clone_patch.rs`): its state
    /// before is recorded from that, without reading the file.
    pub fn baseline_as(
        &self,
        tree: &dyn Tree,
        obj: ObjectId,
        st: &Stat,
        content: Content,
    ) -> Result<()> {
        self.history.writable()?;
        self.baseline_with(tree, obj, st, Some(content))
    }

    fn baseline_with(
        &self,
        tree: &dyn Tree,
        obj: ObjectId,
        st: &Stat,
        content: Option<Content>,
    ) -> Result<()> {
        // A collection must not remove a chunk this build reuses.
        let _building = self.history.building();
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return self.before_dir_change(tree, obj);
        }
        if self.known(obj)?.is_some() {
            return Ok(());
        }
        // The content is read before the lock: read under it, the ingest
        // walk's largest file held every other first change (and every
        // directory's baseline) until it was hashed whole. The object's
        // own change waits for this baseline, and any other change of it
        // commits its own first, which the check under the lock finds.
        let v = self.baseline_version(tree, obj, st, content)?;
        let _one = self.baseline_lock.lock();
        if self.known(obj)?.is_some() {
            return Ok(());
        }
        let mut draft = Draft::default();
        let binding = tree.binding(obj);
        if let Some((parent, name)) = tree.parent_of(obj) {
            self.baseline_dir(tree, parent, 0)?;
            self.push_parent_entry(&mut draft, (parent, name), obj, binding)?;
        }
        draft.versions.push((obj, v));
        draft.bind.extend(binding);
        self.commit(draft)
    }

    /// The version a baseline records of file `obj`: `content` when the
    /// caller has it (a clone's), else read from the tree.
    fn baseline_version(
        &self,
        tree: &dyn Tree,
        obj: ObjectId,
        st: &Stat,
        content: Option<Content>,
    ) -> Result<Version> {
        let who = Who::default();
        Ok(match content {
            Some(content) => Version {
                time_ns: 0,
                who: who.clone(),
                cause: Cause::Baseline,
                attrs: attrs_of(st),
                content: match self.content_policy(obj, st, &who) {
                    None => Content::Unrecorded,
                    Some(_) => content,
                },
                xattrs: tree.xattrs(obj).unwrap_or_default(),
                gone: false,
            },
            None => self.snapshot(tree, obj, st, Cause::Baseline, &who)?,
        })
    }

    /// The entry that names a baselined object, unless history has it: a
    /// name that history binds to another object was rebound unseen.
    fn push_parent_entry(
        &self,
        draft: &mut Draft,
        (parent, name): (ObjectId, Vec<u8>),
        obj: ObjectId,
        binding: Option<Binding>,
    ) -> Result<()> {
        let last = self.history.current_dirent_seq(parent, &name)?;
        let why = match last {
            Some((Some(o), _)) if o == obj => return Ok(()),
            Some((Some(_), _)) => Unseen::Rebound,
            _ => Unseen::New,
        };
        let d = Dirent {
            parent,
            name,
            child: Some(obj),
        };
        self.push_unseen_after(draft, d, binding.map(|b| b.branch), why, last);
        Ok(())
    }

    /// Records `dir` with its whole listing, after its ancestors.
    fn baseline_dir(&self, tree: &dyn Tree, dir: ObjectId, depth: usize) -> Result<()> {
        // A collection must not remove a chunk this build reuses.
        let _building = self.history.building();
        if self.known(dir)?.is_some() {
            return Ok(());
        }
        if depth > MAX_DEPTH {
            return Err(CaptureError::TooDeep(MAX_DEPTH));
        }
        let mut draft = Draft::default();
        let own = tree.binding(dir);
        if dir != ROOT {
            if let Some((parent, name)) = tree.parent_of(dir) {
                self.baseline_dir(tree, parent, depth + 1)?;
                self.push_parent_entry(&mut draft, (parent, name), dir, own)?;
            }
        }
        let st = tree.stat(dir)?;
        // No confirmation of the listing here: the walk's tree hands over
        // a listing it read before, perhaps under an older branch set.
        for (name, binding) in tree.list(dir)? {
            let d = Dirent {
                parent: dir,
                name,
                child: Some(binding.object),
            };
            // A directory history has no version of has no entries there.
            self.push_unseen_after(&mut draft, d, Some(binding.branch), Unseen::New, None);
            draft.bind.push(binding);
        }
        let v = self.snapshot(tree, dir, &st, Cause::Baseline, &Who::default())?;
        draft.versions.push((dir, v));
        draft.bind.extend(own);
        self.commit(draft)
    }

    /// The full state of `obj` now, as a version (file content ingested).
    fn snapshot(
        &self,
        tree: &dyn Tree,
        obj: ObjectId,
        st: &Stat,
        cause: Cause,
        who: &Who,
    ) -> Result<Version> {
        self.snapshot_like(tree, obj, st, cause, who, None)
    }

    /// [`snapshot`](Self::snapshot); a file with no version of its own
    /// takes `like`'s chunks as delta bases (the file it replaces).
    fn snapshot_like(
        &self,
        tree: &dyn Tree,
        obj: ObjectId,
        st: &Stat,
        cause: Cause,
        who: &Who,
        like: Option<&Content>,
    ) -> Result<Version> {
        let content = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => match self.content_policy(obj, st, who) {
                None => Content::Unrecorded,
                Some(level) => {
                    let fd = tree.open_read(obj)?;
                    let known = self.state.lock().known(obj);
                    self.ingest_fd(&*fd, known.as_ref().map(|k| &k.content).or(like), level)?
                }
            },
            libc::S_IFDIR => Content::Dir,
            libc::S_IFLNK => Content::Symlink {
                target: tree.readlink(obj)?,
            },
            _ => Content::Special,
        };
        Ok(Version {
            time_ns: 0,
            who: who.clone(),
            cause,
            attrs: attrs_of(st),
            content,
            xattrs: tree.xattrs(obj).unwrap_or_default(),
            gone: false,
        })
    }

    /// Ingests the file behind `fd`; `previous`: the content history holds
    /// for it now, whose chunks serve as delta bases.
    fn ingest_fd(
        &self,
        fd: &dyn Readable,
        previous: Option<&Content>,
        level: i32,
    ) -> Result<Content> {
        let read_at = |buf: &mut [u8], off: u64| fd.read_at(buf, off);
        let size = sys::fstat(fd.fd())?.st_size as u64;
        let data = fd.data_ranges(size)?;
        let bases = match previous {
            Some(Content::File { manifest }) => self
                .history
                .recent_manifest(manifest)?
                .map(|m| content::Bases::of(&m)),
            _ => None,
        };
        let (manifest, _) = content::ingest_sparse(
            self.history.chunks(),
            &read_at,
            size,
            &data,
            bases.as_ref(),
            level,
        )?;
        self.content_of(&manifest, previous)
    }

    /// The new content of a tracked file: its previous version with the
    /// written `ranges` read again.
    fn ingest_changes(
        &self,
        fd: &dyn Readable,
        previous: &crate::store::Hash,
        ranges: &[(u64, u64)],
        level: i32,
    ) -> Result<Content> {
        let prev = self
            .history
            .recent_manifest(previous)?
            .ok_or(CaptureError::PreviousUnreadable)?;
        let read_at = |buf: &mut [u8], off: u64| fd.read_at(buf, off);
        let size = sys::fstat(fd.fd())?.st_size as u64;
        let (manifest, _) =
            content::ingest_changes(self.history.chunks(), &read_at, size, &prev, ranges, level)?;
        self.content_of(
            &manifest,
            Some(&Content::File {
                manifest: *previous,
            }),
        )
    }

    /// The manifest is itself a chunk, stored as a delta against the
    /// previous version's: an edit's manifest costs the extents it changed.
    fn content_of(&self, manifest: &Manifest, previous: Option<&Content>) -> Result<Content> {
        let previous_id = match previous {
            Some(Content::File { manifest }) => Some(manifest),
            _ => None,
        };
        let (id, _) = self
            .history
            .chunks()
            .put_against(&manifest.encode(), previous_id)
            .map_err(HistoryError::from)?;
        Ok(Content::File { manifest: id })
    }

    /// Records `obj`'s current state with `cause` unless it equals what
    /// history holds (copy-on-change). `read_content`: the file's bytes may
    /// have changed and must be read again. `set_times`: the change set
    /// times explicitly, which makes a version even when nothing else
    /// differs.
    #[allow(clippy::too_many_arguments)]
    fn record_state(
        &self,
        tree: &dyn Tree,
        obj: ObjectId,
        st: &Stat,
        cause: Cause,
        who: &Who,
        read_content: bool,
        set_times: bool,
    ) -> Result<()> {
        // A collection must not remove a chunk this build reuses.
        let _building = self.history.building();
        let known = self.known(obj)?;
        let draft = Draft::default();
        let v = match (&known, read_content) {
            (Some(k), false) => Version {
                time_ns: 0,
                who: who.clone(),
                cause,
                attrs: attrs_of(st),
                content: k.content.clone(),
                xattrs: tree.xattrs(obj).unwrap_or_default(),
                gone: false,
            },
            _ => self.snapshot(tree, obj, st, cause, who)?,
        };
        let retimed = set_times
            && known
                .as_ref()
                .is_some_and(|k| k.attrs.mtime != v.attrs.mtime || k.attrs.atime != v.attrs.atime);
        self.commit_unless_same(obj, known.as_deref(), v, draft, retimed)
    }

    /// Commits `v` unless it is the same state as `known` (then only
    /// remembers the live attributes as verified).
    /// Commits `v` unless it holds what history already has (content,
    /// xattrs, mode, owner, size: a rewrite of identical bytes changes
    /// mtime but is no new version), or `retimed` (times set explicitly).
    fn commit_unless_same(
        &self,
        obj: ObjectId,
        known: Option<&Known>,
        v: Version,
        mut draft: Draft,
        retimed: bool,
    ) -> Result<()> {
        if let Some(k) = known {
            if k.same_content_and_meta(&v) && !retimed {
                self.state.lock().verified(obj, v.attrs);
                return Ok(());
            }
        }
        draft.versions.push((obj, v));
        self.commit(draft)
    }

    /// A regular file was created by an open that will write it: its name
    /// and first content are recorded together when the session closes
    /// (one version per session, not an empty one first).
    pub fn created_in_session(
        &self,
        parent: ObjectId,
        name: &[u8],
        obj: ObjectId,
        binding: Option<Binding>,
    ) {
        self.state.lock().creates.insert(
            obj,
            state::PendingCreate {
                parent,
                name: name.to_vec(),
                binding,
            },
        );
    }

    /// A new object was made in `parent` under `name`.
    pub fn created(
        &self,
        tree: &dyn Tree,
        parent: ObjectId,
        name: &[u8],
        obj: ObjectId,
        st: &Stat,
        who: &Who,
    ) -> Result<()> {
        // A collection must not remove a chunk this build reuses.
        let _building = self.history.building();
        let (cause, content) = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => (Cause::Create, None),
            libc::S_IFDIR => (Cause::Mkdir, Some(Content::Dir)),
            libc::S_IFLNK => (
                Cause::Symlink,
                Some(Content::Symlink {
                    target: tree.readlink(obj)?,
                }),
            ),
            _ => (Cause::Mknod, Some(Content::Special)),
        };
        let mut draft = Draft::default();
        let content = match content {
            Some(c) => c,
            None => self.content_of(&empty_manifest(), None)?,
        };
        draft.versions.push((
            obj,
            Version {
                time_ns: 0,
                who: who.clone(),
                cause,
                attrs: attrs_of(st),
                content,
                xattrs: Vec::new(),
                gone: false,
            },
        ));
        draft.dirents.push(Dirent {
            parent,
            name: name.to_vec(),
            child: Some(obj),
        });
        draft.bind.extend(tree.binding(obj));
        self.commit(draft)
    }

    /// `obj` got another name (link(2), or an O_TMPFILE file its first).
    pub fn linked(
        &self,
        tree: &dyn Tree,
        parent: ObjectId,
        name: &[u8],
        obj: ObjectId,
        who: &Who,
    ) -> Result<()> {
        // A creation not recorded yet (its release not arrived, its job
        // queued) first, as for a removal: else this link recorded the
        // file first, under this name only, and its first version's way
        // then was this one (a link in a closed directory closed it).
        self.record_pending(obj)?;
        // A collection must not remove a chunk this build reuses.
        let _building = self.history.building();
        let st = tree.stat(obj)?;
        let mut draft = Draft::default();
        let v = match self.known(obj)? {
            Some(k) => k.version(who, Cause::Link, attrs_of(&st)),
            None => self.snapshot(tree, obj, &st, Cause::Link, who)?,
        };
        draft.versions.push((obj, v));
        draft.dirents.push(Dirent {
            parent,
            name: name.to_vec(),
            child: Some(obj),
        });
        draft.bind.extend(tree.binding(obj));
        self.commit(draft)
    }

    #[allow(clippy::too_many_arguments)]
    /// `name` in `parent` (naming `obj`, whose state before the removal was
    /// secured by `before_change`) was removed; `gone`: it was the last name.
    pub fn removed(
        &self,
        parent: ObjectId,
        name: &[u8],
        obj: ObjectId,
        binding: Option<Binding>,
        gone: bool,
        cause: Cause,
        who: &Who,
    ) -> Result<()> {
        self.record_pending(obj)?;
        // A collection must not remove a chunk this build reuses.
        let _building = self.history.building();
        let mut draft = Draft::default();
        draft.dirents.push(Dirent {
            parent,
            name: name.to_vec(),
            child: None,
        });
        self.state.lock().creates.remove(&obj);
        if let Some(k) = self.known(obj)? {
            let mut v = k.version(who, cause, k.attrs);
            v.gone = gone;
            if !gone {
                v.attrs.nlink = v.attrs.nlink.saturating_sub(1);
            }
            draft.versions.push((obj, v));
        }
        if gone {
            draft.unbind.extend(binding);
            self.state.lock().unwatch(obj);
        }
        self.commit(draft)
    }

    /// A rename happened: `obj` moved from (olddir, oldname) to (newdir,
    /// newname); `victim` was the object it replaced (its state secured
    /// before) and whether that was its last name. With `exchange`, the
    /// victim moved the other way instead.
    #[allow(clippy::too_many_arguments)]
    pub fn renamed(
        &self,
        tree: &dyn Tree,
        (olddir, oldname): (ObjectId, &[u8]),
        (newdir, newname): (ObjectId, &[u8]),
        obj: ObjectId,
        victim: Option<(ObjectId, Option<Binding>, bool)>,
        exchange: bool,
        who: &Who,
    ) -> Result<()> {
        self.record_pending(obj)?;
        if let Some((v, _, _)) = victim {
            self.record_pending(v)?;
        }
        // A collection must not remove a chunk this build reuses.
        let _building = self.history.building();
        let mut draft = Draft::default();
        {
            let mut st = self.state.lock();
            st.creates.remove(&obj);
            if let Some((v, _, _)) = victim {
                st.creates.remove(&v);
            }
        }
        let moved = |d: &mut Draft,
                     o: ObjectId,
                     k: Option<Arc<Known>>,
                     like: Option<&Content>|
         -> Result<()> {
            let st = tree.stat(o)?;
            let v = match k {
                Some(k) => k.version(who, Cause::Rename, attrs_of(&st)),
                None => self.snapshot_like(tree, o, &st, Cause::Rename, who, like)?,
            };
            d.versions.push((o, v));
            Ok(())
        };
        // A new file renamed over an old one (write-temp-then-rename) is
        // stored against the content it replaces.
        let replaced = match victim {
            Some((v, _, _)) if !exchange => self.known(v)?.map(|k| k.content.clone()),
            _ => None,
        };
        moved(&mut draft, obj, self.known(obj)?, replaced.as_ref())?;
        draft.dirents.push(Dirent {
            parent: newdir,
            name: newname.to_vec(),
            child: Some(obj),
        });
        match victim {
            Some((v, _, _)) if exchange => {
                moved(&mut draft, v, self.known(v)?, None)?;
                draft.dirents.push(Dirent {
                    parent: olddir,
                    name: oldname.to_vec(),
                    child: Some(v),
                });
            }
            other => {
                draft.dirents.push(Dirent {
                    parent: olddir,
                    name: oldname.to_vec(),
                    child: None,
                });
                if let Some((v, binding, gone)) = other {
                    if let Some(k) = self.known(v)? {
                        // A replaced hard link lives on under its other
                        // names, with one link fewer.
                        let attrs = match tree.stat(v) {
                            Ok(st) if !gone => attrs_of(&st),
                            _ => k.attrs,
                        };
                        let mut ver = k.version(who, Cause::Overwritten, attrs);
                        ver.gone = gone;
                        draft.versions.push((v, ver));
                    }
                    if gone {
                        draft.unbind.extend(binding);
                        self.state.lock().unwatch(v);
                    }
                }
            }
        }
        // A renamed object must keep its number after a crash.
        draft.bind.extend(tree.binding(obj));
        self.commit(draft)
    }

    /// Attributes or xattrs of `obj` changed (`cause` says which); a
    /// truncate also changed content. During a write session the change
    /// folds into the session's version. `set_times`: times were set
    /// explicitly (utimensat with both times: touch, cp -p, tar, rsync -t),
    /// a change of its own even if nothing else differs. (The kernel's
    /// writeback cache also sends mtime alone, as it flushes the times of
    /// its writes: that is no change of its own.)
    pub fn changed(
        &self,
        tree: &dyn Tree,
        obj: ObjectId,
        cause: Cause,
        who: &Who,
        set_times: bool,
    ) -> Result<()> {
        if self.state.lock().mark_dirty(obj, set_times) {
            return Ok(());
        }
        let st = tree.stat(obj)?;
        let read = cause == Cause::Truncate;
        self.record_state(tree, obj, &st, cause, who, read, set_times)
    }

    /// A handle that may write `obj` is being opened (before the backing
    /// open, which may truncate): its prior state must be in history.
    /// The opening holds a session it joins open until `session_opened`
    /// takes it (or it is dropped: the open failed).
    /// `truncates`: the open empties the file (O_TRUNC), which frees space
    /// like truncate(2) to zero, so a full store does not refuse it (what
    /// could not be recorded is counted unrecorded).
    pub fn session_opening(
        &self,
        tree: &dyn Tree,
        obj: ObjectId,
        truncates: bool,
    ) -> Result<Opening<'_>> {
        // A session may still be open only because the kernel has not sent
        // the release of a handle already closed: record what it wrote
        // before this open (which may truncate) joins it. That session
        // has ended for its writer, so interval mode may hold it back like
        // any other session's end.
        let job = self.state.lock().join_opening(obj, self.mono());
        let opening = Opening {
            capture: self,
            obj,
            joined: job.is_some(),
        };
        if let Some(mut job) = job {
            job.deferrable = true;
            self.run_job(job)?;
        }
        match self.before_change(tree, obj) {
            Err(e) if truncates && is_full(e.errno()) => self
                .history
                .note_unrecorded(&format!("the state of object {obj} before an O_TRUNC open")),
            other => other?,
        }
        Ok(opening)
    }

    /// The opening of a file this open created: it had no prior state and
    /// no session to join.
    pub fn new_file_opening(&self, obj: ObjectId) -> Opening<'_> {
        Opening {
            capture: self,
            obj,
            joined: false,
        }
    }

    /// The handle is open: `reader` reads the file for its version.
    /// `daemon_path`: this handle's writes reach the daemon (no
    /// passthrough), which then reports them with `wrote_range`. `track`:
    /// the file is `trackable`, so its versions are built from the ranges
    /// written.
    /// `opening`: from `session_opening` (or `new_file_opening`).
    pub fn session_opened(
        &self,
        mut opening: Opening<'_>,
        reader: Box<dyn Readable>,
        who: Who,
        daemon_path: bool,
        track: bool,
        every_write: bool,
    ) {
        let obj = opening.obj;
        let mut st = self.state.lock();
        if std::mem::take(&mut opening.joined) {
            st.opener_arrived(obj);
        }
        if !daemon_path {
            st.untrack(obj);
        } else if track {
            st.track(obj);
        }
        let now = self.mono();
        st.open_session(
            obj,
            reader,
            who,
            every_write && daemon_path,
            !daemon_path,
            now,
        );
    }

    /// Whether versions of `obj` (open as `fd`) are worth building from
    /// the ranges written rather than by reading it whole: history holds
    /// its current content, with at least `min` bytes of data (usually
    /// `TRACK_MIN`; a preallocated or sparse file that is about to be
    /// filled is not).
    pub fn trackable(&self, obj: ObjectId, fd: std::os::fd::BorrowedFd<'_>, min: u64) -> bool {
        let Ok(st) = sys::fstat(fd) else {
            return false;
        };
        if (st.st_size as u64) < min {
            return false;
        }
        let attrs = attrs_of(&st);
        let Ok(Some(k)) = self.known(obj) else {
            return false;
        };
        let Content::File { manifest } = &k.content else {
            return false;
        };
        if !(k.attrs.same_state(&attrs) || k.verified.same_state(&attrs)) {
            return false;
        }
        // A version interval mode holds back marked the file verified
        // while history still holds the one before: ranges written now
        // would be laid over that older content.
        if self.state.lock().is_deferred(obj) {
            return false;
        }
        // Any size will do: the manifest is read by the version's build,
        // off the opener's path (a cold store makes it a disk read), which
        // falls back to reading the file whole if it cannot.
        if min == 0 {
            return true;
        }
        match self.history.recent_manifest(manifest) {
            Ok(Some(m)) => m.data_bytes() >= min,
            _ => false,
        }
    }

    /// Bytes [off, off + len) of `obj` were written through the daemon
    /// (`len` may be `u64::MAX`: everything from `off` on).
    /// Returns whether that write is to be a version of its own
    /// (every-write mode: then call `wrote`).
    pub fn wrote_range(&self, obj: ObjectId, off: u64, len: u64) -> bool {
        let mut st = self.state.lock();
        st.wrote_range(obj, off, len);
        self.cfg.every_write || st.every_write(obj)
    }

    /// A write that `wrote_range` said is a version of its own.
    pub fn wrote(&self, obj: ObjectId) -> Result<()> {
        let job = self
            .state
            .lock()
            .snapshot_job(obj, Cause::Write, self.mono());
        match job {
            Some(job) => self.run_job(job),
            None => Ok(()),
        }
    }

    /// A joining opener failed (see `Opening`).
    fn opener_gone(&self, obj: ObjectId) {
        let job = self.state.lock().opener_gone(obj);
        if let Some(job) = job {
            self.queue(job);
        }
    }

    /// A write handle was closed. The session's version is built by the
    /// ingest worker once the last writer closes.
    /// `flushed`: close(2) flushed the handle first ([`Capture::flushed`]).
    pub fn session_closed(&self, obj: ObjectId, flushed: bool) {
        let job = self
            .state
            .lock()
            .close_session(obj, flushed, written_elsewhere);
        if let Some(job) = job {
            self.queue(job);
        }
    }

    /// Records what shared mappings wrote to files after their sessions
    /// ended, once nothing has them open for writing (each file at once
    /// with `all`, at unmount).
    fn end_watches(&self, all: bool) {
        let jobs = self.state.lock().end_watches(all, written_elsewhere);
        for job in jobs {
            self.queue(job);
        }
    }

    fn queue(&self, job: state::Job) {
        if let Err(job) = self.jobs.push(job) {
            // No worker, or it is behind: build it here.
            self.run_unwaited_job(*job);
        }
    }

    /// A version could not be recorded. For lack of space it is counted
    /// unrecorded (`chronofs status`), as every change a full store lets
    /// through is.
    pub(crate) fn job_failed(&self, obj: ObjectId, e: &CaptureError) {
        match is_full(e.errno()) {
            true => self
                .history
                .note_unrecorded(&format!("the version of inode {obj} ({e})")),
            false => tracing::error!("recording the version of inode {obj} failed: {e}"),
        }
    }

    /// fsync on a file open for writing: its current state becomes a
    /// version, durably.
    pub fn fsync(&self, obj: ObjectId) -> Result<()> {
        self.flush_deferred(obj)?;
        let job = self
            .state
            .lock()
            .snapshot_job(obj, Cause::Fsync, self.mono());
        if let Some(job) = job {
            self.run_job(job)?;
        }
        self.wait_ingests(obj);
        Ok(self.history.sync()?)
    }

    /// fsync on a directory (how a program makes a rename durable): what
    /// history recorded of its entries becomes durable too, so a crash
    /// right after cannot leave history naming what the directory no
    /// longer holds. (Renames and removals are recorded before they
    /// return; a new file's name goes with its first version, which fsync
    /// of the file makes durable.)
    pub fn fsync_dir(&self) -> Result<()> {
        Ok(self.history.sync()?)
    }

    /// Builds a version interval mode is holding back for `obj` now
    /// (before it loses its name, or for fsync).
    fn flush_deferred(&self, obj: ObjectId) -> Result<()> {
        let job = self.state.lock().take_deferred(obj);
        match job {
            Some(job) => self.run_job(job),
            None => Ok(()),
        }
    }

    /// Records the current state of an open write session of `obj` now
    /// (with its creation, if pending), before a change that needs it.
    fn flush_session(&self, obj: ObjectId) -> Result<()> {
        let job = self
            .state
            .lock()
            .snapshot_job(obj, Cause::Write, self.mono());
        match job {
            Some(job) => self.run_job(job),
            None => Ok(()),
        }
    }

    /// Before a clone of the files `relevant` picks: each still open for
    /// writing that a writer closed since its last version gets one now.
    /// Only the last writer's close makes a version, so a file a logger
    /// keeps open would otherwise be cloned without writes other processes
    /// closed; recording every such close would cost a version per close
    /// to files nothing clones.
    pub fn version_closed_writes(&self, relevant: &dyn Fn(ObjectId) -> bool) {
        let closed = self.state.lock().closed_since_version();
        for obj in closed.into_iter().filter(|o| relevant(*o)) {
            if let Err(e) = self.flush_session(obj) {
                self.job_failed(obj, &e);
            }
        }
    }

    /// Before a removal or rename is recorded: what `obj`'s writers did
    /// is recorded first (with its creation if it made the file). That is
    /// a session still open (its release not yet arrived), a version
    /// interval mode holds back, and a session whose release arrived
    /// while the change was under way (its job is queued): unless waited
    /// for, that job would record the last content after the removal,
    /// where no incarnation shows it and undelete would miss it.
    fn record_pending(&self, obj: ObjectId) -> Result<()> {
        self.flush_deferred(obj)?;
        self.flush_session(obj)?;
        self.wait_ingests(obj);
        Ok(())
    }

    /// Whether a version is queued or being built for any object.
    pub fn ingesting_any(&self) -> bool {
        self.state.lock().any_ingesting()
    }

    /// Waits until no version of `obj` is queued or being built.
    pub fn wait_ingests(&self, obj: ObjectId) {
        let mut st = self.state.lock();
        while st.ingesting(obj) {
            self.idle.wait(&mut st);
        }
    }

    pub fn history(&self) -> &Arc<History> {
        &self.history
    }

    /// Waits until every queued ingest is recorded (before a query),
    /// including sessions whose close(2) has returned but whose release
    /// the kernel has not sent yet (briefly: another descriptor may keep
    /// such a session open for good).
    /// History rewrote versions of these objects (`fsck --repair` marked
    /// some lost): what capture remembers of them is read again, so no
    /// new version copies content that is gone.
    pub fn forget_known(&self, objs: &[ObjectId]) {
        let mut st = self.state.lock();
        for obj in objs {
            st.forget(*obj);
        }
    }

    pub fn settle(&self) {
        loop {
            // A version the worker is building (an interval version is not
            // counted in `ingesting`) is waited for too: a query right
            // after the interval is up must see it.
            let busy = {
                let st = self.state.lock();
                st.any_ingesting()
                    || !st.building.is_empty()
                    || st.closing(RELEASE_WAIT, CLOSE_GRACE)
            };
            // After that look, so that a release it no longer waits for is
            // covered: munmap(2) returns after the mapping's file is
            // closed, so a query after it sees what the mapping wrote.
            self.end_watches(false);
            let mut st = self.state.lock();
            if !busy && !st.any_ingesting() {
                return;
            }
            self.idle.wait_for(&mut st, Duration::from_millis(5));
        }
    }

    /// [`Capture::settle`] for the objects `relevant` says matter only:
    /// a clone need not wait for versions of files outside its source
    /// (under a write load elsewhere it waited for them, hundreds of ms).
    /// `relevant` is called without the capture's lock held.
    pub fn settle_where(&self, relevant: &dyn Fn(ObjectId) -> bool) {
        let pending = || {
            let objs = self.state.lock().unsettled(RELEASE_WAIT, CLOSE_GRACE);
            objs.into_iter().any(relevant)
        };
        loop {
            let busy = pending();
            // As in `settle`: a release it no longer waits for is covered.
            self.end_watches(false);
            if !busy && !pending() {
                return;
            }
            let mut st = self.state.lock();
            self.idle.wait_for(&mut st, Duration::from_millis(5));
        }
    }

    /// close(2) flushed a handle of `obj` (its release follows); `first`:
    /// the first flush of that handle.
    pub fn flushed(&self, obj: ObjectId, first: bool) {
        self.state.lock().flushed(obj, first);
    }

    /// Builds and commits the version of a session job.
    fn run_job(&self, job: Job) -> Result<()> {
        self.build(job, false)
    }

    /// [`Capture::run_job`] for a job nobody waits on: a failure is noted
    /// ([`Capture::job_failed`]) before the job counts as done, so a
    /// settled `status` already counts a version a full store refused.
    fn run_unwaited_job(&self, job: Job) {
        let _ = self.build(job, true);
    }

    fn build(&self, job: Job, note_failure: bool) -> Result<()> {
        // A collection must not remove a chunk this build reuses.
        let _building = self.history.building();
        {
            let mut st = self.state.lock();
            while st.building.contains(&job.obj) {
                self.idle.wait(&mut st);
            }
            st.building.insert(job.obj);
        }
        let result = self.ingest_job(&job);
        if let (true, Err(e)) = (note_failure, &result) {
            self.job_failed(job.obj, e);
        }
        {
            let mut st = self.state.lock();
            st.building.remove(&job.obj);
            st.job_done(job.obj, job.queued);
        }
        self.idle.notify_all();
        result
    }

    fn ingest_job(&self, job: &Job) -> Result<()> {
        let st = sys::fstat(job.reader.fd())?;
        let attrs = attrs_of(&st);
        let known = self.known(job.obj)?;
        let created = self.state.lock().creates.remove(&job.obj);
        if job.after_session && st.st_nlink == 0 {
            // Removed since (its removal recorded its last named state):
            // what a mapping wrote to it afterwards belongs to no name,
            // and a version now would bring it back to life. (A removal
            // itself builds the versions it secures after the backing
            // unlink, so only this late job can tell by the link count.)
            return Ok(());
        }
        if st.st_nlink == 0 && created.is_none() && self.removed_from_history(job.obj)? {
            // Written after its removal was recorded (or after a purge):
            // that belongs to no state of the tree, as a mapping's late
            // writes do above; a version would revive it (purged bytes
            // stored again, an object alive with no name, that neither
            // purge nor retention could then take). A removal's own
            // securing job comes before its record, and a relink records
            // the file (`linked`).
            self.state.lock().take_dirty(job.obj);
            return Ok(());
        }
        if let (Some(k), None) = (&known, &created) {
            if !job.dirty && (k.attrs.same_state(&attrs) || k.verified.same_state(&attrs)) {
                return Ok(());
            }
        }
        let resolved = self.resolve(job.obj, &st, &job.who);
        let mode = resolved
            .as_ref()
            .map_or(crate::policy::Capture::Session, |r| r.capture);
        // A creation is recorded at once (with its name), but starts the
        // interval.
        if mode == crate::policy::Capture::Interval && self.hold_back(job, attrs, created.is_none())
        {
            return Ok(());
        }
        let dirty = self.state.lock().take_dirty(job.obj);
        let tracked = dirty.is_some();
        let pending = created.clone();
        let level = content_level(resolved.as_ref());
        let built = self.build_job(job, (known.as_deref(), created), attrs, level, dirty);
        if built.is_err() {
            // The ranges taken are gone with this version: the next one
            // reads the whole file (else it would build on the version
            // before this one's changes). A creation stays pending.
            let mut state = self.state.lock();
            if tracked {
                state.dirty_lost(job.obj);
            }
            if let Some(c) = pending {
                state.creates.entry(job.obj).or_insert(c);
            }
        }
        built
    }

    /// The version of a session job, built from `dirty` (the ranges
    /// written since `known`, if all are known) or by reading the file,
    /// and committed.
    fn build_job(
        &self,
        job: &Job,
        (known, created): (Option<&Known>, Option<state::PendingCreate>),
        attrs: Attrs,
        level: Option<i32>,
        dirty: Option<Vec<(u64, u64)>>,
    ) -> Result<()> {
        let mut draft = Draft::default();
        let content = match (level, dirty, known.map(|k| &k.content)) {
            (None, _, _) => Content::Unrecorded,
            (Some(level), Some(ranges), Some(Content::File { manifest })) => {
                self.ingest_changes(&*job.reader, manifest, &ranges, level)?
            }
            (Some(level), _, previous) => self.ingest_fd(&*job.reader, previous, level)?,
        };
        let xattrs = job.reader.xattrs().unwrap_or_default();
        let mut v = Version {
            time_ns: 0,
            who: job.who.clone(),
            cause: job.cause,
            attrs,
            content,
            xattrs,
            gone: false,
        };
        if let Some(c) = created {
            v.cause = Cause::Create;
            draft.dirents.push(Dirent {
                parent: c.parent,
                name: c.name,
                child: Some(job.obj),
            });
            draft.bind.extend(c.binding);
            draft.versions.push((job.obj, v));
            return self.commit(draft);
        }
        // A session that set times (touch, cp -p, rsync -t) made a change
        // even if its bytes are the same.
        let retimed = job.retimed
            && known.is_some_and(|k| {
                let times = k.attrs.mtime != v.attrs.mtime || k.attrs.atime != v.attrs.atime;
                times && k.same_content_and_meta(&v)
            });
        if retimed {
            v.cause = Cause::Utimes;
        }
        self.commit_unless_same(job.obj, known, v, draft, retimed)
    }

    /// Interval mode: a session that ended within `capture-interval` of
    /// the file's last version is held back (the file is marked verified,
    /// so the next change does not record it as changed behind the
    /// mount) and built when the interval is up, or before the file loses
    /// its name, is fsynced or the mount ends. A crash meanwhile loses
    /// nothing: the next mount finds the file changed and records it.
    fn hold_back(&self, job: &Job, attrs: Attrs, may_defer: bool) -> bool {
        let now = self.mono();
        let mut state = self.state.lock();
        let due = match state.interval_built(job.obj) {
            Some(t) if may_defer && job.deferrable && now.saturating_sub(t) < self.cfg.interval => {
                t + self.cfg.interval
            }
            // This version is built now: the next interval starts.
            _ => {
                state.note_interval_built(job.obj, self.cfg.interval, now);
                return false;
            }
        };
        let held = Job {
            obj: job.obj,
            reader: job.reader.clone(),
            who: job.who.clone(),
            cause: Cause::Interval,
            // Built even though the file now matches what is marked
            // verified: that mark stood for this version.
            dirty: true,
            retimed: job.retimed,
            queued: false,
            deferrable: false,
            after_session: false,
        };
        if state.defer(held, due).is_err() {
            return false;
        }
        state.verified(job.obj, attrs);
        true
    }

    /// Files held open past the interval, and versions interval mode held
    /// back that are due (called by the worker).
    fn interval_jobs(&self) -> Vec<Job> {
        let now = self.mono();
        let mut state = self.state.lock();
        let mut jobs = state.due_sessions(now, self.cfg.interval);
        jobs.extend(state.due_deferred(Some(now)));
        jobs
    }

    /// Builds the versions interval mode has due by the history's clock:
    /// files held open past the interval and versions held back. The
    /// worker calls it every `INTERVAL_CHECK`; a test calls it after
    /// moving a manual clock on.
    pub fn run_due(&self) {
        for job in self.interval_jobs() {
            let obj = job.obj;
            if let Err(e) = self.run_job(job) {
                tracing::error!("interval version of inode {obj} failed: {e}");
            }
        }
    }

    /// The history clock's monotonic time, which intervals are measured by.
    fn mono(&self) -> Duration {
        self.history.clock().monotonic()
    }
}

impl Capture {
    /// At unmount: builds every queued version, then the version of every
    /// write session still open (whose release the kernel may never
    /// send), and stops the worker.
    pub fn finish(&self) {
        self.jobs.disable();
        let held = self.state.lock().due_deferred(None);
        for job in held {
            if let Err(e) = self.run_job(job) {
                tracing::error!("recording a held-back version at unmount failed: {e}");
            }
        }
        while let Some(job) = self.jobs.pop() {
            if let Err(e) = self.run_job(job) {
                tracing::error!("recording a version at unmount failed: {e}");
            }
        }
        let open = self.state.lock().end_all_sessions();
        for job in open {
            self.run_unwaited_job(job);
        }
        self.end_watches(true);
        self.settle();
    }
}
