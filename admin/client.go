package admin

// The client side: what "lockfs status" and "lockfs break" call.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
)

// Call sends one request to the admin socket at path and returns the reply.
// A reply that carries an error is returned as an error too.
func Call(ctx context.Context, path string, req Request) (Reply, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Reply{}, fmt.Errorf("admin socket %s: %w (is the mount's daemon running, and are you root or its owner?)", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return Reply{}, fmt.Errorf("admin socket %s: %w", path, err)
	}
	var reply Reply
	if err := json.NewDecoder(c).Decode(&reply); err != nil {
		return Reply{}, fmt.Errorf("admin socket %s: %w", path, err)
	}
	if reply.Error != "" {
		return reply, errors.New(reply.Error)
	}
	return reply, nil
}
