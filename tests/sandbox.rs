//! Sandboxes (issue 17): `chronofs sandbox MNT -- CMD` runs CMD against
//! a private read-write layer over the mount, seen by CMD and its children
//! only, until `chronofs sandbox commit` applies it to the mount or
//! `chronofs sandbox discard` throws it away. docs/ARCHITECTURE.md
//! "Sandboxes".

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

/// `chronofs sandbox MNT [--id N] -- sh -c SCRIPT` (MNT in SCRIPT is the
/// mount point).
fn in_sandbox(m: &Mount, id: Option<u32>, script: &str) -> Output {
    let mnt = m.mnt.to_str().unwrap();
    let script = script.replace("MNT", mnt);
    let id = id.map(|i| i.to_string());
    let mut args = vec!["sandbox", mnt];
    if let Some(id) = &id {
        args.extend(["--id", id]);
    }
    args.extend(["--", "sh", "-c", &script]);
    chronofs_in(m.root(), &args)
}

fn ok(out: Output, what: &str, m: &Mount) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout),
        m.log_tail()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn listed(m: &Mount) -> Vec<serde_json::Value> {
    let out = ok(
        chronofs_in(
            m.root(),
            &["sandbox", "list", m.mnt.to_str().unwrap(), "--json"],
        ),
        "sandbox list",
        m,
    );
    serde_json::from_str::<Vec<serde_json::Value>>(&out).unwrap()
}

/// The sandbox sessions daemon `pid` has mounted.
fn sandbox_mounts(pid: u32) -> usize {
    let under = format!(" /run/chronofs/sandboxes/{pid}/");
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&under))
        .count()
}

fn lower(b: &[std::path::PathBuf]) {
    write_file(&b[0].join("top"), b"top\n");
    if let Some(l) = b.get(1) {
        write_file(&l.join("old"), b"old\n");
        fs::create_dir(l.join("d")).unwrap();
        write_file(&l.join("d/x"), b"x\n");
    }
}

/// A union of SRC over one read-only branch, or SRC alone; with history
/// and without.
fn each_kind(f: impl Fn(&mut Mount)) {
    for lowers in [1, 0] {
        for mode in ["plain", ""] {
            let mut m = match lowers {
                0 => Mount::new_with(mode, |src| lower(&[src.to_path_buf()])),
                n => Mount::union(mode, n, lower),
            };
            eprintln!("{lowers} lower branch(es), mode {mode:?}");
            f(&mut m);
        }
    }
}

#[test]
fn a_sandbox_changes_only_its_own_view_until_discarded() {
    each_kind(|m| {
        let union = !m.lowers.is_empty();
        let before = names(&m.mnt);
        let out = in_sandbox(
            m,
            None,
            "echo new > MNT/new && rm MNT/top && mkdir -p MNT/d/sub && \
             echo more >> MNT/d/x 2>/dev/null; echo more >> MNT/top2 && cat MNT/new",
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("sandbox 1 over"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(ok(out, "first run", m), "new\n");
        // Outside, nothing changed: not the view, not the branches.
        assert_eq!(names(&m.mnt), before);
        assert_eq!(read_file(&m.p("top")), b"top\n");
        assert!(!m.p("new").exists() && !m.p("d/sub").exists());
        assert!(!m.src.join("new").exists());
        if union {
            assert_eq!(read_file(&m.p("d/x")), b"x\n");
        }
        // A change outside shows inside (the sandbox lies over the mount).
        write_file(&m.p("fresh"), b"fresh\n");
        // Back into it: its own changes are there.
        let out = in_sandbox(
            m,
            Some(1),
            "cat MNT/new MNT/fresh && test ! -e MNT/top && test -d MNT/d/sub && echo ok",
        );
        assert_eq!(ok(out, "second run", m), "new\nfresh\nok\n");
        // A directory inside the mount as the working directory leads
        // into the sandbox too.
        let out = Command::new(bin())
            .args([
                "sandbox",
                m.mnt.to_str().unwrap(),
                "--id",
                "1",
                "--",
                "cat",
                "new",
            ])
            .current_dir(&m.mnt)
            .output()
            .unwrap();
        assert_eq!(ok(out, "relative", m), "new\n");
        let rows = listed(m);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0]["id"], 1);
        // No other user reaches it where the daemon serves it.
        let served = Path::new(rows[0]["mountpoint"].as_str().unwrap()).to_path_buf();
        let c = cstr(&served);
        let reached = as_nobody(|| rc(sys::open(&c, libc::O_RDONLY | libc::O_DIRECTORY, 0)));
        assert_eq!(reached, libc::EACCES, "{}", served.display());
        if union {
            // What it lies over cannot change under it.
            let extra = m.root().join("extra");
            fs::create_dir(&extra).unwrap();
            let out = branch(m, &["add", extra.to_str().unwrap()]);
            assert!(!out.status.success());
            assert!(stderr(&out).contains("sandbox 1"), "{}", stderr(&out));
        }
        let mnt = m.mnt.to_str().unwrap().to_string();
        ok(
            chronofs_in(m.root(), &["sandbox", "discard", "1", "--mount", &mnt]),
            "discard",
            m,
        );
        assert!(listed(m).is_empty());
        let pid = m.pid().unwrap();
        assert_eq!(sandbox_mounts(pid), 0, "its session ended");
        let mut now = before.clone();
        now.push("fresh".to_string());
        now.sort();
        assert_eq!(names(&m.mnt), now);
        // A new one starts from the mount as it is.
        let out = in_sandbox(m, None, "cat MNT/top; test ! -e MNT/new && echo clean");
        assert_eq!(ok(out, "after discard", m), "top\nclean\n");
        assert_eq!(sandbox_mounts(pid), 1);
        m.unmount();
        assert_eq!(
            sandbox_mounts(pid),
            0,
            "the daemon's exit ends its sandboxes"
        );
        m.start();
        // Kept across the daemon's restart, and served again on demand.
        let rows = listed(m);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert!(rows[0]["mountpoint"].is_null(), "{rows:?}");
        let id = rows[0]["id"].as_u64().unwrap() as u32;
        let out = in_sandbox(m, Some(id), "echo again > MNT/again && cat MNT/again");
        assert_eq!(ok(out, "after restart", m), "again\n");
        assert!(!m.p("again").exists());
        ok(
            chronofs_in(
                m.root(),
                &[
                    "sandbox",
                    "discard",
                    &id.to_string(),
                    "--mount",
                    m.mnt.to_str().unwrap(),
                ],
            ),
            "discard",
            m,
        );
    });
}

/// A build: many files made, read and rewritten in nested directories,
/// invisible outside, gone after discard.
#[test]
fn a_make_like_workload_in_a_sandbox_is_invisible_outside() {
    let m = Mount::union("plain", 1, |b| {
        fs::create_dir(b[1].join("srcs")).unwrap();
        for i in 0..50 {
            write_file(
                &b[1].join(format!("srcs/m{i}.c")),
                format!("int m{i};\n").as_bytes(),
            );
        }
    });
    let script = "cd MNT && mkdir -p build/obj && for f in srcs/*.c; do \
                  o=build/obj/$(basename $f .c).o; cat $f > $o.tmp && mv $o.tmp $o; done && \
                  cat build/obj/*.o > build/prog && rm -r build/obj && wc -l < build/prog";
    let out = in_sandbox(&m, None, script);
    assert_eq!(ok(out, "build", &m).trim(), "50");
    assert!(!m.p("build").exists());
    assert_eq!(names(&m.p("srcs")).len(), 50);
    let store = m.src.join(".chronofs/sandboxes/1/branch");
    assert!(
        store.join("build/prog").exists(),
        "its changes are in its branch"
    );
    let mnt = m.mnt.to_str().unwrap();
    ok(
        chronofs_in(m.root(), &["sandbox", "discard", "1", "--mount", mnt]),
        "discard",
        &m,
    );
    assert!(!m.src.join(".chronofs/sandboxes/1").exists());
    // Built again, and committed: the mount shows it all at once.
    let out = in_sandbox(&m, None, script);
    assert_eq!(ok(out, "build again", &m).trim(), "50");
    assert!(!m.p("build").exists());
    let out = chronofs_in(m.root(), &["sandbox", "commit", "1", "--mount", mnt]);
    let said = ok(out, "commit", &m);
    assert!(said.starts_with("sandbox 1 committed to "), "{said}");
    assert_eq!(sh(&m.mnt, "wc -l < build/prog").trim(), "50");
    assert_eq!(names(&m.p("build")), ["prog"]);
    assert_eq!(names(&m.p("srcs")).len(), 50);
    assert!(!m.src.join(".chronofs/sandboxes/1").exists());
}

#[test]
fn sandbox_refuses_bad_input_in_one_line() {
    let m = Mount::new("plain");
    let mnt = m.mnt.to_str().unwrap();
    let not_mounted = m.root().join("native");
    // The exit status: 2 for a command line missing a part, env(1)'s 127
    // and 126 for a command not found or not executable, 1 otherwise.
    let not_exe = m.root().join("not-exe");
    std::fs::write(&not_exe, b"#!/bin/sh\n").unwrap();
    for (args, want, code) in [
        (
            vec!["sandbox", not_mounted.to_str().unwrap(), "--", "true"],
            "not the mount point of a chronofs mount",
            1,
        ),
        (
            vec!["sandbox", mnt, "--id", "9", "--", "true"],
            "no sandbox 9",
            1,
        ),
        (vec!["sandbox", mnt], "give the command", 2),
        (vec!["sandbox"], "give the mount point", 2),
        (
            vec!["sandbox", "discard", "42", "--mount", mnt],
            "no sandbox 42 on this mount",
            1,
        ),
        (
            vec!["sandbox", mnt, "--", "/no/such/program"],
            "cannot run /no/such/program: no such program",
            127,
        ),
        (
            vec!["sandbox", mnt, "--", "no-such-program-on-path"],
            "no such program",
            127,
        ),
        (
            vec!["sandbox", mnt, "--", not_exe.to_str().unwrap()],
            "not executable",
            126,
        ),
    ] {
        let out = chronofs_in(m.root(), &args);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    // MNT = SRC: the daemon cannot reach its store by path.
    let same = Mount::new("plain,samedir");
    let out = chronofs_in(
        Path::new("/"),
        &["sandbox", same.mnt.to_str().unwrap(), "--", "true"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("outside the mount point"),
        "{}",
        stderr(&out)
    );
    assert_eq!(sandbox_mounts(m.pid().unwrap()), 0);
    assert_eq!(sandbox_mounts(same.pid().unwrap()), 0);
}

/// `chronofs` as user `uid` (group the same number), from `/`.
fn as_user(uid: u32, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir("/")
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap()
}

/// An ordinary user's sandbox: `chronofs sandbox` makes a user and mount
/// namespace of its own, into which the daemon binds the sandbox (its
/// session lies where only root reaches). Only that user and root may
/// enter, commit or discard it, and nobody else sees it before the commit.
#[test]
fn an_ordinary_user_s_sandbox_is_theirs_alone() {
    each_kind(|m| {
        fs::create_dir(m.p("pub")).unwrap();
        fs::set_permissions(
            m.p("pub"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let mnt = m.mnt.to_str().unwrap().to_string();
        let script = format!("echo mine > {mnt}/pub/f && cat {mnt}/pub/f && id -u");
        let out = as_user(NOBODY, &["sandbox", &mnt, "--", "sh", "-c", &script]);
        assert_eq!(ok(out, "sandbox as nobody", m), "mine\n65534\n");
        assert!(!m.p("pub/f").exists(), "seen outside before the commit");
        let row = listed(m).pop().unwrap();
        assert_eq!(row["owner"], NOBODY, "{row}");
        let text = as_user(NOBODY, &["sandbox", "list", &mnt]);
        let text = String::from_utf8_lossy(&text.stdout).into_owned();
        assert!(text.contains("served  uid 65534  changes in"), "{text}");
        let id = row["id"].to_string();
        for args in [
            vec!["sandbox", &mnt, "--id", &id, "--", "true"],
            vec!["sandbox", "discard", &id, "--mount", &mnt],
            vec!["sandbox", "commit", &id, "--mount", &mnt],
        ] {
            let out = as_user(OTHER_USER, &args);
            assert!(!out.status.success(), "{args:?}");
            let err = stderr(&out);
            assert!(err.contains("only its owner or root"), "{args:?}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
        }
        // Its session is out of other users' reach.
        let session = row["mountpoint"].as_str().unwrap();
        let out = Command::new("ls")
            .arg(session)
            .uid(OTHER_USER)
            .gid(OTHER_USER)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{session} listed by another user");
        // Entered again by its owner, then committed by them.
        let out = as_user(
            NOBODY,
            &[
                "sandbox",
                &mnt,
                "--id",
                &id,
                "--",
                "cat",
                &format!("{mnt}/pub/f"),
            ],
        );
        assert_eq!(ok(out, "enter again", m), "mine\n");
        ok(
            as_user(NOBODY, &["sandbox", "commit", &id, "--mount", &mnt]),
            "commit",
            m,
        );
        assert_eq!(fs::read(m.p("pub/f")).unwrap(), b"mine\n");
        let owner = std::os::unix::fs::MetadataExt::uid(&fs::metadata(m.p("pub/f")).unwrap());
        assert_eq!(owner, NOBODY);
        // The daemon binds a sandbox only into a namespace the caller made
        // for itself, never into its own (where every process would see it).
        let out = as_user(NOBODY, &["sandbox", &mnt, "--", "true"]);
        ok(out, "a second sandbox", m);
        let id = listed(m).pop().unwrap()["id"].as_u64().unwrap() as u32;
        let socket = chronofs::control::mount_of(&m.mnt.canonicalize().unwrap())
            .and_then(|e| chronofs::control::socket_of(&e, 0))
            .unwrap();
        let err = chronofs::control::Client::Daemon(&socket)
            .sandbox_enter(id)
            .unwrap_err()
            .to_string();
        assert!(err.contains("namespace of your own"), "{err}");
        assert!(!m.p("pub/f").exists() || fs::read(m.p("pub/f")).unwrap() == b"mine\n");
        ok(
            as_user(
                NOBODY,
                &["sandbox", "discard", &id.to_string(), "--mount", &mnt],
            ),
            "discard",
            m,
        );
        fs::remove_file(m.p("pub/f")).unwrap();
        fs::remove_dir(m.p("pub")).unwrap();
    });
}

/// An ordinary user's commit applies only what they may still do on the
/// mount: a directory whose permissions the mount took from them since
/// refuses it (nothing applied, one line), and they may not force a
/// commit over others' changes; root may.
#[test]
fn an_ordinary_user_s_commit_is_held_to_the_permissions_of_now() {
    each_kind(|m| {
        fs::create_dir_all(m.p("up/pub")).unwrap();
        let mode = |m: &Mount, dir: &str, bits: u32| {
            fs::set_permissions(m.p(dir), std::os::unix::fs::PermissionsExt::from_mode(bits))
                .unwrap()
        };
        mode(m, "up", 0o755);
        mode(m, "up/pub", 0o777);
        let mnt = m.mnt.to_str().unwrap().to_string();
        let script = format!("echo mine > {mnt}/up/pub/f");
        ok(
            as_user(NOBODY, &["sandbox", &mnt, "--", "sh", "-c", &script]),
            "sandbox",
            m,
        );
        let id = listed(m).pop().unwrap()["id"].to_string();
        // The directory itself no longer writable, or one above it no
        // longer searchable: either way the owner could not make the file
        // on the mount now.
        for (dir, bits, back) in [("up/pub", 0o755, 0o777), ("up", 0o700, 0o755)] {
            mode(m, dir, bits);
            for (args, want) in [
                (
                    vec!["sandbox", "commit", &id, "--mount", &mnt],
                    "may no longer change /up/pub/f",
                ),
                (
                    vec!["sandbox", "commit", &id, "--mount", &mnt, "--force"],
                    "only root may force",
                ),
            ] {
                let out = as_user(NOBODY, &args);
                assert!(!out.status.success(), "{dir} {bits:o}: {args:?}");
                let err = stderr(&out);
                assert!(err.contains(want), "{dir} {bits:o}: {args:?}: {err}");
                assert_eq!(err.trim().lines().count(), 1, "{err}");
                assert!(!m.p("up/pub/f").exists(), "{args:?}: applied");
            }
            mode(m, dir, back);
        }
        ok(
            as_user(NOBODY, &["sandbox", "commit", &id, "--mount", &mnt]),
            "commit",
            m,
        );
        assert_eq!(fs::read(m.p("up/pub/f")).unwrap(), b"mine\n");
        fs::remove_file(m.p("up/pub/f")).unwrap();
        fs::remove_dir(m.p("up/pub")).unwrap();
        fs::remove_dir(m.p("up")).unwrap();
    });
}

/// Each sandbox is a FUSE session of the daemon: an ordinary user may
/// keep 16 on a mount; root is not limited.
#[test]
fn an_ordinary_user_keeps_a_bounded_number_of_sandboxes() {
    let m = Mount::new("plain");
    let mnt = m.mnt.to_str().unwrap();
    for _ in 0..16 {
        ok(
            as_user(NOBODY, &["sandbox", mnt, "--", "true"]),
            "sandbox",
            &m,
        );
    }
    let out = as_user(NOBODY, &["sandbox", mnt, "--", "true"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("has 16 sandboxes"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    ok(in_sandbox(&m, None, "true"), "root's", &m);
    ok(
        as_user(OTHER_USER, &["sandbox", mnt, "--", "true"]),
        "another user's",
        &m,
    );
    assert_eq!(listed(&m).len(), 18);
}

/// A sandbox's session has no history, so it would show a clone's files
/// and directories as their bare backing objects (empty), and a commit
/// would write that back: neither is allowed to meet the other yet.
#[test]
fn sandboxes_and_clones_refuse_each_other_in_one_line() {
    let m = Mount::new("");
    let mnt = m.mnt.to_str().unwrap();
    fs::create_dir(m.p("d")).unwrap();
    write_file(&m.p("d/x"), &pattern(100_000, 3));
    // A sandbox first: no clone while it lies over the mount.
    ok(in_sandbox(&m, None, "true"), "sandbox", &m);
    let out = chronofs_in(
        m.root(),
        &[
            "clone",
            m.p("d").to_str().unwrap(),
            m.p("c").to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("sandbox 1 lies over this mount"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!m.p("c").exists(), "nothing half-made");
    ok(
        chronofs_in(m.root(), &["sandbox", "discard", "1", "--mount", mnt]),
        "discard",
        &m,
    );
    // Then a clone: no sandbox over the mount that holds it.
    ok(
        chronofs_in(
            m.root(),
            &[
                "clone",
                m.p("d").to_str().unwrap(),
                m.p("c").to_str().unwrap(),
            ],
        ),
        "clone",
        &m,
    );
    let out = in_sandbox(&m, None, "true");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("holds clones"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(listed(&m).is_empty(), "no sandbox was made");
    assert_eq!(sandbox_mounts(m.pid().unwrap()), 0);
    assert_eq!(read_file(&m.p("c/x")), pattern(100_000, 3));
}

/// A format-1 `sandbox.json` written by hand (docs/FORMAT.md) keeps
/// opening; a newer format or a corrupt one is refused in one line.
#[test]
fn a_sandbox_manifest_of_format_1_opens_and_others_are_refused() {
    let m = Mount::new_with("plain", |src| write_file(&src.join("f"), b"f\n"));
    let src = m.src.canonicalize().unwrap();
    let dir = m.src.join(".chronofs/sandboxes");
    let make = |id: u32, manifest: &str| {
        let d = dir.join(id.to_string());
        fs::create_dir_all(d.join("branch")).unwrap();
        fs::write(d.join("sandbox.json"), manifest).unwrap();
        d
    };
    let base = serde_json::to_string(&[src.to_str().unwrap()]).unwrap();
    let d = make(
        7,
        &format!(r#"{{"format": 1, "id": 7, "created_ns": 1700000000000000000, "base": {base}}}"#),
    );
    write_file(&d.join("branch/from-fixture"), b"kept\n");
    let out = in_sandbox(&m, Some(7), "cat MNT/from-fixture MNT/f");
    assert_eq!(ok(out, "fixture", &m), "kept\nf\n");
    assert!(!m.p("from-fixture").exists());
    make(
        8,
        &format!(r#"{{"format": 2, "id": 8, "created_ns": 1, "base": {base}}}"#),
    );
    make(9, "{not json");
    for (id, want) in [(8, "is newer than this chronofs"), (9, "unreadable")] {
        let out = in_sandbox(&m, Some(id), "true");
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(err.contains(want), "{id}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // An unreadable one is not listed, and can be thrown away.
    let mnt_arg = m.mnt.to_str().unwrap();
    ok(
        chronofs_in(m.root(), &["sandbox", "discard", "9", "--mount", mnt_arg]),
        "discard a corrupt one",
        &m,
    );
    assert!(!dir.join("9").exists());
    // Every mount's sandboxes, without naming one.
    let out = ok(
        chronofs_in(m.root(), &["sandbox", "list", "--json"]),
        "list all",
        &m,
    );
    let mnt = m.mnt.canonicalize().unwrap();
    assert!(
        serde_json::from_str::<Vec<serde_json::Value>>(&out)
            .unwrap()
            .iter()
            .any(|r| r["id"] == 7 && r["mount"] == mnt.to_str().unwrap()),
        "{out}"
    );
    // Found by its number alone (no other mount has a sandbox 7).
    let out = ok(
        chronofs_in(m.root(), &["sandbox", "discard", "7", "--json"]),
        "discard by number",
        &m,
    );
    let row: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (row["id"].as_u64(), row["mount"].as_str()),
        (Some(7), mnt.to_str())
    );
    assert!(!dir.join("7").exists());
}

/// A daemon killed with its sandbox served leaves that mount dead; the
/// next daemon clears it.
#[test]
fn a_killed_daemons_dead_sandbox_mount_is_cleared_by_the_next_one() {
    let mut m = Mount::new("plain");
    let out = in_sandbox(&m, None, "echo x > MNT/x");
    ok(out, "sandbox", &m);
    let pid = m.pid().unwrap();
    assert_eq!(sandbox_mounts(pid), 1);
    m.kill9();
    m.start();
    assert_eq!(sandbox_mounts(pid), 0, "the dead session is unmounted");
    assert!(!Path::new(&format!("/run/chronofs/sandboxes/{pid}")).exists());
    let out = in_sandbox(&m, Some(1), "cat MNT/x");
    assert_eq!(ok(out, "served again", &m), "x\n");
}

/// A clean unmount takes the daemon's directory of sandbox mounts with
/// it (an empty `/run/chronofs/sandboxes/PID` stayed behind).
#[test]
fn a_clean_unmount_leaves_no_sandbox_run_directory() {
    let mut m = Mount::new("plain");
    let out = in_sandbox(&m, None, "echo x > MNT/x");
    ok(out, "sandbox", &m);
    let pid = m.pid().unwrap();
    let run = format!("/run/chronofs/sandboxes/{pid}");
    assert!(Path::new(&run).exists(), "{run} while served");
    m.unmount();
    assert!(!Path::new(&run).exists(), "{run} left after the unmount");
}

/// A running sandbox sees what the mount changes in the branches it lies
/// over within its session's short timeouts for them (a second), not the
/// mount's (a day): a file removed outside stayed readable inside, one
/// made outside stayed absent, and a rewritten file kept its old size.
#[test]
fn a_running_sandbox_sees_changes_made_outside_within_seconds() {
    each_kind(|m| {
        let work = tempdir();
        let turns = Turns::new(work.path());
        write_file(&m.p("gone"), b"gone\n");
        let script = format!(
            "cat MNT/top MNT/gone >/dev/null; stat -c %s MNT/top >/dev/null; \
             ls MNT/d >/dev/null; test -e MNT/later; echo ready > {r}; read x < {g}; \
             i=0; while [ $i -lt 100 ]; do \
               if [ \"$(stat -c %s MNT/top)\" = 9 ] && [ ! -e MNT/gone ] && \
                  [ -e MNT/later ] && ls MNT/d | grep -qx y; then echo seen; exit 0; fi; \
               sleep 0.1; i=$((i+1)); done; \
             echo stale: $(stat -c %s MNT/top) $(ls MNT) / $(ls MNT/d)",
            r = turns.ready.display(),
            g = turns.go.display()
        );
        let mnt = m.mnt.to_str().unwrap().to_string();
        let child = spawn_as(
            0,
            bin(),
            &[
                "sandbox",
                &mnt,
                "--",
                "sh",
                "-c",
                &script.replace("MNT", &mnt),
            ],
        );
        assert_eq!(turns.said(), "ready\n");
        write_file(&m.p("top"), b"new top\n\n");
        fs::remove_file(m.p("gone")).unwrap();
        write_file(&m.p("later"), b"later\n");
        fs::create_dir_all(m.p("d")).unwrap();
        write_file(&m.p("d/y"), b"y\n");
        turns.go();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "seen\n",
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            m.log_tail()
        );
        ok(
            chronofs_in(m.root(), &["sandbox", "discard", "1", "--mount", &mnt]),
            "discard",
            m,
        );
    });
}

/// `chronofs sandbox commit ID --mount MNT --json [--force]`.
fn commit(m: &Mount, id: u32, force: bool) -> Output {
    let id = id.to_string();
    let mut args = vec![
        "sandbox",
        "commit",
        &id,
        "--mount",
        m.mnt.to_str().unwrap(),
        "--json",
    ];
    if force {
        args.push("--force");
    }
    chronofs_in(m.root(), &args)
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// One number of each version `chronofs log PATH --json` lists.
fn versions(m: &Mount, rel: &str, field: &str) -> Vec<u64> {
    let out = ok(
        chronofs_in(&m.mnt, &["log", rel, "--json"]),
        &format!("log {rel}"),
        m,
    );
    json(&out)["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v[field].as_u64().unwrap())
        .collect()
}

fn version_times(m: &Mount, rel: &str) -> Vec<u64> {
    versions(m, rel, "time_ns")
}

/// What a sandbox changed shows on the mount at once after its commit;
/// history records the commit as one instant (a view of the past shows
/// the tree before it or after it); the sandbox is gone.
#[test]
fn a_commit_applies_the_sandbox_to_the_mount_in_one_instant() {
    each_kind(|m| {
        let union = !m.lowers.is_empty();
        let history = !m.mode.contains("plain");
        let out = in_sandbox(
            m,
            None,
            "echo new > MNT/new && rm MNT/top && mkdir -p MNT/d/sub && \
             echo z > MNT/d/sub/z && echo more >> MNT/d/x",
        );
        ok(out, "sandbox", m);
        assert!(!m.p("new").exists() && m.p("top").exists());
        if history {
            ok(chronofs_in(&m.mnt, &["tag", "before"]), "tag", m);
        }
        let pid = m.pid().unwrap();
        let reply = json(&ok(commit(m, 1, false), "commit", m));
        assert_eq!(reply["applied"], true, "{reply}");
        assert_eq!(reply["conflicts"].as_array().unwrap().len(), 0, "{reply}");
        // new, top's removal, d (the mount's branch has none: it moves whole).
        assert_eq!(reply["changes"], 3, "{reply}");
        assert_eq!(read_file(&m.p("new")), b"new\n");
        assert!(!m.p("top").exists());
        assert_eq!(read_file(&m.p("d/sub/z")), b"z\n");
        let x: &[u8] = if union { b"x\nmore\n" } else { b"more\n" };
        assert_eq!(read_file(&m.p("d/x")), x);
        if union {
            assert_eq!(read_file(&m.p("old")), b"old\n", "the branch below shows");
        }
        assert!(listed(m).is_empty());
        assert_eq!(sandbox_mounts(pid), 0, "its session ended");
        assert!(!m.src.join(".chronofs/sandboxes/1").exists());
        if history {
            ok(chronofs_in(&m.mnt, &["tag", "after"]), "tag", m);
            assert_eq!(read_file(&m.p(".history/@before/top")), b"top\n");
            assert!(!m.p(".history/@before/new").exists());
            assert_eq!(read_file(&m.p(".history/@after/new")), b"new\n");
            assert!(!m.p(".history/@after/top").exists());
            // The root's new entries and the new file: one time.
            let root = *version_times(m, ".").last().unwrap();
            assert_eq!(version_times(m, "new"), [root]);
        }
        // It survives a remount: the mount's own branch holds it.
        m.unmount();
        m.start();
        assert_eq!(read_file(&m.p("d/sub/z")), b"z\n");
        assert!(!m.p("top").exists());
    });
}

/// A commit whose paths the mount changed too since the sandbox was made
/// is refused with the paths listed and nothing applied; the sandbox stays
/// usable; `--force` applies it, the sandbox's side winning.
#[test]
fn a_commit_over_changes_made_since_is_refused_unless_forced() {
    each_kind(|m| {
        let out = in_sandbox(m, None, "echo mine > MNT/top && echo n > MNT/n");
        ok(out, "sandbox", m);
        write_file(&m.p("top"), b"theirs\n");
        let out = commit(m, 1, false);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(err.contains("sandbox 1 not committed"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        let reply = json(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(reply["applied"], false);
        assert_eq!(reply["conflicts"], serde_json::json!(["/top"]));
        assert_eq!(read_file(&m.p("top")), b"theirs\n");
        assert!(!m.p("n").exists(), "nothing applied");
        // Still there, still served, still its own.
        assert_eq!(listed(m).len(), 1);
        let out = in_sandbox(m, Some(1), "cat MNT/top MNT/n");
        assert_eq!(ok(out, "again", m), "mine\nn\n");
        let reply = json(&ok(commit(m, 1, true), "commit --force", m));
        assert_eq!(reply["applied"], true);
        assert_eq!(read_file(&m.p("top")), b"mine\n");
        assert_eq!(read_file(&m.p("n")), b"n\n");
        assert!(listed(m).is_empty());
        if !m.mode.contains("plain") {
            // What the mount's users wrote is in history, not lost.
            let sizes = versions(m, "top", "size");
            assert!(sizes.contains(&7), "{sizes:?}");
        }
    });
}

/// A change the mount makes in a read-write branch below its top one
/// (in place: nothing is copied up) conflicts as one in the top branch
/// does: committed, the sandbox's copy would hide it. Before, only the top
/// branch was weighed and the mount's edit was hidden without a word
/// (found by a bug hunt).
#[test]
fn a_change_in_a_lower_read_write_branch_conflicts() {
    let m = Mount::union("plain", 1, |b| {
        write_file(&b[1].join("shared"), b"orig\n");
        fs::create_dir(b[1].join("dd")).unwrap();
        write_file(&b[1].join("dd/o"), b"o\n");
        write_file(&b[1].join("kept"), b"k\n");
    });
    branch_ok(&m, &["mode", "1", "rw"]);
    let out = in_sandbox(
        &m,
        None,
        "echo mine > MNT/shared && echo mine > MNT/dd/o && echo mine > MNT/kept",
    );
    ok(out, "sandbox", &m);
    append_all(&m.p("shared"), b"theirs\n");
    write_file(&m.p("dd/o"), b"theirs\n");
    assert!(!m.src.join("shared").exists(), "changed in place below");
    let out = commit(&m, 1, false);
    assert!(!out.status.success(), "{}", stderr(&out));
    let reply = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(reply["applied"], false);
    let mut conflicts: Vec<_> = reply["conflicts"].as_array().unwrap().to_vec();
    conflicts.sort_by_key(|c| c.to_string());
    assert_eq!(conflicts, ["/dd/o", "/shared"]);
    assert_eq!(read_file(&m.p("shared")), b"orig\ntheirs\n");
    assert_eq!(read_file(&m.p("kept")), b"k\n");
    let reply = json(&ok(commit(&m, 1, true), "commit --force", &m));
    assert_eq!(reply["applied"], true);
    assert_eq!(read_file(&m.p("shared")), b"mine\n");
    assert_eq!(read_file(&m.p("kept")), b"mine\n");
}

/// A commit a crash interrupted (its journal written, part of it applied)
/// is finished by the next daemon before the mount serves anything.
#[test]
fn an_interrupted_commit_is_finished_at_the_next_mount() {
    let mut m = Mount::union("plain", 1, lower);
    let out = in_sandbox(&m, None, "echo a > MNT/a && echo b > MNT/b && rm MNT/old");
    ok(out, "sandbox", &m);
    m.unmount();
    // As a crash leaves it: the journal (docs/FORMAT.md), one change moved.
    let dir = m.src.join(".chronofs/sandboxes/1");
    fs::write(
        dir.join("commit.json"),
        r#"{"format": 1, "started_ns": 1700000000000000000}"#,
    )
    .unwrap();
    fs::rename(dir.join("branch/a"), m.src.join("a")).unwrap();
    m.start();
    assert_eq!(read_file(&m.p("a")), b"a\n");
    assert_eq!(read_file(&m.p("b")), b"b\n");
    assert!(!m.p("old").exists());
    assert!(!dir.exists(), "the sandbox is gone");
    assert!(listed(&m).is_empty());
}

#[test]
fn a_commit_refuses_bad_input_in_one_line() {
    let m = Mount::union("plain", 1, lower);
    let mnt = m.mnt.to_str().unwrap();
    let out = chronofs_in(m.root(), &["sandbox", "commit", "9", "--mount", mnt]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no sandbox 9"), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim().lines().count(), 1);
    let out = chronofs_in(m.root(), &["sandbox", "commit", "9"]);
    assert!(
        stderr(&out).contains("no sandbox 9 on any"),
        "{}",
        stderr(&out)
    );
    ok(in_sandbox(&m, None, "echo a > MNT/a"), "sandbox", &m);
    let out = Command::new(bin())
        .args(["sandbox", "commit", "1", "--mount", mnt])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("belongs to uid 0: only its owner or root"),
        "{}",
        stderr(&out)
    );
    // A top branch made read-only takes no commit.
    branch_ok(&m, &["mode", "0", "ro"]);
    let out = commit(&m, 1, false);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("top branch is read-only"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).trim().lines().count(), 1);
    assert!(!m.p("a").exists());
    branch_ok(&m, &["mode", "0", "rw"]);
    ok(commit(&m, 1, false), "commit", &m);
    assert_eq!(read_file(&m.p("a")), b"a\n");
}

/// Processes using the mount while a commit runs see it before the commit
/// or after it, never between: once one of the sandbox's files shows,
/// all do, and what it removed is gone.
#[test]
fn readers_see_a_commit_whole_or_not_at_all() {
    for opts in ["plain", ""] {
        let m = Mount::new_with(opts, |src| {
            fs::create_dir(src.join("batch")).unwrap();
            write_file(&src.join("marker"), b"m\n");
        });
        let n = 300;
        let script = format!(
            "cd MNT && i=0; while [ $i -lt {n} ]; do echo $i > batch/f$i; i=$((i+1)); done; \
             rm marker"
        );
        ok(in_sandbox(&m, None, &script), "sandbox", &m);
        let done = std::sync::atomic::AtomicBool::new(false);
        let (seen_new, checks) = std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut seen_new = false;
                let mut checks = 0u64;
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::Acquire);
                    // Listings are read from the branch, not the kernel's
                    // name cache: a half-applied commit would show here.
                    let listed = fs::read_dir(m.p("batch")).unwrap().count();
                    let marker = m.p("marker").exists();
                    match (listed, seen_new) {
                        (0, false) => {}
                        (l, _) if l == n => {
                            seen_new = true;
                            assert!(!marker, "all {n} files show with the marker");
                        }
                        (l, _) => panic!("{l} of {n} files listed (seen all before: {seen_new})"),
                    }
                    checks += 1;
                    if finished {
                        return (seen_new, checks);
                    }
                }
            });
            let out = commit(&m, 1, false);
            done.store(true, std::sync::atomic::Ordering::Release);
            ok(out, "commit", &m);
            reader.join().unwrap()
        });
        assert!(seen_new, "the reader saw the commit ({checks} checks)");
        assert_eq!(names(&m.p("batch")).len(), n);
    }
}

/// A directory renamed in a sandbox (an overlay redirect) commits with
/// everything it held, from every branch, under its new name.
#[test]
fn a_directory_renamed_in_a_sandbox_commits_with_its_contents() {
    let tree = |b: &[std::path::PathBuf]| {
        fs::create_dir_all(b[0].join("a/sub")).unwrap();
        write_file(&b[0].join("a/f"), b"f\n");
        write_file(&b[0].join("a/sub/g"), b"g\n");
        if let Some(l) = b.get(1) {
            fs::create_dir_all(l.join("a/sub")).unwrap();
            write_file(&l.join("a/low"), b"low\n");
            write_file(&l.join("a/sub/h"), b"h\n");
        }
    };
    for lowers in [0, 1] {
        for mode in ["plain", ""] {
            let mut m = match lowers {
                0 => Mount::new_with(mode, |src| tree(&[src.to_path_buf()])),
                n => Mount::union(mode, n, tree),
            };
            let out = in_sandbox(
                &m,
                None,
                "mv MNT/a MNT/b && echo new > MNT/b/new && mkdir MNT/c && mv MNT/b/sub MNT/c/s",
            );
            ok(out, "rename directories", &m);
            ok(commit(&m, 1, false), "commit", &m);
            let check = |m: &Mount| {
                assert!(!m.p("a").exists(), "{lowers} {mode}");
                let mut want_b = vec!["f", "new"];
                let mut want_s = vec!["g"];
                if lowers > 0 {
                    want_b.insert(1, "low");
                    want_s.push("h");
                }
                assert_eq!(names(&m.p("b")), want_b, "{lowers} {mode}");
                assert_eq!(names(&m.p("c/s")), want_s, "{lowers} {mode}");
                assert_eq!(read_file(&m.p("b/f")), b"f\n");
                assert_eq!(read_file(&m.p("c/s/g")), b"g\n");
                assert_eq!(read_file(&m.p("b/new")), b"new\n");
                if lowers > 0 {
                    assert_eq!(read_file(&m.p("c/s/h")), b"h\n");
                }
            };
            check(&m);
            assert!(listed(&m).is_empty());
            m.unmount();
            m.start();
            check(&m);
        }
    }
}

/// What a renamed directory holds is checked against the directory it was
/// renamed from: a file changed on both sides conflicts under its new name.
#[test]
fn a_conflict_inside_a_renamed_directory_is_found() {
    let m = Mount::new_with("plain", |src| {
        fs::create_dir(src.join("a")).unwrap();
        write_file(&src.join("a/f"), b"f\n");
        write_file(&src.join("a/g"), b"g\n");
    });
    let out = in_sandbox(&m, None, "echo mine > MNT/a/f && mv MNT/a MNT/b");
    ok(out, "sandbox", &m);
    write_file(&m.p("a/f"), b"theirs\n");
    write_file(&m.p("a/g"), b"g2\n");
    let out = commit(&m, 1, false);
    assert!(!out.status.success());
    let reply = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(reply["conflicts"], serde_json::json!(["/b/f"]), "{reply}");
    assert_eq!(read_file(&m.p("a/f")), b"theirs\n");
    ok(commit(&m, 1, true), "commit --force", &m);
    assert!(!m.p("a").exists());
    assert_eq!(read_file(&m.p("b/f")), b"mine\n");
    // What only the mount changed comes along.
    assert_eq!(read_file(&m.p("b/g")), b"g2\n");
}

/// The mount removed what the sandbox renamed: committing would bring back
/// only the sandbox's part of it, so the renamed directory conflicts, in a
/// single directory and where the removed directory lay in a lower branch
/// (its whiteout says so).
#[test]
fn a_renamed_directory_whose_origin_the_mount_removed_conflicts() {
    for lowers in [0, 1] {
        let tree = |b: &[std::path::PathBuf]| {
            let at = b.last().unwrap();
            fs::create_dir(at.join("a")).unwrap();
            write_file(&at.join("a/f"), b"f\n");
        };
        let m = match lowers {
            0 => Mount::new_with("plain", |src| tree(&[src.to_path_buf()])),
            n => Mount::union("plain", n, tree),
        };
        let out = in_sandbox(&m, None, "mv MNT/a MNT/b && echo new > MNT/b/new");
        ok(out, "sandbox", &m);
        fs::remove_dir_all(m.p("a")).unwrap();
        let out = commit(&m, 1, false);
        assert!(!out.status.success(), "{lowers}");
        let reply = json(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(
            reply["conflicts"],
            serde_json::json!(["/b"]),
            "{lowers}: {reply}"
        );
        assert!(!m.p("b").exists());
        ok(commit(&m, 1, true), "commit --force", &m);
        // Forced: what the mount's own branch held stays removed; what a
        // lower branch holds shows again through the rename, as in the
        // sandbox.
        let want: &[&str] = if lowers == 0 { &["new"] } else { &["f", "new"] };
        assert_eq!(names(&m.p("b")), want, "{lowers}");
        assert!(!m.p("a").exists());
    }
}

/// A process of the sandbox still holding a file open for writing (its
/// descriptor outlives the session) stops the commit, nothing applied.
#[test]
fn a_commit_waits_for_the_sandboxs_writers() {
    use std::io::BufRead;
    let m = Mount::new("plain");
    let mnt = m.mnt.to_str().unwrap();
    let mut child = Command::new(bin())
        .args(["sandbox", mnt, "--", "sh", "-c"])
        .arg(format!("exec 3>{mnt}/held; echo ready; read never"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let out = commit(&m, 1, false);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/held is still open for writing"),
        "{}",
        stderr(&out)
    );
    assert!(!m.p("held").exists());
    drop(child.stdin.take());
    child.kill().ok();
    child.wait().unwrap();
    ok(commit(&m, 1, false), "commit after the writer ended", &m);
    assert!(m.p("held").exists());
}

/// A directory the sandbox removes goes whole: a change deep inside it on
/// the mount is a conflict, and with history every file it held stays
/// readable in the past.
#[test]
fn a_removed_directory_is_weighed_and_kept_in_history_whole() {
    for mode in ["plain", ""] {
        let m = Mount::new_with(mode, |src| {
            fs::create_dir_all(src.join("d/sub")).unwrap();
            write_file(&src.join("d/sub/f"), b"f\n");
            fs::create_dir_all(src.join("e/sub")).unwrap();
            write_file(&src.join("e/sub/g"), b"g\n");
        });
        if !mode.contains("plain") {
            // Behind the mount's back, after its first walk: no version.
            m.wait_history_ready();
            write_file(&m.src.join("e/sub/late"), b"late\n");
        }
        ok(in_sandbox(&m, None, "rm -r MNT/d MNT/e"), "sandbox", &m);
        write_file(&m.p("d/sub/f"), b"theirs\n");
        let out = commit(&m, 1, false);
        assert!(!out.status.success(), "{mode}");
        let reply = json(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(
            reply["conflicts"],
            serde_json::json!(["/d"]),
            "{mode}: {reply}"
        );
        if !mode.contains("plain") {
            ok(chronofs_in(&m.mnt, &["tag", "before"]), "tag", &m);
        }
        ok(commit(&m, 1, true), "commit --force", &m);
        assert!(!m.p("d").exists() && !m.p("e").exists());
        if !mode.contains("plain") {
            assert_eq!(read_file(&m.p(".history/@before/e/sub/g")), b"g\n");
            // Recorded when the commit weighed it (history had not seen
            // it before), so later than the tag: its versions hold it.
            let sizes = versions(&m, "e/sub/late", "size");
            assert!(sizes.contains(&5), "{sizes:?}");
            assert_eq!(read_file(&m.p(".history/@before/d/sub/f")), b"theirs\n");
        }
    }
}

/// Hard-linked files of the branches below, changed, renamed and linked
/// in a sandbox (copied up through its hard-link index), commit as one
/// file each: every name shows the change under one number.
#[test]
fn hard_links_changed_in_a_sandbox_commit_as_one_file() {
    for mode in ["plain", ""] {
        let mut m = Mount::union(mode, 1, |b| {
            write_file(&b[1].join("a"), b"low\n");
            fs::hard_link(b[1].join("a"), b[1].join("b")).unwrap();
            fs::hard_link(b[1].join("a"), b[1].join("c")).unwrap();
            // Linked in the mount's read-write branch itself too.
            write_file(&b[0].join("k1"), b"k\n");
            fs::hard_link(b[0].join("k1"), b[0].join("k2")).unwrap();
        });
        // Never looked up through the mount before the commit (made
        // behind its back): no number the mount knew leads to the copy.
        write_file(&m.src.join("j1"), b"j\n");
        fs::hard_link(m.src.join("j1"), m.src.join("j2")).unwrap();
        let out = in_sandbox(
            &m,
            None,
            "echo s >> MNT/a && mv MNT/b MNT/b2 && ln MNT/c MNT/d && echo t >> MNT/k1 \
             && echo u >> MNT/j1",
        );
        ok(out, "sandbox", &m);
        assert_eq!(read_file(&m.p("c")), b"low\n", "mode {mode:?}: not yet");
        let reply = json(&ok(commit(&m, 1, false), "commit", &m));
        assert_eq!(reply["applied"], true, "{reply}");
        let check = |m: &Mount, when: &str| {
            for n in ["a", "b2", "c", "d"] {
                assert_eq!(read_file(&m.p(n)), b"low\ns\n", "mode {mode:?} {when}: {n}");
            }
            for n in ["k1", "k2"] {
                assert_eq!(read_file(&m.p(n)), b"k\nt\n", "mode {mode:?} {when}: {n}");
            }
            for n in ["j2", "j1"] {
                assert_eq!(read_file(&m.p(n)), b"j\nu\n", "mode {mode:?} {when}: {n}");
            }
            assert!(!m.p("b").exists());
            let s = shape(m, &["a", "b2", "c", "d"]);
            assert!(
                s.iter().all(|x| *x == (6, 4, s[0].2)),
                "mode {mode:?} {when}: {s:?}"
            );
            let k = shape(m, &["k1", "k2"]);
            assert!(
                k.iter().all(|x| *x == (4, 2, k[0].2)),
                "mode {mode:?} {when}: {k:?}"
            );
        };
        check(&m, "committed");
        // One copy still: a change through any name shows through all.
        append_all(&m.p("c"), b"c\n");
        assert_eq!(read_file(&m.p("b2")), b"low\ns\nc\n", "mode {mode:?}");
        fs::write(m.p("c"), b"low\ns\n").unwrap();
        m.remount();
        check(&m, "remounted");
    }
}

#[test]
fn a_hard_linked_file_changed_on_both_sides_conflicts_even_when_forced() {
    let m = Mount::union("plain", 1, |b| {
        write_file(&b[1].join("a"), b"low\n");
        fs::hard_link(b[1].join("a"), b[1].join("c")).unwrap();
    });
    ok(in_sandbox(&m, None, "echo s >> MNT/a"), "sandbox", &m);
    // The mount copies the same file up through its other name.
    append_all(&m.p("c"), b"m\n");
    let out = commit(&m, 1, false);
    assert!(!out.status.success());
    let reply = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(reply["conflicts"], serde_json::json!(["/a"]), "{reply}");
    let out = commit(&m, 1, true);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--force cannot apply"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    for n in ["a", "c"] {
        assert_eq!(read_file(&m.p(n)), b"low\nm\n", "{n}: nothing applied");
    }
    assert_eq!(listed(&m).len(), 1, "the sandbox stays");
}

/// Over a single directory (no hard-link index to send names through),
/// the commit makes every other name of a file the sandbox changed a name
/// of its copy.
#[test]
fn hard_links_changed_in_a_sandbox_over_a_single_directory_commit_as_one_file() {
    for mode in ["plain", ""] {
        let mut m = Mount::new_with(mode, |src| {
            write_file(&src.join("a"), b"a\n");
            fs::create_dir(src.join("sub")).unwrap();
            for n in ["b", "c", "sub/d"] {
                fs::hard_link(src.join("a"), src.join(n)).unwrap();
            }
        });
        ok(
            in_sandbox(&m, None, "echo s >> MNT/a && rm MNT/c"),
            "sandbox",
            &m,
        );
        assert_eq!(read_file(&m.p("b")), b"a\n", "mode {mode:?}: not yet");
        let reply = json(&ok(commit(&m, 1, false), "commit", &m));
        assert_eq!(reply["applied"], true, "{reply}");
        let check = |m: &Mount, when: &str| {
            for n in ["a", "b", "sub/d"] {
                assert_eq!(read_file(&m.p(n)), b"a\ns\n", "mode {mode:?} {when}: {n}");
            }
            assert!(!m.p("c").exists(), "mode {mode:?} {when}");
            let s = shape(m, &["a", "b", "sub/d"]);
            assert!(
                s.iter().all(|x| *x == (4, 3, s[0].2)),
                "mode {mode:?} {when}: {s:?}"
            );
            let names: Vec<String> = fs::read_dir(&m.src)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert!(names.iter().all(|n| !n.contains("copyup")), "{names:?}");
        };
        check(&m, "committed");
        if !mode.contains("plain") {
            // The other names' new content is in history too.
            let sizes = versions(&m, "sub/d", "size");
            assert!(sizes.contains(&4), "mode {mode:?}: {sizes:?}");
        }
        m.remount();
        check(&m, "remounted");
    }
}

/// A directory both sides hold keeps the mount's attributes unless the
/// sandbox set its own; both setting them conflicts.
#[test]
fn a_commit_keeps_directory_attributes_the_sandbox_did_not_set() {
    use std::os::unix::fs::PermissionsExt;
    each_kind(|m| {
        fs::create_dir(m.p("mine")).unwrap();
        fs::create_dir(m.p("theirs")).unwrap();
        fs::create_dir(m.p("both")).unwrap();
        let script = "echo n > MNT/theirs/new && chmod 700 MNT/mine && echo n > MNT/mine/new \
                      && chmod 711 MNT/both";
        ok(in_sandbox(m, None, script), "sandbox", m);
        let mode = |m: &Mount, d: &str| fs::metadata(m.p(d)).unwrap().permissions().mode() & 0o7777;
        fs::set_permissions(m.p("theirs"), fs::Permissions::from_mode(0o750)).unwrap();
        fs::set_permissions(m.p("both"), fs::Permissions::from_mode(0o705)).unwrap();
        let out = commit(m, 1, false);
        assert!(!out.status.success());
        let reply = json(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(reply["conflicts"], serde_json::json!(["/both"]), "{reply}");
        ok(commit(m, 1, true), "commit --force", m);
        assert_eq!(mode(m, "theirs"), 0o750, "the mount's chmod stays");
        assert_eq!(mode(m, "mine"), 0o700, "the sandbox's chmod applies");
        assert_eq!(mode(m, "both"), 0o711, "forced: the sandbox's");
        assert_eq!(read_file(&m.p("theirs/new")), b"n\n");
        assert_eq!(read_file(&m.p("mine/new")), b"n\n");
    });
}

/// What a process in MNT sees: every path below it, then each file's
/// bytes.
const TREE: &str = "cd MNT && find . -name .history -prune -o -print | sort && \
                    for f in $(find . -name .history -prune -o -type f -print | sort); do \
                    echo \"$f: $(cat $f)\"; done";

fn mount_tree(m: &Mount) -> String {
    sh(&m.mnt, &TREE.replace("MNT", "."))
}

/// `chronofs fsck SRC=rw:LOWER=ro...` of the mount's branches.
fn fsck_branches(m: &Mount) -> Output {
    let mut spec = format!("{}=rw", m.src.display());
    for l in &m.lowers {
        spec.push_str(&format!(":{}=ro", l.display()));
    }
    chronofs_in(m.root(), &["fsck", &spec])
}

fn is_whiteout(p: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

/// A directory renamed in a sandbox whose old path only the mount's
/// read-write branch held, its old parent removed too: the commit leaves
/// that branch as the same commands run on the mount would, without a
/// redirect on the moved directory (it pointed nowhere below, and would
/// have merged in whatever a branch added later holds there) and without
/// a whiteout at the old name (nothing below to hide).
#[test]
fn a_directory_renamed_from_the_read_write_branch_alone_commits_without_marks() {
    for mode in ["plain", ""] {
        let mut m = Mount::union(mode, 1, |b| {
            write_file(&b[1].join("l"), b"l\n");
            fs::create_dir_all(b[0].join("build/obj")).unwrap();
            write_file(&b[0].join("build/obj/o"), b"o\n");
        });
        let script = format!("mv MNT/build/obj MNT/objs && rmdir MNT/build && {TREE}");
        let seen = ok(in_sandbox(&m, None, &script), "sandbox", &m);
        assert!(seen.contains("./objs/o: o\n"), "{seen}");
        let reply = json(&ok(commit(&m, 1, false), "commit", &m));
        assert_eq!(reply["applied"], true, "{reply}");
        let check = |m: &Mount, when: &str| {
            assert_eq!(mount_tree(m), seen, "mode {mode:?} {when}");
            let objs = m.src.join("objs");
            let marks: Vec<String> = list_xattr(&objs)
                .unwrap()
                .into_iter()
                .filter(|n| n.contains("overlay."))
                .collect();
            assert!(marks.is_empty(), "mode {mode:?} {when}: {marks:?}");
            assert!(
                fs::symlink_metadata(m.src.join("build")).is_err(),
                "mode {mode:?} {when}: a whiteout hiding nothing"
            );
            fsck_clean(m, &format!("mode {mode:?} {when}"));
        };
        check(&m, "committed");
        m.remount();
        check(&m, "remounted");
    }
}

/// `chronofs fsck` of `m`'s branches finds nothing.
fn fsck_clean(m: &Mount, what: &str) {
    let out = fsck_branches(m);
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

/// Where the branch below holds the renamed directory's old path too, the
/// redirect stays (the mount follows it to the lower copy) and so do the
/// whiteouts hiding what lies below; one inside it for a file only the
/// read-write branch held goes.
#[test]
fn a_directory_renamed_from_both_branches_keeps_its_redirect_and_whiteouts() {
    for mode in ["plain", ""] {
        let mut m = Mount::union(mode, 1, |b| {
            fs::create_dir_all(b[1].join("build/obj")).unwrap();
            write_file(&b[1].join("build/obj/l"), b"l\n");
            write_file(&b[1].join("build/obj/x"), b"x\n");
            fs::create_dir_all(b[0].join("build/obj")).unwrap();
            write_file(&b[0].join("build/obj/o"), b"o\n");
            write_file(&b[0].join("build/obj/p"), b"p\n");
        });
        let script = format!(
            "mv MNT/build/obj MNT/objs && rm MNT/objs/x MNT/objs/p && rmdir MNT/build && {TREE}"
        );
        let seen = ok(in_sandbox(&m, None, &script), "sandbox", &m);
        assert!(seen.contains("./objs/l: l\n./objs/o: o\n"), "{seen}");
        let reply = json(&ok(commit(&m, 1, false), "commit", &m));
        assert_eq!(reply["applied"], true, "{reply}");
        let check = |m: &Mount, when: &str| {
            assert_eq!(mount_tree(m), seen, "mode {mode:?} {when}");
            let objs = m.src.join("objs");
            assert_eq!(
                get_xattr(&objs, "trusted.overlay.redirect").unwrap(),
                b"/build/obj",
                "mode {mode:?} {when}"
            );
            assert!(is_whiteout(&m.src.join("build")), "mode {mode:?} {when}");
            assert!(is_whiteout(&objs.join("x")), "mode {mode:?} {when}");
            assert!(
                fs::symlink_metadata(objs.join("p")).is_err(),
                "mode {mode:?} {when}: a whiteout hiding nothing"
            );
            fsck_clean(m, &format!("mode {mode:?} {when}"));
        };
        check(&m, "committed");
        m.remount();
        check(&m, "remounted");
    }
}

/// A reboot can give the mount's disk another device number: a sandbox
/// made before it is served again after it, and its commit applies,
/// as if nothing had moved (the sandbox keys its branches' objects by
/// the store's device-independent keys, as the mount does).
#[test]
fn a_sandbox_made_before_its_disk_was_renumbered_commits_after() {
    use common::logdisk::{ext4_image, must, DiskMount, Loop};
    for (lowers, mode) in [(1, "plain"), (1, ""), (0, "")] {
        let what = format!("{lowers} lower branch(es), mode {mode:?}");
        eprintln!("{what}");
        let work = tempdir();
        let img = ext4_image(work.path(), 64 << 20);
        let ext = work.path().join("ext");
        fs::create_dir(&ext).unwrap();
        let first = Loop::attach(&img);
        let on_first = DiskMount::mount(&first.dev, &ext);
        let tree = ext.join("t");
        fs::create_dir(&tree).unwrap();
        let mut m = match lowers {
            0 => Mount::new_in(Root::Kept(tree.clone()), mode, |src| {
                lower(&[src.to_path_buf()])
            }),
            n => Mount::union_in(Root::Kept(tree.clone()), mode, n, lower),
        };
        let out = in_sandbox(
            &m,
            None,
            "echo new > MNT/new && rm MNT/top && mkdir -p MNT/e/sub && echo z > MNT/e/sub/z",
        );
        ok(out, &format!("{what}: sandbox"), &m);
        let dev_before = fs::metadata(&tree).unwrap().dev();
        m.unmount();
        // Held as another namespace's copy would hold it (below).
        let hold = work.path().join("hold");
        fs::create_dir(&hold).unwrap();
        must(Command::new("mount").arg("--bind").arg(&ext).arg(&hold));
        let holder = DiskMount { at: hold };
        // Another test's sandboxed command may hold a copy of this mount
        // (its mount namespace copied every mount when it started; this
        // VM's mounts are private, so the unmount does not reach it), and
        // with it the live superblock: the unmount then writes nothing
        // out. The sandbox's files, whose blocks delayed allocation had
        // not placed yet, came back empty from the image while their
        // names (journaled with the store's fsyncs) did: the one CI
        // failure, reproduced by holding the file system with a bind
        // mount. So the file system is written out whole, journal
        // included (a freeze), and the second device gets a copy of the
        // image, which the holder can no longer write.
        must(Command::new("fsfreeze").arg("-f").arg(&ext));
        must(Command::new("fsfreeze").arg("-u").arg(&ext));
        drop(on_first);
        let copy = work.path().join("disk-after-reboot.img");
        must(
            Command::new("cp")
                .arg("--sparse=always")
                .arg(&img)
                .arg(&copy),
        );
        drop(holder);

        // The same disk under another device number; `first` stays
        // attached (not mounted) so the new one cannot reuse its number.
        let second = Loop::attach(&copy);
        let on_second = DiskMount::mount(&second.dev, &ext);
        assert_ne!(fs::metadata(&tree).unwrap().dev(), dev_before, "{what}");
        m.start();
        assert_eq!(listed(&m).len(), 1, "{what}: the sandbox is kept");
        let out = in_sandbox(&m, Some(1), "cat MNT/new MNT/e/sub/z && ls MNT");
        let shown = ok(out, &format!("{what}: served again"), &m);
        assert!(
            shown.starts_with("new\nz\n") && !shown.contains("top"),
            "{what}: {shown}"
        );
        assert!(!m.p("new").exists() && m.p("top").exists(), "{what}");
        let reply = json(&ok(commit(&m, 1, false), &format!("{what}: commit"), &m));
        assert_eq!(reply["applied"], true, "{what}: {reply}");
        assert_eq!(
            reply["conflicts"].as_array().unwrap().len(),
            0,
            "{what}: {reply}"
        );
        assert_eq!(read_file(&m.p("new")), b"new\n", "{what}");
        assert!(!m.p("top").exists(), "{what}");
        assert_eq!(read_file(&m.p("e/sub/z")), b"z\n", "{what}");
        if lowers > 0 {
            assert_eq!(read_file(&m.p("old")), b"old\n", "{what}: the branch below");
        }
        m.unmount();
        m.start();
        assert_eq!(
            read_file(&m.p("e/sub/z")),
            b"z\n",
            "{what}: after a remount"
        );
        assert!(!m.p("top").exists(), "{what}: after a remount");
        m.unmount();
        drop(on_second);
        drop(second);
        drop(first);
    }
}

/// A disk unmounted outside while a sandboxed command runs goes in the
/// sandbox too, where its mount is shared (systemd makes `/` so): the
/// sandbox's copy of the mount namespace does not keep it alive. As root
/// and as an ordinary user (whose namespace the daemon binds into).
#[test]
fn a_disk_unmounted_outside_goes_in_a_running_sandbox_too() {
    use common::logdisk::{must, DiskMount};
    use std::os::unix::fs::PermissionsExt;
    let m = Mount::new_with("plain", |_| {});
    let work = tempdir();
    fs::set_permissions(work.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // Mounts under a shared mount, as under systemd's `/` (this VM's are
    // private): what is mounted or unmounted in its peers propagates.
    let shared = work.path().join("shared");
    fs::create_dir(&shared).unwrap();
    must(
        Command::new("mount")
            .arg("--bind")
            .arg(&shared)
            .arg(&shared),
    );
    let _shared = DiskMount { at: shared.clone() };
    must(Command::new("mount").arg("--make-shared").arg(&shared));
    let disk = shared.join("disk");
    fs::create_dir(&disk).unwrap();
    let turns = Turns::new(work.path());
    let mnt = m.mnt.to_str().unwrap().to_string();
    let script = format!(
        "n() {{ grep -c ' {d} ' /proc/self/mountinfo; }}; echo $(n) > {r}; read x < {g}; n",
        d = disk.display(),
        r = turns.ready.display(),
        g = turns.go.display()
    );
    for uid in [0, NOBODY] {
        must(
            Command::new("mount")
                .args(["-t", "tmpfs", "tmpfs"])
                .arg(&disk),
        );
        let child = spawn_as(uid, bin(), &["sandbox", &mnt, "--", "sh", "-c", &script]);
        assert_eq!(
            turns.said(),
            "1\n",
            "uid {uid}: the disk in the sandbox before"
        );
        must(Command::new("umount").arg(&disk));
        turns.go();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "0\n",
            "uid {uid}: the disk unmounted outside is still mounted in the sandbox: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// An ordinary user controls the mount namespace the daemon binds their
/// sandbox in (`SandboxEnter`): with a tmpfs of theirs over the session's
/// directory and its path a symlink to a directory they cannot reach,
/// the bind must still be of the session, as the daemon sees it: the
/// tree is taken in the daemon's namespace, before it enters theirs.
#[test]
fn a_user_s_own_mounts_cannot_redirect_a_bind_into_their_namespace() {
    use std::os::unix::fs::PermissionsExt;
    let work = tempdir();
    let w = work.path();
    fs::set_permissions(w, fs::Permissions::from_mode(0o755)).unwrap();
    let (run, target) = (w.join("run"), w.join("target"));
    fs::create_dir_all(run.join("session")).unwrap();
    fs::write(run.join("session/data"), b"the session\n").unwrap();
    fs::create_dir(&target).unwrap();
    let secret = w.join("secret");
    fs::create_dir_all(secret.join("inner")).unwrap();
    fs::write(secret.join("inner/data"), b"not for nobody\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o700)).unwrap();
    let turns = Turns::new(w);
    // mount(8) refuses a user who is not root; the system call is allowed
    // in a user namespace of one's own.
    let mount = format!(
        "import ctypes, os; c = ctypes.CDLL(None, use_errno=True); \
         r = c.mount(b'none', b'{}', b'tmpfs', 0, None); \
         assert r == 0, os.strerror(ctypes.get_errno())",
        run.display()
    );
    let script = format!(
        "python3 -c \"{mount}\" && ln -s {inner} {run}/session && echo ok > {ready} \
         && read x < {go} && cat {target}/data",
        inner = secret.join("inner").display(),
        run = run.display(),
        ready = turns.ready.display(),
        go = turns.go.display(),
        target = target.display(),
    );
    let child = spawn_as(
        NOBODY,
        "unshare",
        &[
            "--map-current-user",
            "--mount",
            "--keep-caps",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(turns.said(), "ok\n");
    let bound =
        chronofs::sys::bind_mount_in_namespace_of(child.id(), &run.join("session"), &target);
    turns.go();
    let out = child.wait_with_output().unwrap();
    bound.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "the session\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A directory whose attributes the sandbox set (a `touch`) while the
/// mount changed its extended attributes (an ACL taken away, a label):
/// a conflict, or the commit would bring the old ones back.
#[test]
fn a_directory_s_xattrs_changed_on_the_mount_conflict_with_the_sandbox_s() {
    each_kind(|m| {
        fs::create_dir(m.p("dd")).unwrap();
        xattr_set(&m.p("dd"), "user.grant", b"eve");
        let out = in_sandbox(m, None, "touch MNT/dd");
        ok(out, "sandbox", m);
        xattr_remove(&m.p("dd"), "user.grant");
        let out = commit(m, 1, false);
        assert!(!out.status.success(), "committed over the mount's change");
        let reply = json(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(reply["conflicts"], serde_json::json!(["/dd"]), "{reply}");
        assert!(
            xattr_get(&m.p("dd"), "user.grant").is_none(),
            "the grant came back"
        );
        ok(
            chronofs_in(
                m.root(),
                &[
                    "sandbox",
                    "discard",
                    "1",
                    "--mount",
                    m.mnt.to_str().unwrap(),
                ],
            ),
            "discard",
            m,
        );
        fs::remove_dir(m.p("dd")).unwrap();
    });
}

fn xattr_set(p: &Path, name: &str, value: &[u8]) {
    let v = String::from_utf8_lossy(value).into_owned();
    common::logdisk::must(Command::new("setfattr").args(["-n", name, "-v", &v]).arg(p));
}

fn xattr_remove(p: &Path, name: &str) {
    common::logdisk::must(Command::new("setfattr").args(["-x", name]).arg(p));
}

fn xattr_get(p: &Path, name: &str) -> Option<String> {
    let out = Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(p)
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Two fifos by which a test and a process it started take turns: the
/// process says it is ready on one, and waits for the go on the other.
struct Turns {
    ready: std::path::PathBuf,
    go: std::path::PathBuf,
}

impl Turns {
    /// The fifos in `dir`, open to every user.
    fn new(dir: &Path) -> Turns {
        let turns = Turns {
            ready: dir.join("ready"),
            go: dir.join("go"),
        };
        for fifo in [&turns.ready, &turns.go] {
            common::logdisk::must(Command::new("mkfifo").arg("-m").arg("666").arg(fifo));
        }
        turns
    }

    /// The line the process said it was ready with.
    fn said(&self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(fs::File::open(&self.ready).unwrap())
            .read_line(&mut line)
            .unwrap();
        line
    }

    fn go(&self) {
        use std::io::Write;
        writeln!(fs::OpenOptions::new().write(true).open(&self.go).unwrap()).unwrap();
    }
}

/// `prog args` started as `uid`, its output kept.
fn spawn_as(uid: u32, prog: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> std::process::Child {
    Command::new(prog)
        .args(args)
        .current_dir("/")
        .uid(uid)
        .gid(uid)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}
