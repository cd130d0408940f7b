package localbackend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// A rename of a directory (through a mount, under GuardTree) takes its
// backing files along. A claim that had the moved file open, waiting or as
// an idle descriptor, must notice and open the name again.

func TestGuardTreeBusyWhileClaimed(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d/e")
	b := newBackend(t, src)
	l := mustClaim(t, b, dirID("d"), lockmgr.Shared)
	if _, err := b.GuardTree("d"); !errors.Is(err, lockmgr.ErrBusy) {
		t.Fatalf("GuardTree while d is claimed shared: %v, want ErrBusy", err)
	}
	l.Release(context.Background())
	// Control: free now; while guarded, a claim without waiting fails,
	// and the guard's own backing file goes in release, wherever d went.
	release, err := b.GuardTree("d/e")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claim(context.Background(), dirID("d/e"), lockmgr.Shared, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Errorf("claim on a guarded directory: %v, want ErrWouldBlock", err)
	}
	if err := os.Rename(filepath.Join(src, "d/e"), filepath.Join(src, "d/f")); err != nil {
		t.Fatal(err)
	}
	release()
	if _, err := os.Stat(filepath.Join(src, "d/f/..LOCK")); !os.IsNotExist(err) {
		t.Errorf("the guard's backing file stayed after the rename: %v", err)
	}
}

func TestClaimGrantedOnMovedFileOpensAgain(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")

	// An idle descriptor of d/..LOCK is kept after a release (idle.go).
	mustClaim(t, b, dirID("d"), lockmgr.Exclusive).Release(context.Background())
	h := holdExternal(t, file, "", "-x")
	res := claimAsync(context.Background(), b, dirID("d"), lockmgr.Exclusive, "")
	waitingThroughFlock(t, 1) // the claim has the file open and waits on it
	// The rename, as under GuardTree: while the flock is held.
	if err := os.Rename(filepath.Join(src, "d"), filepath.Join(src, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	h.release()
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.lease.Release(context.Background())
	if externalTry(t, file, "-s") {
		t.Fatal("flock -s -n on the new d/..LOCK succeeded while the claim holds d: it holds the moved file")
	}
	if !externalTry(t, filepath.Join(src, "moved", "..LOCK"), "-x") {
		t.Fatal("the moved directory's ..LOCK is held: the claim on d holds it")
	}
}
