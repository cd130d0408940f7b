package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// Tests of `lockfs lock` (SPEC §6a), with real processes: through a mount,
// with --source and no mount, and with the gcs backend and no mount.

// holdCmd is the COMMAND of a lockfs lock that holds until killed: it says
// "held" with its token, and "told" once if it gets SIGTERM. Through a mount
// a broken lock's COMMAND may get two (the daemon's --on-lease-loss signal
// to the holder's descendants, and lockfs lock's own to COMMAND's group):
// the trap ignores the second, which would otherwise say "told" again.
const holdCmd = `trap 'trap "" TERM; echo told; exit 143' TERM; echo "held $LOCKFS_TOKEN"; while :; do sleep 0.1; done`

// lockHolder starts `lockfs lock ARGS -- sh -c holdCmd` and waits until
// COMMAND runs; it returns the process and the token COMMAND got.
func underLock(t *testing.T, args ...string) (*proc, uint64) {
	t.Helper()
	argv := append(append([]string{"lock"}, args...), "--", "sh", "-c", holdCmd)
	p := start(t, lockfsBin, argv...)
	line, ok := p.nextLine(30 * time.Second)
	if !ok || !strings.HasPrefix(line, "held ") {
		p.kill()
		t.Fatalf("lockfs %q: no \"held\" line (got %q); stderr %q", argv, line, p.stderr.String())
	}
	tok, err := strconv.ParseUint(strings.TrimPrefix(line, "held "), 10, 64)
	if err != nil || tok == 0 {
		t.Fatalf("lockfs %q: COMMAND's LOCKFS_TOKEN is %q", argv, line)
	}
	return p, tok
}

// lockRun runs `lockfs lock ARGS` to completion.
func lockRun(t *testing.T, args ...string) result {
	t.Helper()
	return lockfs(t, 60*time.Second, append([]string{"lock"}, args...)...)
}

// freeEventually waits until `flock -n PATH true` succeeds.
func freeEventually(t *testing.T, what, path string) {
	t.Helper()
	if !testutil.Poll(30*time.Second, func() bool { return flockN(t, path).code == 0 }) {
		t.Errorf("%s: %s still busy", what, path)
	}
}

func TestLockThroughMount(t *testing.T) {
	m := mount(t)
	dir := m.path("a")

	t.Run("excluded by flock(1)", func(t *testing.T) {
		h := holder(t, m.path("a/.lock"))
		expectCode(t, "lockfs lock -n while flock(1) holds", lockRun(t, "-n", dir, "true"), 1)
		expectCode(t, "lockfs lock -n -E 7 while flock(1) holds", lockRun(t, "-n", "-E", "7", dir, "true"), 7)
		expectCode(t, "lockfs lock -w 1 while flock(1) holds", lockRun(t, "-w", "1", dir, "true"), 1)
		// flock(1)'s habits: -w 0 fails at once as -n does (it waited for
		// ever), the other spellings of the flags, the control file as
		// TARGET.
		expectCode(t, "lockfs lock -w 0 while flock(1) holds", lockRun(t, "-w", "0", dir, "true"), 1)
		expectCode(t, "lockfs lock --nb while flock(1) holds", lockRun(t, "--nb", dir, "true"), 1)
		expectCode(t, "lockfs lock -e --wait 1 while flock(1) holds", lockRun(t, "-e", "--wait", "1", dir, "true"), 1)
		expectCode(t, "lockfs lock -n on the control file while flock(1) holds", lockRun(t, "-n", m.path("a/.lock"), "true"), 1)
		r := lockRun(t, "-v", "-w", "2.5", dir, "true")
		expectCode(t, "lockfs lock -v -w 2.5 while flock(1) holds", r, 1)
		if !strings.Contains(r.stderr, "waiting") || !strings.Contains(r.stderr, "pid "+strconv.Itoa(h.pid())) ||
			!strings.Contains(r.stderr, "flock") {
			t.Errorf("lockfs lock -v does not say who holds the lock (flock, pid %d): %q", h.pid(), r.stderr)
		}
		h.kill()
		// Control: the same commands get the lock once it is free (the
		// kernel sends the dead holder's RELEASE in the background).
		freeEventually(t, "a after flock(1) ended", m.path("a/.lock"))
		expectCode(t, "lockfs lock -n once free", lockRun(t, "-n", dir, "true"), 0)
		expectCode(t, "lockfs lock -w 1 once free", lockRun(t, "-w", "1", dir, "true"), 0)
		expectCode(t, "lockfs lock -w 0 once free", lockRun(t, "-w", "0", dir, "true"), 0)
		expectCode(t, "lockfs lock -n -o on the control file once free", lockRun(t, "-n", "-o", m.path("a/.lock"), "true"), 0)
		// The control file's name says the kind.
		r = lockRun(t, m.path("a/.lock_newdir"), "sh", "-c", `echo "$LOCKFS_LOCK"`)
		if r.code != 0 || strings.TrimSpace(r.stdout) != m.path("a/.lock_newdir") {
			t.Errorf("lockfs lock a/.lock_newdir: %v, want LOCKFS_LOCK %s", r, m.path("a/.lock_newdir"))
		}
	})

	t.Run("excludes flock(1)", func(t *testing.T) {
		p, _ := underLock(t, dir)
		expectCode(t, "flock -n while lockfs lock holds", flockN(t, m.path("a/.lock")), 1)
		expectCode(t, "flock -n -s while lockfs lock holds", flockN(t, m.path("a/.lock"), "-s"), 1)
		expectCode(t, "flock -n on a sibling (control)", flockN(t, m.path("b/.lock")), 0)
		p.kill()
		freeEventually(t, "after lockfs lock ended", m.path("a/.lock"))
	})

	t.Run("python fcntl.flock", func(t *testing.T) {
		require(t, "python3")
		py := startPython(t, `import fcntl, sys
f = open(sys.argv[1])
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()`, m.path("a/.lock"))
		py.waitLine("held", 15*time.Second)
		expectCode(t, "lockfs lock -n while python holds", lockRun(t, "-n", dir, "true"), 1)
		py.kill()
		freeEventually(t, "a after python ended", m.path("a/.lock"))
		expectCode(t, "lockfs lock -n after python ended (control)", lockRun(t, "-n", dir, "true"), 0)

		p, _ := underLock(t, dir)
		try := `import fcntl, sys
f = open(sys.argv[1])
try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("got")
except BlockingIOError:
    print("busy")`
		if r := run(t, 15*time.Second, "python3", "-c", try, m.path("a/.lock")); strings.TrimSpace(r.stdout) != "busy" {
			t.Errorf("python fcntl.flock LOCK_NB while lockfs lock holds: %v, want busy", r)
		}
		p.kill()
		if !testutil.Poll(30*time.Second, func() bool {
			return strings.TrimSpace(run(t, 15*time.Second, "python3", "-c", try, m.path("a/.lock")).stdout) == "got"
		}) {
			t.Error("python fcntl.flock LOCK_NB never got the lock after lockfs lock ended (control)")
		}
	})

	t.Run("shared", func(t *testing.T) {
		p, _ := underLock(t, "-s", dir)
		expectCode(t, "flock -n -s while lockfs lock -s holds", flockN(t, m.path("a/.lock"), "-s"), 0)
		expectCode(t, "lockfs lock -n -s while lockfs lock -s holds", lockRun(t, "-n", "-s", dir, "true"), 0)
		expectCode(t, "flock -n -x while lockfs lock -s holds (control)", flockN(t, m.path("a/.lock"), "-x"), 1)
		expectCode(t, "lockfs lock -n -x while lockfs lock -s holds (control)", lockRun(t, "-n", "-x", dir, "true"), 1)
		p.kill()
	})

	t.Run("exit status", func(t *testing.T) {
		expectCode(t, "COMMAND exits 42", lockRun(t, dir, "sh", "-c", "exit 42"), 42)
		expectCode(t, "COMMAND exits 0", lockRun(t, dir, "--", "true"), 0)
		expectCode(t, "COMMAND killed by SIGKILL", lockRun(t, dir, "sh", "-c", "kill -9 $$"), 128+9)
		expectCode(t, "-c", lockRun(t, "-c", "exit 5", dir), 5)
		expectCode(t, "COMMAND not found", lockRun(t, dir, "/no/such/command"), 127)
		expectCode(t, "no COMMAND", lockRun(t, dir), 64)
		expectCode(t, "-s and -x", lockRun(t, "-s", "-x", dir, "true"), 64)
		expectCode(t, "bad -w", lockRun(t, "-w", "soon", dir, "true"), 64)
		expectCode(t, "-u", lockRun(t, "-u", dir, "true"), 64)
		expectCode(t, "not a lockfs directory", lockRun(t, t.TempDir(), "true"), 66)
		r := lockRun(t, m.path("no/such/dir"), "true")
		expectCode(t, "no such TARGET", r, 66)
		if !strings.Contains(r.stderr, "no such file or directory") {
			t.Errorf("lockfs lock of a missing TARGET says %q, want \"no such file or directory\"", r.stderr)
		}
	})

	t.Run("signals forwarded to COMMAND", func(t *testing.T) {
		for sig, want := range map[syscall.Signal]string{syscall.SIGINT: "INT", syscall.SIGTERM: "TERM", syscall.SIGHUP: "HUP"} {
			// COMMAND says which signal reached it and exits 3; lockfs
			// lock passes the status on.
			p := start(t, lockfsBin, "lock", dir, "--", "sh", "-c",
				`trap 'echo INT; exit 3' INT; trap 'echo TERM; exit 3' TERM; trap 'echo HUP; exit 3' HUP; echo held; while :; do sleep 0.1; done`)
			p.waitLine("held", 30*time.Second)
			if err := syscall.Kill(p.pid(), sig); err != nil {
				t.Fatal(err)
			}
			if line, _ := p.nextLine(30 * time.Second); line != want {
				t.Errorf("COMMAND after %v to lockfs lock: %q, want %q", sig, line, want)
			}
			if code, ok := p.wait(30 * time.Second); !ok || code != 3 {
				t.Errorf("lockfs lock after COMMAND exited 3 on %v: exit %d (ended %v), want 3", sig, code, ok)
			}
		}
	})

	t.Run("a signal while waiting ends the wait", func(t *testing.T) {
		h := holder(t, m.path("a/.lock"))
		p := start(t, lockfsBin, "lock", "-v", dir, "--", "echo", "ran")
		if !testutil.Poll(30*time.Second, func() bool { return strings.Contains(p.stderr.String(), "waiting") }) {
			t.Fatalf("lockfs lock does not say it waits: %q", p.stderr.String())
		}
		syscall.Kill(p.pid(), syscall.SIGTERM)
		if code, ok := p.wait(30 * time.Second); !ok || code != 128+int(syscall.SIGTERM) {
			t.Errorf("lockfs lock after SIGTERM while waiting: exit %d (ended %v), want %d", code, ok, 128+int(syscall.SIGTERM))
		}
		if line, ok := p.nextLine(time.Second); ok {
			t.Errorf("COMMAND ran although the wait was ended: %q", line)
		}
		// Control: the holder still holds the lock; nothing was left behind.
		expectCode(t, "flock -n while the first holder holds", flockN(t, m.path("a/.lock")), 1)
		h.kill()
		freeEventually(t, "after the holder ended", m.path("a/.lock"))
	})

	t.Run("token and lock in the environment", func(t *testing.T) {
		var last uint64
		for i := 0; i < 3; i++ {
			r := lockRun(t, dir, "sh", "-c", `echo "$LOCKFS_TOKEN $LOCKFS_LOCK"`)
			f := strings.Fields(r.stdout)
			if r.code != 0 || len(f) != 2 {
				t.Fatalf("lockfs lock echo: %v", r)
			}
			tok, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil || tok <= last {
				t.Errorf("LOCKFS_TOKEN %q after %d: want a strictly greater token", f[0], last)
			}
			last = tok
			if f[1] != m.path("a/.lock") {
				t.Errorf("LOCKFS_LOCK = %q, want %q", f[1], m.path("a/.lock"))
			}
		}
		// The token is the one the mount shows for the holder.
		p, tok := underLock(t, dir)
		if st := readStatus(t, m.path("a/.lock")); !strings.Contains(st, fmt.Sprintf("token=%d", tok)) {
			t.Errorf("status does not show the holder's token %d:\n%s", tok, st)
		}
		p.kill()
	})
}

func TestLockSource(t *testing.T) {
	m := mount(t)
	src := m.srcPath()
	noMount := func(args ...string) []string { return append([]string{"--source", src}, args...) }

	t.Run("excludes the mount and direct flock", func(t *testing.T) {
		p, _ := underLock(t, noMount("a")...)
		expectCode(t, "mount flock -n a while --source holds a", flockN(t, m.path("a/.lock")), 1)
		expectCode(t, "direct flock -n SOURCE/a/..LOCK while --source holds a", flockN(t, m.srcPath("a/..LOCK")), 1)
		expectCode(t, "mount flock -n a/b while --source holds a (hierarchy)", flockN(t, m.path("a/b/.lock")), 1)
		expectCode(t, "mount flock -n b (control)", flockN(t, m.path("b/.lock")), 0)
		p.kill()
		freeEventually(t, "mount a after --source ended", m.path("a/.lock"))
		freeEventually(t, "mount a/b after --source ended", m.path("a/b/.lock"))
		freeEventually(t, "SOURCE/a/..LOCK after --source ended", m.srcPath("a/..LOCK"))
	})

	t.Run("excluded by the mount and direct flock", func(t *testing.T) {
		for _, tc := range []struct{ what, holds, want string }{
			{"mount holds a", m.path("a/.lock"), "a"},
			{"direct flock holds SOURCE/a/..LOCK", m.srcPath("a/..LOCK"), "a"},
			{"mount holds a/b (hierarchy: an exclusive lock on a waits for a/b)", m.path("a/b/.lock"), "a"},
			{"mount holds a (hierarchy: a/b waits for a)", m.path("a/.lock"), "a/b"},
		} {
			h := holder(t, tc.holds)
			expectCode(t, "lockfs lock -n --source "+tc.want+" while "+tc.what, lockRun(t, noMount("-n", tc.want, "true")...), 1)
			h.kill()
			freeEventually(t, tc.holds+" after its holder ended", tc.holds)
			expectCode(t, "lockfs lock -n --source "+tc.want+" after: "+tc.what+" (control)", lockRun(t, noMount("-n", tc.want, "true")...), 0)
		}
	})

	t.Run("shared, token, absolute DIR", func(t *testing.T) {
		p, tok1 := underLock(t, noMount("-s", m.srcPath("a"))...)
		expectCode(t, "mount flock -n -s a while --source -s holds a", flockN(t, m.path("a/.lock"), "-s"), 0)
		expectCode(t, "mount flock -n -x a while --source -s holds a (control)", flockN(t, m.path("a/.lock"), "-x"), 1)
		p.kill()
		r := lockRun(t, noMount("a", "sh", "-c", `echo "$LOCKFS_TOKEN $LOCKFS_LOCK"`)...)
		f := strings.Fields(r.stdout)
		if r.code != 0 || len(f) != 2 || f[1] != "a/.lock" {
			t.Fatalf("lockfs lock --source a echo: %v", r)
		}
		if tok2, _ := strconv.ParseUint(f[0], 10, 64); tok2 <= tok1 {
			t.Errorf("token %d after %d: want it to increase", tok2, tok1)
		}
		expectCode(t, "DIR outside SOURCE", lockRun(t, noMount(t.TempDir(), "true")...), 66)
	})
}

// gcsLockArgs are the flags of a no-mount lockfs lock on emulator emu's bucket.
func gcsLockArgs(endpoint, bucket string, ttl time.Duration, args ...string) []string {
	return append([]string{"--backend", "gcs", "--gcs-bucket", bucket, "--gcs-endpoint", endpoint,
		"--lease-ttl", ttl.String()}, args...)
}

func TestLockGCS(t *testing.T)  { lockNoMount(t, "gcs") }
func TestLockEtcd(t *testing.T) { lockNoMount(t, "etcd") }

// lockNoMount: lockfs lock with no mount, in a multi-host backend's
// namespace, and a mounted host exclude each other both ways.
func lockNoMount(t *testing.T, backend string) {
	ns := startNamespace(t, backend)
	a := mountIn(t, ns, gcsHost{id: "host-a"})
	gcs := func(args ...string) []string { return append(ns.lockArgs(gcsTTL), args...) }

	t.Run("excludes a mounted host", func(t *testing.T) {
		p, _ := underLock(t, gcs("a")...)
		expectCode(t, "host A flock -n a while lockfs lock holds a", flockN(t, a.path("a/.lock")), 1)
		expectCode(t, "host A flock -n a/b while lockfs lock holds a (hierarchy)", flockN(t, a.path("a/b/.lock")), 1)
		expectCode(t, "host A flock -n b (control)", flockN(t, a.path("b/.lock")), 0)
		p.kill()
		waitFree(t, "a", a)
	})

	t.Run("excluded by a mounted host", func(t *testing.T) {
		h := holder(t, a.path("a/.lock"))
		expectCode(t, "lockfs lock -n a while host A holds a", lockRun(t, gcs("-n", "a", "true")...), 1)
		expectCode(t, "lockfs lock -n a/b while host A holds a (hierarchy)", lockRun(t, gcs("-n", "a/b", "true")...), 1)
		expectCode(t, "lockfs lock -n b while host A holds a (control)", lockRun(t, gcs("-n", "b", "true")...), 0)
		// -v names the host whose claim blocks, from the lock's object.
		r := lockRun(t, gcs("-v", "-w", "2.5", "a", "true")...)
		expectCode(t, "lockfs lock -v -w 2.5 a while host A holds a", r, 1)
		if !strings.Contains(r.stderr, "claimed exclusive by host host-a") {
			t.Errorf("lockfs lock -v does not name host-a as the holder: %q", r.stderr)
		}
		h.kill()
		if !testutil.Poll(30*time.Second, func() bool { return lockRun(t, gcs("-n", "a", "true")...).code == 0 }) {
			t.Error("lockfs lock -n a never got the lock after host A's holder ended (control)")
		}
	})

	t.Run("kill -9 of lockfs lock is taken over after the TTL", func(t *testing.T) {
		// A long TTL, so that the check that nobody takes the lock over
		// early has time to run on a loaded machine.
		const ttl = 15 * time.Second
		p, _ := underLock(t, append(ns.lockArgs(ttl), "c")...)
		killed := time.Now()
		if err := syscall.Kill(p.pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// COMMAND is told (the parent-death signal) rather than left running.
		if line, _ := p.nextLine(15 * time.Second); line != "told" {
			t.Errorf("COMMAND after kill -9 of lockfs lock: got %q, want \"told\" (SIGTERM)", line)
		}
		if r := flockN(t, a.path("c/.lock")); r.code != 1 && time.Since(killed) < ttl {
			t.Errorf("host A got c right after lockfs lock was killed, before the TTL: %v", r)
		}
		if r := run(t, 120*time.Second, "flock", "-w", "100", a.path("c/.lock"), "true"); r.code != 0 {
			t.Errorf("host A did not take c over after the TTL: %v", r)
		} else if took := time.Since(killed); took < ttl {
			t.Errorf("host A took c over %v after the kill, before the TTL %v", took, ttl)
		}
	})

	t.Run("lease loss stops COMMAND, not its caller", func(t *testing.T) {
		// The caller is a script in a process group of its own; lockfs
		// lock runs in the script's group, COMMAND in its own.
		args := gcs("--kill-after", "5", "a/b", "--", "sh", "-c", holdCmd)
		script := `"$@" & echo "pid $!"; wait $!; echo "exit $?"; echo caller-alive`
		caller := start(t, "sh", append([]string{"-c", script, "caller", lockfsBin, "lock"}, args...)...)
		line, _ := caller.nextLine(30 * time.Second)
		pid, err := strconv.Atoi(strings.TrimPrefix(line, "pid "))
		if err != nil {
			t.Fatalf("caller said %q", line)
		}
		if line, _ := caller.nextLine(30 * time.Second); !strings.HasPrefix(line, "held ") {
			t.Fatalf("COMMAND said %q, want held; stderr %q", line, caller.stderr.String())
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// Host A takes the lock once the stopped process's lease expired.
		h := start(t, "flock", a.path("a/b/.lock"), "sh", "-c", "echo held; exec sleep 1000")
		h.waitLine("held", 90*time.Second)
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			line, ok := caller.nextLine(60 * time.Second)
			if !ok {
				break
			}
			got = append(got, line)
		}
		// stderr is complete once the caller is reaped (stdout's end
		// comes first).
		select {
		case <-caller.done:
		case <-time.After(30 * time.Second):
		}
		want := []string{"told", fmt.Sprintf("exit %d", 75), "caller-alive"}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("after the lease was lost: caller printed %q, want %q; stderr %q", got, want, caller.stderr.String())
		}
		if !strings.Contains(caller.stderr.String(), "lost") || !strings.Contains(caller.stderr.String(), "SIGTERM") {
			t.Errorf("lockfs lock did not say on stderr that the lock was lost: %q (caller printed %q)", caller.stderr.String(), got)
		}
		h.kill()
	})
}

// TestLockThroughMountWithoutToken: over a read-only SOURCE the daemon can
// lock but cannot write a token (docs/PROTOCOL.md §9). A lock through the
// mount then works, its holder reads token=0, and `lockfs lock`, which
// hands COMMAND a token, refuses with exit code 69 and leaves the lock
// free. Control: flock(1) through the same mount is granted.
func TestLockThroughMountWithoutToken(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	rw, ro := filepath.Join(base, "rw"), filepath.Join(base, "ro")
	for _, d := range []string{filepath.Join(rw, "a"), ro} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The backing files exist: the daemon cannot create them on a
	// read-only SOURCE, only open them read-only.
	for _, f := range []string{"..LOCK", "a/..LOCK"} {
		if err := os.WriteFile(filepath.Join(rw, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if r := run(t, 10*time.Second, "mount", "--bind", rw, ro); r.code != 0 {
		t.Fatalf("bind mount: %v", r)
	}
	t.Cleanup(func() { run(t, 10*time.Second, "umount", "-l", ro) })
	if r := run(t, 10*time.Second, "mount", "-o", "remount,bind,ro", ro); r.code != 0 {
		t.Fatalf("remount read-only: %v", r)
	}
	m := mount(t, withSource(ro))
	a := m.path("a/.lock")

	if r := run(t, 30*time.Second, "flock", a, "true"); r.code != 0 {
		t.Fatalf("control: flock(1) through the mount of a read-only SOURCE: %v", r)
	}
	if line := holderFirstLine(t, a); line != "you holder token=0" {
		t.Fatalf("status through the holding descriptor: %q, want \"you holder token=0\"", line)
	}
	r := lockRun(t, m.path("a"), "--", "sh", "-c", `echo "ran with $LOCKFS_TOKEN"`)
	if r.code != 69 || strings.Contains(r.stdout, "ran with") || !strings.Contains(r.stderr, "issued no fencing token") {
		t.Fatalf("lockfs lock without a token: %v, want exit 69, COMMAND not run, a message naming the token", r)
	}
	expectCode(t, "flock -n after the refused lockfs lock", flockN(t, a), 0)
	if !strings.Contains(m.logText(), "fencing token not issued") {
		t.Errorf("the daemon did not log why:\n%s", tail(m.logText(), 20))
	}
}
