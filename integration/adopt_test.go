package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestNewDirAdoption: a directory created under an exclusive new-dir lock
// is, in effect, locked exclusively by the lock's holder until it releases
// the new-dir lock (SPEC §2). The control: a directory created without the
// new-dir lock is free at once.
func TestNewDirAdoption(t *testing.T) {
	m := mount(t)
	holder := start(t, "flock", "-x", m.path("a/.lock_newdir"), "sh", "-c",
		"mkdir \"$1\" && echo made && { read _ || true; }", "sh", m.path("a/fresh"))
	holder.waitLine("made", 10*time.Second)
	if r := run(t, 10*time.Second, "flock", "-n", m.path("a/fresh/.lock"), "true"); r.code != 1 {
		t.Fatalf("flock -n on the new directory while its creator holds the new-dir lock: %v, want exit 1", r)
	}
	if r := run(t, 10*time.Second, "flock", "-n", "-s", m.path("a/fresh/sub/.lock"), "true"); r.code == 0 {
		t.Fatalf("a lock inside the new directory was granted to a stranger: %v", r)
	}
	// Control: made without the new-dir lock, the directory is free.
	if err := os.Mkdir(m.srcPath("a/plain"), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := run(t, 10*time.Second, "flock", "-n", m.path("a/plain/.lock"), "true"); r.code != 0 {
		t.Fatalf("control: flock -n on a directory made without the new-dir lock: %v", r)
	}
	holder.stdin.Close() // read returns: the holder ends and releases the new-dir lock
	if code, ok := holder.wait(10 * time.Second); !ok || code != 0 {
		t.Fatalf("holder: exit %d, ended %v", code, ok)
	}
	// The kernel sends the RELEASE of the exited holder's descriptor in the
	// background, so the lock goes a moment after the process (CI once ran
	// flock -n 2 ms after the exit, before the daemon had the RELEASE).
	var r result
	if !testutil.Poll(10*time.Second, func() bool {
		r = run(t, 10*time.Second, "flock", "-n", m.path("a/fresh/.lock"), "true")
		return r.code == 0
	}) {
		t.Fatalf("after the new-dir lock was released, flock -n on the new directory: %v", r)
	}
}

// TestNewDirCreatorRemoves: the creator of a directory made under an
// exclusive new-dir lock may remove it again within that lock (rmdir, rm
// -rf), though the directory's lock came to it with the new-dir lock; made
// again, it is adopted again, and a removal that fails (a program locking
// SOURCE directly holds one of its backing files) leaves it the creator's.
// Controls: a stranger's rmdir of the adopted
// directory is refused with EBUSY meanwhile, and so is the rmdir of a
// directory whose own lock the remover holds explicitly (PROTOCOL.md §11).
func TestNewDirCreatorRemoves(t *testing.T) {
	m := mount(t)
	creator := start(t, "flock", "-x", m.path("a/.lock_newdir"), "sh", "-c", `
mkdir "$1" && mkdir "$1/sub" && echo made
read _
rm -rf "$1" && echo removed
mkdir "$1" && echo again
read _
rmdir "$1" || echo busy
read _
rmdir "$1" && echo removed-again
`, "sh", m.path("a/tmp"))
	creator.waitLine("made", 10*time.Second)
	r := run(t, 10*time.Second, "rmdir", m.path("a/tmp/sub"))
	if r.code != 0 {
		t.Fatalf("control setup: rmdir of a/tmp/sub, which nobody locks: %v", r)
	}
	if r := run(t, 10*time.Second, "rmdir", m.path("a/tmp")); r.code == 0 || !strings.Contains(r.stderr, "busy") {
		t.Fatalf("control: a stranger's rmdir of the adopted a/tmp: %v, want EBUSY", r)
	}
	if err := os.Mkdir(m.path("a/tmp/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(creator.stdin)
	creator.waitLine("removed", 10*time.Second)
	creator.waitLine("again", 10*time.Second)
	if r := run(t, 10*time.Second, "flock", "-n", m.path("a/tmp/.lock"), "true"); r.code != 1 {
		t.Fatalf("the directory made again under the new-dir lock is not adopted: flock -n %v, want exit 1", r)
	}
	// A program locking SOURCE directly holds one of the new directory's
	// backing files: the creator's rmdir is busy, and the creator keeps
	// the directory's lock (it was given up for the removal, and is taken
	// again when the removal fails).
	outside := holder(t, m.srcPath("a/tmp/..LOCK_NEWDIR"))
	fmt.Fprintln(creator.stdin)
	creator.waitLine("busy", 10*time.Second)
	if r := run(t, 10*time.Second, "flock", "-n", m.path("a/tmp/.lock"), "true"); r.code != 1 {
		t.Fatalf("after the creator's rmdir failed, the directory's lock is not the creator's again: flock -n %v, want exit 1", r)
	}
	outside.kill()
	fmt.Fprintln(creator.stdin)
	creator.waitLine("removed-again", 10*time.Second)
	if code, ok := creator.wait(10 * time.Second); !ok || code != 0 {
		t.Fatalf("creator: exit %d (ended %v), stderr %q", code, ok, creator.stderr.String())
	}
	if _, err := os.Stat(m.srcPath("a/tmp")); !os.IsNotExist(err) {
		t.Fatalf("a/tmp still in SOURCE: %v", err)
	}

	// Control: an explicit lock on the directory still makes its own
	// holder's rmdir busy.
	if err := os.Mkdir(m.path("a/kept"), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := run(t, 10*time.Second, "flock", "-x", m.path("a/kept/.lock"), "rmdir", m.path("a/kept")); r.code == 0 {
		t.Fatalf("control: rmdir under the directory's own exclusive lock: %v, want EBUSY", r)
	}
}

// TestNewDirCreatorWorksInIt: within the exclusive new-dir lock, the
// holder's lineage may lock the directory it made and anything inside it
// (SPEC §2.3), though the creator (mkdir(1)) has exited; and it may make
// the directory under a temporary name and move it into place (mv), the
// directory's lock moving with it. Controls: a stranger can lock neither
// meanwhile, and a directory moved to a parent whose new-dir lock the mover
// does not hold is not adopted there.
func TestNewDirCreatorWorksInIt(t *testing.T) {
	m := mount(t)
	creator := start(t, "flock", "-x", m.path("a/.lock_newdir"), "sh", "-c", `
mkdir "$1/q" && flock -n "$1/q/.lock" true && mkdir "$1/q/sub" && flock -n "$1/q/sub/.lock" true && echo inside
mkdir "$1/tmp.x" && touch "$1/tmp.x/f" && mv "$1/tmp.x" "$1/final" && echo moved
mkdir "$1/out" && mv "$1/out" "$2/out" && echo moved-out
read _ || true
`, "sh", m.path("a"), m.path("b"))
	creator.waitLine("inside", 10*time.Second)
	creator.waitLine("moved", 10*time.Second)
	creator.waitLine("moved-out", 10*time.Second)
	for _, p := range []string{"a/q/.lock", "a/final/.lock"} {
		if r := run(t, 10*time.Second, "flock", "-n", m.path(p), "true"); r.code != 1 {
			t.Fatalf("control: a stranger's flock -n %s while the creator holds the new-dir lock: %v, want exit 1", p, r)
		}
	}
	if r := run(t, 10*time.Second, "flock", "-n", m.path("b/out/.lock"), "true"); r.code != 0 {
		t.Fatalf("control: b/out, moved where the creator holds no new-dir lock, is still locked: %v", r)
	}
	creator.stdin.Close()
	if code, ok := creator.wait(10 * time.Second); !ok || code != 0 {
		t.Fatalf("creator: exit %d (ended %v), stderr %q", code, ok, creator.stderr.String())
	}
}
