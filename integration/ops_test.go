package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Operating lockfs: mounting through /etc/fstab's helper, lockfs status and
// break, and the metrics endpoint, end to end.

// TestFstabMount: "mount -t fuse.lockfs SOURCE MOUNTPOINT -o ..." goes
// through /sbin/mount.fuse.lockfs (a link to the lockfs binary, as make
// install makes it), detaches the daemon, and "umount" stops it.
func TestFstabMount(t *testing.T) {
	requireFUSE(t)
	requireRoot(t)
	require(t, "mount", "umount")
	helper := "/sbin/mount.fuse.lockfs"
	if target, err := os.Readlink(helper); err == nil {
		t.Logf("%s already links to %s: replacing it for the test", helper, target)
		defer os.Symlink(target, helper)
	} else if fileExists(helper) {
		t.Fatalf("%s exists and is not a link: not touching it", helper)
	}
	os.Remove(helper)
	if err := os.Symlink(lockfsBin, helper); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(helper)

	src, mnt := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "daemon.log")
	t.Cleanup(func() {
		if isMounted(mnt) {
			run(t, 10*time.Second, "fusermount3", "-uz", mnt)
		}
	})

	// A typo in the options fails loudly and mounts nothing (the control
	// that the options are read at all).
	if r := run(t, 30*time.Second, "mount", "-t", "fuse.lockfs", src, mnt, "-o", "backend=local,no_such_option"); r.code == 0 || isMounted(mnt) {
		t.Fatalf("mount with an unknown option: %v", r)
	}
	r := run(t, 60*time.Second, "mount", "-t", "fuse.lockfs", src, mnt, "-o", "backend=local,allow_other,_netdev,log-file="+logFile)
	if r.code != 0 {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("mount -t fuse.lockfs: %v\n%s", r, log)
	}
	if !isMounted(mnt) {
		t.Fatal("mount returned 0 but nothing is mounted")
	}
	if r := run(t, 10*time.Second, "flock", "-n", filepath.Join(mnt, "a/.lock"), "true"); r.code != 0 {
		t.Fatalf("flock through the fstab mount: %v", r)
	}
	if r := run(t, 30*time.Second, "umount", mnt); r.code != 0 {
		t.Fatalf("umount: %v", r)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		log, _ := os.ReadFile(logFile)
		if strings.Contains(string(log), "msg=stopped") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not stop after umount; log:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if isMounted(mnt) {
		t.Fatal("still mounted after umount")
	}
}

type statusReply struct {
	Mountpoint string `json:"mountpoint"`
	Locks      []struct {
		Path    string `json:"path"`
		Kind    string `json:"kind"`
		Mode    string `json:"mode"`
		Holders []struct {
			Mode     string  `json:"mode"`
			Explicit bool    `json:"explicit"`
			PID      int     `json:"pid"`
			UID      *uint32 `json:"uid"`
			Command  string  `json:"command"`
			Token    uint64  `json:"token"`
			Note     string  `json:"note"`
			Lost     string  `json:"lost"`
			Hidden   bool    `json:"hidden"`
		} `json:"holders"`
		Waiters []struct {
			Mode string `json:"mode"`
			PID  int    `json:"pid"`
		} `json:"waiters"`
	} `json:"locks"`
	Claims []struct {
		Path  string `json:"path"`
		Kind  string `json:"kind"`
		Host  string `json:"host"`
		Mode  string `json:"mode"`
		State string `json:"state"`
		Use   string `json:"use"`
	} `json:"claims"`
	ClaimsError string `json:"claims_error"`
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestStatusBreakMetrics: status shows holders and waiters (table and
// JSON), metrics move as locks are taken and refused, and break makes the
// holder's lock calls fail with EIO, signals it, and lets the waiter in.
func TestStatusBreakMetrics(t *testing.T) {
	requireFUSE(t)
	requireRoot(t)
	require(t, "python3")
	addr := freePort(t)
	m := mount(t, withArgs("--metrics-addr", addr, "--on-lease-loss", "SIGUSR1"))

	// The holder: python takes the lock, writes a note, reports its pid,
	// then waits; on SIGUSR1 it tries another lock call and reports it.
	holder := start(t, "python3", "-c", `
import fcntl, os, signal, sys, time
f = open(sys.argv[1], "w")
fcntl.flock(f, fcntl.LOCK_EX)
f.write("deploying v1.2"); f.flush()
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
print("locked", flush=True)
while not got: time.sleep(0.01)
try:
    fcntl.flock(f, fcntl.LOCK_SH)
    print("relock ok", flush=True)
except OSError as e:
    print("relock errno", e.errno, flush=True)
`, m.path("a/.lock"))
	holder.waitLine("locked", 10*time.Second)
	waiter := start(t, "flock", "-s", m.path("a/b/.lock"), "echo", "waiter-ran")
	time.Sleep(300 * time.Millisecond)
	if r := run(t, 10*time.Second, "flock", "-n", m.path("a/.lock"), "true"); r.code != 1 {
		t.Fatalf("flock -n while held: %v, want exit 1", r)
	}

	r := run(t, 10*time.Second, lockfsBin, "status", "--json", m.Mnt)
	if r.code != 0 {
		t.Fatalf("lockfs status --json: %v", r)
	}
	var replies []statusReply
	if err := json.Unmarshal([]byte(r.stdout), &replies); err != nil || len(replies) != 1 {
		t.Fatalf("status JSON %q: %v", r.stdout, err)
	}
	var sawHolder, sawWaiter bool
	for _, l := range replies[0].Locks {
		if l.Path != "a" || l.Kind != "dir" {
			continue
		}
		for _, h := range l.Holders {
			if h.Explicit && h.Mode == "exclusive" && h.PID == holder.pid() && h.Command == "python3" &&
				h.Note == "deploying v1.2" && h.Token > 0 {
				sawHolder = true
			}
		}
		for _, w := range l.Waiters {
			if w.PID == waiter.pid() {
				sawWaiter = true
			}
		}
	}
	if !sawHolder || !sawWaiter {
		t.Fatalf("status lacks the holder (%v) or the waiter (%v):\n%s", sawHolder, sawWaiter, r.stdout)
	}
	table := run(t, 10*time.Second, lockfsBin, "status", m.path("a"))
	if table.code != 0 || !strings.Contains(table.stdout, "PATH") || !strings.Contains(table.stdout, "deploying v1.2") ||
		!strings.Contains(table.stdout, "waiting") {
		t.Fatalf("status table: %v", table)
	}
	t.Logf("lockfs status:\n%s", table.stdout)

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`lockfs_lock_requests_total{kind="dir",mode="exclusive",outcome="granted"} 1`,
		`lockfs_lock_requests_total{kind="dir",mode="exclusive",outcome="conflict"} 1`,
		`lockfs_locks_held{kind="dir",mode="exclusive"} 1`,
		`lockfs_lock_waiters{kind="dir"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, op := range []string{"lookup", "open", "lockwait", "lock"} {
		if !strings.Contains(string(body), `lockfs_fuse_op_seconds_count{op="`+op+`"}`) {
			t.Errorf("metrics lack FUSE latency for %s", op)
		}
	}

	// A non-root user may not break locks (the control for the break below).
	if r := run(t, 10*time.Second, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", lockfsBin, "break", m.path("a")); r.code == 0 {
		t.Fatalf("break as nobody: %v", r)
	}
	if r := run(t, 10*time.Second, lockfsBin, "break", m.path("a")); r.code != 0 {
		t.Fatalf("lockfs break: %v", r)
	}
	holder.waitLine(fmt.Sprintf("relock errno %d", syscall.EIO), 10*time.Second)
	waiter.waitLine("waiter-ran", 10*time.Second)
	if !strings.Contains(m.logText(), "lock broken by an operator") {
		t.Errorf("no audit line in the daemon's log")
	}
}
