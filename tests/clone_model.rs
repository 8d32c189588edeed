//! Clones (`chronofs clone`, src/vfs/clone.rs) against an in-memory
//! reference model, in process (no FUSE, no daemon).
//!
//! Each case builds a random small tree under `t/` (directories, regular
//! files of 0-64 KiB, hard links among them, often across directories,
//! symlinks), through the vfs or natively before the vfs starts (then
//! recorded by the first-mount walk), and settles: the clone's instant.
//! In some cases the source then changes (a few operations) before
//! `t` is cloned to `c` as of that instant, so the clone reads history's
//! copies rather than the live files. The model of `c` is a deep copy of
//! `t`'s at the instant, hard links kept as shared file identities. Then
//! a random sequence of operations runs, each on the source side or on
//! the clone side (write at an offset, overwrite, exclusive create,
//! truncate, chmod, mkdir, rmdir, symlink, link and rename within the
//! side, unlink, read). After each operation its outcome (success, the
//! exact errno, the bytes a read returned) must be the model's, and the
//! source side must be the model's; at random checkpoints and at the end,
//! so is the clone side (walked with opendir/readdir/lookup/getattr/read/
//! readlink, which fills what it meets: until a checkpoint or an
//! operation reaches them, directories stay unfilled and files
//! unmaterialised). A side matches its model in its paths, kinds, modes,
//! contents and symlink targets, link counts (a regular file: its names
//! inside that side; a directory: 2 + its subdirectories), and hard-link
//! identity (names of one model file share an inode number, others do
//! not, and no inode is on both sides); lookup, getattr and readdir agree
//! with each other. At the end, `.history/@SEQ/` for the instant right
//! after the clone must show both sides as the model had them then: the
//! clone whole, though it was filled later.
//!
//! Environment: `CHRONOFS_CLONE_CASES` (default 48), `CHRONOFS_VFS_SEED`.

mod inproc;
mod model;

use inproc::*;
use model::{errname, runner};

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fmt::Display;

use chronofs::vfs::{InodeNo, SetAttr, VfsError};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------
// Operations

/// Names inside a side: few, so that operations collide. The tree that
/// is cloned has its directories among `DIRS` and its files, hard links
/// and symlinks among `LEAVES`; operations also use names it leaves free.
const DIRS: &[&str] = &["a", "b", "a/x"];
const LEAVES: &[&str] = &["f", "g", "a/f", "a/g", "a/x/f", "b/f", "b/g"];
const REL: &[&str] = &[
    "a", "b", "a/x", "f", "g", "a/f", "a/g", "a/x/f", "b/f", "b/g", "h", "a/h", "b/h", "a/x/h",
];
const TARGETS: &[&str] = &["f", "../g", "/nonexistent", "x/f"];
const MODES: &[u32] = &[0o644, 0o600, 0o755, 0o444, 0o700];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Src,
    Clone,
}

impl Side {
    fn root(self) -> &'static str {
        match self {
            Side::Src => "t",
            Side::Clone => "c",
        }
    }
}

fn full(side: Side, rel: &str) -> String {
    format!("{}/{rel}", side.root())
}

#[derive(Clone, Debug)]
enum Op {
    /// open(O_WRONLY|O_CREAT|O_TRUNC), write, close.
    Write(Side, &'static str, u32, usize, u8),
    /// open(O_WRONLY|O_CREAT|O_EXCL), write, close.
    Create(Side, &'static str, u32, usize, u8),
    /// open(O_WRONLY), pwrite at an offset, close.
    WriteAt(Side, &'static str, u64, usize, u8),
    Truncate(Side, &'static str, u64),
    Chmod(Side, &'static str, u32),
    Mkdir(Side, &'static str, u32),
    Rmdir(Side, &'static str),
    Symlink(Side, &'static str, &'static str),
    Link(Side, &'static str, &'static str),
    Unlink(Side, &'static str),
    Rename(Side, &'static str, &'static str),
    /// open(O_RDONLY), pread, close.
    Read(Side, &'static str, u64, usize),
}

fn rel() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(REL)
}

/// A name that is more often than not a file (or a symlink).
fn leafy() -> impl Strategy<Value = &'static str> {
    prop_oneof![4 => proptest::sample::select(LEAVES), 1 => rel()]
}

fn mode() -> impl Strategy<Value = u32> {
    proptest::sample::select(MODES)
}

/// Either side: operations after the clone.
fn either() -> BoxedStrategy<Side> {
    prop_oneof![2 => Just(Side::Src), 3 => Just(Side::Clone)].boxed()
}

/// The source side alone: operations between the clone's instant and the
/// clone.
fn source() -> BoxedStrategy<Side> {
    Just(Side::Src).boxed()
}

/// File sizes of the tree that is cloned: 0-64 KiB, and some larger
/// ones, which a write patches rather than copies (`PATCH_MIN`).
fn fill_len() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0usize..300, 2 => 0usize..=65_536, 1 => 65_536usize..=160_000]
}

/// What one of `LEAVES` is in the tree that is cloned.
#[derive(Clone, Debug)]
enum Leaf {
    Absent,
    File(u32, usize, u8),
    /// A hard link to an earlier leaf (if that is a file).
    Link(proptest::sample::Index),
    Symlink(&'static str),
}

/// What builds the source tree before the clone: most directories, most
/// files, hard links (often across directories), a few symlinks.
fn fill() -> impl Strategy<Value = Vec<Op>> {
    let s = Side::Src;
    let leaf = prop_oneof![
        2 => Just(Leaf::Absent),
        6 => (mode(), fill_len(), any::<u8>()).prop_map(|(m, n, x)| Leaf::File(m, n, x)),
        4 => any::<proptest::sample::Index>().prop_map(Leaf::Link),
        1 => proptest::sample::select(TARGETS).prop_map(Leaf::Symlink),
    ];
    (
        proptest::collection::vec(proptest::option::weighted(0.85, mode()), DIRS.len()),
        proptest::collection::vec(leaf, LEAVES.len()),
    )
        .prop_map(move |(dirs, leaves)| {
            let mut ops = Vec::new();
            for (d, m) in DIRS.iter().zip(dirs) {
                if let Some(m) = m {
                    ops.push(Op::Mkdir(s, d, m | 0o700));
                }
            }
            for (i, (p, leaf)) in LEAVES.iter().zip(leaves).enumerate() {
                match leaf {
                    Leaf::Absent => {}
                    Leaf::File(m, n, x) => ops.push(Op::Write(s, p, m, n, x)),
                    Leaf::Link(_) if i == 0 => ops.push(Op::Write(s, p, 0o644, 1, 0)),
                    Leaf::Link(to) => ops.push(Op::Link(s, LEAVES[to.index(i)], p)),
                    Leaf::Symlink(t) => ops.push(Op::Symlink(s, p, t)),
                }
            }
            ops
        })
}

fn op(side: fn() -> BoxedStrategy<Side>) -> impl Strategy<Value = Op> {
    let len = || prop_oneof![4 => 0usize..3000, 1 => 3000usize..20_000];
    prop_oneof![
        4 => (side(), leafy(), 0u64..80_000, len(), any::<u8>())
            .prop_map(|(s, p, o, n, x)| Op::WriteAt(s, p, o, n, x)),
        2 => (side(), rel(), mode(), len(), any::<u8>())
            .prop_map(|(s, p, m, n, x)| Op::Write(s, p, m, n, x)),
        2 => (side(), rel(), mode(), len(), any::<u8>())
            .prop_map(|(s, p, m, n, x)| Op::Create(s, p, m, n, x)),
        3 => (side(), leafy(), prop_oneof![Just(0u64), 0u64..100_000])
            .prop_map(|(s, p, n)| Op::Truncate(s, p, n)),
        1 => (side(), rel(), mode()).prop_map(|(s, p, m)| Op::Chmod(s, p, m)),
        2 => (side(), rel(), mode()).prop_map(|(s, p, m)| Op::Mkdir(s, p, m | 0o700)),
        2 => (side(), rel()).prop_map(|(s, p)| Op::Rmdir(s, p)),
        1 => (side(), rel(), proptest::sample::select(TARGETS))
            .prop_map(|(s, p, t)| Op::Symlink(s, p, t)),
        4 => (side(), leafy(), rel()).prop_map(|(s, a, b)| Op::Link(s, a, b)),
        3 => (side(), leafy()).prop_map(|(s, p)| Op::Unlink(s, p)),
        3 => (side(), rel(), rel()).prop_map(|(s, a, b)| Op::Rename(s, a, b)),
        4 => (side(), leafy(), 0u64..70_000, 0usize..70_000)
            .prop_map(|(s, p, o, n)| Op::Read(s, p, o, n)),
    ]
}

/// An operation, and whether to compare the clone side with its model
/// after it (a checkpoint: the walk fills everything it meets).
fn step() -> impl Strategy<Value = (Op, bool)> {
    (op(either), proptest::bool::weighted(0.12))
}

// ---------------------------------------------------------------------------
// The model: the whole mount, by full path

#[derive(Clone, Debug)]
enum Node {
    /// A regular file: an index into `files` (hard links share it).
    File(usize),
    Dir(u32),
    Symlink(String),
}

#[derive(Clone, Debug)]
struct FileData {
    mode: u32,
    data: Vec<u8>,
}

#[derive(Clone, Debug, Default)]
struct Model {
    entries: BTreeMap<String, Node>,
    files: Vec<FileData>,
}

enum Outcome {
    /// Not run: the kernel would decide it without the file system.
    Skip,
    Fails(i32),
    Succeeds,
    /// A read, and the bytes it returns.
    Reads(Vec<u8>),
}

fn parent_of(p: &str) -> &str {
    p.rsplit_once('/').map_or("", |(d, _)| d)
}

/// One side's tree as a comparison sees it.
#[derive(Debug, PartialEq, Eq)]
struct Shown {
    tree: BTreeMap<String, Seen>,
    /// Link counts: a regular file's and a directory's.
    nlink: BTreeMap<String, u64>,
    /// The names of each regular file, grouped (hard links).
    files: BTreeSet<Vec<String>>,
}

impl Model {
    fn walk_parent(&self, path: &str) -> Result<(), i32> {
        let mut cur = String::new();
        for comp in parent_of(path).split('/').filter(|c| !c.is_empty()) {
            if !cur.is_empty() {
                cur.push('/');
            }
            cur.push_str(comp);
            match self.entries.get(&cur) {
                None => return Err(libc::ENOENT),
                Some(Node::Dir(_)) => {}
                Some(_) => return Err(libc::ENOTDIR),
            }
        }
        Ok(())
    }

    fn resolve(&self, path: &str) -> Result<&Node, i32> {
        self.walk_parent(path)?;
        self.entries.get(path).ok_or(libc::ENOENT)
    }

    fn has_children(&self, dir: &str) -> bool {
        let prefix = format!("{dir}/");
        self.entries.keys().any(|k| k.starts_with(&prefix))
    }

    fn file_mut(&mut self, path: &str) -> &mut FileData {
        match self.entries[path] {
            Node::File(i) => &mut self.files[i],
            _ => unreachable!("not a file: {path}"),
        }
    }

    fn new_file(&mut self, path: &str, mode: u32, data: Vec<u8>) {
        self.files.push(FileData { mode, data });
        let id = self.files.len() - 1;
        self.entries.insert(path.to_string(), Node::File(id));
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        use Outcome::*;
        let r = |res: Result<(), i32>| match res {
            Ok(()) => Succeeds,
            Err(e) => Fails(e),
        };
        match *op {
            Op::Write(s, p, m, n, x) => {
                let p = full(s, p);
                if let Err(e) = self.walk_parent(&p) {
                    return Fails(e);
                }
                match self.entries.get(&p) {
                    Some(Node::File(_)) => self.file_mut(&p).data = pattern(n, x),
                    Some(_) => return Skip,
                    None => self.new_file(&p, m, pattern(n, x)),
                }
                Succeeds
            }
            Op::Create(s, p, m, n, x) => {
                let p = full(s, p);
                r((|| {
                    self.walk_parent(&p)?;
                    if self.entries.contains_key(&p) {
                        return Err(libc::EEXIST);
                    }
                    self.new_file(&p, m, pattern(n, x));
                    Ok(())
                })())
            }
            Op::WriteAt(s, p, off, n, x) => {
                let p = full(s, p);
                match self.resolve(&p) {
                    Err(e) => Fails(e),
                    // A write of nothing changes nothing, past the end
                    // either.
                    Ok(Node::File(_)) if n == 0 => Succeeds,
                    Ok(Node::File(_)) => {
                        let f = self.file_mut(&p);
                        let (off, end) = (off as usize, off as usize + n);
                        if f.data.len() < end {
                            f.data.resize(end, 0);
                        }
                        f.data[off..end].copy_from_slice(&pattern(n, x));
                        Succeeds
                    }
                    Ok(_) => Skip,
                }
            }
            Op::Truncate(s, p, size) => {
                let p = full(s, p);
                match self.resolve(&p) {
                    Err(e) => Fails(e),
                    Ok(Node::File(_)) => {
                        self.file_mut(&p).data.resize(size as usize, 0);
                        Succeeds
                    }
                    Ok(Node::Dir(_)) => Fails(libc::EISDIR),
                    Ok(Node::Symlink(_)) => Skip,
                }
            }
            Op::Chmod(s, p, m) => {
                let p = full(s, p);
                match self.resolve(&p) {
                    Err(e) => Fails(e),
                    Ok(Node::File(_)) => {
                        self.file_mut(&p).mode = m;
                        Succeeds
                    }
                    Ok(Node::Dir(_)) => {
                        self.entries.insert(p, Node::Dir(m));
                        Succeeds
                    }
                    Ok(Node::Symlink(_)) => Skip,
                }
            }
            Op::Mkdir(s, p, m) => r(self.create(&full(s, p), Node::Dir(m))),
            Op::Symlink(s, p, t) => r(self.create(&full(s, p), Node::Symlink(t.to_string()))),
            Op::Rmdir(s, p) => {
                let p = full(s, p);
                r(match self.resolve(&p) {
                    Err(e) => Err(e),
                    Ok(Node::Dir(_)) if self.has_children(&p) => Err(libc::ENOTEMPTY),
                    Ok(Node::Dir(_)) => {
                        self.entries.remove(&p);
                        Ok(())
                    }
                    Ok(_) => Err(libc::ENOTDIR),
                })
            }
            Op::Unlink(s, p) => {
                let p = full(s, p);
                r(match self.resolve(&p) {
                    Err(e) => Err(e),
                    Ok(Node::Dir(_)) => Err(libc::EISDIR),
                    Ok(_) => {
                        self.entries.remove(&p);
                        Ok(())
                    }
                })
            }
            Op::Link(s, from, to) => {
                let (from, to) = (full(s, from), full(s, to));
                // Symlinks are modelled as values, not objects: a second
                // name of one is not made.
                if let Ok(Node::Symlink(_)) = self.resolve(&from) {
                    return Skip;
                }
                r((|| {
                    let node = self.resolve(&from)?.clone();
                    self.walk_parent(&to)?;
                    if self.entries.contains_key(&to) {
                        return Err(libc::EEXIST);
                    }
                    if matches!(node, Node::Dir(_)) {
                        return Err(libc::EPERM);
                    }
                    self.entries.insert(to, node);
                    Ok(())
                })())
            }
            Op::Rename(s, from, to) => r(self.rename(&full(s, from), &full(s, to))),
            Op::Read(s, p, off, n) => match self.resolve(&full(s, p)) {
                Err(e) => Fails(e),
                Ok(Node::File(i)) => {
                    let data = &self.files[*i].data;
                    let start = (off as usize).min(data.len());
                    let end = (off as usize + n).min(data.len());
                    Reads(data[start..end].to_vec())
                }
                Ok(_) => Skip,
            },
        }
    }

    fn create(&mut self, p: &str, node: Node) -> Result<(), i32> {
        self.walk_parent(p)?;
        if self.entries.contains_key(p) {
            return Err(libc::EEXIST);
        }
        self.entries.insert(p.to_string(), node);
        Ok(())
    }

    /// rename(2)'s checks in the order Linux makes them.
    fn rename(&mut self, from: &str, to: &str) -> Result<(), i32> {
        self.walk_parent(from)?;
        self.walk_parent(to)?;
        let src = self.entries.get(from).ok_or(libc::ENOENT)?.clone();
        if to.starts_with(&format!("{from}/")) {
            return Err(libc::EINVAL);
        }
        if from.starts_with(&format!("{to}/")) {
            return Err(libc::ENOTEMPTY);
        }
        if let Some(dst) = self.entries.get(to) {
            let same =
                from == to || matches!((&src, dst), (Node::File(a), Node::File(b)) if a == b);
            if same {
                return Ok(());
            }
            match (&src, dst) {
                (Node::Dir(_), Node::Dir(_)) if self.has_children(to) => {
                    return Err(libc::ENOTEMPTY)
                }
                (Node::Dir(_), Node::Dir(_)) => {}
                (_, Node::Dir(_)) => return Err(libc::EISDIR),
                (Node::Dir(_), _) => return Err(libc::ENOTDIR),
                _ => {}
            }
        }
        let prefix = format!("{from}/");
        let moved: Vec<(String, Node)> = self
            .entries
            .iter()
            .filter(|(k, _)| *k == from || k.starts_with(&prefix))
            .map(|(k, v)| (format!("{to}{}", &k[from.len()..]), v.clone()))
            .collect();
        self.entries
            .retain(|k, _| k != from && !k.starts_with(&prefix));
        self.entries.remove(to);
        self.entries.extend(moved);
        Ok(())
    }

    /// The clone: `from`'s subtree in `snap` (the model at the clone's
    /// instant) copied to `to`, each file a new file, names of one file
    /// in `from` names of one new file in `to`.
    fn clone_tree(&mut self, snap: &Model, from: &str, to: &str) {
        let prefix = format!("{from}/");
        let mut ids = BTreeMap::new();
        for (k, node) in &snap.entries {
            if k != from && !k.starts_with(&prefix) {
                continue;
            }
            let node = match node {
                Node::File(i) => Node::File(*ids.entry(*i).or_insert_with(|| {
                    self.files.push(snap.files[*i].clone());
                    self.files.len() - 1
                })),
                other => other.clone(),
            };
            self.entries
                .insert(format!("{to}{}", &k[from.len()..]), node);
        }
    }

    fn seen(&self, node: &Node) -> Seen {
        match node {
            Node::File(i) => Seen::File {
                mode: self.files[*i].mode,
                data: self.files[*i].data.clone(),
            },
            Node::Dir(m) => Seen::Dir { mode: *m },
            Node::Symlink(t) => Seen::Symlink { target: t.clone() },
        }
    }

    /// `side` as a comparison should see it, by path inside the side.
    fn shown(&self, side: Side) -> Shown {
        let prefix = format!("{}/", side.root());
        let inside: Vec<(&str, &Node)> = self
            .entries
            .iter()
            .filter_map(|(p, n)| p.strip_prefix(&prefix).map(|r| (r, n)))
            .collect();
        let mut names: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (r, n) in &inside {
            if let Node::File(i) = n {
                names.entry(*i).or_default().push(r.to_string());
            }
        }
        let mut nlink = BTreeMap::new();
        for (r, n) in &inside {
            let count = match n {
                Node::File(i) => names[i].len() as u64,
                Node::Dir(_) => {
                    let sub = format!("{r}/");
                    let subdirs = inside
                        .iter()
                        .filter(|(k, v)| {
                            matches!(v, Node::Dir(_))
                                && k.strip_prefix(&sub).is_some_and(|rest| !rest.contains('/'))
                        })
                        .count();
                    2 + subdirs as u64
                }
                Node::Symlink(_) => continue,
            };
            nlink.insert(r.to_string(), count);
        }
        Shown {
            tree: inside
                .iter()
                .map(|(r, n)| (r.to_string(), self.seen(n)))
                .collect(),
            nlink,
            files: names.into_values().collect(),
        }
    }
}

// ---------------------------------------------------------------------------
// Running an operation on the vfs

fn errno_of(e: VfsError) -> i32 {
    e.errno()
}

/// write at `off` through `fh`, then flush and release, as close(2) does.
fn write_close(rig: &Rig, fh: u64, off: u64, data: &[u8]) -> Result<Option<Vec<u8>>, i32> {
    let written = rig.vfs.write(&rig.caller, fh, off, data, false);
    rig.vfs.flush(fh).map_err(errno_of)?;
    rig.vfs.release(fh).map_err(errno_of)?;
    rig.capture.settle();
    match written {
        Ok(n) if n == data.len() => Ok(None),
        Ok(_) => Err(libc::EIO),
        Err(e) => Err(e.errno()),
    }
}

/// The parent and name of a name to be made, as the kernel asks for it:
/// only after a lookup found nothing there (it answers EEXIST itself; a
/// union's upper branch alone would not know of a lower branch's name).
fn new_name<'p>(rig: &Rig, path: &'p str) -> Result<(InodeNo, &'p OsStr), i32> {
    let (dir, name) = rig.parent(path)?;
    match rig.vfs.lookup(&rig.caller, dir, name) {
        Ok(e) => {
            rig.vfs.forget(e.attr.ino, 1);
            Err(libc::EEXIST)
        }
        Err(e) if e.errno() == libc::ENOENT => Ok((dir, name)),
        Err(e) => Err(e.errno()),
    }
}

fn run(rig: &Rig, op: &Op) -> Result<Option<Vec<u8>>, i32> {
    let (vfs, c) = (&rig.vfs, &rig.caller);
    let none = |r: Result<(), i32>| r.map(|()| None);
    match *op {
        Op::Write(s, p, m, n, x) => none(rig.write_file(&full(s, p), m, &pattern(n, x))),
        Op::Create(s, p, m, n, x) => {
            let path = full(s, p);
            let (dir, name) = new_name(rig, &path)?;
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
            let (_, opened) = vfs
                .create(c, dir, name, libc::S_IFREG | m, 0, flags)
                .map_err(errno_of)?;
            write_close(rig, opened.fh, 0, &pattern(n, x))
        }
        Op::WriteAt(s, p, off, n, x) => none(rig.write_at(&full(s, p), off, &pattern(n, x))),
        Op::Truncate(s, p, size) => none(rig.setattr(
            &full(s, p),
            SetAttr {
                size: Some(size),
                ..Default::default()
            },
        )),
        Op::Chmod(s, p, m) => {
            let path = full(s, p);
            let ino = rig.resolve(&path)?;
            let kind = vfs.getattr(ino, None).map_err(errno_of)?.kind();
            let set = SetAttr {
                mode: Some(kind | m),
                ..Default::default()
            };
            vfs.setattr(c, ino, set).map(|_| None).map_err(errno_of)
        }
        Op::Mkdir(s, p, m) => {
            let path = full(s, p);
            let (dir, name) = new_name(rig, &path)?;
            vfs.mkdir(c, dir, name, m, 0)
                .map(|_| None)
                .map_err(errno_of)
        }
        Op::Symlink(s, p, t) => {
            let path = full(s, p);
            let (dir, name) = new_name(rig, &path)?;
            vfs.symlink(c, dir, name, OsStr::new(t))
                .map(|_| None)
                .map_err(errno_of)
        }
        Op::Rmdir(s, p) => {
            let path = full(s, p);
            let (dir, name) = rig.parent(&path)?;
            vfs.rmdir(c, dir, name).map(|()| None).map_err(errno_of)
        }
        Op::Unlink(s, p) => {
            let path = full(s, p);
            let (dir, name) = rig.parent(&path)?;
            vfs.unlink(c, dir, name).map(|()| None).map_err(errno_of)
        }
        Op::Link(s, from, to) => {
            let (from, to) = (full(s, from), full(s, to));
            let ino = rig.resolve(&from)?;
            let (dir, name) = new_name(rig, &to)?;
            vfs.link(c, ino, dir, name).map(|_| None).map_err(errno_of)
        }
        Op::Rename(s, from, to) => {
            let (from, to) = (full(s, from), full(s, to));
            let (d1, n1) = rig.parent(&from)?;
            let (d2, n2) = rig.parent(&to)?;
            vfs.rename(c, d1, n1, d2, n2, 0)
                .map(|()| None)
                .map_err(errno_of)
        }
        Op::Read(s, p, off, n) => {
            let ino = rig.resolve(&full(s, p))?;
            let fh = vfs.open(c, ino, libc::O_RDONLY).map_err(errno_of)?.fh;
            let data = vfs.read(fh, off, n as u32);
            vfs.release(fh).map_err(errno_of)?;
            data.map(Some).map_err(errno_of)
        }
    }
}

/// Builds the source tree natively, before the vfs starts (an operation
/// the model accepted).
fn native(root: &std::path::Path, op: &Op) {
    use std::os::unix::fs::PermissionsExt;
    let perms = |m: u32| std::fs::Permissions::from_mode(m);
    match *op {
        Op::Write(s, p, m, n, x) => {
            let f = root.join(full(s, p));
            let existed = f.exists();
            std::fs::write(&f, pattern(n, x)).unwrap();
            if !existed {
                std::fs::set_permissions(&f, perms(m)).unwrap();
            }
        }
        Op::Mkdir(s, p, m) => {
            let d = root.join(full(s, p));
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, perms(m)).unwrap();
        }
        Op::Symlink(s, p, t) => std::os::unix::fs::symlink(t, root.join(full(s, p))).unwrap(),
        Op::Link(s, a, b) => {
            std::fs::hard_link(root.join(full(s, a)), root.join(full(s, b))).unwrap()
        }
        _ => unreachable!("not a fill operation: {op:?}"),
    }
}

// ---------------------------------------------------------------------------
// What the vfs shows

fn vfs_ok<T>(what: impl Display, r: chronofs::vfs::Result<T>) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: {}", errname(&Err(e.errno())))))
}

/// A directory's entries by readdir: (name, inode, kind).
fn list(rig: &Rig, dir: InodeNo, path: &str) -> Result<Vec<(String, u64, u32)>, TestCaseError> {
    let (vfs, c) = (&rig.vfs, &rig.caller);
    let fh = vfs_ok(
        format!("opendir {path}"),
        vfs.opendir(c, dir, libc::O_RDONLY),
    )?
    .fh;
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let mut batch = Vec::new();
        let read = vfs.readdir(fh, offset, c, |d| {
            batch.push((
                d.name.to_string_lossy().into_owned(),
                d.ino.0,
                d.kind,
                d.offset,
            ));
            false
        });
        vfs_ok(format!("readdir {path}"), read)?;
        let Some(last) = batch.last() else { break };
        offset = last.3;
        out.extend(
            batch
                .into_iter()
                .filter(|(n, ..)| n != "." && n != "..")
                .map(|(n, i, k, _)| (n, i, k)),
        );
    }
    vfs_ok(format!("releasedir {path}"), vfs.releasedir(fh))?;
    Ok(out)
}

/// A regular file's bytes, read as the kernel would (128 KiB requests; a
/// short read before the end is an error: the kernel takes it for EOF).
fn read_whole(rig: &Rig, ino: InodeNo, size: u64, path: &str) -> Result<Vec<u8>, TestCaseError> {
    const MAX_READ: u64 = 128 * 1024;
    let vfs = &rig.vfs;
    let fh = vfs_ok(
        format!("open {path}"),
        vfs.open(&rig.caller, ino, libc::O_RDONLY),
    )?
    .fh;
    let mut data = Vec::new();
    loop {
        let off = data.len() as u64;
        let chunk = vfs_ok(
            format!("read {path} at {off}"),
            vfs.read(fh, off, MAX_READ as u32),
        )?;
        let n = chunk.len() as u64;
        data.extend_from_slice(&chunk);
        if n < MAX_READ {
            break;
        }
    }
    vfs_ok(format!("release {path}"), vfs.release(fh))?;
    prop_assert_eq!(data.len() as u64, size, "{}: bytes read vs st_size", path);
    Ok(data)
}

/// The tree under `root` (a path from the mount's root) as the vfs shows
/// it, and the inode numbers of its regular files.
fn vfs_shown(rig: &Rig, root: &str) -> Result<(Shown, BTreeSet<u64>), TestCaseError> {
    let vfs = &rig.vfs;
    let top = rig
        .resolve(root)
        .map_err(|e| TestCaseError::fail(format!("lookup {root}: {}", errname(&Err(e)))))?;
    let mut tree = BTreeMap::new();
    let mut nlink = BTreeMap::new();
    let mut by_ino: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut stack = vec![(top, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let shown = if prefix.is_empty() {
            root.to_string()
        } else {
            format!("{root}/{prefix}")
        };
        for (name, d_ino, d_kind) in list(rig, dir, &shown)? {
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let path = format!("{root}/{rel}");
            let entry = vfs_ok(
                format!("lookup {path}"),
                vfs.lookup(&rig.caller, dir, OsStr::new(&name)),
            )?;
            let ino = entry.attr.ino;
            let attr = vfs_ok(format!("getattr {path}"), vfs.getattr(ino, None))?;
            let (st, looked) = (&attr.st, &entry.attr.st);
            prop_assert_eq!(d_ino, ino.0, "{}: readdir's inode vs lookup's", &path);
            prop_assert_eq!(
                d_kind,
                attr.kind(),
                "{}: readdir's type vs getattr's",
                &path
            );
            prop_assert_eq!(
                (looked.st_mode, looked.st_nlink, looked.st_size),
                (st.st_mode, st.st_nlink, st.st_size),
                "{}: lookup's (mode, nlink, size) vs getattr's",
                &path
            );
            let mode = st.st_mode & 0o7777;
            let seen = match attr.kind() {
                libc::S_IFDIR => {
                    stack.push((ino, rel.clone()));
                    nlink.insert(rel.clone(), st.st_nlink);
                    Seen::Dir { mode }
                }
                libc::S_IFLNK => {
                    let t = vfs_ok(format!("readlink {path}"), vfs.readlink(&rig.caller, ino))?;
                    Seen::Symlink {
                        target: String::from_utf8_lossy(&t).into_owned(),
                    }
                }
                libc::S_IFREG => {
                    nlink.insert(rel.clone(), st.st_nlink);
                    by_ino.entry(ino.0).or_default().push(rel.clone());
                    let data = read_whole(rig, ino, st.st_size as u64, &path)?;
                    Seen::File { mode, data }
                }
                k => return Err(TestCaseError::fail(format!("{path}: kind {k:o}"))),
            };
            tree.insert(rel, seen);
        }
    }
    let inos = by_ino.keys().copied().collect();
    let files = by_ino
        .into_values()
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    Ok((Shown { tree, nlink, files }, inos))
}

fn check_side(
    rig: &Rig,
    model: &Model,
    side: Side,
    when: &str,
) -> Result<BTreeSet<u64>, TestCaseError> {
    let (mut seen, inos) = vfs_shown(rig, side.root())?;
    let mut want = model.shown(side);
    if !rig.lowers.is_empty() {
        // A union shows 1 for a directory with copies in several branches
        // (its subdirectories are counted nowhere: "unknown", as overlayfs
        // shows it).
        let merged: Vec<String> = seen
            .nlink
            .iter()
            .filter(|(_, n)| **n == 1)
            .map(|(k, _)| k.clone())
            .collect();
        for k in merged {
            seen.nlink.remove(&k);
            want.nlink.remove(&k);
        }
    }
    prop_assert!(
        seen.tree == want.tree,
        "{when}: side {} ({side:?}) differs: {}",
        side.root(),
        tree_diff(&seen.tree, &want.tree)
    );
    prop_assert_eq!(
        &seen.files,
        &want.files,
        "{}: side {}: names of one file (hard links): vfs vs model",
        when,
        side.root()
    );
    prop_assert_eq!(
        &seen.nlink,
        &want.nlink,
        "{}: side {}: link counts: vfs vs model",
        when,
        side.root()
    );
    Ok(inos)
}

fn check_both(rig: &Rig, model: &Model, when: &str) -> Result<(), TestCaseError> {
    let src = check_side(rig, model, Side::Src, when)?;
    let cln = check_side(rig, model, Side::Clone, when)?;
    let shared: Vec<_> = src.intersection(&cln).collect();
    prop_assert!(
        shared.is_empty(),
        "{when}: inode numbers on both sides: {shared:?}"
    );
    Ok(())
}

/// Where two trees differ, briefly (contents by length and first
/// differing byte).
fn tree_diff(got: &BTreeMap<String, Seen>, want: &BTreeMap<String, Seen>) -> String {
    let brief = |s: Option<&Seen>| match s {
        None => "absent".to_string(),
        Some(Seen::File { mode, data }) => format!("file {mode:o}, {} bytes", data.len()),
        Some(Seen::Dir { mode }) => format!("dir {mode:o}"),
        Some(Seen::Symlink { target }) => format!("symlink -> {target}"),
    };
    let keys: BTreeSet<&String> = got.keys().chain(want.keys()).collect();
    let mut out = Vec::new();
    for k in keys {
        let (g, w) = (got.get(k), want.get(k));
        if g == w {
            continue;
        }
        let mut line = format!("\n  {k}: got {}, model {}", brief(g), brief(w));
        if let (Some(Seen::File { data: a, .. }), Some(Seen::File { data: b, .. })) = (g, w) {
            if let Some(i) = a.iter().zip(b.iter()).position(|(x, y)| x != y) {
                line.push_str(&format!(" (first differing byte at {i})"));
            }
        }
        out.push(line);
    }
    out.concat()
}

// ---------------------------------------------------------------------------
// A case

/// Where a case's tree is built before the clone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    /// Through the vfs.
    Through,
    /// In the directory, before the mount.
    Native,
    /// In the read-only lower branch of a union, before the mount: the
    /// clone and every change go to the upper one.
    Lower,
}

/// One case: the tree `fill` builds (natively before the vfs starts, or
/// through it), settled: the clone's instant; then `before` on the source
/// side, then the clone (of the instant, so what `before` did is not in
/// it), then `steps`.
struct Case<'a> {
    native_fill: Fill,
    fill: &'a [Op],
    before: &'a [Op],
    steps: &'a [(Op, bool)],
}

/// Runs `op` on the model and the vfs: the same outcome, the same bytes
/// read, and the source side the model's after it.
fn step_both(rig: &Rig, model: &mut Model, when: &str, op: &Op) -> Result<(), TestCaseError> {
    let expected = match model.apply(op) {
        Outcome::Skip => return Ok(()),
        Outcome::Fails(e) => Err(e),
        Outcome::Succeeds => Ok(None),
        Outcome::Reads(data) => Ok(Some(data)),
    };
    let got = run(rig, op);
    let outcome =
        |r: &Result<Option<Vec<u8>>, i32>| errname(&r.as_ref().map(|_| ()).map_err(|e| *e));
    prop_assert_eq!(
        outcome(&got),
        outcome(&expected),
        "{} {:?}: the vfs and the model disagree",
        when,
        op
    );
    if let (Ok(Some(got)), Ok(Some(want))) = (&got, &expected) {
        let first = got.iter().zip(want.iter()).position(|(a, b)| a != b);
        prop_assert!(
            got == want,
            "{when} {op:?}: read {} bytes, the model {} (first differing byte at {first:?})",
            got.len(),
            want.len()
        );
    }
    check_side(rig, model, Side::Src, &format!("after {when} {op:?}"))?;
    rig.clock.advance(secs(1));
    Ok(())
}

fn check_case(case: Case<'_>) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    model.entries.insert("t".into(), Node::Dir(0o755));
    let accepted: Vec<&Op> = case
        .fill
        .iter()
        .filter(|op| matches!(model.apply(op), Outcome::Succeeds))
        .collect();
    let native = |src: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        let t = src.join("t");
        std::fs::create_dir(&t).unwrap();
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o755)).unwrap();
        for op in &accepted {
            native(src, op);
        }
    };
    let rig = match case.native_fill {
        Fill::Through => {
            let rig = Rig::new();
            vfs_ok(
                "mkdir t",
                rig.vfs
                    .mkdir(&rig.caller, InodeNo::ROOT, OsStr::new("t"), 0o755, 0),
            )?;
            for op in &accepted {
                let got = run(&rig, op);
                prop_assert!(got.is_ok(), "building the tree: {op:?}: {got:?}");
            }
            rig
        }
        Fill::Native | Fill::Lower => {
            let lowers = usize::from(case.native_fill == Fill::Lower);
            let rig = Rig::union(lowers, native);
            // What the first mount does: the tree that predates it is recorded.
            rig.vfs.start_ingest().unwrap();
            prop_assert!(rig.vfs.wait_ingest(), "the baseline walk had errors");
            rig
        }
    };
    check_side(&rig, &model, Side::Src, "before the clone")?;
    rig.clock.advance(secs(1));
    let at = rig.settle();
    let snap = model.clone();
    rig.clock.advance(secs(1));
    for (i, op) in case.before.iter().enumerate() {
        step_both(&rig, &mut model, &format!("before the clone, op {i}"), op)?;
    }
    let cloned = rig.vfs.clone_path(
        &rig.caller,
        &[b"t".to_vec()],
        at,
        InodeNo::ROOT,
        OsStr::new("c"),
    );
    vfs_ok("clone t c", cloned)?;
    model.clone_tree(&snap, "t", "c");
    rig.clock.advance(secs(1));
    let clone_seq = rig.settle();
    let at_clone = model.clone();
    for (i, (op, checkpoint)) in case.steps.iter().enumerate() {
        let when = format!("op {i}");
        step_both(&rig, &mut model, &when, op)?;
        if *checkpoint {
            check_both(&rig, &model, &format!("after {when} {op:?}"))?;
        }
    }
    check_both(&rig, &model, "at the end")?;
    // The past (`.history/@SEQ/`): right after the clone both sides are
    // the model's then, the clone whole though it was filled since.
    rig.capture.settle();
    for side in [Side::Src, Side::Clone] {
        let root = format!(".history/@{}/{}", clone_seq.get(), side.root());
        let (past, _) = vfs_shown(&rig, &root)?;
        let want = at_clone.shown(side);
        prop_assert!(
            past.tree == want.tree,
            "{root}: differs from the model at the clone's instant: {}",
            tree_diff(&past.tree, &want.tree)
        );
    }
    rig.capture.finish();
    Ok(())
}

#[test]
fn clones_follow_the_model() {
    let mut runner = runner("CHRONOFS_CLONE_CASES", 48, 0xc1);
    let strategy = (
        prop_oneof![Just(Fill::Through), Just(Fill::Native), Just(Fill::Lower)],
        fill(),
        prop_oneof![
            2 => Just(Vec::new()),
            1 => proptest::collection::vec(op(source), 1..6),
        ],
        proptest::collection::vec(step(), 1..30),
    );
    let result = runner.run(&strategy, |(native_fill, fill, before, steps)| {
        check_case(Case {
            native_fill,
            fill: &fill,
            before: &before,
            steps: &steps,
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------
// Spelled out: hard links across directories, met lazily

use Side::{Clone as C, Src as S};

/// `t/f`, `t/a/f` and `t/b/g`: one file of 70,000 bytes under three names
/// in three directories; `t/b/f` another file.
fn linked_tree() -> Vec<Op> {
    vec![
        Op::Mkdir(S, "a", 0o755),
        Op::Mkdir(S, "b", 0o750),
        Op::Write(S, "f", 0o640, 70_000, 7),
        Op::Link(S, "f", "a/f"),
        Op::Link(S, "f", "b/g"),
        Op::Write(S, "b/f", 0o600, 10, 9),
    ]
}

/// The first name filled goes before the other directories are filled;
/// the source changes; the clone's other names still show the file as it
/// was, and stay one file.
#[test]
fn a_name_unlinked_before_the_others_are_filled() {
    let steps = [
        (Op::Unlink(C, "f"), false),
        (Op::WriteAt(S, "f", 5, 100, 1), false),
        (Op::Read(C, "a/f", 0, 100_000), false),
        (Op::WriteAt(C, "b/g", 65_000, 10_000, 2), false),
        (Op::Read(C, "a/f", 60_000, 20_000), false),
    ];
    let case = Case {
        native_fill: Fill::Through,
        fill: &linked_tree(),
        before: &[],
        steps: &steps,
    };
    check_case(case).unwrap();
}

/// An unfilled directory renamed, links made and replaced in another,
/// the source's names changed meanwhile; the tree made before the mount.
#[test]
fn links_renames_and_writes_across_unfilled_directories() {
    let steps = [
        (Op::Rename(C, "a", "d"), false),
        (Op::Link(C, "b/g", "b/h"), false),
        (Op::Truncate(C, "f", 3), false),
        (Op::Rename(C, "b/f", "b/g"), false),
        (Op::Read(C, "f", 0, 10), true),
        (Op::Unlink(S, "a/f"), false),
        (Op::Read(C, "b/h", 0, 10), false),
    ];
    let case = Case {
        native_fill: Fill::Native,
        fill: &linked_tree(),
        before: &[],
        steps: &steps,
    };
    check_case(case).unwrap();
}

/// A clone of an instant the source has moved on from: its files, and
/// its link counts, are the instant's.
#[test]
fn a_clone_of_an_instant_since_changed() {
    let before = [
        Op::WriteAt(S, "a/f", 0, 10, 3),
        Op::Unlink(S, "b/g"),
        Op::Link(S, "b/f", "a/g"),
        Op::Rename(S, "a", "h"),
        Op::Truncate(S, "f", 1),
    ];
    let steps = [
        (Op::Read(C, "f", 0, 100), false),
        (Op::Read(C, "a/f", 0, 100), false),
        (Op::Unlink(C, "b/g"), true),
    ];
    let case = Case {
        native_fill: Fill::Through,
        fill: &linked_tree(),
        before: &before,
        steps: &steps,
    };
    check_case(case).unwrap();
}

/// A clone of a clone made before the first clone's directories were
/// filled: the second must be whole too. Walked before the first clone
/// is (a walk of it would fill its directories and hide the loss).
#[test]
fn a_clone_of_a_clone_not_yet_filled_is_whole() {
    let rig = Rig::new();
    let (vfs, who) = (&rig.vfs, &rig.caller);
    vfs.mkdir(who, InodeNo::ROOT, OsStr::new("t"), 0o755, 0)
        .unwrap();
    let t = rig.resolve("t").unwrap();
    vfs.mkdir(who, t, OsStr::new("sub"), 0o750, 0).unwrap();
    rig.write_file("t/a", 0o640, b"hello").unwrap();
    rig.write_file("t/sub/b", 0o600, b"bee").unwrap();
    let at = rig.settle();
    let root = InodeNo::ROOT;
    vfs.clone_path(who, &[b"t".to_vec()], at, root, OsStr::new("c"))
        .unwrap();
    rig.clock.advance(secs(1));
    let at = rig.settle();
    vfs.clone_path(who, &[b"c".to_vec()], at, root, OsStr::new("d"))
        .unwrap();
    let (d, _) = vfs_shown(&rig, "d").unwrap();
    let (t, _) = vfs_shown(&rig, "t").unwrap();
    assert!(
        d.tree == t.tree,
        "the clone of the clone: {}",
        tree_diff(&d.tree, &t.tree)
    );
}

/// A directory whose only copy is in a union's lower branch lists the
/// inode numbers lookup gives (readdir keyed its entries as the primary
/// branch's objects, so each name got a second number).
#[test]
fn a_lower_only_directory_lists_the_numbers_lookup_shows() {
    let case = Case {
        native_fill: Fill::Lower,
        fill: &[Op::Write(S, "g", 0o644, 0, 0)],
        before: &[],
        steps: &[(Op::WriteAt(S, "f", 0, 0, 0), false)],
    };
    check_case(case).unwrap();
}

/// A clone's file read after its base's directory was moved and its old
/// name given to a symlink: the base is found where it moved to (the
/// recorded path, tried first, crossed the symlink: ENOTDIR).
#[test]
fn a_base_whose_old_path_now_crosses_a_symlink_is_found_where_it_moved() {
    let fill = [
        Op::Mkdir(S, "a", 0o744),
        Op::Mkdir(S, "b", 0o744),
        Op::Write(S, "a/g", 0o644, 10, 1),
    ];
    let steps = [
        (Op::Rename(S, "a", "b/f"), false),
        (Op::Symlink(S, "a", "f"), false),
        (Op::Read(C, "a/g", 0, 100), true),
    ];
    let case = Case {
        native_fill: Fill::Through,
        fill: &fill,
        before: &[],
        steps: &steps,
    };
    check_case(case).unwrap();
}

/// A patched clone file truncated by path, then grown: zeros where the
/// base was cut off (the truncation came before the patched file was
/// loaded, which clamped its base's length without writing the mark: the
/// next load read the base there again).
#[test]
fn a_clone_file_truncated_by_path_then_grown_shows_zeros() {
    let fill = [Op::Write(S, "f", 0o644, 65_536, 3)];
    let steps = [
        (Op::Truncate(C, "f", 0), false),
        (Op::Truncate(C, "f", 2), false),
        (Op::Read(C, "f", 0, 10), false),
        (Op::Truncate(C, "f", 70_000), true),
    ];
    let case = Case {
        native_fill: Fill::Through,
        fill: &fill,
        before: &[],
        steps: &steps,
    };
    check_case(case).unwrap();
}
