//! Giving a directory renamed in an upper branch what the branch below it
//! holds where the directory came from, so that the fold (`snapmerge`,
//! a sandbox `commit`) can move it down whole.
//!
//! A renamed directory carries an overlay redirect to where its lower
//! copies are. The fold cannot move those from under another name, so the
//! renamed directory is first given, as hard links, every entry the lower
//! branch holds at its origin that it lacks (directories it lacks are made,
//! filled and given the lower copy's attributes under a hidden temporary
//! name, then renamed into place). Then it moves down whole, and the
//! whiteout the rename left at the old name removes the lower copy.
//!
//! Every step keeps what the union shows: each linked entry was shown
//! already (through the redirect) and stays the same object. Where the
//! lower copy hid what lies below it (opaque), the renamed directory is
//! made opaque once it holds everything. Where the lower copy was itself
//! renamed, the renamed directory must point where that one pointed once
//! it lies in the lower branch; that is returned ([`Renamed::then`]) for
//! the fold to apply as it moves it, since applying it earlier would show
//! a different directory meanwhile.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::format::{self, XattrNs};
use super::{copyup, index, Result};
use crate::sys::{self, Stat};

/// Told of each object the upper branch now shows that the union showed
/// from the lower branch until then: (lower object, upper object), before
/// the upper one can be found.
pub type Linked<'l> = dyn FnMut(&Stat, &Stat) + 'l;

/// A directory carrying a redirect: its path from the branch root (as
/// components) and the redirect's value.
pub type Redirected = (Vec<Vec<u8>>, Vec<u8>);

/// One directory renamed in the upper branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renamed {
    /// Where it is, from the upper branch's root.
    pub path: Vec<Vec<u8>>,
    /// What its redirect must say once it lies in the lower branch, where
    /// the lower copy it absorbed was renamed too (an absolute path).
    pub then: Option<Vec<u8>>,
}

/// The directories under `root` carrying a redirect, each with it, parents
/// before their children (the hard-link index aside).
pub fn find_renamed(root: BorrowedFd<'_>, ns: XattrNs) -> Result<Vec<Redirected>> {
    let mut out = Vec::new();
    let dir = sys::reopen_dir(root, libc::O_RDONLY)?;
    find_under(dir.as_fd(), Vec::new(), ns, &mut out)?;
    Ok(out)
}

fn find_under(
    dir: BorrowedFd<'_>,
    path: Vec<Vec<u8>>,
    ns: XattrNs,
    out: &mut Vec<Redirected>,
) -> Result<()> {
    for e in format::entries(dir)? {
        let c = cname(&e.name)?;
        let st = sys::fstatat(dir, &c)?;
        if !is_dir(&st) || (path.is_empty() && e.name == index::INDEX_DIR.as_bytes()) {
            continue;
        }
        let mut child = path.clone();
        child.push(e.name.clone());
        let fd = sys::open_path(dir, &c)?;
        if let Some(origin) = format::redirect(fd.as_fd(), ns)? {
            out.push((child.clone(), origin));
        }
        let sub = sys::openat(dir, &c, DIR_FLAGS, 0)?;
        find_under(sub.as_fd(), child, ns, out)?;
    }
    Ok(())
}

/// Where a redirect found on the directory at `path` points, from the
/// branch root: an absolute one as it says, a relative one (a name, as
/// overlayfs writes for a rename within one directory) beside `path`.
fn origin_path(path: &[Vec<u8>], origin: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = match origin.first() {
        Some(b'/') => Vec::new(),
        _ => path[..path.len().saturating_sub(1)].to_vec(),
    };
    out.extend(components(origin));
    out
}

/// Where the directory at `path` of a branch has its copy in the branch
/// below, given the branch's `renamed` directories: its own path, or,
/// under a renamed directory, where that one came from followed by the
/// rest. A relative redirect names a directory beside the *lower* copy of
/// its parent, as overlayfs resolves it (after `mv O X; mv X/a X/b`, `b`
/// says `a`, and came from `O/a`).
pub fn lower_path(renamed: &[Redirected], path: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let Some((dir, origin)) = renamed
        .iter()
        .filter(|(p, _)| !p.is_empty() && path.starts_with(p))
        .max_by_key(|(p, _)| p.len())
    else {
        return path.to_vec();
    };
    let mut out = match origin.first() {
        Some(b'/') => Vec::new(),
        _ => lower_path(renamed, &dir[..dir.len() - 1]),
    };
    out.extend(components(origin));
    out.extend_from_slice(&path[dir.len()..]);
    out
}

/// A path as its non-empty components.
pub fn components(path: &[u8]) -> Vec<Vec<u8>> {
    path.split(|b| *b == b'/')
        .filter(|c| !c.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// Gives every directory `renamed` (from [`find_renamed`]) in `upper` what
/// `lower` holds at its origin (see the module's comment), telling
/// `linked` of each object before it shows. Idempotent while `lower` is
/// unchanged.
pub fn absorb(
    upper: BorrowedFd<'_>,
    lower: BorrowedFd<'_>,
    renamed: &[Redirected],
    ns: XattrNs,
    linked: &mut Linked<'_>,
) -> Result<Vec<Renamed>> {
    let mut out = Vec::new();
    let absolute = |path: Vec<Vec<u8>>| {
        let mut abs = Vec::new();
        for c in path {
            abs.push(b'/');
            abs.extend_from_slice(&c);
        }
        abs
    };
    for (path, _) in renamed {
        let at = lower_path(renamed, path);
        let dir = open_path_beneath(upper, path)?;
        let (from, past) = walk_lower(lower, &at, ns)?;
        // Where the branches below the lower one hold it: through a
        // directory on the way renamed in the lower branch, where that one
        // came from (`mv a x`, a snapshot, `mv x/sub y`: `y` says `/x/sub`,
        // which below the lower branch is `/a/sub`).
        let (mut then, mut hides) = match past {
            Below::Same => (None, false),
            Below::At(ref path) => (Some(absolute(path.clone())), false),
            Below::Hidden => (None, true),
        };
        if let Some(from) = from {
            link_missing(from.as_fd(), (dir.as_fd(), upper), ns, linked)?;
            if format::is_opaque(from.as_fd(), ns)? {
                hides = true;
            } else if let Some(further) = format::redirect(from.as_fd(), ns)? {
                let base = match &past {
                    Below::At(path) => path.as_slice(),
                    _ => &at,
                };
                then = Some(absolute(origin_path(base, &further)));
                hides = false;
            }
        }
        if hides {
            // What lies below was hidden (the lower copy, or a directory
            // on its way, opaque): so it stays, now that this one holds
            // all the lower copy held.
            let fd = sys::open_path(dir.as_fd(), c".")?;
            format::set_opaque(fd.as_fd(), ns)?;
            sys::removexattr_fd(fd.as_fd(), ns.redirect())?;
            then = None;
        }
        // Else the lower branch holds nothing there: all came from below.
        out.push(Renamed {
            path: path.clone(),
            then,
        });
    }
    Ok(out)
}

/// [`absorb`] for a sandbox's branch, which nothing shows meanwhile: each
/// [`Renamed::then`] is applied at once.
pub fn absorb_renamed_dirs(
    upper: BorrowedFd<'_>,
    lower: BorrowedFd<'_>,
    ns: XattrNs,
) -> Result<()> {
    let renamed = find_renamed(upper, ns)?;
    for r in absorb(upper, lower, &renamed, ns, &mut |_, _| {})? {
        if let Some(then) = &r.then {
            let dir = open_path_beneath(upper, &r.path)?;
            let fd = sys::open_path(dir.as_fd(), c".")?;
            format::set_redirect(fd.as_fd(), ns, then)?;
        }
    }
    Ok(())
}

/// Hard-links into `to` every entry of `from` it lacks; a directory both
/// hold is filled the same way unless `to`'s hides `from`'s (opaque,
/// renamed, or not a directory). A directory `to` lacks is made under a
/// temporary name, filled, given `from`'s mode, owner, extended attributes
/// (overlay markers included) and times, and only then named.
fn link_missing(
    from: BorrowedFd<'_>,
    (to, work): (BorrowedFd<'_>, BorrowedFd<'_>),
    ns: XattrNs,
    linked: &mut Linked<'_>,
) -> Result<()> {
    // The union shows `to`'s times: entries added to it must not change
    // them, even for a moment a crash could make last.
    let shown = sys::fstat(to)?;
    let time = |secs, nsecs| sys::TimeSpec::At { secs, nsecs };
    let (atime, mtime) = (
        time(shown.st_atime, shown.st_atime_nsec),
        time(shown.st_mtime, shown.st_mtime_nsec),
    );
    for e in format::entries(from)? {
        if format::is_temporary(&e.name) || copyup::is_copyup_temp(&e.name) {
            continue;
        }
        let c = cname(&e.name)?;
        let src = sys::fstatat(from, &c)?;
        match sys::fstatat(to, &c) {
            Ok(dst) => {
                let fd = sys::open_path(to, &c)?;
                let fills = is_dir(&src)
                    && is_dir(&dst)
                    && !format::is_opaque(fd.as_fd(), ns)?
                    && format::redirect(fd.as_fd(), ns)?.is_none();
                if fills {
                    let sub_from = sys::openat(from, &c, DIR_FLAGS, 0)?;
                    let sub_to = sys::openat(to, &c, DIR_FLAGS, 0)?;
                    link_missing(sub_from.as_fd(), (sub_to.as_fd(), work), ns, linked)?;
                }
            }
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
                if is_dir(&src) {
                    made_dir(from, (to, work), &c, &src, ns, linked)?;
                } else {
                    linked(&src, &src);
                    sys::link_fd(sys::open_path(from, &c)?.as_fd(), to, &c)?;
                }
                sys::utimens_fd(to, atime, mtime)?;
            }
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

/// `to`'s copy of `from`'s directory `name` (`src`), made complete under a
/// temporary name in `work` (the upper branch's root, whose own times no
/// union shows), then moved into place.
fn made_dir(
    from: BorrowedFd<'_>,
    (to, work): (BorrowedFd<'_>, BorrowedFd<'_>),
    name: &CStr,
    src: &Stat,
    ns: XattrNs,
    linked: &mut Linked<'_>,
) -> Result<()> {
    let temp = copyup::temp_name();
    sys::mkdirat(work, &temp, 0o700)?;
    let filled = (|| -> Result<Stat> {
        let sub_from = sys::openat(from, name, DIR_FLAGS, 0)?;
        let sub_to = sys::openat(work, &temp, DIR_FLAGS, 0)?;
        link_missing(sub_from.as_fd(), (sub_to.as_fd(), work), ns, linked)?;
        copy_attrs(sub_from.as_fd(), sub_to.as_fd())?;
        Ok(sys::fstat(sub_to.as_fd())?)
    })();
    let made = match filled {
        Ok(st) => st,
        Err(e) => {
            let _ = super::snapmerge::remove_tree(work, &temp);
            return Err(e);
        }
    };
    linked(src, &made);
    sys::renameat2(work, &temp, to, name, libc::RENAME_NOREPLACE)?;
    Ok(())
}

/// `to` takes `from`'s mode, owner, extended attributes and, last, times.
fn copy_attrs(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    let st = sys::fstat(from)?;
    sys::chown_fd(to, st.st_uid, st.st_gid)?;
    sys::chmod_fd(to, st.st_mode & 0o7777)?;
    for (name, value) in sys::xattrs_of(from)? {
        sys::setxattr_fd(to, &cname(&name)?, &value, 0)?;
    }
    let time = |secs, nsecs| sys::TimeSpec::At { secs, nsecs };
    sys::utimens_fd(
        to,
        time(st.st_atime, st.st_atime_nsec),
        time(st.st_mtime, st.st_mtime_nsec),
    )
}

/// What the branches below a lower branch hold for a path walked in it.
enum Below {
    /// The same path.
    Same,
    /// Another path: a directory on the way was renamed in the lower
    /// branch (its redirect leads on).
    At(Vec<Vec<u8>>),
    /// Nothing that shows: a directory on the way is opaque.
    Hidden,
}

/// `at` walked in branch `lower`, as overlayfs walks a redirect: its
/// directory there, if it has one, and what the branches below hold
/// instead (an opaque directory on the way hides them, unless one further
/// on was renamed from an absolute path).
fn walk_lower(
    lower: BorrowedFd<'_>,
    at: &[Vec<u8>],
    ns: XattrNs,
) -> io::Result<(Option<OwnedFd>, Below)> {
    let mut dir = sys::reopen_dir(lower, libc::O_RDONLY)?;
    let mut below: Vec<Vec<u8>> = Vec::new();
    let (mut renamed, mut opaque) = (false, false);
    let past = |below: &[Vec<u8>], renamed: bool, opaque: bool, rest: &[Vec<u8>]| match (
        opaque, renamed,
    ) {
        (true, _) => Below::Hidden,
        (false, true) => Below::At(below.iter().chain(rest).cloned().collect()),
        (false, false) => Below::Same,
    };
    for (i, comp) in at.iter().enumerate() {
        dir = match sys::openat(dir.as_fd(), &cname(comp)?, DIR_FLAGS, 0) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                return Ok((None, past(&below, renamed, opaque, &at[i..])));
            }
            Err(e) => return Err(e),
        };
        if i + 1 == at.len() {
            break;
        }
        below.push(comp.clone());
        if format::is_opaque(dir.as_fd(), ns)? {
            opaque = true;
            continue;
        }
        if let Some(origin) = format::redirect(dir.as_fd(), ns)? {
            opaque &= origin.first() != Some(&b'/');
            below = origin_path(&below, &origin);
            renamed = true;
        }
    }
    let last = at.last().map(std::slice::from_ref).unwrap_or_default();
    Ok((Some(dir), past(&below, renamed, opaque, last)))
}

/// The directory `path` names under `root`, no symlink followed.
pub fn open_path_beneath(root: BorrowedFd<'_>, path: &[Vec<u8>]) -> io::Result<OwnedFd> {
    let mut dir = sys::reopen_dir(root, libc::O_RDONLY)?;
    for comp in path {
        dir = sys::openat(dir.as_fd(), &cname(comp)?, DIR_FLAGS, 0)?;
    }
    Ok(dir)
}

const DIR_FLAGS: i32 = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;

fn is_dir(st: &Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn cname(name: &[u8]) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<Vec<u8>> {
        components(p.as_bytes())
    }

    #[test]
    fn a_relative_redirect_is_beside_its_parents_lower_copy() {
        let renamed: Vec<Redirected> = vec![
            (path("X"), b"O".to_vec()),
            (path("X/Y"), b"oldY".to_vec()),
            (path("X/Y/Z"), b"/elsewhere/z".to_vec()),
            (path("P/Q"), b"q0".to_vec()),
        ];
        assert_eq!(lower_path(&renamed, &path("X")), path("O"));
        assert_eq!(lower_path(&renamed, &path("X/Y")), path("O/oldY"));
        assert_eq!(lower_path(&renamed, &path("X/Y/sub")), path("O/oldY/sub"));
        assert_eq!(
            lower_path(&renamed, &path("X/Y/Z/w")),
            path("elsewhere/z/w")
        );
        assert_eq!(lower_path(&renamed, &path("P/Q")), path("P/q0"));
        assert_eq!(lower_path(&renamed, &path("plain/dir")), path("plain/dir"));
    }
}
