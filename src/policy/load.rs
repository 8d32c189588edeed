//! Where policy files come from: the administrator's file and each user's
//! own, read at mount and at `chronofs policy reload`.
//!
//! A broken administrator file is an error (a mount refuses to start; a
//! reload keeps the policy in force). A broken or unsafe user file is a
//! warning: that user keeps the file loaded before (or none), so one
//! user's typo never stops the mount or changes anyone else's policy.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{check_file, Level, Policy, PolicyError, PolicyFile};

/// The administrator's file when none is named.
pub const ADMIN_DEFAULT: &str = "/etc/chronofs/policy.toml";
/// A user's own file, relative to their home directory.
pub const USER_FILE: &str = ".config/chronofs/policy.toml";
const PASSWD: &str = "/etc/passwd";

#[derive(Clone, Debug, Default)]
pub struct Source {
    /// `-o policy=FILE`: must exist. Otherwise `ADMIN_DEFAULT` if present.
    pub admin: Option<PathBuf>,
    /// Read users' own files.
    pub users: bool,
}

impl Source {
    /// The administrator's file in force, if any.
    pub fn admin_path(&self) -> Option<PathBuf> {
        match &self.admin {
            Some(p) => Some(p.clone()),
            None => Some(PathBuf::from(ADMIN_DEFAULT)).filter(|p| p.exists()),
        }
    }

    /// Loads every file. Errors: the administrator's file's problems.
    /// Warnings: user files skipped (and why).
    pub fn load(
        &self,
        previous: Option<&Policy>,
    ) -> Result<(Policy, Vec<String>), Vec<PolicyError>> {
        let admin = match self.admin_path() {
            Some(p) => Some(check_file(&p, Level::Admin)?),
            None => None,
        };
        let mut warnings = Vec::new();
        let mut users = Vec::new();
        if self.users {
            for (uid, home) in passwd_homes() {
                let path = home.join(USER_FILE);
                match load_user(&path, uid) {
                    Ok(Some(f)) => users.push((uid, f)),
                    Ok(None) => {}
                    Err(why) => {
                        warnings.push(why);
                        if let Some(old) = previous.and_then(|p| p.user_file(uid)) {
                            users.push((uid, old));
                        }
                    }
                }
            }
        }
        Ok((Policy::new(admin, users), warnings))
    }
}

/// A user's file if it exists and is theirs; `Err` says why it is unusable.
fn load_user(path: &Path, uid: u32) -> Result<Option<PolicyFile>, String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if !meta.is_file() {
        return Err(format!("{}: not a regular file; ignored", path.display()));
    }
    // Someone else able to write it could widen this user's retention
    // or turn versioning off for them.
    if (meta.uid() != uid && meta.uid() != 0) || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{}: must belong to its user and not be writable by others; ignored",
            path.display()
        ));
    }
    match check_file(path, Level::User) {
        Ok(f) => Ok(Some(f)),
        Err(errors) => Err(format!(
            "{} (the user's previous policy stays in force)",
            errors.first().map_or_else(String::new, ToString::to_string)
        )),
    }
}

/// (uid, home) of every account in the passwd file.
fn passwd_homes() -> Vec<(u32, PathBuf)> {
    let Ok(text) = std::fs::read_to_string(PASSWD) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let uid = f.get(2)?.parse().ok()?;
            // Accounts without a home of their own (`/`, shared by many
            // system users) cannot have a file of their own.
            let home = f.get(5).filter(|h| h.starts_with('/') && h.len() > 1)?;
            Some((uid, PathBuf::from(home)))
        })
        .collect()
}
