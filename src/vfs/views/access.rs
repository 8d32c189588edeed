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

use super::{past_err, State, ViewNode, What};
use crate::history::access::{self, Now, Perms, Who};
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
        let shown = |acl| Perms {
            mode: node.st.st_mode,
            uid: node.st.st_uid,
            gid: node.st.st_gid,
            acl,
        };
        let mut now = self.with_past(|p| p.now_of(*obj).map_err(past_err))?;
        let then = match state {
            State::Hist { v } => Perms::of_version(v),
            State::Live { inode } => {
                // Unchanged since the instant: as the attributes the kernel
                // was shown, with the ACL it has now.
                let fd = self.inodes.fd(inode)?;
                let live = Perms::of_live(fd.as_fd(), &sys::fstat(fd.as_fd())?)?;
                let then = shown(live.acl.clone());
                // Never recorded: history knows no way to it, but the
                // object itself is at hand.
                now.get_or_insert(Now {
                    perms: live,
                    dirs: Vec::new(),
                });
                then
            }
        };
        let who = Who::new(caller.uid, caller.gid, caller.pid);
        if access::may(&who, &then, now.as_ref(), want) {
            return Ok(());
        }
        tracing::debug!(
            "history view: object {obj} is not readable by uid {} as it is now",
            caller.uid
        );
        Err(errno(libc::EACCES))
    }
}
