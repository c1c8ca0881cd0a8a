package tlshello

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

func TestWriteAlertBytes(t *testing.T) {
	var b bytes.Buffer
	if err := WriteAlert(&b, AlertUnrecognizedName); err != nil {
		t.Fatal(err)
	}
	if want := []byte{21, 3, 3, 0, 2, 2, 112}; !bytes.Equal(b.Bytes(), want) {
		t.Fatalf("wrote % x, want % x", b.Bytes(), want)
	}
	boom := errors.New("boom")
	if err := WriteAlert(chErrWriter{boom}, AlertDecodeError); !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
}

type chErrWriter struct{ err error }

func (w chErrWriter) Write([]byte) (int, error) { return 0, w.err }

// A real crypto/tls client that is answered with unrecognized_name fails
// at the alert, having received no certificate.
func TestWriteAlertUnrecognizedNameToRealClient(t *testing.T) {
	testutil.VerifyNone(t)
	for _, k := range chHelloKinds[:2] {
		t.Run(k.name, func(t *testing.T) {
			cli, srv := chTCPPair(t)
			_ = cli.SetDeadline(time.Now().Add(10 * time.Second))
			_ = srv.SetDeadline(time.Now().Add(10 * time.Second))
			type result struct {
				err       error
				state     tls.ConnectionState
				verified  bool
				certAsked bool
			}
			res := make(chan result, 1)
			go func() {
				var r result
				cfg := chClientConfig(t, k)
				cfg.VerifyConnection = func(tls.ConnectionState) error { r.verified = true; return nil }
				cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
					r.certAsked = true
					return &tls.Certificate{}, nil
				}
				tc := tls.Client(cli, cfg)
				r.err = tc.Handshake()
				r.state = tc.ConnectionState()
				_ = tc.Close()
				res <- r
			}()
			hello, err := ReadClientHello(srv, 64<<10)
			if err != nil {
				t.Fatal(err)
			}
			if hello.ServerName != chSNI {
				t.Fatalf("ServerName %q", hello.ServerName)
			}
			if err := WriteAlert(srv, AlertUnrecognizedName); err != nil {
				t.Fatal(err)
			}
			_ = srv.Close()
			r := <-res
			// crypto/tls reports a received alert 112 as
			// "remote error: tls: unrecognized name".
			if r.err == nil || !strings.Contains(r.err.Error(), "remote error: tls: unrecognized name") {
				t.Fatalf("client handshake error %v, want unrecognized name", r.err)
			}
			if r.verified || r.certAsked || len(r.state.PeerCertificates) != 0 || r.state.HandshakeComplete {
				t.Fatalf("client got further than the alert: %+v", r)
			}
		})
	}
}

// Classify and Refuse sort every kind of ReadClientHello error and answer
// it: a plain-HTTP 400, the error's alert, or nothing when the read failed.
func TestClassifyAndRefuse(t *testing.T) {
	read := func(in []byte, maxBytes int) error {
		t.Helper()
		h, err := ReadClientHello(bytes.NewReader(in), maxBytes)
		if err == nil {
			t.Fatalf("ReadClientHello accepted %q as %+v", in, h)
		}
		return err
	}
	alert := func(desc uint8) []byte { return []byte{21, 3, 3, 0, 2, 2, desc} }
	for _, c := range []struct {
		name  string
		err   error
		want  Refusal
		wrote []byte
	}{
		{"plain HTTP", read([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 0), RefusalNotTLS, []byte(PlainHTTPAnswer)},
		{"wrapped ErrNotTLS", fmt.Errorf("edge: %w", ErrNotTLS), RefusalNotTLS, []byte(PlainHTTPAnswer)},
		{"two host_names", read(helloRecords(sniExt("a.test"), sniExt("b.test")), 0), RefusalMalformed, alert(AlertDecodeError)},
		{"unknown record version", read([]byte{22, 3, 9, 0, 4, 1, 0, 0, 0}, 0), RefusalMalformed, alert(AlertProtocolVersion)},
		{"too large", read([]byte{22, 3, 1, 0, 4, 1, 1, 0, 0}, 64), RefusalMalformed, alert(AlertHandshakeFailure)},
		{"EOF", read(nil, 0), RefusalReadFailed, nil},
		{"truncated", read([]byte{22, 3, 1, 0, 9, 1}, 0), RefusalReadFailed, nil},
		{"read error", errors.New("connection reset"), RefusalReadFailed, nil},
	} {
		if got := Classify(c.err); got != c.want {
			t.Errorf("%s: Classify(%v) = %d, want %d", c.name, c.err, got, c.want)
		}
		var b bytes.Buffer
		if err := Refuse(&b, c.err); err != nil {
			t.Errorf("%s: Refuse: %v", c.name, err)
		}
		if !bytes.Equal(b.Bytes(), c.wrote) {
			t.Errorf("%s: Refuse wrote %q, want %q", c.name, b.Bytes(), c.wrote)
		}
	}
	if err := read(nil, 0); err != io.EOF {
		t.Fatalf("empty input: %v, want io.EOF", err)
	}
	boom := errors.New("boom")
	for _, err := range []error{ErrNotTLS, read(helloRecords(sniExt("a\x00b")), 0)} {
		if werr := Refuse(chErrWriter{boom}, err); !errors.Is(werr, boom) {
			t.Fatalf("Refuse(%v) on a failing writer: %v, want its error", err, werr)
		}
	}
	if werr := Refuse(chErrWriter{boom}, io.EOF); werr != nil {
		t.Fatalf("Refuse(io.EOF) wrote: %v", werr)
	}
}
