package fs

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"

	"github.com/lockfs/lockfs/fs/internal/fstest"
)

// TestRenameOfLockedDirectoryIsBusy: a directory with a lock held on it or
// below it is not renamed (EBUSY), whoever holds the lock: this daemon, a
// second daemon over the same SOURCE, or a program locking SOURCE
// directly. Before the fix, `mv r/a r/b; mkdir r/a` handed the holder of
// r/a/.lock the lock of r/b, and let the next user of r/a in beside it.
func TestRenameOfLockedDirectoryIsBusy(t *testing.T) {
	m := newCtlMount(t)
	m2 := newCtlMountAt(t, m.Src, nil)
	m.Mkdir("r/a/x", "r/c")

	busy := func(who string) {
		t.Helper()
		for _, mv := range [][2]string{{"r/a", "r/b"}, {"r", "q"}} {
			err := os.Rename(m.Path(mv[0]), m.Path(mv[1]))
			if !errors.Is(err, syscall.EBUSY) {
				t.Errorf("while %s: rename %s -> %s: %v, want EBUSY", who, mv[0], mv[1], err)
			}
		}
		if _, err := os.Stat(m.Src + "/r/a/x"); err != nil {
			t.Errorf("while %s: r/a/x moved: %v", who, err)
		}
		if _, err := os.Stat(m.Src + "/r/a/..LOCK"); err != nil {
			t.Errorf("while %s: r/a/..LOCK gone: %v", who, err)
		}
	}

	// Held through this mount, on the directory and below it.
	for _, lock := range []string{"r/a/.lock", "r/a/x/.lock", "r/a/.lock_newdir"} {
		h := fstest.FlockHold(t, m.Path(lock), "-x")
		busy("this daemon holds " + lock)
		killGroup(t, h, m.Src+"/r/a/..LOCK")
	}
	// Held through a second daemon, and directly on SOURCE.
	h := fstest.FlockHold(t, m2.Path("r/a/x/.lock"), "-s")
	busy("a second daemon holds r/a/x/.lock")
	killGroup(t, h, m.Src+"/r/a/..LOCK")
	// A direct client that follows the protocol holds the ancestors'
	// ..LOCK shared too.
	h = fstest.StartLine(t, "locked", "flock", "-s", m.Src+"/r/..LOCK",
		"flock", "-s", m.Src+"/r/a/..LOCK", "-c", "echo locked; exec sleep 60").Process.Pid
	busy("a direct client holds SOURCE/r/..LOCK and SOURCE/r/a/..LOCK")
	killGroup(t, h, m.Src+"/r/a/..LOCK")

	// Nobody holds anything: the rename works, and the locks are those
	// of the directories' current paths. r/a/.lock was looked up (and its
	// control file cached by the kernel) before the rename.
	if st := m.Status("r/a/.lock"); !strings.Contains(st, "lock r/a/.lock\n") {
		t.Fatalf("status of r/a/.lock: %q", st)
	}
	testutil.Eventually(t, "the rename to succeed once every lock is released", func() bool {
		return os.Rename(m.Path("r/a"), m.Path("r/b")) == nil
	})
	if err := os.Mkdir(m.Path("r/a"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A directory never locked is renamed without a trace in SOURCE (the
	// guard's own backing file goes again).
	m.Mkdir("s/a")
	if err := os.Rename(m.Path("s/a"), m.Path("s/b")); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(m.Src + "/s/b"); err != nil || len(ents) != 0 {
		t.Errorf("SOURCE/s/b after renaming a directory never locked: %v, %v", ents, err)
	}
	fstest.FlockHold(t, m.Path("r/a/.lock"), "-x")
	if st := m.Status("r/b/.lock"); !strings.Contains(st, "lock r/b/.lock\n") || !strings.Contains(st, "mode none\n") {
		t.Errorf("r/b/.lock while only r/a/.lock is held:\n%s", st)
	}
	if st := m.Status("r/a/.lock"); !strings.Contains(st, "lock r/a/.lock\n") || !strings.Contains(st, "mode exclusive\n") {
		t.Errorf("r/a/.lock while held:\n%s", st)
	}
	// The new r/a is held for the second daemon and for a direct client;
	// r/b is free for both.
	if fstest.FlockNB(t, "-x", m2.Path("r/a/.lock")) {
		t.Error("a second daemon took r/a/.lock while it is held")
	}
	if fstest.FlockNB(t, "-x", m.Src+"/r/a/..LOCK") {
		t.Error("a direct client took SOURCE/r/a/..LOCK while r/a/.lock is held")
	}
	if !fstest.FlockNB(t, "-x", m2.Path("r/b/.lock")) {
		t.Error("r/b/.lock is not free for a second daemon while only r/a/.lock is held")
	}
	// The second daemon lets go of that flock's backing file when the
	// kernel's FUSE_RELEASE reaches it, which may come after flock(1) has
	// exited (the kernel sends it without waiting): until then this
	// daemon's claim is refused as it would be for any other holder.
	testutil.Eventually(t, "r/b/.lock to be free through this mount while only r/a/.lock is held", func() bool {
		return fstest.FlockNB(t, "-x", m.Path("r/b/.lock"))
	})
	// Renaming a file of a locked directory, or a directory into it, is
	// not refused.
	if err := os.WriteFile(m.Src+"/r/a/f", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.Path("r/a/f"), m.Path("r/a/g")); err != nil {
		t.Errorf("rename of a file in a locked directory: %v", err)
	}
	if err := os.Rename(m.Path("r/c"), m.Path("r/a/c")); err != nil {
		t.Errorf("rename of a free directory into a locked one: %v", err)
	}
	// The protocol's way to rename: under the parent's exclusive lock.
	m.Mkdir("s/e")
	if code, out := fstest.RunExit(t, 10*time.Second, "flock", "-x", m.Path("s/.lock"), "mv", m.Path("s/e"), m.Path("s/f")); code != 0 {
		t.Errorf("mv under the parent's exclusive lock: exit %d: %s", code, out)
	}
}

// killGroup kills the process group of pid (a startLine command) and waits
// until the backing file free is free (every lock at or below a directory
// holds its ..LOCK), so that the next check cannot pass on its leftover.
func killGroup(t *testing.T, pid int, free string) {
	t.Helper()
	syscall.Kill(-pid, syscall.SIGKILL)
	testutil.Eventually(t, free+" to be free", func() bool { return fstest.FlockNB(t, "-x", free) })
}

// TestRenameat2Flags: renameat2(2) with RENAME_NOREPLACE and
// RENAME_EXCHANGE does through the mount what it does on SOURCE, and the
// names the kernel and the daemon know follow (reads, a later rename and
// an unlink by the new names reach the right files in SOURCE). An
// exchange of a directory with a lock held inside it is EBUSY, as a
// rename is; RENAME_WHITEOUT and both flags together are EINVAL. Before
// the fork decoded FUSE_RENAME2 every flag was EINVAL, which fails each
// of the successful cases here.
func TestRenameat2Flags(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("d/sub", "e")
	write := func(rel, s string) {
		t.Helper()
		if err := os.WriteFile(m.Path(rel), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	}
	rename2 := func(from, to string, flags uint) error {
		return unix.Renameat2(unix.AT_FDCWD, m.Path(from), unix.AT_FDCWD, m.Path(to), flags)
	}
	write("a", "A")
	write("b", "B")
	write("e/c", "C")

	// NOREPLACE onto an existing name: EEXIST, nothing moves.
	if err := rename2("a", "b", unix.RENAME_NOREPLACE); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("RENAME_NOREPLACE onto an existing name: %v, want EEXIST", err)
	}
	if read(m.Path("a")) != "A" || read(m.Path("b")) != "B" {
		t.Errorf("after a refused RENAME_NOREPLACE: a %q, b %q", read(m.Path("a")), read(m.Path("b")))
	}
	// NOREPLACE onto a free name: a rename.
	if err := rename2("a", "e/a2", unix.RENAME_NOREPLACE); err != nil {
		t.Fatalf("RENAME_NOREPLACE onto a free name: %v", err)
	}
	if got := read(m.Src + "/e/a2"); got != "A" {
		t.Errorf("SOURCE/e/a2 after RENAME_NOREPLACE: %q", got)
	}
	if _, err := os.Lstat(m.Path("a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a after it was renamed away: %v", err)
	}

	// EXCHANGE of two files in two directories.
	if err := rename2("e/a2", "b", unix.RENAME_EXCHANGE); err != nil {
		t.Fatalf("RENAME_EXCHANGE: %v", err)
	}
	for rel, want := range map[string]string{"b": "A", "e/a2": "B"} {
		if got := read(m.Path(rel)); got != want {
			t.Errorf("through the mount, %s after the exchange: %q, want %q", rel, got, want)
		}
		if got := read(m.Src + "/" + rel); got != want {
			t.Errorf("in SOURCE, %s after the exchange: %q, want %q", rel, got, want)
		}
	}
	// The daemon's names followed: a rename and an unlink by the new
	// names reach the files that now have them.
	if err := os.Rename(m.Path("b"), m.Path("e/b3")); err != nil {
		t.Fatal(err)
	}
	if got := read(m.Src + "/e/b3"); got != "A" {
		t.Errorf("SOURCE/e/b3 (renamed from b after the exchange): %q, want A", got)
	}
	if err := os.Remove(m.Path("e/a2")); err != nil {
		t.Fatal(err)
	}
	if got := read(m.Src + "/e/b3"); got != "A" {
		t.Errorf("SOURCE/e/b3 after removing e/a2: %q, want A", got)
	}

	// EXCHANGE of a file and a directory, and back.
	if err := rename2("e/c", "d", unix.RENAME_EXCHANGE); err != nil {
		t.Fatalf("RENAME_EXCHANGE of a file and a directory: %v", err)
	}
	if st, err := os.Stat(m.Path("e/c/sub")); err != nil || !st.IsDir() {
		t.Errorf("e/c/sub after exchanging e/c and d: %v", err)
	}
	if got := read(m.Path("d")); got != "C" {
		t.Errorf("d after exchanging e/c and d: %q, want C", got)
	}
	if err := rename2("e/c", "d", unix.RENAME_EXCHANGE); err != nil {
		t.Fatalf("RENAME_EXCHANGE back: %v", err)
	}

	// EXCHANGE with a missing name: ENOENT.
	if err := rename2("e/c", "nothing", unix.RENAME_EXCHANGE); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("RENAME_EXCHANGE with a missing name: %v, want ENOENT", err)
	}
	// Flags the mount does not take.
	if err := rename2("e/c", "x", unix.RENAME_WHITEOUT); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("RENAME_WHITEOUT: %v, want EINVAL", err)
	}
	if err := rename2("e/c", "x", unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("RENAME_NOREPLACE|RENAME_EXCHANGE: %v, want EINVAL", err)
	}

	// A directory with a lock held inside it is not exchanged, on either
	// side of the exchange.
	h := fstest.FlockHold(t, m.Path("d/sub/.lock"), "-x")
	for _, p := range [][2]string{{"d", "e"}, {"e", "d"}} {
		if err := rename2(p[0], p[1], unix.RENAME_EXCHANGE); !errors.Is(err, syscall.EBUSY) {
			t.Errorf("RENAME_EXCHANGE %s, %s while d/sub/.lock is held: %v, want EBUSY", p[0], p[1], err)
		}
	}
	if _, err := os.Stat(m.Src + "/d/sub"); err != nil {
		t.Errorf("d/sub moved while its lock is held: %v", err)
	}
	killGroup(t, h, m.Src+"/d/sub/..LOCK")
	testutil.Eventually(t, "the exchange to succeed once the lock is released", func() bool {
		return rename2("d", "e", unix.RENAME_EXCHANGE) == nil
	})
	if _, err := os.Stat(m.Src + "/e/sub"); err != nil {
		t.Errorf("SOURCE/e/sub after exchanging d and e: %v", err)
	}
}
