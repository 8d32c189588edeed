//! Live unions under load (issue 17's "branch add/remove/mode under a
//! running parallel workload loses nothing and leaves fsck clean"): writers
//! and readers run on a union mount while a changer keeps changing its
//! branches; afterwards every writer's model must be what the union shows,
//! before and after a remount, and fsck must be clean.
//!
//! Built for what exists: `branch mode` (lower branches and the upper one,
//! with and without `--force`). `branch add`/`remove` plug in as more
//! [`Change`] variants: one arm each in [`pick`] and [`apply`].
//!
//! Length: `CHRONOFS_STRESS_SECS` per configuration (default 60, the
//! issue's; tests/run-all sets 10 for CI, where the two configurations run
//! side by side in each of its two test passes: about 20 s a pass);
//! `CHRONOFS_STRESS_SEED` picks the workload (default 17). The seed fixes
//! each thread's choices, not the interleaving.
//!
//! What readers may see of a file `w<W>/<name>` while it changes: ENOENT
//! (renamed or removed meanwhile), or records of writer W only, all of one
//! lineage, whole and in increasing sequence, possibly followed by a prefix
//! of the next record (a write in flight). Anything else is torn or foreign
//! content. Files only grow in place (appends); a rewrite is a new file
//! renamed over the old, so a read sees one file's prefix however many
//! read calls it takes. What writers may see: EROFS from a call that needs
//! a writable branch (none may be); ESTALE from a descriptor that a
//! `--force` flip revoked, at most once per revoked descriptor (the writer
//! then drops it); or, seen once in many runs, a short write(2) instead
//! (the revocation came between the requests the kernel split it into):
//! what it wrote stays, and the writer completes the record later. A write
//! that returned is in the model: it reached its branch before any change
//! could (a change waits for writes in flight), so the union must show
//! exactly the model, byte for byte and name for name.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const WRITERS: u32 = 4;
const READERS: u32 = 2;
const LOWERS: usize = 2;
/// Files each writer owns in the lower branches at mount.
const PRESEEDED: u32 = 6;
/// The writer id of lower2's copies hidden under lower1's: a canary.
const SHADOW: u32 = 99;
/// Writer operations between two branch changes.
const OPS_PER_CHANGE: u64 = 12;
/// A file past this size is replaced rather than appended to.
const MAX_FILE: usize = 256 << 10;
/// Revocable handles only: under passthrough or the writeback cache
/// `--force` is refused (tests/union_live.rs covers those refusals).
const REVOCABLE: &str = "passthrough=off,writeback=off";

fn stress_secs() -> u64 {
    std::env::var("CHRONOFS_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}

fn stress_seed() -> u64 {
    std::env::var("CHRONOFS_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(17)
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        Rng(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

// --- Content: self-describing records ------------------------------------

/// Record `seq` of `lineage` by `writer`: `R<w>.<l>.<s>.<len>:<payload>\n`,
/// its payload a function of the three, so a reader recomputes it.
fn record(writer: u32, lineage: u32, seq: u32) -> Vec<u8> {
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
fn check_content(data: &[u8], writer: u32) -> Result<(usize, bool), String> {
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
struct Shared {
    stop: AtomicBool,
    /// Writer operations attempted (the changer paces itself on them).
    ops: Mutex<u64>,
    progress: Condvar,
    failures: Mutex<Vec<String>>,
    /// Descriptors `--force` flips revoked, and the ESTALEs and short
    /// writes writers saw (at most one per revoked descriptor).
    revoked: AtomicU64,
    estale: AtomicU64,
}

impl Shared {
    fn fail(&self, what: String) {
        eprintln!("FAILURE: {what}");
        self.failures.lock().unwrap().push(what);
        self.halt();
    }
    /// Stops the run; under the lock the waiters check `stop` in, so no
    /// waiter misses it.
    fn halt(&self) {
        let _ops = self.ops.lock().unwrap();
        self.stop.store(true, Relaxed);
        self.progress.notify_all();
    }
    fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }
    /// Waits until writers have attempted `n` operations, or the run
    /// stops; the count then.
    fn wait_ops(&self, n: u64) -> u64 {
        let ops = self.ops.lock().unwrap();
        let ops = self
            .progress
            .wait_while(ops, |ops| *ops < n && !self.stopped())
            .unwrap();
        *ops
    }
    fn did_op(&self) {
        *self.ops.lock().unwrap() += 1;
        self.progress.notify_all();
    }
}

// --- Writers ----------------------------------------------------------------

#[derive(Clone, Debug)]
struct FileModel {
    content: Vec<u8>,
    lineage: u32,
    next_seq: u32,
    /// The rest of a record a revoked write(2) cut short.
    pending: Vec<u8>,
}

/// What a writer knows it made: name (in `w<id>/`) → content.
type Model = BTreeMap<String, FileModel>;

#[derive(Default, Debug)]
struct WriterStats {
    ops: u64,
    bytes: u64,
    erofs: u64,
    estale: u64,
    short: u64,
    creates: u64,
    renames: u64,
    unlinks: u64,
    replaces: u64,
}

struct Writer {
    id: u32,
    dir: PathBuf,
    /// The branches, top first (to say where a failing name is).
    branches: Vec<PathBuf>,
    rng: Rng,
    files: Model,
    /// A descriptor kept open across operations (appends go through it),
    /// so changes meet open files.
    held: Option<(String, Fd)>,
    next_name: u32,
    next_lineage: u32,
    stats: WriterStats,
    shared: Arc<Shared>,
}

/// How an operation ended short of success.
enum Stop {
    /// EROFS or ESTALE, counted: the writer goes on.
    Expected,
    Failed(String),
}

type OpResult = Result<(), Stop>;

impl Writer {
    fn run(mut self) -> (Model, WriterStats) {
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

fn raw(e: std::io::Error) -> Errno {
    e.raw_os_error().unwrap_or(-1)
}

fn errstr(e: Errno) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

// --- Readers ----------------------------------------------------------------

#[derive(Default, Debug)]
struct ReaderStats {
    reads: u64,
    bytes: u64,
    vanished: u64,
    partial_tails: u64,
    listings: u64,
}

fn read_all(p: &Path) -> Result<Vec<u8>, Errno> {
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

fn is_writer_name(n: &str) -> bool {
    n.strip_prefix('f')
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

fn reader(m: Arc<Mount>, shared: Arc<Shared>, statics: Arc<Vec<(String, Vec<u8>)>>, id: u64) {
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

fn read_round(
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

// --- The changer -----------------------------------------------------------

/// One change of the branch set. `branch add`/`remove` go here when they
/// exist (then `pick` offers them and `apply` runs them; a removed branch
/// must be one the changer added and never made writable, or the writers'
/// models must learn which of their files went with it).
#[derive(Clone, Debug)]
enum Change {
    Mode { pos: usize, rw: bool, force: bool },
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Changed {
        revoked: u64,
    },
    Unchanged,
    /// Refused because files of the branch are open for writing.
    Busy,
}

#[derive(Default, Debug)]
struct ChangerStats {
    changed: u64,
    forced: u64,
    revoked: u64,
    unchanged: u64,
    busy: u64,
    all_read_only: u64,
    slowest_ms: u128,
    /// Changes (refusals included) that took over a second.
    over_1s: u64,
}

/// The next change, given every branch's mode (top first): mostly a flip,
/// sometimes a no-op; seldom one leaving no branch writable.
fn pick(rng: &mut Rng, modes: &[bool]) -> Change {
    loop {
        let pos = rng.below(modes.len() as u64) as usize;
        let rw = if rng.chance(85) {
            !modes[pos]
        } else {
            modes[pos]
        };
        let writable_after = (0..modes.len()).any(|i| if i == pos { rw } else { modes[i] });
        if writable_after || rng.chance(15) {
            let force = !rw && rng.chance(50);
            return Change::Mode { pos, rw, force };
        }
    }
}

fn apply(m: &Mount, change: &Change) -> Result<Outcome, String> {
    let Change::Mode { pos, rw, force } = change;
    let mnt = m.mnt.to_str().unwrap();
    let (pos_s, mode) = (pos.to_string(), if *rw { "rw" } else { "ro" });
    let mut args = vec!["branch", "mode", mnt, &pos_s, mode, "--json"];
    if *force {
        args.push("--force");
    }
    let out = chronofs_in(m.root(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if err.contains("open for writing") && !*force && !*rw {
            return Ok(Outcome::Busy);
        }
        return Err(format!("{change:?} failed: {err}"));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{change:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))?;
    if v["branch"]["mode"].as_str() != Some(mode) {
        return Err(format!("{change:?}: the reply says {v}"));
    }
    let revoked = v["revoked"].as_u64().unwrap_or(0);
    if revoked > 0 && !*force {
        return Err(format!("{change:?} revoked {revoked} handles unforced"));
    }
    Ok(match v["changed"].as_bool() {
        Some(true) => Outcome::Changed { revoked },
        _ => Outcome::Unchanged,
    })
}

/// Changes branches until `until`, each after OPS_PER_CHANGE writer
/// operations; the modes in force at the end.
fn changer(m: &Mount, shared: &Shared, until: Instant, st: &mut ChangerStats) -> Vec<bool> {
    let mut rng = Rng::new(stress_seed(), 2000);
    let mut modes: Vec<bool> = (0..=LOWERS).map(|i| i == 0).collect();
    let mut seen = 0;
    while !shared.stopped() {
        let now = Instant::now();
        if now >= until {
            break;
        }
        let ops = shared.ops.lock().unwrap();
        let ops = shared
            .progress
            .wait_timeout_while(ops, until - now, |n| {
                *n < seen + OPS_PER_CHANGE && !shared.stopped()
            })
            .unwrap()
            .0;
        seen = *ops;
        drop(ops);
        let change = pick(&mut rng, &modes);
        let t0 = Instant::now();
        let outcome = apply(m, &change);
        let took = t0.elapsed().as_millis();
        st.slowest_ms = st.slowest_ms.max(took);
        st.over_1s += (took > 1000) as u64;
        let Change::Mode { pos, rw, force } = change;
        match outcome {
            Ok(Outcome::Changed { revoked }) => {
                st.changed += 1;
                st.forced += force as u64;
                st.revoked += revoked;
                shared.revoked.fetch_add(revoked, Relaxed);
                modes[pos] = rw;
                st.all_read_only += !modes.iter().any(|&w| w) as u64;
            }
            Ok(Outcome::Unchanged) if modes[pos] == rw => st.unchanged += 1,
            Ok(Outcome::Unchanged) => {
                shared.fail(format!("{change:?}: unchanged, but the mode was not {rw}"))
            }
            Ok(Outcome::Busy) => st.busy += 1,
            Err(e) => shared.fail(e),
        }
    }
    modes
}

// --- Setup and verification --------------------------------------------------

/// Fills the branches (given top first): each writer's directory in both
/// lowers, PRESEEDED files of its own in lower1 and as many only in lower2,
/// lower2's copies of lower1's names holding SHADOW's records (they must
/// never show), and read-only files in `s/` nobody writes.
fn setup(b: &[PathBuf], models: &mut [Model], statics: &mut Vec<(String, Vec<u8>)>) {
    for (w, model) in models.iter_mut().enumerate() {
        let w = w as u32;
        for lower in &b[1..] {
            fs::create_dir_all(lower.join(format!("w{w}"))).unwrap();
        }
        for i in 0..2 * PRESEEDED {
            let name = format!("f{}", 1_000_000 + i);
            let lineage = w * 100_000 + 90_000 + i;
            let content: Vec<u8> = (0..1 + i % 3).flat_map(|s| record(w, lineage, s)).collect();
            let home = if i < PRESEEDED { &b[1] } else { &b[2] };
            write_file(&home.join(format!("w{w}/{name}")), &content);
            if i < PRESEEDED {
                write_file(&b[2].join(format!("w{w}/{name}")), &record(SHADOW, 1, 0));
            }
            model.insert(
                name,
                FileModel {
                    content,
                    lineage,
                    next_seq: 1 + i % 3,
                    pending: Vec::new(),
                },
            );
        }
    }
    for (i, lower) in b[1..].iter().enumerate() {
        fs::create_dir_all(lower.join("s")).unwrap();
        for j in 0..4 {
            let name = format!("s/l{i}-{j}");
            let data = pattern(100 + 3000 * j, (i * 10 + j) as u64);
            write_file(&lower.join(&name), &data);
            statics.push((name, data));
        }
    }
}

fn branches(m: &Mount) -> Vec<PathBuf> {
    let mut all = vec![m.src.clone()];
    all.extend(m.lowers.iter().cloned());
    all
}

/// Where `rel` is in each branch: its size, "whiteout", or "-".
fn copies(branches: &[PathBuf], rel: &str) -> String {
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

/// Every writer's model against the union: the same names, the same
/// bytes; read-only files unchanged.
fn verify(m: &Mount, models: &[Model], statics: &[(String, Vec<u8>)], when: &str) {
    let mut wrong = Vec::new();
    for (w, model) in models.iter().enumerate() {
        let shown: BTreeSet<String> = names(&m.p(&format!("w{w}"))).into_iter().collect();
        let want: BTreeSet<String> = model.keys().cloned().collect();
        for n in shown.difference(&want) {
            let rel = format!("w{w}/{n}");
            wrong.push(format!(
                "{rel}: shown, not made [{}]",
                copies(&branches(m), &rel)
            ));
        }
        for (n, f) in model {
            let rel = format!("w{w}/{n}");
            match fs::read(m.p(&rel)) {
                Ok(got) if got == f.content => {}
                Ok(got) => wrong.push(format!(
                    "{rel}: {} bytes ({:?}), model {} bytes [branches: {}]",
                    got.len(),
                    check_content(&got, w as u32),
                    f.content.len(),
                    copies(&branches(m), &rel)
                )),
                Err(e) => wrong.push(format!(
                    "{rel}: {e} [branches: {}]",
                    copies(&branches(m), &rel)
                )),
            }
        }
    }
    for (name, data) in statics {
        if fs::read(m.p(name)).ok().as_ref() != Some(data) {
            wrong.push(format!("{name}: changed"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{when}: {} file(s) differ from the writers' models (branches top first: src | lower1 | lower2):\n  {}\n{}",
        wrong.len(),
        wrong.iter().take(30).cloned().collect::<Vec<_>>().join("\n  "),
        m.log_tail()
    );
}

fn branch_list(m: &Mount) -> String {
    let mut spec = format!("{}=rw", m.src.display());
    for l in &m.lowers {
        spec.push_str(&format!(":{}=ro", l.display()));
    }
    spec
}

fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// fsck of the branches' union invariants and, with history, of the store.
fn fsck_clean(m: &Mount, history: bool) {
    let spec = branch_list(m);
    let out = chronofs_in(m.root(), &["fsck", &spec, "--json"]);
    assert_ok("fsck of the branch list", &out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["problems"].as_array().map(Vec::len), Some(0), "{v}");
    if history {
        let out = chronofs_in(m.root(), &["fsck", m.src.to_str().unwrap()]);
        assert_ok("fsck of the store", &out);
    }
}

/// History has versions of the writers' files, the newest their content.
fn history_light_check(m: &Mount, models: &[Model]) {
    for (w, model) in models.iter().enumerate() {
        for (n, f) in model.iter().rev().take(3) {
            let rel = format!("w{w}/{n}");
            let out = chronofs_in(&m.mnt, &["log", &rel, "--json"]);
            assert_ok(&format!("log {rel}"), &out);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let count = v["versions"].as_array().map_or(0, Vec::len);
            assert!(count > 0, "{rel}: no versions: {v}");
            let out = chronofs_in(&m.mnt, &["cat", &rel, "--version=0"]);
            assert_ok(&format!("cat {rel}"), &out);
            assert!(
                out.stdout == f.content,
                "{rel}: history's newest version ({} bytes) is not its content ({} bytes)",
                out.stdout.len(),
                f.content.len()
            );
        }
    }
}

fn modes_now(m: &Mount) -> Vec<bool> {
    let out = chronofs_in(
        m.root(),
        &["branch", "list", m.mnt.to_str().unwrap(), "--json"],
    );
    assert_ok("branch list", &out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["mode"] == "rw")
        .collect()
}

// --- The test -----------------------------------------------------------------

fn stress(opts: &str) {
    let history = !opts.split(',').any(|o| o == "plain");
    let secs = stress_secs();
    let mut models: Vec<Model> = vec![Model::new(); WRITERS as usize];
    let mut statics = Vec::new();
    let m = {
        let _serial = history_mount_lock();
        let m = Mount::union(opts, LOWERS, |b| setup(b, &mut models, &mut statics));
        if history {
            m.wait_history_ready();
        }
        m
    };
    eprintln!(
        "stress {opts:?}: {secs} s, seed {}, {WRITERS} writers, {READERS} readers",
        stress_seed()
    );
    let m_arc = Arc::new(m);
    let shared = Arc::new(Shared::default());
    let statics = Arc::new(statics);
    let writers: Vec<_> = models
        .iter()
        .enumerate()
        .map(|(w, model)| {
            let writer = Writer {
                id: w as u32,
                dir: m_arc.p(&format!("w{w}")),
                branches: branches(&m_arc),
                rng: Rng::new(stress_seed(), w as u64),
                files: model.clone(),
                held: None,
                next_name: 0,
                next_lineage: 0,
                stats: WriterStats::default(),
                shared: shared.clone(),
            };
            std::thread::spawn(move || writer.run())
        })
        .collect();
    let readers: Vec<_> = (0..READERS as u64)
        .map(|r| {
            let (m, shared, statics) = (m_arc.clone(), shared.clone(), statics.clone());
            std::thread::spawn(move || reader(m, shared, statics, r))
        })
        .collect();
    let mut cst = ChangerStats::default();
    let until = Instant::now() + Duration::from_secs(secs);
    let last_modes = changer(&m_arc, &shared, until, &mut cst);
    shared.halt();
    let mut totals = WriterStats::default();
    for (w, h) in writers.into_iter().enumerate() {
        let (model, st) = h.join().expect("a writer panicked");
        eprintln!("writer {w}: {} files, {st:?}", model.len());
        totals.ops += st.ops;
        totals.estale += st.estale + st.short;
        models[w] = model;
    }
    for h in readers {
        h.join().expect("a reader panicked");
    }
    eprintln!("changer ({opts}): {cst:?}");
    let failures = shared.failures.lock().unwrap().clone();
    let mut m = Arc::try_unwrap(m_arc).unwrap_or_else(|_| panic!("mount still shared"));
    assert!(
        failures.is_empty(),
        "{} failure(s) during the run:\n  {}\n{}",
        failures.len(),
        failures.join("\n  "),
        m.log_tail()
    );
    assert!(
        totals.estale <= shared.revoked.load(Relaxed),
        "{} ESTALE or short writes seen, {} descriptors revoked",
        totals.estale,
        shared.revoked.load(Relaxed)
    );
    assert!(cst.changed > 0 && totals.ops > 0, "nothing happened");
    assert_eq!(modes_now(&m), last_modes, "the modes in force");
    verify(&m, &models, &statics, "mounted, after the run");
    if history {
        history_light_check(&m, &models);
    }
    {
        let _serial = history_mount_lock();
        m.unmount();
    }
    fsck_clean(&m, history);
    {
        let _serial = history_mount_lock();
        m.start();
    }
    assert_eq!(modes_now(&m), last_modes, "the modes after a remount");
    verify(&m, &models, &statics, "after a remount");
    let _serial = history_mount_lock();
    m.unmount();
}

#[test]
fn branch_modes_change_under_writers_and_readers_without_history() {
    stress(&format!("plain,{REVOCABLE}"));
}

#[test]
fn branch_modes_change_under_writers_and_readers_with_history() {
    stress(REVOCABLE);
}
