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

// path is the walk of one request through the module's files.
type path struct {
	// steps lists the file the request's goroutine is executing, each
	// time it changes: at a call into another file and at a return.
	steps []string
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

// requestPath reads a trace and returns the path of the first request
// whose handler function is named handler (the part of its name after
// the last dot, "LockWait"), from the handler's entry to its exit.
func requestPath(r io.Reader, handler string) (path, error) {
	var (
		g     string
		stack []event
		p     = path{returns: map[string]int{}}
		seen  = map[string]bool{}
	)
	at := func(file string) {
		if n := len(p.steps); n > 0 && p.steps[n-1] == file {
			return
		}
		p.steps = append(p.steps, file)
		if seen[file] {
			p.returns[file]++
			return
		}
		seen[file] = true
		p.files = append(p.files, file)
	}
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
			stack = append(stack, ev)
			at(ev.file)
			continue
		}
		if len(stack) == 0 || stack[len(stack)-1].file != ev.file || stack[len(stack)-1].fn != ev.fn {
			return path{}, fmt.Errorf("exit of %s %s does not match the call stack", ev.file, ev.fn)
		}
		stack = stack[:len(stack)-1]
		if len(stack) == 0 {
			return p, sc.Err()
		}
		at(stack[len(stack)-1].file)
	}
	if err := sc.Err(); err != nil {
		return path{}, err
	}
	if g == "" {
		return path{}, fmt.Errorf("no %s request in the trace", handler)
	}
	return path{}, fmt.Errorf("the trace ends inside the %s request", handler)
}
