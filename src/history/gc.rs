//! Garbage collection: frees the chunks no version references any more
//! (after pruning) and compacts packs that are mostly dead.
//!
//! Safety argument (a crash or a concurrent change at any point never
//! loses a referenced chunk and never leaves a dangling reference):
//!
//! - Marking and sweeping read one index snapshot, taken after every
//!   journaled change was applied durably. Chunks stored after it are not
//!   in that snapshot's `chunks` table, so they are never candidates (and
//!   tracking records them too).
//! - Before the snapshot, the collector waits for every version build in
//!   flight (`History::build_gate`) and turns on tracking: from then on
//!   every put that finds its chunk already stored, or uses one as a
//!   delta base, records it. Removal happens with puts held off, minus
//!   everything tracked (and the delta bases those need), in one durable
//!   index commit. A later put of removed data stores it again.
//! - Pruning never runs during a collection (`History::maintenance`), so
//!   what the snapshot marks stays referenced.
//! - Compaction copies a pack's live entries verbatim into the pack being
//!   written, fsyncs it, commits the new locations durably, and only then
//!   deletes the old pack. A crash before the commit leaves unreferenced
//!   copies (counted as dead space by the next collection); after it, an
//!   old pack nothing points into.
//!
//! Memory: the live set holds 32 bytes per referenced chunk (a sorted
//! array), the dead list 40 bytes per unreferenced one.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use redb::{ReadableTable, ReadableTableMetadata};

use super::model::*;
use super::scrub::{Scrub, ScrubPlan};
use super::tables::{self, MANIFESTS, VERSIONS};
use super::{read_txn, History, HistoryError, Result};
use crate::store::chunks::{Encoding, Location, CHUNKS, ENTRY_HEADER_LEN, PACK_HEADER_LEN};
use crate::store::{index_error, Hash};

/// A pack is rewritten when less than this share of it is live: a
/// collection leaves at most a quarter more pack bytes than live data,
/// at the price of copying up to 80 % of a pack to free 20 %.
const COMPACT_LIVE_SHARE: f64 = 0.8;
/// Index entries removed or moved per write transaction.
const BATCH: usize = 50_000;
/// Bytes of live chunks a compaction round copies before it deletes its
/// packs (see `History::compact`).
const COMPACT_ROUND: u64 = 64 << 20;

/// What a collection found and did.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct GcReport {
    pub dry_run: bool,
    pub versions: u64,
    pub chunks: u64,
    pub live_chunks: u64,
    pub removed_chunks: u64,
    /// Stored bytes of the removed chunks.
    pub removed_bytes: u64,
    pub packs: u64,
    pub packs_deleted: u64,
    pub packs_rewritten: u64,
    /// Live bytes copied out of rewritten packs.
    pub moved_bytes: u64,
    pub pack_bytes_before: u64,
    pub pack_bytes_after: u64,
    pub elapsed_ms: u64,
    /// Tags of removed clones that no mark reads any more, released
    /// before the collection (filled in by the mount's service: history
    /// does not know clones); retention may then prune what only they
    /// kept, for a later collection to free.
    #[serde(default)]
    pub released_clone_tags: Vec<String>,
    /// Chunks a purge took whose bytes this collection removed from the
    /// store (their packs rewritten or deleted).
    #[serde(default)]
    pub scrubbed_chunks: u64,
    /// Chunks a purge took whose bytes are still in a pack: in the pack
    /// being written, or the base of a chunk a write used meanwhile. The
    /// next collection takes them.
    #[serde(default)]
    pub scrub_pending: u64,
    /// Live chunks written again whole because they were stored as deltas
    /// of a purged chunk.
    #[serde(default)]
    pub rewritten_whole: u64,
}

/// Progress: phase name, done, total.
pub type Progress<'a> = &'a mut dyn FnMut(&str, u64, u64);

fn err(e: impl Into<redb::Error>) -> HistoryError {
    HistoryError::Store(index_error(e))
}

/// Turns tracking off however the collection ends.
struct Tracking<'a>(&'a History);

impl Drop for Tracking<'_> {
    fn drop(&mut self) {
        self.0.chunks().stop_tracking();
    }
}

#[derive(Default, Clone, Copy)]
pub(super) struct PackUse {
    live_bytes: u64,
}

pub(super) fn entry_bytes(loc: &Location) -> u64 {
    ENTRY_HEADER_LEN as u64 + u64::from(loc.stored_len)
}

impl History {
    /// Collects garbage. `dry_run`: report what would be freed, change
    /// nothing.
    pub fn gc(&self, dry_run: bool, progress: Progress) -> Result<GcReport> {
        let started = Instant::now();
        let _one = self.maintenance.lock();
        // Close the pack being written (its chunks become compactable once
        // the sync below has indexed them).
        if !dry_run {
            self.chunks().rotate();
        }
        self.sync()?;
        {
            // Builds in flight may hold chunks they found stored before
            // tracking began: let them commit first.
            let _quiet = self.build_gate.write();
            self.chunks().start_tracking();
        }
        let _tracking = Tracking(self);
        self.sync()?;
        let mut report = GcReport {
            dry_run,
            ..Default::default()
        };
        // One snapshot for both: a chunk indexed after it is not a
        // candidate, whether or not a version marked it.
        let snapshot = read_txn(self.db())?;
        let scrub = Scrub::read(&snapshot)?;
        let marked = self.mark(&snapshot, &scrub, &mut report, progress)?;
        let (dead, packs) = self.sweep(&snapshot, &marked.live, &mut report, progress)?;
        drop(snapshot);
        let plan = self.scrub_plan(&scrub, &marked, &dead)?;
        report.packs = packs.len() as u64;
        report.pack_bytes_before = self.chunks().packs_size()?;
        if dry_run {
            let removed: Vec<&Dead> = dead.iter().chain(&plan.held).collect();
            report.removed_chunks = removed.len() as u64;
            report.removed_bytes = removed.iter().map(|d| d.bytes).sum();
            report.rewritten_whole = plan.rewrite.len() as u64;
            // A real run ends the pack being written first.
            let in_use = self.chunks().packs_unindexed();
            let freed: HashSet<u32> = plan.forced.difference(&in_use).copied().collect();
            let removed: HashSet<Hash> = removed.iter().map(|d| d.hash).collect();
            let outcome = scrub.outcome(&plan, &removed, &freed, &packs);
            (report.scrubbed_chunks, report.scrub_pending) = outcome.counts();
            self.foresee_compaction(&packs, &plan.forced, &mut report)?;
            report.elapsed_ms = started.elapsed().as_millis() as u64;
            return Ok(report);
        }
        drop(marked);
        let removed = self.remove_dead(dead, &plan, &mut report, progress)?;
        let freed = self.compact(&packs, &plan.forced, &mut report, progress)?;
        let outcome = scrub.outcome(&plan, &removed, &freed, &packs);
        (report.scrubbed_chunks, report.scrub_pending) = outcome.counts();
        self.record_scrub(&outcome)?;
        report.pack_bytes_after = self.chunks().packs_size()?;
        report.elapsed_ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            "gc: removed {} chunk(s) ({} bytes), deleted {} pack(s), rewrote {}",
            report.removed_chunks,
            report.removed_bytes,
            report.packs_deleted,
            report.packs_rewritten
        );
        Ok(report)
    }

    /// Every chunk a version references: manifests, their extents, and the
    /// delta bases those need, transitively; sorted, for binary search
    /// (32 bytes per live chunk).
    fn mark(
        &self,
        txn: &redb::ReadTransaction,
        scrub: &Scrub,
        report: &mut GcReport,
        progress: Progress,
    ) -> Result<Marked> {
        let mut live = Vec::new();
        let versions = match txn.open_table(VERSIONS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Marked::default()),
            Err(e) => return Err(err(e)),
        };
        let manifests = match txn.open_table(MANIFESTS) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(err(e)),
        };
        let total = versions.len().map_err(err)?;
        // Versions sharing a manifest (metadata changes, renames) are
        // neighbours in the table: reading each run once is enough.
        let mut previous: Option<Hash> = None;
        for (i, e) in versions.iter().map_err(err)?.enumerate() {
            let (_, v) = e.map_err(err)?;
            report.versions += 1;
            if i % 4096 == 0 {
                progress("marking", i as u64, total);
            }
            let Content::File { manifest } = tables::decode(v.value())?.content else {
                continue;
            };
            if previous.replace(manifest) == Some(manifest) {
                continue;
            }
            let in_table = match &manifests {
                Some(t) => t
                    .get(manifest.as_slice())
                    .map_err(err)?
                    .map(|m| m.value().to_vec()),
                None => None,
            };
            let bytes = match in_table {
                Some(b) => b,
                None => {
                    live.push(manifest);
                    self.chunks().get(&manifest)?
                }
            };
            let m = Manifest::decode(&bytes).ok_or_else(|| {
                HistoryError::Corrupt(format!("manifest {manifest} does not decode"))
            })?;
            live.extend(super::content::chunk_refs(&m));
        }
        progress("marking", total, total);
        let mut marked = Marked {
            live: Live::from(live),
            ..Default::default()
        };
        let chunks = txn.open_table(CHUNKS).map_err(err)?;
        // Delta bases, a pass over the index per level of new bases found.
        loop {
            let mut bases = Vec::new();
            for e in chunks.iter().map_err(err)? {
                let (k, v) = e.map_err(err)?;
                let h = to_hash(k.value())?;
                let loc = decode_loc(&h, v.value())?;
                if loc.encoding != Encoding::Delta || !marked.live.contains(&h) {
                    continue;
                }
                if let Some(base) = self.chunks().delta_base(&h, &loc)? {
                    if !scrub.is_empty() {
                        marked.base_of.insert(h, base);
                    }
                    if !marked.live.contains(&base) {
                        if scrub.holds(&base) {
                            marked.held.insert(base);
                        }
                        bases.push(base);
                    }
                }
            }
            if bases.is_empty() {
                return Ok(marked);
            }
            marked.live.0.extend(bases);
            marked.live = Live::from(std::mem::take(&mut marked.live.0));
        }
    }

    /// The indexed chunks not in `live`, and how much of each pack is live.
    fn sweep(
        &self,
        txn: &redb::ReadTransaction,
        live: &Live,
        report: &mut GcReport,
        progress: Progress,
    ) -> Result<(Vec<Dead>, HashMap<u32, PackUse>)> {
        let chunks = match txn.open_table(CHUNKS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Default::default()),
            Err(e) => return Err(err(e)),
        };
        let total = chunks.len().map_err(err)?;
        let mut dead = Vec::new();
        let mut packs: HashMap<u32, PackUse> = HashMap::new();
        for id in self.chunks().pack_ids()? {
            packs.insert(id, PackUse::default());
        }
        for (i, e) in chunks.iter().map_err(err)?.enumerate() {
            let (k, v) = e.map_err(err)?;
            let h = to_hash(k.value())?;
            let loc = decode_loc(&h, v.value())?;
            report.chunks += 1;
            if live.contains(&h) {
                report.live_chunks += 1;
                packs.entry(loc.pack).or_default().live_bytes += entry_bytes(&loc);
            } else {
                dead.push(Dead {
                    hash: h,
                    bytes: entry_bytes(&loc),
                    pack: loc.pack,
                });
            }
            if i % 4096 == 0 {
                progress("sweeping", i as u64, total);
            }
        }
        progress("sweeping", total, total);
        Ok((dead, packs))
    }

    /// Removes the dead chunks' index entries, sparing those puts reused
    /// meanwhile (and what they need), with puts held off.
    /// Purged chunks that live chunks are deltas of go too, once those
    /// are written again whole (unless a put used any of them meanwhile).
    /// Returns the chunks removed.
    fn remove_dead(
        &self,
        mut dead: Vec<Dead>,
        plan: &ScrubPlan,
        report: &mut GcReport,
        progress: Progress,
    ) -> Result<HashSet<Hash>> {
        if dead.is_empty() && plan.held.is_empty() {
            return Ok(HashSet::new());
        }
        let total = (dead.len() + plan.held.len()) as u64;
        self.chunks()
            .with_puts_held(|reused, fresh| -> Result<()> {
                let spared = self.needed_by(reused)?;
                let touched = plan
                    .held
                    .iter()
                    .map(|d| &d.hash)
                    .chain(&plan.rewrite)
                    .any(|h| spared.contains(h));
                if !plan.held.is_empty() && !touched {
                    // A live chunk that does not read back (fsck's to
                    // report) leaves its purged base for a later collection;
                    // this one goes on.
                    match self.rewrite_whole(&plan.rewrite, report) {
                        Ok(()) => dead.extend(plan.held.iter().copied()),
                        Err(e) => {
                            tracing::warn!("gc: a purged chunk's deltas stay as they are: {e}")
                        }
                    }
                }
                dead.retain(|d| !spared.contains(&d.hash) && !fresh.contains(&d.hash));
                for (n, batch) in dead.chunks(BATCH).enumerate() {
                    let txn = self.maintenance_txn()?;
                    {
                        let mut t = txn.open_table(CHUNKS).map_err(err)?;
                        // A purged chunk leaves the index and names its
                        // pack in one commit: if the compaction after it
                        // fails, the next collection still knows the pack.
                        let mut listed = txn.open_table(tables::SCRUB).map_err(err)?;
                        for d in batch {
                            t.remove(d.hash.as_slice()).map_err(err)?;
                            if let Some(pack) = plan.located.get(&d.hash) {
                                listed
                                    .insert(d.hash.as_slice(), u64::from(*pack) + 1)
                                    .map_err(err)?;
                            }
                        }
                    }
                    txn.commit()?;
                    progress("removing", ((n + 1) * BATCH).min(dead.len()) as u64, total);
                }
                Ok(())
            })?;
        report.removed_chunks = dead.len() as u64;
        report.removed_bytes = dead.iter().map(|d| d.bytes).sum();
        Ok(dead.iter().map(|d| d.hash).collect())
    }

    /// Writes `chunks` again stored whole and points the index at the
    /// copies (durably); their old entries become garbage.
    fn rewrite_whole(&self, chunks: &[Hash], report: &mut GcReport) -> Result<()> {
        let mut moved = Vec::with_capacity(chunks.len());
        for h in chunks {
            let Some(loc) = self.chunks().locate(h)? else {
                continue;
            };
            let to = self.chunks().rewrite_whole(h, &loc)?;
            report.moved_bytes += entry_bytes(&to);
            report.rewritten_whole += 1;
            moved.push((*h, loc, to));
        }
        if !moved.is_empty() {
            self.chunks().sync()?;
        }
        self.repoint(&moved)
    }

    /// Points the index at chunks' new copies, where it still points at
    /// the old ones, in durable commits.
    fn repoint(&self, moved: &[(Hash, Location, Location)]) -> Result<()> {
        for batch in moved.chunks(BATCH) {
            let txn = self.maintenance_txn()?;
            {
                let mut t = txn.open_table(CHUNKS).map_err(err)?;
                for (h, from, to) in batch {
                    let current = t
                        .get(h.as_slice())
                        .map_err(err)?
                        .map(|v| v.value().to_vec());
                    if current.as_deref() == Some(from.encode().as_slice()) {
                        t.insert(h.as_slice(), to.encode().as_slice())
                            .map_err(err)?;
                    }
                }
            }
            txn.commit()?;
        }
        Ok(())
    }

    /// `chunks` and every delta base they need, transitively.
    fn needed_by(&self, chunks: &HashSet<Hash>) -> Result<HashSet<Hash>> {
        let mut out = chunks.clone();
        let mut work: Vec<Hash> = chunks.iter().copied().collect();
        while let Some(h) = work.pop() {
            let Some(loc) = self.chunks().locate(&h)? else {
                continue;
            };
            if let Some(base) = self.chunks().delta_base(&h, &loc)? {
                if out.insert(base) {
                    work.push(base);
                }
            }
        }
        Ok(out)
    }

    /// Deletes packs with nothing live and rewrites mostly dead ones, in
    /// rounds that each free their packs before the next copies: first the
    /// packs with nothing live (no copy at all), then the others, least
    /// live first, about `COMPACT_ROUND` bytes of copies a round. On a
    /// full store every round frees more than it writes; copying every
    /// pack before deleting any needed room the store did not have.
    /// `forced` packs (holding purged chunks) are rewritten however live.
    /// Returns the packs deleted.
    fn compact(
        &self,
        packs: &HashMap<u32, PackUse>,
        forced: &HashSet<u32>,
        report: &mut GcReport,
        progress: Progress,
    ) -> Result<HashSet<u32>> {
        let in_use = self.chunks().packs_in_use();
        let chosen: Vec<(u64, u32)> = self
            .compaction_choice(packs, forced, &in_use)?
            .into_iter()
            .map(|(live, id, _)| (live, id))
            .collect();
        let total = chosen.len() as u64;
        let (dead, live): (Vec<_>, Vec<_>) = chosen.into_iter().partition(|(b, _)| *b == 0);
        let mut rounds: Vec<Vec<u32>> = vec![dead.into_iter().map(|(_, id)| id).collect()];
        let mut bytes = 0;
        for (b, id) in live {
            if bytes >= COMPACT_ROUND || rounds.len() == 1 {
                rounds.push(Vec::new());
                bytes = 0;
            }
            bytes += b;
            if let Some(round) = rounds.last_mut() {
                round.push(id);
            }
        }
        let mut done = 0;
        let mut freed = HashSet::new();
        for round in rounds.iter().filter(|r| !r.is_empty()) {
            freed.extend(self.compact_round(round, packs, report)?);
            done += round.len() as u64;
            progress("compacting", done, total);
        }
        Ok(freed)
    }

    /// The packs a compaction takes, fewest live bytes first: (live
    /// bytes, pack id, pack size). A pack mostly dead, empty, or `forced`
    /// (holding purged bytes); never one `in_use`.
    fn compaction_choice(
        &self,
        packs: &HashMap<u32, PackUse>,
        forced: &HashSet<u32>,
        in_use: &HashSet<u32>,
    ) -> Result<Vec<(u64, u32, u64)>> {
        let mut chosen = Vec::new();
        for (&id, usage) in packs {
            if in_use.contains(&id) {
                continue;
            }
            let size = self.chunks().pack_size(id)?;
            let payload = size.saturating_sub(PACK_HEADER_LEN);
            if (usage.live_bytes as f64) < payload as f64 * COMPACT_LIVE_SHARE
                || payload == 0
                || forced.contains(&id)
            {
                chosen.push((usage.live_bytes, id, size));
            }
        }
        chosen.sort_unstable();
        Ok(chosen)
    }

    /// What the compaction of a real run would do, for a dry run: the
    /// packs it deletes and rewrites, the bytes it moves, the size after.
    fn foresee_compaction(
        &self,
        packs: &HashMap<u32, PackUse>,
        forced: &HashSet<u32>,
        report: &mut GcReport,
    ) -> Result<()> {
        // A real run ends the pack being written first: it may be chosen.
        let in_use = self.chunks().packs_unindexed();
        let mut after = report.pack_bytes_before;
        for (live, _, size) in self.compaction_choice(packs, forced, &in_use)? {
            match live {
                0 => report.packs_deleted += 1,
                _ => report.packs_rewritten += 1,
            }
            report.moved_bytes += live;
            after = after.saturating_sub(size) + live;
        }
        // The moved chunks go to a fresh pack (the real run rotated).
        if report.moved_bytes > 0 {
            after += PACK_HEADER_LEN;
        }
        report.pack_bytes_after = after;
        Ok(())
    }

    /// Copies the chunks the index still locates in `round`'s packs to
    /// the pack being written, points the index at the copies (durably)
    /// and deletes the packs.
    fn compact_round(
        &self,
        round: &[u32],
        packs: &HashMap<u32, PackUse>,
        report: &mut GcReport,
    ) -> Result<Vec<u32>> {
        let chosen: HashSet<u32> = round.iter().copied().collect();
        let moving = self.entries_in(&chosen)?;
        let mut moved = Vec::with_capacity(moving.len());
        for (h, loc) in &moving {
            let to = self.chunks().copy_entry(h, loc)?;
            report.moved_bytes += entry_bytes(loc);
            moved.push((*h, *loc, to));
        }
        if !moved.is_empty() {
            self.chunks().sync()?;
        }
        self.repoint(&moved)?;
        // Anything still pointing into a chosen pack (a racing repair)
        // keeps that pack.
        let still = self.entries_in(&chosen)?;
        let kept: HashSet<u32> = still.iter().map(|(_, l)| l.pack).collect();
        let removable: Vec<u32> = round
            .iter()
            .copied()
            .filter(|id| !kept.contains(id))
            .collect();
        // The commits above were durable: nothing durable points into these.
        self.chunks().remove_packs(&removable)?;
        for id in &removable {
            if packs.get(id).is_some_and(|u| u.live_bytes > 0) {
                report.packs_rewritten += 1;
            } else {
                report.packs_deleted += 1;
            }
        }
        Ok(removable)
    }

    /// Index entries located in one of `packs`.
    fn entries_in(&self, packs: &HashSet<u32>) -> Result<Vec<(Hash, Location)>> {
        let txn = read_txn(self.db())?;
        let chunks = match txn.open_table(CHUNKS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(err(e)),
        };
        let mut out = Vec::new();
        for e in chunks.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let h = to_hash(k.value())?;
            let loc = decode_loc(&h, v.value())?;
            if packs.contains(&loc.pack) {
                out.push((h, loc));
            }
        }
        // In pack order: the copy reads each old pack front to back.
        out.sort_by_key(|(_, l)| (l.pack, l.offset));
        Ok(out)
    }
}

/// The referenced chunks, sorted and without duplicates.
#[derive(Default)]
pub(super) struct Live(Vec<Hash>);

impl From<Vec<Hash>> for Live {
    fn from(mut v: Vec<Hash>) -> Live {
        v.sort_unstable();
        v.dedup();
        v.shrink_to_fit();
        Live(v)
    }
}

impl Live {
    pub(super) fn contains(&self, h: &Hash) -> bool {
        self.0.binary_search(h).is_ok()
    }
}

/// An unreferenced chunk: its name, the pack bytes it takes and the pack.
#[derive(Clone, Copy)]
pub(super) struct Dead {
    pub hash: Hash,
    pub bytes: u64,
    pub pack: u32,
}

/// What marking found: the live chunks, and for a store with chunks
/// listed to scrub, the listed ones kept only as delta bases and the
/// delta base of each live delta chunk.
#[derive(Default)]
pub(super) struct Marked {
    pub live: Live,
    pub held: HashSet<Hash>,
    pub base_of: HashMap<Hash, Hash>,
}

fn to_hash(bytes: &[u8]) -> Result<Hash> {
    Hash::from_slice(bytes).ok_or_else(|| HistoryError::Corrupt("malformed chunk key".into()))
}

fn decode_loc(h: &Hash, bytes: &[u8]) -> Result<Location> {
    Location::decode(bytes)
        .ok_or_else(|| HistoryError::Corrupt(format!("bad location for chunk {h}")))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::prune::{Pins, Removal};
    use super::super::testkit::*;
    use super::*;

    fn collect(h: &History, dry_run: bool) -> GcReport {
        h.gc(dry_run, &mut |_, _, _| {}).unwrap()
    }

    fn latest(h: &History, obj: ObjectId) -> Version {
        h.object_at(obj, Seq::MAX).unwrap().unwrap().1
    }

    #[test]
    fn nothing_referenced_is_collected() {
        let k = kit();
        let h = &k.history;
        let a = noise(200_000, 1);
        let b = noise(150_000, 2);
        write(h, o(10), Some((ROOT, b"f")), &a);
        write(h, o(10), None, &b);
        let r = collect(h, false);
        assert_eq!(r.removed_chunks, 0);
        assert_eq!(r.live_chunks, r.chunks);
        let versions = h.versions(o(10), Seq::ZERO, Seq::MAX).unwrap();
        assert_eq!(read(h, &versions[0].1), a);
        assert_eq!(read(h, &versions[1].1), b);
    }

    #[test]
    fn frees_exactly_the_chunks_only_pruned_versions_referenced() {
        let k = kit();
        let h = &k.history;
        let v1 = noise(300_000, 1);
        let v2 = noise(200_000, 2);
        // Shares v1's first 150 kB (whole chunks of it), so those stay.
        let mut sharer = v1[..150_000].to_vec();
        sharer.extend(noise(50_000, 3));
        let s1 = write(h, o(10), Some((ROOT, b"f")), &v1);
        let old = latest(h, o(10));
        write(h, o(10), None, &v2);
        write(h, o(11), Some((ROOT, b"g")), &sharer);
        let kept: HashSet<Hash> = chunks_of(h, &latest(h, o(10)))
            .into_iter()
            .chain(chunks_of(h, &latest(h, o(11))))
            .collect();
        // A kept chunk stored as a delta keeps its base (the sharer's
        // chunk across the 150 kB boundary may be one against v1's).
        let bases: HashSet<Hash> = kept
            .iter()
            .filter_map(|c| {
                let loc = h.chunks().locate(c).unwrap()?;
                h.chunks().delta_base(c, &loc).unwrap()
            })
            .collect();
        let freed: HashSet<Hash> = chunks_of(h, &old)
            .into_iter()
            .filter(|c| !kept.contains(c) && !bases.contains(c))
            .collect();
        assert!(!freed.is_empty());
        assert!(
            chunks_of(h, &old).iter().any(|c| kept.contains(c)),
            "the test needs a chunk both versions share"
        );

        let out = h
            .prune(&[(o(10), Removal::Versions(vec![s1]))], Pins::Respect, None)
            .unwrap();
        assert_eq!(out.versions_removed, 1);
        let dry = collect(h, true);
        assert_eq!(dry.removed_chunks, freed.len() as u64);
        for c in &freed {
            assert!(h.chunks().contains(c).unwrap(), "a dry run removes nothing");
        }

        let r = collect(h, false);
        assert_eq!(r.removed_chunks, freed.len() as u64);
        assert!(r.removed_bytes > 0);
        // The dry run foresaw the real run's compaction.
        assert_eq!(
            (dry.packs_deleted, dry.packs_rewritten, dry.pack_bytes_after),
            (r.packs_deleted, r.packs_rewritten, r.pack_bytes_after)
        );
        for c in &freed {
            assert!(!h.chunks().contains(c).unwrap(), "unreferenced chunk kept");
        }
        for c in kept.iter().chain(&bases) {
            assert!(h.chunks().contains(c).unwrap(), "referenced chunk freed");
        }
        assert_eq!(read(h, &latest(h, o(10))), v2);
        assert_eq!(read(h, &latest(h, o(11))), sharer);
        assert_eq!(
            collect(h, false).removed_chunks,
            0,
            "a second pass frees nothing"
        );
    }

    /// On a full store, a pack with nothing live is deleted before any
    /// copy of another pack's live chunks is tried: copying first (every
    /// chosen pack) failed for lack of room, and nothing was freed.
    #[test]
    fn a_full_store_frees_dead_packs_before_it_copies() {
        use crate::store::sim::Sim;
        let sim = Sim::new();
        let store = crate::store::Store::open_with(Box::new(sim.clone()), "/sim".into()).unwrap();
        let h = History::open(&store, false).unwrap();
        let h = &*h;
        h.chunks().set_pack_limit(64 << 10);
        // A: a pack of its own, all dead once pruned. B: its first version
        // dead, its second live, in the next packs.
        write(h, o(10), Some((ROOT, b"a")), &noise(100_000, 1));
        h.chunks().rotate();
        let b1 = write(h, o(11), Some((ROOT, b"b")), &noise(40_000, 2));
        write(h, o(11), None, &noise(40_000, 3));
        h.chunks().rotate();
        h.sync().unwrap();
        let a_packs: HashSet<u32> = chunks_of(h, &latest(h, o(10)))
            .iter()
            .map(|c| h.chunks().locate(c).unwrap().unwrap().pack)
            .collect();
        unlink(h, ROOT, b"a", o(10));
        h.prune(
            &[
                (o(10), Removal::Whole),
                (o(11), Removal::Versions(vec![b1])),
            ],
            Pins::Respect,
            None,
        )
        .unwrap();
        sim.set_full(true);
        // The copies cannot be written; the dead packs go all the same.
        let _ = h.gc(false, &mut |_, _, _| {});
        let left: HashSet<u32> = h.chunks().pack_ids().unwrap().into_iter().collect();
        assert!(
            left.is_disjoint(&a_packs),
            "{left:?} still holds {a_packs:?}"
        );
        sim.set_full(false);
        let r = collect(h, false);
        assert_eq!(r.removed_chunks, 0, "{r:?}");
        assert_eq!(read(h, &latest(h, o(11))), noise(40_000, 3));
    }

    /// A pack whose creation a crash cut short (an empty file, or part of
    /// a header) holds nothing: gc and fsck go on, and gc removes it.
    #[test]
    fn a_pack_cut_short_at_its_creation_is_no_obstacle() {
        let k = kit();
        let h = &k.history;
        write(h, o(10), Some((ROOT, b"f")), &noise(50_000, 1));
        h.sync().unwrap();
        let short = k.dir.path().join("store/packs/00000099.pack");
        std::fs::write(&short, b"CHRONO").unwrap();
        let r = collect(h, false);
        assert_eq!(r.removed_chunks, 0);
        assert!(!short.exists(), "the empty pack stayed");
        std::fs::write(&short, b"").unwrap();
        h.verify(None, &mut |_, _| {})
            .expect("fsck reads the store");
        assert_eq!(read(h, &latest(h, o(10))), noise(50_000, 1));
    }
}
