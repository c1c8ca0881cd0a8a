package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/applistener/applistener/control/gateway"
	"github.com/applistener/applistener/control/supervisor"
	"github.com/applistener/applistener/dispatch"
	"github.com/applistener/applistener/internal/demoapp"
	"github.com/applistener/applistener/internal/logsink"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// devOptions are the flags of `applistener dev`.
type devOptions struct {
	appAddress, adminAddress, domain, dir, logFormat, healthAddress string
}

func (o *devOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.appAddress, "app-address", "127.0.0.1:8443", "address of the application listener")
	fs.StringVar(&o.adminAddress, "admin-address", "127.0.0.1:9090", "address of the admin endpoints")
	fs.StringVar(&o.domain, "app-domain", "apps.localhost", "application domain")
	deprecatedAlias(fs, "domain", "app-domain")
	fs.StringVar(&o.dir, "dir", "", "where the certificate and routes file are written (default: a new temporary directory)")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.healthAddress, "address", "127.0.0.1:5501", "health TCP listener of the supervisor (empty: off)")
}

// devCommand runs a complete demo on loopback: a generated CA and wildcard
// certificate, the demo app, a routes file naming it, and the listener.
func devCommand(args []string, stdout, stderr io.Writer) error {
	var o devOptions
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	o.flags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := routes.ValidDomain(o.domain); err != nil {
		return usagef("--app-domain: %v", err)
	}
	if o.dir == "" {
		d, err := os.MkdirTemp("", "applistener-dev-")
		if err != nil {
			return err
		}
		o.dir = d
	}
	tlsDir := filepath.Join(o.dir, "tls")
	if err := os.MkdirAll(tlsDir, 0o755); err != nil {
		return err
	}
	ca, err := tlsconf.NewAuthority("applistener dev CA")
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := ca.Issue([]string{"*." + o.domain}, 30*24*time.Hour)
	if err != nil {
		return err
	}
	if err := tlsconf.WriteSecretDir(tlsDir, certPEM, keyPEM); err != nil {
		return err
	}
	caFile := filepath.Join(o.dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		return err
	}

	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo app: %w", err)
	}
	app := &http.Server{Handler: demoapp.Handler("team/demo web"), ReadHeaderTimeout: 10 * time.Second}
	appDone := make(chan struct{})
	go func() {
		defer close(appDone)
		if err := app.Serve(appLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_, _ = fmt.Fprintln(stderr, "demo app:", err)
		}
	}()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = app.Shutdown(ctx)
		cancel()
		<-appDone
	}()
	appPort := appLn.Addr().(*net.TCPAddr).Port

	doc := map[string]any{
		"revision": "dev-1",
		"instances": []any{map[string]any{
			"workspace":  "team",
			"sandbox":    "demo",
			"generation": "1",
			"connector":  map[string]any{"type": "tcp", "host": "127.0.0.1"},
			"services":   []any{map[string]any{"name": "web", "port": appPort, "revision": 1}},
		}},
	}
	// The real topology: the reference gateway serves this document to a
	// shared-mode supervisor over a push session.
	const supervisorID = "dev-supervisor"
	gatewayFile := filepath.Join(o.dir, "gateway.json")
	tokensFile := filepath.Join(o.dir, "tokens.json")
	tokenFile := filepath.Join(o.dir, "supervisor.token")
	token := rand.Text()
	data, _ := json.MarshalIndent(map[string]any{"supervisors": map[string]any{supervisorID: doc}}, "", "  ")
	if err := os.WriteFile(gatewayFile, data, 0o644); err != nil {
		return err
	}
	data, _ = json.MarshalIndent(map[string]any{"tokens": []any{map[string]any{"token": token, "supervisor": supervisorID}}}, "", "  ")
	if err := os.WriteFile(tokensFile, data, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return err
	}

	sink := logsink.New(stderr, logsink.DefaultQueue, 10*time.Second, o.logFormat == "json")
	defer sink.Close(2 * time.Second)
	logger := newLogger(o.logFormat, "info", sink)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	gwOpts := gatewayOptions{
		address: "127.0.0.1:0", configFile: gatewayFile, tokensFile: tokensFile,
		keepalive: gateway.DefaultKeepalive, logFormat: o.logFormat, logLevel: "info",
	}
	gwCtx, stopGateway := context.WithCancel(context.Background())
	// The supervisor stops too when the gateway ends on its own.
	ctx, stopSupervisor := context.WithCancel(ctx)
	defer stopSupervisor()
	gwAddr := make(chan string, 1)
	gwExited := make(chan struct{})
	var gwErr error // set before gwExited is closed
	go func() {
		defer close(gwExited)
		gwErr = runGateway(gwCtx, &gwOpts, logger.With("component", "gateway"), nil, func(addr string) { gwAddr <- addr })
		stopSupervisor()
	}()
	defer func() {
		stopGateway()
		<-gwExited
	}()
	var endpoint string
	select {
	case addr := <-gwAddr:
		endpoint = "http://" + addr
	case <-gwExited:
		return fmt.Errorf("gateway: %w", gwErr)
	}

	mode := "shared"
	if o.healthAddress == "" {
		mode = "dedicated" // shared mode requires the health listener
	}
	so := serveOptions{
		mode:              mode,
		appListener:       true,
		appDomain:         o.domain,
		appAddress:        o.appAddress,
		appTLSDir:         tlsDir,
		gatewayEndpoint:   endpoint,
		gatewayTokenFile:  tokenFile,
		supervisorID:      supervisorID,
		gatewayStreamIdle: supervisor.DefaultStreamIdleTimeout,
		healthAddress:     o.healthAddress,
		adminAddress:      o.adminAddress,
		freshness:         routes.DefaultFreshness,
		logFormat:         o.logFormat,
		logLevel:          "info",
		maxHeaderBytes:    16 << 10,
		appStartGrace:     dispatch.DefaultAppStartGrace,
		drainTimeout:      5 * time.Second,
		defaultMaxStreams: 1024,
		maxConnections:    10000,
		certPoll:          500 * time.Millisecond,
		appHTTP2:          true,
		appH2WebSockets:   true,
	}
	if err := so.validate(); err != nil {
		return err
	}
	host := routes.Hostname("team", "demo", "web", o.domain)
	err = runSupervisor(ctx, &so, logger.With("component", "supervisor"), oneSink(sink), nil, func(appAddr, admAddr string) {
		_, port, _ := net.SplitHostPort(appAddr)
		ip, _, _ := net.SplitHostPort(appAddr)
		if ip == "0.0.0.0" || ip == "::" {
			ip = "127.0.0.1"
		}
		_, _ = fmt.Fprintf(stdout, `
applistener dev is running: the reference gateway (%[8]s) pushes routes to a
shared-mode supervisor whose TLS listener forwards to a demo app.
  route:   https://%[1]s:%[2]s/  ->  demo app on 127.0.0.1:%[5]d
  files:   %[3]s (gateway.json, tokens.json, tls/, ca.crt)
  admin:   http://%[6]s/metrics  http://%[6]s/readyz

Try it:
  curl --cacert %[4]s --resolve %[1]s:%[2]s:%[7]s https://%[1]s:%[2]s/

Edit %[3]s/gateway.json to change routes: the gateway pushes them at once.
Press Ctrl-C to stop.

`, host, port, o.dir, caFile, appPort, admAddr, ip, endpoint)
	})
	select {
	case <-gwExited:
		// The gateway ended by itself (it is stopped only after this):
		// that, not the supervisor's orderly stop, is the result.
		if gwErr == nil {
			gwErr = errors.New("stopped unexpectedly")
		}
		return fmt.Errorf("gateway: %w", gwErr)
	default:
	}
	return err
}
