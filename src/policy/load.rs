//! Where policy files come from: the administrator's file and each user's
//! own, read at mount and at `chronofs policy reload`.
//!
//! A broken administrator file is an error (a mount refuses to start; a
//! reload keeps the policy in force). A broken or unsafe user file is a
//! warning: that user keeps the file loaded before (or none), so one
//! user's typo never stops the mount or changes anyone else's policy.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{check_file, check_text, Level, Policy, PolicyError, PolicyFile};

/// The administrator's file when none is named.
pub const ADMIN_DEFAULT: &str = "/etc/chronofs/policy.toml";
/// A user's own file, relative to their home directory.
pub const USER_FILE: &str = ".config/chronofs/policy.toml";
const PASSWD: &str = "/etc/passwd";
/// The largest policy file read. Real ones are a few KiB.
pub const MAX_BYTES: u64 = 1 << 20;

#[derive(Clone, Debug, Default)]
pub struct Source {
    /// `-o policy=FILE`: must exist. Otherwise `ADMIN_DEFAULT` if present.
    pub admin: Option<PathBuf>,
    /// Read users' own files.
    pub users: bool,
    /// Names the rules give that this says the system does not know are
    /// warned of; `None`: not checked.
    pub known: Option<super::KnownName>,
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
        let unknown = |f: &PolicyFile| -> Vec<String> {
            match self.known {
                Some(known) => f
                    .unknown_names(known)
                    .iter()
                    .map(|e| e.to_string())
                    .collect(),
                None => Vec::new(),
            }
        };
        let mut warnings: Vec<String> = admin.iter().flat_map(unknown).collect();
        let mut users = Vec::new();
        if self.users {
            for (uid, home) in passwd_homes() {
                let path = home.join(USER_FILE);
                match load_user(&path, uid) {
                    Ok(Some(f)) => {
                        warnings.extend(unknown(&f));
                        users.push((uid, f));
                    }
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
/// Owner and mode are checked on the opened file, so what is read is what
/// was checked.
fn load_user(path: &Path, uid: u32) -> Result<Option<PolicyFile>, String> {
    let (file, meta) = match open_file(path) {
        Ok(opened) => opened,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}; ignored", path.display())),
    };
    // Someone else able to write it could widen this user's retention
    // or turn versioning off for them. Root's file counts only if every
    // user may read it: the path may be a symlink to a file the user may
    // not read (/etc/shadow), whose lines a parse error would quote.
    let roots_and_public = meta.uid() == 0 && meta.mode() & 0o004 != 0;
    if (meta.uid() != uid && !roots_and_public) || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{}: must belong to its user (or be root's and readable by all) and not be \
             writable by others; ignored",
            path.display()
        ));
    }
    match check_text(path, read_capped(file, &meta), Level::User) {
        Ok(f) => Ok(Some(f)),
        Err(errors) => Err(format!(
            "{} (the user's previous policy stays in force)",
            errors.first().map_or_else(String::new, ToString::to_string)
        )),
    }
}

/// Opens a policy file for reading and checks it is a regular file no
/// larger than `MAX_BYTES`. The daemon runs as root and reads files users
/// name or own: a FIFO must not block it (hence O_NONBLOCK, and the checks
/// on the opened file, not on the path, which could be swapped between),
/// and a device or huge sparse file must not fill its memory.
pub(super) fn open_file(path: &Path) -> io::Result<(File, Metadata)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if meta.len() > MAX_BYTES {
        return Err(too_big());
    }
    Ok((file, meta))
}

/// The text of a file `open_file` opened; at most one byte past the cap is
/// read, in case it grew since.
pub(super) fn read_capped(file: File, meta: &Metadata) -> io::Result<String> {
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(too_big());
    }
    String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not valid UTF-8"))
}

fn too_big() -> io::Error {
    io::Error::other(format!(
        "larger than {} KiB, the most a policy file may be",
        MAX_BYTES / 1024
    ))
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

#[cfg(test)]
mod tests {
    use super::{load_user, Source};

    /// A name the system does not know loads (a directory service may be
    /// down at boot) with a warning that names it and its line.
    #[test]
    fn an_unknown_user_in_the_administrator_file_is_a_warning() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("policy.toml");
        std::fs::write(
            &file,
            "[[rule]]\nusers = [\"no-such-user-cfs\"]\nversion = false\n",
        )
        .unwrap();
        let source = Source {
            admin: Some(file.clone()),
            users: false,
            known: Some(|group, name| !group && name == "root"),
        };
        let Ok((policy, warnings)) = source.load(None) else {
            panic!("refused");
        };
        assert_eq!(policy.rule_count(), 1);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with(&format!("{}:2:", file.display()))
                && warnings[0].contains("no-such-user-cfs"),
            "{warnings:?}"
        );
    }

    use std::os::unix::fs::PermissionsExt;

    /// A user's file is theirs, or root's and readable by all: a symlink
    /// to a root file the user may not read (/etc/shadow) is not read.
    #[test]
    fn a_user_file_is_theirs_or_roots_and_public() {
        if crate::sys::geteuid() != 0 {
            return; // chown
        }
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("policy.toml");
        std::fs::write(&file, "").unwrap();
        let mode = |m| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(m)).unwrap();
        let link = t.path().join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        mode(0o640);
        assert!(load_user(&link, 1000).is_err(), "root's, private");
        mode(0o644);
        assert!(load_user(&link, 1000).is_ok(), "root's, readable by all");
        std::os::unix::fs::chown(&file, Some(1000), None).unwrap();
        mode(0o600);
        assert!(load_user(&file, 1000).is_ok(), "the user's own");
        assert!(load_user(&file, 1001).is_err(), "another user's");
        mode(0o620);
        assert!(load_user(&file, 1000).is_err(), "writable by others");
    }
}
