package edge

import (
	"net"
	"net/netip"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
)

// ocsfConn records a client connection as a Network Activity record
// (Config.OCSF): ocsf.NetRefuse for one refused at its ClientHello
// (unknown_name, no_sni, not_tls, ...), ocsf.NetFail when the owning
// supervisor at endpoint could not be reached, ocsf.NetOpen (debug) when
// it is spliced to it.
func (e *Edge) ocsfConn(c net.Conn, activity int, sni, reason, endpoint string) {
	em := e.cfg.OCSF
	if !em.Enabled(ocsf.ConnectionLevel(activity)) {
		return
	}
	rec := &ocsf.Connection{
		Time: time.Now(), Activity: activity, Src: addrPort(c.RemoteAddr().String()), Dst: addrPort(c.LocalAddr().String()),
		DstHost: truncate(sni, 255), Reason: reason,
	}
	if endpoint != "" {
		// The connection's destination is the supervisor it was for.
		rec.Dst = addrPort(endpoint)
		if !rec.Dst.IsValid() {
			rec.DstName = endpoint
		}
	}
	em.Emit(ocsf.NetworkActivity(rec))
}

func addrPort(s string) netip.AddrPort {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
