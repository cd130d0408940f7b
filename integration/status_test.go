package integration

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// statusJSON is the part of `lockfs status --json` these tests read.
type statusJSON struct {
	Mountpoint string `json:"mountpoint"`
	Locks      []struct {
		Path    string `json:"path"`
		Kind    string `json:"kind"`
		Holders []struct {
			PID     int    `json:"pid"`
			Command string `json:"command"`
			Cmdline string `json:"cmdline"`
			Runs    *struct {
				PID     int    `json:"pid"`
				Name    string `json:"name"`
				Cmdline string `json:"cmdline"`
			} `json:"runs"`
		} `json:"holders"`
		Waiters []struct {
			Mode      string    `json:"mode"`
			Implicit  bool      `json:"implicit"`
			Wants     string    `json:"wants"`
			WantsMode string    `json:"wants_mode"`
			PID       int       `json:"pid"`
			Cmdline   string    `json:"cmdline"`
			Since     time.Time `json:"since"`
		} `json:"waiters"`
	} `json:"locks"`
}

// TestStatusAllMounts: `lockfs status` without a path shows every lockfs
// mount of the host; a holder under flock(1) is shown with its command line
// and the command it runs; a waiter queued on an ancestor names the lock it
// asked for, its pid, command line and since when; and a bad path among
// good ones is reported on stderr, exit 1, with the good ones still shown.
func TestStatusAllMounts(t *testing.T) {
	requireRoot(t)
	m1, m2 := mount(t), mount(t)
	h := holder(t, m1.path("a/.lock"), "-x")
	w := start(t, "flock", "-s", m1.path("a/b/.lock"), "true")

	var got []statusJSON
	var rec statusJSON
	if !testutil.Poll(20*time.Second, func() bool {
		r := run(t, 10*time.Second, lockfsBin, "status", "--json")
		got = nil
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			return false
		}
		for _, g := range got {
			if g.Mountpoint == m1.Mnt {
				rec = g
				for _, l := range g.Locks {
					if l.Path == "a" && len(l.Waiters) > 0 {
						return true
					}
				}
			}
		}
		return false
	}) {
		t.Fatalf("status without a path never showed the waiter on a: %+v", got)
	}
	var saw2 bool
	for _, g := range got {
		saw2 = saw2 || g.Mountpoint == m2.Mnt
	}
	if !saw2 {
		t.Errorf("status without a path lacks the second mount %s: %+v", m2.Mnt, got)
	}
	for _, l := range rec.Locks {
		if l.Path != "a" || l.Kind != "dir" {
			continue
		}
		if len(l.Holders) != 1 {
			t.Fatalf("holders of a: %+v", l.Holders)
		}
		hd := l.Holders[0]
		if hd.PID != h.pid() || hd.Command != "flock" || !strings.HasPrefix(hd.Cmdline, "flock -x "+m1.path("a/.lock")+" sh -c") {
			t.Errorf("holder: %+v (flock pid %d)", hd, h.pid())
		}
		if hd.Runs == nil || hd.Runs.Name != "sleep" || hd.Runs.Cmdline != "sleep 1000" {
			t.Errorf("the holder's command under flock: %+v", hd.Runs)
		}
		wt := l.Waiters[0]
		if wt.PID != w.pid() || !wt.Implicit || wt.Mode != "shared" || wt.Wants != "a/b/.lock" || wt.WantsMode != "shared" ||
			!strings.HasPrefix(wt.Cmdline, "flock -s ") || wt.Since.IsZero() || time.Since(wt.Since) < 0 {
			t.Errorf("waiter: %+v (flock pid %d)", wt, w.pid())
		}
	}

	table := run(t, 10*time.Second, lockfsBin, "status", m1.Mnt)
	if !strings.Contains(table.stdout, "sleep 1000 [") || !strings.Contains(table.stdout, "for a/b/.lock shared") ||
		strings.Contains(table.stdout, "waiting(below)") {
		t.Errorf("status table:\n%s", table.stdout)
	}
	t.Logf("lockfs status:\n%s", table.stdout)

	bad := t.TempDir()
	r := run(t, 10*time.Second, lockfsBin, "status", m1.Mnt, bad, m2.Mnt)
	if r.code != 1 || !strings.Contains(r.stderr, bad) || !strings.Contains(r.stdout, m1.Mnt) || !strings.Contains(r.stdout, m2.Mnt) {
		t.Errorf("status with a bad path between two good ones: %v", r)
	}
	// The control: the same good paths alone succeed.
	if r := run(t, 10*time.Second, lockfsBin, "status", m1.Mnt, m2.Mnt); r.code != 0 || r.stderr != "" {
		t.Errorf("status of two good paths: %v", r)
	}
}

// TestStatusOtherAdminDir: `lockfs status` without a path shows the mounts
// whose admin sockets are in its --admin-dir, and says in one line which
// it could not ask and why, naming --admin-dir; it exits 0 (before: exit 1
// and an error line per mount, --admin-dir never named). The control:
// with the other mount's --admin-dir, that mount is shown.
func TestStatusOtherAdminDir(t *testing.T) {
	requireRoot(t)
	adminDir := filepath.Join(testutil.SocketDir(t), "run")
	m1 := mount(t)
	m2 := mount(t, withArgs("--admin-dir", adminDir))
	h := holder(t, m1.path("a/.lock"), "-x")
	defer h.kill()

	// Other tests' mounts (on a shared machine, other runs' too) may be
	// counted on that line: past ten, the line names the first ten.
	named := func(line, mnt string) bool { return strings.Contains(line, mnt) || strings.Contains(line, " more) ") }
	r := run(t, 20*time.Second, lockfsBin, "status")
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if !strings.Contains(r.stdout, m1.Mnt) || strings.Contains(r.stdout, m2.Mnt) || len(lines) != 1 ||
		!named(lines[0], m2.Mnt) || !strings.Contains(lines[0], "--admin-dir") {
		t.Errorf("status without a path, a mount with another --admin-dir: %v", r)
	}
	// Another test's daemon killed meanwhile may not answer: that alone
	// may make it 1.
	if r.code != 0 && !strings.Contains(r.stderr, "did not answer") {
		t.Errorf("status without a path exited %d: %v", r.code, r)
	}
	// Asked for by path, the other --admin-dir's mount says what to pass.
	if r := run(t, 20*time.Second, lockfsBin, "status", m2.Mnt); r.code != 1 || !strings.Contains(r.stderr, "pass the same --admin-dir") {
		t.Errorf("status of the mount with another --admin-dir: %v", r)
	}
	r = run(t, 20*time.Second, lockfsBin, "status", "--admin-dir", adminDir)
	if !strings.Contains(r.stdout, m2.Mnt) || strings.Contains(r.stdout, m1.Mnt) || !named(r.stderr, m1.Mnt) {
		t.Errorf("status --admin-dir %s (control): %v", adminDir, r)
	}

	// A path below the holder's lock, with nothing held there, says so
	// in words; a path that does not exist outside every mount says
	// that.
	r = run(t, 20*time.Second, lockfsBin, "status", m1.path("b"))
	if r.code != 0 || strings.TrimSpace(r.stdout) != "no locks (none held or waited for)" {
		t.Errorf("status of a directory with no lock: %v", r)
	}
	missing := filepath.Join(t.TempDir(), "no", "such")
	if r := run(t, 20*time.Second, lockfsBin, "status", missing); r.code != 1 || !strings.Contains(r.stderr, "no such file or directory") {
		t.Errorf("status of a missing path: %v", r)
	}
}

// TestStatusOfADirectoryShowsItsWaiters: a waiter for a/b/.lock queued on a
// (held by another process) shows in the status of a/b, with the lock it
// asked for (it sat under a alone, and the status of a/b printed a header).
func TestStatusOfADirectoryShowsItsWaiters(t *testing.T) {
	requireRoot(t)
	m := mount(t)
	h := holder(t, m.path("a/.lock"), "-x")
	defer h.kill()
	w := start(t, "flock", m.path("a/b/.lock"), "true")
	defer w.kill()
	var r result
	if !testutil.Poll(20*time.Second, func() bool {
		r = run(t, 10*time.Second, lockfsBin, "status", m.path("a/b"))
		return strings.Contains(r.stdout, "for a/b/.lock exclusive")
	}) {
		t.Fatalf("status of a/b never showed the waiter for a/b/.lock: %v", r)
	}
	if strings.Contains(r.stdout, " "+strconv.Itoa(h.pid())+" ") {
		t.Errorf("status of a/b shows the holder of a (pid %d), a lock above it:\n%s", h.pid(), r.stdout)
	}
	// Control: the status of c does not show it.
	if r := run(t, 10*time.Second, lockfsBin, "status", m.path("c")); strings.Contains(r.stdout, "a/b/.lock") {
		t.Errorf("status of c shows the waiter for a/b: %v", r)
	}
}
