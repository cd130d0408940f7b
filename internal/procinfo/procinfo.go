// Package procinfo reads what /proc says about processes; no other package
// of lockfs reads a process's /proc entries or calls kcmp(2).
//
// For the engine, Tree (tree.go, lineage.go, tree_watch.go) is the process tree
// lockmgr asks through its ProcessTree and ProcessWatcher interfaces: a
// thread's lineage, when a process exits, and who holds a descriptor of a
// control file. For people, Describe gives a process's command line, and
// for a lock wrapper (flock(1), `lockfs lock`) the command it runs; lockfs
// shows these in `lockfs status` and in the daemon's log lines about waits
// and refusals. Describe is best effort: a process that is gone, or a
// /proc that hides it, gives empty fields, never an error. "Has it
// exited" has one answer (stat.exited), which Exited and Tree.Alive give.
package procinfo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Root is the usual procfs mountpoint.
const Root = "/proc"

// rootOr returns root, or Root if root is "": the procfs mountpoint the
// functions of this package read, a fake one in tests.
func rootOr(root string) string {
	if root == "" {
		return Root
	}
	return root
}

// maxCmdline bounds a rendered command line: status tables and log lines
// stay readable when a process has a huge argv.
const maxCmdline = 512

// Command is one process as people know it.
type Command struct {
	PID int `json:"pid"`
	// Name is the kernel's short name (/proc/PID/comm): "flock", "make".
	Name string `json:"name,omitempty"`
	// Line is the command line, arguments quoted as a shell would need
	// them and control characters escaped; "" for a process without one
	// (a zombie, a kernel thread).
	Line string `json:"cmdline,omitempty"`
	// Runs is, for a lock wrapper (flock(1), `lockfs lock`), the command it
	// started and waits for: the work the lock protects.
	Runs *Command `json:"runs,omitempty"`
}

// Describe returns pid's command, and the child it runs if it is a lock
// wrapper. root is the procfs mountpoint ("" means Root).
func Describe(root string, pid int) Command {
	root = rootOr(root)
	c := read(root, pid)
	if c.Name == "" || !isWrapper(root, c) {
		return c
	}
	if kids := Children(root, pid); len(kids) > 0 {
		child := read(root, kids[0])
		if child.Name != "" {
			c.Runs = &child
		}
	}
	return c
}

// String renders c on one line: "flock -x a/.lock make deploy" or, when
// the command line is unreadable, "[name]".
func (c Command) String() string {
	switch {
	case c.Line != "":
		return c.Line
	case c.Name != "":
		return "[" + c.Name + "]"
	}
	return ""
}

func read(root string, pid int) Command {
	c := Command{PID: pid}
	if pid <= 0 {
		return c
	}
	dir := filepath.Join(root, strconv.Itoa(pid))
	if b, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
		c.Name = escape(strings.TrimSuffix(string(b), "\n"))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil && len(b) > 0 {
		c.Line = render(strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"))
	}
	return c
}

// isWrapper reports whether c only holds a lock for the command it runs.
func isWrapper(root string, c Command) bool {
	if c.Name == "flock" {
		return true
	}
	// `lockfs lock ...`: comm is "lockfs", the first argument "lock".
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(c.PID), "cmdline"))
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	return len(args) > 1 && filepath.Base(args[0]) == "lockfs" && args[1] == "lock"
}

// Children returns pid's child processes, oldest first, from
// /proc/PID/task/*/children; none if the kernel does not provide it.
func Children(root string, pid int) []int {
	root = rootOr(root)
	tasks, _ := filepath.Glob(filepath.Join(root, strconv.Itoa(pid), "task", "*", "children"))
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// render joins argv, quoting the arguments a shell would split or expand.
func render(argv []string) string {
	var b strings.Builder
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quote(a))
		if b.Len() > maxCmdline {
			return b.String()[:maxCmdline] + "..."
		}
	}
	return b.String()
}

// quote returns a as a shell word: unchanged if it is plain, else in single
// quotes; control characters are escaped either way, so that a command line
// cannot forge lines of a table or a log.
func quote(a string) string {
	if a != "" && strings.IndexFunc(a, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
	}) < 0 {
		return a
	}
	return "'" + escape(strings.ReplaceAll(a, "'", `'\''`)) + "'"
}

// escape replaces control characters with Go-style escapes (\n, \x1b).
func escape(s string) string {
	if strings.IndexFunc(s, isControl) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }

// Exited reports whether process (or thread) pid has exited or is exiting:
// it is gone from /proc, or its stat line says so (stat.exited, the answer
// Tree.Alive gives too).
func Exited(root string, pid int) bool {
	root = rootOr(root)
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "stat"))
	return exitedStat(b, err)
}

// clockTick is the unit of /proc/PID/stat's times: USER_HZ, sysconf's
// _SC_CLK_TCK, 100 on every Linux architecture lockfs builds for.
const clockTick = 10 * time.Millisecond

// CPUTime returns the CPU time, user and system, that process pid (all its
// threads) has used so far, from ROOT/PID/stat (root "" is Root), to the
// clock tick.
func CPUTime(root string, pid int) (time.Duration, error) {
	path := filepath.Join(rootOr(root), strconv.Itoa(pid), "stat")
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	st, err := parseStat(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return time.Duration(st.cpu) * clockTick, nil
}

// exitedStat is Exited on the contents of /proc/PID/stat, or on the error
// of reading it. A process reaped between the open and the read makes the
// read fail with ESRCH: it has exited too.
func exitedStat(b []byte, err error) bool {
	if err != nil {
		return os.IsNotExist(err) || errors.Is(err, syscall.ESRCH)
	}
	st, err := parseStat(b)
	return err == nil && st.exited()
}
