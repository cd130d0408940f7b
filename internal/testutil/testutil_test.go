package testutil

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeT records failures instead of failing, so that the helpers' own
// failure paths can be tested.
type fakeT struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	errors   []string
}

func (f *fakeT) Helper()           {}
func (f *fakeT) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

func (f *fakeT) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// TestCheckGoroutinesCatchesALeak is the control of every leak check that
// uses the helper: a goroutine that outlives the test is reported, and one
// that ends in time is not.
func TestCheckGoroutinesCatchesALeak(t *testing.T) {
	defer func(d time.Duration) { leakWait = d }(leakWait)
	leakWait = 200 * time.Millisecond
	stop := make(chan struct{})
	defer close(stop)
	f := &fakeT{TB: t}
	CheckGoroutines(f)
	go func() { <-stop }() // leaked until the test ends
	f.runCleanups()
	if len(f.errors) != 1 {
		t.Fatalf("leaked goroutine: %d errors, want 1", len(f.errors))
	}

	f = &fakeT{TB: t}
	CheckGoroutines(f)
	done := make(chan struct{})
	go func() { time.Sleep(50 * time.Millisecond); close(done) }()
	f.runCleanups()
	<-done
	if len(f.errors) != 0 {
		t.Fatalf("goroutine that ended: %d errors, want 0", len(f.errors))
	}
}

func TestPoll(t *testing.T) {
	n := 0
	if !Poll(time.Second, func() bool { n++; return n == 3 }) {
		t.Fatal("Poll gave up on a condition that became true")
	}
	if Poll(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported a condition that never held")
	}
}

func TestGoroutineID(t *testing.T) {
	s := stacks()[0]
	if !strings.HasPrefix(s, "goroutine ") || goroutineID(s) <= 0 {
		t.Fatalf("cannot parse %q", strings.SplitN(s, "\n", 2)[0])
	}
}

func TestLeakedSinceSnapshot(t *testing.T) {
	defer func(d time.Duration) { leakWait = d }(leakWait)
	leakWait = 200 * time.Millisecond
	stop := make(chan struct{})
	g := SnapshotGoroutines()
	go func() { <-stop }() // still running at the check
	if left := g.Leaked(); len(left) != 1 {
		t.Errorf("one goroutine left running: Leaked found %d", len(left))
	}
	close(stop)
	if left := g.Leaked(); len(left) != 0 {
		t.Errorf("after it ended: Leaked found %d", len(left))
	}
}

// TestSizeAtMost: a struct within its bound passes; one a byte over it
// fails, naming the type (the control).
func TestSizeAtMost(t *testing.T) {
	type sixteen struct{ a, b uint64 }
	var ok, over fakeT
	SizeAtMost[sixteen](&ok, 16)
	SizeAtMost[sixteen](&over, 15)
	if len(ok.errors) != 0 {
		t.Errorf("a 16-byte struct failed a 16-byte bound: %v", ok.errors)
	}
	if len(over.errors) != 1 || !strings.Contains(over.errors[0], "sixteen is 16 bytes, more than the 15") {
		t.Errorf("control: a 16-byte struct under a 15-byte bound reported %v", over.errors)
	}
}
