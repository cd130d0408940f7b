package testutil

import "golang.org/x/sys/unix"

// ReadNoPoll reads a file with plain system calls. A process that serves
// a FUSE mount itself (an in-process daemon in a test) must not open files
// there with os.Open: that registers the descriptor with the Go
// netpoller, whose epoll_ctl and epoll_wait make the kernel ask this very
// server to poll the file, from threads that hold the runtime's Ps; with
// every P so held, the server cannot answer and the process deadlocks.
func ReadNoPoll(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, err
		case n == 0:
			return out, nil
		}
		out = append(out, buf[:n]...)
	}
}
