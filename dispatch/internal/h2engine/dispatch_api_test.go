package h2engine

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/testutil"
)

// The Stream and Conn behaviours dispatch relies on beyond a plain
// request: CloseRead (a WebSocket's end), SetReadTimeout (an idle
// WebSocket is no stalled body), ContentLength 0 for a request without a
// body, and Shutdown before Serve (a drain that races a new connection).

// apiHandler answers:
//
//	/length        the request's ContentLength
//	/closeread     the outcome of a Read after CloseRead, while the
//	               client's body is still open
//	/readtimeout   the outcome of a Read with SetReadTimeout(50ms)
func apiHandler(st *Stream) {
	var answer string
	switch st.Path {
	case "/length":
		answer = strconv.FormatInt(st.ContentLength, 10)
	case "/closeread":
		buf := make([]byte, 16)
		if _, err := io.ReadFull(st, buf[:1]); err != nil {
			answer = "first read: " + err.Error()
			break
		}
		done := make(chan error, 1)
		go func() {
			_, err := st.Read(buf)
			done <- err
		}()
		st.CloseRead()
		select {
		case err := <-done:
			if errors.Is(err, ErrReadClosed) {
				answer = "closed"
			} else {
				answer = "read: " + err.Error()
			}
		case <-time.After(5 * time.Second):
			answer = "Read still blocked after CloseRead"
		}
	case "/readtimeout":
		st.SetReadTimeout(50 * time.Millisecond)
		buf := make([]byte, 16)
		_, err := io.ReadFull(st, buf[:1])
		if err == nil {
			_, err = st.Read(buf)
		}
		switch {
		case errors.Is(err, ErrReadTimeout):
			answer = "timeout"
		case err == nil:
			answer = "read returned without error"
		default:
			answer = "read: " + err.Error()
		}
	}
	if st.WriteHeaders(200, nil, false) == nil {
		_ = st.WriteLast([]byte(answer))
	}
}

// openBody sends a request whose body stays open (one byte sent) and
// returns the response body.
func openBody(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	pr, pw := io.Pipe()
	defer func() { _ = pw.Close() }()
	go func() { _, _ = pw.Write([]byte("x")) }()
	c = &http.Client{Transport: c.Transport, Timeout: 10 * time.Second}
	req, err := http.NewRequest("POST", url, pr)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestStreamCloseReadAndReadTimeout: CloseRead ends a blocked Read with
// ErrReadClosed and the response can still be written and ended; a
// stream's SetReadTimeout bounds its reads when the connection sets none.
func TestStreamCloseReadAndReadTimeout(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, true, Config{}, HandlerFunc(apiHandler))
	c, done := newClient(s)
	defer done()
	if got := openBody(t, c, "https://"+s.addr+"/closeread"); got != "closed" {
		t.Errorf("after CloseRead: %q; want closed", got)
	}
	if got := openBody(t, c, "https://"+s.addr+"/readtimeout"); got != "timeout" {
		t.Errorf("with SetReadTimeout: %q; want timeout", got)
	}
}

// TestStreamContentLength: a request whose HEADERS end the stream has
// ContentLength 0; one with a body of unknown length has -1.
func TestStreamContentLength(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, true, Config{}, HandlerFunc(apiHandler))
	c, done := newClient(s)
	defer done()
	if _, body := get(t, c, "GET", "https://"+s.addr+"/length", nil); string(body) != "0" {
		t.Errorf("GET without a body: ContentLength %s; want 0", body)
	}
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write([]byte("abc")); _ = pw.Close() }()
	if _, body := get(t, c, "POST", "https://"+s.addr+"/length", pr); string(body) != "-1" {
		t.Errorf("POST of unknown length: ContentLength %s; want -1", body)
	}
}

// TestShutdownBeforeServe: a Shutdown called before Serve sends GOAWAY
// right after the server's SETTINGS (never before it), and the idle
// connection then closes.
func TestShutdownBeforeServe(t *testing.T) {
	testutil.VerifyNone(t)
	srv, cli := net.Pipe()
	c := NewConn(srv, Config{}, HandlerFunc(apiHandler))
	c.Shutdown()
	served := make(chan error, 1)
	go func() { served <- c.Serve() }()
	defer func() {
		_ = cli.Close()
		if err := <-served; err != nil {
			t.Logf("Serve: %v", err)
		}
	}()
	_ = cli.SetDeadline(time.Now().Add(5 * time.Second))
	go func() {
		_, _ = io.WriteString(cli, http2.ClientPreface)
		_ = http2.NewFramer(cli, nil).WriteSettings()
	}()
	fr := http2.NewFramer(nil, cli)
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		t.Fatalf("first frame %v; want the server's SETTINGS", f.Header())
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY before the connection ended: %v", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeNo {
				t.Fatalf("GOAWAY %v; want NO_ERROR", g.ErrCode)
			}
			break
		}
	}
	for {
		if _, err := fr.ReadFrame(); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) {
				break
			}
			t.Fatalf("after GOAWAY: %v; want the connection closed", err)
		}
	}
}
