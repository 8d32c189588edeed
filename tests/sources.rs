//! The sources a node resolves through (src/vfs/source.rs), driven through
//! the `Vfs` API without a mount: the kernel would refuse some of these
//! calls itself, so this is where the daemon's own answers are checked.
//! A view (the `Past` source) reads, and refuses every change with the
//! errno the views always gave.

mod inproc;

use inproc::*;

use std::ffi::OsStr;

use chronofs::vfs::{InodeNo, SetAttr, Vfs};

fn errno<T>(r: chronofs::vfs::Result<T>) -> i32 {
    r.err().map_or(0, |e| e.errno())
}

/// A rig with `f` written twice, and the view of `.history/@SEQ` after
/// the first write: (rig, view directory, view of `f`).
fn rig_with_view() -> (Rig, InodeNo, InodeNo) {
    let rig = Rig::new();
    rig.write_file("f", 0o644, b"one").unwrap();
    let first = rig.settle();
    rig.write_file("f", 0o644, b"second").unwrap();
    rig.settle();
    let dir = rig.resolve(&format!(".history/@{first}")).unwrap();
    let f = rig.resolve(&format!(".history/@{first}/f")).unwrap();
    (rig, dir, f)
}

#[test]
fn a_view_file_reads_and_refuses_changes_through_its_handle() {
    let (rig, _, f) = rig_with_view();
    let (vfs, who) = (&rig.vfs, &rig.caller);
    let attr = vfs.getattr(f, None).unwrap();
    assert_eq!((attr.ino, attr.st.st_size), (f, 3));
    assert_eq!(vfs.attr_ttl(&attr).as_secs(), 24 * 3600);
    let opened = vfs.open(who, f, libc::O_RDONLY).unwrap();
    let fh = opened.fh;
    assert_eq!(vfs.read(fh, 0, 100).unwrap(), b"one");
    assert_eq!(vfs.lseek(fh, 0, libc::SEEK_HOLE).unwrap(), 3);
    assert_eq!(errno(vfs.write(who, fh, 0, b"x", false)), libc::EBADF);
    assert_eq!(errno(vfs.fallocate(fh, 0, 1, 0)), libc::EBADF);
    let live = rig.resolve("f").unwrap();
    let live_fh = vfs.open(who, live, libc::O_RDWR).unwrap().fh;
    assert_eq!(
        errno(vfs.copy_file_range(fh, 0, live_fh, 0, 1)),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        errno(vfs.copy_file_range(live_fh, 0, fh, 0, 1)),
        libc::EBADF
    );
    // Answered as the mount's live files are (ENOSYS would turn flushes
    // off for all of them).
    assert!(vfs.flush(fh).unwrap());
    vfs.fsync(fh, false).unwrap();
    assert_eq!(vfs.release(fh).unwrap(), None);
    assert_eq!(errno(vfs.read(fh, 0, 1)), libc::EBADF);
    vfs.release(live_fh).unwrap();
}

#[test]
fn every_change_to_a_view_is_erofs_or_exdev_as_before() {
    let (rig, dir, f) = rig_with_view();
    let (vfs, who) = (&rig.vfs, &rig.caller);
    let name = OsStr::new("g");
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        assert_eq!(errno(vfs.open(who, f, flags)), libc::EROFS);
    }
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    assert_eq!(errno(vfs.setattr(who, f, chmod)), libc::EROFS);
    let xname = OsStr::new("user.x");
    assert_eq!(errno(vfs.setxattr(who, f, xname, b"v", 0)), libc::EROFS);
    assert_eq!(errno(vfs.removexattr(who, f, xname)), libc::EROFS);
    assert_eq!(errno(vfs.access(who, f, libc::W_OK)), libc::EROFS);
    vfs.access(who, f, libc::R_OK).unwrap();
    assert_eq!(errno(vfs.mkdir(who, dir, name, 0o755, 0)), libc::EROFS);
    assert_eq!(
        errno(vfs.mknod(who, dir, name, libc::S_IFIFO | 0o644, 0, 0)),
        libc::EROFS
    );
    assert_eq!(errno(vfs.symlink(who, dir, name, name)), libc::EROFS);
    let create = vfs.create(who, dir, name, 0o644, 0, libc::O_WRONLY);
    assert_eq!(errno(create), libc::EROFS);
    assert_eq!(
        errno(vfs.tmpfile(who, dir, 0o644, 0, libc::O_RDWR)),
        libc::EROFS
    );
    assert_eq!(errno(vfs.unlink(who, dir, OsStr::new("f"))), libc::EROFS);
    assert_eq!(errno(vfs.rmdir(who, dir, OsStr::new("f"))), libc::EROFS);
    assert_eq!(errno(vfs.link(who, f, InodeNo::ROOT, name)), libc::EXDEV);
    let live = rig.resolve("f").unwrap();
    assert_eq!(errno(vfs.link(who, live, dir, name)), libc::EROFS);
    let f_name = OsStr::new("f");
    let out = vfs.rename(who, dir, f_name, InodeNo::ROOT, name, 0);
    assert_eq!(errno(out), libc::EXDEV);
    assert_eq!(
        errno(vfs.rename(who, dir, f_name, dir, name, 0)),
        libc::EROFS
    );
    let into = vfs.rename(who, InodeNo::ROOT, f_name, dir, name, 0);
    assert_eq!(errno(into), libc::EROFS);
    // The live file is untouched by all of it.
    assert_eq!(vfs.getattr(live, None).unwrap().st.st_size, 6);
}

#[test]
fn a_view_directory_lists_and_forgets() {
    let (rig, dir, f) = rig_with_view();
    let (vfs, who): (&Vfs, _) = (&rig.vfs, &rig.caller);
    let fh = vfs.opendir(who, dir, libc::O_RDONLY).unwrap().fh;
    let mut names = Vec::new();
    vfs.readdir(fh, 0, who, |d| {
        names.push((d.name.to_os_string(), d.ino));
        false
    })
    .unwrap();
    let f_entry = (OsStr::new("f").to_os_string(), f);
    assert!(names.contains(&f_entry), "{names:?}");
    let mut plus = Vec::new();
    vfs.readdirplus(fh, 2, who, |d, e| {
        plus.push((d.name.to_os_string(), e.map(|e| e.attr.ino)));
        false
    })
    .unwrap();
    assert!(plus.contains(&(OsStr::new("f").to_os_string(), Some(f))));
    vfs.forget(f, 1);
    vfs.releasedir(fh).unwrap();
    assert_eq!(errno(vfs.releasedir(fh)), libc::EBADF);
    let e = vfs.lookup(who, dir, OsStr::new("f")).unwrap();
    assert_eq!(e.attr.ino, f);
    vfs.forget(f, 2);
    vfs.forget(dir, 1);
}

/// The kernel sends `open(O_RDONLY | O_TRUNC)` of a running program to
/// the daemon (atomic O_TRUNC, no write access taken first): while an
/// open made by execve(2) (`__FMODE_EXEC`) is held, it is ETXTBSY and the
/// file keeps its bytes; after that open's release it truncates.
#[test]
fn a_file_open_for_execution_refuses_a_read_only_truncating_open() {
    const FMODE_EXEC: i32 = 0x20;
    let rig = Rig::new();
    rig.write_file("prog", 0o755, b"#!/bin/sh\n").unwrap();
    let ino = rig.resolve("prog").unwrap();
    let exec = rig
        .vfs
        .open(&rig.caller, ino, libc::O_RDONLY | FMODE_EXEC)
        .unwrap();
    let trunc = libc::O_RDONLY | libc::O_TRUNC;
    assert_eq!(errno(rig.vfs.open(&rig.caller, ino, trunc)), libc::ETXTBSY);
    assert_eq!(rig.vfs.getattr(ino, None).unwrap().st.st_size, 10);
    let reader = rig.vfs.open(&rig.caller, ino, libc::O_RDONLY).unwrap();
    rig.vfs.release(reader.fh).unwrap();
    assert_eq!(errno(rig.vfs.open(&rig.caller, ino, trunc)), libc::ETXTBSY);
    rig.vfs.release(exec.fh).unwrap();
    let t = rig.vfs.open(&rig.caller, ino, trunc).unwrap();
    rig.vfs.release(t.fh).unwrap();
    assert_eq!(rig.vfs.getattr(ino, None).unwrap().st.st_size, 0);
}
