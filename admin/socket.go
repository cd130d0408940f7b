package admin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// SocketDir is where mounts put their admin sockets.
const SocketDir = "/run/lockfs"

// maxSocketPath is the longest path a unix socket address holds: sun_path
// is 108 bytes on Linux, including the terminating NUL.
const maxSocketPath = 107

// SocketPath returns the admin socket of the mount at mountpoint (an
// absolute, clean path): dir/NAME.sock, where NAME is the mountpoint escaped
// as `systemd-escape --path` escapes it ("/srv/locked" -> "srv-locked",
// "/x/a-b" -> `x-a\x2db`), so distinct mountpoints never share a socket
// and the name matches the mount's lockfs@NAME.service. A name that would
// not fit in a socket address is cut and ends in a hash of the whole
// mountpoint; the daemon's replies carry its mountpoint, which clients
// compare (see Reply.Mountpoint).
func SocketPath(dir, mountpoint string) string {
	name := EscapePath(mountpoint)
	if len(filepath.Join(dir, name+".sock")) > maxSocketPath {
		sum := sha256.Sum256([]byte(mountpoint))
		suffix := "~" + hex.EncodeToString(sum[:8])
		keep := maxSocketPath - len(filepath.Join(dir, suffix+".sock"))
		if keep < 0 {
			keep = 0
		}
		name = name[:min(keep, len(name))] + suffix
	}
	return filepath.Join(dir, name+".sock")
}

// EscapePath escapes an absolute path the way `systemd-escape --path` does:
// the slashes between components become "-", and every byte other than
// ASCII letters, digits, ":", "_" and a non-leading "." becomes `\xNN`.
// The root is "-". Distinct clean paths give distinct names.
func EscapePath(p string) string {
	p = strings.Trim(filepath.Clean(p), "/")
	if p == "" {
		return "-"
	}
	const hexdigits = "0123456789abcdef"
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '/':
			b.WriteByte('-')
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == ':', c == '_',
			c == '.' && i > 0:
			b.WriteByte(c)
		default:
			b.WriteString(`\x`)
			b.WriteByte(hexdigits[c>>4])
			b.WriteByte(hexdigits[c&0xf])
		}
	}
	return b.String()
}

// staleAge is how old a socket nobody answers on must be before RemoveStale
// removes it: a daemon that is starting binds its socket a moment before it
// listens, and connecting in between is refused too.
const staleAge = 10 * time.Second

// RemoveStale removes the sockets in dir that belonged to daemons that are
// gone: a daemon killed with SIGKILL cannot remove its own. A socket is
// stale when connecting to it is refused (nobody listens) and it is older
// than a few seconds; any other answer, or an error, leaves it alone.
// Log, if not nil, gets a line for every socket removed or not removable.
func RemoveStale(dir string, log logrus.FieldLogger) {
	names, err := filepath.Glob(filepath.Join(dir, "*.sock"))
	if err != nil {
		return
	}
	for _, p := range names {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&os.ModeSocket == 0 || time.Since(fi.ModTime()) < staleAge {
			continue
		}
		c, err := net.DialTimeout("unix", p, time.Second)
		if err == nil {
			c.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		err = os.Remove(p)
		if log == nil || errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			log.WithError(err).WithField("socket", p).Warn("cannot remove a dead daemon's admin socket")
			continue
		}
		log.WithField("socket", p).Info("removed the admin socket of a daemon that is gone")
	}
}
