package lockmgr

import (
	"context"
	"errors"
	"testing"

	"github.com/lockfs/lockfs/internal/testutil"
)

// memHierBackend is a memBackend that says it checks the hierarchy itself
// (HierarchicalBackend), as the gcs backend does.
type memHierBackend struct{ memBackend }

func (*memHierBackend) ClaimsHierarchy() bool { return true }

// claimedIDs lists the locks that have a live claim in host.
func claimedIDs(host *memHost) map[LockID]Mode {
	host.mu.Lock()
	defer host.mu.Unlock()
	out := map[LockID]Mode{}
	for id, ls := range host.locks {
		for _, m := range ls {
			out[id] = maxMode(out[id], m)
		}
	}
	return out
}

// TestHierarchicalBackendClaimsOnlyTheLock: over a HierarchicalBackend an
// acquire at depth 3 makes one claim (the lock's own), the implicit holds
// still exclude other processes of the host, and a lock held both
// explicitly and implicitly keeps a lease of its explicit mode only. The
// control is the same run over a backend that does not check the hierarchy:
// one claim per ancestor, as before.
func TestHierarchicalBackendClaimsOnlyTheLock(t *testing.T) {
	for _, hier := range []bool{true, false} {
		tree, host := newFakeTree(), newMemHost()
		tree.add(100, 1)
		tree.add(200, 1)
		var b Backend = &memBackend{host: host}
		if hier {
			b = &memHierBackend{memBackend{host: host}}
		}
		e, err := New(Config{Backend: b, Processes: tree})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		abc := LockID{Path: "a/b/c", Kind: KindDir}
		a := LockID{Path: "a", Kind: KindDir}
		o1, o2 := Owner{OwnerFile, 1}, Owner{OwnerFile, 2}
		if _, err := e.Acquire(ctx, Request{Lock: abc, Mode: Exclusive, Owner: o1, TID: 100}); err != nil {
			t.Fatal(err)
		}
		claims := claimedIDs(host)
		if hier {
			if len(claims) != 1 || claims[abc] != Exclusive || host.claims != 1 {
				t.Fatalf("hierarchical: claims %v after %d Claim calls, want only a/b/c exclusive after 1", claims, host.claims)
			}
		} else if len(claims) != 4 || claims[a] != Shared || host.claims != 4 {
			t.Fatalf("control: claims %v after %d Claim calls, want root, a, a/b, a/b/c", claims, host.claims)
		}
		// The implicit shared hold on a still excludes another process.
		if _, err := e.Acquire(ctx, Request{Lock: a, Mode: Exclusive, Owner: o2, TID: 200}); !errors.Is(err, ErrWouldBlock) {
			t.Fatalf("hier=%v: exclusive a under a held a/b/c: %v, want ErrWouldBlock", hier, err)
		}
		// A shared explicit hold on a beside the implicit one: the lease
		// of a is shared in both cases.
		if _, err := e.Acquire(ctx, Request{Lock: a, Mode: Shared, Owner: o2, TID: 200}); err != nil {
			t.Fatal(err)
		}
		if m := claimedIDs(host)[a]; m != Shared {
			t.Fatalf("hier=%v: claim on a is %v, want shared", hier, m)
		}
		if err := e.Release(ctx, a, o2); err != nil {
			t.Fatal(err)
		}
		if _, ok := claimedIDs(host)[a]; ok == hier {
			t.Fatalf("hier=%v: after the explicit hold on a went, a claimed: %v", hier, ok)
		}
		if err := e.Release(ctx, abc, o1); err != nil {
			t.Fatal(err)
		}
		if claims := claimedIDs(host); len(claims) != 0 {
			t.Fatalf("hier=%v: claims left after release: %v", hier, claims)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNoLeaseKeptForABlockedHeadOverHierarchicalBackend: over a
// HierarchicalBackend implicit holds need no lease, so a lock whose only
// holds are implicit needs none. Process 100 asks for x exclusive; while
// its claim is held at the gate, process 200 takes x/d shared, which
// holds x shared implicitly. The claim lands and 100's request waits
// behind that implicit hold. The lease must not be kept for 100 as the
// queue's head "about to be granted": it would keep other hosts out of x
// and all below it while 200 (which may wait for one of them) holds on.
// TestPorcupineHierarchyFourHosts timed out this way (host3 holding h
// exclusive for a queued request, behind a local request's implicit h
// hold that waited for host2). Control: with the hand-over rule
// unchanged, x stays claimed exclusive.
func TestNoLeaseKeptForABlockedHeadOverHierarchicalBackend(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(200, 1)
	e, err := New(Config{Backend: &memHierBackend{memBackend{host: host}}, Processes: tree})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ctx := context.Background()
	x := LockID{Path: "x", Kind: KindDir}
	xd := LockID{Path: "x/d", Kind: KindDir}
	p, r := Owner{OwnerFile, 1}, Owner{OwnerFile, 2}
	gate, up := acquireAtGate(t, e, host, &host.claimGate,
		Request{Lock: x, Mode: Exclusive, Owner: p, TID: 100, Wait: true})
	// 200's claim of x/d must not wait at the gate.
	host.mu.Lock()
	host.claimGate = nil
	host.mu.Unlock()
	if _, err := e.Acquire(ctx, Request{Lock: xd, Mode: Shared, Owner: r, TID: 200, Wait: true}); err != nil {
		t.Fatal(err)
	}
	close(gate)
	eventuallyLock(t, e, x, "100's request queued behind 200's implicit hold", func(ls *lockState) bool {
		return ls != nil && ls.head != nil && ls.head.rc.req.TID == 100 && !ls.busy
	})
	testutil.Eventually(t, "x given back while 100 waits", func() bool {
		return claimedIDs(host)[x] == 0
	})
	if err := e.Release(ctx, xd, r); err != nil {
		t.Fatal(err)
	}
	if err := <-up; err != nil {
		t.Fatalf("100's exclusive request after 200's release: %v", err)
	}
	if m := claimedIDs(host)[x]; m != Exclusive {
		t.Fatalf("x granted exclusive with a claim of mode %v", m)
	}
}
