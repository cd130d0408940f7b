package main

import (
	"bytes"
	"strings"
	"syscall"
	"testing"
)

func TestParseInterspersedFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		wantPos   []string
		wantOther bool
	}{
		{[]string{"src", "mnt"}, []string{"src", "mnt"}, false},
		{[]string{"--allow-other", "src", "mnt"}, []string{"src", "mnt"}, true},
		{[]string{"src", "--allow-other", "mnt"}, []string{"src", "mnt"}, true},
		{[]string{"src", "mnt", "-allow-other"}, []string{"src", "mnt"}, true},
		{[]string{"--", "-src", "mnt"}, []string{"-src", "mnt"}, false},
		{[]string{"src", "--", "--allow-other"}, []string{"src", "--allow-other"}, false},
	} {
		c := newCommand("mount", "")
		other := c.flags.Bool("allow-other", false, "")
		pos, err := c.parse(tc.args, &bytes.Buffer{})
		if err != nil {
			t.Errorf("parse(%q): %v", tc.args, err)
			continue
		}
		if strings.Join(pos, "|") != strings.Join(tc.wantPos, "|") || *other != tc.wantOther {
			t.Errorf("parse(%q) = %q, allow-other %v; want %q, %v", tc.args, pos, *other, tc.wantPos, tc.wantOther)
		}
	}
}

func TestRunUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		wantCode int
		wantErr  string
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"mount"}, exitUsage, "want two arguments"},
		{[]string{"mount", "--backend", "nfs", "a", "b"}, exitUsage, `--backend "nfs": valid values are local, gcs`},
		{[]string{"mount", "--backend", "gcs", "a", "b"}, exitUsage, `--backend gcs needs --gcs-bucket`},
		{[]string{"mount", "--gcs-bucket", "x", "a", "b"}, exitUsage, `need --backend gcs`},
		{[]string{"mount", "--log-format", "xml", "a", "b"}, exitUsage, "--log-format"},
		{[]string{"mount", "--log-level", "loud", "a", "b"}, exitUsage, "--log-level"},
		{[]string{"mount", "--on-lease-loss", "SIGNOPE", "a", "b"}, exitUsage, "--on-lease-loss"},
		{[]string{"mount", "--no-such-flag", "a", "b"}, exitUsage, "no-such-flag"},
		{[]string{"unmount"}, exitUsage, "MOUNTPOINT"},
		{[]string{"version", "extra"}, exitUsage, "unexpected argument"},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut)
		if code != tc.wantCode || !strings.Contains(errOut.String(), tc.wantErr) {
			t.Errorf("run(%q) = %d, stderr %q; want %d and %q", tc.args, code, errOut.String(), tc.wantCode, tc.wantErr)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"mount", "-h"}, {"unmount", "-h"}, {"version", "-h"}, {"mount", "--help"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != exitOK {
			t.Errorf("run(%q) = %d, stderr %q; want 0", args, code, errOut.String())
		}
		if !strings.Contains(out.String(), "Usage") && !strings.Contains(out.String(), "Usage:") {
			t.Errorf("run(%q): no usage text on stdout: %q", args, out.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"version"}, &out, &errOut); code != exitOK || !strings.HasPrefix(out.String(), "lockfs ") {
		t.Errorf("version = %d, %q", code, out.String())
	}
	version = "v9.9.9-test"
	defer func() { version = "" }()
	if Version() != "v9.9.9-test" {
		t.Errorf("Version() = %q, want the -ldflags value", Version())
	}
}

func TestMountHelpListsFlags(t *testing.T) {
	var out bytes.Buffer
	run([]string{"mount", "-h"}, &out, &bytes.Buffer{})
	for _, f := range []string{"-backend", "-allow-other", "-allow-remote-source", "-log-level", "-log-format", "-on-lease-loss"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("mount -h does not mention %s:\n%s", f, out.String())
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{
		"SIGTERM": syscall.SIGTERM, "term": syscall.SIGTERM, "KILL": syscall.SIGKILL,
		"SIGUSR1": syscall.SIGUSR1, "15": syscall.SIGTERM, "none": 0, "NONE": 0,
	} {
		got, err := parseSignal(in)
		if err != nil || got != want {
			t.Errorf("parseSignal(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "SIGNOPE", "0", "-1", "65"} {
		if _, err := parseSignal(in); err == nil {
			t.Errorf("parseSignal(%q): no error", in)
		}
	}
}

func TestWithin(t *testing.T) {
	for _, tc := range []struct {
		path, dir string
		want      bool
	}{
		{"/a/b", "/a", true},
		{"/a", "/a", true},
		{"/ab", "/a", false},
		{"/a", "/a/b", false},
		{"/x", "/", true},
	} {
		if got := within(tc.path, tc.dir); got != tc.want {
			t.Errorf("within(%q, %q) = %v, want %v", tc.path, tc.dir, got, tc.want)
		}
	}
}

func TestParseMountinfo(t *testing.T) {
	line := `36 35 0:52 / /tmp/my\040mnt rw,nosuid,nodev,relatime shared:1 - fuse.lockfs /srv/src rw,user_id=0,group_id=0`
	m, ok := parseMountinfo(line)
	if !ok || m.Mountpoint != "/tmp/my mnt" || m.Dev != "0:52" || m.Type != "fuse.lockfs" || m.Source != "/srv/src" || !m.isFUSE() {
		t.Errorf("parseMountinfo = %+v, %v", m, ok)
	}
	m, ok = parseMountinfo(`22 27 0:21 / /proc rw,relatime - proc proc rw`)
	if !ok || m.Mountpoint != "/proc" || m.Type != "proc" || m.isFUSE() {
		t.Errorf("parseMountinfo(proc) = %+v, %v", m, ok)
	}
	if _, ok := parseMountinfo("garbage"); ok {
		t.Error("parseMountinfo(garbage) ok")
	}
	if got := unescapeOctal(`a\134b\011c\`); got != "a\\b\tc\\" {
		t.Errorf("unescapeOctal = %q", got)
	}
}
