//! zstd with one compression and one decompression context per thread.
//!
//! Making a context allocates and clears its tables: a daemon profiled
//! during sqlite commits spent 12 % of its time in `ZSTD_createDCtx` and
//! `ZSTD_createCCtx`, one pair per chunk. A context reused across chunks
//! must be able to reference each chunk's prefix (its delta base), which
//! zstd-safe ties to the context's lifetime; the unsafe part is only the
//! shortening of that lifetime for one frame, here.

use std::cell::RefCell;
use std::io;

use zstd::zstd_safe::{CCtx, CParameter, DCtx, ResetDirective};

thread_local! {
    static CCTX: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
    static DCTX: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

fn zstd_error(code: usize) -> io::Error {
    io::Error::other(zstd::zstd_safe::get_error_name(code))
}

/// Compresses `data` at `level` into a new frame; with `prefix`, as a
/// raw-content reference (never parsed as a dictionary, whatever its
/// first bytes), so content shared with it costs a few bytes per match.
pub fn compress(data: &[u8], prefix: Option<&[u8]>, level: i32) -> io::Result<Vec<u8>> {
    CCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let ctx = slot.get_or_insert_with(CCtx::create);
        // Whatever an earlier frame left (a panic between its prefix and
        // its reset) goes before this one starts.
        ctx.reset(ResetDirective::SessionAndParameters)
            .map_err(zstd_error)?;
        // SAFETY: the context references `prefix` only for the frame
        // compressed below (zstd drops a prefix after one frame), and the
        // reset after it (and the one before every use) unloads it, so the
        // 'static context never holds the borrow past this call.
        let short: &mut CCtx<'_> =
            unsafe { std::mem::transmute::<&mut CCtx<'static>, &mut CCtx<'_>>(ctx) };
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
        let result = short
            .set_parameter(CParameter::CompressionLevel(level))
            .and_then(|_| match prefix {
                Some(p) => short.ref_prefix(p).map(|_| ()),
                None => Ok(()),
            })
            .and_then(|()| short.compress2(&mut out, data));
        let _ = short.reset(ResetDirective::SessionAndParameters);
        result.map(|_| out).map_err(zstd_error)
    })
}

/// Decompresses one frame of `len` bytes, made with `prefix` if it was.
pub fn decompress(frame: &[u8], prefix: Option<&[u8]>, len: usize) -> io::Result<Vec<u8>> {
    DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let ctx = slot.get_or_insert_with(DCtx::create);
        ctx.reset(ResetDirective::SessionAndParameters)
            .map_err(zstd_error)?;
        // SAFETY: as in `compress`: the prefix is referenced for this one
        // frame and unloaded by the reset after it, before the borrow ends.
        let short: &mut DCtx<'_> =
            unsafe { std::mem::transmute::<&mut DCtx<'static>, &mut DCtx<'_>>(ctx) };
        let mut out = Vec::with_capacity(len);
        let result = match prefix {
            Some(p) => short.ref_prefix(p).map(|_| ()),
            None => Ok(()),
        }
        .and_then(|()| short.decompress(&mut out, frame));
        let _ = short.reset(ResetDirective::SessionAndParameters);
        match result {
            Ok(n) if n == len => Ok(out),
            Ok(n) => Err(io::Error::other(format!(
                "decompressed to {n} bytes, expected {len}"
            ))),
            Err(code) => Err(zstd_error(code)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_with_and_without_a_prefix_on_one_context() {
        let base: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i * 7).to_le_bytes())
            .collect();
        let mut edited = base.clone();
        edited[5_000..5_010].copy_from_slice(b"0123456789");
        // A prefix that starts with zstd's dictionary magic is still raw.
        let mut magic = vec![0x37, 0xa4, 0x30, 0xec];
        magic.extend_from_slice(&base[..50_000]);
        for _ in 0..3 {
            let plain = compress(&edited, None, 3).unwrap();
            assert_eq!(decompress(&plain, None, edited.len()).unwrap(), edited);
            let delta = compress(&edited, Some(&base), 3).unwrap();
            assert!(
                delta.len() < plain.len() / 10,
                "{} {}",
                delta.len(),
                plain.len()
            );
            assert_eq!(
                decompress(&delta, Some(&base), edited.len()).unwrap(),
                edited
            );
            let m = compress(&edited, Some(&magic), 3).unwrap();
            assert_eq!(decompress(&m, Some(&magic), edited.len()).unwrap(), edited);
            // A frame made with a prefix cannot be read without it, and
            // the failure leaves the context usable.
            assert!(decompress(&delta, None, edited.len()).is_err());
            assert!(decompress(&plain, None, 3).is_err());
        }
    }
}
