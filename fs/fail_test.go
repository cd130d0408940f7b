package fs

import (
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// TestFailLogsAtItsLevel: a routine errno is answered without a log entry
// when debug is off (and without allocating one), and logged when debug is
// on (the control); a failure that is not routine is logged at Warn.
func TestFailLogsAtItsLevel(t *testing.T) {
	for _, wrap := range []string{"logger", "entry"} {
		t.Run(wrap, func(t *testing.T) {
			l, hook := test.NewNullLogger()
			l.SetOutput(io.Discard)
			f := &FS{log: l}
			if wrap == "entry" {
				f.log = l.WithField("mount", "/m")
			}
			lookup := func() {
				if got := f.fail("lookup", "a/b", syscall.ENOENT); got != syscall.ENOENT {
					t.Fatalf("fail returned %v, want ENOENT", got)
				}
			}

			l.SetLevel(logrus.InfoLevel)
			if n := testing.AllocsPerRun(100, lookup); n != 0 {
				t.Errorf("routine failure at Info: %v allocations, want 0", n)
			}
			if n := len(hook.AllEntries()); n != 0 {
				t.Errorf("routine failure at Info: %d log entries, want 0", n)
			}

			l.SetLevel(logrus.DebugLevel)
			lookup()
			e := hook.LastEntry()
			if e == nil || e.Level != logrus.DebugLevel || e.Data["errno"] != "ENOENT" || e.Data["path"] != "a/b" {
				t.Fatalf("routine failure at Debug: entry %+v, want one at debug with errno ENOENT and path a/b", e)
			}

			hook.Reset()
			l.SetLevel(logrus.InfoLevel)
			err := fmt.Errorf("read: %w", syscall.EIO)
			if got := f.fail("read", "a/b", err); got != syscall.EIO {
				t.Fatalf("fail returned %v, want EIO", got)
			}
			if es := hook.AllEntries(); len(es) != 1 || es[0].Level != logrus.WarnLevel || es[0].Data["errno"] != "EIO" {
				t.Fatalf("EIO at Info: entries %+v, want one warning with errno EIO", es)
			}
		})
	}
}
