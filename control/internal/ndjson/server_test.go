package ndjson

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// streamServer starts a real server on loopback running handler, over
// HTTP/2 (TLS, h2 negotiated) or HTTP/1.1 (TLS, HTTP/1.1 only), and a
// client for it.
func streamServer(t *testing.T, h2 bool, handler http.HandlerFunc) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewUnstartedServer(handler)
	srv.EnableHTTP2 = h2
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	client := srv.Client()
	tr := client.Transport.(*http.Transport).Clone()
	if !h2 {
		tr.ForceAttemptHTTP2 = false
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	client = &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	return srv, client
}

var protocols = []struct {
	name string
	h2   bool
	// major is the response's protocol major version.
	major int
}{{"HTTP/2", true, 2}, {"HTTP/1.1", false, 1}}

// A Send clears the deadline it set: a stream that stays quiet for longer
// than the send timeout after a Send is not reset (HTTP/2: the deadline's
// timer would reset the stream) and ends cleanly when its handler returns
// (HTTP/1.1: the deadline left behind would fail the last chunk, and the
// client would see the body cut). Both lines and a clean end reach a real
// client.
func TestStreamClearsDeadline(t *testing.T) {
	const sendTimeout = 500 * time.Millisecond
	const quiet = 3 * sendTimeout
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			sent := make(chan error, 2)
			srv, client := streamServer(t, p.h2, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Test", "kept")
				s := Start(w, sendTimeout)
				sent <- s.Send([]byte(`{"n":1}`), Newline)
				select {
				case <-time.After(quiet):
				case <-r.Context().Done():
					sent <- r.Context().Err()
					return
				}
				sent <- s.Send(KeepaliveLine)
				select {
				case <-time.After(quiet):
				case <-r.Context().Done():
				}
			})
			resp, err := client.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.ProtoMajor != p.major {
				t.Fatalf("served over HTTP/%d", resp.ProtoMajor)
			}
			for k, want := range map[string]string{"Content-Type": ContentType, "Cache-Control": "no-store",
				"X-Accel-Buffering": "no", "X-Test": "kept"} {
				if got := resp.Header.Get(k); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
			br := bufio.NewReader(resp.Body)
			for i, want := range []string{`{"n":1}` + "\n", string(KeepaliveLine)} {
				line, err := ReadLine(br, 1024)
				if err != nil || string(line) != want {
					t.Fatalf("line %d: %q, %v; want %q", i, line, err, want)
				}
				if err := <-sent; err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
				t.Fatalf("after the last line: %q, %v; want a clean end", rest, err)
			}
		})
	}
}

// A reader that does not read: Send fails at the send timeout (bounded
// here loosely, for a loaded machine: unbounded would hang to the loop's end),
// and TimedOut says so, over both protocols.
func TestStreamSendTimesOut(t *testing.T) {
	const sendTimeout = 300 * time.Millisecond
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			type result struct {
				err      error
				timedOut bool
				sends    int
				blocked  time.Duration
			}
			done := make(chan result, 1)
			srv, client := streamServer(t, p.h2, func(w http.ResponseWriter, r *http.Request) {
				s := Start(w, sendTimeout)
				line := []byte(strings.Repeat("x", 256<<10) + "\n")
				deadline := time.Now().Add(20 * time.Second)
				for n := 0; time.Now().Before(deadline); n++ {
					start := time.Now()
					if err := s.Send(line); err != nil {
						done <- result{err, s.TimedOut(err), n, time.Since(start)}
						return
					}
				}
				done <- result{}
			})
			resp, err := client.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			res := <-done
			if res.err == nil {
				t.Fatal("sends to a reader that reads nothing never failed")
			}
			if !res.timedOut {
				t.Errorf("TimedOut(%v) = false", res.err)
			}
			if res.blocked > 15*time.Second {
				t.Errorf("the failing send took %v; send timeout %v", res.blocked, sendTimeout)
			}
			t.Logf("%d sends of 256 KiB taken, then %v after %v", res.sends, res.err, res.blocked.Round(time.Millisecond))
		})
	}
}

// TimedOut is false for an error before the deadline that is not one.
func TestStreamTimedOutOnlyAfterDeadline(t *testing.T) {
	s := &Stream{deadline: time.Now().Add(time.Hour)}
	if s.TimedOut(errors.New("connection reset")) {
		t.Error("an early error counted as a timeout")
	}
	if s.TimedOut(nil) {
		t.Error("nil counted as a timeout")
	}
	s.deadline = time.Now().Add(-time.Millisecond)
	if !s.TimedOut(errors.New("stream reset")) {
		t.Error("an error after the deadline did not count as a timeout")
	}
}

// The mailbox holds the latest value only, wakes its stream once per
// burst, and ends once, keeping the first reason.
func TestMailbox(t *testing.T) {
	m := NewMailbox()
	if v, open := m.Take(); v != nil || !open {
		t.Fatalf("empty mailbox: %q, %v", v, open)
	}
	for _, v := range []string{"a", "b", "c"} {
		if !m.Post([]byte(v)) {
			t.Fatalf("Post(%s) on an open mailbox: false", v)
		}
	}
	select {
	case <-m.Posted():
	default:
		t.Fatal("Posted not ready after a post")
	}
	select {
	case <-m.Posted():
		t.Fatal("Posted ready twice for one burst")
	default:
	}
	if v, open := m.Take(); string(v) != "c" || !open {
		t.Fatalf("Take: %q, %v; want the latest, c", v, open)
	}
	if v, _ := m.Take(); v != nil {
		t.Fatalf("second Take: %q; want nothing", v)
	}
	m.Post([]byte("d"))
	if m.Ended() || m.Reason() != "" {
		t.Fatal("ended before End")
	}
	if !m.End("revoked") {
		t.Fatal("End of an open mailbox: false")
	}
	if m.End("closing") {
		t.Fatal("End twice: true")
	}
	select {
	case <-m.Done():
	default:
		t.Fatal("Done not closed by End")
	}
	if m.Reason() != "revoked" || !m.Ended() {
		t.Fatalf("reason %q; want the first, revoked", m.Reason())
	}
	if v, open := m.Take(); v != nil || open {
		t.Fatalf("Take after End: %q, %v; want nothing, closed", v, open)
	}
	if m.Post([]byte("e")) {
		t.Fatal("Post after End: true")
	}
}

// Posters and a taker at once (run with -race): the taker ends with the
// last value posted and never sees an older one after a newer.
func TestMailboxConcurrent(t *testing.T) {
	m := NewMailbox()
	const n = 2000
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 1; i <= n; i++ {
			m.Post([]byte{byte(i >> 8), byte(i)})
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	last := 0
	for last != n {
		select {
		case <-m.Posted():
		case <-ctx.Done():
			t.Fatalf("the last value never arrived; last taken %d", last)
		}
		v, _ := m.Take()
		if v == nil {
			continue
		}
		got := int(v[0])<<8 | int(v[1])
		if got <= last {
			t.Fatalf("took %d after %d", got, last)
		}
		last = got
	}
	wg.Wait()
	wg.Go(func() { m.End("done") })
	<-m.Done()
	wg.Wait()
}
