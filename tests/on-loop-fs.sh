#!/usr/bin/env bash
# tests/on-loop-fs.sh FS CMD ARGS...: runs CMD with CHRONOFS_TEST_TMP on a
# fresh loop image of file system FS (btrfs or xfs), under /var/tmp; the
# image is unmounted and deleted afterwards, whatever CMD did. Exits with
# CMD's status (2 for bad use, 3 if the image cannot be made).
set -uo pipefail

fs=${1:-}
shift || true
case "$fs" in
    btrfs) mkfs=(mkfs.btrfs -q -f) ;;
    xfs) mkfs=(mkfs.xfs -q -f -m reflink=1) ;;
    *) echo "on-loop-fs: usage: on-loop-fs.sh btrfs|xfs CMD ARGS..." >&2; exit 2 ;;
esac
[ $# -gt 0 ] || { echo "on-loop-fs: no command" >&2; exit 2; }

work=$(mktemp -d /var/tmp/chronofs-on-"$fs".XXXXXX) || exit 3
dir=$work/fs
mounted=0
cleanup() {
    if [ "$mounted" = 1 ]; then
        # A FUSE daemon over it lets go of its files as it exits, just
        # after its unmount returns.
        for _ in $(seq 100); do
            umount "$dir" 2>/dev/null && { mounted=0; break; }
            sleep 0.1
        done
        [ "$mounted" = 1 ] && umount -l "$dir"
    fi
    rm -rf "$work"
}
trap cleanup EXIT

truncate -s 8G "$work/img" && "${mkfs[@]}" "$work/img" >/dev/null 2>&1 &&
    mkdir "$dir" && mount -o loop "$work/img" "$dir" || {
    echo "on-loop-fs: cannot make a $fs image in $work" >&2
    exit 3
}
mounted=1
chmod 755 "$dir"
CHRONOFS_TEST_TMP=$dir "$@"
