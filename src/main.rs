//! chronofs: continuous versioning, time travel, union mounts and clones
//! for plain directories, as a FUSE file system. See docs/ARCHITECTURE.md.
#![deny(unsafe_code)]

mod branch;
mod capture;
mod cli;
mod control;
mod fuse;
mod history;
mod policy;
mod store;
mod sys;
mod vfs;

fn main() {
    std::process::exit(cli::main());
}
