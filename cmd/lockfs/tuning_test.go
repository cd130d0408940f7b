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

// TestMemoryLimitCountsStacksOnce: the limit leaves the heap room to grow
// by its live size (at least minHeapHeadroom), whatever the goroutine
// stacks: with 80 MiB of stacks (10,000 waiting lock requests) and 40 MiB
// live, 80 MiB of heap, where Go's own goal (GOGC 100) allows 160 MiB;
// with 1 MiB of stacks the two nearly agree and the limit changes little.
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
		limit, ok := memoryLimit(s)
		if !ok {
			t.Fatalf("%s: no limit", c.name)
		}
		goal := 2*c.live + c.stacks // the collector's, globals aside
		if room := uint64(limit) - c.stacks - meta; room != c.room {
			t.Errorf("%s: the limit leaves the heap %d MiB, want %d (the collector's goal: %d MiB)", c.name, room/mib, c.room/mib, goal/mib)
		}
	}
	if _, ok := memoryLimit(memorySample{total: 100 * mib}); ok {
		t.Error("a limit before the first collection measured the live heap")
	}
}
