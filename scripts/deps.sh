#!/usr/bin/env bash
# Checks the tools lockfs's build, tests and demo need, and installs the
# missing ones with apt-get when running as root; otherwise says exactly what
# to install and fails.
set -euo pipefail

# tool:packages pairs (packages separated by commas). gcc and the C library
# headers are for the race detector that `make test` uses; promtool checks
# that the alert rules of docs/OPERATIONS.md can fire (integration tests);
# etcd and etcdctl are the real etcd server the etcd backend's tests run
# (Debian's etcd 3.4; tests start their own members on free loopback ports).
needs=(
	fusermount3:fuse3
	flock:util-linux
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

if ((${#missing_pkgs[@]} > 0)); then
	echo "deps: missing ${missing_tools[*]} (packages: ${missing_pkgs[*]})" >&2
	if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		echo "deps: installing with apt-get: ${missing_pkgs[*]}" >&2
		export DEBIAN_FRONTEND=noninteractive
		apt-get update
		apt-get install -y --no-install-recommends "${missing_pkgs[@]}"
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
