package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/admin"
	"github.com/applistener/applistener/internal/logsink"
)

// commandSetup starts a command's bounded log writer and a context that
// ends on SIGTERM or SIGINT. done flushes the log and stops the signals.
func commandSetup(stderr io.Writer, format, level string) (ctx context.Context, logger *slog.Logger, sink *logsink.Writer, done func()) {
	sink = logsink.New(stderr, logsink.DefaultQueue, 10*time.Second, format == "json")
	logger = newLogger(format, level, sink)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	return ctx, logger, sink, func() {
		stop()
		sink.Close(2 * time.Second)
	}
}

// adminServer is a command's admin endpoints; without an address it is off
// and its methods do nothing.
type adminServer struct {
	srv *admin.Server
}

// startAdmin binds the admin endpoints on addr (when set), adds extra
// handlers by pattern, and serves them in a goroutine owned by wg.
func startAdmin(wg *sync.WaitGroup, addr string, gatherer prometheus.Gatherer, ready func() (bool, string),
	logger *slog.Logger, extra map[string]http.Handler) (*adminServer, error) {
	a := &adminServer{}
	if addr == "" {
		return a, nil
	}
	srv, err := admin.New(addr, gatherer, ready, logger)
	if err != nil {
		return nil, err
	}
	for pattern, h := range extra {
		srv.Handle(pattern, h)
	}
	a.srv = srv
	wg.Go(func() {
		if err := srv.Serve(); err != nil {
			logger.Error("admin server stopped", "err", err)
		}
	})
	return a, nil
}

// Addr returns the bound address, "" when off.
func (a *adminServer) Addr() string {
	if a.srv == nil {
		return ""
	}
	return a.srv.Addr().String()
}

// Stop shuts the endpoints down, waiting at most a second.
func (a *adminServer) Stop() {
	if a.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = a.srv.Shutdown(ctx)
}
