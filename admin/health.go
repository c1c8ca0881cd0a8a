package admin

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
)

// HealthListener is a TCP listener that accepts and closes connections
// (kubelet tcpSocket probes) and is open only while the process is ready.
type HealthListener struct {
	addr string
	log  *slog.Logger

	mu      sync.Mutex
	ln      net.Listener
	done    chan struct{}
	stopped bool
	bound   string
}

// NewHealthListener returns a closed health listener for addr.
func NewHealthListener(addr string, logger *slog.Logger) *HealthListener {
	return &HealthListener{addr: addr, log: logger}
}

// SetReady opens (true) or closes (false) the listener. Opening an open
// listener or closing a closed one does nothing.
func (h *HealthListener) SetReady(ready bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil
	}
	if ready == (h.ln != nil) {
		return nil
	}
	if !ready {
		h.closeLocked()
		h.log.Info("health listener closed", "address", h.addr)
		return nil
	}
	ln, err := net.Listen("tcp", h.addr)
	if err != nil {
		return fmt.Errorf("health listener: %w", err)
	}
	h.ln = ln
	h.bound = ln.Addr().String()
	done := make(chan struct{})
	h.done = done
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			_ = c.Close()
		}
	}()
	h.log.Info("health listener open", "address", h.bound)
	return nil
}

func (h *HealthListener) closeLocked() {
	if h.ln == nil {
		return
	}
	_ = h.ln.Close()
	<-h.done
	h.ln = nil
}

// Addr returns the address last bound ("" before the first open).
func (h *HealthListener) Addr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bound
}

// Close closes the listener for good.
func (h *HealthListener) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closeLocked()
	h.stopped = true
}
