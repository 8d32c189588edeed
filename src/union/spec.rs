//! The branch list of a union mount: `BR1[=rw|=ro]:BR2[=rw|=ro]:...`, and
//! the `-o create=` / `-o delete=` policies that choose among its branches.
//!
//! # Syntax
//!
//! Branches are separated by `:`; the leftmost has the highest precedence
//! (it hides the same name further right). Each may end in `=rw` or `=ro`.
//!
//! - **Default modes**: the first branch is `rw`, every other one `ro`, as
//!   in unionfs-fuse: `chronofs mount top:lower MNT` is the usual overlay.
//!   Any number of branches may be `=rw`; one with none makes a read-only
//!   mount (changes fail with EROFS), which is not an error here
//!   ([`UnionSpec::has_rw`]).
//! - **Today's single SRC**: an argument with no `:` and no `=` is one
//!   read-write branch taken byte for byte (no escapes), exactly what
//!   `chronofs mount SRC MNT` has always meant.
//! - **Escapes** (only in an argument that has a `:` or `=`): `\:` is a `:`
//!   and `\=` a `=` inside a path, `\\` a backslash. A backslash before any
//!   other byte is refused rather than guessed at, so a path is never
//!   silently changed. The mode is what follows the last unescaped `=`.
//! - Paths are bytes (`OsStr`): non-UTF-8 names work; messages show them
//!   lossily.
//!
//! # Validation
//!
//! [`UnionSpec::parse`] checks each branch alone (it exists, is a
//! directory) and canonicalises it. [`UnionSpec::validate`] checks the
//! branches against each other and the mount point, by `(dev, ino)` rather
//! than by path so that bind mounts and symlinks cannot hide a repeat or a
//! nesting: no branch twice, none inside another, none inside the mount
//! point, the mount point inside none. The mount point may be the *top*
//! branch (the daemon opens every branch before the mount covers it, as for
//! today's `MNT = SRC`): users of that directory then keep seeing all they
//! saw, with the lower branches added beneath. A lower branch as mount
//! point is refused, since a higher branch could hide the directory's own
//! files from the very path they were at.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Whether changes may be made in a branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Rw,
    Ro,
}

impl Mode {
    pub fn is_writable(self) -> bool {
        self == Mode::Rw
    }

    fn from_bytes(b: &[u8]) -> Option<Mode> {
        match b {
            b"rw" => Some(Mode::Rw),
            b"ro" => Some(Mode::Ro),
            _ => None,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Rw => "rw",
            Mode::Ro => "ro",
        })
    }
}

/// One branch: a canonical directory path and its mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchSpec {
    path: PathBuf,
    mode: Mode,
    /// Identity at parse time: repeats and nesting are judged on it.
    dev: u64,
    ino: u64,
}

impl BranchSpec {
    /// Canonical (absolute, no symlinks, no `..`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn dev_ino(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// The branches of a mount, highest precedence first. Never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnionSpec {
    branches: Vec<BranchSpec>,
}

/// A bad branch list or policy; each message is one line and names the
/// offending branch by its position (1 = leftmost) and path.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("no branch given")]
    NoBranch,
    #[error("branch {index} is empty (two ':' in a row, or ':' at either end)")]
    Empty { index: usize },
    #[error("branch {index} ({given}): a '\\' must be followed by ':', '=' or '\\'")]
    BadEscape { index: usize, given: String },
    #[error(
        "branch {index} ({given}): unknown mode '={mode}' (expected =rw or =ro; write '\\=' for a '=' in a path)"
    )]
    UnknownMode {
        index: usize,
        given: String,
        mode: String,
    },
    #[error("branch {index} ({given}) does not exist")]
    NotFound { index: usize, given: String },
    #[error("branch {index} ({given}): {source}")]
    Inaccessible {
        index: usize,
        given: String,
        source: io::Error,
    },
    #[error("branch {index} ({given}) is not a directory")]
    NotADirectory { index: usize, given: String },
    #[error("branch {index} ({path}) is branch {first} again")]
    Repeated {
        index: usize,
        path: String,
        first: usize,
    },
    #[error("branch {index} ({path}) lies inside branch {outer} ({outer_path})")]
    Inside {
        index: usize,
        path: String,
        outer: usize,
        outer_path: String,
    },
    #[error("branch {index} ({path}) contains branch {inner} ({inner_path})")]
    Contains {
        index: usize,
        path: String,
        inner: usize,
        inner_path: String,
    },
    #[error("branch {index} ({path}) lies inside the mount point {mnt}")]
    InsideMount {
        index: usize,
        path: String,
        mnt: String,
    },
    #[error(
        "mount point {mnt} lies inside branch {index} ({path}): the mount would contain itself"
    )]
    MountInside {
        index: usize,
        path: String,
        mnt: String,
    },
    #[error(
        "mount point {mnt} is branch {index}, a lower branch: only the top branch (branch 1) may be mounted over"
    )]
    MountOverLower { index: usize, mnt: String },
    #[error("mount point {mnt}: {source}")]
    MountPoint { mnt: String, source: io::Error },
    #[error("option {key}={value}: expected {expected}")]
    Policy {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl SpecError {
    /// Whether the list is malformed as written (a usage error), rather
    /// than naming branches that cannot be used.
    pub fn is_syntax(&self) -> bool {
        matches!(
            self,
            SpecError::NoBranch
                | SpecError::Empty { .. }
                | SpecError::BadEscape { .. }
                | SpecError::UnknownMode { .. }
                | SpecError::Policy { .. }
        )
    }
}

fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

fn show_path(p: &Path) -> String {
    p.display().to_string()
}

/// One element of the list as written, before any file system access.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Element {
    path: Vec<u8>,
    mode: Option<Mode>,
}

/// Splits the argument into elements: pure syntax, no file system access.
fn split(arg: &[u8]) -> Result<Vec<Element>, SpecError> {
    if arg.is_empty() {
        return Err(SpecError::NoBranch);
    }
    if !arg.iter().any(|&b| b == b':' || b == b'=') {
        return Ok(vec![Element {
            path: arg.to_vec(),
            mode: None,
        }]);
    }
    let mut out = Vec::new();
    let mut path = Vec::new();
    // Where the last unescaped '=' of this element fell in `path`.
    let mut eq: Option<usize> = None;
    let mut raw_start = 0;
    let mut i = 0;
    loop {
        let index = out.len() + 1;
        let at_end = i == arg.len();
        if at_end || arg[i] == b':' {
            let raw = &arg[raw_start..i];
            out.push(element(index, raw, std::mem::take(&mut path), eq.take())?);
            if at_end {
                return Ok(out);
            }
            i += 1;
            raw_start = i;
            continue;
        }
        match arg[i] {
            b'\\' => match arg.get(i + 1) {
                Some(&c @ (b':' | b'=' | b'\\')) => {
                    path.push(c);
                    i += 2;
                }
                _ => {
                    let end = arg[i..]
                        .iter()
                        .position(|&b| b == b':')
                        .map_or(arg.len(), |p| i + p);
                    return Err(SpecError::BadEscape {
                        index,
                        given: show(&arg[raw_start..end]),
                    });
                }
            },
            b'=' => {
                eq = Some(path.len());
                path.push(b'=');
                i += 1;
            }
            c => {
                path.push(c);
                i += 1;
            }
        }
    }
}

fn element(
    index: usize,
    raw: &[u8],
    mut path: Vec<u8>,
    eq: Option<usize>,
) -> Result<Element, SpecError> {
    let mode = match eq {
        None => None,
        Some(at) => {
            let m = &path[at + 1..];
            let mode = Mode::from_bytes(m).ok_or_else(|| SpecError::UnknownMode {
                index,
                given: show(raw),
                mode: show(m),
            })?;
            path.truncate(at);
            Some(mode)
        }
    };
    if path.is_empty() {
        return Err(SpecError::Empty { index });
    }
    Ok(Element { path, mode })
}

/// The inverse of `split` for a list with a mode on every element.
fn join_elements(elements: &[Element]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, el) in elements.iter().enumerate() {
        if i > 0 {
            out.push(b':');
        }
        for &c in &el.path {
            if matches!(c, b':' | b'=' | b'\\') {
                out.push(b'\\');
            }
            out.push(c);
        }
        if let Some(m) = el.mode {
            out.push(b'=');
            out.extend_from_slice(m.to_string().as_bytes());
        }
    }
    out
}

/// `(dev, ino)` of `p` and every directory above it, `p` first.
fn ancestry(p: &Path) -> Vec<(u64, u64)> {
    p.ancestors()
        .filter_map(|a| std::fs::metadata(a).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}

/// How a directory stands to another: by `(dev, ino)`, so that bind
/// mounts and symlinked spellings of one directory are caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    Same,
    Inside,
    Contains,
}

/// Whether `a` is `b`, lies inside it or contains it (`None`: apart).
pub fn overlap(a: &Path, b: &Path) -> Option<Overlap> {
    let (a_up, b_up) = (ancestry(a), ancestry(b));
    let (Some(a_id), Some(b_id)) = (a_up.first(), b_up.first()) else {
        return None;
    };
    if a_id == b_id {
        Some(Overlap::Same)
    } else if a_up[1..].contains(b_id) {
        Some(Overlap::Inside)
    } else if b_up[1..].contains(a_id) {
        Some(Overlap::Contains)
    } else {
        None
    }
}

impl UnionSpec {
    /// Parses `BR1[=rw|=ro]:BR2[=rw|=ro]:...`; each branch must exist and be
    /// a directory. Relative paths are taken from the current directory.
    pub fn parse(arg: &OsStr) -> Result<UnionSpec, SpecError> {
        let elements = split(arg.as_bytes())?;
        let mut branches = Vec::with_capacity(elements.len());
        for (i, el) in elements.into_iter().enumerate() {
            let index = i + 1;
            let given = show(&el.path);
            let raw = PathBuf::from(OsString::from_vec(el.path));
            let path = std::fs::canonicalize(&raw).map_err(|source| {
                if source.kind() == io::ErrorKind::NotFound {
                    SpecError::NotFound {
                        index,
                        given: given.clone(),
                    }
                } else {
                    SpecError::Inaccessible {
                        index,
                        given: given.clone(),
                        source,
                    }
                }
            })?;
            let meta = std::fs::metadata(&path).map_err(|source| SpecError::Inaccessible {
                index,
                given: given.clone(),
                source,
            })?;
            if !meta.is_dir() {
                return Err(SpecError::NotADirectory { index, given });
            }
            let mode = el.mode.unwrap_or(if i == 0 { Mode::Rw } else { Mode::Ro });
            branches.push(BranchSpec {
                path,
                mode,
                dev: meta.dev(),
                ino: meta.ino(),
            });
        }
        Ok(UnionSpec { branches })
    }

    /// Checks the branches against each other and against the mount point
    /// `mnt` (which must exist): see the module documentation.
    pub fn validate(&self, mnt: &Path) -> Result<(), SpecError> {
        let ancestries: Vec<Vec<(u64, u64)>> =
            self.branches.iter().map(|b| ancestry(&b.path)).collect();
        for (j, b) in self.branches.iter().enumerate() {
            for (i, a) in self.branches[..j].iter().enumerate() {
                let (index, path) = (j + 1, show_path(&b.path));
                return Err(match overlap(&b.path, &a.path) {
                    None => continue,
                    Some(Overlap::Same) => SpecError::Repeated {
                        index,
                        path,
                        first: i + 1,
                    },
                    Some(Overlap::Inside) => SpecError::Inside {
                        index,
                        path,
                        outer: i + 1,
                        outer_path: show_path(&a.path),
                    },
                    Some(Overlap::Contains) => SpecError::Contains {
                        index,
                        path,
                        inner: i + 1,
                        inner_path: show_path(&a.path),
                    },
                });
            }
        }
        let shown = show_path(mnt);
        let canon = std::fs::canonicalize(mnt).map_err(|source| SpecError::MountPoint {
            mnt: shown.clone(),
            source,
        })?;
        let mnt_chain = ancestry(&canon);
        let Some(&mnt_id) = mnt_chain.first() else {
            return Err(SpecError::MountPoint {
                mnt: shown,
                source: io::Error::from(io::ErrorKind::NotFound),
            });
        };
        for (i, b) in self.branches.iter().enumerate() {
            if b.dev_ino() == mnt_id {
                if i == 0 {
                    continue;
                }
                return Err(SpecError::MountOverLower {
                    index: i + 1,
                    mnt: shown,
                });
            }
            if ancestries[i][1..].contains(&mnt_id) {
                return Err(SpecError::InsideMount {
                    index: i + 1,
                    path: show_path(&b.path),
                    mnt: shown,
                });
            }
            if mnt_chain[1..].contains(&b.dev_ino()) {
                return Err(SpecError::MountInside {
                    index: i + 1,
                    path: show_path(&b.path),
                    mnt: shown,
                });
            }
        }
        Ok(())
    }

    /// The argument that parses back to these branches (every mode
    /// written out, so it is never read as a lone literal SRC): for
    /// messages, fsname and re-exec.
    pub fn to_arg(&self) -> OsString {
        let elements: Vec<Element> = self
            .branches
            .iter()
            .map(|b| Element {
                path: b.path.as_os_str().as_bytes().to_vec(),
                mode: Some(b.mode),
            })
            .collect();
        OsString::from_vec(join_elements(&elements))
    }

    /// The branches `paths` (top first) as if given on a command line:
    /// what a live change is checked as (`chronofs branch add`).
    pub fn of_paths(paths: &[(&Path, Mode)]) -> Result<UnionSpec, SpecError> {
        let elements: Vec<Element> = paths
            .iter()
            .map(|(p, mode)| Element {
                path: p.as_os_str().as_bytes().to_vec(),
                mode: Some(*mode),
            })
            .collect();
        UnionSpec::parse(&OsString::from_vec(join_elements(&elements)))
    }

    /// Highest precedence first.
    pub fn branches(&self) -> &[BranchSpec] {
        &self.branches
    }

    pub fn len(&self) -> usize {
        self.branches.len()
    }

    /// Always false: parsing refuses an empty list. Here for clippy's
    /// `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.branches.is_empty()
    }

    /// Whether any branch takes changes; without one the mount is
    /// read-only and every change fails with EROFS.
    pub fn has_rw(&self) -> bool {
        self.branches.iter().any(|b| b.mode.is_writable())
    }

    /// The highest-precedence read-write branch and its position (0-based):
    /// where `create=top` puts new files and copy-up puts copies.
    pub fn top_rw(&self) -> Option<(usize, &BranchSpec)> {
        self.branches
            .iter()
            .enumerate()
            .find(|(_, b)| b.mode.is_writable())
    }
}

/// `-o create=`: which read-write branch receives a new file, directory,
/// symlink or node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CreatePolicy {
    /// The highest-precedence read-write branch (the default; overlayfs's
    /// only behaviour).
    #[default]
    Top,
    /// The read-write branch with the most free space (mergerfs's `mfs`),
    /// judged by `statvfs` at the time of the create.
    Mfs,
    /// The highest read-write branch where the parent directory already
    /// exists (mergerfs's `epff`); when none has it, as `Top` (the parents
    /// are copied up).
    ExistingPath,
}

impl CreatePolicy {
    pub fn parse(value: &str) -> Result<CreatePolicy, SpecError> {
        match value {
            "top" => Ok(CreatePolicy::Top),
            "mfs" => Ok(CreatePolicy::Mfs),
            "existing-path" => Ok(CreatePolicy::ExistingPath),
            _ => Err(SpecError::Policy {
                key: "create",
                value: value.to_string(),
                expected: "top, mfs or existing-path",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CreatePolicy::Top => "top",
            CreatePolicy::Mfs => "mfs",
            CreatePolicy::ExistingPath => "existing-path",
        }
    }
}

impl FromStr for CreatePolicy {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        CreatePolicy::parse(s)
    }
}

impl fmt::Display for CreatePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `-o delete=`: where unlink, rmdir and the old name of a rename act.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeletePolicy {
    /// Remove the name from every read-write branch holding it; a whiteout
    /// in the top read-write branch only where a read-only branch still
    /// holds it (the default: leaves no stale copy to resurface if a
    /// branch is later mounted alone).
    #[default]
    All,
    /// Remove it from the top read-write branch only and hide everything
    /// below with a whiteout (overlayfs's behaviour: lower branches are
    /// never changed).
    Whiteout,
}

impl DeletePolicy {
    pub fn parse(value: &str) -> Result<DeletePolicy, SpecError> {
        match value {
            "all" => Ok(DeletePolicy::All),
            "whiteout" => Ok(DeletePolicy::Whiteout),
            _ => Err(SpecError::Policy {
                key: "delete",
                value: value.to_string(),
                expected: "all or whiteout",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DeletePolicy::All => "all",
            DeletePolicy::Whiteout => "whiteout",
        }
    }
}

impl FromStr for DeletePolicy {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        DeletePolicy::parse(s)
    }
}

impl fmt::Display for DeletePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn el(path: &[u8], mode: Option<Mode>) -> Element {
        Element {
            path: path.to_vec(),
            mode,
        }
    }

    fn err_of(arg: &[u8]) -> String {
        match UnionSpec::parse(OsStr::from_bytes(arg)) {
            Ok(s) => panic!("{} parsed: {s:?}", show(arg)),
            Err(e) => {
                let m = e.to_string();
                assert!(!m.contains('\n'), "multi-line: {m}");
                m
            }
        }
    }

    fn bytes(p: &Path) -> Vec<u8> {
        p.as_os_str().as_bytes().to_vec()
    }

    fn join(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn syntax_splits_modes_and_escapes() {
        assert_eq!(split(b"/a").unwrap(), vec![el(b"/a", None)]);
        assert_eq!(
            split(b"/a=rw:b=ro:c").unwrap(),
            vec![
                el(b"/a", Some(Mode::Rw)),
                el(b"b", Some(Mode::Ro)),
                el(b"c", None)
            ]
        );
        assert_eq!(
            split(br"/x\:y=ro:/p\=q:/back\\slash").unwrap(),
            vec![
                el(b"/x:y", Some(Mode::Ro)),
                el(b"/p=q", None),
                el(br"/back\slash", None)
            ]
        );
        // The mode is after the last unescaped '='.
        assert_eq!(
            split(br"/k\=v=rw:z").unwrap(),
            vec![el(b"/k=v", Some(Mode::Rw)), el(b"z", None)]
        );
        // No ':' and no '=': today's single SRC, byte for byte.
        assert_eq!(split(br"/odd\name").unwrap(), vec![el(br"/odd\name", None)]);
        assert_eq!(split(b"/\xff\xfe").unwrap(), vec![el(b"/\xff\xfe", None)]);
    }

    proptest::proptest! {
        /// Any paths (any bytes but NUL, never empty) with any modes come
        /// back from their escaped list unchanged.
        #[test]
        fn escaping_round_trips(
            els in proptest::collection::vec(
                (
                    proptest::collection::vec(1u8.., 1..12),
                    proptest::option::of(proptest::bool::ANY),
                ),
                1..6,
            )
        ) {
            let els: Vec<Element> = els
                .into_iter()
                .map(|(path, m)| Element {
                    path,
                    mode: m.map(|rw| if rw { Mode::Rw } else { Mode::Ro }),
                })
                .collect();
            let arg = join_elements(&els);
            // A lone element without a mode and without ':' or '=' is the
            // literal SRC form, where escapes do not apply.
            let literal = els.len() == 1
                && els[0].mode.is_none()
                && !arg.iter().any(|&b| b == b':' || b == b'=');
            if literal {
                proptest::prop_assert_eq!(split(&arg).unwrap()[0].path.clone(), arg);
            } else {
                proptest::prop_assert_eq!(split(&arg).unwrap(), els);
            }
        }
    }

    #[test]
    fn syntax_errors() {
        let msg = |a: &[u8]| split(a).unwrap_err().to_string();
        assert_eq!(msg(b""), "no branch given");
        for a in [&b"a::b"[..], b":a", b"a:", b":", b"a:=ro"] {
            let m = msg(a);
            assert!(m.starts_with("branch ") && m.contains("is empty"), "{m}");
        }
        assert_eq!(
            msg(b"a::b"),
            "branch 2 is empty (two ':' in a row, or ':' at either end)"
        );
        assert_eq!(
            msg(b"/a:/b=rx"),
            "branch 2 (/b=rx): unknown mode '=rx' (expected =rw or =ro; write '\\=' for a '=' in a path)"
        );
        assert_eq!(
            msg(br"/a:/b\x:/c"),
            r"branch 2 (/b\x): a '\' must be followed by ':', '=' or '\'"
        );
        assert!(msg(br"/a:/b\").starts_with(r"branch 2 (/b\): a '\'"));
        // An '=' in a path must be escaped, or it reads as a mode.
        assert!(msg(b"/data/x=y").starts_with("branch 1 (/data/x=y): unknown mode '=y'"));
    }

    #[test]
    fn parses_default_modes_and_canonical_paths() {
        let t = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(t.path()).unwrap();
        for d in ["a", "b", "c"] {
            std::fs::create_dir(base.join(d)).unwrap();
        }
        let b = bytes(&base);
        let s = UnionSpec::parse(OsStr::from_bytes(&join(&[
            &b,
            b"/a:",
            &b,
            b"/a/../b:",
            &b,
            b"/c=rw",
        ])))
        .unwrap();
        let modes: Vec<Mode> = s.branches().iter().map(|b| b.mode()).collect();
        assert_eq!(modes, [Mode::Rw, Mode::Ro, Mode::Rw]);
        assert_eq!(s.branches()[1].path(), base.join("b"));
        assert!(s.has_rw());
        assert_eq!(s.top_rw().map(|(i, _)| i), Some(0));
        s.validate(&base.join("a")).unwrap();

        let ro = UnionSpec::parse(OsStr::from_bytes(&join(&[&b, b"/a=ro:", &b, b"/b"]))).unwrap();
        assert!(!ro.has_rw());
        assert!(ro.top_rw().is_none());
        let lower_rw =
            UnionSpec::parse(OsStr::from_bytes(&join(&[&b, b"/a=ro:", &b, b"/b=rw"]))).unwrap();
        assert_eq!(lower_rw.top_rw().map(|(i, _)| i), Some(1));

        // Today's single SRC: one read-write branch, relative paths too.
        let one = UnionSpec::parse(base.join("c").as_os_str()).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one.branches()[0].mode(), Mode::Rw);
        assert_eq!(one.branches()[0].path(), base.join("c"));
    }

    /// A scratch tree: `root/{a,b,c,m}`, a file `root/f`, and the
    /// canonical root's bytes.
    fn tree() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let t = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(t.path()).unwrap();
        for d in ["a", "b", "c", "m", "a/in"] {
            std::fs::create_dir(base.join(d)).unwrap();
        }
        std::fs::write(base.join("f"), b"").unwrap();
        let b = bytes(&base);
        (t, base, b)
    }

    fn spec(parts: &[&[u8]]) -> UnionSpec {
        UnionSpec::parse(OsStr::from_bytes(&join(parts))).unwrap()
    }

    fn invalid(parts: &[&[u8]], mnt: &Path) -> String {
        let m = spec(parts).validate(mnt).unwrap_err().to_string();
        assert!(!m.contains('\n'), "multi-line: {m}");
        m
    }

    #[test]
    fn escaped_and_non_utf8_paths_reach_the_file_system() {
        let (_t, base, b) = tree();
        std::fs::create_dir(base.join("x:y")).unwrap();
        std::fs::create_dir(base.join("p=q")).unwrap();
        std::fs::create_dir(base.join(r"back\slash")).unwrap();
        let odd = base.join(OsStr::from_bytes(b"n\xff\xfe"));
        std::fs::create_dir(&odd).unwrap();
        let s = spec(&[
            &b,
            br"/x\:y=ro:",
            &b,
            br"/p\=q=rw:",
            &b,
            br"/back\\slash:",
            &b,
            b"/n\xff\xfe",
        ]);
        let got: Vec<(PathBuf, Mode)> = s
            .branches()
            .iter()
            .map(|b| (b.path().to_path_buf(), b.mode()))
            .collect();
        assert_eq!(
            got,
            vec![
                (base.join("x:y"), Mode::Ro),
                (base.join("p=q"), Mode::Rw),
                (base.join(r"back\slash"), Mode::Ro),
                (odd.clone(), Mode::Ro),
            ]
        );
        s.validate(&base.join("m")).unwrap();
        assert_eq!(UnionSpec::parse(&s.to_arg()).unwrap(), s);
        // Single SRC, non-UTF-8, no escapes applied.
        let one = UnionSpec::parse(odd.as_os_str()).unwrap();
        assert_eq!(one.branches()[0].path(), odd);
        // Unescaped, the ':' splits: "x" does not exist.
        assert_eq!(
            err_of(&join(&[&b, b"/x:y"])),
            format!("branch 1 ({}/x) does not exist", base.display())
        );
    }

    #[test]
    fn each_branch_must_be_an_existing_directory() {
        let (_t, base, b) = tree();
        let d = base.display();
        assert_eq!(
            err_of(&join(&[&b, b"/a:", &b, b"/nope=ro"])),
            format!("branch 2 ({d}/nope) does not exist")
        );
        assert_eq!(
            err_of(&join(&[&b, b"/a:", &b, b"/f"])),
            format!("branch 2 ({d}/f) is not a directory")
        );
        // Single SRC: same messages, as branch 1.
        assert_eq!(
            err_of(&join(&[&b, b"/f"])),
            format!("branch 1 ({d}/f) is not a directory")
        );
        let m = err_of(&join(&[&b, b"/f/sub:", &b, b"/a"]));
        assert!(m.starts_with(&format!("branch 1 ({d}/f/sub): ")), "{m}");
        assert!(m.contains("Not a directory"), "{m}");
    }

    #[test]
    fn branches_may_not_repeat_or_nest() {
        let (_t, base, b) = tree();
        let d = base.display();
        std::os::unix::fs::symlink(base.join("a"), base.join("link")).unwrap();
        let m = base.join("m");
        assert_eq!(
            invalid(&[&b, b"/a:", &b, b"/b:", &b, b"/a/./"], &m),
            format!("branch 3 ({d}/a) is branch 1 again")
        );
        // Through a symlink, canonicalisation finds the repeat.
        assert_eq!(
            invalid(&[&b, b"/a:", &b, b"/link"], &m),
            format!("branch 2 ({d}/a) is branch 1 again")
        );
        assert_eq!(
            invalid(&[&b, b"/a:", &b, b"/a/in"], &m),
            format!("branch 2 ({d}/a/in) lies inside branch 1 ({d}/a)")
        );
        assert_eq!(
            invalid(&[&b, b"/a/in:", &b, b"/b:", &b, b"/a"], &m),
            format!("branch 3 ({d}/a) contains branch 1 ({d}/a/in)")
        );
    }

    #[test]
    fn the_mount_point_against_the_branches() {
        let (_t, base, b) = tree();
        let d = base.display();
        // Over the top branch: allowed, as today's MNT = SRC.
        spec(&[&b, b"/a:", &b, b"/b"])
            .validate(&base.join("a"))
            .unwrap();
        spec(&[&b, b"/a"]).validate(&base.join("a")).unwrap();
        assert_eq!(
            invalid(&[&b, b"/a:", &b, b"/b"], &base.join("b")),
            format!(
                "mount point {d}/b is branch 2, a lower branch: only the top branch (branch 1) may be mounted over"
            )
        );
        assert_eq!(
            invalid(&[&b, b"/b:", &b, b"/a/in"], &base.join("a")),
            format!("branch 2 ({d}/a/in) lies inside the mount point {d}/a")
        );
        assert_eq!(
            invalid(&[&b, b"/b:", &b, b"/a"], &base.join("a/in")),
            format!(
                "mount point {d}/a/in lies inside branch 2 ({d}/a): the mount would contain itself"
            )
        );
        // Single SRC keeps today's rules.
        assert_eq!(
            invalid(&[&b, b"/a"], &base.join("a/in")),
            format!(
                "mount point {d}/a/in lies inside branch 1 ({d}/a): the mount would contain itself"
            )
        );
        let m = invalid(&[&b, b"/a"], &base.join("gone"));
        assert!(m.starts_with(&format!("mount point {d}/gone: ")), "{m}");
    }

    #[test]
    fn policies_parse_and_print() {
        assert_eq!(CreatePolicy::default(), CreatePolicy::Top);
        assert_eq!(DeletePolicy::default(), DeletePolicy::All);
        for p in [
            CreatePolicy::Top,
            CreatePolicy::Mfs,
            CreatePolicy::ExistingPath,
        ] {
            assert_eq!(p.as_str().parse::<CreatePolicy>().unwrap(), p);
        }
        for p in [DeletePolicy::All, DeletePolicy::Whiteout] {
            assert_eq!(p.to_string().parse::<DeletePolicy>().unwrap(), p);
        }
        assert_eq!(
            CreatePolicy::parse("ff").unwrap_err().to_string(),
            "option create=ff: expected top, mfs or existing-path"
        );
        assert_eq!(
            DeletePolicy::parse("").unwrap_err().to_string(),
            "option delete=: expected all or whiteout"
        );
    }
}
