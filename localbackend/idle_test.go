package localbackend

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// fileOf is the open file description behind a lease.
func fileOf(l lockmgr.Lease) *os.File { return l.(*lease).file }

func TestIdleDescriptorIsReusedUnlocked(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	// The outsider's flock(1) below takes longer than idleReuse on a
	// loaded machine (CI once saw the descriptor expire meanwhile): here
	// it stays reusable for a minute; the control below has its own
	// backend, with idleReuse.
	b.idle.reuse = time.Minute
	file := filepath.Join(src, "d", "..LOCK")

	l1 := mustClaim(t, b, dirID("d"), lockmgr.Exclusive)
	f1 := fileOf(l1)
	l1.Release(context.Background())
	// Idle, the descriptor holds nothing: outsiders get the lock at once.
	if !externalTry(t, file, "-x") {
		t.Fatal("flock -x -n failed after Release: the idle descriptor kept its lock")
	}
	l2 := mustClaim(t, b, dirID("d"), lockmgr.Shared)
	if fileOf(l2) != f1 {
		t.Fatal("a claim right after a release opened the file again instead of reusing the descriptor")
	}
	// The reused descriptor locks as a fresh one would.
	if externalTry(t, file, "-x") {
		t.Fatal("flock -x -n succeeded while the reused descriptor holds the lock shared")
	}
	l2.Release(context.Background())

	// Control: past idleReuse the descriptor is closed, not reused (on a
	// backend of its own; b lets go of the shared claim it keeps first).
	b.DropKept()
	b2 := newBackend(t, src)
	l4 := mustClaim(t, b2, dirID("d"), lockmgr.Exclusive)
	f4 := fileOf(l4)
	l4.Release(context.Background())
	time.Sleep(2 * idleReuse)
	l3 := mustClaim(t, b2, dirID("d"), lockmgr.Exclusive)
	defer l3.Release(context.Background())
	if fileOf(l3) == f4 {
		t.Fatal("a descriptor idle for longer than idleReuse was reused")
	}
}

func TestIdleDescriptorOfRemovedFileIsNotReused(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	dir := filepath.Join(src, "d")
	file := filepath.Join(dir, "..LOCK")

	l := mustClaim(t, b, dirID("d"), lockmgr.Exclusive)
	l.Release(context.Background())
	// The directory is removed and made again (rmdir through the mount
	// removes the backing files, or someone does it in SOURCE).
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l = mustClaim(t, b, dirID("d"), lockmgr.Exclusive)
	defer l.Release(context.Background())
	// The claim must be on the new file: an outsider locking it is
	// excluded. (Reusing the descriptor of the removed file would lock
	// nothing anyone else can see.)
	if externalTry(t, file, "-x") {
		t.Fatal("flock -x -n on the new backing file succeeded while we hold the lock: the claim went to the removed file")
	}
}

func TestCloseClosesIdleDescriptors(t *testing.T) {
	src := newSource(t, "a/b/c")
	before := testutil.OpenFds(t)
	b, err := New(Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".", "a", "a/b", "a/b/c"} {
		mustClaim(t, b, dirID(p), lockmgr.Shared).Release(context.Background())
	}
	if got := testutil.OpenFds(t); got <= before {
		t.Fatalf("%d descriptors open with four idle ones, %d before: the test cannot see idle descriptors", got, before)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.OpenFds(t); got != before {
		t.Fatalf("%d descriptors open after Close, %d before", got, before)
	}
}

// A daemon that goes quiet keeps no backing file open that it does not
// lock: the idle descriptors are closed by a sweep, not only at the next
// claim. (Without the sweep they would stay open until then.)
func TestIdleDescriptorsClosedWhenQuiet(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "a/b")
	b := newBackend(t, src)
	before := testutil.OpenFds(t)
	for _, p := range []string{".", "a", "a/b"} {
		mustClaim(t, b, dirID(p), lockmgr.Shared).Release(context.Background())
	}
	if got := testutil.OpenFds(t); got <= before {
		t.Fatalf("%d descriptors open with three idle ones, %d before: the test cannot see idle descriptors", got, before)
	}
	testutil.Eventually(t, "idle descriptors closed by the sweep", func() bool { return testutil.OpenFds(t) == before })
}
