package control

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/internal/logs"
	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
)

// refusalWindow is how often one lock's refusals are logged: a loop of
// `flock -n` on a busy lock must not flood the log. The refusals not logged
// are counted and reported with the next line of that lock.
const refusalWindow = 5 * time.Second

// refusalLimiter decides which refusals are logged: the first of a lock in
// each window.
type refusalLimiter struct {
	now func() time.Time

	mu sync.Mutex
	// byLock has an entry for each lock refused within the last window.
	// GUARDED_BY(mu)
	byLock map[lockmgr.LockID]*refusalWindowState
}

type refusalWindowState struct {
	logged     time.Time // when the last line of this lock was logged
	suppressed int       // refusals since then, not logged
}

func newRefusalLimiter(now func() time.Time) *refusalLimiter {
	if now == nil {
		now = time.Now
	}
	return &refusalLimiter{now: now, byLock: make(map[lockmgr.LockID]*refusalWindowState)}
}

// allow reports whether a refusal of id is logged now and, if so, how many
// were suppressed since its last line.
func (r *refusalLimiter) allow(id lockmgr.LockID) (ok bool, suppressed int) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.byLock) > 4096 {
		// Locks refused once, long ago: forget them (their counts were 0
		// or are reported as lost here).
		for k, s := range r.byLock {
			if now.Sub(s.logged) >= refusalWindow && s.suppressed == 0 {
				delete(r.byLock, k)
			}
		}
	}
	s := r.byLock[id]
	if s == nil {
		r.byLock[id] = &refusalWindowState{logged: now}
		return true, 0
	}
	if now.Sub(s.logged) < refusalWindow {
		s.suppressed++
		return false, 0
	}
	suppressed, s.suppressed, s.logged = s.suppressed, 0, now
	return true, suppressed
}

// blocker names who holds what a refused request wanted, for the log:
// "pid=123 host=h1 exclusive 'make deploy [124 under flock]'", or why no
// holder of this host can be named.
func (c *Files) blocker(req lockmgr.Request) string {
	h, ok := c.engine.Query(req)
	if !ok {
		return "no holder on this host (another host's, or a process locking the SOURCE file directly)"
	}
	mode := h.Mode
	if !h.Explicit {
		mode = lockmgr.Shared
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pid=%d host=%s %s", h.Process.PID, h.Host, mode)
	if cmd := procinfo.Describe("", h.Process.PID); cmd.String() != "" {
		if cmd.Runs != nil {
			fmt.Fprintf(&b, " %s [%d under %s]", cmd.Runs.String(), cmd.Runs.PID, cmd.Name)
		} else {
			fmt.Fprintf(&b, " %s", cmd.String())
		}
	}
	return b.String()
}

// logDeadHolder logs, at debug, that owner's hold of id is released because
// its last descriptor closed after the process that took it exited
// (normally or killed: the kernel closes the descriptors of an exiting
// process, and cannot tell lockfs which). A taker still running is not
// logged. The engine may by then show the hold as its parent's (lineage);
// the line names both.
func (c *Files) logDeadHolder(id lockmgr.LockID, owner lockmgr.Owner) {
	if !logs.DebugEnabled(c.log) {
		return // the status and /proc reads below are for the debug line only
	}
	for _, h := range c.engine.Status(id).Holders {
		if h.Owner != owner || h.TID <= 0 {
			continue
		}
		if !procinfo.Exited("", h.TID) {
			continue
		}
		c.log.WithFields(logrus.Fields{
			"path": lockmgr.QuoteName(id.String()), "kind": id.Kind.String(), "mode": h.Mode.String(),
			"pid": h.TID, "held_by_now": h.Process.PID, "uid": h.UID, "token": h.Token,
			"held": time.Since(h.Since).Round(time.Millisecond).String(),
		}).Debug("holder exited with the lock held: released as its last descriptor closed")
	}
}
