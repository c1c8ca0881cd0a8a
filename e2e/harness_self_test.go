package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestHarnessBackend checks the fixtures themselves, talking to a backend
// directly: the hop-by-hop response headers and the h2c upgrade the other
// tests expect the listener to remove really are sent by the app, and the
// app really records hop-by-hop request headers, so those tests can fail.
func TestHarnessBackend(t *testing.T) {
	t.Parallel()
	b := newBackend(t, "self")
	roundTrip := func(t *testing.T, req string) *http.Response {
		t.Helper()
		c, err := net.DialTimeout("tcp", b.hostPort(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(time.Now().Add(waitTimeout))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, _, err := readResponse(bufio.NewReader(c), http.MethodGet)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	t.Run("HopByHopResponseHeaders", func(t *testing.T) {
		resp := roundTrip(t, "GET /hop HTTP/1.1\r\nHost: x\r\n\r\n")
		for _, name := range []string{"X-Hop", "Proxy-Authenticate", "Keep-Alive"} {
			if resp.Header.Get(name) == "" {
				t.Errorf("the app did not send %s", name)
			}
		}
	})
	t.Run("H2CUpgrade", func(t *testing.T) {
		resp := roundTrip(t, "GET /h2c HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n")
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Errorf("the app answered an h2c upgrade with %d; want 101", resp.StatusCode)
		}
	})
	t.Run("RecordsHopByHopRequestHeaders", func(t *testing.T) {
		resp := roundTrip(t, "GET /rec HTTP/1.1\r\nHost: x\r\nConnection: Foo\r\nFoo: bar\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic eA==\r\n\r\n")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		h := b.last(t, "/rec").Header
		for _, name := range []string{"Connection", "Foo", "Keep-Alive", "Te", "Proxy-Authorization"} {
			if h.Get(name) == "" {
				t.Errorf("the app did not record %s", name)
			}
		}
	})
}
