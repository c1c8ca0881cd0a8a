package dispatch

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/logsink"
)

// BenchmarkProtocols compares small requests through the listener over
// HTTP/1.1 (keep-alive, one connection per client worker) and HTTP/2 (all
// workers multiplexed on net/http's HTTP/2 client), with the same real TLS,
// route table and backend; req/s is reported for each, side by side.
//
//	go test -run XXX -bench Protocols ./dispatch/
func BenchmarkProtocols(b *testing.B) {
	for _, proto := range []string{"http1", "http2"} {
		b.Run(proto, func(b *testing.B) { benchProtocol(b, proto, benchHistograms, sharedBenchParallelism) })
	}
}

// BenchmarkObservability is BenchmarkProtocols with the access log (JSON,
// through the bounded log writer, every line written: no rate bound) and
// the latency histograms on, and with both off: the difference is their
// cost per request. cpu-ns/req is the process's CPU time (user + system,
// client included) per request, the figure to compare.
//
//	go test -run XXX -bench Observability -benchmem -count 6 ./dispatch/
func BenchmarkObservability(b *testing.B) {
	for _, proto := range []string{"http1", "http2"} {
		for _, on := range []bool{false, true} {
			name := proto + "/off"
			if on {
				name = proto + "/on"
			}
			mode := benchNothing
			if on {
				mode = benchAccessLog
			}
			b.Run(name, func(b *testing.B) { benchProtocol(b, proto, mode, sharedBenchParallelism) })
		}
	}
}

// What benchProtocol observes of each request.
const (
	benchHistograms = iota // the latency histograms, no access log (New's default)
	benchNothing           // neither histograms nor access log
	benchAccessLog         // the histograms and a JSON access-log line through the log writer
)

// benchProtocol runs the small-request load over proto with par client
// workers per GOMAXPROCS, observing each request as mode says. Every worker
// sends a few requests first (the warm-up: client and app connections
// opened); dials/1k-req is how many app connections the listener opened
// per 1,000 requests after it.
func benchProtocol(b *testing.B, proto string, mode, par int) {
	app := newSharedBenchApp(b)
	defer app.close()
	raw, err := json.Marshal(map[string]any{"revision": "bench", "instances": []any{map[string]any{
		"workspace": "team", "sandbox": "s0",
		"services": []any{map[string]any{"name": "web", "port": app.port()}},
	}}})
	if err != nil {
		b.Fatal(err)
	}
	var cfg Config
	if mode == benchAccessLog {
		sink := logsink.New(io.Discard, 0, time.Hour, true)
		defer sink.Close(time.Second)
		cfg.AccessLog, cfg.AccessLogWriter, cfg.AccessLogRate, cfg.AccessLogTotalRate = AccessLogJSON, sink, -1, -1
	}
	l := startBenchListener(b, benchListenerOptions{doc: raw, config: cfg,
		setup: func(srv *Server) { srv.noObserve = mode == benchNothing }})

	host := sharedBenchHost(0)
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{ServerName: host, RootCAs: l.ca.Pool()},
		MaxIdleConnsPerHost: max(64, runtime.GOMAXPROCS(0)*par),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", l.addr)
		},
		Protocols: new(http.Protocols),
	}
	if proto == "http2" {
		tr.Protocols.SetHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	client := &http.Client{Transport: tr, Timeout: sharedBenchTimeout}
	defer func() {
		tr.CloseIdleConnections()
		l.stop(b)
	}()
	url := "https://" + host + "/bench"
	get := func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return &parseError{resp.StatusCode, "unexpected status"}
		}
		if want := proto == "http2"; (resp.ProtoMajor == 2) != want {
			return &parseError{500, "wrong protocol " + resp.Proto}
		}
		return nil
	}
	if err := get(); err != nil {
		b.Fatal(err)
	}
	var warm sync.WaitGroup
	for range runtime.GOMAXPROCS(0) * par {
		warm.Go(func() {
			for range 3 {
				if err := get(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	warm.Wait()
	dials0 := app.accepted.Load()
	b.ReportAllocs()
	b.SetParallelism(par)
	start := time.Now()
	cpu0 := processCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := get(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/req")
	b.ReportMetric(float64(app.accepted.Load()-dials0)*1000/float64(b.N), "dials/1k-req")
}
