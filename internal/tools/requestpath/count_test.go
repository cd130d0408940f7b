package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// A trace of two goroutines: the request (goroutine 7) goes a.go → b.go →
// a.go → c.go → b.go → a.go; goroutine 8 runs meanwhile and is not part of
// it; a second LockWait afterwards is not counted.
const trace = `7 E fs/x.go X.Lookup
7 X fs/x.go X.Lookup
7 E a.go h.LockWait
7 E b.go f
8 E c.go other
7 X b.go f
7 E a.go helper
7 E c.go g
7 E b.go k
7 X b.go k
7 X c.go g
7 X a.go helper
8 X c.go other
7 X a.go h.LockWait
9 E a.go h.LockWait
9 E d.go z
9 X d.go z
9 X a.go h.LockWait
`

func TestRequestPathCountsFilesAndReturns(t *testing.T) {
	root, err := requestCalls(strings.NewReader(trace), "LockWait")
	if err != nil {
		t.Fatal(err)
	}
	p := executed(root)
	if want := []string{"a.go", "b.go", "a.go", "c.go", "b.go", "c.go", "a.go"}; !reflect.DeepEqual(p.steps, want) {
		t.Errorf("steps %v, want %v", p.steps, want)
	}
	if want := []string{"a.go", "b.go", "c.go"}; !reflect.DeepEqual(p.files, want) {
		t.Errorf("files %v, want %v", p.files, want)
	}
	if want := map[string]int{"a.go": 2, "b.go": 1, "c.go": 1}; !reflect.DeepEqual(p.returns, want) {
		t.Errorf("returns %v, want %v", p.returns, want)
	}
	if p.total() != 4 {
		t.Errorf("total %d, want 4", p.total())
	}
	// Every function runs once: a reader goes the same way.
	if r := read(root, nil); !reflect.DeepEqual(r, p) {
		t.Errorf("read once %+v, want %+v", r, p)
	}
}

// A request that runs the same round twice (a.go → b.go f → c.go g, then
// f again, whose g now calls a new function in d.go) and then a helper
// read before: a reader follows f the second time only as far as the new
// function, and skips the helper.
const rounds = `1 E a.go h.LockWait
1 E b.go f
1 E c.go g
1 X c.go g
1 X b.go f
1 E b.go f
1 E c.go g
1 E d.go new
1 X d.go new
1 X c.go g
1 X b.go f
1 E b.go f
1 E c.go g
1 X c.go g
1 X b.go f
1 X a.go h.LockWait
`

func TestReadOnceSkipsCallsReadBefore(t *testing.T) {
	root, err := requestCalls(strings.NewReader(rounds), "LockWait")
	if err != nil {
		t.Fatal(err)
	}
	x, r := executed(root), read(root, nil)
	if want := []string{"a.go", "b.go", "c.go", "b.go", "a.go", "b.go", "c.go", "d.go", "c.go", "b.go", "a.go", "b.go", "c.go", "b.go", "a.go"}; !reflect.DeepEqual(x.steps, want) {
		t.Errorf("executed steps %v, want %v", x.steps, want)
	}
	if want := []string{"a.go", "b.go", "c.go", "b.go", "a.go", "b.go", "c.go", "d.go", "c.go", "b.go", "a.go"}; !reflect.DeepEqual(r.steps, want) {
		t.Errorf("read-once steps %v, want %v", r.steps, want)
	}
	if x.total() != 11 || r.total() != 7 {
		t.Errorf("returns: executed %d, read once %d; want 11 and 7", x.total(), r.total())
	}
	// Without d.go, the round that reached it is not followed either.
	h := read(root, func(file string) bool { return file == "d.go" })
	if want := []string{"a.go", "b.go", "c.go", "b.go", "a.go"}; !reflect.DeepEqual(h.steps, want) {
		t.Errorf("steps without d.go %v, want %v", h.steps, want)
	}
}

func TestRequestPathRejectsBrokenTraces(t *testing.T) {
	for name, tr := range map[string]string{
		"no request":  "1 E a.go f\n1 X a.go f\n",
		"unfinished":  "1 E a.go h.LockWait\n1 E b.go f\n",
		"mismatched":  "1 E a.go h.LockWait\n1 E b.go f\n1 X a.go h.LockWait\n",
		"other names": "1 E a.go h.LockWaitNot\n1 X a.go h.LockWaitNot\n",
	} {
		if _, err := requestCalls(strings.NewReader(tr), "LockWait"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestFuncNameNamesTheReceiver(t *testing.T) {
	src := `package p
func (h *handle) LockWait() {}
func (l list[T]) Len() int { return 0 }
func plain() {}
`
	got := funcNames(t, src)
	if want := []string{"handle.LockWait", "list.Len", "plain"}; !reflect.DeepEqual(got, want) {
		t.Errorf("names %v, want %v", got, want)
	}
}

func funcNames(t *testing.T, src string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok {
			names = append(names, funcName(fd))
		}
	}
	return names
}

// TestInstrumentFileRecordsEveryFunction: every function and function
// literal starts with its Enter call, and the result still parses.
func TestInstrumentFileRecordsEveryFunction(t *testing.T) {
	src := `// Package p is an example.
package p

import "fmt"

var hook = func() {}

func (h *handle) LockWait() error {
	do(func() { fmt.Println() })
	return nil
}
`
	path := filepath.Join(t.TempDir(), "p.go")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := instrumentFile(path, "fs/p.go", "example.com/m/internal/calltrace"); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parser.ParseFile(token.NewFileSet(), path, out, 0); err != nil {
		t.Fatalf("instrumented file does not parse: %v\n%s", err, out)
	}
	for _, want := range []string{
		`import calltrace_ "example.com/m/internal/calltrace"`,
		`var hook = func() {defer calltrace_.Enter("fs/p.go", "var.func1")();}`,
		`func (h *handle) LockWait() error {defer calltrace_.Enter("fs/p.go", "handle.LockWait")();`,
		`do(func() {defer calltrace_.Enter("fs/p.go", "handle.LockWait.func1")(); fmt.Println() })`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

// The server's Finish hook, which a deferred answer runs inside the
// handler, is left out with the observer's; the request's own files are not.
func TestHookFiles(t *testing.T) {
	for file, want := range map[string][2]bool{
		"fs/interrupt.go":     {true, false},
		"lockmgr/observer.go": {true, true},
		"metrics/metrics.go":  {true, true},
		"fs/control/lock.go":  {false, false},
		"lockmgr/acquire.go":  {false, false},
	} {
		if got := [2]bool{hookFile(file), observerHook(file)}; got != want {
			t.Errorf("%s: hookFile, observerHook = %v, want %v", file, got, want)
		}
	}
}

// A request that calls a leaf in another file (mode.go max), a function
// that calls on (state.go lock → state.go new, not a leaf), an observer
// hook, and the backend, whose entry calls into another of its files.
const ruled = `1 E fs/control/lock.go h.LockWaitDeferred
1 E lockmgr/grant.go step
1 E lockmgr/mode.go max
1 X lockmgr/mode.go max
1 E lockmgr/state.go lock
1 E lockmgr/state.go new
1 X lockmgr/state.go new
1 X lockmgr/state.go lock
1 E metrics/metrics.go M.Requested
1 X metrics/metrics.go M.Requested
1 E localbackend/claim.go B.Claim
1 E localbackend/idle.go B.takeIdle
1 E localbackend/claim.go B.claimOnce
1 X localbackend/claim.go B.claimOnce
1 X localbackend/idle.go B.takeIdle
1 X localbackend/claim.go B.Claim
1 X lockmgr/grant.go step
1 X fs/control/lock.go h.LockWaitDeferred
`

func TestRuleLeavesOutLeavesHooksAndTheBackend(t *testing.T) {
	root, err := requestCalls(strings.NewReader(ruled), "LockWaitDeferred")
	if err != nil {
		t.Fatal(err)
	}
	// The control: without the rule, every file of the trace is visited.
	if r := read(root, nil); len(r.files) != 7 {
		t.Fatalf("read once visits %v, want 7 files", r.files)
	}
	b := followed(root, true)
	if want := []string{"fs/control/lock.go", "lockmgr/grant.go", "lockmgr/state.go", "lockmgr/grant.go", "localbackend/claim.go", "lockmgr/grant.go", "fs/control/lock.go"}; !reflect.DeepEqual(b.steps, want) {
		t.Errorf("to the backend's entry: steps %v, want %v", b.steps, want)
	}
	if b.total() != 3 {
		t.Errorf("to the backend's entry: %d returns, want 3", b.total())
	}
	in := followed(root, false)
	if want := []string{"fs/control/lock.go", "lockmgr/grant.go", "lockmgr/state.go", "lockmgr/grant.go", "localbackend/claim.go", "localbackend/idle.go", "localbackend/claim.go", "lockmgr/grant.go", "fs/control/lock.go"}; !reflect.DeepEqual(in.steps, want) {
		t.Errorf("into the backend: steps %v, want %v", in.steps, want)
	}
	if got := b.returnsTo("lockmgr/mode.go"); got != "-" {
		t.Errorf("returns to the leaf's file %s, want - (not visited)", got)
	}
}
