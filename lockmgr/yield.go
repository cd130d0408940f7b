package lockmgr

// Fairness across daemons (SPEC §2.7): giving up a lease that someone
// outside this engine waits for.
//
// Within the host, the engine's FIFO queue is fair. But the lease is the
// host's one claim on the lock, and while local requests keep coming, the
// engine could hand it from one local holder to the next for ever: another
// host, another daemon over the same SOURCE, or a program that flocks
// SOURCE's backing file would wait until it timed out. So:
//
//   - When a local request first waits behind the holds of a leased lock
//     (a hand-on to it is foreseeable), or is granted the lease while other
//     holds share it, the engine asks the lease, once, whether its backend
//     can tell of outside waiters (ContendedLease). Leases that are taken
//     and given back with no local demand in between are never asked, so
//     the backend's watch costs nothing when nobody competes here.
//   - Once the lease's Contended channel is closed, the lock is yielding:
//     no new request is granted on that lease, and settleDropsMu no longer
//     hands it to the next local waiter. The holds running then finish;
//     the last one's release gives the lease back (the backend keeps no
//     warm or kept claim of a yielding lease: that is the backend's side
//     of the contract). The local waiters then claim through the backend,
//     with wait, like anyone else, and queue behind the outside waiter.
//     Among themselves they keep their FIFO order.
//   - Privileged requests are no new demand for the lease and are granted
//     as before: a conversion or a second request of an owner that holds
//     the lock, and a request whose lineage holds it (a child under its
//     parent's lock). Refusing them would deadlock the holds the lease
//     waits for. The usage rule only lets through requests for locks the
//     lineage holds, which are privileged.
//   - A request that the yield holds back waits for every live hold of
//     the lock, as if an exclusive waiter stood before it: that is what
//     deadlock detection (blocksLocked) counts. A request without wait
//     gets ErrWouldBlock.
//   - The yield ends with the lease: a lease lost, broken, released at
//     Close or given back starts a fresh state (setLeaseLocked).
//
// A Contended channel may close at any time, from the backend's own
// goroutine; the engine needs no goroutine of its own to react, because a
// lease is only ever reused at a grant or a hand-on, and both look.

// watchContendedLocked asks ls's lease, once per lease, for its Contended
// channel. ContendedLease.Contended does not block: it is called under mu.
func (e *Engine) watchContendedLocked(ls *lockState) {
	if ls.askedContended || ls.lease == nil || e.keepContended {
		return
	}
	ls.askedContended = true
	if cl, ok := ls.lease.(ContendedLease); ok {
		ls.contended = cl.Contended()
	}
}

// yieldingLocked reports whether ls's lease is known to be wanted outside
// this engine. The first time it is, the Observer hears of the give-up.
func (e *Engine) yieldingLocked(ls *lockState) bool {
	if !ls.yielding && ls.contended != nil {
		select {
		case <-ls.contended:
			ls.yielding = true
			if e.obs != nil {
				e.obs.Yielded(ls.id)
			}
		default:
		}
	}
	return ls.yielding
}

// yieldBlocksLocked reports whether step s of rc must wait for ls's lease
// to be given back: the lease is yielding, s needs it, and rc is no
// privileged request (its owner or lineage holds no live hold of ls).
func (e *Engine) yieldBlocksLocked(ls *lockState, s step, rc *reqCtx) bool {
	return ls.lease != nil && e.needsLease(s) && e.yieldingLocked(ls) && !e.privilegedLocked(ls, rc)
}

// handOnYieldsLocked is settleDropsMu's question before it hands ls's lease,
// which no hold needs any more, to the waiter at the head of the queue: is
// the lease wanted outside? Then it is given back instead.
func (e *Engine) handOnYieldsLocked(ls *lockState) bool {
	e.watchContendedLocked(ls)
	return e.yieldingLocked(ls)
}
