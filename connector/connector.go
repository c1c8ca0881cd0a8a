// Package connector dials a loopback port of one sandbox instance. Each
// kind reaches the sandbox's own loopback a different way: tcp (the
// supervisor shares the sandbox's network namespace), netns (enter the
// sandbox's namespace to create the socket) and unix (a per-instance Unix
// socket relay). A connector knows nothing about HTTP.
package connector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Connector dials a port on one sandbox instance's loopback.
type Connector interface {
	// Dial connects to port. Errors wrap ErrUnavailable when the instance
	// itself is gone (its namespace or socket directory disappeared).
	Dial(ctx context.Context, port int) (net.Conn, error)
	// String describes the connector for logs.
	String() string
}

// Liveness is implemented by connectors whose target can disappear under
// the supervisor (a network namespace, a socket directory). Alive reports
// an error wrapping ErrUnavailable once it is gone.
type Liveness interface {
	Alive() error
}

// Kinds of connector, as the configuration document names them.
const (
	KindTCP   = "tcp"
	KindUnix  = "unix"
	KindNetNS = "netns"
)

// New returns the connector of a kind: tcp dials host (a loopback address;
// "" is not accepted), unix dials the socket path template, netns enters
// the namespace at path.
func New(kind, host, path string) (Connector, error) {
	switch kind {
	case KindTCP:
		if host == "" {
			return nil, errors.New("tcp connector: no host")
		}
		return TCP{Host: host}, nil
	case KindUnix:
		return Unix{PathTemplate: path}, nil
	case KindNetNS:
		return NetNS{Path: path}, nil
	}
	return nil, fmt.Errorf("connector type %q is not supported by this build", kind)
}

// ErrUnavailable marks a dial failure caused by the instance being gone
// rather than the app not listening.
var ErrUnavailable = errors.New("sandbox instance unavailable")

// TCP dials host:port in the supervisor's own network namespace. Host must
// be a loopback address; the configuration validator guarantees it.
type TCP struct {
	Host string
}

// Dial connects with TCP_NODELAY (Go's default for TCP).
func (c TCP) Dial(ctx context.Context, port int) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(c.Host, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("tcp connector: %w", err)
	}
	return conn, nil
}

// String returns "tcp:HOST".
func (c TCP) String() string { return "tcp:" + c.Host }

// Unix dials a per-port Unix socket: PathTemplate with "{port}" replaced by
// the port number, such as /run/sbx/demo/{port}.sock.
type Unix struct {
	PathTemplate string
}

// Path returns the socket path for port.
func (c Unix) Path(port int) string {
	return strings.ReplaceAll(c.PathTemplate, "{port}", strconv.Itoa(port))
}

// Dial connects to the port's socket. A missing socket directory means the
// instance is gone (ErrUnavailable); a missing socket in an existing
// directory means the app is not listening.
func (c Unix) Dial(ctx context.Context, port int) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Path(port))
	if err != nil {
		if aerr := c.Alive(); aerr != nil {
			return nil, aerr
		}
		return nil, fmt.Errorf("unix connector: %w", err)
	}
	return conn, nil
}

// Alive reports whether the instance's socket directory still exists.
func (c Unix) Alive() error {
	dir := filepath.Dir(c.PathTemplate)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("%w: unix socket directory %s: %v", ErrUnavailable, dir, err)
	}
	return nil
}

// String returns "unix:TEMPLATE".
func (c Unix) String() string { return "unix:" + c.PathTemplate }
