package dispatch

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/logsink"
)

const (
	manyRoutesInstalled = 10_000 // routes in the table
	manyRoutesConns     = 1_000  // client connections, in both cases
)

// BenchmarkManyRoutes is bench/run.sh's manyroutes workload in process: a
// table of 10,000 routes (one instance each, all on one real app), 1,000
// keep-alive TLS clients, first all on one route, then spread over 1,000
// routes (connection c on route c, SNI = Host = its name). Each worker
// rotates its requests over its share of the connections. The access log
// is on with serve's defaults (text, DefaultAccessLogRate lines per second
// per instance, DefaultAccessLogTotalRate in all) through the bounded log
// writer to a file, as in production: on one route the instance's bound
// drops most lines, spread over 1,000 instances only the process-wide
// bound drops any. cpu-ns/op is the CPU time of the whole
// process (client, listener, app, log writer) per request; writes/op the
// write system calls per request (client, listener, app and log writer);
// dials/1k-req the app connections opened per 1,000 requests after the
// warm-up. Run it on one core, as the listener runs in bench/run.sh:
//
//	go test -run XXX -bench ManyRoutes -cpu 1 -benchmem ./dispatch/
func BenchmarkManyRoutes(b *testing.B) {
	for _, spread := range []int{1, 1000} {
		b.Run(fmt.Sprintf("routes=%d", spread), func(b *testing.B) { benchManyRoutes(b, spread) })
	}
}

func benchManyRoutes(b *testing.B, spread int) {
	app := newSharedBenchApp(b)
	defer app.close()
	raw := sharedBenchDoc(b, manyRoutesInstalled, func(int) int { return app.port() })
	logFile, err := os.Create(filepath.Join(b.TempDir(), "access.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = logFile.Close() }()
	sink := logsink.New(logFile, 0, time.Hour, false)
	defer sink.Close(5 * time.Second)
	l := startBenchListener(b, benchListenerOptions{doc: raw, protos: []string{"http/1.1"},
		config: Config{AccessLog: AccessLogText, AccessLogWriter: sink}})
	if l.installed != manyRoutesInstalled {
		l.stop(b)
		b.Fatalf("installed %d routes; want %d", l.installed, manyRoutesInstalled)
	}

	workers := runtime.GOMAXPROCS(0) * sharedBenchParallelism
	sets := make(chan []*sharedBenchClient, workers)
	per := make([][]*sharedBenchClient, workers)
	var all []*sharedBenchClient
	defer func() {
		for _, c := range all {
			_ = c.conn.Close()
		}
		l.stop(b)
	}()
	for c := range manyRoutesConns {
		host := sharedBenchHost(c % spread)
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: sharedBenchTimeout}, "tcp", l.addr,
			&tls.Config{ServerName: host, RootCAs: l.ca.Pool(), NextProtos: []string{"http/1.1"}})
		if err != nil {
			b.Fatalf("dial %s: %v", host, err)
		}
		cl := &sharedBenchClient{conn: conn, br: bufio.NewReaderSize(conn, 4<<10),
			req: []byte("GET /bench HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n")}
		all = append(all, cl)
		per[c%workers] = append(per[c%workers], cl)
		if err := cl.do(); err != nil { // the route's pool and its app connection
			b.Fatalf("warm-up request to %s: %v", host, err)
		}
	}
	// Once more over all of them, quickly: dialling 1,000 TLS clients can
	// outlast the app connections' idle timeout on a busy machine.
	for _, cl := range all {
		if err := cl.do(); err != nil {
			b.Fatalf("warm-up request: %v", err)
		}
	}
	for _, set := range per {
		sets <- set
	}

	b.ReportAllocs()
	b.SetParallelism(sharedBenchParallelism)
	dials0 := app.accepted.Load()
	writes0 := processWrites()
	cpu0 := time.Duration(processCPU())
	b.ResetTimer()
	cpu := runSharedBenchClients(b, sets, cpu0)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(app.accepted.Load()-dials0)*1000/float64(b.N), "dials/1k-req")
	if w0, w1 := writes0, processWrites(); w0 >= 0 && w1 >= 0 {
		b.ReportMetric(float64(w1-w0)/float64(b.N), "writes/op")
	}
}

// processWrites returns the write system calls of this process so far
// (syscw in /proc/self/io), or -1 where there is no such file.
func processWrites() int64 {
	raw, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
