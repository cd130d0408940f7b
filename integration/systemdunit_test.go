package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSystemdUnit: the unit that `make install` generates from
// contrib/systemd/lockfs@.service.in is one systemd accepts (systemd-analyze
// verify, with the binary and man pages it names present), is Type=notify,
// and keeps systemd-analyze security's exposure at 5.0 or below (9.6 before
// the hardening; --threshold is on a 0-100 scale).
func TestSystemdUnit(t *testing.T) {
	require(t, "systemd-analyze")
	tmpl, err := os.ReadFile("../contrib/systemd/lockfs@.service.in")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	unit := strings.ReplaceAll(string(tmpl), "@BINDIR@", filepath.Dir(lockfsBin))
	if strings.Contains(unit, "@BINDIR@") {
		t.Fatal("template placeholder left in the unit")
	}
	for _, want := range []string{"\nType=notify\n", "\nLimitNOFILE=1048576\n", "\nAssertPathIsDirectory=%f\n",
		"\nExecStart=" + lockfsBin + " mount "} {
		if !strings.Contains(unit, want) {
			t.Errorf("the unit lacks %q", strings.TrimSpace(want))
		}
	}
	path := filepath.Join(dir, "lockfs@srv-locked.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	man := filepath.Join(dir, "man")
	if r := run(t, 30*time.Second, lockfsBin, "gen-man", filepath.Join(man, "man1")); r.code != 0 {
		t.Fatalf("lockfs gen-man: %v", r)
	}
	verify := command(t.Context(), "systemd-analyze", "verify", path)
	verify.Env = append(os.Environ(), "MANPATH="+man)
	if r := runCmd(t, t.Context(), verify); r.code != 0 || strings.TrimSpace(r.stderr) != "" {
		t.Errorf("systemd-analyze verify: %v", r)
	}
	if r := run(t, 30*time.Second, "systemd-analyze", "security", "--offline=yes", "--threshold=50", path); r.code != 0 {
		t.Errorf("systemd-analyze security above 5.0: %v", r)
	} else {
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		t.Log(lines[len(lines)-1])
	}
}
