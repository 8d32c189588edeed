//! The history verbs: log, cat, ls, tag, tags, status, ingest, fsck, and
//! what every verb shares (finding who answers for a path, instants).
//! Restore, revert and undelete are in `restore.rs`, diff in `diff.rs`.
//!
//! Queries go to the running mount's daemon over its control socket, or,
//! when nothing is mounted, straight to the store. Restore, revert and
//! undelete write through ordinary system calls as the calling user, so
//! permissions are the file system's own and, through a mount, every change
//! they make is itself a version that can be undone.

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::control::{self, spec, At, Client, Components};
use crate::history::History;
use crate::store::Store;
use crate::sys;

/// Where requests are answered.
pub enum Backend {
    Daemon(PathBuf),
    Local(Box<LocalStore>),
}

pub struct LocalStore {
    /// The source directory the store belongs to.
    src: PathBuf,
    service: control::Service,
    // Kept open for the service's lifetime.
    _history: crate::history::HistoryHandle,
}

/// A path's backend and its components below the mount (or SRC) root.
pub struct Target {
    pub backend: Backend,
    pub path: Components,
    /// The absolute path the user meant (for writes).
    pub abs: PathBuf,
}

/// Absolute, resolved as the kernel resolves a path, without needing it
/// to exist: each existing directory on the way has its symlinks followed
/// before a `..` after it applies (`s/..` is the parent of where `s`
/// leads), the last name is the object itself (a symlink is not
/// followed) unless a trailing `/` or `.` asks for a directory; from the
/// first name that does not exist (or a dangling symlink) on, the rest is
/// kept as written.
pub fn absolutize(p: &Path) -> Result<PathBuf> {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    let raw = joined.as_os_str().as_bytes();
    let names: Vec<&[u8]> = raw
        .split(|b| *b == b'/')
        .filter(|n| !n.is_empty())
        .collect();
    let wants_dir = raw.ends_with(b"/") || names.last().is_some_and(|n| *n == b"." || *n == b"..");
    let mut out = PathBuf::from("/");
    let mut resolved = true;
    // The last name resolved exists and is no directory: `.` or `..`
    // after it is ENOTDIR, as for the kernel (`file/..` is no path).
    let mut not_dir = false;
    for (i, name) in names.iter().enumerate() {
        match *name {
            b"." | b".." if not_dir => bail!("{}: Not a directory", p.display()),
            b"." => continue,
            b".." => {
                out.pop();
                continue;
            }
            _ => out.push(OsStr::from_bytes(name)),
        }
        let follow = i + 1 < names.len() || wants_dir;
        if !resolved || !follow {
            continue;
        }
        match std::fs::symlink_metadata(&out) {
            Ok(m) if m.file_type().is_symlink() => match out.canonicalize() {
                Ok(target) => {
                    not_dir = !target.is_dir();
                    out = target
                }
                Err(_) => resolved = false,
            },
            Ok(m) => not_dir = !m.is_dir(),
            Err(_) => resolved = false,
        }
    }
    if wants_dir && resolved && std::fs::metadata(&out).is_ok_and(|m| !m.is_dir()) {
        bail!("{}: Not a directory", p.display());
    }
    Ok(out)
}

fn components(rel: &Path) -> Components {
    rel.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.as_bytes().to_vec()),
            _ => None,
        })
        .collect()
}

/// Finds who answers for `path`: a mount's daemon, or a store directly.
pub fn target(path: &Path, store: Option<&Path>) -> Result<Target> {
    let abs = leading_into_a_mount(absolutize(path)?);
    if let Some(m) = control::mount_of(&abs) {
        // The mount answers from its own store: another one named would
        // silently not be the one read (or collected).
        if let Some(s) = store {
            anyhow::bail!(
                "--store {}: {} is inside the chronofs mount at {}, which answers from its own store; --store is for a store with nothing mounted over it (run from outside the mount, or drop --store)",
                s.display(),
                abs.display(),
                m.mount_point.display()
            );
        }
        let (socket, root) = control::served_at(&m, sys::geteuid()).ok_or_else(|| {
            anyhow!(
                "the chronofs mount at {} has no control socket (mounted with -o plain?)",
                m.mount_point.display()
            )
        })?;
        let rel = abs.strip_prefix(&m.mount_point).unwrap_or(Path::new(""));
        return Ok(Target {
            backend: Backend::Daemon(socket),
            path: components(&root.join(rel)),
            abs,
        });
    }
    let (src, store_dir) = match store {
        Some(s) => {
            // Commands only read or maintain a store: a mistyped path must
            // not become a new, empty one.
            if !s.join(crate::store::INDEX_FILE).is_file() {
                anyhow::bail!(
                    "{} is not a chronofs store (it has no {})",
                    s.display(),
                    crate::store::INDEX_FILE
                );
            }
            let src = find_src(&abs, None).ok_or_else(|| {
                anyhow!("with --store, PATH must lie inside the source directory it belongs to")
            })?;
            // Absolute: `status` names it, and a relative name says
            // nothing once read elsewhere.
            let store = s
                .canonicalize()
                .with_context(|| format!("store {}", s.display()))?;
            (src, store)
        }
        None => {
            let src = find_src(&abs, Some(".chronofs")).ok_or_else(|| {
                match unreadable_store(&abs) {
                    Some(store) => anyhow!(
                        "{}: permission denied (the store is root's; a path inside the mount over {} is answered by its daemon)",
                        store.display(),
                        store.parent().unwrap_or(Path::new("/")).display()
                    ),
                    None => anyhow!(
                        "{} is not inside a chronofs mount or a directory with a .chronofs store",
                        abs.display()
                    ),
                }
            })?;
            let store = src.join(".chronofs");
            (src, store)
        }
    };
    let rel = abs.strip_prefix(&src).unwrap_or(Path::new(""));
    Ok(Target {
        backend: Backend::Local(Box::new(open_local(&src, &store_dir)?)),
        path: components(rel),
        abs,
    })
}

/// A symlink outside every mount has no history of its own: named last,
/// it stands for where it leads inside a mount (`log LNK` as `log LNK/a`
/// already did).
fn leading_into_a_mount(abs: PathBuf) -> PathBuf {
    let is_link = std::fs::symlink_metadata(&abs).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link || control::mount_of(&abs).is_some() {
        return abs;
    }
    match abs.canonicalize() {
        Ok(target) if control::mount_of(&target).is_some() => target,
        _ => abs,
    }
}

/// The nearest `.chronofs` store above `abs` that this user may not
/// look into (a store directory is 0700): it is there, not absent.
fn unreadable_store(abs: &Path) -> Option<PathBuf> {
    abs.ancestors().map(|p| p.join(".chronofs")).find(|s| {
        s.is_dir()
            && std::fs::metadata(s.join(crate::store::INDEX_FILE))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
    })
}

/// The nearest ancestor of `abs` holding `marker/index.redb` (or, with no
/// marker, the nearest existing directory: --store names the store).
fn find_src(abs: &Path, marker: Option<&str>) -> Option<PathBuf> {
    let mut cur = Some(abs);
    while let Some(p) = cur {
        match marker {
            Some(m) if p.join(m).join("index.redb").is_file() => return Some(p.to_path_buf()),
            None if p.is_dir() => return Some(p.to_path_buf()),
            _ => {}
        }
        cur = p.parent();
    }
    None
}

fn open_local(src: &Path, store_dir: &Path) -> Result<LocalStore> {
    let store = Store::open(store_dir).map_err(|e| match e {
        crate::store::StoreError::InUse { .. } => anyhow!(
            "the store {} is in use by a running mount; run the command on a path inside that mount",
            store_dir.display()
        ),
        other => anyhow!("{other}"),
    })?;
    let history = History::open(&store, false).map_err(|e| anyhow!("{e}"))?;
    let inomap = store.inode_map().map_err(|e| anyhow!("{e}"))?;
    let root = sys::openat(
        sys::CWD,
        &sys::cstr(src.as_os_str())?,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )
    .with_context(|| format!("source {}", src.display()))?;
    let root_st = sys::fstat(std::os::fd::AsFd::as_fd(&root))?;
    let key_dev = store.known_key_dev(&crate::store::BranchRoot::of(
        src.to_path_buf(),
        std::os::fd::AsFd::as_fd(&root),
    )?)?;
    let reserved = store_dir
        .strip_prefix(src)
        .ok()
        .filter(|r| r.components().count() == 1)
        .map(|r| r.as_os_str().to_os_string());
    let host = Box::new(StoreHost {
        inomap,
        root_st,
        dev_alias: crate::store::DevAlias::new(root_st.st_dev, key_dev),
    });
    let source = crate::policy::load::Source {
        admin: None,
        users: true,
        known: None,
    };
    // Only the verbs that apply the policy need it; they report a problem.
    let (policy, broken) = match source.load(None) {
        Ok((p, _)) => (p, None),
        Err(errors) => (
            crate::policy::Policy::default(),
            errors.first().map(ToString::to_string),
        ),
    };
    let service = control::Service::new(
        std::sync::Arc::clone(&history),
        root,
        reserved,
        host,
        store_dir.to_path_buf(),
        control::PolicyHolder {
            cell: std::sync::Arc::new(crate::capture::retention::PolicyCell::new(policy)),
            source,
            broken,
        },
    );
    Ok(LocalStore {
        src: src.to_path_buf(),
        service,
        _history: history,
    })
}

/// A store opened directly (nothing mounted).
struct StoreHost {
    inomap: crate::store::InodeMap,
    root_st: sys::Stat,
    /// How keys carry the source's device number.
    dev_alias: crate::store::DevAlias,
}

impl control::service::Host for StoreHost {}

impl crate::history::past::LiveIds for StoreHost {
    fn identify(&self, st: &sys::Stat) -> Option<crate::history::ObjectId> {
        if st.st_dev == self.root_st.st_dev && st.st_ino == self.root_st.st_ino {
            return Some(crate::history::ROOT);
        }
        let key = crate::store::BackingKey {
            branch: 0,
            dev: self.dev_alias.swap(st.st_dev),
            ino: st.st_ino,
        };
        self.inomap
            .get(&key)
            .ok()
            .flatten()
            .map(crate::history::ObjectId::new)
    }
}

impl Target {
    /// The source directory, when nothing is mounted over it (its store
    /// is read directly, and nothing records a change made in it).
    pub fn unmounted_source(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Daemon(_) => None,
            Backend::Local(local) => Some(&local.src),
        }
    }

    /// The typed client of whoever answers for this path.
    pub fn client(&self) -> Client<'_> {
        match &self.backend {
            Backend::Daemon(sock) => Client::Daemon(sock),
            Backend::Local(local) => Client::Local(&local.service),
        }
    }
}

pub fn parse_at(s: Option<&str>) -> Result<At> {
    match s {
        None => Ok(At::Now),
        // `@T` as in `.history/@T/`: no tag or time starts with '@'.
        Some(s) => spec::parse(s.strip_prefix('@').unwrap_or(s))
            .map_err(|e| anyhow!(super::UsageError(e.to_string()))),
    }
}

/// A bound of a range (`log --since/--until`), clamped into recorded
/// history: a range reaching before history began or past now still means
/// everything up to that end, so it is narrowed (and the user told, one
/// line on stderr) rather than refused. A single instant (`cat --at`) is
/// not clamped: there is no version to show there.
fn range_bound(t: &Target, flag: &str, s: &str) -> Result<At> {
    let at = parse_at(Some(s))?;
    let At::Time(ns) = at else {
        return Ok(at);
    };
    if ns > crate::history::now_ns() {
        eprintln!(
            "chronofs: {flag} '{s}' ({}) is in the future; using now",
            spec::show(ns)
        );
        return Ok(At::Now);
    }
    let client = t.client();
    let Err(e) = client.resolve(&at) else {
        return Ok(at);
    };
    // Only an instant before the first change is clamped; any other
    // failure (an empty history...) is reported as it is.
    match client.status()?.first {
        Some(control::proto::SeqTime {
            seq,
            time_ns: first,
        }) if ns < first => {
            eprintln!(
                "chronofs: {flag} '{s}' ({}) is before history began; using its start ({}, #{seq})",
                spec::show(ns),
                spec::show(first)
            );
            Ok(At::Seq(seq))
        }
        _ => Err(e.into()),
    }
}

pub(super) fn print_json(v: &impl Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn user_name(uid: u32) -> String {
    sys::user_name(uid).unwrap_or_else(|| uid.to_string())
}

/// A name or path for a terminal: the text, with bytes that are not
/// UTF-8 shown as U+FFFD and control characters (a newline in a name)
/// escaped (`\n`, `\u{1b}`) so that one entry stays on one line and
/// cannot drive the terminal. A backslash is doubled, as `ls -b` does:
/// else a name holding `\n` and one holding a newline print the same.
pub(super) fn shown(text: &str) -> String {
    escaped(text, |c| c.is_control() || c == '\\')
}

/// An error message for a terminal: control characters escaped (a name
/// in it may hold a newline), backslashes as they are (a message quotes
/// what the user typed, as `a\:b` of a branch list, to be read back).
pub(super) fn message_shown(text: &str) -> String {
    escaped(text, char::is_control)
}

fn escaped(text: &str, escape: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if escape(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

pub fn log(
    t: &Target,
    since: Option<&str>,
    until: Option<&str>,
    recursive: bool,
    json: bool,
) -> Result<()> {
    let since = since.map(|s| range_bound(t, "--since", s)).transpose()?;
    let until = until.map(|s| range_bound(t, "--until", s)).transpose()?;
    let ranged = since.is_some() || until.is_some();
    let client = t.client();
    if let (Some(from), Some(to)) = (&since, &until) {
        let (from, to) = (client.resolve(from)?, client.resolve(to)?);
        if from.seq > to.seq {
            return Err(anyhow!(super::UsageError(format!(
                "--since ({}) is after --until ({}): nothing lies between",
                from.time, to.time
            ))));
        }
    }
    let rows = if recursive {
        let tree = client.log_tree(&t.path, since, until)?;
        if json {
            // One line: a tree's log is large, and scripts read it whole.
            let line = serde_json::to_string(&tree)?;
            let mut out = std::io::stdout().lock();
            out.write_all(line.as_bytes())
                .and_then(|()| out.write_all(b"\n"))
                .map_err(|e| anyhow!("writing output: {e}"))?;
            return Ok(());
        }
        tree.versions
    } else {
        let log = client.log(&t.path, since, until)?;
        if json {
            print_json(&log);
            return Ok(());
        }
        log.versions
    };
    if rows.is_empty() {
        match (ranged, recursive) {
            (true, _) => println!("no versions recorded in that range"),
            // Unchanged since history began, or changed where the mount
            // could not see it (behind it, or just before a crash).
            (false, false) => println!(
                "no versions recorded: history holds none of this file's states yet (it records \
                 the state before the next change; `chronofs ingest` records it now)"
            ),
            (false, true) => println!(
                "no versions recorded: history holds none of these files' states yet (it records \
                 each before its next change; `chronofs ingest` records them now)"
            ),
        }
        return Ok(());
    }
    let mut last_inc = 0;
    if recursive {
        println!(
            "{:>8}  {:<19}  {:<11} {:>10}  {:<8} {:<12} PATH",
            "SEQ", "TIME", "CAUSE", "SIZE", "USER", "PROCESS"
        );
    } else {
        println!(
            "{:>4} {:>8}  {:<19}  {:<11} {:>10}  {:<8} PROCESS",
            "#", "SEQ", "TIME", "CAUSE", "SIZE", "USER"
        );
    }
    for r in &rows {
        let time = spec::show(r.time_ns);
        let gone = match (r.gone, r.lost) {
            (true, true) => " (gone) (lost: cannot be read)",
            (_, true) => " (lost: cannot be read)",
            (true, _) => " (gone)",
            _ => "",
        };
        let user = user_name(r.uid);
        let proc_ = match r.pid {
            0 => "-".to_string(),
            pid => format!("{}[{pid}]", r.process),
        };
        if recursive {
            println!(
                "{:>8}  {:<19}  {:<11} {:>10}  {:<8} {:<12} {}{gone}",
                r.seq,
                time,
                r.cause,
                r.size,
                user,
                proc_,
                shown(r.path.as_deref().unwrap_or(""))
            );
            continue;
        }
        let inc = r.incarnation.unwrap_or(1);
        if inc != last_inc {
            println!("---- incarnation {inc} (object {}) ----", r.obj);
            last_inc = inc;
        }
        let then = match &r.as_path {
            Some(p) => format!("  (as {})", shown(p)),
            None => String::new(),
        };
        println!(
            "{:>4} {:>8}  {:<19}  {:<11} {:>10}  {:<8} {proc_}{gone}{then}",
            r.n.map_or("-".into(), |n| n.to_string()),
            r.seq,
            time,
            r.cause,
            r.size,
            user
        );
    }
    Ok(())
}

pub fn cat(t: &Target, at: Option<&str>, version: Option<i64>, json: bool) -> Result<()> {
    let at = parse_at(at)?;
    let client = t.client();
    if json {
        // The bytes as a JSON string (hex when they are not UTF-8) beside
        // the version's description: for scripts reading small files.
        let mut bytes = Vec::new();
        let meta = client.read(&t.path, &at, version, &mut bytes)?;
        let (encoding, content) = match String::from_utf8(bytes) {
            Ok(text) => ("utf-8", text),
            Err(e) => (
                "hex",
                e.as_bytes().iter().map(|b| format!("{b:02x}")).collect(),
            ),
        };
        let (path, path_raw) = control::proto::split_bytes(t.abs.as_os_str().as_bytes());
        print_json(&CatReply {
            path,
            path_raw,
            version: meta,
            encoding,
            content,
        });
        return Ok(());
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    client.read(&t.path, &at, version, &mut out)?;
    out.flush()?;
    Ok(())
}

/// `cat --json`.
#[derive(Serialize)]
struct CatReply {
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_raw: Option<Vec<u8>>,
    version: control::proto::NodeInfo,
    encoding: &'static str,
    content: String,
}

fn mode_str(kind: &str, mode: u32) -> String {
    let k = match kind {
        "dir" => 'd',
        "symlink" => 'l',
        "char" => 'c',
        "block" => 'b',
        "fifo" => 'p',
        "socket" => 's',
        _ => '-',
    };
    let mut s = String::from(k);
    // As ls(1) shows them: a special bit takes the execute place, in
    // lower case where execute is set too.
    let special = [
        (6, libc::S_ISUID, 's'),
        (3, libc::S_ISGID, 's'),
        (0, libc::S_ISVTX, 't'),
    ];
    for (shift, flag, letter) in special {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (bits & 1 != 0, mode & flag != 0) {
            (true, true) => letter,
            (false, true) => letter.to_ascii_uppercase(),
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

pub fn ls(t: &Target, at: Option<&str>, deleted: bool, long: bool, json: bool) -> Result<()> {
    let v = t.client().list(&t.path, &parse_at(at)?, deleted)?;
    if json {
        print_json(&v);
        return Ok(());
    }
    if !deleted {
        for e in &v.entries {
            let name = shown(e.name.as_deref().unwrap_or("?"));
            if long {
                let target = e
                    .target
                    .as_deref()
                    .map(|t| format!(" -> {}", shown(t)))
                    .unwrap_or_default();
                println!(
                    "{} {:>3} {:<8} {:>10} {} {name}{target}",
                    mode_str(&e.kind, e.mode),
                    e.nlink,
                    user_name(e.uid),
                    e.size,
                    spec::show(e.mtime_ns)
                );
            } else {
                println!("{name}");
            }
        }
        return Ok(());
    }
    for e in &v.deleted {
        println!(
            "{:<24} {:<7} {:>10}  deleted {} (#{}; restore --at #{})",
            shown(&e.name),
            e.kind,
            e.size.map_or("-".into(), |n| n.to_string()),
            spec::show(e.deleted_time_ns.unwrap_or(0)),
            e.deleted_seq,
            e.restore_seq
        );
    }
    Ok(())
}

/// A union mount's branches, one line each: position, mode, usage, and
/// a mark on the one creates go to now.
fn print_branches(u: &crate::control::proto::UnionStatus) {
    let gib = |n: u64| n as f64 / (1u64 << 30) as f64;
    println!(
        "union:        create={} delete={} marks={}.overlay.*",
        u.create, u.delete, u.xattrs
    );
    for (i, b) in u.branches.iter().enumerate() {
        println!(
            "  branch {}:   {} {}  used {:.2} GiB, free {:.2} GiB of {:.2} GiB{}",
            i,
            b.mode,
            b.path,
            gib(b.used_bytes),
            gib(b.free_bytes),
            gib(b.size_bytes),
            if b.creates { "  <- creates" } else { "" }
        );
    }
}

/// `status --requests`: one line per kind of FUSE request served.
fn print_requests(counts: Option<&[crate::control::proto::RequestCount]>) -> Result<()> {
    let Some(counts) = counts else {
        anyhow::bail!("nothing is mounted here: request counts come from a running mount");
    };
    let total: u64 = counts.iter().map(|c| c.count).sum();
    for c in counts {
        println!("{:<16} {:>12}", c.kind, c.count);
    }
    println!("{:<16} {:>12}", "total", total);
    Ok(())
}

/// What the running mount says of itself, with or without history.
fn print_mount_status(v: &crate::control::proto::StatusReply) {
    if let Some(t) = &v.transport {
        println!("transport:    {t}");
    }
    if let Some(u) = &v.union {
        print_branches(u);
    }
}

pub fn status(t: &Target, json: bool, requests: bool) -> Result<()> {
    let v = t.client().status()?;
    if json {
        print_json(&v);
        return Ok(());
    }
    if requests {
        return print_requests(v.requests.as_deref());
    }
    if v.plain {
        println!("history:      off (mounted with -o plain)");
        print_mount_status(&v);
        return Ok(());
    }
    let mib = |n: u64| n as f64 / (1 << 20) as f64;
    println!("store:        {}", v.store);
    match &v.poisoned {
        Some(why) => println!(
            "health:       POISONED: {why}; changes are refused (EIO) until the mount is restarted"
        ),
        None => println!("health:       ok"),
    }
    if v.unrecorded > 0 {
        println!(
            "unrecorded:   {} change(s) made while the store was full (see the log)",
            v.unrecorded
        );
    }
    println!(
        "store size:   {:.1} MiB ({:.1} MiB in packs)",
        mib(v.store_bytes),
        mib(v.pack_bytes)
    );
    println!("changes:      {}", v.changes);
    println!("versions:     {}", v.versions);
    println!(
        "chunks:       {} ({:.1} MiB, {:.1} MiB stored)",
        v.chunks,
        mib(v.chunk_bytes),
        mib(v.stored_bytes)
    );
    println!(
        "content:      {:.1} MiB across all versions",
        mib(v.logical_bytes)
    );
    println!(
        "dedup:        {:.2}x   compression: {:.2}x",
        v.dedup_ratio, v.compression_ratio
    );
    println!("tags:         {}", v.tags);
    print_mount_status(&v);
    if let Some(head) = &v.chain_head {
        // What an administrator notes elsewhere: a store rewritten behind
        // chronofs's back cannot keep this value.
        println!("chain head:   #{} {}", head.seq, head.hash);
    }
    if let Some(ing) = &v.ingest {
        let state = if ing.running {
            "running"
        } else if !ing.complete {
            "incomplete"
        } else {
            "done"
        };
        if !ing.complete {
            println!(
                "coverage:     files that predate the first mount and were not reached yet have no recorded content: an outside change loses them (`chronofs ingest` finishes the walk)"
            );
        }
        println!(
            "ingest:       {state}: {} dirs, {} files, {:.1} MiB, {} error(s)",
            ing.dirs,
            ing.files,
            mib(ing.bytes),
            ing.errors
        );
    }
    for (label, st) in [("first change", &v.first), ("last change", &v.last)] {
        if let Some(st) = st {
            println!("{label}: {} (#{})", spec::show(st.time_ns), st.seq);
        }
    }
    Ok(())
}

/// Starts the eager baseline and shows its progress until done.
pub fn ingest(t: &Target, wait: bool, json: bool) -> Result<()> {
    let client = t.client();
    let started = client.ingest()?;
    if !wait {
        if json {
            print_json(&started);
        } else {
            println!("ingest started; `chronofs status` shows its progress");
        }
        return Ok(());
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} ingesting: {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    loop {
        let p = client.status()?.ingest;
        let msg = p.as_ref().map_or_else(String::new, |p| {
            format!(
                "{} dirs, {} files, {:.1} MiB",
                p.dirs,
                p.files,
                p.bytes as f64 / (1 << 20) as f64
            )
        });
        bar.set_message(msg.clone());
        if p.as_ref().is_none_or(|p| p.done) {
            bar.finish_and_clear();
            if json {
                print_json(&p);
            } else {
                let errors = p.as_ref().map_or(0, |p| p.errors);
                println!("ingest done: {msg}, {errors} error(s)");
            }
            return Ok(());
        }
        bar.tick();
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

pub fn tag(t: &Target, name: &str, at: Option<&str>, delete: bool, json: bool) -> Result<()> {
    let client = t.client();
    if delete {
        let v = client.untag(name)?;
        if json {
            print_json(&v);
        } else {
            println!("removed tag {name}");
        }
        return Ok(());
    }
    let v = client.tag(name, parse_at(at)?)?;
    if json {
        print_json(&v);
    } else {
        println!(
            "tagged #{} ({}) as {name}",
            v.seq,
            spec::show(v.time_ns.unwrap_or(0))
        );
    }
    Ok(())
}

/// `chronofs clone SRC DST`: both in one mount (a clone is made by the
/// mount's daemon, so a path outside any mount is refused at once, its
/// store never opened).
pub fn clone(src: &Path, dst: &Path, at: Option<&str>, common: &super::Common) -> Result<()> {
    // A trailing slash names a directory, as for cp(1) and rename(2).
    let slashed = |p: &Path| p.as_os_str().as_bytes().ends_with(b"/");
    let src_is_dir = std::fs::metadata(src).is_ok_and(|m| m.is_dir());
    if !src_is_dir && (slashed(src) || slashed(dst)) {
        let named = if slashed(src) { src } else { dst };
        anyhow::bail!(
            "cannot clone {} to {}: {}: Not a directory",
            src.display(),
            dst.display(),
            named.display()
        );
    }
    for p in [src, dst] {
        let abs = absolutize(p)?;
        if control::mount_of(&abs).is_none() {
            anyhow::bail!("{}: clones are made inside a chronofs mount", abs.display());
        }
    }
    let (src_arg, dst_arg) = (src, dst);
    let src = &target(src, common.store.as_deref())?;
    let dst = &target(dst, common.store.as_deref())?;
    let json = common.json;
    let same_mount = matches!((&src.backend, &dst.backend),
        (Backend::Daemon(a), Backend::Daemon(b)) if a == b);
    if !same_mount {
        anyhow::bail!(
            "{} and {} must both lie in one chronofs mount",
            src.abs.display(),
            dst.abs.display()
        );
    }
    let v = src
        .client()
        .clone_path(&src.path, &dst.path, parse_at(at)?)
        .map_err(|e| clone_refusal(e, dst_arg))
        .with_context(|| {
            format!(
                "cannot clone {} to {}",
                src_arg.display(),
                dst_arg.display()
            )
        })?;
    if json {
        print_json(&v);
    } else {
        println!(
            "cloned {} as of #{} ({}) to {}",
            src.abs.display(),
            v.seq,
            spec::show(v.time_ns),
            dst.abs.display()
        );
    }
    Ok(())
}

/// A clone replaces DST as rename(2) would: the kinds that refuse it
/// said plainly, not as a bare errno.
pub(super) fn clone_refusal(e: control::ControlError, dst: &Path) -> anyhow::Error {
    let is_dir = std::fs::symlink_metadata(dst).map(|m| m.is_dir());
    let shown = dst.display();
    match (e.errno(), is_dir) {
        (libc::ENOTEMPTY | libc::EEXIST, Ok(true)) => anyhow::anyhow!(
            "{shown} is a directory that is not empty: a clone replaces only a file or an \
             empty directory, as rename does"
        ),
        (libc::EISDIR, Ok(true)) => {
            anyhow::anyhow!("{shown} is a directory: a file's clone cannot replace it")
        }
        (libc::ENOTDIR, Ok(false)) => {
            anyhow::anyhow!("{shown} is not a directory: a directory's clone cannot replace it")
        }
        _ => e.into(),
    }
}

pub fn tags(t: &Target, json: bool) -> Result<()> {
    let v = t.client().tags()?;
    if json {
        print_json(&v);
        return Ok(());
    }
    for e in &v.tags {
        println!(
            "{:<24} #{:<8} {}",
            e.name,
            e.seq,
            spec::show(e.time_ns.unwrap_or(0))
        );
    }
    Ok(())
}

/// fsck with a progress bar (local stores) or through the daemon.
pub fn fsck(t: &Target, repair: bool, json: bool) -> Result<bool> {
    let report = match &t.backend {
        Backend::Local(local) => {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "checking chunks {bar:40} {pos}/{len} {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            let me = sys::Peer::this_process();
            let r = local
                .service
                .fsck(repair, &me, &mut |done, total| {
                    bar.set_length(total);
                    bar.set_position(done);
                })
                .map_err(|e| anyhow!("{e}"))?;
            bar.finish_and_clear();
            r
        }
        Backend::Daemon(_) => t.client().fsck(repair)?,
    };
    let problems = report.problems.len();
    if json {
        print_json(&report);
        return Ok(problems == 0);
    }
    let cost = |c: &control::proto::Cost| {
        format!(
            "{}: {} (#{}, {})",
            c.path,
            c.version
                .map_or_else(|| "a version".to_string(), |n| format!("version {n}")),
            c.seq,
            c.time,
        )
    };
    if let Some(rep) = &report.repair {
        for p in &rep.found {
            println!("found: {p}");
        }
        if rep.reindexed > 0 {
            println!(
                "re-indexed {} chunk(s) from intact copies in the packs",
                rep.reindexed
            );
        }
        if rep.restored_chunks > 0 {
            println!(
                "stored {} chunk(s) again from live files",
                rep.restored_chunks
            );
        }
        for c in &rep.restored {
            println!("restored: {} reads again", cost(c));
        }
        for c in &rep.lost {
            println!("marked lost: {} ({})", cost(c), c.why);
        }
        if rep.removed_index_entries > 0 {
            println!(
                "dropped {} index entries of damaged chunks (their bytes are stored again when met)",
                rep.removed_index_entries
            );
        }
        println!("after repair:");
    }
    println!(
        "checked {} versions, {} manifests, {} chunks ({} bytes)",
        report.versions, report.manifests_checked, report.chunks_checked, report.bytes_checked
    );
    for p in &report.problems {
        println!("problem: {p}");
    }
    if report.lost_versions > 0 {
        println!(
            "{} version(s) are marked lost (`chronofs log` shows them; they cannot be read)",
            report.lost_versions
        );
    }
    if let Some(head) = &report.chain_head {
        println!(
            "hash chain: {} change(s) verified, head #{} {head}{}",
            report.chained_changes,
            report.chain_head_seq.unwrap_or(0),
            match report.unchained_changes {
                0 => String::new(),
                n => format!(" ({n} older change(s) predate the chain)"),
            }
        );
    }
    println!(
        "{}",
        if problems == 0 {
            "store is consistent"
        } else {
            "store has problems"
        }
    );
    Ok(problems == 0)
}

#[cfg(test)]
mod tests {
    use super::{absolutize, mode_str, parse_at};
    use crate::control::At;
    use crate::history::Seq;
    use std::path::Path;

    /// Paths resolve as the kernel resolves them (`ls`, `cat` agree).
    #[test]
    fn paths_resolve_as_the_kernel_resolves_them() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("d/sub")).unwrap();
        std::fs::write(root.join("x"), "top").unwrap();
        std::fs::write(root.join("d/x"), "inner").unwrap();
        std::os::unix::fs::symlink("d/sub", root.join("s")).unwrap();
        std::os::unix::fs::symlink("d", root.join("lnk")).unwrap();
        let abs = |p: &str| absolutize(&root.join(p)).map_err(|e| e.to_string());
        let at = |p: &str| Ok(root.join(p));
        // `..` after a symlink: the parent of where it leads.
        assert_eq!(abs("s/../x"), at("d/x"));
        assert_eq!(
            std::fs::read_to_string(root.join("s/../x")).unwrap(),
            "inner"
        );
        // The last name is the symlink itself, unless `/` or `.` follows.
        assert_eq!(abs("lnk"), at("lnk"));
        assert_eq!(abs("lnk/"), at("d"));
        assert_eq!(abs("lnk/."), at("d"));
        assert_eq!(abs("d/./sub/.."), at("d"));
        // A file named as a directory is not one.
        assert!(abs("x/").unwrap_err().contains("Not a directory"));
        assert!(abs("x/.").is_err());
        // `..` after a file is ENOTDIR, not its parent (bug hunt).
        assert!(abs("x/..").unwrap_err().contains("Not a directory"));
        assert!(abs("d/x/../sub").unwrap_err().contains("Not a directory"));
        // Names that do not exist (yet) are kept as written.
        assert_eq!(abs("new/a/../b"), at("new/b"));
        assert_eq!(abs("s/new/"), at("d/sub/new"));
        assert_eq!(absolutize(Path::new("/")).unwrap(), Path::new("/"));
    }

    #[test]
    fn instants_read_as_in_history_dir_names() {
        let at = |s| parse_at(Some(s)).map_err(|e| e.to_string());
        assert_eq!(at("@start"), Ok(At::Tag("start".into())));
        assert_eq!(at("@#3"), at("#3"));
        assert_eq!(at("@3"), Ok(At::Seq(Seq::new(3))));
        assert_eq!(at("@now"), Ok(At::Now));
        assert!(at("@@start").is_err());
    }

    #[test]
    fn modes_show_as_ls_shows_them() {
        assert_eq!(mode_str("file", 0o644), "-rw-r--r--");
        assert_eq!(mode_str("file", 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_str("file", 0o2644), "-rw-r-Sr--");
        assert_eq!(mode_str("dir", 0o1777), "drwxrwxrwt");
        assert_eq!(mode_str("dir", 0o1770), "drwxrwx--T");
        assert_eq!(mode_str("file", 0o6711), "-rws--s--x");
    }
}
