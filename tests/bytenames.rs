//! Names are bytes end to end: every history verb works on a file whose
//! name is not UTF-8 (byte 0xff) or holds a newline, through the mount
//! and the CLI, and `--json` gives such names exactly (`*_raw`).

#![deny(unsafe_code)]

mod common;
use common::*;

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// Not UTF-8: a lossy conversion makes it "f\u{fffd}", another name.
const FF: &[u8] = b"f\xff";
/// UTF-8, but a line-based reader splits it.
const NL: &[u8] = b"n\nl";
/// A directory whose name is not UTF-8, for the tree verbs.
const DIR_FF: &[u8] = b"d\xff";

fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

fn chrono(m: &Mount, args: &[&OsStr]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(&m.mnt)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin().display()))
}

fn show(args: &[&OsStr]) -> String {
    args.iter()
        .map(|a| format!("{:?}", a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `chronofs ARGS` must succeed (diff: exit 1 means "differ", also fine
/// when `diff_ok`); returns stdout.
fn ok_with(m: &Mount, args: &[&OsStr], codes: &[i32]) -> Vec<u8> {
    let out = chrono(m, args);
    let code = out.status.code().unwrap_or(-1);
    assert!(
        codes.contains(&code),
        "`chronofs {}` exited {code}: {}\nstdout: {}\n{}",
        show(args),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout),
        m.log_tail()
    );
    out.stdout
}

fn ok(m: &Mount, args: &[&OsStr]) -> Vec<u8> {
    ok_with(m, args, &[0])
}

fn json(m: &Mount, args: &[&OsStr]) -> Value {
    let out = ok(m, args);
    serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "`chronofs {}`: not JSON ({e}): {}",
            show(args),
            String::from_utf8_lossy(&out)
        )
    })
}

/// The exact bytes of `key` in a JSON object: `KEY_raw` when present.
fn bytes_of(v: &Value, key: &str) -> Vec<u8> {
    match v.get(format!("{key}_raw")).and_then(Value::as_array) {
        Some(raw) => raw
            .iter()
            .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
            .collect(),
        None => v[key].as_str().unwrap().as_bytes().to_vec(),
    }
}

fn slash(name: &[u8]) -> Vec<u8> {
    let mut p = b"/".to_vec();
    p.extend_from_slice(name);
    p
}

/// Every verb on one file named `name` (at the mount's root).
fn verbs_on_file(m: &Mount, name: &[u8]) {
    let n = os(name);
    let path = m.mnt.join(n);
    fs::write(&path, b"one\n").unwrap();
    ok(m, &[os(b"tag"), os(b"v1")]);
    fs::write(&path, b"two\n").unwrap();
    ok(m, &[os(b"tag"), os(b"v2")]);

    // log: the path as bytes, every version numbered.
    let log = json(m, &[os(b"log"), n, os(b"--json")]);
    assert_eq!(bytes_of(&log, "path"), slash(name), "log --json: {log}");
    let versions = log["versions"].as_array().unwrap();
    assert!(versions.len() >= 2, "log --json: {log}");
    for v in versions {
        assert_eq!(bytes_of(v, "path"), slash(name), "log row: {v}");
    }
    // log of the directory, recursive: the row names the file exactly.
    let tree = json(m, &[os(b"log"), os(b"-r"), os(b"."), os(b"--json")]);
    assert!(
        tree["versions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.get("path").is_some() && bytes_of(r, "path") == slash(name)),
        "log -r --json: no row of {name:?}: {tree}"
    );
    // ls --json: the entry's name as bytes.
    let ls = json(m, &[os(b"ls"), os(b"."), os(b"--json")]);
    assert!(
        ls["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| bytes_of(e, "name") == name),
        "ls --json: {ls}"
    );

    // ls: one line per entry, the name escaped (a newline in a name
    // must not split it in two).
    let text = String::from_utf8(ok(m, &[os(b"ls"), os(b".")])).unwrap();
    let shown = String::from_utf8_lossy(name).replace('\n', "\\n");
    assert!(text.lines().any(|l| l == shown), "ls: {text:?}");

    // cat: by version number and by instant.
    assert_eq!(
        ok(m, &[os(b"cat"), n, os(b"--version"), os(b"1")]),
        b"one\n"
    );
    assert_eq!(ok(m, &[os(b"cat"), n, os(b"--at"), os(b"v1")]), b"one\n");
    let cat = json(m, &[os(b"cat"), n, os(b"--at"), os(b"v1"), os(b"--json")]);
    assert_eq!(cat["content"], "one\n", "cat --json: {cat}");
    assert_eq!(bytes_of(&cat, "path"), path.as_os_str().as_bytes());

    // diff: the content changed between the tags.
    let d = ok_with(m, &[os(b"diff"), n, os(b"v1"), os(b"v2")], &[1]);
    let text = String::from_utf8_lossy(&d);
    assert!(
        text.contains("-one") && text.contains("+two"),
        "diff: {text}"
    );
    let dj = ok_with(
        m,
        &[os(b"diff"), n, os(b"v1"), os(b"v2"), os(b"--json")],
        &[1],
    );
    let dj: Value = serde_json::from_slice(&dj).unwrap();
    assert_eq!(dj["differ"], true, "diff --json: {dj}");
    assert_eq!(bytes_of(&dj["changes"][0], "path"), slash(name), "{dj}");

    // restore in place, then to another name.
    ok(m, &[os(b"restore"), n, os(b"--at"), os(b"v1")]);
    assert_eq!(fs::read(&path).unwrap(), b"one\n");
    let mut copy = name.to_vec();
    copy.extend_from_slice(b".copy");
    ok(
        m,
        &[
            os(b"restore"),
            n,
            os(b"--at"),
            os(b"v2"),
            os(b"--to"),
            os(&copy),
        ],
    );
    assert_eq!(fs::read(m.mnt.join(os(&copy))).unwrap(), b"two\n");

    // revert.
    ok(m, &[os(b"revert"), n, os(b"--at"), os(b"v2")]);
    assert_eq!(fs::read(&path).unwrap(), b"two\n");

    // undelete.
    fs::remove_file(&path).unwrap();
    let ls = json(m, &[os(b"ls"), os(b"."), os(b"--deleted"), os(b"--json")]);
    assert!(
        ls["deleted"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| bytes_of(e, "name") == name),
        "ls --deleted --json: {ls}"
    );
    ok(m, &[os(b"undelete"), n]);
    assert_eq!(fs::read(&path).unwrap(), b"two\n");

    // purge (removes the live file through the mount, then its history).
    let p = json(m, &[os(b"purge"), n, os(b"--json")]);
    assert!(p["objects"].as_u64().unwrap() >= 1, "purge --json: {p}");
    assert!(fs::symlink_metadata(&path).is_err(), "purge left the file");
    let out = chrono(m, &[os(b"log"), n]);
    assert!(
        !out.status.success(),
        "log after purge: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    ok(m, &[os(b"tag"), os(b"--delete"), os(b"v1")]);
    ok(m, &[os(b"tag"), os(b"--delete"), os(b"v2")]);
}

#[test]
fn every_verb_works_on_a_name_with_byte_ff() {
    each_versioning_mode(|m| verbs_on_file(m, FF));
}

#[test]
fn every_verb_works_on_a_name_with_a_newline() {
    each_versioning_mode(|m| verbs_on_file(m, NL));
}

#[test]
fn tree_verbs_work_on_a_directory_named_with_byte_ff() {
    each_versioning_mode(|m| {
        let d = m.mnt.join(os(DIR_FF));
        fs::create_dir(&d).unwrap();
        fs::write(d.join(os(NL)), b"inner\n").unwrap();
        fs::write(d.join(os(FF)), b"ff\n").unwrap();
        ok(m, &[os(b"tag"), os(b"t")]);
        fs::write(d.join(os(FF)), b"changed\n").unwrap();
        fs::write(d.join("new"), b"new\n").unwrap();
        ok(m, &[os(b"revert"), os(DIR_FF), os(b"--at"), os(b"t")]);
        let mut names: Vec<OsString> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        let want: Vec<OsString> = vec![
            OsString::from_vec(FF.to_vec()),
            OsString::from_vec(NL.to_vec()),
        ];
        let mut want = want;
        want.sort();
        assert_eq!(names, want);
        assert_eq!(fs::read(d.join(os(FF))).unwrap(), b"ff\n");
        fs::remove_dir_all(&d).unwrap();
        ok(m, &[os(b"undelete"), os(DIR_FF)]);
        assert_eq!(fs::read(d.join(os(NL))).unwrap(), b"inner\n");
        let log = json(m, &[os(b"log"), os(DIR_FF), os(b"--json")]);
        assert_eq!(bytes_of(&log, "path"), slash(DIR_FF), "{log}");
        let p = json(m, &[os(b"purge"), os(DIR_FF), os(b"--json")]);
        assert!(p["objects"].as_u64().unwrap() >= 3, "purge --json: {p}");
    });
}

/// A backslash in a name is doubled in text output, as `ls -b` does: a
/// name holding `\n` (two characters) and one holding a newline print
/// apart (both printed `a\nb`).
#[test]
fn a_backslash_in_a_name_prints_apart_from_a_newline() {
    let m = Mount::new(&versioning_modes().remove(0));
    fs::create_dir(m.mnt.join("d")).unwrap();
    fs::write(m.mnt.join("d").join(r"a\nb"), b"1").unwrap();
    fs::write(m.mnt.join("d").join("a\nb"), b"2").unwrap();
    let text = String::from_utf8(ok(&m, &[os(b"ls"), os(b"d")])).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.contains(&r"a\\nb"), "ls: {text:?}");
    assert!(lines.contains(&r"a\nb"), "ls: {text:?}");
    let log = String::from_utf8(ok(&m, &[os(b"log"), os(b"-r"), os(b"d")])).unwrap();
    for name in [r"/a\\nb", r"/a\nb"] {
        assert!(
            log.lines().any(|l| l.trim_end().ends_with(name)),
            "log -r: no row of {name}: {log:?}"
        );
    }
}
