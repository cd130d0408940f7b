package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestStressNGLocks runs stress-ng's file-locking stressors on a regular
// file of the mount: ordinary files keep ordinary lock semantics.
func TestStressNGLocks(t *testing.T) {
	require(t, "stress-ng")
	m := mount(t)
	dir := m.path("x")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	r := run(t, 2*time.Minute, "stress-ng", "--flock", "2", "--fcntl", "2", "--lockf", "2", "--lockofd", "2",
		"-t", "5", "--temp-path", dir, "--metrics-brief")
	out := r.stdout + r.stderr
	if r.code != 0 || r.timedOut {
		t.Fatalf("stress-ng: %v", r)
	}
	if regexp.MustCompile(`failed: [1-9]`).MatchString(out) || strings.Contains(out, "stressor failed") {
		t.Errorf("stress-ng reported failures:\n%s", out)
	}
	// Control: stress-ng really ran all four stressors (a run that did
	// nothing would pass the checks above).
	for _, s := range []string{"flock", "fcntl", "lockf", "lockofd"} {
		if !regexp.MustCompile(`(?m)\b` + s + `\s+\d+`).MatchString(out) {
			t.Errorf("stress-ng output has no metrics for %s:\n%s", s, out)
		}
	}
	t.Logf("stress-ng:\n%s", out)
}

// TestSQLiteConcurrentWriters: sqlite3 processes writing one database on the
// mount, relying on its fcntl byte-range locks, lose nothing and corrupt
// nothing.
func TestSQLiteConcurrentWriters(t *testing.T) {
	require(t, "sqlite3")
	m := mount(t)
	db := m.path("c/test.db")
	if r := run(t, 30*time.Second, "sqlite3", db, "CREATE TABLE t(w INTEGER, i INTEGER);"); r.code != 0 {
		t.Fatalf("create: %v", r)
	}
	const writers, rows = 4, 40
	var ps []*proc
	for w := range writers {
		script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do
			sqlite3 -cmd '.timeout 30000' %s "BEGIN IMMEDIATE; INSERT INTO t VALUES(%d, $i); COMMIT;" || exit 1
			i=$((i+1)); done`, rows, db, w)
		ps = append(ps, start(t, "sh", "-c", script))
	}
	for i, p := range ps {
		if code, ok := p.wait(3 * time.Minute); !ok || code != 0 {
			t.Fatalf("writer %d: exit %d, finished %v; stderr %q", i, code, ok, p.stderr.String())
		}
	}
	r := run(t, 30*time.Second, "sqlite3", db, "PRAGMA integrity_check; SELECT count(*), count(DISTINCT w*1000+i) FROM t;")
	want := fmt.Sprintf("ok\n%d|%d\n", writers*rows, writers*rows)
	if r.code != 0 || r.stdout != want {
		t.Errorf("after %d concurrent writers: want %q, got %v", writers, want, r)
	}
}

// TestPermissions: shared needs read permission on the directory, exclusive
// write permission, checked for the requesting user (SPEC §3, EACCES).
func TestPermissions(t *testing.T) {
	requireRoot(t)
	require(t, "setpriv")
	m := mount(t, withArgs("--allow-other"), withWorldTraversable(), withSetup(func(src string) {
		for d, mode := range map[string]os.FileMode{"ro": 0o755, "rw": 0o777} {
			p := filepath.Join(src, d)
			if err := os.Mkdir(p, mode); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, mode) // despite the umask
		}
	}))
	asNobody := func(args ...string) result {
		t.Helper()
		argv := append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "flock"}, args...)
		return run(t, 15*time.Second, "setpriv", argv...)
	}

	r := asNobody("-n", "-s", m.path("ro/.lock"), "true")
	expectCode(t, "nobody: flock -n -s ro/.lock (0755 root-owned)", r, 0)
	r = asNobody("-n", "-x", m.path("ro/.lock"), "true")
	if r.code == 0 || r.timedOut || !strings.Contains(r.stderr, "Permission denied") {
		t.Errorf("nobody: flock -n -x ro/.lock (0755 root-owned): want EACCES (\"Permission denied\"), got %v", r)
	}
	// Control: a 0777 directory allows the exclusive lock.
	r = asNobody("-n", "-x", m.path("rw/.lock"), "true")
	expectCode(t, "nobody: flock -n -x rw/.lock (0777)", r, 0)
	// Control: root may take the exclusive lock on ro.
	expectCode(t, "root: flock -n -x ro/.lock", flockN(t, m.path("ro/.lock"), "-x"), 0)
}
