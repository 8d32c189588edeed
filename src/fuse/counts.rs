//! FUSE requests served, by kind: what `chronofs status --requests`
//! shows, so that a change that adds a round trip shows up in numbers
//! (and in `tests/requests.rs`) rather than only in a benchmark.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! request_kinds {
    ($($kind:ident => $name:literal,)*) => {
        /// A kind of FUSE request the adapter answers.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Req { $($kind,)* }

        impl Req {
            /// The kernel's name for it (`FUSE_LOOKUP` → `lookup`).
            const NAMES: &'static [&'static str] = &[$($name,)*];
        }
    };
}

request_kinds! {
    Lookup => "lookup",
    // A BATCH_FORGET counts once per inode it names (fuser hands its
    // entries over one by one).
    Forget => "forget",
    Getattr => "getattr",
    Setattr => "setattr",
    Readlink => "readlink",
    Mknod => "mknod",
    Mkdir => "mkdir",
    Unlink => "unlink",
    Rmdir => "rmdir",
    Symlink => "symlink",
    Rename => "rename",
    Link => "link",
    Open => "open",
    Read => "read",
    Write => "write",
    Flush => "flush",
    Release => "release",
    Fsync => "fsync",
    Opendir => "opendir",
    Readdir => "readdir",
    Readdirplus => "readdirplus",
    Releasedir => "releasedir",
    Fsyncdir => "fsyncdir",
    Statfs => "statfs",
    Setxattr => "setxattr",
    Getxattr => "getxattr",
    Listxattr => "listxattr",
    Removexattr => "removexattr",
    Access => "access",
    Create => "create",
    Tmpfile => "tmpfile",
    Fallocate => "fallocate",
    Lseek => "lseek",
    CopyFileRange => "copy_file_range",
}

/// One counter per request kind, shared by the request threads (a relaxed
/// increment each: no lock, no allocation on the request path).
#[derive(Debug)]
pub struct RequestCounts {
    by_kind: Vec<AtomicU64>,
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            by_kind: Req::NAMES.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl RequestCounts {
    pub fn add(&self, kind: Req) {
        if let Some(c) = self.by_kind.get(kind as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every kind served at least once, with its count, in the order above.
    pub fn served(&self) -> Vec<(&'static str, u64)> {
        Req::NAMES
            .iter()
            .zip(&self.by_kind)
            .map(|(name, c)| (*name, c.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_name_and_a_counter_of_its_own() {
        let c = RequestCounts::default();
        assert_eq!(c.by_kind.len(), Req::NAMES.len());
        c.add(Req::Lookup);
        c.add(Req::Lookup);
        c.add(Req::CopyFileRange);
        assert_eq!(c.served(), [("lookup", 2), ("copy_file_range", 1)]);
    }
}
