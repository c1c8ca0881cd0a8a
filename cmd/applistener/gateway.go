package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/applistener/applistener/control/gateway"
	"github.com/applistener/applistener/tlsconf"
)

// gatewayOptions are the flags of `applistener gateway`.
type gatewayOptions struct {
	address      string
	configFile   string
	tokensFile   string
	tlsDir       string
	keepalive    time.Duration
	noPush       bool
	logFormat    string
	logLevel     string
	adminAddress string

	discMaxWatchers  int
	discSendTimeout  time.Duration
	discMaxLifetime  time.Duration
	discReauthPeriod time.Duration
}

func (o *gatewayOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.address, "address", "", "HOST:PORT to serve the control protocol on (required; loopback only without --tls-dir)")
	fs.StringVar(&o.configFile, "config", "", `configuration file: {"supervisors": {"<id>": <configuration document>, ...}} (required; reloaded on change)`)
	fs.StringVar(&o.tokensFile, "tokens", "", `tokens file: {"tokens": [{"token": "...", "supervisor": "<id>"}, {"token": "...", "workspaces": ["<ws>", ...]}]} (required; reloaded on change)`)
	fs.StringVar(&o.tlsDir, "tls-dir", "", "directory with tls.crt and tls.key (a Kubernetes TLS Secret volume): serve HTTPS with HTTP/2")
	fs.DurationVar(&o.keepalive, "keepalive", gateway.DefaultKeepalive, "keepalive interval of push sessions")
	fs.BoolVar(&o.noPush, "no-push", false, "refuse push sessions (501) so that supervisors poll")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&o.adminAddress, "admin-address", "", "address of /healthz, /readyz, /metrics and /debug/pprof (empty: off)")
	fs.IntVar(&o.discMaxWatchers, "discovery-max-watchers-per-token", gateway.DefaultDiscoveryMaxWatchersPerToken, "open discovery watches per token (429 beyond)")
	fs.DurationVar(&o.discSendTimeout, "discovery-send-timeout", gateway.DefaultDiscoverySendTimeout, "a discovery watcher that does not take a line within this is disconnected")
	fs.DurationVar(&o.discMaxLifetime, "discovery-max-watch-lifetime", gateway.DefaultDiscoveryMaxWatchLifetime, "discovery watches end cleanly after this (clients reconnect)")
	fs.DurationVar(&o.discReauthPeriod, "discovery-reauth-period", gateway.DefaultDiscoveryReauthPeriod, "how often an open discovery watch re-checks its token's grant")
}

// validate checks the flags together; every problem is a usage error.
func (o *gatewayOptions) validate() error {
	for _, f := range []struct{ name, v string }{{"--address", o.address}, {"--config", o.configFile}, {"--tokens", o.tokensFile}} {
		if f.v == "" {
			return usagef("%s is required", f.name)
		}
	}
	host, _, err := net.SplitHostPort(o.address)
	if err != nil {
		return usagef("--address %q: %v", o.address, err)
	}
	if o.tlsDir == "" && !isLoopbackHost(host) {
		return usagef("--address %q is not a loopback address: without --tls-dir the gateway serves plain HTTP, "+
			"which is allowed only on loopback (127.0.0.0/8, ::1, localhost)", o.address)
	}
	if o.keepalive < 10*time.Millisecond {
		return usagef("--keepalive must be at least 10ms")
	}
	if o.discMaxWatchers < 1 {
		return usagef("--discovery-max-watchers-per-token must be at least 1")
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"--discovery-send-timeout", o.discSendTimeout}, {"--discovery-max-watch-lifetime", o.discMaxLifetime}, {"--discovery-reauth-period", o.discReauthPeriod}} {
		if f.v < 10*time.Millisecond {
			return usagef("%s must be at least 10ms", f.name)
		}
	}
	switch o.logFormat {
	case "text", "json":
	default:
		return usagef("--log-format must be text or json, not %q", o.logFormat)
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// isLoopbackHost reports whether host is "localhost" or an address in
// 127.0.0.0/8 or ::1. An empty host (all interfaces) is not loopback.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.Unmap().IsLoopback()
}

func gatewayCommand(args []string, stderr io.Writer) error {
	var o gatewayOptions
	if err := parseCommand("gateway", args, &o); err != nil {
		return err
	}
	ctx, logger, _, done := commandSetup(stderr, o.logFormat, o.logLevel)
	defer done()
	return runGateway(ctx, &o, logger, nil)
}

// gatewayShutdownTimeout is how long in-flight requests may finish on
// SIGTERM once the watch streams are ended.
const gatewayShutdownTimeout = 5 * time.Second

// gatewayTLSPoll is how often the TLS directory is checked for a new pair.
const gatewayTLSPoll = 500 * time.Millisecond

// runGateway serves the gateway until ctx ends, then ends the watch streams
// and shuts the server down. onStarted, if not nil, is told the bound
// address.
func runGateway(ctx context.Context, o *gatewayOptions, logger *slog.Logger, onStarted func(addr string)) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	gw, err := gateway.New(gateway.Config{
		ConfigPath:  o.configFile,
		TokensPath:  o.tokensFile,
		Keepalive:   o.keepalive,
		DisablePush: o.noPush,
		Logger:      logger,
		Registerer:  reg,

		DiscoveryMaxWatchersPerToken: o.discMaxWatchers,
		DiscoverySendTimeout:         o.discSendTimeout,
		DiscoveryMaxWatchLifetime:    o.discMaxLifetime,
		DiscoveryReauthPeriod:        o.discReauthPeriod,
	})
	if err != nil {
		return err
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	bg, cancelBG := context.WithCancel(context.Background())
	defer cancelBG()

	srv := &http.Server{
		Handler:           gw.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		Protocols:         new(http.Protocols),
	}
	srv.Protocols.SetHTTP1(true)
	if o.tlsDir != "" {
		store, err := tlsconf.NewStore(o.tlsDir, logger)
		if err != nil {
			return err
		}
		wg.Go(func() { store.Watch(bg, gatewayTLSPoll) })
		srv.TLSConfig = tlsconf.ServerConfig(store.GetCertificate, []string{"h2", "http/1.1"})
		rot := tlsconf.NewTicketKeyRotator(srv.TLSConfig, time.Hour)
		wg.Go(func() { rot.Run(bg) })
		srv.Protocols.SetHTTP2(true)
	} else {
		// h2c with prior knowledge, served by net/http itself (the
		// x/net h2c package is deprecated in its favour).
		srv.Protocols.SetUnencryptedHTTP2(true)
	}

	adm, err := startAdmin(&wg, o.adminAddress, reg, func() (bool, string) { return true, "" }, logger, nil)
	if err != nil {
		return err
	}
	defer adm.Stop()

	ln, err := net.Listen("tcp", o.address)
	if err != nil {
		return fmt.Errorf("gateway listener: %w", err)
	}
	if srv.TLSConfig != nil {
		// Serve the config itself, not ServeTLS's clone of it, so that the
		// ticket key rotation applies.
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	wg.Go(func() { gw.Run(bg) })
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- srv.Serve(ln) })
	admAddr := adm.Addr()
	logger.Info("gateway listening", "address", ln.Addr().String(), "tls", o.tlsDir != "", "push", !o.noPush,
		"keepalive", o.keepalive, "config", o.configFile, "tokens", o.tokensFile, "admin_address", admAddr)
	if onStarted != nil {
		onStarted(ln.Addr().String())
	}

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down the gateway")
	case err := <-serveErr:
		runErr = fmt.Errorf("gateway server: %w", err)
		serveErr = nil
	}
	gw.Close()
	sctx, cancel := context.WithTimeout(context.Background(), gatewayShutdownTimeout)
	if err := srv.Shutdown(sctx); err != nil {
		logger.Warn("gateway shutdown incomplete; closing the remaining connections", "err", err)
		_ = srv.Close()
	}
	cancel()
	if serveErr != nil {
		if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
			runErr = fmt.Errorf("gateway server: %w", err)
		}
	}
	cancelBG()
	logger.Info("gateway stopped")
	return runErr
}
