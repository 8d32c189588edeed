//! A simulated store directory for power-cut tests: an in-memory file
//! system that serves reads from its "page cache" (everything written) and
//! records every write, truncate, fsync and directory change, so that a
//! test can build the images a power cut could leave at any point
//! (LazyFS's model; redb's and fjall's crash tests).
//!
//! What survives a power cut, in an image built at log position `k`:
//! - file bytes: every write and truncate followed (before `k`) by a
//!   successful fsync of that file; each later one kept or dropped at
//!   random, the last kept write possibly torn. Writes pending when an
//!   fsync failed are lost for good (the kernel marks their pages clean).
//! - names: every creation and removal followed by an fsync of its
//!   directory; of the others, a random prefix (file system journals keep
//!   metadata in order).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use super::io::{Create, StoreFile, StoreIo};

#[derive(Clone, Debug)]
enum Event {
    Write { id: u64, off: u64, data: Vec<u8> },
    SetLen { id: u64, len: u64 },
    Sync { id: u64 },
    SyncFailed { id: u64 },
    Link { name: String, id: u64 },
    Unlink { name: String },
    Rename { from: String, to: String },
    Mkdir { name: String },
    SyncDir { dir: String },
}

#[derive(Default)]
struct State {
    files: HashMap<u64, Vec<u8>>,
    names: BTreeMap<String, u64>,
    dirs: BTreeSet<String>,
    log: Vec<Event>,
    next_id: u64,
    /// fsyncs (of files and directories) so far, and the one that fails.
    syncs: u64,
    fail_sync: Option<u64>,
    /// [`Sim::set_full`].
    full: bool,
}

/// The simulated directory; clones share it.
#[derive(Clone, Default)]
pub struct Sim {
    state: Arc<Mutex<State>>,
}

/// A small deterministic generator (xorshift64*), so a seed replays.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

fn parent(name: &str) -> &str {
    name.rsplit_once('/').map_or("", |(p, _)| p)
}

impl Sim {
    pub fn new() -> Sim {
        Sim::default()
    }

    /// Events recorded so far: crash points are `0..=log_len()`.
    pub fn log_len(&self) -> usize {
        self.state.lock().log.len()
    }

    /// Log positions just after each successful fsync.
    pub fn sync_points(&self) -> Vec<usize> {
        let st = self.state.lock();
        st.log
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Sync { .. } | Event::SyncDir { .. }))
            .map(|(i, _)| i + 1)
            .collect()
    }

    /// While `full`, every growth of a file fails with ENOSPC (a disk
    /// with no block left, where blocks a file has can still be
    /// overwritten, as on ext4 and XFS).
    pub fn set_full(&self, full: bool) {
        self.state.lock().full = full;
    }

    fn check_room(&self) -> io::Result<()> {
        match self.state.lock().full {
            true => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            false => Ok(()),
        }
    }

    /// Makes the `n`th fsync from now on fail with EIO (1 = the next one).
    pub fn fail_sync_after(&self, n: u64) {
        let mut st = self.state.lock();
        st.fail_sync = Some(st.syncs + n);
    }

    /// The directory a kill -9 leaves now: every write kept (the page
    /// cache survives), synced or not; a fresh simulation.
    pub fn kill_image(&self) -> Sim {
        let st = self.state.lock();
        let image = State {
            files: st.files.clone(),
            names: st.names.clone(),
            dirs: st.dirs.clone(),
            next_id: st.next_id,
            ..State::default()
        };
        Sim {
            state: Arc::new(Mutex::new(image)),
        }
    }

    /// The directory a power cut at log position `k` could leave, chosen
    /// by `rng`; a fresh simulation with an empty log.
    pub fn crash_image(&self, k: usize, rng: &mut Rng) -> Sim {
        let st = self.state.lock();
        let log = &st.log[..k.min(st.log.len())];
        let names = surviving_names(log, rng);
        let mut image = State::default();
        let mut contents: HashMap<u64, Vec<u8>> = HashMap::new();
        for (name, id) in &names.0 {
            let data = contents
                .entry(*id)
                .or_insert_with(|| surviving_bytes(log, *id, rng))
                .clone();
            image.next_id = image.next_id.max(*id + 1);
            image.files.insert(*id, data);
            image.names.insert(name.clone(), *id);
        }
        image.dirs = names.1;
        Sim {
            state: Arc::new(Mutex::new(image)),
        }
    }

    fn record(st: &mut State, e: Event) {
        st.log.push(e);
    }

    fn sync_event(&self, ok: Event, failed: Event) -> io::Result<()> {
        let mut st = self.state.lock();
        st.syncs += 1;
        if st.fail_sync == Some(st.syncs) {
            Self::record(&mut st, failed);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Self::record(&mut st, ok);
        Ok(())
    }
}

/// The names (and directories) that survive in `log`.
fn surviving_names(log: &[Event], rng: &mut Rng) -> (BTreeMap<String, u64>, BTreeSet<String>) {
    // A directory change is durable once its directory is fsync'd later.
    let mut durable = vec![false; log.len()];
    let mut synced_dirs: BTreeSet<&str> = BTreeSet::new();
    for (i, e) in log.iter().enumerate().rev() {
        match e {
            Event::SyncDir { dir } => {
                synced_dirs.insert(dir);
            }
            Event::Link { name, .. } | Event::Unlink { name } | Event::Mkdir { name } => {
                durable[i] = synced_dirs.contains(parent(name));
            }
            Event::Rename { from, to } => {
                durable[i] = synced_dirs.contains(parent(from)) && synced_dirs.contains(parent(to));
            }
            _ => {}
        }
    }
    let cut = rng.below(log.len() as u64 + 1) as usize;
    let mut names = BTreeMap::new();
    let mut dirs = BTreeSet::new();
    for (i, e) in log.iter().enumerate() {
        if !(durable[i] || i < cut) {
            continue;
        }
        match e {
            Event::Link { name, id } => {
                names.insert(name.clone(), *id);
            }
            Event::Unlink { name } => {
                names.remove(name);
            }
            Event::Rename { from, to } => {
                if let Some(id) = names.remove(from) {
                    names.insert(to.clone(), id);
                }
            }
            Event::Mkdir { name } => {
                dirs.insert(name.clone());
            }
            _ => {}
        }
    }
    // A file whose directory did not survive did not either.
    names.retain(|n, _| parent(n).is_empty() || dirs.contains(parent(n)));
    (names, dirs)
}

fn apply(data: &mut Vec<u8>, e: &Event) {
    match e {
        Event::Write {
            off, data: bytes, ..
        } => {
            let end = *off as usize + bytes.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[*off as usize..end].copy_from_slice(bytes);
        }
        Event::SetLen { len, .. } => data.resize(*len as usize, 0),
        _ => {}
    }
}

/// The bytes of file `id` that survive in `log`.
fn surviving_bytes(log: &[Event], id: u64, rng: &mut Rng) -> Vec<u8> {
    let mut durable = Vec::new();
    let mut pending: Vec<&Event> = Vec::new();
    for e in log {
        match e {
            Event::Write { id: i, .. } | Event::SetLen { id: i, .. } if *i == id => pending.push(e),
            Event::Sync { id: i } if *i == id => {
                for p in pending.drain(..) {
                    apply(&mut durable, p);
                }
            }
            // The kernel dropped them and marked the pages clean.
            Event::SyncFailed { id: i } if *i == id => pending.clear(),
            _ => {}
        }
    }
    let kept: Vec<&Event> = pending.into_iter().filter(|_| rng.chance(2)).collect();
    for (n, e) in kept.iter().enumerate() {
        match e {
            Event::Write { id, off, data } if n + 1 == kept.len() && rng.chance(3) => {
                let torn = rng.below(data.len() as u64) as usize;
                apply(
                    &mut durable,
                    &Event::Write {
                        id: *id,
                        off: *off,
                        data: data[..torn].to_vec(),
                    },
                );
            }
            e => apply(&mut durable, e),
        }
    }
    durable
}

struct SimFile {
    sim: Sim,
    id: u64,
}

impl StoreFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let st = self.sim.state.lock();
        let data = st.files.get(&self.id).map_or(&[][..], |d| d.as_slice());
        let end = offset as usize + buf.len();
        if end > data.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        buf.copy_from_slice(&data[offset as usize..end]);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if offset + buf.len() as u64 > self.len()? {
            self.sim.check_room()?;
        }
        let mut st = self.sim.state.lock();
        let e = Event::Write {
            id: self.id,
            off: offset,
            data: buf.to_vec(),
        };
        apply(st.files.entry(self.id).or_default(), &e);
        Sim::record(&mut st, e);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self
            .sim
            .state
            .lock()
            .files
            .get(&self.id)
            .map_or(0, |d| d.len() as u64))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if len > self.len()? {
            self.sim.check_room()?;
        }
        let mut st = self.sim.state.lock();
        let e = Event::SetLen { id: self.id, len };
        apply(st.files.entry(self.id).or_default(), &e);
        Sim::record(&mut st, e);
        Ok(())
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        if self.len()? < len {
            self.set_len(len)?;
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.sim.sync_event(
            Event::Sync { id: self.id },
            Event::SyncFailed { id: self.id },
        )
    }
}

/// The index's storage in the simulation (no locks: one process).
struct SimBackend(SimFile);

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimBackend({})", self.0.id)
    }
}

impl redb::StorageBackend for SimBackend {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.0.read_exact_at(out, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }
}

impl Sim {
    fn open_id(&self, name: &str, create: Create) -> io::Result<u64> {
        let mut st = self.state.lock();
        if !parent(name).is_empty() && !st.dirs.contains(parent(name)) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        match (st.names.get(name).copied(), create) {
            (Some(_), Create::New) => Err(io::Error::from(io::ErrorKind::AlreadyExists)),
            (Some(id), _) => Ok(id),
            (None, Create::No) => Err(io::Error::from(io::ErrorKind::NotFound)),
            (None, _) => {
                st.next_id += 1;
                let id = st.next_id;
                st.files.insert(id, Vec::new());
                st.names.insert(name.to_string(), id);
                Sim::record(
                    &mut st,
                    Event::Link {
                        name: name.to_string(),
                        id,
                    },
                );
                Ok(id)
            }
        }
    }
}

impl StoreIo for Sim {
    fn open(&self, name: &str, create: Create) -> io::Result<Arc<dyn StoreFile>> {
        let id = self.open_id(name, create)?;
        Ok(Arc::new(SimFile {
            sim: self.clone(),
            id,
        }))
    }

    fn open_index(&self, name: &str) -> io::Result<Box<dyn redb::StorageBackend>> {
        let id = self.open_id(name, Create::IfMissing)?;
        Ok(Box::new(SimBackend(SimFile {
            sim: self.clone(),
            id,
        })))
    }

    fn mkdir(&self, name: &str) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.dirs.insert(name.to_string()) {
            Sim::record(
                &mut st,
                Event::Mkdir {
                    name: name.to_string(),
                },
            );
        }
        Ok(())
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let st = self.state.lock();
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let under = |n: &String| {
            n.strip_prefix(&prefix)
                .filter(|rest| !rest.contains('/'))
                .map(str::to_string)
        };
        Ok(st
            .names
            .keys()
            .chain(st.dirs.iter())
            .filter_map(under)
            .collect())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.names.remove(name).is_none() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Sim::record(
            &mut st,
            Event::Unlink {
                name: name.to_string(),
            },
        );
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut st = self.state.lock();
        let Some(id) = st.names.remove(from) else {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        };
        st.names.insert(to.to_string(), id);
        Sim::record(
            &mut st,
            Event::Rename {
                from: from.to_string(),
                to: to.to_string(),
            },
        );
        Ok(())
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        self.sync_event(
            Event::SyncDir {
                dir: dir.to_string(),
            },
            Event::SyncDir {
                dir: format!("{dir}\0failed"),
            },
        )
    }

    fn free_bytes(&self) -> io::Result<(u64, u64)> {
        match self.state.lock().full {
            true => Ok((0, 1 << 40)),
            false => Ok((1 << 40, 1 << 40)),
        }
    }
}
