package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --wake-hook and --wake-hook-token-file of serve and gateway: what is
// accepted and the one-line usage error of what is not.
func TestWakeHookFlags(t *testing.T) {
	for _, c := range []struct {
		name, cmd string
		args      []string
		want      string // "" when accepted
	}{
		{"serve routes file", "serve", []string{"--routes-file", "r.json", "--wake-hook", "https://platform.example/wake"}, ""},
		{"serve loopback http with token", "serve", []string{"--routes-file", "r.json", "--wake-hook", "http://127.0.0.1:9/wake", "--wake-hook-token-file", "t"}, ""},
		{"serve with gateway", "serve", []string{"--gateway", "https://gw:8080", "--supervisor-id", "s", "--wake-hook", "https://platform.example/wake"}, "wakes go through the gateway"},
		{"serve not a URL", "serve", []string{"--routes-file", "r.json", "--wake-hook", "platform/wake"}, "must be an http or https URL"},
		{"serve token without hook", "serve", []string{"--routes-file", "r.json", "--wake-hook-token-file", "t"}, "requires --wake-hook"},
		{"gateway", "gateway", []string{"--config", "g.json", "--wake-hook", "https://platform.example/wake", "--wake-hook-token-file", "t"}, ""},
		{"gateway token in clear text", "gateway", []string{"--config", "g.json", "--wake-hook", "http://platform.example/wake", "--wake-hook-token-file", "t"}, "clear text"},
		{"gateway user info", "gateway", []string{"--config", "g.json", "--wake-hook", "https://u:p@platform.example/wake"}, "user information"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := c.args
			var err error
			if c.cmd == "gateway" {
				var o gatewayOptions
				err = parseCommand("gateway", append([]string{"--address", "127.0.0.1:0", "--tokens", "t.json"}, args...), &o)
			} else {
				var o serveOptions
				err = parseCommand("serve", args, &o)
			}
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ue *usageError
			if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want a usage error containing %q", err, c.want)
			}
		})
	}
}

// The token file is read at start: trimmed, and an empty one is refused.
func TestWakeHookToken(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte(" s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := wakeHookFlags{url: "https://platform.example/wake", tokenFile: tok}
	opts, err := f.options("sup-1")
	if err != nil || opts.Token != "s3cret" || opts.Supervisor != "sup-1" || opts.URL != f.url {
		t.Fatalf("options %+v, %v", opts, err)
	}
	if err := os.WriteFile(tok, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.options("sup-1"); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty token file: %v", err)
	}
	if opts, err := (&wakeHookFlags{}).options("x"); opts != nil || err != nil {
		t.Fatalf("no hook: %+v %v", opts, err)
	}
}
