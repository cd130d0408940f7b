package lockmgr

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
//   - when everything is released, the engine's table is empty;
//   - fencing tokens, issued at the grant or, for a request that defers
//     it, at a status read ("read"): every token read for a grant is
//     greater than the tokens read for every grant of that lock that had
//     ended before it began, and a grant's token never changes.
func TestModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := newModelRun(t)
		defer m.close(rt)
		m.env.parked = rapid.Bool().Draw(rt, "parked")
		rt.Repeat(map[string]func(*rapid.T){
			"acquire": func(rt *rapid.T) { m.acquire(rt, true) },
			"try":     func(rt *rapid.T) { m.acquire(rt, false) },
			"release": m.release,
			"cancel":  m.cancel,
			"exit":    m.exit,
			"read":    m.read,
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
	// grants is the current grant of each explicit hold (pid -> lock),
	// ended the grants that were released or replaced, by lock; seq
	// orders grants and their ends.
	grants map[int]map[LockID]*modelGrant
	ended  map[LockID][]*modelGrant
	seq    int
}

// modelGrant is one grant of a lock to an owner, until its release or the
// owner's next grant of a different mode.
type modelGrant struct {
	pid        int
	begin, end int
	token      uint64 // 0 until known
}

func newModelRun(t *testing.T) *modelRun {
	env := &scriptEnv{t: t, tree: newFakeTree(), host: newMemHost(), clock: newFakeClock(), engines: map[string]*Engine{},
		owners: map[string]Owner{}, ownerTID: map[string]int{}, ownerIno: map[string]uint64{}, pending: map[string]*pendingAcquire{}}
	for _, p := range modelProcs {
		env.tree.add(p.pid, p.parent)
	}
	m := &modelRun{env: env, held: map[int]map[LockID]Mode{}, want: map[int]Request{}, dead: map[int]bool{},
		grants: map[int]map[LockID]*modelGrant{}, ended: map[LockID][]*modelGrant{}}
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
	deferToken := rapid.Bool().Draw(rt, "defer")
	req := Request{Lock: id, Mode: mode, Owner: m.owner(pid), TID: pid, Wait: wait, DeferToken: deferToken}
	ctx, cancel := context.WithCancel(context.Background())
	p := &pendingAcquire{engine: m.e, tid: pid, cancel: cancel, done: make(chan error, 1)}
	m.env.pending[name] = p
	m.want[pid] = req
	// A new request by an owner that holds the lock is a conversion: a
	// flock upgrade that must wait drops the hold first.
	m.env.start(ctx, p, req)
	m.env.settle()
	if p.result == "" && wait && mode == Exclusive && m.held[pid][id] == Shared {
		// A flock upgrade that must wait releases the shared hold first.
		delete(m.held[pid], id)
		m.endGrant(pid, id)
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
		case p.result == "granted token=0" && !req.DeferToken:
			rt.Fatalf("grant without a token")
		case len(p.result) > 7 && p.result[:7] == "granted":
			if m.held[pid][req.Lock] != req.Mode {
				// A new grant (a conversion ends the one before).
				m.endGrant(pid, req.Lock)
				m.seq++
				if m.grants[pid] == nil {
					m.grants[pid] = map[LockID]*modelGrant{}
				}
				m.grants[pid][req.Lock] = &modelGrant{pid: pid, begin: m.seq}
			}
			m.held[pid][req.Lock] = req.Mode
			if p.token != 0 {
				m.seeToken(rt, pid, req.Lock, p.token)
			}
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
	m.endGrant(pid, id)
	m.env.settle()
	m.collect(rt)
}

// endGrant records the end of pid's current grant of id, if any.
func (m *modelRun) endGrant(pid int, id LockID) {
	g := m.grants[pid][id]
	if g == nil {
		return
	}
	delete(m.grants[pid], id)
	m.seq++
	g.end = m.seq
	m.ended[id] = append(m.ended[id], g)
}

// seeToken checks tok, read for pid's current grant of id, against what
// was read before: the same grant's token never changes, and it is greater
// than the token of every grant of id that ended before this one began.
func (m *modelRun) seeToken(rt *rapid.T, pid int, id LockID, tok uint64) {
	g := m.grants[pid][id]
	if g == nil {
		rt.Fatalf("token %d read for %d on %s, which the model says it does not hold", tok, pid, id)
	}
	if g.token != 0 {
		if tok != g.token {
			rt.Fatalf("%d's token on %s read %d, then %d", pid, id, g.token, tok)
		}
		return
	}
	g.token = tok
	for _, e := range m.ended[id] {
		if e.token != 0 && e.end < g.begin && e.token >= tok {
			rt.Fatalf("%s: %d's token %d is not above %d's token %d, whose grant ended before", id, pid, tok, e.pid, e.token)
		}
	}
}

// read reads one lock's status, as a reader of its control file does,
// which issues the tokens its grants deferred.
func (m *modelRun) read(rt *rapid.T) {
	id := rapid.SampledFrom(modelLocks).Draw(rt, "lock")
	m.env.settle()
	m.collect(rt)
	for _, h := range m.e.StatusTokens(id).Holders {
		if !h.Explicit {
			continue
		}
		if h.Token == 0 {
			rt.Fatalf("%s: status shows holder %d without a token", id, h.Owner.ID)
		}
		m.seeToken(rt, int(h.Owner.ID), id, h.Token)
	}
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
	m.env.settle()
	m.collect(rt)
}

// check compares the engine with the model and checks the invariants.
func (m *modelRun) check(rt *rapid.T) {
	if err := m.verify(); err != nil {
		rt.Fatal(err)
	}
	// The metrics' count of the table is the status's.
	if d := tallyDiff(m.e.Tally(), tallyOf(m.e.Snapshot())); d != "" {
		rt.Fatalf("Tally and Snapshot disagree: %s", d)
	}
}

// verify is check's body.
func (m *modelRun) verify() error {
	m.e.mu.Lock()
	defer m.e.mu.Unlock()
	// The engine's explicit holds are the model's.
	got := map[int]map[LockID]Mode{}
	for id, ls := range m.e.locks {
		for o, h := range ls.holds.all() {
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
				return fmt.Errorf("model: %d holds %s %s; engine: %s", pid, id, mode, got[pid][id])
			}
			delete(got[pid], id)
		}
	}
	for pid, locks := range got {
		for id, mode := range locks {
			return fmt.Errorf("engine: %d holds %s %s; model: nothing", pid, id, mode)
		}
	}
	for id, ls := range m.e.locks {
		// No two incompatible live holds, lineage exemptions aside. The
		// exemption is directional: the later of two conflicting holds
		// must belong to the earlier one's process or a descendant of it
		// (a child runs under its parent's lock, never the reverse).
		for _, h1 := range ls.holds.all() {
			for _, h2 := range ls.holds.all() {
				if h1 == h2 || !Conflicts(h1.mode(), h2.mode()) || h1.since >= h2.since {
					continue
				}
				// h1 came first: h2 was granted under the process that
				// took it, or under one it has passed to since.
				if !h2.lineage.Contains(h1.lineage.Self()) && !m.e.belongsToLineageLocked(h1, h2.lineage) {
					return fmt.Errorf("%s: %s %s (pid %d) was granted over %s %s (pid %d), not its ancestor", id,
						h2.owner, h2.mode(), h2.lineage.Self().PID, h1.owner, h1.mode(), h1.lineage.Self().PID)
				}
			}
		}
		// The counters match the holds.
		var live, excl int32
		for _, h := range ls.holds.all() {
			if h.mode() != 0 {
				live++
			}
			if h.mode() == Exclusive {
				excl++
			}
		}
		if live != ls.nLive || excl != ls.nExclusive {
			return fmt.Errorf("%s: counts live=%d exclusive=%d, holds say %d and %d", id, ls.nLive, ls.nExclusive, live, excl)
		}
		// The lease covers every live hold.
		if need := ls.heldModeLocked(); need != 0 && (ls.lease == nil || ls.lease.Mode() < need) {
			return fmt.Errorf("%s: held %s but lease %v", id, need, ls.lease)
		}
		// No waiter is lost.
		n := 0
		for w := ls.head; w != nil; w = w.next {
			n++
			if m.e.grantableLocked(ls, w.step, w.rc, w) && !ls.busy {
				return fmt.Errorf("%s: waiter %d (%s) could be granted but sleeps", id, w.rc.req.TID, w.step.mode)
			}
		}
		back := 0
		for w := ls.tail; w != nil; w = w.prev {
			back++
		}
		if n != back {
			return fmt.Errorf("%s: %d waiters queued from the head, %d from the tail", id, n, back)
		}
	}
	return nil
}

// TestModelCatchesParentOverChild is the control of the model's lineage
// invariant: a parent granted a lock over its child's conflicting hold is
// a bug, and verify reports it. (The earlier, symmetric check, "either
// process is an ancestor of the other", accepted it.) The bug is injected
// by writing the parent's hold into the table past the engine's checks.
func TestModelCatchesParentOverChild(t *testing.T) {
	m := newModelRun(t)
	defer m.e.Close()
	a := LockID{Path: "a", Kind: KindDir}
	child := Request{Lock: a, Mode: Exclusive, Owner: m.owner(11), TID: 11}
	if _, err := m.e.Acquire(context.Background(), child); err != nil {
		t.Fatal(err)
	}
	m.held[11] = map[LockID]Mode{a: Exclusive}
	if err := m.verify(); err != nil {
		t.Fatalf("before the injected bug: %v", err)
	}
	// The engine refuses the parent, as it must.
	parent := Request{Lock: a, Mode: Exclusive, Owner: m.owner(10), TID: 10}
	if _, err := m.e.Acquire(context.Background(), parent); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("parent over child: %v, want ErrWouldBlock", err)
	}
	// Inject the bug: grant it anyway.
	lin, _ := m.env.tree.Lineage(10)
	m.e.mu.Lock()
	m.e.addHoldLocked(m.e.locks[a], step{id: a, mode: Exclusive, explicit: true}, &reqCtx{req: parent, lineage: lin})
	m.e.mu.Unlock()
	m.held[10] = map[LockID]Mode{a: Exclusive}
	err := m.verify()
	if err == nil || !strings.Contains(err.Error(), "was granted over") {
		t.Fatalf("verify missed a parent granted over its child: %v", err)
	}
	// And the reverse, a child under its parent, is fine.
	m2 := newModelRun(t)
	defer m2.e.Close()
	for _, pid := range []int{10, 11} {
		if _, err := m2.e.Acquire(context.Background(), Request{Lock: a, Mode: Exclusive, Owner: m2.owner(pid), TID: pid}); err != nil {
			t.Fatal(err)
		}
		m2.held[pid] = map[LockID]Mode{a: Exclusive}
	}
	if err := m2.verify(); err != nil {
		t.Fatalf("child under its parent: %v", err)
	}
	for _, pid := range []int{11, 10} {
		if err := m2.e.Release(context.Background(), a, m2.owner(pid)); err != nil {
			t.Fatal(err)
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
