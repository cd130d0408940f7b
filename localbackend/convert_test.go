package localbackend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// The control for Convert: on Linux, a LOCK_EX|LOCK_NB that fails on a
// descriptor holding LOCK_SH drops the shared lock. Another process can then
// take the lock exclusively although we never unlocked.
func TestKernelFailedUpgradeDropsSharedLock(t *testing.T) {
	src := newSource(t, "d")
	file := filepath.Join(src, "d", "..LOCK")
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	h := holdExternal(t, file, "", "-s")
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("upgrade while another process holds it shared: got %v, want EWOULDBLOCK", err)
	}
	h.kill()
	if !externalTry(t, file, "-x") {
		t.Fatal("kernel kept the shared lock after a failed upgrade; the Convert workaround may be unnecessary on this kernel")
	}
}

// Convert keeps the shared claim when an upgrade fails.
func TestConvertFailedUpgradeKeepsShared(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	l := mustClaim(t, b, dirID("d"), lockmgr.Shared)

	h := holdExternal(t, file, "", "-s")
	if err := l.Convert(context.Background(), lockmgr.Exclusive, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("upgrade while another process holds it shared: got %v, want ErrWouldBlock", err)
	}
	if l.Mode() != lockmgr.Shared || l.Done() != nil || l.Err() != nil {
		t.Fatalf("after a failed upgrade: mode %v, done %v, err %v", l.Mode(), l.Done(), l.Err())
	}
	h.kill()
	if externalTry(t, file, "-x") {
		t.Fatal("the shared claim was lost by a failed upgrade")
	}
	if !externalTry(t, file, "-s") {
		t.Fatal("the claim is held exclusively after a failed upgrade")
	}

	if err := l.Convert(context.Background(), lockmgr.Exclusive, false); err != nil {
		t.Fatal(err)
	}
	if l.Mode() != lockmgr.Exclusive || externalTry(t, file, "-s") {
		t.Fatal("upgrade did not take the lock exclusively")
	}
}

func TestConvertUpgradeWaits(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	mark := filepath.Join(t.TempDir(), "released")
	l := mustClaim(t, b, dirID("d"), lockmgr.Shared)
	h := holdExternal(t, file, mark, "-s")

	type result struct {
		err      error
		markSeen bool
	}
	res := make(chan result, 1)
	go func() {
		err := l.Convert(context.Background(), lockmgr.Exclusive, true)
		_, statErr := os.Stat(mark)
		res <- result{err, statErr == nil}
	}()
	// Meanwhile the claim stays shared: others may share, not take it.
	for range 5 {
		if externalTry(t, file, "-x") {
			t.Fatal("the shared claim is not held while an upgrade waits")
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.release()
	r := <-res
	if r.err != nil || !r.markSeen {
		t.Fatalf("waiting upgrade: err %v, returned after release: %v", r.err, r.markSeen)
	}
	if l.Mode() != lockmgr.Exclusive || externalTry(t, file, "-s") {
		t.Fatal("upgrade did not take the lock exclusively")
	}
}

func TestConvertUpgradeCancel(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	l := mustClaim(t, b, dirID("d"), lockmgr.Shared)
	h := holdExternal(t, file, "", "-s")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := l.Convert(ctx, lockmgr.Exclusive, true); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	h.release()
	if l.Mode() != lockmgr.Shared || externalTry(t, file, "-x") || !externalTry(t, file, "-s") {
		t.Fatal("a cancelled upgrade did not leave the claim shared")
	}
}

func TestConvertDowngrade(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	l := mustClaim(t, b, dirID("d"), lockmgr.Exclusive)
	if externalTry(t, file, "-s") {
		t.Fatal("exclusive claim lets flock -s in")
	}
	if err := l.Convert(context.Background(), lockmgr.Shared, false); err != nil {
		t.Fatal(err)
	}
	if l.Mode() != lockmgr.Shared || !externalTry(t, file, "-s") || externalTry(t, file, "-x") {
		t.Fatal("downgrade did not leave the claim shared")
	}
	if err := l.Convert(context.Background(), lockmgr.Shared, false); err != nil {
		t.Fatalf("same-mode convert: %v", err)
	}
	if err := l.Convert(context.Background(), 0, false); !errors.Is(err, lockmgr.ErrInvalid) {
		t.Fatalf("convert to none: got %v, want ErrInvalid", err)
	}
}

// If another process takes the lock exclusively in the moment a failed
// upgrade attempt left it free, the shared claim cannot be re-taken: the
// lease is lost, visibly.
func TestConvertLosesLease(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	file := filepath.Join(src, "d", "..LOCK")
	l := mustClaim(t, b, dirID("d"), lockmgr.Shared)
	if l.Done() != nil || l.Err() != nil {
		t.Fatal("a fresh lease reports a loss")
	}

	sharer := holdExternal(t, file, "", "-s")
	taker := startHolder(t, file, "", "-x") // queued behind both shared holds
	testHookUpgradeGap = func() {
		testHookUpgradeGap = nil
		sharer.kill()
		if line := taker.line(); line != "locked" {
			t.Errorf("exclusive waiter: %q", line)
		}
	}
	t.Cleanup(func() { testHookUpgradeGap = nil })

	err := l.Convert(context.Background(), lockmgr.Exclusive, true)
	if !errors.Is(err, lockmgr.ErrLeaseLost) {
		t.Fatalf("got %v, want ErrLeaseLost", err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done is not closed after the loss")
	}
	if !errors.Is(l.Err(), lockmgr.ErrLeaseLost) || l.Mode() != 0 {
		t.Fatalf("after the loss: err %v, mode %v", l.Err(), l.Mode())
	}
	if err := l.Convert(context.Background(), lockmgr.Shared, false); !errors.Is(err, lockmgr.ErrLeaseLost) {
		t.Fatalf("convert on a lost lease: %v", err)
	}
	if _, err := l.NextToken(context.Background()); !errors.Is(err, lockmgr.ErrLeaseLost) {
		t.Fatalf("token on a lost lease: %v", err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("release of a lost lease: %v", err)
	}
	taker.release()
}
