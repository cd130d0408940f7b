package gcsbackend_test

import (
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/lockmgr"
)

// TestKeptVersionMatchesObject: the version of a lock object that a host
// keeps as the base of its next write says what the bucket says, through
// a claim, a downgrade, a second host's shared claim beside it, releases
// kept warm, and a claim written on a version that moved since. Kept as the claim's fields while
// the object holds that host's claim alone (the held lock's common case),
// whole while another host's claim is in it.
func TestKeptVersionMatchesObject(t *testing.T) {
	emu := gcstest.Start(t)
	a := newBackend(t, emu, nil)
	b := newBackend(t, emu, nil)
	ctx := ctxT(t, 60*time.Second)
	id := dirLock("k/v")

	check := func(step string, host *gcsbackend.Backend, wantRebuilt bool) {
		t.Helper()
		rebuilt, matches, err := host.KeptVersion(ctx, id)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if !matches {
			t.Fatalf("%s: the kept version differs from the object", step)
		}
		if rebuilt != wantRebuilt {
			t.Fatalf("%s: kept as the claim's fields: %v, want %v", step, rebuilt, wantRebuilt)
		}
	}

	la, err := a.Claim(ctx, id, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	check("exclusive claim", a, true)
	if err := la.Convert(ctx, lockmgr.Shared, false); err != nil {
		t.Fatal(err)
	}
	check("downgrade", a, true)

	lb, err := b.Claim(ctx, id, lockmgr.Shared, false)
	if err != nil {
		t.Fatal(err)
	}
	check("the second host's shared claim", b, false)
	// a's kept version is now behind the bucket (b wrote since): its
	// release writes on a base that moved, reads, and edits again.
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	check("release beside the other host's warm record", b, false)

	la, err = a.Claim(ctx, id, lockmgr.Exclusive, true)
	if err != nil {
		t.Fatal(err)
	}
	check("exclusive claim after the other host let go", a, true)
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	check("warm", a, true)
}
