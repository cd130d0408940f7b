package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend/gcstest"
)

// asNobody prefixes a command to run it as uid/gid 65534.
var asNobody = []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}

// TestDoctor: lockfs doctor passes as root on this (working) host, and as
// nobody names each problem a non-root mount would hit, with its fix,
// exiting 1; lockfs mount as nobody fails with the same message and mounts
// nothing. Which problems nobody hits depends on the host: the expectation
// is computed from /dev/fuse's mode and /etc/fuse.conf, the same facts the
// checks read.
func TestDoctor(t *testing.T) {
	requireFUSE(t)
	requireRoot(t)
	require(t, "setpriv")
	base := t.TempDir()
	src, mnt := filepath.Join(base, "src"), filepath.Join(base, "mnt")
	for _, d := range []string{src, mnt} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o777)
	}
	for d := base; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}

	r := run(t, 30*time.Second, lockfsBin, "doctor", src, mnt)
	if r.code != 0 || !strings.Contains(r.stdout, "ok  /dev/fuse") || strings.Contains(r.stdout, "FAIL") {
		t.Fatalf("doctor as root on a working host: %v", r)
	}
	if !strings.Contains(r.stdout, "ok    open files") && !strings.Contains(r.stdout, "ok  open files") {
		t.Errorf("doctor as root: no \"open files\" ok line (passthrough opens cost the daemon no descriptor here):\n%s", r.stdout)
	}

	// A non-empty MOUNTPOINT: doctor warns, naming what it would hide.
	if err := os.WriteFile(filepath.Join(mnt, "hidden-by-the-mount"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(t, 30*time.Second, lockfsBin, "doctor", src, mnt); r.code != 0 || !strings.Contains(r.stdout, "warn  MOUNTPOINT contents") ||
		!strings.Contains(r.stdout, "hidden-by-the-mount") {
		t.Errorf("doctor with a non-empty MOUNTPOINT: %v", r)
	}
	os.Remove(filepath.Join(mnt, "hidden-by-the-mount"))

	fi, err := os.Stat("/dev/fuse")
	if err != nil {
		t.Fatal(err)
	}
	devOpen := fi.Mode().Perm()&0o006 == 0o006
	conf, _ := os.ReadFile("/etc/fuse.conf")
	allowOther := false
	for _, l := range strings.Split(string(conf), "\n") {
		allowOther = allowOther || strings.TrimSpace(l) == "user_allow_other"
	}
	r = run(t, 30*time.Second, asNobody[0], append(asNobody[1:], lockfsBin, "doctor", "--allow-other", src, mnt)...)
	if r.code != 1 || !strings.Contains(r.stderr, "checks failed") && !strings.Contains(r.stderr, "check failed") {
		t.Fatalf("doctor as nobody: %v", r)
	}
	expect := map[string]bool{
		"FAIL  /dev/fuse":              !devOpen,
		"FAIL  --allow-other":          !allowOther,
		"FAIL  admin socket directory": true, // /run/lockfs is root's
	}
	for line, want := range expect {
		if strings.Contains(r.stdout, line) != want {
			t.Errorf("doctor as nobody: %q shown = %v, want %v:\n%s", line, !want, want, r.stdout)
		}
	}
	for line, fix := range map[string]string{"FAIL  /dev/fuse": "chmod 0666 /dev/fuse",
		"FAIL  --allow-other": "echo user_allow_other >> /etc/fuse.conf", "FAIL  admin socket directory": "--admin-dir"} {
		if expect[line] && !strings.Contains(r.stdout, fix) {
			t.Errorf("doctor as nobody gives no fix (%q) for %q:\n%s", fix, line, r.stdout)
		}
	}

	// lockfs mount as nobody stops at the first of those, with the same words.
	m := run(t, 30*time.Second, asNobody[0], append(asNobody[1:], lockfsBin, "mount", "--allow-other", src, mnt)...)
	if m.code == 0 || isMounted(mnt) {
		t.Fatalf("mount as nobody: %v (mounted: %v)", m, isMounted(mnt))
	}
	first := ""
	for _, line := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(line, "FAIL") {
			first = strings.TrimSpace(line[strings.Index(line, "  ")+2:])
			first = strings.TrimSpace(first[strings.Index(first, "  ")+2:])
			break
		}
	}
	if first == "" || !strings.Contains(m.stderr, first) {
		t.Errorf("mount as nobody said %q, doctor's first failure is %q", m.stderr, first)
	}
}

// TestDoctorGCS: with --backend gcs, doctor proves the bucket usable, and
// fails, naming the bucket, on one that does not exist (the control). On
// fake-gcs-server: gcsemu creates a missing bucket on the first write.
func TestDoctorGCS(t *testing.T) {
	emu := gcstest.StartKind(t, gcstest.FakeGCSServer)
	ok := run(t, 90*time.Second, lockfsBin, "doctor", "--backend", "gcs", "--gcs-bucket", emu.Bucket, "--gcs-endpoint", emu.Endpoint())
	if ok.code != 0 || !strings.Contains(ok.stdout, "gcs bucket "+emu.Bucket) || strings.Contains(ok.stdout, "FAIL") {
		t.Errorf("doctor with the emulator's bucket: %v", ok)
	}
	bad := run(t, 90*time.Second, lockfsBin, "doctor", "--backend", "gcs", "--gcs-bucket", "lockfs-no-such-bucket", "--gcs-endpoint", emu.Endpoint())
	if bad.code != 1 || !strings.Contains(bad.stdout, "FAIL") || !strings.Contains(bad.stdout, "lockfs-no-such-bucket") {
		t.Errorf("doctor with a bucket that does not exist: %v", bad)
	}
}

// TestMountNonEmptyWarning: mounting over a non-empty MOUNTPOINT works and
// warns, naming what the mount hides; the control is an empty one, which
// does not warn.
func TestMountNonEmptyWarning(t *testing.T) {
	base := t.TempDir()
	src, mnt := filepath.Join(base, "src"), filepath.Join(base, "mnt")
	for _, d := range []string{filepath.Join(src, "a"), mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(mnt, "under-the-mount.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, src, mnt)
	m.waitReady()
	if !strings.Contains(m.logText(), "MOUNTPOINT is not empty") || !strings.Contains(m.logText(), "under-the-mount.txt") {
		t.Errorf("no warning about the hidden entries; log:\n%s", m.logText())
	}
	if empty := mount(t); strings.Contains(empty.logText(), "MOUNTPOINT is not empty") {
		t.Errorf("warning on an empty MOUNTPOINT; log:\n%s", empty.logText())
	}
}
