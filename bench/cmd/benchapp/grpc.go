package main

import (
	"context"
	"errors"
	"io"
	"net"

	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// grpcService is grpc_testing.TestService for the gRPC workloads of
// bench/run.sh: UnaryCall answers a payload of the size asked for (64
// bytes in the benchmark) and FullDuplexCall answers every message with
// one of the size its first response parameter asks for (ping-pong). Each
// call and each streamed message counts as one request in /stats.
type grpcService struct {
	testpb.UnimplementedTestServiceServer
}

// payloads are prepared response bodies by size, so that answering costs
// no allocation of the body; sizes outside it are built per call.
var payloads = map[int32][]byte{0: {}, 64: body(64)}

func payloadOf(size int32) []byte {
	if b, ok := payloads[size]; ok {
		return b
	}
	return body(int(size))
}

func (grpcService) UnaryCall(_ context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	requests.Add(1)
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: payloadOf(req.GetResponseSize())}}, nil
}

func (grpcService) FullDuplexCall(stream grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		requests.Add(1)
		var size int32
		if ps := req.GetResponseParameters(); len(ps) > 0 {
			size = ps[0].GetSize()
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: payloadOf(size)}}); err != nil {
			return err
		}
	}
}

// countingListener counts accepted connections in /stats' accepts.
type countingListener struct{ net.Listener }

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		accepts.Add(1)
	}
	return c, err
}

// serveGRPC serves grpcService in h2c (gRPC without TLS) on ln until the
// process ends.
func serveGRPC(ln net.Listener) error {
	gs := grpc.NewServer()
	testpb.RegisterTestServiceServer(gs, grpcService{})
	return gs.Serve(countingListener{ln})
}
