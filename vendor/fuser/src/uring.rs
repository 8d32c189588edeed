//! chronofs patch: the FUSE-over-io_uring transport (Linux 6.14+).
//!
//! After INIT grants `FUSE_OVER_IO_URING`, one queue per possible CPU
//! registers a few ring entries (a header buffer and a payload buffer
//! each) with `FUSE_IO_URING_CMD_REGISTER`. The kernel puts a request into
//! a free entry of the queue of the CPU the caller runs on and completes
//! that entry's command; the queue's thread rebuilds the request as
//! /dev/fuse would have delivered it, dispatches it through the same code
//! as the /dev/fuse loop, and the reply, from whichever thread sends it,
//! goes back into the entry with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`,
//! which also hands the entry back for the next request. FORGET and
//! INTERRUPT still arrive through /dev/fuse, so its threads keep running.
//! Until every queue has an entry the kernel keeps using /dev/fuse.

use std::cell::UnsafeCell;
use std::io;
use std::io::IoSlice;
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::warn;
use parking_lot::Mutex;

use crate::channel::ChannelSender;
use crate::passthrough::BackingId;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
const IN_HEADER_SIZE: usize = 40;
const OUT_HEADER_SIZE: usize = 16;
const OP_IN_OUT_SIZE: usize = 128;
const IORING_ENTER_GETEVENTS: u32 = 1;
/// `FUSE_MIN_READ_BUFFER`: the kernel wants payload buffers at least this big.
const MIN_PAYLOAD: usize = 8192;
/// Where the kernel writes the number of payload bytes and the commit id.
const ENT_IN_OUT_OFFSET: usize = 2 * OP_IN_OUT_SIZE;
/// `sizeof(struct fuse_uring_req_header)`.
const REQ_HEADER_SIZE: usize = ENT_IN_OUT_OFFSET + 32;

/// Pins the calling thread to one CPU, best effort.
pub(crate) fn pin_to_cpu(cpu: usize) {
    if cpu >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is an empty set; `cpu` is within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Which transport carries requests, as the mount sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// read/write on /dev/fuse.
    DevFuse,
    /// FUSE over io_uring (every queue registered).
    IoUring,
}

/// Shared view of the transport in use; cheap to clone and query.
#[derive(Debug, Clone, Default)]
pub struct TransportState(Arc<AtomicUsize>);

impl TransportState {
    /// The transport requests travel on now.
    pub fn get(&self) -> Transport {
        if self.0.load(Ordering::Relaxed) == 1 {
            Transport::IoUring
        } else {
            Transport::DevFuse
        }
    }

    pub(crate) fn set(&self, t: Transport) {
        self.0.store(usize::from(t == Transport::IoUring), Ordering::Relaxed);
    }
}

/// Sizes the kernel checks at registration.
pub(crate) fn payload_size(max_write: u32, max_pages: u16) -> usize {
    let page = page_size::get();
    let want = MIN_PAYLOAD
        .max(max_write as usize)
        .max(usize::from(max_pages) * page);
    want.div_ceil(page) * page
}

/// The number of queues the kernel expects: one per possible CPU.
pub(crate) fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
                .max()
        })
        .map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |max| max + 1,
        )
}

/// One ring entry's buffers. The kernel and user space take turns: the
/// kernel owns them from a REGISTER/COMMIT_AND_FETCH submission until its
/// completion, then the queue thread reads the request and the replier
/// writes the reply, then commit hands them back.
struct Ent {
    header: Box<UnsafeCell<[u8; REQ_HEADER_SIZE]>>,
    payload: Box<[UnsafeCell<u8>]>,
    iov: Box<[libc::iovec; 2]>,
    commit_id: AtomicU64,
}

impl Ent {
    fn new(payload_len: usize) -> Ent {
        let header = Box::new(UnsafeCell::new([0u8; REQ_HEADER_SIZE]));
        // Zeroed allocation: the pages are only mapped when written.
        let bytes: Box<[u8]> = vec![0u8; payload_len].into_boxed_slice();
        // SAFETY: UnsafeCell<u8> is repr(transparent) over u8.
        let payload: Box<[UnsafeCell<u8>]> =
            unsafe { Box::from_raw(Box::into_raw(bytes) as *mut [UnsafeCell<u8>]) };
        let iov = Box::new([
            libc::iovec {
                iov_base: header.get().cast(),
                iov_len: REQ_HEADER_SIZE,
            },
            libc::iovec {
                iov_base: payload.as_ptr() as *mut libc::c_void,
                iov_len: payload_len,
            },
        ]);
        Ent {
            header,
            payload,
            iov,
            commit_id: AtomicU64::new(0),
        }
    }

    fn header_ptr(&self) -> *mut u8 {
        self.header.get().cast()
    }

    fn payload_ptr(&self) -> *mut u8 {
        UnsafeCell::raw_get(self.payload.as_ptr())
    }
}

/// One per-CPU queue: its ring, its entries, and the lock that serialises
/// submissions from repliers on other threads.
pub(crate) struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    sq_lock: Mutex<()>,
    /// While the queue thread handles completions, replies it sends
    /// itself are only queued; it submits them all in one call after.
    processing: AtomicBool,
    ents: Vec<Ent>,
    dev: ChannelSender,
    dev_fd: i32,
}

// SAFETY: the entry buffers are only touched by the side that owns them
// (see `Ent`), and the submission queue only under `sq_lock`; the
// completion queue only by the queue's own thread.
unsafe impl Sync for Queue {}
// SAFETY: as above; nothing is tied to the creating thread.
unsafe impl Send for Queue {}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uring::Queue({})", self.qid)
    }
}

fn cmd_sqe(cmd_op: u32, fd: i32, qid: u16, commit_id: u64, ent: usize) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req: flags u64, commit_id u64, qid u16, padding.
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    opcode::UringCmd80::new(types::Fd(fd), cmd_op)
        .cmd(cmd)
        .build()
        .user_data(ent as u64)
}

fn register_sqe(fd: i32, qid: u16, ent_idx: usize, ent: &Ent) -> squeue::Entry128 {
    let sqe = opcode::UringCmd80::new(types::Fd(fd), CMD_REGISTER)
        .cmd({
            let mut cmd = [0u8; 80];
            cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
            cmd
        })
        .addr(Some(ent.iov.as_ptr() as u64))
        .build()
        .user_data(ent_idx as u64);
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is repr(C), the 128 bytes of an SQE128 and nothing
    // else; the crate has no setter for `len`, which REGISTER needs (the
    // number of iovecs, at byte 24 of struct io_uring_sqe).
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: same layout, every bit pattern of the plain-data SQE is valid.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

impl Queue {
    pub(crate) fn new(
        qid: u16,
        depth: usize,
        payload_len: usize,
        dev: ChannelSender,
        dev_fd: &impl AsRawFd,
    ) -> io::Result<Queue> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(depth as u32 * 2)
            .build(depth as u32)?;
        Ok(Queue {
            qid,
            ring,
            sq_lock: Mutex::new(()),
            processing: AtomicBool::new(false),
            ents: (0..depth).map(|_| Ent::new(payload_len)).collect(),
            dev,
            dev_fd: dev_fd.as_raw_fd(),
        })
    }

    /// Registers every entry. Errors the kernel reports at once (module
    /// parameter off, bad sizes) come back here; requests that already
    /// arrived are returned for `run`.
    pub(crate) fn register(&self) -> io::Result<Vec<(usize, i32)>> {
        {
            let _g = self.sq_lock.lock();
            // SAFETY: submissions are serialised by sq_lock; the iovecs and
            // buffers live as long as the queue.
            let mut sq = unsafe { self.ring.submission_shared() };
            for (i, ent) in self.ents.iter().enumerate() {
                let sqe = register_sqe(self.dev_fd, self.qid, i, ent);
                // SAFETY: as above.
                unsafe { sq.push(&sqe) }
                    .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            }
        }
        {
            let _g = self.sq_lock.lock();
            self.ring.submit()?;
        }
        // A refused REGISTER completes during the submit call.
        // SAFETY: only the queue's thread reads completions, and it has not
        // started yet.
        let early: Vec<(usize, i32)> = unsafe { self.ring.completion_shared() }
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        if let Some(&(_, res)) = early.iter().find(|(_, res)| *res < 0) {
            return Err(io::Error::from_raw_os_error(-res));
        }
        Ok(early)
    }

    /// Copies the reply into the entry and commits it (fetching the next
    /// request into the same entry).
    fn commit(&self, idx: usize, data: &[IoSlice<'_>]) -> io::Result<()> {
        let ent = &self.ents[idx];
        let total: usize = data.iter().map(|s| s.len()).sum();
        let payload_len = total.saturating_sub(OUT_HEADER_SIZE);
        if total < OUT_HEADER_SIZE || payload_len > ent.payload.len() {
            return Err(io::Error::other("reply does not fit the ring entry"));
        }
        let mut pos = 0;
        for s in data {
            // The part of this slice that falls in the out header, then
            // the rest into the payload.
            let head = OUT_HEADER_SIZE.saturating_sub(pos).min(s.len());
            // SAFETY: between the request's completion and this commit the
            // entry belongs to this reply; the bounds were checked above
            // (the header holds OUT_HEADER_SIZE, the payload payload_len).
            unsafe {
                std::ptr::copy_nonoverlapping(s.as_ptr(), ent.header_ptr().add(pos), head);
                let off = (pos + head).saturating_sub(OUT_HEADER_SIZE);
                std::ptr::copy_nonoverlapping(s[head..].as_ptr(), ent.payload_ptr().add(off), s.len() - head);
            }
            pos += s.len();
        }
        // SAFETY: as above; payload_sz sits at offset 16 of fuse_uring_ent_in_out.
        unsafe {
            let p = ent.header_ptr().add(ENT_IN_OUT_OFFSET + 16);
            std::ptr::copy_nonoverlapping((payload_len as u32).to_ne_bytes().as_ptr(), p, 4);
        }
        let sqe = cmd_sqe(
            CMD_COMMIT_AND_FETCH,
            self.dev_fd,
            self.qid,
            ent.commit_id.load(Ordering::Acquire),
            idx,
        );
        let _g = self.sq_lock.lock();
        // SAFETY: submissions are serialised by sq_lock.
        unsafe { self.ring.submission_shared().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        if !self.processing.load(Ordering::Acquire) {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// Copies the request of entry `idx` into `buf` as /dev/fuse would have
    /// delivered it; returns its length.
    fn take_request(&self, idx: usize, buf: &mut [u8]) -> io::Result<usize> {
        let ent = &self.ents[idx];
        // SAFETY: the completion gave the entry to this thread until commit.
        let header: &[u8; REQ_HEADER_SIZE] = unsafe { &*ent.header.get() };
        let word = |off: usize| u32::from_ne_bytes([header[off], header[off + 1], header[off + 2], header[off + 3]]);
        let len = word(0) as usize;
        let payload_sz = word(ENT_IN_OUT_OFFSET + 16) as usize;
        let mut commit = [0u8; 8];
        commit.copy_from_slice(&header[ENT_IN_OUT_OFFSET + 8..ENT_IN_OUT_OFFSET + 16]);
        ent.commit_id.store(u64::from_ne_bytes(commit), Ordering::Release);
        let op_in = len
            .checked_sub(IN_HEADER_SIZE + payload_sz)
            .filter(|n| *n <= OP_IN_OUT_SIZE && payload_sz <= ent.payload.len() && len <= buf.len())
            .ok_or_else(|| io::Error::other(format!("malformed ring request: len {len}, payload {payload_sz}")))?;
        buf[..IN_HEADER_SIZE].copy_from_slice(&header[..IN_HEADER_SIZE]);
        buf[IN_HEADER_SIZE..IN_HEADER_SIZE + op_in]
            .copy_from_slice(&header[OP_IN_OUT_SIZE..OP_IN_OUT_SIZE + op_in]);
        // SAFETY: the kernel wrote payload_sz bytes, checked to fit.
        let payload = unsafe { std::slice::from_raw_parts(ent.payload_ptr(), payload_sz) };
        buf[IN_HEADER_SIZE + op_in..len].copy_from_slice(payload);
        Ok(len)
    }

    /// Serves requests until the kernel tears the ring down.
    pub(crate) fn run(
        self: &Arc<Self>,
        early: Vec<(usize, i32)>,
        buf: &mut [u8],
        mut dispatch: impl FnMut(&[u8], UringSender),
    ) -> io::Result<()> {
        let mut live = self.ents.len();
        let mut done: Vec<(usize, i32)> = early;
        let mut first = true;
        while live > 0 {
            if !std::mem::take(&mut first) {
                self.wait_into(&mut done)?;
            }
            self.processing.store(true, Ordering::Release);
            for &(idx, res) in &done {
                if idx >= self.ents.len() {
                    continue;
                }
                if res < 0 {
                    // ENOTCONN at unmount; anything else ends the entry too.
                    if res != -libc::ENOTCONN {
                        warn!("fuse ring queue {} entry {idx}: {}", self.qid, io::Error::from_raw_os_error(-res));
                    }
                    live -= 1;
                    continue;
                }
                match self.take_request(idx, buf) {
                    Ok(len) => dispatch(&buf[..len], UringSender { queue: self.clone(), idx }),
                    Err(e) => {
                        warn!("fuse ring queue {}: {e}", self.qid);
                        live -= 1;
                    }
                }
            }
            self.processing.store(false, Ordering::Release);
        }
        debug!("fuse ring queue {} stopped", self.qid);
        Ok(())
    }

    /// Submits the replies queued while handling the last batch and waits
    /// for at least one completion, in one system call.
    ///
    /// `to_submit` must be exactly the number of entries pending: the
    /// kernel skips the wait whenever it submits fewer than asked
    /// (`io_uring_enter`: `if (ret != to_submit) goto out`), so asking for
    /// the ring's size made every idle queue thread spin, a CPU each,
    /// which cost callers that never reach the daemon a third of their
    /// speed (warm `stat`). A reply another thread pushes after the count
    /// is submitted by that thread; if it also took ours first, this call
    /// submits nothing, returns at once, and the next round counts 0.
    fn wait_into(&self, done: &mut Vec<(usize, i32)>) -> io::Result<()> {
        done.clear();
        while done.is_empty() {
            let pending = {
                let _g = self.sq_lock.lock();
                // SAFETY: submissions are serialised by sq_lock; this only
                // reads the queue's head and tail.
                unsafe { self.ring.submission_shared() }.len() as u32
            };
            // SAFETY: no argument; the SQEs were fully written before their
            // tail was published.
            let waited = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(pending, 1, IORING_ENTER_GETEVENTS, None)
            };
            match waited {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
                Ok(_) => {}
            }
            // SAFETY: only this thread reads the completion queue.
            done.extend(
                unsafe { self.ring.completion_shared() }.map(|c| (c.user_data() as usize, c.result())),
            );
        }
        Ok(())
    }
}

/// Replies into one ring entry.
#[derive(Debug, Clone)]
pub(crate) struct UringSender {
    queue: Arc<Queue>,
    idx: usize,
}

impl UringSender {
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        self.queue.commit(self.idx, data)
    }

    pub(crate) fn open_backing(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<BackingId> {
        self.queue.dev.open_backing(fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.queue.dev.wrap_backing(id) }
    }
}
