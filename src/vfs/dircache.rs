//! Whether the kernel may keep a directory's listing across opens (FUSE's
//! readdir cache), decided at each opendir. The kernel drops the listing
//! itself when the directory changes through the mount (its iversion) or
//! its mtime changes; these rules cover what it cannot see: changes behind
//! the mount, and a union directory's lower layers, whose changes never
//! show in the merged directory's own attributes.

use std::hash::{Hash, Hasher};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::inodes::Node;
use super::Vfs;
use crate::sys;

/// What the kernel may do with the listing it caches for a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirCache {
    /// Never cache: the listing moves while the directory's attributes do
    /// not (`.history`, `DIR/;deleted`).
    Off,
    /// Drop the cached listing and cache what this open reads.
    Fresh,
    /// Keep the cached listing: nothing changed since it was read.
    Keep,
}

/// An open directory: its handle and what the kernel may cache.
pub struct OpenedDir {
    pub fh: u64,
    pub cache: DirCache,
}

/// A directory whose mtime or ctime is this recent may still change
/// within the same timestamp: ext4 and its kin stamp with a clock tick of
/// up to 10 ms, so a stamp of such a directory proves nothing about later
/// changes. File systems that keep whole seconds (or FAT's two) show no
/// nanoseconds and get the longer window.
const RACY: Duration = Duration::from_millis(50);
const RACY_COARSE: Duration = Duration::from_secs(3);

/// "No trusted stamp": the next open makes the kernel re-read.
pub(super) const UNTRUSTED: u64 = 0;

impl Vfs {
    /// Keep when every copy of `dir` (its layers, for a union) has the
    /// stamp it had when an open last made the kernel re-read the listing;
    /// otherwise Fresh, with the stamp to record once the open succeeds
    /// (taken before anything is read, so a change during the read shows
    /// as a difference next time).
    pub(super) fn listing_cache(&self, dir: &Node) -> (DirCache, u64) {
        let now = self.listing_stamp(dir);
        if now != UNTRUSTED && dir.listed.load(Ordering::Acquire) == now {
            (DirCache::Keep, now)
        } else {
            (DirCache::Fresh, now)
        }
    }

    /// A hash of the attributes of every copy of `dir` that any entry
    /// change alters, or UNTRUSTED if one cannot be read or is racy.
    fn listing_stamp(&self, dir: &Node) -> u64 {
        let copies = if !dir.has_layers() {
            vec![dir.fd_arc()]
        } else {
            match self.layers_of(dir) {
                Ok(layers) => layers.into_iter().map(|l| l.fd).collect(),
                Err(_) => return UNTRUSTED,
            }
        };
        // Before 1970 every stamp counts as racy.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut h = std::hash::DefaultHasher::new();
        self.inodes.numbering().hash(&mut h);
        for fd in &copies {
            match sys::fstat(fd.as_fd()) {
                Ok(st) if !racy(&st, now) => {
                    (st.st_dev, st.st_ino, st.st_size, st.st_nlink).hash(&mut h);
                    (st.st_mtime, st.st_mtime_nsec).hash(&mut h);
                    (st.st_ctime, st.st_ctime_nsec).hash(&mut h);
                }
                _ => return UNTRUSTED,
            }
        }
        h.finish().max(1)
    }
}

/// Whether `st` changed too recently for its timestamps to tell a later
/// change apart.
fn racy(st: &sys::Stat, now: Duration) -> bool {
    let coarse = st.st_mtime_nsec == 0 && st.st_ctime_nsec == 0;
    let settled = now.saturating_sub(if coarse { RACY_COARSE } else { RACY });
    let settled = (settled.as_secs() as i64, i64::from(settled.subsec_nanos()));
    let newest = (st.st_mtime, st.st_mtime_nsec).max((st.st_ctime, st.st_ctime_nsec));
    newest >= settled
}
