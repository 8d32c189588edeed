//! `chronofs diff PATH A [B]`: a file's or a tree's differences between two
//! instants, as text (unified diffs for text files) or JSON, with diff(1)'s
//! exit status (0 same, 1 different, 2 trouble).
//!
//! A tree is compared as two whole listings keyed by path, never by
//! directory versions: a directory's version does not change when a file
//! inside it does, so comparing versions would hide every change below.
//! An object found at different paths in A and B is a rename (the object
//! id is the file's identity), reported once for the topmost directory
//! that moved.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;

use anyhow::{bail, Result};
use serde::Serialize;

use super::history::{shown, Target};
use crate::control::proto::{path_text, Instant, NodeInfo, ObjectId};
use crate::control::{At, Components, ControlError};

/// One side of the comparison: relative path (components below the diffed
/// path) to the entry's description, as `List`/`Stat` give it.
type Tree = BTreeMap<Components, NodeInfo>;

/// `diff --json` (docs/CLI.md).
#[derive(Serialize)]
struct DiffReply {
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_raw: Option<Vec<u8>>,
    a: Instant,
    b: Instant,
    differ: bool,
    changes: Vec<Change>,
    /// What the caller may not read at one instant (left out; exit 2).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unreadable: Vec<String>,
}

#[derive(Serialize, Clone, Copy)]
struct ModeChange {
    a: u32,
    b: u32,
}

/// One difference. Added and removed entries carry no `content` and
/// `mode`; changed and renamed ones always do (`mode` null when equal).
#[derive(Serialize)]
struct Change {
    change: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    from_raw: Option<Vec<u8>>,
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_raw: Option<Vec<u8>>,
    kind: String,
    obj: Option<ObjectId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<Option<ModeChange>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind_before: Option<String>,
}

impl Change {
    /// An entry on one side only.
    fn one_side(change: &'static str, path: &Components, v: &NodeInfo) -> Change {
        let (path, path_raw) = path_text(path);
        Change {
            change,
            from: None,
            from_raw: None,
            path,
            path_raw,
            kind: v.kind.clone(),
            obj: v.obj,
            content: None,
            mode: None,
            kind_before: None,
        }
    }
}

/// What could not be compared, as diff(1) reports it and goes on: a
/// directory or file the caller may not read at one of the instants (a
/// non-root user's tree with one closed directory was refused whole).
#[derive(Default)]
struct Trouble {
    /// One line each, for stderr.
    lines: Vec<String>,
    /// Directories (relative to the diffed path) whose entries are left
    /// out on both sides: one side's listing alone would read as adds.
    closed: BTreeSet<Components>,
}

impl Trouble {
    /// `e` is a refusal to let the caller read a path (its text names
    /// the path and the instant): noted, and the comparison goes on; any
    /// other error stops it.
    fn note(&mut self, e: ControlError) -> Result<()> {
        if !matches!(e.errno(), libc::EACCES | libc::EPERM) {
            return Err(e.into());
        }
        let line = e.to_string();
        if !self.lines.contains(&line) {
            self.lines.push(line);
        }
        Ok(())
    }

    /// Whether `rel` lies inside a directory left out.
    fn hides(&self, rel: &Components) -> bool {
        (0..rel.len()).any(|n| self.closed.contains(&rel[..n]))
    }
}

/// The differences, ready to print or to serialize.
struct Report {
    changes: Vec<Change>,
    /// Unified diffs (or binary summaries) of changed files, by path shown.
    texts: Vec<String>,
}

/// What a diff found: whether the sides differ, and whether some of
/// them could not be read (each said on stderr).
pub struct Outcome {
    pub differ: bool,
    pub trouble: bool,
}

/// Diffs `t.path` between `a` and `b`; writes the report.
pub fn diff(t: &Target, a: &At, b: &At, json_out: bool, out: &mut dyn Write) -> Result<Outcome> {
    // A bad instant is an error, not an absent file.
    let client = t.client();
    let ra = client.resolve(a)?;
    let rb = client.resolve(b)?;
    let (mut pa, mut pb) = (t.path.clone(), t.path.clone());
    let (mut na, mut nb) = (stat(t, &pa, a)?, stat(t, &pb, b)?);
    // The path names nothing at one instant: that side follows what it
    // names at the other through renames, as history does.
    match (&na, &nb) {
        (Top::Absent, Top::Found(_)) => {
            if let Some(p) = follow(t, b, a) {
                na = stat(t, &p, a)?;
                pa = p;
            }
        }
        (Top::Found(_), Top::Absent) => {
            if let Some(p) = follow(t, a, b) {
                nb = stat(t, &p, b)?;
                pb = p;
            }
        }
        _ => {}
    }
    let (shown_root, shown_root_raw) = path_text(&t.path);
    let mut trouble = Trouble::default();
    let (mut ta, mut tb) = match (na, nb) {
        (Top::Absent, Top::Absent) => {
            bail!("{} existed at neither instant", shown(&shown_root))
        }
        // As diff(1) on a file it may not open: said, nothing compared.
        (x, y) if x.denied() || y.denied() => {
            for top in [x, y] {
                if let Top::Denied(e) = top {
                    trouble.note(e)?;
                }
            }
            (Tree::new(), Tree::new())
        }
        (x, y) => (
            side(t, a, &pa, x.found(), &mut trouble)?,
            side(t, b, &pb, y.found(), &mut trouble)?,
        ),
    };
    ta.retain(|rel, _| !trouble.hides(rel));
    tb.retain(|rel, _| !trouble.hides(rel));
    let report = compare(t, (a, &pa), (b, &pb), (&ta, &tb), !json_out, &mut trouble)?;
    let differ = !report.changes.is_empty();
    for line in &trouble.lines {
        eprintln!("chronofs: {line}");
    }
    let outcome = Outcome {
        differ,
        trouble: !trouble.lines.is_empty(),
    };
    if json_out {
        let v = DiffReply {
            path: shown_root,
            path_raw: shown_root_raw,
            a: ra,
            b: rb,
            differ,
            changes: report.changes,
            unreadable: trouble.lines,
        };
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        )?;
        return Ok(outcome);
    }
    for c in &report.changes {
        // A file's own content change is said by its unified diff alone,
        // as diff(1) does.
        let content_only = c.path == shown_root
            && c.change == "changed"
            && c.kind == "file"
            && c.mode.flatten().is_none()
            && c.kind_before.is_none();
        if !content_only {
            writeln!(out, "{}", summary_line(c))?;
        }
    }
    for text in &report.texts {
        write!(out, "{text}")?;
    }
    Ok(outcome)
}

/// What the diffed path is at one instant.
enum Top {
    Found(Box<NodeInfo>),
    Absent,
    /// The caller may not look at it then (the refusal, to be said).
    Denied(ControlError),
}

impl Top {
    fn found(&self) -> Option<&NodeInfo> {
        match self {
            Top::Found(n) => Some(n.as_ref()),
            _ => None,
        }
    }

    fn denied(&self) -> bool {
        matches!(self, Top::Denied(_))
    }
}

/// Only ENOENT means nothing was there: a refusal is not an absence
/// (it read as "added"), and any other error stops the diff.
fn stat(t: &Target, path: &Components, at: &At) -> Result<Top> {
    match t.client().stat(path, at) {
        Ok(n) => Ok(Top::Found(Box::new(n))),
        Err(e) if e.errno() == libc::ENOENT => Ok(Top::Absent),
        Err(e) if matches!(e.errno(), libc::EACCES | libc::EPERM) => Ok(Top::Denied(e)),
        Err(e) => Err(e.into()),
    }
}

/// Where the object `t.path` names at `from` was at `to`.
fn follow(t: &Target, from: &At, to: &At) -> Option<Components> {
    t.client().follow(&t.path, from, to).ok()?.path
}

/// Everything at and below `base` at one instant.
fn side(
    t: &Target,
    at: &At,
    base: &Components,
    top: Option<&NodeInfo>,
    trouble: &mut Trouble,
) -> Result<Tree> {
    let mut tree = Tree::new();
    let Some(top) = top else {
        return Ok(tree);
    };
    tree.insert(Vec::new(), top.clone());
    if top.kind == "dir" {
        let mut walk = Walk {
            t,
            at,
            base,
            tree: &mut tree,
            trouble,
        };
        walk.dir(&mut Vec::new())?;
    }
    Ok(tree)
}

/// One side's listing being gathered.
struct Walk<'a> {
    t: &'a Target,
    at: &'a At,
    base: &'a Components,
    tree: &'a mut Tree,
    trouble: &'a mut Trouble,
}

impl Walk<'_> {
    fn dir(&mut self, rel: &mut Components) -> Result<()> {
        let path = joined(self.base, rel);
        let v = match self.t.client().list(&path, self.at, false) {
            // The diffed path itself: nothing to compare at all.
            Err(e) if !rel.is_empty() => {
                self.trouble.note(e)?;
                self.trouble.closed.insert(rel.clone());
                return Ok(());
            }
            other => other?,
        };
        for e in v.entries {
            // The bytes, not the lossy text: a name that is not UTF-8
            // must still be found when its subtree is listed.
            let name = e.name_bytes();
            if name.is_empty() {
                continue;
            }
            rel.push(name);
            let is_dir = e.kind == "dir";
            self.tree.insert(rel.clone(), e);
            if is_dir {
                self.dir(rel)?;
            }
            rel.pop();
        }
        Ok(())
    }
}

/// A path for a diff header (one line whatever its bytes).
fn show(p: &Components) -> String {
    shown(&path_text(p).0)
}

fn joined(base: &Components, rel: &Components) -> Components {
    let mut p = base.clone();
    p.extend(rel.iter().cloned());
    p
}

/// The object id, when the entry has one (live objects never recorded
/// have none and cannot be matched across paths).
fn obj(v: &NodeInfo) -> Option<ObjectId> {
    v.obj
}

fn same_version(x: &NodeInfo, y: &NodeInfo) -> bool {
    x.obj == y.obj && x.seq == y.seq && x.source == y.source && x.seq.is_some()
}

/// How two entries of the same object or path differ: (content differs,
/// mode change, kind change), plus the text of a content diff.
struct Delta {
    /// The caller may not read the file at one instant: it is left out on
    /// both sides (the refusal noted), as `diff -r` leaves it out.
    left_out: bool,
    content: bool,
    mode: Option<(u32, u32)>,
    kind: Option<(String, String)>,
    text: Option<String>,
}

impl Delta {
    fn any(&self) -> bool {
        self.content || self.mode.is_some() || self.kind.is_some()
    }
}

fn delta(
    t: &Target,
    (a, pa, x): (&At, &Components, &NodeInfo),
    (b, pb, y): (&At, &Components, &NodeInfo),
    want_text: bool,
    trouble: &mut Trouble,
) -> Result<Delta> {
    let kx = x.kind.clone();
    let ky = y.kind.clone();
    let mut d = Delta {
        left_out: false,
        content: false,
        mode: None,
        kind: None,
        text: None,
    };
    if kx != ky {
        d.kind = Some((kx, ky));
        return Ok(d);
    }
    let (mx, my) = (x.mode, y.mode);
    if mx != my {
        d.mode = Some((mx, my));
    }
    match kx.as_str() {
        "symlink" => d.content = x.target_bytes() != y.target_bytes(),
        "file" if !same_version(x, y) => {
            let unknown = |v: &NodeInfo| v.is_unrecorded() || v.is_lost();
            if unknown(x) || unknown(y) {
                // No bytes to compare: only what the attributes say.
                d.content = x.size != y.size || x.mtime_ns != y.mtime_ns;
            } else if x.size != y.size && !want_text {
                // Differing sizes say it changed, but only to a caller who
                // may read it at both instants.
                for (p, at) in [(pa, a), (pb, b)] {
                    if let Err(e) = t.client().read(p, at, None, &mut std::io::sink()) {
                        return unread(trouble.note(e), d);
                    }
                }
                d.content = true;
            } else {
                let (da, db) = match (read(t, pa, a), read(t, pb, b)) {
                    (Ok(da), Ok(db)) => (da, db),
                    (Err(e), _) | (_, Err(e)) => return unread(trouble.note(e), d),
                };
                if da != db {
                    d.content = true;
                    if want_text {
                        d.text = Some(text_diff(&show(pa), &show(pb), &da, &db));
                    }
                }
            }
        }
        _ => {}
    }
    Ok(d)
}

fn read(t: &Target, path: &Components, at: &At) -> Result<Vec<u8>, ControlError> {
    let mut buf = Vec::new();
    t.client().read(path, at, None, &mut buf)?;
    Ok(buf)
}

/// A file whose bytes one side may not read: left out (`noted`: the
/// refusal was noted, or the error to stop with).
fn unread(noted: Result<()>, mut d: Delta) -> Result<Delta> {
    noted?;
    d.left_out = true;
    Ok(d)
}

fn text_diff(pa: &str, pb: &str, da: &[u8], db: &[u8]) -> String {
    match (std::str::from_utf8(da), std::str::from_utf8(db)) {
        (Ok(sa), Ok(sb)) if !sa.contains('\0') && !sb.contains('\0') => {
            let d = similar::TextDiff::from_lines(sa, sb);
            let mut u = d.unified_diff();
            u.header(&format!("a{pa}"), &format!("b{pb}")).to_string()
        }
        _ => format!(
            "Binary files a{pa} ({} bytes) and b{pb} ({} bytes) differ\n",
            da.len(),
            db.len()
        ),
    }
}

/// One side of a comparison: the instant and the path diffed there.
type Side<'a> = (&'a At, &'a Components);

fn compare(
    t: &Target,
    (a, base_a): Side,
    (b, base_b): Side,
    (ta, tb): (&Tree, &Tree),
    want_text: bool,
    trouble: &mut Trouble,
) -> Result<Report> {
    let mut report = Report {
        changes: Vec::new(),
        texts: Vec::new(),
    };
    // Paths present on one side only; those of one object on both sides
    // are renames.
    let only_a: Vec<&Components> = ta.keys().filter(|k| !tb.contains_key(*k)).collect();
    let only_b: Vec<&Components> = tb.keys().filter(|k| !ta.contains_key(*k)).collect();
    let mut b_by_obj: HashMap<ObjectId, Vec<&Components>> = HashMap::new();
    for p in &only_b {
        if let Some(o) = obj(&tb[*p]) {
            b_by_obj.entry(o).or_default().push(p);
        }
    }
    let mut renamed: BTreeMap<&Components, &Components> = BTreeMap::new();
    for p in &only_a {
        let Some(o) = obj(&ta[*p]) else { continue };
        if let Some(q) = b_by_obj
            .get_mut(&o)
            .and_then(|v| (!v.is_empty()).then(|| v.remove(0)))
        {
            renamed.insert(p, q);
        }
    }
    let from_of: HashMap<&Components, &Components> =
        renamed.iter().map(|(p, q)| (*q, *p)).collect();
    let mut entries: Vec<(&Components, Change)> = Vec::new();
    for p in &only_a {
        if renamed.contains_key(p) {
            continue;
        }
        entries.push((p, Change::one_side("removed", &joined(base_a, p), &ta[*p])));
    }
    for (rel, y) in tb {
        let full_b = joined(base_b, rel);
        if let Some(x) = ta.get(rel) {
            let full_a = joined(base_a, rel);
            let d = delta(t, (a, &full_a, x), (b, &full_b, y), want_text, trouble)?;
            if d.left_out {
                continue;
            }
            if full_a != full_b && rel.is_empty() {
                entries.push((rel, change_value("renamed", Some(&full_a), &full_b, y, &d)));
                report.texts.extend(d.text);
            } else if d.any() {
                entries.push((rel, change_value("changed", None, &full_b, y, &d)));
                report.texts.extend(d.text);
            }
            continue;
        }
        let Some(from) = from_of.get(rel) else {
            entries.push((rel, Change::one_side("added", &full_b, y)));
            continue;
        };
        let full_a = joined(base_a, from);
        let d = delta(
            t,
            (a, &full_a, &ta[*from]),
            (b, &full_b, y),
            want_text,
            trouble,
        )?;
        // Moved along with its directory, unchanged: the directory's
        // rename says it all.
        let implied = match (from.split_last(), rel.split_last()) {
            (Some((na, pa)), Some((nb, pb))) => {
                na == nb
                    && !pa.is_empty()
                    && from_of
                        .get(&pb.to_vec())
                        .is_some_and(|f| f.as_slice() == pa)
            }
            _ => false,
        };
        if d.left_out || (implied && !d.any()) {
            continue;
        }
        entries.push((rel, change_value("renamed", Some(&full_a), &full_b, y, &d)));
        report.texts.extend(d.text);
    }
    entries.sort_by(|x, y| x.0.cmp(y.0));
    report.changes = entries.into_iter().map(|(_, v)| v).collect();
    Ok(report)
}

fn change_value(
    what: &'static str,
    from: Option<&Components>,
    path: &Components,
    y: &NodeInfo,
    d: &Delta,
) -> Change {
    let mut c = Change::one_side(what, path, y);
    c.content = Some(d.content);
    c.mode = Some(d.mode.map(|(a, b)| ModeChange { a, b }));
    if let Some(f) = from {
        let (text, raw) = path_text(f);
        c.from = Some(text);
        c.from_raw = raw;
    }
    c.kind_before = d.kind.as_ref().map(|(ka, _)| ka.clone());
    c
}

fn summary_line(c: &Change) -> String {
    let path = shown(&c.path);
    let kind = &c.kind;
    let mut details = Vec::new();
    if let Some(k) = &c.kind_before {
        details.push(format!("{k} -> {kind}"));
    }
    if c.content == Some(true) {
        details.push(
            if kind == "symlink" {
                "target"
            } else {
                "content"
            }
            .to_string(),
        );
    }
    if let Some(ModeChange { a, b }) = c.mode.flatten() {
        details.push(format!("mode {a:o} -> {b:o}"));
    }
    let details = if details.is_empty() {
        String::new()
    } else {
        format!(" ({})", details.join(", "))
    };
    match c.change {
        "renamed" => format!(
            "renamed: {} -> {path}{details}",
            shown(c.from.as_deref().unwrap_or("?"))
        ),
        other => format!("{other}: {path} [{kind}]{details}"),
    }
}
