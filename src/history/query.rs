//! Queries over recorded history. Every query first makes queued changes
//! visible (`settle`), so it sees everything committed before it.
//!
//! The one rule that makes lazy baselines exact: an object never changed
//! through the mount has no versions, and its state at any past instant is
//! its live state; an object whose first version is a `Baseline` had that
//! state back to its first appearance, so a query before the baseline reads
//! the baseline (at its sequence number).

use redb::{ReadableTable, ReadableTableMetadata};

use super::model::*;
use super::tables::{self, DIRENTS, LINKS, SEQS, TAGS, TIMES, VERSIONS};
use super::{read_txn, History, HistoryError, Result};
use crate::store::Hash;

fn err(e: impl Into<redb::Error>) -> HistoryError {
    HistoryError::Store(crate::store::index_error(e))
}

/// What a name in a directory was at an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(ObjectId),
    /// Did not exist then (the directory's listing is recorded).
    Absent,
    /// The directory's listing was never recorded at that instant: it had
    /// not changed through the mount, so its live listing is its listing.
    Live,
}

/// One binding of a name to an object, as seen from the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub seq: Seq,
    pub parent: ObjectId,
    pub name: Vec<u8>,
    pub bound: bool,
}

/// A recorded version with its sequence number.
pub type Recorded = (Seq, Version);
/// A sequence number and its time (ns).
pub type Stamp = (Seq, i64);
/// A directory listing: names and the objects they name.
pub type Listing = Vec<(Vec<u8>, ObjectId)>;
/// Every recorded change of every name in a directory.
pub type NameChanges = Vec<(Vec<u8>, Seq, Option<ObjectId>)>;

macro_rules! open_or_empty {
    ($txn:expr, $def:expr, $empty:expr) => {
        match $txn.open_table($def) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok($empty),
            Err(e) => return Err(err(e)),
        }
    };
}

impl History {
    /// The last sequence number at or before `time_ns`, or `None` before
    /// history began.
    pub fn seq_at_time(&self, time_ns: i64) -> Result<Option<Seq>> {
        self.settle()?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, TIMES, None);
        let mut r = t.range(..=time_ns).map_err(err)?;
        Ok(match r.next_back() {
            Some(e) => Some(Seq::new(e.map_err(err)?.1.value())),
            None => None,
        })
    }

    pub fn time_of_seq(&self, seq: Seq) -> Result<Option<i64>> {
        self.settle()?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, SEQS, None);
        Ok(t.get(seq.get()).map_err(err)?.map(|v| v.value()))
    }

    /// First and last recorded sequence numbers with their times.
    pub fn bounds(&self) -> Result<Option<(Stamp, Stamp)>> {
        self.settle()?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, SEQS, None);
        let stamp = |(k, v): (redb::AccessGuard<u64>, redb::AccessGuard<i64>)| {
            (Seq::new(k.value()), v.value())
        };
        let first = t.first().map_err(err)?.map(stamp);
        let last = t.last().map_err(err)?.map(stamp);
        Ok(first.zip(last))
    }

    pub fn tag(&self, name: &str) -> Result<Option<Seq>> {
        self.settle()?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, TAGS, None);
        Ok(t.get(name).map_err(err)?.map(|v| Seq::new(v.value())))
    }

    pub fn tags(&self) -> Result<Vec<(String, Seq)>> {
        self.settle()?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, TAGS, Vec::new());
        let mut out = Vec::new();
        for e in t.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            out.push((k.value().to_string(), Seq::new(v.value())));
        }
        Ok(out)
    }

    /// All versions of `obj` with sequence numbers in `from..=to`.
    pub fn versions(&self, obj: ObjectId, from: Seq, to: Seq) -> Result<Vec<Recorded>> {
        self.settle_for(&[obj])?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, VERSIONS, Vec::new());
        let lo = tables::version_key(obj, from);
        let hi = tables::version_key(obj, to);
        let mut out = Vec::new();
        for e in t.range(lo.as_slice()..=hi.as_slice()).map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let seq = Seq::from_be_bytes(
                k.value()[8..16]
                    .try_into()
                    .map_err(|_| HistoryError::Corrupt("malformed version key".into()))?,
            );
            out.push((seq, tables::decode(v.value())?));
        }
        Ok(out)
    }

    /// The sequence number at which to read `obj` for an instant `seq`:
    /// `seq` itself, or the object's baseline if `seq` precedes it.
    fn effective_seq(&self, obj: ObjectId, seq: Seq) -> Result<Seq> {
        let first = self.versions_first(obj)?;
        Ok(match first {
            Some((s, Cause::Baseline)) if s > seq => s,
            // Its older versions were pruned: the oldest kept one is the
            // nearest state history holds (never the live file).
            Some((s, _)) if s > seq && self.prefix_pruned(obj)?.is_some_and(|from| seq >= from) => {
                s
            }
            _ => seq,
        })
    }

    fn versions_first(&self, obj: ObjectId) -> Result<Option<(Seq, Cause)>> {
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, VERSIONS, None);
        let lo = tables::version_key(obj, Seq::ZERO);
        let hi = tables::version_key(obj, Seq::MAX);
        let mut r = t.range(lo.as_slice()..=hi.as_slice()).map_err(err)?;
        match r.next() {
            Some(e) => {
                let (k, v) = e.map_err(err)?;
                let seq = Seq::from_be_bytes(k.value()[8..16].try_into().unwrap_or([0; 8]));
                Ok(Some((seq, tables::decode(v.value())?.cause)))
            }
            None => Ok(None),
        }
    }

    /// The state of `obj` at `seq` (see the module rule for baselines).
    /// `None`: no version recorded by then (the object is unchanged since,
    /// so its live state is its state then — or it did not exist).
    pub fn object_at(&self, obj: ObjectId, seq: Seq) -> Result<Option<Recorded>> {
        self.settle_for(&[obj])?;
        let seq = self.effective_seq(obj, seq)?;
        tables::version_at(self.db(), obj, seq)
    }

    /// What `name` in directory `dir` was at `seq`.
    pub fn lookup_at(&self, dir: ObjectId, name: &[u8], seq: Seq) -> Result<Lookup> {
        self.settle_for(&[dir])?;
        let seq = self.effective_seq(dir, seq)?;
        if tables::version_at(self.db(), dir, seq)?.is_none() {
            return Ok(Lookup::Live);
        }
        Ok(match tables::dirent_at(self.db(), dir, name, seq)? {
            Some(Some(obj)) => Lookup::Found(obj),
            _ => Lookup::Absent,
        })
    }

    /// The entries of directory `dir` at `seq`, sorted by name; `None` if
    /// its listing was not recorded by then (read it live).
    pub fn list_at(&self, dir: ObjectId, seq: Seq) -> Result<Option<Listing>> {
        self.settle_for(&[dir])?;
        let seq = self.effective_seq(dir, seq)?;
        if tables::version_at(self.db(), dir, seq)?.is_none() {
            return Ok(None);
        }
        Ok(Some(self.scan_dirents(dir, |s| s <= seq)?))
    }

    /// Every name ever recorded in `dir`, with the children it named.
    pub fn names_ever(&self, dir: ObjectId) -> Result<NameChanges> {
        self.settle_for(&[dir])?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, DIRENTS, Vec::new());
        let lo = dir.to_be_bytes();
        let hi = (dir.get() + 1).to_be_bytes();
        let mut out = Vec::new();
        for e in t.range(lo.as_slice()..hi.as_slice()).map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let (name, seq) = tables::split_dirent_key(k.value())
                .ok_or_else(|| HistoryError::Corrupt("malformed dirent key".into()))?;
            out.push((name.to_vec(), seq, tables::child(v.value())));
        }
        Ok(out)
    }

    /// Live entries of `dir` as of the last entry per name accepted by `keep`.
    fn scan_dirents(
        &self,
        dir: ObjectId,
        keep: impl Fn(Seq) -> bool,
    ) -> Result<Vec<(Vec<u8>, ObjectId)>> {
        let mut out: Vec<(Vec<u8>, ObjectId)> = Vec::new();
        let mut current: Option<(Vec<u8>, Option<ObjectId>)> = None;
        for (name, seq, child) in self.names_ever(dir)? {
            if !keep(seq) {
                continue;
            }
            match &mut current {
                Some((n, c)) if *n == name => *c = child,
                _ => {
                    if let Some((n, Some(c))) = current.take() {
                        out.push((n, c));
                    }
                    current = Some((name, child));
                }
            }
        }
        if let Some((n, Some(c))) = current {
            out.push((n, c));
        }
        Ok(out)
    }

    /// Every binding and unbinding of a name to `obj`, oldest first.
    pub fn links(&self, obj: ObjectId) -> Result<Vec<Link>> {
        self.settle()?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, LINKS, Vec::new());
        let lo = obj.to_be_bytes();
        let hi = (obj.get() + 1).to_be_bytes();
        let mut out = Vec::new();
        for e in t.range(lo.as_slice()..hi.as_slice()).map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let (seq, parent, name) = tables::split_link_key(k.value())
                .ok_or_else(|| HistoryError::Corrupt("malformed link key".into()))?;
            out.push(Link {
                seq,
                parent,
                name: name.to_vec(),
                bound: v.value() == 1,
            });
        }
        Ok(out)
    }

    /// A name `obj` had at `seq` (parent, name), if any was recorded.
    pub fn name_at(&self, obj: ObjectId, seq: Seq) -> Result<Option<(ObjectId, Vec<u8>)>> {
        Ok(self.names_at(obj, seq)?.pop())
    }

    /// Every name `obj` had at `seq` (parent, name), the latest bound last.
    pub fn names_at(&self, obj: ObjectId, seq: Seq) -> Result<Vec<(ObjectId, Vec<u8>)>> {
        let mut alive: Vec<(ObjectId, Vec<u8>)> = Vec::new();
        for l in self.links(obj)? {
            if l.seq > seq {
                break;
            }
            let key = (l.parent, l.name);
            if l.bound {
                alive.push(key);
            } else {
                alive.retain(|k| *k != key);
            }
        }
        Ok(alive)
    }

    /// How many names `obj` had at `seq` inside the tree at path `root`,
    /// if history recorded every one of its `total` names then (else
    /// `None`: the names are not all known).
    pub fn names_within(
        &self,
        obj: ObjectId,
        seq: Seq,
        root: &[Vec<u8>],
        total: u32,
    ) -> Result<Option<u32>> {
        let mut alive: Vec<(ObjectId, Vec<u8>)> = Vec::new();
        for l in self.links(obj)? {
            if l.seq > seq {
                break;
            }
            let key = (l.parent, l.name);
            alive.retain(|k| *k != key);
            if l.bound {
                alive.push(key);
            }
        }
        if alive.len() != total as usize {
            return Ok(None);
        }
        let mut within = 0;
        for (parent, _) in alive {
            match self.path_at(parent, seq)? {
                Some(p) if p.starts_with(root) => within += 1,
                Some(_) => {}
                None => return Ok(None),
            }
        }
        Ok(Some(within))
    }

    /// The path of `obj` at `seq` as name components from the root.
    pub fn path_at(&self, obj: ObjectId, seq: Seq) -> Result<Option<Vec<Vec<u8>>>> {
        let mut parts = Vec::new();
        let mut cur = obj;
        for _ in 0..4096 {
            if cur == ROOT {
                parts.reverse();
                return Ok(Some(parts));
            }
            match self.name_at(cur, seq)? {
                Some((parent, name)) => {
                    parts.push(name);
                    cur = parent;
                }
                None => return Ok(None),
            }
        }
        Err(HistoryError::Corrupt("directory loop in history".into()))
    }

    /// A file version's manifest. Since store format 3 a manifest is a
    /// chunk (delta-encoded against the previous version's); format-2
    /// stores keep theirs in the `manifests` table, which is read first.
    pub fn manifest(&self, hash: &Hash) -> Result<Manifest> {
        // Content-addressed: one already readable is the one asked for.
        // Only a manifest of a change still queued waits for the queue
        // (a read of a clone's base applied it on the request thread).
        if let Some(m) = self.recent_manifest(hash)? {
            return Ok(m);
        }
        self.settle()?;
        let bytes = match tables::manifest_bytes(self.db(), hash)? {
            Some(b) => b,
            None => self.chunks().get(hash).map_err(|e| match e {
                crate::store::StoreError::MissingChunk(_) => {
                    HistoryError::Corrupt(format!("manifest {hash} is missing"))
                }
                other => other.into(),
            })?,
        };
        Manifest::decode(&bytes).ok_or_else(|| HistoryError::Corrupt("undecodable manifest".into()))
    }

    /// Bytes of the index file in use (allocated pages): the file itself
    /// grows in regions, so its size says little about what history costs.
    pub fn index_used_bytes(&self) -> Result<u64> {
        // Pages a commit frees are reusable only after a later durable
        // commit: two of them make the figure stable from call to call.
        self.sync_unless_full()?;
        self.sync_unless_full()?;
        let txn = self.db().begin_write().map_err(err)?;
        let stats = txn.stats().map_err(err)?;
        let used = stats.allocated_pages() * stats.page_size() as u64;
        txn.abort().map_err(err)?;
        Ok(used)
    }

    /// Counts for `status`.
    pub fn counts(&self) -> Result<Counts> {
        self.settle()?;
        let txn = read_txn(self.db())?;
        let len = |r: std::result::Result<u64, redb::StorageError>| r.map_err(err);
        let mut c = Counts::default();
        if let Ok(t) = txn.open_table(VERSIONS) {
            c.versions = len(t.len())?;
        }
        if let Ok(t) = txn.open_table(crate::store::chunks::CHUNKS) {
            c.chunks = len(t.len())?;
            for e in t.iter().map_err(err)? {
                let (_, v) = e.map_err(err)?;
                if let Some(loc) = crate::store::chunks::Location::decode(v.value()) {
                    c.chunk_raw_bytes += u64::from(loc.raw_len);
                    c.chunk_stored_bytes += u64::from(loc.stored_len);
                }
            }
        }
        if let Ok(t) = txn.open_table(SEQS) {
            c.changes = len(t.len())?;
        }
        if let Ok(t) = txn.open_table(TAGS) {
            c.tags = len(t.len())?;
        }
        Ok(c)
    }
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Counts {
    pub versions: u64,
    pub changes: u64,
    pub chunks: u64,
    pub chunk_raw_bytes: u64,
    pub chunk_stored_bytes: u64,
    pub tags: u64,
}

impl History {
    /// Every change of `name` in `dir`: (seq, child or removal), oldest first.
    pub fn name_history(&self, dir: ObjectId, name: &[u8]) -> Result<Vec<(Seq, Option<ObjectId>)>> {
        self.settle_for(&[dir])?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, DIRENTS, Vec::new());
        let lo = tables::dirent_key(dir, name, Seq::ZERO);
        let hi = tables::dirent_key(dir, name, Seq::MAX);
        let mut out = Vec::new();
        for e in t.range(lo.as_slice()..=hi.as_slice()).map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let (_, seq) = tables::split_dirent_key(k.value())
                .ok_or_else(|| HistoryError::Corrupt("malformed dirent key".into()))?;
            out.push((seq, tables::child(v.value())));
        }
        Ok(out)
    }

    /// The first version of `obj` if it is a baseline (valid back to the
    /// object's first appearance), with its sequence number.
    pub fn baseline_seq(&self, obj: ObjectId) -> Result<Option<Seq>> {
        self.settle()?;
        Ok(match self.versions_first(obj)? {
            Some((s, Cause::Baseline)) => Some(s),
            _ => None,
        })
    }

    /// Whether any version of `obj` exists.
    pub fn has_versions(&self, obj: ObjectId) -> Result<bool> {
        self.settle()?;
        Ok(self.versions_first(obj)?.is_some())
    }

    /// For the dedup ratio in `status`: the total logical size of all
    /// recorded file versions, and the raw bytes of their manifests'
    /// chunks (bookkeeping, not content: counted as content, they made a
    /// store of a few small files look worse than no dedup at all).
    pub fn logical_bytes(&self) -> Result<(u64, u64)> {
        self.settle()?;
        let txn = read_txn(self.db())?;
        let t = open_or_empty!(txn, VERSIONS, (0, 0));
        let mut total = 0u64;
        let mut manifests = std::collections::HashSet::new();
        for e in t.iter().map_err(err)? {
            let (_, v) = e.map_err(err)?;
            let v = tables::decode(v.value())?;
            // A removal's record repeats the content it ended.
            if let (Content::File { manifest }, false) = (v.content, v.gone) {
                total += v.attrs.size;
                manifests.insert(manifest);
            }
        }
        let chunks = open_or_empty!(txn, crate::store::chunks::CHUNKS, (total, 0));
        let mut manifest_bytes = 0u64;
        for m in &manifests {
            let loc = chunks.get(m.as_slice()).map_err(err)?;
            if let Some(loc) = loc.and_then(|l| crate::store::chunks::Location::decode(l.value())) {
                manifest_bytes += u64::from(loc.raw_len);
            }
        }
        Ok((total, manifest_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;

    #[test]
    fn instants_map_to_the_changes_made_by_then() {
        let k = kit();
        let h = &k.history;
        assert_eq!(h.bounds().unwrap(), None);
        let s1 = mkdir(h, ROOT, None);
        k.clock.advance(std::time::Duration::from_secs(3600));
        let s2 = write(h, o(10), Some((ROOT, b"f")), b"a");
        k.clock.advance(std::time::Duration::from_secs(3600));
        let s3 = write(h, o(10), None, b"b");
        // The clock did not move: times still strictly increase.
        let s4 = write(h, o(10), None, b"c");
        assert!(s1 < s2 && s2 < s3 && s3 < s4);
        assert_eq!(h.time_of_seq(s1).unwrap(), Some(T0));
        assert_eq!(h.time_of_seq(s2).unwrap(), Some(T0 + HOUR));
        assert_eq!(h.time_of_seq(s4).unwrap(), Some(T0 + 2 * HOUR + 1));
        assert_eq!(h.seq_at_time(T0 - 1).unwrap(), None);
        assert_eq!(h.seq_at_time(T0).unwrap(), Some(s1));
        assert_eq!(h.seq_at_time(T0 + HOUR + HOUR / 2).unwrap(), Some(s2));
        assert_eq!(h.seq_at_time(i64::MAX).unwrap(), Some(s4));
        assert_eq!(
            h.bounds().unwrap(),
            Some(((s1, T0), (s4, T0 + 2 * HOUR + 1)))
        );
    }

    /// A past question about objects no queued change touches is answered
    /// from the index as it stands; one about a touched object applies the
    /// queue first (a change's version, or an entry it names in a directory).
    #[test]
    fn a_query_settles_only_for_what_queued_changes_touch() {
        let k = kit();
        let h = &k.history;
        mkdir(h, ROOT, None);
        let s1 = write(h, o(10), Some((ROOT, b"f")), b"one");
        h.settle().unwrap();
        let s2 = write(h, o(11), Some((ROOT, b"g")), b"other");
        assert_eq!(h.object_at(o(10), s2).unwrap().map(|(s, _)| s), Some(s1));
        assert_eq!(h.versions(o(10), Seq::ZERO, s2).unwrap().len(), 1);
        assert_eq!(h.queued(), 1, "untouched objects need no apply");
        let found = h.lookup_at(ROOT, b"g", s2).unwrap();
        assert!(matches!(found, Lookup::Found(x) if x == o(11)), "{found:?}");
        assert_eq!(h.queued(), 0);
        let s3 = write(h, o(10), None, b"two");
        assert_eq!(h.object_at(o(10), s3).unwrap().map(|(s, _)| s), Some(s3));
        assert_eq!(h.queued(), 0);
        let s4 = write(h, o(12), Some((o(11), b"x")), b"");
        let _ = h.list_at(o(11), s4).unwrap();
        assert_eq!(h.queued(), 0, "a listing of a directory a change names in");
        let s5 = write(h, o(13), Some((ROOT, b"h")), b"");
        let _ = h.list_at(o(11), s5).unwrap();
        assert_eq!(h.queued(), 1, "a listing of a directory no change names");
        assert!(h.name_history(o(11), b"x").unwrap().len() == 1);
        assert_eq!(h.queued(), 1);
        assert!(h.names_ever(ROOT).unwrap().iter().any(|(n, ..)| n == b"h"));
        assert_eq!(h.queued(), 0);
    }

    #[test]
    fn log_and_object_at_answer_each_instant() {
        let k = kit();
        let h = &k.history;
        mkdir(h, ROOT, None);
        let s1 = write(h, o(10), Some((ROOT, b"f")), b"one");
        let s2 = write(h, o(10), None, b"two");
        let s3 = write(h, o(11), Some((ROOT, b"g")), b"other");
        let s4 = write(h, o(10), None, b"three");
        let log: Vec<(Seq, Vec<u8>)> = h
            .versions(o(10), Seq::ZERO, Seq::MAX)
            .unwrap()
            .into_iter()
            .map(|(s, v)| (s, read(h, &v)))
            .collect();
        assert_eq!(
            log,
            [
                (s1, b"one".to_vec()),
                (s2, b"two".to_vec()),
                (s4, b"three".to_vec())
            ]
        );
        assert_eq!(
            h.versions(o(10), s2, s3).unwrap().len(),
            1,
            "inclusive range"
        );
        assert_eq!(
            h.object_at(o(10), s1.prev()).unwrap(),
            None,
            "not yet recorded"
        );
        let at = |seq| {
            let (s, v) = h.object_at(o(10), seq).unwrap().unwrap();
            (s, read(h, &v))
        };
        assert_eq!(at(s3), (s2, b"two".to_vec()));
        assert_eq!(at(Seq::MAX), (s4, b"three".to_vec()));
        assert!(h.has_versions(o(10)).unwrap());
        assert!(!h.has_versions(o(12)).unwrap());
    }

    #[test]
    fn names_and_listings_at_an_instant() {
        let k = kit();
        let h = &k.history;
        assert_eq!(
            h.lookup_at(ROOT, b"f", sq(1)).unwrap(),
            Lookup::Live,
            "never recorded"
        );
        let s0 = mkdir(h, ROOT, None);
        let s1 = mkdir(h, o(20), Some((ROOT, b"d")));
        let s2 = write(h, o(10), Some((o(20), b"f")), b"x");
        let s3 = write(h, o(11), Some((ROOT, b"a")), b"y");
        let s4 = unlink(h, o(20), b"f", o(10));
        assert_eq!(h.list_at(ROOT, s0).unwrap(), Some(vec![]));
        assert_eq!(
            h.list_at(ROOT, s3).unwrap(),
            Some(vec![(b"a".to_vec(), o(11)), (b"d".to_vec(), o(20))]),
            "sorted by name"
        );
        assert_eq!(
            h.list_at(o(20), s2).unwrap(),
            Some(vec![(b"f".to_vec(), o(10))])
        );
        assert_eq!(h.list_at(o(20), s4).unwrap(), Some(vec![]));
        assert_eq!(h.lookup_at(o(20), b"f", s1).unwrap(), Lookup::Absent);
        assert_eq!(h.lookup_at(o(20), b"f", s3).unwrap(), Lookup::Found(o(10)));
        assert_eq!(h.lookup_at(o(20), b"f", s4).unwrap(), Lookup::Absent);
        assert_eq!(h.name_at(o(10), s2).unwrap(), Some((o(20), b"f".to_vec())));
        assert_eq!(
            h.path_at(o(10), s3).unwrap(),
            Some(vec![b"d".to_vec(), b"f".to_vec()])
        );
        assert_eq!(
            h.name_history(o(20), b"f").unwrap(),
            [(s2, Some(o(10))), (s4, None)]
        );
    }

    #[test]
    fn tags_name_instants() {
        let k = kit();
        let h = &k.history;
        let s1 = write(h, o(10), Some((ROOT, b"f")), b"x");
        let mut d = super::super::Draft::default();
        d.tags.push(("release".into(), Some(s1)));
        h.commit(d).unwrap();
        assert_eq!(h.tag("release").unwrap(), Some(s1));
        assert_eq!(h.tag("other").unwrap(), None);
        let mut d = super::super::Draft::default();
        d.tags.push(("release".into(), None));
        h.commit(d).unwrap();
        assert_eq!(h.tags().unwrap(), []);
    }
}
