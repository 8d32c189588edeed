//! Restore, revert and undelete: bring a file or tree back as of an
//! instant, writing through ordinary system calls as the calling user (so
//! permissions are the file system's own and, through a mount, every
//! change is itself a version that can be undone).

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use super::history::{print_json, Target};
use crate::control::proto::{split_bytes, Instant, NodeInfo};
use crate::control::{At, Components};
use crate::sys;

/// Which verb runs (they share the walk; they differ in what they print
/// and whether they remove what did not exist then).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Restore,
    Revert,
    Undelete,
}

impl Verb {
    fn name(self) -> &'static str {
        match self {
            Verb::Restore => "restore",
            Verb::Revert => "revert",
            Verb::Undelete => "undelete",
        }
    }
}

/// Runs one verb and reports it (one line, or the JSON documented in the
/// README).
pub fn run(t: &Target, verb: Verb, at: &At, dest: &Path, json_out: bool) -> Result<()> {
    // The instant as a sequence number, so the report says what was meant.
    let resolved = t.client().resolve(at)?;
    let n = restore(t, at, dest, verb == Verb::Revert)?;
    if json_out {
        let (path, path_raw) = split_bytes(t.abs.as_os_str().as_bytes());
        let (dest, dest_raw) = split_bytes(dest.as_os_str().as_bytes());
        print_json(&Report {
            verb: verb.name(),
            path,
            path_raw,
            dest,
            dest_raw,
            at: resolved,
            objects: n,
        });
        return Ok(());
    }
    let what = match verb {
        Verb::Restore => "object(s) written",
        Verb::Revert => "object(s) changed",
        Verb::Undelete => "object(s)",
    };
    let done = match verb {
        Verb::Restore => "restored",
        Verb::Revert => "reverted",
        Verb::Undelete => "undeleted",
    };
    println!("{done} {} ({n} {what})", dest.display());
    Ok(())
}

/// `restore --json` and its siblings.
#[derive(Serialize)]
struct Report {
    verb: &'static str,
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_raw: Option<Vec<u8>>,
    dest: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    dest_raw: Option<Vec<u8>>,
    at: Instant,
    objects: u64,
}

/// Objects written so far, shown on stderr while a tree is brought back
/// (only on a terminal: scripts and pipes get no bar).
struct Progress {
    count: u64,
    bar: indicatif::ProgressBar,
}

impl Progress {
    fn new() -> Progress {
        let bar = if std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {pos} object(s) [{elapsed}] {wide_msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(std::time::Duration::from_millis(200));
            b
        } else {
            indicatif::ProgressBar::hidden()
        };
        Progress { count: 0, bar }
    }

    fn add(&mut self, n: u64, at: &Path) {
        self.count += n;
        self.bar.set_position(self.count);
        if !self.bar.is_hidden() {
            self.bar.set_message(at.display().to_string());
        }
    }
}

/// Restores `t.path` as of `at` to `dest`. `prune`: also remove what did
/// not exist then (revert); otherwise (restore) what exists only live is
/// kept. Returns how many objects were written or removed.
///
/// The result is built in a hidden staging directory beside `dest` (same
/// file system, so the last step is a rename) and swapped into place only
/// when complete: a failure anywhere leaves the live tree as it was and
/// the operation can simply be run again.
pub fn restore(t: &Target, at: &At, dest: &Path, prune: bool) -> Result<u64> {
    let tree = t.client().tree(&t.path, at)?;
    let root = &tree.root;
    let mut b = Builder {
        t,
        at,
        prune,
        seen: HashMap::new(),
        progress: Progress::new(),
        is_root: sys::geteuid() == 0,
    };
    let r = b.run(root, dest);
    b.progress.bar.finish_and_clear();
    r?;
    make_durable(t, dest)?;
    Ok(b.progress.count)
}

/// What was written so far survives a power cut: before a staged tree
/// takes its name (else a cut can leave the name with files whose data
/// never reached the disk), and before the command returns
/// (tests/powercut_disk.rs). The daemon syncs its branches (FUSE passes
/// no syncfs on to it); a DEST outside the mount is synced here.
fn make_durable(t: &Target, dest: &Path) -> Result<()> {
    use std::os::fd::AsFd;
    t.client().sync()?;
    let dir = match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => dest,
        _ => dest.parent().unwrap_or(dest),
    };
    let f = open_path(dir)?;
    sys::syncfs_dir(f.as_fd()).with_context(|| format!("cannot sync {}", dir.display()))
}

fn unhex(s: &str) -> Result<Vec<u8>> {
    (0..s.len() / 2)
        .map(|i| {
            s.get(2 * i..2 * i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(|| anyhow!("malformed xattr value from the daemon"))
        })
        .collect()
}

/// Attributes to give an object.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    atime_ns: i64,
    mtime_ns: i64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Meta {
    fn of_node(node: &NodeInfo) -> Result<Meta> {
        let mut xattrs = Vec::new();
        for x in node.xattr_values.iter().flatten() {
            let name = crate::control::proto::bytes_or_text(&x.name, x.name_raw.as_deref());
            xattrs.push((name, unhex(&x.hex)?));
        }
        xattrs.sort();
        Ok(Meta {
            mode: node.mode,
            uid: node.uid,
            gid: node.gid,
            atime_ns: node.atime_ns,
            mtime_ns: node.mtime_ns,
            xattrs,
        })
    }

    fn of_live(p: &Path, is_root: bool) -> Result<Meta> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(p)?;
        Ok(Meta {
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            atime_ns: m.atime() * 1_000_000_000 + m.atime_nsec(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            xattrs: live_xattrs(p, is_root)?,
        })
    }
}

fn open_path(p: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(p)
        .with_context(|| format!("cannot open {}", p.display()))
}

/// Whether restore sets xattr `name` recorded in history: a user's only
/// in the namespaces they can write, and never chronofs's own (a union's
/// hard-link index, a clone's mark: recorded by builds before they were
/// left out, and refused through the mount).
fn settable(name: &[u8], is_root: bool) -> bool {
    use crate::union::format::{is_chronofs_xattr, XattrNs};
    let own = [XattrNs::Trusted, XattrNs::User]
        .iter()
        .any(|ns| is_chronofs_xattr(name, *ns));
    !own && (is_root || !(name.starts_with(b"trusted.") || name.starts_with(b"security.")))
}

fn live_xattrs(p: &Path, is_root: bool) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    use std::os::fd::AsFd;
    let f = open_path(p)?;
    let mut x = sys::xattrs_of(f.as_fd())
        .with_context(|| format!("cannot read the xattrs of {}", p.display()))?;
    x.retain(|(k, _)| settable(k, is_root));
    Ok(x)
}

/// Gives `p` the recorded owner, xattrs (ACLs included), mode and times,
/// in that order: chown clears set-ID bits, an access ACL sets the group
/// bits, and every change but the times moves ctime only.
fn set_meta(p: &Path, m: &Meta, symlink: bool, is_root: bool) -> Result<()> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;
    if is_root {
        std::os::unix::fs::lchown(p, Some(m.uid), Some(m.gid))
            .with_context(|| format!("cannot set the owner of {}", p.display()))?;
    } else {
        // An owner may still give a file a group they belong to.
        std::os::unix::fs::lchown(p, None, Some(m.gid)).ok();
    }
    if !symlink {
        let f = open_path(p)?;
        let want: Vec<_> = m
            .xattrs
            .iter()
            .filter(|(k, _)| settable(k, is_root))
            .collect();
        // What the new object got by itself (a default ACL of its parent,
        // a security label) goes unless it was recorded.
        for (k, _) in live_xattrs(p, is_root)? {
            if !want.iter().any(|(w, _)| *w == k) {
                let c = sys::cstr(std::ffi::OsStr::from_bytes(&k))?;
                match sys::removexattr_fd(f.as_fd(), &c) {
                    Ok(()) => {}
                    Err(_) if k.starts_with(b"security.") => {}
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("cannot remove xattr {} of {}", name_str(&k), p.display())
                        })
                    }
                }
            }
        }
        for (k, v) in want {
            let c = sys::cstr(std::ffi::OsStr::from_bytes(k))?;
            sys::setxattr_fd(f.as_fd(), &c, v, 0)
                .with_context(|| format!("cannot set xattr {} of {}", name_str(k), p.display()))?;
        }
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m.mode))
            .with_context(|| format!("cannot set the mode of {}", p.display()))?;
    }
    sys::set_times(p, m.atime_ns, m.mtime_ns)
        .with_context(|| format!("cannot set the times of {}", p.display()))?;
    Ok(())
}

fn name_str(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn file_kind(m: &std::fs::Metadata) -> &'static str {
    let ft = m.file_type();
    if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "other"
    }
}

/// Whether the live object at `p` already is what `node` describes
/// (content judged by size and mtime, as everywhere in chronofs).
fn same_as_live(node: &NodeInfo, p: &Path, is_root: bool) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(live) = std::fs::symlink_metadata(p) else {
        return false;
    };
    let Ok(want) = Meta::of_node(node) else {
        return false;
    };
    node.kind == file_kind(&live)
        && node.size == live.size()
        && want.mode == live.mode() & 0o7777
        && want.uid == live.uid()
        && want.gid == live.gid()
        && i128::from(want.mtime_ns)
            == i128::from(live.mtime()) * 1_000_000_000 + i128::from(live.mtime_nsec())
        && live_xattrs(p, is_root).is_ok_and(|x| {
            let mut w = want.xattrs;
            w.retain(|(k, _)| settable(k, is_root));
            x == w
        })
}

/// Whether this user may create and rename entries in `dir`.
fn may_write(dir: &Path) -> bool {
    use std::os::fd::AsFd;
    open_path(dir).is_ok_and(|f| sys::access_fd(f.as_fd(), libc::W_OK | libc::X_OK).is_ok())
}

/// A hidden name in `dir` that nothing has. What an earlier run whose
/// process is gone left there (a crash or a power cut in the middle) is
/// removed first: nothing refers to it.
fn staging_name(dir: &Path) -> std::path::PathBuf {
    remove_stale_staging(dir);
    let mut n = 0u32;
    loop {
        let prefix = String::from_utf8_lossy(crate::history::past::STAGING_PREFIX);
        let p = dir.join(format!("{prefix}{}-{n}", std::process::id()));
        if std::fs::symlink_metadata(&p).is_err() {
            return p;
        }
        n += 1;
    }
}

/// Removes the staging trees in `dir` whose process (the pid in their
/// name) is gone. Best effort: what cannot go stays, and says so.
fn remove_stale_staging(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = crate::history::past::STAGING_PREFIX;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.as_bytes().strip_prefix(prefix) else {
            continue;
        };
        let pid = rest.split(|&b| b == b'-').next().unwrap_or_default();
        let alive = std::str::from_utf8(pid)
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            if let Err(e) = remove_tree(&entry.path()) {
                eprintln!(
                    "chronofs: {} (left by an interrupted run) stays: {e:#}",
                    entry.path().display()
                );
            }
        }
    }
}

fn rename2(from: &Path, to: &Path, flags: u32) -> Result<()> {
    use std::os::fd::AsFd;
    let dir = |p: &Path| -> Result<(std::fs::File, std::ffi::CString)> {
        let parent = p
            .parent()
            .ok_or_else(|| anyhow!("{} has no parent", p.display()))?;
        let name = p
            .file_name()
            .ok_or_else(|| anyhow!("{} has no name", p.display()))?;
        Ok((open_path(parent)?, sys::cstr(name)?))
    };
    let (fd, fname) = dir(from)?;
    let (td, tname) = dir(to)?;
    sys::renameat2(fd.as_fd(), &fname, td.as_fd(), &tname, flags)
        .with_context(|| format!("cannot move {} to {}", from.display(), to.display()))
}

/// Puts the finished `staged` at `dest`: a rename when nothing is there,
/// else an exchange (one step: no instant without `dest`) and the removal
/// of what was there.
fn commit(staged: &Path, dest: &Path) -> Result<()> {
    if std::fs::symlink_metadata(dest).is_err() {
        return rename2(staged, dest, libc::RENAME_NOREPLACE);
    }
    rename2(staged, dest, libc::RENAME_EXCHANGE)?;
    if let Err(e) = remove_tree(staged) {
        eprintln!(
            "chronofs: {} is in place; the old tree could not all be removed from {}: {e:#}",
            dest.display(),
            staged.display()
        );
    }
    Ok(())
}

/// A file with no name in `dir` (O_TMPFILE), gone when closed.
fn unnamed_file(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
}

struct Builder<'a> {
    t: &'a Target,
    at: &'a At,
    prune: bool,
    /// Objects already written, by object id: a second name of one is a
    /// hard link to the first.
    seen: HashMap<crate::history::ObjectId, std::path::PathBuf>,
    progress: Progress,
    is_root: bool,
}

impl Builder<'_> {
    fn run(&mut self, root: &NodeInfo, dest: &Path) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        if self.left_alone(root, dest) {
            return Ok(());
        }
        let live = std::fs::symlink_metadata(dest).ok();
        if root.kind != "dir" && same_as_live(root, dest, self.is_root) {
            return Ok(());
        }
        if root.kind == "file" && live.as_ref().is_some_and(|m| m.is_file()) {
            // One file over a live one: written in place, so it stays the
            // same object (its hard links, its history's numbering) and a
            // user who may write the file needs no right on its directory.
            return self.file_in_place(root, dest);
        }
        let parent = dest
            .parent()
            .ok_or_else(|| anyhow!("cannot restore {}", dest.display()))?;
        // A mount's root cannot be renamed, a user may own a directory in
        // one they cannot write, and `revert .` must not leave the caller's
        // shell in a removed directory: then the entries are staged inside
        // the target and swapped in one by one.
        let stage_inside = live.as_ref().is_some_and(|m| {
            m.is_dir()
                && (std::fs::symlink_metadata(parent).is_ok_and(|pm| pm.dev() != m.dev())
                    || !may_write(parent)
                    || std::env::current_dir().is_ok_and(|c| c.starts_with(dest)))
        });
        if stage_inside {
            return self.run_in_root(root, dest);
        }
        let staged = staging_name(parent);
        let path = self.t.path.clone();
        let live_dest = live.is_some().then_some(dest);
        if let Err(e) = self
            .node(&path, root, &staged, live_dest)
            .and_then(|()| make_durable(self.t, parent))
        {
            return Err(self.abandon(&staged, e));
        }
        commit(&staged, dest)
    }

    fn file_in_place(&mut self, node: &NodeInfo, dest: &Path) -> Result<()> {
        // The content is received whole first: a read refused (EACCES) or
        // failing part way (a damaged chunk) leaves DEST as it was. Beside
        // DEST where its directory allows, else in the temporary directory
        // (a user who may write the file needs no right on its directory).
        let parent = dest.parent().unwrap_or(Path::new("."));
        let mut received = unnamed_file(parent)
            .or_else(|_| unnamed_file(&std::env::temp_dir()))
            .context("cannot make a temporary file for the content")?;
        self.content(&self.t.path, node, &mut received)?;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(dest)
            .with_context(|| format!("cannot write {}", dest.display()))?;
        use std::io::Seek;
        received.rewind()?;
        std::io::copy(&mut received, &mut out)
            .with_context(|| format!("cannot write {}", dest.display()))?;
        drop(out);
        set_meta(dest, &Meta::of_node(node)?, false, self.is_root)?;
        self.progress.add(1, dest);
        Ok(())
    }

    /// Writes the content of `node`, the file at `path` then, to `f`.
    /// The daemon reads the version the path shows at the instant when it
    /// answers: one a prune removed since the tree was read would be
    /// another one, and its bytes would go with `node`'s attributes.
    fn content(&self, path: &Components, node: &NodeInfo, f: &mut std::fs::File) -> Result<()> {
        let mut buf = std::io::BufWriter::with_capacity(1 << 20, f);
        let read = self.t.client().read(path, self.at, None, &mut buf)?;
        buf.flush()?;
        if (read.obj, read.seq) != (node.obj, node.seq) {
            bail!(
                "{} changed in history while it was restored (a prune?); run the command again",
                crate::history::past::show_path(path)
            );
        }
        Ok(())
    }

    fn abandon(&self, staged: &Path, e: anyhow::Error) -> anyhow::Error {
        if std::fs::symlink_metadata(staged).is_ok() {
            if let Err(r) = remove_tree(staged) {
                return e.context(format!(
                    "nothing was changed, but the unfinished copy {} could not be removed: {r:#}",
                    staged.display()
                ));
            }
        }
        e.context("nothing was changed")
    }

    fn run_in_root(&mut self, root: &NodeInfo, dest: &Path) -> Result<()> {
        let staged = staging_name(dest);
        let names = match self
            .entries(&self.t.path.clone(), root, &staged, None)
            .and_then(|n| make_durable(self.t, dest).map(|()| n))
        {
            Ok(n) => n,
            Err(e) => return Err(self.abandon(&staged, e)),
        };
        for name in &names {
            let from = staged.join(std::ffi::OsStr::from_bytes(name));
            if std::fs::symlink_metadata(&from).is_ok() {
                commit(&from, &dest.join(std::ffi::OsStr::from_bytes(name)))?;
            }
        }
        std::fs::remove_dir(&staged).ok();
        if self.prune {
            for entry in std::fs::read_dir(dest)? {
                let entry = entry?;
                if entry.path() != staged && !names.contains(&entry.file_name().as_bytes().to_vec())
                {
                    remove_tree(&entry.path())?;
                    self.progress.add(1, dest);
                }
            }
        }
        set_meta(dest, &Meta::of_node(root)?, false, self.is_root)
    }

    /// Lost and unrecorded content cannot be brought back: say so, and
    /// keep what is live.
    fn left_alone(&self, node: &NodeInfo, dest: &Path) -> bool {
        let why = if node.is_lost() {
            "content lost (damaged in the store)"
        } else if node.is_unrecorded() {
            "content not versioned by policy"
        } else {
            return false;
        };
        eprintln!("chronofs: {}: {why}; left as it is", dest.display());
        true
    }

    /// Writes `node` (at `path` in history) to `staged`; `live` is what
    /// stands at its place now, if anything.
    fn node(
        &mut self,
        path: &Components,
        node: &NodeInfo,
        staged: &Path,
        live: Option<&Path>,
    ) -> Result<()> {
        let kind = node.kind.as_str();
        if self.left_alone(node, staged) {
            if let Some(l) = live {
                self.carry(l, staged)?;
            }
            return Ok(());
        }
        let obj = node.obj;
        if kind != "dir" {
            if let Some(first) = obj.and_then(|o| self.seen.get(&o)) {
                std::fs::hard_link(first, staged)
                    .with_context(|| format!("cannot link {}", staged.display()))?;
                return Ok(());
            }
        }
        let meta = Meta::of_node(node)?;
        match kind {
            "file" => {
                // Unchanged: the live object itself, so it keeps its
                // identity (and its history) instead of becoming a copy.
                let linked = live.is_some_and(|l| {
                    same_as_live(node, l, self.is_root) && std::fs::hard_link(l, staged).is_ok()
                });
                if !linked {
                    let mut f = std::fs::File::create_new(staged)
                        .with_context(|| format!("cannot write {}", staged.display()))?;
                    self.content(path, node, &mut f)?;
                    drop(f);
                    set_meta(staged, &meta, false, self.is_root)?;
                    self.progress.add(1, staged);
                }
            }
            "dir" => {
                self.entries(path, node, staged, live)?;
                set_meta(staged, &meta, false, self.is_root)?;
                self.progress.add(1, staged);
            }
            "symlink" => {
                let target = node.target_bytes().unwrap_or_default();
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), staged)
                    .with_context(|| format!("cannot create {}", staged.display()))?;
                set_meta(staged, &meta, true, self.is_root)?;
                self.progress.add(1, staged);
            }
            "fifo" => {
                sys::mkfifo(staged, meta.mode)
                    .with_context(|| format!("cannot create {}", staged.display()))?;
                set_meta(staged, &meta, false, self.is_root)?;
                self.progress.add(1, staged);
            }
            other => {
                eprintln!(
                    "chronofs: skipping {} ({other} files are not restored)",
                    staged.display()
                );
                if let Some(l) = live {
                    self.carry(l, staged)?;
                }
                return Ok(());
            }
        }
        if let Some(o) = obj {
            self.seen.insert(o, staged.to_path_buf());
        }
        Ok(())
    }

    /// Makes directory `staged` with the entries of `node`, then (restore)
    /// whatever only the live directory has, or (revert) counts it as
    /// removed. Returns the names written.
    fn entries(
        &mut self,
        path: &Components,
        node: &NodeInfo,
        staged: &Path,
        live: Option<&Path>,
    ) -> Result<Vec<Vec<u8>>> {
        std::fs::create_dir(staged)
            .with_context(|| format!("cannot create {}", staged.display()))?;
        let live = live.filter(|l| std::fs::symlink_metadata(l).is_ok_and(|m| m.is_dir()));
        let mut names = Vec::new();
        for e in node.entries.iter().flatten() {
            let name = e.name_bytes();
            let os = std::ffi::OsStr::from_bytes(&name);
            let live_child = live.map(|l| l.join(os));
            let live_child = live_child
                .as_deref()
                .filter(|c| std::fs::symlink_metadata(c).is_ok());
            let mut child = path.clone();
            child.push(name.clone());
            self.node(&child, e, &staged.join(os), live_child)?;
            names.push(name);
        }
        if let Some(l) = live {
            for entry in std::fs::read_dir(l)? {
                let entry = entry?;
                let n = entry.file_name();
                if names.contains(&n.as_bytes().to_vec()) {
                    continue;
                }
                if self.prune {
                    self.progress.add(1, l);
                } else {
                    self.carry(&entry.path(), &staged.join(&n))?;
                }
            }
        }
        Ok(names)
    }

    /// Puts the live object `live` at `staged` as it is: the object itself
    /// (a hard link), or for a directory a new one with its attributes and
    /// its entries carried the same way.
    fn carry(&mut self, live: &Path, staged: &Path) -> Result<()> {
        let m = std::fs::symlink_metadata(live)?;
        if !m.is_dir() {
            return std::fs::hard_link(live, staged).with_context(|| {
                format!(
                    "cannot keep {} (link to {})",
                    live.display(),
                    staged.display()
                )
            });
        }
        std::fs::create_dir(staged)
            .with_context(|| format!("cannot create {}", staged.display()))?;
        for entry in std::fs::read_dir(live)? {
            let entry = entry?;
            self.carry(&entry.path(), &staged.join(entry.file_name()))?;
        }
        set_meta(
            staged,
            &Meta::of_live(live, self.is_root)?,
            false,
            self.is_root,
        )
    }
}

fn remove_tree(p: &Path) -> Result<()> {
    let m = std::fs::symlink_metadata(p)?;
    if m.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
    .with_context(|| format!("cannot remove {}", p.display()))
}

/// The instant just before `path`'s last deletion, from its parent's
/// deleted list.
pub fn before_deletion(t: &Target) -> Result<At> {
    let Some((name, parent)) = t.path.split_last() else {
        bail!("the mount root cannot be deleted");
    };
    let v = t.client().list(&parent.to_vec(), &At::Now, true)?;
    let hit = v
        .deleted
        .iter()
        .find(|e| e.name_bytes() == *name)
        .ok_or_else(|| {
            anyhow!(
                "{} is not a deleted entry of its directory (see `chronofs ls --deleted`)",
                t.abs.display()
            )
        })?;
    // The instant before the removal (of a tree: before `rm -rf` began).
    Ok(At::Seq(hit.restore_seq))
}
