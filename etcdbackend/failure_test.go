package etcdbackend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// A crashed host's claims stay until the server expires its session's
// lease, TTL + lock-delay after its last keep-alive, then another host gets
// them. Control: refused while the lease lives; with the lock-delay off,
// the takeover comes a lock-delay sooner.
func TestCrashTakeover(t *testing.T) {
	c := etcdtest.Start(t)
	for _, tc := range []struct {
		name  string
		delay time.Duration // the config's; the expected extra wait
		extra time.Duration
	}{{"lock-delay", 0, testTTL}, {"no-lock-delay", -1, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			a := newBackend(t, c, func(cfg *etcdbackend.Config) { cfg.LockDelay = tc.delay })
			b := newBackend(t, c)
			mustClaim(t, a, dir("x"), lockmgr.Exclusive)
			a.Crash()
			crashed := time.Now()
			mustRefuse(t, b, dir("x"), lockmgr.Exclusive)
			ctx, cancel := context.WithTimeout(context.Background(), 4*testTTL)
			defer cancel()
			l, err := b.Claim(ctx, dir("x"), lockmgr.Exclusive, true)
			if err != nil {
				t.Fatalf("takeover: %v", err)
			}
			l.Release(context.Background())
			took := time.Since(crashed)
			t.Logf("taken over %v after the crash (TTL %v, lock-delay %v)", took, testTTL, tc.extra)
			// The last keep-alive was at most RefreshInterval (TTL/3)
			// before the crash.
			if least := testTTL + tc.extra - testTTL/3 - time.Second/2; took < least {
				t.Fatalf("taken over %v after the crash, before TTL + lock-delay could have passed (%v)", took, least)
			}
			if most := testTTL + tc.extra + 3*time.Second; took > most {
				t.Errorf("taken over %v after the crash, later than %v", took, most)
			}
		})
	}
}

// In a three-member cluster: a paused follower and the leader's death
// change nothing; the loss
// of quorum makes claims fail with ErrUnavailable within their bound and
// loses held leases once the session can no longer be vouched for; once
// the members are back, claims work again with a new session.
func TestClusterFaults(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	a := newBackend(t, c)
	b := newBackend(t, c)
	ctx := context.Background()
	la := mustClaim(t, a, dir("x"), lockmgr.Exclusive)

	leader := c.Leader(t)
	if leader < 0 {
		t.Fatal("no leader")
	}
	// A paused follower changes nothing once the client stops sending to
	// it (its keep-alive pings go unanswered): claims go on with the
	// quorum of the other two, a's lease is kept, and a conflict is still
	// refused. Until then a request sent to it times out (RequestTimeout)
	// and is retried, so a call may take longer, within its bound.
	follower := c.Members[(leader+1)%3]
	if err := follower.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	testutil.EventuallyWithin(t, 30*time.Second, "claims as usual while a follower is paused", func() bool {
		l, err := b.Claim(ctx, dir("w"), lockmgr.Exclusive, false)
		if err != nil {
			return false
		}
		l.Release(ctx)
		_, err = b.Claim(ctx, dir("x"), lockmgr.Exclusive, false)
		return errors.Is(err, lockmgr.ErrWouldBlock)
	})
	t.Logf("claims as usual %v after a follower was paused", time.Since(paused).Round(time.Millisecond))
	if err := la.Err(); err != nil {
		t.Fatalf("a's lease lost while a follower was paused: %v", err)
	}
	if err := follower.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.Members[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, 30*time.Second, "a claim after the leader's death", func() bool {
		l, err := b.Claim(ctx, dir("y"), lockmgr.Exclusive, false)
		if err == nil {
			l.Release(ctx)
		}
		return err == nil
	})
	mustRefuse(t, b, dir("x"), lockmgr.Exclusive)
	if err := la.Err(); err != nil {
		t.Fatalf("a's lease lost with the leader's death: %v", err)
	}

	// Lose the quorum.
	var killed []*etcdtest.Member
	for _, m := range c.Members {
		if m.Running() && len(killed) == 0 {
			m.Kill()
			killed = append(killed, m)
		}
	}
	killed = append(killed, c.Members[leader])
	start := time.Now()
	_, err := b.Claim(ctx, dir("z"), lockmgr.Exclusive, false)
	if !errors.Is(err, lockmgr.ErrUnavailable) {
		t.Fatalf("claim without quorum: %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("claim without quorum answered after %v", took)
	}
	select {
	case <-la.Done():
		if !errors.Is(la.Err(), lockmgr.ErrLeaseLost) {
			t.Fatalf("lost lease: Err %v", la.Err())
		}
	case <-time.After(3 * testTTL):
		t.Fatal("the held lease was not lost without quorum")
	}

	for _, m := range killed {
		if err := m.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	var la2 lockmgr.Lease
	testutil.EventuallyWithin(t, 30*time.Second, "a claim once quorum is back", func() bool {
		l, err := a.Claim(ctx, dir("x"), lockmgr.Exclusive, false)
		la2 = l
		return err == nil
	})
	mustRefuse(t, b, dir("x"), lockmgr.Shared)
	la2.Release(ctx)
	if s := a.Stats(); s.Sessions < 2 {
		t.Fatalf("no new session after the loss: %+v", s)
	}
}
