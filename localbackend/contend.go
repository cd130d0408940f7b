package localbackend

import (
	"context"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
)

// Learning that someone outside this daemon waits for a claim
// (lockmgr.ContendedLease), so that the engine gives the lock up instead of
// handing it from one local holder to the next for ever.
//
// Whoever waits for a backing file's flock, another lockfs daemon over the
// same SOURCE (through its flock(1) child) or a program running flock(1) or
// flock(2) on SOURCE directly, is blocked in the kernel, and the kernel
// lists every blocked request in /proc/locks, under the lock that blocks it:
//
//	1: FLOCK  ADVISORY  WRITE 25093 fe:00:9978055 0 EOF
//	1: -> FLOCK  ADVISORY  WRITE 25101 fe:00:9978055 0 EOF
//
// ("->", indented by its depth in the tree of waiters, then the lock type,
// the mode wanted, the waiting process and the file as MAJ:MIN:INODE).
// Nothing notifies of a new waiter, so the backend polls that table, but
// only while the engine watches some lease: it asks (Lease.Contended) when a
// local request waits for, or shares, a lease it holds, that is, under
// continuous local demand. A daemon whose locks are taken and given back
// with no local contention never reads the table.
//
//   - Contended registers the lease and starts the poller goroutine if it
//     is not running. Release, and a closed channel, unregister it; the
//     poller ends once nothing is watched, and Close stops it and waits
//     for it (it counts as a call in progress).
//   - Each round reads /proc/locks once, whatever the number of watched
//     leases, and looks only at the blocked flock requests ("->" lines of
//     type FLOCK) on the watched files: one that conflicts with the
//     lease's mode (any, for an exclusive lease; an exclusive one for a
//     shared lease) closes the lease's channel.
//   - The daemon's own waits are not outside waiters. The daemon never
//     blocks in flock(2) on a backing file itself, and the engine never
//     has a claim waiting (through a flock(1) child) on a file whose lease
//     it holds: it claims a lock only while it holds no lease of it, and
//     an upgrade polls without blocking. Still, defensively, this
//     backend's flock(1) children are skipped by pid, once known (a child
//     that blocks before its start has returned may be seen once; the
//     worst that comes of it is one lease given back for nothing).
//   - The file's name in the table is the kernel's own (the superblock's
//     device and the inode number), which can differ from fstat's st_dev
//     (btrfs subvolumes report another device). So the poller reads it
//     once per lease from /proc/self/fdinfo/FD, whose "lock:" lines list
//     the lease's own flock in the same format.
//   - Notice time and cost: a round reads the whole table, whose cost
//     grows faster than the number of locks on the host (measured on Linux
//     6.18: 20 µs of CPU for a few locks, 1 ms for 1,000, 18 ms for
//     10,000: the kernel walks the table from its start for every page it
//     formats). So the next round comes after contendCostShare (20) times
//     the CPU time the last one took, and at least contendPoll (5 ms): the
//     poller takes at most 5% of a CPU, and notices a waiter within about
//     5 ms on a host with a few hundred locks, 20 ms with 1,000, 0.4 s with
//     10,000. CPU time, not wall time, is measured (the poller's thread's
//     clock): on a loaded host a round's wall time is mostly waiting to run.
//     It is measured only once the table exceeds 32 KiB (some 400 locks):
//     below, a round is two reads of one descriptor kept open, a search
//     for "->" and the timer, a few tens of µs.
//
// When the engine releases a lease whose channel was closed, the backend
// keeps no shared flock of it (keep.go), and remembers the outside waiters
// it saw (a yield). The kernel wakes a blocked flock request at the unlock
// and drops it from the table, but grants nothing: the woken process takes
// the lock when it runs, and anyone who asks first, the engine's next claim
// of the same file included, overtakes it (on a loaded host, half the
// time). And a waiter that another holder still blocks (an exclusive
// request behind another daemon's shared claim) would be overtaken by a
// shared claim of ours, which the kernel grants beside that holder. So the
// next claim of that file that waits first waits (awaitTurn), polling the
// table every millisecond or so (up to 5 ms), while one of those waiters
// is still blocked on the file, or, up to yieldTurn after the release,
// woken and not run yet (alive, neither holding nor blocked). Then it
// claims as usual and, finding the lock taken, queues in the kernel behind
// them. A claim without wait does not wait for them.
const (
	contendPoll      = 5 * time.Millisecond
	contendCostShare = 20
	yieldTurn        = 250 * time.Millisecond
	yieldMax         = 256
)

// contention is the backend's watch of outside waiters. Guarded by
// Backend.mu.
type contention struct {
	// watched are the leases whose Contended channel is open.
	watched map[*lease]struct{}
	// running: the poller goroutine runs.
	running bool
	// own are the pids of this backend's flock(1) children (wait.go).
	own map[int]struct{}
	// warned: a failed read of the lock table was logged.
	warned bool
	// yields are the files whose lease was given up to outside waiters
	// within yieldTurn, by backing file (at most yieldMax).
	yields map[string]yield
}

// yield is a lease given up to outside waiters.
type yield struct {
	key  string // the file as /proc/locks names it
	pids []int  // the waiters seen
	at   time.Time
}

// Contended returns a channel that is closed once a process other than
// this backend's own waits in the kernel for a flock of l's backing file
// that conflicts with l's mode (lockmgr.ContendedLease). The first call
// starts the watch; it does not block.
func (l *lease) Contended() <-chan struct{} {
	b := l.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if l.contended != nil {
		return l.contended
	}
	l.contended = make(chan struct{})
	l.mu.Lock()
	released := l.released
	l.mu.Unlock()
	if b.closed || released {
		return l.contended // never closes: nothing is held to wait for
	}
	if b.contention.watched == nil {
		b.contention.watched = make(map[*lease]struct{})
	}
	b.contention.watched[l] = struct{}{}
	if !b.contention.running {
		b.contention.running = true
		b.inflight.Add(1) // Close waits for the poller
		go b.pollContention()
	}
	return l.contended
}

// unwatch ends l's watch, at its release, and reports whether someone
// outside was seen waiting for it; if so, it records the yield for the
// next claim of the file (awaitTurn).
func (b *Backend) unwatch(l *lease) (wanted bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.contention.watched, l)
	if !l.wanted || b.closed {
		return l.wanted
	}
	c := &b.contention
	now := time.Now()
	if c.yields == nil {
		c.yields = make(map[string]yield)
	}
	if len(c.yields) >= yieldMax {
		for rel, y := range c.yields {
			if now.Sub(y.at) >= yieldTurn {
				delete(c.yields, rel)
			}
		}
	}
	if len(c.yields) < yieldMax {
		c.yields[l.rel] = yield{key: l.lockKey, pids: l.wantedBy, at: now}
	}
	return true
}

// awaitTurn is for a claim of rel that waits: if rel's lease was given up
// to outside waiters within yieldTurn, it lets them go first. It waits
// while one of them is still blocked on the file (held there by another
// holder, say another daemon's shared claim, which a shared claim of ours
// would not wait for in the kernel: it would overtake them), and, up to
// yieldTurn after the release or after one was last seen blocked, while one
// was woken and has not run yet.
// It returns once none is ahead any more, or when ctx ends or the backend
// closes.
func (b *Backend) awaitTurn(ctx context.Context, rel string) error {
	b.mu.Lock()
	y, ok := b.contention.yields[rel]
	delete(b.contention.yields, rel)
	b.mu.Unlock()
	if !ok || y.key == "" || time.Since(y.at) >= yieldTurn {
		return nil
	}
	var t lockTable
	defer t.close()
	bo := backoff.New(turnPollMin, turnPollMax)
	since := y.at // the release, or when one was last seen blocked
	for {
		data, _, err := t.read()
		if err != nil {
			return nil
		}
		locks := locksOf(data, y.key)
		blocked, woken := false, false
		for _, pid := range y.pids {
			switch turnOf(pid, locks) {
			case turnBlocked:
				blocked = true
			case turnWoken:
				woken = true
			}
		}
		if blocked {
			since = time.Now()
		} else if !woken || time.Since(since) >= yieldTurn {
			return nil
		}
		if err := pollSleep(ctx, bo, b.closeCtx.Done()); err != nil {
			return err
		}
	}
}

// turn is where an outside waiter stands, for awaitTurn.
type turn int

const (
	turnDone    turn = iota // it holds the lock, or is gone
	turnBlocked             // it still waits in the kernel
	turnWoken               // alive, neither holding nor blocked: woken, or done with the lock
)

// turnOf says where process pid stands among locks (those of one file).
func turnOf(pid int, locks []lockLine) turn {
	for _, lk := range locks {
		if lk.pid == pid {
			if lk.blocked {
				return turnBlocked
			}
			return turnDone
		}
	}
	if procinfo.Exited("", pid) {
		return turnDone
	}
	return turnWoken
}

// ownWaiter records (add) or forgets a flock(1) child of this backend.
func (b *Backend) ownWaiter(pid int, add bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !add {
		delete(b.contention.own, pid)
		return
	}
	if b.contention.own == nil {
		b.contention.own = make(map[int]struct{})
	}
	b.contention.own[pid] = struct{}{}
}

// watchedLease is a poller's view of one watched lease.
type watchedLease struct {
	l    *lease
	key  string // the file as /proc/locks names it; "" until known
	mode lockmgr.Mode
}

// pollContention is the poller goroutine: it runs rounds until nothing is
// watched or the backend closes.
func (b *Backend) pollContention() {
	defer b.inflight.Done()
	var t lockTable
	defer t.close()
	var watched []watchedLease
	own := make(map[int]struct{})
	for {
		b.mu.Lock()
		if b.closed || len(b.contention.watched) == 0 {
			b.contention.running = false
			b.mu.Unlock()
			return
		}
		watched = watched[:0]
		for l := range b.contention.watched {
			watched = append(watched, watchedLease{l: l, key: l.lockKey})
		}
		clear(own)
		for pid := range b.contention.own {
			own[pid] = struct{}{}
		}
		b.mu.Unlock()

		for i := range watched {
			w := &watched[i]
			w.mode = w.l.Mode()
			if w.key == "" {
				w.key = w.l.kernelKey()
			}
		}
		data, cost, err := t.read()
		blocked := parseBlocked(data)
		b.mu.Lock()
		if err != nil && !b.contention.warned {
			b.contention.warned = true
			b.log.WithError(err).Warn("cannot read the kernel's lock table: waiters outside this daemon go unnoticed, and a busy lock may keep them out")
		}
		for _, w := range watched {
			if _, ok := b.contention.watched[w.l]; !ok {
				continue // released meanwhile
			}
			w.l.lockKey = w.key
			if pids := waitersFor(blocked[w.key], w.mode, own); w.key != "" && w.mode != 0 && len(pids) > 0 {
				w.l.wanted, w.l.wantedBy = true, pids
				close(w.l.contended)
				delete(b.contention.watched, w.l)
			}
		}
		b.mu.Unlock()

		timer := time.NewTimer(max(contendPoll, contendCostShare*cost))
		select {
		case <-timer.C:
		case <-b.closeCtx.Done():
			timer.Stop()
		}
	}
}
