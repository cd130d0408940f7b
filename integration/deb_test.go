package integration

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestDebPackage: `make dist` builds the static binary and the .deb, and
// scripts/test-deb.sh checks the package's contents and installs, runs,
// removes and purges it in a scratch root (dpkg --root), so nothing on this
// host changes. With a warm Go build cache it takes about 20 s.
func TestDebPackage(t *testing.T) {
	requireRoot(t)
	require(t, "make", "dpkg", "dpkg-deb")
	if r := run(t, 15*time.Minute, "make", "-C", "..", "dist", "GO="+goTool()); r.code != 0 {
		t.Fatalf("make dist: %v", r)
	}
	debs, _ := filepath.Glob("../dist/lockfs_*.deb")
	if len(debs) != 1 {
		t.Fatalf("make dist made %d packages: %v", len(debs), debs)
	}
	if r := run(t, 5*time.Minute, "bash", "../scripts/test-deb.sh", debs[0]); r.code != 0 {
		t.Fatalf("test-deb.sh: %v", r)
	} else {
		t.Log(r.stdout)
	}
	if out, err := exec.Command("ldd", "../dist/lockfs").CombinedOutput(); err == nil {
		t.Errorf("dist/lockfs is dynamically linked:\n%s", out)
	}
}
