package fs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestPinFollowsTheName: a directory at the top of SOURCE is pinned by the
// first operation in it (pin.go), and later ones run in the pin only while
// its name still leads to it. Here d is replaced in SOURCE (moved to
// d.old, a new d made) while the kernel still holds its name and fresh
// attributes, so the next create through the mount reaches the daemon as a
// lookup and a create in the old node: it must land in the new d.
// Control: with the pin used unchecked, it lands in d.old.
func TestPinFollowsTheName(t *testing.T) {
	for _, c := range []struct {
		name    string
		checked bool
		want    string // where b must land, relative to SOURCE
	}{
		{"checked", true, "d/b"},
		{"control-unchecked", false, "d.old/b"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Restored after the unmount (cleanups run last first).
			t.Cleanup(func() { pinChecked = true })
			pinChecked = c.checked
			m := newPTMount(t)
			if err := os.Mkdir(filepath.Join(m.src, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(m.mnt, "d", "a"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if n := m.fs.pinCount(); n != 1 {
				t.Fatalf("%d directories pinned after a create in d, want 1", n)
			}
			// Fresh attributes of d in the kernel: the create below then
			// asks for none before its lookup.
			if _, err := os.Stat(filepath.Join(m.mnt, "d")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(m.src, "d"), filepath.Join(m.src, "d.old")); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(m.src, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(m.mnt, "d", "b"), []byte("b"), 0o644); err != nil {
				t.Fatalf("create of d/b after d was replaced in SOURCE: %v", err)
			}
			for _, p := range []string{"d/b", "d.old/b"} {
				_, err := os.Lstat(filepath.Join(m.src, p))
				if got, want := err == nil, p == c.want; got != want {
					t.Errorf("%s in SOURCE: exists %v, want %v", p, got, want)
				}
			}
		})
	}
}

// TestPinsBoundedAndReleased: one mount pins at most maxPins directories;
// the kernel's FORGETs (drop_caches) drop their pins, and the mount's end
// closes every descriptor it kept. Control for the count: the directories
// past maxPins are not pinned, so it can tell.
func TestPinsBoundedAndReleased(t *testing.T) {
	before := testutil.OpenFds(t)
	t.Cleanup(func() {
		// After the unmount and Close (cleanups run last first).
		if after := testutil.OpenFds(t); after > before {
			t.Errorf("%d descriptors open after the mount ended, %d before", after, before)
		}
	})
	m := newPTMount(t)
	dirs := maxPins + 10
	for i := 0; i < dirs; i++ {
		d := fmt.Sprintf("d%d", i)
		if err := os.Mkdir(filepath.Join(m.src, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.mnt, d, "f"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.fs.pinCount(); n != maxPins {
		t.Fatalf("%d directories pinned after a create in each of %d, want %d", n, dirs, maxPins)
	}
	dropCaches(t)
	deadline := time.Now().Add(30 * time.Second)
	for m.fs.pinCount() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := m.fs.pinCount(); n != 0 {
		t.Fatalf("%d directories still pinned after drop_caches, want 0", n)
	}
	// Pinned again by the next use, and closed by the mount's end.
	if err := os.WriteFile(filepath.Join(m.mnt, "d0", "g"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if n := m.fs.pinCount(); n != 1 {
		t.Fatalf("%d directories pinned after one more create, want 1", n)
	}
}
