package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFuseConfAllowsOther: only an uncommented user_allow_other line counts.
func TestFuseConfAllowsOther(t *testing.T) {
	dir := t.TempDir()
	for conf, want := range map[string]bool{
		"# user_allow_other\nmount_max = 1000\n": false, // Debian's default: commented out
		"mount_max = 1000\nuser_allow_other\n":   true,
		"  user_allow_other  # for lockfs\n":     true,
		"user_allow_others\n":                    false,
		"":                                       false,
	} {
		p := filepath.Join(dir, "fuse.conf")
		if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := fuseConfAllowsOther(p); err != nil || got != want {
			t.Errorf("fuse.conf %q: %v, %v; want %v", conf, got, err, want)
		}
	}
}

// TestNonEmptyNote: an empty mountpoint hides nothing; a full one names
// what it hides, a few entries and the count.
func TestNonEmptyNote(t *testing.T) {
	dir := t.TempDir()
	if note := nonEmptyNote(dir); note != "" {
		t.Fatalf("empty directory: %q", note)
	}
	if err := os.WriteFile(filepath.Join(dir, "b"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if note := nonEmptyNote(dir); !strings.Contains(note, "its 1 entry (b)") || !strings.Contains(note, "it is not deleted") {
		t.Errorf("one entry: %q", note)
	}
	for _, n := range []string{"a", "c", "d", "e", "f", "g"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	note := nonEmptyNote(dir)
	if !strings.Contains(note, "its 7 entries (a, b, c, d, e, ...)") {
		t.Errorf("note %q", note)
	}
}
