//go:build !linux

package connector

import (
	"context"
	"errors"
	"net"
)

// NetNS is only available on Linux.
type NetNS struct {
	Path string
}

// String returns "netns:PATH".
func (c NetNS) String() string { return "netns:" + c.Path }

// Alive always fails off Linux.
func (c NetNS) Alive() error { return errors.New("netns connector: Linux only") }

// Dial always fails off Linux.
func (c NetNS) Dial(context.Context, int) (net.Conn, error) {
	return nil, errors.New("netns connector: Linux only")
}
