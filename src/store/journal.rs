//! The journal: an append-only file of records written before each
//! non-durable index commit, so that a killed daemon loses nothing it
//! acknowledged. After each durable index commit the journal is emptied.
//!
//! Layout: header `CHRNJRNL` ‖ format u32, then records
//! `length u32 ‖ crc32 u32 ‖ payload`. Replay stops at the first record
//! that is cut short or fails its checksum (the tail of a crash).

use std::path::PathBuf;
use std::sync::Arc;

use super::io::{Create, Guarded, StoreFile};
use super::StoreError;

const MAGIC: &[u8; 8] = b"CHRNJRNL";
pub const JOURNAL_FORMAT: u32 = 1;
const HEADER_LEN: u64 = 12;
const MAX_RECORD: u32 = 1 << 30;

pub struct Journal {
    path: PathBuf,
    file: Arc<dyn StoreFile>,
    /// Where the next record goes.
    end: u64,
}

impl Journal {
    /// Opens (creating if needed) the journal `name` of the store and
    /// returns it with the payloads of the intact records it holds.
    pub fn open(io: &Guarded, name: &str) -> Result<(Journal, Vec<Vec<u8>>), StoreError> {
        let path = io.path(name);
        let io_err = |source| StoreError::from_io(path.clone(), source);
        let file = io.open(name, Create::IfMissing).map_err(io_err)?;
        let len = file.len().map_err(io_err)?;
        let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        file.read_exact_at(&mut bytes, 0).map_err(io_err)?;
        let mut journal = Journal {
            path: path.clone(),
            file,
            end: 0,
        };
        let header = header();
        if bytes.len() < header.len() && header.starts_with(&bytes) {
            // New, or its creation was cut short by a power cut. The
            // header is written and fsync'd before the name is made
            // durable, and never rewritten: `reset` only truncates after it.
            journal.file.set_len(0).map_err(io_err)?;
            journal
                .file
                .write_all_at(&header, 0)
                .and_then(|()| journal.file.sync())
                .and_then(|()| io.sync_dir(""))
                .map_err(io_err)?;
            journal.end = HEADER_LEN;
            return Ok((journal, Vec::new()));
        }
        if bytes.len() < HEADER_LEN as usize || bytes[..8] != header[..8] {
            return Err(StoreError::DamagedJournal {
                path,
                detail: "its header is not a chronofs journal's".into(),
            });
        }
        let format = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if format != JOURNAL_FORMAT {
            return Err(StoreError::UnsupportedFormat {
                path,
                found: u64::from(format),
                supported: JOURNAL_FORMAT,
            });
        }
        let (records, intact_len) = parse_records(&bytes[HEADER_LEN as usize..]);
        // Cut a torn tail so new records follow the last intact one.
        journal.end = HEADER_LEN + intact_len as u64;
        if journal.end < len {
            // A crash's torn last record, usually; damage in the middle
            // drops every record after it, which is worth a line.
            tracing::warn!(
                "journal {}: bytes {}-{len} hold no intact record (a record a crash cut short, \
                 or damage); cut there, {} intact records kept",
                path.display(),
                journal.end,
                records.len()
            );
            journal.file.set_len(journal.end).map_err(io_err)?;
        }
        Ok((journal, records))
    }

    fn io_err(&self, source: std::io::Error) -> StoreError {
        StoreError::from_io(self.path.clone(), source)
    }

    /// Appends one record. One write(2): after it returns, the record
    /// survives a kill of the daemon (not a power cut: durability comes
    /// from the index commit that follows, see `History::sync`).
    pub fn append(&mut self, payload: &[u8]) -> Result<(), StoreError> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|l| *l <= MAX_RECORD)
            .ok_or(StoreError::TooLarge {
                what: "a journal record",
                size: payload.len() as u64,
            })?;
        let mut rec = Vec::with_capacity(8 + payload.len());
        rec.extend_from_slice(&len.to_be_bytes());
        rec.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
        rec.extend_from_slice(payload);
        if let Err(e) = self.file.write_all_at(&rec, self.end) {
            // A partial record fails its checksum; cut it anyway so the
            // next one does not follow garbage.
            let _ = self.file.set_len(self.end);
            return Err(self.io_err(e));
        }
        self.end += rec.len() as u64;
        Ok(())
    }

    /// Empties the journal (its records are durable in the index). Not
    /// fsync'd: records that come back after a power cut are older than
    /// the index's durable commit and are skipped at replay.
    pub fn reset(&mut self) -> Result<(), StoreError> {
        self.file.set_len(HEADER_LEN).map_err(|e| self.io_err(e))?;
        self.end = HEADER_LEN;
        Ok(())
    }
}

fn header() -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_LEN as usize);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&JOURNAL_FORMAT.to_be_bytes());
    header
}

/// Intact records and the number of bytes they span.
fn parse_records(mut rest: &[u8]) -> (Vec<Vec<u8>>, usize) {
    let mut out = Vec::new();
    let mut used = 0;
    while rest.len() >= 8 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]);
        // No record is empty: zeros (a hole a power cut left where a write
        // did not land) would otherwise pass as one, crc32("") being 0.
        if len == 0 || len > MAX_RECORD as usize || rest.len() < 8 + len {
            break;
        }
        let payload = &rest[8..8 + len];
        if crc32fast::hash(payload) != crc {
            break;
        }
        out.push(payload.to_vec());
        used += 8 + len;
        rest = &rest[8 + len..];
    }
    (out, used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::io::Write;

    fn io(dir: &std::path::Path) -> Guarded {
        let disk = crate::store::io::DiskIo::open(dir).unwrap();
        Guarded::new(Box::new(disk), dir.to_path_buf())
    }

    #[test]
    fn records_survive_reopen_and_torn_tail_is_cut() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("journal");
        let io = io(tmp.path());
        let (mut j, recs) = Journal::open(&io, "journal").unwrap();
        assert!(recs.is_empty());
        j.append(b"one").unwrap();
        j.append(b"two").unwrap();
        drop(j);
        // A torn third record.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[0, 0, 0, 9, 1, 2]).unwrap();
        drop(f);
        let (mut j, recs) = Journal::open(&io, "journal").unwrap();
        assert_eq!(recs, vec![b"one".to_vec(), b"two".to_vec()]);
        j.append(b"three").unwrap();
        drop(j);
        let (mut j, recs) = Journal::open(&io, "journal").unwrap();
        assert_eq!(recs.len(), 3);
        j.reset().unwrap();
        drop(j);
        let (_, recs) = Journal::open(&io, "journal").unwrap();
        assert!(recs.is_empty());
    }

    #[test]
    fn foreign_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("journal");
        std::fs::write(&path, b"something else entirely").unwrap();
        let io = io(tmp.path());
        assert!(matches!(
            Journal::open(&io, "journal"),
            Err(StoreError::DamagedJournal { .. })
        ));
    }
}
