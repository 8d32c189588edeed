//! The control service answering from a store opened directly, with
//! nothing mounted (what the CLI does after an unmount): the history is
//! made in process by a vfs on a manual clock, the rig is closed, and the
//! requests `chronofs log`, `cat --version`, `ls --at` and `tag` send are
//! answered by a `Service` over the store alone.
//!
//! Requests and replies go through `control::call_local`, the CLI's own
//! entry for a local store.

mod inproc;

use inproc::*;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use chronofs::capture::retention::PolicyCell;
use chronofs::control::{self, At, PolicyHolder, Service};
use chronofs::history::clock::ManualClock;
use chronofs::history::past::LiveIds;
use chronofs::history::{History, HistoryHandle, ObjectId, ROOT};
use chronofs::store::{BackingKey, InodeMap, Store};

/// What the CLI's host for a local store knows: the persistent inode map.
/// It counts the service's settles (the CLI's does nothing on one).
struct StoreHost {
    inomap: InodeMap,
    root: (u64, u64),
    settles: Arc<AtomicUsize>,
}

impl control::service::Host for StoreHost {
    fn settle(&self) {
        self.settles.fetch_add(1, Ordering::Relaxed);
    }
}

impl LiveIds for StoreHost {
    fn identify(&self, st: &chronofs::sys::Stat) -> Option<ObjectId> {
        if (st.st_dev, st.st_ino) == self.root {
            return Some(ROOT);
        }
        let key = BackingKey {
            branch: 0,
            dev: st.st_dev,
            ino: st.st_ino,
        };
        self.inomap.get(&key).ok().flatten().map(ObjectId::new)
    }
}

struct Local {
    service: Service,
    _history: HistoryHandle,
    settles: Arc<AtomicUsize>,
}

fn open_local(src: &Path, store_dir: &Path) -> Local {
    let store = Store::open(store_dir).unwrap();
    // The CLI's history reads the system clock; this one is just past the
    // rig's instants (in 2035), so they are not "in the future".
    let clock = ManualClock::new(START_NS + 60_000_000_000);
    let history = History::open_with_clock(&store, false, clock).unwrap();
    let inomap = store.inode_map().unwrap();
    let root: OwnedFd = std::fs::File::open(src).unwrap().into();
    let md = std::fs::metadata(src).unwrap();
    use std::os::unix::fs::MetadataExt;
    let settles = Arc::new(AtomicUsize::new(0));
    let host = Box::new(StoreHost {
        inomap,
        root: (md.dev(), md.ino()),
        settles: Arc::clone(&settles),
    });
    let service = Service::new(
        Arc::clone(&history),
        root,
        None,
        host,
        store_dir.to_path_buf(),
        PolicyHolder {
            cell: Arc::new(PolicyCell::default()),
            source: chronofs::policy::load::Source {
                admin: None,
                users: false,
                known: None,
            },
            broken: None,
        },
    );
    Local {
        service,
        _history: history,
        settles,
    }
}

fn path(p: &str) -> Vec<Vec<u8>> {
    p.split('/').map(|c| c.as_bytes().to_vec()).collect()
}

impl Local {
    fn client(&self) -> control::Client<'_> {
        control::Client::Local(&self.service)
    }

    fn cat(&self, p: &str, version: i64) -> Vec<u8> {
        let mut data = Vec::new();
        self.client()
            .read(&path(p), &At::Now, Some(version), &mut data)
            .unwrap();
        data
    }

    fn read_at(&self, p: &str, at: &At) -> Vec<u8> {
        let mut data = Vec::new();
        self.client().read(&path(p), at, None, &mut data).unwrap();
        data
    }

    fn names(&self, p: &str, at: &At) -> Vec<String> {
        let listing = self.client().list(&path(p), at, false).unwrap();
        listing.entries.into_iter().filter_map(|e| e.name).collect()
    }
}

/// f: three versions a second apart from START_NS; at +3 s d/g made, at
/// +4 s g removed.
fn made_history() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let rig = Rig::new();
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        if i > 0 {
            rig.clock.advance(secs(1));
        }
        rig.write_file("f", 0o644, text.as_bytes()).unwrap();
    }
    rig.clock.advance(secs(1));
    let d = rig
        .vfs
        .mkdir(
            &rig.caller,
            chronofs::vfs::InodeNo::ROOT,
            "d".as_ref(),
            0o755,
            0,
        )
        .unwrap();
    rig.write_file("d/g", 0o600, b"gone soon").unwrap();
    rig.clock.advance(secs(1));
    rig.vfs
        .unlink(&rig.caller, d.attr.ino, "g".as_ref())
        .unwrap();
    rig.close()
}

#[test]
fn log_and_cat_are_answered_from_the_store_alone() {
    let (_dir, src, store) = made_history();
    let local = open_local(&src, &store);
    let log = local.client().log(&path("f"), None, None).unwrap();
    let rows = &log.versions;
    assert_eq!(rows.len(), 3, "{log:?}");
    let times: Vec<i64> = rows.iter().map(|r| r.time_ns).collect();
    // Stamped by the injected clock (the creation just after the root's
    // baseline: times strictly increase).
    assert!((START_NS..START_NS + 1000).contains(&times[0]), "{log:?}");
    assert_eq!(
        times[1..],
        [START_NS + 1_000_000_000, START_NS + 2_000_000_000],
        "{log:?}"
    );
    let n: Vec<usize> = rows.iter().filter_map(|r| r.n).collect();
    assert_eq!(n, [1, 2, 3]);
    assert_eq!(local.cat("f", 1), b"one");
    assert_eq!(local.cat("f", 2), b"two");
    // 0 is the newest, -1 the one before it.
    assert_eq!(local.cat("f", 0), b"three");
    assert_eq!(local.cat("f", -1), b"two");
    let e = local
        .client()
        .read(&path("f"), &At::Now, Some(4), &mut Vec::new())
        .unwrap_err();
    assert!(e.to_string().contains("there is no version 4"), "{e}");
    // A path never recorded says so (it said "has 0 version(s)").
    let e = local
        .client()
        .read(&path("never"), &At::Now, Some(0), &mut Vec::new())
        .unwrap_err();
    assert!(
        e.to_string().contains("never existed in recorded history"),
        "{e}"
    );
}

#[test]
fn instants_resolve_and_deleted_files_read_back() {
    let (_dir, src, store) = made_history();
    let local = open_local(&src, &store);
    let resolve = |t: i64| local.client().resolve(&At::Time(t)).unwrap().time_ns;
    assert_eq!(resolve(START_NS + 1_500_000_000), START_NS + 1_000_000_000);
    let e = local.client().resolve(&At::Time(START_NS - 1)).unwrap_err();
    assert!(e.to_string().contains("before history began"), "{e}");
    // d/g is gone live; at the instant before its removal it reads back.
    let at = At::Time(START_NS + 3_500_000_000);
    assert_eq!(local.names("d", &at), ["g"]);
    assert_eq!(local.read_at("d/g", &at), b"gone soon");
    assert!(local.names("d", &At::Now).is_empty());
}

#[test]
fn a_tag_made_without_a_mount_names_its_instant() {
    let (_dir, src, store) = made_history();
    let local = open_local(&src, &store);
    local
        .client()
        .tag("v1", At::Time(START_NS + 500_000_000))
        .unwrap();
    let tags = local.client().tags().unwrap();
    assert_eq!(
        tags.tags
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["v1"]
    );
    // Reading at the tag gives the file as it was then.
    assert_eq!(local.read_at("f", &At::Tag("v1".into())), b"one");
}

#[test]
fn branch_requests_do_not_wait_for_versions_being_built() {
    let (_dir, src, store) = made_history();
    let local = open_local(&src, &store);
    let settles = || local.settles.load(Ordering::Relaxed);
    // Nothing is mounted, so there are no branches: refused, unsettled.
    let e = local.client().branches().unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    local.client().branch_mode("0", false, false).unwrap_err();
    assert_eq!(settles(), 0);
    // A history request waits for them.
    local.client().tags().unwrap();
    assert_eq!(settles(), 1);
}

/// Distinct small files deduplicate nothing: the ratio is 1, not less
/// (the manifests' bytes were counted as content, 0.08x for one file).
#[test]
fn dedup_of_distinct_files_is_one() {
    let (_dir, src, store) = made_history();
    let local = open_local(&src, &store);
    let status = local.client().status().unwrap();
    assert!(
        (status.dedup_ratio - 1.0).abs() < 1e-9,
        "dedup {} (logical {} bytes, chunks {} bytes)",
        status.dedup_ratio,
        status.logical_bytes,
        status.chunk_bytes
    );
}

/// `ls --deleted`: a name made and deleted twice lists both deletions,
/// each reading back what that file held (only the last was listed).
#[test]
fn each_deletion_of_a_name_is_listed() {
    let rig = Rig::new();
    let mut removed = Vec::new();
    for text in ["first file", "second file"] {
        rig.write_file("x", 0o644, text.as_bytes()).unwrap();
        rig.clock.advance(secs(1));
        rig.vfs
            .unlink(&rig.caller, chronofs::vfs::InodeNo::ROOT, "x".as_ref())
            .unwrap();
        rig.clock.advance(secs(1));
        removed.push(text);
    }
    let (_dir, src, store) = rig.close();
    let local = open_local(&src, &store);
    let listing = local.client().list(&Vec::new(), &At::Now, true).unwrap();
    let gone: Vec<_> = listing
        .deleted
        .iter()
        .filter(|e| e.name_bytes() == b"x")
        .collect();
    assert_eq!(gone.len(), 2, "{:?}", listing.deleted);
    assert!(gone[0].deleted_seq < gone[1].deleted_seq);
    for (e, text) in gone.iter().zip(removed) {
        assert_eq!(local.read_at("x", &At::Seq(e.restore_seq)), text.as_bytes());
    }
}
