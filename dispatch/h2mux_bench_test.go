package dispatch

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// BenchmarkH2Mux measures small HTTP/2 requests through the listener as
// h2load loads it in bench/run.sh: a lean frame-level client (pre-encoded
// requests, responses counted, not decoded) keeping 4 connections × 100
// streams (c4m100) or 50 connections × 1 stream (c50m1) in flight, real
// TLS, the route table and a real HTTP/1.1 keep-alive app behind. One op is
// one request: allocs/op is per request (the client's and the app's shares
// are small and the same before and after a change).
//
// cpu-ns/req is the process's CPU time per request (client and app
// included); writes/req and reads/req are the process's write and read
// system calls per request (Linux: /proc/self/io), of which the listener's
// writes to its clients are what frame coalescing cuts.
//
//	go test -run '^$' -bench H2Mux -benchmem -count 6 ./dispatch/
func BenchmarkH2Mux(b *testing.B) {
	for _, load := range []struct {
		name         string
		conns, depth int
	}{{"c4m100", 4, 100}, {"c50m1", 50, 1}} {
		b.Run(load.name, func(b *testing.B) { benchH2Mux(b, load.conns, load.depth) })
	}
}

func benchH2Mux(b *testing.B, conns, depth int) {
	app := newSharedBenchApp(b)
	defer app.close()
	raw, err := json.Marshal(map[string]any{"revision": "bench", "instances": []any{map[string]any{
		"workspace": "team", "sandbox": "s0",
		"services": []any{map[string]any{"name": "web", "port": app.port()}},
	}}})
	if err != nil {
		b.Fatal(err)
	}
	l := startBenchListener(b, benchListenerOptions{doc: raw})
	defer l.stop(b)
	host := sharedBenchHost(0)
	clients := make([]*h2LoadConn, conns)
	for i := range clients {
		lc, err := dialH2Load(l, host)
		if err != nil {
			b.Fatal(err)
		}
		defer lc.close()
		clients[i] = lc
	}
	run := func(n int64) (time.Duration, error) {
		var left atomic.Int64
		left.Store(n)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var first error
		start := time.Now()
		for _, lc := range clients {
			wg.Go(func() {
				if err := lc.run(&left, depth); err != nil {
					mu.Lock()
					first = errors.Join(first, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return time.Since(start), first
	}
	// Warm-up: app connections opened, pools filled.
	if _, err := run(int64(conns * depth * 4)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	r0, w0 := procSyscalls()
	cpu0 := processCPU()
	b.ResetTimer()
	elapsed, err := run(int64(b.N))
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	r1, w1 := procSyscalls()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/req")
	if r0 >= 0 && r1 >= 0 {
		b.ReportMetric(float64(w1-w0)/float64(b.N), "writes/req")
		b.ReportMetric(float64(r1-r0)/float64(b.N), "reads/req")
	}
}

// procSyscalls returns the process's read and write system calls so far
// (-1 where /proc/self/io is not there).
func procSyscalls() (reads, writes int64) {
	reads, writes = -1, -1
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return reads, writes
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		name, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes
}

// h2LoadConn is one client connection of the load, speaking frames.
type h2LoadConn struct {
	nc   *tls.Conn
	bw   *bufio.Writer
	br   *bufio.Reader
	fr   *http2.Framer // reads from br, writes to bw
	req  []byte        // the request's header block (HPACK, no table)
	next uint32
}

func dialH2Load(l *benchListener, host string) (*h2LoadConn, error) {
	nc, err := tls.Dial("tcp", l.addr, &tls.Config{ServerName: host, RootCAs: l.ca.Pool(), NextProtos: []string{"h2"}})
	if err != nil {
		return nil, err
	}
	if p := nc.ConnectionState().NegotiatedProtocol; p != "h2" {
		_ = nc.Close()
		return nil, errors.New("negotiated " + p + ", not h2")
	}
	lc := &h2LoadConn{nc: nc, bw: bufio.NewWriterSize(nc, 64<<10), br: bufio.NewReaderSize(nc, 64<<10), next: 1}
	lc.fr = http2.NewFramer(lc.bw, lc.br)
	lc.fr.SetReuseFrames()
	// Every field literal without indexing: each request encodes the
	// same, whatever came before.
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	enc.SetMaxDynamicTableSizeLimit(0)
	for _, f := range [...]hpack.HeaderField{
		{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: host}, {Name: ":path", Value: "/bench"},
		{Name: "user-agent", Value: "h2load nghttp2/1.52.0"}, {Name: "accept", Value: "*/*"},
	} {
		_ = enc.WriteField(f)
	}
	lc.req = hb.Bytes()
	_, _ = lc.bw.WriteString(http2.ClientPreface)
	_ = lc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
	_ = lc.fr.WriteWindowUpdate(0, 1<<31-1-65535)
	if err := lc.bw.Flush(); err != nil {
		_ = nc.Close()
		return nil, err
	}
	return lc, nil
}

func (lc *h2LoadConn) close() { _ = lc.nc.Close() }

// writeRequests writes n requests and flushes.
func (lc *h2LoadConn) writeRequests(n int) error {
	for range n {
		if err := lc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: lc.next, BlockFragment: lc.req, EndStream: true, EndHeaders: true}); err != nil {
			return err
		}
		lc.next += 2
	}
	return lc.bw.Flush()
}

// run keeps depth requests in flight until left is used up, counting
// responses (END_STREAM) as they complete, and replacing the completed
// ones in one write when about to wait for the network, as h2load does.
func (lc *h2LoadConn) run(left *atomic.Int64, depth int) error {
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
	if err := lc.writeRequests(inflight); err != nil {
		return err
	}
	_ = lc.nc.SetReadDeadline(time.Now().Add(time.Minute))
	freed := 0
	for inflight > 0 || freed > 0 {
		if freed > 0 && (lc.br.Buffered() == 0 || inflight == 0) {
			if n := take(freed); n > 0 {
				inflight += n
				if err := lc.writeRequests(n); err != nil {
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
		ack := false
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = lc.fr.WriteSettingsAck()
				ack = true
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = lc.fr.WritePing(true, f.Data)
				ack = true
			}
		case *http2.RSTStreamFrame:
			return errors.New("stream reset: " + f.ErrCode.String())
		case *http2.GoAwayFrame:
			return errors.New("GOAWAY: " + f.ErrCode.String())
		case *http2.HeadersFrame:
			if s := f.HeaderBlockFragment(); len(s) > 0 && s[0] != 0x88 && s[0]&0x80 != 0 {
				// Indexed :status other than 200 (static index 8).
				return errors.New("a response other than 200")
			}
		}
		if ack {
			if err := lc.bw.Flush(); err != nil {
				return err
			}
		}
		if f.Header().StreamID == 0 || !f.Header().Flags.Has(http2.FlagDataEndStream) {
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
