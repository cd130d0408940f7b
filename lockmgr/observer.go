package lockmgr

import (
	"context"
	"errors"
	"time"
)

// Outcome is how a request ended, for an Observer.
type Outcome uint8

const (
	// Granted: the lock was granted (after Wait, if it waited).
	Granted Outcome = iota + 1
	// Conflict: a non-blocking request found the lock held (ErrWouldBlock).
	Conflict
	// Deadlock: the request was refused with ErrDeadlock.
	Deadlock
	// Interrupted: a blocking wait ended because its context ended.
	Interrupted
	// Failed: any other error (ErrInvalid, ErrLeaseLost, ErrUnavailable, ErrClosed).
	Failed
	// Denied: the caller lacks permission on the directory (EACCES). The
	// engine never answers it: the FUSE layer checks permissions before it
	// asks, and reports its refusals to the same Observer.
	Denied
)

// String names the outcome as metrics label it.
func (o Outcome) String() string {
	switch o {
	case Granted:
		return "granted"
	case Conflict:
		return "conflict"
	case Deadlock:
		return "deadlock"
	case Interrupted:
		return "interrupted"
	case Failed:
		return "failed"
	case Denied:
		return "denied"
	}
	return "unknown"
}

// Observer is told about every request, every lost hold and every lease
// given up for a waiter outside, for metrics. Its methods must be fast and
// must not call back into the engine: Requested is called with Engine.mu
// released, but Lost and Yielded are called with Engine.mu held.
type Observer interface {
	// Requested reports a finished Acquire: the request, its grant (zero
	// unless granted), its outcome, and how long it took (the wait, for
	// blocking requests).
	Requested(req Request, g Grant, outcome Outcome, took time.Duration)
	// Lost reports a hold marked lost; broken says an operator broke it.
	Lost(id LockID, broken bool)
	// Yielded reports that the engine learned that someone outside it
	// (another host, another daemon over the same SOURCE, a program
	// locking SOURCE directly) waits for a lock it holds under continuous
	// local demand: the lease is handed to no new local request and goes
	// when the holds running end (lease.go; status says "yielding"). Once
	// per lease.
	Yielded(id LockID)
}

// outcomeOf classifies an Acquire error.
func outcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return Granted
	case errors.Is(err, ErrWouldBlock):
		return Conflict
	case errors.Is(err, ErrDeadlock):
		return Deadlock
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Interrupted
	}
	return Failed
}
