//! The history: every recorded version of every object, and the queries
//! over them (object at T, directory at T, versions in a range, the
//! incarnations of a path, tags).
//!
//! Owns: the history tables of the index, the journal protocol that makes
//! each recorded change survive a killed daemon, and file content as
//! manifests of chunks. Uses: `store`. Must not know about FUSE, the vfs or
//! credentials.
//!
//! Write path: `commit` gives a change its sequence number and time,
//! appends it to the journal (one write(2)) and queues it; a background
//! thread applies the queue to the index every `APPLY_INTERVAL` with one
//! durable commit, then empties the journal. Queries first apply what is
//! queued, so they always see every committed change. After a crash the
//! journal's records beyond the last durable commit are applied again at
//! open (applying is idempotent).

pub mod access;
pub mod chain;
pub mod clock;
pub mod content;
pub mod gc;
pub mod model;
pub mod past;
#[cfg(test)]
mod powercut;
pub mod prune;
pub mod query;
mod scrub;
pub mod spec;
mod tables;
pub mod templates;
#[cfg(test)]
pub(crate) mod testkit;
pub mod verify;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use redb::Durability;

pub use model::*;

use crate::store::{self, index_error, ChunkStore, Index, Journal, Store, StoreError};

const APPLY_INTERVAL: Duration = Duration::from_millis(100);
const META_DURABLE_SEQ: &str = "history_durable_seq";
const META_NEXT_SEQ: &str = "history_next_seq";
const META_LAST_TIME: &str = "history_last_time_ns";
/// Set once an ingest walked the whole tree: what predates the first
/// mount is recorded (`-o ingest=first` stops starting one).
const META_INGEST_COMPLETE: &str = "history_ingest_complete_ns";

pub type Result<T> = std::result::Result<T, HistoryError>;

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the store's history is damaged: {0}")]
    Corrupt(String),
    /// A version `fsck --repair` marked lost.
    #[error("{0}: its content was lost (damaged in the store; `fsck --repair` marked it lost): input/output error")]
    Lost(String),
    /// Reading the live file being versioned (or recut) failed.
    #[error("reading the file being versioned: {0}")]
    Source(#[source] std::io::Error),
    /// The file being versioned ended before the range being read: it
    /// shrank meanwhile, and a later version records what it became.
    #[error("the file being versioned shrank while it was read")]
    SourceShrank,
    /// Writing a version's content out failed.
    #[error("writing the content out: {0}")]
    Output(#[source] std::io::Error),
    /// The chunker failed other than by I/O.
    #[error("chunking failed: {0}")]
    Chunker(String),
    /// A background thread of the history could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Spawn {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl HistoryError {
    /// No wildcard arm: a new variant must choose its errno here.
    pub fn errno(&self) -> i32 {
        match self {
            HistoryError::Store(e) => e.errno(),
            HistoryError::Corrupt(_) => libc::EUCLEAN,
            // Damaged content reads as a failed read.
            HistoryError::Lost(_) => libc::EIO,
            HistoryError::Source(e) => store::io_errno(e),
            // Trying again reads the file as it is now.
            HistoryError::SourceShrank => libc::EAGAIN,
            HistoryError::Output(e) => store::io_errno(e),
            // fastcdc's "something unexpected" has no errno of its own.
            HistoryError::Chunker(_) => libc::EIO,
            HistoryError::Spawn { source, .. } => store::io_errno(source),
        }
    }
}

#[cfg(test)]
mod errno {
    use super::*;

    #[test]
    fn every_history_error_has_its_errno() {
        let os = |errno| std::io::Error::from_raw_os_error(errno);
        let table = [
            (
                HistoryError::Store(StoreError::IndexBusy(String::new())),
                libc::EBUSY,
            ),
            (HistoryError::Corrupt(String::new()), libc::EUCLEAN),
            (HistoryError::Lost(String::new()), libc::EIO),
            (HistoryError::Source(os(libc::EACCES)), libc::EACCES),
            (HistoryError::SourceShrank, libc::EAGAIN),
            (HistoryError::Output(os(libc::EPIPE)), libc::EPIPE),
            (HistoryError::Chunker(String::new()), libc::EIO),
            (
                HistoryError::Spawn {
                    what: "t",
                    source: os(libc::EAGAIN),
                },
                libc::EAGAIN,
            ),
        ];
        for (e, errno) in table {
            assert_eq!(e.errno(), errno, "{e:?}");
        }
    }

    #[test]
    fn every_past_error_has_its_errno() {
        use past::Error;
        let table = [
            (Error::Usage(String::new()), libc::EINVAL),
            (Error::NotFound(String::new()), libc::ENOENT),
            (Error::Denied(String::new()), libc::EACCES),
            (Error::NotPermitted(String::new()), libc::EPERM),
            (Error::History(HistoryError::Lost(String::new())), libc::EIO),
            (
                Error::Io(std::io::Error::from_raw_os_error(libc::ENOTDIR)),
                libc::ENOTDIR,
            ),
        ];
        for (e, errno) in table {
            assert_eq!(e.errno(), errno, "{e:?}");
        }
    }
}

/// A change being put together; `History::commit` records it.
#[derive(Default, Debug)]
pub struct Draft {
    pub versions: Vec<(ObjectId, Version)>,
    pub dirents: Vec<Dirent>,
    pub bind: Vec<Binding>,
    pub unbind: Vec<Binding>,
    pub tags: Vec<(String, Option<Seq>)>,
    pub backdated: Vec<Backdated>,
}

/// See [`History::maintenance_txn`]; derefs to the transaction.
pub(crate) struct MaintenanceTxn<'h> {
    // Dropped (committed or aborted) before the lock is let go.
    txn: redb::WriteTransaction,
    _applying: parking_lot::MutexGuard<'h, ()>,
}

impl MaintenanceTxn<'_> {
    pub fn commit(self) -> Result<()> {
        self.txn.commit().map_err(tables::err)
    }
}

impl std::ops::Deref for MaintenanceTxn<'_> {
    type Target = redb::WriteTransaction;
    fn deref(&self) -> &redb::WriteTransaction {
        &self.txn
    }
}

/// See [`History::one_instant`].
pub struct OneInstant<'h>(&'h History);

impl Drop for OneInstant<'_> {
    fn drop(&mut self) {
        self.0.state.lock().pinned = None;
    }
}

struct WriteState {
    next_seq: Seq,
    last_time: i64,
    /// Set by [`History::one_instant`]: the time every change gets.
    pinned: Option<i64>,
    journals: [Journal; 2],
    active: usize,
    queue: Vec<Op>,
    /// Ops applied without durability (by a query's `settle`) since the
    /// last durable apply. The next background apply must still make them
    /// durable and retire their journal, or the journal grows while
    /// queries keep the queue empty; and if the index was re-opened after
    /// a failed write meanwhile (a full disk), they are gone from it and
    /// are applied again (applying is idempotent).
    undurable: Vec<Op>,
    /// The index generation (`Index::generation`) `undurable` was applied to.
    applied_generation: u64,
    /// The last apply failed (the index may be re-opened before the next).
    apply_failed: bool,
    /// Latest versions and directory entries of queued changes, for the
    /// capture's hot-path questions (what is the newest version of X?).
    latest: HashMap<ObjectId, (Seq, Arc<Version>)>,
    dirents: HashMap<(ObjectId, Vec<u8>), (Option<ObjectId>, Seq)>,
    /// The objects whose versions, or whose directory entries, changes not
    /// yet in the index record (with the newest such change): a query
    /// about none of them reads the index as settling would leave it.
    touched: HashMap<ObjectId, Seq>,
}

impl WriteState {
    /// A change journaled and not yet in the index: queued, and known to
    /// the hot-path questions meanwhile.
    fn queue_op(&mut self, op: Op) {
        self.next_seq = self.next_seq.max(op.seq.next());
        self.last_time = self.last_time.max(op.time_ns);
        for (obj, v) in &op.versions {
            self.latest.insert(*obj, (op.seq, Arc::new(v.clone())));
        }
        for d in &op.dirents {
            self.dirents
                .insert((d.parent, d.name.clone()), (d.child, op.seq));
        }
        for b in &op.backdated {
            let d = &b.dirent;
            self.dirents
                .insert((d.parent, d.name.clone()), (d.child, b.at));
        }
        let touched = op.versions.iter().map(|(obj, _)| *obj).chain(
            op.dirents
                .iter()
                .chain(op.backdated.iter().map(|b| &b.dirent))
                .map(|d| d.parent),
        );
        for obj in touched {
            self.touched.insert(obj, op.seq);
        }
        self.queue.push(op);
    }
}

pub struct History {
    db: Arc<Index>,
    space: Arc<store::Space>,
    chunks: Arc<ChunkStore>,
    state: Mutex<WriteState>,
    /// Serializes appliers (background thread and queries).
    apply_lock: Mutex<()>,
    wake: Condvar,
    closing: AtomicBool,
    /// One prune, purge or collection at a time (a collection's mark must
    /// not see versions vanish under it).
    maintenance: Mutex<()>,
    /// Held (shared) by each version build from its first chunk put to its
    /// commit; a collection takes it exclusively once, so no build that
    /// reused a chunk before the collection began is still uncommitted
    /// when it marks.
    build_gate: parking_lot::RwLock<()>,
    /// Changes made while the store was full that history could not
    /// record (removals go ahead regardless: see `vfs::before_freeing`).
    unrecorded: std::sync::atomic::AtomicU64,
    /// Counts acts that took versions away (prune, purge, retention,
    /// versions marked lost): views built before may show what is gone.
    removals: std::sync::atomic::AtomicU64,
    removal_hooks: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
    clock: Arc<dyn clock::Clock>,
}

pub struct HistoryHandle {
    history: Arc<History>,
    applier: Option<std::thread::JoinHandle<()>>,
}

impl std::ops::Deref for HistoryHandle {
    type Target = Arc<History>;
    fn deref(&self) -> &Arc<History> {
        &self.history
    }
}

impl Drop for HistoryHandle {
    fn drop(&mut self) {
        self.history.closing.store(true, Ordering::Release);
        self.history.wake.notify_all();
        if let Some(t) = self.applier.take() {
            let _ = t.join();
        }
        if let Err(e) = self.history.apply(true) {
            tracing::error!("final history commit failed: {e}");
        }
    }
}

pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl History {
    /// Opens the history of `store`, applying journaled changes a crash
    /// left unapplied. Must run before the inode map is opened (replay may
    /// restore inode-map entries).
    pub fn open(store: &Store, background: bool) -> Result<HistoryHandle> {
        History::open_with_clock(store, background, clock::system())
    }

    /// [`History::open`] with the clock that stamps versions and that
    /// time-dependent rules above history (retention, interval capture)
    /// read.
    pub fn open_with_clock(
        store: &Store,
        background: bool,
        clock: Arc<dyn clock::Clock>,
    ) -> Result<HistoryHandle> {
        let db = store.index();
        let chunks = Arc::new(store.chunk_store()?);
        let (journal_a, recs_a) = store.journal(0)?;
        let (journal_b, recs_b) = store.journal(1)?;
        // Every change up to `next_seq - 1` is in the index, which is all
        // durable: a durable commit by anyone else (the inode map's flush)
        // makes history's non-durable applies durable too, without moving
        // the durable mark. Those changes are not replayed, and above all
        // not renumbered: a power cut may have taken their journal records,
        // and a replay of fewer changes would move the next number back
        // onto them.
        let applied =
            tables::meta_get(&db, META_NEXT_SEQ)?.map_or(Seq::ZERO, |n| Seq::new(n).prev());
        let durable = tables::meta_get(&db, META_DURABLE_SEQ)?
            .map_or(Seq::ZERO, Seq::new)
            .max(applied);
        let mut replay = Vec::new();
        for rec in recs_a.iter().chain(recs_b.iter()) {
            let op = Op::decode(rec).map_err(HistoryError::Corrupt)?;
            if op.seq > durable {
                replay.push(op);
            }
        }
        let replay = replayable(&chunks, durable, replay);
        let space = store.space();
        let held_back = replay_into_index(&db, &chunks, &space, durable, replay)?;
        let next_seq = tables::meta_get(&db, META_NEXT_SEQ)?.map_or(Seq::new(1), Seq::new);
        let last_time = tables::meta_get(&db, META_LAST_TIME)?.unwrap_or(0) as i64;
        let mut journals = [journal_a, journal_b];
        if held_back.is_empty() {
            for j in &mut journals {
                j.reset()?;
            }
        }
        let mut state = WriteState {
            next_seq,
            last_time,
            pinned: None,
            journals,
            active: 0,
            queue: Vec::new(),
            undurable: Vec::new(),
            applied_generation: 0,
            apply_failed: false,
            latest: HashMap::new(),
            dirents: HashMap::new(),
            touched: HashMap::new(),
        };
        // Still only in the journals, which are kept until a durable
        // apply has them in the index (as a full store's queue is).
        state.apply_failed = !held_back.is_empty();
        for op in held_back {
            state.queue_op(op);
        }
        let history = Arc::new(History {
            db,
            space,
            chunks,
            state: Mutex::new(state),
            apply_lock: Mutex::new(()),
            wake: Condvar::new(),
            closing: AtomicBool::new(false),
            maintenance: Mutex::new(()),
            build_gate: parking_lot::RwLock::new(()),
            unrecorded: std::sync::atomic::AtomicU64::new(0),
            removals: std::sync::atomic::AtomicU64::new(0),
            removal_hooks: Mutex::new(Vec::new()),
            clock,
        });
        let applier = if background {
            let bg = history.clone();
            Some(
                std::thread::Builder::new()
                    .name("history-apply".into())
                    .spawn(move || bg.apply_loop())
                    .map_err(|source| HistoryError::Spawn {
                        what: "history applier",
                        source,
                    })?,
            )
        } else {
            None
        };
        Ok(HistoryHandle { history, applier })
    }

    pub fn clock(&self) -> &Arc<dyn clock::Clock> {
        &self.clock
    }

    /// The time now, by this history's clock.
    pub fn now_ns(&self) -> i64 {
        self.clock.now_ns()
    }

    pub fn chunks(&self) -> &Arc<ChunkStore> {
        &self.chunks
    }

    /// Held by a version build from its first chunk put until its commit
    /// (see `build_gate`); re-entrant.
    pub fn building(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        self.build_gate.read_recursive()
    }

    /// Records a change; returns its sequence number. Once this returns,
    /// the change survives a kill of the daemon.
    pub fn commit(&self, mut draft: Draft) -> Result<Seq> {
        self.space.check()?;
        let mut st = self.state.lock();
        self.keep_backdated_in_order(&st, &mut draft)?;
        let seq = st.next_seq;
        let time_ns = st
            .pinned
            .unwrap_or_else(|| self.clock.now_ns().max(st.last_time + 1));
        let fresh = self.chunks.take_unjournaled();
        let mut op = Op {
            seq,
            time_ns,
            versions: draft.versions,
            dirents: draft.dirents,
            // Manifests are chunks since store format 3; the field stays
            // for journals written by format 2.
            manifests: Vec::new(),
            chunks: fresh
                .iter()
                .map(|(h, l)| (*h, l.encode().to_vec()))
                .collect(),
            bind: draft.bind,
            unbind: draft.unbind,
            tags: draft.tags,
            backdated: draft.backdated,
        };
        for (_, v) in &mut op.versions {
            v.time_ns = time_ns;
        }
        let active = st.active;
        if let Err(e) = st.journals[active].append(&op.encode()) {
            self.chunks.unjournal(fresh.iter().map(|(h, _)| *h));
            self.space.note(&e);
            return Err(e.into());
        }
        st.queue_op(op);
        Ok(seq)
    }

    /// A backdated entry goes in at its instant only if nothing was
    /// recorded for its name since (its maker read the name's last entry
    /// before this commit, and a change through the mount may have come in
    /// between); otherwise it is recorded as of now, behind that change.
    fn keep_backdated_in_order(&self, st: &WriteState, draft: &mut Draft) -> Result<()> {
        let mut now = Vec::new();
        for b in std::mem::take(&mut draft.backdated) {
            let d = &b.dirent;
            let latest = match st.dirents.get(&(d.parent, d.name.clone())) {
                Some((_, seq)) => Some(*seq),
                None => tables::dirent_seq_at(&self.db, d.parent, &d.name, Seq::MAX)?
                    .map(|(_, seq)| seq),
            };
            if latest.is_some_and(|seq| seq >= b.at) {
                now.push(b.dirent);
            } else {
                draft.backdated.push(b);
            }
        }
        draft.dirents.extend(now);
        Ok(())
    }

    /// Until the guard drops, every change recorded gets one time, so that
    /// a view of the past shows all of them or none (a sandbox commit:
    /// `.history/@T/` is the tree before it or after it, never between).
    /// The times of later changes go on increasing from it.
    pub fn one_instant(&self) -> OneInstant<'_> {
        let mut st = self.state.lock();
        let t = self.clock.now_ns().max(st.last_time + 1);
        st.pinned = Some(t);
        OneInstant(self)
    }

    /// The sequence number of the newest change recorded (ZERO: none).
    pub fn last_seq(&self) -> Seq {
        Seq::new(self.state.lock().next_seq.get().saturating_sub(1))
    }

    /// Ok if changes can be recorded now; ENOSPC while the store is full
    /// (a change made anyway would go unrecorded).
    pub fn writable(&self) -> Result<()> {
        Ok(self.space.check()?)
    }

    /// What poisoned the store (a failed fsync or write), if anything did:
    /// changes are then refused until the daemon restarts.
    pub fn poisoned(&self) -> Option<String> {
        self.space.poisoned()
    }

    /// `sync`, except that a full store is not an error: read-only
    /// callers (status, fsck) then read what the index holds.
    pub fn sync_unless_full(&self) -> Result<()> {
        match self.sync() {
            Err(HistoryError::Store(e)) if self.space.note(&e) => {
                tracing::debug!(
                    "the store is full; reading the index as it is ({} change(s) queued): {e}",
                    self.queued()
                );
                Ok(())
            }
            other => other,
        }
    }

    /// Runs `hook` whenever the store becomes full (the cleaner applies
    /// retention then).
    pub fn on_store_full(&self, hook: Box<dyn Fn() + Send + Sync>) {
        self.space.on_full(hook);
    }

    /// Runs `hook` after each act that took versions away, once its commit
    /// is durable and no history lock is held (the hook may wait on the
    /// kernel, which may wait on requests that need history).
    pub fn on_removal(&self, hook: Box<dyn Fn() + Send + Sync>) {
        self.removal_hooks.lock().push(hook);
    }

    /// Changes each time versions are taken away; what was checked against
    /// history at one value stays valid while it holds.
    pub fn removal_epoch(&self) -> u64 {
        self.removals.load(Ordering::Acquire)
    }

    /// Called with no history lock held, after versions went away.
    fn removed(&self) {
        self.removals.fetch_add(1, Ordering::AcqRel);
        for hook in self.removal_hooks.lock().iter() {
            hook();
        }
    }

    /// Whether an ingest of the whole tree completed for this store.
    pub fn ingest_complete(&self) -> Result<bool> {
        Ok(tables::meta_get(self.db(), META_INGEST_COMPLETE)?.is_some())
    }

    /// Notes (durably) that an ingest of the whole tree completed.
    pub fn set_ingest_complete(&self) -> Result<()> {
        let txn = self
            .db()
            .begin_write()
            .map_err(|e| HistoryError::Store(index_error(e)))?;
        tables::meta_put(
            &txn,
            META_INGEST_COMPLETE,
            self.clock.now_ns().max(0) as u64,
        )?;
        txn.commit()
            .map_err(|e| HistoryError::Store(index_error(e)))?;
        Ok(())
    }

    /// A change went ahead that a full store could not record.
    pub fn note_unrecorded(&self, what: &str) {
        self.unrecorded.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("history: the store is full; {what} was not recorded");
    }

    /// How many changes went unrecorded for lack of space since the mount.
    pub fn unrecorded(&self) -> u64 {
        self.unrecorded.load(Ordering::Relaxed)
    }

    /// Makes every committed change durable (the journal too, for fsync).
    pub fn sync(&self) -> Result<()> {
        self.apply(true)
    }

    /// A write transaction for maintenance (gc, prune, repair) that edits
    /// rows changes also write: every change applied before it is made
    /// durable first, and none is applied until it commits. Otherwise a
    /// change applied without durability before it would be applied again
    /// by the next durable apply (or replayed after a crash) over its
    /// edits: a version pruned would come back, a chunk location moved by
    /// compaction would point into a deleted pack.
    pub(crate) fn maintenance_txn(&self) -> Result<MaintenanceTxn<'_>> {
        let applying = self.apply_lock.lock();
        self.apply_held(true)?;
        let txn = self.db.begin_write().map_err(tables::err)?;
        Ok(MaintenanceTxn {
            txn,
            _applying: applying,
        })
    }

    /// Applies queued changes to the index. Durable: also fsyncs packs and
    /// the index, then empties the journal that held them.
    fn apply(&self, durable: bool) -> Result<()> {
        let _one = self.apply_lock.lock();
        self.apply_held(durable)
    }

    /// [`History::apply`] with `apply_lock` held.
    fn apply_held(&self, durable: bool) -> Result<()> {
        let generation = self.db.generation();
        let (batch, reapply, retired_journal, last_seq) = {
            let mut st = self.state.lock();
            let batch = std::mem::take(&mut st.queue);
            // A durable apply always writes them again: the index may have
            // been re-opened (losing them) by a failure this apply's own
            // transaction start detects, after `generation` was read.
            let reapply = if durable || st.applied_generation != generation || st.apply_failed {
                st.undurable.clone()
            } else {
                Vec::new()
            };
            let retired = if durable {
                let old = st.active;
                st.active = 1 - old;
                Some(old)
            } else {
                None
            };
            (batch, reapply, retired, st.next_seq.prev())
        };
        if batch.is_empty() && reapply.is_empty() && !durable {
            return Ok(());
        }
        if durable {
            self.chunks.sync()?;
        }
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        let ops: Vec<Op> = reapply.iter().chain(batch.iter()).cloned().collect();
        let txn_result = tables::apply_ops_with(&self.db, &ops, durability, |txn| {
            if durable {
                tables::meta_put(txn, META_DURABLE_SEQ, last_seq.get())?;
            }
            Ok(())
        });
        if let Err(e) = txn_result {
            if let HistoryError::Store(s) = &e {
                self.space.note(s);
            }
            // Put the batch back: its changes are still journaled and must
            // become visible once the index accepts writes again.
            let mut st = self.state.lock();
            st.apply_failed = true;
            let newer = std::mem::take(&mut st.queue);
            st.queue = batch;
            st.queue.extend(newer);
            if let Some(old) = retired_journal {
                st.active = old;
            }
            return Err(e);
        }
        self.chunks.applied(
            batch
                .iter()
                .flat_map(|op| op.chunks.iter().map(|(h, _)| *h)),
        );
        let mut st = self.state.lock();
        st.applied_generation = generation;
        st.apply_failed = false;
        if durable {
            st.undurable.clear();
        } else {
            st.undurable.extend(batch.iter().cloned());
        }
        if let Some(last) = batch.last().map(|op| op.seq) {
            st.latest.retain(|_, (seq, _)| *seq > last);
            st.touched.retain(|_, seq| *seq > last);
            let pending: std::collections::HashSet<(ObjectId, Vec<u8>)> = st
                .queue
                .iter()
                .flat_map(|op| {
                    let late = op.backdated.iter().map(|b| &b.dirent);
                    op.dirents
                        .iter()
                        .chain(late)
                        .map(|d| (d.parent, d.name.clone()))
                })
                .collect();
            st.dirents.retain(|k, _| pending.contains(k));
        }
        if let Some(old) = retired_journal {
            st.journals[old].reset()?;
        }
        Ok(())
    }

    fn apply_loop(&self) {
        // A failing store (disk full) is retried every interval but logged
        // once per minute, not ten times a second.
        let mut last_report: Option<std::time::Instant> = None;
        loop {
            {
                let mut st = self.state.lock();
                if !self.closing.load(Ordering::Acquire) {
                    self.wake.wait_for(&mut st, APPLY_INTERVAL);
                }
            }
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            let idle = {
                let st = self.state.lock();
                st.queue.is_empty() && st.undurable.is_empty()
            };
            if idle {
                continue;
            }
            match self.apply(true) {
                Ok(()) => {
                    if last_report.take().is_some() {
                        tracing::info!("history commits succeed again");
                    }
                }
                Err(e) => {
                    if last_report.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                        tracing::error!(
                            "history commit failed (changes stay journaled; retrying): {e}"
                        );
                        last_report = Some(std::time::Instant::now());
                    }
                }
            }
        }
    }

    /// Makes queued changes visible to index reads (not necessarily
    /// durable: the journal still holds them until the next durable apply).
    ///
    /// On a full store the apply fails; queries then read what the index
    /// holds (the queued changes stay journaled and appear once there is
    /// room), so `status`, `fsck` and time travel keep working.
    pub fn settle(&self) -> Result<()> {
        if self.state.lock().queue.is_empty() {
            // A background apply may hold a batch taken from the queue and
            // not yet written: wait for it.
            drop(self.apply_lock.lock());
            return Ok(());
        }
        match self.apply(false) {
            Err(HistoryError::Store(e)) if self.space.note(&e) => {
                tracing::debug!("queries read the index without queued changes: {e}");
                Ok(())
            }
            other => other,
        }
    }

    /// [`History::settle`] for a query that reads only the versions and
    /// directory entries of `objs`: none of them in a change not yet
    /// applied, the index already answers it as settling would, and the
    /// query need not wait for an apply (a past lookup during writes
    /// elsewhere). Changes applied without durability count as applied
    /// only while the index they went to is the one open.
    pub fn settle_for(&self, objs: &[ObjectId]) -> Result<()> {
        {
            let st = self.state.lock();
            let index_holds_applied =
                !st.apply_failed && st.applied_generation == self.db.generation();
            if index_holds_applied && !objs.iter().any(|o| st.touched.contains_key(o)) {
                return Ok(());
            }
        }
        self.settle()
    }

    /// Changes committed but not yet in the index (a full store holds
    /// them back).
    pub fn queued(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// The newest version of `obj`, including queued changes.
    pub fn latest(&self, obj: ObjectId) -> Result<Option<(Seq, Arc<Version>)>> {
        if let Some(hit) = self.state.lock().latest.get(&obj) {
            return Ok(Some(hit.clone()));
        }
        Ok(tables::version_at(&self.db, obj, Seq::MAX)?.map(|(s, v)| (s, Arc::new(v))))
    }

    /// A manifest if it is already readable, without waiting for queued
    /// changes to be applied (for choosing delta bases, where a miss costs
    /// only space).
    pub fn recent_manifest(&self, id: &store::Hash) -> Result<Option<Manifest>> {
        let bytes = match tables::manifest_bytes(&self.db, id)? {
            Some(b) => b,
            None => match self.chunks.get(id) {
                Ok(b) => b,
                Err(_) => return Ok(None),
            },
        };
        Ok(Manifest::decode(&bytes))
    }

    /// What `name` in `parent` names now according to history: `None` if
    /// history has no entry, `Some(None)` if it was removed.
    pub fn current_dirent(
        &self,
        parent: ObjectId,
        name: &[u8],
    ) -> Result<Option<Option<ObjectId>>> {
        Ok(self
            .current_dirent_seq(parent, name)?
            .map(|(child, _)| child))
    }

    /// [`History::current_dirent`], with the sequence number it took
    /// effect at (a backdated entry's earlier one).
    pub fn current_dirent_seq(
        &self,
        parent: ObjectId,
        name: &[u8],
    ) -> Result<Option<(Option<ObjectId>, Seq)>> {
        if let Some(hit) = self.state.lock().dirents.get(&(parent, name.to_vec())) {
            return Ok(Some(*hit));
        }
        tables::dirent_seq_at(&self.db, parent, name, Seq::MAX)
    }

    pub(crate) fn db(&self) -> &Arc<Index> {
        &self.db
    }
}

/// Applies the journaled changes `replay` (from `replayable`) to the
/// index, durably. A full store cannot take them: the mount must still
/// come up, or nothing could be deleted to make room. They are returned
/// then, to stay queued and journaled until the index takes them (the
/// reserve file is released first and the apply tried again).
fn replay_into_index(
    db: &Index,
    chunks: &ChunkStore,
    space: &store::Space,
    durable: Seq,
    replay: Vec<Op>,
) -> Result<Vec<Op>> {
    if replay.is_empty() {
        return Ok(replay);
    }
    tracing::info!("replaying {} journaled change(s)", replay.len());
    // Durable up to the last one replayed: the journals are emptied next,
    // so the next open must not look for these again (it would find the
    // next journaled change "missing" and drop it with everything after
    // it).
    let last = replay.last().map_or(durable, |op| op.seq);
    let apply = || {
        tables::apply_ops_with(db, &replay, Durability::Immediate, |txn| {
            tables::meta_put(txn, META_DURABLE_SEQ, last.get())
        })
    };
    let mut tries = 0;
    loop {
        match apply() {
            Ok(()) => break,
            Err(HistoryError::Store(e)) if space.note(&e) => {
                tries += 1;
                if tries == 2 {
                    tracing::warn!(
                        "{} journaled change(s) wait for room in the store to reach its index",
                        replay.len()
                    );
                    return Ok(replay);
                }
            }
            Err(e) => return Err(e),
        }
    }
    chunks.applied(
        replay
            .iter()
            .flat_map(|op| op.chunks.iter().map(|(h, _)| *h)),
    );
    Ok(Vec::new())
}

/// The journaled changes beyond the last durable commit that can be
/// applied: an unbroken run of sequence numbers from `durable + 1` whose
/// chunks are all on disk and intact. After a kill the journal and packs
/// hold everything written; after a power cut either may have lost
/// unsynced writes (none of them acknowledged durable), and a change past
/// a lost one, or naming a lost chunk, would leave a dangling reference:
/// the run ends there.
fn replayable(chunks: &ChunkStore, durable: Seq, mut ops: Vec<Op>) -> Vec<Op> {
    ops.sort_by_key(|op| op.seq);
    ops.dedup_by_key(|op| op.seq);
    let total = ops.len();
    let mut good = Vec::with_capacity(total);
    for (expected, op) in (durable.get() + 1..).map(Seq::new).zip(ops) {
        if op.seq != expected {
            tracing::warn!(
                "journal: change #{expected} is missing; {} later change(s) are dropped",
                total - good.len()
            );
            break;
        }
        let mut staged = Vec::new();
        let mut intact = true;
        for (h, enc) in &op.chunks {
            let ok = store::chunks::Location::decode(enc).is_some_and(|loc| {
                // Later chunks of the run may be deltas against this one.
                chunks.stage(*h, loc);
                staged.push(*h);
                chunks.read_at(h, &loc).is_ok()
            });
            if !ok {
                intact = false;
                break;
            }
        }
        if !intact {
            chunks.applied(staged);
            tracing::warn!(
                "journal: change #{} names a chunk that did not reach the disk; it and later changes are dropped",
                op.seq
            );
            break;
        }
        good.push(op);
    }
    good
}

impl From<redb::Error> for HistoryError {
    fn from(e: redb::Error) -> Self {
        HistoryError::Store(index_error(e))
    }
}

/// Read transactions used by queries.
pub(crate) fn read_txn(db: &Index) -> Result<redb::ReadTransaction> {
    db.begin_read()
        .map_err(|e| HistoryError::Store(index_error(e)))
}
