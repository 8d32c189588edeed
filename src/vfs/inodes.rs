//! Inode and handle tables.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::{Result, Stat, VfsError};
use crate::branch::BranchId;
use crate::store::{BackingKey, InodeMap, StoreError};

/// The inode number the kernel and users see. Allocated by the persistent
/// inode map on first sight of a backing object, never reused, and the same
/// after a remount; 1 is always the mount root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeNo(pub u64);

impl InodeNo {
    pub const ROOT: InodeNo = InodeNo(1);
}

/// An object the kernel holds a reference to. Lives from the first lookup
/// until the kernel forgets its last reference; the O_PATH descriptor pins
/// the backing inode, so its backing number cannot be reused meanwhile.
pub struct Inode {
    pub ino: InodeNo,
    pub fd: OwnedFd,
    pub key: BackingKey,
    /// S_IFMT bits; an inode never changes kind.
    pub kind: u32,
    nlookup: AtomicU64,
}

impl Inode {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
}

#[derive(Default)]
struct Tables {
    by_ino: HashMap<InodeNo, Arc<Inode>>,
    by_key: HashMap<BackingKey, InodeNo>,
}

pub struct InodeTable {
    branch: BranchId,
    map: InodeMap,
    tables: RwLock<Tables>,
    root_key: BackingKey,
}

impl InodeTable {
    pub fn new(branch: BranchId, map: InodeMap, root_fd: OwnedFd, root_st: &Stat) -> Self {
        let root_key = BackingKey {
            branch: branch.0,
            dev: root_st.st_dev,
            ino: root_st.st_ino,
        };
        let root = Arc::new(Inode {
            ino: InodeNo::ROOT,
            fd: root_fd,
            key: root_key,
            kind: libc::S_IFDIR,
            nlookup: AtomicU64::new(1),
        });
        let mut tables = Tables::default();
        tables.by_ino.insert(InodeNo::ROOT, root);
        tables.by_key.insert(root_key, InodeNo::ROOT);
        InodeTable {
            branch,
            map,
            tables: RwLock::new(tables),
            root_key,
        }
    }

    pub fn key_of(&self, st: &Stat) -> BackingKey {
        BackingKey {
            branch: self.branch.0,
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }

    pub fn get(&self, ino: InodeNo) -> Result<Arc<Inode>> {
        self.tables
            .read()
            .by_ino
            .get(&ino)
            .cloned()
            .ok_or(VfsError::UnknownInode(ino.0))
    }

    /// The number shown for a backing object, whether or not the kernel
    /// holds it (used for readdir's d_ino).
    pub fn number_for(&self, key: BackingKey) -> std::result::Result<InodeNo, StoreError> {
        if key == self.root_key {
            return Ok(InodeNo::ROOT);
        }
        if let Some(ino) = self.tables.read().by_key.get(&key) {
            return Ok(*ino);
        }
        self.map.get_or_assign(key).map(InodeNo)
    }

    /// Takes one more kernel reference on the object with `key` if it is
    /// already known.
    pub fn acquire_known(&self, key: &BackingKey) -> Option<Arc<Inode>> {
        let tables = self.tables.read();
        let ino = tables.by_key.get(key)?;
        let inode = tables.by_ino.get(ino)?.clone();
        inode.nlookup.fetch_add(1, Ordering::AcqRel);
        Some(inode)
    }

    /// Registers a newly opened backing object (or takes a reference on the
    /// existing one if another thread registered it first).
    pub fn acquire_new(&self, fd: OwnedFd, st: &Stat) -> Result<Arc<Inode>> {
        let key = self.key_of(st);
        if let Some(inode) = self.acquire_known(&key) {
            return Ok(inode);
        }
        let ino = InodeNo(self.map.get_or_assign(key)?);
        let mut tables = self.tables.write();
        if let Some(existing) = tables.by_key.get(&key).and_then(|i| tables.by_ino.get(i)) {
            existing.nlookup.fetch_add(1, Ordering::AcqRel);
            return Ok(existing.clone());
        }
        let inode = Arc::new(Inode {
            ino,
            fd,
            key,
            kind: st.st_mode & libc::S_IFMT,
            nlookup: AtomicU64::new(1),
        });
        tables.by_ino.insert(ino, inode.clone());
        tables.by_key.insert(key, ino);
        Ok(inode)
    }

    /// Drops `n` kernel references; the inode leaves the table at zero.
    pub fn forget(&self, ino: InodeNo, n: u64) {
        if ino == InodeNo::ROOT {
            return;
        }
        let Some(inode) = self.tables.read().by_ino.get(&ino).cloned() else {
            tracing::warn!("forget of unknown inode {}", ino.0);
            return;
        };
        let prev = inode.nlookup.fetch_sub(n, Ordering::AcqRel);
        if prev > n {
            return;
        }
        if prev < n {
            tracing::warn!("forget({n}) of inode {} with only {prev} references", ino.0);
            inode.nlookup.store(0, Ordering::Release);
        }
        let mut tables = self.tables.write();
        // A lookup may have revived it between the decrement and the lock.
        if inode.nlookup.load(Ordering::Acquire) == 0 {
            tables.by_ino.remove(&ino);
            if tables.by_key.get(&inode.key) == Some(&ino) {
                tables.by_key.remove(&inode.key);
            }
        }
    }

    pub fn flush(&self) -> std::result::Result<(), StoreError> {
        self.map.flush()
    }
}

/// An open file or directory, identified by the number given to the kernel.
pub enum Handle {
    File {
        ino: InodeNo,
        fd: OwnedFd,
    },
    Dir {
        ino: InodeNo,
        stream: Mutex<super::dir::DirStream>,
    },
}

impl Handle {
    pub fn ino(&self) -> InodeNo {
        match self {
            Handle::File { ino, .. } | Handle::Dir { ino, .. } => *ino,
        }
    }
}

/// Open handles. Numbers start at 1 and are not reused within a mount.
pub struct HandleTable {
    next: AtomicU64,
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
}

impl Default for HandleTable {
    fn default() -> Self {
        HandleTable {
            next: AtomicU64::new(1),
            handles: RwLock::new(HashMap::new()),
        }
    }
}

impl HandleTable {
    pub fn insert(&self, handle: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.handles.write().insert(fh, Arc::new(handle));
        fh
    }

    pub fn get(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .read()
            .get(&fh)
            .cloned()
            .ok_or(VfsError::UnknownHandle(fh))
    }

    pub fn remove(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .write()
            .remove(&fh)
            .ok_or(VfsError::UnknownHandle(fh))
    }
}
