package fs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// treeScript builds a tree through the mount, locks some of its directories
// (so that SOURCE holds backing files), and runs the tools that walk trees
// over it: find, du, cp -a, a tar round trip, diff -r, rm -rf and Python's
// shutil.rmtree.
const treeScript = `
set -eu
cd "$MNT"
mkdir -p t/a/b t/c
echo x > t/a/f
echo y > t/a/b/g
flock t/a/.lock true
flock -x t/a/b/.lock true
flock t/.lock_newdir true
test -f "$SRC/t/a/..LOCK" && test -f "$SRC/t/a/b/..LOCK" && test -f "$SRC/t/..LOCK_NEWDIR"
ls -l t/a/.lock >/dev/null
find t | sort > "$OUT/find"
du -s t > /dev/null
cp -a t t2
tar -cf "$OUT/t.tar" t
mkdir t3
tar -C t3 -xf "$OUT/t.tar"
diff -r t t2
diff -r t t3/t
rm -rf t2
python3 -c 'import shutil; shutil.rmtree("t3")'
rm -rf t
echo done
`

// TestTreeToolsSkipControlFiles: rm -rf, shutil.rmtree, cp -a, tar, find,
// du and diff -r work through the mount on a tree whose directories were
// locked, because readdir lists no control file (SPEC §1). Control: the
// same rm -rf with the control files listed fails on them.
func TestTreeToolsSkipControlFiles(t *testing.T) {
	testutil.RequireTools(t, "flock", "python3", "tar", "diff", "find", "du", "cp")
	m := newPTMount(t)
	out := t.TempDir()
	code, text := ptSh(t, time.Minute, "MNT="+m.mnt+" SRC="+m.src+" OUT="+out+"\n"+treeScript)
	if code != 0 || !strings.HasSuffix(text, "done\n") {
		t.Fatalf("tree tools through the mount: exit %d: %s", code, text)
	}
	found, err := os.ReadFile(filepath.Join(out, "find"))
	if err != nil {
		t.Fatal(err)
	}
	want := "t\nt/a\nt/a/b\nt/a/b/g\nt/a/f\nt/c\n"
	if string(found) != want {
		t.Errorf("find listed %q, want %q", found, want)
	}
	for _, name := range []string{"t", "t2", "t3"} {
		if _, err := os.Lstat(m.s(name)); !os.IsNotExist(err) {
			t.Errorf("%s still in SOURCE after its removal through the mount: %v", name, err)
		}
	}
}

func TestTreeToolsControlListed(t *testing.T) {
	testutil.RequireTools(t, "flock")
	src, mnt := t.TempDir(), t.TempDir()
	m := newPTMountAt(t, src, mnt, func(c *Config) { c.ListControlFiles = true })
	code, text := ptSh(t, time.Minute, "cd "+m.mnt+" && mkdir -p t/a && flock t/a/.lock true && rm -rf t")
	if code == 0 {
		t.Fatalf("rm -rf with the control files listed succeeded: %s", text)
	}
	if !strings.Contains(text, ".lock") {
		t.Errorf("rm -rf failed, but not on a control file: %s", text)
	}
}
