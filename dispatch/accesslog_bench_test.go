package dispatch

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/logsink"
	"github.com/applistener/applistener/routes"
)

// BenchmarkEndRequest is the per-request cost of the access log and the
// latency histograms alone, as endRequest pays it at the end of every
// request: off (nothing), histograms only, and histograms with a JSON,
// text or OCSF line through the bounded log writer (no rate bound: every line is
// formatted and queued; text-file: written to a file, the system calls of
// the log writer's goroutine included in cpu-ns/op).
//
//	go test -run XXX -bench EndRequest -benchmem ./dispatch/
func BenchmarkEndRequest(b *testing.B) {
	rt := &routes.Route{Host: "team--demo--web.apps.test", Workspace: "team", Sandbox: "demo", Service: "web",
		InstallationVersion: 3, Instance: &routes.Instance{}}
	ci := connInfo{route: rt, sni: rt.Host, peer: netip.MustParseAddr("10.1.2.3"), tlsVer: 0x0304}
	method, path := []byte("GET"), []byte("/static/app.js?v=3")
	ua := []byte("Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0")
	referer := []byte("https://team--demo--web.apps.test/dashboard?tab=recent")
	for _, c := range []struct {
		name, format string
		observe      bool
		sink         bool    // through the log writer (false: formatted only)
		file         bool    // the log writer writes to a file (else io.Discard)
		rate         float64 // lines per second per instance (-1: no bound, nor for the process)
	}{{"off", "", false, true, false, -1}, {"histograms", "", true, true, false, -1},
		{"json-format-only", AccessLogJSON, true, false, false, -1},
		{"json", AccessLogJSON, true, true, false, -1}, {"text", AccessLogText, true, true, false, -1},
		{"text-file", AccessLogText, true, true, true, -1},
		{"ocsf", AccessLogOCSF, true, true, false, -1},
		// serve's defaults (text, DefaultAccessLogRate per instance) under
		// a flood of one instance, as in make bench-compare: the bound
		// writes DefaultAccessLogRate lines a second and counts the rest.
		{"default-flood", AccessLogText, true, true, true, DefaultAccessLogRate}} {
		b.Run(c.name, func(b *testing.B) {
			w := io.Writer(io.Discard)
			if c.sink {
				dst := io.Writer(io.Discard)
				if c.file { // system calls included, as stderr to a file or pipe costs
					f, err := os.Create(filepath.Join(b.TempDir(), "access.log"))
					if err != nil {
						b.Fatal(err)
					}
					defer func() { _ = f.Close() }()
					dst = f
				}
				sink := logsink.New(dst, 1<<16, time.Hour, true)
				defer sink.Close(time.Second)
				w = sink
			}
			s := New(Config{Logger: slog.New(slog.DiscardHandler), AccessLog: c.format, AccessLogWriter: w, AccessLogRate: c.rate,
				AccessLogTotalRate: min(c.rate, 0)})
			s.noObserve = !c.observe
			var r accessRecord
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				r.begin(protoH1) // a new request id
				r.parsed, r.mb, r.pb, r.uab, r.refb = true, method, path, ua, referer
				r.status, r.bytesOut, r.connect, r.firstByte = 200, 1234, 80*time.Microsecond, 310*time.Microsecond
				s.endRequest(&r, &ci)
			}
			// The log writer's goroutine included (its CPU is not in ns/op).
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
