//! Power-cut tests: a history workload runs on a simulated store directory
//! (`store::sim`) that records every write, fsync and directory change;
//! then images of what a power cut could leave are built at every sync
//! point and at random points between, each opened, read and checked:
//! fsck finds no dangling reference or damaged chunk, and every version
//! acknowledged durable (by `sync`, as fsync and unmount do) reads back
//! exactly. `CHRONOFS_POWERCUT_SEED` replays one seed; the seed of a
//! failure is in its message.

use std::collections::BTreeMap;

use super::content::{self, Bases};
use super::model::*;
use super::{Draft, History, HistoryHandle};
use crate::store::sim::{Rng, Sim};
use crate::store::{chunks::ZSTD_LEVEL, Hash, Store};

/// Images per run (spread over the seeds below).
const IMAGES: usize = 1200;
const SEEDS: u64 = 12;

/// One recorded version and the bytes it must read back as.
#[derive(Clone)]
struct Expected {
    seq: Seq,
    obj: ObjectId,
    bytes: Vec<u8>,
}

/// What a run acknowledged: at each log position, the versions made
/// durable by then.
struct Run {
    sim: Sim,
    acks: Vec<(usize, usize)>,
    versions: Vec<Expected>,
}

fn open(sim: &Sim) -> HistoryHandle {
    let store = Store::open_with(Box::new(sim.clone()), "/sim".into()).expect("open store");
    History::open(&store, false).expect("open history")
}

/// Text-like content (so zstd and deltas have something to work with).
fn text(rng: &mut Rng, len: usize) -> Vec<u8> {
    const WORDS: [&str; 8] = [
        "chronofs ",
        "version ",
        "history ",
        "power ",
        "cut ",
        "chunk ",
        "pack\n",
        "index ",
    ];
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        if rng.chance(7) {
            out.extend_from_slice(format!("{:x} ", rng.next_u64()).as_bytes());
        } else {
            out.extend_from_slice(WORDS[rng.below(8) as usize].as_bytes());
        }
    }
    out.truncate(len);
    out
}

fn edit(rng: &mut Rng, old: &[u8]) -> Vec<u8> {
    if old.is_empty() || rng.chance(4) {
        let len = rng.below(120_000) as usize;
        return text(rng, len);
    }
    let mut new = old.to_vec();
    for _ in 0..=rng.below(3) {
        let at = rng.below(new.len() as u64 + 1) as usize;
        let cut = (rng.below(2_000) as usize).min(new.len() - at);
        let len = rng.below(3_000) as usize;
        let insert = text(rng, len);
        new.splice(at..at + cut, insert);
    }
    new
}

/// Stores `bytes` as a new version of `obj`; returns its sequence number.
fn record(h: &History, obj: ObjectId, bytes: &[u8], prev: Option<&Hash>) -> Seq {
    let _building = h.building();
    let chunks = h.chunks();
    let bases = prev.and_then(|m| h.manifest(m).ok()).map(|m| Bases::of(&m));
    let read_at = super::testkit::reader(bytes);
    let size = bytes.len() as u64;
    let (manifest, _) = content::ingest_sparse(
        chunks,
        &read_at,
        size,
        &[(0, size)],
        bases.as_ref(),
        ZSTD_LEVEL,
    )
    .expect("ingest");
    let (id, _) = chunks
        .put_against(&manifest.encode(), prev)
        .expect("manifest");
    let version = Version {
        time_ns: 0,
        who: Who::default(),
        cause: Cause::Write,
        attrs: Attrs {
            mode: 0o100644,
            size,
            nlink: 1,
            ..Attrs::default()
        },
        content: Content::File { manifest: id },
        xattrs: Vec::new(),
        gone: false,
    };
    h.commit(Draft {
        versions: vec![(obj, version)],
        ..Draft::default()
    })
    .expect("commit")
}

/// The workload: versions of a few files, with syncs (acknowledgements),
/// non-durable applies (queries), pack rotations, chunks nobody commits
/// (so collections have dead chunks to drop) and collections.
fn run(seed: u64) -> Run {
    let mut rng = Rng::new(seed);
    let sim = Sim::new();
    let history = open(&sim);
    history.chunks().set_pack_limit(96 << 10);
    let mut files: BTreeMap<ObjectId, (Vec<u8>, Option<Hash>)> = BTreeMap::new();
    let mut versions = Vec::new();
    let mut acks = Vec::new();
    for _ in 0..40 {
        let obj = ObjectId::new(100 + rng.below(5));
        let (old, prev) = files.get(&obj).cloned().unwrap_or_default();
        let bytes = edit(&mut rng, &old);
        let seq = record(&history, obj, &bytes, prev.as_ref());
        let manifest = match history.object_at(obj, seq).expect("read back") {
            Some((
                _,
                Version {
                    content: Content::File { manifest },
                    ..
                },
            )) => manifest,
            other => panic!("seed {seed}: version #{seq} reads back as {other:?}"),
        };
        files.insert(obj, (bytes.clone(), Some(manifest)));
        versions.push(Expected { seq, obj, bytes });
        if rng.chance(6) {
            // Chunks stored for a version that never gets committed.
            let _building = history.building();
            let junk = text(&mut rng, 30_000);
            history.chunks().put_against(&junk, None).expect("junk");
        }
        if rng.chance(8) {
            history.chunks().rotate();
        }
        if rng.chance(4) {
            history.settle().expect("settle");
        }
        if rng.chance(12) {
            history.gc(false, &mut |_, _, _| {}).expect("gc");
        }
        if rng.chance(5) {
            // A durable commit of the index from outside history (as the
            // inode map's flush makes): it makes the changes a query
            // applied durable too, while their journal records are not.
            history.set_ingest_complete().expect("ingest marker");
        }
        if rng.chance(4) {
            history.sync().expect("sync");
            acks.push((sim.log_len(), versions.len()));
        }
    }
    history.sync().expect("final sync");
    acks.push((sim.log_len(), versions.len()));
    drop(history);
    Run {
        sim,
        acks,
        versions,
    }
}

fn read_version(h: &History, e: &Expected) -> Result<Vec<u8>, String> {
    let Some((seq, v)) = h.object_at(e.obj, e.seq).map_err(|x| x.to_string())? else {
        return Err("missing".into());
    };
    if seq != e.seq {
        return Err(format!("found #{seq} instead"));
    }
    let Content::File { manifest } = v.content else {
        return Err("not a file".into());
    };
    let m = h.manifest(&manifest).map_err(|x| x.to_string())?;
    let mut out = Vec::new();
    content::write_to(h.chunks(), &m, &mut out).map_err(|x| x.to_string())?;
    Ok(out)
}

/// Opens the image and checks it; `Err` says what is wrong.
fn check_image(image: &Sim, acked: &[Expected]) -> Result<(), String> {
    let store = Store::open_with(Box::new(image.clone()), "/image".into())
        .map_err(|e| format!("store does not open: {e}"))?;
    let history =
        History::open(&store, false).map_err(|e| format!("history does not open: {e}"))?;
    let report = history
        .verify(None, &mut |_, _| {})
        .map_err(|e| format!("fsck failed: {e}"))?;
    if !report.problems.is_empty() {
        return Err(format!("fsck: {}", report.problems.join("; ")));
    }
    for e in acked {
        match read_version(&history, e) {
            Ok(bytes) if bytes == e.bytes => {}
            Ok(_) => return Err(format!("acknowledged version #{} reads wrong bytes", e.seq)),
            Err(why) => return Err(format!("acknowledged version #{} lost: {why}", e.seq)),
        }
    }
    changes_go_on(&history)
}

/// A change recorded after the open takes a number of its own (one that
/// an earlier change already holds would alter that change's records) and
/// reads back.
fn changes_go_on(history: &History) -> Result<(), String> {
    let after = Expected {
        seq: Seq::ZERO,
        obj: ObjectId::new(99),
        bytes: b"recorded after the cut\n".to_vec(),
    };
    let seq = record(history, after.obj, &after.bytes, None);
    history
        .sync()
        .map_err(|e| format!("sync after the cut: {e}"))?;
    let report = history
        .verify(None, &mut |_, _| {})
        .map_err(|e| format!("fsck after a change failed: {e}"))?;
    if !report.problems.is_empty() {
        return Err(format!(
            "fsck after change #{seq}: {}",
            report.problems.join("; ")
        ));
    }
    match read_version(
        history,
        &Expected {
            seq,
            ..after.clone()
        },
    ) {
        Ok(bytes) if bytes == after.bytes => Ok(()),
        other => Err(format!("change #{seq} after the cut reads {other:?}")),
    }
}

fn crash_points(run: &Run, rng: &mut Rng, want: usize) -> Vec<usize> {
    let mut points = run.sim.sync_points();
    // Just before each sync too: the moment an ordering bug shows.
    points.extend(run.sim.sync_points().iter().map(|p| p - 1));
    while points.len() < want {
        points.push(rng.below(run.sim.log_len() as u64 + 1) as usize);
    }
    points
}

#[test]
fn power_cut_images_keep_every_acknowledged_version() {
    let seeds: Vec<u64> = match std::env::var("CHRONOFS_POWERCUT_SEED") {
        Ok(s) => vec![s.parse().expect("CHRONOFS_POWERCUT_SEED is a number")],
        Err(_) => {
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs());
            (0..SEEDS)
                .map(|i| base.wrapping_mul(31).wrapping_add(i))
                .collect()
        }
    };
    let per_seed = IMAGES.div_ceil(seeds.len());
    let mut images = 0;
    for seed in seeds {
        let run = run(seed);
        let mut rng = Rng::new(seed ^ 0xC0FFEE);
        let points = crash_points(&run, &mut rng, per_seed);
        for (n, k) in points.iter().enumerate() {
            let acked_count = run
                .acks
                .iter()
                .filter(|(at, _)| *at <= *k)
                .map(|(_, count)| *count)
                .max()
                .unwrap_or(0);
            let image = run.sim.crash_image(*k, &mut rng);
            if let Err(why) = check_image(&image, &run.versions[..acked_count]) {
                panic!(
                    "seed {seed}, image {n} (log position {k} of {}): {why}\n\
                     replay: CHRONOFS_POWERCUT_SEED={seed} cargo test --release power_cut",
                    run.sim.log_len()
                );
            }
            images += 1;
        }
    }
    eprintln!("power-cut images checked: {images}");
    assert!(images >= 1000 || std::env::var("CHRONOFS_POWERCUT_SEED").is_ok());
}

/// The two versions the kill tests record read back: "first version"
/// of object 2 as `first`, "second version" of object 3 as `second`.
fn assert_first_and_second(history: &History, first: Seq, second: Seq) {
    for (seq, obj, bytes) in [
        (first, 2, &b"first version\n"[..]),
        (second, 3, &b"second version\n"[..]),
    ] {
        let want = Expected {
            seq,
            obj: ObjectId::new(obj),
            bytes: bytes.to_vec(),
        };
        assert_eq!(read_version(history, &want).as_deref(), Ok(bytes), "#{seq}");
    }
}

/// Two kills in a row: the first mount after a kill replays the journal
/// and empties it; a change journaled after that and lost to a second
/// kill before any durable commit must come back at the next open (it was
/// dropped: the replay had not recorded itself durable, so the change
/// after it looked like a gap).
#[test]
fn a_change_journaled_after_a_replay_survives_the_next_kill() {
    let sim = Sim::new();
    let history = open(&sim);
    let first = record(&history, ObjectId::new(2), b"first version\n", None);
    let after_first = sim.kill_image();
    drop(history);
    let history = open(&after_first);
    let second = record(&history, ObjectId::new(3), b"second version\n", None);
    let after_second = after_first.kill_image();
    drop(history);
    let history = open(&after_second);
    assert_first_and_second(&history, first, second);
}

/// A kill leaves journaled changes for the next open to replay, and the
/// store's disk is full by then: the open must succeed (a mount that
/// fails cannot be used to delete files and make room), the changes
/// stay journaled through another kill, and reach the index once there
/// is room.
#[test]
fn a_replay_on_a_full_store_waits_for_room_instead_of_failing_the_open() {
    let sim = Sim::new();
    let history = open(&sim);
    let first = record(&history, ObjectId::new(2), b"first version\n", None);
    // Enough changes that the index must grow to take them.
    let mut last = first;
    for i in 0..200u64 {
        let dirents = (0..100u64)
            .map(|n| Dirent {
                parent: ObjectId::new(1),
                name: format!("{i:04}-{n:04}-{}", "x".repeat(200)).into_bytes(),
                child: None,
            })
            .collect();
        last = history
            .commit(Draft {
                dirents,
                ..Draft::default()
            })
            .expect("commit");
    }
    let image = sim.kill_image();
    drop(history);
    image.set_full(true);
    let history = open(&image);
    assert_eq!(history.last_seq(), last, "the changes are still known");
    let full_again = image.kill_image();
    drop(history);
    full_again.set_full(true);
    let history = open(&full_again);
    full_again.set_full(false);
    history.sync().expect("sync once there is room");
    let second = record(&history, ObjectId::new(3), b"second version\n", None);
    assert!(second > first);
    let after = full_again.kill_image();
    drop(history);
    let history = open(&after);
    assert_first_and_second(&history, first, second);
    let report = history.verify(None, &mut |_, _| {}).expect("fsck");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// A change a query applied without durability is not applied again
/// over a maintenance edit made after it: neither by the next durable
/// apply nor by the replay after a kill (a pruned version came back; a
/// chunk location compaction moved went back into the deleted pack).
#[test]
fn maintenance_edits_are_not_undone_by_changes_applied_before_them() {
    let sim = Sim::new();
    let history = open(&sim);
    let seq = record(&history, ObjectId::new(5), b"to be pruned\n", None);
    // A query applies it without durability.
    history.settle().expect("settle");
    let key = super::tables::version_key(ObjectId::new(5), seq);
    {
        let txn = history.maintenance_txn().expect("maintenance");
        txn.open_table(super::tables::VERSIONS)
            .expect("versions")
            .remove(key.as_slice())
            .expect("remove");
        txn.commit().expect("commit");
    }
    let gone = |h: &History| h.object_at(ObjectId::new(5), seq).expect("query").is_none();
    assert!(gone(&history), "removed");
    history.sync().expect("sync");
    assert!(gone(&history), "the durable apply brought the version back");
    record(&history, ObjectId::new(6), b"later\n", None);
    let image = sim.kill_image();
    drop(history);
    let history = open(&image);
    assert!(gone(&history), "the replay brought the version back");
}

#[test]
fn a_failed_fsync_poisons_the_store_and_acknowledges_nothing_more() {
    let sim = Sim::new();
    let history = open(&sim);
    let acked = vec![Expected {
        seq: record(
            &history,
            ObjectId::new(7),
            b"durable before the failure",
            None,
        ),
        obj: ObjectId::new(7),
        bytes: b"durable before the failure".to_vec(),
    }];
    history.sync().expect("first sync");
    record(
        &history,
        ObjectId::new(7),
        &text(&mut Rng::new(3), 50_000),
        None,
    );
    sim.fail_sync_after(1);
    let err = history
        .sync()
        .expect_err("the sync whose fsync fails must fail");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    let why = history.poisoned().expect("the store is poisoned");
    assert!(why.contains("fsync"), "{why}");
    // Nothing later is acknowledged: a retried sync and new changes fail.
    assert!(history.sync().is_err(), "a retried sync succeeded");
    assert!(
        history.writable().is_err(),
        "a poisoned store takes changes"
    );
    // Reads still work.
    assert_eq!(
        read_version(&history, &acked[0]).as_deref(),
        Ok(&acked[0].bytes[..])
    );
    let end = sim.log_len();
    drop(history);
    let mut rng = Rng::new(11);
    for _ in 0..50 {
        let image = sim.crash_image(end, &mut rng);
        check_image(&image, &acked).expect("image after a failed fsync");
    }
}
