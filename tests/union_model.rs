//! A union against the same in-memory reference model as
//! tests/vfs_model.rs, in process: the lowest read-only branch is filled
//! with a random tree, then random operations run on the union's `Vfs`
//! and on the model, which holds what a plain directory would (a union
//! must behave as one). After each operation its outcome (success or the
//! exact errno) must match, the tree as the vfs shows it (lookup,
//! getattr, read, readlink, file link counts) must be the model's, and the
//! read-only branches must be untouched; every instant an operation left
//! is then read back from history and must be the model's tree then.
//!
//! Environment: `CHRONOFS_UNION_CASES` (default 96), `CHRONOFS_VFS_SEED`.

mod inproc;
mod model;

use inproc::*;
use model::*;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// What a lower branch can be filled with (its own tools made it).
fn fill_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (path(), mode(), len(), any::<u8>()).prop_map(|(p, m, l, s)| Op::Write(p, m, l, s)),
        4 => (path(), mode()).prop_map(|(p, m)| Op::Mkdir(p, m | 0o700)),
        1 => (path(), proptest::sample::select(TARGETS)).prop_map(|(p, t)| Op::Symlink(p, t)),
        2 => (path(), path()).prop_map(|(a, b)| Op::Link(a, b)),
    ]
}

/// Runs a fill operation the model accepted on the directory `root`.
fn native(root: &Path, op: &Op) {
    match *op {
        Op::Write(p, m, n, s) => {
            let f = root.join(p);
            let existed = f.exists();
            std::fs::write(&f, pattern(n, s)).unwrap();
            if !existed {
                std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();
            }
        }
        Op::Mkdir(p, m) => {
            std::fs::create_dir(root.join(p)).unwrap();
            std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(m)).unwrap();
        }
        Op::Symlink(p, t) => std::os::unix::fs::symlink(t, root.join(p)).unwrap(),
        Op::Link(a, b) => std::fs::hard_link(root.join(a), root.join(b)).unwrap(),
        _ => unreachable!("not a fill operation"),
    }
}

/// The lower branches, top first: read-write or not; `fill_all`: the
/// filled tree goes into each of them (else into the bottom one only).
struct Lowers<'a> {
    writable: &'a [bool],
    fill_all: bool,
}

fn check_union_case(lowers: Lowers<'_>, fill: &[Op], ops: &[Op]) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    let accepted: Vec<Op> = fill
        .iter()
        .filter(|op| matches!(model.apply(op), Outcome::Succeeds))
        .cloned()
        .collect();
    let rig = Rig::union_with(lowers.writable, |dirs| {
        let filled = if lowers.fill_all || dirs.len() <= 1 {
            dirs
        } else {
            &dirs[dirs.len() - 1..]
        };
        for d in filled {
            for op in &accepted {
                native(d, op);
            }
        }
    });
    let read_only = |i: &usize| !lowers.writable[*i];
    // What the first mount does: the tree that predates it is recorded.
    rig.vfs.start_ingest().unwrap();
    prop_assert!(rig.vfs.wait_ingest(), "the baseline walk had errors");
    let ro_trees = || -> Vec<_> {
        (0..rig.lowers.len())
            .filter(read_only)
            .map(|i| live_tree(&rig.lowers[i]))
            .collect()
    };
    let branches_before = ro_trees();
    let want = model.tree();
    let seen = vfs_tree(&rig, &want);
    prop_assert!(seen == want, "the filled union {seen:#?}\nmodel {want:#?}");
    rig.clock.advance(secs(1));
    let mut instants = vec![(usize::MAX, rig.settle(), want)];
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
            "op {} {:?}: the union and the model disagree",
            i,
            op
        );
        let want = model.tree();
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
        let branches = ro_trees();
        prop_assert!(
            branches == branches_before,
            "after op {i} {op:?}: a read-only branch changed"
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
            "history at seq {seq} (after op {i}) {past:#?}\nmodel {want:#?}"
        );
    }
    rig.capture.finish();
    Ok(())
}

#[test]
fn a_union_follows_the_model_of_a_plain_directory() {
    let mut runner = runner("CHRONOFS_UNION_CASES", 96, 0x71);
    let strategy = (
        0usize..=3,
        proptest::collection::vec(fill_op(), 0..16),
        proptest::collection::vec(op(), 1..30),
    );
    let result = runner.run(&strategy, |(lowers, fill, ops)| {
        let writable = vec![false; lowers];
        let lowers = Lowers {
            writable: &writable,
            fill_all: false,
        };
        check_union_case(lowers, &fill, &ops)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The tree lives in a read-write branch below the primary one (alone, or
/// over a read-only copy of it): renames and links that cannot stay in
/// that branch move through the primary one, never EXDEV.
#[test]
fn a_union_with_a_lower_read_write_branch_follows_the_model() {
    let mut runner = runner("CHRONOFS_UNION_CASES", 96, 0x72);
    let strategy = (
        proptest::sample::select(vec![vec![true], vec![true, false], vec![false, true]]),
        proptest::collection::vec(fill_op(), 0..16),
        proptest::collection::vec(op(), 1..30),
    );
    let result = runner.run(&strategy, |(writable, fill, ops)| {
        let lowers = Lowers {
            writable: &writable,
            fill_all: true,
        };
        check_union_case(lowers, &fill, &ops)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
