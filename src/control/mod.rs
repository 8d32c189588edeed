//! The control channel: a Unix socket per mount over which the CLI asks a
//! running daemon about history (the daemon holds the store's lock), and
//! the same requests answered directly from a store when nothing is
//! mounted.
//!
//! Owns: the request/response protocol (versioned), the socket's location
//! and peer-credential checks, and the answers (`service`). Uses:
//! `history`, `store`, `branch`, `sys`.
//!
//! Protocol (version `PROTOCOL`, messages in `proto`): the client sends
//! one JSON line, an `Envelope` holding a `Request`. The server answers
//! with frames `kind u8 ‖ length u32 (BE) ‖ payload`: any number of `D`
//! (raw data, e.g. file content), then exactly one `J` (the request's
//! typed reply as JSON) or `E` (an `ErrorReply`: errno and message, JSON).
//! `Client` speaks it; nothing else should.

mod client;
mod maintain;
pub mod proto;
pub mod service;
mod templates;
mod tree;

pub use client::{Client, ControlError};
pub use proto::{Components, Envelope, ErrorReply, Request, PROTOCOL};

pub use crate::history::spec;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use maintain::PolicyHolder;
pub use service::Service;
pub use spec::At;

/// Where a request's answer goes: data frames, then a result or an error.
pub trait Reply {
    fn data(&mut self, bytes: &[u8]) -> io::Result<()>;
}

struct FrameWriter<W: Write>(W);

fn frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| io::Error::other("frame too large"))?;
    w.write_all(&[kind])?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(payload)
}

impl<W: Write> Reply for FrameWriter<W> {
    fn data(&mut self, bytes: &[u8]) -> io::Result<()> {
        for piece in bytes.chunks(1 << 20) {
            frame(&mut self.0, b'D', piece)?;
        }
        Ok(())
    }
}

/// The directory holding control sockets: `/run/chronofs` for root,
/// `$XDG_RUNTIME_DIR/chronofs` (or `/tmp/chronofs-UID`) otherwise.
pub fn socket_dir(uid: u32) -> PathBuf {
    if uid == 0 {
        return PathBuf::from("/run/chronofs");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("chronofs"),
        None => PathBuf::from(format!("/tmp/chronofs-{uid}")),
    }
}

/// The socket of a mount: named by its mount id and device, which no two
/// live mounts share (a device number alone is reused at once).
pub fn socket_name(m: &MountEntry) -> String {
    format!("{}-{}.sock", m.id, m.dev.replace(':', "-"))
}

/// A running control server; removes its socket when dropped, unless the
/// path has meanwhile been taken by another mount's socket.
pub struct Server {
    path: PathBuf,
    inode: u64,
}

impl Drop for Server {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Listens at `path` (mode 0666: every user may ask; each request is
/// checked against the peer's credentials) and answers on a thread per
/// connection.
pub fn serve(path: &Path, service: Arc<dyn service::Answerer>) -> io::Result<Server> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    let held = Arc::new(Held::default());
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let conn = match conn {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of descriptors (EMFILE), accept fails at
                        // once for as long as the connection waits: a
                        // pause, not a spin on a CPU the mount needs.
                        tracing::warn!("control: cannot accept a connection: {e}");
                        std::thread::sleep(ACCEPT_BACKOFF);
                        continue;
                    }
                };
                let (svc, held) = (service.clone(), held.clone());
                let spawned = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        handle(conn, svc.as_ref(), &held);
                        // A long answer (`log -r` of a big tree) grew
                        // this thread's arena: give it back.
                        crate::sys::release_free_memory();
                    });
                if let Err(e) = spawned {
                    tracing::error!("control: cannot start a connection thread: {e}");
                }
            }
        })?;
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::symlink_metadata(path)?.ino();
    Ok(Server {
        path: path.to_path_buf(),
        inode,
    })
}

/// How long a connection may take to send its request line.
const REQUEST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// The longest request line read (a path list or a policy is far less).
const MAX_REQUEST: u64 = 1 << 20;
/// Connections one user other than root may hold open at once, and all
/// such users together: the socket is every user's (mode 0666), and
/// each connection costs the daemon a thread and two descriptors, which
/// the mount's files need too.
const PER_USER: usize = 32;
const ALL_USERS: usize = 256;
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// The connections open now, by user (root's are not counted).
#[derive(Default)]
struct Held {
    by_uid: parking_lot::Mutex<std::collections::HashMap<u32, usize>>,
}

/// One counted connection; uncounted when dropped.
struct Slot<'h> {
    held: &'h Held,
    uid: u32,
}

impl Held {
    fn take(&self, uid: u32) -> Option<Slot<'_>> {
        let mut by_uid = self.by_uid.lock();
        let all: usize = by_uid.values().sum();
        if by_uid.get(&uid).is_some_and(|n| *n >= PER_USER) || all >= ALL_USERS {
            return None;
        }
        *by_uid.entry(uid).or_default() += 1;
        Some(Slot { held: self, uid })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut by_uid = self.held.by_uid.lock();
        if let Some(n) = by_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                by_uid.remove(&self.uid);
            }
        }
    }
}

fn handle(conn: UnixStream, svc: &dyn service::Answerer, held: &Held) {
    let peer = match crate::sys::peer_credentials(&conn) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("control: cannot read peer credentials: {e}");
            return;
        }
    };
    let refuse = |errno, message| ErrorReply { errno, message };
    let _slot = match peer.uid {
        0 => None,
        uid => match held.take(uid) {
            Some(slot) => Some(slot),
            None => {
                let busy = refuse(
                    libc::EAGAIN,
                    format!(
                        "the mount's daemon is answering too many requests at once (at most \
                         {PER_USER} per user, {ALL_USERS} in all); try again"
                    ),
                );
                let mut out = io::BufWriter::new(conn);
                let sent = serde_json::to_vec(&busy)
                    .map_err(io::Error::other)
                    .and_then(|v| frame(&mut out, b'E', &v))
                    .and_then(|()| out.flush());
                if let Err(e) = sent {
                    tracing::debug!("control: client went away: {e}");
                }
                return;
            }
        },
    };
    let mut line = String::new();
    if conn.set_read_timeout(Some(REQUEST_WAIT)).is_err() {
        return;
    }
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    })
    .take(MAX_REQUEST);
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut out = FrameWriter(io::BufWriter::new(conn));
    let result = match serde_json::from_str::<Envelope>(&line) {
        Ok(env) if env.protocol == PROTOCOL => svc
            .answer(&env.request, &peer, &mut out)
            .map_err(|e| error_reply(&e))
            .and_then(|a| {
                serde_json::to_vec(&a)
                    .map_err(|e| refuse(libc::EIO, format!("cannot encode the answer: {e}")))
            }),
        Ok(env) => Err(refuse(
            libc::EPROTO,
            format!(
                "client speaks control protocol {}, this daemon {PROTOCOL}",
                env.protocol
            ),
        )),
        Err(e) => Err(refuse(libc::EINVAL, format!("malformed request: {e}"))),
    };
    let end = match result {
        Ok(v) => frame(&mut out.0, b'J', &v),
        Err(e) => match serde_json::to_vec(&e) {
            Ok(v) => frame(&mut out.0, b'E', &v),
            Err(e) => Err(io::Error::other(e)),
        },
    };
    if let Err(e) = end.and_then(|()| out.0.flush()) {
        tracing::debug!("control: client went away: {e}");
    }
}

/// The error frame of a failed request: what it is as an errno (the
/// CLI's exit and a script's check), and the line a person reads.
pub fn error_reply(e: &service::Error) -> ErrorReply {
    ErrorReply {
        errno: e.errno(),
        message: e.to_string(),
    }
}

/// A chronofs mount as /proc/self/mountinfo lists it.
#[derive(Clone, Debug)]
pub struct MountEntry {
    /// The mount id (first field of mountinfo).
    pub id: u64,
    pub mount_point: PathBuf,
    /// "major:minor" of the mount's device.
    pub dev: String,
    /// The directory of the mounted tree shown at the mount point: `/`,
    /// or a subdirectory for a bind mount of one.
    pub root: PathBuf,
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(&field[i + 1..(i + 4).min(field.len())], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every chronofs mount of this mount namespace, in mount order.
pub fn chronofs_mounts() -> Vec<MountEntry> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if r.first() != Some(&"fuse.chronofs") || l.len() < 5 {
                return None;
            }
            Some(MountEntry {
                id: l[0].parse().ok()?,
                mount_point: PathBuf::from(unescape(l[4])),
                dev: l[2].to_string(),
                root: PathBuf::from(unescape(l[3])),
            })
        })
        .collect()
}

/// The innermost chronofs mount containing `path` (absolute, normalized).
/// The table read is kept for the process's next calls (reading it costs
/// about 125 µs here, and a command resolves each path it is given); a
/// path no kept mount holds reads it again.
pub fn mount_of(path: &Path) -> Option<MountEntry> {
    static KEPT: std::sync::Mutex<Vec<MountEntry>> = std::sync::Mutex::new(Vec::new());
    let innermost = |mounts: &[MountEntry]| {
        mounts
            .iter()
            .filter(|m| path.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.components().count())
            .cloned()
    };
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let found = match innermost(&kept) {
        Some(m) => Some(m),
        None => {
            *kept = chronofs_mounts();
            innermost(&kept)
        }
    };
    found.filter(|m| !covered_below(path, m))
}

/// Whether another file system mounted below `m`'s mount point holds
/// `path` (or the nearest of its ancestors that exists): its name then
/// leads there, not into chronofs (a tmpfs over `MNT/dir`), whatever the
/// path's prefix says. A path that cannot be looked at (a mount whose
/// daemon is gone) is left to the request to report.
fn covered_below(path: &Path, m: &MountEntry) -> bool {
    use std::os::unix::fs::MetadataExt;
    let mut cur = path;
    loop {
        match std::fs::symlink_metadata(cur) {
            Ok(md) => {
                let dev = md.dev();
                let shown = format!("{}:{}", libc::major(dev), libc::minor(dev));
                return shown != m.dev;
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                match cur.parent() {
                    Some(p) if cur != m.mount_point => cur = p,
                    _ => return false,
                }
            }
            Err(_) => return false,
        }
    }
}

/// The control socket of a mount, for a client of uid `uid`: the daemon's
/// directory for root mounts first, then the caller's own.
pub fn socket_of(m: &MountEntry, uid: u32) -> Option<PathBuf> {
    let name = socket_name(m);
    [socket_dir(0), socket_dir(uid)]
        .into_iter()
        .map(|d| d.join(&name))
        .find(|p| p.exists())
}

/// Where requests about paths under `m` go: the control socket of the
/// daemon serving it, and the path within that daemon's mount of `m`'s
/// root. A bind mount of a chronofs mount, or of a directory in one, has
/// no socket of its own (sockets are named after the daemon's mount):
/// the mount it was bound from answers, the one of the same device that
/// shows the whole tree.
pub fn served_at(m: &MountEntry, uid: u32) -> Option<(PathBuf, PathBuf)> {
    let root = m.root.strip_prefix("/").unwrap_or(&m.root).to_path_buf();
    if let Some(socket) = socket_of(m, uid) {
        return Some((socket, root));
    }
    chronofs_mounts()
        .into_iter()
        .filter(|o| o.dev == m.dev && o.root == Path::new("/"))
        .find_map(|o| socket_of(&o, uid))
        .map(|socket| (socket, root))
}

#[cfg(test)]
mod tests {
    use super::{Held, ALL_USERS, PER_USER};

    /// A user holds at most `PER_USER` connections, all users together
    /// `ALL_USERS`; a closed one frees its place.
    #[test]
    fn connections_are_counted_per_user_and_in_all() {
        let held = Held::default();
        let mine: Vec<_> = (0..PER_USER).map(|_| held.take(1000)).collect();
        assert!(mine.iter().all(Option::is_some));
        assert!(held.take(1000).is_none(), "one past the user's limit");
        drop(mine);
        assert!(
            held.take(1000).is_some(),
            "a closed connection frees its place"
        );
        let mut all = Vec::new();
        for uid in 0.. {
            match held.take(2000 + uid / PER_USER as u32) {
                Some(slot) => all.push(slot),
                None => break,
            }
        }
        assert_eq!(all.len(), ALL_USERS);
        assert!(held.by_uid.lock().len() > 1);
        drop(all);
        assert!(held.by_uid.lock().is_empty());
    }

    use super::*;
    use service::Error;

    #[test]
    fn an_error_frame_carries_the_errors_own_errno() {
        let cases = [
            (Error::Usage("u".into()), libc::EINVAL),
            (Error::NotFound("n".into()), libc::ENOENT),
            (Error::Busy("b".into()), libc::EBUSY),
            (Error::Denied("d".into()), libc::EACCES),
            (Error::NotPermitted("p".into()), libc::EPERM),
            (
                Error::Io(io::Error::from_raw_os_error(libc::EXDEV)),
                libc::EXDEV,
            ),
            (Error::Io(io::Error::other("made in user space")), libc::EIO),
        ];
        for (e, errno) in cases {
            let reply = error_reply(&e);
            assert_eq!(reply.errno, errno, "{e:?}");
            assert_eq!(reply.message, e.to_string());
        }
    }
}
