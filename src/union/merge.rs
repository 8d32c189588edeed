//! Merging the listings of a directory's layers into one, with offsets
//! that survive a reopen.

// Interim versions for the vfs integration; replaced by the full module.

/// The position of `name` in a merged listing: a 63-bit hash, at least 2
/// (0 is the start, 1 is `..`).
pub fn cookie_of(name: &[u8]) -> i64 {
    let h = blake3::hash(name);
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    ((u64::from_le_bytes(b) >> 1) as i64).max(2)
}

/// Index of the first entry at or after `offset`.
pub fn seek(cookies: impl Iterator<Item = i64>, offset: i64) -> usize {
    let mut n = 0;
    for c in cookies {
        if c >= offset {
            return n;
        }
        n += 1;
    }
    n
}
