package gcsbackend_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/faultproxy"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// A host killed with SIGKILL while holding two locks: one is awaited by a
// host that watched the session before the kill, the other polled with
// non-blocking claims (flock -n in a loop) by a host that first looks after
// it. The watcher gets its lock TTL + lock-delay (the holder's default, the
// TTL) after the crashed host's last heartbeat (the bounds are generous:
// [TTL+delay-0.2s, TTL+delay+3s]); the newcomer, which first saw the
// session after the kill, TTL + lock-delay after its first look at the
// earliest, so never before TTL + lock-delay after the kill.
func TestCrashTakeover(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	prefix := "test/" + t.Name() + "/"
	h, _ := startHolder(t, emu, prefix, "x,y")

	withPrefix := func(c *gcsbackend.Config) { c.Prefix = prefix }
	watcher := newBackend(t, emu, withPrefix)
	ctx := ctxT(t, 60*time.Second)
	if _, err := watcher.Claim(ctx, dirLock("x"), lockmgr.Exclusive, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("claim while the other host holds x: %v", err)
	}
	gotX := make(chan time.Time, 1)
	go func() {
		l, err := watcher.Claim(ctx, dirLock("x"), lockmgr.Exclusive, true)
		if err != nil {
			t.Error(err)
			close(gotX)
			return
		}
		gotX <- time.Now()
		_ = l
	}()
	time.Sleep(2 * time.Second) // the watcher sees a couple of heartbeats
	killed := time.Now()
	if err := h.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-h.Done
	lastBeat := emu.LastHeartbeat(t, prefix, "crashing-host")

	poller := newBackend(t, emu, withPrefix)
	var gotY time.Time
	tries := 0
	for gotY.IsZero() {
		tries++
		_, err := poller.Claim(ctx, dirLock("y"), lockmgr.Exclusive, false)
		switch {
		case err == nil:
			gotY = time.Now()
		case errors.Is(err, lockmgr.ErrWouldBlock):
			if time.Since(killed) > 2*testTTL+10*time.Second {
				t.Fatalf("y not taken over %v after the kill", time.Since(killed))
			}
			time.Sleep(200 * time.Millisecond)
		default:
			t.Fatal(err)
		}
	}
	tx, ok := <-gotX
	if !ok {
		t.FailNow()
	}
	dx, dy := tx.Sub(lastBeat), gotY.Sub(killed)
	t.Logf("takeover after SIGKILL (TTL %v): %v after the last heartbeat (%v after the kill) by the host that watched, "+
		"%v after the kill by a newcomer polling every 200ms (%d tries)",
		testTTL, dx.Round(time.Millisecond), tx.Sub(killed).Round(time.Millisecond), dy.Round(time.Millisecond), tries)
	takeover := testTTL + testTTL // TTL + the holder's lock-delay
	if dx < takeover-200*time.Millisecond || dx > takeover+3*time.Second {
		t.Errorf("watcher's takeover %v after the last heartbeat; want about TTL + lock-delay (%v) to that + 1s", dx, takeover)
	}
	// The newcomer may profit from the watcher's verdict (the session is
	// then marked dead in the bucket), but never precedes TTL + lock-delay.
	if d := gotY.Sub(lastBeat); d < takeover-200*time.Millisecond {
		t.Errorf("newcomer's takeover %v after the last heartbeat, before TTL + lock-delay (%v)", d, takeover)
	}
	// One of the two declares the session dead (a conditional write: the
	// other finds it dead). Mostly the watcher, whose count started before
	// the kill; but its verdict waits for its next poll, and on a slow VM
	// the newcomer's count, started right after the kill, has ended first
	// (3.049 s against 3.03 s after the kill in one CI run).
	w, p := watcher.Stats().Takeovers, poller.Stats().Takeovers
	if w+p != 1 {
		t.Errorf("the session was declared dead %d times by the watcher and %d by the newcomer, want once in all", w, p)
	}
}

// A host cut off from GCS (every request hangs, as for a frozen or
// partitioned daemon) marks its lease lost TTL-margin after its last
// refresh was sent: Done closes, the engine marks the hold lost, tells
// OnLoss, and lock calls on it fail with ErrLeaseLost. Only later does the
// other host get the lock, with a higher token; and the cut-off host,
// reconnected, releases its lost hold without disturbing the new holder.
func TestPartitionedHostLosesLease(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	px, err := faultproxy.New(emu.URL, 1, faultproxy.Faults{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	ba := newBackend(t, emu, func(c *gcsbackend.Config) { c.Endpoint = gcstest.Endpoint(px.URL) })
	lost := make(chan lockmgr.LostHold, 4)
	var (
		lmu    sync.Mutex
		lostAt time.Time
	)
	ea := newEngine(t, ba, func(h lockmgr.LostHold) {
		lmu.Lock()
		if lostAt.IsZero() {
			lostAt = time.Now()
		}
		lmu.Unlock()
		lost <- h
	})
	eb := newEngine(t, newBackend(t, emu, nil), nil)
	ctx := ctxT(t, 60*time.Second)

	ga, err := ea.Acquire(ctx, request("p", lockmgr.Exclusive, 1, false))
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan lockmgr.Grant, 1)
	var grantedAt time.Time
	go func() {
		g, err := eb.Acquire(ctx, request("p", lockmgr.Exclusive, 2, true))
		if err != nil {
			t.Error(err)
		}
		grantedAt = time.Now()
		granted <- g
	}()
	expectNoGrant(t, granted, 1500*time.Millisecond)
	cut := time.Now()
	px.SetBlackhole(true)

	// Every hold of the host is lost with its session; wait for p's.
	var h lockmgr.LostHold
	for h.Lock != dirLock("p") {
		select {
		case h = <-lost:
		case <-time.After(testTTL):
			t.Fatal("the cut-off host did not mark its hold on p lost within the TTL")
		}
	}
	t.Logf("cut-off host lost %s %v after the cut", h.Lock, time.Since(cut).Round(time.Millisecond))
	if !errors.Is(h.Err, lockmgr.ErrLeaseLost) {
		t.Errorf("loss cause %v", h.Err)
	}
	if _, err := ea.Acquire(ctx, request("p", lockmgr.Exclusive, 1, false)); !errors.Is(err, lockmgr.ErrLeaseLost) {
		t.Errorf("lock call on the lost hold: %v, want ErrLeaseLost", err)
	}
	var gb lockmgr.Grant
	select {
	case gb = <-granted:
	case <-time.After(2 * testTTL):
		t.Fatal("the other host was not granted")
	}
	lmu.Lock()
	defer lmu.Unlock()
	t.Logf("other host granted %v after the cut, %v after the loss; tokens %#x -> %#x",
		grantedAt.Sub(cut).Round(time.Millisecond), grantedAt.Sub(lostAt).Round(time.Millisecond), ga.Token, gb.Token)
	if !grantedAt.After(lostAt) {
		t.Errorf("granted at %v, before the holder knew its loss at %v", grantedAt, lostAt)
	}
	if gb.Token <= ga.Token {
		t.Errorf("new holder's token %#x not above the lost holder's %#x", gb.Token, ga.Token)
	}
	px.SetBlackhole(false)
	if err := ea.Release(ctx, dirLock("p"), ownerOf(1)); err != nil {
		t.Errorf("release of the lost hold: %v", err)
	}
	// The new holder keeps the lock.
	if _, err := ea.Acquire(ctx, request("p", lockmgr.Shared, 3, false)); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Errorf("after the lost host's release: %v, want ErrWouldBlock", err)
	}
}

// startHolder runs the test binary as another host that claims locks (a
// comma-separated list) exclusively, in a session of its own, and returns
// it once it holds them, with its first lock's token; its further output
// lines come on the child's Lines.
func startHolder(t *testing.T, emu *gcstest.Emulator, prefix, locks string) (*testutil.Child, uint64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GCSBACKEND_HELPER=hold", "GCSBACKEND_BUCKET="+emu.Bucket,
		"GCSBACKEND_PREFIX="+prefix, "GCSBACKEND_ENDPOINT="+emu.Endpoint(),
		"GCSBACKEND_TTL="+testTTL.String(), "GCSBACKEND_LOCKS="+locks)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	h := testutil.StartChild(t, cmd)
	s := h.Line(30 * time.Second)
	var tok uint64
	if _, err := fmt.Sscanf(s, "held %d", &tok); err != nil {
		t.Fatalf("helper said %q", s)
	}
	return h, tok
}

// A holder stopped with SIGSTOP past its TTL (heartbeats and all): the other
// host takes the lock over only after the holder's vouching (TTL - margin
// after its last heartbeat) ended, with a
// higher token; the resumed holder reports its lease lost at once and does
// not disturb the new holder.
func TestStoppedHolderLosesLease(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	prefix := "test/" + t.Name() + "/"
	h, tokA := startHolder(t, emu, prefix, "s")
	b := newBackend(t, emu, func(c *gcsbackend.Config) { c.Prefix = prefix })
	ctx := ctxT(t, 60*time.Second)
	if _, err := b.Claim(ctx, dirLock("s"), lockmgr.Exclusive, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("claim while the other host holds s: %v", err)
	}
	stopped := time.Now()
	if err := h.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // a heartbeat in flight lands
	lastBeat := emu.LastHeartbeat(t, prefix, "crashing-host")
	l, err := b.Claim(ctx, dirLock("s"), lockmgr.Exclusive, true)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	tokB, err := l.NextToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	if err := h.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-h.Lines:
		t.Logf("stopped holder, resumed: %q after %v", s, time.Since(resumed).Round(time.Millisecond))
		if !strings.HasPrefix(s, "lost ") || !strings.Contains(s, "lease lost") {
			t.Errorf("helper said %q, want its loss", s)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the resumed holder did not report its lease lost")
	}
	t.Logf("granted %v after SIGSTOP, %v after the last heartbeat; tokens %#x -> %#x", granted.Sub(stopped).Round(time.Millisecond),
		granted.Sub(lastBeat).Round(time.Millisecond), tokA, tokB)
	if d := granted.Sub(lastBeat); d < testTTL-testTTL/10 {
		t.Errorf("granted %v after the last heartbeat, before the holder's vouching could have ended", d)
	}
	if tokB <= tokA {
		t.Errorf("new token %#x not above the stopped holder's %#x", tokB, tokA)
	}
	time.Sleep(1500 * time.Millisecond) // the resumed holder's refresher has run
	if err := l.Err(); err != nil {
		t.Errorf("new holder's lease after the old one resumed: %v", err)
	}
}

func expectNoGrant(t *testing.T, c <-chan lockmgr.Grant, d time.Duration) {
	t.Helper()
	select {
	case <-c:
		t.Fatal("granted while another host holds the lock")
	case <-time.After(d):
	}
}
