//! The live-union stress test's workload (tests/union_live_stress.rs):
//! self-describing records, writers that keep a model of their files,
//! readers that check what they see. What each may see is said there.

use crate::common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};

pub const WRITERS: u32 = 4;
/// A file past this size is replaced rather than appended to.
const MAX_FILE: usize = 256 << 10;

pub fn stress_seed() -> u64 {
    std::env::var("CHRONOFS_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(17)
}

/// splitmix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, stream: u64) -> Rng {
        Rng(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F))
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

// --- Content: self-describing records ------------------------------------

/// Record `seq` of `lineage` by `writer`: `R<w>.<l>.<s>.<len>:<payload>\n`,
/// its payload a function of the three, so a reader recomputes it.
pub fn record(writer: u32, lineage: u32, seq: u32) -> Vec<u8> {
    let mut r = Rng::new(
        (writer as u64) << 40 | (lineage as u64) << 20 | seq as u64,
        7,
    );
    let len = if r.chance(5) {
        8192 + r.below(40_000)
    } else {
        1 + r.below(1500)
    } as usize;
    let mut v = format!("R{writer}.{lineage}.{seq}.{len}:").into_bytes();
    v.extend((0..len).map(|_| b'a' + r.below(26) as u8));
    v.push(b'\n');
    v
}

/// Checks what a reader saw of a file of `writer` (module doc); the number
/// of whole records and whether a partial one ends it.
pub fn check_content(data: &[u8], writer: u32) -> Result<(usize, bool), String> {
    let (mut off, mut n) = (0, 0);
    let mut last: Option<(u32, u32)> = None;
    while off < data.len() {
        let rest = &data[off..];
        let header_end = rest.iter().take(48).position(|&b| b == b':');
        let Some(colon) = header_end else {
            let header_chars = rest.iter().all(|b| b"R0123456789.".contains(b));
            if rest.len() < 48 && rest[0] == b'R' && header_chars {
                return Ok((n, true));
            }
            return Err(format!("no record header at byte {off}"));
        };
        let fields: Vec<u32> = std::str::from_utf8(&rest[1..colon])
            .ok()
            .filter(|_| rest[0] == b'R')
            .map(|h| h.split('.').filter_map(|f| f.parse().ok()).collect())
            .unwrap_or_default();
        let [w, l, s, _len] = fields[..] else {
            return Err(format!("bad record header at byte {off}"));
        };
        if w != writer {
            return Err(format!("writer {w}'s record at byte {off} (foreign)"));
        }
        match last {
            Some((pl, ps)) if pl != l || s <= ps => {
                return Err(format!(
                    "record {l}.{s} at byte {off} follows {pl}.{ps} (mixed or out of order)"
                ))
            }
            _ => {}
        }
        let want = record(w, l, s);
        if rest.len() < want.len() {
            if want[..rest.len()] != *rest {
                return Err(format!("torn record {l}.{s} at byte {off}"));
            }
            return Ok((n, true));
        }
        if want[..] != rest[..want.len()] {
            return Err(format!("torn record {l}.{s} at byte {off}"));
        }
        off += want.len();
        last = Some((l, s));
        n += 1;
    }
    Ok((n, false))
}

// --- Shared state ----------------------------------------------------------

#[derive(Default)]
pub struct Shared {
    pub stop: AtomicBool,
    /// Writer operations attempted (the changer paces itself on them).
    pub ops: Mutex<u64>,
    pub progress: Condvar,
    pub failures: Mutex<Vec<String>>,
    /// Descriptors `--force` flips revoked, and the ESTALEs and short
    /// writes writers saw (at most one per revoked descriptor).
    pub revoked: AtomicU64,
    pub estale: AtomicU64,
}

impl Shared {
    pub fn fail(&self, what: String) {
        eprintln!("FAILURE: {what}");
        self.failures.lock().unwrap().push(what);
        self.halt();
    }
    /// Stops the run; under the lock the waiters check `stop` in, so no
    /// waiter misses it.
    pub fn halt(&self) {
        let _ops = self.ops.lock().unwrap();
        self.stop.store(true, Relaxed);
        self.progress.notify_all();
    }
    pub fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }
    /// Waits until writers have attempted `n` operations, or the run
    /// stops; the count then.
    pub fn wait_ops(&self, n: u64) -> u64 {
        let ops = self.ops.lock().unwrap();
        let ops = self
            .progress
            .wait_while(ops, |ops| *ops < n && !self.stopped())
            .unwrap();
        *ops
    }
    pub fn did_op(&self) {
        *self.ops.lock().unwrap() += 1;
        self.progress.notify_all();
    }
}

// --- Writers ----------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct FileModel {
    pub content: Vec<u8>,
    pub lineage: u32,
    pub next_seq: u32,
    /// The rest of a record a revoked write(2) cut short.
    pub pending: Vec<u8>,
}

/// What a writer knows it made: name (in `w<id>/`) → content.
pub type Model = BTreeMap<String, FileModel>;

#[derive(Default, Debug)]
pub struct WriterStats {
    pub ops: u64,
    pub bytes: u64,
    pub erofs: u64,
    pub estale: u64,
    pub short: u64,
    pub creates: u64,
    pub renames: u64,
    pub unlinks: u64,
    pub replaces: u64,
}

pub struct Writer {
    pub id: u32,
    pub dir: PathBuf,
    /// The branches, top first (to say where a failing name is).
    pub branches: Vec<PathBuf>,
    pub rng: Rng,
    pub files: Model,
    /// A descriptor kept open across operations (appends go through it),
    /// so changes meet open files.
    pub held: Option<(String, Fd)>,
    pub next_name: u32,
    pub next_lineage: u32,
    pub stats: WriterStats,
    pub shared: Arc<Shared>,
}

/// How an operation ended short of success.
pub enum Stop {
    /// EROFS or ESTALE, counted: the writer goes on.
    Expected,
    Failed(String),
}

pub type OpResult = Result<(), Stop>;

impl Writer {
    pub fn run(mut self) -> (Model, WriterStats) {
        while !self.shared.stopped() {
            let r = self.one_op();
            self.stats.ops += 1;
            if let Err(Stop::Failed(what)) = r {
                self.shared.fail(format!("writer {}: {what}", self.id));
            }
            self.shared.did_op();
        }
        self.held = None;
        (self.files, self.stats)
    }

    fn one_op(&mut self) -> OpResult {
        let pick = self.rng.below(100);
        if self.files.len() < 3 || pick < 20 {
            return self.create();
        }
        let name = self.any_name();
        match pick {
            20..=54 => self.append(&name),
            55..=64 => self.replace(&name),
            65..=77 => self.rename(&name),
            78..=85 => self.unlink(&name),
            _ => self.hold(&name),
        }
    }

    fn any_name(&mut self) -> String {
        let i = self.rng.below(self.files.len() as u64) as usize;
        self.files.keys().nth(i).unwrap().clone()
    }

    fn fresh_name(&mut self) -> String {
        self.next_name += 1;
        format!("f{}", self.next_name)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Classifies a failed call: `expected` errnos are counted.
    fn errno(&mut self, call: &str, name: &str, e: Errno, expected: &[i32]) -> Stop {
        if !expected.contains(&e) {
            let rel = format!("w{}/{name}", self.id);
            return Stop::Failed(format!(
                "{call} {name}: {} [branches: {}]",
                errstr(e),
                copies(&self.branches, &rel)
            ));
        }
        match e {
            libc::EROFS => self.stats.erofs += 1,
            libc::ESTALE => {
                self.stats.estale += 1;
                self.shared.estale.fetch_add(1, Relaxed);
            }
            _ => {}
        }
        Stop::Expected
    }

    /// Writes `count` records to `fd` (after the rest of one cut short),
    /// each into the model as far as it was written.
    fn write_records(&mut self, fd: &Fd, name: &str, count: u32) -> OpResult {
        let pending = std::mem::take(&mut self.files.get_mut(name).unwrap().pending);
        if !pending.is_empty() {
            self.write_chunk(fd, name, pending, true)?;
        }
        for _ in 0..count {
            let f = self.files.get_mut(name).unwrap();
            let rec = record(self.id, f.lineage, f.next_seq);
            f.next_seq += 1;
            self.write_chunk(fd, name, rec, false)?;
        }
        if self.rng.chance(50) {
            if let Err(e) = fd.fsync() {
                return Err(self.errno("fsync", name, e, &[libc::ESTALE]));
            }
        }
        Ok(())
    }

    /// One write(2) of `chunk`. A short one is a write whose descriptor a
    /// `--force` flip revoked while the kernel was sending it in several
    /// requests: what it wrote stays, the rest is written (through another
    /// descriptor) before the file's next record. A failed write leaves
    /// `chunk` to be written later if it is such a rest (`rest`).
    fn write_chunk(&mut self, fd: &Fd, name: &str, chunk: Vec<u8>, rest: bool) -> OpResult {
        match fd.write(&chunk) {
            Ok(n) => {
                let f = self.files.get_mut(name).unwrap();
                f.content.extend_from_slice(&chunk[..n]);
                self.stats.bytes += n as u64;
                if n == chunk.len() {
                    return Ok(());
                }
                eprintln!(
                    "writer {}: short write to {name}: {n} of {}, ending at {} (page offset {})",
                    self.id,
                    chunk.len(),
                    f.content.len(),
                    f.content.len() % 4096
                );
                f.pending = chunk[n..].to_vec();
                self.stats.short += 1;
                self.shared.estale.fetch_add(1, Relaxed);
                Err(Stop::Expected)
            }
            Err(e) => {
                let stop = self.errno("write", name, e, &[libc::ESTALE]);
                if rest {
                    self.files.get_mut(name).unwrap().pending = chunk;
                }
                Err(stop)
            }
        }
    }

    /// A new file of fresh content: `w<id>/<name>`.
    fn create_named(&mut self, name: &str) -> OpResult {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        let fd = Fd::open(&self.path(name), flags, 0o644)
            .map_err(|e| self.errno("create", name, e, &[libc::EROFS]))?;
        self.next_lineage += 1;
        self.files.insert(
            name.to_string(),
            FileModel {
                content: Vec::new(),
                lineage: self.id * 100_000 + self.next_lineage,
                next_seq: 0,
                pending: Vec::new(),
            },
        );
        let count = 1 + self.rng.below(3) as u32;
        self.write_records(&fd, name, count)
    }

    fn create(&mut self) -> OpResult {
        let name = self.fresh_name();
        self.stats.creates += 1;
        self.create_named(&name)
    }

    fn append(&mut self, name: &str) -> OpResult {
        if self.files[name].content.len() > MAX_FILE {
            return self.replace(name);
        }
        let count = 1 + self.rng.below(2) as u32;
        if let Some((held, fd)) = self.held.take() {
            if held == name {
                let r = self.write_records(&fd, name, count);
                if r.is_ok() {
                    self.held = Some((held, fd));
                }
                return r;
            }
            self.held = Some((held, fd));
        }
        let fd = self.open_append(name)?;
        self.write_records(&fd, name, count)
    }

    fn open_append(&mut self, name: &str) -> Result<Fd, Stop> {
        Fd::open(&self.path(name), libc::O_WRONLY | libc::O_APPEND, 0)
            .map_err(|e| self.errno("open", name, e, &[libc::EROFS]))
    }

    /// Keeps `name` open for appending across operations.
    fn hold(&mut self, name: &str) -> OpResult {
        self.held = None;
        let fd = self.open_append(name)?;
        self.held = Some((name.to_string(), fd));
        Ok(())
    }

    fn drop_held(&mut self, name: &str) {
        if self.held.as_ref().is_some_and(|(h, _)| h == name) {
            self.held = None;
        }
    }

    /// Renames `name` to a fresh name; a held descriptor of it stays
    /// open (its appends follow the file).
    fn rename(&mut self, name: &str) -> OpResult {
        let to = self.fresh_name();
        if let Err(e) = fs::rename(self.path(name), self.path(&to)) {
            return Err(self.errno("rename", name, raw(e), &[libc::EROFS]));
        }
        self.stats.renames += 1;
        let f = self.files.remove(name).unwrap();
        self.files.insert(to.clone(), f);
        if let Some((held, _)) = self.held.as_mut() {
            if held == name {
                *held = to;
            }
        }
        Ok(())
    }

    fn unlink(&mut self, name: &str) -> OpResult {
        self.drop_held(name);
        if let Err(e) = fs::remove_file(self.path(name)) {
            return Err(self.errno("unlink", name, raw(e), &[libc::EROFS]));
        }
        self.stats.unlinks += 1;
        self.files.remove(name);
        Ok(())
    }

    /// Rewrites `name` the safe way: a new file renamed over it.
    fn replace(&mut self, name: &str) -> OpResult {
        let tmp = self.fresh_name();
        self.create_named(&tmp)?;
        self.drop_held(name);
        if let Err(e) = fs::rename(self.path(&tmp), self.path(name)) {
            return Err(self.errno("rename", &tmp, raw(e), &[libc::EROFS]));
        }
        self.stats.replaces += 1;
        let f = self.files.remove(&tmp).unwrap();
        self.files.insert(name.to_string(), f);
        Ok(())
    }
}

pub fn raw(e: std::io::Error) -> Errno {
    e.raw_os_error().unwrap_or(-1)
}

pub fn errstr(e: Errno) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

// --- Readers ----------------------------------------------------------------

#[derive(Default, Debug)]
pub struct ReaderStats {
    pub reads: u64,
    pub bytes: u64,
    pub vanished: u64,
    pub partial_tails: u64,
    pub listings: u64,
}

pub fn read_all(p: &Path) -> Result<Vec<u8>, Errno> {
    let fd = Fd::open(p, libc::O_RDONLY, 0)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match fd.read(&mut buf)? {
            0 => return Ok(out),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

pub fn is_writer_name(n: &str) -> bool {
    n.strip_prefix('f')
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

pub fn reader(m: Arc<Mount>, shared: Arc<Shared>, statics: Arc<Vec<(String, Vec<u8>)>>, id: u64) {
    let mut rng = Rng::new(stress_seed(), 1000 + id);
    let mut st = ReaderStats::default();
    let mut seen = 0;
    while !shared.stopped() {
        // A round per writer operation at most: unpaced, two readers
        // re-reading cached files took most of the CPU from the writers.
        seen = shared.wait_ops(seen + 1);
        if let Err(what) = read_round(&m, &mut rng, &statics, &mut st) {
            shared.fail(format!("reader {id}: {what}"));
        }
    }
    eprintln!("reader {id}: {st:?}");
}

pub fn read_round(
    m: &Mount,
    rng: &mut Rng,
    statics: &[(String, Vec<u8>)],
    st: &mut ReaderStats,
) -> Result<(), String> {
    let (name, want) = &statics[rng.below(statics.len() as u64) as usize];
    match read_all(&m.p(name)) {
        Ok(got) if got == *want => {}
        Ok(got) => return Err(format!("{name}: {} bytes, not its own", got.len())),
        Err(e) => return Err(format!("{name}: {}", errstr(e))),
    }
    let w = rng.below(WRITERS as u64) as u32;
    let dir = m.p(&format!("w{w}"));
    let listed = fs::read_dir(&dir)
        .and_then(|rd| {
            rd.map(|e| e.map(|e| e.file_name()))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| format!("listing w{w}: {e}"))?;
    st.listings += 1;
    let names: Vec<String> = listed
        .iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    let unique: BTreeSet<&String> = names.iter().collect();
    if unique.len() != names.len() {
        return Err(format!("w{w} lists a name twice: {names:?}"));
    }
    if let Some(odd) = names.iter().find(|n| !is_writer_name(n)) {
        return Err(format!("w{w} lists {odd:?}"));
    }
    for _ in 0..names.len().min(4) {
        let n = &names[rng.below(names.len() as u64) as usize];
        let data = match read_all(&dir.join(n)) {
            Ok(d) => d,
            Err(libc::ENOENT) => {
                st.vanished += 1;
                continue;
            }
            Err(e) => return Err(format!("read w{w}/{n}: {}", errstr(e))),
        };
        let (_, partial) = check_content(&data, w).map_err(|e| format!("w{w}/{n}: {e}"))?;
        st.reads += 1;
        st.bytes += data.len() as u64;
        st.partial_tails += partial as u64;
    }
    Ok(())
}

/// Where `rel` is in each branch: its size, "whiteout", or "-".
pub fn copies(branches: &[PathBuf], rel: &str) -> String {
    branches
        .iter()
        .map(|b| match lstat(&b.join(rel)) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFCHR => "whiteout".to_string(),
            Ok(st) => st.st_size.to_string(),
            Err(_) => "-".to_string(),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}
