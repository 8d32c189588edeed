//! A versioning file system without a mount: a `Vfs` with history capture
//! over a temporary directory, driven through the library API the FUSE
//! adapter uses (`src/fuse/mod.rs`), on an injected clock.
//!
//! Only as many of these helpers touch `ObjectId`/`Seq` as must, so that
//! turning those aliases into newtypes means editing this file alone.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chronofs::branch::{BranchId, DirBranch};
use chronofs::capture::retention::PolicyCell;
use chronofs::capture::{Capture, CaptureConfig};
use chronofs::history::clock::ManualClock;
use chronofs::history::{self, Cause, Content, History, HistoryHandle, ObjectId, Seq};
use chronofs::policy::Policy;
use chronofs::store::Store;
use chronofs::vfs::{Caller, InodeNo, SetAttr, UnionBranch, Vfs, VfsConfig};

/// 2035-01-01T00:00:00Z: years after any real time these tests run, so a
/// rule that read the system clock instead of the injected one would see
/// every version in the future (nothing old enough to thin or expire).
pub const START_NS: i64 = 2_051_222_400_000_000_000;

pub struct Rig {
    pub vfs: Arc<Vfs>,
    pub capture: Arc<Capture>,
    pub history: HistoryHandle,
    pub clock: Arc<ManualClock>,
    pub src: PathBuf,
    /// A union's read-only branches, top first (none for a plain rig).
    pub lowers: Vec<PathBuf>,
    pub caller: Caller,
    // Dropped last: the vfs and the store hold descriptors inside it.
    pub dir: tempfile::TempDir,
}

impl Rig {
    pub fn new() -> Rig {
        Rig::with(CaptureConfig::default(), Policy::default())
    }

    pub fn with(cfg: CaptureConfig, policy: Policy) -> Rig {
        Rig::build(cfg, policy, &[], |_| {})
    }

    /// A union: SRC read-write over `lowers` read-only branches (`lowers`
    /// in the rig, top first), the lowest filled by `fill` before the vfs
    /// starts; with none, a plain rig whose SRC `fill` filled.
    pub fn union(lowers: usize, fill: impl FnOnce(&std::path::Path)) -> Rig {
        let writable = vec![false; lowers];
        Rig::build(
            CaptureConfig::default(),
            Policy::default(),
            &writable,
            |dirs| {
                if let Some(d) = dirs.last() {
                    fill(d)
                }
            },
        )
    }

    /// A union whose lower branches are read-write where `writable` says
    /// so; `fill` is given every lower branch's directory, top first.
    pub fn union_with(writable: &[bool], fill: impl FnOnce(&[PathBuf])) -> Rig {
        Rig::build(CaptureConfig::default(), Policy::default(), writable, fill)
    }

    fn build(
        cfg: CaptureConfig,
        policy: Policy,
        writable: &[bool],
        fill: impl FnOnce(&[PathBuf]),
    ) -> Rig {
        let lowers = writable.len();
        let dir = tempfile::Builder::new()
            .prefix("chronofs-inproc-")
            .tempdir_in(scratch())
            .unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let lower_dirs: Vec<PathBuf> = (1..=lowers)
            .map(|i| dir.path().join(format!("lower{i}")))
            .collect();
        for l in &lower_dirs {
            std::fs::create_dir(l).unwrap();
        }
        if lowers == 0 {
            fill(std::slice::from_ref(&src));
        } else {
            fill(&lower_dirs);
        }
        let clock = ManualClock::new(START_NS);
        let store = Store::open(&dir.path().join("store")).unwrap();
        // No applier thread: every query applies what is queued itself,
        // so nothing depends on a background thread's timing.
        let history = History::open_with_clock(&store, false, clock.clone()).unwrap();
        let inomap = store.inode_map().unwrap();
        let capture = Capture::new(Arc::clone(&history), cfg, Arc::new(PolicyCell::new(policy)));
        let cfg = VfsConfig::default();
        let branch = DirBranch::open(BranchId(0), &src, None).unwrap();
        let vfs = if lowers == 0 {
            Vfs::new(branch, inomap, cfg, Some(capture.clone())).unwrap()
        } else {
            let mut branches = vec![UnionBranch {
                branch,
                writable: true,
                id: 0,
            }];
            for (i, l) in lower_dirs.iter().enumerate() {
                branches.push(UnionBranch {
                    branch: DirBranch::open(BranchId(i as u32 + 1), l, None).unwrap(),
                    writable: writable[i],
                    id: i as u32 + 1,
                });
            }
            let opts = chronofs::vfs::UnionOptions::default();
            Vfs::new_union(branches, inomap, cfg, Some(capture.clone()), opts).unwrap()
        };
        let weak = Arc::downgrade(&vfs);
        capture.set_namer(Box::new(move |obj| weak.upgrade()?.name_of(obj)));
        Rig {
            vfs,
            capture,
            history,
            clock,
            src,
            lowers: lower_dirs,
            caller: Caller {
                uid: 0,
                gid: 0,
                pid: std::process::id(),
            },
            dir,
        }
    }

    /// Ends the rig as an unmount does (held-back versions built, every
    /// handle on the store dropped) and hands back its directory: the
    /// store can then be opened directly, as the CLI does with nothing
    /// mounted. Returns the directory, SRC and the store's path.
    pub fn close(self) -> (tempfile::TempDir, PathBuf, PathBuf) {
        self.capture.finish();
        let store = self.dir.path().join("store");
        let Rig {
            vfs,
            capture,
            history,
            src,
            dir,
            ..
        } = self;
        drop(vfs);
        drop(capture);
        drop(history);
        (dir, src, store)
    }

    /// Walks `path` from the root with lookups, as the kernel would.
    pub fn resolve(&self, path: &str) -> Result<InodeNo, i32> {
        let mut ino = InodeNo::ROOT;
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            ino = self
                .vfs
                .lookup(&self.caller, ino, OsStr::new(comp))
                .map_err(|e| e.errno())?
                .attr
                .ino;
        }
        Ok(ino)
    }

    /// The parent's inode and the last component.
    pub fn parent<'p>(&self, path: &'p str) -> Result<(InodeNo, &'p OsStr), i32> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let ino = self.resolve(dir)?;
        // The kernel's path walk refuses a parent that is not a directory.
        let attr = self.vfs.getattr(ino, None).map_err(|e| e.errno())?;
        if attr.kind() != libc::S_IFDIR {
            return Err(libc::ENOTDIR);
        }
        Ok((ino, OsStr::new(name)))
    }

    /// open(O_WRONLY|O_CREAT|O_TRUNC) + write + close, as the kernel sends
    /// it: LOOKUP, then CREATE or OPEN, WRITE, FLUSH, RELEASE.
    pub fn write_file(&self, path: &str, mode: u32, data: &[u8]) -> Result<(), i32> {
        let (dir, name) = self.parent(path)?;
        let fh = match self.vfs.lookup(&self.caller, dir, name) {
            Ok(e) => {
                self.vfs
                    .open(&self.caller, e.attr.ino, libc::O_WRONLY | libc::O_TRUNC)
                    .map_err(|e| e.errno())?
                    .fh
            }
            Err(e) if e.errno() == libc::ENOENT => {
                self.vfs
                    .create(
                        &self.caller,
                        dir,
                        name,
                        libc::S_IFREG | mode,
                        0,
                        libc::O_WRONLY,
                    )
                    .map_err(|e| e.errno())?
                    .1
                    .fh
            }
            Err(e) => return Err(e.errno()),
        };
        self.write_close(fh, 0, data)
    }

    /// pwrite at `off` into an existing file, then close.
    pub fn write_at(&self, path: &str, off: u64, data: &[u8]) -> Result<(), i32> {
        let ino = self.resolve(path)?;
        let fh = self
            .vfs
            .open(&self.caller, ino, libc::O_WRONLY)
            .map_err(|e| e.errno())?
            .fh;
        self.write_close(fh, off, data)
    }

    fn write_close(&self, fh: u64, off: u64, data: &[u8]) -> Result<(), i32> {
        let written = self.vfs.write(&self.caller, fh, off, data, false);
        self.vfs.flush(fh).map_err(|e| e.errno())?;
        self.vfs.release(fh).map_err(|e| e.errno())?;
        // The session's version is built by the ingest worker: waiting for
        // it here stamps it with the clock as it is now, whatever the test
        // does to the clock next.
        self.capture.settle();
        match written {
            Ok(n) if n == data.len() => Ok(()),
            Ok(_) => Err(libc::EIO),
            Err(e) => Err(e.errno()),
        }
    }

    pub fn setattr(&self, path: &str, set: SetAttr) -> Result<(), i32> {
        let ino = self.resolve(path)?;
        self.vfs
            .setattr(&self.caller, ino, set)
            .map(|_| ())
            .map_err(|e| e.errno())
    }

    /// Every queued version is recorded; returns the newest sequence
    /// number (the instant that now stands for the live tree).
    pub fn settle(&self) -> Seq {
        self.capture.settle();
        self.history
            .bounds()
            .unwrap()
            .map_or(Seq::ZERO, |(_, (seq, _))| seq)
    }
}

/// Where rigs live: `CHRONOFS_INPROC_TMP`, else /dev/shm (a store's
/// fsyncs cost nothing there: five times as many cases per second as on
/// this machine's disk), else the temporary directory.
fn scratch() -> PathBuf {
    if let Some(d) = std::env::var_os("CHRONOFS_INPROC_TMP") {
        return d.into();
    }
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() && tempfile::tempdir_in(shm).is_ok() {
        return shm.into();
    }
    std::env::temp_dir()
}

/// The history object of a live inode (the inode number is its id).
pub fn object(ino: InodeNo) -> ObjectId {
    ino.object()
}

impl Rig {
    /// Every recorded version of the file at `path` (live now): why it was
    /// recorded and its bytes (`None`: a deletion), what `chronofs log`
    /// and `cat --version` read.
    pub fn versions(&self, path: &str) -> Vec<(Cause, Option<Vec<u8>>)> {
        let obj = object(self.resolve(path).unwrap());
        self.versions_of(obj)
    }

    pub fn versions_of(&self, obj: ObjectId) -> Vec<(Cause, Option<Vec<u8>>)> {
        self.capture.settle();
        self.history
            .versions(obj, Seq::ZERO, Seq::MAX)
            .unwrap()
            .into_iter()
            .map(|(_, v)| {
                let data = match (&v.content, v.gone) {
                    (_, true) => None,
                    (Content::File { manifest }, false) => {
                        let m = self.history.manifest(manifest).unwrap();
                        let mut data = Vec::new();
                        history::content::write_to(self.history.chunks(), &m, &mut data).unwrap();
                        Some(data)
                    }
                    (other, false) => panic!("not a file's content: {other:?}"),
                };
                (v.cause, data)
            })
            .collect()
    }
}

/// A policy from the text of an administrator's file.
pub fn policy(text: &str) -> chronofs::policy::Policy {
    let file = chronofs::policy::parse(text, "test", chronofs::policy::Level::Admin).unwrap();
    chronofs::policy::Policy::new(Some(file), Vec::new())
}

/// What a path holds, as far as the tests compare it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    File { mode: u32, data: Vec<u8> },
    Dir { mode: u32 },
    Symlink { target: String },
}

/// The backing tree under `root` (what the vfs did to it).
pub fn live_tree(root: &std::path::Path) -> BTreeMap<String, Seen> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            let mode = md.permissions().mode() & 0o7777;
            let seen = if md.is_symlink() {
                let t = std::fs::read_link(e.path()).unwrap();
                Seen::Symlink {
                    target: t.into_os_string().into_string().unwrap(),
                }
            } else if md.is_dir() {
                stack.push((e.path(), rel.clone()));
                Seen::Dir { mode }
            } else {
                Seen::File {
                    mode,
                    data: std::fs::read(e.path()).unwrap(),
                }
            };
            out.insert(rel, seen);
        }
    }
    out
}

/// The tree history holds at `seq`, read with the queries `chronofs ls
/// --at` and `cat --at` build on (`list_at`, `object_at`, manifests).
pub fn tree_at(h: &History, seq: Seq) -> BTreeMap<String, Seen> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(history::ROOT, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let listing = h
            .list_at(dir, seq)
            .unwrap()
            .unwrap_or_else(|| panic!("directory {prefix:?} has no listing at {seq}"));
        for (name, obj) in listing {
            let name = String::from_utf8(name).unwrap();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let (_, v) = h
                .object_at(obj, seq)
                .unwrap()
                .unwrap_or_else(|| panic!("{rel} has no version at {seq}"));
            assert!(!v.gone, "{rel} is listed at {seq} but recorded as gone");
            let mode = v.attrs.mode & 0o7777;
            let seen = match v.content {
                Content::Dir => {
                    stack.push((obj, rel.clone()));
                    Seen::Dir { mode }
                }
                Content::File { manifest } => {
                    let m = h.manifest(&manifest).unwrap();
                    let mut data = Vec::new();
                    history::content::write_to(h.chunks(), &m, &mut data).unwrap();
                    assert_eq!(data.len() as u64, v.attrs.size, "{rel} at {seq}: size");
                    Seen::File { mode, data }
                }
                Content::Symlink { target } => Seen::Symlink {
                    target: String::from_utf8(target).unwrap(),
                },
                other => panic!("{rel} at {seq}: unexpected content {other:?}"),
            };
            out.insert(rel, seen);
        }
    }
    out
}

/// Deterministic bytes: `len` of them from `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut x = u32::from(seed).wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
