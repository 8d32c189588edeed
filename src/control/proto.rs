//! The control protocol's messages, shared by the daemon and every client
//! (the CLI, benchmarks, tests): a typed `Request`, a typed reply per
//! request, and a typed error frame. The JSON they serialize to is also
//! what the CLI prints for `--json` (docs/CLI.md), so a field renamed here
//! is a change of the documented schema.
//!
//! Names are bytes. JSON strings cannot hold every byte string, so a name
//! or path is sent as text (lossy, for display) and, when it is not UTF-8,
//! also as `KEY_raw`: the exact bytes as an array of numbers. Readers that
//! act on a name use [`bytes_or_text`], never the text alone.

use serde::{Deserialize, Serialize};

pub use crate::capture::retention::CleanReport;
pub use crate::history::gc::GcReport;
pub use crate::history::prune::PruneOutcome;
pub use crate::history::spec::At;
pub use crate::history::{ObjectId, Seq};

/// Bumped whenever a message changes shape: a client and a daemon of
/// different versions refuse each other instead of misreading.
/// `bench/clones` speaks it too (`CONTROL_PROTOCOL`): bump it there.
pub const PROTOCOL: u32 = 12;

/// A path inside the mount, as name components from its root.
pub type Components = Vec<Vec<u8>>;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Tags,
    Tag {
        name: String,
        at: At,
    },
    Untag {
        name: String,
    },
    /// The sequence number and time an instant means.
    Resolve {
        at: At,
    },
    Stat {
        path: Components,
        at: At,
    },
    List {
        path: Components,
        at: At,
        deleted: bool,
    },
    /// PATH and everything under it at an instant, in one answer, with
    /// what a tree operation needs to bring it back exactly (object ids,
    /// xattr values, names as bytes).
    Tree {
        path: Components,
        at: At,
        /// PATH alone, without its entries (the directories on the way
        /// to an object undeleted from a removed tree).
        #[serde(default)]
        shallow: bool,
    },
    Read {
        path: Components,
        at: At,
        version: Option<i64>,
    },
    /// Where the file or directory at `path` at instant `at` was at
    /// instant `to`: its own path then, or that of the nearest of its
    /// directories that existed then (history follows renames).
    Follow {
        path: Components,
        at: At,
        to: At,
    },
    Log {
        path: Components,
        since: Option<At>,
        until: Option<At>,
        recursive: bool,
    },
    /// Start recording the whole tree (eager baseline) in the background.
    Ingest,
    /// Make every change made through the mount so far durable.
    Sync,
    Fsck {
        repair: bool,
    },
    /// Free unreferenced chunks and compact packs (root only). Progress
    /// comes as data frames, one `PHASE DONE TOTAL` line each.
    Gc {
        dry_run: bool,
    },
    /// One retention pass under the policy now; `now_ns` (root only)
    /// evaluates it as of another instant.
    Clean {
        now_ns: Option<i64>,
        dry_run: bool,
    },
    /// Remove versions of PATH (everything ever under it, for a
    /// directory) beyond `keep`. Non-root users: only their own files,
    /// never past the policy's minimums or protection window.
    Prune {
        path: Components,
        keep: crate::policy::Retention,
        dry_run: bool,
    },
    /// Remove the objects once at PATH (and under it) and all their
    /// history (root only; they must no longer exist live).
    Purge {
        path: Components,
        dry_run: bool,
    },
    /// Which policy rules apply to PATH and why.
    PolicyExplain {
        path: Components,
        user: Option<String>,
        process: Option<String>,
    },
    /// Load the policy files again (root only); on error the old policy
    /// stays in force.
    PolicyReload,
    /// The audit log: prunes, purges, collections, policy reloads.
    Audit,
    /// A union's branches, top first, with their modes.
    Branches,
    /// Make a union's branch (a position, 0 = top, or its path)
    /// read-write or read-only while mounted (root only).
    BranchMode {
        branch: String,
        writable: bool,
        force: bool,
    },
    /// Insert a directory (an absolute path) into a union while mounted,
    /// at `position` (0 = top; none: the top), read-write or read-only
    /// (root only).
    BranchAdd {
        path: String,
        position: Option<u32>,
        writable: bool,
    },
    /// Take a branch (a position or its path) out of a union while
    /// mounted (root only).
    BranchRemove {
        branch: String,
        force: bool,
    },
    /// Freeze the union's upper branch and put a fresh read-write one on
    /// top (root only); `name` names the frozen branch.
    Snapshot {
        name: Option<String>,
        force: bool,
    },
    /// Fold frozen branches into the oldest of them (root only): those
    /// frozen since snapshot `upto` into its branch, or all of them.
    Snapmerge {
        upto: Option<String>,
    },
    /// Serve sandbox `id` (a new one when none, owned by the caller): a
    /// private read-write branch over the mount's branches, mounted where
    /// only root reaches it (its owner or root).
    SandboxStart {
        id: Option<u32>,
    },
    /// Put served sandbox `id` over the mount point in the caller's own
    /// mount namespace, which lives in a user namespace of the caller's
    /// (`sys::private_user_namespace`): how an unprivileged owner enters
    /// it (its owner or root).
    SandboxEnter {
        id: u32,
    },
    /// The mount's sandboxes.
    Sandboxes,
    /// Throw sandbox `id` away, its changes with it (its owner or root).
    SandboxDiscard {
        id: u32,
    },
    /// Apply sandbox `id`'s changes to the mount and end it, unless they
    /// conflict with changes made on the mount since it was made (then
    /// nothing is applied, unless `force`) (its owner or root).
    SandboxCommit {
        id: u32,
        force: bool,
    },
    /// Makes `dst` (a new name in the mount) a writable copy of `src` as
    /// of `at`, sharing everything until it changes.
    Clone {
        src: Components,
        dst: Components,
        at: At,
    },
    /// Names `path` as of `at` template `name`.
    TemplateCreate {
        name: String,
        path: Components,
        at: At,
    },
    /// Clones template `name` to `dst` (as `Clone` does).
    TemplateInstantiate {
        name: String,
        dst: Components,
    },
    /// Lists the templates.
    Templates,
    /// Forgets template `name` (its maker or root); its clones stay.
    TemplateDelete {
        name: String,
    },
    /// Each clone's space: what it shares with its base, what it holds.
    Clones,
}

impl Request {
    /// Whether it reads or changes a union's branches (not history).
    pub fn is_branch_request(&self) -> bool {
        matches!(
            self,
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
                | Request::SandboxCommit { .. }
        )
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Envelope {
    pub protocol: u32,
    pub request: Request,
}

/// The `E` frame: why a request failed, as an errno (what the failure
/// is) and one line for a person.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorReply {
    pub errno: i32,
    pub message: String,
}

/// The text of `bytes` for display, and the bytes themselves when the
/// text cannot hold them.
pub fn split_bytes(bytes: &[u8]) -> (String, Option<Vec<u8>>) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (s.to_string(), None),
        Err(_) => (
            String::from_utf8_lossy(bytes).into_owned(),
            Some(bytes.to_vec()),
        ),
    }
}

/// The exact bytes of a name sent as `text` and `raw`.
pub fn bytes_or_text(text: &str, raw: Option<&[u8]>) -> Vec<u8> {
    raw.map_or_else(|| text.as_bytes().to_vec(), <[u8]>::to_vec)
}

/// A path as `/a/b`, and its bytes when they are not UTF-8.
pub fn path_text(p: &[Vec<u8>]) -> (String, Option<Vec<u8>>) {
    if p.is_empty() {
        return ("/".into(), None);
    }
    let mut bytes = Vec::new();
    for c in p {
        bytes.push(b'/');
        bytes.extend_from_slice(c);
    }
    split_bytes(&bytes)
}

/// What an instant means: `Resolve`'s reply, and the `at` of reports.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Instant {
    pub seq: Seq,
    pub time_ns: i64,
    pub time: String,
}

/// An extended attribute with its value, as `Tree` sends it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct XattrValue {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_raw: Option<Vec<u8>>,
    /// The value in lowercase hex.
    pub hex: String,
}

/// A node: `Stat`'s and `Read`'s reply, an entry of `List` and `Tree`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Absent only for a live object never seen by history.
    pub obj: Option<ObjectId>,
    /// "history" (a recorded version) or "live" (unchanged since).
    pub source: String,
    pub seq: Option<Seq>,
    pub cause: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<i64>,
    pub kind: String,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u64,
    pub rdev: u64,
    pub mtime_ns: i64,
    pub atime_ns: i64,
    pub target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_raw: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xattrs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unrecorded: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<bool>,
    /// The entry's name, in a listing or a tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_raw: Option<Vec<u8>>,
    /// `Tree` only: the attributes' values the peer may have back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xattr_values: Option<Vec<XattrValue>>,
    /// `Tree` only, for a directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<Vec<NodeInfo>>,
}

impl NodeInfo {
    pub fn set_name(&mut self, bytes: &[u8]) {
        let (text, raw) = split_bytes(bytes);
        self.name = Some(text);
        self.name_raw = raw;
    }

    /// The entry's name as bytes.
    pub fn name_bytes(&self) -> Vec<u8> {
        bytes_or_text(self.name.as_deref().unwrap_or(""), self.name_raw.as_deref())
    }

    pub fn set_target(&mut self, bytes: &[u8]) {
        let (text, raw) = split_bytes(bytes);
        self.target = Some(text);
        self.target_raw = raw;
    }

    /// A symlink's target as bytes.
    pub fn target_bytes(&self) -> Option<Vec<u8>> {
        self.target
            .as_deref()
            .map(|t| bytes_or_text(t, self.target_raw.as_deref()))
    }

    pub fn is_lost(&self) -> bool {
        self.lost == Some(true)
    }

    pub fn is_unrecorded(&self) -> bool {
        self.unrecorded == Some(true)
    }
}

/// A name of a directory's entry deleted before an instant.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeletedEntry {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_raw: Option<Vec<u8>>,
    pub obj: ObjectId,
    pub deleted_seq: Seq,
    pub deleted_time_ns: Option<i64>,
    pub kind: String,
    pub size: Option<u64>,
    /// The instant whose state holds the entry (just before its removal).
    pub restore_seq: Seq,
}

impl DeletedEntry {
    pub fn name_bytes(&self) -> Vec<u8> {
        bytes_or_text(&self.name, self.name_raw.as_deref())
    }
}

/// `List`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Listing {
    pub seq: Seq,
    pub time_ns: i64,
    pub entries: Vec<NodeInfo>,
    pub deleted: Vec<DeletedEntry>,
}

/// `Tree`'s reply: the root node, each directory with its `entries`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TreeReply {
    pub seq: Seq,
    pub time_ns: i64,
    pub root: NodeInfo,
}

/// `Follow`'s reply: the path then, if anything of it existed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FollowReply {
    pub path: Option<Components>,
}

/// One version as `log` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VersionRow {
    pub obj: ObjectId,
    pub seq: Seq,
    pub time_ns: i64,
    pub cause: String,
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub process: String,
    pub owner: u32,
    pub gone: bool,
    /// Marked lost by `fsck --repair`: recorded, but its bytes are gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
    /// `log` of one path: the number `cat --version` takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_raw: Option<Vec<u8>>,
    /// Recorded before the object got this path: the path it had then.
    #[serde(default, rename = "as", skip_serializing_if = "Option::is_none")]
    pub as_path: Option<String>,
    #[serde(default, rename = "as_raw", skip_serializing_if = "Option::is_none")]
    pub as_path_raw: Option<Vec<u8>>,
}

/// One object that was at a path, for a span of history.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Incarnation {
    pub obj: ObjectId,
    pub from_seq: Seq,
    pub until_seq: Option<Seq>,
}

/// `Log`'s reply for one path.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LogReply {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_raw: Option<Vec<u8>>,
    pub incarnations: Vec<Incarnation>,
    pub versions: Vec<VersionRow>,
}

/// `Log`'s reply for a tree (`recursive`): every row names its path.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LogTreeReply {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_raw: Option<Vec<u8>>,
    pub versions: Vec<VersionRow>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SeqTime {
    pub seq: Seq,
    pub time_ns: i64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChainHead {
    pub seq: Seq,
    pub hash: String,
}

/// The eager baseline's progress.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IngestStatus {
    pub running: bool,
    pub done: bool,
    /// Every file that predates the first mount has been recorded.
    pub complete: bool,
    pub dirs: u64,
    pub files: u64,
    pub bytes: u64,
    pub errors: u64,
}

/// `Status`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatusReply {
    pub store: String,
    pub poisoned: Option<String>,
    pub unrecorded: u64,
    pub store_bytes: u64,
    pub store_used_bytes: u64,
    pub index_bytes: u64,
    pub index_used_bytes: u64,
    pub pack_bytes: u64,
    pub versions: u64,
    pub changes: u64,
    pub chunks: u64,
    pub chunk_bytes: u64,
    pub stored_bytes: u64,
    pub logical_bytes: u64,
    pub dedup_ratio: f64,
    pub compression_ratio: f64,
    pub tags: u64,
    pub chain_head: Option<ChainHead>,
    pub ingest: Option<IngestStatus>,
    pub first: Option<SeqTime>,
    pub last: Option<SeqTime>,
    /// A union mount's branches (`None`: one branch, or not mounted).
    pub union: Option<UnionStatus>,
    /// FUSE requests the mount has served, by kind (`None`: not mounted).
    pub requests: Option<Vec<RequestCount>>,
    /// How requests reach the daemon: `io_uring` or `/dev/fuse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// The mount keeps no history (`-o plain`): the store's figures are
    /// zero, and only the mount's own (branches, requests, transport)
    /// are given.
    #[serde(default)]
    pub plain: bool,
}

/// How many requests of one kind (the kernel's name: `lookup`) a mount
/// has served since it started.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RequestCount {
    pub kind: String,
    pub count: u64,
}

/// A union mount's policies and branches, top first.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct UnionStatus {
    pub create: String,
    pub delete: String,
    /// The namespace of the overlay marks: `trusted` or `user`
    /// (`-o userxattr`).
    #[serde(default)]
    pub xattrs: String,
    pub branches: Vec<BranchStatus>,
}

/// One branch: its file system's usage (statvfs) and whether creates go
/// there now.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BranchStatus {
    pub path: String,
    /// `rw` or `ro`.
    pub mode: String,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub creates: bool,
}

/// `Branches`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BranchList {
    pub branches: Vec<BranchRow>,
}

/// One branch of a union as `branch list` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BranchRow {
    /// 0 = top (highest precedence).
    pub position: u32,
    /// The persistent id its objects' inode numbers are keyed by.
    pub id: u32,
    pub path: String,
    /// `rw` or `ro`.
    pub mode: String,
    /// Copy-ups (and `create=top`'s creates) go here.
    pub upper: bool,
    /// The name `chronofs snapshot` gave it when it froze it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// `BranchMode`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BranchModeReply {
    pub branch: BranchRow,
    /// False: it had that mode already.
    pub changed: bool,
    /// Write handles `--force` revoked (they now fail with ESTALE).
    pub revoked: usize,
    /// How long the change took inside the daemon, in microseconds.
    pub elapsed_us: u64,
}

/// `Snapshot`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SnapshotReply {
    /// The frozen branch's name.
    pub name: String,
    /// Where what is written from now on goes.
    pub fresh: String,
    pub set: BranchSetReply,
}

/// One sandbox, as `SandboxStart`, `Sandboxes` and `SandboxDiscard`
/// report it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxRow {
    pub id: u32,
    /// When it was made (ns since the epoch).
    pub created_ns: u64,
    /// Served now: where its view is mounted (a directory only root
    /// reaches; `chronofs sandbox` binds it over the mount point in a
    /// private mount namespace). None: kept on disk, not served.
    pub mountpoint: Option<String>,
    /// Its private branch: what its processes changed.
    pub branch: String,
    /// The uid that made it: it and root may enter, commit or discard it.
    #[serde(default)]
    pub owner: u32,
}

/// `SandboxCommit`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SandboxCommitReply {
    pub sandbox: SandboxRow,
    /// False: conflicts stopped it, and nothing changed.
    pub applied: bool,
    /// Paths (from the mount's root) the sandbox changed and the mount
    /// changed too since the sandbox was made.
    pub conflicts: Vec<String>,
    /// Paths the commit changed (or would have).
    pub changes: u64,
    /// Objects moved into the mount's branch (a whole directory counts
    /// with its contents).
    pub moved: u64,
    pub merged_dirs: u64,
    /// Removals applied.
    pub removed: u64,
    pub elapsed_us: u64,
}

/// `Sandboxes`' reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxRow>,
}

/// `Snapmerge`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SnapmergeReply {
    /// The snapshots whose frozen branches were folded away, newest first.
    pub merged: Vec<String>,
    /// The snapshot whose branch holds them now.
    pub into: String,
    /// Objects moved down, directories merged, whiteouts applied.
    pub moved: u64,
    pub merged_dirs: u64,
    pub whiteouts: u64,
    pub set: BranchSetReply,
}

/// `BranchAdd`'s and `BranchRemove`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BranchSetReply {
    /// The branches now, top first.
    pub branches: Vec<BranchRow>,
    /// Handles into a removed branch `--force` revoked (now ESTALE).
    pub revoked: usize,
    /// How long the change took inside the daemon, in microseconds.
    pub elapsed_us: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TagInfo {
    pub name: String,
    pub seq: Seq,
    pub time_ns: Option<i64>,
}

/// `Clone`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CloneReply {
    /// The instant copied.
    pub seq: Seq,
    pub time_ns: i64,
    /// The tag that keeps that instant while the clone reads it.
    pub tag: String,
}

/// A template, as `TemplateCreate` and `Templates` show it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TemplateInfo {
    pub name: String,
    /// Its tree's path from the mount's root, as it was then.
    pub path: String,
    pub seq: Seq,
    pub time_ns: Option<i64>,
}

/// A clone's space (`Clones`): shared files read their base's bytes and
/// take no space; own files hold bytes of their own.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CloneSpace {
    pub shared_files: u64,
    pub shared_bytes: u64,
    pub own_files: u64,
    pub own_bytes: u64,
    pub unfilled_dirs: u64,
}

/// One clone, as `Clones` lists it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CloneRow {
    pub tag: String,
    /// Where it is now (`None`: its top was removed or history cannot
    /// say where it went).
    pub path: Option<String>,
    /// The instant it copies.
    pub seq: Seq,
    pub time_ns: Option<i64>,
    /// `None` where `path` is.
    pub space: Option<CloneSpace>,
}

/// `Clones`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClonesReply {
    pub clones: Vec<CloneRow>,
}

/// `Templates`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TemplatesReply {
    pub templates: Vec<TemplateInfo>,
}

/// `Tags`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TagsReply {
    pub tags: Vec<TagInfo>,
}

/// `Untag`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct UntagReply {
    pub name: String,
    pub deleted: bool,
}

/// A version that does not read, as fsck names it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Cost {
    pub path: String,
    /// Its number as `log` shows it, if its path still leads to it.
    pub version: Option<usize>,
    pub seq: Seq,
    pub time_ns: i64,
    pub time: String,
    pub obj: ObjectId,
    pub why: String,
}

/// What `fsck --repair` did.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct RepairReport {
    /// Problems found before repairing.
    pub found: Vec<String>,
    pub reindexed: u64,
    pub restored_chunks: u64,
    /// Versions that read again.
    pub restored: Vec<Cost>,
    /// Versions marked lost.
    pub lost: Vec<Cost>,
    pub removed_index_entries: u64,
}

/// What `fsck` found.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct FsckReport {
    pub versions: u64,
    pub manifests_checked: u64,
    pub chunks_checked: u64,
    pub bytes_checked: u64,
    /// What is wrong now, each unreadable version first (path, version,
    /// time), then the damage itself. Empty: the store is consistent.
    pub problems: Vec<String>,
    /// The versions that do not read now.
    pub unreadable: Vec<Cost>,
    /// Versions marked lost by a repair (not problems: they are known).
    pub lost_versions: u64,
    /// Changes the repair made (index entries re-pointed, chunks stored
    /// again, versions marked lost, damaged entries dropped).
    pub repaired: u64,
    pub repair: Option<RepairReport>,
    pub chained_changes: u64,
    pub unchained_changes: u64,
    pub chain_head_seq: Option<u64>,
    pub chain_head: Option<String>,
}

/// Versions a non-root prune asked for but the policy kept.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HeldBack {
    pub versions: u64,
    pub protect_secs: u64,
    pub why: Option<String>,
}

/// `Prune`'s reply: a retention pass's report, and what the policy held
/// back.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PruneReply {
    #[serde(flatten)]
    pub report: CleanReport,
    pub held_back: HeldBack,
}

/// `Purge`'s reply (the same figures in a dry run and a real run).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PurgeReply {
    pub dry_run: bool,
    pub objects: u64,
    pub versions: u64,
    pub kept_alive_elsewhere: u64,
    /// The collection a real purge runs at its end, which takes the
    /// purged bytes out of the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collected: Option<GcReport>,
}

/// `PolicyExplain`'s reply: the resolved policy (a document of the
/// policy layer, passed through whole), its explanation, and the path.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ExplainReply {
    #[serde(flatten)]
    pub resolved: serde_json::Map<String, serde_json::Value>,
    pub text: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_raw: Option<Vec<u8>>,
    pub exists: bool,
}

/// `PolicyReload`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReloadReply {
    pub rules: usize,
    pub warnings: Vec<String>,
}

/// One administrative act as the audit log holds it. `detail` differs
/// by action and is shown as it was recorded.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AuditRecord {
    #[serde(default)]
    pub time_ns: i64,
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub pid: u32,
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub detail: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_head: Option<ChainHead>,
}

/// `Audit`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AuditReply {
    pub records: Vec<AuditRecord>,
}

/// `Ingest`'s reply: the progress just after starting (none when there
/// is nothing to report).
pub type IngestReply = Option<IngestStatus>;

/// `Sync`'s reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SyncReply {
    pub synced: bool,
}

/// A request's result, as the service built it.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Answer {
    Ingest(IngestReply),
    Synced(SyncReply),
    Status(Box<StatusReply>),
    Tags(TagsReply),
    Tag(TagInfo),
    Clone(CloneReply),
    Untag(UntagReply),
    Template(TemplateInfo),
    Templates(TemplatesReply),
    Clones(ClonesReply),
    Instant(Instant),
    Node(Box<NodeInfo>),
    List(Listing),
    Tree(Box<TreeReply>),
    Follow(FollowReply),
    Log(LogReply),
    LogTree(LogTreeReply),
    Fsck(Box<FsckReport>),
    Gc(GcReport),
    Clean(CleanReport),
    Prune(PruneReply),
    Purge(PurgeReply),
    Explain(ExplainReply),
    Reload(ReloadReply),
    Audit(AuditReply),
    Branches(BranchList),
    BranchMode(BranchModeReply),
    BranchSet(BranchSetReply),
    Snapshot(SnapshotReply),
    Snapmerge(SnapmergeReply),
    SandboxCommit(SandboxCommitReply),
    Sandbox(SandboxRow),
    Sandboxes(SandboxList),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_are_not_utf8_travel_raw_and_come_back_exact() {
        for name in [&b"plain"[..], b"x\xffy", b"n\nl", b"\xe9", b""] {
            let mut n = NodeInfo::default();
            n.set_name(name);
            n.set_target(name);
            assert_eq!(n.name_raw.is_some(), std::str::from_utf8(name).is_err());
            let wire = serde_json::to_string(&n).unwrap();
            let back: NodeInfo = serde_json::from_str(&wire).unwrap();
            assert_eq!(back.name_bytes(), name, "{wire}");
            assert_eq!(back.target_bytes().unwrap(), name, "{wire}");
        }
    }

    #[test]
    fn paths_show_as_text_with_raw_bytes_when_needed() {
        assert_eq!(path_text(&[]), ("/".to_string(), None));
        assert_eq!(path_text(&[b"a".to_vec(), b"b".to_vec()]).0, "/a/b");
        let (text, raw) = path_text(&[b"d".to_vec(), b"\xff".to_vec()]);
        assert_eq!(text, "/d/\u{fffd}");
        assert_eq!(raw.as_deref(), Some(&b"/d/\xff"[..]));
        assert_eq!(bytes_or_text(&text, raw.as_deref()), b"/d/\xff");
    }

    #[test]
    fn optional_fields_stay_absent_and_keep_the_documented_keys() {
        // A live node: no time_ns, xattrs, unrecorded or lost; seq and cause
        // are present as null (docs/CLI.md, "A node").
        let live = NodeInfo {
            source: "live".into(),
            kind: "file".into(),
            ..Default::default()
        };
        let v = serde_json::to_value(&live).unwrap();
        for absent in [
            "time_ns",
            "xattrs",
            "unrecorded",
            "lost",
            "name",
            "name_raw",
        ] {
            assert!(v.get(absent).is_none(), "{absent} in {v}");
        }
        assert!(v["seq"].is_null() && v["cause"].is_null() && v["target"].is_null());
        // A row of `log`: `lost` only when true, `as` under its own name.
        let row = VersionRow {
            as_path: Some("/old".into()),
            ..Default::default()
        };
        let v = serde_json::to_value(&row).unwrap();
        assert!(v.get("lost").is_none());
        assert_eq!(v["as"], "/old");
    }

    #[test]
    fn a_prune_reply_is_the_report_with_held_back_beside_it() {
        let r = PruneReply {
            report: CleanReport {
                planned_versions: 3,
                ..Default::default()
            },
            held_back: HeldBack {
                versions: 2,
                protect_secs: 60,
                why: Some("kept".into()),
            },
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["planned_versions"], 3);
        assert_eq!(v["held_back"]["versions"], 2);
        let back: PruneReply = serde_json::from_value(v).unwrap();
        assert_eq!(back.report.planned_versions, 3);
        assert_eq!(back.held_back.why.as_deref(), Some("kept"));
    }

    #[test]
    fn an_answer_serializes_as_its_reply_alone() {
        let a = Answer::Tag(TagInfo {
            name: "t".into(),
            seq: Seq::new(4),
            time_ns: Some(5),
        });
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            serde_json::json!({"name": "t", "seq": 4, "time_ns": 5})
        );
        let e = ErrorReply {
            errno: libc::ENOENT,
            message: "gone".into(),
        };
        let wire = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<ErrorReply>(&wire).unwrap(), e);
    }
}
