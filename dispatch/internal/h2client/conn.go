// Package h2client is an HTTP/2 client connection with prior knowledge
// (h2c) over an already dialled net.Conn: the listener's side of the
// connections to apps whose services declare "protocol": "h2c" (gRPC
// servers).
//
// Streams are multiplexed up to the peer's SETTINGS_MAX_CONCURRENT_STREAMS
// (Reserve takes a slot without waiting, WaitReserve waits for one), flow
// control holds both directions to their windows (the receive windows are
// given back only as the response bodies are read, so a slow consumer
// holds the peer back instead of making the connection buffer), request
// and response trailers are carried, a cancelled stream is reset, GOAWAY
// fails the streams the peer did not process (ErrNotProcessed) and admits
// no new ones, a silent peer is found by PING, and a connection idle for
// Config.IdleTimeout closes itself.
//
// The write path has no writer goroutine: every goroutine that sends
// frames encodes them into the connection's buffer under its lock, and the
// one that finds no write in progress becomes the writer and writes the
// buffer out, again and again until it is empty (group commit). The frames
// other streams queue meanwhile go out together in its next write, and a
// request whose body is already at hand has its HEADERS and DATA in one
// write. While other streams are open, a request head or a piece of body
// is not written by its sender but by the control loop, after it has let
// the goroutines that are ready run (kickSoonLocked): the requests and
// messages that one read of a client's connection made ready reach the
// app in one write, as the client sent them, where writing each at once
// costs a system call per message (and the app a read per message).
package h2client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Config holds a connection's limits; the zero value of a duration turns
// its mechanism off.
type Config struct {
	// StreamWindow and ConnWindow are the receive windows: what the peer
	// may send on a stream, and on the connection in all, ahead of what
	// the response bodies' readers have taken.
	StreamWindow int32
	ConnWindow   int32
	// MaxResponseHeaderBytes bounds a response head (and trailers), as
	// HPACK counts them (RFC 9113 SETTINGS_MAX_HEADER_LIST_SIZE).
	MaxResponseHeaderBytes uint32
	// ReadIdleTimeout: after this long without a frame from the peer, a
	// PING is sent; PingTimeout later, without a frame, the connection
	// closes.
	ReadIdleTimeout time.Duration
	PingTimeout     time.Duration
	// WriteTimeout: a write that makes no progress for this long closes
	// the connection.
	WriteTimeout time.Duration
	// IdleTimeout: a connection without streams for this long closes.
	IdleTimeout time.Duration
	// StateHook, if set, is called (without the connection's locks held)
	// when the connection stops taking new streams: GOAWAY, or closed.
	StateHook func(*Conn)
	// OnPanic, if set, is called with the value of a panic recovered in
	// the connection's read loop, from the deferred function that
	// recovered it (the panicking stack is still the current one). The
	// connection then closes, failing its streams; the process goes on.
	OnPanic func(r any)
}

// Defaults used when a Config field is zero.
const (
	defaultStreamWindow = 256 << 10
	defaultConnWindow   = 1 << 20
	defaultMaxHeader    = 64 << 10
	// initialWindow is RFC 9113's initial window of every flow.
	initialWindow = 65535
	// maxBuffered bounds the frames queued behind a write in progress
	// before DATA senders wait for it.
	maxBuffered = 64 << 10
	// maxStreamsUnlimited is the stream limit when the peer sets none.
	maxStreamsUnlimited = 1000
	// max1xx bounds the interim responses before the final one.
	max1xx = 8
	// maxReadQueued bounds the frames the read loop queues (answers to
	// PING and SETTINGS, resets, window updates) that no writer has taken
	// yet: a peer that asks for more while it reads nothing is flooding.
	maxReadQueued = 256 << 10
)

// Errors a caller may test for with errors.Is.
var (
	// ErrNotProcessed: the peer did not process the stream (GOAWAY with
	// a lower last stream id, or REFUSED_STREAM); sending it again, on
	// another connection, is safe.
	ErrNotProcessed = errors.New("h2client: stream not processed by the peer")
	// ErrConnClosed: the connection is closed (or closing).
	ErrConnClosed = errors.New("h2client: connection closed")
	// ErrGoAway: the peer sent GOAWAY; the connection takes no new streams.
	ErrGoAway = errors.New("h2client: the peer is going away")
	// ErrPingTimeout: the peer answered nothing, a PING included.
	ErrPingTimeout = errors.New("h2client: the peer stopped answering (PING timeout)")
	// ErrIdle: the connection closed after Config.IdleTimeout without streams.
	ErrIdle = errors.New("h2client: idle connection closed")
	// ErrPanicked: a panic was recovered in the connection's read loop,
	// which closed the connection (Config.OnPanic saw the panic).
	ErrPanicked = errors.New("h2client: panic recovered in the connection's read loop")
	// ErrNoSlot: RoundTrip without a reserved stream slot.
	ErrNoSlot = errors.New("h2client: no stream slot reserved")
)

// ProtocolError is a violation of HTTP/2 by the peer; the connection (or,
// with a non-zero StreamID, only that stream) ends with Code.
type ProtocolError struct {
	StreamID uint32
	Code     http2.ErrCode
	Reason   string
}

func (e *ProtocolError) Error() string {
	if e.StreamID != 0 {
		return fmt.Sprintf("h2client: the peer broke HTTP/2 on stream %d (%v): %s", e.StreamID, e.Code, e.Reason)
	}
	return fmt.Sprintf("h2client: the peer broke HTTP/2 (%v): %s", e.Code, e.Reason)
}

// StreamResetError: the peer reset the stream with Code.
type StreamResetError struct {
	Code http2.ErrCode
}

func (e *StreamResetError) Error() string {
	return fmt.Sprintf("h2client: stream reset by the peer (%v)", e.Code)
}

// Is makes a REFUSED_STREAM match ErrNotProcessed.
func (e *StreamResetError) Is(target error) bool {
	return target == ErrNotProcessed && e.Code == http2.ErrCodeRefusedStream
}

// Conn is one HTTP/2 client connection.
type Conn struct {
	nc  net.Conn
	cfg Config
	rfr *http2.Framer // the read loop's only

	framesRead atomic.Uint64 // liveness, for the PING check
	peer       string        // nc's remote address: the connection's identity for panicguard.Point
	writes     atomic.Uint64 // conn writes made, for tests and benchmarks

	readDone chan struct{}
	ctrlWake chan struct{}
	ctrlDone chan struct{}

	mu      sync.Mutex
	cond    *sync.Cond // windows, buffer room, stream and connection state
	out     []byte     // frames queued for the next write
	spare   []byte
	writing bool // a goroutine is writing out (the group's writer)
	// writeSoon: the control loop is to write out what is queued once the
	// goroutines ready to run have run (kickSoonLocked).
	writeSoon bool
	// readQueued counts the bytes the read loop queued in out since a
	// writer last took it.
	readQueued int
	wfr        *http2.Framer
	hbuf       bytes.Buffer
	henc       *hpack.Encoder

	streams  map[uint32]*stream
	nextID   uint32
	reserved int
	// slotWake is closed (and replaced) when a stream slot frees while
	// slotWaiters wait.
	slotWake    chan struct{}
	slotWaiters int

	peerMaxStreams uint32
	peerInitWindow int64
	peerMaxFrame   uint32
	sendWindow     int64 // the connection's send window
	recvAvail      int64 // the connection's receive window left
	recvUnacked    int64 // the connection's receive window taken and not yet given back

	goAway   bool
	err      error // why the connection ended (or goes away); nil while usable
	closed   bool
	hookDone bool

	pingOut   bool
	pingSeen  uint64 // framesRead when the health check last looked
	idleSince time.Time
	health    *time.Timer
	idle      *time.Timer
}

// NewConn starts HTTP/2 on nc: the client preface and SETTINGS go out,
// and the peer's SETTINGS are awaited (until ctx ends) before it returns.
// The connection owns nc from then on, even on error (closed).
func NewConn(ctx context.Context, nc net.Conn, cfg Config) (*Conn, error) {
	if cfg.StreamWindow <= 0 {
		cfg.StreamWindow = defaultStreamWindow
	}
	if cfg.ConnWindow <= 0 {
		cfg.ConnWindow = defaultConnWindow
	}
	if cfg.MaxResponseHeaderBytes == 0 {
		cfg.MaxResponseHeaderBytes = defaultMaxHeader
	}
	c := &Conn{
		nc:             nc,
		peer:           nc.RemoteAddr().String(),
		cfg:            cfg,
		readDone:       make(chan struct{}),
		ctrlWake:       make(chan struct{}, 1),
		ctrlDone:       make(chan struct{}),
		streams:        make(map[uint32]*stream),
		nextID:         1,
		peerMaxStreams: maxStreamsUnlimited,
		peerInitWindow: initialWindow,
		peerMaxFrame:   16384,
		sendWindow:     initialWindow,
		recvAvail:      int64(max(cfg.ConnWindow, initialWindow)),
		slotWake:       make(chan struct{}),
		idleSince:      time.Now(),
	}
	c.cond = sync.NewCond(&c.mu)
	c.wfr = http2.NewFramer((*outWriter)(c), nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	br := bufio.NewReaderSize(nc, 16<<10)
	c.rfr = http2.NewFramer(nil, br)
	c.rfr.SetMaxReadFrameSize(16384)
	c.rfr.MaxHeaderListSize = cfg.MaxResponseHeaderBytes
	c.rfr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.rfr.SetReuseFrames()

	c.out = append(c.out, http2.ClientPreface...)
	_ = c.wfr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(cfg.StreamWindow)},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: cfg.MaxResponseHeaderBytes},
	)
	if cfg.ConnWindow > initialWindow {
		_ = c.wfr.WriteWindowUpdate(0, uint32(cfg.ConnWindow-initialWindow))
	}
	if err := c.writeConn(c.out); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("h2client: writing the preface: %w", err)
	}
	c.out = c.out[:0]
	if err := c.awaitSettings(ctx); err != nil {
		_ = nc.Close()
		return nil, err
	}
	_ = c.wfr.WriteSettingsAck()
	if err := c.writeConn(c.out); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("h2client: acknowledging the peer's SETTINGS: %w", err)
	}
	c.out = c.out[:0]
	// The timers are armed before the read loop starts: a peer's
	// GOAWAY or hang-up may close the connection (closeLocked stops
	// them) at once. They are assigned under mu, which their functions
	// take before they touch them: a timer that fires before its
	// assignment (a timeout near zero) waits for it.
	c.mu.Lock()
	if cfg.ReadIdleTimeout > 0 {
		c.health = time.AfterFunc(cfg.ReadIdleTimeout, c.healthCheck)
	}
	if cfg.IdleTimeout > 0 {
		c.idle = time.AfterFunc(cfg.IdleTimeout, c.idleCheck)
	}
	c.mu.Unlock()
	go c.readLoop()
	go c.ctrlLoop()
	return c, nil
}

// awaitSettings reads the peer's first frame, which must be SETTINGS.
func (c *Conn) awaitSettings(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	f, err := c.rfr.ReadFrame()
	if !stop() {
		return fmt.Errorf("h2client: waiting for the peer's SETTINGS: %w", context.Cause(ctx))
	}
	if err != nil {
		return fmt.Errorf("h2client: waiting for the peer's SETTINGS: %w", err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return &ProtocolError{Code: http2.ErrCodeProtocol, Reason: fmt.Sprintf("the peer's preface is %v, not SETTINGS", f.Header().Type)}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.applySettingsLocked(sf); err != nil {
		return err
	}
	return nil
}

// outWriter appends the framer's frames to the connection's buffer (mu held).
type outWriter Conn

func (w *outWriter) Write(p []byte) (int, error) {
	w.out = append(w.out, p...)
	return len(p), nil
}

// writeConn writes p whole, bounded by Config.WriteTimeout.
func (c *Conn) writeConn(p []byte) error {
	if c.cfg.WriteTimeout > 0 {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
	}
	c.writes.Add(1)
	_, err := c.nc.Write(p)
	return err
}

// kickLocked writes the queued frames out unless a write is in progress,
// whose writer takes them along (mu held; released during writes).
func (c *Conn) kickLocked() {
	if c.writing {
		return
	}
	c.writing = true
	c.writeSoon = false
	for len(c.out) > 0 && !c.closed {
		buf := c.out
		c.out = c.spare[:0]
		c.readQueued = 0
		c.mu.Unlock()
		err := c.writeConn(buf)
		c.mu.Lock()
		c.spare = buf[:0]
		if err != nil {
			c.failLocked(fmt.Errorf("h2client: writing to the peer: %w", err))
		}
		c.cond.Broadcast()
	}
	c.writing = false
}

// kickSoonLocked has the queued frames written soon (mu held): at once
// when they are the only stream's (or when maxBuffered are queued), else
// by the control loop once the goroutines that are ready to run have run
// (runtime.Gosched). The other streams whose frames are ready add theirs
// meanwhile, and one write carries them all: a batch of messages that a
// client sent in one write, and that one read woke a goroutine each for,
// reaches the app as one write too, not one per message. A write in
// progress takes them along.
func (c *Conn) kickSoonLocked() {
	switch {
	case c.writing || c.writeSoon:
	case len(c.streams) <= 1 || len(c.out) >= maxBuffered:
		c.kickLocked()
	default:
		c.writeSoon = true
		c.kickCtrl()
	}
}

// kickCtrl has the control loop write what the read loop queued: the
// read loop never writes itself (a peer that does not read while it
// writes would otherwise stop it).
func (c *Conn) kickCtrl() {
	select {
	case c.ctrlWake <- struct{}{}:
	default:
	}
}

func (c *Conn) ctrlLoop() {
	defer close(c.ctrlDone)
	for {
		select {
		case <-c.ctrlWake:
		case <-c.readDone:
			return
		}
		c.mu.Lock()
		soon := c.writeSoon
		c.mu.Unlock()
		if soon {
			runtime.Gosched()
		}
		c.mu.Lock()
		c.kickLocked()
		c.mu.Unlock()
	}
}

// Reserve takes a stream slot for a RoundTrip if one is free now.
func (c *Conn) Reserve() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reserveLocked()
}

func (c *Conn) reserveLocked() bool {
	if c.err != nil || uint32(len(c.streams)+c.reserved) >= c.peerMaxStreams {
		return false
	}
	c.reserved++
	return true
}

// WaitReserve waits for a stream slot; it fails when ctx ends or the
// connection takes no new streams.
func (c *Conn) WaitReserve(ctx context.Context) error {
	c.mu.Lock()
	for {
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return err
		}
		if c.reserveLocked() {
			c.mu.Unlock()
			return nil
		}
		wake := c.slotWake
		c.slotWaiters++
		c.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			c.mu.Lock()
			c.slotWaiters--
			c.mu.Unlock()
			return ctx.Err()
		}
		c.mu.Lock()
		c.slotWaiters--
	}
}

// Unreserve gives back a slot that Reserve took and no RoundTrip used.
func (c *Conn) Unreserve() {
	c.mu.Lock()
	c.reserved--
	c.slotFreedLocked()
	c.mu.Unlock()
}

// slotFreedLocked wakes the slot waiters and, when nothing is left, starts
// the idle clock or ends a connection that is going away.
func (c *Conn) slotFreedLocked() {
	if c.slotWaiters > 0 {
		close(c.slotWake)
		c.slotWake = make(chan struct{})
	}
	if len(c.streams) == 0 && c.reserved == 0 {
		c.idleSince = time.Now()
		if c.goAway && !c.closed {
			c.closeLocked(c.err)
		}
	}
}

// InFlight returns the streams open or reserved.
func (c *Conn) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.streams) + c.reserved
}

// Err returns why the connection takes no new streams (nil while it does).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Writes returns how many writes the connection has made to its net.Conn.
func (c *Conn) Writes() uint64 { return c.writes.Load() }

// Close closes the connection: every stream fails with ErrConnClosed.
// It returns once the connection's goroutines have ended.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.closeLocked(ErrConnClosed)
	c.mu.Unlock()
	<-c.readDone
	<-c.ctrlDone
	return nil
}

// failLocked ends the connection on an error (mu held).
func (c *Conn) failLocked(err error) {
	c.closeLocked(err)
}

// closeLocked ends every stream with err and closes nc (mu held).
func (c *Conn) closeLocked(err error) {
	if c.closed {
		return
	}
	c.closed = true
	if c.err == nil || errors.Is(c.err, ErrGoAway) && err != nil && !errors.Is(err, ErrGoAway) {
		c.err = err
	}
	for _, s := range c.streams {
		s.abortLocked(err, false)
	}
	close(c.slotWake)
	c.slotWake = make(chan struct{})
	if c.health != nil {
		c.health.Stop()
	}
	if c.idle != nil {
		c.idle.Stop()
	}
	c.cond.Broadcast()
	_ = c.nc.Close()
}

// runHook calls the state hook once the connection takes no new streams.
func (c *Conn) runHook() {
	c.mu.Lock()
	run := c.err != nil && !c.hookDone
	if run {
		c.hookDone = true
	}
	c.mu.Unlock()
	if run && c.cfg.StateHook != nil {
		c.cfg.StateHook(c)
	}
}

// healthCheck sends a PING after ReadIdleTimeout without frames, and
// closes the connection when PingTimeout passes without one.
func (c *Conn) healthCheck() {
	n := c.framesRead.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	switch {
	case n != c.pingSeen:
		c.pingSeen, c.pingOut = n, false
		c.health.Reset(c.cfg.ReadIdleTimeout)
	case c.pingOut:
		c.failLocked(ErrPingTimeout)
	default:
		c.pingOut = true
		_ = c.wfr.WritePing(false, [8]byte{'h', '2', 'c', 'l', 'i', 'e', 'n', 't'})
		c.kickCtrl()
		d := c.cfg.PingTimeout
		if d <= 0 {
			d = c.cfg.ReadIdleTimeout
		}
		c.health.Reset(d)
	}
}

// idleCheck closes the connection once it has had no stream for IdleTimeout.
func (c *Conn) idleCheck() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if len(c.streams) == 0 && c.reserved == 0 {
		if left := c.cfg.IdleTimeout - time.Since(c.idleSince); left > 0 {
			c.idle.Reset(left)
			return
		}
		// The reason is set before the GOAWAY goes out: the write
		// unlocks c.mu, and the peer may hang up meanwhile, whose EOF
		// would otherwise become the connection's error.
		c.err = ErrIdle
		_ = c.wfr.WriteGoAway(0, http2.ErrCodeNo, nil)
		c.kickLocked()
		c.closeLocked(ErrIdle)
		return
	}
	c.idle.Reset(c.cfg.IdleTimeout)
}
