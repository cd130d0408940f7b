package gcsbackend_test

import (
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// Request counts, measured: what an uncontended claim and a release cost,
// that a hand-off between two local processes costs nothing while the lease
// is held, and how many writes a held lease makes per TTL.
func TestRequestCounts(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	b := newBackend(t, emu, nil)
	ctx := ctxT(t, 60*time.Second)
	id := dirLock("counts")

	s0 := b.Stats()
	l, err := b.Claim(ctx, id, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	first := b.Stats().Sub(s0)
	s1 := b.Stats()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rel := b.Stats().Sub(s1)
	s2 := b.Stats()
	l, err = b.Claim(ctx, id, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	again := b.Stats().Sub(s2)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("claim of a new lock object: %d reads, %d writes", first.Reads, first.Writes)
	t.Logf("claim of an existing lock object: %d reads, %d writes", again.Reads, again.Writes)
	t.Logf("release: %d reads, %d writes", rel.Reads, rel.Writes)
	if first.Writes != 1 || again.Writes != 1 || rel.Writes != 1 || rel.Reads != 0 || again.Reads != 1 {
		t.Errorf("claim costs %+v / %+v, release %+v; want 1 read + 1 write, and 1 write", first, again, rel)
	}

	// Through the engine: a lock two levels down is three claims; a
	// hand-off between two local processes makes no request.
	e := newEngine(t, b, nil)
	s3 := b.Stats()
	if _, err := e.Acquire(ctx, request("x/y", lockmgr.Exclusive, 1, false)); err != nil {
		t.Fatal(err)
	}
	acq := b.Stats().Sub(s3)
	t.Logf("engine acquire of x/y (claims on ., x, x/y): %d reads, %d writes", acq.Reads, acq.Writes)
	done := make(chan error, 1)
	go func() {
		_, err := e.Acquire(ctx, request("x/y", lockmgr.Exclusive, 2, true))
		done <- err
	}()
	expectBlocked(t, done, 200*time.Millisecond)
	s4 := b.Stats()
	if err := e.Release(ctx, dirLock("x/y"), ownerOf(1)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	hand := b.Stats().Sub(s4)
	t.Logf("hand-off between two local processes: %d requests", hand.Requests())
	if hand.Requests() > hand.Refreshes {
		t.Errorf("hand-off made %d requests besides refreshes", hand.Requests()-hand.Refreshes)
	}
	s5 := b.Stats()
	if err := e.Release(ctx, dirLock("x/y"), ownerOf(2)); err != nil {
		t.Fatal(err)
	}
	relE := b.Stats().Sub(s5)
	t.Logf("engine release of x/y: %d reads, %d writes", relE.Reads, relE.Writes)
}

// A held lease refreshes about three times per TTL, with writes only.
func TestRefreshesPerTTL(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	const ttl = 900 * time.Millisecond
	b := newBackend(t, emu, func(c *gcsbackend.Config) { c.TTL = ttl })
	ctx := ctxT(t, 30*time.Second)
	l, err := b.Claim(ctx, dirLock("r"), lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	s0 := b.Stats()
	const ttls = 4
	time.Sleep(ttls * ttl)
	d := b.Stats().Sub(s0)
	per := float64(d.Writes) / ttls
	t.Logf("held for %d TTLs: %d writes, %d reads: %.2f refresh writes per TTL (a %v TTL)", ttls, d.Writes, d.Reads, per, ttl)
	if per < 2.2 || per > 3.6 || d.Reads != 0 {
		t.Errorf("%.2f writes and %d reads per TTL; want about 3 writes and no read", per, d.Reads)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
}
