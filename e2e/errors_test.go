package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

const hostDead = "team--demo--dead.apps.test"

// TestErrors checks the listener's own answers: connector failures,
// oversized and malformed requests, refused methods, plain HTTP on the TLS
// port, and an h2c upgrade that must not become a tunnel.
func TestErrors(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	dead := deadPort(t)
	p := startProc(t, routesDoc(
		service{Name: "web", Port: web.port, Revision: 1},
		service{Name: "dead", Port: dead, Revision: 1},
	), "--app-start-grace", "200ms")

	// Nothing listens on the dead service's port: after the start grace,
	// 502 saying so, as a page for browsers and as JSON for the rest.
	t.Run("AppDown", func(t *testing.T) {
		for _, tc := range []struct {
			name, header, ctype string
		}{
			{"NoAccept", "", "application/json"},
			{"Curl", "Accept: */*\r\n", "application/json"},
			{"Browser", "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n", "text/html"},
			{"Navigation", "Sec-Fetch-Mode: navigate\r\nAccept: */*\r\n", "text/html"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				rc := p.raw(t, hostDead)
				resp, body := rc.roundTrip(t, "GET /down HTTP/1.1\r\nHost: "+hostDead+"\r\n"+tc.header+"\r\n")
				if resp.StatusCode != http.StatusBadGateway {
					t.Fatalf("app down: %d %q; want 502", resp.StatusCode, body)
				}
				if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, tc.ctype) {
					t.Errorf("Content-Type %q; want %s", ct, tc.ctype)
				}
				if ra := resp.Header.Get("Retry-After"); ra == "" {
					t.Error("no Retry-After")
				}
				s := string(body)
				if tc.ctype == "application/json" {
					if want := `{"error":"app_not_listening","port":` + strconv.Itoa(dead) + "}\n"; s != want {
						t.Errorf("body %q; want %q", s, want)
					}
				} else if !strings.Contains(strings.ToLower(s), "<html") || !strings.Contains(s, "port "+strconv.Itoa(dead)) {
					t.Errorf("body %q; want a small HTML page naming the port", s)
				}
				if strings.Contains(s, "127.0.0.1") {
					t.Errorf("error body %q leaks the app's address", s)
				}
			})
		}
	})

	big := strings.Repeat("a", 20<<10)
	for _, tc := range []struct {
		name   string
		req    string
		status int
		closes bool   // the listener must close the connection after answering
		uri    string // must not reach the app (empty: not checked)
	}{
		{"OversizedHeader", "GET /oversized HTTP/1.1\r\nHost: " + hostWeb + "\r\nX-Big: " + big + "\r\n\r\n",
			http.StatusRequestHeaderFieldsTooLarge, false, "/oversized"},
		{"ContentLengthAndChunked", "POST /smuggle HTTP/1.1\r\nHost: " + hostWeb + "\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
			http.StatusBadRequest, true, "/smuggle"},
		{"TwoContentLengths", "POST /two-cl HTTP/1.1\r\nHost: " + hostWeb + "\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
			http.StatusBadRequest, true, "/two-cl"},
		{"ChunkedNotLast", "POST /te-gzip HTTP/1.1\r\nHost: " + hostWeb + "\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
			http.StatusBadRequest, true, "/te-gzip"},
		{"Connect", "CONNECT " + hostWeb + ":443 HTTP/1.1\r\nHost: " + hostWeb + ":443\r\n\r\n",
			http.StatusMethodNotAllowed, false, ""},
		{"Trace", "TRACE /trace HTTP/1.1\r\nHost: " + hostWeb + "\r\n\r\n",
			http.StatusMethodNotAllowed, false, "/trace"},
		{"ObsFold", "GET /fold HTTP/1.1\r\nHost: " + hostWeb + "\r\nX-Folded: a\r\n  b\r\n\r\n",
			http.StatusBadRequest, true, "/fold"},
		{"TwoHosts", "GET /two-hosts HTTP/1.1\r\nHost: " + hostWeb + "\r\nHost: " + hostWeb + "\r\n\r\n",
			http.StatusBadRequest, true, "/two-hosts"},
		{"NoHost", "GET /no-host HTTP/1.1\r\n\r\n",
			http.StatusBadRequest, true, "/no-host"},
		{"SpaceInHeaderName", "GET /space HTTP/1.1\r\nHost: " + hostWeb + "\r\nBad Header: x\r\n\r\n",
			http.StatusBadRequest, true, "/space"},
		{"NULInHeaderValue", "GET /nul HTTP/1.1\r\nHost: " + hostWeb + "\r\nX-Nul: a\x00b\r\n\r\n",
			http.StatusBadRequest, true, "/nul"},
		{"BadChunkSize", "POST /bad-chunk HTTP/1.1\r\nHost: " + hostWeb + "\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
			http.StatusBadRequest, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := p.raw(t, hostWeb)
			method := strings.SplitN(tc.req, " ", 2)[0]
			resp, body, err := rc.tryRoundTrip(tc.req)
			if err != nil {
				t.Fatalf("%s: %v; want %d", firstLine(tc.req), err, tc.status)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("%s: got %d %q; want %d", firstLine(tc.req), resp.StatusCode, body, tc.status)
			}
			if line := strings.TrimSuffix(string(body), "\n"); line == "" || strings.Contains(line, "\n") {
				t.Errorf("%d body %q; want one line naming the reason", tc.status, body)
			}
			if tc.closes {
				rc.expectClosed(t, waitTimeout)
			}
			if tc.uri != "" {
				for _, r := range web.requests() {
					if strings.HasPrefix(r.URI, tc.uri) || (method == http.MethodConnect && r.Method == method) {
						t.Errorf("the app received %s %s", r.Method, r.URI)
					}
				}
			}
		})
	}

	t.Run("ResponseHeaderTimeout", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, "--app-response-header-timeout", "300ms")
		rc := e.p.raw(t, hostWeb)
		resp, body := rc.roundTrip(t, "GET /slow?ms=5000 HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n")
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("app slower than --app-response-header-timeout: %d %q; want 504", resp.StatusCode, body)
		}
		if line := strings.TrimSuffix(string(body), "\n"); line == "" || strings.Contains(line, "\n") {
			t.Errorf("504 body %q; want one line naming the reason", body)
		}
	})

	t.Run("PlainHTTPOnTLSPort", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", p.appAddr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(deadline())
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, body, err := readResponse(bufio.NewReader(c), http.MethodGet)
		if err != nil {
			t.Fatalf("plain HTTP to the TLS port: %v; want a 400 answer", err)
		}
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the TLS port: %d %q; want 400", resp.StatusCode, body)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("Content-Type %q; want text/plain", ct)
		}
		if len(strings.TrimSpace(string(body))) == 0 {
			t.Errorf("empty body; want a text explanation")
		}
	})

	t.Run("H2CUpgradeNotTunnelled", func(t *testing.T) {
		rc := p.raw(t, hostWeb)
		resp, body := rc.roundTrip(t, "GET /h2c HTTP/1.1\r\nHost: "+hostWeb+"\r\n"+
			"Connection: Upgrade, HTTP2-Settings\r\n"+
			"Upgrade: h2c\r\n"+
			"HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n")
		if resp.StatusCode == http.StatusSwitchingProtocols {
			t.Fatalf("h2c upgrade was tunnelled to the app (101)")
		}
		if resp.StatusCode != http.StatusOK || string(body) != "hello from web\n" {
			t.Fatalf("h2c upgrade attempt: %d %q; want it forwarded as a plain request (200 from web)", resp.StatusCode, body)
		}
		rec := web.last(t, "/h2c")
		for _, name := range []string{"Upgrade", "Http2-Settings"} {
			if got, ok := rec.Header[name]; ok {
				t.Errorf("the app saw %s: %q", name, got)
			}
		}
		resp, body = rc.roundTrip(t, "GET /after-h2c HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n")
		if resp.StatusCode != http.StatusOK || string(body) != "hello from web\n" {
			t.Fatalf("request after the h2c attempt: %d %q", resp.StatusCode, body)
		}
	})
}
