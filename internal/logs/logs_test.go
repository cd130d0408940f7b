package logs

import (
	"testing"

	logtest "github.com/sirupsen/logrus/hooks/test"
)

// TestOrDiscard: a logger given is the logger used; nil gets one that
// writes nowhere.
func TestOrDiscard(t *testing.T) {
	l, hook := logtest.NewNullLogger()
	OrDiscard(l).Info("kept")
	if len(hook.Entries) != 1 {
		t.Fatalf("the given logger got %d lines, want 1", len(hook.Entries))
	}
	OrDiscard(nil).Info("dropped") // must not panic, must not write to stderr
}
