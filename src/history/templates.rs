//! Templates (`chronofs template`): a name for a directory as it was at
//! one instant, from which working trees are made by clone. The instant
//! is a tag, `template:NAME`, so retention keeps it like any tag; the
//! path is kept beside it in a table of its own, written before the tag
//! and durably: a template exists when both do, so a crash between the
//! two leaves a path record no one reads (the next `create` of that name
//! overwrites it).

use redb::ReadableTable;

use super::tables::{err, TEMPLATES};
use super::{read_txn, History, HistoryError, Result};

/// The tag that pins template `name`'s instant.
pub fn tag_of(name: &str) -> String {
    format!("template:{name}")
}

/// The first byte of a template record: its format.
const RECORD_FORMAT: u8 = 1;

fn encode(path: &[Vec<u8>]) -> Result<Vec<u8>> {
    let mut out = vec![RECORD_FORMAT];
    let body = postcard::to_allocvec(path)
        .map_err(|e| HistoryError::Corrupt(format!("template record: {e}")))?;
    out.extend_from_slice(&body);
    Ok(out)
}

fn decode(name: &str, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    match bytes.split_first() {
        Some((&RECORD_FORMAT, body)) => postcard::from_bytes(body)
            .map_err(|e| HistoryError::Corrupt(format!("template '{name}': {e}"))),
        Some((f, _)) => Err(HistoryError::Corrupt(format!(
            "template '{name}' has record format {f}, which this build does not know"
        ))),
        None => Err(HistoryError::Corrupt(format!("template '{name}' is empty"))),
    }
}

impl History {
    /// Records (durably) that template `name` is the tree at `path`
    /// (components from the mount's root), or forgets it (`None`).
    pub fn set_template_path(&self, name: &str, path: Option<&[Vec<u8>]>) -> Result<()> {
        let txn = self.db().begin_write().map_err(err)?;
        {
            let mut t = txn.open_table(TEMPLATES).map_err(err)?;
            match path {
                Some(p) => t.insert(name, encode(p)?.as_slice()).map_err(err)?,
                None => t.remove(name).map_err(err)?,
            };
        }
        txn.commit().map_err(err)?;
        Ok(())
    }

    /// Template `name`'s path, if its record exists (its tag is checked
    /// by the caller).
    pub fn template_path(&self, name: &str) -> Result<Option<Vec<Vec<u8>>>> {
        let txn = read_txn(self.db())?;
        let t = match txn.open_table(TEMPLATES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        let Some(v) = t.get(name).map_err(err)? else {
            return Ok(None);
        };
        decode(name, v.value()).map(Some)
    }

    /// Every template record, by name.
    pub fn template_paths(&self) -> Result<Vec<(String, Vec<Vec<u8>>)>> {
        let txn = read_txn(self.db())?;
        let t = match txn.open_table(TEMPLATES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(err(e)),
        };
        let mut out = Vec::new();
        for e in t.iter().map_err(err)? {
            let (k, v) = e.map_err(err)?;
            let name = k.value().to_string();
            let path = decode(&name, v.value())?;
            out.push((name, path));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_an_unknown_format_is_refused() {
        let p = vec![b"srv".to_vec(), b"rootfs".to_vec()];
        let bytes = encode(&p).unwrap();
        assert_eq!(bytes[0], RECORD_FORMAT);
        assert_eq!(decode("t", &bytes).unwrap(), p);
        let mut other = bytes.clone();
        other[0] = 9;
        assert!(decode("t", &other).is_err());
        assert!(decode("t", &[]).is_err());
    }
}
