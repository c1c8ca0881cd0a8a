package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/applistener/applistener/internal/ocsf/ocsftest"
	"github.com/applistener/applistener/internal/testutil"
)

// h2Client returns an HTTP/2 client whose connections all go to the
// listener with SNI sni.
func (p *proc) h2Client(t testing.TB, sni string) *http.Client {
	tr := &http.Transport{
		DialContext:       p.dial,
		TLSClientConfig:   tlsConfig(sni),
		ForceAttemptHTTP2: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: waitTimeout}
}

// ocsfRecords returns the OCSF records p wrote so far; each must validate
// against its class.
func (p *proc) ocsfRecords(t testing.TB) [][]byte {
	t.Helper()
	recs := ocsftest.Records(p.output())
	for _, r := range recs {
		if err := ocsftest.Validate(r); err != nil {
			t.Errorf("OCSF record does not validate against its class: %v\n%s", err, r)
		}
	}
	return recs
}

// ocsfMatch returns the records in which every path has its value.
func ocsfMatch(recs [][]byte, kv ...string) [][]byte {
	var out [][]byte
next:
	for _, r := range recs {
		for i := 0; i < len(kv); i += 2 {
			if fmt.Sprint(ocsftest.Attr(r, kv[i])) != kv[i+1] {
				continue next
			}
		}
		out = append(out, r)
	}
	return out
}

// noSecrets checks that no OCSF record carries a query string, a cookie
// or a credential of the requests.
func noSecrets(t *testing.T, recs [][]byte) {
	t.Helper()
	for _, r := range recs {
		for _, s := range []string{"secret", "token=", "cookievalue", "session=", "authvalue", "Bearer"} {
			if strings.Contains(string(r), s) {
				t.Errorf("OCSF record holds %q: %s", s, r)
			}
		}
	}
}

// limitedDoc is routesDoc with max_streams 1 on the instance.
func limitedDoc(svcs ...service) []byte {
	var doc map[string]any
	if err := json.Unmarshal(routesDoc(svcs...), &doc); err != nil {
		panic(err)
	}
	doc["instances"].([]any)[0].(map[string]any)["limits"] = map[string]any{"max_streams": 1}
	b, _ := json.Marshal(doc)
	return b
}

// TestOCSFRecords (issue 16, item 3): with --ocsf-json --log-level error,
// a 421 (HTTP/1.1 and HTTP/2), a 503 (the instance at its stream limit),
// an unknown-SNI refusal and a route expiry each produce an OCSF record
// that validates against its class in the OCSF 1.8.0 schema (HTTP
// Activity, Network Activity, Entity Management), while the diagnostic
// log stays silent below error. The 421 carried ?token=secret and a
// Cookie: no record holds either.
func TestOCSFRecords(t *testing.T) {
	t.Parallel()
	web, api := newBackend(t, "web"), newBackend(t, "api")
	p := startProc(t, limitedDoc(service{Name: "web", Port: web.port, Revision: 1}, service{Name: "api", Port: api.port, Revision: 1}),
		"--ocsf-json", "--log-level", "error")

	// 421 over HTTP/1.1, with a query string and a cookie.
	rc := p.raw(t, hostWeb)
	resp, _ := rc.roundTrip(t, "GET /misdirected?token=secret HTTP/1.1\r\nHost: "+hostAPI+
		"\r\nCookie: session=cookievalue\r\nAuthorization: Bearer authvalue\r\n\r\n")
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("status %d, want 421", resp.StatusCode)
	}
	// 421 over HTTP/2.
	req, _ := http.NewRequest("GET", "https://"+hostWeb+"/misdirected-h2?token=secret", nil)
	req.Host = hostAPI
	req.Header.Set("Cookie", "session=cookievalue")
	h2resp, err := p.h2Client(t, hostWeb).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, h2resp.Body)
	_ = h2resp.Body.Close()
	if h2resp.StatusCode != http.StatusMisdirectedRequest || h2resp.ProtoMajor != 2 {
		t.Fatalf("HTTP/2: %s status %d, want HTTP/2 421", h2resp.Proto, h2resp.StatusCode)
	}

	// 503: one request in flight holds the instance's only stream.
	ctx, cancel := context.WithCancel(context.Background())
	slowDone := make(chan struct{})
	client, _ := p.client(t, hostWeb)
	go func() {
		defer close(slowDone)
		sreq, _ := http.NewRequestWithContext(ctx, "GET", "https://"+hostWeb+"/slow?ms=20000", nil)
		if r, err := client.Do(sreq); err == nil {
			_ = r.Body.Close()
		}
	}()
	testutil.Eventually(t, waitTimeout, "the slow request at the app", func() bool { return web.count() >= 1 })
	resp, _ = p.raw(t, hostWeb).roundTrip(t, "GET /limited HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n")
	cancel()
	<-slowDone
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d at the stream limit, want 503", resp.StatusCode)
	}

	// An unknown name: refused during the handshake.
	if c, err := p.dialTLS(tlsConfig("team--nope.apps.test")); err == nil {
		_ = c.Close()
		t.Fatal("an unknown name completed the handshake")
	}

	// Route expiry: the routes file can no longer be parsed, so nothing
	// renews the routes and they expire after --route-freshness.
	p.writeRoutes(t, []byte("{not json"))
	testutil.Eventually(t, waitTimeout, "the route expiry records", func() bool {
		return len(ocsfMatch(ocsftest.Records(p.output()), "class_uid", "3004", "message", "route expired")) == 2
	})

	recs := p.ocsfRecords(t)
	for _, c := range []struct {
		what string
		kv   []string
		n    int
	}{
		{"421 on HTTP/1.1", []string{"class_uid", "4002", "http_response.code", "421", "http_request.version", "1.1",
			"http_request.url.path", "/misdirected", "dst_endpoint.hostname", hostWeb, "unmapped.service", "web"}, 1},
		{"421 on HTTP/2", []string{"class_uid", "4002", "http_response.code", "421", "http_request.version", "2",
			"http_request.url.path", "/misdirected-h2"}, 1},
		{"503 at the stream limit", []string{"class_uid", "4002", "http_response.code", "503", "severity_id", "2",
			"status_id", "2", "unmapped.sandbox", "demo"}, 1},
		{"unknown SNI", []string{"class_uid", "4001", "activity_id", "5", "status_detail", "unknown_sni",
			"dst_endpoint.hostname", "team--nope.apps.test", "src_endpoint.ip", "127.0.0.1"}, 1},
		{"web route expiry", []string{"class_uid", "3004", "activity_id", "4", "entity.name", hostWeb, "severity_id", "3"}, 1},
		{"api route expiry", []string{"class_uid", "3004", "activity_id", "4", "entity.name", hostAPI}, 1},
		{"route installs", []string{"class_uid", "3004", "activity_id", "1"}, 2},
	} {
		if got := ocsfMatch(recs, c.kv...); len(got) != c.n {
			t.Errorf("%s: %d records with %v, want %d", c.what, len(got), c.kv, c.n)
		}
	}
	for _, r := range ocsfMatch(recs, "class_uid", "4002") {
		if v := ocsftest.Attr(r, "metadata.product.name"); fmt.Sprint(v) != "applistener" {
			t.Errorf("product %v: %s", v, r)
		}
	}
	noSecrets(t, recs)
	// The diagnostic log is at error: none of its info or warn lines.
	for line := range strings.Lines(p.output()) {
		if strings.Contains(line, `"level":"INFO"`) || strings.Contains(line, `"level":"WARN"`) {
			t.Errorf("a diagnostic line below --log-level error: %s", line)
		}
	}
}

// TestOCSFAllowedRequests: with --ocsf-level debug and --access-log=ocsf,
// every request (allowed ones too) has exactly one HTTP Activity record,
// over HTTP/1.1 and HTTP/2, and every accepted connection a Network
// Activity record; all validate, and none holds the query string, the
// cookie or the credentials the requests carried.
func TestOCSFAllowedRequests(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	p := startProc(t, routesDoc(service{Name: "web", Port: web.port, Revision: 1}),
		"--ocsf-json", "--ocsf-level", "debug", "--access-log", "ocsf", "--log-level", "error")
	h1, _ := p.client(t, hostWeb)
	for i, c := range []*http.Client{h1, p.h2Client(t, hostWeb)} {
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://%s/allowed-%d?token=secret", hostWeb, i), nil)
		req.Header.Set("Cookie", "session=cookievalue")
		req.Header.Set("Authorization", "Bearer authvalue")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || resp.ProtoMajor != i+1 {
			t.Fatalf("%s status %d", resp.Proto, resp.StatusCode)
		}
	}
	testutil.Eventually(t, waitTimeout, "the records of both requests", func() bool {
		return len(ocsfMatch(ocsftest.Records(p.output()), "class_uid", "4002", "http_response.code", "200")) >= 2
	})
	recs := p.ocsfRecords(t)
	for i, version := range []string{"1.1", "2"} {
		got := ocsfMatch(recs, "class_uid", "4002", "http_request.url.path", fmt.Sprintf("/allowed-%d", i))
		if len(got) != 1 {
			t.Errorf("HTTP/%s: %d records of the request, want 1", version, len(got))
			continue
		}
		for path, want := range map[string]string{"severity_id": "1", "status_id": "1", "http_request.version": version,
			"http_request.http_method": "GET", "src_endpoint.ip": "127.0.0.1", "unmapped.workspace": "team"} {
			if v := fmt.Sprint(ocsftest.Attr(got[0], path)); v != want {
				t.Errorf("HTTP/%s record: %s = %s, want %s", version, path, v, want)
			}
		}
	}
	if n := len(ocsfMatch(recs, "class_uid", "4001", "activity_id", "1")); n < 2 {
		t.Errorf("%d accepted-connection records, want at least 2", n)
	}
	noSecrets(t, recs)
}
