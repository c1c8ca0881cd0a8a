package h2engine

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// BenchmarkServers compares the engine with x/net's http2.Server serving
// the same trivial handler (200, a 20-byte text body) over real TLS on
// loopback, loaded by a lean frame-level client (like h2load: pre-encoded
// requests, responses counted, not decoded) with 4 connections × 100
// concurrent streams and 50 connections × 1 stream. One op is one
// request: allocs/op is per request (the client's share is small and the
// same for both), req/s is the rate.
//
// cpu-ns/req is the process's CPU time per request (the client's share
// included, the same for both), srv-writes/req the server's writes to its
// TCP connections per request (how well responses are coalesced).
//
//	go test -run '^$' -bench Servers -benchmem -count 5 ./dispatch/internal/h2engine/
func BenchmarkServers(b *testing.B) {
	body := []byte(testBody)
	engine := HandlerFunc(func(st *Stream) {
		_ = st.WriteHeaders(200, []HeaderField{
			{Name: "content-type", Value: "text/plain"},
			{Name: "content-length", Value: strconv.Itoa(len(body))},
		}, false)
		_ = st.WriteLast(body)
	})
	xnet := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h["Content-Type"] = []string{"text/plain"}
		h["Content-Length"] = []string{strconv.Itoa(len(body))}
		_, _ = w.Write(body)
	})
	for _, load := range []struct {
		name         string
		conns, depth int
	}{{"c4m100", 4, 100}, {"c50m1", 50, 1}} {
		for _, server := range []string{"engine", "xnet"} {
			b.Run(server+"/"+load.name, func(b *testing.B) {
				var writes atomic.Int64
				addr, stop := benchServer(b, &writes, func(tc *tls.Conn) {
					if server == "engine" {
						_ = ServeConn(tc, Config{}, engine)
						return
					}
					// As dispatch configures it today (dispatch/h2.go).
					base := &http.Server{HTTP2: &http.HTTP2Config{MaxConcurrentStreams: DefaultMaxConcurrentStreams}}
					srv := &http2.Server{}                                                   //nolint:staticcheck // SA1019: the per-connection API dispatch uses today.
					srv.ServeConn(tc, &http2.ServeConnOpts{BaseConfig: base, Handler: xnet}) //nolint:staticcheck // SA1019: as above.
				})
				defer stop()
				benchLoad(b, addr, load.conns, load.depth, &writes)
			})
		}
	}
}

// benchServer serves TLS (ALPN h2) connections with serve.
// Each write to a raw connection is counted in writes.
func benchServer(b *testing.B, writes *atomic.Int64, serve func(*tls.Conn)) (string, func()) {
	cert, _ := testCert(b)
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, raw)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				tc := tls.Server(countingConn{raw, writes}, cfg)
				if tc.Handshake() != nil {
					_ = raw.Close()
					return
				}
				serve(tc)
				_ = raw.Close()
			}()
		}
	}()
	return ln.Addr().String(), func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}

// benchLoad runs b.N GET requests over conns connections with depth
// streams in flight on each, and reports req/s.
func benchLoad(b *testing.B, addr string, conns, depth int, writes *atomic.Int64) {
	clients := make([]*loadConn, conns)
	for i := range clients {
		lc, err := dialLoad(addr)
		if err != nil {
			b.Fatal(err)
		}
		defer lc.close()
		clients[i] = lc
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ReportAllocs()
	b.ResetTimer()
	writes.Store(0)
	start, cpu := time.Now(), processCPU()
	var wg sync.WaitGroup
	for _, lc := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := lc.run(&left, depth); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), processCPU()-cpu
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/req")
	b.ReportMetric(float64(writes.Load())/float64(b.N), "srv-writes/req")
}

// countingConn counts the writes to a server's raw connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// loadConn is one client connection of the load.
type loadConn struct {
	nc   *tls.Conn
	bw   *bufio.Writer
	br   *bufio.Reader
	wmu  sync.Mutex
	fr   *http2.Framer // reads from nc, writes to bw
	enc  *hpack.Encoder
	hbuf bytes.Buffer
	next uint32
}

func dialLoad(addr string) (*loadConn, error) {
	nc, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // a loopback benchmark against its own certificate
	if err != nil {
		return nil, err
	}
	lc := &loadConn{nc: nc, bw: bufio.NewWriterSize(nc, 64<<10), br: bufio.NewReaderSize(nc, 64<<10), next: 1}
	lc.fr = http2.NewFramer(lc.bw, lc.br)
	lc.fr.SetReuseFrames()
	lc.enc = hpack.NewEncoder(&lc.hbuf)
	_, _ = lc.bw.WriteString(clientPreface)
	_ = lc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxWindow})
	_ = lc.fr.WriteWindowUpdate(0, maxWindow-initialWindow)
	if err := lc.bw.Flush(); err != nil {
		return nil, err
	}
	return lc, nil
}

func (lc *loadConn) close() { _ = lc.nc.Close() }

// writeRequests writes n requests and flushes (wmu held).
func (lc *loadConn) writeRequests(n int) error {
	for range n {
		lc.hbuf.Reset()
		for _, f := range [...]hpack.HeaderField{
			{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "https"},
			{Name: ":authority", Value: "localhost"}, {Name: ":path", Value: "/"},
			{Name: "user-agent", Value: "h2engine-bench"}, {Name: "accept", Value: "*/*"},
		} {
			_ = lc.enc.WriteField(f)
		}
		if err := lc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: lc.next, BlockFragment: lc.hbuf.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			return err
		}
		lc.next += 2
	}
	return lc.bw.Flush()
}

// run keeps depth requests in flight until left is used up, counting
// responses (END_STREAM) as they complete.
func (lc *loadConn) run(left *atomic.Int64, depth int) error {
	take := func(n int) int {
		for {
			l := left.Load()
			if l <= 0 {
				return 0
			}
			m := min(int64(n), l)
			if left.CompareAndSwap(l, l-m) {
				return int(m)
			}
		}
	}
	inflight := take(depth)
	if inflight == 0 {
		return nil
	}
	lc.wmu.Lock()
	err := lc.writeRequests(inflight)
	lc.wmu.Unlock()
	if err != nil {
		return err
	}
	_ = lc.nc.SetReadDeadline(time.Now().Add(time.Minute))
	freed := 0 // responses completed, not yet replaced
	for inflight > 0 || freed > 0 {
		if freed > 0 && (lc.br.Buffered() == 0 || inflight == 0) {
			// About to wait for the network: replace the completed
			// requests in one write, as h2load does.
			if n := take(freed); n > 0 {
				inflight += n
				lc.wmu.Lock()
				err = lc.writeRequests(n)
				lc.wmu.Unlock()
				if err != nil {
					return err
				}
			}
			freed = 0
			continue
		}
		f, err := lc.fr.ReadFrame()
		if err != nil {
			return err
		}
		var ack func() error
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				ack = lc.fr.WriteSettingsAck
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				data := f.Data
				ack = func() error { return lc.fr.WritePing(true, data) }
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return io.ErrUnexpectedEOF
		}
		if ack != nil {
			lc.wmu.Lock()
			err = ack()
			if err == nil {
				err = lc.bw.Flush()
			}
			lc.wmu.Unlock()
			if err != nil {
				return err
			}
		}
		if !f.Header().Flags.Has(http2.FlagDataEndStream) || f.Header().StreamID == 0 {
			continue
		}
		if _, ok := f.(*http2.DataFrame); !ok {
			if _, ok := f.(*http2.HeadersFrame); !ok {
				continue
			}
		}
		inflight--
		freed++
	}
	return nil
}
