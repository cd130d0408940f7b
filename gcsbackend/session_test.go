package gcsbackend_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// A host whose heartbeats stall loses every claim at once: each holder is
// told (OnLoss) and its lock calls fail with ErrLeaseLost; another host,
// waiting for all of them, gets them about the TTL after the last
// heartbeat, never before (generous bounds: [TTL-0.1s, TTL+4s]); and the
// host, its heartbeats back, starts a new session for its next lock. The
// control is the other host being refused while the heartbeats run.
func TestPausedSessionLosesEverything(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	ba := newBackend(t, emu, nil)
	var (
		lmu  sync.Mutex
		lost = map[lockmgr.LockID]time.Time{}
	)
	ea := newEngine(t, ba, func(h lockmgr.LostHold) {
		lmu.Lock()
		lost[h.Lock] = time.Now()
		lmu.Unlock()
	})
	bb := newBackend(t, emu, nil)
	ctx := ctxT(t, 60*time.Second)
	paths := []string{"s/a", "s/b/c", "t"}
	for i, p := range paths {
		if _, err := ea.Acquire(ctx, request(p, lockmgr.Exclusive, 10+i, false)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond) // across a heartbeat
	for _, p := range paths {
		if _, err := bb.Claim(ctx, dirLock(p), lockmgr.Shared, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
			t.Fatalf("control: B's claim on %s while A heartbeats: %v, want ErrWouldBlock", p, err)
		}
	}
	oldSession := ba.SessionID()
	ba.PauseHeartbeats(true)
	time.Sleep(50 * time.Millisecond) // a heartbeat in flight lands
	lastBeat := emu.LastHeartbeat(t, ba.Config().Prefix, ba.HostID())
	got := make(chan time.Time, len(paths))
	for _, p := range paths {
		go func() {
			l, err := bb.Claim(ctx, dirLock(p), lockmgr.Exclusive, true)
			if err != nil {
				t.Error(err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			_ = l
		}()
	}
	var first, last time.Time
	for range paths {
		at := <-got
		if at.IsZero() {
			t.FailNow()
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
		// TTL + A's lock-delay (its default, the TTL).
		if d := at.Sub(lastBeat); d < 2*testTTL-100*time.Millisecond || d > 2*testTTL+4*time.Second {
			t.Errorf("B granted %v after A's last heartbeat; want about TTL + lock-delay (%v), never before", d, 2*testTTL)
		}
		last = at
	}
	t.Logf("B holds all %d locks %v after A's last heartbeat", len(paths), last.Sub(lastBeat).Round(time.Millisecond))
	lmu.Lock()
	if len(lost) != len(paths) {
		t.Errorf("A's holders told of %d losses, want %d: %v", len(lost), len(paths), lost)
	}
	for id, at := range lost {
		// The host stops vouching TTL-margin after its last heartbeat,
		// before anyone may take its locks.
		if !at.Before(first) {
			t.Errorf("A's hold on %s marked lost %v after the last heartbeat, not before B's first grant (%v)",
				id, at.Sub(lastBeat), first.Sub(lastBeat))
		}
	}
	lmu.Unlock()
	if _, err := ea.Acquire(ctx, request(paths[0], lockmgr.Exclusive, 10, false)); !errors.Is(err, lockmgr.ErrLeaseLost) {
		t.Errorf("lock call on a lost hold: %v, want ErrLeaseLost", err)
	}
	for i, p := range paths {
		if err := ea.Release(ctx, dirLock(p), ownerOf(10+i)); err != nil {
			t.Errorf("release of the lost hold on %s: %v", p, err)
		}
	}
	ba.PauseHeartbeats(false)
	if _, err := ea.Acquire(ctx, request("u", lockmgr.Exclusive, 20, false)); err != nil {
		t.Fatalf("A's next lock: %v", err)
	}
	if s := ba.SessionID(); s == "" || s == oldSession || ba.Stats().Sessions != 2 {
		t.Errorf("A's session after the loss: %q (was %q), %d sessions; want a second one", s, oldSession, ba.Stats().Sessions)
	}
}

// Objects of a layout this lockfs does not speak are refused with an error
// wrapping ErrLayout (and ErrUnavailable: ENOLCK), and never misread: a
// layout-1 object with a live entry, and a layout-3 object. The control is
// a layout-1 object without entries, which is taken over keeping its
// epoch: the new grant's token is above every token of the old layout.
func TestLayoutVersionRefused(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	b := newBackend(t, emu, nil)
	ctx := ctxT(t, 30*time.Second)
	put := func(id lockmgr.LockID, body string) {
		t.Helper()
		w := emu.Client(t).Bucket(emu.Bucket).Object(b.ObjectName(id)).NewWriter(ctx)
		w.ContentType = "application/json"
		if _, err := w.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	old := dirLock("old")
	put(old, `{"v":1,"lock":"old/.lock","epoch":7,"write":"x","holders":[{"claim":"c.1","host":"old-host","mode":"shared","seq":3,"epoch":7}]}`+"\n")
	newer := dirLock("newer")
	put(newer, `{"v":3,"lock":"newer/.lock","epoch":1}`+"\n")
	empty := dirLock("empty")
	put(empty, `{"v":1,"lock":"empty/.lock","epoch":41,"write":"x","holders":[]}`+"\n")

	for _, id := range []lockmgr.LockID{old, newer} {
		_, err := b.Claim(ctx, id, lockmgr.Exclusive, false)
		if !errors.Is(err, gcsbackend.ErrLayout) || !errors.Is(err, lockmgr.ErrUnavailable) {
			t.Fatalf("claim of %s: %v; want an error wrapping ErrLayout and ErrUnavailable", id, err)
		}
		t.Logf("%s refused: %v", id, err)
		if !strings.Contains(err.Error(), "layout version") {
			t.Errorf("error %q does not say what is wrong", err)
		}
	}
	// An exclusive claim on the parent lists the layout-1 object below and
	// is refused too.
	if _, err := b.Claim(ctx, dirLock("."), lockmgr.Exclusive, false); !errors.Is(err, gcsbackend.ErrLayout) {
		t.Fatalf("exclusive claim of the root above a layout-1 claim: %v, want ErrLayout", err)
	}
	l, err := b.Claim(ctx, empty, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatalf("control: layout-1 object without entries: %v", err)
	}
	tok, err := l.NextToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tok>>20 <= 41 {
		t.Errorf("token %#x after taking over a layout-1 object at epoch 41: epoch not kept", tok)
	}
	_, _, _, err = b.ReadRecord(ctx, b.ObjectName(empty))
	if err != nil {
		t.Fatalf("the taken-over object does not read back as layout 2: %v", err)
	}
	attrs, err := emu.Client(t).Bucket(emu.Bucket).Object(b.ObjectName(empty)).Attrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if attrs.Metadata["lockfs-v"] != "2" {
		t.Errorf("metadata %v: no layout version", attrs.Metadata)
	}
}

// Every host's claims on a lock are shown from one read: host B's status
// of a lock that A holds (and that B does not hold at all) names A's host,
// mode and live session; B's own warm record shows as warm.
func TestRemoteHoldersInStatus(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	a := newBackend(t, emu, nil)
	b := newBackend(t, emu, nil)
	ea, eb := newEngine(t, a, nil), newEngine(t, b, nil)
	ctx := ctxT(t, 30*time.Second)
	if _, err := ea.Acquire(ctx, request("r", lockmgr.Shared, 1, false)); err != nil {
		t.Fatal(err)
	}
	s0 := b.Stats()
	claims, err := eb.Claims(ctx, dirLock("r"))
	if err != nil {
		t.Fatal(err)
	}
	if d := b.Stats().Sub(s0); d.Requests() != 1 {
		t.Errorf("status made %d requests, want 1", d.Requests())
	}
	t.Logf("B's view of r: %q", claims)
	if len(claims) != 1 || claims[0].Host != a.HostID() || claims[0].Mode != lockmgr.Shared ||
		claims[0].State != "live" || claims[0].Use != "claimed" {
		t.Fatalf("B's view of A's claim: %q", claims)
	}
	// B takes it too, releases it: B's record stays warm, and says so.
	if _, err := eb.Acquire(ctx, request("r", lockmgr.Shared, 2, false)); err != nil {
		t.Fatal(err)
	}
	if err := eb.Release(ctx, dirLock("r"), ownerOf(2)); err != nil {
		t.Fatal(err)
	}
	claims, err = eb.Claims(ctx, dirLock("r"))
	if err != nil {
		t.Fatal(err)
	}
	warm := 0
	for _, c := range claims {
		if c.Host == b.HostID() && c.Use == "warm" {
			warm++
		}
	}
	if len(claims) != 2 || warm != 1 {
		t.Fatalf("after B's release: %q; want A's claim and B's warm one", claims)
	}
	// Control: a lock nobody claimed shows no claim.
	if claims, err := eb.Claims(ctx, dirLock("nobody")); err != nil || len(claims) != 0 {
		t.Fatalf("unclaimed lock: %q, %v", claims, err)
	}
}

// Lock-delay: a session whose heartbeats stall is declared dead about a TTL
// after its last heartbeat, and its records keep other hosts out for its
// lock-delay more; meanwhile the waiting host shows the record's session
// dead with the delay's end, and counts the delay. Control: with the
// lock-delay off, the waiter is granted about a TTL after the last
// heartbeat.
func TestLockDelay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration // A's Config.LockDelay
		want  time.Duration // after A's last heartbeat
	}{
		{"delay-2s", 2 * time.Second, testTTL + 2*time.Second},
		{"control-off", -1, testTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			emu := gcstest.Start(t)
			ba := newBackend(t, emu, func(c *gcsbackend.Config) { c.LockDelay = tc.delay })
			bb := newBackend(t, emu, nil) // its own lock-delay (the TTL) does not matter: A's does
			ctx := ctxT(t, 60*time.Second)
			if _, err := ba.Claim(ctx, dirLock("d"), lockmgr.Exclusive, false); err != nil {
				t.Fatal(err)
			}
			ba.PauseHeartbeats(true)
			time.Sleep(50 * time.Millisecond) // a heartbeat in flight lands
			lastBeat := emu.LastHeartbeat(t, ba.Config().Prefix, ba.HostID())
			got := make(chan error, 1)
			go func() {
				l, err := bb.Claim(ctx, dirLock("d"), lockmgr.Exclusive, true)
				if err == nil {
					err = l.Release(ctx)
				}
				got <- err
			}()
			var shown []lockmgr.ClaimRecord
			for {
				select {
				case err := <-got:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(100 * time.Millisecond):
					if cs, err := bb.ListClaims(ctx, dirLock("d")); err == nil && len(cs) == 1 && cs[0].State == "dead" && shown == nil {
						shown = cs
					}
					continue
				}
				break
			}
			d := time.Since(lastBeat)
			t.Logf("B granted %v after A's last heartbeat (TTL %v, A's lock-delay %v); B's status of the dead record: %v",
				d.Round(time.Millisecond), testTTL, tc.delay, shown)
			if d < tc.want-100*time.Millisecond || d > tc.want+3*time.Second {
				t.Errorf("B granted %v after A's last heartbeat; want about %v, never before", d, tc.want)
			}
			delays := bb.Stats().LockDelays
			if tc.delay > 0 {
				if len(shown) != 1 || shown[0].DelayUntil.IsZero() || !strings.Contains(shown[0].String(), " lock-delay-until=") {
					t.Errorf("B's status during the lock-delay: %v, want the dead session's claim with its lock-delay's end", shown)
				}
				if delays != 1 {
					t.Errorf("B counted %d lock-delays, want 1", delays)
				}
			} else if delays != 0 {
				t.Errorf("control: B counted %d lock-delays with A's off", delays)
			}
		})
	}
}
