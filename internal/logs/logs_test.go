package logs

import (
	"testing"

	"github.com/sirupsen/logrus"
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

// TestDebugEnabled: the level of a logger, or of an entry's logger, says.
func TestDebugEnabled(t *testing.T) {
	l, _ := logtest.NewNullLogger()
	l.SetLevel(logrus.InfoLevel)
	if DebugEnabled(l) || DebugEnabled(l.WithField("k", "v")) {
		t.Error("an info logger (or its entry) reported debug enabled")
	}
	l.SetLevel(logrus.DebugLevel)
	if !DebugEnabled(l) || !DebugEnabled(l.WithField("k", "v")) {
		t.Error("a debug logger (or its entry) reported debug disabled")
	}
}
