//! The union suite of issue 16, modelled on the overlayfs
//! unionmount-testsuite (github.com/amir73il/unionmount-testsuite): its
//! cases (open/creat/trunc of lower files, symlinks, hard links, renames of
//! files and of empty, populated and new directories, rmdir, rmtree,
//! unlink, readlink, truncate, mkdir, impermissible operations, mass
//! renames, "EXDEV" renames), each with and without a trailing slash on
//! every path, plus cases of our own (whiteouts and opaque directories in
//! lower branches, hard links of lower files, symlinks made in the upper
//! branch).
//!
//! An oracle instead of expected values: each case gets a directory of its
//! own, laid out in the branches (upper + 1, 2 or 3 read-only lowers: the
//! fixture in the lowest, with shadowing, whiteouts and opaque directories
//! in the others), and a native directory holding the merged view built
//! by overlay rules. Every step runs on both; its result (Ok and what was
//! read, or the exact errno) must match. After each case: the whole
//! visible subtree (kinds, modes, owners, sizes, contents, symlink targets,
//! link counts, mtimes as "untouched"/"changed"), which names share an
//! inode number, and which names kept theirs, must match native; the
//! read-only branches must be unchanged. After all cases of a run the
//! union is remounted: the same tree, the same inode numbers.
//! Each family runs in the plain and the versioning mode.
//!
//! Deliberate difference (docs/COMPATIBILITY.md): a 0/0 character device
//! cannot be made in a union (EPERM); checked without the oracle.

mod common;

use common::*;
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// (mode, lowers): every branch count in the plain mode; three in the
/// versioning mode (the whole suite in every combination took 4 minutes).
const RUNS: [(&str, usize); 4] = [("plain", 1), ("plain", 2), ("plain", 3), ("", 3)];
/// The unionmount suite's unprivileged user, who owns the fixture's
/// `foo`/`*sym` entries.
const BIN: (u32, u32) = (1, 1);
/// Every fixture entry's mtime and atime.
const FIXED: (i64, i64) = (1_500_000_000, 123_456_789);

/// A case: a script run in its own directory; `k` index sets in the
/// fixture (`foo100`, `foo101`, ...); `links`: lower hard links too.
struct Case {
    name: String,
    k: usize,
    links: bool,
    script: String,
}

fn case(name: &str, script: &str) -> Case {
    Case {
        name: name.to_string(),
        k: 1,
        links: false,
        script: script.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Fixture

fn is_whiteout(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

fn put(p: &Path, data: &[u8], owner: Option<(u32, u32)>) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    write_file(p, data);
    if let Some((u, g)) = owner {
        std::os::unix::fs::lchown(p, Some(u), Some(g)).unwrap();
    }
}

fn sym(target: &str, p: &Path, owner: Option<(u32, u32)>) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, p).unwrap();
    if let Some((u, g)) = owner {
        std::os::unix::fs::lchown(p, Some(u), Some(g)).unwrap();
    }
}

fn whiteout(p: &Path) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    assert_eq!(
        sys::mknod(&cstr(p), libc::S_IFCHR | 0o600, 0),
        Ok(()),
        "mknod whiteout"
    );
}

/// Lays out case `c` in the branches `b` (`[upper, lower1, ...]`): the
/// unionmount suite's fixture in the lowest branch; with two or more
/// lowers, `foo` (and `direct_sym`) shadowed from the top lower (the
/// lowest branch's `foo` is stale), `dir/pop/c` in the one above the
/// lowest, `dir/gone` whited out there and `empty` opaque there over a
/// lowest `empty/hidden`; with three, `dir` of mode 0750 on top.
fn lay_out(b: &[PathBuf], c: &Case) {
    let n = b.len() - 1;
    let low = b[n].join(&c.name);
    let top = b[1].join(&c.name);
    let mid = b[n.saturating_sub(1).max(1)].join(&c.name);
    let real = b":xxx:yyy:zzz";
    for i in 100..100 + c.k {
        let file = format!("foo{i}");
        let dir = format!("dir{i}");
        put(
            &low.join(&file),
            if n > 1 { b"stale:bottom" } else { real },
            Some(BIN),
        );
        sym(
            &format!("../{}/{file}", c.name),
            &low.join(format!("direct_sym{i}")),
            Some(BIN),
        );
        sym(
            &format!("direct_sym{i}"),
            &low.join(format!("indirect_sym{i}")),
            Some(BIN),
        );
        sym(
            &format!("no_foo{i}"),
            &low.join(format!("pointless{i}")),
            Some(BIN),
        );
        put(&low.join(format!("{dir}/a")), b"", None);
        put(&low.join(format!("{dir}/pop/b")), b":aaa:bbb:ccc", None);
        sym(
            &format!("../{}/{dir}", c.name),
            &low.join(format!("direct_dir_sym{i}")),
            None,
        );
        sym(
            &format!("direct_dir_sym{i}"),
            &low.join(format!("indirect_dir_sym{i}")),
            None,
        );
        fs::create_dir_all(low.join(format!("empty{i}"))).unwrap();
        put(&low.join(format!("rootfile{i}")), real, None);
        if c.links {
            put(&low.join(format!("hard{i}")), b":hhh", None);
            fs::hard_link(low.join(format!("hard{i}")), low.join(format!("link{i}"))).unwrap();
            fs::hard_link(
                low.join(format!("hard{i}")),
                low.join(format!("{dir}/link")),
            )
            .unwrap();
        }
        if n == 1 {
            fs::create_dir_all(low.join(format!("{dir}/pop/c"))).unwrap();
            continue;
        }
        put(&top.join(&file), real, Some(BIN));
        sym(
            &format!("../{}/{file}", c.name),
            &top.join(format!("direct_sym{i}")),
            Some(BIN),
        );
        fs::create_dir_all(mid.join(format!("{dir}/pop/c"))).unwrap();
        put(&low.join(format!("{dir}/gone")), b"gone", None);
        whiteout(&mid.join(format!("{dir}/gone")));
        put(&low.join(format!("empty{i}/hidden")), b"hidden", None);
        fs::create_dir_all(mid.join(format!("empty{i}"))).unwrap();
        set_xattr(
            &mid.join(format!("empty{i}")),
            "trusted.overlay.opaque",
            b"y",
            0,
        )
        .unwrap();
        if n > 2 {
            fs::create_dir_all(top.join(&dir)).unwrap();
            fs::set_permissions(top.join(&dir), fs::Permissions::from_mode(0o750)).unwrap();
        }
    }
}

fn remove_any(p: &Path) {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(p).unwrap(),
        Ok(_) => fs::remove_file(p).unwrap(),
        Err(_) => {}
    }
}

/// Applies branch directory `b` over native directory `n` by overlay
/// rules: whiteouts remove, opaque directories replace, directories
/// merge, anything else replaces; hard links within `b` stay links.
fn overlay(b: &Path, n: &Path, links: &mut HashMap<u64, PathBuf>) {
    let mut names: Vec<_> = fs::read_dir(b)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for name in names {
        let (bp, np) = (b.join(&name), n.join(&name));
        let md = fs::symlink_metadata(&bp).unwrap();
        if is_whiteout(&bp) {
            remove_any(&np);
        } else if md.is_dir() {
            let opaque = get_xattr(&bp, "trusted.overlay.opaque").is_ok_and(|v| v == b"y");
            let is_dir = fs::symlink_metadata(&np).is_ok_and(|m| m.is_dir());
            if opaque || !is_dir {
                remove_any(&np);
                fs::create_dir(&np).unwrap();
            }
            fs::set_permissions(&np, fs::Permissions::from_mode(md.mode() & 0o7777)).unwrap();
            std::os::unix::fs::lchown(&np, Some(md.uid()), Some(md.gid())).unwrap();
            overlay(&bp, &np, links);
        } else {
            remove_any(&np);
            if md.file_type().is_symlink() {
                std::os::unix::fs::symlink(fs::read_link(&bp).unwrap(), &np).unwrap();
            } else if let Some(first) = links.get(&md.ino()) {
                fs::hard_link(first, &np).unwrap();
                continue;
            } else {
                fs::copy(&bp, &np).unwrap();
                fs::set_permissions(&np, fs::Permissions::from_mode(md.mode() & 0o7777)).unwrap();
                if md.nlink() > 1 {
                    links.insert(md.ino(), np.clone());
                }
            }
            std::os::unix::fs::lchown(&np, Some(md.uid()), Some(md.gid())).unwrap();
        }
    }
}

/// Sets every entry below `root` (not `root`) to the FIXED times.
fn fix_times(root: &Path) {
    let mut paths: Vec<PathBuf> = snapshot(root, SNAP_NO_TIMES)
        .keys()
        .map(|k| root.join(k))
        .collect();
    paths.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in paths {
        set_times(&p, FIXED, FIXED, true);
    }
}

// ---------------------------------------------------------------------------
// Steps

/// One step: `[bin:|nobody:]op arg...`.
#[derive(Clone)]
struct Step {
    text: String,
    user: Option<(u32, u32)>,
    op: String,
    args: Vec<String>,
}

fn parse(script: &str, case_name: &str, slash: bool) -> Vec<Step> {
    let script = script
        .replace("{T}", &format!("../{case_name}"))
        .replace("{f}", "foo100")
        .replace("{nf}", "no_foo100")
        .replace("{ds}", "direct_sym100")
        .replace("{is}", "indirect_sym100")
        .replace("{pl}", "pointless100")
        .replace("{dds}", "direct_dir_sym100")
        .replace("{ids}", "indirect_dir_sym100")
        .replace("{d}", "dir100")
        .replace("{nd}", "no_dir100")
        .replace("{e}", "empty100")
        .replace("{rf}", "rootfile100")
        .replace("{h}", "hard100")
        .replace("{l}", "link100")
        .replace('~', if slash { "/" } else { "" });
    script
        .split([';', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let mut w = s.split_whitespace();
            let first = w.next().unwrap();
            let (user, op) = match first.split_once(':') {
                Some(("bin", op)) => (Some(BIN), op),
                Some(("nobody", op)) => (Some((NOBODY, NOBODY)), op),
                _ => (None, first),
            };
            Step {
                text: s.to_string(),
                user,
                op: op.to_string(),
                args: w.map(str::to_string).collect(),
            }
        })
        .collect()
}

fn flags(s: &str) -> i32 {
    let mut f = if s.contains('b') {
        libc::O_RDWR
    } else if s.contains('w') {
        libc::O_WRONLY
    } else {
        libc::O_RDONLY
    };
    for (c, bit) in [
        ('a', libc::O_APPEND),
        ('c', libc::O_CREAT),
        ('x', libc::O_EXCL),
        ('t', libc::O_TRUNC),
        ('d', libc::O_DIRECTORY),
    ] {
        if s.contains(c) {
            f |= bit;
        }
    }
    f | libc::O_CLOEXEC
}

type Res = Result<Vec<u8>, Errno>;

/// A step's arguments made ready before any fork: paths as C strings.
struct Prepared {
    a: CString,
    b: CString,
    flags: i32,
    data: Vec<u8>,
    len: i64,
}

fn prepare(s: &Step, root: &Path) -> Prepared {
    let path = |i: usize| cstr(root.join(s.args.get(i).map_or("", |a| a.as_str())));
    let (flags, data, len) = match s.op.as_str() {
        "open" => (
            flags(&s.args[1]),
            s.args.get(2).map_or(Vec::new(), |d| d.as_bytes().to_vec()),
            0,
        ),
        "read" => (flags("r"), Vec::new(), 0),
        "opendir" => (flags("rd"), Vec::new(), 0),
        "truncate" => (0, Vec::new(), s.args[1].parse().unwrap()),
        _ => (0, Vec::new(), 0),
    };
    Prepared {
        a: path(0),
        b: path(1),
        flags,
        data,
        len,
    }
}

/// Runs a prepared step with system calls only (so it may run in a
/// forked child); `out` collects what was read, if given.
fn exec(op: &str, p: &Prepared, mut out: Option<&mut Vec<u8>>) -> Result<(), Errno> {
    match op {
        "open" | "read" | "opendir" => {
            let fd = sys::open(&p.a, p.flags, 0o666)?;
            if !p.data.is_empty() {
                fd.write(&p.data)?;
            } else if p.flags & libc::O_ACCMODE != libc::O_WRONLY && op != "opendir" {
                let mut buf = [0u8; 256];
                loop {
                    let n = fd.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    if let Some(o) = out.as_deref_mut() {
                        o.extend_from_slice(&buf[..n]);
                    }
                }
            }
            Ok(())
        }
        "link" => sys::linkat(&p.a, &p.b, 0),
        "linkf" => sys::linkat(&p.a, &p.b, libc::AT_SYMLINK_FOLLOW),
        "rename" => sys::rename(&p.a, &p.b),
        "unlink" => sys::unlink(&p.a),
        "rmdir" => rmdir(&p.a),
        "mkdir" => sys::mkdir(&p.a, 0o755),
        "truncate" => sys::truncate(&p.a, p.len),
        "utimes" => sys::utimensat(&p.a, None, 0),
        other => panic!("unknown op {other}"),
    }
}

/// rmdir(2) through std (the wrappers have none; std copies a short path
/// to the stack, so this does not allocate either).
fn rmdir(c: &std::ffi::CStr) -> Result<(), Errno> {
    use std::os::unix::ffi::OsStrExt;
    e(fs::remove_dir(std::ffi::OsStr::from_bytes(c.to_bytes())))
}

fn rmtree(p: &Path) -> Result<(), Errno> {
    let md = e(fs::symlink_metadata(p))?;
    if md.is_dir() {
        for ent in e(fs::read_dir(p))? {
            let ent = e(ent)?;
            let q = ent.path();
            if e(fs::symlink_metadata(&q))?.is_dir() {
                rmtree(&q)?;
            } else {
                e(fs::remove_file(&q))?;
            }
        }
        e(fs::remove_dir(p))
    } else {
        e(fs::remove_file(p))
    }
}

/// Runs step `s` in directory `root`: Ok(what was read) or the errno.
fn run_step(s: &Step, root: &Path) -> Res {
    let arg = |i: usize| root.join(&s.args[i]);
    match s.op.as_str() {
        "readlink" => {
            return e(fs::read_link(arg(0))).map(|t| t.into_os_string().into_encoded_bytes())
        }
        "symlink" => return e(std::os::unix::fs::symlink(&s.args[0], arg(1))).map(|_| Vec::new()),
        "rmtree" => return rmtree(&arg(0)).map(|_| Vec::new()),
        "stat" => {
            return lstat(&arg(0)).map(|st| {
                format!(
                    "mode {:o} size {} nlink {} uid {}",
                    st.st_mode, st.st_size, st.st_nlink, st.st_uid
                )
                .into_bytes()
            })
        }
        _ => {}
    }
    let p = prepare(s, root);
    match s.user {
        None => {
            let mut out = Vec::new();
            exec(&s.op, &p, Some(&mut out)).map(|_| out)
        }
        Some(ids) => {
            let op = s.op.clone();
            match in_child(Some(ids), || match exec(&op, &p, None) {
                Ok(()) => 0,
                Err(e) => e,
            }) {
                0 => Ok(Vec::new()),
                e => Err(e),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Comparisons

/// A subtree as compared: mtimes only as FIXED (untouched) or not.
fn view(root: &Path) -> BTreeMap<String, Entry> {
    let mut s = snapshot(root, SNAP_ALL);
    for e in s.values_mut() {
        if let Some(t) = e.mtime {
            e.mtime = Some(if t == FIXED { (1, 0) } else { (0, 0) });
        }
    }
    s
}

/// A directory's link count on the union must be native's, or 1 (what
/// overlayfs shows for a merged directory: "unknown", which find(1) and
/// fts(3) take as "do not count on it").
fn dir_nlinks(a: &BTreeMap<String, Entry>, b: &BTreeMap<String, Entry>) -> Vec<String> {
    a.iter()
        .filter(|(_, e)| e.kind == 'd')
        .filter_map(|(k, e)| {
            let u = b.get(k)?.nlink;
            (u != e.nlink && u != 1).then(|| {
                format!(
                    "directory {k} has link count {u} on the union, {} native",
                    e.nlink
                )
            })
        })
        .collect()
}

/// Every name below `dir` (relative to `root`) with its inode number.
fn inos(root: &Path) -> BTreeMap<String, u64> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, u64>) {
        for ent in fs::read_dir(dir).unwrap() {
            let p = ent.unwrap().path();
            if dir == root && p.file_name().is_some_and(|n| n == ".chronofs") {
                continue;
            }
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            out.insert(rel, md.ino());
            if md.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The groups (size > 1) of names sharing an inode number.
fn groups(m: &BTreeMap<String, u64>) -> Vec<Vec<String>> {
    let mut by: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (k, i) in m {
        by.entry(*i).or_default().push(k.clone());
    }
    let mut v: Vec<Vec<String>> = by.into_values().filter(|g| g.len() > 1).collect();
    v.sort();
    v
}

fn tree_diff(a: &BTreeMap<String, Entry>, b: &BTreeMap<String, Entry>) -> Vec<String> {
    let mut d = Vec::new();
    for (k, va) in a {
        match b.get(k) {
            None => d.push(format!("only native: {k} {va:?}")),
            Some(vb) if va != vb => d.push(format!("{k}: native {va:?} union {vb:?}")),
            _ => {}
        }
    }
    for (k, vb) in b {
        if !a.contains_key(k) {
            d.push(format!("only union: {k} {vb:?}"));
        }
    }
    d
}

/// Each case directory's view in each read-only branch, before the mount.
type Snaps = HashMap<String, Vec<BTreeMap<String, Entry>>>;

/// Runs one case on the native directory and the mount; the differences.
fn run_case(m: &Mount, c: &Case, slash: bool, lowers_before: &Snaps) -> Vec<String> {
    let dir = |slash: bool| format!("{}{}", c.name, if slash { ".s" } else { "" });
    let name = dir(slash);
    let (nat, uni) = (m.native.join(&name), m.mnt.join(&name));
    let mut fails = Vec::new();
    // Hold every native object open, so that no inode number is reused
    // while the case runs: a name has the same number after the case iff
    // it is the same object.
    let before_n = inos(&nat);
    let _held: Vec<Fd> = before_n
        .keys()
        .filter_map(|k| {
            sys::open(
                &cstr(nat.join(k)),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0,
            )
            .ok()
        })
        .collect();
    let before_u = inos(&uni);
    for (i, s) in parse(&c.script, &name, slash).iter().enumerate() {
        if s.op == "mknod00" {
            // The deliberate difference: a 0/0 char device is a whiteout.
            let r = sys::mknod(&cstr(uni.join(&s.args[0])), libc::S_IFCHR | 0o644, 0);
            if r != Err(libc::EPERM) {
                fails.push(format!(
                    "{name} step {i} `{}`: union gave {r:?}, not EPERM",
                    s.text
                ));
            }
            continue;
        }
        let a = run_step(s, &nat);
        let b = run_step(s, &uni);
        if a != b {
            let show = |r: &Res| match r {
                Ok(v) => format!("Ok({:?})", String::from_utf8_lossy(v)),
                Err(e) => format!("Err({})", std::io::Error::from_raw_os_error(*e)),
            };
            fails.push(format!(
                "{name} step {i} `{}`: native {}, union {}",
                s.text,
                show(&a),
                show(&b)
            ));
        }
    }
    let (mut tn, mut tu) = (view(&nat), view(&uni));
    for d in dir_nlinks(&tn, &tu) {
        fails.push(format!("{name}: {d}"));
    }
    // Directories' link counts apart (above).
    for e in tn.values_mut().chain(tu.values_mut()) {
        if e.kind == 'd' {
            e.nlink = 0;
        }
    }
    for d in tree_diff(&tn, &tu) {
        fails.push(format!("{name} tree: {d}"));
    }
    let (after_n, after_u) = (inos(&nat), inos(&uni));
    if groups(&after_n) != groups(&after_u) {
        fails.push(format!(
            "{name}: names sharing an inode: native {:?}, union {:?}",
            groups(&after_n),
            groups(&after_u)
        ));
    }
    for (k, a) in &after_n {
        let (Some(b0), Some(b1), Some(u0)) = (before_n.get(k), after_u.get(k), before_u.get(k))
        else {
            continue;
        };
        if (a == b0) != (b1 == u0) {
            fails.push(format!(
                "{name}: {k} kept its inode number: native {}, union {}",
                a == b0,
                b1 == u0
            ));
        }
    }
    for (l, before) in m.lowers.iter().zip(&lowers_before[&name]) {
        let now = view(&l.join(&name));
        if &now != before {
            fails.push(format!(
                "{name}: read-only branch {} changed: {:?}",
                l.display(),
                tree_diff(before, &now)
            ));
        }
    }
    fails
}

/// Runs `cases` (each with and without a trailing slash) on a union of
/// 1, 2 and 3 lowers in each mode; panics listing every difference, but
/// for those containing a `known` string (with its reason: a bug
/// reported, not fixed yet), which are printed only.
fn run_suite(family: &str, cases: &[Case], known: &[(&str, &str)]) {
    let mut fails = Vec::new();
    let mut known_seen = Vec::new();
    let mut steps = 0;
    for (mode, n) in RUNS {
        {
            let layout = |b: &[PathBuf]| {
                for c in cases {
                    for slash in [false, true] {
                        let c2 = Case {
                            name: format!("{}{}", c.name, if slash { ".s" } else { "" }),
                            k: c.k,
                            links: c.links,
                            script: String::new(),
                        };
                        lay_out(b, &c2);
                    }
                }
                for br in b {
                    fix_times(br);
                }
            };
            let mut m = Mount::union(mode, n, layout);
            let mut branches = vec![m.src.clone()];
            branches.extend(m.lowers.iter().cloned());
            let mut links = HashMap::new();
            for br in branches.iter().rev() {
                links.clear();
                overlay(br, &m.native, &mut links);
            }
            fix_times(&m.native);
            let lowers_before: Vec<_> = m.lowers.iter().map(|l| view(l)).collect();
            let mut per_case = Snaps::new();
            for c in cases {
                for slash in ["", ".s"] {
                    let name = format!("{}{slash}", c.name);
                    let v = m.lowers.iter().map(|l| view(&l.join(&name))).collect();
                    per_case.insert(name, v);
                }
            }
            let d = tree_diff(&view(&m.native), &view(&m.mnt));
            let d: Vec<_> = d
                .into_iter()
                .filter(|x| !(x.contains("kind: 'd'") && x.contains("nlink")))
                .collect();
            if !d.is_empty() {
                fails.push(format!(
                    "[{family} mode {mode:?} lowers {n}] initial tree differs: {d:?}"
                ));
            }
            for c in cases {
                for slash in [false, true] {
                    steps += c
                        .script
                        .split([';', '\n'])
                        .filter(|s| !s.trim().is_empty())
                        .count();
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_case(&m, c, slash, &per_case)
                    }));
                    let f = r.unwrap_or_else(|p| vec![format!("{}: panicked: {p:?}", c.name)]);
                    if f.is_empty() {
                        continue;
                    }
                    let tagged = f
                        .into_iter()
                        .map(|x| format!("[{family} mode {mode:?} lowers {n}] {x}"));
                    for x in tagged {
                        match known.iter().find(|(k, _)| x.contains(k)) {
                            Some((_, why)) => known_seen.push(format!("{x} (known: {why})")),
                            None => fails.push(x),
                        }
                    }
                }
            }
            // The same tree and inode numbers after a remount; lowers as they were.
            let (tree, numbers) = (view(&m.mnt), inos(&m.mnt));
            m.remount();
            let d = tree_diff(&tree, &view(&m.mnt));
            if !d.is_empty() {
                let x =
                    format!("[{family} mode {mode:?} lowers {n}] remount changed the tree: {d:?}");
                match known.iter().find(|(k, _)| x.contains(k)) {
                    Some((_, why)) => known_seen.push(format!("{x} (known: {why})")),
                    None => fails.push(x),
                }
            }
            let again = inos(&m.mnt);
            let moved: Vec<_> = numbers
                .iter()
                .filter(|(k, i)| again.get(*k).is_some_and(|j| j != *i))
                .map(|(k, _)| k.clone())
                .collect();
            for k in &moved {
                eprintln!("MOVED {k}: {} -> {}", numbers[k], again[k]);
            }
            if !moved.is_empty() {
                let x = format!(
                    "[{family} mode {mode:?} lowers {n}] inode numbers changed across a remount: {moved:?}"
                );
                match known.iter().find(|(k, _)| x.contains(k)) {
                    Some((_, why)) => known_seen.push(format!("{x} (known: {why})")),
                    None => fails.push(x),
                }
            }
            for (l, before) in m.lowers.iter().zip(&lowers_before) {
                if &view(l) != before {
                    fails.push(format!(
                        "[{family} mode {mode:?} lowers {n}] read-only branch {} changed",
                        l.display()
                    ));
                }
            }
        }
    }
    for f in &fails {
        eprintln!("DIFF {f}");
    }
    eprintln!(
        "{family}: {} cases x 2 (slash) x {} runs, {steps} steps; {} differences, {} known",
        cases.len(),
        RUNS.len(),
        fails.len(),
        known_seen.len()
    );
    for k in &known_seen {
        eprintln!("  {k}");
    }
    assert!(
        fails.is_empty(),
        "{family}: {} differences from native:\n{}",
        fails.len(),
        fails
            .iter()
            .take(60)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ---------------------------------------------------------------------------
// The families

/// Access modes of the unionmount suite's open tests: O_RDONLY, O_WRONLY,
/// O_APPEND|O_WRONLY, O_RDWR, O_APPEND|O_RDWR.
const ACCESS: [&str; 5] = ["r", "w", "wa", "b", "ba"];

/// open-*, sym1-*, sym2-*, symx-*, noent-*: open (plain, trunc, creat,
/// creat-trunc, creat-excl, creat-excl-trunc) in each access mode of a
/// lower file, a symlink to it, a symlink to that, a dangling symlink and
/// an absent name; twice (the second open finds the first's result), and
/// what each name then holds.
fn open_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (tname, t) in [
        ("open", "{f}~"),
        ("sym1", "{ds}~"),
        ("sym2", "{is}~"),
        ("symx", "{pl}~"),
        ("noent", "{nf}~"),
    ] {
        for (vname, mods) in [
            ("plain", ""),
            ("trunc", "t"),
            ("creat", "c"),
            ("creat-trunc", "ct"),
            ("creat-excl", "cx"),
            ("creat-excl-trunc", "cxt"),
        ] {
            for (i, acc) in ACCESS.iter().enumerate() {
                let script = if *acc == "r" {
                    format!("open {t} r{mods}; open {t} r{mods}; read {t}")
                } else {
                    format!("open {t} {acc}{mods} q; read {t}; open {t} {acc}{mods} p; read {t}")
                };
                v.push(case(
                    &format!("{tname}-{vname}.{}", i + 1),
                    &format!("{script}; read {{f}}; read {{nf}}; readlink {{pl}}"),
                ));
            }
        }
    }
    v
}

#[test]
fn open_creat_trunc_of_lower_files_and_symlinks() {
    run_suite("open", &open_cases(), &[]);
}

/// dir-open, dir-open-dir, dir-weird-open, dir-weird-open-dir,
/// dir-sym1-*, dir-sym2-*: every open of a lower directory (directly and
/// through one or two symlinks), with and without O_DIRECTORY; each case
/// one target, every flag combination in turn, each followed by a plain
/// open.
fn dir_open_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (tname, t) in [
        ("dir", "{d}~"),
        ("dir-sym1", "{dds}~"),
        ("dir-sym2", "{ids}~"),
    ] {
        for (dname, d) in [("open", ""), ("open-dir", "d")] {
            let mut script = String::new();
            for acc in ACCESS {
                for mods in ["", "c", "cx", "t", "ct", "cxt"] {
                    script += &format!("open {t} {acc}{mods}{d}; open {t} r{d};");
                }
            }
            script += &format!("opendir {t}; read {t}/a; read {{d}}/pop/b");
            v.push(case(&format!("{tname}-{dname}"), &script));
        }
    }
    v
}

#[test]
fn directory_opens() {
    run_suite("dir-open", &dir_open_cases(), &[]);
}

fn link_cases() -> Vec<Case> {
    let mut v: Vec<Case> = [
        // hard-link
        ("hard-link.1", "link {f}~ {nf}~; read {f}~; read {nf}~"),
        ("hard-link.2", "link {nf}~ {nf}a~; read {nf}~; read {nf}a~"),
        ("hard-link.3", "link {nf}~ {f}~; read {nf}~; read {f}~"),
        ("hard-link.4", "link {f}~ {d}/a~; read {f}~; read {d}/a~"),
        ("hard-link.5", "open {f}-new~ wc aaaa; link {f}~ {f}-new~; read {f}~; read {f}-new~"),
        ("hard-link.6", "open {f}-new~ wc aaaa; link {f}-new~ {f}~; read {f}-new~; read {f}~"),
        ("hard-link.7", "link {f}~ {f}~; read {f}~"),
        ("hard-link.8", "open {f}-new~ wc aaaa; link {f}-new~ {f}-new~; read {f}-new~"),
        ("hard-link.9", "link {nf}~ {nf}~; read {nf}~"),
        ("hard-link.10", "unlink {f}~; link {f}~ {nf}~; read {f}~; read {nf}~"),
        (
            "hard-link.11",
            "rename {f}~ {nf}~; link {f}~ {nf}-a~; link {nf}~ {f}~; read {f}~; read {nf}~; read {nf}-a~",
        ),
        (
            "hard-link.12",
            "link {f} {nf}; open {nf} wa more; read {f}; open {f} wa more2; read {nf}; unlink {f}; read {nf}; link {nf} {d}/x; read {d}/x",
        ),
        // hard-link-dir
        ("hard-link-dir.1", "link {e}~ {nd}~; opendir {e}~; opendir {nd}~"),
        ("hard-link-dir.2", "link {f}~ {e}~; read {f}~; opendir {e}~"),
        ("hard-link-dir.3", "link {d}~ {e}~; opendir {d}~; opendir {e}~"),
        ("hard-link-dir.4", "link {d}~ {f}~; opendir {d}~; read {f}~"),
        ("hard-link-dir.5", "link {d}~ {d}~; opendir {d}~"),
        ("hard-link-dir.6", "link {d}/pop~ {d}~; opendir {d}/pop~; opendir {d}~"),
        ("hard-link-dir.7", "rmdir {e}~; link {e}~ {nd}~; opendir {e}~; opendir {nd}~"),
        (
            "hard-link-dir.8",
            "mkdir {e}/new~; rename {e}/new~ {nd}~; link {e}/new~ {nd}-a~; link {nd}~ {e}/new~; opendir {e}/new~; opendir {nd}~; opendir {nd}-a~",
        ),
        // rename-hard-link
        (
            "rename-hard-link.1",
            "link {f}~ {nf}~; rename {nf}~ {nf}-a~; rename {nf}-a~ {nf}~; rename {f}~ {f}-a~; read {f}~; read {nf}~; read {nf}-a~; read {f}-a~",
        ),
    ]
    .iter()
    .map(|(n, s)| case(n, s))
    .collect();
    // hard-link-sym, with link(2) of the symlink itself and through it.
    for l in ["link", "linkf"] {
        for (i, s) in [
            "L {ds}~ {nf}~; read {ds}~; read {nf}~; readlink {nf}",
            "L {pl}~ {nf}~; read {pl}~; read {nf}~",
            "L {nf}~ {ds}~; read {nf}~; read {ds}~",
            "L {ds}~ {d}/a~; read {ds}~; read {d}/a~",
            "open {f}-new~ wc aaaa; L {ds}~ {f}-new~; read {ds}~; read {f}-new~",
            "open {f}-new~ wc aaaa; L {f}-new~ {ds}~; read {f}-new~; read {ds}~",
            "L {ds}~ {ds}~; read {ds}~",
            "L {ds}~ {pl}~; read {ds}~; read {pl}~",
            "unlink {ds}~; L {ds}~ {nf}~; read {ds}~; read {nf}~",
            "rename {ds}~ {nf}~; L {ds}~ {nf}-a~; L {nf}~ {ds}~; read {ds}~; read {nf}~; read {nf}-a~",
        ]
        .iter()
        .enumerate()
        {
            v.push(case(&format!("hard-link-sym-{l}.{}", i + 1), &s.replace('L', l)));
        }
    }
    // Hard links of a lower file (one identity across copy-up).
    for (i, s) in [
        "open {h} wa X; read {l}; read {d}/link; stat {l}",
        "unlink {h}; read {l}; open {l} wa Y; read {d}/link; unlink {l}; stat {d}/link; unlink {d}/link",
        "rename {l} {nf}; open {nf} wa Z; read {h}; link {h} {nf}2; unlink {h}; read {nf}2; stat {nf}",
        "link {d}/link {e}/new; open {e}/new wa W; read {h}; rename {h} {d}/link; read {h}; read {l}",
        "truncate {l} 1; read {h}; bin:open {h} w; rename {d} {nd}; read {nd}/link; unlink {nd}/link",
        "rmtree {d}; read {h}; open {l} b; link {l} {d}",
    ]
    .iter()
    .enumerate()
    {
        let mut c = case(&format!("lower-hard-link.{}", i + 1), s);
        c.links = true;
        v.push(c);
    }
    v
}

#[test]
fn hard_links() {
    run_suite("hard-link", &link_cases(), &[]);
}

/// The rename-empty-dir / rename-pop-dir / rename-new-dir /
/// rename-new-pop-dir templates, for a directory `D` made by `pre`.
fn dir_rename_cases() -> Vec<Case> {
    let templates = [
        "rename D~ {nd}~; rename D~ {nd}~; rename {nd}~ D~; rename {nd}~ D~; opendir D~; opendir {nd}~; read D/a",
        "rename D~ {nd}~; rmdir D~; rename {nd}~ D~; rename {nd}~ D~; opendir D~; rmdir D~; rmdir D~; opendir D~; opendir {nd}~; read D/a",
        "rename D~ {nd}~; unlink D~; rename {nd}~ D~; rename {nd}~ D~; opendir D~; unlink D~; opendir D~; opendir {nd}~; read D/a",
        "rmdir D~; rename D~ {nd}~; rmdir D~; rmdir {nd}~; read {nd}/a",
        "unlink D~; rename D~ {nd}~; unlink D~; rmdir {nd}~; read {nd}/a",
        "rename D~ {nd}~; rename D~ {nd}~; rename {nd}~ {nd}x~; rename {nd}~ {nd}x~; opendir D~; opendir {nd}~; opendir {nd}x~; read {nd}x/a",
        "rename D~ {d}~; opendir D~; opendir {d}~; read {d}/a",
        "rename D~ {e}~; opendir D~; opendir {e}~; read {e}/a",
        "rename D~ D~; opendir D~; read D/a",
        "rename D~ {f}~; rename D~ {d}/a~; opendir D~; read D/a",
        "rename D~ {T}; opendir D~",
        "rmdir {e}~; rename D~ {e}~; opendir {e}~; read {e}/a; read {e}/hidden",
        "rmtree {d}~; rename D~ {d}~; read {d}/a; opendir {d}/pop; opendir {d}~; read {d}/gone",
        "rmdir {d}/pop/c~; rename D~ {d}/pop/c~; opendir {d}/pop/c~; read {d}/pop/c/a",
        "rename D~ D/sub~; mkdir D/sub; rename D D/sub/x; opendir D",
        "rename D {nd}; mkdir D; opendir D; read D/a; read D/hidden; read {nd}/a; rmdir D; rename {nd} D; read D/a",
    ];
    let mut v = Vec::new();
    for (vname, pre, d) in [
        ("rename-empty-dir", "", "{e}"),
        ("rename-pop-dir", "", "{d}"),
        ("rename-new-dir", "mkdir {e}-new~;", "{e}-new"),
        (
            "rename-new-pop-dir",
            "mkdir {d}-new~; open {d}-new/a wc aaaa;",
            "{d}-new",
        ),
        ("rename-pop-subdir", "", "{d}/pop"),
    ] {
        for (i, t) in templates.iter().enumerate() {
            v.push(case(
                &format!("{vname}.{}", i + 1),
                &format!("{pre} {}", t.replace('D', d)),
            ));
        }
    }
    for (n, s) in [
        // rename-move-dir
        ("rename-move-dir.1", "rename {e}~ {d}~/{e}; rename {e}~ {d}~/{e}; opendir {d}/{e}~; opendir {e}~"),
        ("rename-move-dir.2", "rename {d}~ {e}~/{d}; rename {d}~ {e}~/{d}; opendir {e}/{d}; opendir {d}~; read {e}/{d}/a"),
        (
            "rename-move-dir.3",
            "rename {d}~ {d}x~; rename {d}~ {d}x~; rename {d}x~ {e}~/{d}; rename {d}x~ {e}~/{d}; opendir {d}~; opendir {d}x~; opendir {e}/{d}; read {e}/{d}/a",
        ),
        (
            "rename-move-dir.4",
            "rename {d}~ {e}~/{d}; rename {d}~ {e}~/{d}; rename {e}~/{d} {e}~/{d}x; rename {e}~/{d} {e}~/{d}x; opendir {d}~; opendir {e}/{d}; opendir {e}/{d}x; read {e}/{d}x/a",
        ),
        (
            "rename-move-dir.5",
            "rename {d}~ {e}~/{d}; rename {d}~ {e}~/{d}; rename {e}/{d}/pop {e}/pop; rename {e}/{d}/pop {e}/pop; opendir {d}~; opendir {e}/{d}; opendir {e}/{d}/pop; opendir {e}/pop; read {e}/{d}/a; read {e}/pop/b",
        ),
        (
            "rename-move-dir.6",
            "rename {d}~/pop {d}~/popx; rename {d}~/pop {d}~/popx; rename {d}~ {d}x~; rename {d}~ {d}x~; rename {d}x~ {e}~/{d}; rename {d}x~ {e}~/{d}; opendir {d}~; opendir {d}x~; opendir {e}/{d}; opendir {e}/{d}/pop; opendir {e}/{d}/popx; read {e}/{d}/a; read {e}/{d}/popx/b",
        ),
        (
            "rename-move-dir.7",
            "rename {d}~/pop {d}~/popx; rename {d}~/pop {d}~/popx; rename {d}~ {d}x~; rename {d}~ {d}x~; rename {d}x~/popx {e}~/popx; rename {d}x~/popx {e}~/popx; opendir {d}~; opendir {d}x~; opendir {d}x/pop; opendir {d}x/popx; opendir {e}~; opendir {e}/pop; opendir {e}/popx; read {d}x/a; read {e}/popx/b",
        ),
        ("rename-move-dir.8", "mkdir {e}-new~; rename {e}-new~ {e}/new~; opendir {e}-new~; opendir {e}/new~"),
        ("rename-move-dir.9", "mkdir {e}/new~; rename {e}/new~ {nd}~; opendir {e}/new~; opendir {nd}~"),
        (
            "rename-move-dir.10",
            "mkdir {e}/newp; mkdir {e}/newp/new~; rename {e}/newp/new~ {nd}~; opendir {e}/newp/new~; opendir {nd}~",
        ),
        (
            "rename-move-dir.11",
            "mkdir {e}/newp; mkdir {e}/newp/new~; rename {e}/newp {nd}~; opendir {e}/newp; opendir {e}/newp/new~; opendir {nd}~; opendir {nd}/new",
        ),
        (
            "rename-move-dir.12",
            "mkdir {e}/new~; rename {d}~ {e}/new~/{d}~; rename {d}~ {e}/new~/{d}~; opendir {e}/new/{d}~; opendir {d}~; read {e}/new/{d}/a",
        ),
        (
            "rename-move-dir.13",
            "rename {d}/pop {e}/p1; rename {e}/p1 {nd}; rename {nd} {d}/pop2; read {d}/pop2/b; opendir {d}/pop2/c; mkdir {d}/pop; opendir {d}/pop; rename {d}/pop2 {d}/pop; read {d}/pop/b",
        ),
        (
            "rename-move-dir.14",
            "rename {d} {e}/{d}; open {e}/{d}/new wc n; rename {e}/{d}/pop/c {e}/c; rename {e} {nd}; read {nd}/{d}/pop/b; opendir {nd}/c; read {nd}/{d}/gone",
        ),
        // rename-dir
        ("rename-dir.1", "rename {d}~ {e}~/x~; rename {d}~ {e}~/x~; opendir {e}/x~; opendir {d}~; read {e}/x/a"),
        (
            "rename-dir.2",
            "rename {d}~/pop~ {e}~/pop~; rename {d}~/pop~ {e}~/pop~; opendir {e}/pop~; opendir {d}/pop~; read {e}/pop/b",
        ),
        // rename-exdev: overlayfs without redirect_dir refuses these with
        // EXDEV; a union must do them as the native directory does.
        ("rename-exdev.1", "rename {e}~ {nd}~; opendir {nd}~; opendir {e}~"),
        ("rename-exdev.2", "rename {e}~ {d}~/{e}; opendir {d}/{e}; opendir {e}~"),
        ("rename-exdev.3", "rename {d}~ {nd}~; opendir {nd}~; opendir {d}~; read {nd}/a; read {d}/a"),
        ("rename-exdev.4", "rename {d}~ {e}~/{d}; opendir {e}/{d}; opendir {d}~; read {e}/{d}/a; read {d}/a"),
    ] {
        v.push(case(n, s));
    }
    v
}

#[test]
fn renames_of_directories() {
    run_suite("rename-dir", &dir_rename_cases(), &[]);
}

/// The circular renames of rename-mass-*: `ring` names `base{100+i}`,
/// the gap moving down `iter` times.
fn ring(base: &str, ring: i64, iter: i64) -> String {
    let mut s = String::new();
    let mut gap = ring - 1;
    for _ in 0..iter {
        let next = (gap - 1).rem_euclid(ring);
        s += &format!("rename {base}{} {base}{};", 100 + next, 100 + gap);
        gap = next;
    }
    s
}

fn file_rename_cases() -> Vec<Case> {
    let mut v: Vec<Case> = [
        (
            "rename-file.1",
            "rename {f}~ {nf}~; rename {f}~ {nf}~; rename {nf}~ {f}~; rename {nf}~ {f}~; read {f}~; read {nf}~",
        ),
        (
            "rename-file.2",
            "rename {f}~ {nf}~; unlink {f}~; rename {nf}~ {f}~; rename {nf}~ {f}~; read {f}~; unlink {f}~; unlink {f}~; read {f}~; read {nf}~",
        ),
        (
            "rename-file.3",
            "rename {f}~ {nf}~; rmdir {f}~; rename {nf}~ {f}~; rename {nf}~ {f}~; read {f}~; rmdir {f}~; read {f}~; read {nf}~",
        ),
        ("rename-file.4", "unlink {f}~; rename {f}~ {nf}~; unlink {f}~; unlink {nf}~"),
        ("rename-file.5", "rmdir {f}~; rename {f}~ {nf}~; rmdir {f}~; unlink {nf}~"),
        (
            "rename-file.6",
            "rename {f}~ {nf}~; rename {f}~ {nf}~; rename {nf}~ {nf}x~; rename {nf}~ {nf}x~; read {f}~; read {nf}~; read {nf}x~",
        ),
        ("rename-file.7", "rename {f}~ {d}/a~; rename {f}~ {d}/a~; read {f}~; read {d}/a~"),
        ("rename-file.8", "rename {f}~ {f}~; read {f}~"),
        ("rename-file.9", "rename {f}~ {e}~; rename {f}~ {d}~; read {f}~"),
        ("rename-file.10", "rename {f}~ {T}; read {f}~"),
        (
            "rename-file.11",
            "rename {f} {d}/pop/moved; read {d}/pop/moved; read {f}; rename {d}/pop/moved {f}; read {f}; read {d}/pop/moved",
        ),
        ("rename-file.12", "rename {ds} {nf}; read {nf}; readlink {nf}; rename {is} {d}/is; read {d}/is"),
        ("rename-file.13", "rename {rf} {f}; read {f}; read {rf}; rename {d}/a {d}/gone; read {d}/gone"),
        ("rename-file.14", "rename {pl} {nf}; read {nf}; open {nf} wc made; read no_no_foo100; readlink {nf}"),
    ]
    .iter()
    .map(|(n, s)| case(n, s))
    .collect();
    // rename-mass, rename-mass-2 .. -5, rename-mass-dir, rename-mass-sym.
    let mut mass = |name: &str, script: String| {
        let mut c = case(name, &script);
        c.k = 8;
        v.push(c);
    };
    let mut s = String::new();
    for j in 0..3 {
        for i in (100..104).rev() {
            s += &format!("rename foo{} foo{};", i + j, i + j + 1);
        }
    }
    for i in 100..104 {
        s += &format!("unlink foo{};", i + 3);
    }
    mass("rename-mass", s);
    let mut s = String::new();
    for i in 100..104 {
        s += &format!("rename foo{i} foo{i}_0;");
    }
    for j in 0..3 {
        for i in (100..104).rev() {
            s += &format!("rename foo{i}_{j} foo{i}_{};", j + 1);
        }
    }
    for i in 100..104 {
        s += &format!("unlink foo{i}_3;");
    }
    mass("rename-mass-2", s);
    let unlink_all = |base: &str| {
        (100..108)
            .map(|i| format!("unlink {base}{i};"))
            .collect::<String>()
    };
    mass("rename-mass-3", ring("foo", 7, 31) + &unlink_all("foo"));
    let mk: String = (0..7)
        .map(|i| format!("open no_foo{} wc abcd{i};", 100 + i))
        .collect();
    mass(
        "rename-mass-4",
        mk + &ring("no_foo", 7, 31) + &unlink_all("no_foo"),
    );
    let ln: String = (0..8)
        .map(|i| format!("link foo{} no_foo{};", 100 + i, 100 + i))
        .collect();
    let mut back = String::new();
    let mut gap = 6i64;
    for _ in 0..31 {
        let next = (gap + 1).rem_euclid(7);
        back += &format!("rename foo{} foo{};", 100 + next, 100 + gap);
        gap = next;
    }
    mass(
        "rename-mass-5",
        ln + &ring("no_foo", 7, 31) + &back + &unlink_all("no_foo") + &unlink_all("foo"),
    );
    let mkd: String = (0..6)
        .map(|i| format!("mkdir no_dir{};", 100 + i))
        .collect();
    let rmd: String = (100..107).map(|i| format!("rmdir no_dir{i};")).collect();
    mass(
        "rename-mass-dir.1",
        mkd.clone() + &ring("no_dir", 7, 31) + &rmd,
    );
    let pop: String = (0..6)
        .map(|i| format!("mkdir no_dir{0}; open no_dir{0}/a wc abcd{i};", 100 + i))
        .collect();
    let check: String = (100..107)
        .map(|i| format!("read no_dir{i}/a; unlink no_dir{i}/a; rmdir no_dir{i};"))
        .collect();
    mass("rename-mass-dir.2", pop + &ring("no_dir", 7, 31) + &check);
    mass(
        "rename-mass-dir.3",
        ring("dir", 7, 31)
            + &(100..108)
                .map(|i| format!("read dir{i}/a; read dir{i}/pop/b; rmtree dir{i};"))
                .collect::<String>(),
    );
    let chk: String = (100..108)
        .map(|i| format!("readlink direct_sym{i}; read direct_sym{i}; unlink direct_sym{i};"))
        .collect();
    mass("rename-mass-sym.1", ring("direct_sym", 7, 31) + &chk);
    let chk: String = (100..108)
        .map(|i| {
            format!("readlink direct_dir_sym{i}; opendir direct_dir_sym{i}; rmdir direct_dir_sym{i}; unlink direct_dir_sym{i};")
        })
        .collect();
    mass("rename-mass-sym.2", ring("direct_dir_sym", 7, 31) + &chk);
    v
}

#[test]
fn renames_of_files() {
    run_suite("rename-file", &file_rename_cases(), &[]);
}

fn removal_cases() -> Vec<Case> {
    [
        // rmdir
        ("rmdir.1", "rmdir {nd}~; rmdir {nd}~"),
        ("rmdir.2", "rmdir {nd}/sub~; rmdir {nd}/sub~"),
        ("rmdir.3", "rmdir {f}~; rmdir {f}~; read {f}"),
        ("rmdir.4", "rmdir {f}/sub~; read {f}"),
        ("rmdir.5", "rmdir {e}~; rmdir {e}~; rmdir {e}~/sub~"),
        ("rmdir.6", "rmdir {e}/sub~; rmdir {e}/sub~"),
        (
            "rmdir.7",
            "rmdir {d}~; read {d}~/a; unlink {d}~/a; read {d}~/a; unlink {d}~/a; rmtree {d}~; read {d}~/a",
        ),
        (
            "rmdir.8",
            "open {e}~/b wcx abcq; rmdir {e}~; unlink {e}~/b; read {e}~/b; unlink {e}~/b; rmtree {e}~; read {e}~/b",
        ),
        (
            "rmdir.9",
            "rmdir {d}~; read {d}~/a; open {d}~/a w abcd; read {d}~/a; unlink {d}~/a; read {d}~/a; unlink {d}~/a; rmtree {d}~; read {d}~/a",
        ),
        (
            "rmdir.10",
            "rmdir {d}~; read {d}~/a; rmdir {d}~; unlink {d}~/a; read {d}~/a; unlink {d}~/a; mkdir {d}~/a; mkdir {d}~/a; rmdir {d}~; rmdir {d}~/a; rmdir {d}~/a; rmtree {d}~; read {d}~/a",
        ),
        (
            "rmdir.11",
            "rmdir {d}~/pop/c~; rmdir {d}~/pop/c~; mkdir {d}~/pop/c~; mkdir {d}~/pop/c~; read {d}~/pop/b; rmtree {d}~; read {d}~/pop/b",
        ),
        ("rmdir.12", "rmdir {is}~; rmdir {is}~; rmdir {ds}~; rmdir {f}~; read {f}"),
        (
            "rmdir.13",
            "rmdir {dds}~; rmdir {d}~; read {dds}~/a; read {d}~/a; rmtree {d}~; read {dds}~/a; read {d}~/a",
        ),
        ("rmdir.14", "rmdir {ids}~; rmdir {dds}~; rmdir {d}~; read {ids}~/a; rmtree {d}~; read {ids}~/a"),
        ("rmdir.15", "rmdir {pl}~; rmdir {nf}~"),
        (
            "rmdir.16",
            "rmdir {e}~; rmdir {e}~; mkdir {e}~; open {e}~/b wcx abcq; rmdir {e}~; unlink {e}~/b; read {e}~/b; unlink {e}~/b; rmdir {e}~; opendir {e}",
        ),
        // Whiteouts and opaque directories of the lower branches.
        (
            "rmdir.17",
            "read {d}/gone; rmdir {d}; unlink {d}/a; rmtree {d}/pop; rmdir {d}; opendir {d}; mkdir {d}; opendir {d}; read {d}/gone; read {d}/a",
        ),
        (
            "rmdir.18",
            "read {e}/hidden; mkdir {e}/hidden; rmdir {e}/hidden; rmdir {e}; mkdir {e}; read {e}/hidden; open {e}/hidden wcx n; read {e}/hidden",
        ),
        // rmtree, rmtree-new
        ("rmtree.1", "rmtree {d}~; opendir {d}; read {d}/a"),
        ("rmtree-new.1", "mkdir {d}~/b; rmtree {d}~; opendir {d}"),
        ("rmtree.2", "rmtree {d}; mkdir {d}; mkdir {d}/pop; opendir {d}/pop; read {d}/pop/b; rmtree {d}; rmtree {e}; mkdir {e}; read {e}/hidden"),
        // unlink
        ("unlink.1", "unlink {f}~; read {f}~; unlink {f}~; read {f}~"),
        (
            "unlink.2",
            "read {ds}~; unlink {ds}~; read {ds}~; read {f}~; unlink {ds}~; read {ds}~; read {f}~",
        ),
        (
            "unlink.3",
            "read {is}~; unlink {is}~; read {is}~; read {ds}~; read {f}~; unlink {is}~; read {is}~; read {ds}~",
        ),
        ("unlink.4", "unlink {d}~; opendir {d}~; unlink {d}~"),
        (
            "unlink.5",
            "opendir {dds}~; unlink {dds}~; opendir {dds}~; opendir {d}~; unlink {dds}~; opendir {dds}~",
        ),
        ("unlink.6", "opendir {ids}~; unlink {ids}~; opendir {ids}~; opendir {dds}~; opendir {d}~; unlink {ids}~"),
        ("unlink.7", "unlink {nf}~; unlink {nf}~"),
        ("unlink.8", "unlink {pl}~; unlink {pl}~"),
        ("unlink.9", "unlink {f}; open {f} wc new; read {f}; unlink {f}; read {f}; symlink x {f}; readlink {f}; unlink {f}; mkdir {f}; opendir {f}; rmdir {f}; read {f}"),
        ("unlink.10", "unlink {d}/a; open {d}/a wcx x; unlink {d}/a; read {d}/a; rmtree {d}; open {d} wc file; read {d}; unlink {d}; mkdir {d}; read {d}/a; opendir {d}/pop"),
        // readlink
        (
            "readlink.1",
            "readlink {f}~; readlink {ds}~; readlink {is}~; readlink {d}~; readlink {dds}~; readlink {ids}~; readlink {nf}~; readlink {pl}~",
        ),
        // mkdir
        ("mkdir.1", "mkdir {nd}~; mkdir {nd}~"),
        ("mkdir.2", "mkdir {f}~; mkdir {f}~; read {f}"),
        ("mkdir.3", "mkdir {e}~"),
        ("mkdir.4", "mkdir {e}/sub~; mkdir {e}/sub~"),
        ("mkdir.5", "mkdir {d}~; read {d}~/a"),
        ("mkdir.6", "mkdir {d}/sub~; mkdir {d}/sub~; read {d}~/a"),
        ("mkdir.7", "mkdir {ds}~; mkdir {ds}~; mkdir {f}~; read {f}"),
        ("mkdir.8", "mkdir {is}~; mkdir {ds}~; mkdir {f}~; read {f}"),
        ("mkdir.9", "mkdir {dds}~; mkdir {d}~; read {dds}~/a; read {d}~/a"),
        ("mkdir.10", "mkdir {ids}~; mkdir {dds}~; mkdir {d}~; read {ids}~/a"),
        ("mkdir.11", "mkdir {pl}~; mkdir {pl}~"),
        // Symlinks made in the upper branch, to lower and copied-up objects.
        (
            "symlink-upper.1",
            "symlink {f} up; read up; open up wa X; read {f}; readlink up; unlink {f}; read up",
        ),
        (
            "symlink-upper.2",
            "open {f} wa X; read {ds}; read {is}; symlink {is} up2; read up2; rename {f} {nf}; read {ds}; read up2",
        ),
        (
            "symlink-upper.3",
            "symlink {T}/{d} updir; opendir updir~; read updir/a; mkdir updir/new; opendir {d}/new; rename updir/pop {d}/pop2; read {d}/pop2/b",
        ),
        // The deliberate difference: a 0/0 char device is a whiteout.
        ("mknod-whiteout.1", "mknod00 {nf}; read {nf}; mknod00 {d}/new; opendir {d}"),
    ]
    .iter()
    .map(|(n, s)| case(n, s))
    .collect()
}

#[test]
fn removals_whiteouts_and_opaque_directories() {
    run_suite("remove", &removal_cases(), &[]);
}

fn permission_cases() -> Vec<Case> {
    let mut v: Vec<Case> = [
        // impermissible
        (
            "impermissible.1",
            "bin:open {rf}~ wt; bin:open {rf}~ w; bin:read {rf}~; read {rf}~; open {rf}~ w shark; read {rf}~; bin:read {rf}~",
        ),
        (
            "impermissible.2",
            "bin:open {rf}~ w; bin:open {rf}~ w; bin:read {rf}~; read {rf}~; open {rf}~ w shark; read {rf}~; bin:read {rf}~",
        ),
        (
            "impermissible.3",
            "bin:open {rf}~ wa; bin:open {rf}~ wa; bin:read {rf}~; read {rf}~; open {rf}~ wa shark; read {rf}~; bin:read {rf}~",
        ),
        (
            "impermissible.4",
            "stat {rf}; bin:truncate {rf}~ 4; bin:truncate {rf}~ 4; stat {rf}; read {rf}~; truncate {rf}~ 4; stat {rf}; read {rf}~; bin:read {rf}~",
        ),
        ("impermissible.5", "bin:utimes {rf}~; bin:utimes {rf}~; stat {rf}; utimes {rf}~; read {rf}~"),
        // The caller may write the file but not its parent: copy-up works.
        (
            "impermissible.6",
            "bin:open {f}~ wa more; read {f}~; bin:truncate {f} 2; read {f}; bin:utimes {f}; bin:unlink {f}; bin:rename {f} {nf}; bin:mkdir {e}/x; bin:open {nf} wc; bin:link {f} {nf}; read {f}",
        ),
        (
            "impermissible.7",
            "nobody:open {f} w; nobody:read {f}; nobody:open {d}/a w; nobody:open {d}/pop/b b; nobody:utimes {d}/a; nobody:truncate {f} 0; nobody:read {rf}; read {f}",
        ),
        (
            "impermissible.8",
            "bin:open {ds} wa viasym; read {f}; bin:open {is} wt; read {f}; bin:open {dds}/a w; bin:mkdir {dds}/new; bin:unlink {dds}/a",
        ),
    ]
    .iter()
    .map(|(n, s)| case(n, s))
    .collect();
    // truncate
    for len in [0, 1, 4, 11, 12, 13, 28] {
        v.push(case(
            &format!("truncate.{len}"),
            &format!("stat {{f}}; truncate {{f}}~ {len}; stat {{f}}; read {{f}}; truncate {{d}}/pop/b {len}; read {{d}}/pop/b"),
        ));
    }
    v
}

#[test]
fn impermissible_operations_and_truncate() {
    run_suite("permission", &permission_cases(), &[]);
}
