//! Renamed directories in a union: where a directory's lower copies are
//! once it moved (overlayfs's `redirect_dir` xattr, in both of its forms),
//! followed branch by branch on lookup and written before a move.
//! docs/ARCHITECTURE.md "Union mounts".

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::inodes::{Layer, Node};
use super::union::{is_absent, is_dir, Member};
use super::{errno, InodeNo, Result, Vfs, VfsError};
use crate::branch::BranchId;
use crate::sys;
use crate::union::format;

/// Where a renamed directory's lower copies are, in the branches below:
/// the two forms overlayfs writes in its redirect xattr.
enum Redirect {
    /// An absolute path, from each branch's root (without the leading '/').
    FromRoot(Vec<u8>),
    /// A name in the same parent directory's copy in each branch.
    InParent(Vec<u8>),
}

impl Redirect {
    fn parse(origin: &[u8]) -> Redirect {
        match origin.strip_prefix(b"/") {
            Some(abs) => Redirect::FromRoot(abs.to_vec()),
            None => Redirect::InParent(origin.to_vec()),
        }
    }

    /// Where the search goes on once a copy found here says it was renamed
    /// from `further` itself.
    fn then(&self, further: &[u8]) -> Redirect {
        match (Redirect::parse(further), self) {
            (Redirect::InParent(name), Redirect::FromRoot(path)) => {
                let mut dir = match path.iter().rposition(|b| *b == b'/') {
                    Some(cut) => path[..=cut].to_vec(),
                    None => Vec::new(),
                };
                dir.extend_from_slice(&name);
                Redirect::FromRoot(dir)
            }
            (next, _) => next,
        }
    }
}

/// Where a redirect's walk to its last component's directory got
/// (`Vfs::redirect_parent`).
enum Walked {
    /// The directory, the last component, and whether an opaque directory
    /// on the way ends the search after this branch.
    Dir(Arc<OwnedFd>, Vec<u8>, bool),
    /// Not in this branch: the search goes on below.
    Absent,
    /// A whiteout or a non-directory on the way: nothing below shows.
    Ends,
}

impl Vfs {
    /// The lower copies of a directory whose redirect says it came from
    /// `origin` (an absolute path in the lower branches, or a name in the
    /// same parent, as overlayfs writes them), below branch `above`.
    /// Branch by branch, as overlayfs looks them up: a copy that was itself
    /// renamed sends the search on to where it came from (`mv a b`, a
    /// snapshot, `mv b c`: `c` says `/b`, and `b` says `/a`); a whiteout or
    /// a non-directory there ends it, as an opaque copy does.
    pub(super) fn redirected_lowers(
        &self,
        above: BranchId,
        parent: &[Layer],
        origin: &[u8],
    ) -> Result<Vec<Layer>> {
        let u = self.union.as_ref().ok_or(VfsError::WrongKind)?;
        let set = u.set();
        let mut at = Redirect::parse(origin);
        let mut out = Vec::new();
        for member in &set.members {
            if set.rank(member.id) <= set.rank(above) {
                continue;
            }
            let (base, rel, opaque_above) = match &at {
                Redirect::FromRoot(path) => {
                    let (walked, rest) = self.redirect_parent(above, member, path)?;
                    // What this branch's renamed directories say holds for
                    // every branch below, found here or not.
                    if let Some(rest) = rest {
                        at = Redirect::FromRoot(rest);
                    }
                    match walked {
                        Walked::Dir(fd, last, opaque) => (fd, last, opaque),
                        Walked::Absent => continue,
                        Walked::Ends => break,
                    }
                }
                Redirect::InParent(name) => match parent.iter().find(|l| l.branch == member.id) {
                    Some(l) => (l.fd.clone(), name.clone(), false),
                    None => continue,
                },
            };
            let crel = sys::cstr(OsStr::from_bytes(&rel))?;
            let fd = match sys::openat(base.as_fd(), &crel, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Ok(fd) => fd,
                Err(e) if is_absent(&e) => continue,
                Err(e) => return Err(e.into()),
            };
            let st = sys::fstat(fd.as_fd())?;
            if format::is_whiteout(&st) && u.folded_whiteout(above, member.id) {
                continue;
            }
            if !is_dir(&st) {
                break;
            }
            let opaque = format::is_opaque(fd.as_fd(), u.ns).unwrap_or(false);
            let further = match opaque {
                true => None,
                false => format::redirect(fd.as_fd(), u.ns)?,
            };
            out.push(Layer {
                branch: member.id,
                fd: Arc::new(fd),
            });
            if opaque || opaque_above {
                break;
            }
            if let Some(further) = further {
                at = at.then(&further);
            }
        }
        Ok(out)
    }

    /// The directory of `member` that holds the last component of the
    /// absolute redirect `path`, walked component by component as
    /// overlayfs walks it: a whiteout or a non-directory on the way ends
    /// the search (the path shows nothing below there), an opaque
    /// directory on the way lets this branch's copy count and ends it
    /// after (returned as `true`). A whiteout a snapmerge folded is as
    /// absent. A directory on the way that was renamed in its time (its
    /// own redirect) sends the branches below on to where it came from:
    /// the second value is then the path they walk instead (`mv a x`, a
    /// snapshot, `mv x/sub y`: `y` says `/x/sub`, and `x` says `/a`).
    fn redirect_parent(
        &self,
        above: BranchId,
        member: &Member,
        path: &[u8],
    ) -> Result<(Walked, Option<Vec<u8>>)> {
        let u = self.union.as_ref().ok_or(VfsError::WrongKind)?;
        let parts: Vec<&[u8]> = path
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        let Some((last, dirs)) = parts.split_last() else {
            return Ok((Walked::Absent, None));
        };
        let mut fd = member.root.clone();
        let mut opaque = false;
        // The path the branches below walk, as far as this walk got.
        let mut below: Vec<Vec<u8>> = Vec::new();
        let mut renamed = false;
        let then = |below: &[Vec<u8>], renamed: bool, rest: &[&[u8]]| -> Option<Vec<u8>> {
            renamed.then(|| {
                let all: Vec<&[u8]> = below
                    .iter()
                    .map(Vec::as_slice)
                    .chain(rest.iter().copied())
                    .collect();
                all.join(&b'/')
            })
        };
        for (i, part) in dirs.iter().enumerate() {
            let name = sys::cstr(OsStr::from_bytes(part))?;
            let rest = &parts[i..];
            let st = match sys::fstatat(fd.as_fd(), &name) {
                Ok(st) => st,
                Err(e) if is_absent(&e) => {
                    return Ok((Walked::Absent, then(&below, renamed, rest)))
                }
                Err(e) => return Err(e.into()),
            };
            if format::is_whiteout_in(fd.as_fd(), &name, &st, u.ns)? {
                return Ok(match u.folded_whiteout(above, member.id) {
                    true => (Walked::Absent, then(&below, renamed, rest)),
                    false => (Walked::Ends, None),
                });
            }
            if !is_dir(&st) {
                return Ok((Walked::Ends, None));
            }
            let next = sys::openat(fd.as_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
            opaque |= format::is_opaque(next.as_fd(), u.ns).unwrap_or(false);
            let origin = match opaque || u.is_bottom(member.id) {
                true => None,
                false => format::redirect(next.as_fd(), u.ns)?,
            };
            match origin.as_deref().map(Redirect::parse) {
                Some(Redirect::FromRoot(p)) => {
                    below = p
                        .split(|b| *b == b'/')
                        .filter(|c| !c.is_empty())
                        .map(<[u8]>::to_vec)
                        .collect();
                    renamed = true;
                }
                Some(Redirect::InParent(n)) => {
                    below.push(n);
                    renamed = true;
                }
                None => below.push(part.to_vec()),
            }
            fd = Arc::new(next);
        }
        let rest = then(&below, renamed, &[last]);
        Ok((Walked::Dir(fd, last.to_vec(), opaque), rest))
    }

    /// Before a directory with lower copies moves: its upper copy made,
    /// and marked with where the lower copies are (overlayfs's
    /// `redirect_dir`), so nothing below it is copied.
    pub(super) fn prepare_dir_move(&self, caller: &super::Caller, moved: InodeNo) -> Result<()> {
        let u = self.union.as_ref().ok_or(VfsError::WrongKind)?;
        let node = self.node(moved)?;
        if !node.has_layers() && u.upper() == Some(self.inodes.branch_of(&node.key)) {
            return Ok(());
        }
        let origin = self.origin_of(&node)?;
        let upper = self.writable_dir(caller, moved)?;
        if format::redirect(upper.fd(), u.ns)?.is_none() {
            format::set_redirect(upper.fd(), u.ns, &origin)?;
        }
        Ok(())
    }

    /// Where a directory's lower copies are, as overlayfs writes it: its
    /// path in the union below the upper branch. That is the names the
    /// kernel reached it by, from the nearest ancestor whose upper copy
    /// was itself renamed on (that one's redirect). The path of its
    /// topmost lower copy in that copy's branch was not it: after `mv a
    /// x`, a snapshot, and `mv x/sub y`, `/a/sub` met the frozen
    /// branch's whiteout of `a`, and `y` showed nothing from then on.
    fn origin_of(&self, node: &Node) -> Result<Vec<u8>> {
        let u = self.union.as_ref().ok_or(VfsError::WrongKind)?;
        let upper = u.upper().ok_or(errno(libc::EROFS))?;
        let (mut parent, name) = node.name().ok_or(errno(libc::ESTALE))?;
        let mut names = vec![name];
        let mut prefix: Vec<u8> = Vec::new();
        while parent != InodeNo::ROOT {
            let dir = self.node(parent)?;
            let copy = match self.inodes.branch_of(&dir.key) == upper {
                true => Some(dir.fd_arc()),
                false => self
                    .layers_of(&dir)?
                    .into_iter()
                    .find(|l| l.branch == upper)
                    .map(|l| l.fd),
            };
            // The name first: a rename of this directory writes its
            // redirect before it renames it.
            let (grand, dir_name) = dir.name().ok_or(errno(libc::ESTALE))?;
            let origin = match copy {
                Some(fd) => format::redirect(fd.as_fd(), u.ns)?,
                None => None,
            };
            match origin.as_deref().map(Redirect::parse) {
                Some(Redirect::FromRoot(path)) => {
                    prefix = path;
                    break;
                }
                Some(Redirect::InParent(renamed)) => names.push(renamed),
                None => names.push(dir_name),
            }
            parent = grand;
        }
        let mut path = b"/".to_vec();
        for part in std::iter::once(prefix).chain(names.into_iter().rev()) {
            if part.is_empty() {
                continue;
            }
            if path.len() > 1 {
                path.push(b'/');
            }
            path.extend_from_slice(&part);
        }
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::Redirect;

    fn path(r: Redirect) -> (bool, Vec<u8>) {
        match r {
            Redirect::FromRoot(p) => (true, p),
            Redirect::InParent(n) => (false, n),
        }
    }

    #[test]
    fn a_chain_of_redirects_is_followed_in_both_forms() {
        let abs = Redirect::parse(b"/x/b");
        assert_eq!(path(abs.then(b"/a")), (true, b"a".to_vec()));
        assert_eq!(path(abs.then(b"a")), (true, b"x/a".to_vec()));
        let top = Redirect::parse(b"/b");
        assert_eq!(path(top.then(b"a")), (true, b"a".to_vec()));
        let rel = Redirect::parse(b"b");
        assert_eq!(path(rel.then(b"a")), (false, b"a".to_vec()));
        assert_eq!(path(rel.then(b"/y/a")), (true, b"y/a".to_vec()));
    }
}
