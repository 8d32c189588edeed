//! Restore, revert and undelete: bring a file or tree back as of an
//! instant, writing through ordinary system calls as the calling user (so
//! permissions are the file system's own and, through a mount, every
//! change is itself a version that can be undone).

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::history::{print_json, Target};
use crate::control::{At, Components, Request};
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
    let resolved = t.query(&Request::Resolve { at: at.clone() })?;
    let n = restore(t, at, dest, verb == Verb::Revert)?;
    if json_out {
        print_json(&json!({
            "verb": verb.name(),
            "path": t.abs.display().to_string(),
            "dest": dest.display().to_string(),
            "at": {"seq": resolved["seq"], "time_ns": resolved["time_ns"], "time": resolved["time"]},
            "objects": n,
        }));
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
/// not exist then (revert). Returns how many objects were written.
pub fn restore(t: &Target, at: &At, dest: &Path, prune: bool) -> Result<u64> {
    let node = t.query(&Request::Stat {
        path: t.path.clone(),
        at: at.clone(),
    })?;
    let mut progress = Progress::new();
    let r = restore_node(t, at, &t.path, &node, dest, prune, &mut progress);
    progress.bar.finish_and_clear();
    r?;
    Ok(progress.count)
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
    count: &mut Progress,
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
                        count.add(1, dest);
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
            count.add(1, dest);
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
    count.add(1, dest);
    Ok(())
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
