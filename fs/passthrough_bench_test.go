package fs

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkPTStat measures stat(2) of a file and of a directory through
// the mount with the chosen attribute validity and with a 1 s one for
// files, against stat(2) in SOURCE directly:
//
//	go test -run XXX -bench PTStat ./fs/
func BenchmarkPTStat(b *testing.B) {
	for _, c := range []struct {
		name      string
		fileValid time.Duration
	}{{"chosen", fileAttrValid}, {"file1s", time.Second}} {
		b.Run(c.name, func(b *testing.B) {
			saved := fileAttrValid
			fileAttrValid = c.fileValid
			defer func() { fileAttrValid = saved }()
			m := newPTMount(b)
			if err := os.WriteFile(m.s("f"), []byte("x"), 0o644); err != nil {
				b.Fatal(err)
			}
			if err := os.Mkdir(m.s("d"), 0o755); err != nil {
				b.Fatal(err)
			}
			for _, p := range []struct{ name, path string }{
				{"file", m.m("f")}, {"dir", m.m("d")}, {"source-file", m.s("f")},
			} {
				b.Run(p.name, func(b *testing.B) {
					var st unix.Stat_t
					for i := 0; i < b.N; i++ {
						if err := unix.Stat(p.path, &st); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}
