package lockmgr

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// The protocol scripts in testdata/*.txt drive engines step by step and
// compare what happens with what is written down. Each command is a line,
// followed by "----" and the expected output up to a blank line:
//
//	proc PID parent=PPID          declare a process (thread id == pid)
//	advance DURATION              move the engines' clock (e.g. 300ms):
//	                              timers due by then fire
//	exit PID                      the process dies (its holds stay: its
//	                              descriptors may live on in children)
//	fd PID owner=NAME             PID holds a descriptor of NAME's open
//	                              file description (inherited, passed); the
//	                              process that locks through it holds one
//	close PID owner=NAME          ...and no longer does
//	acquire OWNER pid=N path=P [kind=dir|newdir|usage] mode=s|x
//	        [nowait] [class=file|posix] [engine=E] [token=no]
//	                              -> granted token=T | waiting | error: E
//	release OWNER path=P [kind=K] -> ok | error: notheld
//	cancel OWNER                  interrupt OWNER's waiting acquire
//	lose path=P [kind=K] [engine=E]   the backend loses the lease
//	break path=P [kind=K]         an operator breaks the lock
//	mkdir pid=N path=P            N created directory P (AdoptNewDir)
//	rmdir pid=N path=P            N removes directory P: its adopted lock
//	                              is given up if N may (GiveUpAdopted)
//	status path=P [kind=K] [engine=E] -> the holders and waiters
//	engine E [keepcontended]      declare engine E (before its first use);
//	                              keepcontended: Config.KeepContended
//	nocontended                   leases cannot tell of waiters outside
//	                              their engine (Contended returns nil)
//	asked path=P [kind=K] [engine=E]  -> whether E asked its lease of P
//	                              whether someone outside waits
//
// After every command the engines are allowed to settle; every pending
// acquire that finished is printed as "OWNER: <result>", sorted.
// Set LOCKFS_REWRITE=1 to print the actual output of a failing script.

type scriptEnv struct {
	t        *testing.T
	tree     *fakeTree
	host     *memHost
	clock    *fakeClock
	tick     atomic.Int64 // the engines' Now: one nanosecond per call
	engines  map[string]*Engine
	owners   map[string]Owner
	ownerTID map[string]int
	ownerIno map[string]uint64
	pending  map[string]*pendingAcquire
	// parked: acquires go through AcquireAsync, which parks a request
	// that sleeps in a queue without a goroutine (park.go).
	parked bool
}

type pendingAcquire struct {
	engine *Engine
	tid    int
	cancel context.CancelFunc
	done   chan error
	token  uint64
	result string
	// cancelled: the acquire was interrupted and must finish.
	cancelled bool
	// hideToken: print "granted" alone (for grants that race each other).
	hideToken bool
}

func newScriptEnv(t *testing.T) *scriptEnv {
	env := &scriptEnv{
		t: t, tree: newFakeTree(), host: newMemHost(), clock: newFakeClock(),
		engines: map[string]*Engine{}, owners: map[string]Owner{}, ownerTID: map[string]int{},
		ownerIno: map[string]uint64{}, pending: map[string]*pendingAcquire{},
	}
	t.Cleanup(func() {
		for _, p := range env.pending {
			p.cancel()
			<-p.done
		}
		for _, e := range env.engines {
			if err := e.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})
	return env
}

func (env *scriptEnv) engine(name string) *Engine {
	return env.engineWith(name, false)
}

// engineWith returns engine name, creating it with keepContended
// (Config.KeepContended) if it does not exist yet.
func (env *scriptEnv) engineWith(name string, keepContended bool) *Engine {
	if name == "" {
		name = "e1"
	}
	e := env.engines[name]
	if e == nil {
		var err error
		e, err = New(Config{Backend: &memBackend{host: env.host}, Processes: env.tree, Host: name,
			Now:           func() time.Time { return time.Unix(0, env.tick.Add(1)) },
			After:         env.clock.after,
			KeepContended: keepContended})
		if err != nil {
			env.t.Fatal(err)
		}
		env.engines[name] = e
	}
	return e
}

func errName(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrWouldBlock):
		return "wouldblock"
	case errors.Is(err, ErrDeadlock):
		return "deadlock"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrLeaseLost):
		return "leaselost"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrNotHeld):
		return "notheld"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return err.Error()
}

func result(err error) string {
	if err == nil {
		return "ok"
	}
	return "error: " + errName(err)
}

func parseArgs(fields []string) map[string]string {
	args := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			v = "true"
		}
		args[k] = v
	}
	return args
}

func (env *scriptEnv) lockID(args map[string]string) LockID {
	k := KindDir
	if s := args["kind"]; s != "" {
		var err error
		if k, err = ParseKind(s); err != nil {
			env.t.Fatal(err)
		}
	}
	return LockID{Path: args["path"], Kind: k}
}

func (env *scriptEnv) owner(name string, class string) Owner {
	o, ok := env.owners[name]
	if !ok {
		c := OwnerFile
		if class == "posix" {
			c = OwnerPOSIX
		}
		o = Owner{Class: c, ID: uint64(len(env.owners) + 1)}
		env.owners[name] = o
	}
	return o
}

// settle waits until every pending acquire has finished or sleeps with no
// wake-up pending, in the engine or in the backend.
func (env *scriptEnv) settle() {
	deadline := time.Now().Add(5 * time.Second)
	for {
		inBackend := 0
		for _, p := range env.pending {
			if p.result != "" {
				continue
			}
			select {
			case err := <-p.done:
				if err == nil && p.hideToken {
					p.result = "granted"
				} else if err == nil {
					p.result = fmt.Sprintf("granted token=%d", p.token)
				} else {
					p.result = "error: " + errName(err)
				}
				continue
			default:
			}
			if p.cancelled {
				inBackend = 1 << 30 // never quiet until it has finished
			} else if !p.engine.quiescent(p.tid, env.clock.fired) {
				inBackend++
			}
		}
		if env.host.quiet() >= inBackend && env.exitsHandled() {
			return
		}
		if time.Now().After(deadline) {
			env.t.Fatalf("engines did not settle")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// quiescent reports whether thread tid sleeps in e with no wake-up
// pending: on its queue entry's channel, or on a lock's current changed
// channel, and its grace timer (if any) has not fired (fired says).
func (e *Engine) quiescent(tid int, fired func(<-chan time.Time) bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	pk, parked := e.parked[tid]
	if !parked || (pk.timer != nil && fired(pk.timer)) {
		return false
	}
	if w := e.waiting[tid]; w != nil && w.wake == pk.ch {
		return !w.signalled
	}
	for _, ls := range e.locks {
		if ls.changed == pk.ch {
			return true
		}
	}
	return false
}

// exitsHandled reports whether every engine has handled every exit of a
// process it watches.
func (env *scriptEnv) exitsHandled() bool {
	for _, e := range env.engines {
		e.mu.Lock()
		busy := e.exitWork > 0
		for p, w := range e.watches {
			if !w.exited && env.tree.isDead(p.PID) {
				busy = true
			}
		}
		e.mu.Unlock()
		if busy {
			return false
		}
	}
	return true
}

// fakeClock is the engines' After: its timers fire when a script advances
// it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Duration
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Duration
	ch chan time.Time
}

// fired reports whether timer ch has fired.
func (c *fakeClock) fired(ch <-chan time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.timers {
		if t.ch == ch {
			return false
		}
	}
	return true
}

func newFakeClock() *fakeClock { return &fakeClock{} }

func (c *fakeClock) after(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.timers = append(c.timers, fakeTimer{at: c.now + d, ch: ch})
	return ch
}

// advance moves the clock by d and fires the timers due.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now += d
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at <= c.now {
			t.ch <- time.Unix(0, 0).Add(t.at)
		} else {
			kept = append(kept, t)
		}
	}
	c.timers = kept
}

// ino is the inode number of a lock's control file in the scripts.
func ino(id LockID) uint64 {
	h := uint64(14695981039346656037)
	for _, b := range []byte(id.String()) {
		h = (h ^ uint64(b)) * 1099511628211
	}
	return h
}

func (env *scriptEnv) finished() []string {
	var out []string
	for name, p := range env.pending {
		if p.result != "" {
			out = append(out, name+": "+p.result)
			delete(env.pending, name)
		}
	}
	sort.Strings(out)
	return out
}

func (env *scriptEnv) run(line string) []string {
	fields := strings.Fields(line)
	args := parseArgs(fields[1:])
	var out []string
	switch fields[0] {
	case "proc":
		pid, _ := strconv.Atoi(fields[1])
		ppid, _ := strconv.Atoi(args["parent"])
		env.tree.add(pid, ppid)
	case "engine":
		if env.engines[fields[1]] != nil {
			env.t.Fatalf("%s: engine %s is in use already", line, fields[1])
		}
		env.engineWith(fields[1], args["keepcontended"] != "")
	case "nocontended":
		env.host.mu.Lock()
		env.host.noContended = true
		env.host.mu.Unlock()
	case "asked":
		l := leaseOf(env.engine(args["engine"]), env.lockID(args))
		out = append(out, fmt.Sprintf("asked=%v", l != nil && l.contendedAsked()))
	case "advance":
		d, err := time.ParseDuration(fields[1])
		if err != nil {
			env.t.Fatal(err)
		}
		env.clock.advance(d)
	case "exit":
		pid, _ := strconv.Atoi(fields[1])
		env.tree.exit(pid)
	case "fd", "close":
		pid, _ := strconv.Atoi(fields[1])
		o, ok := env.owners[args["owner"]]
		if !ok {
			env.t.Fatalf("%s: unknown owner %q", line, args["owner"])
		}
		d := fakeDesc{ino: env.ownerIno[args["owner"]], id: o.ID}
		if fields[0] == "fd" {
			env.tree.open(pid, d)
		} else {
			env.tree.close(pid, d)
		}
	case "acquire":
		name := fields[1]
		pid, _ := strconv.Atoi(args["pid"])
		mode := Shared
		if args["mode"] == "x" {
			mode = Exclusive
		}
		id := env.lockID(args)
		req := Request{Lock: id, Mode: mode, Owner: env.owner(name, args["class"]),
			TID: pid, UID: 1000, Wait: args["nowait"] == "", Ino: ino(id)}
		// The requester holds a descriptor of the owner's description.
		env.ownerIno[name] = ino(id)
		if req.Owner.Class == OwnerFile {
			env.tree.open(pid, fakeDesc{ino: ino(id), id: req.Owner.ID})
		}
		e := env.engine(args["engine"])
		ctx, cancel := context.WithCancel(context.Background())
		p := &pendingAcquire{engine: e, tid: pid, cancel: cancel, done: make(chan error, 1), hideToken: args["token"] == "no"}
		env.pending[name] = p
		env.start(ctx, p, req)
		env.settle()
		if p.result == "" {
			out = append(out, "waiting")
		} else {
			out = append(out, p.result)
			delete(env.pending, name)
		}
	case "release":
		o := env.owners[fields[1]]
		err := env.engine(args["engine"]).Release(context.Background(), env.lockID(args), o)
		out = append(out, result(err))
	case "cancel":
		p := env.pending[fields[1]]
		if p == nil {
			env.t.Fatalf("cancel %s: not pending", fields[1])
		}
		p.cancel()
		p.cancelled = true
		out = append(out, "ok")
	case "lose":
		l := leaseOf(env.engine(args["engine"]), env.lockID(args))
		if l == nil {
			out = append(out, "no lease")
			break
		}
		l.lose(errors.New("test lost it"))
		// The engine learns of the loss asynchronously, from Done.
		for deadline := time.Now().Add(5 * time.Second); leaseOf(env.engine(args["engine"]), env.lockID(args)) == l; {
			if time.Now().After(deadline) {
				env.t.Fatal("engine did not notice the lost lease")
			}
			time.Sleep(100 * time.Microsecond)
		}
		out = append(out, "ok")
	case "mkdir":
		pid, _ := strconv.Atoi(args["pid"])
		dir, name := path.Split(args["path"])
		ok, err := env.engine(args["engine"]).AdoptNewDir(context.Background(), strings.TrimSuffix(dir, "/"), name, pid)
		out = append(out, fmt.Sprintf("adopted=%v %s", ok, result(err)))
	case "rmdir":
		pid, _ := strconv.Atoi(args["pid"])
		dir, name := path.Split(args["path"])
		out = append(out, fmt.Sprintf("gaveup=%v", env.engine(args["engine"]).GiveUpAdopted(strings.TrimSuffix(dir, "/"), name, pid)))
	case "break":
		out = append(out, result(env.engine(args["engine"]).Break(context.Background(), env.lockID(args))))
	case "status":
		st := env.engine(args["engine"]).Status(env.lockID(args))
		out = append(out, fmt.Sprintf("mode=%s implicit=%d lease=%s", st.Mode, st.Implicit, st.Lease))
		names := map[Owner]string{}
		for n, o := range env.owners {
			names[o] = n
		}
		var hl []string
		for _, h := range st.Holders {
			s := fmt.Sprintf("holder %s pid=%d", names[h.Owner], h.Process.PID)
			if h.Explicit {
				s += " " + h.Mode.String()
			}
			if h.Implicit > 0 {
				s += fmt.Sprintf(" implicit=%d", h.Implicit)
			}
			if h.Lost != nil {
				s += " lost"
			}
			hl = append(hl, s)
		}
		sort.Strings(hl)
		out = append(out, hl...)
		for _, w := range st.Waiters {
			s := fmt.Sprintf("waiter %s %s", names[w.Owner], w.Mode)
			if w.Implicit {
				s += " implicit"
			}
			if w.Outside {
				s += " outside"
			}
			out = append(out, s)
		}
	default:
		env.t.Fatalf("unknown command %q", line)
	}
	if fields[0] != "acquire" {
		env.settle()
	}
	return append(out, env.finished()...)
}

func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// Each script runs with waits on goroutines (Acquire) and parked
		// (AcquireAsync): the same output either way.
		for _, parked := range []bool{false, true} {
			name := filepath.Base(f)
			if parked {
				name += "-parked"
			}
			t.Run(name, func(t *testing.T) {
				testutil.CheckGoroutines(t)
				runScript(t, string(data), parked)
			})
		}
	}
}

// start runs p's acquire of req, on a goroutine of its own (Acquire), or
// through AcquireAsync, whose goroutine returns once the request parks.
func (env *scriptEnv) start(ctx context.Context, p *pendingAcquire, req Request) {
	answer := func(g Grant, err error) {
		p.token = g.Token
		p.done <- err
	}
	if env.parked {
		go p.engine.AcquireAsync(ctx, req, answer)
		return
	}
	go func() { answer(p.engine.Acquire(ctx, req)) }()
}

func runScript(t *testing.T, script string, parked bool) {
	env := newScriptEnv(t)
	env.parked = parked
	lines := strings.Split(script, "\n")
	var rewritten []string
	failed := false
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if line == "" || strings.HasPrefix(line, "#") {
			rewritten = append(rewritten, lines[i])
			continue
		}
		var want []string
		hasExpect := i+1 < len(lines) && strings.TrimSpace(lines[i+1]) == "----"
		j := i + 1
		if hasExpect {
			for j = i + 2; j < len(lines) && strings.TrimSpace(lines[j]) != ""; j++ {
				want = append(want, strings.TrimSpace(lines[j]))
			}
		}
		got := env.run(line)
		rewritten = append(rewritten, line, "----")
		rewritten = append(rewritten, got...)
		if hasExpect {
			rewritten = append(rewritten, "")
			i = j
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			failed = true
			t.Errorf("line %d: %s\n got:\n  %s\nwant:\n  %s", i+1, line, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
	if failed && os.Getenv("LOCKFS_REWRITE") != "" {
		t.Logf("actual:\n%s", strings.Join(rewritten, "\n"))
	}
}
