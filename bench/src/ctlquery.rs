//! Times control requests straight to a mount's daemon through the typed
//! client (`chronofs::control::Client`): the daemon's cost plus a connect,
//! without the CLI's process start and mount lookup. Used by
//! bench/history (`query.socket.*`).
//!
//! ctlquery PATH read VERSION RUNS   `cat PATH --version VERSION`
//! ctlquery PATH log RUNS            `log PATH`
//!
//! Prints one JSON object: `median_s`, `runs_s`, and `content` (the bytes
//! of the first read, lossy text) for `read`.

use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use chronofs::control::{self, At, Client};

/// One request, returning the data it brought.
type Query<'a> = dyn FnMut() -> Result<Vec<u8>> + 'a;

fn main() {
    if let Err(e) = run() {
        eprintln!("ctlquery: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, op, rest) = match args.as_slice() {
        [path, op, rest @ ..] => (path, op.as_str(), rest),
        _ => bail!("usage: ctlquery PATH (read VERSION | log) RUNS"),
    };
    let abs = std::fs::canonicalize(path).with_context(|| path.clone())?;
    let mount = control::mount_of(&abs)
        .ok_or_else(|| anyhow!("{} is not inside a chronofs mount", abs.display()))?;
    let socket = control::socket_of(&mount, chronofs::sys::geteuid())
        .ok_or_else(|| anyhow!("the mount has no control socket"))?;
    let rel = abs
        .strip_prefix(&mount.mount_point)
        .unwrap_or(Path::new(""));
    let components: control::Components = rel
        .components()
        .map(|c| std::os::unix::ffi::OsStrExt::as_bytes(c.as_os_str()).to_vec())
        .collect();
    let client = Client::Daemon(&socket);
    let number = |s: &str| -> Result<usize> { s.parse().with_context(|| format!("'{s}'")) };
    let (runs, mut once): (usize, Box<Query>) = match (op, rest) {
        ("read", [version, runs]) => {
            let version = i64::try_from(number(version)?)?;
            let comps = components.clone();
            (
                number(runs)?,
                Box::new(move || {
                    let mut data = Vec::new();
                    client.read(&comps, &At::Now, Some(version), &mut data)?;
                    Ok(data)
                }),
            )
        }
        ("log", [runs]) => {
            let comps = components.clone();
            (
                number(runs)?,
                Box::new(move || {
                    let log = client.log(&comps, None, None)?;
                    if log.versions.is_empty() {
                        bail!("no versions");
                    }
                    Ok(Vec::new())
                }),
            )
        }
        _ => bail!("usage: ctlquery PATH (read VERSION | log) RUNS"),
    };
    let first = once()?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t0 = Instant::now();
        once()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let out = serde_json::json!({
        "median_s": median,
        "runs_s": times,
        "content": String::from_utf8_lossy(&first),
    });
    println!("{out}");
    Ok(())
}
