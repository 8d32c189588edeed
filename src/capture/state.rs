//! Capture's in-memory state: open write sessions, queued ingests, and a
//! bounded cache of what history holds as each object's newest state.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::Capture;
use crate::history::{Attrs, Cause, Content, ObjectId, Version, Who};

/// Cached objects before the cache is emptied (entries are cheap to reload).
const KNOWN_LIMIT: usize = 200_000;

/// What history holds as an object's newest state.
#[derive(Clone, Debug)]
pub struct Known {
    pub attrs: Attrs,
    pub content: Content,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Live attributes last found to hold the same state (an identical
    /// rewrite changes mtime but makes no version).
    pub verified: Attrs,
}

impl Known {
    pub fn from_version(v: &Version) -> Known {
        Known {
            attrs: v.attrs,
            content: v.content.clone(),
            xattrs: v.xattrs.clone(),
            verified: v.attrs,
        }
    }

    /// A new version with this content and the given attributes.
    pub fn version(&self, who: &Who, cause: Cause, attrs: Attrs) -> Version {
        Version {
            time_ns: 0,
            who: who.clone(),
            cause,
            attrs,
            content: self.content.clone(),
            xattrs: self.xattrs.clone(),
            gone: false,
        }
    }

    /// Whether `v` records nothing new: same bytes, same mode, owner and
    /// xattrs (times alone do not make a version).
    pub fn same_content_and_meta(&self, v: &Version) -> bool {
        self.content == v.content
            && self.xattrs == v.xattrs
            && self.attrs.mode == v.attrs.mode
            && self.attrs.uid == v.attrs.uid
            && self.attrs.gid == v.attrs.gid
            && self.attrs.size == v.attrs.size
    }
}

/// Open write handles of one object.
pub struct Session {
    writers: u32,
    /// Write opens that found this session between securing the file's
    /// state (`join_opening`) and their backing open: it may not end
    /// under them, or its version would be built from whatever their
    /// O_TRUNC left (an empty file the application never closed).
    openers: u32,
    reader: Arc<dyn super::Readable>,
    who: Who,
    /// Attributes changed during the session (fold into its version).
    dirty: bool,
    /// Times were set explicitly during the session (a change even if the
    /// bytes end up the same).
    retimed: bool,
    /// By the history's monotonic clock (`Clock::monotonic`).
    last_version: Duration,
    /// When close(2) last flushed a handle of it: its release (and version)
    /// is imminent.
    flushed: Option<Instant>,
    /// Writers flushed at least once and not released yet. When all are,
    /// every release is due (a loop of open-write-close opens the next
    /// writer before the last one's release arrives).
    flushed_writers: u32,
    /// The policy makes each write a version (`capture = "every-write"`).
    every_write: bool,
    /// Some writer wrote through FUSE passthrough, so a shared mapping of
    /// the backing file may outlive its last handle (`close_session`).
    passthrough: bool,
    /// A writer closed since the last version while others keep the file
    /// open: that close made no version, so a clone asks for one
    /// (`Capture::version_closed_writes`), as of when it is made.
    closed_since_version: bool,
}

impl Session {
    /// Flushed (closed) so recently that its release may still come.
    fn closing(&self, last_writer: Duration, other_writers: Duration) -> bool {
        let within = if self.flushed_writers >= self.writers {
            last_writer
        } else {
            other_writers
        };
        self.flushed.is_some_and(|t| t.elapsed() < within)
    }
}

/// A version to build from a file's current content.
pub struct Job {
    pub obj: ObjectId,
    pub reader: Arc<dyn super::Readable>,
    pub who: Who,
    pub cause: Cause,
    pub dirty: bool,
    pub retimed: bool,
    /// Counted in `ingesting` (queued for the worker).
    pub queued: bool,
    /// A session's end, which interval mode may hold back (not a flush
    /// that something else waits for).
    pub deferrable: bool,
    /// What a mapping wrote after its session ended (`end_watches`).
    pub after_session: bool,
}

/// A file created by an open that is still writing it: its name and first
/// version are recorded with the session's version, as one change.
#[derive(Clone, Debug)]
pub struct PendingCreate {
    pub parent: ObjectId,
    pub name: Vec<u8>,
    pub binding: Option<crate::history::Binding>,
}

#[derive(Default)]
pub struct Objects {
    /// Versions held back by interval mode: when due, and the job.
    /// Times by the history's monotonic clock (`Clock::monotonic`).
    deferred: HashMap<ObjectId, (Duration, Job)>,
    interval_built: HashMap<ObjectId, Duration>,
    known: HashMap<ObjectId, Arc<Known>>,
    sessions: HashMap<ObjectId, Session>,
    ingesting: HashMap<ObjectId, u32>,
    /// Objects whose version a job is building right now. Jobs of one
    /// object run one at a time, so each sees the version the previous
    /// one recorded (a queued release and an inline flush of the same
    /// session must not both record it).
    pub building: std::collections::HashSet<ObjectId>,
    pub creates: HashMap<ObjectId, PendingCreate>,
    /// Large files written through the daemon: the byte ranges written
    /// since their last version, so that the next one re-reads only those.
    tracking: HashMap<ObjectId, Dirty>,
    /// Files whose session ended while something (a shared mapping made
    /// under passthrough) still had them open for writing.
    watched: HashMap<ObjectId, Watch>,
}

/// A file watched after its session (`Objects::close_session`).
pub struct Watch {
    reader: Arc<dyn super::Readable>,
    who: Who,
}

/// Byte ranges written since a file's last version, page-aligned and
/// merged (so a random-write workload keeps at most one span per page).
#[derive(Debug)]
pub struct Dirty {
    spans: BTreeMap<u64, u64>,
    /// Every write since the last version went through the daemon. A
    /// passthrough writer (or a failed version) clears it: the next version
    /// then reads the whole file.
    valid: bool,
}

const DIRTY_STEP: u64 = 4096;

impl Dirty {
    fn new() -> Dirty {
        Dirty {
            spans: BTreeMap::new(),
            valid: true,
        }
    }

    fn add(&mut self, off: u64, len: u64) {
        let mut a = off / DIRTY_STEP * DIRTY_STEP;
        let mut b = off
            .saturating_add(len)
            .div_ceil(DIRTY_STEP)
            .saturating_mul(DIRTY_STEP);
        if let Some((&s, &e)) = self.spans.range(..=a).next_back() {
            if e >= a {
                a = s;
                b = b.max(e);
            }
        }
        let swallowed: Vec<u64> = self.spans.range(a..=b).map(|(s, _)| *s).collect();
        for s in swallowed {
            if let Some(e) = self.spans.remove(&s) {
                b = b.max(e);
            }
        }
        self.spans.insert(a, b);
    }

    fn ranges(&self) -> Vec<(u64, u64)> {
        self.spans.iter().map(|(a, b)| (*a, b - a)).collect()
    }
}

impl Objects {
    pub fn known(&self, obj: ObjectId) -> Option<Arc<Known>> {
        self.known.get(&obj).cloned()
    }

    pub fn remember(&mut self, obj: ObjectId, k: Arc<Known>) {
        if self.known.len() >= KNOWN_LIMIT {
            self.known.clear();
        }
        self.known.insert(obj, k);
    }

    pub fn forget(&mut self, obj: ObjectId) {
        self.known.remove(&obj);
    }

    pub fn verified(&mut self, obj: ObjectId, attrs: Attrs) {
        if let Some(k) = self.known.get_mut(&obj) {
            Arc::make_mut(k).verified = attrs;
        }
    }

    /// Whether each write to `obj` is to be a version.
    pub fn every_write(&self, obj: ObjectId) -> bool {
        self.sessions.get(&obj).is_some_and(|s| s.every_write)
    }

    /// Holds back the version of a session that ended within an interval
    /// of the object's last one (`capture = "interval"`): built when
    /// `due`, or sooner if something needs it. Hands the job back when too
    /// many are held (each holds a descriptor).
    pub fn defer(&mut self, job: Job, due: Duration) -> Result<(), Box<Job>> {
        if self.deferred.len() >= DEFER_LIMIT && !self.deferred.contains_key(&job.obj) {
            return Err(Box::new(job));
        }
        let due = self.deferred.get(&job.obj).map_or(due, |(d, _)| *d);
        self.deferred.insert(job.obj, (due, job));
        Ok(())
    }

    /// Whether a version of `obj` is held back.
    pub fn is_deferred(&self, obj: ObjectId) -> bool {
        self.deferred.contains_key(&obj)
    }

    /// The deferred version of `obj`, to build now.
    pub fn take_deferred(&mut self, obj: ObjectId) -> Option<Job> {
        self.deferred.remove(&obj).map(|(_, j)| j)
    }

    /// Deferred versions due by `now` (all with `None`).
    pub fn due_deferred(&mut self, now: Option<Duration>) -> Vec<Job> {
        let due: Vec<ObjectId> = self
            .deferred
            .iter()
            .filter(|(_, (d, _))| now.is_none_or(|n| *d <= n))
            .map(|(o, _)| *o)
            .collect();
        due.into_iter()
            .filter_map(|o| self.deferred.remove(&o).map(|(_, j)| j))
            .collect()
    }

    /// When an interval-mode version of `obj` was last built.
    pub fn interval_built(&self, obj: ObjectId) -> Option<Duration> {
        self.interval_built.get(&obj).copied()
    }

    pub fn note_interval_built(&mut self, obj: ObjectId, interval: Duration, now: Duration) {
        if self.interval_built.len() >= DEFER_LIMIT * 4 {
            // Only recent builds can hold a version back.
            self.interval_built
                .retain(|_, t| now.saturating_sub(*t) < interval);
        }
        self.interval_built.insert(obj, now);
    }

    pub fn has_writers(&self, obj: ObjectId) -> bool {
        self.sessions.contains_key(&obj)
    }

    /// Marks an open session dirty (`retimed`: by setting times); false
    /// if there is none.
    pub fn mark_dirty(&mut self, obj: ObjectId, retimed: bool) -> bool {
        match self.sessions.get_mut(&obj) {
            Some(s) => {
                s.dirty = true;
                s.retimed |= retimed;
                true
            }
            None => false,
        }
    }

    /// Starts tracking `obj`'s writes (unless it already is).
    pub fn track(&mut self, obj: ObjectId) {
        self.tracking.entry(obj).or_insert_with(Dirty::new);
    }

    /// A writer that bypasses the daemon: tracked ranges can no longer be
    /// trusted.
    pub fn untrack(&mut self, obj: ObjectId) {
        if let Some(d) = self.tracking.get_mut(&obj) {
            d.valid = false;
        }
    }

    pub fn wrote_range(&mut self, obj: ObjectId, off: u64, len: u64) {
        if let Some(d) = self.tracking.get_mut(&obj) {
            d.add(off, len);
        }
    }

    /// For the version being built now: the ranges written since the last
    /// one, if all of them are known (`None`: read the whole file). The
    /// tracking ends with the last session.
    pub fn take_dirty(&mut self, obj: ObjectId) -> Option<Vec<(u64, u64)>> {
        let open = self.sessions.contains_key(&obj);
        let d = self.tracking.get_mut(&obj)?;
        let taken = d.valid.then(|| d.ranges());
        d.spans.clear();
        d.valid = true;
        if !open {
            self.tracking.remove(&obj);
        }
        taken
    }

    /// Building a version from tracked ranges failed: the next one reads
    /// the whole file.
    pub fn dirty_lost(&mut self, obj: ObjectId) {
        self.untrack(obj);
    }

    pub fn open_session(
        &mut self,
        obj: ObjectId,
        reader: Box<dyn super::Readable>,
        who: Who,
        every_write: bool,
        passthrough: bool,
        now: Duration,
    ) {
        // The new session's end records (or watches) the file.
        self.watched.remove(&obj);
        match self.sessions.get_mut(&obj) {
            Some(s) => {
                s.writers += 1;
                s.every_write |= every_write;
                s.passthrough |= passthrough;
            }
            None => {
                self.sessions.insert(
                    obj,
                    Session {
                        writers: 1,
                        openers: 0,
                        reader: Arc::from(reader),
                        who,
                        dirty: false,
                        retimed: false,
                        last_version: now,
                        flushed: None,
                        flushed_writers: 0,
                        every_write,
                        passthrough,
                        closed_since_version: false,
                    },
                );
            }
        }
    }

    /// One writer closed; the ingest job if it was the last. Under
    /// passthrough a shared mapping holds the backing file, not the
    /// handle, so the last handle's release can come before writes
    /// through the mapping: if the file is still open for writing
    /// elsewhere (`written_elsewhere`), it is also watched until it is not
    /// (`end_watches`), for the version of what was written meanwhile.
    /// (The kernel may send a release just before it closes the backing
    /// file, so a watch is no reason to hold the session's version back.)
    pub fn close_session(
        &mut self,
        obj: ObjectId,
        flushed: bool,
        written_elsewhere: impl Fn(BorrowedFd<'_>) -> bool,
    ) -> Option<Job> {
        let s = self.sessions.get_mut(&obj)?;
        s.writers -= 1;
        s.closed_since_version = true;
        if flushed {
            s.flushed_writers = s.flushed_writers.saturating_sub(1);
        }
        if s.openers > 0 {
            // An opener is joining: the session goes on with it.
            return None;
        }
        if s.writers > 0 {
            if s.flushed_writers == 0 {
                // The writers left are not known to be closing.
                s.flushed = None;
            }
            return None;
        }
        if s.passthrough && written_elsewhere(s.reader.fd()) {
            let watch = Watch {
                reader: s.reader.clone(),
                who: s.who.clone(),
            };
            self.watched.insert(obj, watch);
        }
        self.end_session(obj)
    }

    /// Jobs for the watched files that nothing has open for writing any
    /// more (for all of them with `all`, at unmount): each records what a
    /// mapping wrote after the session's end, if anything.
    pub fn end_watches(
        &mut self,
        all: bool,
        written_elsewhere: impl Fn(BorrowedFd<'_>) -> bool,
    ) -> Vec<Job> {
        let ended: Vec<ObjectId> = self
            .watched
            .iter()
            .filter(|(_, w)| all || !written_elsewhere(w.reader.fd()))
            .map(|(o, _)| *o)
            .collect();
        let mut jobs = Vec::with_capacity(ended.len());
        for obj in ended {
            if let Some(w) = self.watched.remove(&obj) {
                *self.ingesting.entry(obj).or_default() += 1;
                jobs.push(Job {
                    obj,
                    reader: w.reader,
                    who: w.who,
                    cause: Cause::Write,
                    dirty: false,
                    retimed: false,
                    queued: true,
                    deferrable: true,
                    after_session: true,
                });
            }
        }
        jobs
    }

    /// `obj` lost its last name: what is written to it from now on
    /// belongs to no named state.
    pub fn unwatch(&mut self, obj: ObjectId) {
        self.watched.remove(&obj);
    }

    /// At unmount: the jobs ending every session still open. After a lazy
    /// detach the kernel drops the releases it has not delivered when it
    /// tears the connection down, so a file closed then would otherwise
    /// never be recorded (nor, if the session created it, its creation).
    /// They are built at once: nothing is held back past the mount's end.
    pub fn end_all_sessions(&mut self) -> Vec<Job> {
        let open: Vec<ObjectId> = self.sessions.keys().copied().collect();
        open.into_iter()
            .filter_map(|obj| self.end_session(obj))
            .map(|job| Job {
                deferrable: false,
                ..job
            })
            .collect()
    }

    fn end_session(&mut self, obj: ObjectId) -> Option<Job> {
        let s = self.sessions.remove(&obj)?;
        *self.ingesting.entry(obj).or_default() += 1;
        Some(Job {
            obj,
            reader: s.reader,
            who: s.who,
            cause: Cause::Write,
            dirty: s.dirty,
            retimed: s.retimed,
            queued: true,
            deferrable: true,
            after_session: false,
        })
    }

    /// A write open of `obj` is about to join its open session: the job
    /// recording what the session wrote so far, with the session held
    /// open for the opener (`opener_arrived` or `opener_gone` ends that).
    pub fn join_opening(&mut self, obj: ObjectId, now: Duration) -> Option<Job> {
        let job = self.snapshot_job(obj, Cause::Write, now)?;
        if let Some(s) = self.sessions.get_mut(&obj) {
            s.openers += 1;
        }
        Some(job)
    }

    /// A joining opener's handle is open (its `open_session` follows).
    pub fn opener_arrived(&mut self, obj: ObjectId) {
        if let Some(s) = self.sessions.get_mut(&obj) {
            s.openers = s.openers.saturating_sub(1);
        }
    }

    /// A joining opener failed: the session ends if nothing else holds it.
    pub fn opener_gone(&mut self, obj: ObjectId) -> Option<Job> {
        let s = self.sessions.get_mut(&obj)?;
        s.openers = s.openers.saturating_sub(1);
        if s.openers > 0 || s.writers > 0 {
            return None;
        }
        self.end_session(obj)
    }

    /// A job capturing an open session's current state now.
    pub fn snapshot_job(&mut self, obj: ObjectId, cause: Cause, now: Duration) -> Option<Job> {
        let s = self.sessions.get_mut(&obj)?;
        s.last_version = now;
        s.closed_since_version = false;
        let dirty = std::mem::take(&mut s.dirty);
        let retimed = std::mem::take(&mut s.retimed);
        Some(Job {
            obj,
            reader: s.reader.clone(),
            who: s.who.clone(),
            cause,
            dirty,
            retimed,
            queued: false,
            deferrable: false,
            after_session: false,
        })
    }

    /// The open sessions a writer closed since their last version.
    pub fn closed_since_version(&self) -> Vec<ObjectId> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.closed_since_version)
            .map(|(o, _)| *o)
            .collect()
    }

    pub fn due_sessions(&mut self, now: Duration, interval: Duration) -> Vec<Job> {
        let due: Vec<ObjectId> = self
            .sessions
            .iter()
            .filter(|(_, s)| now.saturating_sub(s.last_version) >= interval)
            .map(|(o, _)| *o)
            .collect();
        due.into_iter()
            .filter_map(|o| self.snapshot_job(o, Cause::Interval, now))
            .collect()
    }

    pub fn flushed(&mut self, obj: ObjectId, first: bool) {
        if let Some(s) = self.sessions.get_mut(&obj) {
            s.flushed = Some(Instant::now());
            if first {
                s.flushed_writers += 1;
            }
        }
    }

    /// Whether a close(2) returned recently whose release has not arrived.
    /// A session whose writers were all flushed waits up to `last_writer`
    /// (their releases are certain unless a mapping or a dup keeps the
    /// file open, and they can be slow under load); one with writers not
    /// flushed, only `other_writers`.
    pub fn closing(&self, last_writer: Duration, other_writers: Duration) -> bool {
        self.sessions
            .values()
            .any(|s| s.closing(last_writer, other_writers))
    }

    /// The objects a settle waits for: versions queued or being built,
    /// and sessions whose release may still come (`closing`).
    pub fn unsettled(&self, last_writer: Duration, other_writers: Duration) -> Vec<ObjectId> {
        let closing = self
            .sessions
            .iter()
            .filter(|(_, s)| s.closing(last_writer, other_writers))
            .map(|(o, _)| *o);
        self.ingesting
            .keys()
            .copied()
            .chain(self.building.iter().copied())
            .chain(closing)
            .collect()
    }

    pub fn ingesting(&self, obj: ObjectId) -> bool {
        self.ingesting.contains_key(&obj)
    }

    pub fn any_ingesting(&self) -> bool {
        !self.ingesting.is_empty()
    }

    pub fn job_done(&mut self, obj: ObjectId, queued: bool) {
        if !queued {
            return;
        }
        if let Some(n) = self.ingesting.get_mut(&obj) {
            *n -= 1;
            if *n == 0 {
                self.ingesting.remove(&obj);
            }
        }
    }
}

/// The ingest queue between request threads and the worker.
#[derive(Default)]
pub struct JobQueue {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    ready: Condvar,
}

impl JobQueue {
    /// Queues a job, or hands it back if there is no worker or the queue
    /// is full: each queued job holds a descriptor, so a worker that falls
    /// behind must slow the writers down (the caller then builds the
    /// version itself) rather than exhaust RLIMIT_NOFILE.
    pub fn push(&self, job: Job) -> Result<(), Box<Job>> {
        let mut q = self.jobs.lock();
        if q.1 || q.0.len() >= QUEUE_LIMIT {
            return Err(Box::new(job));
        }
        q.0.push_back(job);
        self.ready.notify_one();
        Ok(())
    }

    pub fn pop(&self) -> Option<Job> {
        self.jobs.lock().0.pop_front()
    }

    /// Waits up to `timeout` for a job.
    pub fn pop_wait(&self, timeout: Duration) -> Option<Job> {
        let mut q = self.jobs.lock();
        if q.0.is_empty() {
            self.ready.wait_for(&mut q, timeout);
        }
        q.0.pop_front()
    }

    /// No worker runs: jobs run where they are made.
    pub fn disable(&self) {
        self.jobs.lock().1 = true;
    }
}

/// Queued ingests at most (each holds one descriptor).
const QUEUE_LIMIT: usize = 512;
/// Versions held back by interval mode at most (each holds a descriptor).
const DEFER_LIMIT: usize = 1024;

/// How often the worker looks for files held open past the interval.
const INTERVAL_CHECK: Duration = Duration::from_secs(1);

/// How often the worker looks at files watched after their session for a
/// mapping that may have gone (a query looks itself).
const WATCH_CHECK: Duration = Duration::from_millis(200);

pub fn worker_loop(capture: Weak<Capture>) {
    let mut last_check = Instant::now();
    let mut last_watch = Instant::now();
    loop {
        let Some(c) = capture.upgrade() else {
            return;
        };
        if let Some(job) = c.jobs.pop_wait(Duration::from_millis(200)) {
            c.run_unwaited_job(job);
        }
        if last_watch.elapsed() >= WATCH_CHECK {
            last_watch = Instant::now();
            c.end_watches(false);
        }
        if last_check.elapsed() >= INTERVAL_CHECK {
            last_check = Instant::now();
            c.run_due();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> Box<dyn super::super::Readable> {
        let fd: std::os::fd::OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        Box::new(fd)
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn id(n: u64) -> ObjectId {
        ObjectId::new(n)
    }

    #[test]
    fn written_ranges_merge_into_page_aligned_spans() {
        let mut d = Dirty::new();
        d.add(10, 5);
        assert_eq!(d.ranges(), [(0, 4096)]);
        d.add(8192, 1);
        assert_eq!(d.ranges(), [(0, 4096), (8192, 4096)]);
        // Touching the gap joins all three.
        d.add(4096, 4096);
        assert_eq!(d.ranges(), [(0, 12288)]);
        d.add(100_000, 0);
        d.add(u64::MAX - 5, 10);
        assert_eq!(d.ranges().len(), 3, "no overflow at the end of the range");
    }

    #[test]
    fn a_session_ends_with_its_last_writer_as_one_job() {
        let mut o = Objects::default();
        o.open_session(id(7), fd(), Who::default(), false, false, s(0));
        o.open_session(id(7), fd(), Who::default(), false, false, s(1));
        assert!(o.mark_dirty(id(7), true));
        assert!(!o.mark_dirty(id(8), false), "no session of 8");
        assert!(
            o.close_session(id(7), false, |_| false).is_none(),
            "one writer is still open"
        );
        let job = o.close_session(id(7), false, |_| false).unwrap();
        assert_eq!((job.obj, job.cause), (id(7), Cause::Write));
        assert!(job.dirty && job.retimed && job.queued && job.deferrable);
        assert!(o.ingesting(id(7)) && !o.has_writers(id(7)));
        o.job_done(id(7), true);
        assert!(!o.any_ingesting());
        assert!(o.close_session(id(7), false, |_| false).is_none());
    }

    #[test]
    fn a_session_an_opener_joins_does_not_end_under_it() {
        // The kernel sent the release of the last handle only once the
        // next write open had secured the session's state: the session
        // must wait for that opener, whose O_TRUNC is not a version.
        let mut o = Objects::default();
        o.open_session(id(3), fd(), Who::default(), false, false, s(0));
        let joined = o.join_opening(id(3), s(1)).unwrap();
        assert_eq!((joined.obj, joined.queued), (id(3), false));
        assert!(
            o.close_session(id(3), false, |_| false).is_none(),
            "held open"
        );
        assert!(o.has_writers(id(3)) && !o.ingesting(id(3)));
        o.opener_arrived(id(3));
        o.open_session(id(3), fd(), Who::default(), false, false, s(2));
        let job = o.close_session(id(3), false, |_| false).unwrap();
        assert_eq!(job.obj, id(3), "the joined session ends with its opener");
        o.job_done(id(3), true);
        // An opener that fails lets the session go: it ends with the
        // last of its writers or openers.
        o.open_session(id(4), fd(), Who::default(), false, false, s(0));
        o.join_opening(id(4), s(1)).unwrap();
        o.join_opening(id(4), s(1)).unwrap();
        assert!(o.close_session(id(4), false, |_| false).is_none());
        assert!(o.opener_gone(id(4)).is_none(), "another opener holds it");
        let job = o.opener_gone(id(4)).unwrap();
        assert!(job.queued && o.ingesting(id(4)) && !o.has_writers(id(4)));
        assert!(o.join_opening(id(5), s(0)).is_none(), "no session to join");
    }

    #[test]
    fn a_passthrough_file_still_written_elsewhere_is_watched_after_its_session() {
        use std::cell::Cell;
        let mapped = Cell::new(true);
        let elsewhere = |_: BorrowedFd<'_>| mapped.get();
        let mut o = Objects::default();
        o.open_session(id(1), fd(), Who::default(), false, true, s(0));
        o.open_session(id(2), fd(), Who::default(), false, false, s(0));
        let ended = o.close_session(id(1), false, elsewhere).unwrap();
        assert_eq!(ended.obj, id(1), "the session's version is not held back");
        o.job_done(id(1), true);
        assert!(!o.has_writers(id(1)));
        o.close_session(id(2), false, elsewhere).unwrap();
        assert!(o.end_watches(false, elsewhere).is_empty(), "still mapped");
        mapped.set(false);
        let later = o.end_watches(false, elsewhere);
        assert_eq!(later.iter().map(|j| j.obj).collect::<Vec<_>>(), [id(1)]);
        assert!(
            later[0].queued && o.ingesting(id(1)),
            "without passthrough no watch"
        );
        o.job_done(id(1), true);
        assert!(
            o.end_watches(true, elsewhere).is_empty(),
            "one job per watch"
        );
        mapped.set(true);
        o.open_session(id(3), fd(), Who::default(), false, true, s(1));
        o.close_session(id(3), false, elsewhere).unwrap();
        o.open_session(id(3), fd(), Who::default(), false, true, s(2));
        assert!(
            o.end_watches(true, elsewhere).is_empty(),
            "a new session takes over"
        );
        o.close_session(id(3), false, elsewhere).unwrap();
        o.unwatch(id(3));
        assert!(o.end_watches(true, elsewhere).is_empty(), "removed");
        o.open_session(id(4), fd(), Who::default(), false, true, s(3));
        o.close_session(id(4), false, elsewhere).unwrap();
        assert_eq!(o.end_watches(true, elsewhere).len(), 1, "unmount ends it");
    }

    #[test]
    fn a_closed_last_writer_is_waited_for_longer_than_one_of_several() {
        let (long, short) = (s(3600), Duration::ZERO);
        let mut o = Objects::default();
        o.open_session(id(1), fd(), Who::default(), false, false, s(0));
        o.open_session(id(1), fd(), Who::default(), false, false, s(0));
        assert!(!o.closing(long, long), "nothing closed yet");
        o.flushed(id(1), true);
        assert!(!o.closing(long, short), "another writer is still open");
        assert!(o.closing(long, long));
        assert!(o.close_session(id(1), true, |_| false).is_none());
        assert!(!o.closing(long, long), "the writer left is not closing");
        o.flushed(id(1), true);
        assert!(o.closing(long, short), "the last writer's release is next");
        assert!(!o.closing(short, long));
        o.close_session(id(1), true, |_| false).unwrap();
        assert!(!o.closing(long, long), "released");
    }

    /// `for v in 1 2 3; do echo $v > f; done`: each open comes before the
    /// release of the close before it. The first release must not make
    /// the last close look like one of a writer still open (a query then
    /// missed the last version under load).
    #[test]
    fn a_release_leaves_the_wait_for_a_later_close() {
        let (long, short) = (s(3600), Duration::ZERO);
        let mut o = Objects::default();
        o.open_session(id(1), fd(), Who::default(), false, false, s(0));
        o.flushed(id(1), true);
        o.open_session(id(1), fd(), Who::default(), false, false, s(0));
        o.flushed(id(1), true);
        assert!(o.closing(long, short), "both writers were closed");
        assert!(o.close_session(id(1), true, |_| false).is_none());
        assert!(o.closing(long, short), "the second release is still due");
        o.close_session(id(1), true, |_| false).unwrap();
        // A dup's close flushes an open handle again: counted once.
        o.open_session(id(2), fd(), Who::default(), false, false, s(0));
        o.open_session(id(2), fd(), Who::default(), false, false, s(0));
        o.flushed(id(2), true);
        o.flushed(id(2), false);
        assert!(!o.closing(long, short), "one writer is still open");
    }

    #[test]
    fn open_sessions_are_due_an_interval_after_their_last_version() {
        let mut o = Objects::default();
        o.open_session(id(1), fd(), Who::default(), false, false, s(100));
        o.open_session(id(2), fd(), Who::default(), false, false, s(130));
        assert!(o.due_sessions(s(159), s(60)).is_empty());
        let due = o.due_sessions(s(160), s(60));
        assert_eq!(due.iter().map(|j| j.obj.get()).collect::<Vec<_>>(), [1]);
        assert_eq!(due[0].cause, Cause::Interval);
        assert!(!due[0].deferrable, "an interval version is built now");
        // The snapshot restarted 1's interval; 2's is due at 190.
        let due = o.due_sessions(s(190), s(60));
        assert_eq!(due.iter().map(|j| j.obj.get()).collect::<Vec<_>>(), [2]);
        assert!(o.due_sessions(s(219), s(60)).is_empty());
        assert_eq!(o.due_sessions(s(220), s(60)).len(), 1);
    }

    fn job(obj: u64) -> Job {
        Job {
            obj: id(obj),
            reader: Arc::from(fd()),
            who: Who::default(),
            cause: Cause::Interval,
            dirty: true,
            retimed: false,
            queued: false,
            deferrable: false,
            after_session: false,
        }
    }

    #[test]
    fn a_held_back_version_keeps_its_first_due_time() {
        let mut o = Objects::default();
        assert!(o.defer(job(1), s(60)).is_ok());
        // A later session of the same file replaces the job, not the time.
        assert!(o.defer(job(1), s(90)).is_ok());
        assert!(o.defer(job(2), s(75)).is_ok());
        assert!(o.due_deferred(Some(s(59))).is_empty());
        let due = o.due_deferred(Some(s(60)));
        assert_eq!(due.iter().map(|j| j.obj.get()).collect::<Vec<_>>(), [1]);
        assert!(o.take_deferred(id(2)).is_some());
        assert!(o.due_deferred(None).is_empty());
        o.defer(job(3), s(1_000)).ok();
        assert_eq!(o.due_deferred(None).len(), 1, "unmount builds all");
    }

    #[test]
    fn tracked_ranges_are_handed_over_once() {
        let mut o = Objects::default();
        o.open_session(id(1), fd(), Who::default(), false, false, s(0));
        o.track(id(1));
        o.wrote_range(id(1), 0, 10);
        assert_eq!(o.take_dirty(id(1)), Some(vec![(0, 4096)]));
        assert_eq!(o.take_dirty(id(1)), Some(vec![]), "taken");
        o.wrote_range(id(1), 5000, 10);
        o.untrack(id(1));
        assert_eq!(
            o.take_dirty(id(1)),
            None,
            "a passthrough writer: read it all"
        );
        o.close_session(id(1), false, |_| false);
        o.wrote_range(id(1), 0, 1);
        assert_eq!(o.take_dirty(id(1)), Some(vec![(0, 4096)]));
        assert_eq!(o.take_dirty(id(1)), None, "tracking ended with the session");
    }
}
