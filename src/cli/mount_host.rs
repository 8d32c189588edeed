//! What the control service asks of a running mount (`MountHost`): its
//! vfs, a union's branch paths and record, and the branch changes,
//! snapshots, clones and sandboxes done on it.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::control;
use crate::sys;
use crate::vfs::Vfs;

/// What the control service asks of a running mount: its vfs, and a
/// union's branch paths and record.
pub(super) struct MountHost {
    pub(super) vfs: std::sync::Weak<Vfs>,
    /// A union's branch paths, by persistent id.
    pub(super) paths: parking_lot::Mutex<std::collections::HashMap<u32, PathBuf>>,
    pub(super) counts: Arc<crate::fuse::RequestCounts>,
    pub(super) transport: crate::fuse::TransportState,
    /// A union's record of its branches, and the command line's.
    pub(super) record: Option<(crate::store::BranchSetLog, Vec<(u32, bool)>)>,
    /// Where `snapshot` makes fresh branches (the store's `branches/`).
    pub(super) fresh_dir: PathBuf,
    /// Why `snapshot` cannot make one: the store lies under the mount
    /// point (reached by path, that leads into the mount itself).
    pub(super) fresh_refusal: Option<String>,
    /// Snapshot names, by the frozen branch's id.
    pub(super) snapshots: parking_lot::Mutex<std::collections::HashMap<u32, String>>,
    /// Held by each branch change, sandbox start and commit, and clone:
    /// one at a time.
    pub(super) changes: parking_lot::Mutex<()>,
    /// One SRC: the directory a sandbox lies over (a union's are `paths`).
    pub(super) src: Option<PathBuf>,
    pub(super) sandboxes: Arc<super::sandbox_host::Sandboxes>,
}

impl MountHost {
    fn branch_row(&self, b: &crate::vfs::BranchInfo) -> control::proto::BranchRow {
        control::proto::BranchRow {
            position: b.position,
            id: b.id,
            path: self
                .paths
                .lock()
                .get(&b.id)
                .map_or_else(String::new, |p| p.display().to_string()),
            mode: if b.writable { "rw" } else { "ro" }.to_string(),
            upper: b.upper,
            snapshot: self.snapshots.lock().get(&b.id).cloned(),
        }
    }

    /// Records a union's live branches (id, read-write) with the command
    /// line's, durably: what a remount with that command line resumes.
    fn recorder(
        &self,
    ) -> impl Fn(&[(u32, bool)]) -> std::result::Result<(), crate::store::StoreError> + '_ {
        move |live: &[(u32, bool)]| match &self.record {
            Some((log, mounted)) => log.record(&crate::store::BranchSet {
                mounted: mounted.clone(),
                live: live.to_vec(),
            }),
            None => Ok(()),
        }
    }

    fn set_reply(
        &self,
        vfs: &Vfs,
        change: crate::vfs::SetChange,
        t0: std::time::Instant,
    ) -> control::service::Result<control::proto::BranchSetReply> {
        let elapsed_us = t0.elapsed().as_micros() as u64;
        let list = vfs.branches()?;
        Ok(control::proto::BranchSetReply {
            branches: list.iter().map(|b| self.branch_row(b)).collect(),
            revoked: change.revoked,
            elapsed_us,
        })
    }

    /// Which frozen branches `snapmerge` folds (id and snapshot name,
    /// top first) and into which: those frozen since snapshot `upto`, or
    /// since the oldest snapshot whose branch is still in the union, into
    /// that snapshot's branch. They must lie next to each other.
    #[allow(clippy::type_complexity)]
    fn merge_plan(
        &self,
        vfs: &Vfs,
        upto: Option<&str>,
    ) -> control::service::Result<(Vec<(u32, String)>, (u32, String))> {
        use control::service::Error;
        let list = vfs.branches()?;
        let names = self.snapshots.lock().clone();
        let frozen: Vec<(u32, u32, String)> = list
            .iter()
            .filter_map(|b| names.get(&b.id).map(|n| (b.position, b.id, n.clone())))
            .collect();
        let at = match upto {
            Some(n) => frozen.iter().position(|f| f.2 == n).ok_or_else(|| {
                Error::NotFound(format!(
                    "no branch of this union was frozen by a snapshot named {n:?} \
                     (chronofs branch list MNT shows them)"
                ))
            })?,
            None => frozen.len().checked_sub(1).ok_or_else(|| {
                Error::Usage(
                    "no branch of this union was frozen by a snapshot: nothing to merge".into(),
                )
            })?,
        };
        let (pos, id, name) = frozen[at].clone();
        if at == 0 {
            return Err(Error::Usage(format!(
                "nothing to merge: no branch frozen after snapshot {name} lies above its branch"
            )));
        }
        for (k, f) in frozen[..at].iter().enumerate() {
            if f.0 as usize != pos as usize - (at - k) {
                return Err(Error::Usage(format!(
                    "snapshot {}'s branch is not next to snapshot {name}'s (another branch lies \
                     between them): merge with --upto, or remove the branch between",
                    f.2
                )));
            }
        }
        let sources = frozen[..at].iter().map(|f| (f.1, f.2.clone())).collect();
        Ok((sources, (id, name)))
    }

    /// The directories a sandbox lies over: the mount's branches, top
    /// first, each with the device number the mount's keys carry for it
    /// and its id.
    fn sandbox_base(&self, vfs: &Vfs) -> control::service::Result<Vec<(PathBuf, u64, u32)>> {
        if let Some(src) = &self.src {
            // A single directory's keys carry id 0.
            return Ok(vec![(src.clone(), vfs.root_key_dev(0)?, 0)]);
        }
        let paths = self.paths.lock();
        let mut base = Vec::new();
        for b in vfs.branches()? {
            let path = paths.get(&b.id).cloned().ok_or_else(|| {
                control::service::Error::NotFound(format!("branch id {}: no path", b.id))
            })?;
            base.push((path, vfs.root_key_dev(b.id)?, b.id));
        }
        Ok(base)
    }

    /// [`Self::sandbox_base`]'s directories alone.
    fn sandbox_paths(&self, vfs: &Vfs) -> control::service::Result<Vec<PathBuf>> {
        Ok(self
            .sandbox_base(vfs)?
            .into_iter()
            .map(|(p, ..)| p)
            .collect())
    }

    /// A branch as the user names it: its position (0 = top) or its path.
    fn branch_position(&self, vfs: &Vfs, branch: &str) -> control::service::Result<u32> {
        let list = vfs.branches()?;
        if let Ok(n) = branch.parse::<u32>() {
            if (n as usize) < list.len() {
                return Ok(n);
            }
        }
        let wanted = std::path::Path::new(branch);
        let wanted = wanted
            .canonicalize()
            .unwrap_or_else(|_| wanted.to_path_buf());
        let paths = self.paths.lock();
        list.iter()
            .find(|b| {
                paths
                    .get(&b.id)
                    .is_some_and(|p| p.canonicalize().unwrap_or_else(|_| p.clone()) == wanted)
            })
            .map(|b| b.position)
            .ok_or_else(|| {
                control::service::Error::NotFound(format!(
                    "{branch} is not a branch of this union (give its path or its position, 0 = top)"
                ))
            })
    }
}

/// Walks DST's directories from the mount's root as `caller`, each
/// reference taken pushed on `held`. The daemon's lookups check nothing
/// (the kernel searched the way to a request's inode), so the search
/// permission a path walk needs is checked here, as the caller, on each
/// directory walked through (DST's own directory's write and search are
/// `Vfs::clone_path`'s): a writable directory inside one its maker may
/// not search must stay out of reach, as it is natively.
fn walk_dst_dirs(
    vfs: &Vfs,
    caller: &crate::vfs::Caller,
    dirs: &[Vec<u8>],
    held: &mut Vec<crate::vfs::InodeNo>,
) -> control::service::Result<crate::vfs::InodeNo> {
    use control::service::Error;
    let mut dir = crate::vfs::InodeNo::ROOT;
    for (depth, comp) in dirs.iter().enumerate() {
        let shown = || crate::history::past::show_path(&dirs[..depth]);
        match vfs.access(caller, dir, libc::X_OK) {
            Err(e) if e.errno() == libc::EACCES => {
                return Err(Error::Denied(format!(
                    "{} could not be searched by uid {}",
                    shown(),
                    caller.uid
                )))
            }
            other => other?,
        }
        let e = match vfs.lookup(caller, dir, std::ffi::OsStr::from_bytes(comp)) {
            Err(e) if e.errno() == libc::ENOENT => {
                let missing = crate::history::past::show_path(&dirs[..=depth]);
                return Err(Error::NotFound(format!(
                    "{missing}: No such file or directory"
                )));
            }
            other => other?,
        };
        held.push(e.attr.ino);
        dir = e.attr.ino;
        // As a path walk says of `file/x`, before any permission of it.
        if e.attr.kind() != libc::S_IFDIR {
            return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR).into());
        }
    }
    Ok(dir)
}

fn shutting_down() -> control::service::Error {
    control::service::Error::Usage("the mount is shutting down".into())
}

impl crate::history::past::LiveIds for MountHost {
    fn identify(&self, st: &sys::Stat) -> Option<crate::history::ObjectId> {
        self.vfs.upgrade().and_then(|v| v.object_of(st))
    }

    fn find(
        &self,
        obj: crate::history::ObjectId,
        path: &[Vec<u8>],
    ) -> Option<std::io::Result<Option<(std::os::fd::OwnedFd, sys::Stat)>>> {
        self.vfs.upgrade()?.live_find(obj, path)
    }

    fn find_child(
        &self,
        dir: crate::history::ObjectId,
        name: &[u8],
    ) -> Option<std::io::Result<Option<(crate::history::ObjectId, std::os::fd::OwnedFd, sys::Stat)>>>
    {
        self.vfs.upgrade()?.live_find_child(dir, name)
    }
}

impl control::service::Host for MountHost {
    fn audit(&self) -> bool {
        self.vfs.upgrade().is_some_and(|v| v.config().views.audit)
    }

    fn shown_links(
        &self,
        obj: crate::history::ObjectId,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Option<u32> {
        self.vfs.upgrade()?.shown_links(obj, Some(fd))
    }

    fn settle(&self) {
        if let Some(v) = self.vfs.upgrade() {
            v.settle_capture();
        }
    }

    fn names_a_view(&self, path: &control::proto::Components) -> bool {
        let Some(vfs) = self.vfs.upgrade() else {
            return false;
        };
        let views = &vfs.config().views;
        path.first()
            .is_some_and(|n| n.as_slice() == views.dir_name.as_bytes())
            || path.iter().any(|n| views.holds_sep(n))
    }

    fn tag_made(&self, name: &str) {
        if let Some(v) = self.vfs.upgrade() {
            v.tag_made(name);
        }
    }

    fn record_shown(&self, path: &control::proto::Components) {
        if let Some(v) = self.vfs.upgrade() {
            v.record_shown_at(path);
        }
    }

    fn settle_within(&self, path: &control::proto::Components) {
        if let Some(v) = self.vfs.upgrade() {
            v.settle_capture_within(path);
        }
    }

    fn sync(&self) -> control::service::Result<()> {
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        Ok(vfs.sync_branches()?)
    }

    fn live_content(
        &self,
        obj: Option<crate::history::ObjectId>,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> control::service::Result<Option<Box<dyn crate::capture::Readable>>> {
        let Some(vfs) = self.vfs.upgrade() else {
            return Ok(None);
        };
        Ok(vfs.live_content(obj, fd)?)
    }

    fn clones_reading(
        &self,
        path: &control::proto::Components,
        objects: &std::collections::HashSet<crate::history::ObjectId>,
    ) -> control::service::Result<Vec<Vec<u8>>> {
        let Some(vfs) = self.vfs.upgrade() else {
            return Ok(Vec::new());
        };
        Ok(vfs.clones_reading(path, objects)?)
    }

    fn history_rewritten(&self, objs: &[crate::history::ObjectId]) {
        if let Some(v) = self.vfs.upgrade() {
            v.forget_known(objs);
        }
    }

    fn start_ingest(&self) -> std::result::Result<(), String> {
        match self.vfs.upgrade() {
            Some(v) => v.start_ingest(),
            None => Err("the mount is shutting down".into()),
        }
    }

    fn request_counts(&self) -> Option<Vec<control::proto::RequestCount>> {
        let served = self.counts.served().into_iter();
        Some(
            served
                .map(|(kind, count)| control::proto::RequestCount {
                    kind: kind.to_string(),
                    count,
                })
                .collect(),
        )
    }

    fn transport(&self) -> Option<String> {
        Some(crate::fuse::transport_name(self.transport.get()).to_string())
    }

    fn union_status(&self) -> Option<control::proto::UnionStatus> {
        let vfs = self.vfs.upgrade()?;
        let (opts, usage) = vfs.union_usage()?;
        let ids = vfs.branches().ok()?;
        let paths = self.paths.lock();
        let branches = usage
            .into_iter()
            .zip(ids)
            .map(|(b, info)| control::proto::BranchStatus {
                path: paths
                    .get(&info.id)
                    .map_or_else(String::new, |p| p.display().to_string()),
                mode: if b.writable { "rw" } else { "ro" }.to_string(),
                size_bytes: b.size_bytes,
                used_bytes: b.used_bytes,
                free_bytes: b.free_bytes,
                creates: b.creates,
            })
            .collect();
        Some(control::proto::UnionStatus {
            create: opts.create.to_string(),
            delete: opts.delete.to_string(),
            xattrs: opts.xattr_ns.name().into(),
            branches,
        })
    }

    fn branches(&self) -> control::service::Result<Vec<control::proto::BranchRow>> {
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        let list = vfs.branches()?;
        Ok(list.into_iter().map(|b| self.branch_row(&b)).collect())
    }

    fn set_branch_mode(
        &self,
        branch: &str,
        writable: bool,
        force: bool,
    ) -> control::service::Result<control::proto::BranchModeReply> {
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        let _one = self.changes.lock();
        let position = self.branch_position(&vfs, branch)?;
        let t0 = std::time::Instant::now();
        let change = vfs.set_branch_mode(position, writable, force, &self.recorder())?;
        let elapsed_us = t0.elapsed().as_micros() as u64;
        let list = vfs.branches()?;
        let info = list
            .get(position as usize)
            .ok_or_else(|| control::service::Error::NotFound(format!("no branch {branch}")))?;
        Ok(control::proto::BranchModeReply {
            branch: self.branch_row(info),
            changed: !change.unchanged,
            revoked: change.revoked,
            elapsed_us,
        })
    }

    fn add_branch(
        &self,
        path: &str,
        position: Option<u32>,
        writable: bool,
    ) -> control::service::Result<control::proto::BranchSetReply> {
        use control::service::Error;
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        let _one = self.changes.lock();
        self.sandboxes.refuse_set_change()?;
        let path = PathBuf::from(path);
        if !path.is_absolute() {
            return Err(Error::Usage(format!(
                "{}: give the new branch as an absolute path",
                path.display()
            )));
        }
        if let Some(why) = super::branch::nesting_refusal(&path, &self.branches()?) {
            return Err(Error::Usage(why));
        }
        let t0 = std::time::Instant::now();
        let cpath = sys::cstr(path.as_os_str()).map_err(Error::Io)?;
        let root = sys::openat(sys::CWD, &cpath, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?;
        let ours = vfs.store_id();
        let foreign =
            crate::vfs::foreign_stamp(std::os::fd::AsFd::as_fd(&root), ours.is_some(), ours)
                .map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?;
        if let Some(why) = foreign {
            return Err(Error::Usage(format!("{} {why}", path.display())));
        }
        let new_root = crate::store::BranchRoot::of(path.clone(), std::os::fd::AsFd::as_fd(&root))
            .map_err(Error::Io)?;
        let ident = match &self.record {
            Some((log, _)) => log
                .branch_idents(&[new_root])
                .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?
                .first()
                .copied()
                .ok_or_else(|| Error::Usage("no id for the new branch".into()))?,
            None => return Err(Error::Usage("this mount records no branch set".into())),
        };
        let id = ident.id;
        let new = crate::vfs::NewBranch {
            root,
            id,
            key_dev: ident.key_dev,
            writable,
            position: position.unwrap_or(0),
        };
        let change = vfs.add_branch(new, &self.recorder())?;
        self.paths.lock().insert(id, path);
        record_new_view(&vfs);
        self.set_reply(&vfs, change, t0)
    }

    fn snapshot(
        &self,
        name: Option<&str>,
        force: bool,
    ) -> control::service::Result<control::proto::SnapshotReply> {
        use control::service::Error;
        let store_err = |e: crate::store::StoreError| match e {
            crate::store::StoreError::Exists(why) => Error::Usage(why),
            e => Error::Io(std::io::Error::other(e.to_string())),
        };
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        let _one = self.changes.lock();
        self.sandboxes.refuse_set_change()?;
        let Some((log, mounted)) = &self.record else {
            return Err(Error::Usage("this mount records no branch set".into()));
        };
        if let Some(why) = &self.fresh_refusal {
            return Err(Error::Usage(why.clone()));
        }
        let t0 = std::time::Instant::now();
        let frozen = vfs
            .branches()?
            .into_iter()
            .find(|b| b.upper)
            .ok_or_else(|| Error::Busy("no branch is read-write: nothing to freeze".into()))?;
        let taken: Vec<String> = log
            .snapshots()
            .map_err(store_err)?
            .into_iter()
            .map(|s| s.name)
            .collect();
        let name = match name {
            Some(n) if taken.iter().any(|t| t == n) => {
                return Err(Error::Usage(format!(
                    "a snapshot named {n:?} exists already"
                )))
            }
            Some(n) => snapshot_name(n)?.to_string(),
            None => (taken.len() + 1..)
                .map(|i| format!("snapshot-{i}"))
                .find(|n| !taken.contains(n) && !self.fresh_dir.join(format!("over-{n}")).exists())
                .unwrap_or_default(),
        };
        // The fresh branch holds what changes after the snapshot: "over" it.
        let dir = self.fresh_dir.join(format!("over-{name}"));
        std::fs::create_dir_all(&self.fresh_dir).map_err(Error::Io)?;
        // An empty one that no snapshot names and no branch is, is a
        // crash's leftover (made, the set not recorded): the name is free.
        let ident = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(p)
                .ok()
                .map(|m| (m.dev(), m.ino()))
        };
        let leftover = ident(&dir);
        if leftover.is_some() && !self.paths.lock().values().any(|p| ident(p) == leftover) {
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).map_err(|e| {
            Error::Usage(format!(
                "cannot make the fresh branch {}: {e}",
                dir.display()
            ))
        })?;
        let made = || -> control::service::Result<crate::vfs::SetChange> {
            // The set recorded below names the directory: a power cut must
            // not leave the record without it (the next mount would refuse
            // to start).
            for parent in [Some(self.fresh_dir.as_path()), self.fresh_dir.parent()]
                .into_iter()
                .flatten()
            {
                std::fs::File::open(parent)
                    .and_then(|d| d.sync_all())
                    .map_err(Error::Io)?;
            }
            let cdir = sys::cstr(dir.as_os_str()).map_err(Error::Io)?;
            let root = sys::openat(sys::CWD, &cdir, libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(Error::Io)?;
            let fresh_root =
                crate::store::BranchRoot::of(dir.clone(), std::os::fd::AsFd::as_fd(&root))
                    .map_err(Error::Io)?;
            let ident = log
                .branch_idents(&[fresh_root])
                .map_err(store_err)?
                .first()
                .copied()
                .ok_or_else(|| Error::Usage("no id for the fresh branch".into()))?;
            let id = ident.id;
            let snapshot = crate::store::Snapshot {
                name: name.clone(),
                branch: frozen.id,
                time_ns: crate::history::now_ns(),
            };
            let record = |live: &[(u32, bool)]| {
                let set = crate::store::BranchSet {
                    mounted: mounted.clone(),
                    live: live.to_vec(),
                };
                log.record_snapshot(&set, &snapshot)
            };
            let fresh = crate::vfs::NewBranch {
                root,
                id,
                key_dev: ident.key_dev,
                writable: true,
                position: 0,
            };
            let (_, change) = vfs.snapshot(fresh, force, &record).map_err(|e| match e {
                crate::vfs::VfsError::Store(crate::store::StoreError::Exists(why)) => {
                    Error::Usage(why)
                }
                e => e.into(),
            })?;
            self.paths.lock().insert(id, dir.clone());
            Ok(change)
        };
        let change = match made() {
            Ok(c) => c,
            Err(e) => {
                // Nothing refers to the empty directory yet.
                let _ = std::fs::remove_dir(&dir);
                return Err(e);
            }
        };
        self.snapshots.lock().insert(frozen.id, name.clone());
        Ok(control::proto::SnapshotReply {
            name,
            fresh: dir.display().to_string(),
            set: self.set_reply(&vfs, change, t0)?,
        })
    }

    fn snapmerge(
        &self,
        upto: Option<&str>,
    ) -> control::service::Result<control::proto::SnapmergeReply> {
        use control::service::Error;
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        let _one = self.changes.lock();
        self.sandboxes.refuse_set_change()?;
        if self.record.is_none() {
            return Err(Error::Usage("this mount records no branch set".into()));
        }
        let t0 = std::time::Instant::now();
        let (sources, target) = self.merge_plan(&vfs, upto)?;
        let mut reply = control::proto::SnapmergeReply {
            into: target.1.clone(),
            ..Default::default()
        };
        let mut change = crate::vfs::SetChange::default();
        // Nearest first: each fold takes the branch right above the target.
        for (id, name) in sources.iter().rev() {
            let position = vfs
                .branches()?
                .iter()
                .find(|b| b.id == *id)
                .map(|b| b.position)
                .ok_or_else(|| Error::Busy(format!("snapshot {name}'s branch left the union")))?;
            let (_, count, c) = vfs.merge_branch(position, &self.recorder())?;
            change = c;
            reply.moved += count.moved;
            reply.merged_dirs += count.merged_dirs;
            reply.whiteouts += count.whiteouts;
            reply.merged.insert(0, name.clone());
            self.snapshots.lock().remove(id);
            if let Some(dir) = self.paths.lock().remove(id) {
                // The fold left its root empty; one the store made goes.
                if dir.starts_with(&self.fresh_dir) {
                    if let Err(e) = std::fs::remove_dir(&dir) {
                        tracing::warn!("snapmerge: {} stays: {e}", dir.display());
                    }
                }
            }
        }
        reply.set = self.set_reply(&vfs, change, t0)?;
        Ok(reply)
    }

    fn clone_tree(
        &self,
        src: &control::proto::Components,
        seq: crate::history::Seq,
        dst: &control::proto::Components,
        peer: &sys::Peer,
    ) -> control::service::Result<String> {
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        // Against a sandbox starting meanwhile (`start_sandbox`).
        let _one = self.changes.lock();
        self.sandboxes.refuse_clone()?;
        let caller = crate::vfs::Caller {
            uid: peer.uid,
            gid: peer.gid,
            pid: peer.pid,
        };
        let Some((name, parents)) = dst.split_last() else {
            return Err(control::service::Error::Usage(
                "DST is the mount itself".into(),
            ));
        };
        let mut held = Vec::new();
        let found = walk_dst_dirs(&vfs, &caller, parents, &mut held);
        let made = found.and_then(|dir| {
            vfs.clone_path(&caller, src, seq, dir, std::ffi::OsStr::from_bytes(name))
                .map_err(Into::into)
        });
        for ino in held {
            vfs.forget(ino, 1);
        }
        Ok(made?.tag)
    }

    fn clone_instants_in_use(
        &self,
    ) -> control::service::Result<Option<std::collections::HashSet<crate::history::Seq>>> {
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        Ok(Some(vfs.clone_instants_in_use()?))
    }

    fn clone_space(
        &self,
        path: &control::proto::Components,
    ) -> control::service::Result<control::proto::CloneSpace> {
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        let s = vfs.clone_space(path)?;
        Ok(control::proto::CloneSpace {
            shared_files: s.shared_files,
            shared_bytes: s.shared_bytes,
            own_files: s.own_files,
            own_bytes: s.own_bytes,
            unfilled_dirs: s.unfilled_dirs,
        })
    }

    fn start_sandbox(
        &self,
        id: Option<u32>,
        peer: &sys::Peer,
    ) -> control::service::Result<control::proto::SandboxRow> {
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        let _one = self.changes.lock();
        self.sandboxes
            .start(id, self.sandbox_base(&vfs)?, vfs.clones_on(), peer.uid)
    }

    fn enter_sandbox(
        &self,
        id: u32,
        peer: &sys::Peer,
    ) -> control::service::Result<control::proto::SandboxRow> {
        self.sandboxes.enter(id, peer)
    }

    fn commit_sandbox(
        &self,
        id: u32,
        force: bool,
        peer: &sys::Peer,
    ) -> control::service::Result<control::proto::SandboxCommitReply> {
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        let _one = self.changes.lock();
        self.sandboxes
            .commit(&vfs, id, force, self.sandbox_paths(&vfs)?, peer)
    }

    fn sandboxes(&self) -> control::service::Result<Vec<control::proto::SandboxRow>> {
        self.sandboxes.list()
    }

    fn discard_sandbox(
        &self,
        id: u32,
        peer: &sys::Peer,
    ) -> control::service::Result<control::proto::SandboxRow> {
        let _one = self.changes.lock();
        self.sandboxes.discard(id, peer.uid)
    }

    fn remove_branch(
        &self,
        branch: &str,
        force: bool,
    ) -> control::service::Result<control::proto::BranchSetReply> {
        let vfs = self.vfs.upgrade().ok_or_else(shutting_down)?;
        let _one = self.changes.lock();
        self.sandboxes.refuse_set_change()?;
        let position = self.branch_position(&vfs, branch)?;
        // A snapshot's fresh branch holds every change made since: taken
        // out, they all vanish from view with no word (undelete finds them).
        let rows = self.branches()?;
        if let Some(row) = rows.get(position as usize).filter(|_| !force) {
            let path = Path::new(&row.path);
            if crate::store::is_snapshot_branch(path) && holds_changes(path) {
                return Err(control::service::Error::Usage(format!(
                    "branch {position} ({}) holds every change made since the snapshot below it: \
                     `chronofs snapmerge` folds them in; --force removes it, hiding them",
                    row.path
                )));
            }
        }
        let t0 = std::time::Instant::now();
        let change = vfs.remove_branch(position, force, &self.recorder())?;
        record_new_view(&vfs);
        self.set_reply(&vfs, change, t0)
    }

    fn ingest_status(&self) -> Option<control::proto::IngestStatus> {
        use std::sync::atomic::Ordering::Relaxed;
        let v = self.vfs.upgrade()?;
        let p = v.ingest_progress();
        let running = p.running.load(Relaxed);
        let done = p.done.load(Relaxed);
        let complete = v.ingest_complete();
        (running || done || !complete).then(|| control::proto::IngestStatus {
            running,
            done,
            complete,
            dirs: p.dirs.load(Relaxed),
            files: p.files.load(Relaxed),
            bytes: p.bytes.load(Relaxed),
            errors: p.errors.load(Relaxed),
        })
    }
}

/// Whether branch directory `dir` holds any entry of the union (not only
/// chronofs's own: the link index).
fn holds_changes(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            name.as_encoded_bytes() != crate::union::index::INDEX_DIR.as_bytes()
        })
    })
}

/// After a branch set change the union shows objects history has no
/// version of (an inserted branch's) and lacks some it recorded: the
/// baseline walk records them in the background (with history only).
/// Directories used meanwhile are compared at once (`Vfs::node`).
fn record_new_view(vfs: &Arc<Vfs>) {
    if vfs.keeps_history() {
        if let Err(e) = vfs.start_ingest() {
            tracing::warn!("history: cannot start recording the new branch set's view: {e}");
        }
    }
}

/// A snapshot's name as given: a plain file name, since it names the
/// fresh branch's directory too; without control characters, which
/// `branch list` prints a line per branch of (a newline made two).
fn snapshot_name(name: &str) -> control::service::Result<&str> {
    let plain = !name.is_empty()
        && name.len() <= 200
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.chars().any(char::is_control);
    if plain {
        Ok(name)
    } else {
        Err(control::service::Error::Usage(format!(
            "snapshot name {name:?}: give a plain name (no '/' or control characters, at most \
             200 bytes)"
        )))
    }
}
