package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/applistener/applistener/control/api"
)

const supervisorsUsage = `usage: applistener supervisors list|delete --gateway URL[,URL...] --gateway-token-file FILE [flags]

  list    print every supervisor id the gateway knows: named by a supervisor token, or with a
          document, a session, an advertisement or a pool binding in its store (--output table
          or json; --supervisor ID prints that one only)
  delete  forget supervisor --supervisor ID: its document and its advertisement (its routes
          leave discovery), its session (its push streams end) and its pool binding; a
          supervisor token that names it stays in the tokens file

The gateway's admin write API needs an admin token ({"token": "...", "admin": true} in its
tokens file). Exit codes: 0 done, 1 refused or failed (delete: 1 when the gateway holds
nothing of the id), 2 usage.

Run 'applistener supervisors list -h' for the flags.
`

// supervisorsOptions are the flags of `applistener supervisors list|delete`.
type supervisorsOptions struct {
	sub        string
	gateway    string
	tokenFile  string
	caFile     string
	supervisor string
	output     string
	timeout    time.Duration
}

func (o *supervisorsOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.gateway, "gateway", "", "gateway URL, https://gateway:8080, or a comma-separated list of its replicas (required)")
	fs.StringVar(&o.tokenFile, "gateway-token-file", "", "file holding an admin token of the gateway (required)")
	fs.StringVar(&o.caFile, "gateway-ca-file", "", "PEM CA bundle that verifies the gateway (system roots when empty)")
	fs.StringVar(&o.supervisor, "supervisor", "", "the supervisor id (delete: required; list: print this one only)")
	fs.StringVar(&o.output, "output", "table", "output format: table (text for people) or json")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up after this long (every gateway endpoint tried)")
}

func (o *supervisorsOptions) validate() error {
	for _, f := range []struct{ name, v string }{{"--gateway", o.gateway}, {"--gateway-token-file", o.tokenFile}} {
		if f.v == "" {
			return usagef("%s is required", f.name)
		}
	}
	if _, err := api.ParseGatewayEndpoints(o.gateway, nil); err != nil {
		return usagef("--gateway: %v", err)
	}
	if o.sub == "delete" && o.supervisor == "" {
		return usagef("delete needs --supervisor")
	}
	if strings.ContainsAny(o.supervisor, "/?#% ") {
		return usagef("--supervisor %q: not a supervisor id", o.supervisor)
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

// supervisorEntry is one supervisor of the gateway's list, read leniently.
type supervisorEntry struct {
	Supervisor string     `json:"supervisor"`
	LastSeen   *time.Time `json:"last_seen"`
	Session    string     `json:"session"`
	Instances  int        `json:"instances"`
	Document   bool       `json:"document"`
	Routes     int        `json:"routes"`
	Pool       string     `json:"pool"`
	Token      bool       `json:"token"`
}

// supervisorsCommand runs `applistener supervisors`.
func supervisorsCommand(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("a subcommand is required: list or delete (see -h)")
	}
	o := supervisorsOptions{sub: args[0]}
	switch o.sub {
	case "list", "delete":
	case "-h", "-help", "--help", "help":
		_, _ = fmt.Fprint(stdout, supervisorsUsage)
		return nil
	default:
		return usagef("unknown subcommand %q: want list or delete", o.sub)
	}
	if err := parseCommand("supervisors "+o.sub, args[1:], &o); err != nil {
		return err
	}
	c, err := newAdminClient(o.gateway, o.caFile, o.tokenFile, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	ctx, cancel := adminContext(o.timeout)
	defer cancel()
	if o.sub == "delete" {
		return o.delete(ctx, c, stdout)
	}
	return o.list(ctx, c, stdout)
}

func (o *supervisorsOptions) delete(ctx context.Context, c *adminClient, stdout io.Writer) error {
	code, body, err := c.do(ctx, http.MethodDelete, "/v1/supervisors/"+url.PathEscape(o.supervisor), nil)
	if err != nil {
		return err
	}
	what := "supervisor " + o.supervisor
	switch code {
	case http.StatusNoContent, http.StatusOK:
	case http.StatusNotFound:
		return fmt.Errorf("%s: the gateway holds nothing of it (404)", what)
	default:
		return adminRefusal(code, body, what)
	}
	if o.output == "json" {
		return nil
	}
	_, err = fmt.Fprintf(stdout, "forgot supervisor %s: its document, advertisement, session and pool binding\n", o.supervisor)
	return err
}

func (o *supervisorsOptions) list(ctx context.Context, c *adminClient, stdout io.Writer) error {
	path, what := "/v1/supervisors", "the supervisors"
	if o.supervisor != "" {
		path, what = "/v1/supervisors/"+url.PathEscape(o.supervisor), "supervisor "+o.supervisor
	}
	code, body, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	if code == http.StatusNotFound && o.supervisor != "" {
		return fmt.Errorf("%s: the gateway does not know it (404)", what)
	}
	if code != http.StatusOK {
		return adminRefusal(code, body, what)
	}
	if o.output == "json" {
		return writeJSONLine(stdout, body)
	}
	var list struct {
		Supervisors []supervisorEntry `json:"supervisors"`
	}
	if o.supervisor != "" {
		var one supervisorEntry
		err = json.Unmarshal(body, &one)
		list.Supervisors = []supervisorEntry{one}
	} else {
		err = json.Unmarshal(body, &list)
	}
	if err != nil {
		return fmt.Errorf("the gateway's answer: %v", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if _, err := fmt.Fprintln(tw, "SUPERVISOR\tLAST SEEN\tSESSION\tINSTANCES\tROUTES\tPOOL\tTOKEN"); err != nil {
		return err
	}
	for _, s := range list.Supervisors {
		seen := "-"
		if s.LastSeen != nil {
			seen = s.LastSeen.UTC().Format(time.RFC3339)
		}
		inst := strconv.Itoa(s.Instances)
		if !s.Document {
			inst = "-"
		}
		pool := s.Pool
		if pool == "" {
			pool = "-"
		}
		token := "no"
		if s.Token {
			token = "yes"
		}
		if _, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.Supervisor, seen, s.Session, inst, s.Routes, pool, token); err != nil {
			return err
		}
	}
	return tw.Flush()
}
