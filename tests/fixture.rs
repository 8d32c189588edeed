//! Stores written by earlier builds keep opening: every fixture in
//! tests/fixtures (one per store format, made by make-fixture.sh) is
//! unpacked into a temporary directory and read through the CLI (the
//! store opened directly, nothing mounted): every version its EXPECTED
//! file lists reads back with the same number, sequence number, cause,
//! kind, size and content (or, marked lost, does not read); the tags and
//! the audit log are there; fsck finds the store clean.

#![deny(unsafe_code)]

mod common;
use common::*;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .collect();
    out.sort();
    out
}

fn cli(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin().display()))
}

fn cli_json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = cli(&a);
    assert!(
        out.status.success(),
        "`chronofs {}` failed: {}",
        a.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON from `chronofs {}` ({e}): {}",
            a.join(" "),
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn sha256(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Checks one unpacked fixture against its EXPECTED lines; returns the
/// mismatches.
fn check(src: &Path, expected: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let mut logs: std::collections::HashMap<String, Value> = Default::default();
    let mut tags = Vec::new();
    let mut audit = Vec::new();
    for line in expected.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "version" => {
                let (path, n, seq, cause, kind, size, sum) =
                    (f[1], f[2], f[3], f[4], f[5], f[6], f[7]);
                let abs = src.join(path);
                let log = logs
                    .entry(path.to_string())
                    .or_insert_with(|| cli_json(&["log", abs.to_str().unwrap()]));
                let row = log["versions"]
                    .as_array()
                    .and_then(|rows| rows.iter().find(|r| r["n"].as_u64() == n.parse().ok()));
                let Some(row) = row else {
                    bad.push(format!("{path}: no version {n} in {log}"));
                    continue;
                };
                let got = format!(
                    "{} {} {} {}",
                    row["seq"],
                    row["cause"].as_str().unwrap_or("?"),
                    row["kind"].as_str().unwrap_or("?"),
                    row["size"]
                );
                // Format 5 on: versions fsck --repair marked lost.
                let lost = f.get(8) == Some(&"lost");
                if (row["lost"] == true) != lost {
                    bad.push(format!("{path} version {n}: lost should be {lost}: {row}"));
                }
                let want = format!("{seq} {cause} {kind} {size}");
                if got != want {
                    bad.push(format!("{path} version {n}: {got}, expected {want}"));
                }
                if kind == "file" {
                    let out = cli(&["cat", abs.to_str().unwrap(), "--version", n]);
                    let got = if out.status.success() {
                        sha256(&out.stdout)
                    } else {
                        "-".to_string()
                    };
                    if got != sum {
                        bad.push(format!(
                            "{path} version {n}: content {got}, expected {sum} ({})",
                            String::from_utf8_lossy(&out.stderr).trim()
                        ));
                    }
                }
            }
            "tag" => tags.push(format!("{} {}", f[1], f[2])),
            "audit" => audit.push(f[1].to_string()),
            "live" => {
                let p = src.join(f[1]);
                let got = match f[2] {
                    "f" => std::fs::read(&p).map(|d| sha256(&d)),
                    "l" => std::fs::read_link(&p).map(|t| t.to_string_lossy().into_owned()),
                    _ => std::fs::symlink_metadata(&p).map(|_| "-".to_string()),
                };
                match got {
                    Ok(v) if v == f[3] => {}
                    other => bad.push(format!("live {}: {other:?}, expected {}", f[1], f[3])),
                }
            }
            other => bad.push(format!("unknown EXPECTED line kind {other}")),
        }
    }
    // Versions beyond those listed would be new history the build invented.
    for (path, log) in &logs {
        let listed = expected
            .lines()
            .filter(|l| l.starts_with(&format!("version {path} ")))
            .count();
        let shown = log["versions"].as_array().map_or(0, Vec::len);
        if listed != shown {
            bad.push(format!("{path}: {shown} versions, expected {listed}"));
        }
    }
    let s = src.to_str().unwrap();
    let got_tags: Vec<String> = cli_json(&["tags", s])["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("{} {}", t["name"].as_str().unwrap_or("?"), t["seq"]))
        .collect();
    if got_tags != tags {
        bad.push(format!("tags {got_tags:?}, expected {tags:?}"));
    }
    let got_audit: Vec<String> = cli_json(&["audit", s])["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap_or("?").to_string())
        .collect();
    // The first open of an older format may add records; the recorded
    // ones come first, in order.
    if !got_audit.starts_with(&audit) {
        bad.push(format!("audit {got_audit:?}, expected {audit:?} first"));
    }
    let fsck = cli_json(&["fsck", s]);
    if fsck["problems"] != Value::Array(vec![]) {
        bad.push(format!("fsck: {fsck}"));
    }
    bad
}

#[test]
fn every_fixture_store_opens_and_reads_back_its_history() {
    let all = fixtures();
    assert!(!all.is_empty(), "no fixtures in tests/fixtures");
    let mut failures = Vec::new();
    for tarball in &all {
        let name = tarball.file_name().unwrap().to_string_lossy().into_owned();
        let expected_path =
            PathBuf::from(tarball.to_string_lossy().replace(".tar.gz", ".expected"));
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        let dir = tempdir();
        let src = dir.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let out = Command::new("tar")
            .arg("-C")
            .arg(&src)
            .arg("-xzf")
            .arg(tarball)
            .output()
            .unwrap();
        assert!(out.status.success(), "untar {name}: {out:?}");
        for problem in check(&src, &expected) {
            failures.push(format!("{name}: {problem}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
