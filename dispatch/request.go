package dispatch

import (
	"bytes"

	"github.com/applistener/applistener/internal/httpgrammar"
	"github.com/applistener/applistener/routes"
)

// bodyKind is how a message body is delimited.
type bodyKind uint8

const (
	bodyNone bodyKind = iota
	bodyLength
	bodyChunked
	bodyUntilClose // responses only
)

// request is one parsed request head. Every slice points into the client
// connection's buffer and is valid until the head is consumed.
type request struct {
	method  []byte
	target  []byte // as sent
	path    []byte // origin-form target forwarded to the app
	http10  bool
	host    []byte // Host header, or the absolute-form authority
	fields  []headField
	body    bodyKind
	length  int64
	close   bool // client asked to close, or HTTP/1.0 without keep-alive
	upgrade bool // a WebSocket upgrade
	// zeroLength: the client sent Content-Length: 0 (body stays bodyNone).
	zeroLength bool
	expect     bool // Expect: 100-continue
	accept     []byte
	navigate   bool // Sec-Fetch-Mode: navigate (a browser loading a page)
	// connTokens are header names listed in Connection, removed as hop-by-hop.
	connTokens [][]byte
	// For the access log: User-Agent and Referer (the last of each), and
	// X-Request-Id (kept from a trusted peer that sent exactly one).
	userAgent, referer []byte
	requestID          []byte
	requestIDs         int
}

func (r *request) reset() {
	fields := r.fields[:0]
	tokens := r.connTokens[:0]
	*r = request{fields: fields, connTokens: tokens}
}

// parseRequestHead parses head (which ends with CRLFCRLF) into r.
// Semantics checked here are the ones that make a request unsafe to
// forward at all: framing (smuggling), syntax, method.
func parseRequestHead(r *request, head []byte, maxFields int) error {
	r.reset()
	lineEnd := bytes.Index(head, crlf)
	line := head[:lineEnd]
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return badRequest("malformed request line")
	}
	r.method = line[:sp1]
	rest := line[sp1+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 {
		return badRequest("malformed request line")
	}
	r.target = rest[:sp2]
	proto := rest[sp2+1:]
	if !httpgrammar.IsToken(r.method) || !httpgrammar.IsVisible(r.target) {
		return badRequest("malformed request line")
	}
	switch string(proto) {
	case "HTTP/1.1":
	case "HTTP/1.2", "HTTP/1.3", "HTTP/1.4", "HTTP/1.5", "HTTP/1.6", "HTTP/1.7", "HTTP/1.8", "HTTP/1.9":
		// A later HTTP/1.x minor version is handled as HTTP/1.1 (RFC 9112 §2.3).
	case "HTTP/1.0":
		r.http10 = true
		r.close = true
	default:
		if len(proto) == 8 && bytes.HasPrefix(proto, []byte("HTTP/")) {
			return &parseError{505, "HTTP version not supported"}
		}
		return badRequest("malformed request line")
	}
	var err error
	r.fields, err = parseFields(r.fields, head[lineEnd+2:len(head)-2], maxFields)
	if err != nil {
		return err
	}
	var hosts, lengths, encodings int
	var upgradeWS, connUpgrade, keepAlive, closeToken bool
	for i := range r.fields {
		f := &r.fields[i]
		switch {
		case httpgrammar.EqualFold(f.name, "host"):
			hosts++
			r.host = f.value
		case httpgrammar.EqualFold(f.name, "content-length"):
			lengths++
			n, ok := parseContentLength(f.value)
			if !ok {
				return badRequest("invalid Content-Length")
			}
			r.length = n
		case httpgrammar.EqualFold(f.name, "transfer-encoding"):
			encodings++
			if !httpgrammar.EqualFold(f.value, "chunked") {
				return badRequest("unsupported Transfer-Encoding")
			}
		case httpgrammar.EqualFold(f.name, "connection"):
			var opts connectionOptions
			var bad bool
			opts, r.connTokens, bad = parseConnection(f.value, r.connTokens)
			if bad {
				return badRequest("invalid Connection header")
			}
			closeToken = closeToken || opts.close
			keepAlive = keepAlive || opts.keepAlive
			connUpgrade = connUpgrade || opts.upgrade
		case httpgrammar.EqualFold(f.name, "upgrade"):
			if hasToken(f.value, "websocket") {
				upgradeWS = true
			}
		case httpgrammar.EqualFold(f.name, "expect"):
			if httpgrammar.EqualFold(f.value, "100-continue") {
				r.expect = true
			}
		case httpgrammar.EqualFold(f.name, "accept"):
			r.accept = f.value
		case httpgrammar.EqualFold(f.name, "sec-fetch-mode"):
			r.navigate = httpgrammar.EqualFold(f.value, "navigate")
		case httpgrammar.EqualFold(f.name, "user-agent"):
			r.userAgent = f.value
		case httpgrammar.EqualFold(f.name, "referer"):
			r.referer = f.value
		case isRequestIDField(f.name):
			r.requestID = f.value
			r.requestIDs++
		}
	}
	// close always wins; HTTP/1.0 keeps the connection only when asked to.
	r.close = closeToken || (r.http10 && !keepAlive)
	switch {
	case lengths > 1:
		return badRequest("multiple Content-Length headers")
	case encodings > 1:
		return badRequest("multiple Transfer-Encoding headers")
	case encodings == 1 && lengths == 1:
		return badRequest("both Content-Length and Transfer-Encoding")
	case encodings == 1 && r.http10:
		return badRequest("Transfer-Encoding in an HTTP/1.0 request")
	case encodings == 1:
		r.body = bodyChunked
	case lengths == 1 && r.length > 0:
		r.body = bodyLength
	case lengths == 1:
		r.zeroLength = true
	}
	if hosts != 1 {
		return badRequest("exactly one Host header is required")
	}
	// Request target forms (RFC 9112 §3.2).
	switch {
	case string(r.method) == "CONNECT":
		// authority-form; never forwarded (405), kept for the answer.
		r.path = r.target
	case r.target[0] == '/':
		r.path = r.target
	case len(r.target) == 1 && r.target[0] == '*':
		if !httpgrammar.EqualFold(r.method, "options") {
			return badRequest("asterisk-form target is only valid for OPTIONS")
		}
		r.path = r.target
	default:
		authority, path, ok := splitAbsolute(r.target)
		if !ok {
			return badRequest("malformed request target")
		}
		if !hostMatchesBytes(authority, r.host) {
			return &parseError{421, "request target authority does not match Host"}
		}
		r.path = path
	}
	// A WebSocket handshake has no body; with one it is a plain request.
	r.upgrade = upgradeWS && connUpgrade && string(r.method) == "GET" && r.body == bodyNone && !r.http10
	return nil
}

// splitAbsolute splits an absolute-form http(s) target into authority and
// origin-form path ("/" when empty).
func splitAbsolute(t []byte) (authority, path []byte, ok bool) {
	var rest []byte
	switch {
	case len(t) > 7 && httpgrammar.EqualFold(t[:7], "http://"):
		rest = t[7:]
	case len(t) > 8 && httpgrammar.EqualFold(t[:8], "https://"):
		rest = t[8:]
	default:
		return nil, nil, false
	}
	end := len(rest)
	if i := bytes.IndexAny(rest, "/?#"); i >= 0 {
		end = i
	}
	authority = rest[:end]
	if len(authority) == 0 || bytes.IndexByte(authority, '@') >= 0 {
		return nil, nil, false
	}
	path = rest[end:]
	if len(path) == 0 {
		return authority, []byte("/"), true
	}
	if path[0] == '?' {
		// "http://h?q" means "/?q"; forwarded as such.
		return authority, append([]byte("/"), path...), true
	}
	if path[0] != '/' {
		return nil, nil, false
	}
	return authority, path, true
}

// hostMatchesBytes reports whether two host[:port] values name the same
// host (routes.NormalizeHost's rules).
func hostMatchesBytes(a, b []byte) bool {
	na, ok := routes.NormalizeHost(string(a))
	return ok && routes.HostMatches(b, na)
}

// Answers to HTTP/2 requests that no app may receive (h2TargetError,
// h2FieldError): the client's errors, 400.
var (
	errBadMethod     = &parseError{400, "malformed request method"}
	errBadTarget     = &parseError{400, "malformed request target"}
	errBadFieldName  = &parseError{400, "invalid header name"}
	errBadFieldValue = &parseError{400, "invalid byte in header value"}
)

// h2TargetError checks an HTTP/2 request's method and :path as
// parseRequestHead checks an HTTP/1.1 request line, whatever the app's
// protocol (buildRequest for HTTP/1.1 apps, serveH2C for h2c apps): the
// method a token; the target visible ASCII only (HTTP/2 lets a space or
// a control byte through, which an HTTP/1.1 request line cannot carry and
// no app should be handed) and in origin form, or "*" for OPTIONS.
func h2TargetError(method, target string) *parseError {
	if !httpgrammar.IsToken(method) {
		return errBadMethod
	}
	if target == "" || !httpgrammar.IsVisible(target) || (target[0] != '/' && (target != "*" || method != "OPTIONS")) {
		return errBadTarget
	}
	return nil
}

// h2FieldError checks one field of an HTTP/2 request (header or trailer)
// as parseFields checks an HTTP/1.1 one: a token name, and a value
// without control bytes (HTTP/2 forbids only NUL, CR and LF; an HTTP/1.1
// app could not be sent the others, and an h2c app is not either).
func h2FieldError(name, value string) *parseError {
	if !httpgrammar.IsToken(name) {
		return errBadFieldName
	}
	if !httpgrammar.ValidFieldValue(value) {
		return errBadFieldValue
	}
	return nil
}
