//! Dating what a union's branch change did to the view. Inserting or
//! removing a branch changes the merged listing of directories with no
//! operation through the mount; history learns the new names later, when
//! the background walk reaches them or a lookup rechecks their directory
//! (docs/ARCHITECTURE.md, "History follows the view"). Recorded then, they
//! would be missing from `.history/@T/` for every instant between the
//! change and that moment. So each change is an op of its own (its instant),
//! and an entry that the change explains is keyed at that instant instead
//! (`Op::backdated`).

use parking_lot::Mutex;

use super::{Capture, Result};
use std::collections::HashMap;

use crate::history::{Backdated, Dirent, Draft, ObjectId, Seq};

/// The branch changes of this mount, and what history compared since.
#[derive(Default)]
pub(super) struct Changes(Mutex<Dated>);

#[derive(Default)]
struct Dated {
    /// Oldest first.
    changes: Vec<Change>,
    /// Directories whose whole listing history compared with the view
    /// since the first change, with the newest sequence number then: every
    /// name it holds was confirmed as of that number (so a later
    /// difference is not the doing of a change before it — a sandbox
    /// commit's, say).
    compared: HashMap<ObjectId, Seq>,
}

#[derive(Clone, Copy, Debug)]
struct Change {
    seq: Seq,
    /// The persistent id of the branch it inserted, if it inserted one.
    added: Option<u32>,
}

/// Why an entry is recorded without an operation through the mount.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Unseen {
    /// Only the branch its object belongs to can date it: an insertion
    /// of that branch since the name was last confirmed.
    New,
    /// A recheck after a branch change: the view binds the name otherwise
    /// than history holds, or no longer at all. A removal since the name
    /// was last confirmed explains that (the first one); an insertion only
    /// explains names of the inserted branch. Otherwise the directory
    /// changed behind the mount's back, dated when seen.
    Rebound,
}

impl Capture {
    /// The union's branch set changed just now (before the new set is in
    /// force, with no operation running): records the instant, and
    /// remembers it to date what the change did. `added`: the inserted
    /// branch's persistent id.
    pub fn branch_changed(&self, added: Option<u32>) -> Result<Seq> {
        let seq = self.history.commit(Draft::default())?;
        self.changes.0.lock().changes.push(Change { seq, added });
        Ok(seq)
    }

    /// The newest sequence number before a comparison of `dir`'s whole
    /// listing with the view starts (to pass to [`Capture::compared`]).
    pub(super) fn comparing(&self) -> Option<Seq> {
        if self.changes.0.lock().changes.is_empty() {
            return None;
        }
        Some(self.history.last_seq())
    }

    /// Whether history's listing of `dir` at `at` may lack what a branch
    /// change at or before `at` did to it: no comparison of the directory
    /// with the view since that change. (History learns such names only
    /// at a recheck or when the walk gets there; a view of the past asks
    /// for a recheck first.)
    pub fn unconfirmed_at(&self, dir: ObjectId, at: Seq) -> bool {
        let dated = self.changes.0.lock();
        let Some(change) = dated.changes.iter().rev().find(|c| c.seq <= at) else {
            return false;
        };
        dated.compared.get(&dir).is_none_or(|s| *s < change.seq)
    }

    /// History now holds `dir`'s listing as the view showed it at `as_of`.
    pub(super) fn compared(&self, dir: ObjectId, as_of: Option<Seq>) {
        if let Some(seq) = as_of {
            let mut dated = self.changes.0.lock();
            let at = dated.compared.entry(dir).or_default();
            *at = (*at).max(seq);
        }
    }

    /// Puts `d` into `draft`, backdated to the branch change that explains
    /// it if one does; `branch`: the persistent id of the branch of the
    /// object the entry names.
    pub(super) fn push_unseen(
        &self,
        draft: &mut Draft,
        d: Dirent,
        branch: Option<u32>,
        why: Unseen,
    ) -> Result<()> {
        if self.changes.0.lock().changes.is_empty() {
            draft.dirents.push(d);
            return Ok(());
        }
        let last = self.history.current_dirent_seq(d.parent, &d.name)?;
        self.push_unseen_after(draft, d, branch, why, last);
        Ok(())
    }

    /// [`Capture::push_unseen`] where history's entry for the name, and
    /// the sequence number it took effect at, are known: `last`.
    pub(super) fn push_unseen_after(
        &self,
        draft: &mut Draft,
        d: Dirent,
        branch: Option<u32>,
        why: Unseen,
        last: Option<(Option<ObjectId>, Seq)>,
    ) {
        match self.explaining_change(&d, branch, why, last) {
            Some(at) => draft.backdated.push(Backdated { dirent: d, at }),
            None => draft.dirents.push(d),
        }
    }

    /// The branch change since the name was last confirmed (its entry,
    /// `last`, or a comparison of its directory) that explains `d`: the
    /// latest insertion of the branch its object is in, else (for a
    /// rebinding) the first removal.
    fn explaining_change(
        &self,
        d: &Dirent,
        branch: Option<u32>,
        why: Unseen,
        last: Option<(Option<ObjectId>, Seq)>,
    ) -> Option<Seq> {
        let dated = self.changes.0.lock();
        let compared = dated.compared.get(&d.parent).copied();
        let since = last.map(|(_, s)| s).max(compared).unwrap_or(Seq::ZERO);
        let after = |c: &&Change| c.seq > since;
        if let (Some(_), Some(b)) = (d.child, branch) {
            let mut newest_first = dated.changes.iter().rev().filter(after);
            if let Some(c) = newest_first.find(|c| c.added == Some(b)) {
                return Some(c.seq);
            }
        }
        if why == Unseen::Rebound && last.is_some() {
            let mut removals = dated.changes.iter().filter(after);
            return removals.find(|c| c.added.is_none()).map(|c| c.seq);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::capture::{retention, CaptureConfig};
    use crate::history::testkit::kit;
    use crate::history::ROOT;

    fn entry(name: &[u8], child: Option<u64>) -> Dirent {
        Dirent {
            parent: ROOT,
            name: name.to_vec(),
            child: child.map(ObjectId::new),
        }
    }

    fn dated(c: &Capture, d: Dirent, branch: Option<u32>, why: Unseen) -> Option<Seq> {
        let mut draft = Draft::default();
        c.push_unseen(&mut draft, d, branch, why).unwrap();
        draft.backdated.first().map(|b| b.at)
    }

    #[test]
    fn names_are_dated_by_the_change_that_brought_or_took_them() {
        let k = kit();
        let c = Capture::new(
            k.history.clone(),
            CaptureConfig::default(),
            Arc::new(retention::PolicyCell::default()),
        );
        let old = |n: &[u8], child| {
            c.history.commit(Draft {
                dirents: vec![entry(n, Some(child))],
                ..Draft::default()
            })
        };
        old(b"kept", 10).unwrap();
        let rebound =
            |name: &[u8], child, branch| dated(&c, entry(name, child), branch, Unseen::Rebound);
        let new = |name: &[u8], child, branch| dated(&c, entry(name, child), branch, Unseen::New);
        // No change in this mount: nothing is backdated.
        assert_eq!(new(b"x", Some(11), Some(7)), None);
        let add7 = c.branch_changed(Some(7)).unwrap();
        let removal = c.branch_changed(None).unwrap();
        let add8 = c.branch_changed(Some(8)).unwrap();
        assert_eq!(new(b"x", Some(11), Some(7)), Some(add7));
        assert_eq!(new(b"y", Some(12), Some(8)), Some(add8));
        // An object of a branch no change inserted: not explained.
        assert_eq!(new(b"z", Some(13), Some(1)), None);
        // Gone, or bound to an object of an older branch: the first
        // removal after the last record.
        assert_eq!(rebound(b"kept", None, None), Some(removal));
        assert_eq!(rebound(b"kept", Some(14), Some(1)), Some(removal));
        // Bound to an object of an inserted branch: that insertion.
        assert_eq!(rebound(b"kept", Some(16), Some(8)), Some(add8));
        // A name recorded after every change: recorded now.
        old(b"late", 15).unwrap();
        assert_eq!(rebound(b"late", None, None), None);
        // A comparison of the directory after the changes confirms every
        // name in it: a later difference is not theirs (a sandbox commit).
        let as_of = c.comparing();
        assert_eq!(as_of, Some(c.history.last_seq()));
        c.compared(ROOT, as_of);
        assert_eq!(rebound(b"kept", None, None), None);
        assert_eq!(new(b"x", Some(11), Some(7)), None);
        // An insertion explains no removal: a name gone since is dated now.
        c.branch_changed(Some(9)).unwrap();
        assert_eq!(rebound(b"kept", None, None), None);
        let removal2 = c.branch_changed(None).unwrap();
        assert_eq!(rebound(b"kept", None, None), Some(removal2));
    }
}
