//! Union mounts: a node resolves through a stack of sources (branches
//! today; past views and clones later). See docs/ARCHITECTURE.md, "Union
//! mounts".
//!
//! Owns: the branch list a mount is made of (`spec`), the on-disk formats
//! shared with kernel overlayfs (`format`: whiteouts, opaque directories,
//! redirects), the merge of several directories' listings into one with
//! stable offsets (`merge`), and copying an object from a read-only branch
//! into a read-write one without ever showing a partial file (`copyup`),
//! the index that keeps a copied-up hard link one file (`index`), and
//! checks and repairs of those invariants in the branches (`fsck`), and
//! folding a frozen branch into the one below it (`snapmerge`), giving a
//! renamed directory what the branch below holds at its origin first
//! (`absorb`), and what
//! folding a sandbox's branch into a mount's would change (`commit`).
//! Uses: `branch`, `store`, `sys`. Must not know about FUSE, inode numbers
//! or history.

pub mod absorb;
pub mod commit;
pub mod copyup;
pub mod format;
pub mod fsck;
pub mod index;
pub mod merge;
pub mod snapmerge;
pub mod spec;

use std::io;

/// Errors of union operations; each maps to one errno.
#[derive(Debug, thiserror::Error)]
pub enum UnionError {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A change needs a read-write branch and the mount has none.
    #[error("no read-write branch holds or can take this change")]
    ReadOnly,
    /// A branch holds what a snapshot merge cannot fold down yet.
    #[error("{0}")]
    Unmergeable(String),
}

impl UnionError {
    /// No wildcard arm: a new variant must choose its errno here.
    pub fn errno(&self) -> i32 {
        match self {
            UnionError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            UnionError::ReadOnly => libc::EROFS,
            UnionError::Unmergeable(_) => libc::EOPNOTSUPP,
        }
    }
}

pub type Result<T> = std::result::Result<T, UnionError>;
