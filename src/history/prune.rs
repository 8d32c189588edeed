//! Removing versions: retention (the cleaner and `chronofs prune`), the
//! expiry of deleted trees, and `chronofs purge`.
//!
//! Rules that keep every query exact after a prune:
//! - An object's newest version is never removed while the object lives:
//!   it is the state the store must always hold in full (the base of the
//!   next version, and the proof that the live file is unchanged). A
//!   deleted object goes whole or not at all.
//! - When an object's oldest versions go, the `pruned` table remembers
//!   it, and a query before its oldest kept version reads that version
//!   (as a query before a baseline does): the nearest state history still
//!   holds, never the live file and never "did not exist".
//! - A deleted object removed whole takes its directory entries with it;
//!   an entry whose binding also displaced an earlier child becomes a
//!   removal of that name, so the earlier child's history stays exact.
//! - Tags pin: the version each tag sees of each object is never removed
//!   (except by purge, which an administrator asks for by name).
//! - Only durably applied versions are removed, in durable commits, so a
//!   journal replay never brings a removed version back.

use redb::{ReadableTable, WriteTransaction};

use super::chain;
use super::model::*;
use super::tables::{self, AUDIT, DIRENTS, LINKS, PRUNED, TAGS, TAG_OWNERS, VERSIONS};
use super::{read_txn, History, HistoryError, Result};
use crate::store::index_error;

fn err(e: impl Into<redb::Error>) -> HistoryError {
    HistoryError::Store(index_error(e))
}

/// What to remove of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    /// These versions (never the newest, never a pinned one).
    Versions(Vec<Seq>),
    /// A deleted object and everything history has of it (its newest
    /// version must record its deletion).
    Whole,
}

/// How pins are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pins {
    /// Tagged versions stay (retention, prune).
    Respect,
    /// Purge: the administrator named the object; tags do not save it.
    Override,
}

#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct PruneOutcome {
    pub versions_removed: u64,
    pub objects_removed: u64,
    /// Asked for but kept (newest, pinned, or changed meanwhile).
    pub versions_spared: u64,
}

/// One object's versions, oldest first.
pub type Versions = Vec<(Seq, Version)>;

/// Which of `versions` (oldest first) the tags pin: for each tag, the
/// newest version at or before it; if none is, the oldest version when
/// it stands for the state then: a baseline stands for every earlier
/// state, and one that pruning made the oldest for those since
/// `pruned_from` ([`History::prefix_pruned`]: the object's creation, or
/// [`Seq::ZERO`]). A tag from before the object was created pins nothing
/// (it pinned the oldest kept version for good, and a later prune spared
/// it).
pub fn pinned(versions: &[(Seq, Version)], tags: &[Seq], pruned_from: Option<Seq>) -> Vec<bool> {
    let mut pins = vec![false; versions.len()];
    let stands_from = match versions.first() {
        Some((_, v)) if v.cause == Cause::Baseline => Some(Seq::ZERO),
        _ => pruned_from,
    };
    for &t in tags {
        match versions.iter().rposition(|(s, _)| *s <= t) {
            Some(i) => pins[i] = true,
            None if stands_from.is_some_and(|from| t >= from) && !pins.is_empty() => pins[0] = true,
            None => {}
        }
    }
    pins
}

/// Marks a `pruned` value as the sequence number where the object came
/// into history (its oldest version was not a baseline); without it
/// (older stores too) the oldest kept version stands for every earlier
/// state.
const CREATED_AT: u64 = 1 << 63;

/// The `pruned` value for an object whose oldest version `first` goes:
/// only a baseline stands for states before it (the object predates
/// history); any other first version is where the object came in.
fn pruned_value(first: &(Seq, Version)) -> u64 {
    match first.1.cause {
        Cause::Baseline => 0,
        _ => first.0.get() | CREATED_AT,
    }
}

/// What a `pruned` value says: since when the oldest kept version stands.
fn pruned_from(value: u64) -> Seq {
    match value & CREATED_AT {
        0 => Seq::ZERO,
        _ => Seq::new(value & !CREATED_AT),
    }
}

impl History {
    /// Every object's versions, oldest first, object by object (for the
    /// cleaner: work proportional to history, so never on a caller's
    /// system call). `f` returns false to stop.
    pub fn scan_objects(
        &self,
        f: &mut dyn FnMut(ObjectId, Versions) -> Result<bool>,
    ) -> Result<()> {
        self.settle()?;
        let txn = read_txn(self.db())?;
        let t = match txn.open_table(VERSIONS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(err(e)),
        };
        let mut cur: Option<(ObjectId, Versions)> = None;
        for e in t.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let (obj, seq) = split_version_key(k.value())?;
            let v = tables::decode(v.value())?;
            match &mut cur {
                Some((o, list)) if *o == obj => list.push((seq, v)),
                _ => {
                    if let Some((o, list)) = cur.take() {
                        if !f(o, list)? {
                            return Ok(());
                        }
                    }
                    cur = Some((obj, vec![(seq, v)]));
                }
            }
        }
        if let Some((o, list)) = cur {
            f(o, list)?;
        }
        Ok(())
    }

    /// Whether `obj` has had its oldest versions pruned.
    pub fn prefix_pruned(&self, obj: ObjectId) -> Result<Option<Seq>> {
        let txn = read_txn(self.db())?;
        let t = match txn.open_table(PRUNED) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        Ok(t.get(obj.get())
            .map_err(err)?
            .map(|v| pruned_from(v.value())))
    }

    /// Records an administrative act in the audit log (durably).
    pub fn audit(&self, record: &serde_json::Value) -> Result<()> {
        let txn = self.db().begin_write().map_err(err)?;
        tables::audit_put(&txn, record)?;
        txn.commit().map_err(err)?;
        Ok(())
    }

    /// Records who made tag `name` (`None`: forget it), so that they may
    /// remove it again.
    pub fn set_tag_owner(&self, name: &str, uid: Option<u32>) -> Result<()> {
        let txn = self.db().begin_write().map_err(err)?;
        {
            let mut t = txn.open_table(TAG_OWNERS).map_err(err)?;
            match uid {
                Some(u) => t.insert(name, u).map_err(err)?,
                None => t.remove(name).map_err(err)?,
            };
        }
        txn.commit().map_err(err)?;
        Ok(())
    }

    /// Who made tag `name`, if known.
    pub fn tag_owner(&self, name: &str) -> Result<Option<u32>> {
        let txn = read_txn(self.db())?;
        let t = match txn.open_table(TAG_OWNERS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        Ok(t.get(name).map_err(err)?.map(|v| v.value()))
    }

    /// The audit log, oldest first.
    pub fn audit_log(&self) -> Result<Vec<(u64, serde_json::Value)>> {
        let txn = read_txn(self.db())?;
        let t = match txn.open_table(AUDIT) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(err(e)),
        };
        let mut out = Vec::new();
        for e in t.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let record = serde_json::from_slice(v.value())
                .map_err(|e| HistoryError::Corrupt(format!("audit record: {e}")))?;
            out.push((k.value(), record));
        }
        Ok(out)
    }

    /// Tag sequence numbers.
    pub fn tag_seqs(&self) -> Result<Vec<Seq>> {
        Ok(self.tags()?.into_iter().map(|(_, s)| s).collect())
    }

    /// Removes what `plan` says, in durable commits, re-checking every
    /// rule against the index as it is now; `audit` is recorded in the
    /// same commit as the first batch.
    pub fn prune(
        &self,
        plan: &[(ObjectId, Removal)],
        pins: Pins,
        audit: Option<serde_json::Value>,
    ) -> Result<PruneOutcome> {
        let out = self.prune_locked(plan, pins, audit)?;
        if out.objects_removed + out.versions_removed > 0 {
            self.removed();
        }
        Ok(out)
    }

    fn prune_locked(
        &self,
        plan: &[(ObjectId, Removal)],
        pins: Pins,
        audit: Option<serde_json::Value>,
    ) -> Result<PruneOutcome> {
        let _one = self.maintenance.lock();
        self.sync()?;
        let mut out = PruneOutcome::default();
        let mut audit = audit;
        for batch in plan.chunks(2000) {
            let txn = self.maintenance_txn()?;
            let tags: Vec<Seq> = {
                let t = txn.open_table(TAGS).map_err(err)?;
                let mut v = Vec::new();
                for e in t.iter().map_err(err)? {
                    v.push(Seq::new(e.map_err(err)?.1.value()));
                }
                v
            };
            for (obj, removal) in batch {
                self.prune_one(&txn, *obj, removal, pins, &tags, &mut out)?;
            }
            if let Some(record) = audit.take() {
                tables::audit_put(&txn, &record)?;
            }
            txn.commit()?;
        }
        if let Some(record) = audit {
            // An empty plan is still an act worth recording.
            self.audit(&record)?;
        }
        Ok(out)
    }

    fn prune_one(
        &self,
        txn: &WriteTransaction,
        obj: ObjectId,
        removal: &Removal,
        pins: Pins,
        tags: &[Seq],
        out: &mut PruneOutcome,
    ) -> Result<()> {
        let versions = versions_in(txn, obj)?;
        let Some((newest, last)) = versions.last().map(|(s, v)| (*s, v.gone)) else {
            return Ok(());
        };
        let marked = txn
            .open_table(PRUNED)
            .map_err(err)?
            .get(obj.get())
            .map_err(err)?
            .map(|v| pruned_from(v.value()));
        let pin = match pins {
            Pins::Respect => pinned(&versions, tags, marked),
            Pins::Override => vec![false; versions.len()],
        };
        match removal {
            Removal::Whole if last && !pin.iter().any(|p| *p) => {
                remove_whole(txn, obj, &versions)?;
                out.objects_removed += 1;
                out.versions_removed += versions.len() as u64;
            }
            Removal::Whole => out.versions_spared += versions.len() as u64,
            Removal::Versions(seqs) => {
                let mut table = txn.open_table(VERSIONS).map_err(err)?;
                let oldest = versions[0].0;
                let mut lowest_removed = None;
                for s in seqs {
                    let idx = versions.iter().position(|(vs, _)| vs == s);
                    let removable = idx.is_some_and(|i| !pin[i]) && *s != newest;
                    if !removable {
                        out.versions_spared += 1;
                        continue;
                    }
                    let key = tables::version_key(obj, *s);
                    if let Some(old) = table.remove(key.as_slice()).map_err(err)? {
                        chain::retire(txn, *s, &chain::version_record(&key, old.value()))?;
                    }
                    out.versions_removed += 1;
                    lowest_removed = Some(lowest_removed.map_or(*s, |l: Seq| l.min(*s)));
                }
                if lowest_removed == Some(oldest) {
                    // The first prune of the oldest version says it all:
                    // later ones only remove younger versions.
                    let mut p = txn.open_table(PRUNED).map_err(err)?;
                    if p.get(obj.get()).map_err(err)?.is_none() {
                        p.insert(obj.get(), pruned_value(&versions[0]))
                            .map_err(err)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn split_version_key(k: &[u8]) -> Result<(ObjectId, Seq)> {
    let bad = || HistoryError::Corrupt("malformed version key".into());
    let obj = ObjectId::from_be_bytes(k.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(bad)?);
    let seq = Seq::from_be_bytes(
        k.get(8..16)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(bad)?,
    );
    Ok((obj, seq))
}

fn versions_in(txn: &WriteTransaction, obj: ObjectId) -> Result<Versions> {
    let t = txn.open_table(VERSIONS).map_err(err)?;
    let lo = tables::version_key(obj, Seq::ZERO);
    let hi = tables::version_key(obj, Seq::MAX);
    let mut out = Vec::new();
    for e in t.range(lo.as_slice()..=hi.as_slice()).map_err(err)? {
        let (k, v) = e.map_err(err)?;
        out.push((split_version_key(k.value())?.1, tables::decode(v.value())?));
    }
    Ok(out)
}

/// Removes a deleted object: its versions, its marker, its names, and (for
/// a directory) the entries recorded in it.
fn remove_whole(txn: &WriteTransaction, obj: ObjectId, versions: &Versions) -> Result<()> {
    {
        let mut t = txn.open_table(VERSIONS).map_err(err)?;
        for (s, _) in versions {
            let key = tables::version_key(obj, *s);
            if let Some(old) = t.remove(key.as_slice()).map_err(err)? {
                chain::retire(txn, *s, &chain::version_record(&key, old.value()))?;
            }
        }
    }
    txn.open_table(PRUNED)
        .map_err(err)?
        .remove(obj.get())
        .map_err(err)?;
    let mut links = txn.open_table(LINKS).map_err(err)?;
    let mut dirents = txn.open_table(DIRENTS).map_err(err)?;
    let mut own = Vec::new();
    for e in links
        .range(obj.to_be_bytes().as_slice()..(obj.get() + 1).to_be_bytes().as_slice())
        .map_err(err)?
    {
        let (k, v) = e.map_err(err)?;
        own.push((k.value().to_vec(), v.value()));
    }
    for (key, bound) in own {
        let (seq, parent, name) = tables::split_link_key(&key)
            .ok_or_else(|| HistoryError::Corrupt("malformed link key".into()))?;
        let dkey = tables::dirent_key(parent, name, seq);
        let here = dirents
            .get(dkey.as_slice())
            .map_err(err)?
            .map(|v| v.value());
        let ours = if bound == 1 {
            here == Some(obj.get())
        } else {
            here == Some(0)
        };
        if let (true, Some(value)) = (ours, here) {
            chain::retire(txn, seq, &chain::dirent_record(&dkey, value))?;
            let displaced = bound == 1 && previous_binding(&dirents, parent, name, seq)?;
            if displaced {
                dirents.insert(dkey.as_slice(), 0).map_err(err)?;
                chain::amend(txn, seq, &chain::dirent_record(&dkey, 0))?;
            } else {
                dirents.remove(dkey.as_slice()).map_err(err)?;
            }
        }
        links.remove(key.as_slice()).map_err(err)?;
    }
    if versions
        .iter()
        .any(|(_, v)| v.attrs.mode & libc::S_IFMT == libc::S_IFDIR)
    {
        let lo = obj.to_be_bytes();
        let hi = (obj.get() + 1).to_be_bytes();
        let mut inside = Vec::new();
        for e in dirents.range(lo.as_slice()..hi.as_slice()).map_err(err)? {
            let (k, v) = e.map_err(err)?;
            inside.push((k.value().to_vec(), v.value()));
        }
        for (k, child) in inside {
            dirents.remove(k.as_slice()).map_err(err)?;
            if let Some((_, seq)) = tables::split_dirent_key(&k) {
                chain::retire(txn, seq, &chain::dirent_record(&k, child))?;
            }
            if let Some((name, seq)) = tables::split_dirent_key(&k) {
                if let Some(child) = tables::child(child) {
                    let lk = tables::link_key(child, seq, obj, name);
                    links.remove(lk.as_slice()).map_err(err)?;
                }
            }
        }
    }
    Ok(())
}

/// Whether the entry just before `seq` for `name` in `parent` bound a
/// child (which a binding at `seq` then displaced).
fn previous_binding(
    dirents: &redb::Table<&[u8], u64>,
    parent: ObjectId,
    name: &[u8],
    seq: Seq,
) -> Result<bool> {
    let lo = tables::dirent_key(parent, name, Seq::ZERO);
    let hi = tables::dirent_key(parent, name, seq);
    let mut r = dirents.range(lo.as_slice()..hi.as_slice()).map_err(err)?;
    Ok(match r.next_back() {
        Some(e) => e.map_err(err)?.1.value() != 0,
        None => false,
    })
}

#[cfg(test)]
mod tests {
    use super::super::query::Lookup;
    use super::super::testkit::*;
    use super::*;

    fn seqs(h: &History, obj: ObjectId) -> Vec<Seq> {
        h.versions(obj, Seq::ZERO, Seq::MAX)
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect()
    }

    fn tag(h: &History, name: &str, at: Seq) {
        let mut d = super::super::Draft::default();
        d.tags.push((name.into(), Some(at)));
        h.commit(d).unwrap();
    }

    fn v(cause: Cause) -> (Seq, Version) {
        (
            Seq::ZERO,
            version(libc::S_IFREG | 0o644, 0, Content::Special, cause),
        )
    }

    #[test]
    fn a_tag_pins_the_newest_version_at_or_before_it() {
        let versions: Vec<(Seq, Version)> =
            [(3, Cause::Create), (5, Cause::Write), (9, Cause::Write)]
                .into_iter()
                .map(|(s, c)| (sq(s), v(c).1))
                .collect();
        assert_eq!(pinned(&versions, &[], None), [false, false, false]);
        assert_eq!(pinned(&versions, &[sq(5)], None), [false, true, false]);
        assert_eq!(pinned(&versions, &[sq(8)], None), [false, true, false]);
        assert_eq!(
            pinned(&versions, &[sq(4), sq(100)], None),
            [true, false, true]
        );
        // Before the first version: nothing, unless it stands for earlier
        // states (a baseline, or pruning made it the oldest), and never
        // before the object was created.
        assert_eq!(pinned(&versions, &[sq(1)], None), [false, false, false]);
        assert_eq!(
            pinned(&versions, &[sq(1)], Some(Seq::ZERO)),
            [true, false, false]
        );
        assert_eq!(
            pinned(&versions, &[sq(1)], Some(sq(2))),
            [false, false, false]
        );
        assert_eq!(
            pinned(&versions, &[sq(2)], Some(sq(2))),
            [true, false, false]
        );
        let mut baseline = versions.clone();
        baseline[0].1.cause = Cause::Baseline;
        assert_eq!(pinned(&baseline, &[sq(1)], None), [true, false, false]);
    }

    #[test]
    fn prune_spares_the_newest_and_tagged_versions() {
        let k = kit();
        let h = &k.history;
        let s: Vec<Seq> = (0..4)
            .map(|i| {
                let named = (i == 0).then_some((ROOT, &b"f"[..]));
                write(h, o(10), named, format!("v{i}").as_bytes())
            })
            .collect();
        tag(h, "keep", s[1]);
        let out = h
            .prune(
                &[(o(10), Removal::Versions(s.clone()))],
                Pins::Respect,
                None,
            )
            .unwrap();
        assert_eq!(out.versions_removed, 2);
        assert_eq!(out.versions_spared, 2);
        assert_eq!(seqs(h, o(10)), [s[1], s[3]]);
        // A query before the oldest kept version reads it (the nearest
        // state history holds), not "did not exist".
        assert!(h.prefix_pruned(o(10)).unwrap().is_some());
        let (at, old) = h.object_at(o(10), s[0]).unwrap().unwrap();
        assert_eq!((at, read(h, &old)), (s[1], b"v1".to_vec()));
        // Purge overrides tags, never the newest of a live object.
        let out = h
            .prune(
                &[(o(10), Removal::Versions(s.clone()))],
                Pins::Override,
                None,
            )
            .unwrap();
        assert_eq!(out.versions_removed, 1);
        assert_eq!(seqs(h, o(10)), [s[3]]);
    }

    #[test]
    fn an_object_goes_whole_only_once_deleted() {
        let k = kit();
        let h = &k.history;
        mkdir(h, ROOT, None);
        let s1 = write(h, o(10), Some((ROOT, b"f")), b"one");
        write(h, o(10), None, b"two");
        write(h, o(11), Some((ROOT, b"g")), b"other");
        let out = h
            .prune(&[(o(10), Removal::Whole)], Pins::Respect, None)
            .unwrap();
        assert_eq!(
            out.objects_removed, 0,
            "a live object is never removed whole"
        );
        assert_eq!(seqs(h, o(10)).len(), 2);

        let gone = unlink(h, ROOT, b"f", o(10));
        assert_eq!(h.lookup_at(ROOT, b"f", s1).unwrap(), Lookup::Found(o(10)));
        let out = h
            .prune(&[(o(10), Removal::Whole)], Pins::Respect, None)
            .unwrap();
        assert_eq!(out.objects_removed, 1);
        assert_eq!(out.versions_removed, 3);
        assert!(seqs(h, o(10)).is_empty());
        // Its names went with it; the other file is untouched.
        assert_eq!(h.lookup_at(ROOT, b"f", s1).unwrap(), Lookup::Absent);
        assert_eq!(h.lookup_at(ROOT, b"f", gone).unwrap(), Lookup::Absent);
        assert_eq!(h.lookup_at(ROOT, b"g", gone).unwrap(), Lookup::Found(o(11)));
        let report = super::super::chain::verify(h.db()).unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }
}
