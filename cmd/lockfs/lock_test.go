package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

func TestParseLockArgs(t *testing.T) {
	def := lockFlags{conflictCode: 1, kind: "dir"}
	for _, tc := range []struct {
		name string
		lf   func(*lockFlags)
		args []string
		want lockRequest
	}{
		{"exclusive by default", nil, []string{"d", "cmd", "-x"}, lockRequest{target: "d", mode: lockmgr.Exclusive, kind: lockmgr.KindDir, command: []string{"cmd", "-x"}}},
		{"-- is dropped", func(l *lockFlags) { l.shared = true }, []string{"d", "--", "cmd"}, lockRequest{target: "d", mode: lockmgr.Shared, kind: lockmgr.KindDir, command: []string{"cmd"}}},
		{"-c", func(l *lockFlags) { l.shellCommand = "echo hi" }, []string{"d"}, lockRequest{target: "d", mode: lockmgr.Exclusive, kind: lockmgr.KindDir, command: []string{"/bin/sh", "-c", "echo hi"}}},
		{"TARGET -c", nil, []string{"d", "-c", "echo hi"}, lockRequest{target: "d", mode: lockmgr.Exclusive, kind: lockmgr.KindDir, command: []string{"/bin/sh", "-c", "echo hi"}}},
		{"-c after --", nil, []string{"d", "--", "-c", "x"}, lockRequest{target: "d", mode: lockmgr.Exclusive, kind: lockmgr.KindDir, command: []string{"-c", "x"}}},
		{"usage kind", func(l *lockFlags) { l.kind = "usage" }, []string{"d", "cmd"}, lockRequest{target: "d", mode: lockmgr.Exclusive, kind: lockmgr.KindUsage, command: []string{"cmd"}}},
		{"control file", nil, []string{"m/d/.lock", "cmd"}, lockRequest{target: "m/d", mode: lockmgr.Exclusive, kind: lockmgr.KindDir, command: []string{"cmd"}}},
		{"newdir control file", nil, []string{"m/d/.lock_newdir", "cmd"}, lockRequest{target: "m/d", mode: lockmgr.Exclusive, kind: lockmgr.KindNewDir, command: []string{"cmd"}}},
		{"usage control file, --kind agrees", func(l *lockFlags) { l.kind, l.kindSet = "usage", true }, []string{"d/.lock_usage", "cmd"}, lockRequest{target: "d", mode: lockmgr.Exclusive, kind: lockmgr.KindUsage, command: []string{"cmd"}}},
		{"a relative control file", nil, []string{".lock", "cmd"}, lockRequest{target: ".", mode: lockmgr.Exclusive, kind: lockmgr.KindDir, command: []string{"cmd"}}},
		{"-w 0 is -n", func(l *lockFlags) { l.waitSet = true }, []string{"d", "cmd"}, lockRequest{target: "d", mode: lockmgr.Exclusive, kind: lockmgr.KindDir, nonblock: true, command: []string{"cmd"}}},
		{"-w 2", func(l *lockFlags) { l.waitSet, l.wait = true, 2*time.Second }, []string{"d", "cmd"}, lockRequest{target: "d", mode: lockmgr.Exclusive, kind: lockmgr.KindDir, wait: 2 * time.Second, command: []string{"cmd"}}},
		{"-o", func(l *lockFlags) { l.closeFD = true }, []string{"d", "cmd"}, lockRequest{target: "d", mode: lockmgr.Exclusive, kind: lockmgr.KindDir, command: []string{"cmd"}}},
	} {
		lf := def
		if tc.lf != nil {
			tc.lf(&lf)
		}
		got, err := parseLockArgs(lf, tc.args)
		if err != nil || got.target != tc.want.target || got.mode != tc.want.mode || got.kind != tc.want.kind ||
			got.nonblock != tc.want.nonblock || got.wait != tc.want.wait ||
			strings.Join(got.command, "|") != strings.Join(tc.want.command, "|") {
			t.Errorf("%s: parseLockArgs = %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		lf   func(*lockFlags)
		args []string
	}{
		{"no args", nil, nil},
		{"no command", nil, []string{"d"}},
		{"only --", nil, []string{"d", "--"}},
		{"-s and -x", func(l *lockFlags) { l.shared, l.exclusive = true, true }, []string{"d", "cmd"}},
		{"-n and -w", func(l *lockFlags) { l.nonblock, l.wait = true, time.Second }, []string{"d", "cmd"}},
		{"-E 300", func(l *lockFlags) { l.conflictCode = 300 }, []string{"d", "cmd"}},
		{"bad kind", func(l *lockFlags) { l.kind = "file" }, []string{"d", "cmd"}},
		{"shared usage", func(l *lockFlags) { l.kind, l.shared = "usage", true }, []string{"d", "cmd"}},
		{"TARGET -c with two", nil, []string{"d", "-c", "x", "y"}},
		{"-c and COMMAND", func(l *lockFlags) { l.shellCommand = "x" }, []string{"d", "cmd"}},
		{"backend nfs", func(l *lockFlags) { l.backend = "nfs" }, []string{"d", "cmd"}},
		{"gcs without bucket", func(l *lockFlags) { l.backend = "gcs" }, []string{"d", "cmd"}},
		{"gcs flags without gcs", func(l *lockFlags) { l.gcs.bucket = "b" }, []string{"d", "cmd"}},
		{"source and gcs", func(l *lockFlags) { l.backend, l.source, l.gcs.bucket = "gcs", "/s", "b" }, []string{"d", "cmd"}},
		{"-u", func(l *lockFlags) { l.unlock = true }, []string{"d", "cmd"}},
		{"--kind and the control file disagree", func(l *lockFlags) { l.kind, l.kindSet = "newdir", true }, []string{"d/.lock", "cmd"}},
		{"shared on a usage control file", func(l *lockFlags) { l.shared = true }, []string{"d/.lock_usage", "cmd"}},
	} {
		lf := def
		lf.gcs.ttl = 30 * time.Second
		if tc.lf != nil {
			tc.lf(&lf)
		}
		if _, err := parseLockArgs(lf, tc.args); !errors.Is(err, errUsage) {
			t.Errorf("%s: parseLockArgs(%q) = %v, want a usage error", tc.name, tc.args, err)
		}
	}
}

func TestLockUsageExitCode(t *testing.T) {
	for _, args := range [][]string{{"lock"}, {"lock", "-q", "d", "true"}, {"lock", "-w", "soon", "d", "true"}, {"lock", "d"},
		{"lock", "-u", "d", "true"}, {"lock", "--unlock", "d", "true"}} {
		if code := run(args, &strings.Builder{}, &strings.Builder{}); code != exitUsage {
			t.Errorf("run(%q) = %d, want %d (EX_USAGE, as flock(1))", args, code, exitUsage)
		}
	}
}

// TestLockFlockSpellings: flock(1)'s other names of the flags parse to the
// same flags.
func TestLockFlockSpellings(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
		want string
	}{
		{[]string{"-e"}, "exclusive", "true"},
		{[]string{"-x"}, "exclusive", "true"},
		{[]string{"--nb"}, "nonblock", "true"},
		{[]string{"--nonblock"}, "nonblock", "true"},
		{[]string{"--wait", "3"}, "timeout", "3s"},
		{[]string{"--wait=1.5"}, "timeout", "1.5s"},
		{[]string{"--timeout", "2m"}, "timeout", "2m0s"},
		{[]string{"-o"}, "close", "true"},
		{[]string{"--close"}, "close", "true"},
		{[]string{"-u"}, "unlock", "true"},
		{nil, "exclusive", "false"}, // control: unset without a flag
		{nil, "timeout", "0"},
	} {
		cmd := newLockCmd()
		if err := cmd.ParseFlags(append(tc.args, "d", "true")); err != nil {
			t.Errorf("parse %q: %v", tc.args, err)
			continue
		}
		if got := cmd.Flags().Lookup(tc.flag).Value.String(); got != tc.want {
			t.Errorf("parse %q: --%s = %s, want %s", tc.args, tc.flag, got, tc.want)
		}
	}
}

func TestYouLine(t *testing.T) {
	st := []byte("you holder token=17\nlock a/.lock\nkind dir\nmode exclusive\nholder host=h pid=5 uid=0 mode=exclusive since=2026-01-01T00:00:00Z token=17 explicit you\n")
	if tok, lost, ok := youLine(st); tok != 17 || lost || !ok {
		t.Errorf("youLine = %d, %v, %v; want 17, false, true", tok, lost, ok)
	}
	if tok, lost, ok := youLine([]byte("you holder token=9 lost\nlock a/.lock\n")); tok != 9 || !lost || !ok {
		t.Errorf("youLine(lost) = %d, %v, %v", tok, lost, ok)
	}
	if _, _, ok := youLine([]byte("lock a/.lock\nholder mode=shared hidden\n")); ok {
		t.Error("youLine found a you line in a status without one")
	}
	now, _ := time.Parse(time.RFC3339, "2026-01-01T00:01:00Z")
	if d := describeHolders(st, now); !strings.Contains(d, "held exclusive by host h pid 5") || !strings.Contains(d, "for 1m0s") {
		t.Errorf("describeHolders = %q", d)
	}
}

func TestDescribeClaim(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	got := describeClaim(lockmgr.ParseClaimRecord("host=h2 mode=exclusive since=2026-12-01T09:58:00Z session=h2.ab state=live use=claimed"), now)
	if want := []string{"claimed exclusive by host h2 for 2m0s (session live)"}; !slices.Equal(got, want) {
		t.Errorf("another host's claim: %q, want %q", got, want)
	}
	// This host's own records and dead sessions' block nobody.
	for _, c := range []string{
		"host=h1 mode=exclusive since=2026-12-01T09:58:00Z session=h1.cd state=live use=held",
		"host=h1 mode=shared since=2026-12-01T09:58:00Z session=h1.cd state=live use=warm",
		"host=h3 mode=exclusive since=2026-12-01T09:58:00Z session=h3.ef state=dead use=claimed",
	} {
		if got := describeClaim(lockmgr.ParseClaimRecord(c), now); got != nil {
			t.Errorf("describeClaim(%q) = %q, want nothing", c, got)
		}
	}
	st := []byte("lock a/.lock\nmode exclusive\nclaim host=h2 mode=exclusive since=2026-12-01T09:58:00Z session=h2.ab state=live use=claimed\n")
	if got := describeHolders(st, now); got != "claimed exclusive by host h2 for 2m0s (session live)" {
		t.Errorf("describeHolders with a remote claim: %q", got)
	}
}
