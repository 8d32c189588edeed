//! The versioned data model: what one recorded version of an object holds,
//! and the record of one change (an "op") as journaled and indexed.

use serde::{Deserialize, Serialize};

use crate::store::{BackingKey, Hash};

/// A file's identity: the inode number chronofs shows for it, allocated
/// once and never reused, so it is stable across renames and shared by
/// hard links. Serialized as the bare number (records and `--json`
/// output predate the type).
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct ObjectId(u64);

impl ObjectId {
    pub const fn new(n: u64) -> ObjectId {
        ObjectId(n)
    }

    /// The number, for table keys, inode numbers and the wire.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl ObjectId {
    /// The big-endian key bytes (keys sort numerically).
    pub const fn to_be_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    pub const fn from_be_bytes(bytes: [u8; 8]) -> ObjectId {
        ObjectId(u64::from_be_bytes(bytes))
    }
}

impl From<u64> for ObjectId {
    fn from(n: u64) -> ObjectId {
        ObjectId(n)
    }
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The global order of changes: one number per recorded change (0 is
/// before the first). Serialized as the bare number.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Seq(u64);

impl Seq {
    /// Before every recorded change.
    pub const ZERO: Seq = Seq(0);
    /// After every recorded change (an open upper bound).
    pub const MAX: Seq = Seq(u64::MAX);

    pub const fn new(n: u64) -> Seq {
        Seq(n)
    }

    /// The number, for table keys and the wire.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The change after this one.
    pub const fn next(self) -> Seq {
        Seq(self.0.saturating_add(1))
    }

    /// The change before this one (ZERO stays ZERO).
    pub const fn prev(self) -> Seq {
        Seq(self.0.saturating_sub(1))
    }
}

impl Seq {
    /// The big-endian key bytes (keys sort numerically).
    pub const fn to_be_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    pub const fn from_be_bytes(bytes: [u8; 8]) -> Seq {
        Seq(u64::from_be_bytes(bytes))
    }
}

impl From<u64> for Seq {
    fn from(n: u64) -> Seq {
        Seq(n)
    }
}

impl std::fmt::Display for Seq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The mount root's object id (the kernel's root inode number).
pub const ROOT: ObjectId = ObjectId(1);

/// Why a version was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cause {
    /// The object's state when history first needed it: it existed before
    /// the first mount (or was never changed through it) and is about to
    /// change. A baseline is valid back to the object's first appearance.
    Baseline,
    /// Changed behind the mount's back (detected at the next lookup).
    External,
    Create,
    Mkdir,
    Mknod,
    Symlink,
    Link,
    /// An open→close write session.
    Write,
    /// An fsync of a file held open.
    Fsync,
    /// The capture interval elapsed while a file was held open.
    Interval,
    Truncate,
    Chmod,
    Chown,
    Utimes,
    Xattr,
    Unlink,
    Rmdir,
    Rename,
    /// Replaced by a rename onto its name.
    Overwritten,
    Restore,
    Revert,
    Tag,
}

impl Cause {
    pub fn as_str(&self) -> &'static str {
        match self {
            Cause::Baseline => "baseline",
            Cause::External => "external",
            Cause::Create => "create",
            Cause::Mkdir => "mkdir",
            Cause::Mknod => "mknod",
            Cause::Symlink => "symlink",
            Cause::Link => "link",
            Cause::Write => "write",
            Cause::Fsync => "fsync",
            Cause::Interval => "interval",
            Cause::Truncate => "truncate",
            Cause::Chmod => "chmod",
            Cause::Chown => "chown",
            Cause::Utimes => "utimes",
            Cause::Xattr => "xattr",
            Cause::Unlink => "unlink",
            Cause::Rmdir => "rmdir",
            Cause::Rename => "rename",
            Cause::Overwritten => "overwritten",
            Cause::Restore => "restore",
            Cause::Revert => "revert",
            Cause::Tag => "tag",
        }
    }
}

/// Who made a change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Who {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// The process name (`comm`) at the time, if it could be read.
    pub comm: String,
}

/// A timestamp: seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

/// An object's attributes at a version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attrs {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub rdev: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// The backing object's (st_dev, st_ino): a change of the inode, or of
    /// size, mtime or ctime, at the next lookup means a change behind the
    /// mount.
    pub backing_dev: u64,
    pub backing_ino: u64,
}

impl Attrs {
    /// Whether the backing object looks unchanged since these attributes
    /// were taken (ctime covers every metadata change, mtime every data
    /// change). Not the device number: a reboot may renumber the disk
    /// under an unchanged file (docs/ARCHITECTURE.md "Device numbers"),
    /// and another object with the same inode, size, mtime and ctime to
    /// the nanosecond (which no one can set) is not to be met.
    pub fn same_state(&self, other: &Attrs) -> bool {
        self.size == other.size
            && self.mtime == other.mtime
            && self.ctime == other.ctime
            && self.backing_ino == other.backing_ino
    }
}

/// What a version holds besides attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Content {
    /// A directory: its entries live in the versioned directory-entry table.
    Dir,
    /// A regular file: the hash of its manifest.
    File {
        manifest: Hash,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// Device nodes, FIFOs, sockets: attributes say everything.
    Special,
    /// A regular file whose bytes the policy says not to keep
    /// (`version = false`): its attributes and names are recorded, its
    /// content is not (store format 4).
    Unrecorded,
    /// A regular file whose recorded bytes were damaged in the store and
    /// could not be recovered: `fsck --repair` rewrote its `File` content
    /// to this, keeping the manifest's hash for the record but no longer
    /// referencing it (store format 5). Reading it fails with EIO.
    Lost {
        manifest: Hash,
    },
}

/// One recorded version of an object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    pub time_ns: i64,
    pub who: Who,
    pub cause: Cause,
    pub attrs: Attrs,
    pub content: Content,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The object lost its last name with this change (its incarnation
    /// ended); the version keeps its final state.
    pub gone: bool,
}

/// A piece of a file: `len` bytes that are either a stored chunk or a hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub len: u32,
    pub chunk: Option<Hash>,
}

/// A file's content as a list of extents in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub extents: Vec<Extent>,
}

impl Manifest {
    #[cfg(test)]
    pub fn size(&self) -> u64 {
        self.extents.iter().map(|e| u64::from(e.len)).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).unwrap_or_default()
    }

    /// Bytes held in chunks (not holes).
    pub fn data_bytes(&self) -> u64 {
        self.extents
            .iter()
            .filter(|e| e.chunk.is_some())
            .map(|e| u64::from(e.len))
            .sum()
    }

    pub fn decode(bytes: &[u8]) -> Option<Manifest> {
        postcard::from_bytes(bytes).ok()
    }
}

/// A directory entry change: `name` in `parent` now names `child`, or
/// nothing (`child == None`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dirent {
    pub parent: ObjectId,
    pub name: Vec<u8>,
    pub child: Option<ObjectId>,
}

/// An object id and the backing object it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub branch: u32,
    pub dev: u64,
    pub ino: u64,
    pub object: ObjectId,
}

impl Binding {
    pub fn key(&self) -> BackingKey {
        BackingKey {
            branch: self.branch,
            dev: self.dev,
            ino: self.ino,
        }
    }
}

/// One recorded change, as journaled and then applied to the index: all
/// of it becomes visible at once (a view never shows half of a rename).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Op {
    pub seq: Seq,
    pub time_ns: i64,
    pub versions: Vec<(ObjectId, Version)>,
    pub dirents: Vec<Dirent>,
    pub manifests: Vec<(Hash, Vec<u8>)>,
    /// Chunk locations (encoded) written for this op or before it.
    pub chunks: Vec<(Hash, Vec<u8>)>,
    pub bind: Vec<Binding>,
    pub unbind: Vec<Binding>,
    /// Tag name → sequence number, or removal.
    pub tags: Vec<(String, Option<Seq>)>,
    /// Entries recorded now that took effect at an earlier instant (keyed
    /// at that sequence number): names a union's branch change brought or
    /// took, found by the walk or a recheck after the change. Last, so
    /// that a format-1 record decodes with it empty.
    pub backdated: Vec<Backdated>,
}

/// A directory entry whose effect dates from `at`, an earlier change
/// than the op that records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backdated {
    pub dirent: Dirent,
    pub at: Seq,
}

/// The journal record format (first byte of each record). Format 1 had no
/// `backdated` field.
pub const OP_FORMAT: u8 = 2;
const OP_FORMAT_1: u8 = 1;

impl Op {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![OP_FORMAT];
        out.extend(postcard::to_allocvec(self).unwrap_or_default());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Op, String> {
        match bytes.split_first() {
            Some((&OP_FORMAT, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
            Some((&OP_FORMAT_1, rest)) => {
                // Format 2 only appended `backdated`: a format-1 record is
                // a format-2 one whose list is empty (postcard: length 0).
                let mut v2 = rest.to_vec();
                v2.push(0);
                postcard::from_bytes(&v2).map_err(|e| e.to_string())
            }
            Some((v, _)) => Err(format!("journal record of unknown format {v}")),
            None => Err("empty journal record".into()),
        }
    }
}

/// A version value in the index: format byte ‖ postcard.
pub const VERSION_FORMAT: u8 = 1;

pub fn encode_version(v: &Version) -> Vec<u8> {
    let mut out = vec![VERSION_FORMAT];
    out.extend(postcard::to_allocvec(v).unwrap_or_default());
    out
}

pub fn decode_version(bytes: &[u8]) -> Option<Version> {
    match bytes.split_first() {
        Some((&VERSION_FORMAT, rest)) => postcard::from_bytes(rest).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod newtypes {
    use super::*;

    /// The newtypes replaced bare numbers and arrays in journal records,
    /// version records and `--json` output: each must encode exactly as
    /// the value it wraps, or old stores and scripts break.
    #[test]
    fn encode_exactly_as_the_values_they_wrap() {
        let n = 300_000_000_007u64;
        assert_eq!(post(&ObjectId::new(n)), post(&n));
        assert_eq!(post(&Seq::new(n)), post(&n));
        let bytes = [7u8; 32];
        assert_eq!(post(&Hash::from_bytes(bytes)), post(&bytes));
        assert_eq!(serde_json::json!(Seq::new(n)), serde_json::json!(n));
        assert_eq!(serde_json::json!(ObjectId::new(n)), serde_json::json!(n));
        let back: (ObjectId, Seq) = postcard::from_bytes(&post(&(n, n))).unwrap();
        assert_eq!(back, (ObjectId::new(n), Seq::new(n)));
        assert_eq!(Seq::new(5).to_string(), "5");
        assert_eq!(Hash::from_bytes(bytes).to_string(), "07".repeat(32));
    }

    fn post<T: Serialize>(v: &T) -> Vec<u8> {
        postcard::to_allocvec(v).unwrap()
    }
}
