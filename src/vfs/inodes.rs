//! Inode and handle tables.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::{Result, Stat, VfsError};
use crate::branch::BranchId;
use crate::history::ObjectId;
use crate::store::{BackingKey, DevAlias, InodeMap, StoreError};
use crate::sys;

/// The inode number the kernel and users see. Allocated by the persistent
/// inode map on first sight of a backing object, never reused, and the same
/// after a remount; 1 is always the mount root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeNo(pub u64);

impl From<ObjectId> for InodeNo {
    fn from(obj: ObjectId) -> InodeNo {
        InodeNo(obj.get())
    }
}

impl InodeNo {
    pub const ROOT: InodeNo = InodeNo(1);

    /// The history object this inode is: the persistent inode number is
    /// the object id (see `history::ObjectId`).
    pub const fn object(self) -> ObjectId {
        ObjectId::new(self.0)
    }
}

/// An object the kernel holds a reference to. Lives from the first lookup
/// until the kernel forgets its last reference.
pub struct Inode {
    pub ino: InodeNo,
    pub key: BackingKey,
    /// S_IFMT bits; an inode never changes kind.
    pub kind: u32,
    nlookup: AtomicU64,
    slot: FdSlot,
    /// The (parent, name) the kernel last reached this object by: where
    /// history records it if it was never recorded before. Packed in one
    /// allocation (`pack_name`): the table holds one per remembered inode.
    name: Mutex<Option<Box<[u8]>>>,
    /// A union directory: the same directory in the branches below the
    /// one `key` names, top-down (empty outside union mounts). Reached
    /// like the inode's own object, so that a large tree of union
    /// directories does not hold a descriptor per branch each. Replaced
    /// when the branch set changes (`InodeTable::set_layers`).
    layers: RwLock<Box<[LayerSlot]>>,
    /// A union file with hard links in a read-only branch, copied up
    /// through the index: the link count the union shows (0: not one);
    /// and in bit 31 (`SEEN`), whether the first lookup has compared the
    /// object with history. One word for both keeps the entry a size
    /// class smaller (the table holds one per remembered inode).
    nlink_seen: AtomicU32,
    /// A directory: the stamp of its copies when an open last made the
    /// kernel re-read its listing (see `dircache.rs`; 0: none).
    pub listed: AtomicU64,
    /// The union's branch set generation its layers were found under
    /// (`Vfs::node` re-derives them when the set has changed since).
    generation: AtomicU32,
}

/// `Inode::nlink_seen`'s flag bit (a link count never reaches it).
const SEEN: u32 = 1 << 31;
/// `Inode::nlink_seen`'s bit for a directory whose entries history must
/// compare in full at its next use: the union's branch set changed.
const RECHECK: u32 = 1 << 30;
/// `Inode::nlink_seen`'s bit for an object found without a clone's mark
/// (`vfs/clone.rs`): an object never gains one after it is made, so the
/// xattr is not read again on each lookup and getattr.
const UNMARKED: u32 = 1 << 29;
/// `Inode::nlink_seen`'s bit for a file with several names found not to
/// be a clone's linked copy (`vfs/clone.rs`): none becomes one later.
const UNINDEXED: u32 = 1 << 28;
/// `Inode::nlink_seen`'s bit for a clone's file that took its base's
/// blocks when it was first changed (btrfs, XFS): history then knows its
/// state before, and its writes are tracked at any size, as a patched
/// file's are, so a small write's version costs what it wrote.
const SHARED_AT_CHANGE: u32 = 1 << 27;
const FLAGS: u32 = SEEN | RECHECK | UNMARKED | UNINDEXED | SHARED_AT_CHANGE;

/// One branch's copy of a union directory.
#[derive(Clone)]
pub struct Layer {
    pub branch: BranchId,
    pub fd: Arc<OwnedFd>,
}

/// A [`Layer`] as an inode keeps it.
struct LayerSlot {
    branch: BranchId,
    slot: FdSlot,
}

/// How the backing object is reached. Holding an O_PATH descriptor per
/// inode would exhaust RLIMIT_NOFILE on large trees (the kernel may
/// remember hundreds of thousands of inodes), so objects that have a file
/// handle keep only the handle and a cached descriptor that can be dropped
/// and re-opened at any time.
enum FdSlot {
    /// Held open for the inode's lifetime (the root, objects on file
    /// systems or mounts without handle support).
    Pinned(Arc<OwnedFd>),
    Handle {
        /// The branch whose mount the handle is re-opened on.
        branch: u32,
        handle: sys::FileHandle,
        cached: Mutex<Option<Arc<OwnedFd>>>,
        /// Used since the last eviction pass (second-chance eviction).
        referenced: AtomicBool,
        /// Never evicted: the object was unlinked while the kernel still
        /// knows it, and a handle may not re-open an unlinked file.
        pinned: AtomicBool,
        cache_count: Arc<AtomicUsize>,
    },
}

/// An inode together with a descriptor of its backing object, held for
/// the duration of one operation.
pub struct Node {
    pub inode: Arc<Inode>,
    fd: Arc<OwnedFd>,
    /// Reached through another of its copies (`with_fd`): `fd` is not
    /// the copy in the inode's own branch.
    through_copy: bool,
}

impl Node {
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn fd_arc(&self) -> Arc<OwnedFd> {
        self.fd.clone()
    }

    /// The inode reached through another of its copies (a union
    /// directory's upper one).
    pub fn with_fd(inode: Arc<Inode>, fd: Arc<OwnedFd>) -> Node {
        Node {
            inode,
            fd,
            through_copy: true,
        }
    }

    /// Whether `fd` is another copy than the one of the inode's branch.
    pub fn through_copy(&self) -> bool {
        self.through_copy
    }
}

impl std::ops::Deref for Node {
    type Target = Inode;
    fn deref(&self) -> &Inode {
        &self.inode
    }
}

impl Inode {
    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }

    pub fn set_name(&self, parent: InodeNo, name: &[u8]) {
        let mut slot = self.name.lock();
        if slot.as_deref().map(unpack_name) != Some((parent, name)) {
            *slot = Some(pack_name(parent, name));
        }
    }

    pub fn name(&self) -> Option<(InodeNo, Vec<u8>)> {
        let slot = self.name.lock();
        let (parent, name) = unpack_name(slot.as_deref()?);
        Some((parent, name.to_vec()))
    }

    /// The link count to show instead of the backing one, if any.
    pub fn union_nlink(&self) -> Option<u32> {
        match self.nlink_seen.load(Ordering::Acquire) & !FLAGS {
            0 => None,
            n => Some(n),
        }
    }

    pub fn set_union_nlink(&self, n: u32) {
        let _ = self
            .nlink_seen
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some((w & FLAGS) | (n & !FLAGS))
            });
    }

    /// Whether it is a union directory with copies in lower branches.
    pub fn has_layers(&self) -> bool {
        !self.layers.read().is_empty()
    }

    /// The branch set generation its layers were found under.
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// Its layers (or, for a non-directory, its branch) are right for
    /// set `generation`.
    pub fn stamp(&self, generation: u32) {
        self.generation.store(generation, Ordering::Release);
    }

    /// Its entries may have changed without any change through the mount
    /// (the union's branch set changed): history compares them at its next
    /// use.
    pub fn mark_recheck(&self) {
        self.nlink_seen.fetch_or(RECHECK, Ordering::AcqRel);
    }

    /// Whether history must compare its entries now (once per mark).
    pub fn take_recheck(&self) -> bool {
        self.nlink_seen.fetch_and(!RECHECK, Ordering::AcqRel) & RECHECK != 0
    }

    /// True the first time it is asked for this inode.
    /// Whether it was found without a clone's mark (see `UNMARKED`).
    pub fn known_unmarked(&self) -> bool {
        self.nlink_seen.load(Ordering::Acquire) & UNMARKED != 0
    }

    pub fn set_unmarked(&self) {
        self.nlink_seen.fetch_or(UNMARKED, Ordering::AcqRel);
    }

    /// Whether it is a clone's file that took its base's blocks at its
    /// first change (see `SHARED_AT_CHANGE`).
    pub fn shared_at_change(&self) -> bool {
        self.nlink_seen.load(Ordering::Acquire) & SHARED_AT_CHANGE != 0
    }

    pub fn set_shared_at_change(&self) {
        self.nlink_seen.fetch_or(SHARED_AT_CHANGE, Ordering::AcqRel);
    }

    /// Whether it was found not to be a clone's linked copy.
    pub fn known_unindexed(&self) -> bool {
        self.nlink_seen.load(Ordering::Acquire) & UNINDEXED != 0
    }

    pub fn set_unindexed(&self) {
        self.nlink_seen.fetch_or(UNINDEXED, Ordering::AcqRel);
    }

    pub fn first_sight(&self) -> bool {
        self.nlink_seen.fetch_or(SEEN, Ordering::AcqRel) & SEEN == 0
    }
}

/// An inode's (parent, name) in one allocation: the parent's number in
/// the first 8 bytes, then the name.
fn pack_name(parent: InodeNo, name: &[u8]) -> Box<[u8]> {
    let mut packed = Vec::with_capacity(8 + name.len());
    packed.extend_from_slice(&parent.0.to_ne_bytes());
    packed.extend_from_slice(name);
    packed.into_boxed_slice()
}

fn unpack_name(packed: &[u8]) -> (InodeNo, &[u8]) {
    let (parent, name) = packed.split_at(8);
    let mut number = [0u8; 8];
    number.copy_from_slice(parent);
    (InodeNo(u64::from_ne_bytes(number)), name)
}

impl Drop for FdSlot {
    fn drop(&mut self) {
        if let FdSlot::Handle {
            cached,
            cache_count,
            ..
        } = &self
        {
            if cached.lock().take().is_some() {
                cache_count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

#[derive(Default)]
struct Tables {
    by_ino: super::inode_index::ByIno,
    by_key: super::inode_index::ByKey,
    /// Entries dropped since memory was last given back.
    dropped: usize,
}

/// Below this many slots a map is not worth shrinking.
const SHRINK_FLOOR: usize = 4096;

/// Forgets between two returns of free memory to the kernel: a long
/// removal (`rm -r` of a large tree, which with history also builds and
/// frees a version per file) leaves the daemon near its working set, at
/// one `malloc_trim` (about a millisecond) per this many files.
const TRIM_EVERY: usize = 65536;

impl Tables {
    /// After the kernel forgot most inodes (memory pressure, `rm -r` of a
    /// large tree), gives the maps' room back: a map never shrinks on its
    /// own, and would stay at the size of the largest tree ever held.
    /// Shrinks to twice what is held, so the cost is amortized over the
    /// forgets that emptied it and a regrowing table does not thrash.
    /// Returns whether free memory is to be given back now: after a
    /// shrink, or every `TRIM_EVERY` forgets.
    fn note_drop(&mut self) -> bool {
        self.dropped += 1;
        let (held, room) = (self.by_ino.len(), self.by_ino.capacity());
        if room > SHRINK_FLOOR && held <= room / 8 {
            self.by_ino.shrink_to(held * 2);
            self.by_key.shrink_to(held * 2);
        } else if self.dropped < TRIM_EVERY {
            return false;
        }
        self.dropped = 0;
        true
    }
}

pub struct InodeTable {
    branch: BranchId,
    map: InodeMap,
    tables: RwLock<Tables>,
    root_key: BackingKey,
    /// Per branch (by its persistent id, which keys carry), how handles
    /// are re-opened; a branch inserted while mounted adds its own.
    mounts: RwLock<Vec<(BranchId, Arc<BranchMount>)>>,
    /// Whether some mount has a device alias: keys are then translated.
    aliased: AtomicBool,
    /// The union's branch set generation (`Inode::generation`).
    generation: AtomicU32,
    /// Cached descriptors currently open, and how many may be.
    cache_count: Arc<AtomicUsize>,
    cache_budget: usize,
    /// Bumped when numbers that listings show may have changed without
    /// any directory changing (see `rebind`); part of every listing stamp.
    numbering: AtomicU64,
}

/// Descriptor used to re-open a branch's handles, and the mount it is on
/// (`None` when the backing file system has no file handles).
#[derive(Default)]
pub struct BranchMount {
    mount_fd: Option<Arc<OwnedFd>>,
    mount_id: Option<i32>,
    /// Where its root's file system has another device number than its
    /// keys carry.
    dev_alias: DevAlias,
}

impl BranchMount {
    /// The mount of the branch whose root is `root_fd` and whose keys
    /// carry `key_dev` for its root's file system (`None`: its own).
    pub fn of(root_fd: std::os::fd::BorrowedFd<'_>, key_dev: Option<u64>) -> BranchMount {
        let dev_alias = key_dev
            .and_then(|key| Some(DevAlias::new(sys::fstat(root_fd).ok()?.st_dev, key)))
            .unwrap_or_default();
        BranchMount {
            dev_alias,
            ..BranchMount::opened(root_fd)
        }
    }

    fn opened(root_fd: std::os::fd::BorrowedFd<'_>) -> BranchMount {
        let mount_id = match sys::name_to_handle(root_fd) {
            Ok((_, id)) => Some(id),
            Err(e) => {
                tracing::warn!(
                    "the source file system has no file handles ({e}): one descriptor is \
                     held per inode the kernel remembers"
                );
                None
            }
        };
        // open_by_handle_at refuses an O_PATH descriptor as its mount
        // reference, so a real (read-only) one of the root is kept.
        let mount_fd = sys::reopen(root_fd, libc::O_RDONLY | libc::O_DIRECTORY);
        match (mount_id, mount_fd) {
            (Some(id), Ok(fd)) => BranchMount {
                mount_fd: Some(Arc::new(fd)),
                mount_id: Some(id),
                dev_alias: DevAlias::default(),
            },
            _ => BranchMount::default(),
        }
    }
}

impl InodeTable {
    /// `mounts`: every branch's, by id; `branch` is the one the root and
    /// new objects belong to; `root_layers` the root's copies in the other
    /// branches (a union).
    pub fn new(
        branch: BranchId,
        map: InodeMap,
        root_fd: OwnedFd,
        root_st: &Stat,
        mounts: Vec<(BranchId, BranchMount)>,
        root_layers: Vec<Layer>,
    ) -> Self {
        let mounts: Vec<(BranchId, Arc<BranchMount>)> =
            mounts.into_iter().map(|(b, m)| (b, Arc::new(m))).collect();
        let aliased = mounts.iter().any(|(_, m)| m.dev_alias.is_some());
        let root_key = BackingKey {
            branch: branch.0,
            dev: mounts
                .iter()
                .find(|(b, _)| *b == branch)
                .map_or(root_st.st_dev, |(_, m)| m.dev_alias.swap(root_st.st_dev)),
            ino: root_st.st_ino,
        };
        let root_fd = Arc::new(root_fd);
        let root = Arc::new(Inode {
            ino: InodeNo::ROOT,
            key: root_key,
            kind: libc::S_IFDIR,
            nlookup: AtomicU64::new(1),
            slot: FdSlot::Pinned(root_fd.clone()),
            name: Mutex::new(None),
            layers: RwLock::new(
                root_layers
                    .into_iter()
                    .map(|l| LayerSlot {
                        branch: l.branch,
                        slot: FdSlot::Pinned(l.fd),
                    })
                    .collect(),
            ),
            nlink_seen: AtomicU32::new(0),
            listed: AtomicU64::new(0),
            generation: AtomicU32::new(0),
        });
        let mut tables = Tables::default();
        tables.by_ino.insert(root.clone());
        tables.by_key.insert(root);
        // Half the descriptor limit for cached inode descriptors; the rest
        // is for open files, directories and the store.
        let cache_budget = (sys::fd_limit() / 2).clamp(256, 1 << 20) as usize;
        InodeTable {
            branch,
            map,
            tables: RwLock::new(tables),
            root_key,
            mounts: RwLock::new(mounts),
            aliased: AtomicBool::new(aliased),
            generation: AtomicU32::new(0),
            cache_count: Arc::new(AtomicUsize::new(0)),
            cache_budget,
            numbering: AtomicU64::new(0),
        }
    }

    /// Changes whenever a number listed for an unchanged directory entry
    /// may have changed.
    pub fn numbering(&self) -> u64 {
        self.numbering.load(Ordering::Acquire)
    }

    /// The branch the root and new objects belong to.
    pub fn primary_branch(&self) -> BranchId {
        self.branch
    }

    pub fn key_of(&self, st: &Stat) -> BackingKey {
        self.key_in(self.branch, st)
    }

    /// The key of an object of `branch`.
    pub fn key_in(&self, branch: BranchId, st: &Stat) -> BackingKey {
        BackingKey {
            branch: branch.0,
            dev: self.key_dev(branch, st.st_dev),
            ino: st.st_ino,
        }
    }

    /// The device number keys of `branch` carry for its objects on `dev`.
    pub fn key_dev(&self, branch: BranchId, dev: u64) -> u64 {
        self.dev_alias(branch).swap(dev)
    }

    /// How `branch`'s keys translate device numbers.
    pub fn dev_alias(&self, branch: BranchId) -> DevAlias {
        if !self.aliased.load(Ordering::Acquire) {
            return DevAlias::default();
        }
        self.mounts
            .read()
            .iter()
            .find(|(b, _)| *b == branch)
            .map_or_else(DevAlias::default, |(_, m)| m.dev_alias)
    }

    /// The branch the object with `key` is of.
    pub fn branch_of(&self, key: &BackingKey) -> BranchId {
        BranchId(key.branch)
    }

    /// The union's branch set generation inodes are stamped with now.
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// A new branch set is in force; the caller holds the union's set
    /// lock exclusively, so no inode is being made meanwhile.
    pub fn set_generation(&self, generation: u32) {
        self.generation.store(generation, Ordering::Release);
    }

    /// Handles of objects of branch `b` re-open on `mount` (a branch
    /// inserted while mounted).
    pub fn add_mount(&self, b: BranchId, mount: BranchMount) {
        let mut mounts = self.mounts.write();
        if mount.dev_alias.is_some() {
            self.aliased.store(true, Ordering::Release);
        }
        mounts.retain(|(id, _)| *id != b);
        mounts.push((b, Arc::new(mount)));
    }

    fn mount_of(&self, b: u32) -> Option<Arc<BranchMount>> {
        self.mounts
            .read()
            .iter()
            .find(|(id, _)| id.0 == b)
            .map(|(_, m)| m.clone())
    }

    /// The number of a backing object without assigning one.
    pub fn object_of(&self, st: &Stat) -> Option<ObjectId> {
        let key = self.key_of(st);
        if key == self.root_key {
            return Some(InodeNo::ROOT.object());
        }
        if let Some(ino) = self.tables.read().by_key.get(&key) {
            return Some(ino.object());
        }
        self.map.get(&key).ok().flatten().map(ObjectId::new)
    }

    pub fn get(&self, ino: InodeNo) -> Result<Arc<Inode>> {
        self.tables
            .read()
            .by_ino
            .get(&ino)
            .cloned()
            .ok_or(VfsError::UnknownInode(ino.0))
    }

    /// The inode `ino` with a descriptor of its backing object.
    pub fn node(&self, ino: InodeNo) -> Result<Node> {
        let inode = self.get(ino)?;
        self.node_of(inode)
    }

    pub fn node_of(&self, inode: Arc<Inode>) -> Result<Node> {
        let fd = self.fd(&inode)?;
        Ok(Node {
            inode,
            fd,
            through_copy: false,
        })
    }

    /// An O_PATH descriptor of the inode's backing object, re-opened from
    /// its handle if the cached one was evicted. Must be called with the
    /// daemon's own credentials (re-opening a handle needs them).
    pub fn fd(&self, inode: &Inode) -> Result<Arc<OwnedFd>> {
        self.slot_fd(&inode.slot)
    }

    /// A union directory's copies below its own, top-down, re-opened where
    /// their descriptors were evicted.
    pub fn layers(&self, inode: &Inode) -> Result<Vec<Layer>> {
        inode
            .layers
            .read()
            .iter()
            .map(|l| {
                Ok(Layer {
                    branch: l.branch,
                    fd: self.slot_fd(&l.slot)?,
                })
            })
            .collect()
    }

    /// A directory's copies below its own are now `layers`, found under
    /// branch set `generation`.
    pub fn set_layers(&self, inode: &Inode, layers: Vec<Layer>, generation: u32) {
        let slots = self.layer_slots(layers);
        *inode.layers.write() = slots;
        inode.stamp(generation);
    }

    fn layer_slots(&self, layers: Vec<Layer>) -> Box<[LayerSlot]> {
        layers
            .into_iter()
            .map(|l| LayerSlot {
                branch: l.branch,
                slot: self.slot_for_shared(l.branch, l.fd),
            })
            .collect()
    }

    fn slot_fd(&self, slot: &FdSlot) -> Result<Arc<OwnedFd>> {
        let (branch, handle, cached, referenced) = match slot {
            FdSlot::Pinned(fd) => return Ok(fd.clone()),
            FdSlot::Handle {
                branch,
                handle,
                cached,
                referenced,
                ..
            } => (*branch, handle, cached, referenced),
        };
        referenced.store(true, Ordering::Relaxed);
        let mut slot = cached.lock();
        if let Some(fd) = &*slot {
            return Ok(fd.clone());
        }
        let fd = Arc::new(self.open_handle(branch, handle)?);
        *slot = Some(fd.clone());
        drop(slot);
        self.count_cached();
        Ok(fd)
    }

    fn open_handle(&self, branch: u32, handle: &sys::FileHandle) -> Result<OwnedFd> {
        let mount = self.mount_of(branch);
        let mount_fd = mount
            .as_ref()
            .and_then(|m| m.mount_fd.as_ref())
            .ok_or(VfsError::WrongKind)?;
        Ok(sys::open_by_handle(
            mount_fd.as_fd(),
            handle,
            libc::O_PATH | libc::O_NOFOLLOW,
        )?)
    }

    fn count_cached(&self) {
        if self.cache_count.fetch_add(1, Ordering::Relaxed) + 1 > self.cache_budget {
            self.evict();
        }
    }

    /// Drops cached descriptors until a quarter of the budget is free,
    /// sparing recently used ones on the first pass (second chance).
    fn evict(&self) {
        let target = self.cache_budget * 3 / 4;
        let tables = self.tables.read();
        for pass in 0..2 {
            for inode in tables.by_ino.values() {
                if self.cache_count.load(Ordering::Relaxed) <= target {
                    return;
                }
                self.evict_slot(&inode.slot, pass);
                // A set being replaced is skipped, not waited for.
                if let Some(layers) = inode.layers.try_read() {
                    for l in layers.iter() {
                        self.evict_slot(&l.slot, pass);
                    }
                }
            }
        }
    }

    fn evict_slot(&self, slot: &FdSlot, pass: u32) {
        let FdSlot::Handle {
            cached,
            referenced,
            pinned,
            ..
        } = slot
        else {
            return;
        };
        if pinned.load(Ordering::Relaxed)
            || (referenced.swap(false, Ordering::Relaxed) && pass == 0)
        {
            return;
        }
        if let Some(mut slot) = cached.try_lock() {
            if pinned.load(Ordering::Relaxed) {
                return;
            }
            if slot.take().is_some() {
                self.cache_count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Keeps the object with `key`, if the kernel knows it, reachable after
    /// it loses its last name.
    pub fn pin_if_known(&self, key: &BackingKey) -> Result<()> {
        let known = {
            let tables = self.tables.read();
            tables
                .by_key
                .get(key)
                .and_then(|ino| tables.by_ino.get(ino).cloned())
        };
        let Some(inode) = known else {
            return Ok(());
        };
        let FdSlot::Handle {
            branch,
            handle,
            cached,
            pinned,
            ..
        } = &inode.slot
        else {
            return Ok(());
        };
        // Marked under the slot lock, which eviction re-checks under the
        // same lock: the descriptor loaded here can never be dropped.
        let mut slot = cached.lock();
        pinned.store(true, Ordering::Relaxed);
        if slot.is_some() {
            return Ok(());
        }
        *slot = Some(Arc::new(self.open_handle(*branch, handle)?));
        drop(slot);
        self.count_cached();
        Ok(())
    }

    /// Drops the inode-map entry of a backing object that no longer exists.
    pub fn retire(&self, key: &BackingKey) -> std::result::Result<(), StoreError> {
        if *key == self.root_key {
            return Ok(());
        }
        let known = self.tables.read().by_key.get(key).map(|ino| ino.0);
        let mapped = match known {
            Some(ino) => Some(ino),
            None => self.map.get(key)?,
        };
        if let Some(ino) = mapped {
            self.map.retire(*key, ino);
        }
        Ok(())
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

    /// [`InodeTable::number_for`] for a batch of keys, with one index read.
    pub fn numbers_for(
        &self,
        keys: &[BackingKey],
    ) -> std::result::Result<Vec<InodeNo>, StoreError> {
        let mut out = vec![InodeNo(0); keys.len()];
        let mut unknown = Vec::new();
        {
            let tables = self.tables.read();
            for (i, key) in keys.iter().enumerate() {
                match tables.by_key.get(key) {
                    Some(ino) => out[i] = *ino,
                    None => unknown.push(i),
                }
            }
        }
        if !unknown.is_empty() {
            let wanted: Vec<BackingKey> = unknown.iter().map(|&i| keys[i]).collect();
            for (i, ino) in unknown
                .into_iter()
                .zip(self.map.get_or_assign_many(&wanted)?)
            {
                out[i] = InodeNo(ino);
            }
        }
        Ok(out)
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

    fn slot_for(&self, branch: BranchId, fd: OwnedFd) -> FdSlot {
        self.slot_for_shared(branch, Arc::new(fd))
    }

    fn slot_for_shared(&self, branch: BranchId, fd: Arc<OwnedFd>) -> FdSlot {
        let mount_id = self.mount_of(branch.0).and_then(|m| m.mount_id);
        let handle = match (mount_id, sys::name_to_handle(fd.as_fd())) {
            (Some(root_mount), Ok((handle, mount))) if mount == root_mount => handle,
            // Another mount below SRC, or no handle support: keep it open.
            _ => return FdSlot::Pinned(fd),
        };
        self.count_cached();
        FdSlot::Handle {
            branch: branch.0,
            handle,
            cached: Mutex::new(Some(fd)),
            referenced: AtomicBool::new(true),
            pinned: AtomicBool::new(false),
            cache_count: self.cache_count.clone(),
        }
    }

    /// Whether `name` in `dir` still names `inode`'s object. A backing
    /// inode number can be reused after the object was deleted behind the
    /// mount's back; the file handle carries the generation that tells the
    /// two apart. (A pinned object cannot have its number reused.)
    pub fn still_names(
        &self,
        inode: &Inode,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::CStr,
    ) -> bool {
        match &inode.slot {
            FdSlot::Pinned(_) => true,
            FdSlot::Handle { handle, .. } => {
                matches!(sys::name_to_handle_at(dir, name), Ok((h, _)) if h == *handle)
            }
        }
    }

    /// Whether the open descriptor `fd` is `inode`'s object (same backing
    /// key is given; the handle's generation tells a reused number apart).
    fn is_same_object(&self, inode: &Inode, fd: std::os::fd::BorrowedFd<'_>) -> bool {
        match &inode.slot {
            FdSlot::Pinned(_) => true,
            FdSlot::Handle { handle, .. } => {
                matches!(sys::name_to_handle(fd), Ok((h, _)) if h == *handle)
            }
        }
    }

    /// Forgets that `inode` is the object with its backing key (its number
    /// was reused); the kernel's references to it stay valid until forgotten.
    pub fn detach_key(&self, inode: &Inode) {
        let mut tables = self.tables.write();
        if tables.by_key.get(&inode.key) == Some(&inode.ino) {
            tables.by_key.remove(&inode.key);
        }
    }

    /// Registers a newly opened backing object (or takes a reference on the
    /// existing one if another thread registered it first). `fresh`: the
    /// object was just created (or its backing number found reused), so it
    /// gets a new number and any entry under its key is stale.
    pub fn acquire_new(&self, fd: OwnedFd, st: &Stat, fresh: bool) -> Result<Arc<Inode>> {
        self.acquire(self.branch, fd, st, fresh, false, Vec::new())
    }

    /// [`InodeTable::acquire_new`] for an object of `branch` (a union's
    /// create policy may put a new object in any read-write branch).
    pub fn acquire_new_in(
        &self,
        branch: BranchId,
        fd: OwnedFd,
        st: &Stat,
        fresh: bool,
    ) -> Result<Arc<Inode>> {
        self.acquire(branch, fd, st, fresh, false, Vec::new())
    }

    /// [`InodeTable::acquire_new`] for an object of `branch`, with the
    /// lower copies of a union directory.
    pub fn acquire_in(
        &self,
        branch: BranchId,
        fd: OwnedFd,
        st: &Stat,
        layers: Vec<Layer>,
    ) -> Result<Arc<Inode>> {
        self.acquire(branch, fd, st, false, false, layers)
    }

    /// Registers an object that has no name (O_TMPFILE): a handle could
    /// never re-open it, so its descriptor is held for its lifetime.
    pub fn acquire_unnamed(&self, fd: OwnedFd, st: &Stat) -> Result<Arc<Inode>> {
        self.acquire(self.branch, fd, st, true, true, Vec::new())
    }

    fn acquire(
        &self,
        branch: BranchId,
        fd: OwnedFd,
        st: &Stat,
        fresh: bool,
        pin: bool,
        layers: Vec<Layer>,
    ) -> Result<Arc<Inode>> {
        let key = self.key_in(branch, st);
        let mut fresh = fresh;
        if !fresh {
            if let Some(inode) = self.acquire_known(&key) {
                if self.is_same_object(&inode, fd.as_fd()) {
                    return Ok(inode);
                }
                // The backing number was reused for another object.
                self.forget(inode.ino, 1);
                self.detach_key(&inode);
                fresh = true;
            }
        }
        let ino = if fresh {
            InodeNo(self.map.assign_fresh(key))
        } else {
            InodeNo(self.map.get_or_assign(key)?)
        };
        let slot = if pin {
            FdSlot::Pinned(Arc::new(fd))
        } else {
            self.slot_for(branch, fd)
        };
        // Before the table lock: making a slot may evict, which reads it.
        let layers = self.layer_slots(layers);
        let mut tables = self.tables.write();
        if !fresh {
            if let Some(existing) = tables.by_key.get(&key).and_then(|i| tables.by_ino.get(i)) {
                existing.nlookup.fetch_add(1, Ordering::AcqRel);
                return Ok(existing.clone());
            }
            // The number is held by another copy of the object: a copy-up
            // rebound it after the caller found this one (or, for a hard
            // link, every lower name stands for the copy). The copy is the
            // object now; replacing it would give later calls the old one.
            if let Some(existing) = tables.by_ino.get(&ino).filter(|e| e.key != key) {
                existing.nlookup.fetch_add(1, Ordering::AcqRel);
                return Ok(existing.clone());
            }
        }
        let inode = Arc::new(Inode {
            ino,
            key,
            kind: st.st_mode & libc::S_IFMT,
            nlookup: AtomicU64::new(1),
            slot,
            name: Mutex::new(None),
            layers: RwLock::new(layers),
            nlink_seen: AtomicU32::new(0),
            listed: AtomicU64::new(0),
            generation: AtomicU32::new(self.generation()),
        });
        tables.by_ino.insert(inode.clone());
        tables.by_key.insert(inode.clone());
        Ok(inode)
    }

    /// Copy-up: inode `ino` is now the object `fd` of `branch` (with
    /// `layers` below it), under the same number, so st_ino and history
    /// survive. Operations already holding the old inode finish on the
    /// old object; every later one reaches the new.
    pub fn rebind(
        &self,
        ino: InodeNo,
        branch: BranchId,
        fd: OwnedFd,
        st: &Stat,
        layers: Vec<Layer>,
    ) -> Result<Arc<Inode>> {
        self.rebind_as(ino, (branch, fd, st), layers, true)
    }

    /// Before a copy of `ino`'s object becomes visible in `branch`: its
    /// number is the copy's from now on, so that a listing that finds the
    /// copy before [`InodeTable::rebind`] (the history worker's) neither
    /// gives it a number of its own nor records that number in history,
    /// whose bindings would then outlive the rebind across a remount.
    pub fn bind_copy(&self, branch: BranchId, st: &Stat, ino: InodeNo) {
        self.map.bind(self.key_in(branch, st), ino.0);
    }

    /// [`InodeTable::rebind`] where the old object stays a copy of the
    /// same object (a directory whose top copy moved to another branch
    /// when the branch set changed): its key keeps the number.
    pub fn rebind_keeping(
        &self,
        ino: InodeNo,
        branch: BranchId,
        fd: OwnedFd,
        st: &Stat,
        layers: Vec<Layer>,
    ) -> Result<Arc<Inode>> {
        self.rebind_as(ino, (branch, fd, st), layers, false)
    }

    /// `key` is numbered `ino` from now on.
    pub fn bind_key(&self, key: BackingKey, ino: InodeNo) {
        self.map.bind(key, ino.0);
    }

    /// The number the inode map holds for `key`, if any.
    pub fn mapped(&self, key: &BackingKey) -> Result<Option<InodeNo>> {
        Ok(self.map.get(key)?.map(InodeNo))
    }

    /// Every (parent, name) the kernel reached a remembered inode by.
    pub fn names(&self) -> Vec<(InodeNo, Vec<u8>)> {
        let tables = self.tables.read();
        tables.by_ino.values().filter_map(|i| i.name()).collect()
    }

    /// [`InodeTable::rebind`] of a hard-linked file copied up through the
    /// union's index: its other lower names resolve to the copy too, so
    /// the lower object keeps the number.
    pub fn rebind_linked(
        &self,
        ino: InodeNo,
        branch: BranchId,
        fd: OwnedFd,
        st: &Stat,
    ) -> Result<Arc<Inode>> {
        self.rebind_as(ino, (branch, fd, st), Vec::new(), false)
    }

    fn rebind_as(
        &self,
        ino: InodeNo,
        (branch, fd, st): (BranchId, OwnedFd, &Stat),
        layers: Vec<Layer>,
        retire_old: bool,
    ) -> Result<Arc<Inode>> {
        let key = self.key_in(branch, st);
        self.map.bind(key, ino.0);
        let slot = self.slot_for(branch, fd);
        let layers = self.layer_slots(layers);
        let mut tables = self.tables.write();
        let old = tables
            .by_ino
            .get(&ino)
            .cloned()
            .ok_or(VfsError::UnknownInode(ino.0))?;
        let inode = Arc::new(Inode {
            ino,
            key,
            kind: old.kind,
            nlookup: AtomicU64::new(old.nlookup.load(Ordering::Acquire)),
            slot,
            name: Mutex::new(old.name.lock().clone()),
            layers: RwLock::new(layers),
            nlink_seen: AtomicU32::new(old.nlink_seen.load(Ordering::Acquire)),
            listed: AtomicU64::new(0),
            generation: AtomicU32::new(self.generation()),
        });
        if tables.by_key.get(&old.key) == Some(&ino) {
            tables.by_key.remove(&old.key);
        }
        tables.by_ino.insert(inode.clone());
        tables.by_key.insert(inode.clone());
        drop(tables);
        // The lower object keeps its other names (hard links) in its
        // branch; reached by one of them it must not claim this number,
        // whose data is now the copy's (it gets a number of its own: a
        // hard link is broken by copy-up, as on overlayfs without index).
        // A directory has no other names: its copy below stays the same
        // directory, and shows again under this number when the copy above
        // goes (a branch removed, a mount without it).
        if old.key != key && retire_old && old.kind != libc::S_IFDIR {
            self.map.retire(old.key, ino.0);
            // Its other names' d_ino in listings the kernel keeps is now
            // wrong, and which directories hold them is unknown.
            let single = self
                .fd(&old)
                .and_then(|fd| Ok(sys::fstat(fd.as_fd())?))
                .is_ok_and(|st| st.st_nlink <= 1);
            if !single {
                self.numbering.fetch_add(1, Ordering::AcqRel);
            }
        }
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
        if inode.nlookup.load(Ordering::Acquire) != 0 {
            return;
        }
        tables.by_ino.remove(&ino);
        if tables.by_key.get(&inode.key) == Some(&ino) {
            tables.by_key.remove(&inode.key);
        }
        if tables.note_drop() {
            drop(tables);
            drop(inode);
            sys::release_free_memory();
        }
    }

    /// How many inodes the kernel remembers (the root included).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.tables.read().by_ino.len()
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
        /// Who opened it: data written through the handle is written with
        /// this identity (quota, reserved blocks, set-id clearing), as a
        /// descriptor carries its opener's credentials natively.
        opener: super::Caller,
        /// Opened for writing while history is captured: its close ends a
        /// write session.
        session: SessionMark,
        /// Opened for writing (a branch that turns read-only must have
        /// none, `Vfs::set_branch_mode`).
        writes: bool,
        /// The persistent id of the branch the object was in when opened.
        branch: u32,
        /// A clone's file that still shows its base: the view handle its
        /// reads go to while the mark stays, and the materialisation
        /// count when it was opened (`vfs/clone.rs`).
        base: Option<(u64, u64)>,
        /// A clone's file with bytes of its own and its base's, opened as
        /// one or met since (`vfs/clone_patch.rs`): kept while the handle
        /// is open.
        patched: Mutex<Option<std::sync::Arc<super::clone_patch::Patched>>>,
        /// Opened by execve(2): the program runs while it is open.
        executes: bool,
        /// Each write is a version: without passthrough the kernel sends
        /// them uncached (DIRECT_IO) and, then, keeps no mtime of its own.
        per_write: bool,
        /// A reader whose object was copied up to another branch since it
        /// opened reads the copy, opened once (`Vfs::followed`): the id of
        /// that branch and the descriptor.
        followed: Mutex<Option<(u32, std::sync::Arc<OwnedFd>)>>,
    },
    Dir {
        ino: InodeNo,
        stream: Mutex<super::dir::DirStream>,
    },
}

/// Whether closing a file handle ends a write session. A create starts
/// the session after its handle is in the table, where a branch change may
/// hold it or close it meanwhile: exactly one of the session's start
/// ([`SessionMark::begin`]) and the handle's close ([`SessionMark::end`])
/// finds the other done, and that one ends the session.
#[derive(Debug, Default)]
pub struct SessionMark(std::sync::atomic::AtomicU8);

const NO_SESSION: u8 = 0;
const IN_SESSION: u8 = 1;
const CLOSED: u8 = 2;
const STATE: u8 = 3;
/// close(2) flushed the handle at least once while in its session.
const FLUSHED: u8 = 4;

impl SessionMark {
    pub fn new(session: bool) -> Self {
        SessionMark(std::sync::atomic::AtomicU8::new(match session {
            true => IN_SESSION,
            false => NO_SESSION,
        }))
    }

    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::Acquire) & STATE == IN_SESSION
    }

    /// The handle's session started; false: the handle was closed first,
    /// so the caller ends the session itself.
    pub fn begin(&self) -> bool {
        self.0
            .compare_exchange(NO_SESSION, IN_SESSION, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// A flush of the handle in its session; whether it is the first
    /// (the capture counts each handle's release as due once).
    pub fn note_flush(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v & STATE == IN_SESSION && v & FLUSHED == 0).then_some(v | FLUSHED)
            })
            .is_ok()
    }

    /// The handle closes: `None` if that ends no session, else whether
    /// the handle was flushed in it ([`SessionMark::note_flush`]).
    pub fn end(&self) -> Option<bool> {
        let was = self.0.swap(CLOSED, Ordering::AcqRel);
        (was & STATE == IN_SESSION).then_some(was & FLUSHED != 0)
    }
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
    /// Handles closed by a branch change rather than by their owner: any
    /// use but the release answers ESTALE.
    revoked: Mutex<std::collections::HashSet<u64>>,
    /// How many handles were removed so far, and a wakeup for each.
    removals: Mutex<u64>,
    removed: parking_lot::Condvar,
    /// The open file handles of each inode (see [`HandleTable::open_file`]).
    by_ino: Mutex<HashMap<InodeNo, Vec<u64>>>,
}

impl Default for HandleTable {
    fn default() -> Self {
        HandleTable {
            next: AtomicU64::new(1),
            handles: RwLock::new(HashMap::new()),
            revoked: Mutex::new(std::collections::HashSet::new()),
            removals: Mutex::new(0),
            removed: parking_lot::Condvar::new(),
            by_ino: Mutex::new(HashMap::new()),
        }
    }
}

impl HandleTable {
    pub fn insert(&self, handle: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        if let Handle::File { ino, .. } = &handle {
            self.by_ino.lock().entry(*ino).or_default().push(fh);
        }
        self.handles.write().insert(fh, Arc::new(handle));
        fh
    }

    /// An open handle of `ino` whose descriptor is the object with `key`
    /// (not a copy a copy-up left behind): xattrs read through it cost no
    /// `/proc` path walk, as the inode's O_PATH descriptor's do.
    pub fn open_file(
        &self,
        ino: InodeNo,
        key: &BackingKey,
        inodes: &InodeTable,
    ) -> Option<Arc<Handle>> {
        let fhs = self.by_ino.lock().get(&ino).cloned()?;
        fhs.into_iter().find_map(|fh| {
            let h = self.handles.read().get(&fh).cloned()?;
            let Handle::File { fd, .. } = &*h else {
                return None;
            };
            let st = sys::fstat(fd.as_fd()).ok()?;
            (inodes.key_in(BranchId(key.branch), &st) == *key).then_some(h)
        })
    }

    /// Whether a program runs from `ino`: a handle execve(2) opened is
    /// still open.
    pub fn executing(&self, ino: InodeNo) -> bool {
        let Some(fhs) = self.by_ino.lock().get(&ino).cloned() else {
            return false;
        };
        let handles = self.handles.read();
        fhs.iter().any(|fh| {
            handles
                .get(fh)
                .is_some_and(|h| matches!(&**h, Handle::File { executes: true, .. }))
        })
    }

    fn forget_file(&self, fh: u64, handle: &Handle) {
        if let Handle::File { ino, .. } = handle {
            let mut by_ino = self.by_ino.lock();
            if let Some(fhs) = by_ino.get_mut(ino) {
                fhs.retain(|f| *f != fh);
                if fhs.is_empty() {
                    by_ino.remove(ino);
                }
            }
        }
    }

    pub fn get(&self, fh: u64) -> Result<Arc<Handle>> {
        let found = self.handles.read().get(&fh).cloned();
        found.ok_or_else(|| self.missing(fh))
    }

    fn missing(&self, fh: u64) -> VfsError {
        if self.revoked.lock().contains(&fh) {
            VfsError::RevokedHandle(fh)
        } else {
            VfsError::UnknownHandle(fh)
        }
    }

    /// Every open file handle.
    pub fn files(&self) -> Vec<(u64, Arc<Handle>)> {
        self.handles
            .read()
            .iter()
            .filter(|(_, h)| matches!(&***h, Handle::File { .. }))
            .map(|(fh, h)| (*fh, h.clone()))
            .collect()
    }

    /// Marks a file handle as ending a write session when closed; false:
    /// it is closed already (revoked by a branch change), and the caller
    /// ends the session.
    pub fn mark_session(&self, fh: u64) -> bool {
        match self.handles.read().get(&fh).map(|h| &**h) {
            Some(Handle::File { session, .. }) => session.begin(),
            _ => false,
        }
    }

    pub fn remove(&self, fh: u64) -> Result<Arc<Handle>> {
        let removed = self.handles.write().remove(&fh);
        if let Some(h) = &removed {
            self.forget_file(fh, h);
            *self.removals.lock() += 1;
            self.removed.notify_all();
        }
        match removed {
            Some(h) => Ok(h),
            // Its owner's close of a revoked handle: forgotten now.
            None if self.revoked.lock().remove(&fh) => Err(VfsError::RevokedHandle(fh)),
            None => Err(VfsError::UnknownHandle(fh)),
        }
    }

    /// How many handles were removed so far (see [`HandleTable::wait_removal`]).
    pub fn removals(&self) -> u64 {
        *self.removals.lock()
    }

    /// Waits until a handle is removed after the `seen`th, or `deadline`;
    /// whether one was.
    pub fn wait_removal(&self, seen: u64, deadline: std::time::Instant) -> bool {
        let mut removals = self.removals.lock();
        while *removals == seen {
            if self.removed.wait_until(&mut removals, deadline).timed_out() {
                return false;
            }
        }
        true
    }

    /// Takes `fh` away from its owner: later uses answer ESTALE until
    /// its release. Returns the handle, for the caller to close.
    pub fn revoke(&self, fh: u64) -> Option<Arc<Handle>> {
        let mut handles = self.handles.write();
        let handle = handles.remove(&fh)?;
        drop(handles);
        self.forget_file(fh, &handle);
        self.revoked.lock().insert(fh);
        Some(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    /// Held by tests that count the process's descriptors or hold many:
    /// they would see each other's.
    static DESCRIPTORS: Mutex<()> = Mutex::new(());

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
    }

    fn dir_fd_file(p: &std::path::Path) -> OwnedFd {
        let c = sys::cstr(p.as_os_str()).unwrap();
        sys::openat(sys::CWD, &c, libc::O_PATH, 0).unwrap()
    }

    fn dir_fd(p: &std::path::Path) -> OwnedFd {
        let c = sys::cstr(p.as_os_str()).unwrap();
        sys::openat(sys::CWD, &c, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap()
    }

    /// A union directory's lower copies count against the descriptor
    /// budget like inodes' own: a tree of many union directories does not
    /// hold a descriptor per branch each, and an evicted copy re-opens.
    #[test]
    fn union_directory_layers_are_evicted_and_reopened() {
        let tmp = tempfile::tempdir().unwrap();
        let (upper, lower) = (tmp.path().join("u"), tmp.path().join("l"));
        const DIRS: usize = 600;
        let _alone = DESCRIPTORS.lock();
        for i in 0..DIRS {
            std::fs::create_dir_all(upper.join(format!("d{i}"))).unwrap();
            std::fs::create_dir_all(lower.join(format!("d{i}/in"))).unwrap();
        }
        let store = Store::open(&tmp.path().join("store")).unwrap();
        let (ufd, lfd) = (dir_fd(&upper), dir_fd(&lower));
        let mounts = vec![
            (BranchId(0), BranchMount::of(ufd.as_fd(), None)),
            (BranchId(1), BranchMount::of(lfd.as_fd(), None)),
        ];
        if mounts.iter().any(|(_, m)| m.mount_fd.is_none()) {
            eprintln!("no file handles on this file system: nothing to test");
            return;
        }
        let root_st = sys::fstat(ufd.as_fd()).unwrap();
        let root = sys::reopen(ufd.as_fd(), libc::O_PATH | libc::O_DIRECTORY).unwrap();
        let mut table = InodeTable::new(
            BranchId(0),
            store.inode_map().unwrap(),
            root,
            &root_st,
            mounts,
            Vec::new(),
        );
        table.cache_budget = 256;
        let before = open_fds();
        let mut inodes = Vec::new();
        for i in 0..DIRS {
            let name = sys::cstr(std::ffi::OsStr::new(&format!("d{i}"))).unwrap();
            let own = sys::open_path(ufd.as_fd(), &name).unwrap();
            let below = Layer {
                branch: BranchId(1),
                fd: Arc::new(sys::open_path(lfd.as_fd(), &name).unwrap()),
            };
            let st = sys::fstat(own.as_fd()).unwrap();
            inodes.push(
                table
                    .acquire_in(BranchId(0), own, &st, vec![below])
                    .unwrap(),
            );
        }
        let held = open_fds().saturating_sub(before);
        assert!(
            held <= 300,
            "{held} descriptors held for {DIRS} two-branch directories"
        );
        // The first directory's lower copy was evicted long ago: it re-opens.
        let layers = table.layers(&inodes[0]).unwrap();
        assert_eq!(layers.len(), 1);
        assert!(sys::fstatat(layers[0].fd.as_fd(), c"in").is_ok());
    }

    /// Memory follows what the kernel remembers: each remembered inode
    /// costs at most `PER_INODE` bytes of heap (table entry, both maps'
    /// share, handle, name), and forgetting them all gives it back.
    #[test]
    fn memory_per_remembered_inode_is_bounded_and_freed_on_forget() {
        // The heap in use is the whole process's: tests running beside
        // this one allocate too (CI failed it with 3.4 MB another test
        // held). The measurement runs alone, in a child process.
        const CHILD: &str = "CHRONOFS_TEST_MEMORY_ALONE";
        if std::env::var_os(CHILD).is_none() {
            let name =
                "vfs::inodes::tests::memory_per_remembered_inode_is_bounded_and_freed_on_forget";
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--test-threads=1", "--nocapture"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{text}");
            assert!(text.contains("1 passed"), "the child ran nothing: {text}");
            eprintln!("{text}");
            return;
        }
        const N: u64 = 100_000;
        const PER_INODE: usize = 300;
        let _alone = DESCRIPTORS.lock();
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let store = Store::open(&tmp.path().join("store")).unwrap();
        let root = dir_fd(tmp.path());
        let mounts = vec![(BranchId(0), BranchMount::of(root.as_fd(), None))];
        let root_st = sys::fstat(root.as_fd()).unwrap();
        let mut table = InodeTable::new(
            BranchId(0),
            store.inode_map().unwrap(),
            root,
            &root_st,
            mounts,
            Vec::new(),
        );
        table.cache_budget = 4096;
        let fd = dir_fd_file(&file);
        let mut st = sys::fstat(fd.as_fd()).unwrap();
        let name_of = |i: u64| format!("file-{i:07}");
        let acquire_all = |table: &InodeTable, st: &mut Stat, fresh: bool| {
            let mut inos = Vec::new();
            for i in 0..N {
                st.st_ino = 1_000_000 + i;
                let fd = sys::reopen(fd.as_fd(), libc::O_PATH).unwrap();
                let inode = table.acquire_new(fd, st, fresh).unwrap();
                inode.set_name(InodeNo::ROOT, name_of(i).as_bytes());
                inos.push(inode.ino);
            }
            inos
        };
        // Numbers first, so that only the table is measured: the inode
        // map's cache of recent numbers is bounded on its own.
        for ino in acquire_all(&table, &mut st, true) {
            table.forget(ino, 1);
        }
        table.flush().unwrap();
        let before = sys::heap_in_use();
        let inos = acquire_all(&table, &mut st, false);
        let held = sys::heap_in_use().saturating_sub(before);
        let per_inode = held / N as usize;
        eprintln!(
            "{per_inode} bytes per remembered inode ({held} for {N}; the entry is {})",
            std::mem::size_of::<Inode>()
        );
        assert!(
            per_inode <= PER_INODE,
            "{per_inode} bytes per remembered inode"
        );
        for ino in inos {
            table.forget(ino, 1);
        }
        assert_eq!(table.len(), 1, "only the root stays");
        let left = sys::heap_in_use().saturating_sub(before);
        eprintln!("{left} bytes left after forgetting all");
        assert!(
            left < held / 10,
            "{left} of {held} bytes still held after every forget"
        );
    }

    fn file_handle(dir: &std::path::Path) -> Handle {
        let path = dir.join("f");
        std::fs::write(&path, b"x").unwrap();
        let c = sys::cstr(path.as_os_str()).unwrap();
        Handle::File {
            ino: InodeNo(2),
            fd: sys::openat(sys::CWD, &c, libc::O_RDWR, 0).unwrap(),
            opener: super::super::Caller {
                uid: 0,
                gid: 0,
                pid: 0,
            },
            session: SessionMark::default(),
            writes: true,
            patched: Mutex::new(None),
            branch: 0,
            base: None,
            executes: false,
            per_write: false,
            followed: Mutex::new(None),
        }
    }

    fn ends_session(handle: &Handle) -> bool {
        match handle {
            Handle::File { session, .. } => session.end().is_some(),
            Handle::Dir { .. } => false,
        }
    }

    /// A create marks its handle after it is in the table, where a branch
    /// change may be looking at it (holding it) at that moment.
    #[test]
    fn a_session_marked_while_the_handle_is_held_elsewhere_ends_at_its_close() {
        let dir = tempfile::tempdir().unwrap();
        let table = HandleTable::default();
        let fh = table.insert(file_handle(dir.path()));
        let held = table.files();
        assert!(table.mark_session(fh));
        drop(held);
        assert!(ends_session(&table.remove(fh).unwrap()));
    }

    /// A branch change may revoke and close the handle before the create
    /// marks it: the create is told, and ends the session itself.
    #[test]
    fn a_session_marked_after_its_handle_was_revoked_is_left_to_the_marker() {
        let dir = tempfile::tempdir().unwrap();
        let table = HandleTable::default();
        let fh = table.insert(file_handle(dir.path()));
        let revoked = table.revoke(fh).unwrap();
        let (shared, closing) = (revoked.clone(), revoked);
        assert!(!ends_session(&closing));
        assert!(!table.mark_session(fh));
        // Held by an operation in flight when revoked: marked now, the
        // close that already ran does not end it twice.
        match &*shared {
            Handle::File { session, .. } => assert!(!session.begin()),
            Handle::Dir { .. } => unreachable!(),
        }
    }
}
