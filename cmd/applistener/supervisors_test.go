package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/control/gateway"
	"github.com/applistener/applistener/internal/testutil"
)

// adminGateway is a real gateway (memory store) served on loopback with an
// admin token "ta" in adminToken, a supervisor token for sup-1 and a pool
// token for pool-a.
type adminGateway struct {
	url, adminToken, supToken string
}

func startAdminGateway(t *testing.T) *adminGateway {
	t.Helper()
	dir := t.TempDir()
	cfg, toks := filepath.Join(dir, "gateway.json"), filepath.Join(dir, "tokens.json")
	doc := `{"supervisors":{"sup-1":{"revision":"r1","instances":[` + testEntry + `]}}}`
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := `{"tokens":[{"token":"ta","admin":true},{"token":"t1","supervisor":"sup-1"},{"token":"tp","pool":"pool-a"}]}`
	if err := os.WriteFile(toks, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(gateway.Config{ConfigPath: cfg, TokensPath: toks, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Run(ctx)
	}()
	t.Cleanup(func() {
		srv.Close()
		g.Close()
		cancel()
		<-done
	})
	testutil.Eventually(t, 5*time.Second, "the gateway ready", func() bool { ok, _ := g.Ready(); return ok })
	a := &adminGateway{url: srv.URL, adminToken: filepath.Join(dir, "admin.token"), supToken: filepath.Join(dir, "sup.token")}
	for path, tok := range map[string]string{a.adminToken: "ta\n", a.supToken: "t1\n"} {
		if err := os.WriteFile(path, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// host-7 connects once with the pool token (a pool member).
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/supervisors/host-7/config?session="+strings.Repeat("7", 32), nil)
	req.Header.Set("Authorization", "Bearer tp")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("pool member: %d", resp.StatusCode)
	}
	return a
}

// runTop runs `applistener args...` in process and returns the exit code
// and outputs.
func runTop(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// `applistener supervisors list|delete` against a real gateway: the list
// as a table and as JSON, one id, forgetting one, and the refusals.
func TestSupervisorsCommand(t *testing.T) {
	gw := startAdminGateway(t)
	common := []string{"--gateway", gw.url, "--gateway-token-file", gw.adminToken}
	code, out, errOut := runTop(append([]string{"supervisors", "list"}, common...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("list: exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SUPERVISOR") ||
		!strings.HasPrefix(lines[1], "host-7 ") || !strings.Contains(lines[1], " active ") || !strings.Contains(lines[1], " pool-a ") ||
		!strings.HasPrefix(lines[2], "sup-1 ") || !strings.Contains(lines[2], " none ") || !strings.HasSuffix(lines[2], " yes") {
		t.Fatalf("list table:\n%s", out)
	}
	if f := strings.Fields(lines[2]); f[1] != "-" || f[3] != "1" {
		t.Errorf("sup-1 (never seen, one instance): %q", lines[2])
	}
	code, out, _ = runTop(append([]string{"supervisors", "list", "--supervisor", "host-7", "--output", "json"}, common...)...)
	var one supervisorEntry
	if err := json.Unmarshal([]byte(out), &one); code != 0 || err != nil || one.Supervisor != "host-7" || one.Pool != "pool-a" ||
		one.Session != "active" || one.LastSeen == nil || strings.Count(out, "\n") != 1 {
		t.Errorf("list --supervisor host-7 --output json: exit %d %q", code, out)
	}
	code, out, errOut = runTop(append([]string{"supervisors", "delete", "--supervisor", "host-7"}, common...)...)
	if code != 0 || !strings.Contains(out, "forgot supervisor host-7") {
		t.Errorf("delete: exit %d, %q %q", code, out, errOut)
	}
	code, out, _ = runTop(append([]string{"supervisors", "list", "--supervisor", "host-7", "--output", "json"}, common...)...)
	var after supervisorEntry
	if err := json.Unmarshal([]byte(out), &after); code != 0 || err != nil || after.Pool != "" || after.Session != "withdrawn" {
		t.Errorf("host-7 after delete: exit %d %q", code, out)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"delete unknown", append([]string{"supervisors", "delete", "--supervisor", "nobody"}, common...), 1, "supervisor nobody: the gateway holds nothing of it (404)"},
		{"list unknown", append([]string{"supervisors", "list", "--supervisor", "nobody"}, common...), 1, "the gateway does not know it (404)"},
		{"not an admin token", []string{"supervisors", "list", "--gateway", gw.url, "--gateway-token-file", gw.supToken}, 1, "answered 403"},
		{"delete without --supervisor", append([]string{"supervisors", "delete"}, common...), 2, "delete needs --supervisor"},
		{"no gateway", []string{"supervisors", "list", "--gateway-token-file", gw.adminToken}, 2, "--gateway is required"},
		{"bad output", append([]string{"supervisors", "list", "--output", "yaml"}, common...), 2, "--output"},
		{"unknown subcommand", []string{"supervisors", "get"}, 2, `unknown subcommand "get"`},
		{"no subcommand", []string{"supervisors"}, 2, "a subcommand is required"},
	} {
		code, out, errOut := runTop(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.stderr) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", tc.name, code, out, errOut, tc.code, tc.stderr)
		}
	}
	if code, out, _ := runTop("supervisors", "-h"); code != 0 || !strings.Contains(out, "usage: applistener supervisors list|delete") {
		t.Errorf("-h: exit %d %q", code, out)
	}
}

// `applistener instances put` for a supervisor id the gateway does not
// know succeeds with a warning on stderr (the gateway's header).
func TestInstancesPutUnknownSupervisorWarns(t *testing.T) {
	gw := startAdminGateway(t)
	_, entry := instancesFiles(t)
	code, out, errOut := runInstances("", "put", "--gateway", gw.url, "--gateway-token-file", gw.adminToken, "--supervisor", "host-typo", "--file", entry)
	if code != 0 || !strings.Contains(out, "put team/demo on supervisor host-typo") ||
		!strings.Contains(errOut, "warning: supervisor host-typo: unknown supervisor id") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = runInstances("", "put", "--gateway", gw.url, "--gateway-token-file", gw.adminToken, "--supervisor", "sup-1", "--file", entry)
	if code != 0 || errOut != "" {
		t.Errorf("a known id: exit %d, stderr %q", code, errOut)
	}
}

// validate gateway --strict-supervisors refuses a document for an id no
// supervisor token names, as the gateway does (memory store); without the
// flag the file is clean; the gateway's own check of the documents finds
// the same paths as validate's.
func TestCheckGatewayStrictSupervisors(t *testing.T) {
	dir := t.TempDir()
	cfg, tokens := filepath.Join(dir, "gateway.json"), filepath.Join(dir, "tokens.json")
	write(t, cfg, `{"supervisors": {"sup-1": {"revision": "r1", "instances": []}, "host-typo": {"revision": "r1", "instances": []}}}`)
	write(t, tokens, `{"tokens": [{"token": "0123456789abcdef0123456789abcdef", "supervisor": "sup-1"}]}`)
	o := gatewayOptions{address: "127.0.0.1:0", configFile: cfg, tokensFile: tokens, store: "memory"}
	if got := checkGateway(&o, false, time.Now()); len(got) != 0 {
		t.Errorf("without --strict-supervisors: %q", lines(got))
	}
	o.strictSupervisors = true
	got := checkGateway(&o, false, time.Now())
	if len(got) != 1 || got[0].where != "gateway" || !strings.Contains(got[0].msg, "unknown supervisor ids") || !strings.Contains(got[0].msg, "host-typo") {
		t.Errorf("with --strict-supervisors: %q", lines(got))
	}

	// Invalid documents: validate's paths are the gateway's.
	o.strictSupervisors = false
	write(t, cfg, `{"supervisors": {"sup-1": {"revision": "r1", "instances": [
	  {"workspace": "Team", "sandbox": "a", "limits": {"max_streamz": 1}, "services": [{"name": "web", "port": 80800}]}]}}}`)
	var want []string
	for _, p := range checkGateway(&o, false, time.Now()) {
		want = append(want, p.path)
	}
	_, err := gateway.New(gateway.Config{ConfigPath: cfg, TokensPath: tokens, Logger: slog.New(slog.DiscardHandler)})
	var pe *gateway.ConfigProblemsError
	if !errors.As(err, &pe) {
		t.Fatalf("gateway.New: %v", err)
	}
	var paths []string
	for _, p := range pe.Problems {
		paths = append(paths, p.Path)
	}
	if len(want) != 3 || !slices.Equal(paths, want) {
		t.Errorf("the gateway's problems at %q, validate's at %q", paths, want)
	}
}
