package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/applistener/applistener/internal/testutil"
)

// countingTestService is the TestService the grpc subcommand is tested
// against: it counts the unary calls, the streams, the streamed messages and
// the streams the client ended (io.EOF), and keeps every :authority seen.
type countingTestService struct {
	testpb.UnimplementedTestServiceServer
	unary, streams, msgs, ended atomic.Int64
	sizes                       sync.Map // payload size of requests -> true
	mu                          sync.Mutex
	authorities                 map[string]int
}

func (s *countingTestService) seen(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.authorities == nil {
		s.authorities = map[string]int{}
	}
	for _, a := range md.Get(":authority") {
		s.authorities[a]++
	}
}

func (s *countingTestService) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	s.seen(ctx)
	s.unary.Add(1)
	s.sizes.Store(len(req.GetPayload().GetBody()), true)
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: make([]byte, req.GetResponseSize())}}, nil
}

func (s *countingTestService) FullDuplexCall(stream grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	s.seen(stream.Context())
	s.streams.Add(1)
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			s.ended.Add(1)
			return nil
		}
		if err != nil {
			return err
		}
		s.msgs.Add(1)
		s.sizes.Store(len(req.GetPayload().GetBody()), true)
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: make([]byte, req.GetResponseParameters()[0].GetSize())}}); err != nil {
			return err
		}
	}
}

// grpcReport is the JSON line of the grpc subcommand.
type grpcReport struct {
	Mode      string  `json:"mode"`
	RPC       string  `json:"rpc"`
	Conns     int     `json:"conns"`
	Streams   int     `json:"streams"`
	Size      int     `json:"size"`
	TLS       bool    `json:"tls"`
	CallsPerS float64 `json:"calls_per_s"`
	MsgsPerS  float64 `json:"msgs_per_s"`
	Total     int64   `json:"total"`
	Errors    int64   `json:"errors"`
	FirstErr  string  `json:"first_error"`
	Samples   int64   `json:"samples"`
	P50       float64 `json:"p50_ms"`
	P99       float64 `json:"p99_ms"`
}

func runGRPCReport(t *testing.T, args ...string) grpcReport {
	t.Helper()
	out := captureStdout(t, func() error { return runGRPC(args) })
	var r grpcReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	if r.Mode != "grpc" || r.Errors != 0 || r.FirstErr != "" {
		t.Fatalf("report %+v: want mode grpc without errors", r)
	}
	if r.Samples <= 0 || r.Total < r.Samples || r.P50 <= 0 || r.P99 < r.P50 {
		t.Errorf("report %+v: want samples, total >= samples and 0 < p50 <= p99", r)
	}
	return r
}

// countingListener counts the connections a server accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestGRPCPlaintext runs both modes against a grpc-go server in h2c: one
// TCP connection per -conns, every call or message of the report (total,
// plus the one round trip per connection or stream before the clock) is
// one the server answered, with the payload size asked for and the
// :authority given by -host, and every stream is ended by the client.
func TestGRPCPlaintext(t *testing.T) {
	testutil.VerifyNone(t)
	svc := &countingTestService{}
	gs := grpc.NewServer()
	testpb.RegisterTestServiceServer(gs, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(cl) })
	t.Cleanup(func() {
		gs.Stop()
		wg.Wait()
	})
	args := []string{"-addr", ln.Addr().String(), "-sni", "", "-host", "rpc.test", "-conns", "2", "-streams", "3",
		"-size", "40", "-duration", "300ms", "-warmup", "50ms"}

	u := runGRPCReport(t, append(args, "-mode", "unary")...)
	if u.RPC != "unary" || u.Conns != 2 || u.Streams != 3 || u.Size != 40 || u.TLS || u.CallsPerS <= 0 {
		t.Errorf("unary report %+v", u)
	}
	if got, want := svc.unary.Load(), u.Total+2; got != want {
		t.Errorf("server answered %d unary calls, want total %d + one per connection", got, u.Total)
	}
	if n := cl.n.Load(); n != 2 {
		t.Errorf("server accepted %d connections, want 2", n)
	}

	s := runGRPCReport(t, append(args, "-mode", "stream")...)
	if s.RPC != "stream" || s.MsgsPerS <= 0 || s.CallsPerS != 0 {
		t.Errorf("stream report %+v", s)
	}
	if got, want := svc.msgs.Load(), s.Total+6; got != want {
		t.Errorf("server answered %d messages, want total %d + one per stream", got, s.Total)
	}
	// One UnaryCall per connection before the streams open.
	if got := svc.unary.Load(); got != u.Total+4 {
		t.Errorf("unary calls %d after the stream run, want %d", got, u.Total+4)
	}
	testutil.Eventually(t, 5e9, "every stream ended by the client", func() bool {
		return svc.streams.Load() == 6 && svc.ended.Load() == 6
	})
	if n := cl.n.Load(); n != 4 {
		t.Errorf("server accepted %d connections over both runs, want 4", n)
	}
	svc.sizes.Range(func(k, _ any) bool {
		if k.(int) != 40 {
			t.Errorf("a request with a %d-byte payload, want 40", k)
		}
		return true
	})
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if len(svc.authorities) != 1 || svc.authorities["rpc.test"] == 0 {
		t.Errorf(":authority seen %v, want rpc.test only", svc.authorities)
	}
}

// TestGRPCTLS: with -sni, the client speaks TLS with that server name and
// ALPN h2, and -host (the same name) is the :authority.
func TestGRPCTLS(t *testing.T) {
	testutil.VerifyNone(t)
	svc := &countingTestService{}
	gs := grpc.NewServer()
	testpb.RegisterTestServiceServer(gs, svc)
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.TLS.ServerName+" "+r.TLS.NegotiatedProtocol+" "+r.Host]++
		mu.Unlock()
		gs.ServeHTTP(w, r)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		gs.Stop()
	})
	for _, mode := range []string{"unary", "stream"} {
		r := runGRPCReport(t, "-addr", srv.Listener.Addr().String(), "-sni", "rpc.test", "-host", "rpc.test",
			"-mode", mode, "-conns", "1", "-streams", "2", "-duration", "200ms", "-warmup", "20ms")
		if !r.TLS {
			t.Errorf("%s: report %+v, want tls", mode, r)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen["rpc.test h2 rpc.test"] == 0 {
		t.Errorf("requests by server name, protocol and host: %v, want rpc.test h2 rpc.test only", seen)
	}
}

// TestGRPCArguments: values the subcommand cannot run with are refused
// before it connects anywhere.
func TestGRPCArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-mode", "bidi"}, `unknown -mode "bidi"`},
		{[]string{"-conns", "0"}, "-conns and -streams must be at least 1"},
		{[]string{"-streams", "-1"}, "-conns and -streams must be at least 1"},
		{[]string{"-size", "-1"}, "-size must be between"},
		{[]string{"-duration", "0s"}, "-duration must be positive"},
		{[]string{"-sni", "a.test", "-host", "b.test"}, "-host (the :authority) must be the -sni"},
		{[]string{"-no-such-flag"}, "flag provided but not defined"},
	} {
		// 127.0.0.1:1 refuses connections: reaching it would fail differently.
		err := runGRPC(append([]string{"-addr", "127.0.0.1:1"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("runGRPC(%v) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
