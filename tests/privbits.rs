//! Privilege bits (set-user-ID, set-group-ID, the `security.capability`
//! xattr) after writes, truncations and ownership changes, compared with a
//! native directory: the kernel's rules decide what a writer keeps, and
//! the mount must show what the native file system shows.

#![deny(unsafe_code)]

mod common;
use common::*;

use std::ffi::CString;
use std::path::Path;

const CAPS: &str = "security.capability";

/// A `vfs_cap_data` revision 2 value granting CAP_NET_RAW permitted and
/// effective, as `setcap cap_net_raw+ep` writes it.
fn cap_net_raw() -> Vec<u8> {
    const VFS_CAP_REVISION_2: u32 = 0x0200_0000;
    const VFS_CAP_FLAGS_EFFECTIVE: u32 = 0x1;
    const CAP_NET_RAW: u32 = 13;
    let words = [
        VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE,
        1 << CAP_NET_RAW, // permitted, low word
        0,                // inheritable, low word
        0,                // permitted, high word
        0,                // inheritable, high word
    ];
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Write,
    Append,
    Pwrite,
    Ftruncate,
    Truncate,
    OpenTrunc,
    /// chown to the current owner and group.
    Chown,
    /// chown(-1, group).
    Chgrp,
}

const WRITES: &[Op] = &[
    Op::Write,
    Op::Append,
    Op::Pwrite,
    Op::Ftruncate,
    Op::Truncate,
    Op::OpenTrunc,
];

const MODES: &[u32] = &[0o4777, 0o2777, 0o2767, 0o6777, 0o0777];

/// Runs `op` on `c` in a child with `ids` (`None`: root); the errno, 0 on
/// success. Only system calls on prepared data: see [`in_child`].
fn op_in_child(c: &CString, op: Op, ids: Option<(u32, u32)>) -> i32 {
    in_child(ids, || run_op(c, op))
}

/// [`op_in_child`] as root without capabilities (CAP_FSETID among them).
fn op_in_capless_root_child(c: &CString, op: Op) -> i32 {
    in_child(None, || match sys::drop_all_capabilities() {
        Ok(()) => run_op(c, op),
        Err(_) => 252,
    })
}

fn run_op(c: &CString, op: Op) -> i32 {
    let wr = libc::O_WRONLY | libc::O_CLOEXEC;
    rc(match op {
        Op::Write => sys::open(c, wr, 0).and_then(|fd| fd.write(b"x").map(drop)),
        Op::Append => sys::open(c, wr | libc::O_APPEND, 0).and_then(|fd| fd.write(b"x").map(drop)),
        Op::Pwrite => sys::open(c, wr, 0).and_then(|fd| fd.pwrite(b"x", 100).map(drop)),
        Op::Ftruncate => sys::open(c, wr, 0).and_then(|fd| fd.ftruncate(3)),
        Op::Truncate => sys::truncate(c, 3),
        Op::OpenTrunc => sys::open(c, wr | libc::O_TRUNC, 0).map(drop),
        Op::Chown => sys::chown(c, NOBODY, NOBODY),
        Op::Chgrp => sys::chown(c, u32::MAX, NOBODY),
    })
}

fn octal(mode: Result<u32, Errno>) -> String {
    match mode {
        Ok(m) => format!("{:o}", m & 0o7777),
        Err(e) => format!("errno {e}"),
    }
}

/// Runs `cases` in fresh directories `name` of the native directory and
/// the mount, and reports every line that differs (not just the first:
/// the pattern of failures tells which rule is broken).
fn compare_all(m: &Mount, name: &str, cases: impl Fn(&Path) -> Vec<String>) {
    let run = |root: &Path| {
        let d = root.join(name);
        std::fs::create_dir(&d).unwrap();
        cases(&d)
    };
    let native = run(&m.native);
    let mounted = run(&m.mnt);
    assert_eq!(native.len(), mounted.len());
    let diffs: Vec<String> = native
        .iter()
        .zip(&mounted)
        .filter(|(n, t)| n != t)
        .map(|(n, t)| format!("  native: {n}\n  mount:  {t}"))
        .collect();
    assert!(
        diffs.is_empty(),
        "{name}: {} of {} cases differ from native (mode {}):\n{}",
        diffs.len(),
        native.len(),
        m.mode,
        diffs.join("\n")
    );
}

/// One case: a file `mode` owned by `owner`, with file capabilities if
/// `caps`, on which `op` runs as `who` (while root holds it open for
/// reading, if `held`). Returns a line describing the outcome: the op's
/// errno, the mode as stat and as a mode-only statx see it, and the
/// capability xattr.
fn case(
    dir: &Path,
    mode: u32,
    owner: (u32, u32),
    caps: bool,
    who: Option<(u32, u32)>,
    op: Op,
    held: bool,
) -> String {
    let name = format!(
        "f{mode:o}-{}.{}-{}-{}-{op:?}",
        owner.0,
        owner.1,
        if caps { "caps" } else { "nocaps" },
        who.map_or(0, |w| w.0)
    );
    let p = dir.join(&name);
    write_file(&p, b"0123456789");
    let c = cstr(&p);
    // chown first: it clears the bits chmod sets.
    sys::chown(&c, owner.0, owner.1).unwrap();
    sys::chmod(&c, mode).unwrap();
    let set_caps = if caps {
        format!("{:?}", set_xattr(&p, CAPS, &cap_net_raw(), 0))
    } else {
        String::new()
    };
    let before = octal(stat(&p).map(|st| st.st_mode));
    let hold = held.then(|| std::fs::File::open(&p).unwrap());
    let r = op_in_child(&c, op, who);
    drop(hold);
    // Mode-only first: a full stat would refresh what the mount cached.
    let after_statx = octal(sys::statx_mode(&c));
    let after_stat = octal(stat(&p).map(|st| st.st_mode));
    let caps_after = get_xattr(&p, CAPS).map(|v| v == cap_net_raw());
    format!(
        "{name}: setcap {set_caps} before {before} op {r} stat {after_stat} statx {after_statx} caps {caps_after:?}"
    )
}

/// Writes and truncations by an unprivileged caller (clears set-user-ID,
/// and set-group-ID where the kernel says so) and by root (keeps them);
/// both drop file capabilities.
#[test]
fn write_and_truncate_clear_privileges_as_natively() {
    each_mode(|m| {
        compare_all(m, "writes", |d| {
            let mut lines = Vec::new();
            for &mode in MODES {
                for caps in [false, true] {
                    for owner in [(0, 0), (0, NOBODY)] {
                        for who in [Some((NOBODY, NOBODY)), None] {
                            for &op in WRITES {
                                lines.push(case(d, mode, owner, caps, who, op, false));
                            }
                        }
                    }
                }
            }
            lines
        });
    });
}

/// Writes and truncations by root without CAP_FSETID clear set-ID bits
/// as an unprivileged writer's do: the kernel flags them so, and root's
/// ids alone do not tell (found by a bug hunt: the mount kept them).
#[test]
fn capless_root_writes_clear_privileges_as_natively() {
    each_mode(|m| {
        compare_all(m, "capless", |d| {
            let mut lines = Vec::new();
            for &mode in MODES {
                for &op in WRITES {
                    let name = format!("f{mode:o}-{op:?}");
                    let p = d.join(&name);
                    write_file(&p, b"0123456789");
                    let c = cstr(&p);
                    sys::chown(&c, NOBODY, NOBODY).unwrap();
                    sys::chmod(&c, mode).unwrap();
                    let r = op_in_capless_root_child(&c, op);
                    let after = octal(stat(&p).map(|st| st.st_mode));
                    lines.push(format!("{name}: op {r} mode {after}"));
                }
            }
            lines
        });
    });
}

/// The same writes by an unprivileged caller while root holds the file
/// open for reading: the kernel shares one passthrough backing per inode,
/// made with its first opener's credentials, and an unprivileged write
/// through root's kept set-user-ID (a user's bytes in a set-user-ID root
/// program). Compared on the disk (the backing file against the native
/// one): what the mount shows right after may still be the kernel's
/// cached attributes until the daemon's invalidation lands.
#[test]
fn a_root_reader_lends_no_privilege_to_a_writer() {
    each_mode(|m| {
        let run = |root: &Path, shown: &Path| {
            let d = root.join("held");
            std::fs::create_dir(&d).unwrap();
            let mut lines = Vec::new();
            for &mode in MODES {
                for (&op, held_first) in WRITES.iter().flat_map(|op| [(op, false), (op, true)]) {
                    // Set-group-ID without group execute grants nothing:
                    // through a backing root registered (its group the
                    // file's), a non-member's write keeps it (documented).
                    if held_first && mode & 0o2010 == 0o2000 && mode & 0o4000 == 0 {
                        continue;
                    }
                    let name = format!("f{mode:o}-{op:?}-held-first-{held_first}");
                    let p = d.join(&name);
                    write_file(&p, b"0123456789");
                    let c = cstr(&p);
                    // Held from before the chmod, root's handle is a
                    // passthrough one whatever the timing.
                    let early = held_first.then(|| std::fs::File::open(&p).unwrap());
                    sys::chmod(&c, mode).unwrap();
                    let hold = std::fs::File::open(&p).unwrap();
                    let r = op_in_child(&c, op, Some((NOBODY, NOBODY)));
                    drop(early);
                    drop(hold);
                    let on_disk = octal(stat(&shown.join("held").join(&name)).map(|st| st.st_mode));
                    lines.push(format!("{name}: op {r} mode {on_disk}"));
                }
            }
            lines
        };
        let native = run(&m.native, &m.native);
        let mounted = run(&m.mnt, &m.src);
        assert_eq!(native, mounted, "mode {}", m.mode);
    });
}

/// chown and chgrp clear set-user-ID (and group-executable set-group-ID)
/// of a regular file for everyone, and file capabilities.
#[test]
fn chown_clears_privileges_as_natively() {
    each_mode(|m| {
        compare_all(m, "chowns", |d| {
            let mut lines = Vec::new();
            for &mode in MODES {
                for caps in [false, true] {
                    for who in [Some((NOBODY, NOBODY)), None] {
                        for op in [Op::Chown, Op::Chgrp] {
                            lines.push(case(d, mode, (NOBODY, NOBODY), caps, who, op, false));
                        }
                    }
                }
            }
            lines
        });
    });
}

/// `chronofs ARGS` at the mount root as `uid`/`gid`.
fn chronofs_as(m: &Mount, ids: (u32, u32), args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(bin())
        .args(args)
        .current_dir(&m.mnt)
        .uid(ids.0)
        .gid(ids.1)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin().display()))
}

/// A restore runs with its caller's credentials, so it brings set-ID
/// bits back only for a caller who may set them: an unprivileged writer
/// who lost root's set-user-ID bit by writing cannot regain it by
/// restoring the version that had it.
#[test]
fn restore_sets_privileges_only_for_who_may() {
    each_versioning_mode(|m| {
        let f = m.p("f");
        let c = cstr(&f);
        write_file(&f, b"root's program");
        sys::chmod(&c, 0o4777).unwrap();
        let out = chronofs_as(m, (0, 0), &["tag", "setuid"]);
        assert!(out.status.success(), "tag: {out:?}");
        let appended = op_in_child(&c, Op::Append, Some((NOBODY, NOBODY)));
        assert_eq!(appended, 0);
        assert_eq!(sys::statx_mode(&c).map(|m| m & 0o7777), Ok(0o777));

        let appended_bytes = read_file(&f);
        let out = chronofs_as(m, (NOBODY, NOBODY), &["restore", "f", "--at", "setuid"]);
        // Natively chmod by a non-owner is refused: restore says so
        // before it writes anything.
        assert!(!out.status.success(), "restore as nobody: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("only its owner may set them"),
            "restore as nobody: {out:?}"
        );
        assert_eq!(read_file(&f), appended_bytes, "nothing written");
        assert_eq!(sys::statx_mode(&c).map(|m| m & 0o7777), Ok(0o777));
        assert_eq!(stat(&f).map(|st| st.st_mode & 0o7777), Ok(0o777));

        let out = chronofs_as(m, (0, 0), &["restore", "f", "--at", "setuid"]);
        assert!(out.status.success(), "restore as root: {out:?}");
        assert_eq!(sys::statx_mode(&c).map(|m| m & 0o7777), Ok(0o4777));
    });
}

/// What the stale cached mode would have let through: a set-user-ID root
/// program that an unprivileged user has appended to must not run as
/// root. `id -u` reports the effective user.
/// `PROG -u` as nobody. ETXTBSY is retried: another test thread's fork
/// may briefly hold a copy of the descriptor that wrote PROG (until its
/// child execs), natively as through the mount.
fn run_id_as_nobody(prog: &Path) -> std::io::Result<String> {
    use std::os::unix::process::CommandExt;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = std::process::Command::new(prog)
            .arg("-u")
            .uid(NOBODY)
            .gid(NOBODY)
            .output();
        match out {
            Err(e)
                if e.raw_os_error() == Some(libc::ETXTBSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::yield_now()
            }
            other => return other.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()),
        }
    }
}

#[test]
fn exec_after_unprivileged_write_is_not_setuid() {
    each_mode(|m| {
        m.compare("exec", |d| {
            let prog = d.join("id");
            std::fs::copy("/usr/bin/id", &prog).unwrap();
            let c = cstr(&prog);
            sys::chmod(&c, 0o4755).unwrap();
            let before = run_id_as_nobody(&prog);
            sys::chmod(&c, 0o4777).unwrap();
            let appended = op_in_child(&c, Op::Append, Some((NOBODY, NOBODY)));
            let after = run_id_as_nobody(&prog);
            (format!("{before:?}"), appended, format!("{after:?}"))
        });
    });
}
