package dispatch

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/connector"
	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// appConnTracker is a connector whose app connections panic, while armed,
// in the first call a request makes on them once they are the request's
// (SetWriteDeadline, right after the stream or connection took them): a
// panic while a request holds an app connection and an instance slot. It
// counts the connections it opened that are not closed yet.
type appConnTracker struct {
	inner connector.Connector
	armed *atomic.Bool
	open  *atomic.Int64
}

func (c appConnTracker) Dial(ctx context.Context, port int) (net.Conn, error) {
	conn, err := c.inner.Dial(ctx, port)
	if err != nil {
		return nil, err
	}
	c.open.Add(1)
	return &trackedAppConn{Conn: conn, t: c}, nil
}

func (c appConnTracker) String() string { return "tracked " + c.inner.String() }

type trackedAppConn struct {
	net.Conn
	t    appConnTracker
	once sync.Once
}

func (c *trackedAppConn) SetWriteDeadline(d time.Time) error {
	if c.t.armed.Load() {
		panic("injected panic while holding an app connection")
	}
	return c.Conn.SetWriteDeadline(d)
}

func (c *trackedAppConn) Close() error {
	c.once.Do(func() { c.t.open.Add(-1) })
	return c.Conn.Close()
}

// newAppConnPanicEnv is an h2Env with max_streams on its instance whose
// app connections are tracked (appConnTracker).
func newAppConnPanicEnv(t *testing.T, maxStreams int) (e *h2Env, armed *atomic.Bool, open *atomic.Int64) {
	t.Helper()
	armed, open = new(atomic.Bool), new(atomic.Int64)
	e = newH2Env(t, maxStreams, Config{NewConnector: func(spec routes.ConnectorSpec) (connector.Connector, error) {
		inner, err := NewConnector(spec)
		if err != nil {
			return nil, err
		}
		return appConnTracker{inner: inner, armed: armed, open: open}, nil
	}})
	return e, armed, open
}

// expectReleased waits until no app connection is open and no stream holds
// a slot of the instance behind host.
func expectReleased(t *testing.T, e *h2Env, host string, open *atomic.Int64, after string) {
	t.Helper()
	inst := e.table.Lookup(host).Instance
	testutil.Eventually(t, 10*time.Second, "every app connection closed and every max_streams slot free "+after, func() bool {
		return open.Load() == 0 && inst.Active() == 0
	})
}

// TestPanicH2StreamReleasesAppConnAndSlots: an HTTP/2 stream whose handler
// panics while it holds an app connection and a max_streams slot
// releases both, and the engine frees its slot on the connection: more
// panics on one connection than the instance's max_streams and than
// SETTINGS_MAX_CONCURRENT_STREAMS leave no app connection open and no
// slot taken, and the same connection then serves.
func TestPanicH2StreamReleasesAppConnAndSlots(t *testing.T) {
	h2Verify(t)
	const maxStreams = 2
	e, armed, open := newAppConnPanicEnv(t, maxStreams)
	cc := e.dial(h2WebHost)
	before := panicguard.Count(panicguard.H2Stream)
	armed.Store(true)
	n := H2MaxConcurrentStreams + 2*maxStreams
	for i := range n {
		if resp, err := cc.RoundTrip(h2Req(t, "GET", h2WebHost, "/", nil)); err == nil {
			_ = resp.Body.Close()
			t.Fatalf("request %d answered %d; want its stream reset by the panic", i, resp.StatusCode)
		}
	}
	armed.Store(false)
	testutil.Eventually(t, 10*time.Second, "every panic counted", func() bool {
		return panicguard.Count(panicguard.H2Stream) >= before+float64(n)
	})
	expectReleased(t, e, h2WebHost, open, "after the stream panics")
	resp, err := cc.RoundTrip(h2Req(t, "GET", h2WebHost, "/?after", nil))
	if err != nil {
		t.Fatalf("the connection after %d stream panics: %v", n, err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "web after" {
		t.Fatalf("the connection after %d stream panics: %d %q", n, resp.StatusCode, b)
	}
	expectReleased(t, e, h2WebHost, new(atomic.Int64), "after a request") // the pooled connection stays open
}

// TestPanicHTTP1ReleasesAppConnAndSlot is the HTTP/1.1 counterpart: each
// panic ends its client connection, closes the app connection it held
// and frees its max_streams slot.
func TestPanicHTTP1ReleasesAppConnAndSlot(t *testing.T) {
	h2Verify(t)
	const maxStreams = 2
	e, armed, open := newAppConnPanicEnv(t, maxStreams)
	before := panicguard.Count(panicguard.HTTP1Conn)
	armed.Store(true)
	n := 2*maxStreams + 1
	for i := range n {
		c := e.h1(h2WebHost)
		_, _ = io.WriteString(c.conn, "GET / HTTP/1.1\r\nHost: "+h2WebHost+"\r\n\r\n")
		if resp, err := http.ReadResponse(c.br, nil); err == nil {
			_ = resp.Body.Close()
			t.Fatalf("request %d answered %d; want its connection closed by the panic", i, resp.StatusCode)
		}
	}
	armed.Store(false)
	testutil.Eventually(t, 10*time.Second, "every panic counted", func() bool {
		return panicguard.Count(panicguard.HTTP1Conn) >= before+float64(n)
	})
	expectReleased(t, e, h2WebHost, open, "after the connection panics")
	if status, _, body := e.h1(h2WebHost).do(t, "GET /?after HTTP/1.1\r\nHost: "+h2WebHost+"\r\n\r\n"); status != 200 || body != "web after" {
		t.Fatalf("a connection after %d panics: %d %q", n, status, body)
	}
}
