//go:build linux

package connector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// NetNS dials a port on the loopback of another network namespace, named
// by a path such as /run/netns/NAME or /proc/PID/ns/net. The socket is
// created inside that namespace on a locked OS thread that then returns to
// the supervisor's own namespace; if it cannot return, the thread is
// retired with its goroutine, so the namespace never leaks to other
// goroutines. Entering a namespace needs CAP_SYS_ADMIN.
type NetNS struct {
	Path string
}

// String returns "netns:PATH".
func (c NetNS) String() string { return "netns:" + c.Path }

// Alive reports whether the namespace path still names a network namespace.
func (c NetNS) Alive() error {
	var st unix.Statfs_t
	if err := unix.Statfs(c.Path, &st); err != nil {
		return fmt.Errorf("%w: netns %s: %v", ErrUnavailable, c.Path, err)
	}
	if st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("%w: netns %s: not a namespace file", ErrUnavailable, c.Path)
	}
	return nil
}

// Dial connects to 127.0.0.1:port inside the namespace.
func (c NetNS) Dial(ctx context.Context, port int) (net.Conn, error) {
	target, err := unix.Open(c.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: netns %s: %v", ErrUnavailable, c.Path, err)
	}
	defer func() { _ = unix.Close(target) }()
	if err := c.Alive(); err != nil {
		return nil, err
	}
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		// This goroutine owns the locked thread. It unlocks only after the
		// thread is back in its own namespace; otherwise the runtime
		// terminates the thread when the goroutine exits.
		runtime.LockOSThread()
		conn, err, restored := dialIn(ctx, target, port)
		if restored {
			runtime.UnlockOSThread()
		}
		done <- result{conn, err}
	}()
	r := <-done
	return r.conn, r.err
}

// dialIn enters target, dials, and returns to the thread's own namespace.
func dialIn(ctx context.Context, target, port int) (conn net.Conn, err error, restored bool) {
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("netns: own namespace: %w", err), true
	}
	defer func() { _ = unix.Close(self) }()
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		if errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w (entering a network namespace needs CAP_SYS_ADMIN)", err)
		}
		return nil, fmt.Errorf("%w: netns setns: %v", ErrUnavailable, err), true
	}
	var d net.Dialer
	conn, err = d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if rerr := unix.Setns(self, unix.CLONE_NEWNET); rerr != nil {
		fmt.Fprintf(os.Stderr, "applistener: netns: cannot return to own namespace, retiring thread: %v\n", rerr)
		return conn, err, false
	}
	if err != nil {
		return nil, fmt.Errorf("netns connector: %w", err), true
	}
	return conn, nil, true
}
