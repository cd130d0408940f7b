package control

import (
	"testing"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

// TestRefusalLimiter: one line per lock per window, the next one counting
// those left out; other locks are not held back by a busy one.
func TestRefusalLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	r := newRefusalLimiter(func() time.Time { return now })
	a, b := lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}, lockmgr.LockID{Path: "b", Kind: lockmgr.KindDir}
	if ok, n := r.allow(a); !ok || n != 0 {
		t.Fatalf("first refusal of a: %v %d", ok, n)
	}
	for i := 0; i < 7; i++ {
		now = now.Add(500 * time.Millisecond)
		if ok, _ := r.allow(a); ok {
			t.Fatalf("refusal %d of a within the window was let through", i+2)
		}
	}
	if ok, _ := r.allow(b); !ok {
		t.Fatal("b held back by a's refusals")
	}
	now = now.Add(refusalWindow)
	if ok, n := r.allow(a); !ok || n != 7 {
		t.Fatalf("after the window: %v, suppressed %d, want 7", ok, n)
	}
	now = now.Add(refusalWindow)
	if ok, n := r.allow(a); !ok || n != 0 {
		t.Fatalf("a quiet window later: %v, suppressed %d, want 0", ok, n)
	}
}
