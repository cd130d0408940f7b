package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set at build time:
//
//	go build -ldflags "-X main.version=v1.2.3" ./cmd/lockfs
//
// When empty, the module version from the build information is used.
var version string

// Version returns the version of this binary: the -ldflags value, else the
// main module's version and VCS revision from the build information, else
// "(devel)".
func Version() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	v := info.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "-dirty"
			}
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		v += " " + rev + modified
	}
	return v
}

const versionUsage = `Usage: lockfs version

Print the version of lockfs and of the Go toolchain that built it.
`

func runVersion(args []string, stdout, stderr io.Writer) error {
	c := newCommand("version", versionUsage)
	pos, err := c.parse(args, stdout)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	fmt.Fprintf(stdout, "lockfs %s (%s %s/%s)\n", Version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
