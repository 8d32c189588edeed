//! When history removes versions (prune, purge, retention), what the
//! kernel caches of views must go: view nodes are checked against
//! history after a removal, and the names the kernel holds are listed for
//! the FUSE adapter to invalidate.

use super::*;

impl Vfs {
    /// Fails with ENOENT if history removed (pruned, purged) the version
    /// the node shows since it was made: the kernel may still cache it.
    pub(super) fn current(&self, node: &ViewNode) -> Result<()> {
        let Ok(history) = self.history() else {
            return Ok(());
        };
        let epoch = history.removal_epoch();
        if node.checked.load(Ordering::Acquire) == epoch {
            return Ok(());
        }
        if let What::At {
            at,
            obj,
            state: State::Hist { v },
        } = &node.what
        {
            let now = history.object_at(*obj, *at)?;
            if !now.is_some_and(|(_, n)| n == **v) {
                return enoent(format_args!(
                    "object {obj} at {at} was removed from history"
                ));
            }
        }
        node.checked.store(epoch, Ordering::Release);
        Ok(())
    }

    /// Remembers that the kernel knows view node `ino` as `name` in
    /// `parent`.
    pub(in crate::vfs) fn note_view_name(&self, parent: InodeNo, name: &OsStr, ino: InodeNo) {
        if let Some(n) = self.views.nodes.read().get(&ino) {
            let mut names = n.names.lock();
            let name = name.as_bytes();
            if !names.iter().any(|(p, m)| *p == parent && m == name) {
                names.push((parent, name.to_vec()));
            }
        }
    }

    /// Every (parent, name, node) the kernel may cache for a view.
    pub fn view_names(&self) -> Vec<(InodeNo, Vec<u8>, InodeNo)> {
        let nodes = self.views.nodes.read();
        let mut out = Vec::new();
        for (ino, n) in nodes.iter() {
            for (parent, name) in n.names.lock().iter() {
                out.push((*parent, name.clone(), *ino));
            }
        }
        out
    }

    /// Runs `hook` after history removed versions (see `view_names`).
    pub fn on_history_removal(&self, hook: Box<dyn Fn() + Send + Sync>) {
        if let Ok(h) = self.history() {
            h.on_removal(hook);
        }
    }

    /// A tag was made: a lookup of `.history/@NAME` just before left the
    /// kernel caching it as absent (for the negative timeout), which it
    /// must forget.
    pub fn tag_made(&self, name: &str) {
        let mut entry = b"@".to_vec();
        entry.extend_from_slice(name.as_bytes());
        self.name_made(TOP, &entry);
    }
}
