//! Union mounts through a real mount: `SRC=rw:LOWER1=ro:...`, each case
//! with 1, 2 and 3 read-only branches (the categories of the overlayfs
//! unionmount test suite), in the plain and the versioning mode.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const MODES: [&str; 2] = ["plain", ""];

/// Runs `f` on a union of a read-write branch over `n` read-only ones,
/// for n = 1, 2, 3 and each mode; `setup` fills the branches first
/// (`[upper, lower1, ...]`).
fn each_union(setup: impl Fn(&[PathBuf]), f: impl Fn(&Mount)) {
    for mode in MODES {
        for n in 1..=3 {
            let m = Mount::union(mode, n, &setup);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&m)));
            if let Err(p) = r {
                eprintln!("union of {n} lower branch(es), mode {mode:?}");
                std::panic::resume_unwind(p);
            }
        }
    }
}

/// The lowest branch.
fn bottom(b: &[PathBuf]) -> &Path {
    b.last().unwrap()
}

fn is_whiteout(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

fn lower_tree(b: &[PathBuf]) {
    // Each branch holds its own file, every branch a file `shared` and a
    // directory `d` with its own entry: the top copy of `shared` wins,
    // `d` merges.
    for (i, br) in b.iter().enumerate().skip(1) {
        write_file(
            &br.join(format!("only{i}")),
            format!("only {i}\n").as_bytes(),
        );
        write_file(&br.join("shared"), format!("from {i}\n").as_bytes());
        fs::create_dir_all(br.join("d")).unwrap();
        write_file(&br.join(format!("d/in{i}")), b"x");
    }
    let low = bottom(b);
    write_file(&low.join("data"), b"lower data\n");
    fs::create_dir_all(low.join("tree/sub")).unwrap();
    write_file(&low.join("tree/sub/leaf"), b"leaf");
    write_file(&low.join("tree/top"), b"top");
}

#[test]
fn lookups_and_listings_merge_the_branches() {
    each_union(lower_tree, |m| {
        let n = m.lowers.len();
        assert_eq!(read_file(&m.p("shared")), b"from 1\n", "the top copy wins");
        let mut want: BTreeSet<String> = ["d", "data", "shared", "tree"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut want_d = BTreeSet::new();
        for i in 1..=n {
            want.insert(format!("only{i}"));
            want_d.insert(format!("in{i}"));
            assert_eq!(
                read_file(&m.p(&format!("only{i}"))),
                format!("only {i}\n").as_bytes()
            );
        }
        assert_eq!(names(&m.mnt), want.into_iter().collect::<Vec<_>>());
        assert_eq!(names(&m.p("d")), want_d.into_iter().collect::<Vec<_>>());
        assert_eq!(read_file(&m.p("tree/sub/leaf")), b"leaf");
        let a = fs::metadata(m.p("data")).unwrap().ino();
        let b = fs::metadata(m.p("d")).unwrap().ino();
        assert_ne!(a, b);
        assert_eq!(a, fs::metadata(m.p("data")).unwrap().ino(), "stable");
    });
}

#[test]
fn changes_copy_up_and_keep_the_inode_number() {
    each_union(lower_tree, |m| {
        let low = m.lowers.last().unwrap();
        let ino = fs::metadata(m.p("data")).unwrap().ino();
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(m.p("data"))
            .unwrap();
        use std::io::Write;
        f.write_all(b"more\n").unwrap();
        drop(f);
        assert_eq!(read_file(&m.p("data")), b"lower data\nmore\n");
        assert_eq!(
            read_file(&low.join("data")),
            b"lower data\n",
            "lower untouched"
        );
        assert_eq!(read_file(&m.src.join("data")), b"lower data\nmore\n");
        assert_eq!(fs::metadata(m.p("data")).unwrap().ino(), ino, "same inode");

        // A file deep in a lower tree: its parents are made in the upper
        // branch with the lower ones' modes.
        fs::set_permissions(low.join("tree/sub"), fs::Permissions::from_mode(0o750)).unwrap();
        fs::set_permissions(m.p("tree/sub/leaf"), fs::Permissions::from_mode(0o600)).unwrap();
        let up = fs::metadata(m.src.join("tree/sub/leaf")).unwrap();
        assert_eq!(up.mode() & 0o7777, 0o600);
        assert_eq!(read_file(&m.src.join("tree/sub/leaf")), b"leaf");
        let sub = fs::metadata(m.src.join("tree/sub")).unwrap();
        assert_eq!(sub.mode() & 0o7777, 0o750);
        assert_eq!(
            fs::metadata(low.join("tree/sub/leaf")).unwrap().mode() & 0o7777,
            0o644
        );

        // O_TRUNC of a lower file.
        fs::write(m.p("tree/top"), b"new").unwrap();
        assert_eq!(read_file(&m.p("tree/top")), b"new");
        assert_eq!(read_file(&low.join("tree/top")), b"top");

        // xattrs.
        set_xattr(&m.p("only1"), "user.k", b"v", 0).unwrap();
        assert_eq!(get_xattr(&m.p("only1"), "user.k").unwrap(), b"v");
        assert!(get_xattr(&m.lowers[0].join("only1"), "user.k").is_err());
    });
}

/// chown of a lower file and of a lower symlink copies it up: the new
/// owner shows, the read-only branch keeps its own, the number stays.
#[test]
fn chown_copies_up() {
    use std::os::unix::fs::{chown, lchown};
    each_union(
        |b| {
            write_file(&bottom(b).join("owned"), b"data");
            std::os::unix::fs::symlink("owned", bottom(b).join("link")).unwrap();
        },
        |m| {
            let low = m.lowers.last().unwrap();
            let ino = fs::metadata(m.p("owned")).unwrap().ino();
            chown(m.p("owned"), Some(4242), Some(4343)).unwrap();
            lchown(m.p("link"), Some(4444), None).unwrap();
            let up = fs::metadata(m.p("owned")).unwrap();
            assert_eq!((up.uid(), up.gid(), up.ino()), (4242, 4343, ino));
            assert_eq!(read_file(&m.p("owned")), b"data");
            assert_eq!(fs::symlink_metadata(m.p("link")).unwrap().uid(), 4444);
            assert_eq!(fs::read_link(m.p("link")).unwrap(), Path::new("owned"));
            assert_eq!(fs::metadata(m.src.join("owned")).unwrap().uid(), 4242);
            let below = fs::metadata(low.join("owned")).unwrap();
            assert_eq!((below.uid(), below.gid()), (0, 0), "lower untouched");
            assert_eq!(fs::symlink_metadata(low.join("link")).unwrap().uid(), 0);
        },
    );
}

/// An xattr read while the file is open comes from the object its name
/// shows now: a descriptor opened before a copy-up still holds the lower
/// file, whose xattrs the copy-up left behind.
#[test]
fn xattrs_read_while_a_lower_file_is_open_follow_its_copy_up() {
    let m = Mount::union("plain", 1, |b| {
        fs::write(b[1].join("f"), b"low").unwrap();
        set_xattr(&b[1].join("f"), "user.k", b"lower", 0).unwrap();
    });
    let reader = fs::File::open(m.p("f")).unwrap();
    assert_eq!(get_xattr(&m.p("f"), "user.k").unwrap(), b"lower");
    set_xattr(&m.p("f"), "user.k", b"upper", 0).unwrap();
    assert_eq!(get_xattr(&m.p("f"), "user.k").unwrap(), b"upper");
    let writer = fs::OpenOptions::new().append(true).open(m.p("f")).unwrap();
    set_xattr(&m.p("f"), "user.k", b"again", 0).unwrap();
    assert_eq!(get_xattr(&m.p("f"), "user.k").unwrap(), b"again");
    assert_eq!(
        get_xattr(&m.lowers[0].join("f"), "user.k").unwrap(),
        b"lower"
    );
    drop((reader, writer));
}

#[test]
fn unlink_whites_out_a_lower_name() {
    each_union(lower_tree, |m| {
        fs::remove_file(m.p("shared")).unwrap();
        assert_eq!(e(fs::metadata(m.p("shared"))).unwrap_err(), libc::ENOENT);
        assert!(!names(&m.mnt).contains(&"shared".to_string()));
        assert!(is_whiteout(&m.src.join("shared")));
        for l in &m.lowers {
            assert!(l.join("shared").exists(), "lower branches untouched");
        }
        write_file(&m.p("shared"), b"again");
        assert_eq!(read_file(&m.p("shared")), b"again");
        fs::remove_file(m.p("shared")).unwrap();
        assert!(!m.p("shared").exists());
        assert!(is_whiteout(&m.src.join("shared")));
    });
}

#[test]
fn rmdir_sees_the_merged_listing_and_a_new_directory_is_opaque() {
    each_union(lower_tree, |m| {
        assert_eq!(e(fs::remove_dir(m.p("tree"))).unwrap_err(), libc::ENOTEMPTY);
        fs::remove_dir_all(m.p("tree")).unwrap();
        assert!(!m.p("tree").exists());
        fs::create_dir(m.p("tree")).unwrap();
        assert!(names(&m.p("tree")).is_empty(), "lower entries stay hidden");
        assert_eq!(
            get_xattr(&m.src.join("tree"), "trusted.overlay.opaque").unwrap(),
            b"y"
        );
        // The marker is the union's, not the directory's.
        assert!(!list_xattr(&m.p("tree"))
            .unwrap()
            .iter()
            .any(|n| n.contains("overlay")));
        assert_eq!(
            get_xattr(&m.p("tree"), "trusted.overlay.opaque").unwrap_err(),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            set_xattr(&m.p("tree"), "trusted.overlay.opaque", b"n", 0).unwrap_err(),
            libc::EOPNOTSUPP
        );
        write_file(&m.p("tree/x"), b"1");
        assert_eq!(names(&m.p("tree")), vec!["x"]);
        fs::remove_file(m.p("tree/x")).unwrap();
        fs::remove_dir(m.p("tree")).unwrap();
        assert!(!m.p("tree").exists());
    });
}

#[test]
fn renames_of_lower_files_never_fail_with_exdev() {
    each_union(lower_tree, |m| {
        let ino = fs::metadata(m.p("data")).unwrap().ino();
        fs::rename(m.p("data"), m.p("renamed")).unwrap();
        assert!(!m.p("data").exists());
        assert_eq!(read_file(&m.p("renamed")), b"lower data\n");
        assert_eq!(fs::metadata(m.p("renamed")).unwrap().ino(), ino);
        // Over a lower file, into a lower directory.
        fs::rename(m.p("renamed"), m.p("shared")).unwrap();
        assert_eq!(read_file(&m.p("shared")), b"lower data\n");
        fs::rename(m.p("shared"), m.p("tree/sub/moved")).unwrap();
        assert_eq!(read_file(&m.p("tree/sub/moved")), b"lower data\n");
        assert!(!m.p("shared").exists());
        let mut want = vec!["leaf".to_string(), "moved".to_string()];
        want.sort();
        assert_eq!(names(&m.p("tree/sub")), want);
    });
}

#[test]
fn symlinks_and_links_to_lower_files() {
    each_union(
        |b| {
            lower_tree(b);
            std::os::unix::fs::symlink("data", bottom(b).join("ln")).unwrap();
        },
        |m| {
            assert_eq!(read_file(&m.p("ln")), b"lower data\n");
            std::os::unix::fs::symlink("tree/top", m.p("up-ln")).unwrap();
            assert_eq!(read_file(&m.p("up-ln")), b"top");
            fs::hard_link(m.p("data"), m.p("data2")).unwrap();
            let a = fs::metadata(m.p("data")).unwrap();
            let b = fs::metadata(m.p("data2")).unwrap();
            assert_eq!(a.ino(), b.ino());
            assert_eq!(a.nlink(), 2);
            assert_eq!(read_file(&m.p("data2")), b"lower data\n");
        },
    );
}

/// Reads `dir` with readdir(3), stopping after `first` entries and taking
/// the telldir cookie there; then, after `between`, reopens and seekdirs
/// to it.
fn read_resumed(dir: &Path, first: usize, between: impl Fn()) -> (Vec<String>, Vec<String>) {
    let c = cstr(dir);
    // SAFETY: libc directory streams on a path we own, closed below.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null());
        let mut head = Vec::new();
        while head.len() < first {
            let e = libc::readdir(d);
            assert!(!e.is_null());
            head.push(
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        let cookie = libc::telldir(d);
        libc::closedir(d);
        between();
        let d = libc::opendir(c.as_ptr());
        libc::seekdir(d, cookie);
        let mut tail = Vec::new();
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            tail.push(
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        libc::closedir(d);
        (head, tail)
    }
}

#[test]
fn directory_offsets_survive_a_reopen() {
    each_union(
        |b| {
            for (i, br) in b.iter().enumerate() {
                fs::create_dir(br.join("big")).unwrap();
                for j in 0..200 {
                    write_file(&br.join(format!("big/f{i}-{j}")), b"");
                    write_file(&br.join(format!("big/common{j}")), b"");
                }
            }
        },
        |m| {
            let n = m.lowers.len() + 1;
            let whole = |(head, tail): (Vec<String>, Vec<String>)| {
                let mut all: Vec<String> = head.into_iter().chain(tail).collect();
                let total = all.len();
                all.sort();
                all.dedup();
                assert_eq!(all.len(), total, "no entry twice");
                assert_eq!(total, 2 + 200 * n + 200, "none missing");
            };
            // Resumed from the kernel's cached listing.
            wait_listing_cached(&m.p("big"), &m.src.join("big"));
            whole(read_resumed(&m.p("big"), 150, || {}));
            // Resumed by the daemon: a change between the two opens makes
            // the kernel drop its listing, so the seek sends the cookie
            // in a READDIR.
            whole(read_resumed(&m.p("big"), 150, || {
                write_file(&m.p("big/passing"), b"");
                fs::remove_file(m.p("big/passing")).unwrap();
            }));
        },
    );
}

/// Two branch directories and a mount point, outside any harness mount.
fn two_branches() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let dir = tempdir();
    let [a, b, mnt] = ["a", "b", "m"].map(|n| dir.path().join(n));
    for d in [&a, &b, &mnt] {
        fs::create_dir(d).unwrap();
    }
    (dir, a, b, mnt)
}

/// Runs a chronofs command that must succeed; its output.
fn cli_ok(args: &[&str]) -> Vec<u8> {
    let out = Command::new(bin()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn chronofs(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(bin()).args(args).output().unwrap()
}

#[test]
fn bad_branch_lists_are_refused_with_one_line() {
    let (dir, a, b, mnt) = two_branches();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    write_file(&a.join("f"), b"");
    fs::create_dir(a.join("sub")).unwrap();
    fs::create_dir(mnt.join("in")).unwrap();
    std::os::unix::fs::symlink(&a, dir.path().join("alias")).unwrap();
    let alias = dir.path().join("alias");
    let before = [&a, &b, &mnt].map(|d| snapshot(d, SNAP_ALL));
    // Exit 2 for a list malformed as written, 1 for branches that
    // cannot be used.
    for (arg, says) in [
        (format!("{}=rw:{}=rx", s(&a), s(&b)), "unknown mode"),
        (format!("{}:{}/missing", s(&a), s(&b)), "missing"),
        (format!("{}::{}", s(&a), s(&b)), "empty"),
        (format!(":{}", s(&a)), "empty"),
        (format!("{}:{}/f", s(&a), s(&a)), "not a directory"),
        (format!("{}=rw:{}=ro", s(&a), s(&a)), "again"),
        (format!("{}=rw:{}=ro", s(&a), s(&alias)), "again"),
        (format!("{}=rw:{}/sub=ro", s(&a), s(&a)), "inside branch"),
        (format!("{}/sub=rw:{}=ro", s(&a), s(&a)), "contains"),
        (
            format!("{}=rw:{}/in=ro", s(&a), s(&mnt)),
            "inside the mount point",
        ),
    ] {
        let out = chronofs(&["mount".as_ref(), arg.as_ref(), mnt.as_os_str()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{arg} was accepted");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{arg}: {err}");
        let usage = matches!(says, "unknown mode" | "empty");
        assert_eq!(out.status.code(), Some(if usage { 2 } else { 1 }), "{arg}");
        assert!(!is_mounted(&mnt));
        // Nothing made or changed: no store, no index, no claim mark.
        let after = [&a, &b, &mnt].map(|d| snapshot(d, SNAP_ALL));
        assert_eq!(after, before, "{arg} changed a branch");
        assert!(!a.join(".chronofs").exists(), "{arg}");
    }
}

#[test]
fn a_union_of_read_only_branches_refuses_changes_with_erofs() {
    let (dir, a, b, mnt) = two_branches();
    write_file(&b.join("f"), b"b");
    let arg = format!("{}=ro:{}=ro", a.display(), b.display());
    let refused = chronofs(&["mount".as_ref(), arg.as_ref(), mnt.as_os_str()]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("-o store="), "no place for the store: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!is_mounted(&mnt));
    assert!(!a.join(".chronofs").exists() && !b.join(".chronofs").exists());
    let out = chronofs(&[
        "mount".as_ref(),
        arg.as_ref(),
        mnt.as_os_str(),
        "-o".as_ref(),
        format!("plain,store={}", dir.path().join("store").display()).as_ref(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = std::panic::catch_unwind(|| {
        assert_eq!(read_file(&mnt.join("f")), b"b");
        assert_eq!(e(fs::write(mnt.join("new"), b"")).unwrap_err(), libc::EROFS);
        assert_eq!(
            e(fs::OpenOptions::new().append(true).open(mnt.join("f"))).unwrap_err(),
            libc::EROFS
        );
        assert_eq!(e(fs::remove_file(mnt.join("f"))).unwrap_err(), libc::EROFS);
    });
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    assert!(
        !a.join(".chronofs").exists(),
        "nothing written to a read-only branch"
    );
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn history_records_what_the_user_sees_and_copy_up_is_not_a_change() {
    let m = Mount::union("", 2, lower_tree);
    m.wait_history_ready();
    let path = m.p("data");
    let p = path.to_str().unwrap();
    // Reading through the mount changes nothing.
    assert_eq!(read_file(&path), b"lower data\n");
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    use std::io::Write;
    f.write_all(b"more\n").unwrap();
    drop(f);
    let log: serde_json::Value = serde_json::from_slice(&cli_ok(&["log", p, "--json"])).unwrap();
    let versions = log["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "the lower state, then the change: {log}");
    assert_eq!(cli_ok(&["cat", p, "--version", "1"]), b"lower data\n");
    assert_eq!(cli_ok(&["cat", p, "--version", "2"]), b"lower data\nmore\n");
}

#[test]
fn renames_of_populated_lower_directories_move_nothing_below() {
    each_union(lower_tree, |m| {
        let ino = fs::metadata(m.p("tree")).unwrap().ino();
        fs::rename(m.p("tree"), m.p("moved")).unwrap();
        assert!(!m.p("tree").exists());
        assert_eq!(names(&m.p("moved")), vec!["sub", "top"]);
        assert_eq!(read_file(&m.p("moved/sub/leaf")), b"leaf");
        assert_eq!(fs::metadata(m.p("moved")).unwrap().ino(), ino);
        // Nothing below was copied: the upper copy is an empty directory
        // that says where its lower copies are.
        assert!(names(&m.src.join("moved")).is_empty());
        assert_eq!(
            get_xattr(&m.src.join("moved"), "trusted.overlay.redirect").unwrap(),
            b"/tree"
        );
        // Moved again, deeper, and changed there.
        fs::create_dir(m.p("a")).unwrap();
        fs::rename(m.p("moved/sub"), m.p("a/sub2")).unwrap();
        write_file(&m.p("a/sub2/new"), b"n");
        assert_eq!(names(&m.p("a/sub2")), vec!["leaf", "new"]);
        assert_eq!(names(&m.p("moved")), vec!["top"]);
        // A directory of the lower branch at the new name does not merge in.
        fs::rename(m.p("a/sub2"), m.p("d")).unwrap_err();
        // And the lower branch is as it was.
        assert_eq!(
            read_file(&m.lowers.last().unwrap().join("tree/sub/leaf")),
            b"leaf"
        );
    });
}

fn append(p: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    fs::OpenOptions::new().append(true).open(p)?.write_all(data)
}

#[test]
fn copy_up_ownership_follows_the_copyup_owner_option() {
    let setup = |b: &[PathBuf]| {
        let f = bottom(b).join("f");
        write_file(&f, b"x");
        fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
        std::os::unix::fs::chown(&f, Some(1234), Some(1234)).unwrap();
        let tmp = bottom(b).join("tmp");
        fs::create_dir(&tmp).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)).unwrap();
        write_file(&tmp.join("theirs"), b"t");
        std::os::unix::fs::chown(tmp.join("theirs"), Some(1234), Some(1234)).unwrap();
    };
    // keep (the default): the lower file's owner and mode.
    let m = Mount::union("plain", 1, setup);
    append(&m.p("f"), b"y").unwrap();
    let st = fs::metadata(m.src.join("f")).unwrap();
    assert_eq!(
        (st.uid(), st.gid(), st.mode() & 0o7777),
        (1234, 1234, 0o666)
    );
    drop(m);
    // fixed: the given owner and mode.
    let m = Mount::union("plain,copyup-owner=fixed:1000:1001:0640", 1, setup);
    append(&m.p("f"), b"y").unwrap();
    let st = fs::metadata(m.src.join("f")).unwrap();
    assert_eq!(
        (st.uid(), st.gid(), st.mode() & 0o7777),
        (1000, 1001, 0o640)
    );
    drop(m);
    // caller: whoever made the change.
    let m = Mount::union("plain,copyup-owner=caller", 1, setup);
    let p = m.p("f");
    assert_eq!(as_nobody(|| rc(e(append(&p, b"y")))), 0);
    let st = fs::metadata(m.src.join("f")).unwrap();
    assert_eq!((st.uid(), st.mode() & 0o7777), (NOBODY, 0o666));
    assert_eq!(read_file(&m.p("f")), b"xy");
    // A directory copied up keeps its owner: the caller's own would let
    // them remove others' files from a sticky directory.
    let (mine, theirs) = (m.p("tmp/mine"), m.p("tmp/theirs"));
    assert_eq!(as_nobody(|| rc(e(fs::write(&mine, b"m")))), 0);
    let st = fs::metadata(m.src.join("tmp")).unwrap();
    assert_eq!((st.uid(), st.mode() & 0o7777), (0, 0o1777));
    assert_eq!(as_nobody(|| rc(e(fs::remove_file(&theirs)))), libc::EPERM);
    assert_eq!(fs::metadata(m.src.join("tmp/mine")).unwrap().uid(), NOBODY);
}

/// The mount helper's form (`chronofs SRC MNT -o OPTS`, as mount.fuse3 and
/// fstab run it) takes a branch list like `chronofs mount` does.
#[test]
fn the_mount_helper_form_mounts_a_union() {
    let (_dir, a, b, mnt) = two_branches();
    write_file(&b.join("low"), b"low");
    write_file(&a.join("up"), b"up");
    let arg = format!("{}=rw:{}=ro", a.display(), b.display());
    let out = chronofs(&[
        arg.as_ref(),
        mnt.as_os_str(),
        "-o".as_ref(),
        "plain".as_ref(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = names(&mnt);
    let _ = Command::new(bin()).arg("umount").arg(&mnt).status();
    assert_eq!(listed, vec!["low", "up"]);
    assert!(!is_mounted(&mnt));
}

/// Undelete and restore on a union: history holds what the user saw,
/// whichever branch held it; bringing it back writes to the upper branch.
#[test]
fn undelete_and_restore_work_on_a_union() {
    let m = Mount::union("", 2, lower_tree);
    m.wait_history_ready();
    let low = m.lowers.last().unwrap();
    // A lower file, changed (copied up), then removed (whited out).
    append(&m.p("data"), b"+").unwrap();
    fs::remove_file(m.p("data")).unwrap();
    assert!(!m.p("data").exists());
    cli_ok(&["undelete", m.p("data").to_str().unwrap()]);
    assert_eq!(read_file(&m.p("data")), b"lower data\n+");
    assert_eq!(read_file(&m.src.join("data")), b"lower data\n+");
    assert_eq!(
        read_file(&low.join("data")),
        b"lower data\n",
        "lower untouched"
    );
    // A lower tree removed whole comes back whole.
    fs::remove_dir_all(m.p("tree")).unwrap();
    cli_ok(&["undelete", m.p("tree").to_str().unwrap()]);
    assert_eq!(read_file(&m.p("tree/top")), b"top");
    assert_eq!(read_file(&m.p("tree/sub/leaf")), b"leaf");
    // The versions span the copy-up: the first is the lower file's.
    let p = m.p("data");
    assert_eq!(
        cli_ok(&["cat", p.to_str().unwrap(), "--version", "1"]),
        b"lower data\n"
    );
}

/// `DIR/;deleted/` of a union lists the lower names the union removed:
/// the upper copy of the directory holds their whiteouts, which counted
/// as the names being there (only names made and removed in the upper
/// branch were listed, and `cat DIR/;deleted/NAME` was ENOENT).
#[test]
fn the_deleted_view_lists_lower_names_a_whiteout_hides() {
    let m = Mount::union("", 2, lower_tree);
    m.wait_history_ready();
    fs::remove_file(m.p("tree/top")).unwrap();
    fs::remove_file(m.p("data")).unwrap();
    assert!(is_whiteout(&m.src.join("tree/top")));
    assert_eq!(names(&m.p("tree/;deleted")), vec!["top"]);
    assert!(names(&m.p(";deleted")).contains(&"data".to_string()));
    assert_eq!(read_file(&m.p("tree/;deleted/top")), b"top");
    assert_eq!(read_file(&m.p(";deleted/data")), b"lower data\n");
}

/// Marks `rel` in branch `br` as overlayfs (`metacopy=on`) leaves a file
/// whose metadata alone it copied up: a hole of `len` bytes carrying
/// `overlay.metacopy`, its data the lower file's.
fn metacopy_file(br: &Path, rel: &str, len: u64) {
    let f = fs::File::create(br.join(rel)).unwrap();
    f.set_len(len).unwrap();
    set_xattr(&br.join(rel), "trusted.overlay.metacopy", b"", 0).unwrap();
}

/// A branch overlayfs wrote with `metacopy=on` holds files whose data
/// is a lower file's. chronofs does not follow it: such a file read as
/// zeros of the right size, and a change (or a copy-up of one in a
/// read-only branch) kept the zeros as its data. Now opens and copy-ups
/// of it fail with EIO, and fsck names it.
#[test]
fn overlayfs_metacopy_files_are_refused_not_read_as_zeros() {
    let mut m = Mount::union("plain", 2, |b| {
        lower_tree(b);
        metacopy_file(&b[0], "data", 11);
        write_file(&b[2].join("meta"), b"lowest\n");
        metacopy_file(&b[1], "meta", 7);
    });
    assert_eq!(fs::metadata(m.p("data")).unwrap().len(), 11);
    assert_eq!(e(fs::read(m.p("data"))).unwrap_err(), libc::EIO);
    assert_eq!(e(append(&m.p("data"), b"+")).unwrap_err(), libc::EIO);
    let chmod = fs::set_permissions(m.p("meta"), fs::Permissions::from_mode(0o600));
    assert_eq!(e(chmod).unwrap_err(), libc::EIO, "no copy of the hole");
    assert!(!m.src.join("meta").exists());
    assert_eq!(e(fs::read(m.p("meta"))).unwrap_err(), libc::EIO);
    assert_eq!(fs::metadata(m.src.join("data")).unwrap().len(), 11);
    assert!(get_xattr(&m.src.join("data"), "trusted.overlay.metacopy").is_ok());
    m.unmount();
    let list = format!(
        "{}=rw:{}=ro:{}=ro",
        m.src.display(),
        m.lowers[0].display(),
        m.lowers[1].display()
    );
    let out = Command::new(bin()).args(["fsck", &list]).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "{report}");
    for name in ["data", "meta"] {
        assert!(
            report
                .lines()
                .any(|l| l.contains(&format!(": {name}: ")) && l.contains("metacopy")),
            "{report}"
        );
    }
}

/// A lower file with two names, copied up through the union's index: its
/// index name and count are the mount's, so history neither shows nor
/// restores them (restore refused with EOPNOTSUPP setting them through
/// the mount, after having changed the file in place).
#[test]
fn a_linked_file_copied_up_restores_and_reverts() {
    let m = Mount::union("", 1, |b| {
        fs::write(b[1].join("a"), b"hl\n").unwrap();
        fs::hard_link(b[1].join("a"), b[1].join("b")).unwrap();
    });
    m.wait_history_ready();
    append(&m.p("a"), b"x\n").unwrap();
    cli_ok(&["tag", "t1", "--path", m.mnt.to_str().unwrap()]);
    append(&m.p("a"), b"w\n").unwrap();
    let names = xattr_names(&m.p(".history/@t1/a"));
    assert!(names.iter().all(|n| !n.contains("overlay")), "{names:?}");
    let (a, old) = (m.p("a"), m.p("a.old"));
    cli_ok(&[
        "restore",
        a.to_str().unwrap(),
        "--at",
        "t1",
        "--to",
        old.to_str().unwrap(),
    ]);
    assert_eq!(read_file(&old), b"hl\nx\n");
    cli_ok(&["restore", a.to_str().unwrap(), "--at", "t1"]);
    assert_eq!(read_file(&m.p("b")), b"hl\nx\n");
    append(&m.p("b"), b"w2\n").unwrap();
    cli_ok(&["revert", m.mnt.to_str().unwrap(), "--at", "t1"]);
    assert_eq!(read_file(&m.p("a")), b"hl\nx\n");
    assert!(!m.p("a.old").exists());
    let (sa, sb) = (
        fs::metadata(m.p("a")).unwrap(),
        fs::metadata(m.p("b")).unwrap(),
    );
    assert_eq!((sa.ino(), sa.nlink()), (sb.ino(), 2), "still one file");
}

/// Hard links of a lower file keep one identity across copy-up (the
/// union's index): one number for every name before and after, every name
/// shows the copied-up data, st_nlink counts the names a user can reach,
/// across a remount; the index entry goes with the last name.
#[test]
fn hard_links_keep_their_identity_across_copy_up() {
    for mode in MODES {
        for n in 1..=3 {
            let mut m = Mount::union(mode, n, |b| {
                write_file(&bottom(b).join("f"), b"a");
                fs::create_dir(bottom(b).join("d")).unwrap();
                fs::hard_link(bottom(b).join("f"), bottom(b).join("g")).unwrap();
                fs::hard_link(bottom(b).join("f"), bottom(b).join("d/h")).unwrap();
            });
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hard_link_case(&mut m)));
            if let Err(p) = r {
                eprintln!("union of {n} lower branch(es), mode {mode:?}");
                std::panic::resume_unwind(p);
            }
        }
    }
}

fn hard_link_case(m: &mut Mount) {
    let ino = fs::metadata(m.p("f")).unwrap().ino();
    let same = |m: &Mount, names: &[&str], data: &[u8], nlink: u64| {
        for name in names {
            let md = fs::metadata(m.p(name)).unwrap();
            assert_eq!((md.ino(), md.nlink()), (ino, nlink), "{name}");
            assert_eq!(read_file(&m.p(name)), data, "{name}");
        }
    };
    same(m, &["f", "g", "d/h"], b"a", 3);
    append(&m.p("f"), b"b").unwrap();
    same(m, &["f", "g", "d/h"], b"ab", 3);
    // A second name's copy-up links to the same copy.
    append(&m.p("d/h"), b"c").unwrap();
    same(m, &["f", "g", "d/h"], b"abc", 3);
    fs::remove_file(m.p("g")).unwrap();
    same(m, &["f", "d/h"], b"abc", 2);
    fs::hard_link(m.p("f"), m.p("f2")).unwrap();
    same(m, &["f", "d/h", "f2"], b"abc", 3);
    assert!(!names(&m.mnt).contains(&".chronofs-index".to_string()));
    assert!(fs::metadata(m.p(".chronofs-index")).is_err());
    assert!(fs::create_dir(m.p(".chronofs-index")).is_err());
    m.remount();
    same(m, &["f", "d/h", "f2"], b"abc", 3);
    assert!(fs::metadata(m.p("g")).is_err());
    for name in ["f", "d/h", "f2"] {
        fs::remove_file(m.p(name)).unwrap();
    }
    let index = m.src.join(".chronofs-index");
    assert_eq!(
        names(&index),
        Vec::<String>::new(),
        "index entry left behind"
    );
}

/// A hard-linked lower symlink, FIFO and device keep one identity across
/// copy-up too (overlayfs indexes every non-directory): a change through
/// one name shows through the others under the same number, a link made
/// through the mount counts, and all of it survives a remount.
#[test]
fn hard_linked_symlinks_fifos_and_devices_keep_their_identity_across_copy_up() {
    use std::os::unix::fs::FileTypeExt;
    for mode in MODES {
        for n in 1..=3 {
            let mut m = Mount::union(mode, n, |b| {
                let low = bottom(b);
                std::os::unix::fs::symlink("target", low.join("s")).unwrap();
                sys::mkfifo(&cstr(low.join("p")), 0o644).unwrap();
                sys::mknod(
                    &cstr(low.join("c")),
                    libc::S_IFCHR | 0o644,
                    libc::makedev(1, 3),
                )
                .unwrap();
                fs::create_dir(low.join("d")).unwrap();
                for name in ["s", "p", "c"] {
                    fs::hard_link(low.join(name), low.join(format!("d/{name}2"))).unwrap();
                }
            });
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                linked_specials_case(&mut m)
            }));
            if let Err(p) = r {
                eprintln!("union of {n} lower branch(es), mode {mode:?}");
                std::panic::resume_unwind(p);
            }
        }
    }
    fn linked_specials_case(m: &mut Mount) {
        let lstat = |m: &Mount, p: &str| fs::symlink_metadata(m.p(p)).unwrap();
        let ino: BTreeMap<&str, u64> = ["s", "p", "c"].map(|n| (n, lstat(m, n).ino())).into();
        let same = |m: &Mount, name: &str, names: &[String], nlink: u64, uid: u32, perm: u32| {
            for p in names {
                let md = lstat(m, p);
                assert_eq!((md.ino(), md.nlink()), (ino[name], nlink), "{p}");
                assert_eq!(md.uid(), uid, "{p}");
                if name != "s" {
                    assert_eq!(md.mode() & 0o7777, perm, "{p}");
                }
                match name {
                    "s" => assert_eq!(fs::read_link(m.p(p)).unwrap(), Path::new("target")),
                    "p" => assert!(md.file_type().is_fifo(), "{p}"),
                    _ => assert_eq!(md.rdev(), libc::makedev(1, 3), "{p}"),
                }
            }
        };
        let two = |n: &str| vec![n.to_string(), format!("d/{n}2")];
        for n in ["s", "p", "c"] {
            same(m, n, &two(n), 2, 0, 0o644);
        }
        // Copy-ups through the name in the subdirectory, then the other.
        sys::lchown(&cstr(m.p("d/s2")), 1234, 1234).unwrap();
        fs::set_permissions(m.p("d/p2"), fs::Permissions::from_mode(0o600)).unwrap();
        sys::lchown(&cstr(m.p("c")), 1234, 1234).unwrap();
        same(m, "s", &two("s"), 2, 1234, 0);
        same(m, "p", &two("p"), 2, 0, 0o600);
        same(m, "c", &two("c"), 2, 1234, 0o644);
        // A link through the mount names the same copy.
        for n in ["s", "p", "c"] {
            fs::hard_link(m.p(n), m.p(&format!("{n}3"))).unwrap();
        }
        let three = |n: &str| vec![n.to_string(), format!("d/{n}2"), format!("{n}3")];
        same(m, "s", &three("s"), 3, 1234, 0);
        let listed = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let (s_names, p_names) = (listed(&["s", "s3", "s4"]), listed(&["p", "p3"]));
        fs::rename(m.p("d/s2"), m.p("s4")).unwrap();
        same(m, "s", &s_names, 3, 1234, 0);
        fs::remove_file(m.p("d/p2")).unwrap();
        same(m, "p", &p_names, 2, 0, 0o600);
        m.remount();
        same(m, "s", &s_names, 3, 1234, 0);
        same(m, "p", &p_names, 2, 0, 0o600);
        same(m, "c", &three("c"), 3, 1234, 0o644);
        for p in s_names.iter().chain(&p_names).chain(&three("c")) {
            fs::remove_file(m.p(p)).unwrap();
        }
        assert_eq!(
            names(&m.src.join(".chronofs-index")),
            Vec::<String>::new(),
            "index entry left behind"
        );
    }
}

/// The first mount's baseline walk covers the union as the user sees it:
/// files held only by read-only branches (in directories of their own) get
/// their baseline, a name shadowed above is recorded with the top copy's
/// content, and a whited-out name is not recorded.
#[test]
fn the_first_mount_records_the_whole_union() {
    for n in 1..=3 {
        let m = Mount::union("", n, |b| {
            lower_tree(b);
            write_file(&b[0].join("shared"), b"from the top\n");
        });
        let mnt = m.mnt.to_str().unwrap().to_string();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let st: serde_json::Value =
                serde_json::from_slice(&cli_ok(&["status", &mnt, "--json"])).unwrap();
            if st["ingest"]["complete"] == serde_json::Value::Bool(true) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no ingest: {st}");
            std::thread::yield_now();
        }
        let first = |rel: &str| {
            let p = m.p(rel);
            cli_ok(&["cat", p.to_str().unwrap(), "--version", "1"])
        };
        assert_eq!(first("tree/sub/leaf"), b"leaf", "{n} lower branch(es)");
        assert_eq!(first("data"), b"lower data\n");
        assert_eq!(first("shared"), b"from the top\n");
        assert_eq!(first(&format!("d/in{n}")), b"x");
    }
}

/// Runs a chronofs command inside the mount; it must succeed.
fn cli_in(m: &Mount, args: &[&str]) -> Vec<u8> {
    let out = Command::new(bin())
        .args(args)
        .current_dir(&m.mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `.history/@T/` of a union shows the union as it was (merged, lower
/// copies and all), and `revert --at T` brings the union back to it, with
/// the read-only branches never written.
#[test]
fn time_travel_and_revert_show_and_restore_the_union_as_it_was() {
    for n in 1..=3 {
        let m = Mount::union("", n, lower_tree);
        m.wait_history_ready();
        let before: Vec<_> = m.lowers.iter().map(|l| tree_of(l)).collect();
        let merged_d = names(&m.p("d"));
        cli_in(&m, &["tag", "t1"]);
        append(&m.p("data"), b"+").unwrap();
        fs::remove_file(m.p("tree/top")).unwrap();
        fs::rename(m.p("d"), m.p("d2")).unwrap();
        write_file(&m.p("new"), b"new\n");
        let then = m.p(".history/@t1");
        assert_eq!(read_file(&then.join("data")), b"lower data\n", "{n}");
        assert_eq!(read_file(&then.join("tree/top")), b"top");
        assert_eq!(names(&then.join("d")), merged_d);
        assert!(!then.join("new").exists() && !then.join("d2").exists());
        cli_in(&m, &["revert", m.mnt.to_str().unwrap(), "--at", "t1"]);
        assert_eq!(read_file(&m.p("data")), b"lower data\n");
        assert_eq!(read_file(&m.p("tree/top")), b"top");
        assert_eq!(names(&m.p("d")), merged_d);
        assert!(!m.p("new").exists() && !m.p("d2").exists());
        let after: Vec<_> = m.lowers.iter().map(|l| tree_of(l)).collect();
        assert_eq!(before, after, "a read-only branch changed");
    }
}

/// Every path under `root` with its kind and content (files) or target
/// (symlinks), sorted.
fn tree_of(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let md = fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                stack.push(p);
                out.push((rel, b"dir".to_vec()));
            } else if md.is_file() {
                out.push((rel, fs::read(&p).unwrap()));
            } else {
                out.push((rel, format!("{:o}", md.mode()).into_bytes()));
            }
        }
    }
    out.sort();
    out
}

/// A merged listing, once read, is kept by the kernel and listed again
/// without the daemon reading any branch, until a branch changes: a
/// change behind the mount, in the top or the lowest branch, shows at the
/// very next opendir.
#[test]
fn merged_listings_are_cached_until_a_branch_changes() {
    each_union(
        |b| {
            for (i, br) in b.iter().enumerate() {
                fs::create_dir(br.join("m")).unwrap();
                write_file(&br.join(format!("m/f{i}")), b"");
            }
        },
        |m| {
            let low = bottom(&m.lowers).join("m");
            let all: Vec<String> = (0..=m.lowers.len()).map(|i| format!("f{i}")).collect();
            assert_eq!(wait_listing_cached(&m.p("m"), &low), all);
            write_file(&low.join("new"), b"");
            assert!(
                listing(&m.p("m")).contains(&"new".to_string()),
                "lower change"
            );
            fs::remove_file(m.src.join("m/f0")).unwrap();
            assert!(
                !listing(&m.p("m")).contains(&"f0".to_string()),
                "top change"
            );
            // Cached again, and a change through the mount shows as well.
            wait_listing_cached(&m.p("m"), &low);
            fs::remove_file(m.p("m/new")).unwrap();
            assert_eq!(listing(&m.p("m")), all[1..]);
        },
    );
}

/// After a copy-up breaks a hard link, a listing the kernel kept of
/// another directory holding a name of that lower file shows that name's
/// new number, the one a fresh mount lists.
#[test]
fn a_copy_up_renumbers_other_links_in_kept_listings() {
    for mode in MODES {
        let mut m = Mount::union(mode, 1, |b| {
            fs::create_dir(bottom(b).join("sub")).unwrap();
            write_file(&bottom(b).join("f"), b"a");
            fs::hard_link(bottom(b).join("f"), bottom(b).join("sub/g")).unwrap();
        });
        let d_ino = |m: &Mount| {
            let e = fs::read_dir(m.p("sub")).unwrap().next().unwrap().unwrap();
            assert_eq!(e.file_name(), "g");
            std::os::unix::fs::DirEntryExt::ino(&e)
        };
        wait_listing_cached(&m.p("sub"), &bottom(&m.lowers).join("sub"));
        append(&m.p("f"), b"b").unwrap();
        let kept = d_ino(&m);
        m.remount();
        assert_eq!(kept, d_ino(&m), "mode {mode:?}");
    }
}

/// A lower file held open for reading while it is opened for writing (its
/// copy-up): the writer's data goes to the copy, never to the read-only
/// branch, though the reader's passthrough backing file is the lower one.
#[test]
fn a_write_while_the_lower_file_is_open_goes_to_the_copy() {
    each_union(lower_tree, |m| {
        use std::io::{Read, Write};
        let low = bottom(&m.lowers).join("data");
        let mut reader = fs::File::open(m.p("data")).unwrap();
        let mut w = fs::OpenOptions::new()
            .write(true)
            .open(m.p("data"))
            .unwrap();
        w.write_all(b"abcd").unwrap();
        drop(w);
        assert_eq!(
            read_file(&low),
            b"lower data\n",
            "the read-only branch changed"
        );
        assert_eq!(read_file(&m.src.join("data")), b"abcdr data\n");
        assert_eq!(read_file(&m.p("data")), b"abcdr data\n");
        let mut old = Vec::new();
        reader.read_to_end(&mut old).unwrap();
        drop(reader);
        assert_eq!(read_file(&low), b"lower data\n");
        assert_eq!(old, b"abcdr data\n", "as overlayfs since 4.19");
    });
}

/// A descriptor opened for reading before its lower file was copied up
/// reads the copy from then on, as on overlayfs since Linux 4.19: the
/// bytes written, the size grown, whatever it read before.
#[test]
fn a_reader_opened_before_a_copy_up_reads_the_copy() {
    each_union(lower_tree, |m| {
        use std::os::unix::fs::FileExt;
        let reader = fs::File::open(m.p("data")).unwrap();
        let mut head = [0u8; 3];
        reader.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(&head, b"low");
        let w = fs::OpenOptions::new()
            .write(true)
            .open(m.p("data"))
            .unwrap();
        w.write_all_at(b"abcdEFGHIJKLMNOP", 0).unwrap();
        drop(w);
        let mut all = vec![0u8; 100];
        let n = reader.read_at(&mut all, 0).unwrap();
        assert_eq!(&all[..n], b"abcdEFGHIJKLMNOP");
        assert_eq!(reader.metadata().unwrap().len(), 16);
        // A change of attributes only copies up too.
        let other = fs::File::open(m.p("tree/top")).unwrap();
        fs::set_permissions(m.p("tree/top"), fs::Permissions::from_mode(0o600)).unwrap();
        write_file(&m.p("tree/top"), b"rewritten");
        let n = other.read_at(&mut all, 0).unwrap();
        assert_eq!(&all[..n], b"rewritten");
        assert_eq!(read_file(&bottom(&m.lowers).join("tree/top")), b"top");
    });
}

/// Hidden temporaries a crash left (a copy-up's file or directory, a
/// clone's tree, a whiteout swap's) are no user's entries: a directory
/// holding only those is empty to rmdir and to a rename over it, in a
/// union and in a single-directory mount, and they go with it.
#[test]
fn a_crash_s_temporaries_keep_no_directory_from_going() {
    let orphans = |d: &Path| {
        fs::create_dir_all(d).unwrap();
        write_file(&d.join(".chronofs-copyup.0123456789abcdef"), b"half");
        fs::create_dir_all(d.join(".chronofs-copyup.0123456789abcdee/sub")).unwrap();
        write_file(&d.join(".chronofs-copyup.0123456789abcdee/sub/f"), b"x");
        write_file(&d.join(".chronofs-wh.77.1"), b"");
    };
    for mode in ["plain", ""] {
        for union in [true, false] {
            let fill = |top: &Path, low: Option<&Path>| {
                for d in ["gone", "target", "shadowed"] {
                    orphans(&top.join(d));
                }
                fs::create_dir(top.join("moved")).unwrap();
                if let Some(low) = low {
                    fs::create_dir(low.join("shadowed")).unwrap();
                }
            };
            let m = if union {
                Mount::union(mode, 1, |b| fill(&b[0], Some(&b[1])))
            } else {
                Mount::new_with(mode, |src| fill(src, None))
            };
            let what = format!("mode {mode:?}, union {union}");
            if mode == "plain" && !union {
                // Nothing there makes such names: they are the user's.
                assert_eq!(names(&m.p("gone")).len(), 3, "{what}");
                let e = fs::remove_dir(m.p("gone")).unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{what}");
                continue;
            }
            assert_eq!(names(&m.p("gone")), Vec::<String>::new(), "{what}");
            fs::remove_dir(m.p("gone")).unwrap_or_else(|e| panic!("{what}: rmdir: {e}"));
            fs::rename(m.p("moved"), m.p("target"))
                .unwrap_or_else(|e| panic!("{what}: rename over: {e}"));
            if union {
                fs::remove_dir(m.p("shadowed")).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            let left = if union {
                vec!["target"]
            } else {
                vec!["shadowed", "target"]
            };
            assert_eq!(names(&m.mnt), left, "{what}");
            assert_eq!(names(&m.p("target")), Vec::<String>::new(), "{what}");
            // Nothing of them is left in the branch either.
            let backing: Vec<String> = names(&m.src)
                .into_iter()
                .filter(|n| n != ".chronofs")
                .collect();
            assert!(
                backing.iter().all(|n| !n.starts_with(".chronofs-")),
                "{what}: {backing:?}"
            );
            assert!(!m.src.join("gone").exists(), "{what}");
            assert_eq!(names(&m.src.join("target")), Vec::<String>::new(), "{what}");
        }
    }
}

/// A branch written through a chronofs mount (whiteouts of removed lower
/// objects, an opaque directory made over a removed lower one, a lower
/// directory renamed, copy-ups, new objects) mounts under kernel overlayfs
/// (`redirect_dir=on`) as the same tree chronofs showed.
#[test]
fn overlayfs_mounts_a_branch_chronofs_wrote_as_the_same_tree() {
    overlayfs_mounts_what_chronofs_wrote(false);
}

/// The same with `user.overlay.*` marks (`-o userxattr`, overlayfs's
/// `userxattr`: rootless containers' layers). overlayfs never follows a
/// redirect there (it forces `redirect_dir=nofollow`), so no directory is
/// renamed.
#[test]
fn overlayfs_userxattr_mounts_a_branch_chronofs_wrote_with_userxattr() {
    overlayfs_mounts_what_chronofs_wrote(true);
}

/// A scratch directory and, in it, the root of a union harness `u`; none
/// where the kernel has no overlayfs to compare with.
fn overlay_test_dirs() -> Option<(tempfile::TempDir, PathBuf)> {
    if !std::fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.contains("overlay")) {
        eprintln!("skipped: the kernel has no overlayfs");
        return None;
    }
    let base = tempdir();
    let root = base.path().join("u");
    fs::create_dir(&root).unwrap();
    Some((base, root))
}

/// Mounts kernel overlayfs of `upper` over `lower` at `base/merged`
/// (`base/work` its work directory), detached when the guard goes.
fn kernel_overlay(base: &Path, upper: &Path, lower: &Path, userxattr: bool) -> (PathBuf, Detach) {
    let (work, merged) = (base.join("work"), base.join("merged"));
    fs::create_dir_all(&work).unwrap();
    fs::create_dir_all(&merged).unwrap();
    let ov = format!(
        "lowerdir={},upperdir={},workdir={},{}",
        lower.display(),
        upper.display(),
        work.display(),
        if userxattr {
            "userxattr"
        } else {
            "redirect_dir=on"
        }
    );
    let out = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &ov])
        .arg(&merged)
        .output()
        .unwrap();
    assert!(out.status.success(), "mount -o {ov}: {}", stderr(&out));
    (merged.clone(), Detach(vec![merged]))
}

const INTEROP_SNAP: SnapOpts = SnapOpts {
    mtimes: true,
    dir_mtimes: false,
    dir_nlink: false,
};

fn overlayfs_mounts_what_chronofs_wrote(userxattr: bool) {
    let Some((base, root)) = overlay_test_dirs() else {
        return;
    };
    let opts = if userxattr {
        "plain,userxattr"
    } else {
        "plain"
    };
    let mut m = Mount::union_in(Root::Kept(root.clone()), opts, 1, |b| {
        let low = &b[1];
        for d in ["gone_dir/sub", "remade", "moved_from/deep", "kept"] {
            fs::create_dir_all(low.join(d)).unwrap();
        }
        write_file(&low.join("gone"), b"whited out");
        write_file(&low.join("gone_dir/sub/f"), b"x");
        write_file(&low.join("remade/old"), b"hidden by opaque");
        write_file(&low.join("moved_from/deep/f"), b"followed by redirect");
        write_file(&low.join("kept/appended"), b"lower");
        write_file(&low.join("kept/chmodded"), b"mode");
        std::os::unix::fs::symlink("kept/appended", low.join("link")).unwrap();
    });
    fs::remove_file(m.p("gone")).unwrap();
    fs::remove_dir_all(m.p("gone_dir")).unwrap();
    fs::remove_dir_all(m.p("remade")).unwrap();
    fs::create_dir(m.p("remade")).unwrap();
    write_file(&m.p("remade/new"), b"upper");
    if !userxattr {
        fs::rename(m.p("moved_from"), m.p("moved_to")).unwrap();
    }
    append_all(&m.p("kept/appended"), b"+upper");
    fs::set_permissions(m.p("kept/chmodded"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::create_dir(m.p("kept/newdir")).unwrap();
    write_file(&m.p("kept/newdir/n"), b"new");
    let shown = snapshot(&m.mnt, INTEROP_SNAP);
    assert!(!shown.contains_key("gone") && !shown.contains_key("remade/old"));
    assert_eq!(shown.contains_key("moved_to/deep/f"), !userxattr);
    m.unmount();
    let (used, unused) = match userxattr {
        true => ("user.overlay.opaque", "trusted.overlay.opaque"),
        false => ("trusted.overlay.opaque", "user.overlay.opaque"),
    };
    assert_eq!(get_xattr(&m.src.join("remade"), used).unwrap(), b"y");
    assert!(get_xattr(&m.src.join("remade"), unused).is_err());

    let (merged, _detach) = kernel_overlay(base.path(), &m.src, &m.lowers[0], userxattr);
    let kernel = snapshot(&merged, INTEROP_SNAP);
    // chronofs's own store stays out of the comparison (snapshot skips a
    // top-level `.chronofs`).
    assert_eq!(
        kernel, shown,
        "overlayfs (left) and chronofs (right) differ"
    );
}

/// The other way: a layer changed through overlayfs with `userxattr` (as
/// a rootless container runtime leaves it) mounts under chronofs with
/// `-o userxattr` as the tree overlayfs showed; without the option its
/// opaque directory would let the lower entries through.
#[test]
fn chronofs_userxattr_mounts_a_layer_overlayfs_userxattr_wrote() {
    let Some((base, root)) = overlay_test_dirs() else {
        return;
    };
    let seen = std::cell::RefCell::new(BTreeMap::new());
    let mut m = Mount::union_in(Root::Kept(root.clone()), "plain,userxattr", 1, |b| {
        let (up, low) = (&b[0], &b[1]);
        for d in ["gone_dir/sub", "remade", "kept"] {
            fs::create_dir_all(low.join(d)).unwrap();
        }
        write_file(&low.join("gone"), b"whited out");
        write_file(&low.join("gone_dir/sub/f"), b"x");
        write_file(&low.join("remade/old"), b"hidden by opaque");
        write_file(&low.join("kept/appended"), b"lower");
        let (merged, detach) = kernel_overlay(base.path(), up, low, true);
        fs::remove_file(merged.join("gone")).unwrap();
        fs::remove_dir_all(merged.join("gone_dir")).unwrap();
        fs::remove_dir_all(merged.join("remade")).unwrap();
        fs::create_dir(merged.join("remade")).unwrap();
        write_file(&merged.join("remade/new"), b"upper");
        append_all(&merged.join("kept/appended"), b"+upper");
        *seen.borrow_mut() = snapshot(&merged, INTEROP_SNAP);
        drop(detach);
        assert_eq!(
            get_xattr(&up.join("remade"), "user.overlay.opaque").unwrap(),
            b"y"
        );
    });
    let seen = seen.into_inner();
    assert!(!seen.contains_key("remade/old") && seen.contains_key("remade/new"));
    assert_eq!(
        snapshot(&m.mnt, INTEROP_SNAP),
        seen,
        "chronofs (left) and overlayfs (right) differ"
    );
    let status: serde_json::Value =
        serde_json::from_slice(&cli_ok(&["status", m.mnt.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(status["union"]["xattrs"], "user", "{status}");
    m.unmount();
    // fsck reads the marks of the namespace it is told.
    let list = format!("{}=rw:{}=ro", m.src.display(), m.lowers[0].display());
    fs::create_dir(m.src.join("redirected")).unwrap();
    set_xattr(
        &m.src.join("redirected"),
        "user.overlay.redirect",
        b"/nowhere",
        0,
    )
    .unwrap();
    let fsck =
        |args: &[&std::ffi::OsStr]| Command::new(bin()).arg("fsck").args(args).output().unwrap();
    let out = fsck(&[list.as_ref()]);
    assert!(
        out.status.success(),
        "trusted marks are clean: {}",
        stderr(&out)
    );
    let out = fsck(&["--userxattr".as_ref(), list.as_ref()]);
    let report = String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(&out);
    assert!(
        !out.status.success() && report.contains("redirect"),
        "{report}"
    );
    let out = fsck(&["--userxattr".as_ref(), m.src.as_os_str()]);
    assert!(!out.status.success());
    assert_eq!(stderr(&out).trim().lines().count(), 1, "{}", stderr(&out));
}

/// Branches on two file systems whose inode numbers collide (two fresh
/// tmpfs number their files alike): every object still shows its own
/// st_ino, the same after a remount.
#[test]
fn inode_numbers_stay_unique_across_branches_on_different_file_systems() {
    let base = tempdir();
    let root = base.path().join("u");
    fs::create_dir(&root).unwrap();
    let (top, low) = (root.join("src"), root.join("lower1"));
    for d in ["mnt", "native"] {
        fs::create_dir(root.join(d)).unwrap();
    }
    for d in [&top, &low] {
        fs::create_dir(d).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
            .arg(d)
            .status()
            .unwrap();
        assert!(ok.success(), "mount tmpfs on {}", d.display());
    }
    let _detach = Detach(vec![top.clone(), low.clone()]);
    for (d, tag) in [(&top, "t"), (&low, "l")] {
        for i in 0..20 {
            write_file(&d.join(format!("{tag}{i}")), tag.as_bytes());
        }
        fs::create_dir(d.join(format!("{tag}dir"))).unwrap();
    }
    let backing = |p: &Path| fs::metadata(p).unwrap().ino();
    assert_eq!(
        backing(&top.join("t0")),
        backing(&low.join("l0")),
        "tmpfs numbers collide"
    );
    for mode in ["plain", ""] {
        let mut m = Mount::union_in(Root::Kept(root.clone()), mode, 1, |_| {});
        let numbers = |m: &Mount| -> BTreeMap<String, u64> {
            names(&m.mnt)
                .into_iter()
                .map(|n| {
                    let ino = fs::symlink_metadata(m.p(&n)).unwrap().ino();
                    (n, ino)
                })
                .collect()
        };
        let seen = numbers(&m);
        assert_eq!(seen.len(), 42, "mode {mode:?}: {seen:?}");
        let distinct: BTreeSet<u64> = seen.values().copied().collect();
        assert_eq!(
            distinct.len(),
            seen.len(),
            "mode {mode:?}: numbers repeat: {seen:?}"
        );
        m.remount();
        assert_eq!(numbers(&m), seen, "mode {mode:?}: after a remount");
        m.unmount();
        let _ = fs::remove_dir_all(top.join(".chronofs"));
    }
}

/// Mounts the test made by hand, lazily unmounted when it ends (failed
/// or not).
struct Detach(Vec<PathBuf>);

impl Drop for Detach {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("umount").arg("-l").arg(p).status();
        }
    }
}

/// Where the branches' file system reflinks (btrfs on a loop device),
/// a copy-up through the mount shares the lower file's extents instead
/// of copying its data: O(1) in the file's size.
#[test]
fn copy_up_on_btrfs_shares_the_lower_file_s_extents() {
    use common::logdisk::{must, Btrfs};
    let work = tempdir();
    let btrfs = Btrfs::new(work.path(), 512 << 20);
    let disk = &btrfs.dir;
    let data: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    for mode in MODES {
        let tree = disk.join(format!("in-{mode}"));
        fs::create_dir(&tree).unwrap();
        let m = Mount::union_in(Root::Kept(tree), mode, 1, |b| {
            write_file(&bottom(b).join("big"), &data);
        });
        must(&mut Command::new("sync"));
        append(&m.p("big"), b"!").unwrap();
        let copy = m.src.join("big");
        let frag = must(Command::new("filefrag").arg("-v").arg(&copy));
        assert!(
            frag.contains("shared"),
            "mode {mode:?}: extents not shared:\n{frag}"
        );
        let got = fs::read(m.p("big")).unwrap();
        assert!(
            got.len() == data.len() + 1 && got[..data.len()] == data[..] && got[data.len()] == b'!'
        );
        assert_eq!(fs::read(&copy).unwrap(), got, "mode {mode:?}");
    }
}

/// Unmounts a small file system mounted for a test, however it ends.
struct SmallFs(PathBuf);

impl SmallFs {
    /// A 2 MiB tmpfs mounted over `dir`.
    fn over(dir: &Path) -> SmallFs {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs");
        SmallFs(dir.to_path_buf())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// An O_TRUNC open or a truncate of a file a lower branch holds copies up
/// only what survives the truncation (as overlayfs does): on an upper
/// branch with less room than the file, `: > big` and `truncate -s 4K`
/// work where a whole copy ran out of space. History still keeps the
/// lower content as the version before.
#[test]
fn truncating_a_lower_file_copies_up_only_what_survives() {
    let small = std::cell::RefCell::new(None);
    let m = Mount::union("plain", 1, |b| {
        let big: Vec<u8> = (0..8u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
        write_file(&b[1].join("big"), &big);
        write_file(&b[1].join("big2"), &big);
        // The upper branch: 2 MiB of room for files of 8 MiB.
        *small.borrow_mut() = Some(SmallFs::over(&b[0]));
    });
    let _small = small.into_inner();
    fs::write(m.p("big"), b"new").expect(": > big on a small upper branch");
    assert_eq!(read_file(&m.p("big")), b"new");
    assert_eq!(
        fs::metadata(m.lowers[0].join("big")).unwrap().len(),
        8 << 20
    );
    // truncate(2) by path (an open for writing copies the file whole).
    let path = m.p("big2");
    let script = "import os, sys; os.truncate(sys.argv[1], 4096)";
    let st = Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .status()
        .unwrap();
    assert!(st.success(), "truncate(2) of a lower file to 4 KiB");
    let kept = read_file(&m.p("big2"));
    let want: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(kept, want);
    drop(m);

    let m = Mount::union("", 1, lower_tree);
    m.wait_history_ready();
    fs::write(m.p("data"), b"new data\n").unwrap();
    let p = m.p("data");
    let p = p.to_str().unwrap();
    assert_eq!(cli_ok(&["cat", p, "--version", "1"]), b"lower data\n");
    assert_eq!(cli_ok(&["cat", p, "--version", "2"]), b"new data\n");
}

/// A rename over a file a read-only branch holds hides that file as a
/// removal does, copying none of it (it copied the whole target up first:
/// on an upper branch with less room than the file, ENOSPC where
/// overlayfs renames). History keeps the replaced content; an immutable
/// target is refused as natively.
#[test]
fn renaming_over_a_lower_file_copies_none_of_it() {
    let big: Vec<u8> = (0..8u32 << 20).map(|i| (i * 5 % 251) as u8).collect();
    for mode in ["plain", ""] {
        let small = std::cell::RefCell::new(None);
        let m = Mount::union(mode, 1, |b| {
            write_file(&b[1].join("big"), &big);
            write_file(&b[1].join("frozen"), b"frozen\n");
            let st = Command::new("chattr")
                .arg("+i")
                .arg(b[1].join("frozen"))
                .status()
                .unwrap();
            assert!(st.success(), "chattr +i");
            // The upper branch: 2 MiB of room for a file of 8 MiB.
            *small.borrow_mut() = Some(SmallFs::over(&b[0]));
        });
        let _unflag = Unflag(vec![m.lowers[0].join("frozen")]);
        let _small = small.into_inner();
        if mode.is_empty() {
            m.wait_history_ready();
        }
        write_file(&m.p("new"), b"replacement\n");
        fs::rename(m.p("new"), m.p("big")).expect("rename over a large lower file");
        assert_eq!(read_file(&m.p("big")), b"replacement\n", "mode {mode:?}");
        assert!(!m.p("new").exists());
        assert_eq!(names(&m.mnt), ["big", "frozen"], "mode {mode:?}");
        write_file(&m.p("other"), b"x");
        let e = fs::rename(m.p("other"), m.p("frozen")).expect_err("over an immutable file");
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "mode {mode:?}: {e}");
        assert_eq!(read_file(&m.p("frozen")), b"frozen\n");
        assert_eq!(
            read_file(&m.lowers[0].join("big")),
            big,
            "the lower file changed"
        );
        if mode.is_empty() {
            let p = m.p("big");
            let p = p.to_str().unwrap();
            assert!(
                cli_ok(&["cat", p, "--version", "1"]) == big,
                "the replaced version"
            );
            assert_eq!(cli_ok(&["cat", p]), b"replacement\n");
        }
    }
}

/// A change through a descriptor of a lower file that no name shows any
/// more (removed, or renamed over) applies to that open file, as on a
/// native file system: it was EEXIST, the copy-up finding the whiteout or
/// the new file at its name.
#[test]
fn a_lower_file_removed_while_open_still_takes_changes() {
    each_union(lower_tree, |m| {
        let low = m.lowers.last().unwrap();
        let removed = fs::File::open(m.p("data")).unwrap();
        fs::remove_file(m.p("data")).unwrap();
        removed
            .set_permissions(fs::Permissions::from_mode(0o600))
            .expect("fchmod of a removed lower file");
        assert_eq!(removed.metadata().unwrap().mode() & 0o7777, 0o600);
        assert!(
            fs::symlink_metadata(m.p("data")).is_err(),
            "its name came back"
        );
        assert_eq!(
            fs::metadata(low.join("data")).unwrap().mode() & 0o7777,
            0o644
        );
        let mut text = String::new();
        use std::io::Read;
        (&removed).read_to_string(&mut text).unwrap();
        assert_eq!(text, "lower data\n");

        let replaced = fs::File::open(m.p("tree/top")).unwrap();
        write_file(&m.p("tree/new"), b"new top");
        fs::rename(m.p("tree/new"), m.p("tree/top")).unwrap();
        replaced
            .set_permissions(fs::Permissions::from_mode(0o640))
            .expect("fchmod of a lower file renamed over");
        assert_eq!(replaced.metadata().unwrap().mode() & 0o7777, 0o640);
        assert_eq!(read_file(&m.p("tree/top")), b"new top");
        assert_eq!(
            fs::metadata(m.p("tree/top")).unwrap().mode() & 0o7777,
            0o644
        );
    });
}

/// Clears the append-only and immutable flags of files a test set them
/// on, however it ends (the temporary directory could not go otherwise).
struct Unflag(Vec<PathBuf>);

impl Drop for Unflag {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("chattr").arg("-a").arg("-i").arg(p).status();
        }
    }
}

/// Lower files made append-only or immutable (chattr +a, +i) refuse
/// through the union what they refuse natively: a truncation, a chmod, a
/// write to an immutable file (EPERM), while appends go on; the copy
/// that takes them carries the flags. A copy-up lost them: `echo x > log`
/// emptied an append-only log.
#[test]
fn append_only_and_immutable_lower_files_refuse_what_they_refuse_natively() {
    let chattr = |flag: &str, p: &Path| {
        let st = Command::new("chattr").arg(flag).arg(p).status().unwrap();
        assert!(st.success(), "chattr {flag} {}", p.display());
    };
    let m = Mount::union("plain", 1, |b| {
        write_file(&b[1].join("log"), b"line 1\n");
        write_file(&b[1].join("frozen"), b"frozen\n");
        write_file(&b[1].join("kept"), b"kept\n");
        chattr("+a", &b[1].join("log"));
        chattr("+i", &b[1].join("frozen"));
        chattr("+a", &b[1].join("kept"));
    });
    let names = ["log", "frozen", "kept"];
    let _unflag = Unflag(
        names
            .iter()
            .flat_map(|n| [m.lowers[0].join(n), m.src.join(n)])
            .collect(),
    );
    let eperm = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{what}: {e}");
    };
    eperm(
        fs::write(m.p("log"), b"gone"),
        "O_TRUNC of an append-only file",
    );
    assert_eq!(read_file(&m.p("log")), b"line 1\n");
    append(&m.p("log"), b"line 2\n").expect("append to an append-only file");
    assert_eq!(read_file(&m.p("log")), b"line 1\nline 2\n");
    eperm(fs::write(m.p("log"), b""), "O_TRUNC of its copy");
    let mode = fs::Permissions::from_mode(0o600);
    eperm(
        fs::set_permissions(m.p("log"), mode.clone()),
        "chmod of its copy",
    );
    assert_eq!(read_file(&m.p("log")), b"line 1\nline 2\n");

    eperm(append(&m.p("frozen"), b"x"), "append to an immutable file");
    eperm(
        fs::set_permissions(m.p("frozen"), mode),
        "chmod of an immutable file",
    );
    assert_eq!(read_file(&m.p("frozen")), b"frozen\n");
    // None goes, by unlink or rename, from its branch or as a copy.
    for n in names {
        eperm(fs::remove_file(m.p(n)), "unlink");
        eperm(fs::rename(m.p(n), m.p("elsewhere")), "rename");
        assert!(m.p(n).exists(), "{n} went");
    }
    for n in names {
        let lower = read_file(&m.lowers[0].join(n));
        assert!(
            [&b"line 1\n"[..], b"frozen\n", b"kept\n"].contains(&lower.as_slice()),
            "lower {n} changed"
        );
    }
}

/// A rewind of a directory stream opened on a lower directory that was
/// copied up since (it took an entry) lists the directory as it is now,
/// as rewinddir(3) must: the stream kept reading the lower branch, so the
/// new entry was missing and the removed one still listed.
#[test]
fn a_rewind_after_a_copy_up_lists_the_directory_as_it_is_now() {
    each_union(lower_tree, |m| {
        // os.listdir(fd) reads the open stream and rewinds it.
        let script = "import os, sys\n\
            fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n\
            print(sorted(os.listdir(fd)))\n\
            open(os.path.join(sys.argv[1], 'new'), 'w').close()\n\
            os.unlink(os.path.join(sys.argv[1], 'top'))\n\
            print(sorted(os.listdir(fd)))\n";
        let out = Command::new("python3")
            .args(["-c", script])
            .arg(m.p("tree"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines, ["['sub', 'top']", "['new', 'sub']"]);
    });
}

/// A tree someone with access to the directory itself renamed to a name
/// like a crash's temporary is not removed as root by another user's
/// rmdir: the daemon clears temporaries with the caller's identity, so
/// only what they could remove by hand goes (here nothing: ENOTEMPTY, as
/// natively, and the tree stays).
#[test]
fn an_ordinary_user_s_rmdir_removes_no_tree_they_could_not() {
    let m = Mount::new_with("", plant_someones_tree);
    assert_nobody_s_rmdir_keeps_someones_tree(&m);
}

/// `group/shared` (world-writable) under `root`, holding another user's
/// private tree under a name like a crash's temporary.
fn plant_someones_tree(root: &Path) {
    let shared = root.join("group/shared");
    fs::create_dir_all(&shared).unwrap();
    for d in [root.join("group"), shared.clone()] {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
    }
    let theirs = shared.join(".chronofs-copyup.0123456789abcdef");
    fs::create_dir_all(theirs.join("work")).unwrap();
    write_file(&theirs.join("work/notes"), b"someone's work");
    fs::set_permissions(theirs.join("work"), fs::Permissions::from_mode(0o700)).unwrap();
    for p in [
        theirs.clone(),
        theirs.join("work"),
        theirs.join("work/notes"),
    ] {
        std::os::unix::fs::chown(&p, Some(OTHER_USER), Some(OTHER_USER)).unwrap();
    }
}

/// Nobody's rmdir of `group/shared` fails and leaves the tree; root's
/// clears it, as by hand.
fn assert_nobody_s_rmdir_keeps_someones_tree(m: &Mount) {
    let out = as_user(NOBODY, "rmdir", &m.p("group/shared"));
    assert!(
        !out.status.success(),
        "nobody's rmdir removed someone else's tree"
    );
    let notes = m
        .src
        .join("group/shared/.chronofs-copyup.0123456789abcdef/work/notes");
    assert_eq!(fs::read(notes).unwrap(), b"someone's work");
    fs::remove_dir(m.p("group/shared")).expect("root's rmdir clears the temporaries");
}

/// A name that appeared in a lower branch behind the mount's back, where
/// the kernel still keeps it as absent: open(O_CREAT) opens that file, as
/// natively, instead of hiding it under a new empty one in the top
/// branch; O_EXCL fails with EEXIST.
#[test]
fn a_create_of_a_name_a_lower_branch_gained_opens_it() {
    each_union(lower_tree, |m| {
        use std::io::Write;
        let low = bottom(&m.lowers);
        assert!(fs::symlink_metadata(m.p("late")).is_err());
        write_file(&low.join("late"), b"lower bytes\n");
        // O_EXCL, on a second name also kept as absent.
        assert!(fs::symlink_metadata(m.p("late2")).is_err());
        write_file(&low.join("late2"), b"x");
        let excl = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.p("late2"));
        assert_eq!(
            excl.map(drop).map_err(|e| e.raw_os_error()),
            Err(Some(libc::EEXIST))
        );
        let mut f = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(m.p("late"))
            .unwrap();
        f.write_all(b"more\n").unwrap();
        drop(f);
        assert_eq!(read_file(&m.p("late")), b"lower bytes\nmore\n");
        assert_eq!(read_file(&low.join("late")), b"lower bytes\n");
    });
}

/// The layers of a merged directory are read as the daemon, as overlayfs
/// reads them with the mounter's credentials: who may list the directory
/// as the union shows it (its top copy) lists all of it, although a lower
/// copy's own mode (root's 0700) would refuse them. `ls` failed with
/// EACCES while `cat` of a file in it worked.
#[test]
fn a_merged_directory_lists_for_whoever_may_list_it_as_the_union_shows_it() {
    let m = Mount::union("", 1, |b| {
        fs::create_dir(b[1].join("d")).unwrap();
        write_file(&b[1].join("d/low"), b"low");
        fs::set_permissions(b[1].join("d"), fs::Permissions::from_mode(0o700)).unwrap();
    });
    std::os::unix::fs::chown(m.p("d"), Some(NOBODY), Some(NOBODY)).unwrap();
    write_file(&m.p("d/up"), b"up");
    let out = as_user(NOBODY, "ls", &m.p("d"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "low\nup\n");
    let other = as_user(OTHER_USER, "ls", &m.p("d"));
    assert!(
        !other.status.success(),
        "a third user listed a 0700 directory"
    );
}

/// RENAME_EXCHANGE of a lower directory with one the upper branch alone
/// holds: each lands where the other was, and neither merges what lay
/// below its new name (the upper-only one is made opaque, as overlayfs
/// does). `a` listed the lower `x` beside `y`.
#[test]
fn an_exchange_with_an_upper_only_directory_merges_nothing_below_it() {
    let mut m = Mount::union("", 1, |b| {
        fs::create_dir(b[1].join("a")).unwrap();
        write_file(&b[1].join("a/x"), b"lower x");
    });
    fs::create_dir(m.p("b")).unwrap();
    write_file(&m.p("b/y"), b"upper y");
    sys::renameat2(&cstr(m.p("a")), &cstr(m.p("b")), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(sorted_names(&m.p("a")), ["y"]);
    assert_eq!(sorted_names(&m.p("b")), ["x"]);
    assert_eq!(read_file(&m.p("b/x")), b"lower x");
    m.remount();
    assert_eq!(sorted_names(&m.p("a")), ["y"], "after a remount");
    assert_eq!(sorted_names(&m.p("b")), ["x"], "after a remount");
}

/// The xattr form of a whiteout (an empty file carrying `overlay.whiteout`
/// in a directory marked `overlay.opaque=x`, as tools that cannot make
/// device nodes write it): lookups hide the name as listings do, as
/// overlayfs does. `stat d/f` found an empty file the listing hid.
#[test]
fn an_xattr_whiteout_hides_its_name_from_lookups_too() {
    let m = Mount::union("", 2, |b| {
        fs::create_dir(b[1].join("d")).unwrap();
        write_file(&b[1].join("d/f"), b"");
        run(
            &b[1],
            "setfattr",
            &["-n", "trusted.overlay.whiteout", "-v", "y", "d/f"],
        );
        run(
            &b[1],
            "setfattr",
            &["-n", "trusted.overlay.opaque", "-v", "x", "d"],
        );
        fs::create_dir(b[2].join("d")).unwrap();
        write_file(&b[2].join("d/f"), b"hidden");
        write_file(&b[2].join("d/k"), b"kept");
    });
    let names: Vec<String> = fs::read_dir(m.p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["k"]);
    let st = fs::symlink_metadata(m.p("d/f"));
    assert_eq!(
        st.map_err(|e| e.raw_os_error()).err(),
        Some(Some(libc::ENOENT))
    );
    assert_eq!(read_file(&m.p("d/k")), b"kept");
}

/// The same for a merged directory (one with a lower copy): its rmdir
/// cleared the upper copy's orphan temporaries as root, so a tree renamed
/// to such a name by someone with access to the branch went although the
/// caller could not have removed it.
#[test]
fn an_ordinary_user_s_rmdir_of_a_merged_directory_removes_no_tree_they_could_not() {
    let m = Mount::union("", 1, |b| {
        plant_someones_tree(&b[0]);
        fs::create_dir_all(b[1].join("group/shared")).unwrap();
        for i in 0..20 {
            write_file(&b[1].join(format!("group/shared/low{i}")), b"lower");
        }
    });
    // Removed through the mount: whiteouts in the upper copy hide them
    // (many, so that some come before the temporary in a listing).
    for i in 0..20 {
        fs::remove_file(m.p(&format!("group/shared/low{i}"))).unwrap();
    }
    let out = as_user(NOBODY, "rmdir", &m.p("group/shared"));
    assert!(
        !out.status.success(),
        "nobody's rmdir removed someone else's tree"
    );
    // The refused rmdir took no whiteout away: the lower files stay hidden.
    assert_eq!(fs::read_dir(m.p("group/shared")).unwrap().count(), 0);
    assert_nobody_s_rmdir_keeps_someones_tree(&m);
}

/// `prog path` run as user (and group) `id`.
fn as_user(id: u32, prog: &str, path: &Path) -> std::process::Output {
    Command::new(prog)
        .arg(path)
        .uid(id)
        .gid(id)
        .output()
        .unwrap()
}

/// A directory renamed out of an opaque one: its redirect names its old
/// path from the branch roots, and the search below walks that path part
/// by part, as overlayfs does, so the opaque directory on the way still
/// hides the branches below it (`etc/c` listed the hidden `old.conf`).
#[test]
fn a_redirect_through_an_opaque_directory_stops_below_it() {
    let mut m = Mount::union("", 2, |b| {
        fs::create_dir_all(b[1].join("etc/foo/conf.d")).unwrap();
        write_file(&b[1].join("etc/foo/conf.d/new.conf"), b"new");
        run(
            &b[1],
            "setfattr",
            &["-n", "trusted.overlay.opaque", "-v", "y", "etc/foo"],
        );
        fs::create_dir_all(b[2].join("etc/foo/conf.d")).unwrap();
        write_file(&b[2].join("etc/foo/conf.d/old.conf"), b"old");
    });
    assert_eq!(sorted_names(&m.p("etc/foo/conf.d")), ["new.conf"]);
    fs::rename(m.p("etc/foo/conf.d"), m.p("etc/c")).unwrap();
    assert_eq!(sorted_names(&m.p("etc/c")), ["new.conf"]);
    m.remount();
    assert_eq!(sorted_names(&m.p("etc/c")), ["new.conf"], "after a remount");
}

/// The names in directory `dir`, sorted.
fn sorted_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// RENAME_WHITEOUT leaves a 0/0 character device behind, which in a union
/// is a whiteout: the name vanished instead (the rename succeeded and
/// nothing showed where it had been). Refused with EINVAL, as overlayfs
/// refuses it; nothing moves.
#[test]
fn rename_whiteout_is_refused_in_a_union() {
    each_union(lower_tree, |m| {
        write_file(&m.p("up"), b"up");
        for from in ["up", "data"] {
            let r = sys::renameat2(&cstr(m.p(from)), &cstr(m.p("to")), libc::RENAME_WHITEOUT);
            assert_eq!(r, Err(libc::EINVAL), "{from}");
            assert!(m.p(from).exists(), "{from} went");
            assert!(!m.p("to").exists(), "{from} arrived");
        }
    });
}
