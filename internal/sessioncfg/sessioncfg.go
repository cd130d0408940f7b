// Package sessioncfg is the configuration a network backend's host
// session shares between gcsbackend and etcdbackend: its timing (TTL,
// refresh interval, margin, request timeout, how long the store may fail),
// their defaults and the rules between them, the host id and the clock.
package sessioncfg

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lockfs/lockfs/internal/clock"
)

// Timing is a session's timing.
type Timing struct {
	TTL, RefreshInterval, Margin, RequestTimeout, UnavailableAfter time.Duration
}

// Defaults fills t's zero fields: the refresh interval TTL/3, the margin
// TTL/10, the request timeout the smaller of requestTimeout and TTL/3,
// UnavailableAfter unavailableAfter. The TTL must be set.
func (t *Timing) Defaults(requestTimeout, unavailableAfter time.Duration) {
	if t.RefreshInterval == 0 {
		t.RefreshInterval = t.TTL / 3
	}
	if t.Margin == 0 {
		t.Margin = t.TTL / 10
	}
	if t.RequestTimeout == 0 {
		t.RequestTimeout = min(requestTimeout, t.TTL/3)
	}
	if t.UnavailableAfter == 0 {
		t.UnavailableAfter = unavailableAfter
	}
}

// Check reports timing that cannot work, its message starting with pkg: a
// TTL under minTTL, a refresh interval not under TTL/2 (one failed refresh
// must be retried before the TTL ends), a margin not under TTL/4, a request
// timeout not under TTL-Margin, UnavailableAfter not positive.
func (t Timing) Check(pkg string, minTTL time.Duration) error {
	switch {
	case t.TTL < minTTL:
		return fmt.Errorf("%s: TTL %v is under %v", pkg, t.TTL, minTTL)
	case t.RefreshInterval <= 0 || t.RefreshInterval >= t.TTL/2:
		return fmt.Errorf("%s: refresh interval %v must be positive and under TTL/2 (%v)", pkg, t.RefreshInterval, t.TTL/2)
	case t.Margin <= 0 || t.Margin >= t.TTL/4:
		return fmt.Errorf("%s: margin %v must be positive and under TTL/4 (%v)", pkg, t.Margin, t.TTL/4)
	case t.RequestTimeout <= 0 || t.RequestTimeout >= t.TTL-t.Margin:
		return fmt.Errorf("%s: request timeout %v must be positive and under TTL-margin (%v)", pkg, t.RequestTimeout, t.TTL-t.Margin)
	case t.UnavailableAfter <= 0:
		return fmt.Errorf("%s: UnavailableAfter %v must be positive", pkg, t.UnavailableAfter)
	}
	return nil
}

// DefaultHostID is the hostname, "-", and 8 random hex digits: a
// restarted daemon is a new host.
func DefaultHostID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "host"
	}
	return h + "-" + RandomHex(4)
}

// HostDefaults returns id and clk, each replaced by its default where it
// is zero: DefaultHostID() and the host's CLOCK_BOOTTIME (clock.Boot).
func HostDefaults(id string, clk clock.Clock) (string, clock.Clock) {
	if id == "" {
		id = DefaultHostID()
	}
	if clk == nil {
		clk = clock.Boot{}
	}
	return id, clk
}

// CheckHostID reports a host id that is not printable UTF-8 of at most
// 200 bytes, its message starting with pkg.
func CheckHostID(pkg, id string) error {
	if len(id) > 200 || strings.ContainsFunc(id, func(r rune) bool { return r < ' ' || r == 0x7f }) || !utf8.ValidString(id) {
		return fmt.Errorf("%s: HostID %q must be printable UTF-8 of at most 200 bytes", pkg, id)
	}
	return nil
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("sessioncfg: no randomness: " + err.Error())
	}
	return hex.EncodeToString(b)
}
