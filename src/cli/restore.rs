//! Restore, revert and undelete: bring a file or tree back as of an
//! instant, writing through ordinary system calls as the calling user (so
//! permissions are the file system's own and, through a mount, every
//! change is itself a version that can be undone).

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::io::IsTerminal;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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
/// `src` is the path of what is brought back as it was at `at` (where
/// `t.path` was then: [`source`]).
pub fn run(
    t: &Target,
    src: &Components,
    verb: Verb,
    at: &At,
    dest: &Path,
    json_out: bool,
) -> Result<()> {
    refuse_unmounted(t, dest)?;
    // The instant as a sequence number, so the report says what was meant.
    let resolved = t.client().resolve(at)?;
    let n = restore(t, src, at, dest, verb == Verb::Revert)?;
    report(t, verb, resolved, dest, n, json_out);
    Ok(())
}

/// The line (or JSON object) saying what a tree operation did.
pub(super) fn report(
    t: &Target,
    verb: Verb,
    resolved: Instant,
    dest: &Path,
    n: u64,
    json_out: bool,
) {
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
        return;
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
    println!(
        "{done} {} ({n} {what})",
        super::history::shown(&dest.display().to_string())
    );
}

/// Written without a mount, the source would change with nothing in
/// history: the operation could not be undone.
pub(super) fn refuse_unmounted(t: &Target, dest: &Path) -> Result<()> {
    if let Some(src) = t.unmounted_source().filter(|src| dest.starts_with(src)) {
        bail!(
            "{} is not mounted: mount it first, or restore --to a path outside it",
            src.display()
        );
    }
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

/// The path `restore PATH --at T` reads at T: PATH's own, or, where PATH
/// named nothing then, where what it names now (or its nearest directory)
/// was then: history follows renames, as `f;@T` and `diff` do, so a file
/// of a directory renamed since comes back as `ls --deleted` shows it.
pub fn source(t: &Target, at: &At) -> Result<Components> {
    match t.client().stat(&t.path, at) {
        Err(e) if e.errno() == libc::ENOENT => {}
        // Another error is the tree request's to report.
        _ => return Ok(t.path.clone()),
    }
    let then = t.client().follow(&t.path, &At::Now, at).ok();
    Ok(then.and_then(|f| f.path).unwrap_or_else(|| t.path.clone()))
}

/// Restores `src` as of `at` to `dest`. `prune`: also remove what did
/// not exist then (revert); otherwise (restore) what exists only live is
/// kept. Returns how many objects were written or removed.
///
/// The result is built in a hidden staging directory beside `dest` (same
/// file system, so the last step is a rename) and swapped into place only
/// when complete: a failure anywhere leaves the live tree as it was and
/// the operation can simply be run again.
pub fn restore(t: &Target, src: &Components, at: &At, dest: &Path, prune: bool) -> Result<u64> {
    let tree = t.client().tree(src, at)?;
    let root = &tree.root;
    let mut b = Builder {
        t,
        src,
        at,
        prune,
        seen: HashMap::new(),
        progress: Progress::new(),
        is_root: sys::geteuid() == 0,
    };
    let r = b.run(root, dest);
    b.progress.bar.finish_and_clear();
    r?;
    Ok(b.progress.count)
}

/// What was written so far survives a power cut: before a staged tree
/// takes its name (else a cut can leave the name with files whose data
/// never reached the disk), and before the command returns
/// (tests/powercut_disk.rs). The daemon syncs its branches (FUSE passes
/// no syncfs on to it); the file system of `dir` (DEST's directory, which
/// may lie outside the mount) is synced here.
fn make_durable(t: &Target, dir: BorrowedFd<'_>) -> Result<()> {
    t.client().sync()?;
    sys::syncfs_dir(dir).context("cannot sync the restored copy")
}

/// Whether `read`, what the daemon read, is the state `node` (the tree's
/// answer) describes: the same version, or the baseline history recorded
/// since of the live file the tree showed. A file history never recorded
/// is shown live; its first change through the mount (an editor saving it
/// between the tree and the read) records first the state before it, which
/// the past then reads: that is the state the tree showed, unless the file
/// changed behind the mount's back meanwhile (then its attributes differ).
fn same_state(node: &NodeInfo, read: &NodeInfo) -> bool {
    if (read.obj, read.seq) == (node.obj, node.seq) {
        return true;
    }
    let attrs = |n: &NodeInfo| (n.kind.clone(), n.mode, n.uid, n.gid, n.size, n.mtime_ns);
    node.source == "live"
        && read.source == "history"
        && read.cause.as_deref() == Some("baseline")
        && node.obj.is_none_or(|o| read.obj == Some(o))
        && attrs(node) == attrs(read)
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

/// Modes objects are made with in the staging tree, before their recorded
/// one is applied (a directory's after its entries): the owner's alone,
/// whatever the umask, so that a 0600 key restored into a 0755 home is
/// never readable by others while the tree is built.
const NEW_DIR_MODE: u32 = 0o700;
const NEW_FILE_MODE: u32 = 0o600;

/// Attributes to give an object.
pub(super) struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    atime_ns: i64,
    mtime_ns: i64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Meta {
    pub(super) fn of_node(node: &NodeInfo) -> Result<Meta> {
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

    fn of_live(live: &Live<'_>, is_root: bool) -> Result<Meta> {
        let st = &live.st;
        Ok(Meta {
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            atime_ns: st.st_atime * 1_000_000_000 + st.st_atime_nsec,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            xattrs: live_xattrs(live.fd.as_fd(), &live.shown, is_root)?,
        })
    }
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

fn live_xattrs(fd: BorrowedFd<'_>, shown: &Path, is_root: bool) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut x = sys::xattrs_of(fd)
        .with_context(|| format!("cannot read the xattrs of {}", shown.display()))?;
    x.retain(|(k, _)| settable(k, is_root));
    Ok(x)
}

fn timespec(ns: i64) -> sys::TimeSpec {
    sys::TimeSpec::At {
        secs: ns.div_euclid(1_000_000_000),
        nsecs: ns.rem_euclid(1_000_000_000),
    }
}

/// Gives the object `fd` holds (`shown` in messages) the recorded owner,
/// xattrs (ACLs included), mode and times, in that order: chown clears
/// set-ID bits, an access ACL sets the group bits, and every change but
/// the times moves ctime only. Through the descriptor, so the object
/// changed is the one made or checked, whatever became of its name.
pub(super) fn set_meta(
    fd: BorrowedFd<'_>,
    shown: &Path,
    m: &Meta,
    symlink: bool,
    is_root: bool,
) -> Result<()> {
    if is_root {
        sys::chown_fd(fd, m.uid, m.gid)
            .with_context(|| format!("cannot set the owner of {}", shown.display()))?;
    } else {
        // An owner may still give a file a group they belong to.
        sys::chown_fd(fd, u32::MAX, m.gid).ok();
    }
    if !symlink {
        let want: Vec<_> = m
            .xattrs
            .iter()
            .filter(|(k, _)| settable(k, is_root))
            .collect();
        // What the new object got by itself (a default ACL of its parent,
        // a security label) goes unless it was recorded.
        for (k, _) in live_xattrs(fd, shown, is_root)? {
            if !want.iter().any(|(w, _)| *w == k) {
                let c = sys::cstr(OsStr::from_bytes(&k))?;
                match sys::removexattr_fd(fd, &c) {
                    Ok(()) => {}
                    Err(_) if k.starts_with(b"security.") => {}
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!(
                                "cannot remove xattr {} of {}",
                                name_str(&k),
                                shown.display()
                            )
                        })
                    }
                }
            }
        }
        for (k, v) in want {
            let c = sys::cstr(OsStr::from_bytes(k))?;
            sys::setxattr_fd(fd, &c, v, 0).with_context(|| {
                format!("cannot set xattr {} of {}", name_str(k), shown.display())
            })?;
        }
        sys::chmod_fd(fd, m.mode)
            .with_context(|| format!("cannot set the mode of {}", shown.display()))?;
    }
    sys::utimens_fd(fd, timespec(m.atime_ns), timespec(m.mtime_ns))
        .with_context(|| format!("cannot set the times of {}", shown.display()))?;
    Ok(())
}

fn name_str(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn cname(name: &[u8]) -> Result<CString> {
    Ok(sys::cstr(OsStr::from_bytes(name))?)
}

fn kind_of(st: &sys::Stat) -> &'static str {
    crate::history::past::kind_name(st.st_mode)
}

fn same_object(a: &sys::Stat, b: &sys::Stat) -> bool {
    (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
}

/// Opens directory `name` in `dir` (O_PATH), never through a symlink.
fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> std::io::Result<OwnedFd> {
    sys::openat(
        dir,
        name,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
}

/// The names in directory `dir`, without "." and "..".
/// The names in `dest` that the staged tree does not hold (revert removes
/// them), the staging directory aside.
fn live_only(
    dest: &Live<'_>,
    stage: &Staging,
    staged: &[Vec<u8>],
) -> std::io::Result<Vec<Vec<u8>>> {
    let mut names = names_in(dest.fd.as_fd())?;
    names.retain(|n| n != stage.name.to_bytes() && !staged.contains(n));
    Ok(names)
}

fn names_in(dir: BorrowedFd<'_>) -> std::io::Result<Vec<Vec<u8>>> {
    let d = sys::reopen_dir(dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let mut buf = sys::DirBuf::new(32 << 10);
    let mut out = Vec::new();
    loop {
        let batch = sys::getdents(d.as_fd(), &mut buf)?;
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(
            batch
                .into_iter()
                .map(|e| e.name)
                .filter(|n| n != b"." && n != b".."),
        );
    }
}

/// Removes `name` in `dir` and, for a directory, all it holds: one name
/// at a time from descriptors, so a symlink put anywhere in the tree
/// meanwhile is removed itself, never followed.
fn remove_tree_at(dir: BorrowedFd<'_>, name: &CStr) -> std::io::Result<()> {
    let st = sys::fstatat(dir, name)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return sys::unlinkat(dir, name, 0);
    }
    let d = open_dir_at(dir, name)?;
    for n in names_in(d.as_fd())? {
        let c = CString::new(n).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        remove_tree_at(d.as_fd(), &c)?;
    }
    sys::unlinkat(dir, name, libc::AT_REMOVEDIR)
}

/// An object of the live tree, held open (O_PATH, a symlink itself) from
/// the moment it is looked at: what was checked is what is used, whatever
/// others do to its name meanwhile.
struct Live<'a> {
    /// Its directory, and its name there.
    dir: BorrowedFd<'a>,
    name: CString,
    fd: OwnedFd,
    st: sys::Stat,
    /// For messages.
    shown: PathBuf,
}

impl<'a> Live<'a> {
    /// What is at `name` in `dir` now, if anything (and if it can be
    /// looked at).
    fn at(dir: BorrowedFd<'a>, name: &CStr, shown: PathBuf) -> Option<Live<'a>> {
        let fd = sys::open_path(dir, name).ok()?;
        let st = sys::fstat(fd.as_fd()).ok()?;
        Some(Live {
            dir,
            name: name.to_owned(),
            fd,
            st,
            shown,
        })
    }

    fn is_dir(&self) -> bool {
        self.st.st_mode & libc::S_IFMT == libc::S_IFDIR
    }

    fn child(&self, name: &[u8]) -> Result<Option<Live<'_>>> {
        let shown = self.shown.join(OsStr::from_bytes(name));
        Ok(Live::at(self.fd.as_fd(), &cname(name)?, shown))
    }
}

/// Where one object of the result is made: `name` in `dir`, a directory
/// of the staging tree.
struct Spot<'a> {
    /// The staging directory the tree is built in.
    root: BorrowedFd<'a>,
    dir: BorrowedFd<'a>,
    name: CString,
    /// Its path below `root` (for a second name of the object).
    rel: PathBuf,
    /// For messages.
    shown: PathBuf,
}

impl<'a> Spot<'a> {
    /// Entry `name` of the directory `dir`, made at `self`.
    fn child<'b>(&self, dir: BorrowedFd<'b>, name: &[u8]) -> Result<Spot<'b>>
    where
        'a: 'b,
    {
        let os = OsStr::from_bytes(name);
        Ok(Spot {
            root: self.root,
            dir,
            name: cname(name)?,
            rel: self.rel.join(os),
            shown: self.shown.join(os),
        })
    }
}

/// Whether the live object has the attributes `node` describes (a
/// file's content judged by size and mtime: see `Builder::unchanged`).
fn same_as_live(node: &NodeInfo, live: &Live<'_>, is_root: bool) -> bool {
    let Ok(want) = Meta::of_node(node) else {
        return false;
    };
    let st = &live.st;
    let device = matches!(node.kind.as_str(), "char" | "block");
    node.kind == kind_of(st)
        && (!device || node.rdev == st.st_rdev)
        && node.size == st.st_size as u64
        && want.mode == st.st_mode & 0o7777
        && want.uid == st.st_uid
        && want.gid == st.st_gid
        && i128::from(want.mtime_ns)
            == i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec)
        && live_xattrs(live.fd.as_fd(), &live.shown, is_root).is_ok_and(|x| {
            let mut w = want.xattrs;
            w.retain(|(k, _)| settable(k, is_root));
            x == w
        })
}

/// A sink that compares what is written to it with a file's bytes.
struct SameBytes {
    file: std::fs::File,
    buf: Vec<u8>,
    same: bool,
}

impl SameBytes {
    fn new(file: std::fs::File) -> SameBytes {
        SameBytes {
            file,
            buf: Vec::new(),
            same: true,
        }
    }

    /// Whether every byte matched and the file has no more.
    fn finish(mut self) -> bool {
        use std::io::Read;
        let mut one = [0u8; 1];
        self.same && matches!(self.file.read(&mut one), Ok(0))
    }
}

impl std::io::Write for SameBytes {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        use std::io::Read;
        self.buf.resize(data.len(), 0);
        self.same = self.file.read_exact(&mut self.buf).is_ok() && self.buf == data;
        match self.same {
            true => Ok(data.len()),
            // Stops the download: the answer is known.
            false => Err(std::io::Error::other("the live file differs")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether this user may create and rename entries in `dir`.
fn may_write(dir: BorrowedFd<'_>) -> bool {
    sys::access_fd(dir, libc::W_OK | libc::X_OK).is_ok()
}

/// Puts the live object itself at `spot` (a hard link), never what a
/// symlink leads to; refused if its name meanwhile leads to another
/// object than the one checked.
fn link_live(live: &Live<'_>, spot: &Spot<'_>) -> Result<()> {
    sys::linkat(live.dir, &live.name, spot.dir, &spot.name).with_context(|| {
        format!(
            "cannot keep {} (link to {})",
            live.shown.display(),
            spot.shown.display()
        )
    })?;
    if sys::fstatat(spot.dir, &spot.name).is_ok_and(|st| same_object(&st, &live.st)) {
        return Ok(());
    }
    sys::unlinkat(spot.dir, &spot.name, 0).ok();
    bail!(
        "{} was replaced while it was restored; run the command again",
        live.shown.display()
    )
}

/// A second name, at `spot`, of the object made at `first` (below the
/// staging directory): resolved beneath it, through no symlink.
fn link_again(first: &Path, spot: &Spot<'_>) -> Result<()> {
    let fail = || format!("cannot link {}", spot.shown.display());
    let name = first.file_name().ok_or_else(|| anyhow!(fail()))?;
    let dir = match first.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => Some(
            sys::open_beneath(
                spot.root,
                &sys::cstr(p.as_os_str())?,
                libc::O_PATH | libc::O_DIRECTORY,
            )
            .with_context(fail)?,
        ),
        None => None,
    };
    let dir = dir.as_ref().map_or(spot.root, |d| d.as_fd());
    sys::linkat(dir, &sys::cstr(name)?, spot.dir, &spot.name).with_context(fail)
}

/// A directory the result is built in (`.chronofs-staging-PID-N`), held
/// open: everything below it is reached from this descriptor, so what
/// happens to its name (or its parent's entries) while it is built cannot
/// redirect a write.
struct Staging<'a> {
    parent: BorrowedFd<'a>,
    name: CString,
    fd: OwnedFd,
    st: sys::Stat,
    shown: PathBuf,
}

impl<'a> Staging<'a> {
    /// A new staging directory in `parent` (`shown` in messages). What an
    /// earlier run whose process is gone left there (a crash or a power
    /// cut in the middle) is removed first: nothing refers to it.
    fn make(parent: BorrowedFd<'a>, shown: &Path) -> Result<Staging<'a>> {
        remove_stale_staging(parent, shown);
        let mut n = 0u32;
        loop {
            let mut raw = crate::history::past::STAGING_PREFIX.to_vec();
            raw.extend_from_slice(format!("{}-{n}", std::process::id()).as_bytes());
            n += 1;
            let name = cname(&raw)?;
            let shown = shown.join(OsStr::from_bytes(&raw));
            match sys::mkdirat(parent, &name, NEW_DIR_MODE) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create {}", shown.display()))
                }
            }
            let fd = open_dir_at(parent, &name)
                .with_context(|| format!("cannot open {}", shown.display()))?;
            let st = sys::fstat(fd.as_fd())?;
            // Whoever may write `parent` could have put their own
            // directory at the name between mkdir and open.
            if st.st_uid != sys::geteuid() {
                bail!(
                    "{} was replaced by another user's directory while it was made",
                    shown.display()
                );
            }
            return Ok(Staging {
                parent,
                name,
                fd,
                st,
                shown,
            });
        }
    }

    /// The spot for an object named `name` right in the staging directory.
    fn spot(&self, name: &[u8]) -> Result<Spot<'_>> {
        let os = OsStr::from_bytes(name);
        Ok(Spot {
            root: self.fd.as_fd(),
            dir: self.fd.as_fd(),
            name: cname(name)?,
            rel: PathBuf::from(os),
            shown: self.shown.join(os),
        })
    }

    /// Puts the finished entry `name` at `to` in `to_dir` (`shown` in
    /// messages): a rename when nothing is there, else an exchange (one
    /// step: no instant without it) and the removal of what was there.
    fn commit(&self, name: &CStr, to_dir: BorrowedFd<'_>, to: &CStr, shown: &Path) -> Result<()> {
        let exchange = sys::fstatat(to_dir, to).is_ok();
        let flags = if exchange {
            libc::RENAME_EXCHANGE
        } else {
            libc::RENAME_NOREPLACE
        };
        sys::renameat2(self.fd.as_fd(), name, to_dir, to, flags)
            .with_context(|| format!("cannot move the restored copy to {}", shown.display()))?;
        if exchange {
            if let Err(e) = remove_tree_at(self.fd.as_fd(), name) {
                eprintln!(
                    "chronofs: {} is in place; the old tree could not all be removed from {}: {e}",
                    shown.display(),
                    self.shown.display()
                );
            }
        }
        Ok(())
    }

    /// Called once the tree is built, before the swaps. A replaced
    /// object's last way runs through this directory (it is removed from
    /// here), and history lets a user read its past only along a way they
    /// may search: made 0700, it hid a shared directory's whole past from
    /// everyone but root after root reverted it. It gets the mode of
    /// `like` (the directory the swaps go to), no further open than 0755,
    /// and when root runs the command its owner and group too: a way
    /// through a root-owned copy of alice's 0700 home would be closed to
    /// alice.
    fn open_up_like(&self, like: BorrowedFd<'_>) {
        let open = sys::fstat(like).and_then(|d| {
            if sys::geteuid() == 0 {
                sys::chown_fd(self.fd.as_fd(), d.st_uid, d.st_gid)?;
            }
            sys::chmod_fd(self.fd.as_fd(), d.st_mode & 0o755 | 0o700)
        });
        if let Err(e) = open {
            tracing::debug!("{}: {e}", self.shown.display());
        }
    }

    /// Removes the (emptied) staging directory; its name only if it is
    /// still this one.
    fn remove(&self) -> std::io::Result<()> {
        match sys::fstatat(self.parent, &self.name) {
            Ok(st) if same_object(&st, &self.st) => {
                sys::unlinkat(self.parent, &self.name, libc::AT_REMOVEDIR)
            }
            _ => Err(std::io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    /// After a failure: removes what was built, and says that nothing was
    /// changed.
    fn abandon(&self, e: anyhow::Error) -> anyhow::Error {
        if let Err(r) = self.clear() {
            return e.context(format!(
                "nothing was changed, but the unfinished copy {} could not be removed: {r}",
                self.shown.display()
            ));
        }
        e.context("nothing was changed")
    }

    /// Removes what was built and the staging directory.
    fn clear(&self) -> std::io::Result<()> {
        names_in(self.fd.as_fd())?.into_iter().try_for_each(|n| {
            let c = CString::new(n).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
            remove_tree_at(self.fd.as_fd(), &c)
        })?;
        self.remove()
    }
}

/// Writes a file's bytes leaving its zero blocks unwritten (holes, as
/// `cp --sparse=auto` does): a restored sparse file took its full size on
/// the disk.
struct Sparse<'f> {
    file: &'f mut std::fs::File,
    at: u64,
}

impl<'f> Sparse<'f> {
    const BLOCK: usize = 4096;

    fn new(file: &'f mut std::fs::File) -> Sparse<'f> {
        Sparse { file, at: 0 }
    }

    /// Gives the file its length (a trailing hole has no write to set it).
    fn finish(self) -> std::io::Result<()> {
        self.file.set_len(self.at)
    }
}

impl std::io::Write for Sparse<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        for piece in buf.chunks(Self::BLOCK) {
            if piece.iter().any(|&b| b != 0) {
                self.file.write_all_at(piece, self.at)?;
            }
            self.at += piece.len() as u64;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Removes the staging trees in `dir` whose process (the pid in their
/// name) is gone. Best effort: what cannot go stays, and says so.
fn remove_stale_staging(dir: BorrowedFd<'_>, shown: &Path) {
    let Ok(names) = names_in(dir) else {
        return;
    };
    let prefix = crate::history::past::STAGING_PREFIX;
    for name in names {
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let pid = rest.split(|&b| b == b'-').next().unwrap_or_default();
        let alive = std::str::from_utf8(pid)
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| Path::new(&format!("/proc/{p}")).exists());
        if alive {
            continue;
        }
        let removed = CString::new(name.clone())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
            .and_then(|c| remove_tree_at(dir, &c));
        if let Err(e) = removed {
            eprintln!(
                "chronofs: {} (left by an interrupted run) stays: {e}",
                shown.join(OsStr::from_bytes(&name)).display()
            );
        }
    }
}

/// A file with no name in `dir` (O_TMPFILE), gone when closed.
fn unnamed_file_at(dir: BorrowedFd<'_>) -> std::io::Result<std::fs::File> {
    sys::openat(dir, c".", libc::O_TMPFILE | libc::O_RDWR, 0o600).map(std::fs::File::from)
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
    /// What is brought back, as history names it at `at`.
    src: &'a Components,
    at: &'a At,
    prune: bool,
    /// Objects already written, by object id, and where (below the
    /// staging directory): a second name of one is a hard link to the
    /// first.
    seen: HashMap<crate::history::ObjectId, PathBuf>,
    progress: Progress,
    is_root: bool,
}

impl Builder<'_> {
    fn run(&mut self, root: &NodeInfo, dest: &Path) -> Result<()> {
        let (Some(parent), Some(name)) = (dest.parent(), dest.file_name()) else {
            bail!("cannot restore {}", dest.display());
        };
        // The only lookup by path: from here on everything is reached
        // from this descriptor one name at a time, never through a
        // symlink, so no directory someone else may write can redirect a
        // write.
        let pdir = sys::openat(
            sys::CWD,
            &sys::cstr(parent.as_os_str())?,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )
        .with_context(|| format!("cannot open {}", parent.display()))?;
        let pdir = pdir.as_fd();
        self.build(root, dest, pdir, &sys::cstr(name)?)?;
        make_durable(self.t, pdir)
    }

    fn build(
        &mut self,
        root: &NodeInfo,
        dest: &Path,
        pdir: BorrowedFd<'_>,
        name: &CStr,
    ) -> Result<()> {
        if self.left_alone(root, dest) {
            return Ok(());
        }
        let live = Live::at(pdir, name, dest.to_path_buf());
        if root.kind != "dir"
            && live
                .as_ref()
                .is_some_and(|l| self.unchanged(self.src, root, l))
        {
            return Ok(());
        }
        if let Some(l) = live
            .as_ref()
            .filter(|l| root.kind == "file" && kind_of(&l.st) == "file")
        {
            // One file over a live one: written in place, so it stays the
            // same object (its hard links, its history's numbering) and a
            // user who may write the file needs no right on its directory.
            return self.file_in_place(root, pdir, l);
        }
        // A mount's root cannot be renamed, a user may own a directory in
        // one they cannot write, and `revert .` must not leave the caller's
        // shell in a removed directory: then the entries are staged inside
        // the target and swapped in one by one.
        if let Some(l) = live.as_ref().filter(|l| {
            l.is_dir()
                && (sys::fstat(pdir).is_ok_and(|pm| pm.st_dev != l.st.st_dev)
                    || !may_write(pdir)
                    || std::env::current_dir().is_ok_and(|c| c.starts_with(dest)))
        }) {
            // Staging inside writes only entries: a symlink's or a file's
            // would have been nothing, then its attributes given to the
            // directory (and revert removed every entry).
            if root.kind != "dir" {
                bail!("{} is a directory now; use --to DEST", dest.display());
            }
            return self.run_in_root(root, l);
        }
        let parent = dest.parent().unwrap_or(dest);
        let stage = Staging::make(pdir, parent)?;
        let spot = stage.spot(name.to_bytes())?;
        if let Err(e) = self
            .node(self.src, root, &spot, live.as_ref())
            .and_then(|()| make_durable(self.t, pdir))
        {
            return Err(stage.abandon(e));
        }
        stage.open_up_like(pdir);
        if let Err(e) = stage.commit(name, pdir, name, dest) {
            return Err(stage.abandon(e));
        }
        if let Err(e) = stage.remove() {
            eprintln!(
                "chronofs: {} is in place; {} stays: {e}",
                dest.display(),
                stage.shown.display()
            );
        }
        Ok(())
    }

    fn file_in_place(
        &mut self,
        node: &NodeInfo,
        pdir: BorrowedFd<'_>,
        live: &Live<'_>,
    ) -> Result<()> {
        // Only the owner may set a mode, xattrs or chosen times: another
        // writer restores the content alone, and only where the rest
        // already is as recorded (it failed after the content with EPERM).
        let owner = self.is_root || sys::geteuid() == live.st.st_uid;
        if !owner {
            let want = Meta::of_node(node)?;
            let now = Meta::of_live(live, false)?;
            let mut want_xattrs = want.xattrs;
            want_xattrs.retain(|(k, _)| settable(k, false));
            // A write by a non-owner clears set-ID bits: the result would
            // not be the recorded mode either.
            let set_id = want.mode & (libc::S_ISUID | libc::S_ISGID) != 0;
            if want.mode != now.mode || want_xattrs != now.xattrs || set_id {
                bail!(
                    "{} has another mode or xattrs than at that time, and only its owner may \
                     set them; nothing was written",
                    live.shown.display()
                );
            }
        }
        // The content is received whole first: a read refused (EACCES) or
        // failing part way (a damaged chunk) leaves DEST as it was. Beside
        // DEST where its directory allows, else in the temporary directory
        // (a user who may write the file needs no right on its directory).
        let mut received = unnamed_file_at(pdir)
            .or_else(|_| unnamed_file(&std::env::temp_dir()))
            .context("cannot make a temporary file for the content")?;
        self.content(self.src, node, &mut received)?;
        // The download takes time, and whoever may write DEST's directory
        // may have put something else (a symlink to a file of the caller's)
        // at its name: only the file checked is written, through the
        // descriptor held since, and only while the name is still its.
        let shown = &live.shown;
        if !sys::fstatat(pdir, &live.name).is_ok_and(|st| same_object(&st, &live.st)) {
            bail!(
                "{} was replaced while it was restored; nothing was written",
                shown.display()
            );
        }
        let out = sys::reopen(live.fd.as_fd(), libc::O_WRONLY | libc::O_NOCTTY)
            .with_context(|| format!("cannot write {}", shown.display()))?;
        sys::ftruncate(out.as_fd(), 0)
            .with_context(|| format!("cannot write {}", shown.display()))?;
        let mut out = std::fs::File::from(out);
        use std::io::Seek;
        received.rewind()?;
        let mut holey = Sparse::new(&mut out);
        std::io::copy(&mut received, &mut holey)
            .and_then(|_| holey.finish())
            .with_context(|| format!("cannot write {}", shown.display()))?;
        drop(out);
        if owner {
            set_meta(
                live.fd.as_fd(),
                shown,
                &Meta::of_node(node)?,
                false,
                self.is_root,
            )?;
        }
        self.progress.add(1, shown);
        Ok(())
    }

    /// Writes the content of `node`, the file at `path` then, to `f`.
    /// The daemon reads the version the path shows at the instant when it
    /// answers: one a prune removed since the tree was read would be
    /// another one, and its bytes would go with `node`'s attributes.
    fn content(&self, path: &Components, node: &NodeInfo, f: &mut std::fs::File) -> Result<()> {
        let mut buf = std::io::BufWriter::with_capacity(1 << 20, Sparse::new(f));
        let read = self.t.client().read(path, self.at, None, &mut buf)?;
        buf.into_inner().map_err(|e| e.into_error())?.finish()?;
        if !same_state(node, &read) {
            bail!(
                "{} changed in history while it was restored (a prune?); run the command again",
                crate::history::past::show_path(path)
            );
        }
        Ok(())
    }

    /// In a sticky directory only a file's owner (or the directory's,
    /// or root) may replace it: the swap of another user's file would
    /// fail half-way.
    fn check_replaceable(&self, names: &[Vec<u8>], stage: &Staging, dest: &Live<'_>) -> Result<()> {
        let euid = sys::geteuid();
        if self.is_root || dest.st.st_mode & libc::S_ISVTX == 0 || euid == dest.st.st_uid {
            return Ok(());
        }
        let others = |name: &[u8], verb: &str| -> Result<()> {
            bail!(
                "cannot {verb} {}: another user's, in a sticky directory",
                dest.shown.join(OsStr::from_bytes(name)).display()
            )
        };
        for name in names {
            let c = cname(name)?;
            let (Ok(staged), Ok(live)) = (
                sys::fstatat(stage.fd.as_fd(), &c),
                sys::fstatat(dest.fd.as_fd(), &c),
            ) else {
                continue;
            };
            if live.st_uid != euid && !same_object(&live, &staged) {
                others(name, "replace")?;
            }
        }
        if !self.prune {
            return Ok(());
        }
        for n in live_only(dest, stage, names)? {
            if sys::fstatat(dest.fd.as_fd(), &cname(&n)?).is_ok_and(|l| l.st_uid != euid) {
                others(&n, "remove")?;
            }
        }
        Ok(())
    }

    fn run_in_root(&mut self, root: &NodeInfo, dest: &Live<'_>) -> Result<()> {
        let stage = Staging::make(dest.fd.as_fd(), &dest.shown)?;
        let top = Spot {
            root: stage.fd.as_fd(),
            dir: stage.fd.as_fd(),
            name: c".".to_owned(),
            rel: PathBuf::new(),
            shown: stage.shown.clone(),
        };
        // Over the live directory, so an unchanged entry stays the object
        // it is (given no live directory, every entry was made anew: device
        // files dropped, sparse files filled, hard links split), but not
        // what only it has: that stays where it is (restore) or goes below
        // (revert), and the staging directory in it is not an entry.
        let names = match self
            .fill(self.src, root, &top, Some(dest), false)
            .and_then(|n| make_durable(self.t, dest.fd.as_fd()).map(|()| n))
        {
            Ok(n) => n,
            Err(e) => return Err(stage.abandon(e)),
        };
        // Found before anything is swapped, so that nothing changes:
        // running again could not finish it.
        if let Err(e) = self.check_replaceable(&names, &stage, dest) {
            return Err(stage.abandon(e));
        }
        stage.open_up_like(dest.fd.as_fd());
        let swap = |name: &Vec<u8>| -> Result<()> {
            let c = cname(name)?;
            let Ok(staged) = sys::fstatat(stage.fd.as_fd(), &c) else {
                return Ok(());
            };
            if sys::fstatat(dest.fd.as_fd(), &c).is_ok_and(|l| same_object(&l, &staged)) {
                // The live object itself, linked: it is in place already.
                return Ok(sys::unlinkat(stage.fd.as_fd(), &c, 0)?);
            }
            let shown = dest.shown.join(OsStr::from_bytes(name));
            stage.commit(&c, dest.fd.as_fd(), &c, &shown)
        };
        if let Err(e) = names.iter().try_for_each(swap) {
            // Entries swapped in stay; the rest is not left visible in
            // the root as the staging directory.
            let left = match stage.clear() {
                Ok(()) => String::new(),
                Err(r) => format!("; {} could not be removed: {r}", stage.shown.display()),
            };
            return Err(e.context(format!(
                "{} is partly restored (run the command again to finish){left}",
                dest.shown.display()
            )));
        }
        stage.remove().ok();
        if self.prune {
            for n in live_only(dest, &stage, &names)? {
                let c = cname(&n)?;
                remove_tree_at(dest.fd.as_fd(), &c).with_context(|| {
                    format!(
                        "cannot remove {}",
                        dest.shown.join(OsStr::from_bytes(&n)).display()
                    )
                })?;
                self.progress.add(1, &dest.shown);
            }
        }
        // Only its owner may set a directory's mode and times: another
        // user's revert of a shared (sticky) directory swapped its own
        // entries in, then failed here.
        if !self.is_root && sys::geteuid() != dest.st.st_uid {
            eprintln!(
                "chronofs: {}: its own mode and times are left as they are (only its owner may set them)",
                dest.shown.display()
            );
            return Ok(());
        }
        set_meta(
            dest.fd.as_fd(),
            &dest.shown,
            &Meta::of_node(root)?,
            false,
            self.is_root,
        )
    }

    /// Lost and unrecorded content cannot be brought back: say so, and
    /// keep what is live.
    fn left_alone(&self, node: &NodeInfo, shown: &Path) -> bool {
        let why = if node.is_lost() {
            "content lost (damaged in the store)"
        } else if node.is_unrecorded() {
            "content not versioned by policy"
        } else {
            return false;
        };
        eprintln!("chronofs: {}: {why}; left as it is", shown.display());
        true
    }

    /// Writes `node` (at `path` in history) at `spot`; `live` is what
    /// stands at its place now, if anything.
    fn node(
        &mut self,
        path: &Components,
        node: &NodeInfo,
        spot: &Spot<'_>,
        live: Option<&Live<'_>>,
    ) -> Result<()> {
        let kind = node.kind.as_str();
        if self.left_alone(node, &spot.shown) {
            if let Some(l) = live {
                self.carry(l, spot)?;
            }
            return Ok(());
        }
        let obj = node.obj;
        if kind != "dir" {
            if let Some(first) = obj.and_then(|o| self.seen.get(&o)) {
                return link_again(first, spot);
            }
        }
        let meta = Meta::of_node(node)?;
        let created = |r: std::io::Result<()>| {
            r.and_then(|()| sys::open_path(spot.dir, &spot.name))
                .with_context(|| format!("cannot create {}", spot.shown.display()))
        };
        match kind {
            "file" => {
                if !self.kept_live(path, node, live, spot) {
                    let f = sys::openat(
                        spot.dir,
                        &spot.name,
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                        NEW_FILE_MODE,
                    )
                    .with_context(|| format!("cannot write {}", spot.shown.display()))?;
                    let mut f = std::fs::File::from(f);
                    self.content(path, node, &mut f)?;
                    drop(f);
                    let fd = created(Ok(()))?;
                    set_meta(fd.as_fd(), &spot.shown, &meta, false, self.is_root)?;
                    self.progress.add(1, &spot.shown);
                }
            }
            "dir" => {
                let (fd, _) = self.entries(path, node, spot, live)?;
                set_meta(fd.as_fd(), &spot.shown, &meta, false, self.is_root)?;
                self.progress.add(1, &spot.shown);
            }
            "symlink" => {
                let target = node.target_bytes().unwrap_or_default();
                let target = cname(&target)?;
                let fd = created(sys::symlinkat(&target, spot.dir, &spot.name))?;
                set_meta(fd.as_fd(), &spot.shown, &meta, true, self.is_root)?;
                self.progress.add(1, &spot.shown);
            }
            "fifo" | "char" | "block" | "socket" => {
                if !self.kept_live(path, node, live, spot) {
                    let kind_bits = match kind {
                        "fifo" => libc::S_IFIFO,
                        "char" => libc::S_IFCHR,
                        "block" => libc::S_IFBLK,
                        _ => libc::S_IFSOCK,
                    };
                    let fd = created(sys::mknodat(
                        spot.dir,
                        &spot.name,
                        kind_bits | NEW_FILE_MODE,
                        node.rdev,
                    ))?;
                    set_meta(fd.as_fd(), &spot.shown, &meta, false, self.is_root)?;
                    self.progress.add(1, &spot.shown);
                }
            }
            other => {
                eprintln!(
                    "chronofs: skipping {} ({other} files are not restored)",
                    spot.shown.display()
                );
                if let Some(l) = live {
                    self.carry(l, spot)?;
                }
                return Ok(());
            }
        }
        if let Some(o) = obj {
            self.seen.insert(o, spot.rel.clone());
        }
        Ok(())
    }

    /// Whether the live object, unchanged since, is linked at `spot`: it
    /// keeps its identity (and its history) instead of becoming a copy.
    fn kept_live(
        &self,
        path: &Components,
        node: &NodeInfo,
        live: Option<&Live<'_>>,
        spot: &Spot<'_>,
    ) -> bool {
        live.is_some_and(|l| self.unchanged(path, node, l) && link_live(l, spot).is_ok())
    }

    /// Whether the live object already is `node`, the object at `path`
    /// then. A file's content counts as unchanged by its size and mtime
    /// only where history says the live file is that version untouched
    /// since: an mtime can be set back (`touch -d`, `cp -p`, `tar x`), and
    /// a restore skipped such a file, rewritten, as already restored.
    /// Otherwise its bytes are compared with the version's.
    fn unchanged(&self, path: &Components, node: &NodeInfo, live: &Live<'_>) -> bool {
        if !same_as_live(node, live, self.is_root) {
            return false;
        }
        if node.kind != "file" || node.source == "live" || node.size == 0 {
            return true;
        }
        let same = sys::reopen(live.fd.as_fd(), libc::O_RDONLY | libc::O_NOCTTY)
            .map_err(anyhow::Error::from)
            .and_then(|fd| {
                let mut cmp = SameBytes::new(std::fs::File::from(fd));
                let read = self.t.client().read(path, self.at, None, &mut cmp)?;
                Ok((read.obj, read.seq) == (node.obj, node.seq) && cmp.finish())
            });
        same.unwrap_or(false)
    }

    /// Makes directory `spot` with the entries of `node` (see `fill`).
    /// Returns it, held open, and the names written.
    fn entries(
        &mut self,
        path: &Components,
        node: &NodeInfo,
        spot: &Spot<'_>,
        live: Option<&Live<'_>>,
    ) -> Result<(OwnedFd, Vec<Vec<u8>>)> {
        let fd = sys::mkdirat(spot.dir, &spot.name, NEW_DIR_MODE)
            .and_then(|()| open_dir_at(spot.dir, &spot.name))
            .with_context(|| format!("cannot create {}", spot.shown.display()))?;
        let here = Spot {
            root: spot.root,
            dir: fd.as_fd(),
            name: spot.name.clone(),
            rel: spot.rel.clone(),
            shown: spot.shown.clone(),
        };
        let names = self.fill(path, node, &here, live, true)?;
        Ok((fd, names))
    }

    /// Writes the entries of `node` into the directory `dir.dir`, each
    /// over what `live` holds at its name; then, with `live_only`,
    /// (restore) whatever only the live directory has, or (revert) counts
    /// it as removed. Returns the names written.
    fn fill(
        &mut self,
        path: &Components,
        node: &NodeInfo,
        dir: &Spot<'_>,
        live: Option<&Live<'_>>,
        live_only: bool,
    ) -> Result<Vec<Vec<u8>>> {
        let live = live.filter(|l| l.is_dir());
        let mut names = Vec::new();
        for e in node.entries.iter().flatten() {
            let name = e.name_bytes();
            let spot = dir.child(dir.dir, &name)?;
            let live_child = match live {
                Some(l) => l.child(&name)?,
                None => None,
            };
            let mut child = path.clone();
            child.push(name.clone());
            self.node(&child, e, &spot, live_child.as_ref())?;
            names.push(name);
        }
        if let Some(l) = live.filter(|_| live_only) {
            for n in names_in(l.fd.as_fd())
                .with_context(|| format!("cannot list {}", l.shown.display()))?
            {
                if names.contains(&n) {
                    continue;
                }
                if self.prune {
                    self.progress.add(1, &l.shown);
                } else if let Some(lc) = l.child(&n)? {
                    self.carry(&lc, &dir.child(dir.dir, &n)?)?;
                }
            }
        }
        Ok(names)
    }

    /// Puts the live object `live` at `spot` as it is: the object itself
    /// (a hard link), or for a directory a new one with its attributes and
    /// its entries carried the same way.
    fn carry(&mut self, live: &Live<'_>, spot: &Spot<'_>) -> Result<()> {
        if !live.is_dir() {
            return link_live(live, spot);
        }
        let fd = sys::mkdirat(spot.dir, &spot.name, NEW_DIR_MODE)
            .and_then(|()| open_dir_at(spot.dir, &spot.name))
            .with_context(|| format!("cannot create {}", spot.shown.display()))?;
        for n in names_in(live.fd.as_fd())
            .with_context(|| format!("cannot list {}", live.shown.display()))?
        {
            if let Some(c) = live.child(&n)? {
                self.carry(&c, &spot.child(fd.as_fd(), &n)?)?;
            }
        }
        set_meta(
            fd.as_fd(),
            &spot.shown,
            &Meta::of_live(live, self.is_root)?,
            false,
            self.is_root,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{ObjectId, Seq};

    fn live(obj: u64) -> NodeInfo {
        NodeInfo {
            obj: Some(ObjectId::new(obj)),
            source: "live".into(),
            kind: "file".into(),
            mode: 0o644,
            size: 64 << 20,
            mtime_ns: 1_700_000_000_123_456_789,
            ..Default::default()
        }
    }

    fn recorded(from: &NodeInfo, seq: u64, cause: &str) -> NodeInfo {
        NodeInfo {
            source: "history".into(),
            seq: Some(Seq::new(seq)),
            cause: Some(cause.into()),
            ..from.clone()
        }
    }

    /// The race of tests/restore.rs's live file written during its
    /// download: the file's first write-open came between the tree (live,
    /// no version) and the read (its baseline). The restore failed with
    /// "changed in history while it was restored".
    #[test]
    fn a_baseline_of_the_live_file_the_tree_showed_is_that_file() {
        let tree = live(2);
        assert!(same_state(&tree, &tree));
        assert!(same_state(&tree, &recorded(&tree, 5, "baseline")));
        let unknown = NodeInfo {
            obj: None,
            ..live(2)
        };
        assert!(same_state(&unknown, &recorded(&tree, 5, "baseline")));
    }

    #[test]
    fn another_state_than_the_tree_showed_is_not_it() {
        let tree = live(2);
        let base = recorded(&tree, 5, "baseline");
        let changed = NodeInfo {
            mtime_ns: tree.mtime_ns + 1,
            ..base.clone()
        };
        assert!(!same_state(&tree, &changed), "changed behind the mount");
        let grown = NodeInfo {
            size: tree.size + 1,
            ..base.clone()
        };
        assert!(!same_state(&tree, &grown));
        assert!(!same_state(&tree, &recorded(&tree, 5, "write")));
        assert!(!same_state(&tree, &recorded(&live(3), 5, "baseline")));
        // A version pruned between the tree and the read (the check's
        // first purpose) is another version, whatever its attributes.
        let then = recorded(&tree, 5, "baseline");
        assert!(!same_state(&then, &recorded(&tree, 6, "write")));
        assert!(!same_state(&then, &recorded(&tree, 7, "baseline")));
    }
}
