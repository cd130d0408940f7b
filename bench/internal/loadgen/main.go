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
	"path/filepath"
	"runtime/debug"
	"sync"
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

// hold: open and flock (LOCK_EX|LOCK_NB) the control file of n distinct
// directories ROOT/i/fan/j, then print {"held": n} and keep them until
// standard input closes. Eight goroutines open in parallel.
func runHold(args []string) error {
	fl := flag.NewFlagSet("hold", flag.ExitOnError)
	root := fl.String("root", "", "directory holding the locked directories")
	n := fl.Int("n", 100, "locks to hold")
	fan := fl.Int("fan", 1000, "directories per parent")
	name := fl.String("name", ".lock", "control file name")
	workers := fl.Int("workers", 8, "parallel openers")
	fl.Parse(args)
	raiseNofileSoft()
	fds := make([]int, *n)
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
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
					if err = flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
						unix.Close(fd)
						err = fmt.Errorf("flock %s: %w", p, err)
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
	if err := emit(map[string]float64{"held": float64(*n), "ns": float64(mono() - start)}); err != nil {
		return err
	}
	io.Copy(io.Discard, os.Stdin) // until the harness closes our stdin
	return nil
}

// meta: n cycles of create (open O_CREAT|O_EXCL, close), stat and unlink of
// a new file in dir.
func runMeta(args []string) error {
	fl := flag.NewFlagSet("meta", flag.ExitOnError)
	dir := fl.String("dir", "", "directory to work in")
	n := fl.Int("n", 1000, "cycles to time")
	warm := fl.Int("warm", 20, "untimed cycles first")
	fl.Parse(args)
	pid := os.Getpid()
	one := func(i int) error {
		p := filepath.Join(*dir, fmt.Sprintf("m%d-%d", pid, i))
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		if err := unix.Close(fd); err != nil {
			return fmt.Errorf("close %s: %w", p, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if err := unix.Unlink(p); err != nil {
			return fmt.Errorf("unlink %s: %w", p, err)
		}
		return nil
	}
	for i := 0; i < *warm; i++ {
		if err := one(-1 - i); err != nil {
			return err
		}
	}
	start := mono()
	for i := 0; i < *n; i++ {
		if err := one(i); err != nil {
			return err
		}
	}
	ns := mono() - start
	return emit(map[string]float64{"ns_per_op": float64(ns) / float64(*n), "ops": float64(*n)})
}

// write: create file (it must not exist) and write size bytes to it
// sequentially in bs-sized writes; with -fsync, fsync before the clock
// stops. The close is timed too.
func runWrite(args []string) error {
	fl := flag.NewFlagSet("write", flag.ExitOnError)
	file := fl.String("file", "", "file to create")
	size := fl.Int64("size", 256<<20, "bytes to write")
	bs := fl.Int("bs", 1<<20, "bytes per write")
	doSync := fl.Bool("fsync", false, "fsync before stopping the clock")
	fl.Parse(args)
	buf := make([]byte, *bs)
	for i := range buf {
		buf[i] = byte(i*7 + 1) // not all zeroes
	}
	start := mono()
	fd, err := unix.Open(*file, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", *file, err)
	}
	for left := *size; left > 0; {
		b := buf[:min(int64(len(buf)), left)]
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("write %s: %w", *file, err)
		}
		left -= int64(n)
	}
	if *doSync {
		if err := unix.Fsync(fd); err != nil {
			unix.Close(fd)
			return fmt.Errorf("fsync %s: %w", *file, err)
		}
	}
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close %s: %w", *file, err)
	}
	ns := mono() - start
	return emit(map[string]float64{"bytes": float64(*size), "ns": float64(ns),
		"mb_per_s": float64(*size) / (1 << 20) / (float64(ns) / 1e9)})
}

// read: read file sequentially to its end in bs-sized reads.
func runRead(args []string) error {
	fl := flag.NewFlagSet("read", flag.ExitOnError)
	file := fl.String("file", "", "file to read")
	bs := fl.Int("bs", 1<<20, "bytes per read")
	fl.Parse(args)
	buf := make([]byte, *bs)
	start := mono()
	fd, err := unix.Open(*file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", *file, err)
	}
	var total int64
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("read %s: %w", *file, err)
		}
		if n == 0 {
			break
		}
		total += int64(n)
	}
	unix.Close(fd)
	ns := mono() - start
	return emit(map[string]float64{"bytes": float64(total), "ns": float64(ns),
		"mb_per_s": float64(total) / (1 << 20) / (float64(ns) / 1e9)})
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
