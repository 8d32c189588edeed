//! The "as it is now" half of who may read the past (history::access).
//!
//! The kernel checks every access to a view against the attributes the
//! view shows (`default_permissions`), which are the object's as they
//! were. It cannot know the object's state now (nor the directories on
//! its way now), and it caches view entries for a day whoever looked them
//! up first, so the daemon checks the object as it is now at each open of
//! a view file or directory: every open(2) reaches it, whatever the
//! kernel cached.

use std::os::fd::AsFd;

use std::time::Duration;

use super::{past_err, State, ViewNode, What, IMMUTABLE_TTL, VIEW_BIT};
use crate::history::access::{self, Now, Perms, Who, Whom, SEARCH};
use crate::history::past::Past;
use crate::history::{ObjectId, Seq};
use crate::sys;
use crate::vfs::{errno, Caller, Result, Vfs};

impl Vfs {
    /// Whether `caller` may `want` (`access::READ`) the view `node`, both
    /// as shown and as its object is now; EACCES if not.
    pub(super) fn view_permits(&self, caller: &Caller, node: &ViewNode, want: u32) -> Result<()> {
        if caller.uid == 0 {
            return Ok(());
        }
        let What::At { obj, state, .. } = &node.what else {
            // `.history` and `;deleted` listings show names only, with
            // modes derived from the live root and directory.
            return Ok(());
        };
        let then = self.then_perms(node, state)?;
        let who = Who::new(caller.uid, caller.gid, caller.pid);
        let permitted = self.with_past(|p| {
            // The way then is checked here whatever the kernel searched:
            // it searched the directories of `.history/@T/` as they were,
            // but of `d;@T/f` or `;deleted/d/f` only those from `d` down
            // (above them, the live ones), and a node's inode is shared by
            // every name that reaches it, so how the first caller came
            // says nothing of how this one did.
            let (at, gone) = node.version_at();
            if !p
                .way_then_permits(&who, *obj, (at, gone))
                .map_err(past_err)?
            {
                return Ok(false);
            }
            let now = self.now_of_view(p, node, 0)?;
            Ok(now.is_some() && access::may(&who, &then, now.as_ref(), want))
        })?;
        if permitted {
            return Ok(());
        }
        tracing::debug!(
            "history view: object {obj} is not readable by uid {} as it is now",
            caller.uid
        );
        Err(errno(libc::EACCES))
    }

    /// The permissions the kernel checks `node` (in `state`) against.
    fn then_perms(&self, node: &ViewNode, state: &State) -> Result<Perms> {
        Ok(match state {
            State::Hist { v } => Perms::of_version(v),
            State::Live { inode } => {
                // Unchanged since the instant: as the attributes the kernel
                // was shown, with the ACL it has now.
                let fd = self.inodes.fd(inode)?;
                Perms {
                    mode: node.st.st_mode,
                    uid: node.st.st_uid,
                    gid: node.st.st_gid,
                    acl: Perms::of_live(fd.as_fd(), &sys::fstat(fd.as_fd())?)?.acl,
                }
            }
        })
    }

    /// Whether `caller` may look names up in the view directory `node`
    /// (EACCES if not), and how long the kernel may keep what they find.
    /// A lookup needs search on the directory as it was (the kernel
    /// checked that), on its way then, and on it and its way as they are
    /// now: natively, `chmod 700 d` hides the names and attributes in `d`
    /// (stat(2) of `d/x` is EACCES, whether `x` exists or not). The
    /// kernel shares a cached entry among callers without asking again,
    /// so an entry is kept for the mount's entry timeout (how late a
    /// change now may be seen, as for live entries) only where every
    /// caller would pass; elsewhere each lookup is asked.
    pub(super) fn view_search(&self, caller: &Caller, node: &ViewNode) -> Result<Duration> {
        let What::At { obj, state, .. } = &node.what else {
            return Ok(self.cfg.entry_timeout);
        };
        let then = self.then_perms(node, state)?;
        let who = Who::new(caller.uid, caller.gid, caller.pid);
        let (open, permitted) = self.with_past(|p| {
            let now = self.now_of_view(p, node, 0)?;
            let Some(now) = now else {
                return Ok((false, caller.uid == 0));
            };
            let way_then = node.version_at();
            let passes = |whom: Whom<'_>| -> Result<bool> {
                let here = [&then, &now.perms].into_iter().chain(&now.dirs);
                Ok(here.into_iter().all(|d| whom.has(d, SEARCH))
                    && p.way_then_open(whom, *obj, way_then).map_err(past_err)?)
            };
            if passes(Whom::Anyone)? {
                return Ok((true, true));
            }
            Ok((false, caller.uid == 0 || passes(Whom::One(&who))?))
        })?;
        if !permitted {
            tracing::debug!(
                "history view: object {obj} is not searchable by uid {} then and now",
                caller.uid
            );
            return Err(errno(libc::EACCES));
        }
        Ok(if open {
            self.cfg.entry_timeout
        } else {
            Duration::ZERO
        })
    }

    /// How long the kernel may keep the entry of a deleted object found
    /// in live directory `dir`, removed at `removed`: as long as usual
    /// where anyone could have listed `dir` then (its now is the live
    /// `;deleted` directory's, which the kernel checks itself), never
    /// otherwise (`deleted_shown` decides for each caller).
    pub(super) fn deleted_ttl(&self, p: &Past, dir: ObjectId, removed: Seq) -> Result<Duration> {
        let open = p
            .listable_then(Whom::Anyone, dir, removed.prev())
            .map_err(past_err)?;
        Ok(if open { IMMUTABLE_TTL } else { Duration::ZERO })
    }

    /// `node`'s object as it is now: as history knows it, or for an object
    /// it knows no way to (never recorded by name: unchanged where it
    /// was), as the view directory it was found in is now. `None`: not to
    /// be read (no way known at all).
    fn now_of_view(&self, p: &Past, node: &ViewNode, hops: usize) -> Result<Option<Now>> {
        let What::At { obj, state, .. } = &node.what else {
            return Ok(None);
        };
        if let Some(now) = p.now_of(*obj).map_err(past_err)? {
            return Ok(Some(now));
        }
        let perms = match state {
            State::Hist { v } => Perms::of_version(v),
            State::Live { inode } => {
                let fd = self.inodes.fd(inode)?;
                Perms::of_live(fd.as_fd(), &sys::fstat(fd.as_fd())?)?
            }
        };
        let Some(parent) = node.names.lock().first().map(|(p, _)| *p) else {
            return Ok(None);
        };
        if parent.0 & VIEW_BIT == 0 {
            // A name in a live directory: the kernel searched its way now.
            return Ok(Some(Now {
                perms,
                dirs: Vec::new(),
            }));
        }
        if hops > 4096 {
            return Err(errno(libc::ELOOP));
        }
        let Some(above) = self.now_of_view(p, &*self.view(parent)?, hops + 1)? else {
            return Ok(None);
        };
        let mut dirs = above.dirs;
        dirs.push(above.perms);
        Ok(Some(Now { perms, dirs }))
    }
}
