#!/usr/bin/env bash
# Checks the tools a make target needs, and installs the missing ones with
# apt-get when running as root; otherwise says exactly what to install and
# fails.
#
#   scripts/deps.sh run        make run: fuse3 (fusermount3), util-linux (flock)
#   scripts/deps.sh bench      make bench: the same, python3, rsync and etcd (the measurements' tools)
#   scripts/deps.sh multihost  make run-multihost: the same and python3
#   scripts/deps.sh multihost-etcd  make run-multihost-etcd: the same and etcd
#   scripts/deps.sh test       make test (the default): everything the tests run
#
# A demo installs only what it needs. A package installed here that ships a
# service (prometheus, for promtool) is neither started by the install nor
# left enabled: the tests need its tools, not a server listening on a port
# and coming back at boot.
set -euo pipefail

profile=${1:-test}

# tool:packages pairs (packages separated by commas).
run_needs=(
	fusermount3:fuse3
	flock:util-linux
)
case $profile in
run) needs=("${run_needs[@]}") ;;
multihost) needs=("${run_needs[@]}" python3:python3) ;;
multihost-etcd) needs=("${run_needs[@]}" python3:python3 etcd:etcd-server) ;;
bench)
	# tree walks with rsync (and du, tar: coreutils and tar are always
	# there), the paused-daemon test's holder in python3, the etcd rows'
	# member (its service is disabled below).
	needs=("${run_needs[@]}" python3:python3 rsync:rsync etcd:etcd-server)
	;;
test)
	# setpriv runs programs as another user; gcc and the C library
	# headers are for the race detector; promtool checks that the alert
	# rules of docs/OPERATIONS.md can fire (integration tests); etcd and
	# etcdctl are the real etcd server (Debian's etcd 3.4) that the etcd
	# backend's tests start as their own members on loopback ports (its
	# service is disabled below like prometheus's).
	needs=(
		"${run_needs[@]}"
		setpriv:util-linux
		python3:python3
		sqlite3:sqlite3
		stress-ng:stress-ng
		rsync:rsync
		gcc:gcc,libc6-dev
		promtool:prometheus
		etcd:etcd-server
		etcdctl:etcd-client
	)
	;;
*)
	echo "deps: unknown profile $profile (want run, bench, multihost, multihost-etcd or test)" >&2
	exit 2
	;;
esac

missing_pkgs=()
missing_tools=()
for pair in "${needs[@]}"; do
	tool=${pair%%:*} pkg=${pair#*:}
	if ! command -v "$tool" >/dev/null 2>&1; then
		missing_tools+=("$tool")
		for p in ${pkg//,/ }; do
			case " ${missing_pkgs[*]-} " in *" $p "*) ;; *) missing_pkgs+=("$p") ;; esac
		done
	fi
done

# quiet_services disables, and stops if running, every systemd service that
# the packages named ship: Debian enables a package's services at install.
quiet_services() {
	local pkg unit
	for pkg in "$@"; do
		for unit in $(dpkg -L "$pkg" 2>/dev/null | grep -E '^/(usr/)?lib/systemd/system/[^/]+\.service$' | xargs -r -n1 basename); do
			if command -v systemctl >/dev/null 2>&1; then
				if [[ -d /run/systemd/system ]] && systemctl is-active --quiet "$unit"; then
					systemctl stop "$unit" || true
				fi
				if systemctl is-enabled --quiet "$unit" 2>/dev/null; then
					echo "deps: disabling $unit (installed by $pkg for its tools; a test run leaves no server enabled)" >&2
					systemctl disable --quiet "$unit" 2>/dev/null || rm -f /etc/systemd/system/*.wants/"$unit"
				fi
			else
				rm -f /etc/systemd/system/*.wants/"$unit"
			fi
		done
	done
}

if ((${#missing_pkgs[@]} > 0)); then
	echo "deps: missing ${missing_tools[*]} (packages: ${missing_pkgs[*]})" >&2
	if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		echo "deps: installing with apt-get: ${missing_pkgs[*]}" >&2
		export DEBIAN_FRONTEND=noninteractive
		# No service starts during the install (policy-rc.d, which
		# Debian's maintainer scripts ask first); quiet_services then
		# disables what the packages enabled.
		policy=/usr/sbin/policy-rc.d
		own_policy=""
		if [[ ! -e $policy ]]; then
			printf '#!/bin/sh\n# written by lockfs scripts/deps.sh during apt-get install\nexit 101\n' >"$policy"
			chmod 0755 "$policy"
			own_policy=1
		fi
		status=0
		apt-get update && apt-get install -y --no-install-recommends "${missing_pkgs[@]}" || status=$?
		[[ -n $own_policy ]] && rm -f "$policy"
		((status == 0)) || exit "$status"
		quiet_services "${missing_pkgs[@]}"
	else
		echo "deps: install them first, as root: apt-get install -y ${missing_pkgs[*]}" >&2
		exit 1
	fi
	for pair in "${needs[@]}"; do
		tool=${pair%%:*} pkg=${pair#*:}
		if ! command -v "$tool" >/dev/null 2>&1; then
			echo "deps: $tool is still missing after installing $pkg" >&2
			exit 1
		fi
	done
fi

if [[ ! -e /dev/fuse ]]; then
	echo "deps: /dev/fuse is missing: load the module with 'modprobe fuse'," \
		"or in a container run with --device /dev/fuse (and --cap-add SYS_ADMIN)" >&2
	exit 1
fi
