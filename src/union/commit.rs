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
//! A directory **renamed** in the sandbox carries an overlay redirect to
//! where its lower copies are. The fold cannot move those from under
//! another name, so before it the renamed directory is made to hold, as
//! hard links, what the target holds there (`absorb::absorb_renamed_dirs`): it
//! then moves whole, and the whiteout the rename left at the old name
//! removes the target's old copy. The redirect stays where a branch below
//! the target holds what it points at, so the mount still finds theirs;
//! where none does (the old path was the target's alone), it goes, and
//! the whiteout stays only where a branch below shows something, as the
//! same rename made on the mount would leave them (`snapmerge`'s
//! `Merge::settle_moved`).
//!
//! A change **conflicts** when the target's entry at its path was made or
//! changed since the sandbox was (its ctime is not older): applying it
//! would throw away what the mount's users did meanwhile. Where the target
//! holds nothing there, the entry the union shows from a branch below it
//! counts the same: the mount changes a read-write lower branch's file in
//! place (a branch's mode may change while the sandbox lives), and the
//! sandbox's copy would hide it. A removal made
//! on the mount since is not seen (nothing is left to date it); it is
//! documented (docs/CLI.md, `sandbox commit`).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::format::{self, Opacity, XattrNs};
use super::snapmerge::Rekey;
use super::{absorb, copyup, index, snapmerge, Result};
use crate::store::DevAlias;
use crate::sys::{self, Stat};

/// The changes of a sandbox's branch and the conflicts among them, by
/// path relative to the branch roots (`a/b`, no leading slash).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub paths: Vec<Vec<u8>>,
    pub conflicts: Vec<Vec<u8>>,
    /// Some conflicts are hard-linked files both sides copied up: the
    /// fold cannot apply those even when forced (the mount's other names
    /// would keep its copy).
    pub linked_both: bool,
}

/// The changes `upper` (a sandbox's branch) would make to `lower` (the
/// mount's read-write branch), and those that conflict with what changed
/// at or after `since_ns` in `lower` or, where `lower` holds nothing, in
/// the branch below that shows the path (`under`: the roots of the
/// branches below `lower`, top first). What the fold cannot apply
/// (copied-up hard links) is refused here, before anything changes:
/// `UnionError::Unmergeable`.
pub fn changes(
    upper: BorrowedFd<'_>,
    lower: BorrowedFd<'_>,
    (since_ns, under): (u64, &[BorrowedFd<'_>]),
    ns: XattrNs,
    into: Into<'_>,
) -> Result<Changes> {
    let up = sys::reopen_dir(upper, libc::O_RDONLY)?;
    let low = sys::reopen_dir(lower, libc::O_RDONLY)?;
    let rekey = match into {
        Into::Union(rekey) => Some(rekey),
        Into::Directory(..) => None,
    };
    let clash = index_clashes(up.as_fd(), low.as_fd(), rekey)?;
    // The old names of renamed directories: what the target holds there
    // moves with them (absorbed), so a change in it is no conflict.
    let mut renamed = Vec::new();
    let walk = sys::reopen_dir(upper, libc::O_RDONLY)?;
    renamed.extend(absorb::find_renamed(walk.as_fd(), ns)?);
    let mut scan = Scan {
        origins: renamed
            .iter()
            .map(|(path, _)| absorb::lower_path(&renamed, path).join(&b'/'))
            .collect(),
        renamed,
        target: low.as_fd(),
        since_ns,
        deeper: !under.is_empty(),
        ns,
        clash,
        out: Changes::default(),
    };
    scan.out.linked_both = !scan.clash.is_empty();
    let under = under
        .iter()
        .map(|fd| sys::reopen_dir(*fd, libc::O_RDONLY))
        .collect::<io::Result<Vec<_>>>()?;
    scan.dir(up.as_fd(), (Some(low.as_fd()), &under), b"", true)?;
    // A clashing copy no name of which was met (a name in a directory that
    // moves whole): reported by its entry.
    for name in scan.clash.into_values().flatten() {
        scan.out
            .conflicts
            .push(join(index::INDEX_DIR.as_bytes(), &name));
    }
    if let Into::Directory(skip, alias) = into {
        // The other names of the files it copied up through its index
        // take the copy too.
        let mut out = scan.out;
        for (path, st) in names_of_linked(up.as_fd(), low.as_fd(), (skip, alias))? {
            if changed_since(&st, since_ns) && !out.conflicts.contains(&path) {
                out.conflicts.push(path.clone());
            }
            if !out.paths.contains(&path) {
                out.paths.push(path);
            }
        }
        return Ok(out);
    }
    Ok(scan.out)
}

/// What a commit goes into: a union's top branch (with the names its
/// hard-link index takes the sandbox's entries under), or a single
/// directory (with its store's name at the root, not searched, and how
/// the sandbox's index entries carry its device number).
#[derive(Clone, Copy)]
pub enum Into<'a> {
    Union(Rekey<'a>),
    Directory(Option<&'a [u8]>, DevAlias),
}

type Clashes = HashMap<(u64, u64), Option<Vec<u8>>>;

/// The sandbox's hard-link index, if it has one, and its copies of
/// hard-linked files, by the (dev, ino) of the file each replaces, with
/// its entry name.
fn linked_index(
    upper: BorrowedFd<'_>,
    alias: DevAlias,
) -> Result<Option<(OwnedFd, ByFile<std::ffi::CString>)>> {
    let Some(ix) = index::open_existing(upper)? else {
        return Ok(None);
    };
    let mut out = HashMap::new();
    for e in format::entries(sys::reopen_dir(ix.as_fd(), libc::O_RDONLY)?.as_fd())? {
        let Ok(name) = std::ffi::CString::new(e.name) else {
            continue;
        };
        if let Some((_, dev, ino)) = index::key_of_entry(&name) {
            out.insert((alias.swap(dev), ino), name);
        }
    }
    Ok(Some((ix, out)))
}

/// Something per file, by (dev, ino).
type ByFile<T> = HashMap<(u64, u64), T>;

/// Told (directory, name, path, what `ByFile` holds for it).
type OnName<'f, T> = dyn FnMut(BorrowedFd<'_>, &std::ffi::CStr, &[u8], &T) -> Result<()> + 'f;

/// Calls `f` with (directory, name, path) for every name under `dir`
/// (at `path`) of a non-directory whose (dev, ino) `wanted` holds; `skip`:
/// a name at the root not to enter (the store).
fn each_name_of<T>(
    dir: BorrowedFd<'_>,
    path: &[u8],
    (wanted, skip): (&ByFile<T>, Option<&[u8]>),
    f: &mut OnName<'_, T>,
) -> Result<()> {
    let inos: std::collections::HashSet<u64> = wanted.keys().map(|k| k.1).collect();
    for e in format::entries(dir)? {
        if path.is_empty()
            && (Some(e.name.as_slice()) == skip || e.name == index::INDEX_DIR.as_bytes())
        {
            continue;
        }
        let child = join(path, &e.name);
        let c = cname(&e.name)?;
        match e.dtype {
            libc::DT_DIR | libc::DT_UNKNOWN => {}
            _ if inos.contains(&e.ino) => {}
            _ => continue,
        }
        let st = sys::fstatat(dir, &c)?;
        if is_dir(&st) {
            let sub = sys::openat(dir, &c, DIR_FLAGS, 0)?;
            each_name_of(sub.as_fd(), &child, (wanted, None), f)?;
        } else if let Some(t) = wanted.get(&(st.st_dev, st.st_ino)) {
            f(dir, &c, &child, t)?;
        }
    }
    Ok(())
}

/// Into a single directory, which has no hard-link index to send names
/// through: every name `target` holds of a file the sandbox copied up
/// through its index is made a name of the copy (`skip`: the store's name
/// at the root). Then the index goes (the sandbox's names of each copy
/// keep it). Run again after a crash, it relinks what is left. Returns
/// how many names it relinked.
pub fn relink_linked(
    upper: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    (skip, alias): (Option<&[u8]>, DevAlias),
) -> Result<u64> {
    let Some((ix, copies)) = linked_index(upper, alias)? else {
        return Ok(0);
    };
    let mut relinked = 0;
    let root = sys::reopen_dir(target, libc::O_RDONLY)?;
    each_name_of(
        root.as_fd(),
        b"",
        (&copies, skip),
        &mut |dir, name, _, entry| {
            let copy = sys::open_path(ix.as_fd(), entry)?;
            copyup::replace_by_link(copy.as_fd(), dir, name)?;
            relinked += 1;
            Ok(())
        },
    )?;
    let dir = sys::reopen_dir(ix.as_fd(), libc::O_RDONLY)?;
    for e in format::entries(dir.as_fd())? {
        sys::unlinkat(ix.as_fd(), &cname(&e.name)?, 0)?;
    }
    sys::unlinkat(
        upper,
        &cname(index::INDEX_DIR.as_bytes())?,
        libc::AT_REMOVEDIR,
    )?;
    Ok(relinked)
}

/// The paths in `target` naming files the sandbox copied up through its
/// index (see [`relink_linked`]): changes of a commit into a single
/// directory.
fn names_of_linked(
    upper: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    (skip, alias): (Option<&[u8]>, DevAlias),
) -> Result<Vec<(Vec<u8>, Stat)>> {
    let mut out = Vec::new();
    let Some((_, copies)) = linked_index(upper, alias)?.filter(|(_, c)| !c.is_empty()) else {
        return Ok(out);
    };
    let root = sys::reopen_dir(target, libc::O_RDONLY)?;
    each_name_of(
        root.as_fd(),
        b"",
        (&copies, skip),
        &mut |dir, name, path, _| {
            out.push((path.to_vec(), sys::fstatat(dir, name)?));
            Ok(())
        },
    )?;
    Ok(out)
}

/// Copies of hard-linked files the sandbox made (its hard-link index)
/// that the target's index holds a copy of too: the mount copied the same
/// file up since, so both sides changed it. By the copy's (dev, ino), with
/// its entry name until a name of it is reported.
fn index_clashes(
    up: BorrowedFd<'_>,
    low: BorrowedFd<'_>,
    rekey: Option<Rekey<'_>>,
) -> Result<Clashes> {
    let mut out = HashMap::new();
    let Some(rekey) = rekey else {
        // A single directory: no index there (`relink_linked`).
        return Ok(out);
    };
    let Some((ix, entries)) = snapmerge::index_entries(up, rekey)? else {
        return Ok(out);
    };
    let Some(low_ix) = index::open_existing(low)? else {
        return Ok(out);
    };
    for (name, _) in snapmerge::clashing(ix.as_fd(), low_ix.as_fd(), &entries)? {
        let st = sys::fstatat(ix.as_fd(), &cname(name)?)?;
        out.insert((st.st_dev, st.st_ino), Some(name.clone()));
    }
    Ok(out)
}

/// One look at a sandbox's branch against the target.
struct Scan<'t> {
    origins: std::collections::HashSet<Vec<u8>>,
    /// The sandbox branch's renamed directories ([`absorb::find_renamed`]).
    renamed: Vec<absorb::Redirected>,
    target: BorrowedFd<'t>,
    since_ns: u64,
    deeper: bool,
    ns: XattrNs,
    /// See [`index_clashes`]; a copy's entry name goes once a name of it
    /// is reported.
    clash: Clashes,
    out: Changes,
}

impl Scan<'_> {
    /// The entries of `up` (at `path`) against `low`, the target's
    /// directory there if it has one, and `deep`, the directories of the
    /// branches below it there that the union merges in. `changes`:
    /// record them (a renamed
    /// directory is one change; what lies in it is only checked for
    /// conflicts against the target's directory it was renamed from).
    fn dir(
        &mut self,
        up: BorrowedFd<'_>,
        (low, deep): (Option<BorrowedFd<'_>>, &[Deep]),
        path: &[u8],
        changes: bool,
    ) -> Result<()> {
        let ns = self.ns;
        let xattr_whiteouts = format::opacity(up, ns)? == Opacity::XattrWhiteouts;
        for e in format::entries(up)? {
            let name = e.name;
            if format::is_temporary(&name)
                || copyup::is_copyup_temp(&name)
                || (path.is_empty() && name == index::INDEX_DIR.as_bytes())
            {
                continue;
            }
            // Below nothing, only renamed directories can conflict.
            if low.is_none()
                && deep.is_empty()
                && !changes
                && e.dtype != libc::DT_DIR
                && e.dtype != libc::DT_UNKNOWN
            {
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
            let whiteout = format::is_whiteout(&st)
                || (xattr_whiteouts && format::is_xattr_whiteout(fd.as_fd(), &st, ns)?);
            let dir = !whiteout && is_dir(&st);
            let renamed = match dir {
                true => format::redirect(fd.as_fd(), ns)?,
                false => None,
            };
            let walked = dir
                && renamed.is_none()
                && below.as_ref().is_some_and(is_dir)
                && !format::is_opaque(fd.as_fd(), ns)?;
            if walked && format::attrs_were_set(fd.as_fd(), ns)? {
                // Both hold it, and the sandbox set its attributes: a
                // conflict if they differ and the mount's changed since
                // (its ctime moves with its entries too: when in doubt,
                // ask).
                // Its ACLs and other extended attributes too: a grant
                // taken away on the mount must not come back with it.
                let b = below.as_ref().filter(|b| changed_since(b, self.since_ns));
                let differs = match (b, low) {
                    (Some(b), Some(l)) => {
                        (b.st_mode, b.st_uid, b.st_gid) != (st.st_mode, st.st_uid, st.st_gid)
                            || own_xattrs(fd.as_fd(), ns)?
                                != own_xattrs(sys::open_path(l, &c)?.as_fd(), ns)?
                    }
                    _ => false,
                };
                if differs {
                    self.out.conflicts.push(child.clone());
                }
            }
            // Removed on both sides: nothing to lose.
            let both_removed = whiteout && below.as_ref().is_some_and(format::is_whiteout);
            if let Some(b) = below.as_ref().filter(|_| !walked && !both_removed) {
                // A directory it replaces: anything changed in it counts.
                let changed = changed_since(b, self.since_ns)
                    || (is_dir(b)
                        && !self.origins.contains(&child)
                        && low
                            .is_some_and(|l| changed_within(l, &c, self.since_ns).unwrap_or(true)));
                if changed {
                    self.out.conflicts.push(child.clone());
                }
            }
            let opaque = dir && (renamed.is_some() || format::is_opaque(fd.as_fd(), ns)?);
            let shown = match below {
                Some(_) => None,
                None => shown_below(deep, &c)?,
            };
            if let Some((i, b)) = shown.as_ref() {
                // The target holds nothing here: what the union shows is
                // a lower branch's, which the mount changes in place.
                let merged = dir && !opaque && is_dir(b);
                let removed = whiteout && format::is_whiteout(b);
                let changed = || {
                    changed_since(b, self.since_ns)
                        || (is_dir(b)
                            && !self.origins.contains(&child)
                            && changed_within(deep[*i].as_fd(), &c, self.since_ns).unwrap_or(true))
                };
                if !merged && !removed && changed() {
                    self.out.conflicts.push(child.clone());
                }
            }
            if changes && !walked {
                self.out.paths.push(child.clone());
            }
            if !dir && !whiteout {
                if let Some(entry) = self.clash.get_mut(&(st.st_dev, st.st_ino)) {
                    *entry = None;
                    self.out.conflicts.push(child.clone());
                }
            }
            if !dir {
                continue;
            }
            let sub_up = sys::openat(up, &c, DIR_FLAGS, 0)?;
            let sub_low = match (&renamed, walked, low) {
                (Some(_), _, _) => {
                    let at = absorb::lower_path(&self.renamed, &absorb::components(&child));
                    let found = absorb::open_path_beneath(self.target, &at).ok();
                    if found.is_none() && self.removed(&at)? {
                        // What it held is gone from the mount: the rename
                        // would bring back only the sandbox's part of it.
                        self.out.conflicts.push(child.clone());
                    }
                    found
                }
                (None, true, Some(l)) => Some(sys::openat(l, &c, DIR_FLAGS, 0)?),
                _ => None,
            };
            // What the branches below merge into it: their copies hide
            // behind the sandbox's names.
            let sub_deep = match (opaque, &below) {
                (false, None) => deep_at(deep, &c, ns)?,
                (false, Some(_)) if walked => match low {
                    Some(l) if !format::is_opaque(sys::open_path(l, &c)?.as_fd(), ns)? => {
                        deep_at(deep, &c, ns)?
                    }
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            // A directory moving whole holds no change of its own to
            // record, but may hold renamed directories to check, and
            // names over what a branch below changed.
            self.dir(
                sub_up.as_fd(),
                (sub_low.as_ref().map(|f| f.as_fd()), &sub_deep),
                &child,
                changes && walked,
            )?;
        }
        Ok(())
    }
}

impl Scan<'_> {
    /// Whether the mount removed the directory at `at` (a renamed
    /// directory's origin the target no longer holds as one): a whiteout or
    /// another object there, or nothing where nothing lies below to show it.
    fn removed(&self, at: &[Vec<u8>]) -> Result<bool> {
        let Some((last, parent)) = at.split_last() else {
            return Ok(false);
        };
        let Ok(dir) = absorb::open_path_beneath(self.target, parent) else {
            return Ok(!self.deeper);
        };
        match sys::fstatat(dir.as_fd(), &cname(last)?) {
            Ok(st) => Ok(!is_dir(&st)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(!self.deeper),
            Err(e) => Err(e.into()),
        }
    }
}

/// A directory of a branch below the target.
type Deep = OwnedFd;

/// The entry at `name` the union shows from the directories `deep` (top
/// first): the first that holds one, by its index in `deep`.
fn shown_below(deep: &[Deep], name: &std::ffi::CStr) -> Result<Option<(usize, Stat)>> {
    for (i, d) in deep.iter().enumerate() {
        match sys::fstatat(d.as_fd(), name) {
            Ok(st) => return Ok(Some((i, st))),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// The directories at `name` in `deep` the union merges: down to the
/// first opaque one, or to a non-directory, which hides the rest.
fn deep_at(deep: &[Deep], name: &std::ffi::CStr, ns: XattrNs) -> Result<Vec<Deep>> {
    let mut out = Vec::new();
    for d in deep {
        let st = match sys::fstatat(d.as_fd(), name) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        if !is_dir(&st) {
            break;
        }
        let sub = sys::openat(d.as_fd(), name, DIR_FLAGS, 0)?;
        let opaque = format::is_opaque(sub.as_fd(), ns)?;
        out.push(sub);
        if opaque {
            break;
        }
    }
    Ok(out)
}

/// A regular file in `upper` that some process still has open for
/// writing (a sandbox's process whose descriptor outlived the sandbox's
/// session: kernel passthrough keeps it writing), by path.
pub fn open_for_writing(upper: BorrowedFd<'_>) -> Result<Option<Vec<u8>>> {
    fn walk(dir: BorrowedFd<'_>, path: &[u8]) -> Result<Option<Vec<u8>>> {
        for e in format::entries(dir)? {
            let c = cname(&e.name)?;
            let st = sys::fstatat(dir, &c)?;
            let child = join(path, &e.name);
            if is_dir(&st) {
                let sub = sys::openat(dir, &c, DIR_FLAGS, 0)?;
                if let Some(p) = walk(sub.as_fd(), &child)? {
                    return Ok(Some(p));
                }
            } else if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                let fd = sys::openat(dir, &c, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
                if sys::open_for_writing(fd.as_fd())? {
                    return Ok(Some(child));
                }
            }
        }
        Ok(None)
    }
    walk(sys::reopen_dir(upper, libc::O_RDONLY)?.as_fd(), b"")
}

/// Folds `upper` (a sandbox's branch, its renamed directories absorbed)
/// into `lower` (the mount's read-write branch; `under`: the roots of the
/// branches below it, top first), leaving `upper` empty. Whiteouts,
/// opacity and redirects land only where those branches show something
/// for them to hide or point at. Interrupted, it leaves both valid;
/// running it again finishes.
pub fn fold(
    upper: BorrowedFd<'_>,
    lower: BorrowedFd<'_>,
    under: &[BorrowedFd<'_>],
    ns: XattrNs,
    rekey: Rekey<'_>,
) -> Result<snapmerge::MergeCount> {
    snapmerge::merge(
        upper,
        lower,
        (!under.is_empty(), Some((rekey, under))),
        ns,
        &mut snapmerge::Unwatched,
    )
}

/// Whether anything in directory `name` of `dir` was made or changed at or
/// after `since_ns`.
fn changed_within(dir: BorrowedFd<'_>, name: &std::ffi::CStr, since_ns: u64) -> io::Result<bool> {
    let sub = sys::openat(dir, name, DIR_FLAGS, 0)?;
    for e in format::entries(sub.as_fd())? {
        let c = cname(&e.name)?;
        let st = sys::fstatat(sub.as_fd(), &c)?;
        if changed_since(&st, since_ns)
            || (is_dir(&st) && changed_within(sub.as_fd(), &c, since_ns)?)
        {
            return Ok(true);
        }
    }
    Ok(false)
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

/// `fd`'s extended attributes other than the union's own, in order.
fn own_xattrs(fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut all: Vec<_> = sys::xattrs_of(fd)?
        .into_iter()
        .filter(|(n, _)| !format::is_overlay_xattr(n, ns))
        .collect();
    all.sort();
    Ok(all)
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

    /// Into a single directory: every name of a file the sandbox copied
    /// up through its index becomes a name of the copy, once, whatever an
    /// interrupted run did already.
    #[test]
    fn relinking_gives_every_name_the_copy_and_resumes() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let (up, low) = (t.path().join("up"), t.path().join("low"));
        fs::create_dir_all(low.join("sub")).unwrap();
        fs::create_dir_all(low.join(".store")).unwrap();
        fs::write(low.join("a"), "old").unwrap();
        for n in ["b", "sub/d", ".store/kept"] {
            fs::hard_link(low.join("a"), low.join(n)).unwrap();
        }
        let l = fs::metadata(low.join("a")).unwrap();
        let ix = up.join(index::INDEX_DIR);
        fs::create_dir_all(&ix).unwrap();
        // Keyed as before a reboot gave the disk another device number.
        let key_dev = l.dev() ^ 0x5a5a;
        let alias = DevAlias::new(l.dev(), key_dev);
        let entry = ix.join(index::entry_name(1, key_dev, l.ino()).to_str().unwrap());
        fs::write(&entry, "new").unwrap();
        fs::hard_link(&entry, up.join("a")).unwrap();
        let copy = fs::metadata(&entry).unwrap().ino();
        let paths = names_of_linked(
            open_dir(&up).as_fd(),
            open_dir(&low).as_fd(),
            (Some(b".store"), alias),
        )
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect::<Vec<_>>();
        assert_eq!(names(&paths), ["a", "b", "sub/d"]);
        // As a crash leaves it: one name relinked.
        let c = open_path_fd(&entry);
        copyup::replace_by_link(c.as_fd(), open_dir(&low).as_fd(), c"b").unwrap();
        let n = relink_linked(
            open_dir(&up).as_fd(),
            open_dir(&low).as_fd(),
            (Some(b".store"), alias),
        );
        assert_eq!(n.unwrap(), 2);
        for n in ["a", "b", "sub/d"] {
            assert_eq!(fs::metadata(low.join(n)).unwrap().ino(), copy, "{n}");
        }
        assert_eq!(
            fs::read(low.join(".store/kept")).unwrap(),
            b"old",
            "not entered"
        );
        assert!(!ix.exists(), "the index goes");
        assert_eq!(fs::read(up.join("a")).unwrap(), b"new");
        let again = relink_linked(open_dir(&up).as_fd(), open_dir(&low).as_fd(), (None, alias));
        assert_eq!(again.unwrap(), 0);
    }

    /// A hard-linked symlink's copy in the index (a root daemon indexes
    /// every non-directory) gives its names the copy the same way.
    #[test]
    fn a_linked_symlink_is_relinked_too() {
        use std::os::unix::fs::{symlink, MetadataExt};
        let t = tempfile::tempdir().unwrap();
        let (up, low) = (t.path().join("up"), t.path().join("low"));
        fs::create_dir_all(low.join("sub")).unwrap();
        symlink("old", low.join("s")).unwrap();
        fs::hard_link(low.join("s"), low.join("sub/s2")).unwrap();
        let l = fs::symlink_metadata(low.join("s")).unwrap();
        let ix = up.join(index::INDEX_DIR);
        fs::create_dir_all(&ix).unwrap();
        let entry = ix.join(index::entry_name(1, l.dev(), l.ino()).to_str().unwrap());
        symlink("new", &entry).unwrap();
        fs::hard_link(&entry, up.join("s")).unwrap();
        let copy = fs::symlink_metadata(&entry).unwrap().ino();
        let alias = DevAlias::new(l.dev(), l.dev());
        let n = relink_linked(open_dir(&up).as_fd(), open_dir(&low).as_fd(), (None, alias));
        assert_eq!(n.unwrap(), 2);
        for n in ["s", "sub/s2"] {
            assert_eq!(
                fs::symlink_metadata(low.join(n)).unwrap().ino(),
                copy,
                "{n}"
            );
            assert_eq!(fs::read_link(low.join(n)).unwrap(), Path::new("new"), "{n}");
        }
    }

    fn open_path_fd(path: &Path) -> OwnedFd {
        let c = sys::cstr(path.as_os_str()).unwrap();
        sys::openat(sys::CWD, &c, libc::O_PATH, 0).unwrap()
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
            (since, &[]),
            XattrNs::for_daemon(),
            Into::Directory(None, DevAlias::default()),
        )
        .unwrap();
        assert_eq!(names(&c.paths), ["new", "src/a.c", "src/deep/b.c"]);
        assert_eq!(names(&c.conflicts), ["src/deep/b.c"]);
    }
}
