//! The kernel caches names and attributes of live objects for a day by
//! default (the mount owns its branches): whatever the daemon changes must
//! show at once through those caches — history restore, revert and
//! undelete, a union copy-up that gives the copy another owner — and with
//! `-o external-changes` a change made in SRC behind the mount shows
//! within the documented second (docs/ARCHITECTURE.md "Cache validity").

#![deny(unsafe_code)]

mod common;
use common::*;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn chrono_ok(m: &Mount, args: &[&str]) {
    chronofs_ok(m, args);
}

/// What a stat through the kernel's caches shows of a file's content.
fn seen(p: &Path) -> Option<(i64, i64, i64)> {
    let st = stat(p).ok()?;
    Some((st.st_size, st.st_mtime, st.st_mtime_nsec))
}

/// The mode without the harness's timeouts, whatever the configured one
/// says: these tests are about the defaults.
fn assert_default_timeouts(m: &Mount) {
    assert!(
        !m.mode.contains("timeout") && !m.mode.contains("external-changes"),
        "mode {} overrides the cache timeouts",
        m.mode
    );
}

#[test]
fn restore_revert_and_undelete_show_at_once_through_cached_attributes() {
    each_versioning_mode(|m| {
        assert_default_timeouts(m);
        write_file(&m.p("f"), b"one");
        fs::create_dir(m.p("d")).unwrap();
        write_file(&m.p("d/g"), b"gee");
        write_file(&m.p("k"), b"kept");
        chrono_ok(m, &["tag", "a"]);
        // What was recorded: with the writeback cache (passthrough=off)
        // the kernel shows its own mtime of a file it wrote, not the
        // backing file's, which history records and restore brings back.
        let then = |rel: &str| seen(&m.p(&format!(".history/@a/{rel}"))).unwrap();
        let (f_then, g_then, k_then) = (then("f"), then("d/g"), then("k"));

        write_file(&m.p("f"), b"two, and longer");
        write_file(&m.p("d/g"), b"gee whiz");
        write_file(&m.p("d/h"), b"new");
        fs::remove_file(m.p("k")).unwrap();
        // Cached now: the changed attributes, the new name, the absent one.
        assert_ne!(seen(&m.p("f")), Some(f_then));
        assert_ne!(seen(&m.p("d/g")), Some(g_then));
        assert!(seen(&m.p("d/h")).is_some());
        assert!(seen(&m.p("k")).is_none());

        chrono_ok(m, &["restore", "f", "--at", "a"]);
        assert_eq!(seen(&m.p("f")), Some(f_then), "restore: stat");
        assert_eq!(read_file(&m.p("f")), b"one", "restore: content");

        chrono_ok(m, &["revert", "d", "--at", "a"]);
        assert_eq!(seen(&m.p("d/g")), Some(g_then), "revert: stat");
        assert_eq!(read_file(&m.p("d/g")), b"gee", "revert: content");
        assert!(seen(&m.p("d/h")).is_none(), "revert: d/h still shows");

        chrono_ok(m, &["undelete", "k"]);
        assert_eq!(seen(&m.p("k")), Some(k_then), "undelete: stat");
        assert_eq!(read_file(&m.p("k")), b"kept", "undelete: content");
    });
}

/// A copy-up made by an open (whose reply carries no attributes) gives
/// the file and its directory the `copyup-owner` owner and mode: the
/// kernel must not go on showing the lower ones it cached.
#[test]
fn a_copy_up_with_another_owner_shows_at_once() {
    let m = Mount::union("plain,copyup-owner=fixed:1000:1001:0640", 1, |b| {
        let low = b.last().unwrap();
        fs::create_dir(low.join("d")).unwrap();
        write_file(&low.join("d/f"), b"x");
        fs::set_permissions(low.join("d/f"), fs::Permissions::from_mode(0o666)).unwrap();
    });
    assert_default_timeouts(&m);
    let owner = |p: PathBuf| {
        let st = fs::metadata(p).unwrap();
        (st.uid(), st.gid(), st.mode() & 0o7777)
    };
    assert_eq!(owner(m.p("d/f")), (0, 0, 0o666));
    assert_eq!(owner(m.p("d")), (0, 0, 0o755));
    drop(fs::OpenOptions::new().write(true).open(m.p("d/f")).unwrap());
    assert_eq!(owner(m.src.join("d/f")), (1000, 1001, 0o640));
    assert_eq!(owner(m.p("d/f")), (1000, 1001, 0o640), "file");
    assert_eq!(owner(m.p("d")), owner(m.src.join("d")), "directory");
}

/// Polls `cond` until it holds or `within` (plus scheduling slack) passed;
/// returns how long it took.
fn shows_within(what: &str, within: Duration, cond: impl Fn() -> bool) -> Duration {
    let t0 = Instant::now();
    let deadline = t0 + within + Duration::from_secs(2);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what}: not visible after {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed()
}

/// `-o external-changes`: a change made in SRC behind the mount shows
/// through it within the 1 s the README documents, even after the kernel
/// cached the old state.
#[test]
fn with_external_changes_a_change_in_src_shows_within_a_second() {
    for mode in ["plain,external-changes", "external-changes"] {
        let m = Mount::new(mode);
        write_file(&m.p("f"), b"one");
        write_file(&m.p("gone"), b"soon");
        assert_eq!(stat(&m.p("f")).unwrap().st_size, 3);
        assert!(stat(&m.p("new")).is_err());
        assert!(stat(&m.p("gone")).is_ok());

        write_file(&m.src.join("f"), b"changed behind");
        fs::set_permissions(m.src.join("f"), fs::Permissions::from_mode(0o600)).unwrap();
        write_file(&m.src.join("new"), b"made behind");
        fs::remove_file(m.src.join("gone")).unwrap();

        let second = Duration::from_secs(1);
        shows_within("new size and mode", second, || {
            stat(&m.p("f")).is_ok_and(|st| st.st_size == 14 && st.st_mode & 0o7777 == 0o600)
        });
        assert_eq!(read_file(&m.p("f")), b"changed behind");
        shows_within("new name", second, || stat(&m.p("new")).is_ok());
        shows_within("removed name", second, || stat(&m.p("gone")).is_err());
    }
}

/// Absent names are cached for a day, except those whose meaning moves
/// with history: a version name looked up before the version exists, and
/// the history directory under audit (absent to other users, while the
/// kernel's entry is shared by every caller).
#[test]
fn names_of_history_are_never_cached_as_absent() {
    let m = Mount::new("audit");
    assert_default_timeouts(&m);
    write_file(&m.p("f"), b"one");
    let next = (1..100)
        .find(|n| stat(&m.p(&format!("f;{n}"))).is_err())
        .unwrap();
    write_file(&m.p("f"), b"two");
    let name = m.p(&format!("f;{next}"));
    assert!(stat(&name).is_ok(), "the new version f;{next} is hidden");

    let (top, version) = (m.p(".history"), m.p("f;1"));
    assert_ne!(as_nobody(|| rc(stat(&top))), 0, ".history shown to nobody");
    assert_ne!(as_nobody(|| rc(stat(&version))), 0, "f;1 shown to nobody");
    assert!(
        stat(&top).is_ok(),
        "root's .history hidden by nobody's lookup"
    );
    assert!(
        stat(&version).is_ok(),
        "root's f;1 hidden by nobody's lookup"
    );
}

/// A copy-up of a hard-linked lower symlink through one name shows
/// through its other name at once, even where the kernel had looked that
/// name up before: one object, indexed. Under `user.` marks
/// (`-o userxattr`) symlinks take no index xattrs, so the copy-up splits
/// it: the other name keeps the lower object, under a new number.
#[test]
fn a_linked_lower_symlink_s_copy_up_shows_through_its_other_name() {
    for (opts, splits) in [("plain", false), ("plain,userxattr", true)] {
        let m = Mount::union(opts, 1, |b| {
            let low = b.last().unwrap();
            std::os::unix::fs::symlink("target", low.join("l")).unwrap();
            fs::hard_link(low.join("l"), low.join("l2")).unwrap();
        });
        let before = lstat(&m.p("l2")).unwrap();
        assert_eq!(before.st_ino, lstat(&m.p("l")).unwrap().st_ino);
        std::os::unix::fs::lchown(m.p("l"), Some(1000), Some(1000)).unwrap();
        let (l, l2) = (lstat(&m.p("l")).unwrap(), lstat(&m.p("l2")).unwrap());
        if splits {
            assert_eq!((l.st_uid, l2.st_uid), (1000, 0), "{opts}");
            assert_ne!(l.st_ino, l2.st_ino, "{opts}: l2 still shows the copy of l");
        } else {
            assert_eq!((l.st_uid, l2.st_uid), (1000, 1000), "{opts}");
            assert_eq!(
                (l.st_ino, l2.st_ino),
                (before.st_ino, before.st_ino),
                "{opts}"
            );
            assert_eq!((l.st_nlink, l2.st_nlink), (2, 2), "{opts}");
        }
    }
}

/// Files the daemon serves (a clone's base, views) are read ahead in
/// 1 MiB requests, not the kernel's default 128 KiB: the mount's bdi
/// takes the session's readahead (docs/PERFORMANCE.md, "Clones").
#[test]
fn the_mount_reads_ahead_a_mebibyte() {
    let m = Mount::new("");
    let dev = fs::metadata(&m.mnt).unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let kb = fs::read_to_string(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb")).unwrap();
    assert_eq!(kb.trim(), "1024");
}

/// With the writeback cache (`passthrough=off`) the kernel keeps a
/// written file's mtime; the backing file, which history records and a
/// remount shows, must hold the same one. (The daemon's write moved it
/// to the daemon's clock whenever the kernel's coarse clock had not
/// ticked since the create, so the kernel sent no time of its own:
/// `restore` then took unchanged files for changed.)
#[test]
fn with_the_writeback_cache_the_backing_file_keeps_the_mtime_the_mount_shows() {
    for mode in ["passthrough=off", "passthrough=off,plain"] {
        let m = Mount::new(mode);
        let mut differ = Vec::new();
        for i in 0..300 {
            let p = m.p(&format!("f{i}"));
            fs::write(&p, b"kept\n").unwrap();
            let shown = fs::metadata(&p).unwrap().mtime_nsec();
            // Read back at once: ext4 hands out a finer time after that.
            let backing = fs::metadata(m.src.join(format!("f{i}"))).unwrap();
            let shown_s = fs::metadata(&p).unwrap().mtime();
            if (shown_s, shown) != (backing.mtime(), backing.mtime_nsec()) {
                differ.push((i, shown, backing.mtime_nsec()));
            }
        }
        assert!(
            differ.is_empty(),
            "mode {mode}: {} differ: {:?}",
            differ.len(),
            &differ[..differ.len().min(5)]
        );
    }
}
