//! Version policies, retention, prune, purge and garbage collection on
//! real mounts, through the CLI: a policy's exclusions and limits end
//! with exactly the versions it implies; time-based retention runs on an
//! injected clock (`clean --now`), never by sleeping; tags pin; deleted
//! trees expire whole; non-root users cannot purge, collect or prune what
//! is not theirs, nor anything inside the protection window; gc keeps
//! every referenced chunk while files are written, and after kill -9 at
//! any point.

#![deny(unsafe_code)]

mod common;
use common::*;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Runs `chronofs ARGS` (as `uid` if given), returning its output.
fn cli_as(uid: Option<u32>, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .stdin(Stdio::null());
    if let Some(u) = uid {
        c.uid(u).gid(u).env("XDG_RUNTIME_DIR", "/nonexistent");
    }
    c.output()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin().display()))
}

fn cli(args: &[&str]) -> String {
    let out = cli_as(None, args);
    assert!(
        out.status.success(),
        "`chronofs {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cli_json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let text = cli(&a);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("bad JSON ({e}): {text}"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Contents of every version of `path`, oldest first (unrecorded: None).
fn versions(path: &Path) -> Vec<Option<Vec<u8>>> {
    let log = cli_json(&["log", s(path)]);
    let n = log["versions"].as_array().unwrap().len();
    (1..=n)
        .map(|i| {
            let out = cli_as(None, &["cat", s(path), "--version", &i.to_string()]);
            out.status.success().then_some(out.stdout)
        })
        .collect()
}

fn version_count(path: &Path) -> usize {
    cli_json(&["log", s(path)])["versions"]
        .as_array()
        .unwrap()
        .len()
}

/// A policy file in its own directory (the mount's options name it).
struct PolicyFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl PolicyFile {
    fn new(text: &str) -> PolicyFile {
        let dir = tempdir();
        let path = dir.path().join("policy.toml");
        fs::write(&path, text).unwrap();
        PolicyFile { _dir: dir, path }
    }
    fn opts(&self) -> String {
        format!(
            "{},policy={},clean-interval=0",
            first_versioning_mode(),
            self.path.display()
        )
    }
}

fn first_versioning_mode() -> String {
    versioning_modes().remove(0)
}

fn mount_with(policy: &PolicyFile) -> Mount {
    let _serial = history_mount_lock();
    let m = Mount::new(&policy.opts());
    m.wait_history_ready();
    m
}

fn assert_consistent(m: &Mount) {
    let r = cli_json(&["fsck", s(&m.mnt)]);
    assert_eq!(r["problems"], Value::Array(vec![]), "fsck: {r}");
}

#[test]
fn a_policy_ends_with_exactly_the_versions_it_implies() {
    let policy = PolicyFile::new(
        r#"
[[rule]]
name = "objects"
paths = ["**/*.o", "*.o"]
version = false

[[rule]]
name = "texts"
extensions = ["txt"]
max-count = 3
"#,
    );
    let m = mount_with(&policy);
    fs::create_dir(m.p("build")).unwrap();
    for i in 0..6 {
        write_file(&m.p("a.txt"), format!("a version {i}\n").as_bytes());
        // Sizes differ, so each write is a change even without content.
        write_file(&m.p("build/x.o"), &pattern(1000 + i * 100, i as u64));
        write_file(&m.p("notes.md"), format!("notes {i}\n").as_bytes());
    }
    write_file(&m.p("b.txt"), b"b one\n");
    write_file(&m.p("b.txt"), b"b two\n");
    // Excluded content is never stored, before any cleaning.
    for v in versions(&m.p("build/x.o")) {
        assert_eq!(v, None, "an excluded file's content was stored");
    }
    let err = cli_as(None, &["cat", s(&m.p("build/x.o")), "--version", "1"]);
    assert!(String::from_utf8_lossy(&err.stderr).contains("not versioned by policy"));
    assert_eq!(
        e(fs::read(m.p("build/x.o;1"))).unwrap_err(),
        libc::ENODATA,
        "reading an unrecorded version through the mount"
    );

    let r = cli_json(&["clean", s(&m.mnt)]);
    assert!(
        r["outcome"]["versions_removed"].as_u64().unwrap() > 0,
        "{r}"
    );
    let a: Vec<_> = versions(&m.p("a.txt"));
    let want: Vec<_> = (3..6)
        .map(|i| Some(format!("a version {i}\n").into_bytes()))
        .collect();
    assert_eq!(a, want, "a.txt keeps its 3 newest versions");
    assert_eq!(version_count(&m.p("b.txt")), 2);
    assert_eq!(
        version_count(&m.p("notes.md")),
        6,
        "no rule: every version kept"
    );
    assert_eq!(
        version_count(&m.p("build/x.o")),
        1,
        "unversioned: newest state only"
    );
    // What history holds is intact, and the pruned chunks can go.
    assert_consistent(&m);
    let g = cli_json(&["gc", s(&m.mnt)]);
    assert!(g["removed_chunks"].as_u64().unwrap() > 0, "{g}");
    assert_consistent(&m);
    assert_eq!(versions(&m.p("a.txt")), want);
    // A second pass has nothing left to do.
    let again = cli_json(&["clean", s(&m.mnt)]);
    assert_eq!(again["outcome"]["versions_removed"], 0, "{again}");
}

#[test]
fn time_based_retention_follows_the_injected_clock() {
    let policy = PolicyFile::new(
        r#"
[defaults]
max-age = "30d"

[[rule]]
name = "logs"
extensions = ["log"]
max-count = 1
protect = "7d"
"#,
    );
    let m = mount_with(&policy);
    for i in 0..4 {
        write_file(&m.p("f.txt"), format!("f{i}").as_bytes());
        write_file(&m.p("app.log"), format!("log line {i}").as_bytes());
    }
    // Inside the protection window nothing goes, whatever max-count says.
    cli(&["clean", s(&m.mnt)]);
    assert_eq!(version_count(&m.p("app.log")), 4);
    assert_eq!(version_count(&m.p("f.txt")), 4);
    // Eight days on: the window has passed for the log.
    cli(&["clean", s(&m.mnt), "--now", "+8d"]);
    assert_eq!(version_count(&m.p("app.log")), 1);
    assert_eq!(version_count(&m.p("f.txt")), 4, "younger than max-age");
    let first_seq = cli_json(&["log", s(&m.p("f.txt"))])["versions"][0]["seq"]
        .as_u64()
        .unwrap()
        .to_string();
    assert_eq!(cli(&["cat", s(&m.p("f.txt")), "--at", &first_seq]), "f0");
    // Forty days on: max-age drops all but the newest, which always stays.
    cli(&["clean", s(&m.mnt), "--now", "+40d"]);
    assert_eq!(versions(&m.p("f.txt")), vec![Some(b"f3".to_vec())]);
    // A query before the oldest kept version reads that version: the
    // nearest state history holds, never the live file or "did not exist".
    write_file(&m.p("f.txt"), b"live now");
    assert_eq!(cli(&["cat", s(&m.p("f.txt")), "--at", &first_seq]), "f3");
    let listing = cli(&["ls", s(&m.mnt), "--at", &first_seq]);
    assert!(listing.contains("f.txt"), "{listing}");
    assert_consistent(&m);
}

#[test]
fn deleted_trees_expire_whole_and_tags_pin() {
    let policy = PolicyFile::new("[defaults]\nmax-age = \"30d\"\n");
    let m = mount_with(&policy);
    fs::create_dir_all(m.p("u/deep")).unwrap();
    write_file(&m.p("u/deep/kept.txt"), b"pinned by the tag");
    cli(&["tag", "before-t", "--path", s(&m.mnt)]);
    fs::create_dir_all(m.p("t/deep")).unwrap();
    for i in 0..5 {
        write_file(&m.p(&format!("t/deep/f{i}")), &pattern(5000, i));
    }
    fs::remove_dir_all(m.p("t")).unwrap();
    fs::remove_dir_all(m.p("u")).unwrap();
    let deleted = |m: &Mount| -> Vec<String> {
        cli_json(&["ls", s(&m.mnt), "--deleted"])["deleted"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(deleted(&m), vec!["t", "u"]);
    cli(&["clean", s(&m.mnt), "--now", "+10d"]);
    assert_eq!(deleted(&m), vec!["t", "u"], "not expired yet");
    let r = cli_json(&["clean", s(&m.mnt), "--now", "+40d"]);
    assert!(
        r["outcome"]["objects_removed"].as_u64().unwrap() >= 7,
        "{r}"
    );
    assert_eq!(
        deleted(&m),
        vec!["u"],
        "t expired whole; u is pinned by the tag"
    );
    assert_eq!(
        read_file(&m.p(".history/@before-t/u/deep/kept.txt")),
        b"pinned by the tag"
    );
    let g = cli_json(&["gc", s(&m.mnt)]);
    assert!(g["removed_chunks"].as_u64().unwrap() >= 5, "{g}");
    assert_consistent(&m);
    // Undelete still works for what is kept.
    cli(&["undelete", s(&m.p("u"))]);
    assert_eq!(read_file(&m.p("u/deep/kept.txt")), b"pinned by the tag");
}

#[test]
fn non_root_users_cannot_erase_history_that_is_not_theirs_or_protected() {
    let policy = PolicyFile::new("[bounds]\nprotect = \"7d\"\n");
    let m = mount_with(&policy);
    fs::set_permissions(&m.mnt, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    for i in 0..3 {
        write_file(&m.p("roots.txt"), format!("root {i}").as_bytes());
    }
    // One version per write, also when the kernel sends a release late
    // (CI under load once recorded the next open's truncation as a fourth).
    assert_eq!(version_count(&m.p("roots.txt")), 3);
    let denied = |args: &[&str]| {
        let out = cli_as(Some(NOBODY), args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{args:?} as nobody: {err}");
        assert!(err.contains("operation not permitted"), "{args:?}: {err}");
    };
    denied(&["prune", s(&m.p("roots.txt")), "--keep-last", "1"]);
    denied(&["purge", s(&m.p("roots.txt"))]);
    denied(&["gc", s(&m.mnt)]);
    denied(&["clean", s(&m.mnt)]);
    denied(&["policy", "reload", s(&m.mnt)]);
    denied(&["audit", s(&m.mnt)]);
    assert_eq!(
        version_count(&m.p("roots.txt")),
        3,
        "nothing refused changed history"
    );
    // Their own file: allowed, but the protection window holds.
    let rc = as_nobody(|| {
        for i in 0..3 {
            if fs::write(m.p("mine.txt"), format!("mine {i}")).is_err() {
                return 1;
            }
        }
        0
    });
    assert_eq!(rc, 0);
    let out = cli_as(
        Some(NOBODY),
        &["prune", s(&m.p("mine.txt")), "--keep-last", "1"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        version_count(&m.p("mine.txt")),
        3,
        "inside the protection window"
    );
    // Root may prune beyond policy.
    cli(&["prune", s(&m.p("mine.txt")), "--keep-last", "1"]);
    assert_eq!(version_count(&m.p("mine.txt")), 1);
    let audit = cli_json(&["audit", s(&m.mnt)]);
    let actions: Vec<&str> = audit["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert!(actions.contains(&"prune"), "{audit}");
}

#[test]
fn purge_removes_a_file_and_all_its_history() {
    let policy = PolicyFile::new("");
    let m = mount_with(&policy);
    fs::create_dir(m.p("d")).unwrap();
    for i in 0..3 {
        write_file(&m.p("d/secret.txt"), format!("secret {i}").as_bytes());
    }
    write_file(&m.p("d/other.txt"), b"stays");
    // Bytes zstd cannot shrink are stored as they are: a pack that still
    // held them would show them. Beside a much larger live file, their
    // pack is far too live for gc to rewrite by share alone.
    let secret = pattern(64 * 1024, 1);
    let big = pattern(4 << 20, 2);
    write_file(&m.p("d/big.bin"), &big);
    write_file(&m.p("d/secret.bin"), &secret);
    cli(&["log", s(&m.p("d/secret.bin"))]);
    // With MNT = SRC the store lies under the mount point, out of reach:
    // the packs are read in the other modes.
    let packs = (!m.mode.contains("samedir")).then(|| m.src.join(".chronofs/packs"));
    let held = |needle: &[u8]| {
        let Some(packs) = &packs else { return None };
        Some(fs::read_dir(packs).unwrap().any(|e| {
            let bytes = fs::read(e.unwrap().path()).unwrap();
            bytes.windows(needle.len()).any(|w| w == needle)
        }))
    };
    assert_ne!(
        held(&secret[1000..1064]),
        Some(false),
        "the test needs the bytes stored raw"
    );
    let r = cli_json(&["purge", s(&m.p("d/secret.bin"))]);
    assert_eq!(r["collected"]["scrub_pending"], 0, "{r}");
    assert_ne!(
        held(&secret[1000..1064]),
        Some(true),
        "purged bytes still in a pack: {r}"
    );
    assert_eq!(read_file(&m.p("d/big.bin")), big);
    let dry = cli_json(&["purge", s(&m.p("d/secret.txt")), "--dry-run"]);
    assert!(
        m.p("d/secret.txt").exists(),
        "dry run removed the file: {dry}"
    );
    let r = cli_json(&["purge", s(&m.p("d/secret.txt"))]);
    assert_eq!(r["objects"], 1, "{r}");
    assert!(!m.p("d/secret.txt").exists());
    let log = cli_as(None, &["log", s(&m.p("d/secret.txt"))]);
    assert!(!log.status.success(), "history of a purged file remains");
    let listed = cli_json(&["ls", s(&m.p("d")), "--deleted"]);
    assert_eq!(listed["deleted"], Value::Array(vec![]), "{listed}");
    assert_eq!(read_file(&m.p("d/other.txt")), b"stays");
    let audit = cli_json(&["audit", s(&m.mnt)]);
    assert!(audit.to_string().contains("\"purge\""), "{audit}");
    cli(&["gc", s(&m.mnt)]);
    assert_consistent(&m);
}

/// A file with other hard links is refused before its name goes: its
/// removal would leave it alive under the others, and the purge would
/// then refuse it with the name already gone.
#[test]
fn purge_of_a_file_with_other_links_is_refused_and_removes_nothing() {
    let policy = PolicyFile::new("");
    let m = mount_with(&policy);
    write_file(&m.p("a"), b"shared\n");
    fs::hard_link(m.p("a"), m.p("b")).unwrap();
    let out = cli_as(None, &["purge", s(&m.p("a"))]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("hard links") && err.lines().count() == 1,
        "{err}"
    );
    assert_eq!(read_file(&m.p("a")), b"shared\n");
    assert_eq!(read_file(&m.p("b")), b"shared\n");
    fs::remove_file(m.p("b")).unwrap();
    let r = cli_json(&["purge", s(&m.p("a"))]);
    assert_eq!(r["objects"], 1, "{r}");
    assert!(!m.p("a").exists());
}

/// Issue 14.7: the kernel caches view entries and attributes for a day;
/// purge must make it forget them, or `.history/@T/f` keeps its size and
/// reads fail with EIO until a remount.
#[test]
fn purge_leaves_no_stale_time_travel_entry() {
    let policy = PolicyFile::new("");
    let m = mount_with(&policy);
    fs::create_dir(m.p("d")).unwrap();
    write_file(&m.p("d/keep"), b"kept");
    write_file(&m.p("d/big.bin"), &pattern(1 << 20, 7));
    let log = cli_json(&["log", s(&m.p("d/big.bin"))]);
    let seq = log["versions"]
        .as_array()
        .and_then(|v| v.last())
        .and_then(|v| v["seq"].as_u64())
        .unwrap_or_else(|| panic!("no seq in {log}"));
    fs::remove_file(m.p("d/big.bin")).unwrap();
    let past = m.p(&format!(".history/@{seq}/d"));
    let by_name = m.p("d/big.bin;1");
    // Into the kernel's caches: entries, attributes and pages.
    assert_eq!(fs::metadata(past.join("big.bin")).unwrap().len(), 1 << 20);
    assert_eq!(fs::read(past.join("big.bin")).unwrap().len(), 1 << 20);
    assert_eq!(fs::read(&by_name).unwrap().len(), 1 << 20);
    // And the listing, which the kernel keeps across opens.
    for _ in 0..2 {
        assert_eq!(listing(&past), ["big.bin", "keep"]);
    }
    cli(&["purge", s(&m.p("d/big.bin"))]);
    cli(&["gc", s(&m.mnt)]);
    for gone in [past.join("big.bin"), by_name] {
        let err = fs::metadata(&gone).map(|md| md.len());
        assert_eq!(
            err.map_err(|e| e.raw_os_error()),
            Err(Some(libc::ENOENT)),
            "{gone:?}"
        );
        let err = fs::read(&gone).map(|d| d.len());
        assert_eq!(
            err.map_err(|e| e.raw_os_error()),
            Err(Some(libc::ENOENT)),
            "{gone:?}"
        );
    }
    let names: Vec<_> = fs::read_dir(&past)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("keep")]);
    assert_eq!(fs::read(past.join("keep")).unwrap(), b"kept");
}

/// Issue 14.8: with no administrator bounds, an owner still cannot erase
/// a deleted file's recent history, and is told why less went than asked;
/// a user may remove the tags they made, and only those.
#[test]
fn owners_cannot_silently_erase_recent_history_and_remove_only_their_tags() {
    let policy = PolicyFile::new("");
    let m = mount_with(&policy);
    fs::set_permissions(&m.mnt, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let rc = as_nobody(|| {
        for i in 0..3 {
            if fs::write(m.p("mine.txt"), format!("mine {i}")).is_err() {
                return 1;
            }
        }
        i32::from(fs::remove_file(m.p("mine.txt")).is_err())
    });
    assert_eq!(rc, 0);
    let before = version_count(&m.p("mine.txt"));
    assert!(before >= 3, "{before}");
    let out = cli_as(
        Some(NOBODY),
        &["prune", s(&m.p("mine.txt")), "--keep-last", "0"],
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("protection window (7d)"), "{said}");
    assert_eq!(
        version_count(&m.p("mine.txt")),
        before,
        "inside the default window"
    );
    let out = cli_as(
        Some(NOBODY),
        &["prune", s(&m.p("mine.txt")), "--keep-last", "0", "--json"],
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        r["held_back"]["versions"].as_u64(),
        Some(before as u64),
        "{r}"
    );
    // Tags: each user may remove their own.
    cli(&["tag", "roots-tag", "--path", s(&m.mnt)]);
    let made = cli_as(Some(NOBODY), &["tag", "nobodys-tag", "--path", s(&m.mnt)]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let theirs = cli_as(
        Some(NOBODY),
        &["tag", "--delete", "roots-tag", "--path", s(&m.mnt)],
    );
    assert!(!theirs.status.success());
    let err = String::from_utf8_lossy(&theirs.stderr);
    assert!(err.contains("only its maker or root"), "{err}");
    let own = cli_as(
        Some(NOBODY),
        &["tag", "--delete", "nobodys-tag", "--path", s(&m.mnt)],
    );
    assert!(
        own.status.success(),
        "{}",
        String::from_utf8_lossy(&own.stderr)
    );
    let tags = cli_json(&["tags", s(&m.mnt)]).to_string();
    assert!(
        tags.contains("roots-tag") && !tags.contains("nobodys-tag"),
        "{tags}"
    );
}

#[test]
fn a_failed_reload_keeps_the_policy_in_force() {
    let policy =
        PolicyFile::new("[[rule]]\nname = \"one\"\nextensions = [\"txt\"]\nmax-count = 2\n");
    let m = mount_with(&policy);
    write_file(&m.p("a.txt"), b"x");
    let explain = |m: &Mount| cli(&["policy", "explain", s(&m.p("a.txt"))]);
    assert!(explain(&m).contains("\"one\""));
    fs::write(&policy.path, "[[rule]]\nname = \"two\"\nmax-cout = 2\n").unwrap();
    let out = cli_as(None, &["policy", "reload", s(&m.mnt)]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{}:3:", policy.path.display())),
        "line-numbered: {err}"
    );
    assert!(explain(&m).contains("\"one\""), "the old policy stays");
    fs::write(
        &policy.path,
        "[[rule]]\nname = \"two\"\nextensions = [\"txt\"]\nmax-count = 5\n",
    )
    .unwrap();
    cli(&["policy", "reload", s(&m.mnt)]);
    assert!(explain(&m).contains("\"two\""));
}

#[test]
fn policy_check_refuses_users_and_groups_the_system_does_not_know() {
    // A typo in a name makes a rule that never matches: check said "ok".
    let dir = tempdir();
    let f = dir.path().join("p.toml");
    fs::write(
        &f,
        "[[rule]]\nusers = [\"root\", \"no-such-user-cfs\", 0]\n\
         groups = [\"root\", \"no-such-group-cfs\"]\nversion = false\n",
    )
    .unwrap();
    let out = cli_as(None, &["policy", "check", s(&f)]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{}:2:", f.display()))
            && err.contains("no user named 'no-such-user-cfs'"),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}:3:", f.display()))
            && err.contains("no group named 'no-such-group-cfs'"),
        "{err}"
    );
    assert!(!err.contains("'root'"), "{err}");
    fs::write(
        &f,
        "[[rule]]\nusers = [\"root\"]\ngroups = [\"root\"]\nversion = false\n",
    )
    .unwrap();
    assert!(cli(&["policy", "check", s(&f)]).contains("ok"));
}

#[test]
fn policy_check_reports_errors_by_line() {
    let dir = tempdir();
    let f = dir.path().join("p.toml");
    fs::write(
        &f,
        "[[rule]]\nname = \"r\"\nmin-count = 5\nmax-count = 2\npaths = [\"[\"]\n",
    )
    .unwrap();
    let out = cli_as(None, &["policy", "check", s(&f)]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    let prefix = format!("{}:", f.display());
    assert!(
        err.lines().filter(|l| l.starts_with(&prefix)).count() >= 2,
        "{err}"
    );
    assert!(
        err.contains(&format!("{}:5:", f.display())),
        "the bad glob's line: {err}"
    );
    // A file that is not there: one line.
    let missing = dir.path().join("missing.toml");
    let out = cli_as(None, &["policy", "check", s(&missing)]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("missing.toml") && err.contains("No such file"),
        "{err}"
    );
    fs::write(&f, "[[rule]]\npaths = [\"**/*.o\"]\nversion = false\n").unwrap();
    assert!(cli(&["policy", "check", s(&f)]).contains("ok"));
    // A user's file may not set the administrator's bounds.
    fs::write(&f, "[bounds]\nmax-count = 3\n").unwrap();
    let out = cli_as(None, &["policy", "check", "--user", s(&f)]);
    assert_eq!(out.status.code(), Some(1));
    // A mount refuses to start with a broken administrator file.
    fs::write(&f, "[defaults]\nmax-count = \"three\"\n").unwrap();
    let out = Command::new(bin())
        .args([
            "mount",
            s(dir.path()),
            s(dir.path()),
            "-o",
            &format!("policy={}", f.display()),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("{}:2:", f.display())),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `prune --keep-last 0` removes every version but a file's newest,
/// which vouches for the file as it is, and says so without counting
/// it as one kept against the limits.
#[test]
fn keep_last_zero_leaves_only_the_newest_version() {
    let policy = PolicyFile::new("");
    let m = mount_with(&policy);
    for i in 0..3 {
        write_file(&m.p("f"), format!("v{i}").as_bytes());
    }
    assert!(version_count(&m.p("f")) >= 3);
    let said = cli(&["prune", s(&m.p("f")), "--keep-last", "0"]);
    assert!(said.starts_with("removed "), "{said}");
    assert!(!said.contains("kept"), "{said}");
    assert_eq!(versions(&m.p("f")), [Some(b"v2".to_vec())]);
    assert_eq!(read_file(&m.p("f")), b"v2");
}

/// Many small files with two versions each, the older ones pruned: a
/// store with garbage to collect.
fn fill(m: &Mount, files: usize) -> Vec<(PathBuf, Vec<u8>)> {
    fs::create_dir_all(m.p("g")).unwrap();
    let mut kept = Vec::new();
    for i in 0..files {
        let p = m.p(&format!("g/f{i}"));
        write_file(&p, &pattern(3000, i as u64));
        let now = pattern(3000, (i + files) as u64);
        write_file(&p, &now);
        kept.push((p, now));
    }
    cli(&["prune", s(&m.p("g")), "--max-count", "1"]);
    kept
}

#[test]
fn gc_keeps_chunks_that_writes_reuse_meanwhile() {
    let policy = PolicyFile::new("");
    let m = mount_with(&policy);
    let files = 400;
    let kept = fill(&m, files);
    // While gc runs, files are rewritten with the pruned contents: their
    // chunks are garbage when gc marks and reused before it sweeps.
    let writer = {
        let root = m.mnt.clone();
        std::thread::spawn(move || {
            for round in 0..3 {
                for i in (round..files).step_by(3) {
                    fs::write(root.join(format!("g/r{i}")), pattern(3000, i as u64)).unwrap();
                }
            }
        })
    };
    for _ in 0..3 {
        cli(&["gc", s(&m.mnt)]);
    }
    writer.join().unwrap();
    cli(&["gc", s(&m.mnt)]);
    assert_consistent(&m);
    for i in 0..files {
        let p = m.p(&format!("g/r{i}"));
        if p.exists() {
            assert_eq!(
                versions(&p).pop().unwrap().unwrap(),
                pattern(3000, i as u64)
            );
        }
    }
    for (p, want) in kept.iter().step_by(37) {
        assert_eq!(versions(p), vec![Some(want.clone())]);
    }
}

#[test]
fn kill9_during_gc_loses_nothing() {
    let policy = PolicyFile::new("");
    let mut m = mount_with(&policy);
    let kept = fill(&m, 3000);
    let before = cli_json(&["status", s(&m.mnt)]);
    // Kill points spread over a collection's length (a dry run marks and
    // sweeps the same store; removal and compaction add to it).
    let t0 = std::time::Instant::now();
    cli(&["gc", s(&m.mnt), "--dry-run"]);
    let span = t0.elapsed().as_millis().max(10) as u64;
    let mut interrupted = 0;
    for (round, tenth) in [1u64, 3, 5, 8, 12, 16].into_iter().enumerate() {
        let gc = Command::new(bin())
            .args(["gc", s(&m.mnt)])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(span * tenth / 10));
        m.kill9();
        let out = gc.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && !err.contains("cannot reach") {
            interrupted += 1;
        }
        {
            let _serial = history_mount_lock();
            m.start();
        }
        m.wait_history_ready();
        let r = cli_json(&["fsck", s(&m.mnt)]);
        assert_eq!(r["problems"], Value::Array(vec![]), "round {round}: {r}");
        for (p, want) in kept.iter().step_by(97) {
            assert_eq!(&read_file(p), want);
            assert_eq!(versions(p), vec![Some(want.clone())], "round {round}");
        }
    }
    assert!(
        interrupted >= 1,
        "no kill landed inside a collection ({span} ms long)"
    );
    // A collection that runs to the end frees what the killed ones left.
    cli(&["gc", s(&m.mnt)]);
    let after = cli_json(&["status", s(&m.mnt)]);
    assert!(
        after["pack_bytes"].as_u64() < before["pack_bytes"].as_u64(),
        "{before} -> {after}"
    );
    assert_consistent(&m);
    for (p, want) in &kept {
        assert_eq!(&read_file(p), want);
    }
}

#[test]
fn fsck_detects_history_altered_behind_chronofs() {
    let policy = PolicyFile::new("");
    let mut m = mount_with(&policy);
    for i in 0..4 {
        write_file(&m.p("ledger.txt"), format!("balance {i}").as_bytes());
    }
    // Legitimate removals keep the chain verifiable.
    cli(&["prune", s(&m.p("ledger.txt")), "--keep-last", "2"]);
    assert_consistent(&m);
    let status = cli_json(&["status", s(&m.mnt)]);
    assert!(status["chain_head"]["hash"].is_string(), "{status}");
    m.unmount();
    let index = m.src.join(".chronofs/index.redb");
    use redb::ReadableTable;
    let versions: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("versions");
    let (altered_seq, deleted_seq) = {
        let db = redb::Database::open(&index).unwrap();
        let txn = db.begin_write().unwrap();
        let seqs = {
            let mut t = txn.open_table(versions).unwrap();
            let rows: Vec<(Vec<u8>, Vec<u8>)> = t
                .iter()
                .unwrap()
                .map(|e| {
                    let (k, v) = e.unwrap();
                    (k.value().to_vec(), v.value().to_vec())
                })
                .collect();
            // Alter a record so that it still decodes: one letter of the
            // recorded process name.
            let (key, mut value) = rows
                .iter()
                .rev()
                .find(|(_, v)| v.len() > 40)
                .cloned()
                .unwrap();
            let at = value.len() - 20;
            value[at] ^= 0x01;
            t.insert(key.as_slice(), value.as_slice()).unwrap();
            let (victim, _) = rows.first().cloned().unwrap();
            t.remove(victim.as_slice()).unwrap();
            let seq = |k: &[u8]| u64::from_be_bytes(k[8..16].try_into().unwrap());
            (seq(&key), seq(&victim))
        };
        txn.commit().unwrap();
        seqs
    };
    let out = cli_as(None, &["fsck", s(&m.src.join("ledger.txt")), "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let problems = report["problems"].to_string();
    assert!(
        !out.status.success(),
        "fsck passed a tampered store: {report}"
    );
    for seq in [altered_seq, deleted_seq] {
        assert!(
            problems.contains(&format!("change #{seq}")),
            "tampering with #{seq} not found: {problems}"
        );
    }
}

/// A version interval mode holds back marks the file verified while
/// history still holds the version before it: an in-place update opened
/// then must not be built from its written ranges over that older
/// version (the held-back rewrite was missing from the result).
#[test]
fn an_update_after_a_held_back_rewrite_is_recorded_whole() {
    use std::os::unix::fs::FileExt;
    let policy = PolicyFile::new(
        r#"
[[rule]]
name = "data"
extensions = ["dat"]
capture = "interval"
"#,
    );
    let m = {
        let _serial = history_mount_lock();
        Mount::new(&format!("{},capture-interval=600", policy.opts()))
    };
    m.wait_history_ready();
    let len = 17 << 20;
    let p = m.p("big.dat");
    write_file(&p, &common::pattern(len, 1));
    assert_eq!(
        version_count(&p),
        1,
        "the first session is recorded at once"
    );
    // Held back (within the interval); the query waits for that.
    write_file(&p, &common::pattern(len, 2));
    assert_eq!(version_count(&p), 1, "the rewrite is held back");
    let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(b"in place", 4096).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let live = read_file(&p);
    let mut want = common::pattern(len, 2);
    want[4096..4104].copy_from_slice(b"in place");
    assert!(live == want, "the live file");
    let last = versions(&p).pop().flatten().expect("a last version");
    assert!(
        last == want,
        "the last version is not the file as fsync left it"
    );
}

#[test]
fn capture_modes_follow_the_policy() {
    use std::io::Write;
    let policy = PolicyFile::new(
        r#"
[[rule]]
name = "logs"
extensions = ["log"]
capture = "every-write"

[[rule]]
name = "data"
extensions = ["dat"]
capture = "interval"
"#,
    );
    let mut m = {
        let _serial = history_mount_lock();
        Mount::new(&format!("{},capture-interval=2", policy.opts()))
    };
    m.wait_history_ready();
    // every-write: one open, three write(2)s, one close.
    let write_thrice = |p: &Path| {
        let mut f = fs::File::create(p).unwrap();
        for line in ["one\n", "two\n", "three\n"] {
            f.write_all(line.as_bytes()).unwrap();
        }
    };
    write_thrice(&m.p("app.log"));
    write_thrice(&m.p("app.txt"));
    let log: Vec<_> = versions(&m.p("app.log")).into_iter().flatten().collect();
    for want in ["one\n", "one\ntwo\n", "one\ntwo\nthree\n"] {
        assert!(
            log.contains(&want.as_bytes().to_vec()),
            "{want:?} missing: {log:?}"
        );
    }
    assert_eq!(
        versions(&m.p("app.txt")),
        vec![Some(b"one\ntwo\nthree\n".to_vec())],
        "session mode: one version per open-close"
    );
    // interval: the first session is recorded at once, the next ones are
    // held back and recorded together when the interval is up.
    // The interval is wall-clock time in a real mount: when this machine
    // is loaded and the writes take longer than the interval, a middle
    // state may be recorded too; only the fast case pins the exact list.
    let started = std::time::Instant::now();
    for i in 0..5 {
        write_file(&m.p("x.dat"), format!("d{i}").as_bytes());
    }
    let early = versions(&m.p("x.dat"));
    let within_interval = started.elapsed() < Duration::from_secs(2);
    if within_interval {
        assert_eq!(early, vec![Some(b"d0".to_vec())]);
    } else {
        assert_eq!(early.first(), Some(&Some(b"d0".to_vec())));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while versions(&m.p("x.dat")).last() != Some(&Some(b"d4".to_vec())) {
        assert!(
            std::time::Instant::now() < deadline,
            "held-back version never recorded: {:?}",
            versions(&m.p("x.dat"))
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let recorded = versions(&m.p("x.dat"));
    if within_interval {
        assert_eq!(recorded, vec![Some(b"d0".to_vec()), Some(b"d4".to_vec())]);
    } else {
        assert!(
            recorded.len() < 5,
            "interval recorded every session: {recorded:?}"
        );
    }
    // fsync records a held-back version at once.
    write_file(&m.p("x.dat"), b"d5");
    write_file(&m.p("x.dat"), b"d6");
    let f = fs::OpenOptions::new()
        .write(true)
        .open(m.p("x.dat"))
        .unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(
        versions(&m.p("x.dat")).last().unwrap().as_deref(),
        Some(&b"d6"[..])
    );
    // So does the end of the mount: nothing held back is lost.
    write_file(&m.p("x.dat"), b"d7");
    write_file(&m.p("x.dat"), b"d8");
    m.unmount();
    {
        let _serial = history_mount_lock();
        m.start();
    }
    m.wait_history_ready();
    assert_eq!(
        versions(&m.p("x.dat")).last().unwrap().as_deref(),
        Some(&b"d8"[..])
    );
    // Removing a file records what was held back first.
    write_file(&m.p("x.dat"), b"d9");
    write_file(&m.p("x.dat"), b"d10");
    fs::remove_file(m.p("x.dat")).unwrap();
    cli(&["undelete", s(&m.p("x.dat"))]);
    assert_eq!(read_file(&m.p("x.dat")), b"d10");
    assert_consistent(&m);
}

/// `-o every-write` with the kernel's writeback cache on (the daemon does
/// the writes): each recorded version is the file as it was after one
/// write(2), in order; none is a state the application never made.
#[test]
fn every_write_records_each_write_as_issued() {
    use std::os::unix::fs::FileExt;
    let mut m = {
        let _serial = history_mount_lock();
        Mount::new("every-write,passthrough=off,writeback")
    };
    m.wait_history_ready();
    let f = fs::File::create(m.p("r.bin")).unwrap();
    let block = 256 << 10;
    let mut states = Vec::new();
    let mut now: Vec<u8> = Vec::new();
    // Out of order, and growing: a cache that merged or reordered them
    // would record a state with zeros where no write had landed yet.
    for (i, at) in [1usize, 0, 3, 2, 4].iter().enumerate() {
        let data = vec![b'a' + i as u8; block];
        f.write_all_at(&data, (at * block) as u64).unwrap();
        let end = (at + 1) * block;
        if now.len() < end {
            now.resize(end, 0);
        }
        now[at * block..end].copy_from_slice(&data);
        states.push(now.clone());
    }
    drop(f);
    let recorded: Vec<Vec<u8>> = versions(&m.p("r.bin"))
        .into_iter()
        .flatten()
        .filter(|v| !v.is_empty())
        .collect();
    assert_eq!(
        recorded.len(),
        states.len(),
        "one version per write: {:?}",
        recorded.iter().map(Vec::len).collect::<Vec<_>>()
    );
    for (i, (got, want)) in recorded.iter().zip(&states).enumerate() {
        assert!(got == want, "version after write {} differs", i + 1);
    }
    m.unmount();
}

/// A dry run's figures are the real run's: purge (a live file, a live
/// tree), clean (versions of objects that expire whole included) and
/// prune.
#[test]
fn dry_run_counts_equal_the_real_run() {
    let policy = PolicyFile::new("[defaults]\nmax-age = \"30d\"\nmax-count = 2\n");
    let m = mount_with(&policy);
    for i in 0..2 {
        write_file(&m.p("f"), format!("f {i}").as_bytes());
    }
    fs::create_dir_all(m.p("t/u")).unwrap();
    for i in 0..3 {
        write_file(&m.p(&format!("t/u/x{i}")), b"one");
        write_file(&m.p(&format!("t/u/x{i}")), b"two");
    }
    let pair = |args: &[&str], key: &dyn Fn(&Value) -> (u64, u64)| {
        let mut dry = args.to_vec();
        dry.push("--dry-run");
        let d = cli_json(&dry);
        let r = cli_json(args);
        assert_eq!(key(&d), key(&r), "{args:?}: dry run {d} vs real {r}");
        key(&r)
    };
    let purged = |v: &Value| {
        (
            v["objects"].as_u64().unwrap(),
            v["versions"].as_u64().unwrap(),
        )
    };
    assert_eq!(pair(&["purge", s(&m.p("f"))], &purged).0, 1);
    assert_eq!(pair(&["purge", s(&m.p("t"))], &purged).0, 5);

    // clean: a deleted tree expires whole, a live file loses old versions.
    fs::create_dir_all(m.p("g/h")).unwrap();
    for i in 0..4 {
        write_file(&m.p(&format!("g/h/z{i}")), b"one");
        write_file(&m.p(&format!("g/h/z{i}")), b"two");
    }
    fs::remove_dir_all(m.p("g")).unwrap();
    for i in 0..4 {
        write_file(&m.p("k"), format!("k {i}").as_bytes());
    }
    let cleaned = |v: &Value| {
        if v["dry_run"] == true {
            (
                v["planned_versions"].as_u64().unwrap(),
                v["planned_objects"].as_u64().unwrap(),
            )
        } else {
            (
                v["outcome"]["versions_removed"].as_u64().unwrap(),
                v["outcome"]["objects_removed"].as_u64().unwrap(),
            )
        }
    };
    let (versions, objects) = pair(&["clean", s(&m.mnt), "--now", "+40d"], &cleaned);
    assert_eq!(objects, 6, "g, h and four files expire whole");
    assert!(versions > 6 + 2, "{versions}");

    for i in 0..4 {
        write_file(&m.p("p"), format!("p {i}").as_bytes());
    }
    let (versions, _) = pair(&["prune", s(&m.p("p")), "--keep-last", "1"], &cleaned);
    assert!(versions >= 1);
    assert_consistent(&m);
}

/// A tag from before a file was created pins none of its versions: once
/// a prune had removed the file's creation, such a tag pinned its oldest
/// kept version for good, and `prune --keep-last 1` removed nothing.
#[test]
fn a_tag_from_before_a_file_existed_pins_none_of_its_versions() {
    let _serial = history_mount_lock();
    let m = Mount::new(&first_versioning_mode());
    m.wait_history_ready();
    let f = m.p("p3.txt");
    write_file(&m.p("other"), b"x");
    cli(&["tag", "early", "--path", s(&m.mnt)]);
    for i in 1..=3 {
        fs::write(&f, format!("c{i}\n")).unwrap();
    }
    cli(&["tag", "mid", "--path", s(&m.mnt)]);
    write_file(&m.p("other"), b"y");
    cli(&["prune", s(&f), "--keep-last", "2"]);
    assert_eq!(version_count(&f), 2);
    cli(&["prune", s(&f), "--keep-last", "1"]);
    assert_eq!(versions(&f), [Some(b"c3\n".to_vec())]);
    assert!(
        !m.p(".history/@early/p3.txt").exists(),
        "it did not exist then"
    );
    assert_eq!(read_file(&m.p(".history/@mid/p3.txt")), b"c3\n");
    assert_consistent(&m);
}
