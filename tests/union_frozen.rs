//! A union whose upper branch was frozen while mounted (`chronofs
//! snapshot`, or `branch mode ro` under a new top branch): changes to the
//! files it holds land in the branch above it, and the view stays the
//! one a native directory would show. docs/ARCHITECTURE.md "Live unions".

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn union_modes() -> [&'static str; 2] {
    ["plain", ""]
}

fn snapshot(m: &Mount) {
    let out = chronofs_in(m.root(), &["snapshot", m.mnt.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "snapshot: {}\n{}",
        stderr(&out),
        m.log_tail()
    );
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The mount root is reached through the fresh branch's copy after a
/// snapshot; its frozen copy must still count as below it, or a file of
/// the root moved away keeps showing under its old name.
#[test]
fn a_file_of_the_frozen_root_renamed_away_leaves_its_old_name() {
    for mode in union_modes() {
        let mut m = Mount::union(mode, 1, |_| {});
        for n in ["a", "b", "c"] {
            write_file(&m.p(n), n.as_bytes());
        }
        fs::create_dir(m.p("ndir")).unwrap();
        snapshot(&m);
        fs::rename(m.p("a"), m.p("a2")).unwrap();
        fs::rename(m.p("c"), m.p("ndir/c")).unwrap();
        fs::rename(m.p("b"), m.p("a2")).unwrap();
        assert_eq!(names(&m.mnt), ["a2", "ndir"], "mode {mode:?}");
        assert_eq!(read_file(&m.p("a2")), b"b");
        assert_eq!(names(&m.p("ndir")), ["c"]);
        m.remount();
        assert_eq!(names(&m.mnt), ["a2", "ndir"], "mode {mode:?}: remounted");
        assert_eq!(read_file(&m.p("ndir/c")), b"c");
    }
}

/// How the upper branch gets frozen under a new top branch.
#[derive(Clone, Copy, Debug)]
enum Freeze {
    Snapshot,
    /// `branch add` on top, then `branch mode` of the old upper `ro`.
    AddAndMode,
}

fn freeze(m: &Mount, how: Freeze) {
    match how {
        Freeze::Snapshot => snapshot(m),
        Freeze::AddAndMode => {
            let top = m.root().join("top");
            fs::create_dir(&top).unwrap();
            branch_ok(m, &["add", top.to_str().unwrap()]);
            branch_ok(m, &["mode", m.src.to_str().unwrap(), "ro"]);
        }
    }
}

/// A lower file with a name at the root and one in `c/`, which the
/// upper branch has no copy of until something is made in it.
fn linked_in_two_dirs(b: &[std::path::PathBuf]) {
    fs::create_dir(b[1].join("c")).unwrap();
    write_file(&b[1].join("h1"), b"H\n");
    fs::hard_link(b[1].join("h1"), b[1].join("c/h3")).unwrap();
}

/// A hard link copied up (into the upper branch's index) before that
/// branch froze: a change through a name whose directory the frozen
/// branch lacks copies the frozen entry up. It failed with ESTALE: the
/// copy-up looked for the name's directory in the frozen branch.
#[test]
fn a_hard_link_copied_up_before_a_freeze_changes_through_its_other_names() {
    let cases = [
        ("plain", Freeze::Snapshot),
        ("", Freeze::Snapshot),
        ("", Freeze::AddAndMode),
    ];
    for (mode, how) in cases {
        let mut m = Mount::union(mode, 1, linked_in_two_dirs);
        append_all(&m.p("h1"), b"1\n");
        freeze(&m, how);
        append_all(&m.p("c/h3"), b"3\n");
        fs::set_permissions(m.p("c/h3"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::hard_link(m.p("c/h3"), m.p("h4")).unwrap();
        fs::rename(m.p("c/h3"), m.p("c/h5")).unwrap();
        fs::remove_file(m.p("h4")).unwrap();
        let check = |m: &Mount, when: &str| {
            for n in ["h1", "c/h5"] {
                assert_eq!(
                    read_file(&m.p(n)),
                    b"H\n1\n3\n",
                    "{how:?} {mode:?} {when}: {n}"
                );
                let mode_bits = fs::metadata(m.p(n)).unwrap().permissions().mode();
                assert_eq!(mode_bits & 0o7777, 0o600, "{how:?} {mode:?} {when}: {n}");
            }
            let s = shape(m, &["h1", "c/h5"]);
            assert_eq!(s[0], (6, 2, s[0].2), "{how:?} {mode:?} {when}");
            assert_eq!(s[0], s[1], "{how:?} {mode:?} {when}: one file");
        };
        check(&m, "");
        m.remount();
        check(&m, "remounted");
    }
}

fn snapmerge(m: &Mount) {
    let out = chronofs_in(m.root(), &["snapmerge", m.mnt.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "snapmerge: {}\n{}",
        stderr(&out),
        m.log_tail()
    );
}

/// Each name of `names` reads `want`, and all show one file.
fn one_file(m: &Mount, names: &[&str], want: &[u8], when: &str) {
    for n in names {
        assert_eq!(read_file(&m.p(n)), want, "{when}: {n}");
    }
    let s = shape(m, names);
    assert_eq!(s[0].0, want.len() as u64, "{when}: {s:?}");
    assert!(s.iter().all(|x| *x == s[0]), "{when}: {s:?}");
}

/// Entries made over the branch a snapmerge folds away are named after
/// its objects; once those moved into the branch below, no lookup
/// reached them, and every name showed the older copy: what was written
/// since the last snapshot was lost (a lower file copied up before, and
/// a file linked in the frozen branch itself).
#[test]
fn snapmerge_keeps_what_was_written_to_hard_links_since_the_last_snapshot() {
    for mode in union_modes() {
        let mut m = Mount::union(mode, 1, |b| {
            write_file(&b[1].join("h1"), b"H\n");
            fs::hard_link(b[1].join("h1"), b[1].join("h2")).unwrap();
        });
        append_all(&m.p("h1"), b"1\n");
        snapshot(&m);
        append_all(&m.p("h2"), b"2\n");
        write_file(&m.p("p"), b"p\n");
        fs::hard_link(m.p("p"), m.p("q")).unwrap();
        snapshot(&m);
        append_all(&m.p("h1"), b"3\n");
        append_all(&m.p("q"), b"q\n");
        snapmerge(&m);
        let when = format!("mode {mode:?}: merged");
        one_file(&m, &["h1", "h2"], b"H\n1\n2\n3\n", &when);
        one_file(&m, &["p", "q"], b"p\nq\n", &when);
        append_all(&m.p("h2"), b"4\n");
        m.remount();
        let when = format!("mode {mode:?}: remounted");
        one_file(&m, &["h2", "h1"], b"H\n1\n2\n3\n4\n", &when);
        one_file(&m, &["q", "p"], b"p\nq\n", &when);
    }
}

/// `chronofs sandbox MNT -- sh -c SCRIPT`, run in the mount point, which
/// must succeed.
fn in_sandbox(m: &Mount, script: &str) {
    let mnt = m.mnt.to_str().unwrap();
    let script = format!("cd {mnt} && {script}");
    let out = chronofs_in(m.root(), &["sandbox", mnt, "--", "sh", "-c", &script]);
    assert!(
        out.status.success(),
        "sandbox: {}\n{}",
        stderr(&out),
        m.log_tail()
    );
}

/// A sandbox lies over the mount's branches as a snapshot's fresh branch
/// over the frozen one; its union has ids of its own, and the mount's
/// index names copies by the mount's. Its lookups looked for the mount's
/// copy of a hard-linked file under its own ids and found none: the
/// names not copied up showed the lower file, a change through one made
/// a second copy (what the mount had written to the file was gone), and
/// the commit refused it as a conflict on an internal path.
#[test]
fn a_sandbox_over_a_copied_up_hard_link_changes_the_one_copy() {
    for mode in union_modes() {
        let m = Mount::union(mode, 1, |b| {
            fs::create_dir(b[1].join("c")).unwrap();
            write_file(&b[1].join("h1"), b"H\n");
            fs::hard_link(b[1].join("h1"), b[1].join("h2")).unwrap();
            fs::hard_link(b[1].join("h1"), b[1].join("c/h3")).unwrap();
        });
        append_all(&m.p("h1"), b"0\n");
        let names = ["h1", "h2", "c/h3"];
        let (stats, data) = (m.root().join("stats"), m.root().join("data"));
        in_sandbox(
            &m,
            &format!(
                "echo 1 >> c/h3 && stat -c '%i %s %h' h1 h2 c/h3 > {} && cat h1 h2 c/h3 > {}",
                stats.display(),
                data.display()
            ),
        );
        // One number, 6 bytes and 3 links under each name.
        let stats = String::from_utf8(read_file(&stats)).unwrap();
        let lines: Vec<&str> = stats.lines().collect();
        assert_eq!(lines.len(), 3, "mode {mode:?}: {stats}");
        assert!(
            lines.iter().all(|l| *l == lines[0]),
            "mode {mode:?}: {stats}"
        );
        assert!(lines[0].ends_with(" 6 3"), "mode {mode:?}: {stats}");
        let data = read_file(&data);
        assert_eq!(
            data,
            b"H\n0\n1\n".repeat(3),
            "mode {mode:?}: in the sandbox"
        );
        let mnt = m.mnt.to_str().unwrap();
        let out = chronofs_in(m.root(), &["sandbox", "commit", "1", "--mount", mnt]);
        assert!(
            out.status.success(),
            "mode {mode:?}: commit: {}\n{}",
            stderr(&out),
            m.log_tail()
        );
        one_file(
            &m,
            &names,
            b"H\n0\n1\n",
            &format!("mode {mode:?}: committed"),
        );
        assert_eq!(shape(&m, &names)[0].1, 3, "mode {mode:?}");
    }
}
