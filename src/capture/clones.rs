//! What history records of a clone (`vfs/clone.rs`): its name, made now,
//! with a tag that keeps its instant from retention; and the entries a
//! fill copies from the base, dated at the clone's instant, since the
//! clone held them from its start.

use super::{Capture, Result};
use crate::history::{Backdated, Binding, Dirent, Draft, ObjectId, Seq};

impl Capture {
    /// A clone of the state at `at` was made in `parent` under `entry`'s
    /// name; `tag` keeps that state while the clone may read it.
    pub fn cloned(
        &self,
        parent: ObjectId,
        (name, binding): (Vec<u8>, Binding),
        at: Seq,
        tag: &str,
    ) -> Result<()> {
        self.history.writable()?;
        let mut draft = Draft::default();
        draft.dirents.push(Dirent {
            parent,
            name,
            child: Some(binding.object),
        });
        draft.bind.push(binding);
        draft.tags.push((tag.to_owned(), Some(at)));
        self.commit(draft)
    }

    /// A clone's directory `dir` was filled with `entries`, copies of its
    /// base's as of `at`.
    pub fn filled(&self, dir: ObjectId, entries: Vec<(Vec<u8>, Binding)>, at: Seq) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.history.writable()?;
        let mut draft = Draft::default();
        for (name, binding) in entries {
            let dirent = Dirent {
                parent: dir,
                name,
                child: Some(binding.object),
            };
            draft.backdated.push(Backdated { dirent, at });
            draft.bind.push(binding);
        }
        self.commit(draft)
    }
}
