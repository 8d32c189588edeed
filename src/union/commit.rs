//! What applying a sandbox's branch to a mount's read-write branch would
//! change, and where the two disagree (`chronofs sandbox commit`). The
//! application itself is the fold of `snapmerge`: the sandbox's branch
//! lies over the mount's exactly as a frozen branch over the one below it.
//!
//! A **change** is an entry the fold puts in place of the target's: a
//! non-directory, a whiteout, an opaque directory, or a directory the
//! target lacks or holds a non-directory under. Directories both hold are
//! walked, not changes themselves.
//!
//! A change **conflicts** when the target's entry at its path was made or
//! changed since the sandbox was (its ctime is not older): applying it
//! would throw away what the mount's users did meanwhile. A removal made
//! on the mount since is not seen (nothing is left to date it); it is
//! documented (docs/CLI.md, `sandbox commit`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use super::format::{self, Opacity, XattrNs};
use super::{index, Result, UnionError};
use crate::sys::{self, Stat};

/// The changes of a sandbox's branch and the conflicts among them, by
/// path relative to the branch roots (`a/b`, no leading slash).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub paths: Vec<Vec<u8>>,
    pub conflicts: Vec<Vec<u8>>,
}

/// The changes `upper` (a sandbox's branch) would make to `lower` (the
/// mount's read-write branch), and those that conflict with what changed
/// in `lower` at or after `since_ns`. What the fold cannot apply (a
/// directory renamed in the sandbox, copied-up hard links) is refused
/// here, before anything changes: `UnionError::Unmergeable`.
pub fn changes(
    upper: BorrowedFd<'_>,
    lower: BorrowedFd<'_>,
    since_ns: u64,
    ns: XattrNs,
) -> Result<Changes> {
    let up = sys::reopen_dir(upper, libc::O_RDONLY)?;
    let low = sys::reopen_dir(lower, libc::O_RDONLY)?;
    if let Some(ix) = index::open_existing(up.as_fd())? {
        if !format::entries(sys::reopen_dir(ix.as_fd(), libc::O_RDONLY)?.as_fd())?.is_empty() {
            return Err(UnionError::Unmergeable(
                "the sandbox made hard links to files of the branches below it; committing \
                 those is not supported yet (nothing was applied)"
                    .into(),
            ));
        }
    }
    let mut out = Changes::default();
    scan(up.as_fd(), Some(low.as_fd()), b"", since_ns, ns, &mut out)?;
    Ok(out)
}

fn scan(
    up: BorrowedFd<'_>,
    low: Option<BorrowedFd<'_>>,
    path: &[u8],
    since_ns: u64,
    ns: XattrNs,
    out: &mut Changes,
) -> Result<()> {
    let xattr_whiteouts = format::opacity(up, ns)? == Opacity::XattrWhiteouts;
    let entries = format::entries(up)?;
    for name in entries.into_iter().map(|e| e.name) {
        if format::is_temporary(&name) || (path.is_empty() && name == index::INDEX_DIR.as_bytes()) {
            continue;
        }
        let c = cname(&name)?;
        let st = sys::fstatat(up, &c)?;
        let below = match low {
            Some(l) => match sys::fstatat(l, &c) {
                Ok(s) => Some(s),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
                Err(e) => return Err(e.into()),
            },
            None => None,
        };
        let child = join(path, &name);
        let fd = sys::open_path(up, &c)?;
        if is_dir(&st) && format::redirect(fd.as_fd(), ns)?.is_some() {
            return Err(UnionError::Unmergeable(format!(
                "/{}: a directory renamed in the sandbox cannot be committed yet (nothing was \
                 applied)",
                String::from_utf8_lossy(&child)
            )));
        }
        let whiteout = format::is_whiteout(&st)
            || (xattr_whiteouts && format::is_xattr_whiteout(fd.as_fd(), &st, ns)?);
        let walked = !whiteout
            && is_dir(&st)
            && below.as_ref().is_some_and(is_dir)
            && !format::is_opaque(fd.as_fd(), ns)?;
        if walked {
            let sub_up = sys::openat(up, &c, DIR_FLAGS, 0)?;
            let sub_low = match low {
                Some(l) => Some(sys::openat(l, &c, DIR_FLAGS, 0)?),
                None => None,
            };
            scan(
                sub_up.as_fd(),
                sub_low.as_ref().map(|f| f.as_fd()),
                &child,
                since_ns,
                ns,
                out,
            )?;
            continue;
        }
        if below.as_ref().is_some_and(|b| changed_since(b, since_ns)) {
            out.conflicts.push(child.clone());
        }
        out.paths.push(child);
    }
    Ok(())
}

/// Whether `st` was made or changed at or after `since_ns`.
fn changed_since(st: &Stat, since_ns: u64) -> bool {
    let ctime = (st.st_ctime as i128) * 1_000_000_000 + st.st_ctime_nsec as i128;
    ctime >= since_ns as i128
}

const DIR_FLAGS: i32 = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;

fn is_dir(st: &Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn cname(name: &[u8]) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::fd::OwnedFd;
    use std::path::Path;

    fn open_dir(path: &Path) -> OwnedFd {
        let c = sys::cstr(path.as_os_str()).unwrap();
        sys::openat(sys::CWD, &c, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap()
    }

    fn names(v: &[Vec<u8>]) -> Vec<String> {
        let mut out: Vec<String> = v
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        out.sort();
        out
    }

    #[test]
    fn changes_are_the_entries_put_in_place_and_conflicts_those_changed_below_since() {
        let t = tempfile::tempdir().unwrap();
        let (up, low) = (t.path().join("up"), t.path().join("low"));
        for d in [&up, &low] {
            fs::create_dir_all(d.join("src/deep")).unwrap();
            fs::create_dir_all(d.join("docs")).unwrap();
        }
        fs::write(low.join("src/a.c"), "old").unwrap();
        fs::write(low.join("src/deep/b.c"), "old").unwrap();
        fs::write(low.join("docs/x"), "old").unwrap();
        // Everything below is older than the sandbox...
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        // ...but this, changed on the mount since (by the file system's
        // clock, which may lag the system's by a tick).
        let ctime = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            let m = fs::metadata(p).unwrap();
            m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128
        };
        while ctime(&low.join("src/deep/b.c")) < since as i128 {
            fs::write(low.join("src/deep/b.c"), "theirs").unwrap();
        }
        fs::write(up.join("src/a.c"), "mine").unwrap();
        fs::write(up.join("src/deep/b.c"), "mine").unwrap();
        fs::create_dir(up.join("new")).unwrap();
        fs::write(up.join("new/f"), "").unwrap();
        let c = changes(
            open_dir(&up).as_fd(),
            open_dir(&low).as_fd(),
            since,
            XattrNs::for_daemon(),
        )
        .unwrap();
        assert_eq!(names(&c.paths), ["new", "src/a.c", "src/deep/b.c"]);
        assert_eq!(names(&c.conflicts), ["src/deep/b.c"]);
    }
}
