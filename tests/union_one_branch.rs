//! A union of one read-write branch (`SRC=rw`): its removes and renames
//! take the single-directory mount's path (issue 16's one-branch target),
//! yet it stays a union: whiteouts and directories holding only whiteouts
//! are what the user does not see, and objects keep their names for a
//! later branch change. docs/ARCHITECTURE.md "Union mounts".

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn is_whiteout(p: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

fn make_whiteout(p: &Path) {
    sys::mknod(&cstr(p), libc::S_IFCHR | 0o600, 0).unwrap();
}

fn rename2(a: &Path, b: &Path, flags: u32) -> Result<(), Errno> {
    sys::renameat2(&cstr(a), &cstr(b), flags)
}

#[test]
fn a_one_branch_union_hides_whiteouts_through_renames_and_removes() {
    for mode in ["plain", ""] {
        let m = Mount::one_branch_union(mode, |src| {
            make_whiteout(&src.join("gone"));
            fs::create_dir(src.join("hollow")).unwrap();
            make_whiteout(&src.join("hollow/w"));
            fs::create_dir(src.join("hollow2")).unwrap();
            make_whiteout(&src.join("hollow2/w"));
            fs::create_dir(src.join("full")).unwrap();
            write_file(&src.join("full/f"), b"f");
            write_file(&src.join("a"), b"a");
            write_file(&src.join("b"), b"b");
        });
        assert_eq!(
            names(&m.mnt),
            ["a", "b", "full", "hollow", "hollow2"],
            "mode {mode:?}"
        );
        // A whiteout is no target: RENAME_NOREPLACE onto it succeeds.
        rename2(&m.p("a"), &m.p("gone"), libc::RENAME_NOREPLACE).unwrap();
        assert_eq!(read_file(&m.p("gone")), b"a", "mode {mode:?}");
        assert_eq!(read_file(&m.src.join("gone")), b"a");
        // A directory holding only whiteouts is empty to the user: a
        // directory renames over it, and rmdir removes it.
        fs::create_dir(m.p("newdir")).unwrap();
        write_file(&m.p("newdir/x"), b"x");
        fs::rename(m.p("newdir"), m.p("hollow")).unwrap();
        assert_eq!(names(&m.p("hollow")), ["x"], "mode {mode:?}");
        assert!(!m.src.join("hollow/w").exists() && !is_whiteout(&m.src.join("hollow/w")));
        fs::remove_dir(m.p("hollow2")).unwrap();
        assert!(!m.src.join("hollow2").exists(), "mode {mode:?}");
        // A directory holding a visible entry is not.
        fs::create_dir(m.p("other")).unwrap();
        assert_eq!(
            e(fs::rename(m.p("other"), m.p("full"))).unwrap_err(),
            libc::ENOTEMPTY
        );
        assert_eq!(e(fs::remove_dir(m.p("full"))).unwrap_err(), libc::ENOTEMPTY);
        // Plain renames, over a file and by exchange, and an unlink.
        write_file(&m.p("c"), b"c");
        fs::rename(m.p("b"), m.p("c")).unwrap();
        assert_eq!(read_file(&m.p("c")), b"b");
        write_file(&m.p("d"), b"d");
        rename2(&m.p("c"), &m.p("d"), libc::RENAME_EXCHANGE).unwrap();
        assert_eq!(
            (read_file(&m.p("c")), read_file(&m.p("d"))),
            (b"d".to_vec(), b"b".to_vec())
        );
        fs::remove_file(m.p("c")).unwrap();
        assert_eq!(
            names(&m.mnt),
            ["d", "full", "gone", "hollow", "other"],
            "mode {mode:?}"
        );
        assert!(!m.src.join("c").exists());
    }
}

/// Renames in a one-branch union keep each object's name, which a copy-up
/// after a branch is added on top needs: a chmod through a descriptor
/// opened before, with no lookup since, makes the copy by that name.
/// (`passthrough=off`: a branch with files open through kernel
/// passthrough cannot turn read-only.)
#[test]
fn names_a_one_branch_union_renamed_lead_copy_up_after_a_branch_is_added() {
    for mode in ["plain,passthrough=off", "passthrough=off"] {
        let m = Mount::one_branch_union(mode, |src| {
            for name in ["x", "y", "z"] {
                write_file(&src.join(name), name.as_bytes());
            }
        });
        let open = |name: &str| fs::File::open(m.p(name)).unwrap();
        let (x, y, z) = (open("x"), open("y"), open("z"));
        fs::rename(m.p("x"), m.p("x2")).unwrap();
        rename2(&m.p("y"), &m.p("z"), libc::RENAME_EXCHANGE).unwrap();
        let top = m.root().join("top");
        fs::create_dir(&top).unwrap();
        branch_ok(&m, &["add", top.to_str().unwrap()]);
        branch_ok(&m, &["mode", "1", "ro"]);
        for (f, name, data) in [(x, "x2", b"x"), (y, "z", b"y"), (z, "y", b"z")] {
            f.set_permissions(fs::Permissions::from_mode(0o600))
                .unwrap();
            drop(f);
            assert_eq!(read_file(&top.join(name)), data, "mode {mode:?}: {name}");
            let st = fs::symlink_metadata(top.join(name)).unwrap();
            assert_eq!(st.permissions().mode() & 0o777, 0o600, "mode {mode:?}");
        }
        assert_eq!(names(&top), ["x2", "y", "z"], "mode {mode:?}");
    }
}
