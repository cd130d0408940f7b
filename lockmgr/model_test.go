package lockmgr

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestModel drives one engine with random interleavings of acquire, try,
// cancel, release and process exit, and after every step checks it against
// a reference model of explicit holds and against the protocol invariants:
//
//   - no two conflicting live holds on one lock coexist unless one holder's
//     process is an ancestor of (or the same as) the other's;
//   - no waiter is lost: every request still waiting, once the engine is
//     quiet, is blocked by a hold or an earlier waiter;
//   - when everything is released, the engine's table is empty.
func TestModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := newModelRun(t)
		defer m.close(rt)
		rt.Repeat(map[string]func(*rapid.T){
			"acquire": func(rt *rapid.T) { m.acquire(rt, true) },
			"try":     func(rt *rapid.T) { m.acquire(rt, false) },
			"release": m.release,
			"cancel":  m.cancel,
			"exit":    m.exit,
			"":        m.check,
		})
	})
}

// The processes: 10 -> 11 -> 12, 20 -> 21, 30. Each is one owner, one thread.
var modelProcs = []struct{ pid, parent int }{{10, 1}, {11, 10}, {12, 11}, {20, 1}, {21, 20}, {30, 1}}

var modelLocks = []LockID{
	{Path: ".", Kind: KindDir}, {Path: "a", Kind: KindDir}, {Path: "a/b", Kind: KindDir},
	{Path: "a", Kind: KindNewDir}, {Path: "c", Kind: KindDir},
}

type modelRun struct {
	env *scriptEnv
	e   *Engine
	// held is the reference model: owner pid -> lock -> explicit mode.
	held map[int]map[LockID]Mode
	// want is what a pending acquire asked for.
	want map[int]Request
	dead map[int]bool
}

func newModelRun(t *testing.T) *modelRun {
	env := &scriptEnv{t: t, tree: newFakeTree(), host: newMemHost(), engines: map[string]*Engine{},
		owners: map[string]Owner{}, ownerTID: map[string]int{}, pending: map[string]*pendingAcquire{}}
	for _, p := range modelProcs {
		env.tree.add(p.pid, p.parent)
	}
	m := &modelRun{env: env, held: map[int]map[LockID]Mode{}, want: map[int]Request{}, dead: map[int]bool{}}
	m.e = env.engine("e1")
	return m
}

func (m *modelRun) close(rt *rapid.T) {
	for _, p := range m.env.pending {
		p.cancel()
		p.cancelled = true
	}
	m.env.settle()
	m.collect(rt)
	for pid, locks := range m.held {
		for id := range locks {
			if err := m.e.Release(context.Background(), id, m.owner(pid)); err != nil {
				rt.Fatalf("release %d %s: %v", pid, id, err)
			}
		}
	}
	m.e.mu.Lock()
	n := len(m.e.locks)
	m.e.mu.Unlock()
	if n != 0 {
		rt.Fatalf("%d table entries left after releasing everything", n)
	}
	if err := m.e.Close(); err != nil {
		rt.Fatal(err)
	}
}

func (m *modelRun) owner(pid int) Owner { return Owner{Class: OwnerFile, ID: uint64(pid)} }

func (m *modelRun) alive(rt *rapid.T) int {
	var live []int
	for _, p := range modelProcs {
		if !m.dead[p.pid] {
			live = append(live, p.pid)
		}
	}
	if len(live) == 0 {
		rt.Skip("every process exited")
	}
	return rapid.SampledFrom(live).Draw(rt, "pid")
}

func (m *modelRun) acquire(rt *rapid.T, wait bool) {
	pid := m.alive(rt)
	name := fmt.Sprint(pid)
	if m.env.pending[name] != nil {
		rt.Skip("that thread is already waiting")
	}
	id := rapid.SampledFrom(modelLocks).Draw(rt, "lock")
	mode := rapid.SampledFrom([]Mode{Shared, Exclusive}).Draw(rt, "mode")
	req := Request{Lock: id, Mode: mode, Owner: m.owner(pid), TID: pid, Wait: wait}
	ctx, cancel := context.WithCancel(context.Background())
	p := &pendingAcquire{engine: m.e, tid: pid, cancel: cancel, done: make(chan error, 1)}
	m.env.pending[name] = p
	m.want[pid] = req
	// A new request by an owner that holds the lock is a conversion: a
	// flock upgrade that must wait drops the hold first.
	go func() {
		g, err := m.e.Acquire(ctx, req)
		p.token = g.Token
		p.done <- err
	}()
	m.env.settle()
	if p.result == "" && wait && mode == Exclusive && m.held[pid][id] == Shared {
		// A flock upgrade that must wait releases the shared hold first.
		delete(m.held[pid], id)
	}
	m.collect(rt)
}

// collect applies finished acquires to the model.
func (m *modelRun) collect(rt *rapid.T) {
	for name, p := range m.env.pending {
		if p.result == "" {
			continue
		}
		var pid int
		fmt.Sscan(name, &pid)
		req := m.want[pid]
		delete(m.env.pending, name)
		delete(m.want, pid)
		if m.held[pid] == nil {
			m.held[pid] = map[LockID]Mode{}
		}
		switch {
		case p.result == "granted token=0":
			rt.Fatalf("grant without a token")
		case len(p.result) > 7 && p.result[:7] == "granted":
			m.held[pid][req.Lock] = req.Mode
		}
	}
}

func (m *modelRun) release(rt *rapid.T) {
	var pids []int
	for pid, locks := range m.held {
		if len(locks) > 0 {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		rt.Skip("nothing held")
	}
	pid := rapid.SampledFrom(sortedInts(pids)).Draw(rt, "pid")
	var ids []LockID
	for _, id := range modelLocks {
		if m.held[pid][id] != 0 {
			ids = append(ids, id)
		}
	}
	id := rapid.SampledFrom(ids).Draw(rt, "lock")
	if err := m.e.Release(context.Background(), id, m.owner(pid)); err != nil {
		rt.Fatalf("release %d %s: %v", pid, id, err)
	}
	delete(m.held[pid], id)
	m.env.settle()
	m.collect(rt)
}

func (m *modelRun) cancel(rt *rapid.T) {
	var names []string
	for name := range m.env.pending {
		names = append(names, name)
	}
	if len(names) == 0 {
		rt.Skip("nobody waits")
	}
	name := rapid.SampledFrom(sortedStrings(names)).Draw(rt, "waiter")
	p := m.env.pending[name]
	p.cancel()
	p.cancelled = true
	m.env.settle()
	m.collect(rt)
}

func (m *modelRun) exit(rt *rapid.T) {
	if len(m.dead)+2 > len(modelProcs) {
		rt.Skip("keep one process alive")
	}
	pid := m.alive(rt)
	if m.env.pending[fmt.Sprint(pid)] != nil {
		rt.Skip("a waiting process is killed through its interrupt: see cancel")
	}
	m.env.tree.exit(pid)
	m.dead[pid] = true
	// Nothing announces an exit: waiters that may inherit look again on a
	// timer (exitRecheck). Stand in for that timer here, at once.
	m.e.mu.Lock()
	for _, ls := range m.e.locks {
		ls.broadcastLocked()
	}
	m.e.mu.Unlock()
	m.env.settle()
	m.collect(rt)
}

// check compares the engine with the model and checks the invariants.
func (m *modelRun) check(rt *rapid.T) {
	m.e.mu.Lock()
	defer m.e.mu.Unlock()
	// The engine's explicit holds are the model's.
	got := map[int]map[LockID]Mode{}
	for id, ls := range m.e.locks {
		for o, h := range ls.holds {
			if h.explicit != 0 {
				if got[int(o.ID)] == nil {
					got[int(o.ID)] = map[LockID]Mode{}
				}
				got[int(o.ID)][id] = h.explicit
			}
		}
	}
	for pid, locks := range m.held {
		for id, mode := range locks {
			if got[pid][id] != mode {
				rt.Fatalf("model: %d holds %s %s; engine: %s", pid, id, mode, got[pid][id])
			}
			delete(got[pid], id)
		}
	}
	for pid, locks := range got {
		for id, mode := range locks {
			rt.Fatalf("engine: %d holds %s %s; model: nothing", pid, id, mode)
		}
	}
	for id, ls := range m.e.locks {
		// No two incompatible live holds, lineage exemptions aside.
		for _, h1 := range ls.holds {
			for _, h2 := range ls.holds {
				if h1 == h2 || !Conflicts(h1.mode(), h2.mode()) {
					continue
				}
				p1, _ := m.e.effectiveProcLocked(h1)
				p2, _ := m.e.effectiveProcLocked(h2)
				related := (p1 != ProcID{} && h2.lineage.Contains(p1)) || (p2 != ProcID{} && h1.lineage.Contains(p2)) ||
					h2.lineage.Contains(h1.lineage.Self()) || h1.lineage.Contains(h2.lineage.Self())
				if !related {
					rt.Fatalf("%s: %s %s (pid %d) and %s %s (pid %d) coexist", id,
						h1.owner, h1.mode(), p1.PID, h2.owner, h2.mode(), p2.PID)
				}
			}
		}
		// The counters match the holds.
		live, excl := 0, 0
		for _, h := range ls.holds {
			if h.mode() != 0 {
				live++
			}
			if h.mode() == Exclusive {
				excl++
			}
		}
		if live != ls.nLive || excl != ls.nExclusive {
			rt.Fatalf("%s: counts live=%d exclusive=%d, holds say %d and %d", id, ls.nLive, ls.nExclusive, live, excl)
		}
		// The lease covers every live hold.
		if need := ls.heldModeLocked(); need != 0 && (ls.lease == nil || ls.lease.Mode() < need) {
			rt.Fatalf("%s: held %s but lease %v", id, need, ls.lease)
		}
		// No waiter is lost.
		for _, w := range ls.queue {
			if _, ok := m.e.grantableLocked(ls, w.step, w.rc, w); ok && !ls.busy {
				rt.Fatalf("%s: waiter %d (%s) could be granted but sleeps", id, w.rc.req.TID, w.step.mode)
			}
		}
	}
}

func sortedInts(s []int) []int {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

func sortedStrings(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

var _ = errors.Is
var _ = time.Now
