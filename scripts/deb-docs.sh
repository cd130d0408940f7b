#!/usr/bin/env bash
# Writes the Debian package's documentation files into DIR (make dist):
#
#   DIR/copyright     machine-readable (DEP-5): lockfs under Apache-2.0, the
#                     in-tree fork of bazil.org/fuse under its own notice
#   DIR/changelog.gz  one entry for VERSION: the commits since the last tag
#
#   scripts/deb-docs.sh DIR VERSION
#
# Both come from the repository (LICENSE, third_party/.../LICENSE, git log),
# and the changelog's date is the last commit's, so that two builds of one
# commit give the same files.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: $0 DIR VERSION}
version=${2:?usage: $0 DIR VERSION}
maintainer=$(sed -n 's/^maintainer: *//p' packaging/nfpm.yaml)
fork=third_party/bazil.org/fuse

# A license text as a DEP-5 field body: each line indented, blank lines ".".
indent() { sed 's/^$/./; s/^/ /'; }

{
	cat <<HDR
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: lockfs
Comment: /usr/bin/lockfs is a static Go binary: it also contains the Go
 modules that go.mod requires, each under its own license (Apache-2.0, MIT
 or BSD-3-Clause); \`go version -m /usr/bin/lockfs\` lists them.

Files: *
Copyright: the lockfs authors
License: Apache-2.0

Files: $fork/*
Copyright: 2013-2019 Tommi Virtanen; 2009, 2011, 2012 The Go Authors; lockfs's changes: the lockfs authors
License: BSD-3-Clause and MIT
HDR
	indent <"$fork/LICENSE"
	cat <<LIC

License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 is in
 /usr/share/common-licenses/Apache-2.0 (also LICENSE in the source tree).
LIC
} >"$dir/copyright"

# The commits since the last release tag (all of them before the first tag),
# newest first, at most 50.
range=HEAD
if tag=$(git describe --tags --abbrev=0 --match 'v[0-9]*' 2>/dev/null); then
	range="$tag..HEAD"
fi
{
	echo "lockfs ($version) unstable; urgency=medium"
	echo
	git log --no-merges --format='%s' -n 50 "$range" | sed 's/^/  * /' | fold -s -w 78 | sed 's/ *$//; /^  \* /!s/^/    /'
	echo
	echo " -- $maintainer  $(git log -1 --format=%aD HEAD)"
} | gzip -9n >"$dir/changelog.gz"
