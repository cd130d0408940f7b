#!/usr/bin/env bash
# Creates the demo tree that `make run` mounts and the README's examples
# use: DIR/projects/{alpha,beta} and DIR/shared, with a README in each
# project. Existing files are kept.
#
#   scripts/demo-tree.sh DIR
set -euo pipefail
src=${1:?usage: $0 DIR}
mkdir -p "$src/projects/alpha" "$src/projects/beta" "$src/shared"
[[ -e $src/projects/alpha/README ]] || echo "project alpha" >"$src/projects/alpha/README"
[[ -e $src/projects/beta/README ]] || echo "project beta" >"$src/projects/beta/README"
