package localbackend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/lockmgr"
)

// emptyDir fails the test if dir has any entry.
func emptyDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("%s was created in %s, outside SOURCE", e.Name(), dir)
	}
}

func TestSymlinkedDirectoryCannotEscape(t *testing.T) {
	src := newSource(t, "d")
	outside := t.TempDir()
	if err := os.Mkdir(filepath.Join(outside, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(src, "evil")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d", filepath.Join(src, "alias")); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, src)
	for _, p := range []string{"evil", "evil/sub", "alias"} {
		for _, k := range []lockmgr.Kind{lockmgr.KindDir, lockmgr.KindNewDir, lockmgr.KindUsage} {
			if l, err := b.Claim(context.Background(), lockmgr.LockID{Path: p, Kind: k}, lockmgr.Exclusive, true); err == nil {
				l.Release(context.Background())
				t.Errorf("claim %s %s through a symlink succeeded", p, k)
			}
		}
	}
	emptyDir(t, filepath.Join(outside, "sub"))
	os.Remove(filepath.Join(outside, "sub"))
	emptyDir(t, outside)
	if _, err := os.Lstat(filepath.Join(src, "d", "..LOCK")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("claim through the symlink alias created d/..LOCK: %v", err)
	}

	// Control: an ordinary open follows the symlink and creates the file
	// outside SOURCE.
	f, err := os.OpenFile(filepath.Join(src, "evil", "..LOCK"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := os.Stat(filepath.Join(outside, "..LOCK")); err != nil {
		t.Fatalf("control: a plain open did not escape: %v", err)
	}
}

func TestSymlinkedBackingFileCannotEscape(t *testing.T) {
	src := newSource(t, "d")
	outside := t.TempDir()
	target := filepath.Join(outside, "target")
	if err := os.Symlink(target, filepath.Join(src, "d", "..LOCK")); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, src)
	if _, err := b.Claim(context.Background(), dirID("d"), lockmgr.Shared, false); err == nil {
		t.Fatal("claim through a symlinked backing file succeeded")
	}
	emptyDir(t, outside)

	// Control: an ordinary O_CREAT open follows it.
	f, err := os.OpenFile(filepath.Join(src, "d", "..LOCK"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := os.Stat(target); err != nil {
		t.Fatalf("control: a plain open did not escape: %v", err)
	}
}

// A hard link planted under a backing name must not let NextToken overwrite
// the linked file.
func TestHardLinkedBackingFileRefused(t *testing.T) {
	src := newSource(t, "d")
	secret := filepath.Join(src, "secret")
	if err := os.WriteFile(secret, []byte("keep me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(secret, filepath.Join(src, "d", "..LOCK")); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, src)
	if l, err := b.Claim(context.Background(), dirID("d"), lockmgr.Exclusive, false); err == nil {
		l.NextToken(context.Background())
		t.Error("claim on a hard-linked backing file succeeded")
	}
	if got, _ := os.ReadFile(secret); string(got) != "keep me\n" {
		t.Fatalf("linked file changed: %q", got)
	}
}

func TestNonRegularBackingFileRefused(t *testing.T) {
	src := newSource(t, "fifo", "dir")
	if err := unix.Mkfifo(filepath.Join(src, "fifo", "..LOCK"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "dir", "..LOCK"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, src)
	for _, p := range []string{"fifo", "dir"} {
		if _, err := b.Claim(context.Background(), dirID(p), lockmgr.Exclusive, false); err == nil {
			t.Errorf("claim on a %s backing file succeeded", p)
		}
	}
}
