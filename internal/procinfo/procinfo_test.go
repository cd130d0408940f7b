package procinfo

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestDescribeFlock: a real flock(1) running a command is shown with its
// command line, and the command it runs; the control is sleep itself,
// which is no wrapper and shows no child.
func TestDescribeFlock(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		testutil.Missing(t, "flock(1) missing (apt-get install -y util-linux)")
	}
	lock := filepath.Join(t.TempDir(), "l")
	cmd := exec.Command("flock", "-x", lock, "sh", "-c", "exec sleep 1000 # a b")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// During execve the kernel names the process (comm) before the new
	// argv is in place, so for a moment /proc/PID/cmdline is empty and the
	// child reads as "[sleep]": wait for the whole line, not the name.
	var c Command
	if !testutil.Poll(10*time.Second, func() bool {
		c = Describe("", cmd.Process.Pid)
		return c.Runs != nil && c.Runs.Name == "sleep" && c.Runs.Line != ""
	}) {
		t.Fatalf("flock's child never showed as sleep with its command line: %+v", c)
	}
	if want := "flock -x " + lock + " sh -c 'exec sleep 1000 # a b'"; c.Line != want || c.Name != "flock" {
		t.Errorf("flock: %+v, want line %q", c, want)
	}
	if c.Runs.Line != "sleep 1000" {
		t.Errorf("child: %+v", c.Runs)
	}
	if s := Describe("", c.Runs.PID); s.Runs != nil {
		t.Errorf("sleep is no wrapper, yet shows a child: %+v", s)
	}
	if g := Describe("", 1<<30); g.Name != "" || g.Line != "" || g.String() != "" {
		t.Errorf("a pid that does not exist: %+v", g)
	}
}

// TestQuoteEscapes: a newline or escape sequence in an argument cannot
// break a status line.
func TestQuoteEscapes(t *testing.T) {
	got := render([]string{"sh", "-c", "echo 'x'\nPATH  KIND  ROLE\x1b[2J"})
	if strings.ContainsAny(got, "\n\x1b") {
		t.Fatalf("control characters kept: %q", got)
	}
	if want := `sh -c 'echo '\''x'\''\nPATH  KIND  ROLE\x1b[2J'`; got != want {
		t.Errorf("render = %s, want %s", got, want)
	}
	if len(render([]string{strings.Repeat("a", 2000)})) > maxCmdline+3 {
		t.Error("a huge argv is not cut")
	}
}

// TestExited: a running process is not exited; the same process as a
// zombie (killed, not yet reaped) is, and so is a pid that is gone.
func TestExited(t *testing.T) {
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if Exited("", pid) {
		t.Fatal("a running sleep counts as exited")
	}
	cmd.Process.Kill()
	if !testutil.Poll(10*time.Second, func() bool { return Exited("", pid) }) {
		t.Fatal("a killed, unreaped sleep does not count as exited")
	}
	cmd.Wait()
	if !Exited("", pid) {
		t.Fatal("a reaped pid does not count as exited")
	}
}

// TestCPUTime: a process that spins for a while has used CPU time by
// CPUTime's count, and a sleep just started nearly none; a pid that is
// not there is an error (the control).
func TestCPUTime(t *testing.T) {
	before, err := CPUTime("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for spin := 0; spin < 2e9 && x >= 0; spin++ {
		x += spin & 1
	}
	after, err := CPUTime("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 50*time.Millisecond {
		t.Errorf("after a busy loop (%d): %v of CPU, then %v; want at least 50 ms more", x, before, after)
	}

	sleeper := exec.Command("sleep", "10")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	if idle, err := CPUTime("", sleeper.Process.Pid); err != nil || idle > 50*time.Millisecond {
		t.Errorf("a sleep just started: %v of CPU, %v; want about 0", idle, err)
	}

	// A pid above pid_max names no process.
	if _, err := CPUTime("", 1<<23); err == nil {
		t.Error("CPUTime of a process that is not there: no error")
	}
}

// TestExitedWhenReapedMidRead: a process reaped between the open of its
// /proc/PID/stat and the read fails the read with ESRCH, and counts as
// exited, as a missing file does. Control: another read error (EACCES)
// says nothing about the process, which does not count as exited. (The
// race itself is too narrow to make on purpose; integration's TestLogs
// met it about once in 50 runs before.)
func TestExitedWhenReapedMidRead(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&os.PathError{Op: "read", Path: "/proc/1/stat", Err: syscall.ESRCH}, true},
		{&os.PathError{Op: "open", Path: "/proc/1/stat", Err: syscall.ENOENT}, true},
		{&os.PathError{Op: "read", Path: "/proc/1/stat", Err: syscall.EACCES}, false},
	} {
		if got := exitedStat(nil, tc.err); got != tc.want {
			t.Errorf("read error %v: exited %v, want %v", tc.err, got, tc.want)
		}
	}
}
