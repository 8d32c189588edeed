//! Sandboxes (issue 17), the daemon's side. A sandbox is a private
//! read-write branch over the mount's branches (all read-only to it),
//! served by this daemon as a second FUSE session with its own `Vfs` and
//! no history, mounted under /run where only root reaches it.
//! `chronofs sandbox` (cli/sandbox.rs) binds that mount over the mount
//! point in a private mount namespace, so the processes it starts, and
//! their children, see the sandbox and no one else does.
//! docs/ARCHITECTURE.md "Sandboxes".
//!
//! On disk, `STORE/sandboxes/ID/`: `sandbox.json` (format 1: id, when,
//! the branches it lies over), `branch/` (what its processes changed) and
//! `store/` (its inode numbers). A sandbox outlives the daemon; the next
//! `chronofs sandbox MNT --id ID` serves it again.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::branch::{BranchId, DirBranch};
use crate::control::proto::{SandboxCommitReply, SandboxRow};
use crate::control::service::{Error, Result};
use crate::fuse::{AdapterConfig, ChronoFuse, MountSpec, Mounted};
use crate::store::{BranchIdent, BranchRoot, Store};
use crate::sys;
use crate::vfs::{SandboxIds, UnionBranch, UnionOptions, Vfs, VfsConfig};

/// `sandbox.json`'s format; older ones must keep opening.
const FORMAT: u32 = 1;

/// `commit.json`'s format: a commit began and must be finished.
const COMMIT_FORMAT: u32 = 1;

/// How many sandboxes a user other than root may keep on one mount.
const SANDBOXES_PER_USER: usize = 16;

/// Where daemons serve sandboxes, under their process id.
const RUN_DIR: &str = "/run/chronofs/sandboxes";

#[derive(Serialize, Deserialize)]
struct Manifest {
    format: u32,
    id: u32,
    created_ns: u64,
    /// The mount's branches it lies over, top first.
    base: Vec<PathBuf>,
    /// The uid that made it (root for a sandbox made before owners were
    /// recorded, when only root could make one).
    #[serde(default)]
    owner: u32,
}

/// Refuses `uid` the use of sandbox `id` owned by `owner`, unless it is
/// the owner or root.
fn may_use(id: u32, owner: u32, uid: u32) -> Result<()> {
    if uid == 0 || uid == owner {
        return Ok(());
    }
    Err(Error::NotPermitted(format!(
        "sandbox {id} belongs to uid {owner}: only its owner or root may use it"
    )))
}

/// Written before a commit changes anything: the next daemon finishes it.
#[derive(Serialize, Deserialize)]
struct CommitJournal {
    format: u32,
    started_ns: u64,
    /// The renamed directories' contents are absorbed (and that is
    /// durable): a resume goes straight to the fold.
    #[serde(default)]
    absorbed: bool,
}

/// How a sandbox's session is made: the mount's own settings.
pub(super) struct Recipe {
    pub vfs: VfsConfig,
    pub adapter: AdapterConfig,
    pub spec: MountSpec,
    pub union: UnionOptions,
    /// The store's name in SRC's root: hidden in a sandbox too.
    pub reserved: Option<OsString>,
}

/// A sandbox being served.
struct Served {
    mountpoint: PathBuf,
    session: Option<std::thread::JoinHandle<()>>,
    /// Its union's branch ids, its own first (its store is open while it
    /// is served).
    ids: Vec<u32>,
}

pub(super) struct Sandboxes {
    /// `STORE/sandboxes`.
    dir: PathBuf,
    /// Where served sandboxes are mounted.
    run_dir: PathBuf,
    /// The mount's mount point, which a sandbox covers for its processes.
    mount_point: PathBuf,
    recipe: Recipe,
    /// Why this mount cannot have sandboxes, if it cannot.
    refused: Option<String>,
    served: Mutex<BTreeMap<u32, Served>>,
}

fn io(what: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| {
        Error::Io(std::io::Error::new(
            e.kind(),
            format!("{}: {e}", what.display()),
        ))
    }
}

impl Sandboxes {
    /// `store`: the mount's store directory; `refused`: why the mount
    /// cannot have sandboxes (its store lies under its own mount point).
    pub(super) fn new(
        store: &Path,
        recipe: Recipe,
        refused: Option<String>,
        mount_point: &Path,
    ) -> Sandboxes {
        clear_dead_daemons_mounts(Path::new(RUN_DIR));
        Sandboxes {
            dir: store.join("sandboxes"),
            run_dir: Path::new(RUN_DIR).join(std::process::id().to_string()),
            mount_point: mount_point.to_path_buf(),
            recipe,
            refused,
            served: Mutex::new(BTreeMap::new()),
        }
    }

    fn manifest(&self, id: u32) -> Result<Manifest> {
        let path = self.dir.join(id.to_string()).join("sandbox.json");
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(format!("no sandbox {id} on this mount")))
            }
            Err(e) => return Err(io(&path)(e)),
        };
        let m: Manifest = serde_json::from_slice(&text)
            .map_err(|e| Error::Usage(format!("{}: unreadable: {e}", path.display())))?;
        if m.format > FORMAT {
            return Err(Error::Usage(format!(
                "{}: format {} is newer than this chronofs ({FORMAT})",
                path.display(),
                m.format
            )));
        }
        Ok(m)
    }

    fn ids(&self) -> Result<Vec<u32>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&self.dir)(e)),
        };
        let mut ids: Vec<u32> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    fn row(&self, m: &Manifest) -> SandboxRow {
        SandboxRow {
            id: m.id,
            created_ns: m.created_ns,
            mountpoint: self
                .served
                .lock()
                .get(&m.id)
                .map(|s| s.mountpoint.to_string_lossy().into_owned()),
            branch: self.branch_dir(m.id).to_string_lossy().into_owned(),
            owner: m.owner,
        }
    }

    /// Binds served sandbox `id` over the mount point in the mount
    /// namespace of `peer`, which must be one of its own in a user
    /// namespace of its own (`sys::private_user_namespace`): the daemon's
    /// namespace would put the sandbox in front of every process.
    pub(super) fn enter(&self, id: u32, peer: &sys::Peer) -> Result<SandboxRow> {
        let mnt = &self.mount_point;
        let m = self.manifest(id)?;
        may_use(id, m.owner, peer.uid)?;
        let from = self
            .served
            .lock()
            .get(&id)
            .map(|s| s.mountpoint.clone())
            .ok_or_else(|| Error::Usage(format!("sandbox {id} is not served: start it first")))?;
        let own = peer.pid != 0 && sys::in_own_namespaces(peer.pid).map_err(Error::Io)?;
        if !own {
            return Err(Error::Usage(
                "enter a user and mount namespace of your own first (chronofs sandbox does)".into(),
            ));
        }
        sys::bind_mount_in_namespace_of(peer.pid, &from, mnt).map_err(io(mnt))?;
        Ok(self.row(&m))
    }

    fn branch_dir(&self, id: u32) -> PathBuf {
        self.dir.join(id.to_string()).join("branch")
    }

    pub(super) fn list(&self) -> Result<Vec<SandboxRow>> {
        let mut rows = Vec::new();
        for id in self.ids()? {
            match self.manifest(id) {
                Ok(m) => rows.push(self.row(&m)),
                // Discard still takes it.
                Err(e) => tracing::warn!("sandbox {id}: {e}"),
            }
        }
        Ok(rows)
    }

    /// A branch change would change what every sandbox lies over.
    pub(super) fn refuse_set_change(&self) -> Result<()> {
        self.refuse_while_any("lies over these branches")
    }

    /// A clone made now would lie in branches a sandbox reads without the
    /// mount's history (see `start`).
    pub(super) fn refuse_clone(&self) -> Result<()> {
        self.refuse_while_any("lies over this mount and could not read a clone")
    }

    /// Busy while any sandbox exists: "sandbox N `what`: ...".
    fn refuse_while_any(&self, what: &str) -> Result<()> {
        match self.ids()?.first() {
            Some(id) => Err(Error::Busy(format!(
                "sandbox {id} {what}: commit or discard it first (chronofs sandbox list)"
            ))),
            None => Ok(()),
        }
    }

    /// Serves sandbox `id`, or a new one, over `base` (the mount's branches,
    /// top first). `holds_clones`: the mount has clones, whose files and
    /// directories show their base only through the mount's history, which
    /// a sandbox's session does not have: it would show them empty (and a
    /// commit would write that back), so it is refused.
    pub(super) fn start(
        &self,
        id: Option<u32>,
        base: Vec<(PathBuf, u64, u32)>,
        holds_clones: bool,
        uid: u32,
    ) -> Result<SandboxRow> {
        let (base, keys): (Vec<PathBuf>, Vec<(u64, u32)>) = base
            .into_iter()
            .map(|(path, dev, id)| (path, (dev, id)))
            .unzip();
        if let Some(why) = &self.refused {
            return Err(Error::Usage(why.clone()));
        }
        if holds_clones {
            return Err(Error::Usage(
                "this mount holds clones (chronofs clone): a sandbox cannot read them yet, \
                 so none is made over it"
                    .into(),
            ));
        }
        let manifest = match id {
            Some(id) => {
                let m = self.manifest(id)?;
                may_use(id, m.owner, uid)?;
                if self.committing(id) {
                    return Err(Error::Busy(format!(
                        "sandbox {id} is being committed: it cannot be entered again"
                    )));
                }
                if m.base != base {
                    return Err(Error::Busy(format!(
                        "sandbox {id} was made over other branches than the mount's now"
                    )));
                }
                m
            }
            None => {
                self.refuse_too_many(uid)?;
                self.make(base, uid)?
            }
        };
        if !self.served.lock().contains_key(&manifest.id) {
            self.serve(&manifest, &keys)?;
        }
        Ok(self.row(&manifest))
    }

    /// Each sandbox is a FUSE session with threads of its own: an
    /// ordinary user may keep a bounded number on a mount.
    fn refuse_too_many(&self, uid: u32) -> Result<()> {
        if uid == 0 {
            return Ok(());
        }
        let mine = self
            .ids()?
            .into_iter()
            .filter(|id| self.manifest(*id).is_ok_and(|m| m.owner == uid))
            .count();
        if mine >= SANDBOXES_PER_USER {
            return Err(Error::Busy(format!(
                "uid {uid} has {mine} sandboxes on this mount, the most an ordinary user may \
                 keep: commit or discard one (chronofs sandbox list)"
            )));
        }
        Ok(())
    }

    fn make(&self, base: Vec<PathBuf>, owner: u32) -> Result<Manifest> {
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let id = self.ids()?.last().map_or(1, |last| last + 1);
        let dir = self.dir.join(id.to_string());
        std::fs::create_dir(&dir).map_err(io(&dir))?;
        let branch = self.branch_dir(id);
        std::fs::create_dir(&branch).map_err(io(&branch))?;
        // The union's root shows the top branch's root: the mount's own.
        copy_root_attrs(&base[0], &branch).map_err(io(&branch))?;
        let m = Manifest {
            format: FORMAT,
            id,
            created_ns: now_ns(),
            base,
            owner,
        };
        let text =
            serde_json::to_vec_pretty(&m).map_err(|e| Error::Io(std::io::Error::other(e)))?;
        let path = dir.join("sandbox.json");
        write_durably(&path, &text).map_err(io(&path))?;
        Ok(m)
    }

    /// Sandbox `m`'s union's branch ids, its own branch first, from its
    /// store.
    fn store_ids(&self, m: &Manifest, store: &Store) -> Result<Vec<BranchIdent>> {
        let mut roots = Vec::with_capacity(m.base.len() + 1);
        for path in std::iter::once(self.branch_dir(m.id)).chain(m.base.iter().cloned()) {
            let dir = std::fs::File::open(&path).map_err(io(&path))?;
            roots.push(BranchRoot::of(path.clone(), dir.as_fd()).map_err(io(&path))?);
        }
        store
            .branch_idents(&roots)
            .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))
    }

    /// How sandbox `m`'s union and the mount's (`vfs`) name the mount's
    /// branches: its store's ids (from the served session, else read).
    fn sandbox_ids(&self, vfs: &Vfs, m: &Manifest) -> Result<SandboxIds> {
        let Ok(mount) = vfs.branches() else {
            // A single directory: no ids to translate.
            return Ok(SandboxIds::default());
        };
        let served = self.served.lock().get(&m.id).map(|s| s.ids.clone());
        let own = match served {
            Some(ids) => ids,
            None => {
                let dir = self.dir.join(m.id.to_string()).join("store");
                let store = Store::open(&dir)
                    .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
                self.store_ids(m, &store)?.iter().map(|b| b.id).collect()
            }
        };
        let mount: Vec<u32> = mount.iter().map(|b| b.id).collect();
        Ok(SandboxIds::new(own.get(1..).unwrap_or_default(), &mount))
    }

    /// `keys`: the device number the mount's keys carry for each base
    /// branch, which the sandbox's keys must carry too (its index entries
    /// become the mount's at commit), and the mount's id of the branch,
    /// which names it in the indexes the mount wrote.
    fn serve(&self, m: &Manifest, keys: &[(u64, u32)]) -> Result<()> {
        let fail = |e: String| Error::Io(std::io::Error::other(e));
        let dir = self.dir.join(m.id.to_string());
        let mut list = vec![UnionBranch {
            branch: DirBranch::open(
                BranchId(0),
                &self.branch_dir(m.id),
                self.recipe.reserved.clone(),
            )
            .map_err(io(&self.branch_dir(m.id)))?,
            writable: true,
            id: 0,
        }];
        for (i, path) in m.base.iter().enumerate() {
            list.push(UnionBranch {
                branch: DirBranch::open(BranchId(i as u32 + 1), path, None).map_err(io(path))?,
                writable: false,
                id: i as u32 + 1,
            });
        }
        let store = Store::open(&dir.join("store")).map_err(|e| fail(e.to_string()))?;
        let idents = self.store_ids(m, &store)?;
        for (b, ident) in list.iter_mut().zip(&idents) {
            b.id = ident.id;
            b.branch.set_key_dev(ident.key_dev);
        }
        for (b, (dev, _)) in list[1..].iter_mut().zip(keys) {
            b.branch.set_key_dev(*dev);
        }
        let inomap = store.inode_map().map_err(|e| fail(e.to_string()))?;
        let r = &self.recipe;
        let vfs = Vfs::new_union(list, inomap, r.vfs.clone(), None, r.union)
            .map_err(|e| fail(e.to_string()))?;
        // The mount's copies of hard-linked files are found under its ids.
        let named: Vec<(u32, u32)> = idents[1..]
            .iter()
            .zip(keys)
            .map(|(ours, (_, mount))| (ours.id, *mount))
            .collect();
        vfs.indexes_written_with(&named);
        let fs = ChronoFuse::new(Arc::clone(&vfs), r.adapter.clone())
            .map_err(|e| fail(e.to_string()))?;
        let mountpoint = self.run_dir.join(m.id.to_string());
        std::fs::create_dir_all(&mountpoint).map_err(io(&mountpoint))?;
        // The session is mounted with the mount's options (allow_other):
        // only root may walk to it, or anyone could read the sandbox here.
        std::fs::set_permissions(&self.run_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io(&self.run_dir))?;
        let mut spec = r.spec.clone();
        spec.fsname = format!("chronofs-sandbox-{}", m.id);
        let session = Mounted::new(fs, &mountpoint, &spec).map_err(io(&mountpoint))?;
        // Everything below the sandbox's branch is read through the daemon.
        if let Some(entry) = crate::control::chronofs_mounts()
            .into_iter()
            .rev()
            .find(|e| e.mount_point == mountpoint)
        {
            super::mount::widen_readahead(&entry.dev);
        }
        let id = m.id;
        let thread = std::thread::Builder::new()
            .name(format!("sandbox-{id}"))
            .spawn(move || {
                if let Err(e) = session.run() {
                    tracing::error!("sandbox {id}: session failed: {e}");
                }
                drop(vfs);
            })
            .map_err(Error::Io)?;
        tracing::info!("sandbox {id} served at {}", mountpoint.display());
        self.served.lock().insert(
            id,
            Served {
                mountpoint,
                session: Some(thread),
                ids: idents.iter().map(|b| b.id).collect(),
            },
        );
        Ok(())
    }

    /// Throws sandbox `id` away. Processes still inside it lose their view
    /// (ENOTCONN): the session ends.
    pub(super) fn discard(&self, id: u32, uid: u32) -> Result<SandboxRow> {
        let row = match self.manifest(id) {
            Ok(m) => self.row(&m),
            Err(e @ Error::NotFound(_)) => return Err(e),
            // An unreadable one can still be thrown away.
            Err(_) => SandboxRow {
                id,
                branch: self.branch_dir(id).to_string_lossy().into_owned(),
                ..Default::default()
            },
        };
        may_use(id, row.owner, uid)?;
        if self.committing(id) {
            return Err(Error::Busy(format!(
                "sandbox {id} is being committed: the daemon finishes it when it mounts again"
            )));
        }
        if let Some(served) = self.served.lock().remove(&id) {
            stop(served);
        }
        self.remove(id)?;
        tracing::info!("sandbox {id} discarded");
        Ok(row)
    }

    /// Removes sandbox `id`'s directory: renamed away first, in one step,
    /// so that a half-removed sandbox is no sandbox (a leftover goes at
    /// the next daemon's start).
    fn remove(&self, id: u32) -> Result<()> {
        let dir = self.dir.join(id.to_string());
        let gone = self.dir.join(format!(".removing-{id}"));
        let _ = std::fs::remove_dir_all(&gone);
        std::fs::rename(&dir, &gone).map_err(io(&dir))?;
        std::fs::remove_dir_all(&gone).map_err(io(&gone))
    }

    /// What removals a stopped daemon left half done.
    fn clear_removed(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(".removing-") {
                if let Err(err) = std::fs::remove_dir_all(e.path()) {
                    tracing::warn!("{}: {err}", e.path().display());
                }
            }
        }
    }
}

/// For a commit by an ordinary user: the paths the sandbox changes that
/// its owner may no longer change on the mount, because the permissions
/// of the directory holding them changed since the sandbox was made (the
/// sandbox's session checked them as they were). The nearest directory
/// above each path that the mount has (its topmost copy among `base`)
/// must be writable and searchable by the owner, and every directory
/// above it searchable (the owner must reach it now); a sticky one also
/// needs the owner to own it or the entry the commit replaces or
/// removes.
fn no_longer_permitted(base: &[PathBuf], paths: &[Vec<u8>], peer: &sys::Peer) -> Vec<String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let caller = sys::creds::Caller {
        uid: peer.uid,
        gid: peer.gid,
        pid: peer.pid,
    };
    let topmost = |rel: &Path| -> Option<(PathBuf, std::fs::Metadata)> {
        base.iter()
            .map(|b| b.join(rel))
            .find_map(|p| std::fs::symlink_metadata(&p).ok().map(|m| (p, m)))
    };
    let may = |p: &Path, how: i32| {
        std::fs::File::open(p).is_ok_and(|f| {
            sys::creds::as_caller(&caller, || sys::access_fd(f.as_fd(), how)).is_ok()
        })
    };
    let mut refused = Vec::new();
    let mut searchable = std::collections::HashMap::new();
    for raw in paths {
        let path = Path::new(std::ffi::OsStr::from_bytes(raw));
        let mut dir = path.parent();
        let found = loop {
            let Some(d) = dir else { break None };
            match topmost(d) {
                Some((p, m)) if m.is_dir() => break Some((p, m)),
                _ => dir = d.parent(),
            }
        };
        let Some((dir_path, dir_meta)) = found else {
            continue;
        };
        let rel = dir.unwrap_or(Path::new(""));
        let reached = rel.ancestors().skip(1).all(|above| {
            *searchable
                .entry(above.to_path_buf())
                .or_insert_with(|| topmost(above).is_some_and(|(p, _)| may(&p, libc::X_OK)))
        });
        let writable = reached && may(&dir_path, libc::W_OK | libc::X_OK);
        let sticky_owner = dir_meta.mode() & libc::S_ISVTX == 0
            || dir_meta.uid() == peer.uid
            || topmost(path).is_none_or(|(_, m)| m.uid() == peer.uid);
        if !writable || !sticky_owner {
            refused.push(format!("/{}", path.display()));
        }
    }
    refused
}

/// Refuses an ordinary user's commit that changes what they may no
/// longer change (see [`no_longer_permitted`]).
fn check_owner_may(
    id: u32,
    base: &[PathBuf],
    changes: &crate::union::commit::Changes,
    peer: &sys::Peer,
) -> Result<()> {
    if peer.uid == 0 {
        return Ok(());
    }
    let refused = no_longer_permitted(base, &changes.paths, peer);
    if refused.is_empty() {
        return Ok(());
    }
    Err(Error::NotPermitted(format!(
        "sandbox {id}: uid {} may no longer change {} on the mount (permissions changed since \
         the sandbox was made); nothing was applied",
        peer.uid,
        refused.join(", ")
    )))
}

/// Refuses a forced commit of hard-linked files changed on both sides.
fn linked_both(
    id: u32,
    changes: &crate::union::commit::Changes,
    reply: &SandboxCommitReply,
) -> Result<()> {
    if !changes.linked_both {
        return Ok(());
    }
    Err(Error::Busy(format!(
        "sandbox {id}: a hard-linked file was changed both in it and on the mount ({}); \
         --force cannot apply two copies of one file: discard the sandbox, or undo one side \
         (nothing was applied)",
        reply.conflicts.join(", ")
    )))
}

impl Sandboxes {
    /// Applies sandbox `id` to the mount `vfs` (made over `base`) and ends
    /// it, unless changes made on the mount since it was made conflict
    /// with its own (`force` applies it anyway, the sandbox's side
    /// winning). Conflicts found while its processes still run leave it
    /// served; the commit itself ends its session first.
    pub(super) fn commit(
        &self,
        vfs: &Vfs,
        id: u32,
        force: bool,
        base: Vec<PathBuf>,
        peer: &sys::Peer,
    ) -> Result<SandboxCommitReply> {
        let t0 = std::time::Instant::now();
        let m = self.manifest(id)?;
        may_use(id, m.owner, peer.uid)?;
        if force && peer.uid != 0 {
            return Err(Error::NotPermitted(format!(
                "sandbox {id}: only root may force a commit over changes made on the mount since"
            )));
        }
        if m.base != base {
            return Err(Error::Busy(format!(
                "sandbox {id} was made over other branches than the mount's now: it cannot be \
                 committed (discard it, or mount those branches again)"
            )));
        }
        let branch = self.branch_dir(id);
        let root = open_dir(&branch)?;
        let since = self.made_at(id, &m);
        let mut reply = SandboxCommitReply {
            sandbox: self.row(&m),
            ..Default::default()
        };
        if self.committing(id) {
            // One that began must finish: its conflicts were weighed then.
            if let Some(served) = self.served.lock().remove(&id) {
                stop(served);
            }
            let count = self.resume_commit(vfs, id, &root)?;
            reply.applied = true;
            reply.sandbox.mountpoint = None;
            reply.moved = count.moved;
            reply.elapsed_us = t0.elapsed().as_micros() as u64;
            return Ok(reply);
        }
        let report = |reply: &mut SandboxCommitReply, c: &crate::union::commit::Changes| {
            reply.changes = c.paths.len() as u64;
            reply.conflicts = c
                .conflicts
                .iter()
                .map(|p| format!("/{}", String::from_utf8_lossy(p)))
                .collect();
        };
        let ids = self.sandbox_ids(vfs, &m)?;
        // A first look while its processes run: a conflict leaves it be.
        let first = vfs.commit_changes(root.as_fd(), since, &ids)?;
        report(&mut reply, &first);
        if !first.conflicts.is_empty() && !force {
            return Ok(reply);
        }
        check_owner_may(id, &base, &first, peer)?;
        linked_both(id, &first, &reply)?;
        if let Some(served) = self.served.lock().remove(&id) {
            if !stop(served) {
                // Its processes could still write into directories the
                // commit moves into the mount, past history.
                return Err(Error::Busy(format!(
                    "sandbox {id}: its session could not be ended (no FUSE control file \
                     system to abort it through): end the sandbox's processes, then commit \
                     again (nothing was applied)"
                )));
            }
        }
        // A descriptor opened with kernel passthrough outlives the session.
        let writer = crate::union::commit::open_for_writing(root.as_fd())
            .map_err(|e| Error::Io(std::io::Error::from_raw_os_error(e.errno())))?;
        if let Some(path) = writer {
            return Err(Error::Busy(format!(
                "sandbox {id}: /{} is still open for writing by a process of the sandbox: end \
                 it, then commit again (nothing was applied)",
                String::from_utf8_lossy(&path)
            )));
        }
        // Nothing writes the branch now: this look is the one applied.
        let changes = vfs.commit_changes(root.as_fd(), since, &ids)?;
        report(&mut reply, &changes);
        reply.sandbox.mountpoint = None;
        if !changes.conflicts.is_empty() && !force {
            return Ok(reply);
        }
        check_owner_may(id, &base, &changes, peer)?;
        linked_both(id, &changes, &reply)?;
        // Before the journal: a failure here leaves nothing to finish.
        vfs.secure_commit(&changes.paths)?;
        self.write_journal(id, false)?;
        let recheck = (!force).then_some(since);
        let applied = vfs
            .commit_branch(
                root.as_fd(),
                (&changes.paths, &ids),
                (false, recheck),
                &|| self.absorbed(id, &root),
            )
            .map_err(|e| {
                Error::Io(std::io::Error::other(format!(
                    "sandbox {id}: the commit stopped part way ({e}); `chronofs sandbox commit \
                     {id}` again, or the next mount, finishes it"
                )))
            })?;
        let count = match applied {
            Ok(count) => count,
            Err(late) => {
                // Changed on the mount since the look above: nothing was
                // applied, so the commit is not one to finish.
                self.forget_journal(id)?;
                report(&mut reply, &late);
                return Ok(reply);
            }
        };
        self.finish_commit(id, &root)?;
        reply.applied = true;
        reply.moved = count.moved;
        reply.merged_dirs = count.merged_dirs;
        reply.removed = count.whiteouts;
        reply.elapsed_us = t0.elapsed().as_micros() as u64;
        tracing::info!("sandbox {id} committed");
        Ok(reply)
    }

    /// When sandbox `id` was made, by the clock that dates changes on the
    /// mount (the kernel's coarse one, which may lag the system's by a
    /// tick): its manifest's mtime, which nothing changes after.
    fn made_at(&self, id: u32, m: &Manifest) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let manifest = self.dir.join(id.to_string()).join("sandbox.json");
        match std::fs::metadata(&manifest) {
            Ok(st) => (st.mtime() as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(st.mtime_nsec() as u64),
            Err(_) => m.created_ns,
        }
    }

    fn write_journal(&self, id: u32, absorbed: bool) -> Result<()> {
        let journal = self.dir.join(id.to_string()).join("commit.json");
        let text = serde_json::to_vec_pretty(&CommitJournal {
            format: COMMIT_FORMAT,
            started_ns: now_ns(),
            absorbed,
        })
        .map_err(|e| Error::Io(std::io::Error::other(e)))?;
        write_durably(&journal, &text).map_err(io(&journal))
    }

    /// A commit that applied nothing is not one to finish: its journal
    /// goes, durably.
    fn forget_journal(&self, id: u32) -> Result<()> {
        let dir = self.dir.join(id.to_string());
        let journal = dir.join("commit.json");
        std::fs::remove_file(&journal).map_err(io(&journal))?;
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&dir))
    }

    /// The commit's absorb step is done: durable, then journaled.
    fn absorbed(&self, id: u32, branch: &OwnedFd) -> std::io::Result<()> {
        sys::reopen_dir(branch.as_fd(), libc::O_RDONLY).and_then(|fd| sys::syncfs(fd.as_fd()))?;
        self.write_journal(id, true)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// Finishes the commit of sandbox `id` that began before (its journal
    /// says how far it went), without weighing conflicts again.
    fn resume_commit(
        &self,
        vfs: &Vfs,
        id: u32,
        root: &OwnedFd,
    ) -> Result<crate::union::snapmerge::MergeCount> {
        let path = self.dir.join(id.to_string()).join("commit.json");
        let text = std::fs::read(&path).map_err(io(&path))?;
        let journal: CommitJournal = serde_json::from_slice(&text)
            .map_err(|e| Error::Usage(format!("{}: unreadable: {e}", path.display())))?;
        if journal.format > COMMIT_FORMAT {
            return Err(Error::Usage(format!(
                "{}: format {} is newer than this chronofs ({COMMIT_FORMAT})",
                path.display(),
                journal.format
            )));
        }
        let ids = self.sandbox_ids(vfs, &self.manifest(id)?)?;
        let changes = vfs.commit_changes(root.as_fd(), 0, &ids)?;
        // What is not replaced yet is put in history (what was, is there).
        if let Err(e) = vfs.secure_commit(&changes.paths) {
            tracing::error!("sandbox {id}: history of what the commit replaces: {e}");
        }
        let count = vfs.commit_branch(
            root.as_fd(),
            (&changes.paths, &ids),
            (journal.absorbed, None),
            &|| self.absorbed(id, root),
        )?;
        self.finish_commit(id, root)?;
        // Not weighed again: always applied.
        count.map_err(|_| Error::Busy(format!("sandbox {id}: conflicts weighed on a resume")))
    }

    /// A commit applied: made durable, then the sandbox goes.
    fn finish_commit(&self, id: u32, branch: &OwnedFd) -> Result<()> {
        sys::reopen_dir(branch.as_fd(), libc::O_RDONLY)
            .and_then(|fd| sys::syncfs(fd.as_fd()))
            .map_err(io(&self.branch_dir(id)))?;
        self.remove(id)
    }

    /// Finishes the commits a stopped daemon left half done (before the
    /// mount serves anything: it then shows them whole).
    pub(super) fn finish_interrupted_commits(&self, vfs: &Vfs) {
        // Such a mount has no sandboxes, and its store's path leads into
        // the mount itself, which serves nothing yet.
        if self.refused.is_some() {
            return;
        }
        self.clear_removed();
        let Ok(ids) = self.ids() else {
            return;
        };
        for id in ids {
            let journal = self.dir.join(id.to_string()).join("commit.json");
            if !journal.exists() {
                continue;
            }
            let finished = self.manifest(id).and_then(|m| {
                if !vfs.commit_target_is(m.base.first().map(PathBuf::as_path)) {
                    return Err(Error::Busy(
                        "it was made over other branches than the mount's now; mount those \
                         again to finish it"
                            .into(),
                    ));
                }
                let root = open_dir(&self.branch_dir(id))?;
                self.resume_commit(vfs, id, &root).map(|_| ())
            });
            match finished {
                Ok(()) => tracing::info!("sandbox {id}: its interrupted commit is finished"),
                Err(e) => {
                    tracing::error!("sandbox {id}: its interrupted commit cannot finish: {e}")
                }
            }
        }
    }

    /// Whether a commit of sandbox `id` began and has not finished.
    fn committing(&self, id: u32) -> bool {
        self.dir.join(id.to_string()).join("commit.json").exists()
    }

    /// Ends every served sandbox's session (the daemon is stopping).
    pub(super) fn stop_all(&self) {
        for (_, served) in std::mem::take(&mut *self.served.lock()) {
            stop(served);
        }
        // Left only while a session could not be ended (its mount point
        // is still in it): the next daemon clears it then.
        if let Err(e) = std::fs::remove_dir(&self.run_dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::debug!("{}: {e}", self.run_dir.display());
            }
        }
    }
}

/// Ends a sandbox's session: its FUSE connection is aborted, since the
/// binds in sandboxed processes' mount namespaces would keep it alive
/// otherwise, and its mount under /run goes. False where it could not be
/// aborted: the session then lives as long as a process inside does.
fn stop(mut served: Served) -> bool {
    use std::os::unix::fs::MetadataExt;
    // Only a device number read on the session's own mount names its
    // connection: were the session gone already, the directory's own file
    // system's number would name another FUSE connection (another mount's,
    // aborted: seen in CI as a test mount ending in ECONNABORTED).
    let dev = match sys::is_fuse_mount_root(&served.mountpoint) {
        true => std::fs::metadata(&served.mountpoint).map(|m| m.dev()),
        false => Err(std::io::Error::from_raw_os_error(libc::ENOTCONN)),
    };
    // Aborted before the unmount, while the mount holds the connection:
    // once it is unmounted and unused, its number is free for the next
    // FUSE mount, which the abort would then end (seen in CI as a fresh
    // sandbox answering ENOTCONN).
    let aborted = dev.is_ok_and(abort_connection);
    let unmounted = sys::cstr(served.mountpoint.as_os_str())
        .and_then(|path| sys::umount2(&path, libc::MNT_DETACH));
    if let Err(e) = unmounted {
        tracing::warn!("{}: {e}", served.mountpoint.display());
    }
    let ended = match served.session.take() {
        Some(t) if aborted => {
            let _ = t.join();
            true
        }
        // Its session ends when the last process using it closes it.
        Some(_) => {
            tracing::warn!(
                "{}: the session could not be aborted; it ends with its last user",
                served.mountpoint.display()
            );
            false
        }
        None => true,
    };
    let _ = std::fs::remove_dir(&served.mountpoint);
    ended
}

/// Aborts the FUSE connection of the mount whose device is `dev`.
fn abort_connection(dev: u64) -> bool {
    match sys::mount_fusectl() {
        Ok(()) => {}
        // Mounted already.
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
        Err(e) => tracing::debug!("fusectl: {e}"),
    }
    // fusectl names a connection by its device (major 0: the minor).
    let abort = format!("/sys/fs/fuse/connections/{}/abort", libc::minor(dev));
    match std::fs::write(&abort, "1") {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("{abort}: {e}");
            false
        }
    }
}

/// Sessions of daemons that died without ending them (kill -9) stay
/// mounted, dead (ENOTCONN): their mounts go, and their directories.
/// A process id in use again is left alone.
fn clear_dead_daemons_mounts(run_dir: &Path) {
    let Ok(daemons) = std::fs::read_dir(run_dir) else {
        return;
    };
    for daemon in daemons.flatten() {
        let pid = daemon.file_name();
        if Path::new("/proc").join(&pid).exists() {
            continue;
        }
        if let Ok(sessions) = std::fs::read_dir(daemon.path()) {
            for session in sessions.flatten() {
                let path = session.path();
                if let Ok(c) = sys::cstr(path.as_os_str()) {
                    // Not mounted any more: EINVAL, nothing to do.
                    let _ = sys::umount2(&c, libc::MNT_DETACH);
                }
                let _ = std::fs::remove_dir(&path);
            }
        }
        match std::fs::remove_dir(daemon.path()) {
            Ok(()) => tracing::info!("cleared the dead sandbox mounts of daemon {pid:?}"),
            Err(e) => tracing::warn!("{}: {e}", daemon.path().display()),
        }
    }
}

fn open_dir(path: &Path) -> Result<std::os::fd::OwnedFd> {
    sys::cstr(path.as_os_str())
        .and_then(|c| sys::openat(sys::CWD, &c, libc::O_PATH | libc::O_DIRECTORY, 0))
        .map_err(io(path))
}

fn copy_root_attrs(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let st = std::fs::metadata(from)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(st.mode() & 0o7777))?;
    std::os::unix::fs::chown(to, Some(st.uid()), Some(st.gid()))
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Writes `path` whole or not at all, durably: a temporary beside it,
/// synced, renamed over it, the directory synced.
fn write_durably(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}
