package daemon

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
)

// slowWaits logs every grant that waited longer than a threshold, as one
// structured line, and passes every event on to the next observer.
type slowWaits struct {
	next      lockmgr.Observer
	threshold time.Duration
	log       logrus.FieldLogger
	host      string
}

var _ lockmgr.Observer = (*slowWaits)(nil)

func (s *slowWaits) Requested(req lockmgr.Request, g lockmgr.Grant, outcome lockmgr.Outcome, took time.Duration) {
	if outcome == lockmgr.Granted && s.threshold > 0 && took >= s.threshold {
		fields := logrus.Fields{
			"path": lockmgr.QuoteName(req.Lock.String()), "kind": req.Lock.Kind.String(), "mode": req.Mode.String(),
			"pid": req.TID, "uid": req.UID, "host": s.host, "waited": took.Round(time.Millisecond).String(),
		}
		if g.Token != 0 { // a grant through a mount defers its token
			fields["token"] = g.Token
		}
		s.log.WithFields(fields).Info("lock granted after a long wait")
	}
	s.next.Requested(req, g, outcome, took)
}

func (s *slowWaits) Lost(id lockmgr.LockID, broken bool) { s.next.Lost(id, broken) }

func (s *slowWaits) Yielded(id lockmgr.LockID) { s.next.Yielded(id) }

// waitRepeat is how often a wait that goes on is logged again.
const waitRepeat = time.Minute

// maxWaitLines is how many long waits of one lock a scan logs one by one;
// the others due then are counted in one line. 10,000 threads queued on
// one lock would otherwise log 10,000 lines a minute, and read /proc for
// each waiter and its holders.
const maxWaitLines = 10

// waitWatch logs, while they last, the waits longer than a threshold: once
// when a wait passes it, and every waitRepeat after, naming the lock, the
// waiter and who is in its way. It reads the locks waited for (SnapshotWaited)
// every poll.
type waitWatch struct {
	// Dependencies
	snapshot func() []lockmgr.LockStatus
	log      logrus.FieldLogger
	describe func(pid int) procinfo.Command

	// Constant data
	threshold time.Duration
	repeat    time.Duration

	// Mutable state, owned by the goroutine that calls scan.
	logged map[waitKey]time.Time // when each long wait was last logged

	stop chan struct{}
	done sync.WaitGroup
}

// waitKey names one waiter on one lock.
type waitKey struct {
	lock  lockmgr.LockID
	owner lockmgr.Owner
	tid   int
	since time.Time
}

func newWaitWatch(snapshot func() []lockmgr.LockStatus, threshold time.Duration, log logrus.FieldLogger) *waitWatch {
	return &waitWatch{
		snapshot:  snapshot,
		log:       log,
		describe:  func(pid int) procinfo.Command { return procinfo.Describe("", pid) },
		threshold: threshold,
		repeat:    waitRepeat,
		logged:    make(map[waitKey]time.Time),
		stop:      make(chan struct{}),
	}
}

// start runs the watch until close; a zero threshold turns it off.
func (w *waitWatch) start() {
	if w.threshold <= 0 {
		return
	}
	poll := min(w.threshold/2, time.Second)
	poll = max(poll, 50*time.Millisecond)
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		t := time.NewTicker(poll)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case now := <-t.C:
				w.scan(w.snapshot(), now)
			}
		}
	}()
}

// close stops the watch and waits for it.
func (w *waitWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.done.Wait()
}

// scan logs the waits of snap that are due at now: up to maxWaitLines of
// each lock one by one, and the count of the others due in one line.
func (w *waitWatch) scan(snap []lockmgr.LockStatus, now time.Time) {
	seen := make(map[waitKey]bool)
	for _, st := range snap {
		shown, more := 0, 0
		var longest time.Duration
		for i, wt := range st.Waiters {
			waited := now.Sub(wt.Since)
			if waited < w.threshold {
				continue
			}
			k := waitKey{lock: st.Lock, owner: wt.Owner, tid: wt.TID, since: wt.Since}
			seen[k] = true
			if last, ok := w.logged[k]; ok && now.Sub(last) < w.repeat {
				continue
			}
			w.logged[k] = now
			if shown == maxWaitLines {
				more++
				longest = max(longest, waited)
				continue
			}
			shown++
			wants, mode := wt.Wants, wt.WantsMode
			if wants == (lockmgr.LockID{}) {
				wants, mode = st.Lock, wt.Mode
			}
			w.log.WithFields(logrus.Fields{
				"path":       lockmgr.QuoteName(wants.String()),
				"kind":       wants.Kind.String(),
				"mode":       mode.String(),
				"waiting_on": lockmgr.QuoteName(st.Lock.String()),
				"pid":        wt.Process.PID,
				"uid":        wt.UID,
				"command":    w.describe(wt.Process.PID).String(),
				"waited":     waited.Round(time.Second).String(),
				"blocked_by": w.blockers(st, wt, i),
			}).Info("lock wait is long: still waiting")
		}
		if more > 0 {
			w.log.WithFields(logrus.Fields{
				"waiting_on": lockmgr.QuoteName(st.Lock.String()),
				"waiters":    more,
				"longest":    longest.Round(time.Second).String(),
			}).Info("lock waits are long: more still waiting")
		}
	}
	for k := range w.logged {
		if !seen[k] {
			delete(w.logged, k) // granted, interrupted or gone
		}
	}
}

// blockers names who keeps waiter wt (the i-th in st's queue) waiting: the
// holders whose mode conflicts with its own, else the waiters queued ahead
// of it (first come, first served), else no process of this host.
func (w *waitWatch) blockers(st lockmgr.LockStatus, wt lockmgr.Waiter, i int) string {
	var out []string
	for _, h := range st.Holders {
		mode := h.Mode
		if !h.Explicit {
			mode = lockmgr.Shared
		}
		if h.Owner == wt.Owner || !lockmgr.Conflicts(mode, wt.Mode) {
			continue
		}
		s := fmt.Sprintf("pid=%d host=%s %s", h.Process.PID, h.Host, mode)
		if !h.Explicit {
			s += " (for a lock below)"
		}
		c := w.describe(h.Process.PID)
		switch {
		case c.Runs != nil:
			s += fmt.Sprintf(" %s [%d under %s]", c.Runs.String(), c.Runs.PID, c.Name)
		case c.String() != "":
			s += " " + c.String()
		}
		out = append(out, s)
	}
	switch {
	case len(out) > 0:
		return strings.Join(out, "; ")
	case i > 0:
		return fmt.Sprintf("%d earlier waiters queued ahead (first come, first served)", i)
	}
	return "no holder on this host (another host's, or a process locking the SOURCE file directly)"
}
