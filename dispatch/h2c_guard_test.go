package dispatch

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/testutil"
)

// TestPanicH2CReadClosesOnlyItsAppConnection: a panic in a read of an h2c
// app connection (net/http's read loop calls it) is recovered: counted
// in applistener_panics_total{where="h2c_read"}, logged with the app's
// address and the stack; that app connection closes, the route's next
// call dials a new one, and another h2c app's connection is untouched.
func TestPanicH2CReadClosesOnlyItsAppConnection(t *testing.T) {
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

	before := panicguard.Count(panicguard.H2CRead)
	rpcAddr := fmt.Sprintf("127.0.0.1:%d", e.ports["rpc"])
	var injected atomic.Int64
	restore := panicguard.SetTestHook(func(where, id string) {
		if where == panicguard.H2CRead && id == rpcAddr && injected.Add(1) == 1 {
			panic("injected panic at " + where)
		}
	})
	t.Cleanup(restore)
	// The read loop is waiting in a read: the answer to this call ends
	// that read, and the next one panics. The call itself may or may not
	// have its answer by then.
	_, _ = c.UnaryCall(callCtx(t), &testpb.SimpleRequest{})
	testutil.Eventually(t, 10*time.Second, "the read's panic counted", func() bool {
		return panicguard.Count(panicguard.H2CRead) >= before+1
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
	if got := panicguard.Count(panicguard.H2CRead); got != before+1 {
		t.Fatalf("applistener_panics_total{where=h2c_read} = %v; want %v", got, before+1)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	found := false
	for _, l := range logs.lines {
		if strings.Contains(l, `"where":"h2c_read"`) {
			found = true
			for _, want := range []string{`"app":"` + rpcAddr + `"`, `"stack":"goroutine `, "injected panic at h2c_read"} {
				if !strings.Contains(l, want) {
					t.Errorf("the panic's log line lacks %s: %s", want, l)
				}
			}
		}
	}
	if !found {
		t.Fatal("no panic log line of h2c_read")
	}
}
