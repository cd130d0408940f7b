package sessioncfg

import (
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/clock"
)

// fixedClock is a clock that is not clock.Boot.
type fixedClock struct{}

func (fixedClock) Now() time.Duration { return 0 }
func (fixedClock) Timer(time.Duration) (<-chan struct{}, func()) {
	return make(chan struct{}), func() {}
}

// Zero fields take the defaults; set ones are kept (the control).
func TestHostDefaults(t *testing.T) {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "host"
	}
	id, clk := HostDefaults("", nil)
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(h) + `-[0-9a-f]{8}$`).MatchString(id) {
		t.Errorf("default host id %q, want %s- and 8 hex digits", id, h)
	}
	if _, ok := clk.(clock.Boot); !ok {
		t.Errorf("default clock %T, want clock.Boot", clk)
	}
	id, clk = HostDefaults("h1", fixedClock{})
	if id != "h1" {
		t.Errorf("host id %q, want h1 kept", id)
	}
	if _, ok := clk.(fixedClock); !ok {
		t.Errorf("clock %T, want the given fixedClock kept", clk)
	}
}
