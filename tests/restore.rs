//! Tree operations (`undelete`, `revert`, `restore --to`) bring a tree
//! back exactly — hard links, symlinks, xattrs, ACLs, modes, owners, times
//! and names that are not UTF-8 — and a failure halfway leaves the live
//! tree as it was, so the operation can be run again.

#![deny(unsafe_code)]

mod common;
use common::*;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// A file name with byte 0xe9 (Latin-1 'é'), not UTF-8.
const LATIN1: &[u8] = b"x\xe9y";

/// Everything, directories' mtimes included.
const SNAP: SnapOpts = SnapOpts {
    mtimes: true,
    dir_mtimes: true,
    dir_nlink: true,
};

fn chrono_as(m: &Mount, uid: Option<u32>, args: &[&str]) -> Output {
    chrono_in(&m.mnt, uid, args)
}

fn chrono_in(cwd: &Path, uid: Option<u32>, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .current_dir(cwd)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null());
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    c.output()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin().display()))
}

fn chrono_ok(m: &Mount, args: &[&str]) {
    assert_succeeded(m, args, &chrono_as(m, None, args));
}

/// The rich tree plus modes 0750/0604, a name that is not UTF-8 (a file
/// and a directory holding a hard link of it) and `stamp`, a file never
/// read whose atime is checked.
fn build(root: &Path) {
    build_rich_tree(root);
    let latin = root.join(OsStr::from_bytes(LATIN1));
    write_file(&latin, b"latin-1 name\n");
    set_xattr(&latin, "user.enc", b"latin1", 0).unwrap();
    let latin_dir = root.join(OsStr::from_bytes(b"d\xe9"));
    fs::create_dir(&latin_dir).unwrap();
    fs::hard_link(&latin, latin_dir.join(OsStr::from_bytes(b"link\xe9"))).unwrap();
    write_file(&root.join("m0750"), b"0750\n");
    fs::set_permissions(root.join("m0750"), fs::Permissions::from_mode(0o750)).unwrap();
    // Root's own namespace comes back too when root brings it back.
    set_xattr(
        &root.join("m0750"),
        "trusted.chronofs-test",
        b"root only",
        0,
    )
    .unwrap();
    write_file(&root.join("m0604"), b"0604\n");
    fs::set_permissions(root.join("m0604"), fs::Permissions::from_mode(0o604)).unwrap();
    run(root, "setfacl", &["-m", "u:65534:rw,g:65534:r", "m0604"]);
    run(root, "setfacl", &["-d", "-m", "u:65534:rx", "dir/sub"]);
    // Fixed times (with the writeback cache the kernel's own mtime of a
    // fresh write may differ from the backing file's by microseconds).
    let names: [&[u8]; 5] = [LATIN1, b"d\xe9/link\xe9", b"m0750", b"m0604", b"d\xe9"];
    for (i, n) in names.iter().enumerate() {
        set_times(
            &root.join(OsStr::from_bytes(n)),
            (1_650_000_000 + i as i64, 5),
            (1_450_000_000 + i as i64, 7),
            true,
        );
    }
    write_file(&root.join("stamp"), b"never read\n");
    set_times(
        &root.join("stamp"),
        (1_700_000_000, 111),
        (1_400_000_000, 222),
        true,
    );
}

fn atime(p: &Path) -> (i64, i64) {
    let md = fs::symlink_metadata(p).unwrap();
    (md.atime(), md.atime_nsec())
}

/// The names in `dir` as bytes, sorted.
fn raw_names(dir: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    v.sort();
    v
}

/// Every name under `root` as bytes (relative), so a lossy name written
/// beside the real one cannot hide behind the snapshot's lossy keys.
fn all_names(root: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(
                p.strip_prefix(root)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            );
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

struct Want {
    tree: BTreeMap<String, Entry>,
    names: Vec<Vec<u8>>,
    stamp_atime: (i64, i64),
}

fn want_of(t: &Path) -> Want {
    // Before anything reads `stamp`.
    let stamp_atime = atime(&t.join("stamp"));
    Want {
        stamp_atime,
        tree: snapshot(t, SNAP),
        names: all_names(t),
    }
}

/// `fresh`: every object was written anew (undelete, restore to a new
/// place), so atimes are the recorded ones too; a revert keeps unchanged
/// files as the live objects, with the atimes reads gave them since.
fn check(m: &Mount, got: &Path, want: &Want, what: &str, fresh: bool) {
    if fresh {
        assert_eq!(atime(&got.join("stamp")), want.stamp_atime, "{what}: atime");
    }
    assert_eq!(all_names(got), want.names, "{what}: names (as bytes)");
    assert_same_tree(&want.tree, &snapshot(got, SNAP), what, &m.log_tail());
    let plain = fs::metadata(got.join("plain.txt")).unwrap();
    assert_eq!(plain.nlink(), 3, "{what}: plain.txt's hard links");
    assert_eq!(
        fs::metadata(got.join("dir/sub/hardlink2")).unwrap().ino(),
        plain.ino(),
        "{what}: one inode"
    );
    assert_eq!(
        get_xattr(&got.join("m0750"), "trusted.chronofs-test").ok(),
        Some(b"root only".to_vec()),
        "{what}: trusted.* xattr"
    );
    let latin = fs::metadata(got.join(OsStr::from_bytes(LATIN1))).unwrap();
    assert_eq!(latin.nlink(), 2, "{what}: the latin-1 pair");
    assert_eq!(
        get_xattr(&got.join("dir/sub"), "system.posix_acl_default").ok(),
        want.tree["dir/sub"]
            .xattrs
            .iter()
            .find(|(k, _)| k == "system.posix_acl_default")
            .map(|(_, v)| v.clone()),
        "{what}: default ACL"
    );
}

fn no_staging_left(dir: &Path) {
    for n in raw_names(dir) {
        assert!(
            !n.starts_with(b".chronofs-staging"),
            "a staging directory was left in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&n)
        );
    }
}

#[test]
fn rm_rf_then_undelete_brings_back_links_xattrs_acls_owners_times_and_byte_names() {
    each_versioning_mode(|m| {
        build(&m.p("t"));
        let want = want_of(&m.p("t"));
        run(&m.mnt, "rm", &["-rf", "t"]);
        let out = chrono_as(m, None, &["ls", "--deleted", "--json", "."]);
        let text = String::from_utf8_lossy(&out.stdout).replace([' ', '\n'], "");
        assert!(
            text.contains("\"name\":\"t\""),
            "t is a deleted entry: {text}"
        );
        chrono_ok(m, &["undelete", "t"]);
        check(m, &m.p("t"), &want, "undelete after rm -rf", true);
        // --json carries names that are not UTF-8 as bytes.
        let out = chrono_as(m, None, &["ls", "--json", "t"]);
        let text = String::from_utf8_lossy(&out.stdout).replace([' ', '\n'], "");
        assert!(
            text.contains("\"name_raw\":[120,233,121]"),
            "ls --json: {text}"
        );
        no_staging_left(&m.mnt);
    });
}

/// Changes every kind of thing the tree operations must undo.
fn change(t: &Path) {
    write_file(&t.join("plain.txt"), b"changed content\n");
    fs::remove_file(t.join("dir/hardlink")).unwrap();
    fs::set_permissions(t.join("m0750"), fs::Permissions::from_mode(0o777)).unwrap();
    run(t, "setfacl", &["-b", "m0604"]);
    run(t, "setfattr", &["-x", "user.color", "plain.txt"]);
    fs::rename(
        t.join(OsStr::from_bytes(LATIN1)),
        t.join(OsStr::from_bytes(b"renamed\xe9")),
    )
    .unwrap();
    write_file(&t.join("new-file"), b"new\n");
    fs::create_dir(t.join("new-dir")).unwrap();
    fs::remove_dir_all(t.join("dir/sub/deeper")).unwrap();
    fs::remove_file(t.join("rel_link")).unwrap();
    std::os::unix::fs::symlink("elsewhere", t.join("rel_link")).unwrap();
}

#[test]
fn revert_and_restore_to_bring_back_the_tree_exactly() {
    each_versioning_mode(|m| {
        build(&m.p("t"));
        let want = want_of(&m.p("t"));
        chrono_ok(m, &["tag", "orig"]);
        change(&m.p("t"));
        chrono_ok(m, &["restore", "t", "--at", "orig", "--to", "t2"]);
        check(m, &m.p("t2"), &want, "restore --to t2", true);
        // An existing DEST is never replaced: a directory given as DEST
        // went, with all it held.
        fs::create_dir(m.p("keep")).unwrap();
        write_file(&m.p("keep/important"), b"mine\n");
        let out = chrono_as(m, None, &["restore", "t", "--at", "orig", "--to", "keep"]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("exists") && err.lines().count() == 1, "{err}");
        assert_eq!(fs::read(m.p("keep/important")).unwrap(), b"mine\n");
        chrono_ok(m, &["revert", "t", "--at", "orig"]);
        check(m, &m.p("t"), &want, "revert", false);
        // The replaced tree went under a staging name: not a deletion.
        let listed: Vec<String> = fs::read_dir(m.p(";deleted"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !listed.iter().any(|n| n.starts_with(".chronofs-staging-")),
            "{listed:?}"
        );
        no_staging_left(&m.mnt);
    });
}

#[test]
fn a_tree_operation_that_fails_halfway_changes_nothing_and_can_be_retried() {
    each_versioning_mode(|m| {
        // `shared` lets nobody write; nobody cannot read `dir/odd mode`
        // (root's, 04751), so nobody's undelete and revert fail halfway.
        fs::create_dir(m.p("shared")).unwrap();
        fs::set_permissions(m.p("shared"), fs::Permissions::from_mode(0o777)).unwrap();
        let t = m.p("shared/t");
        build(&t);
        let want = want_of(&t);
        chrono_ok(m, &["tag", "orig"]);
        run(&m.mnt, "rm", &["-rf", "shared/t"]);

        let out = chrono_as(m, Some(NOBODY), &["undelete", "shared/t"]);
        assert!(!out.status.success(), "nobody's undelete should fail");
        assert!(
            fs::symlink_metadata(&t).is_err(),
            "a failed undelete left a partial tree: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        no_staging_left(&m.p("shared"));
        chrono_ok(m, &["undelete", "shared/t"]);
        check(m, &t, &want, "undelete retried", true);

        change(&t);
        let changed = snapshot(&t, SNAP);
        let changed_names = all_names(&t);
        let out = chrono_as(m, Some(NOBODY), &["revert", "shared/t", "--at", "orig"]);
        failed_revert_changed_nothing(m, &t, &out, &changed, &changed_names);
        no_staging_left(&m.p("shared"));
        chrono_ok(m, &["revert", "shared/t", "--at", "orig"]);
        check(m, &t, &want, "revert retried", false);
    });
}

/// In a sticky directory nobody may not replace or remove root's files:
/// a revert that would is refused before it changes anything, and says
/// why (it swapped nobody's own entries in, then failed on root's and
/// said to run it again, which could never finish).
#[test]
fn a_revert_in_a_sticky_directory_refuses_what_it_may_not_replace() {
    each_versioning_mode(|m| {
        let t = m.p("t");
        fs::create_dir(&t).unwrap();
        fs::set_permissions(&t, fs::Permissions::from_mode(0o1777)).unwrap();
        for name in ["a-mine", "b-roots", "c-mine"] {
            write_file(&t.join(name), b"old\n");
        }
        for name in ["a-mine", "c-mine"] {
            std::os::unix::fs::chown(t.join(name), Some(NOBODY), Some(NOBODY)).unwrap();
        }
        chrono_ok(m, &["tag", "orig"]);
        for name in ["a-mine", "b-roots", "c-mine"] {
            write_file(&t.join(name), b"new\n");
        }
        let changed = snapshot(&t, SNAP);
        let changed_names = all_names(&t);
        let out = chrono_as(m, Some(NOBODY), &["revert", "t", "--at", "orig"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        failed_revert_changed_nothing(m, &t, &out, &changed, &changed_names);
        assert!(
            err.contains("t/b-roots") && err.contains("sticky") && !err.contains("again"),
            "{err}"
        );
        no_staging_left(&t);
        // Root's file made since: a revert would remove it.
        let u = m.p("u");
        fs::create_dir(&u).unwrap();
        fs::set_permissions(&u, fs::Permissions::from_mode(0o1777)).unwrap();
        write_file(&u.join("mine"), b"old\n");
        std::os::unix::fs::chown(u.join("mine"), Some(NOBODY), Some(NOBODY)).unwrap();
        chrono_ok(m, &["tag", "u-orig"]);
        write_file(&u.join("d-roots"), b"since\n");
        // Root's revert replaces `u` itself. Its past stays nobody's to
        // read: the old `u` was removed inside a 0700 staging directory,
        // and history then refused nobody all of `u`'s past.
        chrono_ok(m, &["revert", "u", "--at", "u-orig"]);
        let out = chrono_as(m, Some(NOBODY), &["cat", "u/mine", "--at", "u-orig"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "old\n", "{out:?}");
        write_file(&u.join("d-roots"), b"since\n");
        write_file(&u.join("mine"), b"new\n");
        let out = chrono_as(m, Some(NOBODY), &["revert", "u", "--at", "u-orig"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success() && err.contains("cannot remove") && err.contains("u/d-roots"),
            "{err}"
        );
        assert_eq!(read_file(&u.join("mine")), b"new\n");
        no_staging_left(&u);
        // Every entry nobody's own: the revert goes through; the
        // directory's own mode and times stay root's to set (it failed
        // there, after swapping everything in).
        fs::remove_file(u.join("d-roots")).unwrap();
        let out = chrono_as(m, Some(NOBODY), &["revert", "u", "--at", "u-orig"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success() && err.contains("left as they are"),
            "{err}"
        );
        assert_eq!(read_file(&u.join("mine")), b"old\n");
        no_staging_left(&u);
        // Root's revert of a directory in nobody's 0700 one: the past
        // stays nobody's to read (the staging directory was root's, so
        // its way was closed to nobody).
        let home = m.p("home");
        fs::create_dir_all(home.join("proj")).unwrap();
        write_file(&home.join("proj/f"), b"old\n");
        for p in [&home, &home.join("proj"), &home.join("proj/f")] {
            std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        fs::set_permissions(&home, fs::Permissions::from_mode(0o700)).unwrap();
        chrono_ok(m, &["tag", "home-orig"]);
        write_file(&home.join("proj/f"), b"new\n");
        write_file(&home.join("proj/g"), b"since\n");
        chrono_ok(m, &["revert", "home/proj", "--at", "home-orig"]);
        let out = chrono_as(
            m,
            Some(NOBODY),
            &["cat", "home/proj/f", "--at", "home-orig"],
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "old\n", "{out:?}");
    });
}

/// A revert that failed left `t` as it was before it.
fn failed_revert_changed_nothing(
    m: &Mount,
    t: &Path,
    out: &Output,
    changed: &BTreeMap<String, Entry>,
    changed_names: &[Vec<u8>],
) {
    assert!(!out.status.success(), "nobody's revert should fail");
    assert_eq!(all_names(t), changed_names, "a failed revert changed names");
    assert_same_tree(
        changed,
        &snapshot(t, SNAP),
        "a failed revert changed the live tree",
        &m.log_tail(),
    );
}

/// `cd t; chronofs revert . --at T` stages inside `t` (the shell's working
/// directory stays the tree): the same exactness, and the same
/// all-or-nothing build.
#[test]
fn revert_from_inside_the_tree_is_exact_and_all_or_nothing() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("shared")).unwrap();
        fs::set_permissions(m.p("shared"), fs::Permissions::from_mode(0o777)).unwrap();
        let t = m.p("shared/t");
        build(&t);
        fs::set_permissions(&t, fs::Permissions::from_mode(0o777)).unwrap();
        let want = want_of(&t);
        chrono_ok(m, &["tag", "orig"]);
        change(&t);
        let changed = snapshot(&t, SNAP);
        let changed_names = all_names(&t);

        let out = chrono_in(&t, Some(NOBODY), &["revert", ".", "--at", "orig"]);
        failed_revert_changed_nothing(m, &t, &out, &changed, &changed_names);

        let out = chrono_in(&t, None, &["revert", ".", "--at", "orig"]);
        assert!(
            out.status.success(),
            "revert .: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        check(m, &t, &want, "revert . from inside", false);
        no_staging_left(&t);
        // restore keeps what only the live tree has.
        write_file(&t.join("new-file"), b"new\n");
        let out = chrono_in(&t, None, &["restore", ".", "--at", "orig"]);
        assert!(
            out.status.success(),
            "restore .: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(read_file(&t.join("new-file")), b"new\n");
        fs::remove_file(t.join("new-file")).unwrap();
        check(m, &t, &want, "restore . from inside", false);
        no_staging_left(&t);
    });
}

/// A tree that predates history and is first seen by the `rm -rf` that
/// removes it gets its baselines in the middle of the removal: undelete
/// must still bring back every entry (the first file removed was lost:
/// its baseline-free run of removals ended at the next baseline).
#[test]
fn undelete_of_a_tree_first_seen_by_its_removal_brings_back_everything() {
    let m = Mount::new_with("ingest=off", |src| {
        fs::create_dir_all(src.join("tree/sub")).unwrap();
        write_file(&src.join("tree/top"), b"top");
        write_file(&src.join("tree/sub/leaf"), b"leaf");
    });
    m.wait_history_ready();
    fs::remove_dir_all(m.p("tree")).unwrap();
    chrono_ok(&m, &["undelete", m.p("tree").to_str().unwrap()]);
    assert_eq!(read_file(&m.p("tree/top")), b"top");
    assert_eq!(read_file(&m.p("tree/sub/leaf")), b"leaf");
}

/// `undelete dir/sub/f` after `rm -rf dir`: f comes back with the
/// directories on its way as they were then (mode, xattrs, mtime), holding
/// only f; a sibling undeleted next joins it. A path the tree did not hold
/// is refused with nothing made. (It said "/dir/sub did not exist".)
#[test]
fn undelete_of_a_file_in_a_removed_tree_brings_back_its_directories() {
    use std::os::unix::fs::MetadataExt;
    each_versioning_mode(|m| {
        fs::create_dir_all(m.p("dir/sub")).unwrap();
        write_file(&m.p("dir/sub/f"), b"f");
        write_file(&m.p("dir/sub/g"), b"g");
        write_file(&m.p("dir/h"), b"h");
        fs::set_permissions(m.p("dir"), fs::Permissions::from_mode(0o750)).unwrap();
        set_xattr(&m.p("dir"), "user.k", b"v", 0).unwrap();
        let old = |p: &Path| {
            let t = filetime_secs(p, 1_500_000_000);
            assert_eq!(fs::metadata(p).unwrap().mtime(), t);
        };
        old(&m.p("dir/sub"));
        old(&m.p("dir"));
        fs::remove_dir_all(m.p("dir")).unwrap();

        let nope = chrono_as(m, None, &["undelete", "dir/sub/nope"]);
        assert!(!nope.status.success());
        assert!(!m.p("dir").exists(), "a refused undelete made dir");

        chrono_ok(m, &["undelete", "dir/sub/f"]);
        assert_eq!(read_file(&m.p("dir/sub/f")), b"f");
        let names = |d: &str| {
            let mut v: Vec<_> = fs::read_dir(m.p(d))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names("dir"), ["sub"]);
        assert_eq!(names("dir/sub"), ["f"]);
        let dir = fs::metadata(m.p("dir")).unwrap();
        assert_eq!(dir.mode() & 0o7777, 0o750);
        assert_eq!(dir.mtime(), 1_500_000_000);
        assert_eq!(fs::metadata(m.p("dir/sub")).unwrap().mtime(), 1_500_000_000);
        assert_eq!(get_xattr(&m.p("dir"), "user.k").unwrap(), b"v");

        chrono_ok(m, &["undelete", "dir/sub/g"]);
        assert_eq!(read_file(&m.p("dir/sub/g")), b"g");
        chrono_ok(m, &["undelete", "dir/h"]);
        assert_eq!(read_file(&m.p("dir/h")), b"h");
        no_staging_left(&m.mnt);
    });
}

/// The deleted entries of a directory renamed since (`DIR/;deleted`,
/// `ls --deleted`) come back into it: `undelete` and the `restore --at`
/// that `ls --deleted` prints find them where the directory was then, a
/// file, a tree, and a file of a tree removed whole.
#[test]
fn undelete_from_a_directory_renamed_since_brings_it_back_there() {
    each_versioning_mode(|m| {
        fs::create_dir_all(m.p("ud/sub")).unwrap();
        write_file(&m.p("ud/f"), b"f");
        write_file(&m.p("ud/sub/g"), b"g");
        fs::create_dir_all(m.p("ud/gone/deep")).unwrap();
        write_file(&m.p("ud/gone/deep/h"), b"h");
        fs::remove_file(m.p("ud/f")).unwrap();
        fs::remove_dir_all(m.p("ud/sub")).unwrap();
        fs::remove_dir_all(m.p("ud/gone")).unwrap();
        fs::rename(m.p("ud"), m.p("ud2")).unwrap();

        // The old path names a directory that lives on: no second copy.
        let old = chrono_as(m, None, &["undelete", "ud/f"]);
        let err = String::from_utf8_lossy(&old.stderr);
        assert!(!old.status.success() && err.contains("ud2/f"), "{err}");
        assert!(!m.p("ud").exists(), "an undelete made the old name again");

        chrono_ok(m, &["undelete", "ud2/f"]);
        assert_eq!(read_file(&m.p("ud2/f")), b"f");
        chrono_ok(m, &["undelete", "ud2/sub"]);
        assert_eq!(read_file(&m.p("ud2/sub/g")), b"g");
        chrono_ok(m, &["undelete", "ud2/gone/deep/h"]);
        assert_eq!(read_file(&m.p("ud2/gone/deep/h")), b"h");
        assert!(!m.p("ud").exists(), "an undelete made the old name again");

        // The hint `ls --deleted` prints works as printed.
        fs::remove_file(m.p("ud2/f")).unwrap();
        fs::rename(m.p("ud2"), m.p("ud3")).unwrap();
        let out = chrono_as(m, None, &["ls", "ud3", "--deleted"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text.lines().find(|l| l.starts_with("f ")).unwrap_or("");
        let at = line
            .split("restore --at ")
            .nth(1)
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("no hint for f in: {text}"));
        chrono_ok(m, &["restore", "ud3/f", "--at", at]);
        assert_eq!(read_file(&m.p("ud3/f")), b"f");
        no_staging_left(&m.mnt);
    });
}

/// Sets `p`'s atime and mtime to `secs`; returns them.
fn filetime_secs(p: &Path, secs: i64) -> i64 {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64);
    fs::File::open(p)
        .unwrap()
        .set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
        .unwrap();
    secs
}

/// What a restore cut short by a crash or a power cut leaves (its staging
/// tree, under a pid no process has) goes with the next restore there; a
/// live run's stays.
#[test]
fn a_restore_removes_the_staging_an_interrupted_one_left() {
    each_versioning_mode(|m| {
        write_file(&m.p("f"), b"one\n");
        chrono_ok(m, &["tag", "one"]);
        fs::remove_file(m.p("f")).unwrap();
        // pid_max is at most 2^22: no process has this pid.
        let dead = m.p(".chronofs-staging-999999999-0");
        fs::create_dir(&dead).unwrap();
        write_file(&dead.join("partial"), b"par");
        let live = m.p(&format!(".chronofs-staging-{}-0", std::process::id()));
        fs::create_dir(&live).unwrap();
        chrono_ok(m, &["restore", "f", "--at", "one"]);
        assert_eq!(read_file(&m.p("f")), b"one\n");
        assert!(!dead.exists(), "the dead run's staging stays");
        assert!(live.exists(), "a live run's staging went");
        fs::remove_dir(&live).unwrap();
        no_staging_left(&m.mnt);
    });
}

/// The size of the file whose download is the window the tests below act
/// in: large enough that the download lasts many polls.
const BIG: usize = 64 << 20;

fn signal(pid: u32, sig: &str) {
    run(Path::new("/"), "kill", &[sig, &pid.to_string()]);
}

/// Whether process `pid` is writing a regular file whose path contains
/// every string of `marker` and that has some bytes but fewer than `size`
/// (a download under way: the daemon is sending the content). An empty
/// one may still wait for its read to be asked: a file first written
/// then is read as it was before (its baseline), with no mix to refuse.
fn downloading(pid: u32, marker: &[&str], size: usize) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        fs::read_link(fd.path()).is_ok_and(|l| {
            let l = l.to_string_lossy();
            marker.iter().all(|m| l.contains(m))
        }) && fs::metadata(fd.path())
            .is_ok_and(|md| md.is_file() && (1..size as u64).contains(&md.len()))
    })
}

/// Runs chronofs as root in `cwd` with umask 0 and, while it downloads a
/// file (see [`downloading`]), stops it, runs `act` (what another user
/// could do meanwhile), and lets it go on. Fails if the download could not
/// be caught.
fn during_download(
    cwd: &Path,
    args: &[&str],
    marker: &[&str],
    size: usize,
    act: impl FnOnce(),
) -> Output {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("umask 0; exec \"$0\" \"$@\"")
        .arg(bin())
        .args(args)
        .current_dir(cwd)
        .env("LC_ALL", "C")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut act = Some(act);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        if downloading(pid, marker, size) {
            signal(pid, "-STOP");
            if downloading(pid, marker, size) {
                if let Some(a) = act.take() {
                    a();
                }
            }
            signal(pid, "-CONT");
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        act.is_none(),
        "`chronofs {}` was not caught downloading: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Bob, who may write the directory, swaps alice's file for a symlink to
/// her `.bashrc` while alice's restore of it downloads the content: the
/// restore must not write through the symlink (it wrote the whole old
/// content into `.bashrc`). Nor does a symlink already there lead the
/// write anywhere: it is replaced.
#[test]
fn a_file_swapped_for_a_symlink_during_its_restore_is_not_written_through() {
    each_versioning_mode(|m| {
        let home = tempdir();
        let bashrc = home.path().join(".bashrc");
        write_file(&bashrc, b"alias ls='ls -F'\n");
        write_file(&m.p("plan.txt"), &pattern(BIG, 1));
        chrono_ok(m, &["tag", "orig"]);
        write_file(&m.p("plan.txt"), b"changed\n");

        let out = during_download(
            &m.mnt,
            &["restore", "plan.txt", "--at", "orig"],
            &["(deleted)"],
            BIG,
            || {
                fs::remove_file(m.p("plan.txt")).unwrap();
                std::os::unix::fs::symlink(&bashrc, m.p("plan.txt")).unwrap();
            },
        );
        assert_eq!(
            read_file(&bashrc),
            b"alias ls='ls -F'\n",
            "the restore wrote through the symlink: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "the swap went unnoticed");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("replaced"), "{err}");

        // A symlink at the name before the restore starts is replaced.
        chrono_ok(m, &["restore", "plan.txt", "--at", "orig"]);
        assert_eq!(read_file(&bashrc), b"alias ls='ls -F'\n");
        let md = fs::symlink_metadata(m.p("plan.txt")).unwrap();
        assert!(md.is_file(), "{md:?}");
        assert_eq!(fnv(&read_file(&m.p("plan.txt"))), fnv(&pattern(BIG, 1)));
        no_staging_left(&m.mnt);
    });
}

/// Alice, who owns the directory root reverts a tree in, renames root's
/// staging directory away and puts at its name a symlink to a directory
/// of root's while the tree is built: nothing may be created, chown-ed or
/// chmod-ed there (the tree went on being built through the name, so the
/// restored `passwd`'s owner and mode went to root's `passwd`).
#[test]
fn a_staging_directory_swapped_for_a_symlink_leads_nothing_out() {
    each_versioning_mode(|m| {
        let outside = tempdir();
        let etc = outside.path().join("etc");
        fs::create_dir(&etc).unwrap();
        fs::set_permissions(&etc, fs::Permissions::from_mode(0o700)).unwrap();
        write_file(&etc.join("passwd"), b"root:x:0:0::/root:/bin/sh\n");
        fs::set_permissions(etc.join("passwd"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::create_dir(m.p("t")).unwrap();
        write_file(&m.p("t/passwd"), &pattern(BIG, 2));
        fs::set_permissions(m.p("t/passwd"), fs::Permissions::from_mode(0o666)).unwrap();
        std::os::unix::fs::chown(m.p("t/passwd"), Some(NOBODY), Some(NOBODY)).unwrap();
        write_file(&m.p("t/b"), b"b\n");
        write_file(&m.p("t/c"), b"c\n");
        fs::set_permissions(m.p("t"), fs::Permissions::from_mode(0o751)).unwrap();
        chrono_ok(m, &["tag", "orig"]);
        fs::remove_file(m.p("t/b")).unwrap();
        write_file(&m.p("t/c"), b"changed\n");
        write_file(&m.p("t/passwd"), b"changed\n");

        let moved = m.p("moved");
        let mut swapped = None;
        let out = during_download(
            &m.mnt,
            &["revert", "t", "--at", "orig"],
            &[".chronofs-staging-", "/passwd"],
            BIG,
            || {
                let staging = raw_names(&m.mnt)
                    .into_iter()
                    .find(|n| n.starts_with(b".chronofs-staging-"))
                    .expect("a staging directory");
                let staging = m.mnt.join(OsStr::from_bytes(&staging));
                fs::rename(&staging, &moved).unwrap();
                std::os::unix::fs::symlink(&etc, &staging).unwrap();
                swapped = Some(staging);
            },
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(raw_names(&etc), vec![b"passwd".to_vec()], "{err}");
        let pw = fs::metadata(etc.join("passwd")).unwrap();
        assert_eq!(
            (pw.uid(), pw.gid(), pw.mode() & 0o7777),
            (0, 0, 0o644),
            "root's passwd was chown-ed or chmod-ed: {err}"
        );
        assert_eq!(
            read_file(&etc.join("passwd")),
            b"root:x:0:0::/root:/bin/sh\n"
        );
        let md = fs::metadata(&etc).unwrap();
        assert_eq!(
            md.mode() & 0o7777,
            0o700,
            "the symlink's target was chmod-ed"
        );
        // The tree itself came back whole, from where it was built.
        assert_succeeded(m, &["revert"], &out);
        let t = fs::symlink_metadata(m.p("t")).unwrap();
        assert!(t.is_dir() && t.mode() & 0o7777 == 0o751, "{t:?}");
        assert_eq!(read_file(&m.p("t/b")), b"b\n");
        assert_eq!(read_file(&m.p("t/c")), b"c\n");
        assert_eq!(fnv(&read_file(&m.p("t/passwd"))), fnv(&pattern(BIG, 2)));
        fs::remove_file(swapped.unwrap()).unwrap();
        fs::remove_dir_all(&moved).ok();
        no_staging_left(&m.mnt);
    });
}

/// Every object of a staging tree is the caller's alone until it is
/// complete (a directory until its entries are): a 0600 key in a 0700
/// directory restored into a 0755 home was readable by anyone (0666 with
/// umask 0) while its content downloaded.
#[test]
fn a_staging_tree_is_private_while_it_is_built() {
    each_versioning_mode(|m| {
        fs::create_dir_all(m.p("home/.ssh")).unwrap();
        fs::set_permissions(m.p("home/.ssh"), fs::Permissions::from_mode(0o700)).unwrap();
        write_file(&m.p("home/.ssh/id"), &pattern(BIG, 3));
        fs::set_permissions(m.p("home/.ssh/id"), fs::Permissions::from_mode(0o600)).unwrap();
        chrono_ok(m, &["tag", "orig"]);
        let mut seen = Vec::new();
        let out = during_download(
            &m.mnt,
            &["restore", "home", "--at", "orig", "--to", "home2"],
            &[".chronofs-staging-", "/id"],
            BIG,
            || {
                let mut stack: Vec<_> = raw_names(&m.mnt)
                    .into_iter()
                    .filter(|n| n.starts_with(b".chronofs-staging-"))
                    .map(|n| m.mnt.join(OsStr::from_bytes(&n)))
                    .collect();
                while let Some(p) = stack.pop() {
                    let md = fs::symlink_metadata(&p).unwrap();
                    seen.push((p.clone(), md.mode() & 0o7777));
                    if md.is_dir() {
                        stack.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
                    }
                }
            },
        );
        assert_succeeded(m, &["restore"], &out);
        assert!(seen.len() >= 4, "{seen:?}");
        for (p, mode) in &seen {
            assert_eq!(mode & 0o077, 0, "{} was {mode:o}", p.display());
        }
        let md = fs::metadata(m.p("home2/.ssh/id")).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o600);
        assert_eq!(
            fnv(&read_file(&m.p("home2/.ssh/id"))),
            fnv(&pattern(BIG, 3))
        );
        no_staging_left(&m.mnt);
    });
}

/// `cd t; chronofs restore . --at T` where `t` was a symlink (or a file)
/// at T: the past cannot be staged inside the directory `t` is now, and
/// replacing it would leave the shell in a removed directory, so it is
/// refused with one line, and nothing changes (the symlink's attributes
/// went to the directory, 0777, its ACL dropped; revert also removed every
/// entry).
#[test]
fn a_non_directory_over_the_directory_the_caller_is_in_is_refused() {
    each_versioning_mode(|m| {
        let t = m.p("t");
        std::os::unix::fs::symlink("elsewhere", &t).unwrap();
        chrono_ok(m, &["tag", "link"]);
        fs::remove_file(&t).unwrap();
        write_file(&t, b"a file\n");
        chrono_ok(m, &["tag", "file"]);
        fs::remove_file(&t).unwrap();
        fs::create_dir(&t).unwrap();
        write_file(&t.join("keep"), b"keep\n");
        fs::set_permissions(&t, fs::Permissions::from_mode(0o750)).unwrap();
        run(&m.mnt, "setfacl", &["-m", "u:65534:rx", "t"]);
        let before = snapshot(&t, SNAP);
        for (verb, tag) in [("restore", "link"), ("revert", "link"), ("restore", "file")] {
            let out = chrono_in(&t, None, &[verb, ".", "--at", tag]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{verb} --at {tag}: {err}");
            assert!(
                err.contains("is a directory now; use --to DEST") && err.lines().count() == 1,
                "{verb} --at {tag}: {err}"
            );
            assert_same_tree(&before, &snapshot(&t, SNAP), verb, &m.log_tail());
            assert_eq!(
                fs::symlink_metadata(&t).unwrap().mode() & 0o7777,
                0o750,
                "{verb} --at {tag}"
            );
            assert!(
                get_xattr(&t, "system.posix_acl_access").is_ok(),
                "{verb}: ACL"
            );
            no_staging_left(&t);
        }
        // Elsewhere it can be brought back.
        let out = chrono_in(
            &t,
            None,
            &["restore", ".", "--at", "link", "--to", "../t-then"],
        );
        assert_succeeded(m, &["restore"], &out);
        assert_eq!(
            fs::read_link(m.p("t-then")).unwrap(),
            Path::new("elsewhere")
        );
    });
}

/// With nothing mounted the CLI reads the store directly, and a write to
/// the source directory is recorded nowhere: restore, revert and undelete
/// in it are refused with one line (they wrote it, and could not be
/// undone); a restore to a path outside it is allowed.
#[test]
fn without_a_mount_only_a_restore_outside_the_source_is_allowed() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("d")).unwrap();
        write_file(&m.p("d/f"), b"one\n");
        write_file(&m.p("d/gone"), b"gone\n");
        chrono_ok(m, &["tag", "one"]);
        write_file(&m.p("d/f"), b"two\n");
        fs::remove_file(m.p("d/gone")).unwrap();
        m.unmount();
        let src = m.src.clone();
        let before = snapshot(&src.join("d"), SNAP);
        let out_dir = tempdir();
        let elsewhere = out_dir.path().join("f");
        let f = src.join("d/f");
        let (d, gone, g) = (src.join("d"), src.join("d/gone"), src.join("d/g"));
        let refused: [&[&str]; 4] = [
            &["restore", f.to_str().unwrap(), "--at", "one"],
            &["revert", d.to_str().unwrap(), "--at", "one"],
            &["undelete", gone.to_str().unwrap()],
            &[
                "restore",
                f.to_str().unwrap(),
                "--at",
                "one",
                "--to",
                g.to_str().unwrap(),
            ],
        ];
        for args in refused {
            let out = chrono_in(&src, None, args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.contains("is not mounted: mount it first, or restore --to a path outside it")
                    && err.lines().count() == 1,
                "{args:?}: {err}"
            );
            assert_same_tree(&before, &snapshot(&src.join("d"), SNAP), "unmounted", "");
        }
        let args = [
            "restore",
            f.to_str().unwrap(),
            "--at",
            "one",
            "--to",
            elsewhere.to_str().unwrap(),
        ];
        let out = chrono_in(&src, None, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(read_file(&elsewhere), b"one\n");
        {
            let _serial = history_mount_lock();
            m.start();
        }
        m.wait_history_ready();
    });
}

/// A user who may write a file but does not own it restores its content
/// in place; its mode and xattrs only its owner may set: equal to the
/// recorded ones they are left, and if they differ the restore is refused
/// before anything is written (it wrote the content, then failed with
/// EPERM on the mode).
#[test]
fn a_writer_who_does_not_own_the_file_restores_its_content_or_nothing() {
    each_versioning_mode(|m| {
        let dir = m.p("shared");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let f = dir.join("f");
        write_file(&f, b"then\n");
        fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
        chrono_ok(m, &["tag", "orig"]);
        fs::write(&f, b"now\n").unwrap();
        let out = chrono_as(m, Some(NOBODY), &["restore", "shared/f", "--at", "orig"]);
        assert_succeeded(m, &["restore as nobody"], &out);
        assert_eq!(read_file(&f), b"then\n");
        let st = fs::metadata(&f).unwrap();
        assert_eq!((st.uid(), st.mode() & 0o7777), (0, 0o666));

        fs::write(&f, b"now again\n").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o646)).unwrap();
        let out = chrono_as(m, Some(NOBODY), &["restore", "shared/f", "--at", "orig"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("only its owner"), "{err}");
        assert_eq!(read_file(&f), b"now again\n", "nothing written");
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o646);
    });
}

/// A file rewritten with the same size and its mtime set back (as
/// `touch -r`, `cp -p` or `tar x` leave it) is not the version it looks
/// like: restore and revert bring the version's bytes back (they took
/// the file for restored already and kept the new bytes).
#[test]
fn a_file_rewritten_with_its_old_mtime_is_restored() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("d")).unwrap();
        let (f, g) = (m.p("d/f"), m.p("d/g"));
        write_file(&f, b"then\n");
        write_file(&g, b"kept\n");
        let old = fs::metadata(&f).unwrap().modified().unwrap();
        chrono_ok(m, &["tag", "orig"]);
        let rewrite = |p: &Path| {
            fs::write(p, b"now!\n").unwrap();
            fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(old)
                .unwrap();
        };
        rewrite(&f);
        chrono_ok(m, &["restore", "d/f", "--at", "orig"]);
        assert_eq!(read_file(&f), b"then\n", "restore of the file");
        rewrite(&f);
        let g_ino = fs::metadata(&g).unwrap().ino();
        chrono_ok(m, &["revert", "d", "--at", "orig"]);
        assert_eq!(read_file(&f), b"then\n", "revert of its directory");
        assert_eq!(
            fs::metadata(&g).unwrap().ino(),
            g_ino,
            "an unchanged file stays the object it is"
        );
    });
}

/// A file history never recorded (it predates the mount, `ingest=off`)
/// is its own past: the live file is read. Written to while the restore
/// downloads it, its bytes are a mix of two states: the restore fails and
/// writes nothing (it wrote the mix as the file at that instant).
#[test]
fn a_live_file_written_during_its_download_is_not_restored_as_the_past() {
    let m = Mount::new_with("ingest=off", |src| {
        write_file(&src.join("plan.txt"), &pattern(BIG, 1))
    });
    m.wait_history_ready();
    // A tag names a recorded instant: something else changes first.
    write_file(&m.p("other"), b"other");
    chrono_ok(&m, &["tag", "orig"]);
    let out = during_download(
        &m.mnt,
        &["restore", "plan.txt", "--at", "orig", "--to", "copy.txt"],
        &[".chronofs-staging-", "copy.txt"],
        BIG,
        || {
            use std::os::unix::fs::FileExt;
            let f = fs::OpenOptions::new()
                .write(true)
                .open(m.p("plan.txt"))
                .unwrap();
            f.write_all_at(b"written meanwhile", (BIG - 4096) as u64)
                .unwrap();
        },
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the mix was restored");
    assert!(err.contains("changed while it was read"), "{err}");
    assert!(!m.p("copy.txt").exists());
    no_staging_left(&m.mnt);
    // The write recorded the state before it: that is restored now.
    chrono_ok(
        &m,
        &["restore", "plan.txt", "--at", "orig", "--to", "copy.txt"],
    );
    assert_eq!(fnv(&read_file(&m.p("copy.txt"))), fnv(&pattern(BIG, 1)));
}

/// `revert .` in the mount's root keeps what did not change since T as
/// the objects they are (it rebuilt every entry: device files were
/// dropped, sparse files filled in, hard links split), and brings back
/// device files and sparse files that did change, as they were.
#[test]
fn a_revert_of_the_root_keeps_devices_sparse_files_and_links() {
    use std::os::unix::fs::FileTypeExt;
    each_versioning_mode(|m| {
        let d = m.p("d");
        fs::create_dir(&d).unwrap();
        run(&d, "mknod", &["c", "c", "1", "3"]);
        run(&d, "mknod", &["gone", "c", "1", "5"]);
        write_file(&d.join("f"), b"keep\n");
        fs::hard_link(d.join("f"), m.p("hl")).unwrap();
        let sp = fs::File::create(d.join("sp")).unwrap();
        sp.set_len(1 << 20).unwrap();
        drop(sp);
        let holey = fs::File::create(m.p("holey")).unwrap();
        holey.set_len(1 << 20).unwrap();
        drop(holey);
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        let (c_ino, f_ino) = (ino(&d.join("c")), ino(&d.join("f")));
        chrono_ok(m, &["tag", "orig"]);
        fs::remove_file(d.join("gone")).unwrap();
        fs::write(m.p("holey"), b"filled").unwrap();
        write_file(&m.p("new"), b"new");

        let out = chrono_as(m, None, &["revert", ".", "--at", "orig"]);
        assert_succeeded(m, &["revert"], &out);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("skipping"), "{err}");
        assert_eq!(ino(&d.join("c")), c_ino, "the device file is kept");
        assert_eq!(ino(&d.join("f")), f_ino, "the file is kept");
        assert_eq!(ino(&m.p("hl")), f_ino, "and its other link");
        let gone = fs::symlink_metadata(d.join("gone")).unwrap();
        assert!(gone.file_type().is_char_device(), "{gone:?}");
        assert_eq!(gone.rdev(), fs::metadata("/dev/zero").unwrap().rdev());
        for sparse in [d.join("sp"), m.p("holey")] {
            let md = fs::metadata(&sparse).unwrap();
            assert_eq!(
                (md.len(), md.blocks()),
                (1 << 20, 0),
                "{}",
                sparse.display()
            );
        }
        assert!(!m.p("new").exists());
        no_staging_left(&m.mnt);

        // undelete brings a device file back.
        fs::remove_file(d.join("c")).unwrap();
        chrono_ok(m, &["undelete", "d/c"]);
        let c = fs::symlink_metadata(d.join("c")).unwrap();
        assert!(c.file_type().is_char_device(), "{c:?}");
        no_staging_left(&d);
    });
}
