package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// target says where to connect and what to send.
type target struct {
	addr string // TCP address dialled (the proxy's loopback port)
	sni  string // TLS server name; empty: plain TCP
	host string // Host header
	path string
	// header is an extra request header line ("Name: value"; "" none),
	// e.g. the cookie of a private service.
	header string
}

func (t *target) tlsConfig() *tls.Config {
	return &tls.Config{
		ServerName: t.sni,
		// The benchmark measures proxies, not the client's chain check.
		InsecureSkipVerify: true, //nolint:gosec // benchmark client on loopback
		NextProtos:         []string{"http/1.1"},
		// No hybrid post-quantum key share (Go's default): the OpenSSL 3.0
		// based proxies cannot do it, so every proxy does the same X25519
		// exchange. P-256 is listed for the ECDSA P-256 certificate.
		CurvePreferences: []tls.CurveID{tls.X25519, tls.CurveP256},
	}
}

func (t *target) request() []byte {
	extra := ""
	if t.header != "" {
		extra = t.header + "\r\n"
	}
	return []byte("GET " + t.path + " HTTP/1.1\r\nHost: " + t.host + "\r\nUser-Agent: applistener-bench\r\nAccept: */*\r\n" + extra + "\r\n")
}

// dial connects (and, for TLS, handshakes) to the target.
func (t *target) dial(cfg *tls.Config, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", t.addr, timeout)
	if err != nil {
		return nil, err
	}
	if t.sni == "" {
		return c, nil
	}
	tc := tls.Client(c, cfg)
	_ = tc.SetDeadline(time.Now().Add(timeout))
	if err := tc.Handshake(); err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

var errNoLength = errors.New("response without Content-Length or chunked encoding")

// readResponse reads one response and discards its body. It reports the
// status and whether the server asked to close the connection.
func readResponse(br *bufio.Reader) (status int, closeConn bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, fmt.Errorf("bad status line %q", line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("bad status line %q", line)
	}
	length := int64(-1)
	chunked := false
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return status, false, err
		}
		if len(line) <= 2 {
			break
		}
		i := bytes.IndexByte(line, ':')
		if i < 0 {
			continue
		}
		name := line[:i]
		val := bytes.TrimSpace(line[i+1:])
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			length, err = strconv.ParseInt(string(val), 10, 64)
			if err != nil {
				return status, false, fmt.Errorf("bad Content-Length %q", val)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.Contains(bytes.ToLower(val), []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closeConn = bytes.EqualFold(val, []byte("close"))
		}
	}
	switch {
	case chunked:
		for {
			line, err = br.ReadSlice('\n')
			if err != nil {
				return status, closeConn, err
			}
			sz := bytes.TrimSpace(line)
			if j := bytes.IndexByte(sz, ';'); j >= 0 {
				sz = sz[:j]
			}
			n, err := strconv.ParseInt(string(sz), 16, 64)
			if err != nil {
				return status, closeConn, fmt.Errorf("bad chunk size %q", line)
			}
			if n == 0 {
				for {
					line, err = br.ReadSlice('\n')
					if err != nil {
						return status, closeConn, err
					}
					if len(line) <= 2 {
						return status, closeConn, nil
					}
				}
			}
			if _, err := br.Discard(int(n) + 2); err != nil {
				return status, closeConn, err
			}
		}
	case length >= 0:
		_, err = br.Discard(int(length))
		return status, closeConn, err
	case status == 204 || status == 304 || status/100 == 1:
		return status, closeConn, nil
	}
	return status, closeConn, errNoLength
}
