package main

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// event is one line of a call trace: goroutine, E(nter) or X (exit), the
// function's file relative to the module root, and its name.
type event struct {
	g, kind, file, fn string
}

func parseEvent(line string) (event, bool) {
	f := strings.Fields(line)
	if len(f) != 4 || (f[1] != "E" && f[1] != "X") {
		return event{}, false
	}
	return event{f[0], f[1], f[2], f[3]}, true
}

// call is one executed call of the request: the function, its file, and
// the calls it made, in order.
type call struct {
	file, fn string
	calls    []*call
}

// path is the walk of one request through the module's files.
type path struct {
	// steps lists the file the request's goroutine is executing, each
	// time it changes: at a call into another file and at a return.
	steps []string
	// fns names, for each step, the function executing when it was made.
	fns []string
	// files are the distinct files, in the order of their first visit.
	files []string
	// returns counts, per file, the visits after the first.
	returns map[string]int
}

// total is the number of returns to a file the request had left.
func (p path) total() int {
	n := 0
	for _, r := range p.returns {
		n += r
	}
	return n
}

// returnsTo is the returns to file, or "-" if p does not visit it.
func (p path) returnsTo(file string) string {
	for _, f := range p.files {
		if f == file {
			return fmt.Sprint(p.returns[file])
		}
	}
	return "-"
}

// at records that the walk is in function fn of file now.
func (p *path) at(file, fn string) {
	if n := len(p.steps); n > 0 && p.steps[n-1] == file {
		return
	}
	p.steps = append(p.steps, file)
	p.fns = append(p.fns, fn)
	for _, f := range p.files {
		if f == file {
			p.returns[file]++
			return
		}
	}
	p.files = append(p.files, file)
}

// walk follows c and the calls under it, except those skip leaves out.
func (p *path) walk(c *call, skip map[*call]bool) {
	p.at(c.file, c.fn)
	for _, sub := range c.calls {
		if skip[sub] {
			continue
		}
		p.walk(sub, skip)
		p.at(c.file, c.fn)
	}
}

// executed is the path of every call the request executed: a helper called
// three times is visited three times.
func executed(root *call) path {
	p := path{returns: map[string]int{}}
	p.walk(root, nil)
	return p
}

// read is the path of a reader who follows the request and reads each
// function once: a call of a function read before is not followed again,
// unless a function not read yet runs under it (the reader then goes
// through it to find where that one is called). Repeated rounds of the
// same code, such as one step of the plan per level of the path, cost
// nothing after the first. Calls into a file that hook reports (nil: none)
// are not followed at all.
func read(root *call, hook func(file string) bool) path {
	return readSkipping(root, leaveOut(root, func(_, c *call) bool {
		return hook != nil && hook(c.file)
	}))
}

// followed is the path by the rule issue 30's figures quote: read once
// (read), without the hooks (hookFile), and without two kinds of call a
// reader following the request does not open:
//
//   - a call of a leaf: a call under which the request runs no other
//     function of the module, hooks aside (maxMode, holdSet.get,
//     lease.Mode). Its name says what it answers, and the reader reads on
//     as past a library call. "Runs" is what this request executes: a
//     function that calls others on another branch is a leaf here if it
//     called none of them this time, the way every count of this tool
//     follows the request, not every branch of the code.
//   - when atBackend, what runs under a call into a backend package
//     (localbackend, gcsbackend, etcdbackend) from outside it: the
//     request is followed to the backend's entry (Backend.Claim, and the
//     lease's methods the engine calls), whose file counts, and not into
//     the backend's own way to its answer. Behind lockmgr.Backend each
//     backend tells another story (a flock beneath SOURCE, objects in a
//     bucket, keys in etcd), held to the interface's contract by
//     lockmgr/backendtest; the engine's side of the request is the same
//     for all three. With atBackend false the reader follows into the
//     backend too (the local one here).
func followed(root *call, atBackend bool) path {
	return readSkipping(root, leaveOut(root, func(caller, c *call) bool {
		return hookFile(c.file) || leaf(c) || atBackend && backendFile(caller.file)
	}))
}

// leaf reports whether c calls no function of the module but hooks.
func leaf(c *call) bool {
	for _, sub := range c.calls {
		if !hookFile(sub.file) {
			return false
		}
	}
	return true
}

// backendFile reports whether file is in a backend's package.
func backendFile(file string) bool {
	for _, pkg := range []string{"localbackend/", "gcsbackend/", "etcdbackend/"} {
		if strings.HasPrefix(file, pkg) {
			return true
		}
	}
	return false
}

// leaveOut returns the calls under root that out (given the caller and the
// call) reports, without looking under them: the reader does not follow
// them, nor anything they run.
func leaveOut(root *call, out func(caller, c *call) bool) map[*call]bool {
	skip := map[*call]bool{}
	var mark func(c *call)
	mark = func(c *call) {
		for _, sub := range c.calls {
			if out(c, sub) {
				skip[sub] = true
			} else {
				mark(sub)
			}
		}
	}
	mark(root)
	return skip
}

// readSkipping is read with the calls in skip, and those under them, left
// out before the reader starts.
func readSkipping(root *call, skip map[*call]bool) path {
	seen := map[string]bool{}
	// mark reports whether c or a call under it runs a function not seen
	// before, in the order of execution, and skips the calls that do not.
	var mark func(c *call) bool
	mark = func(c *call) bool {
		key := c.file + " " + c.fn
		fresh := !seen[key]
		seen[key] = true
		for _, sub := range c.calls {
			if !skip[sub] && mark(sub) {
				fresh = true
			} else {
				skip[sub] = true
			}
		}
		return fresh
	}
	mark(root)
	p := path{returns: map[string]int{}}
	p.walk(root, skip)
	return p
}

// hookFile reports whether file holds hooks around the request, which a
// reader following the lock does not need to open: the observer's
// (observerHook) and the FUSE server's (fs/interrupt.go: WithContext and
// Finish, the interrupt registration and the request's timing). The
// server's hooks were outside the handler's path until LockWaitDeferred,
// whose answer runs Finish inside the handler when the lock is granted at
// once.
func hookFile(file string) bool {
	return observerHook(file) || file == "fs/interrupt.go"
}

// observerHook reports whether file holds the engine's observer hooks
// (lockmgr.Observer, its Outcome) or their implementations in the daemon
// (the slow-wait watch) and metrics: bookkeeping around the request.
func observerHook(file string) bool {
	return file == "lockmgr/observer.go" || file == "daemon/slowwait.go" || strings.HasPrefix(file, "metrics/")
}

// requestCalls reads a trace and returns the calls of the first request
// whose handler function is named handler (the part of its name after the
// last dot, "LockWaitDeferred"), from the handler's entry to its exit.
func requestCalls(r io.Reader, handler string) (*call, error) {
	var (
		g     string
		stack []*call
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		ev, ok := parseEvent(sc.Text())
		if !ok {
			continue
		}
		if g == "" {
			if ev.kind != "E" || ev.fn[strings.LastIndex(ev.fn, ".")+1:] != handler {
				continue
			}
			g = ev.g
		}
		if ev.g != g {
			continue
		}
		if ev.kind == "E" {
			c := &call{file: ev.file, fn: ev.fn}
			if n := len(stack); n > 0 {
				stack[n-1].calls = append(stack[n-1].calls, c)
			}
			stack = append(stack, c)
			continue
		}
		top := stack[len(stack)-1]
		if top.file != ev.file || top.fn != ev.fn {
			return nil, fmt.Errorf("exit of %s %s does not match the call stack", ev.file, ev.fn)
		}
		if len(stack) == 1 {
			return top, sc.Err()
		}
		stack = stack[:len(stack)-1]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if g == "" {
		return nil, fmt.Errorf("no %s request in the trace", handler)
	}
	return nil, fmt.Errorf("the trace ends inside the %s request", handler)
}
