package main

import (
	"os"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Descriptors. Every file and directory open through the mount holds one
// descriptor of the daemon, and so do its lookups for a moment, each lock
// the local backend holds (its ..LOCK file) and each process's byte-range
// locks on a file. So that a process through the mount reaches its own
// RLIMIT_NOFILE before the daemon runs out, as on a local filesystem, the
// daemon raises its own limit as far as the kernel lets it: soft and hard
// to fs.nr_open (the ceiling of every process's limit) when it may raise
// its hard limit (root, CAP_SYS_RESOURCE), else the soft limit to the hard
// one. It then caps the handles each uid may hold (--max-open-per-uid,
// fs.Config.MaxOpenPerUID) so that one user reaching the cap gets EMFILE
// while the others are served.

// minOpenPerUID is the smallest automatic cap.
const minOpenPerUID = 64

// nrOpen is where the kernel says the largest descriptor limit a process
// may have.
const nrOpen = "/proc/sys/fs/nr_open"

// raiseNofile raises the descriptor limit as far as allowed and returns
// the soft limit in force.
func raiseNofile(log logrus.FieldLogger) uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		log.WithError(err).Warn("reading the descriptor limit (RLIMIT_NOFILE)")
		return 1024
	}
	if ceiling := readNrOpen(); ceiling > lim.Max {
		raised := unix.Rlimit{Cur: ceiling, Max: ceiling}
		if unix.Setrlimit(unix.RLIMIT_NOFILE, &raised) == nil {
			return ceiling
		}
		// Not allowed (no CAP_SYS_RESOURCE): the hard limit it is.
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

// readNrOpen returns fs.nr_open, 0 if it cannot be read.
func readNrOpen() uint64 {
	b, err := os.ReadFile(nrOpen)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// maxOpenPerUID returns the per-uid cap for flag value v: v itself if
// v >= 0 (0: no cap); else, from the daemon's descriptor limit nofile, a
// quarter of it when other users share the mount (allowOther), so that
// four users at their cap still leave room for everyone's lookups, and
// seven eighths of it when only the mounting user can use it, the rest
// being the daemon's own (lookups, held locks).
func maxOpenPerUID(v int, nofile uint64, allowOther bool) int {
	if v >= 0 {
		return v
	}
	n := nofile - nofile/8
	if allowOther {
		n = nofile / 4
	}
	if n < minOpenPerUID {
		n = minOpenPerUID
	}
	if n > 1<<30 {
		n = 1 << 30
	}
	return int(n)
}
