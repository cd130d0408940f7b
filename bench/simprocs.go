package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// simProc is a running sim helper process, seen from the harness.
type simProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its answers; closed when it exits
	done  chan struct{}
	log   string
	// progress, if set, is given the "progress" lines.
	progress func(string)
}

// startSimProc re-executes this binary as a sim helper for spec.
func (r *runner) startSimProc(name string, spec simSpec) (*simProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-test.run=^$") // harmless if self is a test binary
	cmd.Env = append(os.Environ(), helperEnv+"="+helperSimHosts, spec.env())
	stdin, stdout, logPath, err := r.startPiped(name, cmd)
	if err != nil {
		return nil, err
	}
	p := &simProc{cmd: cmd, stdin: stdin, lines: make(chan string, 4), done: make(chan struct{}), log: logPath}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// simProcs are the helper processes of one sim.
type simProcs []*simProc

// startSims starts min(nproc, n) helpers for n hosts of spec (each its own
// first host and count), named name-K; their progress goes to the log.
func (r *runner) startSims(name string, spec simSpec, n, nproc int) (simProcs, error) {
	nproc = min(nproc, n)
	procs := make(simProcs, 0, nproc)
	for k := 0; k < nproc; k++ {
		spec.first, spec.hosts = k*n/nproc, (k+1)*n/nproc-k*n/nproc
		p, err := r.startSimProc(fmt.Sprintf("%s-%d", name, k), spec)
		if err != nil {
			procs.kill()
			return nil, err
		}
		p.progress = func(s string) { r.logf("%s: process %d: %s locks held", name, k, strings.TrimPrefix(s, "progress ")) }
		procs = append(procs, p)
	}
	return procs, nil
}

// askAll sends cmd to every process at once and sums the answers.
func (ps simProcs) askAll(ctx context.Context, cmd, want string) ([]float64, error) {
	var (
		mu    sync.Mutex
		sum   []float64
		first error
		wg    sync.WaitGroup
	)
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := p.ask(ctx, cmd, want)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = err
				}
				return
			}
			if sum == nil {
				sum = make([]float64, len(f))
			}
			for i := range f {
				if i < len(sum) {
					sum[i] += f[i]
				}
			}
		}()
	}
	wg.Wait()
	return sum, first
}

// take has every host take its locks within bound and returns how long
// it took; if not all total locks are held by then, it nulls keys with a
// reason under what and returns false.
func (ps simProcs) take(ctx context.Context, r *runner, what string, keys []string, total int, bound time.Duration) (time.Duration, bool) {
	start := time.Now()
	took, err := ps.askAll(ctx, fmt.Sprintf("take %v", bound), "took")
	setup := time.Since(start)
	if err != nil || took[0] != float64(total) {
		held, failed, lost := 0.0, 0.0, 0.0
		if took != nil {
			held, failed, lost = took[0], took[1], took[2]
		}
		r.nullKeys(what, keys, fmt.Sprintf("%.0f of %d locks held after %v (%.0f acquires failed, %.0f holds lost): %v",
			held, total, setup.Round(time.Second), failed, lost, err))
		return setup, false
	}
	r.logf("%s: %d processes hold %d locks after %v (%.0f/s; %.0f lost so far)",
		what, len(ps), total, setup.Round(time.Millisecond), float64(total)/setup.Seconds(), took[2])
	return setup, true
}

// close closes every host and waits for the processes to exit; it returns
// the holds lost from the start to the close, and how long the close took.
func (ps simProcs) close(ctx context.Context) (lost float64, secs float64, err error) {
	t0 := time.Now()
	closed, err := ps.askAll(ctx, "close", "closed")
	if err != nil {
		return 0, 0, err
	}
	for _, p := range ps {
		<-p.done
	}
	return closed[0], time.Since(t0).Seconds(), nil
}

// kill ends every process at once (after a clean close, already gone).
func (ps simProcs) kill() {
	for _, p := range ps {
		p.kill()
	}
}

// ask sends a command and returns the answer's fields after its first
// word, which must be want.
func (p *simProc) ask(ctx context.Context, cmd, want string) ([]float64, error) {
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		return nil, fmt.Errorf("%s: %w (%s)", cmd, err, logTail(p.log))
	}
	for {
		select {
		case s, ok := <-p.lines:
			if ok && strings.HasPrefix(s, "progress ") {
				if p.progress != nil {
					p.progress(s)
				}
				continue
			}
			return parseAnswer(cmd, want, s, ok, p.log)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// parseAnswer reads an answer line: its first word must be want, the
// others numbers.
func parseAnswer(cmd, want, s string, ok bool, log string) ([]float64, error) {
	{
		f := strings.Fields(s)
		if !ok || len(f) == 0 || f[0] != want {
			return nil, fmt.Errorf("%s: answer %q (%s)", cmd, s, logTail(log))
		}
		out := make([]float64, len(f)-1)
		for i, x := range f[1:] {
			v, err := strconv.ParseFloat(x, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: answer %q", cmd, s)
			}
			out[i] = v
		}
		return out, nil
	}
}

// kill ends the process at once and reaps it.
func (p *simProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// logTail returns the end of a log file, for an error message.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 1024 {
		b = b[len(b)-1024:]
	}
	return strings.TrimSpace(string(b))
}
