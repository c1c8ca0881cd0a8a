package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// adminRequest is one request the fake admin API received.
type adminRequest struct {
	method, path, auth, contentType string
	body                            []byte
}

// fakeAdmin is the gateway's admin write API as the contract describes it.
type fakeAdmin struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []adminRequest
	// answer returns the status and body of a request.
	answer func(r adminRequest) (int, string)
}

func newFakeAdmin(t *testing.T, answer func(r adminRequest) (int, string)) *fakeAdmin {
	f := &fakeAdmin{answer: answer}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := adminRequest{method: r.Method, path: r.URL.EscapedPath(), auth: r.Header.Get("Authorization"),
			contentType: r.Header.Get("Content-Type"), body: body}
		f.mu.Lock()
		f.reqs = append(f.reqs, req)
		f.mu.Unlock()
		code, text := f.answer(req)
		if code/100 == 2 && text != "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, text)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAdmin) requests() []adminRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]adminRequest(nil), f.reqs...)
}

// standardAdmin answers like the contract's gateway with one supervisor,
// sup-1, whose document holds team/demo.
func standardAdmin(r adminRequest) (int, string) {
	if r.auth != "Bearer ta" {
		return http.StatusForbidden, "403 Forbidden: not an admin token\n"
	}
	switch {
	case r.method == http.MethodPut && r.path == "/v1/supervisors/sup-1/instances/team/demo":
		var entry map[string]any
		if json.Unmarshal(r.body, &entry) != nil || entry["services"] == nil {
			return http.StatusBadRequest, "400 Bad Request: instance team/demo: services: required\n"
		}
		return http.StatusOK, `{"revision":"r7"}` + "\n"
	case r.method == http.MethodDelete && r.path == "/v1/supervisors/sup-1/instances/team/demo":
		return http.StatusNoContent, ""
	case r.method == http.MethodDelete:
		return http.StatusNotFound, "404 Not Found: no such instance\n"
	case r.method == http.MethodGet && r.path == "/v1/supervisors/sup-1/instances":
		return http.StatusOK, `{"revision":"r7","instances":[{"workspace":"team","sandbox":"demo","generation":"3",` +
			`"connector":{"type":"netns","path":"/run/netns/demo"},"services":[{"name":"web","port":8080},{"name":"","port":3000}]}]}` + "\n"
	}
	return http.StatusNotFound, "404 Not Found\n"
}

const testEntry = `{"workspace":"team","sandbox":"demo","generation":"3","services":[{"name":"web","port":8080}]}`

// instancesFiles writes the admin token and the entry and returns their
// paths.
func instancesFiles(t *testing.T) (token, entry string) {
	dir := t.TempDir()
	token, entry = filepath.Join(dir, "admin.token"), filepath.Join(dir, "entry.json")
	if err := os.WriteFile(token, []byte("ta\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(entry, []byte(testEntry+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return token, entry
}

// runInstances runs `applistener instances args...` in process with stdin
// and returns the exit code and outputs.
func runInstances(stdin string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	err := instancesCommand(args, strings.NewReader(stdin), &out, &errOut)
	code = exitCode("instances", err, &errOut)
	return code, out.String(), errOut.String()
}

func TestInstancesCommand(t *testing.T) {
	f := newFakeAdmin(t, standardAdmin)
	tok, entry := instancesFiles(t)
	common := []string{"--gateway", f.srv.URL, "--token-file", tok, "--supervisor", "sup-1"}
	args := func(sub string, extra ...string) []string {
		return append(append([]string{sub}, common...), extra...)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		stdin  string
		code   int
		stdout string // a substring
		stderr string // a substring of the one line
		req    string // "METHOD path" of the request sent ("" = none)
		body   string // its body
	}{
		{"put file", args("put", "--file", entry), "", 0, "put team/demo on supervisor sup-1: document revision r7", "",
			"PUT /v1/supervisors/sup-1/instances/team/demo", testEntry},
		{"put stdin with matching flags", args("put", "--file", "-", "--workspace", "team", "--sandbox", "demo"), testEntry, 0, "revision r7", "",
			"PUT /v1/supervisors/sup-1/instances/team/demo", testEntry},
		{"put json", args("put", "--file", entry, "--output", "json"), "", 0, `{"revision":"r7"}`, "", "PUT /v1/supervisors/sup-1/instances/team/demo", testEntry},
		{"put refused", args("put", "--file", "-"), `{"workspace":"team","sandbox":"demo"}`, 1, "", "answered 400: 400 Bad Request: instance team/demo: services: required",
			"PUT /v1/supervisors/sup-1/instances/team/demo", `{"workspace":"team","sandbox":"demo"}`},
		{"put flag contradicts the entry", args("put", "--file", entry, "--sandbox", "other"), "", 2, "", `--sandbox "other", but the entry`, "", ""},
		{"put entry without sandbox", args("put", "--file", "-"), `{"workspace":"team"}`, 1, "", "must name its workspace and sandbox", "", ""},
		{"put not an object", args("put", "--file", "-"), `[1]`, 1, "", "not a JSON object", "", ""},
		{"put missing file", args("put", "--file", "/nonexistent/entry.json"), "", 1, "", "read the entry", "", ""},
		{"put without --file", args("put"), "", 2, "", "put needs --file", "", ""},
		{"delete", args("delete", "--workspace", "team", "--sandbox", "demo"), "", 0, "deleted team/demo from supervisor sup-1", "",
			"DELETE /v1/supervisors/sup-1/instances/team/demo", ""},
		{"delete absent", args("delete", "--workspace", "team", "--sandbox", "gone"), "", 1, "", "instance team/gone of supervisor sup-1: not in the document (404)",
			"DELETE /v1/supervisors/sup-1/instances/team/gone", ""},
		{"delete without --sandbox", args("delete", "--workspace", "team"), "", 2, "", "delete needs --workspace and --sandbox", "", ""},
		{"delete bad name", args("delete", "--workspace", "Team", "--sandbox", "demo"), "", 2, "", "--workspace", "", ""},
		{"list table", args("list"), "", 0, "netns:/run/netns/demo  web=8080,(default)=3000", "", "GET /v1/supervisors/sup-1/instances", ""},
		{"list json", args("list", "--output", "json"), "", 0, `{"revision":"r7","instances":[{"workspace":"team"`, "", "GET /v1/supervisors/sup-1/instances", ""},
		{"list with --file", args("list", "--file", entry), "", 2, "", "list takes no", "", ""},
		{"bad output", args("list", "--output", "yaml"), "", 2, "", "--output", "", ""},
		{"no subcommand", nil, "", 2, "", "a subcommand is required", "", ""},
		{"unknown subcommand", []string{"get"}, "", 2, "", `unknown subcommand "get"`, "", ""},
		{"no gateway", []string{"list", "--token-file", tok, "--supervisor", "sup-1"}, "", 2, "", "--gateway is required", "", ""},
		{"bad gateway", []string{"list", "--gateway", "gateway:8080", "--token-file", tok, "--supervisor", "sup-1"}, "", 2, "", "--gateway", "", ""},
		{"no supervisor", []string{"list", "--gateway", f.srv.URL, "--token-file", tok}, "", 2, "", "--supervisor is required", "", ""},
		{"unreadable token", []string{"list", "--gateway", f.srv.URL, "--token-file", "/nonexistent", "--supervisor", "sup-1"}, "", 1, "", "token file", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(f.requests())
			code, stdout, stderr := runInstances(tc.stdin, tc.args...)
			if code != tc.code || !strings.Contains(stdout, tc.stdout) || !strings.Contains(stderr, tc.stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
			}
			if code != 0 && strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("stderr is not one line: %q", stderr)
			}
			reqs := f.requests()[before:]
			if tc.req == "" {
				if len(reqs) != 0 {
					t.Errorf("requests sent: %+v", reqs)
				}
				return
			}
			if len(reqs) != 1 {
				t.Fatalf("%d requests; want 1", len(reqs))
			}
			r := reqs[0]
			if got := r.method + " " + r.path; got != tc.req || string(r.body) != tc.body || r.auth != "Bearer ta" {
				t.Errorf("request %s body %q auth %q; want %s body %q", got, r.body, r.auth, tc.req, tc.body)
			}
			if tc.body != "" && r.contentType != "application/json" {
				t.Errorf("Content-Type %q", r.contentType)
			}
		})
	}
}

// A token that is not an admin token: exit 1 with a hint. The command is
// registered in the top-level dispatcher.
func TestInstancesRefusedAndRegistered(t *testing.T) {
	f := newFakeAdmin(t, standardAdmin)
	tok := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(tok, []byte("t1"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := run([]string{"instances", "list", "--gateway", f.srv.URL, "--token-file", tok, "--supervisor", "sup-1"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "applistener instances: the document of supervisor sup-1: the gateway answered 403") ||
		!strings.Contains(errOut.String(), "admin token") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
	out.Reset()
	if code := run([]string{"instances", "-h"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "usage: applistener instances") {
		t.Errorf("-h: exit %d, %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "instances") {
		t.Errorf("help: exit %d, %q", code, out.String())
	}
}

// Several gateways: a refused connection and a 5xx move the request to the
// next one; a 4xx does not.
func TestInstancesFailover(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	_ = ln.Close()
	down := newFakeAdmin(t, func(adminRequest) (int, string) {
		return http.StatusServiceUnavailable, "503 Service Unavailable: store not loaded\n"
	})
	up := newFakeAdmin(t, standardAdmin)
	tok, entry := instancesFiles(t)
	code, stdout, stderr := runInstances("", "put", "--gateway", dead+","+down.srv.URL+","+up.srv.URL, "--token-file", tok,
		"--supervisor", "sup-1", "--file", entry)
	if code != 0 || !strings.Contains(stdout, "revision r7") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if len(down.requests()) != 1 || len(up.requests()) != 1 {
		t.Errorf("requests: %d to the 503 endpoint, %d to the working one; want 1 and 1", len(down.requests()), len(up.requests()))
	}
	// Only endpoints that fail: the last answer is the error.
	code, _, stderr = runInstances("", "list", "--gateway", dead+","+down.srv.URL, "--token-file", tok, "--supervisor", "sup-1")
	if code != 1 || !strings.Contains(stderr, "503") {
		t.Errorf("all endpoints down: exit %d, stderr %q", code, stderr)
	}
	// A refusal is final.
	refusing := newFakeAdmin(t, func(adminRequest) (int, string) { return http.StatusForbidden, "403 Forbidden\n" })
	code, _, _ = runInstances("", "list", "--gateway", refusing.srv.URL+","+up.srv.URL, "--token-file", tok, "--supervisor", "sup-1")
	if code != 1 || len(up.requests()) != 1 {
		t.Errorf("a 403 moved to the next endpoint (exit %d, %d requests there)", code, len(up.requests()))
	}
}
