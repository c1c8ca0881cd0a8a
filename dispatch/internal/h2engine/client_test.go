package h2engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// get fetches url with the transport and returns the response and body.
func get(t *testing.T, c *http.Client, method, url string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, url, err)
	}
	return resp, b
}

func newClient(s *testServer) (*http.Client, func()) {
	tr := s.transport()
	return &http.Client{Transport: tr}, tr.CloseIdleConnections
}

// TestTransportGetHead: Go's HTTP/2 client gets the handler's response,
// headers and body, over TLS; HEAD gets the headers only.
func TestTransportGetHead(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, true, Config{}, HandlerFunc(testHandler))
	c, done := newClient(s)
	defer done()
	resp, body := get(t, c, "GET", "https://"+s.addr+"/", nil)
	if resp.StatusCode != 200 || string(body) != testBody || resp.Header.Get("Content-Type") != "text/plain" || resp.ProtoMajor != 2 {
		t.Fatalf("GET: %d %q %v proto %d", resp.StatusCode, body, resp.Header, resp.ProtoMajor)
	}
	resp, body = get(t, c, "HEAD", "https://"+s.addr+"/", nil)
	if resp.StatusCode != 200 || len(body) != 0 || resp.ContentLength != int64(len(testBody)) {
		t.Fatalf("HEAD: %d %q length %d", resp.StatusCode, body, resp.ContentLength)
	}
}

// TestTransportLargeBodies: 3 MiB up and back (several windows of both
// the stream and the connection in each direction) and an 8 MiB response
// arrive intact.
func TestTransportLargeBodies(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, true, Config{}, HandlerFunc(testHandler))
	c, done := newClient(s)
	defer done()
	up := make([]byte, 3<<20)
	_, _ = rand.Read(up)
	resp, body := get(t, c, "POST", "https://"+s.addr+"/echo", bytes.NewReader(up))
	if resp.StatusCode != 200 || !bytes.Equal(body, up) {
		t.Fatalf("echo: %d, %d bytes back of %d", resp.StatusCode, len(body), len(up))
	}
	resp, body = get(t, c, "GET", "https://"+s.addr+"/size/8388608", nil)
	if resp.StatusCode != 200 || len(body) != 8<<20 {
		t.Fatalf("size: %d, %d bytes", resp.StatusCode, len(body))
	}
}

// TestTransportTrailers: request trailers reach the handler (Stream.Trailer)
// and response trailers reach the client.
func TestTransportTrailers(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, true, Config{}, HandlerFunc(testHandler))
	c, done := newClient(s)
	defer done()
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", "https://"+s.addr+"/echo", pr)
	req.Trailer = http.Header{"Grpc-Status": nil}
	go func() {
		_, _ = pw.Write([]byte("some body"))
		req.Trailer.Set("Grpc-Status", "7")
		_ = pw.Close()
	}()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || string(body) != "some body" {
		t.Fatalf("body %q, %v", body, err)
	}
	if got := resp.Trailer.Get("Grpc-Status"); got != "7" {
		t.Fatalf("response trailer grpc-status = %q, want 7 (trailers %v)", got, resp.Trailer)
	}
}

// TestTransportConcurrency: 100 concurrent requests, bodies up and down,
// multiplexed on one connection, all answered.
func TestTransportConcurrency(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, true, Config{}, HandlerFunc(testHandler))
	c, done := newClient(s)
	defer done()
	get(t, c, "GET", "https://"+s.addr+"/", nil) // the connection, before the burst
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := strings.Repeat(fmt.Sprint(i), 10000)
			resp, err := c.Post("https://"+s.addr+"/echo", "text/plain", strings.NewReader(want))
			if err != nil {
				errs <- err
				return
			}
			b, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil || string(b) != want {
				errs <- fmt.Errorf("request %d: %d bytes, %v", i, len(b), err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s.mu.Lock()
	n := len(s.conns)
	s.mu.Unlock()
	if n != 1 {
		t.Errorf("%d connections, want the requests multiplexed on 1", n)
	}
}

// TestClientCancelResetsStream: a client that cancels its request resets
// the stream: the handler's Done is closed and its AfterReset runs.
func TestClientCancelResetsStream(t *testing.T) {
	testutil.VerifyNone(t)
	entered := make(chan *Stream, 1)
	after := make(chan struct{})
	finished := make(chan error, 1)
	s := newTestServer(t, true, Config{}, HandlerFunc(func(st *Stream) {
		st.AfterReset(func() { close(after) })
		_ = st.WriteHeaders(200, nil, false)
		_ = st.Flush()
		entered <- st
		<-st.Done()
		finished <- st.Err()
	}))
	c, done := newClient(s)
	defer done()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+s.addr+"/", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	cancel()
	_ = resp.Body.Close()
	select {
	case err := <-finished:
		if !errors.Is(err, ErrStreamReset) {
			t.Fatalf("Err() = %v, want a stream reset", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never saw the reset")
	}
	<-after
}

// TestShutdownDrains: Shutdown sends GOAWAY, lets the running stream
// finish and then closes the connection (Serve returns).
func TestShutdownDrains(t *testing.T) {
	testutil.VerifyNone(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	s := newTestServer(t, true, Config{}, HandlerFunc(func(st *Stream) {
		entered <- struct{}{}
		<-release
		_ = st.WriteHeaders(200, nil, false)
		_ = st.WriteLast([]byte("drained"))
	}))
	c, done := newClient(s)
	defer done()
	got := make(chan string, 1)
	go func() {
		resp, err := c.Get("https://" + s.addr + "/")
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		got <- string(b)
	}()
	<-entered
	s.mu.Lock()
	conn := s.conns[0]
	s.mu.Unlock()
	conn.Shutdown()
	if s.served() != 0 {
		t.Fatal("the connection closed before its stream finished")
	}
	close(release)
	if b := <-got; b != "drained" {
		t.Fatalf("in-flight request got %q", b)
	}
	testutil.Eventually(t, 5*time.Second, "the drained connection to close", func() bool { return s.served() == 1 })
}

// TestCloseRevokes: Close ends the connection at once: a running stream's
// Done is closed and the client's request fails.
func TestCloseRevokes(t *testing.T) {
	testutil.VerifyNone(t)
	entered := make(chan struct{}, 1)
	s := newTestServer(t, true, Config{}, HandlerFunc(func(st *Stream) {
		_ = st.WriteHeaders(200, nil, false)
		_ = st.Flush()
		entered <- struct{}{}
		<-st.Done()
	}))
	c, done := newClient(s)
	defer done()
	resp, err := c.Get("https://" + s.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	s.mu.Lock()
	conn := s.conns[0]
	s.mu.Unlock()
	_ = conn.Close()
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("the body of a revoked connection read to a clean end")
	}
	_ = resp.Body.Close()
	testutil.Eventually(t, 5*time.Second, "Serve to return", func() bool { return s.served() == 1 })
}
