package localbackend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// The test binary doubles as a helper process (re-exec'd with
// LOCALBACKEND_HELPER set), because flock locks belong to processes and
// open file descriptions, not goroutines.
func TestMain(m *testing.M) {
	if mode := os.Getenv("LOCALBACKEND_HELPER"); mode != "" {
		os.Exit(helperMain(mode, os.Args[len(os.Args)-2:]))
	}
	os.Exit(m.Run())
}

// helperMain runs one helper role; args are SOURCE and a role argument.
//
//	tokens SOURCE N   claim "." shared, print N tokens, one per line
//	hold SOURCE PATH  claim PATH exclusive, print "locked", sleep
//	wait SOURCE PATH  claim PATH exclusive with wait, print "granted", sleep
func helperMain(mode string, args []string) int {
	b, err := New(Config{Source: args[0]})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer b.Close()
	ctx := context.Background()
	switch mode {
	case "tokens":
		n, _ := strconv.Atoi(args[1])
		l, err := b.Claim(ctx, lockmgr.LockID{Path: ".", Kind: lockmgr.KindDir}, lockmgr.Shared, true)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		w := bufio.NewWriter(os.Stdout)
		for range n {
			tok, err := l.NextToken(ctx)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			fmt.Fprintln(w, tok)
		}
		w.Flush()
		return 0
	case "hold", "wait":
		_, err := b.Claim(ctx, lockmgr.LockID{Path: args[1], Kind: lockmgr.KindDir}, lockmgr.Exclusive, mode == "wait")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Println("locked")
		time.Sleep(time.Hour)
	}
	return 2
}

// startHelper re-execs the test binary in a helper role.
func startHelper(t *testing.T, mode string, args ...string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), "LOCALBACKEND_HELPER="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, bufio.NewReader(out)
}

// dirID and friends build lock IDs.
func dirID(p string) lockmgr.LockID { return lockmgr.LockID{Path: p, Kind: lockmgr.KindDir} }

// newSource returns a fresh SOURCE directory with subdirectories dirs.
func newSource(t *testing.T, dirs ...string) string {
	t.Helper()
	src := t.TempDir()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

// newBackend returns a backend over src, closed when the test ends.
func newBackend(t testing.TB, src string) *Backend {
	t.Helper()
	b, err := New(Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// mustClaim claims id and fails the test on error.
func mustClaim(t *testing.T, b *Backend, id lockmgr.LockID, mode lockmgr.Mode) lockmgr.Lease {
	t.Helper()
	l, err := b.Claim(context.Background(), id, mode, false)
	if err != nil {
		t.Fatalf("claim %s %s: %v", mode, id, err)
	}
	return l
}

// externalTry runs "flock -n <args> FILE true" and reports whether it got
// the lock (exit 0) or found it busy (exit 1).
func externalTry(t *testing.T, file string, args ...string) bool {
	t.Helper()
	cmd := exec.Command("flock", append(append([]string{"-n"}, args...), file, "true")...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &ee) && ee.ExitCode() == 1:
		return false
	}
	t.Fatalf("flock -n %v %s: %v: %s", args, file, err, out)
	return false
}

// holder is a flock(1) process holding a lock on a file until told to
// stop, talked to in lines (testutil.Child).
type holder struct {
	t *testing.T
	c *testutil.Child
}

// holdExternal runs "flock -o <args> FILE sh ..." in its own session
// and returns once it holds the lock. With -o only flock(1) itself holds the
// lock, so it is free as soon as flock(1) is reaped. When released, the shell writes "released"
// to mark (if not empty) while still holding the lock, then exits.
func holdExternal(t *testing.T, file, mark string, args ...string) *holder {
	t.Helper()
	h := startHolder(t, file, mark, args...)
	if line := h.line(); line != "locked" {
		t.Fatalf("flock %v %s did not take the lock: %q (exit %v)", args, file, line, h.c.Err)
	}
	return h
}

// startHolder starts the holder without waiting for it to hold the lock.
func startHolder(t *testing.T, file, mark string, args ...string) *holder {
	t.Helper()
	script := `echo locked; cat >/dev/null; if [ -n "$MARK" ]; then echo released >"$MARK"; fi`
	cmd := exec.Command("flock", append(append([]string{"-o"}, args...), file, "sh", "-c", script)...)
	cmd.Env = append(os.Environ(), "MARK="+mark)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return &holder{t: t, c: testutil.StartChild(t, cmd)}
}

// line waits for the holder's next line of stdout; "" once stdout ended.
func (h *holder) line() string { return <-h.c.Lines }

// stop closes the holder's stdin: it releases the lock and exits.
func (h *holder) stop() { h.c.Stdin.Close() }

// wait waits until the holder is reaped.
func (h *holder) wait() { <-h.c.Done }

// release lets the holder finish and waits for it: the lock is free after.
func (h *holder) release() {
	h.t.Helper()
	h.stop()
	h.wait()
	if h.c.Err != nil {
		h.t.Fatalf("holder: %v", h.c.Err)
	}
}

// kill sends SIGKILL to the holder's whole session and reaps it.
func (h *holder) kill() { h.c.Kill() }

// childrenOf returns the command lines of the live processes whose parent is
// pid, as reported by /proc.
func childrenOf(pid int) map[int][]string {
	out := map[int][]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cpid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cpid))
		if err != nil {
			continue
		}
		// Fields after the parenthesised comm: state ppid ...
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid != pid {
			continue
		}
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cpid))
		out[cpid] = strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	}
	return out
}

// flockChildren returns the pids of the "flock -x 3"/"flock -s 3" children
// of pid: the processes a backend waits through.
func flockChildren(pid int) []int {
	var pids []int
	for cpid, argv := range childrenOf(pid) {
		if len(argv) == 3 && filepath.Base(argv[0]) == "flock" && argv[2] == "3" {
			pids = append(pids, cpid)
		}
	}
	return pids
}
