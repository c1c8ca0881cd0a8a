package listener

import (
	"bytes"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/applistener/applistener/internal/proxyproto"
	"github.com/applistener/applistener/internal/testutil"
)

const proxyTestName = "team--demo--web." + testDomain

func prefixes(s ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, p := range s {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	return ps
}

// dialFrom connects to l from the loopback address src (127.0.0.1,
// 127.0.0.2, ...: all of 127/8 is local on Linux).
func dialFrom(t *testing.T, l *Listener, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// preambleConn sends pre together with its first Write (the ClientHello),
// in one segment, as the edge does.
type preambleConn struct {
	net.Conn
	pre []byte
}

func (p *preambleConn) Write(b []byte) (int, error) {
	if p.pre != nil {
		buf := append(p.pre, b...)
		p.pre = nil
		n, err := p.Conn.Write(buf)
		return max(0, n-(len(buf)-len(b))), err
	}
	return p.Conn.Write(b)
}

func mustHeader(t *testing.T, h proxyproto.Header) []byte {
	t.Helper()
	b, err := h.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestProxyHeaderSetsClient: a PROXY v2 header from a permitted peer,
// sent in the same segment as the ClientHello, makes its source address
// the client address handed to dispatch (IPv4 and IPv6) without eating
// into the ClientHello; a LOCAL header, and a trusted peer that sends no
// header, keep the peer's own address. Each header is counted by command.
func TestProxyHeaderSetsClient(t *testing.T) {
	// 127.0.0.1 may send a header, 127.0.0.2 must.
	l, h, ca := newTestListenerWith(t, nil, func(c *Config) {
		c.TrustedProxies = prefixes("127.0.0.1/32")
		c.RequireProxyHeader = prefixes("127.0.0.2/32")
	})
	dst := netip.MustParseAddrPort("10.0.0.1:8443")
	for i, tc := range []struct {
		name, from string
		hdr        *proxyproto.Header
		want       string // "" : the peer's own address
	}{
		{"IPv4 client", "127.0.0.1", &proxyproto.Header{Command: proxyproto.Proxy, Source: netip.MustParseAddrPort("203.0.113.7:40000"), Destination: dst, Authority: proxyTestName}, "203.0.113.7:40000"},
		{"IPv6 client", "127.0.0.1", &proxyproto.Header{Command: proxyproto.Proxy, Source: netip.MustParseAddrPort("[2001:db8::7]:40001"), Destination: netip.MustParseAddrPort("[2001:db8::1]:8443")}, "[2001:db8::7]:40001"},
		{"required peer", "127.0.0.2", &proxyproto.Header{Command: proxyproto.Proxy, Source: netip.MustParseAddrPort("198.51.100.9:1"), Destination: dst}, "198.51.100.9:1"},
		{"LOCAL keeps the peer's address", "127.0.0.1", &proxyproto.Header{Command: proxyproto.Local}, ""},
		{"trusted peer without a header", "127.0.0.1", nil, ""},
	} {
		raw := dialFrom(t, l, tc.from)
		conn := raw
		if tc.hdr != nil {
			conn = &preambleConn{Conn: raw, pre: mustHeader(t, *tc.hdr)}
		}
		tlsc := tls.Client(conn, &tls.Config{ServerName: proxyTestName, RootCAs: ca.Pool()})
		_ = tlsc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tlsc.Handshake(); err != nil {
			t.Fatalf("%s: handshake: %v", tc.name, err)
		}
		_ = tlsc.Close()
		testutil.Eventually(t, 5*time.Second, tc.name+": the handoff", func() bool { return len(h.handedOff()) == i+1 })
		want := tc.want
		if want == "" {
			want = raw.LocalAddr().String()
		}
		if got := h.handedOff()[i].c.Client.String(); got != want {
			t.Errorf("%s: Client %s, want %s", tc.name, got, want)
		}
	}
	if n := promtestutil.ToFloat64(l.m.proxyHeaders.WithLabelValues("proxy")); n != 3 {
		t.Errorf("applistener_proxy_protocol_headers_total{command=proxy} = %v, want 3", n)
	}
	if n := promtestutil.ToFloat64(l.m.proxyHeaders.WithLabelValues("local")); n != 1 {
		t.Errorf("applistener_proxy_protocol_headers_total{command=local} = %v, want 1", n)
	}
}

// TestProxyHeaderRefused: the connection is closed, without a byte
// written to it and without reaching the handler, when a peer that may
// not send a PROXY header sends one (v2 or v1), when a peer that must
// send one does not, and when a permitted peer's header is v1 text,
// invalid, too large or never completed (the handshake timeout ends the
// wait). Each refusal is counted by reason and logged.
func TestProxyHeaderRefused(t *testing.T) {
	v2 := mustHeader(t, proxyproto.Header{Command: proxyproto.Proxy,
		Source: netip.MustParseAddrPort("203.0.113.7:40000"), Destination: netip.MustParseAddrPort("10.0.0.1:8443")})
	badVersion := append([]byte(nil), v2...)
	badVersion[12] = 0x11
	tooLarge := append([]byte(proxyproto.Signature), 0x21, 0x11, 0x13, 0x88) // 5000 bytes declared
	const timeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name       string
		trusted    []netip.Prefix
		required   []netip.Prefix
		from       string
		send       []byte // nil: a TLS handshake
		wantReason string
	}{
		{"v2 header, nobody trusted", nil, nil, "127.0.0.1", v2, reasonProxyUntrusted},
		{"v2 header from an untrusted peer", prefixes("127.0.0.2/32"), nil, "127.0.0.1", v2, reasonProxyUntrusted},
		{"v1 header from an untrusted peer", prefixes("127.0.0.2/32"), nil, "127.0.0.1", []byte("PROXY TCP4 203.0.113.7 10.0.0.1 40000 8443\r\n"), reasonProxyUntrusted},
		{"required peer without a header", nil, prefixes("127.0.0.0/8"), "127.0.0.1", nil, reasonProxyRequired},
		{"trusted peer sends v1", prefixes("127.0.0.1/32"), nil, "127.0.0.1", []byte("PROXY TCP4 203.0.113.7 10.0.0.1 40000 8443\r\n"), reasonProxyMalformed},
		{"trusted peer sends an invalid header", prefixes("127.0.0.1/32"), nil, "127.0.0.1", badVersion, reasonProxyMalformed},
		{"trusted peer declares a 5000-byte header", prefixes("127.0.0.1/32"), nil, "127.0.0.1", tooLarge, reasonProxyMalformed},
		{"trusted peer stalls inside the header", prefixes("127.0.0.1/32"), nil, "127.0.0.1", v2[:20], reasonProxyMalformed},
		{"trusted peer stalls inside the signature", prefixes("127.0.0.1/32"), nil, "127.0.0.1", v2[:7], reasonProxyMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &syncBuffer{}
			l, h, ca := newTestListenerWith(t, nil, func(c *Config) {
				c.TrustedProxies, c.RequireProxyHeader = tc.trusted, tc.required
				c.HandshakeTimeout = timeout
				c.Logger = slog.New(slog.NewTextHandler(logs, nil))
			})
			c := dialFrom(t, l, tc.from)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if tc.send == nil {
				err := tls.Client(c, &tls.Config{ServerName: proxyTestName, RootCAs: ca.Pool()}).Handshake()
				if err == nil {
					t.Fatal("handshake succeeded")
				}
			} else {
				if _, err := c.Write(tc.send); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 64)
				n, err := c.Read(buf)
				if n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("read %q, %v; want the connection closed with nothing written", buf[:n], err)
				}
			}
			testutil.Eventually(t, 5*time.Second, "the refusal counted", func() bool {
				return promtestutil.ToFloat64(l.m.rejections.WithLabelValues(tc.wantReason)) == 1
			})
			if n := len(h.handedOff()); n != 0 {
				t.Errorf("%d connections handed to the handler", n)
			}
			testutil.Eventually(t, 5*time.Second, "the refusal logged", func() bool {
				return strings.Contains(logs.String(), "reason="+tc.wantReason)
			})
			if !strings.Contains(logs.String(), "src=127.0.0.1:") {
				t.Errorf("the log does not name the peer:\n%s", logs)
			}
		})
	}
}
