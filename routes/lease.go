package routes

import (
	"errors"
	"runtime"
	"sync"
)

// Revocation causes. Every cancelled lease carries exactly one of these.
var (
	// ErrWithdrawn: the route is no longer in the delivered configuration.
	ErrWithdrawn = errors.New("route withdrawn")
	// ErrChanged: the route's target (generation, connector, port or protocol) changed.
	ErrChanged = errors.New("route changed")
	// ErrRejected: the route's instance entry failed validation.
	ErrRejected = errors.New("route rejected")
	// ErrExpired: the route was not renewed within the freshness window.
	ErrExpired = errors.New("route expired")
	// ErrStopped: the route's instance stopped (its connector is gone).
	ErrStopped = errors.New("instance stopped")
	// ErrShutdown: the process is shutting down.
	ErrShutdown = errors.New("shutting down")
)

// CauseLabel returns the short metric label of a revocation cause.
func CauseLabel(err error) string {
	switch {
	case errors.Is(err, ErrWithdrawn):
		return "withdrawn"
	case errors.Is(err, ErrChanged):
		return "changed"
	case errors.Is(err, ErrRejected):
		return "rejected"
	case errors.Is(err, ErrExpired):
		return "expired"
	case errors.Is(err, ErrStopped):
		return "stopped"
	case errors.Is(err, ErrShutdown):
		return "shutdown"
	case errors.Is(err, ErrSleeping):
		return "sleeping"
	}
	return "other"
}

// Stream is anything that must end when its route is revoked: a client
// connection, an upgraded WebSocket, a pooled backend connection.
// Revoke must not block for long: it closes sockets, it does not wait.
type Stream interface {
	Revoke(cause error)
}

// Lease is held by every stream of one installed route. Cancelling the lease
// revokes every attached stream. A Lease is safe for concurrent use.
type Lease struct {
	mu      sync.Mutex
	done    chan struct{}
	cause   error
	streams map[Stream]struct{}
}

// NewLease returns a live lease.
func NewLease() *Lease {
	return &Lease{done: make(chan struct{}), streams: make(map[Stream]struct{})}
}

// Done is closed when the lease is cancelled.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err returns the cancellation cause, or nil while the lease is live.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cause
}

// Live reports whether the lease has not been cancelled.
func (l *Lease) Live() bool {
	select {
	case <-l.done:
		return false
	default:
		return true
	}
}

// Attach registers s to be revoked when the lease is cancelled. It returns
// false, without registering, when the lease is already cancelled: the
// caller must then refuse or close the stream itself.
func (l *Lease) Attach(s Stream) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cause != nil {
		return false
	}
	l.streams[s] = struct{}{}
	return true
}

// Detach removes s; it is a no-op when s is not attached.
func (l *Lease) Detach(s Stream) {
	l.mu.Lock()
	delete(l.streams, s)
	l.mu.Unlock()
}

// Streams returns the number of attached streams.
func (l *Lease) Streams() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.streams)
}

// Cancel revokes the lease with cause and revokes every attached stream,
// spreading the work over the available CPUs. It returns the number of
// streams revoked; a second Cancel does nothing and returns 0.
func (l *Lease) Cancel(cause error) int {
	l.mu.Lock()
	if l.cause != nil {
		l.mu.Unlock()
		return 0
	}
	if cause == nil {
		cause = ErrWithdrawn
	}
	l.cause = cause
	close(l.done)
	streams := make([]Stream, 0, len(l.streams))
	for s := range l.streams {
		streams = append(streams, s)
	}
	l.streams = nil
	l.mu.Unlock()
	revokeAll(streams, cause)
	return len(streams)
}

// revokeAll revokes streams in parallel chunks; it returns when every
// Revoke call has returned.
func revokeAll(streams []Stream, cause error) {
	const chunk = 256
	if len(streams) <= chunk {
		for _, s := range streams {
			s.Revoke(cause)
		}
		return
	}
	workers := min(runtime.GOMAXPROCS(0)*2, (len(streams)+chunk-1)/chunk)
	var wg sync.WaitGroup
	per := (len(streams) + workers - 1) / workers
	for i := 0; i < len(streams); i += per {
		part := streams[i:min(i+per, len(streams))]
		wg.Go(func() {
			for _, s := range part {
				s.Revoke(cause)
			}
		})
	}
	wg.Wait()
}
