package bench

// Helper processes talked to in lines: a loadgen or simhost that prints
// one JSON line per answer.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// lineProc is a loadgen process that prints one line when it is ready
// (locks held, lock granted) and then runs until its standard input closes.
type lineProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	first chan []byte   // the first line of output (closed empty if none)
	done  chan struct{} // closed once reaped
	log   string
}

// startLineProc starts `loadgen args...`; its standard error goes to
// logDir/name.log. It is stopped when the run ends, if not before.
func (r *runner) startLineProc(name string, args ...string) (*lineProc, error) {
	cmd := exec.Command(r.bin(binLoadgen), args...)
	cmd.Env = loadgenEnv()
	stdin, stdout, logPath, err := r.startPiped(name, cmd)
	if err != nil {
		return nil, err
	}
	p := &lineProc{cmd: cmd, stdin: stdin, first: make(chan []byte, 1), done: make(chan struct{}), log: logPath}
	go func() {
		b, _ := bufio.NewReader(stdout).ReadBytes('\n')
		p.first <- b
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		close(p.done)
	}()
	r.atClose(p.stop)
	return p, nil
}

// startPiped starts cmd in a session of its own (a lease-loss signal sent
// to a holder's process group must not reach the harness), killed if the
// harness dies, with pipes to its standard input and output and its
// standard error in logDir/name.log, whose path it returns.
func (r *runner) startPiped(name string, cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser, string, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, "", err
	}
	logPath := filepath.Join(r.logDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, nil, "", err
	}
	defer logf.Close()
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		return nil, nil, "", err
	}
	return stdin, stdout, logPath, nil
}

// line waits for the process's first line of output.
func (p *lineProc) line(ctx context.Context, timeout time.Duration) ([]byte, error) {
	select {
	case b := <-p.first:
		if len(b) == 0 {
			msg, _ := os.ReadFile(p.log)
			return nil, fmt.Errorf("%s exited without output: %s", filepath.Base(p.log), strings.TrimSpace(string(msg)))
		}
		return b, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("%s: no output within %v", filepath.Base(p.log), timeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// exited reports whether the process has exited.
func (p *lineProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ready reports whether the first line has arrived, without waiting.
func (p *lineProc) ready() bool { return len(p.first) > 0 }

// stop closes the process's standard input (it exits, closing every
// descriptor) and waits, killing it after 30s. Safe to call twice.
func (p *lineProc) stop() {
	if p == nil {
		return
	}
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// kill kills the process and waits for it.
func (p *lineProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}
