//! The vfs side of capture: the live tree capture reads from, and the
//! hooks each operation calls before and after its change.
//!
//! Before-hooks secure the prior state in history and fail the operation
//! if they cannot (a full store disk gives the caller ENOSPC, never a
//! silent loss of history). After-hooks record the change; if one fails
//! the change itself has happened, so it is logged, not reported: nothing
//! is lost, because the next before-hook finds the live state differs from
//! history and records it.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use super::{Caller, InodeNo, Result, Vfs, VfsError};
use crate::capture::{Capture, CaptureError, Opening, Readable, Tree};
use crate::history::{Binding, Cause, ObjectId, Who, ROOT};
use crate::sys::{self, Stat};

/// The vfs's live objects as capture sees them.
pub(super) struct Live<'a>(pub &'a Vfs);

fn io_err(e: VfsError) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

impl Tree for Live<'_> {
    fn stat(&self, obj: ObjectId) -> io::Result<Stat> {
        // The root as shown: a union's upper copy when the mount's own
        // root is in a branch frozen by a snapshot.
        self.0
            .with_shown_fd(InodeNo::from(obj), |fd| Ok(sys::fstat(fd)?))
            .map_err(io_err)
    }

    fn open_read(&self, obj: ObjectId) -> io::Result<Box<dyn Readable>> {
        let node = self.0.inodes.node(InodeNo::from(obj)).map_err(io_err)?;
        let may_be_marked = !node.inode.known_unmarked();
        open_read_fd(self.0, node.ino, node.fd(), may_be_marked)
    }

    fn readlink(&self, obj: ObjectId) -> io::Result<Vec<u8>> {
        let node = self.0.inodes.node(InodeNo::from(obj)).map_err(io_err)?;
        sys::readlink_fd(node.fd())
    }

    fn xattrs(&self, obj: ObjectId) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0
            .with_shown_fd(InodeNo::from(obj), |fd| Ok(recorded_xattrs(self.0, fd)?))
            .map_err(io_err)
    }

    fn parent_of(&self, obj: ObjectId) -> Option<(ObjectId, Vec<u8>)> {
        self.0.name_of(obj)
    }

    fn list(&self, dir: ObjectId) -> io::Result<Vec<(Vec<u8>, Binding)>> {
        let node = self.0.inodes.node(InodeNo::from(dir)).map_err(io_err)?;
        if self.0.union().is_some() {
            return self
                .0
                .union_entries(&self.0.layers_of(&node).map_err(io_err)?, dir == ROOT)
                .map_err(io_err);
        }
        self.list_fd(node.fd(), dir == ROOT)
    }

    fn binding(&self, obj: ObjectId) -> Option<Binding> {
        if obj == ROOT {
            return None;
        }
        let inode = self.0.inodes.get(InodeNo::from(obj)).ok()?;
        Some(self.binding_of(&inode))
    }
}

/// What capture reads of a live file: its descriptor, or, for a clone's
/// file that shares bytes with its base, those bytes merged in.
/// `may_be_marked`: false where the inode is known to carry no mark.
pub(super) fn open_read_fd(
    vfs: &Vfs,
    ino: InodeNo,
    fd: BorrowedFd<'_>,
    may_be_marked: bool,
) -> io::Result<Box<dyn Readable>> {
    if may_be_marked {
        if let Some(content) = vfs.clone_content(ino, fd).map_err(io_err)? {
            return Ok(content);
        }
    }
    let fd = sys::reopen(fd, libc::O_RDONLY | libc::O_NOATIME)
        .or_else(|_| sys::reopen(fd, libc::O_RDONLY))?;
    Ok(Box::new(fd))
}

/// The xattrs history records of backing object `fd`: a clone's mark is
/// the daemon's, not the file's.
pub(super) fn recorded_xattrs(
    vfs: &Vfs,
    fd: BorrowedFd<'_>,
) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    // The mount's own names (a union's markers, a clone's mark and
    // index) are not the file's: a restore could not set them back.
    let mut all = sys::xattrs_of(fd)?;
    all.retain(|(name, _)| !vfs.hidden_xattr(name));
    Ok(all)
}

impl Live<'_> {
    /// How history knows `inode`'s backing object.
    pub(super) fn binding_of(&self, inode: &super::inodes::Inode) -> Binding {
        Binding {
            branch: inode.key.branch,
            dev: inode.key.dev,
            ino: inode.key.ino,
            object: inode.ino.object(),
        }
    }
}

impl Live<'_> {
    /// The entries of the directory behind `dir` (any descriptor of it)
    /// with their object ids, assigning ids to entries seen for the first
    /// time.
    pub(super) fn list_fd(
        &self,
        dir: std::os::fd::BorrowedFd<'_>,
        in_root: bool,
    ) -> io::Result<Vec<(Vec<u8>, Binding)>> {
        let fd = sys::reopen(dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let mut buf = sys::DirBuf::new(64 * 1024);
        let mut names = Vec::new();
        let mut keys = Vec::new();
        loop {
            let batch = sys::getdents(fd.as_fd(), &mut buf)?;
            if batch.is_empty() {
                break;
            }
            for e in batch {
                let name = OsStr::from_bytes(&e.name);
                if e.name == b"." || e.name == b".." || self.0.is_own_name(in_root, name) {
                    continue;
                }
                // The entry's own device: a mount point below SRC differs.
                let st = match sys::fstatat(fd.as_fd(), &sys::cstr(name)?) {
                    Ok(st) => st,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(e) => return Err(e),
                };
                keys.push(self.0.inodes.key_of(&st));
                names.push(e.name);
            }
        }
        let numbers = self
            .0
            .inodes
            .numbers_for(&keys)
            .map_err(|e| io_err(e.into()))?;
        Ok(names
            .into_iter()
            .zip(keys.iter().zip(numbers))
            .map(|(name, (key, ino))| {
                let binding = Binding {
                    branch: key.branch,
                    dev: key.dev,
                    ino: key.ino,
                    object: ino.object(),
                };
                (name, binding)
            })
            .collect())
    }
}

/// Logs a failed after-hook (see the module comment).
pub(super) fn logged(what: &str, r: std::result::Result<(), CaptureError>) {
    if let Err(e) = r {
        tracing::error!("history: recording {what} failed: {e}");
    }
}

fn is_store_full(errno: i32) -> bool {
    errno == libc::ENOSPC || errno == libc::EDQUOT
}

impl Vfs {
    pub(super) fn capture(&self) -> Option<&Capture> {
        self.capture.as_deref()
    }

    pub(super) fn who(&self, c: &Capture, caller: &Caller) -> Who {
        c.who(caller.uid, caller.gid, caller.pid)
    }

    /// Before a version name of `name` in `dir` is resolved (`f;0`): the
    /// object the name shows now gets a version if history has none of
    /// it, or its live state if it changed unseen. A file an inserted
    /// branch brought is recorded by the background walk; until it got
    /// there, `f;0` showed the file the branch hid, and a clone's file
    /// had no version until its first change.
    pub(super) fn record_shown(&self, dir: &super::inodes::Node, name: &[u8]) {
        let name = OsStr::from_bytes(name);
        // The store and the hidden temporaries are no one's files.
        if self.capture().is_none() || self.is_own_name(dir.ino == InodeNo::ROOT, name) {
            return;
        }
        let Ok(entry) = self.lookup_in(dir, name) else {
            return;
        };
        if let Err(e) = self.record_live_state(entry.attr.ino) {
            tracing::debug!("history: the live state of a versioned name is not recorded: {e}");
        }
        self.forget(entry.attr.ino, 1);
    }

    /// [`Vfs::record_shown`] for the object at `path` (components from
    /// the mount's root), before `chronofs log` or `cat --version` asks
    /// for its versions.
    pub fn record_shown_at(&self, path: &[Vec<u8>]) {
        if self.capture().is_none() || path.is_empty() {
            return;
        }
        if let Err(e) = self.with_path(path, |ino| self.record_live_state(ino)) {
            tracing::debug!("history: the live state of a path asked about is not recorded: {e}");
        }
    }

    /// History holds `ino`'s state now. A clone's file never changed is
    /// recorded as its base's content (not read whole).
    fn record_live_state(&self, ino: InodeNo) -> Result<()> {
        let Some(c) = self.capture() else {
            return Ok(());
        };
        if self.clones_on() {
            let node = self.node(ino)?;
            if let Some(mark) = self.base_of_file(&node)? {
                let base = self.with_past(|p| {
                    p.resolve(&mark.path, mark.at)
                        .map_err(super::views::past_err)
                })?;
                self.baseline_from_base(&node, &mark, base.as_ref())?;
            }
        }
        Ok(c.before_change(&Live(self), ino.object())?)
    }

    /// Before `ino` changes.
    pub(super) fn before_change(&self, ino: InodeNo) -> Result<()> {
        if let Some(c) = self.capture() {
            if self.clones_on() {
                self.before_clone_change(&self.node(ino)?)?;
            }
            c.before_change(&Live(self), ino.object())?;
        }
        Ok(())
    }

    /// Before a change that frees space (an unlink, rmdir, or truncation
    /// to zero): like `before_change` (of `dir`'s entries and of `ino`),
    /// except that a full store does not stop it. Deleting must always be
    /// possible, or a user who filled the disk could never free it: the
    /// change goes ahead, and what history could not record is logged and
    /// counted (`chronofs status`).
    pub(super) fn before_freeing(&self, dir: Option<InodeNo>, ino: Option<InodeNo>) -> Result<()> {
        let Some(c) = self.capture() else {
            return Ok(());
        };
        let tree = Live(self);
        let secured = dir
            .map_or(Ok(()), |d| c.before_dir_change(&tree, d.object()))
            .and_then(|()| ino.map_or(Ok(()), |i| c.before_change(&tree, i.object())));
        match secured {
            Err(e) if is_store_full(e.errno()) => {
                c.history().note_unrecorded(&format!(
                    "the state of object {} before it was freed",
                    ino.or(dir).map_or(0, |i| i.0)
                ));
                Ok(())
            }
            other => Ok(other?),
        }
    }

    /// Before an entry of `dir` is added, removed or replaced.
    pub(super) fn before_dir_change(&self, dir: InodeNo) -> Result<()> {
        if let Some(c) = self.capture() {
            if self.clones_on() {
                self.fill_if_unfilled(&self.node(dir)?)?;
            }
            c.before_dir_change(&Live(self), dir.object())?;
        }
        Ok(())
    }

    /// After history recorded a change of `dirs`' entries: their live
    /// attributes now go with the recorded listings.
    pub(super) fn dirs_verified(&self, c: &Capture, dirs: &[InodeNo]) {
        for dir in dirs {
            if let Ok(node) = self.node(*dir) {
                if let Ok(st) = sys::fstat(node.fd()) {
                    c.dir_verified(dir.object(), &st);
                }
            }
        }
    }

    /// At mount, before the kernel asks anything: the root's entries that
    /// history does not hold are recorded. Every other directory is checked
    /// when first looked up, but the kernel never looks up the root, so a
    /// rename in it that history missed (made while unmounted, or recorded
    /// just before a crash that lost it) would otherwise leave history
    /// naming the replaced object for good.
    pub fn check_root_entries(&self) {
        if self.capture().is_none() {
            return;
        }
        match self.node(InodeNo::ROOT) {
            Ok(root) => self.dir_opened(InodeNo::ROOT, root.fd()),
            Err(e) => tracing::error!("history: the root cannot be checked: {e}"),
        }
    }

    /// A directory used as a lookup's parent whose entries may have changed
    /// with the union's branch set: history compares them first.
    pub(super) fn recheck_if_marked(&self, dir: &super::inodes::Node) {
        if self.capture().is_some() && dir.take_recheck() {
            let Some(c) = self.capture() else {
                return;
            };
            match sys::fstat(dir.fd()) {
                Ok(st) => logged(
                    "a directory's entries",
                    c.dir_recheck(&Live(self), dir.ino.object(), &st),
                ),
                Err(e) => tracing::error!(
                    "history: directory {} cannot be checked: {e}",
                    dir.ino.object()
                ),
            }
        }
    }

    /// A live directory is about to be read: record entries that changed
    /// behind the mount's back.
    pub(super) fn dir_opened(&self, dir: InodeNo, fd: std::os::fd::BorrowedFd<'_>) {
        let Some(c) = self.capture() else {
            return;
        };
        let recheck = self.inodes.get(dir).is_ok_and(|i| i.take_recheck());
        let checked = match sys::fstat(fd) {
            Ok(st) if recheck => c.dir_recheck(&Live(self), dir.object(), &st),
            Ok(st) => c.dir_seen(&Live(self), dir.object(), &st, true),
            Err(e) => {
                tracing::error!("history: directory {} cannot be checked: {e}", dir.object());
                return;
            }
        };
        match checked {
            // Removed (or an entry of it) while being compared: the removal
            // through the mount records itself, and a removal behind it is
            // found at the next open.
            Err(e) if matches!(e.errno(), libc::ENOENT | libc::ESTALE) => {
                tracing::debug!(
                    "history: directory {} went while compared: {e}",
                    dir.object()
                )
            }
            r => logged("a directory's entries", r),
        }
    }

    pub(super) fn after_create(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        ino: InodeNo,
        st: &Stat,
    ) {
        if let Ok(inode) = self.inodes.get(ino) {
            inode.set_name(parent, name.as_bytes());
        }
        if let Some(c) = self.capture() {
            let who = self.who(c, caller);
            logged(
                "a creation",
                c.created(
                    &Live(self),
                    parent.object(),
                    name.as_bytes(),
                    ino.object(),
                    st,
                    &who,
                ),
            );
            self.dirs_verified(c, &[parent]);
        }
    }

    /// A regular file made by an open that writes it: its name goes to
    /// history with the session's version, at close. The directory's new
    /// attributes go with that pending entry now, as with any other entry
    /// made through the mount; otherwise the directory's next lookup after
    /// the kernel forgot it would compare its whole listing with history's
    /// (a `stat` per entry), and would record a file still being written
    /// as having appeared behind the mount.
    pub(super) fn created_in_session(
        &self,
        c: &Capture,
        parent: InodeNo,
        name: &OsStr,
        ino: InodeNo,
    ) {
        c.created_in_session(
            parent.object(),
            name.as_bytes(),
            ino.object(),
            self.binding_of(ino),
        );
        self.dirs_verified(c, &[parent]);
    }

    pub(super) fn after_link(&self, caller: &Caller, parent: InodeNo, name: &OsStr, ino: InodeNo) {
        if let Some(c) = self.capture() {
            let who = self.who(c, caller);
            logged(
                "a link",
                c.linked(
                    &Live(self),
                    parent.object(),
                    name.as_bytes(),
                    ino.object(),
                    &who,
                ),
            );
            self.dirs_verified(c, &[parent]);
        }
    }

    /// Before an operation that removes or replaces `name` in `parent`
    /// takes the tree lock: waits, unlocked, for the version of that file
    /// being built (typically the one whose close just returned). Under the
    /// lock `Capture::before_change` waits again, now rarely: a branch
    /// change waiting for the lock exclusively is not kept waiting behind
    /// the ingest worker. The file is found as `hold_known` finds it (one
    /// system call, and only while some version is pending): one the
    /// kernel knows beside its parent's top copy, where a file just written
    /// is.
    pub(super) fn settle_named(&self, parent: InodeNo, name: &OsStr) {
        let Some(c) = self.capture().filter(|c| c.ingesting_any()) else {
            return;
        };
        let (Ok(dir), Ok(cname)) = (self.node(parent), sys::cstr(name)) else {
            return;
        };
        let Ok(st) = sys::fstatat(dir.fd(), &cname) else {
            return;
        };
        let key = self.inodes.key_in(self.inodes.branch_of(&dir.key), &st);
        if let Some(inode) = self.inodes.acquire_known(&key) {
            c.wait_ingests(inode.ino.object());
            self.inodes.forget(inode.ino, 1);
        }
    }

    /// The object `name` in `parent` names, registered for the duration of
    /// an operation that will change or remove it (capture reads it through
    /// the inode table). The caller must `forget` it afterwards.
    /// Without history, only a union holds it, to keep objects' names
    /// (a branch change finds their copies by them).
    pub(super) fn hold_named(&self, parent: InodeNo, name: &OsStr) -> Result<Option<InodeNo>> {
        if self.capture.is_none() {
            if self.union().is_none() {
                return Ok(None);
            }
            if !self.through_union() {
                return self.hold_known(parent, name);
            }
        }
        let dir = self.node(parent)?;
        match self.lookup_in(&dir, name) {
            Ok(e) => Ok(Some(e.attr.ino)),
            Err(e) if e.errno_is(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Vfs::hold_named`] in a union that is one directory: the object
    /// the kernel knows by that name, found by its key (one system call;
    /// a lookup would also check the handle and the layers).
    fn hold_known(&self, parent: InodeNo, name: &OsStr) -> Result<Option<InodeNo>> {
        let dir = self.node(parent)?;
        let st = match sys::fstatat(dir.fd(), &sys::cstr(name)?) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(self
            .inodes
            .acquire_known(&self.inodes.key_of(&st))
            .map(|inode| inode.ino))
    }

    pub(super) fn release_held(&self, held: Option<InodeNo>) {
        if let Some(ino) = held {
            self.inodes.forget(ino, 1);
        }
    }

    pub(super) fn binding_of(&self, ino: InodeNo) -> Option<Binding> {
        Live(self).binding(ino.object())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn after_remove(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        victim: InodeNo,
        binding: Option<Binding>,
        gone: bool,
        cause: Cause,
    ) {
        if let Some(c) = self.capture() {
            let who = self.who(c, caller);
            let recorded = c.removed(
                parent.object(),
                name.as_bytes(),
                victim.object(),
                binding,
                gone,
                cause,
                &who,
            );
            match recorded {
                Err(e) if is_store_full(e.errno()) => c
                    .history()
                    .note_unrecorded(&format!("the removal of object {}", victim.0)),
                r => logged("a removal", r),
            }
            self.dirs_verified(c, &[parent]);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn after_rename(
        &self,
        caller: &Caller,
        old: (InodeNo, &OsStr),
        new: (InodeNo, &OsStr),
        moved: InodeNo,
        victim: Option<(InodeNo, Option<Binding>, bool)>,
        exchange: bool,
    ) {
        if let Ok(inode) = self.inodes.get(moved) {
            inode.set_name(new.0, new.1.as_bytes());
        }
        if exchange {
            if let Some((v, _, _)) = victim {
                if let Ok(inode) = self.inodes.get(v) {
                    inode.set_name(old.0, old.1.as_bytes());
                }
            }
        }
        if let Some(c) = self.capture() {
            let who = self.who(c, caller);
            logged(
                "a rename",
                c.renamed(
                    &Live(self),
                    (old.0.object(), old.1.as_bytes()),
                    (new.0.object(), new.1.as_bytes()),
                    moved.object(),
                    victim.map(|(v, b, g)| (v.object(), b, g)),
                    exchange,
                    &who,
                ),
            );
            self.dirs_verified(c, &[old.0, new.0]);
        }
    }

    pub(super) fn after_change(&self, caller: &Caller, ino: InodeNo, cause: Cause) {
        self.after_change_times(caller, ino, cause, false);
    }

    /// After a change; `set_times`: it set times explicitly.
    pub(super) fn after_change_times(
        &self,
        caller: &Caller,
        ino: InodeNo,
        cause: Cause,
        set_times: bool,
    ) {
        if let Some(c) = self.capture() {
            let who = self.who(c, caller);
            logged(
                "a change",
                c.changed(&Live(self), ino.object(), cause, &who, set_times),
            );
        }
    }

    /// Opening `ino` for writing: secure its prior state first. The
    /// opening goes to `after_write_open` once the handle is open.
    /// `truncates`: an O_TRUNC open, which a full store lets through.
    pub(super) fn before_write_open(
        &self,
        ino: InodeNo,
        truncates: bool,
    ) -> Result<Option<Opening<'_>>> {
        match self.capture() {
            Some(c) => Ok(Some(c.session_opening(
                &Live(self),
                ino.object(),
                truncates,
            )?)),
            None => Ok(None),
        }
    }

    /// A write handle on `ino` is open: start (or join) its session.
    /// `opening`: what `before_write_open` gave (none for a new file).
    /// `daemon_path`: its writes come through the daemon (no passthrough);
    /// `trackable`: versions may then be built from the ranges written.
    pub(super) fn after_write_open(
        &self,
        caller: &Caller,
        ino: InodeNo,
        opening: Option<Opening<'_>>,
        daemon_path: bool,
        trackable: bool,
        every_write: bool,
    ) -> Result<bool> {
        let Some(c) = self.capture() else {
            return Ok(false);
        };
        let reader = Live(self).open_read(ino.object())?;
        let who = self.who(c, caller);
        let opening = opening.unwrap_or_else(|| c.new_file_opening(ino.object()));
        c.session_opened(
            opening,
            reader,
            who,
            daemon_path,
            daemon_path && trackable,
            every_write,
        );
        Ok(true)
    }

    /// Whether the file open as `fd` is to get a version per write (mount
    /// option or policy).
    pub(super) fn every_write(&self, caller: &Caller, ino: InodeNo, fd: BorrowedFd) -> bool {
        self.capture()
            .is_some_and(|c| c.every_write_for(ino.object(), fd, || self.who(c, caller)))
    }

    /// A write handle closed; `flushed`: close(2) flushed it first.
    pub(super) fn session_closed(&self, ino: InodeNo, flushed: bool) {
        if let Some(c) = self.capture() {
            c.session_closed(ino.object(), flushed);
        }
    }

    /// Every queued version is recorded (before a history query).
    pub fn settle_capture(&self) {
        if let Some(c) = self.capture() {
            c.settle();
        }
    }

    /// [`Vfs::settle_capture`] for a clone of `src` (components from the
    /// mount's root): waits for the versions of objects in it, above it
    /// or that cannot be placed, not for those known to lie elsewhere.
    /// While the mount's first walk runs, the objects it has not reached
    /// yet are in no queue: only a wait for everything covers them (a
    /// clone right after the first mount missed a lower branch's file).
    pub fn settle_capture_within(&self, src: &[Vec<u8>]) {
        let Some(c) = self.capture() else {
            return;
        };
        let walking = self
            .ingest_progress()
            .running
            .load(std::sync::atomic::Ordering::Acquire);
        let relevant = |obj| !self.known_apart_from(obj, src);
        if walking || !self.ingest_complete() {
            c.settle();
        } else {
            c.settle_where(&relevant);
        }
        // After the wait, which lets the releases of closes that returned
        // arrive: "as of its last close" counts closes other writers
        // outlived.
        c.version_closed_writes(&relevant);
    }

    /// Whether `obj` has one name only, known to lie neither in `src` nor
    /// above it. A file with several names may have one in `src`; an
    /// object the inode table no longer holds cannot be placed.
    fn known_apart_from(&self, obj: ObjectId, src: &[Vec<u8>]) -> bool {
        const DEEPEST: usize = 4096;
        let Ok(mut inode) = self.inodes.get(obj.into()) else {
            return false;
        };
        let single = self
            .inodes
            .fd(&inode)
            .and_then(|fd| Ok(sys::fstat(fd.as_fd())?))
            .is_ok_and(|st| st.st_nlink == 1 || st.st_mode & libc::S_IFMT == libc::S_IFDIR);
        if !single {
            return false;
        }
        let mut path = Vec::new();
        while inode.ino != InodeNo::ROOT {
            let Some((parent, name)) = inode.name() else {
                return false;
            };
            path.push(name);
            match self.inodes.get(parent) {
                Ok(p) if path.len() < DEEPEST => inode = p,
                _ => return false,
            }
        }
        path.reverse();
        !path.starts_with(src) && !src.starts_with(&path)
    }

    /// See `Capture::forget_known`.
    pub fn forget_known(&self, objs: &[ObjectId]) {
        if let Some(c) = self.capture() {
            c.forget_known(objs);
        }
    }
}

/// Whether open flags may change the file.
pub(super) fn writes(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
}
