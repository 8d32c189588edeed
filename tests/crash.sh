#!/usr/bin/env bash
# Crash test: kill -9 the chronofs daemon at random moments under a write
# workload, recover, and check that nothing acknowledged was lost.
#
# Each iteration:
#   1. a workload (a separate process) rewrites, patches, appends to,
#      replaces (write-temp, fsync, rename), truncates, renames, chmods and
#      unlinks files through a versioning mount; some writes are fsync'd,
#      and after each successful fsync it appends what is now durable to a
#      ledger outside the mount;
#   2. meanwhile a reporter asks the daemon over the CLI for `log --json` of
#      those files, `cat --at SEQ` of the newest reported version, and takes
#      tags (`tag NAME --json`, then `cat --at NAME`), recording every answer;
#   3. after a random delay (mostly 50-800 ms, sometimes under 30 ms) the
#      daemon gets SIGKILL; the workload must not have failed before it, and
#      must then fail with ENOTCONN, ECONNABORTED or EIO and exit, not hang;
#   4. recovery, rotating between: `fusermount3 -u` then mount;
#      `fusermount3 -u`, offline `chronofs fsck SRC`, then mount; and
#      `chronofs mount` over the dead mount (it must clear it itself); one
#      time in five the new daemon is itself killed within 50 ms of starting
#      (a crash during recovery) and started again;
#   5. `chronofs fsck MNT` must pass, and:
#      (a) every file whose last ledger entry is "durable" holds exactly the
#          fsync'd bytes in SRC (the head), reads the same through MNT, and
#          its newest version (`cat --version 0`) holds them too (fsync
#          records a version durably);
#      (b) every version any earlier `log --json` reported is still listed
#          with identical fields, every recorded `cat --at SEQ|TAG` gives the
#          same bytes, every tag still names the same sequence number, and
#          the newest sequence number never goes backwards;
#      and no daemon log contains a panic.
# History accumulates in one SRC across iterations (later iterations
# re-check everything earlier ones recorded). The mount mode alternates
# between CRASH_MODES. At the end the mount is unmounted cleanly (the
# daemon must exit 0) and an offline fsck must pass.
#
# On a failure the iteration's SRC (with its store), daemon logs, ledger,
# recorded reports and CLI transcript are moved to WORK/fail-N/, the run
# continues on a fresh SRC, and it stops early after CRASH_MAX_FAILURES.
#
# Output: "crash: N iterations, F failures"; exit 1 if F > 0, 2 on a setup
# error. The work directory is removed on success unless CRASH_KEEP=1.
#
# Usage: tests/crash.sh [--smoke]      (--smoke: 6 iterations)
# Environment:
#   CRASH_ITERATIONS     iterations (default 100; ~1.3 s each on 2 cores)
#   CRASH_SEED           base random seed (default: random; printed)
#   CRASH_MODES          ;-separated -o option sets to alternate
#                        (default "passthrough=on;passthrough=off")
#   CRASH_RECOVERY       recovery methods to rotate through (default
#                        "fusermount offline-fsck remount-over-dead")
#   CRASH_MAX_FAILURES   stop after this many failed iterations (default 3)
#   CRASH_VERBOSE=1      one line per iteration
#   CRASH_KEEP=1         keep the work directory even on success
#   CHRONOFS_BIN         binary (default target/release/chronofs; not built here)
#   CHRONOFS_TEST_DIR    parent of the work directory (must not be tmpfs;
#                        default $TMPDIR or /var/tmp)
# Needs root, /dev/fuse, fusermount3 and python3.
set -euo pipefail

if [ "${1:-}" = --smoke ]; then
    # A quick check that the harness and recovery work (about 10 s).
    CRASH_ITERATIONS=${CRASH_ITERATIONS:-6}
    export CRASH_ITERATIONS
elif [ $# -gt 0 ]; then
    echo "usage: tests/crash.sh [--smoke]" >&2
    exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHRONOFS_BIN=${CHRONOFS_BIN:-$ROOT/target/release/chronofs}

die() { printf 'crash.sh: ERROR: %s\n' "$*" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || die "must run as root (FUSE mounts)"
[ -c /dev/fuse ] || die "/dev/fuse missing"
[ -x "$CHRONOFS_BIN" ] || die "chronofs binary not found: $CHRONOFS_BIN (cargo build --release)"
command -v fusermount3 >/dev/null 2>&1 || die "fusermount3 not found (apt-get install fuse3)"
PYTHON=$(command -v python3 || true)
[ -n "$PYTHON" ] || die "python3 not found (apt-get install python3)"

parent=${CHRONOFS_TEST_DIR:-${TMPDIR:-/var/tmp}}
[ "$(stat -f -c %T "$parent")" != tmpfs ] || die "$parent is tmpfs; set CHRONOFS_TEST_DIR"
WORK=$(mktemp -d "$parent/chronofs-crash.XXXXXX")
chmod 755 "$WORK"

cat >"$WORK/crash.py" <<'PY'
import errno
import hashlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

FILES = ["f0", "f1", "f2", "sub/f3", "sub/f4"]
LOGS = ["log0", "sub/log1"]
ABORT_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO)


def sha(b):
    return hashlib.sha256(b).hexdigest()


# --------------------------------------------------------------- workload
# Runs in its own process; ends with exit 3 when the mount dies under it
# (ENOTCONN, ECONNABORTED, or EIO, which the kernel gives for some calls
# on an aborted connection, e.g. close() flushing cached pages), 4 on any
# other error; the error is printed with its time, so the driver can tell
# an error of the live daemon from one caused by the kill.

def workload(mnt, ledger_path, seed, it):
    rnd = random.Random(seed)
    led = open(ledger_path, "a")
    state = {"op": 0, "what": "start", "step": ""}

    class Tracer:
        """os, remembering the last call (for error reports)."""
        def __getattr__(self, name):
            fn = getattr(os, name)

            def call(*args):
                state["step"] = "%s(%s)" % (name, ", ".join(
                    a.replace(mnt + "/", "") if isinstance(a, str) else str(a) if isinstance(a, int) else "..."
                    for a in args))
                return fn(*args)
            return call
    X = Tracer()

    def note(*fields):
        led.write(" ".join(str(f) for f in fields) + "\n")
        led.flush()

    def P(name):
        return os.path.join(mnt, name)

    def content(name, n):
        out = []
        k = 0
        size = 0
        while size < n:
            line = "%s it=%04d op=%05d line=%06d %s\n" % (
                name, it, state["op"], k, "x" * rnd.randrange(0, 40))
            out.append(line)
            size += len(line)
            k += 1
        return "".join(out).encode()[:n]

    def size():
        r = rnd.random()
        if r < 0.45:
            return rnd.randrange(0, 4096)
        if r < 0.9:
            return rnd.randrange(4096, 65536)
        return rnd.randrange(65536, 400000)

    def write_all(fd, data):
        # Several write calls of random sizes.
        off = 0
        while off < len(data):
            n = min(len(data) - off, rnd.choice([512, 4096, 16384, 65536, 1 << 20]))
            w = X.write(fd, data[off:off + n])
            off += w

    def fsync_dir(name):
        d = X.open(os.path.dirname(P(name)) or mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            X.fsync(d)
        finally:
            X.close(d)

    def read(name):
        fd = X.open(P(name), os.O_RDONLY)
        try:
            out = b""
            while True:
                b = X.pread(fd, 1 << 20, len(out))
                if not b:
                    return out
                out += b
        finally:
            X.close(fd)

    def rewrite(name):
        data = content(name, size())
        sync = rnd.random() < 0.5
        note("B", name)
        fd = X.open(P(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
            if sync:
                X.fsync(fd)
                note("D", "exact", name, len(data), sha(data))
        finally:
            X.close(fd)

    def save(name):
        # The editor pattern: write a temporary file, fsync, rename over.
        tmp = os.path.join(os.path.dirname(name), "." + os.path.basename(name) + ".tmp")
        data = content(name, size())
        fd = X.open(P(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
            X.fsync(fd)
        finally:
            X.close(fd)
        note("B", name)
        X.rename(P(tmp), P(name))
        fsync_dir(name)
        note("D", "exact", name, len(data), sha(data))

    def patch(name):
        # Overwrite (and maybe extend) a range in place, then fsync.
        try:
            fd = X.open(P(name), os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            note("B", name)
            cur = b""
            while True:
                b = X.pread(fd, 1 << 20, len(cur))
                if not b:
                    break
                cur += b
            off = rnd.randrange(0, len(cur) + 1)
            piece = content(name + "-patch", rnd.randrange(1, 20000))
            X.pwrite(fd, piece, off)
            new = cur[:off] + piece + cur[off + len(piece):]
            X.fsync(fd)
            note("D", "exact", name, len(new), sha(new))
        finally:
            X.close(fd)

    logs = {}

    def append(name):
        if name not in logs:
            try:
                logs[name] = read(name)
            except FileNotFoundError:
                logs[name] = b""
        if len(logs[name]) > 300000:
            note("B", name)
            X.unlink(P(name))
            logs[name] = b""
        rec = content(name, rnd.randrange(1, 3000))
        fd = X.open(P(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            write_all(fd, rec)
            logs[name] += rec
            if rnd.random() < 0.4:
                X.fsync(fd)
                note("D", "prefix", name, len(logs[name]), sha(logs[name]))
        finally:
            X.close(fd)

    def shuffle():
        # Create, rename across directories, chmod, then unlink or keep.
        a = "x%d" % rnd.randrange(4)
        b = "sub/y%d" % rnd.randrange(4)
        fd = X.open(P(a), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, content(a, rnd.randrange(0, 5000)))
        finally:
            X.close(fd)
        X.rename(P(a), P(b))
        X.chmod(P(b), rnd.choice([0o600, 0o644, 0o640]))
        if rnd.random() < 0.5:
            X.unlink(P(b))
        elif rnd.random() < 0.5:
            X.rename(P(b), P(a))

    def delete(name):
        note("B", name)
        try:
            X.unlink(P(name))
        except FileNotFoundError:
            pass

    def truncate(name):
        note("B", name)
        try:
            X.truncate(P(name), rnd.randrange(0, 5000))
        except FileNotFoundError:
            pass

    ops = [
        (30, lambda: rewrite(rnd.choice(FILES)), "rewrite"),
        (25, lambda: append(rnd.choice(LOGS)), "append"),
        (10, lambda: save(rnd.choice(FILES)), "save"),
        (10, lambda: patch(rnd.choice(FILES)), "patch"),
        (15, shuffle, "shuffle"),
        (4, lambda: delete(rnd.choice(FILES)), "delete"),
        (6, lambda: truncate(rnd.choice(FILES)), "truncate"),
    ]
    total = sum(w for w, _, _ in ops)
    try:
        state["step"] = "makedirs(sub)"
        os.makedirs(P("sub"), exist_ok=True)
        print("ready", flush=True)
        while True:
            state["op"] += 1
            r = rnd.randrange(total)
            for w, fn, what in ops:
                if r < w:
                    state["what"] = what
                    fn()
                    break
                r -= w
            if rnd.random() < 0.1:
                time.sleep(0.005)
    except OSError as e:
        print("%.6f workload: op %d (%s) %s: %s" % (
            time.time(), state["op"], state["what"], state["step"], e),
              file=sys.stderr, flush=True)
        sys.exit(3 if e.errno in ABORT_ERRNOS else 4)


# ----------------------------------------------------------------- driver

class Failure(Exception):
    pass


class Driver:
    def __init__(self):
        e = os.environ
        self.bin = e["CHRONOFS_BIN"]
        self.work = e["CRASH_WORK"]
        self.iterations = int(e.get("CRASH_ITERATIONS") or 100)
        self.seed = int(e.get("CRASH_SEED") or random.randrange(1 << 30))
        self.modes = [m.strip() for m in (e.get("CRASH_MODES") or
                      "passthrough=on;passthrough=off").split(";") if m.strip()]
        self.max_failures = int(e.get("CRASH_MAX_FAILURES") or 3)
        self.verbose = e.get("CRASH_VERBOSE") == "1"
        self.recoveries = (e.get("CRASH_RECOVERY") or
                           "fusermount offline-fsck remount-over-dead").split()
        for r in self.recoveries:
            if r not in ("fusermount", "offline-fsck", "remount-over-dead"):
                raise SystemExit("crash: unknown CRASH_RECOVERY method %r" % r)
        self.script = os.path.abspath(sys.argv[0])
        self.src = os.path.join(self.work, "src")
        self.mnt = os.path.join(self.work, "mnt")
        self.daemon = None
        self.daemon_log = None
        self.epoch = 0
        self.failures = []
        self.context = "setup"

    # ---- helpers

    def log(self, msg):
        with open(self.transcript, "a") as f:
            f.write("[%.3f] %s\n" % (time.time(), msg))

    def cli(self, args, timeout=30, check=False):
        cmd = [self.bin] + [str(a) for a in args]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            self.log("TIMEOUT after %ds: %s" % (timeout, " ".join(cmd)))
            raise Failure("hang: `chronofs %s` did not finish within %ds%s" % (
                " ".join(str(a) for a in args), timeout, self.daemon_threads()))
        self.log("rc=%d %.3fs chronofs %s%s" % (
            p.returncode, time.time() - t0, " ".join(str(a) for a in args),
            ("\n    stderr: " + p.stderr.decode(errors="replace").strip()) if p.stderr else ""))
        if check and p.returncode != 0:
            raise Failure("`chronofs %s` exited %d: %s%s" % (
                " ".join(str(a) for a in args), p.returncode,
                p.stderr.decode(errors="replace").strip(),
                p.stdout.decode(errors="replace").strip()[-2000:]))
        return p.returncode, p.stdout, p.stderr.decode(errors="replace")

    def daemon_threads(self):
        if not self.daemon or self.daemon.poll() is not None:
            return ""
        out = []
        try:
            for t in sorted(os.listdir("/proc/%d/task" % self.daemon.pid)):
                try:
                    comm = open("/proc/%d/task/%s/comm" % (self.daemon.pid, t)).read().strip()
                    wchan = open("/proc/%d/task/%s/wchan" % (self.daemon.pid, t)).read().strip()
                    out.append("%s %s %s" % (t, comm, wchan))
                except OSError:
                    pass
        except OSError:
            return ""
        return "\n  daemon threads (tid comm wchan):\n    " + "\n    ".join(out)

    def mount_ids(self):
        """IDs of the mounts stacked on MNT (from /proc/self/mountinfo)."""
        ids = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                if line.split(" ")[4] == self.mnt:
                    ids.append(line.split(" ")[0])
        return ids

    def mounted(self):
        return bool(self.mount_ids())

    def mnt_state(self):
        try:
            st = os.stat(self.mnt)
        except OSError as e:
            return e.errno
        return "live" if st.st_dev != os.stat(self.work).st_dev else "plain"

    def statfs_ok(self):
        try:
            os.statvfs(self.mnt)
            return True
        except OSError:
            return False

    def clear_mount(self):
        for _ in range(50):
            if not self.mounted():
                return
            subprocess.run(["fusermount3", "-u", self.mnt], stdin=subprocess.DEVNULL,
                           capture_output=True)
            if self.mounted():
                time.sleep(0.05)
        subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        if self.mounted():
            raise Failure("cannot clear the mount at %s" % self.mnt)

    def start_daemon(self, mode, kill_after=None):
        self.nmount += 1
        self.daemon_log = os.path.join(self.work, "logs", "daemon-%d.log" % self.nmount)
        self.it_logs.append(self.daemon_log)
        before = set(self.mount_ids())
        logf = open(self.daemon_log, "ab")
        # The daemon writes one line on the pipe once the mount and its
        # control socket are ready ("ok"), or why it failed.
        ready_r, ready_w = os.pipe()
        cmd = [self.bin, "mount", self.src, self.mnt, "-f", "--ready-fd", str(ready_w)] + (
            ["-o", mode] if mode else [])
        self.log("start: " + " ".join(cmd))
        self.daemon = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                       stderr=subprocess.STDOUT, pass_fds=(ready_w,),
                                       env=dict(os.environ, RUST_BACKTRACE="1"))
        os.close(ready_w)
        logf.close()
        if kill_after is not None:
            os.close(ready_r)
            # A crash during start-up (journal replay, recovery).
            time.sleep(kill_after)
            self.log("kill -9 during start-up after %.3fs" % kill_after)
            self.kill_daemon()
            self.clear_mount()
            return
        report = b""
        deadline = time.time() + 20
        with os.fdopen(ready_r, "rb", buffering=0) as ready:
            while b"\n" not in report:
                left = deadline - time.time()
                if left <= 0:
                    raise Failure("mount not ready after 20s" + self.daemon_threads())
                if not select.select([ready], [], [], left)[0]:
                    continue
                chunk = ready.read(512)
                if not chunk:
                    break
                report += chunk
        if report.strip() != b"ok":
            self.daemon.wait(timeout=20)
            raise Failure("daemon exited (%s) before the mount was ready: %r %s" % (
                self.daemon.returncode, report, self.tail(self.daemon_log)))
        # Ready means the control socket answers too: one check, no wait.
        rc, _, err = self.cli(["status", "--json", self.mnt])
        if rc != 0:
            raise Failure("control socket not answering after ready: %s" % err.strip())

    def stop_daemon(self):
        """Clean unmount; the daemon must exit 0."""
        if not self.daemon:
            return
        subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True)
        try:
            rc = self.daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait()
            self.daemon = None
            self.clear_mount()
            raise Failure("daemon did not exit within 30s of a clean unmount")
        self.daemon = None
        self.clear_mount()
        if rc != 0:
            raise Failure("daemon exited %d after a clean unmount: %s" % (rc, self.tail(self.daemon_log)))

    def kill_daemon(self):
        if self.daemon:
            if self.daemon.poll() is None:
                self.daemon.send_signal(signal.SIGKILL)
            self.daemon.wait()
            self.daemon = None

    def tail(self, path, n=30):
        try:
            lines = open(path, errors="replace").read().splitlines()
        except OSError as e:
            return "<%s>" % e
        return "\n    ".join([""] + lines[-n:])

    # ---- recorded expectations (reset with a fresh SRC)

    def reset_expectations(self):
        self.ledger = os.path.join(self.work, "ledger-%d" % self.epoch)
        open(self.ledger, "w").close()
        self.versions = {}   # (name, seq, obj) -> version dict from log --json
        self.cats = {}       # (name, at) -> (sha, len)
        self.tags = {}       # tag -> seq
        self.max_seq = 0
        self.recent = []     # (name, at) recorded this iteration

    def record_cat(self, name, at):
        rc, out, _ = self.cli(["cat", os.path.join(self.mnt, name), "--at", at])
        if rc == 0:
            key = (name, at)
            prev = self.cats.get(key)
            if prev and prev != (sha(out), len(out)):
                # Both answers came from the running daemon: history changed
                # under a fixed instant without any crash.
                self.live_mismatches.append(
                    "`cat %s --at %s` changed while mounted: %d bytes %s, then %d bytes %s" % (
                        name, at, prev[1], prev[0][:12], len(out), sha(out)[:12]))
            self.cats[key] = (sha(out), len(out))
            self.recent.append(key)

    def reporter(self, stop, rnd, it):
        r = 0
        while not stop.is_set():
            name = rnd.choice(FILES + LOGS)
            rc, out, _ = self.cli(["log", os.path.join(self.mnt, name), "--json"])
            if rc == 0:
                j = json.loads(out)
                newest = 0
                with open(os.path.join(self.itdir, "reported-logs"), "a") as f:
                    f.write("%s %s\n" % (name, json.dumps(j, sort_keys=True)))
                for v in j.get("versions", []):
                    # A rename over a file gives two versions one sequence
                    # number: the replaced object's and the renamed one's.
                    self.versions[(name, v["seq"], v["obj"])] = v
                    newest = max(newest, v["seq"])
                    self.max_seq = max(self.max_seq, v["seq"])
                if newest:
                    self.record_cat(name, str(newest))
            if r % 2 == 0 and not stop.is_set():
                tag = "c%d-%d-%d" % (self.epoch, it, r)
                rc, out, _ = self.cli(["tag", tag, "--path", self.mnt, "--json"])
                if rc == 0:
                    j = json.loads(out)
                    self.tags[tag] = j["seq"]
                    self.max_seq = max(self.max_seq, j["seq"])
                    self.record_cat(rnd.choice(FILES + LOGS), tag)
            r += 1
        return r

    # ---- checks after recovery

    def check_ledger(self):
        last = {}
        with open(self.ledger) as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                w = line.split()
                if w[0] == "B":
                    last[w[1]] = None
                else:
                    last[w[2]] = (w[1], int(w[3]), w[4])
        problems = []
        checked = 0
        for name, ev in sorted(last.items()):
            if ev is None:
                continue
            kind, n, digest = ev
            checked += 1
            try:
                data = open(os.path.join(self.src, name), "rb").read()
            except OSError as e:
                problems.append("(a) %s: fsync'd %d bytes, but the head file: %s" % (name, n, e))
                continue
            if kind == "exact":
                ok = len(data) == n and sha(data) == digest
            else:
                ok = len(data) >= n and sha(data[:n]) == digest
            if not ok:
                problems.append("(a) %s: fsync'd %s %d bytes (sha %s) not in the head file "
                                "(%d bytes, sha of first %d: %s)" % (
                                    name, kind, n, digest[:12], len(data), n,
                                    sha(data[:n])[:12]))
                continue
            try:
                via = open(os.path.join(self.mnt, name), "rb").read()
            except OSError as e:
                problems.append("(a) %s: reading through the mount: %s" % (name, e))
                continue
            if via != data:
                problems.append("(a) %s: the mount shows %d bytes (sha %s), SRC holds %d (sha %s)" % (
                    name, len(via), sha(via)[:12], len(data), sha(data)[:12]))
                continue
            # fsync records a version synchronously and durably, and nothing
            # touched the file since: its newest version holds those bytes.
            rc, out, err = self.cli(["cat", os.path.join(self.mnt, name), "--version", "0"])
            if rc != 0:
                problems.append("(a) %s: fsync'd, but `cat --version 0` fails: %s" % (
                    name, err.strip()))
            elif not (sha(out) == digest and len(out) == n if kind == "exact"
                      else len(out) >= n and sha(out[:n]) == digest):
                problems.append("(a) %s: fsync'd %s %d bytes (sha %s), but the newest version "
                                "has %d bytes (sha of first %d: %s)" % (
                                    name, kind, n, digest[:12], len(out), n, sha(out[:n])[:12]))
        return checked, problems

    def check_reports(self, rnd):
        problems = []
        names = sorted({key[0] for key in self.versions})
        for name in names:
            rc, out, err = self.cli(["log", os.path.join(self.mnt, name), "--json"])
            if rc != 0:
                problems.append("(b) `log %s` failed after recovery: %s" % (name, err.strip()))
                continue
            now = {}
            for v in json.loads(out).get("versions", []):
                now.setdefault((v["seq"], v["obj"]), v)
            for (n, seq, obj), v in sorted(self.versions.items()):
                if n != name:
                    continue
                seq = (seq, obj)
                if seq not in now:
                    problems.append("(b) %s: version #%d of object %d (%s, %s bytes) reported "
                                    "before the kill is gone" % (
                                        name, seq[0], obj, v.get("cause"), v.get("size")))
                elif now[seq] != v:
                    diff = {k: (v.get(k), now[seq].get(k)) for k in set(v) | set(now[seq])
                            if v.get(k) != now[seq].get(k)}
                    problems.append("(b) %s: version #%d of object %d changed (field: before, "
                                    "after): %s" % (name, seq[0], obj, diff))
        rc, out, err = self.cli(["tags", "--json", self.mnt])
        if rc != 0:
            problems.append("(b) `tags` failed after recovery: %s" % err.strip())
        else:
            now = {t["name"]: t["seq"] for t in json.loads(out).get("tags", [])}
            for tag, seq in sorted(self.tags.items()):
                if tag not in now:
                    problems.append("(b) tag %s (#%d) is gone" % (tag, seq))
                elif now[tag] != seq:
                    problems.append("(b) tag %s was #%d, now #%d" % (tag, seq, now[tag]))
        # Every cat recorded this iteration, plus a sample of older ones.
        keys = set(self.recent)
        older = [k for k in self.cats if k not in keys]
        keys.update(rnd.sample(older, min(10, len(older))))
        for name, at in sorted(keys):
            want, wlen = self.cats[(name, at)]
            rc, out, err = self.cli(["cat", os.path.join(self.mnt, name), "--at", at])
            if rc != 0:
                problems.append("(b) `cat %s --at %s` gave %d bytes before the kill, now fails: %s"
                                % (name, at, wlen, err.strip()))
            elif sha(out) != want:
                problems.append("(b) `cat %s --at %s`: %d bytes (sha %s) before the kill, "
                                "%d bytes (sha %s) now" % (name, at, wlen, want[:12],
                                                          len(out), sha(out)[:12]))
        rc, out, err = self.cli(["status", "--json", self.mnt])
        if rc != 0:
            problems.append("`status` failed after recovery: %s" % err.strip())
        else:
            last = (json.loads(out).get("last") or {}).get("seq", 0)
            if last < self.max_seq:
                problems.append("(b) the newest sequence number went back from #%d (reported "
                                "before the kill) to #%d" % (self.max_seq, last))
        return problems

    def check_logs(self):
        problems = []
        for path in self.it_logs:
            fn = os.path.basename(path)
            if True:
                text = open(path, errors="replace").read()
                for marker in ("panicked", "RUST_BACKTRACE", "ERROR"):
                    if marker in text:
                        i = text.index(marker)
                        problems.append("%s mentions %r: %s" % (
                            fn, marker, text[max(0, i - 300):i + 700]))
                        break
        return problems

    # ---- one iteration

    def iteration(self, it):
        rnd = random.Random(self.seed * 100003 + it)
        mode = self.modes[it % len(self.modes)]
        recovery = self.recoveries[(it // len(self.modes)) % len(self.recoveries)]
        self.context = "mode %s, recovery %s" % (mode, recovery)
        self.recent = []
        self.live_mismatches = []
        if self.daemon is None:
            self.start_daemon(mode)
        # Workload and reporter run until the kill.
        wl_err = os.path.join(self.itdir, "workload.err")
        wl = subprocess.Popen([sys.executable, self.script, "workload", self.mnt, self.ledger,
                               str(rnd.randrange(1 << 30)), str(it)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=open(wl_err, "w"))
        line = wl.stdout.readline()
        if line.strip() != b"ready":
            wl.wait()
            raise Failure("workload did not start: %s" % open(wl_err).read())
        stop = threading.Event()
        rounds = []
        rep_err = []

        def run_reporter():
            try:
                rounds.append(self.reporter(stop, rnd_rep, it))
            except Exception as e:  # a hung CLI call, unparsable JSON...
                rep_err.append(e if isinstance(e, Failure) else
                               Failure("reporter: " + traceback.format_exc()))
        rnd_rep = random.Random(rnd.randrange(1 << 30))
        rep = threading.Thread(target=run_reporter)
        rep.start()
        delay = rnd.uniform(0, 0.03) if rnd.random() < 0.15 else rnd.uniform(0.05, 0.8)
        time.sleep(delay)
        if wl.poll() is not None:
            self.kill_daemon()
            raise Failure("workload stopped before the kill (exit %d): %s" % (
                wl.returncode, open(wl_err).read().strip()))
        if self.daemon.poll() is not None:
            raise Failure("daemon died by itself (exit %d): %s" % (
                self.daemon.returncode, self.tail(self.daemon_log)))
        self.log("kill -9 after %.3fs" % delay)
        kill_time = time.time()
        self.kill_daemon()
        stop.set()
        try:
            wl.wait(timeout=15)
        except subprocess.TimeoutExpired:
            stack = ""
            try:
                stack = open("/proc/%d/stack" % wl.pid).read()
            except OSError:
                pass
            wl.kill()
            wl.wait()
            raise Failure("workload hung after the daemon was killed:\n" + stack)
        rep.join(60)
        if rep.is_alive():
            raise Failure("reporter hung after the daemon was killed")
        if rep_err:
            raise rep_err[0]
        err = open(wl_err).read().strip()
        try:
            err_time = float(err.split()[0])
        except (ValueError, IndexError):
            err_time = None
        if err_time is not None and err_time < kill_time:
            raise Failure("the workload got an error while the daemon was alive (%.3fs before "
                          "the kill): %s" % (kill_time - err_time, err))
        if wl.returncode != 3:
            raise Failure("workload ended with an unexpected error after the kill: %s" % err)
        if self.live_mismatches:
            raise Failure("\n  ".join(self.live_mismatches))
        # Recovery.
        if recovery != "remount-over-dead":
            self.clear_mount()
        if recovery == "offline-fsck":
            rc, out, err = self.cli(["fsck", self.src], timeout=120)
            if rc != 0:
                raise Failure("offline fsck after kill -9 exited %d:\n%s%s" % (
                    rc, out.decode(errors="replace")[-3000:], err))
        double = rnd.random() < 0.2
        if double:
            self.start_daemon(mode, kill_after=rnd.uniform(0, 0.05))
        self.start_daemon(mode)
        rc, out, err = self.cli(["fsck", self.mnt], timeout=120)
        if rc != 0:
            raise Failure("fsck after recovery exited %d:\n%s%s" % (
                rc, out.decode(errors="replace")[-3000:], err))
        checked, problems = self.check_ledger()
        problems += self.check_reports(rnd)
        problems += self.check_logs()
        if problems:
            raise Failure("\n  ".join(problems))
        if double:
            recovery += "+startup-kill"
        return "mode=%s recovery=%s kill@%.3fs reports=%d durable-files=%d versions=%d tags=%d" % (
            mode, recovery, delay, rounds[0] if rounds else 0, checked,
            len(self.versions), len(self.tags))

    def fail(self, it, msg):
        self.failures.append(it)
        print("crash: iteration %s FAILED (%s; seed %d):\n  %s" % (
            it, self.context, self.seed, msg), flush=True)
        self.log("FAILED: " + msg)
        try:
            self.kill_daemon()
            self.clear_mount()
        except Failure as e:
            print("crash: cleanup: %s" % e, flush=True)
        dest = os.path.join(self.work, "fail-%s" % it)
        os.rename(self.itdir, dest)
        for path in self.it_logs:
            if os.path.exists(path):
                os.rename(path, os.path.join(dest, os.path.basename(path)))
        os.rename(self.src, os.path.join(dest, "src"))
        shutil.copy(self.ledger, os.path.join(dest, "ledger"))
        with open(os.path.join(dest, "reports.json"), "w") as f:
            json.dump({"versions": [[n, s, v] for (n, s, _), v in sorted(self.versions.items())],
                       "cats": [[n, a, h, l] for (n, a), (h, l) in sorted(self.cats.items())],
                       "tags": self.tags, "max_seq": self.max_seq}, f, indent=1)
        with open(os.path.join(dest, "FAILURE"), "w") as f:
            f.write(msg + "\n")
        print("crash: kept SRC, daemon logs, ledger, reports and CLI transcript in %s" % dest,
              flush=True)
        # Continue on a fresh SRC.
        os.mkdir(self.src)
        self.epoch += 1
        self.reset_expectations()

    def run(self):
        os.mkdir(self.src)
        os.mkdir(self.mnt)
        os.mkdir(os.path.join(self.work, "logs"))
        self.nmount = 0
        self.reset_expectations()
        print("crash: %d iterations, seed %d, modes %s, work dir %s" % (
            self.iterations, self.seed, " | ".join(self.modes), self.work), flush=True)
        t0 = time.time()
        done = 0
        for it in range(self.iterations):
            self.itdir = os.path.join(self.work, "it-%d" % it)
            os.mkdir(self.itdir)
            self.transcript = os.path.join(self.itdir, "transcript")
            self.it_logs = [self.daemon_log] if self.daemon else []
            try:
                summary = self.iteration(it)
                if self.verbose:
                    print("crash: iteration %d ok: %s" % (it, summary), flush=True)
                # Keep only the log of the daemon that serves the next iteration.
                for path in self.it_logs:
                    if path != self.daemon_log:
                        os.unlink(path)
                shutil.rmtree(self.itdir)
            except Failure as e:
                self.fail(it, str(e))
            except Exception:
                self.fail(it, "test error:\n" + traceback.format_exc())
            done += 1
            if not self.verbose and (it + 1) % 10 == 0:
                print("crash: %d/%d iterations, %d failures, %.0fs" % (
                    it + 1, self.iterations, len(self.failures), time.time() - t0), flush=True)
            if len(self.failures) >= self.max_failures:
                print("crash: stopping after %d failures" % len(self.failures), flush=True)
                break
        # Final clean unmount and offline fsck.
        self.itdir = os.path.join(self.work, "final")
        self.context = "final clean unmount and offline fsck"
        os.makedirs(self.itdir, exist_ok=True)
        self.transcript = os.path.join(self.itdir, "transcript")
        self.it_logs = [self.daemon_log] if self.daemon else []
        try:
            if self.daemon:
                self.stop_daemon()
            rc, out, err = self.cli(["fsck", self.src], timeout=300)
            if rc != 0 and os.path.exists(os.path.join(self.src, ".chronofs")):
                raise Failure("final offline fsck exited %d:\n%s%s" % (
                    rc, out.decode(errors="replace")[-3000:], err))
            problems = self.check_logs()
            if problems:
                raise Failure("\n  ".join(problems))
        except Failure as e:
            self.fail("final", str(e))
        nfail = len(self.failures)
        print("crash: %d iterations, %d failures (%.0fs, seed %d)" % (
            done, nfail, time.time() - t0, self.seed), flush=True)
        if nfail:
            print("crash: failed: %s; see %s" % (" ".join(map(str, self.failures)), self.work))
        return 1 if nfail else 0

    def cleanup(self):
        try:
            self.kill_daemon()
            self.clear_mount()
        except Exception:
            pass


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "workload":
        workload(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    d = Driver()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return d.run()
    finally:
        d.cleanup()


if __name__ == "__main__":
    sys.exit(main())
PY

set +e
CRASH_WORK=$WORK CHRONOFS_BIN=$CHRONOFS_BIN "$PYTHON" -u "$WORK/crash.py"
rc=$?
set -e
if [ "$rc" -eq 0 ] && [ "${CRASH_KEEP:-0}" != 1 ]; then
    rm -rf "$WORK"
elif [ "$rc" -ne 0 ]; then
    echo "crash.sh: work directory kept: $WORK" >&2
fi
exit "$rc"
