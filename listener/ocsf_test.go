package listener

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/ocsf/ocsftest"
	"github.com/applistener/applistener/internal/proxyproto"
	"github.com/applistener/applistener/internal/testutil"
)

// syncBuf is a buffer safe for concurrent use.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) records() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ocsftest.Records(s.b.String())
}

func attr(rec []byte, path string) string { return fmt.Sprint(ocsftest.Attr(rec, path)) }

// TestOCSFConnectionRecords: an unknown SNI, a ClientHello without SNI and
// plain HTTP each give one Network Activity "Refuse" record with the
// reason, the client and the listener's address; at debug an accepted
// connection gives an "Open" record with its TLS version and route; at
// info it gives none. Every record validates against the class.
func TestOCSFConnectionRecords(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			out := &syncBuf{}
			l, h, ca := newTestListenerWith(t, nil, func(c *Config) { c.OCSF = ocsf.NewEmitter(out, level, ocsf.Product{}) })
			addr := l.Addr().String()
			if _, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "team--other--web." + testDomain, RootCAs: ca.Pool()}); err == nil {
				t.Fatal("unknown name accepted")
			}
			if _, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}); err == nil { // an IP: no SNI
				t.Fatal("no SNI accepted")
			}
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
			tc, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "team--demo--web." + testDomain, RootCAs: ca.Pool()})
			if err != nil {
				t.Fatal(err)
			}
			_ = tc.Close()
			testutil.Eventually(t, 5*time.Second, "the handoff", func() bool { return len(h.handedOff()) == 1 })
			want := 3
			if level == slog.LevelDebug {
				want = 4
			}
			testutil.Eventually(t, 5*time.Second, "the records", func() bool { return len(out.records()) >= want })
			recs := out.records()
			if len(recs) != want {
				t.Fatalf("%d records, want %d:\n%s", len(recs), want, bytes.Join(recs, []byte("\n")))
			}
			reasons := map[string]bool{}
			for _, r := range recs {
				if err := ocsftest.Validate(r); err != nil {
					t.Errorf("%v\n%s", err, r)
				}
				if attr(r, "class_uid") != "4001" || attr(r, "src_endpoint.ip") != "127.0.0.1" ||
					attr(r, "dst_endpoint.port") != addr[strings.LastIndex(addr, ":")+1:] {
					t.Errorf("record: %s", r)
				}
				switch attr(r, "activity_id") {
				case "5":
					reasons[attr(r, "status_detail")] = true
					if attr(r, "status_detail") == "unknown_sni" && attr(r, "dst_endpoint.hostname") != "team--other--web."+testDomain {
						t.Errorf("unknown SNI record without the name: %s", r)
					}
				case "1":
					if attr(r, "tls.version") != "1.3" || attr(r, "unmapped.sandbox") != "demo" || attr(r, "severity_id") != "1" {
						t.Errorf("accepted record: %s", r)
					}
				default:
					t.Errorf("activity: %s", r)
				}
			}
			for _, r := range []string{"unknown_sni", "no_sni", "not_tls"} {
				if !reasons[r] {
					t.Errorf("no refusal record with reason %s", r)
				}
			}
		})
	}
}

// TestOCSFProxyClient: behind a permitted PROXY protocol peer, a record
// names the client the header carried; a header from a peer that may not
// send one is a refusal of its own.
func TestOCSFProxyClient(t *testing.T) {
	out := &syncBuf{}
	l, _, ca := newTestListenerWith(t, nil, func(c *Config) {
		c.TrustedProxies = prefixes("127.0.0.1/32")
		c.OCSF = ocsf.NewEmitter(out, slog.LevelInfo, ocsf.Product{})
	})
	hdr := mustHeader(t, proxyproto.Header{Command: proxyproto.Proxy, Source: netip.MustParseAddrPort("203.0.113.7:40000"),
		Destination: netip.MustParseAddrPort("10.0.0.1:8443")})
	tlsc := tls.Client(&preambleConn{Conn: dialFrom(t, l, "127.0.0.1"), pre: hdr},
		&tls.Config{ServerName: "team--nope." + testDomain, RootCAs: ca.Pool()})
	_ = tlsc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tlsc.Handshake(); err == nil {
		t.Fatal("unknown name accepted")
	}
	untrusted := &preambleConn{Conn: dialFrom(t, l, "127.0.0.3"), pre: hdr}
	_, _ = untrusted.Write([]byte{0x16, 3, 1, 0, 0})
	testutil.Eventually(t, 5*time.Second, "two records", func() bool { return len(out.records()) >= 2 })
	recs := out.records()
	got := map[string]string{}
	for _, r := range recs {
		if err := ocsftest.Validate(r); err != nil {
			t.Errorf("%v\n%s", err, r)
		}
		got[attr(r, "src_endpoint.ip")+":"+attr(r, "src_endpoint.port")] = attr(r, "status_detail")
	}
	from := fmt.Sprintf("127.0.0.3:%d", untrusted.LocalAddr().(*net.TCPAddr).Port)
	if len(recs) != 2 || got["203.0.113.7:40000"] != "unknown_sni" || !strings.HasPrefix(got[from], "proxy_untrusted") {
		t.Errorf("records by client: %q", got)
	}
}
