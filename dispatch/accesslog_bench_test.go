package dispatch

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/logsink"
	"github.com/applistener/applistener/routes"
)

// BenchmarkEndRequest is the per-request cost of the access log and the
// latency histograms alone, as endRequest pays it at the end of every
// request: off (nothing), histograms only, and histograms with a JSON or
// text line through the bounded log writer (no rate bound: every line is
// formatted and queued).
//
//	go test -run XXX -bench EndRequest -benchmem ./dispatch/
func BenchmarkEndRequest(b *testing.B) {
	rt := &routes.Route{Host: "team--demo--web.apps.test", Workspace: "team", Sandbox: "demo", Service: "web",
		InstallationVersion: 3, Instance: &routes.Instance{}}
	ci := connInfo{route: rt, sni: rt.Host, peer: netip.MustParseAddr("10.1.2.3"), tlsVer: 0x0304}
	method, path := []byte("GET"), []byte("/static/app.js?v=3")
	for _, c := range []struct {
		name, format string
		observe      bool
		sink         bool // through the log writer (false: formatted only)
	}{{"off", "", false, true}, {"histograms", "", true, true}, {"json-format-only", AccessLogJSON, true, false},
		{"json", AccessLogJSON, true, true}, {"text", AccessLogText, true, true}} {
		b.Run(c.name, func(b *testing.B) {
			w := io.Writer(io.Discard)
			if c.sink {
				sink := logsink.New(io.Discard, 1<<16, time.Hour, true)
				defer sink.Close(time.Second)
				w = sink
			}
			s := New(Config{Logger: slog.New(slog.DiscardHandler), AccessLog: c.format, AccessLogWriter: w, AccessLogRate: -1})
			s.noObserve = !c.observe
			var r accessRecord
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				r.begin(protoH1)
				r.parsed, r.mb, r.pb = true, method, path
				r.status, r.bytesOut, r.connect, r.firstByte = 200, 1234, 80*time.Microsecond, 310*time.Microsecond
				s.endRequest(&r, &ci)
			}
			// The log writer's goroutine included (its CPU is not in ns/op).
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
