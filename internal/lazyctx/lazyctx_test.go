package lazyctx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

func waitDone(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("context not done 10 s after its parent or stop ended")
	}
}

// TestLazy: the context is derived only when used; a cancel before that
// is applied when it is; one after cancels it; the parent's end reaches it
// once made. Control: an unused one has made nothing, so the saving is
// real.
func TestLazy(t *testing.T) {
	// Unused: nothing made, even after Cancel.
	unused := New(context.Background(), nil)
	unused.Cancel()
	if unused.Made() {
		t.Fatal("an unused context was derived")
	}
	// Cancelled before first use: done at first use.
	if !testutil.Done(unused) || unused.Err() != context.Canceled {
		t.Fatalf("cancelled before use: done %v, err %v", testutil.Done(unused), unused.Err())
	}
	if !unused.Made() {
		t.Fatal("control: Done should have made it")
	}
	// Used, then cancelled.
	used := New(context.Background(), nil)
	if testutil.Done(used) {
		t.Fatal("done before any cancel")
	}
	used.Cancel()
	if !testutil.Done(used) {
		t.Fatal("not done after Cancel")
	}
	// The parent's end reaches a made one.
	parent, stop := context.WithCancel(context.Background())
	child := New(parent, nil)
	if testutil.Done(child) {
		t.Fatal("done before the parent ended")
	}
	stop()
	if !testutil.Done(child) {
		t.Fatal("not done after the parent ended")
	}
	// Values come from the parent, and reading one makes nothing.
	type key struct{}
	withV := New(context.WithValue(context.Background(), key{}, 7), nil)
	if v, _ := withV.Value(key{}).(int); v != 7 {
		t.Fatalf("value %v, want 7", withV.Value(key{}))
	}
	if withV.Made() {
		t.Error("reading a value derived the context")
	}
	withV.Err()
	if v, _ := withV.Value(key{}).(int); v != 7 {
		t.Fatalf("value once made %v, want 7", withV.Value(key{}))
	}
	// A context derived from it is cancelled with it, made or not.
	for _, use := range []bool{false, true} {
		lc := New(context.Background(), nil)
		if use {
			lc.Err()
		}
		sub, stopSub := context.WithCancel(lc)
		lc.Cancel()
		if !testutil.Done(sub) {
			t.Errorf("a context derived from one (used first: %v) not done after its Cancel", use)
		}
		stopSub()
	}
}

// TestStop: with a stop context, it ends when the parent ends and when
// stop ends; one never looked at makes nothing, and Cancel cancels it
// either way.
func TestStop(t *testing.T) {
	for _, which := range []string{"parent", "stop"} {
		t.Run(which, func(t *testing.T) {
			parent, stop := context.Background(), context.Background()
			ended, cancel := context.WithCancel(context.Background())
			if which == "parent" {
				parent = ended
			} else {
				stop = ended
			}
			c := New(parent, stop)
			defer c.Cancel()
			done := c.Done()
			select {
			case <-done:
				t.Fatal("control: done before either ended")
			default:
			}
			cancel()
			waitDone(t, done)
			if !errors.Is(c.Err(), context.Canceled) {
				t.Fatalf("Err %v, want Canceled", c.Err())
			}
		})
	}
	t.Run("unused", func(t *testing.T) {
		c := New(context.Background(), context.Background())
		c.Cancel()
		if c.Made() {
			t.Fatal("made without a call of Done or Err")
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err after Cancel %v, want Canceled", c.Err())
		}
		if !c.Made() {
			t.Fatal("control: Err should have made it")
		}
	})
	t.Run("cancel-unregisters", func(t *testing.T) {
		stop, stopCancel := context.WithCancel(context.Background())
		c := New(context.Background(), stop)
		c.Done()
		c.Cancel()
		c.mu.Lock()
		unreg := c.unreg
		c.mu.Unlock()
		if unreg == nil {
			t.Fatal("control: a made context with a stop has no AfterFunc")
		}
		if unreg() {
			t.Error("the AfterFunc on stop was still registered after Cancel")
		}
		stopCancel()
	})
}
