// Command loadgen is the benchmark harness's load generator: a small Go
// program that issues lock and file system calls in a tight loop and reports
// what it measured as one JSON object on standard output. The harness
// builds it with `go build` and runs it against lockfs, the no-op daemon,
// go-fuse's loopback and plain kernel files alike, so that every side of a
// comparison pays the same process and runtime costs.
//
// Usage:
//
//	loadgen pair     -file F -n N              flock EX+UN on one open descriptor
//	loadgen cycle    -file F -n N              open + flock EX + close
//	loadgen disjoint -file F -start NS -dur D  pairs until a deadline
//	loadgen handoff  -file F -shm S -id I -procs P -rounds R -hold H [-poll D]
//	loadgen hold     -root DIR -n N -fan F     hold N locks until stdin closes
//	loadgen lock     -file F                   wait for one lock, hold it until stdin closes
//	loadgen waiters  -file F -n N              N threads each wait for the lock once
//	loadgen meta     -dir D -n N               create + stat + unlink
//	loadgen write    -file F -size B [-fsync]  sequential write of a new file
//	loadgen read     -file F                   sequential read
//
// Times are CLOCK_MONOTONIC nanoseconds, comparable between processes. The
// harness runs it with GODEBUG=asyncpreemptoff=1: the runtime's preemption
// signal would otherwise interrupt FUSE requests in flight, which a C
// program does not do.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: loadgen pair|cycle|disjoint|handoff|hold|meta [flags]"))
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "pair":
		err = runPair(args)
	case "cycle":
		err = runCycle(args)
	case "disjoint":
		err = runDisjoint(args)
	case "handoff":
		err = runHandoff(args)
	case "hold":
		err = runHold(args)
	case "lock":
		err = runLock(args)
	case "waiters":
		err = runWaiters(args)
	case "meta":
		err = runMeta(args)
	case "write":
		err = runWrite(args)
	case "read":
		err = runRead(args)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fail(fmt.Errorf("%s: %w", cmd, err))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loadgen:", err)
	os.Exit(1)
}

// emit writes v as the one JSON object of the run.
func emit(v any) error { return json.NewEncoder(os.Stdout).Encode(v) }

// mono reads CLOCK_MONOTONIC in nanoseconds.
func mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// flock retries EINTR (the Go runtime's preemption signals interrupt
// blocking system calls).
func flock(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if err != unix.EINTR {
			return err
		}
	}
}

func openLock(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	return fd, nil
}

// pair: flock(LOCK_EX) + flock(LOCK_UN) n times on one descriptor.
func runPair(args []string) error {
	fl := flag.NewFlagSet("pair", flag.ExitOnError)
	file := fl.String("file", "", "file to lock")
	n := fl.Int("n", 1000, "pairs to time")
	warm := fl.Int("warm", 50, "untimed pairs first")
	fl.Parse(args)
	fd, err := openLock(*file)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for i := 0; i < *warm; i++ {
		if err := lockPair(fd); err != nil {
			return err
		}
	}
	start := mono()
	for i := 0; i < *n; i++ {
		if err := lockPair(fd); err != nil {
			return err
		}
	}
	ns := mono() - start
	return emit(map[string]float64{"ns_per_op": float64(ns) / float64(*n), "ops": float64(*n)})
}

func lockPair(fd int) error {
	if err := flock(fd, unix.LOCK_EX); err != nil {
		return fmt.Errorf("LOCK_EX: %w", err)
	}
	if err := flock(fd, unix.LOCK_UN); err != nil {
		return fmt.Errorf("LOCK_UN: %w", err)
	}
	return nil
}

// cycle: open + flock(LOCK_EX) + close, n times. The lock goes with the
// close (FUSE Release), which the kernel sends asynchronously; the next
// cycle's LOCK_EX waits for it if it is still being processed. A LOCK_EX
// that fails with EDEADLK (lockfs can mistake the previous cycle's hold,
// whose release is still in flight, for a deadlock of this process with
// itself) is retried at once, and counted as "edeadlk".
func runCycle(args []string) error {
	fl := flag.NewFlagSet("cycle", flag.ExitOnError)
	file := fl.String("file", "", "file to lock")
	n := fl.Int("n", 1000, "cycles to time")
	warm := fl.Int("warm", 20, "untimed cycles first")
	fl.Parse(args)
	var edeadlk int
	one := func() error {
		fd, err := openLock(*file)
		if err != nil {
			return err
		}
		for {
			err := flock(fd, unix.LOCK_EX)
			if err == nil {
				break
			}
			if err == unix.EDEADLK && edeadlk < 1000 {
				edeadlk++
				continue
			}
			unix.Close(fd)
			return fmt.Errorf("LOCK_EX: %w", err)
		}
		return unix.Close(fd)
	}
	for i := 0; i < *warm; i++ {
		if err := one(); err != nil {
			return err
		}
	}
	start := mono()
	for i := 0; i < *n; i++ {
		if err := one(); err != nil {
			return err
		}
	}
	ns := mono() - start
	return emit(map[string]float64{"ns_per_op": float64(ns) / float64(*n), "ops": float64(*n), "edeadlk": float64(edeadlk)})
}

// disjoint: lock pairs on this process's own file from the CLOCK_MONOTONIC
// instant start until start+dur; reports how many completed.
func runDisjoint(args []string) error {
	fl := flag.NewFlagSet("disjoint", flag.ExitOnError)
	file := fl.String("file", "", "file to lock")
	start := fl.Int64("start", 0, "CLOCK_MONOTONIC ns to begin at")
	dur := fl.Duration("dur", time.Second, "how long to run")
	fl.Parse(args)
	fd, err := openLock(*file)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := lockPair(fd); err != nil { // warm the path before the start
		return err
	}
	if d := *start - mono(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	end := *start + dur.Nanoseconds()
	var n int64
	for mono() < end {
		if err := lockPair(fd); err != nil {
			return err
		}
		n++
	}
	return emit(map[string]float64{"ops": float64(n), "late_ns": float64(mono() - end)})
}

// handoff: one of procs processes taking one exclusive lock in turn,
// rounds times each, holding it for hold. With -poll the process polls with
// LOCK_EX|LOCK_NB and sleeps poll between tries (the protocol lockfs
// replaces); without, it blocks in LOCK_EX.
//
// The processes share a small memory-mapped file: a start barrier, a grant
// counter and a count of finished processes. A process that released the
// lock asks again only once another has been granted it, so that every
// hand-off is between two processes and a poller cannot win its own
// release back at once.
func runHandoff(args []string) error {
	fl := flag.NewFlagSet("handoff", flag.ExitOnError)
	file := fl.String("file", "", "file to lock")
	shm := fl.String("shm", "", "shared counter file (at least 24 bytes)")
	procs := fl.Int("procs", 8, "processes taking part")
	rounds := fl.Int("rounds", 10, "grants to take")
	hold := fl.Duration("hold", time.Millisecond, "how long to hold each grant")
	poll := fl.Duration("poll", 0, "poll with LOCK_NB every this long instead of blocking")
	fl.Parse(args)

	fd, err := openLock(*file)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	sf, err := os.OpenFile(*shm, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	mem, err := unix.Mmap(int(sf.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	sf.Close()
	if err != nil {
		return fmt.Errorf("mmap %s: %w", *shm, err)
	}
	defer unix.Munmap(mem)
	ready := (*atomic.Int64)(unsafe.Pointer(&mem[0]))
	grants := (*atomic.Int64)(unsafe.Pointer(&mem[8]))
	finished := (*atomic.Int64)(unsafe.Pointer(&mem[16]))

	ready.Add(1)
	for ready.Load() < int64(*procs) {
		time.Sleep(100 * time.Microsecond)
	}
	type event struct{ Grant, Release int64 }
	events := make([]event, 0, *rounds)
	for r := 0; r < *rounds; r++ {
		if *poll > 0 {
			for {
				err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
				if err == nil {
					break
				}
				if err != unix.EWOULDBLOCK && err != unix.EINTR {
					return fmt.Errorf("LOCK_EX|LOCK_NB: %w", err)
				}
				time.Sleep(*poll)
			}
		} else if err := flock(fd, unix.LOCK_EX); err != nil {
			return fmt.Errorf("LOCK_EX: %w", err)
		}
		granted := mono()
		idx := grants.Add(1)
		time.Sleep(*hold)
		released := mono()
		if err := flock(fd, unix.LOCK_UN); err != nil {
			return fmt.Errorf("LOCK_UN: %w", err)
		}
		events = append(events, event{granted, released})
		if r == *rounds-1 {
			break
		}
		// Wait until someone else has been granted the lock, unless every
		// other process is done.
		for grants.Load() == idx && finished.Load() < int64(*procs-1) {
			time.Sleep(50 * time.Microsecond)
		}
	}
	finished.Add(1)
	return emit(map[string]any{"events": events})
}

// lock: open file, wait in flock(LOCK_EX) until granted, print
// {"granted_ns": CLOCK_MONOTONIC}, and hold the lock until standard input
// closes.
func runLock(args []string) error {
	fl := flag.NewFlagSet("lock", flag.ExitOnError)
	file := fl.String("file", "", "file to lock")
	fl.Parse(args)
	fd, err := openLock(*file)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := flock(fd, unix.LOCK_EX); err != nil {
		return fmt.Errorf("LOCK_EX: %w", err)
	}
	if err := emit(map[string]float64{"granted_ns": float64(mono())}); err != nil {
		return err
	}
	io.Copy(io.Discard, os.Stdin)
	return nil
}
