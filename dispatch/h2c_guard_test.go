package dispatch

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/testutil"
)

// TestPanicH2CClosesOnlyItsAppConnection: a panic in an h2c app
// connection (in its reads, under h2client's read loop; in its writes; in
// the read loop's handling of a frame, with the connection's mutex held)
// is recovered: counted in applistener_panics_total{where}, logged with
// the app's address and the stack; that app connection closes, the
// route's next call dials a new one, and another h2c app's connection is
// untouched. (h2c services are HTTP/2 only: an HTTP/1.1 request for one is
// refused before any app connection, TestH2CHTTP1Client.)
func TestPanicH2CClosesOnlyItsAppConnection(t *testing.T) {
	onStack := func(fn string) func() bool {
		return func() bool { return strings.Contains(string(debug.Stack()), fn) }
	}
	for _, tc := range []struct {
		name, where string
		here        func() bool // which of the site's points panics
	}{
		{"read", panicguard.H2CRead, func() bool { return true }},
		{"write", panicguard.H2CConn, onStack("(*h2cConn).Write")},
		{"frame loop", panicguard.H2CConn, onStack("(*Conn).handleFrame")},
	} {
		t.Run(tc.name, func(t *testing.T) { testPanicH2CClosesOnlyItsAppConnection(t, tc.where, tc.here) })
	}
}

func testPanicH2CClosesOnlyItsAppConnection(t *testing.T, site string, here func() bool) {
	logs := &lineLog{}
	e := newH2CEnv(t, 0, Config{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	c := e.client(h2cRPCHost)
	if _, err := c.UnaryCall(callCtx(t), &testpb.SimpleRequest{}); err != nil {
		t.Fatalf("a call before the panic: %v", err)
	}
	plain := e.dial(h2cPlainHost)
	plainGet := func(what string) {
		t.Helper()
		resp, err := plain.RoundTrip(h2Req(t, "GET", h2cPlainHost, "/", nil))
		if err != nil {
			t.Fatalf("the other h2c app %s: %v", what, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), "HTTP/2.0") {
			t.Fatalf("the other h2c app %s: %d %q", what, resp.StatusCode, b)
		}
	}
	plainGet("before the panic")
	pool := e.srv.h2cPoolOf(e.table.Lookup(h2cRPCHost), e.srv.routePool(e.table.Lookup(h2cRPCHost)))
	if n := pool.open(); n != 1 {
		t.Fatalf("%d app connections before the panic; want 1", n)
	}

	before := panicguard.Count(site)
	rpcAddr := fmt.Sprintf("127.0.0.1:%d", e.ports["rpc"])
	var injected atomic.Int64
	restore := panicguard.SetTestHook(func(where, id string) {
		if where == site && id == rpcAddr && here() && injected.Add(1) == 1 {
			panic("injected panic at " + where)
		}
	})
	t.Cleanup(restore)
	// This call's request (a write) or its answer (a frame, ending the
	// read the loop waits in) reaches the point that panics. The call
	// itself may or may not have its answer by then.
	_, _ = c.UnaryCall(callCtx(t), &testpb.SimpleRequest{})
	testutil.Eventually(t, 10*time.Second, "the read's panic counted", func() bool {
		return panicguard.Count(site) >= before+1
	})
	testutil.Eventually(t, 10*time.Second, "the app connection closed", func() bool { return pool.open() == 0 })
	plainGet("after the panic")
	testutil.Eventually(t, 10*time.Second, "a call on a new app connection", func() bool {
		_, err := c.UnaryCall(callCtx(t), &testpb.SimpleRequest{})
		return err == nil
	})
	if _, err := c.UnaryCall(callCtx(t), &testpb.SimpleRequest{}); err != nil {
		t.Fatalf("a call after the panic: %v", err)
	}
	if got := panicguard.Count(site); got != before+1 {
		t.Fatalf("applistener_panics_total{where=%s} = %v; want %v", site, got, before+1)
	}
	expectPanicLines(t, logs, site, `"app":"`+rpcAddr+`"`)
}

// expectPanicLines waits for a panic log line of where, then checks that
// every one has the stack, the injected value and wants (the identity).
func expectPanicLines(t *testing.T, logs *lineLog, where string, wants ...string) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, "a panic log line of "+where, func() bool {
		return strings.Contains(logs.text(), `"where":"`+where+`"`)
	})
	wants = append(wants, `"stack":"goroutine `, "injected panic at "+where)
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, l := range logs.lines {
		if strings.Contains(l, `"where":"`+where+`"`) {
			for _, want := range wants {
				if !strings.Contains(l, want) {
					t.Errorf("the panic's log line lacks %s: %s", want, l)
				}
			}
		}
	}
}

// TestPanicH2CRequestBodyFailsOnlyItsStream: a panic while h2client's
// sender reads a client's request body for an h2c app is recovered
// (applistener_panics_total{where="request_body"}, a log line with the
// SNI): that call fails, the app connection and a call open beside it
// on the same connection go on, and the next call needs no new dial.
func TestPanicH2CRequestBodyFailsOnlyItsStream(t *testing.T) {
	logs := &lineLog{}
	e := newH2CEnv(t, 0, Config{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	c := e.client(h2cRPCHost)
	ctx := callCtx(t)
	beside, err := c.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	echo := func(s testpb.TestService_FullDuplexCallClient, what string) error {
		if err := s.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte(what)}}); err != nil {
			return err
		}
		m, err := s.Recv()
		if err != nil {
			return err
		}
		if got := string(m.GetPayload().GetBody()); got != what {
			return fmt.Errorf("echo %q, want %q", got, what)
		}
		return nil
	}
	if err := echo(beside, "before"); err != nil {
		t.Fatalf("the call beside, before the panic: %v", err)
	}
	pool := e.srv.h2cPoolOf(e.table.Lookup(h2cRPCHost), e.srv.routePool(e.table.Lookup(h2cRPCHost)))
	only := func() *h2cConn {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		for c := range pool.conns {
			if len(pool.conns) == 1 {
				return c
			}
		}
		return nil
	}
	conn := only()
	if conn == nil {
		t.Fatalf("%d app connections before the panic; want 1", pool.open())
	}

	before := panicguard.Count(panicguard.RequestBody)
	armed := make(chan struct{})
	var injected atomic.Int64
	restore := panicguard.SetTestHook(func(where, id string) {
		select {
		case <-armed:
		default:
			return
		}
		if where == panicguard.RequestBody && id == h2cRPCHost && injected.Add(1) == 1 {
			panic("injected panic at " + where)
		}
	})
	t.Cleanup(restore)
	victim, err := c.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	close(armed) // the victim's next body read panics (the beside call's reader is parked in a read already)
	err = echo(victim, "victim")
	if err == nil {
		_, err = victim.Recv()
	}
	if err == nil || err == io.EOF {
		t.Fatalf("the call whose body read panicked: %v; want an error", err)
	}
	t.Logf("the call whose body read panicked: %v", err)
	if got := panicguard.Count(panicguard.RequestBody); got != before+1 {
		t.Fatalf("applistener_panics_total{where=request_body} = %v; want %v", got, before+1)
	}
	if err := echo(beside, "after"); err != nil {
		t.Fatalf("the call beside, after the panic: %v", err)
	}
	if _, err := c.UnaryCall(callCtx(t), &testpb.SimpleRequest{}); err != nil {
		t.Fatalf("a call after the panic: %v", err)
	}
	if got := only(); got != conn {
		t.Fatalf("%d app connections after the panic, the first one kept: %v; want it alone", pool.open(), got == conn)
	}
	expectPanicLines(t, logs, panicguard.RequestBody, `"sni":"`+h2cRPCHost+`"`)
}
