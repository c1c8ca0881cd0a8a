package h2engine

import (
	"errors"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// HeaderField is one header field: a request's (names lowercase, as HTTP/2
// carries them) or one given to WriteHeaders and WriteTrailers.
type HeaderField = hpack.HeaderField

// Handler serves the streams of a connection.
type Handler interface {
	// ServeStream handles one request stream. It runs on a goroutine of
	// its own and may block (upstream I/O). When it returns, a response
	// it did not end is reset (INTERNAL_ERROR), so that a client never
	// takes a truncated response for a complete one. The Stream must not
	// be used once ServeStream has returned.
	ServeStream(st *Stream)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(st *Stream)

// ServeStream calls f(st).
func (f HandlerFunc) ServeStream(st *Stream) { f(st) }

// Config holds a connection's settings and limits. Zero values take the
// defaults named on each field.
type Config struct {
	// MaxConcurrentStreams is SETTINGS_MAX_CONCURRENT_STREAMS (250). A
	// stream counts until it is closed and its handler has returned, so
	// that a client resetting streams cannot run more handlers than this;
	// a HEADERS frame beyond it is refused (RST_STREAM REFUSED_STREAM).
	MaxConcurrentStreams uint32
	// MaxHeaderListSize is SETTINGS_MAX_HEADER_LIST_SIZE, the decoded size
	// of a request's header list (names, values and 32 bytes per field;
	// 64 KiB). A larger request is answered 431 on its stream.
	MaxHeaderListSize uint32
	// MaxHeaderBlockFrames bounds the frames of one header block (HEADERS
	// and its CONTINUATION frames; 128): beyond it, or beyond twice
	// MaxHeaderListSize of compressed bytes, the connection is closed with
	// ENHANCE_YOUR_CALM (CONTINUATION flood).
	MaxHeaderBlockFrames int
	// InitialWindowSize is SETTINGS_INITIAL_WINDOW_SIZE, the request body
	// bytes a stream may have buffered and unread (256 KiB).
	InitialWindowSize uint32
	// ConnWindowSize is the connection's receive window, the request body
	// bytes all streams together may have buffered and unread (1 MiB).
	ConnWindowSize uint32
	// MaxFrameSize is SETTINGS_MAX_FRAME_SIZE, the largest frame payload
	// accepted (16 KiB, the protocol's initial value).
	MaxFrameSize uint32
	// EnableConnectProtocol advertises SETTINGS_ENABLE_CONNECT_PROTOCOL
	// (RFC 8441 extended CONNECT, WebSockets over HTTP/2). Without it a
	// request carrying :protocol is malformed.
	EnableConnectProtocol bool

	// IdleTimeout closes (GOAWAY NO_ERROR) a connection that has had no
	// stream for this long; 0: never.
	IdleTimeout time.Duration
	// PingInterval sends a PING when nothing was read for this long, and
	// PingTimeout closes the connection when nothing was read within it
	// after that PING; 0: no PINGs. PingTimeout defaults to 15 s.
	PingInterval, PingTimeout time.Duration
	// WriteTimeout bounds a peer that reads nothing: a write to the
	// connection blocked this long closes it, and a stream waiting this
	// long for flow-control window is reset (zero-window stall); 30 s.
	WriteTimeout time.Duration
	// ReadTimeout bounds one blocking Stream.Read (a request body that
	// stops arriving); 0: unbounded.
	ReadTimeout time.Duration
	// HeaderTimeout bounds request heads in time: a header block must be
	// complete within it of its first byte, and a new connection must
	// complete its first one within it; 0: unbounded.
	HeaderTimeout time.Duration

	// MaxResetBurst and MaxResetRate bound streams that end before their
	// handler could answer: resets from the client, and streams refused or
	// rejected as malformed. A token bucket of MaxResetBurst (500) tokens
	// refilled at MaxResetRate per second (100); when it is empty the
	// connection is closed with ENHANCE_YOUR_CALM (rapid reset,
	// CVE-2023-44487).
	// Streams the engine resets because of the client's frames count too
	// (MadeYouReset, CVE-2025-8671).
	MaxResetBurst int
	MaxResetRate  float64
	// MaxInvalidFrameBurst and MaxInvalidFrameRate bound the stream
	// errors the client's frames cause (invalid frames, malformed
	// requests and trailers: every RST_STREAM the engine sends because of
	// the client), whether or not a stream was open: a token bucket of
	// MaxInvalidFrameBurst (100) tokens refilled at MaxInvalidFrameRate
	// per second (10); when it is empty the connection is closed with
	// ENHANCE_YOUR_CALM.
	MaxInvalidFrameBurst int
	MaxInvalidFrameRate  float64
	// MaxControlFrames bounds the control frames (SETTINGS and PING
	// acknowledgements, RST_STREAM, WINDOW_UPDATE) queued for a peer that
	// does not read them (1024); beyond it the connection is closed with
	// ENHANCE_YOUR_CALM (SETTINGS and PING floods).
	MaxControlFrames int

	// OnError, when set, is told of every error the engine answers itself:
	// connection errors (GOAWAY, or a close for timeouts) and stream
	// errors (RST_STREAM, or a 431). It runs on the connection's
	// goroutines and must not block.
	OnError func(ErrorEvent)

	// OnPanic, when set, is told of a panic recovered on one of the
	// connection's goroutines (where: panicguard's entry point). It runs
	// in the recovering deferred call (the stack is still the panicking
	// one), after the connection (or, for a handler, the stream) was
	// closed. Unset: panicguard.Report on the default logger.
	OnPanic func(where string, r any)
	// Identity names the connection at panicguard.Point, the test hook
	// that injects panics (the SNI in dispatch).
	Identity string
}

// ErrorEvent describes an error the engine answered.
type ErrorEvent struct {
	// StreamID is the stream reset (0 for a connection error).
	StreamID uint32
	// Code is the HTTP/2 error code sent (NO_ERROR for a 431 or a close
	// without GOAWAY).
	Code http2.ErrCode
	// Status is 431 when a request was answered with it, else 0.
	Status int
	// Reason is a one-line reason.
	Reason string
}

// Defaults.
const (
	DefaultMaxConcurrentStreams = 250
	DefaultMaxHeaderListSize    = 64 << 10
	DefaultMaxHeaderBlockFrames = 128
	DefaultInitialWindowSize    = 256 << 10
	DefaultConnWindowSize       = 1 << 20
	DefaultPingTimeout          = 15 * time.Second
	DefaultWriteTimeout         = 30 * time.Second
	DefaultMaxResetBurst        = 500
	DefaultMaxResetRate         = 100
	DefaultMaxControlFrames     = 1024
	DefaultMaxInvalidFrameBurst = 100
	DefaultMaxInvalidFrameRate  = 10

	minFrameSize   = 1 << 14
	maxFrameSize   = 1<<24 - 1
	maxWindow      = 1<<31 - 1
	initialWindow  = 65535
	headerTableMax = 4096
)

func (c *Config) setDefaults() {
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.MaxHeaderListSize == 0 {
		c.MaxHeaderListSize = DefaultMaxHeaderListSize
	}
	if c.MaxHeaderBlockFrames <= 0 {
		c.MaxHeaderBlockFrames = DefaultMaxHeaderBlockFrames
	}
	if c.InitialWindowSize == 0 {
		c.InitialWindowSize = DefaultInitialWindowSize
	}
	c.InitialWindowSize = min(c.InitialWindowSize, maxWindow)
	if c.ConnWindowSize == 0 {
		c.ConnWindowSize = DefaultConnWindowSize
	}
	c.ConnWindowSize = min(max(c.ConnWindowSize, initialWindow), maxWindow)
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = minFrameSize
	}
	c.MaxFrameSize = min(max(c.MaxFrameSize, minFrameSize), maxFrameSize)
	if c.PingTimeout <= 0 {
		c.PingTimeout = DefaultPingTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.MaxResetBurst <= 0 {
		c.MaxResetBurst = DefaultMaxResetBurst
	}
	if c.MaxResetRate <= 0 {
		c.MaxResetRate = DefaultMaxResetRate
	}
	if c.MaxInvalidFrameBurst <= 0 {
		c.MaxInvalidFrameBurst = DefaultMaxInvalidFrameBurst
	}
	if c.MaxInvalidFrameRate <= 0 {
		c.MaxInvalidFrameRate = DefaultMaxInvalidFrameRate
	}
	if c.MaxControlFrames <= 0 {
		c.MaxControlFrames = DefaultMaxControlFrames
	}
}

// Errors returned by Stream methods.
var (
	// ErrStreamReset: the stream was reset (by the client, by Reset, or
	// by the engine); the error matching it tells the code.
	ErrStreamReset = errors.New("h2engine: stream reset")
	// ErrConnClosed: the connection has ended.
	ErrConnClosed = errors.New("h2engine: connection closed")
	// ErrWriteTimeout: the peer gave no flow-control window within
	// Config.WriteTimeout; the stream has been reset.
	ErrWriteTimeout = errors.New("h2engine: no flow-control window within the write timeout")
	// ErrReadTimeout: no request body arrived within Config.ReadTimeout.
	ErrReadTimeout = errors.New("h2engine: no request body within the read timeout")
	// ErrReadClosed: CloseRead was called.
	ErrReadClosed = errors.New("h2engine: request body reads closed")
	// ErrStreamClosed: the response was already ended.
	ErrStreamClosed = errors.New("h2engine: response already ended")
	// ErrHeadersWritten: WriteHeaders after the final headers.
	ErrHeadersWritten = errors.New("h2engine: response headers already written")
	// ErrNoHeaders: a body or trailers before the final headers.
	ErrNoHeaders = errors.New("h2engine: response headers not written")
)
