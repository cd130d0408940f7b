package procinfo

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/lockmgr"
)

// newRealProcTree returns a Tree over the system's /proc.
func newRealProcTree(t testing.TB) *Tree {
	t.Helper()
	tree, err := NewTree(TreeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// selfProcID reads our own process's lockmgr.ProcID straight from /proc.
func selfProcID(t testing.TB, tree *Tree) lockmgr.ProcID {
	t.Helper()
	st, err := tree.readStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return lockmgr.ProcID{PID: os.Getpid(), Start: st.start}
}

func pids(l lockmgr.Lineage) []int {
	var out []int
	for _, p := range l {
		out = append(out, p.PID)
	}
	return out
}

func TestProcTreeLineageOfOwnThread(t *testing.T) {
	tree := newRealProcTree(t)
	l, err := tree.Lineage(unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.Self(), selfProcID(t, tree); got != want {
		t.Errorf("Lineage(own thread).Self() = %+v, want %+v", got, want)
	}
	if got := l[len(l)-1].PID; got != 1 {
		t.Errorf("lineage %v ends at pid %d, want 1", pids(l), got)
	}
	if !slices.Contains(pids(l), os.Getppid()) {
		t.Errorf("lineage %v does not contain our parent %d", pids(l), os.Getppid())
	}
	for _, p := range l {
		if !tree.Alive(p) {
			t.Errorf("Alive(%+v) = false for an ancestor of a running process", p)
		}
	}
	// A second call is a cache hit and returns the same lineage.
	again, err := tree.Lineage(unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l, again) {
		t.Errorf("cached lineage %v, want %v", again, l)
	}
}

func TestProcTreeLineageOfOtherThread(t *testing.T) {
	tree := newRealProcTree(t)
	want, err := tree.Lineage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		tid int
		l   lockmgr.Lineage
		err error
	}
	// Two goroutines locked to their threads at once hold two threads, so
	// at least one of them is not the main thread (whose tid is the pid).
	results := make(chan result)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tid := unix.Gettid()
			l, err := tree.Lineage(tid)
			results <- result{tid, l, err}
			<-release
		})
	}
	rs := []result{<-results, <-results}
	close(release)
	wg.Wait()
	checked := 0
	for _, r := range rs {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.tid == os.Getpid() {
			continue
		}
		checked++
		if !slices.Equal(r.l, want) {
			t.Errorf("Lineage(thread %d) = %v, want the process's %v", r.tid, r.l, want)
		}
	}
	if checked == 0 {
		t.Fatal("no goroutine ran on a thread other than the main one")
	}
}

func TestProcTreeChildProcess(t *testing.T) {
	// Read /proc on every call: this test is about a thread that is gone.
	tree, err := NewTree(TreeConfig{RecheckAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "sleep 30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})

	l, err := tree.Lineage(pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) < 2 || l[0].PID != pid || l[1] != selfProcID(t, tree) {
		t.Fatalf("Lineage(child %d) = %+v, want the child then us (%+v)", pid, l, selfProcID(t, tree))
	}
	child := l[0]
	if !tree.Alive(child) {
		t.Fatalf("Alive(%+v) = false for a running child", child)
	}

	// Killed but not reaped: a zombie, which counts as dead.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitForState(t, tree, pid, 'Z')
	if tree.Alive(child) {
		t.Errorf("Alive(%+v) = true for a zombie", child)
	}

	cmd.Wait()
	reaped = true
	if tree.Alive(child) {
		t.Errorf("Alive(%+v) = true after the child was reaped", child)
	}
	l, err = tree.Lineage(pid)
	switch {
	case err == nil && l.Self() == child:
		t.Errorf("Lineage(%d) = %+v after the child was reaped, want an error", pid, l)
	case err == nil:
		// The pid was reused already: a new process, not the cached child.
	case !errors.Is(err, os.ErrNotExist):
		t.Errorf("Lineage(reaped %d) error %v, want one wrapping os.ErrNotExist", pid, err)
	case !strings.Contains(err.Error(), fmt.Sprintf("lineage of thread %d", pid)):
		t.Errorf("Lineage(reaped %d) error %q does not name the thread", pid, err)
	}
}

// waitForState polls until pid's /proc/PID/stat shows state.
func waitForState(t *testing.T, tree *Tree, pid int, want byte) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := tree.readStat(pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.state == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d in state %c, want %c", pid, st.state, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestProcTreeLineageConcurrent(t *testing.T) {
	tree := newRealProcTree(t)
	want, err := tree.Lineage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	tree = newRealProcTree(t) // cold caches, filled concurrently
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for range 100 {
				for _, tid := range []int{os.Getpid(), unix.Gettid()} {
					l, err := tree.Lineage(tid)
					if err != nil {
						t.Error(err)
						return
					}
					if !slices.Equal(l, want) {
						t.Errorf("Lineage(%d) = %v, want %v", tid, l, want)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// fakeProc is one task of a fake procfs.
type fakeProc struct {
	tid, tgid, ppid int
	comm            string
	state           byte
	start           uint64
}

// write writes root/TID/stat and root/TID/status as the kernel would.
func (p fakeProc) write(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(p.tid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	state := p.state
	if state == 0 {
		state = 'S'
	}
	tgid := p.tgid
	if tgid == 0 {
		tgid = p.tid
	}
	// Fields 1..52, starttime (22) and a realistic tail after it.
	stat := fmt.Sprintf("%d (%s) %c %d %d %d 0 -1 4194560 120 0 0 0 1 2 0 0 20 0 1 0 %d "+
		"2502656 218 18446744073709551615 1 1 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		p.tid, p.comm, state, p.ppid, tgid, tgid, p.start)
	// status escapes newlines in Name; the fake names here have none.
	status := fmt.Sprintf("Name:\t%s\nUmask:\t0022\nState:\t%c (sleeping)\nTgid:\t%d\nNgid:\t0\nPid:\t%d\nPPid:\t%d\nTracerPid:\t0\n",
		p.comm, state, tgid, p.tid, p.ppid)
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
}

// newFakeProcTree writes procs under a temporary ProcRoot and returns a tree
// reading it.
func newFakeProcTree(t *testing.T, procs ...fakeProc) (*Tree, string) {
	t.Helper()
	root := t.TempDir()
	for _, p := range procs {
		p.write(t, root)
	}
	// Every call reads the thread's start time: these tests are about
	// that validation.
	tree, err := NewTree(TreeConfig{ProcRoot: root, CacheSize: 16, RecheckAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	return tree, root
}

// fakeInit and fakeShell are the top of every fake tree.
var (
	fakeInit  = fakeProc{tid: 1, ppid: 0, comm: "init", start: 1}
	fakeShell = fakeProc{tid: 50, ppid: 1, comm: "bash", start: 100}
)

func TestProcTreeFakeLineage(t *testing.T) {
	app := fakeProc{tid: 100, ppid: 50, comm: "app", start: 500}
	worker := fakeProc{tid: 101, tgid: 100, ppid: 50, comm: "worker", start: 600}
	tree, _ := newFakeProcTree(t, fakeInit, fakeShell, app, worker)
	want := lockmgr.Lineage{{PID: 100, Start: 500}, {PID: 50, Start: 100}, {PID: 1, Start: 1}}
	for _, tid := range []int{100, 101, 101} { // the second 101 is a cache hit
		l, err := tree.Lineage(tid)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(l, want) {
			t.Errorf("Lineage(%d) = %v, want %v", tid, l, want)
		}
	}
}

// TestProcTreePidReuse is the control for both caches: a cached answer is
// used while the start time it was cached under matches (the Tgid and PPid
// changes below are not seen) and dropped as soon as it does not (the pid
// was reused).
func TestProcTreePidReuse(t *testing.T) {
	other := fakeProc{tid: 60, ppid: 1, comm: "sshd", start: 200}
	app := fakeProc{tid: 100, ppid: 50, comm: "app", start: 500}
	worker := fakeProc{tid: 101, tgid: 100, ppid: 50, comm: "worker", start: 600}
	tree, root := newFakeProcTree(t, fakeInit, fakeShell, other, app, worker)
	check := func(tid int, want lockmgr.Lineage) {
		t.Helper()
		l, err := tree.Lineage(tid)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(l, want) {
			t.Errorf("Lineage(%d) = %v, want %v", tid, l, want)
		}
	}
	first := lockmgr.Lineage{{PID: 100, Start: 500}, {PID: 50, Start: 100}, {PID: 1, Start: 1}}
	check(100, first)
	check(101, first)

	// Same start times, other Tgid and PPid. The thread cache answers for
	// thread 101 (its status is not read again). A new thread 102 of process
	// 100 misses it, and the parent cache answers with the parent process
	// 100 had when first seen.
	moved, movedWorker := app, worker
	moved.ppid = 60
	movedWorker.tgid, movedWorker.ppid = 60, 1
	moved.write(t, root)
	movedWorker.write(t, root)
	check(101, first)
	check(100, first)
	fakeProc{tid: 102, tgid: 100, ppid: 60, comm: "worker", start: 700}.write(t, root)
	check(102, first)

	// Pids 100 and 101 reused by new tasks (new start times).
	reused, reusedWorker := moved, movedWorker
	reused.start, reusedWorker.start = 900, 950
	reused.write(t, root)
	reusedWorker.write(t, root)
	check(100, lockmgr.Lineage{{PID: 100, Start: 900}, {PID: 60, Start: 200}, {PID: 1, Start: 1}})
	check(101, lockmgr.Lineage{{PID: 60, Start: 200}, {PID: 1, Start: 1}})
	if tree.Alive(lockmgr.ProcID{PID: 100, Start: 500}) {
		t.Error("Alive(old 100) = true after its pid was reused")
	}
	if !tree.Alive(lockmgr.ProcID{PID: 100, Start: 900}) {
		t.Error("Alive(new 100) = false")
	}
}

// A parent pid that names a process younger than the child was reused: the
// walk stops there, and the incomplete lineage is not cached.
func TestProcTreeReusedParentPid(t *testing.T) {
	app := fakeProc{tid: 100, ppid: 50, comm: "app", start: 500}
	young := fakeShell
	young.start = 900
	tree, root := newFakeProcTree(t, fakeInit, young, app)
	l, err := tree.Lineage(100)
	if err != nil {
		t.Fatal(err)
	}
	if want := (lockmgr.Lineage{{PID: 100, Start: 500}}); !slices.Equal(l, want) {
		t.Errorf("Lineage(100) = %v, want %v", l, want)
	}
	fakeShell.write(t, root)
	l, err = tree.Lineage(100)
	if err != nil {
		t.Fatal(err)
	}
	if want := (lockmgr.Lineage{{PID: 100, Start: 500}, {PID: 50, Start: 100}, {PID: 1, Start: 1}}); !slices.Equal(l, want) {
		t.Errorf("Lineage(100) after the parent was readable = %v, want %v", l, want)
	}
}

func TestProcTreeCommParsing(t *testing.T) {
	for _, comm := range []string{
		"sleep",
		"my app",
		"a) b",
		") (",
		"x) S 1 2 3 (y",
		"))))",
		"",
	} {
		t.Run(comm, func(t *testing.T) {
			app := fakeProc{tid: 100, ppid: 50, comm: comm, state: 'R', start: 12345}
			tree, _ := newFakeProcTree(t, fakeInit, fakeShell, app)
			l, err := tree.Lineage(100)
			if err != nil {
				t.Fatal(err)
			}
			if want := (lockmgr.Lineage{{PID: 100, Start: 12345}, {PID: 50, Start: 100}, {PID: 1, Start: 1}}); !slices.Equal(l, want) {
				t.Errorf("Lineage = %v, want %v", l, want)
			}
			if !tree.Alive(lockmgr.ProcID{PID: 100, Start: 12345}) {
				t.Error("Alive = false")
			}
		})
	}
}

func TestProcTreeParseStat(t *testing.T) {
	for _, tc := range []struct {
		line   string
		state  byte
		cpu    uint64
		start  uint64
		exited bool
		bad    bool
	}{
		{line: "1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 42 9 9\n", state: 'S', cpu: 5 + 6, start: 42},
		{line: "3 (a b) c) R 1 1 1 0 -1 0 0 0 0 0 1234 56 0 0 20 0 1 0 42 9 9\n", state: 'R', cpu: 1234 + 56, start: 42},
		{line: "1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 x 6 7 8 20 0 1 0 42 9 9\n", bad: true},
		{line: "7 (a) Z 9) R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0\n", state: 'R', start: 77},
		{line: "7 (new\nline) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 8", state: 'S', start: 8},
		// A zombie, and a task flagged PF_EXITING (0x4) while still
		// running: both have exited (Tree.Alive and Exited agree).
		{line: "9 (z) Z 1 1 1 0 -1 4194564 0 0 0 0 0 0 0 0 20 0 1 0 5 0\n", state: 'Z', start: 5, exited: true},
		{line: "9 (x) R 1 1 1 0 -1 4194564 0 0 0 0 0 0 0 0 20 0 1 0 5 0\n", state: 'R', start: 5, exited: true},
		{line: "1 init S 0", bad: true},
		{line: "1 (init) S 0 1 1 0 -1 4194560\n", bad: true},
		{line: "1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 -3 9\n", bad: true},
		{line: "1 (init) S 0 1 1 0 -1 -5 1 2 3 4 5 6 7 8 20 0 1 0 3 9\n", bad: true},
		{line: "1 (init) SS 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 3 9\n", bad: true},
	} {
		st, err := parseStat([]byte(tc.line))
		if tc.bad {
			if err == nil {
				t.Errorf("parseStat(%q) = %+v, want an error", tc.line, st)
			}
			continue
		}
		if err != nil || st.state != tc.state || st.start != tc.start || st.exited() != tc.exited || (tc.cpu != 0 && st.cpu != tc.cpu) {
			t.Errorf("parseStat(%q) = %+v (exited %v), %v; want %c, start %d, cpu %d, exited %v", tc.line, st, st.exited(), err, tc.state, tc.start, tc.cpu, tc.exited)
		}
		if got := exitedStat([]byte(tc.line), nil); got != tc.exited {
			t.Errorf("exitedStat(%q) = %v, want %v", tc.line, got, tc.exited)
		}
	}
}

func TestProcTreeAliveFake(t *testing.T) {
	zombie := fakeProc{tid: 100, ppid: 50, comm: "z", state: 'Z', start: 500}
	tree, _ := newFakeProcTree(t, fakeInit, fakeShell, zombie)
	for _, tc := range []struct {
		p    lockmgr.ProcID
		want bool
	}{
		{lockmgr.ProcID{PID: 50, Start: 100}, true},
		{lockmgr.ProcID{PID: 50, Start: 101}, false},  // wrong start time: another process
		{lockmgr.ProcID{PID: 100, Start: 500}, false}, // zombie
		{lockmgr.ProcID{PID: 77, Start: 1}, false},    // no such pid
		{lockmgr.ProcID{}, false},
		{lockmgr.ProcID{PID: -1, Start: 0}, false},
	} {
		if got := tree.Alive(tc.p); got != tc.want {
			t.Errorf("Alive(%+v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

func TestProcTreeLineageNoSuchThread(t *testing.T) {
	tree, _ := newFakeProcTree(t, fakeInit, fakeShell)
	for _, tid := range []int{0, -1, 77} {
		_, err := tree.Lineage(tid)
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Lineage(%d) error %v, want one wrapping os.ErrNotExist", tid, err)
		}
		if err != nil && !strings.HasPrefix(err.Error(), fmt.Sprintf("lineage of thread %d: ", tid)) {
			t.Errorf("Lineage(%d) error %q does not name the thread", tid, err)
		}
	}
}

func TestProcTreeConfig(t *testing.T) {
	if _, err := NewTree(TreeConfig{CacheSize: -1}); err == nil {
		t.Error("NewTree accepted a negative cache size")
	}
	if _, err := NewTree(TreeConfig{ProcRoot: filepath.Join(t.TempDir(), "missing")}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("NewTree(missing root) error %v, want os.ErrNotExist", err)
	}
	got := TreeConfig{}.withDefaults()
	if want := (TreeConfig{ProcRoot: "/proc", CacheSize: 4096, RecheckAfter: 50 * time.Millisecond}); got != want {
		t.Errorf("defaults = %+v, want %+v", got, want)
	}
}

func BenchmarkLineageCached(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tree := newRealProcTree(b)
	tid := unix.Gettid()
	if _, err := tree.Lineage(tid); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tree.Lineage(tid); err != nil {
			b.Fatal(err)
		}
	}
}

// TestProcTreeRecheckWindow: within RecheckAfter a cached thread is trusted
// without reading /proc; after it, a reused thread id is noticed. The
// control is the read after the window, which sees the change.
func TestProcTreeRecheckWindow(t *testing.T) {
	app := fakeProc{tid: 100, ppid: 50, comm: "app", start: 500}
	root := t.TempDir()
	for _, p := range []fakeProc{fakeInit, fakeShell, app} {
		p.write(t, root)
	}
	tree, err := NewTree(TreeConfig{ProcRoot: root, RecheckAfter: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	first, err := tree.Lineage(100)
	if err != nil {
		t.Fatal(err)
	}
	// tid 100 is reused by a process of another parent.
	reused := fakeProc{tid: 100, ppid: 1, comm: "other", start: 900}
	reused.write(t, root)
	if l, err := tree.Lineage(100); err != nil || !slices.Equal(l, first) {
		t.Fatalf("within the window: %v, %v; want the cached %v", l, err, first)
	}
	time.Sleep(250 * time.Millisecond)
	l, err := tree.Lineage(100)
	if err != nil {
		t.Fatal(err)
	}
	if want := (lockmgr.Lineage{{PID: 100, Start: 900}, {PID: 1, Start: 1}}); !slices.Equal(l, want) {
		t.Fatalf("after the window: %v, want %v", l, want)
	}
}
