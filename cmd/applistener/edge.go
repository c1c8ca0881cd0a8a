package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/edge"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/routes"
)

// edgeOptions are the flags of `applistener edge`.
type edgeOptions struct {
	address        string
	gateway        string
	tokenFile      string
	caFile         string
	workspaces     string
	adminAddress   string
	adminPprof     bool
	helloTimeout   time.Duration
	dialTimeout    time.Duration
	halfClose      time.Duration
	withdrawGrace  time.Duration
	drainTimeout   time.Duration
	streamIdle     time.Duration
	maxConnections int
	proxyProtocol  string
	logFormat      string
	logLevel       string
	logFiles       logFiles
	ocsfJSON       bool
	ocsfLevel      string

	wsList []string
}

func (o *edgeOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.address, "address", "", "HOST:PORT the edge accepts TLS connections on (required)")
	fs.StringVar(&o.gateway, "gateway", "", "gateway URL whose discovery feeds the edge, https://gateway:8080, or a comma-separated list of its replicas (required)")
	fs.StringVar(&o.tokenFile, "gateway-token-file", "", "file holding a workspace token of the gateway (required; re-read on every request)")
	deprecatedAlias(fs, "token-file", "gateway-token-file")
	fs.StringVar(&o.caFile, "gateway-ca-file", "", "PEM CA bundle that verifies the gateway (system roots when empty; re-read when it changes)")
	fs.StringVar(&o.workspaces, "workspace", "", "comma-separated workspaces to serve (required)")
	fs.StringVar(&o.adminAddress, "admin-address", "", "address of /healthz, /readyz, /metrics (and /debug/pprof with --admin-pprof); empty: off")
	fs.BoolVar(&o.adminPprof, "admin-pprof", false, "serve /debug/pprof on the admin address (off by default)")
	fs.DurationVar(&o.helloTimeout, "handshake-timeout", edge.DefaultHelloTimeout, "time allowed to send the TLS ClientHello (the edge does not terminate TLS: this is its part of the handshake)")
	deprecatedAlias(fs, "hello-timeout", "handshake-timeout")
	fs.DurationVar(&o.dialTimeout, "dial-timeout", edge.DefaultDialTimeout, "timeout connecting to the owning supervisor")
	fs.DurationVar(&o.halfClose, "half-close-timeout", edge.DefaultHalfCloseTimeout, "how long a connection may stay half-closed")
	fs.DurationVar(&o.withdrawGrace, "withdraw-grace", edge.DefaultWithdrawGrace, "how long connections of a withdrawn route stay open for their supervisor to close them (WebSocket close frames); 0: close at once")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", edge.DefaultDrainTimeout, "on SIGTERM (or SIGINT), the edge stops accepting and keeps its spliced connections (WebSockets) until they end or this long has passed, then cuts the rest and logs them; a Pod's terminationGracePeriodSeconds must cover it")
	fs.DurationVar(&o.streamIdle, "gateway-stream-timeout", api.DefaultDiscoveryStreamIdleTimeout, "a discovery watch silent this long is reopened")
	fs.IntVar(&o.maxConnections, "max-connections", 100000, "concurrent client connections accepted (0: no bound)")
	fs.StringVar(&o.proxyProtocol, "proxy-protocol", "auto", "what the edge sends supervisors before each connection's bytes: auto (a PROXY protocol v2 header with the client's address to supervisors that accept it from the edge, i.e. list it in --trusted-proxies or --require-proxy-protocol; a supervisor that refuses it gets none, with a log line on both sides), v2 (always the header) or off (never)")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	logFileFlags(fs, &o.logFiles, false, true)
	ocsfFlags(fs, &o.ocsfJSON, &o.ocsfLevel)
}

// validate checks the flags together; every problem is a usage error.
func (o *edgeOptions) validate() error {
	for _, f := range []struct{ name, v string }{{"--address", o.address}, {"--gateway", o.gateway}, {"--gateway-token-file", o.tokenFile}, {"--workspace", o.workspaces}} {
		if f.v == "" {
			return usagef("%s is required", f.name)
		}
	}
	if _, _, err := net.SplitHostPort(o.address); err != nil {
		return usagef("--address %q: %v", o.address, err)
	}
	seen := map[string]bool{}
	for _, ws := range strings.Split(o.workspaces, ",") {
		ws = strings.TrimSpace(ws)
		if err := routes.ValidName(ws); err != nil {
			return usagef("--workspace: %v", err)
		}
		if seen[ws] {
			return usagef("--workspace: %q listed twice", ws)
		}
		seen[ws] = true
		o.wsList = append(o.wsList, ws)
	}
	if _, err := api.ParseGatewayEndpoints(o.gateway, nil); err != nil {
		return usagef("--gateway: %v", err)
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"--handshake-timeout", o.helloTimeout}, {"--dial-timeout", o.dialTimeout}, {"--half-close-timeout", o.halfClose}, {"--gateway-stream-timeout", o.streamIdle}} {
		if f.v < 10*time.Millisecond {
			return usagef("%s must be at least 10ms", f.name)
		}
	}
	if o.drainTimeout < 0 || o.maxConnections < 0 {
		return usagef("--drain-timeout and --max-connections must not be negative")
	}
	switch o.logFormat {
	case "text", "json":
	default:
		return usagef("--log-format must be text or json, not %q", o.logFormat)
	}
	switch o.proxyProtocol {
	case "auto", "v2", "off":
	default:
		return usagef("--proxy-protocol must be auto, v2 or off, not %q", o.proxyProtocol)
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return usagef("%v", err)
	}
	if o.ocsfLevel == "" {
		o.ocsfLevel = "info" // options built without flags
	}
	if _, err := ocsf.ParseLevel(o.ocsfLevel); err != nil {
		return usagef("%v", err)
	}
	return nil
}

func edgeCommand(args []string, stderr io.Writer) error {
	hup, stopHup := catchHangup()
	defer stopHup()
	var o edgeOptions
	if err := parseCommand("edge", args, &o); err != nil {
		return err
	}
	ctx, logger, sinks, done, err := commandSetup(stderr, o.logFormat, o.logLevel, o.logFiles)
	if err != nil {
		return err
	}
	defer done()
	return runEdge(ctx, &o, logger, sinks, hup, nil)
}

// runEdge serves the edge until ctx ends, then drains. Each signal on hup
// checks the token file and reopens the discovery watches, so that a new
// token or CA file applies at once (both are also re-read on use).
// onStarted, if not nil, is told the bound addresses.
func runEdge(ctx context.Context, o *edgeOptions, logger *slog.Logger, sinks logSinks, hup <-chan os.Signal, onStarted func(addr, admin string)) error {
	reg := newRegistry()
	if sinks.diag != nil {
		reg.MustRegister(droppedCounter(sinks))
	}
	client := &api.DiscoveryClient{
		Gateway:           o.gateway,
		TokenFile:         o.tokenFile,
		CAFile:            o.caFile,
		StreamIdleTimeout: o.streamIdle,
		Logger:            logger,
	}
	defer client.CloseIdleConnections()
	e, err := edge.New(edge.Config{
		Source:           client,
		Workspaces:       o.wsList,
		HelloTimeout:     o.helloTimeout,
		DialTimeout:      o.dialTimeout,
		HalfCloseTimeout: o.halfClose,
		WithdrawGrace:    withdrawGrace(o.withdrawGrace),
		MaxConnections:   o.maxConnections,
		ProxyProtocol:    o.proxyProtocol != "off",
		ProxyFallback:    o.proxyProtocol == "auto",
		OCSF:             newOCSF(o.ocsfJSON, o.ocsfLevel, sinks.ocsf),
		Logger:           logger,
		Registerer:       reg,
	})
	if err != nil {
		return err
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	bg, cancelBG := context.WithCancel(context.Background())
	defer cancelBG()

	adm, err := startAdmin(&wg, o.adminAddress, reg, e.Ready, logger, nil, o.adminPprof)
	if err != nil {
		return err
	}
	defer adm.Stop()
	ln, err := net.Listen("tcp", o.address)
	if err != nil {
		return fmt.Errorf("edge listener: %w", err)
	}
	wg.Go(func() { e.Run(bg) })
	onHangup(bg, &wg, hup, logger, "gateway token file, gateway CA file (discovery watches reopened)", func() error {
		if _, err := api.ReadTokenFile(o.tokenFile); err != nil {
			return err // the watches keep the token they have
		}
		client.CloseIdleConnections() // the next connection re-checks the CA file
		e.Rewatch()
		return nil
	})
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- e.Serve(ln) })
	admAddr := adm.Addr()
	logger.Info("edge listening", "version", readBuildInfo().Version, "address", ln.Addr().String(), "gateway", o.gateway, "workspaces", o.wsList,
		"admin_address", admAddr)
	if onStarted != nil {
		onStarted(ln.Addr().String(), admAddr)
	}

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down the edge: draining", "drain_timeout", o.drainTimeout)
	case err := <-serveErr:
		runErr = err
	}
	dctx, cancel := context.WithTimeout(context.Background(), o.drainTimeout)
	if err := e.Shutdown(dctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		logger.Warn("drain", "err", err)
	}
	cancel()
	cancelBG()
	logger.Info("edge stopped")
	return runErr
}

// withdrawGrace maps the flag to edge.Config.WithdrawGrace: 0 on the
// command line means none.
func withdrawGrace(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
