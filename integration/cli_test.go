package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// lockfs runs the lockfs binary to completion.
func lockfs(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := command(ctx, lockfsBin, args...)
	cmd.Env = daemonEnv()
	return runCmd(t, ctx, cmd)
}

func TestMountRefusesBadPaths(t *testing.T) {
	requireFUSE(t)
	base := t.TempDir()
	src, mnt := filepath.Join(base, "src"), filepath.Join(base, "mnt")
	for _, d := range []string{src, mnt, filepath.Join(src, "sub")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(base, "file")
	os.WriteFile(file, nil, 0o644)
	link := filepath.Join(base, "link-to-sub")
	if err := os.Symlink(filepath.Join(src, "sub"), link); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing source", []string{"mount", filepath.Join(base, "nope"), mnt}, "does not exist"},
		{"source is a file", []string{"mount", file, mnt}, "not a directory"},
		{"missing mountpoint", []string{"mount", src, filepath.Join(base, "nope")}, "does not exist"},
		{"mountpoint is a file", []string{"mount", src, file}, "not a directory"},
		{"mountpoint inside source", []string{"mount", src, filepath.Join(src, "sub")}, "inside SOURCE"},
		{"mountpoint is source", []string{"mount", src, src}, "inside SOURCE"},
		{"mountpoint inside source through a symlink", []string{"mount", src, link}, "inside SOURCE"},
		{"unknown backend", []string{"mount", "--backend", "nfs", src, mnt}, "valid values are local, gcs"},
		{"gcs without a bucket", []string{"mount", "--backend", "gcs", src, mnt}, "--backend gcs needs --gcs-bucket"},
		{"one argument", []string{"mount", src}, "want two arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := lockfs(t, 30*time.Second, tc.args...)
			if r.code == 0 || r.timedOut || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("lockfs %q: want a non-zero exit and %q, got %v", tc.args, tc.want, r)
			}
			if isMounted(mnt) {
				runQuiet("fusermount3", "-uz", mnt)
				t.Fatal("something was mounted anyway")
			}
		})
	}
	// Control: the same directories, the right way round, mount.
	m := mount(t, withSource(src))
	expectCode(t, "flock -n on the good mount", flockN(t, m.path(".lock")), 0)
}

func TestRemoteSourceRefused(t *testing.T) {
	m1 := mount(t)
	// m1's mountpoint is a FUSE filesystem: as a SOURCE it is refused...
	mnt2 := filepath.Join(t.TempDir(), "mnt2")
	os.Mkdir(mnt2, 0o755)
	r := lockfs(t, 30*time.Second, "mount", m1.Mnt, mnt2)
	if r.code == 0 || !strings.Contains(r.stderr, "FUSE") || !strings.Contains(r.stderr, "--allow-remote-source") {
		t.Errorf("lockfs mount over a FUSE source: want a refusal naming FUSE and --allow-remote-source, got %v", r)
	}
	// ...unless allowed (control).
	m2 := startMount(t, m1.Mnt, mnt2, "--allow-remote-source")
	m2.waitReady()
	if code := m2.stop(20 * time.Second); code != 0 {
		t.Errorf("the allowed mount over a FUSE source exited %d on SIGTERM; log:\n%s", code, m2.logText())
	}
}

func TestHelpVersion(t *testing.T) {
	requireFUSE(t)
	for _, args := range [][]string{{"mount", "-h"}, {"unmount", "-h"}, {"version", "-h"}, {"-h"}} {
		r := lockfs(t, 10*time.Second, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage") {
			t.Errorf("lockfs %q: want usage on stdout and exit 0, got %v", args, r)
		}
	}
	r := lockfs(t, 10*time.Second, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "lockfs ") {
		t.Errorf("lockfs version: %v", r)
	}
}

func TestSignalStopReleasesAndUnmounts(t *testing.T) {
	m := mount(t)
	h := holder(t, m.path("a/.lock"), "-x")
	// Control: the lock is held, also in SOURCE.
	expectCode(t, "flock -n SOURCE/a/..LOCK while held through the mount", flockN(t, m.srcPath("a/..LOCK")), 1)

	start := time.Now()
	if code := m.stop(30 * time.Second); code != 0 {
		t.Errorf("lockfs exited %d on SIGTERM; want 0", code)
	}
	t.Logf("stopped in %v with a holder's file open on the mount", time.Since(start).Round(time.Millisecond))
	if isMounted(m.Mnt) {
		t.Errorf("%s is still mounted after SIGTERM", m.Mnt)
	}
	expectCode(t, "flock -n SOURCE/a/..LOCK after the daemon stopped", flockN(t, m.srcPath("a/..LOCK")), 0)
	for _, want := range []string{"stopping", "stopped"} {
		if !strings.Contains(m.logText(), want) {
			t.Errorf("log lacks %q:\n%s", want, m.logText())
		}
	}
	h.kill()
}

func TestUnmountCommand(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		m := mount(t)
		r := lockfs(t, 30*time.Second, "unmount", m.Mnt)
		if r.code != 0 || !strings.Contains(r.stdout, "unmounted") {
			t.Errorf("lockfs unmount: %v", r)
		}
		if code, ok := m.waitExit(20 * time.Second); !ok || code != 0 {
			t.Errorf("daemon after lockfs unmount: exited=%v code=%d; want a clean exit", ok, code)
		}
		// Control: now nothing is mounted there, and unmount says so.
		r = lockfs(t, 30*time.Second, "unmount", m.Mnt)
		if r.code == 0 || !strings.Contains(r.stderr, "not mounted") {
			t.Errorf("lockfs unmount of nothing: want \"not mounted\" and a non-zero exit, got %v", r)
		}
	})

	t.Run("busy", func(t *testing.T) {
		m := mount(t)
		h := holder(t, m.path("a/.lock"), "-x")
		r := lockfs(t, 30*time.Second, "unmount", m.Mnt)
		if r.code != 0 || !strings.Contains(r.stdout, "lazily") {
			t.Errorf("lockfs unmount of a busy mount: want a lazy detach, got %v", r)
		}
		if isMounted(m.Mnt) {
			t.Errorf("%s still in the mount table after a lazy unmount", m.Mnt)
		}
		h.kill()
		if code, ok := m.waitExit(20 * time.Second); !ok || code != 0 {
			t.Errorf("daemon after the last file closed: exited=%v code=%d; want a clean exit", ok, code)
		}
	})
}

func TestStaleMountRecovered(t *testing.T) {
	m := mount(t)
	m.cmd.Process.Kill()
	<-m.exited
	// Control: the mount is stale now.
	var st syscall.Statfs_t
	if err := syscall.Statfs(m.Mnt, &st); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("statfs of the mountpoint of a killed daemon: %v; want ENOTCONN", err)
	}
	m2 := startMount(t, m.Src, m.Mnt)
	m2.waitReady()
	expectCode(t, "flock -n a/.lock on the recovered mount", flockN(t, m2.path("a/.lock")), 0)
	if !strings.Contains(m2.logText(), "stale mount") {
		t.Errorf("the recovery was not logged:\n%s", m2.logText())
	}
	if code := m2.stop(20 * time.Second); code != 0 {
		t.Errorf("lockfs exited %d on SIGTERM", code)
	}
}

// runQuiet runs a command and ignores the outcome (for cleanups).
func runQuiet(name string, args ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	command(ctx, name, args...).Run()
}

// TestMountRefusesMountpointInsideSourceViaBind: with SOURCE reached
// through a bind mount (mount --bind S B; lockfs mount B S/inner), the
// paths are unrelated but MOUNTPOINT lies inside SOURCE; the same for a
// SOURCE inside MOUNTPOINT through a bind mount of MOUNTPOINT. Both are
// refused by device and inode (before the fix the first was mounted).
// Control: a bind mount of an unrelated directory as SOURCE mounts.
func TestMountRefusesMountpointInsideSourceViaBind(t *testing.T) {
	requireRoot(t)
	require(t, "mount", "umount")
	requireFUSE(t)
	base := t.TempDir()
	s, b, mnt, m2 := filepath.Join(base, "s"), filepath.Join(base, "b"), filepath.Join(base, "mnt"), filepath.Join(base, "m2")
	for _, d := range []string{filepath.Join(s, "inner"), b, filepath.Join(mnt, "sub"), m2} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bind := func(from, to string) {
		t.Helper()
		if r := run(t, 10*time.Second, "mount", "--bind", from, to); r.code != 0 {
			t.Fatalf("mount --bind %s %s: %v", from, to, r)
		}
		t.Cleanup(func() { runQuiet("umount", "-l", to) })
	}
	bind(s, b)
	bind(mnt, m2)
	for _, tc := range []struct {
		name      string
		src, mnt  string
		want      string
		mountedAt string
	}{
		{"mountpoint inside SOURCE through a bind mount of SOURCE", b, filepath.Join(s, "inner"), "inside SOURCE", filepath.Join(s, "inner")},
		{"SOURCE inside MOUNTPOINT through a bind mount of MOUNTPOINT", filepath.Join(m2, "sub"), mnt, "inside MOUNTPOINT", mnt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := lockfs(t, 30*time.Second, "mount", tc.src, tc.mnt)
			if r.code == 0 || r.timedOut || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("lockfs mount %s %s: want a non-zero exit and %q, got %v", tc.src, tc.mnt, tc.want, r)
			}
			if isMounted(tc.mountedAt) {
				runQuiet("fusermount3", "-uz", tc.mountedAt)
				t.Fatal("something was mounted anyway")
			}
		})
	}
	// Control: the bind mount of s as SOURCE, at a mountpoint outside it.
	m := mount(t, withSource(b))
	expectCode(t, "flock -n on the mount over the bind mount", flockN(t, m.path("inner/.lock")), 0)
}

// TestMountOptionFlag: lockfs mount -o takes the fstab options (the same
// table as mount.fuse.lockfs), ignoring mount(8)'s generic ones.
func TestMountOptionFlag(t *testing.T) {
	// The "mounted" line may be written a moment after the mount shows:
	// poll the log for it.
	logSays := func(m *Mount, s string) bool {
		return testutil.Poll(10*time.Second, func() bool { return strings.Contains(m.logText(), `msg="mounted `) }) &&
			strings.Contains(m.logText(), s)
	}
	m := mount(t, withArgs("-o", "on_lease_loss=SIGUSR1,_netdev,log-wait-over=2"))
	if !logSays(m, "on_lease_loss=SIGUSR1") {
		t.Errorf("-o on_lease_loss=SIGUSR1 not in effect; log:\n%s", m.logText())
	}
	// Control: without -o, the default.
	d := mount(t)
	if !logSays(d, "on_lease_loss=SIGTERM") {
		t.Errorf("default on_lease_loss not SIGTERM; log:\n%s", d.logText())
	}
}
