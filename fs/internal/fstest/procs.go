package fstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// FlockHold starts `flock ARGS F -c 'echo locked; exec sleep 60'` and
// waits until it holds the lock.
func FlockHold(t *testing.T, f string, args ...string) int {
	t.Helper()
	a := append(append([]string{}, args...), f, "-c", "echo locked; exec sleep 60")
	return StartLine(t, "locked", "flock", a...).Process.Pid
}

// FlockNB tries the lock without waiting and reports whether it got it.
func FlockNB(t *testing.T, mode, f string) bool {
	t.Helper()
	code, out := RunExit(t, 10*time.Second, "flock", "-n", mode, f, "true")
	switch code {
	case 0:
		return true
	case 1:
		return false
	}
	t.Fatalf("flock -n %s %s: exit %d: %s", mode, f, code, out)
	return false
}

// RunExit runs a command to completion (killing it after timeout) and
// returns its exit status (-1 if killed) and combined output.
func RunExit(t *testing.T, timeout time.Duration, name string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case ctx.Err() != nil:
		return -1, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("%s %v: %v", name, args, err)
	return 0, ""
}

// StartLine starts a command in a session of its own and waits until it
// prints the line want on stdout. The group is SIGKILLed in t.Cleanup.
func StartLine(t *testing.T, want string, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	testutil.StartChild(t, cmd).WaitLine(want, 10*time.Second)
	return cmd
}

// pyScript serves one command per stdin line and answers one line each:
// "ok", "err ERRNO", or the command's result.
const pyScript = `
import os, sys, fcntl, struct, json, errno
fds = {}
FL = {'ex': fcntl.LOCK_EX, 'sh': fcntl.LOCK_SH, 'un': fcntl.LOCK_UN}
TY = {'ex': fcntl.F_WRLCK, 'sh': fcntl.F_RDLCK, 'un': fcntl.F_UNLCK}
TYN = {v: k for k, v in TY.items()}
F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW = 36, 37, 38
def flk(typ):
    return struct.pack('hhqqi4x', typ, 0, 0, 0, 0)
print('ready %d' % os.getpid(), flush=True)
for line in sys.stdin:
    a = line.split()
    nb = 'nb' in a[3:]
    try:
        op = a[0]
        r = 'ok'
        if op == 'open':
            fds[a[1]] = os.open(a[2], os.O_RDWR | os.O_CREAT)
        elif op == 'opena':
            fds[a[1]] = os.open(a[2], os.O_WRONLY | os.O_APPEND)
        elif op == 'flock':
            fcntl.flock(fds[a[1]], FL[a[2]] | (fcntl.LOCK_NB if nb else 0))
        elif op == 'lockf':
            fcntl.lockf(fds[a[1]], FL[a[2]] | (fcntl.LOCK_NB if nb else 0))
        elif op == 'ofd':
            fcntl.fcntl(fds[a[1]], F_OFD_SETLK if nb else F_OFD_SETLKW, flk(TY[a[2]]))
        elif op in ('getlk', 'ofdgetlk'):
            res = fcntl.fcntl(fds[a[1]], fcntl.F_GETLK if op == 'getlk' else F_OFD_GETLK, flk(TY[a[2]]))
            t, _, s, l, pid = struct.unpack('hhqqi4x', res)
            r = 'lk %s %d' % (TYN[t], pid)
        elif op == 'write':
            n = os.write(fds[a[1]], json.loads(' '.join(a[2:])).encode())
            r = 'wrote %d' % n
        elif op == 'pwrite':
            n = os.pwrite(fds[a[1]], json.loads(' '.join(a[3:])).encode(), int(a[2]))
            r = 'wrote %d' % n
        elif op == 'read':
            r = 'read ' + json.dumps(os.pread(fds[a[1]], 65536, 0).decode())
        elif op == 'close':
            os.close(fds.pop(a[1]))
        elif op == 'exit':
            sys.exit(0)
        else:
            r = 'bad command'
    except OSError as e:
        r = 'err ' + ('EDEADLK' if e.errno == errno.EDEADLK else errno.errorcode.get(e.errno, str(e.errno)))
    print(r, flush=True)
`

// Py is a running pyScript.
type Py struct {
	t     *testing.T
	child *testutil.Child
	// PID is the helper's process id.
	PID int
	in  io.WriteCloser
	// Lines are its answers, one per line; closed when it is gone.
	Lines <-chan string
}

// Python returns the system Python, which every user can run.
func Python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	testutil.RequireTools(t, "python3")
	p, _ := exec.LookPath("python3")
	return p
}

// StartPy starts the helper, as root (uid 0) or as another uid and gid.
func StartPy(t *testing.T, uid, gid uint32) *Py {
	t.Helper()
	cmd := exec.Command(Python(t), "-c", pyScript)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if uid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	}
	c := testutil.StartChild(t, cmd)
	p := &Py{t: t, child: c, in: c.Stdin, Lines: c.Lines}
	ready := p.Reply(10 * time.Second)
	if _, err := fmt.Sscanf(ready, "ready %d", &p.PID); err != nil {
		t.Fatalf("python helper: %q", ready)
	}
	return p
}

// Send sends a command without waiting for its answer.
func (p *Py) Send(format string, args ...any) {
	p.t.Helper()
	if _, err := fmt.Fprintf(p.in, format+"\n", args...); err != nil {
		p.t.Fatalf("python helper: %v", err)
	}
}

// Reply waits for the next answer; "" if none came within timeout.
func (p *Py) Reply(timeout time.Duration) string {
	select {
	case l := <-p.Lines: // an answer already there wins over timeout 0
		return l
	default:
	}
	select {
	case l := <-p.Lines:
		return l
	case <-time.After(timeout):
		return ""
	}
}

// Do sends a command and returns its answer.
func (p *Py) Do(format string, args ...any) string {
	p.t.Helper()
	p.Send(format, args...)
	r := p.Reply(10 * time.Second)
	if r == "" {
		p.t.Fatalf("python helper: no answer to %q", fmt.Sprintf(format, args...))
	}
	return r
}

// Must runs a command that must answer want.
func (p *Py) Must(want, format string, args ...any) {
	p.t.Helper()
	if got := p.Do(format, args...); got != want {
		p.t.Fatalf("%s: got %q, want %q", fmt.Sprintf(format, args...), got, want)
	}
}

// Kill SIGKILLs the helper and waits for it to be gone.
func (p *Py) Kill() { p.child.Kill() }
