package main

import (
	"context"
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

	"github.com/applistener/applistener/internal/demoapp"
	"github.com/applistener/applistener/internal/logsink"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// devCommand runs a complete demo on loopback: a generated CA and wildcard
// certificate, the demo app, a routes file naming it, and the listener.
func devCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	appAddress := fs.String("app-address", "127.0.0.1:8443", "address of the application listener")
	adminAddress := fs.String("admin-address", "127.0.0.1:9090", "address of the admin endpoints")
	domain := fs.String("domain", "apps.localhost", "application domain")
	dir := fs.String("dir", "", "where the certificate and routes file are written (default: a new temporary directory)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := routes.ValidDomain(*domain); err != nil {
		return usagef("--domain: %v", err)
	}
	if *dir == "" {
		d, err := os.MkdirTemp("", "applistener-dev-")
		if err != nil {
			return err
		}
		*dir = d
	}
	tlsDir := filepath.Join(*dir, "tls")
	if err := os.MkdirAll(tlsDir, 0o755); err != nil {
		return err
	}
	ca, err := tlsconf.NewAuthority("applistener dev CA")
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := ca.Issue([]string{"*." + *domain}, 30*24*time.Hour)
	if err != nil {
		return err
	}
	if err := tlsconf.WriteSecretDir(tlsDir, certPEM, keyPEM); err != nil {
		return err
	}
	caFile := filepath.Join(*dir, "ca.crt")
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
			fmt.Fprintln(stderr, "demo app:", err)
		}
	}()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = app.Shutdown(ctx)
		cancel()
		<-appDone
	}()
	appPort := appLn.Addr().(*net.TCPAddr).Port

	routesFile := filepath.Join(*dir, "routes.json")
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
	data, _ := json.MarshalIndent(doc, "", "  ")
	if err := os.WriteFile(routesFile, data, 0o644); err != nil {
		return err
	}

	o := serveOptions{
		mode:              "dedicated",
		appListener:       true,
		appDomain:         *domain,
		appAddress:        *appAddress,
		appTLSDir:         tlsDir,
		routesFile:        routesFile,
		adminAddress:      *adminAddress,
		freshness:         routes.DefaultFreshness,
		logFormat:         *logFormat,
		logLevel:          "info",
		maxHeaderBytes:    16 << 10,
		drainTimeout:      5 * time.Second,
		defaultMaxStreams: 1024,
		certPoll:          500 * time.Millisecond,
	}
	if err := o.validate(); err != nil {
		return err
	}
	sink := logsink.New(stderr, logsink.DefaultQueue, 10*time.Second, o.logFormat == "json")
	defer sink.Close(2 * time.Second)
	logger := newLogger(o.logFormat, o.logLevel, sink)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	host := routes.Hostname("team", "demo", "web", *domain)
	return runSupervisor(ctx, &o, logger, sink, nil, func(appAddr, admAddr string) {
		_, port, _ := net.SplitHostPort(appAddr)
		ip, _, _ := net.SplitHostPort(appAddr)
		if ip == "0.0.0.0" || ip == "::" {
			ip = "127.0.0.1"
		}
		fmt.Fprintf(stdout, `
applistener dev is running.
  route:   https://%[1]s:%[2]s/  ->  demo app on 127.0.0.1:%[5]d
  files:   %[3]s (routes.json, tls/, ca.crt)
  admin:   http://%[6]s/metrics

Try it:
  curl --cacert %[4]s --resolve %[1]s:%[2]s:%[7]s https://%[1]s:%[2]s/

Edit %[3]s/routes.json to change routes (it is re-read within a second).
Press Ctrl-C to stop.

`, host, port, *dir, caFile, appPort, admAddr, ip)
	})
}
