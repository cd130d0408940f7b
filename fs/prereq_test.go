package fs

import (
	"os"
	"os/exec"
	"testing"
)

// requireTools skips the test when one of the named programs is missing,
// and fails it under CI=true, where every prerequisite must be installed
// (a skipped test there would hide a failure).
func requireTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing(t, "%s is not installed: %v", tool, err)
		}
	}
}

// requireRoot skips the test unless it runs as root, and fails it under
// CI=true.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "needs root")
	}
}

// missing reports a missing prerequisite: a failure under CI=true, a skip
// elsewhere.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing under CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}
