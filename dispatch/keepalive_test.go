package dispatch

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// TestKeepAliveYieldsBeforeNextRead: after each response on a keep-alive
// connection, the serving goroutine yields once before it reads the next
// request (keepalive.go), but not while a pipelined request is already
// buffered: that one is served at once. Every request is answered. The
// yield is replaced by a send the test receives, so the server waits in
// it until the test has seen it.
func TestKeepAliveYieldsBeforeNextRead(t *testing.T) {
	yielded, stop := make(chan struct{}), make(chan struct{})
	saved := keepAliveYield
	keepAliveYield = func() {
		select {
		case yielded <- struct{}{}:
		case <-stop:
		}
	}
	t.Cleanup(func() { keepAliveYield = saved })
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	t.Cleanup(func() { close(stop) }) // first: no yield waits for the test any more
	c := e.h1("team--demo--web." + h2Domain)

	waitYield := func(what string) {
		t.Helper()
		select {
		case <-yielded:
		case <-time.After(5 * time.Second):
			t.Fatalf("no yield %s", what)
		}
	}
	for i := range 3 {
		if st, _, _ := c.do(t, idleGet); st != http.StatusOK {
			t.Fatalf("request %d: status %d", i, st)
		}
		waitYield("after a response")
	}

	// Two requests in one write: the first answer is followed by the
	// buffered second request without a yield (a yield would wait for
	// this test, which takes none until both answers are in), the second
	// by one.
	if _, err := io.WriteString(c.conn, idleGet+idleGet); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() {
		for range 2 {
			resp, err := http.ReadResponse(c.br, nil)
			if err != nil {
				answered <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		answered <- nil
	}()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("pipelined responses: %v", err)
		}
	case <-time.After(3 * time.Second):
		// The server waits in a yield this test does not take.
		t.Fatal("no second answer: yielded while a pipelined request was buffered")
	}
	waitYield("after the pipelined pair")
	if st, _, _ := c.do(t, idleGet); st != http.StatusOK {
		t.Fatalf("request after the pair: status %d", st)
	}
	waitYield("after the last response")
}
