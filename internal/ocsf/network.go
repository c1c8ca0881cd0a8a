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

// ConnectionLevel is the emitter level of a Network Activity record:
// debug for an accepted connection, info for a refusal, warn for a failed
// app connection.
func ConnectionLevel(activity int) slog.Level {
	switch activity {
	case NetRefuse:
		return slog.LevelInfo
	case NetFail:
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// NetworkActivity is the Network Activity (4001) record of c: an accepted
// connection is informational (debug), a refusal low (info), a failed app
// connection medium (warn).
func NetworkActivity(c *Connection) *Event {
	severity, status, msg := SeverityInformational, StatusSuccess, "connection accepted"
	switch c.Activity {
	case NetRefuse:
		severity, status, msg = SeverityLow, StatusFailure, "connection refused"
	case NetFail:
		severity, status, msg = SeverityMedium, StatusFailure, "app connection failed"
	}
	e := newEvent(ClassNetworkActivity, c.Activity, severity, status, c.Time, ConnectionLevel(c.Activity))
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
