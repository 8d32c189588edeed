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
//! Pure permission arithmetic plus the one /proc read that loads a
//! caller's supplementary groups (only when a group decides).

use std::cell::OnceCell;
use std::os::fd::BorrowedFd;

use super::Version;
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

/// The rule: `want` on a past state `then` of an object whose state now is
/// `now` (`None`: the same as then).
pub fn may(who: &Who, then: &Perms, now: Option<&Perms>, want: u32) -> bool {
    let now = now.unwrap_or(then);
    who.uid == 0 || who.uid == now.uid || (then.permits(who, want) && now.permits(who, want))
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
        let w = who(11, 1);
        assert!(may(&w, &open, None, READ));
        assert!(!may(&w, &open, Some(&private), READ));
        assert!(!may(&w, &private, Some(&open), READ));
        assert!(may(&who(10, 1), &private, Some(&private), READ), "owner");
        assert!(may(&who(0, 0), &private, Some(&private), READ), "root");
    }
}
