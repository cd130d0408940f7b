#!/bin/sh
# Forget lockfs@.service in a running systemd; on purge, remove the
# directory of instance settings if it is empty (the admin's .env files
# are theirs and stay).
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload || true
fi
if [ "$1" = "purge" ]; then
	rmdir "${DPKG_ROOT:-}/etc/lockfs" 2>/dev/null || true
fi
exit 0
