package gcsbackend_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/faultproxy"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// Two hosts, each behind a fault proxy injecting 5% 429, 5% 503, 1%
// connection resets, 1% lost replies (the write lands, the reply does
// not) and up to 30ms of latency on a fifth of the requests, contend for f
// and f/g for a bounded time. No two conflicting holds ever overlap, on f
// or (through the hierarchy) between f and f/g, and fencing tokens grow.
// The proxies' counts prove the faults happened; the control that the
// checker can fail is the wall-clock expiry case of
// TestClockOffsetChangesNothing, which uses the same checker.
func TestFaultInjection(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	faults := faultproxy.Faults{RateLimited: 0.05, Unavailable: 0.05, Reset: 0.01, LostReply: 0.01,
		LatencyRate: 0.2, Latency: 30 * time.Millisecond}
	var engines []*lockmgr.Engine
	var backends []*gcsbackend.Backend
	var proxies []*faultproxy.Proxy
	var losses atomic.Int64
	for i := range 2 {
		px, err := faultproxy.New(emu.URL, int64(11+i), faults)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		b := newBackend(t, emu, func(c *gcsbackend.Config) { c.Endpoint = gcstest.Endpoint(px.URL) })
		engines = append(engines, newEngine(t, b, func(h lockmgr.LostHold) {
			losses.Add(1)
			t.Logf("lost %s: %v", h.Lock, h.Err)
		}))
		backends, proxies = append(backends, b), append(proxies, px)
	}

	var csF, csG critical
	var grants, deadlocks, unavailable atomic.Int64
	stop := time.Now().Add(12 * time.Second)
	var wg sync.WaitGroup
	for c := 0; c < 6; c++ {
		e := engines[c%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 99))
			for time.Now().Before(stop) {
				p := "f"
				if rng.IntN(3) == 0 {
					p = "f/g"
				}
				mode := lockmgr.Exclusive
				if rng.IntN(3) == 0 {
					mode = lockmgr.Shared
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				g, err := e.Acquire(ctx, request(p, mode, 200+c, true))
				cancel()
				switch {
				case errors.Is(err, lockmgr.ErrDeadlock):
					deadlocks.Add(1)
					time.Sleep(time.Duration(50+rng.IntN(100)) * time.Millisecond)
					continue
				case errors.Is(err, lockmgr.ErrUnavailable):
					unavailable.Add(1)
					continue
				case err != nil:
					t.Errorf("client %d: %v", c, err)
					return
				}
				grants.Add(1)
				who := fmt.Sprintf("client %d on %s", c, p)
				if p == "f" {
					csF.enter(who, mode, g.Token)
				} else {
					csF.enter(who, lockmgr.Shared, 0)
					csG.enter(who, mode, g.Token)
				}
				time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
				if p == "f" {
					csF.exit(mode)
				} else {
					csG.exit(mode)
					csF.exit(lockmgr.Shared)
				}
				if err := e.Release(context.Background(), dirLock(p), ownerOf(200+c)); err != nil {
					t.Errorf("client %d: release: %v", c, err)
					return
				}
				time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	csF.check(t)
	csG.check(t)
	for i, px := range proxies {
		ps, bs := px.Stats(), backends[i].Stats()
		t.Logf("host %d proxy: %+v", i, ps)
		t.Logf("host %d backend: %d reads, %d writes (%d ok, %d 412, %d 429, %d 5xx, %d no answer), %d ambiguous writes, %d recognised",
			i, bs.Reads, bs.Writes, bs.WritesOK, bs.PreconditionFailed, bs.RateLimited, bs.ServerErrors, bs.NetworkErrors, bs.Ambiguous, bs.Recognised)
		if ps.RateLimited == 0 || ps.Unavailable == 0 || ps.Resets == 0 || ps.LostReplies == 0 {
			t.Errorf("host %d: not every fault was injected: %+v", i, ps)
		}
	}
	t.Logf("%d grants (%d on f, %d on f/g), %d upgrade deadlocks broken, %d unavailable, %d holds lost",
		grants.Load(), csF.entries-csG.entries, csG.entries, deadlocks.Load(), unavailable.Load(), losses.Load())
	if grants.Load() < 20 {
		t.Errorf("only %d grants: the hosts made no progress", grants.Load())
	}
}
