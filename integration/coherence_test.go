package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// Data coherence across mounts of one SOURCE and SOURCE itself (SPEC §1
// "Data is coherent", docs/DATA-PATH.md). Each test runs in every data
// mode the daemon has; its control is the same run with the kernel's cache
// kept regardless (LOCKFS_TEST_KEEP_CACHE=1), which must lose data: that
// proves the test can fail.

// dataMode is one way the daemon serves file data.
type dataMode struct {
	name string
	args []string // flags of lockfs mount
}

// dataModes are the modes every coherence test runs in. Without FUSE
// passthrough the kernel's page cache is revalidated at open and lock
// grants; with it (the default as root, docs/DATA-PATH.md) the mount uses
// SOURCE's own page cache.
var dataModes = []dataMode{
	{name: "cached", args: []string{"--passthrough=off"}},
	{name: "passthrough", args: nil},
}

// controlArgs are the daemon flags of every control: the kernel's cache
// can only be kept (keepCacheEnv) without passthrough.
var controlArgs = []string{"--passthrough=off"}

// keepCacheEnv makes a daemon keep the kernel's cache whatever happens in
// SOURCE: the control of every coherence test.
const keepCacheEnv = "LOCKFS_TEST_KEEP_CACHE=1"

// twoMounts mounts one fresh SOURCE twice, with extra daemon flags and
// environment.
func twoMounts(t *testing.T, args []string, env ...string) (*Mount, *Mount) {
	t.Helper()
	a := mount(t, withArgs(args...), withEnv(env...))
	b := mount(t, withSource(a.Src), withArgs(args...), withEnv(env...))
	return a, b
}

// sqliteRun is what a run of three SQLite writers left behind.
type sqliteRun struct {
	failures  []string // writers that did not commit every row
	integrity string   // PRAGMA integrity_check
	rows      int      // rows in the table
	perWriter string   // rows per writer, "w|n" lines
}

// lost reports whether the run lost or corrupted anything.
func (r sqliteRun) lost(want int) bool {
	return len(r.failures) > 0 || r.integrity != "ok" || r.rows != want
}

// runSQLiteWriters runs one writer on each of a, b and SOURCE directly,
// each committing rows rows on its own open connection, in journal mode
// mode, and reads what the database holds afterwards.
func runSQLiteWriters(t *testing.T, a, b *Mount, mode string, rows int) sqliteRun {
	t.Helper()
	require(t, "sqlite3", "python3")
	db := a.srcPath("c", "test.db")
	if r := run(t, 30*time.Second, "sqlite3", db, "PRAGMA journal_mode="+mode+"; CREATE TABLE t(w INTEGER, i INTEGER);"); r.code != 0 {
		t.Fatalf("create: %v", r)
	}
	script, err := filepath.Abs("testdata/sqlite_writer.py")
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{a.path("c", "test.db"), b.path("c", "test.db"), db}
	var ps []*proc
	for w, p := range paths {
		ps = append(ps, start(t, "python3", script, p, fmt.Sprint(w), fmt.Sprint(rows), mode))
	}
	var res sqliteRun
	for w, p := range ps {
		line, _ := p.nextLine(5 * time.Minute)
		code, ok := p.wait(time.Minute)
		if want := fmt.Sprintf("committed %d", rows); line != want || !ok || code != 0 {
			res.failures = append(res.failures, fmt.Sprintf("writer %d on %s: %q, exit %d (exited: %v), stderr %q", w, paths[w], line, code, ok, p.stderr.String()))
		}
	}
	r := run(t, 30*time.Second, "sqlite3", db, "PRAGMA integrity_check;")
	res.integrity = strings.TrimSpace(r.stdout + r.stderr)
	r = run(t, 30*time.Second, "sqlite3", db, "SELECT count(DISTINCT w*100000+i) FROM t;")
	fmt.Sscan(r.stdout, &res.rows)
	r = run(t, 30*time.Second, "sqlite3", db, "SELECT w, count(*) FROM t GROUP BY w;")
	res.perWriter = strings.ReplaceAll(strings.TrimSpace(r.stdout), "\n", " ")
	return res
}

// TestSQLiteWritersOnTwoMountsAndSource: SQLite in WAL and in rollback
// journal mode, one writer on each of two mounts of one SOURCE and one on
// SOURCE directly, loses no committed row and corrupts nothing. Measured
// before the fix (page cache never revalidated while a file stays open):
// WAL kept 300 of 600 rows, rollback mode reported "database disk image is
// malformed".
func TestSQLiteWritersOnTwoMountsAndSource(t *testing.T) {
	const rows = 150
	for _, dm := range dataModes {
		for _, mode := range []string{"wal", "delete"} {
			t.Run(dm.name+"/"+mode, func(t *testing.T) {
				a, b := twoMounts(t, dm.args)
				res := runSQLiteWriters(t, a, b, mode, rows)
				if res.lost(3 * rows) {
					t.Errorf("want 3 writers × %d rows and integrity ok; got %d rows (per writer: %s), integrity %q, failures %q", rows, res.rows, res.perWriter, res.integrity, res.failures)
				}
			})
		}
	}
}

// TestSQLiteControlKeepCacheLoses is the control of
// TestSQLiteWritersOnTwoMountsAndSource: the same run with the kernel's
// cache kept regardless of SOURCE loses rows or corrupts the database.
func TestSQLiteControlKeepCacheLoses(t *testing.T) {
	const rows = 150
	for _, mode := range []string{"wal", "delete"} {
		t.Run(mode, func(t *testing.T) {
			a, b := twoMounts(t, controlArgs, keepCacheEnv)
			res := runSQLiteWriters(t, a, b, mode, rows)
			if !res.lost(3 * rows) {
				t.Errorf("with the cache kept regardless, %d rows and integrity %q: the coherence test could not fail", res.rows, res.integrity)
			}
			t.Logf("control (cache kept): %d of %d rows, integrity %q, failures %q", res.rows, 3*rows, res.integrity, res.failures)
		})
	}
}

// counterRun runs one lock_counter.py on each of paths, n increments
// each, and returns the final count.
func counterRun(t *testing.T, file string, paths []string, n int) string {
	t.Helper()
	require(t, "python3")
	script, err := filepath.Abs("testdata/lock_counter.py")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var ps []*proc
	for _, p := range paths {
		ps = append(ps, start(t, "python3", script, p, fmt.Sprint(n)))
	}
	for _, p := range ps {
		p.waitLine("ready", 30*time.Second)
	}
	for _, p := range ps {
		fmt.Fprintln(p.stdin)
	}
	for i, p := range ps {
		p.waitLine("done", 3*time.Minute)
		if code, ok := p.wait(time.Minute); !ok || code != 0 {
			t.Fatalf("counter %d: exit %d (exited: %v), stderr %q", i, code, ok, p.stderr.String())
		}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestLockedCounterAcrossMounts: a counter incremented under fcntl locks by
// one process on each of two mounts, each keeping the file open, ends
// exact. Measured before the fix: 300 of 600. The control keeps the cache
// regardless and ends short.
func TestLockedCounterAcrossMounts(t *testing.T) {
	const n = 300
	for _, dm := range dataModes {
		t.Run(dm.name, func(t *testing.T) {
			a, b := twoMounts(t, dm.args)
			got := counterRun(t, a.srcPath("c", "counter"), []string{a.path("c", "counter"), b.path("c", "counter")}, n)
			if got != fmt.Sprint(2*n) {
				t.Errorf("counter: want %d, got %s", 2*n, got)
			}
		})
	}
	t.Run("control", func(t *testing.T) {
		a, b := twoMounts(t, controlArgs, keepCacheEnv)
		got := counterRun(t, a.srcPath("c", "counter"), []string{a.path("c", "counter"), b.path("c", "counter")}, n)
		if got == fmt.Sprint(2*n) {
			t.Errorf("with the cache kept regardless the counter still ended at %s: the test could not fail", got)
		}
	})
}

// TestOpenDescriptorSeesSourceAfterLock: a change made in SOURCE is seen
// through a descriptor that was already open (and had read the old bytes)
// once a lock on that file is granted, and by the next open. The control
// keeps the cache regardless and reads the old bytes.
func TestOpenDescriptorSeesSourceAfterLock(t *testing.T) {
	require(t, "python3")
	// Reads the file, signals, waits for a line on stdin, then reads through
	// the same descriptor after taking a lock (flock or lockf), and then
	// through a new open.
	const prog = `
import fcntl, os, sys
path, how = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
print("before", os.pread(fd, 64, 0).decode(), flush=True)
sys.stdin.readline()
if how == "flock":
    fcntl.flock(fd, fcntl.LOCK_SH)
else:
    fcntl.lockf(fd, fcntl.LOCK_SH)
print("locked", os.pread(fd, 64, 0).decode(), flush=True)
fd2 = os.open(path, os.O_RDONLY)
print("reopened", os.pread(fd2, 64, 0).decode(), flush=True)
`
	check := func(t *testing.T, m *Mount, how string, wantFresh bool) {
		name := "seen-" + how
		if err := os.WriteFile(m.srcPath("c", name), []byte("old-bytes"), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startPython(t, prog, m.path("c", name), how)
		p.waitLine("before old-bytes", 15*time.Second)
		// Same size, in place: only the times say that it changed.
		f, err := os.OpenFile(m.srcPath("c", name), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("new-bytes"), 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		fmt.Fprintln(p.stdin)
		locked, _ := p.nextLine(15 * time.Second)
		reopened, _ := p.nextLine(15 * time.Second)
		fresh := locked == "locked new-bytes" && reopened == "reopened new-bytes"
		if fresh != wantFresh {
			t.Errorf("%s: after a change in SOURCE: %q, %q (want fresh: %v)", how, locked, reopened, wantFresh)
		}
	}
	for _, dm := range dataModes {
		t.Run(dm.name, func(t *testing.T) {
			m := mount(t, withArgs(dm.args...))
			check(t, m, "flock", true)
			check(t, m, "lockf", true)
		})
	}
	t.Run("control", func(t *testing.T) {
		m := mount(t, withArgs(controlArgs...), withEnv(keepCacheEnv))
		check(t, m, "flock", false)
		check(t, m, "lockf", false)
	})
}

// TestAttributesFromSource: the kernel keeps a file's attributes for up to
// a second (docs/DATA-PATH.md "Attributes and names"); a change made in
// SOURCE shows through the mount at once after a lock on the file is
// granted, and within the bound without one. New names show at once, and a
// name renamed away in SOURCE stops resolving within the bound. The
// control keeps the cache regardless: right after the lock it still shows
// the old attributes, so the check after the lock can fail.
func TestAttributesFromSource(t *testing.T) {
	// afterLock changes file in SOURCE with change, takes and drops a
	// flock through the mount, and returns the mode and size stat(2) then
	// shows through the mount.
	afterLock := func(t *testing.T, m *Mount, name string, change func(src string)) (os.FileMode, int64) {
		t.Helper()
		if err := os.WriteFile(m.srcPath("c", name), []byte("12345"), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(m.path("c", name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := os.Stat(m.path("c", name)); err != nil { // cached from here
			t.Fatal(err)
		}
		change(m.srcPath("c", name))
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
			t.Fatal(err)
		}
		defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		fi, err := os.Stat(m.path("c", name))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode(), fi.Size()
	}
	chmod := func(p string) {
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	grow := func(p string) {
		if err := os.WriteFile(p, []byte("1234567890"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, dm := range dataModes {
		t.Run(dm.name, func(t *testing.T) {
			m := mount(t, withArgs(dm.args...))
			if mode, _ := afterLock(t, m, "chmod", chmod); mode.Perm() != 0o600 {
				t.Errorf("chmod 600 in SOURCE: after a lock the mount shows %v", mode)
			}
			if _, size := afterLock(t, m, "grow", grow); size != 10 {
				t.Errorf("file grown to 10 bytes in SOURCE: after a lock the mount shows %d", size)
			}
			// Without a lock: within the bound (generous: a loaded machine).
			p := m.path("c", "chmod")
			if err := os.Chmod(m.srcPath("c", "chmod"), 0o640); err != nil {
				t.Fatal(err)
			}
			if !testutil.Poll(10*time.Second, func() bool {
				fi, err := os.Stat(p)
				return err == nil && fi.Mode().Perm() == 0o640
			}) {
				t.Errorf("chmod 640 in SOURCE not seen through the mount within 10s")
			}
			// A new name: at once.
			if _, err := os.Stat(m.path("c", "new")); !os.IsNotExist(err) {
				t.Fatalf("stat of a missing name: %v", err)
			}
			if err := os.WriteFile(m.srcPath("c", "new"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(m.path("c", "new")); err != nil {
				t.Errorf("a file created in SOURCE is not seen at once: %v", err)
			}
			// A rename in SOURCE: the new name at once, the old one gone
			// within the bound.
			if err := os.Rename(m.srcPath("c", "new"), m.srcPath("c", "renamed")); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(m.path("c", "renamed")); err != nil {
				t.Errorf("a name renamed to in SOURCE is not seen at once: %v", err)
			}
			if !testutil.Poll(10*time.Second, func() bool {
				_, err := os.Stat(m.path("c", "new"))
				return os.IsNotExist(err)
			}) {
				t.Errorf("a name renamed away in SOURCE still resolves through the mount after 10s")
			}
		})
	}
	t.Run("control", func(t *testing.T) {
		m := mount(t, withArgs(controlArgs...), withEnv(keepCacheEnv))
		mode, _ := afterLock(t, m, "chmod", chmod)
		_, size := afterLock(t, m, "grow", grow)
		if mode.Perm() == 0o600 && size == 10 {
			t.Errorf("with the cache kept regardless, a lock still showed the new attributes: the test could not fail")
		}
	})
}

// TestDirLockRevalidatesChildren: a directory lock guards the names and
// attributes of the directory's children (SPEC §2), so once `flock
// dir/.lock` is granted, a chmod and a rename made in SOURCE show through
// the mount at once, though the kernel had cached the old ones. The control
// keeps the cache regardless and still shows them.
func TestDirLockRevalidatesChildren(t *testing.T) {
	// underLock caches c/f and c/g, changes them in SOURCE, and reports
	// what a command run under c/.lock sees: the mode of c/f and whether
	// c/g still resolves.
	underLock := func(t *testing.T, m *Mount) string {
		t.Helper()
		for _, n := range []string{"f", "g"} {
			if err := os.WriteFile(m.srcPath("c", n), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(m.path("c", n)); err != nil { // cached from here
				t.Fatal(err)
			}
		}
		if err := os.Chmod(m.srcPath("c", "f"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(m.srcPath("c", "g"), m.srcPath("c", "h")); err != nil {
			t.Fatal(err)
		}
		r := run(t, 30*time.Second, "flock", "-s", m.path("c", ".lock"), "sh", "-c",
			`stat -c %a "$1"; if [ -e "$2" ]; then echo g-resolves; else echo g-gone; fi`, "sh", m.path("c", "f"), m.path("c", "g"))
		if r.code != 0 {
			t.Fatalf("flock: %v", r)
		}
		return strings.Join(strings.Fields(r.stdout), " ")
	}
	// regiven follows underLock: grants with nobody looking at c's
	// children (which drop nothing once the kernel holds nothing from
	// before, fs/invalidate.go), then c/f cached again, chmod 640 in SOURCE, and
	// the mode of c/f seen under the next grant. c/f is held open
	// throughout, so that the kernel keeps its node (a dropped name would
	// otherwise let the kernel forget it, and the next lookup make a new
	// one). It fails if an answer that gives the kernel attributes again
	// is not counted (fillAttr): with the count kept at a node's first
	// answer the last grant skipped c/f and showed 600 (checked by hand).
	regiven := func(t *testing.T, m *Mount) string {
		t.Helper()
		held, err := os.Open(m.path("c", "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		for i := 0; i < 3; i++ {
			if r := run(t, 30*time.Second, "flock", "-s", m.path("c", ".lock"), "true"); r.code != 0 {
				t.Fatalf("flock: %v", r)
			}
		}
		if _, err := os.Stat(m.path("c", "f")); err != nil { // cached again
			t.Fatal(err)
		}
		if err := os.Chmod(m.srcPath("c", "f"), 0o640); err != nil {
			t.Fatal(err)
		}
		r := run(t, 30*time.Second, "flock", "-s", m.path("c", ".lock"), "stat", "-c", "%a", m.path("c", "f"))
		if r.code != 0 {
			t.Fatalf("flock: %v", r)
		}
		return strings.TrimSpace(r.stdout)
	}
	for _, dm := range dataModes {
		t.Run(dm.name, func(t *testing.T) {
			m := mount(t, withArgs(dm.args...))
			if got := underLock(t, m); got != "600 g-gone" {
				t.Errorf("under c/.lock after a chmod and a rename in SOURCE: %q, want %q", got, "600 g-gone")
			}
			if got := regiven(t, m); got != "640" {
				t.Errorf("under c/.lock after grants, c/f cached again and a chmod in SOURCE: mode %s, want 640", got)
			}
		})
	}
	t.Run("control", func(t *testing.T) {
		m := mount(t, withArgs(controlArgs...), withEnv(keepCacheEnv))
		if got := underLock(t, m); got == "600 g-gone" {
			t.Errorf("with the cache kept regardless, the lock still showed the changes (%q): the test could not fail", got)
		}
		if got := regiven(t, m); got == "640" {
			t.Errorf("with the cache kept regardless, the last grant still showed the chmod: the test could not fail")
		}
	})
}
