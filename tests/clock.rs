//! Time-dependent behaviour on an injected clock, in process: interval
//! capture, retention's hourly and daily thinning, `max-age` and the
//! background cleaner. Time moves when a test says so; nothing sleeps.
//!
//! The manual clock starts in 2035 (`inproc::START_NS`): had any of these
//! rules read the system clock, every version would be in its future and
//! nothing would be thinned or due, so each passing test shows the
//! injected clock was the one read.

mod inproc;

use inproc::*;

use std::sync::Arc;
use std::time::Duration;

use chronofs::capture::retention::{self, Cleaner, PolicyCell};
use chronofs::capture::CaptureConfig;
use chronofs::history::Cause;

fn interval_rig() -> Rig {
    Rig::with(
        CaptureConfig {
            interval: secs(60),
            every_write: false,
        },
        policy("[[rule]]\nextensions = [\"dat\"]\ncapture = \"interval\"\n"),
    )
}

fn contents(v: &[(Cause, Option<Vec<u8>>)]) -> Vec<Option<&[u8]>> {
    v.iter().map(|(_, d)| d.as_deref()).collect()
}

#[test]
fn interval_mode_holds_sessions_back_until_the_clock_passes_the_interval() {
    let rig = interval_rig();
    rig.write_file("x.dat", 0o644, b"d0").unwrap();
    assert_eq!(
        contents(&rig.versions("x.dat")),
        [Some(&b"d0"[..])],
        "the creation is recorded at once"
    );
    for i in 1..=3 {
        rig.clock.advance(secs(10));
        rig.write_file("x.dat", 0o644, format!("d{i}").as_bytes())
            .unwrap();
    }
    rig.capture.run_due();
    assert_eq!(
        contents(&rig.versions("x.dat")),
        [Some(&b"d0"[..])],
        "30 s into a 60 s interval: held back"
    );
    rig.clock.advance(secs(29));
    rig.capture.run_due();
    assert_eq!(
        contents(&rig.versions("x.dat")).len(),
        1,
        "59 s: still held"
    );
    rig.clock.advance(secs(1));
    rig.capture.run_due();
    let v = rig.versions("x.dat");
    assert_eq!(contents(&v), [Some(&b"d0"[..]), Some(&b"d3"[..])]);
    assert_eq!(
        v[1].0,
        Cause::Interval,
        "recorded as the interval's version"
    );

    // That build started the next interval.
    rig.write_file("x.dat", 0o644, b"d4").unwrap();
    rig.capture.run_due();
    assert_eq!(contents(&rig.versions("x.dat")).len(), 2);
    // Before the file loses its name, what is held back is recorded.
    rig.write_file("x.dat", 0o644, b"d5").unwrap();
    let obj = object(rig.resolve("x.dat").unwrap());
    rig.vfs
        .unlink(&rig.caller, chronofs::vfs::InodeNo::ROOT, "x.dat".as_ref())
        .unwrap();
    let v = rig.versions_of(obj);
    assert_eq!(
        contents(&v),
        [Some(&b"d0"[..]), Some(&b"d3"[..]), Some(&b"d5"[..]), None]
    );
}

/// The kernel sends RELEASE after close(2) returns, so the next
/// open(O_TRUNC) of the same file can arrive first: the session it finds
/// still open has ended for its writer and is held back like any other
/// (CI saw it recorded at once, as a version inside the interval).
#[test]
fn a_release_that_arrives_after_the_next_open_is_held_back_too() {
    let rig = interval_rig();
    rig.write_file("x.dat", 0o644, b"d0").unwrap();
    let ino = rig.resolve("x.dat").unwrap();
    let mut late = None;
    for i in 1..=3 {
        let fh = rig
            .vfs
            .open(&rig.caller, ino, libc::O_WRONLY | libc::O_TRUNC)
            .unwrap()
            .fh;
        if let Some(prev) = late.replace(fh) {
            rig.vfs.release(prev).unwrap();
        }
        rig.vfs
            .write(&rig.caller, fh, 0, format!("d{i}").as_bytes(), false)
            .unwrap();
        rig.vfs.flush(fh).unwrap();
    }
    if let Some(fh) = late {
        rig.vfs.release(fh).unwrap();
    }
    rig.capture.run_due();
    assert_eq!(
        contents(&rig.versions("x.dat")),
        [Some(&b"d0"[..])],
        "inside the interval: held back"
    );
    rig.clock.advance(secs(60));
    rig.capture.run_due();
    assert_eq!(
        contents(&rig.versions("x.dat")),
        [Some(&b"d0"[..]), Some(&b"d3"[..])]
    );
}

#[test]
fn session_mode_files_are_not_held_back() {
    let rig = interval_rig();
    for i in 0..3 {
        rig.write_file("x.txt", 0o644, format!("t{i}").as_bytes())
            .unwrap();
    }
    assert_eq!(contents(&rig.versions("x.txt")).len(), 3);
}

#[test]
fn a_file_held_open_gets_a_version_each_interval() {
    let rig = Rig::with(
        CaptureConfig {
            interval: secs(60),
            every_write: false,
        },
        chronofs::policy::Policy::default(),
    );
    rig.write_file("log", 0o644, b"").unwrap();
    let ino = rig.resolve("log").unwrap();
    let fh = rig.vfs.open(&rig.caller, ino, libc::O_WRONLY).unwrap().fh;
    rig.vfs.write(&rig.caller, fh, 0, b"first", false).unwrap();
    rig.clock.advance(secs(59));
    rig.capture.run_due();
    assert_eq!(contents(&rig.versions("log")), [Some(&b""[..])]);
    rig.clock.advance(secs(1));
    rig.capture.run_due();
    let v = rig.versions("log");
    assert_eq!(contents(&v), [Some(&b""[..]), Some(&b"first"[..])]);
    assert_eq!(v[1].0, Cause::Interval);
    rig.vfs
        .write(&rig.caller, fh, 5, b" second", false)
        .unwrap();
    rig.vfs.flush(fh).unwrap();
    rig.vfs.release(fh).unwrap();
    assert_eq!(
        contents(&rig.versions("log")).last(),
        Some(&Some(&b"first second"[..])),
        "the close records the rest"
    );
}

/// Writes `data` to `path` at the clock's current time, one version.
fn version_at(rig: &Rig, path: &str, data: &str) {
    rig.write_file(path, 0o644, data.as_bytes()).unwrap();
    rig.settle();
}

/// One retention pass at the clock's time, as the cleaner runs it.
fn run_clean(rig: &Rig, text: &str) {
    retention::clean(
        &rig.history,
        &policy(text),
        rig.history.now_ns(),
        false,
        None,
    )
    .unwrap();
}

fn texts(rig: &Rig, path: &str) -> Vec<String> {
    rig.versions(path)
        .into_iter()
        .map(|(_, d)| String::from_utf8(d.unwrap()).unwrap())
        .collect()
}

#[test]
fn hourly_thinning_keeps_the_newest_of_each_of_the_last_hours() {
    let rig = Rig::new();
    // Three versions a minute apart at the top of each of four hours:
    // each triple stays within one local hour in any time zone whose
    // offset is a multiple of 15 minutes.
    for h in 0..4 {
        for m in 0..3 {
            version_at(&rig, "f.txt", &format!("{h}:0{m}"));
            rig.clock.advance(secs(60));
        }
        rig.clock.advance(secs(3600 - 180));
    }
    assert_eq!(texts(&rig, "f.txt").len(), 12);
    run_clean(&rig, "[[rule]]\nextensions = [\"txt\"]\nkeep-hourly = 2\n");
    assert_eq!(texts(&rig, "f.txt"), ["2:02", "3:02"]);
}

#[test]
fn daily_thinning_keeps_the_newest_of_each_of_the_last_days() {
    let rig = Rig::new();
    // Noon, UTC: a triple stays within one local day in any zone.
    rig.clock.advance(secs(12 * 3600));
    for d in 0..4 {
        for m in 0..3 {
            version_at(&rig, "f.txt", &format!("d{d}.{m}"));
            rig.clock.advance(secs(60));
        }
        rig.clock.advance(secs(86_400 - 180));
    }
    run_clean(&rig, "[[rule]]\nextensions = [\"txt\"]\nkeep-daily = 2\n");
    assert_eq!(texts(&rig, "f.txt"), ["d2.2", "d3.2"]);
    // Counted in days that have versions, not in calendar days: a day
    // later `keep-daily = 1` keeps the newest version alone.
    rig.clock.advance(secs(86_400));
    run_clean(&rig, "[[rule]]\nextensions = [\"txt\"]\nkeep-daily = 1\n");
    assert_eq!(texts(&rig, "f.txt"), ["d3.2"]);
}

#[test]
fn protect_keeps_young_versions_until_the_clock_moves_on() {
    let rig = Rig::new();
    for i in 0..4 {
        version_at(&rig, "f.txt", &format!("v{i}"));
        rig.clock.advance(secs(3600));
    }
    let text = "[[rule]]\nextensions = [\"txt\"]\nmax-count = 1\nprotect = \"1d\"\n";
    run_clean(&rig, text);
    assert_eq!(texts(&rig, "f.txt").len(), 4, "all younger than a day");
    // Versions at 0, 1, 2 and 3 h; now 25 h: v0 and v1 are a day old or
    // more ("younger than" excludes exactly a day), v2 and v3 are not.
    rig.clock.advance(secs(86_400 - 3 * 3600));
    run_clean(&rig, text);
    assert_eq!(texts(&rig, "f.txt"), ["v2", "v3"]);
}

#[test]
fn the_cleaner_thins_by_the_injected_clock() {
    let text = "[[rule]]\nextensions = [\"txt\"]\nmax-age = \"2d\"\n";
    let rig = Rig::with(CaptureConfig::default(), policy(text));
    version_at(&rig, "f.txt", "old");
    rig.clock.advance(secs(3600));
    version_at(&rig, "f.txt", "new");
    rig.clock.advance(secs(3 * 86_400));
    // The cleaner says when it took versions away: no polling.
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    rig.history.on_removal(Box::new(move || {
        let _ = tx.lock().unwrap().send(());
    }));
    let cell = Arc::new(PolicyCell::new(policy(text)));
    // Its period is real time (a pass every few milliseconds here); what
    // each pass removes goes by the history's clock.
    let cleaner = Cleaner::start(Arc::clone(&rig.history), cell, Duration::from_millis(5)).unwrap();
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the cleaner removed nothing");
    drop(cleaner);
    assert_eq!(texts(&rig, "f.txt"), ["new"], "the newest is always kept");
}

/// A held-back session marks the live file verified (so the next change
/// is not taken for one behind the mount's back); that must not make a
/// reader of the newest version read the live file, which holds what is
/// held back.
#[test]
fn a_held_back_change_is_not_read_as_the_newest_version() {
    let rig = interval_rig();
    rig.write_file("x.dat", 0o644, b"d0").unwrap();
    rig.clock.advance(secs(10));
    rig.write_file("x.dat", 0o644, b"d1").unwrap();
    rig.capture.run_due();
    assert_eq!(contents(&rig.versions("x.dat")), [Some(&b"d0"[..])]);
    let ino = rig.resolve("x.dat;1").unwrap();
    let fh = rig.vfs.open(&rig.caller, ino, libc::O_RDONLY).unwrap().fh;
    let data = rig.vfs.read(fh, 0, 4096).unwrap();
    rig.vfs.release(fh).unwrap();
    assert_eq!(data, b"d0", "version 1 read the held-back live file");
}
