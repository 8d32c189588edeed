//! `chronofs template`: name a tree as it is (or was), and make working
//! trees from it by clone; and `chronofs status --clones`
//! (`control/templates.rs` answers both).

use std::path::Path;

use anyhow::Result;

use super::history::{parse_at, print_json, shown, target};
use super::Common;
use crate::control;
use crate::history::spec;

/// A mount's daemon answers every template verb: a template is made and
/// used through the mount, never through a store opened beside it.
fn in_mount(path: &Path, store: Option<&Path>) -> Result<super::history::Target> {
    let abs = super::history::absolutize(path)?;
    if control::mount_of(&abs).is_none() {
        anyhow::bail!("{}: templates live in a chronofs mount", abs.display());
    }
    target(path, store)
}

pub fn create(name: &str, dir: &Path, at: Option<&str>, common: &Common) -> Result<()> {
    let t = in_mount(dir, common.store.as_deref())?;
    let v = t.client().template_create(name, &t.path, parse_at(at)?)?;
    if common.json {
        print_json(&v);
    } else {
        println!(
            "template {} is {} as of #{} ({})",
            v.name,
            shown(&t.abs.to_string_lossy()),
            v.seq,
            spec::show(v.time_ns.unwrap_or(0))
        );
    }
    Ok(())
}

pub fn instantiate(name: &str, dst: &Path, common: &Common) -> Result<()> {
    let t = in_mount(dst, common.store.as_deref())?;
    let v = t
        .client()
        .template_instantiate(name, &t.path)
        .map_err(|e| super::history::clone_refusal(e, dst))?;
    if common.json {
        print_json(&v);
    } else {
        println!(
            "made {} from template {name} (#{}, {})",
            shown(&t.abs.to_string_lossy()),
            v.seq,
            spec::show(v.time_ns)
        );
    }
    Ok(())
}

pub fn list(path: &Path, common: &Common) -> Result<()> {
    let t = in_mount(path, common.store.as_deref())?;
    let v = t.client().templates()?;
    if common.json {
        print_json(&v);
        return Ok(());
    }
    for e in &v.templates {
        println!(
            "{:<24} #{:<8} {}  {}",
            e.name,
            e.seq,
            spec::show(e.time_ns.unwrap_or(0)),
            shown(&e.path)
        );
    }
    Ok(())
}

pub fn delete(name: &str, path: &Path, common: &Common) -> Result<()> {
    let t = in_mount(path, common.store.as_deref())?;
    let v = t.client().template_delete(name)?;
    if common.json {
        print_json(&v);
    } else {
        println!("template {} removed (trees made from it stay)", v.name);
    }
    Ok(())
}

/// `chronofs status --clones`.
pub fn clones(path: &Path, common: &Common) -> Result<()> {
    let t = in_mount(path, common.store.as_deref())?;
    let v = t.client().clones()?;
    if common.json {
        print_json(&v);
        return Ok(());
    }
    for c in &v.clones {
        let at = format!("#{} ({})", c.seq, spec::show(c.time_ns.unwrap_or(0)));
        match (&c.path, &c.space) {
            (Some(p), Some(s)) => println!(
                "{}: {} as of {at}; shared {} in {}, own {} ({} wholly its own){}",
                shown(p),
                c.tag,
                indicatif::HumanBytes(s.shared_bytes),
                files(s.shared_files),
                indicatif::HumanBytes(s.own_bytes),
                files(s.own_files),
                match s.unfilled_dirs {
                    0 => String::new(),
                    n => format!(", {n} directories not yet filled"),
                }
            ),
            _ => println!("(gone): {} as of {at}", c.tag),
        }
    }
    Ok(())
}

fn files(n: u64) -> String {
    match n {
        1 => "1 file".to_string(),
        n => format!("{n} files"),
    }
}
