package gcsbackend_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/lockmgr"
)

// testTTL is the short lease TTL of the multi-host tests: refresh every 1s,
// vouching for 2.7s after a refresh is sent, stale after 4s unchanged.
const testTTL = 3 * time.Second

var hostSeq atomic.Int64

// newBackend returns a backend on the emulator's bucket, through endpoint
// if given (a fault proxy), closed when t ends.
func newBackend(t *testing.T, emu *gcstest.Emulator, mod func(*gcsbackend.Config)) *gcsbackend.Backend {
	t.Helper()
	cfg := gcsbackend.Config{
		Bucket:   emu.Bucket,
		Prefix:   "test/" + t.Name(),
		Endpoint: emu.Endpoint(),
		TTL:      testTTL,
		WantPoll: 250 * time.Millisecond,
		HostID:   fmt.Sprintf("host%d", hostSeq.Add(1)),
		Logger:   testLogger(t),
	}
	if mod != nil {
		mod(&cfg)
	}
	b, err := gcsbackend.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("close %s: %v", cfg.HostID, err)
		}
	})
	return b
}

// testLogger logs to t at Info and above.
func testLogger(t *testing.T) logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(tWriter{t})
	l.SetLevel(logrus.InfoLevel)
	return l
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	defer func() { recover() }() // a log line after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// fakeProcs is a process tree where every thread id is a process of its
// own with no ancestors, so that each test client is a stranger to every
// other.
type fakeProcs struct{}

func (fakeProcs) Lineage(tid int) (lockmgr.Lineage, error) {
	return lockmgr.Lineage{{PID: tid, Start: 1}}, nil
}
func (fakeProcs) Alive(lockmgr.ProcID) bool { return true }

// newEngine returns an engine over b, closed when t ends (before b).
func newEngine(t *testing.T, b *gcsbackend.Backend, onLoss func(lockmgr.LostHold)) *lockmgr.Engine {
	t.Helper()
	e, err := lockmgr.New(lockmgr.Config{Backend: b, Processes: fakeProcs{}, Host: b.HostID(),
		Logger: testLogger(t), OnLoss: onLoss})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close engine %s: %v", b.HostID(), err)
		}
	})
	return e
}

func dirLock(p string) lockmgr.LockID { return lockmgr.LockID{Path: p, Kind: lockmgr.KindDir} }

// request is a flock-style request by client c (its own process and open
// file description).
func request(p string, mode lockmgr.Mode, c int, wait bool) lockmgr.Request {
	return lockmgr.Request{Lock: dirLock(p), Mode: mode,
		Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: uint64(c)}, TID: c, Wait: wait}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// critical is the resource the multi-host tests protect. It counts the
// holders inside, flags an exclusive holder that is not alone, and checks
// the fencing rule: an exclusive grant's token is above every token that
// entered before it, and every grant's token is above every exclusive
// token that entered before it.
type critical struct {
	mu                   sync.Mutex
	exclusive, shared    int
	maxTok, maxExclusive uint64
	entries              int
	violations           []string
}

func (c *critical) enter(who string, mode lockmgr.Mode, tok uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries++
	if mode == lockmgr.Exclusive {
		c.exclusive++
	} else {
		c.shared++
	}
	if c.exclusive > 1 || (c.exclusive == 1 && c.shared > 0) {
		c.violations = append(c.violations, fmt.Sprintf("%s entered %v: %d exclusive and %d shared inside", who, mode, c.exclusive, c.shared))
	}
	if tok == 0 {
		// Not this lock's token: skip the fencing check.
	} else if tok <= c.maxExclusive || (mode == lockmgr.Exclusive && tok <= c.maxTok) {
		c.violations = append(c.violations, fmt.Sprintf("%s entered %v with token %#x; highest before %#x, highest exclusive %#x", who, mode, tok, c.maxTok, c.maxExclusive))
	}
	c.maxTok = max(c.maxTok, tok)
	if mode == lockmgr.Exclusive {
		c.maxExclusive = max(c.maxExclusive, tok)
	}
}

func (c *critical) exit(mode lockmgr.Mode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if mode == lockmgr.Exclusive {
		c.exclusive--
	} else {
		c.shared--
	}
}

func (c *critical) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, v := range c.violations {
		if i == 10 {
			t.Errorf("... and %d more", len(c.violations)-10)
			break
		}
		t.Error(v)
	}
}
