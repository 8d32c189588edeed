//! The store: the persistent, crash-safe state of a chronofs mount.
//!
//! Owns: the on-disk store directory (by default `SRC/.chronofs`), its format
//! version, and the embedded key-value index (redb). Today it holds the
//! persistent inode map; the history index and chunk packs join it later.
//! Uses: nothing of chronofs but `sys`-free std I/O. Must not know about
//! FUSE, paths inside the mount, or credentials.

pub mod chunks;
pub mod inomap;
pub mod journal;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, TableDefinition};

pub use chunks::{ChunkStore, Hash};
pub use inomap::{BackingKey, InodeMap};
pub use journal::Journal;
pub use redb;

/// The format written by this build. Bump on any incompatible change to a
/// key or value layout, and record it in docs/FORMAT.md.
pub const FORMAT_VERSION: u32 = 5;
/// Older formats this build upgrades in place, by rewriting the version
/// number only: format 1 had no history tables (they are created on first
/// use); format 2 had no delta chunks (it never holds any, and format 3
/// reads everything it does hold); format 3 had no `pruned` and `audit`
/// tables (created on first use). A format-3 build refuses a format-4
/// store: it would read a pruned object's past as its live state. Format
/// 4 had no lost versions (version content variant 5), which a format-4
/// build could not decode.
const UPGRADABLE: &[u64] = &[1, 2, 3, 4];

pub const INDEX_FILE: &str = "index.redb";
const PACK_DIR: &str = "packs";
const JOURNAL_FILES: [&str; 2] = ["journal-0", "journal-1"];
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_FORMAT: &str = "format_version";
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
    #[error("store index write failed: {0}")]
    Index(String),
    /// The index's file failed (a full disk): redb must be re-opened.
    #[error("store index write failed: {0}")]
    IndexIo(String),
    #[error("chunk {0} is referenced but missing from the store")]
    MissingChunk(String),
    #[error("chunk {hash} is damaged: {detail}")]
    CorruptChunk { hash: String, detail: String },
}

impl StoreError {
    /// The errno a file system call reports when the store fails under it.
    pub fn errno(&self) -> i32 {
        match self {
            StoreError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            StoreError::InUse { .. } => libc::EBUSY,
            StoreError::UnsupportedFormat { .. } => libc::EPROTO,
            StoreError::Corrupt { .. } => libc::EUCLEAN,
            StoreError::Index(_) => libc::EIO,
            // Most often a full disk.
            StoreError::IndexIo(_) => libc::ENOSPC,
            StoreError::MissingChunk(_) | StoreError::CorruptChunk { .. } => libc::EIO,
        }
    }
}

pub fn index_error(e: impl Into<redb::Error>) -> StoreError {
    let e: redb::Error = e.into();
    match e {
        // redb refuses every transaction after a failed write until the
        // database is opened again (see `Index::reopen`).
        redb::Error::Io(_) | redb::Error::PreviousIo => StoreError::IndexIo(e.to_string()),
        other => StoreError::Index(other.to_string()),
    }
}

/// An open store directory.
pub struct Store {
    dir: PathBuf,
    db: Arc<Index>,
    space: Arc<Space>,
}

/// Free space in the store, once a write to it failed for the lack of it.
/// While the store is full, history refuses new changes with ENOSPC
/// (rather than letting them happen unrecorded), until the file system
/// has room again.
pub struct Space {
    dir: PathBuf,
    full: std::sync::atomic::AtomicBool,
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
                "store {} is full: changes are refused (ENOSPC) until it has room again",
                self.dir.display()
            );
        }
        full
    }

    /// Ok if history may record; ENOSPC while the store is full.
    pub fn check(&self) -> Result<(), StoreError> {
        if !self.full.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let (free, total) = crate::sys::free_bytes(&self.dir).unwrap_or((0, 0));
        if free >= SPACE_TO_RESUME.min((total / 10).max(4 << 20)) {
            self.full.store(false, std::sync::atomic::Ordering::Release);
            tracing::warn!(
                "store {} has room again: recording resumes",
                self.dir.display()
            );
            return Ok(());
        }
        Err(StoreError::Io {
            path: self.dir.clone(),
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
    path: PathBuf,
    db: parking_lot::RwLock<Option<Arc<Database>>>,
    /// Held while re-opening; when the last re-open was reported.
    reopening: parking_lot::Mutex<Option<std::time::Instant>>,
}

impl Index {
    fn new(path: PathBuf, db: Database) -> Index {
        Index {
            path,
            db: parking_lot::RwLock::new(Some(Arc::new(db))),
            reopening: parking_lot::Mutex::new(None),
        }
    }

    fn current(&self) -> Result<Arc<Database>, redb::Error> {
        if let Some(db) = self.db.read().clone() {
            return Ok(db);
        }
        self.reopen();
        self.db.read().clone().ok_or(redb::Error::PreviousIo)
    }

    /// Runs `f` on the database, re-opening it first if a previous write
    /// failed (and once more if `f` finds it failed).
    fn with<T, E: Into<redb::Error>>(
        &self,
        f: impl Fn(&Database) -> Result<T, E>,
    ) -> Result<T, redb::Error> {
        let db = self.current()?;
        match f(&db).map_err(Into::into) {
            Err(redb::Error::PreviousIo) => {
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

    pub fn begin_write(&self) -> Result<redb::WriteTransaction, redb::Error> {
        self.with(|db| db.begin_write())
    }

    /// Closes the database and opens it again (waiting for transactions
    /// in flight to let go of the file); on failure it stays closed and
    /// the next use tries again.
    pub fn reopen(&self) {
        let Some(mut reported) = self.reopening.try_lock() else {
            // Another thread is at it: wait for it.
            drop(self.reopening.lock());
            return;
        };
        *self.db.write() = None;
        match Store::open_index(&self.path) {
            Ok(db) => {
                // Reported once a minute: on a full disk every retry fails.
                if reported.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60)) {
                    tracing::warn!(
                        "store index {} re-opened after a failed write",
                        self.path.display()
                    );
                    *reported = Some(std::time::Instant::now());
                }
                *self.db.write() = Some(Arc::new(db));
            }
            Err(e) => tracing::error!(
                "store index {} cannot be re-opened yet: {e}",
                self.path.display()
            ),
        }
    }

    #[cfg(test)]
    pub fn from_database(path: PathBuf, db: Database) -> Arc<Index> {
        Arc::new(Index::new(path, db))
    }
}

impl Store {
    /// Opens the store in `dir`, creating it (mode 0700) if it does not exist.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let io_err = |source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        };
        if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
            // Whoever can write SRC's root could otherwise point the store,
            // written by root, anywhere.
            return Err(io_err(std::io::Error::other(
                "is a symbolic link; refusing to follow it",
            )));
        }
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(io_err)?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io_err)?;
        }
        let path = dir.join(INDEX_FILE);
        let db = Self::open_index(&path)?;
        let store = Store {
            dir: dir.to_path_buf(),
            db: Arc::new(Index::new(path.clone(), db)),
            space: Arc::new(Space {
                dir: dir.to_path_buf(),
                full: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        store.check_format(&path)?;
        Ok(store)
    }

    /// Opens the index, waiting a little for a daemon that was just
    /// unmounted to finish its last commit and release the file lock.
    fn open_index(path: &Path) -> Result<Database, StoreError> {
        let deadline = std::time::Instant::now() + INUSE_WAIT;
        loop {
            match Self::try_open_index(path) {
                Err(StoreError::InUse { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    fn try_open_index(path: &Path) -> Result<Database, StoreError> {
        let path = path.to_path_buf();
        Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse { path },
            redb::DatabaseError::Storage(redb::StorageError::Io(source)) => {
                StoreError::Io { path, source }
            }
            other => StoreError::Corrupt {
                path,
                detail: other.to_string(),
            },
        })
    }

    fn check_format(&self, path: &Path) -> Result<(), StoreError> {
        let found = {
            let txn = self.db.begin_read().map_err(index_error)?;
            match txn.open_table(META) {
                Ok(table) => table
                    .get(META_FORMAT)
                    .map_err(index_error)?
                    .map(|v| v.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(index_error(e)),
            }
        };
        match found {
            Some(v) if v == u64::from(FORMAT_VERSION) => Ok(()),
            Some(v) if UPGRADABLE.contains(&v) => self.write_format(),
            Some(v) => Err(StoreError::UnsupportedFormat {
                path: path.to_path_buf(),
                found: v,
                supported: FORMAT_VERSION,
            }),
            None => self.write_format(),
        }
    }

    fn write_format(&self) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(index_error)?;
        {
            let mut table = txn.open_table(META).map_err(index_error)?;
            table
                .insert(META_FORMAT, u64::from(FORMAT_VERSION))
                .map_err(index_error)?;
        }
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
        let dir = self.dir.join(PACK_DIR);
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            path: dir.clone(),
            source,
        })?;
        ChunkStore::open(dir, self.db.clone(), self.space.clone())
    }

    /// The store's free-space state, shared by everything that writes it.
    pub fn space(&self) -> Arc<Space> {
        self.space.clone()
    }

    /// Opens journal `which` (0 or 1; the history alternates between two
    /// so that emptying one never races with appending); returns it with
    /// the records it still holds.
    pub fn journal(&self, which: usize) -> Result<(Journal, Vec<Vec<u8>>), StoreError> {
        Journal::open(&self.dir.join(JOURNAL_FILES[which % 2]))
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

    #[test]
    fn errno_mapping_is_specific() {
        let p = PathBuf::from("/x");
        assert_eq!(StoreError::InUse { path: p.clone() }.errno(), libc::EBUSY);
        assert_eq!(
            StoreError::UnsupportedFormat {
                path: p.clone(),
                found: 2,
                supported: 1
            }
            .errno(),
            libc::EPROTO
        );
        assert_eq!(
            StoreError::Corrupt {
                path: p.clone(),
                detail: String::new()
            }
            .errno(),
            libc::EUCLEAN
        );
        assert_eq!(StoreError::Index(String::new()).errno(), libc::EIO);
        let io = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(
            StoreError::Io {
                path: p,
                source: io
            }
            .errno(),
            libc::ENOSPC
        );
    }
}
