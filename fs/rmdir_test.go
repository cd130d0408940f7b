package fs

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"

	"github.com/lockfs/lockfs/fs/internal/fstest"
)

// rmdir (and rename over a directory) through the mount, where SOURCE
// holds the local backend's hidden backing files (rmdir.go).
//
// Regular files are made in SOURCE directly: newCtlMount has no poll probe
// (see fstest.PollProbe), so opening one through the mount with package os could
// deadlock the test process against its own server.

// backingFree reports whether nobody holds a flock on the file p of
// SOURCE. A lock taken through the mount ends with the Release of its open
// file description, which the kernel sends after the holder's close(2) or
// exit has returned, so tests wait for this before expecting a free lock.
func backingFree(p string) bool {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errors.Is(err, unix.ENOENT)
	}
	defer unix.Close(fd)
	return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil
}

// exists reports whether p exists (not following a symlink).
func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func TestRmdirRemovesBackingFiles(t *testing.T) {
	m := newCtlMount(t)
	if err := os.Mkdir(m.Path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	// All three kinds, released again: the usage lock needs the
	// directory lock, which the child takes under its parent's.
	if code, out := fstest.RunExit(t, 10*time.Second, "flock", m.Path("d/.lock"), "-c",
		"flock "+m.Path("d/.lock_usage")+" true && flock "+m.Path("d/.lock_newdir")+" true"); code != 0 {
		t.Fatalf("taking the locks: exit %d: %s", code, out)
	}
	for _, n := range []string{"..LOCK", "..LOCK_NEWDIR", "..LOCK_USAGE"} {
		p := m.Src + "/d/" + n
		if !exists(t, p) {
			t.Fatalf("SOURCE/d/%s was not made by the lock; the test proves nothing", n)
		}
		testutil.Eventually(t, n+" released", func() bool { return backingFree(p) })
	}
	if err := unix.Rmdir(m.Path("d")); err != nil {
		t.Fatalf("rmdir of a directory that only ever was locked: %v", err)
	}
	if exists(t, m.Src+"/d") {
		t.Error("SOURCE/d still exists after rmdir")
	}
	if exists(t, m.Path("d")) {
		t.Error("d is still seen through the mount after rmdir")
	}
}

func TestRmdirBusyWhileLockedThroughMount(t *testing.T) {
	m := newCtlMount(t)
	for _, c := range []struct{ file, mode string }{
		{".lock", "-x"},
		{".lock", "-s"},
		// A new-dir lock holds the directory lock shared too.
		{".lock_newdir", "-x"},
	} {
		if err := os.Mkdir(m.Path("d"), 0o755); err != nil {
			t.Fatal(err)
		}
		pid := fstest.FlockHold(t, m.Path("d/"+c.file), c.mode)
		if err := unix.Rmdir(m.Path("d")); !errors.Is(err, unix.EBUSY) {
			t.Errorf("rmdir while flock %s d/%s is held: %v, want EBUSY", c.mode, c.file, err)
		}
		if !exists(t, m.Src+"/d/..LOCK") {
			t.Errorf("flock %s d/%s: SOURCE/d/..LOCK was removed by a refused rmdir", c.mode, c.file)
		}
		if !exists(t, m.Path("d")) {
			t.Fatalf("flock %s d/%s: d is gone after a refused rmdir", c.mode, c.file)
		}
		syscall.Kill(-pid, syscall.SIGKILL)
		for _, n := range []string{"..LOCK", "..LOCK_NEWDIR"} {
			testutil.Eventually(t, n+" released", func() bool { return backingFree(m.Src + "/d/" + n) })
		}
		if err := unix.Rmdir(m.Path("d")); err != nil {
			t.Fatalf("flock %s d/%s: rmdir after the holder exited: %v", c.mode, c.file, err)
		}
		if exists(t, m.Src+"/d") {
			t.Fatalf("SOURCE/d still exists after rmdir")
		}
	}
}

func TestRmdirBusyWhileLockedOnSource(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("d")
	// A program of the protocol locking SOURCE directly.
	pid := fstest.FlockHold(t, m.Src+"/d/..LOCK", "-s")
	if err := unix.Rmdir(m.Path("d")); !errors.Is(err, unix.EBUSY) {
		t.Errorf("rmdir while SOURCE/d/..LOCK is flocked: %v, want EBUSY", err)
	}
	if !exists(t, m.Src+"/d/..LOCK") || !exists(t, m.Src+"/d") {
		t.Fatal("a refused rmdir removed SOURCE/d/..LOCK or SOURCE/d")
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	testutil.Eventually(t, "..LOCK released", func() bool { return backingFree(m.Src + "/d/..LOCK") })
	if err := unix.Rmdir(m.Path("d")); err != nil {
		t.Fatalf("rmdir after the holder exited: %v", err)
	}
}

func TestRmdirNotEmptyRemovesNothing(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("d", "e")
	for _, d := range []string{"d", "e"} {
		if code, out := fstest.RunExit(t, 10*time.Second, "flock", m.Path(d+"/.lock"), "true"); code != 0 {
			t.Fatalf("flock %s/.lock: exit %d: %s", d, code, out)
		}
		testutil.Eventually(t, d+"/..LOCK released", func() bool { return backingFree(m.Src + "/" + d + "/..LOCK") })
	}
	// d holds a real file; e holds something under a backing name that
	// is not a lock file.
	if err := os.WriteFile(m.Src+"/d/f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..LOCK", m.Src+"/e/..LOCK_USAGE"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"d", "e"} {
		if err := unix.Rmdir(m.Path(d)); !errors.Is(err, unix.ENOTEMPTY) {
			t.Errorf("rmdir %s: %v, want ENOTEMPTY", d, err)
		}
		if !exists(t, m.Src+"/"+d+"/..LOCK") {
			t.Errorf("rmdir %s failed but removed SOURCE/%s/..LOCK", d, d)
		}
	}
	if !exists(t, m.Src+"/d/f") || !exists(t, m.Src+"/e/..LOCK_USAGE") {
		t.Error("a failed rmdir removed an entry")
	}
}

func TestRenameOverLockedOnlyDirectory(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a", "b", "c")
	if err := os.WriteFile(m.Src+"/a/f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"b", "c"} {
		if code, out := fstest.RunExit(t, 10*time.Second, "flock", m.Path(d+"/.lock"), "true"); code != 0 {
			t.Fatalf("flock %s/.lock: exit %d: %s", d, code, out)
		}
		testutil.Eventually(t, d+"/..LOCK released", func() bool { return backingFree(m.Src + "/" + d + "/..LOCK") })
	}
	// b looks empty and is free: replaced. (os.Rename refuses any
	// directory target itself: rename(2) directly.)
	if err := unix.Rename(m.Path("a"), m.Path("b")); err != nil {
		t.Fatalf("rename over a directory that only ever was locked: %v", err)
	}
	if !exists(t, m.Src+"/b/f") || exists(t, m.Src+"/a") || exists(t, m.Src+"/b/..LOCK") {
		t.Error("after the rename, SOURCE/b is not what SOURCE/a was")
	}
	// c is locked: the rename is refused and changes nothing.
	fstest.FlockHold(t, m.Path("c/.lock"), "-s")
	if err := unix.Rename(m.Path("b"), m.Path("c")); !errors.Is(err, unix.EBUSY) {
		t.Errorf("rename over a locked directory: %v, want EBUSY", err)
	}
	if !exists(t, m.Src+"/b/f") || !exists(t, m.Src+"/c/..LOCK") {
		t.Error("a refused rename changed SOURCE")
	}
}
