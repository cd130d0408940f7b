package gcsbackend_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// Two hosts, each an engine over its own backend, on one bucket: the
// hierarchy holds across hosts both ways, because every implicit ancestor
// hold is a claim on the ancestor's lock.
func TestEnginesAcrossHosts(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	ea := newEngine(t, newBackend(t, emu, nil), nil)
	eb := newEngine(t, newBackend(t, emu, nil), nil)
	ctx := ctxT(t, 60*time.Second)

	// Host A works in a/b (shared on "." and "a" implicitly).
	if _, err := ea.Acquire(ctx, request("a/b", lockmgr.Exclusive, 1, false)); err != nil {
		t.Fatal(err)
	}
	// B: exclusive on a waits for A's implicit hold; shared on a does not;
	// exclusive on a/b conflicts; a sibling is free (the control).
	if _, err := eb.Acquire(ctx, request("a", lockmgr.Exclusive, 2, false)); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("B exclusive on a while A holds a/b: %v", err)
	}
	if _, err := eb.Acquire(ctx, request("a/b", lockmgr.Shared, 3, false)); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("B shared on a/b while A holds it exclusively: %v", err)
	}
	if _, err := eb.Acquire(ctx, request("a/c", lockmgr.Exclusive, 4, false)); err != nil {
		t.Fatalf("B on the sibling a/c: %v", err)
	}
	if _, err := eb.Acquire(ctx, request("a", lockmgr.Shared, 5, false)); err != nil {
		t.Fatalf("B shared on a: %v", err)
	}
	// A blocking exclusive on a is granted once every hold below a is gone
	// on both hosts.
	done := make(chan error, 1)
	go func() {
		_, err := eb.Acquire(ctx, request("a", lockmgr.Exclusive, 6, true))
		done <- err
	}()
	expectBlocked(t, done, 500*time.Millisecond)
	for _, r := range []struct {
		e    *lockmgr.Engine
		path string
		c    int
	}{{eb, "a/c", 4}, {eb, "a", 5}} {
		if err := r.e.Release(ctx, dirLock(r.path), ownerOf(r.c)); err != nil {
			t.Fatal(err)
		}
	}
	expectBlocked(t, done, 300*time.Millisecond) // A still holds a/b
	if err := ea.Release(ctx, dirLock("a/b"), ownerOf(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("B's exclusive on a not granted after A released a/b")
	}
	// The other way: B holds a exclusively, so A can take nothing in a's
	// subtree; the root, which B holds shared implicitly, A can share.
	for _, p := range []string{"a", "a/b", "a/b/c"} {
		if _, err := ea.Acquire(ctx, request(p, lockmgr.Shared, 7, false)); !errors.Is(err, lockmgr.ErrWouldBlock) {
			t.Fatalf("A shared on %s while B holds a exclusively: %v", p, err)
		}
	}
	if _, err := ea.Acquire(ctx, request(".", lockmgr.Shared, 8, false)); err != nil {
		t.Fatalf("A shared on the root: %v", err)
	}
	if _, err := ea.Acquire(ctx, request("z", lockmgr.Exclusive, 9, false)); err != nil {
		t.Fatalf("A on z: %v", err)
	}
	if _, err := ea.Acquire(ctx, request(".", lockmgr.Exclusive, 10, false)); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("A exclusive on the root while B works below: %v", err)
	}
}

func ownerOf(c int) lockmgr.Owner { return lockmgr.Owner{Class: lockmgr.OwnerFile, ID: uint64(c)} }

// expectBlocked fails if done delivers within d.
func expectBlocked(t *testing.T, done <-chan error, d time.Duration) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("granted (or failed: %v) while it should wait", err)
	case <-time.After(d):
	}
}
