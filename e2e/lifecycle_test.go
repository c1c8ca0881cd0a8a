package e2e

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
)

// TestWithdrawal removes one service from the routes file: its streams close
// at once, the other service's streams keep working, and its SNI is refused.
func TestWithdrawal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.p

	wsWeb := p.wsDial(t, hostWeb)
	must(t, wsEcho(wsWeb, websocket.TextMessage, []byte("web before")))
	wsAPI := p.wsDial(t, hostAPI)
	must(t, wsEcho(wsAPI, websocket.TextMessage, []byte("api before")))
	ka := p.raw(t, hostWeb)
	if resp, body := ka.roundTrip(t, "GET /before HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n"); resp.StatusCode != http.StatusOK {
		t.Fatalf("keep-alive request: %d %q", resp.StatusCode, body)
	}
	if e.web.open.Load() == 0 {
		t.Fatal("precondition: the web app has no open connection")
	}

	start := time.Now()
	p.writeRoutes(t, e.doc(false, true))
	limit := start.Add(3 * time.Second)

	err := wsExpectClosed(t, wsWeb, until(limit))
	t.Logf("web WebSocket closed %v after the routes file was rewritten: %v", time.Since(start), err)
	expectCloseCode(t, "withdrawn web WebSocket", err, websocket.ClosePolicyViolation)
	ka.expectClosed(t, until(limit))
	testutil.Eventually(t, until(limit), "the web app's connections (pooled and WebSocket) to close", func() bool {
		return e.web.open.Load() == 0
	})

	// The other service of the same instance is untouched.
	must(t, wsEcho(wsAPI, websocket.TextMessage, []byte("api after")))
	must(t, wsEcho(wsAPI, websocket.BinaryMessage, []byte{1, 2, 3}))
	c, _ := p.client(t, hostAPI)
	if resp, body := get(t, c, "https://"+hostAPI+"/after-withdrawal"); resp.StatusCode != http.StatusOK {
		t.Fatalf("api after web was withdrawn: %d %q", resp.StatusCode, body)
	}

	p.handshakeRefused(t, tlsConfig(hostWeb))

	// Installing it again brings it back.
	p.writeRoutes(t, e.doc(true, true))
	testutil.Eventually(t, waitTimeout, "the web route to be installed again", func() bool {
		return p.handshakeErr(hostWeb) == nil
	})
	ws := p.wsDial(t, hostWeb)
	must(t, wsEcho(ws, websocket.TextMessage, []byte("web again")))
}

// TestStaleness deletes the routes file: the routes go stale on time, their
// streams close and readiness drops; restoring the file brings them back.
func TestStaleness(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.p

	ws := p.wsDial(t, hostWeb)
	must(t, wsEcho(ws, websocket.TextMessage, []byte("before")))
	ka := p.raw(t, hostAPI)
	if resp, body := ka.roundTrip(t, "GET /before HTTP/1.1\r\nHost: "+hostAPI+"\r\n\r\n"); resp.StatusCode != http.StatusOK {
		t.Fatalf("keep-alive request: %d %q", resp.StatusCode, body)
	}

	start := time.Now()
	if err := os.Remove(p.routesFile); err != nil {
		t.Fatal(err)
	}
	limit := start.Add(6 * time.Second)

	err := wsExpectClosed(t, ws, until(limit))
	elapsed := time.Since(start)
	t.Logf("WebSocket closed %v after the routes file was deleted: %v", elapsed, err)
	expectCloseCode(t, "stale web WebSocket", err, websocket.ClosePolicyViolation)
	// The file is renewed every freshness/3, so the routes had at least
	// ~1.3 s left: a missing file is not a renewal, and not a withdrawal.
	if elapsed < freshness/2 {
		t.Errorf("stream closed %v after the file was deleted; want the routes to keep their deadline (%v freshness)", elapsed, freshness)
	}
	ka.expectClosed(t, until(limit))
	for _, sni := range []string{hostWeb, hostAPI} {
		testutil.Eventually(t, until(limit), "new handshakes for "+sni+" to be refused", func() bool {
			err := p.handshakeErr(sni)
			return err != nil && strings.Contains(err.Error(), "unrecognized name")
		})
		p.handshakeRefused(t, tlsConfig(sni))
	}
	testutil.Eventually(t, until(limit), "/readyz to answer 503", func() bool {
		return p.readyz() == http.StatusServiceUnavailable
	})

	p.writeRoutes(t, e.doc(true, true))
	testutil.Eventually(t, waitTimeout, "/readyz to answer 200 again", func() bool {
		return p.readyz() == http.StatusOK
	})
	testutil.Eventually(t, waitTimeout, "the web route to come back", func() bool {
		return p.handshakeErr(hostWeb) == nil
	})
	c, _ := p.client(t, hostAPI)
	if resp, body := get(t, c, "https://"+hostAPI+"/after-restore"); resp.StatusCode != http.StatusOK || string(body) != "hello from api\n" {
		t.Fatalf("api after restore: %d %q", resp.StatusCode, body)
	}
	ws2 := p.wsDial(t, hostWeb)
	must(t, wsEcho(ws2, websocket.TextMessage, []byte("after restore")))
}
