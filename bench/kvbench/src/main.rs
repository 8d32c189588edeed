//! kvbench: redb 4.x vs fjall 3.x for the chronofs persistent inode map.
//!
//! Usage:
//!   kvbench redb|fjall [datadir]          full benchmark, one engine per process
//!   kvbench crashtest redb|fjall [datadir] kill -9 a durable writer mid-stream, verify on reopen
//!   (internal) kvbench crashchild redb|fjall <dir>

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Keys per run: 200k for the recorded figures; `KVBENCH_KEYS` makes the
/// smoke run in CI (bench/smoke) small.
fn n() -> usize {
    static KEYS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *KEYS.get_or_init(|| {
        std::env::var("KVBENCH_KEYS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&k: &usize| k >= BRANCHES * (20_000 + SCAN_LEN)) // the scan reads j in 20k..30k
            .unwrap_or(200_000)
    })
}
const BATCH: usize = 256;
const BRANCHES: usize = 4;
fn per_branch() -> usize {
    n() / BRANCHES // 50_000 by default
}
const DEV: u64 = 0x803; // a typical st_dev
const DURABLE_SINGLE: usize = 2_000; // extra: durable commit per insert, small sample
const SCAN_LEN: usize = 10_000;
const SCAN_REPS: usize = 20;

type Key = [u8; 20];

fn key(branch: u32, dev: u64, ino: u64) -> Key {
    let mut k = [0u8; 20];
    k[0..4].copy_from_slice(&branch.to_be_bytes());
    k[4..12].copy_from_slice(&dev.to_be_bytes());
    k[12..20].copy_from_slice(&ino.to_be_bytes());
    k
}

/// i-th existing key: 4 branches x 50k inodes, inode numbers spaced by 2 (gaps = misses).
fn key_of(i: usize) -> Key {
    let b = (i / per_branch()) as u32;
    let j = (i % per_branch()) as u64;
    key(b, DEV, 1000 + 2 * j)
}
/// i-th missing key: falls in the gaps inside the populated range (no key-range pruning possible).
fn missing_key_of(i: usize) -> Key {
    let b = (i / per_branch()) as u32;
    let j = (i % per_branch()) as u64;
    key(b, DEV, 1000 + 2 * j + 1)
}
fn val_of(i: usize) -> u64 {
    i as u64 + 1
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut r = Rng(seed);
    for i in (1..n).rev() {
        let j = r.below(i + 1);
        v.swap(i, j);
    }
    v
}
fn random_idx(n: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut r = Rng(seed);
    (0..count).map(|_| r.below(n)).collect()
}

fn vm_hwm_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    for l in s.lines() {
        if let Some(rest) = l.strip_prefix("VmHWM:") {
            return rest.trim().trim_end_matches("kB").trim().parse().unwrap();
        }
    }
    0
}

/// (apparent bytes, allocated bytes) of a file or directory tree.
fn disk_usage(p: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::symlink_metadata(p).unwrap();
    if md.is_dir() {
        let mut a = (0, 0);
        for e in std::fs::read_dir(p).unwrap() {
            let (x, y) = disk_usage(&e.unwrap().path());
            a.0 += x;
            a.1 += y;
        }
        a
    } else {
        (md.len(), md.blocks() * 512)
    }
}
fn count_files(p: &Path) -> usize {
    if p.is_dir() {
        std::fs::read_dir(p).unwrap().map(|e| count_files(&e.unwrap().path())).sum()
    } else {
        1
    }
}

fn us_per(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

struct Report {
    engine: &'static str,
    lines: Vec<(String, String)>,
}
impl Report {
    fn add(&mut self, k: &str, v: String) {
        println!("[{}] {:<58} {}", self.engine, k, v);
        std::io::stdout().flush().ok();
        self.lines.push((k.to_string(), v));
    }
}

// ---------------------------------------------------------------- redb
mod rb {
    use super::*;
    use redb::{Database, Durability, ReadableDatabase, ReadableTableMetadata, TableDefinition};

    pub const INODES: TableDefinition<[u8; 20], u64> = TableDefinition::new("inodes");

    pub fn open(path: &Path) -> Database {
        let db = Database::create(path).unwrap();
        // make sure the table exists
        let tx = db.begin_write().unwrap();
        tx.open_table(INODES).unwrap();
        tx.commit().unwrap();
        db
    }

    pub fn insert_batched_durable(db: &Database, order: &[usize]) {
        for chunk in order.chunks(BATCH) {
            let tx = db.begin_write().unwrap(); // Durability::Immediate is the default
            {
                let mut t = tx.open_table(INODES).unwrap();
                for &i in chunk {
                    t.insert(key_of(i), val_of(i)).unwrap();
                }
            }
            tx.commit().unwrap();
        }
    }

    pub fn insert_single_nondurable(db: &Database, order: &[usize]) -> Duration {
        for &i in order {
            let mut tx = db.begin_write().unwrap();
            tx.set_durability(Durability::None).unwrap();
            {
                let mut t = tx.open_table(INODES).unwrap();
                t.insert(key_of(i), val_of(i)).unwrap();
            }
            tx.commit().unwrap();
        }
        let t0 = Instant::now();
        let tx = db.begin_write().unwrap(); // Immediate: makes all previous None commits durable
        tx.commit().unwrap();
        t0.elapsed()
    }

    pub fn insert_single_durable(db: &Database, idx: impl Iterator<Item = usize>) {
        for i in idx {
            let tx = db.begin_write().unwrap();
            {
                let mut t = tx.open_table(INODES).unwrap();
                t.insert(key_of(i), val_of(i)).unwrap();
            }
            tx.commit().unwrap();
        }
    }

    /// one read transaction for all lookups
    pub fn lookups_one_txn(db: &Database, keys: &[Key]) -> usize {
        let rtx = db.begin_read().unwrap();
        let t = rtx.open_table(INODES).unwrap();
        let mut found = 0;
        for k in keys {
            if let Some(v) = t.get(k).unwrap() {
                found += (v.value() != 0) as usize;
            }
        }
        found
    }
    /// begin_read + open_table per lookup (what a FUSE lookup() handler would do)
    pub fn lookups_txn_each(db: &Database, keys: &[Key]) -> usize {
        let mut found = 0;
        for k in keys {
            let rtx = db.begin_read().unwrap();
            let t = rtx.open_table(INODES).unwrap();
            if let Some(v) = t.get(k).unwrap() {
                found += (v.value() != 0) as usize;
            }
        }
        found
    }

    pub fn scan(db: &Database, lo: &Key, hi: &Key) -> (usize, u64) {
        let rtx = db.begin_read().unwrap();
        let t = rtx.open_table(INODES).unwrap();
        let mut n = 0;
        let mut sum = 0u64;
        for r in t.range::<[u8; 20]>(*lo..*hi).unwrap() {
            let (k, v) = r.unwrap();
            assert_eq!(&k.value()[..12], &lo[..12]);
            sum = sum.wrapping_add(v.value());
            n += 1;
        }
        (n, sum)
    }

    pub fn count(db: &Database) -> u64 {
        let rtx = db.begin_read().unwrap();
        let t = rtx.open_table(INODES).unwrap();
        t.len().unwrap()
    }
}

// ---------------------------------------------------------------- fjall
mod fj {
    use super::*;
    use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

    pub fn open(path: &Path) -> (Database, Keyspace) {
        let db = Database::builder(path).open().unwrap();
        let ks = db.keyspace("inodes", KeyspaceCreateOptions::default).unwrap();
        (db, ks)
    }

    pub fn insert_batched_durable(db: &Database, ks: &Keyspace, order: &[usize]) {
        for chunk in order.chunks(BATCH) {
            let mut b = db.batch().durability(Some(PersistMode::SyncAll));
            for &i in chunk {
                b.insert(ks, &key_of(i)[..], &val_of(i).to_be_bytes()[..]);
            }
            b.commit().unwrap();
        }
    }

    /// per-insert journal write to OS buffers (default PersistMode::Buffer, no fsync)
    pub fn insert_single_nondurable(db: &Database, ks: &Keyspace, order: &[usize]) -> Duration {
        for &i in order {
            ks.insert(&key_of(i)[..], &val_of(i).to_be_bytes()[..]).unwrap();
        }
        let t0 = Instant::now();
        db.persist(PersistMode::SyncAll).unwrap();
        t0.elapsed()
    }

    pub fn insert_single_durable(db: &Database, ks: &Keyspace, idx: impl Iterator<Item = usize>) {
        for i in idx {
            let mut b = db.batch().durability(Some(PersistMode::SyncAll));
            b.insert(ks, &key_of(i)[..], &val_of(i).to_be_bytes()[..]);
            b.commit().unwrap();
        }
    }

    pub fn lookups(ks: &Keyspace, keys: &[Key]) -> usize {
        let mut found = 0;
        for k in keys {
            if let Some(v) = ks.get(k).unwrap() {
                let v = u64::from_be_bytes(v[..8].try_into().unwrap());
                found += (v != 0) as usize;
            }
        }
        found
    }

    pub fn scan(ks: &Keyspace, lo: &Key, hi: &Key) -> (usize, u64) {
        let mut n = 0;
        let mut sum = 0u64;
        for g in ks.range::<Key, _>(lo..hi) {
            let (k, v) = g.into_inner().unwrap();
            assert_eq!(&k[..12], &lo[..12]);
            sum = sum.wrapping_add(u64::from_be_bytes(v[..8].try_into().unwrap()));
            n += 1;
        }
        (n, sum)
    }

    pub fn count(ks: &Keyspace) -> u64 {
        ks.len().unwrap() as u64
    }
}

// ---------------------------------------------------------------- driver

fn fresh(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
}

fn bench(engine: &'static str, base: &Path) {
    let mut r = Report { engine, lines: vec![] };
    let dir_a = base.join(engine).join("a");
    let dir_b = base.join(engine).join("b");
    let dir_c = base.join(engine).join("c");
    fresh(&dir_a);
    fresh(&dir_b);
    fresh(&dir_c);
    let order = shuffled(n(), 42);
    let hit_idx = random_idx(n(), n(), 7);
    let hit_keys: Vec<Key> = hit_idx.iter().map(|&i| key_of(i)).collect();
    let hit_keys2: Vec<Key> = random_idx(n(), n(), 8).iter().map(|&i| key_of(i)).collect();
    let miss_keys: Vec<Key> = random_idx(n(), n(), 9).iter().map(|&i| missing_key_of(i)).collect();
    // 10k consecutive keys under prefix (branch 1, DEV): j in [20000, 30000)
    let scan_lo = key(1, DEV, 1000 + 2 * 20_000);
    let scan_hi = key(1, DEV, 1000 + 2 * 30_000);
    let expect_sum: u64 = (0..SCAN_LEN).map(|j| val_of(per_branch() + 20_000 + j)).sum();
    let nb = n().div_ceil(BATCH);

    // ---- 1. batched durable inserts
    let rpath_a = dir_a.join("db.redb");
    let t = match engine {
        "redb" => {
            let db = rb::open(&rpath_a);
            let t0 = Instant::now();
            rb::insert_batched_durable(&db, &order);
            let e = t0.elapsed();
            assert_eq!(rb::count(&db), n() as u64);
            e
        }
        _ => {
            let (db, ks) = fj::open(&dir_a);
            let t0 = Instant::now();
            fj::insert_batched_durable(&db, &ks, &order);
            let e = t0.elapsed();
            assert_eq!(fj::count(&ks), n() as u64);
            e
        }
    };
    r.add(
        "1. 200k inserts, 256/batch, fsync per batch: total",
        format!("{:.2} s  ({:.2} µs/insert, {:.2} ms/commit of {} commits)", t.as_secs_f64(), us_per(t, n()), t.as_secs_f64() * 1e3 / nb as f64, nb),
    );
    let (app, alloc) = disk_usage(&dir_a);
    r.add("6a. on-disk size after inserts (open, apparent/allocated)", format!("{:.2} MiB / {:.2} MiB, {} files", app as f64 / 1048576.0, alloc as f64 / 1048576.0, count_files(&dir_a)));
    r.add("   VmHWM after phase 1", format!("{} MiB", vm_hwm_kb() / 1024));

    // ---- 2. single-insert, non-durable commits + one final durable persist
    let (t, tfinal) = match engine {
        "redb" => {
            let db = rb::open(&dir_b.join("db.redb"));
            let t0 = Instant::now();
            let f = rb::insert_single_nondurable(&db, &order);
            let e = t0.elapsed();
            assert_eq!(rb::count(&db), n() as u64);
            (e, f)
        }
        _ => {
            let (db, ks) = fj::open(&dir_b);
            let t0 = Instant::now();
            let f = fj::insert_single_nondurable(&db, &ks, &order);
            let e = t0.elapsed();
            assert_eq!(fj::count(&ks), n() as u64);
            (e, f)
        }
    };
    r.add(
        "2. 200k inserts, 1 non-durable commit each + final persist",
        format!("{:.2} s  ({:.2} µs/insert; final durable persist {:.1} ms)", t.as_secs_f64(), us_per(t, n()), tfinal.as_secs_f64() * 1e3),
    );
    let _ = std::fs::remove_dir_all(&dir_b);

    // ---- 2b. (extra) durable commit per single insert, small sample
    let t = match engine {
        "redb" => {
            let db = rb::open(&dir_c.join("db.redb"));
            let t0 = Instant::now();
            rb::insert_single_durable(&db, order[..DURABLE_SINGLE].iter().copied());
            t0.elapsed()
        }
        _ => {
            let (db, ks) = fj::open(&dir_c);
            let t0 = Instant::now();
            fj::insert_single_durable(&db, &ks, order[..DURABLE_SINGLE].iter().copied());
            t0.elapsed()
        }
    };
    r.add("2b. (extra) 2k inserts, durable (fsync) commit each", format!("{:.1} µs/insert", us_per(t, DURABLE_SINGLE)));
    let _ = std::fs::remove_dir_all(&dir_c);

    // ---- 6. reopen + size after close
    let (app, alloc) = disk_usage(&dir_a);
    r.add("6b. on-disk size after close (apparent/allocated)", format!("{:.2} MiB / {:.2} MiB, {} files", app as f64 / 1048576.0, alloc as f64 / 1048576.0, count_files(&dir_a)));

    match engine {
        "redb" => {
            let t0 = Instant::now();
            let db = redb::Database::open(&rpath_a).unwrap();
            let e = t0.elapsed();
            let t1 = Instant::now();
            let n = rb::count(&db);
            r.add("6c. reopen time (open + first read txn)", format!("{:.2} ms (open {:.2} ms), {} keys", (e + t1.elapsed()).as_secs_f64() * 1e3, e.as_secs_f64() * 1e3, n));
            reads_redb(&mut r, &db, &hit_keys, &hit_keys2, &miss_keys, &scan_lo, &scan_hi, expect_sum);
        }
        _ => {
            let t0 = Instant::now();
            let (db, ks) = fj::open(&dir_a);
            let e = t0.elapsed();
            let t1 = Instant::now();
            let first = ks.get(key_of(0)).unwrap();
            assert!(first.is_some());
            r.add("6c. reopen time (open + first get)", format!("{:.2} ms (open {:.2} ms)", (e + t1.elapsed()).as_secs_f64() * 1e3, e.as_secs_f64() * 1e3));
            reads_fjall(&mut r, &ks, &hit_keys, &hit_keys2, &miss_keys, &scan_lo, &scan_hi, expect_sum);
            // after a memtable flush to SST (the steady state once the journal rotates)
            ks.rotate_memtable_and_wait().unwrap();
            r.add("   -- after flushing memtable to an SST (tables)", format!("{}", ks.table_count()));
            reads_fjall(&mut r, &ks, &hit_keys, &hit_keys2, &miss_keys, &scan_lo, &scan_hi, expect_sum);
            drop(ks);
            drop(db);
            let (app, alloc) = disk_usage(&dir_a);
            r.add("6d. on-disk size after flush+close (apparent/allocated)", format!("{:.2} MiB / {:.2} MiB, {} files", app as f64 / 1048576.0, alloc as f64 / 1048576.0, count_files(&dir_a)));
            let t0 = Instant::now();
            let (_db, ks) = fj::open(&dir_a);
            let e = t0.elapsed();
            let t1 = Instant::now();
            assert!(ks.get(key_of(0)).unwrap().is_some());
            r.add("6e. reopen time after flush (open + first get)", format!("{:.2} ms (open {:.2} ms)", (e + t1.elapsed()).as_secs_f64() * 1e3, e.as_secs_f64() * 1e3));
        }
    }
    r.add("7. peak RSS (VmHWM, whole process)", format!("{} MiB", vm_hwm_kb() / 1024));
}

fn two_threads<F: Fn(&[Key]) -> usize + Sync>(a: &[Key], b: &[Key], f: F) -> Duration {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let h1 = s.spawn(|| f(a));
        let h2 = s.spawn(|| f(b));
        assert_eq!(h1.join().unwrap(), a.len());
        assert_eq!(h2.join().unwrap(), b.len());
    });
    t0.elapsed()
}

#[allow(clippy::too_many_arguments)]
fn reads_redb(r: &mut Report, db: &redb::Database, hit: &[Key], hit2: &[Key], miss: &[Key], lo: &Key, hi: &Key, expect_sum: u64) {
    // warm-up
    assert_eq!(rb::lookups_one_txn(db, hit), n());
    let t0 = Instant::now();
    assert_eq!(rb::lookups_one_txn(db, hit), n());
    r.add("3a. 200k random hits, 1 thread, one read txn", format!("{:.3} µs/lookup", us_per(t0.elapsed(), n())));
    let t0 = Instant::now();
    assert_eq!(rb::lookups_txn_each(db, hit), n());
    r.add("3b. 200k random hits, 1 thread, begin_read per lookup", format!("{:.3} µs/lookup", us_per(t0.elapsed(), n())));
    let d = two_threads(hit, hit2, |k| rb::lookups_one_txn(db, k));
    r.add("3c. 2 threads x 200k hits, one txn/thread (wall)", format!("{:.3} µs/lookup/thread, {:.2} M lookups/s aggregate", us_per(d, n()), 2.0 * n() as f64 / d.as_secs_f64() / 1e6));
    let d = two_threads(hit, hit2, |k| rb::lookups_txn_each(db, k));
    r.add("3d. 2 threads x 200k hits, begin_read per lookup (wall)", format!("{:.3} µs/lookup/thread, {:.2} M lookups/s aggregate", us_per(d, n()), 2.0 * n() as f64 / d.as_secs_f64() / 1e6));
    let t0 = Instant::now();
    assert_eq!(rb::lookups_one_txn(db, miss), 0);
    r.add("4. 200k missing keys, 1 thread, one read txn", format!("{:.3} µs/lookup", us_per(t0.elapsed(), n())));
    let t0 = Instant::now();
    let (n, s) = rb::scan(db, lo, hi);
    let first = t0.elapsed();
    assert_eq!((n, s), (SCAN_LEN, expect_sum));
    let t0 = Instant::now();
    for _ in 0..SCAN_REPS {
        assert_eq!(rb::scan(db, lo, hi).0, SCAN_LEN);
    }
    r.add("5. range scan 10k keys under one prefix", format!("{:.3} ms warm avg ({:.3} ms first), {:.3} µs/key", t0.elapsed().as_secs_f64() * 1e3 / SCAN_REPS as f64, first.as_secs_f64() * 1e3, us_per(t0.elapsed(), SCAN_LEN * SCAN_REPS)));
}

#[allow(clippy::too_many_arguments)]
fn reads_fjall(r: &mut Report, ks: &fjall::Keyspace, hit: &[Key], hit2: &[Key], miss: &[Key], lo: &Key, hi: &Key, expect_sum: u64) {
    assert_eq!(fj::lookups(ks, hit), n());
    let t0 = Instant::now();
    assert_eq!(fj::lookups(ks, hit), n());
    r.add("3a. 200k random hits, 1 thread", format!("{:.3} µs/lookup", us_per(t0.elapsed(), n())));
    let d = two_threads(hit, hit2, |k| fj::lookups(ks, k));
    r.add("3c. 2 threads x 200k hits (wall)", format!("{:.3} µs/lookup/thread, {:.2} M lookups/s aggregate", us_per(d, n()), 2.0 * n() as f64 / d.as_secs_f64() / 1e6));
    let t0 = Instant::now();
    assert_eq!(fj::lookups(ks, miss), 0);
    r.add("4. 200k missing keys, 1 thread", format!("{:.3} µs/lookup", us_per(t0.elapsed(), n())));
    let t0 = Instant::now();
    let (n, s) = fj::scan(ks, lo, hi);
    let first = t0.elapsed();
    assert_eq!((n, s), (SCAN_LEN, expect_sum));
    let t0 = Instant::now();
    for _ in 0..SCAN_REPS {
        assert_eq!(fj::scan(ks, lo, hi).0, SCAN_LEN);
    }
    r.add("5. range scan 10k keys under one prefix", format!("{:.3} ms warm avg ({:.3} ms first), {:.3} µs/key", t0.elapsed().as_secs_f64() * 1e3 / SCAN_REPS as f64, first.as_secs_f64() * 1e3, us_per(t0.elapsed(), SCAN_LEN * SCAN_REPS)));
}

// ---------------------------------------------------------------- crash test

/// Child: durable 256-key batches forever, printing the number of acknowledged batches.
fn crash_child(engine: &str, dir: &Path) {
    let order = shuffled(n(), 1234);
    let mut out = std::io::stdout().lock();
    match engine {
        "redb" => {
            let db = rb::open(&dir.join("db.redb"));
            for (n, chunk) in order.chunks(BATCH).enumerate() {
                rb::insert_batched_durable(&db, chunk);
                writeln!(out, "{}", n + 1).unwrap();
                out.flush().unwrap();
            }
        }
        _ => {
            let (db, ks) = fj::open(dir);
            for (n, chunk) in order.chunks(BATCH).enumerate() {
                fj::insert_batched_durable(&db, &ks, chunk);
                writeln!(out, "{}", n + 1).unwrap();
                out.flush().unwrap();
            }
        }
    }
    std::thread::sleep(Duration::from_secs(60));
}

fn crash_test(engine: &str, base: &Path) {
    let exe = std::env::current_exe().unwrap();
    let delays: &[u64] = if engine == "redb" { &[300, 700, 1100, 1500, 1900] } else { &[60, 150, 250, 350, 450] };
    for (round, delay_ms) in delays.iter().enumerate() {
        let dir = base.join(engine).join(format!("crash{round}"));
        fresh(&dir);
        let mut child = Command::new(&exe)
            .args(["crashchild", engine, dir.to_str().unwrap()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut last = 0u64;
            for l in BufReader::new(stdout).lines() {
                last = l.unwrap().trim().parse().unwrap();
            }
            last
        });
        std::thread::sleep(Duration::from_millis(*delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let acked = reader.join().unwrap();
        let t0 = Instant::now();
        let count = match engine {
            "redb" => {
                let db = redb::Database::open(dir.join("db.redb")).unwrap();
                rb::count(&db)
            }
            _ => {
                let (_db, ks) = fj::open(&dir);
                fj::count(&ks)
            }
        };
        let rec = t0.elapsed();
        let batches = count / BATCH as u64;
        let nb = n().div_ceil(BATCH) as u64;
        let ok = (count == n() as u64 && acked == nb) || (count % BATCH as u64 == 0 && batches >= acked && batches <= acked + 1);
        println!(
            "[{engine}] crash round {round}: killed after {delay_ms} ms, acked batches {acked}, recovered keys {count} ({batches} batches), recovery open {:.1} ms -> {}",
            rec.as_secs_f64() * 1e3,
            if ok { "OK (atomic, no acked batch lost)" } else { "FAIL" }
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = |i: usize| PathBuf::from(args.get(i).cloned().unwrap_or_else(|| "/work/kvbench/data".into()));
    match args.get(1).map(String::as_str) {
        Some("redb") => bench("redb", &base(2)),
        Some("fjall") => bench("fjall", &base(2)),
        Some("crashtest") => crash_test(&args[2], &base(3)),
        Some("open") => {
            let p = Path::new(&args[3]);
            let t0 = Instant::now();
            if args[2] == "redb" {
                let db = rb::open(&p.join("db.redb"));
                println!("redb open {:.2} ms, {} keys", t0.elapsed().as_secs_f64() * 1e3, rb::count(&db));
            } else {
                let (_db, ks) = fj::open(p);
                println!("fjall open {:.2} ms, {} keys (approx)", t0.elapsed().as_secs_f64() * 1e3, ks.approximate_len());
            }
        }
        Some("crashchild") => crash_child(&args[2], Path::new(&args[3])),
        _ => {
            eprintln!("usage: kvbench redb|fjall [datadir] | crashtest redb|fjall [datadir]");
            std::process::exit(2);
        }
    }
}
