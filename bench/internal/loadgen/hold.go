package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The modes that hold a lock or wait for one: hold (many locks held at
// once) and waiters (many processes queued on one lock).

// hold: open and flock (LOCK_EX|LOCK_NB) the control file of n distinct
// directories ROOT/i/fan/j, then print {"held": n, "ns": ..., "retries": r}
// and keep them until standard input closes. Eight goroutines open in
// parallel. A claim the daemon could not finish in its bound (ENOLCK: a
// slow moment of the backend or of a loaded machine) is asked again after
// a backoff, at most -retries times per lock; r counts those second asks.
// Any other error (EWOULDBLOCK: someone else holds it; EIO: a lost lease)
// fails the run at once, and so does ENOLCK past the bound.
func runHold(args []string) error {
	fl := flag.NewFlagSet("hold", flag.ExitOnError)
	root := fl.String("root", "", "directory holding the locked directories")
	n := fl.Int("n", 100, "locks to hold")
	fan := fl.Int("fan", 1000, "directories per parent")
	name := fl.String("name", ".lock", "control file name")
	workers := fl.Int("workers", 8, "parallel openers")
	retries := fl.Int("retries", 8, "ENOLCK retries per lock, with backoff")
	fl.Parse(args)
	raiseNofileSoft()
	fds := make([]int, *n)
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
		asked atomic.Int64
	)
	start := mono()
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= *n {
					return
				}
				p := filepath.Join(*root, fmt.Sprint(i / *fan), fmt.Sprint(i%*fan), *name)
				fd, err := openLock(p)
				if err == nil {
					var r int
					r, err = lockRetrying(func() error { return flock(fd, unix.LOCK_EX|unix.LOCK_NB) }, *retries, time.Sleep)
					asked.Add(int64(r))
					if err != nil {
						unix.Close(fd)
						err = fmt.Errorf("flock %s (after %d retries): %w", p, r, err)
					}
				}
				if err != nil {
					errMu.Lock()
					if first == nil {
						first = err
					}
					errMu.Unlock()
					next.Store(int64(*n)) // stop everyone
					return
				}
				fds[i] = fd
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	if err := emit(map[string]float64{"held": float64(*n), "ns": float64(mono() - start), "retries": float64(asked.Load())}); err != nil {
		return err
	}
	io.Copy(io.Discard, os.Stdin) // until the harness closes our stdin
	return nil
}

// Backoff between the asks of one lock that got ENOLCK: doubling from
// retryFirst up to retryMost.
const (
	retryFirst = 250 * time.Millisecond
	retryMost  = 5 * time.Second
)

// lockRetrying calls lock until it succeeds, fails with anything but
// ENOLCK, or has failed with ENOLCK retries+1 times, sleeping a doubling
// backoff between the asks. It returns how many times it asked again.
func lockRetrying(lock func() error, retries int, sleep func(time.Duration)) (int, error) {
	wait := retryFirst
	for r := 0; ; r++ {
		err := lock()
		if !errors.Is(err, unix.ENOLCK) || r == retries {
			return r, err
		}
		sleep(wait)
		wait = min(2*wait, retryMost)
	}
}

// waiters: open file n times (n open file descriptions: soft RLIMIT_NOFILE
// is raised to the hard limit) and, on n threads, wait in flock(LOCK_EX)
// on each, unlock and close it at once when granted. It prints
// {"opened_ns": ...} when every thread is about to wait, then, once all
// were served, {"first_ns": ..., "last_ns": ..., "errors": ...}: the
// CLOCK_MONOTONIC times of the first and the last grant.
func runWaiters(args []string) error {
	fl := flag.NewFlagSet("waiters", flag.ExitOnError)
	file := fl.String("file", "", "file to lock")
	n := fl.Int("n", 1000, "waiters")
	fl.Parse(args)
	raiseNofileSoft()
	// Each waiter blocks a thread in flock(2).
	debug.SetMaxThreads(*n + 1000)
	fds := make([]int, *n)
	for i := range fds {
		fd, err := openLock(*file)
		if err != nil {
			return err
		}
		fds[i] = fd
	}
	var first, last atomic.Int64
	var errs atomic.Int64
	var wg sync.WaitGroup
	for _, fd := range fds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := flock(fd, unix.LOCK_EX); err != nil {
				errs.Add(1)
				unix.Close(fd)
				return
			}
			now := mono()
			first.CompareAndSwap(0, now)
			for {
				l := last.Load()
				if now <= l || last.CompareAndSwap(l, now) {
					break
				}
			}
			unix.Close(fd) // releases the flock
		}()
	}
	if err := emit(map[string]float64{"opened_ns": float64(mono())}); err != nil {
		return err
	}
	wg.Wait()
	return emit(map[string]float64{"first_ns": float64(first.Load()), "last_ns": float64(last.Load()), "errors": float64(errs.Load())})
}

// raiseNofileSoft raises the soft RLIMIT_NOFILE to the hard limit, for
// the modes that keep many descriptors open.
func raiseNofileSoft() {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	}
}
