package dispatch

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/applistener/applistener/dispatch/internal/h2engine"
)

// The bodies of the listener's access answers (the contract's).
const (
	accessBodyUnauthenticated = `{"error":"unauthenticated"}`
	accessBodyForbidden       = `{"error":"forbidden"}`
	accessBodyOrigin          = `{"error":"origin not allowed"}`
	accessWWWAuthenticate     = `Bearer realm="applistener"`
	// accessCORSMaxAge is how long, in seconds, a browser may keep a
	// preflight's answer.
	accessCORSMaxAge = "600"
)

// accessPage is the small HTML page of a navigation without a credential
// to a service without a login_url.
const accessPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>401 Sign-in required</title>
<style>body{font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem;color:#222}</style></head>
<body><h1>Sign-in required</h1>
<p>This preview is private. Open it with the link you were given (it carries an access token), or ask its owner for one.</p>
</body></html>
`

// accessAnswer is the listener's answer to a request the access decision
// did not let through (or a preflight), protocol-neutral: each protocol
// writes it (clientConn.writeAccessAnswer, h2Stream.writeAccessAnswer).
type accessAnswer struct {
	status int
	fields [][2]string // lower-case names
	body   string
}

// accessRequestInfo is what an answer needs of the request besides the
// decision: the public origin's host and port, the request's target, and
// the preflight's requested method and headers.
type accessRequestInfo struct {
	host       string // the route's public name
	port       int    // the public port (443: none in URLs)
	path       string // the request target as sent
	acrMethod  string
	acrHeaders string
}

// answerFor returns the answer to a request decided d on route ar.
func answerFor(ar *accessRoute, d *accessDecision, ri *accessRequestInfo) accessAnswer {
	var a accessAnswer
	add := func(name, value string) { a.fields = append(a.fields, [2]string{name, value}) }
	json := func(status int, body string) {
		a.status, a.body = status, body
		add("content-type", "application/json")
	}
	switch d.verdict {
	case accessPreflight:
		a.status = http.StatusNoContent
		add("access-control-allow-origin", string(d.origin))
		add("access-control-allow-credentials", "true")
		add("access-control-allow-methods", ri.acrMethod)
		if ri.acrHeaders != "" {
			add("access-control-allow-headers", ri.acrHeaders)
		}
		add("access-control-max-age", accessCORSMaxAge)
		add("vary", "Origin")
		add("cache-control", "no-store")
		return a
	case accessOriginRefused:
		json(http.StatusForbidden, accessBodyOrigin)
		add("cache-control", "no-store")
		return a
	case accessExchange:
		a.status = http.StatusSeeOther
		add("location", withoutQueryParam(ri.path, accessQueryParam))
		add("set-cookie", accessSetCookie(d.token, d.claims.Expires, ar.policy.Embed))
		add("cache-control", "no-store")
		return a
	}
	switch {
	case d.intent == intentGRPC:
		a.status = http.StatusOK
		add("content-type", "application/grpc")
		if d.verdict == accessForbidden {
			add("grpc-status", "7")
			add("grpc-message", "permission denied")
		} else {
			add("grpc-status", "16")
			add("grpc-message", "unauthenticated")
		}
	case d.verdict == accessForbidden:
		json(http.StatusForbidden, accessBodyForbidden)
	case d.intent == intentNavigate && ar.policy.LoginURL != "":
		a.status = http.StatusSeeOther
		add("location", loginRedirect(ar.policy.LoginURL, ri))
	case d.intent == intentNavigate:
		a.status, a.body = http.StatusUnauthorized, accessPage
		add("content-type", "text/html; charset=utf-8")
		add("www-authenticate", accessWWWAuthenticate)
	default:
		json(http.StatusUnauthorized, accessBodyUnauthenticated)
		add("www-authenticate", accessWWWAuthenticate)
	}
	add("cache-control", "no-store")
	add("x-content-type-options", "nosniff")
	if d.origin != nil {
		add("access-control-allow-origin", string(d.origin))
		add("access-control-allow-credentials", "true")
		add("vary", "Origin")
	}
	return a
}

// accessSetCookie is the Set-Cookie that carries token until it expires.
func accessSetCookie(token string, expires time.Time, embed bool) string {
	maxAge := max(int64(time.Until(expires)/time.Second), 1)
	var b strings.Builder
	b.WriteString(accessCookie)
	b.WriteByte('=')
	b.WriteString(token)
	b.WriteString("; Path=/; Max-Age=")
	b.WriteString(strconv.FormatInt(maxAge, 10))
	b.WriteString("; Secure; HttpOnly; ")
	if embed {
		b.WriteString("SameSite=None; Partitioned")
	} else {
		b.WriteString("SameSite=Lax")
	}
	return b.String()
}

// loginRedirect is login_url with return_to, the request's https URL
// without _al_token.
func loginRedirect(login string, ri *accessRequestInfo) string {
	u := "https://" + ri.host
	if ri.port != 443 && ri.port > 0 {
		u += ":" + strconv.Itoa(ri.port)
	}
	u += withoutQueryParam(ri.path, accessQueryParam)
	sep := "?"
	if strings.Contains(login, "?") {
		sep = "&"
	}
	return login + sep + "return_to=" + url.QueryEscape(u)
}

// appendAccessAnswer appends a as an HTTP/1.1 response.
func appendAccessAnswer(dst []byte, a *accessAnswer, head, closeConn bool, reqID []byte) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(a.status), 10)
	dst = append(dst, ' ')
	dst = append(dst, http.StatusText(a.status)...)
	dst = append(dst, "\r\n"...)
	for _, f := range a.fields {
		dst = appendField(dst, []byte(http.CanonicalHeaderKey(f[0])), []byte(f[1]))
	}
	if a.status != http.StatusNoContent {
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(len(a.body)), 10)
		dst = append(dst, "\r\n"...)
	}
	if len(reqID) > 0 {
		dst = append(dst, "X-Request-Id: "...)
		dst = append(dst, reqID...)
		dst = append(dst, "\r\n"...)
	}
	if closeConn {
		dst = append(dst, "Connection: close\r\n"...)
	}
	dst = append(dst, "\r\n"...)
	if !head {
		dst = append(dst, a.body...)
	}
	return dst
}

// writeH2AccessAnswer writes a on an HTTP/2 stream.
func writeH2AccessAnswer(es *h2engine.Stream, a *accessAnswer, head bool, reqID []byte) error {
	fields := make([]h2engine.HeaderField, 0, len(a.fields)+2)
	for _, f := range a.fields {
		fields = append(fields, h2engine.HeaderField{Name: f[0], Value: f[1]})
	}
	if a.status != http.StatusNoContent {
		fields = append(fields, h2engine.HeaderField{Name: "content-length", Value: strconv.Itoa(len(a.body))})
	}
	if len(reqID) > 0 {
		fields = append(fields, h2engine.HeaderField{Name: "x-request-id", Value: string(reqID)})
	}
	if head || a.body == "" {
		return es.WriteHeaders(a.status, fields, true)
	}
	if err := es.WriteHeaders(a.status, fields, false); err != nil {
		return err
	}
	return es.WriteLast([]byte(a.body))
}

// noteAccess records an answered access decision: the access log's fields,
// the denial's metric and log line (logDenial, the protocol's), and the
// outcome. Preflights and cookie exchanges are answers, not denials.
func (s *Server) noteAccess(rec *accessRecord, d *accessDecision, a *accessAnswer) {
	rec.noteAccess(d)
	if d.reason == "" {
		rec.status, rec.outcome = a.status, outcomeOK
		s.m.request(a.status)
		return
	}
	rec.denied(denial{status: a.status, reason: "access: " + d.reason})
	s.m.denied(a.status)
	s.m.accessDenials.WithLabelValues(d.reason).Inc()
}
