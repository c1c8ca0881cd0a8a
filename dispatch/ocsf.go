package dispatch

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/routes"
)

// OCSF records of the data plane (Config.OCSF): one HTTP Activity record
// per request when it ends (accesslog.go's endRequest: refusals at info,
// upstream failures at warn, allowed requests at debug), one for an HTTP/2
// connection closed because a head did not arrive in time, and a Network
// Activity record for each app connection that failed.

var ocsfOutcomes = [numOutcomes]ocsf.Outcome{
	outcomeOK: ocsf.Allowed, outcomeDenied: ocsf.Denied,
	outcomeUpstreamError: ocsf.UpstreamError, outcomeAborted: ocsf.Aborted,
}

// ocsfHTTP is the HTTP Activity record of a request that ended at end.
func ocsfHTTP(r *accessRecord, ci *connInfo, end time.Time) *ocsf.Event {
	h := &ocsf.HTTP{
		Start: r.start, End: end, Host: ci.sni, Status: r.status, Outcome: ocsfOutcomes[r.outcome],
		Reason: r.reason, TLSVersion: ci.tlsVer, BytesIn: r.bytesIn, BytesOut: r.bytesOut,
		Connect: r.connect, FirstByte: r.firstByte, Protocol: protoNames[r.proto], Version: "1.1",
	}
	if r.proto == protoH2 || r.overH2 {
		h.Version = "2"
	}
	if r.id.n > 0 {
		h.RequestID = string(r.id.bytes())
		h.UserAgent, h.Referrer = r.userAgent(), r.referer()
	}
	switch {
	case !r.parsed:
	case r.mb != nil:
		h.Method, h.Path = string(r.mb), string(pathPart(r.pb))
	default:
		h.Method, h.Path = r.ms, pathPart(r.ps)
	}
	if r.wake != wakeNone {
		h.Wake, h.WakeHeld = wakeNames[r.wake], r.wakeHeld
	}
	h.Src, h.Dst = ci.addrs()
	if rt := ci.route; rt != nil {
		h.Route = routeRef(rt)
	}
	return ocsf.HTTPActivity(h)
}

func routeRef(rt *routes.Route) ocsf.RouteRef {
	return ocsf.RouteRef{Workspace: rt.Workspace, Sandbox: rt.Sandbox, Service: rt.Service, InstallationVersion: rt.InstallationVersion}
}

// addrs returns the client's and the listener's address of the
// connection (invalid when unknown).
func (ci *connInfo) addrs() (src, dst netip.AddrPort) {
	src = ci.client
	if ci.raw != nil {
		if !src.IsValid() {
			src = addrPortOf(ci.raw.RemoteAddr())
		}
		dst = addrPortOf(ci.raw.LocalAddr())
	}
	if !src.IsValid() && ci.peer.IsValid() {
		src = netip.AddrPortFrom(ci.peer, 0)
	}
	return src, dst
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if a == nil {
		return netip.AddrPort{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// ocsfConnDenied records a refusal that belongs to no request: an HTTP/2
// connection whose head did not arrive in time.
func (s *Server) ocsfConnDenied(ci *connInfo, d denial, proto uint8) {
	if !s.cfg.OCSF.Enabled(ocsf.Denied.Level()) {
		return
	}
	now := time.Now()
	r := accessRecord{proto: proto, start: now, connect: -1, firstByte: -1}
	r.denied(d)
	s.cfg.OCSF.Emit(ocsfHTTP(&r, ci, now))
}

// ocsfAppFailed records an app connection that failed: the dial, or the
// exchange on it.
func (x *exchange) ocsfAppFailed(err error) {
	em := x.s.cfg.OCSF
	if !em.Enabled(ocsf.ConnectionLevel(ocsf.NetFail)) {
		return
	}
	rt := x.route
	c := &ocsf.Connection{Time: time.Now(), Activity: ocsf.NetFail, Reason: err.Error(), Route: routeRef(rt)}
	switch rt.Connector.Type {
	case routes.ConnectorUnix:
		c.DstName = strings.ReplaceAll(rt.Connector.Path, routes.PortPlaceholder, strconv.Itoa(rt.Port))
	default:
		host := rt.Connector.Host
		if host == "" {
			host = routes.DefaultConnectorHost
		}
		if ip, perr := netip.ParseAddr(host); perr == nil {
			c.Dst = netip.AddrPortFrom(ip, uint16(rt.Port))
		}
		if rt.Connector.Type == routes.ConnectorNetns {
			c.DstName = rt.Connector.Path
		}
	}
	em.Emit(ocsf.NetworkActivity(c))
}
