package main

import (
	"fmt"
	"net"
	"os"
	"strings"
)

// The systemd notification protocol (sd_notify(3)), for Type=notify units:
// one datagram of newline-separated VAR=value assignments sent to the
// AF_UNIX socket named by $NOTIFY_SOCKET (a path, or "@name" for an
// abstract socket). It is written out here rather than imported from
// github.com/coreos/go-systemd/v22/daemon because lockfs needs only this
// send, which is a dozen lines, and the protocol is a stable interface of
// systemd (https://systemd.io/PORTABILITY_AND_STABILITY/).

// notifySocketEnv names the socket; unset outside a Type=notify unit.
const notifySocketEnv = "NOTIFY_SOCKET"

// sdNotify sends state ("READY=1", "STOPPING=1", "STATUS=...") to the
// service manager. Without $NOTIFY_SOCKET it does nothing and returns nil.
func sdNotify(state string) error {
	addr := os.Getenv(notifySocketEnv)
	if addr == "" {
		return nil
	}
	if strings.HasPrefix(addr, "@") {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify %s: %w", os.Getenv(notifySocketEnv), err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify %s: %w", os.Getenv(notifySocketEnv), err)
	}
	return nil
}
