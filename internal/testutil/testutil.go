// Package testutil holds the helpers that the tests of every lockfs package
// share: waiting for a condition with a generous bound, failing a test
// whose goroutines outlive it, counting open descriptors, a helper process
// a test talks to in lines (StartChild), and prerequisites that fail under
// CI=true and skip elsewhere (Missing).
//
// Tests wait for correctness, never for speed (the machine may be loaded):
// Eventually's bound is a hang detector, not a latency assertion.
package testutil

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// DefaultWait is how long Eventually waits before it calls the condition
// hung. It is generous on purpose: it only catches hangs.
const DefaultWait = 10 * time.Second

// Eventually polls cond every few milliseconds until it holds, and fails t
// (Fatalf, naming what was awaited) if it still does not after DefaultWait.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, DefaultWait, what, cond)
}

// EventuallyWithin is Eventually with another bound.
func EventuallyWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(d, cond) {
		t.Fatalf("timed out after %v waiting until %s", d, what)
	}
}

// Poll polls cond every few milliseconds until it holds (true) or d has
// passed (false), for callers that cannot fail the test from where they
// wait (another goroutine) or that expect the condition to stay false.
func Poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for wait := time.Millisecond; ; {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		if wait < 20*time.Millisecond {
			wait *= 2
		}
	}
}

// CheckGoroutines fails t if a goroutine started while t ran is still
// running once t's other cleanups have run (it gives them DefaultWait to
// end, polling). Call it first in a test, so that its cleanup runs last. A test
// that calls it must not run in parallel with others: their goroutines
// would count as its own.
//
// Goroutines of the runtime and of the testing package, and those of
// packages named in ignore (matched against the stack text, e.g.
// "os/signal.loop"), are not counted.
func CheckGoroutines(t testing.TB, ignore ...string) {
	t.Helper()
	before := goroutineIDs()
	t.Cleanup(func() {
		var left []string
		ok := Poll(leakWait, func() bool {
			left = newGoroutines(before, ignore)
			return len(left) == 0
		})
		if !ok {
			t.Errorf("%d goroutines outlived the test:\n\n%s", len(left), strings.Join(left, "\n\n"))
		}
	})
}

// leakWait is how long CheckGoroutines waits for goroutines to end; a
// variable so that its own test need not wait for long.
var leakWait = DefaultWait

// ignoredStacks are goroutines that belong to the runtime or the test
// framework, not to the code under test.
var ignoredStacks = []string{
	"testing.tRunner",
	"testing.(*T).Run",
	"testing.runTests",
	"testing.(*M).",
	"runtime.goexit0",
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"created by runtime.gc",
	"runtime.ReadTrace",
}

// AllStacks returns the stacks of every goroutine, as runtime.Stack
// prints them, however long.
func AllStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// stacks returns the stack of every goroutine, one entry each.
func stacks() []string {
	return strings.Split(AllStacks(), "\n\n")
}

// goroutineID parses "goroutine 123 [running]:".
func goroutineID(stack string) int {
	rest, ok := strings.CutPrefix(stack, "goroutine ")
	if !ok {
		return -1
	}
	id, _, _ := strings.Cut(rest, " ")
	n, err := strconv.Atoi(id)
	if err != nil {
		return -1
	}
	return n
}

func goroutineIDs() []int {
	var ids []int
	for _, s := range stacks() {
		ids = append(ids, goroutineID(s))
	}
	return ids
}

// newGoroutines returns the stacks of goroutines not in before, except the
// caller's own and the ignored ones.
func newGoroutines(before []int, ignore []string) []string {
	var out []string
	all := stacks()
	for i, s := range all {
		if i == 0 { // runtime.Stack lists the calling goroutine first
			continue
		}
		if slices.Contains(before, goroutineID(s)) || ignored(s, ignore) {
			continue
		}
		out = append(out, s)
	}
	return out
}

func ignored(stack string, extra []string) bool {
	for _, l := range [][]string{ignoredStacks, extra} {
		for _, pat := range l {
			if strings.Contains(stack, pat) {
				return true
			}
		}
	}
	return false
}

// CheckGoroutinesOf is CheckGoroutines for the goroutines that run code of
// package pkg (an import path, e.g. "github.com/lockfs/lockfs/gcsbackend")
// only: for tests whose other goroutines (HTTP clients' idle connections,
// an emulator) may legitimately linger. Goroutines of pkg's own tests do
// not count.
func CheckGoroutinesOf(t testing.TB, pkg string) {
	t.Helper()
	before := goroutineIDs()
	t.Cleanup(func() {
		var left []string
		ok := Poll(leakWait, func() bool {
			left = left[:0]
			for _, s := range newGoroutines(before, nil) {
				if strings.Contains(s, pkg+".") && !strings.Contains(s, pkg+"_test.") {
					left = append(left, s)
				}
			}
			return len(left) == 0
		})
		if !ok {
			t.Errorf("%d goroutines of %s outlived the test:\n\n%s", len(left), pkg, strings.Join(left, "\n\n"))
		}
	})
}

// Goroutines is a snapshot of the running goroutines, for a leak check
// around a whole test binary (TestMain), where there is no testing.TB.
type Goroutines []int

// SnapshotGoroutines records the goroutines running now.
func SnapshotGoroutines() Goroutines { return goroutineIDs() }

// Leaked returns the stacks of goroutines started since the snapshot that
// are still running after waiting up to DefaultWait for them to end;
// nil if none. Goroutines of the runtime and the testing package, and
// those whose stack contains one of ignore, do not count.
func (g Goroutines) Leaked(ignore ...string) []string {
	var left []string
	Poll(leakWait, func() bool {
		left = newGoroutines(g, ignore)
		return len(left) == 0
	})
	return left
}

// OpenFds counts this process's open descriptors, for tests that check
// that something closes what it opened.
func OpenFds(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
