//! Test helpers: a history over a store in a temporary directory, on a
//! manual clock, and versions made directly (no capture, no vfs).

use std::sync::Arc;

use super::clock::ManualClock;
use super::content;
use super::model::*;
use super::{Draft, History, HistoryHandle};
use crate::store::{chunks::ZSTD_LEVEL, Hash, Store};

/// An object id in a test: the one place to change if `ObjectId` stops
/// being a plain integer.
pub fn o(n: u64) -> ObjectId {
    ObjectId::new(n)
}

/// A sequence number in a test.
pub fn sq(n: u64) -> Seq {
    Seq::new(n)
}

/// 2035-01-01T00:00:00Z.
pub const T0: i64 = 2_051_222_400_000_000_000;
pub const HOUR: i64 = 3_600_000_000_000;

#[allow(dead_code)] // `store` and `dir` are held for their lifetimes.
pub struct Kit {
    pub history: HistoryHandle,
    pub clock: Arc<ManualClock>,
    pub store: Store,
    pub dir: tempfile::TempDir,
}

pub fn kit() -> Kit {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let clock = ManualClock::new(T0);
    let history = History::open_with_clock(&store, false, clock.clone()).unwrap();
    Kit {
        history,
        clock,
        store,
        dir,
    }
}

/// Random-looking bytes that no other seed shares a chunk with.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 56) as u8
        })
        .collect()
}

pub fn attrs(mode: u32, size: u64) -> Attrs {
    Attrs {
        mode,
        size,
        nlink: 1,
        ..Attrs::default()
    }
}

pub fn version(mode: u32, size: u64, content: Content, cause: Cause) -> Version {
    Version {
        time_ns: 0,
        who: Who::default(),
        cause,
        attrs: attrs(mode, size),
        content,
        xattrs: Vec::new(),
        gone: false,
    }
}

/// A positional reader over `bytes`, as content ingestion reads a file.
pub fn reader(bytes: &[u8]) -> impl Fn(&mut [u8], u64) -> std::io::Result<usize> + '_ {
    move |buf, off| {
        let off = (off as usize).min(bytes.len());
        let n = buf.len().min(bytes.len() - off);
        buf[..n].copy_from_slice(&bytes[off..off + n]);
        Ok(n)
    }
}

/// Stores `bytes` as file content; returns the manifest's hash.
pub fn store_bytes(h: &History, bytes: &[u8]) -> Hash {
    let read_at = reader(bytes);
    let size = bytes.len() as u64;
    let (manifest, _) =
        content::ingest_sparse(h.chunks(), &read_at, size, &[(0, size)], None, ZSTD_LEVEL).unwrap();
    h.chunks().put_against(&manifest.encode(), None).unwrap().0
}

/// Records `bytes` as the next version of file `obj` (named `name` in
/// `parent` when given); returns its sequence number.
pub fn write(h: &History, obj: ObjectId, named: Option<(ObjectId, &[u8])>, bytes: &[u8]) -> Seq {
    let _building = h.building();
    let manifest = store_bytes(h, bytes);
    record_file(h, obj, named, manifest, bytes.len() as u64)
}

/// Records a version of file `obj` whose content is `manifest` (its hash,
/// stored), `size` bytes long.
pub fn record_file(
    h: &History,
    obj: ObjectId,
    named: Option<(ObjectId, &[u8])>,
    manifest: Hash,
    size: u64,
) -> Seq {
    let mut d = Draft::default();
    let cause = if named.is_some() {
        Cause::Create
    } else {
        Cause::Write
    };
    d.versions.push((
        obj,
        version(
            libc::S_IFREG | 0o644,
            size,
            Content::File { manifest },
            cause,
        ),
    ));
    commit_named(h, d, obj, named)
}

/// Commits `d`, with `obj` entered under `named` (parent, name) if given.
fn commit_named(h: &History, mut d: Draft, obj: ObjectId, named: Option<(ObjectId, &[u8])>) -> Seq {
    if let Some((parent, name)) = named {
        d.dirents.push(Dirent {
            parent,
            name: name.to_vec(),
            child: Some(obj),
        });
    }
    h.commit(d).unwrap()
}

/// Records directory `obj` (its own version, and its name if given).
pub fn mkdir(h: &History, obj: ObjectId, named: Option<(ObjectId, &[u8])>) -> Seq {
    let mut d = Draft::default();
    d.versions.push((
        obj,
        version(libc::S_IFDIR | 0o755, 0, Content::Dir, Cause::Mkdir),
    ));
    commit_named(h, d, obj, named)
}

/// Records the removal of `name` from `parent`, naming `obj`.
pub fn unlink(h: &History, parent: ObjectId, name: &[u8], obj: ObjectId) -> Seq {
    let mut d = Draft::default();
    let mut v = version(libc::S_IFREG | 0o644, 0, Content::Special, Cause::Unlink);
    v.gone = true;
    d.versions.push((obj, v));
    d.dirents.push(Dirent {
        parent,
        name: name.to_vec(),
        child: None,
    });
    h.commit(d).unwrap()
}

/// The bytes of a recorded file version.
pub fn read(h: &History, v: &Version) -> Vec<u8> {
    let Content::File { manifest } = &v.content else {
        panic!("not a file: {v:?}");
    };
    let m = h.manifest(manifest).unwrap();
    let mut out = Vec::new();
    content::write_to(h.chunks(), &m, &mut out).unwrap();
    out
}

/// The chunks (data and manifest) a file version references.
pub fn chunks_of(h: &History, v: &Version) -> Vec<Hash> {
    let Content::File { manifest } = &v.content else {
        panic!("not a file: {v:?}");
    };
    let m = h.manifest(manifest).unwrap();
    let mut out: Vec<Hash> = content::chunk_refs(&m).collect();
    out.push(*manifest);
    out
}
