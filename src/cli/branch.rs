//! `chronofs branch`: a mounted union's branches, listed and changed
//! while mounted (issue 17). The daemon does the change; this asks it.

use std::path::Path;

use anyhow::{bail, Result};

use super::history::{self as h, Backend};
use crate::control::proto::BranchRow;

fn daemon_target(mnt: &Path) -> Result<h::Target> {
    let t = h::target(mnt, None)?;
    if matches!(t.backend, Backend::Local(_)) {
        bail!(
            "nothing is mounted at {}: branches change only on a mounted union",
            mnt.display()
        );
    }
    Ok(t)
}

fn show(b: &BranchRow) -> String {
    format!(
        "{:>3}  {}  id {:<3} {}{}",
        b.position,
        b.mode,
        b.id,
        b.path,
        if b.upper {
            "  (upper: copy-ups go here)"
        } else {
            ""
        }
    )
}

pub fn list(mnt: &Path, json: bool) -> Result<()> {
    let reply = daemon_target(mnt)?.client().branches()?;
    if json {
        h::print_json(&reply);
        return Ok(());
    }
    for b in &reply.branches {
        println!("{}", show(b));
    }
    Ok(())
}

pub fn mode(mnt: &Path, branch: &str, mode: &str, force: bool, json: bool) -> Result<()> {
    let writable = match mode {
        "rw" => true,
        "ro" => false,
        other => bail!("unknown mode {other:?}: use ro or rw"),
    };
    let reply = daemon_target(mnt)?
        .client()
        .branch_mode(branch, writable, force)?;
    if json {
        h::print_json(&reply);
        return Ok(());
    }
    let b = &reply.branch;
    if !reply.changed {
        println!("branch {} ({}) is already {}", b.position, b.path, b.mode);
        return Ok(());
    }
    println!(
        "branch {} ({}) is now {}{}",
        b.position,
        b.path,
        b.mode,
        match reply.revoked {
            0 => String::new(),
            n => format!("; {n} write handle(s) revoked (they now fail with ESTALE)"),
        }
    );
    Ok(())
}
