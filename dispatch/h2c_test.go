package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// The h2c tests use gRPC's own interop TestService (generated code that
// ships with google.golang.org/grpc): unary, server-streaming and
// full-duplex calls with real protobuf messages, served by a real gRPC
// server and called by a real gRPC client, with nothing generated here.

const (
	h2cRPCHost   = "team--demo--rpc.apps.test"
	h2cProtoHost = "team--demo--proto.apps.test" // http1 service that reports its protocol
	h2cPlainHost = "team--demo--plain.apps.test" // h2c service: a plain Go HTTP/2 app
	h2cDownHost  = "team--demo--rpcdown.apps.test"
)

// rpcServer is the TestService: it echoes what the listener forwarded in
// header metadata and always sets trailing metadata.
type rpcServer struct {
	testpb.UnimplementedTestServiceServer
	gate    chan struct{} // StreamingOutputCall: waited for after the first message
	arrived chan struct{} // FullDuplexCall: a stream started
	ended   chan error    // FullDuplexCall: a stream's handler returned
}

func (s *rpcServer) echoHeaders(ctx context.Context) metadata.MD {
	md, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{}
	for _, k := range []string{":authority", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "forwarded", "user-agent", "x-client",
		"x-forwarded-port", "x-request-id"} {
		if v := md.Get(k); len(v) > 0 {
			out.Set("seen-"+strings.TrimPrefix(k, ":"), v...)
		}
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs("trailer-key", "trailer-value", "trailer-bin", string([]byte{0, 1, 2})))
	return out
}

// statusOf is the status a request asks for, with a detail message.
func statusOf(es *testpb.EchoStatus) error {
	st := status.New(codes.Code(es.GetCode()), es.GetMessage())
	st, err := st.WithDetails(&testpb.SimpleResponse{Username: "detail for " + es.GetMessage()})
	if err != nil {
		return err
	}
	return st.Err()
}

func (s *rpcServer) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	_ = grpc.SetHeader(ctx, s.echoHeaders(ctx))
	if es := req.GetResponseStatus(); es != nil && es.GetCode() != 0 {
		return nil, statusOf(es)
	}
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: bytes.Repeat([]byte{'u'}, int(req.GetResponseSize()))}}, nil
}

func (s *rpcServer) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	_ = stream.SetHeader(s.echoHeaders(stream.Context()))
	for i, p := range req.GetResponseParameters() {
		body := bytes.Repeat([]byte{byte('a' + i)}, int(p.GetSize()))
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: body}}); err != nil {
			return err
		}
		if i == 0 && s.gate != nil {
			select {
			case <-s.gate:
			case <-stream.Context().Done():
				return stream.Context().Err()
			}
		}
	}
	if es := req.GetResponseStatus(); es != nil && es.GetCode() != 0 {
		return statusOf(es)
	}
	return nil
}

func (s *rpcServer) FullDuplexCall(stream grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) (err error) {
	// The head goes out before any message: the client may wait for it
	// before it sends anything.
	if err := stream.SendHeader(s.echoHeaders(stream.Context())); err != nil {
		return err
	}
	if s.arrived != nil {
		s.arrived <- struct{}{}
	}
	if s.ended != nil {
		defer func() { s.ended <- err }()
	}
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if es := req.GetResponseStatus(); es != nil && es.GetCode() != 0 {
			return statusOf(es)
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
			return err
		}
	}
}

// h2cEnv is an h2Env whose instance also has an h2c service "rpc" (the
// TestService), an http1 service "proto" and an h2c service "plain" (plain
// Go apps that report the protocol they were spoken to in), and an h2c
// service "rpcdown" on a port nobody listens on.
type h2cEnv struct {
	*h2Env
	rpc     *rpcServer
	grpcSrv *grpc.Server
	rpcAddr string
	proto   *http.Server // HTTP/1.1 only
	plain   *http.Server // unencrypted HTTP/2 only
	ports   map[string]int
}

func newH2CEnv(t *testing.T, maxStreams int, cfg Config) *h2cEnv {
	t.Helper()
	h2Verify(t)
	e := &h2cEnv{h2Env: newH2Env(t, 0, cfg), rpc: &rpcServer{}, ports: map[string]int{}}
	listen := func(name string) net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		e.ports[name] = ln.Addr().(*net.TCPAddr).Port
		return ln
	}
	e.grpcSrv = grpc.NewServer()
	testpb.RegisterTestServiceServer(e.grpcSrv, e.rpc)
	ln := listen("rpc")
	e.rpcAddr = ln.Addr().String()
	var wg sync.WaitGroup
	wg.Go(func() { _ = e.grpcSrv.Serve(ln) })

	e.proto = &http.Server{Handler: http.HandlerFunc(protoApp)}
	pln := listen("proto")
	wg.Go(func() { _ = e.proto.Serve(pln) })
	var h2only http.Protocols
	h2only.SetUnencryptedHTTP2(true)
	e.plain = &http.Server{Handler: http.HandlerFunc(protoApp), Protocols: &h2only}
	hln := listen("plain")
	wg.Go(func() { _ = e.plain.Serve(hln) })
	down := listen("rpcdown")
	_ = down.Close()
	t.Cleanup(func() {
		e.grpcSrv.Stop()
		_ = e.proto.Close()
		_ = e.plain.Close()
		wg.Wait()
	})
	e.applyH2C(maxStreams, true)
	return e
}

// applyH2C installs web (http1), proto (http1), plain and rpcdown (h2c),
// and rpc (h2c) unless withoutRPC.
func (e *h2cEnv) applyH2C(maxStreams int, withRPC bool) {
	e.t.Helper()
	services := []string{
		fmt.Sprintf(`{"name":"web","port":%d}`, e.web.port()),
		fmt.Sprintf(`{"name":"proto","port":%d,"protocol":"http1"}`, e.ports["proto"]),
		fmt.Sprintf(`{"name":"plain","port":%d,"protocol":"h2c"}`, e.ports["plain"]),
		fmt.Sprintf(`{"name":"rpcdown","port":%d,"protocol":"h2c"}`, e.ports["rpcdown"]),
	}
	if withRPC {
		services = append(services, fmt.Sprintf(`{"name":"rpc","port":%d,"protocol":"h2c"}`, e.ports["rpc"]))
	}
	limits := ""
	if maxStreams > 0 {
		limits = fmt.Sprintf(`"limits":{"max_streams":%d},`, maxStreams)
	}
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		"connector":{"type":"tcp","host":"127.0.0.1"},%s"services":[%s]}]}`, limits, strings.Join(services, ",")))
	if err != nil {
		e.t.Fatal(err)
	}
	if len(doc.Rejected) > 0 {
		e.t.Fatalf("rejected: %+v", doc.Rejected)
	}
	e.table.Apply(doc)
}

// protoApp answers with the protocol it was spoken to in, the request's
// trailers and TE, and sets a response trailer.
func protoApp(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/hang":
		<-r.Context().Done()
		return
	case "/fields":
		// Fields no client may get (hop-by-hop, or the app's own request
		// id), in the head and in the trailers, beside fields it must.
		h := w.Header()
		h.Set("Trailer", "X-Done, Set-Cookie, Proxy, Location")
		h.Set("Proxy", "http://evil.example")
		h.Set("Proxy-Authenticate", "Basic")
		h.Set("X-Request-Id", "app-chosen")
		h.Set("X-App", "kept")
		_, _ = io.WriteString(w, "body")
		h.Set("X-Done", "yes")
		h.Set("Set-Cookie", "t=1; Domain=apps.test; Path=/")
		h.Set("Proxy", "http://evil.example")
		h.Set("Location", "http://"+r.Host+"/after")
		return
	case "/grpc-broken", "/grpc-broken-declared":
		// A gRPC answer whose stream fails after a first message: the
		// server resets it.
		w.Header().Set("Content-Type", "application/grpc")
		if r.URL.Path == "/grpc-broken-declared" {
			w.Header().Set("Trailer", "Grpc-Status")
		}
		_, _ = w.Write([]byte{0, 0, 0, 0, 0})
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	case "/login":
		w.Header().Set("Set-Cookie", "sid=1; Domain=apps.test; Path=/")
		w.Header().Add("Set-Cookie", "own=2; Path=/")
		w.Header().Set("Location", "http://"+r.Host+"/home?x=1")
		w.Header().Set("Content-Location", "http://other.example/home")
		w.WriteHeader(http.StatusFound)
		return
	}
	w.Header().Set("Trailer", "X-App-Trailer")
	body, _ := io.ReadAll(r.Body)
	_, _ = fmt.Fprintf(w, "%s te=%q trailer=%q body=%d xff=%q",
		r.Proto, r.Header.Get("Te"), r.Trailer.Get("X-Req-Trailer"), len(body), r.Header.Get("X-Forwarded-For"))
	w.Header().Set("X-App-Trailer", "done")
}

// client returns a gRPC client of the TestService at host through the
// listener (TLS, ALPN h2, the test CA).
func (e *h2cEnv) client(host string) testpb.TestServiceClient {
	e.t.Helper()
	return testpb.NewTestServiceClient(e.conn(e.ln.Addr().String(), host, true))
}

// conn returns a gRPC client connection to addr (through the listener when
// viaTLS, else straight to the app in h2c).
func (e *h2cEnv) conn(addr, host string, viaTLS bool) *grpc.ClientConn {
	e.t.Helper()
	var creds credentials.TransportCredentials
	if viaTLS {
		creds = credentials.NewTLS(&tls.Config{ServerName: host, RootCAs: e.ca.Pool(), MinVersion: tls.VersionTLS12})
	} else {
		creds = insecureCreds{}
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds), grpc.WithAuthority(host))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// insecureCreds are plain-text transport credentials (h2c straight to the
// app), as google.golang.org/grpc/credentials/insecure provides.
type insecureCreds struct{}

func (insecureCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, insecureInfo{}, nil
}

func (insecureCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, insecureInfo{}, nil
}

func (insecureCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (insecureCreds) Clone() credentials.TransportCredentials { return insecureCreds{} }

func (insecureCreds) OverrideServerName(string) error { return nil }

type insecureInfo struct{}

func (insecureInfo) AuthType() string { return "insecure" }

func h2cWaitArrived(t *testing.T, s *rpcServer) {
	t.Helper()
	select {
	case <-s.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not reach the app")
	}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantMD(t *testing.T, md metadata.MD, key, want string) {
	t.Helper()
	if got := md.Get(key); len(got) != 1 || got[0] != want {
		t.Errorf("metadata %s = %q, want %q", key, got, want)
	}
}

func wantTrailer(t *testing.T, tr metadata.MD) {
	t.Helper()
	wantMD(t, tr, "trailer-key", "trailer-value")
	wantMD(t, tr, "trailer-bin", string([]byte{0, 1, 2}))
}

// wantStatus checks a call's error: its code, message and detail.
func wantStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v is not a gRPC status", err)
	}
	if st.Code() != code || st.Message() != msg {
		t.Fatalf("status %v %q, want %v %q", st.Code(), st.Message(), code, msg)
	}
	if msg == "" {
		return
	}
	details := st.Details()
	if len(details) != 1 {
		t.Fatalf("status details %v, want one", details)
	}
	if d, ok := details[0].(*testpb.SimpleResponse); !ok || d.GetUsername() != "detail for "+msg {
		t.Fatalf("status detail %v, want a SimpleResponse for %q", details[0], msg)
	}
}

// TestH2CUnary: unary calls through the listener reach the gRPC server
// with the listener's forwarding fields and come back with their
// payload, header and trailing metadata, and a non-OK status with its
// message and details; the access log records them as h2 requests.
func TestH2CUnary(t *testing.T) {
	var logBuf syncBuffer
	e := newH2CEnv(t, 0, Config{AccessLog: AccessLogText, AccessLogWriter: &logBuf})
	c := e.client(h2cRPCHost)
	ctx := metadata.AppendToOutgoingContext(callCtx(t), "x-client", "hello", "x-forwarded-for", "6.6.6.6", "x-request-id", "client-claim")

	var hdr, tr metadata.MD
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 100_000, Payload: &testpb.Payload{Body: bytes.Repeat([]byte{'q'}, 200_000)}},
		grpc.Header(&hdr), grpc.Trailer(&tr))
	if err != nil {
		t.Fatalf("UnaryCall: %v", err)
	}
	if got := resp.GetPayload().GetBody(); len(got) != 100_000 || got[0] != 'u' {
		t.Fatalf("payload %d bytes, want 100000", len(got))
	}
	wantMD(t, hdr, "seen-authority", fmt.Sprintf("127.0.0.1:%d", e.ports["rpc"]))
	wantMD(t, hdr, "seen-x-forwarded-for", "127.0.0.1") // the client's claim is dropped
	wantMD(t, hdr, "seen-x-forwarded-proto", "https")
	wantMD(t, hdr, "seen-x-forwarded-host", h2cRPCHost)
	wantMD(t, hdr, "seen-forwarded", "for=127.0.0.1;host="+h2cRPCHost+";proto=https")
	wantMD(t, hdr, "seen-x-client", "hello")
	wantMD(t, hdr, "seen-x-forwarded-port", "443")
	// The client's X-Request-Id is replaced by the request's id, which
	// the client gets back and the access log carries.
	ids := hdr.Get("seen-x-request-id")
	if len(ids) != 1 || len(ids[0]) != generatedIDLen || ids[0] == "client-claim" {
		t.Fatalf("X-Request-Id at the app %q, want one generated id", ids)
	}
	if got := hdr.Get("x-request-id"); len(got) != 1 || got[0] != ids[0] {
		t.Errorf("X-Request-Id returned %q, want the app's %q", got, ids[0])
	}
	defer func() {
		if !strings.Contains(logBuf.String(), "request_id="+ids[0]+" ") {
			t.Errorf("access log %q: want request_id=%s", logBuf.String(), ids[0])
		}
	}()
	if ua := hdr.Get("seen-user-agent"); len(ua) != 1 || !strings.HasPrefix(ua[0], "grpc-go/") {
		t.Errorf("user-agent at the app %q, want the client's grpc-go", ua)
	}
	wantTrailer(t, tr)

	hdr, tr = nil, nil
	_, err = c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(codes.FailedPrecondition), Message: "not today ✗"}},
		grpc.Header(&hdr), grpc.Trailer(&tr))
	wantStatus(t, err, codes.FailedPrecondition, "not today ✗")
	wantTrailer(t, tr)

	testutil.Eventually(t, 5*time.Second, "two access-log lines", func() bool {
		return strings.Count(logBuf.String(), "path=/grpc.testing.TestService/UnaryCall") == 2
	})
	for _, line := range strings.Split(strings.TrimSpace(logBuf.String()), "\n") {
		if !strings.Contains(line, "protocol=h2 ") || !strings.Contains(line, "service=rpc ") || !strings.Contains(line, "status=200 ") {
			t.Errorf("access log line %q: want protocol=h2 service=rpc status=200", line)
		}
	}
	if !strings.Contains(logBuf.String(), "bytes_in=200") {
		t.Errorf("access log %q: want the request body counted", logBuf.String())
	}
}

// TestH2CServerStreaming: a server-streaming call gets every message, the
// first before the server sends the next (nothing is held back), and its
// trailing metadata; a stream that ends with a non-OK status keeps it.
func TestH2CServerStreaming(t *testing.T) {
	e := newH2CEnv(t, 0, Config{})
	e.rpc.gate = make(chan struct{})
	c := e.client(h2cRPCHost)
	ctx := callCtx(t)
	sizes := []int32{10, 70_000, 1 << 20, 0, 5}
	params := make([]*testpb.ResponseParameters, len(sizes))
	for i, n := range sizes {
		params[i] = &testpb.ResponseParameters{Size: n}
	}
	stream, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{ResponseParameters: params})
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range sizes {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if body := m.GetPayload().GetBody(); len(body) != int(n) || (n > 0 && body[0] != byte('a'+i)) {
			t.Fatalf("message %d: %d bytes, want %d", i, len(body), n)
		}
		if i == 0 {
			close(e.rpc.gate) // the server sends the rest only now
		}
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("after the last message: %v, want EOF", err)
	}
	wantTrailer(t, stream.Trailer())

	stream, err = c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{
		ResponseParameters: params[:1], ResponseStatus: &testpb.EchoStatus{Code: int32(codes.ResourceExhausted), Message: "quota"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	wantStatus(t, err, codes.ResourceExhausted, "quota")
	wantTrailer(t, stream.Trailer())
}

// TestH2CBidirectional: a full-duplex call echoes each message before the
// client sends the next, in both directions at once, and ends with the
// server's status and trailing metadata.
func TestH2CBidirectional(t *testing.T) {
	e := newH2CEnv(t, 0, Config{})
	c := e.client(h2cRPCHost)
	ctx := callCtx(t)
	stream, err := c.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := stream.Header()
	if err != nil {
		t.Fatal(err)
	}
	wantMD(t, hdr, "seen-x-forwarded-host", h2cRPCHost)
	for i := range 20 {
		body := bytes.Repeat([]byte{byte(i)}, 1+i*5000)
		if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: body}}); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if !bytes.Equal(m.GetPayload().GetBody(), body) {
			t.Fatalf("echo %d differs", i)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("after CloseSend: %v, want EOF", err)
	}
	wantTrailer(t, stream.Trailer())

	stream, err = c.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&testpb.StreamingOutputCallRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(codes.Aborted), Message: "conflict"}}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	wantStatus(t, err, codes.Aborted, "conflict")
	wantTrailer(t, stream.Trailer())
}

// TestH2CWithdrawnRoute: withdrawing the route ends an open full-duplex
// call with UNAVAILABLE on the client and ends the app's stream; the app
// connections of the route are closed.
func TestH2CWithdrawnRoute(t *testing.T) {
	e := newH2CEnv(t, 0, Config{})
	e.rpc.arrived = make(chan struct{}, 1)
	e.rpc.ended = make(chan error, 1)
	c := e.client(h2cRPCHost)
	stream, err := c.FullDuplexCall(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	h2cWaitArrived(t, e.rpc)
	route := e.table.Lookup(h2cRPCHost)
	pool := e.srv.h2cPoolOf(route, e.srv.routePool(route))
	if pool.open() != 1 {
		t.Fatalf("%d app connections, want 1", pool.open())
	}

	e.applyH2C(0, false) // rpc withdrawn
	_, err = stream.Recv()
	if code := status.Code(err); code != codes.Unavailable {
		t.Fatalf("Recv after the withdrawal: %v (%v), want Unavailable", err, code)
	}
	select {
	case err := <-e.rpc.ended:
		if status.Code(err) != codes.Canceled {
			t.Errorf("the app's stream ended with %v, want Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the app's stream did not end")
	}
	if n := pool.open(); n != 0 {
		t.Fatalf("%d app connections left open", n)
	}
	// A new call is refused at the handshake: the name is unknown now.
	_, err = e.client(h2cRPCHost).UnaryCall(callCtx(t), &testpb.SimpleRequest{})
	if code := status.Code(err); code != codes.Unavailable {
		t.Fatalf("new call after the withdrawal: %v, want Unavailable", err)
	}
}

// TestH2CProtocolPerService: over HTTP/2 from the client, an http1 service
// still receives HTTP/1.1 and an h2c service HTTP/2, with TE: trailers and
// declared request trailers carried to it and its response trailers back.
func TestH2CProtocolPerService(t *testing.T) {
	e := newH2CEnv(t, 0, Config{})
	for _, tc := range []struct {
		host, want string
		trailers   bool
	}{
		{h2cProtoHost, `HTTP/1.1 te="" trailer="" body=5 xff="127.0.0.1"`, false},
		{h2cPlainHost, `HTTP/2.0 te="trailers" trailer="sent after" body=5 xff="127.0.0.1"`, true},
	} {
		cc := e.dial(tc.host)
		pr, pw := io.Pipe()
		req := h2Req(t, "POST", tc.host, "/x", pr)
		req.Header.Set("Te", "trailers")
		req.Header.Set("X-Forwarded-For", "6.6.6.6")
		req.Trailer = http.Header{"X-Req-Trailer": nil}
		go func() {
			_, _ = pw.Write([]byte("hello"))
			req.Trailer.Set("X-Req-Trailer", "sent after")
			_ = pw.Close()
		}()
		resp, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if string(body) != tc.want {
			t.Errorf("%s: app saw %q, want %q", tc.host, body, tc.want)
		}
		got := resp.Trailer.Get("X-App-Trailer")
		if tc.trailers && got != "done" {
			t.Errorf("%s: response trailer %q, want done", tc.host, got)
		}
	}
}

// TestH2CHTTP1Client: an HTTP/1.1 client of an h2c service gets 505 with
// the reason, and the connection closes; other services still serve
// HTTP/1.1 clients.
func TestH2CHTTP1Client(t *testing.T) {
	e := newH2CEnv(t, 0, Config{})
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: h2cRPCHost, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tc.Close() }()
	_, _ = fmt.Fprintf(tc, "POST /grpc.testing.TestService/UnaryCall HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\n\r\n", h2cRPCHost)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 505 || !resp.Close || !strings.Contains(string(body), reasonH2COnly) {
		t.Fatalf("HTTP/1.1 to an h2c service: %d close=%v %q, want 505, close, the reason", resp.StatusCode, resp.Close, body)
	}

	tc2, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: h2cProtoHost, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tc2.Close() }()
	_, _ = fmt.Fprintf(tc2, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", h2cProtoHost)
	resp, err = http.ReadResponse(bufio.NewReader(tc2), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "HTTP/1.1 ") {
		t.Fatalf("HTTP/1.1 to an http1 service: %d %q", resp.StatusCode, body)
	}
}

// TestH2CFailures: an h2c service nobody listens on is UNAVAILABLE (502),
// and the instance's stream limit applies to h2c streams (503,
// UNAVAILABLE) while the stream that holds the slot keeps working.
func TestH2CFailures(t *testing.T) {
	e := newH2CEnv(t, 1, Config{AppStartGrace: -1})
	e.rpc.arrived = make(chan struct{}, 1)
	_, err := e.client(h2cDownHost).UnaryCall(callCtx(t), &testpb.SimpleRequest{})
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "502") {
		t.Fatalf("dial refused: %v, want Unavailable from a 502", err)
	}

	c := e.client(h2cRPCHost)
	ctx, cancel := context.WithCancel(callCtx(t))
	stream, err := c.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h2cWaitArrived(t, e.rpc) // the stream holds the instance's one slot
	_, err = c.UnaryCall(callCtx(t), &testpb.SimpleRequest{})
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "503") {
		t.Fatalf("over max_streams: %v, want Unavailable from a 503", err)
	}
	if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("still here")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("open stream: %v", err)
	}
	cancel()
	testutil.Eventually(t, 5*time.Second, "the stream's slot to be released", func() bool {
		return e.table.Lookup(h2cRPCHost).Instance.Active() == 0
	})
}

// TestH2CHeadTimeout: an app that answers nothing within the response-head
// timeout once the request has ended gets 504; a request still streaming
// its body is not cut by it.
func TestH2CHeadTimeout(t *testing.T) {
	// Once the body ends the app must answer within timeout, through two
	// connections and two goroutine hand-offs: on a loaded 2-core CI
	// machine under -race 200 ms was too short for that.
	const timeout = time.Second
	e := newH2CEnv(t, 0, Config{ResponseHeaderTimeout: timeout})
	cc := e.dial(h2cPlainHost)
	// The plain app reads the whole body before answering: while the
	// client keeps it open, no head comes, and none is due.
	pr, pw := io.Pipe()
	done := make(chan h2Result, 1)
	go func() { done <- h2Do(cc, h2Req(t, "POST", h2cPlainHost, "/slow", pr)) }()
	_, _ = pw.Write([]byte("a"))
	// A head timer that ran while the body streams would answer 504 one
	// timeout after the request: this waits twice that.
	deadline := time.Now().Add(2 * timeout)
	for time.Now().Before(deadline) {
		select {
		case res := <-done:
			t.Fatalf("answered while the body was still open: %+v", res)
		case <-time.After(timeout / 4):
		}
	}
	_ = pw.Close()
	if res := <-done; res.err != nil || res.status != 200 || !strings.HasPrefix(res.body, "HTTP/2.0 ") {
		t.Fatalf("streamed request: %+v", res)
	}

	// An app that never answers a request that has ended: 504.
	start := time.Now()
	res := h2Do(cc, h2Req(t, "GET", h2cPlainHost, "/hang", nil))
	if res.err != nil || res.status != 504 || !strings.Contains(res.body, reasonRespTimeout) {
		t.Fatalf("app that never answers: %+v, want 504", res)
	}
	if d := time.Since(start); d < timeout {
		t.Fatalf("504 after %v, before the timeout %v", d, timeout)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestH2CWebSocketRefused: a WebSocket over HTTP/2 (extended CONNECT) for
// an h2c service is refused with 501 and its reason; the connection keeps
// serving gRPC-free requests to other streams.
func TestH2CWebSocketRefused(t *testing.T) {
	e := newH2CEnv(t, 0, Config{})
	cc := e.dialH2(h2cPlainHost)
	pr, pw := io.Pipe()
	defer func() { _ = pw.Close() }()
	req, err := http.NewRequest(http.MethodConnect, "https://"+h2cPlainHost+"/ws", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header[":protocol"] = []string{"websocket"}
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 501 || !strings.Contains(string(body), reasonH2CWebSocket) {
		t.Fatalf("extended CONNECT to an h2c service: %d %q, want 501", resp.StatusCode, body)
	}
	resp, err = cc.RoundTrip(h2Req(t, "GET", h2cPlainHost, "/after", nil))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "HTTP/2.0 ") {
		t.Fatalf("request after the refusal: %d %q", resp.StatusCode, body)
	}
}

// TestH2CResponseFields: an h2c app's cookies are made host-only and its
// redirects to its own loopback origin point at the public origin, as for
// HTTP/1.1 apps; other origins are untouched.
func TestH2CResponseFields(t *testing.T) {
	e := newH2CEnv(t, 0, Config{})
	cc := e.dial(h2cPlainHost)
	res := h2MustDo(t, cc, h2Req(t, "GET", h2cPlainHost, "/login", nil), http.StatusFound)
	if got, want := res.header.Get("Location"), "https://"+h2cPlainHost+"/home?x=1"; got != want {
		t.Errorf("Location %q, want %q", got, want)
	}
	if got := res.header.Get("Content-Location"); got != "http://other.example/home" {
		t.Errorf("Content-Location %q, want it untouched", got)
	}
	cookies := res.header.Values("Set-Cookie")
	if len(cookies) != 2 || strings.Contains(strings.ToLower(strings.Join(cookies, "|")), "domain") {
		t.Errorf("Set-Cookie %q, want both without Domain", cookies)
	}
}

// TestH2CResponseRules: what an h2c app's response may not pass on does
// not reach the client, in the head or in the trailers: hop-by-hop fields,
// the app's own X-Request-Id (the request's id replaces it) (Host and
// Content-Length in trailers, which net/http's server does not send: see
// TestUnitH2CClientFields); cookies in trailers are made host-only and
// redirects in them public, as in the head. A gRPC answer whose app stream
// fails ends as UNAVAILABLE in trailers, unless the app declared its own
// grpc-status (the stream is reset then, as the app's was).
func TestH2CResponseRules(t *testing.T) {
	e := newH2CEnv(t, 0, Config{})
	cc := e.dial(h2cPlainHost)
	do := func(path string) (*http.Response, string, error) {
		t.Helper()
		resp, err := cc.RoundTrip(h2Req(t, "GET", h2cPlainHost, path, nil))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}

	resp, body, err := do("/fields")
	if err != nil || resp.StatusCode != 200 || body != "body" {
		t.Fatalf("/fields: %d %q %v", resp.StatusCode, body, err)
	}
	for _, k := range []string{"Proxy", "Proxy-Authenticate", "Trailer"} {
		if v, ok := resp.Header[k]; ok {
			t.Errorf("head: %s %q reached the client", k, v)
		}
	}
	if ids := resp.Header.Values("X-Request-Id"); len(ids) != 1 || ids[0] == "app-chosen" {
		t.Errorf("head: X-Request-Id %q; want the request's own id only", ids)
	}
	if got := resp.Header.Get("X-App"); got != "kept" {
		t.Errorf("head: X-App %q, want kept", got)
	}
	if got := resp.Trailer.Get("X-Done"); got != "yes" {
		t.Errorf("trailer X-Done %q, want yes (trailers %v)", got, resp.Trailer)
	}
	for _, k := range []string{"Proxy"} {
		if v := resp.Trailer.Values(k); len(v) > 0 {
			t.Errorf("trailer %s %q reached the client", k, v)
		}
	}
	if got := resp.Trailer.Get("Set-Cookie"); got == "" || strings.Contains(strings.ToLower(got), "domain") {
		t.Errorf("trailer Set-Cookie %q, want it without Domain", got)
	}
	if got, want := resp.Trailer.Get("Location"), "https://"+h2cPlainHost+"/after"; got != want {
		t.Errorf("trailer Location %q, want %q", got, want)
	}

	resp, body, err = do("/grpc-broken")
	// (The message may be lost with the app's stream: a reset discards
	// what was not yet relayed.)
	if err != nil || resp.StatusCode != 200 || (body != "" && body != "\x00\x00\x00\x00\x00") {
		t.Fatalf("/grpc-broken: %d %q %v", resp.StatusCode, body, err)
	}
	if got := resp.Trailer.Get("Grpc-Status"); got != "14" {
		t.Errorf("/grpc-broken: grpc-status %q, want 14 (UNAVAILABLE); trailers %v", got, resp.Trailer)
	}

	resp, _, err = do("/grpc-broken-declared")
	if err == nil {
		t.Errorf("/grpc-broken-declared: the body ended cleanly (trailers %v); want the stream reset", resp.Trailer)
	}
	if got := resp.Trailer.Get("Grpc-Status"); got != "" {
		t.Errorf("/grpc-broken-declared: grpc-status %q made up; want the app's or none", got)
	}
}

// TestH2CAppStarting: a call to an h2c app that is not listening yet waits
// for it (the start grace) and succeeds once it listens; after the grace,
// the 502 "not listening" answer (UNAVAILABLE to gRPC).
func TestH2CAppStarting(t *testing.T) {
	e := newH2CEnv(t, 0, Config{AppStartGrace: 300 * time.Millisecond})
	_, err := e.client(h2cDownHost).UnaryCall(callCtx(t), &testpb.SimpleRequest{})
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "502") {
		t.Fatalf("app never listening: %v, want Unavailable from a 502", err)
	}

	e2 := newH2CEnv(t, 0, Config{AppStartGrace: 20 * time.Second})
	port := e2.ports["rpcdown"]
	done := make(chan error, 1)
	go func() {
		_, err := e2.client(h2cDownHost).UnaryCall(callCtx(t), &testpb.SimpleRequest{ResponseSize: 3})
		done <- err
	}()
	testutil.Eventually(t, 10*time.Second, "the call to wait for the app", func() bool {
		return gaugeValue(e2.srv.m.startWaiting) == 1
	})
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Skipf("port %d taken meanwhile: %v", port, err)
	}
	gs := grpc.NewServer()
	testpb.RegisterTestServiceServer(gs, &rpcServer{})
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(ln) })
	defer func() {
		gs.Stop()
		wg.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("call to the app that started: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the call did not complete once the app listened")
	}
}

// TestH2CStalledUpload: a request body that stops arriving before the h2c
// app has answered is the client's error, answered 408 as on the other
// paths (TestH2StalledUpload), and the stream's slot is released.
func TestH2CStalledUpload(t *testing.T) {
	e := newH2CEnv(t, 0, Config{BodyTimeout: 300 * time.Millisecond})
	cc := e.dial(h2cPlainHost)
	pr, pw := io.Pipe()
	defer func() { _ = pw.Close() }()
	go func() { _, _ = pw.Write([]byte("partial")) }()
	req := h2Req(t, "POST", h2cPlainHost, "/upload", pr)
	req.ContentLength = 1000
	start := time.Now()
	res := h2Do(cc, req)
	if res.err != nil || res.status != 408 || !strings.Contains(res.body, reasonReqTimeout) {
		t.Fatalf("stalled upload: %+v, want 408", res)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("408 after %v", d)
	}
	inst := e.table.Lookup(h2cPlainHost).Instance
	testutil.Eventually(t, 2*time.Second, "slot released", func() bool { return inst.Active() == 0 })
	h2MustDo(t, cc, h2Req(t, "GET", h2cPlainHost, "/after", nil), 200)
}

// startGRPCApp serves the test service (rpcServer) with grpc-go on a
// loopback port until the test or benchmark ends, and returns the port.
func startGRPCApp(tb testing.TB, opts ...grpc.ServerOption) int {
	tb.Helper()
	gs := grpc.NewServer(opts...)
	testpb.RegisterTestServiceServer(gs, &rpcServer{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(ln) })
	tb.Cleanup(func() {
		gs.Stop()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).Port
}
