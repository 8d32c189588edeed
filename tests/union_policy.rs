//! Union mounts with several read-write branches: where `-o create=` puts
//! new objects, what `-o delete=` removes from which branch, and that a
//! multi-branch step that fails leaves the visible tree as it was. Each
//! case looks into the branch directories themselves.

mod common;

use common::sys;
use common::*;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A union mounted in the background by the mount helper's form, and the
/// tmpfs branches made for it; all unmounted on drop.
struct Union {
    dir: tempfile::TempDir,
    mnt: PathBuf,
    tmpfs: Vec<PathBuf>,
    spec: String,
    opts: String,
}

impl Union {
    /// Branch directories `names` under a fresh directory; those with a
    /// tmpfs size (`Some("4m")`, or `"size=..,nr_inodes=.."`) are tmpfs
    /// mounts of it.
    fn new(names: &[(&str, Option<&str>)]) -> Union {
        let dir = tempdir();
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let mut u = Union {
            dir,
            mnt,
            tmpfs: Vec::new(),
            spec: String::new(),
            opts: String::new(),
        };
        for (name, tmpfs) in names {
            let p = u.br(name);
            fs::create_dir(&p).unwrap();
            if let Some(o) = tmpfs {
                let o = if o.contains('=') {
                    o.to_string()
                } else {
                    format!("size={o}")
                };
                let st = Command::new("mount")
                    .args(["-t", "tmpfs", "-o", &o, "tmpfs"])
                    .arg(&p)
                    .status()
                    .unwrap();
                assert!(st.success(), "mount tmpfs on {}", p.display());
                u.tmpfs.push(p.clone());
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        u
    }

    fn br(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Mounts `spec` (branch names with their modes: `a=rw:b=ro`).
    fn mount(&mut self, spec: &str, opts: &str) {
        self.spec = spec
            .split(':')
            .map(|b| {
                let (name, mode) = b.split_once('=').unwrap();
                format!("{}={mode}", self.br(name).display())
            })
            .collect::<Vec<_>>()
            .join(":");
        self.opts = opts.to_string();
        self.start();
    }

    fn start(&self) {
        let out = Command::new(bin())
            .arg(&self.spec)
            .arg(&self.mnt)
            .args(["-o", &self.opts])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount {}: {}",
            self.spec,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn unmount(&self) {
        let _ = Command::new(bin()).arg("umount").arg(&self.mnt).status();
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }

    fn remount(&self) {
        self.unmount();
        self.start();
    }
}

impl Drop for Union {
    fn drop(&mut self) {
        self.unmount();
        for t in &self.tmpfs {
            let _ = Command::new("umount").arg("-l").arg(t).status();
        }
    }
}

fn is_whiteout(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

fn errno_of(r: std::io::Result<()>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

#[test]
fn create_mfs_puts_new_objects_where_most_space_is_free_then() {
    let mut u = Union::new(&[
        ("a", Some("4m")),
        ("b", Some("32m")),
        ("c", Some("16m")),
        ("d", None),
    ]);
    let sub = u.br("d").join("sub");
    fs::create_dir(&sub).unwrap();
    fs::set_permissions(&sub, fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::chown(&sub, Some(1234), Some(1235)).unwrap();
    u.mount("a=rw:b=rw:c=rw:d=ro", "plain,create=mfs");
    fs::create_dir(u.p("new")).unwrap();
    assert!(u.br("b").join("new").is_dir(), "b has the most free space");
    assert!(!exists(&u.br("a").join("new")) && !exists(&u.br("c").join("new")));
    // A new file under a directory only a read-only branch holds: the
    // directory is copied into the chosen branch, as copy-up copies it.
    write_file(&u.p("sub/f"), b"in b");
    assert_eq!(read_file(&u.br("b").join("sub/f")), b"in b");
    let st = fs::metadata(u.br("b").join("sub")).unwrap();
    assert_eq!(
        (st.mode() & 0o7777, st.uid(), st.gid()),
        (0o750, 1234, 1235)
    );
    assert!(!exists(&sub.join("f")) && !exists(&u.br("a").join("sub")));
    assert_eq!(names(&u.p("sub")), vec!["f"]);
    // Filling b makes c the branch with the most free space.
    write_file(&u.p("big"), &vec![7u8; 24 << 20]);
    assert!(u.br("b").join("big").is_file());
    write_file(&u.p("sub/g"), b"in c");
    assert_eq!(read_file(&u.br("c").join("sub/g")), b"in c");
    assert_eq!(names(&u.p("sub")), vec!["f", "g"]);
    // A name hidden by a whiteout is made again where the whiteout is
    // (in a, the smallest), so the read-only copy never shows.
    write_file(&u.br("d/gone"), b"lower");
    fs::remove_file(u.p("gone")).unwrap();
    assert!(is_whiteout(&u.br("a/gone")));
    write_file(&u.p("gone"), b"again");
    assert_eq!(read_file(&u.br("a/gone")), b"again");
    assert!(!exists(&u.br("b/gone")) && !exists(&u.br("c/gone")));
    // What was made stays where it is across a remount.
    u.remount();
    assert_eq!(read_file(&u.p("gone")), b"again");
    assert_eq!(read_file(&u.p("sub/g")), b"in c");
    assert_eq!(read_file(&u.p("sub/f")), b"in b");
}

#[test]
fn create_existing_path_uses_the_highest_branch_holding_the_parent() {
    let mut u = Union::new(&[("a", None), ("b", None), ("c", None), ("d", None)]);
    for d in ["b/x", "c/x", "c/z", "d/y"] {
        fs::create_dir(u.br(d)).unwrap();
    }
    u.mount("a=rw:b=rw:c=rw:d=ro", "plain,create=existing-path");
    write_file(&u.p("x/f"), b"1");
    write_file(&u.p("z/f"), b"2");
    write_file(&u.p("y/f"), b"3");
    fs::create_dir(u.p("z/sub")).unwrap();
    std::os::unix::fs::symlink("f", u.p("z/link")).unwrap();
    write_file(&u.p("top"), b"4");
    assert!(u.br("b/x/f").is_file() && !exists(&u.br("c/x/f")));
    assert!(u.br("c/z/f").is_file() && u.br("c/z/sub").is_dir());
    assert!(fs::symlink_metadata(u.br("c/z/link")).unwrap().is_symlink());
    assert!(!exists(&u.br("a/z")) && !exists(&u.br("b/z")));
    // No read-write branch holds y: the top one does, after a copy-up.
    assert!(u.br("a/y/f").is_file());
    assert!(u.br("a/top").is_file());
    assert_eq!(read_file(&u.p("z/f")), b"2");
}

#[test]
fn delete_all_removes_every_read_write_copy() {
    let mut u = Union::new(&[("a", None), ("b", None), ("c", None)]);
    for (p, data) in [
        ("a/f", "a"),
        ("b/f", "b"),
        ("c/f", "c"),
        ("b/g", "b"),
        ("c/g", "c"),
        ("a/h", "a"),
        ("b/h", "b"),
        ("b/k", "b"),
    ] {
        write_file(&u.br(p), data.as_bytes());
    }
    for d in ["a/dd", "b/dd", "b/ee", "c/ee"] {
        fs::create_dir(u.br(d)).unwrap();
    }
    write_file(&u.br("b/dd/x"), b"x");
    write_file(&u.br("c/ee/y"), b"y");
    u.mount("a=rw:b=rw:c=ro", "plain,delete=all");
    for f in ["f", "g", "h", "k"] {
        fs::remove_file(u.p(f)).unwrap();
        assert!(!exists(&u.p(f)), "{f} is gone");
        assert!(!exists(&u.br("b").join(f)), "{f} left b");
    }
    // A whiteout only where a read-only branch still holds the name.
    assert!(is_whiteout(&u.br("a/f")) && is_whiteout(&u.br("a/g")));
    assert!(!exists(&u.br("a/h")) && !exists(&u.br("a/k")));
    assert!(u.br("c/f").is_file() && u.br("c/g").is_file());
    // rmdir: ENOTEMPTY exactly while a visible entry remains.
    assert_eq!(errno_of(fs::remove_dir(u.p("dd"))), libc::ENOTEMPTY);
    fs::remove_file(u.p("dd/x")).unwrap();
    fs::remove_dir(u.p("dd")).unwrap();
    assert!(!exists(&u.br("a/dd")) && !exists(&u.br("b/dd")));
    assert_eq!(errno_of(fs::remove_dir(u.p("ee"))), libc::ENOTEMPTY);
    fs::remove_file(u.p("ee/y")).unwrap();
    fs::remove_dir(u.p("ee")).unwrap();
    assert!(is_whiteout(&u.br("a/ee")) && !exists(&u.br("b/ee")));
    u.remount();
    assert_eq!(names(&u.mnt), Vec::<String>::new(), "nothing resurfaces");
}

#[test]
fn delete_whiteout_leaves_the_lower_branches_alone() {
    let mut u = Union::new(&[("a", None), ("b", None), ("c", None)]);
    for p in ["b/f", "a/h", "b/h", "c/h"] {
        write_file(&u.br(p), p.as_bytes());
    }
    fs::create_dir(u.br("b/dd")).unwrap();
    u.mount("a=rw:b=rw:c=ro", "plain,delete=whiteout");
    fs::remove_file(u.p("f")).unwrap();
    fs::remove_file(u.p("h")).unwrap();
    fs::remove_dir(u.p("dd")).unwrap();
    for n in ["f", "h", "dd"] {
        assert!(is_whiteout(&u.br("a").join(n)), "{n} whited out in a");
    }
    assert!(u.br("b/f").is_file() && u.br("b/h").is_file() && u.br("b/dd").is_dir());
    u.remount();
    assert_eq!(names(&u.mnt), Vec::<String>::new());
}

/// Fills a tmpfs branch's inode table (with files that are part of the
/// union's tree, which is harmless here).
fn use_up_inodes(dir: &Path) {
    for i in 0.. {
        if fs::write(dir.join(format!("fill{i}")), b"").is_err() {
            return;
        }
    }
}

#[test]
fn a_step_that_fails_leaves_the_visible_tree_unchanged() {
    let mut u = Union::new(&[
        ("a", Some("size=1m,nr_inodes=64")),
        ("b", None),
        ("c", None),
    ]);
    write_file(&u.br("c/f"), b"lower");
    write_file(&u.br("b/g"), b"middle");
    write_file(&u.br("c/g"), b"lower");
    u.mount("a=rw:b=rw:c=ro", "plain");
    // Copied up into a, then the only whiteout a rename could leave has no
    // inode to take: the rename fails as a whole.
    fs::OpenOptions::new()
        .append(true)
        .open(u.p("f"))
        .unwrap()
        .set_len(3)
        .unwrap();
    use_up_inodes(&u.br("a"));
    assert_eq!(errno_of(fs::rename(u.p("f"), u.p("f2"))), libc::ENOSPC);
    assert_eq!(read_file(&u.br("a/f")), b"low", "the upper copy stays");
    assert!(!exists(&u.br("a/f2")));
    assert!(names(&u.mnt).contains(&"f".to_string()));
    assert!(!names(&u.mnt).contains(&"f2".to_string()));
    // delete=all must hide c's copy before it removes b's: the whiteout
    // fails, so nothing is removed.
    assert_eq!(errno_of(fs::remove_file(u.p("g"))), libc::ENOSPC);
    assert_eq!(read_file(&u.p("g")), b"middle");
    assert_eq!(read_file(&u.br("b/g")), b"middle");
    u.remount();
    assert_eq!(read_file(&u.p("f")), b"low", "the upper copy still shows");
    assert_eq!(read_file(&u.p("g")), b"middle");
}

#[test]
fn bad_create_and_delete_values_are_refused_with_one_line() {
    let mut u = Union::new(&[("a", None), ("b", None)]);
    for opt in ["create=ff", "delete=none", "create"] {
        u.spec = format!("{}=rw:{}=ro", u.br("a").display(), u.br("b").display());
        let out = Command::new(bin())
            .arg(&u.spec)
            .arg(&u.mnt)
            .args(["-o", opt])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{opt} accepted");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(opt.split('=').next().unwrap()), "{err}");
        assert!(!is_mounted(&u.mnt));
    }
}

/// An object a create policy put in a lower read-write branch is renamed
/// where it is (it was ENOENT: the rename ran in the top branch).
#[test]
fn objects_in_a_lower_read_write_branch_are_renamed_in_place() {
    let mut u = Union::new(&[("a", None), ("b", None), ("c", None)]);
    write_file(&u.br("b/f"), b"f");
    fs::create_dir(u.br("b/d")).unwrap();
    write_file(&u.br("b/d/in"), b"in");
    write_file(&u.br("b/victim"), b"old");
    write_file(&u.br("c/low"), b"low");
    u.mount("a=rw:b=rw:c=ro", "plain");
    fs::rename(u.p("f"), u.p("victim")).unwrap();
    fs::rename(u.p("d"), u.p("e")).unwrap();
    assert_eq!(read_file(&u.br("b/victim")), b"f");
    assert_eq!(read_file(&u.br("b/e/in")), b"in");
    assert!(!exists(&u.br("b/f")) && !exists(&u.br("b/d")));
    assert_eq!(names(&u.br("a")), vec![".chronofs"], "nothing in a");
    assert_eq!(names(&u.mnt), vec!["e", "low", "victim"]);
}

fn renameat2(a: &Path, b: &Path, flags: u32) -> i32 {
    rc(sys::renameat2(&cstr(a), &cstr(b), flags))
}

fn ino(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

/// An object in a lower read-write branch that cannot move in place is
/// brought into the top branch (a file copied up, a directory redirected)
/// and moved there: never EXDEV, numbers kept across a remount.
#[test]
fn objects_in_a_lower_read_write_branch_move_across_branches() {
    // With history (versioning) and without.
    for opts in ["plain", "passthrough=on"] {
        moves_across_branches(opts);
    }
}

fn moves_across_branches(opts: &str) {
    let mut u = Union::new(&[("a", None), ("b", None), ("c", None)]);
    fs::create_dir(u.br("a/only_a")).unwrap();
    fs::create_dir(u.br("c/only_c")).unwrap();
    write_file(&u.br("b/f"), b"f");
    fs::create_dir_all(u.br("b/d/sub")).unwrap();
    write_file(&u.br("b/d/in"), b"in");
    write_file(&u.br("b/d/sub/deep"), b"deep");
    write_file(&u.br("b/g"), b"g");
    write_file(&u.br("c/low"), b"low");
    write_file(&u.br("a/top"), b"top");
    write_file(&u.br("b/target"), b"target");
    write_file(&u.br("b/x"), b"x");
    write_file(&u.br("c/y"), b"y");
    write_file(&u.br("b/n"), b"n");
    write_file(&u.br("b/l"), b"l");
    fs::create_dir(u.br("b/e")).unwrap();
    write_file(&u.br("b/e/ein"), b"ein");
    u.mount("a=rw:b=rw:c=ro", opts);
    let before: Vec<u64> = ["f", "d", "g", "x", "y", "e", "n", "l", "d/in"]
        .iter()
        .map(|n| ino(&u.p(n)))
        .collect();
    // Into a directory only the top branch holds.
    fs::rename(u.p("f"), u.p("only_a/f")).unwrap();
    // A populated directory into one only the read-only branch holds.
    fs::rename(u.p("d"), u.p("only_c/d")).unwrap();
    // Over a read-only branch's file.
    fs::rename(u.p("g"), u.p("low")).unwrap();
    // The top branch's file over one in b: b's copy goes.
    fs::rename(u.p("top"), u.p("target")).unwrap();
    // NOREPLACE and EXCHANGE across branches.
    assert_eq!(
        renameat2(&u.p("n"), &u.p("only_a/f"), libc::RENAME_NOREPLACE),
        libc::EEXIST
    );
    assert_eq!(
        renameat2(&u.p("n"), &u.p("only_c/n"), libc::RENAME_NOREPLACE),
        0
    );
    assert_eq!(renameat2(&u.p("x"), &u.p("y"), libc::RENAME_EXCHANGE), 0);
    assert_eq!(
        renameat2(&u.p("e"), &u.p("only_a"), libc::RENAME_EXCHANGE),
        0
    );
    // A link of b's file into a directory b lacks.
    fs::hard_link(u.p("l"), u.p("only_c/l2")).unwrap();
    let check = |u: &Union| {
        assert_eq!(
            names(&u.mnt),
            vec!["e", "l", "low", "only_a", "only_c", "target", "x", "y"]
        );
        assert_eq!(read_file(&u.p("e/f")), b"f");
        assert_eq!(read_file(&u.p("only_c/d/in")), b"in");
        assert_eq!(read_file(&u.p("only_c/d/sub/deep")), b"deep");
        assert_eq!(read_file(&u.p("low")), b"g");
        assert_eq!(read_file(&u.p("target")), b"top");
        assert_eq!(read_file(&u.p("only_c/n")), b"n");
        assert_eq!(read_file(&u.p("x")), b"y");
        assert_eq!(read_file(&u.p("y")), b"x");
        assert_eq!(read_file(&u.p("only_a/ein")), b"ein");
        assert_eq!(read_file(&u.p("only_c/l2")), b"l");
        let after: Vec<u64> = [
            "e/f",
            "only_c/d",
            "low",
            "y",
            "x",
            "only_a",
            "only_c/n",
            "l",
            "only_c/d/in",
        ]
        .iter()
        .map(|n| ino(&u.p(n)))
        .collect();
        assert_eq!(after, before);
        assert_eq!(ino(&u.p("only_c/l2")), ino(&u.p("l")));
        assert_eq!(fs::metadata(u.p("l")).unwrap().nlink(), 2);
    };
    check(&u);
    // Each moved object left nothing visible behind, and b keeps no copy
    // of a file that moved up.
    assert!(!exists(&u.br("b/f")) && !exists(&u.br("b/g")) && !exists(&u.br("b/n")));
    assert!(
        !exists(&u.br("b/target")),
        "the replaced file goes from b too"
    );
    u.remount();
    check(&u);
}

/// More moves out of a lower read-write branch: hard links keep one
/// identity, a directory whose only lower copy is read-write gets a
/// redirect to it, an empty directory of b replaced goes from b.
#[test]
fn lower_read_write_moves_keep_links_and_redirect_directories() {
    for opts in ["plain", "passthrough=on"] {
        moves_keep_links_and_redirect(opts);
    }
}

fn moves_keep_links_and_redirect(opts: &str) {
    let mut u = Union::new(&[("a", None), ("b", None), ("c", None)]);
    fs::create_dir(u.br("a/only_a")).unwrap();
    write_file(&u.br("b/h1"), b"linked");
    fs::hard_link(u.br("b/h1"), u.br("b/h2")).unwrap();
    fs::create_dir(u.br("a/m")).unwrap();
    fs::create_dir(u.br("b/m")).unwrap();
    write_file(&u.br("b/m/inner"), b"inner");
    fs::create_dir(u.br("a/src")).unwrap();
    write_file(&u.br("a/src/s"), b"s");
    fs::create_dir(u.br("b/empty")).unwrap();
    u.mount("a=rw:b=rw:c=ro", opts);
    let h = ino(&u.p("h1"));
    let m = ino(&u.p("m"));
    fs::rename(u.p("h1"), u.p("only_a/h1")).unwrap();
    fs::rename(u.p("m"), u.p("only_a/m")).unwrap();
    fs::rename(u.p("src"), u.p("empty")).unwrap();
    let check = |u: &Union| {
        assert_eq!(names(&u.mnt), vec!["empty", "h2", "only_a"]);
        assert_eq!(ino(&u.p("only_a/h1")), h);
        assert_eq!(ino(&u.p("h2")), h);
        assert_eq!(fs::metadata(u.p("h2")).unwrap().nlink(), 2);
        assert_eq!(ino(&u.p("only_a/m")), m);
        assert_eq!(read_file(&u.p("only_a/m/inner")), b"inner");
        assert_eq!(read_file(&u.p("empty/s")), b"s");
    };
    check(&u);
    write_file(&u.p("h2"), b"changed");
    assert_eq!(read_file(&u.p("only_a/h1")), b"changed");
    assert!(
        !exists(&u.br("b/empty")),
        "the replaced directory goes from b"
    );
    u.remount();
    check(&u);
    assert_eq!(read_file(&u.p("only_a/h1")), b"changed");
    fs::remove_file(u.p("h2")).unwrap();
    assert_eq!(fs::metadata(u.p("only_a/h1")).unwrap().nlink(), 1);
}

/// A create over a whiteout takes the whiteout's place in one rename: the
/// end state as before (a directory opaque), no temporary left (fsck
/// clean), and a create that fails leaves the whiteout.
#[test]
fn a_create_over_a_whiteout_replaces_it_in_one_step() {
    let mut u = Union::new(&[("a", Some("size=1m,nr_inodes=64")), ("c", None)]);
    let hidden = ["d", "f", "s", "l", "full", "ren_d", "ren_f"];
    for n in hidden {
        fs::create_dir(u.br(&format!("c/{n}"))).unwrap();
        write_file(&u.br(&format!("c/{n}/old")), b"old");
    }
    write_file(&u.br("c/src"), b"src");
    u.mount("a=rw:c=ro", "plain");
    for n in hidden {
        fs::remove_dir_all(u.p(n)).unwrap();
        assert!(is_whiteout(&u.br(&format!("a/{n}"))));
    }
    fs::create_dir(u.p("d")).unwrap();
    write_file(&u.p("f"), b"new");
    std::os::unix::fs::symlink("target", u.p("s")).unwrap();
    fs::hard_link(u.p("src"), u.p("l")).unwrap();
    assert_eq!(names(&u.p("d")), Vec::<String>::new(), "opaque");
    assert_eq!(
        get_xattr(&u.br("a/d"), "trusted.overlay.opaque").unwrap(),
        b"y"
    );
    assert_eq!(read_file(&u.p("f")), b"new");
    assert_eq!(fs::read_link(u.p("s")).unwrap(), Path::new("target"));
    assert_eq!(ino(&u.p("l")), ino(&u.p("src")));
    assert_eq!(names(&u.mnt), vec!["d", "f", "l", "s", "src"]);
    // A rename onto a whited-out name takes its place in one step too.
    fs::create_dir(u.p("d/moved")).unwrap();
    write_file(&u.p("d/moved/new"), b"new");
    fs::rename(u.p("d/moved"), u.p("ren_d")).unwrap();
    fs::rename(u.p("f"), u.p("ren_f")).unwrap();
    assert_eq!(names(&u.p("ren_d")), vec!["new"]);
    assert_eq!(read_file(&u.p("ren_f")), b"new");
    assert!(
        !exists(&u.br("a/d/moved")),
        "nothing below: no whiteout left"
    );
    assert!(is_whiteout(&u.br("a/f")), "c/f stays hidden");
    assert_eq!(names(&u.mnt), vec!["d", "l", "ren_d", "ren_f", "s", "src"]);
    // No inode left for the new directory: the whiteout stays.
    use_up_inodes(&u.br("a"));
    let r = fs::create_dir(u.p("full"));
    assert_eq!(errno_of(r), libc::ENOSPC);
    assert!(is_whiteout(&u.br("a/full")));
    assert!(!exists(&u.p("full")));
    for e in fs::read_dir(u.br("a")).unwrap() {
        let n = e.unwrap().file_name();
        assert!(
            !n.to_string_lossy().starts_with(".chronofs-copyup."),
            "{n:?}"
        );
    }
    u.unmount();
    let spec = format!("{}=rw:{}=ro", u.br("a").display(), u.br("c").display());
    let out = Command::new(bin())
        .args(["fsck", spec.as_str()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn chronofs_out(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(bin()).args(args).output().unwrap()
}

/// `chronofs status` on a union lists every branch with its mode, usage
/// and where creates go; unmounted, the store alone answers (no branches).
#[test]
fn status_lists_the_branches_of_a_union() {
    let mut u = Union::new(&[("a", Some("8m")), ("b", Some("32m")), ("c", None)]);
    u.mount("a=rw:b=rw:c=ro", "create=mfs");
    let mnt = u.mnt.as_os_str();
    let out = chronofs_out(&["status".as_ref(), mnt, "--json".as_ref()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let un = &v["union"];
    assert_eq!(
        (
            un["create"].as_str(),
            un["delete"].as_str(),
            un["xattrs"].as_str()
        ),
        (Some("mfs"), Some("all"), Some("trusted"))
    );
    let b = un["branches"].as_array().unwrap();
    let modes: Vec<_> = b.iter().map(|x| x["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["rw", "rw", "ro"]);
    let creates: Vec<_> = b.iter().map(|x| x["creates"].as_bool().unwrap()).collect();
    assert_eq!(creates, [false, true, false], "b has the most free space");
    assert_eq!(b[1]["path"].as_str().unwrap(), u.br("b").to_str().unwrap());
    let size = b[1]["size_bytes"].as_u64().unwrap();
    assert_eq!(size, 32 << 20);
    assert_eq!(
        b[1]["used_bytes"].as_u64().unwrap() + b[1]["free_bytes"].as_u64().unwrap(),
        size
    );
    let text = chronofs_out(&["status".as_ref(), mnt]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("create=mfs delete=all marks=trusted.overlay.*"),
        "{text}"
    );
    let line = text.lines().find(|l| l.contains("<- creates")).unwrap();
    // Counted from 0, as `branch list` and `branch add --at` do.
    assert!(
        line.starts_with("  branch 1: ")
            && line.contains(" rw ")
            && line.contains(u.br("b").to_str().unwrap()),
        "{text}"
    );
    u.unmount();
    let out = chronofs_out(&["status".as_ref(), u.br("a").as_os_str(), "--json".as_ref()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["union"].is_null(), "unmounted: the store alone");
}

/// fsck of a branch list finds what a crash leaves (copy-up and whiteout
/// temporaries) and a redirect pointing nowhere, exits non-zero, repairs
/// them in read-write branches only, and is clean afterwards; a whiteout
/// over nothing is not a problem.
#[test]
fn fsck_of_a_branch_list_repairs_union_leftovers() {
    let mut u = Union::new(&[("a", None), ("b", None), ("c", None)]);
    fs::create_dir_all(u.br("a/d")).unwrap();
    write_file(&u.br("a/d/.chronofs-copyup.0123456789abcdef"), b"half");
    fs::create_dir(u.br("a/.chronofs-copyup.fedcba9876543210")).unwrap();
    write_file(&u.br("b/.chronofs-wh.77.1"), b"");
    fs::create_dir(u.br("a/moved")).unwrap();
    set_xattr(&u.br("a/moved"), "trusted.overlay.redirect", b"/gone", 0).unwrap();
    fs::create_dir_all(u.br("c/kept")).unwrap();
    fs::create_dir(u.br("a/ok")).unwrap();
    set_xattr(&u.br("a/ok"), "trusted.overlay.redirect", b"/kept", 0).unwrap();
    // Overlayfs's relative redirects, `mv d/sub d/sub2; mv d dren`: sub2's
    // names a directory beside its parent's lower copy (d), not beside
    // dren.
    fs::create_dir_all(u.br("c/d/sub")).unwrap();
    fs::create_dir_all(u.br("a/dren/sub2")).unwrap();
    set_xattr(&u.br("a/dren"), "trusted.overlay.redirect", b"d", 0).unwrap();
    set_xattr(&u.br("a/dren/sub2"), "trusted.overlay.redirect", b"sub", 0).unwrap();
    write_file(&u.br("c/.chronofs-wh.9.9"), b"");
    let mknod = Command::new("mknod")
        .arg(u.br("a/lone"))
        .args(["c", "0", "0"])
        .status();
    assert!(mknod.unwrap().success());
    let spec = format!(
        "{}=rw:{}=rw:{}=ro",
        u.br("a").display(),
        u.br("b").display(),
        u.br("c").display()
    );
    let fsck = |extra: &[&str]| {
        let mut args = vec!["fsck", spec.as_str(), "--json"];
        args.extend_from_slice(extra);
        let out = Command::new(bin()).args(&args).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        let mut found: Vec<(u64, String, bool)> = v["problems"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let path = p["path"].as_str().unwrap().to_string();
                (
                    p["branch"].as_u64().unwrap(),
                    path,
                    p["repaired"].as_bool().unwrap(),
                )
            })
            .collect();
        found.sort();
        (out.status.success(), found)
    };
    let want = |repaired: bool| {
        vec![
            (1, ".chronofs-copyup.fedcba9876543210".to_string(), repaired),
            (
                1,
                "d/.chronofs-copyup.0123456789abcdef".to_string(),
                repaired,
            ),
            (1, "moved".to_string(), repaired),
            (2, ".chronofs-wh.77.1".to_string(), repaired),
            (3, ".chronofs-wh.9.9".to_string(), false),
        ]
    };
    assert_eq!(fsck(&[]), (false, want(false)));
    assert_eq!(fsck(&["--repair"]), (false, want(true)), "c is read-only");
    assert!(!exists(&u.br("a/d/.chronofs-copyup.0123456789abcdef")));
    assert!(!exists(&u.br("b/.chronofs-wh.77.1")));
    assert!(get_xattr(&u.br("a/moved"), "trusted.overlay.redirect").is_err());
    assert_eq!(
        get_xattr(&u.br("a/ok"), "trusted.overlay.redirect").unwrap(),
        b"/kept"
    );
    assert_eq!(
        get_xattr(&u.br("a/dren/sub2"), "trusted.overlay.redirect").unwrap(),
        b"sub"
    );
    assert!(is_whiteout(&u.br("a/lone")) && u.br("c/.chronofs-wh.9.9").exists());
    fs::remove_file(u.br("c/.chronofs-wh.9.9")).unwrap();
    assert_eq!(fsck(&[]), (true, vec![]), "clean after the repair");
    // A running copy-up has a temporary too: no repair of mounted branches.
    u.mount("a=rw:b=rw:c=ro", "plain");
    let busy = Command::new(bin())
        .args(["fsck", spec.as_str(), "--repair"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(!busy.status.success());
    assert!(
        err.contains("unmount") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    let bad = Command::new(bin())
        .args(["fsck", "/nonexistent=rw:/x"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr)
            .trim_end()
            .lines()
            .count(),
        1
    );
}
