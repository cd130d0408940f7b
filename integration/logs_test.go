package integration

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestLogs: what the daemon logs about waits, refusals and holders.
//   - A wait longer than --log-wait-over is logged while it lasts, naming
//     the lock it asked for and the holder in the way (pid, command, host),
//     and again at the grant.
//   - A refusal (flock -n on a held lock) is logged at info with the holder
//     named, one line per lock per few seconds however many refusals.
//   - A holder killed with SIGKILL while holding is logged at debug.
//   - An absent extended attribute (ENODATA) is not logged at debug.
func TestLogs(t *testing.T) {
	require(t, "python3")
	m := mount(t, withArgs("--log-wait-over", "1s")) // the harness logs at debug
	h := holder(t, m.path("a/.lock"), "-x")
	w := start(t, "flock", "-s", m.path("a/b/.lock"), "echo", "granted")

	// The long wait, logged while it lasts.
	waitRE := regexp.MustCompile(`level=info msg="lock wait is long: still waiting" blocked_by="pid=` +
		fmt.Sprint(h.pid()) + ` host=\S+ exclusive sleep 1000 \[\d+ under flock\]".*path=a/b/\.lock.*pid=` + fmt.Sprint(w.pid()))
	if !testutil.Poll(20*time.Second, func() bool { return waitRE.MatchString(m.logText()) }) {
		t.Fatalf("no line about the long wait matching %s; log:\n%s", waitRE, tail(m.logText(), 30))
	}

	// Refusals: five in a row, at most one line for the lock (the window
	// is 5 s; five flock -n runs take far less, but a slow machine may
	// cross it once).
	for i := 0; i < 5; i++ {
		expectCode(t, "flock -n on the held lock", flockN(t, m.path("a/.lock")), 1)
	}
	refusals := regexp.MustCompile(`level=info msg="lock request refused" blocked_by="pid=`+fmt.Sprint(h.pid())+
		` host=\S+ exclusive sleep 1000 \[\d+ under flock\]".*errno=EAGAIN.*path=a/\.lock`).FindAllString(m.logText(), -1)
	if len(refusals) == 0 || len(refusals) > 2 {
		t.Errorf("%d info lines for 5 refusals of a/.lock, want 1 (2 at most); log:\n%s", len(refusals), tail(m.logText(), 30))
	}

	// ENODATA: the request happens (python sees the errno), and the daemon
	// does not log it at debug.
	r := run(t, 10*time.Second, "python3", "-c", `import errno, os, sys
try:
    os.getxattr(sys.argv[1], "user.lockfs-test-absent")
except OSError as e:
    print(errno.errorcode[e.errno])`, m.path("a/b"))
	if strings.TrimSpace(r.stdout) != "ENODATA" {
		t.Fatalf("getxattr of an absent attribute: %v", r)
	}
	if strings.Contains(m.logText(), "errno=ENODATA") {
		t.Errorf("ENODATA logged at debug:\n%s", tail(m.logText(), 20))
	}

	// kill -9 of the holder (flock and its sleep): logged at debug, and the
	// waiter is granted, which is logged too.
	syscall.Kill(-h.pid(), syscall.SIGKILL)
	w.waitLine("granted", 20*time.Second)
	dead := regexp.MustCompile(`level=debug msg="holder exited with the lock held: released as its last descriptor closed".*path=a/\.lock.*pid=` + fmt.Sprint(h.pid()))
	if !testutil.Poll(10*time.Second, func() bool { return dead.MatchString(m.logText()) }) {
		t.Errorf("no debug line for the killed holder; log:\n%s", tail(m.logText(), 30))
	}
	if !strings.Contains(m.logText(), `msg="lock granted after a long wait"`) {
		t.Errorf("no line for the grant after the long wait")
	}
}

// TestStartupLogSettings: the daemon logs the settings it runs with,
// defaults filled in (the lease TTL was nowhere in the log), and a
// --lease-ttl of 0 is refused before anything is mounted (it was taken
// for the default, silently).
func TestStartupLogSettings(t *testing.T) {
	// The daemon logs its start-up lines just after the mount answers.
	settings := func(m *Mount) string {
		testutil.Poll(20*time.Second, func() bool { return strings.Contains(m.logText(), `msg="settings in effect"`) })
		return settingsLine(m)
	}
	m := mount(t)
	if line := settings(m); !strings.Contains(line, "keep_shared_locks=") || !strings.Contains(line, "max_open_per_uid=") ||
		strings.Contains(line, "lease_ttl=") {
		t.Errorf("the local mount's start-up log lacks its settings:\n%s", m.logText())
	}
	emu := startEmulator(t)
	g := mountGCS(t, gcsHost{id: "host-s", endpoint: emu.Endpoint(), bucket: emu.Bucket, ttl: 7 * time.Second})
	if line := settings(g); !strings.Contains(line, "lease_ttl=7s") || !strings.Contains(line, "refresh_every=2.333333333s") {
		t.Errorf("the gcs mount's start-up log lacks its lease TTL and refresh interval:\n%s", g.logText())
	}
	mnt := t.TempDir()
	r := lockfs(t, 30*time.Second, "mount", "--backend", "gcs", "--gcs-bucket", emu.Bucket, "--gcs-endpoint", emu.Endpoint(),
		"--lease-ttl", "0", t.TempDir(), mnt)
	if r.code != 64 || !strings.Contains(r.stderr, "--lease-ttl 0: want 100ms or more") || isMounted(mnt) {
		t.Errorf("lockfs mount --lease-ttl 0: %v (mounted: %v)", r, isMounted(mnt))
	}
}
