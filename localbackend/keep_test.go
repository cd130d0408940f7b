package localbackend

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

// newKeepBackend returns a backend over src whose shared claims are kept
// for keep (negative: not kept), closed when the test ends.
func newKeepBackend(t *testing.T, src string, keep time.Duration) *Backend {
	t.Helper()
	b, err := New(Config{Source: src, KeepShared: keep})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// keptCount is how many released shared claims b keeps locked.
func keptCount(b *Backend) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.kept)
}

// pair claims the depth-4 lock a/b/c/d as the engine does (the ancestors
// ".", a, a/b and a/b/c shared, then the lock exclusively) and releases it,
// the lock first.
func pair(t *testing.T, b *Backend) {
	t.Helper()
	var ls []lockmgr.Lease
	for _, p := range []string{".", "a", "a/b", "a/b/c"} {
		ls = append(ls, mustClaim(t, b, dirID(p), lockmgr.Shared))
	}
	ls = append(ls, mustClaim(t, b, dirID("a/b/c/d"), lockmgr.Exclusive))
	for i := len(ls) - 1; i >= 0; i-- {
		ls[i].Release(context.Background())
	}
}

// flocksPerPair counts the flock(2) calls of n depth-4 pairs.
func flocksPerPair(t *testing.T, b *Backend, n int) float64 {
	pair(t, b) // opens every backing file
	before := b.flockCalls.Load()
	for range n {
		pair(t, b)
	}
	return float64(b.flockCalls.Load()-before) / float64(n)
}

func TestKeptSharedClaimsSaveFlocks(t *testing.T) {
	const n = 200
	kept := flocksPerPair(t, newKeepBackend(t, newSource(t, "a/b/c/d"), time.Minute), n)
	// Control: without the keep, every ancestor is flocked and unlocked
	// at every pair (4 × 2, and 2 for the lock).
	plain := flocksPerPair(t, newKeepBackend(t, newSource(t, "a/b/c/d"), -1), n)
	t.Logf("flock(2) calls per depth-4 pair: %.2f kept, %.2f without the keep", kept, plain)
	if plain < 10 {
		t.Fatalf("without the keep a pair made %.2f flock calls, want 10", plain)
	}
	if kept > 2 {
		t.Fatalf("with the keep a pair made %.2f flock calls, want 2 (the lock's own)", kept)
	}
}

// flockSetsid runs flock(1) with args in its own session and returns its
// exit status (-1 if it did not run to an exit).
func flockSetsid(t *testing.T, args ...string) int {
	t.Helper()
	cmd := exec.Command("flock", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode()
	}
	t.Fatalf("flock %v: %v: %s", args, err, out)
	return -1
}

func TestKeptClaimDelaysDirectLockerOnlyBriefly(t *testing.T) {
	src := newSource(t, "a/b/c/d")
	b := newKeepBackend(t, src, 0) // the default, 5 ms
	pair(t, b)
	// A direct exclusive locker of an ancestor waits (generously bounded
	// here; docs/PROTOCOL.md gives the real bound) and gets it.
	if rc := flockSetsid(t, "-w", "30", "-x", filepath.Join(src, "a", "..LOCK"), "true"); rc != 0 {
		t.Fatalf("flock -w 30 -x SOURCE/a/..LOCK exited %d after a pair: the kept claim was not dropped", rc)
	}
	// It could only get the lock once the kept claim was unlocked.
	b.mu.Lock()
	_, ok := b.kept["a/..LOCK"]
	b.mu.Unlock()
	if ok {
		t.Fatal("the kept claim on a is still listed after a direct exclusive flock got the lock")
	}

	// Control: with a keep longer than the wait, the same locker does
	// not get it: the claim really is kept.
	src2 := newSource(t, "a/b/c/d")
	b2 := newKeepBackend(t, src2, time.Minute)
	pair(t, b2)
	if rc := flockSetsid(t, "-w", "0.2", "-x", filepath.Join(src2, "a", "..LOCK"), "true"); rc != 1 {
		t.Fatalf("flock -w 0.2 -x exited %d, want 1 (busy) while the claim is kept", rc)
	}
	if keptCount(b2) != 4 {
		t.Fatalf("%d claims kept after a depth-4 pair, want the 4 ancestors", keptCount(b2))
	}
}

func TestOwnExclusiveClaimIsNotDelayedByKeptClaim(t *testing.T) {
	src := newSource(t, "a/b/c/d")
	b := newKeepBackend(t, src, time.Minute)
	pair(t, b)
	file := filepath.Join(src, "a", "..LOCK")
	if externalTry(t, file, "-x") {
		t.Fatal("flock -n -x on a succeeded right after the pair: nothing kept, so this test proves nothing")
	}
	// Without wait: a kept claim that blocked it would give ErrWouldBlock.
	l, err := b.Claim(context.Background(), dirID("a"), lockmgr.Exclusive, false)
	if err != nil {
		t.Fatalf("exclusive claim of a right after a pair: %v", err)
	}
	if externalTry(t, file, "-s") {
		t.Fatal("flock -n -s on a succeeded while this backend holds it exclusively")
	}
	l.Release(context.Background())
	if !externalTry(t, file, "-x") {
		t.Fatal("an exclusive claim's release was kept: only shared claims may be")
	}
}

func TestDropKeptAndGuardTreeSeeNoKeptHold(t *testing.T) {
	src := newSource(t, "a/b/c/d")
	b := newKeepBackend(t, src, time.Minute)
	pair(t, b)
	// GuardTree (rename) drops the kept claims and is not busy.
	release, err := b.GuardTree("a")
	if err != nil {
		t.Fatalf("GuardTree(a) right after a pair: %v", err)
	}
	release()
	if n := keptCount(b); n != 0 {
		t.Fatalf("%d claims still kept after GuardTree", n)
	}

	// DropKept (rmdir) unlocks them all; the descriptors stay idle.
	pair(t, b)
	file := filepath.Join(src, "a", "b", "..LOCK")
	if externalTry(t, file, "-x") {
		t.Fatal("flock -n -x on a/b succeeded right after the pair: nothing kept")
	}
	b.DropKept()
	if !externalTry(t, file, "-x") {
		t.Fatal("flock -n -x on a/b failed after DropKept")
	}

	// Control: a real shared hold still makes GuardTree busy.
	l := mustClaim(t, b, dirID("a"), lockmgr.Shared)
	if _, err := b.GuardTree("a"); !errors.Is(err, lockmgr.ErrBusy) {
		t.Fatalf("GuardTree(a) while a is held shared: %v, want ErrBusy", err)
	}
	l.Release(context.Background())
}

func TestKeptClaimOfRenamedFileIsNotReused(t *testing.T) {
	src := newSource(t, "a/b/c/d")
	b := newKeepBackend(t, src, time.Minute)
	pair(t, b)
	b.DropKept() // let a be renamed (a/b stays kept below)
	pair(t, b)
	// Drop only a's kept claim, as its expiry might, then move a away
	// directly in SOURCE: a/b's kept flock is now on x/b/..LOCK.
	if k, _ := b.takeKept("a/..LOCK", false); k != nil {
		k.file.Close()
	}
	if err := exec.Command("mv", filepath.Join(src, "a"), filepath.Join(src, "x")).Run(); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("mkdir", "-p", filepath.Join(src, "a", "b")).Run(); err != nil {
		t.Fatal(err)
	}
	l := mustClaim(t, b, dirID("a/b"), lockmgr.Shared)
	defer l.Release(context.Background())
	// The claim holds the new a/b/..LOCK, not the moved file. (Control:
	// skipping Backend.unnamed for a reused kept claim fails here.)
	if externalTry(t, filepath.Join(src, "a", "b", "..LOCK"), "-x") {
		t.Fatal("flock -n -x on the new a/b/..LOCK succeeded: the claim reused the kept flock of the moved file")
	}
}
