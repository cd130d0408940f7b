package lockmgr_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// The engine over the local backend, with real processes: every engine
// hold, the implicit ancestor holds included, is a kernel flock on a
// backing file in SOURCE, so flock(1) on those files and a second engine
// over the same SOURCE exclude and are excluded.

func newLocalEngine(t *testing.T, src string) *lockmgr.Engine {
	t.Helper()
	b, err := localbackend.New(localbackend.Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := lockmgr.NewProcTree(lockmgr.ProcTreeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := lockmgr.New(lockmgr.Config{Backend: b, Processes: procs})
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
