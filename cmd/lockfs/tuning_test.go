package main

import (
	"runtime"
	"testing"
)

// TestRaiseGOMAXPROCS: the mount adds readerPs to the runtime's default;
// the GOMAXPROCS environment variable keeps the runtime's value (control).
func TestRaiseGOMAXPROCS(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })

	t.Setenv("GOMAXPROCS", "")
	raiseGOMAXPROCS()
	if got := runtime.GOMAXPROCS(0); got != orig+readerPs {
		t.Errorf("GOMAXPROCS %d after raiseGOMAXPROCS, want %d + %d", got, orig, readerPs)
	}

	runtime.GOMAXPROCS(orig)
	t.Setenv("GOMAXPROCS", "3")
	raiseGOMAXPROCS()
	if got := runtime.GOMAXPROCS(0); got != orig {
		t.Errorf("with GOMAXPROCS=3 in the environment, raiseGOMAXPROCS changed GOMAXPROCS to %d (was %d)", got, orig)
	}
}

// TestMemoryLimitCountsStacksOnce: the limit of a busy daemon leaves the
// heap room to grow by its live size (at least minHeapHeadroom), whatever
// the goroutine stacks: with 80 MiB of stacks (10,000 waiting lock
// requests) and 40 MiB live, 80 MiB of heap, where Go's own goal (GOGC
// 100) allows 160 MiB; with 1 MiB of stacks the two nearly agree and the
// limit changes little.
func TestMemoryLimitCountsStacksOnce(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name               string
		live, stacks, room uint64
	}{
		{"10,000 waiters", 40 * mib, 80 * mib, 80 * mib},
		{"a few goroutines", 40 * mib, 1 * mib, 80 * mib},
		{"a small heap", 10 * mib, 1 * mib, 10*mib + minHeapHeadroom},
	} {
		meta := uint64(8 * mib)
		s := memorySample{live: c.live, heap: c.live + 10*mib, released: 2 * mib}
		s.total = s.heap + s.released + c.stacks + meta
		limit, ok := memoryLimit(s, 1<<40)
		if !ok {
			t.Fatalf("%s: no limit", c.name)
		}
		goal := 2*c.live + c.stacks // the collector's, globals aside
		if room := uint64(limit) - c.stacks - meta; room != c.room {
			t.Errorf("%s: the limit leaves the heap %d MiB, want %d (the collector's goal: %d MiB)", c.name, room/mib, c.room/mib, goal/mib)
		}
	}
	if _, ok := memoryLimit(memorySample{total: 100 * mib}, 0); ok {
		t.Error("a limit before the first collection measured the live heap")
	}
}

// TestMemoryLimitFollowsAllocation: the heap's room is the daemon's recent
// burst of allocation, at least minHeapHeadroom, at most the live heap: a
// daemon with 500 MiB live that allocates little keeps 32 MiB of garbage,
// not 500 (control: a burst above the live heap gives GOGC 100's room).
func TestMemoryLimitFollowsAllocation(t *testing.T) {
	const mib = 1 << 20
	s := memorySample{live: 500 * mib, heap: 510 * mib}
	s.total = s.heap + 20*mib
	for _, c := range []struct {
		name        string
		burst, room uint64
	}{
		{"idle", 1 * mib, minHeapHeadroom},
		{"busy", 100 * mib, 100 * mib},
		{"very busy (control)", 2000 * mib, 500 * mib},
	} {
		limit, ok := memoryLimit(s, c.burst)
		if !ok {
			t.Fatalf("%s: no limit", c.name)
		}
		if room := uint64(limit) - 20*mib - s.live; room != c.room {
			t.Errorf("%s: room for %d MiB of garbage, want %d", c.name, room/mib, c.room/mib)
		}
	}
}

// TestMemoryLimitAboveFragmentedHeap: right after a collection the heap
// maps its live objects and the free slots of their spans, which no
// collection gives back; an idle daemon's limit leaves minHeapHeadroom
// above that, not below it (300 MiB live with 130 MiB of free slots, as a
// daemon holding 100,000 locks on gcs had, and a tight heap as control).
// Without the slots in the limit this fails: the limit is 98 MiB under
// what the heap maps, and Go collects without pause.
func TestMemoryLimitAboveFragmentedHeap(t *testing.T) {
	const mib = 1 << 20
	for _, unused := range []uint64{130 * mib, 1 * mib} {
		live, meta := uint64(300*mib), uint64(20*mib)
		s := memorySample{live: live, unused: unused, heap: live + unused}
		s.total = s.heap + meta
		limit, ok := memoryLimit(s, 1*mib)
		if !ok {
			t.Fatal("no limit")
		}
		mapped := int64(s.total - s.released)
		if room := limit - mapped; room != minHeapHeadroom {
			t.Errorf("%d MiB of free slots: the limit is %d MiB above what the heap maps after a collection, want %d", unused/mib, room/mib, minHeapHeadroom/mib)
		}
	}
}

// TestAllocPeak: the burst is allocWindow at the highest rate of the
// looks within allocLookback, and forgets a peak older than that
// (control: the peak is still there one look before).
func TestAllocPeak(t *testing.T) {
	p := newAllocPeak()
	n, w := uint64(len(p.per)), uint64(allocWindow/memoryLimitEvery)
	if b := p.add(1000); b != 0 {
		t.Errorf("burst %d at the first look, want 0", b)
	}
	allocs := uint64(1000)
	look := func(d uint64) uint64 { allocs += d; return p.add(allocs) }
	look(10)
	if b := look(50); b != 50*w {
		t.Errorf("burst %d, want %d (50 per look)", b, 50*w)
	}
	for i := uint64(0); i < n-2; i++ {
		look(10)
	}
	if b := look(10); b != 50*w {
		t.Errorf("burst %d one look before the peak leaves the window, want %d", b, 50*w)
	}
	if b := look(10); b != 10*w {
		t.Errorf("burst %d once the peak left the window, want %d", b, 10*w)
	}
}
