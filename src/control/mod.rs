//! The control channel: a Unix socket per mount over which the CLI asks a
//! running daemon about history (the daemon holds the store's lock), and
//! the same requests answered directly from a store when nothing is
//! mounted.
//!
//! Owns: the request/response protocol (versioned), the socket's location
//! and peer-credential checks, and the answers (`service`). Uses:
//! `history`, `store`, `branch`, `sys`.
//!
//! Protocol (version `PROTOCOL`): the client sends one JSON line, a
//! `Request`. The server answers with frames `kind u8 ‖ length u32 (BE) ‖
//! payload`: any number of `D` (raw data, e.g. file content), then exactly
//! one `J` (the JSON result) or `E` (a one-line error).

mod maintain;
pub mod service;
mod tree;

pub use crate::history::spec;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use maintain::PolicyHolder;
pub use service::Service;
pub use spec::At;

pub const PROTOCOL: u32 = 3;

/// A path inside the mount, as name components from its root.
pub type Components = Vec<Vec<u8>>;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Tags,
    Tag {
        name: String,
        at: At,
    },
    Untag {
        name: String,
    },
    /// The sequence number and time an instant means.
    Resolve {
        at: At,
    },
    Stat {
        path: Components,
        at: At,
    },
    List {
        path: Components,
        at: At,
        deleted: bool,
    },
    /// PATH and everything under it at an instant, in one answer, with
    /// what a tree operation needs to bring it back exactly (object ids,
    /// xattr values, names as bytes).
    Tree {
        path: Components,
        at: At,
    },
    Read {
        path: Components,
        at: At,
        version: Option<i64>,
    },
    /// Where the file or directory at `path` at instant `at` was at
    /// instant `to`: its own path then, or that of the nearest of its
    /// directories that existed then (history follows renames).
    Follow {
        path: Components,
        at: At,
        to: At,
    },
    Log {
        path: Components,
        since: Option<At>,
        until: Option<At>,
        recursive: bool,
    },
    /// Start recording the whole tree (eager baseline) in the background.
    Ingest,
    Fsck {
        repair: bool,
    },
    /// Free unreferenced chunks and compact packs (root only). Progress
    /// comes as data frames, one `PHASE DONE TOTAL` line each.
    Gc {
        dry_run: bool,
    },
    /// One retention pass under the policy now; `now_ns` (root only)
    /// evaluates it as of another instant.
    Clean {
        now_ns: Option<i64>,
        dry_run: bool,
    },
    /// Remove versions of PATH (everything ever under it, for a
    /// directory) beyond `keep`. Non-root users: only their own files,
    /// never past the policy's minimums or protection window.
    Prune {
        path: Components,
        keep: crate::policy::Retention,
        dry_run: bool,
    },
    /// Remove the objects once at PATH (and under it) and all their
    /// history (root only; they must no longer exist live).
    Purge {
        path: Components,
        dry_run: bool,
    },
    /// Which policy rules apply to PATH and why.
    PolicyExplain {
        path: Components,
        user: Option<String>,
        process: Option<String>,
    },
    /// Load the policy files again (root only); on error the old policy
    /// stays in force.
    PolicyReload,
    /// The audit log: prunes, purges, collections, policy reloads.
    Audit,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Envelope {
    pub protocol: u32,
    pub request: Request,
}

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
pub fn serve(path: &Path, service: Arc<Service>) -> io::Result<Server> {
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
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let svc = service.clone();
                let spawned = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || handle(conn, &svc));
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

fn handle(conn: UnixStream, svc: &Service) {
    let peer = match crate::sys::peer_credentials(&conn) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("control: cannot read peer credentials: {e}");
            return;
        }
    };
    let mut line = String::new();
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut out = FrameWriter(io::BufWriter::new(conn));
    let result = match serde_json::from_str::<Envelope>(&line) {
        Ok(env) if env.protocol == PROTOCOL => svc.answer(&env.request, &peer, &mut out),
        Ok(env) => Err(service::Error::Usage(format!(
            "client speaks control protocol {}, this daemon {PROTOCOL}",
            env.protocol
        ))),
        Err(e) => Err(service::Error::Usage(format!("malformed request: {e}"))),
    };
    let end = match result {
        Ok(v) => frame(&mut out.0, b'J', &v.to_bytes()),
        Err(e) => frame(&mut out.0, b'E', e.to_string().as_bytes()),
    };
    if let Err(e) = end.and_then(|()| out.0.flush()) {
        tracing::debug!("control: client went away: {e}");
    }
}

/// Sends a request to the daemon at `socket`; data frames go to `data`.
pub fn call(
    socket: &Path,
    request: &Request,
    data: &mut dyn Write,
) -> Result<serde_json::Value, String> {
    let payload = call_raw(socket, request, data)?;
    serde_json::from_slice(&payload).map_err(|e| format!("malformed answer from the daemon: {e}"))
}

/// Like [`call`], returning the result's JSON text as the daemon sent it
/// (for output that passes it through unparsed).
pub fn call_raw(socket: &Path, request: &Request, data: &mut dyn Write) -> Result<Vec<u8>, String> {
    let mut conn = UnixStream::connect(socket)
        .map_err(|e| format!("cannot reach the daemon at {}: {e}", socket.display()))?;
    let env = Envelope {
        protocol: PROTOCOL,
        request: request.clone(),
    };
    let mut line = serde_json::to_string(&env).map_err(|e| e.to_string())?;
    line.push('\n');
    conn.write_all(line.as_bytes())
        .map_err(|e| format!("control socket: {e}"))?;
    let mut reader = BufReader::new(conn);
    loop {
        let mut head = [0u8; 5];
        reader
            .read_exact(&mut head)
            .map_err(|e| format!("the daemon closed the connection: {e}"))?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut payload = vec![0u8; len];
        reader
            .read_exact(&mut payload)
            .map_err(|e| format!("the daemon closed the connection: {e}"))?;
        match head[0] {
            b'D' => data
                .write_all(&payload)
                .map_err(|e| format!("writing output: {e}"))?,
            b'J' => return Ok(payload),
            b'E' => return Err(String::from_utf8_lossy(&payload).into_owned()),
            other => return Err(format!("unknown frame {other} from the daemon")),
        }
    }
}

/// Answers a request in this process (no daemon: the store was opened
/// directly).
pub fn call_local(
    svc: &Service,
    request: &Request,
    data: &mut dyn Write,
) -> Result<serde_json::Value, String> {
    answer_local(svc, request, data).map(service::Answer::into_value)
}

/// Like [`call_local`], returning the result's JSON text.
pub fn call_local_raw(
    svc: &Service,
    request: &Request,
    data: &mut dyn Write,
) -> Result<Vec<u8>, String> {
    answer_local(svc, request, data).map(|a| a.to_bytes())
}

fn answer_local(
    svc: &Service,
    request: &Request,
    data: &mut dyn Write,
) -> Result<service::Answer, String> {
    struct Direct<'a>(&'a mut dyn Write);
    impl Reply for Direct<'_> {
        fn data(&mut self, bytes: &[u8]) -> io::Result<()> {
            self.0.write_all(bytes)
        }
    }
    let me = crate::sys::Peer {
        uid: crate::sys::geteuid(),
        gid: crate::sys::getegid(),
        pid: std::process::id(),
    };
    svc.answer(request, &me, &mut Direct(data))
        .map_err(|e| e.to_string())
}

/// A chronofs mount as /proc/self/mountinfo lists it.
#[derive(Clone, Debug)]
pub struct MountEntry {
    /// The mount id (first field of mountinfo).
    pub id: u64,
    pub mount_point: PathBuf,
    /// "major:minor" of the mount's device.
    pub dev: String,
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
            })
        })
        .collect()
}

/// The innermost chronofs mount containing `path` (absolute, normalized).
pub fn mount_of(path: &Path) -> Option<MountEntry> {
    chronofs_mounts()
        .into_iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
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
