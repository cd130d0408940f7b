package fs

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// goMode and unixPerm carry setuid, setgid and sticky both ways, each bit
// on its own flag; a mode without them carries none (the control).
func TestModeSpecialBits(t *testing.T) {
	for _, c := range []struct {
		unix uint32
		mode os.FileMode
	}{
		{0, 0},
		{unix.S_ISUID, os.ModeSetuid},
		{unix.S_ISGID, os.ModeSetgid},
		{unix.S_ISVTX, os.ModeSticky},
		{unix.S_ISUID | unix.S_ISGID | unix.S_ISVTX, os.ModeSetuid | os.ModeSetgid | os.ModeSticky},
	} {
		m := goMode(unix.S_IFREG | c.unix | 0o640)
		if want := c.mode | 0o640; m != want {
			t.Errorf("goMode(%#o) = %v, want %v", unix.S_IFREG|c.unix|0o640, m, want)
		}
		if p, want := unixPerm(c.mode|0o640), c.unix|0o640; p != want {
			t.Errorf("unixPerm(%v) = %#o, want %#o", c.mode|0o640, p, want)
		}
	}
}
