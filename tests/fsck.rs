//! fsck on real mounts, with pack bytes damaged behind chronofs's back:
//! it names the paths and versions (with their times) a damaged chunk
//! costs; `--repair` stores the chunk again when a live file still holds
//! its bytes, marks the versions it cannot save as lost (shown by `log`,
//! an error when read), records what it did in the audit log, and leaves
//! a store the next fsck finds clean.

#![deny(unsafe_code)]

mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn cli_out(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin().display()))
}

fn cli(args: &[&str]) -> String {
    let out = cli_out(args);
    assert!(
        out.status.success(),
        "`chronofs {}` failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = cli_out(&a);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON from `chronofs {}` ({e}): {}{}",
            a.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn mount() -> Mount {
    let _serial = history_mount_lock();
    let m = Mount::new(&versioning_modes().remove(0));
    m.wait_history_ready();
    m
}

/// Runs `f` on the source directory while nothing is mounted, then
/// mounts again.
fn offline(m: &mut Mount, f: impl FnOnce(&Path)) {
    {
        let _serial = history_mount_lock();
        m.unmount();
    }
    f(&m.src);
    let _serial = history_mount_lock();
    m.start();
    m.wait_history_ready();
}

/// Flips three bytes in the middle of the stored body of the pack entry
/// holding the first chunk of `content` (found by hashing `content`'s
/// prefix of each entry's raw length); returns that chunk's length.
fn damage_first_chunk(src: &Path, content: &[u8]) -> usize {
    let packs = src.join(".chronofs/packs");
    for entry in std::fs::read_dir(&packs).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let mut off = 16;
        while off + 45 <= bytes.len() && &bytes[off..off + 4] == b"CHK1" {
            let raw = u32::from_be_bytes(bytes[off + 5..off + 9].try_into().unwrap()) as usize;
            let stored = u32::from_be_bytes(bytes[off + 9..off + 13].try_into().unwrap()) as usize;
            let hash = &bytes[off + 13..off + 45];
            if raw <= content.len() && blake3::hash(&content[..raw]).as_bytes() == hash {
                let mid = off + 45 + stored / 2;
                for b in &mut bytes[mid..mid + 3] {
                    *b ^= 0x5a;
                }
                std::fs::write(&path, &bytes).unwrap();
                return raw;
            }
            off += 45 + stored;
        }
    }
    panic!("no pack entry holds the first chunk of the content");
}

fn log_rows(p: &Path) -> Vec<Value> {
    json(&["log", s(p)])["versions"].as_array().unwrap().clone()
}

fn cat_version(p: &Path, n: usize) -> Output {
    cli_out(&["cat", s(p), "--version", &n.to_string()])
}

fn audit_actions(m: &Mount) -> Vec<Value> {
    json(&["audit", s(&m.mnt)])["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "fsck-repair")
        .cloned()
        .collect()
}

/// The fsck problem line for version `n` of `rel`, with its time.
fn names_version(report: &Value, rel: &str, n: usize, row: &Value) -> bool {
    let time = report["unreadable"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == format!("/{rel}") && c["version"] == n as u64)
        .map(|c| c["time_ns"] == row["time_ns"] && c["seq"] == row["seq"]);
    let line = report["problems"].as_array().unwrap().iter().any(|p| {
        let p = p.as_str().unwrap_or("");
        p.starts_with(&format!("/{rel}: version {n} (#{}, ", row["seq"]))
            && p.contains("cannot be read")
    });
    time == Some(true) && line
}

#[test]
fn repair_restores_a_damaged_chunk_from_the_live_file() {
    let mut m = mount();
    let first = pattern(96 << 10, 7);
    write_file(&m.p("data.bin"), &first);
    // An append: the live file still holds the first version's chunks.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(m.p("data.bin"))
            .unwrap();
        f.write_all(&pattern(8 << 10, 8)).unwrap();
    }
    let live = read_file(&m.p("data.bin"));
    let rows = log_rows(&m.p("data.bin"));
    assert_eq!(rows.len(), 2, "{rows:?}");
    offline(&mut m, |src| {
        damage_first_chunk(src, &first);
    });

    let report = json(&["fsck", s(&m.mnt)]);
    assert!(
        names_version(&report, "data.bin", 1, &rows[0]),
        "fsck does not name version 1 of /data.bin with its time: {report:#}"
    );
    assert!(
        names_version(&report, "data.bin", 2, &rows[1]),
        "{report:#}"
    );
    assert!(!cat_version(&m.p("data.bin"), 1).status.success());

    let repaired = json(&["fsck", s(&m.mnt), "--repair"]);
    assert_eq!(repaired["problems"], Value::Array(vec![]), "{repaired:#}");
    let rep = &repaired["repair"];
    assert!(rep["restored_chunks"].as_u64() >= Some(1), "{repaired:#}");
    assert_eq!(rep["restored"].as_array().unwrap().len(), 2, "{repaired:#}");
    assert_eq!(rep["lost"], Value::Array(vec![]), "{repaired:#}");

    let v1 = cat_version(&m.p("data.bin"), 1);
    assert!(v1.status.success(), "{v1:?}");
    assert!(v1.stdout == first, "version 1 reads back different bytes");
    assert!(cat_version(&m.p("data.bin"), 2).stdout == live);
    assert!(read_file(&m.p("data.bin")) == live);

    let again = json(&["fsck", s(&m.mnt)]);
    assert_eq!(again["problems"], Value::Array(vec![]), "{again:#}");
    assert!(cli(&["fsck", s(&m.mnt)]).contains("store is consistent"));
    let audit = audit_actions(&m);
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0]["detail"]["restored_chunks"].as_u64() >= Some(1));
}

#[test]
fn repair_marks_what_it_cannot_save_as_lost() {
    let mut m = mount();
    let old = pattern(20 << 10, 11);
    write_file(&m.p("notes.txt"), &old);
    let new = pattern(20 << 10, 12);
    write_file(&m.p("notes.txt"), &new);
    let rows = log_rows(&m.p("notes.txt"));
    assert_eq!(rows.len(), 2, "{rows:?}");
    offline(&mut m, |src| {
        damage_first_chunk(src, &old);
    });

    let report = json(&["fsck", s(&m.mnt)]);
    assert!(
        names_version(&report, "notes.txt", 1, &rows[0]),
        "fsck does not name version 1 of /notes.txt with its time: {report:#}"
    );
    assert_eq!(report["unreadable"].as_array().unwrap().len(), 1);
    let text = String::from_utf8_lossy(&cli_out(&["fsck", s(&m.mnt)]).stdout).into_owned();
    assert!(
        text.contains("problem: /notes.txt: version 1 (#") && text.contains("store has problems"),
        "{text}"
    );

    let repaired = json(&["fsck", s(&m.mnt), "--repair"]);
    assert_eq!(repaired["problems"], Value::Array(vec![]), "{repaired:#}");
    let lost = repaired["repair"]["lost"].as_array().unwrap().clone();
    assert_eq!(lost.len(), 1, "{repaired:#}");
    assert_eq!(lost[0]["path"], "/notes.txt");
    assert_eq!(lost[0]["version"], 1);
    assert_eq!(lost[0]["seq"], rows[0]["seq"]);

    // Still listed, shown lost; reading it is a clear error.
    let after = log_rows(&m.p("notes.txt"));
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!(after[0]["lost"], true, "{after:?}");
    assert!(after[1].get("lost").is_none(), "{after:?}");
    let text = cli(&["log", s(&m.p("notes.txt"))]);
    assert!(text.contains("(lost: cannot be read)"), "{text}");
    let out = cat_version(&m.p("notes.txt"), 1);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lost") && err.contains("input/output error"),
        "{err}"
    );
    assert!(cat_version(&m.p("notes.txt"), 2).stdout == new);
    // Through the mount's version names too: EIO, not wrong bytes.
    let through_mount = std::fs::read(m.p("notes.txt;1"));
    assert_eq!(
        through_mount.as_ref().map_err(|e| e.raw_os_error()).err(),
        Some(Some(libc::EIO)),
        "{through_mount:?}"
    );

    let again = json(&["fsck", s(&m.mnt)]);
    assert_eq!(again["problems"], Value::Array(vec![]), "{again:#}");
    assert_eq!(again["lost_versions"], 1, "{again:#}");
    let audit = audit_actions(&m);
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(
        audit[0]["detail"]["lost_versions"][0]["path"], "/notes.txt",
        "{audit:?}"
    );

    // The damaged bytes are not deduplicated against: written again, they
    // are stored again and read back.
    write_file(&m.p("notes.txt"), &old);
    let rows = log_rows(&m.p("notes.txt"));
    assert!(cat_version(&m.p("notes.txt"), rows.len()).stdout == old);
    let last = json(&["fsck", s(&m.mnt)]);
    assert_eq!(last["problems"], Value::Array(vec![]), "{last:#}");
}

#[test]
fn repair_rebuilds_newest_versions_after_a_pack_is_lost() {
    let mut m = mount();
    let files = ["a.bin", "b.bin"];
    let mut newest = Vec::new();
    for (i, f) in files.iter().enumerate() {
        write_file(&m.p(f), &pattern(40 << 10, 20 + i as u64));
        let now = pattern(60 << 10, 30 + i as u64);
        write_file(&m.p(f), &now);
        newest.push(now);
    }
    offline(&mut m, |src| {
        for e in std::fs::read_dir(src.join(".chronofs/packs")).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
    });
    let report = json(&["fsck", s(&m.mnt)]);
    assert_eq!(
        report["unreadable"].as_array().unwrap().len(),
        4,
        "{report:#}"
    );

    // The manifests come back first, then the chunks they name.
    let repaired = json(&["fsck", s(&m.mnt), "--repair"]);
    assert_eq!(repaired["problems"], Value::Array(vec![]), "{repaired:#}");
    let rep = &repaired["repair"];
    assert_eq!(rep["restored"].as_array().unwrap().len(), 2, "{repaired:#}");
    assert_eq!(rep["lost"].as_array().unwrap().len(), 2, "{repaired:#}");
    for (f, now) in files.iter().zip(&newest) {
        let rows = log_rows(&m.p(f));
        assert_eq!(rows[0]["lost"], true, "{rows:?}");
        assert!(rows[1].get("lost").is_none(), "{rows:?}");
        assert!(cat_version(&m.p(f), 2).stdout == *now);
    }
    let again = json(&["fsck", s(&m.mnt)]);
    assert_eq!(again["problems"], Value::Array(vec![]), "{again:#}");
    assert_eq!(again["lost_versions"], 2, "{again:#}");
}

/// FORMAT.md: a pack's wrong magic is damage. fsck names what it costs
/// (it aborted, calling the pack a "store index"), `--repair` recovers the
/// newest versions from the live files and marks the rest lost, and gc
/// then goes ahead.
#[test]
fn a_pack_with_a_damaged_header_is_damage_that_repair_handles() {
    let mut m = mount();
    let files = ["a.bin", "b.bin"];
    for (i, f) in files.iter().enumerate() {
        write_file(&m.p(f), &pattern(40 << 10, 40 + i as u64));
        write_file(&m.p(f), &pattern(60 << 10, 50 + i as u64));
    }
    offline(&mut m, |src| {
        for e in std::fs::read_dir(src.join(".chronofs/packs")).unwrap() {
            let path = e.unwrap().path();
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[..4].copy_from_slice(b"XXXX");
            std::fs::write(&path, &bytes).unwrap();
        }
    });
    let report = json(&["fsck", s(&m.mnt)]);
    assert_eq!(
        report["unreadable"].as_array().unwrap().len(),
        4,
        "{report:#}"
    );
    let text = format!("{report}");
    assert!(!text.contains("store index"), "{report:#}");
    // Through the mount: EIO, as for flipped bytes.
    let read = std::fs::read(m.p("a.bin;1")).map_err(|e| e.raw_os_error());
    assert_eq!(read.err(), Some(Some(libc::EIO)));

    let repaired = json(&["fsck", s(&m.mnt), "--repair"]);
    let rep = &repaired["repair"];
    assert_eq!(rep["restored"].as_array().unwrap().len(), 2, "{repaired:#}");
    assert_eq!(rep["lost"].as_array().unwrap().len(), 2, "{repaired:#}");
    let again = json(&["fsck", s(&m.mnt)]);
    assert_eq!(again["unreadable"], Value::Array(vec![]), "{again:#}");
    cli(&["gc", s(&m.mnt)]);
}

/// A version whose pack is gone reads back EIO through the mount, as a
/// damaged chunk does (it was ENOENT while stat succeeded).
#[test]
fn a_version_whose_pack_is_missing_reads_eio() {
    let mut m = mount();
    write_file(&m.p("f"), &pattern(200 << 10, 61));
    write_file(&m.p("f"), &pattern(200 << 10, 62));
    offline(&mut m, |src| {
        for e in std::fs::read_dir(src.join(".chronofs/packs")).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
    });
    assert!(std::fs::metadata(m.p("f;1")).is_ok());
    let read = std::fs::read(m.p("f;1")).map_err(|e| e.raw_os_error());
    assert_eq!(read.err(), Some(Some(libc::EIO)));
    let out = cat_version(&m.p("f"), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is damaged: it is missing"), "{err}");
}
