//! What clones hold, read from their marks without filling or
//! materialising anything: what a clone shares with its base and what it
//! holds of its own (`chronofs status --clones`), and which instants some
//! mark still reads (a removed clone's tag may go only when none does).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::clone::Mark;
use super::{errno, Result, Vfs, VfsError};
use crate::history::past::Node as PastNode;
use crate::history::{ObjectId, Seq};
use crate::sys;
use crate::union::copyup::is_copyup_temp;

/// A clone's space, by where its files' bytes are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloneSpace {
    /// Files that still read their base's bytes, and their sizes: the
    /// clone takes no space for them.
    pub shared_files: u64,
    pub shared_bytes: u64,
    /// Files with bytes of their own, and the space they take.
    pub own_files: u64,
    pub own_bytes: u64,
    /// Directories not filled yet (their base's files count as shared).
    pub unfilled_dirs: u64,
}

/// Objects already counted: a file with several names counts once.
type Seen = HashSet<(u64, u64)>;

impl Vfs {
    /// The space of the clone at mount path `path` (components from the
    /// mount's root).
    pub fn clone_space(&self, path: &[Vec<u8>]) -> Result<CloneSpace> {
        // Looked up as the mount shows it: in a union the clone lies in
        // whichever branch took it (after a snapshot, the fresh one; the
        // root's branch gave ENOENT).
        let fd = self.with_path(path, |ino| {
            let node = self.node(ino)?;
            Ok(sys::reopen(node.fd(), libc::O_PATH | libc::O_NOFOLLOW)?)
        });
        let fd = fd?;
        let mut space = CloneSpace::default();
        let mut seen = Seen::new();
        let mut stack = vec![fd];
        while let Some(fd) = stack.pop() {
            self.count_object(fd, &mut space, &mut seen, &mut stack)?;
        }
        Ok(space)
    }

    /// The instants some clone's mark in any branch still reads: what
    /// keeps a removed clone's tag (and so its base) alive.
    ///
    /// The walk takes no lock that stops the mount's work: a rename, link
    /// or flattening (which can carry a mark from a directory not yet
    /// walked into one already walked) makes it walk again, and after
    /// `WALK_TRIES` it walks with every change held off. Branch changes,
    /// snapmerge and sandbox commits wait for it (`Vfs::changing`).
    pub fn clone_instants_in_use(&self) -> Result<HashSet<Seq>> {
        if !self.clones_on() {
            return Ok(HashSet::new());
        }
        {
            let _set = self.changing();
            for _ in 0..WALK_TRIES {
                let before = self.clones.moves.done();
                let used = self.marked_instants()?;
                if self.clones.moves.still(before) {
                    return Ok(used);
                }
            }
        }
        let _all = self.tree_lock().write();
        // Only flattenings (a writer's release) still run; none starts.
        for _ in 0..WALK_TRIES * 10 {
            let before = self.clones.moves.done();
            let used = self.marked_instants()?;
            if self.clones.moves.still(before) {
                return Ok(used);
            }
        }
        Err(VfsError::Busy(
            "clone marks kept moving while the tree was walked".into(),
        ))
    }

    fn marked_instants(&self) -> Result<HashSet<Seq>> {
        let mut used = HashSet::new();
        self.each_mark(|mark, _| {
            used.insert(mark.at);
            // A flattened file's crash fallback reads that instant.
            if let Some(f) = mark.patch.as_ref().and_then(|p| p.fallback.as_ref()) {
                used.insert(f.at);
            }
        })?;
        Ok(used)
    }

    /// Where (branch-relative paths) clones read the history of `objects`
    /// (those of mount path `path`): removing it (`chronofs purge`) would
    /// leave their shared bytes unreadable. A mark reads the tree at its
    /// path at its instant, so it reads an object that lay there then,
    /// under whatever name the object has had since.
    pub fn clones_reading(
        &self,
        path: &[Vec<u8>],
        objects: &HashSet<ObjectId>,
    ) -> Result<Vec<Vec<u8>>> {
        if !self.clones_on() {
            return Ok(Vec::new());
        }
        let _set = self.changing();
        let mut reads: Vec<(Seq, Vec<Vec<u8>>, Vec<u8>)> = Vec::new();
        self.each_mark(|mark, at| {
            reads.push((mark.at, mark.path.clone(), at.to_vec()));
            if let Some(f) = mark.patch.as_ref().and_then(|p| p.fallback.as_ref()) {
                reads.push((f.at, f.path.clone(), at.to_vec()));
            }
        })?;
        let mut paths_at: HashMap<Seq, Vec<Vec<Vec<u8>>>> = HashMap::new();
        let mut found = Vec::new();
        for (seq, read, at) in reads {
            let then = match paths_at.entry(seq) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(self.with_past(|p| {
                    let mut out = Vec::new();
                    for &obj in objects {
                        if let Some(q) = p.history.path_at(obj, seq)? {
                            out.push(q);
                        }
                    }
                    Ok(out)
                })?),
            };
            if read.starts_with(path) || then.iter().any(|q| q.starts_with(&read)) {
                found.push(at);
            }
        }
        Ok(found)
    }

    /// Calls `visit` with every clone mark in any branch and the path of
    /// the object that carries it (from its branch's root).
    fn each_mark(&self, mut visit: impl FnMut(&super::clone::Mark, &[u8])) -> Result<()> {
        let roots: Vec<OwnedFd> = match self.union() {
            Some(u) => u
                .roots()
                .into_iter()
                .map(|(_, fd)| sys::reopen(fd.as_fd(), libc::O_PATH | libc::O_DIRECTORY))
                .collect::<std::io::Result<_>>()?,
            None => vec![sys::reopen(
                self.branch.root_fd(),
                libc::O_PATH | libc::O_DIRECTORY,
            )?],
        };
        let mut stack: Vec<(OwnedFd, Vec<u8>)> =
            roots.into_iter().map(|fd| (fd, Vec::new())).collect();
        while let Some((dir, at)) = stack.pop() {
            let listing = sys::reopen_dir(dir.as_fd(), libc::O_RDONLY)?;
            for e in crate::union::format::entries(listing.as_fd())? {
                let skip = e.name == b"." || e.name == b"..";
                // The store holds no marks (the link index does).
                let store = at.is_empty()
                    && self.branch.reserved_name() == Some(OsStr::from_bytes(&e.name));
                if skip || store {
                    continue;
                }
                let is_dir = e.dtype == libc::DT_DIR;
                if !is_dir && e.dtype != libc::DT_REG && e.dtype != libc::DT_UNKNOWN {
                    continue;
                }
                let name = CString::new(e.name.clone()).map_err(|_| errno(libc::EINVAL))?;
                // Removed since the listing: a rename is counted, a removal
                // takes its mark along.
                let fd = match sys::openat(dir.as_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    other => other?,
                };
                let st = sys::fstat(fd.as_fd())?;
                let kind = st.st_mode & libc::S_IFMT;
                if kind != libc::S_IFDIR && kind != libc::S_IFREG {
                    continue;
                }
                let mut here = at.clone();
                if !here.is_empty() {
                    here.push(b'/');
                }
                here.extend_from_slice(&e.name);
                if let Some(mark) = self.read_mark(fd.as_fd())? {
                    visit(&mark, &here);
                }
                if kind == libc::S_IFDIR {
                    stack.push((fd, here));
                }
            }
        }
        Ok(())
    }

    fn count_object(
        &self,
        fd: OwnedFd,
        space: &mut CloneSpace,
        seen: &mut Seen,
        stack: &mut Vec<OwnedFd>,
    ) -> Result<()> {
        let st = sys::fstat(fd.as_fd())?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {
                if !seen.insert((st.st_dev, st.st_ino)) {
                    return Ok(());
                }
                let mark = self.read_mark(fd.as_fd())?;
                if let Some(patch) = mark.as_ref().and_then(|m| m.patch.as_ref()) {
                    // A patched file: partly shared, partly its own.
                    space.shared_files += 1;
                    space.shared_bytes += patch.base_len - patch.own.total();
                    space.own_bytes += st.st_blocks as u64 * 512;
                } else if mark.is_some() {
                    space.shared_files += 1;
                    space.shared_bytes += st.st_size as u64;
                } else {
                    // Its own, but a materialised file may share its
                    // blocks with its base (btrfs, XFS).
                    let blocks = st.st_blocks as u64 * 512;
                    let shared = shared_blocks(fd.as_fd());
                    match shared {
                        0 => space.own_files += 1,
                        _ => space.shared_files += 1,
                    }
                    space.shared_bytes += shared;
                    space.own_bytes += blocks - shared;
                }
            }
            libc::S_IFDIR => match self.read_mark(fd.as_fd())? {
                Some(mark) if mark.dir => {
                    space.unfilled_dirs += 1;
                    self.count_base(&mark, space, seen)?;
                }
                _ => {
                    let dir = sys::reopen_dir(fd.as_fd(), libc::O_RDONLY)?;
                    for e in crate::union::format::entries(dir.as_fd())? {
                        if e.name == b"." || e.name == b".." || is_copyup_temp(&e.name) {
                            continue;
                        }
                        let name = CString::new(e.name).map_err(|_| errno(libc::EINVAL))?;
                        let flags = libc::O_PATH | libc::O_NOFOLLOW;
                        stack.push(sys::openat(fd.as_fd(), &name, flags, 0)?);
                    }
                }
            },
            _ => {}
        }
        Ok(())
    }

    /// Counts an unfilled directory's base tree, every file of it shared.
    /// A file with several names counts once, also across the clone's
    /// unfilled directories and when history knows it by no name yet (a
    /// live file is then known by its backing inode).
    fn count_base(&self, mark: &Mark, space: &mut CloneSpace, seen: &mut Seen) -> Result<()> {
        self.with_past(|p| {
            let err = super::views::past_err;
            let mut stack = vec![mark.path.clone()];
            while let Some(path) = stack.pop() {
                let Some(node) = p.resolve(&path, mark.at).map_err(err)? else {
                    continue;
                };
                // Object ids and backing inodes in one set: no device is
                // numbered u64::MAX.
                let (key, size) = match &node {
                    PastNode::Hist { obj, v, .. } => ((u64::MAX, obj.get()), v.attrs.size),
                    PastNode::Live { obj, st, .. } => {
                        let key = obj.map_or((st.st_dev, st.st_ino), |o| (u64::MAX, o.get()));
                        (key, st.st_size as u64)
                    }
                };
                match node.mode() & libc::S_IFMT {
                    libc::S_IFDIR => {
                        for name in p.names(&node, mark.at, path.is_empty()).map_err(err)? {
                            let mut child = path.clone();
                            child.push(name);
                            stack.push(child);
                        }
                    }
                    libc::S_IFREG if seen.insert(key) => {
                        space.shared_files += 1;
                        space.shared_bytes += size;
                    }
                    _ => {}
                }
            }
            Ok(())
        })
    }
}

/// Walks of the tree for marks before one runs with every change held
/// off.
const WALK_TRIES: usize = 3;

/// Counts the operations that can move a clone mark (renames, links,
/// flattenings) so that a walk of the tree can tell whether one ran while
/// it walked: one that was running at its end, or ended during it.
#[derive(Default)]
pub(super) struct Moves {
    active: AtomicU64,
    done: AtomicU64,
}

/// Held for the whole of an operation that can move a mark.
pub(super) struct Moving<'a>(&'a Moves);

impl Moves {
    pub(super) fn start(&self) -> Moving<'_> {
        self.active.fetch_add(1, Ordering::SeqCst);
        Moving(self)
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::SeqCst)
    }

    /// Whether nothing moved since `done()` gave `before`.
    fn still(&self, before: u64) -> bool {
        self.active.load(Ordering::SeqCst) == 0 && self.done() == before
    }
}

impl Drop for Moving<'_> {
    fn drop(&mut self) {
        self.0.done.fetch_add(1, Ordering::SeqCst);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The bytes of a file (`fd`, any open) in blocks it shares with others,
/// where its file system shares blocks; 0 where it cannot say.
fn shared_blocks(fd: std::os::fd::BorrowedFd<'_>) -> u64 {
    if !sys::shares_blocks_in_order(fd) {
        return 0;
    }
    sys::reopen(fd, libc::O_RDONLY)
        .and_then(|f| sys::shared_extent_bytes(f.as_fd()))
        .unwrap_or_else(|e| {
            tracing::debug!("clone space: no extent map: {e}");
            0
        })
}

#[cfg(test)]
mod tests {
    use super::Moves;

    #[test]
    fn a_walk_is_trusted_only_if_no_move_ran_or_ended_during_it() {
        let moves = Moves::default();
        let before = moves.done();
        assert!(moves.still(before));
        // Started before the walk, still running at its end.
        let early = moves.start();
        let before = moves.done();
        assert!(!moves.still(before));
        // Ended during the walk.
        drop(early);
        assert!(!moves.still(before));
        // Started and ended during it.
        let before = moves.done();
        drop(moves.start());
        assert!(!moves.still(before));
        assert!(moves.still(moves.done()));
    }
}
