//! Who else uses a branch directory: a fold (`snapmerge`) rewrites two
//! branches in place, which only the mount folding them may see happen.
//!
//! Every chronofs daemon holds a shared `flock(2)` on each of its branch
//! directories ([`claim`]); a fold takes its two branches' locks
//! exclusively ([`Claim::exclusive`]), which fails while another chronofs
//! mount (or a `chronofs` command holding a store open over it) holds one.
//! An flock belongs to one open file description, so a process keeps one
//! per directory, counted ([`CLAIMS`]): its own mounts and sandboxes never
//! conflict with one another (a sandbox refuses branch changes on its own).
//!
//! Mounts that take no lock are found in `/proc/self/mountinfo`
//! ([`mounts_over`]): kernel overlayfs (its layers are in its options) and
//! mergerfs (its branches are its source). Other FUSE unions
//! (fuse-overlayfs, unionfs-fuse) name their layers nowhere the kernel
//! shows: not detected.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use rustix::fs::{flock, FlockOperation};

use crate::sys;

/// A directory by (device, inode).
type DirKey = (u64, u64);

/// This process's locked descriptor of each claimed directory, and how
/// many claims share it.
static CLAIMS: Mutex<Option<HashMap<DirKey, (OwnedFd, usize)>>> = Mutex::new(None);

/// A shared claim on a branch directory, held while it is a branch of a
/// mount of this process.
#[derive(Debug)]
pub struct Claim {
    key: DirKey,
}

/// Claims the directory `root` (any descriptor of it, O_PATH included).
/// Fails (`WouldBlock`) while another process folds it.
pub fn claim(root: BorrowedFd<'_>) -> io::Result<Claim> {
    let st = sys::fstat(root)?;
    let key = (st.st_dev, st.st_ino);
    let mut claims = CLAIMS.lock();
    let claims = claims.get_or_insert_with(HashMap::new);
    if let Some((_, n)) = claims.get_mut(&key) {
        *n += 1;
        return Ok(Claim { key });
    }
    let fd = sys::reopen_dir(root, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)?;
    flock(&fd, FlockOperation::NonBlockingLockShared)?;
    claims.insert(key, (fd, 1));
    Ok(Claim { key })
}

/// [`claim`] where the directory can be read; a fold running elsewhere is
/// an error (`ResourceBusy`, one line), any other failure a warning naming
/// the branch as `what`.
pub fn claim_or_warn(
    root: BorrowedFd<'_>,
    what: &dyn std::fmt::Display,
) -> io::Result<Option<Claim>> {
    match claim(root) {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            // Callers name the branch.
            "another mount is folding this branch (snapmerge)".to_string(),
        )),
        Err(e) => {
            tracing::warn!(
                "{what}: not claimed ({e}): a snapmerge by another mount will not see this one"
            );
            Ok(None)
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claims = CLAIMS.lock();
        let Some(claims) = claims.as_mut() else {
            return;
        };
        if let Some((_, n)) = claims.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                claims.remove(&self.key);
            }
        }
    }
}

/// A claim held exclusively: no other chronofs process uses the directory
/// until it drops (back to shared).
#[derive(Debug)]
pub struct Exclusive<'c> {
    claim: &'c Claim,
}

impl Claim {
    /// The claim, exclusively; `WouldBlock`: another process holds it.
    pub fn exclusive(&self) -> io::Result<Exclusive<'_>> {
        let claims = CLAIMS.lock();
        let Some((fd, _)) = claims.as_ref().and_then(|c| c.get(&self.key)) else {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        };
        match flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Exclusive { claim: self }),
            Err(e) => {
                // A failed conversion drops the shared lock first.
                if let Err(again) = flock(fd, FlockOperation::NonBlockingLockShared) {
                    tracing::warn!("a branch's shared claim could not be taken back: {again}");
                }
                Err(e.into())
            }
        }
    }
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        let claims = CLAIMS.lock();
        if let Some((fd, _)) = claims.as_ref().and_then(|c| c.get(&self.claim.key)) {
            if let Err(e) = flock(fd, FlockOperation::NonBlockingLockShared) {
                tracing::warn!("a branch's claim could not return to shared: {e}");
            }
        }
    }
}

/// The mount points of kernel overlayfs and mergerfs mounts with a layer
/// or branch at, inside or above the directory `root`.
pub fn mounts_over(root: BorrowedFd<'_>) -> io::Result<Vec<PathBuf>> {
    let dir = std::fs::read_link(Path::new(
        sys::proc_fd_path(root.as_fd()).to_str().unwrap_or(""),
    ))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(parse_mountinfo)
        .filter(|m| {
            m.layers
                .iter()
                .any(|l| l.starts_with(&dir) || dir.starts_with(l))
        })
        .map(|m| m.point)
        .collect())
}

/// A mount of mountinfo that names its layers.
#[derive(Debug, PartialEq)]
struct Layered {
    point: PathBuf,
    layers: Vec<PathBuf>,
}

/// One mountinfo line: `ID PARENT MAJ:MIN ROOT POINT OPTS [TAGS...] - TYPE
/// SOURCE SUPER-OPTS`, its fields octal-escaped.
fn parse_mountinfo(line: &str) -> Option<Layered> {
    let (head, tail) = line.split_once(" - ")?;
    let point = unescape(head.split(' ').nth(4)?);
    let mut tail = tail.split(' ');
    let (fstype, source, opts) = (tail.next()?, tail.next()?, tail.next().unwrap_or(""));
    let layers: Vec<PathBuf> = match fstype {
        "overlay" => opts
            .split(',')
            .filter_map(|o| o.split_once('='))
            .filter(|(k, _)| {
                matches!(
                    *k,
                    "lowerdir" | "upperdir" | "workdir" | "lowerdir+" | "datadir+"
                )
            })
            .flat_map(|(_, v)| v.split(':').map(unescape).collect::<Vec<_>>())
            .collect(),
        "fuse.mergerfs" => source
            .split(':')
            .map(|b| unescape(b.split('=').next().unwrap_or(b)))
            .collect(),
        _ => return None,
    };
    let layers = layers.into_iter().filter(|l| l.is_absolute()).collect();
    Some(Layered { point, layers })
}

/// mountinfo's octal escapes (`\040` for a space) undone.
pub fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_and_mergerfs_lines_name_their_layers() {
        let overlay = "412 30 0:77 / /mnt/o\\040x rw,relatime - overlay overlay \
                       rw,lowerdir=/l1:/l\\0402,upperdir=/u,workdir=/w,redirect_dir=on";
        assert_eq!(
            parse_mountinfo(overlay),
            Some(Layered {
                point: "/mnt/o x".into(),
                layers: vec!["/l1".into(), "/l 2".into(), "/u".into(), "/w".into()],
            })
        );
        let mergerfs = "500 30 0:80 / /mnt/m rw,nosuid shared:1 - fuse.mergerfs /b1=RW:/b2=RO \
                        rw,user_id=0";
        assert_eq!(
            parse_mountinfo(mergerfs).map(|m| m.layers),
            Some(vec!["/b1".into(), "/b2".into()])
        );
        let ext4 = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw";
        assert_eq!(parse_mountinfo(ext4), None);
    }

    #[test]
    fn a_claim_is_shared_within_the_process_and_exclusive_against_others() {
        let dir = tempfile::tempdir().unwrap();
        let c = sys::cstr(dir.path().as_os_str()).unwrap();
        let fd = sys::openat(sys::CWD, &c, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();
        let (a, b) = (claim(fd.as_fd()).unwrap(), claim(fd.as_fd()).unwrap());
        drop(a.exclusive().unwrap());
        // Another open file description stands for another process.
        let other = sys::openat(sys::CWD, &c, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        flock(&other, FlockOperation::NonBlockingLockShared).unwrap();
        let e = b.exclusive().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        flock(&other, FlockOperation::Unlock).unwrap();
        let held = b.exclusive().unwrap();
        assert_eq!(
            flock(&other, FlockOperation::NonBlockingLockShared)
                .map_err(io::Error::from)
                .unwrap_err()
                .kind(),
            io::ErrorKind::WouldBlock,
            "a fold keeps others out"
        );
        drop(held);
        flock(&other, FlockOperation::NonBlockingLockShared).unwrap();
        drop((a, b));
        assert!(CLAIMS.lock().as_ref().is_some_and(|c| !c.contains_key(&(
            sys::fstat(fd.as_fd()).unwrap().st_dev,
            sys::fstat(fd.as_fd()).unwrap().st_ino
        ))));
    }
}
