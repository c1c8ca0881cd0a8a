package listener

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"

	"github.com/applistener/applistener/internal/proxyproto"
)

// Rejection reasons (metric label values) of the PROXY protocol step.
const (
	// reasonProxyUntrusted: a PROXY header (v1 or v2) from a peer that
	// may not send one.
	reasonProxyUntrusted = "proxy_untrusted"
	// reasonProxyRequired: a peer that must send a PROXY v2 header did not.
	reasonProxyRequired = "proxy_required"
	// reasonProxyMalformed: a permitted peer sent a header that does not
	// decode (truncated, too large, invalid, or the v1 text format).
	reasonProxyMalformed = "proxy_malformed"
)

// sniffLen is how much is read before deciding whether a connection starts
// with a PROXY header: as much as ReadClientHello reads first anyway (a
// TLS record header), and enough to tell a v2 signature, a v1 "PROXY" and
// a TLS record apart.
const sniffLen = 5

// proxyPolicy is what a peer may, and must, send before its ClientHello.
func (l *Listener) proxyPolicy(peer netip.Addr) (allowed, required bool) {
	peer = peer.Unmap()
	for _, p := range l.cfg.RequireProxyHeader {
		if p.Contains(peer) {
			return true, true
		}
	}
	for _, p := range l.cfg.TrustedProxies {
		if p.Contains(peer) {
			return true, false
		}
	}
	return false, false
}

// readPreamble reads what comes before the ClientHello. It returns the
// client address (the source a permitted peer's PROXY header carried,
// else the peer's own address) and a reader of the ClientHello, which
// replays the bytes read to decide that there was no header. It refuses
// (counts, logs) and returns ok false when the connection must be closed:
// a header from a peer that may not send one, none from a peer that must,
// or one that does not decode. The caller's deadline bounds the reads.
func (l *Listener) readPreamble(raw net.Conn, peer netip.AddrPort) (client netip.AddrPort, hello io.Reader, ok bool) {
	head := make([]byte, sniffLen)
	if _, err := io.ReadFull(raw, head); err != nil {
		// What ReadClientHello would have returned for its record header.
		l.refuseHello(raw, peer, err)
		return peer, nil, false
	}
	isV2, isV1 := proxyproto.IsV2(head), proxyproto.IsV1(head)
	allowed, required := l.proxyPolicy(peer.Addr())
	switch {
	case !isV2 && !isV1:
		if required {
			l.refuseProxy(peer, reasonProxyRequired, errors.New("no PROXY protocol v2 header from a peer in --require-proxy-protocol "+
				"(an applistener edge sends one with --proxy-protocol auto or v2, not off)"))
			return peer, nil, false
		}
		return peer, &prefixReader{prefix: head, r: raw}, true
	case !allowed:
		l.refuseProxy(peer, reasonProxyUntrusted, errors.New("PROXY protocol header from a peer outside --trusted-proxies and --require-proxy-protocol "+
			"(an applistener edge: list its address in --trusted-proxies to receive client addresses; "+
			"with --proxy-protocol auto it retries without the header, v2 does not)"))
		return peer, nil, false
	case isV1:
		l.refuseProxy(peer, reasonProxyMalformed, errors.New("PROXY protocol v1 (text) header: only v2 is accepted"))
		return peer, nil, false
	}
	h, err := proxyproto.Read(io.MultiReader(bytes.NewReader(head), raw), proxyproto.MaxHeaderLen)
	if err != nil {
		l.refuseProxy(peer, reasonProxyMalformed, err)
		return peer, nil, false
	}
	l.m.proxyHeaders.WithLabelValues(h.Command.String()).Inc()
	if h.Command == proxyproto.Local {
		// The proxy's own connection (a health check): its address stays.
		return peer, raw, true
	}
	return netip.AddrPortFrom(h.Source.Addr().Unmap(), h.Source.Port()), raw, true
}

// refuseProxy counts and logs a connection refused at the PROXY protocol
// step; the caller closes it without writing anything.
func (l *Listener) refuseProxy(peer netip.AddrPort, reason string, err error) {
	l.m.rejections.WithLabelValues(reason).Inc()
	l.log.Warn("connection refused: PROXY protocol", "class_uid", 4001, "rule", "app-listener-proxy-protocol",
		"reason", reason, "src", peer.String(), "err", err)
	l.ocsfProxyRefused(peer, reason, err)
}

// prefixReader reads prefix, then r.
type prefixReader struct {
	prefix []byte
	r      io.Reader
}

func (p *prefixReader) Read(b []byte) (int, error) {
	if len(p.prefix) == 0 {
		return p.r.Read(b)
	}
	n := copy(b, p.prefix)
	p.prefix = p.prefix[n:]
	return n, nil
}

// addrPortOf returns the address of a (a *net.TCPAddr, or anything that
// prints as host:port), unmapped; the zero AddrPort when it has none.
func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	if a == nil {
		return netip.AddrPort{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
