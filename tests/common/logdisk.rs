//! A block device whose every write and flush is logged, for power-cut
//! images of a real file system (what dm-log-writes does; this kernel has
//! no device-mapper, nbd or ublk, only loop).
//!
//! A FUSE file system served by a thread of the test process holds one
//! file, `disk.img`, in memory; a loop device over it carries an ext4 file
//! system on which chronofs, its branches and its store live. FUSE without
//! a writeback cache writes through: every write the loop device takes
//! from ext4 reaches [`LogFs::write`] before the write completes, and every
//! flush (a cache flush or FUA write: loop turns both into fsync) reaches
//! [`LogFs::fsync`]. A power cut at any moment leaves on the platter every
//! write before the last flush, and any subset of the writes after it
//! ([`LogDisk::image`]).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    ReplyAttr, ReplyData, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};

const DISK: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
pub enum Event {
    Write {
        off: u64,
        data: Vec<u8>,
    },
    Flush,
    /// A point the test named (an operation returned, say).
    Mark(String),
}

#[derive(Default)]
struct State {
    image: Vec<u8>,
    /// The image when logging started: what every power-cut image is
    /// built on.
    base: Vec<u8>,
    log: Vec<Event>,
    logging: bool,
}

#[derive(Clone)]
struct LogFs(Arc<Mutex<State>>);

impl LogFs {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn attr(&self, ino: INodeNo) -> FileAttr {
        let now = SystemTime::UNIX_EPOCH;
        let (kind, perm, size, nlink) = if ino == DISK {
            (
                FileType::RegularFile,
                0o600,
                self.state().image.len() as u64,
                1,
            )
        } else {
            (FileType::Directory, 0o755, 0, 2)
        };
        FileAttr {
            ino,
            size,
            blocks: size / 512,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

impl fuser::Filesystem for LogFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == "disk.img" {
            reply.entry(&TTL, &self.attr(DISK), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // No page cache: the loop device's every read and write comes
        // here, and an image loaded for a check is what it reads.
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = self.state();
        let start = (offset as usize).min(st.image.len());
        let end = (start + size as usize).min(st.image.len());
        reply.data(&st.image[start..end]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.state();
        let start = offset as usize;
        if start + data.len() > st.image.len() {
            reply.error(Errno::ENOSPC);
            return;
        }
        st.image[start..start + data.len()].copy_from_slice(data);
        if st.logging {
            st.log.push(Event::Write {
                off: offset,
                data: data.to_vec(),
            });
        }
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state();
        if st.logging {
            st.log.push(Event::Flush);
        }
        reply.ok();
    }
}

pub fn must(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A loop device over `file`, detached on drop.
pub struct Loop {
    pub dev: String,
}

impl Loop {
    pub fn attach(file: &Path) -> Loop {
        Loop {
            dev: must(Command::new("losetup").arg("-f").arg("--show").arg(file)),
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// `dev` mounted at `at`, unmounted on drop.
pub struct DiskMount {
    pub at: PathBuf,
}

impl DiskMount {
    /// `dev` holds ext4.
    pub fn mount(dev: &str, at: &Path) -> DiskMount {
        DiskMount::mount_as("ext4", dev, at)
    }

    pub fn mount_as(fstype: &str, dev: &str, at: &Path) -> DiskMount {
        must(Command::new("mount").args(["-t", fstype, dev]).arg(at));
        DiskMount {
            at: at.to_path_buf(),
        }
    }
}

impl Drop for DiskMount {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.at)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        }
    }
}

/// A fresh ext4 image of `size` bytes at `work/disk.img` (not attached).
pub fn ext4_image(work: &Path, size: u64) -> PathBuf {
    let img = work.join("disk.img");
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    must(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
    img
}

/// A fresh btrfs image of `size` bytes in `work`, mounted at
/// `work/btrfs` (the path it returns) until dropped.
pub struct Btrfs {
    pub dir: PathBuf,
    // Drop order: unmounted before its loop device goes.
    _mounted: DiskMount,
    _attached: Loop,
}

impl Btrfs {
    pub fn new(work: &Path, size: u64) -> Btrfs {
        let img = work.join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(size).unwrap();
        must(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&img));
        let dir = work.join("btrfs");
        std::fs::create_dir(&dir).unwrap();
        let attached = Loop::attach(&img);
        let mounted = DiskMount::mount_as("btrfs", &attached.dev, &dir);
        Btrfs {
            dir,
            _mounted: mounted,
            _attached: attached,
        }
    }
}

/// The logged disk: an in-memory image behind FUSE (`dir/fuse/disk.img`)
/// with a loop device over it.
pub struct LogDisk {
    fs: LogFs,
    // Drop order: the loop device before the FUSE session that serves it.
    pub dev: Option<Loop>,
    session: Option<fuser::BackgroundSession>,
}

impl LogDisk {
    /// A zeroed disk of `size` bytes, served under `dir` (a fresh empty
    /// directory), with a loop device over it.
    pub fn new(dir: &Path, size: usize) -> LogDisk {
        let fs = LogFs(Arc::new(Mutex::new(State {
            image: vec![0; size],
            ..State::default()
        })));
        let mut config = fuser::Config::default();
        config.mount_options = vec![fuser::MountOption::FSName("chronofs-logdisk".into())];
        let session = fuser::spawn_mount(fs.clone(), dir, &config)
            .unwrap_or_else(|e| panic!("mount the log disk at {}: {e}", dir.display()));
        let dev = Loop::attach(&dir.join("disk.img"));
        LogDisk {
            fs,
            dev: Some(dev),
            session: Some(session),
        }
    }

    pub fn dev(&self) -> &str {
        &self.dev.as_ref().expect("loop device attached").dev
    }

    /// From now on, every write and flush is logged; images are built on
    /// the disk as it is now (call it right after a `sync`, so that this
    /// is what the platter holds).
    pub fn start_logging(&self) {
        let mut st = self.fs.state();
        st.base = st.image.clone();
        st.log.clear();
        st.logging = true;
    }

    /// Names this point of the log; returns its index.
    pub fn mark(&self, name: &str) -> usize {
        let mut st = self.fs.state();
        st.log.push(Event::Mark(name.to_string()));
        st.log.len() - 1
    }

    pub fn log(&self) -> Vec<Event> {
        self.fs.state().log.clone()
    }

    /// Stops logging and makes the disk hold `image` (a power cut's), on
    /// the same loop device: its number, and so the device number of the
    /// file system on it, stays what the test ran with, as a machine's
    /// disk keeps its own across a power cut. (Device numbers that do
    /// change across a reboot are another matter, not tested here.)
    pub fn load(&self, image: Vec<u8>) {
        let mut st = self.fs.state();
        st.logging = false;
        st.image = image;
    }

    /// The writes a power cut right before log entry `cut` leaves on the
    /// platter: every write before the last flush ahead of `cut`, and of
    /// the writes after it those `keep` keeps (given their log index).
    pub fn kept(&self, cut: usize, mut keep: impl FnMut(usize) -> bool) -> Vec<usize> {
        let st = self.fs.state();
        let cut = cut.min(st.log.len());
        let durable = st.log[..cut]
            .iter()
            .rposition(|e| matches!(e, Event::Flush))
            .map_or(0, |i| i + 1);
        (0..cut)
            .filter(|&i| matches!(st.log[i], Event::Write { .. }) && (i < durable || keep(i)))
            .collect()
    }

    /// The platter holding the base and the writes `kept` (log indices,
    /// in order).
    pub fn image(&self, kept: &[usize]) -> Vec<u8> {
        let st = self.fs.state();
        let mut image = st.base.clone();
        for &i in kept {
            if let Event::Write { off, data } = &st.log[i] {
                let off = *off as usize;
                image[off..off + data.len()].copy_from_slice(data);
            }
        }
        image
    }
}

impl Drop for LogDisk {
    fn drop(&mut self) {
        self.dev.take();
        self.session.take();
    }
}

/// A small deterministic generator (xorshift64*), so that a failing
/// image can be rebuilt from the seed the test prints.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
