package localbackend

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// contendedWithin reports whether ch is closed within d.
func contendedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// startWaiter runs "flock ARGS FILE true" in its own session: it waits in
// the kernel for the file's flock. Cleanup kills it.
func startWaiter(t *testing.T, file string, args ...string) *exec.Cmd {
	t.Helper()
	return testutil.StartInSession(t, exec.Command("flock", append(append([]string{}, args...), file, "true")...))
}

// A direct flock(1) client of SOURCE that waits for a leased file is
// noticed; the lease's own mode decides which waits count.
func TestContendedByDirectClient(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "f", "g")
	b := newBackend(t, src)

	lx := mustClaim(t, b, dirID("f"), lockmgr.Exclusive)
	chx := lx.(lockmgr.ContendedLease).Contended()
	// Control: nobody waits yet, and a flock -n that fails waits for
	// nothing.
	if externalTry(t, filepath.Join(src, "f", "..LOCK")) {
		t.Fatal("flock -n got the exclusively leased file")
	}
	if contendedWithin(chx, 100*time.Millisecond) {
		t.Fatal("contended with nobody waiting")
	}
	startWaiter(t, filepath.Join(src, "f", "..LOCK"), "-s")
	if !contendedWithin(chx, 10*time.Second) {
		t.Fatal("a shared waiter of an exclusive lease was not noticed")
	}

	// A shared lease is not contended by a shared request (it would not
	// wait for it), but is by an exclusive one.
	ls := mustClaim(t, b, dirID("g"), lockmgr.Shared)
	chs := ls.(lockmgr.ContendedLease).Contended()
	if !externalTry(t, filepath.Join(src, "g", "..LOCK"), "-s") {
		t.Fatal("flock -n -s was refused beside a shared lease")
	}
	startWaiter(t, filepath.Join(src, "g", "..LOCK"), "-x")
	if !contendedWithin(chs, 10*time.Second) {
		t.Fatal("an exclusive waiter of a shared lease was not noticed")
	}
	lx.Release(context.Background())
	ls.Release(context.Background())
	b.mu.Lock()
	n, running := len(b.contention.watched), b.contention.running
	b.mu.Unlock()
	if n != 0 {
		t.Errorf("%d leases still watched after their release", n)
	}
	// The poller ends once nothing is watched.
	for deadline := time.Now().Add(10 * time.Second); running; {
		if time.Now().After(deadline) {
			t.Fatal("the poller still runs with nothing watched")
		}
		time.Sleep(time.Millisecond)
		b.mu.Lock()
		running = b.contention.running
		b.mu.Unlock()
	}
}

// Another backend's wait (another daemon over the same SOURCE, waiting
// through its flock(1) child) is noticed; this backend's own wait is not.
func TestContendedByOtherBackendNotOwn(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "f")
	b1 := newBackend(t, src)
	b2 := newBackend(t, src)
	l := mustClaim(t, b1, dirID("f"), lockmgr.Exclusive)

	// b1's own waiter on the same file: its flock(1) child blocks in the
	// kernel, and is not an outside waiter. (The engine never waits for a
	// claim of a file whose lease it holds: this guard is defensive, and
	// a child that blocks before Start has returned is not yet known as
	// b1's own. So the watch starts once the child is known.)
	ctx, cancel := context.WithCancel(context.Background())
	own := claimAsync(ctx, b1, dirID("f"), lockmgr.Exclusive, "")
	waitingThroughFlock(t, 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		b1.mu.Lock()
		n := len(b1.contention.own)
		b1.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the flock(1) child was not recorded as the backend's own")
		}
	}
	ch := l.(lockmgr.ContendedLease).Contended()
	if contendedWithin(ch, 200*time.Millisecond) {
		t.Error("the backend's own flock(1) waiter was taken for an outside one")
	}
	cancel()
	if r := <-own; r.err == nil {
		t.Fatal("own claim beside the exclusive lease was granted")
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	other := claimAsync(ctx, b2, dirID("f"), lockmgr.Exclusive, "")
	if !contendedWithin(ch, 10*time.Second) {
		t.Fatal("another backend's waiting claim was not noticed")
	}
	l.Release(context.Background())
	r := <-other
	if r.err != nil {
		t.Fatalf("the other backend's claim after the release: %v", r.err)
	}
	r.lease.Release(context.Background())
}

// A lease released after someone outside was seen waiting keeps no shared
// flock, and the next claim that waits does not overtake the waiter: it
// queues behind it in the kernel. The control: a shared lease nobody
// waited for is kept (keep.go).
func TestYieldedReleaseQueuesBehind(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "f")
	b := newKeepBackend(t, src, time.Minute)
	file := filepath.Join(src, "f", "..LOCK")

	l := mustClaim(t, b, dirID("f"), lockmgr.Shared)
	l.(lockmgr.ContendedLease).Contended()
	l.Release(context.Background())
	if keptCount(b) != 1 {
		t.Fatal("control: an uncontended shared lease was not kept")
	}
	b.DropKept()

	l = mustClaim(t, b, dirID("f"), lockmgr.Shared)
	ch := l.(lockmgr.ContendedLease).Contended()
	// The waiter marks when it gets the lock, and holds it a while.
	mark := filepath.Join(t.TempDir(), "in")
	testutil.StartInSession(t, exec.Command("flock", "-x", file, "sh", "-c", `echo >"$1"; sleep 0.3`, "sh", mark))
	if !contendedWithin(ch, 10*time.Second) {
		t.Fatal("the waiter was not noticed")
	}
	l.Release(context.Background())
	if keptCount(b) != 0 {
		t.Fatal("a shared lease someone waited for was kept")
	}
	l2, err := b.Claim(context.Background(), dirID("f"), lockmgr.Shared, true)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(context.Background())
	if _, err := os.Stat(mark); err != nil {
		t.Fatal("the claim was granted before the outside waiter had its turn")
	}
}

func TestParseLockLine(t *testing.T) {
	for _, c := range []struct {
		line string
		want lockLine
		ok   bool
	}{
		{"1: FLOCK  ADVISORY  WRITE 25093 fe:00:9978055 0 EOF", lockLine{kind: "FLOCK", exclusive: true, pid: 25093, key: "fe:00:9978055"}, true},
		{"1: -> FLOCK  ADVISORY  READ 25103 fe:00:9978055 0 EOF", lockLine{blocked: true, kind: "FLOCK", pid: 25103, key: "fe:00:9978055"}, true},
		{"1:  -> FLOCK  ADVISORY  WRITE 25101 fe:00:9978055 0 EOF", lockLine{blocked: true, kind: "FLOCK", exclusive: true, pid: 25101, key: "fe:00:9978055"}, true},
		{"lock:\t1: FLOCK  ADVISORY  WRITE 7 00:2c:12 0 EOF", lockLine{kind: "FLOCK", exclusive: true, pid: 7, key: "00:2c:12"}, true},
		{"2: POSIX  ADVISORY  READ 9 08:01:5 0 EOF", lockLine{kind: "POSIX", pid: 9, key: "08:01:5"}, true},
		{"3: -> FLOCK", lockLine{}, false},
		{"", lockLine{}, false},
	} {
		got, ok := parseLockLine(c.line)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("parseLockLine(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestParseBlocked(t *testing.T) {
	table := "1: FLOCK  ADVISORY  WRITE 10 fe:00:7 0 EOF\n" +
		"1: -> FLOCK  ADVISORY  READ 11 fe:00:7 0 EOF\n" +
		"1:  -> FLOCK  ADVISORY  WRITE 12 fe:00:7 0 EOF\n" +
		"2: POSIX  ADVISORY  WRITE 13 fe:00:8 0 EOF\n" +
		"2: -> POSIX  ADVISORY  WRITE 14 fe:00:8 0 EOF\n" +
		"3: FLOCK  ADVISORY  READ 15 00:2c:9 0 EOF\n" +
		"3: -> FLOCK  ADVISORY  WRITE 16 00:2c:9 0 EOF"
	got := parseBlocked([]byte(table))
	want := map[string][]blockedReq{
		"fe:00:7": {{pid: 11}, {pid: 12, exclusive: true}},
		"00:2c:9": {{pid: 16, exclusive: true}},
	}
	if len(got) != len(want) {
		t.Fatalf("parseBlocked = %v, want %v", got, want)
	}
	for k, w := range want {
		if g := got[k]; len(g) != len(w) || (len(g) > 0 && (g[0] != w[0] || g[len(g)-1] != w[len(w)-1])) {
			t.Errorf("parseBlocked[%s] = %v, want %v", k, g, w)
		}
	}
	if got := parseBlocked([]byte("1: FLOCK  ADVISORY  WRITE 10 fe:00:7 0 EOF\n")); got != nil {
		t.Errorf("parseBlocked of a table without waiters = %v", got)
	}
}

// A shared lease given up to an exclusive waiter that another holder's
// shared flock still blocks: the next shared claim would be granted at once
// beside that holder, overtaking the waiter. It waits until the waiter had
// its turn. The control is the same claim with nobody seen waiting: granted
// beside the other holder at once.
func TestYieldedReleaseWaitsBehindBlockedWaiter(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t, "f")
	b := newBackend(t, src)
	file := filepath.Join(src, "f", "..LOCK")
	other := holdExternal(t, file, "", "-s") // another daemon's shared claim

	l := mustClaim(t, b, dirID("f"), lockmgr.Shared)
	ch := l.(lockmgr.ContendedLease).Contended()
	mark := filepath.Join(t.TempDir(), "in")
	testutil.StartInSession(t, exec.Command("flock", "-x", file, "sh", "-c", `echo >"$1"`, "sh", mark))
	if !contendedWithin(ch, 10*time.Second) {
		t.Fatal("the exclusive waiter was not noticed")
	}
	l.Release(context.Background())

	got := make(chan error, 1)
	go func() {
		l2, err := b.Claim(context.Background(), dirID("f"), lockmgr.Shared, true)
		if err == nil {
			_, err = os.Stat(mark)
			l2.Release(context.Background())
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a shared claim overtook the exclusive waiter that the other holder blocks (mark: %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	other.release()
	if err := <-got; err != nil {
		t.Fatalf("the claim after the waiter's turn: %v (the waiter had not run)", err)
	}

	// Control: nobody seen waiting, the same shared claim beside the
	// other holder is granted at once.
	other = holdExternal(t, file, "", "-s")
	defer other.release()
	l3, err := b.Claim(context.Background(), dirID("f"), lockmgr.Shared, false)
	if err != nil {
		t.Fatalf("control: shared claim beside a shared holder: %v", err)
	}
	l3.Release(context.Background())
}
