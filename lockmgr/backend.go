package lockmgr

import (
	"context"
	"fmt"
	"strings"
	"time"
)

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
	// ListClaims returns every claim of any host on id.
	ListClaims(ctx context.Context, id LockID) ([]ClaimRecord, error)
}

// ClaimRecord is one host's claim on a lock as a ClaimLister shows it.
type ClaimRecord struct {
	// Host names the claiming host (QuoteName'd where it needs quotes).
	Host string
	Mode Mode
	// Since is when the claim was taken, on the claiming host's clock.
	Since time.Time
	// Session is the claiming host's session.
	Session string
	// State is the session's as the listing host judges it: "live",
	// "stale" (seen unchanged for its stale period) or "dead".
	State string
	// Use is "held" or "warm" for the listing host's own claim, and
	// "claimed" for another host's (it keeps warm claims without telling).
	Use string
	// DelayUntil, for a dead session's claim, is when its lock-delay ends
	// (on the listing host's clock): until then the claim still keeps
	// others out. Zero if none is running.
	DelayUntil time.Time
}

// String renders c as one line, the form of a status file's claim lines:
// "host=H mode=M since=T session=S state=S use=U", and
// " lock-delay-until=T" while a dead session's lock-delay runs.
func (c ClaimRecord) String() string {
	s := fmt.Sprintf("host=%s mode=%s since=%s session=%s state=%s use=%s",
		c.Host, c.Mode, c.Since.UTC().Format(time.RFC3339), c.Session, c.State, c.Use)
	if !c.DelayUntil.IsZero() {
		s += " lock-delay-until=" + c.DelayUntil.UTC().Format(time.RFC3339)
	}
	return s
}

// ParseClaimRecord reads a line of ClaimRecord.String's form. Fields it
// does not know are skipped, and a field it cannot read is left zero.
func ParseClaimRecord(line string) ClaimRecord {
	var c ClaimRecord
	for _, f := range strings.Fields(line) {
		key, v, _ := strings.Cut(f, "=")
		switch key {
		case "host":
			c.Host = v
		case "mode":
			if m, err := ParseMode(v); err == nil {
				c.Mode = m
			}
		case "since":
			if t, err := time.Parse(time.RFC3339, v); err == nil {
				c.Since = t
			}
		case "session":
			c.Session = v
		case "state":
			c.State = v
		case "use":
			c.Use = v
		case "lock-delay-until":
			if t, err := time.Parse(time.RFC3339, v); err == nil {
				c.DelayUntil = t
			}
		}
	}
	return c
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

// ContendedLease is implemented by a lease whose backend can learn that
// someone outside this engine waits for a conflicting claim.
type ContendedLease interface {
	// Contended returns a channel that is closed once the backend knows
	// that someone outside this engine waits for a claim that conflicts
	// with this lease; nil if the backend cannot tell.
	//
	// The engine asks at most once per lease, under its mutex, only when
	// a local request waits for or shares the lease: Contended must not
	// block, and the backend may start watching then (and stop at
	// Release). Once the channel is closed, the engine hands the lease to
	// no new local request and releases it when its holds end; Release of
	// such a lease must give the claim up at once (not keep it warm or
	// cached), and the backend's next claim of the lock should queue behind
	// the waiter rather than overtake it.
	Contended() <-chan struct{}
}

// LossNotifier is implemented by a lease that can call a function when it
// is lost, so that the engine needs no goroutine per lease to wait on Done
// (with 100,000 leases held, those goroutines' stacks alone were 2 KiB per
// lease).
type LossNotifier interface {
	// OnLost arranges for f to be called once, in a goroutine of its own,
	// when the lease is lost (at once if it already is), unless the
	// returned stop is called first. It must not block; f is called
	// without any lock of the lease held.
	OnLost(f func()) (stop func())
}

// LeaseDescriber is implemented by leases that have a state worth showing in
// status output (the gcs backend's expiry, for example).
type LeaseDescriber interface {
	Describe() string
}
