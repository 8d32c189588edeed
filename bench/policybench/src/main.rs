//! How long chronofs takes to evaluate a version policy for one file (the
//! work capture adds to each version it builds when a policy is in force),
//! set against the time each version of `bench/retention`'s rewrite
//! workload costs on a history mount.
//!
//! Usage: policybench POLICY.toml [PER_VERSION_US]
//! POLICY.toml: the 10-rule policy `bench/retention --only policy` mounts
//! with (its `POLICY`); PER_VERSION_US: the rewrite workload's measured
//! wall time per version on a history mount (default 231 µs, the run of
//! record in docs/PERFORMANCE.md).

// Only part of the module's API is exercised here.
#![allow(dead_code, unused_imports)]

#[path = "../../../src/policy/mod.rs"]
mod policy;

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(file) = args.next() else {
        eprintln!("usage: policybench POLICY.toml [PER_VERSION_US]");
        std::process::exit(2);
    };
    let per_version_us: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(231.0);
    let parsed = match policy::check_file(std::path::Path::new(&file), policy::Level::Admin) {
        Ok(p) => p,
        Err(errors) => {
            for e in errors {
                eprintln!("{e}");
            }
            std::process::exit(1);
        }
    };
    let p = policy::Policy::new(Some(parsed), Vec::new());
    // Paths like the workloads': a kernel source file, a text, a deep one.
    let paths = [
        "fs/ext4/inode.c",
        "Documentation/filesystems/ext4/index.rst",
        "rewrite/d3/f4711",
        "drivers/net/ethernet/intel/e1000e/netdev.c",
    ];
    let n = 200_000;
    let started = Instant::now();
    let mut kept = 0usize;
    for i in 0..n {
        // What capture does per version: the subject, the local time, the
        // resolution.
        let path = paths[i % paths.len()];
        let subject = policy::Subject {
            path: path.as_bytes(),
            is_dir: false,
            size: 4096,
            owner_uid: 0,
            owner_gid: 0,
            owner_name: Some("root"),
            group_name: Some("root"),
            process: Some("python3"),
            local_time: Some(jiff::Zoned::now().datetime()),
        };
        kept += usize::from(p.resolve(&subject).version);
    }
    let per_eval_us = started.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!(
        "policy evaluation: {per_eval_us:.2} us per version ({n} evaluations, {kept} versioned)"
    );
    println!(
        "against {per_version_us:.0} us per version (rewrite workload, history mount): {:.2} % overhead",
        per_eval_us / per_version_us * 100.0
    );
}
