//! `fsck`: every version decodes, every manifest it names exists, every
//! chunk a manifest names exists and matches its hash. Repair re-indexes
//! intact chunks found in the packs (after a lost index update) and drops
//! index entries whose bytes are damaged, so the next ingest of that data
//! stores it again.

use std::collections::BTreeSet;

use redb::ReadableTable;

use super::model::*;
use super::tables::{self, MANIFESTS, VERSIONS};
use super::{read_txn, History, HistoryError, Result};
use crate::store::chunks::{self, Location, CHUNKS, ENTRY_HEADER_LEN, PACK_MAGIC};
use crate::store::{index_error, Hash, StoreError};

#[derive(Debug, Default)]
pub struct VerifyReport {
    pub versions: u64,
    pub manifests: u64,
    pub chunks: u64,
    pub bytes: u64,
    pub problems: Vec<String>,
    pub repaired: u64,
    /// Changes the hash chain covers, and those recorded before it.
    pub chained_ops: u64,
    pub unchained_ops: u64,
    /// The chain's head: (seq, hash).
    pub chain_head: Option<(u64, String)>,
}

fn err(e: impl Into<redb::Error>) -> HistoryError {
    HistoryError::Store(index_error(e))
}

impl History {
    pub fn verify(&self, repair: bool, progress: &mut dyn FnMut(u64, u64)) -> Result<VerifyReport> {
        // Without --repair, fsck only reads: on a full store it checks
        // what the index holds (changes still queued are journaled).
        if repair {
            self.sync()?;
        } else {
            self.sync_unless_full()?;
        }
        let mut report = VerifyReport::default();
        if repair {
            report.repaired += self.reindex_packs(&mut report.problems)?;
        }
        let chain = super::chain::verify(self.db())?;
        report.chained_ops = chain.ops;
        report.unchained_ops = chain.unchained_ops;
        report.chain_head = chain.head;
        report.problems.extend(chain.problems);
        let wanted = self.referenced_chunks(&mut report)?;
        let total = wanted.len() as u64;
        let mut damaged = Vec::new();
        for (i, h) in wanted.iter().enumerate() {
            match self.chunks().get(h) {
                Ok(data) => report.bytes += data.len() as u64,
                Err(StoreError::MissingChunk(_)) => report.problems.push(format!(
                    "chunk {} is referenced but missing",
                    chunks::hex(h)
                )),
                Err(e @ StoreError::CorruptChunk { .. }) => {
                    report.problems.push(e.to_string());
                    damaged.push(*h);
                }
                Err(e) => return Err(e.into()),
            }
            report.chunks += 1;
            progress(i as u64 + 1, total);
        }
        if repair && !damaged.is_empty() {
            let txn = self.db().begin_write().map_err(err)?;
            {
                let mut t = txn.open_table(CHUNKS).map_err(err)?;
                for h in &damaged {
                    t.remove(h.as_slice()).map_err(err)?;
                }
            }
            txn.commit().map_err(err)?;
            report.repaired += damaged.len() as u64;
        }
        Ok(report)
    }

    fn referenced_chunks(&self, report: &mut VerifyReport) -> Result<BTreeSet<Hash>> {
        let txn = read_txn(self.db())?;
        let mut wanted = BTreeSet::new();
        let versions = match txn.open_table(VERSIONS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(wanted),
            Err(e) => return Err(err(e)),
        };
        let manifests = txn.open_table(MANIFESTS).map_err(err)?;
        let mut seen_manifests = BTreeSet::new();
        for e in versions.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            report.versions += 1;
            let v = match tables::decode(v.value()) {
                Ok(v) => v,
                Err(_) => {
                    report
                        .problems
                        .push(format!("version record {:02x?} does not decode", k.value()));
                    continue;
                }
            };
            let Content::File { manifest } = v.content else {
                continue;
            };
            if !seen_manifests.insert(manifest) {
                continue;
            }
            report.manifests += 1;
            let in_table = manifests.get(manifest.as_slice()).map_err(err)?;
            let bytes = match in_table {
                Some(m) => Some(m.value().to_vec()),
                // Format 3: the manifest is a chunk, checked with the rest.
                None => {
                    wanted.insert(manifest);
                    self.chunks().get(&manifest).ok()
                }
            };
            match bytes.as_deref().and_then(Manifest::decode) {
                Some(m) => wanted.extend(super::content::chunk_refs(&m)),
                None => report.problems.push(format!(
                    "manifest {} is missing or damaged",
                    chunks::hex(&manifest)
                )),
            }
        }
        Ok(wanted)
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
                let mut h = [0u8; 32];
                h.copy_from_slice(&head[13..45]);
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
            let txn = self.db().begin_write().map_err(err)?;
            {
                let mut t = txn.open_table(CHUNKS).map_err(err)?;
                for (h, loc) in &fixed {
                    t.insert(h.as_slice(), loc.encode().as_slice())
                        .map_err(err)?;
                }
            }
            txn.commit().map_err(err)?;
        }
        Ok(fixed.len() as u64)
    }
}
