package etcdbackend_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
	"github.com/lockfs/lockfs/lockmgr"
)

// hold is one grant of a history: the lock, the mode, and an interval
// inside the time the claim was held (taken after Claim returned, ended
// before Release was called; one process, so one clock).
type hold struct {
	host       int
	id         lockmgr.LockID
	mode       lockmgr.Mode
	from, to   time.Time
	token      uint64
	grantOrder int
}

// historyLocks are a parent, its new-dir lock, two children and a
// grandchild: every pair of them is related by the hierarchy.
var historyLocks = []lockmgr.LockID{
	{Path: "p", Kind: lockmgr.KindDir}, {Path: "p", Kind: lockmgr.KindNewDir},
	{Path: "p/c1", Kind: lockmgr.KindDir}, {Path: "p/c2", Kind: lockmgr.KindDir}, {Path: "p/c1/x", Kind: lockmgr.KindDir},
}

// runHistory lets hosts (one client each) take random locks of
// historyLocks in random modes for d, and returns what they held.
func runHistory(t *testing.T, hosts []*etcdbackend.Backend, d time.Duration, seed uint64) []hold {
	var mu sync.Mutex
	var out []hold
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for h, b := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(h)))
			for time.Now().Before(end) {
				id := historyLocks[rng.IntN(len(historyLocks))]
				mode := lockmgr.Shared
				if rng.IntN(2) == 0 {
					mode = lockmgr.Exclusive
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				l, err := b.Claim(ctx, id, mode, true)
				cancel()
				if err != nil {
					t.Errorf("host %d: claim %s %s: %v", h, mode, id, err)
					return
				}
				from := time.Now()
				tok, err := l.NextToken(context.Background())
				if err != nil {
					t.Errorf("host %d: token: %v", h, err)
				}
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				to := time.Now()
				mu.Lock()
				out = append(out, hold{host: h, id: id, mode: mode, from: from, to: to, token: tok, grantOrder: len(out)})
				mu.Unlock()
				if err := l.Release(context.Background()); err != nil {
					t.Errorf("host %d: release: %v", h, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// overlaps returns the pairs of holds of different hosts that conflict by
// the hierarchy's rule and overlap in time.
func overlaps(hs []hold) []string {
	var bad []string
	for i, a := range hs {
		for _, b := range hs[i+1:] {
			if a.host != b.host && a.from.Before(b.to) && b.from.Before(a.to) && conflict(a.id, a.mode, b.id, b.mode) {
				bad = append(bad, fmt.Sprintf("host %d %s %s and host %d %s %s", a.host, a.mode, a.id, b.host, b.mode, b.id))
			}
		}
	}
	return bad
}

// conflict is the hierarchy's rule, written out again for the check: the
// same lock in conflicting modes, or an exclusive directory lock on a
// directory that holds the other's lock.
func conflict(a lockmgr.LockID, am lockmgr.Mode, b lockmgr.LockID, bm lockmgr.Mode) bool {
	under := func(x, d lockmgr.LockID, m lockmgr.Mode) bool {
		return m == lockmgr.Exclusive && d.Kind == lockmgr.KindDir && (x.Path == d.Path || len(x.Path) > len(d.Path) && x.Path[:len(d.Path)+1] == d.Path+"/")
	}
	if a == b {
		return lockmgr.Conflicts(am, bm)
	}
	return under(a, b, bm) || under(b, a, am)
}

// Six hosts (own client, session and lease each) take a parent, its
// new-dir lock, children and a grandchild in random modes for a few
// seconds: no two conflicting holds of different hosts overlap, every
// host is served, and the tokens of one lock's conflicting grants grow in
// the order of the grants. Control: with the ancestor and subtree ranges
// left out of the claim, the same run overlaps.
func TestHierarchyHistorySixHosts(t *testing.T) {
	c := etcdtest.Start(t)
	for _, tc := range []struct {
		name   string
		broken bool
	}{{"protocol", false}, {"control-no-hierarchy", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var hosts []*etcdbackend.Backend
			for range 6 {
				b := newBackend(t, c)
				if tc.broken {
					b.NoHierarchy()
				}
				hosts = append(hosts, b)
			}
			// Rounds of 4 s until every host was served (the control: until
			// an overlap shows), at most ten: a loaded machine serves
			// fewer holds per round.
			served := map[int]int{}
			var hs []hold
			for round := range 10 {
				for _, h := range runHistory(t, hosts, 4*time.Second, uint64(7+round)) {
					hs = append(hs, h)
					served[h.host]++
				}
				if tc.broken && len(overlaps(hs)) > 0 || !tc.broken && len(served) == len(hosts) {
					break
				}
			}
			bad := overlaps(hs)
			if tc.broken {
				if len(bad) == 0 {
					t.Fatalf("control: %d holds without the hierarchy check and no overlap", len(hs))
				}
				t.Logf("control: %d overlaps in %d holds, e.g. %s", len(bad), len(hs), bad[0])
				return
			}
			if len(bad) > 0 {
				t.Fatalf("%d overlapping conflicting holds in %d, e.g. %s", len(bad), len(hs), bad[0])
			}
			for h := range hosts {
				if served[h] == 0 {
					t.Errorf("host %d was never served", h)
				}
			}
			// Tokens: a later conflicting grant of the same lock has a
			// greater token.
			for i, a := range hs {
				for _, b := range hs[i+1:] {
					if a.id == b.id && conflict(a.id, a.mode, b.id, b.mode) && a.to.Before(b.from) && b.token <= a.token {
						t.Errorf("%s: token %d after %d", a.id, b.token, a.token)
					}
				}
			}
			t.Logf("%d holds, per host %v", len(hs), served)
		})
	}
}
