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

// Every write's reply is lost after the write landed: the claim, a refresh
// and the release are each recognised by reading back, with no duplicate
// claim left behind and nothing assumed.
func TestLostRepliesRecognised(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	px, err := faultproxy.New(emu.URL, 5, faultproxy.Faults{LostReply: 1, WritesOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	b := newBackend(t, emu, func(c *gcsbackend.Config) { c.Endpoint = gcstest.Endpoint(px.URL) })
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
	seq := gcsbackend.LeaseSeq(l)
	waitFor(t, "a refresh", func() bool { return gcsbackend.LeaseSeq(l) > seq })
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
	if s.WritesOK != 0 || s.Recognised < 3 {
		t.Errorf("stats %+v: want every write recognised by reading back", s)
	}
}
