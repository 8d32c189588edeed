//! Shared fixture for the mounted integration tests.
//!
//! * [`Mount`] mounts chronofs over a fresh temporary source directory and
//!   unmounts it on drop — also when the test panics — and then asserts that
//!   the daemon exited cleanly and (before unmounting) that it did not keep
//!   any backing regular file open after every handle was closed.
//! * [`each_mode`] runs a test body once per mount mode (default:
//!   `plain,passthrough=on` and `plain,passthrough=off`; override with
//!   `CHRONOFS_TEST_MODES="opts1;opts2"`), reporting every failing mode.
//! * [`Mount::compare`] runs the same closure in a native directory on the
//!   same file system and in the mount and asserts both results are equal
//!   (results are usually `Result<_, Errno>` so errnos are compared too).
//!
//! Temporary directories live under `CHRONOFS_TEST_TMP` (default
//! `/var/tmp`), which must not be tmpfs: the native side of every comparison
//! has to be the same kind of file system the mount is stacked on.
//! `CHRONOFS_TEST_BIN` overrides the binary under test.
#![allow(dead_code)]

#[allow(unsafe_code)]
pub mod sys;

pub mod logdisk;

pub use sys::{Errno, Fd};

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::fmt::Debug;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub const DEFAULT_MODES: &[&str] = &["passthrough=on", "passthrough=off", "plain,passthrough=on"];
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The unprivileged user used for permission tests.
pub const NOBODY: u32 = 65534;
/// A second unprivileged user (need not exist in /etc/passwd).
pub const OTHER_USER: u32 = 65533;

pub fn bin() -> PathBuf {
    match std::env::var_os("CHRONOFS_TEST_BIN") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_BIN_EXE_chronofs")),
    }
}

/// The mount modes to run, from `CHRONOFS_TEST_MODES` (separated by `;`).
pub fn modes() -> Vec<String> {
    match std::env::var("CHRONOFS_TEST_MODES") {
        Ok(s) if !s.trim().is_empty() => s
            .split(';')
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty())
            .collect(),
        _ => DEFAULT_MODES.iter().map(|s| s.to_string()).collect(),
    }
}

/// A mode's `-o` options: all but the harness's own `samedir` (which
/// mounts SRC over itself, the README's MNT = SRC form).
pub fn mount_options(mode: &str) -> String {
    mode.split(',')
        .map(str::trim)
        .filter(|o| !o.is_empty() && *o != "samedir")
        .collect::<Vec<_>>()
        .join(",")
}

/// The first configured mode (for tests that need just one mount).
pub fn first_mode() -> String {
    modes().remove(0)
}

fn panic_msg(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "<non-string panic>".into()
    }
}

/// Runs `f` with a fresh mount for each mode; fails listing every mode that
/// failed (each failure's full message is printed by the panic hook too).
pub fn each_mode(f: impl Fn(&mut Mount)) {
    let mut failures = Vec::new();
    for mode in modes() {
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            let mut m = Mount::new(&mode);
            f(&mut m);
        }));
        if let Err(p) = r {
            failures.push(format!("[mode {mode}] {}", panic_msg(&*p)));
        }
    }
    if !failures.is_empty() {
        panic!(
            "{} mode(s) failed:\n{}",
            failures.len(),
            failures.join("\n----\n")
        );
    }
}

/// The versioning mount modes: the configured modes without `plain` ones,
/// or `passthrough=on` and `passthrough=off` when every configured mode is
/// plain.
pub fn versioning_modes() -> Vec<String> {
    let v: Vec<String> = modes()
        .into_iter()
        .filter(|m| !m.split(',').any(|o| o.trim() == "plain"))
        .collect();
    if v.is_empty() {
        vec!["passthrough=on".into(), "passthrough=off".into()]
    } else {
        v
    }
}

/// Like [`each_mode`], over [`versioning_modes`] only.
pub fn each_versioning_mode(f: impl Fn(&mut Mount)) {
    each_versioning_mode_with(|_| {}, f)
}

/// Like [`each_versioning_mode`], running `setup` on the (empty) source
/// directory before each first mount.
pub fn each_versioning_mode_with(setup: impl Fn(&Path), f: impl Fn(&mut Mount)) {
    let mut failures = Vec::new();
    for mode in versioning_modes() {
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            let mut m = {
                let _serial = history_mount_lock();
                let m = Mount::new_with(&mode, &setup);
                m.wait_history_ready();
                m
            };
            let body = panic::catch_unwind(AssertUnwindSafe(|| f(&mut m)));
            let teardown = {
                let _serial = history_mount_lock();
                m.try_unmount()
            };
            match (body, teardown) {
                (Err(p), Err(e)) => {
                    eprintln!("(after a failure) fixture teardown also failed: {e}");
                    panic::resume_unwind(p)
                }
                (Err(p), Ok(())) => panic::resume_unwind(p),
                (Ok(()), Err(e)) => panic!("fixture teardown failed: {e}"),
                (Ok(()), Ok(())) => {}
            }
        }));
        if let Err(p) = r {
            failures.push(format!("[mode {mode}] {}", panic_msg(&*p)));
        }
    }
    if !failures.is_empty() {
        panic!(
            "{} mode(s) failed:\n{}",
            failures.len(),
            failures.join("\n----\n")
        );
    }
}

/// Serializes starting (until the control socket answers) and stopping
/// (until the daemon exited) versioning mounts in this process. A control
/// socket is named after the mount's device number, which the kernel reuses
/// as soon as a mount goes away: without this, a daemon still shutting down
/// removes the socket of a new mount that got its device number, and a
/// command sent before the new mount's socket exists reaches the old daemon.
pub fn history_mount_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Base directory for temporary trees; asserted not to be tmpfs.
pub fn tmp_base() -> PathBuf {
    let base = std::env::var_os("CHRONOFS_TEST_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let st = sys::statfs(&cstr(&base)).unwrap_or_else(|e| {
        panic!(
            "statfs({}) failed: {}",
            base.display(),
            io::Error::from_raw_os_error(e)
        )
    });
    assert_ne!(
        st.f_type as i64,
        TMPFS_MAGIC,
        "{} is tmpfs; set CHRONOFS_TEST_TMP to a directory on the same file system as /work",
        base.display()
    );
    base
}

/// Whether [`tmp_base`] is on a file system whose files share blocks
/// (btrfs, XFS): there a clone's file takes its base's blocks when first
/// changed, and no patched file is made.
pub fn tmp_shares_blocks() -> bool {
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683E;
    let st = sys::statfs(&cstr(tmp_base())).expect("statfs");
    [XFS, BTRFS].contains(&{ st.f_type })
}

/// A fresh 0755 temporary directory under [`tmp_base`].
pub fn tempdir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("chronofs-test-")
        .tempdir_in(tmp_base())
        .expect("create temp dir");
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Is `path` a mount point according to /proc/self/mountinfo? Returns the
/// number of mount entries stacked on it.
pub fn mount_count(path: &Path) -> usize {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    info.lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .map(|mp| unescape_mountinfo(mp) == want)
                .unwrap_or(false)
        })
        .count()
}

fn unescape_mountinfo(s: &str) -> String {
    // \040 etc. octal escapes
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn is_mounted(path: &Path) -> bool {
    mount_count(path) > 0
}

pub fn log_tail_of(path: &Path, lines: usize) -> String {
    let s = fs::read_to_string(path).unwrap_or_else(|e| format!("<cannot read log: {e}>"));
    let v: Vec<&str> = s.lines().collect();
    let start = v.len().saturating_sub(lines);
    format!(
        "--- daemon log ({}), last {} of {} lines ---\n{}\n--- end of daemon log ---",
        path.display(),
        v.len() - start,
        v.len(),
        v[start..].join("\n")
    )
}

/// Where a [`Mount`]'s directories live: a temporary directory removed
/// with it, or one the caller keeps.
pub enum Root {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl Root {
    pub fn path(&self) -> &Path {
        match self {
            Root::Temp(d) => d.path(),
            Root::Kept(p) => p,
        }
    }
}

/// A chronofs mount over a temporary source directory.
pub struct Mount {
    pub mode: String,
    dir: Root,
    /// The source (backing) directory.
    pub src: PathBuf,
    /// The mount point.
    pub mnt: PathBuf,
    /// A native directory on the same file system, for comparisons.
    pub native: PathBuf,
    pub log: PathBuf,
    /// A union: the read-only branches below `src` (which is the
    /// read-write top), top first.
    pub lowers: Vec<PathBuf>,
    /// A union of `src` alone (`SRC=rw`), not a single-directory mount.
    one_branch: bool,
    child: Option<Child>,
    generation: u32,
}

impl Mount {
    pub fn new(opts: &str) -> Mount {
        Mount::new_with(opts, |_| {})
    }

    /// Like [`Mount::new`], running `setup` on the source directory before
    /// the first mount (for files that predate the mount).
    pub fn new_with(opts: &str, setup: impl FnOnce(&Path)) -> Mount {
        let mut m = Mount::unstarted(opts);
        setup(&m.src);
        m.start();
        m
    }

    /// A union of one read-write branch, `src` (`SRC=rw`), which `setup`
    /// fills first.
    pub fn one_branch_union(opts: &str, setup: impl FnOnce(&Path)) -> Mount {
        let mut m = Mount::unstarted(opts);
        m.one_branch = true;
        setup(&m.src);
        m.start();
        m
    }

    /// [`Mount::new_with`] in `dir`, which may already hold `src`, `mnt`
    /// and `native` (`setup` is then not run).
    pub fn new_in(dir: Root, opts: &str, setup: impl FnOnce(&Path)) -> Mount {
        let fresh = !dir.path().join("src").exists();
        let mut m = Mount::unstarted_in(dir, opts);
        if fresh {
            setup(&m.src);
        }
        m.start();
        m
    }

    fn unstarted(opts: &str) -> Mount {
        Mount::unstarted_in(Root::Temp(tempdir()), opts)
    }

    fn unstarted_in(dir: Root, opts: &str) -> Mount {
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        let native = dir.path().join("native");
        for d in [&src, &mnt, &native] {
            if !d.exists() {
                fs::create_dir(d).unwrap();
                fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        let log = dir.path().join("daemon.log");
        // `samedir` in a mode: the README's MNT = SRC form (the mount
        // covers its own source; SRC is then only reachable through it).
        let mnt = if opts.split(',').any(|o| o.trim() == "samedir") {
            src.clone()
        } else {
            mnt
        };
        Mount {
            mode: opts.to_string(),
            dir,
            src,
            mnt,
            native,
            log,
            lowers: Vec::new(),
            one_branch: false,
            child: None,
            generation: 0,
        }
    }

    /// A union mount: `src` read-write on top of `lowers` read-only
    /// branches, which `setup` fills first (given `[src, lower1, ...]`).
    pub fn union(opts: &str, lowers: usize, setup: impl FnOnce(&[PathBuf])) -> Mount {
        Mount::union_in(Root::Temp(tempdir()), opts, lowers, setup)
    }

    /// [`Mount::union`] in `dir`, which may already hold `src`, `mnt`,
    /// `native` and the lowers (`setup` is then not run: a tree a power cut
    /// left, say).
    pub fn union_in(dir: Root, opts: &str, lowers: usize, setup: impl FnOnce(&[PathBuf])) -> Mount {
        let fresh = !dir.path().join("src").exists();
        let mut m = Mount {
            mode: opts.to_string(),
            src: dir.path().join("src"),
            mnt: dir.path().join("mnt"),
            native: dir.path().join("native"),
            log: dir.path().join("daemon.log"),
            lowers: (1..=lowers)
                .map(|i| dir.path().join(format!("lower{i}")))
                .collect(),
            one_branch: false,
            dir,
            child: None,
            generation: 0,
        };
        if fresh {
            let mut all = vec![m.src.clone(), m.mnt.clone(), m.native.clone()];
            all.extend(m.lowers.iter().cloned());
            for d in &all {
                fs::create_dir(d).unwrap();
                fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
            }
            let mut branches = vec![m.src.clone()];
            branches.extend(m.lowers.iter().cloned());
            setup(&branches);
        }
        m.start();
        m
    }

    /// The source argument: SRC, or a union's branch list.
    fn source_arg(&self) -> std::ffi::OsString {
        if self.lowers.is_empty() && !self.one_branch {
            return self.src.clone().into_os_string();
        }
        let mut arg = self.src.clone().into_os_string();
        arg.push("=rw");
        for l in &self.lowers {
            arg.push(":");
            arg.push(l);
            arg.push("=ro");
        }
        arg
    }

    /// A union's branch list as `mount` and `fsck` take it
    /// (`SRC=rw:LOWER1=ro:...`).
    pub fn branch_list(&self) -> String {
        let mut spec = format!("{}=rw", self.src.display());
        for l in &self.lowers {
            spec.push_str(&format!(":{}=ro", l.display()));
        }
        spec
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Path inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log_tail(&self) -> String {
        log_tail_of(&self.log, 60)
    }

    /// Spawns `chronofs mount SRC MNT -f -o OPTS --ready-fd 3` and waits
    /// for the daemon to say the mount is ready. (Watching the mount point
    /// instead is not enough: after a kill -9 a stat can be answered from
    /// the kernel's caches, and the new mount may get the dead one's device
    /// number and mount id.)
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "daemon already running");
        self.generation += 1;
        let logf = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        use std::io::Write;
        writeln!(
            &logf,
            "=== test fixture: mount #{} mode {} ===",
            self.generation, self.mode
        )
        .unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("mount")
            .arg(self.source_arg())
            .arg(&self.mnt)
            .arg("-f");
        let opts = mount_options(&self.mode);
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts);
        }
        cmd.stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .env("RUST_BACKTRACE", "1");
        // If the test process dies without running Drop, take the daemon with it.
        sys::term_on_parent_death(&mut cmd);
        // The daemon says on descriptor 3 when the mount and its control
        // socket are ready ("ok"), or why it failed.
        let (ready, ready_w) = sys::pipe_cloexec().unwrap();
        sys::pass_fd(&mut cmd, &ready_w, 3);
        cmd.arg("--ready-fd").arg("3");
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin().display()));
        drop(ready_w);
        self.child = Some(child);
        let report = self.wait_ready_line(&ready);
        if report.trim_end() != "ok" {
            let mut c = self.child.take().unwrap();
            let _ = c.kill();
            let status = c.wait();
            let _ = self.force_unmount();
            panic!(
                "chronofs mount (mode {}) did not become ready ({status:?}): {report:?}\n{}",
                self.mode,
                self.log_tail()
            );
        }
    }

    /// The daemon's readiness line (up to its newline), or what it wrote
    /// before it exited or READY_TIMEOUT passed.
    fn wait_ready_line(&mut self, ready: &std::os::fd::OwnedFd) -> String {
        let mut pipe = fs::File::from(ready.try_clone().unwrap());
        let mut line = Vec::new();
        let t0 = Instant::now();
        while !line.contains(&b'\n') && t0.elapsed() < READY_TIMEOUT {
            if !sys::readable_within(ready, 100) {
                continue;
            }
            let mut buf = [0u8; 512];
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => line.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("reading the daemon's readiness: {e}"),
            }
        }
        String::from_utf8_lossy(&line).into_owned()
    }

    /// Checks that `chronofs status` run in the mount answers for this
    /// mount's store (the daemon reported ready after starting its control
    /// socket, so this answers at once; the bounded retry only covers a
    /// mount started by other means).
    pub fn wait_history_ready(&self) {
        let want = match self.mode.split(',').find_map(|o| o.strip_prefix("store=")) {
            Some(dir) => dir.to_string(),
            None => format!("{}", self.src.join(".chronofs").display()),
        };
        let t0 = Instant::now();
        loop {
            let out = Command::new(bin())
                .args(["status", "--json"])
                .current_dir(&self.mnt)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", bin().display()));
            let text = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && text.contains(&format!("\"store\": \"{want}\"")) {
                return;
            }
            if t0.elapsed() > READY_TIMEOUT {
                panic!(
                    "mode {}: `chronofs status` never answered for {want}: {}{}\n{}",
                    self.mode,
                    text,
                    String::from_utf8_lossy(&out.stderr),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Regular files under SRC (outside the store) that the daemon still
    /// holds open with a real (non-O_PATH) descriptor.
    pub fn daemon_open_files(&self) -> Vec<String> {
        let Some(pid) = self.pid() else { return vec![] };
        let mut out = Vec::new();
        let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            return out;
        };
        let store = self.src.join(".chronofs");
        for e in rd.flatten() {
            let Ok(target) = fs::read_link(e.path()) else {
                continue;
            };
            if !target.starts_with(&self.src) || target.starts_with(&store) {
                continue;
            }
            let fdinfo = fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let flags = fdinfo
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
                .unwrap_or(0);
            if flags & (libc::O_PATH as u32) != 0 {
                continue;
            }
            match fs::symlink_metadata(&target) {
                Ok(md) if md.file_type().is_file() => {
                    out.push(format!("fd {:?} -> {}", e.file_name(), target.display()))
                }
                _ => {}
            }
        }
        out
    }

    /// Unmounts and waits for the daemon; Err describes what went wrong.
    pub fn try_unmount(&mut self) -> Result<(), String> {
        let mut problems = Vec::new();
        if self.child.is_some() {
            // Every handle the tests opened has been closed by now; RELEASE is
            // asynchronous, and so is the work a release starts (a version,
            // a clone's flattening), which a loaded machine runs late: poll
            // (a leak stays for good).
            let t0 = Instant::now();
            let mut leaked = self.daemon_open_files();
            while !leaked.is_empty() && t0.elapsed() < Duration::from_secs(15) {
                std::thread::sleep(Duration::from_millis(20));
                leaked = self.daemon_open_files();
            }
            if !leaked.is_empty() {
                problems.push(format!(
                    "daemon still holds backing files open after all handles were closed:\n  {}",
                    leaked.join("\n  ")
                ));
            }
        }
        if let Err(e) = self.force_unmount() {
            problems.push(e);
        }
        if let Some(mut c) = self.child.take() {
            let t0 = Instant::now();
            let st = loop {
                if let Some(st) = c.try_wait().unwrap() {
                    break Some(st);
                }
                if t0.elapsed() > EXIT_TIMEOUT {
                    let _ = c.kill();
                    let _ = c.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            match st {
                None => problems.push(format!(
                    "daemon did not exit within {EXIT_TIMEOUT:?} after unmount (killed)"
                )),
                Some(st) if !st.success() => {
                    problems.push(format!("daemon exited uncleanly after unmount: {st}"))
                }
                Some(_) => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "mode {}: {}\n{}",
                self.mode,
                problems.join("\n"),
                self.log_tail()
            ))
        }
    }

    /// Unmount (fusermount3 -u with retries on EBUSY, then umount -l).
    fn force_unmount(&self) -> Result<(), String> {
        if !is_mounted(&self.mnt) {
            return Ok(());
        }
        let t0 = Instant::now();
        let mut last = String::new();
        while t0.elapsed() < Duration::from_secs(5) {
            let out = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .output()
                .unwrap();
            if out.status.success() || !is_mounted(&self.mnt) {
                return Ok(());
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        if is_mounted(&self.mnt) {
            Err(format!(
                "could not unmount {} (fusermount3: {last})",
                self.mnt.display()
            ))
        } else {
            Err(format!(
                "fusermount3 -u {} kept failing ({}); lazily unmounted",
                self.mnt.display(),
                last.trim()
            ))
        }
    }

    /// Unmount now (asserting a clean daemon exit) and leave it unmounted.
    pub fn unmount(&mut self) {
        if let Err(e) = self.try_unmount() {
            panic!("{e}");
        }
    }

    /// Unmount and mount again over the same directories.
    pub fn remount(&mut self) {
        self.unmount();
        self.start();
    }

    /// kill -9 the daemon, leaving a stale mount behind.
    pub fn kill9(&mut self) {
        let mut c = self.child.take().expect("daemon not running");
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// Signals the daemon and waits (bounded) for it to exit.
    pub fn signal_and_wait(&mut self, sig: i32) -> ExitStatus {
        let mut c = self.child.take().expect("daemon not running");
        let _ = sys::kill(c.id() as i32, sig);
        let t0 = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if t0.elapsed() > EXIT_TIMEOUT {
                let _ = c.kill();
                let _ = c.wait();
                panic!(
                    "daemon did not exit within {EXIT_TIMEOUT:?} of signal {sig}\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `f` on the native directory and on the mount root; asserts equal.
    pub fn compare<T: PartialEq + Debug>(&self, what: &str, f: impl Fn(&Path) -> T) -> T {
        let native = match panic::catch_unwind(AssertUnwindSafe(|| f(&self.native))) {
            Ok(v) => v,
            Err(p) => panic!(
                "{what}: the test closure panicked on the NATIVE directory (test bug): {}",
                panic_msg(&*p)
            ),
        };
        let mounted = match panic::catch_unwind(AssertUnwindSafe(|| f(&self.mnt))) {
            Ok(v) => v,
            Err(p) => panic!(
                "{what}: panicked on the chronofs mount (mode {}), while the native run gave:\n{native:#?}\nmount panic: {}\n{}",
                self.mode,
                panic_msg(&*p),
                self.log_tail()
            ),
        };
        assert_eq!(
            native,
            mounted,
            "{what}: native (left) and chronofs mount (right, mode {}) differ\n{}",
            self.mode,
            self.log_tail()
        );
        mounted
    }

    /// Like [`compare_in`] for operation logs: reports the first differing
    /// line with a little context instead of both whole logs.
    pub fn compare_log(&self, name: &str, f: impl Fn(&Path) -> Vec<String>) {
        let run = |root: &Path| {
            let d = root.join(name);
            fs::create_dir(&d).unwrap();
            f(&d)
        };
        let native = run(&self.native);
        let mounted = match panic::catch_unwind(AssertUnwindSafe(|| run(&self.mnt))) {
            Ok(v) => v,
            Err(p) => panic!(
                "{name}: panicked on the mount (mode {}): {}\n{}",
                self.mode,
                panic_msg(&*p),
                self.log_tail()
            ),
        };
        if let Some(i) =
            (0..native.len().max(mounted.len())).find(|i| native.get(*i) != mounted.get(*i))
        {
            let ctx = |v: &[String]| v[i.saturating_sub(6)..(i + 1).min(v.len())].join("\n    ");
            panic!(
                "{name}: mount (mode {}) diverges from native at log line {i}:\n  native: {:?}\n  mount:  {:?}\n  native context:\n    {}\n  mount context:\n    {}\n{}",
                self.mode,
                native.get(i),
                mounted.get(i),
                ctx(&native),
                ctx(&mounted),
                self.log_tail()
            );
        }
    }

    /// Like [`compare`] but in fresh subdirectories `name` of both roots.
    pub fn compare_in<T: PartialEq + Debug>(&self, name: &str, f: impl Fn(&Path) -> T) -> T {
        self.compare(name, |root| {
            let d = root.join(name);
            fs::create_dir(&d).unwrap();
            f(&d)
        })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let r = self.try_unmount();
        if let Err(e) = r {
            if std::thread::panicking() {
                eprintln!("(while panicking) fixture teardown also failed: {e}");
            } else {
                panic!("fixture teardown failed: {e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Syscall helpers

pub fn cstr(p: impl AsRef<OsStr>) -> CString {
    CString::new(p.as_ref().as_bytes()).unwrap()
}

pub fn e<T>(r: io::Result<T>) -> Result<T, Errno> {
    r.map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// `Ok(())`/`Err(errno)` discarding the value.
pub fn ok<T, E>(r: Result<T, E>) -> Result<(), E> {
    r.map(|_| ())
}

// [`Fd`] itself and its raw calls live in [`sys`].
impl Fd {
    /// Reads up to `len` bytes at `off` (fewer only at end of file).
    pub fn pread(&self, len: usize, off: i64) -> Result<Vec<u8>, Errno> {
        let mut v = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let n = self.pread_into(&mut v[done..], off + done as i64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        v.truncate(done);
        Ok(v)
    }

    /// fstat(2), panicking on failure.
    pub fn fstat(&self) -> libc::stat {
        self.try_fstat()
            .unwrap_or_else(|e| panic!("fstat: {}", io::Error::from_raw_os_error(e)))
    }
}

pub fn lstat(p: &Path) -> Result<libc::stat, Errno> {
    sys::lstat(&cstr(p))
}

pub fn stat(p: &Path) -> Result<libc::stat, Errno> {
    sys::stat(&cstr(p))
}

pub fn write_file(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

pub fn read_file(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Deterministic pseudo-random bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

pub fn set_xattr(p: &Path, name: &str, val: &[u8], flags: i32) -> Result<(), Errno> {
    sys::lsetxattr(&cstr(p), &cstr(name), val, flags)
}

pub fn get_xattr(p: &Path, name: &str) -> Result<Vec<u8>, Errno> {
    let c = cstr(p);
    let n = cstr(name);
    let len = sys::lgetxattr(&c, &n, &mut [])?;
    let mut buf = vec![0u8; len + 1];
    let r = sys::lgetxattr(&c, &n, &mut buf)?;
    buf.truncate(r);
    Ok(buf)
}

pub fn list_xattr(p: &Path) -> Result<Vec<String>, Errno> {
    let c = cstr(p);
    let len = sys::llistxattr(&c, &mut [])?;
    let mut buf = vec![0u8; len + 1];
    let r = sys::llistxattr(&c, &mut buf)?;
    buf.truncate(r);
    let mut v: Vec<String> = buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    v.sort();
    Ok(v)
}

pub use sys::in_child;

/// `in_child` as the unprivileged user [`NOBODY`].
pub fn as_nobody(f: impl FnOnce() -> i32) -> i32 {
    in_child(Some((NOBODY, NOBODY)), f)
}

/// A syscall result as a child's exit value: the errno, 0 on success.
pub fn rc<T>(r: Result<T, Errno>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e,
    }
}

// ---------------------------------------------------------------------------
// Running tools

/// Runs a command in `cwd`, asserting success; returns stdout.
pub fn run(cwd: &Path, prog: &str, args: &[&str]) -> String {
    let out = run_out(cwd, prog, args);
    assert!(
        out.status.success(),
        "`{prog} {}` in {} failed: {}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        cwd.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn run_out(cwd: &Path, prog: &str, args: &[&str]) -> Output {
    Command::new(prog)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .env("LC_ALL", "C")
        .output()
        .unwrap_or_else(|e| panic!("spawn {prog}: {e}"))
}

pub fn sh(cwd: &Path, script: &str) -> String {
    run(cwd, "sh", &["-ec", script])
}

// ---------------------------------------------------------------------------
// Tree snapshots

#[derive(Debug, PartialEq, Eq, Clone)]
pub struct Entry {
    pub kind: char,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: Option<u64>,
    pub nlink: u64,
    pub mtime: Option<(i64, i64)>,
    pub target: Option<String>,
    pub data: Option<(u64, u64)>,
    pub rdev: u64,
    pub xattrs: Vec<(String, Vec<u8>)>,
    /// For non-directories with nlink > 1: the first path (in walk order)
    /// with the same inode.
    pub link_group: Option<String>,
}

#[derive(Clone, Copy)]
pub struct SnapOpts {
    pub mtimes: bool,
    pub dir_mtimes: bool,
    pub dir_nlink: bool,
}

pub const SNAP_ALL: SnapOpts = SnapOpts {
    mtimes: true,
    dir_mtimes: true,
    dir_nlink: true,
};
pub const SNAP_NO_TIMES: SnapOpts = SnapOpts {
    mtimes: false,
    dir_mtimes: false,
    dir_nlink: true,
};

/// Everything about a tree that cp -a/tar/rsync should preserve; paths are
/// relative to `root`; top-level `.chronofs` is skipped.
pub fn snapshot(root: &Path, o: SnapOpts) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut inodes: HashMap<u64, String> = HashMap::new();
    walk(root, root, o, &mut out, &mut inodes);
    out
}

fn walk(
    root: &Path,
    dir: &Path,
    o: SnapOpts,
    out: &mut BTreeMap<String, Entry>,
    inodes: &mut HashMap<u64, String>,
) {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for name in names {
        if dir == root && name == ".chronofs" {
            continue;
        }
        let p = dir.join(&name);
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let md = fs::symlink_metadata(&p).unwrap();
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            'd'
        } else if ft.is_symlink() {
            'l'
        } else if ft.is_file() {
            'f'
        } else if ft.is_fifo() {
            'p'
        } else if ft.is_socket() {
            's'
        } else if ft.is_char_device() {
            'c'
        } else {
            'b'
        };
        let mut xattrs = Vec::new();
        if let Ok(names) = list_xattr(&p) {
            for n in names {
                if n.starts_with("user.") || n.starts_with("system.posix_acl") {
                    xattrs.push((n.clone(), get_xattr(&p, &n).unwrap_or_default()));
                }
            }
        }
        let link_group = if kind != 'd' && md.nlink() > 1 {
            Some(
                inodes
                    .entry(md.ino())
                    .or_insert_with(|| rel.clone())
                    .clone(),
            )
        } else {
            None
        };
        let want_mtime = if kind == 'd' {
            o.dir_mtimes
        } else {
            o.mtimes && kind != 'l'
        };
        out.insert(
            rel.clone(),
            Entry {
                kind,
                mode: md.mode(),
                uid: md.uid(),
                gid: md.gid(),
                size: if kind == 'd' { None } else { Some(md.size()) },
                nlink: if kind == 'd' && !o.dir_nlink {
                    0
                } else {
                    md.nlink()
                },
                mtime: want_mtime.then(|| (md.mtime(), md.mtime_nsec())),
                target: (kind == 'l')
                    .then(|| fs::read_link(&p).unwrap().to_string_lossy().into_owned()),
                data: (kind == 'f').then(|| {
                    let d = read_file(&p);
                    (d.len() as u64, fnv(&d))
                }),
                rdev: md.rdev(),
                xattrs,
                link_group,
            },
        );
        if kind == 'd' {
            walk(root, &p, o, out, inodes);
        }
    }
}

/// Asserts two snapshots are equal, listing only the differing entries.
pub fn assert_same_tree(
    a: &BTreeMap<String, Entry>,
    b: &BTreeMap<String, Entry>,
    what: &str,
    log: &str,
) {
    let mut diffs = Vec::new();
    for (k, va) in a {
        match b.get(k) {
            None => diffs.push(format!("  only in left: {k}")),
            Some(vb) if va != vb => {
                diffs.push(format!("  {k}:\n    left:  {va:?}\n    right: {vb:?}"))
            }
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            diffs.push(format!("  only in right: {k}"));
        }
    }
    assert!(
        diffs.is_empty(),
        "{what}: trees differ ({} entries):\n{}\n{log}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// Builds a small tree exercising what copying tools must preserve:
/// modes, nested dirs, symlinks (relative, absolute, dangling), hard links,
/// user xattrs, an ACL, an empty file, a larger file, a fifo and fixed
/// nanosecond mtimes.
pub fn build_rich_tree(root: &Path) {
    fs::create_dir_all(root.join("dir/sub/deeper")).unwrap();
    fs::create_dir(root.join("empty_dir")).unwrap();
    write_file(&root.join("plain.txt"), b"hello world\n");
    write_file(&root.join("empty"), b"");
    write_file(&root.join("dir/big.bin"), &pattern(3 * 1024 * 1024 + 17, 7));
    write_file(&root.join("dir/sub/deeper/leaf"), b"leaf\n");
    write_file(&root.join("exec.sh"), b"#!/bin/sh\necho hi\n");
    fs::set_permissions(root.join("exec.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    write_file(&root.join("private"), b"secret\n");
    fs::set_permissions(root.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    write_file(&root.join("dir/odd mode"), b"x");
    fs::set_permissions(
        root.join("dir/odd mode"),
        fs::Permissions::from_mode(0o4751),
    )
    .unwrap();
    fs::set_permissions(root.join("dir/sub"), fs::Permissions::from_mode(0o2750)).unwrap();
    std::os::unix::fs::symlink("plain.txt", root.join("rel_link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("abs_link")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", root.join("dir/dangling")).unwrap();
    std::os::unix::fs::symlink("sub", root.join("dir/dirlink")).unwrap();
    fs::hard_link(root.join("plain.txt"), root.join("dir/hardlink")).unwrap();
    fs::hard_link(root.join("plain.txt"), root.join("dir/sub/hardlink2")).unwrap();
    set_xattr(&root.join("plain.txt"), "user.color", b"blue", 0).unwrap();
    set_xattr(&root.join("dir"), "user.dirattr", b"\x00\x01binary\xff", 0).unwrap();
    run(root, "setfacl", &["-m", "u:65534:r", "private"]);
    let c = cstr(root.join("fifo"));
    assert_eq!(sys::mkfifo(&c, 0o640), Ok(()));
    let c = cstr(root.join("owned_by_nobody"));
    fs::write(root.join("owned_by_nobody"), b"n").unwrap();
    assert_eq!(sys::chown(&c, NOBODY, NOBODY), Ok(()));
    // Fixed nanosecond timestamps, set last (deepest first so directory
    // mtimes are not bumped afterwards).
    let mut paths: Vec<PathBuf> = snapshot(root, SNAP_NO_TIMES)
        .keys()
        .map(|k| root.join(k))
        .collect();
    paths.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in paths.iter().enumerate() {
        set_times(
            p,
            (1_600_000_000 + i as i64, 123_456_789),
            (1_500_000_000 + i as i64, 987_654_321),
            true,
        );
    }
}

/// utimensat(AT_FDCWD, p, [atime, mtime], nofollow?AT_SYMLINK_NOFOLLOW:0)
pub fn set_times(p: &Path, atime: (i64, i64), mtime: (i64, i64), nofollow: bool) {
    let c = cstr(p);
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    let flags = if nofollow {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    if let Err(e) = sys::utimensat(&c, Some(&ts), flags) {
        panic!(
            "utimensat {}: {}",
            p.display(),
            io::Error::from_raw_os_error(e)
        );
    }
}

/// Reads all of `r` into a string.
pub fn read_all(mut r: impl Read) -> String {
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    s
}

/// The sorted names `dir` lists (without `.` and `..`).
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Lists `dir` (in the mount) until one listing leaves `backing` (a
/// directory the daemon reads for it) unread, i.e. the kernel answered
/// from its readdir cache: inotify sees every getdents on `backing` as
/// IN_ACCESS. Returns that listing; panics if none comes within 10 s.
pub fn wait_listing_cached(dir: &Path, backing: &Path) -> Vec<String> {
    use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
    let watch = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).unwrap();
    inotify::add_watch(&watch, backing, WatchFlags::ACCESS).unwrap();
    let read_any = || {
        let mut buf = [0u8; 4096];
        let mut any = false;
        while let Ok(n) = rustix::io::read(&watch, &mut buf) {
            any |= n > 0;
        }
        any
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        read_any();
        let names = listing(dir);
        if !read_any() {
            return names;
        }
        assert!(
            Instant::now() < deadline,
            "every listing of {} read {} again: not cached",
            dir.display(),
            backing.display()
        );
    }
}

/// The names in `dir`, sorted.
pub fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs the chronofs CLI in `cwd` (C locale, UTC), stdin closed.
pub fn chronofs_in(cwd: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin().display()))
}

/// [`chronofs_in`] the mount's root, which must succeed; its stdout.
pub fn chronofs_ok(m: &Mount, args: &[&str]) -> String {
    let out = chronofs_in(&m.mnt, args);
    assert_succeeded(m, args, &out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails the test unless `chronofs ARGS` (run as `out`) succeeded, with
/// its error output and the daemon's log.
pub fn assert_succeeded(m: &Mount, args: &[&str], out: &std::process::Output) {
    assert!(
        out.status.success(),
        "`chronofs {}` failed ({}): {}\nstdout: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout),
        m.log_tail()
    );
}

/// `chronofs branch VERB MNT ARGS...` for a union mount (`args[0]` is the
/// verb).
pub fn branch(m: &Mount, args: &[&str]) -> std::process::Output {
    let mnt = m.mnt.to_str().unwrap();
    let mut all = vec!["branch", args[0], mnt];
    all.extend_from_slice(&args[1..]);
    chronofs_in(m.root(), &all)
}

/// [`branch`], which must succeed; its stdout.
pub fn branch_ok(m: &Mount, args: &[&str]) -> String {
    let out = branch(m, args);
    assert!(
        out.status.success(),
        "branch {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        m.log_tail()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The rows of `chronofs branch list MNT --json`, top first.
pub fn branch_rows(m: &Mount) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(&branch_ok(m, &["list", "--json"])).unwrap();
    v["branches"].as_array().unwrap().clone()
}

/// Appends `data` to the file at `p`.
pub fn append_all(p: &std::path::Path, data: &[u8]) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(p)
        .unwrap_or_else(|e| panic!("open {} for append: {e}", p.display()))
        .write_all(data)
        .unwrap();
}

/// (size, st_nlink, st_ino) of each path of the mount.
pub fn shape(m: &Mount, names: &[&str]) -> Vec<(u64, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    names
        .iter()
        .map(|n| {
            let md = std::fs::metadata(m.p(n)).unwrap();
            (md.len(), md.nlink(), md.ino())
        })
        .collect()
}

/// The xattr names listxattr(2) gives for `p`.
pub fn xattr_names(p: &Path) -> Vec<String> {
    list_xattr(p).unwrap_or_else(|e| panic!("listxattr {}: {e:?}", p.display()))
}

/// Lazily unmounts a file system a test mounted (`umount -l`), however
/// the test ends.
pub struct Unmounts(pub std::path::PathBuf);

impl Drop for Unmounts {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}
