//! The journal: an append-only file of records written before each
//! non-durable index commit, so that a killed daemon loses nothing it
//! acknowledged. After each durable index commit the journal is emptied.
//!
//! Layout: header `CHRNJRNL` ‖ format u32, then records
//! `length u32 ‖ crc32 u32 ‖ payload`. Replay stops at the first record
//! that is cut short or fails its checksum (the tail of a crash).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::StoreError;

const MAGIC: &[u8; 8] = b"CHRNJRNL";
pub const JOURNAL_FORMAT: u32 = 1;
const HEADER_LEN: u64 = 12;
const MAX_RECORD: u32 = 1 << 30;

pub struct Journal {
    path: PathBuf,
    file: File,
}

impl Journal {
    /// Opens (creating if needed) the journal and returns it with the
    /// payloads of the intact records it holds.
    pub fn open(path: &Path) -> Result<(Journal, Vec<Vec<u8>>), StoreError> {
        let io = |source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let mut journal = Journal {
            path: path.to_path_buf(),
            file,
        };
        if bytes.is_empty() {
            journal.reset()?;
            return Ok((journal, Vec::new()));
        }
        if bytes.len() < HEADER_LEN as usize || &bytes[..8] != MAGIC {
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: "not a chronofs journal".into(),
            });
        }
        let format = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if format != JOURNAL_FORMAT {
            return Err(StoreError::UnsupportedFormat {
                path: path.to_path_buf(),
                found: u64::from(format),
                supported: JOURNAL_FORMAT,
            });
        }
        let (records, intact_len) = parse_records(&bytes[HEADER_LEN as usize..]);
        // Cut a torn tail so new records follow the last intact one.
        let end = HEADER_LEN + intact_len as u64;
        journal.file.set_len(end).map_err(io)?;
        journal.file.seek(SeekFrom::Start(end)).map_err(io)?;
        Ok((journal, records))
    }

    fn io_err(&self, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Appends one record. One write(2): after it returns, the record
    /// survives a kill of the daemon (not a power cut; see `sync`).
    pub fn append(&mut self, payload: &[u8]) -> Result<(), StoreError> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|l| *l <= MAX_RECORD)
            .ok_or_else(|| StoreError::Index("journal record too large".into()))?;
        let mut rec = Vec::with_capacity(8 + payload.len());
        rec.extend_from_slice(&len.to_be_bytes());
        rec.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
        rec.extend_from_slice(payload);
        let start = self.file.stream_position().map_err(|e| self.io_err(e))?;
        if let Err(e) = self.file.write_all(&rec) {
            let _ = self.file.set_len(start);
            let _ = self.file.seek(SeekFrom::Start(start));
            return Err(self.io_err(e));
        }
        Ok(())
    }

    /// Empties the journal (its records are durable in the index).
    pub fn reset(&mut self) -> Result<(), StoreError> {
        self.file.set_len(0).map_err(|e| self.io_err(e))?;
        self.file
            .seek(SeekFrom::Start(0))
            .map_err(|e| self.io_err(e))?;
        let mut header = Vec::with_capacity(HEADER_LEN as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&JOURNAL_FORMAT.to_be_bytes());
        self.file.write_all(&header).map_err(|e| self.io_err(e))
    }
}

/// Intact records and the number of bytes they span.
fn parse_records(mut rest: &[u8]) -> (Vec<Vec<u8>>, usize) {
    let mut out = Vec::new();
    let mut used = 0;
    while rest.len() >= 8 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > MAX_RECORD as usize || rest.len() < 8 + len {
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

    #[test]
    fn records_survive_reopen_and_torn_tail_is_cut() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("journal");
        let (mut j, recs) = Journal::open(&path).unwrap();
        assert!(recs.is_empty());
        j.append(b"one").unwrap();
        j.append(b"two").unwrap();
        drop(j);
        // A torn third record.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[0, 0, 0, 9, 1, 2]).unwrap();
        drop(f);
        let (mut j, recs) = Journal::open(&path).unwrap();
        assert_eq!(recs, vec![b"one".to_vec(), b"two".to_vec()]);
        j.append(b"three").unwrap();
        drop(j);
        let (mut j, recs) = Journal::open(&path).unwrap();
        assert_eq!(recs.len(), 3);
        j.reset().unwrap();
        drop(j);
        let (_, recs) = Journal::open(&path).unwrap();
        assert!(recs.is_empty());
    }

    #[test]
    fn foreign_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("journal");
        std::fs::write(&path, b"something else entirely").unwrap();
        assert!(matches!(
            Journal::open(&path),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
