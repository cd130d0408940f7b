package localbackend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

type claimResult struct {
	lease lockmgr.Lease
	err   error
	// markSeen says whether the holder's release mark existed when Claim
	// returned: the holder writes it before it lets the lock go.
	markSeen bool
}

// claimAsync runs a waiting Claim in a goroutine and reports its result,
// with whether mark existed the moment it returned.
func claimAsync(ctx context.Context, b *Backend, id lockmgr.LockID, mode lockmgr.Mode, mark string) <-chan claimResult {
	res := make(chan claimResult, 1)
	go func() {
		l, err := b.Claim(ctx, id, mode, true)
		_, statErr := os.Stat(mark)
		res <- claimResult{l, err, statErr == nil}
	}()
	return res
}

// waitingThroughFlock waits until this process runs n flock(1) waiters.
func waitingThroughFlock(t *testing.T, n int) {
	t.Helper()
	testutil.Eventually(t, "the claim waits through flock(1)", func() bool { return len(flockChildren(os.Getpid())) == n })
}

func TestExternalFlockExcludesClaim(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	mark := filepath.Join(t.TempDir(), "released")

	h := holdExternal(t, file, mark, "-x")
	for _, mode := range []lockmgr.Mode{lockmgr.Shared, lockmgr.Exclusive} {
		if _, err := b.Claim(context.Background(), dirID("d"), mode, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
			t.Fatalf("claim %s while flock(1) holds it exclusively: got %v, want ErrWouldBlock", mode, err)
		}
	}

	res := claimAsync(context.Background(), b, dirID("d"), lockmgr.Exclusive, mark)
	waitingThroughFlock(t, 1)
	h.release()
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.markSeen {
		t.Fatal("the waiting claim returned before the external holder released the lock")
	}
	if externalTry(t, file, "-s") {
		t.Fatal("flock -s -n succeeded while our claim holds the lock exclusively")
	}
	if n := len(flockChildren(os.Getpid())); n != 0 {
		t.Fatalf("%d flock(1) children left after the claim", n)
	}
	r.lease.Release(context.Background())
	if !externalTry(t, file, "-x") {
		t.Fatal("flock -n failed after Release")
	}
}

func TestSharedClaimWaitsForExternal(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	mark := filepath.Join(t.TempDir(), "released")

	h := holdExternal(t, file, mark, "-x")
	res := claimAsync(context.Background(), b, dirID("d"), lockmgr.Shared, mark)
	waitingThroughFlock(t, 1)
	h.release()
	r := <-res
	if r.err != nil || !r.markSeen {
		t.Fatalf("shared claim: err %v, returned after release: %v", r.err, r.markSeen)
	}
	if got := r.lease.Mode(); got != lockmgr.Shared {
		t.Fatalf("mode %v, want shared", got)
	}
	if !externalTry(t, file, "-s") || externalTry(t, file, "-x") {
		t.Fatal("a shared claim obtained by waiting is not held shared")
	}
}

func TestClaimExcludesExternalFlock(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")

	l := mustClaim(t, b, dirID("d"), lockmgr.Exclusive)
	if externalTry(t, file, "-x") || externalTry(t, file, "-s") {
		t.Fatal("flock -n succeeded while we hold the lock exclusively")
	}
	l.Release(context.Background())
	// Control: the same commands succeed once the claim is released.
	if !externalTry(t, file, "-x") || !externalTry(t, file, "-s") {
		t.Fatal("flock -n failed after Release")
	}

	l = mustClaim(t, b, dirID("d"), lockmgr.Shared)
	if !externalTry(t, file, "-s") {
		t.Fatal("flock -s -n failed while we hold the lock shared")
	}
	if externalTry(t, file, "-x") {
		t.Fatal("flock -x -n succeeded while we hold the lock shared")
	}
	l.Release(context.Background())
}

func TestTwoBackendsExclude(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d")
	b1, b2 := newBackend(t, src), newBackend(t, src)
	ctx := context.Background()

	l1 := mustClaim(t, b1, dirID("d"), lockmgr.Exclusive)
	for _, mode := range []lockmgr.Mode{lockmgr.Shared, lockmgr.Exclusive} {
		if _, err := b2.Claim(ctx, dirID("d"), mode, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
			t.Fatalf("second backend, %s: got %v, want ErrWouldBlock", mode, err)
		}
	}

	var released atomic.Bool
	res := make(chan claimResult, 1)
	go func() {
		l, err := b2.Claim(ctx, dirID("d"), lockmgr.Exclusive, true)
		res <- claimResult{l, err, released.Load()}
	}()
	waitingThroughFlock(t, 1)
	released.Store(true)
	l1.Release(ctx)
	r := <-res
	if r.err != nil || !r.markSeen {
		t.Fatalf("second backend's waiting claim: err %v, returned after release: %v", r.err, r.markSeen)
	}
	if _, err := b1.Claim(ctx, dirID("d"), lockmgr.Shared, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("first backend while the second holds it: got %v, want ErrWouldBlock", err)
	}
	r.lease.Release(ctx)

	// Shared claims of both coexist.
	mustClaim(t, b1, dirID("d"), lockmgr.Shared)
	mustClaim(t, b2, dirID("d"), lockmgr.Shared)
}

func TestKindsAreIndependentLocks(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	mustClaim(t, b, dirID("d"), lockmgr.Exclusive)
	mustClaim(t, b, lockmgr.LockID{Path: "d", Kind: lockmgr.KindNewDir}, lockmgr.Exclusive)
	mustClaim(t, b, lockmgr.LockID{Path: "d", Kind: lockmgr.KindUsage}, lockmgr.Exclusive)
	mustClaim(t, b, dirID("."), lockmgr.Exclusive)
	for _, name := range []string{"d/..LOCK", "d/..LOCK_NEWDIR", "d/..LOCK_USAGE", "..LOCK"} {
		fi, err := os.Lstat(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&^0o644 != 0 {
			t.Errorf("%s: mode %v", name, fi.Mode())
		}
		if externalTry(t, filepath.Join(src, name), "-s") {
			t.Errorf("%s is not locked", name)
		}
	}
}

func TestKilledFlockProcessReleases(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")

	// flock FILE sleep 1000, in its own process group.
	h := startHolder(t, file, "", "-x")
	if line := h.line(); line != "locked" {
		t.Fatalf("holder: %q", line)
	}
	if _, err := b.Claim(context.Background(), dirID("d"), lockmgr.Exclusive, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("claim while held: got %v, want ErrWouldBlock", err)
	}
	h.kill() // SIGKILL to flock(1) and its command
	mustClaim(t, b, dirID("d"), lockmgr.Exclusive)
}

func TestKilledBackendProcessReleases(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)

	cmd, out := startHelper(t, "hold", src, "d")
	if line, _ := out.ReadString('\n'); line != "locked\n" {
		t.Fatalf("helper: %q", line)
	}
	if _, err := b.Claim(context.Background(), dirID("d"), lockmgr.Shared, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("claim while another backend process holds it: got %v, want ErrWouldBlock", err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	mustClaim(t, b, dirID("d"), lockmgr.Exclusive)
}

// A daemon killed while it waits must not leave its flock(1) child behind
// to take the lock later.
func TestWaiterDiesWithBackendProcess(t *testing.T) {
	src := newSource(t, "d")
	file := filepath.Join(src, "d", "..LOCK")
	h := holdExternal(t, file, "", "-x")

	cmd, _ := startHelper(t, "wait", src, "d")
	var child []int
	testutil.Eventually(t, "the helper waits through flock(1)", func() bool {
		child = flockChildren(cmd.Process.Pid)
		return len(child) == 1
	})
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	testutil.Eventually(t, "the orphaned flock(1) child is gone", func() bool {
		st, err := os.ReadFile("/proc/" + itoa(child[0]) + "/stat")
		return err != nil || statState(string(st)) == "Z"
	})
	h.release()
	if !externalTry(t, file, "-x") {
		t.Fatal("the lock is held after the waiting process was killed")
	}
}

func TestCancelWaitingClaim(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	h := holdExternal(t, file, "", "-x")

	ctx, cancel := context.WithCancel(context.Background())
	res := claimAsync(ctx, b, dirID("d"), lockmgr.Exclusive, "")
	waitingThroughFlock(t, 1) // control: the scan does see the waiter
	cancel()
	var r claimResult
	select {
	case r = <-res:
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled claim did not return")
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled claim: got %v, %v; want context.Canceled", r.lease, r.err)
	}
	if pids := flockChildren(os.Getpid()); len(pids) != 0 {
		t.Fatalf("flock(1) children still running after cancel: %v", pids)
	}
	h.release()
	if !externalTry(t, file, "-x") {
		t.Fatal("a lock is held after the cancelled claim")
	}
}

func TestClaimDeadline(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	holdExternal(t, filepath.Join(src, "d", "..LOCK"), "", "-s")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Claim(ctx, dirID("d"), lockmgr.Exclusive, true); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
}

// Cancelling exactly when the lock frees up: whatever the outcome, a
// cancelled claim leaves no lock behind and a granted one holds it.
func TestCancelRacingGrant(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	var granted, cancelled int
	for i := range 20 {
		h := holdExternal(t, file, "", "-x")
		ctx, cancel := context.WithCancel(context.Background())
		res := claimAsync(ctx, b, dirID("d"), lockmgr.Exclusive, "")
		waitingThroughFlock(t, 1)
		h.stop()
		// Spread the cancel over the few milliseconds the release takes.
		time.Sleep(time.Duration(i) * 250 * time.Microsecond)
		cancel()
		h.wait()
		r := <-res
		switch {
		case r.err == nil:
			granted++
			if externalTry(t, file, "-s") {
				t.Fatal("granted claim does not hold the lock")
			}
			r.lease.Release(context.Background())
		case errors.Is(r.err, context.Canceled):
			cancelled++
		default:
			t.Fatal(r.err)
		}
		if !externalTry(t, file, "-x") {
			t.Fatal("a lock is left behind")
		}
	}
	t.Logf("granted %d, cancelled %d", granted, cancelled)
}

func TestCloseInterruptsWaitAndReleases(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d", "e")
	b, err := New(Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	h := holdExternal(t, filepath.Join(src, "d", "..LOCK"), "", "-x")
	held := mustClaim(t, b, dirID("e"), lockmgr.Exclusive)
	res := claimAsync(context.Background(), b, dirID("d"), lockmgr.Shared, "")
	waitingThroughFlock(t, 1)

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if r := <-res; !errors.Is(r.err, lockmgr.ErrClosed) {
		t.Fatalf("waiting claim at Close: got %v, want ErrClosed", r.err)
	}
	if pids := flockChildren(os.Getpid()); len(pids) != 0 {
		t.Fatalf("flock(1) children still running after Close: %v", pids)
	}
	if !externalTry(t, filepath.Join(src, "e", "..LOCK"), "-x") {
		t.Fatal("Close did not release a held claim")
	}
	if held.Mode() != 0 {
		t.Fatalf("mode after Close: %v", held.Mode())
	}
	if err := held.Release(context.Background()); err != nil {
		t.Fatalf("Release after Close: %v", err)
	}
	if _, err := b.Claim(context.Background(), dirID("e"), lockmgr.Shared, false); !errors.Is(err, lockmgr.ErrClosed) {
		t.Fatalf("claim after Close: got %v, want ErrClosed", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	h.release()
}

func TestClaimErrors(t *testing.T) {
	src := newSource(t, "d")
	if err := os.WriteFile(filepath.Join(src, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, src)
	ctx := context.Background()
	for _, tc := range []struct {
		id   lockmgr.LockID
		mode lockmgr.Mode
		want error
	}{
		{dirID("missing"), lockmgr.Shared, os.ErrNotExist},
		{dirID("d/missing"), lockmgr.Exclusive, os.ErrNotExist},
		{dirID("file"), lockmgr.Shared, os.ErrNotExist},
		{dirID("d"), 0, lockmgr.ErrInvalid},
		{dirID("d"), 7, lockmgr.ErrInvalid},
		{lockmgr.LockID{Path: "d"}, lockmgr.Shared, lockmgr.ErrInvalid},
		{dirID(""), lockmgr.Shared, lockmgr.ErrInvalid},
		{dirID("/d"), lockmgr.Shared, lockmgr.ErrInvalid},
		{dirID("d/"), lockmgr.Shared, lockmgr.ErrInvalid},
		{dirID("./d"), lockmgr.Shared, lockmgr.ErrInvalid},
		{dirID(".."), lockmgr.Shared, lockmgr.ErrInvalid},
		{dirID("d/../.."), lockmgr.Shared, lockmgr.ErrInvalid},
	} {
		_, err := b.Claim(ctx, tc.id, tc.mode, true)
		if !errors.Is(err, tc.want) {
			t.Errorf("claim %v %q: got %v, want %v", tc.mode, tc.id, err, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(src, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing directory was created: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o644)
	for _, cfg := range []Config{
		{},
		{Source: filepath.Join(dir, "missing")},
		{Source: file},
		{Source: dir, FlockPath: "flock"},
		{Source: dir, FlockPath: file},
		{Source: dir, FlockPath: filepath.Join(dir, "missing")},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%+v: Validate accepted it", cfg)
		}
		if b, err := New(cfg); err == nil {
			b.Close()
			t.Errorf("%+v: New accepted it", cfg)
		}
	}
	if err := (Config{Source: dir}).Validate(); err != nil {
		t.Error(err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// statState returns the state field of a /proc/PID/stat line.
func statState(stat string) string {
	for i := len(stat) - 1; i >= 0; i-- {
		if stat[i] == ')' && i+2 < len(stat) {
			return stat[i+2 : i+3]
		}
	}
	return ""
}
