//! Parsing of `-o` mount options (command line and /etc/fstab).

use std::path::PathBuf;

pub use crate::fuse::ReaddirPlus;
use std::time::Duration;

/// Everything `chronofs mount` can be told with `-o`.
#[derive(Clone, Debug, PartialEq)]
pub struct MountOptions {
    /// Unversioned mode: a plain stacked file system (the benchmark baseline).
    pub plain: bool,
    pub passthrough: bool,
    pub writeback: bool,
    pub readdirplus: ReaddirPlus,
    /// `entry_timeout=`, `attr_timeout=`, `negative_timeout=` as given;
    /// `None`: what `external_changes` implies (see [`MountOptions::timeouts`]).
    pub entry_timeout: Option<Duration>,
    pub attr_timeout: Option<Duration>,
    pub negative_timeout: Option<Duration>,
    /// `external-changes`: other programs also write SRC (or a branch), so
    /// the kernel may cache names and attributes only briefly.
    pub external_changes: bool,
    pub threads: Option<usize>,
    /// `uring=on|off|auto`: FUSE over io_uring.
    pub uring: Uring,
    pub store: Option<PathBuf>,
    pub allow_other: bool,
    pub debug: bool,
    pub log_file: Option<PathBuf>,
    pub fsname: Option<String>,
    /// Generic mount flags handed to the kernel (ro, nosuid, noexec...).
    pub kernel: Vec<String>,
    /// A file held open for writing gets a version at least this often.
    pub capture_interval: Duration,
    /// Every write() is its own version (forces the daemon's write path).
    pub every_write: bool,
    /// When to record the whole existing tree at mount (in the background).
    pub ingest: Ingest,
    pub write_path: crate::vfs::WritePath,
    /// `.history/`'s name, the version-name separator, audit mode.
    pub views: crate::vfs::ViewConfig,
    /// `policy=FILE`: the administrator's policy (default
    /// /etc/chronofs/policy.toml if present).
    pub policy: Option<PathBuf>,
    /// `user-policies=on|off`: read users' own policy files.
    pub user_policies: bool,
    /// `clean-interval=S`: how often the cleaner applies retention (0: never).
    pub clean_interval: Duration,
    /// Union mounts: `copyup-owner=keep|fixed:UID:GID:MODE|caller`,
    /// `create=top|mfs|existing-path`, `delete=all|whiteout`, `userxattr`.
    pub union: crate::vfs::UnionOptions,
}

/// `-o uring=`: whether requests travel through FUSE over io_uring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uring {
    /// Required: the mount fails when the kernel does not offer it.
    On,
    /// Never: read/write on /dev/fuse.
    Off,
    /// When the kernel offers it (module parameter enable_uring on).
    Auto,
}

impl Uring {
    /// Off until measured faster for chronofs: bench/run's metadata
    /// workload showed no gain on this 2-CPU VM (docs/PERFORMANCE.md,
    /// "FUSE over io_uring"), while a round trip costs about the same.
    pub const DEFAULT: Uring = Uring::Off;
}

/// `-o ingest=`: when a mount records the existing tree in the background.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ingest {
    /// Until one ingest of the tree has completed for this store (the
    /// default: pre-existing files are protected without asking).
    First,
    /// At every mount.
    Always,
    /// Never: a pre-existing file is recorded just before its first change.
    Off,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            plain: false,
            passthrough: true,
            writeback: true,
            readdirplus: ReaddirPlus::Auto,
            entry_timeout: None,
            attr_timeout: None,
            negative_timeout: None,
            external_changes: false,
            threads: None,
            uring: Uring::DEFAULT,
            store: None,
            allow_other: true,
            debug: false,
            log_file: None,
            fsname: None,
            kernel: Vec::new(),
            capture_interval: Duration::from_secs(60),
            every_write: false,
            ingest: Ingest::First,
            write_path: crate::vfs::WritePath::Auto,
            views: crate::vfs::ViewConfig::default(),
            policy: None,
            user_policies: true,
            union: crate::vfs::UnionOptions::default(),
            clean_interval: Duration::from_secs(3600),
        }
    }
}

/// How long the kernel may trust names and attributes of objects only the
/// mount changes: a day, as libfuse's passthrough_hp and chronofs's own
/// views of the past. Longer gains nothing measurable (the kernel evicts
/// unused entries sooner); a bound still limits how long a change made
/// behind the mount's back without `external-changes` stays unseen.
pub const OWNED_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// With `external-changes`: what FUSE file systems conventionally use.
pub const EXTERNAL_TIMEOUT: Duration = Duration::from_secs(1);

/// The kernel's validity for names, attributes and absent names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub entry: Duration,
    pub attr: Duration,
    pub negative: Duration,
}

/// Kernel mount flags passed through unchanged.
const KERNEL_FLAGS: &[&str] = &[
    "ro", "rw", "suid", "nosuid", "dev", "nodev", "exec", "noexec", "atime", "noatime", "sync",
    "async", "dirsync",
];

/// chronofs's options that take no value.
const VALUELESS: &[&str] = &[
    "plain",
    "every-write",
    "audit",
    "userxattr",
    "nopassthrough",
    "nowriteback",
    "external-changes",
    "allow_other",
    "noallow_other",
    "default_permissions",
    "debug",
];

/// Options meaningful only to mount(8) and fstab, accepted and ignored.
fn is_fstab_only(opt: &str) -> bool {
    matches!(
        opt,
        "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "nofail"
            | "_netdev"
            | "owner"
            | "group"
            // The kernel's default for every mount; FUSE takes no option for it.
            | "relatime"
    ) || opt.starts_with("x-")
        || opt.starts_with("comment=")
}

fn parse_bool(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "on" | "yes" | "true" | "1" => Ok(true),
        "off" | "no" | "false" | "0" => Ok(false),
        _ => Err(format!("option {key}={value}: expected on or off")),
    }
}

fn parse_secs(key: &str, value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("option {key}={value}: expected a number of seconds"))
}

impl MountOptions {
    /// The timeouts to negotiate: explicit `*_timeout=` values win, in any
    /// order with `external-changes`; otherwise a day for names, absent
    /// names and attributes (the mount owns its branches and tells the
    /// kernel what it changes outside a request) or 1 s with
    /// `external-changes` (docs/ARCHITECTURE.md "Cache validity").
    pub fn timeouts(&self) -> Timeouts {
        let live = if self.external_changes {
            EXTERNAL_TIMEOUT
        } else {
            OWNED_TIMEOUT
        };
        Timeouts {
            entry: self.entry_timeout.unwrap_or(live),
            attr: self.attr_timeout.unwrap_or(live),
            negative: self.negative_timeout.unwrap_or(live),
        }
    }

    /// Options that contradict each other once every `-o` is applied:
    /// history's options on a mount that keeps none did nothing (or
    /// failed only after the mount was made).
    pub fn check(&self) -> Result<(), String> {
        self.check_history_dir()?;
        if !self.plain {
            return Ok(());
        }
        let needing_history = [
            (self.ingest == Ingest::Always, "ingest=on (baseline=eager)"),
            (self.every_write, "every-write"),
            (self.policy.is_some(), "policy"),
        ];
        match needing_history.iter().find(|(given, _)| *given) {
            Some((_, name)) => Err(format!(
                "option {name} needs history, which -o plain does not keep"
            )),
            None => Ok(()),
        }
    }

    /// A history directory named with the version separator reads as a
    /// version name (`x;1`, `x;@T`, `;deleted`) and hides the version it
    /// names. Checked once all options are in: `version-sep` may come
    /// after `history-dir`.
    fn check_history_dir(&self) -> Result<(), String> {
        use std::os::unix::ffi::OsStrExt;
        let name = self.views.dir_name.as_bytes();
        if self.views.holds_sep(name) {
            return Err(format!(
                "option history-dir={}: must not contain the version separator {} (it would read as a version name)",
                String::from_utf8_lossy(name),
                String::from_utf8_lossy(&self.views.sep)
            ));
        }
        Ok(())
    }

    /// Applies a comma-separated option list (one `-o` argument).
    pub fn apply(&mut self, list: &str) -> Result<(), String> {
        for opt in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            self.apply_one(opt)?;
        }
        Ok(())
    }

    fn apply_one(&mut self, opt: &str) -> Result<(), String> {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        fn need<'a>(key: &str, v: Option<&'a str>) -> Result<&'a str, String> {
            // `store=` would have meant the current directory.
            v.filter(|v| !v.is_empty())
                .ok_or_else(|| format!("option {key} needs a value"))
        }
        match (key, value) {
            ("plain", None) => self.plain = true,
            ("every-write", None) => self.every_write = true,
            ("write-path", v) => {
                self.write_path = match need(key, v)? {
                    "auto" => crate::vfs::WritePath::Auto,
                    "passthrough" => crate::vfs::WritePath::Passthrough,
                    "daemon" => crate::vfs::WritePath::Daemon,
                    other => {
                        return Err(format!(
                            "option write-path={other}: expected auto, passthrough or daemon"
                        ))
                    }
                }
            }
            ("version-sep", v) => {
                let sep = need(key, v)?;
                if sep.is_empty()
                    || sep.contains('/')
                    || sep.bytes().any(|b| b.is_ascii_alphanumeric())
                {
                    return Err(format!(
                        "option version-sep={sep}: must be non-empty, without '/', letters or digits"
                    ));
                }
                // Ordinary names hold these between a name and a number
                // (prog.1, logrotate's syslog.1, app-2, v_3): such a name
                // beside its base would read as a version, and creating or
                // renaming onto it fail EROFS.
                if matches!(sep, "." | "-" | "_") {
                    return Err(format!(
                        "option version-sep={sep}: ordinary names such as prog{sep}1 would read as versions; choose a separator names do not use"
                    ));
                }
                self.views.sep = sep.as_bytes().to_vec();
            }
            ("history-dir", v) => {
                let name = need(key, v)?;
                if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                    return Err(format!(
                        "option history-dir={name}: must be a single file name"
                    ));
                }
                if name.starts_with(super::mount::STORE_DIR_NAME) {
                    return Err(format!(
                        "option history-dir={name}: names starting with {} are chronofs's own, which the mount hides",
                        super::mount::STORE_DIR_NAME
                    ));
                }
                self.views.dir_name = name.into();
            }
            ("audit", None) => self.views.audit = true,
            ("policy", v) => self.policy = Some(PathBuf::from(need(key, v)?)),
            ("user-policies", v) => self.user_policies = parse_bool(key, need(key, v)?)?,
            ("clean-interval", v) => {
                let every = parse_secs(key, need(key, v)?)?;
                // A cleaner pass reads all history: 0 turns it off, and
                // anything under a second is a typo, not a schedule.
                if !every.is_zero() && every < Duration::from_secs(1) {
                    return Err(format!(
                        "option clean-interval={}: at least 1 second (0 turns the cleaner off)",
                        v.unwrap_or_default()
                    ));
                }
                self.clean_interval = every;
            }
            ("ingest", v) => {
                self.ingest = match need(key, v)? {
                    "first" => Ingest::First,
                    "on" => Ingest::Always,
                    "off" => Ingest::Off,
                    other => {
                        return Err(format!("option ingest={other}: expected first, on or off"))
                    }
                }
            }
            // The older spelling of `ingest=on|off`.
            ("baseline", v) => {
                self.ingest = match need(key, v)? {
                    "eager" => Ingest::Always,
                    "lazy" => Ingest::Off,
                    other => {
                        return Err(format!("option baseline={other}: expected eager or lazy"))
                    }
                }
            }
            ("copyup-owner", v) => {
                self.union.owner = crate::union::copyup::OwnerOption::parse(need(key, v)?)?;
            }
            ("create", v) => {
                let v = need(key, v)?;
                self.union.create = v
                    .parse()
                    .map_err(|e: crate::union::spec::SpecError| e.to_string())?;
            }
            ("userxattr", None) => self.union.xattr_ns = crate::union::format::XattrNs::User,
            ("delete", v) => {
                let v = need(key, v)?;
                self.union.delete = v
                    .parse()
                    .map_err(|e: crate::union::spec::SpecError| e.to_string())?;
            }
            ("capture-interval", v) => {
                let d = parse_secs(key, need(key, v)?)?;
                if d < Duration::from_secs(1) {
                    return Err(format!("option {opt}: at least 1 second"));
                }
                self.capture_interval = d;
            }
            ("passthrough", v) => self.passthrough = v.map_or(Ok(true), |v| parse_bool(key, v))?,
            ("nopassthrough", None) => self.passthrough = false,
            ("writeback", v) => self.writeback = v.map_or(Ok(true), |v| parse_bool(key, v))?,
            ("nowriteback", None) => self.writeback = false,
            ("readdirplus", v) => {
                self.readdirplus = match need(key, v)? {
                    "auto" => ReaddirPlus::Auto,
                    "on" | "always" => ReaddirPlus::Always,
                    "off" | "never" => ReaddirPlus::Never,
                    other => {
                        return Err(format!(
                            "option readdirplus={other}: expected auto, on or off"
                        ))
                    }
                }
            }
            ("entry_timeout", v) => self.entry_timeout = Some(parse_secs(key, need(key, v)?)?),
            ("attr_timeout", v) => self.attr_timeout = Some(parse_secs(key, need(key, v)?)?),
            ("negative_timeout", v) => {
                self.negative_timeout = Some(parse_secs(key, need(key, v)?)?)
            }
            ("external-changes", None) => self.external_changes = true,
            ("threads", v) => {
                let n = need(key, v)?;
                let n: usize = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=256).contains(n))
                    .ok_or_else(|| format!("option threads={n}: expected 1 to 256"))?;
                self.threads = Some(n);
            }
            ("uring", v) => {
                self.uring = match need(key, v)? {
                    "on" => Uring::On,
                    "off" => Uring::Off,
                    "auto" => Uring::Auto,
                    other => return Err(format!("option uring={other}: expected on, off or auto")),
                }
            }
            ("store", v) => self.store = Some(PathBuf::from(need(key, v)?)),
            ("allow_other", None) => self.allow_other = true,
            ("noallow_other", None) => self.allow_other = false,
            // Permission checks are always the kernel's (plus the backing
            // file system's under the caller's identity).
            ("default_permissions", None) => {}
            ("debug", None) => self.debug = true,
            ("log", v) => self.log_file = Some(PathBuf::from(need(key, v)?)),
            ("fsname", v) => self.fsname = Some(need(key, v)?.to_string()),
            (k, None) if KERNEL_FLAGS.contains(&k) => self.kernel.push(k.to_string()),
            (k, _) if is_fstab_only(k) || is_fstab_only(opt) => {}
            (k, Some(_)) if VALUELESS.contains(&k) || KERNEL_FLAGS.contains(&k) => {
                return Err(format!("option {k} takes no value (given as '{opt}')"))
            }
            _ => return Err(format!("unknown mount option '{opt}'")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_given_a_value_and_a_cleaner_in_a_hurry_are_refused() {
        for bad in ["plain=on", "debug=1", "noatime=yes", "clean-interval=0.001"] {
            let e = MountOptions::default().apply(bad).unwrap_err();
            assert!(!e.contains("unknown"), "{bad}: {e}");
        }
        let mut o = MountOptions::default();
        o.apply("clean-interval=0,user=alice,x-systemd.requires=foo")
            .unwrap();
        assert!(o.clean_interval.is_zero());
    }

    #[test]
    fn parses_known_options() {
        let mut o = MountOptions::default();
        o.apply("plain,passthrough=off,attr_timeout=2.5,threads=3,ro,defaults,x-systemd.automount")
            .unwrap();
        assert!(o.plain);
        assert!(!o.passthrough);
        assert_eq!(o.attr_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(o.threads, Some(3));
        assert_eq!(o.kernel, vec!["ro".to_string()]);
        o.apply("version-sep=@@,history-dir=.snapshots,audit")
            .unwrap();
        assert_eq!(o.views.sep, b"@@");
        assert_eq!(o.views.dir_name, ".snapshots");
        assert!(o.views.audit);
    }

    /// Found by a bug hunt: `history-dir=x;1` hid version 1 of x.
    #[test]
    fn refuses_a_history_dir_that_reads_as_a_version_name() {
        for (bad, sep) in [
            ("history-dir=x;1", None),
            ("history-dir=;deleted", None),
            ("history-dir=x;@now", None),
            ("history-dir=x@@2,version-sep=@@", Some("@@")),
            ("version-sep=@@,history-dir=x@@2", Some("@@")),
        ] {
            let mut o = MountOptions::default();
            o.apply(bad).unwrap();
            let e = o.check().unwrap_err();
            assert!(
                e.contains("version separator") && !e.contains('\n'),
                "{bad}: {e}"
            );
            assert_eq!(o.views.sep, sep.unwrap_or(";").as_bytes(), "{bad}");
        }
        let mut o = MountOptions::default();
        o.apply("history-dir=x;1,version-sep=@@").unwrap();
        assert!(o.check().is_ok());
    }

    #[test]
    fn external_changes_shortens_only_the_timeouts_not_given() {
        let mut o = MountOptions::default();
        assert_eq!(
            o.timeouts(),
            Timeouts {
                entry: OWNED_TIMEOUT,
                attr: OWNED_TIMEOUT,
                negative: OWNED_TIMEOUT
            }
        );
        o.apply("attr_timeout=5,external-changes").unwrap();
        assert!(o.external_changes);
        assert_eq!(
            o.timeouts(),
            Timeouts {
                entry: EXTERNAL_TIMEOUT,
                attr: Duration::from_secs(5),
                negative: EXTERNAL_TIMEOUT
            }
        );
        let mut o = MountOptions::default();
        o.apply("external-changes,entry_timeout=0,negative_timeout=0")
            .unwrap();
        assert_eq!(
            o.timeouts(),
            Timeouts {
                entry: Duration::ZERO,
                attr: EXTERNAL_TIMEOUT,
                negative: Duration::ZERO
            }
        );
        assert!(MountOptions::default()
            .apply("external-changes=on")
            .is_err());
    }

    #[test]
    fn rejects_unknown_and_malformed_options() {
        for bad in [
            "bogus",
            "threads=0",
            "threads=x",
            "attr_timeout=-1",
            "passthrough=maybe",
            "store",
            "version-sep=",
            "version-sep=v",
            "version-sep=.",
            "version-sep=-",
            "version-sep=_",
            "history-dir=a/b",
        ] {
            let mut o = MountOptions::default();
            let e = o.apply(bad).unwrap_err();
            assert!(!e.contains('\n'), "multi-line error for {bad}: {e}");
        }
    }
}
