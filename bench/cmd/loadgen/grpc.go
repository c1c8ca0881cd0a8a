package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// runGRPC drives grpc_testing.TestService with the real grpc-go client,
// saturating (closed loop): -conns connections (each its own ClientConn,
// so its own TCP connection), on each -streams calls in flight.
//
//   - -mode unary: every worker makes UnaryCall after UnaryCall (a
//     -size-byte payload each way); the rate is calls per second.
//   - -mode stream: every worker holds one long-lived FullDuplexCall and
//     sends a -size-byte message, waits for the -size-byte answer, sends
//     the next (ping-pong); the rate is messages (round trips) per second.
//
// TLS (ALPN h2) with -sni as the server name, or plaintext HTTP/2 (h2c)
// when -sni is empty; -host is the :authority of every call (the listener
// routes by SNI and requires :authority = the route's host name; grpc-go
// refuses TLS with a server name other than the authority, so with TLS
// they must be equal). Every
// connection (and stream) makes one round trip before the clock starts.
// A call or message counts when it started in the measured window; total
// counts every one that completed, warm-up included (the divisor of
// figures taken over the whole run).
func runGRPC(args []string) error {
	fs := flag.NewFlagSet("grpc", flag.ContinueOnError)
	t := targetFlags(fs)
	mode := fs.String("mode", "unary", "unary (UnaryCall) or stream (ping-pong on long-lived FullDuplexCall streams)")
	conns := fs.Int("conns", 4, "connections (one grpc.ClientConn each)")
	streams := fs.Int("streams", 16, "per connection: calls in flight (unary) or streams (stream)")
	size := fs.Int("size", 64, "payload bytes of every request and response")
	duration := fs.Duration("duration", 5*time.Second, "measured duration")
	warmup := fs.Duration("warmup", time.Second, "unrecorded warm-up before the measurement")
	watch := watchFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *mode != "unary" && *mode != "stream":
		return fmt.Errorf("unknown -mode %q (unary or stream)", *mode)
	case *conns < 1 || *streams < 1:
		return fmt.Errorf("-conns and -streams must be at least 1, got %d and %d", *conns, *streams)
	case *size < 0 || *size > 1<<20:
		return fmt.Errorf("-size must be between 0 and 1 MiB, got %d", *size)
	case *duration <= 0 || *warmup < 0:
		return fmt.Errorf("-duration must be positive and -warmup not negative, got %v and %v", *duration, *warmup)
	case t.sni != "" && t.host != t.sni:
		// grpc-go refuses an authority that differs from its TLS server name.
		return fmt.Errorf("with TLS, -host (the :authority) must be the -sni, got %q and %q", t.host, t.sni)
	}
	w := newWatcher(*watch)

	creds := insecure.NewCredentials()
	if t.sni != "" {
		// tlsConfig offers http/1.1 only; gRPC's TLS credentials add h2.
		cfg := t.tlsConfig()
		cfg.NextProtos = nil
		creds = credentials.NewTLS(cfg)
	}
	clients := make([]testpb.TestServiceClient, *conns)
	var ccs []*grpc.ClientConn
	defer func() {
		for _, cc := range ccs {
			_ = cc.Close()
		}
	}()
	for i := range clients {
		cc, err := grpc.NewClient("passthrough:///"+t.addr, grpc.WithTransportCredentials(creds), grpc.WithAuthority(t.host))
		if err != nil {
			return fmt.Errorf("grpc client for %s: %w", t.addr, err)
		}
		ccs = append(ccs, cc)
		clients[i] = testpb.NewTestServiceClient(cc)
	}
	payload := &testpb.Payload{Body: make([]byte, *size)}
	unaryReq := &testpb.SimpleRequest{ResponseSize: int32(*size), Payload: payload}
	streamReq := &testpb.StreamingOutputCallRequest{
		ResponseParameters: []*testpb.ResponseParameters{{Size: int32(*size)}},
		Payload:            payload,
	}
	// Calls end at the latest 10 s after the run: a stalled server fails
	// the workers instead of holding them.
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(*warmup+*duration+10*time.Second))
	defer cancel()
	for i, c := range clients {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.UnaryCall(cctx, unaryReq, grpc.WaitForReady(true))
		ccancel()
		if err != nil {
			return fmt.Errorf("first call on connection %d: %w", i, err)
		}
	}

	workers := *conns * *streams
	type result struct {
		h     hist
		total int64
	}
	results := make([]result, workers)
	var errs atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	// A stream mode worker's stream, opened and used once before the clock
	// starts, so that the window measures messages and not stream set-up.
	type pingPong = grpc.BidiStreamingClient[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]
	openStream := func(c testpb.TestServiceClient) (pingPong, error) {
		s, err := c.FullDuplexCall(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.Send(streamReq); err != nil {
			return nil, err
		}
		if _, err := s.Recv(); err != nil {
			return nil, err
		}
		return s, nil
	}
	ss := make([]pingPong, workers)
	if *mode == "stream" {
		for i := range ss {
			s, err := openStream(clients[i%*conns])
			if err != nil {
				return fmt.Errorf("stream %d: %w", i, err)
			}
			ss[i] = s
		}
	}

	start = time.Now()
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*duration)
	time.AfterFunc(time.Until(measureFrom), w.start)
	var wg sync.WaitGroup
	for i := range workers {
		c, res := clients[i%*conns], &results[i]
		wg.Go(func() {
			if *mode == "unary" {
				for {
					t0 := time.Now()
					if !t0.Before(end) {
						return
					}
					if _, err := c.UnaryCall(ctx, unaryReq); err != nil {
						fail(err)
						time.Sleep(time.Millisecond)
						continue
					}
					res.total++
					if !t0.Before(measureFrom) {
						res.h.record(time.Since(t0))
					}
				}
			}
			s := ss[i]
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				if s == nil { // the last one failed: a new stream
					var err error
					if s, err = openStream(c); err != nil {
						fail(err)
						s = nil
						time.Sleep(10 * time.Millisecond)
						continue
					}
					t0 = time.Now()
				}
				err := s.Send(streamReq)
				if err == nil {
					_, err = s.Recv()
				}
				if err != nil {
					fail(err)
					s = nil
					continue
				}
				res.total++
				if !t0.Before(measureFrom) {
					res.h.record(time.Since(t0))
				}
			}
			if s != nil {
				// The client ends the stream; the server's end (io.EOF)
				// confirms it was served to its end.
				_ = s.CloseSend()
				if _, err := s.Recv(); !errors.Is(err, io.EOF) {
					fail(fmt.Errorf("end of stream: %w", err))
				}
			}
		})
	}
	wg.Wait()
	out := map[string]any{}
	w.stop(out)
	var all hist
	var total int64
	for i := range results {
		all.merge(&results[i].h)
		total += results[i].total
	}
	rateKey := "calls_per_s"
	if *mode == "stream" {
		rateKey = "msgs_per_s"
	}
	for k, v := range map[string]any{"mode": "grpc", "rpc": *mode, "conns": *conns, "streams": *streams,
		"size": *size, "tls": t.sni != "", rateKey: round(float64(all.n)/duration.Seconds(), 1),
		"total": total, "errors": errs.Load()} {
		out[k] = v
	}
	if e, ok := firstErr.Load().(string); ok {
		out["first_error"] = e
	}
	all.summary(out)
	emit(out)
	return nil
}
