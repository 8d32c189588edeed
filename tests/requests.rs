//! Round trips per operation, counted by the daemon (`chronofs status
//! --requests`): a change that adds a request to a common operation fails
//! here, not only in a benchmark. The figures are this adapter's today; a
//! lower count is progress (then lower the bound here).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

type Counts = BTreeMap<String, u64>;

fn counts(m: &Mount) -> Counts {
    chronofs_ok(m, &["status", "--requests", "."])
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .filter(|(k, _)| k != "total")
        .collect()
}

/// The requests served between `before` and `after`, by kind.
fn delta(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn of<'a>(pairs: impl IntoIterator<Item = (&'a str, u64)>) -> Counts {
    pairs.into_iter().map(|(k, n)| (k.to_string(), n)).collect()
}

/// The requests of `op`, once every release it caused has arrived (the
/// kernel sends RELEASE after close(2) returns).
fn requests_of(m: &Mount, releases: u64, op: impl FnOnce()) -> Counts {
    let before = counts(m);
    op();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = delta(&before, &counts(m));
        let released = d.get("release").copied().unwrap_or(0);
        if released >= releases || Instant::now() > deadline {
            return d;
        }
        std::thread::yield_now();
    }
}

/// Waits until `dir` last changed long enough ago that its timestamps
/// tell a later change apart: only then may the kernel keep its listing
/// (`RACY` in src/vfs/dircache.rs, 50 ms on file systems with nanosecond
/// stamps).
fn settle_stamps(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let md = fs::metadata(dir).unwrap();
        let newest = (md.mtime(), md.mtime_nsec()).max((md.ctime(), md.ctime_nsec()));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let age = now.saturating_sub(Duration::new(newest.0 as u64, newest.1 as u32));
        if age > Duration::from_millis(60) || Instant::now() > deadline {
            return;
        }
        std::thread::yield_now();
    }
}

#[test]
fn common_operations_cost_the_requests_they_need_and_no_more() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("d")).unwrap();
        for i in 0..20 {
            fs::write(m.p(&format!("d/f{i}")), b"x").unwrap();
        }
        fs::read_dir(m.p("d")).unwrap().for_each(drop);
        let cached = m.p("d/f1");
        fs::metadata(&cached).unwrap();

        // A name not seen before: its lookup, the create, and the flush
        // and release of close(2) (history marks the end of a write there).
        let created = requests_of(m, 1, || {
            fs::File::create(m.p("d/new")).unwrap();
        });
        assert_eq!(
            created,
            of([("create", 1), ("flush", 1), ("lookup", 1), ("release", 1)]),
            "create + close"
        );

        // Attributes the kernel holds: nothing reaches the daemon. (The
        // create made the kernel drop the directory's own attributes, which
        // the permission check of the path walk then fetches once.)
        fs::metadata(&cached).unwrap();
        let stat = requests_of(m, 0, || {
            fs::metadata(&cached).unwrap();
        });
        assert_eq!(stat, Counts::new(), "stat of a cached entry");

        // `ls -l` of a directory listed a moment ago: its kept listing
        // and the entries' cached attributes, so no lookup and no readdir
        // per entry. ls asks every entry's security label and ACL, which
        // the kernel forwards (one or two GETXATTR each: not counted
        // here, see docs/PERFORMANCE.md).
        settle_stamps(&m.p("d"));
        run(&m.mnt, "ls", &["-l", "d"]);
        let ls = requests_of(m, 0, || {
            run(&m.mnt, "ls", &["-l", "d"]);
        });
        let listing: Counts = ls.into_iter().filter(|(k, _)| k != "getxattr").collect();
        let dir_only = of([("opendir", 1), ("releasedir", 1)]);
        let with_dir_attrs = of([("getattr", 1), ("opendir", 1), ("releasedir", 1)]);
        assert!(
            listing == dir_only || listing == with_dir_attrs,
            "ls -l of a listed directory: {listing:?}"
        );
    });
}

#[test]
fn a_mount_without_requests_to_count_says_so() {
    let dir = tempdir();
    let out = std::process::Command::new(bin())
        .args(["status", "--requests"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A mount without history still reports what it is: its transport and
/// the requests it served (status used to refuse it outright).
#[test]
fn a_mount_without_history_reports_its_requests_and_transport() {
    let mut m = Mount::new("plain");
    fs::write(m.p("f"), b"x").unwrap();
    let before = counts(&m);
    fs::metadata(m.p("absent")).unwrap_err();
    let looked = delta(&before, &counts(&m));
    assert_eq!(looked.get("lookup"), Some(&1), "{looked:?}");
    let status = chronofs_ok(&m, &["status", "."]);
    assert!(status.contains("history:      off"), "{status}");
    assert!(
        status.lines().any(|l| l.starts_with("transport:")),
        "{status}"
    );
    assert!(!status.contains("store:"), "{status}");
    let json: serde_json::Value =
        serde_json::from_str(&chronofs_ok(&m, &["status", "--json", "."])).unwrap();
    assert_eq!(json["plain"], true, "{json}");
    assert!(json["requests"].as_array().is_some_and(|r| !r.is_empty()));
    m.unmount();
}

/// With the writeback cache the kernel sends FLUSH to history's read-only
/// handles too; an ENOSYS there told it to stop sending FLUSH for the
/// whole mount, and history then lost the mark of a write session's end
/// (a query right after a close could miss its version).
#[test]
fn reading_the_past_leaves_flushes_on_for_live_files() {
    let m = Mount::new("passthrough=off");
    m.wait_history_ready();
    write_file(&m.p("f"), b"one\n");
    write_file(&m.p("f"), b"two\n");
    assert_eq!(fs::read(m.p("f;1")).unwrap(), b"one\n");
    let d = requests_of(&m, 1, || write_file(&m.p("g"), b"x"));
    assert_eq!(d.get("flush"), Some(&1), "close of a written file: {d:?}");
}
