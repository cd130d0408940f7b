// Package logs holds lockfs's one logging default: a nil logger discards.
package logs

import (
	"io"

	"github.com/sirupsen/logrus"
)

// OrDiscard returns log, or a logger that discards every line when log is
// nil: every Config's Logger field means this by nil.
func OrDiscard(log logrus.FieldLogger) logrus.FieldLogger {
	if log != nil {
		return log
	}
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// DebugEnabled reports whether log writes debug lines, so that a caller
// can skip building a line nobody keeps. A logger of another kind than
// logrus's own is assumed to keep them.
func DebugEnabled(log logrus.FieldLogger) bool {
	switch l := log.(type) {
	case *logrus.Logger:
		return l.IsLevelEnabled(logrus.DebugLevel)
	case *logrus.Entry:
		return l.Logger.IsLevelEnabled(logrus.DebugLevel)
	}
	return true
}
