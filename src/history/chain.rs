//! Tamper evidence: every applied change extends a hash chain over the
//! records it wrote, so `fsck` finds history records altered, removed or
//! added by editing the store files behind chronofs's back.
//!
//! `chain[seq] = BLAKE3(chain[previous seq] ‖ seq ‖ digest)`, where
//! `digest` is the BLAKE3 of the sorted hashes of the op's version and
//! directory-entry records. Retention removes records legitimately: it
//! notes each removed record's hash in `retired`, and each record it
//! rewrote in `amended`, so fsck can still recompute every op's digest.
//! Keyless hashing detects edits that do not rebuild the whole chain; the
//! chain head (`chronofs status`, and every audit record) is what an
//! administrator keeps elsewhere to detect even that. Tags and the
//! inode map are not covered.

use std::collections::{BTreeMap, HashMap};

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use super::tables::{DIRENTS, VERSIONS};
use super::{read_txn, HistoryError, Result, Seq};
use crate::store::{index_error, Hash, Index};

/// seq → chain hash after that op.
pub const CHAIN: TableDefinition<u64, &[u8]> = TableDefinition::new("chain");
/// seq ‖ record hash → 1: records of that op removed by retention.
pub const RETIRED: TableDefinition<&[u8], u8> = TableDefinition::new("chain_retired");
/// seq ‖ record hash → 1: records retention rewrote (not part of the op).
pub const AMENDED: TableDefinition<&[u8], u8> = TableDefinition::new("chain_amended");

/// key seq ‖ record hash → seq of the op whose digest holds it: a
/// backdated directory entry (`Op::backdated`), keyed at the earlier
/// instant it took effect at, but recorded, and chained, by a later op.
pub const MOVED: TableDefinition<&[u8], u64> = TableDefinition::new("chain_moved");

fn err(e: impl Into<redb::Error>) -> HistoryError {
    HistoryError::Store(index_error(e))
}

pub fn version_record(key: &[u8], value: &[u8]) -> Hash {
    record(b'v', key, value)
}

pub fn dirent_record(key: &[u8], child: u64) -> Hash {
    record(b'd', key, &child.to_be_bytes())
}

fn record(kind: u8, key: &[u8], value: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(&[kind]);
    h.update(&(key.len() as u64).to_be_bytes());
    h.update(key);
    h.update(value);
    Hash::from_bytes(*h.finalize().as_bytes())
}

fn digest(mut records: Vec<Hash>) -> Hash {
    records.sort_unstable();
    let mut h = blake3::Hasher::new();
    for r in &records {
        h.update(r.as_slice());
    }
    Hash::from_bytes(*h.finalize().as_bytes())
}

fn link(prev: &Hash, seq: u64, digest: &Hash) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(prev.as_slice());
    h.update(&seq.to_be_bytes());
    h.update(digest.as_slice());
    Hash::from_bytes(*h.finalize().as_bytes())
}

fn to_hash(bytes: &[u8]) -> Result<Hash> {
    Hash::from_slice(bytes)
        .ok_or_else(|| HistoryError::Corrupt("malformed hash-chain entry".into()))
}

/// Extends the chain with op `seq`, whose records hash to `records`.
/// Idempotent: replaying an op recomputes the same entry.
pub fn extend(txn: &WriteTransaction, seq: Seq, records: Vec<Hash>) -> Result<()> {
    // The chain table is keyed by the bare number.
    let seq = seq.get();
    let mut t = txn.open_table(CHAIN).map_err(err)?;
    let prev = match t.range(..seq).map_err(err)?.next_back() {
        Some(e) => to_hash(e.map_err(err)?.1.value())?,
        None => Hash::default(),
    };
    let value = link(&prev, seq, &digest(records));
    t.insert(seq, value.as_slice()).map_err(err)?;
    Ok(())
}

fn note(table: &mut Table<&[u8], u8>, seq: u64, record: &Hash) -> Result<()> {
    let mut key = seq.to_be_bytes().to_vec();
    key.extend_from_slice(record.as_slice());
    table.insert(key.as_slice(), 1).map_err(err)?;
    Ok(())
}

/// The record keyed at `at` belongs to op `op`'s digest.
pub fn moved(txn: &WriteTransaction, at: Seq, record: &Hash, op: Seq) -> Result<()> {
    let mut key = at.get().to_be_bytes().to_vec();
    key.extend_from_slice(record.as_slice());
    let mut t = txn.open_table(MOVED).map_err(err)?;
    t.insert(key.as_slice(), op.get()).map_err(err)?;
    Ok(())
}

/// Hands each moved record, present or retired, from the op its key
/// names to the op that recorded it.
fn apply_moves(txn: &redb::ReadTransaction, groups: [&mut BySeq; 2]) -> Result<()> {
    let t = match txn.open_table(MOVED) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    let [present, retired] = groups;
    for e in t.iter().map_err(err)? {
        let (k, v) = e.map_err(err)?;
        let k = k.value();
        if k.len() != 40 {
            return Err(HistoryError::Corrupt("malformed hash-chain move".into()));
        }
        let at = u64::from_be_bytes(k[..8].try_into().unwrap_or_default());
        let record = to_hash(&k[8..])?;
        for group in [&mut *present, &mut *retired] {
            let Some(held) = group.get_mut(&at) else {
                continue;
            };
            if let Some(i) = held.iter().position(|r| *r == record) {
                held.swap_remove(i);
                if held.is_empty() {
                    group.remove(&at);
                }
                group.entry(v.value()).or_default().push(record);
            }
        }
    }
    Ok(())
}

/// Retention removed a record of op `seq`.
pub fn retire(txn: &WriteTransaction, seq: Seq, record: &Hash) -> Result<()> {
    // The chain table is keyed by the bare number.
    let seq = seq.get();
    note(&mut txn.open_table(RETIRED).map_err(err)?, seq, record)
}

/// Retention wrote a record under op `seq` that the op did not have.
pub fn amend(txn: &WriteTransaction, seq: Seq, record: &Hash) -> Result<()> {
    // The chain table is keyed by the bare number.
    let seq = seq.get();
    note(&mut txn.open_table(AMENDED).map_err(err)?, seq, record)
}

/// The newest chain entry: (seq, hash hex).
pub fn head(db: &Index) -> Result<Option<(u64, String)>> {
    let txn = read_txn(db)?;
    let t = match txn.open_table(CHAIN) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let last = t.last().map_err(err)?;
    Ok(match last {
        Some((k, v)) => Some((k.value(), to_hash(v.value())?.to_string())),
        None => None,
    })
}

type BySeq = BTreeMap<u64, Vec<Hash>>;

fn notes(txn: &redb::ReadTransaction, def: TableDefinition<&[u8], u8>) -> Result<BySeq> {
    let mut out = BySeq::new();
    let t = match txn.open_table(def) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(out),
        Err(e) => return Err(err(e)),
    };
    for e in t.iter().map_err(err)? {
        let (k, _) = e.map_err(err)?;
        let k = k.value();
        if k.len() != 40 {
            return Err(HistoryError::Corrupt("malformed hash-chain note".into()));
        }
        let seq = u64::from_be_bytes(k[..8].try_into().unwrap_or_default());
        out.entry(seq).or_default().push(to_hash(&k[8..])?);
    }
    Ok(out)
}

/// The record hashes present in the index, by op.
fn present(txn: &redb::ReadTransaction) -> Result<BySeq> {
    let mut out = BySeq::new();
    if let Ok(t) = txn.open_table(VERSIONS) {
        for e in t.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let seq = k
                .value()
                .get(8..16)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| HistoryError::Corrupt("malformed version key".into()))?;
            out.entry(seq)
                .or_default()
                .push(version_record(k.value(), v.value()));
        }
    }
    if let Ok(t) = txn.open_table(DIRENTS) {
        for e in t.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let key = k.value();
            let seq = key
                .get(key.len().saturating_sub(8)..)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| HistoryError::Corrupt("malformed dirent key".into()))?;
            out.entry(seq)
                .or_default()
                .push(dirent_record(key, v.value()));
        }
    }
    Ok(out)
}

/// What `verify` found.
#[derive(Debug, Default)]
pub struct ChainReport {
    /// Ops covered by the chain.
    pub ops: u64,
    /// Ops recorded before the chain existed (store format < 4).
    pub unchained_ops: u64,
    pub head: Option<(u64, String)>,
    pub problems: Vec<String>,
}

/// Recomputes every op's digest from the records present and walks the
/// chain.
pub fn verify(db: &Index) -> Result<ChainReport> {
    let txn = read_txn(db)?;
    let mut report = ChainReport::default();
    let chain = match txn.open_table(CHAIN) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(report),
        Err(e) => return Err(err(e)),
    };
    let mut present = present(&txn)?;
    let mut retired = notes(&txn, RETIRED)?;
    apply_moves(&txn, [&mut present, &mut retired])?;
    let amended = notes(&txn, AMENDED)?;
    let first = chain.first().map_err(err)?.map(|(k, _)| k.value());
    let mut prev = Hash::default();
    for e in chain.iter().map_err(err)? {
        let (k, v) = e.map_err(err)?;
        let seq = k.value();
        let stored = to_hash(v.value())?;
        let mut records = present.remove(&seq).unwrap_or_default();
        if let Some(extra) = amended.get(&seq) {
            for a in extra {
                if let Some(i) = records.iter().position(|r| r == a) {
                    records.swap_remove(i);
                }
            }
        }
        records.extend(retired.get(&seq).into_iter().flatten().copied());
        if link(&prev, seq, &digest(records)) != stored {
            report.problems.push(format!(
                "hash chain: the records of change #{seq} (or the chain before it) were altered"
            ));
        }
        prev = stored;
        report.ops += 1;
        report.head = Some((seq, stored.to_string()));
    }
    let mut counted: HashMap<u64, ()> = HashMap::new();
    for seq in present.keys() {
        match first {
            Some(f) if *seq >= f => report.problems.push(format!(
                "hash chain: records of change #{seq} are not in the chain (added behind chronofs's back)"
            )),
            _ => {
                counted.insert(*seq, ());
            }
        }
    }
    report.unchained_ops = counted.len() as u64;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::super::prune::{Pins, Removal};
    use super::super::testkit::*;
    use super::super::ROOT;
    use super::*;

    fn problems(h: &super::super::History) -> Vec<String> {
        h.settle().unwrap();
        verify(h.db()).unwrap().problems
    }

    #[test]
    fn each_change_extends_the_chain_and_verifies() {
        let k = kit();
        let h = &k.history;
        assert_eq!(head(h.db()).unwrap(), None);
        let s1 = write(h, o(10), Some((ROOT, b"f")), b"one");
        h.settle().unwrap();
        let first = head(h.db()).unwrap().unwrap();
        assert_eq!(first.0, s1.get());
        let s2 = write(h, o(10), None, b"two");
        h.settle().unwrap();
        let second = head(h.db()).unwrap().unwrap();
        assert_eq!(second.0, s2.get());
        assert_ne!(first.1, second.1);
        let report = verify(h.db()).unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert_eq!(report.ops, 2);
        assert_eq!(report.head, Some(second));
    }

    #[test]
    fn links_depend_on_order_and_on_every_record() {
        let (a, b) = (Hash::from_bytes([1; 32]), Hash::from_bytes([2; 32]));
        let (zero, nine) = (Hash::from_bytes([0; 32]), Hash::from_bytes([9; 32]));
        assert_eq!(digest(vec![a, b]), digest(vec![b, a]), "records are a set");
        assert_ne!(digest(vec![a]), digest(vec![a, b]));
        let d = digest(vec![a]);
        assert_ne!(link(&zero, 1, &d), link(&zero, 2, &d));
        assert_ne!(link(&zero, 1, &d), link(&nine, 1, &d));
        assert_ne!(version_record(b"k", b"v"), dirent_record(b"k", 0));
        // The key's length is hashed: moving a byte between key and value
        // is a different record.
        assert_ne!(version_record(b"ab", b"c"), version_record(b"a", b"bc"));
    }

    #[test]
    fn an_edit_behind_chronofs_back_is_found() {
        let k = kit();
        let h = &k.history;
        write(h, o(10), Some((ROOT, b"f")), b"one");
        let s2 = write(h, o(10), None, b"two");
        write(h, o(10), None, b"three");
        assert!(problems(h).is_empty());
        // Rewrite version s2's record in place (its attributes, say).
        let key = super::super::tables::version_key(o(10), s2);
        let txn = h.db().begin_write().unwrap();
        {
            let mut t = txn.open_table(VERSIONS).unwrap();
            let mut v =
                super::super::tables::decode(t.get(key.as_slice()).unwrap().unwrap().value())
                    .unwrap();
            v.attrs.mode = libc::S_IFREG | 0o4755;
            let bytes = super::super::model::encode_version(&v);
            t.insert(key.as_slice(), bytes.as_slice()).unwrap();
        }
        txn.commit().unwrap();
        let found = problems(h);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains(&format!("#{s2}")), "{found:?}");
    }

    #[test]
    fn a_record_added_behind_chronofs_back_is_found() {
        let k = kit();
        let h = &k.history;
        write(h, o(10), Some((ROOT, b"f")), b"one");
        assert!(problems(h).is_empty());
        let forged = version(
            libc::S_IFREG | 0o644,
            0,
            super::super::Content::Special,
            super::super::Cause::Write,
        );
        let key = super::super::tables::version_key(o(10), sq(999));
        let txn = h.db().begin_write().unwrap();
        {
            let mut t = txn.open_table(VERSIONS).unwrap();
            let bytes = super::super::model::encode_version(&forged);
            t.insert(key.as_slice(), bytes.as_slice()).unwrap();
        }
        txn.commit().unwrap();
        let found = problems(h);
        assert!(
            found
                .iter()
                .any(|p| p.contains("#999") && p.contains("not in the chain")),
            "{found:?}"
        );
    }

    /// An entry a branch change explains, recorded later and keyed at the
    /// change: every view from the change on shows it, none before; the
    /// chain still verifies, also once retention removed it.
    #[test]
    fn a_backdated_entry_shows_from_its_instant_and_verifies() {
        use super::super::{Backdated, Dirent, Draft};
        let k = kit();
        let h = &k.history;
        let names = |s: Seq| -> Vec<Vec<u8>> {
            let l = h.list_at(o(2), s).unwrap().unwrap();
            l.into_iter().map(|(n, _)| n).collect()
        };
        mkdir(h, o(2), Some((ROOT, b"d")));
        let before = write(h, o(10), Some((o(2), b"a")), b"a");
        let change = h.commit(Draft::default()).unwrap();
        let between = write(h, o(11), Some((ROOT, b"other")), b"x");
        let late = write(h, o(12), None, b"b");
        let mut d = Draft::default();
        d.backdated.push(Backdated {
            dirent: Dirent {
                parent: o(2),
                name: b"b".to_vec(),
                child: Some(o(12)),
            },
            at: change,
        });
        let recorded = h.commit(d).unwrap();
        assert_eq!(
            h.current_dirent_seq(o(2), b"b").unwrap(),
            Some((Some(o(12)), change))
        );
        h.settle().unwrap();
        assert_eq!(
            h.current_dirent_seq(o(2), b"b").unwrap(),
            Some((Some(o(12)), change))
        );
        assert_eq!(names(before), [b"a".to_vec()]);
        for s in [change, between, late, recorded] {
            assert_eq!(names(s), [b"a".to_vec(), b"b".to_vec()], "at #{s}");
        }
        assert_eq!(
            h.name_at(o(12), between).unwrap(),
            Some((o(2), b"b".to_vec()))
        );
        assert!(problems(h).is_empty(), "{:?}", problems(h));
        // Retention removes the object whole, its backdated name with it.
        super::super::testkit::unlink(h, o(2), b"b", o(12));
        h.prune(&[(o(12), Removal::Whole)], Pins::Respect, None)
            .unwrap();
        assert_eq!(names(between), [b"a".to_vec()]);
        assert!(problems(h).is_empty(), "{:?}", problems(h));
    }

    /// An entry backdated past a newer one of its name (recorded between
    /// its maker's look and its commit) goes in as of now instead.
    #[test]
    fn a_backdated_entry_never_goes_below_a_newer_one() {
        use super::super::{Backdated, Dirent, Draft};
        let k = kit();
        let h = &k.history;
        mkdir(h, o(2), Some((ROOT, b"d")));
        let change = h.commit(Draft::default()).unwrap();
        let removed = super::super::testkit::unlink(h, o(2), b"n", o(12));
        let mut d = Draft::default();
        d.backdated.push(Backdated {
            dirent: Dirent {
                parent: o(2),
                name: b"n".to_vec(),
                child: Some(o(13)),
            },
            at: change,
        });
        let late = h.commit(d).unwrap();
        assert_eq!(
            h.current_dirent_seq(o(2), b"n").unwrap(),
            Some((Some(o(13)), late))
        );
        h.settle().unwrap();
        assert_eq!(
            h.current_dirent_seq(o(2), b"n").unwrap(),
            Some((Some(o(13)), late))
        );
        let at = |s: Seq| h.lookup_at(o(2), b"n", s).unwrap();
        assert!(matches!(at(removed), super::super::query::Lookup::Absent));
        assert!(matches!(at(late), super::super::query::Lookup::Found(x) if x == o(13)));
        assert!(problems(h).is_empty(), "{:?}", problems(h));
    }

    #[test]
    fn pruning_is_not_tampering() {
        let k = kit();
        let h = &k.history;
        let s1 = write(h, o(10), Some((ROOT, b"f")), b"one");
        let s2 = write(h, o(10), None, b"two");
        write(h, o(10), None, b"three");
        let out = h
            .prune(
                &[(o(10), Removal::Versions(vec![s1, s2]))],
                Pins::Respect,
                None,
            )
            .unwrap();
        assert_eq!(out.versions_removed, 2);
        assert!(problems(h).is_empty(), "{:?}", problems(h));
    }
}
