package dispatch

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"strconv"

	"github.com/applistener/applistener/internal/httpgrammar"
	"github.com/applistener/applistener/routes"
)

// The forwarding rules are one set for every app protocol: HTTP/1.1
// clients (conn.go, exchange.go), HTTP/2 clients of HTTP/1.1 apps
// (h2stream.go) and of h2c apps (h2c.go) call the same functions, and
// TestForwardingRuleTable checks each rule on the three paths.
//
//	rule                                                  where
//	method a token; target visible ASCII, origin form     parseRequestHead (HTTP/1.1), h2TargetError (HTTP/2)
//	field names tokens, values without control bytes      parseFields (HTTP/1.1), h2FieldError (HTTP/2)
//	  (both the client's errors: 400, logged as denials)
//	Host rewritten (or kept: PreserveHost)                forwardInfo.appendAppHost
//	hop-by-hop fields, '_' names, untrusted forwarding    forwardClaims.keep
//	  and identity claims, X-Applistener-* dropped
//	X-Forwarded-For/-Proto/-Host/-Port and Forwarded set  forwardClaims.appendForwardedFor, appendPublicHost,
//	  (the public port: publicPortOf)                       forwardedPort, appendForwarded
//	X-Request-Id: the request's id, the client's dropped  forwardClaims.keep, forwardInfo.requestID (requestid.go)
//	request trailers: the same, and never a claim,        forwardInfo.trailerForwarded (h2c; HTTP/1.1 apps get none),
//	  a request id or the listener's credentials          accessForward.trailerValue
//	response status 100–599, else 502 (logged as an       validStatus
//	  invalid response from the app, with the status)
//	hop-by-hop response fields dropped                    appendResponseHead, h2Stream.responseFields, h2cClientFields
//	the app's X-Request-Id replaced by the request's      (the same; h2c: in trailers too)
//	cookie Domain wider than the host removed, in         scopeCookies
//	  response heads and trailers
//	redirects to the app's loopback origin made public    rewriteRedirects

// hopByHop reports whether a header (any case) is removed in both directions
// regardless of the Connection header: RFC 9110 §7.6.1 plus the framing
// headers that the listener re-creates itself, and Proxy (httpoxy).
func hopByHop(name []byte) bool {
	switch len(name) {
	case 2:
		return httpgrammar.EqualFold(name, "te")
	case 5:
		// Not hop-by-hop, but CGI servers turn it into HTTP_PROXY, which
		// many HTTP clients take as their outbound proxy ("httpoxy").
		return httpgrammar.EqualFold(name, "proxy")
	case 7:
		return httpgrammar.EqualFold(name, "trailer") || httpgrammar.EqualFold(name, "upgrade")
	case 10:
		return httpgrammar.EqualFold(name, "connection") || httpgrammar.EqualFold(name, "keep-alive")
	case 14:
		return httpgrammar.EqualFold(name, "content-length")
	case 16:
		return httpgrammar.EqualFold(name, "proxy-connection")
	case 17:
		return httpgrammar.EqualFold(name, "transfer-encoding")
	case 18:
		return httpgrammar.EqualFold(name, "proxy-authenticate")
	case 19:
		return httpgrammar.EqualFold(name, "proxy-authorization")
	}
	return false
}

// forwardingHeader reports whether a request header carries forwarding or
// client-identity claims that only a trusted proxy may send: the whole
// X-Forwarded-* family, Forwarded, X-Real-IP, client-certificate headers
// and X-Applistener-*. Underscores count as hyphens, because CGI-style
// servers map X_Forwarded_For onto the same variable as X-Forwarded-For.
func forwardingHeader(name []byte) bool {
	return hasPrefixFold(name, "x-forwarded-") ||
		hasPrefixFold(name, "x-applistener-") ||
		equalFoldDash(name, "forwarded") ||
		equalFoldDash(name, "x-real-ip") ||
		equalFoldDash(name, "x-client-cert") ||
		equalFoldDash(name, "x-ssl-client-cert")
}

// reservedAlias reports whether name, read as CGI/WSGI servers read it
// (case folded, '_' taken as '-'), is a field the listener owns: Host, the
// framing fields, every hop-by-hop field, Proxy-*, and the forwarding and
// client-identity claims. Such a name spelled with '_' is never forwarded,
// even where underscores are allowed: the app could read it as the real
// field and frame the body differently from the listener.
func reservedAlias(name []byte) bool {
	switch len(name) {
	case 2:
		return equalFoldDash(name, "te")
	case 4:
		return equalFoldDash(name, "host")
	case 7:
		return equalFoldDash(name, "trailer") || equalFoldDash(name, "upgrade")
	case 10:
		return equalFoldDash(name, "connection") || equalFoldDash(name, "keep-alive")
	case 12:
		return equalFoldDash(name, "x-request-id")
	case 14:
		return equalFoldDash(name, "content-length")
	case 17:
		return equalFoldDash(name, "transfer-encoding")
	}
	return hasPrefixFold(name, "proxy-") || forwardingHeader(name)
}

// underscoreDropped reports whether a request field is not forwarded
// because its name contains '_': all such fields by default (as nginx and
// Caddy do), only the reserved aliases when allow is set.
func underscoreDropped(name []byte, allow bool) bool {
	if bytes.IndexByte(name, '_') < 0 {
		return false
	}
	return !allow || reservedAlias(name)
}

// foldDash lower-cases an ASCII letter and maps '_' to '-'.
func foldDash(c byte) byte {
	if c == '_' {
		return '-'
	}
	return httpgrammar.Lower(c)
}

func equalFoldDash(a []byte, lower string) bool {
	return len(a) == len(lower) && hasPrefixFold(a, lower)
}

func hasPrefixFold(a []byte, lower string) bool {
	if len(a) < len(lower) {
		return false
	}
	for i := 0; i < len(lower); i++ {
		if foldDash(a[i]) != lower[i] {
			return false
		}
	}
	return true
}

func connectionNamed(name []byte, tokens [][]byte) bool {
	for _, t := range tokens {
		if httpgrammar.EqualFold(name, t) {
			return true
		}
	}
	return false
}

// forwardInfo is what the listener adds to a forwarded request.
type forwardInfo struct {
	client      netip.Addr
	trusted     bool   // the peer is a trusted proxy: keep its forwarding headers
	publicHost  string // the SNI, normalized
	backendHost string // Host sent to the app unless preserve
	// preserve sends the client's Host as it is (publicHost if it sent none).
	preserve bool
	// allowUnderscore forwards field names containing '_' other than the
	// reserved aliases (Config.AllowUnderscoreHeaders).
	allowUnderscore bool
	// dropped counts the fields appendRequestHead left out because of an
	// underscore in their name (set by it, read by the caller).
	dropped int
	// publicPort is the port of the public origin as the client named it
	// (publicPortOf): in X-Forwarded-Host and Forwarded host= unless 443,
	// in X-Forwarded-Port always.
	publicPort int
	// requestID is sent as X-Request-Id (the client's are dropped); none
	// when empty.
	requestID []byte
	// access, for a token-mode route, removes the credentials the
	// listener consumed and sets X-Forwarded-User (access.go); nil for a
	// public route.
	access *accessForward
	// path, when set, is the target sent instead of the request's (the
	// request's without its _al_token parameter).
	path []byte
}

// forwardInfo returns what the listener adds to a request forwarded
// through pool for a client at peer that reached sni, naming port
// (publicPortOf of its Host or :authority), with the request's id;
// HTTP/1.1 and HTTP/2 share it.
func (s *Server) forwardInfo(pool *backendPool, sni string, peer netip.Addr, trusted bool, port int, id []byte) forwardInfo {
	fi := forwardInfo{
		client:          peer,
		trusted:         trusted,
		publicHost:      sni,
		backendHost:     pool.hostHeader,
		preserve:        s.cfg.PreserveHost,
		allowUnderscore: s.cfg.AllowUnderscoreHeaders,
		publicPort:      port,
		requestID:       id,
	}
	return fi
}

// publicPortOf is the public port of a request whose Host (HTTP/1.1) or
// :authority (HTTP/2) is host: the port it names, 443 (https's default)
// when it names none. This is the port of the URL the client used, which
// is what an app rebuilding its page URL needs; the socket cannot say it:
// the listener's own port (8443) and, behind applistener edge, the PROXY
// v2 header's destination (the edge Pod's port) are those after the load
// balancer's port mapping, not the one the client connected to. Redirects
// to the app's loopback origin are made public with the same port
// (redirect.go). A malformed port (HostMatches accepted the name only)
// counts as none.
func publicPortOf[T string | []byte](host T) int {
	for i := len(host) - 1; i >= 0 && host[i] != ']'; i-- {
		if host[i] == ':' {
			if p, ok := portNumber(host[i+1:]); ok {
				return p
			}
			return 443
		}
	}
	return 443
}

// portNumber parses a TCP port, 1 to 65535, in decimal digits only.
func portNumber[T string | []byte](v T) (int, bool) {
	if len(v) == 0 || len(v) > 5 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n >= 1 && n <= 65535
}

// countDropped counts (and logs at debug level) the fields that
// appendRequestHead left out because of an underscore in their name.
func (s *Server) countDropped(fi *forwardInfo, route *routes.Route) {
	if fi.dropped == 0 {
		return
	}
	s.m.headersDropped.WithLabelValues("underscore").Add(float64(fi.dropped))
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.LogAttrs(context.Background(), slog.LevelDebug, "request header fields with '_' in their names dropped",
			slog.String("host", route.Host), slog.Int("fields", fi.dropped))
	}
}

// appendRequestHead writes the request head sent to the app.
func appendRequestHead(dst []byte, r *request, fi *forwardInfo) []byte {
	dst = append(dst, r.method...)
	dst = append(dst, ' ')
	if fi.path != nil {
		dst = append(dst, fi.path...)
	} else {
		dst = append(dst, r.path...)
	}
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = fi.appendAppHost(dst, r.host)
	dst = append(dst, "\r\n"...)
	var claims forwardClaims
	for i := range r.fields {
		f := &r.fields[i]
		if connectionNamed(f.name, r.connTokens) || !claims.keep(fi, f.name, f.value) {
			continue
		}
		value := f.value
		if fi.access != nil {
			var drop bool
			if value, drop = fi.access.rewriteField(f.name, value); drop {
				continue
			}
		}
		dst = appendField(dst, f.name, value)
	}
	switch {
	case r.body == bodyLength:
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, r.length, 10)
		dst = append(dst, "\r\n"...)
	case r.body == bodyChunked:
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	case r.zeroLength:
		// Keep an explicit empty body (some apps answer 411 without it).
		dst = append(dst, "Content-Length: 0\r\n"...)
	}
	if r.upgrade {
		dst = append(dst, "Connection: Upgrade\r\nUpgrade: websocket\r\n"...)
	}
	dst = append(dst, "X-Forwarded-For: "...)
	dst = claims.appendForwardedFor(dst, fi)
	if !claims.haveProto {
		dst = append(dst, "\r\nX-Forwarded-Proto: https"...)
	}
	if !claims.haveHost {
		dst = append(dst, "\r\nX-Forwarded-Host: "...)
		dst = claims.appendPublicHost(dst, fi)
	}
	if p := claims.forwardedPort(fi); p > 0 {
		dst = append(dst, "\r\nX-Forwarded-Port: "...)
		dst = strconv.AppendInt(dst, int64(p), 10)
	}
	dst = append(dst, "\r\nForwarded: "...)
	dst = claims.appendForwarded(dst, fi)
	if len(fi.requestID) > 0 {
		dst = append(dst, "\r\nX-Request-Id: "...)
		dst = append(dst, fi.requestID...)
	}
	if fi.access != nil && fi.access.user != "" {
		dst = append(dst, "\r\nX-Forwarded-User: "...)
		dst = append(dst, fi.access.user...)
	}
	dst = append(dst, "\r\n\r\n"...)
	return dst
}

// forwardClaims sanitises a client's request fields on their way to the
// app (keep) and collects what the listener's own forwarding fields
// depend on: a trusted peer's X-Forwarded-For and Forwarded values, which
// go first in the listener's, and whether it sent X-Forwarded-Proto,
// X-Forwarded-Host and X-Forwarded-Port, which then pass instead of the
// listener's (a trusted X-Forwarded-Port also names the public port in
// the listener's X-Forwarded-Host and Forwarded host=). Every app
// protocol uses it (appendRequestHead for HTTP/1.1 apps, h2cRequestFields
// for h2c apps); what is protocol-specific stays with the caller: the
// fields that Connection names (HTTP/1.1 only), and "TE: trailers", which
// passes to h2c apps.
type forwardClaims struct {
	priorXFF, priorFwd []byte
	haveProto          bool // a trusted X-Forwarded-Proto passes
	haveHost           bool // a trusted X-Forwarded-Host passes
	havePort           bool // a trusted X-Forwarded-Port passes
	port               int  // its value, when it is one port number
}

// keep reports whether the client's request field name: value goes to the
// app as it is. Host and the hop-by-hop fields are the listener's to
// write; a name with '_' is dropped (and counted in fi.dropped) unless
// fi allows it and it is no alias of a field the listener owns; forwarding
// and identity claims (X-Forwarded-*, Forwarded, X-Real-IP, client
// certificates, X-Applistener-*) pass only from a trusted peer, whose
// X-Forwarded-For and Forwarded are kept for the listener's own.
// X-Request-Id never passes: the listener sends the request's id (a
// trusted peer's valid one was made the id before).
func (c *forwardClaims) keep(fi *forwardInfo, name, value []byte) bool {
	if httpgrammar.EqualFold(name, "host") || hopByHop(name) {
		return false
	}
	if underscoreDropped(name, fi.allowUnderscore) {
		fi.dropped++
		return false
	}
	if isRequestIDField(name) || isForwardedUser(name) {
		return false
	}
	if fi.access != nil && fi.access.consumedField(name, value) {
		return false
	}
	if !forwardingHeader(name) {
		return true
	}
	if !fi.trusted {
		return false
	}
	switch {
	case equalFoldDash(name, "x-forwarded-for"):
		c.priorXFF = joinList(c.priorXFF, value)
		return false
	case equalFoldDash(name, "forwarded"):
		c.priorFwd = joinList(c.priorFwd, value)
		return false
	case equalFoldDash(name, "x-forwarded-proto"):
		c.haveProto = true
	case equalFoldDash(name, "x-forwarded-host"):
		c.haveHost = true
	case equalFoldDash(name, "x-forwarded-port"):
		if p, ok := portNumber(value); ok && !c.havePort {
			c.port = p
		} else {
			c.port = 0 // several, or not a port: not used in the host values
		}
		c.havePort = true
	}
	return true
}

// publicPort is the port of the public origin: a trusted peer's
// X-Forwarded-Port when it is one port number, else the one the client
// named (fi.publicPort).
func (c *forwardClaims) publicPort(fi *forwardInfo) int {
	if c.port > 0 {
		return c.port
	}
	return fi.publicPort
}

// appendPublicHost appends the public host the app receives in
// X-Forwarded-Host: the route's name, with the public port unless it is
// 443 (implicit in https).
func (c *forwardClaims) appendPublicHost(dst []byte, fi *forwardInfo) []byte {
	dst = append(dst, fi.publicHost...)
	if p := c.publicPort(fi); p != 443 && p > 0 {
		dst = append(dst, ':')
		dst = strconv.AppendInt(dst, int64(p), 10)
	}
	return dst
}

// forwardedPort is the X-Forwarded-Port the listener adds (0: none): the
// public port, 443 included, unless a trusted peer sent X-Forwarded-Port
// (which passes) or X-Forwarded-Host (it owns the public origin: a port
// of the listener's could contradict its host).
func (c *forwardClaims) forwardedPort(fi *forwardInfo) int {
	if c.havePort || c.haveHost {
		return 0
	}
	return c.publicPort(fi)
}

// appendForwardedFor appends the X-Forwarded-For value the app receives:
// a trusted peer's values, then the client's address.
func (c *forwardClaims) appendForwardedFor(dst []byte, fi *forwardInfo) []byte {
	if len(c.priorXFF) > 0 {
		dst = append(dst, c.priorXFF...)
		dst = append(dst, ", "...)
	}
	return fi.client.AppendTo(dst)
}

// appendForwarded appends the Forwarded value the app receives (RFC
// 7239): a trusted peer's elements, then the listener's.
func (c *forwardClaims) appendForwarded(dst []byte, fi *forwardInfo) []byte {
	if len(c.priorFwd) > 0 {
		dst = append(dst, c.priorFwd...)
		dst = append(dst, ", "...)
	}
	dst = append(dst, "for="...)
	if fi.client.Is6() {
		dst = append(dst, `"[`...)
		dst = fi.client.AppendTo(dst)
		dst = append(dst, `]"`...)
	} else {
		dst = fi.client.AppendTo(dst)
	}
	dst = append(dst, ";host="...)
	if p := c.publicPort(fi); p != 443 && p > 0 {
		// host:port is no token (RFC 7239 §4): quoted.
		dst = append(dst, '"')
		dst = c.appendPublicHost(dst, fi)
		dst = append(dst, '"')
	} else {
		dst = append(dst, fi.publicHost...)
	}
	return append(dst, ";proto=https"...)
}

// trailerForwarded reports whether a client's request trailer field goes
// to the app (h2c apps: HTTP/1.1 apps get no request trailers). The rules
// are the header fields' (keep), except that forwarding and identity
// claims and the request id never pass, even from a trusted peer: the
// listener's own are in the head, and a trailer must not contradict them.
func (fi *forwardInfo) trailerForwarded(name []byte) bool {
	return !httpgrammar.EqualFold(name, "host") && !hopByHop(name) &&
		!underscoreDropped(name, fi.allowUnderscore) && !forwardingHeader(name) &&
		!isRequestIDField(name)
}

// appendAppHost appends the Host the app receives: the route's backend
// host (127.0.0.1:PORT), or with PreserveHost the client's as it sent it
// (port included; the public name when it sent none).
func (fi *forwardInfo) appendAppHost(dst, clientHost []byte) []byte {
	switch {
	case fi.preserve && len(clientHost) > 0:
		return append(dst, clientHost...)
	case fi.preserve:
		return append(dst, fi.publicHost...)
	}
	return append(dst, fi.backendHost...)
}

func joinList(prior, v []byte) []byte {
	if len(prior) == 0 {
		return v
	}
	out := make([]byte, 0, len(prior)+2+len(v))
	out = append(out, prior...)
	out = append(out, ", "...)
	return append(out, v...)
}

func appendField(dst, name, value []byte) []byte {
	dst = append(dst, name...)
	dst = append(dst, ": "...)
	dst = append(dst, value...)
	return append(dst, "\r\n"...)
}
