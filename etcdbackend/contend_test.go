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
