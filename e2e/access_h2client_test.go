package e2e

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Conn is a hand-driven HTTP/2 client connection to the listener, for
// what net/http's client cannot do or cannot time: WebSockets over
// HTTP/2 (RFC 8441 extended CONNECT) and the exact moment a stream ends.
// A reader goroutine, owned by the connection and ended by close (on
// cleanup), records each stream's response and end.
type h2Conn struct {
	tc *tls.Conn
	fr *http2.Framer

	wmu    sync.Mutex // guards writes, enc and encBuf and nextID
	enc    *hpack.Encoder
	encBuf bytes.Buffer
	nextID uint32

	settings chan map[http2.SettingID]uint32 // the server's first SETTINGS
	done     chan struct{}                   // closed when the reader returns

	mu      sync.Mutex
	streams map[uint32]*h2Stream
	readErr error
}

// h2Stream is one stream of an h2Conn.
type h2Stream struct {
	id      uint32
	headers chan struct{} // closed when the response headers came
	ended   chan struct{} // closed when the stream ended

	mu      sync.Mutex
	status  int
	header  http.Header
	data    bytes.Buffer
	dataSig chan struct{} // capacity 1: data arrived
	endedAt time.Time
	how     string // "END_STREAM", "RST_STREAM <code>", "GOAWAY", "connection: <err>"
}

// dialH2 opens a TLS connection with ALPN h2 and SNI host, exchanges
// SETTINGS and returns the connection.
func (p *proc) dialH2(t testing.TB, host string) *h2Conn {
	t.Helper()
	cfg := tlsConfig(host)
	cfg.NextProtos = []string{"h2"}
	tc, err := p.dialTLS(cfg)
	if err != nil {
		t.Fatalf("TLS to %s: %v", host, err)
	}
	if got := tc.ConnectionState().NegotiatedProtocol; got != "h2" {
		_ = tc.Close()
		t.Fatalf("ALPN %q; want h2", got)
	}
	c := &h2Conn{
		tc: tc, fr: http2.NewFramer(tc, tc), nextID: 1,
		settings: make(chan map[http2.SettingID]uint32, 1),
		done:     make(chan struct{}), streams: map[uint32]*h2Stream{},
	}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 1 << 20
	c.enc = hpack.NewEncoder(&c.encBuf)
	if _, err := tc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteWindowUpdate(0, 1<<30); err != nil {
		t.Fatal(err)
	}
	go c.readLoop()
	t.Cleanup(c.close)
	select {
	case <-c.settings:
	case <-c.done:
		t.Fatalf("the listener's SETTINGS never came: %v", c.err())
	case <-time.After(waitTimeout):
		t.Fatalf("the listener's SETTINGS never came within %v", waitTimeout)
	}
	return c
}

// close ends the connection and waits for the reader.
func (c *h2Conn) close() {
	_ = c.tc.Close()
	<-c.done
}

func (c *h2Conn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr
}

func (c *h2Conn) readLoop() {
	defer close(c.done)
	sentSettings := false
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.mu.Lock()
			c.readErr = err
			for _, s := range c.streams {
				s.end("connection: " + err.Error())
			}
			c.mu.Unlock()
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if !sentSettings {
				sentSettings = true
				m := map[http2.SettingID]uint32{}
				_ = f.ForeachSetting(func(s http2.Setting) error { m[s.ID] = s.Val; return nil })
				c.settings <- m
			}
			c.write(func() error { return c.fr.WriteSettingsAck() })
		case *http2.PingFrame:
			if !f.IsAck() {
				c.write(func() error { return c.fr.WritePing(true, f.Data) })
			}
		case *http2.MetaHeadersFrame:
			if s := c.stream(f.StreamID); s != nil {
				s.gotHeaders(f)
				if f.StreamEnded() {
					s.end("END_STREAM")
				}
			}
		case *http2.DataFrame:
			if s := c.stream(f.StreamID); s != nil {
				s.gotData(f.Data())
				if n := len(f.Data()); n > 0 {
					c.write(func() error { return c.fr.WriteWindowUpdate(f.StreamID, uint32(n)) })
				}
				if f.StreamEnded() {
					s.end("END_STREAM")
				}
			}
		case *http2.RSTStreamFrame:
			if s := c.stream(f.StreamID); s != nil {
				s.end("RST_STREAM " + f.ErrCode.String())
			}
		case *http2.GoAwayFrame:
			c.mu.Lock()
			for id, s := range c.streams {
				if id > f.LastStreamID {
					s.end("GOAWAY")
				}
			}
			c.mu.Unlock()
		}
	}
}

// write runs w under the write lock; errors surface as the reader's.
func (c *h2Conn) write(w func() error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = w()
}

func (c *h2Conn) stream(id uint32) *h2Stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[id]
}

// open starts a stream with the given header fields (pseudo-headers
// first), ending it at once when endStream (a request without a body).
func (c *h2Conn) open(t testing.TB, fields [][2]string, endStream bool) *h2Stream {
	t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.encBuf.Reset()
	for _, f := range fields {
		if err := c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	s := &h2Stream{id: c.nextID, headers: make(chan struct{}), ended: make(chan struct{}), dataSig: make(chan struct{}, 1)}
	c.nextID += 2
	c.mu.Lock()
	c.streams[s.id] = s
	c.mu.Unlock()
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: s.id, BlockFragment: c.encBuf.Bytes(), EndStream: endStream, EndHeaders: true,
	}); err != nil {
		t.Fatalf("writing HEADERS: %v", err)
	}
	return s
}

// get opens a GET of path on host with extra header fields.
func (c *h2Conn) get(t testing.TB, authority, path string, extra ...[2]string) *h2Stream {
	t.Helper()
	fields := [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", authority}, {":path", path}}
	return c.open(t, append(fields, extra...), true)
}

// websocket opens an RFC 8441 WebSocket to path on authority.
func (c *h2Conn) websocket(t testing.TB, authority, path string, extra ...[2]string) *h2Stream {
	t.Helper()
	fields := [][2]string{
		{":method", "CONNECT"}, {":protocol", "websocket"}, {":scheme", "https"},
		{":authority", authority}, {":path", path}, {"sec-websocket-version", "13"},
	}
	return c.open(t, append(fields, extra...), false)
}

// sendWS sends one masked WebSocket text message on s.
func (c *h2Conn) sendWS(t testing.TB, s *h2Stream, msg string) {
	t.Helper()
	if len(msg) > 125 {
		t.Fatal("sendWS: message too long for a one-byte length")
	}
	mask := [4]byte{1, 2, 3, 4}
	frame := []byte{0x81, 0x80 | byte(len(msg)), mask[0], mask[1], mask[2], mask[3]}
	for i := 0; i < len(msg); i++ {
		frame = append(frame, msg[i]^mask[i%4])
	}
	c.wmu.Lock()
	err := c.fr.WriteData(s.id, false, frame)
	c.wmu.Unlock()
	if err != nil {
		t.Fatalf("writing DATA: %v", err)
	}
}

func (s *h2Stream) gotHeaders(f *http2.MetaHeadersFrame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.header != nil {
		return // trailers
	}
	s.header = http.Header{}
	for _, hf := range f.RegularFields() {
		s.header.Add(hf.Name, hf.Value)
	}
	s.status, _ = strconv.Atoi(f.PseudoValue("status"))
	close(s.headers)
}

func (s *h2Stream) gotData(b []byte) {
	s.mu.Lock()
	s.data.Write(b)
	s.mu.Unlock()
	select {
	case s.dataSig <- struct{}{}:
	default:
	}
}

// end records the stream's end, once. Called with the connection's mu
// held or from the reader.
func (s *h2Stream) end(how string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.endedAt.IsZero() {
		return
	}
	s.endedAt, s.how = time.Now(), how
	close(s.ended)
}

// response waits for the response headers and returns the status and
// header fields.
func (s *h2Stream) response(t testing.TB) (int, http.Header) {
	t.Helper()
	select {
	case <-s.headers:
	case <-s.ended:
		s.mu.Lock()
		how := s.how
		s.mu.Unlock()
		select {
		case <-s.headers:
		default:
			t.Fatalf("stream %d ended (%s) without a response", s.id, how)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("stream %d: no response within %v", s.id, waitTimeout)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status, s.header
}

// body waits for the stream to end and returns what its DATA carried.
func (s *h2Stream) body(t testing.TB) string {
	t.Helper()
	select {
	case <-s.ended:
	case <-time.After(waitTimeout):
		t.Fatalf("stream %d did not end within %v", s.id, waitTimeout)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data.String()
}

// waitData waits until the stream's DATA contains sub.
func (s *h2Stream) waitData(t testing.TB, sub string) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		s.mu.Lock()
		got, endedHow := s.data.String(), s.how
		s.mu.Unlock()
		if strings.Contains(got, sub) {
			return
		}
		if endedHow != "" {
			t.Fatalf("stream %d ended (%s) with %q, without %q", s.id, endedHow, got, sub)
		}
		select {
		case <-s.dataSig:
		case <-s.ended:
		case <-deadline:
			t.Fatalf("stream %d: %q not received within %v (got %q)", s.id, sub, waitTimeout, got)
		}
	}
}

// waitEnd waits up to timeout for the stream to end and returns when and
// how it ended.
func (s *h2Stream) waitEnd(timeout time.Duration) (time.Time, string, error) {
	select {
	case <-s.ended:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.endedAt, s.how, nil
	case <-time.After(timeout):
		return time.Time{}, "", errors.New("stream " + strconv.Itoa(int(s.id)) + " still open after " + timeout.String())
	}
}

// wsTextFrame is the unmasked server frame of a short text message.
func wsTextFrame(msg string) string {
	return fmt.Sprintf("\x81%c%s", byte(len(msg)), msg)
}
