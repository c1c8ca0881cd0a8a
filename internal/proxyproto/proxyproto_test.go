package proxyproto

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"io"
	"net/netip"
	"strings"
	"testing"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// TestAppendWireFormat compares Append with headers written out by hand
// from the specification, byte by byte.
func TestAppendWireFormat(t *testing.T) {
	sig := "0d0a0d0a000d0a515549540a"
	for _, tc := range []struct {
		name string
		h    Header
		want string
	}{
		{"tcp4", Header{Command: Proxy, Source: ap("192.0.2.1:51000"), Destination: ap("198.51.100.7:443")},
			sig + "21" + "11" + "000c" + "c0000201" + "c6336407" + "c738" + "01bb"},
		{"tcp4 with authority", Header{Command: Proxy, Source: ap("127.0.0.2:1"), Destination: ap("127.0.0.1:2"), Authority: "a.test"},
			sig + "21" + "11" + "0015" + "7f000002" + "7f000001" + "0001" + "0002" + "02" + "0006" + hex.EncodeToString([]byte("a.test"))},
		{"tcp6", Header{Command: Proxy, Source: ap("[2001:db8::1]:8080"), Destination: ap("[2001:db8::2]:443")},
			sig + "21" + "21" + "0024" + "20010db8000000000000000000000001" + "20010db8000000000000000000000002" + "1f90" + "01bb"},
		{"mixed families are sent as IPv6", Header{Command: Proxy, Source: ap("192.0.2.1:1"), Destination: ap("[2001:db8::2]:2")},
			sig + "21" + "21" + "0024" + "00000000000000000000ffffc0000201" + "20010db8000000000000000000000002" + "0001" + "0002"},
		{"IPv4-mapped on both sides are sent as IPv4", Header{Command: Proxy, Source: ap("[::ffff:10.0.0.1]:1"), Destination: ap("[::ffff:10.0.0.2]:2")},
			sig + "21" + "11" + "000c" + "0a000001" + "0a000002" + "0001" + "0002"},
		{"local", Header{Command: Local}, sig + "20" + "00" + "0000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.h.Append([]byte("x"))
			if err != nil {
				t.Fatal(err)
			}
			if h := hex.EncodeToString(got[1:]); h != tc.want || got[0] != 'x' {
				t.Fatalf("Append:\n got %s\nwant %s", h, tc.want)
			}
		})
	}
}

func TestAppendRefuses(t *testing.T) {
	for name, h := range map[string]Header{
		"proxy without addresses":  {Command: Proxy},
		"proxy without dest":       {Command: Proxy, Source: ap("1.2.3.4:5")},
		"unknown command":          {Command: 7},
		"authority with a space":   {Command: Local, Authority: "a b"},
		"authority over 255 bytes": {Command: Local, Authority: strings.Repeat("a", 256)},
	} {
		if b, err := h.Append(nil); err == nil {
			t.Errorf("%s: Append = %x, want an error", name, b)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Command: Proxy, Source: ap("192.0.2.1:51000"), Destination: ap("198.51.100.7:443"), Authority: "team--demo--web.apps.example.com"},
		{Command: Proxy, Source: ap("[2001:db8::1]:8080"), Destination: ap("[2001:db8::2]:443")},
		{Command: Proxy, Source: ap("127.0.0.2:40000"), Destination: ap("127.0.0.1:8443"), Authority: strings.Repeat("a", 255)},
		{Command: Local},
		{Command: Local, Authority: "health.test"},
	} {
		b, err := h.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		// Read reads exactly the header: what follows stays in r.
		r := bytes.NewReader(append(bytes.Clone(b), "\x16\x03\x01rest"...))
		got, err := Read(r, 0)
		if err != nil {
			t.Fatalf("Read(%x): %v", b, err)
		}
		if got != h {
			t.Fatalf("Read = %+v, want %+v", got, h)
		}
		if rest, _ := io.ReadAll(r); string(rest) != "\x16\x03\x01rest" {
			t.Fatalf("after Read, %q left, want the bytes after the header", rest)
		}
		got, n, err := Parse(append(bytes.Clone(b), "tail"...))
		if err != nil || got != h || n != len(b) {
			t.Fatalf("Parse = %+v, %d, %v; want %+v, %d", got, n, err, h, len(b))
		}
	}
}

// header builds a v2 header from its parts; body is what follows the
// 16 fixed bytes; length overrides the length field when >= 0.
func header(verCmd, fam byte, length int, body []byte) []byte {
	b := append([]byte(Signature), verCmd, fam, 0, 0)
	if length < 0 {
		length = len(body)
	}
	binary.BigEndian.PutUint16(b[14:], uint16(length))
	return append(b, body...)
}

var tcp4Addrs = []byte{10, 0, 0, 1, 10, 0, 0, 2, 0x30, 0x39, 0x01, 0xbb}

func tlv(typ byte, v []byte) []byte {
	return append([]byte{typ, byte(len(v) >> 8), byte(len(v))}, v...)
}

// withCRC appends a CRC32C TLV to hdr (whose length field it updates)
// holding the right checksum, or that checksum XOR flip.
func withCRC(hdr []byte, flip uint32) []byte {
	b := append(bytes.Clone(hdr), tlv(tlvCRC32C, make([]byte, 4))...)
	binary.BigEndian.PutUint16(b[14:], uint16(len(b)-fixedLen))
	sum := crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) ^ flip
	binary.BigEndian.PutUint32(b[len(b)-4:], sum)
	return b
}

func concat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestParseAccepts(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want Header
	}{
		{"tcp4", header(0x21, famTCP4, -1, tcp4Addrs),
			Header{Command: Proxy, Source: ap("10.0.0.1:12345"), Destination: ap("10.0.0.2:443")}},
		{"unknown TLVs are skipped", header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(0x04, []byte("noop")), tlv(0xE0, nil), tlv(0x20, []byte{1, 2, 3}))),
			Header{Command: Proxy, Source: ap("10.0.0.1:12345"), Destination: ap("10.0.0.2:443")}},
		{"a matching CRC32C", withCRC(header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(tlvAuthority, []byte("a.test")))), 0),
			Header{Command: Proxy, Source: ap("10.0.0.1:12345"), Destination: ap("10.0.0.2:443"), Authority: "a.test"}},
		{"IPv4-mapped TCP6 addresses come back as IPv4", header(0x21, famTCP6, -1, concat(
			[]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1}, []byte{0x20, 0x01, 0x0d, 0xb8, 14: 0, 15: 2}, []byte{0, 1, 0, 2})),
			Header{Command: Proxy, Source: ap("10.0.0.1:1"), Destination: ap("[2001:db8::2]:2")}},
		{"local ignores addresses", header(0x20, famTCP4, -1, tcp4Addrs), Header{Command: Local}},
		{"local over a UNIX family", header(0x20, famUnixStream, -1, make([]byte, 216)), Header{Command: Local}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, n, err := Parse(tc.in)
			if err != nil || h != tc.want || n != len(tc.in) {
				t.Fatalf("Parse = %+v, %d, %v; want %+v, %d", h, n, err, tc.want, len(tc.in))
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"v1 text header", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), ErrNotProxy},
		{"TLS record", []byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03abcdef"), ErrNotProxy},
		{"signature off by one byte", append([]byte("\r\n\r\n\x00\r\nQUIT\r"), 0x21, 0x11, 0, 0), ErrNotProxy},
		{"version 1 nibble", header(0x11, famTCP4, -1, tcp4Addrs), ErrMalformed},
		{"version 3 nibble", header(0x31, famTCP4, -1, tcp4Addrs), ErrMalformed},
		{"command 2", header(0x22, famTCP4, -1, tcp4Addrs), ErrMalformed},
		{"undefined family", header(0x21, 0x13, -1, tcp4Addrs), ErrMalformed},
		{"undefined family on local", header(0x20, 0x41, 0, nil), ErrMalformed},
		{"proxy over UNSPEC", header(0x21, famUnspec, 0, nil), ErrMalformed},
		{"proxy over UDP4", header(0x21, famUDP4, -1, tcp4Addrs), ErrMalformed},
		{"proxy over UNIX", header(0x21, famUnixStream, -1, make([]byte, 216)), ErrMalformed},
		{"length shorter than TCP4 addresses", header(0x21, famTCP4, 11, tcp4Addrs[:11]), ErrMalformed},
		{"length shorter than TCP6 addresses", header(0x21, famTCP6, 12, tcp4Addrs), ErrMalformed},
		{"truncated TLV header", header(0x21, famTCP4, -1, concat(tcp4Addrs, []byte{0x02, 0})), ErrMalformed},
		{"TLV overruns the header", header(0x21, famTCP4, -1, concat(tcp4Addrs, []byte{0x04, 0, 9, 1})), ErrMalformed},
		{"two authorities", header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(2, []byte("a")), tlv(2, []byte("b")))), ErrMalformed},
		{"empty authority", header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(2, nil))), ErrMalformed},
		{"authority with a NUL", header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(2, []byte("a\x00b")))), ErrMalformed},
		{"authority over 255 bytes", header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(2, bytes.Repeat([]byte("a"), 256)))), ErrMalformed},
		{"CRC32C mismatch", withCRC(header(0x21, famTCP4, -1, tcp4Addrs), 1), ErrMalformed},
		{"CRC32C of 3 bytes", header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(3, []byte{1, 2, 3}))), ErrMalformed},
		{"two CRC32Cs", header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(3, make([]byte, 4)), tlv(3, make([]byte, 4)))), ErrMalformed},
		{"truncated fixed part", []byte(Signature + "\x21\x11"), io.ErrUnexpectedEOF},
		{"truncated body", header(0x21, famTCP4, 12, tcp4Addrs[:5]), io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, n, err := Parse(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Parse = %+v, %d, %v; want %v", h, n, err, tc.want)
			}
			// Read agrees, except that it reports a short input as the
			// reader's end.
			_, rerr := Read(bytes.NewReader(tc.in), 0)
			if !errors.Is(rerr, tc.want) {
				t.Fatalf("Read: %v; want %v", rerr, tc.want)
			}
		})
	}
}

func TestReadLimits(t *testing.T) {
	big := header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(0xE0, make([]byte, 200))))
	cr := &countingReader{r: bytes.NewReader(big)}
	if _, err := Read(cr, 100); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Read(max 100) of %d bytes: %v, want ErrTooLarge", len(big), err)
	}
	if cr.n != fixedLen {
		t.Fatalf("Read refusing a large header read %d bytes, want only the fixed %d", cr.n, fixedLen)
	}
	if _, err := Read(bytes.NewReader(big), 0); err != nil {
		t.Fatalf("Read(default limit) of %d bytes: %v", len(big), err)
	}
	huge := header(0x21, famTCP4, 0xffff, nil)
	if _, err := Read(bytes.NewReader(huge), 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Read of a declared 64 KiB header: %v, want ErrTooLarge (default limit %d)", err, MaxHeaderLen)
	}
	if _, err := Read(bytes.NewReader(nil), 0); err != io.EOF {
		t.Fatalf("Read of nothing: %v, want io.EOF", err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += n
	return n, err
}

func TestPrefixes(t *testing.T) {
	for _, tc := range []struct {
		in     string
		v2, v1 bool
	}{
		{"\r\n\r\n\x00", true, false},
		{Signature + "\x21", true, false},
		{"\r\n\r\n\x01", false, false},
		{"PROXY", false, true},
		{"PROXY TCP4", false, true},
		{"PROXZ", false, false},
		{"\x16\x03\x01\x00\x10", false, false},
		{"GET /", false, false},
		{"", false, false},
	} {
		if got := IsV2([]byte(tc.in)); got != tc.v2 {
			t.Errorf("IsV2(%q) = %v", tc.in, got)
		}
		if got := IsV1([]byte(tc.in)); got != tc.v1 {
			t.Errorf("IsV1(%q) = %v", tc.in, got)
		}
	}
}

// BenchmarkAppend: the header the edge writes per connection.
func BenchmarkAppend(b *testing.B) {
	h := Header{Command: Proxy, Source: ap("203.0.113.7:40000"), Destination: ap("10.0.0.1:8443"), Authority: "team--demo--web.apps.example.com"}
	buf := make([]byte, 0, 128)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.Append(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRead: the header the listener reads per connection.
func BenchmarkRead(b *testing.B) {
	h := Header{Command: Proxy, Source: ap("203.0.113.7:40000"), Destination: ap("10.0.0.1:8443"), Authority: "team--demo--web.apps.example.com"}
	raw, err := h.Append(nil)
	if err != nil {
		b.Fatal(err)
	}
	r := bytes.NewReader(raw)
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(raw)
		if _, err := Read(r, 0); err != nil {
			b.Fatal(err)
		}
	}
}
