//! A union whose upper branch was frozen while mounted (`chronofs
//! snapshot`, or `branch mode ro` under a new top branch): changes to the
//! files it holds land in the branch above it, and the view stays the
//! one a native directory would show. docs/ARCHITECTURE.md "Live unions".

mod common;

use common::*;
use std::fs;
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
