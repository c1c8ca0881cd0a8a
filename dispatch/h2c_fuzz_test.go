package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
)

// hostileH2CApp is an h2c app that answers each connection's first request
// with script, whatever it holds: the server preface (an empty SETTINGS
// frame), then script's bytes as they are, then the end of its side of
// the connection (FIN); it reads whatever comes until the listener closes.
type hostileH2CApp struct {
	ln     net.Listener
	script atomic.Pointer[[]byte]
	wg     sync.WaitGroup
}

func newHostileH2CApp(tb testing.TB) *hostileH2CApp {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	a := &hostileH2CApp{ln: ln}
	a.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.wg.Go(func() { a.serve(c) })
		}
	})
	return a
}

func (a *hostileH2CApp) close() {
	_ = a.ln.Close()
	a.wg.Wait()
}

func (a *hostileH2CApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *hostileH2CApp) serve(c net.Conn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(br, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, br)
	if err := fr.WriteSettings(); err != nil {
		return
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		if _, ok := f.(*http2.HeadersFrame); ok {
			break
		}
	}
	if script := a.script.Load(); script != nil {
		if _, err := c.Write(*script); err != nil {
			return
		}
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, br)
}

// h2cFuzzEnv is the listener (TLS, HTTP/2, one h2c route to a hostile
// app) and one HTTP/2 client connection to it, shared by a fuzz target's
// inputs.
type h2cFuzzEnv struct {
	srv   *Server
	table *routes.Table
	app   *hostileH2CApp
	ln    net.Listener
	cc    *http.ClientConn
	wg    sync.WaitGroup
}

func newH2CFuzzEnv(f *testing.F) *h2cFuzzEnv {
	f.Helper()
	e := &h2cFuzzEnv{app: newHostileH2CApp(f)}
	table, srvCfg, cliCfg := oneRouteTLS(f, e.app.port())
	e.table = table
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"h2c","instances":[{"workspace":"team","sandbox":"demo","generation":"1",`+
		`"services":[{"name":"web","port":%d,"protocol":"h2c"}]}]}`, e.app.port()))
	if err != nil || len(doc.Rejected) > 0 {
		f.Fatalf("document: %v %+v", err, doc)
	}
	table.Apply(doc)
	srvCfg.NextProtos, cliCfg.NextProtos = []string{"h2"}, []string{"h2"}
	e.srv = New(Config{Logger: slog.New(slog.DiscardHandler), ResponseHeaderTimeout: 5 * time.Second, BodyTimeout: 5 * time.Second})
	if e.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		f.Fatal(err)
	}
	e.wg.Go(func() {
		for {
			raw, err := e.ln.Accept()
			if err != nil {
				return
			}
			e.wg.Go(func() {
				tc := tls.Server(raw, srvCfg)
				if err := tc.Handshake(); err != nil {
					_ = raw.Close()
					return
				}
				sni := tc.ConnectionState().ServerName
				e.srv.ServeH2(listener.Conn{Conn: tc, Raw: raw, SNI: sni, Route: table.Lookup(sni)})
			})
		}
	})
	f.Cleanup(func() {
		if e.cc != nil {
			_ = e.cc.Close()
		}
		_ = e.ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = e.srv.Shutdown(ctx)
		cancel()
		e.wg.Wait()
		e.app.close()
	})
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), cliCfg)
	if err != nil {
		f.Fatal(err)
	}
	if e.cc, err = h2NewClientConn(tc); err != nil {
		f.Fatal(err)
	}
	return e
}

// appConns returns the open app connections of the route.
func (e *h2cFuzzEnv) appConns() int {
	route := e.table.Lookup(h2WebHost)
	return e.srv.h2cPoolOf(route, e.srv.routePool(route)).open()
}

// h2cResponseSeeds are an h2c app's answers to stream 1: valid, invalid
// and hostile ones.
func h2cResponseSeeds() [][]byte {
	type frame func(fr *http2.Framer, block func(...string) []byte)
	build := func(frames ...frame) []byte {
		var buf, hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		block := func(kv ...string) []byte {
			hb.Reset()
			for i := 0; i+1 < len(kv); i += 2 {
				_ = enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
			}
			return bytes.Clone(hb.Bytes())
		}
		fr := http2.NewFramer(&buf, nil)
		fr.AllowIllegalWrites = true
		for _, f := range frames {
			f(fr, block)
		}
		return buf.Bytes()
	}
	headers := func(end bool, kv ...string) frame {
		return func(fr *http2.Framer, block func(...string) []byte) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(kv...), EndStream: end, EndHeaders: true})
		}
	}
	data := func(end bool, p string) frame {
		return func(fr *http2.Framer, _ func(...string) []byte) { _ = fr.WriteData(1, end, []byte(p)) }
	}
	raw := func(w func(fr *http2.Framer)) frame {
		return func(fr *http2.Framer, _ func(...string) []byte) { w(fr) }
	}
	return [][]byte{
		build(headers(false, ":status", "200", "content-type", "text/plain"), data(true, "hello")),
		build(headers(true, ":status", "204")),
		build(headers(true, ":status", "999")),
		build(headers(true, ":status", "42")),
		build(headers(true, ":status", "abc")),
		build(headers(true, ":status", "-200")),
		build(headers(true, "content-type", "text/plain")),
		build(headers(false, ":status", "100"), headers(true, ":status", "200")),
		build(headers(false, ":status", "103", "link", "</a>"), headers(false, ":status", "200"), data(true, "x")),
		build(headers(false, ":status", "200", "set-cookie", "a=1; Domain=apps.test", "trailer", "set-cookie"), data(false, "body"),
			headers(true, "set-cookie", "b=2; domain=.apps.test; Path=/", "grpc-status", "0")),
		build(headers(false, ":status", "200", "connection", "close", "keep-alive", "5", "transfer-encoding", "chunked", "upgrade", "h2c")),
		build(headers(false, ":status", "200", "content-length", "10"), data(true, "short")),
		build(headers(false, ":status", "200", "content-type", "application/grpc"), data(false, "\x00\x00\x00\x00\x01x")),
		build(headers(false, ":status", "200"), raw(func(fr *http2.Framer) { _ = fr.WriteRSTStream(1, http2.ErrCodeInternal) })),
		build(raw(func(fr *http2.Framer) { _ = fr.WriteGoAway(0, http2.ErrCodeProtocol, []byte("bye")) })),
		build(raw(func(fr *http2.Framer) {
			_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 24})
			_ = fr.WriteWindowUpdate(0, 1<<31-1)
			_ = fr.WritePing(false, [8]byte{1})
			_ = fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, EndHeaders: true})
		}), headers(true, ":status", "200")),
		build(raw(func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x88}, EndHeaders: false})
			_ = fr.WriteContinuation(1, true, []byte{0xff, 0xff, 0xff})
		})),
		build(headers(false, ":status", "200", "x-bad", "a\x01b", "BAD", "x")),
		build(headers(false, ":status", "200"), data(false, strings.Repeat("z", 70_000)), data(true, "")),
		{},
	}
}

// FuzzH2CResponse feeds an h2c app's side of the connection with arbitrary
// frames (a hostile app) while a real HTTP/2 client asks through the
// listener: the listener must neither panic nor hang, the client must get
// a valid answer (a status from 200 to 599 whose body ends or is reset,
// no connection-specific field, no cookie for the whole app domain) on a
// connection that stays usable, and the app connection must be closed
// once the app has hung up.
func FuzzH2CResponse(f *testing.F) {
	for _, s := range h2cResponseSeeds() {
		f.Add(s)
	}
	e := newH2CFuzzEnv(f)
	f.Fuzz(func(t *testing.T, script []byte) {
		e.app.script.Store(&script)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req := h2Req(t, "GET", h2WebHost, "/fuzz", nil).WithContext(ctx)
		resp, err := e.cc.RoundTrip(req)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if resp.StatusCode < 200 || resp.StatusCode > 599 {
			t.Errorf("status %d relayed", resp.StatusCode)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		t.Logf("answer %d, %d body bytes (error %v), trailers %v", resp.StatusCode, n, err, resp.Trailer)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the body did not end: %v", err)
		}
		for _, h := range []http.Header{resp.Header, resp.Trailer} {
			for k, vv := range h {
				switch strings.ToLower(k) {
				case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer":
					t.Errorf("connection-specific field %s: %q relayed", k, vv)
				case "set-cookie":
					for _, v := range vv {
						if cookieDomainWiderThan(v, h2WebHost) {
							t.Errorf("cookie %q relayed with its Domain", v)
						}
					}
				}
			}
		}
		if err := e.cc.Err(); err != nil {
			t.Fatalf("the client connection failed: %v", err)
		}
		// The app hung up: its connection is closed before the next input.
		deadline := time.Now().Add(10 * time.Second)
		for e.appConns() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d app connections still open 10 s after the app hung up", e.appConns())
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// cookieDomainWiderThan reports whether the Set-Cookie value v keeps a
// Domain attribute, as a browser reads one (RFC 6265 §5.2: the segments
// after the first ';', names compared case-insensitively after trimming
// white space), that names anything but host. It is the fuzz oracle's own
// reading, written apart from the listener's, so that a name or value that
// merely contains "domain" is not mistaken for the attribute.
func cookieDomainWiderThan(v, host string) bool {
	_, attrs, ok := strings.Cut(v, ";")
	if !ok {
		return false
	}
	for _, a := range strings.Split(attrs, ";") {
		name, value, _ := strings.Cut(a, "=")
		if !strings.EqualFold(strings.Trim(name, " \t"), "domain") {
			continue
		}
		value = strings.TrimPrefix(strings.Trim(value, " \t"), ".")
		if !strings.EqualFold(value, host) {
			return true
		}
	}
	return false
}
