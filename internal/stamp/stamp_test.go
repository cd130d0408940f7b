package stamp

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestProgramStampsAnInterval runs Program twice, one after the other, and
// reads their spans: each is a real interval, the second after the first.
func TestProgramStampsAnInterval(t *testing.T) {
	testutil.RequireTools(t, "python3")
	file := filepath.Join(t.TempDir(), "stamps")
	for _, tag := range []string{"A", "B"} {
		out, err := exec.Command("python3", "-c", Program, tag, file, "0.05").Output()
		if err != nil {
			t.Fatalf("%s: %v", tag, err)
		}
		if strings.TrimSpace(string(out)) != "held" {
			t.Fatalf("%s printed %q, want held", tag, out)
		}
	}
	spans, err := Spans(file)
	if err != nil {
		t.Fatal(err)
	}
	a, b := spans["A"], spans["B"]
	if len(spans) != 2 || !(a[0] < a[1] && a[1] <= b[0] && b[0] < b[1]) {
		t.Errorf("spans %v: want A's interval, then B's", spans)
	}
}

func TestSpansRefusesOtherLines(t *testing.T) {
	file := filepath.Join(t.TempDir(), "stamps")
	if err := os.WriteFile(file, []byte("A 1.5\nnot a stamp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Spans(file); err == nil {
		t.Error("no error for a line that is not a stamp")
	}
}
