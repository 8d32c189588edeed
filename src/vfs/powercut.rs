//! Power-cut tests of the mount's own durability promises: once fsync of
//! a directory returns, history's record of a rename in it survives any
//! power cut; once a clone has its name, the tag that keeps its base (and
//! tells the next mount to read marks) does (the images keep only what
//! was synced). The store runs on a
//! simulated directory that records every write and fsync
//! (`store::sim`); the source tree is a real temporary directory.

use std::ffi::OsStr;
use std::sync::Arc;

use super::{Caller, InodeNo, Vfs, VfsConfig};
use crate::branch::{BranchId, DirBranch};
use crate::capture::retention::PolicyCell;
use crate::capture::{Capture, CaptureConfig};
use crate::history::History;
use crate::store::sim::{Rng, Sim};
use crate::store::Store;

const IMAGES: u64 = 48;

fn write_new(vfs: &Vfs, caller: &Caller, name: &str, data: &[u8]) -> InodeNo {
    let (entry, opened) = vfs
        .create(
            caller,
            InodeNo::ROOT,
            OsStr::new(name),
            libc::S_IFREG | 0o644,
            0,
            libc::O_WRONLY,
        )
        .unwrap();
    assert_eq!(
        vfs.write(caller, opened.fh, 0, data, false).unwrap(),
        data.len()
    );
    vfs.flush(opened.fh).unwrap();
    vfs.release(opened.fh).unwrap();
    entry.attr.ino
}

/// A mount with history whose store is simulated (`src`: the real
/// branch directory, kept alive by the caller).
fn rig(
    sim: &Sim,
    src: &std::path::Path,
) -> (
    crate::history::HistoryHandle,
    Arc<Capture>,
    Arc<Vfs>,
    Caller,
) {
    let store = Store::open_with(Box::new(sim.clone()), "/sim".into()).unwrap();
    let history = History::open(&store, false).unwrap();
    let policy = Arc::new(PolicyCell::default());
    let capture = Capture::new(Arc::clone(&history), CaptureConfig::default(), policy);
    let branch = DirBranch::open(BranchId(0), src, None).unwrap();
    let inomap = store.inode_map().unwrap();
    let vfs = Vfs::new(branch, inomap, VfsConfig::default(), Some(capture.clone())).unwrap();
    let caller = Caller {
        uid: 0,
        gid: 0,
        pid: std::process::id(),
    };
    (history, capture, vfs, caller)
}

#[test]
fn a_clone_tag_survives_every_power_cut_once_the_clone_is_named() {
    let sim = Sim::new();
    let src = tempfile::tempdir().unwrap();
    let (history, capture, vfs, caller) = rig(&sim, src.path());
    write_new(&vfs, &caller, "f", b"base\n");
    capture.settle();
    let at = history.bounds().unwrap().unwrap().1 .0;
    let made = vfs
        .clone_path(
            &caller,
            &[b"f".to_vec()],
            at,
            InodeNo::ROOT,
            OsStr::new("c"),
        )
        .unwrap();
    let acknowledged = sim.log_len();
    for seed in 0..IMAGES {
        let image = sim.crash_image(acknowledged, &mut Rng::new(seed));
        let store = Store::open_with(Box::new(image), "/sim".into()).unwrap();
        let after = History::open(&store, false).unwrap();
        assert_eq!(
            after.tag(&made.tag).unwrap(),
            Some(at),
            "image {seed}: the clone outlives the tag that keeps its base"
        );
    }
    capture.finish();
}

#[test]
fn a_rename_survives_every_power_cut_after_fsync_of_its_directory() {
    let sim = Sim::new();
    let src = tempfile::tempdir().unwrap();
    let (history, capture, vfs, caller) = rig(&sim, src.path());
    let old = write_new(&vfs, &caller, "old", b"old\n");
    let new = write_new(&vfs, &caller, "new", b"new\n");
    capture.settle();
    history.sync().unwrap();
    assert_ne!(old, new);

    let root = InodeNo::ROOT;
    vfs.rename(&caller, root, OsStr::new("new"), root, OsStr::new("old"), 0)
        .unwrap();
    let dir = vfs.opendir(&caller, root, libc::O_RDONLY).unwrap();
    vfs.fsync(dir.fh, false).unwrap();
    let acknowledged = sim.log_len();

    for seed in 0..IMAGES {
        let image = sim.crash_image(acknowledged, &mut Rng::new(seed));
        let store = Store::open_with(Box::new(image), "/sim".into()).unwrap();
        let after = History::open(&store, false).unwrap();
        let root = root.object();
        assert_eq!(
            after.current_dirent(root, b"old").unwrap(),
            Some(Some(new.object())),
            "image {seed}: 'old' does not name the renamed file"
        );
        assert_eq!(
            after.current_dirent(root, b"new").unwrap(),
            Some(None),
            "image {seed}: 'new' is still named"
        );
    }
    vfs.releasedir(dir.fh).unwrap();
    capture.finish();
}
