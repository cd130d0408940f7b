package lockmgr_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// The engine over the local backend, with real processes: every engine
// hold, the implicit ancestor holds included, is a kernel flock on a
// backing file in SOURCE, so flock(1) on those files and a second engine
// over the same SOURCE exclude and are excluded.

func newLocalEngine(t *testing.T, src string) *lockmgr.Engine {
	t.Helper()
	return newLocalEngineWith(t, src, lockmgr.Config{})
}

// newLocalEngineWith is newLocalEngine with cfg's other fields.
func newLocalEngineWith(t *testing.T, src string, cfg lockmgr.Config) *lockmgr.Engine {
	t.Helper()
	b, err := localbackend.New(localbackend.Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := procinfo.NewTree(procinfo.TreeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Backend, cfg.Processes = b, procs
	e, err := lockmgr.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

func mkdirs(t *testing.T, src string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// flockN runs `flock -n [-s] FILE true` and reports whether it got the lock.
func flockN(t *testing.T, file string, shared bool) bool {
	t.Helper()
	args := []string{"-n", "-E", "75"}
	if shared {
		args = append(args, "-s")
	}
	cmd := exec.Command("flock", append(args, file, "true")...)
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &ee) && ee.ExitCode() == 75:
		return false
	}
	t.Fatalf("flock %v: %v", args, err)
	return false
}

func req(path string, mode lockmgr.Mode, owner uint64, wait bool) lockmgr.Request {
	return lockmgr.Request{Lock: lockmgr.LockID{Path: path, Kind: lockmgr.KindDir}, Mode: mode,
		Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: owner}, TID: unix.Gettid(), Wait: wait}
}

func TestLocalEngineAndFlock(t *testing.T) {
	src := t.TempDir()
	mkdirs(t, src, "a/b", "c")
	e := newLocalEngine(t, src)
	ctx := context.Background()

	// The engine's exclusive a/b holds a/b/..LOCK exclusively and the
	// ancestors' ..LOCK shared.
	if _, err := e.Acquire(ctx, req("a/b", lockmgr.Exclusive, 1, false)); err != nil {
		t.Fatal(err)
	}
	if flockN(t, filepath.Join(src, "a/b/..LOCK"), true) {
		t.Error("flock -s on a/b/..LOCK got in beside the engine's exclusive hold")
	}
	if !flockN(t, filepath.Join(src, "a/..LOCK"), true) {
		t.Error("flock -s on a/..LOCK was refused: the ancestor should be held shared only")
	}
	if flockN(t, filepath.Join(src, "a/..LOCK"), false) {
		t.Error("flock -x on a/..LOCK got in while a/b is held below it")
	}
	// The control: an unrelated directory is free.
	if !flockN(t, filepath.Join(src, "c/..LOCK"), false) {
		t.Error("control: flock -x on c/..LOCK was refused")
	}
	if err := e.Release(ctx, lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindDir}, lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1}); err != nil {
		t.Fatal(err)
	}
	// The backend keeps a's shared flock a few ms after the release
	// (localbackend/keep.go): a direct locker waits for it, and gets it.
	if out, err := exec.Command("flock", "-w", "30", "-x", filepath.Join(src, "a/..LOCK"), "true").CombinedOutput(); err != nil {
		t.Errorf("after release, flock -w 30 -x on a/..LOCK: %v: %s", err, out)
	}

	// And the other way: flock(1) holding c/..LOCK excludes the engine
	// until it exits; a blocking acquire waits for it without spinning.
	// One process holds it (flock(1) with a command would fork a child
	// that keeps the descriptor): sh takes the lock on fd 9, then becomes
	// sleep.
	holder := exec.Command("sh", "-c", "exec 9>>\"$1\" && flock 9 && exec sleep 1000", "sh", filepath.Join(src, "c/..LOCK"))
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	for flockN(t, filepath.Join(src, "c/..LOCK"), true) {
		time.Sleep(10 * time.Millisecond) // until flock(1) holds it
	}
	if _, err := e.Acquire(ctx, req("c", lockmgr.Shared, 2, false)); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("acquire beside flock(1): %v, want ErrWouldBlock", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.Acquire(ctx, req("c", lockmgr.Shared, 2, true))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("blocking acquire returned while flock(1) holds the lock: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	// A killed process's claim vanishes: kill -9 the holder.
	holder.Process.Kill()
	holder.Wait()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("acquire did not proceed after the flock(1) holder was killed")
	}
}

func TestTwoLocalEngines(t *testing.T) {
	src := t.TempDir()
	mkdirs(t, src, "a/b", "x")
	e1 := newLocalEngine(t, src)
	e2 := newLocalEngine(t, src)
	ctx := context.Background()
	g1, err := e1.Acquire(ctx, req("a/b", lockmgr.Shared, 1, false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e2.Acquire(ctx, req("a", lockmgr.Exclusive, 1, false)); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("e2 exclusive on a while e1 holds a/b: %v, want ErrWouldBlock", err)
	}
	g2, err := e2.Acquire(ctx, req("a/b", lockmgr.Shared, 1, false))
	if err != nil {
		t.Fatalf("e2 shared beside e1 shared: %v", err)
	}
	// Fencing tokens increase across the two engines.
	if g2.Token <= g1.Token {
		t.Fatalf("tokens %d then %d: not increasing across engines", g1.Token, g2.Token)
	}
	// Control: a sibling is free for e2.
	if _, err := e2.Acquire(ctx, req("x", lockmgr.Exclusive, 2, false)); err != nil {
		t.Fatalf("control: e2 exclusive on x: %v", err)
	}
	if err := e1.Release(ctx, lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindDir}, lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e2.Release(ctx, lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindDir}, lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1}); err != nil {
		t.Fatal(err)
	}
	// e1 keeps its shared flock on a for a few ms (localbackend/keep.go):
	// e2 waits for it.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := e2.Acquire(wctx, req("a", lockmgr.Exclusive, 1, true)); err != nil {
		t.Fatalf("e2 exclusive on a after both released: %v", err)
	}
}

// sleepers starts n processes that only sleep, as requesters with real
// process ids of their own (not this test process, whose lineage every
// goroutine shares). Cleanup kills them.
func sleepers(t *testing.T, n int) []int {
	t.Helper()
	pids := make([]int, n)
	for i := range pids {
		pids[i] = testutil.StartInSession(t, exec.Command("sleep", "1000")).Process.Pid
	}
	return pids
}

// Fairness across daemons (SPEC §2.7): one engine under continuous demand
// for f (three requesters, each taking it again as soon as it let it go,
// so one always waits), another engine over the same SOURCE asks for it
// exclusively. It gets it, whether the demand is exclusive or a stream of
// overlapping shared holds. The control: with Config.KeepContended the
// busy engine hands the lock on locally, and the other waits on.
func TestTwoLocalEnginesTakeTurns(t *testing.T) {
	for _, c := range []struct {
		name          string
		mode          lockmgr.Mode
		keepContended bool
	}{
		{"exclusive demand", lockmgr.Exclusive, false},
		{"shared demand", lockmgr.Shared, false},
		{"control exclusive demand", lockmgr.Exclusive, true},
		{"control shared demand", lockmgr.Shared, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := t.TempDir()
			mkdirs(t, src, "f")
			busy := newLocalEngineWith(t, src, lockmgr.Config{KeepContended: c.keepContended})
			other := newLocalEngine(t, src)
			pids := sleepers(t, 4)

			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var grants atomic.Int64
			for i, pid := range pids[:3] {
				wg.Add(1)
				go func() {
					defer wg.Done()
					owner := lockmgr.Owner{Class: lockmgr.OwnerFile, ID: uint64(i + 1)}
					r := lockmgr.Request{Lock: lockmgr.LockID{Path: "f", Kind: lockmgr.KindDir}, Mode: c.mode, Owner: owner, TID: pid, Wait: true}
					// Staggered, so that shared holds overlap and the
					// lock is never free between them.
					time.Sleep(time.Duration(i) * 17 * time.Millisecond)
					for ctx.Err() == nil {
						if _, err := busy.Acquire(ctx, r); err != nil {
							if ctx.Err() == nil {
								t.Errorf("busy engine: %v", err)
							}
							return
						}
						grants.Add(1)
						time.Sleep(50 * time.Millisecond)
						busy.Release(context.Background(), r.Lock, owner)
					}
				}()
			}
			defer wg.Wait()
			defer stop()
			for deadline := time.Now().Add(20 * time.Second); grants.Load() < 6; {
				if time.Now().After(deadline) {
					t.Fatal("the busy engine's requesters made no progress")
				}
				time.Sleep(5 * time.Millisecond)
			}

			bound := 20 * time.Second
			tries := 1
			if c.keepContended {
				// A loaded machine may leave the busy engine a moment with
				// no holder (all three between a release and their next
				// grant): the control fails only if the other engine gets
				// the lock in every try.
				bound, tries = 1500*time.Millisecond, 6
			}
			r := lockmgr.Request{Lock: lockmgr.LockID{Path: "f", Kind: lockmgr.KindDir}, Mode: lockmgr.Exclusive,
				Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 9}, TID: pids[3], Wait: true}
			for try := 1; ; try++ {
				wctx, cancel := context.WithTimeout(context.Background(), bound)
				start := time.Now()
				_, err := other.Acquire(wctx, r)
				took := time.Since(start)
				cancel()
				if err == nil {
					other.Release(context.Background(), r.Lock, r.Owner)
				}
				switch {
				case c.keepContended && err == nil && try < tries:
					// The other's turn left the busy engine's requesters
					// waiting for the backend, its lease gone: the next try
					// is a fair one only once they hold the lock again.
					t.Logf("control: the other engine got the lock in %v (try %d of %d); trying again once the busy one is busy again", took, try, tries)
					awaitGrants(t, &grants, 3, "after the other's turn")
					continue
				case c.keepContended && err == nil:
					t.Fatalf("control: the other engine got the lock in each of %d tries (the last in %v) while the busy one kept it", tries, took)
				case c.keepContended:
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("control: %v", err)
					}
				case err != nil:
					t.Fatalf("the other engine did not get the lock within %v: %v", bound, err)
				default:
					t.Logf("the other engine waited %v", took)
				}
				break
			}
			// Either way, the busy engine's requesters go on.
			awaitGrants(t, &grants, 3, "after the other's turn")
		})
	}
}

// awaitGrants waits until grants has grown by n, failing the test after 20 s.
func awaitGrants(t *testing.T, grants *atomic.Int64, n int64, when string) {
	t.Helper()
	before := grants.Load()
	for deadline := time.Now().Add(20 * time.Second); grants.Load() < before+n; {
		if time.Now().After(deadline) {
			t.Fatalf("the busy engine's requesters made no progress %s", when)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
