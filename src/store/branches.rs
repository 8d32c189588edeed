//! Persistent branch ids: the `branches` table (id → canonical path, root
//! (dev, ino), state) and the matching of a mount's branch list to it.
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

use redb::{ReadableTable, TableDefinition};

use super::{index_error, Store, StoreError};

const BRANCHES: TableDefinition<u32, &[u8]> = TableDefinition::new("branches");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const NEXT_BRANCH_ID: &str = "next_branch_id";
/// First byte of a `branches` value.
const RECORD_FORMAT: u8 = 1;

/// Where a branch is: its canonical path and its root directory's
/// (st_dev, st_ino).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchRoot {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
}

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
    pub state: BranchState,
}

impl BranchRecord {
    fn encode(&self) -> Vec<u8> {
        let path = self.root.path.as_os_str().as_bytes();
        let mut v = Vec::with_capacity(18 + path.len());
        v.push(RECORD_FORMAT);
        v.push(match self.state {
            BranchState::Active => 0,
        });
        v.extend_from_slice(&self.root.dev.to_be_bytes());
        v.extend_from_slice(&self.root.ino.to_be_bytes());
        v.extend_from_slice(path);
        v
    }

    fn decode(id: u32, v: &[u8]) -> Option<BranchRecord> {
        if v.len() < 18 || v[0] != RECORD_FORMAT || v[1] != 0 {
            return None;
        }
        let dev = u64::from_be_bytes(v[2..10].try_into().ok()?);
        let ino = u64::from_be_bytes(v[10..18].try_into().ok()?);
        Some(BranchRecord {
            id,
            root: BranchRoot {
                path: PathBuf::from(OsStr::from_bytes(&v[18..])),
                dev,
                ino,
            },
            state: BranchState::Active,
        })
    }
}

/// What matching a branch list against the table decided.
#[derive(Debug, PartialEq, Eq)]
pub struct Matched {
    /// The id of each wanted branch, in the list's order.
    pub ids: Vec<u32>,
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
pub fn match_branches(known: &[BranchRecord], wanted: &[BranchRoot], mut next: u32) -> Matched {
    let mut ids: Vec<Option<u32>> = vec![None; wanted.len()];
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
                ids[i] = Some(r.id);
            }
        }
    }
    let mut changed = Vec::new();
    let ids = ids
        .into_iter()
        .zip(wanted)
        .map(|(id, w)| {
            let id = id.unwrap_or_else(|| {
                next += 1;
                next - 1
            });
            let row = BranchRecord {
                id,
                root: w.clone(),
                state: BranchState::Active,
            };
            if !known.contains(&row) {
                changed.push(row);
            }
            id
        })
        .collect();
    Matched { ids, changed, next }
}

impl Store {
    /// Every branch this store has known.
    pub fn branches(&self) -> Result<Vec<BranchRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(index_error)?;
        let table = match txn.open_table(BRANCHES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(index_error(e)),
        };
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

    /// The persistent id of each branch of a mount's list (top first),
    /// recording new branches and moved ones in one durable commit.
    pub fn branch_ids(&self, wanted: &[BranchRoot]) -> Result<Vec<u32>, StoreError> {
        let txn = self.db.begin_write().map_err(index_error)?;
        let ids = {
            let mut counters = txn.open_table(COUNTERS).map_err(index_error)?;
            let mut table = txn.open_table(BRANCHES).map_err(index_error)?;
            let mut known = Vec::new();
            for row in table.iter().map_err(index_error)? {
                let (k, v) = row.map_err(index_error)?;
                let id = k.value();
                known.push(BranchRecord::decode(id, v.value()).ok_or_else(|| {
                    StoreError::IndexCorrupt(format!(
                        "branches table: row {id} is not a branch record"
                    ))
                })?);
            }
            let next = counters
                .get(NEXT_BRANCH_ID)
                .map_err(index_error)?
                .map(|v| v.value())
                .unwrap_or(0);
            let next = u32::try_from(next)
                .map_err(|_| StoreError::IndexCorrupt(format!("next_branch_id {next}")))?;
            let m = match_branches(&known, wanted, next);
            if m.changed.is_empty() {
                return Ok(m.ids);
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
            m.ids
        };
        txn.commit().map_err(index_error)?;
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(path: &str, ino: u64) -> BranchRoot {
        BranchRoot {
            path: PathBuf::from(path),
            dev: 1,
            ino,
        }
    }

    fn record(ids: &[u32], wanted: &[BranchRoot]) -> Vec<BranchRecord> {
        ids.iter()
            .zip(wanted)
            .map(|(&id, w)| BranchRecord {
                id,
                root: w.clone(),
                state: BranchState::Active,
            })
            .collect()
    }

    #[test]
    fn an_empty_table_gives_positions_as_ids() {
        let w = [root("/a", 10), root("/b", 11), root("/c", 12)];
        let m = match_branches(&[], &w, 0);
        assert_eq!(m.ids, vec![0, 1, 2]);
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
        assert_eq!(m.ids, vec![2, 3, 0, 1]);
        assert_eq!(m.next, 4);
        let changed: Vec<u32> = m.changed.iter().map(|r| r.id).collect();
        assert_eq!(changed, vec![3, 0, 1]);
        // The same list again changes nothing.
        let m = match_branches(&known, &w, 3);
        assert_eq!(m.ids, vec![0, 1, 2]);
        assert!(m.changed.is_empty());
    }

    #[test]
    fn a_root_match_wins_over_another_branchs_path() {
        // /a and /b swapped by renaming: each directory keeps its id.
        let known = record(&[0, 1], &[root("/a", 10), root("/b", 11)]);
        let m = match_branches(&known, &[root("/a", 11), root("/b", 10)], 2);
        assert_eq!(m.ids, vec![1, 0]);
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
