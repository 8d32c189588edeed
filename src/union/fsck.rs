//! fsck of a union's branches: what a crash or another tool can leave
//! that a lookup must not meet, and its repair.
//!
//! Found, in every branch: copy-up temporaries (`.chronofs-copyup.*`, a
//! crash between making a copy and renaming it into place; a create over
//! a whiteout makes its object under such a name too, and a directory's
//! exchange leaves the whiteout under it until it is removed) and whiteout
//! temporaries (`.chronofs-wh.*`, a crash inside `replace_with_whiteout`);
//! in read-write branches, a directory whose `overlay.redirect` names a
//! directory no branch below holds (the lookups it was for find nothing).
//! In every branch, overlayfs metacopy files (their data elsewhere: a
//! chronofs mount refuses to open them; not repairable here).
//! A whiteout with nothing below it is harmless and not reported; an
//! object and a whiteout of one name cannot share a directory. Repairs
//! happen only in read-write branches, and in read-only ones a snapshot
//! froze (a snapmerge writes those: their temporaries only): temporaries are removed (none is
//! ever a name a user made: readers hide them), a dangling redirect is
//! dropped (the directory then shows exactly what it showed). Run it on
//! unmounted branches: a copy-up in progress has a temporary too.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{copyup, format};
use crate::sys;

/// What is wrong with one entry of a branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    CopyupTemporary,
    WhiteoutTemporary,
    DanglingRedirect,
    /// An overlayfs metacopy file: its data is in a lower layer, which a
    /// chronofs mount does not follow (it refuses to open it). Nothing
    /// here can repair it: overlayfs (`metacopy=on`) copies the data up
    /// at an open for writing.
    Metacopy,
}

impl Kind {
    pub fn describe(self) -> &'static str {
        match self {
            Kind::CopyupTemporary => "copy-up temporary left by a crash",
            Kind::WhiteoutTemporary => "whiteout temporary left by a crash",
            Kind::DanglingRedirect => "directory redirect pointing nowhere",
            Kind::Metacopy => {
                "overlayfs metacopy file, its data in a lower layer: chronofs refuses to open it (EIO); open it for writing once under overlayfs with metacopy=on to copy its data up"
            }
        }
    }
}

/// One finding: the branch (0 = top), the path in it, and whether it was
/// repaired.
#[derive(Clone, Debug)]
pub struct Finding {
    pub branch: usize,
    pub path: PathBuf,
    pub kind: Kind,
    pub repaired: bool,
}

/// A branch to check: its root and whether it may be changed.
pub struct Branch {
    pub root: OwnedFd,
    pub writable: bool,
    /// Read-only in the union, but frozen by one of its snapshots: the
    /// mount's snapmerge writes there, so a crash can leave its
    /// temporaries there, which a repair removes (nothing else).
    pub frozen: bool,
}

/// Checks every branch (top first); with `repair`, fixes what is found in
/// read-write branches. `skip` is a name in the top read-write branch's
/// root not to descend into (the store).
pub fn check(
    branches: &[Branch],
    ns: format::XattrNs,
    repair: bool,
    skip: Option<&OsStr>,
) -> io::Result<Vec<Finding>> {
    let mut out = Vec::new();
    for (i, b) in branches.iter().enumerate() {
        let walk = Walk {
            branches,
            index: i,
            ns,
            repair: repair && b.writable,
            remove_temporaries: repair && (b.writable || b.frozen),
            skip,
        };
        walk.dir(b.root.as_fd(), (Path::new(""), Path::new("")), &mut out)?;
    }
    Ok(out)
}

struct Walk<'a> {
    branches: &'a [Branch],
    index: usize,
    ns: format::XattrNs,
    repair: bool,
    remove_temporaries: bool,
    skip: Option<&'a OsStr>,
}

impl Walk<'_> {
    /// Checks directory `dir`, at `rel` in its branch and at `lower` in
    /// the branches below (where the redirects of its parents lead).
    fn dir(
        &self,
        dir: BorrowedFd<'_>,
        (rel, lower): (&Path, &Path),
        out: &mut Vec<Finding>,
    ) -> io::Result<()> {
        let readable = sys::openat(
            dir,
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        let mut buf = sys::DirBuf::new(64 * 1024);
        let mut names = Vec::new();
        loop {
            let batch = sys::getdents(readable.as_fd(), &mut buf)?;
            if batch.is_empty() {
                break;
            }
            names.extend(batch.into_iter().filter(|e| !format::is_dot(&e.name)));
        }
        for e in names {
            let name = OsStr::from_bytes(&e.name);
            if rel.as_os_str().is_empty() && Some(name) == self.skip {
                continue;
            }
            let path = rel.join(name);
            let cname = CString::new(e.name.clone()).map_err(|_| errno(libc::EINVAL))?;
            let kind = if copyup::is_copyup_temp(&e.name) {
                Some(Kind::CopyupTemporary)
            } else if format::is_temporary(&e.name) {
                Some(Kind::WhiteoutTemporary)
            } else {
                None
            };
            if let Some(kind) = kind {
                let repaired =
                    self.remove_temporaries && super::snapmerge::remove_tree(dir, &cname).is_ok();
                out.push(self.finding(path, kind, repaired));
                continue;
            }
            let st = sys::fstatat(dir, &cname)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                let fd = sys::open_path(dir, &cname)?;
                if format::is_metacopy(fd.as_fd(), self.ns)? {
                    out.push(self.finding(path, Kind::Metacopy, false));
                }
                continue;
            }
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                continue;
            }
            let sub = sys::open_path(dir, &cname)?;
            let below = match format::redirect(sub.as_fd(), self.ns)? {
                // An absolute redirect names a path from the root; a
                // relative one (overlayfs's, for a rename within one
                // directory) a name beside the parent's lower copy.
                Some(origin) => match origin.strip_prefix(b"/") {
                    Some(abs) => PathBuf::from(OsStr::from_bytes(abs)),
                    None => lower.join(OsStr::from_bytes(&origin)),
                },
                None => lower.join(name),
            };
            if let Some(finding) = self.redirect(sub.as_fd(), &below, &path)? {
                out.push(finding);
            }
            self.dir(sub.as_fd(), (&path, &below), out)?;
        }
        Ok(())
    }

    fn finding(&self, path: PathBuf, kind: Kind, repaired: bool) -> Finding {
        Finding {
            branch: self.index,
            path,
            kind,
            repaired,
        }
    }

    /// A directory's redirect (to `target` in the branches below) that no
    /// lower branch resolves.
    fn redirect(
        &self,
        fd: BorrowedFd<'_>,
        target: &Path,
        path: &Path,
    ) -> io::Result<Option<Finding>> {
        if !self.branches[self.index].writable || format::redirect(fd, self.ns)?.is_none() {
            return Ok(None);
        }
        for lower in &self.branches[self.index + 1..] {
            if resolves(lower.root.as_fd(), target) {
                return Ok(None);
            }
        }
        let repaired = self.repair && sys::removexattr_fd(fd, self.ns.redirect()).is_ok();
        Ok(Some(self.finding(
            path.to_path_buf(),
            Kind::DanglingRedirect,
            repaired,
        )))
    }
}

/// Whether `rel` is a directory under `root` (no symlink followed), as
/// the mount looks a redirect's target up in a branch (a sandbox commit
/// keeps a redirect only where this finds it, so the two agree).
pub(super) fn resolves(root: BorrowedFd<'_>, rel: &Path) -> bool {
    let Ok(crel) = CString::new(rel.as_os_str().as_bytes()) else {
        return false;
    };
    if crel.as_bytes().is_empty() {
        return true;
    }
    let how = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    sys::openat(root, &crel, how, 0).is_ok()
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}
