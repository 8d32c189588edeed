//! FUSE over io_uring (`-o uring=`): a mount that asks for it serves a
//! small workload through the rings and says so in `chronofs status`;
//! `uring=on` refuses to mount where the kernel does not offer it. The
//! rest of the suites run over io_uring with
//! `CHRONOFS_TEST_MODES="passthrough=on,uring=on;..."`.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use common::*;

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// The tests here read and set the module parameter: one at a time.
static PARAM_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn param() -> Option<String> {
    fs::read_to_string(PARAM).ok().map(|s| s.trim().to_string())
}

/// Turns the module parameter on for the test's duration (as root) and
/// puts the old value back after; `None` when that is impossible.
struct Enabled(Option<String>);

impl Enabled {
    fn get() -> Option<Enabled> {
        match param()?.as_str() {
            "Y" => Some(Enabled(None)),
            old => {
                fs::write(PARAM, "Y").ok()?;
                Some(Enabled(Some(old.to_string())))
            }
        }
    }
}

impl Drop for Enabled {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = fs::write(PARAM, old);
        }
    }
}

fn transport(m: &Mount) -> String {
    chronofs_ok(m, &["status", "."])
        .lines()
        .find_map(|l| l.strip_prefix("transport:").map(|t| t.trim().to_string()))
        .unwrap_or_default()
}

fn workload(root: &Path) {
    let f = root.join("a");
    fs::write(&f, b"hello").unwrap();
    assert_eq!(lstat(&f).unwrap().st_size, 5);
    fs::rename(&f, root.join("b")).unwrap();
    assert!(lstat(&f).is_err());
    fs::create_dir(root.join("d")).unwrap();
    for i in 0..50 {
        fs::write(root.join("d").join(format!("f{i}")), i.to_string()).unwrap();
    }
    let mut names: Vec<_> = fs::read_dir(root.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names.len(), 50);
    let mut h = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(root.join("b"))
        .unwrap();
    h.seek(SeekFrom::Start(5)).unwrap();
    h.write_all(&vec![7u8; 300_000]).unwrap();
    h.sync_all().unwrap();
    h.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    h.read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), 300_005);
    assert_eq!(&back[..5], b"hello");
    for i in 0..50 {
        fs::remove_file(root.join("d").join(format!("f{i}"))).unwrap();
    }
    fs::remove_dir(root.join("d")).unwrap();
    fs::remove_file(root.join("b")).unwrap();
    assert!(lstat(&root.join("b")).is_err());
}

/// The ring threads of an idle mount sleep in the kernel until a request
/// comes. They once spun, a CPU each (asking `io_uring_enter` to submit
/// more entries than were pending skips its wait), which cost warm `stat`
/// a third of its speed with no request in sight. A spinning thread is
/// never seen asleep; a waiting one nearly always.
fn assert_ring_threads_wait(m: &Mount) {
    let pid = m.pid().unwrap();
    let rings: Vec<_> = fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| t.unwrap().path())
        .filter(|t| fs::read_to_string(t.join("comm")).is_ok_and(|c| c.starts_with("fuser-ring")))
        .collect();
    assert!(!rings.is_empty(), "no ring threads in {pid}");
    let state = |t: &Path| {
        let stat = fs::read_to_string(t.join("stat")).unwrap_or_default();
        // "pid (comm) S ...": the state follows the last ')'.
        stat.rsplit(") ").next().and_then(|r| r.chars().next())
    };
    for t in &rings {
        let asleep = (0..200).filter(|_| state(t) == Some('S')).count();
        assert!(
            asleep >= 100,
            "{}: asleep in {asleep} of 200 looks",
            t.display()
        );
    }
}

#[test]
fn uring_on_serves_a_workload_and_status_shows_it() {
    let _p = PARAM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_on) = Enabled::get() else {
        eprintln!("skipped: {PARAM} is unavailable or cannot be turned on here");
        return;
    };
    for opts in ["uring=on", "uring=on,passthrough=off"] {
        let mut m = Mount::new(opts);
        m.wait_history_ready();
        workload(&m.p(""));
        assert_eq!(transport(&m), "io_uring", "{opts}: {}", m.log_tail());
        assert_ring_threads_wait(&m);
        let _g = history_mount_lock();
        m.unmount();
    }
    let mut m = Mount::new("uring=off");
    m.wait_history_ready();
    assert_eq!(transport(&m), "/dev/fuse");
    let _g = history_mount_lock();
    m.unmount();
}

#[test]
fn uring_on_fails_in_one_line_when_the_kernel_does_not_offer_it() {
    let _p = PARAM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if param().as_deref() == Some("Y") {
        eprintln!("skipped: {PARAM} is on (other mounts on this machine may rely on it)");
        return;
    }
    let t = tempdir();
    let (src, mnt) = (t.path().join("src"), t.path().join("mnt"));
    fs::create_dir(&src).unwrap();
    fs::create_dir(&mnt).unwrap();
    let out = chronofs_in(
        t.path(),
        &[
            "mount",
            src.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "-o",
            "uring=on",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("uring=on"), "{err}");
    assert!(!is_mounted(&mnt));
}
