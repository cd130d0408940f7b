package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/daemon"
	lockfs "github.com/lockfs/lockfs/fs"
	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// TestProfileDaemon profiles a lockfs daemon that runs in this test
// process, built from the same packages and options as `lockfs mount`
// (local backend), under the harness's loads: CPU profiles of lock pairs
// at depth 4, of create+stat+unlink cycles, of eight processes on disjoint
// locks (with a mutex profile) and of a sequential read, and a heap profile
// with many locks held. It adds nothing to the daemon. It
// runs only when LOCKFS_BENCH_PROFILE names a directory for the profiles
// (LOCKFS_BENCH_PROFILE_HELD: how many locks to hold, default 15000):
//
//	LOCKFS_BENCH_PROFILE=/tmp/prof go test -run TestProfileDaemon -v ./bench/
//	go tool pprof -top /tmp/prof/cpu-pair.pprof
func TestProfileDaemon(t *testing.T) {
	out, held, loadgen := profileSetup(t)
	src, mnt := t.TempDir(), t.TempDir()
	for _, d := range []string{"a/b/c/d", "meta"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	makeProfileTree(t, filepath.Join(src, "h"), held)

	backend, err := localbackend.New(localbackend.Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	profileMount(t, src, mnt, backend)

	run := func(args ...string) {
		t.Helper()
		b, err := exec.Command(loadgen, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("loadgen %v: %v: %s", args, err, b)
		}
		t.Logf("loadgen %s: %s", args[0], bytes.TrimSpace(b))
	}
	cpu := func(name string, fn func()) {
		t.Helper()
		profileCPU(t, filepath.Join(out, "cpu-"+name+".pprof"), fn)
	}
	cpu("pair", func() { run("pair", "-file", filepath.Join(mnt, "a/b/c/d/.lock"), "-n", "20000") })
	cpu("pair0", func() { run("pair", "-file", filepath.Join(mnt, ".lock"), "-n", "20000") })
	cpu("meta", func() { run("meta", "-dir", filepath.Join(mnt, "meta"), "-n", "4000") })
	// Eight processes on disjoint locks, with the mutex profile on.
	runtime.SetMutexProfileFraction(10)
	cpu("disjoint8", func() {
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		start := strconv.FormatInt(ts.Nano()+int64(300*time.Millisecond), 10)
		done := make(chan struct{}, 8)
		for i := 0; i < 8; i++ {
			d := filepath.Join(src, "disjoint", strconv.Itoa(i), "c", "d")
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			go func() {
				defer func() { done <- struct{}{} }()
				b, err := exec.Command(loadgen, "disjoint", "-file", filepath.Join(mnt, "disjoint", strconv.Itoa(i), "c", "d", ".lock"),
					"-start", start, "-dur", "3s").CombinedOutput()
				if err != nil {
					t.Errorf("disjoint: %v: %s", err, b)
				}
			}()
		}
		for i := 0; i < 8; i++ {
			<-done
		}
	})
	if mp, err := os.Create(filepath.Join(out, "mutex-disjoint8.pprof")); err == nil {
		pprof.Lookup("mutex").WriteTo(mp, 0)
		mp.Close()
	}
	runtime.SetMutexProfileFraction(0)
	big := filepath.Join(src, "big")
	run("write", "-file", big, "-size", strconv.Itoa(256<<20))
	cpu("read", func() { // lockfs drops its page cache on open: each read reaches the daemon
		for i := 0; i < 4; i++ {
			run("read", "-file", filepath.Join(mnt, "big"))
		}
	})
	os.Remove(big)

	profileHeld(t, out, "", loadgen, filepath.Join(mnt, "h"), held, nil)
}

// profileMount mounts src at mnt with a daemon in this process, built from
// the same packages and options as `lockfs mount`, over backend; unmounted
// when t ends.
func profileMount(t *testing.T, src, mnt string, backend lockmgr.Backend) {
	t.Helper()
	d, err := daemon.Start(daemon.Config{Use: backend, Host: "profile", Mountpoint: mnt, FS: lockfs.Config{Source: src}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
}

// profileHeld has a loadgen holder take held locks under root (made by
// makeProfileTree) through the daemon of this process, writes the heap
// profile to out/heap-held<name>.pprof and a summary line to
// out/summary<name>.txt: the heap in use and the goroutine stacks before
// and after, per lock. Profiles with goroutine stacks:
// out/goroutine-held<name>.pprof. whileHeld, if not nil, runs once the
// profiles are written, with the locks still held.
func profileHeld(t *testing.T, out, name, loadgen, root string, held int, whileHeld func()) {
	t.Helper()
	type mem struct {
		heap, live, stacks uint64
		goroutines         int
	}
	memNow := func() mem {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return mem{ms.HeapInuse, ms.HeapAlloc, ms.StackInuse, runtime.NumGoroutine()}
	}
	before := memNow()
	cmd := exec.Command(loadgen, "hold", "-root", root, "-n", strconv.Itoa(held), "-fan", "1000")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	var ready struct{ Held float64 }
	if err := json.NewDecoder(stdout).Decode(&ready); err != nil || int(ready.Held) != held {
		t.Fatalf("holder: %v %+v", err, ready)
	}
	go io.Copy(io.Discard, stdout)
	after := memNow()
	hp, err := os.Create(filepath.Join(out, "heap-held"+name+".pprof"))
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Close()
	if err := pprof.Lookup("heap").WriteTo(hp, 0); err != nil {
		t.Fatal(err)
	}
	if gp, err := os.Create(filepath.Join(out, "goroutine-held"+name+".pprof")); err == nil {
		pprof.Lookup("goroutine").WriteTo(gp, 0)
		gp.Close()
	}
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	perLock := func(a, b uint64) float64 { return (float64(b) - float64(a)) / 1024 / float64(held) }
	msg := fmt.Sprintf("%d locks held: heap in use %.1f MiB -> %.1f MiB (%.2f KiB per lock; live objects %.2f KiB per lock, "+
		"the rest is room in spans that hold some); goroutine stacks %.1f MiB -> %.1f MiB "+
		"(%.2f KiB per lock; %d -> %d goroutines); max RSS of the test process %.0f MiB",
		held, float64(before.heap)/(1<<20), float64(after.heap)/(1<<20), perLock(before.heap, after.heap), perLock(before.live, after.live),
		float64(before.stacks)/(1<<20), float64(after.stacks)/(1<<20), perLock(before.stacks, after.stacks),
		before.goroutines, after.goroutines, float64(ru.Maxrss)/1024)
	t.Log(msg)
	if err := os.WriteFile(filepath.Join(out, "summary"+name+".txt"), []byte(msg+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if whileHeld != nil {
		whileHeld()
	}
}

// profileSetup reads the profile's environment (skipping t without
// LOCKFS_BENCH_PROFILE), makes the output directory and builds loadgen.
func profileSetup(t *testing.T) (out string, held int, loadgen string) {
	t.Helper()
	out = os.Getenv("LOCKFS_BENCH_PROFILE")
	if out == "" {
		t.Skip("set LOCKFS_BENCH_PROFILE=DIR to profile an in-process lockfs daemon")
	}
	requireFUSE(t)
	// LOCKFS_BENCH_PROFILE_RATE: bytes per heap profile sample (Go's
	// default 512 KiB leaves out most of the small objects a held lock
	// keeps).
	if s := os.Getenv("LOCKFS_BENCH_PROFILE_RATE"); s != "" {
		rate, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		old := runtime.MemProfileRate
		runtime.MemProfileRate = rate
		t.Cleanup(func() { runtime.MemProfileRate = old })
	}
	held = 15000
	if s := os.Getenv("LOCKFS_BENCH_PROFILE_HELD"); s != "" {
		var err error
		if held, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if b, err := exec.Command("go", "build", "-o", bin+"/", "./internal/loadgen").CombinedOutput(); err != nil {
		t.Fatalf("build loadgen: %v\n%s", err, b)
	}
	return out, held, filepath.Join(bin, "loadgen")
}

// makeProfileTree makes held directories under root, 1000 per directory,
// for profileHeld's holder.
func makeProfileTree(t *testing.T, root string, held int) {
	t.Helper()
	for i := 0; i < held; i++ {
		if err := os.MkdirAll(filepath.Join(root, strconv.Itoa(i/1000), strconv.Itoa(i%1000)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestProfileHeldGCS is TestProfileDaemon's heap profile with the gcs
// backend (on the GCS emulator, default TTL): the heap of a daemon in this
// process holding LOCKFS_BENCH_PROFILE_HELD locks (default 15000), to
// out/heap-held-gcs.pprof and out/summary-gcs.txt; then, with the locks
// still held, the CPU profile of lock pairs at depth 4, to
// out/cpu-pair-held-gcs.pprof.
//
//	LOCKFS_BENCH_PROFILE=/tmp/prof go test -run TestProfileHeldGCS -v ./bench/
//	go tool pprof -sample_index=inuse_space -top /tmp/prof/heap-held-gcs.pprof
func TestProfileHeldGCS(t *testing.T) {
	out, held, loadgen := profileSetup(t)
	emu := gcstest.Start(t)
	src, mnt := t.TempDir(), t.TempDir()
	makeProfileTree(t, filepath.Join(src, "h"), held)
	if err := os.MkdirAll(filepath.Join(src, "a/b/c/d"), 0o755); err != nil {
		t.Fatal(err)
	}
	backend, err := gcsbackend.New(context.Background(), gcsbackend.Config{
		Bucket: emu.Bucket, Endpoint: emu.Endpoint(), HostID: "profile"})
	if err != nil {
		t.Fatal(err)
	}
	profileMount(t, src, mnt, backend)
	profileHeld(t, out, "-gcs", loadgen, filepath.Join(mnt, "h"), held, func() {
		profileCPU(t, filepath.Join(out, "cpu-pair-held-gcs.pprof"), func() {
			b, err := exec.Command(loadgen, "pair", "-file", filepath.Join(mnt, "a/b/c/d/.lock"), "-n", "5000").CombinedOutput()
			if err != nil {
				t.Fatalf("loadgen pair: %v: %s", err, b)
			}
			t.Logf("loadgen pair with %d held: %s", held, bytes.TrimSpace(b))
		})
	})
}

// profileCPU writes the CPU profile of fn to path.
func profileCPU(t *testing.T, path string, fn func()) {
	t.Helper()
	p, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := pprof.StartCPUProfile(p); err != nil {
		t.Fatal(err)
	}
	defer pprof.StopCPUProfile()
	fn()
}

// TestProfileDrain profiles the in-process daemon while a queue of
// waiters drains: a holder keeps a/.lock, LOCKFS_BENCH_PROFILE_WAITERS
// threads (default 10000) of one loadgen each wait for it on their own
// open file description, then the holder lets go and each waiter takes
// the lock, releases it and closes. It writes cpu-queue.pprof (while
// they queue), cpu-drain.pprof, and heap-queued.pprof and
// goroutine-queued.pprof (all waiters queued) under LOCKFS_BENCH_PROFILE:
//
//	LOCKFS_BENCH_PROFILE=/tmp/prof go test -run TestProfileDrain -v ./bench/
func TestProfileDrain(t *testing.T) {
	out, _, loadgen := profileSetup(t)
	n := 10000
	if s := os.Getenv("LOCKFS_BENCH_PROFILE_WAITERS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	lim.Cur = lim.Max
	unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	src, mnt := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	backend, err := localbackend.New(localbackend.Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	profileMount(t, src, mnt, backend)
	ctl := filepath.Join(mnt, "a", ".lock")
	holder := exec.Command(loadgen, "lock", "-file", ctl)
	holder.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	hin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	hout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Wait()
	defer hin.Close()
	var granted struct{ Granted_ns float64 }
	if err := json.NewDecoder(hout).Decode(&granted); err != nil {
		t.Fatal(err)
	}
	waiters := exec.Command(loadgen, "waiters", "-file", ctl, "-n", strconv.Itoa(n))
	waiters.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	wout, err := waiters.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	waiters.Stderr = os.Stderr
	if err := waiters.Start(); err != nil {
		t.Fatal(err)
	}
	defer waiters.Wait()
	dec := json.NewDecoder(wout)
	var opened struct{ Opened_ns float64 }
	if err := dec.Decode(&opened); err != nil {
		t.Fatal(err)
	}
	queueOut, err := os.Create(filepath.Join(out, "cpu-queue.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	defer queueOut.Close()
	if err := pprof.StartCPUProfile(queueOut); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	want := fmt.Sprintf("\nwaiters %d\n", n)
	for {
		b, err := testutil.ReadNoPoll(ctl)
		if err == nil && bytes.Contains(b, []byte(want)) {
			break
		}
		if time.Since(start) > 5*time.Minute {
			t.Fatalf("the %d waiters did not all queue within 5 minutes", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	pprof.StopCPUProfile()
	t.Logf("%d waiters queued in %v", n, time.Since(start).Round(time.Millisecond))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("queued: heap in use %.1f MiB, goroutine stacks %.1f MiB (%d goroutines), from the OS %.1f MiB",
		float64(ms.HeapInuse)/(1<<20), float64(ms.StackInuse)/(1<<20), runtime.NumGoroutine(), float64(ms.Sys)/(1<<20))
	for _, p := range []string{"heap", "goroutine"} {
		if f, err := os.Create(filepath.Join(out, p+"-queued.pprof")); err == nil {
			pprof.Lookup(p).WriteTo(f, 0)
			f.Close()
		}
	}
	var done struct{ First_ns, Last_ns, Errors float64 }
	cpuOut, err := os.Create(filepath.Join(out, "cpu-drain.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	defer cpuOut.Close()
	if err := pprof.StartCPUProfile(cpuOut); err != nil {
		t.Fatal(err)
	}
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	hin.Close() // the holder lets go
	err = dec.Decode(&done)
	pprof.StopCPUProfile()
	if err != nil {
		t.Fatal(err)
	}
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	t.Logf("drain of %d waiters: %.2f s after the release (first grant after %.3f s), %v errors; max RSS of the test process %.0f MiB",
		n, (done.Last_ns-float64(ts.Nano()))/1e9, (done.First_ns-float64(ts.Nano()))/1e9, done.Errors, float64(ru.Maxrss)/1024)
}
