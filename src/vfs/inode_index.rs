//! The inode table's two indexes. Each is a set of the table's entries,
//! looked up by the number or backing key inside them: 8 bytes a slot,
//! where maps would hold the number or key a second time (the table holds
//! one slot in each per inode the kernel remembers).

use std::collections::HashSet;
use std::sync::Arc;

use super::inodes::{Inode, InodeNo};
use crate::store::BackingKey;

/// Inodes by number: a set of the entries, looked up by the number inside
/// them (8 bytes a slot, where a map would hold the number again).
#[derive(Default)]
pub(super) struct ByIno(HashSet<InoEntry>);

struct InoEntry(Arc<Inode>);

impl ByIno {
    pub(super) fn get(&self, ino: &InodeNo) -> Option<&Arc<Inode>> {
        self.0.get(ino).map(|e| &e.0)
    }

    /// Adds `inode` under its number, replacing what held it.
    pub(super) fn insert(&mut self, inode: Arc<Inode>) {
        self.0.replace(InoEntry(inode));
    }

    pub(super) fn remove(&mut self, ino: &InodeNo) {
        self.0.remove(ino);
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Arc<Inode>> {
        self.0.iter().map(|e| &e.0)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn capacity(&self) -> usize {
        self.0.capacity()
    }

    pub(super) fn shrink_to(&mut self, min: usize) {
        self.0.shrink_to(min);
    }
}

/// Numbers by backing key, a set of the entries likewise (8 bytes a slot
/// instead of 32). An entry's key and number are its inode's.
#[derive(Default)]
pub(super) struct ByKey(HashSet<KeyEntry>);

struct KeyEntry(Arc<Inode>);

impl ByKey {
    pub(super) fn get(&self, key: &BackingKey) -> Option<&InodeNo> {
        self.0.get(key).map(|e| &e.0.ino)
    }

    /// Makes `inode`'s key name it, replacing the inode it named.
    pub(super) fn insert(&mut self, inode: Arc<Inode>) {
        self.0.replace(KeyEntry(inode));
    }

    pub(super) fn remove(&mut self, key: &BackingKey) {
        self.0.remove(key);
    }

    pub(super) fn shrink_to(&mut self, min: usize) {
        self.0.shrink_to(min);
    }
}

/// An index entry is found, hashed and compared by one field of its
/// inode alone, so a set of entries serves as a map from that field.
macro_rules! keyed_by {
    ($entry:ty, $field:ident: $key:ty) => {
        impl std::borrow::Borrow<$key> for $entry {
            fn borrow(&self) -> &$key {
                &self.0.$field
            }
        }

        impl std::hash::Hash for $entry {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.$field.hash(state);
            }
        }

        impl PartialEq for $entry {
            fn eq(&self, other: &Self) -> bool {
                self.0.$field == other.0.$field
            }
        }

        impl Eq for $entry {}
    };
}

keyed_by!(InoEntry, ino: InodeNo);
keyed_by!(KeyEntry, key: BackingKey);
