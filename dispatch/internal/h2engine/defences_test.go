package h2engine

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/internal/testutil"
)

// rawClient speaks HTTP/2 frames to a plain-TCP test server (prior
// knowledge), for the cases no well-behaved client produces.
type rawClient struct {
	t    *testing.T
	nc   *net.TCPConn
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
}

func dialRaw(t *testing.T, s *testServer, settings ...http2.Setting) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	c := &rawClient{t: t, nc: nc.(*net.TCPConn)}
	c.fr = http2.NewFramer(nc, nc)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	if _, err := io.WriteString(nc, clientPreface); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	return c
}

// block encodes a GET of path and the extra name/value pairs.
func (c *rawClient) block(path string, extra ...string) []byte {
	c.hbuf.Reset()
	fields := []string{":method", "GET", ":scheme", "http", ":authority", "localhost", ":path", path}
	for i := 0; i+1 < len(fields); i += 2 {
		_ = c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	for i := 0; i+1 < len(extra); i += 2 {
		_ = c.enc.WriteField(hpack.HeaderField{Name: extra[i], Value: extra[i+1], Sensitive: true})
	}
	return append([]byte(nil), c.hbuf.Bytes()...)
}

func (c *rawClient) request(id uint32, path string, endStream bool, extra ...string) {
	c.t.Helper()
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block(path, extra...), EndStream: endStream, EndHeaders: true})
	if err != nil {
		c.t.Fatal(err)
	}
}

// waitFor reads frames until match accepts one; it fails the test when
// the connection ends or within passes first.
func (c *rawClient) waitFor(within time.Duration, what string, match func(http2.Frame) bool) http2.Frame {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(within))
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("waiting for %s: %v", what, err)
		}
		if match(f) {
			return f
		}
	}
}

// waitGoAway waits for a GOAWAY with code.
func (c *rawClient) waitGoAway(code http2.ErrCode) *http2.GoAwayFrame {
	c.t.Helper()
	f := c.waitFor(10*time.Second, "GOAWAY "+code.String(), func(f http2.Frame) bool {
		_, ok := f.(*http2.GoAwayFrame)
		return ok
	}).(*http2.GoAwayFrame)
	if f.ErrCode != code {
		c.t.Fatalf("GOAWAY %v (%q), want %v", f.ErrCode, f.DebugData(), code)
	}
	return f
}

// waitRST waits for RST_STREAM on id and returns its code.
func (c *rawClient) waitRST(id uint32) http2.ErrCode {
	c.t.Helper()
	return c.waitFor(10*time.Second, "RST_STREAM", func(f http2.Frame) bool {
		r, ok := f.(*http2.RSTStreamFrame)
		return ok && r.StreamID == id
	}).(*http2.RSTStreamFrame).ErrCode
}

// waitClosed reads until the server closes the connection.
func (c *rawClient) waitClosed() {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c.nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatal("the server did not close the connection")
	}
}

func blockHandler(st *Stream) { <-st.Done() }

// TestRapidReset: a client opening streams and resetting them at once
// (CVE-2023-44487) empties the reset bucket and gets GOAWAY
// ENHANCE_YOUR_CALM.
func TestRapidReset(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{}, HandlerFunc(blockHandler))
	c := dialRaw(t, s)
	block := c.block("/")
	go func() {
		for id := uint32(1); id < 4000; id += 2 {
			if c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}) != nil ||
				c.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
				return
			}
		}
	}()
	c.waitGoAway(http2.ErrCodeEnhanceYourCalm)
	if len(s.eventsWith("rapid reset")) != 1 {
		t.Fatalf("events %v", s.events)
	}
}

// TestContinuationFlood: a header block that never ends, in many empty
// CONTINUATION frames or in too many bytes, closes the connection with
// ENHANCE_YOUR_CALM instead of being buffered.
func TestContinuationFlood(t *testing.T) {
	// Valid HPACK: fields never indexed, about 12 KiB.
	var fields bytes.Buffer
	enc := hpack.NewEncoder(&fields)
	for range 12 {
		_ = enc.WriteField(hpack.HeaderField{Name: "x-filler", Value: strings.Repeat("0123456789abcdef", 64), Sensitive: true})
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		cfg   Config
	}{
		{"frames", nil, Config{}},
		{"bytes", fields.Bytes(), Config{MaxHeaderBlockFrames: 10000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.VerifyNone(t)
			s := newTestServer(t, false, tc.cfg, HandlerFunc(testHandler))
			c := dialRaw(t, s)
			frag := c.block("/")
			go func() {
				if c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: frag}) != nil {
					return
				}
				for range 5000 {
					if c.fr.WriteContinuation(1, false, tc.frame) != nil {
						return
					}
				}
			}()
			c.waitGoAway(http2.ErrCodeEnhanceYourCalm)
			if len(s.eventsWith("CONTINUATION flood")) != 1 {
				t.Fatalf("events %v", s.events)
			}
		})
	}
}

// floodTest sends frames from send without reading anything back, to a
// server whose writes block early; the queued answers must hit the bound
// (ENHANCE_YOUR_CALM, the connection closed).
func floodTest(t *testing.T, send func(fr *http2.Framer) error) {
	testutil.VerifyNone(t)
	// A small control-frame bound: the queue overflows soon after the
	// socket buffers fill, before the client's writes can stall on a
	// closed TCP window (a loaded machine made that take over 10 s).
	s := newTestServer(t, false, Config{MaxControlFrames: 32}, HandlerFunc(testHandler), withSndBuf(4096))
	c := dialRaw(t, s)
	_ = c.nc.SetReadBuffer(4096)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if send(c.fr) != nil {
				return
			}
		}
	}()
	testutil.Eventually(t, 10*time.Second, "the flood to be refused", func() bool {
		return len(s.eventsWith("SETTINGS or PING flood")) == 1
	})
	c.waitClosed()
}

// TestSettingsFlood: SETTINGS frames whose acknowledgements are never read.
func TestSettingsFlood(t *testing.T) {
	floodTest(t, func(fr *http2.Framer) error { return fr.WriteSettings() })
}

// TestPingFlood: PINGs whose answers are never read.
func TestPingFlood(t *testing.T) {
	floodTest(t, func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{1}) })
}

// TestZeroWindowStall: a client that gives a stream no window gets the
// stream reset after WriteTimeout (the handler's Write returns
// ErrWriteTimeout); the connection stays usable.
func TestZeroWindowStall(t *testing.T) {
	testutil.VerifyNone(t)
	werr := make(chan error, 1)
	s := newTestServer(t, false, Config{WriteTimeout: 300 * time.Millisecond}, HandlerFunc(func(st *Stream) {
		if st.Path != "/stall" {
			testHandler(st)
			return
		}
		_ = st.WriteHeaders(200, nil, false)
		_, err := st.Write(make([]byte, 100))
		werr <- err
	}))
	c := dialRaw(t, s, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	c.request(1, "/stall", true)
	if code := c.waitRST(1); code != http2.ErrCodeCancel {
		t.Fatalf("RST_STREAM %v, want CANCEL", code)
	}
	if err := <-werr; !errors.Is(err, ErrWriteTimeout) {
		t.Fatalf("Write: %v, want ErrWriteTimeout", err)
	}
	if len(s.eventsWith("no flow-control window")) != 1 {
		t.Fatalf("events %v", s.events)
	}
	// A HEAD needs no window: the connection still answers.
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: c.block("/"), EndStream: true, EndHeaders: true})
	c.waitFor(5*time.Second, "a response on stream 3", func(f http2.Frame) bool { return f.Header().StreamID == 3 })
}

// TestWriteTimeout: a client that reads nothing while the server has a
// response to send loses its connection after WriteTimeout.
func TestWriteTimeout(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{WriteTimeout: 300 * time.Millisecond}, HandlerFunc(testHandler), withSndBuf(4096))
	c := dialRaw(t, s, http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxWindow})
	_ = c.nc.SetReadBuffer(4096)
	_ = c.fr.WriteWindowUpdate(0, maxWindow-initialWindow)
	c.request(1, "/size/100000000", true)
	testutil.Eventually(t, 10*time.Second, "the write timeout", func() bool { return len(s.eventsWith("write timeout")) == 1 })
	c.waitClosed()
}

// TestHeaderTimeout: a header block left unfinished closes the connection
// after HeaderTimeout (reported); a connection that simply opens no
// stream is closed without a report.
func TestHeaderTimeout(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{HeaderTimeout: 300 * time.Millisecond}, HandlerFunc(testHandler))
	c := dialRaw(t, s)
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block("/")}); err != nil {
		t.Fatal(err)
	}
	c.waitClosed()
	if len(s.eventsWith("request header timeout")) != 1 {
		t.Fatalf("events %v", s.events)
	}
	idle := dialRaw(t, s)
	idle.waitClosed()
	if len(s.eventsWith("request header timeout")) != 1 {
		t.Fatalf("an idle connection was reported: %v", s.events)
	}
	// A whole request within the timeout is served, and the connection
	// then stays open past it.
	ok := dialRaw(t, s)
	ok.request(1, "/", true)
	ok.waitFor(5*time.Second, "the response", func(f http2.Frame) bool {
		return f.Header().StreamID == 1 && f.Header().Flags.Has(http2.FlagDataEndStream)
	})
	_ = ok.nc.SetReadDeadline(time.Now().Add(600 * time.Millisecond))
	if _, err := ok.fr.ReadFrame(); err == nil || !isTimeout(err) {
		t.Fatalf("after a complete request: %v, want the connection left open", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestMaxConcurrentStreams: a stream beyond the limit is refused.
func TestMaxConcurrentStreams(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{MaxConcurrentStreams: 2}, HandlerFunc(blockHandler))
	c := dialRaw(t, s)
	for id := uint32(1); id <= 5; id += 2 {
		c.request(id, "/block", true)
	}
	if code := c.waitRST(5); code != http2.ErrCodeRefusedStream {
		t.Fatalf("RST_STREAM %v, want REFUSED_STREAM", code)
	}
}

// TestHeaderListTooLarge: a request over MaxHeaderListSize is answered
// 431 on its stream; the connection goes on.
func TestHeaderListTooLarge(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{MaxHeaderListSize: 4096}, HandlerFunc(testHandler))
	c := dialRaw(t, s)
	c.request(1, "/", true, "cookie", strings.Repeat("a", 8000))
	f := c.waitFor(5*time.Second, "the 431", func(f http2.Frame) bool { return f.Header().StreamID == 1 }).(*http2.MetaHeadersFrame)
	if f.PseudoValue("status") != "431" {
		t.Fatalf(":status %q", f.PseudoValue("status"))
	}
	c.request(3, "/", true)
	f = c.waitFor(5*time.Second, "the next response", func(f http2.Frame) bool { return f.Header().StreamID == 3 }).(*http2.MetaHeadersFrame)
	if f.PseudoValue("status") != "200" {
		t.Fatalf(":status %q", f.PseudoValue("status"))
	}
}

// TestIdleTimeout: a connection without streams for IdleTimeout gets
// GOAWAY NO_ERROR and is closed.
func TestIdleTimeout(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{IdleTimeout: 300 * time.Millisecond}, HandlerFunc(testHandler))
	c := dialRaw(t, s)
	c.request(1, "/", true)
	g := c.waitGoAway(http2.ErrCodeNo)
	if g.LastStreamID != 1 {
		t.Fatalf("GOAWAY last stream %d, want 1", g.LastStreamID)
	}
	c.waitClosed()
}

// TestPing: after PingInterval of silence the server PINGs; a client that
// answers keeps its connection, one that does not loses it after
// PingTimeout.
func TestPing(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{PingInterval: 100 * time.Millisecond, PingTimeout: 300 * time.Millisecond}, HandlerFunc(testHandler))
	c := dialRaw(t, s)
	for range 3 {
		p := c.waitFor(5*time.Second, "a PING", func(f http2.Frame) bool {
			p, ok := f.(*http2.PingFrame)
			return ok && !p.IsAck()
		}).(*http2.PingFrame)
		if err := c.fr.WritePing(true, p.Data); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.eventsWith("ping timeout")) != 0 {
		t.Fatal("an answering client timed out")
	}
	c.waitClosed() // no more answers
	if len(s.eventsWith("ping timeout")) != 1 {
		t.Fatalf("events %v", s.events)
	}
}

// TestProtocolErrors: what h2spec does not cover of the engine's own
// checks.
func TestProtocolErrors(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{}, HandlerFunc(testHandler))
	c := dialRaw(t, s)
	// :protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL.
	c.request(1, "/", false, ":protocol", "websocket")
	if code := c.waitRST(1); code != http2.ErrCodeProtocol {
		t.Fatalf("RST %v", code)
	}
	// content-length with END_STREAM on HEADERS.
	c.request(3, "/", true, "content-length", "5")
	if code := c.waitRST(3); code != http2.ErrCodeProtocol {
		t.Fatalf("RST %v", code)
	}
	// A value with a CR.
	c.request(5, "/", true, "x-a", "b\rc")
	if code := c.waitRST(5); code != http2.ErrCodeProtocol {
		t.Fatalf("RST %v", code)
	}
}

// TestEmptyHeadersFrame: a HEADERS frame with an empty payload, arriving
// when the connection's read buffer has been released (nothing else
// buffered), is a malformed request refused on its stream; the
// connection serves the next request. (Found by FuzzServeConn: the empty
// payload was once peeked at in the released buffer, a nil dereference.)
func TestEmptyHeadersFrame(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{}, HandlerFunc(testHandler))
	c := dialRaw(t, s)
	// Once the PING is answered, every byte sent so far has been read and
	// the read buffer is back in its pool.
	if err := c.fr.WritePing(false, [8]byte{1}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(10*time.Second, "PING ack", func(f http2.Frame) bool {
		p, ok := f.(*http2.PingFrame)
		return ok && p.IsAck()
	})
	// A frame header alone: length 0, HEADERS, END_STREAM|END_HEADERS, stream 1.
	if _, err := c.nc.Write([]byte{0, 0, 0, byte(http2.FrameHeaders), byte(http2.FlagHeadersEndStream | http2.FlagHeadersEndHeaders), 0, 0, 0, 1}); err != nil {
		t.Fatal(err)
	}
	if code := c.waitRST(1); code != http2.ErrCodeProtocol {
		t.Fatalf("RST_STREAM %v, want PROTOCOL_ERROR", code)
	}
	c.request(3, "/", true)
	c.waitFor(10*time.Second, "the answer on stream 3", func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 3 && h.PseudoValue("status") == "200"
	})
}
