package fs

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"

	"github.com/lockfs/lockfs/internal/lazyctx"
)

// Interrupts.
//
// The kernel sends an InterruptRequest when a process blocked in a FUSE
// request gets a signal (flock -w timing out, Ctrl-C, SIGKILL). bazil
// (the fork) serves each request on the reader goroutine that read it and
// registers it for interruption only once serving starts, while another
// reader may already have read the interrupt: an interrupt that arrives
// right after its target can be served first, find nothing, and be dropped:
// the target then waits on, and a SIGKILLed waiter sits unkillable in D
// state until the lock is granted (FUSE-NOTES.md).
//
// interruptTracker closes that window for the requests that may block (the
// lock requests). bazil calls Config.WithContext at the start of serving
// every request, the InterruptRequest included. For a request that may
// block, the tracker derives a cancellable context and registers it under
// the request's ID; for an interrupt, it cancels the registered target or,
// if the target has not registered yet, remembers the interrupt so that the
// target is cancelled as soon as it registers. Kernel request IDs are not
// reused, so a remembered interrupt whose target never comes (it had
// already finished, or is of a kind we do not track) is harmless; it is
// dropped after pendingInterruptTTL, and at most maxPendingInterrupts are
// kept.

const (
	// pendingInterruptTTL is how long an interrupt waits for its target.
	// The target is normally at most microseconds behind.
	pendingInterruptTTL = time.Minute
	// maxPendingInterrupts bounds the memory kept for interrupts whose
	// target never came; the oldest is dropped first.
	maxPendingInterrupts = 1024
)

// interruptTracker cancels blocking requests on interrupts, in whichever
// order the two are served. It is safe for concurrent use.
type interruptTracker struct {
	// Dependencies
	now func() time.Time

	// Mutable state
	mu sync.Mutex
	// active maps the ID of a registered request in flight to its entry.
	// GUARDED_BY(mu)
	active map[fuse.RequestID]*trackedRequest
	// pending maps the target ID of an interrupt that found no registered
	// request to when it arrived. GUARDED_BY(mu)
	pending map[fuse.RequestID]time.Time
}

// trackedRequest is a registered request's way to be cancelled.
type trackedRequest struct {
	cancel context.CancelFunc
}

func newInterruptTracker(now func() time.Time) *interruptTracker {
	if now == nil {
		now = time.Now
	}
	return &interruptTracker{
		now:     now,
		active:  make(map[fuse.RequestID]*trackedRequest),
		pending: make(map[fuse.RequestID]time.Time),
	}
}

// mayBlock reports whether a request is one the tracker registers: the lock
// requests, which can wait for other processes or for the backend.
func mayBlock(req fuse.Request) bool {
	switch req.(type) {
	case *fuse.LockWaitRequest, *fuse.LockRequest:
		return true
	}
	return false
}

// withContext is fusefs.Config.WithContext. ctx is the request's context,
// which bazil cancels when the request is answered.
func (t *interruptTracker) withContext(ctx context.Context, req fuse.Request) context.Context {
	switch r := req.(type) {
	case *fuse.InterruptRequest:
		t.interrupt(r.IntrID)
		return ctx
	default:
		if mayBlock(req) {
			return t.track(ctx, req.Hdr().ID)
		}
		return ctx
	}
}

// track registers request id and returns its cancellable context. The
// entry goes away when the request has been served (finish).
func (t *interruptTracker) track(ctx context.Context, id fuse.RequestID) context.Context {
	lc := lazyctx.New(ctx, nil) // made only if the request waits
	ctx, cancel := lc, lc.Cancel
	tr := &trackedRequest{cancel: cancel}

	t.mu.Lock()
	_, interrupted := t.pending[id]
	if interrupted {
		delete(t.pending, id)
	} else {
		t.active[id] = tr
	}
	t.mu.Unlock()

	if interrupted {
		cancel()
	}
	return ctx
}

// finish is fusefs.Config.Finish: bazil calls it on the request's own
// goroutine once the request has been answered. It drops a registered
// request's entry. (A context.AfterFunc on the request's context did so
// before, and started a goroutine per lock request.)
func (t *interruptTracker) finish(req fuse.Request) {
	if !mayBlock(req) {
		return
	}
	id := req.Hdr().ID
	t.mu.Lock()
	tr := t.active[id]
	delete(t.active, id)
	t.mu.Unlock()
	if tr != nil {
		tr.cancel()
	}
}

// interrupt cancels request id, or remembers the interrupt until it
// registers.
func (t *interruptTracker) interrupt(id fuse.RequestID) {
	t.mu.Lock()
	tr := t.active[id]
	if tr == nil {
		t.rememberLocked(id)
	}
	t.mu.Unlock()
	if tr != nil {
		tr.cancel()
	}
}

// rememberLocked records a pending interrupt, first dropping the expired
// ones, and the oldest if the table is still full. Interrupts are rare, so
// the sweep is cheap.
func (t *interruptTracker) rememberLocked(id fuse.RequestID) {
	now := t.now()
	var oldest fuse.RequestID
	var oldestAt time.Time
	for pid, at := range t.pending {
		if now.Sub(at) > pendingInterruptTTL {
			delete(t.pending, pid)
			continue
		}
		if oldestAt.IsZero() || at.Before(oldestAt) {
			oldest, oldestAt = pid, at
		}
	}
	if len(t.pending) >= maxPendingInterrupts {
		delete(t.pending, oldest)
	}
	t.pending[id] = now
}

// counts returns the number of registered requests and pending interrupts,
// for tests.
func (t *interruptTracker) counts() (active, pending int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.active), len(t.pending)
}

// ServerConfig returns the bazil server configuration this file system
// needs: pass it to fusefs.New. It installs the interrupt tracker and the
// entry attributes (attr.go), and times requests for Config.ObserveOp.
// Both end in Finish, which bazil calls on the request's goroutine once
// the request has been answered.
func (f *FS) ServerConfig() *fusefs.Config {
	interrupts := f.interrupts
	track := func(ctx context.Context, req fuse.Request) context.Context {
		return interrupts.withContext(withEntryAttr(ctx, req), req)
	}
	observe := f.cfg.ObserveOp
	if observe == nil {
		return &fusefs.Config{WithContext: track, Finish: func(_ context.Context, req fuse.Request) {
			interrupts.finish(req)
		}}
	}
	names := new(opNames)
	return &fusefs.Config{
		WithContext: func(ctx context.Context, req fuse.Request) context.Context {
			if _, ok := req.(*fuse.InterruptRequest); !ok {
				ctx = context.WithValue(ctx, opStartKey{}, time.Now())
			}
			return track(ctx, req)
		},
		Finish: func(ctx context.Context, req fuse.Request) {
			interrupts.finish(req)
			if start, ok := ctx.Value(opStartKey{}).(time.Time); ok {
				observe(names.name(req), time.Since(start))
			}
		},
	}
}

// opStartKey is the context key of when a request began to be served.
type opStartKey struct{}

// opNames names requests' operations for metrics: "*fuse.LookupRequest"
// is "lookup". Each type's name is made once: every request is timed, and
// formatting the name cost more than the histogram. ServerConfig makes one
// for the server it configures.
type opNames struct {
	m sync.Map // reflect.Type → string
}

// name returns req's operation name.
func (o *opNames) name(req fuse.Request) string {
	t := reflect.TypeOf(req)
	if name, ok := o.m.Load(t); ok {
		return name.(string)
	}
	name := fmt.Sprintf("%T", req)
	name = strings.TrimPrefix(name, "*fuse.")
	name = strings.ToLower(strings.TrimSuffix(name, "Request"))
	o.m.Store(t, name)
	return name
}

// Serve serves the FUSE connection conn with f until the kernel ends it
// (unmount), then waits for the requests in flight. A lock wait among them
// ends when its process is interrupted or when the engine closes: close the
// engine after unmounting so that Serve can return.
func Serve(conn *fuse.Conn, f *FS) error {
	f.attachConn(conn)
	srv := fusefs.New(conn, f.ServerConfig())
	f.server.Store(srv)
	return srv.Serve(f)
}
