package listener

import (
	"net"
	"net/netip"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/routes"
)

// ocsfConn records a connection as a Network Activity record (Config.OCSF):
// activity ocsf.NetRefuse for one refused before or during the handshake
// (reason: unknown_sni, no_sni, not_tls, malformed_hello, hello_read,
// handshake), ocsf.NetOpen for an accepted one (debug).
// src is the client's address (a permitted PROXY header's source, else
// the TCP peer's).
func (l *Listener) ocsfConn(raw net.Conn, src netip.AddrPort, activity int, sni, reason string, tlsVer uint16, route *routes.Route) {
	em := l.cfg.OCSF
	if !em.Enabled(ocsf.ConnectionLevel(activity)) {
		return
	}
	c := &ocsf.Connection{
		Time: time.Now(), Activity: activity, Src: src, Dst: addrPortOf(raw.LocalAddr()),
		DstHost: truncate(sni, 255), SNI: truncate(sni, 255), TLSVersion: tlsVer, Reason: reason,
	}
	if route != nil {
		c.Route = ocsf.RouteRef{Workspace: route.Workspace, Sandbox: route.Sandbox, Service: route.Service,
			InstallationVersion: route.InstallationVersion}
	}
	em.Emit(ocsf.NetworkActivity(c))
}

// ocsfProxyRefused records a connection refused at the PROXY protocol
// step (a Network Activity "Refuse" from the peer).
func (l *Listener) ocsfProxyRefused(peer netip.AddrPort, reason string, err error) {
	if !l.cfg.OCSF.Enabled(ocsf.ConnectionLevel(ocsf.NetRefuse)) {
		return
	}
	l.cfg.OCSF.Emit(ocsf.NetworkActivity(&ocsf.Connection{
		Time: time.Now(), Activity: ocsf.NetRefuse, Src: peer, Dst: addrPortOf(l.Addr()), Reason: reason + ": " + err.Error(),
	}))
}
