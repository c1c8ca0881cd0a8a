package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/gateway"
	"github.com/applistener/applistener/routes"
)

const instancesUsage = `usage: applistener instances put|delete|list --gateway URL[,URL...] --gateway-token-file FILE --supervisor ID [flags]

  put     install or replace one instance entry in the supervisor's configuration document:
          --file entry.json (- reads stdin); --workspace and --sandbox, when given, must be
          the entry's own
  delete  remove instance --workspace W --sandbox S from the supervisor's document
  list    print the supervisor's configuration document (--output table or json)

The gateway's admin write API needs an admin token ({"token": "...", "admin": true} in its
tokens file). Each write changes the document's revision and reaches the supervisor's open
sessions at once. Exit codes: 0 done, 1 refused or failed, 2 usage.

Run 'applistener instances put -h' for the flags.
`

// instancesOptions are the flags of `applistener instances put|delete|list`.
type instancesOptions struct {
	sub        string
	gateway    string
	tokenFile  string
	caFile     string
	supervisor string
	workspace  string
	sandbox    string
	file       string
	output     string
	timeout    time.Duration
}

func (o *instancesOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.gateway, "gateway", "", "gateway URL, https://gateway:8080, or a comma-separated list of its replicas (required)")
	fs.StringVar(&o.tokenFile, "gateway-token-file", "", "file holding an admin token of the gateway (required)")
	deprecatedAlias(fs, "token-file", "gateway-token-file")
	fs.StringVar(&o.caFile, "gateway-ca-file", "", "PEM CA bundle that verifies the gateway (system roots when empty)")
	fs.StringVar(&o.supervisor, "supervisor", "", "the supervisor id whose document is read or written (required)")
	fs.StringVar(&o.workspace, "workspace", "", "the instance's workspace (delete: required; put: checked against the entry)")
	fs.StringVar(&o.sandbox, "sandbox", "", "the instance's sandbox (delete: required; put: checked against the entry)")
	fs.StringVar(&o.file, "file", "", "put: the instance entry, a JSON object of the configuration document's instances list (- for stdin)")
	fs.StringVar(&o.output, "output", "table", "output format: table (text for people) or json")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up after this long (every gateway endpoint tried)")
}

func (o *instancesOptions) validate() error {
	for _, f := range []struct{ name, v string }{{"--gateway", o.gateway}, {"--gateway-token-file", o.tokenFile}, {"--supervisor", o.supervisor}} {
		if f.v == "" {
			return usagef("%s is required", f.name)
		}
	}
	if _, err := api.ParseGatewayEndpoints(o.gateway, nil); err != nil {
		return usagef("--gateway: %v", err)
	}
	if strings.ContainsAny(o.supervisor, "/?#% ") {
		return usagef("--supervisor %q: not a supervisor id", o.supervisor)
	}
	for _, f := range []struct{ name, v string }{{"--workspace", o.workspace}, {"--sandbox", o.sandbox}} {
		if f.v == "" {
			continue
		}
		if err := routes.ValidName(f.v); err != nil {
			return usagef("%s: %v", f.name, err)
		}
	}
	switch o.sub {
	case "put":
		if o.file == "" {
			return usagef("put needs --file (the instance entry; - reads stdin)")
		}
	case "delete":
		if o.workspace == "" || o.sandbox == "" {
			return usagef("delete needs --workspace and --sandbox")
		}
		if o.file != "" {
			return usagef("--file is for put only")
		}
	case "list":
		if o.workspace != "" || o.sandbox != "" || o.file != "" {
			return usagef("list takes no --workspace, --sandbox or --file: it prints the whole document")
		}
	}
	switch o.output {
	case "table", "json":
	default:
		return usagef("--output must be table or json, not %q", o.output)
	}
	if o.timeout <= 0 {
		return usagef("--timeout must be positive")
	}
	return nil
}

// instancesCommand runs `applistener instances`; stdin is read by put
// --file -.
func instancesCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("a subcommand is required: put, delete or list (see -h)")
	}
	o := instancesOptions{sub: args[0]}
	switch o.sub {
	case "put", "delete", "list":
	case "-h", "-help", "--help", "help":
		_, _ = fmt.Fprint(stdout, instancesUsage)
		return nil
	default:
		return usagef("unknown subcommand %q: want put, delete or list", o.sub)
	}
	if err := parseCommand("instances "+o.sub, args[1:], &o); err != nil {
		return err
	}
	var entry []byte
	if o.sub == "put" {
		var err error
		if entry, err = o.readEntry(stdin); err != nil {
			return err
		}
	}
	c, err := newAdminClient(o.gateway, o.caFile, o.tokenFile, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	ctx, cancel := adminContext(o.timeout)
	defer cancel()
	switch o.sub {
	case "put":
		err := o.put(ctx, c, entry, stdout)
		if c.warning != "" {
			_, _ = fmt.Fprintf(stderr, "applistener instances: warning: supervisor %s: %s\n", o.supervisor, c.warning)
		}
		return err
	case "delete":
		return o.delete(ctx, c, stdout)
	default:
		return o.list(ctx, c, stdout)
	}
}

// readEntry reads the entry of put and checks that it is a JSON object
// naming its workspace and sandbox, and that those agree with the flags
// (which default to them).
func (o *instancesOptions) readEntry(stdin io.Reader) ([]byte, error) {
	var data []byte
	var err error
	name := o.file
	if o.file == "-" {
		name = "stdin"
		data, err = io.ReadAll(io.LimitReader(stdin, routes.MaxDocumentBytes+1))
	} else {
		data, err = os.ReadFile(o.file)
	}
	if err != nil {
		return nil, fmt.Errorf("read the entry: %w", err)
	}
	if len(data) > routes.MaxDocumentBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, routes.MaxDocumentBytes)
	}
	var head struct {
		Workspace *string `json:"workspace"`
		Sandbox   *string `json:"sandbox"`
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return nil, fmt.Errorf("%s: not a JSON object (want one instance entry of the configuration document)", name)
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if head.Workspace == nil || head.Sandbox == nil {
		return nil, fmt.Errorf("%s: the entry must name its workspace and sandbox", name)
	}
	for _, f := range []struct {
		flag      string
		set, body *string
	}{{"--workspace", &o.workspace, head.Workspace}, {"--sandbox", &o.sandbox, head.Sandbox}} {
		if err := routes.ValidName(*f.body); err != nil {
			return nil, fmt.Errorf("%s: %s: %v", name, strings.TrimPrefix(f.flag, "--"), err)
		}
		if *f.set != "" && *f.set != *f.body {
			return nil, usagef("%s %q, but the entry in %s names %q", f.flag, *f.set, name, *f.body)
		}
		*f.set = *f.body
	}
	return data, nil
}

func (o *instancesOptions) instancePath() string {
	return "/v1/supervisors/" + url.PathEscape(o.supervisor) + "/instances/" +
		url.PathEscape(o.workspace) + "/" + url.PathEscape(o.sandbox)
}

func (o *instancesOptions) put(ctx context.Context, c *adminClient, entry []byte, stdout io.Writer) error {
	code, body, err := c.do(ctx, http.MethodPut, o.instancePath(), entry)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return adminRefusal(code, body, fmt.Sprintf("instance %s/%s of supervisor %s", o.workspace, o.sandbox, o.supervisor))
	}
	var res struct {
		Revision string `json:"revision"`
	}
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("the gateway's answer: %v", err)
	}
	if o.output == "json" {
		return writeJSONLine(stdout, body)
	}
	_, err = fmt.Fprintf(stdout, "put %s/%s on supervisor %s: document revision %s\n", o.workspace, o.sandbox, o.supervisor, res.Revision)
	return err
}

func (o *instancesOptions) delete(ctx context.Context, c *adminClient, stdout io.Writer) error {
	code, body, err := c.do(ctx, http.MethodDelete, o.instancePath(), nil)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("instance %s/%s of supervisor %s", o.workspace, o.sandbox, o.supervisor)
	switch code {
	case http.StatusNoContent, http.StatusOK:
	case http.StatusNotFound:
		return fmt.Errorf("%s: not in the document (404)", what)
	default:
		return adminRefusal(code, body, what)
	}
	if o.output == "json" {
		return nil
	}
	_, err = fmt.Fprintf(stdout, "deleted %s/%s from supervisor %s\n", o.workspace, o.sandbox, o.supervisor)
	return err
}

func (o *instancesOptions) list(ctx context.Context, c *adminClient, stdout io.Writer) error {
	code, body, err := c.do(ctx, http.MethodGet, "/v1/supervisors/"+url.PathEscape(o.supervisor)+"/instances", nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return adminRefusal(code, body, "the document of supervisor "+o.supervisor)
	}
	if o.output == "json" {
		return writeJSONLine(stdout, body)
	}
	// Read leniently: the table shows what it knows and the JSON output
	// is there for the rest.
	var doc struct {
		Revision  string `json:"revision"`
		Instances []struct {
			Workspace  string `json:"workspace"`
			Sandbox    string `json:"sandbox"`
			Generation string `json:"generation"`
			Connector  struct {
				Type string `json:"type"`
				Host string `json:"host"`
				Path string `json:"path"`
			} `json:"connector"`
			Services []struct {
				Name string `json:"name"`
				Port int    `json:"port"`
			} `json:"services"`
		} `json:"instances"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return fmt.Errorf("the gateway's document: %v", err)
	}
	if _, err := fmt.Fprintf(stdout, "# supervisor %s revision %s: %d instance(s)\n", o.supervisor, doc.Revision, len(doc.Instances)); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if _, err := fmt.Fprintln(tw, "WORKSPACE\tSANDBOX\tGENERATION\tCONNECTOR\tSERVICES"); err != nil {
		return err
	}
	for _, in := range doc.Instances {
		conn := in.Connector.Type
		if conn == "" {
			conn = "tcp"
		}
		if where := in.Connector.Host + in.Connector.Path; where != "" {
			conn += ":" + where
		}
		var svcs []string
		for _, s := range in.Services {
			name := s.Name
			if name == "" {
				name = "(default)"
			}
			svcs = append(svcs, name+"="+strconv.Itoa(s.Port))
		}
		if _, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", in.Workspace, in.Sandbox, in.Generation, conn, strings.Join(svcs, ",")); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// writeJSONLine writes a JSON body as one compact line.
func writeJSONLine(w io.Writer, body []byte) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, body); err != nil {
		return fmt.Errorf("the gateway's answer is not JSON: %v", err)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// adminRefusal is the error of an answer that is not a success.
func adminRefusal(code int, body []byte, what string) error {
	reason := api.OneLineReason(strings.TrimSpace(string(body)))
	msg := fmt.Sprintf("%s: the gateway answered %d", what, code)
	if reason != "" {
		msg += ": " + reason
	}
	if code == http.StatusUnauthorized || code == http.StatusForbidden {
		msg += " (an admin token is needed: check --gateway-token-file)"
	}
	return errors.New(msg)
}

// adminClient sends the admin API's requests to the current gateway
// endpoint, moving to the next on a connection error or a 5xx.
// newAdminClient is a client of the gateway's write API at the endpoints
// of the --gateway value (a usage error when they do not parse), trusting
// caFile ("" = the system roots) and sending the admin token read from
// tokenFile. close releases its connections.
func newAdminClient(gateway, caFile, tokenFile string, stderr io.Writer) (*adminClient, error) {
	logger := newLogger("text", "warn", stderr)
	eps, err := api.ParseGatewayEndpoints(gateway, logger)
	if err != nil {
		return nil, usagef("--gateway: %v", err)
	}
	tr, err := api.NewGatewayTransport(api.GatewayTransportOptions{CAFile: caFile, Logger: logger})
	if err != nil {
		return nil, err
	}
	return &adminClient{eps: eps, http: &http.Client{Transport: tr}, tokenFile: tokenFile}, nil
}

// close releases the client's idle connections.
func (c *adminClient) close() { c.http.CloseIdleConnections() }

// adminContext is the context of one write API command: cancelled by
// SIGTERM or SIGINT, and after timeout.
func adminContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, func() { cancel(); stop() }
}

type adminClient struct {
	eps       *api.GatewayEndpoints
	http      *http.Client
	tokenFile string
	// warning is the gateway's warning header of the last answer
	// (gateway.UnknownSupervisorHeader), "" when none.
	warning string
}

// adminStatus is an answer of 500 or above (api.GatewayStatusCode).
type adminStatus struct {
	code int
	body []byte
}

func (e *adminStatus) Error() string {
	return fmt.Sprintf("the gateway answered %d: %s", e.code, api.OneLineReason(strings.TrimSpace(string(e.body))))
}

func (e *adminStatus) StatusCode() int { return e.code }

// do sends one request and returns the answer's status and body (up to
// 1 MiB; the document of list up to routes.MaxDocumentBytes). Each
// endpoint is tried once at most, with backoff between the attempts.
func (c *adminClient) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	for attempt := 0; ; attempt++ {
		endpoint := c.eps.Current()
		code, data, err := c.once(ctx, method, endpoint+path, body)
		if err == nil && code >= 500 {
			err = &adminStatus{code: code, body: data}
		}
		if err == nil {
			return code, data, nil
		}
		if !api.IsGatewayFailover(err) || attempt+1 >= c.eps.Len() || ctx.Err() != nil {
			var st *adminStatus
			if errors.As(err, &st) {
				return st.code, st.body, nil
			}
			return 0, nil, err
		}
		c.eps.Failed(endpoint, err)
		d := 250 * time.Millisecond << min(attempt, 4)
		t := time.NewTimer(d/2 + rand.N(d/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, nil, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

func (c *adminClient) once(ctx context.Context, method, u string, body []byte) (int, []byte, error) {
	tok, err := api.ReadTokenFile(c.tokenFile)
	if err != nil {
		return 0, nil, err
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("User-Agent", "applistener-instances")
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, &api.GatewayConnError{Err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	c.warning = api.OneLineReason(resp.Header.Get(gateway.UnknownSupervisorHeader))
	data, err := io.ReadAll(io.LimitReader(resp.Body, routes.MaxDocumentBytes+1))
	if err != nil {
		return 0, nil, &api.GatewayConnError{Err: fmt.Errorf("read the answer: %w", err)}
	}
	if len(data) > routes.MaxDocumentBytes {
		return 0, nil, fmt.Errorf("the gateway's answer is larger than %d bytes", routes.MaxDocumentBytes)
	}
	return resp.StatusCode, data, nil
}
