#!/usr/bin/env bash
# POSIX conformance: run pjdfstest natively (ext4) and on chronofs mounts and
# require chronofs to pass every test that passes natively.
#
# Usage: tests/pjdfstest.sh [MODE...]
#   MODE  plain            -> chronofs mount -o plain
#         passthrough=off  -> chronofs mount -o plain,passthrough=off
#         default          -> chronofs mount (no -o)
#         samedir          -> chronofs mount SRC SRC (MNT = SRC, no -o)
#         clone            -> chronofs mount; the suite runs inside a
#                             `chronofs clone` of a small tree
#         union-clone      -> the union; the suite runs inside a clone of a
#                             lower directory made over a whiteout
#         union-userxattr  -> the union with -o userxattr
#         anything else    -> passed verbatim as -o MODE
#   Without MODE: $PJDFSTEST_MODES (default: "plain passthrough=off default
#   policy samedir"; `policy` is the default mount under
#   tests/pjdfstest-policy.toml).
#
# Environment:
#   CHRONOFS_BIN        chronofs binary (default: target/release/chronofs); not built here
#   PJDFSTEST           pjdfstest binary (default: from PATH or ~/.cargo/bin)
#   PJDFSTEST_CONFIG    config (default: tests/pjdfstest.toml)
#   PJDFSTEST_PATTERNS  space-separated test-name filters passed to pjdfstest
#                       (e.g. "rename chmod::"); default: all tests
#   PJDFSTEST_TIMEOUT   seconds allowed for one pjdfstest run (default 900)
#   PJDFSTEST_LOG_DIR   where outputs and daemon logs go (default target/pjdfstest)
#   CHRONOFS_TEST_DIR   parent of the scratch dir (must be ext4; default
#                       $TMPDIR or /var/tmp if ext4, else target/)
#   CHRONOFS_MOUNT_TIMEOUT  seconds to wait for a mount to appear (default 30)
#   PJDFSTEST_KEEP=1    keep the scratch dir (backing dirs) after the run
#   CHRONOFS_MOUNT_CMD  debugging aid: mount with this command instead of
#                       chronofs.  It is word-split, called as
#                       `$CHRONOFS_MOUNT_CMD SRC MNT`, must stay in the
#                       foreground until unmounted, and gets the mode's -o
#                       options in $CHRONOFS_MODE_OPTS.  Example:
#                       CHRONOFS_MOUNT_CMD='bindfs -f -o allow_other,dev,suid'
#
# Exceptions: docs/COMPATIBILITY.md (table, first column = `test name`,
# second column = modes or `all`).  A natively passing test that fails on
# chronofs and is listed there counts as "skipped" instead of "failed".
#
# Output: one line per mode, e.g.
#   pjdfstest plain: 385 passed, 0 failed (native: 385 passed)
# and a final line "N passed, M failed" summed over modes (plus ", K skipped"
# when documented exceptions were hit).  Exit 1 when M > 0.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PJDFSTEST_MODES=${PJDFSTEST_MODES:-"plain passthrough=off default policy samedir union union-plain union-moded union-added union1-plain union-sandbox clone union-clone union-userxattr"}
CHRONOFS_BIN=${CHRONOFS_BIN:-$ROOT/target/release/chronofs}
PJDFSTEST_CONFIG=${PJDFSTEST_CONFIG:-$ROOT/tests/pjdfstest.toml}
PJDFSTEST_TIMEOUT=${PJDFSTEST_TIMEOUT:-900}
PJDFSTEST_LOG_DIR=${PJDFSTEST_LOG_DIR:-$ROOT/target/pjdfstest}
CHRONOFS_MOUNT_TIMEOUT=${CHRONOFS_MOUNT_TIMEOUT:-30}
COMPAT_DOC=$ROOT/docs/COMPATIBILITY.md

say() { printf '%s\n' "$*"; }
warn() { printf 'pjdfstest.sh: %s\n' "$*" >&2; }
die() { printf 'pjdfstest.sh: ERROR: %s\n' "$*" >&2; exit 1; }

if [ $# -gt 0 ]; then
    MODES=("$@")
else
    read -r -a MODES <<<"$PJDFSTEST_MODES"
fi

# ------------------------------------------------------------------ preflight
[ "$(id -u)" -eq 0 ] || die "must run as root (pjdfstest switches users, chowns, mknods)"
[ -c /dev/fuse ] || die "/dev/fuse missing"
[ -f "$PJDFSTEST_CONFIG" ] || die "config not found: $PJDFSTEST_CONFIG"
if [ -z "${PJDFSTEST:-}" ]; then
    if command -v pjdfstest >/dev/null 2>&1; then
        PJDFSTEST=$(command -v pjdfstest)
    elif [ -x "$HOME/.cargo/bin/pjdfstest" ]; then
        PJDFSTEST=$HOME/.cargo/bin/pjdfstest
    else
        die "pjdfstest not found: run scripts/install-deps"
    fi
fi
pinned=$(sed -n 's/^PJDFSTEST_VERSION=//p' "$ROOT/scripts/install-deps" 2>/dev/null || true)
have=$("$PJDFSTEST" --version 2>/dev/null | awk '{print $2}' || true)
if [ -n "$pinned" ] && [ "$have" != "$pinned" ]; then
    warn "pjdfstest version $have differs from pinned $pinned (run scripts/install-deps)"
fi
for u in nobody tests; do
    getent passwd "$u" >/dev/null || die "user '$u' missing: run scripts/install-deps"
done
if [ -z "${CHRONOFS_MOUNT_CMD:-}" ] && [ ! -x "$CHRONOFS_BIN" ]; then
    die "chronofs binary not found: $CHRONOFS_BIN (cargo build --release first)"
fi
command -v fusermount3 >/dev/null 2>&1 || die "fusermount3 missing: run scripts/install-deps"

# ------------------------------------------------------------------ scratch dir
# Must be ext4 (the native reference) and traversable by the unprivileged
# users pjdfstest switches to.
nobody_can_enter() {
    setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups \
        test -x "$1" 2>/dev/null
}
pick_base() {
    local d
    for d in "${CHRONOFS_TEST_DIR:-}" "${TMPDIR:-}" /var/tmp "$ROOT/target"; do
        [ -n "$d" ] || continue
        mkdir -p "$d" 2>/dev/null || continue
        if [ "$(stat -f -c %T "$d")" != "ext2/ext3" ]; then
            [ "$d" = "${CHRONOFS_TEST_DIR:-}" ] && warn "CHRONOFS_TEST_DIR=$d is not ext4; ignoring"
            continue
        fi
        if ! nobody_can_enter "$d"; then
            warn "$d is not searchable by user nobody; skipping it"
            continue
        fi
        printf '%s\n' "$d"
        return 0
    done
    return 1
}
BASE=$(pick_base) || die "no ext4 directory searchable by 'nobody' found; set CHRONOFS_TEST_DIR"
# Keep paths short and of equal length for the native dir (n0) and the mounts
# (m1, m2, ...): pjdfstest binds unix sockets at <dir>/.tmpXXXXXX/.tmpXXXXXX/
# <32 chars>[/<32 chars>], and sun_path holds only 107 bytes, so a longer
# path makes the socket tests fail with ENAMETOOLONG.
WORK=$(mktemp -d "$BASE/cfspjd.XXXXXX")
chmod 755 "$WORK"
if [ $((${#WORK} + 3)) -gt 40 ]; then
    warn "scratch path $WORK is long: socket tests may fail with ENAMETOOLONG (natively too)"
fi
mkdir -p "$PJDFSTEST_LOG_DIR"

# Secondary file system for the EXDEV tests: any other local fs (tmpfs).
SECONDARY=""
if [ -d /dev/shm ] && [ "$(stat -f -c %T /dev/shm)" != "ext2/ext3" ]; then
    SECONDARY=$(mktemp -d /dev/shm/chronofs-pjdfstest-2nd.XXXXXX)
    chmod 755 "$SECONDARY"
fi

CUR_MNT=""
CUR_PID=""
PJD_PID=""
PJD_WRAP=()

# ------------------------------------------------------------------ mount helpers
# True if $1 is a mount point (read from mountinfo: never stats a possibly
# hung FUSE mount).
is_mounted() {
    awk -v m="$1" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo
}
mounts_under() {
    awk -v w="$1/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo
}
fuse_abort() {
    local dev minor
    dev=$(awk -v m="$1" '$5 == m { print $3 }' /proc/self/mountinfo | tail -n 1)
    [ -n "$dev" ] || return 0
    minor=${dev#*:}
    [ -d /sys/fs/fuse/connections ] || return 0
    if [ ! -e "/sys/fs/fuse/connections/$minor" ]; then
        mount -t fusectl fusectl /sys/fs/fuse/connections 2>/dev/null || true
    fi
    if [ -w "/sys/fs/fuse/connections/$minor/abort" ]; then
        warn "aborting FUSE connection $minor of $1"
        echo 1 >"/sys/fs/fuse/connections/$minor/abort" || true
    fi
}
# unmount_fs MNT PID: unmount (fusermount3 -u, then umount -l) and make sure
# the daemon is gone.
unmount_fs() {
    local mnt=$1 pid=${2:-}
    if is_mounted "$mnt"; then
        if ! timeout 20 fusermount3 -u "$mnt" 2>/dev/null; then
            warn "fusermount3 -u $mnt failed; lazy unmount"
            fuse_abort "$mnt"
            timeout 20 umount -l "$mnt" || warn "umount -l $mnt failed"
        fi
    fi
    if [ -n "$pid" ]; then
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            warn "daemon $pid still running 10 s after unmount: SIGTERM"
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 30); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            if kill -0 "$pid" 2>/dev/null; then
                warn "daemon $pid ignores SIGTERM: SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
            fi
        fi
        wait "$pid" 2>/dev/null || true
    fi
}

cleanup() {
    local rc=$?
    set +e
    # Interrupted mid-run: stop the suite (timeout forwards the signal).
    if [ -n "$PJD_PID" ] && kill -0 "$PJD_PID" 2>/dev/null; then
        kill -TERM "$PJD_PID" 2>/dev/null
    fi
    if [ -n "$CUR_MNT" ]; then
        unmount_fs "$CUR_MNT" "$CUR_PID"
    fi
    if [ -n "$PJD_PID" ]; then
        for _ in $(seq 50); do
            kill -0 "$PJD_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$PJD_PID" 2>/dev/null
        wait "$PJD_PID" 2>/dev/null
    fi
    # Never rm -rf through a live mount.
    local left
    left=$(mounts_under "$WORK")
    if [ -n "$left" ]; then
        warn "still mounted, not removing $WORK: $left"
    elif [ "${PJDFSTEST_KEEP:-0}" = 1 ]; then
        warn "kept scratch dir $WORK"
    else
        rm -rf "$WORK"
    fi
    [ -n "$SECONDARY" ] && rm -rf "$SECONDARY"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mode_opts() {
    case $1 in
    default | samedir | union | union-moded | union-added | union-sandbox | clone | union-clone) printf '' ;;
    union-plain | union1-plain) printf 'plain' ;;
    union-userxattr) printf 'userxattr' ;;
    plain) printf 'plain' ;;
    passthrough=off) printf 'plain,passthrough=off' ;;
    policy) printf 'policy=%s,clean-interval=5' "$ROOT/tests/pjdfstest-policy.toml" ;;
    *) printf '%s' "$1" ;;
    esac
}

# mount_fs MODE SRC MNT LOG: start the daemon in the foreground (-f) in the
# background and wait for it to say the mount is ready (--ready-fd: one
# line on a FIFO, "ok" or why it failed); sets CUR_MNT/CUR_PID. A custom
# CHRONOFS_MOUNT_CMD gets no --ready-fd: its mount is awaited by polling.
mount_fs() {
    local mode=$1 src=$2 mnt=$3 log=$4 opts rc report="" fifo
    local -a cmd
    opts=$(mode_opts "$mode")
    if [ -n "${CHRONOFS_MOUNT_CMD:-}" ]; then
        read -r -a cmd <<<"$CHRONOFS_MOUNT_CMD"
        cmd+=("$src" "$mnt")
        printf '+ %s\n' "${cmd[*]}" >"$log"
        CHRONOFS_MODE_OPTS=$opts "${cmd[@]}" </dev/null >>"$log" 2>&1 &
        CUR_PID=$!
        CUR_MNT=$mnt
        poll_mounted "$mode" "$mnt" "$log"
        return
    fi
    cmd=("$CHRONOFS_BIN" mount "$src" "$mnt" -f --ready-fd 3)
    [ -n "$opts" ] && cmd+=(-o "$opts")
    fifo=$(dirname "$log")/ready.$$.$RANDOM
    mkfifo "$fifo"
    printf '+ %s\n' "${cmd[*]}" >"$log"
    # The daemon's side of the FIFO opens when the read below opens it.
    "${cmd[@]}" </dev/null >>"$log" 2>&1 3>"$fifo" &
    CUR_PID=$!
    CUR_MNT=$mnt
    read -r -t "$CHRONOFS_MOUNT_TIMEOUT" report <"$fifo" || true
    rm -f "$fifo"
    [ "$report" = ok ] && return 0
    if kill -0 "$CUR_PID" 2>/dev/null; then
        kill -KILL "$CUR_PID" 2>/dev/null || true
        mount_failed "$log" "mount ($mode) not ready within ${CHRONOFS_MOUNT_TIMEOUT}s${report:+: $report}"
    else
        wait "$CUR_PID" 2>/dev/null && rc=0 || rc=$?
        mount_failed "$log" "mount ($mode) failed: daemon exited with status $rc${report:+: $report}"
    fi
}

# mount_failed LOG MESSAGE: says why, shows the daemon's log tail, forgets
# the mount; returns 1.
mount_failed() {
    warn "$2; log tail ($1):"
    tail -n 30 "$1" | sed 's/^/    /' >&2
    CUR_PID=""
    CUR_MNT=""
    return 1
}

# poll_mounted MODE MNT LOG: waits (bounded) for a mount started by a
# custom command, which cannot say when it is ready.
poll_mounted() {
    local mode=$1 mnt=$2 log=$3 rc
    for _ in $(seq $((CHRONOFS_MOUNT_TIMEOUT * 10))); do
        if is_mounted "$mnt"; then
            return 0
        fi
        if ! kill -0 "$CUR_PID" 2>/dev/null; then
            wait "$CUR_PID" 2>/dev/null && rc=0 || rc=$?
            mount_failed "$log" "mount ($mode) failed: daemon exited with status $rc"
            return
        fi
        sleep 0.1
    done
    warn "mount ($mode) did not appear within ${CHRONOFS_MOUNT_TIMEOUT}s; log tail ($log):"
    tail -n 30 "$log" | sed 's/^/    /' >&2
    return 1
}

# Runs each natively passing test that failed on the mount once more, alone,
# on the same mount. A test that passes then is counted as passed but
# reported as FLAKY with the first run's output kept, never hidden; one that
# fails again stays failed. At most 5 retries per mode.
retry_failures() {
    local dir=$1 out=$2 mode=$3 t n=0
    local -a args=(-c "$PJDFSTEST_CONFIG" -p "$dir")
    [ -n "$SECONDARY" ] && args+=(-s "$SECONDARY")
    # Excepted tests fail by design: retrying them would use up the five
    # retries before a real flake is reached.
    for t in $(awk -v mode="$mode" '
                    FILENAME == ARGV[1] {
                        n = split($2, m, ",")
                        for (i = 1; i <= n; i++) if (m[i] == "all" || m[i] == mode) exc[$1] = 1
                        next
                    }
                    FILENAME == ARGV[2] { if ($2 == "ok") nat[$1] = 1; next }
                    $2 == "FAILED" && ($1 in nat) && !($1 in exc) { print $1 }' \
                "$EXC_FILE" "$NATIVE_OUT.res" "$out.res"); do
        n=$((n + 1))
        [ "$n" -le 5 ] || break
        # A name is a substring pattern; only its own line is read back.
        (cd "$dir" && NO_COLOR=1 timeout -k 10 120 "${PJD_WRAP[@]}" "$PJDFSTEST" "${args[@]}" -- "$t") \
            </dev/null 2>&1 | sed -E 's/\x1b\[[0-9;]*m//g' >"$out.retry" || true
        if awk -v t="$t" '$1 == t && $NF == "ok" { found = 1 } END { exit !found }' "$out.retry"; then
            awk -v t="$t" '$1 == t { $2 = "ok" } { print }' "$out.res" >"$out.res.tmp" &&
                mv "$out.res.tmp" "$out.res"
            say "  FLAKY: $t failed, then passed on retry (first run: $out)"
        fi
    done
}

# ------------------------------------------------------------------ pjdfstest
# run_pjdfstest DIR OUT: run the suite in DIR; OUT gets raw output, OUT.res
# one "name status" line per test (status: ok, FAILED, skipped).
# Returns 1 if the run did not complete (no Summary line).
run_pjdfstest() {
    local dir=$1 out=$2 rc=0 t0 t1
    local -a args=(-c "$PJDFSTEST_CONFIG" -p "$dir")
    [ -n "$SECONDARY" ] && args+=(-s "$SECONDARY")
    local -a pats=()
    [ -n "${PJDFSTEST_PATTERNS:-}" ] && read -r -a pats <<<"$PJDFSTEST_PATTERNS"
    t0=$(date +%s.%N)
    # In the background + wait, so that INT/TERM traps run even while the
    # suite is blocked on a hung mount.
    (cd "$dir" && NO_COLOR=1 exec timeout -k 10 "$PJDFSTEST_TIMEOUT" \
        "${PJD_WRAP[@]}" "$PJDFSTEST" "${args[@]}" -- "${pats[@]}") </dev/null >"$out.raw" 2>&1 &
    PJD_PID=$!
    wait "$PJD_PID" || rc=$?
    PJD_PID=""
    t1=$(date +%s.%N)
    sed -E 's/\x1b\[[0-9;]*m//g' "$out.raw" >"$out" && rm -f "$out.raw"
    RUN_SECONDS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    awk '
        /^[^ \t]/ {
            if (match($0, /[ \t](ok|FAILED|skipped|PASSED UNEXPECTEDLY|failed as expected)$/)) {
                st = substr($0, RSTART + 1)
                if (st == "PASSED UNEXPECTEDLY") st = "ok"
                else if (st == "failed as expected") st = "FAILED"
                print $1, st
            }
        }' "$out" >"$out.res"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        warn "pjdfstest timed out after ${PJDFSTEST_TIMEOUT}s in $dir"
    fi
    grep -q '^Summary:' "$out" || {
        warn "pjdfstest did not complete in $dir (exit $rc); output tail ($out):"
        tail -n 20 "$out" | sed 's/^/    /' >&2
        return 1
    }
}

# Exceptions as "name modes" lines (modes comma-separated, "all" if empty).
read_exceptions() {
    [ -f "$COMPAT_DOC" ] || return 0
    awk -F'|' '
        /^[ \t]*\|[ \t]*`[^`]+`/ {
            name = $2; gsub(/[ \t`]/, "", name)
            modes = $3; gsub(/[ \t`]/, "", modes)
            if (modes == "") modes = "all"
            print name, modes
        }' "$COMPAT_DOC"
}

# compare MODE NATIVE_RES MODE_RES MODE_OUT: prints detail lines and a final
# "COUNTS passed failed excepted native_passed" line.
compare() {
    awk -v mode="$1" -v outfile="$4" '
        function applies(t,   n, a, i) {
            if (!(t in exc)) return 0
            n = split(exc[t], a, ",")
            for (i = 1; i <= n; i++) if (a[i] == "all" || a[i] == mode) return 1
            return 0
        }
        FILENAME == ARGV[1] { exc[$1] = $2; next }
        FILENAME == ARGV[2] { if ($2 == "ok") { nat[$1] = 1; nn++ }; next }
        FILENAME == ARGV[3] { res[$1] = $2; next }
        # raw output: first detail line after a FAILED test
        FILENAME == ARGV[4] {
            if (cur != "" && /^\t/) { sub(/^\t/, ""); why[cur] = $0; cur = ""; next }
            cur = ($NF == "FAILED") ? $1 : ""
            next
        }
        END {
            for (t in nat) {
                r = (t in res) ? res[t] : "not run"
                if (r == "ok") p++
                else if (applies(t)) { x++; print "  excepted: " t " (" r ")" }
                else { f++; print "  FAIL: " t " (" r ")" ((t in why) ? ": " why[t] : "") }
            }
            for (t in exc) if (applies(t) && (t in res) && res[t] == "ok" && (t in nat))
                print "  note: " t " is listed in docs/COMPATIBILITY.md but passes"
            for (t in res) if (res[t] == "ok" && !(t in nat))
                print "  note: " t " passes on chronofs but not natively"
            printf "COUNTS %d %d %d %d\n", p, f, x, nn
        }' "$EXC_FILE" "$2" "$3" "$4" | sort
}

# ------------------------------------------------------------------ main
EXC_FILE=$WORK/exceptions
read_exceptions >"$EXC_FILE"

NATIVE_DIR=$WORK/n0
mkdir -p "$NATIVE_DIR"
chmod 755 "$NATIVE_DIR"
NATIVE_OUT=$PJDFSTEST_LOG_DIR/native.out
say "pjdfstest: native run in $NATIVE_DIR ($(stat -f -c %T "$NATIVE_DIR"))"
run_pjdfstest "$NATIVE_DIR" "$NATIVE_OUT" || die "native pjdfstest run failed; see $NATIVE_OUT"
native_pass=$(awk '$2 == "ok"' "$NATIVE_OUT.res" | wc -l)
native_fail=$(awk '$2 == "FAILED"' "$NATIVE_OUT.res" | wc -l)
native_skip=$(awk '$2 == "skipped"' "$NATIVE_OUT.res" | wc -l)
say "pjdfstest native: $native_pass passed, $native_fail failed, $native_skip skipped in ${RUN_SECONDS}s"
[ "$native_pass" -gt 0 ] || die "no test passed natively; see $NATIVE_OUT"
if [ "$native_fail" -gt 0 ]; then
    awk '$2 == "FAILED" { print "  native FAIL: " $1 }' "$NATIVE_OUT.res"
fi

total_pass=0
total_fail=0
total_exc=0
idx=0
for mode in "${MODES[@]}"; do
    idx=$((idx + 1))
    tag=$(printf '%s' "$mode" | tr -c 'A-Za-z0-9._-' '_')
    src=$WORK/s$idx
    mnt=$WORK/m$idx
    # The README's MNT = SRC form: the mount covers its own source.
    [ "$mode" = samedir ] && mnt=$src
    out=$PJDFSTEST_LOG_DIR/$tag.out
    log=$PJDFSTEST_LOG_DIR/$tag.daemon.log
    mkdir -p "$src" "$mnt"
    chmod 755 "$src" "$mnt"
    rm -f "$out" "$out.res"
    branches=$src
    # A union: SRC read-write over three pre-filled read-only branches.
    case $mode in
    # A union of one branch: the single-directory mount's removes and
    # renames, the union's lookups.
    union1*) branches="$src=rw" ;;
    union*)
        for l in 1 2 3; do
            mkdir -p "$src.l$l/dir$l/sub" "$src.l$l/shared"
            printf 'lower %s\n' "$l" >"$src.l$l/file$l"
            printf 'shared %s\n' "$l" >"$src.l$l/shared/f"
            : >"$src.l$l/dir$l/sub/leaf"
        done
        # A clone's hard links in a union (its link index in use).
        [ "$mode" = union-clone ] && ln "$src.l1/file1" "$src.l1/dir1/sub/file1"
        branches="$src=rw:$src.l1=ro:$src.l2=ro:$src.l3=ro"
        ;;
    esac
    if ! mount_fs "$mode" "$branches" "$mnt" "$log"; then
        unmount_fs "$mnt" "$CUR_PID"
        CUR_MNT=""
        CUR_PID=""
        say "pjdfstest $mode: 0 passed, $native_pass failed (native: $native_pass passed) [mount failed]"
        total_fail=$((total_fail + native_pass))
        continue
    fi
    # Modes changed while mounted: the top branch read-only, the first
    # lower one (pre-filled) read-write, so changes land below the top.
    if [ "$mode" = union-moded ]; then
        if ! "$CHRONOFS_BIN" branch mode "$mnt" 1 rw >/dev/null ||
            ! "$CHRONOFS_BIN" branch mode "$mnt" 0 ro >/dev/null; then
            say "pjdfstest $mode: branch mode failed"
        fi
    fi
    # Branches changed while mounted: a fresh read-write branch inserted on
    # top, the bottom one removed, then a snapshot (that branch frozen, a
    # fresh one on top, where changes land), something written, a second
    # snapshot, and snapmerge folding the second frozen branch into the
    # first.
    if [ "$mode" = union-added ]; then
        mkdir -p "$src.top"
        chmod 755 "$src.top"
        if ! "$CHRONOFS_BIN" branch add "$mnt" "$src.top" >/dev/null ||
            ! "$CHRONOFS_BIN" branch remove "$mnt" 4 >/dev/null ||
            ! "$CHRONOFS_BIN" snapshot "$mnt" >/dev/null ||
            ! mkdir "$mnt/merged-dir" || ! echo merged >"$mnt/merged-dir/f" ||
            ! "$CHRONOFS_BIN" snapshot "$mnt" >/dev/null ||
            ! "$CHRONOFS_BIN" snapmerge "$mnt" >/dev/null; then
            say "pjdfstest $mode: branch add/remove/snapshot/snapmerge failed"
        fi
    fi
    # In a sandbox of the union: pjdfstest (and its retries) run through
    # `chronofs sandbox`, in the sandbox the first call made.
    PJD_WRAP=()
    if [ "$mode" = union-sandbox ]; then
        if "$CHRONOFS_BIN" sandbox "$mnt" -- true 2>/dev/null; then
            PJD_WRAP=("$CHRONOFS_BIN" sandbox "$mnt" --id 1 --)
        else
            say "pjdfstest $mode: chronofs sandbox failed"
        fi
    fi
    # Inside a clone (`chronofs clone`) of a small tree (with a hard link:
    # the clone's link index is in use): the suite runs in the clone's
    # directory, filled from its base at first use.
    pjd_dir=$mnt
    if [ "$mode" = clone ]; then
        pjd_dir=$mnt/clone
        if ! mkdir -p "$mnt/base/d" || ! echo base >"$mnt/base/f" ||
            ! ln "$mnt/base/f" "$mnt/base/d/f2" || ! chmod 755 "$mnt/base" ||
            ! "$CHRONOFS_BIN" clone "$mnt/base" "$pjd_dir" >/dev/null; then
            say "pjdfstest $mode: chronofs clone failed"
        fi
    fi
    # Inside a clone of a lower directory, made over a whiteout: a second
    # lower directory removed through the union first.
    if [ "$mode" = union-clone ]; then
        pjd_dir=$mnt/dir2
        if ! rm -r "$pjd_dir" || ! chmod 755 "$mnt/dir1" ||
            ! "$CHRONOFS_BIN" clone "$mnt/dir1" "$pjd_dir" >/dev/null; then
            say "pjdfstest $mode: chronofs clone failed"
        fi
    fi
    chmod 755 "$mnt" 2>/dev/null || true
    completed=1
    run_pjdfstest "$pjd_dir" "$out" || completed=0
    secs=$RUN_SECONDS
    [ "$completed" = 1 ] && retry_failures "$pjd_dir" "$out" "$mode"
    unmount_fs "$mnt" "$CUR_PID"
    CUR_MNT=""
    CUR_PID=""
    [ -f "$out.res" ] || : >"$out.res"
    report=$(compare "$mode" "$NATIVE_OUT.res" "$out.res" "$out")
    read -r _ p f x nn <<<"$(printf '%s\n' "$report" | grep '^COUNTS ')"
    # At most 60 detail lines per mode (a hung run can miss hundreds).
    printf '%s\n' "$report" | grep -v '^COUNTS ' | awk -v out="$out" '
        NR <= 60 { print } END { if (NR > 60) print "  ... " NR - 60 " more lines: see " out ".res" }' || true
    extra=""
    [ "$x" -gt 0 ] && extra=", $x excepted"
    if [ "$completed" != 1 ]; then
        extra="$extra [run did not complete]"
        [ "$f" -gt 0 ] || f=1
    fi
    say "pjdfstest $mode: $p passed, $f failed$extra (native: $nn passed) in ${secs}s"
    if [ "$f" -gt 0 ]; then
        say "  details: $out, daemon log: $log"
    fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    total_exc=$((total_exc + x))
done

if [ "$total_exc" -gt 0 ]; then
    say "$total_pass passed, $total_fail failed, $total_exc skipped"
else
    say "$total_pass passed, $total_fail failed"
fi
[ "$total_fail" -eq 0 ]
