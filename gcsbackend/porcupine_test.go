package gcsbackend_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// The lock as a sequential object, for porcupine: a set of holders, each
// shared or exclusive. An acquire is legal when it does not conflict, a
// release when its client holds the lock.
type lockOp struct {
	client int
	kind   string // "acquire" or "release"
	mode   lockmgr.Mode
}

type lockState struct {
	exclusive uint64 // bit per client
	shared    uint64
}

var lockModel = porcupine.Model{
	Init: func() any { return lockState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, op := state.(lockState), input.(lockOp)
		bit := uint64(1) << op.client
		switch {
		case op.kind == "release":
			if (s.exclusive|s.shared)&bit == 0 {
				return false, s
			}
			s.exclusive &^= bit
			s.shared &^= bit
			return true, s
		case op.mode == lockmgr.Exclusive:
			if s.exclusive != 0 || s.shared != 0 {
				return false, s
			}
			s.exclusive |= bit
			return true, s
		default:
			if s.exclusive != 0 {
				return false, s
			}
			s.shared |= bit
			return true, s
		}
	},
	DescribeOperation: func(input, _ any) string {
		op := input.(lockOp)
		return fmt.Sprintf("c%d %s %v", op.client, op.kind, op.mode)
	},
}

// history records operations with monotonic timestamps.
type history struct {
	mu  sync.Mutex
	t0  time.Time
	ops []porcupine.Operation
}

func (h *history) now() int64 { return int64(time.Since(h.t0)) }

func (h *history) add(op lockOp, call, ret int64) { h.addOp(op.client, op, call, ret) }

// addOp records any operation of client.
func (h *history) addOp(client int, input any, call, ret int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: input, Call: call, Return: ret})
}

// Acquires and releases from three clients on each of two hosts, contending
// for one lock in random modes, form a linearizable history of a lock.
func TestPorcupineHistory(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	ea := newEngine(t, newBackend(t, emu, nil), nil)
	eb := newEngine(t, newBackend(t, emu, nil), nil)
	ctx := ctxT(t, 90*time.Second)
	h := &history{t0: time.Now()}
	var cs critical

	var deadlocks atomic.Int64
	const clientsPerHost, rounds = 3, 8
	var wg sync.WaitGroup
	for c := 0; c < 2*clientsPerHost; c++ {
		e := ea
		if c >= clientsPerHost {
			e = eb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for range rounds {
				mode := lockmgr.Shared
				if rng.IntN(3) > 0 {
					mode = lockmgr.Exclusive
				}
				op := lockOp{client: c, kind: "acquire", mode: mode}
				call := h.now()
				g, err := e.Acquire(ctx, request("p", mode, 100+c, true))
				for errors.Is(err, lockmgr.ErrDeadlock) {
					// Two hosts upgrading shared claims: one gives way
					// (see the note on the engine's lease hand-over).
					deadlocks.Add(1)
					time.Sleep(time.Duration(50+rng.IntN(100)) * time.Millisecond)
					call = h.now()
					g, err = e.Acquire(ctx, request("p", mode, 100+c, true))
				}
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				h.add(op, call, h.now())
				cs.enter(fmt.Sprintf("client %d", c), mode, g.Token)
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				cs.exit(mode)
				call = h.now()
				if err := e.Release(ctx, dirLock("p"), ownerOf(100+c)); err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				h.add(lockOp{client: c, kind: "release", mode: mode}, call, h.now())
				time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	cs.check(t)
	res := porcupine.CheckOperationsTimeout(lockModel, h.ops, 30*time.Second)
	t.Logf("%d operations, %d critical-section entries, %d upgrade deadlocks broken: %v", len(h.ops), cs.entries, deadlocks.Load(), res)
	if res != porcupine.Ok {
		t.Fatalf("history of %d operations is not linearizable (%v)", len(h.ops), res)
	}
}

// The control: porcupine flags a history in which two clients held the
// lock exclusively at once.
func TestPorcupineFlagsOverlap(t *testing.T) {
	x := func(c int, kind string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: lockOp{client: c, kind: kind, mode: lockmgr.Exclusive}, Call: call, Return: ret}
	}
	bad := []porcupine.Operation{
		x(0, "acquire", 0, 1), x(1, "acquire", 2, 3), x(0, "release", 4, 5), x(1, "release", 6, 7),
	}
	if res := porcupine.CheckOperationsTimeout(lockModel, bad, 10*time.Second); res != porcupine.Illegal {
		t.Fatalf("overlapping exclusive holds: %v, want Illegal", res)
	}
	good := []porcupine.Operation{
		x(0, "acquire", 0, 1), x(0, "release", 2, 3), x(1, "acquire", 4, 5), x(1, "release", 6, 7),
	}
	if res := porcupine.CheckOperationsTimeout(lockModel, good, 10*time.Second); res != porcupine.Ok {
		t.Fatalf("sequential holds: %v, want Ok", res)
	}
}
