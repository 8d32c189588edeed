//! File content as manifests of chunks: cutting a byte stream into
//! content-defined chunks on the way in, reassembling it on the way out.
//!
//! Chunking: FastCDC (2020) with the sizes below; the choice and
//! its measurement are in docs/ARCHITECTURE.md ("Chunking"). Content-defined
//! boundaries survive insertions and deletions (an edit costs the chunks it
//! touches, not the rest of the file), and fixed-size in-place rewrites
//! still only touch the chunks around them.

use std::io::{Read, Write};

use fastcdc::v2020::StreamCDC;

use super::model::{Extent, Manifest};
use super::{HistoryError, Result};
use crate::store::{ChunkStore, Hash};

/// Chunk sizes (min, avg, max) for files below `LARGE_FILE`: small average
/// chunks, so an edit of a text or source file costs a few KiB (measured,
/// docs/ARCHITECTURE.md "Chunking").
pub const SMALL: (u32, u32, u32) = (4 << 10, 16 << 10, 64 << 10);
/// For larger files: bigger chunks keep the index and each version's
/// manifest small (a 1 GiB file is 16k chunks, not 256k).
pub const LARGE: (u32, u32, u32) = (16 << 10, 64 << 10, 256 << 10);
pub const LARGE_FILE: u64 = 16 << 20;

/// Chunk sizes for a file of `size` bytes. `CHRONOFS_CHUNK_AVG` (bytes, a
/// power of two from 1 KiB to 1 MiB) overrides the average for benchmarks
/// that compare chunkings; min and max keep the 1:4:16 ratio.
fn sizes(size: u64) -> (u32, u32, u32) {
    static FORCED: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        std::env::var("CHRONOFS_CHUNK_AVG")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|a| a.is_power_of_two() && (1024..=(1 << 20)).contains(a))
    });
    match forced {
        Some(a) => (a / 4, a, a * 4),
        None if size >= LARGE_FILE => LARGE,
        None => SMALL,
    }
}

/// Statistics of one ingest.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ingested {
    pub bytes: u64,
    pub new_chunks: u64,
    pub new_bytes: u64,
}

/// The chunks of a file's previous version by offset, so that a new chunk
/// can be stored as a delta against the one it replaces: an edit then
/// costs about its own size, not its chunks' (docs/ARCHITECTURE.md
/// "Delta chunks").
#[derive(Default)]
pub struct Bases {
    /// End offset of each extent of the previous version, ascending.
    ends: Vec<u64>,
    chunks: Vec<Option<Hash>>,
}

impl Bases {
    pub fn of(previous: &Manifest) -> Bases {
        let mut bases = Bases::default();
        let mut end = 0u64;
        for e in &previous.extents {
            end += u64::from(e.len);
            bases.ends.push(end);
            bases.chunks.push(e.chunk);
        }
        bases
    }

    /// The previous version's chunk holding byte `offset`.
    fn covering(&self, offset: u64) -> Option<&Hash> {
        let i = self.ends.partition_point(|end| *end <= offset);
        self.chunks.get(i)?.as_ref()
    }
}

/// Cuts `source`, the bytes from `start` on in a file of about `size_hint`
/// bytes, into chunks, stores the new ones (as deltas against `bases`
/// where that pays) and returns the manifest. All-zero chunks become holes
/// (they read back as zeros and cost nothing).
fn ingest_at(
    chunks: &ChunkStore,
    source: impl Read,
    size_hint: u64,
    start: u64,
    bases: Option<&Bases>,
    level: i32,
) -> Result<(Manifest, Ingested)> {
    let mut manifest = Manifest::default();
    let mut stats = Ingested::default();
    // A new chunk still looking for a delta base: decided by the next one.
    let mut deferred: Option<(Hash, Vec<u8>)> = None;
    let (min, avg, max) = sizes(size_hint);
    for piece in StreamCDC::new(source, min as usize, avg as usize, max as usize) {
        let piece = piece.map_err(|e| match e {
            fastcdc::v2020::Error::IoError(io) => HistoryError::Source(io),
            other => HistoryError::Chunker(other.to_string()),
        })?;
        let len = piece.length as u32;
        stats.bytes += u64::from(len);
        if piece.data.iter().all(|b| *b == 0) {
            store_deferred(chunks, deferred.take(), None, level, &mut stats)?;
            push(&mut manifest, Extent { len, chunk: None });
            continue;
        }
        let hash = crate::store::chunks::hash(&piece.data);
        if let Some(d) = deferred.take() {
            // A changed chunk with no predecessor to go by: the chunk that
            // preceded this one in a recent file is its likely old content.
            let base = if chunks.contains(&hash)? {
                chunks.predecessor_of(&hash)
            } else {
                None
            };
            store_deferred(chunks, Some(d), base.as_ref(), level, &mut stats)?;
        }
        let middle = start + piece.offset + u64::from(len / 2);
        // The replaced chunk of this file's previous version, or else the
        // chunk that followed the previous one in a recent file.
        let base = bases.and_then(|b| b.covering(middle)).copied().or_else(|| {
            manifest
                .extents
                .last()
                .and_then(|e| e.chunk)
                .and_then(|prev| chunks.successor_of(&prev))
        });
        if base.is_none() && !chunks.contains(&hash)? {
            deferred = Some((hash, piece.data));
        } else {
            store_deferred(
                chunks,
                Some((hash, piece.data)),
                base.as_ref(),
                level,
                &mut stats,
            )?;
        }
        push(
            &mut manifest,
            Extent {
                len,
                chunk: Some(hash),
            },
        );
    }
    store_deferred(chunks, deferred.take(), None, level, &mut stats)?;
    Ok((manifest, stats))
}

fn store_deferred(
    chunks: &ChunkStore,
    chunk: Option<(Hash, Vec<u8>)>,
    base: Option<&Hash>,
    level: i32,
    stats: &mut Ingested,
) -> Result<()> {
    if let Some((hash, data)) = chunk {
        if chunks.put_hashed(&hash, &data, base, level)? {
            stats.new_chunks += 1;
            stats.new_bytes += data.len() as u64;
        }
    }
    Ok(())
}

/// Like [`ingest_at`] over a file of `size` bytes whose data lies in
/// `data` (sorted, non-overlapping (offset, length) ranges, e.g. from
/// SEEK_DATA/SEEK_HOLE): the gaps become holes without being read, so a
/// sparse file costs what it holds. `bases`: the previous version's chunks.
pub fn ingest_sparse(
    chunks: &ChunkStore,
    read_at: &dyn Fn(&mut [u8], u64) -> std::io::Result<usize>,
    size: u64,
    data: &[(u64, u64)],
    bases: Option<&Bases>,
    level: i32,
) -> Result<(Manifest, Ingested)> {
    let mut manifest = Manifest::default();
    let mut stats = Ingested::default();
    let mut pos = 0u64;
    let hole = |m: &mut Manifest, mut len: u64| {
        while len > 0 {
            let piece = len.min(u64::from(u32::MAX));
            push(
                m,
                Extent {
                    len: piece as u32,
                    chunk: None,
                },
            );
            len -= piece;
        }
    };
    for &(off, len) in data {
        let (off, len) = (
            off.max(pos),
            (off + len).min(size).saturating_sub(off.max(pos)),
        );
        if len == 0 {
            continue;
        }
        hole(&mut manifest, off - pos);
        let reader = PositionalReader {
            read_at,
            offset: off,
        }
        .take(len);
        let (part, st) = ingest_at(chunks, reader, size, off, bases, level)?;
        for e in part.extents {
            push(&mut manifest, e);
        }
        stats.bytes += st.bytes;
        stats.new_chunks += st.new_chunks;
        stats.new_bytes += st.new_bytes;
        pos = off + len;
    }
    hole(&mut manifest, size.saturating_sub(pos));
    note_sequence(chunks, &manifest);
    Ok((manifest, stats))
}

/// Granularity of re-reads inside a hole of the previous version: a write
/// into a large sparse region costs this much around it, not the region.
const HOLE_STEP: u64 = 64 << 10;

/// The new content of a file whose previous version is `prev`, given every
/// byte range written since (`dirty`: sorted or not, may overlap; a range
/// may run past the end). Only the previous version's chunks that the
/// ranges touch are read again and re-chunked, each run of them on its
/// own (its ends stay chunk boundaries), with the replaced chunks as delta
/// bases; the rest of the manifest is reused. `size`: the file's size now.
pub fn ingest_changes(
    chunks: &ChunkStore,
    read_at: &dyn Fn(&mut [u8], u64) -> std::io::Result<usize>,
    size: u64,
    prev: &Manifest,
    dirty: &[(u64, u64)],
    level: i32,
) -> Result<(Manifest, Ingested)> {
    let mut extents = Vec::with_capacity(prev.extents.len());
    let mut at = 0u64;
    for e in &prev.extents {
        extents.push((at, at + u64::from(e.len), e.chunk));
        at += u64::from(e.len);
    }
    let prev_size = at;
    let mut reread: Vec<(u64, u64)> = Vec::new();
    for &(off, len) in dirty {
        let end = off.saturating_add(len).min(size.max(prev_size));
        let first = extents.partition_point(|x| x.1 <= off);
        for &(s, e, chunk) in extents[first..].iter().take_while(|x| x.0 < end) {
            match chunk {
                Some(_) => reread.push((s, e)),
                None => {
                    let a = (off.max(s) / HOLE_STEP * HOLE_STEP).max(s);
                    let b = end
                        .min(e)
                        .div_ceil(HOLE_STEP)
                        .saturating_mul(HOLE_STEP)
                        .min(e);
                    reread.push((a, b));
                }
            }
        }
    }
    // Growth, and a chunk cut by a truncation, are read too.
    reread.push((prev_size, size));
    if let Some(&(s, e, Some(_))) = extents.iter().find(|x| x.0 < size && size < x.1) {
        reread.push((s, e));
    }
    let reread = merge_ranges(reread, size);
    let bases = Bases::of(prev);
    let mut manifest = Manifest::default();
    let mut stats = Ingested::default();
    let mut pos = 0u64;
    for (a, b) in reread {
        copy_extents(&extents, pos, a, &mut manifest);
        let reader = PositionalReader { read_at, offset: a }.take(b - a);
        let (part, st) = ingest_at(chunks, reader, size, a, Some(&bases), level)?;
        if part.extents.iter().map(|e| u64::from(e.len)).sum::<u64>() != b - a {
            return Err(HistoryError::SourceShrank);
        }
        for e in part.extents {
            push(&mut manifest, e);
        }
        stats.bytes += st.bytes;
        stats.new_chunks += st.new_chunks;
        stats.new_bytes += st.new_bytes;
        pos = b;
    }
    copy_extents(&extents, pos, size.min(prev_size).max(pos), &mut manifest);
    note_sequence(chunks, &manifest);
    Ok((manifest, stats))
}

fn note_sequence(chunks: &ChunkStore, m: &Manifest) {
    let seq: Vec<Hash> = chunk_refs(m).collect();
    chunks.note_sequence(&seq);
}

/// Sorted, merged, non-empty ranges clipped to `limit`.
fn merge_ranges(mut ranges: Vec<(u64, u64)>, limit: u64) -> Vec<(u64, u64)> {
    ranges.retain_mut(|r| {
        r.1 = r.1.min(limit);
        r.0 < r.1
    });
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Pushes the previous version's extents covering [a, b): chunks lie
/// wholly inside (re-read ranges end on chunk boundaries); holes may be
/// cut.
fn copy_extents(extents: &[(u64, u64, Option<Hash>)], a: u64, b: u64, m: &mut Manifest) {
    if a >= b {
        return;
    }
    let first = extents.partition_point(|x| x.1 <= a);
    for &(s, e, chunk) in extents[first..].iter().take_while(|x| x.0 < b) {
        let (from, to) = (s.max(a), e.min(b));
        if to > from {
            push(
                m,
                Extent {
                    len: (to - from) as u32,
                    chunk,
                },
            );
        }
    }
}

/// Appends, merging adjacent holes.
fn push(m: &mut Manifest, e: Extent) {
    if let (None, Some(last)) = (e.chunk, m.extents.last_mut()) {
        if last.chunk.is_none() {
            if let Some(sum) = last.len.checked_add(e.len) {
                last.len = sum;
                return;
            }
        }
    }
    m.extents.push(e);
}

/// Writes the content of `manifest` to `out`.
pub fn write_to(chunks: &ChunkStore, manifest: &Manifest, out: &mut impl Write) -> Result<()> {
    let zeros = vec![0u8; 1 << 20];
    let io = HistoryError::Output;
    for e in &manifest.extents {
        match e.chunk {
            Some(h) => out.write_all(&chunks.get(&h)?).map_err(io)?,
            None => {
                let mut left = e.len as usize;
                while left > 0 {
                    let n = left.min(zeros.len());
                    out.write_all(&zeros[..n]).map_err(io)?;
                    left -= n;
                }
            }
        }
    }
    Ok(())
}

/// Cuts `source` (a whole file of `size` bytes) exactly as an ingest of
/// it would, storing nothing: `f` sees each data chunk's hash and bytes.
/// Returns the manifest an ingest would have written, so that `fsck
/// --repair` can find damaged chunks and manifests among a live file's.
pub fn recut(
    source: impl Read,
    size: u64,
    f: &mut dyn FnMut(&Hash, &[u8]) -> Result<()>,
) -> Result<Manifest> {
    let mut manifest = Manifest::default();
    let (min, avg, max) = sizes(size);
    for piece in StreamCDC::new(source, min as usize, avg as usize, max as usize) {
        let piece = piece.map_err(|e| match e {
            fastcdc::v2020::Error::IoError(io) => HistoryError::Source(io),
            other => HistoryError::Chunker(other.to_string()),
        })?;
        let len = piece.length as u32;
        if piece.data.iter().all(|b| *b == 0) {
            push(&mut manifest, Extent { len, chunk: None });
            continue;
        }
        let hash = crate::store::chunks::hash(&piece.data);
        f(&hash, &piece.data)?;
        push(
            &mut manifest,
            Extent {
                len,
                chunk: Some(hash),
            },
        );
    }
    Ok(manifest)
}

/// Every chunk a manifest references.
pub fn chunk_refs(manifest: &Manifest) -> impl Iterator<Item = Hash> + '_ {
    manifest.extents.iter().filter_map(|e| e.chunk)
}

/// A reader over a descriptor by offset (pread), so ingest never moves
/// the caller's file position.
pub struct PositionalReader<'a> {
    pub read_at: &'a dyn Fn(&mut [u8], u64) -> std::io::Result<usize>,
    pub offset: u64,
}

impl Read for PositionalReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.read_at)(buf, self.offset)?;
        self.offset += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::chunks::ZSTD_LEVEL;
    use std::sync::Arc;

    fn ingest(chunks: &ChunkStore, source: &[u8], size: u64) -> Result<(Manifest, Ingested)> {
        ingest_at(chunks, source, size, 0, None, ZSTD_LEVEL)
    }

    fn read_all(chunks: &ChunkStore, m: &Manifest) -> Vec<u8> {
        let mut out = Vec::new();
        write_to(chunks, m, &mut out).unwrap();
        out
    }

    #[test]
    fn changed_ranges_rebuild_the_same_content_as_a_full_ingest() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path()).unwrap();
        let chunks = store.chunk_store().unwrap();
        let mut data: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
            .collect();
        data[1_000_000..1_900_000].fill(0); // a hole in the middle
        let (prev, _) = ingest(&chunks, data.as_slice(), data.len() as u64).unwrap();
        type Writes = Vec<(u64, Vec<u8>)>;
        let cases: Vec<(Writes, Option<usize>)> = vec![
            (vec![(10, b"abc".to_vec())], None),
            (vec![(1_500_000, b"into the hole".to_vec())], None),
            (vec![(2_999_990, vec![7u8; 100])], None), // grows the file
            (vec![(5, b"x".to_vec())], Some(2_000_001)), // and truncates
            (vec![], Some(1_200_000)),                 // truncation into the hole
            (vec![(0, vec![1u8; 3_100_000])], None),   // everything
        ];
        for (writes, truncate) in cases {
            let mut now = data.clone();
            let mut dirty = Vec::new();
            for (off, bytes) in &writes {
                let end = *off as usize + bytes.len();
                if now.len() < end {
                    now.resize(end, 0);
                }
                now[*off as usize..end].copy_from_slice(bytes);
                dirty.push((*off, bytes.len() as u64));
            }
            if let Some(t) = truncate {
                dirty.push((t as u64, u64::MAX));
                now.truncate(t);
            }
            let read_at = |buf: &mut [u8], off: u64| -> std::io::Result<usize> {
                let off = (off as usize).min(now.len());
                let n = buf.len().min(now.len() - off);
                buf[..n].copy_from_slice(&now[off..off + n]);
                Ok(n)
            };
            let (m, st) = ingest_changes(
                &chunks,
                &read_at,
                now.len() as u64,
                &prev,
                &dirty,
                ZSTD_LEVEL,
            )
            .unwrap();
            assert_eq!(read_all(&chunks, &m), now, "{:?}", truncate);
            if writes.len() == 1 && writes[0].1.len() < 200 && truncate.is_none() {
                assert!(st.bytes <= 1 << 20, "re-read {} bytes", st.bytes);
            }
        }
    }

    #[test]
    fn roundtrip_with_holes_and_dedup() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path()).unwrap();
        let chunks = store.chunk_store().unwrap();
        let mut data = Vec::new();
        for i in 0..200_000u32 {
            data.extend_from_slice(format!("line {i} of some text\n").as_bytes());
        }
        data.extend(std::iter::repeat_n(0u8, 300_000));
        data.extend_from_slice(b"tail");
        let (m, stats) = ingest(&chunks, data.as_slice(), data.len() as u64).unwrap();
        assert_eq!(m.size(), data.len() as u64);
        assert!(m.extents.iter().any(|e| e.chunk.is_none()));
        let mut out = Vec::new();
        write_to(&chunks, &m, &mut out).unwrap();
        assert_eq!(out, data);
        // The same content again stores nothing new.
        let (m2, again) = ingest(&chunks, data.as_slice(), data.len() as u64).unwrap();
        assert_eq!(m2, m);
        assert_eq!(again.new_chunks, 0);
        assert!(stats.new_chunks > 0);
        // An insertion near the start costs a few chunks, not the file.
        let mut edited = data.clone();
        edited.splice(100..100, b"inserted text".iter().copied());
        let (_, delta) = ingest(&chunks, edited.as_slice(), edited.len() as u64).unwrap();
        assert!(delta.new_chunks <= 3, "{delta:?}");
        let _ = Arc::new(());
    }
}
#[cfg(test)]
mod successor_tests {
    use super::*;
    use crate::store::chunks::ZSTD_LEVEL;

    #[test]
    fn a_rewritten_copy_finds_bases_through_successors() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path()).unwrap();
        let chunks = store.chunk_store().unwrap();
        let text: Vec<u8> = (0..4000u32)
            .flat_map(|i| format!("line {i} {}\n", i.wrapping_mul(7919) % 1013).into_bytes())
            .collect();
        let read = |data: &[u8]| {
            let data = data.to_vec();
            move |buf: &mut [u8], off: u64| -> std::io::Result<usize> {
                let off = (off as usize).min(data.len());
                let n = buf.len().min(data.len() - off);
                buf[..n].copy_from_slice(&data[off..off + n]);
                Ok(n)
            }
        };
        let r = read(&text);
        let (m1, _) = ingest_sparse(
            &chunks,
            &r,
            text.len() as u64,
            &[(0, text.len() as u64)],
            None,
            ZSTD_LEVEL,
        )
        .unwrap();
        let mut edited = text.clone();
        edited[40_000..40_010].copy_from_slice(b"EDITEDEDIT");
        let r2 = read(&edited);
        let (m2, st) = ingest_sparse(
            &chunks,
            &r2,
            edited.len() as u64,
            &[(0, edited.len() as u64)],
            None,
            ZSTD_LEVEL,
        )
        .unwrap();
        eprintln!(
            "chunks {} -> {}, new {}",
            m1.extents.len(),
            m2.extents.len(),
            st.new_chunks
        );
        let fresh: Vec<_> = chunk_refs(&m2)
            .filter(|h| !chunk_refs(&m1).any(|o| o == *h))
            .collect();
        for h in fresh {
            let loc = chunks.locate(&h).unwrap().unwrap();
            eprintln!("{:?}", loc);
            assert_eq!(loc.encoding, crate::store::chunks::Encoding::Delta);
        }
    }
}
