package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestMountFlagsInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		wantPos   []string
		wantOther bool
	}{
		{[]string{"src", "mnt"}, []string{"src", "mnt"}, false},
		{[]string{"--allow-other", "src", "mnt"}, []string{"src", "mnt"}, true},
		{[]string{"src", "--allow-other", "mnt"}, []string{"src", "mnt"}, true},
		{[]string{"src", "mnt", "--allow-other"}, []string{"src", "mnt"}, true},
		{[]string{"--", "-src", "mnt"}, []string{"-src", "mnt"}, false},
		{[]string{"src", "--", "--allow-other"}, []string{"src", "--allow-other"}, false},
	} {
		cmd := newMountCmd()
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Errorf("parse(%q): %v", tc.args, err)
			continue
		}
		other, _ := cmd.Flags().GetBool("allow-other")
		if pos := cmd.Flags().Args(); strings.Join(pos, "|") != strings.Join(tc.wantPos, "|") || other != tc.wantOther {
			t.Errorf("parse(%q) = %q, allow-other %v; want %q, %v", tc.args, pos, other, tc.wantPos, tc.wantOther)
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
		{[]string{"mont"}, exitUsage, `did you mean "mount"?`},
		{[]string{"mount"}, exitUsage, "want two arguments"},
		{[]string{"mount", "--backend", "nfs", "a", "b"}, exitUsage, `--backend "nfs": valid values are local, gcs`},
		{[]string{"mount", "--backend", "gcs", "a", "b"}, exitUsage, `--backend gcs needs --gcs-bucket`},
		{[]string{"mount", "--gcs-bucket", "x", "a", "b"}, exitUsage, `need --backend gcs`},
		{[]string{"mount", "--log-format", "xml", "a", "b"}, exitUsage, "--log-format"},
		{[]string{"mount", "--log-level", "loud", "a", "b"}, exitUsage, "--log-level"},
		{[]string{"mount", "--on-lease-loss", "SIGNOPE", "a", "b"}, exitUsage, "--on-lease-loss"},
		{[]string{"mount", "--no-such-flag", "a", "b"}, exitUsage, "no-such-flag"},
		{[]string{"mount", "--allow-othr", "a", "b"}, exitUsage, "did you mean --allow-other?"},
		{[]string{"mount", "--lease-ttl", "30x", "a", "b"}, exitUsage, "want seconds (30, 1.5) or a duration with a unit (30s"},
		{[]string{"mount", "--backend", "gcs", "--gcs-bucket", "b", "--lease-ttl", "0", "a", "b"}, exitUsage, "--lease-ttl 0: want 100ms or more (default 30s)"},
		{[]string{"mount", "-o", "backend=gcs,gcs_bucket=b,lease_ttl=0", "a", "b"}, exitUsage, "with 0 every lock would be lost"},
		{[]string{"lock", "--backend", "gcs", "--gcs-bucket", "b", "--lease-ttl", "0.05", "d", "true"}, exitUsage, "--lease-ttl 50ms: want 100ms or more"},
		{[]string{"mount", "-o", "no_such_option", "a", "b"}, exitUsage, `unknown mount option "no_such_option"`},
		{[]string{"mount", "-o", "lease_ttl=forever", "a", "b"}, exitUsage, `option lease_ttl: invalid argument "forever" for "--lease-ttl" flag: want seconds`},
		{[]string{"mount", "-o", "backend=nfs", "a", "b"}, exitUsage, `--backend "nfs"`},
		{[]string{"mount", "-o", "log-file=/x", "a", "b"}, exitUsage, "mount helper"},
		{[]string{"unmount"}, exitUsage, "MOUNTPOINT"},
		{[]string{"version", "extra"}, exitUsage, "unexpected argument"},
		{[]string{"help", "nosuch"}, exitUsage, "unknown help topic nosuch"},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut)
		if code != tc.wantCode || !strings.Contains(errOut.String(), tc.wantErr) {
			t.Errorf("run(%q) = %d, stderr %q; want %d and %q", tc.args, code, errOut.String(), tc.wantCode, tc.wantErr)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // on stdout
	}{
		{[]string{"-h"}, "Usage:"},
		{[]string{"--help"}, "Available Commands:"},
		{[]string{"help"}, "Available Commands:"},
		{[]string{"mount", "-h"}, "lockfs mount [flags] SOURCE MOUNTPOINT"},
		{[]string{"mount", "--help"}, "lockfs mount [flags] SOURCE MOUNTPOINT"},
		{[]string{"help", "mount"}, "lockfs mount [flags] SOURCE MOUNTPOINT"},
		{[]string{"help", "status"}, "lockfs status [--json] [MOUNTPOINT|PATH...]"},
		{[]string{"unmount", "-h"}, "lockfs unmount MOUNTPOINT"},
		{[]string{"version", "-h"}, "Usage:"},
		{[]string{"-V"}, "lockfs "},
		{[]string{"--version"}, "lockfs "},
		{[]string{"version"}, "lockfs "},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != exitOK {
			t.Errorf("run(%q) = %d, stderr %q; want 0", tc.args, code, errOut.String())
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("run(%q): stdout %q does not contain %q", tc.args, out.String(), tc.want)
		}
	}
	// Control: help for one command is not the top-level help.
	var out bytes.Buffer
	run([]string{"help", "mount"}, &out, &bytes.Buffer{})
	if strings.Contains(out.String(), "Available Commands:") {
		t.Errorf("help mount printed the top-level help:\n%s", out.String())
	}
	version = "v9.9.9-test"
	defer func() { version = "" }()
	if Version() != "v9.9.9-test" {
		t.Errorf("Version() = %q, want the -ldflags value", Version())
	}
	out.Reset()
	run([]string{"-V"}, &out, &bytes.Buffer{})
	if !strings.HasPrefix(out.String(), "lockfs v9.9.9-test ") {
		t.Errorf("lockfs -V = %q, want the -ldflags version", out.String())
	}
}

func TestMountHelpListsFlags(t *testing.T) {
	var out bytes.Buffer
	run([]string{"mount", "-h"}, &out, &bytes.Buffer{})
	for _, f := range []string{"--backend", "--allow-other", "--allow-remote-source", "--log-level", "--log-format", "--on-lease-loss", "-o, --options"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("mount -h does not mention %s:\n%s", f, out.String())
		}
	}
}

func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "bash completion", "zsh": "#compdef lockfs", "fish": "complete -c lockfs"} {
		var out, errOut bytes.Buffer
		if code := run([]string{"completion", shell}, &out, &errOut); code != exitOK || !strings.Contains(out.String(), want) {
			t.Errorf("completion %s = %d (stderr %q), output without %q", shell, code, errOut.String(), want)
		}
	}
	// No shell, or one lockfs has no script for, is a bad command line.
	for _, args := range [][]string{{"completion"}, {"completion", "powershell"}, {"completion", "bash", "zsh"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "want one shell: bash, zsh, fish") {
			t.Errorf("%q = %d, stderr %q; want %d and the shells", args, code, errOut.String(), exitUsage)
		}
	}
}

// TestCompletionValues: shell completion offers the values of the flags
// that take one of a few.
func TestCompletionValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"mount", "--backend", ""}, backends},
		{[]string{"doctor", "--backend", ""}, backends},
		{[]string{"mount", "--passthrough", ""}, []string{"auto", "off"}},
		{[]string{"mount", "--log-format", ""}, []string{"text", "json"}},
		{[]string{"lock", "--kind", ""}, kinds},
		{[]string{"lock", "--backend", ""}, lockBackends},
		{[]string{"break", "--kind", ""}, kinds},
		{[]string{"completion", ""}, shells},
		{[]string{"help", "loc"}, []string{"lock"}},
	} {
		var out bytes.Buffer
		run(append([]string{"__completeNoDesc"}, tc.args...), &out, &bytes.Buffer{})
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if !strings.HasPrefix(l, ":") && l != "" {
				got = append(got, l)
			}
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("completion of %q: %q, want %q", tc.args, got, tc.want)
		}
	}
}

// TestHelpUnknownTopic: "lockfs help nosuch" is a bad command line, as
// "lockfs nosuch" is (it printed the main help and exited 0).
func TestHelpUnknownTopic(t *testing.T) {
	for _, args := range [][]string{{"help", "nosuch"}, {"nosuch"}, {"help", "mount", "extra"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "nosuch") && !strings.Contains(errOut.String(), "unknown") {
			t.Errorf("%q = %d, stderr %q; want %d and an error", args, code, errOut.String(), exitUsage)
		}
	}
	var out bytes.Buffer
	if code := run([]string{"help", "lock"}, &out, &bytes.Buffer{}); code != exitOK || !strings.Contains(out.String(), "lockfs lock [flags] TARGET") {
		t.Errorf("help lock (control) = %d, %q", code, out.String())
	}
}

func TestManPages(t *testing.T) {
	dir := t.TempDir()
	var errOut bytes.Buffer
	if code := run([]string{"gen-man", dir}, &bytes.Buffer{}, &errOut); code != exitOK {
		t.Fatalf("gen-man = %d: %s", code, errOut.String())
	}
	for _, page := range []string{"lockfs.1", "lockfs-mount.1", "lockfs-status.1", "lockfs-unmount.1", "lockfs-lock.1", "lockfs-completion.1"} {
		b, err := os.ReadFile(filepath.Join(dir, page))
		if err != nil {
			t.Errorf("gen-man wrote no %s: %v", page, err)
			continue
		}
		// Each page is titled by its command, and has the sections a
		// man page reader looks for.
		title := strings.ToUpper(strings.TrimSuffix(page, ".1"))
		if !bytes.HasPrefix(b, []byte(".TH \""+strings.ReplaceAll(title, "-", `\-`)+"\" 1 ")) {
			t.Errorf("%s is not titled %s(1):\n%.200s", page, title, b)
		}
		for _, sect := range []string{".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH OPTIONS", ".SH EXIT STATUS", ".SH SEE ALSO"} {
			if !bytes.Contains(b, []byte("\n"+sect+"\n")) {
				t.Errorf("%s has no %s section", page, sect)
			}
		}
		if bytes.Contains(b, []byte("[=false]")) || bytes.Contains(b, []byte("=true]")) {
			t.Errorf("%s shows a boolean's value in brackets", page)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "lockfs-completion-powershell.1")); err == nil {
		t.Error("gen-man wrote a powershell page")
	}
	read := func(page string) string {
		b, _ := os.ReadFile(filepath.Join(dir, page))
		return string(b)
	}
	if m := read("lockfs-mount.1"); !strings.Contains(m, `allow\-remote\-source`) || !strings.Contains(m, ".SH FILES") || !strings.Contains(m, "fusermount3") {
		t.Errorf("lockfs-mount.1 lacks the mount flags, FILES or fusermount3(1)")
	}
	if r := read("lockfs.1"); !strings.Contains(r, ".B lockfs\nCOMMAND [flags]") || !strings.Contains(r, ".SH COMMANDS") {
		t.Errorf("lockfs.1's synopsis has no COMMAND, or it lists no commands:\n%s", r)
	}
	// The TARGET table is kept line for line, not filled into a
	// paragraph; the exit statuses are a section of their own.
	l := read("lockfs-lock.1")
	if !strings.Contains(l, ".nf\nTARGET is one of:\n  DIR  ") || !strings.Contains(l, `  \-\-source SOURCE DIR`) {
		t.Errorf("lockfs-lock.1 does not keep the TARGET table verbatim:\n%s", l)
	}
	if _, exit, _ := strings.Cut(l, ".SH EXIT STATUS\n"); !strings.Contains(exit, "66 if TARGET") || !strings.Contains(l, "flock(1)") ||
		!strings.Contains(l, ".SH ENVIRONMENT") || !strings.Contains(l, "LOCKFS_TOKEN") {
		t.Errorf("lockfs-lock.1 lacks its EXIT STATUS, ENVIRONMENT or SEE ALSO flock(1)")
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"30": 30 * time.Second, "1.5": 1500 * time.Millisecond, "0": 0, "30s": 30 * time.Second,
		"2m": 2 * time.Minute, "1h30m": 90 * time.Minute, "250ms": 250 * time.Millisecond,
	} {
		if got, err := parseDuration(in); err != nil || got != want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "30x", "-1", "-5s", "1,5"} {
		if _, err := parseDuration(in); err == nil {
			t.Errorf("parseDuration(%q): no error", in)
		}
	}
}

func TestMountOptionsFromOneTable(t *testing.T) {
	// Every flag of lockfs mount is an option, and the command line wins.
	cmd := newMountCmd()
	if err := cmd.ParseFlags([]string{"--gcs-bucket", "cli"}); err != nil {
		t.Fatal(err)
	}
	flags := cmd.Flags()
	set, _, err := parseMountOptions("backend=gcs,gcs_bucket=opt,lease_ttl=12,allow_other,nofail", flags, flags.Changed)
	if err != nil {
		t.Fatal(err)
	}
	if len(set) != 4 {
		t.Errorf("options = %+v, want 4", set)
	}
	get := func(name string) string { return flags.Lookup(name).Value.String() }
	if get("backend") != "gcs" || get("gcs-bucket") != "cli" || get("lease-ttl") != "12s" || get("allow-other") != "true" {
		t.Errorf("after -o: backend %s bucket %s ttl %s allow-other %s", get("backend"), get("gcs-bucket"), get("lease-ttl"), get("allow-other"))
	}
	var missing []string
	flags.VisitAll(func(f *pflag.Flag) {
		if notOptions[f.Name] {
			return
		}
		opt := f.Name
		if f.NoOptDefVal == "" {
			opt += "=" + f.DefValue
		}
		if _, _, err := optionsToFlags(opt); err != nil {
			missing = append(missing, opt+": "+err.Error())
		}
	})
	if len(missing) > 0 {
		t.Errorf("flags of lockfs mount that the mount helper refuses: %q", missing)
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

// TestSdNotifyAbstract: "@name" in $NOTIFY_SOCKET is an abstract socket
// (how systemd names it in some setups); the datagram arrives whole.
func TestSdNotifyAbstract(t *testing.T) {
	name := fmt.Sprintf("lockfs-test-notify-%d", os.Getpid())
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: "\x00" + name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv(notifySocketEnv, "@"+name)
	if err := sdNotify("READY=1\nSTATUS=x"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	ln.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, _, err := ln.ReadFromUnix(buf)
	if err != nil || string(buf[:n]) != "READY=1\nSTATUS=x" {
		t.Fatalf("received %q, %v", buf[:n], err)
	}
	// Without the variable nothing is sent and nothing fails.
	t.Setenv(notifySocketEnv, "")
	if err := sdNotify("READY=1"); err != nil {
		t.Fatal(err)
	}
}
