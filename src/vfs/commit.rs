//! Applying a sandbox's branch to the mount (`chronofs sandbox commit`,
//! issue 17). The sandbox's branch lies over the mount's read-write branch
//! as a frozen branch over the one below it, so applying it is
//! `snapmerge`'s fold (renames, no data copied), done with every operation
//! that changes the tree or looks up a name held off (`Vfs::changing`'s
//! lock, exclusively), and recorded in history as one instant: a view of the past
//! shows the tree before the commit or after it, never between.
//! docs/ARCHITECTURE.md "Sandboxes".

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use super::versioning::Live;
use super::{InodeNo, Result, Vfs, VfsError};
use crate::capture::Tree;
use crate::sys;
use crate::union::commit::Into;
use crate::union::commit::{self, Changes};
use crate::union::format::XattrNs;
use crate::union::index;
use crate::union::snapmerge::MergeCount;

/// A sandbox's branch ids of the mount's branches, each with the mount's
/// own id: its union keys objects with ids of its own store.
#[derive(Debug, Default, Clone)]
pub struct SandboxIds(HashMap<u32, u32>);

impl SandboxIds {
    /// The sandbox's ids of the mount's branches (top first, as the mount
    /// lists them), and the mount's.
    pub fn new(sandbox: &[u32], mount: &[u32]) -> SandboxIds {
        SandboxIds(sandbox.iter().copied().zip(mount.iter().copied()).collect())
    }

    /// The name in the mount's hard-link index of the sandbox's entry
    /// `entry`; `None`: its object is in no branch of the mount.
    fn rekey(&self, entry: &[u8]) -> Option<Vec<u8>> {
        let entry = std::ffi::CString::new(entry).ok()?;
        let (branch, dev, ino) = index::key_of_entry(&entry)?;
        let mount = self.0.get(&branch)?;
        Some(index::entry_name(*mount, dev, ino).into_bytes())
    }
}

/// The branch a commit writes into.
struct Target {
    root: OwnedFd,
    /// The roots of the branches below it, top first (whiteouts must stay
    /// where they show something).
    under: Vec<OwnedFd>,
    ns: XattrNs,
}

impl Target {
    fn under(&self) -> Vec<BorrowedFd<'_>> {
        self.under.iter().map(|fd| fd.as_fd()).collect()
    }
}

impl Vfs {
    /// A union's top branch, which must be its read-write upper one (a
    /// commit puts the sandbox's objects where nothing hides them); a
    /// single directory's root.
    fn commit_target(&self) -> Result<Target> {
        let Some(u) = self.union() else {
            return Ok(Target {
                root: sys::reopen(self.branch.root_fd(), libc::O_PATH | libc::O_DIRECTORY)?,
                under: Vec::new(),
                ns: XattrNs::for_daemon(),
            });
        };
        let set = u.set();
        let top = set
            .members
            .first()
            .filter(|m| m.writable() && u.upper() == Some(m.id))
            .ok_or_else(|| {
                VfsError::BranchBusy(
                    "the union's top branch is read-only: a sandbox commits into a read-write \
                     top branch (chronofs branch mode MNT 0 rw, or a snapshot, makes one)"
                        .into(),
                )
            })?;
        let under = set
            .members
            .iter()
            .skip(1)
            .map(|m| sys::reopen(m.root.as_fd(), libc::O_PATH | libc::O_DIRECTORY))
            .collect::<std::io::Result<_>>()?;
        Ok(Target {
            root: sys::reopen(top.root.as_fd(), libc::O_PATH | libc::O_DIRECTORY)?,
            under,
            ns: u.ns,
        })
    }

    /// Whether `path` is the directory a commit writes into (a sandbox made
    /// over other branches must not be finished into this mount's).
    pub fn commit_target_is(&self, path: Option<&std::path::Path>) -> bool {
        let Some(path) = path else {
            return false;
        };
        let (Ok(t), Ok(p)) = (self.commit_target(), std::fs::metadata(path)) else {
            return false;
        };
        use std::os::unix::fs::MetadataExt;
        sys::fstat(t.root.as_fd()).is_ok_and(|st| st.st_dev == p.dev() && st.st_ino == p.ino())
    }

    /// What applying `upper` (a sandbox's branch) would change, and which
    /// of those changes conflict with changes made on the mount at or
    /// after `since_ns`.
    /// `ids`: the sandbox's branch ids of the mount's branches, each with
    /// the mount's id (its hard-link index entries are named with them).
    pub fn commit_changes(
        &self,
        upper: BorrowedFd<'_>,
        since_ns: u64,
        ids: &SandboxIds,
    ) -> Result<Changes> {
        let t = self.commit_target()?;
        if sys::fstat(upper)?.st_dev != sys::fstat(t.root.as_fd())?.st_dev {
            return Err(VfsError::BranchBusy(
                "the sandbox's branch (in the store) and the mount's read-write branch are on \
                 different file systems: a commit moves objects by rename"
                    .into(),
            ));
        }
        let rekey = |entry: &[u8]| ids.rekey(entry);
        let store = self.store_name();
        let into = match self.union() {
            Some(_) => Into::Union(&rekey),
            None => Into::Directory(store.as_deref(), self.root_dev_alias()?),
        };
        Ok(commit::changes(
            upper,
            t.root.as_fd(),
            (since_ns, &t.under()),
            t.ns,
            into,
        )?)
    }

    /// The store's name in the mount's root directory, if it is there.
    fn store_name(&self) -> Option<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        self.branch.reserved_name().map(|n| n.as_bytes().to_vec())
    }

    /// Before a commit of `paths` (from [`Vfs::commit_changes`]): what it
    /// replaces or removes is put in history, so that it can lose nothing.
    /// Nothing changes in the tree.
    pub fn secure_commit(&self, paths: &[Vec<u8>]) -> Result<()> {
        self.note_commit(paths, false)?;
        if let Some(c) = self.capture() {
            // Durable before the tree changes: a power cut must not lose
            // what the commit replaces.
            c.history().sync()?;
        }
        Ok(())
    }

    /// Applies `upper` (a sandbox's branch; `paths`: its changes, from
    /// [`Vfs::commit_changes`], secured by [`Vfs::secure_commit`]) to the
    /// mount, leaving `upper` empty. Interrupted (a crash), it leaves
    /// `upper` holding what it has not applied yet: running it again
    /// finishes it.
    ///
    /// `absorbed`: the renamed directories' contents were absorbed
    /// already (a resumed commit whose journal says so); else they are,
    /// and `on_absorbed` is told (it makes that durable before anything
    /// of the mount changes: a resume must not absorb again).
    ///
    /// `recheck`: the instant conflicts are weighed from, for a commit
    /// that is not forced: they are weighed again once nothing else
    /// changes the tree (under its lock), since the look that chose to
    /// apply it came before; if any appeared, nothing is applied and they
    /// are returned.
    pub fn commit_branch(
        &self,
        upper: BorrowedFd<'_>,
        (paths, ids): (&[Vec<u8>], &SandboxIds),
        (absorbed, recheck): (bool, Option<u64>),
        on_absorbed: &dyn Fn() -> std::io::Result<()>,
    ) -> Result<std::result::Result<MergeCount, Changes>> {
        let target = self.commit_target()?;
        let all = self.tree_lock().write();
        if let Some(since) = recheck {
            let now = self.commit_changes(upper, since, ids)?;
            if !now.conflicts.is_empty() {
                return Ok(Err(now));
            }
        }
        if !absorbed {
            crate::union::absorb::absorb_renamed_dirs(upper, target.root.as_fd(), target.ns)?;
            if self.union().is_none() {
                let store = self.store_name();
                let alias = self.root_dev_alias()?;
                commit::relink_linked(upper, target.root.as_fd(), (store.as_deref(), alias))?;
            }
            on_absorbed()?;
        }
        // Changes made before the commit keep their own times.
        let instant = self.capture().map(|c| c.history().one_instant());
        let rekey = |entry: &[u8]| ids.rekey(entry);
        let under = target.under();
        let merged = commit::fold(upper, target.root.as_fd(), &under, target.ns, &rekey);
        if let Some(u) = self.union() {
            // The fold may have given it a hard-link index.
            if let Some(top) = u.set().members.first() {
                u.reopen_index(top.id, false);
            }
            if let Err(e) = self.renew_set(u) {
                tracing::error!("sandbox commit: the union's inodes may show the old tree: {e}");
            }
        }
        // The kernel's names may all lead elsewhere now (after a failure
        // too): dropped before any operation sees the new tree, where the
        // kernel can.
        let dropped = self.set_changed_without_blocking();
        drop(all);
        if !dropped {
            self.set_changed();
        }
        if let Err(e) = self.note_commit(paths, true) {
            tracing::error!("history: recording a sandbox commit failed: {e}");
        }
        drop(instant);
        let count = merged?;
        tracing::info!(
            "sandbox commit: {} moved, {} directories merged, {} removals",
            count.moved,
            count.merged_dirs,
            count.whiteouts
        );
        Ok(Ok(count))
    }

    /// History of the places a commit changes: before it (`after` false)
    /// their states are secured; after it, the directories' new entries
    /// and each changed object's new state are recorded. Without history,
    /// nothing.
    fn note_commit(&self, paths: &[Vec<u8>], after: bool) -> Result<()> {
        let Some(c) = self.capture() else {
            return Ok(());
        };
        let tree = Live(self);
        let mut dirs_done = HashSet::new();
        for path in paths {
            let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
            let Some((leaf, parents)) = comps.split_last() else {
                continue;
            };
            let held = self.hold_path(parents)?;
            let dir = held.last().copied().unwrap_or(InodeNo::ROOT);
            let noted = (|| -> Result<()> {
                let leaf = match held.len() == parents.len() {
                    true => self.hold_child(dir, leaf)?,
                    false => None,
                };
                let r = (|| -> Result<()> {
                    if !after {
                        c.before_dir_change(&tree, dir.object())?;
                        if let Some(l) = leaf {
                            c.before_change(&tree, l.object())?;
                            // A directory the commit replaces goes whole.
                            self.secure_tree(l)?;
                        }
                        return Ok(());
                    }
                    if dirs_done.insert(dir) {
                        let st = sys::fstat(self.node(dir)?.fd())?;
                        c.dir_applied(&tree, dir.object(), &st)?;
                        // Merged directories took the sandbox's attributes.
                        for d in std::iter::once(InodeNo::ROOT).chain(held.iter().copied()) {
                            c.before_change(&tree, d.object())?;
                            self.attrs_changed(d);
                        }
                    }
                    if let Some(l) = leaf {
                        c.before_change(&tree, l.object())?;
                    }
                    Ok(())
                })();
                self.release_held(leaf);
                r
            })();
            for ino in held {
                self.release_held(Some(ino));
            }
            noted?;
        }
        Ok(())
    }

    /// Everything under `dir` (if a directory) put in history, as a
    /// removal of the whole tree would.
    fn secure_tree(&self, dir: InodeNo) -> Result<()> {
        let Some(c) = self.capture() else {
            return Ok(());
        };
        let node = self.node(dir)?;
        if !node.is_dir() {
            return Ok(());
        }
        let names = Live(self).list(dir.object())?;
        for (name, _) in names {
            let Some(child) = self.hold_child(dir, &name)? else {
                continue;
            };
            let r = c
                .before_change(&Live(self), child.object())
                .map_err(VfsError::from)
                .and_then(|()| self.secure_tree(child));
            self.release_held(Some(child));
            r?;
        }
        Ok(())
    }

    /// The directories `comps` name from the root, as far as they exist,
    /// each held (the caller releases them).
    pub(super) fn hold_path(&self, comps: &[&[u8]]) -> Result<Vec<InodeNo>> {
        let mut held = Vec::with_capacity(comps.len());
        let mut dir = InodeNo::ROOT;
        for name in comps {
            match self.hold_child(dir, name) {
                Ok(Some(ino)) => {
                    held.push(ino);
                    dir = ino;
                }
                Ok(None) => break,
                Err(e) => {
                    self.release_all(held);
                    return Err(e);
                }
            }
        }
        Ok(held)
    }

    /// `name` in directory `dir`, held; `None` if there is none. Found as
    /// a kernel lookup finds it (named, and compared with history), but
    /// never a name of history's own views.
    pub(super) fn hold_child(&self, dir: InodeNo, name: &[u8]) -> Result<Option<InodeNo>> {
        let node = self.node(dir)?;
        self.recheck_if_marked(&node);
        let entry = match self.lookup_in(&node, OsStr::from_bytes(name)) {
            Ok(e) => e,
            Err(e) if e.errno_is(libc::ENOENT) || e.errno_is(libc::ENOTDIR) => return Ok(None),
            Err(e) => return Err(e),
        };
        if let (Some(c), Ok(inode)) = (self.capture(), self.inodes.get(entry.attr.ino)) {
            inode.set_name(dir, name);
            let first = inode.first_sight();
            if let Err(e) = c.looked_up(&Live(self), entry.attr.ino.object(), &entry.attr.st, first)
            {
                tracing::error!("history: recording an external change failed: {e}");
            }
        }
        Ok(Some(entry.attr.ino))
    }
}
