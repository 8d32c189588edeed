//! Merging the listings of a directory's layers into one, with offsets
//! that survive a reopen.
//!
//! **Merge rule** (overlayfs's): layers are given top-down; a name appears
//! once, from the topmost layer holding it; a whiteout hides the name in
//! every layer below and is never shown; an opaque layer's directory hides
//! all layers below it (its own entries still count). Choosing *which*
//! layers make up a directory (a non-directory in a middle layer ends the
//! stack, a redirect points elsewhere) is the caller's: [`merge`] takes the
//! stack as given.
//!
//! **Order and cookies** (ext4 `dir_index` style). Each name has a position:
//! a 63-bit hash of its bytes ([`name_position`]). The listing is sorted by
//! (position, name), and an entry's `d_off` is the position of the next
//! entry with a *greater* position ([`END`] after the last). A reader who
//! reopens the directory and seeks to a `d_off` resumes with every entry
//! whose position is at or past it: no entry present in both listings is
//! repeated or skipped, whatever was added or removed meanwhile.
//!
//! The hash is part of the on-wire contract (cookies outlive the daemon in
//! NFS exports and in programs that keep a `telldir` value): BLAKE3 keyed
//! with the constant [`COOKIE_KEY`], the first 8 bytes little-endian,
//! shifted right once, clamped into `[FIRST_NAME_POS, END - 1]`. Changing
//! any of that breaks every cookie handed out before.
//!
//! **Collisions.** Entries sharing a position carry the same `d_off` (the
//! next position), so a reply must never stop inside such a group:
//! [`group_end`] says where the group starting at an index ends, and the
//! caller sends a group whole or not at all. With 63-bit positions a group
//! of more than one entry is rare, and at most a few entries long.
//!
//! **`.` and `..`** are not taken from the layers (their inode numbers are
//! the layer directories', not the union's). The merged listing always
//! starts with them, at positions [`DOT_POS`] (0, the start) and
//! [`DOTDOT_POS`], with `ino` 0 and `layer` `None`: the caller fills in
//! the inode numbers it shows, or skips them by starting at index 2.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use super::format::{self, Opacity, XattrNs};
use crate::sys;

/// One entry of one layer's directory, as read from disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerEntry {
    pub name: Vec<u8>,
    /// `DT_*`.
    pub dtype: u8,
    /// The inode number in the layer's file system.
    pub ino: u64,
    pub whiteout: bool,
}

/// One layer's directory: its entries and whether it hides the layers below.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerListing {
    pub entries: Vec<LayerEntry>,
    pub opaque: bool,
}

/// One entry of the merged listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedEntry {
    pub name: Vec<u8>,
    pub dtype: u8,
    /// The backing inode number in `layer`; 0 for `.` and `..`.
    pub ino: u64,
    /// Index (top-down) of the layer the entry comes from; `None` for `.`
    /// and `..`.
    pub layer: Option<usize>,
    /// This entry's position: seeking to it starts here.
    pub pos: i64,
    /// The cookie that resumes after this entry (and its collision group).
    pub d_off: i64,
}

/// Position of `.`: offset 0 is "from the start".
pub const DOT_POS: i64 = 0;
pub const DOTDOT_POS: i64 = 1;
/// The lowest position a name can hash to.
pub const FIRST_NAME_POS: i64 = 2;
/// The `d_off` of the last entry: past every position.
pub const END: i64 = i64::MAX;
/// The BLAKE3 key of [`name_position`]. Part of the on-wire contract.
pub const COOKIE_KEY: [u8; 32] = *b"chronofs union readdir cookie v1";

/// A name's position in every merged listing, in every process and
/// version: see the module doc.
pub fn name_position(name: &[u8]) -> i64 {
    let hash = blake3::keyed_hash(&COOKIE_KEY, name);
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    let h = (u64::from_le_bytes(first) >> 1) as i64;
    h.clamp(FIRST_NAME_POS, END - 1)
}

/// The merged listing of `layers` (top-down), `.` and `..` first.
pub fn merge(layers: &[LayerListing]) -> Vec<MergedEntry> {
    merge_by(layers, name_position)
}

fn merge_by(layers: &[LayerListing], position: impl Fn(&[u8]) -> i64) -> Vec<MergedEntry> {
    let mut entries: Vec<MergedEntry> = visible(layers)
        .into_iter()
        .map(|(layer, e)| MergedEntry {
            name: e.name.clone(),
            dtype: e.dtype,
            ino: e.ino,
            layer: Some(layer),
            pos: position(&e.name),
            d_off: END,
        })
        .collect();
    entries.sort_by(|a, b| (a.pos, &a.name).cmp(&(b.pos, &b.name)));
    let mut all = vec![dot(b".", DOT_POS), dot(b"..", DOTDOT_POS)];
    all.append(&mut entries);
    link_offsets(&mut all);
    all
}

/// The entry each name resolves to, with its layer index, in no order.
fn visible(layers: &[LayerListing]) -> Vec<(usize, &LayerEntry)> {
    // The topmost layer holding a name decides it, a whiteout included.
    let mut decided: HashMap<&[u8], Option<(usize, &LayerEntry)>> = HashMap::new();
    for (i, layer) in layers.iter().enumerate() {
        for e in layer.entries.iter().filter(|e| !format::is_dot(&e.name)) {
            let shown = (!e.whiteout).then_some((i, e));
            decided.entry(&e.name).or_insert(shown);
        }
        if layer.opaque {
            break;
        }
    }
    decided.into_values().flatten().collect()
}

fn dot(name: &[u8], pos: i64) -> MergedEntry {
    MergedEntry {
        name: name.to_vec(),
        dtype: libc::DT_DIR,
        ino: 0,
        layer: None,
        pos,
        d_off: END,
    }
}

/// Sets each `d_off` to the next greater position, so a group sharing a
/// position resumes past the whole group.
fn link_offsets(entries: &mut [MergedEntry]) {
    let mut next = END;
    for i in (0..entries.len()).rev() {
        entries[i].d_off = next;
        if i > 0 && entries[i - 1].pos != entries[i].pos {
            next = entries[i].pos;
        }
    }
}

/// The index of the first entry at or past `cookie` (a `d_off` handed out
/// earlier, or 0 for the start); `merged.len()` when none is.
pub fn seek(merged: &[MergedEntry], cookie: i64) -> usize {
    merged.partition_point(|e| e.pos < cookie)
}

/// The index just past the collision group starting at `i`: a reply holds
/// `merged[i..group_end(merged, i)]` whole or none of it.
pub fn group_end(merged: &[MergedEntry], i: usize) -> usize {
    let Some(first) = merged.get(i) else {
        return merged.len();
    };
    i + merged[i..]
        .iter()
        .take_while(|e| e.pos == first.pos)
        .count()
}

/// Reads one layer's directory: its entries, whiteouts marked, and its
/// opacity. `dir_fd` may be an `O_PATH` handle; the directory is reopened
/// so the caller's descriptor keeps its position. Only entries the file
/// system types `DT_CHR` or `DT_UNKNOWN` cost a stat (plus empty regular
/// files in a directory marked for xattr whiteouts). `.`, `..` and
/// `format`'s temporaries are left out.
pub fn read_layer(dir_fd: BorrowedFd<'_>, ns: XattrNs) -> io::Result<LayerListing> {
    let opacity = format::opacity(dir_fd, ns)?;
    let dir = sys::reopen_dir(dir_fd, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let mut buf = sys::DirBuf::new(64 * 1024);
    let mut entries = Vec::new();
    loop {
        let batch = sys::getdents(dir.as_fd(), &mut buf)?;
        if batch.is_empty() {
            break;
        }
        for e in batch {
            if format::is_dot(&e.name) || format::is_temporary(&e.name) {
                continue;
            }
            if let Some(entry) = classify(dir.as_fd(), e, opacity, ns)? {
                entries.push(entry);
            }
        }
    }
    let opaque = opacity == Opacity::Opaque;
    Ok(LayerListing { entries, opaque })
}

/// The layer entry for one raw entry; `None` if it vanished meanwhile.
fn classify(
    dir: BorrowedFd<'_>,
    e: sys::DirEntry,
    opacity: Opacity,
    ns: XattrNs,
) -> io::Result<Option<LayerEntry>> {
    let xattr_form = opacity == Opacity::XattrWhiteouts && e.dtype == libc::DT_REG;
    let mut entry = LayerEntry {
        dtype: e.dtype,
        ino: e.ino,
        whiteout: false,
        name: e.name,
    };
    if !(xattr_form || matches!(e.dtype, libc::DT_CHR | libc::DT_UNKNOWN)) {
        return Ok(Some(entry));
    }
    let cname = CString::new(entry.name.clone()).map_err(|_| errno(libc::EINVAL))?;
    let st = match sys::fstatat(dir, &cname) {
        Ok(st) => st,
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(err) => return Err(err),
    };
    entry.dtype = dtype_of(st.st_mode);
    entry.whiteout = format::is_whiteout(&st)
        || (opacity == Opacity::XattrWhiteouts && xattr_whiteout(dir, &cname, &st, ns)?);
    Ok(Some(entry))
}

fn xattr_whiteout(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    st: &sys::Stat,
    ns: XattrNs,
) -> io::Result<bool> {
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size != 0 {
        return Ok(false);
    }
    let fd = sys::open_path(dir, name)?;
    format::is_xattr_whiteout(fd.as_fd(), st, ns)
}

fn dtype_of(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFREG => libc::DT_REG,
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        libc::S_IFIFO => libc::DT_FIFO,
        libc::S_IFSOCK => libc::DT_SOCK,
        _ => libc::DT_UNKNOWN,
    }
}

fn errno(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};
    use std::os::fd::OwnedFd;
    use std::os::unix::ffi::OsStrExt;

    fn entry(name: &str, whiteout: bool) -> LayerEntry {
        LayerEntry {
            name: name.as_bytes().to_vec(),
            dtype: if whiteout { libc::DT_CHR } else { libc::DT_REG },
            ino: name.len() as u64,
            whiteout,
        }
    }

    fn layer(names: &[(&str, bool)], opaque: bool) -> LayerListing {
        LayerListing {
            entries: names.iter().map(|(n, w)| entry(n, *w)).collect(),
            opaque,
        }
    }

    fn names(merged: &[MergedEntry]) -> BTreeMap<String, Option<usize>> {
        merged
            .iter()
            .map(|e| (String::from_utf8_lossy(&e.name).into_owned(), e.layer))
            .collect()
    }

    /// Positions are part of the on-wire contract: these values must never
    /// change.
    #[test]
    fn positions_are_pinned() {
        let pinned: Vec<i64> = [&b"a"[..], b"hello.txt", b""]
            .iter()
            .map(|n| name_position(n))
            .collect();
        assert_eq!(pinned, PINNED);
    }

    const PINNED: [i64; 3] = [7652962853156371762, 1233036867327394831, 437072257434060450];

    #[test]
    fn whiteouts_and_opaque_layers_hide_what_is_below() {
        let layers = [
            layer(&[("top", false), ("gone", true), (".", false)], false),
            layer(&[("gone", false), ("mid", false), ("top", false)], true),
            layer(&[("below", false)], false),
        ];
        let merged = merge(&layers);
        let want: BTreeMap<String, Option<usize>> = [
            (".", None),
            ("..", None),
            ("mid", Some(1)),
            ("top", Some(0)),
        ]
        .into_iter()
        .map(|(n, l)| (n.to_string(), l))
        .collect();
        assert_eq!(names(&merged), want);
        assert_eq!(merged.len(), 4);
        assert_eq!((merged[0].name.as_slice(), merged[0].d_off), (&b"."[..], 1));
        assert_eq!(merged[1].d_off, merged[2].pos);
        assert_eq!(merged[3].d_off, END);
        assert_eq!(seek(&merged, 0), 0);
        assert_eq!(seek(&merged, END), merged.len());
    }

    #[test]
    fn collision_groups_share_their_resume_point() {
        let layers = [layer(&[("a", false), ("b", false), ("cc", false)], false)];
        let merged = merge_by(&layers, |n| FIRST_NAME_POS + n.len() as i64);
        let offs: Vec<i64> = merged.iter().map(|e| e.d_off).collect();
        assert_eq!(offs, [1, 3, 4, 4, END]);
        assert_eq!(group_end(&merged, 2), 4);
        assert_eq!(group_end(&merged, 4), 5);
        assert_eq!(group_end(&merged, 5), 5);
        assert_eq!(seek(&merged, 4), 4);
    }

    /// overlayfs's rule, stated directly.
    fn model(layers: &[LayerListing]) -> BTreeMap<Vec<u8>, usize> {
        let all: BTreeSet<&Vec<u8>> = layers
            .iter()
            .flat_map(|l| l.entries.iter().map(|e| &e.name))
            .collect();
        let mut out = BTreeMap::new();
        for name in all {
            for (i, l) in layers.iter().enumerate() {
                if let Some(e) = l.entries.iter().find(|e| &e.name == name) {
                    if !e.whiteout {
                        out.insert(name.clone(), i);
                    }
                    break;
                }
                if l.opaque {
                    break;
                }
            }
        }
        out
    }

    fn layers_strategy() -> impl Strategy<Value = Vec<LayerListing>> {
        let one = (
            prop::collection::btree_map("[a-f]{1,2}", any::<bool>(), 0..12),
            prop::bool::weighted(0.2),
        )
            .prop_map(|(m, opaque)| LayerListing {
                entries: m.into_iter().map(|(n, w)| entry(&n, w)).collect(),
                opaque,
            });
        prop::collection::vec(one, 1..5)
    }

    fn check_links(merged: &[MergedEntry]) {
        for w in merged.windows(2) {
            assert!((w[0].pos, &w[0].name) < (w[1].pos, &w[1].name));
        }
        for (i, e) in merged.iter().enumerate() {
            let next = merged[i..].iter().find(|n| n.pos > e.pos);
            assert_eq!(e.d_off, next.map_or(END, |n| n.pos));
            assert!(e.d_off >= 1);
        }
    }

    proptest! {
        #[test]
        fn merge_matches_the_model(layers in layers_strategy()) {
            let merged = merge(&layers);
            prop_assert_eq!(&merged[0].name, b".");
            prop_assert_eq!(&merged[1].name, b"..");
            let got: BTreeMap<Vec<u8>, usize> = merged[2..]
                .iter()
                .map(|e| (e.name.clone(), e.layer.unwrap_or(usize::MAX)))
                .collect();
            prop_assert_eq!(got.len(), merged.len() - 2, "names unique");
            prop_assert_eq!(got, model(&layers));
            check_links(&merged);
            // Input order does not matter.
            let mut shuffled = layers.clone();
            for l in &mut shuffled {
                l.entries.reverse();
            }
            prop_assert_eq!(merge(&shuffled), merged);
        }

        #[test]
        fn resuming_at_a_cookie_repeats_and_skips_nothing(
            before in prop::collection::btree_set("[a-h]{1,3}", 0..40),
            added in prop::collection::btree_set("[a-h]{1,3}", 0..10),
            removed in prop::collection::btree_set("[a-h]{1,3}", 0..10),
            cut in 0usize..50,
            collide in any::<bool>(),
        ) {
            let after: BTreeSet<String> =
                before.difference(&removed).chain(added.iter()).cloned().collect();
            let listing = |set: &BTreeSet<String>| {
                let l = LayerListing {
                    entries: set.iter().map(|n| entry(n, false)).collect(),
                    opaque: false,
                };
                if collide {
                    merge_by(&[l], |n| FIRST_NAME_POS + i64::from(n[0] % 3))
                } else {
                    merge(&[l])
                }
            };
            let (a, b) = (listing(&before), listing(&after));
            // A reply ends at a group boundary, as the caller must.
            let mut k = 0;
            while k < cut.min(a.len()) {
                k = group_end(&a, k);
            }
            let cookie = if k == 0 { 0 } else { a[k - 1].d_off };
            let shown: Vec<&[u8]> = a[..k].iter().map(|e| e.name.as_slice()).collect();
            let rest: Vec<&[u8]> = b[seek(&b, cookie)..].iter().map(|e| e.name.as_slice()).collect();
            let shown_set: BTreeSet<&[u8]> = shown.iter().copied().collect();
            for n in &rest {
                prop_assert!(!shown_set.contains(n), "{:?} repeated", n);
            }
            let both = before.intersection(&after).map(|s| s.as_bytes());
            for n in both.chain([&b"."[..], b".."]) {
                prop_assert!(shown_set.contains(n) || rest.contains(&n), "{:?} skipped", n);
            }
        }
    }

    fn open_dir(path: &std::path::Path) -> OwnedFd {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        sys::openat(sys::CWD, &c, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap()
    }

    #[test]
    fn read_layer_marks_whiteouts_and_opacity() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("f"), b"x").unwrap();
        std::fs::create_dir(p.join("d")).unwrap();
        let fd = open_dir(p);
        let ns = XattrNs::for_daemon();
        let root = sys::geteuid() == 0;
        if root {
            format::make_whiteout(fd.as_fd(), c"w").unwrap();
            format::make_whiteout(fd.as_fd(), c".chronofs-wh.1.1").unwrap();
            format::set_opaque(fd.as_fd(), ns).unwrap();
        }
        let mut got = read_layer(fd.as_fd(), ns).unwrap();
        got.entries.sort_by(|a, b| a.name.cmp(&b.name));
        let summary: Vec<(&[u8], u8, bool)> = got
            .entries
            .iter()
            .map(|e| (e.name.as_slice(), e.dtype, e.whiteout))
            .collect();
        let mut want = vec![
            (&b"d"[..], libc::DT_DIR, false),
            (b"f", libc::DT_REG, false),
        ];
        if root {
            want.push((b"w", libc::DT_CHR, true));
        }
        assert_eq!(summary, want);
        assert_eq!(got.opaque, root);
    }

    #[test]
    fn read_layer_sees_xattr_whiteouts_only_where_marked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("xw"), b"").unwrap();
        let fd = open_dir(p);
        let ns = XattrNs::for_daemon();
        let f = sys::open_path(fd.as_fd(), c"xw").unwrap();
        if sys::setxattr_fd(f.as_fd(), ns.whiteout(), b"", 0).is_err() {
            return;
        }
        assert!(!read_layer(fd.as_fd(), ns).unwrap().entries[0].whiteout);
        sys::setxattr_fd(fd.as_fd(), ns.opaque(), b"x", 0).unwrap();
        let got = read_layer(fd.as_fd(), ns).unwrap();
        assert!(got.entries[0].whiteout);
        assert!(!got.opaque);
    }
}
