package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/control/gateway"
	"github.com/applistener/applistener/routes"
)

// problem is one finding of a configuration check: where (a file or flag,
// and a JSON path inside a file) and what.
type problem struct {
	where string // a file name or a flag ("--admin-address 127.0.0.1:9090")
	path  string // JSON path inside the file, "" for the file as a whole
	msg   string
	// warning: reported, but not an error (exit 0, serve starts).
	warning bool
	// instance: an instance entry that the listener rejects on its own
	// while applying the others; validate reports it as an error, serve
	// starts (the routes file source logs it).
	instance bool
}

// String is the one line printed for p: "FILE: PATH: MESSAGE".
func (p problem) String() string {
	var b strings.Builder
	if p.warning {
		b.WriteString("warning: ")
	}
	b.WriteString(p.where)
	if p.path != "" {
		b.WriteString(": ")
		b.WriteString(p.path)
	}
	b.WriteString(": ")
	b.WriteString(p.msg)
	return b.String()
}

// problems collects findings in the order they were made.
type problems []problem

func (ps *problems) add(where, path, format string, args ...any) {
	*ps = append(*ps, problem{where: where, path: path, msg: fmt.Sprintf(format, args...)})
}

func (ps *problems) warn(where, path, format string, args ...any) {
	*ps = append(*ps, problem{where: where, path: path, msg: fmt.Sprintf(format, args...), warning: true})
}

// errors returns the findings that are errors (not warnings); with
// instances false, rejected instance entries are left out as well.
func (ps problems) errors(instances bool) problems {
	var out problems
	for _, p := range ps {
		if !p.warning && (instances || !p.instance) {
			out = append(out, p)
		}
	}
	return out
}

// asError turns the errors among ps into one error (one line): the first
// problem and how many more there are.
func (ps problems) asError() error {
	switch len(ps) {
	case 0:
		return nil
	case 1:
		return errors.New(ps[0].String())
	default:
		return fmt.Errorf("%s (and %d more problems: run applistener validate with the same flags)", ps[0], len(ps)-1)
	}
}

// fileError describes a file that cannot be read.
func fileError(err error) string {
	if errors.Is(err, fs.ErrNotExist) {
		return "does not exist"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// checkServe runs the checks of `applistener validate` for serve's flags o
// (already validated as flags): the routes file, the gateway token and CA
// files, the certificate and ACME roots, and, with ports, whether the
// listen addresses can be bound.
func checkServe(o *serveOptions, ports bool, now time.Time) problems {
	var ps problems
	if o.routesFile != "" {
		ps = append(ps, checkRoutesFile(o.routesFile)...)
	}
	if o.gatewayTokenFile != "" {
		data, err := os.ReadFile(o.gatewayTokenFile)
		switch {
		case err != nil:
			ps.add(o.gatewayTokenFile, "", "gateway token file (--gateway-token-file): %s", fileError(err))
		case len(bytes.TrimSpace(data)) == 0:
			ps.add(o.gatewayTokenFile, "", "gateway token file (--gateway-token-file) is empty")
		}
	}
	if o.gatewayCAFile != "" {
		ps = append(ps, checkPEMBundle(o.gatewayCAFile, "--gateway-ca-file")...)
	}
	if o.accessKeysFile != "" {
		if _, err := accesstoken.LoadKeysFile(o.accessKeysFile); err != nil {
			ps.add(o.accessKeysFile, "", "access keys file (--access-keys-file): %v", err)
		}
	}
	if o.appACMERoots != "" {
		ps = append(ps, checkPEMBundle(o.appACMERoots, "--app-acme-ca-roots")...)
	}
	if o.appListener && o.appTLSDir != "" {
		ps = append(ps, checkCertificate(o.appTLSDir, o.appDomain, o.appACMECA != "", now)...)
	}
	if ports {
		if o.appListener {
			ps = append(ps, checkPort("--app-address", o.appAddress)...)
		}
		ps = append(ps, checkPort("--admin-address", o.adminAddress)...)
		ps = append(ps, checkPort("--address", o.healthAddress)...)
	}
	return ps
}

// checkGateway runs the checks of `applistener validate gateway` for the
// gateway's flags o: the configuration file (each supervisor's document),
// the tokens file, the TLS pair and the listen addresses; then loads both
// files the way the gateway does (without its store: etcd is not
// contacted).
func checkGateway(o *gatewayOptions, ports bool, now time.Time) problems {
	var ps problems
	if o.configFile != "" {
		ps = append(ps, checkGatewayConfig(o.configFile)...)
	}
	if _, err := os.Stat(o.tokensFile); err != nil {
		ps.add(o.tokensFile, "", "tokens file (--tokens): %s", fileError(err))
	}
	if o.tlsDir != "" {
		ps = append(ps, checkCertificate(o.tlsDir, "", false, now)...)
	}
	if len(ps.errors(true)) == 0 {
		// The gateway's own loading: the tokens' format and grants, the
		// configuration's import.
		cfg := o.configFile
		if cfg == "" {
			dir, err := os.MkdirTemp("", "applistener-validate-")
			if err != nil {
				ps.add("validate", "", "%v", err)
				return ps
			}
			defer func() { _ = os.RemoveAll(dir) }()
			cfg = filepath.Join(dir, "config.json")
			if err := os.WriteFile(cfg, []byte(`{"supervisors":{}}`), 0o600); err != nil {
				ps.add("validate", "", "%v", err)
				return ps
			}
		}
		gw, err := gateway.New(gateway.Config{
			ConfigPath: cfg, TokensPath: o.tokensFile, EndpointPolicy: o.endpointPolicy,
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			ps.add("gateway", "", "%s", oneLine(err.Error()))
		} else {
			gw.Close()
		}
	}
	if ports {
		ps = append(ps, checkPort("--address", o.address)...)
		ps = append(ps, checkPort("--admin-address", o.adminAddress)...)
	}
	return ps
}

// checkRoutesFile reads and parses a configuration document the way the
// listener does; each rejected instance entry is a problem with its JSON
// path.
func checkRoutesFile(path string) problems {
	var ps problems
	data, err := os.ReadFile(path)
	if err != nil {
		ps.add(path, "", "routes file (--routes-file): %s", fileError(err))
		return ps
	}
	return checkDocument(path, "", data)
}

// checkDocument checks one configuration document found in file at JSON
// path prefix ("" for a whole file): every problem of every rejected
// instance entry, each at its JSON path; a syntax error at its line and
// column (whole files only: an embedded document was parsed with its file).
func checkDocument(file, prefix string, data []byte) problems {
	var ps problems
	doc, err := routes.ParseDocument(data)
	if err != nil {
		if where, msg, ok := syntaxAt(file, err); ok && prefix == "" {
			ps.add(where, "", "%s", msg)
			return ps
		}
		ps.add(file, prefix, "%s", oneLine(strings.TrimPrefix(err.Error(), "document: ")))
		return ps
	}
	for _, rj := range doc.Rejected {
		at := joinPath(prefix, "instances["+strconv.Itoa(rj.Index)+"]")
		for _, p := range rj.Problems {
			path := at
			if p.Path != "" {
				path = joinPath(at, p.Path)
			}
			ps = append(ps, problem{where: file, path: path, msg: p.Msg, instance: true})
		}
	}
	return ps
}

// syntaxAt returns "FILE:LINE:COLUMN" and the message of a JSON syntax
// error, the position format editors and compilers use.
func syntaxAt(file string, err error) (where, msg string, ok bool) {
	var se *routes.SyntaxError
	if !errors.As(err, &se) {
		return "", "", false
	}
	return fmt.Sprintf("%s:%d:%d", file, se.Line, se.Column), "invalid JSON: " + oneLine(se.Msg), true
}

// checkGatewayConfig checks the gateway's configuration file: its shape and
// each supervisor's document.
func checkGatewayConfig(path string) problems {
	var ps problems
	data, err := os.ReadFile(path)
	if err != nil {
		ps.add(path, "", "configuration file (--config): %s", fileError(err))
		return ps
	}
	var cfg struct {
		Supervisors map[string]json.RawMessage `json:"supervisors"`
	}
	if where, msg, ok := syntaxAt(path, routes.CheckJSON(data)); ok {
		ps.add(where, "", "%s", msg)
		return ps
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		ps.add(path, "", "%s", strings.TrimPrefix(err.Error(), "json: "))
		return ps
	}
	ids := make([]string, 0, len(cfg.Supervisors))
	for id := range cfg.Supervisors {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		ps = append(ps, checkDocument(path, "supervisors."+id, cfg.Supervisors[id])...)
	}
	return ps
}

func joinPath(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

// checkPEMBundle checks that a CA bundle file holds certificates.
func checkPEMBundle(path, flagName string) problems {
	var ps problems
	data, err := os.ReadFile(path)
	if err != nil {
		ps.add(path, "", "%s: %s", flagName, fileError(err))
		return ps
	}
	if !x509.NewCertPool().AppendCertsFromPEM(data) {
		ps.add(path, "", "%s: no PEM certificates", flagName)
	}
	return ps
}

// checkCertificate loads tls.crt and tls.key from dir and checks that the
// pair matches, that the certificate is valid at now, and (domain set) that
// it covers every route name *.DOMAIN. Not covering the domain is only a
// warning with ACME, which obtains certificates per name.
func checkCertificate(dir, domain string, acme bool, now time.Time) problems {
	var ps problems
	crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		ps.add(crt, "", "certificate pair: %s", oneLine(err.Error()))
		return ps
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			ps.add(crt, "", "certificate: %v", err)
			return ps
		}
	}
	switch {
	case now.After(leaf.NotAfter):
		ps.add(crt, "", "certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		ps.add(crt, "", "certificate is not valid before %s", leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if domain != "" {
		// Route names are one label under the domain: a certificate covers
		// them all when it covers an arbitrary one.
		if err := leaf.VerifyHostname("x--y." + domain); err != nil {
			names := strings.Join(leaf.DNSNames, ", ")
			if names == "" {
				names = "none"
			}
			if acme {
				ps.warn(crt, "", "certificate does not cover *.%s (DNS names: %s); ACME obtains the others", domain, names)
			} else {
				ps.add(crt, "", "certificate does not cover *.%s (DNS names: %s)", domain, names)
			}
		}
	}
	return ps
}

// checkPort reports whether addr (of flag flagName) can be bound now; ""
// is off.
func checkPort(flagName, addr string) problems {
	var ps problems
	if addr == "" {
		return ps
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		ps.add(flagName+" "+addr, "", "cannot listen: %s", bindError(err))
		return ps
	}
	_ = ln.Close()
	return ps
}

// bindError is the cause of a failed listen without the "listen tcp ADDR:"
// prefix.
func bindError(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}

// oneLine replaces line breaks with spaces.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

const validateUsage = `usage: applistener validate [serve flags]
       applistener validate gateway [gateway flags]

Checks a configuration without starting anything: the flags, the routes file
(or the gateway's configuration and tokens files), the certificate (it must
cover *.<app-domain> and be valid now) and that the listen addresses are
free. Prints one line per problem, FILE: JSON-PATH: PROBLEM, and exits 1 on
any error, 0 when clean (warnings do not fail). Flag errors exit 2.
`

// validateCommand is `applistener validate`: serve's flags, or the
// gateway's after "gateway".
func validateCommand(args []string, stdout io.Writer) error {
	var ps problems
	now := time.Now()
	rest := args
	if len(rest) > 0 && rest[0] == "gateway" {
		rest = rest[1:]
	}
	if len(rest) > 0 && (rest[0] == "-h" || rest[0] == "--help" || rest[0] == "-help") {
		_, _ = fmt.Fprint(stdout, validateUsage)
	}
	if len(args) > 0 && args[0] == "gateway" {
		var o gatewayOptions
		if err := parseCommand("validate gateway", rest, &o); err != nil {
			return err
		}
		ps = checkGateway(&o, true, now)
	} else {
		var o serveOptions
		if err := parseCommand("validate", args, &o); err != nil {
			return err
		}
		ps = checkServe(&o, true, now)
	}
	for _, p := range ps {
		_, _ = fmt.Fprintln(stdout, p)
	}
	if n := len(ps.errors(true)); n > 0 {
		return fmt.Errorf("%d problem(s)", n)
	}
	_, _ = fmt.Fprintln(stdout, "configuration ok")
	return nil
}
