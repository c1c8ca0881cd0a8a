package dispatch

import (
	"crypto/tls"
	"fmt"
	"io"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/routes"
)

// h2RawConn opens an HTTP/2 connection with SNI host and sends the client
// preface and SETTINGS; frames are then read with the returned Framer.
func h2RawConn(t *testing.T, e *h2Env, host string) (*tls.Conn, *http2.Framer) {
	t.Helper()
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tc.Close() })
	if _, err := io.WriteString(tc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(tc, tc)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return tc, fr
}

// TestH2InstanceIdleTimeout: an HTTP/2 connection to an instance with
// limits.idle_timeout_seconds gets GOAWAY and is closed after that idle
// time, while a connection to another instance (server default, 120 s)
// stays open and answers PING.
func TestH2InstanceIdleTimeout(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"idle","instances":[
		{"workspace":"team","sandbox":"demo","generation":"1","limits":{"idle_timeout_seconds":1},"services":[{"name":"web","port":%d}]},
		{"workspace":"team","sandbox":"other","generation":"1","services":[{"name":"web","port":%d}]}]}`, e.web.port(), e.api.port()))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	e.table.Apply(doc)

	otherConn, otherFr := h2RawConn(t, e, "team--other--web."+h2Domain)
	// start comes before the idle connection's dial, so that elapsed is at
	// least its idle time however long the handshake takes on a loaded
	// machine: the server cannot start the idle clock before it accepts.
	start := time.Now()
	idleConn, idleFr := h2RawConn(t, e, "team--demo--web."+h2Domain)
	_ = idleConn.SetReadDeadline(time.Now().Add(10 * time.Second))
	goAway := false
	for {
		f, err := idleFr.ReadFrame()
		if err != nil {
			break // closed by the server
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			_ = idleFr.WriteSettingsAck()
		}
		if _, ok := f.(*http2.GoAwayFrame); ok {
			goAway = true
		}
	}
	elapsed := time.Since(start)
	if !goAway {
		t.Error("no GOAWAY before the idle close")
	}
	if elapsed < time.Second || elapsed > 8*time.Second {
		t.Errorf("idle connection closed after %v; want about 1 s (the instance's idle_timeout_seconds)", elapsed)
	}

	// The other instance's connection is still served.
	if err := otherFr.WritePing(false, [8]byte{1, 2, 3}); err != nil {
		t.Fatalf("other connection: %v", err)
	}
	_ = otherConn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := otherFr.ReadFrame()
		if err != nil {
			t.Fatalf("other instance's connection ended: %v", err)
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
			break
		}
		if _, ok := f.(*http2.GoAwayFrame); ok {
			t.Fatal("other instance's connection got GOAWAY")
		}
	}
}
