//! The chunk store: content-addressed, compressed chunks appended to pack
//! files, located through the `chunks` table of the index.
//!
//! A chunk is named by the BLAKE3 hash of its plain bytes, so identical data
//! is stored once across files, versions and clones. Each daemon start
//! appends to a new pack (an old pack's tail may hold a half-written chunk
//! from a crash, which no index entry references); packs rotate at
//! `PACK_LIMIT`. New chunk locations are held in memory until the history
//! layer commits them with the versions that reference them (`take_new`).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

use super::io::{Create, Guarded, StoreFile};
use super::{index_error, Index, Space, StoreError, PACK_DIR};
use crate::sys;

/// A chunk's BLAKE3 hash: its name in the store. Serialized as the bare
/// 32 bytes (journal records and version records predate the type).
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Hash([u8; 32]);

impl Hash {
    pub const fn from_bytes(bytes: [u8; 32]) -> Hash {
        Hash(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The key of the hash in the index's tables.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// The hash a stored key or record holds, if it is one.
    pub fn from_slice(bytes: &[u8]) -> Option<Hash> {
        bytes.try_into().ok().map(Hash)
    }
}

impl std::fmt::Display for Hash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Key: BLAKE3 hash (32 bytes). Value: an encoded `Location`.
pub const CHUNKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("chunks");

pub const PACK_MAGIC: &[u8; 8] = b"CHRNPACK";
pub const PACK_FORMAT: u32 = 1;
pub const PACK_HEADER_LEN: u64 = 16;
const ENTRY_MAGIC: u32 = 0x4348_4b31; // "CHK1"
/// magic u32 ‖ encoding u8 ‖ raw length u32 ‖ stored length u32 ‖ hash.
pub const ENTRY_HEADER_LEN: usize = 4 + 1 + 4 + 4 + 32;
const PACK_LIMIT: u64 = 256 << 20;
/// zstd level of chunks stored without a policy saying otherwise.
pub const ZSTD_LEVEL: i32 = 3;
/// A delta body starts with its base's hash and its lineage number.
const DELTA_PREFIX_LEN: usize = 32 + 4;
/// Most deltas one read may have to apply (one per set bit of a lineage
/// number, see `skip_base`).
pub const MAX_CHAIN: u32 = 31;
/// Bytes a read may decompress along a chain: a 64 KiB chunk gets at most
/// 3 deltas over its root, an 8 KiB one 31.
const CHAIN_BUDGET: usize = 256 << 10;

/// How a chunk's bytes are stored in its pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u8)]
pub enum Encoding {
    Raw = 0,
    Zstd = 1,
    /// zstd with another chunk's plain bytes as prefix: the body is the
    /// base's hash ‖ lineage number u32 ‖ the zstd frame.
    Delta = 2,
}

impl Encoding {
    fn from_u8(v: u8) -> Option<Encoding> {
        match v {
            0 => Some(Encoding::Raw),
            1 => Some(Encoding::Zstd),
            2 => Some(Encoding::Delta),
            _ => None,
        }
    }
}

/// Where a chunk lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub pack: u32,
    /// Offset of the entry header in the pack.
    pub offset: u64,
    pub raw_len: u32,
    pub stored_len: u32,
    pub encoding: Encoding,
}

impl Location {
    pub fn encode(&self) -> [u8; 21] {
        let mut b = [0u8; 21];
        b[..4].copy_from_slice(&self.pack.to_be_bytes());
        b[4..12].copy_from_slice(&self.offset.to_be_bytes());
        b[12..16].copy_from_slice(&self.raw_len.to_be_bytes());
        b[16..20].copy_from_slice(&self.stored_len.to_be_bytes());
        b[20] = self.encoding as u8;
        b
    }

    pub fn decode(b: &[u8]) -> Option<Location> {
        if b.len() != 21 {
            return None;
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut off = [0u8; 8];
        off.copy_from_slice(&b[4..12]);
        Some(Location {
            pack: u32_at(0),
            offset: u64::from_be_bytes(off),
            raw_len: u32_at(12),
            stored_len: u32_at(16),
            encoding: Encoding::from_u8(b[20])?,
        })
    }
}

struct Writer {
    pack: u32,
    file: Arc<dyn StoreFile>,
    len: u64,
}

/// Packs written since their last fsync. Shared with the index, which
/// fsyncs them before every durable write transaction: any such commit (a history
/// apply, a collection, the inode map's flush, which also makes earlier
/// non-durable commits durable) may make chunk references durable, so
/// the bytes go first.
#[derive(Default)]
pub struct Unsynced {
    files: Mutex<HashMap<u32, Arc<dyn StoreFile>>>,
    /// Held for a whole sync: a second caller must not find the set empty
    /// and go on while the first one's fsync is still running.
    syncing: Mutex<()>,
}

impl Unsynced {
    fn note(&self, pack: u32, file: &Arc<dyn StoreFile>) {
        self.files
            .lock()
            .entry(pack)
            .or_insert_with(|| file.clone());
    }

    /// fsyncs every pack written since the last call. A failure poisons
    /// the store (`io::Health`): a retried fsync proves nothing.
    pub fn sync(&self) -> std::io::Result<()> {
        let _one = self.syncing.lock();
        let files = std::mem::take(&mut *self.files.lock());
        for file in files.values() {
            file.sync()?;
        }
        Ok(())
    }
}

/// The chunk half of a store.
///
/// Durability: every chunk an index commit references must be on disk
/// before the commit. Every pack written since its last fsync is in
/// `Unsynced`, whether it is still being written or left the writer (when
/// full, at `rotate`, or after a failed write); `sync` and every index
/// write transaction fsync them. A new pack's name is made durable (fsync
/// of `packs/`) before any chunk is written to it.
pub struct ChunkStore {
    io: Arc<Guarded>,
    db: Arc<Index>,
    space: Arc<Space>,
    writer: Mutex<Option<Writer>>,
    /// Size at which a pack is full (`PACK_LIMIT`; tests make it small).
    pack_limit: std::sync::atomic::AtomicU64,
    unsynced: Arc<Unsynced>,
    /// Chunks written to a pack but not yet in the index: their location,
    /// and whether a journaled op already carries it.
    fresh: Mutex<HashMap<Hash, (Location, bool)>>,
    readers: RwLock<HashMap<u32, Arc<dyn StoreFile>>>,
    next_pack: Mutex<u32>,
    successors: Mutex<Successors>,
    /// While a garbage collection runs: the chunks puts stored, found
    /// already stored (dedup hits) or used as delta bases since it began,
    /// which it must not remove. Each put holds the read side from its lookup to
    /// its append, so the collector's removal (write side) is atomic with
    /// respect to every put.
    gc_track: RwLock<Option<Mutex<HashSet<Hash>>>>,
}

/// Which chunk followed which in recently stored files: a hint for delta
/// bases when a file has no previous version of its own. A file rewritten
/// as a new object (write a temporary file, rename it over the old one, as
/// rsync and many editors do) shares most chunks with the file it
/// replaces; a changed chunk's predecessor is then usually an old chunk
/// whose successor was the changed chunk's old content.
#[derive(Default)]
struct Successors {
    next: HashMap<Hash, Hash>,
    prev: HashMap<Hash, Hash>,
    order: std::collections::VecDeque<(Hash, Hash)>,
}

/// Chunk pairs remembered (about 100 bytes each).
const SUCCESSORS_LIMIT: usize = 1 << 16;

pub fn hash(data: &[u8]) -> Hash {
    Hash(*blake3::hash(data).as_bytes())
}

fn pack_name(id: u32) -> String {
    format!("{id:08}.pack")
}

fn pack_path(id: u32) -> String {
    format!("{PACK_DIR}/{}", pack_name(id))
}

impl ChunkStore {
    pub(super) fn open(
        io: Arc<Guarded>,
        db: Arc<Index>,
        space: Arc<Space>,
        unsynced: Arc<Unsynced>,
    ) -> Result<ChunkStore, StoreError> {
        let mut store = ChunkStore {
            io,
            db,
            space,
            writer: Mutex::new(None),
            unsynced,
            pack_limit: std::sync::atomic::AtomicU64::new(PACK_LIMIT),
            fresh: Mutex::new(HashMap::new()),
            readers: RwLock::new(HashMap::new()),
            next_pack: Mutex::new(1),
            successors: Mutex::new(Successors::default()),
            gc_track: RwLock::new(None),
        };
        let next = store.pack_ids()?.last().map_or(1, |id| id + 1);
        store.next_pack = Mutex::new(next);
        Ok(store)
    }

    /// The packs directory, for messages.
    pub fn dir(&self) -> PathBuf {
        self.io.path(PACK_DIR)
    }

    fn io_err(&self, source: std::io::Error) -> StoreError {
        StoreError::from_io(self.dir(), source)
    }

    /// A failed open or read of a pack the index points into: a pack gone
    /// or ending before the chunk is damage, not an I/O error of its own
    /// (reads of it fail with EIO, as for flipped bytes; fsck counts it).
    fn pack_err(&self, pack: u32, source: std::io::Error) -> StoreError {
        let path = self.io.path(&pack_path(pack));
        let detail = match source.kind() {
            std::io::ErrorKind::NotFound => "it is missing",
            std::io::ErrorKind::UnexpectedEof => "it is cut short",
            _ => return StoreError::from_io(path, source),
        };
        StoreError::DamagedPack {
            path,
            detail: detail.into(),
        }
    }

    #[cfg(test)]
    pub fn set_pack_limit(&self, bytes: u64) {
        self.pack_limit
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Pack ids present in the packs directory, sorted.
    pub fn pack_ids(&self) -> Result<Vec<u32>, StoreError> {
        let mut ids: Vec<u32> = self
            .io
            .list(PACK_DIR)
            .map_err(|e| self.io_err(e))?
            .iter()
            .filter_map(|name| name.strip_suffix(".pack").and_then(|n| n.parse().ok()))
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// A whole pack's bytes (for fsck's scan, which checks the header).
    pub fn pack_bytes(&self, pack: u32) -> Result<Vec<u8>, StoreError> {
        let file = self.unchecked_pack(pack)?;
        let len = file.len().map_err(|e| self.io_err(e))?;
        let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|e| self.io_err(e))?;
        Ok(bytes)
    }

    /// Stores `data` unless a chunk with its hash exists; returns the hash
    /// and whether bytes were written. With a `base` (usually the chunk
    /// `data` replaces in the previous version of its file) it is stored
    /// as a delta against the base when that is smaller than compressing
    /// it alone.
    pub fn put_against(
        &self,
        data: &[u8],
        base: Option<&Hash>,
    ) -> Result<(Hash, bool), StoreError> {
        let h = hash(data);
        Ok((h, self.put_hashed(&h, data, base, ZSTD_LEVEL)?))
    }

    /// [`put_against`](Self::put_against) of data whose hash the caller
    /// computed; returns whether bytes were written.
    pub fn put_hashed(
        &self,
        h: &Hash,
        data: &[u8],
        base: Option<&Hash>,
        level: i32,
    ) -> Result<bool, StoreError> {
        let h = *h;
        let track = self.gc_track.read();
        let note = |used: &Hash| {
            if let Some(set) = track.as_ref() {
                set.lock().insert(*used);
            }
        };
        if self.contains(&h)? {
            note(&h);
            return Ok(false);
        }
        let delta = match base {
            Some(parent) if *parent != h => self.delta_against(data, parent, level)?,
            _ => None,
        };
        if let Some(d) = &delta {
            if let Some((base, _, _)) = split_delta(d) {
                note(&base);
            }
        }
        let (encoding, body) = match delta {
            // Clearly small: not worth a second compression to compare.
            Some(d) if d.len() <= data.len() / 8 => (Encoding::Delta, d),
            delta => {
                let full = sys::zstd::compress(data, None, level).map_err(|e| self.io_err(e))?;
                match delta {
                    Some(d) if d.len() < full.len() && d.len() < data.len() => (Encoding::Delta, d),
                    _ if full.len() < data.len() => (Encoding::Zstd, full),
                    _ => (Encoding::Raw, data.to_vec()),
                }
            }
        };
        let loc = self.append(&h, encoding, data.len(), &body)?;
        self.fresh.lock().insert(h, (loc, false));
        note(&h);
        Ok(true)
    }

    /// The delta body of `data`, the successor of chunk `parent`, or `None`
    /// when no usable base exists (missing or unreadable, or the chain a
    /// read would apply is already as long as it may be). A bad base costs
    /// only the delta: fsck reports it.
    ///
    /// Skip-deltas (as Subversion's): chunks descending from one root are
    /// numbered 1, 2, 3, … along a lineage, and number n is a delta against
    /// its ancestor n − lowbit(n), not against n − 1. A read then applies
    /// popcount(n) deltas, at most log₂ n, and no chain needs a periodic
    /// full copy; each delta spans lowbit(n) edits.
    fn delta_against(
        &self,
        data: &[u8],
        parent: &Hash,
        level: i32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let Some((_, p, _)) = self.lineage(parent)? else {
            return Ok(None);
        };
        let Some(n) = p.checked_add(1) else {
            return Ok(None);
        };
        if n.count_ones() > max_chain(data.len()) {
            return Ok(None);
        }
        let Some((base, base_loc)) = self.ancestor(parent, skip_base(n))? else {
            return Ok(None);
        };
        let base_data = match self.read_entry(&base, &base_loc) {
            Ok((d, _)) => d,
            Err(e) => {
                tracing::debug!("chunk {base} unusable as a delta base: {e}");
                return Ok(None);
            }
        };
        if n.count_ones() > max_chain(base_data.len()) {
            return Ok(None);
        }
        let frame =
            sys::zstd::compress(data, Some(&base_data), level).map_err(|e| self.io_err(e))?;
        let mut body = Vec::with_capacity(DELTA_PREFIX_LEN + frame.len());
        body.extend_from_slice(base.as_slice());
        body.extend_from_slice(&n.to_be_bytes());
        body.extend_from_slice(&frame);
        Ok(Some(body))
    }

    /// A chunk's location, lineage number (0 for a chunk stored whole) and
    /// delta base, from its entry's header alone.
    fn lineage(&self, h: &Hash) -> Result<Option<(Location, u32, Option<Hash>)>, StoreError> {
        let Some(loc) = self.locate(h)? else {
            return Ok(None);
        };
        Ok(Some(match self.delta_header(&loc)? {
            Some((base, n)) => (loc, n, Some(base)),
            None => (loc, 0, None),
        }))
    }

    /// A delta entry's base and lineage number, from the start of its body
    /// (`None` for a chunk stored whole).
    fn delta_header(&self, loc: &Location) -> Result<Option<(Hash, u32)>, StoreError> {
        if loc.encoding != Encoding::Delta {
            return Ok(None);
        }
        let mut prefix = [0u8; DELTA_PREFIX_LEN];
        let file = self.reader(loc.pack)?;
        file.read_exact_at(&mut prefix, loc.offset + ENTRY_HEADER_LEN as u64)
            .map_err(|e| self.pack_err(loc.pack, e))?;
        let mut base = [0u8; 32];
        base.copy_from_slice(&prefix[..32]);
        let n = u32::from_be_bytes([prefix[32], prefix[33], prefix[34], prefix[35]]);
        Ok(Some((Hash(base), n)))
    }

    /// The ancestor of `from` with lineage number `want`, found by following
    /// delta bases (numbers fall strictly along them, so this ends).
    fn ancestor(&self, from: &Hash, want: u32) -> Result<Option<(Hash, Location)>, StoreError> {
        let mut cur = *from;
        let mut above = u32::MAX;
        loop {
            let Some((loc, n, base)) = self.lineage(&cur)? else {
                return Ok(None);
            };
            // A damaged or edited pack could name bases in a cycle: numbers
            // that do not fall end the walk.
            if n >= above {
                return Ok(None);
            }
            above = n;
            match (n.cmp(&want), base) {
                (std::cmp::Ordering::Equal, _) => return Ok(Some((cur, loc))),
                (std::cmp::Ordering::Greater, Some(b)) => cur = b,
                _ => return Ok(None),
            }
        }
    }

    /// The delta base a stored chunk names, if it is a delta (reads the
    /// entry's header only).
    pub fn delta_base(&self, h: &Hash, loc: &Location) -> Result<Option<Hash>, StoreError> {
        match self.delta_header(loc)? {
            Some((base, _)) if base == *h => Err(StoreError::CorruptChunk {
                hash: *h,
                detail: "delta names itself as its base".into(),
            }),
            other => Ok(other.map(|(base, _)| base)),
        }
    }

    /// Ends the pack being written: the next chunk starts a new one, so a
    /// collection can compact everything written so far.
    pub fn rotate(&self) {
        *self.writer.lock() = None;
    }

    /// Starts recording the chunks puts reuse (see `gc_track`).
    pub fn start_tracking(&self) {
        *self.gc_track.write() = Some(Mutex::new(HashSet::new()));
    }

    pub fn stop_tracking(&self) {
        *self.gc_track.write() = None;
    }

    /// Runs `f` with every put held off, on the chunks reused since
    /// `start_tracking` and the chunks not yet in the index.
    pub fn with_puts_held<T>(&self, f: impl FnOnce(&HashSet<Hash>, &HashSet<Hash>) -> T) -> T {
        let track = self.gc_track.write();
        let reused = track.as_ref().map(|m| m.lock().clone()).unwrap_or_default();
        let fresh: HashSet<Hash> = self.fresh.lock().keys().copied().collect();
        f(&reused, &fresh)
    }

    /// Packs that chunks not yet in the index live in, and the pack being
    /// written: neither may be compacted.
    pub fn packs_in_use(&self) -> HashSet<u32> {
        let mut used = self.packs_unindexed();
        if let Some(w) = self.writer.lock().as_ref() {
            used.insert(w.pack);
        }
        used
    }

    /// Packs that chunks not yet in the index live in.
    pub fn packs_unindexed(&self) -> HashSet<u32> {
        self.fresh.lock().values().map(|(l, _)| l.pack).collect()
    }

    /// Copies a stored entry verbatim (header and body: a delta keeps
    /// naming its base by hash) to the pack being written; returns its new
    /// location. The caller makes the index point there after `sync`.
    pub fn copy_entry(&self, h: &Hash, loc: &Location) -> Result<Location, StoreError> {
        let file = self.reader(loc.pack)?;
        let mut entry = vec![0u8; ENTRY_HEADER_LEN + loc.stored_len as usize];
        file.read_exact_at(&mut entry, loc.offset)
            .map_err(|e| self.pack_err(loc.pack, e))?;
        if entry[..4] != ENTRY_MAGIC.to_be_bytes() || &entry[13..45] != h.as_slice() {
            return Err(StoreError::CorruptChunk {
                hash: *h,
                detail: "pack entry header does not match the index".into(),
            });
        }
        // Not refused while the store is full: gc copies to free more
        // than it writes (a real lack of space still fails the write).
        self.append_unchecked(
            h,
            loc.encoding,
            loc.raw_len as usize,
            &entry[ENTRY_HEADER_LEN..],
        )
    }

    /// Deletes packs no index entry points into any more (the commit
    /// that moved their live chunks must be durable), then makes the
    /// removals durable.
    pub fn remove_packs(&self, packs: &[u32]) -> Result<(), StoreError> {
        for pack in packs {
            self.readers.write().remove(pack);
            let name = pack_path(*pack);
            self.io
                .remove(&name)
                .map_err(|source| StoreError::from_io(self.io.path(&name), source))?;
        }
        if packs.is_empty() {
            return Ok(());
        }
        self.io.sync_dir(PACK_DIR).map_err(|e| self.io_err(e))
    }

    /// The size of one pack file. Its header is not checked: a pack whose
    /// creation a crash or a full disk cut short (shorter than a header,
    /// nothing in it) still has a size.
    pub fn pack_size(&self, pack: u32) -> Result<u64, StoreError> {
        self.unchecked_pack(pack)?.len().map_err(|e| self.io_err(e))
    }

    /// A pack file without the check of its header (`reader` checks it),
    /// for what looks at a pack as bytes.
    fn unchecked_pack(&self, pack: u32) -> Result<Arc<dyn StoreFile>, StoreError> {
        if let Some(f) = self.readers.read().get(&pack) {
            return Ok(f.clone());
        }
        let name = pack_path(pack);
        self.io
            .open(&name, Create::No)
            .map_err(|source| StoreError::from_io(self.io.path(&name), source))
    }

    /// Remembers the order of a file's chunks (see `Successors`).
    pub fn note_sequence(&self, chunks: &[Hash]) {
        let mut s = self.successors.lock();
        for pair in chunks.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if s.next.get(&a) == Some(&b) && s.prev.get(&b) == Some(&a) {
                continue;
            }
            s.next.insert(a, b);
            s.prev.insert(b, a);
            s.order.push_back((a, b));
        }
        while s.order.len() > SUCCESSORS_LIMIT {
            let Some((a, b)) = s.order.pop_front() else {
                break;
            };
            if s.next.get(&a) == Some(&b) {
                s.next.remove(&a);
            }
            if s.prev.get(&b) == Some(&a) {
                s.prev.remove(&b);
            }
        }
    }

    /// The chunk that followed `h` in a recently stored file.
    pub fn successor_of(&self, h: &Hash) -> Option<Hash> {
        self.successors.lock().next.get(h).copied()
    }

    /// The chunk that preceded `h` in a recently stored file.
    pub fn predecessor_of(&self, h: &Hash) -> Option<Hash> {
        self.successors.lock().prev.get(h).copied()
    }

    pub fn contains(&self, h: &Hash) -> Result<bool, StoreError> {
        Ok(self.locate(h)?.is_some())
    }

    pub fn locate(&self, h: &Hash) -> Result<Option<Location>, StoreError> {
        if let Some((loc, _)) = self.fresh.lock().get(h) {
            return Ok(Some(*loc));
        }
        let txn = self.db.begin_read().map_err(index_error)?;
        let table = match txn.open_table(CHUNKS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(index_error(e)),
        };
        match table.get(h.as_slice()).map_err(index_error)? {
            Some(v) => Location::decode(v.value())
                .map(Some)
                .ok_or_else(|| StoreError::IndexCorrupt(format!("bad location for chunk {h}"))),
            None => Ok(None),
        }
    }

    fn append(
        &self,
        h: &Hash,
        encoding: Encoding,
        raw_len: usize,
        body: &[u8],
    ) -> Result<Location, StoreError> {
        self.space.check()?;
        self.append_unchecked(h, encoding, raw_len, body)
    }

    /// [`ChunkStore::append`] even while the store is marked full.
    fn append_unchecked(
        &self,
        h: &Hash,
        encoding: Encoding,
        raw_len: usize,
        body: &[u8],
    ) -> Result<Location, StoreError> {
        // A pack entry records lengths in 32 bits.
        let too_big = |size: usize| StoreError::TooLarge {
            what: "a chunk",
            size: size as u64,
        };
        let raw_len = u32::try_from(raw_len).map_err(|_| too_big(raw_len))?;
        let stored_len = u32::try_from(body.len()).map_err(|_| too_big(body.len()))?;
        let mut entry = Vec::with_capacity(ENTRY_HEADER_LEN + body.len());
        entry.extend_from_slice(&ENTRY_MAGIC.to_be_bytes());
        entry.push(encoding as u8);
        entry.extend_from_slice(&raw_len.to_be_bytes());
        entry.extend_from_slice(&stored_len.to_be_bytes());
        entry.extend_from_slice(h.as_slice());
        entry.extend_from_slice(body);
        let mut guard = self.writer.lock();
        let limit = self.pack_limit.load(std::sync::atomic::Ordering::Relaxed);
        if guard.as_ref().is_some_and(|w| w.len >= limit) {
            *guard = None;
        }
        let w = match guard.as_mut() {
            Some(w) => w,
            None => guard.insert(self.new_pack().inspect_err(|e| {
                self.space.note(e);
            })?),
        };
        let offset = w.len;
        if let Err(e) = w.file.write_all_at(&entry, offset) {
            // A failed write ends this pack (nothing more is appended to
            // it); what it held before stays to be fsync'd by `sync`.
            let _ = w.file.set_len(offset);
            let e = self.io_err(e);
            self.space.note(&e);
            *guard = None;
            return Err(e);
        }
        w.len += entry.len() as u64;
        self.unsynced.note(w.pack, &w.file);
        Ok(Location {
            pack: w.pack,
            offset,
            raw_len,
            stored_len,
            encoding,
        })
    }

    fn new_pack(&self) -> Result<Writer, StoreError> {
        let mut next = self.next_pack.lock();
        let id = *next;
        let file = self
            .io
            .open(&pack_path(id), Create::New)
            .map_err(|e| self.io_err(e))?;
        // The id is used up even if what follows fails.
        *next = id + 1;
        let mut header = Vec::with_capacity(PACK_HEADER_LEN as usize);
        header.extend_from_slice(PACK_MAGIC);
        header.extend_from_slice(&PACK_FORMAT.to_be_bytes());
        header.extend_from_slice(&id.to_be_bytes());
        // The pack's name must be durable before an index commit names a
        // chunk in it.
        let made = file
            .write_all_at(&header, 0)
            .and_then(|()| self.io.sync_dir(PACK_DIR));
        if let Err(e) = made {
            // No chunk is in it: it goes (a full disk left an empty pack
            // each time, which every later read of the pack list met).
            let _ = self.io.remove(&pack_path(id));
            return Err(self.io_err(e));
        }
        self.readers.write().insert(id, file.clone());
        self.unsynced.note(id, &file);
        Ok(Writer {
            pack: id,
            file,
            len: PACK_HEADER_LEN,
        })
    }

    /// Chunk locations no journaled op carries yet, for the next one to
    /// carry; from now on they count as journaled. They stay visible to
    /// `locate` until `applied` says the index holds them.
    pub fn take_unjournaled(&self) -> Vec<(Hash, Location)> {
        let mut fresh = self.fresh.lock();
        let mut out = Vec::new();
        for (h, (loc, journaled)) in fresh.iter_mut() {
            if !*journaled {
                *journaled = true;
                out.push((*h, *loc));
            }
        }
        out
    }

    /// A journal append carrying these failed: they must ride the next op.
    pub fn unjournal(&self, hashes: impl IntoIterator<Item = Hash>) {
        let mut fresh = self.fresh.lock();
        for h in hashes {
            if let Some(e) = fresh.get_mut(&h) {
                e.1 = false;
            }
        }
    }

    /// A chunk named by a journaled change being replayed: readable (as a
    /// delta base of later changes) until `applied`.
    pub fn stage(&self, h: Hash, loc: Location) {
        self.fresh.lock().insert(h, (loc, true));
    }

    /// The index now holds these chunks.
    pub fn applied(&self, hashes: impl IntoIterator<Item = Hash>) {
        let mut fresh = self.fresh.lock();
        for h in hashes {
            fresh.remove(&h);
        }
    }

    /// Makes every pack write so far durable: the pack being written and
    /// every pack that left the writer since the last sync. A failed fsync
    /// poisons the store (`io::Health`): a retry could not prove anything.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.unsynced.sync().map_err(|e| self.io_err(e))
    }

    fn reader(&self, pack: u32) -> Result<Arc<dyn StoreFile>, StoreError> {
        if let Some(f) = self.readers.read().get(&pack) {
            return Ok(f.clone());
        }
        let name = pack_path(pack);
        let file = self
            .io
            .open(&name, Create::No)
            .map_err(|e| self.pack_err(pack, e))?;
        self.check_pack_header(pack, &*file)?;
        self.readers.write().insert(pack, file.clone());
        Ok(file)
    }

    /// A pack is read only as what it says it is: its magic, a format this
    /// chronofs knows (a newer one would be misread), its own id.
    fn check_pack_header(&self, pack: u32, file: &dyn StoreFile) -> Result<(), StoreError> {
        let path = self.io.path(&pack_path(pack));
        let mut header = [0u8; PACK_HEADER_LEN as usize];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| self.pack_err(pack, e))?;
        let format = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
        let id = u32::from_be_bytes([header[12], header[13], header[14], header[15]]);
        let corrupt = |detail: String| StoreError::DamagedPack {
            path: path.clone(),
            detail,
        };
        if &header[..8] != PACK_MAGIC {
            return Err(corrupt("not a chronofs pack (bad magic)".into()));
        }
        if format > PACK_FORMAT {
            return Err(StoreError::UnsupportedFormat {
                path,
                found: u64::from(format),
                supported: PACK_FORMAT,
            });
        }
        if id != pack {
            return Err(corrupt(format!("its header names pack {id}")));
        }
        Ok(())
    }

    /// The plain bytes of a chunk, verified against its hash.
    pub fn get(&self, h: &Hash) -> Result<Vec<u8>, StoreError> {
        let loc = self.locate(h)?.ok_or(StoreError::MissingChunk(*h))?;
        match self.read_at(h, &loc) {
            // A collection may have moved it and removed its old pack
            // meanwhile.
            Err(e @ StoreError::DamagedPack { .. }) => match self.locate(h)? {
                Some(moved) if moved != loc => self.read_at(h, &moved),
                _ => Err(e),
            },
            other => other,
        }
    }

    /// Reads and verifies the chunk at `loc`.
    pub fn read_at(&self, h: &Hash, loc: &Location) -> Result<Vec<u8>, StoreError> {
        Ok(self.read_entry(h, loc)?.0)
    }

    /// The chunk's plain bytes and its lineage number (0: stored whole). A
    /// delta's base is read first and must carry the number `skip_base`
    /// gives, so a corrupt pack cannot make a read loop or run long.
    fn read_entry(&self, h: &Hash, loc: &Location) -> Result<(Vec<u8>, u32), StoreError> {
        let file = self.reader(loc.pack)?;
        let mut buf = vec![0u8; ENTRY_HEADER_LEN + loc.stored_len as usize];
        file.read_exact_at(&mut buf, loc.offset)
            .map_err(|e| self.pack_err(loc.pack, e))?;
        let corrupt = |what: &str| StoreError::CorruptChunk {
            hash: *h,
            detail: what.to_string(),
        };
        if buf[..4] != ENTRY_MAGIC.to_be_bytes() || &buf[13..45] != h.as_slice() {
            return Err(corrupt("pack entry header does not match the index"));
        }
        let body = &buf[ENTRY_HEADER_LEN..];
        let (data, n) = match loc.encoding {
            Encoding::Raw => (body.to_vec(), 0),
            Encoding::Zstd => (
                sys::zstd::decompress(body, None, loc.raw_len as usize)
                    .map_err(|e| corrupt(&format!("cannot decompress: {e}")))?,
                0,
            ),
            Encoding::Delta => {
                let (base, n, frame) =
                    split_delta(body).ok_or_else(|| corrupt("delta header is malformed"))?;
                if n == 0 || n.count_ones() > MAX_CHAIN {
                    return Err(corrupt("delta lineage number out of range"));
                }
                let base_loc = self
                    .locate(&base)?
                    .ok_or_else(|| corrupt(&format!("delta base {base} is missing")))?;
                // Checked before reading it: each step down then clears a
                // bit of the number, so a cycle of bases in a damaged pack
                // ends here instead of in a stack overflow.
                let header_n = self.delta_header(&base_loc)?.map_or(0, |(_, bn)| bn);
                if header_n != skip_base(n) {
                    return Err(corrupt("delta base has the wrong lineage number"));
                }
                let (base_data, base_n) = self.read_entry(&base, &base_loc)?;
                if base_n != skip_base(n) {
                    return Err(corrupt("delta base has the wrong lineage number"));
                }
                let data = sys::zstd::decompress(frame, Some(&base_data), loc.raw_len as usize)
                    .map_err(|e| corrupt(&format!("cannot decompress delta: {e}")))?;
                (data, n)
            }
        };
        if data.len() != loc.raw_len as usize || hash(&data) != *h {
            return Err(corrupt("content does not match its hash"));
        }
        Ok((data, n))
    }

    /// Bytes used by all pack files.
    pub fn packs_size(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        for id in self.pack_ids()? {
            total += self.pack_size(id)?;
        }
        Ok(total)
    }

    /// Writes chunk `h` again from `data` (its plain bytes, found elsewhere
    /// by `fsck --repair`) although the index may still name damaged bytes
    /// for it, which `put_hashed` would take as stored. Returns the new
    /// entry's location; the caller points the index at it after `sync`.
    /// A delta whose header still reads is written as a delta against the
    /// same base with the same lineage number, so the deltas built on it
    /// read again too; otherwise the chunk is stored whole.
    pub fn store_again(&self, h: &Hash, data: &[u8]) -> Result<Location, StoreError> {
        if hash(data) != *h {
            return Err(StoreError::CorruptChunk {
                hash: *h,
                detail: "the bytes offered to restore it do not match its hash".into(),
            });
        }
        let header = match self.locate(h)? {
            Some(loc) => self.delta_header(&loc).ok().flatten(),
            None => None,
        };
        if let Some((base, n)) = header.filter(|(b, n)| b != h && *n >= 1) {
            let base_data = match self.lineage(&base) {
                Ok(Some((loc, bn, _))) if bn == skip_base(n) => self.read_at(&base, &loc).ok(),
                _ => None,
            };
            if let Some(base_data) = base_data {
                let frame = sys::zstd::compress(data, Some(&base_data), ZSTD_LEVEL)
                    .map_err(|e| self.io_err(e))?;
                let body = [base.as_slice(), &n.to_be_bytes(), &frame].concat();
                let loc = self.append(h, Encoding::Delta, data.len(), &body)?;
                if self.read_at(h, &loc).is_ok() {
                    return Ok(loc);
                }
            }
        }
        self.append_whole(h, data, false)
    }

    /// Writes the chunk at `loc` again stored whole (no delta base), to the
    /// pack being written; returns the new location, to which the caller
    /// points the index after `sync`. A collection uses it so that a chunk
    /// nothing references may go although a live chunk was a delta of it.
    /// Not refused while the store is full, as `copy_entry` is not.
    pub fn rewrite_whole(&self, h: &Hash, loc: &Location) -> Result<Location, StoreError> {
        let data = self.read_at(h, loc)?;
        self.append_whole(h, &data, true)
    }

    fn append_whole(&self, h: &Hash, data: &[u8], unchecked: bool) -> Result<Location, StoreError> {
        let full = sys::zstd::compress(data, None, ZSTD_LEVEL).map_err(|e| self.io_err(e))?;
        let (encoding, body) = if full.len() < data.len() {
            (Encoding::Zstd, full.as_slice())
        } else {
            (Encoding::Raw, data)
        };
        if unchecked {
            self.append_unchecked(h, encoding, data.len(), body)
        } else {
            self.append(h, encoding, data.len(), body)
        }
    }
}

/// How many deltas a read of a chunk of `len` bytes may apply: the root
/// and the deltas together decompress at most `CHAIN_BUDGET` bytes.
fn max_chain(len: usize) -> u32 {
    let fits = (CHAIN_BUDGET / len.max(1)).saturating_sub(1);
    u32::try_from(fits).unwrap_or(u32::MAX).min(MAX_CHAIN)
}

/// The lineage number of the base of delta number `n` (n ≥ 1): `n` with
/// its lowest set bit cleared.
fn skip_base(n: u32) -> u32 {
    n & n.wrapping_sub(1)
}

fn split_delta(body: &[u8]) -> Option<(Hash, u32, &[u8])> {
    if body.len() <= DELTA_PREFIX_LEN {
        return None;
    }
    let mut base = [0u8; 32];
    base.copy_from_slice(&body[..32]);
    let n = u32::from_be_bytes([body[32], body[33], body[34], body[35]]);
    Some((Hash(base), n, &body[DELTA_PREFIX_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in `tmp` (a second call opens a fresh chunk store on the
    /// same index, as a restarted daemon would).
    fn open(tmp: &std::path::Path, store: &crate::store::Store) -> ChunkStore {
        let _ = tmp;
        store.chunk_store().unwrap()
    }

    fn new_store(tmp: &std::path::Path) -> crate::store::Store {
        crate::store::Store::open(tmp).unwrap()
    }

    /// A pack is read only if its header says it is one this chronofs
    /// knows: a newer format is refused in one line, not misread.
    #[test]
    fn a_pack_of_a_newer_format_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let db = new_store(tmp.path());
        let store = open(tmp.path(), &db);
        let data = b"pack format check ".repeat(40);
        let (h, _) = store.put_against(&data, None).unwrap();
        store.sync().unwrap();
        let loc = store.locate(&h).unwrap().unwrap();
        let path = tmp.path().join(pack_path(loc.pack));
        let header_of = |store: &ChunkStore| {
            let file = store.io.open(&pack_path(loc.pack), Create::No).unwrap();
            store.check_pack_header(loc.pack, &*file)
        };
        header_of(&store).expect("the header as written is accepted");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8..12].copy_from_slice(&(PACK_FORMAT + 1).to_be_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let err = header_of(&store).unwrap_err();
        assert!(
            matches!(err, StoreError::UnsupportedFormat { found, .. } if found == u64::from(PACK_FORMAT) + 1),
            "{err}"
        );
        bytes[8..12].copy_from_slice(&PACK_FORMAT.to_be_bytes());
        bytes[12..16].copy_from_slice(&(loc.pack + 7).to_be_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            header_of(&store),
            Err(StoreError::DamagedPack { .. })
        ));
    }

    #[test]
    fn put_get_dedup_and_verify() {
        let tmp = tempfile::tempdir().unwrap();
        let db = new_store(tmp.path());
        let store = open(tmp.path(), &db);
        let text = b"hello hello hello hello hello hello hello".repeat(50);
        let (h, new) = store.put_against(&text, None).unwrap();
        assert!(new);
        assert_eq!(store.put_against(&text, None).unwrap(), (h, false));
        assert_eq!(store.get(&h).unwrap(), text);
        let loc = store.locate(&h).unwrap().unwrap();
        assert_eq!(loc.encoding, Encoding::Zstd);
        let random: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let (h2, _) = store.put_against(&random, None).unwrap();
        assert_eq!(store.get(&h2).unwrap(), random);
        // Flip a stored byte: the read must fail, not return wrong data.
        let path = tmp.path().join("packs").join(pack_name(loc.pack));
        let mut bytes = std::fs::read(&path).unwrap();
        let at = loc.offset as usize + ENTRY_HEADER_LEN + 2;
        bytes[at] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let fresh = open(tmp.path(), &db);
        fresh.fresh.lock().insert(h, (loc, true));
        assert!(matches!(
            fresh.get(&h),
            Err(StoreError::CorruptChunk { .. })
        ));
    }

    fn text(seed: u32, lines: u32) -> Vec<u8> {
        (0..lines)
            .flat_map(|i| format!("line {i}: {}\n", i.wrapping_mul(seed) % 977).into_bytes())
            .collect()
    }

    #[test]
    fn small_edit_is_stored_as_a_small_delta_and_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let db = new_store(tmp.path());
        let store = open(tmp.path(), &db);
        let base = text(7, 300);
        let (hb, _) = store.put_against(&base, None).unwrap();
        let mut edited = base.clone();
        edited.splice(500..510, b"an edit".iter().copied());
        let (he, new) = store.put_against(&edited, Some(&hb)).unwrap();
        assert!(new);
        let loc = store.locate(&he).unwrap().unwrap();
        assert_eq!(loc.encoding, Encoding::Delta);
        let full = zstd::bulk::compress(&edited, ZSTD_LEVEL).unwrap();
        assert!(
            (loc.stored_len as usize) < full.len() / 4,
            "{loc:?} vs {}",
            full.len()
        );
        assert_eq!(store.get(&he).unwrap(), edited);
        // A chunk beginning with zstd's dictionary magic is still plain
        // content as a prefix.
        let mut magic = 0xEC30_A437u32.to_le_bytes().to_vec();
        magic.extend_from_slice(&base);
        let (hm, _) = store.put_against(&magic, None).unwrap();
        let mut m2 = magic.clone();
        m2[100] ^= 1;
        let (hm2, _) = store.put_against(&m2, Some(&hm)).unwrap();
        assert_eq!(store.get(&hm2).unwrap(), m2);
        // Unrelated data against a base: never larger than compressing alone.
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
            .collect();
        let (hn, _) = store.put_against(&noise, Some(&hb)).unwrap();
        assert_ne!(
            store.locate(&hn).unwrap().unwrap().encoding,
            Encoding::Delta
        );
        assert_eq!(store.get(&hn).unwrap(), noise);
    }

    #[test]
    fn skip_delta_lineages_read_back_with_short_chains() {
        let tmp = tempfile::tempdir().unwrap();
        let db = new_store(tmp.path());
        let store = open(tmp.path(), &db);
        let mut cur = text(3, 200);
        let (mut prev, _) = store.put_against(&cur, None).unwrap();
        let first = prev;
        let mut versions = vec![(prev, cur.clone())];
        for i in 0..100 {
            cur[10 + i] = b'#';
            let (h, _) = store.put_against(&cur, Some(&prev)).unwrap();
            versions.push((h, cur.clone()));
            prev = h;
        }
        for (i, (h, data)) in versions.iter().enumerate() {
            let loc = store.locate(h).unwrap().unwrap();
            let (got, n) = store.read_entry(h, &loc).unwrap();
            assert_eq!(&got, data);
            // One lineage from the first chunk: number i, popcount(i) deltas.
            assert_eq!(n, i as u32);
            if let Some((_, _, Some(base))) = store.lineage(h).unwrap() {
                let (_, base_n, _) = store.lineage(&base).unwrap().unwrap();
                assert_eq!(base_n, skip_base(n));
            }
        }
        assert_eq!(skip_base(64), 0);
        assert_eq!(skip_base(7), 6);
        assert_eq!(max_chain(64 << 10), 3);
        assert_eq!(max_chain(256 << 10), 0);
        // Damage the lineage's root: every delta on it now fails to read.
        let loc = store.locate(&first).unwrap().unwrap();
        let path = tmp.path().join("packs").join(pack_name(loc.pack));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[loc.offset as usize + ENTRY_HEADER_LEN + 3] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let fresh = open(tmp.path(), &db);
        *fresh.fresh.lock() = store.fresh.lock().clone();
        assert!(matches!(
            fresh.get(&versions[1].0),
            Err(StoreError::CorruptChunk { .. })
        ));
    }

    #[test]
    fn a_policy_level_changes_how_small_a_chunk_is_stored() {
        // Prose-like: words drawn from a vocabulary, where a higher level
        // finds longer matches.
        let words: Vec<String> = (0..400u32)
            .map(|i| format!("w{}x{}", i.wrapping_mul(2654435761) % 9973, i % 7))
            .collect();
        let mut x = 12345u64;
        let mut data = Vec::new();
        while data.len() < 64 << 10 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            data.extend_from_slice(words[(x >> 33) as usize % words.len()].as_bytes());
            data.push(b' ');
        }
        let stored = |level: i32| {
            let tmp = tempfile::tempdir().unwrap();
            let db = new_store(tmp.path());
            let store = open(tmp.path(), &db);
            let h = hash(&data);
            assert!(store.put_hashed(&h, &data, None, level).unwrap());
            assert_eq!(store.get(&h).unwrap(), data);
            store.locate(&h).unwrap().unwrap().stored_len
        };
        let (fast, small) = (stored(1), stored(19));
        assert!(
            small < fast,
            "level 19 ({small}) not smaller than level 1 ({fast})"
        );
    }

    #[test]
    fn location_roundtrip() {
        let loc = Location {
            pack: 7,
            offset: 1 << 40,
            raw_len: 65536,
            stored_len: 100,
            encoding: Encoding::Zstd,
        };
        assert_eq!(Location::decode(&loc.encode()), Some(loc));
        assert_eq!(Location::decode(&[0u8; 20]), None);
    }
}
