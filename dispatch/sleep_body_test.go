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
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/wake"
)

// sleepH1 is a raw HTTP/1.1 connection to route host of the sleep env.
type sleepH1 struct {
	net.Conn
	br *bufio.Reader
}

func (e *sleepEnv) rawH1(host string) *sleepH1 {
	e.t.Helper()
	c, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return &sleepH1{Conn: c, br: bufio.NewReader(c)}
}

func (c *sleepH1) send(t *testing.T, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

// read reads one response (a 1xx included) and its body, within 10 s.
func (c *sleepH1) read(t *testing.T) (*http.Response, string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	_ = resp.Body.Close()
	return resp, string(b)
}

// h2ExpectClient is an HTTP/2 client of the sleep env that sends a body
// with Expect: 100-continue only after the 100 (or a minute).
func (e *sleepEnv) h2ExpectClient() *http.Client {
	tr := &http.Transport{
		TLSClientConfig:       &tls.Config{RootCAs: e.ca.Pool()},
		ExpectContinueTimeout: time.Minute,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, e.ln.Addr().String())
		},
	}
	var p http.Protocols
	p.SetHTTP2(true)
	tr.Protocols = &p
	e.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// countingReader counts what the client's transport read of a body.
type countingReader struct {
	r    io.Reader
	mu   sync.Mutex
	read int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.mu.Lock()
	c.read += n
	c.mu.Unlock()
	return n, err
}

func (c *countingReader) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.read
}

func wantTooLarge(t *testing.T, status int, header http.Header, body, what string) {
	t.Helper()
	if status != 503 || body != `{"state":"starting","retry_after":2}` || header.Get("Retry-After") != "2" {
		t.Fatalf("%s: %d %q Retry-After %q; want 503 starting", what, status, body, header.Get("Retry-After"))
	}
}

// TestSleepBodyTooLargeToHold: a request that would be held but declares
// a body longer than maxHeldBody without Expect: 100-continue gets 503
// {"state":"starting"} at once, before any of its body is read, and
// starts the wake; a small body, declared or of unknown length (chunked,
// an HTTP/2 stream without content-length), is held and reaches the app
// whole; a large body with Expect: 100-continue is held without a 100,
// which the app sends once it is there, and then arrives whole. Both
// protocols.
func TestSleepBodyTooLargeToHold(t *testing.T) {
	e := newSleepEnv(t, 60, wake.Options{})
	big := bytes.Repeat([]byte("0123456789abcdef"), (1<<20)/16) // 1 MiB
	postHead := func(extra string) string {
		return "POST /upload HTTP/1.1\r\nHost: " + slpAPI + "\r\nContent-Type: application/octet-stream\r\n" + extra + "\r\n"
	}

	// Too large: answered at once, nothing read.
	start := time.Now()
	{
		c := e.rawH1(slpAPI)
		c.send(t, postHead(fmt.Sprintf("Content-Length: %d\r\n", len(big)))) // the head only: no body byte is sent
		resp, body := c.read(t)
		wantTooLarge(t, resp.StatusCode, resp.Header, body, "HTTP/1.1")
		if !resp.Close {
			t.Error("HTTP/1.1: the connection stays open with the body unread")
		}
	}
	h2 := e.client(true)
	for _, length := range []int64{int64(len(big)), maxHeldBody + 1} {
		pr, pw := io.Pipe() // nothing is ever written: no DATA is sent
		req, err := http.NewRequest("POST", "https://"+slpAPI+"/upload", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = length
		resp, err := h2.Do(req)
		if err != nil {
			t.Fatalf("HTTP/2 content-length %d: %v", length, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		_ = pw.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("answered over HTTP/%d", resp.ProtoMajor)
		}
		wantTooLarge(t, resp.StatusCode, resp.Header, string(b), fmt.Sprintf("HTTP/2 content-length %d", length))
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the too-large answers took %v; want them at once", d)
	}
	if got := e.wakes.Load(); got != 1 {
		t.Fatalf("%d wake calls, want 1 (a body too large to hold starts the wake)", got)
	}
	if got := e.coord.Held(); got != 0 {
		t.Fatalf("%d requests held, want none", got)
	}

	// Held: a small body, declared and of unknown length, and a large
	// one with Expect: 100-continue (HTTP/1.1 and HTTP/2 each).
	var wg sync.WaitGroup
	small := []byte("hello")
	h1Small := e.rawH1(slpAPI)
	h1Small.send(t, postHead(fmt.Sprintf("Content-Length: %d\r\n", len(small)))+string(small))
	h1Chunked := e.rawH1(slpAPI)
	h1Chunked.send(t, postHead("Transfer-Encoding: chunked\r\n")+"5\r\nhello\r\n0\r\n\r\n")
	h1Expect := e.rawH1(slpAPI)
	h1Expect.send(t, postHead(fmt.Sprintf("Content-Length: %d\r\nExpect: 100-continue\r\n", len(big))))
	h2Post := func(c *http.Client, body []byte, expect bool, length int64) *countingReader {
		cr := &countingReader{r: bytes.NewReader(body)}
		wg.Go(func() {
			req, err := http.NewRequest("POST", "https://"+slpAPI+"/upload", cr)
			if err != nil {
				t.Error(err)
				return
			}
			req.ContentLength = length
			if expect {
				req.Header.Set("Expect", "100-continue")
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Errorf("HTTP/2 held POST of %d bytes: %v", len(body), err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if want := fmt.Sprintf("got %d bytes", len(body)); resp.StatusCode != 200 || string(b) != want {
				t.Errorf("HTTP/2 held POST of %d bytes: %d %q, want 200 %q", len(body), resp.StatusCode, b, want)
			}
		})
		return cr
	}
	h2Post(h2, small, false, int64(len(small)))
	h2Post(h2, small, false, -1)
	h2Big := h2Post(e.h2ExpectClient(), big, true, int64(len(big)))
	testutil.Eventually(t, 10*time.Second, "6 requests held", func() bool { return e.coord.Held() == 6 })
	// Nothing answers the Expect while the instance sleeps: the client's
	// body stays with it.
	_ = h1Expect.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := h1Expect.br.Peek(1); !isTimeout(err) {
		t.Fatalf("HTTP/1.1 with Expect: bytes (or %v) while held; want none", err)
	}
	if n := h2Big.n(); n != 0 {
		t.Fatalf("the HTTP/2 client sent %d body bytes while held; want none before the 100", n)
	}
	e.wakeUp()
	resp, body := h1Small.read(t)
	if resp.StatusCode != 200 || body != "got 5 bytes" {
		t.Fatalf("HTTP/1.1 held small POST: %d %q", resp.StatusCode, body)
	}
	resp, body = h1Chunked.read(t)
	if resp.StatusCode != 200 || body != "got 5 bytes" {
		t.Fatalf("HTTP/1.1 held chunked POST: %d %q", resp.StatusCode, body)
	}
	resp, _ = h1Expect.read(t)
	if resp.StatusCode != 100 {
		t.Fatalf("HTTP/1.1 with Expect after the wake: %d, want 100 first", resp.StatusCode)
	}
	if _, err := h1Expect.Write(big); err != nil {
		t.Fatal(err)
	}
	resp, body = h1Expect.read(t)
	if want := fmt.Sprintf("got %d bytes", len(big)); resp.StatusCode != 200 || body != want {
		t.Fatalf("HTTP/1.1 with Expect: %d %q, want 200 %q", resp.StatusCode, body, want)
	}
	wg.Wait()
	if got := e.wakes.Load(); got != 1 {
		t.Fatalf("%d wake calls, want 1", got)
	}
}
