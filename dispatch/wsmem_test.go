package dispatch

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	rtmetrics "runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
)

// parkedWSApp is a minimal WebSocket app on loopback: it answers the
// upgrade with 101, echoes one client frame (masked, payload < 126 bytes)
// unmasked, then holds the connection without a goroutine or buffer, so
// that what a benchmark measures is the listener's side.
type parkedWSApp struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newParkedWSApp(tb testing.TB) *parkedWSApp {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	a := &parkedWSApp{ln: ln}
	a.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.wg.Go(func() { a.serve(c) })
		}
	})
	return a
}

func (a *parkedWSApp) serve(c net.Conn) {
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		_ = c.Close()
		return
	}
	_ = req.Body.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"); err != nil {
		_ = c.Close()
		return
	}
	var hdr [6]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		_ = c.Close()
		return
	}
	payload := make([]byte, hdr[1]&0x7f)
	if _, err := io.ReadFull(br, payload); err != nil {
		_ = c.Close()
		return
	}
	for i := range payload {
		payload[i] ^= hdr[2+i%4]
	}
	if _, err := c.Write(append([]byte{hdr[0], byte(len(payload))}, payload...)); err != nil {
		_ = c.Close()
		return
	}
	a.mu.Lock()
	a.conns = append(a.conns, c)
	a.mu.Unlock()
}

func (a *parkedWSApp) close() {
	_ = a.ln.Close()
	a.mu.Lock()
	for _, c := range a.conns {
		_ = c.Close()
	}
	a.conns = nil
	a.mu.Unlock()
	a.wg.Wait()
}

const wsUpgradeReq = "GET /ws HTTP/1.1\r\nHost: team--demo--web.apps.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
	"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"

// openParkedWS opens a TLS connection to addr, upgrades it to a WebSocket
// and echoes one message through it.
func openParkedWS(addr string, cfg *tls.Config, br *bufio.Reader) (net.Conn, error) {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	if _, err := io.WriteString(c, wsUpgradeReq); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("upgrade request: %w", err)
	}
	br.Reset(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		_ = c.Close()
		return nil, fmt.Errorf("upgrade response: %v %v", resp, err)
	}
	msg := []byte{0x81, 0x80 | 5, 1, 2, 3, 4, 'h' ^ 1, 'e' ^ 2, 'l' ^ 3, 'l' ^ 4, 'o' ^ 1}
	if _, err := c.Write(msg); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("message: %w", err)
	}
	var echo [7]byte
	if _, err := io.ReadFull(br, echo[:]); err != nil || string(echo[2:]) != "hello" {
		_ = c.Close()
		return nil, fmt.Errorf("echo %q: %v", echo, err)
	}
	return c, nil
}

// scannableHeap is the heap the garbage collector scans at every cycle
// (runtime/metrics /gc/scan/heap:bytes), after GC.
func scannableHeap() int64 {
	runtime.GC()
	s := []rtmetrics.Sample{{Name: "/gc/scan/heap:bytes"}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// liveHeap is the heap held by live objects after GC (HeapAlloc) and their
// number (HeapObjects).
func liveHeap() (bytes, objects int64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), int64(ms.HeapObjects)
}

// wsBenchEnv is a dispatch Server behind TLS on loopback (handshakes as
// the listener does them, without its SNI peek) with one route to a
// parkedWSApp, for the idle WebSocket benchmarks.
type wsBenchEnv struct {
	srv    *Server
	ln     net.Listener
	cliCfg *tls.Config
	wg     sync.WaitGroup
}

func newWSBenchEnv(b *testing.B, app *parkedWSApp, table *routes.Table, srvCfg, cliCfg *tls.Config) *wsBenchEnv {
	b.Helper()
	e := &wsBenchEnv{srv: New(Config{Logger: slog.New(slog.DiscardHandler)}), cliCfg: cliCfg}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	e.ln = ln
	e.wg.Go(func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			e.wg.Go(func() {
				tc := tls.Server(raw, srvCfg)
				if err := tc.Handshake(); err != nil {
					_ = raw.Close()
					return
				}
				e.srv.ServeConn(listener.Conn{Conn: tc, Raw: raw, SNI: tc.ConnectionState().ServerName, Route: table.Lookup(tc.ConnectionState().ServerName)})
			})
		}
	})
	return e
}

// park opens n WebSockets and waits until both directions of each are parked.
func (e *wsBenchEnv) park(b *testing.B, n int) []net.Conn {
	b.Helper()
	conns := make([]net.Conn, n)
	br := bufio.NewReader(nil)
	for i := range conns {
		c, err := openParkedWS(e.ln.Addr().String(), e.cliCfg, br)
		if err != nil {
			b.Fatalf("ws %d: %v", i, err)
		}
		conns[i] = c
	}
	for deadline := time.Now().Add(5 * time.Second); e.srv.idle.waiters() < 2*n && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // benchmark only: no test asserts on it
	}
	if w := e.srv.idle.waiters(); w < 2*n {
		b.Fatalf("%d of %d directions parked", w, 2*n)
	}
	return conns
}

func (e *wsBenchEnv) close(conns []net.Conn) {
	for _, c := range conns {
		_ = c.Close()
	}
	_ = e.ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = e.srv.Shutdown(ctx)
	cancel()
	e.wg.Wait()
}

// wsBenchSetup starts a parkedWSApp and a route table pointing at it, and
// returns them with the server's and the client's TLS configurations.
func wsBenchSetup(b *testing.B) (app *parkedWSApp, table *routes.Table, srvCfg, cliCfg *tls.Config) {
	b.Helper()
	app = newParkedWSApp(b)
	b.Cleanup(app.close)
	table, srvCfg, cliCfg = oneRouteTLS(b, app.ln.Addr().(*net.TCPAddr).Port)
	return app, table, srvCfg, cliCfg
}

// BenchmarkIdleWSConnMemory reports what a parked WebSocket (TLS client
// side, upgraded over HTTP/1.1, one message echoed, then idle past
// parkAfter) keeps, per connection, with 200 of them held: live heap
// (B/ws-heap, HeapAlloc delta after GC), live heap objects (objs/ws), the
// heap every GC cycle scans (B/ws-scan, /gc/scan/heap:bytes) and heap plus
// goroutine stacks (B/ws-held). GC work per cycle grows with the scanned
// heap of every parked WebSocket, which is what slows handshakes while many
// are held. The client's side (a tls.Conn per connection) is in the same
// process and counted too (the same for every version), so compare figures
// across changes; the app side holds only its socket.
func BenchmarkIdleWSConnMemory(b *testing.B) {
	const n = 200
	app, table, srvCfg, cliCfg := wsBenchSetup(b)
	var heap, objs, scan, held float64
	for b.Loop() {
		e := newWSBenchEnv(b, app, table, srvCfg, cliCfg)
		heap0, objs0 := liveHeap()
		scan0 := scannableHeap()
		held0 := heldBytes()
		conns := e.park(b, n)
		heap1, objs1 := liveHeap()
		heap = float64(heap1-heap0) / n
		objs = float64(objs1-objs0) / n
		scan = float64(scannableHeap()-scan0) / n
		held = float64(heldBytes()-held0) / n
		e.close(conns)
	}
	b.ReportMetric(heap, "B/ws-heap")
	b.ReportMetric(objs, "objs/ws")
	b.ReportMetric(scan, "B/ws-scan")
	b.ReportMetric(held, "B/ws-held")
}

// gcCPU is the CPU time the garbage collector has used so far
// (/cpu/classes/gc/total:cpu-seconds) and the GC cycles completed.
func gcCPU() (seconds float64, cycles uint64) {
	s := []rtmetrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/gc/cycles/total:gc-cycles"}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() == rtmetrics.KindFloat64 {
		seconds = s[0].Value.Float64()
	}
	if s[1].Value.Kind() == rtmetrics.KindUint64 {
		cycles = s[1].Value.Uint64()
	}
	return seconds, cycles
}

// BenchmarkHandshakeWithParkedWS measures new TLS connections (full
// handshake, then the client closes) with none and with 1,000 parked
// WebSockets held: time per connection, GC cycles per 1,000 connections,
// the GC's CPU time per connection (gc-µs/conn) and per cycle
// (gc-µs/cycle: the marking work, which grows with what the held
// WebSockets keep reachable). The ratio of the two
// sub-benchmarks is the accept-rate target's (new connections while many
// idle ones are held ≥ 90 % of the rate with none); the GC figures show
// what the held WebSockets cost each cycle. Client and server are in the
// same process: compare figures across changes.
func BenchmarkHandshakeWithParkedWS(b *testing.B) {
	app, table, srvCfg, cliCfg := wsBenchSetup(b)
	for _, held := range []int{0, 1000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			e := newWSBenchEnv(b, app, table, srvCfg, cliCfg)
			conns := e.park(b, held)
			defer e.close(conns)
			addr := e.ln.Addr().String()
			runtime.GC()
			gc0, cyc0 := gcCPU()
			for b.Loop() {
				c, err := tls.Dial("tcp", addr, cliCfg)
				if err != nil {
					b.Fatal(err)
				}
				_ = c.Close()
			}
			gc1, cyc1 := gcCPU()
			b.ReportMetric((gc1-gc0)*1e6/float64(b.N), "gc-µs/conn")
			b.ReportMetric(float64(cyc1-cyc0)*1000/float64(b.N), "gc/1k-conns")
			if cyc1 > cyc0 {
				b.ReportMetric((gc1-gc0)*1e6/float64(cyc1-cyc0), "gc-µs/cycle")
			}
		})
	}
}

// TestWSHandoffShedsRequestState: once an HTTP/1.1 connection is a
// WebSocket, its clientConn (registered for revocation as long as the
// WebSocket lives) no longer reaches the upgrade request's fields, its
// exchange (and through it the app connection's struct) or a read buffer, so that a parked
// WebSocket keeps only what the splice needs; the WebSocket still echoes
// and still ends on revocation.
func TestWSHandoffShedsRequestState(t *testing.T) {
	h2Verify(t)
	app := newParkedWSApp(t)
	t.Cleanup(app.close)
	e := newH2Env(t, 0, Config{})
	doc, err := routes.ParseDocument([]byte(fmt.Sprintf(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",`+
		`"connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"web","port":%d,"revision":1}]}]}`, app.ln.Addr().(*net.TCPAddr).Port)))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	e.table.Apply(doc)
	cfg := &tls.Config{ServerName: "team--demo--web." + h2Domain, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}}
	c, err := openParkedWS(e.ln.Addr().String(), cfg, bufio.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	testutil.Eventually(t, 5*time.Second, "both directions parked", func() bool { return e.srv.idle.waiters() == 2 })

	e.srv.mu.Lock()
	var cc *clientConn
	for k := range e.srv.conns {
		cc = k
	}
	e.srv.mu.Unlock()
	if cc == nil {
		t.Fatal("no client connection registered")
	}
	cc.mu.Lock()
	ws := cc.ws
	cc.mu.Unlock()
	if ws == nil {
		t.Fatal("the connection is not a WebSocket")
	}
	if cc.req.fields != nil || cc.req.method != nil || cc.req.host != nil {
		t.Errorf("the clientConn still holds the upgrade request (%d fields)", len(cc.req.fields))
	}
	if cc.x.bc != nil || cc.x.resp.fields != nil || cc.x.req != nil {
		t.Error("the clientConn still holds the upgrade's exchange")
	}
	if cc.in.buf != nil || cc.out != nil || cc.rec.mb != nil {
		t.Error("the clientConn still holds request buffers")
	}

	// Revocation still reaches the parked WebSocket: close frame 1008.
	empty, err := routes.ParseDocument([]byte(`{"revision":"r2","instances":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	e.table.Apply(empty)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil || hdr[0] != 0x88 {
		t.Fatalf("after revocation: % x, %v; want a close frame", hdr, err)
	}
	testutil.Eventually(t, 5*time.Second, "revoked WebSocket released", func() bool {
		return e.srv.Connections() == 0 && e.srv.idle.waiters() == 0
	})
}
