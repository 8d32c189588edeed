//! Clones driven through the `Vfs` API without a mount
//! (`src/vfs/clone.rs`): what the backing branch holds before and after a
//! clone's first use, and the answers the kernel cannot give itself.

mod inproc;

use inproc::*;

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;

use chronofs::vfs::InodeNo;

fn errno<T>(r: chronofs::vfs::Result<T>) -> i32 {
    r.err().map_or(0, |e| e.errno())
}

/// A rig with `t/a` ("hello"), `t/sub/b` ("bee"), cloned to `c`.
fn cloned() -> Rig {
    let rig = Rig::new();
    let (vfs, who) = (&rig.vfs, &rig.caller);
    vfs.mkdir(who, InodeNo::ROOT, OsStr::new("t"), 0o755, 0)
        .unwrap();
    let t = rig.resolve("t").unwrap();
    vfs.mkdir(who, t, OsStr::new("sub"), 0o750, 0).unwrap();
    rig.write_file("t/a", 0o640, b"hello").unwrap();
    rig.write_file("t/sub/b", 0o600, b"bee").unwrap();
    let at = rig.settle();
    vfs.clone_path(who, &[b"t".to_vec()], at, InodeNo::ROOT, OsStr::new("c"))
        .unwrap();
    rig
}

fn read_all(rig: &Rig, path: &str) -> Vec<u8> {
    let ino = rig.resolve(path).unwrap();
    let fh = rig.vfs.open(&rig.caller, ino, libc::O_RDONLY).unwrap().fh;
    let data = rig.vfs.read(fh, 0, 1 << 20).unwrap();
    rig.vfs.release(fh).unwrap();
    data
}

#[test]
fn a_clone_copies_nothing_until_used_and_reads_its_base() {
    let rig = cloned();
    // Made at once: the clone's directory exists, empty on disk.
    let c = rig.src.join("c");
    assert_eq!(std::fs::read_dir(&c).unwrap().count(), 0);
    // First use fills it with metadata copies: sizes and modes, no bytes.
    assert_eq!(read_all(&rig, "c/a"), b"hello");
    let a = std::fs::metadata(c.join("a")).unwrap();
    assert_eq!((a.len(), a.mode() & 0o7777, a.blocks()), (5, 0o640, 0));
    assert_eq!(
        std::fs::metadata(c.join("sub")).unwrap().mode() & 0o7777,
        0o750
    );
    assert_eq!(read_all(&rig, "c/sub/b"), b"bee");
    // A change copies the bytes in; the source never sees it.
    rig.write_at("c/a", 0, b"J").unwrap();
    assert_eq!(std::fs::read(c.join("a")).unwrap(), b"Jello");
    assert_eq!(read_all(&rig, "t/a"), b"hello");
}

#[test]
fn a_reader_of_a_clone_file_sees_a_later_writer() {
    let rig = cloned();
    let ino = rig.resolve("c/a").unwrap();
    let reader = rig.vfs.open(&rig.caller, ino, libc::O_RDONLY).unwrap().fh;
    assert_eq!(rig.vfs.read(reader, 0, 100).unwrap(), b"hello");
    rig.write_at("c/a", 0, b"HELLO").unwrap();
    assert_eq!(rig.vfs.read(reader, 0, 100).unwrap(), b"HELLO");
    rig.vfs.release(reader).unwrap();
}

#[test]
fn a_clone_directory_is_as_full_as_its_base_for_rmdir_and_rename() {
    let rig = cloned();
    let (vfs, who) = (&rig.vfs, &rig.caller);
    let c = rig.resolve("c").unwrap();
    assert_eq!(errno(vfs.rmdir(who, c, OsStr::new("sub"))), libc::ENOTEMPTY);
    vfs.mkdir(who, InodeNo::ROOT, OsStr::new("empty"), 0o755, 0)
        .unwrap();
    rig.resolve("empty").unwrap();
    let over = vfs.rename(
        who,
        InodeNo::ROOT,
        OsStr::new("empty"),
        c,
        OsStr::new("sub"),
        0,
    );
    assert_eq!(errno(over), libc::ENOTEMPTY);
    assert_eq!(read_all(&rig, "c/sub/b"), b"bee");
}

#[test]
fn bad_clones_are_refused_and_make_nothing() {
    let rig = cloned();
    let (vfs, who) = (&rig.vfs, &rig.caller);
    let at = rig.settle();
    let taken = vfs.clone_path(who, &[b"t".to_vec()], at, InodeNo::ROOT, OsStr::new("c"));
    assert_eq!(errno(taken), libc::ENOTEMPTY);
    let missing = vfs.clone_path(who, &[b"nope".to_vec()], at, InodeNo::ROOT, OsStr::new("d"));
    assert_eq!(errno(missing), libc::ENOENT);
    let reserved = vfs.clone_path(
        who,
        &[b"t".to_vec()],
        at,
        InodeNo::ROOT,
        OsStr::new(".history"),
    );
    assert_eq!(errno(reserved), libc::EEXIST);
    assert!(!rig.src.join("d").exists());
}

/// An existing DST is replaced as rename(2) replaces its target.
#[test]
fn a_clone_replaces_its_destination_as_rename_would() {
    let rig = cloned();
    let (vfs, who) = (&rig.vfs, &rig.caller);
    rig.write_file("f", 0o644, b"old").unwrap();
    vfs.mkdir(who, InodeNo::ROOT, OsStr::new("empty"), 0o755, 0)
        .unwrap();
    vfs.mkdir(who, InodeNo::ROOT, OsStr::new("full"), 0o755, 0)
        .unwrap();
    rig.write_file("full/x", 0o644, b"x").unwrap();
    let at = rig.settle();
    let (t, ta) = (vec![b"t".to_vec()], vec![b"t".to_vec(), b"a".to_vec()]);
    let root = InodeNo::ROOT;
    vfs.clone_path(who, &ta, at, root, OsStr::new("f")).unwrap();
    assert_eq!(read_all(&rig, "f"), b"hello");
    vfs.clone_path(who, &t, at, root, OsStr::new("empty"))
        .unwrap();
    assert_eq!(read_all(&rig, "empty/sub/b"), b"bee");
    let full = vfs.clone_path(who, &t, at, root, OsStr::new("full"));
    assert_eq!(errno(full), libc::ENOTEMPTY);
    assert_eq!(read_all(&rig, "full/x"), b"x");
    let over_file = vfs.clone_path(who, &t, at, root, OsStr::new("f"));
    assert_eq!(errno(over_file), libc::ENOTDIR);
    let over_dir = vfs.clone_path(who, &ta, at, root, OsStr::new("full"));
    assert_eq!(errno(over_dir), libc::EISDIR);
    // Nothing half-made is left: the backing root holds the names it did.
    let mut names: Vec<_> = std::fs::read_dir(&rig.src)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    assert_eq!(names, ["c", "empty", "f", "full", "t"]);
}
