package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/applistener/applistener/admin"
	"github.com/applistener/applistener/internal/logsink"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/panicguard"
)

// logFiles are a command's log destinations: diag is the diagnostic log
// ("" = stderr), access and ocsf the access log and the OCSF records (""
// = wherever the diagnostic log goes).
type logFiles struct {
	diag, access, ocsf string
}

// logFileFlags adds --log-file and, where the command has them, the access
// log's and the OCSF records' own files.
func logFileFlags(fs *flag.FlagSet, files *logFiles, access, ocsf bool) {
	fs.StringVar(&files.diag, "log-file", "", "write the diagnostic log to this file instead of stderr (appended; reopened on SIGUSR1, after logrotate's rename)")
	if access {
		fs.StringVar(&files.access, "access-log-file", "", "write the access log to this file (default: with the diagnostic log; reopened on SIGUSR1)")
	}
	if ocsf {
		fs.StringVar(&files.ocsf, "ocsf-file", "", "write the OCSF records (--ocsf-json) to this file (default: with the diagnostic log; reopened on SIGUSR1)")
	}
}

// logSinks are a command's bounded log writers: the diagnostic log's, the
// access log's and the OCSF records', the same writer where they share a
// destination.
type logSinks struct {
	diag, access, ocsf *logsink.Writer
}

// oneSink is logSinks that all write to sink.
func oneSink(sink *logsink.Writer) logSinks { return logSinks{diag: sink, access: sink, ocsf: sink} }

// dropped is the number of lines the distinct writers dropped.
func (s logSinks) dropped() float64 {
	var n uint64
	seen := make(map[*logsink.Writer]bool, 3)
	for _, w := range []*logsink.Writer{s.diag, s.access, s.ocsf} {
		if w != nil && !seen[w] {
			seen[w] = true
			n += w.Dropped()
		}
	}
	return float64(n)
}

// droppedCounter is applistener_log_lines_dropped_total over sinks.
func droppedCounter(sinks logSinks) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "applistener_log_lines_dropped_total", Help: "Log lines dropped because a log writer's queue was full.",
	}, sinks.dropped)
}

// commandSetup opens a command's log destinations, each behind its own
// bounded writer, and returns a context that ends on SIGTERM or SIGINT.
// SIGUSR1 reopens the log files by name (logrotate's convention); it never
// ends the process. done flushes the logs, closes the files and stops the
// signals.
func commandSetup(stderr io.Writer, format, level string, files logFiles) (ctx context.Context, logger *slog.Logger, sinks logSinks, done func(), err error) {
	json := format == "json"
	var opened []*logsink.File
	var writers []*logsink.Writer
	byPath := map[string]*logsink.Writer{}
	open := func(path string, fallback *logsink.Writer) (*logsink.Writer, error) {
		if path == "" && fallback != nil {
			return fallback, nil
		}
		if w := byPath[path]; w != nil {
			return w, nil
		}
		dst := stderr
		if path != "" {
			f, err := logsink.OpenFile(path)
			if err != nil {
				return nil, err
			}
			opened = append(opened, f)
			dst = f
		}
		w := logsink.New(dst, logsink.DefaultQueue, 10*time.Second, json)
		writers = append(writers, w)
		byPath[path] = w
		return w, nil
	}
	closeAll := func() {
		for _, w := range writers {
			w.Close(2 * time.Second)
		}
		for _, f := range opened {
			_ = f.Close()
		}
	}
	if sinks.diag, err = open(files.diag, nil); err == nil {
		if sinks.access, err = open(files.access, sinks.diag); err == nil {
			sinks.ocsf, err = open(files.ocsf, sinks.diag)
		}
	}
	if err != nil {
		closeAll()
		return nil, nil, logSinks{}, nil, err
	}
	logger = newLogger(format, level, sinks.diag)

	// SIGUSR1 is caught whether or not there are files: its default action
	// would end the process.
	usr1 := make(chan os.Signal, 1)
	if len(reopenSignals) > 0 { // Notify without signals would relay every one
		signal.Notify(usr1, reopenSignals...)
	}
	stopReopen := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stopReopen:
				return
			case <-usr1:
				reopenLogs(logger, opened)
			}
		}
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	return ctx, logger, sinks, func() {
		stop()
		signal.Stop(usr1)
		close(stopReopen)
		wg.Wait()
		closeAll()
	}, nil
}

// reopenLogs reopens every log file by name; a file that cannot be
// reopened stays in use and is logged.
func reopenLogs(logger *slog.Logger, files []*logsink.File) {
	for _, f := range files {
		if err := f.Reopen(); err != nil {
			logger.Error("log file not reopened; writing to the old one", "path", f.Path(), "err", err)
			continue
		}
		logger.Info("log file reopened", "path", f.Path())
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
// metrics, applistener_build_info and applistener_panics_total.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildInfoGauge(readBuildInfo()))
	reg.MustRegister(panicguard.Collector())
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
