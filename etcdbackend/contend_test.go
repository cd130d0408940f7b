package etcdbackend_test

import (
	"context"
	"testing"
	"time"

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
