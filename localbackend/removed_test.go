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

// rmdir through a mount removes the backing files of a directory nobody
// holds a lock on, each while holding its flock exclusively (fs/rmdir.go).
// A claim that had the removed file open is then granted a flock nobody
// else can find; the backend must notice and open the name again.

// removeHeld simulates that rmdir on the file held by h: unlink while the
// flock is held, then (if dir is set) remove the directory, then release.
func removeHeld(t *testing.T, h *holder, file string, dir bool) {
	t.Helper()
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if dir {
		if err := os.Remove(filepath.Dir(file)); err != nil {
			t.Fatal(err)
		}
	}
	h.release()
}

// TestClaimGrantedOnRemovedFileOpensAgain: the claim must hold the lock on
// the file the name now leads to. In "replaced", another daemon has created
// the backing file anew by the time the claim is granted, so the name leads
// to a file again, another inode: unnamed compares inodes (with the
// comparison left out, that case fails).
func TestClaimGrantedOnRemovedFileOpensAgain(t *testing.T) {
	for _, replaced := range []bool{false, true} {
		name := map[bool]string{false: "removed", true: "replaced"}[replaced]
		t.Run(name, func(t *testing.T) {
			testutil.CheckGoroutines(t)
			src := newSource(t, "d")
			b := newBackend(t, src)
			file := filepath.Join(src, "d", "..LOCK")

			h := holdExternal(t, file, "", "-x")
			res := claimAsync(context.Background(), b, dirID("d"), lockmgr.Exclusive, "")
			waitingThroughFlock(t, 1) // the claim has the file open and waits on it
			if replaced {
				if err := os.Remove(file); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				h.release()
			} else {
				removeHeld(t, h, file, false)
			}
			r := <-res
			if r.err != nil {
				t.Fatal(r.err)
			}
			defer r.lease.Release(context.Background())
			if externalTry(t, file, "-s") {
				t.Fatal("flock -s -n on ..LOCK succeeded while the claim holds the lock: it holds the removed file")
			}
		})
	}
}

func TestClaimGrantedInRemovedDirectoryFails(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")

	h := holdExternal(t, file, "", "-x")
	res := claimAsync(context.Background(), b, dirID("d"), lockmgr.Shared, "")
	waitingThroughFlock(t, 1)
	removeHeld(t, h, file, true)
	r := <-res
	if !errors.Is(r.err, os.ErrNotExist) {
		if r.err == nil {
			r.lease.Release(context.Background())
		}
		t.Fatalf("claim granted on a file of a removed directory: got %v, want an error wrapping os.ErrNotExist", r.err)
	}
}

// An upgrade attempt drops the shared lock for a moment; if an rmdir
// removes the backing file then, the lease is lost.
func TestConvertLosesLeaseToRemoval(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	l := mustClaim(t, b, dirID("d"), lockmgr.Shared)
	defer l.Release(context.Background())

	sharer := holdExternal(t, file, "", "-s") // makes the first attempt fail
	testHookUpgradeGap = func() {
		testHookUpgradeGap = nil
		removeHeld(t, sharer, file, false)
	}
	t.Cleanup(func() { testHookUpgradeGap = nil })

	err := l.Convert(context.Background(), lockmgr.Exclusive, true)
	if !errors.Is(err, lockmgr.ErrLeaseLost) {
		t.Fatalf("upgrade across the removal of the backing file: got %v, want ErrLeaseLost", err)
	}
	if !errors.Is(l.Err(), lockmgr.ErrLeaseLost) {
		t.Fatalf("Err after the loss: %v", l.Err())
	}
}
