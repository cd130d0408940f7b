#!/usr/bin/env bash
# Checks a lockfs .deb: its metadata and contents (dpkg-deb), then installs
# it into a scratch root with dpkg --root, runs the installed binary and the
# mount helper link from there, removes it (dpkg -r: only the conffile
# stays) and purges it (nothing of lockfs stays). It touches nothing
# outside the scratch root.
#
#   scripts/test-deb.sh dist/lockfs_VERSION_ARCH.deb
set -euo pipefail

deb=${1:?usage: $0 PACKAGE.deb}
fail() { echo "test-deb: $*" >&2; exit 1; }

info=$(dpkg-deb --info "$deb")
grep -q '^ Package: lockfs$' <<<"$info" || fail "package name is not lockfs"
grep -q '^ Depends: .*fuse3' <<<"$info" || fail "no dependency on fuse3"

contents=$(dpkg-deb --contents "$deb")
for path in ./usr/bin/lockfs ./usr/lib/systemd/system/lockfs@.service ./etc/logrotate.d/lockfs \
	./usr/share/man/man1/lockfs.1.gz ./usr/share/man/man1/lockfs-mount.1.gz ./usr/share/man/man1/lockfs-doctor.1.gz \
	./usr/share/bash-completion/completions/lockfs ./usr/share/zsh/vendor-completions/_lockfs \
	./usr/share/fish/vendor_completions.d/lockfs.fish ./usr/share/doc/lockfs/copyright ./usr/share/doc/lockfs/changelog.gz; do
	grep -q " $path\$" <<<"$contents" || fail "$path missing from the package"
done
! grep -q powershell <<<"$contents" || fail "a powershell completion page in the package (lockfs is Linux only)"
grep -q '^ Homepage: https://github.com/lockfs/lockfs$' <<<"$info" || fail "Homepage is not the module path of go.mod"
copyright=$(dpkg-deb --fsys-tarfile "$deb" | tar -xOf - ./usr/share/doc/lockfs/copyright)
grep -q '^License: Apache-2.0$' <<<"$copyright" || fail "the copyright file does not declare Apache-2.0"
grep -q ' ./usr/sbin/mount.fuse.lockfs -> /usr/bin/lockfs$' <<<"$contents" || fail "mount helper link missing"

root=$(mktemp -d)
trap 'rm -rf "$root" "$root.out"' EXIT
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/usr/bin" "$root/usr/sbin"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
# dpkg --root runs maintainer scripts chrooted unless told otherwise; ours
# honour DPKG_ROOT. Dependencies are the host's business, not the root's.
dpkg_root() {
	if ! dpkg --root="$root" --force-script-chrootless --force-depends --log=/dev/null "$@" >"$root.out" 2>&1; then
		cat "$root.out" >&2
		fail "dpkg $*"
	fi
}

dpkg_root --install "$deb"
dpkg --root="$root" --status lockfs | grep -q '^Status: install ok installed$' || fail "not installed"
"$root/usr/bin/lockfs" --version | grep -q '^lockfs v' || fail "the installed binary does not run"
[[ $(readlink "$root/usr/sbin/mount.fuse.lockfs") == /usr/bin/lockfs ]] || fail "mount helper link is wrong"
grep -q '^ExecStart=/usr/bin/lockfs mount ' "$root/usr/lib/systemd/system/lockfs@.service" || fail "unit does not name /usr/bin/lockfs"
if command -v systemd-analyze >/dev/null 2>&1; then
	systemd-analyze security --offline=yes --root="$root" --threshold=50 lockfs@x.service >/dev/null ||
		fail "installed unit above exposure 5.0"
fi

dpkg_root --remove lockfs
left=$(cd "$root" && find . -path ./var -prune -o \( -type f -o -type l \) -print)
[[ $left == "./etc/logrotate.d/lockfs" ]] || fail "after dpkg -r, left besides the conffile: $left"
dpkg_root --purge lockfs
left=$(cd "$root" && find . -path ./var -prune -o \( -type f -o -type l -o -path ./etc/lockfs \) -print)
[[ -z $left ]] || fail "after dpkg --purge, left: $left"
echo "test-deb: $deb ok ($(wc -l <<<"$contents") entries; installed, ran, removed and purged in a scratch root)"
