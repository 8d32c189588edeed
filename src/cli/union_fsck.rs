//! `chronofs fsck BR1=rw:BR2=ro:...`: the union invariants of a branch
//! list (`union::fsck`), given as `mount` takes it.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::history::print_json;
use crate::union::format::XattrNs;
use crate::union::fsck::{self, Branch};
use crate::union::spec::UnionSpec;

/// Whether fsck's PATH is a branch list rather than a path (the rule
/// `mount` applies: a single SRC has neither ':' nor '=').
pub fn is_branch_list(arg: &Path) -> bool {
    arg.as_os_str()
        .as_bytes()
        .iter()
        .any(|b| *b == b':' || *b == b'=')
}

#[derive(Serialize)]
struct Problem {
    branch: usize,
    branch_path: String,
    path: String,
    problem: &'static str,
    repaired: bool,
}

#[derive(Serialize)]
struct Report {
    problems: Vec<Problem>,
}

/// Checks (and with `repair` fixes) the branches; true when nothing is
/// left to fix.
pub fn run(arg: &Path, repair: bool, json: bool) -> Result<bool> {
    let spec = UnionSpec::parse(arg.as_os_str())?;
    if repair {
        refuse_if_mounted(&spec)?;
    }
    let mut branches = Vec::with_capacity(spec.len());
    for b in spec.branches() {
        let root = std::fs::File::open(b.path())
            .with_context(|| format!("branch {}", b.path().display()))?;
        branches.push(Branch {
            root: OwnedFd::from(root),
            writable: b.mode().is_writable(),
        });
    }
    // The store of a mount lives in its top read-write branch's root.
    let store = OsStr::new(super::mount::STORE_DIR_NAME);
    let found = fsck::check(&branches, XattrNs::for_daemon(), repair, Some(store))?;
    let problems: Vec<Problem> = found
        .iter()
        .map(|f| Problem {
            branch: f.branch + 1,
            branch_path: spec.branches()[f.branch].path().display().to_string(),
            path: f.path.display().to_string(),
            problem: f.kind.describe(),
            repaired: f.repaired,
        })
        .collect();
    let clean = problems.iter().all(|p| p.repaired);
    if json {
        print_json(&Report { problems });
        return Ok(clean);
    }
    for p in &problems {
        let what = if p.repaired {
            "repaired"
        } else if repair {
            "NOT repaired (read-only branch, or the repair failed)"
        } else {
            "run fsck --repair"
        };
        println!(
            "branch {} ({}): {}: {} — {what}",
            p.branch, p.branch_path, p.path, p.problem
        );
    }
    if problems.is_empty() {
        println!("union: {} branch(es) clean", spec.len());
    }
    Ok(clean)
}

/// A repair must not remove the temporary of a copy-up in progress: no
/// branch may be the source of a running chronofs mount (mountinfo names
/// a union's primary branch as its source).
fn refuse_if_mounted(spec: &UnionSpec) -> Result<()> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split(' ');
        if r.next() != Some("fuse.chronofs") {
            continue;
        }
        let source = r.next().map(unescape).unwrap_or_default();
        let mnt = left.split(' ').nth(4).map(unescape).unwrap_or_default();
        if let Some(b) = spec
            .branches()
            .iter()
            .find(|b| b.path() == Path::new(&source))
        {
            anyhow::bail!(
                "branch {} is mounted by chronofs at {mnt}: unmount it before fsck --repair",
                b.path().display()
            );
        }
    }
    Ok(())
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok());
        match octal.and_then(|d| u8::from_str_radix(d, 8).ok()) {
            Some(v) if b[i] == b'\\' => {
                out.push(v);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
