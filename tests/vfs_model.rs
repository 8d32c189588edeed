//! The vfs and its history against an in-memory reference model, in
//! process (no FUSE, no daemon): random sequences of create/write,
//! write-at, truncate, chmod, mkdir, rmdir, symlink, link, unlink and
//! rename run on a `Vfs` with history capture and on the model. After each
//! operation its outcome (success or the exact errno) must match the
//! model's, and so must the backing tree and the tree as the vfs shows it
//! (lookup, getattr, read, readlink); every instant a successful
//! operation left is then read back from history (`list_at`/`object_at`
//! and the file's chunks, what `ls --at` and `cat --at` use) and must be
//! the model's tree at that point.
//!
//! tests/history_model.rs checks the same through a real mount and the
//! CLI (slow: a few cases); this one runs hundreds of cases in seconds.
//! Operations whose outcome the kernel decides before a request reaches
//! the file system (open of a directory for writing, following a symlink)
//! are not run.
//!
//! Environment: `CHRONOFS_VFS_CASES` (default 256), `CHRONOFS_VFS_SEED`.

mod inproc;
mod model;

use inproc::*;
use model::*;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn check_case(ops: &[Op]) -> Result<(), TestCaseError> {
    let rig = Rig::new();
    let mut model = Model::default();
    let mut instants = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let expected = match model.apply(op) {
            Outcome::Skip => continue,
            Outcome::Fails(e) => Err(e),
            Outcome::Succeeds => Ok(()),
        };
        let got = run(&rig, op);
        prop_assert_eq!(
            errname(&got),
            errname(&expected),
            "op {} {:?}: the vfs and the model disagree",
            i,
            op
        );
        let live = live_tree(&rig.src);
        let want = model.tree();
        prop_assert!(
            live == want,
            "after op {i} {op:?}: live tree {live:#?}\nmodel {want:#?}"
        );
        let seen = vfs_tree(&rig, &want);
        prop_assert!(
            seen == want,
            "after op {i} {op:?}: through the vfs {seen:#?}\nmodel {want:#?}"
        );
        let links = model.file_links();
        prop_assert_eq!(
            vfs_file_links(&rig, &links),
            links,
            "after op {} {:?}",
            i,
            op
        );
        if got.is_ok() {
            rig.clock.advance(secs(1));
            instants.push((i, rig.settle(), want));
        }
    }
    for (i, seq, want) in &instants {
        let past = tree_at(&rig.history, *seq);
        prop_assert!(
            &past == want,
            "history at seq {seq} (after op {i} {:?}) {past:#?}\nmodel {want:#?}",
            ops[*i]
        );
    }
    rig.capture.finish();
    Ok(())
}

#[test]
fn vfs_and_history_follow_the_model() {
    let mut runner = runner("CHRONOFS_VFS_CASES", 256, 0x0);
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
        check_case(&ops)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Regressions and corner cases, spelled out.
#[test]
fn rename_over_a_hard_link_of_itself_changes_nothing() {
    let ops = [
        Op::Write("a", 0o644, 10, 1),
        Op::Link("a", "b"),
        Op::Rename("a", "b"),
        Op::Unlink("a"),
    ];
    check_case(&ops).unwrap();
}

#[test]
fn a_directory_moves_with_its_subtree_and_history_follows() {
    let ops = [
        Op::Mkdir("a", 0o755),
        Op::Mkdir("a/x", 0o700),
        Op::Write("a/x/z", 0o600, 70_000, 3),
        Op::Rename("a", "c"),
        Op::Write("a", 0o644, 5, 4),
        Op::Rename("a", "c"),
    ];
    check_case(&ops).unwrap();
}
