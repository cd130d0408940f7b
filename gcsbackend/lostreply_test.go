package gcsbackend_test

import (
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/faultproxy"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// Every write's reply is lost after the write landed: the session's
// start, a heartbeat, the claim and the release (the record's drop) are
// each recognised by reading back, with no duplicate record left behind
// and nothing assumed.
func TestLostRepliesRecognised(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	px, err := faultproxy.New(emu.URL, 5, faultproxy.Faults{LostReply: 1, WritesOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	b := newBackend(t, emu, func(c *gcsbackend.Config) { c.Endpoint = gcstest.Endpoint(px.URL); c.WarmFor = -1 })
	other := newBackend(t, emu, nil)
	ctx := ctxT(t, 30*time.Second)
	id := dirLock("lost")
	l, err := b.Claim(ctx, id, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	_, _, holders, err := other.ReadRecord(ctx, other.ObjectName(id))
	if err != nil || len(holders) != 1 {
		t.Fatalf("after a claim whose reply was lost: holders %v, %v; want exactly one", holders, err)
	}
	beats := b.Stats().Refreshes
	waitFor(t, "a heartbeat", func() bool { return b.Stats().Refreshes > beats })
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, holders, _ := other.ReadRecord(ctx, other.ObjectName(id)); len(holders) != 0 {
		t.Fatalf("after a release whose reply was lost: holders %v", holders)
	}
	s := b.Stats()
	t.Logf("%d writes sent, %d landed with an answer, %d ambiguous, %d recognised; proxy %+v",
		s.Writes, s.WritesOK, s.Ambiguous, s.Recognised, px.Stats())
	if s.WritesOK != 0 || s.Recognised < 4 {
		t.Errorf("stats %+v: want every write recognised by reading back", s)
	}
}

// waitFor polls cond in real time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
