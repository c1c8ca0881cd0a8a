package e2e

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestForwarding checks what reaches the app and what comes back: routing
// by SNI, the Host and forwarding headers the app sees, header sanitation,
// bodies in both directions, HEAD and connection reuse on both sides.
func TestForwarding(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.p

	t.Run("RoutesBySNI", func(t *testing.T) {
		for _, tc := range []struct {
			sni         string
			want, other *backend
		}{
			{hostWeb, e.web, e.api},
			{hostAPI, e.api, e.web},
		} {
			t.Run(tc.want.name, func(t *testing.T) {
				c, _ := p.client(t, tc.sni)
				uri := "/route-check/" + tc.want.name + "?q=1"
				resp, body := get(t, c, "https://"+tc.sni+uri)
				if resp.StatusCode != http.StatusOK || string(body) != "hello from "+tc.want.name+"\n" {
					t.Fatalf("got %d %q; want 200 %q", resp.StatusCode, body, "hello from "+tc.want.name+"\n")
				}
				if got := resp.Header.Get("X-Backend"); got != tc.want.name {
					t.Errorf("X-Backend = %q; want %q", got, tc.want.name)
				}
				rec := tc.want.last(t, uri)
				if rec.Host != tc.want.hostPort() {
					t.Errorf("app saw Host %q; want %q", rec.Host, tc.want.hostPort())
				}
				if rec.Method != http.MethodGet || rec.Proto != "HTTP/1.1" {
					t.Errorf("app saw %s %s; want GET HTTP/1.1", rec.Method, rec.Proto)
				}
				for _, r := range tc.other.requests() {
					if r.URI == uri {
						t.Errorf("backend %s also received %s", tc.other.name, uri)
					}
				}
			})
		}
	})

	t.Run("RequestHeaders", func(t *testing.T) {
		rc := p.raw(t, hostWeb)
		resp, body := rc.roundTrip(t, "GET /headers?a=b HTTP/1.1\r\n"+
			"Host: "+hostWeb+"\r\n"+
			"X-Forwarded-For: 6.6.6.6\r\n"+
			"X-Forwarded-Host: evil.example\r\n"+
			"X-Forwarded-Proto: http\r\n"+
			"Forwarded: for=6.6.6.6;host=evil.example;proto=http\r\n"+
			"X-Real-IP: 6.6.6.6\r\n"+
			"X-Forwarded-Client-Cert: Hash=deadbeef\r\n"+
			"X-SSL-Client-Cert: forged\r\n"+
			"X-Client-Cert: forged\r\n"+
			"X-Applistener-Foo: bar\r\n"+
			"X-AppListener-Route: team--other--web\r\n"+
			"Connection: Foo, X-Secret\r\n"+
			"Foo: bar\r\n"+
			"X-Secret: s3cret\r\n"+
			"Keep-Alive: timeout=5\r\n"+
			"TE: trailers\r\n"+
			"Upgrade: h2c\r\n"+
			"Proxy-Authorization: Basic Zm9vOmJhcg==\r\n"+
			"Proxy-Connection: keep-alive\r\n"+
			"Authorization: Bearer secret-token\r\n"+
			"Cookie: a=1; b=2\r\n"+
			"X-Custom: kept\r\n"+
			"\r\n")
		if resp.StatusCode != http.StatusOK || string(body) != "hello from web\n" {
			t.Fatalf("got %d %q; want 200 from web", resp.StatusCode, body)
		}
		rec := e.web.last(t, "/headers?a=b")
		h := rec.Header
		if rec.Host != e.web.hostPort() {
			t.Errorf("Host = %q; want %q", rec.Host, e.web.hostPort())
		}
		for name, want := range map[string]string{
			"X-Forwarded-For":   "127.0.0.1",
			"X-Forwarded-Proto": "https",
			"X-Forwarded-Host":  hostWeb,
			"Forwarded":         "for=127.0.0.1;host=" + hostWeb + ";proto=https",
			"Authorization":     "Bearer secret-token",
			"Cookie":            "a=1; b=2",
			"X-Custom":          "kept",
		} {
			if got := h.Values(name); len(got) != 1 || got[0] != want {
				t.Errorf("app saw %s: %q; want exactly [%q]", name, got, want)
			}
		}
		for _, name := range []string{
			"X-Real-Ip", "X-Forwarded-Client-Cert", "X-Ssl-Client-Cert", "X-Client-Cert",
			"X-Applistener-Foo", "X-Applistener-Route",
			"Foo", "X-Secret", "Keep-Alive", "Te", "Upgrade", "Proxy-Authorization", "Proxy-Connection",
		} {
			if got, ok := h[name]; ok {
				t.Errorf("app saw %s: %q; want it dropped", name, got)
			}
		}
		for _, v := range h.Values("Connection") {
			lv := strings.ToLower(v)
			if strings.Contains(lv, "foo") || strings.Contains(lv, "x-secret") || strings.Contains(lv, "upgrade") {
				t.Errorf("app saw Connection: %q; want the client's Connection tokens dropped", v)
			}
		}
	})

	t.Run("PreserveHost", func(t *testing.T) {
		t.Parallel()
		e2 := newEnv(t, "--app-preserve-host")
		c, _ := e2.p.client(t, hostWeb)
		resp, body := get(t, c, "https://"+hostWeb+"/preserve")
		if resp.StatusCode != http.StatusOK || string(body) != "hello from web\n" {
			t.Fatalf("got %d %q; want 200 from web", resp.StatusCode, body)
		}
		rec := e2.web.last(t, "/preserve")
		if rec.Host != hostWeb {
			t.Errorf("with --app-preserve-host the app saw Host %q; want %q", rec.Host, hostWeb)
		}
		if got := rec.Header.Get("X-Forwarded-Host"); got != hostWeb {
			t.Errorf("X-Forwarded-Host = %q; want %q", got, hostWeb)
		}
	})

	t.Run("RequestBody", func(t *testing.T) {
		data := bigBody(1 << 20)
		c, _ := p.client(t, hostWeb)
		for _, tc := range []struct {
			name    string
			body    io.Reader
			chunked bool
		}{
			{"ContentLength", bytes.NewReader(data), false},
			{"Chunked", struct{ io.Reader }{bytes.NewReader(data)}, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				uri := "/upload/" + tc.name
				req, err := http.NewRequest(http.MethodPost, "https://"+hostWeb+uri, tc.body)
				if err != nil {
					t.Fatal(err)
				}
				if tc.chunked {
					req.ContentLength = -1
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("POST: %v", err)
				}
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("POST %s: %d %q", uri, resp.StatusCode, body)
				}
				rec := e.web.last(t, uri)
				if rec.BodyErr != nil {
					t.Fatalf("app failed reading the body: %v", rec.BodyErr)
				}
				if !bytes.Equal(rec.Body, data) {
					t.Fatalf("app got %d body bytes (sha256 %x); want %d (sha256 %x)",
						len(rec.Body), sha256.Sum256(rec.Body), len(data), sha256.Sum256(data))
				}
			})
		}
	})

	t.Run("LargeResponse", func(t *testing.T) {
		c, _ := p.client(t, hostWeb)
		resp, body := get(t, c, "https://"+hostWeb+"/big")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if !bytes.Equal(body, bigResponse) {
			t.Fatalf("got %d bytes (sha256 %x); want %d (sha256 %x)",
				len(body), sha256.Sum256(body), len(bigResponse), sha256.Sum256(bigResponse))
		}
		// Sizes around the large-body path (64 KiB reads, TLS records
		// collected into one write) and the 16 KiB record boundary, one
		// after the other on the same kept-alive connections.
		for _, n := range []int{16<<10 - 1, 16 << 10, 16<<10 + 1, 17 << 10, 64<<10 - 1, 64 << 10, 64<<10 + 1, 100000, 1<<20 + 3, 5, 3<<20 - 7} {
			resp, body := get(t, c, fmt.Sprintf("https://%s/sized?n=%d", hostWeb, n))
			if resp.StatusCode != http.StatusOK || !bytes.Equal(body, bigResponse[:n]) {
				t.Fatalf("/sized?n=%d: status %d, %d bytes (sha256 %x); want %d bytes (sha256 %x)",
					n, resp.StatusCode, len(body), sha256.Sum256(body), n, sha256.Sum256(bigResponse[:n]))
			}
		}
	})

	t.Run("Head", func(t *testing.T) {
		rc := p.raw(t, hostWeb)
		for _, uri := range []string{"/head", "/big"} {
			resp, body := rc.roundTrip(t, "HEAD "+uri+" HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n")
			if resp.StatusCode != http.StatusOK || len(body) != 0 {
				t.Fatalf("HEAD %s: %d with %d body bytes; want 200 and no body", uri, resp.StatusCode, len(body))
			}
			if rec := e.web.last(t, uri); rec.Method != http.MethodHead {
				t.Errorf("app saw %s %s; want HEAD", rec.Method, uri)
			}
			if uri == "/big" && resp.ContentLength != int64(len(bigResponse)) {
				t.Errorf("HEAD /big: Content-Length %d; want %d", resp.ContentLength, len(bigResponse))
			}
			// The connection must still be in sync: the HEAD response had no body.
			resp, body = rc.roundTrip(t, "GET /after-head HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n")
			if resp.StatusCode != http.StatusOK || string(body) != "hello from web\n" {
				t.Fatalf("GET after HEAD %s: %d %q", uri, resp.StatusCode, body)
			}
		}
	})

	t.Run("ResponseHopByHop", func(t *testing.T) {
		rc := p.raw(t, hostWeb)
		resp, _ := rc.roundTrip(t, "GET /hop HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		for _, name := range []string{"X-Hop", "Proxy-Authenticate", "Keep-Alive"} {
			if got, ok := resp.Header[name]; ok {
				t.Errorf("client saw response header %s: %q; want it dropped", name, got)
			}
		}
		if got := resp.Header.Get("X-Backend"); got != "web" {
			t.Errorf("X-Backend = %q; want web", got)
		}
	})

	t.Run("KeepAlive", func(t *testing.T) {
		c, dials := p.client(t, hostWeb)
		hs0 := p.metric(t, "applistener_tls_handshakes_total")
		acc0 := e.web.accepted.Load()
		for i := range 50 {
			uri := fmt.Sprintf("/keepalive/%d", i)
			resp, body := get(t, c, "https://"+hostWeb+uri)
			if resp.StatusCode != http.StatusOK || string(body) != "hello from web\n" {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
			}
		}
		if n := dials.Load(); n != 1 {
			t.Errorf("50 sequential requests used %d client connections; want 1", n)
		}
		if d := p.metric(t, "applistener_tls_handshakes_total") - hs0; d != 1 {
			t.Errorf("applistener_tls_handshakes_total grew by %v over 50 keep-alive requests; want 1", d)
		}
		if d := e.web.accepted.Load() - acc0; d >= 5 {
			t.Errorf("the app accepted %d new connections for 50 sequential requests; want < 5 (backend reuse)", d)
		}
	})
}
