package integration

import (
	"os"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestNewDirAdoption: a directory created under an exclusive new-dir lock
// is, in effect, locked exclusively by the lock's holder until it releases
// the new-dir lock (SPEC §2). The control: a directory created without the
// new-dir lock is free at once.
func TestNewDirAdoption(t *testing.T) {
	m := mount(t)
	holder := start(t, "flock", "-x", m.path("a/.lock_newdir"), "sh", "-c",
		"mkdir \"$1\" && echo made && { read _ || true; }", "sh", m.path("a/fresh"))
	holder.waitLine("made", 10*time.Second)
	if r := run(t, 10*time.Second, "flock", "-n", m.path("a/fresh/.lock"), "true"); r.code != 1 {
		t.Fatalf("flock -n on the new directory while its creator holds the new-dir lock: %v, want exit 1", r)
	}
	if r := run(t, 10*time.Second, "flock", "-n", "-s", m.path("a/fresh/sub/.lock"), "true"); r.code == 0 {
		t.Fatalf("a lock inside the new directory was granted to a stranger: %v", r)
	}
	// Control: made without the new-dir lock, the directory is free.
	if err := os.Mkdir(m.srcPath("a/plain"), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := run(t, 10*time.Second, "flock", "-n", m.path("a/plain/.lock"), "true"); r.code != 0 {
		t.Fatalf("control: flock -n on a directory made without the new-dir lock: %v", r)
	}
	holder.stdin.Close() // read returns: the holder ends and releases the new-dir lock
	if code, ok := holder.wait(10 * time.Second); !ok || code != 0 {
		t.Fatalf("holder: exit %d, ended %v", code, ok)
	}
	// The kernel sends the RELEASE of the exited holder's descriptor in the
	// background, so the lock goes a moment after the process (CI once ran
	// flock -n 2 ms after the exit, before the daemon had the RELEASE).
	var r result
	if !testutil.Poll(10*time.Second, func() bool {
		r = run(t, 10*time.Second, "flock", "-n", m.path("a/fresh/.lock"), "true")
		return r.code == 0
	}) {
		t.Fatalf("after the new-dir lock was released, flock -n on the new directory: %v", r)
	}
}
