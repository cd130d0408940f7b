package gcsbackend_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/faultproxy"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

func TestConfigValidate(t *testing.T) {
	ok := gcsbackend.DefaultConfig("b")
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if ok.TTL != 30*time.Second || ok.RefreshInterval != 10*time.Second || ok.Margin != 3*time.Second ||
		!strings.Contains(ok.HostID, "-") {
		t.Errorf("defaults: %+v", ok)
	}
	for _, c := range []struct {
		name string
		cfg  gcsbackend.Config
		want string
	}{
		{"no bucket", gcsbackend.Config{}, "Bucket"},
		{"tiny TTL", gcsbackend.Config{Bucket: "b", TTL: time.Millisecond}, "TTL"},
		{"refresh too slow", gcsbackend.Config{Bucket: "b", TTL: 10 * time.Second, RefreshInterval: 5 * time.Second}, "refresh"},
		{"margin too wide", gcsbackend.Config{Bucket: "b", TTL: 10 * time.Second, Margin: 3 * time.Second}, "margin"},
		{"request outlives the lease", gcsbackend.Config{Bucket: "b", TTL: 10 * time.Second, RequestTimeout: 9500 * time.Millisecond}, "request timeout"},
		{"unprintable host", gcsbackend.Config{Bucket: "b", HostID: "a\nb"}, "HostID"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %s", c.name, err, c.want)
		}
	}
}

// SPEC §7: an emulator only when the endpoint names one.
func TestEmulatorHostVariableRefused(t *testing.T) {
	t.Setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:1")
	_, err := gcsbackend.New(context.Background(), gcsbackend.Config{Bucket: "b"})
	if err == nil || !strings.Contains(err.Error(), "STORAGE_EMULATOR_HOST") {
		t.Fatalf("New with STORAGE_EMULATOR_HOST and no endpoint: %v", err)
	}
	// Control: naming the endpoint is allowed.
	b, err := gcsbackend.New(context.Background(), gcsbackend.Config{Bucket: "b", Endpoint: "http://127.0.0.1:1/storage/v1/"})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
}

func TestObjectNames(t *testing.T) {
	for _, c := range []struct {
		id   lockmgr.LockID
		want string
	}{
		{lockmgr.LockID{Path: ".", Kind: lockmgr.KindDir}, "p/locks/.lock"},
		{lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindNewDir}, "p/locks/a/b/.lock_newdir"},
		{lockmgr.LockID{Path: "x y/é~%", Kind: lockmgr.KindUsage}, "p/locks/x~20y/~C3~A9~7E~25/.lock_usage"},
	} {
		got, err := gcsbackend.ObjectNameForTest("p/", c.id)
		if err != nil || got != c.want {
			t.Errorf("%v: %q, %v; want %q", c.id, got, err, c.want)
		}
	}
	long := strings.Repeat("d/", 600) + "e"
	got, err := gcsbackend.ObjectNameForTest("", lockmgr.LockID{Path: long, Kind: lockmgr.KindDir})
	if err != nil || !strings.HasPrefix(got, "locks/d/d/") || !strings.Contains(got, "/~long/") || len(got) > 1024 {
		t.Errorf("long path: %q, %v", got, err)
	}
	if _, err := gcsbackend.ObjectNameForTest("", lockmgr.LockID{Path: "a/../b", Kind: lockmgr.KindDir}); err == nil {
		t.Error("unclean path accepted")
	}
}

// A clean Close releases every claim: the other host gets each at once.
func TestCloseReleases(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	a := newBackend(t, emu, nil)
	b := newBackend(t, emu, nil)
	ctx := ctxT(t, 30*time.Second)
	ids := []lockmgr.LockID{dirLock("c1"), dirLock("c2"), {Path: "c3", Kind: lockmgr.KindNewDir}}
	for i, id := range ids {
		mode := lockmgr.Exclusive
		if i == 2 {
			mode = lockmgr.Shared
		}
		if _, err := a.Claim(ctx, id, mode, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Claim(ctx, ids[0], lockmgr.Exclusive, false); err == nil {
		t.Fatal("control: claimed while held")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := b.Claim(ctx, id, lockmgr.Exclusive, false); err != nil {
			t.Errorf("after the holder's Close: %v", err)
		}
		if _, _, holders, err := a.ReadRecord(ctx, a.ObjectName(id)); err != nil || len(holders) != 1 {
			t.Errorf("%s holders %v, %v; want only the new one", id, holders, err)
		}
	}
	if _, err := a.Claim(ctx, dirLock("c4"), lockmgr.Shared, false); err == nil {
		t.Error("claim after Close succeeded")
	}
}

// GCS answering nothing but 503: a claim gives up with ErrUnavailable
// (ENOLCK) after 3s without wait, after UnavailableAfter with it; once GCS
// answers again, the same claim succeeds (the control).
func TestUnavailable(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	px, err := faultproxy.New(emu.URL, 3, faultproxy.Faults{Unavailable: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	b := newBackend(t, emu, func(c *gcsbackend.Config) {
		c.Endpoint = gcstest.Endpoint(px.URL)
		c.UnavailableAfter = 5 * time.Second
	})
	ctx := ctxT(t, 30*time.Second)
	for _, c := range []struct {
		wait bool
		want time.Duration
	}{{false, 3 * time.Second}, {true, 5 * time.Second}} {
		start := time.Now()
		_, err := b.Claim(ctx, dirLock("u"), lockmgr.Exclusive, c.wait)
		d := time.Since(start)
		t.Logf("wait=%v: %v after %v", c.wait, err, d.Round(time.Millisecond))
		if !errors.Is(err, lockmgr.ErrUnavailable) || d < c.want || d > c.want+2*time.Second {
			t.Errorf("wait=%v: %v after %v; want ErrUnavailable after about %v", c.wait, err, d, c.want)
		}
	}
	px.SetFaults(faultproxy.Faults{})
	if _, err := b.Claim(ctx, dirLock("u"), lockmgr.Exclusive, false); err != nil {
		t.Fatalf("control, GCS back: %v", err)
	}
}
