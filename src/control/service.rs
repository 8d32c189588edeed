//! Answers to control requests, over a history and the live tree.
//!
//! A path is resolved at an instant through recorded directory entries;
//! where history holds nothing (a directory or file never changed through
//! the mount), the live tree is its state then, reached by the object's
//! current path and checked to be the same object.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;

use super::proto::{
    self, path_text, Answer, ChainHead, Cost, DeletedEntry, FsckReport, Incarnation, IngestStatus,
    Instant, Listing, LogReply, LogTreeReply, NodeInfo, RepairReport, SeqTime, StatusReply,
    TagInfo, TagsReply, UntagReply,
};
use super::spec::{self, At};
use super::{Components, Reply, Request};
use crate::history::access::{self, Who, Whom};
use crate::history::content;
use crate::history::past::{
    kind_name, name_str, show_path, Error as PastError, LiveIds, Node, Past,
};

use crate::history::verify::{HeadFiles, Unreadable};
use crate::history::{Content, Draft, History, HistoryError, ObjectId, Seq, Version, ROOT};
use crate::sys::{self, Peer};

pub use crate::history::past::{Error, Result};

/// What the service needs from whoever serves the tree: a running mount,
/// or a store opened directly.
pub trait Host: LiveIds {
    /// Only root may see history (`-o audit`).
    fn audit(&self) -> bool {
        false
    }
    /// The link count the mount shows for a live object with several
    /// names, where its backing file's counts a link index's entry too.
    fn shown_links(&self, _obj: ObjectId, _fd: BorrowedFd<'_>) -> Option<u32> {
        None
    }
    /// Before the versions of the file at `path` are asked for: history
    /// gets a version of what it shows now if it has none (a clone's
    /// file, one an inserted branch brought).
    fn record_shown(&self, _path: &Components) {}
    /// Waits for versions still being built.
    fn settle(&self) {}
    /// [`Host::settle`] for a clone of `path`: what lies elsewhere need
    /// not be waited for.
    fn settle_within(&self, _path: &super::proto::Components) {
        self.settle();
    }
    /// Makes every change made through the mount durable
    /// (`Vfs::sync_branches`).
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    /// Where clones read history at or under `path` (branch-relative
    /// paths of their marked objects): what a purge of it would break.
    fn clones_reading(
        &self,
        _path: &super::proto::Components,
        _objects: &HashSet<ObjectId>,
    ) -> Result<Vec<Vec<u8>>> {
        Ok(Vec::new())
    }
    /// A live regular file's bytes as the mount shows them, where its
    /// backing file holds only part of them (a clone's file reads the rest
    /// from its base); `None`: the backing file holds them all.
    fn live_content(
        &self,
        _obj: Option<ObjectId>,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Option<Box<dyn crate::capture::Readable>>> {
        Ok(None)
    }
    /// History rewrote versions of these objects behind the capture.
    fn history_rewritten(&self, _objs: &[ObjectId]) {}
    /// Tag `name` was made: a view of it may be cached as absent.
    fn tag_made(&self, _name: &str) {}
    /// Whether `path` goes through the mount's views of the past (the
    /// history directory, or a name holding the version separator): not a
    /// path history records.
    fn names_a_view(&self, _path: &Components) -> bool {
        false
    }
    /// Starts the eager baseline of the whole tree.
    fn start_ingest(&self) -> std::result::Result<(), String> {
        Err("nothing is mounted: mount the directory, then run `chronofs ingest` on it".into())
    }
    /// Progress of the eager baseline, if one ran.
    fn ingest_status(&self) -> Option<IngestStatus> {
        None
    }
    /// A union mount's branches.
    fn union_status(&self) -> Option<super::proto::UnionStatus> {
        None
    }
    /// The FUSE requests a mount has served, by kind.
    fn request_counts(&self) -> Option<Vec<super::proto::RequestCount>> {
        None
    }
    /// The transport FUSE requests travel on.
    fn transport(&self) -> Option<String> {
        None
    }
    /// A union mount's branches, top first.
    fn branches(&self) -> Result<Vec<super::proto::BranchRow>> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    /// Changes a union branch's mode (the caller checked the privilege).
    fn set_branch_mode(
        &self,
        _branch: &str,
        _writable: bool,
        _force: bool,
    ) -> Result<super::proto::BranchModeReply> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    /// Inserts a branch into a union (the caller checked the privilege).
    fn add_branch(
        &self,
        _path: &str,
        _position: Option<u32>,
        _writable: bool,
    ) -> Result<super::proto::BranchSetReply> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    /// Freezes a union's upper branch (the caller checked the privilege).
    fn snapshot(&self, _name: Option<&str>, _force: bool) -> Result<super::proto::SnapshotReply> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    /// Folds frozen branches together (the caller checked the privilege).
    fn snapmerge(&self, _upto: Option<&str>) -> Result<super::proto::SnapmergeReply> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    /// Serves sandbox `id`, or a new one owned by `peer` (refused unless
    /// `peer` owns `id` or is root).
    fn start_sandbox(&self, _id: Option<u32>, _peer: &Peer) -> Result<super::proto::SandboxRow> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    /// Binds served sandbox `id` over the mount point in `peer`'s own
    /// mount namespace (its owner or root).
    fn enter_sandbox(&self, _id: u32, _peer: &Peer) -> Result<super::proto::SandboxRow> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    fn sandboxes(&self) -> Result<Vec<super::proto::SandboxRow>> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    /// Throws sandbox `id` away (its owner or root).
    fn discard_sandbox(&self, _id: u32, _peer: &Peer) -> Result<super::proto::SandboxRow> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    /// Applies sandbox `id` to the mount (its owner or root).
    fn commit_sandbox(
        &self,
        _id: u32,
        _force: bool,
        _peer: &Peer,
    ) -> Result<super::proto::SandboxCommitReply> {
        Err(Error::Usage("nothing is mounted".into()))
    }
    /// Makes `dst` a clone of `src` as of `seq`, as `peer` (the caller
    /// checked that `peer` may read `src` then); returns the clone's tag.
    fn clone_tree(
        &self,
        _src: &Components,
        _seq: Seq,
        _dst: &Components,
        _peer: &Peer,
    ) -> Result<String> {
        Err(Error::Usage(
            "nothing is mounted: clones are made in a mount".into(),
        ))
    }
    /// The instants some clone's mark still reads (`None`: unknown, as
    /// with no mount).
    fn clone_instants_in_use(&self) -> Result<Option<HashSet<Seq>>> {
        Ok(None)
    }
    /// The space of the clone at `path`.
    fn clone_space(&self, _path: &Components) -> Result<super::proto::CloneSpace> {
        Err(Error::Usage(
            "nothing is mounted: a clone's space is read through its mount".into(),
        ))
    }
    /// Removes a union's branch (the caller checked the privilege).
    fn remove_branch(&self, _branch: &str, _force: bool) -> Result<super::proto::BranchSetReply> {
        Err(Error::Usage("nothing is mounted".into()))
    }
}

/// Answers control requests: a mount's `Service` over its history, or
/// `HostOnly` for a mount that keeps none.
pub trait Answerer: Send + Sync {
    fn answer(&self, req: &Request, peer: &Peer, reply: &mut dyn Reply) -> Result<Answer>;
}

/// The control service of a mount made without `allow_other`: the
/// kernel lets only root and the mounting user use the mount, and its
/// history must not show others what the mount refuses them.
pub struct OwnerOnly {
    pub inner: Arc<dyn Answerer>,
    /// The mounting user (the daemon's effective uid).
    pub owner: u32,
}

impl Answerer for OwnerOnly {
    fn answer(&self, req: &Request, peer: &Peer, reply: &mut dyn Reply) -> Result<Answer> {
        if peer.uid != 0 && peer.uid != self.owner {
            return Err(Error::Denied(
                "this mount serves only root and its owner (mounted with -o noallow_other)".into(),
            ));
        }
        self.inner.answer(req, peer, reply)
    }
}

impl Answerer for Service {
    fn answer(&self, req: &Request, peer: &Peer, reply: &mut dyn Reply) -> Result<Answer> {
        Service::answer(self, req, peer, reply)
    }
}

/// The control service of a mount without history (`-o plain`): its
/// branches, nothing else.
pub struct HostOnly(pub Box<dyn Host>);

impl Answerer for HostOnly {
    fn answer(&self, req: &Request, peer: &Peer, _reply: &mut dyn Reply) -> Result<Answer> {
        match req {
            r if r.is_branch_request() => branch_request(&*self.0, req, peer),
            Request::Status => Ok(Answer::Status(Box::new(StatusReply {
                plain: true,
                union: self.0.union_status(),
                requests: self.0.request_counts(),
                transport: self.0.transport(),
                ..StatusReply::default()
            }))),
            _ => Err(Error::Usage(
                "this mount keeps no history (mounted with -o plain)".into(),
            )),
        }
    }
}

fn branch_request(host: &dyn Host, req: &Request, peer: &Peer) -> Result<Answer> {
    // A sandbox's owner may use it; the host checks who owns it.
    let anyone = matches!(
        req,
        Request::Branches
            | Request::Sandboxes
            | Request::SandboxStart { .. }
            | Request::SandboxEnter { .. }
            | Request::SandboxDiscard { .. }
            | Request::SandboxCommit { .. }
    );
    if !anyone && peer.uid != 0 {
        return Err(Error::NotPermitted(
            "only root may change a union's branches".into(),
        ));
    }
    match req {
        Request::BranchMode {
            branch,
            writable,
            force,
        } => Ok(Answer::BranchMode(
            host.set_branch_mode(branch, *writable, *force)?,
        )),
        Request::BranchAdd {
            path,
            position,
            writable,
        } => Ok(Answer::BranchSet(
            host.add_branch(path, *position, *writable)?,
        )),
        Request::BranchRemove { branch, force } => {
            Ok(Answer::BranchSet(host.remove_branch(branch, *force)?))
        }
        Request::Snapshot { name, force } => {
            Ok(Answer::Snapshot(host.snapshot(name.as_deref(), *force)?))
        }
        Request::Snapmerge { upto } => Ok(Answer::Snapmerge(host.snapmerge(upto.as_deref())?)),
        Request::SandboxStart { id } => Ok(Answer::Sandbox(host.start_sandbox(*id, peer)?)),
        Request::SandboxEnter { id } => Ok(Answer::Sandbox(host.enter_sandbox(*id, peer)?)),
        Request::Sandboxes => Ok(Answer::Sandboxes(proto::SandboxList {
            sandboxes: host.sandboxes()?,
        })),
        Request::SandboxDiscard { id } => Ok(Answer::Sandbox(host.discard_sandbox(*id, peer)?)),
        Request::SandboxCommit { id, force } => Ok(Answer::SandboxCommit(
            host.commit_sandbox(*id, *force, peer)?,
        )),
        _ => Ok(Answer::Branches(proto::BranchList {
            branches: host.branches()?,
        })),
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
    pub(super) policy: super::maintain::PolicyHolder,
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
        policy: super::maintain::PolicyHolder,
    ) -> Service {
        Service {
            history,
            root,
            reserved,
            host,
            store_dir,
            policy,
        }
    }

    pub(super) fn root_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.root.as_fd()
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    pub(super) fn host(&self) -> &dyn Host {
        self.host.as_ref()
    }

    pub(super) fn past(&self) -> Past<'_> {
        Past {
            history: &self.history,
            root: self.root.as_fd(),
            reserved: self.reserved.as_deref(),
            live: self.host.as_ref(),
        }
    }

    pub fn resolve_at(&self, at: &At) -> Result<(Seq, i64)> {
        self.past().resolve_at(at)
    }

    fn node(&self, path: &[Vec<u8>], seq: Seq) -> Result<Node> {
        self.past().node(path, seq)
    }

    /// `chronofs clone`: SRC must be readable to the caller at the
    /// instant (what it may not read there it may not copy), and DST must
    /// not lie in SRC.
    pub(super) fn clone_path(
        &self,
        src: &Components,
        dst: &Components,
        at: &At,
        peer: &Peer,
    ) -> Result<super::proto::CloneReply> {
        if dst.is_empty() {
            return Err(Error::Usage(
                "DST must be a new name inside the mount".into(),
            ));
        }
        if dst.starts_with(src) {
            return Err(Error::Usage(format!(
                "{} lies inside {}: a clone cannot hold itself",
                show_path(dst),
                show_path(src)
            )));
        }
        self.host.settle_within(src);
        let (seq, time_ns) = self.resolve_at(at)?;
        let node = self.node(src, seq)?;
        self.past()
            .check(&who(peer), src, seq, &node, access::READ)?;
        let tag = self.host.clone_tree(src, seq, dst, peer)?;
        Ok(super::proto::CloneReply { seq, time_ns, tag })
    }

    pub fn answer(&self, req: &Request, peer: &Peer, reply: &mut dyn Reply) -> Result<Answer> {
        if peer.uid != 0 && self.host.audit() {
            return Err(Error::Denied(
                "this mount shows history to root only (-o audit)".into(),
            ));
        }
        // Only history queries wait for queued versions: under a steady
        // write load the capture is never idle, and a branch change waited
        // for seconds (tests/union_live_stress.rs).
        // A clone, and a template's instance (a clone), wait for their
        // source's versions only (`settle_within`).
        let clones = matches!(
            req,
            Request::Clone { .. } | Request::TemplateInstantiate { .. }
        );
        if !req.is_branch_request() && !clones {
            self.host.settle();
        }
        Ok(match req {
            Request::Ingest => {
                self.host.start_ingest().map_err(Error::Usage)?;
                Answer::Ingest(self.host.ingest_status())
            }
            Request::Sync => {
                self.host.sync()?;
                Answer::Synced(proto::SyncReply { synced: true })
            }
            Request::Status => Answer::Status(Box::new(self.status()?)),
            Request::Tags => Answer::Tags(self.tags()?),
            Request::Tag { name, at } => Answer::Tag(self.tag(name, at, peer)?),
            Request::Clone { src, dst, at } => Answer::Clone(self.clone_path(src, dst, at, peer)?),
            Request::Untag { name } => Answer::Untag(self.untag(name, peer)?),
            Request::TemplateCreate { name, path, at } => {
                Answer::Template(self.template_create(name, path, at, peer)?)
            }
            Request::TemplateInstantiate { name, dst } => {
                Answer::Clone(self.template_instantiate(name, dst, peer)?)
            }
            Request::Templates => Answer::Templates(self.templates()?),
            Request::Clones => Answer::Clones(self.clones(peer)?),
            Request::TemplateDelete { name } => Answer::Untag(self.template_delete(name, peer)?),
            Request::Resolve { at } => {
                let (seq, t) = self.resolve_at(at)?;
                Answer::Instant(Instant {
                    seq,
                    time_ns: t,
                    time: spec::iso(t),
                })
            }
            Request::Stat { path, at } => {
                let (seq, _) = self.resolve_at(at)?;
                let node = self.node(path, seq)?;
                // As stat(2): the way must be searchable (then and now).
                self.past().check(&who(peer), path, seq, &node, 0)?;
                Answer::Node(Box::new(self.describe(&node)))
            }
            Request::Follow { path, at, to } => {
                let (at, _) = self.resolve_at(at)?;
                let (to, _) = self.resolve_at(to)?;
                if let Some(node) = self.past().resolve(path, at)? {
                    self.past().check(&who(peer), path, at, &node, 0)?;
                }
                let then = self.past().follow(path, at, to)?;
                if let Some(then) = &then {
                    self.past().check_way(&who(peer), then, 0)?;
                }
                Answer::Follow(proto::FollowReply { path: then })
            }
            Request::List { path, at, deleted } => {
                Answer::List(self.list(path, at, *deleted, peer)?)
            }
            Request::Tree { path, at, shallow } => {
                Answer::Tree(Box::new(self.tree(path, at, *shallow, peer)?))
            }
            Request::Read { path, at, version } => {
                Answer::Node(Box::new(self.read(path, at, *version, peer, reply)?))
            }
            Request::Log {
                path,
                since,
                until,
                recursive,
            } => {
                let since = self.opt_seq(since.as_ref())?;
                let until = self.opt_seq(until.as_ref())?;
                self.past().check_way(&who(peer), path, 0)?;
                if !*recursive {
                    self.host.record_shown(path);
                }
                if *recursive {
                    Answer::LogTree(self.log_tree(path, since, until, peer)?)
                } else {
                    Answer::Log(self.log(path, since, until, peer)?)
                }
            }
            Request::Fsck { repair } => {
                if peer.uid != 0 && *repair {
                    return Err(Error::Denied("only root may repair a store".into()));
                }
                Answer::Fsck(Box::new(self.fsck(*repair, peer, &mut |_, _| {})?))
            }
            Request::Gc { dry_run } => Answer::Gc(self.gc(*dry_run, peer, reply)?),
            Request::Clean { now_ns, dry_run } => {
                Answer::Clean(self.clean(*now_ns, *dry_run, peer)?)
            }
            Request::Prune {
                path,
                keep,
                dry_run,
            } => Answer::Prune(self.prune(path, keep, *dry_run, peer)?),
            Request::Purge { path, dry_run } => Answer::Purge(self.purge(path, *dry_run, peer)?),
            Request::PolicyExplain {
                path,
                user,
                process,
            } => Answer::Explain(self.explain(path, user.as_deref(), process.as_deref())?),
            Request::PolicyReload => Answer::Reload(self.reload(peer)?),
            Request::Audit => Answer::Audit(self.audit_log(peer)?),
            Request::Branches
            | Request::BranchMode { .. }
            | Request::BranchAdd { .. }
            | Request::BranchRemove { .. }
            | Request::Snapshot { .. }
            | Request::Snapmerge { .. }
            | Request::SandboxStart { .. }
            | Request::SandboxEnter { .. }
            | Request::Sandboxes
            | Request::SandboxDiscard { .. }
            | Request::SandboxCommit { .. } => branch_request(&*self.host, req, peer)?,
        })
    }

    pub(super) fn describe(&self, node: &Node) -> NodeInfo {
        match node {
            Node::Hist { obj, seq, v } => {
                let a = &v.attrs;
                let mut n = NodeInfo {
                    obj: Some(*obj),
                    source: "history".into(),
                    seq: Some(*seq),
                    cause: Some(v.cause.as_str().into()),
                    time_ns: Some(v.time_ns),
                    kind: kind_name(a.mode).into(),
                    mode: a.mode & 0o7777,
                    uid: a.uid,
                    gid: a.gid,
                    size: a.size,
                    nlink: u64::from(a.nlink),
                    rdev: a.rdev,
                    mtime_ns: ns(a.mtime.sec, i64::from(a.mtime.nsec)),
                    atime_ns: ns(a.atime.sec, i64::from(a.atime.nsec)),
                    xattrs: Some(v.xattrs.iter().map(|(k, _)| name_str(k)).collect()),
                    unrecorded: Some(v.content == Content::Unrecorded),
                    lost: Some(matches!(v.content, Content::Lost { .. })),
                    ..Default::default()
                };
                if let Content::Symlink { target } = &v.content {
                    n.set_target(target);
                }
                n
            }
            Node::Live { obj, fd, st } => {
                let linked = st.st_mode & libc::S_IFMT != libc::S_IFDIR && st.st_nlink > 1;
                let shown_links = obj
                    .filter(|_| linked)
                    .and_then(|o| self.host.shown_links(o, fd.as_fd()));
                let mut n = NodeInfo {
                    obj: *obj,
                    source: "live".into(),
                    kind: kind_name(st.st_mode).into(),
                    mode: st.st_mode & 0o7777,
                    uid: st.st_uid,
                    gid: st.st_gid,
                    size: u64::try_from(st.st_size).unwrap_or(0),
                    nlink: shown_links.map_or(st.st_nlink, u64::from),
                    rdev: st.st_rdev,
                    mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
                    atime_ns: ns(st.st_atime, st.st_atime_nsec),
                    ..Default::default()
                };
                if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    if let Ok(t) = sys::readlink_fd(fd.as_fd()) {
                        n.set_target(&t);
                    }
                }
                n
            }
        }
    }

    fn list(&self, path: &Components, at: &At, deleted: bool, peer: &Peer) -> Result<Listing> {
        let (seq, time) = self.resolve_at(at)?;
        let dir = self.node(path, seq)?;
        if dir.mode() & libc::S_IFMT == libc::S_IFDIR {
            // Entries come with their attributes: `ls -l`, which needs
            // search on the directory besides read.
            self.past()
                .check(&who(peer), path, seq, &dir, access::READ | access::SEARCH)?;
        }
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
        let past = self.past();
        for name in past.names(&dir, seq, path.is_empty())? {
            let mut child = path.clone();
            child.push(name.clone());
            if let Some(node) = past.resolve(&child, seq)? {
                let mut d = self.describe(&node);
                d.set_name(&name);
                present.insert(name);
                entries.push(d);
            }
        }
        let mut gone = Vec::new();
        if deleted {
            if let Some(d) = hist_dir {
                let who = who(peer);
                for g in past.deleted_in(d, seq, &|n| present.contains(n), true)? {
                    // A name is the caller's to learn only where they could
                    // list the directory just before its removal (as `log
                    // -r` shows its rows; the directory at `seq` and now
                    // was checked above).
                    if who.uid != 0 && !past.listable_then(Whom::One(&who), d, g.seq.prev())? {
                        continue;
                    }
                    let before = g.before.as_ref().map(|(_, v)| v);
                    let (name, name_raw) = proto::split_bytes(&g.name);
                    gone.push(DeletedEntry {
                        name,
                        name_raw,
                        obj: g.obj,
                        deleted_seq: g.seq,
                        deleted_time_ns: self.history.time_of_seq(g.seq)?,
                        kind: before.map_or("unknown", |v| kind_name(v.attrs.mode)).into(),
                        size: before.map(|v| v.attrs.size),
                        restore_seq: past.before_removal(&g)?,
                    });
                }
            }
        }
        Ok(Listing {
            seq,
            time_ns: time,
            entries,
            deleted: gone,
        })
    }

    fn read(
        &self,
        path: &Components,
        at: &At,
        version: Option<i64>,
        peer: &Peer,
        reply: &mut dyn Reply,
    ) -> Result<NodeInfo> {
        let (node, seq) = match version {
            Some(n) => {
                self.past().check_way(&who(peer), path, 0)?;
                self.host.record_shown(path);
                let node = self.past().nth_version(path, n)?;
                let seq = match &node {
                    Node::Hist { seq, .. } => *seq,
                    Node::Live { .. } => self.resolve_at(at)?.0,
                };
                (node, seq)
            }
            None => {
                let (seq, _) = self.resolve_at(at)?;
                (self.node(path, seq)?, seq)
            }
        };
        self.past()
            .check(&who(peer), path, seq, &node, access::READ)?;
        match &node {
            Node::Hist { v, seq, .. } => match &v.content {
                Content::File { manifest } => {
                    let m = self.history.manifest(manifest)?;
                    content::write_to(self.history.chunks(), &m, &mut ReplyWriter(reply))?;
                }
                Content::Symlink { target } => reply.data(target)?,
                Content::Unrecorded => {
                    return Err(Error::NotFound(format!(
                        "{} at #{seq}: its content was not kept (not versioned by policy)",
                        show_path(path)
                    )))
                }
                Content::Lost { .. } => {
                    return Err(HistoryError::Lost(format!("{} at #{seq}", show_path(path))).into())
                }
                _ => {
                    return Err(Error::Usage(format!(
                        "{} is a {} at #{seq}, not a file",
                        show_path(path),
                        kind_name(v.attrs.mode)
                    )))
                }
            },
            Node::Live { obj, fd, st } => {
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(Error::Usage(format!("{} is not a file", show_path(path))));
                }
                let file: Box<dyn crate::capture::Readable> =
                    match self.host.live_content(*obj, fd.as_fd())? {
                        Some(content) => content,
                        None => Box::new(sys::reopen(fd.as_fd(), libc::O_RDONLY)?),
                    };
                let mut buf = vec![0u8; 1 << 20];
                let mut off = 0u64;
                loop {
                    let n = file.read_at(&mut buf, off)?;
                    if n == 0 {
                        break;
                    }
                    reply.data(&buf[..n])?;
                    off += n as u64;
                }
                // The live file stands for its state then only while it is
                // unchanged: a write during the read made a mix of both,
                // and one between the lookup and its stat recorded the
                // state then (a baseline) before the bytes streamed.
                let recorded_since = match obj {
                    Some(o) => self.history.object_at(*o, seq)?.is_some(),
                    None => false,
                };
                let after = crate::capture::attrs_of(&sys::fstat(fd.as_fd())?);
                if recorded_since || !crate::capture::attrs_of(st).same_state(&after) {
                    return Err(Error::Busy(format!(
                        "{} changed while it was read; run the command again",
                        show_path(path)
                    )));
                }
            }
        }
        Ok(self.describe(&node))
    }

    fn opt_seq(&self, at: Option<&At>) -> Result<Option<Seq>> {
        at.map(|a| self.resolve_at(a).map(|(s, _)| s)).transpose()
    }

    /// Whether `who` could search the way to `obj`'s version `(s, gone)`
    /// then: a `log` row tells its size and times, which stat(2) gave only
    /// to who could (the way now is checked once, for the whole log).
    fn way_then_open(&self, who: &Who, obj: ObjectId, s: Seq, gone: bool) -> Result<bool> {
        Ok(who.uid == 0 || self.past().way_then_permits(who, obj, (s, gone))?)
    }

    fn log(
        &self,
        path: &Components,
        since: Option<Seq>,
        until: Option<Seq>,
        peer: &Peer,
    ) -> Result<LogReply> {
        let who = who(peer);
        let past = self.past();
        let incarnations = past.incarnations(path)?;
        if incarnations.is_empty() {
            return Err(self.never_existed(path));
        }
        // Numbers count every version, whatever the range shown.
        let all = past.path_versions(&incarnations, None, None)?;
        // An object back at the path unchanged lists a version again.
        let number: HashMap<(ObjectId, Seq, usize), usize> = all
            .iter()
            .enumerate()
            .map(|(i, r)| ((r.0, r.1, r.3), i + 1))
            .collect();
        let mut rows = Vec::with_capacity(all.len());
        for r in all {
            if since.is_none_or(|a| r.1 >= a)
                && until.is_none_or(|b| r.1 <= b)
                && self.way_then_open(&who, r.0, r.1, r.2.gone)?
            {
                rows.push(r);
            }
        }
        let (shown, shown_raw) = path_text(path);
        let mut out = Vec::with_capacity(rows.len());
        for (obj, s, v, inc) in &rows {
            let mut row = version_row(*obj, *s, v);
            row.n = number.get(&(*obj, *s, *inc)).copied();
            row.incarnation = Some(inc + 1);
            row.path = Some(shown.clone());
            row.path_raw = shown_raw.clone();
            // Recorded before the object got this path (history follows
            // renames): the name it had then.
            if incarnations.get(*inc).is_some_and(|i| *s < i.1) {
                let then = match self.history.path_at(*obj, *s)? {
                    Some(p) => Some(p),
                    None => self.history.path_at(*obj, s.prev())?,
                };
                if let Some(p) = then.filter(|p| p != path) {
                    let (text, raw) = path_text(&p);
                    row.as_path = Some(text);
                    row.as_path_raw = raw;
                }
            }
            out.push(row);
        }
        let incarnations = incarnations
            .iter()
            .map(|(o, a, b)| Incarnation {
                obj: *o,
                from_seq: *a,
                until_seq: *b,
            })
            .collect();
        Ok(LogReply {
            path: shown,
            path_raw: shown_raw,
            incarnations,
            versions: out,
        })
    }

    /// Every object ever at `path` or under it, with the path it was
    /// reached by (each object once).
    pub(super) fn tree_objects(&self, path: &Components) -> Result<Vec<(ObjectId, Components)>> {
        let roots: Vec<ObjectId> = if path.is_empty() {
            vec![ROOT]
        } else {
            self.past()
                .incarnations(path)?
                .into_iter()
                .map(|(o, _, _)| o)
                .collect()
        };
        if roots.is_empty() {
            return Err(self.never_existed(path));
        }
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut queue: Vec<(ObjectId, Vec<Vec<u8>>)> =
            roots.into_iter().map(|o| (o, path.clone())).collect();
        while let Some((obj, p)) = queue.pop() {
            if !seen.insert(obj) {
                continue;
            }
            let mut children: Vec<(Vec<u8>, ObjectId)> = self
                .history
                .names_ever(obj)?
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
            out.push((obj, p));
        }
        Ok(out)
    }

    fn log_tree(
        &self,
        path: &Components,
        since: Option<Seq>,
        until: Option<Seq>,
        peer: &Peer,
    ) -> Result<LogTreeReply> {
        let (lo, hi) = (since.unwrap_or(Seq::ZERO), until.unwrap_or(Seq::MAX));
        // Rows stay without their paths until sorted: sorting tens of
        // thousands of rows that each own a path cost most of a `log -r`.
        let mut paths: Vec<(String, Option<Vec<u8>>)> = Vec::new();
        let mut rows: Vec<(Seq, usize, ObjectId, Version)> = Vec::new();
        // Names below a directory the caller may not list (as it was last,
        // and now) are not theirs to learn: `ls -R` would stop there too.
        let who = who(peer);
        let mut listable: HashMap<Components, bool> = HashMap::new();
        for (obj, p) in self.tree_objects(path)? {
            if who.uid != 0 && p.len() > path.len() {
                let parent = p[..p.len() - 1].to_vec();
                let may = match listable.get(&parent) {
                    Some(may) => *may,
                    None => {
                        let may = match self.past().check_way(&who, &parent, access::READ) {
                            Ok(()) => true,
                            Err(PastError::Denied(_)) => false,
                            Err(e) => return Err(e),
                        };
                        listable.insert(parent, may);
                        may
                    }
                };
                if !may {
                    continue;
                }
            }
            let path_idx = paths.len();
            paths.push(path_text(&p));
            for (s, v) in self.history.versions(obj, lo, hi)? {
                if self.way_then_open(&who, obj, s, v.gone)? {
                    rows.push((s, path_idx, obj, v));
                }
            }
        }
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| paths[a.1].0.cmp(&paths[b.1].0)));
        let (shown, shown_raw) = path_text(path);
        Ok(LogTreeReply {
            path: shown,
            path_raw: shown_raw,
            versions: rows
                .iter()
                .map(|(s, path_idx, obj, v)| {
                    let mut row = version_row(*obj, *s, v);
                    let (text, raw) = &paths[*path_idx];
                    row.path = Some(text.clone());
                    row.path_raw = raw.clone();
                    row
                })
                .collect(),
        })
    }

    fn status(&self) -> Result<StatusReply> {
        let c = self.history.counts()?;
        let bounds = self.history.bounds()?;
        let (logical, manifest_bytes) = self.history.logical_bytes()?;
        let store_bytes = dir_size(&self.store_dir);
        let packs = self
            .history
            .chunks()
            .packs_size()
            .map_err(HistoryError::from)?;
        let index_file =
            std::fs::metadata(self.store_dir.join(crate::store::INDEX_FILE)).map_or(0, |m| m.len());
        let index_used = self.history.index_used_bytes()?;
        Ok(StatusReply {
            store: self.store_dir.display().to_string(),
            poisoned: self.history.poisoned(),
            unrecorded: self.history.unrecorded(),
            store_bytes,
            // What the store holds, counting the index by its pages in use.
            store_used_bytes: store_bytes.saturating_sub(index_file) + index_used,
            index_bytes: index_file,
            index_used_bytes: index_used,
            pack_bytes: packs,
            versions: c.versions,
            changes: c.changes,
            chunks: c.chunks,
            chunk_bytes: c.chunk_raw_bytes,
            stored_bytes: c.chunk_stored_bytes,
            logical_bytes: logical,
            dedup_ratio: ratio(logical, c.chunk_raw_bytes.saturating_sub(manifest_bytes)),
            compression_ratio: ratio(c.chunk_raw_bytes, c.chunk_stored_bytes),
            tags: c.tags,
            chain_head: crate::history::chain::head(self.history.db())?.map(|(seq, hash)| {
                ChainHead {
                    seq: Seq::new(seq),
                    hash,
                }
            }),
            union: self.host.union_status(),
            requests: self.host.request_counts(),
            transport: self.host.transport(),
            plain: false,
            ingest: self.host.ingest_status(),
            first: bounds.map(|((seq, time_ns), _)| SeqTime { seq, time_ns }),
            last: bounds.map(|(_, (seq, time_ns))| SeqTime { seq, time_ns }),
        })
    }

    fn tags(&self) -> Result<TagsReply> {
        let mut tags = Vec::new();
        for (name, seq) in self.history.tags()? {
            let time_ns = self.history.time_of_seq(seq)?;
            tags.push(TagInfo { name, seq, time_ns });
        }
        Ok(TagsReply { tags })
    }

    /// `path` has no history: a view's path (`.history/@T/f`, `f;1`) is
    /// said to be one, since it names what a live path showed.
    fn never_existed(&self, path: &Components) -> Error {
        if self.host.names_a_view(path) {
            return Error::NotFound(format!(
                "{} is a view of the past, not a path history records: name the live path, with --at or --version",
                show_path(path)
            ));
        }
        Error::NotFound(format!(
            "{} never existed in recorded history",
            show_path(path)
        ))
    }

    fn tag(&self, name: &str, at: &At, peer: &Peer) -> Result<TagInfo> {
        // It names `.history/@NAME`, one file name (NAME_MAX bytes).
        const MAX_TAG: usize = 254;
        if name.len() > MAX_TAG {
            return Err(Error::Usage(format!(
                "a tag name is at most {MAX_TAG} bytes ({} given): it names .history/@NAME",
                name.len()
            )));
        }
        let allowed = |c: char| c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | ':');
        if name.is_empty() || !name.chars().all(allowed) {
            return Err(Error::Usage(format!(
                "'{name}' cannot be a tag name: use letters, digits and . _ - + :"
            )));
        }
        // A leading sign reads as an offset where a time is asked for
        // (`clean --now +30d`), and a leading '-' as an option.
        if name.bytes().all(|b| b.is_ascii_digit())
            || name.starts_with(['+', '-'])
            || spec::parse(name) != Ok(At::Tag(name.to_string()))
        {
            return Err(Error::Usage(format!(
                "'{name}' cannot be a tag name: it would read as a time or sequence number"
            )));
        }
        if let Some(what) = ["clone", "template"]
            .into_iter()
            .find(|p| name.strip_prefix(p).is_some_and(|r| r.starts_with(':')))
        {
            return Err(Error::Usage(format!(
                "'{name}': tags named {what}:... are kept by chronofs for its {what}s"
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
        self.history.set_tag_owner(name, Some(peer.uid))?;
        self.host.tag_made(name);
        Ok(TagInfo {
            name: name.to_string(),
            seq,
            time_ns: Some(t),
        })
    }

    fn untag(&self, name: &str, peer: &Peer) -> Result<UntagReply> {
        let Some(seq) = self.history.tag(name)? else {
            return Err(Error::NotFound(format!("no tag named '{name}'")));
        };
        self.clone_tag_unused(name, seq)?;
        let owner = self.history.tag_owner(name)?;
        if peer.uid != 0 && owner != Some(peer.uid) {
            return Err(Error::Denied(format!(
                "tag '{name}' was made by {}: only its maker or root may remove it",
                owner.map_or_else(|| "root".to_string(), |u| format!("uid {u}"))
            )));
        }
        self.history.commit(Draft {
            tags: vec![(name.to_string(), None)],
            ..Default::default()
        })?;
        self.history.set_tag_owner(name, None)?;
        Ok(UntagReply {
            name: name.to_string(),
            deleted: true,
        })
    }
}

/// The identity a peer's reads are checked for.
pub(super) fn who(peer: &Peer) -> Who {
    match &peer.groups {
        Some(groups) => Who::with_groups(peer.uid, peer.gid, groups.to_vec()),
        None => Who::new(peer.uid, peer.gid, peer.pid),
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

/// Nanoseconds since the epoch, saturating (a timestamp so far off
/// that it overflows is shown as the end of the range, not wrapped).
fn ns(sec: i64, nsec: i64) -> i64 {
    sec.saturating_mul(1_000_000_000).saturating_add(nsec)
}

/// One version as `log` shows it (without the fields of a path).
fn version_row(obj: ObjectId, seq: Seq, v: &Version) -> proto::VersionRow {
    proto::VersionRow {
        obj,
        seq,
        time_ns: v.time_ns,
        cause: v.cause.as_str().into(),
        kind: kind_name(v.attrs.mode).into(),
        size: v.attrs.size,
        mode: v.attrs.mode & 0o7777,
        uid: v.who.uid,
        gid: v.who.gid,
        pid: v.who.pid,
        process: v.who.comm.clone(),
        owner: v.attrs.uid,
        gone: v.gone,
        lost: matches!(v.content, Content::Lost { .. }),
        ..Default::default()
    }
}

impl Service {
    /// Names an unreadable version: its path then, its number in that
    /// path's log, its time.
    fn cost(
        &self,
        u: &Unreadable,
        numbers: &mut HashMap<Components, Vec<(ObjectId, Seq)>>,
    ) -> Cost {
        let path = u.path.clone().unwrap_or_default();
        let version = if u.path.is_some() {
            let rows = numbers.entry(path.clone()).or_insert_with(|| {
                let past = self.past();
                past.incarnations(&path)
                    .and_then(|inc| past.path_versions(&inc, None, None))
                    .map(|rows| rows.into_iter().map(|r| (r.0, r.1)).collect())
                    .unwrap_or_default()
            });
            rows.iter()
                .position(|r| *r == (u.obj, u.seq))
                .map(|i| i + 1)
        } else {
            None
        };
        Cost {
            path: match &u.path {
                Some(p) => show_path(p),
                None => format!("(object {}, no recorded name)", u.obj),
            },
            version,
            seq: u.seq,
            time_ns: u.time_ns,
            // As `log` shows times.
            time: spec::show(u.time_ns),
            obj: u.obj,
            why: u.why.clone(),
        }
    }

    /// Opens the live file of `obj` for reading, if it has one: the object
    /// itself, or else whatever regular file is at its last recorded path
    /// (a source tree copied or restored from a backup has new inode
    /// numbers). Either is only a candidate: every chunk taken from it is
    /// checked against its hash.
    fn head_file(&self, obj: ObjectId) -> Option<OwnedFd> {
        let past = self.past();
        let fd = match past.live_object(obj).ok()? {
            Some((fd, _)) => fd,
            None => {
                let path = self.history.path_at(obj, Seq::MAX).ok()??;
                let mut fd = sys::reopen(self.root_fd(), libc::O_PATH).ok()?;
                for (i, comp) in path.iter().enumerate() {
                    match past.live_step(fd.as_fd(), i == 0, comp).ok()? {
                        Some(crate::history::past::Cur::Live { fd: next, .. }) => fd = next,
                        _ => return None,
                    }
                }
                fd
            }
        };
        let st = sys::fstat(fd.as_fd()).ok()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        sys::reopen(fd.as_fd(), libc::O_RDONLY).ok()
    }

    /// Verifies every version's references and every chunk's hash; with
    /// `repair`, repairs first and records what it did in the audit log.
    /// `progress(done, total)` is called as chunks are checked.
    pub fn fsck(
        &self,
        repair: bool,
        peer: &Peer,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<FsckReport> {
        let head = |obj| self.head_file(obj);
        if repair {
            // Versions still being built commit first: repair then sees
            // every version that may reference a damaged chunk.
            self.host.settle();
        }
        let r = self
            .history
            .verify(repair.then_some(&head as HeadFiles), progress)?;
        if let Some(done) = r.repair.as_ref().filter(|d| !d.lost.is_empty()) {
            let objs: Vec<ObjectId> = done.lost.iter().map(|u| u.obj).collect();
            self.host.history_rewritten(&objs);
        }
        let mut numbers = HashMap::new();
        let unreadable: Vec<Cost> = r
            .unreadable
            .iter()
            .map(|u| self.cost(u, &mut numbers))
            .collect();
        let mut problems: Vec<String> = unreadable.iter().map(cost_line).collect();
        problems.extend(r.problems);
        let mut report = FsckReport {
            versions: r.versions,
            manifests_checked: r.manifests,
            chunks_checked: r.chunks,
            bytes_checked: r.bytes,
            problems,
            unreadable,
            lost_versions: r.lost_versions,
            chained_changes: r.chained_ops,
            unchained_changes: r.unchained_ops,
            chain_head_seq: r.chain_head.as_ref().map(|(s, _)| *s),
            chain_head: r.chain_head.map(|(_, h)| h),
            ..Default::default()
        };
        if let Some(done) = r.repair {
            let costs = |list: &[Unreadable], numbers: &mut HashMap<_, _>| -> Vec<Cost> {
                list.iter().map(|u| self.cost(u, numbers)).collect()
            };
            let mut found: Vec<String> = costs(&done.found_unreadable, &mut numbers)
                .iter()
                .map(cost_line)
                .collect();
            found.extend(done.found_problems.iter().cloned());
            let rep = RepairReport {
                found,
                reindexed: done.reindexed,
                restored_chunks: done.restored_chunks,
                restored: costs(&done.restored_versions, &mut numbers),
                lost: costs(&done.lost, &mut numbers),
                removed_index_entries: done.removed_entries,
            };
            report.repaired = rep.reindexed
                + rep.restored_chunks
                + rep.lost.len() as u64
                + rep.removed_index_entries;
            if done.changed() {
                let detail = json!({
                    "reindexed": rep.reindexed,
                    "restored_chunks": rep.restored_chunks,
                    "restored_versions": rep.restored.iter().map(cost_brief).collect::<Vec<_>>(),
                    "lost_versions": rep.lost.iter().map(cost_brief).collect::<Vec<_>>(),
                    "removed_index_entries": rep.removed_index_entries,
                    "problems_left": report.problems.len(),
                });
                self.history
                    .audit(&self.audit_record(peer, "fsck-repair", detail))?;
            }
            report.repair = Some(rep);
        }
        Ok(report)
    }
}

/// A problem line naming what an unreadable version costs.
fn cost_line(c: &Cost) -> String {
    format!(
        "{}: {} (#{}, {}) cannot be read: {}",
        c.path,
        c.version
            .map_or_else(|| "a version".to_string(), |n| format!("version {n}")),
        c.seq,
        c.time,
        c.why
    )
}

fn cost_brief(c: &Cost) -> serde_json::Value {
    json!({"path": c.path, "version": c.version, "seq": c.seq, "time_ns": c.time_ns})
}
