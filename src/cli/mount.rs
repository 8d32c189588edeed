//! `chronofs mount` and `chronofs umount`.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use super::mount_host::MountHost;
use super::options::{Ingest, Uring};
use super::{exit, MountOptions};
use crate::branch::{BranchId, DirBranch};
use crate::capture::retention::{Cleaner, PolicyCell};
use crate::capture::{Capture, CaptureConfig};
use crate::control;
use crate::fuse::{AdapterConfig, ChronoFuse, MountSpec, Mounted};
use crate::history::{History, HistoryHandle};
use crate::store::Store;
use crate::sys;
use crate::union::spec::UnionSpec;
use crate::vfs::{Vfs, VfsConfig};
use std::sync::Arc;

pub(super) const STORE_DIR_NAME: &str = ".chronofs";

/// Where things are, after validation.
struct Plan {
    src: PathBuf,
    mnt: PathBuf,
    store: PathBuf,
    /// The store's name in SRC's root when it lives there (hidden).
    reserved: Option<OsString>,
    /// A union: every branch top-down and whether it is writable (`src`
    /// is the one of them the store lives in); empty for one SRC.
    union: Vec<(PathBuf, bool)>,
}

/// Mounts SRC at MNT. `ready` (`--ready-fd`) is told when the mount is
/// ready, or why it failed.
pub fn run(
    src: &Path,
    mnt: &Path,
    opts: MountOptions,
    foreground: bool,
    ready: Option<std::fs::File>,
) -> i32 {
    let plan = match validate(src, mnt, &opts) {
        Ok(p) => p,
        Err(e) => {
            if let Some(mut w) = ready.as_ref() {
                let _ = writeln!(w, "{}", super::one_line(&e));
            }
            eprintln!("chronofs: {}", super::one_line(&e));
            return match e.is::<super::UsageError>() {
                true => exit::USAGE,
                false => exit::FAILURE,
            };
        }
    };
    let notify = Notify {
        daemon: None,
        ready,
    };
    if foreground {
        return match serve(&plan, &opts, notify) {
            Ok(()) => exit::OK,
            Err(e) => {
                eprintln!("chronofs: {}", super::one_line(&e));
                exit::FAILURE
            }
        };
    }
    daemonize(&plan, &opts, notify)
}

/// Who hears that the mount is ready: the parent of a daemon (a pipe read
/// to its end: "ok" or the error) and the `--ready-fd` descriptor (one
/// line).
struct Notify {
    daemon: Option<std::fs::File>,
    ready: Option<std::fs::File>,
}

impl Notify {
    fn report(&mut self, msg: &str) {
        if let Some(mut w) = self.daemon.take() {
            let _ = w.write_all(msg.as_bytes());
        }
        if let Some(mut w) = self.ready.take() {
            let _ = writeln!(w, "{msg}");
        }
    }
}

/// Forks; the parent returns only once the child reports the mount ready
/// (exit 0) or failed (its one-line error, exit 1).
fn daemonize(plan: &Plan, opts: &MountOptions, mut notify: Notify) -> i32 {
    let (mut reader, writer) = match sys::pipe() {
        Ok((r, w)) => (std::fs::File::from(r), std::fs::File::from(w)),
        Err(e) => {
            eprintln!("chronofs: cannot create a pipe: {e}");
            return exit::FAILURE;
        }
    };
    match sys::fork() {
        Err(e) => {
            eprintln!("chronofs: cannot fork: {e}");
            exit::FAILURE
        }
        Ok(sys::Forked::Parent(pid)) => {
            drop(writer);
            let mut report = String::new();
            let _ = reader.read_to_string(&mut report);
            if report == "ok" {
                return exit::OK;
            }
            let msg = report.trim();
            if msg.is_empty() {
                let status = sys::waitpid(pid).unwrap_or(-1);
                eprintln!("chronofs: the daemon exited before mounting (status {status})");
            } else {
                eprintln!("chronofs: {msg}");
            }
            exit::FAILURE
        }
        Ok(sys::Forked::Child) => {
            drop(reader);
            notify.daemon = Some(writer);
            if let Err(e) = sys::setsid() {
                notify.report(&format!("cannot start a session: {e}"));
                return exit::FAILURE;
            }
            match serve(plan, opts, notify) {
                Ok(()) => exit::OK,
                Err(e) => {
                    tracing::error!("{e:#}");
                    exit::FAILURE
                }
            }
        }
    }
}

fn is_enotconn(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOTCONN)
}

/// The file system type mounted on `path`, if `path` is a mount point.
fn mount_type_at(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let target = path.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        let (pre, post) = line.split_once(" - ")?;
        let mount_point = pre.split(' ').nth(4)?;
        if unescape_mountinfo(mount_point).as_slice() == target {
            // Later lines are mounted on top of earlier ones.
            found = post.split(' ').next().map(str::to_string);
        }
    }
    found
}

fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn validate(src: &Path, mnt: &Path, opts: &MountOptions) -> Result<Plan> {
    if sys::geteuid() != 0 {
        bail!("chronofs mount must run as root: it serves every user under their own identity");
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse does not exist: load the fuse kernel module (modprobe fuse)");
    }
    // statfs always reaches the daemon; a stat may be answered from the
    // kernel's attribute cache for a while after the daemon died. Cleared
    // before SRC is looked at: with MNT = SRC, a crashed daemon's mount
    // hides the source.
    let dead = |r: std::io::Result<()>| matches!(r, Err(e) if is_enotconn(&e));
    if dead(std::fs::metadata(mnt).map(drop)) || dead(sys::statvfs_flags(mnt).map(drop)) {
        clear_dead_mount(mnt)?;
    }
    let union = union_branches(src, mnt)?;
    let src = match union.iter().find(|(_, rw)| *rw).or(union.first()) {
        Some((primary, _)) => primary.as_path(),
        None => src,
    };
    let src = std::fs::canonicalize(src).with_context(|| format!("source {}", src.display()))?;
    let meta = std::fs::metadata(&src).with_context(|| format!("source {}", src.display()))?;
    if !meta.is_dir() {
        bail!("source {} is not a directory", src.display());
    }
    std::fs::read_dir(&src).with_context(|| format!("source {} is not readable", src.display()))?;
    let mnt =
        std::fs::canonicalize(mnt).with_context(|| format!("mount point {}", mnt.display()))?;
    if !std::fs::metadata(&mnt)?.is_dir() {
        bail!("mount point {} is not a directory", mnt.display());
    }
    if let Some(fstype) = mount_type_at(&mnt) {
        if fstype.starts_with("fuse") {
            bail!("{} is already mounted ({fstype})", mnt.display());
        }
    }
    if src != mnt && src.starts_with(&mnt) {
        bail!(
            "source {} is inside mount point {}",
            src.display(),
            mnt.display()
        );
    }
    if src != mnt && mnt.starts_with(&src) {
        bail!(
            "mount point {} is inside source {}: the mount would contain itself",
            mnt.display(),
            src.display()
        );
    }
    if !union.is_empty() && !union.iter().any(|(_, rw)| *rw) && opts.store.is_none() {
        bail!(
            "every branch is read-only: give the store (inode numbers, history) a place with -o store=DIR"
        );
    }
    if let Some(dir) = &opts.store {
        let dir = absolute(dir)?;
        // The store directory itself is made if need be, but a missing
        // parent is more likely a typo than a wish for a new tree.
        if let Some(parent) = dir.parent().filter(|p| !p.is_dir()) {
            bail!(
                "store {}: {} is not a directory (chronofs makes the store's own directory only)",
                dir.display(),
                parent.display()
            );
        }
        if let Some((b, _)) = union.iter().find(|(b, _)| dir.starts_with(b) && *b != src) {
            bail!(
                "store {} is inside branch {}: chronofs writes only to the read-write branch it keeps the store in",
                dir.display(),
                b.display()
            );
        }
    }
    let (store, reserved) = match &opts.store {
        None => (
            src.join(STORE_DIR_NAME),
            Some(OsString::from(STORE_DIR_NAME)),
        ),
        Some(dir) => {
            let dir = absolute(dir)?;
            if dir.starts_with(&src) && dir != src.join(STORE_DIR_NAME) {
                bail!(
                    "store {} is inside source {}: it would be visible through the mount (use {}/{STORE_DIR_NAME} or a directory outside)",
                    dir.display(),
                    src.display(),
                    src.display()
                );
            }
            let reserved =
                (dir == src.join(STORE_DIR_NAME)).then(|| OsString::from(STORE_DIR_NAME));
            // SRC/.chronofs is hidden in the mount even where MNT = SRC:
            // the default store, spelled out.
            if dir.starts_with(&mnt) && reserved.is_none() {
                bail!(
                    "store {} is inside mount point {}",
                    dir.display(),
                    mnt.display()
                );
            }
            (dir, reserved)
        }
    };
    Ok(Plan {
        src,
        mnt,
        store,
        reserved,
        union,
    })
}

/// `BR1[=rw|=ro]:BR2[=ro]:...` as branches, top first, checked against
/// each other and the mount point (`union::spec`); an argument with no
/// `:` or `=` is one SRC (empty result), as it always was.
fn union_branches(arg: &Path, mnt: &Path) -> Result<Vec<(PathBuf, bool)>> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = arg.as_os_str().as_bytes();
    if !bytes.iter().any(|b| matches!(b, b':' | b'=')) {
        return Ok(Vec::new());
    }
    // Malformed (not a branch that is missing): a usage error, exit 2.
    let spec = UnionSpec::parse(arg.as_os_str()).map_err(|e| match e.is_syntax() {
        true => anyhow::anyhow!(super::UsageError(e.to_string())),
        false => e.into(),
    })?;
    spec.validate(mnt)?;
    Ok(spec
        .branches()
        .iter()
        .map(|b| (b.path().to_path_buf(), b.mode().is_writable()))
        .collect())
}

/// `p` made absolute with symlinks and `..` resolved, as far as it exists
/// (the store directory itself may not exist yet).
fn absolute(p: &Path) -> Result<PathBuf> {
    let p = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    if let Ok(real) = std::fs::canonicalize(&p) {
        return Ok(real);
    }
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) => Ok(absolute(parent)?.join(name)),
        _ => Ok(p),
    }
}

/// A FUSE mount whose daemon died answers every call with ENOTCONN; it
/// would block the new mount, so it is detached first.
fn clear_dead_mount(mnt: &Path) -> Result<()> {
    let c = sys::cstr(mnt.as_os_str())?;
    sys::umount2(&c, libc::MNT_DETACH)
        .with_context(|| format!("cannot clear the dead mount at {}", mnt.display()))?;
    eprintln!("chronofs: cleared a dead mount at {}", mnt.display());
    Ok(())
}

fn init_logging(opts: &MountOptions, daemon: bool) -> Result<()> {
    let default = if opts.debug {
        "chronofs=debug"
    } else {
        "chronofs=info"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("CHRONOFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match (&opts.log_file, daemon) {
        (Some(path), _) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("log file {}", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init();
        }
        (None, true) => builder.with_ansi(false).with_writer(std::io::sink).init(),
        (None, false) => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}

/// Mounts and serves until unmounted. `notify` hears "ok" once the mount
/// and its control socket are ready, or the error.
fn serve(plan: &Plan, opts: &MountOptions, mut notify: Notify) -> Result<()> {
    let daemon = notify.daemon.is_some();
    // Blocked before any thread exists, so every thread inherits the mask
    // and only the waiter below ever receives these signals.
    let signals = sys::SignalWaiter::block_termination_signals()?;
    let (session, history, _control, sandboxes) = match prepare(plan, opts, daemon) {
        Ok(s) => s,
        Err(e) => {
            notify.report(&super::one_line(&e));
            return Err(e);
        }
    };
    // A working directory inside SRC would keep a MNT = SRC mount busy.
    if let Err(e) = std::env::set_current_dir("/") {
        tracing::warn!("cannot change to /: {e}");
    }
    let mnt = plan.mnt.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || unmount_on_signals(&signals, &mnt))?;
    if daemon {
        detach_stdio()?;
    }
    notify.report("ok");
    tracing::info!("mounted {} at {}", plan.src.display(), plan.mnt.display());
    let result = session.run().context("FUSE session failed");
    // Their mounts would outlive the daemon, dead.
    sandboxes.stop_all();
    // No request can come any more: record what is queued, durably.
    if let Some(rec) = history {
        // An unfinished ingest resumes at the next mount (`ingest=first`).
        rec.vfs.stop_ingest();
        rec.capture.finish();
        drop(rec);
    }
    result?;
    tracing::info!("unmounted {}", plan.mnt.display());
    Ok(())
}

/// Unmounts when asked to stop. If the mount is busy, the next signal
/// detaches it lazily (the session ends once the last user leaves).
fn unmount_on_signals(signals: &sys::SignalWaiter, mnt: &Path) {
    let mut lazy = false;
    while let Ok(sig) = signals.wait() {
        tracing::info!("signal {sig}: unmounting {}", mnt.display());
        let result = if lazy {
            unmount(mnt, true)
        } else {
            unmount_when_idle(mnt)
        };
        match result {
            Ok(()) => return,
            Err(e) => {
                tracing::error!("{e:#}; the next signal detaches it lazily");
                lazy = true;
            }
        }
    }
}

/// How long a signal's unmount waits for a busy mount to become idle.
const BUSY_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Unmounts, retrying while the mount is busy for up to `BUSY_GRACE`: a
/// file closed a moment ago can still be referenced (a sibling process
/// between fork and exec holds a copy of its descriptor; the kernel
/// finishes some closes asynchronously), which is not a user inside the
/// mount.
fn unmount_when_idle(mnt: &Path) -> Result<()> {
    let t0 = std::time::Instant::now();
    loop {
        let c = sys::cstr(mnt.as_os_str())?;
        match sys::umount2(&c, 0) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && t0.elapsed() < BUSY_GRACE => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            result => return explain_unmount(mnt, result),
        }
    }
}

fn detach_stdio() -> Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    use std::os::fd::AsFd;
    sys::redirect_stdio(null.as_fd(), null.as_fd())?;
    Ok(())
}

enum Branches {
    One(DirBranch),
    Union(Vec<crate::vfs::UnionBranch>),
}

/// The branch descriptors, taken before the mount covers any of them.
fn open_branches(plan: &Plan) -> Result<Branches> {
    if plan.union.is_empty() {
        let branch = DirBranch::open(BranchId(0), &plan.src, plan.reserved.clone())
            .with_context(|| format!("source {}", plan.src.display()))?;
        return Ok(Branches::One(branch));
    }
    let mut list = Vec::with_capacity(plan.union.len());
    for (i, (path, writable)) in plan.union.iter().enumerate() {
        let reserved = (path == &plan.src).then(|| plan.reserved.clone()).flatten();
        let branch = DirBranch::open(BranchId(i as u32), path, reserved)
            .with_context(|| format!("branch {}", path.display()))?;
        list.push(crate::vfs::UnionBranch {
            branch,
            writable: *writable,
            // Replaced by the persistent id once the store is open.
            id: i as u32,
        });
    }
    Ok(Branches::Union(list))
}

/// Matches each union branch to its persistent id in the store (by root
/// (dev, ino), then canonical path; new branches get fresh ids).
fn assign_branch_ids(
    store: &Store,
    plan: &Plan,
    list: &mut Vec<crate::vfs::UnionBranch>,
) -> Result<()> {
    let mut roots = Vec::with_capacity(list.len());
    for (b, (path, _)) in list.iter().zip(&plan.union) {
        roots.push(
            crate::store::BranchRoot::of(path.clone(), b.branch.root_fd())
                .with_context(|| format!("branch {}", path.display()))?,
        );
    }
    let idents = store.branch_idents(&roots)?;
    for (b, ident) in list.iter_mut().zip(idents) {
        b.id = ident.id;
        b.branch.set_key_dev(ident.key_dev);
    }
    // Changes made while mounted (`branch mode|add|remove`) outlive the
    // mount as long as the command line stays the one they were made under.
    let mounted: Vec<(u32, bool)> = list.iter().map(|b| (b.id, b.writable)).collect();
    refuse_dropping_snapshots(store, &mounted)?;
    let set = store.start_branch_set(&mounted)?;
    if set.live == mounted {
        return Ok(());
    }
    let known = store.branches()?;
    let mut given = std::mem::take(list);
    for (id, writable) in &set.live {
        let branch = match given.iter().position(|b| b.id == *id) {
            Some(at) => given.swap_remove(at).branch,
            None => {
                let row = known.iter().find(|r| r.id == *id).ok_or_else(|| {
                    anyhow!("the store's branch set names branch id {id}, which it does not know")
                })?;
                let mut branch = DirBranch::open(BranchId(*id), &row.root.path, None)
                    .with_context(|| {
                        format!(
                            "branch {} (added while mounted; mount with another branch list to \
                             leave it out, unless a snapshot made it)",
                            row.root.path.display()
                        )
                    })?;
                let root = crate::store::BranchRoot::of(row.root.path.clone(), branch.root_fd())?;
                if let Some(ident) = store.branch_idents(&[root])?.first() {
                    branch.set_key_dev(ident.key_dev);
                }
                branch
            }
        };
        list.push(crate::vfs::UnionBranch {
            branch,
            writable: *writable,
            id: *id,
        });
    }
    tracing::info!("branches as last set while mounted: {:?}", set.live);
    Ok(())
}

/// Another branch list starts from the command line's branches alone
/// (the user asked for them), but a snapshot's fresh branch holds every
/// change made since the snapshot, and its frozen branch would turn
/// writable again under them: refused, naming the list to mount with.
fn refuse_dropping_snapshots(store: &Store, mounted: &[(u32, bool)]) -> Result<()> {
    let Some(known) = store.branch_set()? else {
        return Ok(());
    };
    if known.mounted == mounted {
        return Ok(());
    }
    let rows = store.branches()?;
    let path_of = |id: u32| {
        rows.iter()
            .find(|r| r.id == id)
            .map(|r| r.root.path.clone())
    };
    let Some(fresh) = known
        .live
        .iter()
        .filter(|(id, _)| !mounted.iter().any(|(m, _)| m == id))
        .filter_map(|(id, _)| path_of(*id))
        .find(|p| crate::store::is_snapshot_branch(p))
    else {
        return Ok(());
    };
    // A list that can no longer be mounted (a branch gone for good) is
    // no list to go back to: the command line wins, and says what it
    // leaves out (the branch stays in the store).
    let before_paths: Vec<Option<PathBuf>> =
        known.mounted.iter().map(|(id, _)| path_of(*id)).collect();
    if let Some(gone) = before_paths.iter().flatten().find(|p| !p.is_dir()) {
        tracing::warn!(
            "{} holds changes made since a snapshot; the branch list it was mounted with \
             cannot be mounted ({} is gone), so it is left out",
            fresh.display(),
            gone.display()
        );
        eprintln!(
            "chronofs: warning: {} (changes since a snapshot) is left out: the branch list it \
             was mounted with cannot be mounted ({} is gone)",
            fresh.display(),
            gone.display()
        );
        return Ok(());
    }
    let before: Vec<String> = known
        .mounted
        .iter()
        .zip(&before_paths)
        .map(|((id, rw), path)| {
            let path = path
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("<branch {id}>")));
            format!("{}={}", path.display(), if *rw { "rw" } else { "ro" })
        })
        .collect();
    bail!(
        "this union was mounted as {} and holds changes made since a snapshot in {}, which \
         another branch list would drop: mount it as before, and change its branches while \
         mounted (`chronofs branch add|remove|mode`)",
        before.join(":"),
        fresh.display()
    )
}

/// The mount, what records its history, and the control socket of a
/// mount without history.
type Prepared = (
    Mounted,
    Option<Recording>,
    Option<control::Server>,
    Arc<super::sandbox_host::Sandboxes>,
);

/// A clone's files keep their shared bytes in history (their backing
/// files are sparse and marked), so a mount without history would show
/// them as zeros and lose writes to them: refused while any clone's tag
/// is kept.
fn refuse_plain_over_clones(store: &Store, plan: &Plan) -> Result<()> {
    let history = History::open(store, false).map_err(|e| anyhow!("{e}"))?;
    let tags = history.tags().map_err(|e| anyhow!("{e}"))?;
    if let Some((tag, _)) = tags.iter().find(|(n, _)| n.starts_with("clone:")) {
        bail!(
            "{} holds clones ({tag}), whose files read their shared bytes through history: \
             mount it without -o plain (chronofs gc releases the tags of removed clones)",
            plan.src.display()
        );
    }
    Ok(())
}

/// A branch holding clones of another store (or, for a mount without
/// history, of any store) is refused: its marks would read another
/// history's files, or none (`vfs::foreign_stamp`).
fn refuse_foreign_clones(
    branches: &Branches,
    plan: &Plan,
    history: bool,
    ours: Option<crate::store::StoreId>,
) -> Result<()> {
    let roots: Vec<(std::os::fd::BorrowedFd<'_>, &Path)> = match branches {
        Branches::One(b) => vec![(b.root_fd(), plan.src.as_path())],
        Branches::Union(list) => list
            .iter()
            .zip(&plan.union)
            .map(|(b, (path, _))| (b.branch.root_fd(), path.as_path()))
            .collect(),
    };
    for (root, path) in roots {
        let why = crate::vfs::foreign_stamp(root, history, ours)
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        if let Some(why) = why {
            bail!("{} {why}", path.display());
        }
    }
    Ok(())
}

fn prepare(plan: &Plan, opts: &MountOptions, daemon: bool) -> Result<Prepared> {
    init_logging(opts, daemon)?;
    if let Err(e) = sys::raise_fd_limit() {
        tracing::warn!("cannot raise the open-file limit: {e}");
    }
    // The daemon's own supplementary groups must not leak into requests
    // made under a caller's identity. Done while still single-threaded.
    nix_free_setgroups_empty()?;
    sys::creds::verify_switching()?;
    let mut branches = open_branches(plan)?;
    let store = Store::open(&plan.store)?;
    match &mut branches {
        Branches::Union(list) => assign_branch_ids(&store, plan, list)?,
        // Its keys are branch 0's; only the key device is wanted.
        Branches::One(b) => {
            // A single directory is a list too: one that leaves a
            // snapshot's branches out.
            refuse_dropping_snapshots(&store, &[])?;
            let root = crate::store::BranchRoot::of(plan.src.clone(), b.root_fd())?;
            if let Some(ident) = store.branch_idents(&[root])?.first() {
                b.set_key_dev(ident.key_dev);
            }
        }
    }
    if !opts.plain {
        store.keep_reserve();
    }
    let policy = if opts.plain {
        None
    } else {
        Some(load_policy(opts)?)
    };
    if opts.plain {
        refuse_plain_over_clones(&store, plan)?;
    }
    refuse_foreign_clones(&branches, plan, !opts.plain, store.id()?)?;
    let store_id = if opts.plain {
        None
    } else {
        Some(store.ensure_id()?)
    };
    // History first: its replay may restore inode-map entries.
    let history = if opts.plain {
        None
    } else {
        Some(History::open(&store, true).map_err(|e| anyhow!("{e}"))?)
    };
    let inomap = store.inode_map()?;
    let capture: Option<Arc<Capture>> = history.as_ref().zip(policy.as_ref()).map(|(h, p)| {
        Capture::new(
            Arc::clone(h),
            CaptureConfig {
                interval: opts.capture_interval,
                every_write: opts.every_write,
            },
            p.cell.clone(),
        )
    });
    let timeouts = opts.timeouts();
    let vfs_cfg = VfsConfig {
        entry_timeout: timeouts.entry,
        attr_timeout: timeouts.attr,
        negative_timeout: timeouts.negative,
        write_path: opts.write_path,
        views: opts.views.clone(),
        lower_timeout: None,
    };
    // A sandbox's session reads the branches this mount writes: what it
    // caches of them is trusted as briefly as with external-changes.
    let sandbox_vfs_cfg = VfsConfig {
        lower_timeout: Some(super::options::EXTERNAL_TIMEOUT),
        ..vfs_cfg.clone()
    };
    let vfs = match branches {
        Branches::One(branch) => Vfs::new(branch, inomap, vfs_cfg, capture.clone()),
        Branches::Union(list) => Vfs::new_union(list, inomap, vfs_cfg, capture.clone(), opts.union),
    }
    .map_err(|e| anyhow!("{e}"))?;
    if let Some(id) = store_id {
        vfs.set_store_id(id);
    }
    if let Some(c) = &capture {
        // Until a clone exists, no operation looks for a clone's mark.
        if c.history()
            .tags()?
            .iter()
            .any(|(n, _)| n.starts_with("clone:"))
        {
            vfs.enable_clones();
        }
        let weak = Arc::downgrade(&vfs);
        c.set_namer(Box::new(move |obj| weak.upgrade()?.name_of(obj)));
        vfs.check_root_entries();
    }
    if capture.is_some() {
        // Views of unchanged files read private clones made here (where
        // the file system can clone); without it they read through the
        // daemon.
        let dir = sys::cstr(store.dir().as_os_str())
            .and_then(|c| sys::openat(sys::CWD, &c, libc::O_PATH | libc::O_DIRECTORY, 0));
        match dir {
            Ok(fd) => vfs.set_clone_dir(fd),
            Err(e) => tracing::warn!("store directory {}: {e}", store.dir().display()),
        }
    }
    let adapter = AdapterConfig {
        // every-write needs to see each write, so the daemon does them.
        passthrough: opts.passthrough && !opts.every_write,
        writeback: opts.writeback,
        readdirplus: opts.readdirplus,
    };
    let sandbox_adapter = AdapterConfig {
        passthrough: opts.passthrough,
        ..adapter.clone()
    };
    let fs = ChronoFuse::new(vfs.clone(), adapter)?;
    let counts = fs.request_counts();
    let mut kernel_flags = opts.kernel.clone();
    // A mount must not revive set-id files or device nodes that SRC's own
    // mount disables.
    match sys::statvfs_flags(&plan.src) {
        Ok(flags) => {
            if flags & libc::ST_NOSUID != 0 && !kernel_flags.iter().any(|f| f == "nosuid") {
                kernel_flags.push("nosuid".into());
            }
            if flags & libc::ST_NODEV != 0 && !kernel_flags.iter().any(|f| f == "nodev") {
                kernel_flags.push("nodev".into());
            }
        }
        Err(e) => tracing::warn!("cannot read the mount flags of {}: {e}", plan.src.display()),
    }
    let spec = MountSpec {
        fsname: opts
            .fsname
            .clone()
            .unwrap_or_else(|| plan.src.to_string_lossy().into_owned()),
        kernel_flags,
        allow_other: opts.allow_other,
        uring: uring_wanted(opts.uring)?,
        threads: opts.threads.unwrap_or_else(|| {
            // One per core: more threads on a small machine cost context
            // switches for single-stream work (measured: rm -rf of a tree
            // 0.18 s with 2 threads, 0.30 s with 4, on 2 cores); slow
            // fsyncs run on their own pool.
            std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
        }),
    };
    // Opened before the mount: with MNT = SRC the path then leads into the
    // mount itself, and a descriptor there would keep it busy forever.
    let src_root = sys::openat(
        sys::CWD,
        &sys::cstr(plan.src.as_os_str())?,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )?;
    let session = Mounted::new(fs, &plan.mnt, &spec)
        .with_context(|| format!("cannot mount at {}", plan.mnt.display()))?;
    if opts.uring == Uring::On && !session.io_uring_granted() {
        bail!("uring=on: the kernel did not offer FUSE over io_uring at INIT");
    }
    let recipe = super::sandbox_host::Recipe {
        vfs: sandbox_vfs_cfg,
        adapter: sandbox_adapter,
        spec: spec.clone(),
        union: opts.union,
        reserved: plan.reserved.clone(),
    };
    let sandboxes = Arc::new(super::sandbox_host::Sandboxes::new(
        &plan.store,
        recipe,
        sandbox_refusal(plan),
        &plan.mnt,
    ));
    sandboxes.finish_interrupted_commits(&vfs);
    let control = match (&history, &policy) {
        (Some(h), Some(p)) => {
            let ctx = (&vfs, &store, counts, session.transport(), sandboxes.clone());
            start_control(plan, src_root, h, ctx, p.clone(), opts.allow_other)?
        }
        // Without history a mount still answers `chronofs branch` and
        // `chronofs sandbox`.
        _ => {
            let host = mount_host(
                plan,
                (&vfs, &store),
                counts,
                session.transport(),
                sandboxes.clone(),
            )?;
            let answerer = Arc::new(control::service::HostOnly(host));
            serve_control(plan, answerer, opts.allow_other)?
        }
    };
    let cleaner = match (&history, &policy) {
        (Some(h), Some(p)) if !opts.clean_interval.is_zero() => Some(
            Cleaner::start(Arc::clone(h), p.cell.clone(), opts.clean_interval)
                .context("cannot start the cleaner")?,
        ),
        _ => None,
    };
    let ingest = match opts.ingest {
        Ingest::Always => true,
        Ingest::Off => false,
        Ingest::First => history
            .as_ref()
            .is_some_and(|h| !h.ingest_complete().unwrap_or(false)),
    };
    if ingest {
        vfs.start_ingest().map_err(|e| anyhow!(e))?;
    }
    // Keep the store handle alive for the session's lifetime via the vfs.
    drop(store);
    // The control socket stops with the history when there is one, with
    // the session otherwise.
    Ok(match (history, capture) {
        (Some(h), Some(c)) => {
            let rec = Recording {
                vfs: Arc::clone(&vfs),
                _cleaner: cleaner,
                _history: h,
                capture: c,
                _control: control,
            };
            (session, Some(rec), None, sandboxes)
        }
        _ => (session, None, control, sandboxes),
    })
}

/// What a versioned mount keeps running beside the session. Dropping it
/// after `capture.finish()` makes the last changes durable.
struct Recording {
    // Declared first so they stop before the history closes.
    _cleaner: Option<Cleaner>,
    _control: Option<control::Server>,
    capture: Arc<Capture>,
    vfs: Arc<Vfs>,
    _history: HistoryHandle,
}

/// The policy files a mount starts with: a broken administrator file
/// stops the mount; broken user files are logged and skipped.
fn load_policy(opts: &MountOptions) -> Result<control::PolicyHolder> {
    let source = crate::policy::load::Source {
        admin: opts.policy.clone(),
        users: opts.user_policies,
        known: Some(crate::cli::maintain::known_name),
    };
    let (policy, warnings) = source.load(None).map_err(|errors| {
        anyhow!(
            "{}{}",
            errors.first().map_or_else(String::new, ToString::to_string),
            match errors.len() {
                0 | 1 => String::new(),
                n => format!(" ({} more problem(s): run `chronofs policy check`)", n - 1),
            }
        )
    })?;
    for w in warnings {
        tracing::warn!("policy: {w}");
    }
    Ok(control::PolicyHolder {
        cell: Arc::new(PolicyCell::new(policy)),
        source,
        broken: None,
    })
}

/// Where root turns FUSE over io_uring on (Linux 6.14+).
const URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether to ask the kernel for FUSE over io_uring; `uring=on` refuses
/// to mount when the module parameter says it cannot be had.
fn uring_wanted(mode: Uring) -> Result<bool> {
    let enabled =
        || std::fs::read_to_string(URING_PARAM).is_ok_and(|v| matches!(v.trim(), "Y" | "1"));
    match mode {
        Uring::Off => Ok(false),
        Uring::Auto => Ok(enabled()),
        Uring::On if enabled() => Ok(true),
        Uring::On => bail!(
            "uring=on: FUSE over io_uring is unavailable ({URING_PARAM} is off or missing; as root: echo Y > {URING_PARAM})"
        ),
    }
}

fn start_control(
    plan: &Plan,
    root: std::os::fd::OwnedFd,
    history: &HistoryHandle,
    (vfs, store, counts, transport, sandboxes): (
        &Arc<Vfs>,
        &Store,
        Arc<crate::fuse::RequestCounts>,
        crate::fuse::TransportState,
        Arc<super::sandbox_host::Sandboxes>,
    ),
    policy: control::PolicyHolder,
    allow_other: bool,
) -> Result<Option<control::Server>> {
    let service = control::Service::new(
        Arc::clone(history),
        root,
        plan.reserved.clone(),
        mount_host(plan, (vfs, store), counts, transport, sandboxes)?,
        store.dir().to_path_buf(),
        policy,
    );
    serve_control(plan, Arc::new(service), allow_other)
}

fn mount_host(
    plan: &Plan,
    (vfs, store): (&Arc<Vfs>, &Store),
    counts: Arc<crate::fuse::RequestCounts>,
    transport: crate::fuse::TransportState,
    sandboxes: Arc<super::sandbox_host::Sandboxes>,
) -> Result<Box<dyn control::service::Host>> {
    let modes = match plan.union.is_empty() {
        true => None,
        false => store
            .branch_set()?
            .map(|set| (store.branch_set_log(), set.mounted)),
    };
    let paths = store
        .branches()?
        .into_iter()
        .map(|r| (r.id, r.root.path))
        .collect();
    let snapshots = match &modes {
        Some((log, _)) => log
            .snapshots()?
            .into_iter()
            .map(|s| (s.branch, s.name))
            .collect(),
        None => Default::default(),
    };
    Ok(Box::new(MountHost {
        vfs: Arc::downgrade(vfs),
        paths: parking_lot::Mutex::new(paths),
        counts,
        transport,
        record: modes,
        fresh_dir: plan.store.join("branches"),
        fresh_refusal: plan.store.starts_with(&plan.mnt).then(|| {
            format!(
                "snapshots need the store outside the mount point {} (mounted with \
                 MNT = SRC: give -o store=DIR elsewhere)",
                plan.mnt.display()
            )
        }),
        snapshots: parking_lot::Mutex::new(snapshots),
        changes: parking_lot::Mutex::new(()),
        src: plan.union.is_empty().then(|| plan.src.clone()),
        sandboxes,
    }))
}

/// Why this mount cannot have sandboxes: the daemon reaches its store
/// and branches by path, and under the mount point a path leads into the
/// mount itself.
fn sandbox_refusal(plan: &Plan) -> Option<String> {
    let covered = |p: &Path| p.starts_with(&plan.mnt);
    let base = std::iter::once(&plan.src).chain(plan.union.iter().map(|(p, _)| p));
    if covered(&plan.store) || base.into_iter().any(|p| covered(p)) {
        return Some(format!(
            "sandboxes need the store and the branches outside the mount point {} \
             (mounted with MNT = SRC: give -o store=DIR elsewhere and a SRC apart from MNT)",
            plan.mnt.display()
        ));
    }
    None
}

/// The mount's control socket, answered by `answerer`; without
/// `allow_other` only for the users the mount itself serves.
fn serve_control(
    plan: &Plan,
    answerer: Arc<dyn control::service::Answerer>,
    allow_other: bool,
) -> Result<Option<control::Server>> {
    let answerer: Arc<dyn control::service::Answerer> = match allow_other {
        true => answerer,
        false => Arc::new(control::service::OwnerOnly {
            inner: answerer,
            owner: sys::geteuid(),
        }),
    };
    let canon = plan.mnt.canonicalize().unwrap_or_else(|_| plan.mnt.clone());
    let Some(entry) = control::chronofs_mounts()
        .into_iter()
        .rev()
        .find(|m| m.mount_point == canon)
    else {
        tracing::warn!("cannot find this mount in mountinfo; chronofs commands will not reach it");
        return Ok(None);
    };
    widen_readahead(&entry.dev);
    let path = control::socket_dir(sys::geteuid()).join(control::socket_name(&entry));
    let server = control::serve(&path, answerer)
        .with_context(|| format!("cannot create the control socket {}", path.display()))?;
    Ok(Some(server))
}

/// The kernel offers a FUSE mount the default readahead (128 KiB) and
/// caps it there, so files the daemon serves (a clone's base, views,
/// patched files) were read in 128 KiB requests: a request costs the same
/// whatever its size, and 1 MiB ones read a cloned file cold 1.3-3x as
/// fast (docs/PERFORMANCE.md). The mount's bdi takes the readahead the
/// FUSE session asked for (`max_readahead`); only root may set it, and
/// passthrough files read with their backing file's own.
pub(super) fn widen_readahead(dev: &str) {
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    let kb = crate::fuse::MAX_READAHEAD >> 10;
    if let Err(e) = std::fs::write(&path, format!("{kb}\n")) {
        tracing::debug!("readahead stays the kernel's: {path}: {e}");
    }
}

fn nix_free_setgroups_empty() -> Result<()> {
    sys::creds::clear_process_groups().context("cannot clear supplementary groups")
}

pub fn unmount(mnt: &Path, lazy: bool) -> Result<()> {
    // A stale mount cannot be resolved (ENOTCONN): its path as given.
    let abs = std::fs::canonicalize(mnt)
        .or_else(|_| std::path::absolute(mnt))
        .with_context(|| format!("cannot resolve {}", mnt.display()))?;
    match mount_type_at(&abs) {
        None => anyhow::bail!("{} is not a mount point", mnt.display()),
        // SRC typed for MNT, as root, would detach whatever is there.
        Some(t) if t != "fuse.chronofs" => anyhow::bail!(
            "{} is {} {t} mount, not a chronofs one; nothing was unmounted",
            mnt.display(),
            if t.starts_with(['a', 'e', 'i', 'o', 'u']) {
                "an"
            } else {
                "a"
            }
        ),
        Some(_) => {}
    }
    // Held across the unmount: the daemon closes it only as it exits.
    let daemon = (!lazy).then(|| daemon_connection(&abs)).flatten();
    let c = sys::cstr(mnt.as_os_str())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    explain_unmount(mnt, sys::umount2(&c, flags))?;
    if let Some(daemon) = daemon {
        await_daemon_exit(daemon, mnt);
    }
    Ok(())
}

/// The daemon serving a mount, as `chronofs umount` waits for it.
struct Daemon {
    conn: std::os::unix::net::UnixStream,
    /// Readable once every thread of the daemon has exited: its end of
    /// `conn` closes while the exit still releases other files (a command
    /// in flight held them), and the process lingered up to 2 s after.
    /// `None`: it runs in another pid namespace (or the kernel is older).
    pidfd: Option<std::os::fd::OwnedFd>,
}

/// A connection to the control socket of the daemon serving `mnt`, if
/// it can be reached.
fn daemon_connection(mnt: &Path) -> Option<Daemon> {
    let entry = control::mount_of(mnt).filter(|m| m.mount_point == mnt)?;
    let socket = control::socket_of(&entry, sys::geteuid())?;
    let conn = std::os::unix::net::UnixStream::connect(socket).ok()?;
    let pidfd = sys::peer_credentials(&conn)
        .ok()
        .filter(|p| p.pid != 0)
        .and_then(|p| sys::pidfd_open(p.pid).ok());
    Some(Daemon { conn, pidfd })
}

/// Returns once the daemon has exited (its end of the connection closed,
/// then its last thread gone): after an unmount it still writes down the
/// history of the last changes and releases the branches and the store,
/// and a script that remounts, checks or copies them next must find that
/// done, as after `umount` of a disk. Says so when that takes a while.
fn await_daemon_exit(mut daemon: Daemon, mnt: &Path) {
    let t0 = std::time::Instant::now();
    let mut said = false;
    let mut say = || {
        if !std::mem::replace(&mut said, true) {
            eprintln!(
                "chronofs: unmounted {}; waiting for its daemon to finish recording history",
                mnt.display()
            );
        }
    };
    let mut byte = [0u8; 1];
    let _ = daemon.conn.set_read_timeout(Some(QUIET));
    loop {
        match daemon.conn.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                say();
                let _ = daemon.conn.set_read_timeout(None);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let Some(pidfd) = daemon.pidfd else { return };
    let left = QUIET.saturating_sub(t0.elapsed());
    if let Ok(false) = sys::wait_readable(pidfd.as_fd(), Some(left)) {
        say();
        let _ = sys::wait_readable(pidfd.as_fd(), None);
    }
}

/// How long `chronofs umount` waits for the daemon before saying so.
const QUIET: std::time::Duration = std::time::Duration::from_secs(2);

/// An unmount's outcome, with a message a user can act on.
fn explain_unmount(mnt: &Path, result: std::io::Result<()>) -> Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(anyhow!(
            "{} is busy (files open or a process inside it); use --lazy to detach anyway",
            mnt.display()
        )),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            Err(anyhow!("{} is not a mount point", mnt.display()))
        }
        Err(e) => Err(anyhow!("cannot unmount {}: {e}", mnt.display())),
    }
}
