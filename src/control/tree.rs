//! The `Tree` request: a whole subtree at an instant in one answer, with
//! everything a tree operation (restore, revert, undelete) must bring back
//! exactly: object ids (two names of one object are one hard-linked
//! file), extended attribute values (ACLs included) and names as bytes.

use super::proto::{NodeInfo, TreeReply, XattrValue};
use super::service::{who, Result, Service};
use super::Components;
use crate::history::access;
use crate::history::past::Node;
use crate::sys::{self, Peer};

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

impl Service {
    /// `path` and everything under it at `at`, each directory node with
    /// its entries (`shallow`: `path` alone).
    pub(super) fn tree(
        &self,
        path: &Components,
        at: &super::At,
        shallow: bool,
        peer: &Peer,
    ) -> Result<TreeReply> {
        let (seq, time) = self.resolve_at(at)?;
        let node = self.past().node(path, seq)?;
        let mut path = path.clone();
        let root = self.tree_node(&mut path, node, seq, !shallow, peer)?;
        Ok(TreeReply {
            seq,
            time_ns: time,
            root,
        })
    }

    fn tree_node(
        &self,
        path: &mut Components,
        node: Node,
        seq: crate::history::Seq,
        with_entries: bool,
        peer: &Peer,
    ) -> Result<NodeInfo> {
        // The rule of every past read (docs/ARCHITECTURE.md "Who may read
        // the past"): a directory's listing with its entries' attributes
        // needs read and search on it, an xattr's value read; a file's
        // attributes (and a symlink's target) search on its way, as
        // stat(2) and readlink(2) do.
        let is_dir = node.mode() & libc::S_IFMT == libc::S_IFDIR;
        let want = if is_dir {
            access::READ | access::SEARCH
        } else {
            access::READ
        };
        let readable = match self.past().check(&who(peer), path, seq, &node, want) {
            Ok(()) => true,
            Err(e) if is_dir => return Err(e),
            Err(_) => {
                self.past().check(&who(peer), path, seq, &node, 0)?;
                false
            }
        };
        let mut d = self.describe(&node);
        let xattrs = match &node {
            Node::Hist { v, .. } => self.visible_xattrs(&v.xattrs, readable, peer),
            Node::Live { fd, .. } => {
                let live = sys::xattrs_of(std::os::fd::AsFd::as_fd(fd)).unwrap_or_default();
                self.visible_xattrs(&live, readable, peer)
            }
        };
        d.xattr_values = Some(xattrs);
        if is_dir && with_entries {
            let past = self.past();
            let mut entries = Vec::new();
            for name in past.names(&node, seq, path.is_empty())? {
                path.push(name);
                if let Some(child) = past.resolve(path, seq)? {
                    let mut e = self.tree_node(path, child, seq, true, peer)?;
                    if let Some(name) = path.last() {
                        e.set_name(name);
                    }
                    entries.push(e);
                }
                path.pop();
            }
            d.entries = Some(entries);
        }
        Ok(d)
    }

    /// The attributes a peer may have back: `trusted.*` for root only (as
    /// the kernel hides them), `user.*` values only from a version the
    /// peer could read; ACLs and `security.*` are readable by anyone.
    fn visible_xattrs(
        &self,
        xattrs: &[(Vec<u8>, Vec<u8>)],
        readable: bool,
        peer: &Peer,
    ) -> Vec<XattrValue> {
        xattrs
            .iter()
            .filter(|(k, _)| {
                peer.uid == 0
                    || (!k.starts_with(b"trusted.") && (readable || !k.starts_with(b"user.")))
            })
            .map(|(k, val)| {
                let (name, name_raw) = super::proto::split_bytes(k);
                XattrValue {
                    name,
                    name_raw,
                    hex: hex(val),
                }
            })
            .collect()
    }
}
