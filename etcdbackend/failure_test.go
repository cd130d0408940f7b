package etcdbackend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// A crashed host's claims stay until the server expires its session's
// lease, TTL + lock-delay after its last keep-alive, then another host gets
// them: never before the lease's remaining time, asked of the server right
// after the crash. Control, from the server rather than the clock: the
// session lease is granted for TTL + lock-delay, and for TTL alone with
// the lock-delay off. The takeover's wait has a generous bound (a loaded
// machine delays it; it is a bench figure, not a test).
func TestCrashTakeover(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.Client(t)
	for _, tc := range []struct {
		name  string
		delay time.Duration // the config's
		want  time.Duration // the lease's granted TTL
	}{{"lock-delay", 0, 2 * testTTL}, {"no-lock-delay", -1, testTTL}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			a := newBackend(t, c, func(cfg *etcdbackend.Config) { cfg.LockDelay = tc.delay })
			b := newBackend(t, c)
			mustClaim(t, a, dir("x"), lockmgr.Exclusive)
			id := clientv3.LeaseID(a.SessionLease())
			a.Crash()
			asked := time.Now()
			ttl, err := cli.TimeToLive(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(ttl.GrantedTTL) * time.Second; got != tc.want {
				t.Fatalf("session lease granted for %v, want %v (TTL %v, lock-delay %v)", got, tc.want, testTTL, tc.delay)
			}
			// The server answered at or after asked, with the remaining
			// time rounded down: the lease cannot expire before asked+left.
			left := time.Duration(ttl.TTL) * time.Second
			mustRefuse(t, b, dir("x"), lockmgr.Exclusive)
			wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			l, err := b.Claim(wctx, dir("x"), lockmgr.Exclusive, true)
			if err != nil {
				t.Fatalf("takeover: %v", err)
			}
			took := time.Since(asked)
			l.Release(ctx)
			t.Logf("taken over %v after the crash (lease granted %v, %v left at the crash)", took, tc.want, left)
			if took < left {
				t.Fatalf("taken over %v after the crash, before the session lease could have expired (%v left)", took, left)
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
	t.Logf("claim without quorum answered after %v", time.Since(start).Round(time.Millisecond))
	select {
	case <-la.Done():
		if !errors.Is(la.Err(), lockmgr.ErrLeaseLost) {
			t.Fatalf("lost lease: Err %v", la.Err())
		}
	case <-time.After(time.Minute):
		t.Fatal("the held lease was not lost a minute after the quorum")
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
