package fs_test

import (
	"context"
	"errors"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"
)

// lockFile is a file whose lock waits never end on their own: each waits
// until the test answers it or its context ends. Its handle answers lock
// waits later (fs.HandleLockWaitDeferrer); blockingLockFile's handle waits
// on the goroutine that serves the request (the control).
type lockFile struct {
	mu sync.Mutex
	// waits are the lock waits not answered yet, oldest first.
	// GUARDED_BY(mu)
	waits []*lockWait
	// cancelled counts the waits ended by their context. GUARDED_BY(mu)
	cancelled int
}

func (f *lockFile) Attr(ctx context.Context, a *fuse.Attr) error {
	a.Inode = 2
	a.Mode = 0o666
	return nil
}

func (f *lockFile) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fs.Handle, error) {
	return f, nil
}

func (f *lockFile) Lock(ctx context.Context, req *fuse.LockRequest) error { return syscall.EAGAIN }
func (f *lockFile) Unlock(ctx context.Context, req *fuse.UnlockRequest) error {
	return nil
}
func (f *lockFile) QueryLock(ctx context.Context, req *fuse.QueryLockRequest, resp *fuse.QueryLockResponse) error {
	return nil
}

// LockWait is the control's wait, on the serving goroutine.
func (f *lockFile) LockWait(ctx context.Context, req *fuse.LockWaitRequest) error {
	done := make(chan error, 1)
	f.LockWaitDeferred(ctx, req, func(err error) { done <- err })
	return <-done
}

// lockWait is a lock wait not answered yet.
type lockWait struct {
	answer func(error)
	stop   func() bool // the context's watch
}

// LockWaitDeferred queues answer; the context's end answers it with the
// context's error.
func (f *lockFile) LockWaitDeferred(ctx context.Context, req *fuse.LockWaitRequest, answer func(error)) {
	w := &lockWait{answer: answer}
	f.mu.Lock()
	f.waits = append(f.waits, w)
	w.stop = context.AfterFunc(ctx, func() {
		if f.take(w) {
			f.mu.Lock()
			f.cancelled++
			f.mu.Unlock()
			answer(ctx.Err())
		}
	})
	f.mu.Unlock()
}

// take removes w from the waits; false if it was answered already.
func (f *lockFile) take(w *lockWait) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, q := range f.waits {
		if q == w {
			f.waits = append(f.waits[:i], f.waits[i+1:]...)
			return true
		}
	}
	return false
}

func (f *lockFile) state() (waits, cancelled int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waits), f.cancelled
}

// blockingLockFile hides LockWaitDeferred.
type blockingLockFile struct{ *lockFile }

func (f blockingLockFile) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fs.Handle, error) {
	return struct {
		fs.HandleLocker
	}{f.lockFile}, nil
}

// TestDeferredLockWaits: 16 flock(1) waits on a handle that answers later
// hold no goroutine of the server while they wait; each is answered
// once, Finish runs once per request after its answer; those whose
// flock -w runs out get EINTR (flock reports a timeout, exit 1); those
// answered with nil are granted (exit 0), with ENOLCK refused (exit 71,
// at once). Control: a handle without LockWaitDeferred holds a goroutine per
// wait.
func TestDeferredLockWaits(t *testing.T) {
	for _, mode := range []string{"deferred", "control-blocking"} {
		t.Run(mode, func(t *testing.T) {
			f := &lockFile{}
			var node fs.Node = f
			if mode != "deferred" {
				node = blockingLockFile{f}
			}
			var mu sync.Mutex
			finished := map[fuse.RequestID]int{}
			cfg := &fs.Config{Finish: func(ctx context.Context, req fuse.Request) {
				if _, ok := req.(*fuse.LockWaitRequest); ok {
					mu.Lock()
					finished[req.Hdr().ID]++
					mu.Unlock()
				}
			}}
			_, dir := mountRecConfig(t, &recFS{node: node}, cfg, fuse.LockingFlock())
			base := runtime.NumGoroutine()

			const n = 16
			start := func(args ...string) *exec.Cmd {
				c := exec.Command("flock", append(args, dir+"/f", "true")...)
				c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
				if err := c.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Process.Kill(); c.Wait() })
				return c
			}
			var timed, waiting []*exec.Cmd
			for i := 0; i < n/2; i++ {
				timed = append(timed, start("-x", "-w", "3"))
				waiting = append(waiting, start("-x"))
			}
			waitFor(t, "16 lock waits to reach the handle", func() bool {
				w, c := f.state()
				return w+c == n
			})
			extra := runtime.NumGoroutine() - base
			t.Logf("%s: %d goroutines more with %d lock waits pending", mode, extra, n)
			if mode == "deferred" && extra >= n/2 {
				t.Errorf("%d goroutines more with %d deferred lock waits pending, want a few", extra, n)
			}
			if mode != "deferred" && extra < n*3/4 {
				t.Errorf("control: only %d goroutines more with %d blocking lock waits: the test cannot tell", extra, n)
			}

			for _, c := range timed {
				if err := c.Wait(); exitCode(err) != 1 {
					t.Errorf("flock -w 3 ended with %v, want exit status 1 (timed out: EINTR)", err)
				}
			}
			if w, c := f.state(); c != n/2 || w != n/2 {
				t.Errorf("after the timeouts: %d waits cancelled, %d pending; want %d and %d", c, w, n/2, n/2)
			}
			f.mu.Lock()
			grant, refuse := f.waits[:n/4], f.waits[n/4:]
			f.waits = nil
			f.mu.Unlock()
			for _, w := range grant {
				w.stop()
				w.answer(nil)
			}
			for _, w := range refuse {
				w.stop()
				w.answer(syscall.ENOLCK)
				if mode == "deferred" {
					w.answer(nil) // a second answer does nothing
				}
			}
			ok := 0
			for _, c := range waiting {
				if err := c.Wait(); err == nil {
					ok++
				} else if exitCode(err) != 71 { // EX_OSERR: flock(2) failed
					t.Errorf("flock -x ended with %v, want success or exit status 71", err)
				}
			}
			if ok != n/4 {
				t.Errorf("%d flocks succeeded, want the %d granted", ok, n/4)
			}
			waitFor(t, "Finish for every lock wait", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(finished) == n
			})
			mu.Lock()
			for id, k := range finished {
				if k != 1 {
					t.Errorf("Finish ran %d times for request %v", k, id)
				}
			}
			mu.Unlock()
		})
	}
}

// exitCode returns the exit status of a finished command's error: 0 for
// nil, -1 if it did not exit.
func exitCode(err error) int {
	var ee *exec.ExitError
	if err == nil {
		return 0
	}
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// waitFor polls cond for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
