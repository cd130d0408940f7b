package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

func newServer(t *testing.T) (*lockmgr.Engine, string, chan lockmgr.LostHold) {
	t.Helper()
	e, sock, lost, _ := newServerSrc(t)
	return e, sock, lost
}

// newServerSrc is newServer, also returning the engine's SOURCE.
func newServerSrc(t *testing.T) (*lockmgr.Engine, string, chan lockmgr.LostHold, string) {
	t.Helper()
	// Registered first, so that it checks after the server and the
	// engine are closed below.
	testutil.CheckGoroutines(t)
	src := t.TempDir()
	for _, d := range []string{"a/b", "c"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := localbackend.New(localbackend.Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := procinfo.NewTree(procinfo.TreeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan lockmgr.LostHold, 16)
	e, err := lockmgr.New(lockmgr.Config{Backend: b, Processes: procs, Host: "h1",
		OnLoss: func(l lockmgr.LostHold) { lost <- l }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(Config{Engine: e, Mountpoint: "/mnt/x", Backend: "local",
		Notes: func(id lockmgr.LockID, o lockmgr.Owner) string { return "note-" + o.String() }})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(testutil.SocketDir(t), "x.sock")
	if err := s.Listen(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		e.Close()
	})
	return e, sock, lost, src
}

// TestStatusShowsWaiterBlockedOutside: a request waiting for a lock that a
// program holds on SOURCE directly is listed, with who blocks it. Before,
// the lock did not appear in the status at all.
func TestStatusShowsWaiterBlockedOutside(t *testing.T) {
	testutil.RequireTools(t, "flock")
	e, sock, _, src := newServerSrc(t)
	hold := exec.Command("flock", "-x", filepath.Join(src, "c", "..LOCK"), "-c", "echo locked; exec sleep 60")
	hold.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	holder := testutil.StartChild(t, hold)
	if line := holder.Line(time.Minute); line != "locked" {
		t.Fatalf("flock said %q", line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner := lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 9}
	c := lockmgr.LockID{Path: "c", Kind: lockmgr.KindDir}
	done := make(chan error, 1)
	go func() {
		_, err := e.Acquire(ctx, lockmgr.Request{Lock: c, Mode: lockmgr.Exclusive, Owner: owner, TID: unix.Gettid(), Wait: true})
		done <- err
	}()
	var waiter Waiter
	testutil.Eventually(t, "the waiter to show in status", func() bool {
		r, err := Call(ctx, sock, Request{Op: "status", Path: "c"})
		if err != nil || len(r.Locks) != 1 || len(r.Locks[0].Waiters) != 1 {
			return false
		}
		waiter = r.Locks[0].Waiters[0]
		// The request passes its implicit step on . first: wait for it
		// to reach its own.
		return waiter.Mode == "exclusive"
	})
	if waiter.Blocker != "another process or daemon on this host (backing file)" || waiter.Mode != "exclusive" || waiter.PID != os.Getpid() {
		t.Errorf("waiter %+v", waiter)
	}
	// Control: it waits until the outside holder goes, then holds.
	select {
	case err := <-done:
		t.Fatalf("granted while the backing file is flocked: %v", err)
	default:
	}
	holder.Kill()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := e.Release(ctx, c, owner); err != nil {
		t.Fatal(err)
	}
}

func TestStatusAndBreak(t *testing.T) {
	e, sock, lost := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tid := unix.Gettid()
	owner := lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 7}
	if _, err := e.Acquire(ctx, lockmgr.Request{Lock: lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindDir},
		Mode: lockmgr.Exclusive, Owner: owner, TID: tid, UID: 0}); err != nil {
		t.Fatal(err)
	}
	r, err := Call(ctx, sock, Request{Op: "status", Path: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Locks) != 2 { // a (implicit) and a/b; not the root
		t.Fatalf("status under a: %+v", r.Locks)
	}
	ab := r.Locks[1]
	if ab.Path != "a/b" || ab.Mode != "exclusive" || len(ab.Holders) != 1 {
		t.Fatalf("a/b: %+v", ab)
	}
	h := ab.Holders[0]
	if h.PID != os.Getpid() || h.Token == 0 || !h.Explicit || h.Note != "note-"+owner.String() || h.Host != "h1" {
		t.Fatalf("holder: %+v", h)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, r, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "a/b") || !strings.Contains(buf.String(), "implicit(1)") {
		t.Fatalf("table:\n%s", buf.String())
	}
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}

	// Break: the holder is treated as on lease loss.
	if _, err := Call(ctx, sock, Request{Op: "break", Path: "a/b", Kind: "dir"}); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-lost:
		if !errors.Is(l.Err, lockmgr.ErrBroken) || l.Holder.Process.PID != os.Getpid() {
			t.Fatalf("OnLoss after break: %+v", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnLoss was not called after break")
	}
	if _, err := e.Acquire(ctx, lockmgr.Request{Lock: lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindDir},
		Mode: lockmgr.Shared, Owner: owner, TID: tid}); !errors.Is(err, lockmgr.ErrLeaseLost) {
		t.Fatalf("lock call on a broken lock: %v, want ErrLeaseLost", err)
	}
	// Another owner gets the lock at once.
	if _, err := e.Acquire(ctx, lockmgr.Request{Lock: lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindDir},
		Mode: lockmgr.Exclusive, Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 8}, TID: tid}); err != nil {
		t.Fatalf("after break: %v", err)
	}
	if _, err := Call(ctx, sock, Request{Op: "break", Path: "nothing"}); err == nil {
		t.Fatal("break of an unheld lock succeeded")
	}
}

// TestNonRoot: a user who is neither root nor the daemon's owner is turned
// away even when the socket's mode would let them connect; the control is
// root, which gets in.
func TestNonRoot(t *testing.T) {
	testutil.RequireRoot(t, "to run a client as another user")
	_, sock, _ := newServer(t)
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(sock), filepath.Dir(filepath.Dir(sock))} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	py := `import socket,sys,json
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(json.dumps({"op":sys.argv[2],"path":"a"}).encode()+b"\n")
print(s.makefile().readline())`
	run := func(asNobody bool, op string) string {
		args := []string{"/usr/bin/python3", "-c", py, sock, op}
		if asNobody {
			args = append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}, args...)
		}
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := run(true, "status"); !strings.Contains(out, "permission denied") {
		t.Fatalf("nobody's status: %s", out)
	}
	if out := run(true, "break"); !strings.Contains(out, "permission denied") {
		t.Fatalf("nobody's break: %s", out)
	}
	if out := run(false, "status"); strings.Contains(out, "permission denied") {
		t.Fatalf("control: root was refused: %s", out)
	}
}

// TestClaimRows: a backend's claim record becomes a Claim and a table row;
// a claims error is printed under the table.
func TestClaimRows(t *testing.T) {
	c := claimOf("a", lockmgr.KindDir, lockmgr.ParseClaimRecord("host=build-7 mode=exclusive since=2026-12-01T10:00:00Z session=s1.abc state=stale use=claimed"))
	want := Claim{Path: "a", Kind: "dir", Host: "build-7", Mode: "exclusive", Since: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
		Session: "s1.abc", State: "stale", Use: "claimed"}
	if c != want {
		t.Fatalf("claimOf: %+v, want %+v", c, want)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, Reply{Claims: []Claim{c}, ClaimsError: "read x: 503"}, want.Since.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, s := range []string{"claim(claimed)", "build-7", "exclusive", "1m0s", "session stale", "could not be read: read x: 503"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
	buf.Reset()
	if err := WriteTable(&buf, Reply{}, time.Now()); err != nil || strings.Contains(buf.String(), "claim(") || strings.Contains(buf.String(), "could not") {
		t.Errorf("control: a reply without claims: %v\n%s", err, buf.String())
	}
}

// TestStatusShowsWaiterQueuedAbove: a request for a/b waits on a first
// while another process holds a; the status of a/b shows it (before, the
// row sat under a and the status of a/b was empty), without a's holder;
// the status of c (control) shows nothing, and says so.
func TestStatusShowsWaiterQueuedAbove(t *testing.T) {
	testutil.RequireTools(t, "sleep")
	e, sock, _ := newServer(t)
	other := exec.Command("sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}
	holderOwner := lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1}
	if _, err := e.Acquire(ctx, lockmgr.Request{Lock: a, Mode: lockmgr.Exclusive, Owner: holderOwner, TID: other.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.Acquire(wctx, lockmgr.Request{Lock: lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindDir}, Mode: lockmgr.Exclusive,
			Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 2}, TID: unix.Gettid(), Wait: true})
		done <- err
	}()
	defer func() { wcancel(); <-done }()
	var r Reply
	testutil.Eventually(t, "the waiter for a/b to show in the status of a/b", func() bool {
		var err error
		r, err = Call(ctx, sock, Request{Op: "status", Path: "a/b"})
		return err == nil && len(r.Locks) == 1 && len(r.Locks[0].Waiters) == 1
	})
	if l := r.Locks[0]; l.Path != "a" || len(l.Holders) != 0 || l.Waiters[0].Wants != "a/b/.lock" || l.Waiters[0].PID != os.Getpid() {
		t.Errorf("status of a/b: %+v", r.Locks)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, r, time.Now()); err != nil || !strings.Contains(buf.String(), "for a/b/.lock exclusive") {
		t.Errorf("table of a/b: %v\n%s", err, buf.String())
	}
	r, err := Call(ctx, sock, Request{Op: "status", Path: "c"})
	if err != nil || len(r.Locks) != 0 {
		t.Fatalf("status of c: %+v, %v", r.Locks, err)
	}
	buf.Reset()
	if err := WriteTable(&buf, r, time.Now()); err != nil || strings.TrimSpace(buf.String()) != "no locks (none held or waited for)" {
		t.Errorf("table of c: %v %q", err, buf.String())
	}
}
