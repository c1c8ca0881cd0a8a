package dispatch

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/applistener/applistener/internal/httpgrammar"
)

// response is one parsed response head from the app.
type response struct {
	status     int
	reason     []byte
	fields     []headField
	body       bodyKind
	length     int64
	close      bool
	upgradeWS  bool
	connTokens [][]byte
}

func (r *response) reset() {
	fields := r.fields[:0]
	tokens := r.connTokens[:0]
	*r = response{fields: fields, connTokens: tokens}
}

// parseResponseHead parses an app's response head. method is the request
// method (HEAD responses carry no body).
func parseResponseHead(r *response, head []byte, headRequest bool, maxFields int) error {
	r.reset()
	lineEnd := bytes.Index(head, crlf)
	line := head[:lineEnd]
	if len(line) < 12 || (string(line[:9]) != "HTTP/1.1 " && string(line[:9]) != "HTTP/1.0 ") {
		return badRequest("malformed status line")
	}
	http10 := line[7] == '0'
	code := line[9:12]
	if code[0] < '0' || code[0] > '9' || code[1] < '0' || code[1] > '9' || code[2] < '0' || code[2] > '9' {
		return badRequest("malformed status code")
	}
	r.status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if !validStatus(r.status) {
		return badRequest("malformed status code")
	}
	if len(line) > 12 {
		if line[12] != ' ' || !httpgrammar.ValidFieldValue(line[13:]) {
			return badRequest("malformed status line")
		}
		r.reason = line[13:]
	}
	var err error
	r.fields, err = parseFields(r.fields, head[lineEnd+2:len(head)-2], maxFields)
	if err != nil {
		return err
	}
	var lengths int
	var chunked, badTE bool
	var upgrade, keepAlive, closeToken bool
	for i := range r.fields {
		f := &r.fields[i]
		switch {
		case httpgrammar.EqualFold(f.name, "content-length"):
			n, ok := parseContentLength(f.value)
			if !ok || (lengths > 0 && n != r.length) {
				return badRequest("invalid Content-Length from the app")
			}
			lengths++
			r.length = n
		case httpgrammar.EqualFold(f.name, "transfer-encoding"):
			if httpgrammar.EqualFold(f.value, "chunked") && !chunked {
				chunked = true
			} else {
				badTE = true
			}
		case httpgrammar.EqualFold(f.name, "connection"):
			// The app's tokens are not checked: they only name fields
			// that are then not relayed.
			var opts connectionOptions
			opts, r.connTokens, _ = parseConnection(f.value, r.connTokens)
			closeToken = closeToken || opts.close
			keepAlive = keepAlive || opts.keepAlive
		case httpgrammar.EqualFold(f.name, "upgrade"):
			upgrade = hasToken(f.value, "websocket")
		}
	}
	r.close = closeToken || (http10 && !keepAlive)
	switch {
	case r.status < 200 || r.status == 204 || r.status == 304 || headRequest:
		r.body = bodyNone
	case badTE:
		// A transfer coding other than chunked would have to reach the
		// client intact, and clients do not decode it: refuse (502).
		return badRequest("unsupported Transfer-Encoding from the app")
	case chunked:
		r.body = bodyChunked
		if lengths > 0 {
			// RFC 9112 §6.3: Transfer-Encoding wins; the connection is not reused.
			r.close = true
		}
	case lengths > 0:
		r.body = bodyLength
	default:
		r.body = bodyUntilClose
		r.close = true
	}
	r.upgradeWS = r.status == 101 && upgrade
	return nil
}

// validStatus reports whether an app's status may be relayed: one of
// RFC 9110's classes, 100 to 599. Every app protocol checks it: an
// HTTP/1.1 app's status line (parseResponseHead), an h2c app's :status
// (proxyH2C), which h2client takes as any integer. Anything
// else is the app's failure: 502, logged as an invalid response with the
// status.
func validStatus(code int) bool { return code >= 100 && code <= 599 }

// appendResponseHead writes the response head sent to the client. bodyOut
// is how the listener frames the body towards the client. reqID, when not
// nil, is sent as X-Request-Id in place of the app's (a final answer
// carries the request's id; a 1xx is relayed as it is).
func appendResponseHead(dst []byte, r *response, bodyOut bodyKind, closeConn bool, headRequest bool, reqID []byte) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(r.status), 10)
	dst = append(dst, ' ')
	dst = append(dst, r.reason...)
	dst = append(dst, "\r\n"...)
	for i := range r.fields {
		f := &r.fields[i]
		if hopByHop(f.name) || connectionNamed(f.name, r.connTokens) {
			// Keep the app's Content-Length on HEAD and 304 answers: it
			// describes the representation, not this message's body.
			if (headRequest || r.status == 304) && httpgrammar.EqualFold(f.name, "content-length") {
				dst = appendField(dst, f.name, f.value)
			}
			continue
		}
		if reqID != nil && isRequestIDField(f.name) {
			continue
		}
		dst = appendField(dst, f.name, f.value)
	}
	if reqID != nil {
		dst = append(dst, "X-Request-Id: "...)
		dst = append(dst, reqID...)
		dst = append(dst, "\r\n"...)
	}
	switch bodyOut {
	case bodyLength:
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, r.length, 10)
		dst = append(dst, "\r\n"...)
	case bodyChunked:
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	}
	switch {
	case r.upgradeWS:
		dst = append(dst, "Connection: Upgrade\r\nUpgrade: websocket\r\n"...)
	case closeConn:
		dst = append(dst, "Connection: close\r\n"...)
	}
	return append(dst, "\r\n"...)
}

// readAppResponseHead reads the app's response head (ending with
// CRLFCRLF), growing the buffer up to 64 KiB for a large head; the HTTP/1.1
// and HTTP/2 paths share it.
func readAppResponseHead(bc *backendConn) ([]byte, error) {
	const maxResponseHead = 64 << 10
	for {
		p := bc.in.bytes()
		if end := findHeadEnd(p); end >= 0 {
			bc.in.r += end
			return p[:end], nil
		}
		if len(p) > maxResponseHead {
			return nil, errors.New("response head too large")
		}
		err := bc.in.fill()
		if errors.Is(err, errBufferFull) {
			bc.in.compact()
			if err = bc.in.fill(); errors.Is(err, errBufferFull) && bc.in.grow(maxResponseHead+4) {
				err = bc.in.fill()
			}
		}
		if err != nil {
			return nil, err
		}
	}
}
