package ocsf

import (
	"log/slog"
	"net/netip"
	"time"
)

// Connection is a client connection the listener accepted or refused, or
// a connection to an app that failed.
type Connection struct {
	Time time.Time
	// Activity is NetOpen (accepted: handshake complete), NetRefuse
	// (refused before or during the handshake) or NetFail (an app
	// connection failed).
	Activity int
	Src, Dst netip.AddrPort
	// DstHost names the destination: the SNI a client asked for, an app
	// route's hostname.
	DstHost string
	// DstName names a destination that has no address (a unix socket).
	DstName    string
	SNI        string
	TLSVersion uint16
	// Reason is why the connection was refused or failed
	// ("unknown_sni", "no_sni", "not_tls", the dial error).
	Reason string
	Route  RouteRef
}

// NetworkActivity is the Network Activity (4001) record of c: an accepted
// connection is informational (debug), a refusal low (info), a failed app
// connection medium (warn).
func NetworkActivity(c *Connection) *Event {
	severity, status, level, msg := SeverityInformational, StatusSuccess, slog.LevelDebug, "connection accepted"
	switch c.Activity {
	case NetRefuse:
		severity, status, level, msg = SeverityLow, StatusFailure, slog.LevelInfo, "connection refused"
	case NetFail:
		severity, status, level, msg = SeverityMedium, StatusFailure, slog.LevelWarn, "app connection failed"
	}
	e := newEvent(ClassNetworkActivity, c.Activity, severity, status, c.Time, level)
	e.Message = msg
	e.StatusDetail = c.Reason
	e.SrcEndpoint = endpointOf(c.Src, "")
	e.DstEndpoint = endpointOf(c.Dst, c.DstHost)
	if c.DstName != "" {
		if e.DstEndpoint == nil {
			e.DstEndpoint = &Endpoint{}
		}
		e.DstEndpoint.Name = c.DstName
	}
	if v := TLSVersionName(c.TLSVersion); v != "" {
		e.TLS = &TLS{Version: v, SNI: c.SNI}
	}
	e.Unmapped = c.Route.unmapped()
	return e
}
