package dispatch

import (
	"bytes"
	"html"
	"net/http"
	"strconv"
)

// Reasons given to clients. They never name another route or sandbox: an
// unknown sandbox and a withdrawn one look the same from outside.
const (
	reasonMisdirected = "the Host header does not match the TLS server name"
	reasonRevoked     = "this application route is no longer available"
	reasonLimit       = "too many concurrent streams for this sandbox"
	reasonMethod      = "method not allowed"
	reasonDialRefused = "the application is not accepting connections"
	reasonDialTimeout = "timed out connecting to the application"
	reasonRespTimeout = "timed out waiting for the application's response"
	reasonBadResponse = "the application sent an invalid response"
	reasonReqTimeout  = "timed out reading the request"
)

// appendErrorResponse writes a complete error response: a small HTML page
// for browsers (Accept: text/html), one plain-text line otherwise.
func appendErrorResponse(dst []byte, status int, reason string, accept []byte, closeConn, retryAfter, allow bool) []byte {
	text := http.StatusText(status)
	var body []byte
	ctype := "text/plain; charset=utf-8"
	if bytes.Contains(accept, []byte("text/html")) {
		ctype = "text/html; charset=utf-8"
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
	} else {
		body = strconv.AppendInt(body, int64(status), 10)
		body = append(body, ' ')
		body = append(body, text...)
		body = append(body, ": "...)
		body = append(body, reason...)
		body = append(body, '\n')
	}
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	dst = append(dst, text...)
	dst = append(dst, "\r\nContent-Type: "...)
	dst = append(dst, ctype...)
	dst = append(dst, "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n"...)
	if retryAfter {
		dst = append(dst, "Retry-After: 1\r\n"...)
	}
	if allow {
		dst = append(dst, "Allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS\r\n"...)
	}
	if closeConn {
		dst = append(dst, "Connection: close\r\n"...)
	}
	dst = append(dst, "\r\n"...)
	return append(dst, body...)
}
