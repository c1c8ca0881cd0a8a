package dispatch

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Live streams: an app's events reach the client as the app writes them,
// over HTTP/1.1 and HTTP/2, whether the app frames them chunked or
// delimits the body by closing; and a stream lasting longer than every
// timeout of the listener, with a silence longer than the body timeout in
// it, keeps flowing.

const (
	sseEvents = 12                     // events per stream
	sseEvery  = 100 * time.Millisecond // the app writes one every 100 ms ...
	sseBigAt  = 8                      // ... this one, 64 KiB, after a silence of sseQuiet
	sseQuiet  = 1200 * time.Millisecond
	// sseTimeout is the listener's body timeout: shorter than the stream,
	// and than its silence.
	sseTimeout = 500 * time.Millisecond
	// sseHeadTimeout is the listener's idle and response-head timeout:
	// shorter than the stream (at least 2.3 s), yet long enough for the
	// app's head to arrive on a loaded CI machine under -race, where
	// 500 ms was not (504).
	sseHeadTimeout = 2 * time.Second
)

// sseEvent is the text of event i.
func sseEvent(i int) string {
	if i == sseBigAt {
		return "id: " + strconv.Itoa(i) + "\ndata: " + strings.Repeat("x", 64<<10) + "\n\n"
	}
	return fmt.Sprintf("id: %d\ndata: tick %d\n\n", i, i)
}

// sseApp writes sseEvents events, one every sseEvery, each only once the
// client has acknowledged the one before on ack: an event held by the
// listener is never acknowledged and the stream stops there. mode frames
// the body: "chunked" (net/http, flushed after each event), "close" (no
// length, the body ends when the app closes), "split" (chunked by hand,
// each chunk's closing CRLF sent only with the next chunk).
func sseApp(mode string, ack <-chan int, stop <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var write func(s string) error
		var end func()
		switch mode {
		case "chunked":
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			w.WriteHeader(http.StatusOK)
			write = func(s string) error {
				if _, err := io.WriteString(w, s); err != nil {
					return err
				}
				return http.NewResponseController(w).Flush()
			}
			end = func() {}
		default:
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer func() { _ = conn.Close() }()
			h := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
			if mode == "split" {
				h += "Transfer-Encoding: chunked\r\n"
			}
			if _, err := io.WriteString(conn, h+"\r\n"); err != nil {
				return
			}
			first := true
			write = func(s string) error {
				if mode == "split" {
					prefix := "\r\n"
					if first {
						prefix = ""
					}
					first = false
					s = prefix + strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s
				}
				_, err := io.WriteString(conn, s)
				return err
			}
			end = func() {
				if mode == "split" {
					_, _ = io.WriteString(conn, "\r\n0\r\n\r\n")
				}
			}
		}
		for i := range sseEvents {
			if i > 0 {
				select {
				case got := <-ack:
					if got != i-1 {
						return
					}
				case <-stop:
					return
				}
			}
			pace := sseEvery
			if i == sseBigAt {
				pace = sseQuiet
			}
			select {
			case <-time.After(pace):
			case <-stop:
				return
			}
			if write(sseEvent(i)) != nil {
				return
			}
		}
		end()
	})
}

// readSSEEvent reads one event (lines up to an empty line).
func readSSEEvent(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\n" {
			return b.String(), nil
		}
	}
}

// TestLiveStreamEventsArriveAsWritten drives an event stream lock-step:
// the app writes an event only after the client has received the one
// before, so a listener that holds an event (coalescing writes, waiting
// for more bytes or for the end of a chunk) stops the stream and fails
// the test, with no timing assertion. The stream outlives the listener's
// body, idle and response-head timeouts and is silent for longer than the
// body timeout before a 64 KiB event, which must still arrive.
func TestLiveStreamEventsArriveAsWritten(t *testing.T) {
	h2Verify(t)
	for _, proto := range protocols {
		for _, mode := range []string{"chunked", "close", "split"} {
			t.Run(proto+"/"+mode, func(t *testing.T) {
				t.Parallel()
				ack := make(chan int)
				stop := make(chan struct{})
				p := newAppProxy(t, Config{BodyTimeout: sseTimeout, IdleTimeout: sseHeadTimeout, ResponseHeaderTimeout: sseHeadTimeout}, sseApp(mode, ack, stop))
				t.Cleanup(func() { close(stop) })
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, "GET", "https://"+testHost+"/events", nil)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				resp, err := p.client(proto).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = resp.Body.Close() }()
				checkProto(t, resp, proto)
				if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
					t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
				}
				type read struct {
					ev  string
					err error
				}
				events := make(chan read, sseEvents+1)
				go func() {
					br := bufio.NewReader(resp.Body)
					for {
						ev, err := readSSEEvent(br)
						events <- read{ev, err}
						if err != nil {
							return
						}
					}
				}()
				for i := range sseEvents {
					select {
					case r := <-events:
						if r.err != nil {
							t.Fatalf("event %d: the stream ended: %v (after %v)", i, r.err, time.Since(start))
						}
						if r.ev != sseEvent(i) {
							t.Fatalf("event %d: got %.60q; want %.60q", i, r.ev, sseEvent(i))
						}
					case <-time.After(10 * time.Second):
						t.Fatalf("event %d did not reach the client, though the app wrote it and waits for it to arrive", i)
					}
					if i < sseEvents-1 {
						ack <- i
					}
				}
				if d := time.Since(start); d < sseQuiet+sseTimeout || d < sseHeadTimeout {
					t.Fatalf("the stream lasted %v; the test needs it longer than the timeouts", d)
				}
				// The app ended the body: so does the client's copy.
				select {
				case r := <-events:
					if r.err != io.EOF || r.ev != "" {
						t.Errorf("after the last event: %q, %v; want the end of the body", r.ev, r.err)
					}
				case <-time.After(10 * time.Second):
					t.Error("the body did not end after the app ended it")
				}
			})
		}
	}
}
