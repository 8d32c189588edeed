//! Version policies: which files are versioned and how, and how long their
//! versions are kept.
//!
//! Two levels of TOML files: the administrator's (defaults, rules, hard
//! bounds) and each user's (rules only). Apart from `load`, which finds and
//! reads the files, this module is pure logic: it parses, matches and
//! computes, and leaves finding owners and deleting versions to its
//! callers.

// Used by the cleaner and capture (being wired up).
#![allow(dead_code)]

mod error;
pub mod load;
mod parse;
mod resolve;
mod retention;
mod select;
mod settings;
mod units;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

pub use error::PolicyError;
pub use parse::parse;
pub use resolve::Resolved;
pub use retention::{Candidate, Retention};
pub use units::{format_duration, parse_duration, parse_size};
// The types of `Resolved`'s fields, for callers that name them; not every
// one is named yet.
#[allow(unused_imports)]
pub use {
    resolve::{Origin, Source},
    settings::{Capture, Key, Value},
};

use select::Selector;
use settings::{Setting, Settings};

/// The protection window owners' prunes keep when the administrator set
/// none: a week to notice a mistake (or an intruder acting as the owner).
pub const OWNER_PROTECT_SECS: u64 = 7 * 86400;

/// Whose file it is: only the administrator's may have `[defaults]` and
/// `[bounds]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Admin,
    User,
}

/// One file, and optionally one change to it, to resolve a policy for.
#[derive(Clone, Copy, Debug, Default)]
pub struct Subject<'a> {
    /// Relative to the mount root, no leading '/'; "" for the root. Bytes,
    /// as names are: globs match them exactly, whatever their encoding.
    pub path: &'a [u8],
    pub is_dir: bool,
    pub size: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub owner_name: Option<&'a str>,
    pub group_name: Option<&'a str>,
    /// The comm name of the changing process, if known.
    pub process: Option<&'a str>,
    /// Local wall time of the change, if known.
    pub local_time: Option<jiff::civil::DateTime>,
}

/// One parsed policy file.
#[derive(Clone, Debug)]
pub struct PolicyFile {
    origin: Arc<str>,
    defaults: Settings,
    bounds: Settings,
    rules: Vec<Rule>,
    /// The users and groups the rules name by name, where they are named:
    /// a name the system does not know is a likely typo (the rule would
    /// never match), reported by `unknown_names`.
    names: Vec<NamedPrincipal>,
}

#[derive(Clone, Debug)]
struct NamedPrincipal {
    group: bool,
    name: String,
    at: settings::Pos,
}

/// Whether the system knows a user (`false`) or group (`true`) by this
/// name. Given by the caller: the policy module uses no other chronofs
/// module (bench/policybench compiles it alone).
pub type KnownName = fn(group: bool, name: &str) -> bool;

impl PolicyFile {
    /// The users and groups named that the user and group databases do
    /// not know now. Not a parse error: a directory service down at boot
    /// must not stop a mount; `policy check` refuses them, the mount and
    /// `policy reload` warn.
    pub fn unknown_names(&self, known: KnownName) -> Vec<PolicyError> {
        self.names
            .iter()
            .filter(|p| !known(p.group, &p.name))
            .map(|p| {
                let kind = if p.group { "group" } else { "user" };
                PolicyError::at(
                    &self.origin,
                    p.at,
                    format!(
                        "no {kind} named '{}' on this system: the rule never matches it",
                        p.name
                    ),
                )
            })
            .collect()
    }

    /// The name the file was parsed under.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.defaults.is_empty() && self.bounds.is_empty()
    }
}

#[derive(Clone, Debug)]
struct Rule {
    /// 1-based among its file's rules, for unnamed rules in `explain`.
    number: usize,
    name: Option<Arc<str>>,
    selector: Selector,
    settings: Settings,
}

/// Reads and parses a policy file; a read failure is one error without a
/// position.
pub fn check_file(path: &Path, level: Level) -> Result<PolicyFile, Vec<PolicyError>> {
    let read = load::open_file(path).and_then(|(file, meta)| load::read_capped(file, &meta));
    check_text(path, read, level)
}

/// Parses what reading `path` gave.
fn check_text(
    path: &Path,
    read: std::io::Result<String>,
    level: Level,
) -> Result<PolicyFile, Vec<PolicyError>> {
    let origin = path.display().to_string();
    let text = read.map_err(|e| {
        vec![PolicyError::whole_file(
            &origin,
            format!("cannot read: {e}"),
        )]
    })?;
    parse(&text, &origin, level)
}

/// Every policy in force on one mount: the administrator's file and the
/// users' files by uid.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    admin: Option<Arc<PolicyFile>>,
    users: HashMap<u32, Arc<PolicyFile>>,
    /// Capture modes some file sets, so capture can skip evaluating the
    /// policy on every open when none asks for them.
    modes: Vec<Capture>,
}

impl Policy {
    pub fn new(admin: Option<PolicyFile>, users: Vec<(u32, PolicyFile)>) -> Policy {
        let mut policy = Policy {
            admin: admin.map(Arc::new),
            users: users
                .into_iter()
                .map(|(uid, file)| (uid, Arc::new(file)))
                .collect(),
            modes: Vec::new(),
        };
        let files = policy.admin.iter().chain(policy.users.values());
        for f in files {
            let tables = std::iter::once(&f.defaults).chain(f.rules.iter().map(|r| &r.settings));
            for t in tables {
                if let Some(Setting {
                    value: Value::Capture(c),
                    ..
                }) = t.get(Key::Capture)
                {
                    if !policy.modes.contains(c) {
                        policy.modes.push(*c);
                    }
                }
            }
        }
        policy
    }

    /// Whether any file sets capture mode `mode` (else no file can ask
    /// for it).
    pub fn may_capture(&self, mode: Capture) -> bool {
        self.modes.contains(&mode)
    }

    /// The effective settings for `s`, with what decided each of them.
    pub fn resolve(&self, s: &Subject) -> Resolved {
        let user = self.users.get(&s.owner_uid).map(|f| &**f);
        resolve::resolve(self.admin.as_deref(), user, s)
    }

    /// Whether no file sets anything: everything is versioned and kept
    /// forever, so capture can skip evaluating.
    pub fn is_trivial(&self) -> bool {
        self.admin.as_ref().is_none_or(|a| a.is_empty())
            && self.users.values().all(|u| u.rules.is_empty())
    }

    /// A user's own file, as loaded (a reload keeps it when the file on
    /// disk has become unusable).
    pub fn user_file(&self, uid: u32) -> Option<PolicyFile> {
        self.users.get(&uid).map(|f| (**f).clone())
    }

    /// Rules in force across all files.
    pub fn rule_count(&self) -> usize {
        self.admin.as_ref().map_or(0, |a| a.rule_count())
            + self.users.values().map(|u| u.rule_count()).sum::<usize>()
    }

    /// The protection window owners' own prunes respect: the
    /// administrator's, or `OWNER_PROTECT_SECS` when the administrator set
    /// none, so that an owner (or whoever acts as them) cannot erase
    /// recent history silently.
    pub fn owner_protect_secs(&self) -> u64 {
        let set = self.admin.as_ref().and_then(|a| {
            a.bounds
                .get(Key::Protect)
                .or_else(|| a.defaults.get(Key::Protect))
        });
        match set.and_then(|s| s.value.number()) {
            Some(secs) => secs,
            None => OWNER_PROTECT_SECS,
        }
    }

    /// The administrator's protection window in seconds: non-root users may
    /// never prune versions younger than this.
    pub fn protect_secs(&self) -> u64 {
        let Some(admin) = &self.admin else {
            return 0;
        };
        admin
            .bounds
            .get(Key::Protect)
            .or_else(|| admin.defaults.get(Key::Protect))
            .and_then(|s| s.value.number())
            .unwrap_or(0)
    }
}
