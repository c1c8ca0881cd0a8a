package h2engine

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/internal/testutil"
)

// send sends a HEADERS frame on stream id carrying exactly fields (name,
// value pairs, in order).
func (c *rawClient) send(id uint32, endStream bool, fields ...string) error {
	c.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: endStream, EndHeaders: true})
}

// withFields returns a valid GET's fields with some replaced or added:
// pairs whose name is already there replace its value ("" value with a
// name of "-:name" drops it), the others are appended.
func withFields(pairs ...string) []string {
	base := []string{":method", "GET", ":scheme", "https", ":authority", "localhost", ":path", "/"}
	for i := 0; i+1 < len(pairs); i += 2 {
		name, value := pairs[i], pairs[i+1]
		if drop, ok := strings.CutPrefix(name, "-"); ok {
			for j := 0; j < len(base); j += 2 {
				if base[j] == drop {
					base = append(base[:j], base[j+2:]...)
					break
				}
			}
			continue
		}
		found := false
		for j := 0; j < len(base) && strings.HasPrefix(name, ":"); j += 2 {
			if base[j] == name {
				base[j+1], found = value, true
				break
			}
		}
		if !found {
			base = append(base, name, value)
		}
	}
	return base
}

// requestRule is one row of the request rules (doc.go): what the client
// sends on stream 1 and how the server must answer.
type requestRule struct {
	name string
	send func(c *rawClient) error
	// Exactly one of: the stream error on stream 1, the connection error,
	// or served (the request reaches the handler: 200 on stream 1).
	stream, conn http2.ErrCode
	served       bool
	// noSettings: the client sends no SETTINGS after the preface.
	noSettings bool
	// plain: the server has no extended CONNECT (SETTINGS_ENABLE_CONNECT_PROTOCOL).
	plain bool
}

// headers sends one request with fields on stream 1.
func headers(endStream bool, fields ...string) func(c *rawClient) error {
	return func(c *rawClient) error { return c.send(1, endStream, fields...) }
}

// then sends the first, then the next.
func then(first, next func(c *rawClient) error) func(c *rawClient) error {
	return func(c *rawClient) error {
		if err := first(c); err != nil {
			return err
		}
		return next(c)
	}
}

func data(id uint32, end bool, p string) func(c *rawClient) error {
	return func(c *rawClient) error { return c.fr.WriteData(id, end, []byte(p)) }
}

func trailer(end bool, fields ...string) func(c *rawClient) error {
	return func(c *rawClient) error { return c.send(1, end, fields...) }
}

var (
	post    = withFields(":method", "POST")
	connect = []string{":method", "CONNECT", ":authority", "localhost:443"}
	wsReq   = withFields(":method", "CONNECT", ":protocol", "websocket")
)

// requestRules: RFC 9113 section 8 (and RFC 8441 4) as it applies to
// requests, then the other checks x/net's HTTP/2 server made on them.
var requestRules = []requestRule{
	// 8.1 Message framing.
	{name: "8.1 trailers without END_STREAM", send: then(headers(false, post...), trailer(false, "x-t", "1")), stream: http2.ErrCodeProtocol},
	{name: "8.1 HEADERS after the trailers", send: then(then(headers(false, withFields(":method", "POST", ":path", "/block")...), trailer(true, "x-t", "1")), trailer(true, "x-u", "1")), stream: http2.ErrCodeStreamClosed},
	{name: "8.1 trailers are served", send: then(headers(false, withFields(":method", "POST", ":path", "/echo")...), trailer(true, "x-t", "1")), served: true},
	// 8.1.1 Malformed messages: content-length against DATA.
	{name: "8.1.1 DATA beyond content-length", send: then(headers(false, withFields(":method", "POST", "content-length", "1")...), data(1, false, "ab")), stream: http2.ErrCodeProtocol},
	{name: "8.1.1 DATA short of content-length", send: then(headers(false, withFields(":method", "POST", "content-length", "5")...), data(1, true, "ab")), stream: http2.ErrCodeProtocol},
	{name: "8.1.1 trailers short of content-length", send: then(then(headers(false, withFields(":method", "POST", "content-length", "5")...), data(1, false, "ab")), trailer(true, "x-t", "1")), stream: http2.ErrCodeProtocol},
	{name: "8.1.1 content-length with END_STREAM on HEADERS", send: headers(true, withFields("content-length", "5")...), stream: http2.ErrCodeProtocol},
	{name: "8.1.1 invalid content-length", send: headers(false, withFields(":method", "POST", "content-length", "5x")...), stream: http2.ErrCodeProtocol},
	{name: "8.1.1 differing content-length fields", send: headers(false, withFields(":method", "POST", "content-length", "5", "content-length", "6")...), stream: http2.ErrCodeProtocol},
	{name: "8.1.1 content-length matching DATA is served", send: then(headers(false, withFields(":method", "POST", "content-length", "2")...), data(1, true, "ab")), served: true},
	// 8.2 HTTP fields.
	{name: "8.2 uppercase field name", send: headers(true, withFields("X-Up", "1")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 invalid byte in field name", send: headers(true, withFields("x y", "1")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 empty field name", send: headers(true, withFields("", "1")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 NUL in a value", send: headers(true, withFields("x-a", "b\x00c")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 CR in a value", send: headers(true, withFields("x-a", "b\rc")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 LF in a value", send: headers(true, withFields("x-a", "b\nc")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 other control byte in a value (x/net)", send: headers(true, withFields("x-a", "b\x01c")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 DEL in a value (x/net)", send: headers(true, withFields("x-a", "b\x7fc")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 leading whitespace in a value", send: headers(true, withFields("x-a", " b")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 trailing whitespace in a value", send: headers(true, withFields("x-a", "b\t")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.1 HTAB and obs-text inside a value are served", send: headers(true, withFields("x-a", "b\tc\xff")...), served: true},
	{name: "8.2.2 connection", send: headers(true, withFields("connection", "close")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.2 keep-alive", send: headers(true, withFields("keep-alive", "5")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.2 proxy-connection", send: headers(true, withFields("proxy-connection", "close")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.2 transfer-encoding", send: headers(true, withFields("transfer-encoding", "chunked")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.2 upgrade", send: headers(true, withFields("upgrade", "h2c")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.2 te other than trailers", send: headers(true, withFields("te", "gzip")...), stream: http2.ErrCodeProtocol},
	{name: "8.2.2 te trailers is served", send: headers(true, withFields("te", "trailers")...), served: true},
	// 8.3 Pseudo-header fields.
	{name: "8.3 unknown pseudo-header field", send: headers(true, withFields(":foo", "1")...), stream: http2.ErrCodeProtocol},
	{name: "8.3 response pseudo-header field in a request", send: headers(true, withFields(":status", "200")...), stream: http2.ErrCodeProtocol},
	{name: "8.3 duplicated pseudo-header field", send: headers(true, append(withFields(), ":path", "/")...), stream: http2.ErrCodeProtocol},
	{name: "8.3 pseudo-header field after a regular field", send: headers(true, append(withFields("x-a", "1"), ":protocol", "websocket")...), stream: http2.ErrCodeProtocol},
	{name: "8.3 pseudo-header field in trailers", send: then(headers(false, post...), trailer(true, ":path", "/")), stream: http2.ErrCodeProtocol},
	{name: "8.3 invalid byte in a pseudo-header value (x/net)", send: headers(true, withFields(":path", "/a\x01")...), stream: http2.ErrCodeProtocol},
	// 8.3.1 Request pseudo-header fields.
	{name: "8.3.1 missing :method", send: headers(true, withFields("-:method", "")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 empty :method", send: headers(true, withFields(":method", "")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 missing :scheme", send: headers(true, withFields("-:scheme", "")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 :scheme other than http or https (x/net)", send: headers(true, withFields(":scheme", "ftp")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 missing :path", send: headers(true, withFields("-:path", "")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 empty :path", send: headers(true, withFields(":path", "")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 :path neither absolute nor *", send: headers(true, withFields(":path", "a/b")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 :path * on GET", send: headers(true, withFields(":path", "*")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 :path * on OPTIONS is served", send: headers(true, withFields(":method", "OPTIONS", ":path", "*")...), served: true},
	{name: "8.3.1 invalid percent-encoding in :path (x/net)", send: headers(true, withFields(":path", "/a%zz")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 host differing from :authority", send: headers(true, withFields("host", "other.example")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 host equal to :authority is served", send: headers(true, withFields("host", "LocalHost")...), served: true},
	{name: "8.3.1 host without :authority is served", send: headers(true, withFields("-:authority", "", "host", "localhost")...), served: true},
	{name: "8.3.1 more than one host field (x/net)", send: headers(true, withFields("-:authority", "", "host", "localhost", "host", "localhost")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 userinfo in :authority", send: headers(true, withFields(":authority", "user@localhost")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 invalid byte in :authority (x/net)", send: headers(true, withFields(":authority", "local{host")...), stream: http2.ErrCodeProtocol},
	{name: "8.3.1 invalid host field without :authority (x/net)", send: headers(true, withFields("-:authority", "", "host", "local/host")...), stream: http2.ErrCodeProtocol},
	// 8.4 Server push: a client cannot push.
	{name: "8.4 PUSH_PROMISE from a client", send: then(headers(false, post...), func(c *rawClient) error {
		return c.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: []byte{0x82}, EndHeaders: true})
	}), conn: http2.ErrCodeProtocol},
	{name: "8.4 SETTINGS_ENABLE_PUSH other than 0 or 1", send: func(c *rawClient) error {
		return c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 2})
	}, conn: http2.ErrCodeProtocol},
	// 8.5 CONNECT.
	{name: "8.5 CONNECT with :scheme", send: headers(true, append(connect, ":scheme", "https")...), stream: http2.ErrCodeProtocol},
	{name: "8.5 CONNECT with :path", send: headers(true, append(connect, ":path", "/")...), stream: http2.ErrCodeProtocol},
	{name: "8.5 CONNECT without :authority", send: headers(true, ":method", "CONNECT"), stream: http2.ErrCodeProtocol},
	{name: "8.5 CONNECT host:port is served", send: headers(true, connect...), served: true},
	// Not malformed here: a CONNECT whose :authority has no port is left
	// to the handler (dispatch answers every CONNECT 405).
	{name: "8.5 CONNECT without a port is served", send: headers(true, ":method", "CONNECT", ":authority", "localhost"), served: true},
	// RFC 8441 4: extended CONNECT.
	{name: "RFC 8441 :protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL", send: headers(true, wsReq...), stream: http2.ErrCodeProtocol, plain: true},
	{name: "RFC 8441 :protocol on a method other than CONNECT", send: headers(true, withFields(":protocol", "websocket")...), stream: http2.ErrCodeProtocol},
	{name: "RFC 8441 extended CONNECT without :path", send: headers(true, withFields(":method", "CONNECT", ":protocol", "websocket", "-:path", "")...), stream: http2.ErrCodeProtocol},
	{name: "RFC 8441 extended CONNECT is served", send: headers(true, wsReq...), served: true},
	// The other checks of x/net's server on requests.
	{name: "x/net HEADERS with an even stream id", send: func(c *rawClient) error { return c.send(2, true, withFields()...) }, conn: http2.ErrCodeProtocol},
	{name: "x/net stream id not above the previous ones", send: then(headers(true, withFields(":path", "/block")...), func(c *rawClient) error {
		if err := c.send(5, true, withFields(":path", "/block")...); err != nil {
			return err
		}
		return c.send(3, true, withFields()...)
	}), conn: http2.ErrCodeProtocol},
	{name: "x/net field not allowed in trailers", send: then(headers(false, post...), trailer(true, "content-length", "0")), stream: http2.ErrCodeProtocol},
	{name: "x/net if- field in trailers", send: then(headers(false, post...), trailer(true, "if-match", "x")), stream: http2.ErrCodeProtocol},
	{name: "x/net PRIORITY on itself", send: then(headers(false, post...), func(c *rawClient) error {
		return c.fr.WritePriority(1, http2.PriorityParam{StreamDep: 1, Weight: 1})
	}), stream: http2.ErrCodeProtocol},
	{name: "x/net HEADERS priority on itself", send: func(c *rawClient) error {
		c.hbuf.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", "localhost"}, {":path", "/"}} {
			_ = c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.hbuf.Bytes(), EndStream: true, EndHeaders: true,
			Priority: http2.PriorityParam{StreamDep: 1, Weight: 1}})
	}, stream: http2.ErrCodeProtocol},
	{name: "x/net DATA on an idle stream", send: data(1, true, "x"), conn: http2.ErrCodeProtocol},
	{name: "x/net DATA on a closed stream", send: then(headers(true, withFields()...), func(c *rawClient) error {
		c.waitFor(10*time.Second, "the response's end", func(f http2.Frame) bool {
			return f.Header().StreamID == 1 && f.Header().Flags.Has(http2.FlagDataEndStream)
		})
		return c.fr.WriteData(1, false, []byte("x"))
	}), stream: http2.ErrCodeStreamClosed},
	{name: "x/net DATA beyond the stream window", send: then(headers(false, post...), data(1, false, strings.Repeat("x", 2048))), stream: http2.ErrCodeFlowControl},
	{name: "x/net WINDOW_UPDATE on an idle stream", send: func(c *rawClient) error { return c.fr.WriteWindowUpdate(1, 1) }, conn: http2.ErrCodeProtocol},
	{name: "x/net WINDOW_UPDATE of 0 on a stream", send: then(headers(false, post...), func(c *rawClient) error { return c.fr.WriteWindowUpdate(1, 0) }), stream: http2.ErrCodeProtocol},
	{name: "x/net WINDOW_UPDATE of 0 on the connection", send: func(c *rawClient) error { return c.fr.WriteWindowUpdate(0, 0) }, conn: http2.ErrCodeProtocol},
	{name: "x/net WINDOW_UPDATE overflowing a stream window", send: then(headers(false, post...), func(c *rawClient) error { return c.fr.WriteWindowUpdate(1, 1<<31-1) }), stream: http2.ErrCodeFlowControl},
	{name: "x/net WINDOW_UPDATE overflowing the connection window", send: func(c *rawClient) error { return c.fr.WriteWindowUpdate(0, 1<<31-1) }, conn: http2.ErrCodeFlowControl},
	{name: "x/net RST_STREAM on an idle stream", send: func(c *rawClient) error { return c.fr.WriteRSTStream(1, http2.ErrCodeCancel) }, conn: http2.ErrCodeProtocol},
	{name: "x/net PING on a stream", send: func(c *rawClient) error {
		// A PING frame on stream 1 (the Framer writes stream 0 only).
		_, err := c.nc.Write([]byte{0, 0, 8, byte(http2.FramePing), 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0})
		return err
	}, conn: http2.ErrCodeProtocol},
	{name: "x/net first frame not SETTINGS", send: headers(true, withFields()...), conn: http2.ErrCodeProtocol, noSettings: true},
	{name: "x/net SETTINGS acknowledgement for no SETTINGS", send: func(c *rawClient) error {
		c.waitFor(10*time.Second, "the server's SETTINGS", func(f http2.Frame) bool {
			s, ok := f.(*http2.SettingsFrame)
			return ok && !s.IsAck()
		})
		if err := c.fr.WriteSettingsAck(); err != nil {
			return err
		}
		return c.fr.WriteSettingsAck()
	}, conn: http2.ErrCodeProtocol},
	{name: "x/net more than 100 settings", send: func(c *rawClient) error {
		s := make([]http2.Setting, 101)
		for i := range s {
			s[i] = http2.Setting{ID: http2.SettingID(0x100 + i), Val: 1}
		}
		return c.fr.WriteSettings(s...)
	}, conn: http2.ErrCodeProtocol},
}

// TestRequestRules: each rule of the request rules table (doc.go) as a
// case of its own, on a connection of its own: the malformed request is
// answered RST_STREAM (never reaching the handler) and the connection
// serves the next request, or the connection is closed with GOAWAY; the
// valid variants are served.
func TestRequestRules(t *testing.T) {
	testutil.VerifyNone(t)
	cfg := Config{EnableConnectProtocol: true, InitialWindowSize: 1024, MaxConcurrentStreams: 4}
	ext := newTestServer(t, false, cfg, HandlerFunc(testHandler))
	cfg.EnableConnectProtocol = false
	plain := newTestServer(t, false, cfg, HandlerFunc(testHandler))
	names := map[string]bool{}
	for _, r := range requestRules {
		if names[r.name] {
			t.Fatalf("two rules named %q", r.name)
		}
		names[r.name] = true
		t.Run(strings.ReplaceAll(r.name, " ", "_"), func(t *testing.T) {
			s := ext
			if r.plain {
				s = plain
			}
			c := dialRules(t, s, r.noSettings)
			c.fr.AllowIllegalWrites = true
			if err := r.send(c); err != nil {
				t.Fatal(err)
			}
			switch {
			case r.served:
				f := c.waitFor(10*time.Second, "the answer on stream 1", func(f http2.Frame) bool {
					if r, ok := f.(*http2.RSTStreamFrame); ok && r.StreamID == 1 {
						t.Fatalf("RST_STREAM %v, want an answer", r.ErrCode)
					}
					if g, ok := f.(*http2.GoAwayFrame); ok {
						t.Fatalf("GOAWAY %v (%q), want an answer", g.ErrCode, g.DebugData())
					}
					_, ok := f.(*http2.MetaHeadersFrame)
					return ok && f.Header().StreamID == 1
				}).(*http2.MetaHeadersFrame)
				if st := f.PseudoValue("status"); st != "200" {
					t.Fatalf(":status %s", st)
				}
			case r.conn != 0:
				c.waitGoAway(r.conn)
				c.waitClosed()
			default:
				c.waitFor(10*time.Second, "RST_STREAM on stream 1", func(f http2.Frame) bool {
					switch f := f.(type) {
					case *http2.MetaHeadersFrame:
						if f.StreamID == 1 {
							t.Fatalf("answered %s, want RST_STREAM %v", f.PseudoValue("status"), r.stream)
						}
					case *http2.GoAwayFrame:
						t.Fatalf("GOAWAY %v (%q), want RST_STREAM %v", f.ErrCode, f.DebugData(), r.stream)
					case *http2.RSTStreamFrame:
						if f.StreamID == 1 && f.ErrCode != r.stream {
							t.Fatalf("RST_STREAM %v, want %v", f.ErrCode, r.stream)
						}
						return f.StreamID == 1
					}
					return false
				})
				// The connection goes on.
				if err := c.send(7, true, withFields()...); err != nil {
					t.Fatal(err)
				}
				c.waitFor(10*time.Second, "the next request's answer", func(f http2.Frame) bool {
					h, ok := f.(*http2.MetaHeadersFrame)
					return ok && h.StreamID == 7 && h.PseudoValue("status") == "200"
				})
			}
		})
	}
}

// dialRules is dialRaw, without the client's SETTINGS when noSettings.
func dialRules(t *testing.T, s *testServer, noSettings bool) *rawClient {
	t.Helper()
	if !noSettings {
		return dialRaw(t, s)
	}
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
	return c
}
