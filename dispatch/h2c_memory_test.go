package dispatch

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/routes"
)

const (
	h2cFloodHost = "team--hostile--stream.apps.test" // h2c app that streams without end
	h2cOtherHost = "team--other--web.apps.test"      // another sandbox, HTTP/1.1 app
)

// h2cFloodApp is an h2c app (net/http's HTTP/2 server, prior knowledge)
// whose /stream answers with perStream bytes written as fast as the
// listener takes them, counting what each stream has written.
type h2cFloodApp struct {
	srv       *http.Server
	ln        net.Listener
	wg        sync.WaitGroup
	perStream int
	arrived   atomic.Int64
	total     atomic.Int64 // bytes the handlers' writes accepted
	mu        sync.Mutex
	written   []*atomic.Int64
}

func newH2CFloodApp(t *testing.T, perStream int) *h2cFloodApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &h2cFloodApp{ln: ln, perStream: perStream}
	var h2only http.Protocols
	h2only.SetUnencryptedHTTP2(true)
	a.srv = &http.Server{Handler: http.HandlerFunc(a.serve), Protocols: &h2only}
	a.wg.Go(func() { _ = a.srv.Serve(ln) })
	t.Cleanup(func() {
		_ = a.srv.Close()
		a.wg.Wait()
	})
	return a
}

func (a *h2cFloodApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *h2cFloodApp) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/stream" {
		_, _ = fmt.Fprint(w, "ok")
		return
	}
	n := new(atomic.Int64)
	a.mu.Lock()
	a.written = append(a.written, n)
	a.mu.Unlock()
	a.arrived.Add(1)
	w.Header().Set("Content-Type", "application/octet-stream")
	chunk := bytes.Repeat([]byte{'s'}, 16<<10)
	rc := http.NewResponseController(w)
	for sent := 0; sent < a.perStream; sent += len(chunk) {
		m, err := w.Write(chunk)
		n.Add(int64(m))
		a.total.Add(int64(m))
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// maxWritten is the most one stream has written.
func (a *h2cFloodApp) maxWritten() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var m int64
	for _, n := range a.written {
		m = max(m, n.Load())
	}
	return m
}

// processRSS is the resident set of the test process (0 where /proc is
// missing).
func processRSS() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return int64(pages) * int64(os.Getpagesize())
}

// h2cStalledStreamBound is the listener's memory for one stream whose
// client reads nothing while its h2c app writes without end, as README's
// Limits state it: the stream's receive window of the app's data and one
// copy buffer (bufSize with the default MaxHeaderBytes).
const h2cStalledStreamBound = h2cStreamWindow + DefaultMaxHeaderBytes + 1024

// TestH2CStalledClientsBounded: an h2c app streaming to 64 clients that
// never read (TLS HTTP/2 connections that sent their request and read
// nothing since, so they give no window beyond the initial 64 KiB) is
// stopped by flow control: no stream's app writes get further than the
// client's window and the listener's per-stream window (plus the app
// server's own buffering), the app's writes do not complete, the
// listener's live heap grows by less than 64 times the documented
// per-stream bound, and another sandbox's requests are served meanwhile.
//
// The heap is measured in-process (runtime.MemStats after a collection),
// not as RSS: under -race the race detector's shadow memory and the
// runtime's retention of freed pages make RSS move by more than the bound
// for reasons of their own. The heap counts the test's app and clients as
// well, which only makes the check stricter. RSS growth per stream is
// logged for the record.
func TestH2CStalledClientsBounded(t *testing.T) {
	h2Verify(t)
	const (
		clients   = 64
		perStream = 2 << 20 // what the app would write to each stream
		// clientWindow is what a client that sends no WINDOW_UPDATE
		// lets through (RFC 9113's initial window).
		clientWindow = 65535
		// appSlack is what net/http's HTTP/2 server accepts from a
		// handler beyond what it has sent: one 16 KiB chunk of the
		// handler's and its 4 KiB write buffer.
		appSlack = 32 << 10
	)
	e := newH2Env(t, 0, Config{})
	app := newH2CFloodApp(t, perStream)
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"flood","instances":[
		{"workspace":"team","sandbox":"hostile","generation":"1","services":[{"name":"stream","port":%d,"protocol":"h2c"}]},
		{"workspace":"team","sandbox":"other","generation":"1","services":[{"name":"web","port":%d}]}]}`, app.port(), e.web.port()))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	e.table.Apply(doc)

	// The app connection and the other sandbox's connection exist before
	// the baseline.
	h2MustDo(t, e.dial(h2cFloodHost), h2Req(t, "GET", h2cFloodHost, "/warm", nil), 200)
	other := e.dial(h2cOtherHost)
	h2MustDo(t, other, h2Req(t, "GET", h2cOtherHost, "/?before", nil), 200)
	heap0, _ := liveHeap()
	rss0 := processRSS()

	for i := range clients {
		_, fr := h2RawConn(t, e, h2cFloodHost)
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb) // one per connection: its table is the connection's
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", h2cFloodHost}, {":path", "/stream"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		// ... and nothing is read from the connection from now on.
	}

	// Every stream reached the app, and the app's writes have stopped:
	// nothing more for two seconds (a stall; with the windows unbounded
	// the writes would complete instead).
	deadline := time.Now().Add(60 * time.Second)
	last, quietSince := int64(-1), time.Now()
	for {
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s: %d of %d streams at the app, %d bytes written, still moving", app.arrived.Load(), clients, app.total.Load())
		}
		time.Sleep(100 * time.Millisecond)
		if app.arrived.Load() < clients {
			continue
		}
		if n := app.total.Load(); n != last {
			last, quietSince = n, time.Now()
			continue
		}
		if time.Since(quietSince) >= 2*time.Second {
			break
		}
	}
	heap1, _ := liveHeap()
	rss1 := processRSS()
	total := app.total.Load()
	growth, rssGrowth := heap1-heap0, rss1-rss0
	t.Logf("app wrote %d KiB in all (most to one stream %d KiB) of %d KiB; listener heap +%d KiB (%d KiB per stalled stream); RSS +%d KiB (%d KiB per stalled stream)",
		total>>10, app.maxWritten()>>10, clients*perStream>>10, growth>>10, growth/clients>>10, rssGrowth>>10, rssGrowth/clients>>10)

	if most, limit := app.maxWritten(), int64(clientWindow+h2cStreamWindow+appSlack); most > limit {
		t.Errorf("one stream's app wrote %d bytes to a client that reads nothing, beyond %d (client window + stream window + the app's buffering)", most, limit)
	}
	if limit := int64(clients*clientWindow + h2cConnWindow + 65535 + clients*appSlack); total > limit {
		t.Errorf("the app wrote %d bytes in all to clients that read nothing, beyond %d (their windows + the app connection's window)", total, limit)
	}
	if limit := int64(clients * h2cStalledStreamBound); growth >= limit {
		t.Errorf("live heap grew by %d bytes with %d stalled streams, want less than %d (%d per stream)", growth, clients, limit, h2cStalledStreamBound)
	}
	// Another sandbox is served meanwhile, on its open connection and on
	// a new one.
	h2MustDo(t, other, h2Req(t, "GET", h2cOtherHost, "/?during", nil), 200)
	h2MustDo(t, e.dial(h2cOtherHost), h2Req(t, "GET", h2cOtherHost, "/?new", nil), 200)
}
