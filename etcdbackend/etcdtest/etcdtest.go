// Package etcdtest runs real etcd servers for tests: one member, or a
// cluster of three for fault tests, each member a separate process
// listening on loopback ports that were free a moment before, with its data
// in the test's temporary directory. Every member is stopped when the test
// ends (and dies with the test binary, by Pdeathsig).
//
// The server is Debian's etcd-server package (etcd 3.4), which
// scripts/deps.sh installs; the etcd binary is looked up on PATH. Under
// CI=true a missing binary fails the test; elsewhere it skips it, saying
// why.
//
//	c := etcdtest.Start(t) // one member, stopped when t ends
//	b, err := etcdbackend.New(etcdbackend.Config{Endpoints: c.Endpoints(), TTL: 3 * time.Second})
//
// and a daemon under test gets the same endpoints with --etcd-endpoints.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/internal/testutil"
)

// startTimeout bounds the wait for a cluster to elect a leader.
const startTimeout = 30 * time.Second

// Binary returns the path of the etcd server binary, or reports it missing
// (a failure under CI=true, a skip elsewhere).
func Binary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("etcd")
	if err != nil {
		testutil.Missing(t, "etcdtest: the etcd server is not installed (apt-get install etcd-server; scripts/deps.sh does): %v", err)
	}
	return p
}

// Cluster is a running etcd cluster on loopback.
type Cluster struct {
	// Members in the order of their names, m0, m1, ...
	Members []*Member
}

// Member is one etcd server process.
type Member struct {
	Name      string
	ClientURL string // http://127.0.0.1:PORT
	PeerURL   string

	bin  string
	args []string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd     // GUARDED_BY(mu)
	done chan struct{} // closed once cmd is reaped, GUARDED_BY(mu)
}

// Start starts a one-member cluster and waits until it serves.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartCluster(t, 1)
}

// StartCluster starts a cluster of n members and waits until it has a
// leader. Ports are picked free; a start that loses one to a race is
// retried.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	bin := Binary(t)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c, err := startCluster(bin, t.TempDir(), n)
		if err == nil {
			t.Cleanup(func() {
				for _, m := range c.Members {
					m.Kill()
					if t.Failed() {
						if b, err := os.ReadFile(m.log); err == nil && len(b) > 0 {
							t.Logf("etcd %s output (last 4 KiB):\n%s", m.Name, tail(b, 4096))
						}
					}
				}
			})
			return c
		}
		lastErr = err
	}
	t.Fatalf("etcdtest: cannot start %d etcd members: %v", n, lastErr)
	return nil
}

// Launch starts a cluster of n members of the etcd binary bin with their
// data and logs in dir, for callers that are no test (the benchmark); the
// caller must Stop it.
func Launch(bin, dir string, n int) (*Cluster, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var c *Cluster
		if c, err = startCluster(bin, filepath.Join(dir, strconv.Itoa(attempt)), n); err == nil {
			return c, nil
		}
	}
	return nil, err
}

// Stop kills every member and waits for them to exit.
func (c *Cluster) Stop() { c.killAll() }

func startCluster(bin, dir string, n int) (*Cluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	var initial []string
	for i := 0; i < n; i++ {
		m := &Member{
			Name:      "m" + strconv.Itoa(i),
			ClientURL: "http://127.0.0.1:" + strconv.Itoa(ports[2*i]),
			PeerURL:   "http://127.0.0.1:" + strconv.Itoa(ports[2*i+1]),
			bin:       bin,
		}
		initial = append(initial, m.Name+"="+m.PeerURL)
		c.Members = append(c.Members, m)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, m := range c.Members {
		data := filepath.Join(dir, m.Name)
		m.log = filepath.Join(dir, m.Name+".log")
		m.args = []string{
			"--name", m.Name, "--data-dir", data,
			"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "lockfs-test",
			// Faster elections than the defaults (100ms, 1s): the fault
			// tests wait for them. The minimum lease TTL follows (1.5 ×
			// the election timeout, rounded up: 1s).
			"--heartbeat-interval", "50", "--election-timeout", "500",
			// The cheapest password hashing: each authentication of a
			// client hashes its password, and at the default cost (10) on
			// a loaded machine that alone outlasted Check's 5s bound.
			"--bcrypt-cost", "4",
			"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
		}
		if err := m.start(); err != nil {
			c.killAll()
			return nil, err
		}
	}
	if err := c.WaitLeader(startTimeout); err != nil {
		c.killAll()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) killAll() {
	for _, m := range c.Members {
		m.Kill()
	}
}

// Endpoints returns every member's client URL.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.ClientURL)
	}
	return eps
}

// Client returns a client of the whole cluster, closed when t ends.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// WaitLeader waits until a running member reports a leader.
func (c *Cluster) WaitLeader(d time.Duration) error {
	deadline := time.Now().Add(d)
	hc := &http.Client{Timeout: time.Second}
	for {
		for _, m := range c.Members {
			if !m.Running() {
				continue
			}
			resp, err := hc.Get(m.ClientURL + "/health")
			if err != nil {
				continue
			}
			var body [256]byte
			k, _ := resp.Body.Read(body[:])
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body[:k]), `"health":"true"`) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd cluster has no leader after %v", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Leader returns the index of the member that is leader now, asking the
// running members, or -1.
func (c *Cluster) Leader(t testing.TB) int {
	t.Helper()
	for _, m := range c.Members {
		if !m.Running() {
			continue
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 2 * time.Second})
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.Status(ctx, m.ClientURL)
		cancel()
		cli.Close()
		if err != nil || st.Leader == 0 {
			continue
		}
		if st.Leader == st.Header.MemberId {
			return c.index(m)
		}
		for i := range c.Members {
			if c.memberID(t, i) == st.Leader {
				return i
			}
		}
	}
	return -1
}

func (c *Cluster) index(m *Member) int {
	for i, x := range c.Members {
		if x == m {
			return i
		}
	}
	return -1
}

// memberID asks member i for its own id, or 0.
func (c *Cluster) memberID(t testing.TB, i int) uint64 {
	m := c.Members[i]
	if !m.Running() {
		return 0
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 2 * time.Second})
	if err != nil {
		return 0
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, m.ClientURL)
	if err != nil {
		return 0
	}
	return st.Header.MemberId
}

func (m *Member) start() error {
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(m.bin, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a terminal's Ctrl-C reaches the test
	// first; it dies with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", m.bin, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	return nil
}

// Running reports whether the member's process runs (paused counts).
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

// Kill SIGKILLs the member and waits for it to exit. Killing a member that
// is not running does nothing.
func (m *Member) Kill() error {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(syscall.SIGCONT) // a paused member dies too
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("etcd %s did not exit after SIGKILL", m.Name)
	}
}

// Restart starts a killed member again on its data directory and ports.
func (m *Member) Restart() error {
	if m.Running() {
		return fmt.Errorf("etcd %s is running", m.Name)
	}
	return m.start()
}

// Pause stops the member with SIGSTOP; Resume continues it.
func (m *Member) Pause() error { return m.signal(syscall.SIGSTOP) }

// Resume continues a paused member.
func (m *Member) Resume() error { return m.signal(syscall.SIGCONT) }

func (m *Member) signal(s syscall.Signal) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return fmt.Errorf("etcd %s never started", m.Name)
	}
	return m.cmd.Process.Signal(s)
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
