package main

import (
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Descriptors. Every file and directory open through the mount holds one
// descriptor of the daemon, and so do its lookups for a moment; the daemon
// raises its soft RLIMIT_NOFILE to the hard limit at start, and caps the
// handles each uid may hold (--max-open-per-uid, fs.Config.MaxOpenPerUID)
// so that one user reaching the cap gets EMFILE while the others are
// served.

// minOpenPerUID is the smallest automatic cap.
const minOpenPerUID = 64

// raiseNofile raises the soft descriptor limit to the hard one, as far as
// allowed, and returns the soft limit in force.
func raiseNofile(log logrus.FieldLogger) uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		log.WithError(err).Warn("reading the descriptor limit (RLIMIT_NOFILE)")
		return 1024
	}
	if lim.Cur < lim.Max {
		raised := unix.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err != nil {
			log.WithError(err).WithField("limit", lim.Cur).Warn("could not raise the descriptor limit (RLIMIT_NOFILE) to its hard limit")
			return lim.Cur
		}
		lim = raised
	}
	return lim.Cur
}

// maxOpenPerUID returns the per-uid cap for flag value v: v itself if
// v >= 0 (0: no cap), else a quarter of the descriptor limit nofile, so
// that four users at their cap still leave room for everyone's lookups.
func maxOpenPerUID(v int, nofile uint64) int {
	if v >= 0 {
		return v
	}
	n := nofile / 4
	if n < minOpenPerUID {
		n = minOpenPerUID
	}
	if n > 1<<30 {
		n = 1 << 30
	}
	return int(n)
}
