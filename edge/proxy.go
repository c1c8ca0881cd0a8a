package edge

import (
	"net"
	"net/netip"

	"github.com/applistener/applistener/internal/proxyproto"
)

// preamble is what the edge writes to a supervisor before the client's
// bytes: with Config.ProxyProtocol, a PROXY protocol v2 header carrying the
// client's address, the address it connected to on the edge, and the name
// it asked for (PP2_TYPE_AUTHORITY), followed by the ClientHello; else the
// ClientHello alone. One Write sends both.
func (e *Edge) preamble(c net.Conn, host string, hello []byte) []byte {
	if !e.cfg.ProxyProtocol {
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
