package tlshello

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
)

// FuzzReadClientHello checks, for any input, that ReadClientHello does not
// panic, reads at most maxBytes plus the record allowance, and on success
// returns Raw equal to exactly the bytes it read (a prefix of the input)
// that reparse to the same result; it also compares with crypto/tls.
func FuzzReadClientHello(f *testing.F) {
	for _, k := range chHelloKinds {
		raw := captureHello(f, k)
		msg := helloMessage(f, raw)
		f.Add(raw)
		f.Add(chFrame(msg, 100))
		f.Add(chFrame(msg, 2, 2, 300))
		f.Add(append(slices.Clone(raw), "EXTRA"...))
		f.Add(raw[:len(raw)/2])
		f.Add(chFrame(appendExt(msg, sniExt("other.apps.test")))) // duplicate SNI when k has one
		f.Add(chFrame(appendExt(msg, alpnExt("h2", ""))))
	}
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add(helloRecords(sniExt(chSNI), alpnExt("h2", "http/1.1")))
	f.Add(helloRecords(sniExt("a.test"), sniExt("b.test")))
	f.Add(helloRecords(sniExt("a\x00b")))
	f.Add(helloRecords(chExt{16, []byte{0, 0}}))
	f.Add(helloRecords(chExt{41, []byte{0}}, chExt{0x0a0a, nil}))
	f.Add(chFrame(handshakeMsg(1, bodyWith(0, 2, 1))))
	f.Add([]byte{22, 3, 1, 0, 0})
	f.Add([]byte{22, 3, 1, 0x40, 0x01})

	f.Fuzz(func(t *testing.T, in []byte) {
		for _, max := range []int{64 << 10, 512} {
			cr := &chCountingReader{r: bytes.NewReader(in)}
			h, err := ReadClientHello(cr, max)
			if cr.n > maxReadFor(max) {
				t.Fatalf("read %d bytes, limit %d", cr.n, maxReadFor(max))
			}
			if err != nil {
				if h != nil {
					t.Fatalf("result with error %v", err)
				}
				var ce *ClientHelloError
				if !errors.Is(err, ErrNotTLS) && !errors.As(err, &ce) &&
					err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("unexpected error type %T: %v", err, err)
				}
				if err == ErrNotTLS && cr.n != 5 {
					t.Fatalf("ErrNotTLS after reading %d bytes", cr.n)
				}
			} else {
				if len(h.Raw) != cr.n || !bytes.HasPrefix(in, h.Raw) {
					t.Fatalf("Raw (%d bytes) is not the %d bytes read", len(h.Raw), cr.n)
				}
				h2, err := ReadClientHello(bytes.NewReader(h.Raw), max)
				if err != nil {
					t.Fatalf("reparse of Raw: %v", err)
				}
				if h2.ServerName != h.ServerName || !slices.Equal(h2.ALPN, h.ALPN) || !bytes.Equal(h2.Raw, h.Raw) {
					t.Fatalf("reparse differs: %q %q vs %q %q", h2.ServerName, h2.ALPN, h.ServerName, h.ALPN)
				}
			}
			if max == 64<<10 {
				checkAgainstGo(t, in, h, err)
			}
		}
	})
}
