package fs

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestRenameOfLockedDirectoryIsBusy: a directory with a lock held on it or
// below it is not renamed (EBUSY), whoever holds the lock: this daemon, a
// second daemon over the same SOURCE, or a program locking SOURCE
// directly. Before the fix, `mv r/a r/b; mkdir r/a` handed the holder of
// r/a/.lock the lock of r/b, and let the next user of r/a in beside it.
func TestRenameOfLockedDirectoryIsBusy(t *testing.T) {
	m := newCtlMount(t)
	m2 := newCtlMountAt(t, m.src, nil)
	m.mkdir("r/a/x", "r/c")

	busy := func(who string) {
		t.Helper()
		for _, mv := range [][2]string{{"r/a", "r/b"}, {"r", "q"}} {
			err := os.Rename(m.path(mv[0]), m.path(mv[1]))
			if !errors.Is(err, syscall.EBUSY) {
				t.Errorf("while %s: rename %s -> %s: %v, want EBUSY", who, mv[0], mv[1], err)
			}
		}
		if _, err := os.Stat(m.src + "/r/a/x"); err != nil {
			t.Errorf("while %s: r/a/x moved: %v", who, err)
		}
		if _, err := os.Stat(m.src + "/r/a/..LOCK"); err != nil {
			t.Errorf("while %s: r/a/..LOCK gone: %v", who, err)
		}
	}

	// Held through this mount, on the directory and below it.
	for _, lock := range []string{"r/a/.lock", "r/a/x/.lock", "r/a/.lock_newdir"} {
		h := flockHold(t, m.path(lock), "-x")
		busy("this daemon holds " + lock)
		killGroup(t, h, m.src+"/r/a/..LOCK")
	}
	// Held through a second daemon, and directly on SOURCE.
	h := flockHold(t, m2.path("r/a/x/.lock"), "-s")
	busy("a second daemon holds r/a/x/.lock")
	killGroup(t, h, m.src+"/r/a/..LOCK")
	// A direct client that follows the protocol holds the ancestors'
	// ..LOCK shared too.
	h = startLine(t, "locked", "flock", "-s", m.src+"/r/..LOCK",
		"flock", "-s", m.src+"/r/a/..LOCK", "-c", "echo locked; exec sleep 60").Process.Pid
	busy("a direct client holds SOURCE/r/..LOCK and SOURCE/r/a/..LOCK")
	killGroup(t, h, m.src+"/r/a/..LOCK")

	// Nobody holds anything: the rename works, and the locks are those
	// of the directories' current paths. r/a/.lock was looked up (and its
	// control file cached by the kernel) before the rename.
	if st := m.status("r/a/.lock"); !strings.Contains(st, "lock r/a/.lock\n") {
		t.Fatalf("status of r/a/.lock: %q", st)
	}
	testutil.Eventually(t, "the rename to succeed once every lock is released", func() bool {
		return os.Rename(m.path("r/a"), m.path("r/b")) == nil
	})
	if err := os.Mkdir(m.path("r/a"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A directory never locked is renamed without a trace in SOURCE (the
	// guard's own backing file goes again).
	m.mkdir("s/a")
	if err := os.Rename(m.path("s/a"), m.path("s/b")); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(m.src + "/s/b"); err != nil || len(ents) != 0 {
		t.Errorf("SOURCE/s/b after renaming a directory never locked: %v, %v", ents, err)
	}
	flockHold(t, m.path("r/a/.lock"), "-x")
	if st := m.status("r/b/.lock"); !strings.Contains(st, "lock r/b/.lock\n") || !strings.Contains(st, "mode none\n") {
		t.Errorf("r/b/.lock while only r/a/.lock is held:\n%s", st)
	}
	if st := m.status("r/a/.lock"); !strings.Contains(st, "lock r/a/.lock\n") || !strings.Contains(st, "mode exclusive\n") {
		t.Errorf("r/a/.lock while held:\n%s", st)
	}
	// The new r/a is held for the second daemon and for a direct client;
	// r/b is free for both.
	if flockNB(t, "-x", m2.path("r/a/.lock")) {
		t.Error("a second daemon took r/a/.lock while it is held")
	}
	if flockNB(t, "-x", m.src+"/r/a/..LOCK") {
		t.Error("a direct client took SOURCE/r/a/..LOCK while r/a/.lock is held")
	}
	if !flockNB(t, "-x", m2.path("r/b/.lock")) || !flockNB(t, "-x", m.path("r/b/.lock")) {
		t.Error("r/b/.lock is not free while only r/a/.lock is held")
	}
	// Renaming a file of a locked directory, or a directory into it, is
	// not refused.
	if err := os.WriteFile(m.src+"/r/a/f", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.path("r/a/f"), m.path("r/a/g")); err != nil {
		t.Errorf("rename of a file in a locked directory: %v", err)
	}
	if err := os.Rename(m.path("r/c"), m.path("r/a/c")); err != nil {
		t.Errorf("rename of a free directory into a locked one: %v", err)
	}
	// The protocol's way to rename: under the parent's exclusive lock.
	m.mkdir("s/e")
	if code, out := runExit(t, 10*time.Second, "flock", "-x", m.path("s/.lock"), "mv", m.path("s/e"), m.path("s/f")); code != 0 {
		t.Errorf("mv under the parent's exclusive lock: exit %d: %s", code, out)
	}
}

// killGroup kills the process group of pid (a startLine command) and waits
// until the backing file free is free (every lock at or below a directory
// holds its ..LOCK), so that the next check cannot pass on its leftover.
func killGroup(t *testing.T, pid int, free string) {
	t.Helper()
	syscall.Kill(-pid, syscall.SIGKILL)
	testutil.Eventually(t, free+" to be free", func() bool { return flockNB(t, "-x", free) })
}
