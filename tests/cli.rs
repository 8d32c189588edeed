//! The command line: bad input fails fast with one line on stderr and
//! mounts nothing; signals unmount cleanly; stale mounts are recovered;
//! daemonized mount + `chronofs umount`.

#![deny(unsafe_code)]

mod common;
use common::*;

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Unmounts `mnt` on drop if something is (wrongly) mounted there.
struct Guard(Vec<PathBuf>);
impl Drop for Guard {
    fn drop(&mut self) {
        for p in &self.0 {
            for _ in 0..3 {
                if !is_mounted(p) {
                    break;
                }
                let _ = Command::new("fusermount3").arg("-u").arg(p).status();
                if is_mounted(p) {
                    let _ = Command::new("umount").arg("-l").arg(p).status();
                }
            }
        }
    }
}

/// Runs chronofs with `args` (bounded), returning (status, stderr, stdout).
fn run_cli(args: &[OsString], tmp: &Path) -> (ExitStatus, String, String) {
    let errf = tmp.join(format!("cli-stderr-{}", rand_suffix()));
    let outf = tmp.join(format!("cli-stdout-{}", rand_suffix()));
    let mut c = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&outf).unwrap())
        .stderr(fs::File::create(&errf).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = c.kill();
            let _ = c.wait();
            panic!(
                "`chronofs {}` did not exit within 20s\nstderr: {}",
                args.iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                fs::read_to_string(&errf).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (
        st,
        fs::read_to_string(&errf).unwrap_or_default(),
        fs::read_to_string(&outf).unwrap_or_default(),
    )
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn os(v: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    v.iter().map(|s| s.as_ref().to_os_string()).collect()
}

/// Asserts `chronofs mount SRC MNT [extra]` fails, both daemonizing and
/// with -f: non-zero exit, exactly one non-empty line on stderr, and MNT
/// has the same number of mounts as before.
fn expect_mount_failure(src: &Path, mnt: &Path, extra: &[&str], tmp: &Path, what: &str) {
    expect_mount_failure_lines(src, mnt, extra, tmp, what, true)
}

fn expect_mount_failure_lines(
    src: &Path,
    mnt: &Path,
    extra: &[&str],
    tmp: &Path,
    what: &str,
    single_line: bool,
) {
    let before = mount_count(mnt);
    let _g = Guard(if before == 0 {
        vec![mnt.to_path_buf()]
    } else {
        vec![]
    });
    for fg in [false, true] {
        let mut args = os(&[&"mount", &src, &mnt]);
        if fg {
            args.push("-f".into());
        }
        args.extend(extra.iter().map(OsString::from));
        let (st, err, _) = run_cli(&args, tmp);
        let after = mount_count(mnt);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            !st.success(),
            "{what} (-f: {fg}): exit status {st}, expected failure; stderr: {err:?}"
        );
        assert_eq!(
            after,
            before,
            "{what} (-f: {fg}): mount count at {} changed {before} -> {after}",
            mnt.display()
        );
        if !single_line {
            assert!(
                !lines.is_empty() && !err.contains("panicked"),
                "{what} (-f: {fg}): no usable error: {err:?}"
            );
            continue;
        }
        assert_eq!(
            lines.len(),
            1,
            "{what} (-f: {fg}): expected exactly one line on stderr, got {}: {err:?}",
            lines.len()
        );
        assert!(
            lines[0].len() > 10,
            "{what}: uninformative error {:?}",
            lines[0]
        );
        assert!(
            !lines[0].contains("panicked"),
            "{what}: daemon panicked: {:?}",
            lines[0]
        );
    }
}

fn mode_opts() -> Vec<String> {
    match mount_options(&first_mode()) {
        o if o.is_empty() => Vec::new(),
        o => vec!["-o".into(), o],
    }
}

#[test]
fn missing_src() {
    let t = tempdir();
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let o = mode_opts();
    let o: Vec<&str> = o.iter().map(|s| s.as_str()).collect();
    expect_mount_failure(
        &t.path().join("does-not-exist"),
        &mnt,
        &o,
        t.path(),
        "missing SRC",
    );
}

#[test]
fn src_is_a_file() {
    let t = tempdir();
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    write_file(&t.path().join("file"), b"x");
    let o = mode_opts();
    let o: Vec<&str> = o.iter().map(|s| s.as_str()).collect();
    expect_mount_failure(
        &t.path().join("file"),
        &mnt,
        &o,
        t.path(),
        "SRC is a regular file",
    );
}

#[test]
fn mnt_not_a_directory() {
    let t = tempdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    write_file(&t.path().join("mntfile"), b"x");
    let o = mode_opts();
    let o: Vec<&str> = o.iter().map(|s| s.as_str()).collect();
    expect_mount_failure(
        &src,
        &t.path().join("mntfile"),
        &o,
        t.path(),
        "MNT is a regular file",
    );
    expect_mount_failure(
        &src,
        &t.path().join("no-such-mnt"),
        &o,
        t.path(),
        "MNT missing",
    );
    assert!(!src.join(".chronofs").exists() || src.join(".chronofs").is_dir());
}

#[test]
fn unknown_mount_option() {
    let t = tempdir();
    let src = t.path().join("src");
    let mnt = t.path().join("mnt");
    fs::create_dir(&src).unwrap();
    fs::create_dir(&mnt).unwrap();
    expect_mount_failure(
        &src,
        &mnt,
        &["-o", "definitely_not_an_option=1"],
        t.path(),
        "unknown -o option",
    );
    expect_mount_failure(
        &src,
        &mnt,
        &["-o", &format!("{},bogus", mount_options(&first_mode()))],
        t.path(),
        "unknown -o option after valid ones",
    );
    expect_mount_failure(
        &src,
        &mnt,
        &["-o", "passthrough=maybe"],
        t.path(),
        "bad option value",
    );
    expect_mount_failure(
        &src,
        &mnt,
        &["-o", "attr_timeout=-3"],
        t.path(),
        "negative attr_timeout",
    );
    expect_mount_failure(
        &src,
        &mnt,
        &["-o", "uring=fast"],
        t.path(),
        "bad uring value",
    );
    // A readiness descriptor that is not open, or is stdio.
    for fd in ["97", "1", "0"] {
        expect_mount_failure(
            &src,
            &mnt,
            &["--ready-fd", fd],
            t.path(),
            &format!("--ready-fd {fd}"),
        );
    }
    // Argument-parser errors are one line too.
    expect_mount_failure(&src, &mnt, &["--no-such-flag"], t.path(), "unknown flag");
    // An empty value (store= meant the current directory).
    expect_mount_failure(&src, &mnt, &["-o", "store="], t.path(), "empty store");
    // A store whose parent is missing (a typo made the whole path), and
    // views named as the store (unreachable behind it).
    let typo = t.path().join("no-such-dir/store");
    let typo_opt = format!("store={}", typo.display());
    expect_mount_failure(&src, &mnt, &["-o", &typo_opt], t.path(), "store parent");
    assert!(!t.path().join("no-such-dir").exists(), "the typo was made");
    expect_mount_failure(
        &src,
        &mnt,
        &["-o", "history-dir=.chronofs"],
        t.path(),
        "history-dir as the store",
    );
    // Names that read as version names would hide the versions they name
    // (found by a bug hunt; test fails with the build before).
    for opts in [
        "history-dir=x;1",
        "history-dir=;deleted",
        "history-dir=x@@@now,version-sep=@@",
    ] {
        expect_mount_failure(&src, &mnt, &["-o", opts], t.path(), opts);
    }
    // History's options where -o plain keeps none.
    for opts in [
        "plain,ingest=on",
        "plain,baseline=eager",
        "plain,every-write",
        "plain,policy=/x",
    ] {
        expect_mount_failure(&src, &mnt, &["-o", opts], t.path(), opts);
    }
}

#[test]
fn src_inside_mnt() {
    let t = tempdir();
    let mnt = t.path().join("mnt");
    let src = mnt.join("inner");
    fs::create_dir_all(&src).unwrap();
    let o = mode_opts();
    let o: Vec<&str> = o.iter().map(|s| s.as_str()).collect();
    expect_mount_failure(&src, &mnt, &o, t.path(), "SRC inside MNT");
    let deeper = src.join("a/b");
    fs::create_dir_all(&deeper).unwrap();
    expect_mount_failure(&deeper, &mnt, &o, t.path(), "SRC deep inside MNT");
}

#[test]
fn mnt_already_mounted() {
    let mut m = Mount::new(&first_mode());
    write_file(&m.p("f"), b"still here");
    let src2 = m.root().join("src2");
    fs::create_dir(&src2).unwrap();
    let o = mode_opts();
    let o: Vec<&str> = o.iter().map(|s| s.as_str()).collect();
    let mnt = m.mnt.clone();
    let root = m.root().to_path_buf();
    expect_mount_failure(&src2, &mnt, &o, &root, "MNT already mounted (other SRC)");
    let src = m.src.clone();
    expect_mount_failure(&src, &mnt, &o, &root, "MNT already mounted (same SRC)");
    assert_eq!(mount_count(&mnt), 1);
    assert_eq!(
        fs::read(m.p("f")).unwrap(),
        b"still here",
        "original mount broken\n{}",
        m.log_tail()
    );
    // The first daemon is unaffected and still unmounts cleanly.
    m.unmount();
}

#[test]
fn sigterm_unmounts_cleanly() {
    signal_unmounts(libc::SIGTERM);
}

#[test]
fn sigint_unmounts_cleanly() {
    signal_unmounts(libc::SIGINT);
}

/// A mount that stays busy past the daemon's grace period is left mounted
/// on the first SIGTERM (and keeps working); the second detaches it
/// lazily, and the daemon exits once the last file is closed.
#[test]
fn sigterm_of_a_busy_mount_waits_then_the_second_detaches() {
    let mut m = Mount::new(&first_mode());
    write_file(&m.p("held"), b"data");
    let held = fs::File::open(m.p("held")).unwrap();
    let pid = m.pid().unwrap() as i32;
    let _ = sys::kill(pid, libc::SIGTERM);
    let t0 = Instant::now();
    while !m.log_tail().contains("is busy") {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no busy report after SIGTERM\n{}",
            m.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(is_mounted(&m.mnt), "a busy mount was unmounted");
    assert_eq!(
        fs::read(m.p("held")).unwrap(),
        b"data",
        "mount still serves"
    );
    let _ = sys::kill(pid, libc::SIGTERM);
    drop(held);
    // Signal 0: only waits for the exit the second SIGTERM set off.
    let st = m.signal_and_wait(0);
    assert!(st.success(), "exit status {st}\n{}", m.log_tail());
    assert!(!is_mounted(&m.mnt), "still mounted after a lazy detach");
    m.start();
}

fn signal_unmounts(sig: i32) {
    let mut m = Mount::new(&first_mode());
    write_file(&m.p("before-signal"), b"data");
    fs::create_dir(m.p("d")).unwrap();
    let st = m.signal_and_wait(sig);
    assert!(
        st.success(),
        "daemon exit status after signal {sig}: {st}\n{}",
        m.log_tail()
    );
    let t0 = Instant::now();
    while is_mounted(&m.mnt) && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !is_mounted(&m.mnt),
        "still mounted after the daemon exited on signal {sig}"
    );
    assert_eq!(fs::read(m.src.join("before-signal")).unwrap(), b"data");
    assert_eq!(
        fs::metadata(&m.mnt).unwrap().dev(),
        fs::metadata(m.root()).unwrap().dev()
    );
    // Mounts again fine afterwards.
    m.start();
    assert_eq!(fs::read(m.p("before-signal")).unwrap(), b"data");
}

#[test]
fn stale_mount_after_kill9_is_recovered() {
    let mut m = Mount::new(&first_mode());
    write_file(&m.p("survivor"), b"abc");
    m.kill9();
    assert!(
        is_mounted(&m.mnt),
        "no stale mount left after kill -9 (test premise)"
    );
    assert_eq!(
        stat(&m.mnt).err(),
        Some(libc::ENOTCONN),
        "stat of a dead FUSE mount"
    );
    // A new daemon on the same MNT must clean up the stale mount itself.
    m.start();
    assert_eq!(
        mount_count(&m.mnt),
        1,
        "stale mount not removed (mounts stacked on MNT)"
    );
    assert_eq!(
        fs::read(m.p("survivor")).unwrap(),
        b"abc",
        "{}",
        m.log_tail()
    );
    write_file(&m.p("after"), b"ok");
    m.unmount();
    assert_eq!(mount_count(&m.mnt), 0);
    assert_eq!(fs::read(m.src.join("after")).unwrap(), b"ok");
    m.start();
}

fn daemon_pids_for(mnt: &Path) -> Vec<u32> {
    let want = mnt.as_os_str().to_string_lossy().into_owned();
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        if args.iter().any(|a| a == &want)
            && args.iter().any(|a| a == "mount")
            && args[0].contains("chronofs")
        {
            out.push(pid);
        }
    }
    out
}

#[test]
fn daemonized_mount_and_cli_umount() {
    let t = tempdir();
    let src = t.path().join("src");
    let mnt = t.path().join("mnt");
    fs::create_dir(&src).unwrap();
    fs::create_dir(&mnt).unwrap();
    let _g = Guard(vec![mnt.clone()]);
    let mut args = os(&[&"mount", &src, &mnt]);
    args.extend(mode_opts().into_iter().map(OsString::from));
    let (st, err, _) = run_cli(&args, t.path());
    assert!(st.success(), "daemonizing mount failed: {st}: {err}");
    // Ready on return: no polling allowed here.
    let dev = fs::metadata(&mnt).map(|m| m.dev());
    assert_ne!(
        dev.ok(),
        Some(fs::metadata(t.path()).unwrap().dev()),
        "mount command returned before the mount was ready"
    );
    assert_eq!(mount_count(&mnt), 1);
    write_file(&mnt.join("x"), b"daemonized");
    let pids = daemon_pids_for(&mnt);
    assert_eq!(
        pids.len(),
        1,
        "expected one daemon process for {}, found {pids:?}",
        mnt.display()
    );
    // Work left for after the unmount: history takes this in the
    // background, and the daemon finishes that before it exits.
    let big: Vec<u8> = (0..96u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    write_file(&mnt.join("big"), &big);
    let (st, err, _) = run_cli(&os(&[&"umount", &mnt]), t.path());
    assert!(st.success(), "chronofs umount failed: {st}: {err}");
    assert_eq!(mount_count(&mnt), 0, "still mounted after chronofs umount");
    // Returned only once the daemon is gone, as a script that remounts
    // or copies SRC next needs.
    assert_eq!(
        daemon_pids_for(&mnt),
        Vec::<u32>::new(),
        "daemon still running after umount returned"
    );
    assert_eq!(fs::read(src.join("x")).unwrap(), b"daemonized");
    // umount of something not mounted fails with one line.
    let (st, err, _) = run_cli(&os(&[&"umount", &mnt]), t.path());
    assert!(!st.success(), "umount of an unmounted dir succeeded");
    assert_eq!(
        err.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "stderr: {err:?}"
    );
}

/// The daemon's threads of a process (`Threads:` in its status; 0 once
/// it is gone).
fn thread_count(pid: u32) -> usize {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn control_threads(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "control-conn")
                })
                .count()
        })
        .unwrap_or(0)
}

/// History commands in flight kept the daemon exiting for a second or two
/// after `chronofs umount` returned (its socket closed first); umount now
/// waits for its last thread. The commands say the mount was unmounted.
#[test]
fn cli_umount_waits_for_the_daemon_while_commands_run() {
    let t = tempdir();
    let src = t.path().join("src");
    let mnt = t.path().join("mnt");
    fs::create_dir(&src).unwrap();
    fs::create_dir(&mnt).unwrap();
    for d in 0..100 {
        let dir = src.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..100 {
            write_file(&dir.join(format!("f{f}")), b"x");
        }
    }
    let _g = Guard(vec![mnt.clone()]);
    let mut args = os(&[&"mount", &src, &mnt]);
    args.extend(mode_opts().into_iter().map(OsString::from));
    let (st, err, _) = run_cli(&args, t.path());
    assert!(st.success(), "daemonizing mount failed: {st}: {err}");
    let pid = daemon_pids_for(&mnt)[0];
    let logs: Vec<_> = (0..4)
        .map(|_| {
            Command::new(bin())
                .args(["log", "-r"])
                .arg(&mnt)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Every client connected: one still starting resolves its path
    // through the mount, and a lookup in flight makes the unmount EBUSY
    // (as a stat on a disk being unmounted does).
    let t0 = Instant::now();
    while control_threads(pid) < logs.len() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (st, err, _) = run_cli(&os(&[&"umount", &mnt]), t.path());
    assert!(st.success(), "chronofs umount failed: {st}: {err}");
    // A zombie (the test does not reap it) has its leader thread alone.
    assert!(
        thread_count(pid) <= 1,
        "daemon {pid} still has {} threads after umount returned",
        thread_count(pid)
    );
    for c in logs {
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            // One started after the unmount finds no mount.
            out.status.success()
                || err.contains("the mount was unmounted")
                || err.contains("is not inside a chronofs mount"),
            "log -r: {err}"
        );
    }
}

#[test]
fn unmount_while_file_open_is_refused_or_lazy_but_never_crashes() {
    let mut m = Mount::new(&first_mode());
    write_file(&m.p("open"), b"x");
    let fd = Fd::open(&m.p("open"), libc::O_RDONLY, 0).unwrap();
    // A plain fusermount3 -u of a busy mount fails with EBUSY and leaves it working.
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg(&m.mnt)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "fusermount3 -u of a busy mount succeeded"
    );
    assert_eq!(
        fd.pread(1, 0).unwrap(),
        b"x",
        "mount unusable after refused unmount\n{}",
        m.log_tail()
    );
    assert!(m.pid().is_some());
    drop(fd);
    m.unmount();
}

#[test]
fn store_option_and_timeouts_are_honoured() {
    let t = tempdir();
    let store = t.path().join("elsewhere");
    let opts = format!(
        "{},store={},attr_timeout=0,entry_timeout=0",
        first_mode(),
        store.display()
    );
    let mut m = Mount::new(&opts);
    write_file(&m.p("f"), b"with external store");
    assert_eq!(fs::read(m.p("f")).unwrap(), b"with external store");
    m.unmount();
    assert!(
        !m.src.join(".chronofs").exists(),
        "store=DIR given, yet SRC/.chronofs was created"
    );
    assert!(
        store.is_dir() && fs::read_dir(&store).unwrap().count() > 0,
        "store=DIR given, but {} is missing or empty",
        store.display()
    );
    assert_eq!(fs::read(m.src.join("f")).unwrap(), b"with external store");
    m.start();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"with external store");
}

/// `--store DIR` with a path (or working directory) inside a mount is
/// refused in one line: the mount answers from its own store, and the
/// command acted on that one with exit 0 (found by a bug hunt: `gc
/// --store /nonexistent` inside a mount collected the mount's store).
#[test]
fn store_flag_inside_a_mount_is_refused() {
    let m = Mount::new(&first_mode());
    write_file(&m.p("x"), b"x");
    let other = tempdir();
    let other = other.path().to_str().unwrap().to_string();
    for args in [
        &["status", "--store", "/nonexistent"][..],
        &["fsck", "--store", "/nonexistent"],
        &["gc", "--dry-run", "--store", "/nonexistent"],
        &["log", "x", "--store", &other],
    ] {
        let out = chronofs_in(&m.mnt, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded: {err}");
        assert!(err.contains("--store"), "{args:?}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
    }
    let out = chronofs_in(&m.mnt, &["status"]);
    assert!(out.status.success(), "{out:?}");
}

/// `ingest PATH` walks the whole mount: a missing PATH or a file is
/// refused in one line instead of read as one (found by a bug hunt: both
/// walked the mount, exit 0).
#[test]
fn ingest_refuses_a_missing_path_or_a_file() {
    let m = Mount::new(&first_mode());
    write_file(&m.p("f"), b"x");
    for path in ["does/not/exist", "f"] {
        let out = chronofs_in(&m.mnt, &["ingest", path]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "ingest {path} succeeded: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{path}: not one line: {err}");
    }
}

/// The README's MNT = SRC form: a directory mounted over itself records
/// history of new and pre-existing files, answers `chronofs log`, and
/// unmounts with `chronofs umount` and with SIGTERM.
#[test]
fn mount_over_its_own_source() {
    let t = tempdir();
    let d = t.path().join("d");
    fs::create_dir(&d).unwrap();
    write_file(&d.join("pre"), b"pre\n");
    let _g = Guard(vec![d.clone()]);
    let parent_dev = fs::metadata(t.path()).unwrap().dev();
    for stop in ["umount", "sigterm"] {
        let mut args = os(&[&"mount", &d, &d]);
        if stop == "umount" {
            // The default store, spelled out, is inside MNT = SRC but
            // hidden there: accepted.
            args.push("-o".into());
            args.push(format!("store={}/.chronofs", d.display()).into());
        }
        let (st, err, _) = run_cli(&args, t.path());
        assert!(st.success(), "mount d d failed: {st}: {err}");
        assert_ne!(fs::metadata(&d).unwrap().dev(), parent_dev, "not mounted");
        write_file(&d.join("x"), b"a\n");
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(d.join("x"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"b\n").unwrap();
        drop(f);
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(d.join("pre"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"more\n").unwrap();
        drop(f);
        for name in ["x", "pre"] {
            let (st, err, out) = run_cli(&os(&[&"log", &d.join(name), &"--json"]), t.path());
            assert!(st.success(), "log {name} ({stop}): {st}: {err}");
            assert!(out.contains("\"seq\""), "log {name} lists nothing: {out}");
        }
        match stop {
            "umount" => {
                let (st, err, _) = run_cli(&os(&[&"umount", &d]), t.path());
                assert!(st.success(), "chronofs umount d: {st}: {err}");
            }
            _ => {
                let pids = daemon_pids_for(&d);
                assert_eq!(pids.len(), 1, "daemons: {pids:?}");
                let pid = i32::try_from(pids[0]).unwrap();
                assert_eq!(
                    Command::new("kill")
                        .args(["-TERM", &pid.to_string()])
                        .status()
                        .unwrap()
                        .code(),
                    Some(0)
                );
            }
        }
        let t0 = Instant::now();
        while !daemon_pids_for(&d).is_empty() || mount_count(&d) != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "still mounted or running 10 s after {stop}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        fs::remove_file(d.join("x")).unwrap();
    }
    assert_eq!(fs::read(d.join("pre")).unwrap(), b"pre\nmore\nmore\n");
}

/// `chronofs SRC MNT -o ...` (how mount.fuse3 runs a `fuse.chronofs` fstab
/// line) still mounts, now that unknown verbs are refused.
#[test]
fn helper_shorthand_still_mounts() {
    let t = tempdir();
    let src = t.path().join("src");
    let mnt = t.path().join("mnt");
    fs::create_dir(&src).unwrap();
    fs::create_dir(&mnt).unwrap();
    let _g = Guard(vec![mnt.clone()]);
    let mut args = os(&[&src, &mnt]);
    args.extend(mode_opts().into_iter().map(OsString::from));
    let (st, err, _) = run_cli(&args, t.path());
    assert!(st.success(), "shorthand mount failed: {st}: {err}");
    assert_eq!(mount_count(&mnt), 1);
    let (st, err, _) = run_cli(&os(&[&"umount", &mnt]), t.path());
    assert!(st.success(), "chronofs umount failed: {st}: {err}");
    // A word that is neither a verb nor a path is not a mount.
    let (st, err, _) = run_cli(&os(&[&"branches", &mnt]), t.path());
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("unknown command 'branches'"), "{err}");
    assert_eq!(mount_count(&mnt), 0);
}

/// `-o external-changes` in the form an fstab line reaches chronofs
/// (`chronofs SRC MNT -o OPTS`, from mount.fuse3): a file changed in SRC
/// shows through the mount within the documented second.
#[test]
fn helper_shorthand_takes_external_changes() {
    let t = tempdir();
    let src = t.path().join("src");
    let mnt = t.path().join("mnt");
    fs::create_dir(&src).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(src.join("f"), b"one").unwrap();
    let _g = Guard(vec![mnt.clone()]);
    let mut opts = mount_options(&first_mode());
    opts.push_str(if opts.is_empty() { "" } else { "," });
    opts.push_str("external-changes");
    let (st, err, _) = run_cli(&os(&[&src, &mnt, &"-o", &opts]), t.path());
    assert!(st.success(), "shorthand mount failed: {st}: {err}");
    assert_eq!(fs::metadata(mnt.join("f")).unwrap().len(), 3);
    fs::write(src.join("f"), b"changed").unwrap();
    let t0 = Instant::now();
    while fs::metadata(mnt.join("f")).unwrap().len() != 7 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "a change in SRC not shown after {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (st, err, _) = run_cli(&os(&[&"umount", &mnt]), t.path());
    assert!(st.success(), "chronofs umount failed: {st}: {err}");
}

/// A daemon whose mount was unmounted (`fusermount3 -u`) but that exits
/// only after a new mount was made at the same place leaves that mount
/// alone. (fuser 0.18.0 took the dead connection for a live one and
/// unmounted the path as the daemon exited: a quick remount vanished.)
#[test]
fn a_new_mount_survives_the_exit_of_the_daemon_unmounted_before_it() {
    let tmp = tempdir();
    let (src1, src2, mnt) = (
        tmp.path().join("s1"),
        tmp.path().join("s2"),
        tmp.path().join("m"),
    );
    for d in [&src1, &src2, &mnt] {
        fs::create_dir(d).unwrap();
    }
    fs::write(src2.join("second"), b"2").unwrap();
    let start = |src: &Path| {
        Command::new(bin())
            .arg("mount")
            .arg(src)
            .arg(&mnt)
            .args(["-f", "-o", "plain"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mounted_within = |deadline: Duration| {
        let t0 = Instant::now();
        while !is_mounted(&mnt) && t0.elapsed() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        is_mounted(&mnt)
    };
    let signal = |pid: u32, sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success(), "kill {sig} {pid}");
    };
    let mut first = start(&src1);
    assert!(mounted_within(Duration::from_secs(10)), "first mount");
    // Stopped between its unmount and its exit.
    signal(first.id(), "-STOP");
    let unmounted = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    let mut second = start(&src2);
    let second_up = mounted_within(Duration::from_secs(10));
    signal(first.id(), "-CONT");
    first.wait().unwrap();
    let survived = is_mounted(&mnt) && fs::read(mnt.join("second")).ok() == Some(b"2".to_vec());
    let _ = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    let _ = second.wait();
    assert!(unmounted.unwrap().success(), "fusermount3 -u of the first");
    assert!(second_up, "second mount");
    assert!(
        survived,
        "the new mount was unmounted by the old daemon's exit"
    );
}

/// clap's usage errors as one line (no usage block, no `-- -3` tip that
/// would make a mistyped value a path), malformed values with exit 2,
/// and a failed write of standard output as one line with exit 1, never
/// a panic.
#[test]
fn usage_errors_and_output_failures_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        vec!["prune", "f", "--max-age", "-30d"],
        vec!["prune", "f", "--max-age", "5x"],
        vec!["diff"],
        vec!["log", "--since"],
        vec!["prune", "--keep-last", "x", "f"],
        vec!["tag", "x", "--delete", "--at", "5x"],
    ] {
        let (st, err, _) = run_cli(
            &os(&args.iter().map(|a| a as _).collect::<Vec<_>>()),
            tmp.path(),
        );
        assert_eq!(st.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("Usage") && !err.contains("tip"), "{err}");
    }
    // A store to read: a fixture of a mount directory with its store.
    let status = Command::new("tar")
        .arg("xzf")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-f8.tar.gz"))
        .arg("-C")
        .arg(tmp.path())
        .status()
        .unwrap();
    assert!(status.success());
    let out = Command::new(bin())
        .args(["log", "notes.txt"])
        .current_dir(tmp.path())
        .stdout(
            fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
}

/// `chronofs umount` unmounts chronofs mounts only: SRC typed for MNT,
/// or any other mount point, is refused and left mounted.
#[test]
fn umount_refuses_what_is_not_a_chronofs_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let (st, err, _) = run_cli(&os(&[&"umount", &"--lazy", &"/proc"]), tmp.path());
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("not a chronofs one"), "{err}");
    assert!(Path::new("/proc/self/mountinfo").exists(), "/proc went");
    let (st, err, _) = run_cli(&os(&[&"umount", &tmp.path()]), tmp.path());
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("not a mount point"), "{err}");
}

/// `tag --help` says who may delete a tag: its maker or root (it said
/// root only, which the daemon never held to).
#[test]
fn tag_help_names_who_may_delete() {
    let tmp = tempfile::tempdir().unwrap();
    let (st, err, out) = run_cli(&os(&[&"tag", &"--help"]), tmp.path());
    assert_eq!(st.code(), Some(0), "{err}");
    let line = out.lines().find(|l| l.contains("--delete")).unwrap_or("");
    let text = out.split("--delete").nth(1).unwrap_or("");
    assert!(text.contains("its maker or root"), "{line}\n{out}");
    assert!(!text.contains("root only"), "{out}");
}

/// The verbs `chronofs --help` lists (clap's own `help` left out).
fn help_verbs(tmp: &Path) -> Vec<String> {
    let (st, err, out) = run_cli(&os(&[&"--help"]), tmp);
    assert_eq!(st.code(), Some(0), "{err}");
    let commands = out.split("Commands:").nth(1).unwrap_or("");
    let verbs: Vec<String> = commands
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|v| v != "help")
        .collect();
    assert!(verbs.len() > 20, "{out}");
    verbs
}

/// `chronofs completions SHELL` names every verb and real options; `man
/// --dir` writes a page for the command and one per (nested) verb.
#[test]
fn completions_and_man_pages_cover_every_verb() {
    let tmp = tempfile::tempdir().unwrap();
    let verbs = help_verbs(tmp.path());
    for shell in ["bash", "zsh", "fish"] {
        let (st, err, script) = run_cli(&os(&[&"completions", &shell]), tmp.path());
        assert_eq!(st.code(), Some(0), "{shell}: {err}");
        for word in verbs
            .iter()
            .map(String::as_str)
            .chain(["keep-daily", "instantiate", "dry-run"])
        {
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
    let (st, err, _) = run_cli(&os(&[&"completions", &"tcsh"]), tmp.path());
    assert_eq!(st.code(), Some(2), "{err}");
    let dir = tmp.path().join("man/man1");
    let (st, err, _) = run_cli(&os(&[&"man", &"--dir", &dir]), tmp.path());
    assert_eq!(st.code(), Some(0), "{err}");
    let top = fs::read_to_string(dir.join("chronofs.1")).unwrap();
    assert!(
        top.starts_with(".ie") || top.contains(".TH chronofs 1"),
        "{top}"
    );
    for verb in &verbs {
        let page = fs::read_to_string(dir.join(format!("chronofs-{verb}.1")))
            .unwrap_or_else(|e| panic!("chronofs-{verb}.1: {e}"));
        assert!(page.contains(&format!(".TH chronofs-{verb} 1")), "{page}");
        assert!(top.contains(verb.as_str()), "chronofs.1 lacks {verb}");
    }
    let page = fs::read_to_string(dir.join("chronofs-template-create.1")).unwrap();
    assert!(page.contains("NAME"), "{page}");
    let (st, err, out) = run_cli(&os(&[&"man"]), tmp.path());
    assert_eq!(st.code(), Some(0), "{err}");
    assert_eq!(out, top);
}
