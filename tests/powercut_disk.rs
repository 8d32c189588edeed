//! Power cuts of the whole stack: chronofs, its branches and its store on
//! ext4 on a logged disk (`common::logdisk`), an operation run, and then
//! the disk as a power cut at many points of it would have left it (the
//! writes before the last flush, any subset of those after) mounted
//! again: ext4 replays its journal, chronofs mounts, and the tree it shows
//! must be the one before the operation or the one after it, never a mix,
//! and the one after once the operation has returned. Kill -9 tests keep
//! the page cache and cannot see a missing fsync or a rename that reached
//! the disk before the data it names; these can.
//!
//! Cut points: every flush in the log, and right before each next flush
//! (the most unflushed writes a cut can hold), and each step's return;
//! two images each (every write kept, and a random subset of the
//! unflushed ones), an image already checked skipped. Each costs a loop
//! device, an ext4 mount (journal replay) and a chronofs mount, about
//! 0.2 s; `CHRONOFS_POWERCUT_IMAGES=N` spreads N flushes instead of all.
//! `CHRONOFS_POWERCUT_KEEP=DIR` keeps a failing image in DIR.

mod common;

use common::logdisk::{DiskMount, Event, LogDisk, Rng};
use common::*;
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const DISK_BYTES: usize = 64 << 20;

/// What the views are compared on: not times (a cut may drop an atime or
/// mtime update, which no fsync was asked for), and not a directory's link
/// count, which a union shows as 1 once the directory is merged (a copy-up
/// under it, as overlayfs does), before the change that copied up lands.
const VIEW: SnapOpts = SnapOpts {
    mtimes: false,
    dir_mtimes: false,
    dir_nlink: false,
};

fn cuts_per_test() -> usize {
    std::env::var("CHRONOFS_POWERCUT_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX)
}

fn must(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The logged disk with a fresh ext4 on it, mounted at `ext`.
struct Rig {
    // Drop order: the ext4 mount, the disk under it, then the directory.
    mounted: Option<DiskMount>,
    disk: LogDisk,
    /// The platters checked so far (by the writes they hold).
    tried: HashSet<Vec<usize>>,
    ext: PathBuf,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempdir();
        let fuse = dir.path().join("fuse");
        let ext = dir.path().join("ext");
        fs::create_dir(&fuse).unwrap();
        fs::create_dir(&ext).unwrap();
        let disk = LogDisk::new(&fuse, DISK_BYTES);
        // Lazy initialisation would write to the disk in the background
        // while the log runs.
        must(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
                .arg(disk.dev()),
        );
        let mounted = Some(DiskMount::mount(disk.dev(), &ext));
        Rig {
            _dir: dir,
            ext,
            disk,
            mounted,
            tried: HashSet::new(),
        }
    }

    /// A directory on the logged ext4 for a mount's trees.
    fn tree(&self) -> PathBuf {
        let t = self.ext.join("t");
        fs::create_dir(&t).unwrap();
        t
    }

    /// Everything so far is on the platter; the log starts here.
    fn start_logging(&self) {
        must(&mut Command::new("sync"));
        self.disk.start_logging();
    }

    /// Unmounts the logged ext4 (the log is complete by then).
    fn finish(&mut self) {
        self.mounted.take();
    }

    /// The cut points to try: the marks named in `always`, and up to `n`
    /// flushes spread evenly before the mark `end`.
    fn cuts(&self, always: &[usize], end: usize, n: usize) -> Vec<usize> {
        let log = self.disk.log();
        let flushes: Vec<usize> = log[..end]
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Flush))
            .map(|(i, _)| i + 1)
            .collect();
        let mut cuts: Vec<usize> = always.to_vec();
        cuts.push(0);
        let step = (flushes.len() as f64 / n.max(1) as f64).max(1.0);
        let mut at = 0.0;
        while (at as usize) < flushes.len() {
            cuts.push(flushes[at as usize]);
            // Just before the next flush: the most writes a cut can hold
            // unflushed.
            if let Some(next) = flushes.get(at as usize + 1) {
                cuts.push(next - 1);
            }
            at += step;
        }
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }

    /// Mounts each image of a power cut at `cut` (all writes kept, then a
    /// random subset of the unflushed ones) at the path the test ran at,
    /// and runs `check` on it; an image already checked is skipped.
    fn each_image(&mut self, cut: usize, seed: u64, check: &mut dyn FnMut(&str)) {
        for subset in [false, true] {
            let mut rng = Rng(seed | 1);
            let kept = self.disk.kept(cut, |_| !subset || rng.next() % 2 == 0);
            if !self.tried.insert(kept.clone()) {
                continue;
            }
            self.disk.load(self.disk.image(&kept));
            must(
                Command::new("blockdev")
                    .arg("--flushbufs")
                    .arg(self.disk.dev()),
            );
            let _ext = DiskMount::mount(self.disk.dev(), &self.ext);
            let what = format!(
                "power cut before log entry {cut} ({}, seed {seed})",
                if subset {
                    "a random subset of the unflushed writes"
                } else {
                    "every write"
                }
            );
            eprintln!("{what}");
            let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&what)));
            if let Err(failure) = checked {
                drop(_ext);
                keep_for_inspection(&self.disk.image(&kept), &self.ext);
                std::panic::resume_unwind(failure);
            }
        }
    }
}

/// With `CHRONOFS_POWERCUT_KEEP=DIR`, a failing image is copied to
/// `DIR/image` (mount it at the path printed to see what the cut left).
fn keep_for_inspection(image: &[u8], ext: &Path) {
    if let Some(dir) = std::env::var_os("CHRONOFS_POWERCUT_KEEP") {
        let to = Path::new(&dir).join("image");
        match fs::write(&to, image) {
            Ok(()) => eprintln!(
                "the failing image is {} (it ran mounted at {})",
                to.display(),
                ext.display()
            ),
            Err(e) => eprintln!("could not keep the failing image: {e}"),
        }
    }
}

fn in_sandbox(m: &Mount, script: &str) {
    let mnt = m.mnt.to_str().unwrap();
    let script = script.replace("MNT", mnt);
    let out = chronofs_in(m.root(), &["sandbox", mnt, "--", "sh", "-ec", &script]);
    assert!(
        out.status.success(),
        "sandbox: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        m.log_tail()
    );
}

/// The union's problems by fsck of its branches (unmounted), as
/// (problem, path) pairs.
fn union_problems(root: &Path, m: &Mount, what: &str) -> Vec<(String, String)> {
    let out = chronofs_in(root, &["fsck", &m.branch_list(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: fsck printed no report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let problems: Vec<(String, String)> = v["problems"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: fsck: {v}"))
        .iter()
        .map(|p| (p["problem"].to_string(), p["path"].to_string()))
        .collect();
    assert_eq!(
        out.status.success(),
        problems.is_empty(),
        "{what}: fsck's exit status and report disagree: {v}"
    );
    problems
}

/// The union mounted again on a cut's image: what it shows. Then fsck:
/// of the store (with history), which must find it consistent, and of
/// the branches, which may find only the temporaries a copy-up or
/// whiteout under way leaves (hidden in the view; `--repair` removes
/// them, and then nothing else may be left).
fn view_after_cut(root: &Path, opts: &str, shape: Shape, what: &str) -> BTreeMap<String, Entry> {
    let mut m = mount_on(root, opts, shape, |_| {});
    let seen = snapshot(&m.mnt, VIEW);
    m.unmount();
    if !opts.split(',').any(|o| o == "plain") {
        let out = chronofs_in(root, &["fsck", m.src.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{what}: fsck of the store: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if shape == Shape::Dir {
        return seen;
    }
    let problems = union_problems(root, &m, what);
    if problems.is_empty() {
        return seen;
    }
    let debris = problems
        .iter()
        .all(|(p, _)| p.contains("temporary left by a crash"));
    assert!(debris, "{what}: fsck: {problems:?}");
    let out = chronofs_in(root, &["fsck", &m.branch_list(), "--repair"]);
    assert!(
        out.status.success(),
        "{what}: fsck --repair: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(union_problems(root, &m, what), [], "{what}: after --repair");
    seen
}

fn differences(a: &BTreeMap<String, Entry>, b: &BTreeMap<String, Entry>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, va) in a {
        match b.get(k) {
            None => out.push(format!("only before/after: {k}")),
            Some(vb) if va != vb => out.push(format!("{k}: {va:?} / {vb:?}")),
            _ => {}
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        out.push(format!("only in the cut's view: {k}"));
    }
    out
}

/// The mount the steps run on.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// `src=rw:lower1=ro`.
    Union,
    /// A single directory, `src`.
    Dir,
}

/// A mount of `root`'s trees (made, and filled by `setup` given the
/// branches top first, unless they are there).
fn mount_on(root: &Path, opts: &str, shape: Shape, setup: impl FnOnce(&[PathBuf])) -> Mount {
    let root = Root::Kept(root.to_path_buf());
    match shape {
        Shape::Union => Mount::union_in(root, opts, 1, setup),
        Shape::Dir => Mount::new_in(root, opts, |src| setup(&[src.to_path_buf()])),
    }
}

/// What an operation promises the union's view.
#[derive(PartialEq)]
enum Promise {
    /// Each step changes the view: after a power cut, the view after the
    /// last step that returned or the one after the step under way.
    Changes,
    /// The steps leave the view as it was (snapshot, snapmerge), at every
    /// cut.
    Keeps,
}

type Step<'a> = Box<dyn FnOnce(&Mount) + 'a>;

/// Runs `steps` on a mount of `shape` (`opts`; its lowest branch filled
/// by `setup`, then `prepare` run on the mount) on the logged disk, then
/// checks the mount after power cuts all through them against `promise`.
/// `writing` names (step, path) pairs: a file that step writes, whose
/// content nothing promises until the step's fsync returns, or an entry
/// it puts in place apart from the others; while the step is under way
/// only the rest of the view is compared.
fn cut_through(
    (opts, shape): (&str, Shape),
    setup: impl FnOnce(&[PathBuf]),
    prepare: impl FnOnce(&Mount),
    steps: Vec<Step<'_>>,
    promise: Promise,
    writing: &[(usize, &str)],
) {
    // One rig at a time: a sandbox's mount namespace copies every mount
    // there is, another rig's ext4 too, whose superblock then outlives its
    // unmount and is found again by the next image's mount of that loop
    // device (which would check the old image's cached state).
    static ONE_RIG: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _alone = ONE_RIG.lock().unwrap_or_else(|e| e.into_inner());
    let mut rig = Rig::new();
    let root = rig.tree();
    let mut m = mount_on(&root, opts, shape, setup);
    prepare(&m);
    let mut states = vec![snapshot(&m.mnt, VIEW)];
    rig.start_logging();
    let mut returned = Vec::new();
    for (n, step) in steps.into_iter().enumerate() {
        step(&m);
        returned.push(rig.disk.mark(&format!("step {n} returned")));
        let now = snapshot(&m.mnt, VIEW);
        let last = &states[states.len() - 1];
        match promise {
            Promise::Changes => assert_ne!(last, &now, "step {n} changed nothing"),
            Promise::Keeps => assert_same_tree(last, &now, &format!("step {n}"), &m.log_tail()),
        }
        states.push(now);
    }
    let end = rig.disk.mark("end");
    m.unmount();
    rig.finish();
    let mut always = returned.clone();
    always.push(end);
    let cuts = rig.cuts(&always, end, cuts_per_test());
    eprintln!("{} log entries, {} cut points", end, cuts.len());
    let t0 = std::time::Instant::now();
    for (n, &cut) in cuts.iter().enumerate() {
        // The steps that had returned before the cut.
        let k = returned.iter().filter(|&&mark| mark < cut).count();
        rig.each_image(cut, 0x9e37_79b9 + n as u64, &mut |what| {
            let mut seen = view_after_cut(&root, opts, shape, what);
            // A restore cut short leaves its staging tree (a tool's
            // temporary, as rsync leaves its own), which the next restore
            // in that directory removes. Unchanged files are linked into
            // it, so meanwhile they count one link more.
            let staged = seen.keys().any(|path| path.contains(".chronofs-staging-"));
            seen.retain(|path, _| !path.contains(".chronofs-staging-"));
            let loose = |view: &BTreeMap<String, Entry>| {
                let mut view = view.clone();
                view.retain(|path, _| !writing.iter().any(|&(i, p)| i == k && p == path));
                if staged {
                    for e in view.values_mut() {
                        (e.nlink, e.link_group) = (0, None);
                    }
                }
                view
            };
            let seen = loose(&seen);
            if seen == loose(&states[k]) || states.get(k + 1).map(loose) == Some(seen.clone()) {
                return;
            }
            let next = match states.get(k + 1) {
                Some(next) => format!(
                    "\nagainst the one the step under way makes:\n  {}",
                    differences(next, &seen).join("\n  ")
                ),
                None => String::new(),
            };
            panic!(
                "{what}: the mount shows neither the tree after step {k} returned nor the one \
                 the step under way makes; against the first:\n  {}{next}",
                differences(&states[k], &seen).join("\n  ")
            );
        });
    }
    eprintln!("{} images checked in {:?}", rig.tried.len(), t0.elapsed());
}

/// Files in the lowest branch (`src` itself in a directory mount).
fn lower_tree(b: &[PathBuf]) {
    let l = &b[b.len() - 1];
    write_file(&l.join("old"), &pattern(20_000, 1));
    fs::create_dir_all(l.join("d/e")).unwrap();
    write_file(&l.join("d/x"), b"x\n");
    write_file(&l.join("d/e/y"), &pattern(70_000, 2));
    write_file(&l.join("gone"), b"gone\n");
}

fn ok_in(m: &Mount, args: &[&str]) {
    let out = chronofs_in(m.root(), args);
    assert_succeeded(m, args, &out);
}

/// A sandbox's writes (new files and directories, a changed lower file, a
/// removal, a renamed directory) applied by `sandbox commit`.
#[test]
fn a_sandbox_commit_cut_anywhere_leaves_all_of_it_or_none() {
    for opts in ["plain", ""] {
        eprintln!("mode {opts:?}");
        cut_through(
            (opts, Shape::Union),
            lower_tree,
            |m| {
                in_sandbox(
                    m,
                    "cd MNT; mkdir -p n/m; head -c 300000 /dev/urandom > n/m/big; \
                     echo new > n/small; printf changed >> old; rm gone; mv d renamed; \
                     echo more > renamed/e/z",
                )
            },
            vec![Box::new(|m| {
                let mnt = m.mnt.to_str().unwrap();
                ok_in(m, &["sandbox", "commit", "1", "--mount", mnt]);
            })],
            Promise::Changes,
            &[],
        );
    }
}

/// `chronofs clone` of a directory tree and of files (from the read-only
/// branch and from the read-write one, in a union), then `template
/// create` and `template instantiate` (history is on: clones need it).
#[test]
fn a_clone_cut_anywhere_is_whole_or_absent() {
    let clone = |src: &'static str, dst: &'static str| -> Step<'static> {
        Box::new(move |m: &Mount| {
            let (src, dst) = (m.p(src), m.p(dst));
            ok_in(m, &["clone", src.to_str().unwrap(), dst.to_str().unwrap()])
        })
    };
    for shape in [Shape::Union, Shape::Dir] {
        cut_through(
            ("", shape),
            lower_tree,
            |m| write_file(&m.p("mine"), &pattern(50_000, 3)),
            vec![
                clone("d", "dclone"),
                clone("old", "oldclone"),
                clone("mine", "mineclone"),
                Box::new(|m| {
                    let d = m.p("d");
                    ok_in(m, &["template", "create", "tpl", d.to_str().unwrap()]);
                    ok_in(
                        m,
                        &[
                            "template",
                            "instantiate",
                            "tpl",
                            m.p("made").to_str().unwrap(),
                        ],
                    );
                }),
            ],
            Promise::Changes,
            &[],
        );
    }
}

/// `restore`, `undelete` and `revert` write the past into the live tree:
/// a cut shows each tree as it was or as restored, never a part. (A
/// restore over a live file writes it in place, keeping its inode, its
/// other names and its history: a cut can tear that file as it can any
/// rewrite, and its content before is in history. Not tested here.)
#[test]
fn a_restore_cut_anywhere_brings_back_whole_files_or_none() {
    let at = |m: &Mount, args: &[&str]| {
        let out = Command::new(bin())
            .args(args)
            .current_dir(&m.mnt)
            .output()
            .unwrap();
        assert_succeeded(m, args, &out);
    };
    cut_through(
        ("", Shape::Dir),
        lower_tree,
        |m| {
            at(m, &["tag", "orig"]);
            write_file(&m.p("old"), &pattern(30_000, 5));
            fs::remove_file(m.p("old")).unwrap();
            fs::remove_dir_all(m.p("d")).unwrap();
            write_file(&m.p("n"), b"new\n");
            fs::remove_file(m.p("gone")).unwrap();
        },
        vec![
            Box::new(move |m| at(m, &["restore", "old", "--at", "orig"])),
            Box::new(move |m| at(m, &["undelete", "d"])),
            Box::new(move |m| at(m, &["revert", ".", "--at", "orig"])),
        ],
        Promise::Changes,
        // The mount's root cannot be swapped whole: its entries are put in
        // place one by one (README), so a cut during the revert may find
        // `gone` back and `n` not yet removed. Every other entry must be
        // as before the revert or after it.
        &[(2, "gone"), (2, "n")],
    );
}

/// Copy-up from the read-only branch (a chmod, an append, a rename of a
/// populated directory), each made durable as a careful program does:
/// fsync of the file, of the directory renamed in.
#[test]
fn a_copy_up_cut_anywhere_shows_the_old_file_or_the_new_never_a_part() {
    for opts in ["plain", ""] {
        eprintln!("mode {opts:?}");
        cut_through(
            (opts, Shape::Union),
            lower_tree,
            |_| {},
            vec![
                Box::new(|m| {
                    let p = m.p("d/e/y");
                    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
                    fs::File::open(&p).unwrap().sync_all().unwrap();
                }),
                Box::new(|m| {
                    append_all(&m.p("old"), &pattern(9_000, 4));
                    fs::File::open(m.p("old")).unwrap().sync_all().unwrap();
                }),
                Box::new(|m| {
                    fs::rename(m.p("d"), m.p("moved")).unwrap();
                    fs::File::open(&m.mnt).unwrap().sync_all().unwrap();
                }),
            ],
            Promise::Changes,
            &[],
        );
    }
}

/// `branch add` of a populated directory, then `branch remove` of the
/// lower branch: the set in force after a cut is one the mount had.
#[test]
fn a_branch_change_cut_anywhere_remounts_with_the_old_set_or_the_new() {
    for opts in ["plain", ""] {
        eprintln!("mode {opts:?}");
        cut_through(
            (opts, Shape::Union),
            lower_tree,
            |m| {
                let extra = m.root().join("extra");
                fs::create_dir(&extra).unwrap();
                write_file(&extra.join("added"), b"added\n");
            },
            vec![
                Box::new(|m| {
                    let extra = m.root().join("extra");
                    branch_ok(m, &["add", extra.to_str().unwrap()]);
                }),
                Box::new(|m| {
                    branch_ok(m, &["remove", m.lowers[0].to_str().unwrap()]);
                }),
            ],
            Promise::Changes,
            &[],
        );
    }
}

/// `snapshot` and `snapmerge` leave the view as it was, at every cut.
#[test]
fn a_snapshot_and_snapmerge_cut_anywhere_keep_the_view() {
    for opts in ["plain", ""] {
        eprintln!("mode {opts:?}");
        cut_through(
            (opts, Shape::Union),
            lower_tree,
            |m| {
                write_file(&m.p("top"), b"top\n");
                let mnt = m.mnt.to_str().unwrap();
                ok_in(m, &["snapshot", mnt]);
                write_file(&m.p("first-file"), b"first");
                fs::remove_file(m.p("gone")).unwrap();
                ok_in(m, &["snapshot", mnt]);
                fs::rename(m.p("d"), m.p("moved")).unwrap();
                append_all(&m.p("old"), b"more");
            },
            vec![
                Box::new(|m| ok_in(m, &["snapshot", m.mnt.to_str().unwrap()])),
                Box::new(|m| ok_in(m, &["snapmerge", m.mnt.to_str().unwrap()])),
            ],
            Promise::Keeps,
            &[],
        );
    }
}

/// An editor's save (write a temporary, fsync it, rename it over the
/// file, fsync the directory) and an fsync'd append, through a directory
/// mount with and without history, passthrough on and off: once fsync
/// returned, a cut keeps it, and never shows a torn file.
#[test]
fn an_fsynced_save_survives_a_cut_whole() {
    for opts in ["plain", "", "passthrough=off"] {
        eprintln!("mode {opts:?}");
        cut_through(
            (opts, Shape::Dir),
            lower_tree,
            |_| {},
            vec![
                Box::new(|m| {
                    let mut f = fs::File::create(m.p(".old.swp")).unwrap();
                    std::io::Write::write_all(&mut f, &pattern(40_000, 6)).unwrap();
                    f.sync_all().unwrap();
                }),
                Box::new(|m| {
                    fs::rename(m.p(".old.swp"), m.p("old")).unwrap();
                    fs::File::open(&m.mnt).unwrap().sync_all().unwrap();
                }),
                Box::new(|m| {
                    append_all(&m.p("d/x"), &pattern(5_000, 7));
                    fs::File::open(m.p("d/x")).unwrap().sync_all().unwrap();
                }),
            ],
            Promise::Changes,
            &[(0, ".old.swp"), (2, "d/x")],
        );
    }
}

/// Writes to a clone's file: a small one (a patch mark), scattered ones,
/// then half the file (materialised when the writer closes it), each
/// fsync'd; then a write to the source. A cut shows each file as the last
/// fsync left it or as the step under way makes it, the clone never the
/// source's later bytes.
#[test]
fn writes_to_a_clone_cut_anywhere_keep_what_fsync_promised() {
    use std::os::unix::fs::FileExt;
    let write_at = |m: &Mount, name: &str, at: &[(u64, usize, u64)]| {
        let f = fs::OpenOptions::new().write(true).open(m.p(name)).unwrap();
        for &(off, len, seed) in at {
            f.write_all_at(&pattern(len, seed), off).unwrap();
        }
        f.sync_all().unwrap();
    };
    cut_through(
        ("", Shape::Dir),
        |b| write_file(&b[0].join("big"), &pattern(1 << 20, 8)),
        |m| {
            let (src, dst) = (m.p("big"), m.p("bclone"));
            ok_in(m, &["clone", src.to_str().unwrap(), dst.to_str().unwrap()]);
        },
        vec![
            Box::new(move |m| write_at(m, "bclone", &[(4096, 16, 9)])),
            Box::new(move |m| {
                let scattered: Vec<_> = (0..20).map(|i| (i * 40_000 + 7, 100, 10 + i)).collect();
                write_at(m, "bclone", &scattered)
            }),
            Box::new(move |m| write_at(m, "bclone", &[(100_000, 600_000, 30)])),
            Box::new(move |m| write_at(m, "big", &[(0, 300_000, 31)])),
        ],
        Promise::Changes,
        &[(0, "bclone"), (1, "bclone"), (2, "bclone"), (3, "big")],
    );
}

/// A hard-linked file of the read-only branch changed through one name
/// (copy-up through the union's index: every name must land on the one
/// copy), then another name renamed: a cut shows all names on the old
/// file or all on the new, one object.
#[test]
fn a_linked_file_copied_up_cut_anywhere_keeps_its_names_together() {
    for opts in ["plain", ""] {
        eprintln!("mode {opts:?}");
        cut_through(
            (opts, Shape::Union),
            |b| {
                lower_tree(b);
                let l = &b[1];
                write_file(&l.join("a"), &pattern(30_000, 11));
                fs::hard_link(l.join("a"), l.join("b")).unwrap();
                fs::hard_link(l.join("a"), l.join("d/c")).unwrap();
            },
            |_| {},
            vec![
                Box::new(|m| {
                    append_all(&m.p("b"), b"appended through b");
                    fs::File::open(m.p("b")).unwrap().sync_all().unwrap();
                }),
                Box::new(|m| {
                    fs::rename(m.p("d/c"), m.p("c")).unwrap();
                    fs::File::open(&m.mnt).unwrap().sync_all().unwrap();
                    fs::File::open(m.p("d")).unwrap().sync_all().unwrap();
                }),
            ],
            Promise::Changes,
            &[],
        );
    }
}

/// `branch mode` back and forth, and a sandbox discarded: the view stays
/// as it was at every cut, and the mount comes back.
#[test]
fn a_mode_change_or_a_discard_cut_anywhere_keeps_the_view() {
    for opts in ["plain", ""] {
        eprintln!("mode {opts:?}");
        cut_through(
            (opts, Shape::Union),
            lower_tree,
            |m| in_sandbox(m, "cd MNT; echo private > p; rm old"),
            vec![
                Box::new(|m| {
                    branch_ok(m, &["mode", m.lowers[0].to_str().unwrap(), "rw"]);
                }),
                Box::new(|m| {
                    branch_ok(m, &["mode", m.lowers[0].to_str().unwrap(), "ro"]);
                }),
                Box::new(|m| {
                    let mnt = m.mnt.to_str().unwrap();
                    ok_in(m, &["sandbox", "discard", "1", "--mount", mnt]);
                }),
            ],
            Promise::Keeps,
            &[],
        );
    }
}
