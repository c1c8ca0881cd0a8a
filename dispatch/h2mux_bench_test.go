package dispatch

import (
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

	"github.com/applistener/applistener/dispatch/internal/h2load"
)

// BenchmarkH2Mux measures small HTTP/2 requests through the listener as
// h2load loads it in bench/run.sh: a lean frame-level client (package
// h2load: HPACK-indexed requests, responses counted, not decoded) keeping 4 connections × 100
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
	clients := make([]*h2load.Conn, conns)
	for i := range clients {
		lc, err := h2load.Dial(l.addr, &tls.Config{ServerName: host, RootCAs: l.ca.Pool()},
			h2load.Request{Authority: host, Path: "/bench", UserAgent: "h2load nghttp2/1.52.0"})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = lc.Close() }()
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
				if err := lc.Run(&left, depth); err != nil {
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
