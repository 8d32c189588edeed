//! Purged bytes out of the store. A purge promises that what it took is
//! gone, but a collection alone frees an unreferenced chunk only when its
//! pack is mostly dead, and keeps whole any chunk a live chunk is a delta
//! of. So a purge lists the chunks its versions referenced (table
//! `scrub`), and each collection, for every listed chunk nothing
//! references any more:
//!
//! - rewrites the pack holding it, however live that pack is;
//! - when live chunks are stored as deltas of it, writes those (and the
//!   deltas built on them, whose lineage numbers would no longer match)
//!   again whole first, so it can go too;
//! - keeps it listed until its pack is gone: a chunk in the pack being
//!   written, or one a write reused during the collection, waits for the
//!   next collection.
//!
//! A listed chunk some version still references (the same bytes in
//! another file, a tag, a clone) stays untouched in the packs, and listed
//! until nothing does: a collection that runs between a purge's listing
//! and its removal of the versions must not forget it.

use std::collections::{HashMap, HashSet};

use redb::ReadableTable;

use super::gc::{entry_bytes, Dead, Marked, PackUse};
use super::model::{Content, ObjectId, Seq};
#[cfg(test)]
use super::model::{Extent, Manifest, ROOT};
use super::tables::SCRUB;
use super::{History, HistoryError, Result};
use crate::store::{index_error, Hash};

fn err(e: impl Into<redb::Error>) -> HistoryError {
    HistoryError::Store(index_error(e))
}

/// The listed chunks: 0 = look it up in the index; p + 1 = out of the
/// index already, its bytes still in pack p.
#[derive(Default)]
pub(super) struct Scrub(HashMap<Hash, u64>);

/// What this collection does about the listed chunks.
#[derive(Default)]
pub(super) struct ScrubPlan {
    /// Listed chunks kept only as delta bases of live chunks.
    pub held: Vec<Dead>,
    /// The live chunks to write again whole before `held` may go.
    pub rewrite: Vec<Hash>,
    /// Packs rewritten however live they are.
    pub forced: HashSet<u32>,
    /// The pack of each listed chunk found unreferenced.
    pub located: HashMap<Hash, u32>,
    /// Listed chunks a version references.
    referenced: HashSet<Hash>,
}

/// The list after a collection.
pub(super) struct ScrubOutcome {
    done: Vec<Hash>,
    pending: Vec<(Hash, u64)>,
    scrubbed: u64,
}

impl ScrubOutcome {
    /// (chunks whose bytes left the store, chunks still listed).
    pub fn counts(&self) -> (u64, u64) {
        (self.scrubbed, self.pending.len() as u64)
    }
}

impl Scrub {
    pub fn read(txn: &redb::ReadTransaction) -> Result<Scrub> {
        let table = match txn.open_table(SCRUB) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Scrub::default()),
            Err(e) => return Err(err(e)),
        };
        let mut out = HashMap::new();
        for e in table.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let h = Hash::from_slice(k.value())
                .ok_or_else(|| HistoryError::Corrupt("malformed scrub key".into()))?;
            out.insert(h, v.value());
        }
        Ok(Scrub(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `h` is listed and still to be looked up in the index.
    pub fn holds(&self, h: &Hash) -> bool {
        self.0.get(h) == Some(&0)
    }

    /// The list once the collection removed the chunks `removed` and
    /// deleted the packs `freed`; `packs`: the packs that existed.
    pub fn outcome(
        &self,
        plan: &ScrubPlan,
        removed: &HashSet<Hash>,
        freed: &HashSet<u32>,
        packs: &HashMap<u32, PackUse>,
    ) -> ScrubOutcome {
        let held: HashSet<Hash> = plan.held.iter().map(|d| d.hash).collect();
        let mut out = ScrubOutcome {
            done: Vec::new(),
            pending: Vec::new(),
            scrubbed: 0,
        };
        for (&h, &value) in &self.0 {
            if let Some(pack) = value.checked_sub(1).and_then(|p| u32::try_from(p).ok()) {
                if freed.contains(&pack) || !packs.contains_key(&pack) {
                    out.done.push(h);
                    out.scrubbed += 1;
                } else {
                    out.pending.push((h, value));
                }
            } else if plan.referenced.contains(&h) {
                // Live data now (the same bytes elsewhere, a tag, a clone,
                // or a purge whose removal is still to come): listed until
                // nothing references it.
            } else if removed.contains(&h) {
                match plan.located.get(&h) {
                    Some(pack) if !freed.contains(pack) => {
                        out.pending.push((h, u64::from(*pack) + 1));
                    }
                    _ => {
                        out.done.push(h);
                        out.scrubbed += 1;
                    }
                }
            } else if held.contains(&h) || plan.located.contains_key(&h) {
                // A put used it during the collection: still stored.
                out.pending.push((h, 0));
            } else {
                // Not in the index: never stored, or already taken.
                out.done.push(h);
            }
        }
        out
    }
}

impl History {
    /// Lists the chunks of `objects`' versions (their manifests and what
    /// those reference) for the next collections to take out of the packs.
    /// Called before the versions are removed: a crash between the two
    /// leaves referenced chunks listed, which a collection lets be.
    pub fn scrub_later(&self, objects: &[ObjectId]) -> Result<()> {
        let mut chunks = Vec::new();
        for &obj in objects {
            for (_, v) in self.versions(obj, Seq::ZERO, Seq::MAX)? {
                let (Content::File { manifest } | Content::Lost { manifest }) = v.content else {
                    continue;
                };
                chunks.push(manifest);
                // An unreadable manifest lists only itself: its extents
                // cannot be known (fsck reports it).
                if let Ok(m) = self.manifest(&manifest) {
                    chunks.extend(super::content::chunk_refs(&m));
                }
            }
        }
        // The delta bases they read through hold earlier bytes of the same
        // content (a version retention pruned): they go too, once nothing
        // references them.
        let mut seen: HashSet<Hash> = chunks.iter().copied().collect();
        let mut work = chunks.clone();
        while let Some(h) = work.pop() {
            let Some(loc) = self.chunks().locate(&h)? else {
                continue;
            };
            if let Ok(Some(base)) = self.chunks().delta_base(&h, &loc) {
                if seen.insert(base) {
                    chunks.push(base);
                    work.push(base);
                }
            }
        }
        if chunks.is_empty() {
            return Ok(());
        }
        let txn = self.maintenance_txn()?;
        {
            let mut t = txn.open_table(SCRUB).map_err(err)?;
            for h in chunks {
                // One listed already keeps what it says (the pack it is
                // still in).
                if t.get(h.as_slice()).map_err(err)?.is_none() {
                    t.insert(h.as_slice(), 0).map_err(err)?;
                }
            }
        }
        txn.commit()
    }

    /// The plan for the listed chunks, from the collection's mark and
    /// sweep of one snapshot.
    pub(super) fn scrub_plan(
        &self,
        scrub: &Scrub,
        marked: &Marked,
        dead: &[Dead],
    ) -> Result<ScrubPlan> {
        let mut plan = ScrubPlan::default();
        if scrub.is_empty() {
            return Ok(plan);
        }
        for d in dead.iter().filter(|d| scrub.holds(&d.hash)) {
            plan.located.insert(d.hash, d.pack);
            plan.forced.insert(d.pack);
        }
        for (h, value) in &scrub.0 {
            match value.checked_sub(1).and_then(|p| u32::try_from(p).ok()) {
                Some(pack) => {
                    plan.forced.insert(pack);
                }
                None if marked.live.contains(h) && !marked.held.contains(h) => {
                    plan.referenced.insert(*h);
                }
                None => {}
            }
        }
        for h in &marked.held {
            let Some(loc) = self.chunks().locate(h)? else {
                continue;
            };
            plan.held.push(Dead {
                hash: *h,
                bytes: entry_bytes(&loc),
                pack: loc.pack,
            });
            plan.located.insert(*h, loc.pack);
            plan.forced.insert(loc.pack);
        }
        plan.rewrite = descendants(&marked.held, &marked.base_of);
        Ok(plan)
    }

    /// Writes the list a collection leaves.
    pub(super) fn record_scrub(&self, outcome: &ScrubOutcome) -> Result<()> {
        if outcome.done.is_empty() && outcome.pending.is_empty() {
            return Ok(());
        }
        let txn = self.maintenance_txn()?;
        {
            let mut t = txn.open_table(SCRUB).map_err(err)?;
            for h in &outcome.done {
                t.remove(h.as_slice()).map_err(err)?;
            }
            for (h, value) in &outcome.pending {
                t.insert(h.as_slice(), *value).map_err(err)?;
            }
        }
        txn.commit()
    }

    /// How many chunks the list holds (for tests and `status`).
    pub fn scrub_listed(&self) -> Result<u64> {
        let txn = super::read_txn(self.db())?;
        Ok(Scrub::read(&txn)?.0.len() as u64)
    }
}

/// Every live chunk stored as a delta of a chunk in `roots`, directly or
/// through others, except the roots themselves, in no particular order.
fn descendants(roots: &HashSet<Hash>, base_of: &HashMap<Hash, Hash>) -> Vec<Hash> {
    let mut children: HashMap<Hash, Vec<Hash>> = HashMap::new();
    for (child, base) in base_of {
        children.entry(*base).or_default().push(*child);
    }
    let mut seen: HashSet<Hash> = roots.clone();
    let mut work: Vec<Hash> = roots.iter().copied().collect();
    let mut out = Vec::new();
    while let Some(h) = work.pop() {
        for c in children.get(&h).into_iter().flatten() {
            if seen.insert(*c) {
                out.push(*c);
                work.push(*c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::prune::{Pins, Removal};
    use super::super::testkit::*;
    use super::super::Version;
    use super::*;

    fn collect(h: &History, dry_run: bool) -> super::super::gc::GcReport {
        h.gc(dry_run, &mut |_, _, _| {}).unwrap()
    }

    fn latest(h: &History, obj: ObjectId) -> Version {
        h.object_at(obj, Seq::MAX).unwrap().unwrap().1
    }

    /// Records `data` as the next version of file `obj`, its one chunk
    /// stored as a delta of chunk `base`; returns that chunk.
    fn write_delta(h: &History, obj: ObjectId, data: &[u8], base: &Hash) -> Hash {
        let (chunk, _) = h.chunks().put_against(data, Some(base)).unwrap();
        let manifest = Manifest {
            extents: vec![Extent {
                len: data.len() as u32,
                chunk: Some(chunk),
            }],
        };
        let (m, _) = h.chunks().put_against(&manifest.encode(), None).unwrap();
        record_file(h, obj, None, m, data.len() as u64);
        chunk
    }

    /// Whether any pack file still holds an entry of chunk `c` (its
    /// header carries the hash).
    fn in_packs(h: &History, c: &Hash) -> bool {
        h.chunks().pack_ids().unwrap().into_iter().any(|id| {
            let bytes = h.chunks().pack_bytes(id).unwrap();
            bytes.windows(32).any(|w| w == c.as_slice())
        })
    }

    #[test]
    fn a_purged_file_leaves_no_bytes_in_a_pack_that_is_mostly_live() {
        let k = kit();
        let h = &k.history;
        let big = noise(2_000_000, 1);
        let secret = noise(40_000, 2);
        write(h, o(11), Some((ROOT, b"g")), &big);
        write(h, o(10), Some((ROOT, b"f")), &secret);
        let doomed = chunks_of(h, &latest(h, o(10)));
        unlink(h, ROOT, b"f", o(10));
        h.scrub_later(&[o(10)]).unwrap();
        assert_eq!(h.scrub_listed().unwrap(), doomed.len() as u64);
        let out = h
            .prune(&[(o(10), Removal::Whole)], Pins::Override, None)
            .unwrap();
        assert_eq!(out.objects_removed, 1);

        let dry = collect(h, true);
        let r = collect(h, false);
        assert_eq!(r.removed_chunks, doomed.len() as u64);
        assert_eq!(r.scrubbed_chunks, doomed.len() as u64, "{r:?}");
        assert_eq!(r.scrub_pending, 0);
        assert_eq!(
            (dry.removed_chunks, dry.scrubbed_chunks, dry.scrub_pending),
            (r.removed_chunks, r.scrubbed_chunks, r.scrub_pending),
            "a dry run reports what the real run does"
        );
        assert!(r.packs_rewritten >= 1, "{r:?}");
        for c in &doomed {
            assert!(!in_packs(h, c), "purged chunk {c} still in a pack");
        }
        assert_eq!(read(h, &latest(h, o(11))), big);
        assert_eq!(h.scrub_listed().unwrap(), 0);
        let again = collect(h, false);
        assert_eq!((again.removed_chunks, again.packs_rewritten), (0, 0));
    }

    #[test]
    fn a_purge_takes_the_bases_its_chunks_were_deltas_of() {
        let k = kit();
        let h = &k.history;
        write(h, o(11), Some((ROOT, b"g")), &noise(2_000_000, 7));
        let v1 = noise(10_000, 8);
        let s1 = write(h, o(10), Some((ROOT, b"f")), &v1);
        let base = chunks_of(h, &latest(h, o(10)))[0];
        // The delta in another pack than its base, whose pack is mostly
        // the live file's.
        h.chunks().rotate();
        let mut v2 = v1.clone();
        v2[0..8].copy_from_slice(b"changed!");
        let c2 = write_delta(h, o(10), &v2, &base);
        // Retention takes the first version; its chunk stays as the base.
        h.prune(&[(o(10), Removal::Versions(vec![s1]))], Pins::Respect, None)
            .unwrap();
        collect(h, false);
        assert!(
            in_packs(h, &base),
            "the base is kept while a delta needs it"
        );
        unlink(h, ROOT, b"f", o(10));
        h.scrub_later(&[o(10)]).unwrap();
        h.prune(&[(o(10), Removal::Whole)], Pins::Override, None)
            .unwrap();
        let r = collect(h, false);
        assert!(!in_packs(h, &base), "the older bytes stayed: {r:?}");
        assert!(!in_packs(h, &c2));
        assert_eq!(h.scrub_listed().unwrap(), 0);
    }

    #[test]
    fn a_purged_chunk_goes_from_under_the_live_deltas_of_it() {
        let k = kit();
        let h = &k.history;
        let v1 = noise(10_000, 3);
        let s1 = write(h, o(10), Some((ROOT, b"f")), &v1);
        let first = latest(h, o(10));
        let old = h.manifest(&match first.content {
            Content::File { manifest } => manifest,
            _ => unreachable!(),
        });
        let old = old.unwrap();
        let [Extent {
            chunk: Some(base), ..
        }] = old.extents.as_slice()
        else {
            panic!("the test needs one chunk: {old:?}");
        };
        // The next version changes a few bytes: stored as a delta of it.
        let mut v2 = v1.clone();
        v2[100..108].copy_from_slice(b"changed!");
        let (c2, _) = h.chunks().put_against(&v2, Some(base)).unwrap();
        let loc = h.chunks().locate(&c2).unwrap().unwrap();
        assert_eq!(h.chunks().delta_base(&c2, &loc).unwrap(), Some(*base));
        let manifest = Manifest {
            extents: vec![Extent {
                len: v2.len() as u32,
                chunk: Some(c2),
            }],
        };
        let (m2, _) = h.chunks().put_against(&manifest.encode(), None).unwrap();
        record_file(h, o(10), None, m2, v2.len() as u64);

        h.scrub_later(&[o(10)]).unwrap();
        h.prune(
            &[(o(10), Removal::Versions(vec![s1]))],
            Pins::Override,
            None,
        )
        .unwrap();
        let r = collect(h, false);
        assert_eq!(r.rewritten_whole, 1, "{r:?}");
        assert!(!in_packs(h, base), "the purged base is still in a pack");
        assert_eq!(read(h, &latest(h, o(10))), v2);
        assert_eq!(r.scrub_pending, 0, "{r:?}");
        // The live version's chunks stay listed, untouched, until nothing
        // references them.
        assert_eq!(
            h.scrub_listed().unwrap(),
            chunks_of(h, &latest(h, o(10))).len() as u64
        );
        assert!(in_packs(h, &c2));
    }

    fn h(n: u8) -> Hash {
        Hash::from_slice(&[n; 32]).unwrap_or_default()
    }

    #[test]
    fn descendants_follow_deltas_of_deltas_and_leave_out_the_roots() {
        // 1 <- 2 <- 3, 1 <- 4, 5 <- 6 (unrelated), 1 <- 7 where 7 is a root.
        let base_of: HashMap<Hash, Hash> = [(2, 1), (3, 2), (4, 1), (6, 5), (7, 1)]
            .into_iter()
            .map(|(c, b)| (h(c), h(b)))
            .collect();
        let roots: HashSet<Hash> = [h(1), h(7)].into_iter().collect();
        let mut got = descendants(&roots, &base_of);
        got.sort();
        assert_eq!(got, vec![h(2), h(3), h(4)]);
    }
}
