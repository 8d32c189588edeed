//! chronofs: continuous versioning, time travel, union mounts and clones
//! for plain directories, as a FUSE file system. See docs/ARCHITECTURE.md.
#![deny(unsafe_code)]

mod branch;
mod cli;
mod fuse;
mod store;
mod sys;
mod vfs;

fn main() {
    std::process::exit(cli::main());
}
