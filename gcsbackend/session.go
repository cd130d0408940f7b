package gcsbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/internal/sessioncfg"
	"github.com/lockfs/lockfs/lockmgr"
)

// Host sessions.
//
// A backend's claims live as long as its session: the object
// PREFIX/sessions/<id>, created before the first claim and rewritten by one
// heartbeat about every RefreshInterval (jittered), each write conditional
// on the generation of the last. The host vouches for every claim of the
// session until TTL-Margin after the send of its last heartbeat that
// landed. A session whose validity ends is lost for good: every lease of it
// is lost at once, its records are forgotten, and the next claim starts a
// new session under a new id.
//
// Another host judges the session stale once it has seen its generation
// unchanged for the session's stale period (its TTL) on its own monotonic
// clock; it then declares it dead with a write conditional on that
// generation, so that the holder's next heartbeat fails and the holder
// learns it (a heartbeat that lands first restarts the count instead).
// Records of a dead or missing session count as absent, and whoever writes
// their object removes them. A clean Close drops the records and deletes
// the session object.

// sessionDoc is the content of a session object.
type sessionDoc struct {
	Version int    `json:"v"`
	Session string `json:"session"`
	Host    string `json:"host"`
	// Seq grows with every heartbeat.
	Seq uint64 `json:"seq"`
	// State is "live", or "dead" once another host declared it so.
	State string `json:"state"`
	// TTLMillis is the holder's TTL; StaleMillis how long others must see
	// the generation unchanged before declaring the session dead.
	TTLMillis   int64 `json:"ttl_ms"`
	StaleMillis int64 `json:"stale_ms"`
	// LockDelayMillis is how long others keep the session's records once
	// they know it declared dead (absent: the reader's own lock-delay).
	LockDelayMillis *int64 `json:"lock_delay_ms,omitempty"`
	// Since and Refreshed are wall-clock times for people only.
	Since     time.Time `json:"since"`
	Refreshed time.Time `json:"refreshed"`
	Write     string    `json:"write"`
}

func decodeSession(name string, b []byte) (*sessionDoc, error) {
	var d sessionDoc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("object %s is not a lockfs session: %w", name, err)
	}
	if d.Version != layoutVersion {
		return nil, layoutError("session object %s has layout version %d; this lockfs speaks %d", name, d.Version, layoutVersion)
	}
	return &d, nil
}

func (d *sessionDoc) encode() []byte {
	b, err := json.Marshal(d)
	if err != nil {
		panic("gcsbackend: encode session: " + err.Error())
	}
	return append(b, '\n')
}

func (d *sessionDoc) metadata() map[string]string {
	return map[string]string{metaVersion: strconv.Itoa(layoutVersion), "lockfs-state": d.State}
}

// session is this backend's current host session.
type session struct {
	id    string
	name  string        // object name
	lostc chan struct{} // closed once lost

	mu sync.Mutex
	// doc is the last version written; gen its generation. GUARDED_BY(mu)
	doc sessionDoc
	gen int64
	// lastSent is when the last landed heartbeat was (first) sent;
	// validUntil is lastSent + TTL - Margin. GUARDED_BY(mu)
	lastSent, validUntil time.Duration
	// refreshDue is when the next heartbeat should be sent. GUARDED_BY(mu)
	refreshDue time.Duration
	// lostErr wraps lockmgr.ErrLeaseLost once lost. GUARDED_BY(mu)
	lostErr error
	// bellSeen is the generation of the session's bell read before its
	// last listing of wants (0: none yet). GUARDED_BY(mu)
	bellSeen int64
}

// err returns why the session is lost, checking its validity at now.
func (s *session) err(now time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lostErr == nil && now >= s.validUntil {
		return fmt.Errorf("session %s: no heartbeat landed within TTL - margin of the last one sent", s.id)
	}
	return s.lostErr
}

func (s *session) validity() (lastSent, validUntil time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastSent, s.validUntil
}

// sessionName is the object of session id.
func (b *Backend) sessionName(id string) string {
	return b.cfg.Prefix + "sessions/" + id
}

// newSessionID returns a session id: the host id, escaped to object-name
// bytes, ".", and random hex, so that ids never repeat across restarts.
func (b *Backend) newSessionID() string {
	var sb strings.Builder
	escapeElement(&sb, b.cfg.HostID)
	sb.WriteByte('.')
	sb.WriteString(sessioncfg.RandomHex(6))
	return sb.String()
}

// currentSession returns the live session, or nil.
func (b *Backend) currentSession() *session {
	b.mu.Lock()
	s := b.sess
	b.mu.Unlock()
	if s != nil && s.err(b.clock.Now()) != nil {
		b.loseSession(s, s.err(b.clock.Now()))
		return nil
	}
	return s
}

// ensureSession returns the live session, creating one if there is none:
// one write, retried with backoff within giveUp.
func (b *Backend) ensureSession(ctx context.Context, giveUp time.Duration) (*session, error) {
	if s := b.currentSession(); s != nil {
		return s, nil
	}
	select {
	case b.startSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-b.startSem }()
	if s := b.currentSession(); s != nil {
		return s, nil
	}
	id := b.newSessionID()
	wall := b.wallNow()
	doc := sessionDoc{Version: layoutVersion, Session: id, Host: b.cfg.HostID, Seq: 1, State: "live",
		TTLMillis: b.cfg.TTL.Milliseconds(), StaleMillis: b.cfg.TTL.Milliseconds(), Since: wall, Refreshed: wall,
		Write: b.newWriteID(), LockDelayMillis: ptr(b.cfg.lockDelay().Milliseconds())}
	name := b.sessionName(id)
	gen, first, err := b.createSession(ctx, name, doc, giveUp)
	if err != nil {
		return nil, err
	}
	s := &session{id: id, name: name, lostc: make(chan struct{}), doc: doc, gen: gen,
		lastSent: first, validUntil: first + b.cfg.vouch(), refreshDue: first + backoff.Jitter(b.cfg.RefreshInterval)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errBackendClosed
	}
	b.sess = s
	b.mu.Unlock()
	b.stats.sessions.Add(1)
	b.log.WithField("session", id).Info("session started")
	b.wake()
	return s, nil
}

// createSession writes a new session's object doc at name, which must not
// exist: a write without an answer is retried, and a 412 or a retry reads
// back whether an earlier copy landed. It returns the object's generation
// and when the first copy was sent, from which the session's validity
// counts.
func (b *Backend) createSession(ctx context.Context, name string, doc sessionDoc, giveUp time.Duration) (gen int64, first time.Duration, _ error) {
	fails := b.newFailClock()
	fails.limit = giveUp
	bo := backoff.New(retryMin, retryMax)
	first = -1
	for {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		if first < 0 {
			first = b.clock.Now()
		}
		rctx, cancel := b.requestCtx(ctx, 0)
		gen, oc, err := b.write(rctx, name, 0, doc.encode(), doc.metadata())
		cancel()
		switch oc {
		case outcomeOK:
			return gen, first, nil
		case outcomePermanent:
			return 0, 0, fmt.Errorf("start session %s: %w", name, err)
		case outcomeCanceled:
			return 0, 0, ctx.Err()
		}
		// 412 (an earlier copy of this write landed) or no answer: read
		// back.
		if oc != outcomePrecondition {
			b.stats.ambiguous.Add(1)
			if err := fails.fail(err); err != nil {
				return 0, 0, fmt.Errorf("start session: %w", err)
			}
			if err := b.sleep(ctx, bo.Next()); err != nil {
				return 0, 0, err
			}
		}
		rctx, cancel = b.requestCtx(ctx, 0)
		g, body, roc, rerr := b.readRaw(rctx, name)
		cancel()
		if roc != outcomeOK {
			if err := fails.fail(rerr); err != nil {
				return 0, 0, fmt.Errorf("start session: %w", err)
			}
			continue
		}
		if g == 0 {
			continue // nothing landed: send again
		}
		d, derr := decodeSession(name, body)
		if derr != nil || d.Write != doc.Write {
			return 0, 0, fmt.Errorf("start session: object %s exists and is not ours", name)
		}
		b.stats.recognised.Add(1)
		return g, first, nil
	}
}

// idleWake is how long the heartbeater sleeps with no session.
const idleWake = time.Minute

// wakeCheck bounds the heartbeater's sleep while a session lives: Go's
// timers do not count time the machine spent suspended, so a host that
// wakes learns that its session lapsed within this long on its boot
// clock, and tells its holders, well before other hosts' TTL and
// lock-delay have passed.
const wakeCheck = time.Second

// refreshRetry is the wait before retrying a heartbeat that failed while
// the session is still valid.
const refreshRetry = 200 * time.Millisecond

// errSessionDead: another host declared the session dead.
var errSessionDead = errors.New("another host declared this host's session dead (it saw no heartbeat for the TTL)")

// loseSession ends s for good: every lease of it is lost with cause, its
// records are forgotten (other hosts treat them as absent once they see
// the session dead), and the next claim starts a new session.
func (b *Backend) loseSession(s *session, cause error) {
	s.mu.Lock()
	if s.lostErr != nil {
		s.mu.Unlock()
		return
	}
	s.lostErr = fmt.Errorf("%w: %v", lockmgr.ErrLeaseLost, cause)
	close(s.lostc)
	err := s.lostErr
	s.mu.Unlock()

	b.mu.Lock()
	if b.sess == s {
		b.sess = nil
	}
	// This host's own lost session delays nobody here: the engine has
	// told its holders already.
	b.markDead(s.id, 0)
	var leases []*lease
	for name, r := range b.recs {
		if r.sess == s {
			if r.lease != nil {
				leases = append(leases, r.lease)
			}
			delete(b.recs, name)
		}
	}
	b.mu.Unlock()
	for _, l := range leases {
		l.lose(err)
	}
	b.log.WithError(cause).WithFields(logrus.Fields{"session": s.id, "leases": len(leases)}).
		Error("session lost: every lock of this host is lost")
}

// endSession deletes the session object at a clean Close, after its
// records were dropped.
func (b *Backend) endSession(ctx context.Context, s *session) error {
	if s.err(b.clock.Now()) != nil {
		return nil
	}
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	bo := backoff.New(retryMin, retryMax)
	fails := b.newFailClock()
	for {
		rctx, cancel := b.requestCtx(ctx, 0)
		oc, err := b.remove(rctx, s.name, gen)
		cancel()
		switch oc {
		case outcomeOK:
			return nil
		case outcomeTransient:
			if ferr := fails.fail(err); ferr != nil {
				return fmt.Errorf("delete session %s: %w", s.name, ferr)
			}
			if err := b.sleep(ctx, bo.Next()); err != nil {
				return fmt.Errorf("delete session %s: %w", s.name, err)
			}
			// The delete may have landed with its reply lost: look.
			rctx, cancel := b.requestCtx(ctx, 0)
			g, _, roc, _ := b.readRaw(rctx, s.name)
			cancel()
			if roc == outcomeOK && g == 0 {
				b.stats.recognised.Add(1)
				return nil
			}
		case outcomePrecondition:
			return nil // declared dead meanwhile: nothing vouches for it
		default:
			return fmt.Errorf("delete session %s: %w", s.name, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }
