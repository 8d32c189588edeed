//! Branches: the sources of directory entries and file data.
//!
//! Owns: a branch's root descriptor and its position (`BranchId`), and the
//! rule that a branch's store directory is never part of its name space.
//! Uses: `sys`. Must not know about FUSE, inode numbers or credentials.
//! Every access below the root goes through `*at()` calls on descriptors
//! held by the vfs, never by re-walking string paths.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use crate::sys;

pub mod claim;

/// Position of a branch in a mount's list (0 = top), which decides
/// precedence. Inode-map keys carry the branch's persistent id instead
/// (`store::branches`), so a position may change across remounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BranchId(pub u32);

/// A plain directory used as a branch.
pub struct DirBranch {
    id: BranchId,
    root: OwnedFd,
    /// A name in the root directory that belongs to chronofs (the store),
    /// hidden from and refused to the mount's users.
    reserved_root_name: Option<OsString>,
    /// Other such names (a union's hard-link index).
    also_reserved: Vec<OsString>,
    /// Held while mounted (`claim`); none where the directory cannot be
    /// opened for reading (then a fold elsewhere is not kept out).
    _claim: Option<claim::Claim>,
    /// The device number keys of its objects carry for its root's file
    /// system, where the store knows one (`Store::branch_idents`).
    key_dev: Option<u64>,
}

impl DirBranch {
    /// Opens `path` as a branch. The descriptor is taken before the mount
    /// is made, so SRC may even be the mount point itself.
    pub fn open(
        id: BranchId,
        path: &Path,
        reserved_root_name: Option<OsString>,
    ) -> io::Result<Self> {
        let cpath = sys::cstr(path.as_os_str())?;
        let root = sys::openat(sys::CWD, &cpath, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        let claim = claim::claim_or_warn(root.as_fd(), &path.display())?;
        Ok(DirBranch {
            id,
            root,
            reserved_root_name,
            also_reserved: Vec::new(),
            _claim: claim,
            key_dev: None,
        })
    }

    /// See [`DirBranch::key_dev`].
    pub fn set_key_dev(&mut self, dev: u64) {
        self.key_dev = Some(dev);
    }

    /// The device number keys of this branch's objects carry for its
    /// root's file system (`None`: the one it has now).
    pub fn key_dev(&self) -> Option<u64> {
        self.key_dev
    }

    pub fn id(&self) -> BranchId {
        self.id
    }

    pub fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The store's name in the root, if the store lives there.
    pub fn reserved_name(&self) -> Option<&OsStr> {
        self.reserved_root_name.as_deref()
    }

    /// Whether `name` in the branch root is chronofs's own and must stay
    /// invisible through the mount.
    pub fn is_reserved(&self, in_root: bool, name: &OsStr) -> bool {
        in_root
            && (self.reserved_root_name.as_deref() == Some(name)
                || self.also_reserved.iter().any(|r| r == name))
    }

    /// Reserves one more root name for chronofs.
    pub fn reserve(&mut self, name: &OsStr) {
        self.also_reserved.push(name.to_os_string());
    }
}
