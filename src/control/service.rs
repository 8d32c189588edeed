//! Answers to control requests, over a history and the live tree.
//!
//! A path is resolved at an instant through recorded directory entries;
//! where history holds nothing (a directory or file never changed through
//! the mount), the live tree is its state then, reached by the object's
//! current path and checked to be the same object.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};

use super::spec::{self, At};
use super::{Components, Reply, Request};
use crate::history::content;
use crate::history::query::Lookup;
use crate::history::{Content, Draft, History, HistoryError, ObjectId, Seq, Version, ROOT};
use crate::sys::{self, Peer, Stat};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    NotFound(String),
    #[error("permission denied: {0}")]
    Denied(String),
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// What the service needs from whoever serves the tree: a running mount,
/// or a store opened directly.
pub trait Host: Send + Sync {
    /// The object id of a live object, if it has one (never assigns).
    fn identify(&self, st: &Stat) -> Option<ObjectId>;
    /// Waits for versions still being built.
    fn settle(&self) {}
    /// Starts the eager baseline of the whole tree.
    fn start_ingest(&self) -> std::result::Result<(), String> {
        Err("nothing is mounted: mount the directory, then run `chronofs ingest` on it".into())
    }
    /// Progress of the eager baseline, if one ran.
    fn ingest_status(&self) -> Option<Value> {
        None
    }
}

pub struct Service {
    history: Arc<History>,
    /// O_PATH descriptor of the branch root (SRC).
    root: OwnedFd,
    /// The store's name in the root, never shown.
    reserved: Option<OsString>,
    host: Box<dyn Host>,
    store_dir: PathBuf,
}

/// A path's object at an instant.
enum Node {
    Hist {
        obj: ObjectId,
        seq: Seq,
        v: Version,
    },
    Live {
        obj: Option<ObjectId>,
        fd: OwnedFd,
        st: Stat,
    },
}

/// Where a walk stands.
enum Cur {
    Hist(ObjectId),
    Live {
        obj: Option<ObjectId>,
        fd: OwnedFd,
        st: Stat,
    },
}

fn name_str(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

fn show_path(p: &[Vec<u8>]) -> String {
    if p.is_empty() {
        return "/".into();
    }
    p.iter().map(|c| format!("/{}", name_str(c))).collect()
}

fn kind_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "symlink",
        libc::S_IFCHR => "char",
        libc::S_IFBLK => "block",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        _ => "unknown",
    }
}

struct ReplyWriter<'a>(&'a mut dyn Reply);

impl Write for ReplyWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.data(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Service {
    pub fn new(
        history: Arc<History>,
        root: OwnedFd,
        reserved: Option<OsString>,
        host: Box<dyn Host>,
        store_dir: PathBuf,
    ) -> Service {
        Service {
            history,
            root,
            reserved,
            host,
            store_dir,
        }
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    pub fn answer(&self, req: &Request, peer: &Peer, reply: &mut dyn Reply) -> Result<Answer> {
        self.host.settle();
        if let Request::Log {
            path,
            since,
            until,
            recursive: true,
        } = req
        {
            let since = self.opt_seq(since.as_ref())?;
            let until = self.opt_seq(until.as_ref())?;
            return self.log_tree(path, since, until);
        }
        self.answer_value(req, peer, reply).map(Answer::Value)
    }

    fn answer_value(&self, req: &Request, peer: &Peer, reply: &mut dyn Reply) -> Result<Value> {
        match req {
            Request::Ingest => {
                self.host.start_ingest().map_err(Error::Usage)?;
                Ok(self.host.ingest_status().unwrap_or(Value::Null))
            }
            Request::Status => self.status(),
            Request::Tags => self.tags(),
            Request::Tag { name, at } => self.tag(name, at),
            Request::Untag { name } => self.untag(name, peer),
            Request::Resolve { at } => {
                let (seq, t) = self.resolve_at(at)?;
                Ok(json!({"seq": seq, "time_ns": t, "time": spec::iso(t)}))
            }
            Request::Stat { path, at } => {
                let (seq, _) = self.resolve_at(at)?;
                let node = self.node(path, seq)?;
                Ok(self.describe(&node))
            }
            Request::List { path, at, deleted } => self.list(path, at, *deleted),
            Request::Read { path, at, version } => self.read(path, at, *version, peer, reply),
            Request::Log {
                path,
                since,
                until,
                recursive,
            } => self.log(path, since.as_ref(), until.as_ref(), *recursive),
            Request::Fsck { repair } => {
                if peer.uid != 0 && *repair {
                    return Err(Error::Denied("only root may repair a store".into()));
                }
                Ok(
                    serde_json::to_value(fsck(&self.history, *repair, &mut |_, _| {})?)
                        .unwrap_or(Value::Null),
                )
            }
        }
    }

    /// The sequence number and time an instant means.
    pub fn resolve_at(&self, at: &At) -> Result<(Seq, i64)> {
        let Some(((first, first_t), (last, last_t))) = self.history.bounds()? else {
            return Err(Error::NotFound(
                "history is empty: nothing has changed yet".into(),
            ));
        };
        let seq = match at {
            At::Now => last,
            At::Seq(n) if (first..=last).contains(n) => *n,
            At::Seq(n) => {
                return Err(Error::NotFound(format!(
                    "there is no change #{n} (history holds #{first} to #{last})"
                )))
            }
            At::Tag(name) => self
                .history
                .tag(name)?
                .ok_or_else(|| Error::NotFound(format!("no tag named '{name}'")))?,
            At::Time(t) => {
                if *t > crate::history::now_ns() + 1_000_000_000 {
                    return Err(Error::NotFound(format!(
                        "{} is in the future",
                        spec::show(*t)
                    )));
                }
                if *t < first_t {
                    return Err(Error::NotFound(format!(
                        "{} is before history began ({})",
                        spec::show(*t),
                        spec::show(first_t)
                    )));
                }
                self.history.seq_at_time(*t)?.unwrap_or(last)
            }
        };
        let t = self.history.time_of_seq(seq)?.unwrap_or(last_t);
        Ok((seq, t))
    }

    fn live_step(&self, dir: &OwnedFd, in_root: bool, name: &[u8]) -> Result<Option<Cur>> {
        if in_root && self.reserved.as_deref() == Some(OsStr::from_bytes(name)) {
            return Ok(None);
        }
        let cname = sys::cstr(OsStr::from_bytes(name))?;
        let fd = match sys::open_path(dir.as_fd(), &cname) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let st = sys::fstat(fd.as_fd())?;
        let obj = self.host.identify(&st);
        Ok(Some(Cur::Live { obj, fd, st }))
    }

    /// The live object `obj` (found by its current recorded path, and
    /// checked to be the same object).
    fn live_object(&self, obj: ObjectId) -> Result<Option<(OwnedFd, Stat)>> {
        if obj == ROOT {
            let fd = sys::reopen(self.root.as_fd(), libc::O_PATH)?;
            let st = sys::fstat(fd.as_fd())?;
            return Ok(Some((fd, st)));
        }
        let Some(path) = self.history.path_at(obj, Seq::MAX)? else {
            return Ok(None);
        };
        let mut fd = sys::reopen(self.root.as_fd(), libc::O_PATH)?;
        for (i, comp) in path.iter().enumerate() {
            match self.live_step(&fd, i == 0, comp)? {
                Some(Cur::Live { fd: next, .. }) => fd = next,
                _ => return Ok(None),
            }
        }
        let st = sys::fstat(fd.as_fd())?;
        Ok((self.host.identify(&st) == Some(obj)).then_some((fd, st)))
    }

    fn step(&self, cur: Cur, comp: &[u8], seq: Seq, in_root: bool) -> Result<Option<Cur>> {
        let dir = match cur {
            Cur::Live {
                obj: Some(o), fd, ..
            } => {
                if self.history.object_at(o, seq)?.is_some() {
                    o
                } else {
                    return self.live_step(&fd, in_root, comp);
                }
            }
            Cur::Live { obj: None, fd, .. } => return self.live_step(&fd, in_root, comp),
            Cur::Hist(d) => d,
        };
        match self.history.lookup_at(dir, comp, seq)? {
            Lookup::Found(o) => Ok(Some(Cur::Hist(o))),
            Lookup::Absent => Ok(None),
            Lookup::Live => match self.live_object(dir)? {
                Some((fd, _)) => self.live_step(&fd, in_root, comp),
                None => Ok(None),
            },
        }
    }

    fn resolve(&self, path: &[Vec<u8>], seq: Seq) -> Result<Option<Node>> {
        let mut cur = Cur::Hist(ROOT);
        for (i, comp) in path.iter().enumerate() {
            if comp.is_empty() || comp == b"." || comp == b".." || comp.contains(&b'/') {
                return Err(Error::Usage(format!(
                    "bad path component '{}'",
                    name_str(comp)
                )));
            }
            match self.step(cur, comp, seq, i == 0)? {
                Some(next) => cur = next,
                None => return Ok(None),
            }
        }
        let obj = match cur {
            Cur::Hist(o) => o,
            Cur::Live { obj, fd, st } => match obj {
                Some(o) if self.history.object_at(o, seq)?.is_some() => o,
                _ => return Ok(Some(Node::Live { obj, fd, st })),
            },
        };
        if let Some((s, v)) = self.history.object_at(obj, seq)? {
            return Ok(Some(Node::Hist { obj, seq: s, v }));
        }
        // Recorded by name but never changed: its live state is its state.
        Ok(self.live_object(obj)?.map(|(fd, st)| Node::Live {
            obj: Some(obj),
            fd,
            st,
        }))
    }

    fn node(&self, path: &[Vec<u8>], seq: Seq) -> Result<Node> {
        self.resolve(path, seq)?
            .ok_or_else(|| Error::NotFound(format!("{} did not exist at #{seq}", show_path(path))))
    }

    fn describe(&self, node: &Node) -> Value {
        match node {
            Node::Hist { obj, seq, v } => {
                let a = &v.attrs;
                let target = match &v.content {
                    Content::Symlink { target } => Some(name_str(target)),
                    _ => None,
                };
                json!({
                    "obj": obj, "source": "history", "seq": seq,
                    "cause": v.cause.as_str(), "time_ns": v.time_ns,
                    "kind": kind_name(a.mode), "mode": a.mode & 0o7777,
                    "uid": a.uid, "gid": a.gid, "size": a.size, "nlink": a.nlink,
                    "rdev": a.rdev,
                    "mtime_ns": a.mtime.sec as i128 * 1_000_000_000 + i128::from(a.mtime.nsec),
                    "atime_ns": a.atime.sec as i128 * 1_000_000_000 + i128::from(a.atime.nsec),
                    "target": target,
                    "xattrs": v.xattrs.iter().map(|(k, _)| name_str(k)).collect::<Vec<_>>(),
                })
            }
            Node::Live { obj, fd, st } => {
                let target = if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    sys::readlink_fd(fd.as_fd()).ok().map(|t| name_str(&t))
                } else {
                    None
                };
                json!({
                    "obj": obj, "source": "live", "seq": null, "cause": null,
                    "kind": kind_name(st.st_mode), "mode": st.st_mode & 0o7777,
                    "uid": st.st_uid, "gid": st.st_gid, "size": st.st_size,
                    "nlink": st.st_nlink, "rdev": st.st_rdev,
                    "mtime_ns": st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
                    "atime_ns": st.st_atime as i128 * 1_000_000_000 + st.st_atime_nsec as i128,
                    "target": target,
                })
            }
        }
    }

    fn list(&self, path: &Components, at: &At, deleted: bool) -> Result<Value> {
        let (seq, time) = self.resolve_at(at)?;
        let dir = self.node(path, seq)?;
        let mut entries = Vec::new();
        let mut present: HashSet<Vec<u8>> = HashSet::new();
        let hist_dir = match &dir {
            Node::Hist { obj, v, .. } => {
                if !matches!(v.content, Content::Dir) {
                    return Err(Error::Usage(format!(
                        "{} is not a directory",
                        show_path(path)
                    )));
                }
                Some(*obj)
            }
            Node::Live { st, .. } if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                return Err(Error::Usage(format!(
                    "{} is not a directory",
                    show_path(path)
                )))
            }
            Node::Live { .. } => None,
        };
        let names: Vec<Vec<u8>> = match (&dir, hist_dir) {
            (_, Some(d)) => match self.history.list_at(d, seq)? {
                Some(list) => list.into_iter().map(|(n, _)| n).collect(),
                None => self.live_names(&dir)?,
            },
            _ => self.live_names(&dir)?,
        };
        for name in names {
            let mut child = path.clone();
            child.push(name.clone());
            if let Some(node) = self.resolve(&child, seq)? {
                let mut d = self.describe(&node);
                d["name"] = json!(name_str(&name));
                present.insert(name);
                entries.push(d);
            }
        }
        let mut gone = Vec::new();
        if deleted {
            if let Some(d) = hist_dir {
                gone = self.deleted_in(d, seq, &present)?;
            }
        }
        Ok(json!({"seq": seq, "time_ns": time, "entries": entries, "deleted": gone}))
    }

    fn live_names(&self, dir: &Node) -> Result<Vec<Vec<u8>>> {
        let fd = match dir {
            Node::Live { fd, .. } => sys::reopen(fd.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?,
            Node::Hist { obj, .. } => match self.live_object(*obj)? {
                Some((fd, _)) => sys::reopen(fd.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?,
                None => return Ok(Vec::new()),
            },
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut names = Vec::new();
        loop {
            let batch = sys::getdents(fd.as_fd(), &mut buf)?;
            if batch.is_empty() {
                break;
            }
            names.extend(
                batch
                    .into_iter()
                    .map(|e| e.name)
                    .filter(|n| n != b"." && n != b".."),
            );
        }
        names.sort();
        Ok(names)
    }

    /// Names in `dir` that existed at some point up to `seq` but not at
    /// `seq`: what was deleted, with the last object and when.
    fn deleted_in(
        &self,
        dir: ObjectId,
        seq: Seq,
        present: &HashSet<Vec<u8>>,
    ) -> Result<Vec<Value>> {
        // name → (last change, what it named then, last object it named)
        type Last = (Seq, Option<ObjectId>, Option<(Seq, ObjectId)>);
        let mut last: HashMap<Vec<u8>, Last> = HashMap::new();
        for (name, s, child) in self.history.names_ever(dir)? {
            if s > seq {
                continue;
            }
            let e = last.entry(name).or_insert((s, child, None));
            if let Some(c) = child {
                e.2 = Some((s, c));
            }
            e.0 = s;
            e.1 = child;
        }
        let mut out = Vec::new();
        for (name, (s, child, was)) in last {
            if child.is_some() || present.contains(&name) {
                continue;
            }
            if let Some((_, obj)) = was {
                let before = self.history.object_at(obj, s.saturating_sub(1))?;
                let kind = before
                    .as_ref()
                    .map_or("unknown", |(_, v)| kind_name(v.attrs.mode));
                out.push(json!({
                    "name": name_str(&name), "obj": obj, "deleted_seq": s,
                    "deleted_time_ns": self.history.time_of_seq(s)?,
                    "kind": kind,
                    "size": before.as_ref().map(|(_, v)| v.attrs.size),
                }));
            }
        }
        out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        Ok(out)
    }

    fn may_read(&self, v: &Version, peer: &Peer) -> bool {
        if peer.uid == 0 {
            return true;
        }
        let mode = v.attrs.mode;
        if peer.uid == v.attrs.uid {
            return mode & 0o400 != 0;
        }
        if peer.gid == v.attrs.gid || sys::in_group(peer.pid, v.attrs.gid) {
            return mode & 0o040 != 0;
        }
        mode & 0o004 != 0
    }

    fn read(
        &self,
        path: &Components,
        at: &At,
        version: Option<i64>,
        peer: &Peer,
        reply: &mut dyn Reply,
    ) -> Result<Value> {
        let node = match version {
            Some(n) => self.nth_version(path, n)?,
            None => {
                let (seq, _) = self.resolve_at(at)?;
                self.node(path, seq)?
            }
        };
        match &node {
            Node::Hist { v, seq, .. } => {
                if !self.may_read(v, peer) {
                    return Err(Error::Denied(format!(
                        "{} at #{seq} was not readable by uid {}",
                        show_path(path),
                        peer.uid
                    )));
                }
                match &v.content {
                    Content::File { manifest } => {
                        let m = self.history.manifest(manifest)?;
                        content::write_to(self.history.chunks(), &m, &mut ReplyWriter(reply))?;
                    }
                    Content::Symlink { target } => reply.data(target)?,
                    _ => {
                        return Err(Error::Usage(format!(
                            "{} is a {} at #{seq}, not a file",
                            show_path(path),
                            kind_name(v.attrs.mode)
                        )))
                    }
                }
            }
            Node::Live { fd, st, .. } => {
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(Error::Usage(format!("{} is not a file", show_path(path))));
                }
                let probe = Version {
                    time_ns: 0,
                    who: Default::default(),
                    cause: crate::history::Cause::Baseline,
                    attrs: crate::history::Attrs {
                        mode: st.st_mode,
                        uid: st.st_uid,
                        gid: st.st_gid,
                        ..Default::default()
                    },
                    content: Content::Special,
                    xattrs: Vec::new(),
                    gone: false,
                };
                if !self.may_read(&probe, peer) {
                    return Err(Error::Denied(format!(
                        "{} is not readable",
                        show_path(path)
                    )));
                }
                let file = sys::reopen(fd.as_fd(), libc::O_RDONLY)?;
                let mut buf = vec![0u8; 1 << 20];
                let mut off = 0u64;
                loop {
                    let n = sys::pread(file.as_fd(), &mut buf, off)?;
                    if n == 0 {
                        break;
                    }
                    reply.data(&buf[..n])?;
                    off += n as u64;
                }
            }
        }
        Ok(self.describe(&node))
    }

    /// Version `n` of a path as `log` numbers them (1 = oldest; 0 = the
    /// newest, -1 the one before it, ...).
    fn nth_version(&self, path: &Components, n: i64) -> Result<Node> {
        let rows = self.path_versions(&self.incarnations(path)?, None, None)?;
        let len = rows.len() as i64;
        let idx = if n >= 1 { n - 1 } else { len - 1 + n };
        if idx < 0 || idx >= len {
            return Err(Error::NotFound(format!(
                "{} has {len} version(s); there is no version {n}",
                show_path(path)
            )));
        }
        let (obj, seq, v, _) = rows[idx as usize].clone();
        Ok(Node::Hist { obj, seq, v })
    }

    /// Objects bound to `path` over time: (object, from, until-exclusive).
    fn incarnations(&self, path: &[Vec<u8>]) -> Result<Vec<(ObjectId, Seq, Option<Seq>)>> {
        let mut level = vec![(ROOT, 0, None)];
        for (i, comp) in path.iter().enumerate() {
            let mut next = Vec::new();
            for (dir, from, until) in level {
                if !self.history.has_versions(dir)? {
                    // Never recorded: whatever is there now was there.
                    if let Some((fd, _)) = self.live_object(dir)? {
                        if let Some(Cur::Live { obj: Some(o), .. }) =
                            self.live_step(&fd, i == 0, comp)?
                        {
                            next.push((o, from, until));
                        }
                    }
                    continue;
                }
                let base = self.history.baseline_seq(dir)?;
                let mut current: Option<(ObjectId, Seq)> = None;
                for (s, child) in self.history.name_history(dir, comp)? {
                    // A baseline listing was valid since the directory appeared.
                    let s_eff = if Some(s) == base { from.min(s) } else { s };
                    if until.is_some_and(|u| s_eff >= u) {
                        break;
                    }
                    if let Some((o, start)) = current.take() {
                        next.push((o, start.max(from), Some(s_eff)));
                    }
                    if let Some(c) = child {
                        current = Some((c, s_eff));
                    }
                }
                if let Some((o, start)) = current {
                    next.push((o, start.max(from), until));
                }
            }
            next.retain(|(_, a, b)| b.is_none_or(|b| *a < b));
            level = next;
        }
        Ok(level)
    }

    /// Every version of every incarnation of `path`, oldest first:
    /// (object, seq, version, incarnation index).
    fn path_versions(
        &self,
        incarnations: &[(ObjectId, Seq, Option<Seq>)],
        since: Option<Seq>,
        until: Option<Seq>,
    ) -> Result<Vec<(ObjectId, Seq, Version, usize)>> {
        let mut rows = Vec::new();
        for (i, &(obj, from, to)) in incarnations.iter().enumerate() {
            let hi = to.unwrap_or(Seq::MAX);
            for (s, v) in self.history.versions(obj, 0, hi)? {
                // What was at this path: the incarnation's versions from
                // the moment it got the name (a baseline counts from the
                // object's first appearance) to its end. Its life under
                // an earlier name is in that name's log.
                let inside = s >= from || v.cause == crate::history::Cause::Baseline;
                if !inside || (s == hi && Some(s) != to) {
                    continue;
                }
                if since.is_some_and(|a| s < a) || until.is_some_and(|b| s > b) {
                    continue;
                }
                rows.push((obj, s, v, i));
            }
        }
        // Incarnation by incarnation, so the numbers of versions already
        // shown never change.
        rows.sort_by_key(|r| (r.3, r.1));
        rows.dedup_by_key(|r| (r.0, r.1));
        Ok(rows)
    }

    fn opt_seq(&self, at: Option<&At>) -> Result<Option<Seq>> {
        at.map(|a| self.resolve_at(a).map(|(s, _)| s)).transpose()
    }

    fn log(
        &self,
        path: &Components,
        since: Option<&At>,
        until: Option<&At>,
        recursive: bool,
    ) -> Result<Value> {
        let since = self.opt_seq(since)?;
        let until = self.opt_seq(until)?;
        if recursive {
            let tree = self.log_tree(path, since, until)?;
            return Ok(tree.into_value());
        }
        let incarnations = self.incarnations(path)?;
        if incarnations.is_empty() {
            return Err(Error::NotFound(format!(
                "{} never existed in recorded history",
                show_path(path)
            )));
        }
        // Numbers count every version, whatever the range shown.
        let all = self.path_versions(&incarnations, None, None)?;
        let number: HashMap<(ObjectId, Seq), usize> = all
            .iter()
            .enumerate()
            .map(|(i, r)| ((r.0, r.1), i + 1))
            .collect();
        let rows: Vec<_> = all
            .into_iter()
            .filter(|r| since.is_none_or(|a| r.1 >= a) && until.is_none_or(|b| r.1 <= b))
            .collect();
        let out: Vec<Value> = rows
            .iter()
            .map(|(obj, s, v, inc)| {
                let mut row = version_row(*obj, *s, v);
                row["n"] = json!(number.get(&(*obj, *s)));
                row["incarnation"] = json!(inc + 1);
                row["path"] = json!(show_path(path));
                row
            })
            .collect();
        let incs: Vec<Value> = incarnations
            .iter()
            .map(|(o, a, b)| json!({"obj": o, "from_seq": a, "until_seq": b}))
            .collect();
        Ok(json!({"path": show_path(path), "incarnations": incs, "versions": out}))
    }

    fn log_tree(
        &self,
        path: &Components,
        since: Option<Seq>,
        until: Option<Seq>,
    ) -> Result<Answer> {
        let roots: Vec<ObjectId> = if path.is_empty() {
            vec![ROOT]
        } else {
            self.incarnations(path)?
                .into_iter()
                .map(|(o, _, _)| o)
                .collect()
        };
        if roots.is_empty() {
            return Err(Error::NotFound(format!(
                "{} never existed in recorded history",
                show_path(path)
            )));
        }
        let (lo, hi) = (since.unwrap_or(0), until.unwrap_or(Seq::MAX));
        let mut seen = HashSet::new();
        let mut queue: Vec<(ObjectId, Vec<Vec<u8>>)> =
            roots.into_iter().map(|o| (o, path.clone())).collect();
        // Rows stay typed until sorted: sorting tens of thousands of JSON
        // objects by field lookups cost most of a `log -r`.
        let mut paths: Vec<String> = Vec::new();
        let mut rows: Vec<(Seq, usize, ObjectId, Version)> = Vec::new();
        while let Some((obj, p)) = queue.pop() {
            if !seen.insert(obj) {
                continue;
            }
            let mut is_dir = false;
            let path_idx = paths.len();
            paths.push(show_path(&p));
            for (s, v) in self.history.versions(obj, lo, hi)? {
                is_dir |= matches!(v.content, Content::Dir);
                rows.push((s, path_idx, obj, v));
            }
            let names = self.history.names_ever(obj)?;
            is_dir |= !names.is_empty();
            if !is_dir {
                continue;
            }
            let mut children: Vec<(Vec<u8>, ObjectId)> = names
                .into_iter()
                .filter_map(|(n, _, c)| c.map(|c| (n, c)))
                .collect();
            children.sort();
            children.dedup();
            for (name, child) in children {
                let mut cp = p.clone();
                cp.push(name);
                queue.push((child, cp));
            }
        }
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| paths[a.1].cmp(&paths[b.1])));
        #[derive(serde::Serialize)]
        struct Tree<'a> {
            path: String,
            versions: Vec<VersionRow<'a>>,
        }
        let tree = Tree {
            path: show_path(path),
            versions: rows
                .iter()
                .map(|(s, path_idx, obj, v)| VersionRow::new(*obj, *s, v, Some(&paths[*path_idx])))
                .collect(),
        };
        // Serialized once, straight from the rows: building a JSON value
        // per row first cost more than the index reads.
        serde_json::value::to_raw_value(&tree)
            .map(Answer::Raw)
            .map_err(|e| Error::Usage(format!("cannot encode the answer: {e}")))
    }

    fn status(&self) -> Result<Value> {
        let c = self.history.counts()?;
        let bounds = self.history.bounds()?;
        let logical = self.history.logical_bytes()?;
        let store_bytes = dir_size(&self.store_dir);
        let packs = self
            .history
            .chunks()
            .packs_size()
            .map_err(HistoryError::from)?;
        let index_file =
            std::fs::metadata(self.store_dir.join(crate::store::INDEX_FILE)).map_or(0, |m| m.len());
        let index_used = self.history.index_used_bytes()?;
        Ok(json!({
            "store": self.store_dir.display().to_string(),
            "store_bytes": store_bytes,
            // What the store holds, counting the index by its pages in use.
            "store_used_bytes": store_bytes.saturating_sub(index_file) + index_used,
            "index_bytes": index_file,
            "index_used_bytes": index_used,
            "pack_bytes": packs,
            "versions": c.versions,
            "changes": c.changes,
            "chunks": c.chunks,
            "chunk_bytes": c.chunk_raw_bytes,
            "stored_bytes": c.chunk_stored_bytes,
            "logical_bytes": logical,
            "dedup_ratio": ratio(logical, c.chunk_raw_bytes),
            "compression_ratio": ratio(c.chunk_raw_bytes, c.chunk_stored_bytes),
            "tags": c.tags,
            "ingest": self.host.ingest_status(),
            "first": bounds.map(|((s, t), _)| json!({"seq": s, "time_ns": t})),
            "last": bounds.map(|(_, (s, t))| json!({"seq": s, "time_ns": t})),
        }))
    }

    fn tags(&self) -> Result<Value> {
        let mut out = Vec::new();
        for (name, seq) in self.history.tags()? {
            out.push(json!({"name": name, "seq": seq, "time_ns": self.history.time_of_seq(seq)?}));
        }
        Ok(json!({"tags": out}))
    }

    fn tag(&self, name: &str, at: &At) -> Result<Value> {
        if name.is_empty()
            || name.bytes().all(|b| b.is_ascii_digit())
            || spec::parse(name) != Ok(At::Tag(name.to_string()))
        {
            return Err(Error::Usage(format!(
                "'{name}' cannot be a tag name: it would read as a time or sequence number"
            )));
        }
        let (seq, t) = self.resolve_at(at)?;
        if let Some(old) = self.history.tag(name)? {
            return Err(Error::Usage(format!(
                "tag '{name}' already exists (at #{old}); remove it first with `chronofs tag --delete {name}`"
            )));
        }
        self.history.commit(Draft {
            tags: vec![(name.to_string(), Some(seq))],
            ..Default::default()
        })?;
        Ok(json!({"name": name, "seq": seq, "time_ns": t}))
    }

    fn untag(&self, name: &str, peer: &Peer) -> Result<Value> {
        if self.history.tag(name)?.is_none() {
            return Err(Error::NotFound(format!("no tag named '{name}'")));
        }
        if peer.uid != 0 {
            return Err(Error::Denied("only root may remove tags".into()));
        }
        self.history.commit(Draft {
            tags: vec![(name.to_string(), None)],
            ..Default::default()
        })?;
        Ok(json!({"name": name, "deleted": true}))
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

fn dir_size(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// One version as `log` shows it.
#[derive(serde::Serialize)]
struct VersionRow<'a> {
    obj: ObjectId,
    seq: Seq,
    time_ns: i64,
    cause: &'static str,
    kind: &'static str,
    size: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    pid: u32,
    process: &'a str,
    owner: u32,
    gone: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a str>,
}

impl<'a> VersionRow<'a> {
    fn new(obj: ObjectId, seq: Seq, v: &'a Version, path: Option<&'a str>) -> Self {
        VersionRow {
            obj,
            seq,
            time_ns: v.time_ns,
            cause: v.cause.as_str(),
            kind: kind_name(v.attrs.mode),
            size: v.attrs.size,
            mode: v.attrs.mode & 0o7777,
            uid: v.who.uid,
            gid: v.who.gid,
            pid: v.who.pid,
            process: &v.who.comm,
            owner: v.attrs.uid,
            gone: v.gone,
            path,
        }
    }
}

fn version_row(obj: ObjectId, seq: Seq, v: &Version) -> Value {
    serde_json::to_value(VersionRow::new(obj, seq, v, None)).unwrap_or(Value::Null)
}

/// A request's result: a JSON value, or JSON already encoded (large
/// answers, serialized straight from typed rows).
pub enum Answer {
    Value(Value),
    Raw(Box<serde_json::value::RawValue>),
}

impl Answer {
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            Answer::Value(v) => v.to_string().into_bytes(),
            Answer::Raw(r) => r.get().as_bytes().to_vec(),
        }
    }

    pub fn into_value(self) -> Value {
        match self {
            Answer::Value(v) => v,
            Answer::Raw(r) => serde_json::from_str(r.get()).unwrap_or(Value::Null),
        }
    }
}

/// What `fsck` found.
#[derive(Debug, Default, serde::Serialize)]
pub struct FsckReport {
    pub versions: u64,
    pub manifests_checked: u64,
    pub chunks_checked: u64,
    pub bytes_checked: u64,
    pub problems: Vec<String>,
    pub repaired: u64,
}

/// Verifies every version's references and every chunk's hash.
/// `progress(done, total)` is called as chunks are checked.
pub fn fsck(
    history: &History,
    repair: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<FsckReport> {
    Ok(history.verify(repair, progress)?).map(|r| FsckReport {
        versions: r.versions,
        manifests_checked: r.manifests,
        chunks_checked: r.chunks,
        bytes_checked: r.bytes,
        problems: r.problems,
        repaired: r.repaired,
    })
}
