//! The history verbs: log, cat, ls, restore, revert, undelete, diff, tag,
//! tags, status, fsck.
//!
//! Queries go to the running mount's daemon over its control socket, or,
//! when nothing is mounted, straight to the store. Restore, revert and
//! undelete write through ordinary system calls as the calling user, so
//! permissions are the file system's own and, through a mount, every change
//! they make is itself a version that can be undone.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::control::{self, spec, At, Components, Request};
use crate::history::History;
use crate::store::Store;
use crate::sys;

/// Where requests are answered.
pub enum Backend {
    Daemon(PathBuf),
    Local(Box<LocalStore>),
}

pub struct LocalStore {
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

/// Absolute and normalized, without needing the path to exist: the
/// deepest existing ancestor is canonicalized, the rest kept as written.
pub fn absolutize(p: &Path) -> Result<PathBuf> {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    let mut norm = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                norm.pop();
            }
            Component::CurDir => {}
            other => norm.push(other),
        }
    }
    let mut existing = norm.clone();
    let mut rest = Vec::new();
    loop {
        if std::fs::symlink_metadata(&existing).is_ok() {
            // Resolve symlinks in the ancestors, never the last component.
            let base = match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) if !rest.is_empty() || existing == norm => {
                    parent.canonicalize()?.join(name)
                }
                _ => existing.canonicalize()?,
            };
            let mut out = base;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return Ok(out);
        }
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => return Ok(norm),
        }
    }
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
    let abs = absolutize(path)?;
    if let Some(m) = control::mount_of(&abs) {
        let socket = control::socket_of(&m, sys::geteuid()).ok_or_else(|| {
            anyhow!(
                "the chronofs mount at {} has no control socket (mounted with -o plain?)",
                m.mount_point.display()
            )
        })?;
        let rel = abs.strip_prefix(&m.mount_point).unwrap_or(Path::new(""));
        return Ok(Target {
            backend: Backend::Daemon(socket),
            path: components(rel),
            abs,
        });
    }
    let (src, store_dir) = match store {
        Some(s) => {
            let src = find_src(&abs, None).ok_or_else(|| {
                anyhow!("with --store, PATH must lie inside the source directory it belongs to")
            })?;
            (src, s.to_path_buf())
        }
        None => {
            let src = find_src(&abs, Some(".chronofs")).ok_or_else(|| {
                anyhow!(
                    "{} is not inside a chronofs mount or a directory with a .chronofs store",
                    abs.display()
                )
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
        libc::AT_FDCWD,
        &sys::cstr(src.as_os_str())?,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )
    .with_context(|| format!("source {}", src.display()))?;
    let root_st = sys::fstat(std::os::fd::AsFd::as_fd(&root))?;
    let reserved = store_dir
        .strip_prefix(src)
        .ok()
        .filter(|r| r.components().count() == 1)
        .map(|r| r.as_os_str().to_os_string());
    let host = Box::new(StoreHost { inomap, root_st });
    let source = crate::policy::load::Source {
        admin: None,
        users: true,
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
        service,
        _history: history,
    })
}

/// A store opened directly (nothing mounted).
struct StoreHost {
    inomap: crate::store::InodeMap,
    root_st: sys::Stat,
}

impl control::service::Host for StoreHost {}

impl crate::history::past::LiveIds for StoreHost {
    fn identify(&self, st: &sys::Stat) -> Option<crate::history::ObjectId> {
        if st.st_dev == self.root_st.st_dev && st.st_ino == self.root_st.st_ino {
            return Some(crate::history::ROOT);
        }
        let key = crate::store::BackingKey {
            branch: 0,
            dev: st.st_dev,
            ino: st.st_ino,
        };
        self.inomap.get(&key).ok().flatten()
    }
}

impl Target {
    pub fn call(&self, req: &Request, data: &mut dyn Write) -> Result<Value> {
        let r = match &self.backend {
            Backend::Daemon(sock) => control::call(sock, req, data),
            Backend::Local(local) => control::call_local(&local.service, req, data),
        };
        r.map_err(|e| anyhow!(e))
    }

    pub fn query(&self, req: &Request) -> Result<Value> {
        self.call(req, &mut std::io::sink())
    }

    /// The result's JSON text, unparsed (for `--json` output of answers
    /// too large to parse and print again cheaply).
    pub fn query_raw(&self, req: &Request) -> Result<Vec<u8>> {
        let mut sink = std::io::sink();
        let r = match &self.backend {
            Backend::Daemon(sock) => control::call_raw(sock, req, &mut sink),
            Backend::Local(local) => control::call_local_raw(&local.service, req, &mut sink),
        };
        r.map_err(|e| anyhow!(e))
    }
}

pub fn parse_at(s: Option<&str>) -> Result<At> {
    match s {
        None => Ok(At::Now),
        Some(s) => spec::parse(s).map_err(|e| anyhow!(e)),
    }
}

pub(super) fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn user_name(uid: u64) -> String {
    sys::user_name(uid as u32).unwrap_or_else(|| uid.to_string())
}

fn size_str(v: &Value) -> String {
    v.as_u64().map_or("-".into(), |n| n.to_string())
}

pub fn log(
    t: &Target,
    since: Option<&str>,
    until: Option<&str>,
    recursive: bool,
    json: bool,
) -> Result<()> {
    let req = Request::Log {
        path: t.path.clone(),
        since: since.map(|s| parse_at(Some(s))).transpose()?,
        until: until.map(|s| parse_at(Some(s))).transpose()?,
        recursive,
    };
    if json && recursive {
        // Passed through as the daemon encoded it (compact, one line):
        // parsing and pretty-printing 10+ MB cost as much as answering.
        let raw = t.query_raw(&req)?;
        let mut out = std::io::stdout().lock();
        out.write_all(&raw)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|e| anyhow!("writing output: {e}"))?;
        return Ok(());
    }
    let v = t.query(&req)?;
    if json {
        print_json(&v);
        return Ok(());
    }
    let empty = Vec::new();
    let rows = v["versions"].as_array().unwrap_or(&empty);
    if rows.is_empty() {
        println!("no versions recorded in that range (unchanged since history began)");
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
    for r in rows {
        let time = spec::show(r["time_ns"].as_i64().unwrap_or(0));
        let cause = r["cause"].as_str().unwrap_or("?");
        let gone = match (r["gone"].as_bool(), r["lost"].as_bool()) {
            (Some(true), Some(true)) => " (gone) (lost: cannot be read)",
            (_, Some(true)) => " (lost: cannot be read)",
            (Some(true), _) => " (gone)",
            _ => "",
        };
        let user = user_name(r["uid"].as_u64().unwrap_or(0));
        let proc_ = match (r["process"].as_str(), r["pid"].as_u64()) {
            (_, Some(0)) | (_, None) => "-".to_string(),
            (Some(name), Some(pid)) => format!("{name}[{pid}]"),
            (None, Some(pid)) => format!("[{pid}]"),
        };
        let seq = r["seq"].to_string();
        if recursive {
            println!(
                "{:>8}  {:<19}  {:<11} {:>10}  {:<8} {:<12} {}{gone}",
                seq,
                time,
                cause,
                size_str(&r["size"]),
                user,
                proc_,
                r["path"].as_str().unwrap_or("")
            );
            continue;
        }
        let inc = r["incarnation"].as_u64().unwrap_or(1);
        if inc != last_inc {
            println!("---- incarnation {inc} (object {}) ----", r["obj"]);
            last_inc = inc;
        }
        println!(
            "{:>4} {:>8}  {:<19}  {:<11} {:>10}  {:<8} {proc_}{gone}",
            size_str(&r["n"]),
            seq,
            time,
            cause,
            size_str(&r["size"]),
            user
        );
    }
    Ok(())
}

pub fn cat(t: &Target, at: Option<&str>, version: Option<i64>) -> Result<()> {
    let req = Request::Read {
        path: t.path.clone(),
        at: parse_at(at)?,
        version,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    t.call(&req, &mut out)?;
    out.flush()?;
    Ok(())
}

fn mode_str(kind: &str, mode: u64) -> String {
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
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

pub fn ls(t: &Target, at: Option<&str>, deleted: bool, long: bool, json: bool) -> Result<()> {
    let v = t.query(&Request::List {
        path: t.path.clone(),
        at: parse_at(at)?,
        deleted,
    })?;
    if json {
        print_json(&v);
        return Ok(());
    }
    let empty = Vec::new();
    if !deleted {
        for e in v["entries"].as_array().unwrap_or(&empty) {
            let name = e["name"].as_str().unwrap_or("?");
            if long {
                let mtime = e["mtime_ns"].as_i64().unwrap_or(0);
                let target = e["target"]
                    .as_str()
                    .map(|t| format!(" -> {t}"))
                    .unwrap_or_default();
                println!(
                    "{} {:>3} {:<8} {:>10} {} {name}{target}",
                    mode_str(
                        e["kind"].as_str().unwrap_or(""),
                        e["mode"].as_u64().unwrap_or(0)
                    ),
                    e["nlink"].to_string(),
                    user_name(e["uid"].as_u64().unwrap_or(0)),
                    size_str(&e["size"]),
                    spec::show(mtime)
                );
            } else {
                println!("{name}");
            }
        }
        return Ok(());
    }
    for e in v["deleted"].as_array().unwrap_or(&empty) {
        println!(
            "{:<24} {:<7} {:>10}  deleted {} (#{})",
            e["name"].as_str().unwrap_or("?"),
            e["kind"].as_str().unwrap_or("?"),
            size_str(&e["size"]),
            spec::show(e["deleted_time_ns"].as_i64().unwrap_or(0)),
            e["deleted_seq"]
        );
    }
    Ok(())
}

pub fn status(t: &Target, json: bool) -> Result<()> {
    let v = t.query(&Request::Status)?;
    if json {
        print_json(&v);
        return Ok(());
    }
    let mib = |k: &str| v[k].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
    println!("store:        {}", v["store"].as_str().unwrap_or("?"));
    match v["poisoned"].as_str() {
        Some(why) => println!(
            "health:       POISONED: {why}; changes are refused (EIO) until the mount is restarted"
        ),
        None => println!("health:       ok"),
    }
    if let Some(n) = v["unrecorded"].as_u64().filter(|n| *n > 0) {
        println!("unrecorded:   {n} change(s) made while the store was full (see the log)");
    }
    println!(
        "store size:   {:.1} MiB ({:.1} MiB in packs)",
        mib("store_bytes"),
        mib("pack_bytes")
    );
    println!("changes:      {}", v["changes"]);
    println!("versions:     {}", v["versions"]);
    println!(
        "chunks:       {} ({:.1} MiB, {:.1} MiB stored)",
        v["chunks"],
        mib("chunk_bytes"),
        mib("stored_bytes")
    );
    println!(
        "content:      {:.1} MiB across all versions",
        mib("logical_bytes")
    );
    println!(
        "dedup:        {:.2}x   compression: {:.2}x",
        v["dedup_ratio"].as_f64().unwrap_or(1.0),
        v["compression_ratio"].as_f64().unwrap_or(1.0)
    );
    println!("tags:         {}", v["tags"]);
    if let Some(head) = v["chain_head"].as_object() {
        // What an administrator notes elsewhere: a store rewritten behind
        // chronofs's back cannot keep this value.
        println!(
            "chain head:   #{} {}",
            head["seq"],
            head["hash"].as_str().unwrap_or("?")
        );
    }
    let ing = &v["ingest"];
    if !ing.is_null() {
        let state = if ing["running"].as_bool() == Some(true) {
            "running"
        } else {
            "done"
        };
        println!(
            "ingest:       {state}: {} dirs, {} files, {:.1} MiB, {} error(s)",
            ing["dirs"],
            ing["files"],
            ing["bytes"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64,
            ing["errors"]
        );
    }
    for (label, key) in [("first change", "first"), ("last change", "last")] {
        if let Some(t) = v[key]["time_ns"].as_i64() {
            println!("{label}: {} (#{})", spec::show(t), v[key]["seq"]);
        }
    }
    Ok(())
}

/// Starts the eager baseline and shows its progress until done.
pub fn ingest(t: &Target, wait: bool, json: bool) -> Result<()> {
    t.query(&Request::Ingest)?;
    if !wait {
        if !json {
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
        let v = t.query(&Request::Status)?;
        let p = &v["ingest"];
        let msg = format!(
            "{} dirs, {} files, {:.1} MiB",
            p["dirs"],
            p["files"],
            p["bytes"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64
        );
        bar.set_message(msg.clone());
        if p["done"].as_bool() == Some(true) || p.is_null() {
            bar.finish_and_clear();
            if json {
                print_json(p);
            } else {
                println!("ingest done: {msg}, {} error(s)", p["errors"]);
            }
            return Ok(());
        }
        bar.tick();
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

pub fn tag(t: &Target, name: &str, at: Option<&str>, delete: bool, json: bool) -> Result<()> {
    let req = if delete {
        Request::Untag { name: name.into() }
    } else {
        Request::Tag {
            name: name.into(),
            at: parse_at(at)?,
        }
    };
    let v = t.query(&req)?;
    if json {
        print_json(&v);
    } else if delete {
        println!("removed tag {name}");
    } else {
        println!(
            "tagged #{} ({}) as {name}",
            v["seq"],
            spec::show(v["time_ns"].as_i64().unwrap_or(0))
        );
    }
    Ok(())
}

pub fn tags(t: &Target, json: bool) -> Result<()> {
    let v = t.query(&Request::Tags)?;
    if json {
        print_json(&v);
        return Ok(());
    }
    let empty = Vec::new();
    for e in v["tags"].as_array().unwrap_or(&empty) {
        println!(
            "{:<24} #{:<8} {}",
            e["name"].as_str().unwrap_or("?"),
            e["seq"],
            spec::show(e["time_ns"].as_i64().unwrap_or(0))
        );
    }
    Ok(())
}

/// Restores `t.path` as of `at` to `dest`. `prune`: also remove what did
/// not exist then (revert). Returns how many objects were written.
pub fn restore(t: &Target, at: &At, dest: &Path, prune: bool) -> Result<u64> {
    let node = t.query(&Request::Stat {
        path: t.path.clone(),
        at: at.clone(),
    })?;
    let mut count = 0;
    restore_node(t, at, &t.path, &node, dest, prune, &mut count)?;
    Ok(count)
}

fn same_as_live(node: &Value, live: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let kind_ok = match node["kind"].as_str() {
        Some("file") => live.file_type().is_file(),
        Some("dir") => live.file_type().is_dir(),
        Some("symlink") => live.file_type().is_symlink(),
        _ => false,
    };
    kind_ok
        && node["size"].as_u64() == Some(live.size())
        && node["mode"].as_u64() == Some(u64::from(live.mode() & 0o7777))
        && node["mtime_ns"].as_i64() == Some(live.mtime() * 1_000_000_000 + live.mtime_nsec())
}

#[allow(clippy::too_many_arguments)]
fn restore_node(
    t: &Target,
    at: &At,
    path: &Components,
    node: &Value,
    dest: &Path,
    prune: bool,
    count: &mut u64,
) -> Result<()> {
    let live = std::fs::symlink_metadata(dest).ok();
    let kind = node["kind"].as_str().unwrap_or("");
    if node["lost"].as_bool() == Some(true) {
        // Marked lost by fsck --repair: nothing to bring back.
        eprintln!(
            "chronofs: {}: content lost (damaged in the store); left as it is",
            dest.display()
        );
        return Ok(());
    }
    if node["unrecorded"].as_bool() == Some(true) {
        // Not versioned by policy: there is nothing to bring back, and the
        // live file (if any) is the best there is.
        eprintln!(
            "chronofs: {}: content not versioned by policy; left as it is",
            dest.display()
        );
        return Ok(());
    }
    if let Some(m) = &live {
        if kind != "dir" && same_as_live(node, m) {
            return Ok(());
        }
        let wrong_kind = match kind {
            "dir" => !m.file_type().is_dir(),
            "file" => !m.file_type().is_file(),
            _ => true,
        };
        if wrong_kind {
            remove_tree(dest)?;
        }
    }
    match kind {
        "file" => {
            // Opened (and truncated) only once the daemon sends data or
            // succeeds: a refused read (EACCES) leaves DEST as it was.
            let mut out = LazyFile { dest, file: None };
            let req = Request::Read {
                path: path.clone(),
                at: at.clone(),
                version: None,
            };
            t.call(&req, &mut out)?;
            out.file()?.flush()?;
        }
        "dir" => {
            // Asked first, so a refused listing creates nothing.
            let listing = t.query(&Request::List {
                path: path.clone(),
                at: at.clone(),
                deleted: false,
            })?;
            if !dest.is_dir() {
                std::fs::create_dir(dest)
                    .with_context(|| format!("cannot create {}", dest.display()))?;
            }
            let empty = Vec::new();
            let entries = listing["entries"].as_array().unwrap_or(&empty);
            let mut keep = std::collections::HashSet::new();
            for e in entries {
                let name = e["name"].as_str().unwrap_or("").to_string();
                keep.insert(OsString::from(&name));
                let mut child = path.clone();
                child.push(name.clone().into_bytes());
                restore_node(t, at, &child, e, &dest.join(&name), prune, count)?;
            }
            if prune {
                for entry in std::fs::read_dir(dest)? {
                    let entry = entry?;
                    if !keep.contains(&entry.file_name()) {
                        remove_tree(&entry.path())?;
                        *count += 1;
                    }
                }
            }
        }
        "symlink" => {
            if live.is_some() {
                std::fs::remove_file(dest).ok();
            }
            let target = node["target"].as_str().unwrap_or("");
            std::os::unix::fs::symlink(target, dest)
                .with_context(|| format!("cannot create {}", dest.display()))?;
            *count += 1;
            return Ok(());
        }
        "fifo" => {
            sys::mkfifo(dest, node["mode"].as_u64().unwrap_or(0o644) as u32)
                .with_context(|| format!("cannot create {}", dest.display()))?;
        }
        other => {
            eprintln!(
                "chronofs: skipping {} ({other} files are not restored)",
                dest.display()
            );
            return Ok(());
        }
    }
    set_meta(dest, node)?;
    *count += 1;
    Ok(())
}

/// A restored file's destination, created or truncated at its first
/// write.
struct LazyFile<'a> {
    dest: &'a Path,
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl LazyFile<'_> {
    fn file(&mut self) -> std::io::Result<&mut std::io::BufWriter<std::fs::File>> {
        if self.file.is_none() {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(self.dest)
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot write {}: {e}", self.dest.display()),
                    )
                })?;
            self.file = Some(std::io::BufWriter::with_capacity(1 << 20, f));
        }
        match self.file.as_mut() {
            Some(f) => Ok(f),
            None => Err(std::io::Error::other("restore destination not open")),
        }
    }
}

impl Write for LazyFile<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file()?.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

fn set_meta(dest: &Path, node: &Value) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = node["mode"].as_u64().unwrap_or(0o644) as u32;
    if sys::geteuid() == 0 {
        if let (Some(uid), Some(gid)) = (node["uid"].as_u64(), node["gid"].as_u64()) {
            std::os::unix::fs::lchown(dest, Some(uid as u32), Some(gid as u32)).ok();
        }
    }
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", dest.display()))?;
    if let (Some(a), Some(m)) = (node["atime_ns"].as_i64(), node["mtime_ns"].as_i64()) {
        sys::set_times(dest, a, m).ok();
    }
    Ok(())
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
    let v = t.query(&Request::List {
        path: parent.to_vec(),
        at: At::Now,
        deleted: true,
    })?;
    let empty = Vec::new();
    let hit = v["deleted"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .find(|e| e["name"].as_str().map(str::as_bytes) == Some(name.as_slice()))
        .ok_or_else(|| {
            anyhow!(
                "{} is not a deleted entry of its directory (see `chronofs ls --deleted`)",
                t.abs.display()
            )
        })?;
    // The instant before the removal (of a tree: before `rm -rf` began).
    let seq = hit["restore_seq"].as_u64().ok_or_else(|| {
        anyhow!(
            "the daemon did not say when {} was removed",
            t.abs.display()
        )
    })?;
    Ok(At::Seq(seq))
}

/// Reads a file's bytes at `at` (for diff).
fn read_bytes(t: &Target, path: &Components, at: &At) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    t.call(
        &Request::Read {
            path: path.clone(),
            at: at.clone(),
            version: None,
        },
        &mut buf,
    )?;
    Ok(buf)
}

fn show_components(p: &Components) -> String {
    let parts: Vec<String> = p
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    format!("/{}", parts.join("/"))
}

/// Diffs `t.path` between two instants; returns whether they differ.
pub fn diff(t: &Target, a: &At, b: &At, out: &mut dyn Write) -> Result<bool> {
    // A bad instant is an error, not an absent file.
    for at in [a, b] {
        t.query(&Request::Resolve { at: at.clone() })?;
    }
    let na = t
        .query(&Request::Stat {
            path: t.path.clone(),
            at: a.clone(),
        })
        .ok();
    let nb = t
        .query(&Request::Stat {
            path: t.path.clone(),
            at: b.clone(),
        })
        .ok();
    diff_nodes(t, &t.path, a, b, na.as_ref(), nb.as_ref(), out)
}

fn same_version(x: &Value, y: &Value) -> bool {
    x["obj"] == y["obj"]
        && x["seq"] == y["seq"]
        && x["source"] == y["source"]
        && !x["seq"].is_null()
}

fn diff_nodes(
    t: &Target,
    path: &Components,
    a: &At,
    b: &At,
    na: Option<&Value>,
    nb: Option<&Value>,
    out: &mut dyn Write,
) -> Result<bool> {
    let shown = show_components(path);
    match (na, nb) {
        (None, None) => bail!("{shown} existed at neither instant"),
        (Some(_), None) => {
            writeln!(out, "Only in A: {shown}")?;
            Ok(true)
        }
        (None, Some(_)) => {
            writeln!(out, "Only in B: {shown}")?;
            Ok(true)
        }
        (Some(x), Some(y)) => {
            let (kx, ky) = (
                x["kind"].as_str().unwrap_or(""),
                y["kind"].as_str().unwrap_or(""),
            );
            if kx != ky {
                writeln!(out, "{shown}: {kx} in A, {ky} in B")?;
                return Ok(true);
            }
            if same_version(x, y) {
                return Ok(false);
            }
            match kx {
                "dir" => diff_dirs(t, path, a, b, out),
                "file" => diff_files(t, path, a, b, x, y, out),
                "symlink" if x["target"] != y["target"] => {
                    writeln!(
                        out,
                        "{shown}: symlink to {} in A, to {} in B",
                        x["target"], y["target"]
                    )?;
                    Ok(true)
                }
                _ if x["mode"] != y["mode"] => {
                    writeln!(
                        out,
                        "{shown}: mode {:o} in A, {:o} in B",
                        x["mode"].as_u64().unwrap_or(0),
                        y["mode"].as_u64().unwrap_or(0)
                    )?;
                    Ok(true)
                }
                _ => Ok(false),
            }
        }
    }
}

fn diff_files(
    t: &Target,
    path: &Components,
    a: &At,
    b: &At,
    x: &Value,
    y: &Value,
    out: &mut dyn Write,
) -> Result<bool> {
    let shown = show_components(path);
    let (da, db) = (read_bytes(t, path, a)?, read_bytes(t, path, b)?);
    let mut differs = false;
    if da != db {
        differs = true;
        match (std::str::from_utf8(&da), std::str::from_utf8(&db)) {
            (Ok(sa), Ok(sb)) if !sa.contains('\0') && !sb.contains('\0') => {
                let d = similar::TextDiff::from_lines(sa, sb);
                let mut u = d.unified_diff();
                let ha = format!("a{shown}");
                let hb = format!("b{shown}");
                write!(out, "{}", u.header(&ha, &hb))?;
            }
            _ => writeln!(
                out,
                "Binary files a{shown} ({} bytes) and b{shown} ({} bytes) differ",
                da.len(),
                db.len()
            )?,
        }
    }
    if x["mode"] != y["mode"] {
        differs = true;
        writeln!(
            out,
            "{shown}: mode {:o} in A, {:o} in B",
            x["mode"].as_u64().unwrap_or(0),
            y["mode"].as_u64().unwrap_or(0)
        )?;
    }
    Ok(differs)
}

fn diff_dirs(t: &Target, path: &Components, a: &At, b: &At, out: &mut dyn Write) -> Result<bool> {
    let list = |at: &At| -> Result<std::collections::BTreeMap<String, Value>> {
        let v = t.query(&Request::List {
            path: path.clone(),
            at: at.clone(),
            deleted: false,
        })?;
        let empty = Vec::new();
        Ok(v["entries"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .map(|e| (e["name"].as_str().unwrap_or("").to_string(), e.clone()))
            .collect())
    };
    let (la, lb) = (list(a)?, list(b)?);
    let mut names: Vec<&String> = la.keys().chain(lb.keys()).collect();
    names.sort();
    names.dedup();
    let mut differs = false;
    for name in names {
        let mut child = path.clone();
        child.push(name.clone().into_bytes());
        differs |= diff_nodes(t, &child, a, b, la.get(name), lb.get(name), out)?;
    }
    Ok(differs)
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
            let me = sys::Peer {
                uid: sys::geteuid(),
                gid: sys::getegid(),
                pid: std::process::id(),
            };
            let r = local
                .service
                .fsck(repair, &me, &mut |done, total| {
                    bar.set_length(total);
                    bar.set_position(done);
                })
                .map_err(|e| anyhow!("{e}"))?;
            bar.finish_and_clear();
            serde_json::to_value(r)?
        }
        Backend::Daemon(_) => t.query(&Request::Fsck { repair })?,
    };
    let problems = report["problems"].as_array().map_or(0, Vec::len);
    if json {
        print_json(&report);
        return Ok(problems == 0);
    }
    let empty = Vec::new();
    let list = |v: &Value| v.as_array().unwrap_or(&empty).clone();
    let cost = |c: &Value| {
        format!(
            "{}: {} (#{}, {})",
            c["path"].as_str().unwrap_or("?"),
            c["version"]
                .as_u64()
                .map_or_else(|| "a version".to_string(), |n| format!("version {n}")),
            c["seq"],
            c["time"].as_str().unwrap_or("?"),
        )
    };
    let rep = &report["repair"];
    if rep.is_object() {
        for p in list(&rep["found"]) {
            println!("found: {}", p.as_str().unwrap_or(""));
        }
        let n = |k: &str| rep[k].as_u64().unwrap_or(0);
        if n("reindexed") > 0 {
            println!(
                "re-indexed {} chunk(s) from intact copies in the packs",
                n("reindexed")
            );
        }
        if n("restored_chunks") > 0 {
            println!(
                "stored {} chunk(s) again from live files",
                n("restored_chunks")
            );
        }
        for c in list(&rep["restored"]) {
            println!("restored: {} reads again", cost(&c));
        }
        for c in list(&rep["lost"]) {
            println!(
                "marked lost: {} ({})",
                cost(&c),
                c["why"].as_str().unwrap_or("")
            );
        }
        if n("removed_index_entries") > 0 {
            println!(
                "dropped {} index entries of damaged chunks (their bytes are stored again when met)",
                n("removed_index_entries")
            );
        }
        println!("after repair:");
    }
    println!(
        "checked {} versions, {} manifests, {} chunks ({} bytes)",
        report["versions"],
        report["manifests_checked"],
        report["chunks_checked"],
        report["bytes_checked"]
    );
    for p in list(&report["problems"]) {
        println!("problem: {}", p.as_str().unwrap_or(""));
    }
    if let Some(n) = report["lost_versions"].as_u64().filter(|n| *n > 0) {
        println!("{n} version(s) are marked lost (`chronofs log` shows them; they cannot be read)");
    }
    if let Some(head) = report["chain_head"].as_str() {
        println!(
            "hash chain: {} change(s) verified, head #{} {head}{}",
            report["chained_changes"],
            report["chain_head_seq"],
            match report["unchained_changes"].as_u64().unwrap_or(0) {
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
