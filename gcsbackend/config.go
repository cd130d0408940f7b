package gcsbackend

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/internal/clock"
	"github.com/lockfs/lockfs/internal/sessioncfg"
)

// Defaults.
const (
	// DefaultTTL is the default lease TTL.
	DefaultTTL = 30 * time.Second
	// MinTTL is the shortest lease TTL Validate accepts.
	MinTTL = 100 * time.Millisecond
	// DefaultRequestTimeout bounds one GCS request unless the lease's
	// remaining validity is shorter.
	DefaultRequestTimeout = 5 * time.Second
	// DefaultUnavailableAfter is how long GCS may fail to answer before a
	// claim gives up with lockmgr.ErrUnavailable.
	DefaultUnavailableAfter = 10 * time.Second
	// DefaultWarmFor is how long a released claim stays warm.
	DefaultWarmFor = 30 * time.Second
	// DefaultWantPoll is how often a host with records reads its bell for
	// waiters' requests: a want is noticed within about this long, and an
	// idle host holding locks pays one read per poll besides its
	// heartbeats (docs/GCS-PROTOCOL.md §10: 1.6 s keeps a holding host
	// under $2 a month at list prices with the default TTL).
	DefaultWantPoll = 1600 * time.Millisecond
)

// Config configures a gcs Backend. Only Bucket is required; every other
// zero field takes the default its comment gives.
type Config struct {
	// Bucket is the GCS bucket that holds the lock objects. Every daemon
	// sharing one lock namespace names the same bucket and Prefix.
	Bucket string

	// Prefix is prepended to every object name, so one bucket can hold
	// several namespaces (e.g. "team-a/"). A missing trailing "/" is added.
	// Default: "" (objects live under "locks/" at the bucket's root).
	Prefix string

	// Endpoint is the JSON API endpoint of a GCS emulator, such as
	// "http://127.0.0.1:4443/storage/v1/"; a bare "http://127.0.0.1:4443"
	// (no path) or one ending in "/storage/v1" means the same. It is the only way to turn
	// authentication off. Empty means real GCS, with Application Default
	// Credentials; New then refuses to run if STORAGE_EMULATOR_HOST is set,
	// because the client library would silently drop authentication and
	// talk to whatever that variable names.
	Endpoint string

	// TTL is the session time to live. A host stops vouching for its
	// claims TTL-Margin after its last heartbeat that landed was sent;
	// other hosts declare its session dead once they have seen it
	// unchanged for TTL, so a crashed host's locks outlive its last
	// heartbeat by at least TTL. Default: DefaultTTL (30s).
	TTL time.Duration

	// RefreshInterval is how often the session's heartbeat is written
	// (each time give or take a tenth, at random, to spread hosts). GCS
	// allows about one write per second to one object: keep it at 1s or
	// more. It must be
	// less than TTL/2 (so that one failed refresh can be retried before the
	// claim lapses) and less than TTL-Margin. Default: TTL/3.
	RefreshInterval time.Duration

	// Margin is how long before its TTL a holder stops vouching for its
	// claim. With the observer's extra RefreshInterval it is the slack that
	// absorbs clock-rate differences between hosts and request latency.
	// Default: TTL/10.
	Margin time.Duration

	// RequestTimeout bounds each GCS request; a refresh's deadline is
	// moreover never later than the end of the lease's validity. It must be
	// less than TTL-Margin. Default: the smaller of DefaultRequestTimeout
	// and TTL/3.
	RequestTimeout time.Duration

	// UnavailableAfter is how long GCS may keep failing (no answer, 429,
	// 5xx) before a claim, conversion or release gives up with an error
	// wrapping lockmgr.ErrUnavailable, even if its caller would wait longer.
	// Default: DefaultUnavailableAfter (10s).
	UnavailableAfter time.Duration

	// HostID names this daemon in the lock objects. Two daemons must never
	// share one. Default: the hostname, "-", and 8 random hex digits, so a
	// restarted daemon is a new host whose predecessor's claims expire.
	HostID string

	// WarmFor is how long a released claim's record is kept, idle, so
	// that taking the lock again on this host costs no request; another
	// host that asks for it gets it at once. Negative: never kept.
	// Default: DefaultWarmFor (30s).
	WarmFor time.Duration

	// WantPoll is how often a host with records reads its bell, to learn
	// of other hosts' requests to give them up. Default: DefaultWantPoll
	// (1.6s).
	WantPoll time.Duration

	// LockDelay is how long the records of a session declared dead (its
	// host crashed, paused or was cut off; not a clean release or close)
	// keep other hosts out after they know it dead, so that a host that
	// wakes to find its session gone stops its holders before anyone else
	// enters. A host writes its own into its session object; the others
	// apply it. Negative: off. Default: the TTL, so that a pause of up to
	// twice the TTL since the last heartbeat is covered (see
	// docs/OPERATIONS.md), and a crashed host's locks are taken over
	// within 2 × TTL.
	LockDelay time.Duration

	// Logger receives the backend's log lines. Nil discards them.
	Logger logrus.FieldLogger

	// Clock is the monotonic clock leases are measured with. Nil means the
	// host's CLOCK_BOOTTIME, which, unlike Go's monotonic clock, also counts
	// time the host spent suspended: a holder that slept through its TTL
	// knows it on waking. Tests inject a fake clock.
	Clock Clock

	// ClockOffset is for tests only: it shifts every wall-clock time this
	// backend writes or shows (when a claim was taken or last refreshed).
	// No decision of the protocol depends on wall clocks, so an offset
	// between hosts must change nothing; tests prove it with this.
	ClockOffset time.Duration
}

// DefaultConfig returns a Config for bucket with every default filled in.
func DefaultConfig(bucket string) Config {
	return Config{Bucket: bucket}.withDefaults()
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Prefix != "" && !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	c.Endpoint = normalEndpoint(c.Endpoint)
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	t := c.timing()
	t.Defaults(DefaultRequestTimeout, DefaultUnavailableAfter)
	c.RefreshInterval, c.Margin, c.RequestTimeout, c.UnavailableAfter = t.RefreshInterval, t.Margin, t.RequestTimeout, t.UnavailableAfter
	if c.WarmFor == 0 {
		c.WarmFor = DefaultWarmFor
	}
	if c.WantPoll == 0 {
		c.WantPoll = DefaultWantPoll
	}
	if c.LockDelay == 0 {
		c.LockDelay = c.TTL
	}
	c.HostID, c.Clock = sessioncfg.HostDefaults(c.HostID, c.Clock)
	return c
}

// Validate reports a configuration that cannot work, after filling in
// defaults: a missing bucket, a TTL under 100ms, a refresh interval not
// under TTL/2, a margin not under TTL/4, a request timeout not under
// TTL-Margin, an empty or unprintable host id.
func (c Config) Validate() error {
	d := c.withDefaults()
	switch {
	case d.Bucket == "":
		return errors.New("gcsbackend: Bucket is required")
	case d.Endpoint != "" && !validEndpoint(d.Endpoint):
		return fmt.Errorf("gcsbackend: Endpoint %q: want http://HOST:PORT or https://HOST:PORT, optionally with the path /storage/v1/", d.Endpoint)
	case !utf8.ValidString(d.Prefix) || strings.HasPrefix(d.Prefix, "/"):
		return fmt.Errorf("gcsbackend: Prefix %q must be UTF-8 and not start with /", d.Prefix)
	}
	if err := d.timing().Check("gcsbackend", MinTTL); err != nil {
		return err
	}
	switch {
	case d.RefreshInterval >= d.TTL-d.Margin:
		return fmt.Errorf("gcsbackend: refresh interval %v must be under TTL-margin (%v)", d.RefreshInterval, d.TTL-d.Margin)
	case d.WantPoll < 10*time.Millisecond:
		return fmt.Errorf("gcsbackend: want poll interval %v is under 10ms", d.WantPoll)
	}
	return sessioncfg.CheckHostID("gcsbackend", d.HostID)
}

// jsonAPIPath is the path of GCS's JSON API, which the Go client appends
// to the default endpoint but not to one it is given.
const jsonAPIPath = "/storage/v1/"

// normalEndpoint returns an emulator endpoint with the JSON API's path:
// "http://h:p" and "http://h:p/storage/v1" become "http://h:p/storage/v1/".
// Any other path is left alone (a proxy may serve the API elsewhere).
func normalEndpoint(ep string) string {
	u, err := url.Parse(ep)
	if ep == "" || err != nil || u.Host == "" {
		return ep
	}
	switch u.Path {
	case "", "/", strings.TrimSuffix(jsonAPIPath, "/"):
		u.Path = jsonAPIPath
	}
	return u.String()
}

// validEndpoint reports whether ep is an http(s) URL with a host.
func validEndpoint(ep string) bool {
	u, err := url.Parse(ep)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// lockDelay is the lock-delay this host asks of others, 0 if off.
func (c Config) lockDelay() time.Duration { return max(c.LockDelay, 0) }

// vouch is how long after a successful write was sent the holder vouches
// for its claim.
func (c Config) vouch() time.Duration { return c.TTL - c.Margin }

// Clock is the monotonic clock the backend measures its sessions with
// (internal/clock).
type Clock = clock.Clock

// BootClock is the host's CLOCK_BOOTTIME, the default Clock.
type BootClock = clock.Boot

// timing is c's session timing.
func (c Config) timing() sessioncfg.Timing {
	return sessioncfg.Timing{TTL: c.TTL, RefreshInterval: c.RefreshInterval, Margin: c.Margin,
		RequestTimeout: c.RequestTimeout, UnavailableAfter: c.UnavailableAfter}
}
