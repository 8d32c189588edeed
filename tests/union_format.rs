//! chronofs's union formats against kernel overlayfs, both ways: layers
//! written by `union::format` mount as overlayfs and show what the markers
//! mean; changes made through an overlayfs mount leave markers that
//! `union::format` reads back, and `union::merge` lists those layers as the
//! kernel did. Needs root (mount, trusted.* xattrs, whiteout device nodes).

#![deny(unsafe_code)]

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use chronofs::sys;
use chronofs::union::format::{self, XattrNs};
use chronofs::union::merge;

const NS: XattrNs = XattrNs::Trusted;

/// An overlayfs mount, lazily unmounted however the test ends.
struct Overlay {
    mnt: PathBuf,
    mounted: bool,
}

impl Overlay {
    fn mount(base: &Path) -> Overlay {
        Overlay::mount_over(base, &[&dirs(base).0])
    }

    /// A mount of `base`'s upper directory over `lowers` (top first).
    fn mount_over(base: &Path, lowers: &[&Path]) -> Overlay {
        let (_, u, w, m) = dirs(base);
        fs::create_dir_all(&w).unwrap();
        fs::create_dir_all(&m).unwrap();
        let lowers: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},redirect_dir=on",
            lowers.join(":"),
            u.display(),
            w.display()
        );
        let out = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&m)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount -o {opts}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Overlay {
            mnt: m,
            mounted: true,
        }
    }

    fn unmount(&mut self) {
        let ok = Command::new("umount").arg(&self.mnt).status().unwrap();
        assert!(ok.success(), "umount {}", self.mnt.display());
        self.mounted = false;
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

fn dirs(base: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let j = |n: &str| base.join(n);
    (j("lower"), j("upper"), j("work"), j("merged"))
}

/// Whether this process can run the test; says why not when it cannot.
fn can_run() -> bool {
    if sys::geteuid() != 0 {
        eprintln!("union_format: skipped: needs root (mount, trusted.* xattrs, mknod)");
        return false;
    }
    let fss = fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fss.lines().any(|l| l.trim_end().ends_with("overlay")) {
        eprintln!("union_format: skipped: the kernel has no overlay file system");
        return false;
    }
    true
}

fn open(path: &Path) -> OwnedFd {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    sys::openat(sys::CWD, &c, libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap()
}

fn cname(name: &str) -> CString {
    CString::new(name).unwrap()
}

/// What `ls -A` shows.
fn ls(path: &Path) -> BTreeSet<String> {
    fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The names `merge` shows for a directory made of `layers`, top-down.
fn merged_names(layers: &[&Path]) -> BTreeSet<String> {
    let listings: Vec<merge::LayerListing> = layers
        .iter()
        .map(|p| merge::read_layer(open(p).as_fd(), NS).unwrap())
        .collect();
    merge::merge(&listings)
        .into_iter()
        .skip(2) // `.` and `..`
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn write(path: &Path, data: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, data).unwrap();
}

/// Layers written with `union::format`; the kernel shows what they mean.
#[test]
fn overlayfs_reads_chronofs_markers() {
    if !can_run() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let (l, u, _, _) = dirs(base.path());
    write(&l.join("keep"), "lower keep");
    write(&l.join("gone"), "whited out");
    write(&l.join("opq/old"), "hidden by opaque");
    write(&l.join("src/inner"), "followed through redirect");
    write(&u.join("opq/new"), "upper new");
    write(&l.join("file_both"), "lower copy");
    write(&u.join("file_both"), "upper copy");
    write(&l.join("dir_both/low"), "lower entry");
    fs::create_dir_all(u.join("dir_both")).unwrap();
    let dir_both = open(&u.join("dir_both"));
    format::make_whiteout(dir_both.as_fd(), &cname("low")).unwrap();
    fs::create_dir_all(u.join("moved")).unwrap();
    let upper = open(&u);
    format::make_whiteout(upper.as_fd(), &cname("gone")).unwrap();
    format::make_whiteout(upper.as_fd(), &cname("src")).unwrap();
    format::set_opaque(open(&u.join("opq")).as_fd(), NS).unwrap();
    format::set_redirect(open(&u.join("moved")).as_fd(), NS, b"/src").unwrap();
    format::replace_with_whiteout(upper.as_fd(), &cname("file_both")).unwrap();
    format::replace_with_whiteout(upper.as_fd(), &cname("dir_both")).unwrap();
    assert_eq!(
        ls(&u),
        set(&["dir_both", "file_both", "gone", "moved", "opq", "src"])
    );

    let ov = Overlay::mount(base.path());
    let m = ov.mnt.clone();
    assert_eq!(ls(&m), set(&["keep", "moved", "opq"]));
    assert_eq!(ls(&m.join("opq")), set(&["new"]));
    assert_eq!(ls(&m.join("moved")), set(&["inner"]));
    let inner = fs::read_to_string(m.join("moved/inner")).unwrap();
    assert_eq!(inner, "followed through redirect");
    let gone = fs::symlink_metadata(m.join("gone")).unwrap_err();
    assert_eq!(gone.raw_os_error(), Some(libc::ENOENT));
    assert_no_overlay_xattrs(&m.join("opq"));

    // merge over the same layers agrees with the kernel.
    assert_eq!(merged_names(&[&u, &l]), ls(&m));
    assert_eq!(
        merged_names(&[&u.join("opq"), &l.join("opq")]),
        set(&["new"])
    );
    assert_eq!(
        merged_names(&[&u.join("moved"), &l.join("src")]),
        set(&["inner"])
    );
}

/// overlayfs hides its markers from users; `is_overlay_xattr` names the
/// same set, so chronofs can do likewise.
fn assert_no_overlay_xattrs(path: &Path) {
    let fd = open(path);
    let shown = sys::xattrs_of(fd.as_fd()).unwrap();
    assert!(shown
        .iter()
        .all(|(name, _)| !format::is_overlay_xattr(name, NS)));
}

/// Changes made through the kernel; `union::format` reads its markers.
#[test]
fn chronofs_reads_overlayfs_markers() {
    if !can_run() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let (l, u, _, _) = dirs(base.path());
    write(&l.join("del"), "to delete");
    write(&l.join("stay"), "stays");
    write(&l.join("dir1/old"), "rmdir'd");
    write(&l.join("ren/child"), "moves with its dir");
    write(&l.join("sub/sibling"), "in the target dir");
    write(&l.join("same/x"), "renamed in place");
    fs::create_dir_all(&u).unwrap();

    let mut ov = Overlay::mount(base.path());
    let m = ov.mnt.clone();
    fs::remove_file(m.join("del")).unwrap();
    fs::remove_dir_all(m.join("dir1")).unwrap();
    write(&m.join("dir1/fresh"), "new");
    fs::rename(m.join("ren"), m.join("sub/ren2")).unwrap();
    fs::rename(m.join("same"), m.join("same2")).unwrap();
    let seen = [
        ls(&m),
        ls(&m.join("dir1")),
        ls(&m.join("sub")),
        ls(&m.join("sub/ren2")),
        ls(&m.join("same2")),
    ];
    assert_eq!(seen[0], set(&["dir1", "same2", "stay", "sub"]));
    ov.unmount();

    let wh = |p: &Path| format::is_whiteout(&sys::fstat(open(p).as_fd()).unwrap());
    assert!(wh(&u.join("del")));
    assert!(wh(&u.join("ren")), "a moved lower dir leaves a whiteout");
    assert!(wh(&u.join("same")));
    assert!(!wh(&u.join("dir1")));
    let opaque = |p: &Path| format::is_opaque(open(p).as_fd(), NS).unwrap();
    assert!(opaque(&u.join("dir1")));
    assert!(!opaque(&u.join("sub")));
    let redirect = |p: &Path| format::redirect(open(p).as_fd(), NS).unwrap();
    assert_eq!(redirect(&u.join("sub/ren2")).as_deref(), Some(&b"/ren"[..]));
    assert_eq!(redirect(&u.join("sub")), None);
    // Within one directory overlayfs stores the bare old name.
    assert_eq!(redirect(&u.join("same2")).as_deref(), Some(&b"same"[..]));

    assert_eq!(merged_names(&[&u, &l]), seen[0]);
    assert_eq!(merged_names(&[&u.join("dir1"), &l.join("dir1")]), seen[1]);
    assert_eq!(merged_names(&[&u.join("sub"), &l.join("sub")]), seen[2]);
    // The caller follows the redirect to find the lower layer.
    assert_eq!(
        merged_names(&[&u.join("sub/ren2"), &l.join("ren")]),
        seen[3]
    );
    assert_eq!(merged_names(&[&u.join("same2"), &l.join("same")]), seen[4]);
    assert_eq!(seen[3], set(&["child"]));
}

/// The xattr form of a whiteout (a lower layer built by a tool that cannot
/// make device nodes): the kernel hides the name, and so does `merge`.
#[test]
fn xattr_whiteouts_hide_like_the_kernel() {
    if !can_run() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let (l1, l2) = (base.path().join("l1"), base.path().join("l2"));
    write(&l2.join("d/f"), "hidden");
    write(&l2.join("d/k"), "kept");
    write(&l1.join("d/f"), "");
    write(&l1.join("d/notwh"), "");
    fs::create_dir_all(dirs(base.path()).1).unwrap();
    let f = open(&l1.join("d/f"));
    sys::setxattr_fd(f.as_fd(), NS.whiteout(), b"", 0).unwrap();
    sys::setxattr_fd(open(&l1.join("d")).as_fd(), NS.opaque(), b"x", 0).unwrap();

    let ov = Overlay::mount_over(base.path(), &[&l1, &l2]);
    let seen = ls(&ov.mnt.join("d"));
    assert_eq!(seen, set(&["k", "notwh"]));
    assert_eq!(merged_names(&[&l1.join("d"), &l2.join("d")]), seen);
}
