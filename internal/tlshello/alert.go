package tlshello

import (
	"errors"
	"io"
	"strconv"
)

// TLS alert descriptions (RFC 8446 §6) that a server sends before, or
// instead of, a handshake.
const (
	AlertUnexpectedMessage uint8 = 10
	AlertRecordOverflow    uint8 = 22
	AlertHandshakeFailure  uint8 = 40
	AlertIllegalParameter  uint8 = 47
	AlertDecodeError       uint8 = 50
	AlertProtocolVersion   uint8 = 70
	AlertInternalError     uint8 = 80
	AlertUnrecognizedName  uint8 = 112
)

// WriteAlert writes one plaintext TLS alert record (level fatal) with the
// given description, for example AlertUnrecognizedName, in a single Write.
func WriteAlert(w io.Writer, desc uint8) error {
	rec := []byte{recordTypeAlert, 3, 3, 0, 2, 2 /* fatal */, desc}
	_, err := w.Write(rec)
	return err
}

const plainHTTPBody = "400 Bad Request: this port only speaks TLS\n"

// PlainHTTPAnswer is written to a client that sent plain HTTP to a TLS port.
var PlainHTTPAnswer = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
	strconv.Itoa(len(plainHTTPBody)) + "\r\n\r\n" + plainHTTPBody

// Refusal is the kind of an error ReadClientHello returned, as a server
// answers and counts it; see Classify and Refuse.
type Refusal uint8

const (
	// RefusalReadFailed: the connection ended or failed before a whole
	// ClientHello arrived (EOF, timeout, reset); nothing is sent.
	RefusalReadFailed Refusal = iota
	// RefusalNotTLS: the first record is not TLS (ErrNotTLS), typically
	// plain HTTP; PlainHTTPAnswer is sent.
	RefusalNotTLS
	// RefusalMalformed: a *ClientHelloError (malformed or too large); its
	// Alert is sent.
	RefusalMalformed
)

// Classify returns the Refusal for err, an error returned by
// ReadClientHello.
func Classify(err error) Refusal {
	var che *ClientHelloError
	switch {
	case errors.Is(err, ErrNotTLS):
		return RefusalNotTLS
	case errors.As(err, &che):
		return RefusalMalformed
	default:
		return RefusalReadFailed
	}
}

// Refuse answers a peer whose ClientHello ReadClientHello failed with err:
// PlainHTTPAnswer for ErrNotTLS, the alert of a *ClientHelloError, nothing
// for a read error (Classify tells which). It returns the write's error.
func Refuse(w io.Writer, err error) error {
	var che *ClientHelloError
	switch {
	case errors.Is(err, ErrNotTLS):
		_, werr := io.WriteString(w, PlainHTTPAnswer)
		return werr
	case errors.As(err, &che):
		return WriteAlert(w, che.Alert)
	default:
		return nil
	}
}
