//! The typed client of the control protocol: one method per request,
//! each returning its reply type. It talks to a daemon over its socket or
//! answers in this process from a store opened directly; both go through
//! the same JSON, so a reply parses the same way wherever it came from.

use std::io::{self, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::de::DeserializeOwned;

use super::proto::*;
use super::service::Service;
use super::{error_reply, Reply};

/// Why a request got no reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    /// The daemon (or the local service) answered with an error.
    Refused(ErrorReply),
    /// The daemon could not be reached or broke the protocol.
    Transport(String),
}

impl ControlError {
    /// The errno the failure means (EIO when the daemon was not reached).
    pub fn errno(&self) -> i32 {
        match self {
            ControlError::Refused(r) => r.errno,
            ControlError::Transport(_) => libc::EIO,
        }
    }
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::Refused(r) => f.write_str(&r.message),
            ControlError::Transport(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ControlError {}

pub type Result<T> = std::result::Result<T, ControlError>;

/// Who answers: a daemon's socket, or a service in this process.
#[derive(Clone, Copy)]
pub enum Client<'a> {
    Daemon(&'a Path),
    Local(&'a Service),
}

impl Client<'_> {
    /// Sends `request`; data frames go to `data`, the reply is parsed as
    /// `R` (the reply type of that request).
    pub fn call<R: DeserializeOwned>(&self, request: Request, data: &mut dyn Write) -> Result<R> {
        let payload = match self {
            Client::Daemon(socket) => exchange(socket, &request, data)?,
            Client::Local(svc) => answer_local(svc, &request, data)?,
        };
        serde_json::from_slice(&payload)
            .map_err(|e| ControlError::Transport(format!("malformed answer from the daemon: {e}")))
    }

    fn ask<R: DeserializeOwned>(&self, request: Request) -> Result<R> {
        self.call(request, &mut io::sink())
    }

    pub fn status(&self) -> Result<StatusReply> {
        self.ask(Request::Status)
    }

    pub fn tags(&self) -> Result<TagsReply> {
        self.ask(Request::Tags)
    }

    pub fn tag(&self, name: &str, at: At) -> Result<TagInfo> {
        self.ask(Request::Tag {
            name: name.into(),
            at,
        })
    }

    pub fn clone_path(&self, src: &Components, dst: &Components, at: At) -> Result<CloneReply> {
        self.ask(Request::Clone {
            src: src.clone(),
            dst: dst.clone(),
            at,
        })
    }

    pub fn template_create(&self, name: &str, path: &Components, at: At) -> Result<TemplateInfo> {
        self.ask(Request::TemplateCreate {
            name: name.into(),
            path: path.clone(),
            at,
        })
    }

    pub fn template_instantiate(&self, name: &str, dst: &Components) -> Result<CloneReply> {
        self.ask(Request::TemplateInstantiate {
            name: name.into(),
            dst: dst.clone(),
        })
    }

    pub fn clones(&self) -> Result<ClonesReply> {
        self.ask(Request::Clones)
    }

    pub fn templates(&self) -> Result<TemplatesReply> {
        self.ask(Request::Templates)
    }

    pub fn template_delete(&self, name: &str) -> Result<UntagReply> {
        self.ask(Request::TemplateDelete { name: name.into() })
    }

    pub fn untag(&self, name: &str) -> Result<UntagReply> {
        self.ask(Request::Untag { name: name.into() })
    }

    pub fn resolve(&self, at: &At) -> Result<Instant> {
        self.ask(Request::Resolve { at: at.clone() })
    }

    pub fn stat(&self, path: &Components, at: &At) -> Result<NodeInfo> {
        self.ask(Request::Stat {
            path: path.clone(),
            at: at.clone(),
        })
    }

    pub fn list(&self, path: &Components, at: &At, deleted: bool) -> Result<Listing> {
        self.ask(Request::List {
            path: path.clone(),
            at: at.clone(),
            deleted,
        })
    }

    pub fn tree(&self, path: &Components, at: &At) -> Result<TreeReply> {
        self.ask(Request::Tree {
            path: path.clone(),
            at: at.clone(),
            shallow: false,
        })
    }

    /// [`Client::tree`] of PATH alone: its attributes and xattr values.
    pub fn node(&self, path: &Components, at: &At) -> Result<NodeInfo> {
        let reply: TreeReply = self.ask(Request::Tree {
            path: path.clone(),
            at: at.clone(),
            shallow: true,
        })?;
        Ok(reply.root)
    }

    /// A file's content (or a symlink's target) into `data`; the reply
    /// describes the version read.
    pub fn read(
        &self,
        path: &Components,
        at: &At,
        version: Option<i64>,
        data: &mut dyn Write,
    ) -> Result<NodeInfo> {
        self.call(
            Request::Read {
                path: path.clone(),
                at: at.clone(),
                version,
            },
            data,
        )
    }

    pub fn follow(&self, path: &Components, at: &At, to: &At) -> Result<FollowReply> {
        self.ask(Request::Follow {
            path: path.clone(),
            at: at.clone(),
            to: to.clone(),
        })
    }

    pub fn log(&self, path: &Components, since: Option<At>, until: Option<At>) -> Result<LogReply> {
        self.ask(Request::Log {
            path: path.clone(),
            since,
            until,
            recursive: false,
        })
    }

    pub fn log_tree(
        &self,
        path: &Components,
        since: Option<At>,
        until: Option<At>,
    ) -> Result<LogTreeReply> {
        self.ask(Request::Log {
            path: path.clone(),
            since,
            until,
            recursive: true,
        })
    }

    pub fn ingest(&self) -> Result<IngestReply> {
        self.ask(Request::Ingest)
    }

    /// Makes every change made through the mount so far durable.
    pub fn sync(&self) -> Result<()> {
        self.ask::<super::proto::SyncReply>(Request::Sync)
            .map(|_| ())
    }

    pub fn fsck(&self, repair: bool) -> Result<FsckReport> {
        self.ask(Request::Fsck { repair })
    }

    /// Progress lines (`PHASE DONE TOTAL`) go to `progress`.
    pub fn gc(&self, dry_run: bool, progress: &mut dyn Write) -> Result<GcReport> {
        self.call(Request::Gc { dry_run }, progress)
    }

    pub fn clean(&self, now_ns: Option<i64>, dry_run: bool) -> Result<CleanReport> {
        self.ask(Request::Clean { now_ns, dry_run })
    }

    pub fn prune(
        &self,
        path: &Components,
        keep: crate::policy::Retention,
        dry_run: bool,
    ) -> Result<PruneReply> {
        self.ask(Request::Prune {
            path: path.clone(),
            keep,
            dry_run,
        })
    }

    pub fn purge(&self, path: &Components, dry_run: bool) -> Result<PurgeReply> {
        self.ask(Request::Purge {
            path: path.clone(),
            dry_run,
        })
    }

    pub fn policy_explain(
        &self,
        path: &Components,
        user: Option<String>,
        process: Option<String>,
    ) -> Result<ExplainReply> {
        self.ask(Request::PolicyExplain {
            path: path.clone(),
            user,
            process,
        })
    }

    pub fn policy_reload(&self) -> Result<ReloadReply> {
        self.ask(Request::PolicyReload)
    }

    pub fn audit(&self) -> Result<AuditReply> {
        self.ask(Request::Audit)
    }

    pub fn branches(&self) -> Result<super::proto::BranchList> {
        self.ask(Request::Branches)
    }

    pub fn branch_mode(
        &self,
        branch: &str,
        writable: bool,
        force: bool,
    ) -> Result<super::proto::BranchModeReply> {
        self.ask(Request::BranchMode {
            branch: branch.into(),
            writable,
            force,
        })
    }

    pub fn branch_add(
        &self,
        path: &str,
        position: Option<u32>,
        writable: bool,
    ) -> Result<super::proto::BranchSetReply> {
        self.ask(Request::BranchAdd {
            path: path.into(),
            position,
            writable,
        })
    }

    pub fn snapshot(&self, name: Option<&str>, force: bool) -> Result<super::proto::SnapshotReply> {
        self.ask(Request::Snapshot {
            name: name.map(str::to_string),
            force,
        })
    }

    pub fn snapmerge(&self, upto: Option<&str>) -> Result<super::proto::SnapmergeReply> {
        self.ask(Request::Snapmerge {
            upto: upto.map(str::to_string),
        })
    }

    pub fn sandbox_start(&self, id: Option<u32>) -> Result<super::proto::SandboxRow> {
        self.ask(Request::SandboxStart { id })
    }

    pub fn sandbox_enter(&self, id: u32) -> Result<super::proto::SandboxRow> {
        self.ask(Request::SandboxEnter { id })
    }

    pub fn sandboxes(&self) -> Result<super::proto::SandboxList> {
        self.ask(Request::Sandboxes)
    }

    pub fn sandbox_discard(&self, id: u32) -> Result<super::proto::SandboxRow> {
        self.ask(Request::SandboxDiscard { id })
    }

    pub fn sandbox_commit(&self, id: u32, force: bool) -> Result<super::proto::SandboxCommitReply> {
        self.ask(Request::SandboxCommit { id, force })
    }

    pub fn branch_remove(&self, branch: &str, force: bool) -> Result<super::proto::BranchSetReply> {
        self.ask(Request::BranchRemove {
            branch: branch.into(),
            force,
        })
    }
}

fn transport(what: &str) -> impl Fn(io::Error) -> ControlError + '_ {
    move |e| ControlError::Transport(format!("{what}: {e}"))
}

/// The daemon's end closed before the answer was whole.
fn cut_off(e: io::Error) -> ControlError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => ControlError::Transport(
            "the daemon stopped before it answered: the mount was unmounted (or its daemon \
             died) while this command ran"
                .into(),
        ),
        _ => transport("reading the daemon's answer")(e),
    }
}

/// One request over the socket: the reply's JSON, data frames to `data`.
fn exchange(socket: &Path, request: &Request, data: &mut dyn Write) -> Result<Vec<u8>> {
    let mut conn = UnixStream::connect(socket).map_err(|e| {
        ControlError::Transport(format!(
            "cannot reach the daemon at {}: {e}",
            socket.display()
        ))
    })?;
    let env = Envelope {
        protocol: PROTOCOL,
        request: request.clone(),
    };
    let mut line = serde_json::to_vec(&env).map_err(|e| ControlError::Transport(e.to_string()))?;
    line.push(b'\n');
    conn.write_all(&line).map_err(transport("control socket"))?;
    let mut reader = BufReader::new(conn);
    loop {
        let mut head = [0u8; 5];
        reader.read_exact(&mut head).map_err(cut_off)?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut payload = vec![0u8; len];
        reader.read_exact(&mut payload).map_err(cut_off)?;
        match head[0] {
            b'D' => data
                .write_all(&payload)
                .map_err(transport("writing output"))?,
            b'J' => return Ok(payload),
            b'E' => {
                return Err(match serde_json::from_slice::<ErrorReply>(&payload) {
                    Ok(r) => ControlError::Refused(r),
                    // A daemon of another protocol version says so in
                    // plain text.
                    Err(_) => ControlError::Refused(ErrorReply {
                        errno: libc::EPROTO,
                        message: String::from_utf8_lossy(&payload).into_owned(),
                    }),
                });
            }
            other => {
                return Err(ControlError::Transport(format!(
                    "unknown frame {other} from the daemon"
                )))
            }
        }
    }
}

/// Answers a request in this process (no daemon: the store was opened
/// directly), as the calling user.
fn answer_local(svc: &Service, request: &Request, data: &mut dyn Write) -> Result<Vec<u8>> {
    struct Direct<'a>(&'a mut dyn Write);
    impl Reply for Direct<'_> {
        fn data(&mut self, bytes: &[u8]) -> io::Result<()> {
            self.0.write_all(bytes)
        }
    }
    let me = crate::sys::Peer::this_process();
    let answer = svc
        .answer(request, &me, &mut Direct(data))
        .map_err(|e| ControlError::Refused(error_reply(&e)))?;
    serde_json::to_vec(&answer)
        .map_err(|e| ControlError::Transport(format!("cannot encode the answer: {e}")))
}
