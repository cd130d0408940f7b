package procinfo

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// InGroups reports whether gid is among the supplementary groups of thread
// tid, as ROOT/TID/status lists them ("" means Root). A thread that is
// gone has none.
func InGroups(root string, tid int, gid uint32) bool {
	root = rootOr(root)
	f, err := os.Open(filepath.Join(root, strconv.Itoa(tid), "status"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Groups:")
		if !ok {
			continue
		}
		for _, g := range strings.Fields(rest) {
			if v, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(v) == gid {
				return true
			}
		}
		return false
	}
	return false
}

// HasOpen reports whether process pid has a descriptor open on path, as
// ROOT/PID/fd shows its links ("" means Root). An error means its
// descriptors could not be read (it is gone, or /proc hides them).
func HasOpen(root string, pid int, path string) (bool, error) {
	root = rootOr(root)
	dir := filepath.Join(root, strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && target == path {
			return true, nil
		}
	}
	return false, nil
}

// ThreadOf reports whether thread tid runs in process pid ("" means Root).
func ThreadOf(root string, tid, pid int) bool {
	if tid <= 0 {
		return false
	}
	root = rootOr(root)
	_, err := os.Stat(filepath.Join(root, strconv.Itoa(pid), "task", strconv.Itoa(tid)))
	return err == nil
}
