//! A past instant as a tree: paths and directory entries resolved at a
//! sequence number, over recorded history and the live tree.
//!
//! Where history holds nothing (a directory or file never changed through
//! the mount), the live tree is its state then (see `query` for why that is
//! exact), reached by the object's current recorded path and checked to be
//! the same object. Used by the control service (`ls --at`, `cat`, `log`)
//! and by the vfs's `.history/` views, so both read the past the same way.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use super::query::Lookup;
use super::spec::{self, At};
use super::{Cause, History, HistoryError, ObjectId, Seq, Version, ROOT};
use crate::sys::{self, Stat};

/// Names tree operations build their result under (`cli/restore.rs`);
/// what is removed under them is the tree a revert replaced, reachable as
/// it was before the revert, not a deletion worth listing.
pub const STAGING_PREFIX: &[u8] = b".chronofs-staging-";

/// Whether `name` has the form of a tree operation's staging directory,
/// `.chronofs-staging-PID-N` (`cli/restore.rs`): a user's own
/// `.chronofs-staging-notes` is an ordinary name. The tools run as the
/// user, so a directory a user named exactly so cannot be told apart.
pub fn is_staging_name(name: &[u8]) -> bool {
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    name.strip_prefix(STAGING_PREFIX)
        .and_then(|rest| {
            let dash = rest.iter().position(|&b| b == b'-')?;
            Some(digits(&rest[..dash]) && digits(&rest[dash + 1..]))
        })
        .unwrap_or(false)
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    NotFound(String),
    /// Something in use forbids it (open files, for a branch change).
    #[error("{0}")]
    Busy(String),
    #[error("permission denied: {0}")]
    Denied(String),
    /// A privileged act (EPERM): erasing or collecting history, changing
    /// the policy.
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl Error {
    /// No wildcard arm: a new variant must choose its errno here.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Usage(_) => libc::EINVAL,
            Error::NotFound(_) => libc::ENOENT,
            Error::Busy(_) => libc::EBUSY,
            Error::Denied(_) => libc::EACCES,
            Error::NotPermitted(_) => libc::EPERM,
            Error::History(e) => e.errno(),
            Error::Io(e) => crate::store::io_errno(e),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A path's object at an instant.
pub enum Node {
    /// A recorded version (`seq` is the version's own sequence number).
    Hist { obj: ObjectId, seq: Seq, v: Version },
    /// Unchanged since: the live object is its state then.
    Live {
        obj: Option<ObjectId>,
        fd: OwnedFd,
        st: Stat,
    },
}

impl Node {
    pub fn mode(&self) -> u32 {
        match self {
            Node::Hist { v, .. } => v.attrs.mode,
            Node::Live { st, .. } => st.st_mode,
        }
    }

    /// The object, where history knows it.
    pub fn obj(&self) -> Option<ObjectId> {
        match self {
            Node::Hist { obj, .. } => Some(*obj),
            Node::Live { obj, .. } => *obj,
        }
    }
}

/// Where a walk stands.
pub enum Cur {
    Hist(ObjectId),
    Live {
        obj: Option<ObjectId>,
        fd: OwnedFd,
        st: Stat,
    },
}

/// A name that existed in a directory up to some instant but not at it.
#[derive(Clone, Debug)]
pub struct Deleted {
    pub name: Vec<u8>,
    /// The last object the name named.
    pub obj: ObjectId,
    /// The change that removed it.
    pub seq: Seq,
    /// The object's state just before (absent if never recorded).
    pub before: Option<(Seq, Version)>,
}

/// An object bound to a path over a span: (object, from, until-exclusive).
pub type Incarnation = (ObjectId, Seq, Option<Seq>);
/// A version of a path: (object, seq, version, incarnation index).
pub type PathVersion = (ObjectId, Seq, Version, usize);

pub fn name_str(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

pub fn show_path(p: &[Vec<u8>]) -> String {
    if p.is_empty() {
        return "/".into();
    }
    p.iter().map(|c| format!("/{}", name_str(c))).collect()
}

pub fn kind_name(mode: u32) -> &'static str {
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

/// History plus the live tree it stands on.
pub struct Past<'a> {
    pub history: &'a History,
    /// O_PATH descriptor of the branch root (SRC).
    pub root: BorrowedFd<'a>,
    /// The store's name in the root, never shown.
    pub reserved: Option<&'a OsStr>,
    pub live: &'a dyn LiveIds,
}

/// How live objects map to object ids.
pub trait LiveIds: Send + Sync {
    /// The object id of a live object, if it has one (never assigns).
    fn identify(&self, st: &Stat) -> Option<ObjectId>;

    /// Object `obj` as the mount shows it at `path` now, if it is there,
    /// where steps through the branch root's directories would not find
    /// it (a union's lower branches); `None` to take those steps.
    fn find(
        &self,
        _obj: ObjectId,
        _path: &[Vec<u8>],
    ) -> Option<io::Result<Option<(OwnedFd, Stat)>>> {
        None
    }

    /// [`LiveIds::find`] for `name` in live directory `dir`: the object
    /// the mount shows there now, with its id.
    fn find_child(
        &self,
        _dir: ObjectId,
        _name: &[u8],
    ) -> Option<io::Result<Option<(ObjectId, OwnedFd, Stat)>>> {
        None
    }
}

impl Past<'_> {
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
                if *t > self.history.now_ns() + 1_000_000_000 {
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

    /// A name of the root that is chronofs's own: the store's, the
    /// hard-link index's.
    fn is_reserved(&self, name: &[u8]) -> bool {
        let name = OsStr::from_bytes(name);
        self.reserved == Some(name) || name == crate::store::LINK_INDEX_DIR
    }

    /// One name in a live directory.
    pub fn live_step(&self, dir: BorrowedFd, in_root: bool, name: &[u8]) -> Result<Option<Cur>> {
        if in_root && self.is_reserved(name) {
            return Ok(None);
        }
        let cname = sys::cstr(OsStr::from_bytes(name))?;
        let fd = match sys::open_path(dir, &cname) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let st = sys::fstat(fd.as_fd())?;
        let obj = self.live.identify(&st);
        Ok(Some(Cur::Live { obj, fd, st }))
    }

    /// [`Past::live_object`], tried first at `hint` (a path it had at
    /// some instant): finding an object by its recorded path reads the
    /// index for each of its names, and an object seldom moves.
    pub fn live_object_near(
        &self,
        obj: ObjectId,
        hint: &[Vec<u8>],
    ) -> Result<Option<(OwnedFd, Stat)>> {
        if !hint.is_empty() {
            if let Some(found) = self.live_at_path(obj, hint)? {
                return Ok(Some(found));
            }
        }
        self.live_object(obj)
    }

    /// The live object `obj` (found by its current recorded path, and
    /// checked to be the same object).
    pub fn live_object(&self, obj: ObjectId) -> Result<Option<(OwnedFd, Stat)>> {
        if obj == ROOT {
            let fd = sys::reopen(self.root, libc::O_PATH)?;
            let st = sys::fstat(fd.as_fd())?;
            return Ok(Some((fd, st)));
        }
        match self.history.path_at(obj, Seq::MAX)? {
            Some(path) => self.live_at_path(obj, &path),
            None => Ok(None),
        }
    }

    /// What lives at `path` now, if it is `obj`. (The path may have
    /// changed since it was recorded: a component that is no longer a
    /// directory means `obj` is not there.)
    fn live_at_path(&self, obj: ObjectId, path: &[Vec<u8>]) -> Result<Option<(OwnedFd, Stat)>> {
        if let Some(found) = self.live.find(obj, path) {
            return Ok(found?);
        }
        let mut fd = sys::reopen(self.root, libc::O_PATH)?;
        for (i, comp) in path.iter().enumerate() {
            match self.live_step(fd.as_fd(), i == 0, comp)? {
                Some(Cur::Live { fd: next, st, .. })
                    if i + 1 == path.len() || st.st_mode & libc::S_IFMT == libc::S_IFDIR =>
                {
                    fd = next
                }
                _ => return Ok(None),
            }
        }
        let st = sys::fstat(fd.as_fd())?;
        Ok((self.live.identify(&st) == Some(obj)).then_some((fd, st)))
    }

    /// What `comp` in the directory `cur` was at `seq`.
    pub fn step(&self, cur: Cur, comp: &[u8], seq: Seq, in_root: bool) -> Result<Option<Cur>> {
        let dir = match cur {
            Cur::Live {
                obj: Some(o), fd, ..
            } => {
                if self.history.object_at(o, seq)?.is_some() {
                    o
                } else {
                    return self.live_child(o, fd.as_fd(), in_root, comp);
                }
            }
            Cur::Live { obj: None, fd, .. } => return self.live_step(fd.as_fd(), in_root, comp),
            Cur::Hist(d) => d,
        };
        match self.history.lookup_at(dir, comp, seq)? {
            Lookup::Found(o) => Ok(Some(Cur::Hist(o))),
            Lookup::Absent => Ok(None),
            Lookup::Live => match self.live_object(dir)? {
                Some((fd, _)) => self.live_child(dir, fd.as_fd(), in_root, comp),
                None => Ok(None),
            },
        }
    }

    /// [`Past::live_step`] in live directory `dir` (`fd`), asking the
    /// mount first ([`LiveIds::find_child`]: a union's merged directory).
    fn live_child(
        &self,
        dir: ObjectId,
        fd: BorrowedFd,
        in_root: bool,
        name: &[u8],
    ) -> Result<Option<Cur>> {
        if in_root && self.is_reserved(name) {
            return Ok(None);
        }
        match self.live.find_child(dir, name) {
            Some(found) => Ok(found?.map(|(obj, fd, st)| Cur::Live {
                obj: Some(obj),
                fd,
                st,
            })),
            None => self.live_step(fd, in_root, name),
        }
    }

    /// The state at `seq` of the object a walk reached.
    pub fn finish(&self, cur: Cur, seq: Seq) -> Result<Option<Node>> {
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

    pub fn resolve(&self, path: &[Vec<u8>], seq: Seq) -> Result<Option<Node>> {
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
        self.finish(cur, seq)
    }

    pub fn node(&self, path: &[Vec<u8>], seq: Seq) -> Result<Node> {
        self.resolve(path, seq)?
            .ok_or_else(|| Error::NotFound(format!("{} did not exist at #{seq}", show_path(path))))
    }

    /// The names in directory `dir` at `seq`, sorted: its recorded listing,
    /// or its live one if the listing never changed.
    pub fn names(&self, dir: &Node, seq: Seq, in_root: bool) -> Result<Vec<Vec<u8>>> {
        const LIST: i32 = libc::O_RDONLY | libc::O_DIRECTORY;
        let fd = match dir {
            Node::Hist { obj, .. } => match self.history.list_at(*obj, seq)? {
                Some(list) => return Ok(list.into_iter().map(|(n, _)| n).collect()),
                None => match self.live_object(*obj)? {
                    Some((fd, _)) => sys::reopen(fd.as_fd(), LIST)?,
                    None => return Ok(Vec::new()),
                },
            },
            Node::Live { fd, .. } => sys::reopen(fd.as_fd(), LIST)?,
        };
        let mut buf = sys::DirBuf::new(64 * 1024);
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
                    .filter(|n| n != b"." && n != b".." && !(in_root && self.is_reserved(n))),
            );
        }
        names.sort();
        Ok(names)
    }

    /// Names in `dir` that existed at some point up to `seq` but not at
    /// `seq` (and are not in `present`), sorted by name: each name's last
    /// deletion, or with `every` each of its deletions, oldest first (a
    /// name made and deleted again and again named a new file each time).
    pub fn deleted_in(
        &self,
        dir: ObjectId,
        seq: Seq,
        present: &dyn Fn(&[u8]) -> bool,
        every: bool,
    ) -> Result<Vec<Deleted>> {
        // name → (what it names at `seq`, its removals: (at, the object
        // it named until then)), in the order of the changes.
        type Removals = (Option<ObjectId>, Vec<(Seq, ObjectId)>);
        let mut names: HashMap<Vec<u8>, Removals> = HashMap::new();
        for (name, s, child) in self.history.names_ever(dir)? {
            if s > seq {
                continue;
            }
            let (now, removals) = names.entry(name).or_default();
            if let (None, Some(was)) = (child, *now) {
                removals.push((s, was));
            }
            *now = child;
        }
        let mut out = Vec::new();
        for (name, (now, mut removals)) in names {
            if now.is_some() || present(&name) {
                continue;
            }
            if !every {
                removals.drain(..removals.len().saturating_sub(1));
            }
            for (s, obj) in removals {
                if !self.removal_deletes(dir, obj, s, seq, present)? {
                    continue;
                }
                let before = self.history.object_at(obj, s.prev())?;
                let dir = |(_, v): &(Seq, Version)| v.attrs.mode & libc::S_IFMT == libc::S_IFDIR;
                if is_staging_name(&name) && before.as_ref().is_none_or(dir) {
                    continue;
                }
                out.push(Deleted {
                    name: name.clone(),
                    obj,
                    seq: s,
                    before,
                });
            }
        }
        out.sort_by(|a, b| (&a.name, a.seq).cmp(&(&b.name, b.seq)));
        Ok(out)
    }

    /// Whether the removal at `s` of a name of `obj` in `dir` is a
    /// deletion worth listing under `;deleted` at `seq` (see "Renames in
    /// history" in docs/ARCHITECTURE.md). It is not when:
    /// - the object was renamed away (it lives on under its new name);
    /// - it got this name by a rename from a name that is present at
    ///   `seq`, and did not change under it (an editor's backup such as
    ///   vim's `f~`: its last state is in that name's log);
    /// - one process created and removed it empty, with nothing in
    ///   between (a probe, such as vim's `4913`).
    fn removal_deletes(
        &self,
        dir: ObjectId,
        obj: ObjectId,
        s: Seq,
        seq: Seq,
        present: &dyn Fn(&[u8]) -> bool,
    ) -> Result<bool> {
        let lived = self.history.versions(obj, Seq::ZERO, s)?;
        let Some((last_s, last)) = lived.last() else {
            return Ok(true);
        };
        if *last_s == s && last.cause == Cause::Rename {
            return Ok(false);
        }
        let before: Vec<_> = lived.iter().filter(|(v_s, _)| *v_s < s).collect();
        if let [(_, first)] = before.as_slice() {
            if first.cause == Cause::Create
                && *last_s == s
                && first.who.pid == last.who.pid
                && first.who.pid != 0
                && first.attrs.size == 0
                && last.attrs.size == 0
            {
                return Ok(false);
            }
        }
        if let Some((renamed, v)) = before.last() {
            if v.cause == Cause::Rename {
                for l in self.history.links(obj)? {
                    if l.seq != *renamed || l.bound {
                        continue;
                    }
                    let here = if l.parent == dir {
                        present(&l.name)
                    } else {
                        false
                    };
                    let there = matches!(
                        self.history.lookup_at(l.parent, &l.name, seq)?,
                        Lookup::Found(_)
                    );
                    if here || there {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    /// The path at `to` of what `path` named at `at`: the object's own
    /// path then, or, if it did not exist then, the path then of its
    /// nearest directory that did, with the rest of `path` below it.
    /// `None` if nothing of it existed at `to`.
    pub fn follow(&self, path: &[Vec<u8>], at: Seq, to: Seq) -> Result<Option<Vec<Vec<u8>>>> {
        let here = self.resolve(path, to)?;
        // The object's own path first: `path` may name another one at `to`
        // (a directory renamed since, and another made at its old name).
        if let Some(obj) = self.resolve(path, at)?.as_ref().and_then(Node::obj) {
            // Its own name, not another hard link's.
            if here.as_ref().and_then(Node::obj) == Some(obj) {
                return Ok(Some(path.to_vec()));
            }
            if let Some(then) = self.history.path_at(obj, to)? {
                if self.resolve(&then, to)?.is_some() {
                    return Ok(Some(then));
                }
            }
        }
        if here.is_some() {
            return Ok(Some(path.to_vec()));
        }
        for keep in (1..path.len()).rev() {
            let Some(obj) = self
                .resolve(&path[..keep], at)?
                .as_ref()
                .and_then(Node::obj)
            else {
                continue;
            };
            let Some(mut then) = self.history.path_at(obj, to)? else {
                continue;
            };
            then.extend(path[keep..].iter().cloned());
            if self.resolve(&then, to)?.is_some() {
                return Ok(Some(then));
            }
        }
        Ok(None)
    }

    /// Objects bound to `path` over time.
    pub fn incarnations(&self, path: &[Vec<u8>]) -> Result<Vec<Incarnation>> {
        let mut level = vec![(ROOT, Seq::ZERO, None)];
        for (i, comp) in path.iter().enumerate() {
            let mut next = Vec::new();
            for (dir, from, until) in level {
                if !self.history.has_versions(dir)? {
                    // Never recorded: whatever is there now was there.
                    if let Some((fd, _)) = self.live_object(dir)? {
                        if let Some(Cur::Live { obj: Some(o), .. }) =
                            self.live_step(fd.as_fd(), i == 0, comp)?
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

    /// Every version of every incarnation, oldest first, numbered by
    /// position (1 = the oldest).
    ///
    /// An incarnation brings its object's whole history up to its end,
    /// including what the object went through under earlier names (its
    /// own or its directories' renames): history follows the file, as
    /// `git log --follow` does. An object that comes back to the path
    /// brings only what it did since its previous incarnation here ended,
    /// so each version is listed once and numbers already shown never
    /// change; one that comes back unchanged (a union branch that hid it
    /// was removed) lists again the version it shows, which is then the
    /// path's newest.
    pub fn path_versions(
        &self,
        incarnations: &[Incarnation],
        since: Option<Seq>,
        until: Option<Seq>,
    ) -> Result<Vec<PathVersion>> {
        let mut rows = Vec::new();
        let mut shown: HashMap<ObjectId, Seq> = HashMap::new();
        let outside = |s: Seq| since.is_some_and(|a| s < a) || until.is_some_and(|b| s > b);
        for (i, &(obj, from, to)) in incarnations.iter().enumerate() {
            let hi = to.unwrap_or(Seq::MAX);
            let lo = shown.get(&obj).map_or(Seq::ZERO, |s| s.next());
            if lo > hi {
                continue;
            }
            let mut versions = self.history.versions(obj, lo, hi)?;
            let unchanged_since = versions.first().is_none_or(|(s, _)| *s > from);
            if shown.contains_key(&obj) && unchanged_since && !outside(from) {
                // Back with no change of its own (a union branch that hid
                // it went): the version it comes back with is what the path
                // shows again, and must be the newest if nothing follows.
                if let Some((s, v)) = self.history.object_at(obj, from)? {
                    rows.push((obj, s, v, i));
                }
            }
            versions.retain(|(s, _)| !outside(*s));
            rows.extend(versions.into_iter().map(|(s, v)| (obj, s, v, i)));
            shown.insert(obj, hi);
        }
        // Incarnation by incarnation, so the numbers of versions already
        // shown never change.
        rows.sort_by_key(|r| (r.3, r.1));
        rows.dedup_by_key(|r| (r.0, r.1));
        Ok(rows)
    }

    /// Version `n` of a path as `log` numbers them (1 = oldest; 0 = the
    /// newest, -1 the one before it, ...).
    pub fn nth_version(&self, path: &[Vec<u8>], n: i64) -> Result<Node> {
        let incarnations = self.incarnations(path)?;
        if incarnations.is_empty() {
            return Err(Error::NotFound(format!(
                "{} never existed in recorded history",
                show_path(path)
            )));
        }
        let rows = self.path_versions(&incarnations, None, None)?;
        let len = rows.len() as i64;
        // Checked: `f;-9223372036854775808` is a name anyone may look up.
        let idx = if n >= 1 {
            Some(n - 1)
        } else {
            (len - 1).checked_add(n)
        };
        let Some(idx) = idx.filter(|i| (0..len).contains(i)) else {
            return Err(Error::NotFound(format!(
                "{} has {len} version(s); there is no version {n}",
                show_path(path)
            )));
        };
        let (obj, seq, v, _) = rows[idx as usize].clone();
        Ok(Node::Hist { obj, seq, v })
    }

    /// The instant to show a deleted entry at: just before its removal;
    /// for a directory, before the run of removals in its subtree that
    /// ended with its own (`rm -rf` empties a directory before removing
    /// it, and the tree a user wants back is the one before that began).
    pub fn before_removal(&self, d: &Deleted) -> Result<Seq> {
        let is_dir = d
            .before
            .as_ref()
            .is_some_and(|(_, v)| v.attrs.mode & libc::S_IFMT == libc::S_IFDIR);
        let mut start = d.seq;
        if is_dir {
            let mut changes: Vec<(Seq, Cause)> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            let mut stack = vec![d.obj];
            while let Some(obj) = stack.pop() {
                if !seen.insert(obj) {
                    continue;
                }
                for (s, v) in self.history.versions(obj, Seq::ZERO, d.seq)? {
                    changes.push((s, v.cause));
                }
                stack.extend(
                    self.history
                        .names_ever(obj)?
                        .into_iter()
                        .filter_map(|(_, _, c)| c),
                );
            }
            changes.sort_unstable_by_key(|c| c.0);
            for (s, cause) in changes.into_iter().rev() {
                match cause {
                    Cause::Unlink | Cause::Rmdir => start = start.min(s),
                    // A file first seen by the removal itself (it predates
                    // history) gets its baseline in the middle of the
                    // `rm -rf`: that records the prior state, it is not a
                    // change that ends the removal.
                    Cause::Baseline => {}
                    _ => break,
                }
            }
        }
        Ok(start.prev().max(Seq::new(1)))
    }
}
