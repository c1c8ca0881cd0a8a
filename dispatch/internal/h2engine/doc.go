// Package h2engine is a lean HTTP/2 server engine (RFC 9113) for the
// application listener, built from x/net's lower-level pieces: its Framer
// reads (and validates) frames, its hpack Decoder and Encoder handle
// header blocks. It replaces, for dispatch, x/net's http2.Server, whose
// per-stream serve-goroutine handoffs, per-write goroutines and
// http.Request/ResponseWriter/header maps cost about 40 allocations and
// most of the CPU of a small request. Here a request whose fields come
// from the HPACK tables costs no allocation: HEADERS frames are parsed in
// the read buffer, and a stream's goroutine is reused for the next one.
//
// # Structure
//
// One connection is a Conn (conn.go). Serve runs its single reading
// goroutine: it reads the client preface and then frames (Framer frame
// headers over a readBuf, readbuf.go, over headClock, clock.go, which
// wraps the net.Conn), and acts on each one (frames.go): SETTINGS, PING,
// WINDOW_UPDATE, RST_STREAM, PRIORITY (validated, otherwise ignored),
// GOAWAY, DATA, and header blocks (headers.go), which it decodes
// incrementally, fragment by fragment, straight into a pooled Stream
// (stream.go): no intermediate field list, no map, and fields that come
// from the HPACK tables cost no allocation. Every HEADERS frame is parsed
// by the engine (readHeaders) rather than by the Framer, which allocates
// a HeadersFrame for each: where it lies in the read buffer, or, when a
// MaxFrameSize above 16 KiB lets in a larger one, in a buffer of its own.
// A complete, valid request starts Handler.ServeStream on a goroutine of
// its own (handlers do blocking upstream I/O; workers.go). When a handler
// returns while other streams of the connection run, its goroutine waits
// to serve the next new stream (runStreams, nextStream): its stack has
// already grown to what a handler needs, which a new goroutine would grow
// again. Waiting goroutines are at most MaxConcurrentStreams, end when no
// stream runs, when the connection closes and at each tick of the
// connection timer (IdleTimeout, PingInterval), so a connection that
// holds only a WebSocket keeps none for long. A goroutine that ends so
// waits instead, up to spareIdle, as a spare for a new stream of any
// connection (at most maxSpares of them), so that a client with one
// request at a time does not start a goroutine, and grow its stack, per
// request; an idle connection holds none. The Stream carries Method,
// Scheme, Authority, Path, Protocol (RFC 8441), Header (a reused slice)
// and ContentLength, and Trailer once the body has been read.
//
// Stream state (RFC 9113 5.1) lives in the Stream under the connection's
// mutex: idle (an id above the highest seen), open, half-closed (remote:
// END_STREAM received; local: END_STREAM sent) and closed (both, or a
// reset). Open and half-closed streams are a small slice, searched
// linearly; a ring of recently closed ids tells frames on a stream closed
// by the client (STREAM_CLOSED) from frames in flight on a stream the
// engine reset (ignored), and from ids never opened (PROTOCOL_ERROR). A
// stream counts against MaxConcurrentStreams until it is closed and its
// handler has returned, so reset streams cannot pile up handlers.
//
// # The write path
//
// There is no writer goroutine. A handler writing HEADERS or DATA takes
// the connection's write lock, encodes its frames into the connection's
// write buffer (HPACK-encoding under the same lock, which keeps the
// encoder's table in step with the order of the frames) and leaves. An
// atomic count of pending writers (holding or waiting for the lock) makes
// the last one to leave flush, so concurrent streams share one write to
// the socket; a response's HEADERS and DATA go out in one write. A
// response that ends while other streams are running is not written by
// its handler: the flusher goroutine writes it after yielding
// (runtime.Gosched), once the streams whose answers are ready have added
// theirs, so many responses share one write (and one TLS record). Writes
// that do not end the stream (WriteHeaders without endStream, Write) are
// buffered until Flush, the end of the response, or another writer's
// flush; a handler about to wait (for window, for request body) flushes
// first. The write buffer comes from a pool while frames are pending and
// goes back once flushed, so an idle connection holds none. The read
// buffer (readbuf.go) likewise goes back to its pool whenever every byte
// read has been consumed; the read that waits for the client is made into
// a 64-byte array, so a connection waiting for its client holds no 16 KiB
// buffer either.
//
// The reading goroutine never writes to the socket: a client that sends
// but does not read must not stop it from reading. Its answers (SETTINGS
// and PING acknowledgements, RST_STREAM, WINDOW_UPDATE for data it
// discards, a 431) go to a bounded control queue that the next writer
// drains (ahead of its own frames), or that the flusher goroutine,
// started only when needed, writes.
//
// The connection's write deadline bounds a client that reads nothing. It
// is moved forward only when less than half of WriteTimeout is left, so a
// busy connection does not pay a timer update per write.
//
// # Flow control
//
// Flow control is in flow.go.
//
// Receiving: SETTINGS_INITIAL_WINDOW_SIZE (InitialWindowSize) per stream
// and a connection window (ConnWindowSize, opened by a WINDOW_UPDATE after
// the SETTINGS). DATA is buffered in the Stream (at most its window) and
// window is given back as the handler reads: a WINDOW_UPDATE once half a
// window is owed, for the stream and for the connection. Padding, data on
// closed streams and the unread body of a stream that ends are given back
// to the connection at once. DATA beyond a window is a FLOW_CONTROL_ERROR
// (stream or connection).
//
// Sending: Write takes, under the connection mutex, at most one frame's
// worth of the stream's and the connection's send windows (which
// SETTINGS_INITIAL_WINDOW_SIZE changes may make negative) and waits for
// WINDOW_UPDATE otherwise, at most WriteTimeout: a zero-window stall resets
// the stream (CANCEL) and Write returns ErrWriteTimeout. Window that was
// reserved but not sent is given back.
//
// # Defences
//
// Each defence, where it is enforced, and the test that shows it:
//
//	Defence                                        Enforced in                 Test
//	Malformed requests (RFC 9113 8): RST_STREAM     headers.go, frames.go       TestRequestRules (the table
//	  PROTOCOL_ERROR                                                             below), TestH2Spec (145/145)
//	Header list over MaxHeaderListSize: decoded    onField, endBlock           TestHeaderListTooLarge
//	  (HPACK in step), answered 431 on its stream
//	CONTINUATION flood: a block bounded in frames  feedBlock                   TestContinuationFlood
//	  (MaxHeaderBlockFrames) and compressed bytes
//	  (twice MaxHeaderListSize and a frame): GOAWAY
//	  ENHANCE_YOUR_CALM
//	Slow heads: HeaderTimeout from a block's       headClock (clock.go)        TestHeaderTimeout
//	  first byte
//	Rapid reset (CVE-2023-44487): streams reset by  processRST, endBlock,       TestRapidReset
//	  the client, refused or malformed take a token startStream (chargeReset)
//	  from a bucket (MaxResetBurst, refilled at
//	  MaxResetRate per second); empty: GOAWAY
//	  ENHANCE_YOUR_CALM
//	MadeYouReset (CVE-2025-8671): a stream the      clientStreamError           TestMadeYouReset (one case
//	  engine resets because of the client's frames  (defences.go)               per kind of invalid frame)
//	  takes a token from the same bucket; every                                 and dispatch's
//	  stream reset keeps its place among the                                    TestH2MadeYouReset
//	  MaxConcurrentStreams until its handler has
//	  returned (live, finishStream)
//	Invalid frames: every stream error the client's clientStreamError          TestInvalidFrameBudget
//	  frames cause, stream open or not, takes a
//	  token from a second bucket
//	  (MaxInvalidFrameBurst, MaxInvalidFrameRate);
//	  empty: GOAWAY ENHANCE_YOUR_CALM
//	More than MaxConcurrentStreams: REFUSED_STREAM startStream                 TestMaxConcurrentStreams
//	SETTINGS and PING floods: more than            queueCtrl (write.go)        TestSettingsFlood,
//	  MaxControlFrames answers queued for a client                               TestPingFlood
//	  that does not read them: GOAWAY
//	  ENHANCE_YOUR_CALM
//	Zero-window stall: WriteTimeout resets the      reserve                     TestZeroWindowStall
//	  stream (CANCEL)
//	A client that reads nothing: WriteTimeout       write.go (write deadline)   TestWriteTimeout
//	  closes the connection
//	Idle connections: IdleTimeout (GOAWAY          clock.go                    TestIdleTimeout
//	  NO_ERROR)
//	Dead peers: PingInterval and PingTimeout       clock.go                    TestPing
//
// Every error the engine answers itself is reported to Config.OnError
// (stream or connection, code, one-line reason) for logs and metrics.
//
// # Request rules
//
// The engine enforces every request rule of RFC 9113 section 8 and RFC
// 8441 (extended CONNECT), and every check x/net's HTTP/2 server made on
// requests (rows marked x/net; where it was stricter than the RFC, the
// engine is too). A malformed request never reaches the handler: it is
// answered RST_STREAM PROTOCOL_ERROR and charged to the reset and
// invalid-frame buckets, and the connection goes on. Each row is a case of
// TestRequestRules named after it (spaces as underscores); the last two
// have tests of their own. Where the engine answers otherwise than x/net
// did: a stream beyond the limit is refused (REFUSED_STREAM, which lets
// the client retry it) where x/net sent PROTOCOL_ERROR; a HEADERS frame
// after the trailers is a stream error (STREAM_CLOSED, RFC 9113 5.1) where
// x/net closed the connection; a host field equal to :authority but for
// ASCII case is accepted (RFC 9113 8.3.1 compares normalized values) where
// x/net compared bytes; whitespace around a value is refused (RFC 9113
// 8.2.1) where x/net accepted it. A CONNECT whose :authority has no port
// (RFC 9113 8.5 asks for host and port) is left to the handler, as x/net
// left it: dispatch answers every CONNECT 405, which says more than a
// reset. x/net refused a SETTINGS frame listing a setting twice; RFC
// 9113 6.5.3 has the values processed in order (h2spec 6.5.3/1), and so
// does the engine.
//
//	Rule (case of TestRequestRules)                              Answer                         Enforced in
//	8.1 trailers without END_STREAM                              RST_STREAM PROTOCOL_ERROR      processHeaders
//	8.1 HEADERS after the trailers                               RST_STREAM STREAM_CLOSED       processHeaders
//	8.1 trailers are served                                      served                         endTrailers
//	8.1.1 DATA beyond content-length                             RST_STREAM PROTOCOL_ERROR      processData
//	8.1.1 DATA short of content-length                           RST_STREAM PROTOCOL_ERROR      processData
//	8.1.1 trailers short of content-length                       RST_STREAM PROTOCOL_ERROR      endTrailers
//	8.1.1 content-length with END_STREAM on HEADERS              RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.1.1 invalid content-length                                 RST_STREAM PROTOCOL_ERROR      onField
//	8.1.1 differing content-length fields                        RST_STREAM PROTOCOL_ERROR      onField
//	8.1.1 content-length matching DATA is served                 served                         processData
//	8.2 uppercase field name                                     RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 invalid byte in field name                             RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 empty field name                                       RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 NUL in a value                                         RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 CR in a value                                          RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 LF in a value                                          RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 other control byte in a value (x/net)                  RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 DEL in a value (x/net)                                 RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 leading whitespace in a value                          RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 trailing whitespace in a value                         RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.1 HTAB and obs-text inside a value are served            served                         checkField
//	8.2.2 connection                                             RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.2 keep-alive                                             RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.2 proxy-connection                                       RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.2 transfer-encoding                                      RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.2 upgrade                                                RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.2 te other than trailers                                 RST_STREAM PROTOCOL_ERROR      checkField
//	8.2.2 te trailers is served                                  served                         checkField
//	8.3 unknown pseudo-header field                              RST_STREAM PROTOCOL_ERROR      pseudoField
//	8.3 response pseudo-header field in a request                RST_STREAM PROTOCOL_ERROR      pseudoField
//	8.3 duplicated pseudo-header field                           RST_STREAM PROTOCOL_ERROR      pseudoField
//	8.3 pseudo-header field after a regular field                RST_STREAM PROTOCOL_ERROR      onField
//	8.3 pseudo-header field in trailers                          RST_STREAM PROTOCOL_ERROR      onField
//	8.3 invalid byte in a pseudo-header value (x/net)            RST_STREAM PROTOCOL_ERROR      onField
//	8.3.1 missing :method                                        RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.3.1 empty :method                                          RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.3.1 missing :scheme                                        RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.3.1 :scheme other than http or https (x/net)               RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.3.1 missing :path                                          RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.3.1 empty :path                                            RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.3.1 :path neither absolute nor *                           RST_STREAM PROTOCOL_ERROR      checkPath
//	8.3.1 :path * on GET                                         RST_STREAM PROTOCOL_ERROR      checkPath
//	8.3.1 :path * on OPTIONS is served                           served                         checkPath
//	8.3.1 invalid percent-encoding in :path (x/net)              RST_STREAM PROTOCOL_ERROR      checkPath
//	8.3.1 host differing from :authority                         RST_STREAM PROTOCOL_ERROR      checkAuthority
//	8.3.1 host equal to :authority is served                     served                         checkAuthority
//	8.3.1 host without :authority is served                      served                         checkAuthority
//	8.3.1 more than one host field (x/net)                       RST_STREAM PROTOCOL_ERROR      checkAuthority
//	8.3.1 userinfo in :authority                                 RST_STREAM PROTOCOL_ERROR      checkAuthority
//	8.3.1 invalid byte in :authority (x/net)                     RST_STREAM PROTOCOL_ERROR      checkAuthority
//	8.3.1 invalid host field without :authority (x/net)          RST_STREAM PROTOCOL_ERROR      checkAuthority
//	8.4 PUSH_PROMISE from a client                               GOAWAY PROTOCOL_ERROR          processFrame
//	8.4 SETTINGS_ENABLE_PUSH other than 0 or 1                   GOAWAY PROTOCOL_ERROR          processSettings
//	8.5 CONNECT with :scheme                                     RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.5 CONNECT with :path                                       RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.5 CONNECT without :authority                               RST_STREAM PROTOCOL_ERROR      checkRequest
//	8.5 CONNECT host:port is served                              served                         checkRequest
//	8.5 CONNECT without a port is served                         served                         checkRequest
//	RFC 8441 :protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL  RST_STREAM PROTOCOL_ERROR      checkRequest
//	RFC 8441 :protocol on a method other than CONNECT            RST_STREAM PROTOCOL_ERROR      checkRequest
//	RFC 8441 extended CONNECT without :path                      RST_STREAM PROTOCOL_ERROR      checkRequest
//	RFC 8441 extended CONNECT is served                          served                         checkRequest
//	x/net HEADERS with an even stream id                         GOAWAY PROTOCOL_ERROR          processHeaders
//	x/net stream id not above the previous ones                  GOAWAY PROTOCOL_ERROR          processHeaders
//	x/net field not allowed in trailers                          RST_STREAM PROTOCOL_ERROR      onField
//	x/net if- field in trailers                                  RST_STREAM PROTOCOL_ERROR      onField
//	x/net PRIORITY on itself                                     RST_STREAM PROTOCOL_ERROR      processFrame
//	x/net HEADERS priority on itself                             RST_STREAM PROTOCOL_ERROR      checkRequest
//	x/net DATA on an idle stream                                 GOAWAY PROTOCOL_ERROR          processData
//	x/net DATA on a closed stream                                RST_STREAM STREAM_CLOSED       processData
//	x/net DATA beyond the stream window                          RST_STREAM FLOW_CONTROL_ERROR  processData
//	x/net WINDOW_UPDATE on an idle stream                        GOAWAY PROTOCOL_ERROR          processWindowUpdate
//	x/net WINDOW_UPDATE of 0 on a stream                         RST_STREAM PROTOCOL_ERROR      Framer, handleError
//	x/net WINDOW_UPDATE of 0 on the connection                   GOAWAY PROTOCOL_ERROR          Framer, handleError
//	x/net WINDOW_UPDATE overflowing a stream window              RST_STREAM FLOW_CONTROL_ERROR  processWindowUpdate
//	x/net WINDOW_UPDATE overflowing the connection window        GOAWAY FLOW_CONTROL_ERROR      processWindowUpdate
//	x/net RST_STREAM on an idle stream                           GOAWAY PROTOCOL_ERROR          processRST
//	x/net PING on a stream                                       GOAWAY PROTOCOL_ERROR          Framer, handleError
//	x/net first frame not SETTINGS                               GOAWAY PROTOCOL_ERROR          processFrame
//	x/net SETTINGS acknowledgement for no SETTINGS               GOAWAY PROTOCOL_ERROR          processSettings
//	x/net more than 100 settings                                 GOAWAY PROTOCOL_ERROR          processSettings
//	x/net more streams than MaxConcurrentStreams                 RST_STREAM REFUSED_STREAM      startStream (TestMaxConcurrentStreams)
//	x/net header list over MaxHeaderListSize                     431 on the stream              endBlock (TestHeaderListTooLarge)
//
// # Use in dispatch
//
// dispatch's ServeH2 serves each HTTP/2 connection with NewConn and
// Serve; its h2Conn is the Handler. The engine's settings come from the
// listener's (h2Config): WriteTimeout and ReadTimeout are its body timeout,
// HeaderTimeout its head timeout, IdleTimeout the instance's idle timeout,
// EnableConnectProtocol unless HTTP/2 WebSockets are off, and OnError
// feeds the denial counters and the "request denied" records (408 for a
// head timeout, 431 from the engine) or a debug log. Draining calls
// Shutdown (GOAWAY, the streams in flight finish); revocation closes the
// raw TCP connection under the TLS one, which ends Serve and resets every
// stream.
//
// Each stream's handler (h2Stream) reads the Stream instead of an
// http.Request:
//
//   - 421 when :authority (or the host field when it is absent) does not
//     name the connection's SNI, on that stream only; a revoked or
//     unusable route, CONNECT and TRACE (405), the instance's stream limit
//     (503) and the method and target checks are answered on the stream
//     likewise.
//   - The request goes to the app as HTTP/1.1: the fields are copied from
//     Stream.Header (cookie crumbs joined with "; "), and ContentLength
//     chooses Content-Length or chunked framing. The body is copied from
//     Read (io.EOF at END_STREAM); AfterReset closes the app connection
//     when the client resets the stream, and Err tells a stream that has
//     ended.
//   - The response: WriteHeaders with the app's fields (lowercased,
//     hop-by-hop ones dropped), 103 and an asked-for 100 relayed as 1xx,
//     Write for the body and Flush when the app's bytes pause, WriteLast
//     or End at its end. A failure after the headers returns without
//     ending the response, which resets the stream (INTERNAL_ERROR).
//   - Extended CONNECT WebSockets (RFC 8441): WriteHeaders(200) and Flush,
//     then the client's direction Reads the stream while the app's
//     Writes and Flushes (SetReadTimeout(0): an idle WebSocket is no
//     stalled body; CloseRead ends the client's direction).
//   - h2c (gRPC) routes: request trailers are in Stream.Trailer after
//     io.EOF; response trailers go out with WriteTrailers.
package h2engine
