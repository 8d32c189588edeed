//! The FUSE adapter: decodes kernel requests, calls the vfs, replies.
//!
//! Owns: the kernel connection's negotiation (capabilities, passthrough,
//! writeback cache), conversion between vfs and `fuser` types, and the
//! passthrough backing ids (a `fuser` object) per open inode.
//! Uses: `vfs`, `sys::creds`. Must not do file system work itself: every
//! operation is one vfs call. No `fuser` type appears outside this module.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

pub use fuser::{Transport, TransportState};

/// The name `chronofs status` shows for a transport.
pub fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::IoUring => "io_uring",
        Transport::DevFuse => "/dev/fuse",
    }
}

use crate::sys::creds::{self, Caller};
use crate::sys::TimeSpec;
use crate::vfs::{Attr, DirCache, InodeNo as VIno, Opened, SetAttr, Vfs, VfsError, Xattr};

mod blocking;
mod counts;
mod session;
use counts::Req;
pub use counts::RequestCounts;
pub use session::{MountSpec, Mounted};

/// How the adapter asks the kernel to behave.
#[derive(Clone, Debug)]
pub struct AdapterConfig {
    /// Use FUSE passthrough for regular files when the kernel offers it.
    pub passthrough: bool,
    /// Use the writeback cache when passthrough is not in use.
    pub writeback: bool,
    pub readdirplus: ReaddirPlus,
}

/// When directory listings carry attributes (saving a LOOKUP per entry for
/// `ls -l`, `du`, `rm -r`, at the cost of looking every entry up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaddirPlus {
    /// The kernel decides per listing (plus when entries get stat'ed).
    Auto,
    Always,
    Never,
}

pub struct ChronoFuse {
    vfs: Arc<Vfs>,
    cfg: AdapterConfig,
    passthrough_active: AtomicBool,
    /// One backing id per inode with passthrough opens, shared by all of
    /// them (the kernel refuses two backing files for one inode), with the
    /// number of open handles using it.
    backing: Mutex<HashMap<VIno, (Arc<BackingId>, usize)>>,
    /// Handles that hold a reference in `backing`.
    passthrough_handles: Mutex<HashMap<u64, VIno>>,
    /// Set once the session exists; used to tell the kernel to drop
    /// attributes it caches but can no longer trust.
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Where fsync runs, so a slow flush does not hold a request thread.
    blocking: blocking::BlockingPool,
    counts: Arc<RequestCounts>,
}

impl ChronoFuse {
    pub fn new(vfs: Arc<Vfs>, cfg: AdapterConfig) -> std::io::Result<Self> {
        Ok(ChronoFuse {
            vfs,
            cfg,
            passthrough_active: AtomicBool::new(false),
            backing: Mutex::new(HashMap::new()),
            passthrough_handles: Mutex::new(HashMap::new()),
            notifier: Arc::new(OnceLock::new()),
            blocking: blocking::BlockingPool::new(FSYNC_WORKERS)?,
            counts: Arc::new(RequestCounts::default()),
        })
    }

    /// The requests this adapter has served, by kind (shared, live).
    pub fn request_counts(&self) -> Arc<RequestCounts> {
        self.counts.clone()
    }

    fn notifier_slot(&self) -> Arc<OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// After history removes versions (prune, purge, retention), the
    /// kernel must forget the names and attributes it caches for views:
    /// they are cached for a day, and would show what is gone.
    fn forget_removed_views(&self) {
        let notifier = self.notifier.clone();
        let vfs = Arc::downgrade(&self.vfs);
        self.vfs.on_history_removal(Box::new(move || {
            let (Some(n), Some(vfs)) = (notifier.get(), vfs.upgrade()) else {
                return;
            };
            for (parent, name, node) in vfs.view_names() {
                // ENOENT: the kernel no longer has it, which is the aim.
                let _ = n.inval_entry(INodeNo(parent.0), OsStr::from_bytes(&name));
                let _ = n.inval_inode(INodeNo(node.0), 0, 0);
            }
        }));
    }
}

impl ChronoFuse {
    fn setattr_as(&self, req: &Request, i: INodeNo, set: SetAttr, reply: ReplyAttr) {
        self.counts.add(Req::Setattr);
        match self.vfs.setattr(&caller(req), ino(i), set) {
            Ok(a) => reply.attr(&self.vfs.attr_ttl(&a), &to_file_attr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }
}

impl ChronoFuse {
    /// The vfs changed attributes the kernel may cache (for a day, by
    /// default) with no reply to carry them: it must fetch them again.
    /// Attributes only, so it is safe inside the request that made the
    /// change (see `invalidate_attrs`).
    fn invalidate_changed_attrs(&self) {
        let notifier = self.notifier.clone();
        self.vfs.on_attrs_changed(Box::new(move |i| {
            invalidate_attrs(&notifier, INodeNo(i.0));
        }));
        let notifier = self.notifier.clone();
        self.vfs.on_name_made(Box::new(move |parent, name| {
            if let Some(n) = notifier.get() {
                // ENOENT: the kernel has no entry, which is the aim.
                let _ = n.inval_entry(INodeNo(parent.0), OsStr::from_bytes(name));
            }
        }));
    }
}

impl ChronoFuse {
    /// A union's branch set changed: every name the kernel caches may now
    /// resolve elsewhere. One FUSE_NOTIFY_INC_EPOCH marks them all stale
    /// (Linux 6.16+); an older kernel refuses it, and is told name by name.
    fn drop_names_at_set_change(&self) {
        let notifier = self.notifier.clone();
        let vfs = Arc::downgrade(&self.vfs);
        self.vfs.on_set_changed(Box::new(move |may_block| {
            let Some(n) = notifier.get() else {
                return true;
            };
            let Err(e) = n.increment_epoch() else {
                return true;
            };
            if !may_block {
                return false;
            }
            tracing::debug!("epoch increment refused ({e}): invalidating name by name");
            let Some(vfs) = vfs.upgrade() else {
                return true;
            };
            for (parent, name) in vfs.known_names() {
                // ENOENT: the kernel no longer has it, which is the aim.
                let _ = n.inval_entry(INodeNo(parent.0), OsStr::from_bytes(&name));
            }
            true
        }));
    }
}

/// Makes the kernel fetch the attributes of `ino` again on next use.
fn invalidate_attrs(notifier: &OnceLock<fuser::Notifier>, ino: INodeNo) {
    if let Some(n) = notifier.get() {
        // A negative offset invalidates attributes only, not pages.
        if let Err(e) = n.inval_inode(ino, -1, 0) {
            tracing::debug!("attribute invalidation of inode {} failed: {e}", ino.0);
        }
    }
}

/// Without KEEP_CACHE the kernel drops the directory's cached listing at
/// open; with CACHE_DIR it caches what it reads (fs/fuse/readdir.c).
fn dir_cache_flags(cache: DirCache) -> FopenFlags {
    match cache {
        DirCache::Off => FopenFlags::empty(),
        DirCache::Fresh => FopenFlags::FOPEN_CACHE_DIR,
        DirCache::Keep => FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
    }
}

/// Threads for fsync; more concurrent flushes queue behind them.
const FSYNC_WORKERS: usize = 8;

/// The readahead the session asks for: the kernel grants at most its
/// default (128 KiB) at INIT, and the mount's bdi is widened to this once
/// mounted (`cli::mount`). One request per MiB, as `max_write` for writes.
pub const MAX_READAHEAD: u32 = 1 << 20;

impl ChronoFuse {
    pub fn passthrough_active(&self) -> bool {
        self.passthrough_active.load(Ordering::Relaxed)
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn err(e: VfsError) -> Errno {
    tracing::debug!("error: {e}");
    Errno::from_i32(e.errno())
}

fn ino(i: INodeNo) -> VIno {
    VIno(i.0)
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = Duration::from_nanos(nsecs.clamp(0, 999_999_999) as u64);
    let moved = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs as u64) + nanos)
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(secs.unsigned_abs()))
            .and_then(|t| t.checked_add(nanos))
    };
    // Beyond what SystemTime can hold: the epoch rather than a panic.
    moved.unwrap_or(UNIX_EPOCH)
}

fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn to_file_attr(a: &Attr) -> FileAttr {
    let st = &a.st;
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: file_type(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// What a SETATTR asks, from fuser's arguments (its plain and its
/// kill-suidgid forms carry the same ones).
fn set_attr(
    mode: Option<u32>,
    (uid, gid): (Option<u32>, Option<u32>),
    size: Option<u64>,
    (atime, mtime): (Option<TimeOrNow>, Option<TimeOrNow>),
    fh: Option<FileHandle>,
) -> SetAttr {
    SetAttr {
        mode,
        uid,
        gid,
        size,
        atime: atime.map(time_spec),
        mtime: mtime.map(time_spec),
        fh: fh.map(|f| f.0),
    }
}

fn time_spec(t: TimeOrNow) -> TimeSpec {
    match t {
        TimeOrNow::Now => TimeSpec::Now,
        TimeOrNow::SpecificTime(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => TimeSpec::At {
                secs: d.as_secs() as i64,
                nsecs: i64::from(d.subsec_nanos()),
            },
            // fuser 0.18 decodes a kernel time (secs < 0, nsecs) as
            // EPOCH - (-secs s + nsecs ns); undo exactly that.
            Err(e) => TimeSpec::At {
                secs: -(e.duration().as_secs() as i64),
                nsecs: i64::from(e.duration().subsec_nanos()),
            },
        },
    }
}

const GENERATION: Generation = Generation(0);

impl ChronoFuse {
    fn reply_entry(&self, reply: ReplyEntry, result: Result<crate::vfs::Entry, VfsError>) {
        let cfg = self.vfs.config();
        match result {
            Ok(e) => reply.entry_with_ttls(
                &self.vfs.attr_ttl(&e.attr),
                &e.entry_ttl.unwrap_or(cfg.entry_timeout),
                &to_file_attr(&e.attr),
                GENERATION,
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    /// Attaches a passthrough backing file for `opened` if possible; returns
    /// the backing id to hand to the kernel.
    fn backing_for(
        &self,
        caller: &Caller,
        ino: VIno,
        opened: &Opened,
        open_backing: impl Fn(std::os::fd::BorrowedFd<'_>) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if !opened.passthrough_ok || !self.passthrough_active() {
            return None;
        }
        let mut backing = self.backing.lock();
        if let Some((id, count)) = backing.get_mut(&ino) {
            *count += 1;
            self.passthrough_handles.lock().insert(opened.fh, ino);
            return Some(id.clone());
        }
        // Registered under the opener's credentials, less CAP_FSETID: the
        // kernel does every handle's passthrough I/O with them, so a write
        // clears set-ID bits as an unprivileged one does natively.
        let id = self
            .vfs
            .with_file_fd(opened.fh, |fd| {
                Ok(creds::as_backing_registrar(caller, || open_backing(fd))?)
            })
            .map_err(|e| tracing::warn!("passthrough unavailable for inode {}: {e}", ino.0))
            .ok()?;
        let id = Arc::new(id);
        backing.insert(ino, (id.clone(), 1));
        self.passthrough_handles.lock().insert(opened.fh, ino);
        Some(id)
    }

    fn drop_backing(&self, fh: u64) {
        let Some(ino) = self.passthrough_handles.lock().remove(&fh) else {
            return;
        };
        let mut backing = self.backing.lock();
        if let Some((_, count)) = backing.get_mut(&ino) {
            *count -= 1;
            if *count == 0 {
                backing.remove(&ino);
            }
        }
    }

    /// Open flags for a regular file. Writes reach the backing file before
    /// each request returns, so close() has nothing to flush (NOFLUSH saves
    /// a round trip per close). Without passthrough, pages cached by an
    /// earlier open stay valid (our writes go through the kernel's cache;
    /// external changes are caught by the mtime check of auto_inval_data).
    /// A write session's close is the exception: its FLUSH tells history
    /// that a version is imminent (see `Vfs::flush`).
    ///
    /// A file whose every write is a version (`capture = every-write`)
    /// bypasses the kernel's page cache (DIRECT_IO): with the writeback
    /// cache, the kernel would merge and reorder the writes, and history
    /// would record states the application never made.
    fn open_flags(&self, passthrough: bool, opened: &Opened) -> FopenFlags {
        let flush = if opened.session {
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_NOFLUSH
        };
        if passthrough {
            flush
        } else if opened.per_write {
            FopenFlags::FOPEN_DIRECT_IO | flush
        } else {
            FopenFlags::FOPEN_KEEP_CACHE | flush
        }
    }
}

fn reply_xattr(reply: ReplyXattr, result: Result<Xattr, VfsError>) {
    match result {
        Ok(Xattr::Size(n)) => reply.size(n),
        Ok(Xattr::Data(d)) => reply.data(&d),
        Err(e) => reply.error(err(e)),
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), VfsError>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(err(e)),
    }
}

impl ChronoFuse {
    fn reply_created(
        &self,
        who: &Caller,
        reply: ReplyCreate,
        result: Result<(crate::vfs::Entry, Opened), VfsError>,
    ) {
        let (entry, opened) = match result {
            Ok(r) => r,
            Err(e) => return reply.error(err(e)),
        };
        let ttl = self
            .vfs
            .entry_and_attr_ttl(&entry.attr, self.vfs.config().entry_timeout);
        let attr = to_file_attr(&entry.attr);
        let fh = FileHandle(opened.fh);
        match self.backing_for(who, entry.attr.ino, &opened, |fd| reply.open_backing(fd)) {
            Some(id) => reply.created_passthrough(
                &ttl,
                &attr,
                GENERATION,
                fh,
                self.open_flags(true, &opened),
                &id,
            ),
            None => reply.created(&ttl, &attr, GENERATION, fh, self.open_flags(false, &opened)),
        }
    }
}

/// Capabilities asked of the kernel on top of fuser's defaults; each is
/// optional, so one the kernel lacks is skipped.
const WANTED: &[InitFlags] = &[
    InitFlags::FUSE_ASYNC_READ,
    InitFlags::FUSE_ATOMIC_O_TRUNC,
    InitFlags::FUSE_BIG_WRITES,
    InitFlags::FUSE_DONT_MASK,
    InitFlags::FUSE_POSIX_ACL,
    InitFlags::FUSE_HANDLE_KILLPRIV_V2,
    InitFlags::FUSE_PARALLEL_DIROPS,
    InitFlags::FUSE_MAX_PAGES,
    InitFlags::FUSE_CACHE_SYMLINKS,
    InitFlags::FUSE_ASYNC_DIO,
    InitFlags::FUSE_AUTO_INVAL_DATA,
    InitFlags::FUSE_SPLICE_READ,
    InitFlags::FUSE_SPLICE_WRITE,
    InitFlags::FUSE_SPLICE_MOVE,
    // Files captured per write are DIRECT_IO; programs may still mmap them.
    InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
];

impl fuser::Filesystem for ChronoFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for flag in WANTED {
            if let Err(missing) = config.add_capabilities(*flag) {
                tracing::info!("kernel lacks {missing:?}");
            }
        }
        let plus: &[InitFlags] = match self.cfg.readdirplus {
            ReaddirPlus::Auto => &[
                InitFlags::FUSE_DO_READDIRPLUS,
                InitFlags::FUSE_READDIRPLUS_AUTO,
            ],
            ReaddirPlus::Always => &[InitFlags::FUSE_DO_READDIRPLUS],
            ReaddirPlus::Never => &[],
        };
        for flag in plus {
            if let Err(missing) = config.add_capabilities(*flag) {
                tracing::info!("kernel lacks {missing:?}");
            }
        }
        let mut passthrough = false;
        if self.cfg.passthrough && config.set_max_stack_depth(1).is_ok() {
            passthrough = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok();
        }
        // The kernel refuses passthrough together with the writeback cache.
        let writeback = !passthrough
            && self.cfg.writeback
            && config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .is_ok();
        if let Err(e) = config.set_max_write(1 << 20) {
            tracing::info!("max_write limited to {e}");
        }
        if let Err(e) = config.set_max_readahead(MAX_READAHEAD) {
            tracing::debug!("max_readahead limited to {e}");
        }
        let _ = config.set_max_background(64);
        self.passthrough_active
            .store(passthrough, Ordering::Relaxed);
        self.vfs.set_writeback(writeback);
        self.vfs.set_passthrough(passthrough);
        tracing::info!("kernel connection: passthrough={passthrough} writeback_cache={writeback}");
        Ok(())
    }

    fn destroy(&mut self) {
        self.backing.lock().clear();
        if let Err(e) = self.vfs.flush_store() {
            tracing::error!("store flush at unmount failed: {e}");
        }
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.counts.add(Req::Lookup);
        match self.vfs.lookup(&caller(req), ino(parent), name) {
            Err(e) if e.errno() == libc::ENOENT => {
                let ttl = self.vfs.negative_ttl(ino(parent), name);
                if ttl.is_zero() {
                    reply.error(Errno::ENOENT);
                } else {
                    let mut attr = to_file_attr(&Attr {
                        ino: VIno(0),
                        st: crate::sys::zeroed_stat(),
                    });
                    attr.ino = INodeNo(0);
                    reply.entry_with_ttls(&Duration::ZERO, &ttl, &attr, GENERATION);
                }
            }
            other => self.reply_entry(reply, other),
        }
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        self.counts.add(Req::Forget);
        self.vfs.forget(ino(i), nlookup);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.counts.add(Req::Getattr);
        match self.vfs.getattr(ino(i), fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&self.vfs.attr_ttl(&a), &to_file_attr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = set_attr(mode, (uid, gid), size, (atime, mtime), fh);
        self.setattr_as(req, i, set, reply);
    }

    fn setattr_kill_suidgid(
        &self,
        req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = set_attr(mode, (uid, gid), size, (atime, mtime), fh);
        // A chown carries the flag whoever asks (it clears set-user-ID
        // for everyone); only a truncation's tells the caller lacks
        // CAP_FSETID.
        let truncates = set.size.is_some() && set.uid.is_none() && set.gid.is_none();
        creds::lacking_fsetid(truncates, || self.setattr_as(req, i, set, reply));
    }

    fn readlink(&self, req: &Request, i: INodeNo, reply: ReplyData) {
        self.counts.add(Req::Readlink);
        match self.vfs.readlink(&caller(req), ino(i)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(err(e)),
        }
        if self.vfs.is_view(ino(i)) {
            // The kernel caches link targets (CACHE_SYMLINKS) and would
            // give this one to the next caller unasked, whoever it is: a
            // view's is checked per caller (`view_readlink`). Dropped
            // after the reply, whose page the reader fills and unlocks
            // without the daemon.
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(i, 0, 0);
            }
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.counts.add(Req::Mknod);
        let r = self
            .vfs
            .mknod(&caller(req), ino(parent), name, mode, umask, rdev);
        self.reply_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.counts.add(Req::Mkdir);
        let r = self.vfs.mkdir(&caller(req), ino(parent), name, mode, umask);
        self.reply_entry(reply, r);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counts.add(Req::Unlink);
        reply_empty(reply, self.vfs.unlink(&caller(req), ino(parent), name));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counts.add(Req::Rmdir);
        reply_empty(reply, self.vfs.rmdir(&caller(req), ino(parent), name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.counts.add(Req::Symlink);
        let r = self
            .vfs
            .symlink(&caller(req), ino(parent), link_name, target.as_os_str());
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Req::Rename);
        let r = self.vfs.rename(
            &caller(req),
            ino(parent),
            name,
            ino(newparent),
            newname,
            flags.bits(),
        );
        reply_empty(reply, r);
    }

    fn link(
        &self,
        req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.counts.add(Req::Link);
        let r = self.vfs.link(&caller(req), ino(i), ino(newparent), newname);
        self.reply_entry(reply, r);
    }

    fn open_kill_suidgid(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        creds::lacking_fsetid(true, || self.open(req, i, flags, reply));
    }

    fn open(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.counts.add(Req::Open);
        let who = caller(req);
        let opened = match self.vfs.open(&who, ino(i), flags.0) {
            Ok(o) => o,
            Err(e) => return reply.error(err(e)),
        };
        match self.backing_for(&who, ino(i), &opened, |fd| reply.open_backing(fd)) {
            Some(id) => {
                reply.opened_passthrough(FileHandle(opened.fh), self.open_flags(true, &opened), &id)
            }
            None => reply.opened(FileHandle(opened.fh), self.open_flags(false, &opened)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.counts.add(Req::Read);
        match self.vfs.read(fh.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(err(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.counts.add(Req::Write);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let wrote = creds::lacking_fsetid(kill, || {
            self.vfs.write(&caller(req), fh.0, offset, data, kill)
        });
        match wrote {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(err(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Req::Flush);
        // Sent for write sessions while history is on, and with the
        // writeback cache (after the kernel wrote its dirty pages). Without
        // history, ENOSYS tells the kernel never to send another: close()
        // then costs no round trip.
        match self.vfs.flush(fh.0) {
            Ok(true) => reply.ok(),
            Ok(false) => reply.error(Errno::ENOSYS),
            Err(e) => reply.error(err(e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Req::Release);
        self.drop_backing(fh.0);
        reply_empty(reply, self.vfs.release(fh.0).map(drop));
    }

    fn fsync(&self, _req: &Request, i: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.counts.add(Req::Fsync);
        let vfs = self.vfs.clone();
        let notifier = self.notifier.clone();
        self.blocking.run(move || {
            let result = vfs.fsync(fh.0, datasync);
            // With the writeback cache the kernel wrote its dirty pages just
            // before this fsync: the backing file's st_blocks changed behind
            // the attributes it caches. Invalidated before the reply, so a
            // stat right after fsync returns sees the new count; an
            // attributes-only invalidation takes no lock the caller holds.
            if result.is_ok() && vfs.writeback() {
                invalidate_attrs(&notifier, i);
            }
            reply_empty(reply, result);
        });
    }

    fn opendir(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.counts.add(Req::Opendir);
        match self.vfs.opendir(&caller(req), ino(i), flags.0) {
            Ok(d) => reply.opened(FileHandle(d.fh), dir_cache_flags(d.cache)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.counts.add(Req::Readdir);
        let r = self.vfs.readdir(fh.0, offset as i64, &caller(req), |e| {
            reply.add(INodeNo(e.ino.0), e.offset as u64, file_type(e.kind), e.name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.counts.add(Req::Readdirplus);
        let cfg = self.vfs.config();
        let vfs = &self.vfs;
        let r = self
            .vfs
            .readdirplus(fh.0, offset as i64, &caller(req), |e, entry| {
                let (attr, ttl) = match entry {
                    Some(entry) => (
                        to_file_attr(&entry.attr),
                        vfs.entry_and_attr_ttl(
                            &entry.attr,
                            entry.entry_ttl.unwrap_or(cfg.entry_timeout),
                        ),
                    ),
                    None => {
                        let mut st = crate::sys::zeroed_stat();
                        st.st_mode = e.kind;
                        (to_file_attr(&Attr { ino: e.ino, st }), cfg.entry_timeout)
                    }
                };
                reply.add(
                    INodeNo(e.ino.0),
                    e.offset as u64,
                    e.name,
                    &ttl,
                    &attr,
                    GENERATION,
                )
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Req::Releasedir);
        reply_empty(reply, self.vfs.releasedir(fh.0));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Req::Fsyncdir);
        let vfs = self.vfs.clone();
        self.blocking
            .run(move || reply_empty(reply, vfs.fsync(fh.0, datasync)));
    }

    fn statfs(&self, _req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        self.counts.add(Req::Statfs);
        match self.vfs.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Req::Setxattr);
        reply_empty(
            reply,
            self.vfs.setxattr(&caller(req), ino(i), name, value, flags),
        );
    }

    fn getxattr(&self, req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.counts.add(Req::Getxattr);
        reply_xattr(reply, self.vfs.getxattr(&caller(req), ino(i), name, size));
    }

    fn listxattr(&self, req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        self.counts.add(Req::Listxattr);
        reply_xattr(reply, self.vfs.listxattr(&caller(req), ino(i), size));
    }

    fn removexattr(&self, req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counts.add(Req::Removexattr);
        reply_empty(reply, self.vfs.removexattr(&caller(req), ino(i), name));
    }

    fn access(&self, req: &Request, i: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.counts.add(Req::Access);
        reply_empty(reply, self.vfs.access(&caller(req), ino(i), mask.bits()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.counts.add(Req::Create);
        let who = caller(req);
        let result = self.vfs.create(&who, ino(parent), name, mode, umask, flags);
        self.reply_created(&who, reply, result);
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.counts.add(Req::Tmpfile);
        let who = caller(req);
        let result = self.vfs.tmpfile(&who, ino(parent), mode, umask, flags);
        self.reply_created(&who, reply, result);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Req::Fallocate);
        reply_empty(reply, self.vfs.fallocate(fh.0, offset, length, mode));
    }

    fn lseek(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.counts.add(Req::Lseek);
        match self.vfs.lseek(fh.0, offset, whence) {
            Ok(off) => reply.offset(off),
            Err(e) => reply.error(err(e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.counts.add(Req::CopyFileRange);
        match self
            .vfs
            .copy_file_range(fh_in.0, offset_in, fh_out.0, offset_out, len)
        {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(err(e)),
        }
    }
}
