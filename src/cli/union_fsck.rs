//! `chronofs fsck BR1=rw:BR2=ro:...`: the union invariants of a branch
//! list (`union::fsck`), given as `mount` takes it, checked over the
//! branches that union has now (snapshots' fresh branches and changes
//! made while mounted included).

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use super::history::print_json;
use crate::branch::claim::unescape;
use crate::store::Store;
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

/// Checks (and with `repair` fixes) the branches of the union the list
/// makes (see [`live_set`]); true when nothing is left to fix. `store`:
/// where its store is, when not in the first read-write branch.
pub fn run(
    arg: &Path,
    (repair, ns): (bool, XattrNs),
    json: bool,
    store: Option<&Path>,
) -> Result<bool> {
    // Malformed (not a branch that is missing): a usage error, exit 2.
    let spec = UnionSpec::parse(arg.as_os_str()).map_err(|e| match e.is_syntax() {
        true => anyhow::anyhow!(super::UsageError(e.to_string())),
        false => e.into(),
    })?;
    let mounted = mounted_at(&spec);
    if let (true, Some((branch, mnt))) = (repair, &mounted) {
        anyhow::bail!(
            "branch {} is mounted by chronofs at {mnt}: unmount it before fsck --repair",
            branch.display()
        );
    }
    let set = live_set(&spec, mounted.map(|(_, mnt)| mnt), store)?;
    let mut branches = Vec::with_capacity(set.len());
    for b in &set {
        let root =
            std::fs::File::open(&b.path).with_context(|| format!("branch {}", b.path.display()))?;
        branches.push(Branch {
            root: OwnedFd::from(root),
            writable: b.writable,
            frozen: b.frozen,
        });
    }
    // The store of a mount lives in its top read-write branch's root.
    let store = OsStr::new(super::mount::STORE_DIR_NAME);
    let found = fsck::check(&branches, ns, repair, Some(store))?;
    let problems: Vec<Problem> = found
        .iter()
        .map(|f| Problem {
            branch: f.branch + 1,
            branch_path: set[f.branch].path.display().to_string(),
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
        println!("union: {} branch(es) clean", set.len());
    }
    Ok(clean)
}

/// A branch of the union fsck checks.
struct SetBranch {
    path: PathBuf,
    writable: bool,
    /// Frozen by a snapshot of the union's store: snapmerge writes it,
    /// and a crash inside a snapmerge leaves its temporaries there.
    frozen: bool,
}

/// The branches a union of `spec` has, top first, with whether each is
/// read-write: the set in force where it is mounted (asked of the mount at
/// `mounted`), else the set its store resumes at the next mount (snapshots
/// and branch changes made while mounted included), else the list as given.
fn live_set(
    spec: &UnionSpec,
    mounted: Option<String>,
    store: Option<&Path>,
) -> Result<Vec<SetBranch>> {
    let listed = listed_set(spec);
    if let Some(mnt) = mounted {
        let reply = super::history::target(Path::new(&mnt), None)?
            .client()
            .branches()?;
        return Ok(reply
            .branches
            .into_iter()
            .map(|b| SetBranch {
                path: PathBuf::from(b.path),
                writable: b.mode == "rw",
                frozen: false,
            })
            .collect());
    }
    let primary = listed.iter().find(|b| b.writable).or(listed.first());
    let dir = match (store, primary) {
        (Some(dir), _) => dir.to_path_buf(),
        (None, Some(b)) => b.path.join(super::mount::STORE_DIR_NAME),
        (None, None) => return Ok(listed),
    };
    if !dir.join("index.redb").is_file() {
        return Ok(listed);
    }
    let store = Store::open(&dir).map_err(|e| anyhow::anyhow!("store {}: {e}", dir.display()))?;
    let known = store.branches()?;
    let mut roots = Vec::with_capacity(listed.len());
    for b in &listed {
        let dir =
            std::fs::File::open(&b.path).with_context(|| format!("branch {}", b.path.display()))?;
        roots.push(crate::store::BranchRoot::of(b.path.clone(), dir.as_fd())?);
    }
    let mut mounted = Vec::with_capacity(listed.len());
    for (listed, ident) in listed.iter().zip(store.known_idents(&roots)?) {
        let Some(b) = ident else {
            return Ok(listed_set(spec)); // Never mounted with this list.
        };
        mounted.push((b.id, listed.writable));
    }
    let Some(set) = store.branch_set()? else {
        return Ok(listed);
    };
    let frozen: Vec<u32> = store
        .branch_set_log()
        .snapshots()?
        .iter()
        .map(|s| s.branch)
        .collect();
    let mut out = Vec::new();
    for (id, rw) in set.starting(&mounted) {
        let b = known
            .iter()
            .find(|b| b.id == id)
            .with_context(|| format!("store {}: branch id {id} is unknown", dir.display()))?;
        out.push(SetBranch {
            path: b.root.path.clone(),
            writable: rw,
            frozen: frozen.contains(&id),
        });
    }
    Ok(out)
}

/// The branches as `spec` lists them.
fn listed_set(spec: &UnionSpec) -> Vec<SetBranch> {
    spec.branches()
        .iter()
        .map(|b| SetBranch {
            path: b.path().to_path_buf(),
            writable: b.mode().is_writable(),
            frozen: false,
        })
        .collect()
}

/// A repair must not remove the temporary of a copy-up in progress: where
/// a branch of the list is the source of a running chronofs mount
/// (mountinfo names a union's primary branch as its source), that branch
/// and the mount point.
fn mounted_at(spec: &UnionSpec) -> Option<(PathBuf, String)> {
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
        if let Some(b) = spec.branches().iter().find(|b| b.path() == source) {
            return Some((b.path().to_path_buf(), mnt.display().to_string()));
        }
    }
    None
}
