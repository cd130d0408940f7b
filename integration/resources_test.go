package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDaemonResourcesReturnToBaseline: a daemon that has served rounds of
// everything programs do to it (blocking flocks handed between processes,
// conversions, OFD and POSIX locks on control files, directory and new-dir
// locks, usage locks, byte-range locks, F_GETLK and a shared mapping of a
// data file, names and directories made, renamed and removed, holders killed with their locks, a waiter killed
// while it waits, a wait ended by a timeout) goes back to what it held
// before, once the programs are gone: its open descriptors, its goroutines,
// and no lock held or waited for. A daemon that kept one descriptor or
// goroutine per lock, per process or per interrupted request would grow
// with every round; a fleet host runs for months.
//
// The rounds are alike, so the first one is the baseline: whatever the
// daemon keeps on purpose (exit watches for 5 s, idle descriptors for 20
// ms, kept shared flocks for 5 ms, the kernel's cached names, a GCS
// client's idle connections) is made by it, and after each later round
// the daemon must come back to it within 30 s. The kernel is asked to
// forget unused names before each sample (drop_caches), so that what the
// daemon keeps for them does not depend on the kernel's memory.
//
// It runs with the local backend (passthrough on, and off: the data path
// then keeps a descriptor per open file) and with the gcs backend.
//
// Control: a holder with a lock on every directory and waiters queued on
// some of them must show in the same samples, as descriptors (local
// backend: a claim holds its backing file open), goroutines and held locks;
// after they are killed, the daemon must come back to the baseline again.
func TestDaemonResourcesReturnToBaseline(t *testing.T) {
	requireFUSE(t)
	requireRoot(t)
	require(t, "python3", "flock")
	for _, mode := range []struct {
		name  string
		local bool
		args  func(t *testing.T) []string
	}{
		{"local", true, func(*testing.T) []string { return nil }},
		{"local-nopt", true, func(*testing.T) []string { return []string{"--passthrough=off"} }},
		{"gcs", false, func(t *testing.T) []string {
			emu := startEmulator(t)
			return []string{"--backend", "gcs", "--gcs-bucket", emu.Bucket, "--gcs-endpoint", emu.Endpoint(),
				"--lease-ttl", gcsTTL.String(), "--host-id", "resources"}
		}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			addr := freePort(t)
			m := mount(t, withArgs(append(mode.args(t), "--metrics-addr", addr, "--log-level", "info")...))
			for i := range resDirs {
				if err := os.MkdirAll(m.path(fmt.Sprintf("w%d/sub", i)), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			r := &resRig{t: t, m: m, addr: addr}
			r.round()
			base := r.steady()
			t.Logf("baseline after round 1: %v", base)
			for round := 2; round <= resRounds; round++ {
				r.round()
				got := r.back(base)
				t.Logf("after round %d: %v", round, got)
			}

			// Control: held locks and queued waiters show in the samples.
			holder := startPython(t, resHolderScript, m.Mnt, strconv.Itoa(resDirs))
			holder.waitLine("held", 20*time.Second)
			var waiters []*proc
			for i := range resWaiters {
				waiters = append(waiters, start(t, "flock", "-s", m.path(fmt.Sprintf("w%d/sub/.lock", i)), "true"))
			}
			loaded := r.waitFor(20*time.Second, func(s resSample) bool {
				return s.waiters >= resWaiters && s.held >= resDirs
			})
			if mode.local && loaded.files < base.files+resDirs {
				t.Fatalf("control: %d locks held, but the daemon's descriptors of files are %d against %d before: the sample cannot see what claims keep open\n%s",
					resDirs, loaded.files, base.files, loaded.fdList)
			}
			if loaded.goroutines < base.goroutines+resWaiters {
				t.Fatalf("control: %d waiters queued, but %d goroutines against %d before: the sample cannot see what waits keep",
					resWaiters, loaded.goroutines, base.goroutines)
			}
			if atBase(base, loaded) {
				t.Fatalf("control: %v counts as the baseline %v", loaded, base)
			}
			t.Logf("control, %d held and %d waiting: %v", resDirs, resWaiters, loaded)
			holder.kill()
			for _, w := range waiters {
				if code, ok := w.wait(20 * time.Second); !ok || code != 0 {
					t.Fatalf("a waiter, once the holder was killed: exit %d (finished: %v), stderr %q", code, ok, w.stderr.String())
				}
			}
			t.Logf("after the control: %v", r.back(base))
		})
	}
}

const (
	resDirs    = 24 // directories w0 … w23, each with sub/
	resWorkers = 3  // churn processes per round, running at once
	resRounds  = 4
	resWaiters = 6 // queued waiters in the control
)

// resChurnScript is one churn process of a round: for every directory,
// the locks and data operations a program makes, blocking where it must
// wait for the other churn processes.
const resChurnScript = `
import fcntl, mmap, os, struct, sys
root, me, ndirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
F_OFD_SETLKW = 38
def ofd(fd, typ):
    fcntl.fcntl(fd, F_OFD_SETLKW, struct.pack("hhxxxxqqixxxx", typ, 0, 0, 0, 0))
for k in range(ndirs):
    d = os.path.join(root, "w%d" % ((k + me * 7) % ndirs))
    with open(os.path.join(d, ".lock"), "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        r, s = os.path.join(d, "r%d" % me), os.path.join(d, "s%d" % me)
        os.mkdir(r)
        os.rename(r, s)
        os.rmdir(s)
        fcntl.flock(f, fcntl.LOCK_SH)
        fcntl.flock(f, fcntl.LOCK_EX)
        fcntl.flock(f, fcntl.LOCK_UN)
        fcntl.flock(f, fcntl.LOCK_SH)
    fd = os.open(os.path.join(d, "sub", ".lock"), os.O_RDWR)
    ofd(fd, fcntl.F_WRLCK)
    ofd(fd, fcntl.F_UNLCK)
    os.close(fd)
    fd = os.open(os.path.join(d, "sub", ".lock"), os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_SH)
    os.close(fd)
    fd = os.open(os.path.join(d, ".lock_newdir"), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.close(fd)
    p = os.path.join(d, "data%d" % me)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"x" * 8192, 0)
    fcntl.lockf(fd, fcntl.LOCK_EX, 4096, 4096)
    fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
    m = mmap.mmap(fd, 8192)
    m[0:4] = b"abcd"
    m.flush()
    m.close()
    fcntl.lockf(fd, fcntl.LOCK_UN, 4096, 4096)
    os.close(fd)
    t = os.path.join(d, "t%d" % me)
    os.mkdir(t)
    open(os.path.join(t, "f"), "w").close()
    os.rename(os.path.join(t, "f"), os.path.join(t, "g"))
    os.unlink(os.path.join(t, "g"))
    os.rmdir(t)
print("done", flush=True)
`

// resHolderScript takes every directory's lock exclusively and a record
// lock on a data file, says "held", and waits to be killed.
const resHolderScript = `
import fcntl, os, sys, time
root, ndirs = sys.argv[1], int(sys.argv[2])
fs = []
for i in range(ndirs):
    f = open(os.path.join(root, "w%d" % i, ".lock"), "r+")
    fcntl.flock(f, fcntl.LOCK_EX)
    fs.append(f)
d = open(os.path.join(root, "w0", "held-data"), "w+")
fcntl.lockf(d, fcntl.LOCK_EX)
print("held", flush=True)
while True:
    time.sleep(60)
`

type resRig struct {
	t    *testing.T
	m    *Mount
	addr string
}

// resSample is what the daemon holds at one moment.
type resSample struct {
	files, sockets, others int // open descriptors: of paths, sockets, the rest (pidfds, pipes, /dev/fuse, epoll...)
	goroutines             int
	held, waiters          int    // lockfs_locks_held and lockfs_lock_waiters, summed
	fdList                 string // the descriptors' targets, counted, for a failure's message
}

func (s resSample) String() string {
	return fmt.Sprintf("%d file, %d socket and %d other descriptors, %d goroutines, %d locks held, %d waiting",
		s.files, s.sockets, s.others, s.goroutines, s.held, s.waiters)
}

// round runs one round of churn and the kill scenarios, and checks that
// every lock is free when it ends.
func (r *resRig) round() {
	t, m := r.t, r.m
	t.Helper()
	var churn []*proc
	for w := range resWorkers {
		churn = append(churn, startPython(t, resChurnScript, m.Mnt, strconv.Itoa(w), strconv.Itoa(resDirs)))
	}
	for _, p := range churn {
		p.waitLine("done", 90*time.Second)
		if code, ok := p.wait(20 * time.Second); !ok || code != 0 {
			t.Fatalf("churn process: exit %d (finished: %v), stderr %q", code, ok, p.stderr.String())
		}
	}
	// Usage locks, each by its own process (a usage lock binds what its
	// process may lock next, docs/PROTOCOL.md §4).
	for i := 0; i < resDirs; i += 4 {
		expectCode(t, "flock -x .lock_usage", run(t, 20*time.Second, "flock", "-x", m.path(fmt.Sprintf("w%d/.lock_usage", i)), "true"), 0)
	}
	// A holder killed with its locks; a waiter killed while it waits; a
	// wait ended by its timeout (SIGALRM interrupts the request).
	holder := startPython(t, resHolderScript, m.Mnt, "6")
	holder.waitLine("held", 20*time.Second)
	waiter := start(t, "flock", "-x", m.path("w1/sub/.lock"), "true")
	expectCode(t, "flock -w 0.3 while held", run(t, 20*time.Second, "flock", "-w", "0.3", m.path("w2/.lock"), "true"), 1)
	time.Sleep(200 * time.Millisecond)
	waiter.kill()
	holder.kill()
	for i := range resDirs {
		l := m.path(fmt.Sprintf("w%d/.lock", i))
		deadline := time.Now().Add(20 * time.Second)
		for run(t, 10*time.Second, "flock", "-n", "-x", l, "true").code != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s not free 20 s after the round's processes were gone", l)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// steady samples until two samples a second apart agree, at least 7 s
// after the round (past the 5 s exit watches), and returns the last one.
// Goroutines are compared net of the two that each connection runs, since
// a GCS client may open or close a connection between two samples.
func (r *resRig) steady() resSample {
	r.t.Helper()
	start := time.Now()
	prev := r.sample()
	for {
		time.Sleep(time.Second)
		s := r.sample()
		if time.Since(start) >= 7*time.Second && s.files == prev.files && s.others == prev.others &&
			s.goroutines-2*s.sockets == prev.goroutines-2*prev.sockets && s.held == 0 && s.waiters == 0 {
			return s
		}
		if time.Since(start) > 40*time.Second {
			r.t.Fatalf("the daemon did not settle in 40 s after a round: %v, then %v\n%s", prev, s, s.fdList)
		}
		prev = s
	}
}

// back waits until the daemon holds no more than it did at base, and fails
// after 30 s. Connections to GCS come and go with the load: a few more
// than at base are allowed, with the two goroutines each runs, and so are
// a few goroutines that come and go (the metrics scrape's own, a refresh
// on its way). What is measured is growth: a descriptor or goroutine kept
// per lock, process or request would add dozens per round.
func (r *resRig) back(base resSample) resSample {
	r.t.Helper()
	s, found := r.poll(30*time.Second, func(s resSample) bool { return atBase(base, s) })
	if !found {
		r.t.Fatalf("the daemon did not come back to its baseline in 30 s:\nnow      %v\nbaseline %v\ndescriptors now:\n%s\nat the baseline:\n%s",
			s, base, s.fdList, base.fdList)
	}
	return s
}

// atBase says whether s holds no more than base, as back wants.
func atBase(base, s resSample) bool {
	extraSockets := max(0, s.sockets-base.sockets)
	return s.files <= base.files && s.others <= base.others && extraSockets <= 8 &&
		s.goroutines <= base.goroutines+2*extraSockets+4 && s.held == 0 && s.waiters == 0
}

// waitFor waits until ok(sample), and fails after timeout.
func (r *resRig) waitFor(timeout time.Duration, ok func(resSample) bool) resSample {
	r.t.Helper()
	s, found := r.poll(timeout, ok)
	if !found {
		r.t.Fatalf("not seen in %v: last sample %v", timeout, s)
	}
	return s
}

func (r *resRig) poll(timeout time.Duration, ok func(resSample) bool) (resSample, bool) {
	deadline := time.Now().Add(timeout)
	for {
		s := r.sample()
		if ok(s) {
			return s, true
		}
		if time.Now().After(deadline) {
			return s, false
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// sample asks the kernel to forget unused names, then reads the daemon's
// descriptors from /proc and its goroutines and locks from its metrics.
func (r *resRig) sample() resSample {
	t := r.t
	t.Helper()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2\n"), 0); err != nil {
		t.Fatalf("drop_caches: %v", err)
	}
	time.Sleep(100 * time.Millisecond) // FORGETs are sent asynchronously
	var s resSample
	for _, m := range scrapeSeries(t, "http://"+r.addr+"/metrics", "") {
		switch m.name {
		case "go_goroutines":
			s.goroutines = int(m.value)
		case "lockfs_locks_held":
			s.held += int(m.value)
		case "lockfs_lock_waiters":
			s.waiters += int(m.value)
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", r.m.Pid())
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("daemon descriptors: %v", err)
	}
	counts := map[string]int{}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		switch {
		case strings.HasPrefix(target, "socket:"):
			s.sockets++
			target = "socket"
		case strings.HasPrefix(target, "/"):
			s.files++
		default:
			s.others++
			if i := strings.Index(target, ":["); i > 0 && !strings.HasPrefix(target, "anon_inode:") {
				target = target[:i] // pipe:[123] → pipe
			}
		}
		counts[target]++
	}
	names := make([]string, 0, len(counts))
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		fmt.Fprintf(&b, "  %3d %s\n", counts[k], k)
	}
	s.fdList = b.String()
	return s
}
