package fs

import (
	"bytes"
	"math/rand"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestNoPTReadsGoBySplice: without passthrough, a file's reads reach the
// daemon, which answers those of 32 KiB and more by splice(2) from SOURCE
// (Config.SpliceReads with SpliceReadsOption): a 4 MiB file read through
// the mount returns SOURCE's bytes, cold and again after its cache was
// dropped, and the connection counts its reads as spliced. Control: with
// SpliceReads off the same reads return the same bytes and none is spliced.
func TestNoPTReadsGoBySplice(t *testing.T) {
	const size = 4<<20 + 100
	data := make([]byte, size)
	rand.New(rand.NewSource(7)).Read(data)
	for _, splice := range []bool{true, false} {
		m := newPTMountAt(t, t.TempDir(), t.TempDir(), withPassthrough(false), func(c *Config) { c.SpliceReads = splice })
		if err := os.WriteFile(m.s("f"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		for round := 0; round < 2; round++ {
			got, err := testutil.ReadNoPoll(m.m("f"))
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("splice %v, round %d: read %d bytes through the mount, not SOURCE's %d", splice, round, len(got), size)
			}
			// Drop the mount's cache, so that the next round reads
			// through the daemon again.
			fd, err := unix.Open(m.m("f"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			err = unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
			unix.Close(fd)
			if err != nil {
				t.Fatal(err)
			}
		}
		n := m.conn.SplicedReads()
		switch {
		case splice && n < 8:
			t.Errorf("%d reads answered by splice for two reads of 4 MiB, want at least 8 (4 each of about 1 MiB)", n)
		case !splice && n != 0:
			t.Errorf("control, SpliceReads off: %d reads answered by splice, want 0", n)
		}
		t.Logf("splice %v: %d reads answered by splice", splice, n)
	}
}

// TestSpliceReadCap: the mount's max_read is what a pipe carries (1020 KiB
// with the default pipe-max-size), and no cap at all where pipes are so
// small that the cap would split every large read into many requests.
func TestSpliceReadCap(t *testing.T) {
	for _, tc := range []struct{ max, want int }{
		{1020 << 10, 1020 << 10},
		{spliceCapMin, spliceCapMin},
		{60 << 10, 0}, // pipe-max-size 64 KiB
		{0, 0},        // pipe-max-size unreadable
	} {
		if got := spliceReadCap(tc.max); got != tc.want {
			t.Errorf("spliceReadCap(%d) = %d, want %d", tc.max, got, tc.want)
		}
	}
}
