//! The reference model the in-process property tests drive the vfs
//! against (tests/vfs_model.rs: a plain directory; tests/union_model.rs:
//! a union): operations, their strategies, the model's answer, running
//! an operation on the vfs, and the tree as the vfs shows it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;

use chronofs::vfs::SetAttr;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::inproc::*;

/// Few names, so operations collide (rename over, re-creation, links).
pub const PATHS: &[&str] = &["a", "b", "c", "a/x", "a/y", "b/x", "a/x/z"];
pub const TARGETS: &[&str] = &["t", "../a", "/nonexistent", "a/x/z"];
pub const MODES: &[u32] = &[0o644, 0o600, 0o755, 0o444, 0o700];

#[derive(Clone, Debug)]
pub enum Op {
    /// open(O_WRONLY|O_CREAT|O_TRUNC), write, close.
    Write(&'static str, u32, usize, u8),
    WriteAt(&'static str, u64, usize, u8),
    Truncate(&'static str, u64),
    Chmod(&'static str, u32),
    Mkdir(&'static str, u32),
    Rmdir(&'static str),
    Symlink(&'static str, &'static str),
    Link(&'static str, &'static str),
    Unlink(&'static str),
    Rename(&'static str, &'static str),
}

pub fn path() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(PATHS)
}

pub fn mode() -> impl Strategy<Value = u32> {
    proptest::sample::select(MODES)
}

pub fn len() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0usize..300, 1 => 60_000usize..140_000]
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (path(), mode(), len(), any::<u8>()).prop_map(|(p, m, l, s)| Op::Write(p, m, l, s)),
        2 => (path(), 0u64..200_000, 0usize..5000, any::<u8>())
            .prop_map(|(p, o, l, s)| Op::WriteAt(p, o, l, s)),
        2 => (path(), prop_oneof![Just(0u64), 0u64..150_000]).prop_map(|(p, n)| Op::Truncate(p, n)),
        1 => (path(), mode()).prop_map(|(p, m)| Op::Chmod(p, m)),
        4 => (path(), mode()).prop_map(|(p, m)| Op::Mkdir(p, m | 0o700)),
        1 => path().prop_map(Op::Rmdir),
        1 => (path(), proptest::sample::select(TARGETS)).prop_map(|(p, t)| Op::Symlink(p, t)),
        2 => (path(), path()).prop_map(|(a, b)| Op::Link(a, b)),
        2 => path().prop_map(Op::Unlink),
        3 => (path(), path()).prop_map(|(a, b)| Op::Rename(a, b)),
    ]
}

// ---------------------------------------------------------------------------
// The model

#[derive(Clone, Debug)]
pub enum Node {
    /// A regular file: an index into `files` (hard links share it).
    File(usize),
    Dir(u32),
    Symlink(String),
}

#[derive(Clone, Debug)]
pub struct FileData {
    mode: u32,
    data: Vec<u8>,
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    entries: BTreeMap<String, Node>,
    files: Vec<FileData>,
}

/// What the model says an operation does.
pub enum Outcome {
    /// Not run: the kernel would decide it without the file system.
    Skip,
    Fails(i32),
    Succeeds,
}

fn parent_of(p: &str) -> &str {
    p.rsplit_once('/').map_or("", |(d, _)| d)
}

impl Model {
    /// Walking to `path`'s parent: ENOENT for a missing component,
    /// ENOTDIR for one that is not a directory (symlinks are not followed).
    fn walk_parent(&self, path: &str) -> Result<(), i32> {
        let dir = parent_of(path);
        let mut cur = String::new();
        for comp in dir.split('/').filter(|c| !c.is_empty()) {
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

    fn children(&self, dir: &str) -> impl Iterator<Item = &String> + '_ {
        let prefix = format!("{dir}/");
        self.entries
            .keys()
            .filter(move |k| k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
    }

    fn file_mut(&mut self, path: &str) -> &mut FileData {
        match self.entries[path] {
            Node::File(i) => &mut self.files[i],
            _ => unreachable!(),
        }
    }

    pub fn apply(&mut self, op: &Op) -> Outcome {
        use Outcome::*;
        let r = |res: Result<(), i32>| match res {
            Ok(()) => Succeeds,
            Err(e) => Fails(e),
        };
        match *op {
            Op::Write(p, m, n, s) => {
                if let Err(e) = self.walk_parent(p) {
                    return Fails(e);
                }
                match self.entries.get(p) {
                    Some(Node::File(_)) => self.file_mut(p).data = pattern(n, s),
                    Some(_) => return Skip,
                    None => {
                        self.files.push(FileData {
                            mode: m,
                            data: pattern(n, s),
                        });
                        self.entries
                            .insert(p.to_string(), Node::File(self.files.len() - 1));
                    }
                }
                Succeeds
            }
            Op::WriteAt(p, off, n, s) => match self.resolve(p) {
                Err(e) => Fails(e),
                Ok(Node::File(_)) => {
                    let f = self.file_mut(p);
                    let end = off as usize + n;
                    if f.data.len() < end {
                        f.data.resize(end, 0);
                    }
                    f.data[off as usize..end].copy_from_slice(&pattern(n, s));
                    Succeeds
                }
                Ok(_) => Skip,
            },
            Op::Truncate(p, size) => match self.resolve(p) {
                Err(e) => Fails(e),
                Ok(Node::File(_)) => {
                    self.file_mut(p).data.resize(size as usize, 0);
                    Succeeds
                }
                Ok(Node::Dir(_)) => Fails(libc::EISDIR),
                Ok(Node::Symlink(_)) => Skip,
            },
            Op::Chmod(p, m) => match self.resolve(p) {
                Err(e) => Fails(e),
                Ok(Node::File(_)) => {
                    self.file_mut(p).mode = m;
                    Succeeds
                }
                Ok(Node::Dir(_)) => {
                    self.entries.insert(p.to_string(), Node::Dir(m));
                    Succeeds
                }
                Ok(Node::Symlink(_)) => Skip,
            },
            Op::Mkdir(p, m) => r(self.create(p, Node::Dir(m))),
            Op::Symlink(p, t) => r(self.create(p, Node::Symlink(t.to_string()))),
            Op::Rmdir(p) => r(match self.resolve(p) {
                Err(e) => Err(e),
                Ok(Node::Dir(_)) if self.children(p).next().is_some() => Err(libc::ENOTEMPTY),
                Ok(Node::Dir(_)) => {
                    self.entries.remove(p);
                    Ok(())
                }
                Ok(_) => Err(libc::ENOTDIR),
            }),
            Op::Unlink(p) => r(match self.resolve(p) {
                Err(e) => Err(e),
                Ok(Node::Dir(_)) => Err(libc::EISDIR),
                Ok(_) => {
                    self.entries.remove(p);
                    Ok(())
                }
            }),
            Op::Link(from, to) => r((|| {
                let node = self.resolve(from)?.clone();
                self.walk_parent(to)?;
                if self.entries.contains_key(to) {
                    return Err(libc::EEXIST);
                }
                if matches!(node, Node::Dir(_)) {
                    return Err(libc::EPERM);
                }
                self.entries.insert(to.to_string(), node);
                Ok(())
            })()),
            Op::Rename(from, to) => r(self.rename(from, to)),
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
                (Node::Dir(_), Node::Dir(_)) if self.children(to).next().is_some() => {
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

    /// Each regular file's link count: how many names share its data.
    pub fn file_links(&self) -> BTreeMap<String, u64> {
        let mut count = BTreeMap::new();
        for n in self.entries.values() {
            if let Node::File(i) = n {
                *count.entry(*i).or_insert(0u64) += 1;
            }
        }
        self.entries
            .iter()
            .filter_map(|(p, n)| match n {
                Node::File(i) => Some((p.clone(), count[i])),
                _ => None,
            })
            .collect()
    }

    pub fn tree(&self) -> BTreeMap<String, Seen> {
        self.entries
            .iter()
            .map(|(p, n)| {
                let seen = match n {
                    Node::File(i) => Seen::File {
                        mode: self.files[*i].mode,
                        data: self.files[*i].data.clone(),
                    },
                    Node::Dir(m) => Seen::Dir { mode: *m },
                    Node::Symlink(t) => Seen::Symlink { target: t.clone() },
                };
                (p.clone(), seen)
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Running an operation on the vfs

pub fn run(rig: &Rig, op: &Op) -> Result<(), i32> {
    let vfs = &rig.vfs;
    let c = &rig.caller;
    let e = |e: chronofs::vfs::VfsError| e.errno();
    match *op {
        Op::Write(p, m, n, s) => rig.write_file(p, m, &pattern(n, s)),
        Op::WriteAt(p, off, n, s) => rig.write_at(p, off, &pattern(n, s)),
        Op::Truncate(p, size) => rig.setattr(
            p,
            SetAttr {
                size: Some(size),
                ..Default::default()
            },
        ),
        Op::Chmod(p, m) => {
            let kind = if matches!(rig.resolve(p).map(|i| vfs.getattr(i, None)), Ok(Ok(a)) if a.kind() == libc::S_IFDIR)
            {
                libc::S_IFDIR
            } else {
                libc::S_IFREG
            };
            rig.setattr(
                p,
                SetAttr {
                    mode: Some(kind | m),
                    ..Default::default()
                },
            )
        }
        Op::Mkdir(p, m) => {
            let (dir, name) = rig.parent(p)?;
            vfs.mkdir(c, dir, name, m, 0).map(|_| ()).map_err(e)
        }
        Op::Symlink(p, t) => {
            let (dir, name) = rig.parent(p)?;
            vfs.symlink(c, dir, name, OsStr::new(t))
                .map(|_| ())
                .map_err(e)
        }
        Op::Rmdir(p) => {
            let (dir, name) = rig.parent(p)?;
            vfs.rmdir(c, dir, name).map_err(e)
        }
        Op::Unlink(p) => {
            let (dir, name) = rig.parent(p)?;
            vfs.unlink(c, dir, name).map_err(e)
        }
        Op::Link(from, to) => {
            let ino = rig.resolve(from)?;
            let (dir, name) = rig.parent(to)?;
            vfs.link(c, ino, dir, name).map(|_| ()).map_err(e)
        }
        Op::Rename(from, to) => {
            let (d1, n1) = rig.parent(from)?;
            let (d2, n2) = rig.parent(to)?;
            vfs.rename(c, d1, n1, d2, n2, 0).map_err(e)
        }
    }
}

/// The model's paths as the vfs shows them (lookup, getattr, read,
/// readlink): what the kernel would be told.
pub fn vfs_tree(rig: &Rig, model: &BTreeMap<String, Seen>) -> BTreeMap<String, Seen> {
    let vfs = &rig.vfs;
    model
        .keys()
        .map(|p| {
            let ino = rig.resolve(p).unwrap();
            let attr = vfs.getattr(ino, None).unwrap();
            let mode = attr.st.st_mode & 0o7777;
            let seen = match attr.kind() {
                libc::S_IFDIR => Seen::Dir { mode },
                libc::S_IFLNK => Seen::Symlink {
                    target: String::from_utf8(vfs.readlink(&rig.caller, ino).unwrap()).unwrap(),
                },
                _ => {
                    let fh = vfs.open(&rig.caller, ino, libc::O_RDONLY).unwrap().fh;
                    let data = vfs.read(fh, 0, attr.st.st_size as u32 + 1).unwrap();
                    vfs.release(fh).unwrap();
                    assert_eq!(data.len() as i64, attr.st.st_size, "{p}: size");
                    Seen::File { mode, data }
                }
            };
            (p.clone(), seen)
        })
        .collect()
}

pub fn errname(r: &Result<(), i32>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => std::io::Error::from_raw_os_error(*e).to_string(),
    }
}

/// The link count the vfs shows for each of the model's regular files.
pub fn vfs_file_links(rig: &Rig, want: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    want.keys()
        .map(|p| {
            let ino = rig.resolve(p).unwrap();
            (p.clone(), rig.vfs.getattr(ino, None).unwrap().st.st_nlink)
        })
        .collect()
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A deterministic runner: `cases_var` cases (else `default_cases`), from
/// `CHRONOFS_VFS_SEED` (else a fixed seed), `salt` telling the suites'
/// streams apart.
pub fn runner(cases_var: &str, default_cases: u64, salt: u8) -> TestRunner {
    let cases = env_u64(cases_var, default_cases) as u32;
    let seed = env_u64("CHRONOFS_VFS_SEED", 0x5eed_0fc4_2026);
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8] = salt;
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key))
}
