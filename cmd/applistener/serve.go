package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/admin"
	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/supervisor"
	"github.com/applistener/applistener/dispatch"
	"github.com/applistener/applistener/internal/accesskeys"
	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// serveOptions are the flags of `applistener serve`.
type serveOptions struct {
	mode              string
	appListener       bool
	appDomain         string
	appAddress        string
	appTLSDir         string
	routesFile        string
	gatewayEndpoint   string
	gatewayTokenFile  string
	gatewayCAFile     string
	supervisorID      string
	wakeHook          wakeHookFlags
	gatewayPoll       derivedDuration
	gatewayStreamIdle time.Duration
	parentLiveness    bool
	advertiseAddress  string
	adminAddress      string
	healthAddress     string
	freshness         time.Duration
	logFormat         string
	logLevel          string
	logFiles          logFiles
	accessLog         string
	accessLogRate     float64
	accessLogTotal    float64
	ocsfJSON          bool
	ocsfLevel         string
	preserveHost      bool
	allowUnderscore   bool
	passCookieDomain  bool
	trustedProxies    string
	requireProxy      string
	maxHeaderBytes    int
	headerTimeout     time.Duration
	idleTimeout       time.Duration
	bodyTimeout       time.Duration
	dialTimeout       time.Duration
	appStartGrace     time.Duration
	responseTimeout   time.Duration
	backendIdle       time.Duration
	handshakeTimeout  time.Duration
	fairSlots         int
	fairLease         time.Duration
	drainTimeout      time.Duration
	defaultMaxStreams int
	maxConnections    int
	certPoll          time.Duration
	appHTTP2          bool
	appH2WebSockets   bool
	appACMECA         string
	appACMEEmail      string
	appCertCache      string
	appACMERoots      string
	adminPprof        bool
	accessKeysFile    string
	accessJWKSURL     string
	accessJWTIssuer   string
	accessJWTAudience string

	trusted       []netip.Prefix
	requiredProxy []netip.Prefix
}

func (o *serveOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.mode, "mode", "dedicated", "supervisor mode: dedicated or shared")
	fs.BoolVar(&o.appListener, "app-listener", false, "enable the TLS application listener (off unless given)")
	fs.StringVar(&o.appDomain, "app-domain", "", "application domain: routes are WORKSPACE--SANDBOX[--SERVICE].DOMAIN")
	fs.StringVar(&o.appAddress, "app-address", "0.0.0.0:8443", "address of the application listener")
	fs.StringVar(&o.appTLSDir, "app-tls-dir", "", "directory with tls.crt and tls.key (a Kubernetes TLS Secret volume)")
	fs.StringVar(&o.routesFile, "routes-file", "", "configuration document to read routes from")
	fs.StringVar(&o.gatewayEndpoint, "gateway", "", "gateway URL to hold the configuration session with (https://gateway:8080), or a comma-separated list of its replicas (one is used at a time; failover on connection errors and 5xx)")
	deprecatedAlias(fs, "gateway-endpoint", "gateway")
	fs.StringVar(&o.gatewayTokenFile, "gateway-token-file", "", "file holding the bearer token for the gateway (re-read on every request)")
	fs.StringVar(&o.gatewayCAFile, "gateway-ca-file", "", "PEM CA bundle that verifies the gateway (system roots when empty; re-read when it changes)")
	o.wakeHook.flags(fs, "with --routes-file, the supervisor", "sleeping instances are not woken (with --gateway, the gateway's hook is used)")
	fs.StringVar(&o.supervisorID, "supervisor-id", "", "this supervisor's id at the gateway (default: the hostname, i.e. the Pod name)")
	derivedDurationVar(fs, &o.gatewayPoll, "gateway-poll-interval", fmt.Sprintf("a third of --route-freshness, at most %v", supervisor.DefaultPollInterval),
		"poll interval while the push session is down")
	fs.DurationVar(&o.gatewayStreamIdle, "gateway-stream-timeout", supervisor.DefaultStreamIdleTimeout, "a push session silent this long is dropped")
	fs.StringVar(&o.advertiseAddress, "advertise-address", "", "address advertised to the gateway as this supervisor's endpoint (the Pod IP; default: the host of --app-address when it is not a wildcard)")
	fs.BoolVar(&o.parentLiveness, "parent-liveness-stdin", false, "exit cleanly when stdin reaches EOF (the parent process died)")
	fs.StringVar(&o.adminAddress, "admin-address", "127.0.0.1:9090", "address of /healthz, /readyz, /metrics (and /debug/pprof with --admin-pprof); empty: off")
	fs.BoolVar(&o.adminPprof, "admin-pprof", false, "serve /debug/pprof on the admin address (off by default)")
	fs.StringVar(&o.healthAddress, "address", "", "health TCP listener, open only while ready (kubelet tcpSocket probes)")
	fs.DurationVar(&o.freshness, "route-freshness", routes.DefaultFreshness, "how long a delivered route stays valid without renewal")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.BoolVar(&o.preserveHost, "app-preserve-host", false, "forward the public Host to the app as the client sent it (port included) instead of 127.0.0.1:PORT")
	fs.BoolVar(&o.allowUnderscore, "app-allow-underscore-headers", false, "forward request header fields whose names contain '_' (aliases of framing, hop-by-hop, Host and forwarding fields are dropped regardless)")
	fs.BoolVar(&o.passCookieDomain, "app-pass-cookie-domain", false, "pass an app's Set-Cookie Domain attribute through even when it names more than the request's host (only with the app domain on the Public Suffix List)")
	fs.StringVar(&o.trustedProxies, "trusted-proxies", "", "comma-separated CIDRs whose X-Forwarded-*/Forwarded headers are kept and that may start a connection with a PROXY protocol v2 header (the client address)")
	fs.StringVar(&o.requireProxy, "require-proxy-protocol", "", "comma-separated CIDRs (e.g. the edge's) that must start every connection with a PROXY protocol v2 header; a connection of theirs without one is closed")
	fs.IntVar(&o.maxHeaderBytes, "app-max-header-bytes", dispatch.DefaultMaxHeaderBytes, "largest request head accepted (431 beyond)")
	fs.DurationVar(&o.headerTimeout, "app-header-timeout", dispatch.DefaultHeaderTimeout, "time allowed to send a request head")
	fs.DurationVar(&o.idleTimeout, "app-idle-timeout", dispatch.DefaultIdleTimeout, "keep-alive idle timeout of client connections")
	fs.DurationVar(&o.bodyTimeout, "app-body-timeout", dispatch.DefaultBodyTimeout, "longest wait for progress reading a request body or writing to a client")
	fs.DurationVar(&o.dialTimeout, "app-dial-timeout", dispatch.DefaultDialTimeout, "timeout connecting to an app (504 beyond)")
	fs.DurationVar(&o.appStartGrace, "app-start-grace", dispatch.DefaultAppStartGrace, "how long a request waits, redialling, for an app that refuses connections (not listening yet) before it is answered 502; 0: at once (a service's start_grace_seconds overrides it)")
	fs.DurationVar(&o.responseTimeout, "app-response-header-timeout", dispatch.DefaultResponseHeaderTimeout, "timeout for an app's response head, counted from the end of the request body (504 beyond)")
	fs.DurationVar(&o.backendIdle, "app-backend-idle-timeout", dispatch.DefaultBackendIdleTimeout, "idle app connections are closed after this (keep below the app's keep-alive timeout)")
	fs.DurationVar(&o.handshakeTimeout, "app-handshake-timeout", listener.DefaultHandshakeTimeout, "time allowed for the ClientHello and TLS handshake")
	fs.IntVar(&o.fairSlots, "fair-slots", 0, "fair admission across instances when the listener is busy: request heads, HTTP/2 streams, TLS handshakes and WebSocket chunks beyond this many at once queue per instance and are admitted in turn (limits.weight), one slot in nine kept for instances that hold none; 0: 9 × GOMAXPROCS (at most 64), negative: off")
	fs.DurationVar(&o.fairLease, "fair-lease", fairshare.DefaultLease, "how long one admission (a request waiting on its app, a slow client, a streamed body) counts before a queued instance's work may take its place")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 25*time.Second, "on SIGTERM, how long in-flight requests may finish")
	fs.IntVar(&o.defaultMaxStreams, "default-max-streams", 1024, "stream limit of instances whose limits.max_streams is 0 (0: none)")
	fs.IntVar(&o.maxConnections, "app-max-connections", 100000, "concurrent client connections accepted (0: no bound)")
	fs.StringVar(&o.appACMECA, "app-acme-ca", "", "ACME directory URL: obtain certificates on demand for installed routes only (TLS-ALPN-01)")
	fs.StringVar(&o.appACMEEmail, "app-acme-email", "", "ACME account e-mail")
	fs.StringVar(&o.appCertCache, "app-cert-cache", "", "directory caching managed certificates (required with --app-acme-ca; shared between replicas)")
	fs.StringVar(&o.appACMERoots, "app-acme-ca-roots", "", "PEM bundle trusted for the ACME server's own HTTPS (default: system roots)")
	fs.BoolVar(&o.appHTTP2, "app-http2", true, "offer HTTP/2 to clients (ALPN h2); each request is still forwarded to the app as HTTP/1.1")
	fs.StringVar(&o.accessKeysFile, "access-keys-file", "", "access keys file ({\"keys\":[{\"id\":\"k1\",\"secret\":\"<base64, >= 32 bytes>\"}]}, re-read when it changes) that verifies the tokens of services in access mode token; without it such services are refused at install")
	fs.StringVar(&o.accessJWKSURL, "access-jwks-url", "", "JWKS URL (https, or http to a loopback address) of a platform that signs access JWTs with asymmetric keys (RS256, ES256, EdDSA): such a JWT is accepted where the listener's tokens are and swapped for one of them; requires --access-keys-file, --access-jwt-issuer and --access-jwt-audience")
	fs.StringVar(&o.accessJWTIssuer, "access-jwt-issuer", "", "the iss every access JWT must carry (with --access-jwks-url)")
	fs.StringVar(&o.accessJWTAudience, "access-jwt-audience", "", "the aud every access JWT must carry (with --access-jwks-url)")
	fs.BoolVar(&o.appH2WebSockets, "app-http2-websockets", true, "accept WebSockets over HTTP/2 (RFC 8441 extended CONNECT, advertised in SETTINGS); off: clients open WebSockets over HTTP/1.1")
	fs.DurationVar(&o.certPoll, "app-tls-poll", 500*time.Millisecond, "how often the TLS directory is checked for a new pair")
	logFileFlags(fs, &o.logFiles, true, true)
	fs.StringVar(&o.accessLog, "access-log", dispatch.AccessLogText, "access log, one line per request and per WebSocket: off, text, json or ocsf (OCSF HTTP Activity records)")
	ocsfFlags(fs, &o.ocsfJSON, &o.ocsfLevel)
	fs.Float64Var(&o.accessLogRate, "access-log-rate", dispatch.DefaultAccessLogRate, "access-log lines per second per instance (bursts of twice as many; beyond: dropped and counted); negative: no bound")
	fs.Float64Var(&o.accessLogTotal, "access-log-total-rate", dispatch.DefaultAccessLogTotalRate, "access-log lines per second of all instances together (bursts of twice as many; beyond: dropped and counted); negative: no bound")
}

// defaultPollInterval is the poll interval of a supervisor not given
// --gateway-poll-interval: a third of the route freshness (three polls per
// validity, as the push session's keepalive), at most
// supervisor.DefaultPollInterval.
func defaultPollInterval(freshness time.Duration) time.Duration {
	return min(supervisor.DefaultPollInterval, max((freshness/3).Truncate(time.Millisecond), time.Millisecond))
}

// validate checks the flags together; every problem is a usage error.
func (o *serveOptions) validate() error {
	switch o.mode {
	case "dedicated":
	case "shared":
		// A shared host serves many sandboxes: the platform must be able
		// to see whether it is ready (seed 002: --mode=shared with
		// --gateway and --address). Either configuration source
		// stays allowed (DESIGN.md): a routes file written by a local
		// agent is a legitimate source for a shared host too.
		if o.healthAddress == "" {
			return usagef("--mode=shared requires --address (the health listener the platform probes)")
		}
	default:
		return usagef("--mode must be dedicated or shared, not %q", o.mode)
	}
	if err := o.wakeHook.validate(); err != nil {
		return err
	}
	switch {
	case o.wakeHook.url != "" && o.gatewayEndpoint != "":
		return usagef("--wake-hook is for --routes-file: with --gateway, wakes go through the gateway (set its --wake-hook)")
	case o.routesFile == "" && o.gatewayEndpoint == "":
		return usagef("a configuration source is required: --routes-file or --gateway")
	case o.routesFile != "" && o.gatewayEndpoint != "":
		return usagef("--routes-file and --gateway are exclusive: choose one configuration source")
	case o.gatewayEndpoint != "":
		if _, err := api.ParseGatewayEndpoints(o.gatewayEndpoint, nil); err != nil {
			return usagef("--gateway: %v", err)
		}
		if o.supervisorID == "" {
			// In Kubernetes the hostname is the Pod name.
			h, err := os.Hostname()
			if err != nil || h == "" {
				return usagef("--gateway requires --supervisor-id (the hostname is unknown)")
			}
			o.supervisorID = h
		}
		if !o.gatewayPoll.given {
			o.gatewayPoll.d = defaultPollInterval(o.freshness)
		}
		if o.gatewayPoll.d <= 0 || o.gatewayPoll.d >= o.freshness {
			return usagef("--gateway-poll-interval must be positive and shorter than --route-freshness")
		}
	default:
		for _, f := range []struct{ name, v string }{{"--gateway-token-file", o.gatewayTokenFile}, {"--gateway-ca-file", o.gatewayCAFile}, {"--supervisor-id", o.supervisorID}} {
			if f.v != "" {
				return usagef("%s requires --gateway", f.name)
			}
		}
	}
	if o.appListener {
		if o.appDomain == "" {
			return usagef("--app-listener requires --app-domain")
		}
		if o.appTLSDir == "" && o.appACMECA == "" {
			return usagef("--app-listener requires --app-tls-dir or --app-acme-ca")
		}
		if o.appACMECA != "" && o.appCertCache == "" {
			return usagef("--app-acme-ca requires --app-cert-cache")
		}
		d, ok := routes.NormalizeHost(o.appDomain)
		if !ok || routes.ValidDomain(d) != nil || d != o.appDomain {
			return usagef("--app-domain %q is not a lower-case DNS name", o.appDomain)
		}
		if _, _, err := net.SplitHostPort(o.appAddress); err != nil {
			return usagef("--app-address %q: %v", o.appAddress, err)
		}
	} else {
		for _, f := range []struct{ name, v string }{{"--app-domain", o.appDomain}, {"--app-tls-dir", o.appTLSDir}, {"--app-acme-ca", o.appACMECA}} {
			if f.v != "" {
				return usagef("%s requires --app-listener", f.name)
			}
		}
	}
	if o.appACMECA == "" {
		for _, f := range []struct{ name, v string }{{"--app-acme-email", o.appACMEEmail}, {"--app-cert-cache", o.appCertCache}, {"--app-acme-ca-roots", o.appACMERoots}} {
			if f.v != "" {
				return usagef("%s requires --app-acme-ca", f.name)
			}
		}
	}
	if o.freshness < time.Second {
		return usagef("--route-freshness must be at least 1s")
	}
	if err := o.validateJWT(); err != nil {
		return err
	}
	switch o.logFormat {
	case "text", "json":
	default:
		return usagef("--log-format must be text or json, not %q", o.logFormat)
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return usagef("%v", err)
	}
	switch o.accessLog {
	case "":
		o.accessLog = dispatch.AccessLogText // on unless turned off
	case dispatch.AccessLogOff, dispatch.AccessLogText, dispatch.AccessLogJSON, dispatch.AccessLogOCSF:
	default:
		return usagef("--access-log must be off, text, json or ocsf, not %q", o.accessLog)
	}
	if o.ocsfLevel == "" {
		o.ocsfLevel = "info" // a struct built without flags (applistener dev)
	}
	if _, err := ocsf.ParseLevel(o.ocsfLevel); err != nil {
		return usagef("%v", err)
	}
	var err error
	if o.trusted, err = parsePrefixes(o.trustedProxies); err != nil {
		return usagef("--trusted-proxies: %v", err)
	}
	if o.requiredProxy, err = parsePrefixes(o.requireProxy); err != nil {
		return usagef("--require-proxy-protocol: %v", err)
	}
	if o.appStartGrace < 0 || o.appStartGrace > routes.MaxStartGraceSeconds*time.Second {
		return usagef("--app-start-grace must be between 0 and %v", routes.MaxStartGraceSeconds*time.Second)
	}
	if o.maxHeaderBytes < 1024 || o.maxHeaderBytes > 1<<20 {
		return usagef("--app-max-header-bytes must be between 1024 and 1048576")
	}
	return nil
}

// startGrace is the dispatch.Config.AppStartGrace of --app-start-grace:
// there 0 takes the default, and a negative value is no wait.
func startGrace(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// parsePrefixes parses a comma-separated CIDR list ("" is none).
func parsePrefixes(list string) ([]netip.Prefix, error) {
	if list == "" {
		return nil, nil
	}
	var ps []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			if a, aerr := netip.ParseAddr(s); aerr == nil {
				return nil, fmt.Errorf("%s is an address, not a CIDR: write %s/%d for it alone", s, s, a.BitLen())
			}
			return nil, fmt.Errorf("%q is not a CIDR like 10.0.0.0/8 or fd00::/8", s)
		}
		ps = append(ps, p.Masked())
	}
	return ps, nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// newLogger returns a logger writing through w.
func newLogger(format, level string, w io.Writer) *slog.Logger {
	lvl, _ := parseLevel(level)
	opts := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		opts.ReplaceAttr = durationSeconds
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// durationSeconds writes a duration as seconds (a JSON number, 30 for
// 30s), as every other duration in the project's JSON records is, not as
// slog's default integer of nanoseconds.
func durationSeconds(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.Float64(a.Key, a.Value.Duration().Seconds())
	}
	return a
}

func serveCommand(args []string, stderr io.Writer) error {
	hup, stopHup := catchHangup()
	defer stopHup()
	var o serveOptions
	if err := parseCommand("serve", args, &o); err != nil {
		return err
	}
	ctx, logger, sinks, done, err := commandSetup(stderr, o.logFormat, o.logLevel, o.logFiles)
	if err != nil {
		return err
	}
	defer done()
	if o.parentLiveness {
		ctx = watchParentLiveness(ctx, os.Stdin, logger)
	}
	return runSupervisor(ctx, &o, logger, sinks, hup, nil)
}

// watchParentLiveness returns a context that ends when stdin reaches EOF:
// the parent holds the pipe's write end, so EOF means the parent is gone.
// The reader goroutine is owned by the process (stdin cannot be unblocked).
func watchParentLiveness(ctx context.Context, stdin io.Reader, logger *slog.Logger) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		_, err := io.Copy(io.Discard, stdin)
		logger.Warn("parent liveness: stdin closed; shutting down", "err", err)
		cancel()
	}()
	return ctx
}

// appTLSConfig builds the app listener's TLS configuration: the TLS Secret
// directory (hot reload, SIGHUP) and/or managed certificates obtained on
// demand for installed routes only, ECDSA preferred, session tickets with
// rotating keys. Its goroutines are owned by wg and end with ctx. The
// expiry of the TLS directory's certificate and of the managed ones served
// is exported to reg.
func appTLSConfig(ctx context.Context, wg *sync.WaitGroup, o *serveOptions, table *routes.Table, boundAddr string, hup <-chan os.Signal,
	reg prometheus.Registerer, logger *slog.Logger) (*tls.Config, error) {
	var sources []func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	protos := []string{"http/1.1"}
	if o.appHTTP2 {
		protos = []string{"h2", "http/1.1"}
	}
	var managed *tlsconf.Managed
	var store *tlsconf.Store
	if o.appACMECA != "" {
		var roots *x509.CertPool
		if o.appACMERoots != "" {
			pem, err := os.ReadFile(o.appACMERoots)
			if err != nil {
				return nil, fmt.Errorf("--app-acme-ca-roots: %w", err)
			}
			roots = x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--app-acme-ca-roots %s: no PEM certificates", o.appACMERoots)
			}
		}
		var err error
		managed, err = tlsconf.NewManaged(tlsconf.ManagedConfig{
			CA:               o.appACMECA,
			Email:            o.appACMEEmail,
			CacheDir:         o.appCertCache,
			CARoots:          roots,
			ChallengeAddress: boundAddr,
			// Only a currently installed route can make the listener
			// request a certificate.
			Allowed: func(name string) bool {
				h, ok := routes.NormalizeHost(name)
				return ok && table.Lookup(h) != nil
			},
			Logger: logger,
		})
		if err != nil {
			return nil, err
		}
		wg.Go(func() {
			<-ctx.Done()
			managed.Close()
		})
		sources = append(sources, managed.GetCertificate)
		protos = append(protos, tlsconf.ACMETLS1Protocol)
	}
	if o.appTLSDir != "" {
		var err error
		store, err = tlsconf.NewStore(o.appTLSDir, logger)
		if err != nil {
			return nil, err
		}
		wg.Go(func() { store.Watch(ctx, o.certPoll) })
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
					logger.Info("SIGHUP: reloading certificates")
					_ = store.Reload()
				}
			}
		})
		sources = append(sources, store.GetCertificate)
	}
	reg.MustRegister(tlsconf.ExpiryCollector(store, managed))
	getCert := sources[0]
	if len(sources) > 1 {
		getCert = tlsconf.PreferECDSA(sources...)
	}
	cfg := tlsconf.ServerConfig(getCert, protos)
	rot := tlsconf.NewTicketKeyRotator(cfg, time.Hour)
	wg.Go(func() { rot.Run(ctx) })
	return cfg, nil
}

// withdrawBound bounds the withdrawal of the installations at shutdown.
const withdrawBound = 2 * time.Second

// accessLogWriter is the access log's writer: its bounded log writer
// (none without one).
func accessLogWriter(sinks logSinks) io.Writer {
	if sinks.access == nil {
		return nil
	}
	return sinks.access
}

// started is told the bound addresses once everything listens.
type started func(app, admin string)

// runSupervisor wires the supervisor and runs it until ctx ends, then
// drains. hup triggers a certificate reload.
func runSupervisor(ctx context.Context, o *serveOptions, logger *slog.Logger, sinks logSinks, hup <-chan os.Signal, onStart started) error {
	reg := newRegistry()
	if sinks.diag != nil {
		reg.MustRegister(droppedCounter(sinks))
	}

	em := newOCSF(o.ocsfJSON, o.ocsfLevel, sinks.ocsf)
	table := routes.NewTable(routes.Options{
		AccessTokens:      o.accessKeysFile != "",
		Domain:            o.appDomain,
		Freshness:         o.freshness,
		DefaultMaxStreams: o.defaultMaxStreams,
		OCSF:              em,
		Logger:            logger,
		Registerer:        reg,
	})
	defer table.Close()

	var wg sync.WaitGroup
	defer wg.Wait()
	bg, cancelBG := context.WithCancel(context.Background())
	defer cancelBG()

	// Start-up fails fast, with one line and before anything else is
	// logged: the files and the certificate (`applistener validate`'s
	// checks; an instance entry that fails is rejected on its own later),
	// then every listen address.
	if err := checkServe(o, false, time.Now()).errors(false).asError(); err != nil {
		return err
	}
	// A listener told to enforce access tokens does not start without
	// keys it can trust (checkServe said why the file is not usable).
	var keys *accesskeys.Watcher
	var disp *dispatch.Server
	if o.accessKeysFile != "" {
		var err error
		keys, err = accesskeys.New(accesskeys.Options{
			Path:   o.accessKeysFile,
			Logger: logger,
			OnChange: func(ch accesskeys.Change) {
				if disp != nil && len(ch.Removed) > 0 {
					disp.RevokeAccessKeys(ch.Removed)
				}
			},
		})
		if err != nil {
			return fmt.Errorf("--access-keys-file: %w", err)
		}
	}
	var ln net.Listener
	if o.appListener {
		var err error
		if ln, err = net.Listen("tcp", o.appAddress); err != nil {
			return fmt.Errorf("--app-address %s: cannot listen: %s", o.appAddress, bindError(err))
		}
	}
	closeLn := func() {
		if ln != nil {
			_ = ln.Close()
		}
	}
	// ready is set below, before the admin endpoints serve.
	var ready func() (bool, string)
	adm, err := bindAdmin(o.adminAddress, reg, func() (bool, string) { return ready() }, logger, o.adminPprof)
	if err != nil {
		closeLn()
		return err
	}
	if ps := checkPort("--address", o.healthAddress); len(ps) > 0 {
		closeLn()
		adm.Stop()
		return ps.asError()
	}

	wakes, wakePath, err := newWakeCoordinator(o, reg, logger)
	if err != nil {
		closeLn()
		adm.Stop()
		return err
	}
	if wakes != nil {
		defer wakes.Close()
		wg.Go(func() { wakes.FollowTable(bg, table) })
	}

	var appLn *listener.Listener
	if o.appListener {
		tlsCfg, err := appTLSConfig(bg, &wg, o, table, ln.Addr().String(), hup, reg, logger)
		if err != nil {
			_ = ln.Close()
			adm.Stop()
			return err
		}
		var accessKeys func() *accesstoken.KeySet
		if keys != nil {
			accessKeys = keys.Keys
		}
		accessJWT, err := o.newJWTVerifier(logger)
		if err != nil {
			_ = ln.Close()
			adm.Stop()
			return err
		}
		if accessJWT != nil {
			defer accessJWT.Close()
		}
		var fair *fairshare.Scheduler
		if o.fairSlots >= 0 {
			fair = fairshare.New(fairshare.Config{Slots: o.fairSlots, Lease: o.fairLease,
				SoloWindow: fairshare.DefaultSoloWindow, Registerer: reg})
			defer fair.Close()
		}
		disp = dispatch.New(dispatch.Config{
			Fair:                   fair,
			Wakes:                  wakes,
			AccessKeys:             accessKeys,
			AccessJWT:              accessJWT,
			PreserveHost:           o.preserveHost,
			AllowUnderscoreHeaders: o.allowUnderscore,
			PassCookieDomain:       o.passCookieDomain,
			TrustedProxies:         o.trusted,
			MaxHeaderBytes:         o.maxHeaderBytes,
			HeaderTimeout:          o.headerTimeout,
			IdleTimeout:            o.idleTimeout,
			BodyTimeout:            o.bodyTimeout,
			DialTimeout:            o.dialTimeout,
			AppStartGrace:          startGrace(o.appStartGrace),
			ResponseHeaderTimeout:  o.responseTimeout,
			BackendIdleTimeout:     o.backendIdle,
			DisableHTTP2WebSockets: !o.appH2WebSockets,
			Logger:                 logger,
			Registerer:             reg,
			AccessLog:              o.accessLog,
			AccessLogWriter:        accessLogWriter(sinks),
			AccessLogRate:          o.accessLogRate,
			AccessLogTotalRate:     o.accessLogTotal,
			OCSF:                   em,
		})
		wg.Go(func() { watchConnectors(bg, table, time.Second, logger) })
		if keys != nil {
			wg.Go(func() { _ = keys.Run(bg) })
		}
		appLn = listener.New(ln, listener.Config{
			Fair:               fair,
			TLS:                tlsCfg,
			Routes:             table,
			Handler:            disp,
			HandshakeTimeout:   o.handshakeTimeout,
			MaxConnections:     o.maxConnections,
			TrustedProxies:     o.trusted,
			RequireProxyHeader: o.requiredProxy,
			OCSF:               em,
			Logger:             logger,
			Registerer:         reg,
		})
	}

	metrics := supervisor.NewMetrics(reg)
	var src supervisor.Source
	var gw *supervisor.GatewayClient
	if o.gatewayEndpoint != "" {
		gw = &supervisor.GatewayClient{
			Endpoint:          o.gatewayEndpoint,
			SupervisorID:      o.supervisorID,
			Session:           supervisor.NewSessionID(),
			TokenFile:         o.gatewayTokenFile,
			CAFile:            o.gatewayCAFile,
			Sink:              table,
			Freshness:         o.freshness,
			PollInterval:      o.gatewayPoll.d,
			StreamIdleTimeout: o.gatewayStreamIdle,
			Logger:            logger,
			Metrics:           metrics,
			OCSF:              em,
		}
		if err := gw.Init(); err != nil {
			if appLn != nil {
				_ = appLn.Shutdown(context.Background())
			}
			adm.Stop()
			return err
		}
		src = gw
	} else {
		src = &supervisor.FileSource{
			Path:    o.routesFile,
			Sink:    table,
			Refresh: o.freshness / 3,
			Logger:  logger,
			Metrics: metrics,
			OCSF:    em,
		}
	}
	if gw != nil {
		wakePath.set(gw) // wakes go through the gateway
	}
	// noSession is why the gateway session is down, "" while it is up
	// (or without a gateway).
	noSession := func() string {
		if gw == nil || gw.Connected() {
			return ""
		}
		why := "no gateway session"
		if e := gw.LastError(); e != "" {
			why += ": " + e
		}
		return why
	}
	// ready (/readyz, and the health port of a dedicated supervisor, whose
	// Service it gates) is "serving valid routes": a configuration was
	// accepted and the routes are within their freshness. A gateway
	// outage shorter than that costs no readiness (issue 25): the routes
	// stay valid and are served until they expire.
	ready = func() (bool, string) {
		switch {
		case !table.Accepted():
			if why := noSession(); why != "" {
				return false, why
			}
			return false, "no configuration accepted yet"
		case !table.Fresh():
			why := "routes are stale: no delivery within the freshness window"
			if ns := noSession(); ns != "" {
				why += " (" + ns + ")"
			}
			return false, why
		}
		return true, ""
	}
	// healthReady is what the health port (--address) follows: in shared
	// mode the seed's meaning, ready and the gateway session up; in
	// dedicated mode ready.
	healthReady := ready
	if o.mode == "shared" {
		healthReady = func() (bool, string) {
			if why := noSession(); why != "" {
				return false, why
			}
			return ready()
		}
	}
	// The endpoint this supervisor's routes are reached at.
	var endpoint api.AdvertisedEndpoint
	if appLn != nil {
		host, _, _ := net.SplitHostPort(o.appAddress)
		if o.advertiseAddress != "" {
			host = o.advertiseAddress
		}
		if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
			host = ""
		}
		endpoint = api.AdvertisedEndpoint{Host: host, Port: appLn.Addr().(*net.TCPAddr).Port}
	}
	// The advertiser has a context of its own: at shutdown it stops before
	// the withdrawal, so that nothing advertises the routes again.
	advCtx, stopAdvertising := context.WithCancel(bg)
	var advWG sync.WaitGroup
	defer func() {
		stopAdvertising()
		advWG.Wait()
	}()
	if gw != nil && appLn != nil {
		if endpoint.Host == "" {
			logger.Warn("not advertising installed routes: set --advertise-address (the Pod IP)")
		} else {
			adv := &supervisor.Advertiser{Client: gw, Table: table, Endpoint: endpoint, Logger: logger}
			advWG.Go(func() { adv.Run(advCtx) })
		}
	}
	adm.start(&wg, logger, map[string]http.Handler{
		"GET /v1/installations": supervisor.InstallationsHandler(table, endpoint),
		"GET /v1/usage":         supervisor.UsageHandler(table),
	})
	var health *admin.HealthListener
	if o.healthAddress != "" {
		health = admin.NewHealthListener(o.healthAddress, logger)
		wg.Go(func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			lastErr := ""
			for {
				ok, _ := healthReady()
				// The address was free at start; should another process
				// take it later, say so once per change, not every tick.
				switch err := health.SetReady(ok); {
				case err != nil && err.Error() != lastErr:
					logger.Error("health listener", "err", err)
					lastErr = err.Error()
				case err == nil && ok && lastErr != "":
					logger.Info("health listener bound again", "address", o.healthAddress)
					lastErr = ""
				}
				select {
				case <-bg.Done():
					health.Close()
					return
				case <-t.C:
				}
			}
		})
	}

	wg.Go(func() {
		if err := src.Run(bg); err != nil {
			logger.Error("configuration source stopped", "err", err)
		}
	})

	serveErr := make(chan error, 1)
	if appLn != nil {
		wg.Go(func() { serveErr <- appLn.Serve() })
	}
	appAddr, admAddr := "", adm.Addr()
	if appLn != nil {
		appAddr = appLn.Addr().String()
	}
	startAttrs := []any{"version", readBuildInfo().Version, "mode", o.mode, "app_listener", o.appListener, "app_address", appAddr,
		"admin_address", admAddr, "domain", o.appDomain, "route_freshness", o.freshness}
	if gw != nil {
		startAttrs = append(startAttrs, "gateway", o.gatewayEndpoint, "supervisor", o.supervisorID, "session", gw.Session)
	}
	logger.Info("applistener started", startAttrs...)
	if onStart != nil {
		onStart(appAddr, admAddr)
	}

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down: draining", "drain_timeout", o.drainTimeout)
	case err := <-serveErr:
		runErr = fmt.Errorf("app listener: %w", err)
	}
	if health != nil {
		health.Close()
	}
	if gw != nil {
		// Discovery drops this supervisor's names before its listener
		// stops accepting: fronts stop sending new connections here first.
		stopAdvertising()
		advWG.Wait()
		wctx, cancel := context.WithTimeout(context.Background(), withdrawBound)
		if err := gw.Withdraw(wctx); err != nil {
			logger.Warn("withdrawing the installations from the gateway failed; they expire on their own", "err", err)
		}
		cancel()
	}
	if appLn != nil {
		dctx, cancel := context.WithTimeout(context.Background(), o.drainTimeout)
		if err := appLn.Shutdown(dctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			logger.Warn("drain", "err", err)
		}
		cancel()
	}
	cancelBG()
	adm.Stop()
	logger.Info("stopped")
	return runErr
}
