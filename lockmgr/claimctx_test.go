package lockmgr

import (
	"context"
	"errors"
	"testing"
	"time"
)

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
