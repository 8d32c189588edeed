//! Live unions (issue 17): a mounted union's branches are listed and change
//! mode while mounted (`chronofs branch list|mode`), with history and
//! without (`-o plain`). docs/ARCHITECTURE.md "Live unions".

mod common;

use common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// (position, mode, upper) of every branch, from `branch list --json`.
fn modes(m: &Mount) -> Vec<(u64, String, bool)> {
    branch_rows(m)
        .iter()
        .map(|b| {
            (
                b["position"].as_u64().unwrap(),
                b["mode"].as_str().unwrap().to_string(),
                b["upper"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn union_modes() -> [&'static str; 2] {
    ["plain", ""]
}

#[test]
fn branch_list_shows_every_branch_with_its_mode_and_the_upper_one() {
    for mode in union_modes() {
        let m = Mount::union(mode, 2, |_| {});
        assert_eq!(
            modes(&m),
            [
                (0, "rw".to_string(), true),
                (1, "ro".to_string(), false),
                (2, "ro".to_string(), false)
            ],
            "mode {mode:?}"
        );
        let text = branch_ok(&m, &["list"]);
        assert!(text.contains(m.lowers[1].to_str().unwrap()), "{text}");
    }
}

#[test]
fn a_lower_branch_made_read_write_takes_writes_and_read_only_again_copies_them_up() {
    for mode in union_modes() {
        let m = Mount::union(mode, 1, |b| write_file(&b[1].join("f"), b"lower\n"));
        let lower = m.lowers[0].to_str().unwrap().to_string();
        // By path; the reply says what changed.
        assert!(branch_ok(&m, &["mode", &lower, "rw"]).contains("is now rw"));
        let again = branch_ok(&m, &["mode", &lower, "rw"]);
        assert!(again.contains("already rw"), "{again}");
        // A file of a read-write branch is changed where it is.
        append_all(&m.p("f"), b"in place\n");
        assert_eq!(read_file(&m.lowers[0].join("f")), b"lower\nin place\n");
        assert!(
            !m.src.join("f").exists(),
            "mode {mode:?}: copied up while rw"
        );
        // Read-only again (by position): the next change copies it up and
        // the branch keeps what it had.
        branch_ok(&m, &["mode", "1", "ro"]);
        append_all(&m.p("f"), b"copied\n");
        assert_eq!(read_file(&m.lowers[0].join("f")), b"lower\nin place\n");
        assert_eq!(read_file(&m.src.join("f")), b"lower\nin place\ncopied\n");
        assert_eq!(read_file(&m.p("f")), b"lower\nin place\ncopied\n");
    }
}

/// A rename over a file of a read-only branch that a mode change left
/// above the upper one fails with EROFS, as its removal does: the new name
/// would land below it, hidden, and the moved file would vanish.
#[test]
fn a_rename_over_a_file_above_the_upper_branch_fails_erofs() {
    for mode in union_modes() {
        let m = Mount::union(mode, 1, |b| {
            write_file(&b[0].join("f"), b"above\n");
            write_file(&b[1].join("g"), b"below\n");
        });
        branch_ok(&m, &["mode", "1", "rw"]);
        branch_ok(&m, &["mode", "0", "ro"]);
        let e = fs::rename(m.p("g"), m.p("f")).expect_err("rename over a file above");
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "mode {mode:?}: {e}");
        assert_eq!(read_file(&m.p("g")), b"below\n");
        assert_eq!(read_file(&m.p("f")), b"above\n");
    }
}

#[test]
fn the_upper_branch_follows_modes_and_with_none_writable_changes_fail_erofs() {
    for mode in union_modes() {
        let m = Mount::union(mode, 1, |_| {});
        branch_ok(&m, &["mode", "1", "rw"]);
        branch_ok(&m, &["mode", "0", "ro"]);
        assert_eq!(
            modes(&m),
            [(0, "ro".to_string(), false), (1, "rw".to_string(), true)]
        );
        write_file(&m.p("new"), b"goes below\n");
        assert!(m.lowers[0].join("new").exists());
        assert!(!m.src.join("new").exists());
        // What is made below the root's own branch is changed there (it
        // was keyed to the root's branch, so a chmod or link looked for it
        // there: ENOENT, EEXIST; pjdfstest's union-moded mode found it).
        fs::set_permissions(m.p("new"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::create_dir(m.p("dir")).unwrap();
        write_file(&m.p("dir/f"), b"f");
        fs::hard_link(m.p("dir/f"), m.p("dir/g")).unwrap();
        assert_eq!(fs::metadata(m.p("dir/g")).unwrap().nlink(), 2);
        assert!(m.lowers[0].join("dir/g").exists());
        fs::remove_file(m.p("dir/g")).unwrap();
        fs::remove_file(m.p("dir/f")).unwrap();
        fs::remove_dir(m.p("dir")).unwrap();
        assert!(!m.lowers[0].join("dir").exists());
        branch_ok(&m, &["mode", "1", "ro"]);
        let err = fs::write(m.p("other"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "mode {mode:?}");
        assert_eq!(
            fs::remove_file(m.p("new")).unwrap_err().raw_os_error(),
            Some(libc::EROFS)
        );
        branch_ok(&m, &["mode", "0", "rw"]);
        fs::remove_file(m.p("new")).unwrap();
        assert!(!m.p("new").exists());
    }
}

/// A file whose topmost copy is in a read-only branch above the upper one
/// cannot change or go: a copy or whiteout made below it would stay hidden
/// behind it. (Found by tests/union_live_stress.rs: the change read back
/// until the name was looked up again, then the old copy showed, and the
/// next copy-up failed with EEXIST; a removed file came back.)
#[test]
fn a_file_above_the_upper_branch_cannot_change() {
    for mode in union_modes() {
        let mut m = Mount::union(mode, 1, |_| {});
        write_file(&m.p("top"), b"top\n");
        branch_ok(&m, &["mode", "1", "rw"]);
        branch_ok(&m, &["mode", "0", "ro"]);
        let erofs = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
        let append = fs::OpenOptions::new().append(true).open(m.p("top"));
        assert_eq!(erofs(append.map(drop)), Some(libc::EROFS), "mode {mode:?}");
        let chmod = fs::set_permissions(m.p("top"), fs::Permissions::from_mode(0o600));
        assert_eq!(erofs(chmod), Some(libc::EROFS), "mode {mode:?}");
        let moved = fs::rename(m.p("top"), m.p("moved"));
        assert_eq!(erofs(moved), Some(libc::EROFS), "mode {mode:?}");
        // Nor can it go: a whiteout below would not hide it.
        let removed = fs::remove_file(m.p("top"));
        assert_eq!(erofs(removed), Some(libc::EROFS), "mode {mode:?}");
        assert!(
            !m.lowers[0].join("top").exists(),
            "mode {mode:?}: no copy below"
        );
        // New names still go to the upper branch.
        write_file(&m.p("new"), b"new\n");
        assert!(m.lowers[0].join("new").exists());
        m.remount();
        assert_eq!(read_file(&m.p("top")), b"top\n", "mode {mode:?}");
        assert_eq!(read_file(&m.p("new")), b"new\n", "mode {mode:?}");
    }
}

#[test]
fn a_branch_with_files_open_for_writing_turns_read_only_only_with_force() {
    // What keeps the daemon from revoking a write handle: the kernel
    // writing through the backing file itself (passthrough), or holding
    // writes in its page cache (writeback); None: the daemon sees them all.
    for (mode, kernel) in [
        ("passthrough=off,writeback=off", None),
        ("plain,passthrough=off,writeback=off", None),
        ("passthrough=off", Some("writeback")),
        ("plain", Some("passthrough")),
        ("", Some("passthrough")),
    ] {
        let m = Mount::union(mode, 1, |_| {});
        let mut open = fs::File::create(m.p("busy")).unwrap();
        open.write_all(b"first\n").unwrap();
        let out = branch(&m, &["mode", "0", "ro"]);
        assert!(!out.status.success(), "mode {mode:?}: refused");
        let why = stderr(&out);
        assert!(
            why.contains(kernel.unwrap_or("open for writing")),
            "mode {mode:?}: {why}"
        );
        assert_eq!(modes(&m)[0].1, "rw");
        let forced = branch(&m, &["mode", "0", "ro", "--force"]);
        if let Some(kernel) = kernel {
            // Not revocable: still refused, and says why.
            assert!(!forced.status.success(), "mode {mode:?}");
            assert!(stderr(&forced).contains(kernel), "{}", stderr(&forced));
            if kernel == "passthrough" {
                assert!(
                    stderr(&forced).contains("(for reading too)")
                        && stderr(&forced).contains("not even with --force"),
                    "{}",
                    stderr(&forced)
                );
            }
            drop(open);
            branch_ok(&m, &["mode", "0", "ro"]);
        } else {
            assert!(forced.status.success(), "{}", stderr(&forced));
            assert!(String::from_utf8_lossy(&forced.stdout).contains("revoked"));
            let err = open.write_all(b"after\n").and_then(|_| open.sync_all());
            assert_eq!(
                err.unwrap_err().raw_os_error(),
                Some(libc::ESTALE),
                "a revoked descriptor"
            );
            drop(open);
        }
        assert_eq!(read_file(&m.p("busy")), b"first\n", "mode {mode:?}");
        assert_eq!(
            fs::write(m.p("busy"), b"x").unwrap_err().raw_os_error(),
            Some(libc::EROFS)
        );
    }
}

#[test]
fn branch_commands_refuse_bad_input_in_one_line() {
    let m = Mount::union("", 1, |_| {});
    for (args, says) in [
        (vec!["mode", "7", "ro"], "not a branch"),
        (vec!["mode", "/nonexistent", "rw"], "not a branch"),
        (vec!["mode", "1", "sideways"], "invalid value"),
    ] {
        let out = branch(&m, &args);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    // Only root changes modes; anyone may list.
    let as_nobody = |args: &[&str]| {
        let mut all = vec!["branch"];
        all.extend_from_slice(args);
        Command::new(bin())
            .args(&all)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let mnt = m.mnt.to_str().unwrap();
    let out = as_nobody(&["mode", mnt, "1", "rw"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("only root"), "{}", stderr(&out));
    assert!(as_nobody(&["list", mnt]).status.success());
    // After a snapshot too, whose fresh branch lies in the store, where
    // only root reaches (the refusal was a bare EACCES on its path).
    let snap = chronofs_in(m.root(), &["snapshot", mnt]);
    assert!(snap.status.success(), "{}", stderr(&snap));
    let extra = m.root().join("extra");
    fs::create_dir(&extra).unwrap();
    // A path that a root's add would refuse too: the privilege comes first.
    for dir in [extra.to_str().unwrap(), "/", "/nonexistent"] {
        let out = as_nobody(&["add", mnt, dir]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("only root may change a union's branches"),
            "{dir}: {}",
            stderr(&out)
        );
    }
    // Not a union; nothing mounted.
    let single = Mount::new("");
    let out = chronofs_in(
        single.root(),
        &["branch", "list", single.mnt.to_str().unwrap()],
    );
    assert!(stderr(&out).contains("not a union"), "{}", stderr(&out));
    let out = chronofs_in(m.root(), &["branch", "list", m.root().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not inside a chronofs mount"),
        "{}",
        stderr(&out)
    );
}

/// Modes flip under writers and readers: every write that succeeded is
/// there afterwards, no operation fails, nothing hangs. (A flip to
/// read-only is refused while a writer has a file of the branch open: the
/// flips retry until they land between writes.)
#[test]
fn modes_flip_under_a_running_workload_and_nothing_is_lost() {
    for mode in [
        "plain,passthrough=off,writeback=off",
        "passthrough=off,writeback=off",
    ] {
        let m = Arc::new(Mount::union(mode, 1, |b| {
            for i in 0..20 {
                write_file(&b[1].join(format!("l{i}")), b"lower\n");
            }
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (m, stop) = (m.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut written = Vec::new();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let name = format!("w{w}-{i}");
                        write_file(&m.p(&name), name.as_bytes());
                        append_all(&m.p(&format!("l{}", i % 20)), name.as_bytes());
                        written.push(name);
                        i += 1;
                    }
                    written
                })
            })
            .collect();
        let reader = {
            let (m, stop) = (m.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for i in 0..20 {
                        let data = read_file(&m.p(&format!("l{i}")));
                        assert!(data.starts_with(b"lower\n"));
                    }
                }
            })
        };
        let mut flips = 0;
        for round in 0..2000 {
            let to = if flips % 2 == 0 { "rw" } else { "ro" };
            let out = branch(&m, &["mode", "1", to]);
            if out.status.success() {
                flips += 1;
                if flips == 20 {
                    break;
                }
            } else {
                assert!(
                    stderr(&out).contains("open for writing"),
                    "round {round}: {}",
                    stderr(&out)
                );
            }
        }
        assert_eq!(flips, 20, "mode {mode:?}: the flips never found a gap");
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        for w in workers {
            let written = w.join().unwrap();
            assert!(!written.is_empty());
            for name in written {
                assert_eq!(read_file(&m.p(&name)), name.as_bytes(), "mode {mode:?}");
            }
        }
    }
}

/// A name whited out in a read-only branch above the upper one cannot be
/// made again: the new file would go below the whiteout and stay hidden
/// (it showed until the next lookup; after a remount it was gone).
#[test]
fn a_name_whited_out_above_the_upper_branch_cannot_be_made() {
    for mode in union_modes() {
        let mut m = Mount::union(mode, 2, |b| write_file(&b[2].join("x"), b"old\n"));
        fs::remove_file(m.p("x")).unwrap();
        branch_ok(&m, &["mode", "1", "rw"]);
        branch_ok(&m, &["mode", "0", "ro"]);
        let made = fs::write(m.p("x"), b"new\n");
        assert_eq!(
            made.unwrap_err().raw_os_error(),
            Some(libc::EROFS),
            "mode {mode:?}"
        );
        assert!(!m.lowers[0].join("x").exists(), "mode {mode:?}");
        // Other names are made in the upper branch.
        write_file(&m.p("y"), b"y\n");
        m.remount();
        assert!(!m.p("x").exists(), "mode {mode:?}");
        assert_eq!(read_file(&m.p("y")), b"y\n", "mode {mode:?}");
    }
}

/// A read-only branch added above the upper one with an opaque copy of
/// a directory hides the upper branch's copy of it: a name made there
/// would not show, nor one moved or linked there, so each fails with
/// EROFS (a create or a rename succeeded and the file was nowhere to be
/// seen, then or after a remount).
#[test]
fn nothing_is_made_below_an_opaque_directory_of_a_branch_above() {
    let m = Mount::union("", 1, |b| {
        fs::create_dir(b[1].join("d")).unwrap();
        write_file(&b[1].join("d/b"), b"b\n");
    });
    let top = m.root().join("top");
    fs::create_dir_all(top.join("d")).unwrap();
    write_file(&top.join("d/t"), b"t\n");
    set_xattr(&top.join("d"), "trusted.overlay.opaque", b"y", 0).unwrap();
    branch_ok(
        &m,
        &["add", top.to_str().unwrap(), "--at", "0", "--mode", "ro"],
    );
    let refused = |r: std::io::Result<()>, what: &str| {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS), "{what}");
    };
    write_file(&m.p("top"), b"top\n");
    refused(fs::rename(m.p("top"), m.p("d/moved")), "rename");
    refused(fs::hard_link(m.p("top"), m.p("d/link")), "link");
    refused(std::os::unix::fs::symlink("x", m.p("d/sl")), "symlink");
    refused(fs::write(m.p("d/new"), b"new\n"), "create");
    refused(fs::create_dir(m.p("d/nd")), "mkdir");
    assert!(!m.src.join("d").exists(), "no hidden copy of d was made");
    assert_eq!(read_file(&m.p("top")), b"top\n");
    assert_eq!(read_file(&m.p("d/t")), b"t\n");
    // Where nothing above hides it, the upper branch takes new names.
    write_file(&m.p("elsewhere"), b"e\n");
    assert_eq!(read_file(&m.src.join("elsewhere")), b"e\n");
}

/// A branch request is no history query: it does not wait for versions
/// being recorded, which a steady write load never lets settle. (Found by
/// tests/union_live_stress.rs: a flip took 12 s.) Here a close(2) of a
/// duplicate descriptor, again and again, keeps history waiting for the
/// release that follows a close.
#[test]
fn branch_commands_do_not_wait_for_history_to_settle() {
    let m = Mount::union("", 1, |_| {});
    let stop = Arc::new(AtomicBool::new(false));
    let busy = fs::File::create(m.p("busy")).unwrap();
    let flusher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                drop(busy.try_clone().unwrap());
            }
        })
    };
    let mnt = m.mnt.to_str().unwrap();
    let mut child = Command::new(bin())
        .args(["branch", "mode", mnt, "1", "rw"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    stop.store(true, Ordering::Relaxed);
    flusher.join().unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "branch mode under closes: {status:?} after {:?}",
        t0.elapsed()
    );
    assert_eq!(modes(&m)[1].1, "rw");
}

/// A mode set while mounted is recorded before it takes effect: a remount
/// (or a restart after kill -9) with the same command line starts with it;
/// another command line starts with its own modes.
#[test]
fn modes_set_while_mounted_survive_a_remount_and_kill9_with_the_same_command_line() {
    for mode in union_modes() {
        let mut m = Mount::union(mode, 1, |_| {});
        branch_ok(&m, &["mode", "1", "rw"]);
        m.remount();
        assert_eq!(modes(&m)[1].1, "rw", "mode {mode:?}: after a remount");
        write_file(&m.p("kept"), b"x");
        branch_ok(&m, &["mode", "0", "ro"]);
        m.kill9();
        m.start();
        assert_eq!(
            modes(&m),
            [(0, "ro".to_string(), false), (1, "rw".to_string(), true)],
            "mode {mode:?}: after kill -9"
        );
        assert_eq!(read_file(&m.p("kept")), b"x");
        // Another command line (a branch more) wins, and is recorded.
        m.unmount();
        let extra = m.root().join("extra");
        fs::create_dir(&extra).unwrap();
        m.lowers.push(extra);
        m.start();
        assert_eq!(
            modes(&m)
                .into_iter()
                .map(|(_, mode, _)| mode)
                .collect::<Vec<_>>(),
            ["rw", "ro", "ro"],
            "mode {mode:?}: a new command line"
        );
    }
}
