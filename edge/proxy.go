package edge

import (
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/applistener/applistener/internal/proxyproto"
)

// ProxyRecheck is how long the auto mode (Config.ProxyFallback) sends no
// PROXY header to a supervisor that refused one; then it tries again, so
// that a supervisor since told to trust the edge gets client addresses.
const ProxyRecheck = 5 * time.Minute

// mismatchLogEvery bounds the log lines of one endpoint's PROXY protocol
// mismatch.
const mismatchLogEvery = time.Minute

// endpointProxy is the PROXY protocol state of one supervisor endpoint.
type endpointProxy struct {
	noHeaderUntil time.Time // the auto mode sends no header until then
	loggedAt      time.Time // the last mismatch log line
}

// preamble is what the edge writes to a supervisor before the client's
// bytes: with header, a PROXY protocol v2 header carrying the client's
// address, the address it connected to on the edge, and the name it asked
// for (PP2_TYPE_AUTHORITY), followed by the ClientHello; else the
// ClientHello alone. One Write sends both.
func (e *Edge) preamble(c net.Conn, host string, hello []byte, header bool) []byte {
	if !header {
		return hello
	}
	h := proxyproto.Header{Command: proxyproto.Proxy, Source: tcpAddrPort(c.RemoteAddr()),
		Destination: tcpAddrPort(c.LocalAddr()), Authority: host}
	if !h.Source.IsValid() || !h.Destination.IsValid() {
		// Not a TCP connection (a test's pipe): the supervisor keeps the
		// edge's address.
		h = proxyproto.Header{Command: proxyproto.Local, Authority: host}
	}
	b, err := h.Append(make([]byte, 0, 64+len(host)+len(hello)))
	if err != nil {
		// A normalized host name always encodes; never send a partial
		// header.
		e.log.Error("edge could not encode the PROXY protocol header", "hostname", host, "err", err)
		h = proxyproto.Header{Command: proxyproto.Local}
		b, _ = h.Append(b[:0])
	}
	return append(b, hello...)
}

func tcpAddrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// sendsProxyHeader reports whether a connection to endpoint starts with a
// PROXY header: with ProxyProtocol, unless the auto mode learned that the
// endpoint refuses it (within ProxyRecheck).
func (e *Edge) sendsProxyHeader(endpoint string) bool {
	if !e.cfg.ProxyProtocol {
		return false
	}
	if !e.cfg.ProxyFallback {
		return true
	}
	e.proxyMu.Lock()
	defer e.proxyMu.Unlock()
	st := e.proxy[endpoint]
	return st == nil || !time.Now().Before(st.noHeaderUntil)
}

// awaitAnswer reads the owner's first bytes after a PROXY header (auto
// mode): refused when it closed the connection without a byte (a
// supervisor that does not accept the header from the edge closes it so).
// Bytes read are returned, and the time to them since accepted observed.
func (e *Edge) awaitAnswer(backend net.Conn, accepted time.Time) (first []byte, refused bool) {
	buf := make([]byte, 4096)
	_ = backend.SetReadDeadline(time.Now().Add(e.cfg.HelloTimeout))
	n, err := backend.Read(buf)
	_ = backend.SetReadDeadline(time.Time{})
	if n > 0 {
		e.m.firstByte.Observe(time.Since(accepted).Seconds())
		return buf[:n], false
	}
	// No answer in time is not a refusal: the splice goes on as usual.
	return nil, err != nil && !timedOut(err)
}

// proxyHeaderRefused records (auto mode) that r's endpoint refused the
// PROXY header, and says so once per ProxyRecheck.
func (e *Edge) proxyHeaderRefused(host string, r *route) {
	e.proxyMu.Lock()
	st := e.proxy[r.endpoint]
	if st == nil {
		st = &endpointProxy{}
		e.proxy[r.endpoint] = st
	}
	now := time.Now()
	log := !now.Before(st.noHeaderUntil)
	st.noHeaderUntil = now.Add(ProxyRecheck)
	e.proxyMu.Unlock()
	if log {
		e.log.Warn("PROXY protocol mismatch: the supervisor closed the connection after the edge's PROXY v2 header; "+
			"sending it none (its clients' address is the edge's) until the recheck. To keep client addresses, list the "+
			"edge's address in the supervisor's --trusted-proxies (or --require-proxy-protocol)",
			"endpoint", r.endpoint, "supervisor", r.supervisor, "hostname", host, "recheck_in", ProxyRecheck)
	}
}

// closedWithoutAnswer explains (at most once a minute per endpoint) an
// owner that closed a spliced connection without answering its
// ClientHello: most likely a PROXY protocol mismatch.
func (e *Edge) closedWithoutAnswer(sp *splice) {
	e.proxyMu.Lock()
	st := e.proxy[sp.key.endpoint]
	if st == nil {
		st = &endpointProxy{}
		e.proxy[sp.key.endpoint] = st
	}
	now := time.Now()
	if now.Sub(st.loggedAt) < mismatchLogEvery {
		e.proxyMu.Unlock()
		return
	}
	st.loggedAt = now
	e.proxyMu.Unlock()
	header := sp.proxyHeader
	hint := "if the supervisor lists the edge's address in --require-proxy-protocol, run the edge with --proxy-protocol auto or v2"
	if header {
		hint = "the edge sent a PROXY v2 header: if the supervisor does not list the edge's address in --trusted-proxies or " +
			"--require-proxy-protocol it refuses it; list it there, or run the edge with --proxy-protocol auto"
	}
	e.log.Warn("the supervisor closed a connection without answering its ClientHello", "endpoint", sp.key.endpoint,
		"hostname", sp.key.host, "proxy_header_sent", header, "hint", hint)
}

// timedOut reports whether err is a deadline's.
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
