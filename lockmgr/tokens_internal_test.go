package lockmgr

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Deferred tokens against a backend whose NextToken can be held up
// (memHost.tokenGate): what happens while one is being issued.

func tokenTestEngine(t *testing.T) (*Engine, *memHost) {
	t.Helper()
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	e := newTestEngine(t, tree, host)
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e, host
}

func dirLock(p string) LockID { return LockID{Path: p, Kind: KindDir} }

// tokenOf is the token StatusTokens shows for owner's explicit hold on id.
func tokenOf(e *Engine, id LockID, owner Owner) uint64 {
	for _, h := range e.StatusTokens(id).Holders {
		if h.Explicit && h.Owner == owner {
			return h.Token
		}
	}
	return 0
}

// holdUpTokenRead makes the backend's NextToken on id wait until the
// returned gate is closed, starts a status read of owner's token on id,
// and returns once that read is waiting in NextToken; the read's result
// comes on the returned channel.
func holdUpTokenRead(t *testing.T, e *Engine, host *memHost, id LockID, owner Owner) (chan<- struct{}, <-chan uint64) {
	t.Helper()
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	host.mu.Lock()
	host.tokenGate, host.tokenGateLock, host.tokenEntered = gate, id, entered
	host.mu.Unlock()
	read := make(chan uint64, 1)
	go func() { read <- tokenOf(e, id, owner) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the status read did not ask for the token")
	}
	host.mu.Lock()
	host.tokenEntered = nil
	host.mu.Unlock()
	return gate, read
}

// A token issued for a grant that ended while it was being issued is not
// recorded for the hold's next grant: here the hold stays (for a lock
// below) while its explicit grant is released and made again, so only the
// grant's number tells the two apart. Control: the token of the grant
// before, 1, would be shown for the new grant.
func TestDeferredTokenOfEndedGrantIsDropped(t *testing.T) {
	e, host := tokenTestEngine(t)
	ctx := context.Background()
	owner := Owner{Class: OwnerFile, ID: 1}
	a := dirLock("a")
	for _, id := range []LockID{dirLock("a/b"), a} {
		if _, err := e.Acquire(ctx, Request{Lock: id, Mode: Shared, Owner: owner, TID: 100, DeferToken: true}); err != nil {
			t.Fatal(err)
		}
	}
	gate, read := holdUpTokenRead(t, e, host, a, owner)
	// While NextToken is held up: the grant ends and a new one is made.
	if err := e.Release(ctx, a, owner); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Acquire(ctx, Request{Lock: a, Mode: Shared, Owner: owner, TID: 100, DeferToken: true}); err != nil {
		t.Fatal(err)
	}
	close(gate)
	select {
	case tok := <-read:
		// The first token (1) belonged to the ended grant; the reading
		// issued the new grant's in its next round.
		if tok != 2 {
			t.Fatalf("status read across the new grant shows token %d, want 2", tok)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the status read did not return")
	}
	if tok, err := e.Token(a, owner); err != nil || tok != 2 {
		t.Fatalf("Token = %d, %v; want 2", tok, err)
	}
}

// A token that cannot be issued (NextToken held up past tokenTimeout)
// holds up neither the readers of other locks nor, for longer than the
// timeout, its own: it reads 0 and is issued at a later reading.
func TestStuckTokenHoldsUpNobodyElse(t *testing.T) {
	e, host := tokenTestEngine(t)
	e.tokenTimeout = 200 * time.Millisecond
	ctx := context.Background()
	owner := Owner{Class: OwnerFile, ID: 1}
	a, c := dirLock("a"), dirLock("c")
	for _, id := range []LockID{a, c} {
		if _, err := e.Acquire(ctx, Request{Lock: id, Mode: Exclusive, Owner: owner, TID: 100, DeferToken: true}); err != nil {
			t.Fatal(err)
		}
	}
	gate, read := holdUpTokenRead(t, e, host, a, owner)
	// Meanwhile another lock's token is issued at once.
	if tok := tokenOf(e, c, owner); tok != 1 {
		t.Fatalf("token of c while a's is held up: %d, want 1", tok)
	}
	select {
	case tok := <-read:
		if tok != 0 {
			t.Fatalf("held-up token read %d, want 0", tok)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the status read of a did not end at its timeout")
	}
	if _, err := e.Token(a, owner); err == nil {
		t.Fatal("Token of a held-up token succeeded")
	}
	// Once NextToken answers again, the next reading issues it.
	host.mu.Lock()
	host.tokenGate = nil
	host.mu.Unlock()
	close(gate)
	if tok := tokenOf(e, a, owner); tok != 1 {
		t.Fatalf("token of a at the next reading: %d, want 1", tok)
	}
}

// A token being issued when the engine closes: the issuance ends with the
// engine's context and Token returns, with ErrClosed, or ErrNotHeld once
// Close has released the hold. Control: with the issuance's context not
// derived from the engine's, Token waits out its minute.
func TestTokenEndsAtClose(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	e := newTestEngine(t, tree, host)
	// Far beyond the wait below: only Close can end the issuance in time.
	e.tokenTimeout = time.Minute
	ctx := context.Background()
	owner := Owner{Class: OwnerFile, ID: 1}
	a := dirLock("a")
	if _, err := e.Acquire(ctx, Request{Lock: a, Mode: Exclusive, Owner: owner, TID: 100, DeferToken: true}); err != nil {
		t.Fatal(err)
	}
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	defer close(gate)
	host.mu.Lock()
	host.tokenGate, host.tokenGateLock, host.tokenEntered = gate, a, entered
	host.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := e.Token(a, owner)
		done <- err
	}()
	<-entered
	host.mu.Lock()
	host.tokenEntered = nil
	host.mu.Unlock()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Token across Close: %v, want ErrClosed or ErrNotHeld", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Token did not return after Close")
	}
}
