package h2engine

import (
	"crypto/tls"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/dispatch/internal/h2load"
)

// BenchmarkServers compares the engine with x/net's http2.Server serving
// the same trivial handler (200, a 20-byte text body) over real TLS on
// loopback, loaded by a lean frame-level client (package h2load, like
// h2load: HPACK-indexed requests, responses counted, not decoded) with 4 connections × 100
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
	clients := make([]*h2load.Conn, conns)
	for i := range clients {
		lc, err := h2load.Dial(addr, &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a loopback benchmark against its own certificate
			h2load.Request{Authority: "localhost", Path: "/", UserAgent: "h2engine-bench"})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = lc.Close() }()
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
			if err := lc.Run(&left, depth); err != nil {
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
