package gcsbackend

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestOwnRecSize: a held lock's ownRec stays in the 144-byte size class
// (its slot costs no allocation of its own).
func TestOwnRecSize(t *testing.T) {
	testutil.SizeAtMost[ownRec](t, 144)
}

// slotUser is what the exclusion check needs of a slot.
type slotUser interface {
	lock(ctx context.Context) error
	unlock()
}

// noSlot takes nothing: the control, which the exclusion check must catch.
type noSlot struct{}

func (noSlot) lock(context.Context) error { return nil }
func (noSlot) unlock()                    {}

// overlaps runs workers that each take s n times, some of them with a
// context that ends while they may be waiting, and returns the most
// holders seen at once and how many takes succeeded.
func overlaps(s slotUser, workers, n int) (most int32, took int64) {
	var in, peak atomic.Int32
	var ok atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if (w+i)%3 == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(i%50)*time.Microsecond)
				}
				if s.lock(ctx) == nil {
					ok.Add(1)
					cur := in.Add(1)
					for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
					}
					time.Sleep(time.Microsecond)
					in.Add(-1)
					s.unlock()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	return peak.Load(), ok.Load()
}

// TestRecSlotExcludes: one holder at a time, however the waits end; waits
// given up leave the slot free for the next (every worker's last take, on
// a context that never ends, succeeds).
func TestRecSlotExcludes(t *testing.T) {
	var r ownRec
	most, took := overlaps(&r, 8, 300)
	if most != 1 {
		t.Errorf("%d operations held one record's slot at once", most)
	}
	if took == 0 {
		t.Error("no operation took the slot")
	}
	if r.slotBusy || r.slotWait != nil {
		t.Errorf("slot left busy=%v with waiters %v", r.slotBusy, r.slotWait)
	}
	if err := r.lock(context.Background()); err != nil {
		t.Fatalf("the slot cannot be taken after the run: %v", err)
	}
	r.unlock()
	// The control: the same run over no slot at all sees overlaps.
	if most, _ := overlaps(noSlot{}, 8, 300); most < 2 {
		t.Errorf("control: no overlap seen without a slot (most %d)", most)
	}
}

// TestRecSlotWaitEnds: a wait ends with its context, in order: the holder's
// unlock then goes to the next waiter, not to the one that gave up.
func TestRecSlotWaitEnds(t *testing.T) {
	var r ownRec
	if err := r.lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- r.lock(ctx) }()
	second := make(chan error, 1)
	testutil.Eventually(t, "the first waiter to queue", func() bool { return waiting(&r) == 1 })
	go func() { second <- r.lock(context.Background()) }()
	testutil.Eventually(t, "the second waiter to queue", func() bool { return waiting(&r) == 2 })
	cancel()
	if err := <-gaveUp; err != context.Canceled {
		t.Fatalf("a wait whose context ended: %v, want context.Canceled", err)
	}
	select {
	case err := <-second:
		t.Fatalf("the second waiter took a held slot: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	r.unlock()
	if err := <-second; err != nil {
		t.Fatalf("the second waiter, after the unlock: %v", err)
	}
	r.unlock()
	if r.slotBusy || r.slotWait != nil {
		t.Errorf("slot left busy=%v with waiters %v", r.slotBusy, r.slotWait)
	}
}

// waiting is how many operations wait for r's slot.
func waiting(r *ownRec) int {
	r.slotMu.Lock()
	defer r.slotMu.Unlock()
	if r.slotWait == nil {
		return 0
	}
	return len(*r.slotWait)
}
