package proxyproto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzParse checks, for any input, that Parse and Read neither panic nor
// disagree, that Read never reads beyond the header (nor beyond the
// fixed part of one over its limit), and that every accepted header
// encodes back to a header that decodes to the same value.
func FuzzParse(f *testing.F) {
	for _, h := range []Header{
		{Command: Proxy, Source: ap("192.0.2.1:51000"), Destination: ap("198.51.100.7:443"), Authority: "team--demo--web.apps.example.com"},
		{Command: Proxy, Source: ap("[2001:db8::1]:8080"), Destination: ap("[2001:db8::2]:443")},
		{Command: Local},
	} {
		b, err := h.Append(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add(withCRC(header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(tlvAuthority, []byte("a.test")))), 0))
	f.Add(header(0x21, famTCP4, -1, concat(tcp4Addrs, tlv(0x04, nil), tlv(0x20, []byte{1, 2}))))
	f.Add(header(0x20, famUnixStream, -1, make([]byte, 216)))
	f.Add([]byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"))
	f.Add([]byte("\x16\x03\x01\x00\x05hello"))

	f.Fuzz(func(t *testing.T, in []byte) {
		h, n, perr := Parse(in)
		cr := &countingReader{r: bytes.NewReader(in)}
		rh, rerr := Read(cr, MaxHeaderLen)
		if perr != nil {
			if h != (Header{}) || n != 0 {
				t.Fatalf("Parse failed (%v) but returned %+v, %d", perr, h, n)
			}
			if rerr == nil {
				t.Fatalf("Parse: %v, but Read accepted %+v", perr, rh)
			}
			if cr.n > len(in) || (errors.Is(rerr, ErrTooLarge) && cr.n != fixedLen) {
				t.Fatalf("Read read %d bytes before failing with %v", cr.n, rerr)
			}
			return
		}
		if n < fixedLen || n > len(in) {
			t.Fatalf("Parse length %d of %d input bytes", n, len(in))
		}
		if n > MaxHeaderLen {
			if !errors.Is(rerr, ErrTooLarge) {
				t.Fatalf("a %d-byte header: Read: %v, want ErrTooLarge", n, rerr)
			}
			return
		}
		if rerr != nil || rh != h || cr.n != n {
			t.Fatalf("Read = %+v, %v after %d bytes; Parse = %+v, %d", rh, rerr, cr.n, h, n)
		}
		if h.Command == Proxy && (!h.Source.IsValid() || !h.Destination.IsValid()) {
			t.Fatalf("a PROXY header without addresses: %+v", h)
		}
		b, err := h.Append(nil)
		if err != nil {
			t.Fatalf("Append(%+v): %v", h, err)
		}
		h2, n2, err := Parse(b)
		if err != nil || h2 != h || n2 != len(b) {
			t.Fatalf("round trip of %+v: %+v, %d, %v", h, h2, n2, err)
		}
		if _, err := Read(bytes.NewReader(b[:len(b)-1]), 0); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("Read of a truncated header: %v", err)
		}
	})
}
