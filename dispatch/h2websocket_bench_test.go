package dispatch

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/demoapp"
)

// wsBenchConns is the number of WebSockets echoing at once: over HTTP/1.1
// each has its own TLS connection, over HTTP/2 they are streams of one
// connection (as a browser opens them).
const wsBenchConns = 8

// wsBenchMsg is the payload of each echoed message.
var wsBenchMsg = []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef") // 64 B

// BenchmarkWebSocketEchoH2vsH1 echoes 64-byte messages through the real
// listener (TLS, route table, the gorilla/websocket demo app) over
// WebSockets opened with HTTP/1.1 upgrades and with HTTP/2 extended
// CONNECT, in the same process and run, in alternating rounds of 1,000
// echoes: each iteration is one echo over each. It reports the echo rate of each (h1-msg/s, h2-msg/s) and their
// ratio (h2/h1).
//
//	go test -run XXX -bench WebSocketEchoH2vsH1 -benchtime 20000x -count 5 ./dispatch/
func BenchmarkWebSocketEchoH2vsH1(b *testing.B) {
	app := httptest.NewServer(demoapp.Handler("bench"))
	defer app.Close()
	raw, err := json.Marshal(map[string]any{"revision": "bench", "instances": []any{map[string]any{
		"workspace": "team", "sandbox": "s0",
		"services": []any{map[string]any{"name": "web", "port": app.Listener.Addr().(*net.TCPAddr).Port}},
	}}})
	if err != nil {
		b.Fatal(err)
	}
	l := startBenchListener(b, benchListenerOptions{doc: raw})
	host := sharedBenchHost(0)
	dialTLS := func(proto string) (*tls.Conn, error) {
		return tls.Dial("tcp", l.addr, &tls.Config{ServerName: host, RootCAs: l.ca.Pool(), NextProtos: []string{proto}})
	}

	var h1, h2 []wsBenchEchoer
	defer func() {
		for _, c := range append(h1, h2...) {
			c.close()
		}
		l.stop(b)
	}()
	for range wsBenchConns {
		d := websocket.Dialer{NetDialTLSContext: func(context.Context, string, string) (net.Conn, error) { return dialTLS("http/1.1") }}
		c, resp, err := d.Dial("wss://"+host+"/ws", nil)
		if err != nil {
			b.Fatal(err)
		}
		_ = resp.Body.Close()
		h1 = append(h1, wsBenchGorilla{c})
	}
	tc, err := dialTLS("h2")
	if err != nil {
		b.Fatal(err)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc) //nolint:staticcheck // SA1019: x/net's ClientConn sends extended CONNECT.
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	for range wsBenchConns {
		c, err := openBenchH2WS(cc, "https://"+host+"/ws")
		if err != nil {
			b.Fatal(err)
		}
		h2 = append(h2, c)
	}
	for _, c := range append(h1, h2...) {
		if err := c.echo(); err != nil {
			b.Fatal(err)
		}
	}

	// Alternating rounds, so that the machine's drift during the run
	// weighs on both alike.
	const round = 1000
	var d1, d2 time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		d1 += wsBenchRun(b, h1, n)
		d2 += wsBenchRun(b, h2, n)
	}
	b.StopTimer()
	r1, r2 := float64(b.N)/d1.Seconds(), float64(b.N)/d2.Seconds()
	b.ReportMetric(r1, "h1-msg/s")
	b.ReportMetric(r2, "h2-msg/s")
	b.ReportMetric(r2/r1, "h2/h1")
}

// wsBenchRun spreads n echoes over conns, one goroutine each, and returns
// how long they took.
func wsBenchRun(b *testing.B, conns []wsBenchEchoer, n int) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range conns {
		k := n / len(conns)
		if i < n%len(conns) {
			k++
		}
		wg.Go(func() {
			for range k {
				if err := c.echo(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// wsBenchEchoer is one WebSocket of the benchmark.
type wsBenchEchoer interface {
	echo() error
	close()
}

type wsBenchGorilla struct{ c *websocket.Conn }

func (g wsBenchGorilla) echo() error {
	if err := g.c.WriteMessage(websocket.BinaryMessage, wsBenchMsg); err != nil {
		return err
	}
	_, p, err := g.c.ReadMessage()
	if err == nil && len(p) != len(wsBenchMsg) {
		err = errors.New("short echo")
	}
	return err
}

func (g wsBenchGorilla) close() { _ = g.c.Close() }

// wsBenchH2 is a WebSocket on an HTTP/2 stream, framed by hand: one
// masked binary frame out, one unmasked frame back.
type wsBenchH2 struct {
	w     *io.PipeWriter
	body  io.ReadCloser
	r     *bufio.Reader
	frame []byte
	buf   []byte
}

//nolint:staticcheck // SA1019: x/net's ClientConn sends extended CONNECT.
func openBenchH2WS(cc *http2.ClientConn, url string) (*wsBenchH2, error) {
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodConnect, url, pr)
	if err != nil {
		return nil, err
	}
	req.Header[":protocol"] = []string{"websocket"}
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, err := cc.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return nil, errors.New("extended CONNECT answered " + resp.Status)
	}
	return &wsBenchH2{w: pw, body: resp.Body, r: bufio.NewReader(resp.Body),
		frame: wsFrame(true, websocket.BinaryMessage, wsBenchMsg, true, 0), buf: make([]byte, 2+len(wsBenchMsg))}, nil
}

func (c *wsBenchH2) echo() error {
	if _, err := c.w.Write(c.frame); err != nil {
		return err
	}
	if _, err := io.ReadFull(c.r, c.buf); err != nil {
		return err
	}
	if c.buf[0] != 0x82 || int(c.buf[1]) != len(wsBenchMsg) {
		return errors.New("unexpected echo frame")
	}
	return nil
}

func (c *wsBenchH2) close() {
	_ = c.w.Close()
	_ = c.body.Close()
}
