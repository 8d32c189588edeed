//! The command line: `chronofs <verb> ...`, and the mount helper entry
//! points used by mount(8) and /etc/fstab.
//!
//! Owns: argument parsing, user-facing errors and exit codes, daemonizing.
//! Uses: every layer below (it assembles the mount). The only place that
//! uses `anyhow`.

mod mount;
mod options;

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
}

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
enum Command {
    /// Mount directory SRC at MNT.
    Mount {
        /// The directory whose files chronofs serves (stays a plain directory).
        src: PathBuf,
        /// Where to mount (an existing directory; may equal SRC).
        mnt: PathBuf,
        /// Stay in the foreground instead of becoming a daemon.
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Comma-separated mount options (see README.md); may be repeated.
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        /// Log every request (implies -f).
        #[arg(short = 'd', long)]
        debug: bool,
    },
    /// Unmount a chronofs mount.
    Umount {
        mnt: PathBuf,
        /// Detach now even if busy; clean up when no longer in use.
        #[arg(short = 'l', long)]
        lazy: bool,
    },
}

const VERBS: &[&str] = &["mount", "umount", "help", "--help", "-h", "--version", "-V"];

/// Rewrites the argument list of the mount helper forms into `chronofs mount`:
/// `mount.fuse.chronofs SRC MNT -o OPTS` (mount(8)) and
/// `chronofs SRC MNT -o OPTS` (mount.fuse3 runs the subtype like this).
fn normalize_args(mut args: Vec<OsString>) -> Vec<OsString> {
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
    let bare_paths = first
        .as_deref()
        .is_some_and(|f| !f.starts_with('-') && !VERBS.contains(&f));
    if helper || bare_paths {
        // mount(8) passes -n (no mtab), -s (sloppy), -v; none apply here.
        args.retain(|a| !matches!(a.to_str(), Some("-n" | "-s" | "-v")));
        args.insert(1, OsString::from("mount"));
    }
    args
}

pub fn main() -> i32 {
    let args = normalize_args(std::env::args_os().collect());
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
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
        } => {
            let mut opts = MountOptions::default();
            for list in &options {
                if let Err(e) = opts.apply(list) {
                    eprintln!("chronofs: {e}");
                    return exit::USAGE;
                }
            }
            opts.debug |= debug;
            mount::run(&src, &mnt, opts, foreground || debug)
        }
        Command::Umount { mnt, lazy } => match mount::unmount(&mnt, lazy) {
            Ok(()) => exit::OK,
            Err(e) => {
                eprintln!("chronofs: {e:#}");
                exit::FAILURE
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
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
            args(&["/sbin/mount.fuse.chronofs", "mount", "/a", "/b", "-o", "rw"])
        );
        assert_eq!(
            normalize_args(args(&["chronofs", "/a", "/b", "-o", "rw"])),
            args(&["chronofs", "mount", "/a", "/b", "-o", "rw"])
        );
        assert_eq!(
            normalize_args(args(&["chronofs", "umount", "/b"])),
            args(&["chronofs", "umount", "/b"])
        );
    }
}
