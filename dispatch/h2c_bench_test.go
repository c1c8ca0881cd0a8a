package dispatch

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// BenchmarkH2CUnary measures gRPC unary calls per second (64-byte
// messages, 8 calls in flight per GOMAXPROCS) straight to the gRPC server
// in h2c and through the listener (TLS from the client, the route's h2c
// pool to the app), in the same run: each worker alternates one call on
// each path, so that both see the same machine (a loaded machine drifts
// by tens of percent between runs). direct-calls/s and listener-calls/s
// are each path's rate at that concurrency (calls over the time workers
// spent in them), ratio is listener/direct; cpu-ns/call is the process's
// CPU (client, listener and server) per pair of calls; app-dials counts
// the app connections the listener opened (the warm-up call included):
// one, when the route's pool multiplexes every call; app-writes/call
// counts the write calls on the app connections per call through the
// listener.
//
//	go test -run XXX -bench H2CUnary -count 3 ./dispatch/
func BenchmarkH2CUnary(b *testing.B) {
	l, host, appPort := startH2CBench(b)
	defer l.stop(b)
	srv := l.srv

	newClient := func(addr string, creds credentials.TransportCredentials) testpb.TestServiceClient {
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds), grpc.WithAuthority(host))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cc.Close() })
		return testpb.NewTestServiceClient(cc)
	}
	direct := newClient(fmt.Sprintf("127.0.0.1:%d", appPort), insecureCreds{})
	via := newClient(l.addr,
		credentials.NewTLS(&tls.Config{ServerName: host, RootCAs: l.ca.Pool(), MinVersion: tls.VersionTLS12}))
	req := &testpb.SimpleRequest{ResponseSize: 64, Payload: &testpb.Payload{Body: make([]byte, 64)}}
	call := func(c testpb.TestServiceClient) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.UnaryCall(ctx, req)
		return time.Since(start), err
	}
	for _, c := range []testpb.TestServiceClient{direct, via} {
		if _, err := call(c); err != nil {
			b.Fatal(err)
		}
	}
	route := l.table.Lookup(host)
	pool := srv.h2cPoolOf(route, srv.routePool(route))
	var directNs, viaNs atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(sharedBenchParallelism)
	workers := sharedBenchParallelism * runtime.GOMAXPROCS(0)
	cpu0 := processCPU()
	writes0 := pool.writes.Load()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d, err := call(direct)
			if err != nil {
				b.Error(err)
				return
			}
			v, err := call(via)
			if err != nil {
				b.Error(err)
				return
			}
			directNs.Add(int64(d))
			viaNs.Add(int64(v))
		}
	})
	b.StopTimer()
	// Each path's rate: its calls over the wall time the workers spent
	// in it (their summed time divided by how many there were).
	directRate := float64(b.N) / (float64(directNs.Load()) / 1e9 / float64(workers))
	viaRate := float64(b.N) / (float64(viaNs.Load()) / 1e9 / float64(workers))
	b.ReportMetric(directRate, "direct-calls/s")
	b.ReportMetric(viaRate, "listener-calls/s")
	b.ReportMetric(viaRate/directRate, "ratio")
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/call-pair")
	b.ReportMetric(counterValue(srv.m.dials.WithLabelValues("ok")), "app-dials")
	b.ReportMetric(float64(pool.writes.Load()-writes0)/float64(b.N), "app-writes/call")
}

// startH2CBench starts a gRPC app and a listener with one route to it,
// an h2c service; the caller stops the listener.
func startH2CBench(b *testing.B) (l *benchListener, host string, appPort int) {
	appPort = startGRPCApp(b)
	host = "team--s0--rpc." + sharedBenchDomain
	l = startBenchListener(b, benchListenerOptions{doc: fmt.Appendf(nil, `{"revision":"bench","instances":[{"workspace":"team","sandbox":"s0",
		"services":[{"name":"rpc","port":%d,"protocol":"h2c"}]}]}`, appPort)})
	return l, host, appPort
}

// counterValue reads a counter.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// gaugeValue reads a gauge.
func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return 0
	}
	return m.GetGauge().GetValue()
}

// BenchmarkH2CStream measures ping-pong messages (64 bytes) on gRPC
// bidirectional streams through the listener: 16 streams on one client
// connection (the client's HTTP/2 multiplexes them), each sending a
// message and waiting for its echo. msgs/s is the rate; app-writes/msg
// counts the write calls on the route's app connections and
// client-reads/msg the reads by which the client's connection received
// the listener's writes (each is at least one write by the listener),
// per message round trip: the mechanism by which a relay of many small
// messages keeps the client's and the app's batches whole, or splits
// each batch into one write per message; cpu-ns/msg is the process's CPU
// (client, listener and server).
//
//	go test -run XXX -bench H2CStream -count 3 ./dispatch/
func BenchmarkH2CStream(b *testing.B) {
	const streams = 16
	l, host, _ := startH2CBench(b)
	defer l.stop(b)
	srv := l.srv

	var clientReads atomic.Int64
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &countingReadConn{Conn: nc, reads: &clientReads}, nil
	}
	cc, err := grpc.NewClient("passthrough:///"+l.addr, grpc.WithContextDialer(dial), grpc.WithAuthority(host),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{ServerName: host, RootCAs: l.ca.Pool(), MinVersion: tls.VersionTLS12})))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	client := testpb.NewTestServiceClient(cc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := &testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, 64)}}
	calls := make([]testpb.TestService_FullDuplexCallClient, streams)
	for i := range calls {
		if calls[i], err = client.FullDuplexCall(ctx); err != nil {
			b.Fatal(err)
		}
		if err := calls[i].Send(req); err != nil { // warm-up: the stream is open end to end
			b.Fatal(err)
		}
		if _, err := calls[i].Recv(); err != nil {
			b.Fatal(err)
		}
	}
	route := l.table.Lookup(host)
	pool := srv.h2cPoolOf(route, srv.routePool(route))

	var next atomic.Int64
	b.ReportAllocs()
	cpu0 := processCPU()
	writes0, reads0 := pool.writes.Load(), clientReads.Load()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, call := range calls {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := call.Send(req); err != nil {
					b.Error(err)
					return
				}
				if _, err := call.Recv(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/msg")
	b.ReportMetric(float64(pool.writes.Load()-writes0)/float64(b.N), "app-writes/msg")
	b.ReportMetric(float64(clientReads.Load()-reads0)/float64(b.N), "client-reads/msg")
	for _, call := range calls {
		_ = call.CloseSend()
	}
}

// countingReadConn counts the reads that return data.
type countingReadConn struct {
	net.Conn
	reads *atomic.Int64
}

func (c *countingReadConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.reads.Add(1)
	}
	return n, err
}
