package tlshello

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

const chSNI = "team--demo--web.apps.test"

var chALPN = []string{"h2", "http/1.1"}

// ---- fixtures ---------------------------------------------------------------

var (
	chCertOnce sync.Once
	chCertVal  tls.Certificate
	chCertPool *x509.CertPool
)

// chTestCert is a self-signed ECDSA P-256 certificate for *.apps.test.
func chTestCert(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	chCertOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(1),
			Subject:               pkix.Name{CommonName: "*.apps.test"},
			DNSNames:              []string{"*.apps.test"},
			NotBefore:             time.Now().Add(-time.Hour),
			NotAfter:              time.Now().Add(time.Hour),
			KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
			ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			BasicConstraintsValid: true,
			IsCA:                  true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		leaf, err := x509.ParseCertificate(der)
		if err != nil {
			panic(err)
		}
		chCertVal = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
		chCertPool = x509.NewCertPool()
		chCertPool.AddCert(leaf)
	})
	return chCertVal, chCertPool
}

type chHelloKind struct {
	name       string
	serverName string // "" sends no SNI
	alpn       []string
	maxVersion uint16
}

var chHelloKinds = []chHelloKind{
	{"tls13", chSNI, chALPN, tls.VersionTLS13},
	{"tls12", chSNI, chALPN, tls.VersionTLS12},
	{"tls13-nosni", "", chALPN, tls.VersionTLS13},
	{"tls12-nosni-noalpn", "", nil, tls.VersionTLS12},
	{"tls13-noalpn", chSNI, nil, tls.VersionTLS13},
}

func chClientConfig(t testing.TB, k chHelloKind) *tls.Config {
	_, pool := chTestCert(t)
	return &tls.Config{
		ServerName:         k.serverName,
		InsecureSkipVerify: k.serverName == "",
		RootCAs:            pool,
		NextProtos:         k.alpn,
		MinVersion:         tls.VersionTLS12,
		MaxVersion:         k.maxVersion,
	}
}

func chServerConfig(t testing.TB) *tls.Config {
	cert, _ := chTestCert(t)
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   chALPN,
		MinVersion:   tls.VersionTLS12,
	}
}

// captureHello runs a real crypto/tls client over net.Pipe and returns the
// records of its ClientHello. The framing is read here independently of
// ReadClientHello.
func captureHello(t testing.TB, k chHelloKind) []byte {
	t.Helper()
	c1, c2 := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(c1, chClientConfig(t, k)).Handshake()
		_ = c1.Close()
	}()
	defer func() { _ = c2.Close(); <-done }()
	_ = c2.SetDeadline(time.Now().Add(10 * time.Second))
	var raw, msg []byte
	for need := -1; need < 0 || len(msg) < need; {
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(c2, hdr); err != nil {
			t.Fatalf("capture: %v", err)
		}
		body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
		if _, err := io.ReadFull(c2, body); err != nil {
			t.Fatalf("capture: %v", err)
		}
		raw = append(append(raw, hdr...), body...)
		msg = append(msg, body...)
		if len(msg) >= 4 {
			need = 4 + int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
		}
	}
	return raw
}

// helloMessage extracts the handshake message from well-formed records.
func helloMessage(t testing.TB, raw []byte) []byte {
	t.Helper()
	var msg []byte
	for len(raw) > 0 {
		if len(raw) < 5 {
			t.Fatalf("bad framing")
		}
		n := int(binary.BigEndian.Uint16(raw[3:]))
		msg = append(msg, raw[5:5+n]...)
		raw = raw[5+n:]
	}
	return msg
}

// chFrame splits a handshake message into handshake records whose body sizes
// are given by sizes (the last size repeats).
func chFrame(msg []byte, sizes ...int) []byte {
	if len(sizes) == 0 {
		sizes = []int{16384}
	}
	var out []byte
	for i := 0; len(msg) > 0; i++ {
		n := sizes[min(i, len(sizes)-1)]
		n = min(n, len(msg))
		out = append(out, 22, 3, 1, byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// chTCPPair returns both ends of a loopback TCP connection.
func chTCPPair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { _ = client.Close(); _ = r.c.Close() })
	return client, r.c
}

// ---- hello construction for negative cases ---------------------------------

type chExt struct {
	typ  uint16
	data []byte
}

func chU16(n int) []byte { return []byte{byte(n >> 8), byte(n)} }

func sniExt(names ...string) chExt {
	var list []byte
	for _, n := range names {
		list = append(list, 0)
		list = append(list, chU16(len(n))...)
		list = append(list, n...)
	}
	return chExt{0, append(chU16(len(list)), list...)}
}

func alpnExt(protos ...string) chExt {
	var list []byte
	for _, p := range protos {
		list = append(list, byte(len(p)))
		list = append(list, p...)
	}
	return chExt{16, append(chU16(len(list)), list...)}
}

// helloBody builds a ClientHello body with the given extensions.
func helloBody(exts ...chExt) []byte {
	b := []byte{3, 3}
	b = append(b, make([]byte, 32)...) // random
	b = append(b, 32)                  // session id
	b = append(b, bytes.Repeat([]byte{7}, 32)...)
	b = append(b, 0, 4, 0x13, 0x01, 0xc0, 0x2b) // cipher suites
	b = append(b, 1, 0)                         // compression: null
	var e []byte
	for _, x := range exts {
		e = append(e, chU16(int(x.typ))...)
		e = append(e, chU16(len(x.data))...)
		e = append(e, x.data...)
	}
	b = append(b, chU16(len(e))...)
	return append(b, e...)
}

func handshakeMsg(typ byte, body []byte) []byte {
	n := len(body)
	return append([]byte{typ, byte(n >> 16), byte(n >> 8), byte(n)}, body...)
}

func helloRecords(exts ...chExt) []byte {
	return chFrame(handshakeMsg(1, helloBody(exts...)), 16384)
}

// ---- tests ------------------------------------------------------------------

func TestReadClientHelloReplayEndToEnd(t *testing.T) {
	testutil.VerifyNone(t)
	for _, k := range chHelloKinds {
		t.Run(k.name, func(t *testing.T) {
			cli, srv := chTCPPair(t)
			deadline := time.Now().Add(10 * time.Second)
			_ = cli.SetDeadline(deadline)
			_ = srv.SetDeadline(deadline)

			type clientResult struct {
				err   error
				state tls.ConnectionState
				reply string
			}
			cres := make(chan clientResult, 1)
			go func() {
				tc := tls.Client(cli, chClientConfig(t, k))
				defer func() { _ = tc.Close() }()
				var r clientResult
				if r.err = tc.Handshake(); r.err == nil {
					r.state = tc.ConnectionState()
					if _, r.err = tc.Write([]byte("ping from client")); r.err == nil {
						buf := make([]byte, len("pong from server"))
						_, r.err = io.ReadFull(tc, buf)
						r.reply = string(buf)
					}
				}
				cres <- r
			}()

			hello, err := ReadClientHello(srv, 64<<10)
			if err != nil {
				t.Fatalf("ReadClientHello: %v", err)
			}
			if hello.ServerName != k.serverName {
				t.Errorf("ServerName = %q, want %q", hello.ServerName, k.serverName)
			}
			if !slices.Equal(hello.ALPN, k.alpn) {
				t.Errorf("ALPN = %q, want %q", hello.ALPN, k.alpn)
			}

			// crypto/tls must read the same hello from the replayed bytes.
			var chi *tls.ClientHelloInfo
			cfg := chServerConfig(t)
			cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
				chi = h
				return nil, nil
			}
			ts := tls.Server(NewPrefixConn(srv, hello.Raw), cfg)
			if err := ts.Handshake(); err != nil {
				t.Fatalf("server handshake over replayed hello: %v", err)
			}
			if chi == nil || chi.ServerName != hello.ServerName || !slices.Equal(chi.SupportedProtos, hello.ALPN) {
				t.Fatalf("crypto/tls saw %+v, we parsed %+v", chi, hello)
			}
			buf := make([]byte, len("ping from client"))
			if _, err := io.ReadFull(ts, buf); err != nil || string(buf) != "ping from client" {
				t.Fatalf("server read %q, %v", buf, err)
			}
			if _, err := ts.Write([]byte("pong from server")); err != nil {
				t.Fatal(err)
			}
			r := <-cres
			if r.err != nil || r.reply != "pong from server" {
				t.Fatalf("client: %v, reply %q", r.err, r.reply)
			}
			if r.state.Version != k.maxVersion {
				t.Errorf("negotiated version %x, want %x", r.state.Version, k.maxVersion)
			}
			wantProto := ""
			if len(k.alpn) > 0 {
				wantProto = "h2"
			}
			if r.state.NegotiatedProtocol != wantProto {
				t.Errorf("ALPN negotiated %q, want %q", r.state.NegotiatedProtocol, wantProto)
			}
			_ = ts.Close()
		})
	}
}

// A hello that arrives in many small records (and with its 4-byte handshake
// header split across two records) parses the same and is replayed
// successfully to crypto/tls.
func TestReadClientHelloReframedReplay(t *testing.T) {
	testutil.VerifyNone(t)
	for _, sizes := range [][]int{{100}, {2, 100}, {1, 1, 1, 1, 50}, {3, 16384}} {
		t.Run(fmt.Sprint(sizes), func(t *testing.T) {
			cli, srv := chTCPPair(t)
			deadline := time.Now().Add(10 * time.Second)
			_ = cli.SetDeadline(deadline)
			_ = srv.SetDeadline(deadline)
			cerr := make(chan error, 1)
			go func() {
				tc := tls.Client(cli, chClientConfig(t, chHelloKinds[0]))
				err := tc.Handshake()
				if err == nil {
					_, err = tc.Write([]byte("x"))
				}
				_ = tc.Close()
				cerr <- err
			}()
			orig, err := ReadClientHello(srv, 64<<10)
			if err != nil {
				t.Fatal(err)
			}
			reframed := chFrame(helloMessage(t, orig.Raw), sizes...)
			if len(reframed) <= len(orig.Raw) && sizes[0] < 16384 && sizes[len(sizes)-1] < 16384 {
				t.Fatalf("reframing did not add records")
			}
			hello, err := ReadClientHello(bytes.NewReader(reframed), 64<<10)
			if err != nil {
				t.Fatalf("reframed: %v", err)
			}
			if !bytes.Equal(hello.Raw, reframed) || hello.ServerName != chSNI || !slices.Equal(hello.ALPN, chALPN) {
				t.Fatalf("reframed parse differs: %q %q", hello.ServerName, hello.ALPN)
			}
			ts := tls.Server(NewPrefixConn(srv, hello.Raw), chServerConfig(t))
			if err := ts.Handshake(); err != nil {
				t.Fatalf("server handshake over reframed hello: %v", err)
			}
			b := make([]byte, 1)
			if _, err := io.ReadFull(ts, b); err != nil {
				t.Fatal(err)
			}
			if err := <-cerr; err != nil {
				t.Fatal(err)
			}
			_ = ts.Close()
		})
	}
}

// padHello appends a padding extension (RFC 7685) to a real hello so that
// its body is bodyLen bytes.
func padHello(t testing.TB, msg []byte, bodyLen int) []byte {
	t.Helper()
	pad := bodyLen - (len(msg) - 4) - 4
	if pad < 0 {
		t.Fatalf("hello already longer than %d", bodyLen)
	}
	return appendExt(msg, chExt{21, make([]byte, pad)})
}

// appendExt appends an extension to a ClientHello message and fixes the
// lengths.
func appendExt(msg []byte, e chExt) []byte {
	body := slices.Clone(msg[4:])
	// Locate the extensions block: version, random, session id, suites, compression.
	off := 2 + 32
	off += 1 + int(body[off])
	off += 2 + int(binary.BigEndian.Uint16(body[off:]))
	off += 1 + int(body[off])
	extLen := int(binary.BigEndian.Uint16(body[off:]))
	body = append(body, chU16(int(e.typ))...)
	body = append(body, chU16(len(e.data))...)
	body = append(body, e.data...)
	binary.BigEndian.PutUint16(body[off:], uint16(extLen+4+len(e.data)))
	return handshakeMsg(1, body)
}

func TestReadClientHelloLargeMultiRecord(t *testing.T) {
	real := captureHello(t, chHelloKinds[0])
	msg := padHello(t, helloMessage(t, real), 40000)
	for _, sizes := range [][]int{{16384}, {100}, {2, 16384}, {16383}} {
		raw := chFrame(msg, sizes...)
		r := bytes.NewReader(append(slices.Clone(raw), "EXTRA"...))
		h, err := ReadClientHello(r, 64<<10)
		if err != nil {
			t.Fatalf("%v: %v", sizes, err)
		}
		if !bytes.Equal(h.Raw, raw) || h.ServerName != chSNI || !slices.Equal(h.ALPN, chALPN) {
			t.Fatalf("%v: parse differs", sizes)
		}
		if rest, _ := io.ReadAll(r); string(rest) != "EXTRA" {
			t.Fatalf("%v: left %q", sizes, rest)
		}
		// One-byte reads exercise io.ReadFull.
		h, err = ReadClientHello(iotest.OneByteReader(bytes.NewReader(raw)), 64<<10)
		if err != nil || !bytes.Equal(h.Raw, raw) {
			t.Fatalf("%v: one-byte reader: %v", sizes, err)
		}
		// Too large for a smaller limit.
		cr := &chCountingReader{r: bytes.NewReader(raw)}
		if _, err := ReadClientHello(cr, 32<<10); !errors.Is(err, ErrClientHelloTooLarge) {
			t.Fatalf("%v: 32 KiB limit: %v", sizes, err)
		}
		if cr.n > maxReadFor(32<<10) {
			t.Fatalf("read %d bytes, more than %d", cr.n, maxReadFor(32<<10))
		}
	}
}

type chCountingReader struct {
	r io.Reader
	n int
}

func (c *chCountingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestReadClientHelloConsumesExactlyTheHello(t *testing.T) {
	for _, k := range chHelloKinds {
		raw := captureHello(t, k)
		for _, sizes := range [][]int{{16384}, {100}, {2, 2, 100}} {
			framed := chFrame(helloMessage(t, raw), sizes...)
			r := bytes.NewReader(append(slices.Clone(framed), "EXTRA"...))
			h, err := ReadClientHello(r, 64<<10)
			if err != nil {
				t.Fatalf("%s %v: %v", k.name, sizes, err)
			}
			if !bytes.Equal(h.Raw, framed) {
				t.Fatalf("%s %v: Raw is not the hello records", k.name, sizes)
			}
			rest, _ := io.ReadAll(r)
			if string(rest) != "EXTRA" {
				t.Fatalf("%s %v: remaining %q, want EXTRA", k.name, sizes, rest)
			}
		}
	}
}

func TestReadClientHelloNotTLS(t *testing.T) {
	for _, in := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"\x80\x2e\x01\x03\x01\x00\x15", // SSLv2-compatible hello
		"\x15\x03\x03\x00\x02\x02\x28", // alert record
		"\x16\x02\x00\x00\x10",         // handshake byte, not 3.x
		"\x16\x10\x00\x00\x10",
	} {
		r := strings.NewReader(in)
		h, err := ReadClientHello(r, 64<<10)
		if !errors.Is(err, ErrNotTLS) || h != nil {
			t.Errorf("%q: %v, want ErrNotTLS", in, err)
		}
		if r.Len() != len(in)-5 {
			t.Errorf("%q: read %d bytes, want 5", in, len(in)-r.Len())
		}
	}
}

func TestReadClientHelloTruncated(t *testing.T) {
	for _, k := range chHelloKinds[:2] {
		real := captureHello(t, k)
		for _, raw := range [][]byte{real, chFrame(helloMessage(t, real), 2, 100)} {
			for i := range len(raw) {
				_, err := ReadClientHello(bytes.NewReader(raw[:i]), 64<<10)
				want := io.ErrUnexpectedEOF
				if i == 0 {
					want = io.EOF
				}
				if !errors.Is(err, want) {
					t.Fatalf("%s: prefix %d/%d: %v, want %v", k.name, i, len(raw), err, want)
				}
			}
		}
	}
}

func TestReadClientHelloRejects(t *testing.T) {
	real := captureHello(t, chHelloKinds[0])
	msg := helloMessage(t, real)
	multi := chFrame(msg, 100)

	wrongType := func(typ byte) []byte {
		b := slices.Clone(multi)
		b[105] = typ // header of the second record
		return b
	}
	withRecordVersion := func(i int, v uint16) []byte {
		b := slices.Clone(multi)
		binary.BigEndian.PutUint16(b[i*105+1:], v)
		return b
	}
	long := strings.Repeat("a", 256)

	tests := []struct {
		name     string
		in       []byte
		max      int
		kind     error
		alert    uint8
		consumed int // bytes that may be read, -1: not checked
	}{
		{"application data mid-hello", wrongType(23), 0, ErrMalformedClientHello, AlertUnexpectedMessage, 110},
		{"change_cipher_spec mid-hello", wrongType(20), 0, ErrMalformedClientHello, AlertUnexpectedMessage, 110},
		{"alert mid-hello", wrongType(21), 0, ErrMalformedClientHello, AlertUnexpectedMessage, 110},
		{"record version 3.5", withRecordVersion(0, 0x0305), 0, ErrMalformedClientHello, AlertProtocolVersion, 5},
		{"second record version 3.5", withRecordVersion(1, 0x0305), 0, ErrMalformedClientHello, AlertProtocolVersion, 110},
		{"second record version 2.0", withRecordVersion(1, 0x0200), 0, ErrMalformedClientHello, AlertProtocolVersion, 110},
		{"record length 0", []byte{22, 3, 1, 0, 0, 1, 0, 0, 1}, 0, ErrMalformedClientHello, AlertUnexpectedMessage, 5},
		{"second record length 0", append(chFrame(msg[:10]), append([]byte{22, 3, 3, 0, 0}, chFrame(msg[10:])...)...), 0, ErrMalformedClientHello, AlertUnexpectedMessage, 20},
		{"record length 16385", append([]byte{22, 3, 1, 0x40, 0x01}, make([]byte, 16385)...), 0, ErrMalformedClientHello, AlertRecordOverflow, 5},
		{"second record length 16385", append(chFrame(msg[:2]), 22, 3, 3, 0x40, 0x01), 0, ErrMalformedClientHello, AlertRecordOverflow, 12},
		{"server hello", chFrame(handshakeMsg(2, helloBody())), 0, ErrMalformedClientHello, AlertUnexpectedMessage, -1},
		{"hello length over maxBytes", real, len(msg) - 5, ErrClientHelloTooLarge, AlertHandshakeFailure, len(real)},
		{"record over limit", real, 100, ErrClientHelloTooLarge, AlertHandshakeFailure, 5},
		{"hello length over maxBytes, header split", chFrame(msg, 2, 100), len(msg) - 5, ErrClientHelloTooLarge, AlertHandshakeFailure, 112},
		{"hello length 2^24-1", chFrame([]byte{1, 0xff, 0xff, 0xff, 0, 0}), 0, ErrClientHelloTooLarge, AlertHandshakeFailure, -1},
		{"record overhead over limit (1-byte records)", chFrame(msg, 1), len(msg), ErrClientHelloTooLarge, AlertHandshakeFailure, -1},
		{"record overhead over limit at the last record", chFrame(msg, append(slices.Repeat([]int{1}, 256), 16384)...), len(msg) - 4, ErrClientHelloTooLarge, AlertHandshakeFailure, 256*6 + 5},
		{"data after the hello in its last record", chFrame(append(slices.Clone(msg), 20, 0, 0, 0)), 0, ErrMalformedClientHello, AlertUnexpectedMessage, -1},
		{"data after the hello, next record", chFrame(append(slices.Clone(msg), 20, 0, 0, 0), len(msg)-2), 0, ErrMalformedClientHello, AlertUnexpectedMessage, len(msg) - 2 + 10},
		{"duplicate SNI extension", helloRecords(sniExt(chSNI), alpnExt("h2"), sniExt(chSNI)), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"duplicate ALPN extension", helloRecords(alpnExt("h2"), alpnExt("h2")), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"duplicate unknown extension", helloRecords(chExt{0x1234, nil}, chExt{0x1234, nil}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"duplicate GREASE extension", helloRecords(chExt{0x0a0a, nil}, chExt{0x1a1a, nil}, chExt{0x0a0a, nil}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"two host_names", helloRecords(sniExt("a.test", "b.test")), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"SNI with NUL", helloRecords(sniExt("team--demo--web.apps.test\x00.evil")), 0, ErrMalformedClientHello, AlertUnrecognizedName, -1},
		{"SNI with space", helloRecords(sniExt("a b.test")), 0, ErrMalformedClientHello, AlertUnrecognizedName, -1},
		{"SNI with slash", helloRecords(sniExt("a/b.test")), 0, ErrMalformedClientHello, AlertUnrecognizedName, -1},
		{"SNI with backslash", helloRecords(sniExt(`a\b.test`)), 0, ErrMalformedClientHello, AlertUnrecognizedName, -1},
		{"SNI with DEL", helloRecords(sniExt("a\x7fb.test")), 0, ErrMalformedClientHello, AlertUnrecognizedName, -1},
		{"SNI with UTF-8", helloRecords(sniExt("bücher.test")), 0, ErrMalformedClientHello, AlertUnrecognizedName, -1},
		{"SNI 256 bytes", helloRecords(sniExt(long)), 0, ErrMalformedClientHello, AlertUnrecognizedName, -1},
		{"SNI empty name", helloRecords(sniExt("")), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"SNI empty list", helloRecords(chExt{0, []byte{0, 0}}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"SNI empty extension", helloRecords(chExt{0, nil}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"SNI list length mismatch", helloRecords(chExt{0, []byte{0, 9, 0, 0, 1, 'a'}}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"SNI trailing bytes", helloRecords(chExt{0, []byte{0, 4, 0, 0, 1, 'a', 0}}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"SNI truncated name", helloRecords(chExt{0, []byte{0, 4, 0, 0, 5, 'a'}}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"ALPN empty list", helloRecords(chExt{16, []byte{0, 0}}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"ALPN empty extension", helloRecords(chExt{16, nil}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"ALPN empty name", helloRecords(alpnExt("h2", "")), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"ALPN truncated name", helloRecords(chExt{16, []byte{0, 3, 2, 'h', '2', 5}}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"ALPN trailing bytes", helloRecords(chExt{16, []byte{0, 3, 2, 'h', '2', 0}}), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"pre_shared_key not last", helloRecords(chExt{41, []byte{0}}, chExt{0x1234, nil}), 0, ErrMalformedClientHello, AlertIllegalParameter, -1},
		{"extension truncated", helloRecordsMutated(func(b []byte) []byte { return append(b[:len(b)-1], 0, 0, 0) }), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"extensions length too long", helloRecordsMutated(func(b []byte) []byte { return append(b, 0) }), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"extensions length too short", helloRecordsMutated(func(b []byte) []byte { return append(b, 0, 0, 0, 0) }), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"extensions length 1 byte", chFrame(handshakeMsg(1, append(helloBody()[:len(helloBody())-2], 0))), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"legacy_version 2.0", chFrame(handshakeMsg(1, append([]byte{2, 0}, helloBody()[2:]...))), 0, ErrMalformedClientHello, AlertProtocolVersion, -1},
		{"session id 33 bytes", chFrame(handshakeMsg(1, bodyWith(33, 2, 1))), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"no cipher suites", chFrame(handshakeMsg(1, bodyWith(0, 0, 1))), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"odd cipher suites", chFrame(handshakeMsg(1, bodyWith(0, 3, 1))), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"no compression methods", chFrame(handshakeMsg(1, bodyWith(0, 2, 0))), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"empty hello", chFrame(handshakeMsg(1, nil)), 0, ErrMalformedClientHello, AlertDecodeError, -1},
		{"truncated random", chFrame(handshakeMsg(1, []byte{3, 3, 1, 2})), 0, ErrMalformedClientHello, AlertDecodeError, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			max := tc.max
			if max == 0 {
				max = 64 << 10
			}
			cr := &chCountingReader{r: bytes.NewReader(append(slices.Clone(tc.in), "EXTRA"...))}
			h, err := ReadClientHello(cr, max)
			if err == nil || h != nil {
				t.Fatalf("accepted: %+v", h)
			}
			if !errors.Is(err, tc.kind) {
				t.Fatalf("error %v, want %v", err, tc.kind)
			}
			var ce *ClientHelloError
			if !errors.As(err, &ce) || ce.Alert != tc.alert {
				t.Fatalf("error %v: alert %v, want %d", err, ce, tc.alert)
			}
			if tc.consumed >= 0 && cr.n != tc.consumed {
				t.Fatalf("read %d bytes, want %d", cr.n, tc.consumed)
			}
			if cr.n > maxReadFor(max) {
				t.Fatalf("read %d bytes, more than %d", cr.n, maxReadFor(max))
			}
		})
	}
}

// helloRecordsMutated builds a hello with one SNI extension, lets f change
// the end of the body (the extensions block), and fixes the handshake length.
func helloRecordsMutated(f func([]byte) []byte) []byte {
	return chFrame(handshakeMsg(1, f(helloBody(sniExt("a.test")))), 16384)
}

// bodyWith builds a hello body without extensions with the given
// session id, cipher_suites and compression_methods lengths.
func bodyWith(sid, suites, comp int) []byte {
	b := []byte{3, 3}
	b = append(b, make([]byte, 32)...)
	b = append(b, byte(sid))
	b = append(b, make([]byte, sid)...)
	b = append(b, chU16(suites)...)
	b = append(b, bytes.Repeat([]byte{0x13}, suites)...)
	b = append(b, byte(comp))
	return append(b, make([]byte, comp)...)
}

func TestReadClientHelloAccepts(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		sni  string
		alpn []string
	}{
		{"no extensions block (TLS 1.2)", chFrame(handshakeMsg(1, bodyWith(0, 2, 1))), "", nil},
		{"empty extensions block", chFrame(handshakeMsg(1, helloBody())), "", nil},
		{"unknown name type skipped", helloRecords(chExt{0, []byte{0, 13, 7, 0, 1, 'x', 0, 0, 6, 'a', '.', 't', 'e', 's', 't'}}), "a.test", nil},
		{"only unknown name type", helloRecords(chExt{0, []byte{0, 4, 7, 0, 1, 'x'}}), "", nil},
		{"case preserved", helloRecords(sniExt("Team--Demo--Web.Apps.Test")), "Team--Demo--Web.Apps.Test", nil},
		{"trailing dot left to caller", helloRecords(sniExt("a.test.")), "a.test.", nil},
		{"255-byte name", helloRecords(sniExt(strings.Repeat("a", 255))), strings.Repeat("a", 255), nil},
		{"many ALPN names", helloRecords(alpnExt("a", "b", "c", "d", "e", "f")), "", []string{"a", "b", "c", "d", "e", "f"}},
		{"255-byte ALPN name", helloRecords(alpnExt(strings.Repeat("p", 255))), "", []string{strings.Repeat("p", 255)}},
		{"pre_shared_key last", helloRecords(sniExt("a.test"), chExt{41, []byte{0}}), "a.test", nil},
		{"SSL 3.0 record version", append([]byte{22, 3, 0}, helloRecords(sniExt("a.test"))[3:]...), "a.test", nil},
		{"TLS 1.3 record version", append([]byte{22, 3, 4}, helloRecords(sniExt("a.test"))[3:]...), "a.test", nil},
		{"many distinct extensions", helloRecords(manyExts(3000)...), "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ReadClientHello(bytes.NewReader(tc.in), 64<<10)
			if err != nil {
				t.Fatal(err)
			}
			if h.ServerName != tc.sni || !slices.Equal(h.ALPN, tc.alpn) || !bytes.Equal(h.Raw, tc.in) {
				t.Fatalf("got %q %q", h.ServerName, h.ALPN)
			}
		})
	}
	// Duplicates are found among many distinct extensions too.
	exts := append(manyExts(3000), chExt{0xffef, nil})
	if _, err := ReadClientHello(bytes.NewReader(helloRecords(exts...)), 64<<10); !errors.Is(err, ErrMalformedClientHello) {
		t.Fatalf("duplicate among 3001 extensions: %v", err)
	}
}

// manyExts returns n empty extensions with distinct types, high and low.
func manyExts(n int) []chExt {
	var out []chExt
	for i := range n {
		out = append(out, chExt{uint16(0xffff - i*16), nil})
	}
	out = append(out, chExt{5, nil}, chExt{200, nil})
	return out
}

func TestReadClientHelloReadErrors(t *testing.T) {
	raw := captureHello(t, chHelloKinds[0])
	boom := errors.New("boom")
	r := io.MultiReader(bytes.NewReader(raw[:50]), iotest.ErrReader(boom))
	if _, err := ReadClientHello(r, 0); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the reader's error", err)
	}
	// A timeout surfaces as a net.Error.
	c1, c2 := net.Pipe()
	defer func() { _ = c1.Close() }()
	defer func() { _ = c2.Close() }()
	_ = c2.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := ReadClientHello(c2, 0)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("got %v, want a timeout", err)
	}
}

// chGoParse hands raw to a crypto/tls server and returns the ClientHelloInfo
// it parsed, or nil when crypto/tls refused the bytes before that point.
func chGoParse(raw []byte) *tls.ClientHelloInfo {
	var info *tls.ClientHelloInfo
	srv := tls.Server(&chReplayConn{r: bytes.NewReader(raw)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			info = h
			return nil, errors.New("stop")
		},
	})
	_ = srv.Handshake()
	return info
}

// chReplayConn reads from a byte slice (then EOF) and discards writes.
type chReplayConn struct {
	net.Conn // nil: methods not defined here panic
	r        *bytes.Reader
}

func (c *chReplayConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *chReplayConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *chReplayConn) Close() error                     { return nil }
func (c *chReplayConn) SetDeadline(time.Time) error      { return nil }
func (c *chReplayConn) SetReadDeadline(time.Time) error  { return nil }
func (c *chReplayConn) SetWriteDeadline(time.Time) error { return nil }

// stricterThanGo lists the rejections that are deliberate additions to what
// crypto/tls checks while reading a ClientHello.
func stricterThanGo(err error) bool {
	var ce *ClientHelloError
	if errors.Is(err, ErrNotTLS) {
		return true // crypto/tls accepts any first-record version below 0x1000
	}
	if !errors.As(err, &ce) {
		return false
	}
	if ce.kind == ErrClientHelloTooLarge {
		return strings.Contains(ce.Reason, "records exceed") || strings.Contains(ce.Reason, "record exceeds")
	}
	for _, s := range []string{
		"record version", "data after the ClientHello", "legacy_version",
		"legacy_session_id longer", "cipher_suites length", "empty legacy_compression",
		"host_name contains", "host_name longer",
	} {
		if strings.Contains(ce.Reason, s) {
			return true
		}
	}
	return false
}

// checkAgainstGo compares ReadClientHello with crypto/tls on the same bytes.
func checkAgainstGo(t testing.TB, in []byte, got *ClientHello, err error) {
	info := chGoParse(in)
	if info == nil {
		return // crypto/tls refused; it checks extension contents we skip
	}
	if slices.Contains(info.Extensions, 0xfe0d) {
		return // ECH: crypto/tls may report the inner hello
	}
	if err != nil {
		if !stricterThanGo(err) {
			t.Fatalf("crypto/tls accepts a hello we reject: %v\n%x", err, in)
		}
		return
	}
	if got.ServerName != info.ServerName || !slices.Equal(got.ALPN, info.SupportedProtos) {
		t.Fatalf("crypto/tls read %q %q, we read %q %q\n%x", info.ServerName, info.SupportedProtos, got.ServerName, got.ALPN, in)
	}
}

// Random mutations of real hellos: no panic, and crypto/tls agrees on
// every hello it accepts.
func TestReadClientHelloMutationsAgainstCryptoTLS(t *testing.T) {
	testutil.VerifyNone(t)
	rng := mrand.New(mrand.NewPCG(1, 2))
	for _, k := range chHelloKinds {
		raw := captureHello(t, k)
		h, err := ReadClientHello(bytes.NewReader(raw), 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		checkAgainstGo(t, raw, h, err)
		for range 300 {
			m := slices.Clone(raw)
			for range 1 + rng.IntN(3) {
				m[rng.IntN(len(m))] = byte(rng.Uint32())
			}
			h, err := ReadClientHello(bytes.NewReader(m), 64<<10)
			checkAgainstGo(t, m, h, err)
		}
	}
}

func BenchmarkReadClientHello(b *testing.B) {
	for _, k := range []chHelloKind{chHelloKinds[0], chHelloKinds[1]} {
		raw := captureHello(b, k)
		b.Run(k.name, func(b *testing.B) {
			r := bytes.NewReader(raw)
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(raw)
				h, err := ReadClientHello(r, 64<<10)
				if err != nil || h.ServerName != chSNI {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestReadClientHelloMaxBytesBounds(t *testing.T) {
	raw := captureHello(t, chHelloKinds[0])
	for _, max := range []int{0, -1, math.MaxInt, len(helloMessage(t, raw)) - 4} {
		h, err := ReadClientHello(bytes.NewReader(raw), max)
		if err != nil || h.ServerName != chSNI {
			t.Fatalf("maxBytes %d: %v", max, err)
		}
	}
	if got := maxReadFor(0); got != DefaultMaxClientHelloBytes+4+1280 {
		t.Fatalf("maxReadFor(0) = %d", got)
	}
	if got := maxReadFor(math.MaxInt); got != 1<<24-1+4+1280 {
		t.Fatalf("maxReadFor(MaxInt) = %d", got)
	}
}
