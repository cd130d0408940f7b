package bench

import (
	"os"
	"os/exec"
	"testing"
)

// TestCPUSeconds: a process that spins for a while has used CPU time by
// cpuSeconds' count, and one that has not run yet, nearly none; a process
// that is not there is an error (the control).
func TestCPUSeconds(t *testing.T) {
	before, err := cpuSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for spin := 0; spin < 2e9 && x >= 0; spin++ {
		x += spin & 1
	}
	after, err := cpuSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 0.05 {
		t.Errorf("after a busy loop (%d): %.2f s of CPU, then %.2f s; want at least 0.05 s more", x, before, after)
	}

	sleeper := exec.Command("sleep", "10")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	if idle, err := cpuSeconds(sleeper.Process.Pid); err != nil || idle > 0.05 {
		t.Errorf("a new sleep(1): %.2f s of CPU, %v; want about 0", idle, err)
	}

	// A pid above pid_max names no process.
	if _, err := cpuSeconds(1 << 23); err == nil {
		t.Error("cpuSeconds of a process that is not there: no error")
	}
}
