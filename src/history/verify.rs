//! `fsck`: every version decodes, every manifest it names exists, every
//! chunk a manifest names exists and matches its hash; and what a damaged
//! or missing chunk costs: the versions that no longer read.
//!
//! Repair converges in one run. It re-indexes intact chunks found in the
//! packs (after a lost index update); stores again every damaged or
//! missing chunk whose bytes a live file still holds (at the offset a
//! version had them, or anywhere the content-defined cuts of an ingest
//! find them); marks each version that still does not read as lost (its
//! content becomes `Lost`, visible in `log`, EIO when read, and no longer
//! a reference); and drops the index entries of damaged chunks, so the
//! next ingest of those bytes stores them again instead of deduplicating
//! against the damage.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};

use redb::ReadableTable;

use super::chain;
use super::content::{self, PositionalReader};
use super::model::*;
use super::tables::{self, VERSIONS};
use super::{read_txn, History, HistoryError, Result};
use crate::store::chunks::{self, Location, CHUNKS, ENTRY_HEADER_LEN, PACK_MAGIC};
use crate::store::{index_error, Hash, StoreError};
use crate::sys;

/// A file version that does not read.
#[derive(Clone, Debug)]
pub struct Unreadable {
    pub obj: ObjectId,
    pub seq: Seq,
    pub time_ns: i64,
    /// Its path at the time, if history knows one.
    pub path: Option<Vec<Vec<u8>>>,
    /// The first damaged or missing piece, in words.
    pub why: String,
    /// Its chunks that do not read; empty when its manifest itself does
    /// not read.
    pub chunks: Lacking,
}

#[derive(Debug, Default)]
pub struct VerifyReport {
    pub versions: u64,
    pub manifests: u64,
    pub chunks: u64,
    pub bytes: u64,
    /// Store-level problems (records, chunks, packs, the hash chain).
    pub problems: Vec<String>,
    /// The versions those problems cost.
    pub unreadable: Vec<Unreadable>,
    /// Versions an earlier repair marked lost.
    pub lost_versions: u64,
    pub repair: Option<Repair>,
    /// Changes the hash chain covers, and those recorded before it.
    pub chained_ops: u64,
    pub unchained_ops: u64,
    /// The chain's head: (seq, hash).
    pub chain_head: Option<(u64, String)>,
}

/// What a repair found and did; the report's other fields describe the
/// store after it.
#[derive(Debug, Default)]
pub struct Repair {
    pub found_problems: Vec<String>,
    pub found_unreadable: Vec<Unreadable>,
    /// Index entries pointed at intact copies found in the packs.
    pub reindexed: u64,
    /// Chunks stored again from live files.
    pub restored_chunks: u64,
    /// Versions that read again (found unreadable, not lost).
    pub restored_versions: Vec<Unreadable>,
    /// Versions marked lost.
    pub lost: Vec<Unreadable>,
    /// Index entries of damaged chunks removed.
    pub removed_entries: u64,
}

impl Repair {
    /// Whether the repair changed anything.
    pub fn changed(&self) -> bool {
        self.reindexed + self.restored_chunks + self.removed_entries > 0 || !self.lost.is_empty()
    }
}

/// Chunks of a version that do not read: (hash, offset in the file, length).
pub type Lacking = Vec<(Hash, u64, u32)>;

/// Recovery passes at most (each must store something again to go on).
const RECOVERY_PASSES: usize = 8;

/// Opens the live (head) file of an object for reading, if it has one.
pub type HeadFiles<'a> = &'a dyn Fn(ObjectId) -> Option<OwnedFd>;

#[derive(Clone, Debug)]
enum Bad {
    Missing,
    Damaged(String),
}

/// One pass over the store.
#[derive(Default)]
struct Scan {
    report: VerifyReport,
    bad: HashMap<Hash, Bad>,
}

/// What a chunk read's error says of the chunk. Only a missing entry,
/// bytes that fail their check, or a pack gone, cut short or with a wrong
/// header are damage: any other error (permissions, a failing disk) may
/// pass, and must not get versions marked lost, so it ends the check.
fn damage(e: StoreError) -> std::result::Result<Bad, StoreError> {
    match e {
        StoreError::MissingChunk(_) => Ok(Bad::Missing),
        StoreError::CorruptChunk { detail, .. } => Ok(Bad::Damaged(detail)),
        StoreError::DamagedPack { .. } => Ok(Bad::Damaged(e.to_string())),
        StoreError::Io { ref source, .. }
            if matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            Ok(Bad::Damaged(e.to_string()))
        }
        other => Err(other),
    }
}

fn err(e: impl Into<redb::Error>) -> HistoryError {
    HistoryError::Store(index_error(e))
}

impl History {
    /// Checks the store; with `repair`, repairs it first (see the module
    /// comment), recovering chunks from `head`.
    pub fn verify(
        &self,
        repair: Option<HeadFiles>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VerifyReport> {
        let Some(head) = repair else {
            // Without --repair, fsck only reads: on a full store it checks
            // what the index holds (changes still queued are journaled).
            self.sync_unless_full()?;
            return Ok(self.scan(progress)?.report);
        };
        let _one = self.maintenance.lock();
        self.sync()?;
        let mut outcome = Repair::default();
        let mut pack_problems = Vec::new();
        outcome.reindexed = self.reindex_packs(&mut pack_problems)?;
        let first = self.scan(progress)?;
        outcome.found_problems = pack_problems.clone();
        outcome
            .found_problems
            .extend(first.report.problems.iter().cloned());
        outcome.found_unreadable = first.report.unreadable.clone();
        let mut after = first;
        // A manifest stored again reveals the chunks it names, which may
        // be missing too: recover until a pass finds nothing new.
        for _ in 0..RECOVERY_PASSES {
            if after.bad.is_empty() {
                break;
            }
            let restored = self.recover(&after, head)?;
            if restored == 0 {
                break;
            }
            outcome.restored_chunks += restored;
            after = self.scan(progress)?;
        }
        let still: HashSet<(ObjectId, Seq)> = after
            .report
            .unreadable
            .iter()
            .map(|u| (u.obj, u.seq))
            .collect();
        outcome.restored_versions = outcome
            .found_unreadable
            .iter()
            .filter(|u| !still.contains(&(u.obj, u.seq)))
            .cloned()
            .collect();
        self.mark_lost(&after.report.unreadable)?;
        outcome.lost = after.report.unreadable.clone();
        outcome.removed_entries = self.drop_damaged(&after.bad)?;
        let mut report = self.scan(progress)?.report;
        // Packs that are not packs stay a problem: repair cannot fix them.
        report.problems.extend(pack_problems);
        report.repair = Some(outcome);
        Ok(report)
    }

    /// Checks every record and every referenced chunk; names the versions
    /// that do not read.
    fn scan(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<Scan> {
        let mut scan = Scan::default();
        let chain = chain::verify(self.db())?;
        let report = &mut scan.report;
        report.chained_ops = chain.ops;
        report.unchained_ops = chain.unchained_ops;
        report.chain_head = chain.head;
        report.problems.extend(chain.problems);
        let files = self.file_versions(report)?;
        // Manifests, read once each; their chunks, checked once each.
        let mut manifests: BTreeSet<Hash> = BTreeSet::new();
        let mut wanted = BTreeSet::new();
        for (_, _, _, m) in &files {
            if !manifests.insert(*m) {
                continue;
            }
            report.manifests += 1;
            let decoded = match self.manifest_bytes(m, &mut scan.bad)? {
                Some(bytes) => Manifest::decode(&bytes),
                None => None,
            };
            match &decoded {
                Some(d) => wanted.extend(content::chunk_refs(d)),
                None => {
                    scan.bad
                        .entry(*m)
                        .or_insert_with(|| Bad::Damaged("does not decode".into()));
                }
            }
        }
        let total = wanted.len() as u64;
        for (i, h) in wanted.iter().enumerate() {
            match self.chunks().get(h) {
                Ok(data) => report.bytes += data.len() as u64,
                Err(e) => {
                    scan.bad.insert(*h, damage(e)?);
                }
            }
            report.chunks += 1;
            progress(i as u64 + 1, total);
        }
        for (h, bad) in &scan.bad {
            let what = if manifests.contains(h) {
                "manifest"
            } else {
                "chunk"
            };
            report.problems.push(match bad {
                Bad::Missing => format!("{what} {h} is referenced but missing"),
                Bad::Damaged(why) => format!("{what} {h} is damaged: {why}"),
            });
        }
        if scan.bad.is_empty() {
            return Ok(scan);
        }
        // Which versions the damage costs.
        let mut cost: HashMap<Hash, Option<(String, Lacking)>> = HashMap::new();
        for (obj, seq, time_ns, m) in files {
            if let std::collections::hash_map::Entry::Vacant(e) = cost.entry(m) {
                e.insert(self.manifest_cost(&m, &scan.bad)?);
            }
            let Some(Some((why, chunks))) = cost.get(&m) else {
                continue;
            };
            let path = match self.path_at(obj, seq)? {
                Some(p) => Some(p),
                // A version recording a removal: its last name.
                None => self.path_at(obj, seq.prev())?,
            };
            scan.report.unreadable.push(Unreadable {
                obj,
                seq,
                time_ns,
                path,
                why: why.clone(),
                chunks: chunks.clone(),
            });
        }
        Ok(scan)
    }

    /// Every version holding file content: (object, seq, time, manifest).
    /// Counts versions and lost ones; reports records that do not decode.
    fn file_versions(&self, report: &mut VerifyReport) -> Result<Vec<(ObjectId, Seq, i64, Hash)>> {
        let txn = read_txn(self.db())?;
        let mut out = Vec::new();
        let versions = match txn.open_table(VERSIONS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(out),
            Err(e) => return Err(err(e)),
        };
        for e in versions.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            report.versions += 1;
            let key = k.value();
            let (Some(v), Some(obj), Some(seq)) = (
                decode_version(v.value()),
                key.get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(ObjectId::from_be_bytes),
                key.get(8..16)
                    .and_then(|b| b.try_into().ok())
                    .map(Seq::from_be_bytes),
            ) else {
                report
                    .problems
                    .push(format!("version record {key:02x?} does not decode"));
                continue;
            };
            match v.content {
                Content::File { manifest } => out.push((obj, seq, v.time_ns, manifest)),
                Content::Lost { .. } => report.lost_versions += 1,
                _ => {}
            }
        }
        Ok(out)
    }

    /// A manifest's bytes: from the `manifests` table (format 2) or its
    /// chunk (format 3 on), noting the chunk in `bad` if it does not read.
    fn manifest_bytes(&self, m: &Hash, bad: &mut HashMap<Hash, Bad>) -> Result<Option<Vec<u8>>> {
        if let Some(b) = tables::manifest_bytes(self.db(), m)? {
            return Ok(Some(b));
        }
        match self.chunks().get(m) {
            Ok(b) => Ok(Some(b)),
            Err(e) => {
                bad.insert(*m, damage(e)?);
                Ok(None)
            }
        }
    }

    /// What a version with manifest `m` lacks: why it does not read and
    /// its chunks that do not, or `None` if it reads.
    fn manifest_cost(
        &self,
        m: &Hash,
        bad: &HashMap<Hash, Bad>,
    ) -> Result<Option<(String, Lacking)>> {
        let describe = |what: &str, h: &Hash, b: &Bad| match b {
            Bad::Missing => format!("{what} {h} is missing"),
            Bad::Damaged(_) => format!("{what} {h} is damaged"),
        };
        if let Some(b) = bad.get(m) {
            return Ok(Some((describe("its manifest", m, b), Vec::new())));
        }
        let mut scratch = HashMap::new();
        let Some(manifest) = self
            .manifest_bytes(m, &mut scratch)?
            .and_then(|b| Manifest::decode(&b))
        else {
            return Ok(None);
        };
        let mut lacking = Vec::new();
        let mut off = 0u64;
        let mut why = None;
        for e in &manifest.extents {
            if let Some(h) = e.chunk {
                if let Some(b) = bad.get(&h) {
                    why.get_or_insert_with(|| {
                        format!("{} (at byte {off})", describe("chunk", &h, b))
                    });
                    lacking.push((h, off, e.len));
                }
            }
            off += u64::from(e.len);
        }
        Ok(why.map(|w| {
            let more = lacking.len() - 1;
            let w = if more > 0 {
                format!("{w} and {more} more chunk(s)")
            } else {
                w
            };
            (w, lacking)
        }))
    }

    /// Stores again every bad chunk whose bytes a live file of an object
    /// that lost them still holds. Returns how many were stored.
    fn recover(&self, scan: &Scan, head: HeadFiles) -> Result<u64> {
        let mut restored: HashSet<Hash> = HashSet::new();
        let mut by_obj: BTreeMap<ObjectId, Vec<&Unreadable>> = BTreeMap::new();
        for u in &scan.report.unreadable {
            by_obj.entry(u.obj).or_default().push(u);
        }
        for (obj, lost) in by_obj {
            let Some(fd) = head(obj) else {
                continue;
            };
            if let Err(e) = self.recover_from(&fd, &lost, &scan.bad, &mut restored) {
                // One unreadable live file must not stop the others.
                tracing::warn!("fsck: cannot recover chunks from object {obj}'s live file: {e}");
            }
        }
        Ok(restored.len() as u64)
    }

    fn recover_from(
        &self,
        fd: &OwnedFd,
        lost: &[&Unreadable],
        bad: &HashMap<Hash, Bad>,
        restored: &mut HashSet<Hash>,
    ) -> Result<()> {
        let io = HistoryError::Source;
        let size = sys::fstat(fd.as_fd()).map_err(io)?.st_size as u64;
        let read_at = |buf: &mut [u8], off: u64| sys::pread(fd.as_fd(), buf, off);
        // Where the version had them: an append or an edit elsewhere leaves
        // a chunk's bytes at their offset.
        for u in lost {
            for (h, off, len) in &u.chunks {
                if restored.contains(h) || off + u64::from(*len) > size {
                    continue;
                }
                let mut buf = Vec::with_capacity(*len as usize);
                PositionalReader {
                    read_at: &read_at,
                    offset: *off,
                }
                .take(u64::from(*len))
                .read_to_end(&mut buf)
                .map_err(io)?;
                if chunks::hash(&buf) == *h {
                    self.restore_chunk(h, &buf)?;
                    restored.insert(*h);
                }
            }
        }
        if bad.keys().all(|h| restored.contains(h)) {
            return Ok(());
        }
        // Anywhere in it, as an ingest of the whole file cuts it (and its
        // manifest, when the version was the file as it is now).
        let reader = PositionalReader {
            read_at: &read_at,
            offset: 0,
        }
        .take(size);
        let manifest = content::recut(reader, size, &mut |h, data| {
            if bad.contains_key(h) && !restored.contains(h) {
                self.restore_chunk(h, data)?;
                restored.insert(*h);
            }
            Ok(())
        })?;
        let bytes = manifest.encode();
        let h = chunks::hash(&bytes);
        if bad.contains_key(&h) && !restored.contains(&h) {
            self.restore_chunk(&h, &bytes)?;
            restored.insert(h);
        }
        Ok(())
    }

    /// Stores `data` as chunk `h` again and points the index at it.
    fn restore_chunk(&self, h: &Hash, data: &[u8]) -> Result<()> {
        let loc = self.chunks().store_again(h, data)?;
        self.chunks().sync()?;
        let txn = self.maintenance_txn()?;
        txn.open_table(CHUNKS)
            .map_err(err)?
            .insert(h.as_slice(), loc.encode().as_slice())
            .map_err(err)?;
        txn.commit()?;
        Ok(())
    }

    /// Rewrites each version's content as `Lost`, noting the change in the
    /// hash chain as retention does (old record retired, new one amended).
    fn mark_lost(&self, lost: &[Unreadable]) -> Result<()> {
        if lost.is_empty() {
            return Ok(());
        }
        let txn = self.maintenance_txn()?;
        {
            let mut t = txn.open_table(VERSIONS).map_err(err)?;
            for u in lost {
                let key = tables::version_key(u.obj, u.seq);
                let Some(old) = t
                    .get(key.as_slice())
                    .map_err(err)?
                    .map(|v| v.value().to_vec())
                else {
                    continue;
                };
                let mut v = tables::decode(&old)?;
                let Content::File { manifest } = v.content else {
                    continue;
                };
                v.content = Content::Lost { manifest };
                let new = encode_version(&v);
                t.insert(key.as_slice(), new.as_slice()).map_err(err)?;
                chain::retire(&txn, u.seq, &chain::version_record(&key, &old))?;
                chain::amend(&txn, u.seq, &chain::version_record(&key, &new))?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Removes the index entries of damaged chunks (no version reads them
    /// any more), so that their bytes, met again, are stored again.
    fn drop_damaged(&self, bad: &HashMap<Hash, Bad>) -> Result<u64> {
        let damaged: Vec<&Hash> = bad
            .iter()
            .filter(|(_, b)| matches!(b, Bad::Damaged(_)))
            .map(|(h, _)| h)
            .collect();
        if damaged.is_empty() {
            return Ok(0);
        }
        // No version build may be between reusing one of them and its
        // commit (see `build_gate`).
        let _quiet = self.build_gate.write();
        let txn = self.maintenance_txn()?;
        let mut removed = 0;
        {
            let mut t = txn.open_table(CHUNKS).map_err(err)?;
            for h in damaged {
                if t.remove(h.as_slice()).map_err(err)?.is_some() {
                    removed += 1;
                }
            }
        }
        txn.commit()?;
        Ok(removed)
    }

    /// Scans every pack and indexes intact chunks the index lacks or has
    /// wrong. Returns how many entries were written. A delta chunk can be
    /// verified only once its base is indexed, so scans repeat while they
    /// find something (at most once per level of a delta chain).
    fn reindex_packs(&self, problems: &mut Vec<String>) -> Result<u64> {
        let mut total = 0;
        for _ in 0..=chunks::MAX_CHAIN {
            let mut pass_problems = Vec::new();
            let fixed = self.reindex_pass(&mut pass_problems)?;
            total += fixed;
            if fixed == 0 {
                problems.extend(pass_problems);
                break;
            }
        }
        Ok(total)
    }

    fn reindex_pass(&self, problems: &mut Vec<String>) -> Result<u64> {
        let dir = self.chunks().dir();
        let mut fixed = Vec::new();
        for id in self.chunks().pack_ids()? {
            let path = dir.join(format!("{id:08}.pack"));
            let bytes = self.chunks().pack_bytes(id)?;
            if bytes.len() < 16 || &bytes[..8] != PACK_MAGIC {
                problems.push(format!("{} is not a chronofs pack", path.display()));
                continue;
            }
            let mut off = 16usize;
            while off + ENTRY_HEADER_LEN <= bytes.len() {
                let head = &bytes[off..off + ENTRY_HEADER_LEN];
                let raw = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
                let stored = u32::from_be_bytes([head[9], head[10], head[11], head[12]]);
                let Some(h) = Hash::from_slice(&head[13..45]) else {
                    break;
                };
                let end = off + ENTRY_HEADER_LEN + stored as usize;
                if head[..4] != [0x43, 0x48, 0x4b, 0x31] || end > bytes.len() {
                    break;
                }
                let Some(loc) = Location::decode(
                    &[
                        &id.to_be_bytes()[..],
                        &(off as u64).to_be_bytes(),
                        &raw.to_be_bytes(),
                        &stored.to_be_bytes(),
                        &[head[4]],
                    ]
                    .concat(),
                ) else {
                    break;
                };
                let indexed = self.chunks().locate(&h)?;
                let good_index = match indexed {
                    Some(l) => self.chunks().read_at(&h, &l).is_ok(),
                    None => false,
                };
                if !good_index && self.chunks().read_at(&h, &loc).is_ok() {
                    fixed.push((h, loc));
                }
                off = end;
            }
        }
        if !fixed.is_empty() {
            let txn = self.maintenance_txn()?;
            {
                let mut t = txn.open_table(CHUNKS).map_err(err)?;
                for (h, loc) in &fixed {
                    t.insert(h.as_slice(), loc.encode().as_slice())
                        .map_err(err)?;
                }
            }
            txn.commit()?;
        }
        Ok(fixed.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::chunks::Encoding;

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn index(store: &crate::store::Store, entries: &[(Hash, Location)]) {
        let txn = store.index().begin_write().unwrap();
        {
            let mut t = txn.open_table(CHUNKS).unwrap();
            for (h, loc) in entries {
                t.insert(h.as_slice(), loc.encode().as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
    }

    #[test]
    fn a_delta_stored_again_keeps_its_lineage_so_its_deltas_read() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path()).unwrap();
        let chunks = store.chunk_store().unwrap();
        // One lineage: c2 is delta number 2 (on c0), c3 number 3 (on c2).
        let mut data = vec![noise(20_000, 9)];
        for i in 1..4 {
            let mut next = data[i - 1].clone();
            next[100 * i..100 * i + 8].copy_from_slice(b"an edit.");
            data.push(next);
        }
        let mut hashes: Vec<Hash> = Vec::new();
        for d in &data {
            let (h, _) = chunks.put_against(d, hashes.last()).unwrap();
            hashes.push(h);
        }
        let fresh = chunks.take_unjournaled();
        chunks.sync().unwrap();
        index(&store, &fresh);
        chunks.applied(hashes.iter().copied());
        let loc = chunks.locate(&hashes[2]).unwrap().unwrap();
        assert_eq!(loc.encoding, Encoding::Delta);
        // Damage c2's zstd frame, not its header.
        let pack = chunks.dir().join(format!("{:08}.pack", loc.pack));
        let mut bytes = std::fs::read(&pack).unwrap();
        let at = loc.offset as usize + ENTRY_HEADER_LEN + 36 + (loc.stored_len as usize - 36) / 2;
        bytes[at] ^= 0x5a;
        std::fs::write(&pack, bytes).unwrap();
        assert!(chunks.get(&hashes[2]).is_err());
        assert!(chunks.get(&hashes[3]).is_err());

        assert!(chunks.store_again(&hashes[2], &data[1]).is_err());
        let again = chunks.store_again(&hashes[2], &data[2]).unwrap();
        assert_eq!(again.encoding, Encoding::Delta);
        chunks.sync().unwrap();
        index(&store, &[(hashes[2], again)]);
        assert_eq!(chunks.get(&hashes[2]).unwrap(), data[2]);
        assert_eq!(chunks.get(&hashes[3]).unwrap(), data[3]);
    }

    #[test]
    fn recut_gives_the_manifest_an_ingest_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path()).unwrap();
        let chunks = store.chunk_store().unwrap();
        let mut data = noise(300_000, 3);
        data[100_000..180_000].fill(0);
        let size = data.len() as u64;
        let read_at = |buf: &mut [u8], off: u64| -> std::io::Result<usize> {
            let off = (off as usize).min(data.len());
            let n = buf.len().min(data.len() - off);
            buf[..n].copy_from_slice(&data[off..off + n]);
            Ok(n)
        };
        let (ingested, _) = content::ingest_sparse(
            &chunks,
            &read_at,
            size,
            &[(0, size)],
            None,
            chunks::ZSTD_LEVEL,
        )
        .unwrap();
        let mut seen = Vec::new();
        let recut = content::recut(data.as_slice(), size, &mut |h, d| {
            assert_eq!(chunks.get(h).unwrap(), d);
            seen.push(*h);
            Ok(())
        })
        .unwrap();
        assert_eq!(recut, ingested);
        assert_eq!(seen, content::chunk_refs(&ingested).collect::<Vec<_>>());
    }
}
