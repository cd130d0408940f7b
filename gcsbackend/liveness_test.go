package gcsbackend_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/lockmgr"
)

// Two hosts keep a lock warm in shared mode, then both claim it
// exclusively at once: each sees the other's shared record, asks for it,
// and gives its own back while it waits (it was asked for). One is
// granted, releases, and the other is granted after it. Every record must
// stay known to its host through this: a host that forgot the record it
// wrote after giving an earlier one back could not drop it when asked, and
// a third host would wait for it for as long as the session lives. This
// strands the third host before the fix (the record given back was
// forgotten by the claim that went on to write a new one).
func TestRecordGivenBackWhileWaitingStaysKnown(t *testing.T) {
	emu := gcstest.Start(t)
	a, b, c := newBackend(t, emu, nil), newBackend(t, emu, nil), newBackend(t, emu, nil)
	id := dirLock("d")
	ctx := ctxT(t, 90*time.Second)
	for _, h := range []interface {
		Claim(context.Context, lockmgr.LockID, lockmgr.Mode, bool) (lockmgr.Lease, error)
	}{a, b} {
		l, err := h.Claim(ctx, id, lockmgr.Shared, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil { // kept warm
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for _, h := range []interface {
		Claim(context.Context, lockmgr.LockID, lockmgr.Mode, bool) (lockmgr.Lease, error)
	}{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			l, err := h.Claim(wctx, id, lockmgr.Exclusive, true)
			if err != nil {
				t.Errorf("exclusive claim after a shared warm record: %v", err)
				return
			}
			time.Sleep(50 * time.Millisecond)
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// Both records are warm now (or dropped): a third host asks for them
	// and must be served within a few want polls.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	l, err := c.Claim(wctx, id, lockmgr.Exclusive, true)
	if err != nil {
		for _, h := range []interface {
			ReadRecord(context.Context, string) (int64, uint64, []string, error)
		}{a} {
			_, _, holders, _ := h.ReadRecord(ctx, a.ObjectName(id))
			t.Logf("records in the object: %v", holders)
		}
		t.Fatalf("a third host's waiter is stranded by a record its host no longer knows: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A record that a write of unknown outcome left in the bucket after the
// drop that followed it found nothing is dropped when another host asks
// for it: its host keeps such a record known, reads the object a want
// names and drops its record there. Before, the drop forgot the record
// and every other host's claim waited for it until the session ended
// (this test then fails: the non-blocking claim gets ErrWouldBlock). The
// read before the claim is the control that the record is there.
func TestUnknownRecordIsDroppedWhenAsked(t *testing.T) {
	emu := gcstest.Start(t)
	a, c := newBackend(t, emu, nil), newBackend(t, emu, nil)
	id := dirLock("d")
	ctx := ctxT(t, 60*time.Second)
	keepWarm(ctx, t, a, id)
	if !a.LoseTrackOfRecord(id) {
		t.Fatal("no warm record to forget")
	}
	if _, _, holders, err := a.ReadRecord(ctx, a.ObjectName(id)); err != nil || len(holders) != 1 {
		t.Fatalf("the forgotten record is not in the object: %v, %v", holders, err)
	}
	// A non-blocking claim asks and gives holders about one want poll:
	// enough for a record its host still knows.
	claimPast(ctx, t, c, a, id, false, "a record its host lost track of blocks another host's claim")
}

// The want path costs reads, not listings: a host that holds a record and
// keeps another warm, and that nobody asks anything of, reads its bell once
// per want poll and lists nothing (control: the poll of before bells lists
// at every poll). A host without records sends nothing at all. When another
// host's waiter asks for the held record, the holder's lease reports
// itself contended within a few polls, and the waiter is served at its
// release.
func TestWantPathCost(t *testing.T) {
	emu := gcstest.Start(t)
	a := newBackend(t, emu, func(c *gcsbackend.Config) { c.WantPoll = 100 * time.Millisecond })
	c := newBackend(t, emu, nil)
	ctx := ctxT(t, 60*time.Second)
	held, err := a.Claim(ctx, dirLock("held"), lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	keepWarm(ctx, t, a, dirLock("warm"))
	over := func(b *gcsbackend.Backend, d time.Duration) gcsbackend.Stats {
		before := b.Stats()
		time.Sleep(d)
		return b.Stats().Sub(before)
	}
	if d := over(a, 3*time.Second); d.Lists != 0 || d.Reads < 10 {
		t.Errorf("a held and a warm record, nothing wanted, 3 s at a 100 ms want poll: %d listings, %d reads; want 0 listings and about 30 reads of the bell", d.Lists, d.Reads)
	} else {
		t.Logf("nothing wanted, 3 s: %d listings, %d reads, %d writes (heartbeats %d)", d.Lists, d.Reads, d.Writes, d.Refreshes)
	}
	a.SetPollWants(true)
	if d := over(a, 3*time.Second); d.Lists < 10 {
		t.Errorf("control: the poll of before bells made %d listings in 3 s at a 100 ms want poll, want about 30", d.Lists)
	}
	a.SetPollWants(false)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held, err = a.Claim(ctx, dirLock("held"), lockmgr.Exclusive, false) // its warm record again
	if err != nil {
		t.Fatal(err)
	}

	// A host whose records are all gone reads and lists nothing (its
	// session's heartbeats go on); while it held one, it read its bell.
	gone := newBackend(t, emu, func(c *gcsbackend.Config) {
		c.WantPoll = 100 * time.Millisecond
		c.WarmFor = -1 // a release drops the record
	})
	l, err := gone.Claim(ctx, dirLock("gone"), lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	if d := over(gone, time.Second); d.Reads == 0 {
		t.Errorf("control: holding a record for 1 s, the host read its bell %d times", d.Reads)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if d := over(gone, 2*time.Second); d.Reads+d.Lists != 0 {
		t.Errorf("a host without records made %d reads and %d listings in 2 s", d.Reads, d.Lists)
	}

	// Another host's waiter for the held record: the lease says so.
	got := make(chan error, 1)
	asked := time.Now()
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := c.Claim(wctx, dirLock("held"), lockmgr.Exclusive, true)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	select {
	case <-held.(lockmgr.ContendedLease).Contended():
		t.Logf("the holder knew of the waiter %v after it asked", time.Since(asked).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's lease did not report another host's waiter within 10 s")
	}
	// The lease counts itself contended just after it closes Contended's
	// channel: give the count a moment.
	s := a.Stats()
	for deadline := time.Now().Add(5 * time.Second); s.Contended == 0 && time.Now().Before(deadline); s = a.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	if s.Contended != 1 || s.Lists == 0 {
		t.Errorf("after the want: %d leases contended, %d listings; want 1 and some", s.Contended, s.Lists)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the other host's waiter after the release: %v", err)
	}
}

// A claim that waits for its record's slot while the want poller drops
// and forgets that record must not then write its record through the
// forgotten handle: this host would not know that record, so no want
// could ever get it dropped, and another host's waiter would be stranded
// behind it for the life of the session (TestPorcupineHierarchyFourHosts
// once saw five clients of three hosts blocked for 45 s by records no
// engine held). Here the test takes the slot as the poller does, a claim
// of the same host waits for it, and the drop forgets the handle; after
// the claim is released, a second host must get the lock within a few
// want polls. Control: without the check in lockRecFor the second host
// waits out its 20 s.
func TestClaimWaitingForDroppedRecordStaysKnown(t *testing.T) {
	emu := gcstest.Start(t)
	a, c := newBackend(t, emu, nil), newBackend(t, emu, nil)
	id := dirLock("d")
	ctx := ctxT(t, 90*time.Second)
	keepWarm(ctx, t, a, id)
	dropAndLetGo, err := a.HoldRecordSlot(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	type claimed struct {
		l   lockmgr.Lease
		err error
	}
	got := make(chan claimed, 1)
	go func() {
		l, err := a.Claim(ctx, id, lockmgr.Exclusive, true)
		got <- claimed{l, err}
	}()
	// The claim needs no request before it waits for the slot (the
	// session is live and nobody asked for the lock): 200 ms is ample.
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-got:
		t.Fatalf("the claim did not wait for the record's slot: %v", r.err)
	default:
	}
	if err := dropAndLetGo(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	claimPast(wctx, t, c, a, id, true, "another host's waiter is stranded by a record its host no longer knows")
}

// keepWarm claims id exclusively on b and releases it: b keeps the record
// warm in the object.
func keepWarm(ctx context.Context, t *testing.T, b *gcsbackend.Backend, id lockmgr.LockID) {
	t.Helper()
	l, err := b.Claim(ctx, id, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// claimPast claims id exclusively on c and releases it. If the claim
// fails, the test fails with what, the error and the records that a
// reads in the object.
func claimPast(ctx context.Context, t *testing.T, c, a *gcsbackend.Backend, id lockmgr.LockID, wait bool, what string) {
	t.Helper()
	l, err := c.Claim(ctx, id, lockmgr.Exclusive, wait)
	if err != nil {
		_, _, holders, _ := a.ReadRecord(context.WithoutCancel(ctx), a.ObjectName(id))
		t.Fatalf("%s: %v (records: %v)", what, err, holders)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
