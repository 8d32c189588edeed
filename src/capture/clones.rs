//! What history records of a clone (`vfs/clone.rs`): a tag that keeps its
//! instant from retention, before the clone appears; its name, made now;
//! and the entries a
//! fill copies from the base, dated at the clone's instant, since the
//! clone held them from its start.

use super::{Capture, Result};
use crate::history::{Backdated, Binding, Dirent, Draft, ObjectId, Seq};

impl Capture {
    /// Keeps the state at `at` while a clone about to be made may read
    /// it (durable before the clone appears).
    pub fn pin_for_clone(&self, tag: &str, at: Seq) -> Result<()> {
        self.history.writable()?;
        let mut draft = Draft::default();
        draft.tags.push((tag.to_owned(), Some(at)));
        self.commit(draft)?;
        // A power cut must not keep the clone and lose the pin.
        Ok(self.history.sync()?)
    }

    /// The clone `tag` was pinned for was not made after all.
    pub fn unpin_clone(&self, tag: &str) -> Result<()> {
        let mut draft = Draft::default();
        draft.tags.push((tag.to_owned(), None));
        self.commit(draft)
    }

    /// A clone was made in `parent` under `entry`'s name.
    pub fn cloned(&self, parent: ObjectId, (name, binding): (Vec<u8>, Binding)) -> Result<()> {
        self.history.writable()?;
        let mut draft = Draft::default();
        draft.dirents.push(Dirent {
            parent,
            name,
            child: Some(binding.object),
        });
        draft.bind.push(binding);
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
