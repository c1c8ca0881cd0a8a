package h2client

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// peers accepts loopback TCP connections and serves each with serve until
// the test ends (then it closes the listener and the connections, and
// waits for the goroutines).
type peers struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startPeers(t *testing.T, serve func(net.Conn)) *peers {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peers{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.wg.Go(func() {
				defer func() { _ = c.Close() }()
				serve(c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// startH2Server serves h with net/http's HTTP/2 server (h2c, prior
// knowledge; maxStreams is its SETTINGS_MAX_CONCURRENT_STREAMS, 0 for its
// default) on loopback until the test ends.
func startH2Server(t *testing.T, maxStreams int, h http.Handler) *peers {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	protos := new(http.Protocols)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: protos, HTTP2: &http.HTTP2Config{MaxConcurrentStreams: maxStreams}}
	p := &peers{ln: ln}
	p.wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() {
		_ = srv.Close()
		p.wg.Wait()
	})
	return p
}

// countingConn counts the writes made on it.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// dial connects a client to p with cfg; the test closes it.
func dial(t *testing.T, p *peers, cfg Config) (*Conn, *countingConn) {
	t.Helper()
	nc, err := net.Dial("tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc := &countingConn{Conn: nc}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := NewConn(ctx, cc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, cc
}

// get sends a request on a reserved slot.
func do(t *testing.T, c *Conn, ctx context.Context, req *Request) (*Response, error) {
	t.Helper()
	if err := c.WaitReserve(ctx); err != nil {
		return nil, err
	}
	if req.Scheme == "" {
		req.Scheme = "http"
	}
	if req.Authority == "" {
		req.Authority = "app.test"
	}
	if req.Method == "" {
		req.Method = "GET"
	}
	if req.Path == "" {
		req.Path = "/"
	}
	return c.RoundTrip(ctx, req)
}

// readAll reads a response body whole and closes it.
func readAll(t *testing.T, r *Response) ([]byte, error) {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	return b, err
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// bufferedBody is a request body whose bytes are all at hand.
type bufferedBody struct {
	r      *bytes.Reader
	closed atomic.Bool
}

func newBufferedBody(p []byte) *bufferedBody { return &bufferedBody{r: bytes.NewReader(p)} }

func (b *bufferedBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *bufferedBody) Close() error               { b.closed.Store(true); return nil }
func (b *bufferedBody) Buffered() (int, bool)      { return b.r.Len(), true }

// pipeBody is a request body fed by the test.
type pipeBody struct {
	*io.PipeReader
}

func (b pipeBody) Close() error { return b.PipeReader.Close() }

// rawPeer is a scripted HTTP/2 server: it reads the client preface,
// sends its SETTINGS, then runs script with a framer on the connection.
func rawPeer(t *testing.T, script func(fr *http2.Framer, c net.Conn), settings ...http2.Setting) *peers {
	return startPeers(t, func(c net.Conn) { servePeer(c, script, settings...) })
}

// pipePeer runs script as rawPeer's side of a net.Pipe in a goroutine of
// its own and returns the client's end; wait waits for the script to end
// (its end of the pipe is closed then).
func pipePeer(script func(fr *http2.Framer, c net.Conn)) (cc net.Conn, wait func()) {
	cc, pc := net.Pipe()
	var wg sync.WaitGroup
	wg.Go(func() {
		defer func() { _ = pc.Close() }()
		servePeer(pc, script)
	})
	return cc, wg.Wait
}

// servePeer is rawPeer's side of one connection.
func servePeer(c net.Conn, script func(fr *http2.Framer, c net.Conn), settings ...http2.Setting) {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(br, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.AllowIllegalWrites = true
	if err := fr.WriteSettings(settings...); err != nil {
		return
	}
	script(fr, c)
}

// readUntilHeaders reads frames until a request's HEADERS, which it returns.
func readUntilHeaders(fr *http2.Framer) *http2.MetaHeadersFrame {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return nil
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			return h
		}
	}
}

// block encodes header fields with a fresh encoder (static table and
// literals only, so every block stands alone).
func block(kv ...string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	enc.SetMaxDynamicTableSizeLimit(0)
	for i := 0; i+1 < len(kv); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return b.Bytes()
}
