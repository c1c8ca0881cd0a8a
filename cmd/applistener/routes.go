package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/routes"
)

const routesUsage = `usage: applistener routes get|watch --gateway URL[,URL...] --gateway-token-file FILE --workspace WS [flags]
       applistener routes hostname --app-domain DOMAIN --workspace WS --sandbox SB [--service SVC]

  get       print the published routes of a workspace (the gateway's discovery snapshot)
  watch     print the unexpired routes every time the set changes, including when a
            route reaches its expires_at while the gateway is silent; ends on SIGINT/SIGTERM
  hostname  print the hostname of a service: WS--SB--SVC.DOMAIN when that label fits in
            63 characters, otherwise its hashed label h-<base32 sha256 of WS/SB/SVC>.DOMAIN

Run 'applistener routes get -h' (or 'routes hostname -h') for the flags.
`

// routesOptions are the flags of `applistener routes get|watch`.
type routesOptions struct {
	gateway   string
	tokenFile string
	caFile    string
	workspace string
	output    string
	idle      time.Duration
	logLevel  string
}

func (o *routesOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.gateway, "gateway", "", "gateway URL, https://gateway:8080, or a comma-separated list of its replicas (required)")
	fs.StringVar(&o.tokenFile, "gateway-token-file", "", "file holding a workspace token of the gateway's tokens file (required)")
	deprecatedAlias(fs, "token-file", "gateway-token-file")
	fs.StringVar(&o.caFile, "gateway-ca-file", "", "PEM CA bundle that verifies the gateway (system roots when empty; re-read when it changes)")
	fs.StringVar(&o.workspace, "workspace", "", "workspace to read (required)")
	fs.StringVar(&o.output, "output", "table", "output format: table or json")
	fs.DurationVar(&o.idle, "gateway-stream-timeout", api.DefaultDiscoveryStreamIdleTimeout, "watch: a stream silent this long is reopened")
	deprecatedAlias(fs, "stream-timeout", "gateway-stream-timeout")
	fs.StringVar(&o.logLevel, "log-level", "warn", "level of the client's logs on stderr: debug, info, warn or error")
}

func (o *routesOptions) validate() error {
	for _, f := range []struct{ name, v string }{{"--gateway", o.gateway}, {"--gateway-token-file", o.tokenFile}, {"--workspace", o.workspace}} {
		if f.v == "" {
			return usagef("%s is required", f.name)
		}
	}
	if _, err := api.ParseGatewayEndpoints(o.gateway, nil); err != nil {
		return usagef("--gateway: %v", err)
	}
	if err := routes.ValidName(o.workspace); err != nil {
		return usagef("--workspace: %v", err)
	}
	switch o.output {
	case "table", "json":
	default:
		return usagef("--output must be table or json, not %q", o.output)
	}
	if o.idle < 100*time.Millisecond {
		return usagef("--gateway-stream-timeout must be at least 100ms")
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return usagef("%v", err)
	}
	return nil
}

func routesCommand(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("a subcommand is required: get or watch (see -h)")
	}
	sub := args[0]
	switch sub {
	case "get", "watch":
	case "hostname":
		return hostnameCommand(args[1:], stdout)
	case "-h", "-help", "--help", "help":
		_, _ = fmt.Fprint(stdout, routesUsage)
		return nil
	default:
		return usagef("unknown subcommand %q: want get, watch or hostname", sub)
	}
	var o routesOptions
	if err := parseCommand("routes "+sub, args[1:], &o); err != nil {
		return err
	}
	logger := newLogger("text", o.logLevel, stderr)
	client := &api.DiscoveryClient{
		Gateway:           o.gateway,
		TokenFile:         o.tokenFile,
		CAFile:            o.caFile,
		StreamIdleTimeout: o.idle,
		Logger:            logger,
	}
	defer client.CloseIdleConnections()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if sub == "get" {
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s, err := client.Get(gctx, o.workspace)
		if err != nil {
			return err
		}
		return printRoutes(stdout, o.output, s, false)
	}
	return watchRoutes(ctx, client, &o, stdout)
}

// watchRoutes prints the unexpired set of routes each time it changes,
// until ctx ends (exit 0) or the gateway refuses the token (exit 1).
func watchRoutes(ctx context.Context, client *api.DiscoveryClient, o *routesOptions, stdout io.Writer) error {
	var printErr error
	err := client.WatchUnexpired(ctx, o.workspace, func(s *api.RouteSnapshot) {
		if printErr == nil {
			printErr = printRoutes(stdout, o.output, s, true)
		}
	})
	if printErr != nil {
		return fmt.Errorf("write: %w", printErr)
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// printRoutes writes s as a table or as one JSON line. For a watch the
// table has a header line naming the revision and time.
func printRoutes(w io.Writer, output string, s *api.RouteSnapshot, watch bool) error {
	if output == "json" {
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	if watch {
		if _, err := fmt.Fprintf(w, "# %s workspace %s revision %s: %d route(s)\n",
			time.Now().UTC().Format(time.RFC3339), s.Workspace, s.Revision, len(s.Routes)); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if _, err := fmt.Fprintln(tw, "HOSTNAME\tSANDBOX\tSERVICE\tSUPERVISOR\tENDPOINT\tVERSION\tEXPIRES"); err != nil {
		return err
	}
	for _, r := range s.Routes {
		// The names beside the hostname: a hashed one does not show them.
		svc := r.Name
		if svc == "" {
			svc = "-"
		}
		if _, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Hostname, r.Sandbox, svc, r.Supervisor, r.Endpoint.String(),
			strconv.FormatUint(r.InstallationVersion, 10), r.ExpiresAt.UTC().Format(time.RFC3339Nano)); err != nil {
			return err
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if watch {
		_, err := fmt.Fprintln(w)
		return err
	}
	return nil
}

// hostnameOptions are the flags of `applistener routes hostname`.
type hostnameOptions struct {
	domain, workspace, sandbox, service string
}

func (o *hostnameOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.domain, "app-domain", "", "application domain, as serve's --app-domain (required)")
	deprecatedAlias(fs, "domain", "app-domain")
	fs.StringVar(&o.workspace, "workspace", "", "workspace name (required)")
	fs.StringVar(&o.sandbox, "sandbox", "", "sandbox name (required)")
	fs.StringVar(&o.service, "service", "", "service name (empty: the unnamed service)")
}

func (o *hostnameOptions) validate() error {
	if o.domain == "" {
		return usagef("--app-domain is required")
	}
	if err := routes.ValidDomain(o.domain); err != nil {
		return usagef("--app-domain: %v", err)
	}
	for _, f := range []struct{ name, v string }{{"--workspace", o.workspace}, {"--sandbox", o.sandbox}, {"--service", o.service}} {
		if f.v == "" && f.name == "--service" {
			continue
		}
		if err := routes.ValidName(f.v); err != nil {
			return usagef("%s: %v", f.name, err)
		}
	}
	return nil
}

// hostnameCommand prints the hostname of a service (routes.Hostname), the
// name clients send as SNI and Host.
func hostnameCommand(args []string, stdout io.Writer) error {
	var o hostnameOptions
	if err := parseCommand("routes hostname", args, &o); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout, routes.Hostname(o.workspace, o.sandbox, o.service, o.domain))
	return err
}
