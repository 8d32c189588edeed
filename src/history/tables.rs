//! The history tables and their key layouts (see docs/FORMAT.md). All
//! integers in keys are big-endian so keys sort numerically; names end with
//! a 0 byte (never part of a file name) so a name sorts before its
//! extensions and a name's entries stay contiguous.

use redb::{Durability, ReadableTable, TableDefinition, WriteTransaction};

use std::collections::HashMap;

use crate::store::{BackingKey, Index};

use super::model::*;
use super::{read_txn, HistoryError, Result};
use crate::store::{self, index_error, inomap, META};

/// object ‖ seq → encoded `Version`.
pub const VERSIONS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("versions");
/// parent ‖ name ‖ 0 ‖ seq → child object (0 = the name was removed).
pub const DIRENTS: TableDefinition<&[u8], u64> = TableDefinition::new("dirents");
/// child ‖ seq ‖ parent ‖ name → 1 if the name was bound to the child at
/// seq, 0 if it was removed: where an object has been, for its paths.
pub const LINKS: TableDefinition<&[u8], u8> = TableDefinition::new("links");
/// manifest hash → encoded `Manifest`.
pub const MANIFESTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("manifests");
/// seq → time (ns since the epoch).
pub const SEQS: TableDefinition<u64, i64> = TableDefinition::new("seqs");
/// time (ns) → seq; times never decrease with seq. Changes of one instant
/// (`History::one_instant`) share a time, which maps to the last of them.
pub const TIMES: TableDefinition<i64, u64> = TableDefinition::new("times");
/// tag name → seq.
pub const TAGS: TableDefinition<&str, u64> = TableDefinition::new("tags");
/// tag name → uid of the user who made it (store format 5, written
/// beside the tag, not journaled: a tag without an owner is root's).
pub const TAG_OWNERS: TableDefinition<&str, u32> = TableDefinition::new("tag_owners");
/// template name → format byte ‖ postcard path components (written
/// beside the template's tag, not journaled; see `templates`).
pub const TEMPLATES: TableDefinition<&str, &[u8]> = TableDefinition::new("templates");
/// object → the sequence number of its oldest version ever pruned: its
/// oldest kept version stands for the states before it (see `prune`).
pub const PRUNED: TableDefinition<u64, u64> = TableDefinition::new("pruned");
/// chunk hash → 0, or pack + 1: a chunk a purge took, whose bytes the
/// next collection removes from the packs however live the packs are, and
/// from under the live chunks stored as deltas of it; pack + 1 once it is
/// out of the index but still in that pack (added without a format bump:
/// a build without it ignores the table and frees the bytes as garbage).
pub const SCRUB: TableDefinition<&[u8], u64> = TableDefinition::new("scrub");
/// time (ns, made unique) → JSON record of a prune, purge, collection or
/// policy change: who did it and what it removed.
pub const AUDIT: TableDefinition<u64, &[u8]> = TableDefinition::new("audit");

/// Appends an audit record, keyed by the current time (made unique).
pub fn audit_put(txn: &WriteTransaction, record: &serde_json::Value) -> Result<()> {
    let mut t = txn.open_table(AUDIT).map_err(err)?;
    let mut key = super::now_ns().max(0) as u64;
    if let Some((last, _)) = t.last().map_err(err)? {
        key = key.max(last.value() + 1);
    }
    let bytes = record.to_string().into_bytes();
    t.insert(key, bytes.as_slice()).map_err(err)?;
    Ok(())
}

pub fn version_key(obj: ObjectId, seq: Seq) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&obj.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub fn dirent_prefix(parent: ObjectId, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(17 + name.len());
    k.extend_from_slice(&parent.to_be_bytes());
    k.extend_from_slice(name);
    k.push(0);
    k
}

pub fn dirent_key(parent: ObjectId, name: &[u8], seq: Seq) -> Vec<u8> {
    let mut k = dirent_prefix(parent, name);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// Splits a dirent key into (name, seq).
pub fn split_dirent_key(key: &[u8]) -> Option<(&[u8], Seq)> {
    if key.len() < 17 {
        return None;
    }
    let name = &key[8..key.len() - 9];
    let seq = Seq::from_be_bytes(key[key.len() - 8..].try_into().ok()?);
    Some((name, seq))
}

pub fn link_key(child: ObjectId, seq: Seq, parent: ObjectId, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(24 + name.len());
    k.extend_from_slice(&child.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(&parent.to_be_bytes());
    k.extend_from_slice(name);
    k
}

/// Splits a link key into (seq, parent, name).
pub fn split_link_key(key: &[u8]) -> Option<(Seq, ObjectId, &[u8])> {
    if key.len() < 24 {
        return None;
    }
    let seq = Seq::from_be_bytes(key[8..16].try_into().ok()?);
    let parent = ObjectId::from_be_bytes(key[16..24].try_into().ok()?);
    Some((seq, parent, &key[24..]))
}

/// A `DIRENTS` value: the child object, or `None` (0) for a removal.
pub fn child(value: u64) -> Option<ObjectId> {
    Some(value).filter(|c| *c != 0).map(ObjectId::new)
}

pub(super) fn err(e: impl Into<redb::Error>) -> HistoryError {
    HistoryError::Store(index_error(e))
}

pub fn meta_get(db: &Index, key: &str) -> Result<Option<u64>> {
    let txn = read_txn(db)?;
    match txn.open_table(META) {
        Ok(t) => Ok(t.get(key).map_err(err)?.map(|v| v.value())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(err(e)),
    }
}

pub fn meta_put(txn: &WriteTransaction, key: &str, value: u64) -> Result<()> {
    txn.open_table(META)
        .map_err(err)?
        .insert(key, value)
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
pub fn apply_ops(db: &Index, ops: &[Op], durability: Durability) -> Result<()> {
    apply_ops_with(db, ops, durability, |_| Ok(()))
}

/// Writes `ops` into the index in one transaction, plus whatever `extra`
/// adds. Idempotent: replaying an op already applied rewrites the same keys
/// with the same values.
pub fn apply_ops_with(
    db: &Index,
    ops: &[Op],
    durability: Durability,
    extra: impl FnOnce(&WriteTransaction) -> Result<()>,
) -> Result<()> {
    let txn = db.begin_write_with(durability).map_err(err)?;
    {
        let mut versions = txn.open_table(VERSIONS).map_err(err)?;
        let mut dirents = txn.open_table(DIRENTS).map_err(err)?;
        let mut links = txn.open_table(LINKS).map_err(err)?;
        let mut manifests = txn.open_table(MANIFESTS).map_err(err)?;
        let mut chunks = txn.open_table(store::chunks::CHUNKS).map_err(err)?;
        let mut seqs = txn.open_table(SEQS).map_err(err)?;
        let mut times = txn.open_table(TIMES).map_err(err)?;
        let mut tags = txn.open_table(TAGS).map_err(err)?;
        for op in ops {
            for (h, loc) in &op.chunks {
                chunks.insert(h.as_slice(), loc.as_slice()).map_err(err)?;
            }
            for (h, m) in &op.manifests {
                manifests.insert(h.as_slice(), m.as_slice()).map_err(err)?;
            }
            for (obj, v) in &op.versions {
                let key = version_key(*obj, op.seq);
                versions
                    .insert(key.as_slice(), encode_version(v).as_slice())
                    .map_err(err)?;
            }
            let dated = op.dirents.iter().map(|d| (d, op.seq));
            let dated = dated.chain(op.backdated.iter().map(|b| (&b.dirent, b.at)));
            for (d, seq) in dated.clone() {
                let key = dirent_key(d.parent, &d.name, seq);
                dirents
                    .insert(key.as_slice(), d.child.map_or(0, ObjectId::get))
                    .map_err(err)?;
            }
            for (d, seq) in dated {
                // The child that lost the name is the one bound just before.
                let (child, bound) = match d.child {
                    Some(c) => (c, 1u8),
                    None => match previous_child(&dirents, d, seq)? {
                        Some(c) => (c, 0u8),
                        None => continue,
                    },
                };
                let key = link_key(child, seq, d.parent, &d.name);
                links.insert(key.as_slice(), bound).map_err(err)?;
            }
            for (name, target) in &op.tags {
                match target {
                    Some(seq) => tags.insert(name.as_str(), seq.get()).map_err(err)?,
                    None => tags.remove(name.as_str()).map_err(err)?,
                };
            }
            seqs.insert(op.seq.get(), op.time_ns).map_err(err)?;
            times.insert(op.time_ns, op.seq.get()).map_err(err)?;
        }
    }
    for op in ops {
        let mut records = Vec::with_capacity(op.versions.len() + op.dirents.len());
        for (obj, v) in &op.versions {
            let key = version_key(*obj, op.seq);
            records.push(super::chain::version_record(&key, &encode_version(v)));
        }
        for d in &op.dirents {
            let key = dirent_key(d.parent, &d.name, op.seq);
            records.push(super::chain::dirent_record(
                &key,
                d.child.map_or(0, ObjectId::get),
            ));
        }
        for b in &op.backdated {
            let d = &b.dirent;
            let key = dirent_key(d.parent, &d.name, b.at);
            let record = super::chain::dirent_record(&key, d.child.map_or(0, ObjectId::get));
            super::chain::moved(&txn, b.at, &record, op.seq)?;
            records.push(record);
        }
        super::chain::extend(&txn, op.seq, records)?;
    }
    if let Some(last) = ops.last() {
        let (bind, unbind) = net_bindings(ops);
        inomap::write_bindings(&txn, &bind, &unbind)?;
        super::tables::meta_put(&txn, super::META_NEXT_SEQ, last.seq.next().get())?;
        super::tables::meta_put(&txn, super::META_LAST_TIME, last.time_ns as u64)?;
    }
    extra(&txn)?;
    txn.commit().map_err(err)?;
    Ok(())
}

/// A backing object's key and the inode number it is bound to.
type Mapping = (BackingKey, u64);

/// What the bindings of `ops` come to, key by key, the last op's word
/// standing: binding all first and then unbinding would let an object
/// made and removed within the batch (its key bound, then unbound) first
/// overwrite the key's newer mapping, then remove it, when the backing
/// file system gave the removed object's number to another object since
/// (a directory copied up: its number lost across a remount).
fn net_bindings(ops: &[Op]) -> (Vec<Mapping>, Vec<Mapping>) {
    let mut last: HashMap<BackingKey, (bool, u64)> = HashMap::new();
    for op in ops {
        for b in &op.bind {
            last.insert(b.key(), (true, b.object.get()));
        }
        for b in &op.unbind {
            last.insert(b.key(), (false, b.object.get()));
        }
    }
    let (bind, unbind): (Vec<_>, Vec<_>) = last.into_iter().partition(|(_, (bound, _))| *bound);
    let pairs =
        |v: Vec<(BackingKey, (bool, u64))>| v.into_iter().map(|(k, (_, ino))| (k, ino)).collect();
    (pairs(bind), pairs(unbind))
}

fn previous_child(
    dirents: &impl ReadableTable<&'static [u8], u64>,
    d: &Dirent,
    seq: Seq,
) -> Result<Option<ObjectId>> {
    let lo = dirent_key(d.parent, &d.name, Seq::ZERO);
    let hi = dirent_key(d.parent, &d.name, seq);
    let mut range = dirents.range(lo.as_slice()..hi.as_slice()).map_err(err)?;
    match range.next_back() {
        Some(entry) => {
            let (_, v) = entry.map_err(err)?;
            Ok(child(v.value()))
        }
        None => Ok(None),
    }
}

/// A manifest's encoded bytes, if the index holds it.
pub fn manifest_bytes(db: &Index, id: &store::Hash) -> Result<Option<Vec<u8>>> {
    let txn = read_txn(db)?;
    let table = match txn.open_table(MANIFESTS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let found = table.get(id.as_slice()).map_err(err)?;
    Ok(found.map(|v| v.value().to_vec()))
}

/// The newest version of `obj` at or before `seq`.
pub fn version_at(db: &Index, obj: ObjectId, seq: Seq) -> Result<Option<(Seq, Version)>> {
    let txn = read_txn(db)?;
    let table = match txn.open_table(VERSIONS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    version_at_in(&table, obj, seq)
}

pub fn version_at_in(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    obj: ObjectId,
    seq: Seq,
) -> Result<Option<(Seq, Version)>> {
    let lo = version_key(obj, Seq::ZERO);
    let hi = version_key(obj, seq);
    let mut range = table.range(lo.as_slice()..=hi.as_slice()).map_err(err)?;
    match range.next_back() {
        Some(entry) => {
            let (k, v) = entry.map_err(err)?;
            Ok(Some((decode_seq(k.value())?, decode(v.value())?)))
        }
        None => Ok(None),
    }
}

fn decode_seq(key: &[u8]) -> Result<Seq> {
    key.get(8..16)
        .and_then(|b| b.try_into().ok())
        .map(Seq::from_be_bytes)
        .ok_or_else(|| HistoryError::Corrupt("malformed version key".into()))
}

pub fn decode(bytes: &[u8]) -> Result<Version> {
    decode_version(bytes).ok_or_else(|| HistoryError::Corrupt("undecodable version record".into()))
}

/// What `name` in `parent` named at `seq`: `None` if history has no entry
/// for it yet, `Some(None)` if it was removed.
pub fn dirent_at(
    db: &Index,
    parent: ObjectId,
    name: &[u8],
    seq: Seq,
) -> Result<Option<Option<ObjectId>>> {
    Ok(dirent_seq_at(db, parent, name, seq)?.map(|(child, _)| child))
}

/// [`dirent_at`], with the sequence number the entry is keyed at.
pub fn dirent_seq_at(
    db: &Index,
    parent: ObjectId,
    name: &[u8],
    seq: Seq,
) -> Result<Option<(Option<ObjectId>, Seq)>> {
    let txn = read_txn(db)?;
    let table = match txn.open_table(DIRENTS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let lo = dirent_key(parent, name, Seq::ZERO);
    let hi = dirent_key(parent, name, seq);
    let mut range = table.range(lo.as_slice()..=hi.as_slice()).map_err(err)?;
    match range.next_back() {
        Some(entry) => {
            let (k, v) = entry.map_err(err)?;
            let (_, at) = split_dirent_key(k.value())
                .ok_or_else(|| HistoryError::Corrupt("malformed dirent key".into()))?;
            Ok(Some((child(v.value()), at)))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The keys' tests read best with plain numbers; these shadow the
    // typed functions of the same names.
    fn o(n: u64) -> ObjectId {
        ObjectId::new(n)
    }
    fn sq(n: u64) -> Seq {
        Seq::new(n)
    }
    fn version_key(obj: u64, seq: u64) -> [u8; 16] {
        super::version_key(o(obj), sq(seq))
    }
    fn dirent_key(parent: u64, name: &[u8], seq: u64) -> Vec<u8> {
        super::dirent_key(o(parent), name, sq(seq))
    }
    fn dirent_prefix(parent: u64, name: &[u8]) -> Vec<u8> {
        super::dirent_prefix(o(parent), name)
    }
    fn link_key(child: u64, seq: u64, parent: u64, name: &[u8]) -> Vec<u8> {
        super::link_key(o(child), sq(seq), o(parent), name)
    }
    fn split_dirent_key(key: &[u8]) -> Option<(&[u8], u64)> {
        super::split_dirent_key(key).map(|(n, s)| (n, s.get()))
    }
    fn split_link_key(key: &[u8]) -> Option<(u64, u64, &[u8])> {
        super::split_link_key(key).map(|(s, p, n)| (s.get(), p.get(), n))
    }
    fn version_at(db: &Index, obj: u64, seq: u64) -> Result<Option<(u64, Version)>> {
        Ok(super::version_at(db, o(obj), sq(seq))?.map(|(s, v)| (s.get(), v)))
    }
    fn dirent_at(db: &Index, parent: u64, name: &[u8], seq: u64) -> Result<Option<Option<u64>>> {
        Ok(super::dirent_at(db, o(parent), name, sq(seq))?.map(|c| c.map(ObjectId::get)))
    }

    #[test]
    fn version_keys_sort_by_object_then_sequence() {
        let mut keys = vec![
            version_key(2, 0),
            version_key(1, 256),
            version_key(1, u64::MAX),
            version_key(1, 255),
        ];
        keys.sort();
        assert_eq!(
            keys,
            [
                version_key(1, 255),
                version_key(1, 256),
                version_key(1, u64::MAX),
                version_key(2, 0)
            ]
        );
    }

    #[test]
    fn a_names_entries_are_contiguous_and_before_its_extensions() {
        let a_late = dirent_key(7, b"a", u64::MAX);
        let ab_early = dirent_key(7, b"ab", 0);
        assert!(dirent_key(7, b"a", 1) < a_late);
        assert!(a_late < ab_early, "every entry of `a` before any of `ab`");
        assert!(dirent_key(7, b"\xff", 0) < dirent_key(8, b"", 0));
        assert!(dirent_key(7, b"a", 5).starts_with(&dirent_prefix(7, b"a")));
        assert!(!ab_early.starts_with(&dirent_prefix(7, b"a")));
    }

    #[test]
    fn keys_split_back_into_their_parts() {
        let name: &[u8] = b"n\xffame\n";
        let k = dirent_key(9, name, 42);
        assert_eq!(split_dirent_key(&k), Some((name, 42)));
        assert_eq!(split_dirent_key(&k[..16]), None);
        let k = link_key(3, 44, 9, name);
        assert_eq!(split_link_key(&k), Some((44, 9, name)));
        assert_eq!(split_link_key(&k[..23]), None);
    }

    fn sample() -> Version {
        Version {
            time_ns: 17,
            who: Who {
                uid: 1000,
                gid: 100,
                pid: 4242,
                comm: "vim".into(),
            },
            cause: Cause::Write,
            attrs: Attrs {
                mode: libc::S_IFREG | 0o640,
                size: 3,
                nlink: 2,
                ..Attrs::default()
            },
            content: Content::Symlink {
                target: b"t\xff".to_vec(),
            },
            xattrs: vec![(b"user.k".to_vec(), b"v".to_vec())],
            gone: false,
        }
    }

    #[test]
    fn versions_round_trip_and_a_newer_format_is_refused() {
        let v = sample();
        let bytes = encode_version(&v);
        assert_eq!(bytes[0], VERSION_FORMAT);
        assert_eq!(decode(&bytes).unwrap(), v);
        let mut newer = bytes.clone();
        newer[0] = VERSION_FORMAT + 1;
        assert!(matches!(decode(&newer), Err(HistoryError::Corrupt(_))));
        assert!(decode(&bytes[..bytes.len() / 2]).is_err());
        assert!(decode(&[]).is_err());
    }

    #[test]
    fn journal_records_round_trip_and_a_newer_format_is_refused() {
        let op = Op {
            seq: sq(5),
            time_ns: 99,
            versions: vec![(o(10), sample())],
            dirents: vec![Dirent {
                parent: o(1),
                name: b"f".to_vec(),
                child: Some(o(10)),
            }],
            tags: vec![("t".into(), Some(sq(5)))],
            ..Op::default()
        };
        let bytes = op.encode();
        let back = Op::decode(&bytes).unwrap();
        assert_eq!((back.seq, back.time_ns), (sq(5), 99));
        assert_eq!(back.versions, op.versions);
        assert_eq!(back.tags, op.tags);
        let mut newer = bytes;
        newer[0] = OP_FORMAT + 1;
        let e = Op::decode(&newer).unwrap_err();
        assert!(e.contains("unknown format"), "{e}");
    }

    /// Journal format 1 (before `backdated`): what a build of store format
    /// 7 left in a journal at a crash replays after the upgrade.
    #[test]
    fn a_format_1_journal_record_still_decodes() {
        #[derive(serde::Serialize)]
        struct OpV1 {
            seq: Seq,
            time_ns: i64,
            versions: Vec<(ObjectId, Version)>,
            dirents: Vec<Dirent>,
            manifests: Vec<(crate::store::Hash, Vec<u8>)>,
            chunks: Vec<(crate::store::Hash, Vec<u8>)>,
            bind: Vec<crate::history::Binding>,
            unbind: Vec<crate::history::Binding>,
            tags: Vec<(String, Option<Seq>)>,
        }
        let old = OpV1 {
            seq: sq(7),
            time_ns: 5,
            versions: vec![(o(10), sample())],
            dirents: vec![Dirent {
                parent: o(1),
                name: b"f".to_vec(),
                child: Some(o(10)),
            }],
            manifests: Vec::new(),
            chunks: Vec::new(),
            bind: Vec::new(),
            unbind: Vec::new(),
            tags: vec![("t".into(), None)],
        };
        let mut bytes = vec![1u8];
        bytes.extend(postcard::to_allocvec(&old).unwrap());
        let op = Op::decode(&bytes).unwrap();
        assert_eq!((op.seq, op.time_ns), (sq(7), 5));
        assert_eq!(op.versions, old.versions);
        assert_eq!(op.dirents, old.dirents);
        assert_eq!(op.tags, old.tags);
        assert!(op.backdated.is_empty());
        // And the current format keeps what it adds.
        let now = Op {
            backdated: vec![Backdated {
                dirent: old.dirents[0].clone(),
                at: sq(3),
            }],
            ..op
        };
        assert_eq!(Op::decode(&now.encode()).unwrap().backdated, now.backdated);
    }

    #[test]
    fn applying_an_op_twice_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("s")).unwrap();
        let db = store.index();
        let op = Op {
            seq: sq(3),
            time_ns: 1_000,
            versions: vec![(o(10), sample())],
            dirents: vec![Dirent {
                parent: o(1),
                name: b"f".to_vec(),
                child: Some(o(10)),
            }],
            ..Op::default()
        };
        apply_ops(&db, std::slice::from_ref(&op), Durability::Immediate).unwrap();
        let once = (
            version_at(&db, 10, u64::MAX).unwrap(),
            dirent_at(&db, 1, b"f", u64::MAX).unwrap(),
        );
        apply_ops(&db, &[op], Durability::Immediate).unwrap();
        let twice = (
            version_at(&db, 10, u64::MAX).unwrap(),
            dirent_at(&db, 1, b"f", u64::MAX).unwrap(),
        );
        assert_eq!(once, twice);
        assert_eq!(once.0, Some((3, sample())));
        assert_eq!(once.1, Some(Some(10)));
        assert_eq!(version_at(&db, 10, 2).unwrap(), None);
        assert_eq!(dirent_at(&db, 1, b"f", 2).unwrap(), None);
    }

    #[test]
    fn a_key_bound_and_unbound_in_one_batch_keeps_its_newer_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("s")).unwrap();
        let db = store.index();
        let b = |ino, obj| Binding {
            branch: 0,
            dev: 7,
            ino,
            object: o(obj),
        };
        // The inode map has already given backing number 5, reused by the
        // file system, to object 4; the batch still holds the made and
        // removed object 58 that had it before.
        let map = store.inode_map().unwrap();
        map.bind(b(5, 4).key(), 4);
        map.flush().unwrap();
        let made = Op {
            seq: sq(1),
            bind: vec![b(5, 58), b(6, 50)],
            ..Op::default()
        };
        let removed = Op {
            seq: sq(2),
            unbind: vec![b(5, 58)],
            ..Op::default()
        };
        apply_ops(&db, &[made, removed], Durability::Immediate).unwrap();
        drop(map);
        let map = store.inode_map().unwrap();
        assert_eq!(map.get(&b(5, 0).key()).unwrap(), Some(4));
        assert_eq!(map.get(&b(6, 0).key()).unwrap(), Some(50));
        // The number of the object made and removed is never given again.
        assert!(map.get_or_assign(b(9, 0).key()).unwrap() > 58);
    }
}
