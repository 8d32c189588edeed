//! Names of the past: `.history` and its instants in the mount root,
//! version names (`f;3`, `f;-1`, `f;@T`) and `;deleted` in live
//! directories, and names inside view directories.

use super::*;
use crate::history::access::{Who, Whom};

/// How long an absent name in a view directory may be remembered at most:
/// a tag or a version made later can give it a meaning.
const VIEW_NEGATIVE_TTL: Duration = Duration::from_secs(1);

/// A deleted entry: its name, the instant it is shown at, its state
/// there, and `T` (the change that removed it, or the entry's timeout).
pub(super) type Gone<T> = (Vec<u8>, Seq, Node, T);

impl Vfs {
    /// How long the kernel may remember that `name` is absent from
    /// `parent`: the mount's negative timeout for a live name, as the
    /// kernel forgets it itself when the name is made through the mount.
    /// A name whose meaning moves with history (a version name, `;deleted`,
    /// the history directory: absent to a non-root caller under audit, or
    /// until a version exists) is never remembered absent: the kernel's
    /// negative entry is shared by every caller and outlives new versions.
    pub fn negative_ttl(&self, parent: InodeNo, name: &OsStr) -> Duration {
        if matches!(self.source_of(parent), crate::vfs::source::Source::Past(_)) {
            return self.cfg.negative_timeout.min(VIEW_NEGATIVE_TTL);
        }
        let historic = self.views_on()
            && ((parent == InodeNo::ROOT && name == self.cfg.views.dir_name)
                || self.cfg.views.holds_sep(name.as_bytes()));
        if historic {
            Duration::ZERO
        } else if let (Some(ttl), Some(_)) = (self.cfg.lower_timeout, self.union()) {
            // Another mount may make the name in a read-only branch.
            ttl.min(self.cfg.negative_timeout)
        } else {
            self.cfg.negative_timeout
        }
    }

    /// Whether `name` in live directory `parent` has the form of a name of
    /// the past (the history directory in the root, `;deleted`, a version
    /// name `f;3`, `f;-1`, `f;@T`), whether or not such a version exists.
    pub(in crate::vfs) fn is_past_name(&self, parent: InodeNo, name: &OsStr) -> bool {
        if !self.views_on()
            || !matches!(self.source_of(parent), crate::vfs::source::Source::Live(_))
        {
            return false;
        }
        if parent == InodeNo::ROOT && name == self.cfg.views.dir_name {
            return true;
        }
        let sep = self.cfg.views.sep.as_slice();
        let bytes = name.as_bytes();
        let Some(cut) = (!sep.is_empty())
            .then(|| bytes.windows(sep.len()).rposition(|w| w == sep))
            .flatten()
        else {
            return false;
        };
        let (base, suffix) = (&bytes[..cut], &bytes[cut + sep.len()..]);
        let number = suffix.strip_prefix(b"-").unwrap_or(suffix);
        (base.is_empty() && suffix == b"deleted")
            || (!base.is_empty()
                && (suffix.starts_with(b"@")
                    || (!number.is_empty() && number.iter().all(u8::is_ascii_digit))))
    }

    /// `name` in the mount root, if it is the history directory.
    pub(in crate::vfs) fn lookup_top(
        &self,
        caller: &Caller,
        name: &OsStr,
    ) -> Option<Result<Entry>> {
        if !self.views_on() || name != self.cfg.views.dir_name {
            return None;
        }
        if self.hidden_from(caller) {
            return Some(enoent("history is hidden from non-root users (audit)"));
        }
        Some(
            self.hold_view(TOP, || {
                let root = sys::fstat(self.branch.root_fd())?;
                let mut st = sys::zeroed_stat();
                st.st_ino = TOP.0;
                st.st_mode = libc::S_IFDIR | if self.cfg.views.audit { 0o500 } else { 0o555 };
                st.st_nlink = 2;
                st.st_blksize = 4096;
                (st.st_atime, st.st_mtime, st.st_ctime) =
                    (root.st_ctime, root.st_ctime, root.st_ctime);
                Ok((What::Top, st))
            })
            // Under audit every lookup of the name is checked against its
            // caller.
            .map(|st| {
                let ttl = if self.cfg.views.audit {
                    Duration::ZERO
                } else {
                    IMMUTABLE_TTL
                };
                entry(st, ttl)
            }),
        )
    }

    /// A version name (`f;3`, `f;-1`, `f;@T`) or `;deleted` in the live
    /// directory `parent`, tried only when no real entry has that name.
    pub(in crate::vfs) fn lookup_version_name(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
    ) -> Option<Result<Entry>> {
        let sep = &self.cfg.views.sep;
        let bytes = name.as_bytes();
        if !self.views_on() || sep.is_empty() {
            return None;
        }
        let cut = bytes
            .windows(sep.len())
            .rposition(|w| w == sep.as_slice())?;
        let (base, suffix) = (&bytes[..cut], &bytes[cut + sep.len()..]);
        if self.hidden_from(caller) {
            return Some(enoent("history is hidden from non-root users (audit)"));
        }
        if base.is_empty() && suffix == b"deleted" {
            return Some(self.lookup_deleted_dir(parent));
        }
        if base.is_empty() || suffix.is_empty() {
            return None;
        }
        Some(self.lookup_version(parent, base, suffix))
    }

    fn live_path(&self, dir: InodeNo) -> Result<Vec<Vec<u8>>> {
        let mut parts = Vec::new();
        let mut cur = dir;
        while cur != InodeNo::ROOT {
            let Some((parent, name)) = self.inodes.get(cur)?.name() else {
                return enoent(format!("no known path to inode {}", cur.0));
            };
            parts.push(name);
            cur = parent;
            if parts.len() > 4096 {
                return Err(errno(libc::ELOOP));
            }
        }
        parts.reverse();
        Ok(parts)
    }

    /// Whether `name`, which the live directory `parent` lacks, shows a
    /// version (or `;deleted`) to `caller`: then no new entry may take the
    /// name (a create there opens the read-only version), a rename's
    /// included.
    pub(in crate::vfs) fn names_a_version(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
    ) -> bool {
        if !self.is_past_name(parent, name) || self.hidden_from(caller) {
            return false;
        }
        let sep = self.cfg.views.sep.as_slice();
        let bytes = name.as_bytes();
        let Some(cut) = bytes.windows(sep.len()).rposition(|w| w == sep) else {
            return false;
        };
        let (base, suffix) = (&bytes[..cut], &bytes[cut + sep.len()..]);
        base.is_empty() || self.past_version(parent, base, suffix).is_ok()
    }

    fn lookup_version(&self, parent: InodeNo, base: &[u8], suffix: &[u8]) -> Result<Entry> {
        let (at, node) = self.past_version(parent, base, suffix)?;
        // The name's meaning moves as versions are added, and a real file
        // created with the name must win at once: never cached.
        let e = self.node_at(at, node)?;
        Ok(Entry {
            entry_ttl: Some(Duration::ZERO),
            ..e
        })
    }

    /// The instant and node a version name's `base` and `suffix` show.
    fn past_version(&self, parent: InodeNo, base: &[u8], suffix: &[u8]) -> Result<(Seq, Node)> {
        let mut path = self.live_path(parent)?;
        path.push(base.to_vec());
        self.record_shown(&self.node(parent)?, base);
        self.settle_capture();
        let text = std::str::from_utf8(suffix).map_err(|_| errno(libc::ENOENT))?;
        let number = text.strip_prefix('-').unwrap_or(text);
        let (at, node) = if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) {
            let n: i64 = text.parse().map_err(|_| errno(libc::ENOENT))?;
            let node = self.with_past(|p| p.nth_version(&path, n).map_err(past_err))?;
            let Node::Hist { seq, .. } = &node else {
                return Err(VfsError::WrongKind);
            };
            (*seq, node)
        } else if suffix.starts_with(b"@") {
            let Some((at, _)) = parse_instant(suffix) else {
                return enoent(format!("'{text}' is not a version or an instant"));
            };
            self.with_past(|p| {
                let (seq, _) = p.resolve_at(&at).map_err(past_err)?;
                // A version name follows the file: where the path named
                // nothing then, the file it names now, where it was then.
                let mut node = p.resolve(&path, seq).map_err(past_err)?;
                if node.is_none() {
                    let (now, _) = p.resolve_at(&At::Now).map_err(past_err)?;
                    if let Some(then) = p.follow(&path, now, seq).map_err(past_err)? {
                        node = p.resolve(&then, seq).map_err(past_err)?;
                    }
                }
                match node {
                    Some(node) => Ok((seq, node)),
                    None => enoent(format!(
                        "{} did not exist at #{seq}",
                        past::show_path(&path)
                    )),
                }
            })?
        } else {
            return enoent(format!("'{text}' is not a version or an instant"));
        };
        Ok((at, node))
    }

    fn lookup_deleted_dir(&self, parent: InodeNo) -> Result<Entry> {
        let dir = self.node(parent)?;
        if !dir.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let ino = InodeNo(VIEW_BIT | (DELETED_SLOT << OBJ_BITS) | (parent.0 & OBJ_MASK));
        // Its attributes follow the live directory and what is deleted
        // (computed once: listing the deleted entries reads history).
        let st = self.deleted_dir_stat(parent, ino)?;
        self.hold_view(ino, || {
            Ok((
                What::Deleted {
                    dir: parent.object(),
                },
                st,
            ))
        })?;
        Ok(entry(st, Duration::ZERO))
    }

    pub(super) fn deleted_dir_stat(&self, dir: InodeNo, ino: InodeNo) -> Result<Stat> {
        let live = sys::fstat(self.node(dir)?.fd())?;
        let mut st = live;
        st.st_ino = ino.0;
        st.st_mode = libc::S_IFDIR | (live.st_mode & 0o555);
        let deleted = self.deleted_entries(dir.object())?;
        st.st_nlink = dir_nlink(deleted.iter().map(|(_, _, n, _)| n.mode() & libc::S_IFMT));
        Ok(st)
    }

    /// Lookup inside a view directory.
    pub(in crate::vfs) fn view_lookup(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
    ) -> Result<Entry> {
        if self.hidden_from(caller) {
            return enoent("history is hidden from non-root users (audit)");
        }
        let node = self.view(parent)?;
        match &node.what {
            What::Top => self.lookup_instant(name.as_bytes()),
            What::Deleted { dir } => self.lookup_deleted(caller, *dir, name.as_bytes()),
            What::At { .. } => {
                if node.st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    return Err(errno(libc::ENOTDIR));
                }
                // Before the name is looked for: a closed directory
                // answers EACCES whether the name exists or not.
                let ttl = self.view_search(caller, &node)?;
                Ok(kept_at_most(self.lookup_at(&node, name)?, ttl))
            }
        }
    }

    /// `name` in the view directory `node`, whoever asks (the caller's
    /// check is [`Vfs::view_search`]).
    pub(super) fn lookup_at(&self, node: &ViewNode, name: &OsStr) -> Result<Entry> {
        match &node.what {
            What::At { at, obj, state } => {
                if node.st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    return Err(errno(libc::ENOTDIR));
                }
                self.fill_live_dir(state)?;
                let recorded = self.past_dir(*at, *obj, state)?.is_some();
                let cur = self.dir_cur(*obj, state, recorded)?;
                let found = self.with_past(|p| {
                    let Some(next) = p
                        .step(cur, name.as_bytes(), *at, *obj == ROOT)
                        .map_err(past_err)?
                    else {
                        return Ok(None);
                    };
                    p.finish(next, *at).map_err(past_err)
                })?;
                match found {
                    Some(n) => self.node_at(*at, n),
                    None => Err(errno(libc::ENOENT)),
                }
            }
            _ => Err(errno(libc::ENOTDIR)),
        }
    }

    /// A live directory of a clone is filled before history is asked
    /// what it holds: until then history has no entries for it (a lookup
    /// in a fresh clone's directory through `.history/@now/` found
    /// nothing until a listing had filled it).
    pub(super) fn fill_live_dir(&self, state: &State) -> Result<()> {
        if let (State::Live { inode }, true) = (state, self.clones_on()) {
            self.fill_if_unfilled(&self.inodes.node_of(inode.clone())?)?;
        }
        Ok(())
    }

    /// Where the entries of view directory `obj` at `at` come from: with
    /// `Some`, its recorded state, where `state` must not be read as it
    /// is; with `None`, `state`. A union directory history has no
    /// version of is recorded first (its copies merge: the top one's
    /// entries are not all of them); one history recorded is compared
    /// with the live one first where a branch change may have changed it
    /// unseen ([`Vfs::confirm_for_past`]).
    pub(super) fn past_dir(&self, at: Seq, obj: ObjectId, state: &State) -> Result<Option<Node>> {
        match state {
            State::Hist { .. } => {
                self.confirm_for_past(at, obj);
                Ok(None)
            }
            State::Live { .. } if self.union().is_some() => {
                if let Err(e) = self.record_listing(obj) {
                    // The top copy's entries are still better than none.
                    tracing::warn!("history view: directory {obj} left unrecorded: {e}");
                    return Ok(None);
                }
                let node = self.with_past(|p| p.finish(Cur::Hist(obj), at).map_err(past_err))?;
                Ok(node.filter(|n| matches!(n, Node::Hist { .. })))
            }
            State::Live { .. } => Ok(None),
        }
    }

    /// [`Vfs::cur_of`], or `recorded`'s when it is given.
    pub(super) fn dir_cur(&self, obj: ObjectId, state: &State, recorded: bool) -> Result<Cur> {
        match recorded {
            true => Ok(Cur::Hist(obj)),
            false => self.cur_of(obj, state),
        }
    }

    pub(super) fn cur_of(&self, obj: ObjectId, state: &State) -> Result<Cur> {
        Ok(match state {
            State::Hist { .. } => Cur::Hist(obj),
            State::Live { inode } => {
                let (fd, st) = self.live_path_fd(inode)?;
                Cur::Live {
                    obj: Some(obj),
                    fd,
                    st,
                }
            }
        })
    }

    /// A fresh O_PATH descriptor of a live inode, with its attributes now.
    pub(super) fn live_path_fd(&self, inode: &Inode) -> Result<(OwnedFd, Stat)> {
        let fd = sys::reopen(self.inodes.fd(inode)?.as_fd(), libc::O_PATH)?;
        let st = sys::fstat(fd.as_fd())?;
        Ok((fd, st))
    }

    pub(super) fn lookup_instant(&self, name: &[u8]) -> Result<Entry> {
        let Some((at, fixed)) = parse_instant(name) else {
            return enoent(format!(
                "'{}' is not an instant (@TIME, @-10m, @TAG or @SEQ)",
                past::name_str(name)
            ));
        };
        if !fixed {
            self.settle_capture();
        }
        let node = self.with_past(|p| {
            let (seq, _) = p.resolve_at(&at).map_err(past_err)?;
            let node = p.resolve(&[], seq).map_err(past_err)?;
            Ok((seq, node))
        })?;
        let (seq, Some(node)) = node else {
            return enoent("the root did not exist");
        };
        let e = self.node_at(seq, node)?;
        Ok(Entry {
            entry_ttl: Some(if fixed { IMMUTABLE_TTL } else { Duration::ZERO }),
            ..e
        })
    }

    /// What was deleted in the live directory `dir` that `caller` may
    /// learn of, with how long the kernel may keep each entry. A name is
    /// shown only to a caller who could list `dir` just before its
    /// removal (as `log -r` shows its rows): a file made and deleted in a
    /// directory private then stays unknown after the directory is
    /// opened. The "now" half is the kernel's: `;deleted` shows the live
    /// directory's permissions.
    pub(super) fn deleted_shown(
        &self,
        caller: &Caller,
        dir: ObjectId,
    ) -> Result<Vec<Gone<Duration>>> {
        let entries = self.deleted_entries(dir)?;
        let who = Who::new(caller.uid, caller.gid, caller.pid);
        self.with_past(|p| {
            let mut out = Vec::with_capacity(entries.len());
            for (name, at, node, removed) in entries {
                let ttl = self.deleted_ttl(p, dir, removed)?;
                let shown = caller.uid == 0
                    || !ttl.is_zero()
                    || p.listable_then(Whom::One(&who), dir, removed.prev())
                        .map_err(past_err)?;
                if shown {
                    out.push((name, at, node, ttl));
                }
            }
            Ok(out)
        })
    }

    /// What was deleted in the live directory `dir`: each name's last
    /// object, as it was just before its removal began, and the change
    /// that removed it.
    pub(super) fn deleted_entries(&self, dir: ObjectId) -> Result<Vec<Gone<Seq>>> {
        let live = self.node(dir.into())?;
        self.settle_capture();
        self.with_past(|p| {
            let Some(((_, _), (last, _))) = p.history.bounds().map_err(|e| past_err(e.into()))?
            else {
                return Ok(Vec::new());
            };
            // In a union the name is present as the merged lookup finds
            // it: the upper copy may hold only its whiteout (which a stat
            // there found, so the name was never listed as deleted), and
            // a name only a lower copy holds is not deleted.
            let present = |n: &[u8]| match self.union() {
                Some(_) => self
                    .lookup_exists(&live, OsStr::from_bytes(n))
                    .unwrap_or(true),
                None => sys::cstr(OsStr::from_bytes(n))
                    .and_then(|c| sys::fstatat(live.fd(), &c))
                    .is_ok(),
            };
            let mut out = Vec::new();
            for d in p.deleted_in(dir, last, &present, false).map_err(past_err)? {
                let at = p.before_removal(&d).map_err(past_err)?;
                if let Some(node) = p.finish(Cur::Hist(d.obj), at).map_err(past_err)? {
                    out.push((d.name, at, node, d.seq));
                }
            }
            Ok(out)
        })
    }

    fn lookup_deleted(&self, caller: &Caller, dir: ObjectId, name: &[u8]) -> Result<Entry> {
        for (n, at, node, ttl) in self.deleted_shown(caller, dir)? {
            if n == name {
                let e = self.node_at(at, node)?;
                return Ok(Entry {
                    entry_ttl: Some(ttl),
                    ..e
                });
            }
        }
        Err(errno(libc::ENOENT))
    }
}
