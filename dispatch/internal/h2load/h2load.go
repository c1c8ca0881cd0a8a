// Package h2load is the frame-level HTTP/2 load client of the HTTP/2
// benchmarks (dispatch's BenchmarkH2Mux, h2engine's BenchmarkServers). Like
// h2load it keeps a number of streams in flight on each connection,
// replaces the completed ones in one write when it is about to wait for
// the network, and counts responses (END_STREAM) without decoding them,
// so that its own share of a benchmark's CPU and allocations stays small
// and the same whatever the server does.
package h2load

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Request is the GET every stream of a connection sends.
type Request struct {
	Authority, Path, UserAgent string
}

// maxWindow is the largest flow-control window (RFC 9113 6.9.1).
const maxWindow = 1<<31 - 1

// Conn is one client connection of the load.
type Conn struct {
	nc   *tls.Conn
	bw   *bufio.Writer
	br   *bufio.Reader
	fr   *http2.Framer // reads from br, writes to bw
	enc  *hpack.Encoder
	hbuf bytes.Buffer
	req  [6]hpack.HeaderField
	next uint32
}

// Dial opens a TLS connection to addr that must negotiate h2 (cfg's
// NextProtos is set to it), sends the preface, and opens the connection
// and stream windows fully.
func Dial(addr string, cfg *tls.Config, req Request) (*Conn, error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	nc, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("h2load: dial %s: %w", addr, err)
	}
	if p := nc.ConnectionState().NegotiatedProtocol; p != "h2" {
		_ = nc.Close()
		return nil, fmt.Errorf("h2load: negotiated %q, not h2", p)
	}
	c := &Conn{nc: nc, bw: bufio.NewWriterSize(nc, 64<<10), br: bufio.NewReaderSize(nc, 64<<10), next: 1}
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.SetReuseFrames()
	// The fields are indexed in the encoder's table, as h2load's are: the
	// first request carries them, the others refer to them.
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.req = [...]hpack.HeaderField{
		{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: req.Authority}, {Name: ":path", Value: req.Path},
		{Name: "user-agent", Value: req.UserAgent}, {Name: "accept", Value: "*/*"},
	}
	_, _ = c.bw.WriteString(http2.ClientPreface)
	_ = c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxWindow})
	_ = c.fr.WriteWindowUpdate(0, maxWindow-65535)
	if err := c.bw.Flush(); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("h2load: preface: %w", err)
	}
	return c, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// writeRequests writes n requests and flushes.
func (c *Conn) writeRequests(n int) error {
	for range n {
		c.hbuf.Reset()
		for _, f := range c.req {
			_ = c.enc.WriteField(f)
		}
		if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: c.next, BlockFragment: c.hbuf.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			return fmt.Errorf("h2load: write: %w", err)
		}
		c.next += 2
	}
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("h2load: write: %w", err)
	}
	return nil
}

// take takes up to n requests from left.
func take(left *atomic.Int64, n int) int {
	for {
		l := left.Load()
		if l <= 0 {
			return 0
		}
		m := min(int64(n), l)
		if left.CompareAndSwap(l, l-m) {
			return int(m)
		}
	}
}

// Run keeps depth requests in flight until left is used up, counting the
// responses as they complete. A response other than 200, a reset stream
// or a GOAWAY is an error.
func (c *Conn) Run(left *atomic.Int64, depth int) error {
	inflight := take(left, depth)
	if inflight == 0 {
		return nil
	}
	if err := c.writeRequests(inflight); err != nil {
		return err
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(time.Minute))
	freed := 0 // responses completed, not yet replaced
	for inflight > 0 || freed > 0 {
		if freed > 0 && (c.br.Buffered() == 0 || inflight == 0) {
			// About to wait for the network: replace the completed
			// requests in one write, as h2load does.
			if n := take(left, freed); n > 0 {
				inflight += n
				if err := c.writeRequests(n); err != nil {
					return err
				}
			}
			freed = 0
			continue
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			return fmt.Errorf("h2load: read: %w", err)
		}
		ack := false
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = c.fr.WriteSettingsAck()
				ack = true
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = c.fr.WritePing(true, f.Data)
				ack = true
			}
		case *http2.RSTStreamFrame:
			return errors.New("h2load: stream reset: " + f.ErrCode.String())
		case *http2.GoAwayFrame:
			return errors.New("h2load: GOAWAY: " + f.ErrCode.String())
		case *http2.HeadersFrame:
			if s := f.HeaderBlockFragment(); len(s) > 0 && s[0] != 0x88 && s[0]&0x80 != 0 {
				// An indexed :status other than 200 (static index 8).
				return errors.New("h2load: a response other than 200")
			}
		}
		if ack {
			if err := c.bw.Flush(); err != nil {
				return fmt.Errorf("h2load: write: %w", err)
			}
		}
		if f.Header().StreamID == 0 || !f.Header().Flags.Has(http2.FlagDataEndStream) {
			continue
		}
		switch f.(type) {
		case *http2.DataFrame, *http2.HeadersFrame:
			inflight--
			freed++
		}
	}
	return nil
}
