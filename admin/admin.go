// Package admin is a running mount's local control channel: a unix socket
// over which `lockfs status` reads the lock table and `lockfs break` ends a
// lock. Only root and the user that runs the daemon may connect (the socket
// is mode 0600 and every peer's credentials are checked with SO_PEERCRED);
// holder identities are shown only to root and to the holder's own uid;
// break is root only.
//
// The protocol is one JSON Request per connection, answered by one JSON
// Reply.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/logs"
	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
)

// Request is what a client asks.
type Request struct {
	// Op is "status" or "break".
	Op string `json:"op"`
	// Path limits status to locks at or under it; for break, the
	// directory whose lock to break. Relative to the mount root.
	Path string `json:"path"`
	// Kind is the lock kind for break: dir, newdir or usage.
	Kind string `json:"kind,omitempty"`
}

// Reply is what the daemon answers.
type Reply struct {
	Error      string `json:"error,omitempty"`
	Mountpoint string `json:"mountpoint"`
	Backend    string `json:"backend"`
	Host       string `json:"host"`
	Locks      []Lock `json:"locks"`
	// Claims are every host's claims on the locks of Path itself, as the
	// backend stores them (gcs: one read of each lock's object); empty for
	// a backend that keeps none (local). ClaimsError says why they could
	// not be read.
	Claims      []Claim `json:"claims,omitempty"`
	ClaimsError string  `json:"claims_error,omitempty"`
}

// Claim is one host's claim on a lock in the backend's shared store.
type Claim struct {
	Path    string    `json:"path"`
	Kind    string    `json:"kind"`
	Host    string    `json:"host"`
	Mode    string    `json:"mode"`
	Since   time.Time `json:"since,omitempty"`
	Session string    `json:"session"`
	// State is the session's as this host judges it: live, stale or dead.
	State string `json:"state"`
	// Use is held or warm for this host's own claim, claimed for another
	// host's.
	Use string `json:"use"`
	// LockDelayUntil, for a dead session's claim, is when its lock-delay
	// ends: until then it still keeps others out.
	LockDelayUntil time.Time `json:"lock_delay_until,omitzero"`
}

// Lock is one lock in a status reply.
type Lock struct {
	Path    string   `json:"path"`
	Kind    string   `json:"kind"`
	Mode    string   `json:"mode"`
	Holders []Holder `json:"holders"`
	Waiters []Waiter `json:"waiters"`
	// Lease is the backend's claim, e.g. "exclusive" or, for gcs, the
	// lease state and time to expiry.
	Lease string `json:"lease,omitempty"`
}

// Holder is one holder of a lock. Identity fields are empty (Hidden set)
// unless the reader is root or the holder's own uid.
type Holder struct {
	Mode     string  `json:"mode"`
	Explicit bool    `json:"explicit"`
	Implicit int     `json:"implicit"`
	Host     string  `json:"host,omitempty"`
	PID      int     `json:"pid,omitempty"`
	UID      *uint32 `json:"uid,omitempty"`
	Command  string  `json:"command,omitempty"` // the short name, /proc/PID/comm
	// Cmdline is the holder's command line; Runs, for a lock wrapper
	// (flock(1), lockfs lock), the command it runs under the lock.
	Cmdline string            `json:"cmdline,omitempty"`
	Runs    *procinfo.Command `json:"runs,omitempty"`
	Since   time.Time         `json:"since,omitempty"`
	Token   uint64            `json:"token,omitempty"`
	Note    string            `json:"note,omitempty"`
	Lost    string            `json:"lost,omitempty"`
	Hidden  bool              `json:"hidden,omitempty"`
}

// Waiter is one queued request. Mode is the mode it waits for on this lock
// (shared, for a request that needs this lock as an ancestor of the one it
// wants); Wants and WantsMode are the control file and mode it asked for.
type Waiter struct {
	Mode      string            `json:"mode"`
	Implicit  bool              `json:"implicit"`
	Wants     string            `json:"wants"`
	WantsMode string            `json:"wants_mode"`
	PID       int               `json:"pid,omitempty"`
	UID       *uint32           `json:"uid,omitempty"`
	Command   string            `json:"command,omitempty"`
	Cmdline   string            `json:"cmdline,omitempty"`
	Runs      *procinfo.Command `json:"runs,omitempty"`
	Since     time.Time         `json:"since,omitempty"`
	Hidden    bool              `json:"hidden,omitempty"`
	// Blocker, for a request waiting for the backend's claim, says who
	// holds it outside this daemon.
	Blocker string `json:"blocker,omitempty"`
}

// Config is what a Server needs.
type Config struct {
	// Engine is the mount's lock engine. Required.
	Engine *lockmgr.Engine
	// Mountpoint and Backend are reported in replies.
	Mountpoint string
	Backend    string
	// Notes, if set, returns the note written by a holder's descriptor.
	Notes func(lockmgr.LockID, lockmgr.Owner) string
	// Logger receives the audit line of every break. Nil discards.
	Logger logrus.FieldLogger
	// ProcRoot is where to read command names ("/proc" by default).
	ProcRoot string
}

// Server answers admin requests on a unix socket.
type Server struct {
	cfg Config
	log logrus.FieldLogger
	uid int // the daemon's uid: it may connect too

	mu     sync.Mutex
	ln     net.Listener // GUARDED_BY(mu)
	closed bool         // GUARDED_BY(mu)
	wg     sync.WaitGroup
}

// NewServer returns a server; call Listen, then Close when done.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("admin: Config.Engine is required")
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	log := logs.OrDiscard(cfg.Logger)
	return &Server{cfg: cfg, log: log, uid: os.Getuid()}, nil
}

// Listen creates the socket at path (mode 0600, replacing a stale one),
// removes the sockets of dead daemons beside it (see RemoveStale) and serves
// it in the background until Close.
func (s *Server) Listen(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("admin socket: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("admin socket %s: another daemon answers there", path)
	}
	_ = os.Remove(path)
	RemoveStale(filepath.Dir(path), s.log)
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return fmt.Errorf("admin socket: %w", err)
	}
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.handle(c.(*net.UnixConn))
			}()
		}
	}()
	return nil
}

// Close stops serving, removes the socket and waits for open requests.
func (s *Server) Close() error {
	s.mu.Lock()
	ln := s.ln
	s.closed = true
	s.mu.Unlock()
	var err error
	if ln != nil {
		err = ln.Close() // a unix listener removes its socket file
	}
	s.wg.Wait()
	return err
}

// peerUID returns the connecting process's uid.
func peerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, cerr
	}
	return int(cred.Uid), nil
}

func (s *Server) handle(c *net.UnixConn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	reply := Reply{Mountpoint: s.cfg.Mountpoint, Backend: s.cfg.Backend, Host: s.cfg.Engine.Host()}
	uid, err := peerUID(c)
	var req Request
	// Read the request before answering, even a refusal, so that the
	// client is not cut off mid-write.
	derr := json.NewDecoder(c).Decode(&req)
	switch {
	case err != nil:
		reply.Error = "cannot identify the caller: " + err.Error()
	case uid != 0 && uid != s.uid:
		reply.Error = fmt.Sprintf("permission denied: only root and uid %d may use this mount's admin socket", s.uid)
		s.log.WithFields(logrus.Fields{"uid": uid, "op": req.Op}).Warn("refused an admin request")
	case derr != nil:
		reply.Error = "bad request: " + derr.Error()
	default:
		s.serve(&req, uid, &reply)
	}
	_ = json.NewEncoder(c).Encode(reply)
}

func (s *Server) serve(req *Request, uid int, reply *Reply) {
	p, err := lockmgr.CleanPath(req.Path)
	if err != nil {
		reply.Error = err.Error()
		return
	}
	switch req.Op {
	case "status":
		reply.Locks = s.status(p, uid)
		reply.Claims, reply.ClaimsError = s.claims(p)
	case "break":
		if uid != 0 {
			reply.Error = "permission denied: only root may break a lock"
			s.log.WithFields(logrus.Fields{"path": p, "kind": req.Kind, "uid": uid}).Warn("refused a break by a non-root user")
			return
		}
		kind := lockmgr.KindDir
		if req.Kind != "" {
			if kind, err = lockmgr.ParseKind(req.Kind); err != nil {
				reply.Error = err.Error()
				return
			}
		}
		id := lockmgr.LockID{Path: p, Kind: kind}
		before := s.cfg.Engine.Status(id)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := s.cfg.Engine.Break(ctx, id)
		cancel()
		if err != nil {
			reply.Error = err.Error()
			return
		}
		var holders []string
		for _, h := range before.Holders {
			holders = append(holders, fmt.Sprintf("pid=%d uid=%d token=%d", h.Process.PID, h.UID, h.Token))
		}
		s.log.WithFields(logrus.Fields{"path": id.String(), "kind": kind.String(), "by_uid": uid,
			"holders": strings.Join(holders, "; ")}).Warn("lock broken by an operator")
		reply.Locks = s.status(p, uid)
	default:
		reply.Error = fmt.Sprintf("unknown op %q (want status or break)", req.Op)
	}
}
