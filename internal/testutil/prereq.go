package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run under CI=true, where a missing
// prerequisite or an unavailable figure fails instead of being skipped.
// It is the one place that reads CI.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing reports a missing prerequisite (root, a program, FUSE): it fails
// t under CI=true, where every prerequisite must be there and a skipped
// test would hide a failure, and skips t elsewhere.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("prerequisite missing under CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireTools calls Missing unless every named program is on PATH.
func RequireTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			Missing(t, "%s is not installed: %v", tool, err)
		}
	}
}

// RequireRoot calls Missing unless the test runs as root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
}
