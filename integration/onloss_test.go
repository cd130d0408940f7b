package integration

import (
	"strings"
	"testing"
	"time"
)

// TestBreakSignalsHolderNotScript: `lockfs break` (like a lost lease)
// signals the holder and its descendants only. A script running
// `flock dir/.lock sleep` survives, sleep dies, flock fails. Before the
// fix the signal went to the holder's process group, which is the whole
// script: it never printed "script-alive".
func TestBreakSignalsHolderNotScript(t *testing.T) {
	requireRoot(t)
	m := mount(t)
	// flock, sleep and the script share one process group (the script's).
	script := start(t, "sh", "-c", `flock "$1" sh -c 'echo held; exec sleep 300'; echo "flock exit $?"; echo script-alive`,
		"script", m.path("a/.lock"))
	script.waitLine("held", 15*time.Second)
	if r := lockfs(t, 30*time.Second, "break", m.path("a")); r.code != 0 {
		t.Fatalf("lockfs break: %v", r)
	}
	line, _ := script.nextLine(30 * time.Second)
	if line == "flock exit 0" || !strings.HasPrefix(line, "flock exit ") {
		t.Errorf("after the break the script printed %q, want flock's failure (\"flock exit N\", N > 0)", line)
	}
	if line, _ := script.nextLine(30 * time.Second); line != "script-alive" {
		t.Errorf("after the break the script printed %q, want \"script-alive\": it was signalled itself", line)
	}
	// Control: the lock is free again for others once broken and gone.
	expectCode(t, "flock -n after the break", flockN(t, m.path("a/.lock")), 0)
}

// TestBreakStopsLockfsLockCommand: through a mount, lockfs lock notices a
// broken lock: COMMAND gets SIGTERM, lockfs lock exits 75 and says so, and
// the script that ran it goes on.
func TestBreakStopsLockfsLockCommand(t *testing.T) {
	requireRoot(t)
	m := mount(t)
	script := start(t, "sh", "-c", `"$@"; echo "exit $?"; echo script-alive`,
		"script", lockfsBin, "lock", m.path("a"), "--", "sh", "-c", holdCmd)
	if line, _ := script.nextLine(30 * time.Second); !strings.HasPrefix(line, "held ") {
		t.Fatalf("COMMAND said %q, want held; stderr %q", line, script.stderr.String())
	}
	if r := lockfs(t, 30*time.Second, "break", m.path("a")); r.code != 0 {
		t.Fatalf("lockfs break: %v", r)
	}
	var got []string
	for {
		line, ok := script.nextLine(30 * time.Second)
		if !ok {
			break
		}
		got = append(got, line)
	}
	if want := []string{"told", "exit 75", "script-alive"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("after the break: %q, want %q; stderr %q", got, want, script.stderr.String())
	}
	if !strings.Contains(script.stderr.String(), "lost") {
		t.Errorf("lockfs lock did not say the lock was lost: %q", script.stderr.String())
	}
}
