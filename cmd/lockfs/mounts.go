package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	Mountpoint string
	Dev        string // "MAJ:MIN" of the mounted filesystem
	Type       string // "fuse.lockfs", "ext4"...
	Source     string
}

// isFUSE reports whether the mount is a FUSE filesystem.
func (m mountEntry) isFUSE() bool { return m.Type == "fuse" || strings.HasPrefix(m.Type, "fuse.") }

// mountsAt returns the mounts whose mountpoint is path (an absolute, clean
// path), last mounted last.
func mountsAt(path string) ([]mountEntry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	var out []mountEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		m, ok := parseMountinfo(sc.Text())
		if ok && m.Mountpoint == path {
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// parseMountinfo parses one mountinfo line:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// Field 3 is the device, field 5 the mountpoint; after the "-" separator come the type and source.
func parseMountinfo(line string) (mountEntry, bool) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
		return mountEntry{}, false
	}
	return mountEntry{
		Mountpoint: unescapeOctal(f[4]),
		Dev:        f[2],
		Type:       unescapeOctal(f[sep+1]),
		Source:     unescapeOctal(f[sep+2]),
	}, true
}

// unescapeOctal undoes the kernel's \ooo escaping of spaces, tabs, newlines
// and backslashes in the mount table.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// lockfsMounts returns the mountpoints of every lockfs mount.
func lockfsMounts() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		if m, ok := parseMountinfo(sc.Text()); ok && m.Type == "fuse.lockfs" {
			out = append(out, m.Mountpoint)
		}
	}
	return out, sc.Err()
}
