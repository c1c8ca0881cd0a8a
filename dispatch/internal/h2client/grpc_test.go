package h2client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/applistener/applistener/internal/testutil"
)

// grpcServer answers EmptyCall and echoes FullDuplexCall's payloads.
type grpcServer struct {
	testpb.UnimplementedTestServiceServer
}

func (grpcServer) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	return &testpb.Empty{}, nil
}

func (grpcServer) FullDuplexCall(stream grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
			return err
		}
	}
}

// startGRPC serves grpcServer with grpc-go on loopback until the test ends.
func startGRPC(t *testing.T) string {
	t.Helper()
	gs := grpc.NewServer()
	testpb.RegisterTestServiceServer(gs, grpcServer{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(ln) })
	t.Cleanup(func() {
		gs.Stop()
		wg.Wait()
	})
	return ln.Addr().String()
}

func dialAddr(t *testing.T, addr string, cfg Config) *Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConn(testCtx(t), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// grpcMessage frames a serialized message (uncompressed).
func grpcMessage(msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// payloadRequest is a StreamingOutputCallRequest{payload: {body: body}}
// in protobuf's wire format (field 3, a Payload whose field 2 is body).
func payloadRequest(body []byte) []byte {
	inner := append([]byte{0x12, byte(len(body))}, body...)
	return append([]byte{0x1a, byte(len(inner))}, inner...)
}

func grpcHeader(path string) *Request {
	return &Request{
		Method: "POST", Scheme: "http", Authority: "app.test", Path: path,
		Header: []hpack.HeaderField{
			{Name: "content-type", Value: "application/grpc"},
			{Name: "te", Value: "trailers"},
			{Name: "grpc-timeout", Value: "10S", Sensitive: true},
		},
	}
}

// TestGRPCUnary: unary calls to grpc-go's server get their message and
// grpc-status in trailers, on one connection.
func TestGRPCUnary(t *testing.T) {
	testutil.VerifyNone(t)
	c := dialAddr(t, startGRPC(t), Config{})
	for range 5 {
		req := grpcHeader("/grpc.testing.TestService/EmptyCall")
		req.Body = newBufferedBody(grpcMessage(nil))
		resp, err := do(t, c, testCtx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := readAll(t, resp)
		if err != nil || resp.Status != 200 || !bytes.Equal(body, grpcMessage(nil)) {
			t.Fatalf("EmptyCall: %d %x %v", resp.Status, body, err)
		}
		if got := field(resp.Trailer, "grpc-status"); got != "0" {
			t.Fatalf("grpc-status %q (trailers %v)", got, resp.Trailer)
		}
	}
}

// TestGRPCBidirectional: a full-duplex call's messages go both ways while
// the request is still open, and it ends with grpc-status 0 once the
// request ends.
func TestGRPCBidirectional(t *testing.T) {
	testutil.VerifyNone(t)
	c := dialAddr(t, startGRPC(t), Config{})
	pr, pw := io.Pipe()
	req := grpcHeader("/grpc.testing.TestService/FullDuplexCall")
	req.Body = pipeBody{pr}
	resp, err := func() (*Response, error) {
		// The head comes once the server's handler sends; send the
		// first message meanwhile.
		go func() { _, _ = pw.Write(grpcMessage(payloadRequest([]byte("m0")))) }()
		return do(t, c, testCtx(t), req)
	}()
	if err != nil {
		t.Fatal(err)
	}
	want := func(i int) {
		t.Helper()
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(resp.Body, hdr); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		msg := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(resp.Body, msg); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		// StreamingOutputCallResponse{payload: {body}}: 0x0a len 0x12 len body.
		if body := []byte{'m', byte('0' + i)}; !bytes.HasSuffix(msg, body) {
			t.Fatalf("message %d: %x, want the body %q", i, msg, body)
		}
	}
	want(0)
	for i := 1; i < 4; i++ {
		if _, err := pw.Write(grpcMessage(payloadRequest([]byte{'m', byte('0' + i)}))); err != nil {
			t.Fatal(err)
		}
		want(i)
	}
	_ = pw.Close()
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("end of the call: %x %v", rest, err)
	}
	_ = resp.Body.Close()
	if got := field(resp.Trailer, "grpc-status"); got != "0" {
		t.Fatalf("grpc-status %q (trailers %v)", got, resp.Trailer)
	}
	testutil.Eventually(t, 5e9, "the stream closed", func() bool { return c.InFlight() == 0 })
}
