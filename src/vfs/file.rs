//! Open files: open, create, read, write, flush, release, fsync,
//! fallocate, lseek, copy_file_range.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::inodes::{Handle, SessionMark};
use super::union_ops::MakeAt;
use super::versioning::writes;
use super::{errno, Attr, Caller, Entry, InodeNo, Result, Vfs, VfsError};
use crate::branch::BranchId;
use crate::sys::{self, creds};

/// An opened file: the handle number given to the kernel.
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub fh: u64,
    /// The backing file is a regular file whose I/O the kernel may do
    /// itself (FUSE passthrough) if the adapter chooses to.
    pub passthrough_ok: bool,
    /// Closing it ends a write session: the kernel should send FLUSH.
    pub session: bool,
    /// Each write is a version (`capture = every-write`): the kernel must
    /// send every write as the application issued it.
    pub per_write: bool,
}

/// How the object behind a freshly opened descriptor came to be.
enum Made {
    /// This call created it: it gets a new inode number.
    New,
    /// It already existed (O_CREAT without O_EXCL found it).
    Existing,
    /// O_TMPFILE: no name, so it is pinned.
    Unnamed,
}

/// Flags the kernel handles itself or that make no sense on re-open.
const DROPPED_OPEN_FLAGS: i32 = libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY;

impl Vfs {
    fn backing_open_flags(&self, flags: i32) -> i32 {
        let mut f = flags & !DROPPED_OPEN_FLAGS;
        if self.writeback() {
            // The kernel may read pages of a write-only file to fill partial
            // pages, and it positions O_APPEND writes itself.
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            f &= !libc::O_APPEND;
        }
        f
    }

    fn open_as_caller(
        &self,
        caller: &Caller,
        open: impl Fn(i32) -> std::io::Result<std::os::fd::OwnedFd>,
        requested: i32,
        mode: u32,
    ) -> Result<std::os::fd::OwnedFd> {
        let flags = self.backing_open_flags(requested);
        let attempt = |f: i32| {
            if mode & libc::S_ISGID != 0 {
                // Creating a set-group-ID file: membership decides, silently.
                creds::as_caller_with_groups(caller, || open(f))
            } else {
                creds::as_caller(caller, || open(f))
            }
        };
        match attempt(flags) {
            // A write-only file may refuse the read access writeback adds.
            Err(e)
                if e.raw_os_error() == Some(libc::EACCES)
                    && flags != requested & !DROPPED_OPEN_FLAGS =>
            {
                let plain = requested & !DROPPED_OPEN_FLAGS & !libc::O_APPEND;
                let proved = attempt(plain)?;
                // The caller may write it: the daemon opens it readable as
                // well, as libfuse's passthrough_ll does, or the kernel's
                // read of a partial page would meet a write-only
                // descriptor (EBADF for `echo more >> f` of a 0200 file).
                // A daemon that may not read it keeps the caller's.
                match sys::reopen(proved.as_fd(), flags & !libc::O_TRUNC) {
                    Ok(readable) => Ok(readable),
                    Err(_) => Ok(proved),
                }
            }
            other => Ok(other?),
        }
    }

    pub fn open(&self, caller: &Caller, ino: InodeNo, flags: i32) -> Result<Opened> {
        // With atomic O_TRUNC this open reaches the daemon before the
        // kernel's ETXTBSY check (it takes no write access first): the
        // daemon would truncate a running program under it. Dropping
        // atomic O_TRUNC instead would cost a SETATTR per O_TRUNC open and
        // take passthrough from large-file rewrites. A handle's RELEASE
        // comes after its program exited, so such an open in the instant
        // after the exit can still see ETXTBSY.
        if flags & libc::O_TRUNC != 0
            && flags & libc::O_ACCMODE == libc::O_RDONLY
            && self.handles.executing(ino)
        {
            return Err(errno(libc::ETXTBSY));
        }
        let _set = (writes(flags) || flags & libc::O_TRUNC != 0)
            .then(|| self.changing())
            .flatten();
        let source = self.source_of(ino);
        if writes(flags) {
            source.check_writable()?;
        }
        source.open(self, caller, flags)
    }

    pub(super) fn live_open(&self, caller: &Caller, ino: InodeNo, flags: i32) -> Result<Opened> {
        self.refuse_metacopy(ino)?;
        let truncates = flags & libc::O_TRUNC != 0;
        // An O_TRUNC open of a file a read-only branch holds copies none
        // of its bytes up; history secures them from that copy first.
        let early = match truncates && writes(flags) && self.capture.is_some() {
            true if self.copies_up_truncated(ino)? => self.before_write_open(ino, true)?,
            _ => None,
        };
        let (inode, made) = if writes(flags) || truncates {
            self.writable_node_for(caller, ino, (true, truncates.then_some(0)))?
        } else {
            (self.node(ino)?, None)
        };
        match inode.kind {
            libc::S_IFDIR => return Err(errno(libc::EISDIR)),
            libc::S_IFLNK => return Err(errno(libc::ELOOP)),
            _ => {}
        }
        // A clone's file that still shows its base reads the base; its own
        // descriptor serves once a writer has materialised it.
        let base = match self.clones_on() && !writes(flags) && flags & libc::O_TRUNC == 0 {
            true => self.open_base_if_marked(&inode)?,
            false => None,
        };
        // A patched file's bytes are partly its base's: the daemon serves
        // its I/O.
        let patched = match made {
            Some(p) => Some(p),
            None => self.patched(&inode)?,
        };
        let versioned = self.capture.is_some() && inode.kind == libc::S_IFREG && writes(flags);
        let opening = match (versioned, early) {
            (true, Some(early)) => Some(early),
            (true, None) => self.before_write_open(ino, truncates)?,
            (false, _) => None,
        };
        let reopen = || self.open_as_caller(caller, |f| sys::reopen(inode.fd(), f), flags, 0);
        let fd = match patched.as_ref().filter(|_| flags & libc::O_TRUNC != 0) {
            Some(p) => p.truncate_with(0, reopen)?,
            None => reopen()?,
        };
        // A large file updated in place goes through the daemon, which then
        // knows the ranges written: its versions cost what changed, not the
        // file (docs/ARCHITECTURE.md "Per-open write path").
        // A patched file's writes reach the daemon anyway: tracked at any
        // size (read whole, a 16-byte write into a 4 MiB clone file cost
        // its version 4 MiB of chunking).
        let track_from = match patched.is_some() || inode.inode.shared_at_change() {
            true => 0,
            false => crate::capture::track_min(),
        };
        let trackable = versioned
            && flags & libc::O_TRUNC == 0
            && self
                .capture()
                .is_some_and(|c| c.trackable(ino.object(), fd.as_fd(), track_from));
        // The policy may want each write to be a version: the daemon must
        // then see the writes.
        let every_write = versioned && self.every_write(caller, ino, fd.as_fd());
        let st = sys::fstat(fd.as_fd())?;
        let set_id = is_set_id(&st);
        if set_id {
            self.await_passthrough_release(ino, caller, flags, &st);
        }
        let passthrough = self.claim_io(
            ino,
            !every_write
                && !set_id
                && base.is_none()
                && patched.is_none()
                && !self.in_read_only_branch(&inode)
                && match self.cfg.write_path {
                    super::WritePath::Auto => !trackable,
                    super::WritePath::Passthrough => true,
                    super::WritePath::Daemon => false,
                },
            caller,
        );
        let daemon_path = !passthrough || self.writeback();
        if daemon_path && flags & libc::O_DIRECT != 0 {
            // The kernel still bypasses its cache for this handle; the
            // daemon's copies cannot meet O_DIRECT's alignment.
            sys::drop_o_direct(fd.as_fd())?;
        }
        let session = if versioned {
            match self.after_write_open(caller, ino, opening, daemon_path, trackable, every_write) {
                Ok(s) => s,
                Err(e) => {
                    self.release_io(ino);
                    return Err(e);
                }
            }
        } else {
            false
        };
        if session && flags & libc::O_TRUNC != 0 {
            self.wrote_range(ino, 0, u64::MAX);
        }
        let fh = self.handles.insert(Handle::File {
            ino,
            fd,
            opener: *caller,
            session: SessionMark::new(session),
            writes: writes(flags),
            branch: inode.key.branch,
            base,
            patched: parking_lot::Mutex::new(patched.clone()),
            executes: flags & FMODE_EXEC != 0,
            per_write: every_write,
            followed: parking_lot::Mutex::new(None),
        });
        Ok(Opened {
            fh,
            passthrough_ok: passthrough && inode.kind == libc::S_IFREG,
            session,
            per_write: every_write,
        })
    }

    /// A create of a name the union holds: the kernel sends one where it
    /// kept the name as absent (changed behind the mount's back, or a
    /// race). As open(2) with O_CREAT: the object there is opened (EEXIST
    /// with O_EXCL); a new file in the top branch would hide a lower one.
    fn create_of_a_lower_name(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        flags: i32,
    ) -> Result<Option<(Entry, Opened)>> {
        if self.union().is_none() {
            return Ok(None);
        }
        if !self.lookup_exists(&self.node(parent)?, name)? {
            return Ok(None);
        }
        if flags & libc::O_EXCL != 0 {
            return Err(errno(libc::EEXIST));
        }
        let entry = self.lookup(caller, parent, name)?;
        match self.open(
            caller,
            entry.attr.ino,
            flags & !(libc::O_CREAT | libc::O_EXCL),
        ) {
            Ok(opened) => Ok(Some((entry, opened))),
            Err(e) => {
                self.forget(entry.attr.ino, 1);
                Err(e)
            }
        }
    }

    /// A union's object in a read-only branch is read without kernel
    /// passthrough: once the kernel has a backing file for an inode, every
    /// open of it must use that one, and a copy-up while such a handle is
    /// open would send the writer's I/O to the lower file.
    pub(super) fn in_read_only_branch(&self, inode: &super::inodes::Node) -> bool {
        self.union()
            .is_some_and(|u| !u.writable(self.inodes.branch_of(&inode.key)))
    }

    /// Joins the I/O mode of `ino`'s open handles, or sets it if there
    /// are none; returns whether this handle may use passthrough.
    /// `opener` registers the backing when it is the first (the kernel
    /// then does every handle's I/O with its credentials).
    fn claim_io(&self, ino: InodeNo, want_passthrough: bool, opener: &Caller) -> bool {
        let mut modes = self.io_modes.lock();
        let family = modes.entry(ino).or_insert(IoFamily {
            passthrough: want_passthrough,
            handles: 0,
            registrar: *opener,
        });
        family.handles += 1;
        family.passthrough
    }

    /// Whether `ino`'s open handles may use kernel passthrough (the
    /// adapter may still have been refused a backing file: counted as
    /// using it).
    pub(super) fn uses_passthrough(&self, ino: InodeNo) -> bool {
        self.passthrough.load(std::sync::atomic::Ordering::Relaxed)
            && self
                .io_modes
                .lock()
                .get(&ino)
                .is_some_and(|m| m.passthrough)
    }

    pub(super) fn release_io(&self, ino: InodeNo) {
        let mut modes = self.io_modes.lock();
        if let Some(family) = modes.get_mut(&ino) {
            family.handles -= 1;
            if family.handles == 0 {
                modes.remove(&ino);
                self.io_released.notify_all();
            }
        }
    }

    /// Before a set-ID file's handle claims its io mode: a handle with
    /// kernel passthrough still counted is usually a file closed just
    /// before, whose release the kernel sends after close returns (a
    /// create as root, then chmod to set-ID). Its backing file carries its
    /// registrar's credentials, without CAP_FSETID, and a write through it
    /// clears set-ID bits by those. An open for writing whose writes would
    /// clear other bits than natively (`clears_otherwise`) waits for that
    /// release as long as history waits for one: 100 ms ran out on a
    /// loaded CI machine, and a member's append to a set-group-ID file
    /// through root's backing lost the bit. Others do not wait (the bits
    /// come out the same), but a read waits 100 ms, so as not to keep the
    /// backing alive for the writers after it. One really held open still
    /// decides after that, as before: only a set-ID file held open
    /// elsewhere pays the wait.
    fn await_passthrough_release(&self, ino: InodeNo, opener: &Caller, flags: i32, st: &sys::Stat) {
        let mut modes = self.io_modes.lock();
        let wait = match modes.get(&ino) {
            Some(family) if family.passthrough => match writes(flags) {
                false => std::time::Duration::from_millis(100),
                true if clears_otherwise(opener, &family.registrar, st) => {
                    std::time::Duration::from_secs(2)
                }
                true => return,
            },
            _ => return,
        };
        let deadline = std::time::Instant::now() + wait;
        while modes.get(&ino).is_some_and(|m| m.passthrough) {
            if self
                .io_released
                .wait_until(&mut modes, deadline)
                .timed_out()
            {
                return;
            }
        }
    }

    /// Bytes of `ino` written through the daemon, for history; whether
    /// the write is to be a version of its own.
    pub(super) fn wrote_range(&self, ino: InodeNo, off: u64, len: u64) -> bool {
        self.capture()
            .is_some_and(|c| c.wrote_range(ino.object(), off, len))
    }

    pub fn create(
        &self,
        caller: &Caller,
        parent: InodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Entry, Opened)> {
        let _set = self.changing();
        self.check_name(parent, name)?;
        if let Some(existing) = self.create_of_a_lower_name(caller, parent, name, flags)? {
            return Ok(existing);
        }
        let cname = sys::cstr(name)?;
        let at = self.create_target(caller, parent, &cname)?;
        let dir = &at.dir;
        creds::set_thread_umask(umask)?;
        fn open_in_dir<'a>(
            at: &MakeAt<'a>,
            extra: i32,
            mode: u32,
        ) -> impl Fn(i32) -> std::io::Result<std::os::fd::OwnedFd> + 'a {
            let (dirfd, name) = (at.dir, at.name);
            move |f: i32| sys::openat(dirfd, name, f | extra | libc::O_NOFOLLOW, mode)
        }
        // Exclusive first, to know whether this call made the object (then
        // it gets a new inode number without consulting the index).
        let excl = libc::O_CREAT | libc::O_EXCL;
        if self.capture.is_some() {
            self.before_dir_change(parent)?;
        }
        let open = |at: MakeAt<'_>| match self.open_as_caller(
            caller,
            open_in_dir(&at, excl, mode),
            flags,
            mode,
        ) {
            Ok(fd) => Ok((fd, true)),
            Err(e) if e.errno_is(libc::EEXIST) && flags & libc::O_EXCL == 0 => {
                // With history on, an existing file's content must be
                // secured before O_TRUNC empties it: open without it and
                // truncate once the file is registered.
                let open_flags = if self.capture.is_some() {
                    flags & !libc::O_TRUNC
                } else {
                    flags
                };
                Ok((
                    self.open_as_caller(caller, open_in_dir(&at, 0, mode), open_flags, 0)?,
                    false,
                ))
            }
            Err(e) => Err(e),
        };
        let ((fd, created), _) = self.create_over_whiteout(dir, &cname, open)?;
        let made = if created { Made::New } else { Made::Existing };
        let named = Some((parent, name.as_encoded_bytes()));
        let (entry, opened) =
            self.register_opened(caller, fd, made, (named, at.branch), writes(flags))?;
        if created {
            match self.capture() {
                // Recorded with the session's version at close.
                Some(c) if writes(flags) => {
                    self.created_in_session(c, parent, name, entry.attr.ino);
                }
                _ => self.after_create(caller, parent, name, entry.attr.ino, &entry.attr.st),
            }
        }
        let mut opened = opened;
        match self.start_session(caller, &entry, &opened, flags, created) {
            Ok(session) => opened.session = session,
            Err(e) => {
                let _ = self.release(opened.fh);
                self.forget(entry.attr.ino, 1);
                return Err(e);
            }
        }
        Ok((self.refresh(entry, opened.fh)?, opened))
    }

    /// With history on: a handle create opened for writing starts a write
    /// session (after securing an existing file's content and applying the
    /// O_TRUNC deferred for that).
    fn start_session(
        &self,
        caller: &Caller,
        entry: &Entry,
        opened: &Opened,
        flags: i32,
        created: bool,
    ) -> Result<bool> {
        if self.capture.is_none() || entry.attr.kind() != libc::S_IFREG || !writes(flags) {
            return Ok(false);
        }
        let ino = entry.attr.ino;
        let mut opening = None;
        if !created {
            opening = self.before_write_open(ino, flags & libc::O_TRUNC != 0)?;
            if flags & libc::O_TRUNC != 0 {
                self.with_file(opened.fh, |fd, _| {
                    Ok(creds::as_caller(caller, || sys::ftruncate(fd, 0))?)
                })?;
            }
        }
        let daemon_path = !opened.passthrough_ok || self.writeback();
        let every_write =
            self.with_file(opened.fh, |fd, _| Ok(self.every_write(caller, ino, fd)))?;
        let session =
            self.after_write_open(caller, ino, opening, daemon_path, false, every_write)?;
        if session {
            if !self.handles.mark_session(opened.fh) {
                self.session_closed(ino, false);
            }
            if !created && flags & libc::O_TRUNC != 0 {
                self.wrote_range(ino, 0, u64::MAX);
            }
        }
        Ok(session)
    }

    /// Attributes after a deferred truncation.
    fn refresh(&self, mut entry: Entry, fh: u64) -> Result<Entry> {
        if self.capture.is_some() {
            entry.attr.st = self.with_file_fd(fh, |fd| Ok(sys::fstat(fd)?))?;
        }
        Ok(entry)
    }

    /// open(dir, O_TMPFILE): an unnamed file in `parent`, opened; linkat
    /// can give it a name later (unless the caller asked for O_EXCL).
    pub fn tmpfile(
        &self,
        caller: &Caller,
        parent: InodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Entry, Opened)> {
        let _set = self.changing();
        self.source_of(parent).check_writable()?;
        let dir = self.writable_dir(caller, parent)?;
        creds::set_thread_umask(umask)?;
        let dirfd = dir.fd();
        // O_EXCL means "never linkable" here; the rest is handled as for open.
        let keep = (flags & libc::O_EXCL) | libc::O_TMPFILE;
        let requested = flags & !libc::O_TMPFILE;
        let fd = self.open_as_caller(
            caller,
            |f| sys::openat(dirfd, c".", f | keep, mode),
            requested,
            mode,
        )?;
        let (entry, mut opened) =
            self.register_opened(caller, fd, Made::Unnamed, (None, None), writes(flags))?;
        if self.capture.is_some()
            && writes(flags)
            && self.after_write_open(
                caller,
                entry.attr.ino,
                None,
                !opened.passthrough_ok || self.writeback(),
                false,
                false,
            )?
        {
            if !self.handles.mark_session(opened.fh) {
                self.session_closed(entry.attr.ino, false);
            }
            opened.session = true;
        }
        Ok((entry, opened))
    }

    /// Registers the regular file behind a descriptor create or tmpfile
    /// just opened, and opens a handle on it.
    /// `named`: where it was created (set before the I/O mode is chosen, so
    /// a policy's path rules see it) and the union branch it was made in
    /// when not the default one; `writing`: opened for writing.
    fn register_opened(
        &self,
        caller: &Caller,
        fd: OwnedFd,
        made: Made,
        (named, branch): (Option<(InodeNo, &[u8])>, Option<BranchId>),
        writing: bool,
    ) -> Result<(Entry, Opened)> {
        let st = sys::fstat(fd.as_fd())?;
        let path_fd = sys::reopen(fd.as_fd(), libc::O_PATH)?;
        let inode = match (made, branch) {
            (Made::New, Some(b)) => self.inodes.acquire_new_in(b, path_fd, &st, true)?,
            (Made::Existing, Some(b)) => self.inodes.acquire_new_in(b, path_fd, &st, false)?,
            (Made::New, None) => self.inodes.acquire_new(path_fd, &st, true)?,
            (Made::Existing, None) => self.inodes.acquire_new(path_fd, &st, false)?,
            (Made::Unnamed, _) => self.inodes.acquire_unnamed(path_fd, &st)?,
        };
        if let Some((parent, name)) = named {
            inode.set_name(parent, name);
        }
        let every_write = writing && self.every_write(caller, inode.ino, fd.as_fd());
        let passthrough = self.claim_io(
            inode.ino,
            !every_write && self.cfg.write_path != super::WritePath::Daemon && !is_set_id(&st),
            caller,
        );
        if !passthrough || self.writeback() {
            sys::drop_o_direct(fd.as_fd())?;
        }
        let fh = self.handles.insert(Handle::File {
            ino: inode.ino,
            fd,
            opener: *caller,
            session: SessionMark::default(),
            writes: writing,
            branch: inode.key.branch,
            base: None,
            patched: parking_lot::Mutex::new(None),
            executes: false,
            per_write: every_write,
            followed: parking_lot::Mutex::new(None),
        });
        let entry = Entry {
            attr: Attr { ino: inode.ino, st },
            entry_ttl: None,
        };
        Ok((
            entry,
            Opened {
                fh,
                passthrough_ok: passthrough,
                session: false,
                per_write: every_write,
            },
        ))
    }

    /// Runs `f` with the backing descriptor of an open file.
    pub fn with_file_fd<T>(
        &self,
        fh: u64,
        f: impl FnOnce(BorrowedFd<'_>) -> Result<T>,
    ) -> Result<T> {
        self.handle_source(fh).backing(self, f)
    }

    /// Runs `f` with the backing descriptor of an open file and its opener.
    pub(super) fn with_file<T>(
        &self,
        fh: u64,
        f: impl FnOnce(BorrowedFd<'_>, &Caller) -> Result<T>,
    ) -> Result<T> {
        let handle = self.handles.get(fh)?;
        match &*handle {
            Handle::File { fd, opener, .. } => match self.followed(&handle) {
                Some(copy) => f(copy.as_fd(), opener),
                None => f(fd.as_fd(), opener),
            },
            Handle::Dir { .. } => Err(errno(libc::EISDIR)),
        }
    }

    /// The copy a union's reader reads instead of the object it opened,
    /// once that was copied up to another branch: as on overlayfs since
    /// Linux 4.19, a descriptor opened before a copy-up sees the writes
    /// after it. Writers need none (a write open copies up first); a
    /// reader's read-only branch has no passthrough, so its reads reach
    /// the daemon. The copy is opened with the daemon's identity, as
    /// overlayfs opens it with the mounter's: the opener was checked
    /// when it opened. None: the handle's own descriptor serves.
    pub(super) fn followed(&self, handle: &Handle) -> Option<std::sync::Arc<OwnedFd>> {
        let Handle::File {
            ino,
            writes: false,
            branch,
            followed,
            ..
        } = handle
        else {
            return None;
        };
        self.union()?;
        let node = self.node(*ino).ok()?;
        let now = self.inodes.branch_of(&node.key).0;
        if now == *branch {
            return None;
        }
        let mut held = followed.lock();
        if let Some((b, fd)) = &*held {
            if *b == now {
                return Some(fd.clone());
            }
        }
        match sys::reopen(node.fd(), libc::O_RDONLY | libc::O_CLOEXEC) {
            Ok(fd) => {
                let fd = std::sync::Arc::new(fd);
                *held = Some((now, fd.clone()));
                Some(fd)
            }
            Err(e) => {
                tracing::debug!("a reader keeps the object it opened: its copy up: {e}");
                None
            }
        }
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.handle_source(fh).read(self, offset, size)
    }

    pub(super) fn live_read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        if let Some(base) = self.base_while_marked(fh)? {
            return self.view_read(base, offset, size);
        }
        if let Some(p) = self.patched_handle(fh)? {
            return p.read(offset, size);
        }
        self.with_file(fh, |fd, _| {
            let mut buf = vec![0u8; size as usize];
            let n = sys::pread(fd, &mut buf, offset)?;
            buf.truncate(n);
            Ok(buf)
        })
    }

    /// Writes at `offset`, with the opener's identity. `kill_priv` (the
    /// kernel's request to clear set-id bits, as an unprivileged writer
    /// would) makes an unprivileged writer's own identity count instead;
    /// for root without CAP_FSETID the request thread already runs
    /// without it (`creds::lacking_fsetid`).
    pub fn write(
        &self,
        caller: &Caller,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_priv: bool,
    ) -> Result<usize> {
        let _set = self.changing();
        self.handle_source(fh).check_writable()?;
        let handle = self.handles.get(fh)?;
        let Handle::File {
            ino,
            fd,
            opener,
            per_write,
            ..
        } = &*handle
        else {
            return Err(errno(libc::EISDIR));
        };
        let who = if kill_priv && caller.uid != 0 {
            caller
        } else {
            opener
        };
        let patched = self.patched_handle(fh)?;
        let keep = self.writeback() && !per_write;
        let n = self.keeping_kernel_mtime(keep, *ino, fd.as_fd(), || match &patched {
            Some(p) => p.write(who, offset, data),
            None => Ok(creds::as_caller(who, || {
                sys::pwrite(fd.as_fd(), data, offset)
            })?),
        })?;
        // After the write: a version built meanwhile either saw these bytes
        // or finds the range in the next set.
        if self.wrote_range(*ino, offset, n as u64) {
            if let Some(c) = self.capture() {
                c.wrote(ino.object())?;
            }
        }
        Ok(n)
    }

    /// With the writeback cache the kernel keeps a written file's mtime
    /// itself, and sends it (a setattr) only when its own clock moved it:
    /// the write reaching the backing file must not move the backing
    /// file's, or it would differ from what the kernel shows by the time
    /// between the two clocks' ticks, for history and after a remount.
    /// Runs `write` keeping the backing file's mtime, under the lock a
    /// setattr of times takes.
    /// (Not for a handle whose writes the kernel sends uncached: it does
    /// not move its own mtime for those.)
    fn keeping_kernel_mtime(
        &self,
        keep: bool,
        ino: InodeNo,
        fd: std::os::fd::BorrowedFd<'_>,
        write: impl FnOnce() -> Result<usize>,
    ) -> Result<usize> {
        if !keep {
            return write();
        }
        let _times = self.mtime_lock(ino).lock();
        let before = sys::fstat(fd)?;
        let n = write()?;
        let mtime = sys::TimeSpec::At {
            secs: before.st_mtime,
            nsecs: before.st_mtime_nsec,
        };
        sys::utimens_fd(fd, sys::TimeSpec::Omit, mtime)?;
        Ok(n)
    }

    /// close(2) of a handle. Data is written through on every request and
    /// locks are the kernel's own, so there is nothing to write; with
    /// history on, a write session's close is noted so that a query made
    /// right after close(2) waits for its version. Returns whether flushes
    /// are wanted at all (only with history on).
    pub fn flush(&self, fh: u64) -> Result<bool> {
        self.handle_source(fh).flush(self)
    }

    pub(super) fn live_flush(&self, fh: u64) -> Result<bool> {
        let handle = self.handles.get(fh)?;
        let Some(c) = self.capture() else {
            return Ok(false);
        };
        if let Handle::File {
            ino,
            session,
            writes,
            ..
        } = &*handle
        {
            if *writes {
                self.settle_patched(fh, false)?;
            }
            if session.is_open() {
                c.flushed(ino.object(), session.note_flush());
            }
        }
        Ok(true)
    }

    /// Closes a handle; returns the inode it belonged to.
    pub fn release(&self, fh: u64) -> Result<Option<InodeNo>> {
        self.handle_source(fh).release(self)
    }

    pub(super) fn live_release(&self, fh: u64) -> Result<Option<InodeNo>> {
        let handle = self.handles.remove(fh)?;
        Ok(Some(self.close_handle(handle)))
    }

    /// Closes a handle already taken out of the table (released by its
    /// owner, or revoked by a branch change); returns its inode.
    pub(super) fn close_handle(&self, handle: Arc<Handle>) -> InodeNo {
        let ino = handle.ino();
        let session = match &*handle {
            Handle::File { session, base, .. } => {
                if let Some((view, _)) = base {
                    let _ = self.view_release(*view);
                }
                session.end()
            }
            Handle::Dir { .. } => None,
        };
        let file = matches!(&*handle, Handle::File { .. });
        let patched = match &*handle {
            Handle::File { patched, .. } => patched.lock().clone(),
            _ => None,
        };
        // Its descriptor closes first: the session's end asks whether the
        // file is still open for writing anywhere else.
        drop(handle);
        // The mark catches up with writes through a mapping after the
        // last flush, and a writer's file is flattened. Before the
        // session's version is taken: a new mark changes the file's ctime,
        // and a version older than that would not vouch for the live file
        // (views and clones of it would read history).
        if let Some(p) = patched {
            // A flattening rebases the mark onto another instant.
            let _moving = session.map(|_| self.clones.moves.start());
            if let Err(e) = p.flatten_and_persist(session.is_some()) {
                tracing::warn!("a clone file's patch mark could not be written: {e}");
            }
        }
        // The kernel gave up the handle's passthrough before it sent the
        // release: a set-ID file's open may be waiting for exactly this
        // (`await_passthrough_release`), and the session's end can build
        // a version here when the ingest worker is behind.
        if file {
            self.release_io(ino);
        }
        if let Some(flushed) = session {
            self.session_closed(ino, flushed);
        }
        ino
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        self.handle_source(fh).fsync(self, datasync)
    }

    pub(super) fn live_fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        let handle = self.handles.get(fh)?;
        match &*handle {
            Handle::File {
                fd, session, ino, ..
            } => {
                self.settle_patched(fh, true)?;
                // History first: the prior state secured at the open (an
                // O_TRUNC's old bytes) must be durable before the new
                // bytes are, or a power cut in between loses it. The
                // file's own fsync runs even if history's failed.
                let recorded = match (session.is_open(), self.capture()) {
                    (true, Some(c)) => c.fsync(ino.object()),
                    _ => Ok(()),
                };
                sys::fsync(fd.as_fd(), datasync)?;
                recorded?;
            }
            Handle::Dir { stream, .. } => {
                sys::fsync(stream.lock().fd(), datasync)?;
                if let Some(c) = self.capture() {
                    c.fsync_dir()?;
                }
            }
        }
        Ok(())
    }

    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        let _set = self.changing();
        self.handle_source(fh).check_writable()?;
        // Hole punching and range shifts are the backing file's own: it
        // must hold all its bytes first.
        if self.patched_handle(fh)?.is_some() {
            self.materialise(&self.node(self.handles.get(fh)?.ino())?)?;
        }
        self.with_file(fh, |fd, opener| {
            Ok(creds::as_caller(opener, || {
                sys::fallocate(fd, mode, offset, len)
            })?)
        })?;
        // Collapsing or inserting a range moves everything after it.
        let shifts = mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0;
        let ino = self.handles.get(fh)?.ino();
        self.wrote_range(ino, offset, if shifts { u64::MAX } else { len });
        Ok(())
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        self.handle_source(fh).lseek(self, offset, whence)
    }

    pub(super) fn live_lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        if let Some(base) = self.base_while_marked(fh)? {
            return self.view_lseek(base, offset, whence);
        }
        if let Some(p) = self.patched_handle(fh)? {
            return p.lseek(offset, whence);
        }
        self.with_file(fh, |fd, _| Ok(sys::lseek(fd, offset, whence)?))
    }

    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<usize> {
        let _set = self.changing();
        self.handle_source(fh_out).check_writable()?;
        self.handle_source(fh_in).check_copyable()?;
        let input = self.handles.get(fh_in)?;
        let Handle::File { fd: fd_in, .. } = &*input else {
            return Err(VfsError::WrongKind);
        };
        // The kernel copies from the descriptor: a clone's file that still
        // shows its base must hold its bytes first.
        if self.base_while_marked(fh_in)?.is_some() || self.patched_handle(fh_in)?.is_some() {
            self.materialise(&self.node(input.ino())?)?;
        }
        if self.patched_handle(fh_out)?.is_some() {
            self.materialise(&self.node(self.handles.get(fh_out)?.ino())?)?;
        }
        let copy_in = self.followed(&input);
        let fd_in = copy_in.as_deref().unwrap_or(fd_in);
        let n = self.with_file(fh_out, |fd_out, opener| {
            Ok(creds::as_caller(opener, || {
                sys::copy_file_range(fd_in.as_fd(), off_in, fd_out, off_out, len)
            })?)
        })?;
        let ino = self.handles.get(fh_out)?.ino();
        self.wrote_range(ino, off_out, n as u64);
        Ok(n)
    }
}

/// The open flag the kernel sets on the file execve(2) opens
/// (`__FMODE_EXEC`, include/linux/fs.h); FUSE passes it on in OPEN.
const FMODE_EXEC: i32 = 0x20;

/// Whether a write to a file of this mode may clear set-ID bits natively
/// (set-user-ID; set-group-ID, with group execute or for a writer outside
/// the group). Such a file is never
/// given a passthrough backing: the kernel shares one backing per inode,
/// registered with its first opener's credentials, and a write by another
/// user through root's would keep the bits (a user's code in a set-user-ID
/// root program). Through the daemon each write clears them as the kernel
/// asks.
fn is_set_id(st: &sys::Stat) -> bool {
    st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0
}

/// The open handles of one inode: the kernel refuses to mix passthrough
/// and cached opens of an inode, so the first open chooses for all.
pub(super) struct IoFamily {
    pub(super) passthrough: bool,
    pub(super) handles: u32,
    /// The first opener, whose credentials a passthrough backing carries.
    registrar: Caller,
}

/// Whether `opener`'s writes to a file of `st` through a backing that
/// `registrar` registered (its credentials less CAP_FSETID, no
/// supplementary groups) clear other set-ID bits than its own writes do
/// natively. Root keeps the bits natively; any other writer clears
/// set-user-ID and a group-executable set-group-ID either way, and a
/// set-group-ID bit without group execute (which grants nothing) unless it
/// is a member of the file's group.
fn clears_otherwise(opener: &Caller, registrar: &Caller, st: &sys::Stat) -> bool {
    if opener.uid == 0 {
        return true;
    }
    if st.st_mode & (libc::S_ISGID | libc::S_IXGRP) != libc::S_ISGID {
        return false;
    }
    let member = opener.gid == st.st_gid
        || (opener.pid != 0
            && creds::supplementary_groups(opener.pid).is_ok_and(|g| g.contains(&st.st_gid)));
    member != (registrar.gid == st.st_gid)
}
