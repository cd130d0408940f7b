package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
	"github.com/lockfs/lockfs/lockmgr"
)

// A held claim learns within moments that another host waits for it (its
// want key, seen by the holder's watch of wants): Contended closes, and
// the release gives the claim up instead of keeping it warm. Control: it
// stays open while nobody waits, and a waiter for an unrelated lock does
// not close it.
func TestContendedByAnotherHost(t *testing.T) {
	c := etcdtest.Start(t)
	a, b := newBackend(t, c), newBackend(t, c)
	ctx := context.Background()
	la := mustClaim(t, a, dir("p"), lockmgr.Exclusive)
	cl, ok := la.(lockmgr.ContendedLease)
	if !ok {
		t.Fatal("an etcd lease is no ContendedLease")
	}
	ch := cl.Contended()
	lo := mustClaim(t, a, dir("q"), lockmgr.Exclusive)
	wctx, cancel := context.WithCancel(ctx)
	unrelated := make(chan error, 1)
	go func() {
		_, err := b.Claim(wctx, dir("q"), lockmgr.Exclusive, true)
		unrelated <- err
	}()
	select {
	case <-ch:
		t.Fatal("contended while nobody waits for it")
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	<-unrelated
	lo.Release(ctx)

	got := make(chan lockmgr.Lease, 1)
	go func() {
		l, err := b.Claim(ctx, dir("p/x"), lockmgr.Shared, true)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatal("the holder was not told that another host waits")
	}
	drops := a.Stats().Drops
	la.Release(ctx)
	if a.Stats().Drops != drops+1 {
		t.Error("a contended claim was kept warm at release")
	}
	select {
	case l := <-got:
		if l != nil {
			l.Release(ctx)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiter was not granted after the contended release")
	}
}

// A waiter woken by the release of what blocked it claims at once: the
// watch's deletion is applied to its snapshot, so the hand-off costs the
// holder's delete and the waiter's claim transaction, no read between
// the wake and the claim. Control: with the woken claim reading again
// first (the old path), one read per hand-off.
func TestHandoffNoRead(t *testing.T) {
	c := etcdtest.Start(t)
	for _, tc := range []struct {
		name  string
		old   bool
		reads uint64
	}{{"apply-deletes", false, 0}, {"control-read-again", true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			a, b := newBackend(t, c), newBackend(t, c)
			if tc.old {
				b.NoApplyDeletes()
			}
			mustClaim(t, b, dir("s"), lockmgr.Exclusive).Release(ctx) // starts b's session
			la := mustClaim(t, a, dir("x/y"), lockmgr.Exclusive)
			before := b.Stats()
			got := make(chan error, 1)
			go func() {
				l, err := b.Claim(ctx, dir("x/y"), lockmgr.Exclusive, true)
				if err == nil {
					l.Release(ctx)
				}
				got <- err
			}()
			select {
			case <-la.(lockmgr.ContendedLease).Contended():
			case <-time.After(time.Minute):
				t.Fatal("the holder was not told that another host waits")
			}
			la.Release(ctx)
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			after := b.Stats()
			if n := after.Reads - before.Reads; n != tc.reads {
				t.Errorf("a hand-off cost the waiter %d reads, want %d", n, tc.reads)
			}
			if n := after.WantsSent - before.WantsSent; n != 1 {
				t.Errorf("a hand-off cost the waiter %d wants, want 1", n)
			}
			t.Logf("waiter: %d claim transactions, %d reads, %d watches", after.Txns-before.Txns, after.Reads-before.Reads, after.Watches-before.Watches)
		})
	}
}

// A waiter for a directory takes its turn before new claims inside it: a
// claim on D/x, held by host A, is contended once host B waits for D; when
// A gives D/x up, A's claim on D/x again queues behind B's want (without
// wait: refused) while B still waits for host C's claim on D/y; B gets D
// once C releases, and A's waiting claim gets D/x after B. Control: with
// wants per lock only (the old rule), A's claim overtakes B's want.
func TestDirectoryWaiterTurn(t *testing.T) {
	c := etcdtest.Start(t)
	for _, tc := range []struct {
		name    string
		perLock bool
	}{{"dir-wants", false}, {"control-per-lock-wants", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			a, b, cc := newBackend(t, c), newBackend(t, c), newBackend(t, c)
			if tc.perLock {
				a.PerLockWants()
			}
			la := mustClaim(t, a, dir("d/x"), lockmgr.Exclusive)
			lc := mustClaim(t, cc, dir("d/y"), lockmgr.Exclusive)
			gotB := make(chan lockmgr.Lease, 1)
			go func() {
				l, err := b.Claim(ctx, dir("d"), lockmgr.Exclusive, true)
				if err != nil {
					t.Error(err)
				}
				gotB <- l
			}()
			select {
			case <-la.(lockmgr.ContendedLease).Contended():
			case <-time.After(time.Minute):
				t.Fatal("a claim inside d was not told that another host waits for d")
			}
			la.Release(ctx)
			l, err := a.Claim(ctx, dir("d/x"), lockmgr.Exclusive, false)
			if tc.perLock {
				if err != nil {
					t.Fatalf("control: with wants per lock, a's claim of d/x: %v, want granted", err)
				}
				l.Release(ctx)
				lc.Release(ctx)
				if lb := <-gotB; lb != nil {
					lb.Release(ctx)
				}
				return
			}
			if !errors.Is(err, lockmgr.ErrWouldBlock) {
				t.Fatalf("a's claim of d/x while b waits for d: %v, want ErrWouldBlock", err)
			}
			gotA := make(chan lockmgr.Lease, 1)
			go func() {
				l, err := a.Claim(ctx, dir("d/x"), lockmgr.Exclusive, true)
				if err != nil {
					t.Error(err)
				}
				gotA <- l
			}()
			lc.Release(ctx)
			var lb lockmgr.Lease
			select {
			case lb = <-gotB:
			case l := <-gotA:
				t.Fatalf("a got d/x before b got d (lease %v)", l)
			case <-time.After(time.Minute):
				t.Fatal("b did not get d after c released d/y")
			}
			if lb == nil {
				t.FailNow()
			}
			select {
			case l := <-gotA:
				t.Fatalf("a got d/x while b holds d (lease %v)", l)
			case <-time.After(200 * time.Millisecond):
			}
			lb.Release(ctx)
			select {
			case l := <-gotA:
				if l != nil {
					l.Release(ctx)
				}
			case <-time.After(time.Minute):
				t.Fatal("a did not get d/x after b released d")
			}
		})
	}
}

// A want whose waiter waits for no claim (it is about to claim, or has
// stopped waiting and not yet deleted its want) refuses no claim without
// wait: an idle want for d/.lock lets host A claim d/x without wait; and
// a want inside a directory never holds back an exclusive claim of the
// directory, with wait or without. Controls: once host C holds d/y, the
// same want waits for a claim and A's claim of d/x is refused (the
// directory waiter's turn); and under the reverted rule (WholeTreeWants),
// the idle wants refuse both claims, as the root's claim was refused in
// TestLockProtocolMatchModel.
func TestIdleWantRefusesNothing(t *testing.T) {
	c := etcdtest.Start(t)
	for _, tc := range []struct {
		name      string
		wholeTree bool
	}{{"idle-wants", false}, {"control-whole-tree-wants", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			a := newBackend(t, c)
			if tc.wholeTree {
				a.WholeTreeWants()
			}
			// The idle waiter: a session of its own, whose wants no
			// acquisition of lockfs deletes.
			cli := c.Client(t)
			g, err := cli.Grant(ctx, 60)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cli.Revoke(context.Background(), g.ID) })
			pfx := "test/" + t.Name() + "/wants/"
			rec := `{"v":1,"host":"idle","mode":"exclusive","since":"2026-12-03T17:00:00Z"}`
			for _, k := range []string{"d/.lock/", "e/x/.lock/"} {
				if _, err := cli.Put(ctx, pfx+k+fmt.Sprintf("%x", int64(g.ID)), rec, clientv3.WithLease(g.ID)); err != nil {
					t.Fatal(err)
				}
			}
			claim := func(id lockmgr.LockID, wait bool) error {
				wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				l, err := a.Claim(wctx, id, lockmgr.Exclusive, wait)
				if err == nil {
					l.Release(ctx)
				}
				return err
			}
			if tc.wholeTree {
				if err := claim(dir("e"), false); !errors.Is(err, lockmgr.ErrWouldBlock) {
					t.Errorf("control: under the reverted rule, e without wait past an idle want for e/x: %v, want ErrWouldBlock", err)
				}
				if err := claim(dir("d/x"), false); !errors.Is(err, lockmgr.ErrWouldBlock) {
					t.Errorf("control: under the reverted rule, d/x without wait past an idle want for d: %v, want ErrWouldBlock", err)
				}
				return
			}
			if err := claim(dir("d/x"), false); err != nil {
				t.Errorf("d/x without wait past an idle want for d: %v, want granted", err)
			}
			if err := claim(dir("e"), false); err != nil {
				t.Errorf("e without wait past an idle want for e/x: %v, want granted", err)
			}
			if err := claim(dir("e"), true); err != nil {
				t.Errorf("e with wait past an idle want for e/x: %v, want granted", err)
			}
			other := newBackend(t, c)
			lc := mustClaim(t, other, dir("d/y"), lockmgr.Exclusive)
			defer lc.Release(ctx)
			if err := claim(dir("d/x"), false); !errors.Is(err, lockmgr.ErrWouldBlock) {
				t.Errorf("control: d/x without wait while the want for d waits for d/y: %v, want ErrWouldBlock", err)
			}
		})
	}
}

// A claim without wait gives the holders of claims that block it the
// whole NoWaitGrace (2 s here) to drop them, not only until the first
// drop: host B keeps d/x1 warm and holds d/x0; once B sees A's want it
// drops d/x1 at once and releases d/x0 200 ms later (contended, so
// dropped), and A's exclusive claim of d without wait is granted. Control:
// B keeps holding d/x0, and A's claim is refused when the grace ends.
func TestNoWaitGraceOutlastsFirstDrop(t *testing.T) {
	c := etcdtest.Start(t)
	for _, tc := range []struct {
		name string
		keep bool
	}{{"drops-one-by-one", false}, {"control-one-kept", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			grace := func(cfg *etcdbackend.Config) { cfg.NoWaitGrace = 2 * time.Second }
			a, b := newBackend(t, c, grace), newBackend(t, c, grace)
			held := mustClaim(t, b, dir("d/x0"), lockmgr.Exclusive)
			defer held.Release(ctx)
			mustClaim(t, b, dir("d/x1"), lockmgr.Exclusive).Release(ctx)
			go func() {
				select {
				case <-held.(lockmgr.ContendedLease).Contended():
				case <-time.After(time.Minute):
					t.Error("B was not told that A waits")
					return
				}
				if !tc.keep {
					time.Sleep(200 * time.Millisecond)
					held.Release(ctx)
				}
			}()
			l, err := a.Claim(ctx, dir("d"), lockmgr.Exclusive, false)
			if tc.keep {
				if !errors.Is(err, lockmgr.ErrWouldBlock) {
					t.Fatalf("control: d without wait while B keeps d/x0: %v, want ErrWouldBlock", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("d without wait while B drops d/x1 at once and d/x0 200 ms later: %v, want granted", err)
			}
			l.Release(ctx)
		})
	}
}
