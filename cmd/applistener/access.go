package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/routes"
)

const accessUsage = `usage: applistener access token --keys-file FILE --key-id ID --service WS/SB[/SVC] --ttl DURATION [flags]

  token  print one access token for a private service, signed with a key of the
         keys file ({"keys":[{"id":"k1","secret":"<base64, >= 32 bytes>"}]})

--service names what the token opens: WS/SB every service of the sandbox,
WS/SB/SVC the service SVC only, WS/SB/ (a trailing slash) the unnamed service
only. A token carried in a URL (?_al_token=) must live at most 24h.

Run 'applistener access token -h' for the flags.
`

// accessTokenOptions are the flags of `applistener access token`.
type accessTokenOptions struct {
	keysFile   string
	keyID      string
	service    string
	ttl        time.Duration
	subject    string
	generation uint64

	claims accesstoken.Claims // the scope, from service (validate)
}

func (o *accessTokenOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.keysFile, "keys-file", "", "the access keys file: {\"keys\":[{\"id\":\"k1\",\"secret\":\"<base64>\"}]} (required)")
	fs.StringVar(&o.keyID, "key-id", "", "id of the key to sign with (required)")
	fs.StringVar(&o.service, "service", "", "what the token opens: WS/SB (every service of the sandbox), WS/SB/SVC or WS/SB/ (the unnamed service) (required)")
	fs.DurationVar(&o.ttl, "ttl", 0, "how long the token is valid: 1s to 720h; at most 24h for a token carried in a URL (required)")
	fs.StringVar(&o.subject, "sub", "", "the subject (user) the app sees as X-Forwarded-User: printable ASCII without spaces")
	fs.Uint64Var(&o.generation, "generation", 0, "the service's access policy generation the token is minted under (a raised generation refuses older tokens)")
}

func (o *accessTokenOptions) validate() error {
	for _, f := range []struct{ name, v string }{{"--keys-file", o.keysFile}, {"--key-id", o.keyID}, {"--service", o.service}} {
		if f.v == "" {
			return usagef("%s is required", f.name)
		}
	}
	if err := accesstoken.CheckKeyID(o.keyID); err != nil {
		return usagef("--key-id: %v", err)
	}
	parts := strings.Split(o.service, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return usagef("--service %q: want WS/SB, WS/SB/SVC or WS/SB/", o.service)
	}
	for i, what := range []string{"workspace", "sandbox", "service"} {
		if i >= len(parts) || i == 2 && parts[2] == "" {
			continue
		}
		if err := routes.ValidName(parts[i]); err != nil {
			return usagef("--service %q: %s: %v", o.service, what, err)
		}
	}
	o.claims = accesstoken.Claims{Workspace: parts[0], Sandbox: parts[1], AllServices: len(parts) == 2}
	if len(parts) == 3 {
		o.claims.Service = parts[2]
	}
	switch {
	case o.ttl == 0:
		return usagef("--ttl is required (a token always expires)")
	case o.ttl < time.Second:
		return usagef("--ttl %v: at least 1s", o.ttl)
	case o.ttl > accesstoken.MaxLifetime:
		return usagef("--ttl %v: at most %v", o.ttl, accesstoken.MaxLifetime)
	}
	return nil
}

// accessCommand is `applistener access SUBCOMMAND`.
func accessCommand(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("a subcommand is required: token (see -h)")
	}
	switch args[0] {
	case "token":
		return accessTokenCommand(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		_, err := fmt.Fprint(stdout, accessUsage)
		return err
	default:
		return usagef("unknown subcommand %q: want token", args[0])
	}
}

// accessTokenCommand prints one token.
func accessTokenCommand(args []string, stdout, stderr io.Writer) error {
	var o accessTokenOptions
	if err := parseCommand("access token", args, &o); err != nil {
		return err
	}
	ks, err := accesstoken.LoadKeysFile(o.keysFile)
	if err != nil {
		return err
	}
	if !ks.Has(o.keyID) {
		return fmt.Errorf("--key-id %q is not in %s (its ids: %s)", o.keyID, o.keysFile, strings.Join(ks.IDs(), ", "))
	}
	now := time.Now()
	c := o.claims
	c.Subject, c.Generation = o.subject, o.generation
	c.IssuedAt, c.Expires = now, now.Add(o.ttl)
	tok, err := ks.Mint(o.keyID, c)
	if err != nil {
		return err
	}
	if o.ttl > accesstoken.MaxURLLifetime {
		_, _ = fmt.Fprintf(stderr, "applistener access token: warning: --ttl %v is longer than %v: the token is refused in a URL (?_al_token=), accepted in a header\n",
			o.ttl, accesstoken.MaxURLLifetime)
	}
	_, err = fmt.Fprintln(stdout, tok)
	return err
}
