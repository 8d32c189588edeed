//! History follows the file through renames (issue 14, item 2): a path's
//! `log`, its version names (`f;N`), `cat --version` and `diff` bring the
//! history its object had under earlier names — its own renames and its
//! directories' — and a name that was only renamed away (or an editor's
//! temporary or backup name) is not listed under `;deleted`.

#![deny(unsafe_code)]

mod common;
use common::*;

use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn chrono(m: &Mount, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(&m.mnt)
        .env("TZ", "UTC")
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn chrono_ok(m: &Mount, args: &[&str]) -> String {
    let out = chrono(m, args);
    assert!(
        out.status.success(),
        "`chronofs {}` failed: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr),
        m.log_tail()
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(m: &Mount, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&chrono_ok(m, args)).unwrap()
}

/// The causes of a path's versions, in `log` order.
fn causes(m: &Mount, rel: &str) -> Vec<String> {
    let log = json(m, &["log", rel, "--json"]);
    let rows = log["versions"].as_array().cloned().unwrap_or_default();
    rows.iter()
        .map(|v| v["cause"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn cat_version(m: &Mount, rel: &str, n: i64) -> String {
    chrono_ok(m, &["cat", rel, &format!("--version={n}")])
}

fn read(p: &Path) -> String {
    String::from_utf8(fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))).unwrap()
}

fn append(p: &Path, data: &str) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new().append(true).open(p).unwrap();
    f.write_all(data.as_bytes()).unwrap();
}

/// What `ls DIR/;deleted` lists (through the mount) and what
/// `chronofs ls DIR --deleted` reports; both must agree.
fn deleted(m: &Mount, dir: &str) -> Vec<String> {
    let view = if dir.is_empty() {
        m.p(";deleted")
    } else {
        m.p(&format!("{dir}/;deleted"))
    };
    let mut names: Vec<String> = fs::read_dir(&view)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", view.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let dir = if dir.is_empty() { "." } else { dir };
    let ls = json(m, &["ls", dir, "--deleted", "--json"]);
    let mut cli: Vec<String> = ls["deleted"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| e["name"].as_str().unwrap_or("?").to_string())
        .collect();
    cli.sort();
    assert_eq!(
        names, cli,
        "`;deleted` and `chronofs ls --deleted` disagree"
    );
    names
}

/// The issue's reproducer: a directory renamed between writes to a file
/// in it splits nothing.
#[test]
fn directory_rename_keeps_the_history_of_its_files() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("m1")).unwrap();
        fs::write(m.p("m1/f"), "a\n").unwrap();
        append(&m.p("m1/f"), "b\n");
        chrono_ok(m, &["tag", "before-mv"]);
        fs::rename(m.p("m1"), m.p("m2")).unwrap();
        append(&m.p("m2/f"), "c\n");

        assert_eq!(causes(m, "m2/f"), ["create", "write", "write"]);
        // Versions recorded under the old name say which.
        let log = json(m, &["log", "m2/f", "--json"]);
        let rows = log["versions"].as_array().unwrap();
        assert_eq!(rows[0]["as"], "/m1/f", "{log}");
        assert_eq!(rows[1]["as"], "/m1/f", "{log}");
        assert!(rows[2]["as"].is_null(), "{log}");
        assert!(chrono_ok(m, &["log", "m2/f"]).contains("(as /m1/f)"));
        assert_eq!(read(&m.p("m2/f;1")), "a\n");
        assert_eq!(read(&m.p("m2/f;2")), "a\nb\n");
        assert_eq!(read(&m.p("m2/f;3")), "a\nb\nc\n");
        assert_eq!(read(&m.p("m2/f;-1")), "a\nb\n");
        assert_eq!(cat_version(m, "m2/f", 1), "a\n");
        assert_eq!(cat_version(m, "m2/f", -1), "a\nb\n");
        // A version name by instant follows the file too; the instant's
        // tree stays exact.
        assert_eq!(read(&m.p("m2/f;@before-mv")), "a\nb\n");
        assert_eq!(read(&m.p(".history/@before-mv/m1/f")), "a\nb\n");
        assert!(!m.p(".history/@before-mv/m2").exists());
        // The old path's log is what was there: the first two versions.
        assert_eq!(causes(m, "m1/f"), ["create", "write"]);
        // diff follows the file back to where it was then.
        let out = chrono(m, &["diff", "m2/f", "before-mv"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("+c") && !text.contains("Only in"),
            "diff m2/f before-mv: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The directory was renamed, not deleted.
        assert_eq!(deleted(m, ""), Vec::<String>::new());
    });
}

/// `mv a b`: b's log is a's history, then the rename, then what came after.
#[test]
fn file_rename_brings_its_history() {
    each_versioning_mode(|m| {
        fs::write(m.p("a"), "a1\n").unwrap();
        fs::write(m.p("a"), "a2\n").unwrap();
        fs::rename(m.p("a"), m.p("b")).unwrap();
        append(&m.p("b"), "b3\n");

        assert_eq!(causes(m, "b"), ["create", "write", "rename", "write"]);
        assert_eq!(read(&m.p("b;1")), "a1\n");
        assert_eq!(read(&m.p("b;2")), "a2\n");
        assert_eq!(cat_version(m, "b", 1), "a1\n");
        assert_eq!(cat_version(m, "b", 0), "a2\nb3\n");
        // a's own log ends at the rename and still reads.
        assert_eq!(causes(m, "a"), ["create", "write", "rename"]);
        assert_eq!(cat_version(m, "a", 1), "a1\n");
        // Renamed away is not deleted.
        assert_eq!(deleted(m, ""), Vec::<String>::new());
        // Moving it back brings only what it did since.
        fs::rename(m.p("b"), m.p("a")).unwrap();
        let log = causes(m, "a");
        assert_eq!(
            log,
            ["create", "write", "rename", "write", "rename"],
            "each version once, numbers already shown unchanged"
        );
        assert_eq!(read(&m.p("a;1")), "a1\n");
        assert_eq!(read(&m.p("a;4")), "a2\nb3\n");
        // A real deletion is still listed.
        fs::remove_file(m.p("a")).unwrap();
        assert_eq!(deleted(m, ""), ["a"]);
        assert_eq!(read(&m.p(";deleted/a")), "a2\nb3\n");
    });
}

/// A grandparent renamed, then the parent: the file's history survives both.
#[test]
fn nested_parent_renames_keep_the_history() {
    each_versioning_mode(|m| {
        fs::create_dir_all(m.p("p/q")).unwrap();
        fs::write(m.p("p/q/f"), "one\n").unwrap();
        append(&m.p("p/q/f"), "two\n");
        fs::rename(m.p("p"), m.p("r")).unwrap();
        append(&m.p("r/q/f"), "three\n");
        fs::create_dir(m.p("s")).unwrap();
        fs::rename(m.p("r/q"), m.p("s/t")).unwrap();

        assert_eq!(causes(m, "s/t/f"), ["create", "write", "write"]);
        assert_eq!(read(&m.p("s/t/f;1")), "one\n");
        assert_eq!(read(&m.p("s/t/f;2")), "one\ntwo\n");
        assert_eq!(cat_version(m, "s/t/f", 2), "one\ntwo\n");
        assert_eq!(cat_version(m, "s/t/f", 0), "one\ntwo\nthree\n");
        assert_eq!(deleted(m, ""), Vec::<String>::new());
        assert_eq!(deleted(m, "r"), Vec::<String>::new());
    });
}

/// Saving by writing a temporary file and renaming it over the original
/// (rsync, sed -i, many editors): the file's log holds the old object's
/// versions and then the new one's, and the temporary name is no deletion.
#[test]
fn save_by_rename_over_keeps_the_history_readable() {
    each_versioning_mode(|m| {
        fs::write(m.p("f"), "v1\n").unwrap();
        fs::write(m.p("f"), "v2\n").unwrap();
        fs::write(m.p("f.tmp"), "v3\n").unwrap();
        fs::rename(m.p("f.tmp"), m.p("f")).unwrap();

        assert_eq!(
            causes(m, "f"),
            ["create", "write", "overwritten", "create", "rename"]
        );
        assert_eq!(read(&m.p("f;1")), "v1\n");
        assert_eq!(read(&m.p("f;2")), "v2\n");
        assert_eq!(read(&m.p("f;4")), "v3\n");
        assert_eq!(cat_version(m, "f", 0), "v3\n");
        assert_eq!(cat_version(m, "f", -2), "v2\n");
        assert_eq!(deleted(m, ""), Vec::<String>::new());
    });
}

/// vim's save: a probe file `4913` created and removed, `f` renamed to
/// `f~`, a new `f` written, `f~` removed. None of it is a deletion the
/// user made: `f~`'s content is in f's log.
#[test]
fn editor_backup_and_probe_names_are_not_listed_as_deleted() {
    if Command::new("vim").arg("--version").output().is_err() {
        eprintln!("note: vim not installed; skipping");
        return;
    }
    each_versioning_mode(|m| {
        fs::write(m.p("f"), "hello\n").unwrap();
        let st = Command::new("vim")
            .args(["-u", "NONE", "-i", "NONE", "-N", "-n", "-es"])
            .args(["-c", "%s/hello/world/", "-c", "wq", "f"])
            .current_dir(&m.mnt)
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        assert_eq!(read(&m.p("f")), "world\n");
        assert_eq!(read(&m.p("f;1")), "hello\n");
        assert_eq!(cat_version(m, "f", 0), "world\n");
        assert_eq!(deleted(m, ""), Vec::<String>::new());
    });
}

/// Retention decides by the path a file has now, also when a directory
/// above it was renamed after a file deleted in it was scanned (the
/// planner's path cache once kept a directory's name from the deleted
/// file's instant and gave it to the live files).
#[test]
fn retention_follows_a_renamed_directory() {
    let dir = tempdir();
    let policy = dir.path().join("policy.toml");
    fs::write(
        &policy,
        "[[rule]]\nname = \"short\"\npaths = [\"m2/**\"]\nmax-count = 1\n",
    )
    .unwrap();
    let mode = versioning_modes().remove(0);
    let opts = format!("{mode},policy={},clean-interval=0", policy.display());
    let m = {
        let _serial = history_mount_lock();
        let m = Mount::new(&opts);
        m.wait_history_ready();
        m
    };
    fs::create_dir(m.p("m1")).unwrap();
    fs::write(m.p("m1/gone"), "deleted before the rename\n").unwrap();
    fs::write(m.p("m1/f"), "one\n").unwrap();
    append(&m.p("m1/f"), "two\n");
    append(&m.p("m1/f"), "three\n");
    fs::remove_file(m.p("m1/gone")).unwrap();
    fs::rename(m.p("m1"), m.p("m2")).unwrap();
    assert_eq!(causes(&m, "m2/f"), ["create", "write", "write"]);
    chrono_ok(&m, &["clean", "--now", "+40d"]);
    assert_eq!(
        causes(&m, "m2/f"),
        ["write"],
        "m2/f is under m2/**: one version kept"
    );
    assert_eq!(cat_version(&m, "m2/f", 1), "one\ntwo\nthree\n");
    let _serial = history_mount_lock();
    drop(m);
}
