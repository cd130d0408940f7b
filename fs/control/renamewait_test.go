package control_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/fs/control"
	"github.com/lockfs/lockfs/fs/internal/fstest"
	"github.com/lockfs/lockfs/internal/testutil"
)

// renameWaitPy is one process of the rename-during-a-wait workload. As
// "renamer" it loops: flock a/.lock exclusively, mv a/b a/b_tmp, mv
// a/b_tmp a/b, unlock, until the file STOP exists. As "lockf" or "flock"
// it makes N attempts to open a/b/.lock, take it shared that way and close
// it. Each prints one line at the end: "outcome=count ...", where an
// outcome is "ok", "open-ERRNO" or "lock-ERRNO".
const renameWaitPy = `
import errno, fcntl, os, sys
role, mnt, arg = sys.argv[1], sys.argv[2], sys.argv[3]
counts = {}
def count(k):
    counts[k] = counts.get(k, 0) + 1
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))
if role == 'renamer':
    while not os.path.exists(arg):
        fd = os.open(mnt + '/a/.lock', os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(mnt + '/a/b', mnt + '/a/b_tmp')
            os.rename(mnt + '/a/b_tmp', mnt + '/a/b')
            count('ok')
        except OSError as e:
            count('rename-' + name(e))
        finally:
            os.close(fd)
else:
    for i in range(int(arg)):
        try:
            fd = os.open(mnt + '/a/b/.lock', os.O_RDONLY)
        except OSError as e:
            count('open-' + name(e))
            continue
        try:
            if role == 'lockf':
                fcntl.lockf(fd, fcntl.LOCK_SH)
            else:
                fcntl.flock(fd, fcntl.LOCK_SH)
            count('ok')
        except OSError as e:
            count('lock-' + name(e))
        finally:
            os.close(fd)
print(' '.join('%s=%d' % kv for kv in sorted(counts.items())), flush=True)
`

// renameWaitCounts runs the workload of issue 27 on m: eight renamers and
// eight waiters (four lockf, four flock) of attempts attempts each, and
// returns the waiters' outcomes added up and the renamers'.
func renameWaitCounts(t *testing.T, m *ctlMount, attempts int) (waiters, renamers map[string]int) {
	t.Helper()
	m.Mkdir("a/b")
	stop := filepath.Join(t.TempDir(), "stop")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var mu sync.Mutex
	waiters, renamers = map[string]int{}, map[string]int{}
	run := func(role, arg string, into map[string]int) error {
		cmd := exec.CommandContext(ctx, fstest.Python(t), "-c", renameWaitPy, role, m.Dir, arg)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", role, err, out)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, f := range strings.Fields(string(out)) {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%s: bad output %q", role, out)
			}
			into[k] += n
		}
		return nil
	}
	var renamersWG, waitersWG sync.WaitGroup
	errs := make(chan error, 16)
	for range 8 {
		renamersWG.Go(func() { errs <- run("renamer", stop, renamers) })
	}
	for i := range 8 {
		role := "lockf"
		if i%2 == 1 {
			role = "flock"
		}
		waitersWG.Go(func() { errs <- run(role, strconv.Itoa(attempts), waiters) })
	}
	waitersWG.Wait()
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	renamersWG.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return waiters, renamers
}

// TestRenameDuringWaitNeverEIO: a waiter whose directory another process
// renames away and back while it waits (issue 27: eight processes loop
// `flock -x a/.lock; mv a/b a/b_tmp; mv a/b_tmp a/b`, eight others open
// a/b/.lock and take it shared) gets the lock of the directory it opened.
// Before, the request kept the path it was asked under and its claim
// opened a/b_tmp/..LOCK after the directory had moved back: EIO, 52–71
// per waiter out of about 280. The control runs the old path
// (followRenames off) and must see lock calls fail (EIO then; ENOENT
// now that an error of a directory gone maps to it).
func TestRenameDuringWaitNeverEIO(t *testing.T) {
	const attempts = 120
	t.Run("follow", func(t *testing.T) {
		m := newCtlMount(t)
		waiters, renamers := renameWaitCounts(t, m, attempts)
		t.Logf("waiters: %v; renamers: %v", waiters, renamers)
		for k, n := range waiters {
			if strings.HasPrefix(k, "lock-") {
				t.Errorf("%d lock calls failed with %s, want none: the directory was only moved away and back", n, strings.TrimPrefix(k, "lock-"))
			}
		}
		if waiters["ok"] == 0 || renamers["ok"] == 0 {
			t.Errorf("the workload did not run: waiters %v, renamers %v", waiters, renamers)
		}
	})
	t.Run("control", func(t *testing.T) {
		defer control.SetFollowRenames(false)()
		m := newCtlMount(t)
		waiters, renamers := renameWaitCounts(t, m, attempts)
		t.Logf("old path: waiters: %v; renamers: %v", waiters, renamers)
		failed := 0
		for k, n := range waiters {
			if strings.HasPrefix(k, "lock-") {
				failed += n
			}
		}
		if failed == 0 {
			t.Errorf("no lock call failed on the old path (waiters %v): the workload does not reproduce the bug", waiters)
		}
	})
}

// TestRenameDuringWaitFollowsDirectory: a waiter for a/b/.lock (blocked
// behind a/.lock held exclusively) whose directory is renamed to a/c, and
// replaced by a new a/b, gets the lock of the directory it opened, now
// a/c, and the new a/b stays free; a waiter whose directory is removed
// gets ENOENT. The control (followRenames off) took the new a/b's lock.
func TestRenameDuringWaitFollowsDirectory(t *testing.T) {
	waitBehindA := func(t *testing.T, m *ctlMount, dir string) (holder, waiter *fstest.Py) {
		t.Helper()
		holder = fstest.StartPy(t, 0, 0)
		holder.Must("ok", "open h %s", m.Path("a/.lock"))
		holder.Must("ok", "flock h ex")
		waiter = fstest.StartPy(t, 0, 0)
		waiter.Must("ok", "open w %s", m.Path(dir+"/.lock"))
		waiter.Send("flock w sh")
		testutil.Eventually(t, "the waiter to queue behind a/.lock", func() bool {
			return strings.Contains(m.Status("a/.lock"), "\nwaiters 1\n")
		})
		return holder, waiter
	}
	replaced := func(t *testing.T) (newHeld bool) {
		m := newCtlMount(t)
		m.Mkdir("a/b")
		holder, waiter := waitBehindA(t, m, "a/b")
		if err := os.Rename(m.Path("a/b"), m.Path("a/c")); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(m.Path("a/b"), 0o755); err != nil {
			t.Fatal(err)
		}
		holder.Must("ok", "close h")
		if r := waiter.Reply(testutil.DefaultWait); r != "ok" {
			t.Fatalf("waiter after a/.lock was released: %q", r)
		}
		newHeld = !fstest.FlockNB(t, "-x", m.Path("a/b/.lock"))
		if cFree := fstest.FlockNB(t, "-x", m.Path("a/c/.lock")); cFree != newHeld {
			t.Errorf("a/c/.lock free: %v, new a/b/.lock free: %v; want exactly one held", cFree, !newHeld)
		}
		return newHeld
	}
	t.Run("replaced", func(t *testing.T) {
		if replaced(t) {
			t.Error("the waiter of the directory moved to a/c holds the new a/b's lock")
		}
	})
	t.Run("replaced-control", func(t *testing.T) {
		defer control.SetFollowRenames(false)()
		if !replaced(t) {
			t.Error("the old path did not take the new a/b's lock: the test cannot tell")
		}
	})
	t.Run("removed", func(t *testing.T) {
		m := newCtlMount(t)
		m.Mkdir("a/d")
		holder, waiter := waitBehindA(t, m, "a/d")
		if err := os.Remove(m.Path("a/d")); err != nil {
			t.Fatal(err)
		}
		holder.Must("ok", "close h")
		if r := waiter.Reply(testutil.DefaultWait); r != "err ENOENT" {
			t.Errorf("waiter whose directory was removed: %q, want err ENOENT", r)
		}
		if _, err := os.Stat(m.Src + "/a/d"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("SOURCE/a/d after the waiter failed: %v", err)
		}
	})
}
