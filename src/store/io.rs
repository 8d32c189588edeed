//! The store's file I/O: every byte the store reads or writes, every fsync
//! and every directory change goes through [`StoreIo`]. Two reasons:
//!
//! - The store is reached through a descriptor of its directory opened
//!   before the mount covers it, never by path, so a store inside SRC keeps
//!   working when MNT = SRC hides it.
//! - A test implementation (`sim`, in tests) records every write, fsync and
//!   directory operation and builds the images a power cut could leave.
//!
//! Every implementation is wrapped in [`Guarded`], which applies the
//! poisoning rule: after a failed fsync, or a failed write that is not for
//! lack of space, nothing more is written and every later write or fsync
//! fails (see `Health`). Names are relative to the store's directory
//! (`packs/00000001.pack`).

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::sys;

/// How `open` treats a missing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Create {
    /// The file must exist.
    No,
    /// Create it (mode 0600) if it does not exist.
    IfMissing,
    /// Create it; fail with EEXIST if it exists.
    New,
}

/// One open store file.
pub trait StoreFile: Send + Sync {
    /// Fills `buf` from `offset`; a short file is `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes every write so far durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Allocates blocks for the first `len` bytes (reads as zeros).
    fn allocate(&self, len: u64) -> io::Result<()>;
}

/// The file system under a store directory.
pub trait StoreIo: Send + Sync {
    fn open(&self, name: &str, create: Create) -> io::Result<Arc<dyn StoreFile>>;
    /// The index database's storage (redb takes its locks through it).
    fn open_index(&self, name: &str) -> io::Result<Box<dyn redb::StorageBackend>>;
    /// Creates a directory; an existing one is fine.
    fn mkdir(&self, name: &str) -> io::Result<()>;
    /// The names in a directory; a missing directory is empty.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Makes the creations, renames and removals in `dir` durable ("" is
    /// the store's own directory).
    fn sync_dir(&self, dir: &str) -> io::Result<()>;
    /// Bytes an unprivileged writer may still use, and the file system's size.
    fn free_bytes(&self) -> io::Result<(u64, u64)>;
}

// ---------------------------------------------------------------------------
// The real file system

/// A store directory on disk, reached through a descriptor.
pub struct DiskIo {
    root: OwnedFd,
}

impl DiskIo {
    /// Opens the directory `dir` (which must exist and not be a symlink).
    pub fn open(dir: &Path) -> io::Result<DiskIo> {
        let c = sys::cstr(dir.as_os_str())?;
        let root = sys::openat(
            sys::CWD,
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        Ok(DiskIo { root })
    }

    fn open_file(&self, name: &str, create: Create) -> io::Result<File> {
        let flags = libc::O_RDWR
            | libc::O_NOFOLLOW
            | match create {
                Create::No => 0,
                Create::IfMissing => libc::O_CREAT,
                Create::New => libc::O_CREAT | libc::O_EXCL,
            };
        let c = sys::cstr(name.as_ref())?;
        Ok(File::from(sys::openat(
            self.root.as_fd(),
            &c,
            flags,
            0o600,
        )?))
    }

    fn open_dir(&self, name: &str) -> io::Result<OwnedFd> {
        let name = if name.is_empty() { "." } else { name };
        let c = sys::cstr(name.as_ref())?;
        sys::openat(
            self.root.as_fd(),
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
    }
}

impl StoreFile for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn sync(&self) -> io::Result<()> {
        self.sync_data()
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        sys::fallocate(self.as_fd(), 0, 0, len)
    }
}

impl StoreIo for DiskIo {
    fn open(&self, name: &str, create: Create) -> io::Result<Arc<dyn StoreFile>> {
        Ok(Arc::new(self.open_file(name, create)?))
    }

    fn open_index(&self, name: &str) -> io::Result<Box<dyn redb::StorageBackend>> {
        let file = self.open_file(name, Create::IfMissing)?;
        let backend =
            redb::backends::FileBackend::new(file).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Box::new(backend))
    }

    fn mkdir(&self, name: &str) -> io::Result<()> {
        let c = sys::cstr(name.as_ref())?;
        match sys::mkdirat(self.root.as_fd(), &c, 0o700) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let fd = match self.open_dir(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            other => other?,
        };
        let mut names = Vec::new();
        let mut buf = sys::DirBuf::new(32 << 10);
        loop {
            let batch = sys::getdents(fd.as_fd(), &mut buf)?;
            if batch.is_empty() {
                return Ok(names);
            }
            for e in batch {
                if e.name != b"." && e.name != b".." {
                    names.push(String::from_utf8_lossy(&e.name).into_owned());
                }
            }
        }
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let c = sys::cstr(name.as_ref())?;
        sys::unlinkat(self.root.as_fd(), &c, 0)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (a, b) = (sys::cstr(from.as_ref())?, sys::cstr(to.as_ref())?);
        sys::renameat2(self.root.as_fd(), &a, self.root.as_fd(), &b, 0)
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        sys::fsync(self.open_dir(dir)?.as_fd(), false)
    }

    fn free_bytes(&self) -> io::Result<(u64, u64)> {
        let st = sys::fstatvfs(self.root.as_fd())?;
        Ok((
            st.f_bavail.saturating_mul(st.f_frsize),
            st.f_blocks.saturating_mul(st.f_frsize),
        ))
    }
}

// ---------------------------------------------------------------------------
// Poisoning

/// Whether the store may still be written. The first failed fsync, or
/// failed write other than for lack of space, poisons it for good (until
/// the daemon restarts): after a failed fsync the kernel may have dropped
/// the dirty pages and marked them clean, so a retried fsync that succeeds
/// proves nothing (PostgreSQL's fsync lesson). Reads keep working.
#[derive(Default)]
pub struct Health {
    poisoned: AtomicBool,
    why: Mutex<Option<String>>,
}

impl Health {
    pub fn poison(&self, what: String) {
        let mut why = self.why.lock();
        if why.is_none() {
            tracing::error!(
                "store poisoned: {what}; history refuses changes (EIO) until the mount is restarted"
            );
            *why = Some(what);
        }
        self.poisoned.store(true, Ordering::Release);
    }

    /// What poisoned the store, if it is.
    pub fn poisoned(&self) -> Option<String> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.why.lock().clone()
    }

    fn refuse(&self) -> io::Result<()> {
        match self.poisoned() {
            None => Ok(()),
            Some(why) => Err(io::Error::other(PoisonedIo(why))),
        }
    }
}

/// The error a poisoned store's writes fail with (recognized by
/// `StoreError::from_io`).
#[derive(Debug)]
pub struct PoisonedIo(pub String);

impl fmt::Display for PoisonedIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the store is poisoned by an earlier failure ({})",
            self.0
        )
    }
}

impl std::error::Error for PoisonedIo {}

fn is_lack_of_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// What a write-side operation is, for the poisoning rule.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// fsync: any failure poisons.
    Sync,
    /// Writing bytes: a failure poisons unless it was for lack of space.
    Data,
    /// Creating, renaming or removing a name: a failure is reported and
    /// poisons nothing (durability of names comes from `sync_dir`).
    Name,
}

/// Runs a write-side operation under the poisoning rule.
fn guarded<T>(
    health: &Health,
    what: impl FnOnce() -> String,
    kind: Kind,
    op: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    health.refuse()?;
    op().inspect_err(|e| {
        let poisons = match kind {
            Kind::Sync => true,
            Kind::Data => !is_lack_of_space(e),
            Kind::Name => false,
        };
        if poisons {
            health.poison(format!("{}: {e}", what()));
        }
    })
}

/// A [`StoreIo`] with the poisoning rule applied to everything it opens.
pub struct Guarded {
    inner: Box<dyn StoreIo>,
    health: Arc<Health>,
    /// The store directory, for messages.
    dir: PathBuf,
}

impl Guarded {
    pub fn new(inner: Box<dyn StoreIo>, dir: PathBuf) -> Guarded {
        Guarded {
            inner,
            health: Arc::new(Health::default()),
            dir,
        }
    }

    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The path of a store file, for messages.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn open(&self, name: &str, create: Create) -> io::Result<Arc<dyn StoreFile>> {
        let file = if create == Create::No {
            self.inner.open(name, create)?
        } else {
            guarded(
                &self.health,
                || format!("create {name}"),
                Kind::Name,
                || self.inner.open(name, create),
            )?
        };
        Ok(Arc::new(GuardedFile {
            inner: file,
            health: self.health.clone(),
            name: name.to_string(),
        }))
    }

    /// The index file `name`; `write_failed` is set when a write or a
    /// growth of it fails (`GuardedIndex::write_failed`).
    pub fn open_index(
        &self,
        name: &str,
        write_failed: Arc<std::sync::atomic::AtomicBool>,
    ) -> io::Result<GuardedIndex> {
        let inner = self.inner.open_index(name)?;
        Ok(GuardedIndex {
            inner,
            health: self.health.clone(),
            name: name.to_string(),
            write_failed,
        })
    }

    pub fn mkdir(&self, name: &str) -> io::Result<()> {
        guarded(
            &self.health,
            || format!("mkdir {name}"),
            Kind::Name,
            || self.inner.mkdir(name),
        )
    }

    pub fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }

    pub fn remove(&self, name: &str) -> io::Result<()> {
        guarded(
            &self.health,
            || format!("remove {name}"),
            Kind::Name,
            || self.inner.remove(name),
        )
    }

    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        guarded(
            &self.health,
            || format!("rename {from}"),
            Kind::Name,
            || self.inner.rename(from, to),
        )
    }

    pub fn sync_dir(&self, dir: &str) -> io::Result<()> {
        guarded(
            &self.health,
            || format!("fsync directory '{dir}'"),
            Kind::Sync,
            || self.inner.sync_dir(dir),
        )
    }

    pub fn free_bytes(&self) -> io::Result<(u64, u64)> {
        self.inner.free_bytes()
    }
}

struct GuardedFile {
    inner: Arc<dyn StoreFile>,
    health: Arc<Health>,
    name: String,
}

impl StoreFile for GuardedFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        guarded(
            &self.health,
            || format!("write {}", self.name),
            Kind::Data,
            || self.inner.write_all_at(buf, offset),
        )
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        guarded(
            &self.health,
            || format!("truncate {}", self.name),
            Kind::Data,
            || self.inner.set_len(len),
        )
    }
    fn sync(&self) -> io::Result<()> {
        guarded(
            &self.health,
            || format!("fsync {}", self.name),
            Kind::Sync,
            || self.inner.sync(),
        )
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        // Only the reserve is allocated: a failure costs the reserve, not
        // any data (file systems without fallocate exist).
        guarded(
            &self.health,
            || format!("allocate {}", self.name),
            Kind::Name,
            || self.inner.allocate(len),
        )
    }
}

/// The index's storage under the poisoning rule.
pub struct GuardedIndex {
    inner: Box<dyn redb::StorageBackend>,
    health: Arc<Health>,
    name: String,
    /// Set by a failed write or growth (a full disk, which poisons
    /// nothing): redb then fails every later use of the database, reads
    /// in a transaction begun before it noticed included, until it is
    /// opened again (`Index::current`).
    write_failed: Arc<std::sync::atomic::AtomicBool>,
}

impl GuardedIndex {
    fn noting_failure<T>(&self, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() {
            self.write_failed
                .store(true, std::sync::atomic::Ordering::Release);
        }
        r
    }
}

impl fmt::Debug for GuardedIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GuardedIndex({})", self.name)
    }
}

use redb::BackendError;
use std::ops::Bound;

impl redb::StorageBackend for GuardedIndex {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.noting_failure(guarded(
            &self.health,
            || format!("resize {}", self.name),
            Kind::Data,
            || self.inner.set_len(len),
        ))
    }
    fn sync_data(&self) -> io::Result<()> {
        guarded(
            &self.health,
            || format!("fsync {}", self.name),
            Kind::Sync,
            || self.inner.sync_data(),
        )
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.noting_failure(guarded(
            &self.health,
            || format!("write {}", self.name),
            Kind::Data,
            || self.inner.write(offset, data),
        ))
    }
    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
