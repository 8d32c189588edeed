//! Who may read the past (docs/ARCHITECTURE.md, "Who may read the past").
//!
//! History must not turn a moment's exposure into a permanent one: a file
//! written while world-readable and then made private would otherwise keep
//! its old content readable by everyone through its versions. So reading a
//! version, or listing a past directory, needs the permission both as the
//! object was (its recorded mode, owner, group and access ACL) and as it is
//! now (the live object's, or for a deleted object its last recorded
//! state). Root and the object's owner now keep full access: the owner
//! could grant themselves any access to the live object anyway.
//!
//! "Now" covers the way to the object too: search permission on each
//! directory of its current path (`chmod 700 ~` makes everything below
//! private, natively and here). For a deleted object, the state it was
//! last recorded in, below its last parent's way now.
//!
//! Permission arithmetic, the /proc read that loads a caller's
//! supplementary groups (only when a group decides), and the walks that
//! find an object's state now.

use std::cell::OnceCell;
use std::os::fd::{AsFd, BorrowedFd};

use super::past::{show_path, Cur, Error, Node, Past, Result};
use super::{ObjectId, Seq, Version, ROOT};
use crate::sys::{self, Stat};

pub const READ: u32 = 4;
pub const SEARCH: u32 = 1;

const ACL_XATTR: &[u8] = b"system.posix_acl_access";
const ACL_VERSION: u32 = 2;
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;

/// The identity a check is made for: the caller of a file system request
/// or the peer of the control socket.
pub struct Who {
    pub uid: u32,
    pub gid: u32,
    /// Thread or process whose supplementary groups count.
    pid: u32,
    groups: OnceCell<Vec<u32>>,
}

impl Who {
    pub fn new(uid: u32, gid: u32, pid: u32) -> Who {
        Who {
            uid,
            gid,
            pid,
            groups: OnceCell::new(),
        }
    }

    /// An identity whose groups are known (no process to read them from:
    /// the maker of a clone, filled later).
    pub fn with_groups(uid: u32, gid: u32, groups: Vec<u32>) -> Who {
        Who {
            uid,
            gid,
            pid: 0,
            groups: OnceCell::from(groups),
        }
    }

    fn in_group(&self, gid: u32) -> bool {
        gid == self.gid
            || self
                .groups
                .get_or_init(|| {
                    // A caller gone before its groups could be read is
                    // treated as having none: that can only deny.
                    sys::creds::supplementary_groups(self.pid).unwrap_or_default()
                })
                .contains(&gid)
    }
}

/// What decides access to an object: mode, owner, group, access ACL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Perms {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The `system.posix_acl_access` value, if the object has one.
    pub acl: Option<Vec<u8>>,
}

impl Perms {
    pub fn of_version(v: &Version) -> Perms {
        Perms {
            mode: v.attrs.mode,
            uid: v.attrs.uid,
            gid: v.attrs.gid,
            acl: v
                .xattrs
                .iter()
                .find(|(n, _)| n == ACL_XATTR)
                .map(|(_, v)| v.clone()),
        }
    }

    /// A live object's permissions (its ACL read through `fd`, an O_PATH
    /// descriptor).
    pub fn of_live(fd: BorrowedFd<'_>, st: &Stat) -> std::io::Result<Perms> {
        let mut acl = None;
        if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
            let name = c"system.posix_acl_access";
            let mut buf = vec![0u8; 256];
            loop {
                match sys::getxattr_fd(fd, name, &mut buf) {
                    Ok(n) => {
                        buf.truncate(n);
                        acl = Some(buf);
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ERANGE) => {
                        let need = sys::getxattr_fd(fd, name, &mut [])?;
                        buf.resize(need.max(buf.len() * 2), 0);
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::ENOTSUP)) => {
                        break
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(Perms {
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            acl,
        })
    }

    /// Whether `who` has every bit of `want` (`READ`, `SEARCH`) on an
    /// object with these permissions, as the kernel decides it natively
    /// (POSIX.1e ACL rules; root always).
    pub fn permits(&self, who: &Who, want: u32) -> bool {
        if who.uid == 0 {
            return true;
        }
        let has = |perm: u32| perm & want == want;
        let mode = self.mode;
        if who.uid == self.uid {
            return has(mode >> 6);
        }
        let entries = self.acl.as_deref().map(acl_entries).unwrap_or_default();
        if !entries.is_empty() {
            // With a mask, the mode's group bits are the mask and the
            // owning group's own entry is in the ACL.
            let masked = entries.iter().any(|e| e.0 == ACL_MASK);
            let mask = if masked { (mode >> 3) & 7 } else { 7 };
            if let Some(e) = entries.iter().find(|e| e.0 == ACL_USER && e.2 == who.uid) {
                return has(e.1 & mask);
            }
            let mut matched = false;
            for &(tag, perm, id) in &entries {
                let perm = match tag {
                    ACL_GROUP_OBJ if self.in_owning_group(who) => {
                        if masked {
                            perm
                        } else {
                            (mode >> 3) & 7
                        }
                    }
                    ACL_GROUP if who.in_group(id) => perm,
                    _ => continue,
                };
                if has(perm & mask) {
                    return true;
                }
                matched = true;
            }
            if matched {
                return false;
            }
            return has(mode);
        }
        if self.in_owning_group(who) {
            return has(mode >> 3);
        }
        has(mode)
    }

    fn in_owning_group(&self, who: &Who) -> bool {
        who.in_group(self.gid)
    }

    /// Whether every caller has every bit of `want`, whoever they are: no
    /// ACL, and the bits in each class (the owner's included: an owner
    /// without them is denied natively too).
    pub fn open_to_all(&self, want: u32) -> bool {
        let all = want | (want << 3) | (want << 6);
        self.acl.is_none() && self.mode & all == all
    }
}

/// Whom a check is made for: one caller, or every caller at once (whether
/// a verdict may be cached by the kernel, which shares it among callers).
#[derive(Clone, Copy)]
pub enum Whom<'a> {
    One(&'a Who),
    Anyone,
}

impl Whom<'_> {
    /// Whether this has `want` on an object with permissions `p`.
    pub fn has(&self, p: &Perms, want: u32) -> bool {
        match self {
            Whom::One(who) => p.permits(who, want),
            Whom::Anyone => p.open_to_all(want),
        }
    }
}

/// The entries of an ACL xattr value: (tag, permission bits, id). Empty
/// when the value is not one the kernel would have written.
fn acl_entries(value: &[u8]) -> Vec<(u16, u32, u32)> {
    let Some((head, rest)) = value.split_first_chunk::<4>() else {
        return Vec::new();
    };
    if u32::from_le_bytes(*head) != ACL_VERSION || rest.len() % 8 != 0 {
        return Vec::new();
    }
    rest.chunks_exact(8)
        .map(|e| {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            (tag, u32::from(perm) & 7, id)
        })
        .filter(|e| e.0 != ACL_USER_OBJ)
        .collect()
}

/// An object as it is now, and the directories of its way from the root.
#[derive(Clone, Debug, Default)]
pub struct Now {
    pub perms: Perms,
    /// From the root down to its parent.
    pub dirs: Vec<Perms>,
}

/// The rule: `want` on a past state `then` of an object whose state now is
/// `now` (`None`: unknown, taken as then). An owner, then or now, passes
/// the mode of that state (they could grant themselves any access), but
/// not the other state's, nor the directories on the way now: a file
/// root gave to bob shows bob nothing alice wrote into it before.
pub fn may(who: &Who, then: &Perms, now: Option<&Now>, want: u32) -> bool {
    let perms = now.map_or(then, |n| &n.perms);
    let dirs = now.map_or(&[][..], |n| n.dirs.as_slice());
    let passes = |p: &Perms| who.uid == p.uid || p.permits(who, want);
    who.uid == 0 || (passes(then) && passes(perms) && dirs.iter().all(|d| d.permits(who, SEARCH)))
}

impl Past<'_> {
    /// `obj` as it is now, if history or the live tree knows it: the live
    /// object at its recorded path, or its last recorded state under its
    /// last parent's way now.
    pub fn now_of(&self, obj: ObjectId) -> Result<Option<Now>> {
        // Recorded states of deleted objects, from `obj` up.
        let mut gone: Vec<Perms> = Vec::new();
        let mut cur = obj;
        for _ in 0..4096 {
            if let Some(live) = self.live_way(cur)? {
                let Some((first, above)) = gone.split_first() else {
                    return Ok(Some(live));
                };
                let mut dirs = live.dirs;
                dirs.push(live.perms);
                dirs.extend(above.iter().rev().cloned());
                return Ok(Some(Now {
                    perms: first.clone(),
                    dirs,
                }));
            }
            let Some((seq, v)) = self.history.latest(cur)? else {
                break;
            };
            gone.push(Perms::of_version(&v));
            // A removal's version is recorded with the name already gone.
            let named = if v.gone { seq.prev() } else { seq };
            match self.history.name_at(cur, named)? {
                Some((parent, _)) if parent != cur => cur = parent,
                _ => break,
            }
        }
        // No live ancestor found: what was recorded, without a way.
        Ok(gone.first().cloned().map(|perms| Now {
            perms,
            dirs: Vec::new(),
        }))
    }

    /// The live object `obj` at its recorded path (checked to be the
    /// same object), with the permissions of each directory on the way.
    fn live_way(&self, obj: ObjectId) -> Result<Option<Now>> {
        let mut fd = sys::reopen(self.root, libc::O_PATH)?;
        let mut dirs = Vec::new();
        if obj != ROOT {
            let Some(path) = self.history.path_at(obj, Seq::MAX)? else {
                return Ok(None);
            };
            for (i, comp) in path.iter().enumerate() {
                dirs.push(Perms::of_live(fd.as_fd(), &sys::fstat(fd.as_fd())?)?);
                match self.live_step(fd.as_fd(), i == 0, comp)? {
                    Some(Cur::Live { fd: next, .. }) => fd = next,
                    _ => return Ok(None),
                }
            }
        }
        let st = sys::fstat(fd.as_fd())?;
        if obj != ROOT && self.live.identify(&st) != Some(obj) {
            return Ok(None);
        }
        Ok(Some(Now {
            perms: Perms::of_live(fd.as_fd(), &st)?,
            dirs,
        }))
    }

    /// A node's permissions as the past shows it.
    fn then_of(node: &Node) -> Result<Perms> {
        match node {
            Node::Hist { v, .. } => Ok(Perms::of_version(v)),
            Node::Live { fd, st, .. } => Ok(Perms::of_live(fd.as_fd(), st)?),
        }
    }

    /// A node's object as it is now.
    fn now_of_node(&self, node: &Node) -> Result<Option<Now>> {
        match node {
            Node::Hist { obj, .. } | Node::Live { obj: Some(obj), .. } => self.now_of(*obj),
            Node::Live { obj: None, .. } => Ok(None),
        }
    }

    /// Whether `who` may learn what `path` leads to (its metadata, its
    /// history's rows; with `want` = `READ`, a directory's names): `check`
    /// at the last instant the path led somewhere (now, or just before its
    /// last object left it). A path that never led anywhere shows nothing
    /// to protect.
    pub fn check_way(&self, who: &Who, path: &[Vec<u8>], want: u32) -> Result<()> {
        if who.uid == 0 {
            return Ok(());
        }
        let last = self
            .incarnations(path)?
            .into_iter()
            .map(|(_, _, until)| until)
            .max_by_key(|u| u.map_or(Seq::MAX, |s| s));
        let seq = match last {
            None => return Ok(()),
            Some(None) => self.history.last_seq(),
            Some(Some(until)) => until.prev(),
        };
        match self.resolve(path, seq)? {
            Some(node) => self.check(who, path, seq, &node, want),
            None => Ok(()),
        }
    }

    /// Whether every directory on `obj`'s way at its version `(at, gone)`
    /// could be searched by `who` then (a removal's version is recorded
    /// with the name already gone: its way is the one just before). A way
    /// history does not know is not held against it.
    pub fn way_then_permits(
        &self,
        who: &Who,
        obj: ObjectId,
        (at, gone): (Seq, bool),
    ) -> Result<bool> {
        self.way_then_open(Whom::One(who), obj, (at, gone))
    }

    /// [`Past::way_then_permits`] for `whom`.
    pub fn way_then_open(
        &self,
        whom: Whom<'_>,
        obj: ObjectId,
        (at, gone): (Seq, bool),
    ) -> Result<bool> {
        let named = if gone { at.prev() } else { at };
        let names = self.history.names_at(obj, named)?;
        if names.is_empty() {
            return Ok(true);
        }
        // A file with several names then: any way the caller could search
        // reached it (a link in a closed directory hides no other name).
        'names: for (parent, name) in names {
            let Some(mut path) = self.history.path_at(parent, named)? else {
                return Ok(true);
            };
            path.push(name);
            for depth in 0..path.len() {
                match self.resolve(&path[..depth], named)? {
                    Some(dir) if whom.has(&Self::then_of(&dir)?, SEARCH) => {}
                    _ => continue 'names,
                }
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the names in directory `dir` were `whom`'s to learn at
    /// `seq`: read on it as it was then, search on its way then (a
    /// deleted entry's name is shown only where the directory could be
    /// listed just before the removal). An owner then passes the mode, as
    /// in [`may`].
    pub fn listable_then(&self, whom: Whom<'_>, dir: ObjectId, seq: Seq) -> Result<bool> {
        let Some(node) = self.finish(Cur::Hist(dir), seq)? else {
            return Ok(false);
        };
        let then = Self::then_of(&node)?;
        let owner = matches!(whom, Whom::One(who) if who.uid == then.uid);
        Ok((owner || whom.has(&then, READ)) && self.way_then_open(whom, dir, (seq, false))?)
    }

    /// The state now of `node`, which history knows no way to (never
    /// recorded by name: unchanged where the walk found it), as the
    /// directory the walk found it in is now (`way`: the nodes of the
    /// path's prefixes, from the root), that directory's own way if
    /// history knows it, else its parent's, and so on up. `None` where a
    /// prefix did not resolve: not to be read.
    pub fn now_along(&self, way: &[Option<Node>], node: &Node) -> Result<Option<Now>> {
        let mut below = Vec::new();
        for dir in way.iter().rev() {
            let Some(dir) = dir else {
                return Ok(None);
            };
            if let Some(known) = self.now_of_node(dir)? {
                let mut dirs = known.dirs;
                dirs.push(known.perms);
                dirs.extend(below.into_iter().rev());
                return Ok(Some(Now {
                    perms: Self::then_of(node)?,
                    dirs,
                }));
            }
            below.push(Self::then_of(dir)?);
        }
        Ok(None)
    }

    /// Whether `who` may `want` (`READ`) `node`, reached by `path` at
    /// `seq`: search permission on each ancestor as it was at `seq` (as
    /// `.history/@seq/` presents them) and on the object's own ancestors
    /// at its version where `path` led elsewhere then (a version from
    /// before a rename), and the rule of [`may`].
    pub fn check(
        &self,
        who: &Who,
        path: &[Vec<u8>],
        seq: Seq,
        node: &Node,
        want: u32,
    ) -> Result<()> {
        if who.uid == 0 {
            return Ok(());
        }
        let mut way = Vec::with_capacity(path.len());
        for depth in 0..path.len() {
            // A prefix that did not resolve at `seq` (a version from before
            // the object got this name) is not presented: the object's own
            // way then is checked below instead.
            let dir = self.resolve(&path[..depth], seq)?;
            if let Some(dir) = &dir {
                if !Self::then_of(dir)?.permits(who, SEARCH) {
                    return Err(Error::Denied(format!(
                        "{} at #{seq} could not be searched by uid {}",
                        show_path(&path[..depth]),
                        who.uid
                    )));
                }
            }
            way.push(dir);
        }
        if let Node::Hist { obj, seq: at, v } = node {
            let led_here = match self.resolve(path, seq)? {
                Some(Node::Hist { obj: o, .. }) | Some(Node::Live { obj: Some(o), .. }) => {
                    o == *obj
                }
                _ => false,
            };
            if !led_here && !self.way_then_permits(who, *obj, (*at, v.gone))? {
                return Err(Error::Denied(format!(
                    "{} at #{at} lay in a directory uid {} could not search then",
                    show_path(path),
                    who.uid
                )));
            }
        }
        let then = Self::then_of(node)?;
        let now = match self.now_of_node(node)? {
            Some(now) => Some(now),
            None => self.now_along(&way, node)?,
        };
        if now.is_some() && may(who, &then, now.as_ref(), want) {
            return Ok(());
        }
        let what = match want {
            READ => "readable",
            0 | SEARCH => "searchable",
            _ => "readable and searchable",
        };
        let when = if then.permits(who, want) {
            "as it is now"
        } else {
            "as it was then"
        };
        Err(Error::Denied(format!(
            "{} at #{seq} is not {what} by uid {} {when}",
            show_path(path),
            who.uid
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = ACL_VERSION.to_le_bytes().to_vec();
        for (t, p, id) in entries {
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&p.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    /// `uid` with primary group `gid`; uids 11 and 12 are also in 500.
    fn who(uid: u32, gid: u32) -> Who {
        let w = Who::new(uid, gid, 0);
        let _ = w.groups.set(if uid == 11 || uid == 12 {
            vec![500]
        } else {
            vec![]
        });
        w
    }

    fn perms(mode: u32, acl: Option<Vec<u8>>) -> Perms {
        Perms {
            mode: libc::S_IFREG | mode,
            uid: 10,
            gid: 20,
            acl,
        }
    }

    #[test]
    fn mode_bits_by_class() {
        let p = perms(0o640, None);
        assert!(p.permits(&who(10, 1), READ));
        assert!(p.permits(&who(11, 20), READ));
        assert!(!p.permits(&who(11, 21), READ));
        assert!(p.permits(&who(0, 0), READ));
        // Owner class decides alone, even when others may.
        assert!(!perms(0o044, None).permits(&who(10, 20), READ));
        let sup = perms(0o040, None);
        assert!(!sup.permits(&who(11, 21), READ));
        assert!(Perms { gid: 500, ..sup }.permits(&who(11, 21), READ));
    }

    #[test]
    fn acl_named_entries_and_mask() {
        let a = acl(&[
            (ACL_USER_OBJ, 6, u32::MAX),
            (ACL_USER, 4, 11),
            (ACL_GROUP_OBJ, 0, u32::MAX),
            (ACL_GROUP, 4, 500),
            (ACL_MASK, 4, u32::MAX),
            (0x20, 0, u32::MAX),
        ]);
        let p = perms(0o640, Some(a.clone()));
        assert!(p.permits(&who(11, 1), READ), "named user");
        assert!(p.permits(&who(12, 1), READ), "named group (supplementary)");
        assert!(!p.permits(&who(13, 20), READ), "owning group's entry is 0");
        assert!(!p.permits(&who(13, 1), READ), "other");
        // The mask (the mode's group bits) limits named entries.
        assert!(!perms(0o600, Some(a)).permits(&who(11, 1), READ));
    }

    #[test]
    fn both_then_and_now() {
        let open = perms(0o644, None);
        let private = perms(0o600, None);
        let now = |p: &Perms, dirs: Vec<Perms>| Now {
            perms: p.clone(),
            dirs,
        };
        let w = who(11, 1);
        assert!(may(&w, &open, None, READ));
        assert!(!may(&w, &open, Some(&now(&private, vec![])), READ));
        assert!(!may(&w, &private, Some(&now(&open, vec![])), READ));
        let dir = |mode| Perms {
            mode: libc::S_IFDIR | mode,
            ..Perms::default()
        };
        assert!(may(&w, &open, Some(&now(&open, vec![dir(0o755)])), READ));
        assert!(
            !may(
                &w,
                &open,
                Some(&now(&open, vec![dir(0o755), dir(0o700)])),
                READ
            ),
            "a directory on the way closed now"
        );
        let own_dir = Perms {
            uid: 10,
            ..dir(0o700)
        };
        let mine = Some(now(&private, vec![own_dir]));
        assert!(may(&who(10, 1), &private, mine.as_ref(), READ), "owner");
        assert!(may(&who(0, 0), &private, mine.as_ref(), READ), "root");
        let closed = Some(now(&private, vec![dir(0o700)]));
        assert!(
            !may(&who(10, 1), &private, closed.as_ref(), READ),
            "the owner, below another's closed directory"
        );
        // Given to uid 11 since: what uid 10 kept private then stays so.
        let given = Some(now(
            &Perms {
                uid: 11,
                ..private.clone()
            },
            vec![],
        ));
        assert!(!may(&w, &private, given.as_ref(), READ), "owner now only");
        assert!(may(&w, &open, given.as_ref(), READ), "open then, owned now");
    }
}
