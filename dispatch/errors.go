package dispatch

import (
	"bytes"
	"html"
	"net/http"
	"strconv"

	"github.com/applistener/applistener/dispatch/internal/h2engine"
)

// Reasons given to clients. They never name another route or sandbox: an
// unknown sandbox and a withdrawn one look the same from outside.
const (
	reasonMisdirected = "the Host header does not match the TLS server name"
	reasonRevoked     = "this application route is no longer available"
	reasonLimit       = "too many concurrent streams for this sandbox"
	reasonMethod      = "method not allowed"
	reasonDialRefused = "the application is not accepting connections"
	reasonNotListen   = "nothing is listening on the application's port yet"
	reasonDialTimeout = "timed out connecting to the application"
	reasonRespTimeout = "timed out waiting for the application's response"
	reasonBadResponse = "the application sent an invalid response"
	reasonReqTimeout  = "timed out reading the request"
)

// denial is an answer the listener gives in place of the app's: a status,
// the one-line reason the client is told, and what happens next. Each
// protocol has one renderer: clientConn.deny (HTTP/1.1) and h2Stream.deny
// (HTTP/2).
type denial struct {
	status     int
	reason     string
	retryAfter int // seconds, sent as Retry-After; 0: none
	// close ends the client connection after the answer (HTTP/2: GOAWAY,
	// the connection's other streams may finish).
	close bool
	// port, when set, makes this the answer that nothing listens on that
	// port of the sandbox yet (denyNotListening): its body is a
	// self-refreshing page for navigations, JSON otherwise.
	port int
}

// The listener's own answers.
var (
	denyMisdirected = denial{status: 421, reason: reasonMisdirected}
	denyRevoked     = denial{status: 503, reason: reasonRevoked, close: true}
	denyLimit       = denial{status: 503, reason: reasonLimit, retryAfter: 1}
	denyMethod      = denial{status: 405, reason: reasonMethod}
	denyDialRefused = denial{status: 502, reason: reasonDialRefused}
	denyDialTimeout = denial{status: 504, reason: reasonDialTimeout}
	denyRespTimeout = denial{status: 504, reason: reasonRespTimeout}
	denyBadResponse = denial{status: 502, reason: reasonBadResponse}
	denyReqTimeout  = denial{status: 408, reason: reasonReqTimeout}
)

// notListeningRefresh is how soon, in seconds, a client is told to try
// again after the app was found not listening (Retry-After, and the HTML
// page's refresh).
const notListeningRefresh = 2

// denyNotListening is the answer once the app has refused connections on
// port for the whole start grace (appstart.go): 502, distinct in its body
// from every other 502.
func denyNotListening(port int) denial {
	return denial{status: 502, reason: reasonNotListen, retryAfter: notListeningRefresh, port: port}
}

// denyParse is the answer to a request head the parser refused.
func denyParse(pe *parseError) denial { return denial{status: pe.status, reason: pe.reason} }

// closing returns d with the connection ending after it.
func (d denial) closing() denial {
	d.close = true
	return d
}

// errorBody is the body of the answer d: a small HTML page for browsers
// (Accept: text/html), one plain-text line otherwise; for the app not
// listening, notListeningBody.
func errorBody(d denial, accept []byte, navigate bool) (ctype string, body []byte) {
	if d.port > 0 {
		return notListeningBody(d.port, accept, navigate)
	}
	status, reason := d.status, d.reason
	text := http.StatusText(status)
	if bytes.Contains(accept, []byte("text/html")) {
		body = append(body, "<!doctype html><html><head><title>"...)
		body = strconv.AppendInt(body, int64(status), 10)
		body = append(body, ' ')
		body = append(body, text...)
		body = append(body, "</title></head><body><h1>"...)
		body = strconv.AppendInt(body, int64(status), 10)
		body = append(body, ' ')
		body = append(body, text...)
		body = append(body, "</h1><p>"...)
		body = append(body, html.EscapeString(reason)...)
		body = append(body, "</p></body></html>\n"...)
		return "text/html; charset=utf-8", body
	}
	body = strconv.AppendInt(body, int64(status), 10)
	body = append(body, ' ')
	body = append(body, text...)
	body = append(body, ": "...)
	body = append(body, reason...)
	body = append(body, '\n')
	return "text/plain; charset=utf-8", body
}

// notListeningBody is the body of denyNotListening: for a navigation
// (Sec-Fetch-Mode: navigate, or Accept naming text/html) an HTML page that
// says so and reloads itself; for anything else (fetch, XHR, API clients)
// {"error":"app_not_listening","port":N}.
func notListeningBody(port int, accept []byte, navigate bool) (ctype string, body []byte) {
	if navigate || bytes.Contains(accept, []byte("text/html")) {
		body = append(body, "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\""...)
		body = strconv.AppendInt(body, notListeningRefresh, 10)
		body = append(body, "\"><title>502 Waiting for the app</title></head><body><h1>Nothing is listening on port "...)
		body = strconv.AppendInt(body, int64(port), 10)
		body = append(body, " yet</h1><p>The app in this sandbox has not started listening on port "...)
		body = strconv.AppendInt(body, int64(port), 10)
		body = append(body, ". This page reloads itself every "...)
		body = strconv.AppendInt(body, notListeningRefresh, 10)
		body = append(body, " seconds until it does.</p></body></html>\n"...)
		return "text/html; charset=utf-8", body
	}
	body = append(body, `{"error":"app_not_listening","port":`...)
	body = strconv.AppendInt(body, int64(port), 10)
	body = append(body, "}\n"...)
	return "application/json", body
}

// allowedMethods is the Allow field of a 405 answer.
const allowedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

// appendErrorResponse writes a complete HTTP/1.1 error response for d;
// accept and navigate (Sec-Fetch-Mode: navigate) choose the body's form;
// reqID, the request's id, is sent as X-Request-Id (none when empty).
func appendErrorResponse(dst []byte, d denial, accept []byte, navigate bool, reqID []byte) []byte {
	ctype, body := errorBody(d, accept, navigate)
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(d.status), 10)
	dst = append(dst, ' ')
	dst = append(dst, http.StatusText(d.status)...)
	dst = append(dst, "\r\nContent-Type: "...)
	dst = append(dst, ctype...)
	dst = append(dst, "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n"...)
	if d.retryAfter > 0 {
		dst = append(dst, "Retry-After: "...)
		dst = strconv.AppendInt(dst, int64(d.retryAfter), 10)
		dst = append(dst, "\r\n"...)
	}
	if d.status == 405 {
		dst = append(dst, "Allow: "+allowedMethods+"\r\n"...)
	}
	if len(reqID) > 0 {
		dst = append(dst, "X-Request-Id: "...)
		dst = append(dst, reqID...)
		dst = append(dst, "\r\n"...)
	}
	if d.close {
		dst = append(dst, "Connection: close\r\n"...)
	}
	dst = append(dst, "\r\n"...)
	return append(dst, body...)
}

// writeH2Error writes the HTTP/2 form of the same answer on es: the same
// fields and body (none for a HEAD request), the response ended.
func writeH2Error(es *h2engine.Stream, d denial, accept string, navigate, head bool, reqID []byte) error {
	ctype, body := errorBody(d, []byte(accept), navigate)
	var fields [7]h2engine.HeaderField
	f := append(fields[:0],
		h2engine.HeaderField{Name: "content-type", Value: ctype},
		h2engine.HeaderField{Name: "cache-control", Value: "no-store"},
		h2engine.HeaderField{Name: "x-content-type-options", Value: "nosniff"},
		h2engine.HeaderField{Name: "content-length", Value: strconv.Itoa(len(body))})
	if d.retryAfter > 0 {
		f = append(f, h2engine.HeaderField{Name: "retry-after", Value: strconv.Itoa(d.retryAfter)})
	}
	if d.status == 405 {
		f = append(f, h2engine.HeaderField{Name: "allow", Value: allowedMethods})
	}
	if len(reqID) > 0 {
		f = append(f, h2engine.HeaderField{Name: "x-request-id", Value: string(reqID)})
	}
	if head || len(body) == 0 {
		return es.WriteHeaders(d.status, f, true)
	}
	if err := es.WriteHeaders(d.status, f, false); err != nil {
		return err
	}
	return es.WriteLast(body)
}
