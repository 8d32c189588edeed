//! chronofs: continuous versioning, time travel, union mounts and clones
//! for plain directories, as a FUSE file system. See docs/ARCHITECTURE.md.
//!
//! The modules are the design's layers, lowest first: `sys` (system calls),
//! `store` (packs, index file, journal), `policy`, `history` (versions,
//! queries, past trees), `capture` (what the mount records), `branch`,
//! `vfs` (the file system's semantics, without FUSE), `control` (the
//! CLI-daemon protocol), `fuse` (the kernel edge) and `cli`. A module uses
//! only the layers below it (`scripts/check-layers`).
#![deny(unsafe_code)]

pub mod branch;
pub mod capture;
pub mod cli;
pub mod control;
pub mod fuse;
pub mod history;
pub mod policy;
pub mod store;
pub mod sys;
pub mod union;
pub mod vfs;
