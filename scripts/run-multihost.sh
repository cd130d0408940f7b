#!/usr/bin/env bash
# Two lockfs "hosts" on one machine sharing one lock namespace through a GCS
# bucket: builds bin/lockfs and the GCS emulator (fake-gcs-server, pinned by
# the tool line in go.mod), starts the emulator on a free loopback port with
# an in-memory store, creates the bucket, and mounts (with BACKEND=etcd, or
# make run-multihost-etcd: starts a one-member etcd server instead, Debian's
# etcd-server, with its data in a temporary directory, and mounts with
# --backend etcd)
#
#   demo/hostA/source at demo/hostA/mnt   (--host-id host-a)
#   demo/hostB/source at demo/hostB/mnt   (--host-id host-b)
#
# so that flock on host A blocks flock on host B. It runs in the foreground
# until Ctrl-C or SIGTERM, then unmounts both (each daemon releases its
# leases first), stops the emulator or etcd and removes its data and logs: no
# process, mount or temporary file is left behind. The demo trees stay (make
# clean removes them).
#
# Environment: GO (go command), LDFLAGS (for bin/lockfs), LEASE_TTL (default
# 10s: a killed host's locks are taken over after it), BACKEND (gcs, the
# default, or etcd).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
ttl=${LEASE_TTL:-10s}
bucket=lockfs-demo
bin=bin/lockfs
emu=bin/fake-gcs-server
hosts=(A B)
backend=${BACKEND:-gcs}
case $backend in
gcs | etcd) ;;
*)
	echo "run-multihost: BACKEND=$backend: want gcs or etcd" >&2
	exit 2
	;;
esac

mkdir -p bin
if [[ $backend == gcs ]]; then
	echo "run-multihost: building $bin and $emu (the emulator takes a minute the first time)"
	"$GO" build -tags "${TAGS:-disable_grpc_modules}" -ldflags "${LDFLAGS:-}" -o "$bin" ./cmd/lockfs
	"$GO" build -o "$emu" github.com/fsouza/fake-gcs-server
else
	echo "run-multihost: building $bin"
	"$GO" build -tags "${TAGS:-disable_grpc_modules}" -ldflags "${LDFLAGS:-}" -o "$bin" ./cmd/lockfs
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lockfs-multihost.XXXXXX")
emu_pid=""
declare -A daemon # host -> pid

# http METHOD URL [JSON]: prints the body; fails unless the status is 2xx.
http() {
	if command -v curl >/dev/null 2>&1; then
		local args=(-fsS --max-time 5 -X "$1")
		(($# > 2)) && args+=(-H 'Content-Type: application/json' --data "$3")
		curl "${args[@]}" "$2"
	else
		python3 - "$@" <<'PY'
import sys, urllib.request
method, url = sys.argv[1], sys.argv[2]
data = sys.argv[3].encode() if len(sys.argv) > 3 else None
req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"} if data else {})
sys.stdout.write(urllib.request.urlopen(req, timeout=5).read().decode())
PY
	fi
}

mounted() { grep -qs " $PWD/$1 " /proc/mounts; }

cleanup() {
	local rc=$?
	# A second signal (make forwards SIGTERM to its child; a terminal's
	# Ctrl-C reaches the whole process group) must not cut the clean-up
	# short: it is bounded (about 20 s at most).
	trap '' INT TERM
	trap - EXIT
	set +e
	echo
	echo "run-multihost: stopping (each daemon releases its leases, then unmounts)"
	for h in "${hosts[@]}"; do
		[[ -n ${daemon[$h]:-} ]] && kill -TERM "${daemon[$h]}" 2>/dev/null
	done
	for h in "${hosts[@]}"; do
		local pid=${daemon[$h]:-}
		[[ -n $pid ]] || continue
		for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$pid" 2>/dev/null; then
			echo "run-multihost: host $h's daemon did not stop within 15s; killing it" >&2
			kill -KILL "$pid" 2>/dev/null
		fi
		wait "$pid" 2>/dev/null
	done
	for h in "${hosts[@]}"; do
		local mnt=demo/host$h/mnt
		if mounted "$mnt"; then fusermount3 -uz "$mnt" 2>/dev/null; fi
	done
	if [[ -n $emu_pid ]]; then
		kill -TERM "$emu_pid" 2>/dev/null
		for _ in $(seq 50); do kill -0 "$emu_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$emu_pid" 2>/dev/null
		wait "$emu_pid" 2>/dev/null
	fi
	if ((rc != 0 && rc != 130 && rc != 143)); then
		for f in "$tmp"/*.log; do
			[[ -s $f ]] && { echo "--- $f (last 20 lines)"; tail -n 20 "$f"; } >&2
		done
	fi
	rm -rf "$tmp"
	echo "run-multihost: stopped; nothing left mounted or running"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Mounts left by an earlier run that was killed.
for h in "${hosts[@]}"; do
	mnt=demo/host$h/mnt
	if mounted "$mnt"; then
		echo "run-multihost: unmounting a leftover mount at $mnt"
		fusermount3 -uz "$mnt" || true
	fi
done

# The emulator (or etcd) and the daemons run in sessions of their own
# (setsid): a terminal's Ctrl-C, or a signal to make's process group, reaches
# only this script, which stops the daemons first (they release their
# leases) and the emulator or etcd last.
#
# etcd: one member on free loopback ports, its data in $tmp.
start_etcd() {
	local attempt cport pport
	for attempt in 1 2 3 4 5; do
		cport=$((20000 + RANDOM % 40000)) pport=$((20000 + RANDOM % 40000))
		if (: </dev/tcp/127.0.0.1/$cport) 2>/dev/null || (: </dev/tcp/127.0.0.1/$pport) 2>/dev/null; then continue; fi
		setsid etcd --name demo --data-dir "$tmp/etcd" \
			--listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
			--listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
			--initial-cluster "demo=http://127.0.0.1:$pport" --logger zap --log-outputs stderr --log-level warn \
			>"$tmp/etcd.log" 2>&1 &
		emu_pid=$!
		for _ in $(seq 150); do
			kill -0 "$emu_pid" 2>/dev/null || break
			if http GET "http://127.0.0.1:$cport/health" 2>/dev/null | grep -q '"health":"true"'; then
				port=$cport
				return 0
			fi
			sleep 0.1
		done
		kill -KILL "$emu_pid" 2>/dev/null || true
		wait "$emu_pid" 2>/dev/null || true
		emu_pid=""
	done
	echo "run-multihost: etcd did not start; its output:" >&2
	cat "$tmp/etcd.log" >&2
	exit 1
}
if [[ $backend == etcd ]]; then
	command -v etcd >/dev/null || { echo "run-multihost: etcd is not installed (make deps installs etcd-server)" >&2; exit 1; }
	start_etcd
fi

# The emulator, on a free loopback port (retried if the port is taken
# between the check and the start).
for attempt in 1 2 3 4 5; do
	[[ $backend == gcs ]] || break
	port=$((20000 + RANDOM % 40000))
	if (: </dev/tcp/127.0.0.1/$port) 2>/dev/null; then continue; fi # in use
	setsid "$emu" -scheme http -host 127.0.0.1 -port "$port" -backend memory \
		-public-host "127.0.0.1:$port" -log-level warn >"$tmp/emulator.log" 2>&1 &
	emu_pid=$!
	for _ in $(seq 150); do
		kill -0 "$emu_pid" 2>/dev/null || break
		if http GET "http://127.0.0.1:$port/_internal/healthcheck" >/dev/null 2>&1; then break 2; fi
		sleep 0.1
	done
	kill -KILL "$emu_pid" 2>/dev/null || true
	wait "$emu_pid" 2>/dev/null || true
	emu_pid=""
done
if [[ -z $emu_pid ]]; then
	echo "run-multihost: the emulator did not start; its output:" >&2
	cat "$tmp/emulator.log" >&2
	exit 1
fi
base=http://127.0.0.1:$port
if [[ $backend == gcs ]]; then
	http POST "$base/storage/v1/b?project=test" "{\"name\":\"$bucket\"}" >/dev/null
	backend_args=(--backend gcs --gcs-bucket "$bucket" --gcs-endpoint "$base/storage/v1/")
	where="the bucket $bucket of a GCS
emulator at $base"
else
	backend_args=(--backend etcd --etcd-endpoints "$base" --etcd-prefix lockfs-demo/)
	where="the prefix lockfs-demo/ of the etcd
server at $base"
fi

# The two hosts' trees and mounts.
for h in "${hosts[@]}"; do
	src=demo/host$h/source mnt=demo/host$h/mnt
	mkdir -p "$src/projects/alpha" "$src/projects/beta" "$src/shared" "$mnt"
	[[ -e $src/projects/alpha/README ]] || echo "project alpha, as host $h sees it" >"$src/projects/alpha/README"
	id=host-${h,,}
	setsid "$bin" mount "${backend_args[@]}" \
		--lease-ttl "$ttl" --host-id "$id" "$src" "$mnt" >"$tmp/host$h.log" 2>&1 &
	daemon[$h]=$!
done
for h in "${hosts[@]}"; do
	mnt=demo/host$h/mnt
	for _ in $(seq 200); do
		mounted "$mnt" && break
		if ! kill -0 "${daemon[$h]}" 2>/dev/null; then
			echo "run-multihost: host $h's daemon exited before mounting:" >&2
			cat "$tmp/host$h.log" >&2
			exit 1
		fi
		sleep 0.1
	done
	mounted "$mnt" || { echo "run-multihost: $mnt not mounted after 20s" >&2; exit 1; }
done

A=demo/hostA/mnt B=demo/hostB/mnt
cat <<MSG

lockfs multi-host demo: two daemons ("hosts") share $where (lease TTL $ttl).

  host A: demo/hostA/source at $A   (host-a, daemon pid ${daemon[A]})
  host B: demo/hostB/source at $B   (host-b, daemon pid ${daemon[B]})

The trees are separate; the locks are shared: projects/.lock on A and on B is
one lock. Try, from other shells in $PWD:

  flock $A/projects/.lock -c 'echo A holds projects; sleep 30'    # shell 1: host A
  flock -n $B/projects/.lock true || echo "busy on host B"        # shell 2: refused
  flock $B/projects/.lock -c 'echo B got it'                      # waits for A
  flock -n -s $B/projects/alpha/.lock true || echo busy           # inside projects/: refused too
  flock -n $B/shared/.lock true && echo "shared/ is free"         # other directories are not
  cat $B/projects/.lock                                           # holder, waiters, lease
  $bin status $A                                                  # every lock of host A

  kill -9 ${daemon[A]}    # host A crashes: B gets its locks after the TTL ($ttl)

Ctrl-C here stops both hosts and the $backend server.
MSG

# Until a signal (the traps run cleanup). A daemon that dies (kill -9 above)
# leaves a stale mount: drop it and carry on with the other host; if the
# emulator dies, stop.
set +e
live=("${hosts[@]}")
while ((${#live[@]} > 0)); do
	pids=()
	for h in "${live[@]}"; do pids+=("${daemon[$h]}"); done
	wait -n "${pids[@]}" "$emu_pid"
	if ! kill -0 "$emu_pid" 2>/dev/null; then
		echo "run-multihost: the $backend server exited; stopping" >&2
		exit 1
	fi
	still=()
	for h in "${live[@]}"; do
		if kill -0 "${daemon[$h]}" 2>/dev/null; then
			still+=("$h")
			continue
		fi
		wait "${daemon[$h]}"
		echo "run-multihost: host $h's daemon exited (status $?); its locks are taken over after the TTL"
		daemon[$h]=""
		mnt=demo/host$h/mnt
		if mounted "$mnt"; then fusermount3 -uz "$mnt" && echo "run-multihost: unmounted the stale mount at $mnt"; fi
	done
	live=("${still[@]}")
done
echo "run-multihost: both daemons have exited; stopping"
exit 1
