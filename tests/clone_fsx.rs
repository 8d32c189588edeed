//! fsx (the classic file-system exerciser) on a clone's file, through a
//! real mount: `t/data` (3 MiB and a bit of random bytes) and `t/other`
//! are made before the mount, `chronofs clone t c` copies them, and
//! thousands of random operations then run on `c/data` through the
//! mount: pread and pwrite at random offsets and lengths (across and past
//! EOF), ftruncate up and down, reads and writes through MAP_SHARED
//! mappings (writes followed by msync), fallocate (plain, and
//! PUNCH_HOLE|KEEP_SIZE), copy_file_range from another file in the mount
//! (the source's `t/other` or the clone's `c/other`, which still reads
//! its base), fsync, and closing and reopening the file. Each operation's
//! outcome is checked against an in-memory model of the file: the range
//! it touched and the size after each one; the whole file (and, where the
//! source directory is reachable, the backing file after fsync) every
//! 100 operations and at the end, and again after a remount.
//!
//! * `fsx_on_a_clone`: the clone's file alone.
//! * `fsx_on_a_clone_and_its_source`: operations interleaved on the
//!   source's `t/data` and the clone's `c/data`, two models; after each
//!   the same range is read from both, so neither ever shows the other's
//!   bytes. The first operations change the source (under an open write
//!   descriptor) while the clone's file still shows its base, read
//!   through a read-only descriptor (all reads of the clone go through
//!   it).
//! * `fsx_through_a_reader_opened_on_the_base`: a read-only descriptor is
//!   opened (and read) while the clone's file still shows its base, then
//!   another descriptor writes; every read goes through the first one,
//!   which must see each write.
//!
//! An operation the mount refuses with EOPNOTSUPP (fallocate,
//! copy_file_range) is skipped and counted in the summary each run
//! prints.
//!
//! Environment: `CHRONOFS_FSX_SEED` (decimal or 0x-hex; default a fixed
//! seed per test, printed on failure), `CHRONOFS_FSX_OPS` (default 3000
//! per pass; the reader variant runs a third of them).

#![deny(unsafe_code)]

mod common;

use common::sys::Mmap;
use common::*;

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The size of the file that is cloned (not a multiple of a page).
const BASE_LEN: usize = (3 << 20) + 4321;
/// The size of the files copy_file_range copies from.
const OTHER_LEN: usize = (1 << 20) + 17;
/// No operation makes the file larger than this.
const MAX_FILE: u64 = 6 << 20;
/// The longest read, write, copy or mapping access.
const MAX_IO: u64 = 256 << 10;
/// The whole file is compared every this many operations.
const CHECK_EVERY: usize = 100;
/// Operations remembered for a failure's report.
const LOG_LEN: usize = 40;

// ---------------------------------------------------------------------------
// A read-only shared mapping: the one raw call this file makes itself
// (read-write mappings are `common::sys::Mmap`).

#[allow(unsafe_code)]
mod map {
    use std::ffi::c_void;
    use std::os::fd::AsRawFd;
    use std::ptr::NonNull;

    /// A `PROT_READ`, `MAP_SHARED` mapping of a file's first `len` bytes,
    /// unmapped on drop. Bytes are only ever copied out of it.
    pub struct ReadMap {
        ptr: NonNull<c_void>,
        len: usize,
    }

    impl ReadMap {
        pub fn new(fd: &impl AsRawFd, len: usize) -> Result<ReadMap, i32> {
            // SAFETY: with a NULL hint the kernel picks an address range
            // that overlaps no existing mapping, so no memory Rust uses is
            // affected.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1));
            }
            let ptr = NonNull::new(p).ok_or(libc::ENOMEM)?;
            Ok(ReadMap { ptr, len })
        }

        /// A copy of `len` bytes at `off` (panics outside the mapping).
        pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
            assert!(
                off.checked_add(len).is_some_and(|end| end <= self.len),
                "read({off}, {len}) outside a {}-byte mapping",
                self.len
            );
            let mut out = vec![0u8; len];
            // SAFETY: the source range lies inside the live mapping
            // (checked above) and within the file's size (the caller maps
            // no more than the file holds and nothing truncates it while
            // mapped), so no page access faults; no Rust reference into the
            // mapping exists, and `out` is a separate allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.ptr.as_ptr().cast::<u8>().add(off),
                    out.as_mut_ptr(),
                    len,
                )
            };
            out
        }
    }

    impl Drop for ReadMap {
        fn drop(&mut self) {
            // SAFETY: the range is exactly the live mapping, owned by `self`.
            unsafe { libc::munmap(self.ptr.as_ptr(), self.len) };
        }
    }
}

/// An `Fd` as the mapping wants it.
struct Raw<'a>(&'a Fd);

impl std::os::fd::AsRawFd for Raw<'_> {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.raw()
    }
}

// ---------------------------------------------------------------------------
// A seeded generator (xorshift64*)

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut r = Rng((seed ^ 0x9E37_79B9_7F4A_7C15) | 1);
        for _ in 0..4 {
            r.next();
        }
        r
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }

    /// A length for an access: often small, sometimes up to `MAX_IO`.
    fn len(&mut self) -> u64 {
        match self.below(10) {
            0 => self.below(16) + 1,
            1..=5 => self.below(MAX_IO / 16) + 1,
            _ => self.below(MAX_IO) + 1,
        }
    }

    /// An offset for an access of `len` bytes to a file of `size`: mostly
    /// inside, sometimes straddling EOF, sometimes past it.
    fn offset(&mut self, size: u64, len: u64) -> u64 {
        let off = match self.below(10) {
            0 => size.saturating_sub(self.below(len + 1)),
            1 => size + self.below(MAX_IO),
            _ => self.below(size.max(1)),
        };
        off.min(MAX_FILE.saturating_sub(len))
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

fn seed(default: u64) -> u64 {
    env_u64("CHRONOFS_FSX_SEED").unwrap_or(default)
}

fn op_count() -> usize {
    env_u64("CHRONOFS_FSX_OPS").map_or(3000, |n| n as usize)
}

fn errname(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

// ---------------------------------------------------------------------------
// The files and their models

/// A file under test: its path, descriptors and expected content.
struct Target {
    name: &'static str,
    path: PathBuf,
    /// The file in the source directory, when the test can reach it (not
    /// when the mount covers its own source).
    backing: Option<PathBuf>,
    /// The read-write descriptor (opened at first use).
    rw: Option<Fd>,
    /// A read-only descriptor every read goes through, if set.
    reader: Option<Fd>,
    /// Opened for writing at some point: the backing file holds the bytes
    /// (a clone's file not yet opened so holds no bytes of its own).
    written: bool,
    model: Vec<u8>,
}

impl Target {
    fn new(m: &Mount, rel: &str, model: Vec<u8>) -> Target {
        let backing = (m.src != m.mnt).then(|| m.src.join(rel));
        Target {
            name: if rel.starts_with("t/") {
                "source"
            } else {
                "clone"
            },
            path: m.p(rel),
            backing,
            rw: None,
            reader: None,
            written: false,
            model,
        }
    }

    fn size(&self) -> u64 {
        self.model.len() as u64
    }

    fn open_rw(&mut self) -> Result<(), i32> {
        if self.rw.is_none() {
            self.rw = Some(Fd::open(&self.path, libc::O_RDWR, 0)?);
            self.written = true;
        }
        Ok(())
    }

    fn rw(&self) -> &Fd {
        self.rw.as_ref().expect("the read-write descriptor is open")
    }

    fn read_fd(&self) -> &Fd {
        self.reader.as_ref().unwrap_or_else(|| self.rw())
    }

    /// The model after writing `data` at `off` (zeros fill a gap).
    fn put(&mut self, off: u64, data: &[u8]) {
        let (off, end) = (off as usize, off as usize + data.len());
        if data.is_empty() {
            return;
        }
        if self.model.len() < end {
            self.model.resize(end, 0);
        }
        self.model[off..end].copy_from_slice(data);
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Read {
        off: u64,
        len: u64,
    },
    Write {
        off: u64,
        len: u64,
    },
    MapRead {
        off: u64,
        len: u64,
    },
    MapWrite {
        off: u64,
        len: u64,
    },
    Truncate {
        size: u64,
    },
    Fallocate {
        off: u64,
        len: u64,
    },
    PunchHole {
        off: u64,
        len: u64,
    },
    CopyRange {
        from: usize,
        off_in: u64,
        off: u64,
        len: u64,
    },
    Fsync,
    Reopen,
}

impl Op {
    fn kind(&self) -> &'static str {
        match self {
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::MapRead { .. } => "mapread",
            Op::MapWrite { .. } => "mapwrite",
            Op::Truncate { .. } => "truncate",
            Op::Fallocate { .. } => "fallocate",
            Op::PunchHole { .. } => "punch_hole",
            Op::CopyRange { .. } => "copy_range",
            Op::Fsync => "fsync",
            Op::Reopen => "reopen",
        }
    }
}

/// A file copy_file_range copies from.
struct Other {
    name: String,
    fd: Fd,
    data: Vec<u8>,
}

/// One fsx run: the generator, the log, what was done and skipped.
struct Fsx {
    test: &'static str,
    mode: String,
    seed: u64,
    rng: Rng,
    log: VecDeque<String>,
    done: BTreeMap<&'static str, usize>,
    unsupported: BTreeMap<&'static str, usize>,
    others: Vec<Other>,
}

impl Drop for Fsx {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "fsx {} [mode {}] FAILED with seed {:#x} (rerun: CHRONOFS_FSX_SEED={:#x}); \
                 the last operations:\n  {}",
                self.test,
                self.mode,
                self.seed,
                self.seed,
                Vec::from(self.log.clone()).join("\n  ")
            );
        }
    }
}

impl Fsx {
    fn new(test: &'static str, m: &Mount, seed: u64, others: &[&str]) -> Fsx {
        let others = others
            .iter()
            .map(|rel| Other {
                name: rel.to_string(),
                fd: Fd::open(&m.p(rel), libc::O_RDONLY, 0)
                    .unwrap_or_else(|e| panic!("open {rel}: {}", errname(e))),
                data: other_content(),
            })
            .collect();
        Fsx {
            test,
            mode: m.mode.clone(),
            seed,
            rng: Rng::new(seed),
            log: VecDeque::new(),
            done: BTreeMap::new(),
            unsupported: BTreeMap::new(),
            others,
        }
    }

    fn note(&mut self, line: String) {
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }

    fn fail(&self, what: String) -> ! {
        panic!(
            "fsx {} [mode {}], seed {:#x}: {what}",
            self.test, self.mode, self.seed
        )
    }

    /// A random operation on `t`; `writes`: whether it may change it.
    fn pick(&mut self, t: &Target, writes: bool) -> Op {
        let size = t.size();
        let r = &mut self.rng;
        loop {
            let op = match r.below(100) {
                0..=21 => {
                    let len = r.len();
                    Op::Read {
                        off: r.offset(size, len),
                        len,
                    }
                }
                22..=29 if size > 0 => {
                    let off = r.below(size);
                    let len = r.len().min(size - off);
                    Op::MapRead { off, len }
                }
                _ if !writes => continue,
                30..=54 => {
                    let len = r.len();
                    Op::Write {
                        off: r.offset(size, len),
                        len,
                    }
                }
                55..=62 if size > 0 => {
                    let off = r.below(size);
                    let len = r.len().min(size - off);
                    Op::MapWrite { off, len }
                }
                63..=70 => {
                    let size = match r.below(4) {
                        0 => r.below(size / 4 + 1),
                        1 => size + r.below(MAX_IO * 4),
                        _ => size.saturating_sub(MAX_IO) + r.below(MAX_IO * 2),
                    };
                    Op::Truncate {
                        size: size.min(MAX_FILE),
                    }
                }
                71..=75 => {
                    let len = r.len();
                    Op::Fallocate {
                        off: r.offset(size, len),
                        len,
                    }
                }
                76..=81 => {
                    let len = r.len();
                    Op::PunchHole {
                        off: r.offset(size, len),
                        len,
                    }
                }
                82..=91 if !self.others.is_empty() => {
                    let from = r.below(self.others.len() as u64) as usize;
                    let len = r.len();
                    Op::CopyRange {
                        from,
                        off_in: r.below(OTHER_LEN as u64 + 4096),
                        off: r.offset(size, len),
                        len,
                    }
                }
                92..=95 => Op::Fsync,
                96..=99 => Op::Reopen,
                _ => continue,
            };
            return op;
        }
    }

    /// Runs `op` on `t` and updates its model; returns the range to check
    /// afterwards (None: nothing changed).
    fn apply(&mut self, t: &mut Target, op: Op) -> Option<(u64, u64)> {
        let size_before = t.size();
        match op {
            Op::Read { off, len } => {
                self.check_range(t, off, off + len, "pread");
                None
            }
            Op::MapRead { off, len } => {
                let map = map::ReadMap::new(&Raw(t.read_fd()), size_before as usize)
                    .unwrap_or_else(|e| self.fail(format!("mmap {}: {}", t.name, errname(e))));
                let got = map.read(off as usize, len as usize);
                let want = &t.model[off as usize..(off + len) as usize];
                self.same(t, off, &got, want, "a read through a shared mapping");
                None
            }
            Op::Write { off, len } => {
                let data = self.rng.bytes(len as usize);
                let mut done = 0;
                while done < data.len() {
                    match t.rw().pwrite(&data[done..], (off as usize + done) as i64) {
                        Ok(0) => self.fail(format!("pwrite {}: wrote nothing", t.name)),
                        Ok(n) => done += n,
                        Err(e) => self.fail(format!("pwrite {}: {}", t.name, errname(e))),
                    }
                }
                t.put(off, &data);
                Some((off, off + len))
            }
            Op::MapWrite { off, len } => {
                let data = self.rng.bytes(len as usize);
                let mut map = Mmap::shared_rw(t.rw(), size_before as usize).unwrap_or_else(|e| {
                    self.fail(format!("mmap (read-write) {}: {}", t.name, errname(e)))
                });
                map.write_at(off as usize, &data);
                if let Err(e) = map.msync() {
                    self.fail(format!("msync {}: {}", t.name, errname(e)));
                }
                if let Err(e) = map.unmap() {
                    self.fail(format!("munmap {}: {}", t.name, errname(e)));
                }
                t.put(off, &data);
                Some((off, off + len))
            }
            Op::Truncate { size } => {
                if let Err(e) = t.rw().ftruncate(size as i64) {
                    self.fail(format!("ftruncate {} to {size}: {}", t.name, errname(e)));
                }
                t.model.resize(size as usize, 0);
                let (lo, hi) = (size.min(size_before), size.max(size_before));
                Some((lo.saturating_sub(4096), hi + 4096))
            }
            Op::Fallocate { off, len } | Op::PunchHole { off, len } => {
                let punch = matches!(op, Op::PunchHole { .. });
                let mode = if punch {
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
                } else {
                    0
                };
                match t.rw().fallocate(mode, off as i64, len as i64) {
                    Ok(()) => {}
                    Err(libc::EOPNOTSUPP) => {
                        *self.unsupported.entry(op.kind()).or_default() += 1;
                        return None;
                    }
                    Err(e) => self.fail(format!("{op:?} on {}: {}", t.name, errname(e))),
                }
                let end = off + len;
                if punch {
                    let (lo, hi) = (off.min(size_before), end.min(size_before));
                    t.model[lo as usize..hi as usize].fill(0);
                } else if end > size_before {
                    t.model.resize(end as usize, 0);
                }
                Some((off, end))
            }
            Op::CopyRange {
                from,
                off_in,
                off,
                len,
            } => {
                let other = &self.others[from];
                let (mut i, mut o) = (off_in as i64, off as i64);
                let copied =
                    common::sys::copy_file_range(&other.fd, &mut i, t.rw(), &mut o, len as usize);
                let n = match copied {
                    Ok(n) => n as u64,
                    Err(libc::EOPNOTSUPP) | Err(libc::EXDEV) => {
                        *self.unsupported.entry(op.kind()).or_default() += 1;
                        return None;
                    }
                    Err(e) => self.fail(format!(
                        "copy_file_range {} -> {}: {}",
                        other.name,
                        t.name,
                        errname(e)
                    )),
                };
                let available = (other.data.len() as u64).saturating_sub(off_in).min(len);
                if n > available || (n == 0 && available > 0) {
                    self.fail(format!(
                        "copy_file_range {} -> {}: copied {n} bytes, {available} available",
                        other.name, t.name
                    ));
                }
                if (i, o) != ((off_in + n) as i64, (off + n) as i64) {
                    self.fail(format!(
                        "copy_file_range moved the offsets to ({i}, {o}), not by {n}"
                    ));
                }
                if n > 0 {
                    let data = other.data[off_in as usize..(off_in + n) as usize].to_vec();
                    t.put(off, &data);
                }
                Some((off, off + len))
            }
            Op::Fsync => {
                if let Err(e) = t.rw().fsync() {
                    self.fail(format!("fsync {}: {}", t.name, errname(e)));
                }
                None
            }
            Op::Reopen => {
                t.rw = None;
                if let Err(e) = t.open_rw() {
                    self.fail(format!("reopen {}: {}", t.name, errname(e)));
                }
                Some((0, 0))
            }
        }
    }

    /// `t`'s bytes in `lo..hi` (to its end) are the model's.
    fn check_range(&self, t: &Target, lo: u64, hi: u64, how: &str) {
        let got = t
            .read_fd()
            .pread((hi - lo) as usize, lo as i64)
            .unwrap_or_else(|e| self.fail(format!("pread {}: {}", t.name, errname(e))));
        let (a, b) = (
            (lo as usize).min(t.model.len()),
            (hi as usize).min(t.model.len()),
        );
        self.same(t, lo, &got, &t.model[a..b], how);
    }

    fn same(&self, t: &Target, off: u64, got: &[u8], want: &[u8], how: &str) {
        if got == want {
            return;
        }
        let first = got.iter().zip(want).position(|(a, b)| a != b);
        let at = first.map_or(got.len().min(want.len()), |i| i) as u64 + off;
        let around = |v: &[u8]| {
            let i = (at - off) as usize;
            v.get(i..(i + 8).min(v.len())).unwrap_or(&[]).to_vec()
        };
        self.fail(format!(
            "{} ({how}) differs from its model at {off}: got {} bytes, expected {}; \
             first difference at offset {at}: got {:02x?}, expected {:02x?} (size {})",
            t.name,
            got.len(),
            want.len(),
            around(got),
            around(want),
            t.size()
        ));
    }

    /// The size every way the kernel reports it.
    fn check_size(&self, t: &Target) {
        let st = t
            .read_fd()
            .try_fstat()
            .unwrap_or_else(|e| self.fail(format!("fstat {}: {}", t.name, errname(e))));
        if st.st_size as u64 != t.size() {
            self.fail(format!(
                "{}: fstat says {} bytes, the model {}",
                t.name,
                st.st_size,
                t.size()
            ));
        }
    }

    /// The whole file, its size by fstat and stat, and (after fsync) the
    /// backing file, once it was opened for writing.
    fn check_all(&self, t: &Target) {
        self.check_size(t);
        let size = stat(&t.path)
            .unwrap_or_else(|e| self.fail(format!("stat {}: {}", t.name, errname(e))))
            .st_size;
        if size as u64 != t.size() {
            self.fail(format!(
                "{}: stat says {size} bytes, the model {}",
                t.name,
                t.size()
            ));
        }
        self.check_range(t, 0, t.size() + 4096, "the whole file");
        let Some(backing) = t.backing.as_ref().filter(|_| t.written) else {
            return;
        };
        if let Some(fd) = &t.rw {
            if let Err(e) = fd.fsync() {
                self.fail(format!("fsync {}: {}", t.name, errname(e)));
            }
        }
        let on_disk = std::fs::read(backing)
            .unwrap_or_else(|e| self.fail(format!("read {}: {e}", backing.display())));
        self.same(t, 0, &on_disk, &t.model, "the backing file after fsync");
    }

    /// One operation on `targets[i]`, checked there and (for the same
    /// range) on every other target.
    fn step(&mut self, n: usize, targets: &mut [Target], i: usize, writes: bool) {
        let op = self.pick(&targets[i], writes);
        // A read goes through the reader where there is one: a clone's
        // file is opened for writing (and so materialised) only when
        // something writes it.
        let reads = matches!(op, Op::Read { .. } | Op::MapRead { .. });
        if !reads || targets[i].reader.is_none() {
            if let Err(e) = targets[i].open_rw() {
                self.fail(format!("open {}: {}", targets[i].name, errname(e)));
            }
        }
        self.note(format!(
            "#{n} {}: {op:?} (size {})",
            targets[i].name,
            targets[i].size()
        ));
        *self.done.entry(op.kind()).or_default() += 1;
        let touched = self.apply(&mut targets[i], op);
        self.check_size(&targets[i]);
        if let Some((lo, hi)) = touched {
            let (lo, hi) = (lo.saturating_sub(64), hi + 64);
            for (j, t) in targets.iter().enumerate() {
                if t.rw.is_some() || t.reader.is_some() {
                    let how = if j == i {
                        format!("after {}", op.kind())
                    } else {
                        format!("after {} on the {}", op.kind(), targets[i].name)
                    };
                    self.check_range(t, lo, hi, &how);
                }
            }
        }
        if (n + 1) % CHECK_EVERY == 0 {
            for t in targets
                .iter()
                .filter(|t| t.rw.is_some() || t.reader.is_some())
            {
                self.check_all(t);
            }
        }
    }

    fn summary(&self, ops: usize) {
        eprintln!(
            "fsx {} [mode {}]: seed {:#x}, {ops} operations {:?}; refused with EOPNOTSUPP: {:?}",
            self.test, self.mode, self.seed, self.done, self.unsupported
        );
    }
}

// ---------------------------------------------------------------------------
// Setup

fn base_content() -> Vec<u8> {
    Rng::new(0xba5e).bytes(BASE_LEN)
}

fn other_content() -> Vec<u8> {
    Rng::new(0x07e4).bytes(OTHER_LEN)
}

fn populate(src: &Path) {
    std::fs::create_dir(src.join("t")).unwrap();
    std::fs::write(src.join("t/data"), base_content()).unwrap();
    std::fs::write(src.join("t/other"), other_content()).unwrap();
}

/// `chronofs clone t c` in the mount.
fn clone_t(m: &Mount) {
    let out = Command::new(bin())
        .arg("clone")
        .arg(m.p("t"))
        .arg(m.p("c"))
        .output()
        .expect("run chronofs clone");
    assert!(
        out.status.success(),
        "chronofs clone: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        m.log_tail()
    );
}

/// Closes every descriptor, reopens each file and compares it whole; then
/// the same after a remount.
fn check_after_close(fx: &mut Fsx, m: &mut Mount, targets: &mut [Target]) {
    fx.others.clear();
    for t in targets.iter_mut() {
        t.reader = None;
        t.rw = None;
        t.reader = Some(
            Fd::open(&t.path, libc::O_RDONLY, 0)
                .unwrap_or_else(|e| fx.fail(format!("reopen {}: {}", t.name, errname(e)))),
        );
        fx.note(format!("closed and reopened {}", t.name));
        fx.check_all(t);
        t.reader = None;
    }
    {
        let _serial = history_mount_lock();
        m.remount();
    }
    for t in targets.iter_mut() {
        t.reader = Some(Fd::open(&t.path, libc::O_RDONLY, 0).unwrap_or_else(|e| {
            fx.fail(format!("open {} after a remount: {}", t.name, errname(e)))
        }));
        fx.note(format!("remounted, opened {}", t.name));
        fx.check_all(t);
        t.reader = None;
    }
}

// ---------------------------------------------------------------------------
// The tests

#[test]
fn fsx_on_a_clone() {
    each_versioning_mode_with(populate, |m| {
        clone_t(m);
        let ops = op_count();
        let mut fx = Fsx::new(
            "fsx_on_a_clone",
            m,
            seed(0xf5a_c10e),
            &["t/other", "c/other"],
        );
        let mut targets = [Target::new(m, "c/data", base_content())];
        for n in 0..ops {
            fx.step(n, &mut targets, 0, true);
        }
        fx.check_all(&targets[0]);
        check_after_close(&mut fx, m, &mut targets);
        // The source never saw any of it.
        let source = std::fs::read(m.p("t/data")).unwrap();
        assert!(source == base_content(), "the source's file changed");
        fx.summary(ops);
    });
}

#[test]
fn fsx_on_a_clone_and_its_source() {
    each_versioning_mode_with(populate, |m| {
        clone_t(m);
        let ops = op_count();
        let mut fx = Fsx::new(
            "fsx_on_a_clone_and_its_source",
            m,
            seed(0xf5a_b0f4),
            &["t/other", "c/other"],
        );
        let mut targets = [
            Target::new(m, "t/data", base_content()),
            Target::new(m, "c/data", base_content()),
        ];
        // The source changes first, under an open descriptor, before the
        // clone's file is opened for writing: it still shows its base,
        // read through a descriptor opened before any change (which
        // every read of the clone then goes through).
        let reader = Fd::open(&targets[1].path, libc::O_RDONLY, 0)
            .unwrap_or_else(|e| fx.fail(format!("open the clone's reader: {}", errname(e))));
        targets[1].reader = Some(reader);
        let first = 20.min(ops);
        for n in 0..first {
            fx.step(n, &mut targets, 0, true);
        }
        // Then both change, the clone only after a while: until then it is
        // read (its base) while the source changes, is closed (a version
        // boundary) and reopened.
        for n in first..ops {
            let i = fx.rng.below(2) as usize;
            fx.step(n, &mut targets, i, i == 0 || n >= ops / 10);
        }
        for t in &targets {
            fx.check_all(t);
        }
        check_after_close(&mut fx, m, &mut targets);
        fx.summary(ops);
    });
}

#[test]
fn fsx_through_a_reader_opened_on_the_base() {
    each_versioning_mode_with(populate, |m| {
        clone_t(m);
        let ops = op_count().div_ceil(3);
        let mut fx = Fsx::new(
            "fsx_through_a_reader_opened_on_the_base",
            m,
            seed(0xf5a_4ead),
            &["c/other"],
        );
        let mut target = Target::new(m, "c/data", base_content());
        // Opened, and read (some of it through a mapping), while the file
        // still shows its base.
        let reader = Fd::open(&target.path, libc::O_RDONLY, 0)
            .unwrap_or_else(|e| fx.fail(format!("open the reader: {}", errname(e))));
        target.reader = Some(reader);
        fx.check_range(&target, 0, 1 << 20, "the reader, before any write");
        fx.check_range(
            &target,
            BASE_LEN as u64 - 5000,
            BASE_LEN as u64 + 10,
            "its end",
        );
        let map = map::ReadMap::new(&Raw(target.read_fd()), BASE_LEN)
            .unwrap_or_else(|e| fx.fail(format!("mmap the reader: {}", errname(e))));
        let got = map.read(BASE_LEN - 70_000, 70_000);
        fx.same(
            &target,
            BASE_LEN as u64 - 70_000,
            &got,
            &target.model[BASE_LEN - 70_000..],
            "the reader's mapping",
        );
        drop(map);
        // Then written through another descriptor, read through the first.
        let mut targets = [target];
        for n in 0..ops {
            fx.step(n, &mut targets, 0, true);
        }
        fx.check_all(&targets[0]);
        check_after_close(&mut fx, m, &mut targets);
        fx.summary(ops);
    });
}

/// A file open for writing is cloned as of its last version boundary
/// (docs/ARCHITECTURE.md, "Clones", "The instant"): what was written
/// before its fsync, not what was written after.
#[test]
fn a_file_open_for_writing_is_cloned_as_of_its_last_fsync() {
    each_versioning_mode_with(populate, |m| {
        let mut fx = Fsx::new(
            "a_file_open_for_writing_is_cloned_as_of_its_last_fsync",
            m,
            seed(0xf5a_f5c),
            &[],
        );
        let mut source = Target::new(m, "t/data", base_content());
        let write = |fx: &mut Fsx, t: &mut Target, n: usize| {
            let len = fx.rng.len();
            let op = Op::Write {
                off: fx.rng.offset(t.size(), len),
                len,
            };
            fx.note(format!("#{n} source: {op:?} (size {})", t.size()));
            fx.apply(t, op);
        };
        if let Err(e) = source.open_rw() {
            fx.fail(format!("open the source: {}", errname(e)));
        }
        for n in 0..4 {
            write(&mut fx, &mut source, n);
        }
        if let Err(e) = source.rw().fsync() {
            fx.fail(format!("fsync the source: {}", errname(e)));
        }
        let synced = source.model.clone();
        for n in 4..8 {
            write(&mut fx, &mut source, n);
        }
        fx.note("chronofs clone t c".into());
        clone_t(m);
        let mut clone = Target::new(m, "c/data", synced);
        clone.reader = Some(
            Fd::open(&clone.path, libc::O_RDONLY, 0)
                .unwrap_or_else(|e| fx.fail(format!("open the clone: {}", errname(e)))),
        );
        fx.check_all(&clone);
        fx.check_all(&source);
        source.rw = None;
        fx.note("closed the source".into());
        fx.check_all(&clone);
        source.reader = Some(
            Fd::open(&source.path, libc::O_RDONLY, 0)
                .unwrap_or_else(|e| fx.fail(format!("reopen the source: {}", errname(e)))),
        );
        fx.check_all(&source);
    });
}
