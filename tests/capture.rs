//! Capture in process: what makes a version, through the vfs calls the
//! FUSE adapter makes, with no mount.

mod inproc;

use inproc::*;

use chronofs::history::Cause;
use chronofs::vfs::{InodeNo, SetAttr};

fn causes(v: &[(Cause, Option<Vec<u8>>)]) -> Vec<Cause> {
    v.iter().map(|(c, _)| *c).collect()
}

#[test]
fn a_write_session_is_one_version() {
    let rig = Rig::new();
    rig.write_file("f", 0o644, b"").unwrap();
    let ino = rig.resolve("f").unwrap();
    let open = || rig.vfs.open(&rig.caller, ino, libc::O_WRONLY).unwrap().fh;
    // Two handles, interleaved writes: one session, ended by the last close.
    let (a, b) = (open(), open());
    rig.vfs.write(&rig.caller, a, 0, b"one ", false).unwrap();
    rig.vfs.write(&rig.caller, b, 4, b"two ", false).unwrap();
    rig.vfs.release(a).unwrap();
    assert_eq!(rig.versions("f").len(), 1, "a writer is still open");
    rig.vfs.write(&rig.caller, b, 8, b"three", false).unwrap();
    rig.vfs.flush(b).unwrap();
    rig.vfs.release(b).unwrap();
    let v = rig.versions("f");
    assert_eq!(causes(&v), [Cause::Create, Cause::Write]);
    assert_eq!(v[1].1.as_deref(), Some(&b"one two three"[..]));
}

#[test]
fn unchanged_content_makes_no_version() {
    let rig = Rig::new();
    rig.write_file("f", 0o644, b"same").unwrap();
    rig.write_file("f", 0o644, b"same").unwrap();
    // Opened for writing and closed without a write.
    let ino = rig.resolve("f").unwrap();
    let fh = rig.vfs.open(&rig.caller, ino, libc::O_WRONLY).unwrap().fh;
    rig.vfs.release(fh).unwrap();
    assert_eq!(causes(&rig.versions("f")), [Cause::Create]);
}

#[test]
fn metadata_changes_and_removal_are_versions() {
    let rig = Rig::new();
    rig.write_file("f", 0o644, b"data").unwrap();
    rig.setattr(
        "f",
        SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    rig.setattr(
        "f",
        SetAttr {
            size: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    let obj = object(rig.resolve("f").unwrap());
    rig.vfs
        .unlink(&rig.caller, InodeNo::ROOT, "f".as_ref())
        .unwrap();
    let v = rig.versions_of(obj);
    assert_eq!(
        causes(&v),
        [Cause::Create, Cause::Chmod, Cause::Truncate, Cause::Unlink]
    );
    assert_eq!(v[2].1.as_deref(), Some(&b"da"[..]));
    assert_eq!(v[3].1, None, "the last version records the deletion");
}

#[test]
fn a_file_that_predates_history_gets_a_baseline_before_its_first_change() {
    let rig = Rig::new();
    std::fs::write(rig.src.join("old"), b"before").unwrap();
    rig.write_file("old", 0o644, b"after").unwrap();
    let v = rig.versions("old");
    assert_eq!(causes(&v), [Cause::Baseline, Cause::Write]);
    assert_eq!(v[0].1.as_deref(), Some(&b"before"[..]));
    assert_eq!(v[1].1.as_deref(), Some(&b"after"[..]));
}

/// close(2) returns after FLUSH; the kernel sends RELEASE later, on its
/// own, so it may arrive while an unlink of the file is under way. The
/// session it ends is the file's last content: it must be recorded before
/// the removal, where undelete finds it, whichever request wins.
#[test]
fn a_release_racing_an_unlink_keeps_the_last_content() {
    let rig = Rig::new();
    for round in 0..200u32 {
        let name = format!("f{round}");
        let last = format!("second {round}");
        rig.write_file(&name, 0o644, b"first").unwrap();
        let ino = rig.resolve(&name).unwrap();
        let fh = rig
            .vfs
            .open(&rig.caller, ino, libc::O_WRONLY | libc::O_TRUNC)
            .unwrap()
            .fh;
        rig.vfs
            .write(&rig.caller, fh, 0, last.as_bytes(), false)
            .unwrap();
        rig.vfs.flush(fh).unwrap();
        let obj = object(ino);
        std::thread::scope(|s| {
            s.spawn(|| rig.vfs.release(fh).unwrap());
            rig.vfs
                .unlink(&rig.caller, InodeNo::ROOT, name.as_ref())
                .unwrap();
        });
        let v = rig.versions_of(obj);
        let gone = v.iter().position(|(c, _)| *c == Cause::Unlink);
        assert_eq!(gone, Some(v.len() - 1), "round {round}: {:?}", causes(&v));
        assert_eq!(
            v[v.len() - 2].1.as_deref(),
            Some(last.as_bytes()),
            "round {round}: {:?}",
            causes(&v)
        );
    }
}

/// A file that predates history is recorded before its first change; a
/// large one takes a while to read. Meanwhile another file's first change
/// does not wait for it (both baselines were serialised whole: the ingest
/// walk's largest file stalled every first change behind it).
#[test]
fn a_large_files_baseline_does_not_hold_up_another_files() {
    let big = pattern(256 << 20, 3);
    let rig = Rig::union(0, |src| {
        std::fs::write(src.join("big"), &big).unwrap();
        std::fs::write(src.join("small"), b"small").unwrap();
    });
    let store = rig.dir.path().join("store");
    let stored = || dir_bytes(&store);
    let before = stored();
    std::thread::scope(|s| {
        let recording = s.spawn(|| rig.write_at("big", 0, b"first change").unwrap());
        // Once the big file's baseline is storing its chunks.
        while stored() < before + (8 << 20) {
            assert!(
                !recording.is_finished(),
                "the baseline was too fast to watch"
            );
            std::thread::yield_now();
        }
        rig.write_at("small", 0, b"SMALL").unwrap();
        // The big file's chunks are not all stored yet: its baseline is
        // still reading it.
        let done = stored() - before;
        assert!(
            done < big.len() as u64,
            "the small file's change waited for the big file's baseline ({done} bytes stored)"
        );
        recording.join().unwrap();
    });
    assert_eq!(
        causes(&rig.versions("small")),
        [Cause::Baseline, Cause::Write]
    );
    assert_eq!(
        causes(&rig.versions("big")),
        [Cause::Baseline, Cause::Write]
    );
}

/// Bytes of the files under `dir`, recursively.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let md = e.metadata().unwrap();
        n += match md.is_dir() {
            true => dir_bytes(&e.path()),
            false => md.len(),
        };
    }
    n
}
