//! Real tools on the mount: cp -a, tar, git, rsync, editors' save
//! patterns, sqlite3 in WAL mode from two processes, rm -rf.

#![deny(unsafe_code)]

mod common;
use common::*;

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn cp_a_tree_in_and_out() {
    each_mode(|m| {
        let orig = m.root().join("orig");
        fs::create_dir(&orig).unwrap();
        build_rich_tree(&orig);
        let want = snapshot(&orig, SNAP_ALL);

        run(
            m.root(),
            "cp",
            &["-a", orig.to_str().unwrap(), m.p("copy").to_str().unwrap()],
        );
        let out = run_out(
            m.root(),
            "diff",
            &[
                "-r",
                "--no-dereference",
                "-x",
                "fifo",
                orig.to_str().unwrap(),
                m.p("copy").to_str().unwrap(),
            ],
        );
        assert!(
            out.status.success(),
            "diff -r orig mnt/copy:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_same_tree(
            &want,
            &snapshot(&m.p("copy"), SNAP_ALL),
            "cp -a into mount",
            &m.log_tail(),
        );

        // And back out of the mount.
        let back = m.root().join("back");
        run(
            m.root(),
            "cp",
            &["-a", m.p("copy").to_str().unwrap(), back.to_str().unwrap()],
        );
        assert_same_tree(
            &want,
            &snapshot(&back, SNAP_ALL),
            "cp -a out of mount",
            &m.log_tail(),
        );

        // A copy within the mount.
        run(
            m.root(),
            "cp",
            &[
                "-a",
                m.p("copy").to_str().unwrap(),
                m.p("copy2").to_str().unwrap(),
            ],
        );
        assert_same_tree(
            &want,
            &snapshot(&m.p("copy2"), SNAP_ALL),
            "cp -a within mount",
            &m.log_tail(),
        );

        // The backing directory holds the same tree.
        m.unmount();
        assert_same_tree(
            &want,
            &snapshot(&m.src.join("copy"), SNAP_ALL),
            "SRC after unmount",
            &m.log_tail(),
        );
        m.start();
    });
}

#[test]
fn tar_round_trip() {
    each_mode(|m| {
        let orig = m.root().join("orig");
        fs::create_dir(&orig).unwrap();
        build_rich_tree(&orig);
        let want = snapshot(&orig, SNAP_ALL);
        let tar = |dir: &Path, op: &str, archive: &Path| {
            let mut a = vec!["-C".to_string(), dir.display().to_string()];
            a.extend(
                [
                    "--xattrs",
                    "--xattrs-include=*",
                    "--acls",
                    "--numeric-owner",
                ]
                .map(String::from),
            );
            a.push(op.to_string());
            a.push(archive.display().to_string());
            if op.starts_with("-c") {
                a.push(".".into());
            }
            let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
            run(m.root(), "tar", &a);
        };

        // Create the archive on the mount from a native tree, extract on the mount.
        tar(&orig, "-cpf", &m.p("a.tar"));
        fs::create_dir(m.p("x")).unwrap();
        tar(&m.p("x"), "-xpf", &m.p("a.tar"));
        assert_same_tree(
            &want,
            &snapshot(&m.p("x"), SNAP_ALL),
            "tar -x on mount",
            &m.log_tail(),
        );

        // Archive the mounted copy, extract natively, compare.
        tar(&m.p("x"), "-cpf", &m.root().join("b.tar"));
        let back = m.root().join("back");
        fs::create_dir(&back).unwrap();
        tar(&back, "-xpf", &m.root().join("b.tar"));
        assert_same_tree(
            &want,
            &snapshot(&back, SNAP_ALL),
            "tar -c from mount, -x native",
            &m.log_tail(),
        );

        // Listings of both archives agree.
        let la = run(
            m.root(),
            "tar",
            &[
                "--numeric-owner",
                "--full-time",
                "-tvf",
                m.p("a.tar").to_str().unwrap(),
            ],
        );
        let lb = run(
            m.root(),
            "tar",
            &[
                "--numeric-owner",
                "--full-time",
                "-tvf",
                m.root().join("b.tar").to_str().unwrap(),
            ],
        );
        let sorted = |s: &str| {
            let mut v: Vec<String> = s.lines().map(String::from).collect();
            v.sort();
            v
        };
        assert_eq!(sorted(&la), sorted(&lb), "tar listings differ");
    });
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "T")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "T")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {} in {} failed: {}\n{}{}",
        args.join(" "),
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn git_workflow() {
    each_mode(|m| {
        m.compare_in("repo", |d| {
            let mut log = Vec::new();
            git(d, &["init", "-q", "-b", "main", "."]);
            // No background maintenance that could outlive the test and keep the mount busy.
            git(d, &["config", "core.fsmonitor", "false"]);
            git(d, &["config", "gc.auto", "0"]);
            git(d, &["config", "gc.autoDetach", "false"]);
            git(d, &["config", "maintenance.auto", "false"]);
            fs::create_dir(d.join("src")).unwrap();
            for i in 0..30 {
                write_file(
                    &d.join(format!("src/f{i}.txt")),
                    format!("file {i}\n").repeat(i + 1).as_bytes(),
                );
            }
            write_file(&d.join("README"), b"readme\n");
            std::os::unix::fs::symlink("README", d.join("link")).unwrap();
            git(d, &["add", "-A"]);
            git(d, &["commit", "-q", "-m", "initial"]);
            log.push(git(d, &["rev-parse", "HEAD"]));
            git(d, &["checkout", "-q", "-b", "feature"]);
            write_file(&d.join("src/f3.txt"), b"changed on feature\n");
            fs::remove_file(d.join("src/f4.txt")).unwrap();
            write_file(&d.join("new.txt"), b"new\n");
            fs::set_permissions(
                d.join("new.txt"),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap();
            git(d, &["add", "-A"]);
            git(d, &["commit", "-q", "-m", "feature work"]);
            log.push(git(d, &["rev-parse", "HEAD"]));
            git(d, &["checkout", "-q", "main"]);
            log.push(format!(
                "main f3: {:?}",
                fs::read_to_string(d.join("src/f3.txt")).unwrap()
            ));
            log.push(format!("main has f4: {}", d.join("src/f4.txt").exists()));
            log.push(format!("main has new.txt: {}", d.join("new.txt").exists()));
            log.push(git(d, &["status", "--porcelain"]));
            git(d, &["checkout", "-q", "feature"]);
            log.push(format!(
                "feature f3: {:?}",
                fs::read_to_string(d.join("src/f3.txt")).unwrap()
            ));
            log.push(format!(
                "feature new.txt mode: {:o}",
                fs::metadata(d.join("new.txt")).unwrap().mode()
            ));
            log.push(git(d, &["status", "--porcelain"]));
            // A dirty working tree is noticed.
            write_file(&d.join("src/f5.txt"), b"dirty\n");
            log.push(git(d, &["status", "--porcelain"]));
            git(d, &["checkout", "--", "src/f5.txt"]);
            log.push(git(d, &["status", "--porcelain"]));
            git(d, &["gc", "-q"]);
            git(d, &["fsck", "--full", "--strict"]);
            log.push(git(d, &["log", "--oneline", "--all"]));
            log
        });
    });
}

#[test]
fn rsync_in_and_out() {
    each_mode(|m| {
        let orig = m.root().join("orig");
        fs::create_dir(&orig).unwrap();
        build_rich_tree(&orig);
        let want = snapshot(&orig, SNAP_ALL);
        let o = format!("{}/", orig.display());
        let dst = m.p("r");
        run(
            m.root(),
            "rsync",
            &["-aHAX", "--numeric-ids", &o, dst.to_str().unwrap()],
        );
        assert_same_tree(
            &want,
            &snapshot(&dst, SNAP_ALL),
            "rsync -aHAX into mount",
            &m.log_tail(),
        );

        // Nothing to do the second time.
        let itemized = run(
            m.root(),
            "rsync",
            &["-aHAXi", "--numeric-ids", &o, dst.to_str().unwrap()],
        );
        assert_eq!(
            itemized.trim(),
            "",
            "second rsync into the mount still transferred/changed things"
        );

        // A delta update (rsync writes a temp file and renames it over).
        let mut big = read_file(&orig.join("dir/big.bin"));
        big[1_000_000..1_000_010].copy_from_slice(b"0123456789");
        write_file(&orig.join("dir/big.bin"), &big);
        // rsync's quick check compares whole seconds: make the change visible.
        set_times(
            &orig.join("dir/big.bin"),
            (1_700_000_000, 0),
            (1_700_000_000, 5),
            true,
        );
        write_file(&orig.join("plain.txt"), b"hello again\n");
        fs::remove_file(orig.join("empty")).unwrap();
        run(
            m.root(),
            "rsync",
            &[
                "-aHAX",
                "--delete",
                "--numeric-ids",
                &o,
                dst.to_str().unwrap(),
            ],
        );
        let want2 = snapshot(&orig, SNAP_ALL);
        assert_same_tree(
            &want2,
            &snapshot(&dst, SNAP_ALL),
            "rsync update into mount",
            &m.log_tail(),
        );

        // --inplace update.
        big[2_000_000..2_000_004].copy_from_slice(b"ABCD");
        write_file(&orig.join("dir/big.bin"), &big);
        set_times(
            &orig.join("dir/big.bin"),
            (1_700_000_100, 0),
            (1_700_000_100, 7),
            true,
        );
        run(
            m.root(),
            "rsync",
            &[
                "-aHAX",
                "--inplace",
                "--no-whole-file",
                "--numeric-ids",
                &o,
                dst.to_str().unwrap(),
            ],
        );
        assert_same_tree(
            &snapshot(&orig, SNAP_ALL),
            &snapshot(&dst, SNAP_ALL),
            "rsync --inplace into mount",
            &m.log_tail(),
        );

        // Out again.
        let back = m.root().join("back");
        run(
            m.root(),
            "rsync",
            &[
                "-aHAX",
                "--numeric-ids",
                &format!("{}/", dst.display()),
                back.to_str().unwrap(),
            ],
        );
        assert_same_tree(
            &snapshot(&orig, SNAP_ALL),
            &snapshot(&back, SNAP_ALL),
            "rsync -aHAX out of mount",
            &m.log_tail(),
        );
        let out = run(
            m.root(),
            "rsync",
            &[
                "-aHAXc",
                "-n",
                "-i",
                "--numeric-ids",
                &format!("{}/", dst.display()),
                &format!("{}/", back.display()),
            ],
        );
        assert_eq!(out.trim(), "", "rsync --checksum dry run finds differences");
    });
}

#[test]
fn editor_save_patterns() {
    each_mode(|m| {
        m.compare_in("ed", |d| {
            let mut r = Vec::new();
            let f = d.join("doc.txt");
            write_file(&f, b"version 1\n");
            set_xattr(&f, "user.keep", b"1", 0).unwrap();
            let ino1 = fs::metadata(&f).unwrap().ino();

            // vim/emacs/gedit: write a temp file, fsync, rename over.
            let tmp = d.join(".doc.txt.swp");
            {
                let fd =
                    Fd::open(&tmp, libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL, 0o644).unwrap();
                fd.write(b"version 2, longer than before\n").unwrap();
                fd.fsync().unwrap();
            }
            fs::rename(&tmp, &f).unwrap();
            let dfd = Fd::open(d, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
            r.push(format!("dir fsync: {:?}", dfd.fsync()));
            r.push(format!("after rename: {:?}", fs::read_to_string(&f)));
            r.push(format!(
                "ino changed: {}",
                fs::metadata(&f).unwrap().ino() != ino1
            ));
            r.push(format!(
                "tmp gone: {:?}",
                e(fs::symlink_metadata(&tmp)).err()
            ));
            r.push(format!(
                "xattr gone with the old inode: {:?}",
                get_xattr(&f, "user.keep")
            ));

            // vim with backupcopy=no: rename original to backup, write new file.
            fs::rename(&f, d.join("doc.txt~")).unwrap();
            write_file(&f, b"version 3\n");
            r.push(format!(
                "backup: {:?}",
                fs::read_to_string(d.join("doc.txt~"))
            ));
            r.push(format!("new: {:?}", fs::read_to_string(&f)));

            // O_TRUNC rewrite in place (same inode), shorter content.
            let ino3 = fs::metadata(&f).unwrap().ino();
            {
                let fd = Fd::open(&f, libc::O_WRONLY | libc::O_TRUNC, 0).unwrap();
                r.push(format!("size right after O_TRUNC: {}", fd.fstat().st_size));
                fd.write(b"v4\n").unwrap();
            }
            r.push(format!(
                "after O_TRUNC rewrite: {:?}",
                fs::read_to_string(&f)
            ));
            r.push(format!(
                "same inode: {}",
                fs::metadata(&f).unwrap().ino() == ino3
            ));
            // O_TRUNC with nothing written leaves an empty file.
            drop(Fd::open(&f, libc::O_WRONLY | libc::O_TRUNC, 0).unwrap());
            r.push(format!("after empty O_TRUNC: {:?}", fs::read(&f)));
            // truncate(2) up and down.
            write_file(&f, b"0123456789");
            fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .unwrap()
                .set_len(4)
                .unwrap();
            r.push(format!("truncated down: {:?}", fs::read(&f)));
            fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .unwrap()
                .set_len(8)
                .unwrap();
            r.push(format!("truncated up: {:?}", fs::read(&f)));
            r.push(format!("listing: {:?}", {
                let mut v: Vec<_> = fs::read_dir(d)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                v.sort();
                v
            }));
            r
        });
    });
}

fn sqlite(db: &Path, sql: &str) -> String {
    let mut c = Command::new("sqlite3")
        .arg("-batch")
        .arg("-cmd")
        .arg(".timeout 20000")
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(sql.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "sqlite3 {} failed: {}\n{}",
        db.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn sqlite_wal_two_processes() {
    each_mode(|m| {
        m.compare_in("db", |d| {
            let db = d.join("t.db");
            let mode = sqlite(&db, "PRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, who TEXT, n INT, payload BLOB);\n");
            // Two writers at once, each 40 transactions of 25 rows.
            let writers: Vec<_> = ["a", "b"]
                .iter()
                .map(|who| {
                    let db = db.clone();
                    let who = who.to_string();
                    std::thread::spawn(move || {
                        let mut sql = String::new();
                        for t in 0..40 {
                            sql.push_str("BEGIN IMMEDIATE;\n");
                            for i in 0..25 {
                                sql.push_str(&format!("INSERT INTO t(who,n,payload) VALUES('{who}',{},randomblob(300));\n", t * 25 + i));
                            }
                            sql.push_str("COMMIT;\n");
                        }
                        sqlite(&db, &sql)
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            let counts = sqlite(&db, "SELECT who, count(*), count(DISTINCT n) FROM t GROUP BY who ORDER BY who;\n");
            let integ = sqlite(&db, "PRAGMA integrity_check;\n");
            let ck = sqlite(&db, "PRAGMA wal_checkpoint(TRUNCATE);\nPRAGMA integrity_check;\nSELECT count(*) FROM t;\n");
            let wal_size = fs::metadata(d.join("t.db-wal")).map(|md| md.len()).ok();
            vec![mode, counts, integ, ck.lines().skip(1).collect::<Vec<_>>().join("\n"), format!("wal size after truncate checkpoint: {wal_size:?}")]
        });
    });
}

#[test]
fn rm_rf_and_find() {
    each_mode(|m| {
        m.compare_in("t", |d| {
            build_rich_tree(&d.join("tree").tap_mkdir());
            for i in 0..20 {
                let sub = d.join(format!("tree/many/{i}"));
                fs::create_dir_all(&sub).unwrap();
                for j in 0..10 {
                    write_file(&sub.join(format!("f{j}")), b"x");
                }
            }
            let find = run(d, "find", &["tree", "-printf", "%p %y %m %n %s\\n"]);
            let mut lines: Vec<&str> = find.lines().collect();
            lines.sort();
            let lines: Vec<String> = lines.into_iter().map(String::from).collect();
            let du = run(d, "du", &["-s", "--apparent-size", "-b", "tree"]);
            run(d, "rm", &["-rf", "tree"]);
            let gone = e(fs::symlink_metadata(d.join("tree"))).err();
            let left: Vec<_> = fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            (lines, du, gone, left)
        });
    });
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}
impl TapMkdir for std::path::PathBuf {
    fn tap_mkdir(self) -> Self {
        fs::create_dir_all(&self).unwrap();
        self
    }
}

/// `cp` of a file another process is writing (its data still in the
/// kernel's writeback cache, with passthrough off): the copy holds the
/// data. The kernel asks the daemon where data lies (SEEK_DATA) without
/// writing its cache back first, and `cp`, seeing few blocks allocated,
/// trusted it: the copy was all zeros.
#[test]
fn cp_of_a_file_being_written_copies_its_data() {
    each_mode(|m| {
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
        let out = tempdir();
        for i in 0..4 {
            let src = m.p(&format!("fresh{i}"));
            let mut writer = fs::File::create(&src).unwrap();
            writer.write_all(&data).unwrap();
            let dst = out.path().join(format!("copy{i}"));
            // Where data lies, as a sparse-aware copier asks.
            let script = "import os, sys\n\
                fd = os.open(sys.argv[1], os.O_RDONLY)\n\
                print(os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE))\n";
            let o = Command::new("python3")
                .args(["-c", script])
                .arg(&src)
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&o.stdout).trim(),
                "0 1048576",
                "{o:?}"
            );
            let st = Command::new("cp").arg(&src).arg(&dst).status().unwrap();
            assert!(st.success());
            assert!(
                fs::read(&dst).unwrap() == data,
                "copy {i} differs from what was written"
            );
            drop(writer);
        }
    });
}

/// `dd` with O_DIRECT (as databases and disk images use it), in every
/// mode: where the daemon serves the I/O (passthrough off, or a large
/// versioned file updated in place), its buffers are not aligned as
/// O_DIRECT needs, and ext4 refused with EINVAL.
#[test]
fn o_direct_reads_and_writes_work() {
    each_mode(|m| {
        let f = m.p("direct.img");
        for args in [
            vec!["if=/dev/zero", "bs=1M", "count=2", "oflag=direct"],
            vec![
                "if=/dev/zero",
                "bs=4096",
                "count=8",
                "oflag=direct",
                "conv=notrunc",
            ],
        ] {
            let out = Command::new("dd")
                .args(&args)
                .arg(format!("of={}", f.display()))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "dd {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let out = Command::new("dd")
            .args(["of=/dev/null", "bs=4096", "iflag=direct"])
            .arg(format!("if={}", f.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "dd iflag=direct: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(fs::metadata(&f).unwrap().len(), 2 << 20);
    });
}

/// A source on a file system whose listings give no entry types (ext4
/// without `filetype`: DT_UNKNOWN, as XFS without ftype and some network
/// file systems): `find` and `rm -r` see directories as directories.
#[test]
fn find_and_rm_r_descend_where_the_source_gives_no_entry_types() {
    for opts in ["plain", ""] {
        let img = tempfile::NamedTempFile::new().unwrap();
        img.as_file().set_len(64 << 20).unwrap();
        let image = img.path().to_str().unwrap().to_string();
        run(
            Path::new("/"),
            "mkfs.ext4",
            &["-q", "-F", "-O", "^filetype", &image],
        );
        let held = std::cell::RefCell::new(None);
        let m = Mount::new_with(opts, |src| {
            run(
                Path::new("/"),
                "mount",
                &["-o", "loop", &image, src.to_str().unwrap()],
            );
            *held.borrow_mut() = Some(Unmounts(src.to_path_buf()));
            // More entries than one reply holds: the kernel asks for
            // later batches without attributes.
            for i in 0..400 {
                fs::create_dir_all(src.join(format!("d/sub{i:03}/deeper"))).unwrap();
            }
            fs::write(src.join("d/sub399/deeper/leaf"), b"leaf\n").unwrap();
        });
        let _source = held.into_inner();
        let found = run_out(&m.mnt, "find", &["d", "-type", "d"]);
        let found = String::from_utf8_lossy(&found.stdout).into_owned();
        assert_eq!(found.lines().count(), 801, "mode {opts:?}");
        let leaf = run_out(&m.mnt, "find", &["d", "-name", "leaf"]);
        let leaf = String::from_utf8_lossy(&leaf.stdout).into_owned();
        assert_eq!(leaf.trim(), "d/sub399/deeper/leaf", "mode {opts:?}");
        run(&m.mnt, "rm", &["-r", "d"]);
        assert!(!m.p("d").exists(), "mode {opts:?}");
        drop(m);
    }
}
