package dispatch

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/ocsf/ocsftest"
	"github.com/applistener/applistener/internal/testutil"
)

// TestUnitRequestIDGenerated: generated ids are 32 lowercase hex digits
// (a W3C trace-id's shape), valid as a trusted peer's would be, and
// distinct; generating one allocates nothing.
func TestUnitRequestIDGenerated(t *testing.T) {
	seen := map[string]bool{}
	var id requestID
	for range 10000 {
		id.generate()
		s := string(id.bytes())
		if len(s) != generatedIDLen || strings.Trim(s, "0123456789abcdef") != "" || !validRequestID(s) {
			t.Fatalf("generated id %q", s)
		}
		if seen[s] {
			t.Fatalf("id %q generated twice", s)
		}
		seen[s] = true
	}
	if n := testing.AllocsPerRun(100, id.generate); n != 0 {
		t.Errorf("generate: %v allocations, want 0", n)
	}
}

// TestUnitValidRequestID: a trusted peer's id is kept only when it is 1 to
// 128 bytes of the safe charset.
func TestUnitValidRequestID(t *testing.T) {
	for _, c := range []struct {
		id   string
		want bool
	}{
		{"0af7651916cd43dd8448eb211c80319c", true},
		{"f47ac10b-58cc-4372-a567-0e02b2c3d479", true},
		{"01ARZ3NDEKTSV4RRFFQ69G5FAV", true},
		{"Root=1-67891233-abcdef012345678912345678", true},
		{"YWJj+/ZA==", true},
		{"a_b.c:d@e", true},
		{strings.Repeat("a", maxRequestIDLen), true},
		{"", false},
		{strings.Repeat("a", maxRequestIDLen+1), false},
		{"has space", false},
		{"quote\"", false},
		{"semi;colon", false},
		{"comma,list", false},
		{"back\\slash", false},
		{"ctl\x01", false},
		{"utf8-é", false},
		{"new\r\nline", false},
	} {
		if got := validRequestID(c.id); got != c.want {
			t.Errorf("validRequestID(%q) = %v, want %v", c.id, got, c.want)
		}
		if got := validRequestID([]byte(c.id)); got != c.want {
			t.Errorf("validRequestID([]byte %q) = %v, want %v", c.id, got, c.want)
		}
	}
}

// TestUnitPublicPortOf: the port the client's Host names, 443 without one
// or with a malformed one.
func TestUnitPublicPortOf(t *testing.T) {
	for host, want := range map[string]int{
		"a.test": 443, "a.test:8443": 8443, "a.test:443": 443, "a.test:80": 80, "a.test:": 443,
		"a.test:0": 443, "a.test:65536": 443, "a.test:x1": 443, "a.test:123456": 443,
		"[2001:db8::1]": 443, "[2001:db8::1]:9443": 9443, "": 443,
	} {
		if got := publicPortOf(host); got != want {
			t.Errorf("publicPortOf(%q) = %d, want %d", host, got, want)
		}
		if got := publicPortOf([]byte(host)); got != want {
			t.Errorf("publicPortOf([]byte %q) = %d, want %d", host, got, want)
		}
	}
}

// TestUnitAppendRequestHeadPublicPort: the public port in X-Forwarded-Host
// and Forwarded host= (quoted: host:port is no token) unless it is 443,
// and X-Forwarded-Port always; a trusted peer's X-Forwarded-Port passes
// and names the port, its X-Forwarded-Host passes without a port of the
// listener's; an untrusted client's are dropped.
func TestUnitAppendRequestHeadPublicPort(t *testing.T) {
	const id = "0af7651916cd43dd8448eb211c80319c"
	for _, c := range []struct {
		name    string
		host    string
		trusted bool
		extra   []string
		xfh     []string
		xfp     []string
		fwd     string
	}{
		{"no port", testHost, false, nil, []string{testHost}, []string{"443"}, "for=203.0.113.7;host=" + testHost + ";proto=https"},
		{"443 named", testHost + ":443", false, nil, []string{testHost}, []string{"443"}, "for=203.0.113.7;host=" + testHost + ";proto=https"},
		{"8443", testHost + ":8443", false, nil, []string{testHost + ":8443"}, []string{"8443"},
			`for=203.0.113.7;host="` + testHost + `:8443";proto=https`},
		{"untrusted claims dropped", testHost + ":8443", false, []string{"X-Forwarded-Port: 1", "X-Forwarded-Host: evil.test"},
			[]string{testHost + ":8443"}, []string{"8443"}, `for=203.0.113.7;host="` + testHost + `:8443";proto=https`},
		{"trusted port", testHost, true, []string{"X-Forwarded-Port: 9443"}, []string{testHost + ":9443"}, []string{"9443"},
			`for=203.0.113.7;host="` + testHost + `:9443";proto=https`},
		{"trusted port 443", testHost + ":8443", true, []string{"X-Forwarded-Port: 443"}, []string{testHost}, []string{"443"},
			"for=203.0.113.7;host=" + testHost + ";proto=https"},
		{"trusted host and port", testHost, true, []string{"X-Forwarded-Host: front.test:8080", "X-Forwarded-Port: 8080"},
			[]string{"front.test:8080"}, []string{"8080"}, `for=203.0.113.7;host="` + testHost + `:8080";proto=https`},
		{"trusted host only", testHost + ":8443", true, []string{"X-Forwarded-Host: front.test"}, []string{"front.test"}, nil,
			`for=203.0.113.7;host="` + testHost + `:8443";proto=https`},
		{"trusted port not a number", testHost + ":8443", true, []string{"X-Forwarded-Port: 80, 443"}, []string{testHost + ":8443"},
			[]string{"80, 443"}, `for=203.0.113.7;host="` + testHost + `:8443";proto=https`},
	} {
		t.Run(c.name, func(t *testing.T) {
			lines := append([]string{"GET / HTTP/1.1", "Host: " + c.host, "X-Request-Id: client-claim"}, c.extra...)
			h := head(lines...)
			r := new(request)
			if err := parseRequestHead(r, h, 100); err != nil {
				t.Fatal(err)
			}
			fi := &forwardInfo{client: netip.MustParseAddr("203.0.113.7"), trusted: c.trusted, publicHost: testHost,
				backendHost: "127.0.0.1:8080", publicPort: publicPortOf(r.host), requestID: []byte(id)}
			_, fields, hr, _ := forward(t, h, fi)
			if got := values(fields, "X-Forwarded-Host"); strings.Join(got, "|") != strings.Join(c.xfh, "|") {
				t.Errorf("X-Forwarded-Host %q, want %q", got, c.xfh)
			}
			if got := values(fields, "X-Forwarded-Port"); strings.Join(got, "|") != strings.Join(c.xfp, "|") {
				t.Errorf("X-Forwarded-Port %q, want %q", got, c.xfp)
			}
			if got := hr.Header.Get("Forwarded"); got != c.fwd {
				t.Errorf("Forwarded %q, want %q", got, c.fwd)
			}
			if got := values(fields, "X-Request-Id"); len(got) != 1 || got[0] != id {
				t.Errorf("X-Request-Id %q, want only %q", got, id)
			}
		})
	}
}

// TestUnitRequestIDAliasDropped: X_Request_Id, which CGI servers read as
// X-Request-Id, never passes, even where underscores are allowed.
func TestUnitRequestIDAliasDropped(t *testing.T) {
	fi := &forwardInfo{client: netip.MustParseAddr("203.0.113.7"), trusted: true, publicHost: testHost,
		backendHost: "127.0.0.1:8080", allowUnderscore: true, publicPort: 443, requestID: []byte("abc")}
	_, fields, _, _ := forward(t, get("X_Request_Id: smuggled", "x-request-id: client"), fi)
	for _, f := range fields {
		if strings.EqualFold(strings.ReplaceAll(f[0], "_", "-"), "x-request-id") && f[1] != "abc" {
			t.Errorf("forwarded %s: %s", f[0], f[1])
		}
	}
}

// idApp is a real HTTP/1.1 app that answers with the forwarding fields
// and X-Request-Id it received, as JSON, and an X-Request-Id of its own
// (which the listener replaces).
func idApp(t *testing.T) *httptest.Server {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := map[string][]string{}
		for _, k := range []string{"X-Request-Id", "X-Forwarded-Host", "X-Forwarded-Port", "X-Forwarded-Proto", "Forwarded", "User-Agent"} {
			out[k] = r.Header.Values(k)
		}
		w.Header().Set("X-Request-Id", "app-own-id")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(ts.Close)
	return ts
}

// idExchange is one request of TestRequestID: what the app saw, what the
// client got back.
type idExchange struct {
	status int
	header http.Header
	seen   map[string][]string
}

// idDo sends GET path with Host host (the SNI is rawHost, or the host's
// name) over proto, with the extra fields.
func idDo(t *testing.T, e *h2Env, proto, sni, host, path string, extra map[string][]string) idExchange {
	t.Helper()
	var x idExchange
	var body string
	switch proto {
	case "h1":
		var b strings.Builder
		fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: %s\r\n", path, host)
		for k, vs := range extra {
			for _, v := range vs {
				fmt.Fprintf(&b, "%s: %s\r\n", k, v)
			}
		}
		b.WriteString("\r\n")
		x.status, x.header, body = e.h1(sni).do(t, b.String())
	case "h2":
		cc := e.dial(sni)
		req := h2Req(t, "GET", host, path, nil)
		for k, vs := range extra {
			req.Header[k] = vs
		}
		res := h2Do(cc, req)
		if res.err != nil {
			t.Fatalf("GET %s: %v", path, res.err)
		}
		x.status, x.header, body = res.status, res.header, res.body
	}
	if x.status == 200 {
		if err := json.Unmarshal([]byte(body), &x.seen); err != nil {
			t.Fatalf("app answer %q: %v", body, err)
		}
	}
	return x
}

// TestRequestID: over HTTP/1.1 and HTTP/2, every request gets an id: sent
// to the app as X-Request-Id in place of the client's, returned to the
// client in place of the app's, also on the listener's own answers (502,
// 421), and carried by the access-log record (JSON and OCSF) with the user
// agent and the referer without its query. A trusted peer's valid id is
// kept; an invalid, oversized or repeated one is replaced. The public port
// the client named is in X-Forwarded-Host/-Port and Forwarded.
func TestRequestID(t *testing.T) {
	h2Verify(t)
	app := idApp(t)
	for _, proto := range []string{"h1", "h2"} {
		for _, trusted := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/trusted=%v", proto, trusted), func(t *testing.T) {
				out, ocsfOut, diag := &lineLog{}, &lineLog{}, &lineLog{}
				cfg := Config{AccessLog: AccessLogJSON, AccessLogWriter: out, AppStartGrace: -1, Logger: slog.New(slog.NewJSONHandler(diag, nil)),
					Registerer: prometheus.NewRegistry(), OCSF: ocsf.NewEmitter(ocsfOut, slog.LevelDebug, ocsf.Product{})}
				if trusted {
					cfg.TrustedProxies = h2Prefixes(t, "127.0.0.0/8")
				}
				e := newH2Env(t, 0, cfg)
				e.rawPort = app.Listener.Addr().(*net.TCPAddr).Port
				e.apply(0, true)

				// A client's own id is never kept from an untrusted peer.
				x := idDo(t, e, proto, rawHost, rawHost+":8443", "/page?token=secret", map[string][]string{
					"X-Request-Id": {"client-chosen-id"}, "User-Agent": {"idtest/1.0 (probe)"},
					"Referer": {"https://" + rawHost + ":8443/from?token=secret#frag"}})
				if x.status != 200 {
					t.Fatalf("status %d", x.status)
				}
				seenID := x.seen["X-Request-Id"]
				if trusted {
					if len(seenID) != 1 || seenID[0] != "client-chosen-id" {
						t.Fatalf("app saw X-Request-Id %q, want the trusted peer's", seenID)
					}
				} else if len(seenID) != 1 || len(seenID[0]) != generatedIDLen || !validRequestID(seenID[0]) {
					t.Fatalf("app saw X-Request-Id %q, want one generated id", seenID)
				}
				id := seenID[0]
				if got := x.header.Values("X-Request-Id"); len(got) != 1 || got[0] != id {
					t.Errorf("client got X-Request-Id %q, want %q (not the app's own)", got, id)
				}
				for k, want := range map[string]string{"X-Forwarded-Host": rawHost + ":8443", "X-Forwarded-Port": "8443",
					"Forwarded": `for=127.0.0.1;host="` + rawHost + `:8443";proto=https`, "User-Agent": "idtest/1.0 (probe)"} {
					if got := x.seen[k]; len(got) != 1 || got[0] != want {
						t.Errorf("app saw %s %q, want %q", k, got, want)
					}
				}
				rec := out.waitRecord(t, "request_id", id)
				checkRecord(t, rec, map[string]any{"path": "/page", "status": 200.0, "protocol": proto,
					"user_agent": "idtest/1.0 (probe)", "referer": "https://" + rawHost + ":8443/from"}, true)
				// OCSF: http_request.uid, user_agent and referrer (no query).
				var evs [][]byte
				testutil.Eventually(t, 5*time.Second, "the OCSF record of the request", func() bool {
					evs = ocsfWith(ocsfOut.ocsfLines(), "http_request.uid", id)
					return len(evs) == 1
				})
				checkOCSF(t, evs)
				for path, want := range map[string]string{"http_request.user_agent": "idtest/1.0 (probe)",
					"http_request.referrer": "https://" + rawHost + ":8443/from", "http_request.url.path": "/page"} {
					if v := jsonString(ocsftest.Attr(evs[0], path)); v != want {
						t.Errorf("OCSF %s = %q, want %q", path, v, want)
					}
				}

				// Without a port: 443 implicit in the host, explicit in
				// X-Forwarded-Port.
				x = idDo(t, e, proto, rawHost, rawHost, "/", nil)
				for k, want := range map[string]string{"X-Forwarded-Host": rawHost, "X-Forwarded-Port": "443",
					"Forwarded": "for=127.0.0.1;host=" + rawHost + ";proto=https"} {
					if got := x.seen[k]; len(got) != 1 || got[0] != want {
						t.Errorf("no port: app saw %s %q, want %q", k, got, want)
					}
				}
				if len(x.seen["X-Request-Id"]) != 1 || x.seen["X-Request-Id"][0] == id {
					t.Errorf("second request's id %q: want a new one", x.seen["X-Request-Id"])
				}

				// Invalid, oversized and repeated ids are replaced, from any peer.
				for _, bad := range [][]string{{"has space"}, {strings.Repeat("x", maxRequestIDLen+1)}, {"one", "two"}, {"semi;colon"}} {
					x = idDo(t, e, proto, rawHost, rawHost, "/", map[string][]string{"X-Request-Id": bad})
					got := x.seen["X-Request-Id"]
					if len(got) != 1 || len(got[0]) != generatedIDLen || strings.Contains(strings.Join(bad, ","), got[0]) {
						t.Errorf("client id %q: app saw %q, want one generated id", bad, got)
					}
				}

				// The listener's own answers carry the id, and so does their record.
				for _, c := range []struct {
					sni, host string
					status    int
				}{{h2Down, h2Down, 502}, {rawHost, h2APIHost, 421}} {
					pid := fmt.Sprintf("proxy-id-%d", c.status)
					x = idDo(t, e, proto, c.sni, c.host, "/err", map[string][]string{"X-Request-Id": {pid}})
					if x.status != c.status {
						t.Fatalf("status %d, want %d", x.status, c.status)
					}
					got := x.header.Values("X-Request-Id")
					if len(got) != 1 || (trusted && got[0] != pid) || (!trusted && len(got[0]) != generatedIDLen) {
						t.Fatalf("%d answer's X-Request-Id %q", c.status, got)
					}
					rec := out.waitRecord(t, "request_id", got[0])
					if rec["status"] != float64(c.status) {
						t.Errorf("record %v, want status %d", rec, c.status)
					}
					// The diagnostic "request denied" line names it too.
					testutil.Eventually(t, 5*time.Second, "the denial's diagnostic line with its id", func() bool {
						for _, line := range strings.Split(diag.text(), "\n") {
							if strings.Contains(line, `"msg":"request denied"`) && strings.Contains(line, `"request_id":"`+got[0]+`"`) {
								return true
							}
						}
						return false
					})
				}
			})
		}
	}
}

// TestRequestIDWebSocket: a WebSocket's upgrade (HTTP/1.1) or extended
// CONNECT (HTTP/2) carries the request's id to the app and back to the
// client, the public port in the forwarding fields, and the WebSocket's
// access-log record has the same id and the user agent.
func TestRequestIDWebSocket(t *testing.T) {
	h2Verify(t)
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			out := &lineLog{}
			e := newH2Env(t, 0, Config{AccessLog: AccessLogJSON, AccessLogWriter: out, Registerer: prometheus.NewRegistry()})
			app := newH2WSApp(t)
			e.installWS(app, true, "")
			hdr := http.Header{"X-Request-Id": {"client-claim"}, "User-Agent": {"wstest/2"}}
			var respID []string
			switch proto {
			case "h1":
				dialer := websocket.Dialer{
					TLSClientConfig:  &tls.Config{ServerName: h2wsHost, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}},
					HandshakeTimeout: 5 * time.Second,
					NetDial:          func(string, string) (net.Conn, error) { return net.Dial("tcp", e.ln.Addr().String()) },
				}
				c, resp, err := dialer.Dial("wss://"+h2wsHost+":8443/echo", hdr)
				if err != nil {
					t.Fatalf("dial: %v (%v)", err, resp)
				}
				_ = resp.Body.Close()
				respID = resp.Header.Values("X-Request-Id")
				_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				for {
					if _, _, err := c.ReadMessage(); err != nil {
						break
					}
				}
				_ = c.Close()
			case "h2":
				c, err := openWS(t, e.dialH2(h2wsHost), "/echo", hdr)
				if err != nil {
					t.Fatal(err)
				}
				respID = c.resp.Header.Values("X-Request-Id")
				c.send(t, websocket.CloseMessage, []byte{0x03, 0xe8})
				c.expectClose(t, 1000)
			}
			var upgrade *http.Request
			select {
			case upgrade = <-app.upgrades:
			case <-time.After(5 * time.Second):
				t.Fatal("the app saw no upgrade")
			}
			seen := upgrade.Header.Values("X-Request-Id")
			if len(seen) != 1 || len(seen[0]) != generatedIDLen {
				t.Fatalf("app saw X-Request-Id %q, want one generated id", seen)
			}
			if len(respID) != 1 || respID[0] != seen[0] {
				t.Errorf("client got X-Request-Id %q, want %q", respID, seen[0])
			}
			wantHost, wantPort := h2wsHost, "443"
			if proto == "h1" {
				wantHost, wantPort = h2wsHost+":8443", "8443"
			}
			if upgrade.Header.Get("X-Forwarded-Host") != wantHost || upgrade.Header.Get("X-Forwarded-Port") != wantPort {
				t.Errorf("app saw X-Forwarded-Host %q, -Port %q; want %q, %q", upgrade.Header.Get("X-Forwarded-Host"),
					upgrade.Header.Get("X-Forwarded-Port"), wantHost, wantPort)
			}
			rec := out.waitRecord(t, "protocol", "ws")
			if rec["request_id"] != seen[0] || rec["user_agent"] != "wstest/2" {
				t.Errorf("WebSocket record %v: want request_id %s, user_agent wstest/2", rec, seen[0])
			}
		})
	}
}

// BenchmarkRequestIDGenerate is the cost of a request's id.
//
//	go test -run '^$' -bench RequestIDGenerate -benchmem ./dispatch/
func BenchmarkRequestIDGenerate(b *testing.B) {
	var id requestID
	b.ReportAllocs()
	for b.Loop() {
		id.generate()
	}
}
