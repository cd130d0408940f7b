package main

import (
	"runtime"
	"testing"
)

// TestRaiseGOMAXPROCS: the mount adds readerPs to the runtime's default;
// the GOMAXPROCS environment variable keeps the runtime's value (control).
func TestRaiseGOMAXPROCS(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })

	t.Setenv("GOMAXPROCS", "")
	raiseGOMAXPROCS()
	if got := runtime.GOMAXPROCS(0); got != orig+readerPs {
		t.Errorf("GOMAXPROCS %d after raiseGOMAXPROCS, want %d + %d", got, orig, readerPs)
	}

	runtime.GOMAXPROCS(orig)
	t.Setenv("GOMAXPROCS", "3")
	raiseGOMAXPROCS()
	if got := runtime.GOMAXPROCS(0); got != orig {
		t.Errorf("with GOMAXPROCS=3 in the environment, raiseGOMAXPROCS changed GOMAXPROCS to %d (was %d)", got, orig)
	}
}
