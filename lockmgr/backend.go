package lockmgr

import "context"

// Backend holds the host's claim on locks: the engine arbitrates between the
// processes of this host, and asks the backend for one claim per lock, in the
// strongest mode any local holder needs, shared by all of them. The local
// backend keeps claims in the host's kernel flock table; the gcs backend keeps
// them as leases in a bucket, so that many hosts share one namespace.
//
// The engine calls at most one of Claim, Convert and Release per lock at a
// time, never while holding its mutex. NextToken may run concurrently with
// any of them and with itself: the backend makes it safe.
type Backend interface {
	// Claim takes the host's claim on id in mode. With wait it blocks until
	// the claim is granted or ctx ends (returning ctx.Err()); without, it
	// returns ErrWouldBlock at once if another host or process holds a
	// conflicting claim. ErrUnavailable means the backend could not be reached.
	Claim(ctx context.Context, id LockID, mode Mode, wait bool) (Lease, error)
	// Close releases every claim still held and stops the backend's
	// goroutines. The engine calls it once, last.
	Close() error
}

// HierarchicalBackend is implemented by a backend that enforces the
// hierarchy across hosts by itself: its claim on D is granted only if no
// other host holds a conflicting claim on an ancestor of D (or, for D's
// new-dir and usage locks, on D's directory lock), nor, for an exclusive
// directory claim, on anything inside D. The engine then takes a request's
// implicit holds (the shared holds on the ancestors, and on D's directory
// lock for the new-dir and usage kinds) locally only, with no claim, and
// asks such a backend for the lock's own claim alone, in the strongest mode
// the host's explicit holds need. Within the host the engine still
// arbitrates every hold, implicit ones included.
type HierarchicalBackend interface {
	Backend
	// ClaimsHierarchy reports whether the backend checks the hierarchy
	// itself. It is asked once, by New.
	ClaimsHierarchy() bool
}

// ClaimLister is implemented by a backend that can show every host's
// claims on a lock (the gcs backend, from one read of the lock's object).
type ClaimLister interface {
	// ListClaims returns one line per claim of any host on id, in the
	// form "host=H mode=M since=T session=S state=live|stale|dead
	// use=held|warm|claimed".
	ListClaims(ctx context.Context, id LockID) ([]string, error)
}

// Lease is the host's claim on one lock.
type Lease interface {
	// Mode is the mode the claim is held in; 0 once lost or released.
	Mode() Mode
	// Convert changes the claim's mode. A downgrade never waits. An upgrade
	// that cannot be granted at once returns ErrWouldBlock without wait;
	// with wait it blocks until granted or ctx ends. If the claim cannot be
	// kept at its old mode meanwhile, Convert returns ErrLeaseLost and the
	// lease is dead.
	Convert(ctx context.Context, mode Mode, wait bool) error
	// NextToken returns a fencing token for a new grant on this lock,
	// strictly greater than every token handed out before for it, by any
	// host or daemon, across restarts.
	NextToken(ctx context.Context) (uint64, error)
	// Done returns a channel that is closed when the lease is lost, or nil
	// if this lease cannot be lost asynchronously. (A lease whose Done is nil
	// may still die synchronously, when Convert returns ErrLeaseLost; Done
	// then returns a closed channel.)
	Done() <-chan struct{}
	// Err says why the lease was lost, once Done is closed; nil before.
	Err() error
	// Release gives the claim up. The lease is unusable afterwards.
	Release(ctx context.Context) error
}

// LeaseDescriber is implemented by leases that have a state worth showing in
// status output (the gcs backend's expiry, for example).
type LeaseDescriber interface {
	Describe() string
}
