package lockmgr

import (
	"context"
	"time"
)

// The engine's watches on the processes behind its holds: one per
// process, started at the first hold, kept watchLinger after the last
// (heirs.go says what happens when a watched process exits).

// procWatch is the engine's watch on one process.
type procWatch struct {
	// holds are the holds whose taker or heir the process is.
	holds map[*hold]struct{}
	// exited: the process has exited.
	exited bool
	// cancel stops the watch's goroutine.
	cancel context.CancelFunc
	// idleSince is when the watch lost its last hold (zero while it has
	// holds): it is ended after watchLinger unless reused.
	idleSince time.Time
	// queued: the watch has an entry in Engine.idle.
	queued bool
}

// idleWatch is an entry of Engine.idle: watch w of process p, queued at
// since. A watch has at most one entry (procWatch.queued).
type idleWatch struct {
	p     ProcID
	w     *procWatch
	since time.Time
}

// exitedLocked reports whether the engine has seen p exit. A process it
// does not watch counts as alive.
func (e *Engine) exitedLocked(p ProcID) bool {
	w := e.watches[p]
	return w != nil && w.exited
}

// trackLocked records that hold h depends on process p, and watches p.
func (e *Engine) trackLocked(h *hold, p ProcID) {
	if p == (ProcID{}) || e.watcher == nil {
		return
	}
	e.sweepIdleLocked()
	w := e.watches[p]
	if w == nil {
		ctx, cancel := context.WithCancel(e.ctx)
		w = &procWatch{holds: make(map[*hold]struct{}, 1), cancel: cancel}
		e.watches[p] = w
		e.wg.Add(1)
		go e.watchExit(ctx, w, p)
	}
	w.holds[h] = struct{}{}
	w.idleSince = time.Time{}
}

// untrackLocked undoes trackLocked.
func (e *Engine) untrackLocked(h *hold, p ProcID) {
	w := e.watches[p]
	if w == nil {
		return
	}
	delete(w.holds, h)
	if len(w.holds) == 0 {
		e.idleLocked(p, w)
	}
	e.sweepIdleLocked()
}

// idleLocked keeps w, p's watch that has just lost its last hold, for
// reuse (watchLinger), or ends it if p has exited.
func (e *Engine) idleLocked(p ProcID, w *procWatch) {
	if w.exited || e.linger <= 0 {
		e.endWatchLocked(p, w)
		return
	}
	w.idleSince = e.now()
	if !w.queued {
		w.queued = true
		e.idle = append(e.idle, idleWatch{p: p, w: w, since: w.idleSince})
	}
}

// sweepIdleLocked ends the watches idle for watchLinger. e.idle is in the
// order the entries were queued; an entry found reused is dropped, one
// found idle again since it was queued is queued again from then.
func (e *Engine) sweepIdleLocked() {
	now := e.now()
	for len(e.idle) > 0 && now.Sub(e.idle[0].since) >= e.linger {
		iw := e.idle[0]
		e.idle[0] = idleWatch{}
		e.idle = e.idle[1:]
		w := iw.w
		switch {
		case e.watches[iw.p] != w || len(w.holds) > 0:
			w.queued = false // ended, or in use again
		case now.Sub(w.idleSince) >= e.linger:
			w.queued = false
			e.endWatchLocked(iw.p, w)
		default:
			e.idle = append(e.idle, idleWatch{p: iw.p, w: w, since: w.idleSince})
		}
	}
}

// endWatchLocked stops p's watch w and forgets it.
func (e *Engine) endWatchLocked(p ProcID, w *procWatch) {
	w.cancel()
	if e.watches[p] == w {
		delete(e.watches, p)
	}
}

// untrackAllLocked drops every watch of hold h: its taker's and its heirs'.
func (e *Engine) untrackAllLocked(h *hold) {
	if len(h.lineage) > 0 {
		e.untrackLocked(h, h.lineage[0])
	}
	if r := h.rare; r != nil && r.fate != nil {
		f := r.fate
		for _, p := range f.heirs {
			e.untrackLocked(h, p)
		}
		f.heirs, f.scanned, f.rescans = nil, false, 0
	}
}

// setTakerLocked makes rc's process the taker of h.
func (e *Engine) setTakerLocked(h *hold, lin Lineage) {
	e.untrackAllLocked(h)
	h.lineage = lin
	if len(lin) > 0 {
		e.trackLocked(h, lin[0])
	}
}

// watchExit waits for p to exit, then hands the holds that depended on it
// to their heirs.
func (e *Engine) watchExit(ctx context.Context, w *procWatch, p ProcID) {
	defer e.wg.Done()
	if err := e.watcher.WaitExit(ctx, p); err != nil {
		return // stopped
	}
	e.mu.Lock()
	if e.watches[p] == w && !w.exited {
		e.exitedNowDropsMu(w)
		if len(w.holds) == 0 {
			e.endWatchLocked(p, w) // idle: nothing more to watch
		}
	}
	e.mu.Unlock()
}

// exitedNowDropsMu records that w's process has exited and hands its holds on.
func (e *Engine) exitedNowDropsMu(w *procWatch) {
	w.exited = true
	e.exitWork++
	e.reassignDropsMu(w)
	e.exitWork--
}
