package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

// Tokens of the test fixture. They are distinctive so that a test can check
// that none of them ever reaches the logs.
const (
	tokSup1 = "tok-sup-1-S3CRET-a1"
	tokSup2 = "tok-sup-2-S3CRET-b2"
	tokSup3 = "tok-sup-3-S3CRET-c3" // sup-3 has no section in the config
	tokWS   = "tok-ws-S3CRET-d4"
)

var allTokens = []string{tokSup1, tokSup2, tokSup3, tokWS}

const tokensJSON = `{"tokens": [
  {"token": "` + tokSup1 + `", "supervisor": "sup-1"},
  {"token": "` + tokSup2 + `", "supervisor": "sup-2"},
  {"token": "` + tokSup3 + `", "supervisor": "sup-3"},
  {"token": "` + tokWS + `", "workspaces": ["team"]}
]}`

// configJSON returns a configuration file in which sup-1 has revision
// rev1 (pretty-printed, to check compaction) and sup-2 has revision rev2.
func configJSON(rev1, rev2 string) string {
	return `{
  "supervisors": {
    "sup-1": {
      "revision": "` + rev1 + `",
      "instances": [
        {"workspace": "team", "sandbox": "demo", "generation": "3",
         "connector": {"type": "tcp", "host": "127.0.0.1"},
         "services": [{"name": "web", "port": 8080, "revision": 7}]}
      ]
    },
    "sup-2": {"revision": "` + rev2 + `", "instances": []}
  }
}`
}

// doc1 is sup-1's document of configJSON, compacted.
func doc1(rev1 string) string {
	return `{"revision":"` + rev1 + `","instances":[{"workspace":"team","sandbox":"demo","generation":"3",` +
		`"connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"web","port":8080,"revision":7}]}]}`
}

// writeFileAtomic replaces path with data the way an operator's tooling
// should: a temporary file in the same directory, then a rename.
func writeFileAtomic(t *testing.T, path, data string) {
	t.Helper()
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		t.Fatal(err)
	}
}

// logBuffer collects log output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type fixture struct {
	t          *testing.T
	configPath string
	tokensPath string
	g          *Gateway
	srv        *httptest.Server
	client     *http.Client
	reg        *prometheus.Registry
	logs       *logBuffer
}

type fixtureOptions struct {
	http2        bool
	disablePush  bool
	keepalive    time.Duration
	writeTimeout time.Duration
}

// newFixture writes the config and tokens files, starts a Gateway
// (Poll 20 ms) with its reload loop, and serves it on loopback. Everything
// is stopped, and goroutine leaks checked, when the test ends.
func newFixture(t *testing.T, o fixtureOptions) *fixture {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

	dir := t.TempDir()
	f := &fixture{
		t:          t,
		configPath: filepath.Join(dir, "gateway.json"),
		tokensPath: filepath.Join(dir, "tokens.json"),
		reg:        prometheus.NewRegistry(),
		logs:       &logBuffer{},
	}
	writeFileAtomic(t, f.configPath, configJSON("r1", "s1"))
	writeFileAtomic(t, f.tokensPath, tokensJSON)
	if o.keepalive == 0 {
		o.keepalive = time.Hour // no keepalives unless a test asks
	}
	g, err := New(Config{
		ConfigPath:  f.configPath,
		TokensPath:  f.tokensPath,
		Keepalive:   o.keepalive,
		Poll:        20 * time.Millisecond,
		DisablePush: o.disablePush,
		Logger:      slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer:  f.reg,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if o.writeTimeout > 0 {
		g.push.sendTimeout = o.writeTimeout
	}
	f.g = g
	if o.http2 {
		f.srv = httptest.NewUnstartedServer(g.Handler())
		f.srv.EnableHTTP2 = true
		f.srv.StartTLS()
	} else {
		f.srv = httptest.NewServer(g.Handler())
	}
	f.client = f.srv.Client()
	t.Cleanup(f.srv.Close) // runs last: every handler has ended by then
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		g.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-runDone
	})
	t.Cleanup(g.Close) // runs first: ends the watch streams
	t.Cleanup(func() {
		logs := f.logs.String()
		for _, tok := range allTokens {
			if strings.Contains(logs, tok) {
				t.Errorf("a token value appears in the logs:\n%s", logs)
			}
		}
	})
	return f
}

func (f *fixture) url(path string) string { return f.srv.URL + path }

// do sends a request with the given bearer token ("" for none) and returns
// the response with its body read.
func (f *fixture) do(method, path, token string, body io.Reader, header ...string) (*http.Response, string) {
	f.t.Helper()
	return doRequest(f.t, f.client, method, f.url(path), token, body, header...)
}

// doRequest sends a request with the given bearer token ("" for none) and
// header (name, value pairs) and returns the response with its body read.
func doRequest(t *testing.T, client *http.Client, method, url, token string, body io.Reader, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp, string(b)
}

// metric returns the value of the counter or gauge name whose labels
// include labels (name=value pairs), or 0.
func (f *fixture) metric(name string, labels ...string) float64 {
	f.t.Helper()
	return gatheredValue(f.t, f.reg, name, labels...)
}

// streamLine is one line of a watch stream and when it arrived.
type streamLine struct {
	text string
	at   time.Time
}

// configWatch is an open watch stream, read by a goroutine that ends when the
// stream ends or the test closes it.
type configWatch struct {
	t     *testing.T
	resp  *http.Response
	lines chan streamLine
	done  chan struct{}
}

// openWatch GETs url with token and checks that the answer is a 200 NDJSON
// stream.
func openWatch(t *testing.T, client *http.Client, url, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("watch %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		t.Fatalf("watch %s: %d %q", url, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("watch Content-Type = %q", ct)
	}
	return resp
}

// watch opens a watch stream for supervisor sup and checks it is a 200
// NDJSON stream.
func (f *fixture) watch(sup, token string) *configWatch {
	f.t.Helper()
	resp := openWatch(f.t, f.client, f.url("/v1/supervisors/"+sup+"/config?watch=1"), token)
	w := &configWatch{t: f.t, resp: resp, lines: make(chan streamLine, 1024), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.lines)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			w.lines <- streamLine{text: sc.Text(), at: time.Now()}
		}
	}()
	f.t.Cleanup(w.close)
	return w
}

func (w *configWatch) close() {
	_ = w.resp.Body.Close()
	<-w.done
}

// next returns the next line, failing the test after within.
func (w *configWatch) next(within time.Duration) streamLine {
	w.t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case l, ok := <-w.lines:
		if !ok {
			w.t.Fatal("watch stream ended")
		}
		return l
	case <-timer.C:
		w.t.Fatalf("no line within %v", within)
		return streamLine{}
	}
}

// nextDocument skips keepalives and returns the next document line.
func (w *configWatch) nextDocument(within time.Duration) streamLine {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		l := w.next(time.Until(deadline))
		if l.text != `{"keepalive":true}` {
			return l
		}
	}
}

// documentWhere reads documents until one satisfies ok and returns it;
// the gateway may push several quick changes as one document, so a test
// waits for the state it expects rather than counting documents.
func (w *configWatch) documentWhere(within time.Duration, what string, ok func(text string) bool) streamLine {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			w.t.Fatalf("no document with %s within %v", what, within)
		}
		if l := w.nextDocument(left); ok(l.text) {
			return l
		}
	}
}

// waitEnd waits for the stream to end, skipping any lines.
func (w *configWatch) waitEnd(within time.Duration) {
	w.t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-w.lines:
			if !ok {
				return
			}
		case <-timer.C:
			w.t.Fatalf("watch stream still open after %v", within)
		}
	}
}

// checkOneLine checks that an error body is exactly one line that starts
// with the status code.
func checkOneLine(t *testing.T, code int, body string) {
	t.Helper()
	if !strings.HasSuffix(body, "\n") || strings.Count(body, "\n") != 1 {
		t.Errorf("body %q is not exactly one line", body)
	}
	if !strings.HasPrefix(body, fmt.Sprintf("%d %s: ", code, http.StatusText(code))) {
		t.Errorf("body %q does not start with the status", body)
	}
}

func TestGatewayPollETagAndReload(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	resp, body := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d %q", resp.StatusCode, body)
	}
	if body != doc1("r1")+"\n" {
		t.Errorf("body %q, want the compacted document", body)
	}
	if got := resp.Header.Get("ETag"); got != `"r1"` {
		t.Errorf("ETag %q", got)
	}
	if got := resp.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}
	if got := resp.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control %q", got)
	}
	resp, body = f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil, "If-None-Match", `"r1"`)
	if resp.StatusCode != http.StatusNotModified || body != "" || resp.Header.Get("ETag") != `"r1"` {
		t.Fatalf("If-None-Match: %d ETag %q body %q", resp.StatusCode, resp.Header.Get("ETag"), body)
	}
	resp, _ = f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil, "If-None-Match", `"r0", W/"r1"`)
	if resp.StatusCode != http.StatusNotModified {
		t.Fatalf("list If-None-Match with a weak match: %d", resp.StatusCode)
	}
	resp, _ = f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil, "If-None-Match", `"r0"`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stale If-None-Match: %d", resp.StatusCode)
	}
	if got := f.metric("applistener_gateway_requests_total", "endpoint", "config", "code", "304"); got != 2 {
		t.Errorf("304 requests = %v, want 2", got)
	}

	// sup-3 has a token but no section: the empty document.
	resp, body = f.do(http.MethodGet, "/v1/supervisors/sup-3/config", tokSup3, nil)
	if resp.StatusCode != http.StatusOK || body != emptyDocument+"\n" {
		t.Fatalf("sup-3: %d %q", resp.StatusCode, body)
	}
	if et := resp.Header.Get("ETag"); !strings.HasPrefix(et, `"sha256:`) || len(et) != len(`"sha256:`)+16+1 {
		t.Errorf("sup-3 ETag %q", et)
	}

	writeFileAtomic(t, f.configPath, configJSON("r2", "s1"))
	start := time.Now()
	testutil.Eventually(t, 2*time.Second, "the new document", func() bool {
		resp, body := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil, "If-None-Match", `"r1"`)
		return resp.StatusCode == http.StatusOK && resp.Header.Get("ETag") == `"r2"` && body == doc1("r2")+"\n"
	})
	t.Logf("reload seen by a poll after %v", time.Since(start))
	if got := f.metric("applistener_gateway_reloads_total", "file", "config", "result", "ok"); got < 2 {
		t.Errorf("config reloads ok = %v, want ≥ 2", got)
	}
}

func TestGatewayETagWithoutRevision(t *testing.T) {
	docs, err := parseConfigFile([]byte(`{"supervisors": {
		"a": {"instances": []},
		"b": {"revision": "has space", "instances": []},
		"c": {"revision": "q\"uote", "instances": []},
		"e": {"revision": "v-1.2",   "instances": []}}}`))
	if err != nil {
		t.Fatal(err)
	}
	// A revision that is not a string, or a section with a field a
	// supervisor does not know, refuses the file (at the section's path);
	// such a document can still be in the store (written by an older
	// gateway), and gets the ETag of its bytes.
	odd := `{"supervisors": {"d": {"revision": 7, "instances": []}, "x": {"revision": "v-1.2", "instances": [], "x": 1}}}`
	_, err = parseConfigFile([]byte(odd))
	var pe *ConfigProblemsError
	if !errors.As(err, &pe) || len(pe.Problems) != 2 || pe.Problems[0].Path != "supervisors.d" || pe.Problems[1].Path != "supervisors.x" {
		t.Fatalf("parseConfigFile(%s) = %v", odd, err)
	}
	sections, err := parseConfigSections([]byte(odd))
	if err != nil {
		t.Fatal(err)
	}
	docs["d"] = sections["d"]
	if et := sections["x"].etag; et != `"v-1.2"` {
		t.Errorf("x: ETag %q", et)
	}
	if got := string(sections["x"].body); got != `{"revision":"v-1.2","instances":[],"x":1}` {
		t.Errorf("x: body %q (the structural pass keeps a section as written)", got)
	}
	for _, sup := range []string{"a", "b", "c", "d"} {
		if et := docs[sup].etag; !strings.HasPrefix(et, `"sha256:`) || len(et) != 25 {
			t.Errorf("%s: ETag %q, want the sha256 form", sup, et)
		}
	}
	if docs["a"].etag == docs["b"].etag {
		t.Error("different documents share an ETag")
	}
	if et := docs["e"].etag; et != `"v-1.2"` {
		t.Errorf("e: ETag %q", et)
	}
	if got := string(docs["e"].body); got != `{"revision":"v-1.2","instances":[]}` {
		t.Errorf("e: body %q (compacted, as written)", got)
	}

	// Strings that look like structure do not confuse the structural pass
	// (parseConfigFile then refuses x and y: a and b are unknown fields, y
	// has no instances).
	tricky := `{"supervisors": {"x": {"a": "q\"}{\\", "b": ["}", {"c": "\\\\"}, -1.5e3, null], "revision": "rev-7"}, "y": {}}}`
	if _, err := parseConfigFile([]byte(tricky)); !errors.As(err, &pe) || len(pe.Problems) != 2 {
		t.Errorf("parseConfigFile(tricky) = %v", err)
	}
	docs, err = parseConfigSections([]byte(tricky))
	if err != nil {
		t.Fatal(err)
	}
	if et := docs["x"].etag; et != `"rev-7"` {
		t.Errorf("x: ETag %q", et)
	}
	if got, want := string(docs["x"].body), `{"a":"q\"}{\\","b":["}",{"c":"\\\\"},-1.5e3,null],"revision":"rev-7"}`; got != want {
		t.Errorf("x: body %s, want %s", got, want)
	}
	if len(docs) != 2 || string(docs["y"].body) != "{}" {
		t.Errorf("docs %v", docs)
	}
}

// FuzzGatewayParseConfig checks parseConfigFile's structural pass against
// encoding/json: every accepted file is valid JSON, and each section is the
// compacted value encoding/json finds; parseConfigFile accepts only files
// the structural pass accepts, with the same sections.
func FuzzGatewayParseConfig(f *testing.F) {
	f.Add([]byte(configJSON("r1", "s1")))
	f.Add([]byte(`{"supervisors": {"x": {"a": "q\"}{\\", "b": ["}", {"c": "\\\\"}], "revision": "r"}}}`))
	f.Add([]byte(`{"supervisors": {"a\u002db": {"revision": "\u0072"}}}`))
	f.Add([]byte(`{"supervisors": {}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := parseConfigSections(data)
		if checked, cerr := parseConfigFile(data); cerr == nil && (err != nil || len(checked) != len(docs)) {
			t.Fatalf("parseConfigFile accepted %d sections, the structural pass %d (%v)", len(checked), len(docs), err)
		}
		if err != nil {
			return
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(data, &top); err != nil {
			t.Fatalf("accepted invalid JSON: %v", err)
		}
		var sups map[string]json.RawMessage
		if err := json.Unmarshal(top["supervisors"], &sups); err != nil {
			t.Fatalf("supervisors: %v", err)
		}
		if len(sups) != len(docs) {
			t.Fatalf("%d sections, encoding/json finds %d", len(docs), len(sups))
		}
		for id, raw := range sups {
			var want bytes.Buffer
			if err := json.Compact(&want, raw); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(docs[id].body, want.Bytes()) {
				t.Fatalf("section %q = %s, want %s", id, docs[id].body, want.Bytes())
			}
		}
	})
}

func TestGatewayParseConfigRefuses(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"not json", `{"supervisors": `, "not valid JSON"},
		{"not json, position", "{\n  \"supervisors\": x}", "not valid JSON at line 2, column 18"},
		{"not object", `[]`, "top level must be a JSON object"},
		{"unknown key", `{"supervisors": {}, "extra": 1}`, `unknown top-level key "extra"`},
		{"missing", `{}`, `missing "supervisors"`},
		{"twice", `{"supervisors": {}, "supervisors": {}}`, "appears twice"},
		{"supervisors not object", `{"supervisors": []}`, `"supervisors" must be a JSON object`},
		{"section not object", `{"supervisors": {"a": []}}`, "must be a JSON object"},
		{"section null", `{"supervisors": {"a": null}}`, "must be a JSON object"},
		{"duplicate id", `{"supervisors": {"a": {}, "a": {}}}`, `"a" appears twice`},
		{"bad id", `{"supervisors": {"a/b": {}}}`, "not allowed"},
		{"empty id", `{"supervisors": {"": {}}}`, "empty supervisor id"},
		{"bad utf8", "{\"supervisors\": {\"a\": {\"revision\": \"\xff\"}}}", "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfigFile([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestGatewayParseTokensRefuses(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"unknown field", `{"tokens": [{"token": "x", "supervisor": "a", "role": "admin"}]}`, "unknown field"},
		{"supervisor and admin", `{"tokens": [{"token": "x", "supervisor": "a", "admin": true}]}`, "both a supervisor and admin"},
		{"workspaces and pool", `{"tokens": [{"token": "x", "workspaces": ["team"], "pool": "p"}]}`, "both workspaces and a pool"},
		{"bad pool", `{"tokens": [{"token": "x", "pool": "a b"}]}`, "pool name"},
		{"unknown top", `{"tokens": [], "more": 1}`, "unknown field"},
		{"missing", `{}`, `missing "tokens"`},
		{"both", `{"tokens": [{"token": "x", "supervisor": "a", "workspaces": ["team"]}]}`, "both"},
		{"neither", `{"tokens": [{"token": "x"}]}`, "needs a supervisor or workspaces"},
		{"empty token", `{"tokens": [{"token": "", "supervisor": "a"}]}`, "empty token"},
		{"space in token", `{"tokens": [{"token": "SECRET VALUE", "supervisor": "a"}]}`, "visible ASCII"},
		{"duplicate", `{"tokens": [{"token": "SECRET", "supervisor": "a"}, {"token": "SECRET", "supervisor": "b"}]}`, "same token as tokens[0]"},
		{"bad workspace", `{"tokens": [{"token": "x", "workspaces": ["Team"]}]}`, "workspace"},
		{"bad supervisor", `{"tokens": [{"token": "x", "supervisor": "a b"}]}`, "not allowed"},
		{"trailing", `{"tokens": []} {}`, "data after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTokens([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
}

func TestGatewayNewGatewayRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	bad := filepath.Join(dir, "bad.json")
	writeFileAtomic(t, good, tokensJSON)
	writeFileAtomic(t, bad, `{"supervisors": {"a": []}}`)
	for _, cfg := range []Config{
		{ConfigPath: filepath.Join(dir, "missing.json"), TokensPath: good},
		{ConfigPath: bad, TokensPath: good},
		{ConfigPath: good, TokensPath: good}, // a tokens file is not a config file
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%s, %s) succeeded", filepath.Base(cfg.ConfigPath), filepath.Base(cfg.TokensPath))
		}
	}
}

func TestGatewayAuth(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	for _, tc := range []struct {
		name, path, token, header string
		code                      int
		reason                    string
	}{
		{"no token", "/v1/supervisors/sup-1/config", "", "", 401, "missing bearer token"},
		{"not bearer", "/v1/supervisors/sup-1/config", "", "Basic dXNlcjpwYXNz", 401, "missing bearer token"},
		{"unknown token", "/v1/supervisors/sup-1/config", "nope", "", 401, "unknown token"},
		{"other supervisor", "/v1/supervisors/sup-1/config", tokSup2, "", 403, ""},
		{"workspace token", "/v1/supervisors/sup-1/config", tokWS, "", 403, ""},
		{"watch, other supervisor", "/v1/supervisors/sup-2/config?watch=1", tokSup1, "", 403, ""},
		{"watch, unknown", "/v1/supervisors/sup-2/config?watch=1", "nope", "", 401, "unknown token"},
		{"installations, other", "/v1/supervisors/sup-2/installations", tokSup1, "", 403, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := http.MethodGet
			if strings.HasSuffix(tc.path, "installations") {
				method = http.MethodPut
			}
			var hdr []string
			if tc.header != "" {
				hdr = []string{"Authorization", tc.header}
			}
			resp, body := f.do(method, tc.path, tc.token, strings.NewReader(`{"installations":[]}`), hdr...)
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d %q, want %d", resp.StatusCode, body, tc.code)
			}
			checkOneLine(t, tc.code, body)
			if tc.reason != "" && body != fmt.Sprintf("%d %s: %s\n", tc.code, http.StatusText(tc.code), tc.reason) {
				t.Errorf("body %q", body)
			}
			if tc.code == 401 && resp.Header.Get("WWW-Authenticate") != "Bearer" {
				t.Errorf("WWW-Authenticate %q", resp.Header.Get("WWW-Authenticate"))
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
	// Bearer is case-insensitive.
	if resp, _ := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", "", nil, "Authorization", "bearer "+tokSup1); resp.StatusCode != 200 {
		t.Errorf("lower-case scheme: %d", resp.StatusCode)
	}
	// Unknown paths and wrong methods.
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, "/", 404},
		{http.MethodGet, "/v1/supervisors/sup-1/unknown", 404},
		{http.MethodGet, "/v1/supervisor/sup-1", 404},
		// The write API's supervisor entry needs an admin token.
		{http.MethodGet, "/v1/supervisors/sup-1", 403},
		{http.MethodGet, "/v1/supervisors/sup-1/config/extra", 404},
		{http.MethodPost, "/v1/supervisors/sup-1/config", 405},
		{http.MethodGet, "/v1/supervisors/sup-1/installations", 405},
	} {
		resp, body := f.do(tc.method, tc.path, tokSup1, nil)
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
			continue
		}
		checkOneLine(t, tc.code, body)
		if tc.code == 405 && resp.Header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", tc.method, tc.path)
		}
	}
	if got := f.metric("applistener_gateway_requests_total", "endpoint", "config", "code", "401"); got != 3 {
		t.Errorf("config 401 count = %v, want 3", got)
	}
}

func TestGatewayWatchPush(t *testing.T) {
	f := newFixture(t, fixtureOptions{keepalive: 50 * time.Millisecond})
	w1 := f.watch("sup-1", tokSup1)
	w2 := f.watch("sup-2", tokSup2)
	if l := w1.next(2 * time.Second); l.text != doc1("r1") {
		t.Fatalf("first line %q", l.text)
	}
	if l := w2.next(2 * time.Second); l.text != `{"revision":"s1","instances":[]}` {
		t.Fatalf("sup-2 first line %q", l.text)
	}
	testutil.Eventually(t, time.Second, "2 watchers", func() bool { return f.metric("applistener_gateway_watchers") == 2 })

	writeFileAtomic(t, f.configPath, configJSON("r2", "s1"))
	written := time.Now()
	l := w1.nextDocument(time.Second)
	if l.text != doc1("r2") {
		t.Fatalf("pushed line %q", l.text)
	}
	t.Logf("push latency (file written → line received): %v", l.at.Sub(written))

	// sup-2's document did not change: it gets keepalives only. Three
	// keepalives after sup-1's push, a push to sup-2 would have arrived.
	for i := 0; i < 3; i++ {
		if l := w2.next(2 * time.Second); l.text != `{"keepalive":true}` {
			t.Fatalf("sup-2 got %q after a change of sup-1 only", l.text)
		}
	}
	if got := f.metric("applistener_gateway_pushes_total"); got != 1 {
		t.Errorf("pushes = %v, want 1", got)
	}

	// A change of sup-2 reaches sup-2.
	writeFileAtomic(t, f.configPath, configJSON("r2", "s2"))
	if l := w2.nextDocument(time.Second); l.text != `{"revision":"s2","instances":[]}` {
		t.Fatalf("sup-2 pushed line %q", l.text)
	}
	// Removing sup-1's section pushes the empty document.
	writeFileAtomic(t, f.configPath, `{"supervisors": {"sup-2": {"revision":"s2","instances":[]}}}`)
	if l := w1.nextDocument(time.Second); l.text != emptyDocument {
		t.Fatalf("sup-1 after its section was removed: %q", l.text)
	}
}

func TestGatewayWatchKeepalive(t *testing.T) {
	const interval = 50 * time.Millisecond
	f := newFixture(t, fixtureOptions{keepalive: interval})
	w := f.watch("sup-1", tokSup1)
	first := w.next(2 * time.Second)
	const n = 5
	var last streamLine
	for i := 0; i < n; i++ {
		last = w.next(2 * time.Second)
		if last.text != `{"keepalive":true}` {
			t.Fatalf("line %d = %q, want a keepalive", i+1, last.text)
		}
	}
	mean := last.at.Sub(first.at) / n
	t.Logf("mean keepalive interval %v (configured %v)", mean, interval)
	if mean < interval*8/10 || mean > interval*4 {
		t.Errorf("mean keepalive interval %v, want about %v", mean, interval)
	}
}

func TestGatewayWatchEndsWhenTokenRevoked(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	w1 := f.watch("sup-1", tokSup1)
	w2 := f.watch("sup-2", tokSup2)
	w1.next(2 * time.Second)
	w2.next(2 * time.Second)

	// sup-1's token is removed; sup-2's token is moved to another
	// supervisor (changed).
	writeFileAtomic(t, f.tokensPath, `{"tokens": [
	  {"token": "`+tokSup2+`", "supervisor": "sup-9"},
	  {"token": "`+tokSup3+`", "supervisor": "sup-3"}]}`)
	start := time.Now()
	w1.waitEnd(2 * time.Second)
	w2.waitEnd(2 * time.Second)
	t.Logf("streams ended %v after the tokens file changed", time.Since(start))
	testutil.Eventually(t, time.Second, "no watchers", func() bool { return f.metric("applistener_gateway_watchers") == 0 })
	if resp, body := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil); resp.StatusCode != 401 {
		t.Errorf("revoked token: %d %q", resp.StatusCode, body)
	}
	if !strings.Contains(f.logs.String(), "reason=\"token revoked\"") {
		t.Errorf("no log of the revocation:\n%s", f.logs)
	}
	// A watch whose token is unchanged survives a tokens reload.
	w3 := f.watch("sup-3", tokSup3)
	w3.next(2 * time.Second)
	writeFileAtomic(t, f.tokensPath, `{"tokens": [{"token": "`+tokSup3+`", "supervisor": "sup-3"}, {"token": "new", "workspaces": ["team"]}]}`)
	testutil.Eventually(t, 2*time.Second, "tokens reload", func() bool {
		return f.metric("applistener_gateway_reloads_total", "file", "tokens", "result", "ok") >= 3
	})
	if got := f.metric("applistener_gateway_watchers"); got != 1 {
		t.Errorf("watchers = %v after an unrelated token change, want 1", got)
	}
}

func TestGatewayBadReloadKeepsOld(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	writeFileAtomic(t, f.configPath, `{"supervisors": {"sup-1": {"revision": "r9", "instances": [}}`)
	testutil.Eventually(t, 2*time.Second, "a failed config reload", func() bool {
		return f.metric("applistener_gateway_reloads_total", "file", "config", "result", "failed") == 1
	})
	resp, body := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil)
	if resp.StatusCode != 200 || resp.Header.Get("ETag") != `"r1"` || body != doc1("r1")+"\n" {
		t.Fatalf("after a bad reload: %d ETag %q body %q", resp.StatusCode, resp.Header.Get("ETag"), body)
	}
	var errLines []string
	for _, line := range strings.Split(f.logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			errLines = append(errLines, line)
		}
	}
	if len(errLines) != 1 || !strings.Contains(errLines[0], "keeping the previous one") {
		t.Errorf("want one ERROR line, got %q", errLines)
	}

	// Unknown top-level keys are refused too; a broken tokens file keeps
	// the old tokens.
	writeFileAtomic(t, f.configPath, `{"supervisors": {}, "extra": true}`)
	writeFileAtomic(t, f.tokensPath, `{"tokens": [{"token": "x"}]}`)
	testutil.Eventually(t, 2*time.Second, "two more failed reloads", func() bool {
		return f.metric("applistener_gateway_reloads_total", "file", "config", "result", "failed") == 2 &&
			f.metric("applistener_gateway_reloads_total", "file", "tokens", "result", "failed") == 1
	})
	if resp, _ := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil); resp.StatusCode != 200 || resp.Header.Get("ETag") != `"r1"` {
		t.Fatalf("after bad reloads: %d ETag %q", resp.StatusCode, resp.Header.Get("ETag"))
	}

	// A missing file keeps the old state too, and its return is noticed.
	if err := os.Remove(f.configPath); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, "the missing file reported", func() bool {
		return f.metric("applistener_gateway_reloads_total", "file", "config", "result", "failed") == 3
	})
	writeFileAtomic(t, f.configPath, configJSON("r3", "s1"))
	testutil.Eventually(t, 2*time.Second, "the file's return", func() bool {
		resp, _ := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil)
		return resp.Header.Get("ETag") == `"r3"`
	})
	// Reload reports failures to its caller.
	writeFileAtomic(t, f.configPath, `nope`)
	if err := f.g.Reload(); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Errorf("Reload() = %v", err)
	}
}

func TestGatewayDisablePush(t *testing.T) {
	f := newFixture(t, fixtureOptions{disablePush: true})
	resp, body := f.do(http.MethodGet, "/v1/supervisors/sup-1/config?watch=1", tokSup1, nil)
	if resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("status %d %q", resp.StatusCode, body)
	}
	checkOneLine(t, 501, body)
	if resp, _ := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil); resp.StatusCode != 200 {
		t.Errorf("poll with push disabled: %d", resp.StatusCode)
	}
}

func TestGatewayInstallations(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	const path = "/v1/supervisors/sup-1/installations"
	good := `{"installations": [{"hostname": "team--demo--web.apps.test", "workspace": "team", "sandbox": "demo",
	  "name": "web", "installation_version": 3, "declaration_revision": 7,
	  "expires_at": "2030-01-01T00:00:00Z", "endpoint": {"host": "10.0.0.5", "port": 8080}}]}`
	before := time.Now()
	resp, body := f.do(http.MethodPut, path, tokSup1, strings.NewReader(good), "Content-Type", "application/json")
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d %q", resp.StatusCode, body)
	}
	f.g.mu.Lock()
	adv, ok := f.g.installations["sup-1"]
	f.g.mu.Unlock()
	if !ok || len(adv.installations) != 1 || adv.received.Before(before) || !json.Valid(adv.body) {
		t.Fatalf("stored advertisement: %+v", adv)
	}

	resp, body = f.do(http.MethodPut, "/v1/supervisors/sup-2/installations", tokSup1, strings.NewReader(good))
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("other supervisor: %d %q", resp.StatusCode, body)
	}
	for _, bad := range []string{`{"installations": [`, `[]`, `{"installations": {}}`, `{"other": []}`,
		`{"installations": null}`, `{"installations": [1]}`, `{"installations": []} {}`} {
		resp, body := f.do(http.MethodPut, path, tokSup1, strings.NewReader(bad))
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: %d %q", bad, resp.StatusCode, body)
			continue
		}
		checkOneLine(t, 400, body)
	}
	// Too large: announced by Content-Length (the client waits for 100
	// Continue, which never comes, so it never sends the body) ...
	huge := `{"installations": [], "pad": "` + strings.Repeat("x", MaxInstallationsBytes) + `"}`
	tr := f.client.Transport.(*http.Transport).Clone()
	tr.ExpectContinueTimeout = 10 * time.Second
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPut, f.url(path), strings.NewReader(huge))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tokSup1)
	req.Header.Set("Expect", "100-continue")
	resp, err = (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("> 4 MiB with Content-Length: %d %q", resp.StatusCode, b)
	}
	checkOneLine(t, http.StatusRequestEntityTooLarge, string(b))
	// ... or found while reading a body of unknown length (chunked).
	resp, body = f.do(http.MethodPut, path, tokSup1, io.MultiReader(strings.NewReader(huge[:MaxInstallationsBytes+1])))
	if resp.StatusCode != http.StatusRequestEntityTooLarge && resp.StatusCode != http.StatusBadRequest {
		t.Errorf("> 4 MiB chunked: %d %q", resp.StatusCode, body)
	}
	f.g.mu.Lock()
	n := len(f.g.installations)
	f.g.mu.Unlock()
	if n != 1 {
		t.Errorf("%d stored advertisements, want 1", n)
	}
}

func TestGatewayCloseEndsWatches(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	w1 := f.watch("sup-1", tokSup1)
	w2 := f.watch("sup-2", tokSup2)
	w1.next(2 * time.Second)
	w2.next(2 * time.Second)
	f.g.Close()
	w1.waitEnd(2 * time.Second)
	w2.waitEnd(2 * time.Second)
	f.g.Close() // idempotent
	resp, body := f.do(http.MethodGet, "/v1/supervisors/sup-1/config?watch=1", tokSup1, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("watch after Close: %d %q", resp.StatusCode, body)
	}
	if resp, _ := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil); resp.StatusCode != 200 {
		t.Errorf("poll after Close: %d", resp.StatusCode)
	}
	testutil.Eventually(t, time.Second, "no watchers", func() bool { return f.metric("applistener_gateway_watchers") == 0 })
}

func TestGatewayWatchHTTP2(t *testing.T) {
	f := newFixture(t, fixtureOptions{http2: true, keepalive: 50 * time.Millisecond})
	w := f.watch("sup-1", tokSup1)
	if w.resp.ProtoMajor != 2 {
		t.Fatalf("protocol %s, want HTTP/2", w.resp.Proto)
	}
	if l := w.next(2 * time.Second); l.text != doc1("r1") {
		t.Fatalf("first line %q", l.text)
	}
	writeFileAtomic(t, f.configPath, configJSON("r2", "s1"))
	written := time.Now()
	l := w.nextDocument(time.Second)
	if l.text != doc1("r2") {
		t.Fatalf("pushed line %q", l.text)
	}
	t.Logf("HTTP/2 push latency: %v", l.at.Sub(written))
	if l := w.next(2 * time.Second); l.text != `{"keepalive":true}` {
		t.Fatalf("line %q, want a keepalive", l.text)
	}
	f.g.Close()
	w.waitEnd(2 * time.Second)
}

// A supervisor that stops reading is disconnected when a write times out;
// the gateway never queues more than the latest document for it.
func TestGatewayWatchStuckReaderDisconnected(t *testing.T) {
	f := newFixture(t, fixtureOptions{writeTimeout: 200 * time.Millisecond})
	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if err := conn.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(conn, "GET /v1/supervisors/sup-1/config?watch=1 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n\r\n", tokSup1)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, "the watch", func() bool { return f.metric("applistener_gateway_watchers") == 1 })
	// Never read; push 1 MiB documents until the gateway gives up.
	pad := strings.Repeat("p", 1<<20)
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; f.metric("applistener_gateway_watchers") != 0; i++ {
		if time.Now().After(deadline) {
			t.Fatal("a stuck watcher was never disconnected")
		}
		writeFileAtomic(t, f.configPath, fmt.Sprintf(`{"supervisors": {"sup-1": {"revision": "big%d-%s", "instances": []}}}`, i, pad))
		testutil.Eventually(t, 10*time.Second, "the reload", func() bool {
			return f.metric("applistener_gateway_reloads_total", "file", "config", "result", "ok") >= float64(i+2)
		})
	}
	if !strings.Contains(f.logs.String(), "write failed") {
		t.Errorf("no log of the failed write:\n%.2000s", f.logs)
	}
}

// gatheredValue returns the value of the counter or gauge name in g whose
// labels include labels (name=value pairs), or 0.
func gatheredValue(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
