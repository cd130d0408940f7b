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
