package main

import (
	"cmp"
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
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

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
	logFiles     logFiles
	adminAddress string
	adminPprof   bool

	discMaxWatchers  int
	discSendTimeout  time.Duration
	discMaxLifetime  time.Duration
	discReauthPeriod time.Duration
	discWarmup       time.Duration // negative: the default for the session TTL

	store           string
	etcdEndpoints   string
	etcdPrefix      string
	etcdCAFile      string
	etcdCertFile    string
	etcdKeyFile     string
	etcdDialTimeout time.Duration
	sessionTTL      time.Duration
	keepaliveMin    time.Duration
	endpointPolicy  string

	idleGrace         time.Duration
	strictSupervisors bool
	wakeHook          wakeHookFlags
}

func (o *gatewayOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.address, "address", "", "HOST:PORT to serve the control protocol on (required; loopback only without --tls-dir)")
	fs.StringVar(&o.configFile, "config", "", `configuration file: {"supervisors": {"<id>": <configuration document>, ...}}, imported into the store on start and on change (required with --store memory; optional with etcd, where documents may come from the write API only)`)
	fs.StringVar(&o.tokensFile, "tokens", "", `tokens file: {"tokens": [{"token": "...", "supervisor": "<id>"}, {"token": "...", "workspaces": ["<ws>", ...]}, {"token": "...", "admin": true}, {"token": "...", "pool": "<pool>"}]} (required; reloaded on change)`)
	fs.StringVar(&o.tlsDir, "tls-dir", "", "directory with tls.crt and tls.key (a Kubernetes TLS Secret volume): serve HTTPS with HTTP/2")
	fs.DurationVar(&o.keepalive, "keepalive", gateway.DefaultKeepalive, "keepalive interval of push sessions: the default, and the longest granted")
	fs.DurationVar(&o.keepaliveMin, "keepalive-min", 0, "shortest keepalive interval granted to a push session that asks for one (?keepalive=); default 250ms, or --keepalive when that is shorter")
	fs.DurationVar(&o.sessionTTL, "session-ttl", gateway.DefaultSessionTTL, "a supervisor session holds this long after its last request (push streams renew it)")
	fs.StringVar(&o.endpointPolicy, "endpoint-policy", gateway.EndpointPolicyAny, `which advertised endpoints are published: "any", "source" (the endpoint host is the advertisement's source IP) or "cidr:PREFIX[,PREFIX...]"`)
	fs.DurationVar(&o.idleGrace, "idle-grace", gateway.DefaultIdleGrace, "a supervisor id without session, advertisement or push stream keeps its empty document and its pool binding this long; then they are removed")
	fs.BoolVar(&o.strictSupervisors, "strict-supervisors", false, "refuse a configuration file (and write API edits) giving a document to a supervisor id that no supervisor token names and that never connected; without it they are warned about")
	fs.StringVar(&o.store, "store", "memory", `where the gateway keeps its state: "memory" (one process) or "etcd" (shared by replicas)`)
	fs.StringVar(&o.etcdEndpoints, "etcd-endpoints", "", "comma-separated etcd client URLs (required with --store etcd)")
	fs.StringVar(&o.etcdPrefix, "etcd-prefix", gateway.DefaultEtcdPrefix, "prefix of every etcd key the gateway uses")
	fs.StringVar(&o.etcdCAFile, "etcd-ca-file", "", "CA bundle that verifies the etcd servers")
	fs.StringVar(&o.etcdCertFile, "etcd-cert-file", "", "client certificate for etcd (with --etcd-key-file)")
	fs.StringVar(&o.etcdKeyFile, "etcd-key-file", "", "client key for etcd (with --etcd-cert-file)")
	fs.DurationVar(&o.etcdDialTimeout, "etcd-dial-timeout", gateway.DefaultEtcdDialTimeout, "bound of a connection attempt to etcd")
	o.wakeHook.flags(fs, "the gateway forwards each supervisor's wake request, coalesced per instance, as a", "wake requests are answered 501")
	fs.BoolVar(&o.noPush, "no-push", false, "refuse push sessions (501) so that supervisors poll")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	logFileFlags(fs, &o.logFiles, false, false)
	fs.StringVar(&o.adminAddress, "admin-address", "", "address of /healthz, /readyz, /metrics (and /debug/pprof with --admin-pprof); empty: off")
	fs.BoolVar(&o.adminPprof, "admin-pprof", false, "serve /debug/pprof on the admin address (off by default)")
	fs.IntVar(&o.discMaxWatchers, "discovery-max-watchers-per-token", gateway.DefaultDiscoveryMaxWatchersPerToken, "open discovery watches per token (429 beyond)")
	fs.DurationVar(&o.discSendTimeout, "discovery-send-timeout", gateway.DefaultDiscoverySendTimeout, "a discovery watcher that does not take a line within this is disconnected")
	fs.DurationVar(&o.discMaxLifetime, "discovery-max-watch-lifetime", gateway.DefaultDiscoveryMaxWatchLifetime, "discovery watches end cleanly after this (clients reconnect)")
	fs.DurationVar(&o.discReauthPeriod, "discovery-reauth-period", gateway.DefaultDiscoveryReauthPeriod, "how often an open discovery watch re-checks its token's grant")
	fs.DurationVar(&o.discWarmup, "discovery-warmup", -time.Second, "memory store: discovery answers 503 this long after a start, until the supervisors' sessions can be back (never a partial set); negative: --session-ttl + 2s; 0: off")
}

// discoveryWarmup is --discovery-warmup, its default resolved.
func (o *gatewayOptions) discoveryWarmup() time.Duration {
	if o.discWarmup < 0 {
		return gateway.DefaultDiscoveryWarmup(o.sessionTTL)
	}
	return o.discWarmup
}

// validate checks the flags together; every problem is a usage error.
func (o *gatewayOptions) validate() error {
	for _, f := range []struct{ name, v string }{{"--address", o.address}, {"--tokens", o.tokensFile}} {
		if f.v == "" {
			return usagef("%s is required", f.name)
		}
	}
	if err := o.validateStore(); err != nil {
		return err
	}
	if err := o.wakeHook.validate(); err != nil {
		return err
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

// validateStore checks the store, session and endpoint policy flags.
func (o *gatewayOptions) validateStore() error {
	switch o.store {
	case "memory":
		if o.configFile == "" {
			return usagef("--config is required with --store memory")
		}
		if o.etcdEndpoints != "" || o.etcdCAFile != "" || o.etcdCertFile != "" || o.etcdKeyFile != "" {
			return usagef("--etcd-* flags need --store etcd")
		}
	case "etcd":
		if len(o.etcdList()) == 0 {
			return usagef("--etcd-endpoints is required with --store etcd")
		}
		for _, e := range o.etcdList() {
			u, err := url.Parse(e)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usagef("--etcd-endpoints: %q is not an http(s)://HOST:PORT URL", e)
			}
		}
		if (o.etcdCertFile == "") != (o.etcdKeyFile == "") {
			return usagef("--etcd-cert-file and --etcd-key-file go together")
		}
		if o.etcdPrefix == "" || !strings.HasSuffix(o.etcdPrefix, "/") {
			return usagef("--etcd-prefix must end with /")
		}
		if o.etcdDialTimeout < 100*time.Millisecond {
			return usagef("--etcd-dial-timeout must be at least 100ms")
		}
	default:
		return usagef("--store must be memory or etcd, not %q", o.store)
	}
	if o.keepaliveMin == 0 {
		o.keepaliveMin = min(gateway.DefaultKeepaliveMin, o.keepalive)
	}
	if o.keepaliveMin < 10*time.Millisecond || o.keepaliveMin > o.keepalive {
		return usagef("--keepalive-min must be at least 10ms and at most --keepalive")
	}
	if o.sessionTTL < 2*o.keepalive || o.sessionTTL < time.Second {
		return usagef("--session-ttl must be at least 1s and at least twice --keepalive (push streams renew their session at every keepalive)")
	}
	if o.idleGrace < time.Second {
		return usagef("--idle-grace must be at least 1s")
	}
	if err := gateway.ParseEndpointPolicy(o.endpointPolicy); err != nil {
		return usagef("--endpoint-policy: %v", err)
	}
	return nil
}

// etcdList returns the --etcd-endpoints URLs.
func (o *gatewayOptions) etcdList() []string {
	var out []string
	for e := range strings.SplitSeq(o.etcdEndpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
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
	hup, stopHup := catchHangup()
	defer stopHup()
	var o gatewayOptions
	if err := parseCommand("gateway", args, &o); err != nil {
		return err
	}
	ctx, logger, _, done, err := commandSetup(stderr, o.logFormat, o.logLevel, o.logFiles)
	if err != nil {
		return err
	}
	defer done()
	return runGateway(ctx, &o, logger, hup, nil)
}

// gatewayShutdownTimeout is how long in-flight requests may finish on
// SIGTERM once the watch streams are ended.
const gatewayShutdownTimeout = 5 * time.Second

// gatewayTLSPoll is how often the TLS directory is checked for a new pair.
const gatewayTLSPoll = 500 * time.Millisecond

// runGateway serves the gateway until ctx ends, then ends the watch streams
// and shuts the server down. Each signal on hup re-reads the tokens file,
// the configuration file (memory store) and the TLS pair (--tls-dir).
// onStarted, if not nil, is told the bound address.
func runGateway(ctx context.Context, o *gatewayOptions, logger *slog.Logger, hup <-chan os.Signal, onStarted func(addr string)) error {
	reg := newRegistry()
	var etcd *gateway.EtcdConfig
	if o.store == "etcd" {
		etcd = &gateway.EtcdConfig{
			Endpoints:   o.etcdList(),
			Prefix:      o.etcdPrefix,
			CAFile:      o.etcdCAFile,
			CertFile:    o.etcdCertFile,
			KeyFile:     o.etcdKeyFile,
			DialTimeout: o.etcdDialTimeout,
		}
	}
	hook, err := o.wakeHook.options("")
	if err != nil {
		return err
	}
	gw, err := gateway.New(gateway.Config{
		WakeHook:       hook,
		ConfigPath:     o.configFile,
		TokensPath:     o.tokensFile,
		Etcd:           etcd,
		SessionTTL:     o.sessionTTL,
		Keepalive:      o.keepalive,
		KeepaliveMin:   o.keepaliveMin,
		EndpointPolicy: o.endpointPolicy,
		DisablePush:    o.noPush,
		IdleGrace:      o.idleGrace,
		Logger:         logger,

		StrictSupervisors: o.strictSupervisors,
		Registerer:        reg,

		DiscoveryMaxWatchersPerToken: o.discMaxWatchers,
		DiscoverySendTimeout:         o.discSendTimeout,
		DiscoveryMaxWatchLifetime:    o.discMaxLifetime,
		DiscoveryReauthPeriod:        o.discReauthPeriod,
		DiscoveryWarmup:              o.discoveryWarmup(),
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
	var tlsStore *tlsconf.Store
	if o.tlsDir != "" {
		store, err := tlsconf.NewStore(o.tlsDir, logger)
		if err != nil {
			return err
		}
		tlsStore = store
		reg.MustRegister(store.ExpiryCollector())
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

	adm, err := startAdmin(&wg, o.adminAddress, reg, gw.Ready, logger, nil, o.adminPprof)
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
	what := "tokens file"
	if o.configFile != "" {
		what += ", configuration file"
	}
	if tlsStore != nil {
		what += ", TLS pair"
	}
	onHangup(bg, &wg, hup, logger, what, func() error {
		err := gw.Reload()
		if tlsStore != nil {
			err = errors.Join(err, tlsStore.Reload())
		}
		return err
	})
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- srv.Serve(ln) })
	admAddr := adm.Addr()
	logger.Info("gateway listening", "version", readBuildInfo().Version, "address", ln.Addr().String(), "tls", o.tlsDir != "", "push", !o.noPush,
		"keepalive", o.keepalive, "config", o.configFile, "tokens", o.tokensFile, "admin_address", admAddr,
		"store", cmp.Or(o.store, "memory"), "etcd_endpoints", o.etcdEndpoints, "etcd_prefix", o.etcdPrefix)
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
