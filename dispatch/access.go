package dispatch

import (
	"bytes"
	"errors"
	"strings"
	"time"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/internal/accessjwt"
	"github.com/applistener/applistener/internal/httpgrammar"
	"github.com/applistener/applistener/routes"
)

// Access enforcement for services in access mode token (issue 26; the
// contract is docs/operations.md's "Private services"). One decision, the
// same for HTTP/1.1 (conn.go), HTTP/2 (h2stream.go), h2c (h2c.go) and
// WebSockets on both (h2websocket.go): each protocol's checkAccess
// (access_conn.go) collects the request's fields into an accessInput,
// decideAccess finds its credential and its intent and returns a verdict,
// and the answer (access_answer.go) or the forwarding rules (forward.go:
// the consumed credentials removed, X-Forwarded-User set) act on it. The
// decision is made before the instance's stream slot is taken: a refused
// request never reaches, nor counts against, the sandbox.
//
// The warm path, a valid cookie on a keep-alive connection, allocates
// nothing: the fields stay slices of the request head (HTTP/1.1) or the
// engine's strings (HTTP/2), the token is verified by
// accesstoken.KeySet.Verify, and an HTTP/1.1 connection keeps the last
// token it converted to a string (clientConn.tokenString).

// The names of the credentials (the contract's).
const (
	accessHeader      = "x-applistener-token"
	accessCookie      = "__Host-applistener-token"
	accessQueryParam  = "_al_token"
	accessSubprotocol = "applistener.token."
)

// credSource is where a request's credential came from.
type credSource uint8

const (
	credNone credSource = iota
	credHeader
	credBearer
	credCookie
	credQuery
	credSubprotocol
)

var credNames = [...]string{"", "header", "bearer", "cookie", "query", "subprotocol"}

func (c credSource) String() string { return credNames[c] }

// accessIntent is what the request is for, by its own fields (never the
// User-Agent).
type accessIntent uint8

const (
	intentFetch accessIntent = iota // anything not below: 401/403 JSON
	intentNavigate
	intentPreflight
	intentWebSocket
	intentGRPC
)

// accessVerdict is the decision on a request.
type accessVerdict uint8

const (
	accessAllow           accessVerdict = iota
	accessPreflight                     // 204 with the CORS headers
	accessOriginRefused                 // 403 origin not allowed (a preflight)
	accessExchange                      // 303 to the URL without _al_token, with the cookie
	accessUnauthenticated               // 401 (navigations: the login redirect or the page)
	accessForbidden                     // 403 (a valid token for another scope)
)

// Denial reasons: the label of applistener_access_denials_total and the
// access log's access_denial.
const (
	denialNoCredential = "no_credential"
	denialMalformed    = "malformed"
	denialUnknownKey   = "unknown_key"
	denialBadSignature = "bad_signature"
	denialExpired      = "expired"
	denialNotYetValid  = "not_yet_valid"
	denialLifetime     = "lifetime"
	denialWrongScope   = "wrong_scope"
	denialRevoked      = "revoked"
	denialOrigin       = "origin_not_allowed"
	denialNoKeys       = "no_keys"
	denialInvalid      = "invalid"
)

// accessDenialReasons are every denial reason (the metric's series exist
// from the start).
var accessDenialReasons = []string{denialNoCredential, denialMalformed, denialUnknownKey, denialBadSignature,
	denialExpired, denialNotYetValid, denialLifetime, denialWrongScope, denialRevoked, denialOrigin, denialNoKeys, denialInvalidClaims}

// denialOf maps a verification error to its reason.
func denialOf(err error) string {
	switch {
	case errors.Is(err, accesstoken.ErrMalformed):
		return denialMalformed
	case errors.Is(err, accesstoken.ErrUnknownKey):
		return denialUnknownKey
	case errors.Is(err, accesstoken.ErrBadSignature):
		return denialBadSignature
	case errors.Is(err, accesstoken.ErrExpired):
		return denialExpired
	case errors.Is(err, accesstoken.ErrNotYetValid):
		return denialNotYetValid
	case errors.Is(err, accesstoken.ErrLifetime):
		return denialLifetime
	case errors.Is(err, accesstoken.ErrWrongScope):
		return denialWrongScope
	case errors.Is(err, accesstoken.ErrRevoked):
		return denialRevoked
	case errors.Is(err, accessjwt.ErrInvalidClaims):
		return denialInvalidClaims
	case errors.Is(err, accessjwt.ErrKeysUnavailable):
		return denialUnknownKey
	}
	return denialInvalid
}

// accessRoute is what a token-mode route's decisions need, made once per
// route (its backend pool holds it): the policy, the scope tokens are
// checked against, and the allowed origins as bytes for response fields.
type accessRoute struct {
	policy  *routes.AccessPolicy
	scope   accesstoken.Request
	origins [][]byte
}

// newAccessRoute returns the access state of route; nil for a public one.
func newAccessRoute(route *routes.Route) *accessRoute {
	if route.Access.IsPublic() {
		return nil
	}
	ar := &accessRoute{
		policy: &route.Access,
		scope: accesstoken.Request{
			Workspace: route.Workspace, Sandbox: route.Sandbox, Service: route.Service,
			Generation: uint64(max(route.Access.Generation, 0)),
		},
	}
	for _, o := range route.Access.CORSOrigins {
		ar.origins = append(ar.origins, []byte(o))
	}
	return ar
}

// accessInput is what the decision reads of a request: slices of the
// HTTP/1.1 head or strings of the HTTP/2 engine.
type accessInput[T string | []byte] struct {
	method, path T
	// The credentials found, the first of each kind.
	header, bearer, cookie, subproto T
	hasHeader, hasBearer, hasCookie  bool
	hasSubproto, onlyTokenProtocol   bool
	// The intent's fields.
	fetchMode, accept, origin, acrMethod, acrHeaders, contentType T
	hasFetchMode, hasOrigin, hasACRMethod                         bool
	websocket                                                     bool
	// jwt swaps JWTs for the listener's tokens (access_jwt.go); zero: none.
	jwt accessJWT
}

// field notes one request field (name in any case).
func (in *accessInput[T]) field(name, value T, bearerOK bool) {
	switch len(name) {
	case 6:
		if httpgrammar.EqualFold(name, "cookie") && !in.hasCookie {
			in.cookie, in.hasCookie = cookieValue(value, accessCookie)
		} else if httpgrammar.EqualFold(name, "accept") {
			in.accept = value
		} else if httpgrammar.EqualFold(name, "origin") {
			in.origin, in.hasOrigin = value, true
		}
	case 12:
		if httpgrammar.EqualFold(name, "content-type") {
			in.contentType = value
		}
	case 13:
		if bearerOK && !in.hasBearer && httpgrammar.EqualFold(name, "authorization") {
			in.bearer, in.hasBearer = bearerToken(value)
		}
	case 14:
		if httpgrammar.EqualFold(name, "sec-fetch-mode") {
			in.fetchMode, in.hasFetchMode = value, true
		}
	case 19:
		if !in.hasHeader && httpgrammar.EqualFold(name, accessHeader) {
			in.header, in.hasHeader = httpgrammar.TrimOWS(value), true
		}
	case 22:
		if !in.hasSubproto && httpgrammar.EqualFold(name, "sec-websocket-protocol") {
			in.subproto, in.hasSubproto = subprotocolToken(value)
			in.onlyTokenProtocol = in.hasSubproto && indexByte(value, ',') < 0
		}
	case 29:
		if httpgrammar.EqualFold(name, "access-control-request-method") {
			in.acrMethod, in.hasACRMethod = value, true
		}
	case 30:
		if httpgrammar.EqualFold(name, "access-control-request-headers") {
			in.acrHeaders = value
		}
	}
}

// intent returns what the request is for.
func (in *accessInput[T]) intent() accessIntent {
	switch {
	case string(in.method) == "OPTIONS" && in.hasOrigin && in.hasACRMethod:
		return intentPreflight
	case in.websocket:
		return intentWebSocket
	case isGRPCType(in.contentType):
		return intentGRPC
	case string(in.method) != "GET" && string(in.method) != "HEAD":
		return intentFetch
	case in.hasFetchMode:
		if httpgrammar.EqualFold(in.fetchMode, "navigate") {
			return intentNavigate
		}
		return intentFetch
	case containsFold(in.accept, "text/html"):
		return intentNavigate
	}
	return intentFetch
}

// accessDecision is the verdict on one request and what the answer, the
// forwarded request and the access log need of it.
type accessDecision struct {
	verdict accessVerdict
	intent  accessIntent
	source  credSource // the credential that passed or, when none did, the first one that failed (credNone: none)
	// origin is the request's Origin when the policy allows it (the
	// policy's bytes), else nil.
	origin []byte
	// reason is the denial reason ("" when allowed or a preflight).
	reason string
	// claims of the credential that passed (KeyID, Subject, Expires).
	claims accesstoken.Claims
	// token is the valid query token exchanged for the cookie
	// (accessExchange), or the subprotocol token of a WebSocket.
	token string
	// onlyTokenProtocol: the WebSocket offered no subprotocol but the
	// token's (echoSubprotocol).
	onlyTokenProtocol bool
	// swapCookie is the Set-Cookie added to the app's response for a
	// header-carried JWT swapped for the listener's token (access_jwt.go).
	swapCookie string
}

// echoSubprotocol makes the app's WebSocket acceptance name the token's
// subprotocol when the client offered no other and the app chose none: a
// browser that offered subprotocols fails a handshake whose answer names
// none. The client's own token goes back to it only.
func (d *accessDecision) echoSubprotocol(resp *response) {
	if d.source != credSubprotocol || !d.onlyTokenProtocol {
		return
	}
	for i := range resp.fields {
		if equalFoldDash(resp.fields[i].name, "sec-websocket-protocol") {
			return
		}
	}
	resp.fields = append(resp.fields, headField{name: []byte("Sec-WebSocket-Protocol"), value: []byte(accessSubprotocol + d.token)})
}

// decideAccess decides a request to a token-mode route. str turns a
// credential into the string Verify takes (without allocating when it
// can); keys may be nil (none configured: nothing verifies).
func decideAccess[T string | []byte](ar *accessRoute, keys *accesstoken.KeySet, in *accessInput[T], now time.Time, str func(T) string) accessDecision {
	var d accessDecision
	if in.hasOrigin {
		for i, o := range ar.policy.CORSOrigins {
			if string(in.origin) == o {
				d.origin = ar.origins[i]
				break
			}
		}
	}
	d.intent = in.intent()
	if d.intent == intentPreflight {
		if d.origin != nil {
			d.verdict = accessPreflight
		} else {
			d.verdict, d.reason = accessOriginRefused, denialOrigin
		}
		return d
	}
	scope := ar.scope
	scope.Now = now
	first, firstSrc := "", credNone
	try := func(src credSource, tok T, urlCarried bool) bool {
		req := scope
		if urlCarried {
			req.MaxLifetime = accesstoken.MaxURLLifetime
		}
		s := str(tok) // "" for an oversized one: malformed, never copied
		c, err := keys.Verify(s, &req)
		minted := ""
		if err != nil && in.jwt.v != nil {
			c, minted, err = tryJWT(&in.jwt, src, tok, s, err, &req)
		}
		if err != nil {
			if first == "" {
				first, firstSrc = denialOf(err), src
			}
			return false
		}
		d.source, d.claims = src, c
		if src == credQuery || src == credSubprotocol {
			d.token = s
		}
		if minted != "" {
			d.token = minted
			if src != credQuery {
				d.swapCookie = accessSetCookie(minted, c.Expires, in.jwt.embed)
			}
		}
		return true
	}
	// A valid ?_al_token= on a navigation is always exchanged: the URL
	// must be cleaned, and it may renew a cookie that expired.
	if d.intent == intentNavigate {
		if q, ok := queryParam(in.path, accessQueryParam); ok && try(credQuery, q, true) {
			d.verdict = accessExchange
			return d
		}
	}
	switch {
	case in.hasHeader && try(credHeader, in.header, false),
		in.hasBearer && try(credBearer, in.bearer, false),
		in.hasCookie && try(credCookie, in.cookie, false),
		in.hasSubproto && d.intent == intentWebSocket && try(credSubprotocol, in.subproto, false):
		d.verdict = accessAllow
		d.onlyTokenProtocol = d.source == credSubprotocol && in.onlyTokenProtocol
		return d
	}
	d.source, d.reason = firstSrc, first
	switch {
	case first == "":
		d.reason = denialNoCredential
	case keys == nil && first == denialUnknownKey:
		d.reason = denialNoKeys
	}
	d.verdict = accessUnauthenticated
	if d.reason == denialWrongScope {
		d.verdict = accessForbidden
	}
	return d
}

// isGRPCType reports whether a request's Content-Type is gRPC's.
func isGRPCType[T string | []byte](ct T) bool {
	const g = "application/grpc"
	if len(ct) < len(g) || !httpgrammar.EqualFold(ct[:len(g)], g) {
		return false
	}
	return len(ct) == len(g) || ct[len(g)] == '+' || ct[len(g)] == ';'
}

// containsFold reports whether v contains the lower-case ASCII sub.
func containsFold[T string | []byte](v T, sub string) bool {
	for i := 0; i+len(sub) <= len(v); i++ {
		if httpgrammar.EqualFold(v[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// cookieValue returns the value of the cookie name in a Cookie field.
func cookieValue[T string | []byte](field T, name string) (T, bool) {
	for len(field) > 0 {
		var crumb T
		if i := indexByte(field, ';'); i >= 0 {
			crumb, field = field[:i], field[i+1:]
		} else {
			crumb, field = field, field[len(field):]
		}
		crumb = httpgrammar.TrimOWS(crumb)
		if len(crumb) > len(name) && crumb[len(name)] == '=' && string(crumb[:len(name)]) == name {
			v := crumb[len(name)+1:]
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			return v, true
		}
	}
	var zero T
	return zero, false
}

// bearerToken returns the token of an "Authorization: Bearer <token>".
func bearerToken[T string | []byte](v T) (T, bool) {
	const scheme = "bearer "
	if len(v) <= len(scheme) || !httpgrammar.EqualFold(v[:len(scheme)], scheme) {
		var zero T
		return zero, false
	}
	return httpgrammar.TrimOWS(v[len(scheme):]), true
}

// subprotocolToken returns the token of the first applistener.token.
// entry of a Sec-WebSocket-Protocol list.
func subprotocolToken[T string | []byte](v T) (T, bool) {
	for len(v) > 0 {
		var p T
		if i := indexByte(v, ','); i >= 0 {
			p, v = v[:i], v[i+1:]
		} else {
			p, v = v, v[len(v):]
		}
		p = httpgrammar.TrimOWS(p)
		if len(p) > len(accessSubprotocol) && string(p[:len(accessSubprotocol)]) == accessSubprotocol {
			return p[len(accessSubprotocol):], true
		}
	}
	var zero T
	return zero, false
}

// queryParam returns the value of the first query parameter name of path.
func queryParam[T string | []byte](path T, name string) (T, bool) {
	q := indexByte(path, '?')
	if q < 0 {
		var zero T
		return zero, false
	}
	rest := path[q+1:]
	if h := indexByte(rest, '#'); h >= 0 {
		rest = rest[:h]
	}
	for len(rest) > 0 {
		var p T
		if i := indexByte(rest, '&'); i >= 0 {
			p, rest = rest[:i], rest[i+1:]
		} else {
			p, rest = rest, rest[len(rest):]
		}
		if len(p) > len(name) && p[len(name)] == '=' && string(p[:len(name)]) == name {
			return p[len(name)+1:], true
		}
	}
	var zero T
	return zero, false
}

// withoutQueryParam returns path without any parameter name (path itself
// when it has none): what the app and the redirect see.
func withoutQueryParam(path, name string) string {
	q := strings.IndexByte(path, '?')
	if q < 0 || !strings.Contains(path[q:], name) {
		return path
	}
	var b strings.Builder
	b.WriteString(path[:q])
	sep := byte('?')
	for p := range strings.SplitSeq(path[q+1:], "&") {
		if p == name || strings.HasPrefix(p, name+"=") {
			continue
		}
		b.WriteByte(sep)
		b.WriteString(p)
		sep = '&'
	}
	return b.String()
}

// withoutCrumb returns a Cookie field's value without the crumbs named
// name, and whether any was removed ("" when nothing is left).
func withoutCrumb(v []byte, name string) ([]byte, bool) {
	if !bytes.Contains(v, []byte(name)) {
		return v, false
	}
	out := make([]byte, 0, len(v))
	removed := false
	for p := range bytes.SplitSeq(v, []byte{';'}) {
		c := httpgrammar.TrimOWS(p)
		if len(c) >= len(name) && string(c[:len(name)]) == name && (len(c) == len(name) || c[len(name)] == '=') {
			removed = true
			continue
		}
		if len(c) == 0 {
			continue
		}
		if len(out) > 0 {
			out = append(out, "; "...)
		}
		out = append(out, c...)
	}
	return out, removed
}

// withoutTokenSubprotocols returns a Sec-WebSocket-Protocol list without
// its applistener.token. entries ("" when nothing is left).
func withoutTokenSubprotocols(v []byte) ([]byte, bool) {
	if !bytes.Contains(v, []byte(accessSubprotocol)) {
		return v, false
	}
	out := make([]byte, 0, len(v))
	removed := false
	for p := range bytes.SplitSeq(v, []byte{','}) {
		c := httpgrammar.TrimOWS(p)
		if bytes.HasPrefix(c, []byte(accessSubprotocol)) {
			removed = true
			continue
		}
		if len(c) == 0 {
			continue
		}
		if len(out) > 0 {
			out = append(out, ", "...)
		}
		out = append(out, c...)
	}
	return out, removed
}

// indexByte is strings.IndexByte or bytes.IndexByte (vectorised), for
// either form.
func indexByte[T string | []byte](s T, c byte) int {
	switch v := any(s).(type) {
	case string:
		return strings.IndexByte(v, c)
	case []byte:
		return bytes.IndexByte(v, c)
	}
	return -1
}

// accessForward is what the forwarding rules do for a token-mode route
// (forwardInfo.access): the credentials the listener consumes removed,
// the subject sent as X-Forwarded-User.
type accessForward struct {
	bearer bool   // Authorization: Bearer is the listener's (the policy's "bearer")
	user   string // the token's subject ("" none)
}

// consumedField reports whether a request field is a credential the
// listener consumed: X-Applistener-Token, and Authorization: Bearer when
// the policy takes it. Client-sent X-Forwarded-User is dropped for every
// route (forwardClaims.keep).
func (af *accessForward) consumedField(name, value []byte) bool {
	switch len(name) {
	case 19:
		return httpgrammar.EqualFold(name, accessHeader)
	case 13:
		if af.bearer && httpgrammar.EqualFold(name, "authorization") {
			_, ok := bearerToken(value)
			return ok
		}
	}
	return false
}

// rewriteField returns the value a Cookie or Sec-WebSocket-Protocol field
// is forwarded with, without the listener's credential; drop when nothing
// is left of it. Other fields pass as they are.
func (af *accessForward) rewriteField(name, value []byte) (out []byte, drop bool) {
	switch {
	case len(name) == 6 && httpgrammar.EqualFold(name, "cookie"):
		v, removed := withoutCrumb(value, accessCookie)
		return v, removed && len(v) == 0
	case len(name) == 22 && httpgrammar.EqualFold(name, "sec-websocket-protocol"):
		v, removed := withoutTokenSubprotocols(value)
		return v, removed && len(v) == 0
	}
	return value, false
}

// trailerValue returns the value a request trailer is forwarded with
// (h2c apps get request trailers): the listener's credentials are taken
// out as from the head (consumedField, rewriteField); keep false: not
// forwarded. af is nil on a route without an access policy.
func (af *accessForward) trailerValue(name, value string) (out string, keep bool) {
	if af == nil {
		return value, true
	}
	n, v := []byte(name), []byte(value)
	if af.consumedField(n, v) {
		return "", false
	}
	rv, drop := af.rewriteField(n, v)
	if drop {
		return "", false
	}
	return string(rv), true
}

// isForwardedUser reports whether name is X-Forwarded-User (the listener's
// to set; a client's is always dropped).
func isForwardedUser(name []byte) bool {
	return len(name) == 16 && equalFoldDash(name, "x-forwarded-user")
}
