package dispatch

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// BenchmarkH2CUnary measures gRPC unary calls per second (small messages,
// 8 calls in flight per GOMAXPROCS on one client connection) straight to
// the gRPC server in h2c ("direct") and through the listener ("listener":
// TLS from the client, the route's h2c pool to the app), in the same run:
// the ratio of their calls/s is the listener's cost. app-dials is the
// number of app connections the listener opened (the warm-up call
// included): one, when the route's pool multiplexes every call.
//
//	go test -run XXX -bench H2CUnary -count 3 ./dispatch/
func BenchmarkH2CUnary(b *testing.B) {
	for _, via := range []string{"direct", "listener"} {
		b.Run(via, func(b *testing.B) { benchH2CUnary(b, via == "listener") })
	}
}

func benchH2CUnary(b *testing.B, viaListener bool) {
	discard := slog.New(slog.DiscardHandler)
	gs := grpc.NewServer()
	testpb.RegisterTestServiceServer(gs, &rpcServer{})
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(appLn) })
	defer func() {
		gs.Stop()
		wg.Wait()
	}()

	addr, host := appLn.Addr().String(), "team--s0--rpc."+sharedBenchDomain
	var creds credentials.TransportCredentials = insecureCreds{}
	var srv *Server
	if viaListener {
		ca, err := tlsconf.NewAuthority("h2c bench CA")
		if err != nil {
			b.Fatal(err)
		}
		certPEM, keyPEM, err := ca.Issue([]string{"*." + sharedBenchDomain}, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			b.Fatal(err)
		}
		doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"bench","instances":[{"workspace":"team","sandbox":"s0",
			"services":[{"name":"rpc","port":%d,"protocol":"h2c"}]}]}`, appLn.Addr().(*net.TCPAddr).Port))
		if err != nil {
			b.Fatal(err)
		}
		table := routes.NewTable(routes.Options{Domain: sharedBenchDomain, Freshness: time.Hour, Logger: discard})
		defer table.Close()
		table.Apply(doc)
		srv = New(Config{Logger: discard})
		tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		lis := listener.New(tcpLn, listener.Config{
			TLS:     &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
			Routes:  table,
			Handler: srv,
			Logger:  discard,
		})
		served := make(chan error, 1)
		go func() { served <- lis.Serve() }()
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := lis.Shutdown(ctx); err != nil {
				b.Errorf("shutdown: %v", err)
			}
			if err := <-served; err != nil {
				b.Errorf("serve: %v", err)
			}
		}()
		addr = tcpLn.Addr().String()
		creds = credentials.NewTLS(&tls.Config{ServerName: host, RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12})
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds), grpc.WithAuthority(host))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	client := testpb.NewTestServiceClient(cc)
	req := &testpb.SimpleRequest{ResponseSize: 64, Payload: &testpb.Payload{Body: make([]byte, 64)}}
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := client.UnaryCall(ctx, req)
		return err
	}
	if err := call(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(sharedBenchParallelism)
	start := time.Now()
	cpu0 := processCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := call(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/call")
	if srv != nil {
		b.ReportMetric(counterValue(srv.m.dials.WithLabelValues("ok")), "app-dials")
		b.Logf("N=%d dials=%v", b.N, counterValue(srv.m.dials.WithLabelValues("ok")))
	}
}

// counterValue reads a counter.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
