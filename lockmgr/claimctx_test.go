package lockmgr

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestClaimCtxEndsWithEither: the claim's context ends when the request's
// ends and when the engine's ends; a claim that never looks at it makes
// no merge, and end cancels it either way.
func TestClaimCtxEndsWithEither(t *testing.T) {
	for _, which := range []string{"request", "engine"} {
		t.Run(which, func(t *testing.T) {
			req, stop := context.Background(), context.Background()
			ended, cancel := context.WithCancel(context.Background())
			if which == "request" {
				req = ended
			} else {
				stop = ended
			}
			c := newClaimCtx(req, stop)
			defer c.end()
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
		c := newClaimCtx(context.Background(), context.Background())
		c.end()
		if c.wasMerged() {
			t.Fatal("merged without a call of Done, Err or Value")
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err after end %v, want Canceled", c.Err())
		}
		if !c.wasMerged() {
			t.Fatal("control: Err should have made the merge")
		}
	})
	t.Run("value", func(t *testing.T) {
		type key struct{}
		c := newClaimCtx(context.WithValue(context.Background(), key{}, 7), context.Background())
		defer c.end()
		if v := c.Value(key{}); v != 7 {
			t.Fatalf("Value %v, want the request's 7", v)
		}
	})
}

func waitDone(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("context not done 10 s after its parent ended")
	}
}

// TestCloseEndsABackendWait: a request that waits inside the backend for
// another host's claim returns ErrClosed when the engine closes.
func TestCloseEndsABackendWait(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(200, 1)
	other := newTestEngine(t, tree, host) // another host, same lock table
	defer other.Close()
	e := newTestEngine(t, tree, host)
	ctx := context.Background()
	id := LockID{Path: "a", Kind: KindDir}
	if _, err := other.Acquire(ctx, Request{Lock: id, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := e.Acquire(ctx, Request{Lock: id, Mode: Exclusive, Owner: Owner{OwnerFile, 2}, TID: 200, Wait: true})
		errc <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		host.mu.Lock()
		n := len(host.parked)
		host.mu.Unlock()
		if n > 0 {
			break // it waits in the backend, not in the engine's queue
		}
		if time.Now().After(deadline) {
			t.Fatal("the request never waited in the backend")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-errc:
		t.Fatalf("control: returned before Close: %v", err)
	default:
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }() // Close waits for the backend call
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("waiter: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the backend wait did not end at Close")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// wasMerged reports whether the merge was made (tests).
func (c *claimCtx) wasMerged() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.merged != nil
}
