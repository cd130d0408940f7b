package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The data-path modes: metadata operations, writes and reads through the
// mount.

// meta: n cycles of create (open O_CREAT|O_EXCL, close), stat and unlink of
// a new file in dir.
func runMeta(args []string) error {
	fl := flag.NewFlagSet("meta", flag.ExitOnError)
	dir := fl.String("dir", "", "directory to work in")
	n := fl.Int("n", 1000, "cycles to time")
	warm := fl.Int("warm", 20, "untimed cycles first")
	fl.Parse(args)
	pid := os.Getpid()
	one := func(i int) error {
		p := filepath.Join(*dir, fmt.Sprintf("m%d-%d", pid, i))
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		if err := unix.Close(fd); err != nil {
			return fmt.Errorf("close %s: %w", p, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if err := unix.Unlink(p); err != nil {
			return fmt.Errorf("unlink %s: %w", p, err)
		}
		return nil
	}
	for i := 0; i < *warm; i++ {
		if err := one(-1 - i); err != nil {
			return err
		}
	}
	start := mono()
	for i := 0; i < *n; i++ {
		if err := one(i); err != nil {
			return err
		}
	}
	ns := mono() - start
	return emit(map[string]float64{"ns_per_op": float64(ns) / float64(*n), "ops": float64(*n)})
}

// write: create file (it must not exist) and write size bytes to it
// sequentially in bs-sized writes; with -fsync, fsync before the clock
// stops. The close is timed too.
func runWrite(args []string) error {
	fl := flag.NewFlagSet("write", flag.ExitOnError)
	file := fl.String("file", "", "file to create")
	size := fl.Int64("size", 256<<20, "bytes to write")
	bs := fl.Int("bs", 1<<20, "bytes per write")
	doSync := fl.Bool("fsync", false, "fsync before stopping the clock")
	fl.Parse(args)
	buf := make([]byte, *bs)
	for i := range buf {
		buf[i] = byte(i*7 + 1) // not all zeroes
	}
	start := mono()
	fd, err := unix.Open(*file, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", *file, err)
	}
	for left := *size; left > 0; {
		b := buf[:min(int64(len(buf)), left)]
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("write %s: %w", *file, err)
		}
		left -= int64(n)
	}
	if *doSync {
		if err := unix.Fsync(fd); err != nil {
			unix.Close(fd)
			return fmt.Errorf("fsync %s: %w", *file, err)
		}
	}
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close %s: %w", *file, err)
	}
	ns := mono() - start
	return emit(map[string]float64{"bytes": float64(*size), "ns": float64(ns),
		"mb_per_s": float64(*size) / (1 << 20) / (float64(ns) / 1e9)})
}

// read: read file sequentially to its end in bs-sized reads.
func runRead(args []string) error {
	fl := flag.NewFlagSet("read", flag.ExitOnError)
	file := fl.String("file", "", "file to read")
	bs := fl.Int("bs", 1<<20, "bytes per read")
	fl.Parse(args)
	buf := make([]byte, *bs)
	start := mono()
	fd, err := unix.Open(*file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", *file, err)
	}
	var total int64
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("read %s: %w", *file, err)
		}
		if n == 0 {
			break
		}
		total += int64(n)
	}
	unix.Close(fd)
	ns := mono() - start
	return emit(map[string]float64{"bytes": float64(total), "ns": float64(ns),
		"mb_per_s": float64(total) / (1 << 20) / (float64(ns) / 1e9)})
}
