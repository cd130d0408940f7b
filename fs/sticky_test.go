package fs

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPTStickyBit: the sticky bit shows through the mount and survives a
// chmod made through it. bazil's attribute encoding used to drop S_ISVTX
// (fixed in third_party/bazil.org/fuse, PATCHES.md): before the fix
// `mkdir -m 1777` showed 0777 through the mount, and `chmod g+w` on a 1755
// directory, computed by chmod(1) from the 0755 the mount showed, cleared
// the bit in SOURCE. The SOURCE side of each check is its control: the
// bit was set there, so only the encoding can lose it.
func TestPTStickyBit(t *testing.T) {
	m := newPTMount(t)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%q: %v: %s", args, err, out)
		}
	}
	perm := func(p string) uint32 { return lstat(t, p).Mode & 0o7777 }

	run("mkdir", "-m", "1777", m.m("tmp"))
	if got := perm(m.s("tmp")); got != 0o1777 {
		t.Fatalf("SOURCE mode after mkdir -m 1777 through the mount: %#o", got)
	}
	if got := perm(m.m("tmp")); got != 0o1777 {
		t.Errorf("mount shows %#o for a 1777 directory, want 01777", got)
	}

	if err := os.Mkdir(m.s("shared"), 0o755); err != nil {
		t.Fatal(err)
	}
	// (os.Chmod would need os.ModeSticky; 0o1000 is not that bit.)
	if err := unix.Chmod(m.s("shared"), 0o1755); err != nil {
		t.Fatal(err)
	}
	if got := perm(m.m("shared")); got != 0o1755 {
		t.Errorf("mount shows %#o for a 1755 directory, want 01755", got)
	}
	run("chmod", "g+w", m.m("shared"))
	if got := perm(m.s("shared")); got != 0o1775 {
		t.Errorf("SOURCE mode after chmod g+w through the mount on 1755: %#o, want 01775", got)
	}
	if got := perm(m.m("shared")); got != 0o1775 {
		t.Errorf("mount shows %#o after chmod g+w on 1755, want 01775", got)
	}
}
