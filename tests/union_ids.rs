//! Branch identity without position (docs/ARCHITECTURE.md "Live unions"):
//! a union's objects keep their inode numbers when the branch list is
//! reordered or a branch is inserted, and stores made before persistent
//! branch ids read their keys' branch positions as ids.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use chronofs::store::{BackingKey, BranchRoot, Store};

/// Objects in each branch: names of their own, so that every one stays
/// visible whatever the order (a shadowed name would change with it).
fn three_branches(b: &[PathBuf]) {
    write_file(&b[0].join("top.txt"), b"top");
    fs::create_dir(b[0].join("topdir")).unwrap();
    write_file(&b[1].join("one.txt"), b"one");
    fs::create_dir_all(b[1].join("onedir/sub")).unwrap();
    write_file(&b[1].join("onedir/sub/f"), b"f1");
    write_file(&b[2].join("two.txt"), b"two");
    fs::create_dir(b[2].join("twodir")).unwrap();
    write_file(&b[2].join("twodir/g"), b"g2");
    write_file(&b[2].join("h1"), b"linked");
    fs::hard_link(b[2].join("h1"), b[2].join("h2")).unwrap();
    // In both lowers: a merged directory, its entries from each. `both`
    // itself is left out of PATHS: it is numbered by its topmost copy,
    // which swapping the lowers changes (docs/ARCHITECTURE.md).
    fs::create_dir(b[1].join("both")).unwrap();
    fs::create_dir(b[2].join("both")).unwrap();
    write_file(&b[1].join("both/from1"), b"1");
    write_file(&b[2].join("both/from2"), b"2");
}

const PATHS: &[&str] = &[
    "top.txt",
    "topdir",
    "one.txt",
    "onedir",
    "onedir/sub",
    "onedir/sub/f",
    "two.txt",
    "twodir",
    "twodir/g",
    "h1",
    "h2",
    "both/from1",
    "both/from2",
    "copied.txt",
];

fn inos(m: &Mount) -> BTreeMap<&'static str, u64> {
    PATHS
        .iter()
        .map(|p| (*p, fs::symlink_metadata(m.p(p)).unwrap().ino()))
        .collect()
}

fn new_dir(m: &Mount, name: &str) -> PathBuf {
    let d = m.root().join(name);
    fs::create_dir(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn reordering_or_inserting_branches_keeps_inode_numbers() {
    for mode in ["plain", ""] {
        let mut m = Mount::union(mode, 2, |b| {
            three_branches(b);
            write_file(&b[2].join("copied.txt"), b"lower");
        });
        // A copy-up (the upper copy keeps the lower one's number) and a
        // copied-up hard link (the index entry is named by branch id).
        fs::set_permissions(m.p("copied.txt"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(m.p("h1"), fs::Permissions::from_mode(0o600)).unwrap();
        let before = inos(&m);
        assert_eq!(before["h1"], before["h2"]);
        m.unmount();

        // The two read-only branches swapped.
        m.lowers.reverse();
        m.start();
        assert_eq!(inos(&m), before, "mode {mode:?}: lowers swapped");
        m.unmount();

        // A new branch inserted between the read-write one and the others.
        let mid = new_dir(&m, "mid");
        write_file(&mid.join("mid.txt"), b"mid");
        m.lowers.insert(0, mid);
        m.start();
        assert_eq!(inos(&m), before, "mode {mode:?}: a branch inserted");
        let mid_ino = fs::metadata(m.p("mid.txt")).unwrap().ino();
        assert!(!before.values().any(|&i| i == mid_ino));
        m.unmount();

        // Back to the first order: still the same numbers.
        m.lowers.remove(0);
        m.lowers.reverse();
        m.start();
        assert_eq!(inos(&m), before, "mode {mode:?}: first order again");
    }
}

/// The fixture's recorded objects: (branch position, dev, ino, st_ino).
/// One line of a union fixture's EXPECTED: branch position, backing
/// (dev, ino), the inode number shown, path.
type FixtureLine = (u32, u64, u64, u64, String);

fn fixture_lines(expected: &str) -> Vec<FixtureLine> {
    expected
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].to_string(),
            )
        })
        .collect()
}

/// tests/fixtures/union/NAME.tar.gz unpacked in a fresh directory, and
/// the lines of NAME.expected.
fn unpack_fixture(name: &str) -> (tempfile::TempDir, Vec<FixtureLine>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/union");
    let expected =
        fixture_lines(&fs::read_to_string(dir.join(format!("{name}.expected"))).unwrap());
    let tmp = tempdir();
    let out = Command::new("tar")
        .arg("-C")
        .arg(tmp.path())
        .arg("-xzf")
        .arg(dir.join(format!("{name}.tar.gz")))
        .output()
        .unwrap();
    assert!(out.status.success(), "untar: {out:?}");
    (tmp, expected)
}

/// Every recorded object of a fixture maps, under the branch id its
/// position was, to the number the mount showed.
fn assert_fixture_keys(store: &Store, expected: &[FixtureLine]) {
    let map = store.inode_map().unwrap();
    for (pos, dev, ino, st_ino, path) in expected {
        let key = BackingKey {
            branch: *pos,
            dev: *dev,
            ino: *ino,
        };
        assert_eq!(map.get(&key).unwrap(), Some(*st_ino), "{path}");
    }
}

fn root_of(path: &Path) -> BranchRoot {
    use std::os::fd::AsFd;
    let dir = fs::File::open(path).unwrap();
    BranchRoot::of(fs::canonicalize(path).unwrap(), dir.as_fd()).unwrap()
}

/// tests/fixtures/union/union-f5: a union store written by a format-5
/// build (branch positions in its keys). Unpacked elsewhere its backing
/// (dev, ino) differ, so the check reads the store's keys as a mount
/// would: through the ids the branches get.
#[test]
fn a_format_5_union_store_reads_positions_as_ids() {
    let (tmp, expected) = unpack_fixture("union-f5");
    let branches: Vec<PathBuf> = ["src", "lower1", "lower2"]
        .iter()
        .map(|b| tmp.path().join(b))
        .collect();
    let roots: Vec<BranchRoot> = branches.iter().map(|b| root_of(b)).collect();
    let check = |order: &[usize]| {
        let store = Store::open(&branches[0].join(".chronofs")).unwrap();
        let wanted: Vec<BranchRoot> = order.iter().map(|&i| roots[i].clone()).collect();
        let ids = store.branch_ids(&wanted).unwrap();
        let map = store.inode_map().unwrap();
        for (pos, dev, ino, st_ino, path) in &expected {
            // Where the branch at fixture position `pos` is now.
            let now = order.iter().position(|&i| i == *pos as usize).unwrap();
            let key = BackingKey {
                branch: ids[now],
                dev: *dev,
                ino: *ino,
            };
            assert_eq!(
                map.get(&key).unwrap(),
                Some(*st_ino),
                "{path} (order {order:?})"
            );
        }
        ids
    };
    // The first mount after the upgrade, in the fixture's order.
    assert_eq!(check(&[0, 1, 2]), vec![0, 1, 2]);
    // Then reordered: each branch keeps the id its position gave it.
    assert_eq!(check(&[0, 2, 1]), vec![0, 2, 1]);
    // A union mount of the upgraded store works and fsck finds it clean.
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let spec = format!(
        "{}=rw:{}=ro:{}=ro",
        branches[0].display(),
        branches[1].display(),
        branches[2].display()
    );
    let ok = Command::new(bin())
        .args(["mount", &spec])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(ok.success());
    let guard = Unmount(mnt.clone());
    let listing = listing(&mnt);
    let umount = Command::new(bin())
        .arg("umount")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(umount.success());
    std::mem::forget(guard);
    for want in ["up.txt", "l1.txt", "l2.txt", "deep", "shared", "copied.txt"] {
        assert!(listing.iter().any(|n| n == want), "{want} in {listing:?}");
    }
}

/// Detaches a mount the test made by hand if the test fails before it
/// unmounts.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// tests/fixtures/union/union-f6: a union store of format 6, which kept
/// its branch tables in the index, written by a format-6 build that
/// changed the set while mounted (`LIVE=1` in make-union-fixture.sh:
/// branch 2 made read-write, then `snapshot --name s1`). Opened by this
/// build, the tables move to the branch registry (`branches.redb`) with
/// every id, both lists of the set and the snapshot's name, and the
/// index keeps its keys.
#[test]
fn a_format_6_union_store_keeps_its_branches_set_and_snapshots() {
    let (tmp, expected) = unpack_fixture("union-f6");
    let store_dir = tmp.path().join("src/.chronofs");
    assert!(!store_dir.join(chronofs::store::REGISTRY_FILE).exists());
    for _ in 0..2 {
        // Moved at the first open; the second finds it moved.
        let store = Store::open(&store_dir).unwrap();
        let names: Vec<(u32, String)> = store
            .branches()
            .unwrap()
            .into_iter()
            .map(|r| {
                let name = r.root.path.file_name().unwrap().to_string_lossy().into();
                (r.id, name)
            })
            .collect();
        let want: Vec<(u32, String)> = [(0, "src"), (1, "lower1"), (2, "lower2"), (3, "over-s1")]
            .into_iter()
            .map(|(id, n)| (id, n.to_string()))
            .collect();
        assert_eq!(names, want);
        let set = store.branch_set().unwrap().expect("the recorded set");
        assert_eq!(set.mounted, vec![(0, true), (1, false), (2, false)]);
        assert_eq!(set.live, vec![(3, true), (0, false), (1, false), (2, true)]);
        let snapshots = store.branch_set_log().snapshots().unwrap();
        assert_eq!(snapshots.len(), 1, "{snapshots:?}");
        assert_eq!((snapshots[0].name.as_str(), snapshots[0].branch), ("s1", 0));
        assert_fixture_keys(&store, &expected);
        assert!(store_dir.join(chronofs::store::REGISTRY_FILE).exists());
    }
    // The upgraded store checks clean.
    let out = Command::new(bin())
        .arg("fsck")
        .arg(tmp.path().join("src"))
        .output()
        .unwrap();
    assert!(out.status.success(), "fsck: {out:?}");
}

/// Versions `chronofs log --json` lists for `path` in the mount.
fn version_count(m: &Mount, path: &str) -> usize {
    let out = chronofs_ok(m, &["log", "--json", m.p(path).to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["versions"].as_array().expect("versions").len()
}

/// A reboot can give a branch's file system another device number (another
/// loop device, a disk enumerated in another order, a btrfs anonymous
/// device). Nothing keyed by the object may change with it: the inode
/// numbers shown, a copied-up hard link's identity (its other names must
/// see the copied-up data, not the lower file), and history (no version
/// of an unchanged file).
#[test]
fn a_device_renumbered_by_a_reboot_changes_no_number_link_or_version() {
    for mode in ["plain", ""] {
        for union in [true, false] {
            renumbered(mode, union);
        }
    }
}

/// [`a_device_renumbered_by_a_reboot_changes_no_number_link_or_version`]
/// for one mode, in a union or a single-directory mount.
fn renumbered(mode: &str, union: bool) {
    use common::logdisk::{ext4_image, DiskMount, Loop};
    let fill = |b: &[PathBuf]| {
        let (low, up) = (b.last().unwrap(), &b[0]);
        write_file(&low.join("a"), b"lower");
        fs::hard_link(low.join("a"), low.join("b")).unwrap();
        write_file(&up.join("c"), b"untouched");
        fs::create_dir(low.join("d")).unwrap();
    };
    let mode = &format!("{mode}{}", if union { "" } else { " (one directory)" });
    {
        let work = tempdir();
        let img = ext4_image(work.path(), 64 << 20);
        let ext = work.path().join("ext");
        fs::create_dir(&ext).unwrap();
        let first = Loop::attach(&img);
        let on_first = DiskMount::mount(&first.dev, &ext);
        let tree = ext.join("t");
        fs::create_dir(&tree).unwrap();
        let opts = mode.trim_end_matches(" (one directory)");
        let mut m = if union {
            Mount::union_in(Root::Kept(tree.clone()), opts, 1, fill)
        } else {
            Mount::new_in(Root::Kept(tree.clone()), opts, |src| {
                fill(&[src.to_path_buf()])
            })
        };
        append_all(&m.p("a"), b"+upper");
        fs::set_permissions(m.p("d"), fs::Permissions::from_mode(0o700)).unwrap();
        let names = ["a", "b", "c", "d"];
        let before: Vec<u64> = names
            .iter()
            .map(|n| fs::metadata(m.p(n)).unwrap().ino())
            .collect();
        assert_eq!(
            before[0], before[1],
            "mode {mode:?}: linked names, one number"
        );
        let versions: Vec<usize> = if opts.is_empty() {
            m.wait_history_ready();
            names.iter().map(|n| version_count(&m, n)).collect()
        } else {
            Vec::new()
        };
        let dev_before = fs::metadata(&tree).unwrap().dev();
        m.unmount();
        drop(on_first);

        // The same disk under another device number; `first` stays
        // attached (not mounted) so the new one cannot reuse its number.
        let second = Loop::attach(&img);
        assert_ne!(first.dev, second.dev);
        let on_second = DiskMount::mount(&second.dev, &ext);
        assert_ne!(fs::metadata(&tree).unwrap().dev(), dev_before);
        m.start();
        let after: Vec<u64> = names
            .iter()
            .map(|n| fs::metadata(m.p(n)).unwrap().ino())
            .collect();
        assert_eq!(
            after, before,
            "mode {mode:?}: numbers after the device changed"
        );
        for n in ["a", "b"] {
            assert_eq!(read_file(&m.p(n)), b"lower+upper", "mode {mode:?}: {n}");
        }
        assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 2, "mode {mode:?}");
        // A change through the other name reaches the same file.
        append_all(&m.p("b"), b"+again");
        assert_eq!(read_file(&m.p("a")), b"lower+upper+again", "mode {mode:?}");
        assert_eq!(read_file(&m.p("c")), b"untouched");
        assert_eq!(fs::read_dir(m.p("d")).unwrap().count(), 0);
        if opts.is_empty() {
            m.wait_history_ready();
            let now: Vec<usize> = names.iter().map(|n| version_count(&m, n)).collect();
            assert_eq!(
                &now[2..],
                &versions[2..],
                "mode {mode:?}: versions of unchanged objects"
            );
            // The file's history goes on (not a new object's).
            assert!(
                now[0] > versions[0],
                "mode {mode:?}: {now:?} after {versions:?}"
            );
        }
        m.unmount();
        drop(on_second);
        drop(second);
        drop(first);
    }
}

/// tests/fixtures/union/union-f8: a union store of format 8 whose branch
/// registry is of format 1 (rows without a key device), written by the
/// last build before key devices. Opened by this build, the registry is
/// upgraded in place, each row keys by the device it recorded, the keys
/// read back, and a branch found on another device number (the same
/// directory: its recorded inode, a birth time the row never had) keeps
/// the device its keys carry.
#[test]
fn a_registry_of_format_1_keys_by_its_recorded_devices() {
    let (tmp, expected) = unpack_fixture("union-f8");
    let store_dir = tmp.path().join("src/.chronofs");
    let store = Store::open(&store_dir).unwrap();
    let rows = store.branches().unwrap();
    assert_eq!(rows.len(), 3, "{rows:?}");
    for r in &rows {
        assert_eq!(r.key_dev, r.root.dev, "{r:?}");
        assert_eq!(r.root.born, None, "{r:?}");
    }
    assert_fixture_keys(&store, &expected);
    let renumbered: Vec<BranchRoot> = rows
        .iter()
        .map(|r| BranchRoot {
            dev: r.root.dev ^ 0x77,
            born: Some(1),
            ..r.root.clone()
        })
        .collect();
    let idents = store.branch_idents(&renumbered).unwrap();
    for (r, i) in rows.iter().zip(&idents) {
        assert_eq!((i.id, i.key_dev), (r.id, r.root.dev), "{r:?}");
    }
    drop(store);
    // Kept across the next open, in the rows now rewritten.
    let store = Store::open(&store_dir).unwrap();
    for r in store.branches().unwrap() {
        assert_eq!(r.key_dev ^ 0x77, r.root.dev, "{r:?}");
    }
}
