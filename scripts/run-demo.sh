#!/usr/bin/env bash
# Mounts a small demo tree, demo/source, at demo/mnt in the foreground with
# the local backend. Ctrl-C (or `lockfs unmount demo/mnt` from another
# shell) stops it and releases every lock.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-bin/lockfs}
src=demo/source
mnt=demo/mnt

scripts/demo-tree.sh "$src"
mkdir -p "$mnt"

# A mount left by an earlier run that was killed: lockfs would clean up a
# stale one by itself, but a live one (another demo running) is ours to drop.
if grep -qs " $PWD/$mnt " /proc/mounts; then
	echo "run-demo: unmounting a leftover mount at $mnt"
	fusermount3 -uz "$mnt" || true
fi

cat <<MSG
lockfs demo: $src is mounted at $mnt until you press Ctrl-C.
Try, from another shell in $PWD:

  ls -a $mnt/projects                                   # alpha beta: control files are found by name, not listed
  flock $mnt/projects/.lock -c 'echo got it; sleep 5'   # exclusive lock on projects/
  flock -s $mnt/projects/alpha/.lock -c 'echo shared; sleep 5'
  cat $mnt/projects/.lock                               # who holds it, who waits
  flock -n $mnt/projects/.lock true || echo busy        # non-blocking: busy while held
  flock -n $mnt/shared/.lock true && echo free          # other directories are not affected

MSG

exec "$bin" mount "$src" "$mnt"
