//! The maintenance verbs: gc, clean, prune, purge, policy (check, explain,
//! reload) and audit.

use std::io::Write;
use std::path::Path;

use anyhow::{anyhow, bail, Result};

use super::history::{print_json, Target};
use crate::control::proto::CleanReport;
use crate::control::{spec, At, Client};
use crate::policy::{self, Level, Retention};

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Renders the daemon's `PHASE DONE TOTAL` progress lines as a bar.
struct ProgressLines {
    bar: indicatif::ProgressBar,
    pending: Vec<u8>,
}

impl ProgressLines {
    fn new(hidden: bool) -> ProgressLines {
        let bar = if hidden {
            indicatif::ProgressBar::hidden()
        } else {
            indicatif::ProgressBar::new(0)
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg:>11} {bar:40} {pos}/{len} {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        ProgressLines {
            bar,
            pending: Vec::new(),
        }
    }

    fn show(&self, phase: &str, done: u64, total: u64) {
        self.bar.set_message(phase.to_string());
        self.bar.set_length(total);
        self.bar.set_position(done);
    }
}

impl Write for ProgressLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let text = String::from_utf8_lossy(&line);
            let mut parts = text.split_whitespace();
            if let (Some(phase), Some(done), Some(total)) =
                (parts.next(), parts.next(), parts.next())
            {
                self.show(phase, done.parse().unwrap_or(0), total.parse().unwrap_or(0));
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn gc(t: &Target, dry_run: bool, json: bool) -> Result<()> {
    let mut bar = ProgressLines::new(json);
    let r = t.client().gc(dry_run, &mut bar);
    bar.bar.finish_and_clear();
    let r = r?;
    if json {
        print_json(&r);
        return Ok(());
    }
    let verb = if dry_run { "would free" } else { "freed" };
    if !r.released_clone_tags.is_empty() {
        let release = if dry_run { "would release" } else { "released" };
        println!(
            "{release} the tags of removed clones: {} (retention may now prune what only they kept)",
            r.released_clone_tags.join(", ")
        );
    }
    println!(
        "{verb} {} of {} chunk(s) ({}); {} version(s) reference the {} kept",
        r.removed_chunks,
        r.chunks,
        mib(r.removed_bytes),
        r.versions,
        r.live_chunks,
    );
    let (deleted, rewritten) = match dry_run {
        true => ("would be deleted", "rewritten"),
        false => ("deleted", "rewritten"),
    };
    println!(
        "packs: {} {deleted}, {} {rewritten} ({} moved); {} -> {} in {:.1} s",
        r.packs_deleted,
        r.packs_rewritten,
        mib(r.moved_bytes),
        mib(r.pack_bytes_before),
        mib(r.pack_bytes_after),
        r.elapsed_ms as f64 / 1000.0
    );
    Ok(())
}

fn print_clean(r: &CleanReport) {
    if r.dry_run {
        println!(
            "would remove {} version(s) and {} expired deleted object(s) (of {} version(s) of {} object(s))",
            r.planned_versions, r.planned_objects, r.versions_scanned, r.objects_scanned
        );
    } else {
        println!(
            "removed {} version(s), {} expired deleted object(s){}",
            r.outcome.versions_removed,
            r.outcome.objects_removed,
            match r.outcome.versions_spared {
                0 => String::new(),
                n => format!(
                    "; kept {n} the limits gave up (a file's newest, tagged, or changed meanwhile)"
                ),
            }
        );
        println!("space is freed by `chronofs gc`");
    }
}

pub fn clean(t: &Target, now: Option<&str>, dry_run: bool, json: bool) -> Result<()> {
    let client = t.client();
    let now_ns = now.map(|s| clock(&client, s)).transpose()?.flatten();
    let r = client.clean(now_ns, dry_run)?;
    if json {
        print_json(&r);
    } else {
        print_clean(&r);
    }
    Ok(())
}

/// `clean --now`'s clock: any instant, a sequence number or a tag
/// standing for the time of its change; `None` for now. A malformed one
/// is a usage error, as everywhere a time goes.
fn clock(client: &Client, s: &str) -> Result<Option<i64>> {
    Ok(match super::history::parse_at(Some(s))? {
        At::Now => None,
        At::Time(t) => Some(t),
        at => Some(client.resolve(&at)?.time_ns),
    })
}

// The limits `prune` was given (a plain comment: see `cli::Common`).
#[derive(clap::Args, Debug, Default)]
pub struct KeepArgs {
    /// Keep the N newest versions. A file's newest version always stays,
    /// whatever the limits say: it vouches for the file as it is (`chronofs
    /// purge` removes a file with all its history).
    #[arg(long, value_name = "N")]
    keep_last: Option<u64>,
    /// Keep the newest version of each of the last N hours that have versions.
    #[arg(long, value_name = "N")]
    keep_hourly: Option<u64>,
    /// Keep the newest version of each of the last N days that have versions.
    #[arg(long, value_name = "N")]
    keep_daily: Option<u64>,
    /// Keep the newest version of each of the last N weeks that have versions.
    #[arg(long, value_name = "N")]
    keep_weekly: Option<u64>,
    /// Keep the newest version of each of the last N months that have versions.
    #[arg(long, value_name = "N")]
    keep_monthly: Option<u64>,
    /// Keep the newest version of each of the last N years that have versions.
    #[arg(long, value_name = "N")]
    keep_yearly: Option<u64>,
    /// Keep every version younger than this (e.g. 2d).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    keep_within: Option<String>,
    /// Keep at most N versions.
    #[arg(long, value_name = "N")]
    max_count: Option<u64>,
    /// Drop versions older than this (e.g. 90d).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    max_age: Option<String>,
    /// Keep versions, newest first, while their sizes add up to at most this (e.g. 1G).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    max_space: Option<String>,
}

/// Durations and sizes as policy files write them (`2d`, `1d12h`, `1y`;
/// `512`, `10M`, `1GiB`).
fn duration(flag: &str, v: &Option<String>) -> Result<Option<u64>> {
    v.as_deref()
        .map(|s| {
            policy::parse_duration(s)
                .map_err(|e| anyhow!(super::UsageError(format!("--{flag} {s}: {e}"))))
        })
        .transpose()
}

fn size(flag: &str, v: &Option<String>) -> Result<Option<u64>> {
    v.as_deref()
        .map(|s| {
            policy::parse_size(s)
                .map_err(|e| anyhow!(super::UsageError(format!("--{flag} {s}: {e}"))))
        })
        .transpose()
}

impl KeepArgs {
    /// The limits as a retention; bad values are errors.
    pub fn retention(&self) -> Result<Retention> {
        Ok(Retention {
            keep_last: self.keep_last,
            keep_hourly: self.keep_hourly,
            keep_daily: self.keep_daily,
            keep_weekly: self.keep_weekly,
            keep_monthly: self.keep_monthly,
            keep_yearly: self.keep_yearly,
            keep_within_secs: duration("keep-within", &self.keep_within)?,
            max_count: self.max_count,
            max_age_secs: duration("max-age", &self.max_age)?,
            max_space: size("max-space", &self.max_space)?,
            ..Default::default()
        })
    }
}

pub fn prune(t: &Target, keep: Retention, dry_run: bool, json: bool) -> Result<()> {
    if keep.keeps_all() {
        return Err(anyhow!(super::UsageError(
            "nothing to prune: give a limit (--keep-last, --keep-daily, --max-count, --max-age, ...)"
                .into()
        )));
    }
    let r = t.client().prune(&t.path, keep, dry_run)?;
    if json {
        print_json(&r);
        return Ok(());
    }
    print_clean(&r.report);
    if let Some(why) = &r.held_back.why {
        println!("{why}");
    }
    Ok(())
}

pub fn purge(t: &Target, dry_run: bool, json: bool) -> Result<()> {
    if crate::sys::geteuid() != 0 {
        bail!("operation not permitted: only root may purge history");
    }
    if t.path.is_empty() {
        bail!("refusing to purge the whole mount; name a file or directory inside it");
    }
    // The live file goes first, through the mount (so its removal is
    // recorded like any other), then everything history has of it.
    let live = std::fs::symlink_metadata(&t.abs).is_ok();
    if live && !matches!(t.backend, super::history::Backend::Daemon(_)) {
        bail!(
            "{} exists and is not inside a mount: mount it, then purge through the mount",
            t.abs.display()
        );
    }
    if !dry_run && live {
        // Asked first: a purge the daemon refuses (clones read this
        // history) must not have removed the live tree.
        t.client().purge(&t.path, true)?;
        let removed = match std::fs::symlink_metadata(&t.abs) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&t.abs),
            _ => std::fs::remove_file(&t.abs),
        };
        removed.map_err(|e| anyhow!("cannot remove {}: {e}", t.abs.display()))?;
    }
    let r = t.client().purge(&t.path, dry_run)?;
    if json {
        print_json(&r);
    } else {
        let verb = if dry_run { "would purge" } else { "purged" };
        println!(
            "{verb} {} object(s) and {} version(s) of {}{}",
            r.objects,
            r.versions,
            t.abs.display(),
            match r.kept_alive_elsewhere {
                0 => String::new(),
                n => format!("; {n} object(s) moved out of it still live and keep their history"),
            }
        );
        if let Some(gc) = &r.collected {
            println!(
                "collected: {} chunk(s) removed ({} bytes), {} pack(s) deleted, {} rewritten",
                gc.removed_chunks, gc.removed_bytes, gc.packs_deleted, gc.packs_rewritten
            );
            if gc.scrub_pending > 0 {
                println!(
                    "{} purged chunk(s) are still in the store (in the pack being written, \
                     or reused by a write meanwhile): `chronofs gc` takes them",
                    gc.scrub_pending
                );
            }
        }
    }
    Ok(())
}

/// Whether the user or group database knows `name`.
pub fn known_name(group: bool, name: &str) -> bool {
    match group {
        true => crate::sys::group_id(name).is_some(),
        false => crate::sys::user_id(name).is_some(),
    }
}

pub fn policy_check(file: &Path, user: bool, json: bool) -> Result<()> {
    let level = if user { Level::User } else { Level::Admin };
    // Names the system does not know are problems here (likely typos),
    // though a mount only warns of them.
    let checked = policy::check_file(file, level).and_then(|f| {
        let unknown = f.unknown_names(known_name);
        if unknown.is_empty() {
            Ok(f)
        } else {
            Err(unknown)
        }
    });
    match checked {
        Ok(f) => {
            if json {
                print_json(
                    &serde_json::json!({"file": file.display().to_string(), "ok": true, "rules": f.rule_count()}),
                );
            } else {
                println!("{}: ok ({} rule(s))", file.display(), f.rule_count());
            }
            Ok(())
        }
        // One problem (a file that cannot be read, say) is one line.
        Err(errors) if errors.len() == 1 => bail!("{}", errors[0]),
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            bail!("{}: {} problem(s)", file.display(), errors.len())
        }
    }
}

pub fn policy_explain(
    t: &Target,
    user: Option<String>,
    process: Option<String>,
    json: bool,
) -> Result<()> {
    let r = t.client().policy_explain(&t.path, user, process)?;
    if json {
        print_json(&r);
    } else {
        println!("{}:", t.abs.display());
        print!("{}", r.text);
    }
    Ok(())
}

pub fn policy_reload(t: &Target, json: bool) -> Result<()> {
    let r = t.client().policy_reload()?;
    if json {
        print_json(&r);
    } else {
        println!("policy reloaded ({} rule(s))", r.rules);
        for w in &r.warnings {
            println!("warning: {w}");
        }
    }
    Ok(())
}

pub fn audit(t: &Target, json: bool) -> Result<()> {
    let r = t.client().audit()?;
    if json {
        print_json(&r);
        return Ok(());
    }
    for rec in &r.records {
        let when = match rec.time_ns {
            0 => "-".to_string(),
            t => spec::show(t),
        };
        println!(
            "{when}  uid {:<5} {:<14} {}",
            rec.uid, rec.action, rec.detail
        );
    }
    Ok(())
}
