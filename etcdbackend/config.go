package etcdbackend

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
	// DefaultPrefix is the key prefix of the lock namespace.
	DefaultPrefix = "lockfs/"
	// DefaultTTL is the TTL of a host session's etcd lease.
	DefaultTTL = 30 * time.Second
	// DefaultRequestTimeout bounds one etcd request.
	DefaultRequestTimeout = 5 * time.Second
	// DefaultUnavailableAfter is how long etcd may fail to answer before a
	// claim gives up with lockmgr.ErrUnavailable.
	DefaultUnavailableAfter = 10 * time.Second
	// DefaultWarmFor is how long a released claim stays warm.
	DefaultWarmFor = 30 * time.Second
	// DefaultNoWaitGrace is how long a claim without wait gives the
	// holders of what blocks it to give up claims they only keep warm.
	DefaultNoWaitGrace = 300 * time.Millisecond
	// minTTL is the smallest TTL: etcd's leases are whole seconds, and a
	// server's minimum is 1.5 election timeouts (2s with its defaults).
	minTTL = time.Second
)

// Config configures an etcd Backend. Only Endpoints is required; every
// other zero field takes the default its comment gives.
type Config struct {
	// Endpoints are the client URLs of the etcd cluster's members,
	// "http://HOST:PORT" or "https://HOST:PORT", as etcdctl's --endpoints
	// takes them. Every daemon sharing one lock namespace names the same
	// cluster and Prefix.
	Endpoints []string

	// Prefix is prepended to every key, so that one cluster can hold
	// several namespaces (and other data). A missing trailing "/" is
	// added. Default: DefaultPrefix ("lockfs/").
	Prefix string

	// CACert, Cert and Key are PEM files, as etcdctl's --cacert, --cert
	// and --key: the CA that signed the servers' certificates, and this
	// client's certificate and key for client-certificate authentication
	// (both or neither). Any of them turns TLS on.
	CACert, Cert, Key string

	// Username and Password authenticate with etcd's user/password auth
	// (etcdctl's --user). Empty: no user.
	Username, Password string

	// TTL is the session lease's time to live, in whole seconds (rounded
	// up). A host stops vouching for its claims TTL-Margin after the send
	// of its last keep-alive that the server answered; the server expires
	// the lease TTL after it received the last one, and every claim with
	// it. Default: DefaultTTL (30s).
	TTL time.Duration

	// RefreshInterval is how often the session's lease is kept alive.
	// It must be under TTL/2. Default: TTL/3.
	RefreshInterval time.Duration

	// Margin is how long before the TTL's end the host stops vouching: the
	// slack for clock-rate differences between the host and the server.
	// Default: TTL/10.
	Margin time.Duration

	// RequestTimeout bounds one etcd request. It must be under TTL-Margin.
	// Default: the smaller of DefaultRequestTimeout and TTL/3.
	RequestTimeout time.Duration

	// UnavailableAfter is how long etcd may keep failing (no answer, no
	// leader) before a claim, conversion or release gives up with an error
	// wrapping lockmgr.ErrUnavailable. Default: DefaultUnavailableAfter.
	UnavailableAfter time.Duration

	// WarmFor is how long a released claim's key is kept, idle, so that
	// taking the lock again on this host costs no request; another host
	// that wants it gets it at once. Negative: never kept. Default:
	// DefaultWarmFor (30s).
	WarmFor time.Duration

	// LockDelay is how long a dead session's claims (its host crashed,
	// paused or was cut off; not a clean release or close) keep other
	// hosts out after the host stopped vouching for them, so that a host
	// that wakes to find its session gone stops its holders before anyone
	// else enters. The session's etcd lease is granted for TTL+LockDelay
	// (whole seconds), while the host vouches only until TTL-Margin after
	// its last answered keep-alive. Negative: off. Default: the TTL.
	LockDelay time.Duration

	// NoWaitGrace is how long a claim without wait, blocked by other
	// hosts' claims, gives them to drop claims they only keep warm before
	// it fails. Default: DefaultNoWaitGrace (300ms).
	NoWaitGrace time.Duration

	// HostID names this daemon in its keys' values. Default: the hostname,
	// "-", and 8 random hex digits.
	HostID string

	// Logger receives the backend's log lines. Nil discards them.
	Logger logrus.FieldLogger

	// Clock is the monotonic clock the session's validity is measured
	// with. Nil means the host's CLOCK_BOOTTIME, which also counts time
	// the host spent suspended.
	Clock Clock
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if r := c.TTL % time.Second; r != 0 {
		c.TTL += time.Second - r
	}
	t := c.timing()
	t.Defaults(DefaultRequestTimeout, DefaultUnavailableAfter)
	c.RefreshInterval, c.Margin, c.RequestTimeout, c.UnavailableAfter = t.RefreshInterval, t.Margin, t.RequestTimeout, t.UnavailableAfter
	if c.WarmFor == 0 {
		c.WarmFor = DefaultWarmFor
	}
	if c.LockDelay == 0 {
		c.LockDelay = c.TTL
	}
	if c.LockDelay < 0 {
		c.LockDelay = -1
	} else if r := c.LockDelay % time.Second; r != 0 {
		c.LockDelay += time.Second - r
	}
	if c.NoWaitGrace == 0 {
		c.NoWaitGrace = DefaultNoWaitGrace
	}
	c.HostID, c.Clock = sessioncfg.HostDefaults(c.HostID, c.Clock)
	return c
}

// Validate reports a configuration that cannot work, after filling in
// defaults: no endpoints or a malformed one, half a client certificate,
// a password without a user, a TTL under 1s, a refresh interval not under
// TTL/2, a margin not under TTL/4, a request timeout not under TTL-Margin,
// an unprintable host id.
func (c Config) Validate() error {
	d := c.withDefaults()
	if len(d.Endpoints) == 0 {
		return errors.New("etcdbackend: no endpoints (want http://HOST:PORT or https://HOST:PORT, comma-separated)")
	}
	for _, ep := range d.Endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("etcdbackend: endpoint %q: want http://HOST:PORT or https://HOST:PORT", ep)
		}
	}
	switch {
	case !utf8.ValidString(d.Prefix) || strings.HasPrefix(d.Prefix, "/") && len(d.Prefix) == 1:
		return fmt.Errorf("etcdbackend: prefix %q must be UTF-8 and not /", d.Prefix)
	case (d.Cert == "") != (d.Key == ""):
		return errors.New("etcdbackend: a client certificate needs both the certificate and its key")
	case d.Password != "" && d.Username == "":
		return errors.New("etcdbackend: a password needs a user name")
	}
	if err := d.timing().Check("etcdbackend", minTTL); err != nil {
		return err
	}
	return sessioncfg.CheckHostID("etcdbackend", d.HostID)
}

// leaseTTL is the TTL the session's lease is granted with: TTL, then the
// lock-delay.
func (c Config) leaseTTL() time.Duration { return c.TTL + max(c.LockDelay, 0) }

// vouch is how long after a keep-alive that the server answered was sent
// the host vouches for its claims, given the TTL the server granted: the
// TTL less the margin (never more than the grant less the lock-delay).
func (c Config) vouch(granted time.Duration) time.Duration {
	return min(c.TTL, granted-max(c.LockDelay, 0)) - c.Margin
}

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

// randomHex returns n random bytes in hex.
func randomHex(n int) string { return sessioncfg.RandomHex(n) }
