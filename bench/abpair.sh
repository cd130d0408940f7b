#!/bin/bash
# bench/abpair.sh A B: two lockfs binaries side by side, each mounted over
# its own SOURCE, `loadgen pair` N times at depth 4 and at the root on
# each, alternately, for ROUNDS rounds. Prints, per run, the daemon's CPU
# time (utime + stime from /proc/PID/stat, in clock ticks, 10 ms each)
# and the pair's latency. On this 2-core VM wall-clock figures move with
# the host's load; the daemon's CPU time separates small changes better.
#
#   go build -tags disable_grpc_modules -o /tmp/lockfs-a ./cmd/lockfs   # at the base
#   go build -tags disable_grpc_modules -o /tmp/lockfs-b ./cmd/lockfs   # with the change
#   ROUNDS=6 N=20000 bash bench/abpair.sh /tmp/lockfs-a /tmp/lockfs-b
#
# Extra arguments for both daemons' `lockfs mount` go in MOUNT_ARGS.
# LOAD=meta runs `loadgen meta` (create, stat and unlink of a new file)
# N times in the top directory `meta` instead, the load of the bench's
# meta row; its figure is then µs per cycle.
set -euo pipefail
if [ $# -ne 2 ]; then
	echo "usage: $0 LOCKFS_A LOCKFS_B" >&2
	exit 2
fi
rounds=${ROUNDS:-6}
n=${N:-20000}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/lockfs-abpair.XXXXXX)
loadgen=$work/loadgen
(cd "$here" && go build -o "$loadgen" ./bench/internal/loadgen)

bins=("$1" "$2")
pids=()
cleanup() {
	for i in 0 1; do
		fusermount3 -u "$work/$i/mnt" 2>/dev/null || umount -l "$work/$i/mnt" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
for i in 0 1; do
	mkdir -p "$work/$i/src/a/b/c/d" "$work/$i/src/meta" "$work/$i/mnt"
	# shellcheck disable=SC2086
	setsid "${bins[$i]}" mount ${MOUNT_ARGS:-} "$work/$i/src" "$work/$i/mnt" >"$work/$i.log" 2>&1 &
	pids+=($!)
done
for i in 0 1; do
	for _ in $(seq 100); do
		mountpoint -q "$work/$i/mnt" && break
		sleep 0.1
	done
	mountpoint -q "$work/$i/mnt" || { echo "daemon $i did not mount:" >&2; cat "$work/$i.log" >&2; exit 1; }
done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
load=${LOAD:-pair}
case $load in
pair) targets=(a/b/c/d/.lock .lock) ;;
meta) targets=(meta) ;;
*)
	echo "LOAD must be pair or meta, not $load" >&2
	exit 2
	;;
esac
printf '%-5s %-7s %-14s %7s %9s\n' round daemon target ticks us/op
for r in $(seq "$rounds"); do
	for i in 0 1; do
		for f in "${targets[@]}"; do
			t0=$(ticks "${pids[$i]}")
			if [ "$load" = pair ]; then
				out=$("$loadgen" pair -file "$work/$i/mnt/$f" -n "$n")
			else
				out=$("$loadgen" meta -dir "$work/$i/mnt/$f" -n "$n")
			fi
			t1=$(ticks "${pids[$i]}")
			us=$(echo "$out" | python3 -c 'import json, sys; print("%.1f" % (json.load(sys.stdin)["ns_per_op"] / 1000))')
			printf '%-5s %-7s %-14s %7s %9s\n' "$r" "$([ $i = 0 ] && echo A || echo B)" "$f" $((t1 - t0)) "$us"
		done
	done
done
