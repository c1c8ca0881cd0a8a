package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/applistener/applistener/admin"
	"github.com/applistener/applistener/internal/logsink"
	"github.com/applistener/applistener/internal/ocsf"
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

// ocsfFlags adds --ocsf-json and --ocsf-level to fs.
func ocsfFlags(fs *flag.FlagSet, on *bool, level *string) {
	fs.BoolVar(on, "ocsf-json", false, "also write OCSF 1.x JSON records (HTTP Activity, Network Activity, Entity Management), one per line, to the log writer")
	fs.StringVar(level, "ocsf-level", "info", "level of the OCSF records written, independent of --log-level: debug (adds allowed requests, accepted connections, renewals), info, warn or error")
}

// newOCSF is a command's OCSF emitter: writing to sink at level when on,
// otherwise writing nothing (it still names the product in the access
// log's OCSF lines).
func newOCSF(on bool, level string, sink *logsink.Writer) *ocsf.Emitter {
	product := ocsf.Product{Version: readBuildInfo().Version}
	lvl, _ := ocsf.ParseLevel(level)
	if !on || sink == nil {
		return ocsf.NewEmitter(nil, ocsf.LevelOff, product)
	}
	return ocsf.NewEmitter(sink, lvl, product)
}

// adminServer is a command's admin endpoints; without an address it is off
// and its methods do nothing.
type adminServer struct {
	srv *admin.Server
}

// startAdmin binds the admin endpoints on addr (when set), adds extra
// handlers by pattern, and serves them in a goroutine owned by wg. pprof
// adds /debug/pprof (--admin-pprof).
func startAdmin(wg *sync.WaitGroup, addr string, gatherer prometheus.Gatherer, ready func() (bool, string),
	logger *slog.Logger, extra map[string]http.Handler, pprof bool) (*adminServer, error) {
	a, err := bindAdmin(addr, gatherer, ready, logger, pprof)
	if err != nil {
		return nil, err
	}
	a.start(wg, logger, extra)
	return a, nil
}

// bindAdmin binds the admin endpoints on addr (when set) without serving
// them yet: start serves them. A bind error is one line naming the flag.
func bindAdmin(addr string, gatherer prometheus.Gatherer, ready func() (bool, string),
	logger *slog.Logger, pprof bool) (*adminServer, error) {
	a := &adminServer{}
	if addr == "" {
		return a, nil
	}
	srv, err := admin.New(addr, gatherer, ready, logger)
	if err != nil {
		return nil, fmt.Errorf("--admin-address %s: cannot listen: %s", addr, bindError(err))
	}
	if pprof {
		srv.EnablePprof()
	}
	a.srv = srv
	return a, nil
}

// start adds extra handlers by pattern and serves the endpoints in a
// goroutine owned by wg.
func (a *adminServer) start(wg *sync.WaitGroup, logger *slog.Logger, extra map[string]http.Handler) {
	if a.srv == nil {
		return
	}
	for pattern, h := range extra {
		a.srv.Handle(pattern, h)
	}
	wg.Go(func() {
		if err := a.srv.Serve(); err != nil {
			logger.Error("admin server stopped", "err", err)
		}
	})
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

// newRegistry is a command's metrics registry: Go runtime and process
// metrics and applistener_build_info.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildInfoGauge(readBuildInfo()))
	return reg
}

// buildInfoGauge is applistener_build_info{version,revision,goversion} = 1,
// the same values `applistener version` prints (revision "unknown" when the
// build has no VCS information, with a "-dirty" suffix for a modified tree).
func buildInfoGauge(b buildInfo) prometheus.Collector {
	revision := cmp.Or(b.Revision, "unknown")
	if b.Modified {
		revision += "-dirty"
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "applistener_build_info",
		Help: "Always 1; its labels are the version, VCS revision and Go version of the running binary.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(b.Version, revision, b.GoVersion).Set(1)
	return g
}
