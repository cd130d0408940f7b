package lockmgr

import (
	"context"
	"errors"
	"testing"
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
