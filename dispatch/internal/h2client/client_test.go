package h2client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/testutil"
)

func field(fs []hpack.HeaderField, name string) string {
	for _, f := range fs {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// TestEchoWithTrailersBothWays: a request with a body and trailers
// reaches net/http's HTTP/2 server whole, and its response body and
// trailers come back; a never-indexed field arrives as sent.
func TestEchoWithTrailersBothWays(t *testing.T) {
	testutil.VerifyNone(t)
	p := startH2Server(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("X-Got-Id", r.Header.Get("X-Request-Id"))
		w.WriteHeader(200)
		_, _ = fmt.Fprintf(w, "%s|%s|%s", r.Method, body, r.Trailer.Get("X-Req-Trailer"))
		w.Header().Set("X-Sum", "42")
	}))
	c, _ := dial(t, p, Config{})
	for i := range 3 {
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write([]byte("hello "))
			_, _ = pw.Write([]byte("world"))
			_ = pw.Close()
		}()
		resp, err := do(t, c, testCtx(t), &Request{
			Method: "POST", Path: "/echo",
			Header: []hpack.HeaderField{{Name: "trailer", Value: "X-Req-Trailer"}, {Name: "x-request-id", Value: fmt.Sprint("id-", i), Sensitive: true}},
			Body:   pipeBody{pr},
			Trailer: func() []hpack.HeaderField {
				return []hpack.HeaderField{{Name: "x-req-trailer", Value: "t1"}}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		body, err := readAll(t, resp)
		if err != nil || resp.Status != 200 || string(body) != "POST|hello world|t1" {
			t.Fatalf("response %d %q %v", resp.Status, body, err)
		}
		if got := field(resp.Trailer, "x-sum"); got != "42" {
			t.Fatalf("trailers %v", resp.Trailer)
		}
		if got := field(resp.Header, "x-got-id"); got != fmt.Sprint("id-", i) {
			t.Fatalf("x-request-id at the app: %q", got)
		}
	}
	testutil.Eventually(t, 5*time.Second, "streams closed", func() bool { return c.InFlight() == 0 })
}

// TestHeadersAndBodyInOneWrite: a request whose body is at hand goes out
// as HEADERS and DATA (END_STREAM) in one write on the connection.
func TestHeadersAndBodyInOneWrite(t *testing.T) {
	testutil.VerifyNone(t)
	got := make(chan []string, 1)
	p := rawPeer(t, func(fr *http2.Framer, _ net.Conn) {
		var frames []string
	read:
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				frames = append(frames, fmt.Sprintf("HEADERS end=%v", f.StreamEnded()))
			case *http2.DataFrame:
				frames = append(frames, fmt.Sprintf("DATA %q end=%v", f.Data(), f.StreamEnded()))
				if f.StreamEnded() {
					break read
				}
			}
		}
		got <- frames
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200"), EndHeaders: true, EndStream: true})
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	})
	c, cc := dial(t, p, Config{})
	w0 := cc.writes.Load()
	body := newBufferedBody([]byte("\x00\x00\x00\x00\x05hello"))
	resp, err := do(t, c, testCtx(t), &Request{Method: "POST", Path: "/pkg.Svc/Call", Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(t, resp); err != nil || resp.Status != 200 {
		t.Fatalf("response %d %v", resp.Status, err)
	}
	frames := <-got
	if want := []string{"HEADERS end=false", `DATA "\x00\x00\x00\x00\x05hello" end=true`}; fmt.Sprint(frames) != fmt.Sprint(want) {
		t.Fatalf("frames %q, want %q", frames, want)
	}
	if n := cc.writes.Load() - w0; n != 1 {
		t.Fatalf("%d writes for HEADERS+DATA, want 1", n)
	}
	if !body.closed.Load() {
		t.Fatal("request body not closed")
	}
}

// TestGroupCommit: frames queued by many streams while a write is in
// progress go out in fewer writes than there are streams.
func TestGroupCommit(t *testing.T) {
	testutil.VerifyNone(t)
	p := startH2Server(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(w, r.Body)
	}))
	c, cc := dial(t, p, Config{})
	const calls = 200
	w0 := cc.writes.Load()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for range calls / 20 {
				resp, err := do(t, c, testCtx(t), &Request{Method: "POST", Body: newBufferedBody([]byte("ping"))})
				if err != nil {
					t.Error(err)
					return
				}
				if b, err := readAll(t, resp); err != nil || string(b) != "ping" {
					t.Errorf("echo %q %v", b, err)
				}
			}
		})
	}
	wg.Wait()
	writes := cc.writes.Load() - w0
	t.Logf("%d calls, %d writes (%.2f per call)", calls, writes, float64(writes)/calls)
	if writes > calls+calls/2 {
		t.Fatalf("%d writes for %d calls", writes, calls)
	}
}

// TestReadyStreamsShareOneWriteOnOneCore: on one core (GOMAXPROCS=1, as
// the benchmarks and small hosts run the listener), the request bodies of
// many streams that become readable at once (a client's batch of gRPC
// messages, woken by one read of the client's connection) reach the app
// in one or two writes, not one per stream: the first sender leaves the
// write to the control loop, which lets the other senders add their frames
// first. Up to five rounds: a preemption or a GC inside one could split
// it; writing at once splits every one (eight writes).
func TestReadyStreamsShareOneWriteOnOneCore(t *testing.T) {
	testutil.VerifyNone(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const streams, rounds = 8, 5
	data := make(chan uint32, streams*rounds)
	p := rawPeer(t, func(fr *http2.Framer, _ net.Conn) {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: block(":status", "200"), EndHeaders: true})
			case *http2.DataFrame:
				if len(f.Data()) > 0 {
					data <- f.StreamID
				}
			}
		}
	})
	c, cc := dial(t, p, Config{})
	gates := make([]chan struct{}, rounds)
	for i := range gates {
		gates[i] = make(chan struct{})
	}
	var resps []*Response
	for range streams {
		resp, err := do(t, c, testCtx(t), &Request{Method: "POST", Path: "/pkg.Svc/Stream", Body: &roundsBody{gates: gates, stop: make(chan struct{})}})
		if err != nil {
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
	defer func() {
		for _, r := range resps {
			_ = r.Body.Close()
		}
	}()
	var writes []int64
	for _, gate := range gates {
		w0 := cc.writes.Load()
		close(gate)
		for range streams {
			select {
			case <-data:
			case <-time.After(10 * time.Second):
				t.Fatalf("the peer got too few messages (writes so far %v)", writes)
			}
		}
		writes = append(writes, cc.writes.Load()-w0)
		if writes[len(writes)-1] <= 2 {
			return
		}
	}
	t.Fatalf("writes per round of %d messages ready at once: %v; want at most 2 in some round", streams, writes)
}

// roundsBody is a request body that sends one message per gate, once the
// gate is closed, and ends when closed.
type roundsBody struct {
	gates []chan struct{}
	next  int
	stop  chan struct{}
	once  sync.Once
}

func (b *roundsBody) Read(p []byte) (int, error) {
	if b.next == len(b.gates) {
		<-b.stop
		return 0, io.ErrClosedPipe
	}
	select {
	case <-b.gates[b.next]:
	case <-b.stop:
		return 0, io.ErrClosedPipe
	}
	b.next++
	return copy(p, "\x00\x00\x00\x00\x05hello"), nil
}

func (b *roundsBody) Close() error {
	b.once.Do(func() { close(b.stop) })
	return nil
}

// TestMultiplexBeyondMaxConcurrentStreams: with the peer allowing 2
// streams, Reserve refuses a third, WaitReserve waits for a slot, every
// request completes, and the peer never sees more than 2 at once.
func TestMultiplexBeyondMaxConcurrentStreams(t *testing.T) {
	testutil.VerifyNone(t)
	var active, most atomic.Int64
	release := make(chan struct{})
	p := startH2Server(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := active.Add(1)
		defer active.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		_, _ = io.WriteString(w, r.URL.Path)
	}))
	c, _ := dial(t, p, Config{})
	var wg sync.WaitGroup
	results := make(chan string, 6)
	for i := range 6 {
		wg.Go(func() {
			resp, err := do(t, c, testCtx(t), &Request{Path: fmt.Sprint("/", i)})
			if err != nil {
				t.Error(err)
				return
			}
			b, err := readAll(t, resp)
			if err != nil {
				t.Error(err)
			}
			results <- string(b)
		})
	}
	testutil.Eventually(t, 10*time.Second, "two streams at the peer", func() bool { return active.Load() == 2 })
	if c.Reserve() {
		c.Unreserve()
		t.Fatal("Reserve succeeded with the peer's 2 streams in use")
	}
	close(release)
	wg.Wait()
	close(results)
	seen := map[string]bool{}
	for r := range results {
		seen[r] = true
	}
	if len(seen) != 6 || most.Load() != 2 {
		t.Fatalf("answers %v, at most %d at once", seen, most.Load())
	}
	if !c.Reserve() {
		t.Fatal("no slot once the streams ended")
	}
	c.Unreserve()
}

// TestSlowReaderHoldsThePeerBack: a response nobody reads stops the peer
// after the stream's window (plus the server's own buffering); reading it
// then gets every byte.
func TestSlowReaderHoldsThePeerBack(t *testing.T) {
	testutil.VerifyNone(t)
	const total = 4 << 20
	var written atomic.Int64
	p := startH2Server(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := bytes.Repeat([]byte("x"), 4096)
		for written.Load() < total {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			written.Add(int64(len(chunk)))
		}
	}))
	const window = 64 << 10
	c, _ := dial(t, p, Config{StreamWindow: window, ConnWindow: 4 * window})
	resp, err := do(t, c, testCtx(t), &Request{Path: "/big"})
	if err != nil {
		t.Fatal(err)
	}
	last, quiet := int64(-1), time.Now()
	deadline := time.Now().Add(20 * time.Second)
	for time.Since(quiet) < time.Second {
		if time.Now().After(deadline) {
			t.Fatal("the peer's writes never stopped")
		}
		if n := written.Load(); n != last {
			last, quiet = n, time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	// net/http's server buffers a handler's 4 KiB write buffer and one
	// chunk ahead of flow control.
	if limit := int64(window + 32<<10); last > limit {
		t.Fatalf("the peer wrote %d bytes to a reader that took nothing, beyond %d", last, limit)
	}
	if got, _ := resp.Body.Buffered(); got > window {
		t.Fatalf("%d bytes buffered, beyond the window %d", got, window)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if err != nil || n != total {
		t.Fatalf("read %d bytes (%v), want %d", n, err, total)
	}
}

// TestCancelResetsTheStream: cancelling the request's context resets the
// stream; the peer's handler sees its request cancelled, and the slot is
// free again.
func TestCancelResetsTheStream(t *testing.T) {
	testutil.VerifyNone(t)
	arrived, cancelled := make(chan struct{}), make(chan struct{})
	p := startH2Server(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/head" {
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
		}
		close(arrived)
		<-r.Context().Done()
		close(cancelled)
	}))
	c, _ := dial(t, p, Config{})
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := do(t, c, ctx, &Request{Path: "/wait"})
		done <- err
	}()
	<-arrived
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RoundTrip after cancel: %v", err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the peer never saw the reset")
	}
	testutil.Eventually(t, 5*time.Second, "the slot freed", func() bool { return c.InFlight() == 0 })
}

// TestBodyCloseResetsTheStream: closing a response body before its end
// resets the stream (the peer's handler is cancelled).
func TestBodyCloseResetsTheStream(t *testing.T) {
	testutil.VerifyNone(t)
	cancelled := make(chan struct{})
	p := startH2Server(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		_, _ = w.Write([]byte("first"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
	}))
	c, _ := dial(t, p, Config{})
	resp, err := do(t, c, testCtx(t), &Request{})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the peer never saw the reset")
	}
	if _, err := resp.Body.Read(buf); err == nil {
		t.Fatal("read after Close succeeded")
	}
}

// TestGoAway: GOAWAY with last stream 1 fails stream 3 as not processed,
// lets stream 1 complete, and the connection takes no new streams, then
// closes when stream 1 ends.
func TestGoAway(t *testing.T) {
	testutil.VerifyNone(t)
	p := rawPeer(t, func(fr *http2.Framer, _ net.Conn) {
		for range 2 {
			if readUntilHeaders(fr) == nil {
				return
			}
		}
		_ = fr.WriteGoAway(1, http2.ErrCodeNo, nil)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200"), EndHeaders: true})
		_ = fr.WriteData(1, true, []byte("one"))
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	})
	var hooked atomic.Int64
	c, _ := dial(t, p, Config{StateHook: func(*Conn) { hooked.Add(1) }})
	type result struct {
		body string
		err  error
	}
	res := make([]chan result, 2)
	for i := range res {
		res[i] = make(chan result, 1)
		go func() {
			resp, err := do(t, c, testCtx(t), &Request{Path: fmt.Sprint("/", i)})
			if err != nil {
				res[i] <- result{err: err}
				return
			}
			b, err := readAll(t, resp)
			res[i] <- result{string(b), err}
		}()
		if i == 0 {
			testutil.Eventually(t, 5*time.Second, "stream 1 open", func() bool { return c.InFlight() == 1 })
		}
	}
	if r := <-res[0]; r.err != nil || r.body != "one" {
		t.Fatalf("stream 1: %+v", r)
	}
	if r := <-res[1]; !errors.Is(r.err, ErrNotProcessed) {
		t.Fatalf("stream 3: %+v, want ErrNotProcessed", r)
	}
	if c.Reserve() {
		t.Fatal("Reserve after GOAWAY")
	}
	if !errors.Is(c.Err(), ErrGoAway) {
		t.Fatalf("Err() = %v", c.Err())
	}
	testutil.Eventually(t, 5*time.Second, "the state hook", func() bool { return hooked.Load() == 1 })
}

// TestPingTimeout: a peer that stops answering (a frozen app) is found by
// PING: the request fails with ErrPingTimeout and the connection closes.
func TestPingTimeout(t *testing.T) {
	testutil.VerifyNone(t)
	p := rawPeer(t, func(fr *http2.Framer, c net.Conn) {
		_ = readUntilHeaders(fr)
		// Frozen: reads nothing more, answers nothing, until closed.
		b := make([]byte, 1)
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, _ = c.Read(b[:0])
		<-time.After(0)
		_, _ = io.Copy(io.Discard, c)
	})
	c, _ := dial(t, p, Config{ReadIdleTimeout: 200 * time.Millisecond, PingTimeout: 300 * time.Millisecond})
	start := time.Now()
	_, err := do(t, c, testCtx(t), &Request{})
	if !errors.Is(err, ErrPingTimeout) {
		t.Fatalf("request to a frozen peer: %v, want ErrPingTimeout", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("found after %v", d)
	}
	if c.Reserve() {
		t.Fatal("Reserve on a dead connection")
	}
}

// TestIdleTimeout: a connection without streams closes itself.
func TestIdleTimeout(t *testing.T) {
	testutil.VerifyNone(t)
	p := startH2Server(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	c, _ := dial(t, p, Config{IdleTimeout: 200 * time.Millisecond})
	resp, err := do(t, c, testCtx(t), &Request{})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = readAll(t, resp)
	testutil.Eventually(t, 10*time.Second, "the idle connection closed", func() bool { return errors.Is(c.Err(), ErrIdle) })
}

// TestMalformedFromThePeer: a peer breaking HTTP/2 fails the request with
// a ProtocolError (the stream's or the connection's), never a panic or a
// hang.
func TestMalformedFromThePeer(t *testing.T) {
	testutil.VerifyNone(t)
	cases := map[string]func(fr *http2.Framer){
		"no status": func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("content-type", "x"), EndHeaders: true, EndStream: true})
		},
		"uppercase name": func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200", "BAD", "x"), EndHeaders: true, EndStream: true})
		},
		"data before headers": func(fr *http2.Framer) { _ = fr.WriteData(1, true, []byte("x")) },
		"data on stream 0":    func(fr *http2.Framer) { _ = fr.WriteData(0, true, []byte("x")) },
		"headers on an idle stream": func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 9, BlockFragment: block(":status", "200"), EndHeaders: true})
		},
		"push promise": func(fr *http2.Framer) {
			_ = fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: block(":method", "GET"), EndHeaders: true})
		},
		"broken hpack": func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff}, EndHeaders: true})
		},
		"window overflow": func(fr *http2.Framer) { _ = fr.WriteWindowUpdate(0, 1<<31-1) },
		"body longer than content-length": func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200", "content-length", "2"), EndHeaders: true})
			_ = fr.WriteData(1, true, []byte("toolong"))
		},
		"beyond the stream window": func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200"), EndHeaders: true})
			chunk := make([]byte, 16384)
			for range 5 {
				_ = fr.WriteData(1, false, chunk)
			}
		},
		"trailers without end": func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200"), EndHeaders: true})
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("x", "y"), EndHeaders: true})
		},
		"huge header list": func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200", "x-big", strings.Repeat("a", 15000)), EndHeaders: true})
		},
	}
	for name, script := range cases {
		t.Run(name, func(t *testing.T) {
			refused := make(chan struct{}) // the client's RST_STREAM, GOAWAY or close
			p := rawPeer(t, func(fr *http2.Framer, _ net.Conn) {
				if readUntilHeaders(fr) == nil {
					return
				}
				script(fr)
				defer close(refused)
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					switch f.(type) {
					case *http2.RSTStreamFrame, *http2.GoAwayFrame:
						return
					}
				}
			})
			c, _ := dial(t, p, Config{StreamWindow: 65535, MaxResponseHeaderBytes: 8 << 10})
			resp, err := do(t, c, testCtx(t), &Request{})
			if err == nil {
				// Read the body only once the client has refused what the
				// peer sent: reading returns window credit, and the client
				// may take it as sent after that credit if it reads first.
				select {
				case <-refused:
				case <-time.After(10 * time.Second):
					t.Fatal("the client sent no RST_STREAM or GOAWAY and did not close")
				}
				_, err = readAll(t, resp)
			}
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T), want a ProtocolError", err, err)
			}
			t.Logf("%v", err)
		})
	}
}

// TestWriteTimeout: a peer that opens its windows wide and then reads
// nothing makes the writes stall; after WriteTimeout without progress the
// connection closes and the request body fails.
func TestWriteTimeout(t *testing.T) {
	testutil.VerifyNone(t)
	stop := make(chan struct{})
	p := rawPeer(t, func(fr *http2.Framer, c net.Conn) {
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
		_ = fr.WriteWindowUpdate(0, 1<<31-1-65535)
		if readUntilHeaders(fr) == nil {
			return
		}
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200"), EndHeaders: true})
		// ... and reads nothing more until the test ends.
		<-stop
	})
	defer close(stop)
	c, _ := dial(t, p, Config{WriteTimeout: 300 * time.Millisecond})
	pr, pw := io.Pipe()
	resp, err := do(t, c, testCtx(t), &Request{Method: "POST", Body: pipeBody{pr}})
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	start := time.Now()
	for {
		if _, err := pw.Write(chunk); err != nil {
			break // the stream ended: the body was closed
		}
		if time.Since(start) > 20*time.Second {
			t.Fatal("writes to a peer that reads nothing never failed")
		}
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("the response ended cleanly on a dead connection")
	}
	if c.Err() == nil {
		t.Fatal("the connection is still usable")
	}
	t.Logf("failed after %v: %v", time.Since(start), c.Err())
}

// TestSendWithinThePeersWindows: a request body never goes beyond the
// peer's stream window; the rest follows its WINDOW_UPDATEs.
func TestSendWithinThePeersWindows(t *testing.T) {
	testutil.VerifyNone(t)
	const window, total = 1000, 10000
	type step struct {
		n   int
		end bool
	}
	got := make(chan step, 64)
	more := make(chan struct{})
	p := rawPeer(t, func(fr *http2.Framer, _ net.Conn) {
		if readUntilHeaders(fr) == nil {
			return
		}
		n := 0
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			d, ok := f.(*http2.DataFrame)
			if !ok {
				continue
			}
			n += len(d.Data())
			got <- step{n, d.StreamEnded()}
			if n == window {
				<-more
				_ = fr.WriteWindowUpdate(1, total-window)
			}
			if d.StreamEnded() {
				break
			}
		}
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200"), EndHeaders: true, EndStream: true})
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	c, _ := dial(t, p, Config{})
	done := make(chan error, 1)
	go func() {
		resp, err := do(t, c, testCtx(t), &Request{Method: "POST", Body: newBufferedBody(make([]byte, total))})
		if err == nil {
			_, err = readAll(t, resp)
		}
		done <- err
	}()
	last := step{}
	for last.n < window {
		last = <-got
	}
	if last.n != window {
		t.Fatalf("the peer got %d bytes with a window of %d", last.n, window)
	}
	// Nothing more comes without window.
	select {
	case s := <-got:
		t.Fatalf("%d bytes sent beyond the window", s.n)
	case <-time.After(300 * time.Millisecond):
	}
	close(more)
	for !last.end {
		last = <-got
	}
	if last.n != total {
		t.Fatalf("the peer got %d bytes in all, want %d", last.n, total)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestCloseEndsEveryStream: closing the connection (a route revoked)
// fails the streams in flight, the one still sending its body included,
// and leaves no goroutine behind.
func TestCloseEndsEveryStream(t *testing.T) {
	testutil.VerifyNone(t)
	arrived := make(chan struct{}, 2)
	p := startH2Server(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	c, _ := dial(t, p, Config{})
	pr, pw := io.Pipe()
	defer func() { _ = pw.Close() }()
	var resps [2]*Response
	for i, body := range []io.ReadCloser{nil, pipeBody{pr}} {
		resp, err := do(t, c, testCtx(t), &Request{Method: "POST", Body: body})
		if err != nil {
			t.Fatal(err)
		}
		resps[i] = resp
		<-arrived
	}
	_ = c.Close()
	for i, resp := range resps {
		if _, err := io.ReadAll(resp.Body); !errors.Is(err, ErrConnClosed) {
			t.Fatalf("stream %d after Close: %v, want ErrConnClosed", i, err)
		}
		_ = resp.Body.Close()
	}
	if c.Reserve() {
		t.Fatal("Reserve on a closed connection")
	}
}

// TestPanicInReadLoop: a panic while the read loop handles a frame (mu
// held) is recovered: Config.OnPanic sees it, the connection closes with
// ErrPanicked, its stream fails, and mu is free (Err, Reserve and Close
// return); the process goes on.
func TestPanicInReadLoop(t *testing.T) {
	testutil.VerifyNone(t)
	more := make(chan struct{})
	p := startH2Server(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-more:
			_, _ = w.Write([]byte("x"))
		case <-r.Context().Done():
		}
	}))
	var seen atomic.Value
	c, _ := dial(t, p, Config{OnPanic: func(r any) { seen.Store(fmt.Sprint(r)) }})
	resp, err := do(t, c, testCtx(t), &Request{})
	if err != nil {
		t.Fatal(err)
	}
	addr := p.ln.Addr().String()
	var injected atomic.Int64
	restore := panicguard.SetTestHook(func(where, id string) {
		if where == panicguard.H2CConn && id == addr && injected.Add(1) == 1 {
			panic("injected panic in the read loop")
		}
	})
	defer restore()
	close(more) // the DATA frame that follows is handled with the hook set
	read := make(chan error, 1)
	go func() {
		_, err := readAll(t, resp)
		read <- err
	}()
	select {
	case err = <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not fail after the read loop's panic (mu left held?)")
	}
	if !errors.Is(err, ErrPanicked) {
		t.Fatalf("the stream's body: %v; want ErrPanicked", err)
	}
	if got, _ := seen.Load().(string); got != "injected panic in the read loop" {
		t.Fatalf("OnPanic saw %q", got)
	}
	done := make(chan error, 1)
	go func() {
		// Each of these takes mu: a mutex left held by the panic hangs here.
		if c.Reserve() {
			done <- errors.New("Reserve on a connection closed by a panic")
			return
		}
		done <- c.Err()
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrPanicked) {
			t.Fatalf("connection error %v; want ErrPanicked", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the connection's mutex is still held after the panic")
	}
}

// TestTimersNearZero: health and idle timers that fire before NewConn has
// stored them (a timeout of a nanosecond) find them stored (no nil timer,
// no race) and do their work.
func TestTimersNearZero(t *testing.T) {
	testutil.VerifyNone(t)
	p := startH2Server(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for range 20 {
		c, _ := dial(t, p, Config{ReadIdleTimeout: time.Nanosecond, PingTimeout: time.Nanosecond, IdleTimeout: time.Nanosecond})
		testutil.Eventually(t, 10*time.Second, "the connection closed by a timer", func() bool { return c.Err() != nil })
		_ = c.Close()
	}
}
