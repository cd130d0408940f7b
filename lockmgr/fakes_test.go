package lockmgr

import (
	"context"
	"fmt"
	"sort"
	"sync"
)

// fakeTree is a process tree for tests: thread id == pid, start time 1.
// It watches exits (ProcessWatcher) and keeps a table of which processes
// hold a descriptor of which open file description.
type fakeTree struct {
	mu     sync.Mutex
	parent map[int]int
	dead   map[int]bool
	// exited has a channel per pid, closed when it exits.
	exited map[int]chan struct{}
	// fds maps an open file description (ino, description id) to the
	// processes that hold a descriptor of it.
	fds map[fakeDesc]map[int]bool
	// waits counts the WaitExit calls per pid (watches started), and
	// waiting the calls in progress.
	waits, waiting map[int]int
	// scans counts the Descriptors calls.
	scans int
}

// fakeDesc names an open file description: the file's inode and an id.
type fakeDesc struct {
	ino uint64
	id  uint64
}

var _ ProcessWatcher = (*fakeTree)(nil)

func newFakeTree() *fakeTree {
	return &fakeTree{parent: map[int]int{1: 0}, dead: map[int]bool{}, exited: map[int]chan struct{}{},
		fds: map[fakeDesc]map[int]bool{}, waits: map[int]int{}, waiting: map[int]int{}}
}

func (t *fakeTree) add(pid, parent int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.parent[pid] = parent
	delete(t.dead, pid)
	t.exited[pid] = make(chan struct{})
}

// exit kills pid: it holds no descriptor any more.
func (t *fakeTree) exit(pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead[pid] {
		return
	}
	t.dead[pid] = true
	if ch := t.exited[pid]; ch != nil {
		close(ch)
	}
	for _, holders := range t.fds {
		delete(holders, pid)
	}
}

// isDead reports whether pid has exited.
func (t *fakeTree) isDead(pid int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dead[pid]
}

// open records that pid holds a descriptor of description d.
func (t *fakeTree) open(pid int, d fakeDesc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fds[d] == nil {
		t.fds[d] = map[int]bool{}
	}
	t.fds[d][pid] = true
}

// close records that pid holds no descriptor of d any more.
func (t *fakeTree) close(pid int, d fakeDesc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.fds[d], pid)
}

func (t *fakeTree) WaitExit(ctx context.Context, p ProcID) error {
	t.mu.Lock()
	ch := t.exited[p.PID]
	t.waits[p.PID]++
	t.waiting[p.PID]++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.waiting[p.PID]--
		t.mu.Unlock()
	}()
	if ch == nil || p.Start != 1 {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *fakeTree) Descriptors(ctx context.Context, inos []uint64, known func(ino uint64, pid int) bool) (map[uint64][][]ProcID, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.scans++
	out := map[uint64][][]ProcID{}
	for _, ino := range inos {
		var kn func(pid int) bool
		if known != nil {
			kn = func(pid int) bool { return known(ino, pid) }
		}
		if g := t.descriptorsLocked(ino, kn); len(g) > 0 {
			out[ino] = g
		}
	}
	return out, nil
}

func (t *fakeTree) descriptorsLocked(ino uint64, known func(pid int) bool) [][]ProcID {
	var ds []fakeDesc
	for d, holders := range t.fds {
		if d.ino == ino && len(holders) > 0 {
			ds = append(ds, d)
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].id < ds[j].id })
	// As procinfo.Tree.Descriptors: a known process with one descriptor of
	// the file is a group of its own, without comparing descriptions.
	perPID := map[int]int{}
	for _, d := range ds {
		for pid := range t.fds[d] {
			perPID[pid]++
		}
	}
	var out [][]ProcID
	for _, d := range ds {
		var g []ProcID
		for pid := range t.fds[d] {
			if known != nil && perPID[pid] == 1 && known(pid) {
				out = append(out, []ProcID{{PID: pid, Start: 1}})
				continue
			}
			g = append(g, ProcID{PID: pid, Start: 1})
		}
		if len(g) == 0 {
			continue
		}
		sort.Slice(g, func(i, j int) bool { return g[i].PID < g[j].PID })
		out = append(out, g)
	}
	return out
}

func (t *fakeTree) Lineage(tid int) (Lineage, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.parent[tid]; !ok || t.dead[tid] {
		return nil, fmt.Errorf("no thread %d", tid)
	}
	var l Lineage
	for p := tid; p != 0; p = t.parent[p] {
		l = append(l, ProcID{PID: p, Start: 1})
		if len(l) > 1000 {
			return nil, fmt.Errorf("cycle in fake tree at %d", p)
		}
	}
	return l, nil
}

func (t *fakeTree) Alive(p ProcID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.parent[p.PID]
	return ok && !t.dead[p.PID] && p.Start == 1
}

// memHost is an in-memory stand-in for the host table that a backend
// arbitrates: several engines given backends over one memHost exclude each
// other as two daemons over one SOURCE do.
type memHost struct {
	mu      sync.Mutex
	locks   map[LockID]map[*memLease]Mode
	tokens  map[LockID]uint64
	changed chan struct{}
	claims  int  // Claim calls, for tests counting backend traffic
	noDone  bool // leases return a nil Done channel, as local ones do
	// noContended: leases' Contended returns nil (the backend cannot
	// tell of waiters outside the engine).
	noContended bool
	// yielded maps a lock to the backend that released a lease of it
	// that another backend's claim waited for: that backend's claims of
	// the lock wait while such a claim does, so that the waiter gets its
	// turn (as a fair backend orders them; the local backend skips its
	// non-blocking attempt). The next grant to another backend ends it.
	yielded map[LockID]*memBackend
	// waits are the claims and upgrades asleep in waitFor, with the mode
	// each waits for.
	waits map[*memLease]Mode
	// parked counts waits asleep on the current changed channel.
	parked map[*memLease]chan struct{}
	// downgradeGate, if set, is received from before a Convert that
	// lowers a lease's mode takes effect (the lease keeps its old mode
	// meanwhile, as a real backend's does during the call).
	downgradeGate chan struct{}
	// upgradeGate, likewise, before a Convert that raises it, and
	// claimGate before a Claim.
	upgradeGate chan struct{}
	claimGate   chan struct{}
	// tokenGate, if set, is received from (or ctx ends) before NextToken
	// on tokenGateLock answers; tokenEntered, if set, is sent to first.
	tokenGate     chan struct{}
	tokenGateLock LockID
	tokenEntered  chan struct{}
}

// quiet reports how many backend waits are asleep with no wake-up pending.
func (h *memHost) quiet() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, ch := range h.parked {
		if ch == h.changed {
			n++
		}
	}
	return n
}

func newMemHost() *memHost {
	return &memHost{locks: map[LockID]map[*memLease]Mode{}, tokens: map[LockID]uint64{}, changed: make(chan struct{}), parked: map[*memLease]chan struct{}{},
		yielded: map[LockID]*memBackend{}, waits: map[*memLease]Mode{}}
}

type memBackend struct {
	host *memHost
	// leases are the claims this backend holds, released by Close.
	// GUARDED_BY(host.mu)
	leases map[*memLease]bool
}

type memLease struct {
	host    *memHost
	backend *memBackend
	id      LockID
	mode    Mode
	done    chan struct{}
	err     error
	// contended is Contended's channel, made when first asked; wanted
	// says that a claim of another backend waits for this lease (and
	// contended, if made, is closed). GUARDED_BY(host.mu)
	contended chan struct{}
	wanted    bool
}

var _ ContendedLease = (*memLease)(nil)

// Contended returns a channel closed once a claim or upgrade of another
// backend (another engine: another daemon, for the engine asking) waits
// for a mode that conflicts with l's.
func (l *memLease) Contended() <-chan struct{} {
	l.host.mu.Lock()
	defer l.host.mu.Unlock()
	if l.host.noContended {
		return nil
	}
	if l.contended == nil {
		l.contended = make(chan struct{})
		if l.wanted {
			close(l.contended)
		}
	}
	return l.contended
}

// wantLocked records that l is waited for from outside its engine.
func (l *memLease) wantLocked() {
	if l.wanted {
		return
	}
	l.wanted = true
	if l.contended != nil {
		close(l.contended)
	}
}

// contendedAsked reports whether the engine asked l for Contended.
func (l *memLease) contendedAsked() bool {
	l.host.mu.Lock()
	defer l.host.mu.Unlock()
	return l.contended != nil
}

// Close releases every claim still held, as Backend.Close must.
func (b *memBackend) Close() error {
	b.host.mu.Lock()
	defer b.host.mu.Unlock()
	for l := range b.leases {
		delete(b.host.locks[l.id], l)
		l.mode = 0
	}
	b.leases = nil
	b.host.broadcastLocked()
	return nil
}

// grantableLocked reports whether l may hold id in mode.
func (h *memHost) grantableLocked(id LockID, l *memLease, mode Mode) bool {
	for o, m := range h.locks[id] {
		if o != l && Conflicts(m, mode) {
			return false
		}
	}
	if h.yielded[id] == l.backend {
		for o, m := range h.waits {
			if o.id == id && o.backend != l.backend && Conflicts(m, mode) {
				return false
			}
		}
	}
	return true
}

func (h *memHost) broadcastLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *memHost) waitFor(ctx context.Context, id LockID, l *memLease, mode Mode, wait bool) error {
	h.mu.Lock()
	for !h.grantableLocked(id, l, mode) {
		if !wait {
			h.mu.Unlock()
			return ErrWouldBlock
		}
		for o, m := range h.locks[id] {
			if o.backend != l.backend && Conflicts(m, mode) {
				o.wantLocked()
			}
		}
		ch := h.changed
		h.parked[l] = ch
		h.waits[l] = mode
		h.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			h.mu.Lock()
			delete(h.parked, l)
			delete(h.waits, l)
			h.broadcastLocked()
			h.mu.Unlock()
			return ctx.Err()
		}
		h.mu.Lock()
		delete(h.parked, l)
		delete(h.waits, l)
	}
	if y := h.yielded[id]; y != nil && y != l.backend {
		delete(h.yielded, id)
	}
	if h.locks[id] == nil {
		h.locks[id] = map[*memLease]Mode{}
	}
	h.locks[id][l] = mode
	l.mode = mode
	h.broadcastLocked()
	h.mu.Unlock()
	return nil
}

func (b *memBackend) Claim(ctx context.Context, id LockID, mode Mode, wait bool) (Lease, error) {
	b.host.mu.Lock()
	b.host.claims++
	gate := b.host.claimGate
	b.host.mu.Unlock()
	if gate != nil {
		<-gate
	}
	l := &memLease{host: b.host, id: id, done: make(chan struct{}), backend: b}
	if err := b.host.waitFor(ctx, id, l, mode, wait); err != nil {
		return nil, err
	}
	b.host.mu.Lock()
	if b.leases == nil {
		b.leases = map[*memLease]bool{}
	}
	b.leases[l] = true
	b.host.mu.Unlock()
	return l, nil
}

func (l *memLease) Mode() Mode {
	l.host.mu.Lock()
	defer l.host.mu.Unlock()
	return l.mode
}

func (l *memLease) Convert(ctx context.Context, mode Mode, wait bool) error {
	l.host.mu.Lock()
	gate := l.host.downgradeGate
	if mode > l.mode {
		gate = l.host.upgradeGate
	} else if mode == l.mode {
		gate = nil
	}
	l.host.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return l.host.waitFor(ctx, l.id, l, mode, wait)
}

func (l *memLease) NextToken(ctx context.Context) (uint64, error) {
	l.host.mu.Lock()
	gate, entered := l.host.tokenGate, l.host.tokenEntered
	if l.id != l.host.tokenGateLock {
		gate, entered = nil, nil
	}
	l.host.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	l.host.mu.Lock()
	defer l.host.mu.Unlock()
	l.host.tokens[l.id]++
	return l.host.tokens[l.id], nil
}

func (l *memLease) Done() <-chan struct{} {
	if l.host.noDone {
		return nil
	}
	return l.done
}

func (l *memLease) Err() error {
	l.host.mu.Lock()
	defer l.host.mu.Unlock()
	return l.err
}

// lose simulates a lost lease.
func (l *memLease) lose(err error) {
	l.host.mu.Lock()
	defer l.host.mu.Unlock()
	if l.err == nil {
		l.err = err
		delete(l.host.locks[l.id], l)
		close(l.done)
		l.host.broadcastLocked()
	}
}

func (l *memLease) Release(ctx context.Context) error {
	l.host.mu.Lock()
	defer l.host.mu.Unlock()
	delete(l.host.locks[l.id], l)
	delete(l.backend.leases, l)
	if l.wanted {
		l.host.yielded[l.id] = l.backend
	}
	l.mode = 0
	l.host.broadcastLocked()
	return nil
}

// leaseOf returns the memLease an engine holds for id, for tests.
func leaseOf(e *Engine, id LockID) *memLease {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ls := e.locks[id]; ls != nil {
		if l, ok := ls.lease.(*memLease); ok {
			return l
		}
	}
	return nil
}

// watchCounts returns how many watches of pid were started and how many
// are still waiting.
func (t *fakeTree) watchCounts(pid int) (started, waiting int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.waits[pid], t.waiting[pid]
}

// tableLen is the number of locks in e's table.
func tableLen(e *Engine) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.locks)
}
