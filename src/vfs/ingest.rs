//! Eager baseline (`-o baseline=eager`, `chronofs ingest`): walks the whole
//! branch and records every directory listing and every file's content
//! that history does not hold yet, so the store becomes a complete backup.
//! Runs on its own thread; live changes keep being captured meanwhile (an
//! object already recorded is skipped, and capture serializes baselines).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::inodes::Layer;
use super::versioning::Live;
use super::{InodeNo, Vfs};
use crate::branch::BranchId;
use crate::capture::Tree;
use crate::history::{Binding, ObjectId};
use crate::sys::{self, Stat};

/// Progress of an eager ingest, readable while it runs.
#[derive(Default)]
pub struct IngestProgress {
    pub running: AtomicBool,
    /// Asks a running walk to stop (at unmount).
    pub stop: AtomicBool,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    pub done: AtomicBool,
    /// Set by a start while a walk runs: it walks again when done.
    again: AtomicBool,
    pub dirs: AtomicU64,
    pub files: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
}

impl IngestProgress {
    /// Counted per walk: `chronofs ingest` after a branch change reports
    /// the walk of the new view, not a sum with the walks before it.
    fn reset_counts(&self) {
        for count in [&self.dirs, &self.files, &self.bytes, &self.errors] {
            count.store(0, Ordering::Relaxed);
        }
    }
}

/// Where an object was found: (parent, name).
type Place = Option<(ObjectId, Vec<u8>)>;

/// The objects of one directory being walked: what capture reads from.
struct Walk<'a> {
    live: Live<'a>,
    objects: HashMap<ObjectId, (OwnedFd, Place)>,
    /// The directory walked and its entries as history records them (in
    /// a union: merged, each bound to the branch object it resolves to).
    listing: (ObjectId, Vec<(Vec<u8>, Binding)>),
    /// The branch of the walked directory's own (top) copy.
    branch: BranchId,
}

fn to_io(e: super::VfsError) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

fn not_found() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

impl Walk<'_> {
    fn fd(&self, obj: ObjectId) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        // In a union an object the kernel holds may have been copied up
        // since the walk found it: the live inode is the object now, and
        // the walk's copy would look like a change made behind the mount.
        // (A one-branch union copies nothing up: its walk reads its own
        // descriptors, as a single-directory mount's does.)
        if obj != self.listing.0
            && self.live.0.union().is_some_and(|u| !u.single_branch())
            && self.live.0.inodes.get(InodeNo::from(obj)).is_ok()
        {
            return Err(not_found());
        }
        self.objects
            .get(&obj)
            .map(|(fd, _)| fd.as_fd())
            .ok_or_else(not_found)
    }
}

impl Tree for Walk<'_> {
    fn stat(&self, obj: ObjectId) -> io::Result<Stat> {
        match self.fd(obj) {
            Ok(fd) => sys::fstat(fd),
            Err(_) => self.live.stat(obj),
        }
    }

    fn open_read(&self, obj: ObjectId) -> io::Result<Box<dyn crate::capture::Readable>> {
        match self.fd(obj) {
            Ok(fd) => super::versioning::open_read_fd(self.live.0, InodeNo::from(obj), fd, true),
            Err(_) => self.live.open_read(obj),
        }
    }

    fn readlink(&self, obj: ObjectId) -> io::Result<Vec<u8>> {
        match self.fd(obj) {
            Ok(fd) => sys::readlink_fd(fd),
            Err(_) => self.live.readlink(obj),
        }
    }

    fn xattrs(&self, obj: ObjectId) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        match self.fd(obj) {
            Ok(fd) => super::versioning::recorded_xattrs(self.live.0, fd),
            Err(_) => self.live.xattrs(obj),
        }
    }

    fn parent_of(&self, obj: ObjectId) -> Option<(ObjectId, Vec<u8>)> {
        match self.objects.get(&obj) {
            Some((_, parent)) => parent.clone(),
            None => self.live.parent_of(obj),
        }
    }

    fn list(&self, dir: ObjectId) -> io::Result<Vec<(Vec<u8>, Binding)>> {
        if dir == self.listing.0 {
            return Ok(self.listing.1.clone());
        }
        match self.fd(dir) {
            Ok(fd) => self.live.list_fd(fd, dir == InodeNo::ROOT.object()),
            Err(_) => self.live.list(dir),
        }
    }

    fn binding(&self, obj: ObjectId) -> Option<Binding> {
        if let Some((_, b)) = self.listing.1.iter().find(|(_, b)| b.object == obj) {
            return Some(*b);
        }
        let fd = self.fd(obj).ok()?;
        let st = sys::fstat(fd).ok()?;
        let key = if obj == self.listing.0 {
            self.live.0.inodes.key_in(self.branch, &st)
        } else {
            self.live.0.inodes.key_of(&st)
        };
        Some(Binding {
            branch: key.branch,
            dev: key.dev,
            ino: key.ino,
            object: obj,
        })
    }
}

impl Vfs {
    /// Whether `dir` is a clone's directory not filled yet: the walk leaves
    /// it to its fill, which records its entries (as of the clone's
    /// instant), and whose entries are half made while it runs or where a
    /// crash cut it short.
    fn unfilled(&self, dir: BorrowedFd<'_>) -> super::Result<bool> {
        if !self.clones_on() {
            return Ok(false);
        }
        Ok(self.read_mark(dir)?.is_some_and(|m| m.dir))
    }

    /// Whether the mount records history (not `-o plain`).
    pub fn keeps_history(&self) -> bool {
        self.capture.is_some()
    }

    /// Starts the eager baseline on its own thread; one that runs already
    /// walks again once done, since the view may have changed under the
    /// part it walked (a branch added or removed meanwhile).
    pub fn start_ingest(self: &Arc<Self>) -> Result<(), String> {
        if self.capture.is_none() {
            return Err("this mount does not record history (-o plain)".into());
        }
        // Asked before the running walk is looked at: a walk that ends
        // after that look sees the request (`ingest_while_asked`); asked
        // after it, the request came too late for that walk (a local run
        // once lost a branch add's walk to a first-mount walk ending then).
        self.ingest.again.store(true, Ordering::SeqCst);
        if self.ingest.running.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.ingest.again.store(false, Ordering::SeqCst);
        self.ingest.done.store(false, Ordering::Release);
        self.ingest.stop.store(false, Ordering::Release);
        self.ingest.reset_counts();
        let vfs = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("ingest".into())
            .spawn(move || {
                if let Some(v) = vfs.upgrade() {
                    v.ingest_while_asked();
                }
            })
            .map(|t| *self.ingest.thread.lock() = Some(t))
            .map_err(|e| {
                self.ingest.running.store(false, Ordering::Release);
                format!("cannot start the ingest thread: {e}")
            })
    }

    /// Walks, and again for every [`Vfs::start_ingest`] made meanwhile.
    /// `done` is set before `running` is cleared, so that a start after
    /// that (which clears `done`) is never undone by this thread.
    fn ingest_while_asked(&self) {
        let p = &self.ingest;
        loop {
            if self.ingest_tree() {
                self.note_ingest_complete();
            }
            let asked = |p: &IngestProgress| {
                p.again.swap(false, Ordering::SeqCst) && !p.stop.load(Ordering::Acquire)
            };
            if !asked(p) {
                p.done.store(true, Ordering::Release);
                p.running.store(false, Ordering::SeqCst);
                // Asked after the check above, by a caller that found the
                // walk still running: this thread walks, unless another
                // started since.
                if !asked(p) || p.running.swap(true, Ordering::SeqCst) {
                    return;
                }
                p.done.store(false, Ordering::Release);
            }
            p.reset_counts();
        }
    }

    pub fn ingest_progress(&self) -> &IngestProgress {
        &self.ingest
    }

    /// Waits for a running ingest to finish; whether it went through.
    pub fn wait_ingest(&self) -> bool {
        let thread = self.ingest.thread.lock().take();
        if let Some(t) = thread {
            if t.join().is_err() {
                tracing::error!("ingest: the thread panicked");
            }
        }
        self.ingest.errors.load(Ordering::Relaxed) == 0
    }

    /// Stops a running ingest and waits for its thread.
    pub fn stop_ingest(&self) {
        self.ingest.stop.store(true, Ordering::Release);
        let thread = self.ingest.thread.lock().take();
        if let Some(t) = thread {
            if t.join().is_err() {
                tracing::error!("ingest: the thread panicked");
            }
        }
    }

    /// Whether one ingest of the whole tree has completed for this store:
    /// every object that existed before the first mount is recorded.
    pub fn ingest_complete(&self) -> bool {
        self.capture()
            .is_some_and(|c| c.history().ingest_complete().unwrap_or(false))
    }

    fn note_ingest_complete(&self) {
        if let Some(c) = self.capture() {
            if let Err(e) = c.history().set_ingest_complete() {
                tracing::error!("ingest: cannot note its completion: {e}");
            }
        }
    }

    /// The root's copies in a union, top-down (none outside one).
    fn root_copies(&self, root: &OwnedFd) -> Vec<Layer> {
        let Some(u) = self.union() else {
            return Vec::new();
        };
        let mut copies = u.root_layers();
        if let Ok(own) = sys::reopen(root.as_fd(), libc::O_PATH | libc::O_DIRECTORY) {
            copies.push(Layer {
                branch: u.primary(),
                fd: Arc::new(own),
            });
        }
        self.by_rank(&mut copies);
        copies
    }

    /// A directory's entries as history records them: in a union (its
    /// `copies` known) the merged ones, else those of `fd`.
    fn listing_of(
        &self,
        walk: &Walk<'_>,
        (fd, copies): (&OwnedFd, &[Layer]),
        in_root: bool,
    ) -> io::Result<Vec<(Vec<u8>, Binding)>> {
        if copies.is_empty() {
            return walk.live.list_fd(fd.as_fd(), in_root);
        }
        self.union_entries(copies, in_root).map_err(to_io)
    }

    /// The object `name` of a directory walked: a descriptor of it (its
    /// top copy in a union) and, for a union directory, its copies.
    fn child_of(
        &self,
        (fd, copies): (&OwnedFd, &[Layer]),
        name: &std::ffi::CStr,
    ) -> io::Result<(OwnedFd, Vec<Layer>)> {
        let Some(u) = self.union() else {
            return Ok((sys::open_path(fd.as_fd(), name)?, Vec::new()));
        };
        let found = self.walk_layers(copies, name).map_err(to_io)?;
        let (branch, parent, st) = found.as_ref().ok_or_else(not_found)?.top.clone();
        if let Some((_, index, entry, _)) = self.indexed_instead(u, branch, &st).map_err(to_io)? {
            return Ok((sys::open_path(index.as_fd(), &entry)?, Vec::new()));
        }
        let child = sys::open_path(parent.as_fd(), name)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Ok((child, Vec::new()));
        }
        let mut child_copies = vec![Layer {
            branch,
            fd: Arc::new(sys::reopen(
                child.as_fd(),
                libc::O_PATH | libc::O_DIRECTORY,
            )?),
        }];
        child_copies.extend(found.map(|f| f.lowers).unwrap_or_default());
        Ok((child, child_copies))
    }

    /// Walks the tree; true if it went through with no error.
    fn ingest_tree(&self) -> bool {
        let Some(capture) = self.capture() else {
            return false;
        };
        let p = &self.ingest;
        let root = match sys::reopen(self.branch.root_fd(), libc::O_PATH | libc::O_DIRECTORY) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::error!("ingest: cannot open the root: {e}");
                return false;
            }
        };
        let root_copies = self.root_copies(&root);
        let mut queue: Vec<(ObjectId, OwnedFd, Place, Vec<Layer>)> =
            vec![(InodeNo::ROOT.object(), root, None, root_copies)];
        while let Some((dir, fd, parent, copies)) = queue.pop() {
            if p.stop.load(Ordering::Acquire) {
                tracing::info!("ingest stopped; the next mount resumes it");
                return false;
            }
            let mut walk = Walk {
                live: Live(self),
                objects: HashMap::new(),
                listing: (dir, Vec::new()),
                branch: match copies.first() {
                    Some(top) if dir != InodeNo::ROOT.object() => top.branch,
                    _ => self.inodes.primary_branch(),
                },
            };
            let in_root = dir == InodeNo::ROOT.object();
            match self.unfilled(fd.as_fd()) {
                Ok(false) => {}
                Ok(true) => continue,
                Err(e) => {
                    tracing::warn!("ingest: directory {dir}: its clone mark: {e}");
                    p.errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let listing = match self.listing_of(&walk, (&fd, &copies), in_root) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!("ingest: cannot list directory {dir}: {e}");
                    p.errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            let mut child_copies = HashMap::new();
            for (name, b) in &listing {
                let Ok(cname) = sys::cstr(std::ffi::OsStr::from_bytes(name)) else {
                    continue;
                };
                if let Ok((child, copies)) = self.child_of((&fd, &copies), &cname) {
                    walk.objects
                        .insert(b.object, (child, Some((dir, name.clone()))));
                    child_copies.insert(b.object, copies);
                }
            }
            walk.objects.insert(dir, (fd, parent));
            walk.listing.1 = listing.clone();
            if let Err(e) = capture.before_dir_change(&walk, dir) {
                tracing::warn!("ingest: directory {dir}: {e}");
                p.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            p.dirs.fetch_add(1, Ordering::Relaxed);
            let children: Vec<ObjectId> = listing.iter().map(|(_, b)| b.object).collect();
            for obj in children {
                let st = match walk.stat(obj) {
                    Ok(st) => st,
                    Err(_) => continue,
                };
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    if let Some((cfd, cparent)) = walk.objects.remove(&obj) {
                        let copies = child_copies.remove(&obj).unwrap_or_default();
                        queue.push((obj, cfd, cparent, copies));
                    }
                    continue;
                }
                match capture.before_change(&walk, obj) {
                    Ok(()) => {
                        p.files.fetch_add(1, Ordering::Relaxed);
                        p.bytes.fetch_add(st.st_size as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tracing::warn!("ingest: inode {obj}: {e}");
                        p.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        tracing::info!(
            "ingest finished: {} directories, {} files",
            p.dirs.load(Ordering::Relaxed),
            p.files.load(Ordering::Relaxed)
        );
        p.errors.load(Ordering::Relaxed) == 0
    }
}
