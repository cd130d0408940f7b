package integration

import (
	"encoding/json"
	"os"
	"testing"
	"time"
)

// Kept shared claims (localbackend/keep.go, docs/PROTOCOL.md): after a
// lock's release the daemon keeps its ancestors' shared flocks on SOURCE
// for --keep-shared-locks (5 ms by default), so the next lock at that depth
// needs no flock(2) per level.

// depth4Pair takes and releases a/b/c/d's lock through the mount once,
// with an explicit unlock (flock -u), which the mount has answered when
// flock returns. "flock -x FILE true" released the lock only with the
// descriptor's last close, whose RELEASE the kernel sends after the
// process has exited: an rmdir right after it found the lock still held
// (EBUSY) in one CI run.
func depth4Pair(t *testing.T, m *Mount) {
	t.Helper()
	if r := run(t, 30*time.Second, "sh", "-c", `exec 9>"$1" && flock -x 9 && flock -u 9`, "sh", m.path("a/b/c/d/.lock")); r.code != 0 {
		t.Fatalf("flock -x, then flock -u, of a/b/c/d/.lock: %v", r)
	}
}

func newDepth4(t *testing.T, m *Mount) {
	t.Helper()
	if err := os.MkdirAll(m.path("a/b/c/d"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestKeptClaimDirectSourceLocker: a program locking SOURCE directly gets
// an ancestor exclusively right after a depth-4 pair through the mount
// (waiting at most the keep, bounded generously here); the control, with a
// keep longer than its wait, does not.
func TestKeptClaimDirectSourceLocker(t *testing.T) {
	m := mount(t)
	newDepth4(t, m)
	depth4Pair(t, m)
	if r := run(t, 60*time.Second, "flock", "-w", "30", "-x", m.srcPath("a", "..LOCK"), "true"); r.code != 0 {
		t.Fatalf("direct flock -w 30 -x SOURCE/a/..LOCK after a pair: %v (the kept claim was never dropped)", r)
	}

	ctl := mount(t, withArgs("--keep-shared-locks=1m"))
	newDepth4(t, ctl)
	depth4Pair(t, ctl)
	if r := run(t, 30*time.Second, "flock", "-w", "0.3", "-x", ctl.srcPath("a", "..LOCK"), "true"); r.code != 1 {
		t.Fatalf("control: direct flock -w 0.3 -x SOURCE/a/..LOCK with a 1m keep: %v, want exit 1 (kept)", r)
	}
}

// TestKeptClaimOwnExclusiveAndRmdir: the daemon's own exclusive lock of a
// kept ancestor is granted without waiting (flock -n), rmdir of a
// directory whose only claim is kept succeeds, and status lists no lock.
func TestKeptClaimOwnExclusiveAndRmdir(t *testing.T) {
	m := mount(t, withArgs("--keep-shared-locks=1m"))
	newDepth4(t, m)
	depth4Pair(t, m)
	// The keep is real: SOURCE's a/..LOCK is flocked shared.
	if r := run(t, 30*time.Second, "flock", "-n", "-x", m.srcPath("a", "..LOCK"), "true"); r.code != 1 {
		t.Fatalf("direct flock -n -x SOURCE/a/..LOCK right after a pair: %v, want exit 1 (kept)", r)
	}
	// Status shows no lock: nothing is held through the mount.
	r := run(t, 10*time.Second, lockfsBin, "status", "--json", m.Mnt)
	if r.code != 0 {
		t.Fatalf("lockfs status: %v", r)
	}
	var st []statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st) != 1 {
		t.Fatalf("lockfs status --json: %v: %q", err, r.stdout)
	}
	if len(st[0].Locks) != 0 {
		t.Errorf("status lists locks after the pair, whose claims are only kept: %+v", st[0].Locks)
	}
	// Our own exclusive request is not delayed by our kept claim.
	if r := run(t, 30*time.Second, "flock", "-n", "-x", m.path("a/.lock"), "true"); r.code != 0 {
		t.Fatalf("flock -n -x a/.lock through the mount right after a pair: %v", r)
	}

	// rmdir of directories whose only claims are kept ones.
	depth4Pair(t, m)
	if r := run(t, 30*time.Second, "flock", "-n", "-x", m.srcPath("a", "b", "c", "..LOCK"), "true"); r.code != 1 {
		t.Fatalf("direct flock -n -x SOURCE/a/b/c/..LOCK right after a pair: %v, want exit 1 (kept)", r)
	}
	for _, d := range []string{"a/b/c/d", "a/b/c"} {
		if err := os.Remove(m.path(d)); err != nil {
			t.Fatalf("rmdir %s, whose only claim is kept: %v", d, err)
		}
	}
	if _, err := os.Lstat(m.srcPath("a", "b", "c")); !os.IsNotExist(err) {
		t.Fatalf("SOURCE/a/b/c after rmdir: %v", err)
	}
}
