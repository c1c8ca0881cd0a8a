// Package api is what the two sides of the control plane and its readers
// share: the wire types of installation advertisements (what a supervisor
// PUTs to the gateway and serves on GET /v1/installations) and of discovery
// snapshots (GET /v1/workspaces/{ws}/service-routes), the discovery client
// that the edge and the `applistener routes` command read discovery with,
// and the HTTP helpers of the gateway's clients (the watch streams
// themselves are read with control/internal/ndjson). The configuration
// document itself is routes.Document: package routes parses and validates
// it.
//
// The supervisor side (control/supervisor) and the reference gateway
// (control/gateway) both import this package and never each other; this
// package imports neither.
package api

import (
	"strings"
)

// SessionOrderHeader is the gateway's response header that tells a
// supervisor the order of its session (a decimal integer); the supervisor
// sends it back as ?order= with every request, and the gateway refuses a
// session whose order is below the current session's (it was superseded).
const SessionOrderHeader = "X-Applistener-Session-Order"

// SessionTTLHeader is the gateway's response header, on the answers to a
// supervisor's configuration requests, that tells how long a session holds
// after its last request (a Go duration, the gateway's --session-ttl). A
// supervisor whose push session is down polls at least three times per
// TTL, so that its session (and so its advertised routes) never lapses
// between two polls, and warns that its --gateway-poll-interval is too
// long for this gateway.
const SessionTTLHeader = "X-Applistener-Session-TTL"

// OneLineReason makes s safe for a one-line response body.
func OneLineReason(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
