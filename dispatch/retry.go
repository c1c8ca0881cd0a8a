package dispatch

// The retry rule, the same for HTTP/1.1 and HTTP/2 clients (RFC 9110
// §9.2.2: a proxy must not automatically retry a non-idempotent request).
//
// A request is sent to the app once. It goes to a second app connection
// only when all of these hold:
//   - its method is GET, HEAD or OPTIONS (TRACE and CONNECT are refused
//     before this point; PUT and DELETE are idempotent by definition but
//     apps in sandboxes implement them as they please, so they are not
//     replayed, which is also what Go's own HTTP client does);
//   - its body is empty or was sent whole with the head from memory (a
//     streamed body cannot be sent again);
//   - the connection that failed was a reused pooled one (a fresh dial that
//     fails is the app's answer);
//   - it failed before any byte of the request could reach the app: the
//     write of the head returned an error having written nothing.
//
// An app connection that the app closed while it was idle is not a
// failure at all: backendPool.get finds it closed before anything is
// written (backendConn.usable: the hang-up watch, or the connection's own
// probe) and the request takes another connection. Once a byte of the
// request may have been read by the app, an EOF or reset is answered with
// 502 and never replayed, whatever the method: the app may have acted on
// it.

// sendFailure is where sending a request to the app failed.
type sendFailure uint8

const (
	// failedUnsent: the first write failed having written nothing; the app
	// cannot have seen any of the request.
	failedUnsent sendFailure = iota
	// failedPartlySent: the write failed after some bytes went out.
	failedPartlySent
	// failedAfterSend: the request was written; no (valid) response came.
	failedAfterSend
)

// idempotentMethod reports whether a request with this method may be sent
// again when the app cannot have seen it.
func idempotentMethod(method []byte) bool {
	switch string(method) {
	case "GET", "HEAD", "OPTIONS":
		return true
	}
	return false
}

// mayRetry applies the retry rule above. bodyInMemory: the request has no
// body or its whole body is part of what was written.
func mayRetry(method []byte, bodyInMemory, reused bool, at sendFailure, attempt int) bool {
	return attempt == 0 && reused && at == failedUnsent && bodyInMemory && idempotentMethod(method)
}

// writeFailure classifies a failed write of the request head.
func writeFailure(written int) sendFailure {
	if written == 0 {
		return failedUnsent
	}
	return failedPartlySent
}
