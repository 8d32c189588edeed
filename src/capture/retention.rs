//! Retention: which versions a policy lets go, and the cleaner that
//! applies it in the background (to files nobody writes any more too).
//!
//! The planner reads all of history (work proportional to its size), so it
//! runs only on the cleaner's thread or for an explicit `chronofs clean`
//! or `prune`, never on a caller's file system call. Removal itself is
//! `History::prune`, which re-checks every rule against the index.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::history::prune::{pinned, Pins, PruneOutcome, Removal, Versions};
use crate::history::{History, ObjectId, Seq, Version, ROOT};
use crate::policy::{Candidate, Policy, Retention, Subject};

/// The policy in force; replaced whole by a reload.
#[derive(Default)]
pub struct PolicyCell(RwLock<Arc<Policy>>);

impl PolicyCell {
    pub fn new(p: Policy) -> PolicyCell {
        PolicyCell(RwLock::new(Arc::new(p)))
    }
    pub fn get(&self) -> Arc<Policy> {
        self.0.read().clone()
    }
    pub fn set(&self, p: Policy) {
        *self.0.write() = Arc::new(p);
    }
}

/// What one pass decided and did.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct CleanReport {
    pub dry_run: bool,
    pub objects_scanned: u64,
    pub versions_scanned: u64,
    /// Versions the plan lets go (those of objects that expired whole
    /// included, as the removal counts them), and deleted objects that
    /// expired whole.
    pub planned_versions: u64,
    pub planned_objects: u64,
    pub outcome: PruneOutcome,
    pub elapsed_ms: u64,
}

/// Which objects a pass looks at, and the retention each gets.
pub trait Decide {
    /// The retention for one object (`None`: leave it alone).
    fn retention(&self, subject: &Subject) -> Option<Retention>;
}

/// Every object, under the policy in force.
pub struct ByPolicy<'a>(pub &'a Policy);

impl Decide for ByPolicy<'_> {
    fn retention(&self, subject: &Subject) -> Option<Retention> {
        let resolved = self.0.resolve(subject);
        let mut r = resolved.retention;
        if !resolved.version {
            // Not versioned (any more): history keeps its newest state
            // only, unless a minimum says otherwise.
            r.max_count = Some(1);
        }
        Some(r)
    }
}

/// Resolves object paths, caching directories (many files share them).
/// A directory's path is cached per instant: renamed, it has another
/// path at a deleted file's last instant than now, and each object's
/// rules go by the path it had at its own instant.
struct Paths<'a> {
    history: &'a History,
    dirs: HashMap<(ObjectId, Seq), Option<Vec<u8>>>,
}

impl Paths<'_> {
    fn of(&mut self, obj: ObjectId, seq: Seq) -> crate::history::Result<Option<Vec<u8>>> {
        if obj == ROOT {
            return Ok(Some(Vec::new()));
        }
        let Some((parent, name)) = self.history.name_at(obj, seq)? else {
            return Ok(None);
        };
        let dir = match self.dirs.get(&(parent, seq)) {
            Some(d) => d.clone(),
            None => {
                let d = self.of(parent, seq)?;
                self.dirs.insert((parent, seq), d.clone());
                d
            }
        };
        // Bytes, not text: policy globs match the name as it is.
        Ok(dir.map(|mut d| {
            if !d.is_empty() {
                d.push(b'/');
            }
            d.extend_from_slice(&name);
            d
        }))
    }
}

fn is_dir(v: &Version) -> bool {
    v.attrs.mode & libc::S_IFMT == libc::S_IFDIR
}

/// An object as retention sees it: its newest state, at `path`.
fn subject<'a>(newest: &Version, path: &'a [u8], names: &'a Names) -> Subject<'a> {
    Subject {
        path,
        is_dir: is_dir(newest),
        size: newest.attrs.size,
        owner_uid: newest.attrs.uid,
        owner_gid: newest.attrs.gid,
        owner_name: names.user(newest.attrs.uid),
        group_name: names.group(newest.attrs.gid),
        process: None,
        local_time: None,
    }
}

/// User and group names by id, each looked up once.
#[derive(Default)]
pub struct Names {
    users: HashMap<u32, Option<String>>,
    groups: HashMap<u32, Option<String>>,
}

impl Names {
    pub(super) fn fill(&mut self, uid: u32, gid: u32) {
        self.users
            .entry(uid)
            .or_insert_with(|| crate::sys::user_name(uid));
        self.groups
            .entry(gid)
            .or_insert_with(|| crate::sys::group_name(gid));
    }
    pub(super) fn user(&self, uid: u32) -> Option<&str> {
        self.users.get(&uid).and_then(|n| n.as_deref())
    }
    pub(super) fn group(&self, gid: u32) -> Option<&str> {
        self.groups.get(&gid).and_then(|n| n.as_deref())
    }
}

/// A retention plan for everything `decide` covers, as of `now_ns`.
/// `scope`: only these objects (manual prune of a path), or all.
pub fn plan(
    history: &History,
    decide: &dyn Decide,
    now_ns: i64,
    tz: &jiff::tz::TimeZone,
    scope: Option<&HashSet<ObjectId>>,
    report: &mut CleanReport,
) -> crate::history::Result<Vec<(ObjectId, Removal)>> {
    let tags = history.tag_seqs()?;
    let mut paths = Paths {
        history,
        dirs: HashMap::new(),
    };
    let mut names = Names::default();
    let mut out = Vec::new();
    let mut gone_dirs: Vec<ObjectId> = Vec::new();
    let mut whole: HashSet<ObjectId> = HashSet::new();
    // Version counts of expired objects: whether a directory goes is only
    // known after the scan, and a dry run must count what a real pass
    // removes.
    let mut expired_versions: HashMap<ObjectId, u64> = HashMap::new();
    history.scan_objects(&mut |obj, versions: Versions| {
        report.objects_scanned += 1;
        report.versions_scanned += versions.len() as u64;
        if scope.is_some_and(|s| !s.contains(&obj)) {
            return Ok(true);
        }
        let Some((last_seq, newest)) = versions.last() else {
            return Ok(true);
        };
        let gone = newest.gone;
        // A deleted object's path is the one it had just before.
        let at = if gone { last_seq.prev() } else { Seq::MAX };
        let path = paths.of(obj, at)?.unwrap_or_default();
        names.fill(newest.attrs.uid, newest.attrs.gid);
        let Some(retention) = decide.retention(&subject(newest, &path, &names)) else {
            return Ok(true);
        };
        let marked = history.prefix_pruned(obj)?;
        let pins = pinned(&versions, &tags, marked);
        let candidates: Vec<Candidate> = versions
            .iter()
            .zip(&pins)
            .map(|((seq, v), p)| Candidate {
                // The policy layer knows sequence numbers as numbers.
                seq: seq.get(),
                time_ns: v.time_ns,
                size: v.attrs.size,
                pinned: *p,
            })
            .collect();
        if gone && retention.expired(&candidates, now_ns, tz) {
            expired_versions.insert(obj, versions.len() as u64);
            if is_dir(newest) {
                gone_dirs.push(obj);
            } else {
                whole.insert(obj);
            }
            return Ok(true);
        }
        // Directories keep their versions while they live: they are small,
        // and their listings depend on them.
        if is_dir(newest) || retention.keeps_all() {
            return Ok(true);
        }
        let keep = retention.keep(&candidates, now_ns, tz);
        let drop: Vec<Seq> = versions
            .iter()
            .zip(keep)
            .filter(|(_, k)| !k)
            .map(|((s, _), _)| *s)
            .collect();
        if !drop.is_empty() {
            report.planned_versions += drop.len() as u64;
            out.push((obj, Removal::Versions(drop)));
        }
        Ok(true)
    })?;
    whole.extend(expired_dirs(history, &gone_dirs, &whole)?);
    report.planned_objects = whole.len() as u64;
    report.planned_versions += whole
        .iter()
        .map(|o| expired_versions.get(o).copied().unwrap_or(0))
        .sum::<u64>();
    let mut whole: Vec<ObjectId> = whole.into_iter().collect();
    whole.sort_unstable();
    out.extend(whole.into_iter().map(|o| (o, Removal::Whole)));
    Ok(out)
}

/// Deleted directories that may go whole: every object ever named in
/// them goes too (or never had a version).
fn expired_dirs(
    history: &History,
    candidates: &[ObjectId],
    files: &HashSet<ObjectId>,
) -> crate::history::Result<HashSet<ObjectId>> {
    let mut children: HashMap<ObjectId, Vec<ObjectId>> = HashMap::new();
    for &d in candidates {
        let mut kids: Vec<ObjectId> = history
            .names_ever(d)?
            .into_iter()
            .filter_map(|(_, _, c)| c)
            .collect();
        kids.sort_unstable();
        kids.dedup();
        let mut with_versions = Vec::new();
        for k in kids {
            if history.has_versions(k)? {
                with_versions.push(k);
            }
        }
        children.insert(d, with_versions);
    }
    let mut going: HashSet<ObjectId> = candidates.iter().copied().collect();
    // Drop directories holding something that stays, until nothing changes
    // (a kept grandchild keeps every ancestor).
    loop {
        let staying: Vec<ObjectId> = going
            .iter()
            .copied()
            .filter(|d| {
                !children[d]
                    .iter()
                    .all(|k| files.contains(k) || going.contains(k))
            })
            .collect();
        if staying.is_empty() {
            return Ok(going);
        }
        for d in staying {
            going.remove(&d);
        }
    }
}

/// Applies `plan` as the policy's cleaner.
pub fn apply(
    history: &History,
    plan: &[(ObjectId, Removal)],
    audit: Option<serde_json::Value>,
    report: &mut CleanReport,
) -> crate::history::Result<()> {
    report.outcome = history.prune(plan, Pins::Respect, audit)?;
    Ok(())
}

/// One full pass under `policy` at `now_ns`.
pub fn clean(
    history: &History,
    policy: &Policy,
    now_ns: i64,
    dry_run: bool,
    audit: Option<serde_json::Value>,
) -> crate::history::Result<CleanReport> {
    let started = Instant::now();
    let tz = crate::history::spec::local_zone();
    let mut report = CleanReport {
        dry_run,
        ..Default::default()
    };
    let plan = plan(history, &ByPolicy(policy), now_ns, &tz, None, &mut report)?;
    if !dry_run && !plan.is_empty() {
        apply(history, &plan, audit, &mut report)?;
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// The background cleaner: a pass every `interval`, the first shortly
/// after the mount, and one at once when the store fills up (retention
/// first, then a collection if it removed anything, so space limits free
/// room before the user has to).
pub struct Cleaner {
    stop: Arc<(Mutex<Wake>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Wake {
    stopped: bool,
    /// The store filled up: pass now.
    full: bool,
}

const FIRST_PASS_AFTER: Duration = Duration::from_secs(60);

impl Cleaner {
    pub fn start(
        history: Arc<History>,
        policy: Arc<PolicyCell>,
        interval: Duration,
    ) -> std::io::Result<Cleaner> {
        let stop = Arc::new((Mutex::new(Wake::default()), Condvar::new()));
        let flag = stop.clone();
        let wake = stop.clone();
        history.on_store_full(Box::new(move || {
            wake.0.lock().full = true;
            wake.1.notify_all();
        }));
        let thread = std::thread::Builder::new()
            .name("cleaner".into())
            .spawn(move || {
                let mut wait = FIRST_PASS_AFTER.min(interval);
                loop {
                    let full = {
                        let mut w = flag.0.lock();
                        if !w.stopped && !w.full {
                            flag.1.wait_for(&mut w, wait);
                        }
                        if w.stopped {
                            return;
                        }
                        std::mem::take(&mut w.full)
                    };
                    wait = interval;
                    let p = policy.get();
                    if p.is_trivial() {
                        continue;
                    }
                    match clean(&history, &p, history.now_ns(), false, None) {
                        Ok(r) if r.outcome.versions_removed > 0 => {
                            tracing::info!(
                                "cleaner: removed {} version(s), of them those of {} expired deleted object(s)",
                                r.outcome.versions_removed,
                                r.outcome.objects_removed
                            );
                            if full {
                                collect_for_room(&history);
                            }
                        }
                        Ok(_) => {}
                        Err(e) => tracing::error!("cleaner: {e}"),
                    }
                }
            })?;
        Ok(Cleaner {
            stop,
            thread: Some(thread),
        })
    }
}

/// A collection after retention freed versions on a full store.
fn collect_for_room(history: &History) {
    match history.gc(false, &mut |_, _, _| {}) {
        Ok(r) => tracing::info!("cleaner: the store was full; collected {r:?}"),
        Err(e) => tracing::warn!("cleaner: the store is full and a collection failed: {e}"),
    }
}

impl Drop for Cleaner {
    fn drop(&mut self) {
        self.stop.0.lock().stopped = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::prune::Pins;
    use crate::history::testkit::*;

    /// The same retention for every object.
    struct Fixed(Retention);

    impl Decide for Fixed {
        fn retention(&self, _: &Subject) -> Option<Retention> {
            Some(self.0.clone())
        }
    }

    fn kept(h: &History, obj: ObjectId) -> Vec<Vec<u8>> {
        h.versions(obj, Seq::ZERO, Seq::MAX)
            .unwrap()
            .iter()
            .map(|(_, v)| read(h, v))
            .collect()
    }

    fn pass(k: &Kit, r: Retention, scope: Option<&HashSet<ObjectId>>) -> CleanReport {
        let h = &k.history;
        let mut report = CleanReport::default();
        let tz = jiff::tz::TimeZone::UTC;
        let plan = plan(h, &Fixed(r), h.now_ns(), &tz, scope, &mut report).unwrap();
        report.outcome = h.prune(&plan, Pins::Respect, None).unwrap();
        report
    }

    #[test]
    fn prune_keeps_what_the_retention_says() {
        let k = kit();
        let h = &k.history;
        mkdir(h, ROOT, None);
        for i in 0..5u8 {
            let named = (i == 0).then_some((ROOT, &b"f"[..]));
            write(h, o(10), named, &[b'a' + i]);
            write(h, o(11), (i == 0).then_some((ROOT, &b"g"[..])), &[b'A' + i]);
            k.clock.advance(std::time::Duration::from_secs(3600));
        }
        let r = Retention {
            max_count: Some(2),
            ..Retention::default()
        };
        let only_f: HashSet<ObjectId> = [o(10)].into();
        let report = pass(&k, r.clone(), Some(&only_f));
        assert_eq!(report.planned_versions, 3);
        assert_eq!(report.outcome.versions_removed, 3);
        assert_eq!(kept(h, o(10)), [b"d".to_vec(), b"e".to_vec()]);
        assert_eq!(kept(h, o(11)).len(), 5, "out of scope");
        // Ages by the history's clock: versions at 0..4 h, now 5 h; only
        // the one older than a 4 h maximum age goes.
        let r = Retention {
            max_age_secs: Some(4 * 3600),
            ..Retention::default()
        };
        pass(&k, r, None);
        assert_eq!(
            kept(h, o(11)),
            [b"B".to_vec(), b"C".to_vec(), b"D".to_vec(), b"E".to_vec()]
        );
        assert_eq!(kept(h, o(10)), [b"d".to_vec(), b"e".to_vec()]);
    }

    #[test]
    fn a_deleted_file_expires_whole_when_nothing_of_it_is_kept() {
        let k = kit();
        let h = &k.history;
        mkdir(h, ROOT, None);
        write(h, o(10), Some((ROOT, b"f")), b"x");
        unlink(h, ROOT, b"f", o(10));
        let r = Retention {
            max_age_secs: Some(3600),
            ..Retention::default()
        };
        assert_eq!(pass(&k, r.clone(), None).planned_objects, 0, "not old yet");
        k.clock.advance(std::time::Duration::from_secs(7200));
        let report = pass(&k, r, None);
        assert_eq!(report.planned_objects, 1);
        assert_eq!(report.outcome.objects_removed, 1);
        assert!(kept(h, o(10)).is_empty());
    }
}
