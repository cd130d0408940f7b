package fs

import (
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// deepScript builds a tree deeper than PATH_MAX in $1 by changing into each
// new directory in turn (every path it uses is short), then makes, reads,
// stats, renames and removes entries at the bottom, locks there when $2 is
// "lock", and removes the tree again bottom up.
const deepScript = `
set -eu
cd "$1"
n=$(printf 'n%.0s' $(seq 100))
for i in $(seq 45); do mkdir "$n$i"; cd "$n$i"; done
test "$(pwd | wc -c)" -gt 4096
echo hello > f
test "$(cat f)" = hello
stat f > /dev/null
ls -l > /dev/null
mkdir sub
rmdir sub
ln -s f l
test "$(readlink l)" = f
mv f g
rm g l
if [ "$2" = lock ]; then
	flock -x .lock true
	flock -s .lock_newdir true
	head -c 200 .lock | grep -q '^lock '
fi
for i in $(seq 45 -1 1); do cd ..; rmdir "$n$i"; done
echo done
`

// TestDeepTree: entries whose path below SOURCE is longer than PATH_MAX
// work through the mount as on a local file system (the control runs the
// same script on the test's temporary directory). Before the fix every
// operation there failed with ENAMETOOLONG, a lock call with EIO, and
// mkdir did so after creating the directory.
func TestDeepTree(t *testing.T) {
	testutil.RequireTools(t, "flock", "bash")
	local := t.TempDir()
	if code, out := ptSh(t, time.Minute, "set -- "+local+" nolock\n"+deepScript); code != 0 || !strings.HasSuffix(out, "done\n") {
		t.Fatalf("the script fails on the local file system: exit %d: %s", code, out)
	}
	m := newPTMount(t)
	if code, out := ptSh(t, time.Minute, "set -- "+m.mnt+" lock\n"+deepScript); code != 0 || !strings.HasSuffix(out, "done\n") {
		t.Fatalf("through the mount: exit %d: %s", code, out)
	}
}
