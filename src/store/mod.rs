//! The store: the persistent, crash-safe state of a chronofs mount.
//!
//! Owns: the on-disk store directory (by default `SRC/.chronofs`), its format
//! version, and the embedded key-value index (redb). Today it holds the
//! persistent inode map; the history index and chunk packs join it later.
//! Uses: nothing of chronofs but `sys`-free std I/O. Must not know about
//! FUSE, paths inside the mount, or credentials.

pub mod branches;
pub mod chunks;
pub mod inomap;
pub mod io;
pub mod journal;
mod registry;
pub use registry::REGISTRY_FILE;
#[cfg(test)]
pub mod sim;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, TableDefinition};

pub use branches::{
    is_snapshot_branch, BranchIdent, BranchRecord, BranchRoot, BranchSet, BranchSetLog,
    BranchState, Snapshot,
};
pub use chunks::{ChunkStore, Hash, Unsynced};
pub use inomap::{BackingKey, DevAlias, InodeMap};
pub use io::{Guarded, StoreIo};
pub use journal::Journal;
pub use redb;

/// The format written by this build. Bump on any incompatible change to a
/// key or value layout, and record it in docs/FORMAT.md.
pub const FORMAT_VERSION: u32 = 8;
/// Older formats this build upgrades in place, by rewriting the version
/// number only: format 1 had no history tables (they are created on first
/// use); format 2 had no delta chunks (it never holds any, and format 3
/// reads everything it does hold); format 3 had no `pruned` and `audit`
/// tables (created on first use). A format-3 build refuses a format-4
/// store: it would read a pruned object's past as its live state. Format
/// 4 had no lost versions (version content variant 5), which a format-4
/// build could not decode. Format 5 had no `branches` table (created on
/// first use): its inode-map keys name a union's branch by position, and
/// an empty table gives position *i* id *i*, so they keep their meaning. A
/// format-5 build refuses a format-6 store: it would read a reordered
/// union's keys by position. Format 6 kept the branch tables in the
/// index; opening one moves them to the registry (`registry.rs`). A
/// format-6 build refuses a format-7 store: it would change branches in
/// tables this build no longer reads. Format 7 had no backdated directory
/// entries (`chain_moved`, journal records of format 2): a format-7 build
/// refuses a format-8 store, whose fsck would report them as tampering.
const UPGRADABLE: &[u64] = &[1, 2, 3, 4, 5, 6, 7];

/// The index's page cache. redb's default (1 GiB) lets it grow with the
/// index, i.e. with every file ever recorded, and the daemon's resident
/// memory with it; the kernel's page cache keeps the file's pages warm
/// beyond this.
const INDEX_CACHE: usize = 32 << 20;

pub const INDEX_FILE: &str = "index.redb";
/// The hard-link index a mount keeps in a branch's root (a union's
/// copied-up links, a clone's linked files), hidden like the store.
pub const LINK_INDEX_DIR: &str = ".chronofs-index";
/// A new index is built under this name and renamed when complete.
const INDEX_NEW: &str = "index.redb.new";

/// One redb database file of the store: its name, the name it is built
/// under, and the format a new one is created with (`None`: none yet; the
/// first transaction writes it).
#[derive(Clone, Copy)]
struct DbFile {
    name: &'static str,
    building: &'static str,
    created_format: Option<u32>,
}

/// The index: history, the inode map.
const MAIN_DB: DbFile = DbFile {
    name: INDEX_FILE,
    building: INDEX_NEW,
    created_format: Some(FORMAT_VERSION),
};
pub const PACK_DIR: &str = "packs";
const JOURNAL_FILES: [&str; 2] = ["journal-0", "journal-1"];
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_FORMAT: &str = "format_version";
/// The store's identity (`StoreId`), made at the first mount with history.
const META_STORE_ID: &str = "store_id";
/// How long to wait for another process (typically a daemon that is just
/// exiting after an unmount) to release the index.
const INUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The store directory is a symbolic link (see `Store::open`).
    #[error("store {path} is a symbolic link; refusing to follow it")]
    Symlink { path: PathBuf },
    /// The store directory is writable by other users (see `Store::open`).
    #[error(
        "store {path} is writable by users other than its owner (mode {mode:04o}): any of them \
         could replace its files; `chmod go-w` it or give another directory"
    )]
    OpenToOthers { path: PathBuf, mode: u32 },
    #[error("store {path} is in use by another chronofs process")]
    InUse { path: PathBuf },
    #[error("store {path} has format version {found}; this chronofs reads version {supported}")]
    UnsupportedFormat {
        path: PathBuf,
        found: u64,
        supported: u32,
    },
    #[error("store index {path} is damaged or not a chronofs index: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    /// A read or write of the index's file failed. redb then refuses
    /// every transaction until the database is opened again (see
    /// `Index::reopen`).
    #[error("store index: {0}")]
    IndexIo(#[source] std::io::Error),
    /// An earlier write of the index failed (it was reported then) and
    /// the database could not be re-opened since: nothing says why.
    #[error("store index: an earlier write failed and the index is not re-opened yet")]
    IndexFailedEarlier,
    /// redb found a damaged page, or a record of ours does not decode.
    #[error("store index is damaged: {0}")]
    IndexCorrupt(String),
    /// A table's key or value types, or the file format, differ from
    /// this build's.
    #[error("store index layout differs from this build's: {0}")]
    IndexLayout(String),
    /// Another process or transaction holds what this one needs.
    #[error("store index is busy: {0}")]
    IndexBusy(String),
    /// A transaction failed part way through an earlier operation (that
    /// failure was reported) and can no longer commit.
    #[error("store index transaction abandoned after an earlier failure in it")]
    TransactionPoisoned,
    /// The index's storage backend lacks an operation redb needs.
    #[error("store index backend does not support an operation redb needs")]
    IndexUnsupported,
    /// redb refused a use of its API (a transaction still in use, a table
    /// opened twice, a poisoned lock): a chronofs bug, not the disk's.
    #[error("store index misused (a chronofs bug): {0}")]
    IndexMisuse(String),
    /// A record too large for its container: a chunk over 4 GiB, a
    /// journal record over its limit, a value over redb's limit.
    #[error("{what} of {size} bytes is too large for the store")]
    TooLarge { what: &'static str, size: u64 },
    /// An earlier fsync (or write) of the store failed: nothing more is
    /// written until the daemon restarts (see `io::Health`).
    #[error("{0}")]
    Poisoned(String),
    /// A background thread of the store could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Spawn {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A name the store keeps unique is taken (a snapshot's).
    #[error("{0}")]
    Exists(String),
    #[error("chunk {0} is referenced but missing from the store")]
    MissingChunk(Hash),
    #[error("chunk {hash} is damaged: {detail}")]
    CorruptChunk { hash: Hash, detail: String },
    /// A pack the index points into is gone, cut short, or not what its
    /// header must say: the chunks read from it are damaged (`fsck
    /// --repair` recovers them from live files or marks their versions
    /// lost).
    #[error("pack {path} is damaged: {detail}")]
    DamagedPack { path: PathBuf, detail: String },
    /// A journal whose header is not a chronofs journal's: the changes in
    /// it cannot be replayed.
    #[error(
        "journal {path} is damaged: {detail}; the changes it holds that the index lacks \
         cannot be replayed: move it aside to mount without them, then run `chronofs fsck`"
    )]
    DamagedJournal { path: PathBuf, detail: String },
}

impl StoreError {
    /// The errno a file system call reports when the store fails under it.
    /// No wildcard arm: a new variant must choose its errno here.
    pub fn errno(&self) -> i32 {
        match self {
            StoreError::Io { source, .. } => io_errno(source),
            StoreError::Symlink { .. } => libc::ELOOP,
            StoreError::OpenToOthers { .. } => libc::EPERM,
            StoreError::InUse { .. } => libc::EBUSY,
            StoreError::UnsupportedFormat { .. } => libc::EPROTO,
            StoreError::Corrupt { .. } => libc::EUCLEAN,
            StoreError::IndexIo(e) => io_errno(e),
            // The cause was an I/O error, reported when it happened.
            StoreError::IndexFailedEarlier => libc::EIO,
            StoreError::IndexCorrupt(_) => libc::EUCLEAN,
            StoreError::IndexLayout(_) => libc::EPROTO,
            StoreError::IndexBusy(_) => libc::EBUSY,
            StoreError::TransactionPoisoned => libc::EIO,
            StoreError::IndexUnsupported => libc::EOPNOTSUPP,
            // A bug has no errno of its own; the caller sees a failed I/O.
            StoreError::IndexMisuse(_) => libc::EIO,
            StoreError::TooLarge { .. } => libc::EFBIG,
            StoreError::Exists(_) => libc::EEXIST,
            StoreError::Poisoned(_) => libc::EIO,
            StoreError::Spawn { source, .. } => io_errno(source),
            // Damaged data reads as a failed read, as a bad disk block does.
            StoreError::MissingChunk(_)
            | StoreError::CorruptChunk { .. }
            | StoreError::DamagedPack { .. } => libc::EIO,
            StoreError::DamagedJournal { .. } => libc::EUCLEAN,
        }
    }

    /// A failed store file operation; a poisoned store's refusal keeps its
    /// own variant.
    pub fn from_io(path: PathBuf, source: std::io::Error) -> StoreError {
        match poisoned_cause(&source) {
            Some(why) => StoreError::Poisoned(why),
            None => StoreError::Io { path, source },
        }
    }
}

/// An I/O error's errno: the system's own when it has one, else the one
/// its kind stands for (errors made in user space carry no errno).
pub fn io_errno(e: &std::io::Error) -> i32 {
    if let Some(errno) = e.raw_os_error() {
        return errno;
    }
    use std::io::ErrorKind as K;
    // ErrorKind is non-exhaustive: kinds without an errno of their own
    // (and kinds added later) are failed I/O.
    match e.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::AlreadyExists => libc::EEXIST,
        K::WouldBlock => libc::EAGAIN,
        K::InvalidInput => libc::EINVAL,
        K::TimedOut => libc::ETIMEDOUT,
        K::Interrupted => libc::EINTR,
        K::Unsupported => libc::EOPNOTSUPP,
        K::OutOfMemory => libc::ENOMEM,
        K::StorageFull => libc::ENOSPC,
        K::FileTooLarge => libc::EFBIG,
        K::NotADirectory => libc::ENOTDIR,
        K::IsADirectory => libc::EISDIR,
        K::DirectoryNotEmpty => libc::ENOTEMPTY,
        K::ReadOnlyFilesystem => libc::EROFS,
        K::CrossesDevices => libc::EXDEV,
        K::InvalidFilename => libc::ENAMETOOLONG,
        _ => libc::EIO,
    }
}

fn poisoned_cause(e: &std::io::Error) -> Option<String> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<io::PoisonedIo>())
        .map(|p| p.to_string())
}

/// Converts a redb error into what it means for the store.
pub fn index_error(e: impl Into<redb::Error>) -> StoreError {
    use redb::Error as R;
    match e.into() {
        R::Io(io) => match poisoned_cause(&io) {
            Some(why) => StoreError::Poisoned(why),
            None => StoreError::IndexIo(io),
        },
        R::PreviousIo => StoreError::IndexFailedEarlier,
        R::Corrupted(what) => StoreError::IndexCorrupt(what),
        R::ValueTooLarge(size) => StoreError::TooLarge {
            what: "an index value",
            size: size as u64,
        },
        R::TransactionPoisoned => StoreError::TransactionPoisoned,
        R::Unsupported => StoreError::IndexUnsupported,
        e @ (R::UpgradeRequired(_)
        | R::TableTypeMismatch { .. }
        | R::TableIsMultimap(_)
        | R::TableIsNotMultimap(_)
        | R::TypeDefinitionChanged { .. }
        | R::TableDoesNotExist(_)) => StoreError::IndexLayout(e.to_string()),
        e @ (R::DatabaseAlreadyOpen
        | R::LockProtocolMismatch
        | R::WouldBlock
        | R::TransactionInProgress) => StoreError::IndexBusy(e.to_string()),
        // The rest are uses redb refuses (redb::Error is non-exhaustive,
        // so new kinds land here too).
        other => StoreError::IndexMisuse(other.to_string()),
    }
}

/// Why the index at `path` does not open.
fn open_error(path: PathBuf, e: redb::DatabaseError) -> StoreError {
    use redb::{DatabaseError as D, StorageError as S};
    match e {
        D::DatabaseAlreadyOpen | D::LockProtocolMismatch => StoreError::InUse { path },
        D::Storage(S::Io(source)) => StoreError::from_io(path, source),
        D::Storage(S::Corrupted(detail)) => StoreError::Corrupt { path, detail },
        other => index_error(other),
    }
}

/// An open store directory.
pub struct Store {
    dir: PathBuf,
    io: Arc<Guarded>,
    db: Arc<Index>,
    /// The branch registry (`registry.rs`): its own file, so that a branch
    /// change's durable record waits neither for history's transactions
    /// nor for the fsync of their pages.
    registry: Arc<Index>,
    space: Arc<Space>,
}

/// Whether the store can take writes: free space (once a write failed for
/// the lack of it) and health (once an fsync failed). While the store is
/// full, history refuses new changes with ENOSPC (rather than letting them
/// happen unrecorded), until the file system has room again; once it is
/// poisoned, with EIO until the daemon restarts.
pub struct Space {
    io: Arc<Guarded>,
    full: std::sync::atomic::AtomicBool,
    /// Called when the store becomes full (the cleaner applies retention
    /// at once).
    on_full: parking_lot::Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

/// A file of zeros kept in the store while it has room, removed when the
/// store fills up: the index then has room to record the removals that
/// free space (and their records do not wait for the space they free).
const RESERVE_FILE: &str = "reserve";
/// The reserve's size: 1/64 of the file system, from 1 to 8 MiB.
fn reserve_size(fs_bytes: u64) -> u64 {
    (fs_bytes / 64).clamp(1 << 20, 8 << 20)
}

/// The room a full store must have again before history writes resume:
/// this much, or a tenth of a smaller file system (at least 4 MiB).
const SPACE_TO_RESUME: u64 = 64 << 20;

impl Space {
    /// Notes a failed store write; true if it was for lack of space.
    pub fn note(&self, e: &StoreError) -> bool {
        let full = e.errno() == libc::ENOSPC || e.errno() == libc::EDQUOT;
        if full && !self.full.swap(true, std::sync::atomic::Ordering::AcqRel) {
            tracing::error!(
                "store {} is full: changes are refused (ENOSPC) until it has room again; deleting still works",
                self.io.path("").display()
            );
            match self.io.remove(RESERVE_FILE) {
                Ok(()) => tracing::warn!("store reserve released for the index"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("store reserve cannot be released: {e}"),
            }
            if let Some(hook) = self.on_full.lock().as_ref() {
                hook();
            }
        }
        full
    }

    /// Runs `hook` whenever the store becomes full.
    pub fn on_full(&self, hook: Box<dyn Fn() + Send + Sync>) {
        *self.on_full.lock() = Some(hook);
    }

    /// Keeps the reserve file in place while the store has room (best
    /// effort: a store without one still works, deleting included).
    fn keep_reserve(&self) {
        if self
            .io
            .list("")
            .is_ok_and(|names| names.iter().any(|n| n == RESERVE_FILE))
        {
            return;
        }
        let Ok((free, total)) = self.io.free_bytes() else {
            return;
        };
        let size = reserve_size(total);
        if free < size.saturating_mul(4) {
            return;
        }
        let written = self
            .io
            .open(RESERVE_FILE, io::Create::New)
            .and_then(|f| f.allocate(size).and_then(|()| f.sync()));
        if let Err(e) = written {
            let _ = self.io.remove(RESERVE_FILE);
            tracing::debug!("store reserve not made: {e}");
        }
    }

    /// What poisoned the store, if an fsync or write of it failed.
    pub fn poisoned(&self) -> Option<String> {
        self.io.health().poisoned()
    }

    /// Ok if history may record; ENOSPC while the store is full, EIO once
    /// it is poisoned.
    pub fn check(&self) -> Result<(), StoreError> {
        if let Some(why) = self.poisoned() {
            return Err(StoreError::Poisoned(format!(
                "the store is poisoned by an earlier failure ({why})"
            )));
        }
        if !self.full.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let (free, total) = self.io.free_bytes().unwrap_or((0, 0));
        if free >= SPACE_TO_RESUME.min((total / 10).max(4 << 20)) {
            self.full.store(false, std::sync::atomic::Ordering::Release);
            tracing::warn!(
                "store {} has room again: recording resumes",
                self.io.path("").display()
            );
            self.keep_reserve();
            return Ok(());
        }
        Err(StoreError::Io {
            path: self.io.path(""),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        })
    }
}

/// The store's index database, re-openable. After a write of its file
/// fails (a full disk), redb refuses every later transaction until the
/// database is opened again; `begin_read`/`begin_write` do that once the
/// failure is seen, so history recovers when space returns instead of at
/// the next mount. The last durable commit is what reopening finds;
/// history re-applies its journal on top (applying is idempotent) and the
/// inode map re-flushes what it has pending.
pub struct Index {
    io: Arc<Guarded>,
    file: DbFile,
    /// Packs to fsync before any write transaction (see `Unsynced`).
    unsynced: Arc<Unsynced>,
    db: parking_lot::RwLock<Option<Arc<Database>>>,
    /// Held while re-opening; when the last re-open was reported.
    reopening: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Counts re-opens: a re-opened index has lost its non-durable commits.
    generation: std::sync::atomic::AtomicU64,
    /// The errno the last failed re-open met (0 if it met none): what a
    /// transaction that finds the index closed reports (a full disk stays
    /// ENOSPC).
    reopen_errno: std::sync::atomic::AtomicI32,
    /// A write of the open database's file failed: it is re-opened before
    /// its next use (`GuardedIndex::write_failed`).
    write_failed: Arc<std::sync::atomic::AtomicBool>,
}

impl Index {
    fn new(
        io: Arc<Guarded>,
        file: DbFile,
        db: Database,
        write_failed: Arc<std::sync::atomic::AtomicBool>,
    ) -> Index {
        Index {
            write_failed,
            io,
            file,
            unsynced: Arc::new(Unsynced::default()),
            db: parking_lot::RwLock::new(Some(Arc::new(db))),
            reopening: parking_lot::Mutex::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
            reopen_errno: std::sync::atomic::AtomicI32::new(0),
        }
    }

    /// Changes each time the database is re-opened (its non-durable
    /// commits are then gone).
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    fn current(&self) -> Result<Arc<Database>, redb::Error> {
        if self
            .write_failed
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            self.reopen();
        }
        if let Some(db) = self.db.read().clone() {
            return Ok(db);
        }
        self.reopen();
        if let Some(db) = self.db.read().clone() {
            return Ok(db);
        }
        match self.reopen_errno.load(std::sync::atomic::Ordering::Acquire) {
            0 => Err(redb::Error::PreviousIo),
            errno => Err(redb::Error::Io(std::io::Error::from_raw_os_error(errno))),
        }
    }

    /// Runs `f` on the database, re-opening it first if a previous write
    /// failed (and once more if `f` finds it failed).
    fn with<T, E: Into<redb::Error>>(
        &self,
        f: impl Fn(&Database) -> Result<T, E>,
    ) -> Result<T, redb::Error> {
        let db = self.current()?;
        match f(&db).map_err(Into::into) {
            Err(redb::Error::PreviousIo) if self.io.health().poisoned().is_none() => {
                drop(db);
                self.reopen();
                f(&*self.current()?).map_err(Into::into)
            }
            other => other,
        }
    }

    pub fn begin_read(&self) -> Result<redb::ReadTransaction, redb::Error> {
        self.with(|db| db.begin_read())
    }

    /// A write transaction. Every pack written so far is fsync'd once it
    /// is held: whatever this transaction commits (or makes durable of
    /// earlier non-durable commits) may name chunks in them. Not before:
    /// a non-durable commit could come between the sync and the lock,
    /// naming a chunk written meanwhile, and this transaction's durable
    /// commit would make it durable while its chunk is not.
    pub fn begin_write(&self) -> Result<redb::WriteTransaction, redb::Error> {
        let txn = self.with(|db| db.begin_write())?;
        self.unsynced.sync().map_err(redb::Error::Io)?;
        Ok(txn)
    }

    /// A write transaction that commits with `durability`. One that is
    /// not durable (`Durability::None`) does not fsync the packs first: a
    /// crash forgets it with everything it names, and the next durable
    /// transaction (whose `begin_write` fsyncs every pack written since)
    /// is what makes it durable. The writes in between cost no disk wait.
    pub fn begin_write_with(
        &self,
        durability: redb::Durability,
    ) -> Result<redb::WriteTransaction, redb::Error> {
        let mut txn = if matches!(durability, redb::Durability::None) {
            self.with(|db| db.begin_write())?
        } else {
            self.begin_write()?
        };
        txn.set_durability(durability)?;
        Ok(txn)
    }

    /// Closes the database and opens it again (waiting for transactions
    /// in flight to let go of the file); on failure it stays closed and
    /// the next use tries again. A poisoned store is not re-opened: its
    /// file may hold what a failed fsync left.
    pub fn reopen(&self) {
        if self.io.health().poisoned().is_some() {
            return;
        }
        let Some(mut reported) = self.reopening.try_lock() else {
            // Another thread is at it: wait for it.
            drop(self.reopening.lock());
            return;
        };
        *self.db.write() = None;
        match Store::open_index(&self.io, self.file, &self.write_failed) {
            Ok(db) => {
                // Reported once a minute: on a full disk every retry fails.
                if reported.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60)) {
                    tracing::warn!(
                        "store index {} re-opened after a failed write",
                        self.io.path(self.file.name).display()
                    );
                    *reported = Some(std::time::Instant::now());
                }
                *self.db.write() = Some(Arc::new(db));
                self.reopen_errno
                    .store(0, std::sync::atomic::Ordering::Release);
                self.generation
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            Err(e) => {
                self.reopen_errno
                    .store(e.errno(), std::sync::atomic::Ordering::Release);
                tracing::error!(
                    "store index {} cannot be re-opened yet: {e}",
                    self.io.path(self.file.name).display()
                )
            }
        }
    }
}

/// Writes a database's format number in `txn`.
fn put_format(txn: &redb::WriteTransaction, format: u32) -> Result<(), StoreError> {
    let mut table = txn.open_table(META).map_err(index_error)?;
    table
        .insert(META_FORMAT, u64::from(format))
        .map_err(index_error)?;
    Ok(())
}

impl Index {
    /// The format number the database records, if any.
    fn format(&self) -> Result<Option<u64>, StoreError> {
        let txn = self.begin_read().map_err(index_error)?;
        match txn.open_table(META) {
            Ok(table) => Ok(table
                .get(META_FORMAT)
                .map_err(index_error)?
                .map(|v| v.value())),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(index_error(e)),
        }
    }
}

/// What tells one store from another, kept in its `meta` table and
/// copied with it: a branch holding clones names the store their shared
/// bytes are in (`union::format::StoreStamp`), so that no other store
/// reads its marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreId(pub u64);

impl std::fmt::Display for StoreId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl Store {
    /// The store's identity, if it has one yet.
    pub fn id(&self) -> Result<Option<StoreId>, StoreError> {
        let txn = self.db.begin_read().map_err(index_error)?;
        match txn.open_table(META) {
            Ok(table) => Ok(table
                .get(META_STORE_ID)
                .map_err(index_error)?
                .map(|v| StoreId(v.value()))),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(index_error(e)),
        }
    }

    /// The store's identity, made (durably: a branch may name it next)
    /// if it has none. Unique in practice: a hash of the clock, the
    /// process and the store's place.
    pub fn ensure_id(&self) -> Result<StoreId, StoreError> {
        if let Some(id) = self.id()? {
            return Ok(id);
        }
        let mut seed = blake3::Hasher::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        seed.update(&now.as_nanos().to_le_bytes());
        seed.update(&std::process::id().to_le_bytes());
        seed.update(self.dir.as_os_str().as_encoded_bytes());
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&seed.finalize().as_bytes()[..8]);
        let id = StoreId(u64::from_le_bytes(bytes));
        let txn = self.db.begin_write().map_err(index_error)?;
        {
            let mut table = txn.open_table(META).map_err(index_error)?;
            if let Some(had) =
                redb::ReadableTable::get(&table, META_STORE_ID).map_err(index_error)?
            {
                return Ok(StoreId(had.value()));
            }
            table.insert(META_STORE_ID, id.0).map_err(index_error)?;
        }
        txn.commit().map_err(index_error)?;
        Ok(id)
    }

    /// Opens the store in `dir`, creating it (mode 0700) if it does not exist.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let io_err = |source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        };
        if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
            // Whoever can write SRC's root could otherwise point the store,
            // written by root, anywhere.
            return Err(StoreError::Symlink {
                path: dir.to_path_buf(),
            });
        }
        use std::os::unix::fs::MetadataExt;
        if let Some(meta) = std::fs::metadata(dir)
            .ok()
            .filter(|m| m.mode() & 0o022 != 0)
        {
            // The daemon, as root, would trust files anyone may put there
            // (`-o store=/tmp` used /tmp itself).
            return Err(StoreError::OpenToOthers {
                path: dir.to_path_buf(),
                mode: meta.mode() & 0o7777,
            });
        }
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(io_err)?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io_err)?;
            if let Some(parent) = dir.parent() {
                // The store's own name must survive a power cut.
                std::fs::File::open(parent)
                    .and_then(|d| d.sync_all())
                    .map_err(io_err)?;
            }
        }
        let disk = io::DiskIo::open(dir).map_err(io_err)?;
        Store::open_with(Box::new(disk), dir.to_path_buf())
    }

    /// Opens the store whose files `io` reaches; `dir` names it in messages.
    pub fn open_with(io: Box<dyn StoreIo>, dir: PathBuf) -> Result<Store, StoreError> {
        let io = Arc::new(Guarded::new(io, dir.clone()));
        let names = io
            .list("")
            .map_err(|e| StoreError::from_io(dir.clone(), e))?;
        if !names.iter().any(|n| n == INDEX_FILE) && Self::holds_packs(&io) {
            // A new, empty index would make every chunk garbage to gc.
            return Err(StoreError::Corrupt {
                path: dir.join(INDEX_FILE),
                detail: "it is missing, while the store holds packs; nothing was changed \
                         (bring the index back from a backup, or move the store aside to \
                         begin a new history)"
                    .into(),
            });
        }
        let main = Arc::new(Self::open_db(&io, &names, MAIN_DB)?);
        Self::check_format(&main)?;
        let registry = registry::open(&io, &names, &main)?;
        let store = Store {
            dir,
            io: io.clone(),
            db: main,
            registry,
            space: Arc::new(Space {
                io,
                full: std::sync::atomic::AtomicBool::new(false),
                on_full: parking_lot::Mutex::new(None),
            }),
        };
        Ok(store)
    }

    fn holds_packs(io: &Guarded) -> bool {
        io.list(PACK_DIR).is_ok_and(|packs| !packs.is_empty())
    }

    /// Opens the database `file` of the store whose files are `names`,
    /// creating it first if it is not one of them.
    fn open_db(io: &Arc<Guarded>, names: &[String], file: DbFile) -> Result<Index, StoreError> {
        if !names.iter().any(|n| n == file.name) {
            Self::create_index(io, file)?;
        } else {
            Self::refuse_empty(io, file)?;
        }
        let write_failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let db = Self::open_index(io, file, &write_failed)?;
        Ok(Index::new(io.clone(), file, db, write_failed))
    }

    /// An index file of no bytes is damage (one is made whole under
    /// another name before it takes its name: `create_index`), not a new
    /// index: taken as one, it would make every chunk garbage to gc.
    fn refuse_empty(io: &Guarded, file: DbFile) -> Result<(), StoreError> {
        let io_err = |e| StoreError::from_io(io.path(file.name), e);
        if io
            .open(file.name, io::Create::No)
            .map_err(io_err)?
            .len()
            .map_err(io_err)?
            > 0
        {
            return Ok(());
        }
        Err(StoreError::Corrupt {
            path: io.path(file.name),
            detail: "it is empty (0 bytes); nothing was changed (bring it back from a backup, \
                     or move the store aside to begin a new history)"
                .into(),
        })
    }

    /// Creates an empty index of the current format. It is built under
    /// another name and renamed into place once complete and durable, so
    /// a power cut never leaves a file at the index's name that is not a
    /// database.
    fn create_index(io: &Guarded, file: DbFile) -> Result<(), StoreError> {
        let io_err = |e| StoreError::from_io(io.path(file.building), e);
        match io.remove(file.building) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(e)),
            _ => {}
        }
        {
            let backend = io
                .open_index(file.building, Arc::default())
                .map_err(io_err)?;
            let db = Database::builder()
                .set_cache_size(INDEX_CACHE)
                .create_with_backend(backend)
                .map_err(|e| open_error(io.path(file.building), e))?;
            let txn = db.begin_write().map_err(index_error)?;
            if let Some(format) = file.created_format {
                put_format(&txn, format)?;
            }
            txn.commit().map_err(index_error)?;
        }
        io.rename(file.building, file.name)
            .and_then(|()| io.sync_dir(""))
            .map_err(io_err)
    }

    /// Opens the index, waiting a little for a daemon that was just
    /// unmounted to finish its last commit and release the file lock.
    fn open_index(
        io: &Guarded,
        file: DbFile,
        write_failed: &Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Database, StoreError> {
        let deadline = std::time::Instant::now() + INUSE_WAIT;
        loop {
            match Self::try_open_index(io, file, write_failed) {
                Err(StoreError::InUse { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    fn try_open_index(
        io: &Guarded,
        file: DbFile,
        write_failed: &Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Database, StoreError> {
        let path = io.path(file.name);
        let backend = io
            .open_index(file.name, write_failed.clone())
            .map_err(|source| StoreError::from_io(path.clone(), source))?;
        Database::builder()
            .set_cache_size(INDEX_CACHE)
            .create_with_backend(backend)
            .map_err(|e| open_error(path, e))
    }

    fn check_format(db: &Index) -> Result<(), StoreError> {
        match db.format()? {
            Some(v) if v == u64::from(FORMAT_VERSION) => Ok(()),
            Some(v) if UPGRADABLE.contains(&v) => Self::write_format(db),
            Some(v) => Err(StoreError::UnsupportedFormat {
                path: db.io.path(INDEX_FILE),
                found: v,
                supported: FORMAT_VERSION,
            }),
            None => Self::write_format(db),
        }
    }

    fn write_format(db: &Index) -> Result<(), StoreError> {
        let txn = db.begin_write().map_err(index_error)?;
        put_format(&txn, FORMAT_VERSION)?;
        txn.commit().map_err(index_error)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The index database, for the layers that define their own tables.
    pub fn index(&self) -> Arc<Index> {
        self.db.clone()
    }

    /// The chunk store (pack files in `packs/`).
    pub fn chunk_store(&self) -> Result<ChunkStore, StoreError> {
        let created = !self
            .io
            .list("")
            .map_err(|e| StoreError::from_io(self.dir.clone(), e))?
            .iter()
            .any(|n| n == PACK_DIR);
        if created {
            self.io
                .mkdir(PACK_DIR)
                .and_then(|()| self.io.sync_dir(""))
                .map_err(|e| StoreError::from_io(self.io.path(PACK_DIR), e))?;
        }
        ChunkStore::open(
            self.io.clone(),
            self.db.clone(),
            self.space.clone(),
            self.db.unsynced.clone(),
        )
    }

    /// Sets aside the reserve a full store releases for the index (a
    /// mounted store keeps one; see `Space::note`).
    pub fn keep_reserve(&self) {
        self.space.keep_reserve();
    }

    /// The store's free-space state, shared by everything that writes it.
    pub fn space(&self) -> Arc<Space> {
        self.space.clone()
    }

    /// Opens journal `which` (0 or 1; the history alternates between two
    /// so that emptying one never races with appending); returns it with
    /// the records it still holds.
    pub fn journal(&self, which: usize) -> Result<(Journal, Vec<Vec<u8>>), StoreError> {
        Journal::open(&self.io, JOURNAL_FILES[which % 2])
    }

    /// The persistent inode map kept in this store.
    pub fn inode_map(&self) -> Result<InodeMap, StoreError> {
        InodeMap::open(self.db.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopen_keeps_format_and_rejects_unknown_versions() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        drop(Store::open(&dir).unwrap());
        let store = Store::open(&dir).unwrap();
        {
            let txn = store.db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(META_FORMAT, 99)
                .unwrap();
            txn.commit().unwrap();
        }
        drop(store);
        match Store::open(&dir) {
            Err(StoreError::UnsupportedFormat { found: 99, .. }) => {}
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("a store of format 99 opened"),
        }
    }

    #[test]
    fn garbage_index_is_reported_not_panicked() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(INDEX_FILE), b"not a database at all").unwrap();
        match Store::open(tmp.path()) {
            Err(StoreError::Corrupt { .. }) | Err(StoreError::Io { .. }) => {}
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("garbage opened as a store"),
        }
    }

    /// A store whose index went missing is refused, not given a new,
    /// empty index (gc would then have deleted every pack).
    #[test]
    fn a_store_with_packs_and_no_index_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        drop(Store::open(tmp.path()).unwrap());
        std::fs::create_dir_all(tmp.path().join(PACK_DIR)).unwrap();
        std::fs::write(tmp.path().join(PACK_DIR).join("00000001.pack"), b"x").unwrap();
        std::fs::remove_file(tmp.path().join(INDEX_FILE)).unwrap();
        match Store::open(tmp.path()) {
            Err(e @ StoreError::Corrupt { .. }) => assert!(e.to_string().contains("missing")),
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("opened with a new, empty index"),
        }
        assert!(!tmp.path().join(INDEX_FILE).exists(), "an index was made");
    }

    /// A store directory others may write to is refused, unchanged.
    #[test]
    fn a_store_directory_others_may_write_to_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        for mode in [0o777, 0o1777, 0o770] {
            std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            match Store::open(tmp.path()) {
                Err(e @ StoreError::OpenToOthers { .. }) => assert!(e.to_string().contains("go-w")),
                Err(other) => panic!("unexpected error {other}"),
                Ok(_) => panic!("mode {mode:o}: opened"),
            }
            assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
        }
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        drop(Store::open(tmp.path()).unwrap());
    }

    /// An index emptied (a copy or restore cut short) is refused, not
    /// taken as a new one: fsck called the store consistent, and gc then
    /// deleted every pack.
    #[test]
    fn an_empty_index_file_is_refused_and_left_as_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        drop(Store::open(tmp.path()).unwrap());
        for file in [INDEX_FILE, registry::REGISTRY_FILE] {
            let path = tmp.path().join(file);
            let kept = std::fs::read(&path).unwrap();
            std::fs::write(&path, b"").unwrap();
            match Store::open(tmp.path()) {
                Err(e @ StoreError::Corrupt { .. }) => assert!(e.to_string().contains("empty")),
                Err(other) => panic!("unexpected error {other}"),
                Ok(_) => panic!("{file}: an empty file opened as an index"),
            }
            assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                0,
                "{file} was written"
            );
            std::fs::write(&path, kept).unwrap();
        }
        drop(Store::open(tmp.path()).unwrap());
    }

    #[test]
    fn every_store_error_has_its_errno() {
        let p = || PathBuf::from("/x");
        let os = |errno| std::io::Error::from_raw_os_error(errno);
        let table: Vec<(StoreError, i32)> = vec![
            (
                StoreError::Io {
                    path: p(),
                    source: os(libc::EDQUOT),
                },
                libc::EDQUOT,
            ),
            (StoreError::Symlink { path: p() }, libc::ELOOP),
            (
                StoreError::OpenToOthers {
                    path: p(),
                    mode: 0o777,
                },
                libc::EPERM,
            ),
            (StoreError::InUse { path: p() }, libc::EBUSY),
            (
                StoreError::UnsupportedFormat {
                    path: p(),
                    found: 2,
                    supported: 1,
                },
                libc::EPROTO,
            ),
            (
                StoreError::Corrupt {
                    path: p(),
                    detail: String::new(),
                },
                libc::EUCLEAN,
            ),
            (StoreError::IndexIo(os(libc::ENOSPC)), libc::ENOSPC),
            (StoreError::IndexFailedEarlier, libc::EIO),
            (StoreError::IndexCorrupt(String::new()), libc::EUCLEAN),
            (StoreError::IndexLayout(String::new()), libc::EPROTO),
            (StoreError::IndexBusy(String::new()), libc::EBUSY),
            (StoreError::TransactionPoisoned, libc::EIO),
            (StoreError::IndexUnsupported, libc::EOPNOTSUPP),
            (StoreError::IndexMisuse(String::new()), libc::EIO),
            (
                StoreError::TooLarge {
                    what: "a chunk",
                    size: 1 << 33,
                },
                libc::EFBIG,
            ),
            (StoreError::Poisoned(String::new()), libc::EIO),
            (
                StoreError::Spawn {
                    what: "t",
                    source: os(libc::EAGAIN),
                },
                libc::EAGAIN,
            ),
            (StoreError::MissingChunk(Hash::default()), libc::EIO),
            (
                StoreError::CorruptChunk {
                    hash: Hash::default(),
                    detail: String::new(),
                },
                libc::EIO,
            ),
            (
                StoreError::DamagedPack {
                    path: p(),
                    detail: String::new(),
                },
                libc::EIO,
            ),
            (
                StoreError::DamagedJournal {
                    path: p(),
                    detail: String::new(),
                },
                libc::EUCLEAN,
            ),
        ];
        for (e, errno) in table {
            assert_eq!(e.errno(), errno, "{e:?}");
        }
    }

    #[test]
    fn redb_errors_convert_by_meaning() {
        let os = |errno| std::io::Error::from_raw_os_error(errno);
        let table: Vec<(redb::Error, i32)> = vec![
            // A full disk under the index stays ENOSPC; nothing else is.
            (redb::Error::Io(os(libc::ENOSPC)), libc::ENOSPC),
            (redb::Error::Io(os(libc::EROFS)), libc::EROFS),
            (redb::Error::PreviousIo, libc::EIO),
            (redb::Error::Corrupted("page".into()), libc::EUCLEAN),
            (redb::Error::UpgradeRequired(1), libc::EPROTO),
            (redb::Error::TableIsMultimap("t".into()), libc::EPROTO),
            (redb::Error::DatabaseAlreadyOpen, libc::EBUSY),
            (redb::Error::WouldBlock, libc::EBUSY),
            (redb::Error::ValueTooLarge(1 << 32), libc::EFBIG),
            (redb::Error::TransactionPoisoned, libc::EIO),
            (redb::Error::Unsupported, libc::EOPNOTSUPP),
            (redb::Error::DatabaseClosed, libc::EIO),
        ];
        for (e, errno) in table {
            let what = format!("{e:?}");
            assert_eq!(index_error(e).errno(), errno, "{what}");
        }
        let poisoned = std::io::Error::other(io::PoisonedIo("fsync".into()));
        assert!(matches!(
            index_error(redb::Error::Io(poisoned)),
            StoreError::Poisoned(_)
        ));
    }

    #[test]
    fn io_errors_without_an_errno_map_by_kind() {
        use std::io::{Error, ErrorKind};
        assert_eq!(
            io_errno(&Error::from_raw_os_error(libc::EXDEV)),
            libc::EXDEV
        );
        assert_eq!(io_errno(&Error::from(ErrorKind::NotFound)), libc::ENOENT);
        assert_eq!(io_errno(&Error::from(ErrorKind::StorageFull)), libc::ENOSPC);
        assert_eq!(io_errno(&Error::other("x")), libc::EIO);
    }
}
