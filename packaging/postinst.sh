#!/bin/sh
# Tell a running systemd about lockfs@.service. Nothing to do when
# installing into another root (dpkg --root sets DPKG_ROOT) or without
# systemd.
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload || true
fi
exit 0
