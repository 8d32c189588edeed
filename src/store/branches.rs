//! Persistent branch ids: the `branches` table (id → canonical path, root
//! (dev, ino), key device, state) and the matching of a mount's branch
//! list to it.
//!
//! Inode-map keys and the union's hard-link index name a branch by this
//! id, not by its position in the mount's list, so a branch inserted above
//! others, or two branches swapped, renumbers nothing
//! (docs/ARCHITECTURE.md "Live unions", "Branch identity without
//! position"). An id is never given to another branch: `counters`
//! `next_branch_id` only grows.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use redb::{ReadableTable, TableDefinition, TableHandle};

use super::{index_error, Store, StoreError};

const BRANCHES: TableDefinition<u32, &[u8]> = TableDefinition::new("branches");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const NEXT_BRANCH_ID: &str = "next_branch_id";
/// First byte of a `branches` value. Format 1 had no key device (its
/// keys carry the root's device number as recorded).
const RECORD_FORMAT: u8 = 2;
const RECORD_FORMAT_1: u8 = 1;

/// Where a branch is: its canonical path and its root directory's
/// (st_dev, st_ino) and birth time (nanoseconds; `None` where the file
/// system keeps none, or the record predates it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchRoot {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub born: Option<i64>,
}

impl BranchRoot {
    /// The root `fd` (a directory at `path`) as it is now.
    pub fn of(path: PathBuf, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<BranchRoot> {
        let st = crate::sys::fstat(fd)?;
        Ok(BranchRoot {
            path,
            dev: st.st_dev,
            ino: st.st_ino,
            born: crate::sys::birth_time(fd)?,
        })
    }

    /// Whether `other` is this same directory, perhaps under another
    /// device number: same inode, and same birth time where both have one
    /// (every file system's root directory may be inode 2).
    fn same_directory(&self, other: &BranchRoot) -> bool {
        self.ino == other.ino
            && (self.born.is_none() || other.born.is_none() || self.born == other.born)
    }
}

/// `born` as a record stores it.
const NO_BIRTH_TIME: i64 = i64::MIN;

/// Whether a known branch is part of the mount's set. Only `Active`
/// exists today; `branch remove` (issue 17) will mark ids retired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BranchState {
    Active,
}

/// One row of the `branches` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchRecord {
    pub id: u32,
    pub root: BranchRoot,
    /// The device number keys of this branch's objects carry for its
    /// root's file system: the one it had when first recorded, kept when a
    /// remount finds the same root under another device number (a reboot
    /// can renumber a disk), so inode numbers, hard-link index entries and
    /// history stay the object's (docs/ARCHITECTURE.md "Device numbers").
    pub key_dev: u64,
    pub state: BranchState,
}

/// How the vfs names a branch's objects: its persistent id, and the
/// device number its keys carry for its root's file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BranchIdent {
    pub id: u32,
    pub key_dev: u64,
}

impl BranchRecord {
    fn encode(&self) -> Vec<u8> {
        let path = self.root.path.as_os_str().as_bytes();
        let mut v = Vec::with_capacity(34 + path.len());
        v.push(RECORD_FORMAT);
        v.push(match self.state {
            BranchState::Active => 0,
        });
        v.extend_from_slice(&self.root.dev.to_be_bytes());
        v.extend_from_slice(&self.root.ino.to_be_bytes());
        v.extend_from_slice(&self.key_dev.to_be_bytes());
        v.extend_from_slice(&self.root.born.unwrap_or(NO_BIRTH_TIME).to_be_bytes());
        v.extend_from_slice(path);
        v
    }

    fn decode(id: u32, v: &[u8]) -> Option<BranchRecord> {
        let fixed = match v.first() {
            Some(&RECORD_FORMAT) => 34,
            Some(&RECORD_FORMAT_1) => 18,
            _ => return None,
        };
        if v.len() < fixed || v[1] != 0 {
            return None;
        }
        let u64_at = |at: usize| Some(u64::from_be_bytes(v.get(at..at + 8)?.try_into().ok()?));
        let dev = u64_at(2)?;
        let (key_dev, born) = if fixed == 34 {
            let born = u64_at(26)? as i64;
            (u64_at(18)?, (born != NO_BIRTH_TIME).then_some(born))
        } else {
            (dev, None)
        };
        Some(BranchRecord {
            id,
            root: BranchRoot {
                path: PathBuf::from(OsStr::from_bytes(&v[fixed..])),
                dev,
                ino: u64_at(10)?,
                born,
            },
            key_dev,
            state: BranchState::Active,
        })
    }
}

/// What matching a branch list against the table decided.
#[derive(Debug, PartialEq, Eq)]
pub struct Matched {
    /// The id and key device of each wanted branch, in the list's order.
    pub idents: Vec<BranchIdent>,
    /// Rows to write: new branches, and known ones whose path or root moved.
    pub changed: Vec<BranchRecord>,
    /// The next free id after these.
    pub next: u32,
}

/// Gives each of `wanted` an id: the known branch with the same root
/// (dev, ino) — the directory itself, wherever it was moved — else the one
/// with the same canonical path (a directory replaced under its name, or a
/// file system whose device number changed: the same branch to the user),
/// else `next`, counting up. Each id goes to one branch of the list at most.
/// An empty table therefore gives position *i* id *i*, which is what the
/// inode-map keys of stores made before ids meant.
///
/// A known branch keeps its key device when its root is the same
/// directory (same inode and birth time) under another device number; a
/// directory
/// replaced under its name, or a new branch, is keyed by its own.
pub fn match_branches(known: &[BranchRecord], wanted: &[BranchRoot], mut next: u32) -> Matched {
    let mut ids: Vec<Option<&BranchRecord>> = vec![None; wanted.len()];
    let mut taken = std::collections::HashSet::new();
    let by_root = |w: &BranchRoot, r: &BranchRecord| r.root.dev == w.dev && r.root.ino == w.ino;
    let by_path = |w: &BranchRoot, r: &BranchRecord| r.root.path == w.path;
    for rule in [
        &by_root as &dyn Fn(&BranchRoot, &BranchRecord) -> bool,
        &by_path,
    ] {
        for (i, w) in wanted.iter().enumerate() {
            if ids[i].is_some() {
                continue;
            }
            if let Some(r) = known.iter().find(|r| !taken.contains(&r.id) && rule(w, r)) {
                taken.insert(r.id);
                ids[i] = Some(r);
            }
        }
    }
    let mut changed = Vec::new();
    let idents = ids
        .into_iter()
        .zip(wanted)
        .map(|(was, w)| {
            let (id, key_dev) = match was {
                Some(r) if r.root.same_directory(w) => (r.id, r.key_dev),
                Some(r) => (r.id, w.dev),
                None => {
                    next += 1;
                    (next - 1, w.dev)
                }
            };
            let row = BranchRecord {
                id,
                root: w.clone(),
                key_dev,
                state: BranchState::Active,
            };
            if !known.contains(&row) {
                changed.push(row);
            }
            BranchIdent { id, key_dev }
        })
        .collect();
    Matched {
        idents,
        changed,
        next,
    }
}

impl Store {
    /// Every branch this store has known.
    pub fn branches(&self) -> Result<Vec<BranchRecord>, StoreError> {
        read_branches(&self.registry)
    }

    /// The persistent id of each branch of a mount's list (top first),
    /// recording new branches and moved ones in one durable commit.
    pub fn branch_ids(&self, wanted: &[BranchRoot]) -> Result<Vec<u32>, StoreError> {
        Ok(self.branch_idents(wanted)?.iter().map(|b| b.id).collect())
    }

    /// [`Store::branch_ids`] with each branch's key device.
    pub fn branch_idents(&self, wanted: &[BranchRoot]) -> Result<Vec<BranchIdent>, StoreError> {
        assign_ids(&self.registry, wanted)
    }

    /// What a mount of `wanted` would name each branch, as the table is
    /// now (`None`: a branch it does not know); records nothing.
    pub fn known_idents(
        &self,
        wanted: &[BranchRoot],
    ) -> Result<Vec<Option<BranchIdent>>, StoreError> {
        let known = read_branches(&self.registry)?;
        let next = known.iter().map(|r| r.id + 1).max().unwrap_or(0);
        let m = match_branches(&known, wanted, next);
        Ok(m.idents
            .into_iter()
            .map(|b| Some(b).filter(|b| b.id < next))
            .collect())
    }

    /// The key device of the branch `root` is, as the table knows it now
    /// (its own device number if the table does not know it); records
    /// nothing.
    pub fn known_key_dev(&self, root: &BranchRoot) -> Result<u64, StoreError> {
        let known = self.known_idents(std::slice::from_ref(root))?;
        Ok(known
            .first()
            .copied()
            .flatten()
            .map_or(root.dev, |b| b.key_dev))
    }
}

/// `def` in a read transaction; `None` when no write ever made it (a
/// store from before the table).
fn read_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match txn.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(index_error(e)),
    }
}

fn read_branches(db: &super::Index) -> Result<Vec<BranchRecord>, StoreError> {
    let txn = db.begin_read().map_err(index_error)?;
    match read_table(&txn, BRANCHES)? {
        Some(table) => decode_branches(&table),
        None => Ok(Vec::new()),
    }
}

/// Every row of the `branches` table; a row that is not a branch record
/// is corruption.
fn decode_branches(
    table: &impl ReadableTable<u32, &'static [u8]>,
) -> Result<Vec<BranchRecord>, StoreError> {
    let mut out = Vec::new();
    for row in table.iter().map_err(index_error)? {
        let (k, v) = row.map_err(index_error)?;
        let id = k.value();
        out.push(BranchRecord::decode(id, v.value()).ok_or_else(|| {
            StoreError::IndexCorrupt(format!("branches table: row {id} is not a branch record"))
        })?);
    }
    Ok(out)
}

fn assign_ids(db: &super::Index, wanted: &[BranchRoot]) -> Result<Vec<BranchIdent>, StoreError> {
    let txn = db.begin_write().map_err(index_error)?;
    let ids = {
        let mut counters = txn.open_table(COUNTERS).map_err(index_error)?;
        let mut table = txn.open_table(BRANCHES).map_err(index_error)?;
        let known = decode_branches(&table)?;
        let next = counters
            .get(NEXT_BRANCH_ID)
            .map_err(index_error)?
            .map(|v| v.value())
            .unwrap_or(0);
        let next = u32::try_from(next)
            .map_err(|_| StoreError::IndexCorrupt(format!("next_branch_id {next}")))?;
        let m = match_branches(&known, wanted, next);
        if m.changed.is_empty() {
            return Ok(m.idents);
        }
        for row in &m.changed {
            tracing::info!(
                "branch {} ({}): id {}",
                row.root.path.display(),
                if known.iter().any(|k| k.id == row.id) {
                    "moved or replaced"
                } else {
                    "new"
                },
                row.id
            );
            table
                .insert(row.id, row.encode().as_slice())
                .map_err(index_error)?;
        }
        counters
            .insert(NEXT_BRANCH_ID, u64::from(m.next))
            .map_err(index_error)?;
        m.idents
    };
    txn.commit().map_err(index_error)?;
    Ok(ids)
}

/// The `snapshots` table: a snapshot's name → the branch it froze.
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
/// First byte of a `snapshots` value.
const SNAPSHOT_FORMAT: u8 = 1;

/// A branch frozen by `chronofs snapshot`, by its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub name: String,
    /// The frozen branch's persistent id.
    pub branch: u32,
    pub time_ns: i64,
}

impl Snapshot {
    fn encode(&self) -> Vec<u8> {
        let mut v = vec![SNAPSHOT_FORMAT];
        v.extend_from_slice(&self.branch.to_be_bytes());
        v.extend_from_slice(&self.time_ns.to_be_bytes());
        v
    }

    fn decode(name: String, v: &[u8]) -> Option<Snapshot> {
        if v.len() != 13 || v[0] != SNAPSHOT_FORMAT {
            return None;
        }
        Some(Snapshot {
            name,
            branch: u32::from_be_bytes(v[1..5].try_into().ok()?),
            time_ns: i64::from_be_bytes(v[5..13].try_into().ok()?),
        })
    }
}

/// The `branch_set` table: one row, `SET_KEY`, holding the branch modes
/// a union was mounted with (its command line) and the ones in force now
/// (`chronofs branch mode` changes them while mounted).
const BRANCH_SET: TableDefinition<&str, &[u8]> = TableDefinition::new("branch_set");
const SET_KEY: &str = "set";
/// First byte of the `branch_set` row.
const SET_FORMAT: u8 = 1;

/// Each branch's (id, writable), top first.
pub type Modes = Vec<(u32, bool)>;

/// A union's branch modes as the store last recorded them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BranchSet {
    /// What the mount's command line said.
    pub mounted: Modes,
    /// What is in force (equal to `mounted` until a live change).
    pub live: Modes,
}

impl BranchSet {
    fn encode(&self) -> Vec<u8> {
        let mut v = vec![SET_FORMAT];
        for modes in [&self.mounted, &self.live] {
            v.extend_from_slice(&(modes.len() as u32).to_be_bytes());
            for (id, writable) in modes {
                v.extend_from_slice(&id.to_be_bytes());
                v.push(u8::from(*writable));
            }
        }
        v
    }

    fn decode(v: &[u8]) -> Option<BranchSet> {
        let (&format, mut rest) = v.split_first()?;
        if format != SET_FORMAT {
            return None;
        }
        let mut lists = Vec::with_capacity(2);
        for _ in 0..2 {
            let n = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
            rest = &rest[4..];
            let mut modes = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                let id = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?);
                let writable = match rest.get(4)? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                modes.push((id, writable));
                rest = &rest[5..];
            }
            lists.push(modes);
        }
        let live = lists.pop()?;
        let mounted = lists.pop()?;
        rest.is_empty().then_some(BranchSet { mounted, live })
    }

    /// The modes a mount given `mounted` starts with: the recorded live
    /// ones when the command line is the one they were changed under (a
    /// remount, or a restart after a crash, continues where the mount
    /// was), else the command line's (the user asked for other modes).
    pub fn starting(&self, mounted: &Modes) -> Modes {
        if &self.mounted == mounted && !self.live.is_empty() {
            self.live.clone()
        } else {
            mounted.clone()
        }
    }
}

/// Records a mounted union's live modes (what `branch mode` changes).
#[derive(Clone)]
pub struct BranchSetLog {
    db: std::sync::Arc<super::Index>,
}

impl BranchSetLog {
    /// Records `set`, durably, before the caller puts it in force.
    pub fn record(&self, set: &BranchSet) -> Result<(), StoreError> {
        write_set(&self.db, set)
    }

    /// Records `set` as [`BranchSetLog::record`] does, and in the same
    /// commit names the branch `snapshot` froze.
    pub fn record_snapshot(&self, set: &BranchSet, snapshot: &Snapshot) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(index_error)?;
        {
            let mut names = txn.open_table(SNAPSHOTS).map_err(index_error)?;
            if names
                .get(snapshot.name.as_str())
                .map_err(index_error)?
                .is_some()
            {
                return Err(StoreError::Exists(format!(
                    "a snapshot named {:?} exists already",
                    snapshot.name
                )));
            }
            names
                .insert(snapshot.name.as_str(), snapshot.encode().as_slice())
                .map_err(index_error)?;
        }
        insert_set(&txn, set)?;
        txn.commit().map_err(index_error)
    }

    /// Every snapshot named so far, oldest first.
    pub fn snapshots(&self) -> Result<Vec<Snapshot>, StoreError> {
        let txn = self.db.begin_read().map_err(index_error)?;
        let Some(table) = read_table(&txn, SNAPSHOTS)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for row in table.iter().map_err(index_error)? {
            let (k, v) = row.map_err(index_error)?;
            let name = k.value().to_string();
            out.push(Snapshot::decode(name.clone(), v.value()).ok_or_else(|| {
                StoreError::IndexCorrupt(format!("snapshots table: {name:?} is not a snapshot"))
            })?);
        }
        out.sort_by_key(|s| s.time_ns);
        Ok(out)
    }

    /// See [`Store::branches`].
    pub fn branches(&self) -> Result<Vec<BranchRecord>, StoreError> {
        read_branches(&self.db)
    }

    /// See [`Store::branch_idents`]: a branch inserted while mounted gets
    /// its id (its old one, if it was a branch before) this way.
    pub fn branch_idents(&self, wanted: &[BranchRoot]) -> Result<Vec<BranchIdent>, StoreError> {
        assign_ids(&self.db, wanted)
    }
}

fn write_set(db: &super::Index, set: &BranchSet) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(index_error)?;
    insert_set(&txn, set)?;
    txn.commit().map_err(index_error)
}

fn insert_set(txn: &redb::WriteTransaction, set: &BranchSet) -> Result<(), StoreError> {
    let mut table = txn.open_table(BRANCH_SET).map_err(index_error)?;
    table
        .insert(SET_KEY, set.encode().as_slice())
        .map_err(index_error)?;
    Ok(())
}

impl Store {
    /// The branch modes last recorded, if any union was mounted.
    pub fn branch_set(&self) -> Result<Option<BranchSet>, StoreError> {
        let txn = self.registry.begin_read().map_err(index_error)?;
        let Some(table) = read_table(&txn, BRANCH_SET)? else {
            return Ok(None);
        };
        let Some(row) = table.get(SET_KEY).map_err(index_error)? else {
            return Ok(None);
        };
        BranchSet::decode(row.value())
            .map(Some)
            .ok_or_else(|| StoreError::IndexCorrupt("branch_set table: not a branch set".into()))
    }

    /// The modes a union mounted with `mounted` starts with (see
    /// [`BranchSet::starting`]), recording the command line when it is new.
    pub fn start_branch_set(&self, mounted: &Modes) -> Result<BranchSet, StoreError> {
        let known = self.branch_set()?;
        let set = match known {
            Some(k) if &k.mounted == mounted => BranchSet {
                live: k.starting(mounted),
                mounted: mounted.clone(),
            },
            _ => {
                let fresh = BranchSet {
                    mounted: mounted.clone(),
                    live: mounted.clone(),
                };
                write_set(&self.registry, &fresh)?;
                fresh
            }
        };
        Ok(set)
    }

    pub fn branch_set_log(&self) -> BranchSetLog {
        BranchSetLog {
            db: self.registry.clone(),
        }
    }
}

/// Whether `path` is a branch `snapshot` made: `over-NAME` in a store's
/// `branches/` directory.
pub fn is_snapshot_branch(path: &std::path::Path) -> bool {
    let over = path
        .file_name()
        .is_some_and(|n| n.as_encoded_bytes().starts_with(b"over-"));
    over && path.parent().and_then(std::path::Path::file_name) == Some(OsStr::new("branches"))
}

/// The tables of this module, which a format-6 store kept in its index.
const MOVED: [&str; 3] = ["branches", "branch_set", "snapshots"];

/// Copies this module's tables (and `next_branch_id`) from `from` into
/// `txn`: from a format-6 index into the registry's first transaction.
pub(super) fn copy_branch_tables(
    from: &super::Index,
    txn: &redb::WriteTransaction,
) -> Result<(), StoreError> {
    let old = from.begin_read().map_err(index_error)?;
    if let Some(table) = read_table(&old, BRANCHES)? {
        let mut to = txn.open_table(BRANCHES).map_err(index_error)?;
        for row in table.iter().map_err(index_error)? {
            let (k, v) = row.map_err(index_error)?;
            to.insert(k.value(), v.value()).map_err(index_error)?;
        }
    }
    for def in [BRANCH_SET, SNAPSHOTS] {
        if let Some(table) = read_table(&old, def)? {
            let mut to = txn.open_table(def).map_err(index_error)?;
            for row in table.iter().map_err(index_error)? {
                let (k, v) = row.map_err(index_error)?;
                to.insert(k.value(), v.value()).map_err(index_error)?;
            }
        }
    }
    if let Some(table) = read_table(&old, COUNTERS)? {
        if let Some(next) = table.get(NEXT_BRANCH_ID).map_err(index_error)? {
            let mut to = txn.open_table(COUNTERS).map_err(index_error)?;
            to.insert(NEXT_BRANCH_ID, next.value())
                .map_err(index_error)?;
        }
    }
    Ok(())
}

/// Removes what [`copy_into_registry`] copied from the index, once the
/// registry holds it durably (a no-op when nothing is left).
pub(super) fn drop_from_index(index: &super::Index) -> Result<(), StoreError> {
    let left = {
        let txn = index.begin_read().map_err(index_error)?;
        let mut left = txn
            .list_tables()
            .map_err(index_error)?
            .any(|t| MOVED.contains(&t.name()));
        if let Some(table) = read_table(&txn, COUNTERS)? {
            left |= table.get(NEXT_BRANCH_ID).map_err(index_error)?.is_some();
        }
        left
    };
    if !left {
        return Ok(());
    }
    let txn = index.begin_write().map_err(index_error)?;
    txn.delete_table(BRANCHES).map_err(index_error)?;
    txn.delete_table(BRANCH_SET).map_err(index_error)?;
    txn.delete_table(SNAPSHOTS).map_err(index_error)?;
    txn.open_table(COUNTERS)
        .map_err(index_error)?
        .remove(NEXT_BRANCH_ID)
        .map_err(index_error)?;
    txn.commit().map_err(index_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_branch_set_round_trips_and_garbage_is_refused() {
        let set = BranchSet {
            mounted: vec![(0, true), (3, false)],
            live: vec![(0, false), (3, true)],
        };
        assert_eq!(BranchSet::decode(&set.encode()), Some(set.clone()));
        let mut bad = set.encode();
        bad.push(0);
        assert_eq!(BranchSet::decode(&bad), None);
        assert_eq!(BranchSet::decode(&[2]), None);
        assert_eq!(BranchSet::decode(&[]), None);
    }

    #[test]
    fn live_modes_survive_a_remount_with_the_same_command_line_only() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let cmdline = vec![(0, true), (1, false)];
        assert_eq!(store.start_branch_set(&cmdline).unwrap().live, cmdline);
        let changed = BranchSet {
            mounted: cmdline.clone(),
            live: vec![(0, true), (1, true)],
        };
        store.branch_set_log().record(&changed).unwrap();
        drop(store);
        let store = Store::open(tmp.path()).unwrap();
        assert_eq!(store.start_branch_set(&cmdline).unwrap().live, changed.live);
        // Another command line wins, and becomes the one recorded.
        let other = vec![(0, false), (1, true)];
        assert_eq!(store.start_branch_set(&other).unwrap().live, other);
        assert_eq!(store.start_branch_set(&cmdline).unwrap().live, cmdline);
    }

    fn root(path: &str, ino: u64) -> BranchRoot {
        BranchRoot {
            path: PathBuf::from(path),
            dev: 1,
            ino,
            born: Some(1_000 + ino as i64),
        }
    }

    fn record(ids: &[u32], wanted: &[BranchRoot]) -> Vec<BranchRecord> {
        ids.iter()
            .zip(wanted)
            .map(|(&id, w)| BranchRecord {
                id,
                root: w.clone(),
                key_dev: w.dev,
                state: BranchState::Active,
            })
            .collect()
    }

    fn ids(m: &Matched) -> Vec<u32> {
        m.idents.iter().map(|b| b.id).collect()
    }

    #[test]
    fn a_renumbered_device_keeps_the_key_device_a_new_directory_does_not() {
        let known = record(&[0, 1], &[root("/a", 10), root("/b", 11)]);
        let on = |r: BranchRoot, dev: u64| BranchRoot { dev, ..r };
        // /a: the same directory (inode, birth time) on device 7 now.
        // /b: another directory under its name on device 7.
        let b_new = BranchRoot {
            born: Some(5),
            ..on(root("/b", 11), 7)
        };
        let m = match_branches(&known, &[on(root("/a", 10), 7), b_new], 2);
        assert_eq!(
            m.idents,
            vec![
                BranchIdent { id: 0, key_dev: 1 },
                BranchIdent { id: 1, key_dev: 7 }
            ]
        );
        // Both rows change (the device moved); the key device persists.
        assert_eq!(m.changed.len(), 2);
        assert_eq!(m.changed[0].key_dev, 1);
        let again = match_branches(&m.changed, &[on(root("/a", 10), 9)], 2);
        assert_eq!(again.idents, vec![BranchIdent { id: 0, key_dev: 1 }]);
    }

    #[test]
    fn records_round_trip_and_format_1_keys_by_its_device() {
        let row = BranchRecord {
            id: 4,
            root: root("/x y", 12),
            key_dev: 99,
            state: BranchState::Active,
        };
        assert_eq!(BranchRecord::decode(4, &row.encode()), Some(row.clone()));
        let no_birth = BranchRecord {
            root: BranchRoot {
                born: None,
                ..row.root.clone()
            },
            ..row.clone()
        };
        assert_eq!(BranchRecord::decode(4, &no_birth.encode()), Some(no_birth));
        // As format 1 wrote it: no key device, no birth time.
        let mut v1 = vec![RECORD_FORMAT_1, 0];
        v1.extend_from_slice(&3u64.to_be_bytes());
        v1.extend_from_slice(&12u64.to_be_bytes());
        v1.extend_from_slice(b"/old");
        let old = BranchRecord::decode(2, &v1).unwrap();
        assert_eq!((old.key_dev, old.root.dev, old.root.born), (3, 3, None));
        assert_eq!(old.root.path, PathBuf::from("/old"));
        assert_eq!(BranchRecord::decode(2, &v1[..17]), None);
        assert_eq!(BranchRecord::decode(2, &[9, 0]), None);
    }

    #[test]
    fn an_empty_table_gives_positions_as_ids() {
        let w = [root("/a", 10), root("/b", 11), root("/c", 12)];
        let m = match_branches(&[], &w, 0);
        assert_eq!(ids(&m), vec![0, 1, 2]);
        assert_eq!(m.next, 3);
        assert_eq!(m.changed.len(), 3);
    }

    #[test]
    fn a_branch_keeps_its_id_by_root_then_by_path() {
        let w = [root("/a", 10), root("/b", 11), root("/c", 12)];
        let known = record(&[0, 1, 2], &w);
        // Reordered, one moved (same root, new path), one replaced (same
        // path, new root), one inserted.
        let again = [
            root("/c", 12),
            root("/new", 13),
            root("/moved-a", 10),
            root("/b", 99),
        ];
        let m = match_branches(&known, &again, 3);
        assert_eq!(ids(&m), vec![2, 3, 0, 1]);
        assert_eq!(m.next, 4);
        let changed: Vec<u32> = m.changed.iter().map(|r| r.id).collect();
        assert_eq!(changed, vec![3, 0, 1]);
        // The same list again changes nothing.
        let m = match_branches(&known, &w, 3);
        assert_eq!(ids(&m), vec![0, 1, 2]);
        assert!(m.changed.is_empty());
    }

    #[test]
    fn a_root_match_wins_over_another_branchs_path() {
        // /a and /b swapped by renaming: each directory keeps its id.
        let known = record(&[0, 1], &[root("/a", 10), root("/b", 11)]);
        let m = match_branches(&known, &[root("/a", 11), root("/b", 10)], 2);
        assert_eq!(ids(&m), vec![1, 0]);
    }

    #[test]
    fn ids_are_never_reused_and_persist() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let (a, b, c) = (root("/a", 10), root("/b", 11), root("/c", 12));
        {
            let store = Store::open(&dir).unwrap();
            assert_eq!(
                store.branch_ids(&[a.clone(), b.clone()]).unwrap(),
                vec![0, 1]
            );
            // b left the list: its id stays b's; c gets a fresh one.
            assert_eq!(
                store.branch_ids(&[a.clone(), c.clone()]).unwrap(),
                vec![0, 2]
            );
        }
        let store = Store::open(&dir).unwrap();
        assert_eq!(
            store
                .branch_ids(&[c.clone(), b.clone(), a.clone()])
                .unwrap(),
            vec![2, 1, 0]
        );
        assert_eq!(store.branch_ids(&[root("/d", 13)]).unwrap(), vec![3]);
        assert_eq!(store.branches().unwrap().len(), 4);
    }
}
