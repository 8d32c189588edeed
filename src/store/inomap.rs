//! The persistent inode map: (branch, backing device, backing inode) → the
//! inode number chronofs shows.
//!
//! Numbers are allocated once and never reused while the map lives, so
//! `st_ino` is stable across remounts and unique across branches (a union of
//! two directories on one file system may hold equal backing numbers).
//! New mappings are made visible at once in memory and written to the index
//! in batches by a background thread (one durable commit per batch): a
//! request never waits for an fsync. A crash can lose the newest, not yet
//! committed mappings; those objects get fresh numbers at the next mount,
//! which is safe because the kernel forgot every number with the crash.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use redb::{ReadableTable, TableDefinition};

use super::{index_error, Index, StoreError};

/// Key: branch id (u32) ‖ st_dev (u64) ‖ st_ino (u64), big-endian, so one
/// branch's entries sort together.
const INODES: TableDefinition<&[u8], u64> = TableDefinition::new("inode_map");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const NEXT_INO: &str = "next_ino";

/// The kernel reserves 1 for the root; chronofs numbers start above it.
pub const FIRST_INO: u64 = 2;

/// Identity of a backing object: which branch, and its (st_dev, st_ino) there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackingKey {
    pub branch: u32,
    pub dev: u64,
    pub ino: u64,
}

impl BackingKey {
    pub fn encode(&self) -> [u8; 20] {
        let mut k = [0u8; 20];
        k[..4].copy_from_slice(&self.branch.to_be_bytes());
        k[4..12].copy_from_slice(&self.dev.to_be_bytes());
        k[12..].copy_from_slice(&self.ino.to_be_bytes());
        k
    }
}

/// Where a branch's root file system has another device number than the
/// one its keys carry (a reboot renumbered the disk): the two numbers
/// (docs/ARCHITECTURE.md "Device numbers"). Translation swaps them, so it
/// is its own inverse, and should the old number now belong to a file
/// system mounted inside the branch, that one stays distinct.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevAlias(Option<(u64, u64)>);

impl DevAlias {
    /// `live`: the root's device number now; `key`: the one keys carry.
    pub fn new(live: u64, key: u64) -> DevAlias {
        DevAlias((live != key).then_some((live, key)))
    }

    pub fn is_some(self) -> bool {
        self.0.is_some()
    }

    /// A live device number as keys carry it, or a key's as it is live.
    pub fn swap(self, dev: u64) -> u64 {
        match self.0 {
            Some((live, key)) if dev == live => key,
            Some((live, key)) if dev == key => live,
            _ => dev,
        }
    }
}

/// A backing key and the inode number it maps to.
type Mapping = (BackingKey, u64);

/// In-memory part of the map.
#[derive(Default)]
struct MapState {
    /// Mappings allocated but not yet committed.
    pending: HashMap<BackingKey, u64>,
    /// Mappings of objects that no longer exist, to delete at the next
    /// commit if the key still maps to that number then.
    retired: Vec<Mapping>,
    /// Committed mappings seen recently (a cache in front of the index:
    /// the kernel forgets inodes under memory pressure and looks them up
    /// again). Emptied when it reaches `RECENT_CAP`.
    recent: HashMap<BackingKey, u64>,
}

/// Bound of the recent-mappings cache (about 50 bytes per entry).
const RECENT_CAP: usize = 256 * 1024;

impl MapState {
    fn get(&self, key: &BackingKey) -> Option<u64> {
        self.pending
            .get(key)
            .or_else(|| self.recent.get(key))
            .copied()
    }

    fn remember(&mut self, key: BackingKey, ino: u64) {
        if self.recent.len() >= RECENT_CAP {
            self.recent.clear();
        }
        self.recent.insert(key, ino);
    }

    /// Allocates a number for `key` (pending until the next commit).
    fn assign(&mut self, key: BackingKey, next: &AtomicU64) -> u64 {
        let ino = next.fetch_add(1, Ordering::Relaxed);
        self.recent.remove(&key);
        self.pending.insert(key, ino);
        ino
    }
}

struct Shared {
    db: Arc<Index>,
    state: Mutex<MapState>,
    /// Held for a whole flush (snapshot, commit, bookkeeping): two flushes
    /// interleaving could let an older snapshot re-insert a retired mapping.
    flush_lock: Mutex<()>,
    /// Count of commits, so a reader can tell whether one happened (and
    /// moved a mapping out of `pending`) while it read the index.
    commits: AtomicU64,
    wake: Condvar,
    next: AtomicU64,
    closing: std::sync::atomic::AtomicBool,
}

pub struct InodeMap {
    shared: Arc<Shared>,
    flusher: Option<std::thread::JoinHandle<()>>,
}

const FLUSH_INTERVAL: Duration = Duration::from_millis(100);

impl InodeMap {
    pub(super) fn open(db: Arc<Index>) -> Result<InodeMap, StoreError> {
        let next = {
            let txn = db.begin_read().map_err(index_error)?;
            match txn.open_table(COUNTERS) {
                Ok(t) => t.get(NEXT_INO).map_err(index_error)?.map(|v| v.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(index_error(e)),
            }
        }
        .unwrap_or(FIRST_INO);
        let shared = Arc::new(Shared {
            db,
            state: Mutex::new(MapState::default()),
            flush_lock: Mutex::new(()),
            commits: AtomicU64::new(0),
            wake: Condvar::new(),
            next: AtomicU64::new(next),
            closing: std::sync::atomic::AtomicBool::new(false),
        });
        let bg = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("inomap-flush".into())
            .spawn(move || bg.flush_loop())
            .map_err(|source| StoreError::Spawn {
                what: "inode-map flusher",
                source,
            })?;
        Ok(InodeMap {
            shared,
            flusher: Some(flusher),
        })
    }

    /// The number for `key`, allocating one on first sight.
    pub fn get_or_assign(&self, key: BackingKey) -> Result<u64, StoreError> {
        if let Some(ino) = self.shared.state.lock().get(&key) {
            return Ok(ino);
        }
        let (committed, mut state) = loop {
            let before = self.shared.commits.load(Ordering::Acquire);
            let committed = self.lookup_committed(&key)?;
            let state = self.shared.state.lock();
            // Another thread may have assigned it while we read the index.
            if let Some(ino) = state.get(&key) {
                return Ok(ino);
            }
            // A commit in between may have moved it out of memory: read again.
            if committed.is_some() || self.shared.commits.load(Ordering::Acquire) == before {
                break (committed, state);
            }
        };
        Ok(match committed {
            Some(ino) => {
                state.remember(key, ino);
                ino
            }
            None => state.assign(key, &self.shared.next),
        })
    }

    /// Numbers for many keys at once, with one index transaction: what a
    /// directory listing needs for its entries' `d_ino`.
    pub fn get_or_assign_many(&self, keys: &[BackingKey]) -> Result<Vec<u64>, StoreError> {
        let mut out = vec![0u64; keys.len()];
        let mut missing = Vec::new();
        {
            let state = self.shared.state.lock();
            for (i, key) in keys.iter().enumerate() {
                match state.get(key) {
                    Some(ino) => out[i] = ino,
                    None => missing.push(i),
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let mut found = Vec::new();
        let before = self.shared.commits.load(Ordering::Acquire);
        {
            let txn = self.shared.db.begin_read().map_err(index_error)?;
            match txn.open_table(INODES) {
                Ok(table) => {
                    for &i in &missing {
                        let encoded = keys[i].encode();
                        if let Some(v) = table.get(encoded.as_slice()).map_err(index_error)? {
                            found.push((i, v.value()));
                        }
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(index_error(e)),
            }
        }
        let mut state = self.shared.state.lock();
        for (i, ino) in found {
            state.remember(keys[i], ino);
        }
        let raced = self.shared.commits.load(Ordering::Acquire) != before;
        let mut recheck = Vec::new();
        for i in missing {
            out[i] = match state.get(&keys[i]) {
                Some(ino) => ino,
                // A commit during the read may have moved it out of memory.
                None if raced => {
                    recheck.push(i);
                    continue;
                }
                None => state.assign(keys[i], &self.shared.next),
            };
        }
        drop(state);
        for i in recheck {
            out[i] = self.get_or_assign(keys[i])?;
        }
        Ok(out)
    }

    /// The number `key` maps to, if any, without assigning one.
    pub fn get(&self, key: &BackingKey) -> Result<Option<u64>, StoreError> {
        if let Some(ino) = self.shared.state.lock().get(key) {
            return Ok(Some(ino));
        }
        self.lookup_committed(key)
    }

    /// Drops the mapping `key` → `ino` because its object is gone (its last
    /// name was removed), so the index does not grow with every file ever
    /// seen. Only that exact mapping goes: if the backing number has been
    /// given to a new object meanwhile, its new mapping stays.
    pub fn retire(&self, key: BackingKey, ino: u64) {
        let mut state = self.shared.state.lock();
        if state.pending.get(&key) == Some(&ino) {
            state.pending.remove(&key);
        }
        if state.recent.get(&key) == Some(&ino) {
            state.recent.remove(&key);
        }
        state.retired.push((key, ino));
        self.shared.wake.notify_one();
    }

    /// Maps `key` to an existing number: an object copied up into another
    /// branch keeps its number (and with it its history).
    pub fn bind(&self, key: BackingKey, ino: u64) {
        let mut state = self.shared.state.lock();
        // Bound again before its retirement was written (a copy gone with
        // its branch, the object below it shown again): the binding wins.
        state.retired.retain(|r| *r != (key, ino));
        state.recent.remove(&key);
        state.pending.insert(key, ino);
    }

    /// A new number for `key`, replacing any earlier mapping: used for
    /// objects just created (the backing number may be a deleted object's)
    /// and for backing numbers found reused behind the mount's back.
    pub fn assign_fresh(&self, key: BackingKey) -> u64 {
        self.shared.state.lock().assign(key, &self.shared.next)
    }

    fn lookup_committed(&self, key: &BackingKey) -> Result<Option<u64>, StoreError> {
        let txn = self.shared.db.begin_read().map_err(index_error)?;
        let table = match txn.open_table(INODES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(index_error(e)),
        };
        let encoded = key.encode();
        Ok(table
            .get(encoded.as_slice())
            .map_err(index_error)?
            .map(|v| v.value()))
    }

    /// Writes every pending mapping durably (used at unmount and by tests).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.shared.flush_once()
    }
}

/// Inserts `bind`, and removes each `unbind` mapping only if the key still
/// maps to that number (a reused backing number keeps its new mapping).
fn write_mappings(
    table: &mut redb::Table<&[u8], u64>,
    bind: &[Mapping],
    unbind: &[Mapping],
) -> Result<(), StoreError> {
    for (key, ino) in bind {
        table
            .insert(key.encode().as_slice(), *ino)
            .map_err(index_error)?;
    }
    for (key, ino) in unbind {
        let encoded = key.encode();
        let current = table
            .get(encoded.as_slice())
            .map_err(index_error)?
            .map(|v| v.value());
        if current == Some(*ino) {
            table.remove(encoded.as_slice()).map_err(index_error)?;
        }
    }
    Ok(())
}

/// Writes mappings inside another layer's transaction. The history journals
/// the mapping of every object it versions and replays it with the history
/// after a crash, so an object never loses its number (and with it the link
/// to its history) while the inode map's own batch was still in memory.
/// Runs before the map is opened, so the counter it raises is the one the
/// map starts from.
pub fn write_bindings(
    txn: &redb::WriteTransaction,
    bind: &[(BackingKey, u64)],
    unbind: &[(BackingKey, u64)],
) -> Result<(), StoreError> {
    let mut table = txn.open_table(INODES).map_err(index_error)?;
    write_mappings(&mut table, bind, unbind)?;
    // Unbound numbers count too: a batch's net bindings may leave out an
    // object made and removed in it, whose number must still never be
    // given out again.
    let top = bind
        .iter()
        .chain(unbind)
        .map(|(_, ino)| *ino)
        .max()
        .unwrap_or(0);
    drop(table);
    if top > 0 {
        let mut counters = txn.open_table(COUNTERS).map_err(index_error)?;
        let next = counters
            .get(NEXT_INO)
            .map_err(index_error)?
            .map_or(FIRST_INO, |v| v.value());
        if next <= top {
            counters.insert(NEXT_INO, top + 1).map_err(index_error)?;
        }
    }
    Ok(())
}

impl Shared {
    fn flush_loop(&self) {
        // A failing store (a full disk) is retried every interval but
        // reported once a minute, and its recovery once.
        let mut failing_since: Option<std::time::Instant> = None;
        let mut last_report: Option<std::time::Instant> = None;
        loop {
            {
                let mut state = self.state.lock();
                if state.pending.is_empty()
                    && state.retired.is_empty()
                    && !self.closing.load(Ordering::Acquire)
                {
                    self.wake.wait_for(&mut state, FLUSH_INTERVAL);
                }
            }
            match self.flush_once() {
                Err(e) => {
                    failing_since.get_or_insert_with(std::time::Instant::now);
                    if last_report.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60))
                    {
                        tracing::error!("inode map flush failed (retrying): {e}");
                        last_report = Some(std::time::Instant::now());
                    }
                }
                Ok(()) => {
                    if let Some(t) = failing_since.take() {
                        tracing::warn!(
                            "inode map flushed again after {:.1} s of failures",
                            t.elapsed().as_secs_f64()
                        );
                        last_report = None;
                    }
                }
            }
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(FLUSH_INTERVAL);
        }
    }

    fn flush_once(&self) -> Result<(), StoreError> {
        let _serial = self.flush_lock.lock();
        let (batch, retired): (Vec<Mapping>, Vec<Mapping>) = {
            let mut state = self.state.lock();
            let batch = state.pending.iter().map(|(k, v)| (*k, *v)).collect();
            (batch, std::mem::take(&mut state.retired))
        };
        if batch.is_empty() && retired.is_empty() {
            return Ok(());
        }
        let written = (|| {
            let txn = self.db.begin_write().map_err(index_error)?;
            {
                let mut table = txn.open_table(INODES).map_err(index_error)?;
                write_mappings(&mut table, &batch, &retired)?;
                let mut counters = txn.open_table(COUNTERS).map_err(index_error)?;
                counters
                    .insert(NEXT_INO, self.next.load(Ordering::Relaxed))
                    .map_err(index_error)?;
            }
            txn.commit().map_err(index_error)
        })();
        if let Err(e) = written {
            // The removals wait for the next flush, as the bindings do (a
            // full disk is when users delete): dropped, a deleted object's
            // number would stay bound to its backing inode, and a file
            // made there later outside the mount would take its history.
            let mut state = self.state.lock();
            let newer = std::mem::replace(&mut state.retired, retired);
            state.retired.extend(newer);
            return Err(e);
        }
        let mut state = self.state.lock();
        self.commits.fetch_add(1, Ordering::Release);
        for (key, ino) in batch {
            if state.pending.get(&key) == Some(&ino) {
                state.pending.remove(&key);
                state.remember(key, ino);
            }
        }
        Ok(())
    }
}

impl Drop for InodeMap {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        if let Some(handle) = self.flusher.take() {
            if handle.join().is_err() {
                tracing::error!("inode map flusher panicked");
            }
        }
        if let Err(e) = self.shared.flush_once() {
            tracing::error!("final inode map flush failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Store;
    use super::*;

    fn key(i: u64) -> BackingKey {
        BackingKey {
            branch: 0,
            dev: 7,
            ino: i,
        }
    }

    #[test]
    fn numbers_are_stable_across_reopen_and_never_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = {
            let store = Store::open(tmp.path()).unwrap();
            let map = store.inode_map().unwrap();
            let a = map.get_or_assign(key(100)).unwrap();
            let b = map.get_or_assign(key(200)).unwrap();
            assert_ne!(a, b);
            assert_eq!(map.get_or_assign(key(100)).unwrap(), a);
            (a, b)
        };
        let store = Store::open(tmp.path()).unwrap();
        let map = store.inode_map().unwrap();
        assert_eq!(map.get_or_assign(key(200)).unwrap(), b);
        assert_eq!(map.get_or_assign(key(100)).unwrap(), a);
        let c = map.get_or_assign(key(300)).unwrap();
        assert!(c > a.max(b), "new number {c} reuses an old one");
    }

    #[test]
    fn retiring_removes_only_that_mapping() {
        let tmp = tempfile::tempdir().unwrap();
        {
            let store = Store::open(tmp.path()).unwrap();
            let map = store.inode_map().unwrap();
            let gone = map.get_or_assign(key(1)).unwrap();
            let reused_old = map.get_or_assign(key(2)).unwrap();
            map.flush().unwrap();
            map.retire(key(1), gone);
            // key 2's backing number went to a new object before retiring.
            let reused_new = map.assign_fresh(key(2));
            map.retire(key(2), reused_old);
            map.flush().unwrap();
            assert_eq!(map.get(&key(1)).unwrap(), None);
            assert_eq!(map.get(&key(2)).unwrap(), Some(reused_new));
        }
        let store = Store::open(tmp.path()).unwrap();
        let map = store.inode_map().unwrap();
        assert_eq!(map.get(&key(1)).unwrap(), None);
        assert!(map.get(&key(2)).unwrap().is_some());
    }

    #[test]
    fn batch_assignment_agrees_with_single_lookups() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let map = store.inode_map().unwrap();
        let committed = map.get_or_assign(key(1)).unwrap();
        map.flush().unwrap();
        let pending = map.get_or_assign(key(2)).unwrap();
        let keys = [key(1), key(2), key(3), key(3)];
        let got = map.get_or_assign_many(&keys).unwrap();
        assert_eq!(got[0], committed);
        assert_eq!(got[1], pending);
        assert_eq!(got[2], got[3], "one key, one number");
        assert_eq!(map.get_or_assign(key(3)).unwrap(), got[2]);
        assert!(got[2] != committed && got[2] != pending);
    }

    #[test]
    fn fresh_assignment_replaces_the_old_mapping_durably() {
        let tmp = tempfile::tempdir().unwrap();
        let (old, fresh) = {
            let store = Store::open(tmp.path()).unwrap();
            let map = store.inode_map().unwrap();
            let old = map.get_or_assign(key(1)).unwrap();
            map.flush().unwrap();
            let fresh = map.assign_fresh(key(1));
            assert_ne!(old, fresh);
            assert_eq!(map.get_or_assign(key(1)).unwrap(), fresh);
            (old, fresh)
        };
        let store = Store::open(tmp.path()).unwrap();
        let map = store.inode_map().unwrap();
        assert_eq!(map.get_or_assign(key(1)).unwrap(), fresh);
        assert!(map.get_or_assign(key(2)).unwrap() > old.max(fresh));
    }

    #[test]
    fn branches_with_equal_backing_numbers_get_distinct_inodes() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let map = store.inode_map().unwrap();
        let a = map
            .get_or_assign(BackingKey {
                branch: 0,
                dev: 1,
                ino: 5,
            })
            .unwrap();
        let b = map
            .get_or_assign(BackingKey {
                branch: 1,
                dev: 1,
                ino: 5,
            })
            .unwrap();
        assert_ne!(a, b);
        assert!(a >= FIRST_INO && b >= FIRST_INO);
    }

    #[test]
    fn concurrent_assignment_gives_one_number_per_key() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let map = Arc::new(store.inode_map().unwrap());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let map = map.clone();
                std::thread::spawn(move || {
                    (0..500)
                        .map(|i| map.get_or_assign(key(i)).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let results: Vec<Vec<u64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for r in &results[1..] {
            assert_eq!(r, &results[0]);
        }
        let mut uniq = results[0].clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), 500);
    }
}
