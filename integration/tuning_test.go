package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"
)

// readaheadOf reads the kernel readahead (KiB) of the filesystem mounted at
// mnt, from the mount's device in /proc/self/mountinfo.
func readaheadOf(t *testing.T, mnt string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	dev := ""
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == mnt {
			dev = f[2]
		}
	}
	if dev == "" {
		t.Fatalf("%s is not in /proc/self/mountinfo", mnt)
	}
	ra, err := os.ReadFile(filepath.Join("/sys/class/bdi", dev, "read_ahead_kb"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ra))
}

// The daemon raises the mount's readahead to 4 MiB (it runs as root here),
// and sequential reads through the mount still return SOURCE's bytes.
// Control: --readahead-kb 0 leaves FUSE's 128 KiB, so the test can tell.
func TestReadaheadRaised(t *testing.T) {
	requireRoot(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 9<<16) // 9 MiB: more than one window
	m := mount(t, withSetup(func(src string) {
		if err := os.WriteFile(filepath.Join(src, "big"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}))
	// The daemon raises it just after the mount appears, which is all
	// that mount() waits for.
	if !testutil.Poll(10*time.Second, func() bool { return readaheadOf(t, m.Mnt) == "4096" }) {
		t.Errorf("readahead of the mount: %s KiB, want 4096", readaheadOf(t, m.Mnt))
	}
	// Read it as cat would, with the page cache of SOURCE dropped so that
	// the reads go to the disk in parallel.
	fd, err := unix.Open(m.srcPath("big"), unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
	unix.Close(fd)
	r := run(t, 30*time.Second, "cat", m.path("big"))
	if r.code != 0 || r.stdout != string(data) {
		t.Fatalf("cat through the mount: %s; got %d bytes, want the %d bytes of SOURCE", r, len(r.stdout), len(data))
	}

	c := mount(t, withArgs("--readahead-kb", "0"))
	if got := readaheadOf(t, c.Mnt); got != "128" {
		t.Errorf("readahead with --readahead-kb 0: %s KiB, want the kernel's 128", got)
	}
}
