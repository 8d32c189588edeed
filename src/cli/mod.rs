//! The command line: `chronofs <verb> ...`, and the mount helper entry
//! points used by mount(8) and /etc/fstab.
//!
//! Owns: argument parsing, user-facing errors and exit codes, daemonizing.
//! Uses: every layer below (it assembles the mount). The only place that
//! uses `anyhow`.

mod branch;
mod diff;
mod generate;
mod history;
mod maintain;
mod mount;
mod mount_host;
mod options;
mod restore;
mod sandbox;
mod sandbox_host;
mod template;
mod undelete;
mod union_fsck;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use options::MountOptions;

/// Exit codes (stable; documented in README.md).
pub mod exit {
    pub const OK: i32 = 0;
    /// The operation failed (bad source, mount refused, I/O error...).
    pub const FAILURE: i32 = 1;
    /// The command line was malformed (unknown verb, option or -o value).
    pub const USAGE: i32 = 2;
    /// `sandbox`'s command was found but could not be run (env(1)'s).
    pub const CANNOT_RUN: i32 = 126;
    /// `sandbox`'s command was not found (env(1)'s, the shell's).
    pub const NOT_FOUND: i32 = 127;
}

/// A command `chronofs sandbox` was to run that could not run: exits
/// with `code` ([`exit::NOT_FOUND`] or [`exit::CANNOT_RUN`]), as env(1)
/// does, so a caller tells it from the command's own failure.
#[derive(Debug)]
pub(crate) struct CannotRun {
    pub code: i32,
    pub message: String,
}

impl std::fmt::Display for CannotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CannotRun {}

/// A malformed value on the command line (a time, a duration, a size)
/// found after clap's parse: exits with [`exit::USAGE`] like clap's own.
#[derive(Debug)]
pub(crate) struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

#[derive(Parser, Debug)]
#[command(
    name = "chronofs",
    version,
    about = "A versioning FUSE file system stacked on plain directories"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum Command {
    /// Mount directory SRC (or a union of branches) at MNT.
    Mount {
        /// The directory whose files chronofs serves (stays a plain
        /// directory), or a union: BR1[=rw|=ro]:BR2[=ro]:... (leftmost wins;
        /// default: the first rw, the rest ro; `\:` `\=` `\\` escape).
        src: PathBuf,
        /// Where to mount (an existing directory; may equal SRC).
        mnt: PathBuf,
        /// Stay in the foreground instead of becoming a daemon.
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Comma-separated mount options (see README.md); may be repeated.
        /// `external-changes` if other programs also write SRC directly
        /// (names and attributes then cached 1 s instead of a day).
        /// `uring=on|off|auto` (default off): FUSE over io_uring, offered
        /// once root sets /sys/module/fuse/parameters/enable_uring to Y.
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        /// Log every request (implies -f).
        #[arg(short = 'd', long)]
        debug: bool,
        /// Write one line to inherited descriptor FD once the mount and its
        /// control socket are ready ("ok"), or the error that stopped it,
        /// then close FD (for supervisors and tests; FD 3 or above).
        #[arg(long, value_name = "FD")]
        ready_fd: Option<i32>,
    },
    /// Unmount a chronofs mount; returns once its daemon has recorded the
    /// last changes and exited.
    Umount {
        mnt: PathBuf,
        /// Detach now even if busy; clean up when no longer in use.
        #[arg(short = 'l', long)]
        lazy: bool,
    },
    /// Versions of a file or directory across its incarnations.
    Log {
        path: PathBuf,
        /// Every version of everything that ever existed under PATH.
        #[arg(short = 'r', long)]
        recursive: bool,
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        since: Option<String>,
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        until: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Write a past version of a file to standard output.
    Cat {
        path: PathBuf,
        /// An instant: ISO 8601, -10m, "yesterday 14:00", a sequence number or a tag.
        #[arg(
            long,
            value_name = "TIME",
            conflicts_with = "version",
            allow_hyphen_values = true
        )]
        at: Option<String>,
        /// Version N as `log` numbers them (0 = newest, -1 = the one before).
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        version: Option<i64>,
        #[command(flatten)]
        common: Common,
    },
    /// List a directory as it was.
    Ls {
        #[arg(default_value = ".")]
        dir: PathBuf,
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: Option<String>,
        /// List what had been deleted from DIR by then: every deletion of a name gone then.
        #[arg(long)]
        deleted: bool,
        #[arg(short = 'l')]
        long: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Bring back a file or tree as of an instant (in place, or to DEST).
    Restore {
        path: PathBuf,
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: String,
        /// A path that does not exist yet (nothing there is replaced).
        #[arg(long, value_name = "DEST")]
        to: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Make a whole tree exactly as it was (undoable: it is itself versioned).
    Revert {
        dir: PathBuf,
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: String,
        #[command(flatten)]
        common: Common,
    },
    /// Bring back a deleted file or tree as it was just before its deletion.
    ///
    /// PATH may lie in a directory deleted with it (`rm -rf dir`, then
    /// `undelete dir/sub/f`): without --to, the directories on its way
    /// come back too, as they were then, holding only PATH.
    Undelete {
        path: PathBuf,
        #[arg(long, value_name = "DEST")]
        to: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Differences of a file or tree between two instants (B defaults to now).
    Diff {
        path: PathBuf,
        /// The earlier instant (a relative time like -1h is fine).
        #[arg(allow_hyphen_values = true)]
        a: String,
        /// The later instant (default: now).
        #[arg(allow_hyphen_values = true)]
        b: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Make DST a writable copy of SRC (a file or a tree in the mount),
    /// at once whatever its size: nothing is copied until it changes.
    Clone {
        src: PathBuf,
        dst: PathBuf,
        /// Copy SRC as it was then (default: now).
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Name a tree as it is (or was) and make working trees from it:
    /// each instantiation is a clone, made at once whatever the tree's
    /// size; the tree may change or go afterwards.
    Template {
        #[command(subcommand)]
        verb: TemplateVerb,
    },
    /// Name an instant (default: now); a tag works wherever a time does.
    Tag {
        name: String,
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: Option<String>,
        /// Remove the tag instead (its maker or root).
        #[arg(long, conflicts_with = "at")]
        delete: bool,
        /// A path in the mount (default: the current directory).
        #[arg(long, default_value = ".")]
        path: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// List tags.
    Tags {
        #[arg(default_value = ".")]
        path: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Store size, dedup and compression, versions.
    Status {
        #[arg(default_value = ".")]
        path: PathBuf,
        /// Also list the FUSE requests the mount has served, by kind.
        #[arg(long)]
        requests: bool,
        /// List the clones instead: where each is, its instant, the bytes
        /// it shares with its base and the bytes of its own (walks each
        /// clone).
        #[arg(long, conflicts_with = "requests")]
        clones: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Record the whole existing tree in history now (background, with progress).
    Ingest {
        #[arg(default_value = ".")]
        path: PathBuf,
        /// Return at once instead of showing progress until done.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Verify every reference and chunk hash of a store; or, given a
    /// union's branch list (BR1=rw:BR2=ro:..., as mount takes it), the
    /// union's invariants in the branches it has now, snapshots' included
    /// (leftover copy-up and whiteout temporaries, redirects pointing
    /// nowhere).
    Fsck {
        /// A path in a mount or store directory, or a branch list.
        #[arg(default_value = ".")]
        path: PathBuf,
        /// Repair (root): re-index intact chunks, store damaged ones again
        /// from live files, mark versions that cannot be saved as lost; in
        /// a union's read-write branches remove leftover temporaries and
        /// dangling redirects (run it with the union unmounted).
        #[arg(long)]
        repair: bool,
        /// A branch list mounted with `-o userxattr`: its overlay marks
        /// are `user.overlay.*`.
        #[arg(long)]
        userxattr: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Free the space of chunks no version references any more (root only).
    Gc {
        #[arg(default_value = ".")]
        path: PathBuf,
        /// Report what would be freed; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Apply the retention policy now (the cleaner does this hourly; root only).
    Clean {
        #[arg(default_value = ".")]
        path: PathBuf,
        #[arg(long)]
        dry_run: bool,
        /// Evaluate retention as of this instant (e.g. +30d, 2027-01-01).
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        now: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Remove versions of PATH (of everything ever under it, for a directory) beyond the limits given.
    Prune {
        path: PathBuf,
        #[command(flatten)]
        keep: maintain::KeepArgs,
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Remove PATH, its entire history and its stored bytes, permanently (root only; recorded in the audit log).
    Purge {
        path: PathBuf,
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Version policies: check a file, explain what applies to a path, reload.
    Policy {
        #[command(subcommand)]
        verb: PolicyVerb,
    },
    /// The audit log: prunes, purges, collections, policy reloads (root only).
    Audit {
        #[arg(default_value = ".")]
        path: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Freeze a mounted union's upper branch (read-only from now on, named)
    /// and put a fresh read-write branch on top, in one change (root only).
    Snapshot {
        /// The union's mount point.
        mnt: PathBuf,
        /// The frozen branch's name (default: snapshot-N); the fresh branch
        /// is made as STORE/branches/over-NAME.
        #[arg(long)]
        name: Option<String>,
        /// Revoke write handles into the branch being frozen.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Fold the branches frozen by snapshots into the oldest of them, while
    /// mounted (root only): the union shows the same throughout.
    Snapmerge {
        /// The union's mount point.
        mnt: PathBuf,
        /// Fold only the branches frozen since snapshot N into N's branch
        /// (default: every frozen branch, into the oldest snapshot's).
        #[arg(long, value_name = "N")]
        upto: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// A mounted union's branches: list, add, remove, or change one's mode while mounted.
    Branch {
        #[command(subcommand)]
        verb: BranchVerb,
    },
    /// Run a command in a sandbox of a mount: what it and its children
    /// change goes to a private read-write layer over the mount that no
    /// other process sees, until `sandbox commit` applies it or `sandbox
    /// discard` throws it away. Root or any user (then in a user namespace
    /// of its own, where others' files show as the overflow ids).
    /// `chronofs sandbox MNT -- CMD ARGS...`
    #[command(args_conflicts_with_subcommands = true)]
    Sandbox {
        #[command(subcommand)]
        verb: Option<SandboxVerb>,
        /// The mount point.
        mnt: Option<PathBuf>,
        /// Run in sandbox N, made by an earlier run, instead of a new one.
        #[arg(long, value_name = "N")]
        id: Option<u32>,
        /// The command and its arguments, after --.
        #[arg(last = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Print a shell completion script to standard output.
    ///
    /// bash: `chronofs completions bash >
    /// /usr/local/share/bash-completion/completions/chronofs` (what
    /// scripts/install does).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages: chronofs(1) and one per subcommand.
    ///
    /// Pages are named after the verb: chronofs-log(1),
    /// chronofs-template-create(1)...
    Man {
        /// Write every page into DIR, made if missing (default: chronofs.1
        /// alone, to standard output).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum SandboxVerb {
    /// The sandboxes of the mount at MNT, or of every mount: id, mount,
    /// when made, whether served now, where their changes are.
    List {
        mnt: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Apply sandbox ID's changes to the mount at once and end the sandbox
    /// (its owner or root). Refused, with nothing applied, when the mount changed
    /// since the sandbox was made where the sandbox changed it too: the
    /// paths are listed. Processes still in it lose their view (ENOTCONN).
    Commit {
        id: u32,
        /// The mount whose sandbox it is (needed when several have one ID).
        #[arg(long, value_name = "MNT")]
        mount: Option<PathBuf>,
        /// Apply it even where it conflicts: the sandbox's side wins.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Throw sandbox ID away with its changes (its owner or root); processes still
    /// in it lose their view (ENOTCONN).
    Discard {
        id: u32,
        /// The mount whose sandbox it is (needed when several have one ID).
        #[arg(long, value_name = "MNT")]
        mount: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum TemplateVerb {
    /// Make DIR (a file or a tree in a mount with history) template NAME,
    /// as it is now or as it was at TIME.
    Create {
        name: String,
        dir: PathBuf,
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Make DST (a new name in the same mount) a writable clone of
    /// template NAME.
    Instantiate {
        name: String,
        dst: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// List the templates of the mount PATH lies in.
    List {
        #[arg(default_value = ".")]
        path: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Forget template NAME (its maker or root); trees made from it stay.
    Delete {
        name: String,
        /// A path in the mount (default: the current directory).
        #[arg(long, default_value = ".")]
        path: PathBuf,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum BranchVerb {
    /// The branches, top first: position, mode, persistent id, path.
    List {
        /// The union's mount point.
        mnt: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Make a branch read-write or read-only now (root only). Refused while
    /// files of a branch turning read-only are open for writing, unless
    /// --force, which makes their descriptors fail with ESTALE; refused
    /// while any of its files is open with kernel passthrough.
    Mode {
        /// The union's mount point.
        mnt: PathBuf,
        /// The branch: its path, or its position (0 = top).
        branch: String,
        /// ro or rw.
        #[arg(value_parser = ["ro", "rw"])]
        mode: String,
        /// Revoke write handles into a branch turning read-only.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Insert a directory into the union now (root only): cached lookups
    /// and later operations see it at once; open files keep what they
    /// opened.
    Add {
        /// The union's mount point.
        mnt: PathBuf,
        /// The directory to insert (not inside the mount or another branch).
        dir: PathBuf,
        /// Its position: 0 = top (the default), past the bottom = bottom.
        #[arg(long)]
        at: Option<u32>,
        /// rw (the default) or ro.
        #[arg(long, value_parser = ["ro", "rw"], default_value = "rw")]
        mode: String,
        #[arg(long)]
        json: bool,
    },
    /// Take a branch out of the union now (root only). Refused for the
    /// root's branch (it holds the store), and while its files are open
    /// unless --force, which makes their descriptors fail with ESTALE; a
    /// snapshot's fresh branch holding changes only with --force.
    Remove {
        /// The union's mount point.
        mnt: PathBuf,
        /// The branch: its path, or its position (0 = top).
        branch: String,
        /// Revoke handles into the branch; remove a snapshot's fresh
        /// branch and with it the changes made since.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum PolicyVerb {
    /// Validate a policy file (line-numbered errors).
    Check {
        file: PathBuf,
        /// Check it as a user's own file (no [defaults] or [bounds]).
        #[arg(long)]
        user: bool,
        #[arg(long)]
        json: bool,
    },
    /// Which rules apply to PATH and why.
    Explain {
        path: PathBuf,
        /// As if PATH belonged to this user.
        #[arg(long, value_name = "USER")]
        user: Option<String>,
        /// As if this process (its name) made the change.
        #[arg(long, value_name = "NAME")]
        process: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Load the policy files again without remounting (root only).
    Reload {
        #[arg(default_value = ".")]
        path: PathBuf,
        #[command(flatten)]
        common: Common,
    },
}

// Options every history verb takes (a plain comment: with deferred
// subcommands a doc comment here would become their about text).
#[derive(clap::Args, Debug)]
pub(crate) struct Common {
    /// Print machine-readable JSON.
    #[arg(long)]
    json: bool,
    /// The store, when it is not SRC/.chronofs and nothing is mounted.
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
}

const VERBS: &[&str] = &[
    "mount",
    "umount",
    "log",
    "cat",
    "ls",
    "restore",
    "revert",
    "undelete",
    "diff",
    "clone",
    "template",
    "tag",
    "tags",
    "status",
    "fsck",
    "ingest",
    "gc",
    "clean",
    "prune",
    "purge",
    "policy",
    "audit",
    "branch",
    "snapshot",
    "snapmerge",
    "sandbox",
    "completions",
    "man",
    "help",
    "--help",
    "-h",
    "--version",
    "-V",
];

/// Rewrites the argument list of the mount helper forms into `chronofs mount`:
/// `mount.fuse.chronofs SRC MNT -o OPTS` (mount(8)) and
/// `chronofs SRC MNT -o OPTS` (mount.fuse3 runs the subtype like this).
/// Anything else whose first word is not a verb is an unknown command:
/// taking every unknown word for a source directory turned typos into
/// mount usage errors.
fn normalize_args(mut args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let argv0 = args
        .first()
        .and_then(|a| {
            PathBuf::from(a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let helper = argv0.starts_with("mount.");
    let first = args.get(1).map(|a| a.to_string_lossy().into_owned());
    let unknown = first
        .as_deref()
        .filter(|f| !f.starts_with('-') && !VERBS.contains(f));
    if let (Some(word), false) = (unknown, helper) {
        if !mount_shorthand(&args[1..]) {
            return Err(unknown_command(word));
        }
    }
    if helper || unknown.is_some() {
        // mount(8) passes -n (no mtab), -s (sloppy), -v; none apply here.
        args.retain(|a| !matches!(a.to_str(), Some("-n" | "-s" | "-v")));
        args.insert(1, OsString::from("mount"));
    }
    Ok(args)
}

/// `SRC MNT ...` as mount.fuse3 passes it: two words before any option,
/// the first a path (it has a slash, or names an existing directory).
fn mount_shorthand(args: &[OsString]) -> bool {
    let (Some(src), Some(mnt)) = (args.first(), args.get(1)) else {
        return false;
    };
    let looks_like_path = src.to_string_lossy().contains('/') || std::path::Path::new(src).is_dir();
    looks_like_path && !mnt.to_string_lossy().starts_with('-')
}

fn unknown_command(word: &str) -> String {
    let verbs = VERBS.iter().filter(|v| !v.starts_with('-'));
    let closest = verbs
        .clone()
        .min_by_key(|v| edit_distance(word, v))
        .copied()
        .unwrap_or("help");
    format!(
        "unknown command '{word}' (did you mean '{closest}'?); commands: {}",
        verbs.copied().collect::<Vec<_>>().join(", ")
    )
}

/// Levenshtein distance (verbs are short; quadratic is nothing).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

pub fn main() -> i32 {
    exit_on_output_failure();
    let args = match normalize_args(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("chronofs: {msg}");
            return exit::USAGE;
        }
    };
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            if e.use_stderr() {
                eprintln!("chronofs: {}", clap_one_line(&e));
            } else {
                let _ = e.print();
            }
            return code;
        }
    };
    match cli.command {
        Command::Mount {
            src,
            mnt,
            foreground,
            options,
            debug,
            ready_fd,
        } => {
            let mut opts = MountOptions::default();
            for list in &options {
                if let Err(e) = opts.apply(list) {
                    eprintln!("chronofs: {e}");
                    return exit::USAGE;
                }
            }
            if let Err(e) = opts.check() {
                eprintln!("chronofs: {e}");
                return exit::USAGE;
            }
            opts.debug |= debug;
            if let Some(fd) = ready_fd.filter(|fd| *fd < 3) {
                eprintln!("chronofs: --ready-fd {fd}: must be 3 or above (0-2 are stdio)");
                return exit::USAGE;
            }
            let ready = match ready_fd.map(crate::sys::inherited_fd).transpose() {
                Ok(fd) => fd.map(std::fs::File::from),
                Err(e) => {
                    eprintln!("chronofs: --ready-fd {}: {e}", ready_fd.unwrap_or(-1));
                    return exit::USAGE;
                }
            };
            mount::run(&src, &mnt, opts, foreground || debug, ready)
        }
        Command::Umount { mnt, lazy } => report(mount::unmount(&mnt, lazy)),
        Command::Diff { path, a, b, common } => {
            crate::sys::default_sigpipe();
            // diff(1)'s status: 0 same, 1 different, 2 trouble.
            match run_diff(&path, &a, b.as_deref(), &common) {
                Ok(o) if o.trouble => DIFF_TROUBLE,
                Ok(o) if o.differ => exit::FAILURE,
                Ok(_) => exit::OK,
                Err(e) => {
                    eprintln!("chronofs: {}", one_line(&e));
                    DIFF_TROUBLE
                }
            }
        }
        other => {
            crate::sys::default_sigpipe();
            report(run_history(other))
        }
    }
}

/// `println!` panics when standard output cannot be written (a full
/// disk, a closed pipe): such a command reports it in one line and exits
/// 1 instead (a reader gone, as `chronofs log | head`, ends it quietly,
/// as SIGPIPE would). Every other panic keeps the default report.
fn exit_on_output_failure() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(why) = msg.strip_prefix("failed printing to stdout: ") {
            if !why.contains("Broken pipe") {
                eprintln!("chronofs: cannot write to standard output: {why}");
            }
            std::process::exit(exit::FAILURE);
        }
        default(info);
    }));
}

fn report(r: anyhow::Result<()>) -> i32 {
    match r {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("chronofs: {}", one_line(&e));
            if let Some(c) = e.downcast_ref::<CannotRun>() {
                return c.code;
            }
            match e.is::<UsageError>() {
                true => exit::USAGE,
                false => exit::FAILURE,
            }
        }
    }
}

/// An error as one line (control characters escaped): its causes joined by ": ", each once (an error
/// that quotes its source in its own message, as `thiserror`'s
/// `{source}` does, would otherwise repeat it).
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    // A name in the message (a tag's, a path's) may hold a newline.
    history::message_shown(&line)
}

/// A usage error from clap as one line: its message (clap's may span
/// lines, a list of missing arguments), without the usage block and the
/// tips (`use '-- -3'` would turn a mistyped value into a path).
fn clap_one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() || line.starts_with("tip:") {
            continue;
        }
        parts.push(line.strip_prefix("error: ").unwrap_or(line));
    }
    format!("{} (see --help)", parts.join(" "))
}

/// diff's exit status for an error (diff(1)'s "trouble").
const DIFF_TROUBLE: i32 = 2;

fn run_diff(
    path: &std::path::Path,
    a: &str,
    b: Option<&str>,
    common: &Common,
) -> anyhow::Result<diff::Outcome> {
    let t = history::target(path, common.store.as_deref())?;
    let a = history::parse_at(Some(a))?;
    let b = history::parse_at(b)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let outcome = diff::diff(&t, &a, &b, common.json, &mut out)?;
    std::io::Write::flush(&mut out)?;
    Ok(outcome)
}

fn run_history(cmd: Command) -> anyhow::Result<()> {
    use history as h;
    let tgt = |p: &PathBuf, c: &Common| h::target(p, c.store.as_deref());
    match cmd {
        Command::Log {
            path,
            recursive,
            since,
            until,
            common,
        } => h::log(
            &tgt(&path, &common)?,
            since.as_deref(),
            until.as_deref(),
            recursive,
            common.json,
        ),
        Command::Cat {
            path,
            at,
            version,
            common,
        } => h::cat(&tgt(&path, &common)?, at.as_deref(), version, common.json),
        Command::Ls {
            dir,
            at,
            deleted,
            long,
            common,
        } => h::ls(
            &tgt(&dir, &common)?,
            at.as_deref(),
            deleted,
            long,
            common.json,
        ),
        Command::Restore {
            path,
            at,
            to,
            common,
        } => {
            let t = tgt(&path, &common)?;
            let at = h::parse_at(Some(&at))?;
            let dest = match to {
                Some(d) => h::absolutize(&d)?,
                None => t.abs.clone(),
            };
            // In place, the past replaces PATH; elsewhere it makes a new
            // path, and never replaces whatever is at DEST (a directory
            // given as DEST went, with all it held).
            if dest != t.abs && to_exists(&dest) {
                anyhow::bail!(
                    "{} exists; --to takes a path that does not exist yet",
                    dest.display()
                );
            }
            let src = restore::source(&t, &at)?;
            restore::run(&t, &src, restore::Verb::Restore, &at, &dest, common.json)
        }
        Command::Revert { dir, at, common } => {
            let t = tgt(&dir, &common)?;
            let at = h::parse_at(Some(&at))?;
            let dest = t.abs.clone();
            let src = restore::source(&t, &at)?;
            restore::run(&t, &src, restore::Verb::Revert, &at, &dest, common.json)
        }
        Command::Undelete { path, to, common } => {
            undelete::run(&tgt(&path, &common)?, to, common.json)
        }
        Command::Clone {
            src,
            dst,
            at,
            common,
        } => h::clone(&src, &dst, at.as_deref(), &common),
        Command::Template { verb } => match verb {
            TemplateVerb::Create {
                name,
                dir,
                at,
                common,
            } => template::create(&name, &dir, at.as_deref(), &common),
            TemplateVerb::Instantiate { name, dst, common } => {
                template::instantiate(&name, &dst, &common)
            }
            TemplateVerb::List { path, common } => template::list(&path, &common),
            TemplateVerb::Delete { name, path, common } => template::delete(&name, &path, &common),
        },
        Command::Tag {
            name,
            at,
            delete,
            path,
            common,
        } => h::tag(
            &tgt(&path, &common)?,
            &name,
            at.as_deref(),
            delete,
            common.json,
        ),
        Command::Tags { path, common } => h::tags(&tgt(&path, &common)?, common.json),
        Command::Status {
            path,
            clones: true,
            common,
            ..
        } => template::clones(&path, &common),
        Command::Status {
            path,
            requests,
            clones: false,
            common,
        } => h::status(&tgt(&path, &common)?, common.json, requests),
        Command::Ingest {
            path,
            no_wait,
            common,
        } => {
            // The walk covers the whole mount whatever PATH names: a
            // missing path or a file would read as a narrower request.
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => anyhow::bail!(
                    "ingest {}: not a directory; ingest records the whole tree of the mount a directory lies in",
                    path.display()
                ),
                Err(e) => anyhow::bail!("ingest {}: {e}", path.display()),
            }
            h::ingest(&tgt(&path, &common)?, !no_wait, common.json)
        }
        Command::Fsck {
            path,
            repair,
            userxattr,
            common,
        } => {
            let clean = if union_fsck::is_branch_list(&path) {
                let ns = match userxattr {
                    true => crate::union::format::XattrNs::User,
                    false => crate::union::format::XattrNs::Trusted,
                };
                union_fsck::run(&path, (repair, ns), common.json, common.store.as_deref())?
            } else if userxattr {
                anyhow::bail!(
                    "--userxattr applies to a branch list (BR1=rw:BR2=ro:...), not a path"
                );
            } else {
                h::fsck(&tgt(&path, &common)?, repair, common.json)?
            };
            if clean {
                Ok(())
            } else {
                anyhow::bail!("fsck found problems")
            }
        }
        Command::Gc {
            path,
            dry_run,
            common,
        } => maintain::gc(&tgt(&path, &common)?, dry_run, common.json),
        Command::Clean {
            path,
            dry_run,
            now,
            common,
        } => maintain::clean(&tgt(&path, &common)?, now.as_deref(), dry_run, common.json),
        Command::Prune {
            path,
            keep,
            dry_run,
            common,
        } => {
            // The command line first, then the path.
            let keep = keep.retention()?;
            maintain::prune(&tgt(&path, &common)?, keep, dry_run, common.json)
        }
        Command::Purge {
            path,
            dry_run,
            common,
        } => maintain::purge(&tgt(&path, &common)?, dry_run, common.json),
        Command::Policy { verb } => match verb {
            PolicyVerb::Check { file, user, json } => maintain::policy_check(&file, user, json),
            PolicyVerb::Explain {
                path,
                user,
                process,
                common,
            } => maintain::policy_explain(&tgt(&path, &common)?, user, process, common.json),
            PolicyVerb::Reload { path, common } => {
                maintain::policy_reload(&tgt(&path, &common)?, common.json)
            }
        },
        Command::Audit { path, common } => maintain::audit(&tgt(&path, &common)?, common.json),
        Command::Snapshot {
            mnt,
            name,
            force,
            json,
        } => branch::snapshot(&mnt, name.as_deref(), force, json),
        Command::Snapmerge { mnt, upto, json } => branch::snapmerge(&mnt, upto.as_deref(), json),
        Command::Branch { verb } => match verb {
            BranchVerb::List { mnt, json } => branch::list(&mnt, json),
            BranchVerb::Mode {
                mnt,
                branch: which,
                mode,
                force,
                json,
            } => branch::mode(&mnt, &which, &mode, force, json),
            BranchVerb::Add {
                mnt,
                dir,
                at,
                mode,
                json,
            } => branch::add(&mnt, &dir, at, &mode, json),
            BranchVerb::Remove {
                mnt,
                branch: which,
                force,
                json,
            } => branch::remove(&mnt, &which, force, json),
        },
        Command::Sandbox { verb, mnt, id, cmd } => match (verb, mnt) {
            (Some(SandboxVerb::List { mnt, json }), _) => sandbox::list(mnt.as_deref(), json),
            (Some(SandboxVerb::Discard { id, mount, json }), _) => {
                sandbox::discard(id, mount.as_deref(), json)
            }
            (
                Some(SandboxVerb::Commit {
                    id,
                    mount,
                    force,
                    json,
                }),
                _,
            ) => sandbox::commit(id, mount.as_deref(), force, json),
            (None, Some(mnt)) => sandbox::run(&mnt, id, &cmd),
            (None, None) => Err(anyhow::anyhow!(UsageError(
                "give the mount point: chronofs sandbox MNT -- CMD ARGS...".into()
            ))),
        },
        Command::Completions { shell } => generate::completions(shell),
        Command::Man { dir } => generate::man(dir.as_deref()),
        Command::Mount { .. } | Command::Umount { .. } | Command::Diff { .. } => Ok(()),
    }
}

fn to_exists(p: &std::path::Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Subcommands are built only when run (`defer`), so clap's own
    /// checks of each (names, conflicts, defaults) run here for all.
    #[test]
    fn every_subcommand_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn an_error_line_names_each_cause_once() {
        let quoted = crate::union::spec::SpecError::MountPoint {
            mnt: "m".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        };
        let line = one_line(&anyhow::Error::from(quoted).context("mounting"));
        assert_eq!(
            line,
            "mounting: mount point m: No such file or directory (os error 2)"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&plain), "outer: inner");
    }

    #[test]
    fn helper_forms_become_mount() {
        assert_eq!(
            normalize_args(args(&[
                "/sbin/mount.fuse.chronofs",
                "/a",
                "/b",
                "-o",
                "rw",
                "-n"
            ])),
            Ok(args(&[
                "/sbin/mount.fuse.chronofs",
                "mount",
                "/a",
                "/b",
                "-o",
                "rw"
            ]))
        );
        assert_eq!(
            normalize_args(args(&["chronofs", "/a", "/b", "-o", "rw"])),
            Ok(args(&["chronofs", "mount", "/a", "/b", "-o", "rw"]))
        );
        assert_eq!(
            normalize_args(args(&["chronofs", "umount", "/b"])),
            Ok(args(&["chronofs", "umount", "/b"]))
        );
    }

    #[test]
    fn unknown_verbs_are_not_mounts() {
        let e = normalize_args(args(&["chronofs", "branches"])).unwrap_err();
        assert!(e.starts_with("unknown command 'branches'"), "{e}");
        let e = normalize_args(args(&["chronofs", "statsu", "x"])).unwrap_err();
        assert!(e.contains("did you mean 'status'"), "{e}");
    }
}
