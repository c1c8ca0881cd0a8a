package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/accesstoken"
)

// writeAccessKeys writes a keys file with the ids given, each with a
// distinct 32-byte secret, and returns its path.
func writeAccessKeys(t *testing.T, ids ...string) string {
	t.Helper()
	var parts []string
	for i, id := range ids {
		secret := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{byte(i + 1)}, 32))
		parts = append(parts, `{"id":"`+id+`","secret":"`+secret+`"}`)
	}
	path := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(path, []byte(`{"keys":[`+strings.Join(parts, ",")+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// `access token` prints one token that the keys file's key set verifies
// for the scope asked, and for nothing else.
func TestAccessTokenCommand(t *testing.T) {
	keys := writeAccessKeys(t, "k1", "k2")
	ks, err := accesstoken.LoadKeysFile(keys)
	if err != nil {
		t.Fatal(err)
	}
	type check struct {
		svc  string
		want error
	}
	for _, tc := range []struct {
		name   string
		args   []string
		checks []check
		sub    string
		gen    uint64
		warn   string
	}{
		{"one service", []string{"--service", "team/demo/web", "--sub", "alice"},
			[]check{{"web", nil}, {"api", accesstoken.ErrWrongScope}, {"", accesstoken.ErrWrongScope}}, "alice", 0, ""},
		{"the unnamed service", []string{"--service", "team/demo/"},
			[]check{{"", nil}, {"web", accesstoken.ErrWrongScope}}, "", 0, ""},
		{"every service", []string{"--service", "team/demo", "--generation", "5"},
			[]check{{"", nil}, {"web", nil}}, "", 5, ""},
		{"two days", []string{"--service", "team/demo/web", "--ttl", "48h"},
			[]check{{"web", nil}}, "", 0, "refused in a URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"access", "token", "--keys-file", keys, "--key-id", "k2", "--ttl", "1h"}, tc.args...)
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if tc.warn == "" && stderr.Len() != 0 || !strings.Contains(stderr.String(), tc.warn) {
				t.Fatalf("stderr %q, want %q", stderr.String(), tc.warn)
			}
			out := stdout.String()
			if !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "v1.k2.") {
				t.Fatalf("stdout %q: want one token line", out)
			}
			tok := strings.TrimSuffix(out, "\n")
			for _, c := range tc.checks {
				claims, err := ks.Verify(tok, &accesstoken.Request{Workspace: "team", Sandbox: "demo", Service: c.svc,
					Generation: tc.gen, Now: time.Now()})
				if !errors.Is(err, c.want) {
					t.Fatalf("service %q: %v, want %v", c.svc, err, c.want)
				}
				if err == nil && (claims.Subject != tc.sub || claims.KeyID != "k2" || claims.Generation != tc.gen) {
					t.Fatalf("claims %+v", claims)
				}
			}
			if _, err := ks.Verify(tok, &accesstoken.Request{Workspace: "team", Sandbox: "demo", Service: "web",
				Generation: tc.gen, Now: time.Now().Add(49 * time.Hour)}); !errors.Is(err, accesstoken.ErrExpired) {
				t.Fatalf("after its ttl: %v", err)
			}
		})
	}
}

func TestAccessTokenCommandRefuses(t *testing.T) {
	keys := writeAccessKeys(t, "k1")
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"keys":[{"id":"k1","secret":"c2hvcnQ="}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func(extra ...string) []string {
		return append([]string{"access", "token", "--keys-file", keys, "--key-id", "k1", "--service", "team/demo/web", "--ttl", "1h"}, extra...)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"no subcommand", []string{"access"}, 2, "a subcommand is required"},
		{"unknown subcommand", []string{"access", "mint"}, 2, `unknown subcommand "mint"`},
		{"no keys file", []string{"access", "token", "--key-id", "k1", "--service", "team/demo", "--ttl", "1h"}, 2, "--keys-file is required"},
		{"no ttl", []string{"access", "token", "--keys-file", keys, "--key-id", "k1", "--service", "team/demo"}, 2, "--ttl is required"},
		{"ttl too long", base("--ttl", "721h"), 2, "at most 720h"},
		{"ttl under a second", base("--ttl", "10ms"), 2, "at least 1s"},
		{"negative ttl", base("--ttl", "-1h"), 2, "at least 1s"},
		{"service without sandbox", base("--service", "team"), 2, "want WS/SB"},
		{"service with four parts", base("--service", "team/demo/web/x"), 2, "want WS/SB"},
		{"bad sandbox", base("--service", "team/De-mo"), 2, `sandbox: name "De-mo"`},
		{"empty workspace", base("--service", "/demo"), 2, "workspace: name is empty"},
		{"bad key id", base("--key-id", "k 1"), 2, "--key-id"},
		{"subject with a space", base("--sub", "alice smith"), 1, "subject"},
		{"unknown key id", base("--key-id", "k9"), 1, `--key-id "k9" is not in`},
		{"missing keys file", base("--keys-file", filepath.Join(t.TempDir(), "none.json")), 1, "no such file"},
		{"invalid keys file", base("--keys-file", bad), 1, "keys[0].secret: 5 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			if code != tc.code || stdout.Len() != 0 || !strings.Contains(stderr.String(), tc.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d and %q", code, stdout.String(), stderr.String(), tc.code, tc.stderr)
			}
		})
	}
}

// The flags come from APPLISTENER_ variables too (a CI job keeps the keys
// file path in its environment).
func TestAccessTokenFromEnvironment(t *testing.T) {
	t.Setenv("APPLISTENER_KEYS_FILE", writeAccessKeys(t, "ci"))
	t.Setenv("APPLISTENER_KEY_ID", "ci")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"access", "token", "--service", "team/demo", "--ttl", "10m"}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "v1.ci.") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// `applistener validate` accepts a token-mode service and reports the
// access problems at their paths.
func TestCheckDocumentAccessPolicy(t *testing.T) {
	doc := `{"instances": [
	  {"workspace": "team", "sandbox": "a", "services": [{"name": "web", "port": 8080, "access": {"mode": "token"}}]},
	  {"workspace": "team", "sandbox": "b", "services": [{"name": "web", "port": 8080, "access": {"mode": "public", "cors_origins": ["https://App.example.com"]}}]},
	  {"workspace": "team", "sandbox": "c", "services": [{"name": "web", "port": 8080, "access": {"mode": "public", "generation": 2}}]}
	]}`
	got := lines(checkDocument("routes.json", "", []byte(doc)))
	want := []string{
		`routes.json: instances[1].services[0].access.cors_origins[0]: service "web": CORS origin "https://App.example.com" is not as browsers send it (want "https://app.example.com")`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
