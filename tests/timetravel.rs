//! Time travel in the name space, on versioning mounts, with unmodified
//! tools: `.history/@T/…` trees (hidden from listings, read-only, exact at
//! the instant), per-file version names (`f;3`, `f;-1`, `f;@T`), deleted
//! entries (`DIR/;deleted`), permissions as they were, and audit mode.
//! (The model-based check of every instant is in `history_model.rs`.)

#![deny(unsafe_code)]

mod common;
use common::*;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

fn chrono_ok(m: &Mount, args: &[&str]) -> String {
    let out = Command::new(bin())
        .args(args)
        .current_dir(&m.mnt)
        .env("TZ", "UTC")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`chronofs {}` failed: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr),
        m.log_tail()
    );
    String::from_utf8(out.stdout).unwrap()
}

fn tag(m: &Mount, name: &str) {
    chrono_ok(m, &["tag", name]);
}

fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn read(p: &Path) -> String {
    String::from_utf8(fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))).unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// Runs `prog args` as uid/gid 65534 (nobody); returns (success, stderr).
fn as_nobody(prog: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            prog,
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv (util-linux) is needed");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn history_dir_is_hidden_from_listings_but_reachable() {
    each_versioning_mode(|m| {
        write_file(&m.p("a.txt"), b"one\n");
        tag(m, "first");
        assert!(!names(&m.mnt).contains(&".history".to_string()));
        let found = run(&m.mnt, "find", &["."]);
        assert!(!found.contains(".history"), "find lists .history:\n{found}");
        let tarred = run(&m.mnt, "tar", &["cf", "-", "."]);
        assert!(!tarred.contains(".history/"), "tar descends into .history");
        let md = fs::metadata(m.p(".history")).unwrap();
        assert!(md.is_dir());
        let listed = names(&m.p(".history"));
        assert!(listed.contains(&"@first".to_string()), "{listed:?}");
        // Every listed instant opens.
        for n in &listed {
            assert!(
                m.p(".history").join(n).join("a.txt").exists(),
                "{n}: {listed:?}"
            );
        }
        // A real file cannot take the name.
        assert_eq!(errno_of(fs::create_dir(m.p(".history"))), libc::EEXIST);
    });
}

#[test]
fn an_instant_shows_the_tree_of_then_and_nothing_changes_it() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("d")).unwrap();
        write_file(&m.p("d/f"), b"one\n");
        write_file(&m.p("gone"), b"bye\n");
        std::os::unix::fs::symlink("d/f", m.p("link")).unwrap();
        fs::hard_link(m.p("d/f"), m.p("d/f2")).unwrap();
        tag(m, "t1");
        write_file(&m.p("d/f"), b"two, longer\n");
        fs::remove_file(m.p("gone")).unwrap();
        write_file(&m.p("new"), b"new\n");
        fs::set_permissions(m.p("d"), fs::Permissions::from_mode(0o700)).unwrap();
        let v = m.p(".history/@t1");
        assert_eq!(read(&v.join("d/f")), "one\n");
        assert_eq!(read(&v.join("gone")), "bye\n");
        assert!(!v.join("new").exists());
        assert_eq!(fs::read_link(v.join("link")).unwrap().to_str(), Some("d/f"));
        assert_eq!(read(&v.join("link")), "one\n");
        assert_eq!(names(&v), ["d", "gone", "link"]);
        assert_eq!(fs::metadata(v.join("d")).unwrap().mode() & 0o7777, 0o755);
        // Hard links are one object within the instant.
        let (a, b) = (
            fs::metadata(v.join("d/f")).unwrap(),
            fs::metadata(v.join("d/f2")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino());
        assert_eq!(a.nlink(), 2);
        // ... and a different object from the same file at another instant.
        let now = m.p(".history/@now/d/f");
        assert_eq!(read(&now), "two, longer\n");
        assert_ne!(fs::metadata(&now).unwrap().ino(), a.ino());
        // The same instant by sequence number and by time.
        let tags = chrono_ok(m, &["tags", "--json"]);
        let at = tags.split("\"seq\"").nth(1).unwrap();
        let n: String = at
            .chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(|c| c.is_ascii_digit())
            .collect();
        assert_eq!(read(&m.p(&format!(".history/@{n}/d/f"))), "one\n");
        // Read-only, whatever the call.
        let f = v.join("d/f");
        assert_eq!(
            errno_of(fs::OpenOptions::new().write(true).open(&f)),
            libc::EROFS
        );
        assert_eq!(errno_of(fs::write(v.join("d/x"), b"x")), libc::EROFS);
        assert_eq!(errno_of(fs::create_dir(v.join("d/x"))), libc::EROFS);
        assert_eq!(errno_of(fs::remove_file(&f)), libc::EROFS);
        assert_eq!(errno_of(fs::remove_dir(v.join("d"))), libc::EROFS);
        assert_eq!(
            errno_of(fs::set_permissions(&f, fs::Permissions::from_mode(0o777))),
            libc::EROFS
        );
        assert_eq!(errno_of(fs::rename(&f, v.join("d/y"))), libc::EROFS);
        assert_eq!(errno_of(fs::rename(m.p("new"), v.join("d/y"))), libc::EROFS);
        assert_eq!(errno_of(fs::hard_link(&f, m.p("hl"))), libc::EXDEV);
        let xattr = Command::new("setfattr")
            .args(["-n", "user.x", "-v", "1"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(!xattr.status.success());
        assert_eq!(read(&f), "one\n", "history changed");
        // Names of the past in live directories are as read-only.
        assert_eq!(errno_of(fs::remove_file(m.p("d/f;1"))), libc::EROFS);
        assert_eq!(errno_of(fs::rename(m.p("d/f;1"), m.p("g"))), libc::EROFS);
        assert_eq!(errno_of(fs::remove_dir(m.p(";deleted"))), libc::EROFS);
        assert_eq!(errno_of(fs::remove_dir(m.p(".history"))), libc::EROFS);
        assert_eq!(read(&m.p("d/f;1")), "one\n");
        assert_eq!(errno_of(fs::remove_file(m.p("d/absent;1"))), libc::ENOENT);
        // cp from the past into the present works.
        fs::copy(&f, m.p("restored")).unwrap();
        assert_eq!(read(&m.p("restored")), "one\n");
    });
}

#[test]
fn bad_instants_are_absent() {
    each_versioning_mode(|m| {
        write_file(&m.p("a"), b"a");
        for bad in [
            "@garbage!",
            "@nosuchtag",
            "@2099-01-01T00:00",
            "@1999-01-01",
            "@99999999",
            "nope",
            "@",
        ] {
            let p = m.p(".history").join(bad);
            assert_eq!(errno_of(fs::metadata(&p)), libc::ENOENT, "{bad}");
        }
        assert!(m.p(".history/@-0s/a").exists());
    });
}

#[test]
fn version_names_resolve_by_lookup_and_are_never_listed() {
    each_versioning_mode(|m| {
        for text in ["v1\n", "v2\n", "v3\n"] {
            write_file(&m.p("r.txt"), text.as_bytes());
        }
        assert_eq!(read(&m.p("r.txt;1")), "v1\n");
        assert_eq!(read(&m.p("r.txt;2")), "v2\n");
        assert_eq!(read(&m.p("r.txt;-1")), "v2\n");
        assert_eq!(read(&m.p("r.txt;0")), "v3\n");
        assert_eq!(errno_of(fs::metadata(m.p("r.txt;99"))), libc::ENOENT);
        assert_eq!(errno_of(fs::metadata(m.p("r.txt;x"))), libc::ENOENT);
        assert_eq!(names(&m.mnt), ["r.txt"]);
        assert_eq!(
            errno_of(fs::OpenOptions::new().append(true).open(m.p("r.txt;1"))),
            libc::EROFS
        );
        // From a shell, with the usual tools.
        let out = run(
            &m.mnt,
            "sh",
            &[
                "-c",
                "cat 'r.txt;1' && diff 'r.txt;1' 'r.txt;2' >/dev/null; echo $?",
            ],
        );
        assert_eq!(out, "v1\n1\n");
        // A real file with such a name wins (made before its base has
        // that version: a new file cannot take a name that shows one).
        write_file(&m.p("q;1"), b"real\n");
        write_file(&m.p("q"), b"q1\n");
        assert_eq!(read(&m.p("q;1")), "real\n");
        // Nor can a rename (found by a bug hunt: it hid the version).
        write_file(&m.p("tmp"), b"tmp\n");
        assert_eq!(
            errno_of(fs::rename(m.p("tmp"), m.p("r.txt;1"))),
            libc::EROFS
        );
        assert_eq!(read(&m.p("r.txt;1")), "v1\n");
        fs::rename(m.p("tmp"), m.p("r.txt;99")).unwrap();
        assert_eq!(names(&m.mnt), ["q", "q;1", "r.txt", "r.txt;99"]);
        assert_eq!(read(&m.p("r.txt;2")), "v2\n");
        // In subdirectories too, and by instant.
        fs::create_dir(m.p("sub")).unwrap();
        write_file(&m.p("sub/s"), b"old\n");
        tag(m, "before");
        write_file(&m.p("sub/s"), b"new\n");
        assert_eq!(read(&m.p("sub/s;@before")), "old\n");
        assert_eq!(read(&m.p("sub/s;-1")), "old\n");
    });
}

#[test]
fn deleted_entries_are_listed_and_readable() {
    each_versioning_mode(|m| {
        fs::create_dir_all(m.p("d/tree/deep")).unwrap();
        write_file(&m.p("d/file"), b"file\n");
        write_file(&m.p("d/tree/deep/leaf"), b"leaf\n");
        write_file(&m.p("d/keep"), b"keep\n");
        fs::remove_file(m.p("d/file")).unwrap();
        run(&m.p("d"), "rm", &["-rf", "tree"]);
        assert_eq!(names(&m.p("d")), ["keep"]);
        assert_eq!(names(&m.p("d/;deleted")), ["file", "tree"]);
        assert_eq!(read(&m.p("d/;deleted/file")), "file\n");
        // A removed tree shows as it was before `rm -rf` emptied it.
        assert_eq!(read(&m.p("d/;deleted/tree/deep/leaf")), "leaf\n");
        let copy = m.p("d/back");
        run(&m.p("d"), "cp", &["-a", ";deleted/tree", "back"]);
        assert_eq!(read(&copy.join("deep/leaf")), "leaf\n");
    });
}

/// A past directory's link count is that of its listing (2 + its
/// subdirectories), as natively: `find` and `du` rely on it. Directory
/// versions are not recorded when entries come and go, so the recorded
/// count was that of the directory when it was made.
#[test]
fn past_directories_count_their_subdirectories() {
    each_versioning_mode(|m| {
        for sub in ["t/a", "t/b", "t/c", "gone1", "gone2"] {
            fs::create_dir_all(m.p(sub)).unwrap();
        }
        write_file(&m.p("t/f"), b"f\n");
        let nlink = |p: &Path| {
            fs::symlink_metadata(p)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                .nlink()
        };
        assert_eq!(nlink(&m.p("t")), 5);
        assert_eq!(nlink(&m.p(".history/@now/t")), 5);
        run(&m.mnt, "rm", &["-rf", "t", "gone1", "gone2"]);
        assert_eq!(nlink(&m.p(";deleted/t")), 5);
        assert_eq!(nlink(&m.p(";deleted")), 5, "three deleted directories");
    });
}

#[test]
fn tools_work_in_the_past() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("proj")).unwrap();
        for i in 0..20 {
            write_file(
                &m.p(&format!("proj/f{i}")),
                format!("line {i}\n").as_bytes(),
            );
        }
        tag(m, "a");
        write_file(&m.p("proj/f3"), b"changed\n");
        fs::remove_file(m.p("proj/f7")).unwrap();
        tag(m, "b");
        let out = Command::new("diff")
            .args(["-r", ".history/@a/proj", ".history/@b/proj"])
            .current_dir(&m.mnt)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("changed") && text.contains("Only in .history/@a/proj: f7"),
            "{text}"
        );
        // tar of a view gives the old tree.
        let scratch = tempdir();
        let tar = scratch.path().join("p.tar");
        run(
            &m.mnt,
            "tar",
            &["cf", tar.to_str().unwrap(), "-C", ".history/@a", "proj"],
        );
        run(scratch.path(), "tar", &["xf", "p.tar"]);
        assert_eq!(read(&scratch.path().join("proj/f3")), "line 3\n");
        assert_eq!(names(&scratch.path().join("proj")).len(), 20);
    });
}

#[test]
fn git_status_works_read_only_in_the_past() {
    if Command::new("git").arg("--version").output().is_err() {
        eprintln!("git not installed; skipped");
        return;
    }
    each_versioning_mode(|m| {
        let repo = m.p("repo");
        fs::create_dir(&repo).unwrap();
        let git = |args: &[&str]| run(&repo, "git", args);
        git(&["init", "-q"]);
        write_file(&repo.join("x"), b"x\n");
        git(&["add", "x"]);
        git(&[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "one",
        ]);
        tag(m, "committed");
        write_file(&repo.join("x"), b"dirty\n");
        let old = m.p(".history/@committed/repo");
        let out = Command::new("git")
            .args([
                "-c",
                &format!("safe.directory={}", old.display()),
                "status",
                "--porcelain",
            ])
            .current_dir(&old)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "",
            "the old tree was clean"
        );
        assert!(!git(&["status", "--porcelain"]).is_empty());
    });
}

#[test]
fn past_permissions_are_enforced_for_the_caller_of_now() {
    each_versioning_mode(|m| {
        write_file(&m.p("secret"), b"s3cret\n");
        fs::set_permissions(m.p("secret"), fs::Permissions::from_mode(0o600)).unwrap();
        write_file(&m.p("open"), b"open\n");
        fs::set_permissions(m.p("open"), fs::Permissions::from_mode(0o644)).unwrap();
        tag(m, "then");
        fs::set_permissions(m.p("secret"), fs::Permissions::from_mode(0o644)).unwrap();
        let p = |rel: &str| m.p(rel).to_str().unwrap().to_string();
        assert!(as_nobody("cat", &[&p("secret")]).0, "readable now");
        let (ok, err) = as_nobody("cat", &[&p(".history/@then/secret")]);
        assert!(!ok && err.contains("Permission denied"), "{err}");
        assert!(as_nobody("cat", &[&p(".history/@then/open")]).0);
        let (ok, _) = as_nobody("cat", &[&p("secret;@then")]);
        assert!(
            !ok,
            "an old version readable only by root was read by nobody"
        );
        assert_eq!(read(&m.p("secret;@then")), "s3cret\n", "root reads it");
    });
}

#[test]
fn audit_mode_hides_history_from_other_users() {
    let _serial = history_mount_lock();
    let mut m = Mount::new("audit");
    m.wait_history_ready();
    write_file(&m.p("f"), b"one\n");
    write_file(&m.p("f"), b"two\n");
    fs::set_permissions(m.p("f"), fs::Permissions::from_mode(0o644)).unwrap();
    let p = |rel: &str| m.p(rel).to_str().unwrap().to_string();
    assert_eq!(read(&m.p("f;1")), "one\n", "root sees history");
    assert!(m.p(".history/@-0s/f").exists());
    assert!(
        as_nobody("cat", &[&p("f")]).0,
        "the live file stays readable"
    );
    for hidden in ["f;1", ".history", ".history/@-0s/f", ";deleted"] {
        let (ok, err) = as_nobody("stat", &[&p(hidden)]);
        assert!(!ok, "{hidden} visible to nobody");
        assert!(
            err.contains("No such file") || err.contains("Permission denied"),
            "{hidden}: {err}"
        );
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin())
        .args(["log", &p("f")])
        .output()
        .unwrap();
    assert!(!out.status.success(), "log allowed to nobody under audit");
    let mut f = fs::OpenOptions::new().append(true).open(m.p("f")).unwrap();
    f.write_all(b"more\n").unwrap();
    drop(f);
    m.unmount();
}

#[test]
fn owners_times_and_xattrs_are_those_of_the_instant() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("p")).unwrap();
        write_file(&m.p("p/f"), b"data\n");
        std::os::unix::fs::symlink("f", m.p("p/l")).unwrap();
        run(
            &m.mnt,
            "setfattr",
            &["-n", "user.color", "-v", "blue", "p/f"],
        );
        run(&m.mnt, "chown", &["65534:65534", "p/f"]);
        run(&m.mnt, "touch", &["-d", "2001-02-03 04:05:06", "p/f"]);
        let before = fs::symlink_metadata(m.p("p/f")).unwrap();
        tag(m, "then");
        run(
            &m.mnt,
            "setfattr",
            &["-n", "user.color", "-v", "red", "p/f"],
        );
        run(&m.mnt, "chown", &["0:0", "p/f"]);
        run(&m.mnt, "touch", &["p/f"]);
        let view = m.p(".history/@then/p/f");
        let md = fs::symlink_metadata(&view).unwrap();
        assert_eq!((md.uid(), md.gid()), (65534, 65534));
        assert_eq!(
            (md.mtime(), md.mtime_nsec()),
            (before.mtime(), before.mtime_nsec())
        );
        assert_eq!(md.mode(), before.mode());
        let color = run(
            &m.mnt,
            "getfattr",
            &["--only-values", "-n", "user.color", ".history/@then/p/f"],
        );
        assert_eq!(color, "blue");
        // cp -a carries all of it out.
        let scratch = tempdir();
        run(
            &m.mnt,
            "cp",
            &["-a", ".history/@then/p", scratch.path().to_str().unwrap()],
        );
        let copied = scratch.path().join("p/f");
        let cm = fs::symlink_metadata(&copied).unwrap();
        assert_eq!(
            (cm.uid(), cm.gid(), cm.mode()),
            (65534, 65534, before.mode())
        );
        assert_eq!(cm.mtime(), before.mtime());
        assert_eq!(
            fs::read_link(scratch.path().join("p/l")).unwrap().to_str(),
            Some("f")
        );
        let copied_color = run(
            scratch.path(),
            "getfattr",
            &["--only-values", "-n", "user.color", "p/f"],
        );
        assert_eq!(copied_color, "blue");
    });
}

#[test]
fn a_bare_number_is_a_sequence_number_never_a_year() {
    each_versioning_mode(|m| {
        write_file(&m.p("a"), b"a");
        // Change #1 exists; "2026" is change #2026, which does not.
        assert!(m.p(".history/@1").is_dir());
        assert!(m.p(".history/@#1").is_dir());
        assert_eq!(errno_of(fs::metadata(m.p(".history/@2026"))), libc::ENOENT);
        assert!(
            m.p(".history/@2026-01-01").symlink_metadata().is_err(),
            "before history began"
        );
        // A tag cannot be named like a time, a number or an offset
        // (`+1d` is one where `clean --now` asks for a time).
        for name in ["2026", "today", "+1d", "+x", "nl\nx"] {
            let out = Command::new(bin())
                .args(["tag", name])
                .current_dir(&m.mnt)
                .output()
                .unwrap();
            assert!(!out.status.success(), "{name}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("cannot be a tag name"), "{name}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        }
        // Nor longer than `.history/@NAME` can name (it was accepted, and
        // its directory could not be looked up).
        let long = "t".repeat(255);
        let out = Command::new(bin())
            .args(["tag", &long])
            .current_dir(&m.mnt)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("at most 254 bytes"),
            "{err}"
        );
        let longest = "t".repeat(254);
        let out = Command::new(bin())
            .args(["tag", &longest])
            .current_dir(&m.mnt)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(m.p(&format!(".history/@{longest}")).is_dir());
    });
}

#[test]
fn an_open_view_keeps_reading_the_instant_while_the_live_file_changes() {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    each_versioning_mode(|m| {
        let old = pattern(3 << 20, 7);
        fs::write(m.p("f"), &old).unwrap();
        tag(m, "t");
        let mut view = fs::File::open(m.p(".history/@t/f")).unwrap();
        let mut head = vec![0u8; 1 << 20];
        view.read_exact(&mut head).unwrap();
        assert!(head == old[..1 << 20]);
        // Rewritten in place through the mount, same size, while the view
        // is open: the view must go on showing the instant.
        let live = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
        live.write_all_at(&pattern(3 << 20, 8), 0).unwrap();
        drop(live);
        let mut rest = Vec::new();
        view.read_to_end(&mut rest).unwrap();
        assert!(
            rest == old[1 << 20..],
            "the view showed the live file's new bytes"
        );
        view.seek(SeekFrom::Start(0)).unwrap();
        let mut again = Vec::new();
        view.read_to_end(&mut again).unwrap();
        assert!(again == old);
        assert!(fs::read(m.p(".history/@t/f")).unwrap() == old);
        assert!(fs::read(m.p("f;1")).unwrap() == old);
    });
}

/// The kernel keeps live listings across opens, but a restore through the
/// CLI shows in a kept listing at once (it writes through the mount), and
/// listings whose content moves while their directory does not —
/// `;deleted` and `.history` itself — are never kept.
#[test]
fn kept_listings_show_restores_deletions_and_new_tags_at_once() {
    each_versioning_mode(|m| {
        if m.src == m.mnt {
            return; // samedir: the backing directory cannot be watched
        }
        fs::create_dir(m.p("d")).unwrap();
        for f in ["a", "b", "c"] {
            write_file(&m.p(&format!("d/{f}")), b"x");
        }
        tag(m, "t");
        fs::remove_file(m.p("d/b")).unwrap();
        assert_eq!(names(&m.p("d/;deleted")), ["b"]);
        assert_eq!(names(&m.p("d/;deleted")), ["b"]);
        fs::remove_file(m.p("d/c")).unwrap();
        assert_eq!(names(&m.p("d/;deleted")), ["b", "c"]);
        assert_eq!(wait_listing_cached(&m.p("d"), &m.src.join("d")), ["a"]);
        chrono_ok(m, &["restore", "d/b", "--at", "t"]);
        assert_eq!(names(&m.p("d")), ["a", "b"]);
        assert!(names(&m.p(".history")).contains(&"@t".to_string()));
        tag(m, "t2");
        assert!(names(&m.p(".history")).contains(&"@t2".to_string()));
    });
}

/// A version name of the store's own directory names nobody's file:
/// looking it up records nothing (`.chronofs;0` recorded the store's
/// listing as a change of history's own).
#[test]
fn version_names_of_the_store_record_nothing() {
    let m = Mount::new("");
    write_file(&m.p("a"), b"a");
    let changes = || {
        let out = chrono_ok(&m, &["fsck", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["chained_changes"].as_u64().unwrap()
    };
    let before = changes();
    for name in [".chronofs;0", ".chronofs;1", ".chronofs;-1"] {
        assert_eq!(errno_of(fs::metadata(m.p(name))), libc::ENOENT, "{name}");
    }
    assert_eq!(changes(), before);
    assert_eq!(fs::read(m.p("a;0")).unwrap(), b"a");
}
