//! Who may read the past: a version (or a past listing) is readable only
//! by a caller who may read it both as it was and as it is now (for a
//! deleted object: as it was last); the owner and root keep full access.
//! Every route is checked with a second, unprivileged user: version names
//! (`f;N`), `.history/@T/`, and the CLI's `cat`, `diff` and `restore --to`.

mod common;
use common::*;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const NOBODY_IDS: (u32, u32) = (NOBODY, NOBODY);
const OTHER_IDS: (u32, u32) = (OTHER_USER, OTHER_USER);
const ROOT_IDS: (u32, u32) = (0, 0);

/// Runs `prog args` in `cwd` as `ids` (std drops a root parent's
/// supplementary groups when it sets the uid).
fn run_as(cwd: &Path, ids: (u32, u32), prog: &Path, args: &[&str]) -> Output {
    Command::new(prog)
        .args(args)
        .current_dir(cwd)
        .env("TZ", "UTC")
        .uid(ids.0)
        .gid(ids.1)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", prog.display()))
}

fn chronofs_as(m: &Mount, ids: (u32, u32), args: &[&str]) -> Output {
    run_as(&m.mnt, ids, &bin(), args)
}

fn show(o: &Output) -> String {
    format!(
        "status {}, stdout {:?}, stderr {:?}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `cat` of a path under the mount as `ids`.
fn cat_as(m: &Mount, ids: (u32, u32), rel: &str) -> Output {
    run_as(&m.mnt, ids, Path::new("/bin/cat"), &[rel])
}

fn ls_as(m: &Mount, ids: (u32, u32), rel: &str) -> Output {
    run_as(&m.mnt, ids, Path::new("/bin/ls"), &[rel])
}

fn assert_denied(what: &str, o: &Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.to_lowercase().contains("permission denied"),
        "{what}: expected permission denied, got {}",
        show(o)
    );
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("secret"),
        "{what}: leaked {}",
        show(o)
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{what}: one line: {}",
        show(o)
    );
}

fn assert_reads(what: &str, o: &Output, want: &str) {
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(want),
        "{what}: expected {want:?}, got {}",
        show(o)
    );
}

/// `diff` exits 1 when it finds differences, as diff(1) does.
fn assert_differs(what: &str, o: &Output, want: &str) {
    assert!(
        o.status.code() == Some(1) && String::from_utf8_lossy(&o.stdout).contains(want),
        "{what}: expected differences with {want:?}, got {}",
        show(o)
    );
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn tag(m: &Mount, name: &str) {
    let o = chronofs_as(m, ROOT_IDS, &["tag", name]);
    assert!(o.status.success(), "tag {name}: {}", show(&o));
}

/// A directory anyone may write into, for `restore --to`.
fn drop_box() -> tempfile::TempDir {
    let d = tempdir();
    chmod(d.path(), 0o1777);
    d
}

#[test]
fn a_file_made_private_keeps_its_past_private() {
    each_versioning_mode(|m| {
        // Written while world-readable, then made private: the pattern of
        // `echo secret > f; chmod 600 f`.
        write_file(&m.p("f"), b"secret one\n");
        chmod(&m.p("f"), 0o644);
        write_file(&m.p("pub"), b"public one\n");
        chmod(&m.p("pub"), 0o644);
        // Owned by the second user, made private by its owner's wish.
        write_file(&m.p("theirs"), b"secret theirs\n");
        chmod(&m.p("theirs"), 0o644);
        sys::chown(&cstr(m.p("theirs")), OTHER_USER, OTHER_USER).unwrap();
        tag(m, "a");
        write_file(&m.p("f"), b"secret two\n");
        write_file(&m.p("pub"), b"public two\n");
        tag(m, "b");
        chmod(&m.p("f"), 0o600);
        chmod(&m.p("theirs"), 0o600);

        // The second user, by every route.
        let o = cat_as(m, NOBODY_IDS, "f;1");
        assert_denied("cat f;1", &o);
        let o = cat_as(m, NOBODY_IDS, ".history/@a/f");
        assert_denied("cat .history/@a/f", &o);
        let o = cat_as(m, NOBODY_IDS, ".history/@b/f");
        assert_denied("cat .history/@b/f", &o);
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--version", "1", "f"]);
        assert_denied("chronofs cat --version 1 f", &o);
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", "f"]);
        assert_denied("chronofs cat --at a f", &o);
        let o = chronofs_as(m, NOBODY_IDS, &["diff", "f", "a", "b"]);
        assert_denied("chronofs diff f a b", &o);
        let dest = drop_box();
        let to = dest.path().join("f");
        let o = chronofs_as(
            m,
            NOBODY_IDS,
            &["restore", "f", "--at", "a", "--to", to.to_str().unwrap()],
        );
        assert_denied("chronofs restore f --at a --to", &o);
        assert!(
            !to.exists(),
            "a refused restore --to still created its destination"
        );
        let o = cat_as(m, NOBODY_IDS, "theirs;1");
        assert_denied("cat theirs;1", &o);

        // A file that stayed public: its past stays readable to them (the
        // rule does not deny everything).
        assert_reads("cat pub;1", &cat_as(m, NOBODY_IDS, "pub;1"), "public one");
        assert_reads(
            "cat .history/@a/pub",
            &cat_as(m, NOBODY_IDS, ".history/@a/pub"),
            "public one",
        );
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--version", "1", "pub"]);
        assert_reads("chronofs cat --version 1 pub", &o, "public one");
        let o = chronofs_as(m, NOBODY_IDS, &["diff", "pub", "a", "b"]);
        assert_differs("chronofs diff pub a b", &o, "public two");
        let to = dest.path().join("pub");
        let o = chronofs_as(
            m,
            NOBODY_IDS,
            &["restore", "pub", "--at", "a", "--to", to.to_str().unwrap()],
        );
        assert!(o.status.success(), "restore pub --to: {}", show(&o));
        assert_eq!(fs::read(&to).unwrap(), b"public one\n");

        // The owner keeps full access to their file's past.
        let o = cat_as(m, OTHER_IDS, "theirs;1");
        assert_reads("owner: cat theirs;1", &o, "secret theirs");
        let o = cat_as(m, OTHER_IDS, ".history/@a/theirs");
        assert_reads("owner: cat .history/@a/theirs", &o, "secret theirs");
        let o = chronofs_as(m, OTHER_IDS, &["cat", "--version", "1", "theirs"]);
        assert_reads("owner: chronofs cat theirs", &o, "secret theirs");
        let o = chronofs_as(m, OTHER_IDS, &["cat", "--version", "1", "f"]);
        assert_denied("other user: chronofs cat --version 1 f", &o);

        // Root too.
        assert_reads("root: cat f;1", &cat_as(m, ROOT_IDS, "f;1"), "secret one");
        assert_reads(
            "root: cat .history/@a/f",
            &cat_as(m, ROOT_IDS, ".history/@a/f"),
            "secret one",
        );
        let o = chronofs_as(m, ROOT_IDS, &["cat", "--version", "1", "f"]);
        assert_reads("root: chronofs cat f", &o, "secret one");
        let o = chronofs_as(m, ROOT_IDS, &["diff", "f", "a", "b"]);
        assert_differs("root: chronofs diff f", &o, "secret two");
    });
}

#[test]
fn a_directory_made_private_keeps_its_past_listing_and_files_private() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("d")).unwrap();
        chmod(&m.p("d"), 0o755);
        write_file(&m.p("d/secret-name"), b"secret in d\n");
        chmod(&m.p("d/secret-name"), 0o644);
        fs::create_dir(m.p("open")).unwrap();
        chmod(&m.p("open"), 0o755);
        write_file(&m.p("open/visible-name"), b"public in open\n");
        chmod(&m.p("open/visible-name"), 0o644);
        tag(m, "a");
        chmod(&m.p("d"), 0o700);

        let o = ls_as(m, NOBODY_IDS, ".history/@a/d/");
        assert_denied("ls .history/@a/d/", &o);
        assert!(!String::from_utf8_lossy(&o.stdout).contains("secret-name"));
        let o = chronofs_as(m, NOBODY_IDS, &["ls", "--at", "a", "d"]);
        assert_denied("chronofs ls --at a d", &o);
        // Its files stay world-readable, but the way to them is closed
        // now (`chmod 700 ~`): their past is closed too.
        let o = cat_as(m, NOBODY_IDS, ".history/@a/d/secret-name");
        assert_denied("cat .history/@a/d/secret-name", &o);
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", "d/secret-name"]);
        assert_denied("chronofs cat --at a d/secret-name", &o);
        let o = cat_as(m, NOBODY_IDS, ".history/@a/open/visible-name");
        assert_reads(".history/@a/open/visible-name", &o, "public in open");
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", "open/visible-name"]);
        assert_reads(
            "chronofs cat --at a open/visible-name",
            &o,
            "public in open",
        );

        let o = ls_as(m, NOBODY_IDS, ".history/@a/open/");
        assert_reads("ls .history/@a/open/", &o, "visible-name");
        let o = ls_as(m, NOBODY_IDS, ".history/@a/");
        assert_reads("ls .history/@a/", &o, "open");
        let o = ls_as(m, ROOT_IDS, ".history/@a/d/");
        assert_reads("root: ls .history/@a/d/", &o, "secret-name");
        let o = cat_as(m, ROOT_IDS, ".history/@a/d/secret-name");
        assert_reads("root: cat .history/@a/d/secret-name", &o, "secret in d");

        // A tree diff goes on past the closed directory, as diff -r does:
        // what the caller may read is compared, the rest said on stderr,
        // exit 2 (it was refused whole).
        write_file(&m.p("d/secret-name"), b"secret two\n");
        write_file(&m.p("open/visible-name"), b"public two\n");
        let o = chronofs_as(m, NOBODY_IDS, &["diff", ".", "@a"]);
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert_eq!(o.status.code(), Some(2), "{}", show(&o));
        assert!(out.contains("+public two"), "{}", show(&o));
        assert!(!out.contains("secret"), "leaked: {}", show(&o));
        assert!(err.contains("permission denied"), "{}", show(&o));
        let o = chronofs_as(m, ROOT_IDS, &["diff", ".", "@a"]);
        assert_differs("root: chronofs diff . @a", &o, "+secret two");
    });
}

/// Runs `prog args` in the mount as nobody with `groups` as its
/// supplementary groups (std's Command cannot set them on stable).
fn as_nobody_in(m: &Mount, groups: &str, prog: &Path, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            &format!("--groups={groups}"),
            "--",
        ])
        .arg(prog)
        .args(args)
        .current_dir(&m.mnt)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv (util-linux) is needed")
}

/// ACLs, supplementary groups and deleted files: the same arithmetic as
/// the kernel's, on the state then and now.
#[test]
fn acls_groups_and_deleted_files_decide_as_natively() {
    each_versioning_mode(|m| {
        // Readable by nobody through a named-user ACL entry, then that
        // entry is removed.
        write_file(&m.p("acl"), b"secret acl\n");
        chmod(&m.p("acl"), 0o600);
        run(&m.mnt, "setfacl", &["-m", &format!("u:{NOBODY}:r"), "acl"]);
        // Keeps its ACL entry: stays readable to nobody.
        write_file(&m.p("acl-kept"), b"public acl\n");
        chmod(&m.p("acl-kept"), 0o600);
        run(
            &m.mnt,
            "setfacl",
            &["-m", &format!("u:{NOBODY}:r"), "acl-kept"],
        );
        // Readable to members of OTHER_USER's group.
        write_file(&m.p("grp"), b"group data\n");
        chmod(&m.p("grp"), 0o640);
        sys::chown(&cstr(m.p("grp")), 0, OTHER_USER).unwrap();
        // World-readable, made private, then deleted.
        write_file(&m.p("gone"), b"secret gone\n");
        chmod(&m.p("gone"), 0o644);
        tag(m, "a");
        run(&m.mnt, "setfacl", &["-x", &format!("u:{NOBODY}"), "acl"]);
        chmod(&m.p("gone"), 0o600);
        fs::remove_file(m.p("gone")).unwrap();

        assert_denied(".history/@a/acl", &cat_as(m, NOBODY_IDS, ".history/@a/acl"));
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", "acl"]);
        assert_denied("chronofs cat --at a acl", &o);
        let o = cat_as(m, NOBODY_IDS, ".history/@a/acl-kept");
        assert_reads(".history/@a/acl-kept", &o, "public acl");
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", "acl-kept"]);
        assert_reads("chronofs cat --at a acl-kept", &o, "public acl");

        let cat = Path::new("/bin/cat");
        let member = OTHER_USER.to_string();
        let o = as_nobody_in(m, &member, cat, &[".history/@a/grp"]);
        assert_reads("member: .history/@a/grp", &o, "group data");
        let o = as_nobody_in(m, &member, &bin(), &["cat", "--at", "a", "grp"]);
        assert_reads("member: chronofs cat --at a grp", &o, "group data");
        assert_denied(
            "non-member: .history/@a/grp",
            &cat_as(m, NOBODY_IDS, ".history/@a/grp"),
        );
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", "grp"]);
        assert_denied("non-member: chronofs cat --at a grp", &o);

        // Deleted: as it was last recorded (private).
        assert_denied(
            ".history/@a/gone",
            &cat_as(m, NOBODY_IDS, ".history/@a/gone"),
        );
        assert_denied("gone;1", &cat_as(m, NOBODY_IDS, "gone;1"));
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", "gone"]);
        assert_denied("chronofs cat --at a gone", &o);
        let o = cat_as(m, ROOT_IDS, ".history/@a/gone");
        assert_reads("root: .history/@a/gone", &o, "secret gone");
    });
}

/// The ways that reached past the rule (a review's findings): files
/// history never recorded by name below a directory closed since; a
/// version from before a rename out of a directory closed then; a file
/// root gave to another user since; a user attribute of a file made
/// private.
#[test]
fn closed_ways_renames_new_owners_and_user_attributes_keep_the_past_closed() {
    // home/alice/docs/x is in the directory before the mount and never
    // changed: history knows no name for it, only for home/alice once
    // alice closes it.
    let before_mount = |src: &Path| {
        for d in ["home", "home/alice", "home/alice/docs", "open", "open/sub"] {
            fs::create_dir(src.join(d)).unwrap();
            chmod(&src.join(d), 0o755);
        }
        write_file(&src.join("home/alice/docs/x"), b"secret x\n");
        chmod(&src.join("home/alice/docs/x"), 0o644);
        write_file(&src.join("open/sub/y"), b"public y\n");
        chmod(&src.join("open/sub/y"), 0o644);
    };
    each_versioning_mode_with(before_mount, |m| {
        // A file that lived in a private directory, moved out since.
        fs::create_dir(m.p("private")).unwrap();
        chmod(&m.p("private"), 0o700);
        fs::create_dir(m.p("pub")).unwrap();
        chmod(&m.p("pub"), 0o755);
        write_file(&m.p("private/s"), b"secret s\n");
        chmod(&m.p("private/s"), 0o644);
        // A private file of another user's, given to nobody later.
        write_file(&m.p("given"), b"secret given\n");
        chmod(&m.p("given"), 0o600);
        sys::chown(&cstr(m.p("given")), OTHER_USER, OTHER_USER).unwrap();
        // A user attribute, then the file made private.
        write_file(&m.p("pinned"), b"public pinned\n");
        chmod(&m.p("pinned"), 0o644);
        run(
            &m.mnt,
            "setfattr",
            &["-n", "user.pin", "-v", "secret-pin", "pinned"],
        );
        tag(m, "a");
        chmod(&m.p("home/alice"), 0o700);
        fs::rename(m.p("private/s"), m.p("pub/s")).unwrap();
        write_file(&m.p("pub/s"), b"public s now\n");
        chmod(&m.p("pub/s"), 0o644);
        write_file(&m.p("given"), b"given now\n");
        sys::chown(&cstr(m.p("given")), NOBODY, NOBODY).unwrap();
        chmod(&m.p("pinned"), 0o600);

        let x = "home/alice/docs/x";
        let o = cat_as(m, NOBODY_IDS, &format!(".history/@a/{x}"));
        assert_denied(".history/@a/home/alice/docs/x", &o);
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", x]);
        assert_denied("chronofs cat --at a home/alice/docs/x", &o);
        let o = cat_as(m, ROOT_IDS, &format!(".history/@a/{x}"));
        assert_reads("root: .history/@a/home/alice/docs/x", &o, "secret x");
        let o = cat_as(m, NOBODY_IDS, ".history/@a/open/sub/y");
        assert_reads(".history/@a/open/sub/y", &o, "public y");
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", "open/sub/y"]);
        assert_reads("chronofs cat --at a open/sub/y", &o, "public y");

        assert_denied("cat pub/s;1", &cat_as(m, NOBODY_IDS, "pub/s;1"));
        // Nor does its log tell of its versions there: names, sizes, times.
        for args in [&["log", "pub/s"][..], &["log", "-r", "pub"][..]] {
            let o = chronofs_as(m, NOBODY_IDS, args);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "{args:?}: {}", show(&o));
            assert!(!out.contains("private"), "{args:?} told of private/: {out}");
            assert!(
                out.contains("13 B") || out.contains("13"),
                "{args:?}: {out}"
            );
            let root = chronofs_as(m, ROOT_IDS, args);
            assert!(
                String::from_utf8_lossy(&root.stdout).lines().count() > out.lines().count(),
                "{args:?}: root sees the versions in private/"
            );
        }
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--version", "1", "pub/s"]);
        assert_denied("chronofs cat --version 1 pub/s", &o);
        assert_reads("cat pub/s", &cat_as(m, NOBODY_IDS, "pub/s"), "public s now");
        assert_reads(
            "root: cat pub/s;1",
            &cat_as(m, ROOT_IDS, "pub/s;1"),
            "secret s",
        );

        assert_denied("cat given;@a", &cat_as(m, NOBODY_IDS, "given;@a"));
        let o = cat_as(m, NOBODY_IDS, ".history/@a/given");
        assert_denied("cat .history/@a/given", &o);
        let o = chronofs_as(m, NOBODY_IDS, &["cat", "--at", "a", "given"]);
        assert_denied("chronofs cat --at a given", &o);
        assert_reads(
            "new owner: cat given",
            &cat_as(m, NOBODY_IDS, "given"),
            "given now",
        );

        let getfattr = Path::new("/usr/bin/getfattr");
        let args = ["--only-values", "-n", "user.pin", ".history/@a/pinned"];
        let o = run_as(&m.mnt, NOBODY_IDS, getfattr, &args);
        assert_denied("getfattr user.pin of .history/@a/pinned", &o);
        let o = run_as(&m.mnt, ROOT_IDS, getfattr, &args);
        assert_reads("root: getfattr user.pin", &o, "secret-pin");
    });
}

/// A directory that lived in a private one and moved out: the files in
/// its past stay closed by its own version name (`proj;@a/notes`, where
/// the kernel searched only the live way to `proj`), also once someone
/// reached the same past node through `.history/@a/` (the inode is
/// shared, whoever came first).
#[test]
fn a_directory_moved_out_of_a_private_one_keeps_its_past_closed_by_every_name() {
    each_versioning_mode(|m| {
        for (d, mode) in [("priv", 0o700), ("pub", 0o755), ("priv/proj", 0o755)] {
            fs::create_dir(m.p(d)).unwrap();
            chmod(&m.p(d), mode);
        }
        write_file(&m.p("priv/proj/notes"), b"secret notes\n");
        chmod(&m.p("priv/proj/notes"), 0o644);
        tag(m, "a");
        write_file(&m.p("priv/proj/notes"), b"public notes\n");
        fs::rename(m.p("priv/proj"), m.p("pub/proj")).unwrap();

        let past = "pub/proj;@a/notes";
        assert_denied(past, &cat_as(m, NOBODY_IDS, past));
        assert_reads(
            "cat pub/proj/notes",
            &cat_as(m, NOBODY_IDS, "pub/proj/notes"),
            "public",
        );
        let o = cat_as(m, ROOT_IDS, ".history/@a/priv/proj/notes");
        assert_reads("root: .history/@a/priv/proj/notes", &o, "secret notes");
        assert_denied(past, &cat_as(m, NOBODY_IDS, past));
        assert_reads(
            "root: pub/proj;@a/notes",
            &cat_as(m, ROOT_IDS, past),
            "secret notes",
        );
    });
}

/// A version recorded while its file had a second name in a closed
/// directory stays readable by its open name: any way the caller could
/// search then will do (the check took the name linked last).
#[test]
fn a_hard_link_in_a_closed_directory_closes_no_other_name() {
    each_versioning_mode(|m| {
        for (d, mode) in [("pub", 0o755), ("keep", 0o700)] {
            fs::create_dir(m.p(d)).unwrap();
            chmod(&m.p(d), mode);
        }
        write_file(&m.p("pub/f"), b"public f\n");
        chmod(&m.p("pub/f"), 0o644);
        fs::hard_link(m.p("pub/f"), m.p("keep/f")).unwrap();
        write_file(&m.p("pub/f"), b"public f, again\n");
        tag(m, "a");
        // (While the closed name lives on, the file as it is now lies in
        // a closed directory too, which this check does not cover yet.)
        fs::remove_file(m.p("keep/f")).unwrap();
        let o = cat_as(m, NOBODY_IDS, ".history/@a/pub/f");
        assert_reads(".history/@a/pub/f", &o, "public f, again");
        assert_reads("pub/f;1", &cat_as(m, NOBODY_IDS, "pub/f;1"), "public f");
        let o = chronofs_as(m, NOBODY_IDS, &["log", "pub/f"]);
        assert!(o.status.success(), "{}", show(&o));
        let root = chronofs_as(m, ROOT_IDS, &["log", "pub/f"]);
        assert_eq!(o.stdout, root.stdout, "log rows left out");
    });
}

/// The control socket's tree and listing routes need what `stat` and
/// `ls -l` need: `restore --to` of a symlink in a directory closed to the
/// caller does not hand over its target, and `ls --at` of a directory
/// the caller may read but not search shows no entry's attributes.
#[test]
fn tree_and_listing_requests_need_the_search_stat_needs() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("priv")).unwrap();
        chmod(&m.p("priv"), 0o700);
        std::os::unix::fs::symlink("secret-target", m.p("priv/key")).unwrap();
        fs::create_dir(m.p("noexec")).unwrap();
        write_file(&m.p("noexec/f"), b"secret size\n");
        chmod(&m.p("noexec"), 0o744);
        tag(m, "a");

        let dest = drop_box();
        let to = dest.path().join("k");
        let o = chronofs_as(
            m,
            NOBODY_IDS,
            &[
                "restore",
                "priv/key",
                "--at",
                "a",
                "--to",
                to.to_str().unwrap(),
            ],
        );
        assert_denied("restore priv/key --to", &o);
        assert!(fs::symlink_metadata(&to).is_err(), "the link was made");
        let o = chronofs_as(m, NOBODY_IDS, &["ls", "--at", "a", "noexec"]);
        assert_denied("ls --at a noexec", &o);
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains('f'),
            "{}",
            show(&o)
        );
        let o = chronofs_as(m, ROOT_IDS, &["ls", "--at", "a", "noexec"]);
        assert_reads("root: ls --at a noexec", &o, "f");
    });
}

/// The metadata routes keep the rule too: `log` of a path below a
/// directory closed to the caller is refused, and `log -r` above it shows
/// nothing of what lies in it (names included), as `ls -R` would not.
#[test]
fn log_shows_nothing_below_a_directory_closed_to_the_caller() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("shut")).unwrap();
        write_file(&m.p("shut/secret-name"), b"x\n");
        write_file(&m.p("shut/secret-name"), b"y\n");
        chmod(&m.p("shut"), 0o700);
        write_file(&m.p("open-name"), b"z\n");
        chmod(&m.p("open-name"), 0o644);

        let o = chronofs_as(m, NOBODY_IDS, &["log", "shut/secret-name"]);
        assert_denied("chronofs log shut/secret-name", &o);
        let o = chronofs_as(m, NOBODY_IDS, &["log", "-r", "."]);
        assert_reads("chronofs log -r .", &o, "open-name");
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("secret-name"),
            "log -r showed a name inside a closed directory: {}",
            show(&o)
        );
        let o = chronofs_as(m, ROOT_IDS, &["log", "-r", "."]);
        assert_reads("root: chronofs log -r .", &o, "secret-name");
    });
}

/// A view is read as a `nosuid,nodev` mount is: a set-user-ID program
/// whose bit was taken away (or which was deleted) gives no privilege
/// from the past, and a device node made private now opens for root
/// only; a symlink's target is read only along a way open now, however
/// the kernel cached it.
#[test]
fn the_past_gives_no_set_id_no_device_and_no_link_behind_a_closed_way() {
    each_versioning_mode(|m| {
        fs::copy("/usr/bin/id", m.p("id")).unwrap();
        chmod(&m.p("id"), 0o4755);
        fs::create_dir(m.p("d")).unwrap();
        chmod(&m.p("d"), 0o755);
        std::os::unix::fs::symlink("old-secret", m.p("d/sl")).unwrap();
        let made = Command::new("mknod")
            .args([m.p("z").to_str().unwrap(), "c", "1", "5"])
            .status()
            .unwrap();
        assert!(made.success());
        chmod(&m.p("z"), 0o666);
        // cap_setuid+ep (a version 2 capability set), and an ACL on the node.
        let mut cap = vec![0x01, 0, 0, 0x02, 1 << 7, 0, 0, 0];
        cap.resize(20, 0);
        set_xattr(&m.p("id"), "security.capability", &cap);
        let acl = Command::new("setfacl")
            .args(["-m", "u:65534:rw", m.p("z").to_str().unwrap()])
            .status()
            .unwrap();
        assert!(acl.success());
        tag(m, "a");
        chmod(&m.p("id"), 0o755);
        chmod(&m.p("z"), 0o600);
        chmod(&m.p("d"), 0o700);

        use std::os::unix::fs::MetadataExt;
        for p in [".history/@a/id", "id;1"] {
            let mode = fs::metadata(m.p(p)).unwrap().mode();
            assert_eq!(mode & 0o7777, 0o755, "{p}: shown without set-ID bits");
            let o = run_as(&m.mnt, NOBODY_IDS, &m.p(p), &["-u"]);
            assert_reads(p, &o, &NOBODY.to_string());
        }
        for p in [".history/@a/id", ".history/@a/z"] {
            let names = xattr_names(&m.p(p));
            let kept = ["security.capability", "system.posix_acl_access"];
            assert!(
                !names.iter().any(|n| kept.contains(&n.as_str())),
                "{p}: {names:?}"
            );
        }
        for p in [".history/@a/z", "z;1"] {
            let o = run_as(&m.mnt, NOBODY_IDS, Path::new("/usr/bin/head"), &["-c4", p]);
            assert!(!o.status.success(), "{p}: {}", show(&o));
            let o = run_as(&m.mnt, ROOT_IDS, Path::new("/usr/bin/head"), &["-c4", p]);
            assert_eq!(o.stdout, [0u8; 4], "root: {p}: {}", show(&o));
        }
        let link = ".history/@a/d/sl";
        let readlink = |ids| run_as(&m.mnt, ids, Path::new("/usr/bin/readlink"), &[link]);
        let o = readlink(NOBODY_IDS);
        assert!(!o.status.success() && o.stdout.is_empty(), "{}", show(&o));
        // Read (and cached by the kernel) for root, still closed to nobody.
        assert_reads("root: readlink", &readlink(ROOT_IDS), "old-secret");
        let o = readlink(NOBODY_IDS);
        assert!(!o.status.success() && o.stdout.is_empty(), "{}", show(&o));
    });
}

/// A file readable then but private now is as private in a diff: left
/// out on both sides, named as unreadable, exit 2, in both forms, even
/// where its sizes alone would say it changed.
#[test]
fn diff_leaves_out_a_file_made_private_since() {
    each_versioning_mode(|m| {
        write_file(&m.p("s"), b"secret\n");
        chmod(&m.p("s"), 0o644);
        write_file(&m.p("pub"), b"one\n");
        chmod(&m.p("pub"), 0o644);
        tag(m, "a");
        write_file(&m.p("s"), b"secret, longer now\n");
        chmod(&m.p("s"), 0o600);
        write_file(&m.p("pub"), b"two\n");
        for json in [true, false] {
            let mut args = vec!["diff", ".", "@a"];
            if json {
                args.push("--json");
            }
            let o = chronofs_as(m, NOBODY_IDS, &args);
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(o.status.code(), Some(2), "json {json}: {}", show(&o));
            assert!(out.contains("pub"), "json {json}: {}", show(&o));
            let named = match json {
                true => out.contains("\"path\": \"/s\""),
                false => out.contains("/s"),
            };
            assert!(!named, "json {json}: {}", show(&o));
            if json {
                assert!(out.contains("\"unreadable\""), "{}", show(&o));
            }
        }
        let o = chronofs_as(m, ROOT_IDS, &["diff", ".", "@a", "--json"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("\"path\": \"/s\""), "{}", show(&o));
    });
}

/// A file whose way was closed at A is unreadable there, not absent: a
/// diff names it on stderr and exits 2, as diff(1) on a file it may not
/// open, whether one side or both are refused (found by a bug hunt: it
/// was reported "added", exit 1, or "existed at neither instant"; test
/// fails with the build before).
#[test]
fn diff_of_a_file_closed_then_is_unreadable_not_added() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("d")).unwrap();
        write_file(&m.p("d/f"), b"old\n");
        chmod(&m.p("d/f"), 0o644);
        chmod(&m.p("d"), 0o700);
        tag(m, "a");
        chmod(&m.p("d"), 0o755);
        write_file(&m.p("d/f"), b"new\n");
        for (args, json) in [
            (vec!["diff", "d/f", "@a"], false),
            (vec!["diff", "d/f", "@a", "--json"], true),
            (vec!["diff", "d/f", "@a", "@a"], false),
        ] {
            let o = chronofs_as(m, NOBODY_IDS, &args);
            let (out, err) = (
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr),
            );
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", show(&o));
            assert!(!out.contains("added"), "{args:?}: {}", show(&o));
            assert!(
                err.to_lowercase().contains("permission denied"),
                "{args:?}: {}",
                show(&o)
            );
            if json {
                assert!(out.contains("\"unreadable\""), "{}", show(&o));
            }
        }
    });
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-ended strings and a buffer valid for its length.
    let rc = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
}

/// Without `allow_other` the kernel lets only root and the mounting user
/// use the mount, and the history commands refuse the others too, in one
/// line (found by a bug hunt: `chronofs cat --at now` showed a file the
/// mount refused).
#[test]
fn without_allow_other_history_refuses_other_users() {
    let m = Mount::new("noallow_other");
    fs::write(m.mnt.join("f"), "secret\n").unwrap();
    let here = Path::new("/");
    let f = m.mnt.join("f");
    let (f, mnt) = (f.to_str().unwrap(), m.mnt.to_str().unwrap());
    assert_denied(
        "cat f",
        &run_as(here, NOBODY_IDS, Path::new("/bin/cat"), &[f]),
    );
    for args in [
        &["cat", f, "--at", "now"][..],
        &["ls", mnt],
        &["log", f],
        &["status", mnt],
    ] {
        let o = run_as(here, NOBODY_IDS, &bin(), args);
        assert_denied(&format!("chronofs {args:?}"), &o);
    }
    let o = run_as(here, ROOT_IDS, &bin(), &["cat", f, "--at", "now"]);
    assert_reads("root's cat --at now", &o, "secret");
}

/// A path in the source directory, whose store only root may read: the
/// user is told so, not that there is no store (found by a bug hunt).
#[test]
fn a_store_closed_to_the_caller_is_named_as_such() {
    let m = Mount::new(&first_mode());
    if m.mnt == m.src {
        return; // MNT = SRC: a path in SRC is the mount's, answered by its daemon
    }
    fs::write(m.mnt.join("f"), "x\n").unwrap();
    let f = m.src.join("f");
    let o = run_as(
        Path::new("/"),
        NOBODY_IDS,
        &bin(),
        &["log", f.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains(".chronofs: permission denied"),
        "{}",
        show(&o)
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{}", show(&o));
}

fn stat_as(m: &Mount, ids: (u32, u32), rel: &str) -> Output {
    run_as(
        &m.mnt,
        ids,
        Path::new("/usr/bin/stat"),
        &["-c", "%n %s %u", rel],
    )
}

/// Natively, `chmod 700 d` hides what `d` holds from stat(2) too: EACCES
/// for a name that exists and for one that does not. A lookup in a view
/// of `d` needs search on `d` then and now, whoever reached the entry
/// first (the kernel shares its cached entries among callers), and a
/// readdirplus of the view gives others nothing to stat either.
#[test]
fn a_directory_closed_since_hides_names_and_attributes_from_lookups() {
    each_versioning_mode(|m| {
        for d in ["d", "open"] {
            fs::create_dir(m.p(d)).unwrap();
            chmod(&m.p(d), 0o755);
        }
        write_file(&m.p("d/salary-name"), b"twelve bytes\n");
        chmod(&m.p("d/salary-name"), 0o644);
        std::os::unix::fs::symlink("secret-target", m.p("d/link")).unwrap();
        write_file(&m.p("open/visible-name"), b"public\n");
        tag(m, "a");
        chmod(&m.p("d"), 0o700);

        let paths = [
            ".history/@a/d/salary-name",
            ".history/@a/d/link",
            ".history/@a/d/guessed-name",
            "d;@a/salary-name",
            "d;@a/guessed-name",
        ];
        for p in paths {
            assert_denied(p, &stat_as(m, NOBODY_IDS, p));
        }
        // What root looked up and listed is not handed to others.
        for p in &paths[..2] {
            assert_reads(p, &stat_as(m, ROOT_IDS, p), p);
        }
        let o = run_as(
            &m.mnt,
            ROOT_IDS,
            Path::new("/bin/ls"),
            &["-l", ".history/@a/d"],
        );
        assert_reads("root: ls -l .history/@a/d", &o, "salary-name");
        for p in &paths[..2] {
            assert_denied(p, &stat_as(m, NOBODY_IDS, p));
        }
        let p = ".history/@a/open/visible-name";
        assert_reads(p, &stat_as(m, NOBODY_IDS, p), "visible-name");
        let o = chronofs_as(m, NOBODY_IDS, &["log", "d/salary-name"]);
        assert_denied("chronofs log d/salary-name", &o);
    });
}

/// The names of files made and deleted while their directory was private
/// were never another user's to learn: `;deleted` and `ls --deleted`
/// leave them out after the directory is opened (as `log -r` does),
/// and a name deleted while it was open is still shown.
#[test]
fn deleted_names_from_a_directory_private_then_stay_hidden() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("d")).unwrap();
        chmod(&m.p("d"), 0o700);
        write_file(&m.p("d/secret-name"), b"s\n");
        fs::create_dir(m.p("d/secret-tree")).unwrap();
        write_file(&m.p("d/secret-tree/plan"), b"x\n");
        fs::remove_file(m.p("d/secret-name")).unwrap();
        fs::remove_dir_all(m.p("d/secret-tree")).unwrap();
        chmod(&m.p("d"), 0o755);
        write_file(&m.p("d/later-name"), b"l\n");
        chmod(&m.p("d/later-name"), 0o644);
        fs::remove_file(m.p("d/later-name")).unwrap();

        let o = ls_as(m, NOBODY_IDS, "d/;deleted");
        assert_reads("ls d/;deleted", &o, "later-name");
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("secret"),
            "{}",
            show(&o)
        );
        for p in ["d/;deleted/secret-name", "d/;deleted/secret-tree"] {
            let o = stat_as(m, NOBODY_IDS, p);
            assert!(!o.status.success(), "{p}: {}", show(&o));
        }
        let o = chronofs_as(m, NOBODY_IDS, &["ls", "d", "--deleted"]);
        assert_reads("chronofs ls d --deleted", &o, "later-name");
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("secret"),
            "{}",
            show(&o)
        );
        let o = ls_as(m, ROOT_IDS, "d/;deleted");
        assert_reads("root: ls d/;deleted", &o, "secret-tree");
        // Root's lookup is not handed to others.
        let p = "d/;deleted/secret-name";
        assert_reads(p, &stat_as(m, ROOT_IDS, p), "secret-name");
        assert!(!stat_as(m, NOBODY_IDS, p).status.success());
        let o = chronofs_as(m, ROOT_IDS, &["ls", "d", "--deleted"]);
        assert_reads("root: chronofs ls d --deleted", &o, "secret-name");
    });
}

/// A user's own file named like a staging directory is an ordinary
/// deleted file: `;deleted` and `ls --deleted` show it, as undelete
/// finds it.
#[test]
fn a_deleted_file_named_like_staging_is_listed() {
    each_versioning_mode(|m| {
        fs::create_dir(m.p("t")).unwrap();
        write_file(&m.p("t/.chronofs-staging-notes"), b"precious\n");
        fs::remove_file(m.p("t/.chronofs-staging-notes")).unwrap();
        let o = run_as(
            &m.mnt,
            ROOT_IDS,
            Path::new("/bin/ls"),
            &["-a", "t/;deleted"],
        );
        assert_reads("ls -a t/;deleted", &o, ".chronofs-staging-notes");
        let o = chronofs_as(m, ROOT_IDS, &["ls", "t", "--deleted"]);
        assert_reads("chronofs ls t --deleted", &o, ".chronofs-staging-notes");
    });
}
