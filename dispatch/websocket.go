package dispatch

import (
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/applistener/applistener/dispatch/internal/sock"
	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/routes"
)

// frameTracker follows WebSocket frame boundaries in a byte stream by
// reading only the 2–14 byte frame headers; payload bytes are skipped.
type frameTracker struct {
	hdr     [14]byte
	hdrLen  int    // header bytes collected so far
	need    int    // header bytes needed (2 until the second byte is known)
	payload uint64 // payload bytes left in the current frame
}

// atBoundary reports whether the stream is between two frames.
func (t *frameTracker) atBoundary() bool { return t.hdrLen == 0 && t.payload == 0 }

// feed advances the tracker over p.
func (t *frameTracker) feed(p []byte) {
	for len(p) > 0 {
		if t.payload > 0 {
			if uint64(len(p)) <= t.payload {
				t.payload -= uint64(len(p))
				return
			}
			p = p[t.payload:]
			t.payload = 0
			continue
		}
		if t.hdrLen == 0 {
			t.need = 2
		}
		for t.hdrLen < t.need && len(p) > 0 {
			t.hdr[t.hdrLen] = p[0]
			t.hdrLen++
			p = p[1:]
			if t.hdrLen == 2 {
				need := 2
				switch t.hdr[1] & 0x7f {
				case 126:
					need += 2
				case 127:
					need += 8
				}
				if t.hdr[1]&0x80 != 0 {
					need += 4
				}
				t.need = need
			}
		}
		if t.hdrLen < t.need {
			return
		}
		var n uint64
		switch l := t.hdr[1] & 0x7f; l {
		case 126:
			n = uint64(binary.BigEndian.Uint16(t.hdr[2:4]))
		case 127:
			n = binary.BigEndian.Uint64(t.hdr[2:10])
		default:
			n = uint64(l)
		}
		t.payload = n
		t.hdrLen = 0
	}
}

// closeFrame builds a close frame with code and reason; masked frames are
// for the client-to-app direction.
func closeFrame(code uint16, reason string, masked bool) []byte {
	if len(reason) > 123 {
		// Cut at a character boundary: the reason must stay valid UTF-8.
		cut := 123
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut]
	}
	payload := make([]byte, 2+len(reason))
	binary.BigEndian.PutUint16(payload, code)
	copy(payload[2:], reason)
	f := []byte{0x88, byte(len(payload))}
	if masked {
		f[1] |= 0x80
		var key [4]byte
		binary.LittleEndian.PutUint32(key[:], rand.Uint32())
		f = append(f, key[:]...)
		for i := range payload {
			payload[i] ^= key[i%4]
		}
	}
	return append(f, payload...)
}

// wsDirection copies one direction of an upgraded connection and can end
// it with a close frame at a frame boundary. The copier holds writeMu while
// it writes; revocation never waits for it (a stalled peer cannot stall a
// revocation): it sends the close frame itself only when the stream is at a
// boundary and no write is in progress, and otherwise leaves it pending for
// the copier, with the splice's grace timer as the backstop.
type wsDirection struct {
	dst     net.Conn
	masked  bool // frames written to dst must be masked (towards the app)
	writeMu sync.Mutex
	mu      sync.Mutex // guards tracker, closing, done
	tracker frameTracker
	closing []byte // close frame to send at the next boundary
	done    bool   // a close frame was sent or the copy ended
}

// write forwards p and, when a close is pending and p ends at a frame
// boundary, sends it. It reports whether the direction is finished.
func (d *wsDirection) write(p []byte) (bool, error) {
	d.writeMu.Lock()
	defer d.writeMu.Unlock()
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done {
		return true, nil
	}
	_, err := d.dst.Write(p)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.done = true
		return true, err
	}
	d.tracker.feed(p)
	if d.closing != nil && d.tracker.atBoundary() {
		d.sendCloseLocked()
		return true, nil
	}
	return false, nil
}

// sendCloseLocked writes the pending close frame; the caller holds mu and writeMu.
func (d *wsDirection) sendCloseLocked() {
	_ = d.dst.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	_, _ = d.dst.Write(d.closing)
	d.done = true
}

// requestClose asks for a close frame; it is sent at once when the stream
// is at a boundary and idle. It reports whether the close frame was sent
// (or the direction had already finished).
func (d *wsDirection) requestClose(frame []byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return true
	}
	d.closing = frame
	if d.tracker.atBoundary() && d.writeMu.TryLock() {
		d.sendCloseLocked()
		d.writeMu.Unlock()
		return true
	}
	return false
}

// wsSplice is an upgraded WebSocket between a client and an app.
type wsSplice struct {
	client    net.Conn // what frames are written to (TLS)
	clientRaw net.Conn // what is closed: closing TLS could wait on a stalled peer
	app       net.Conn
	toApp     wsDirection
	toClient  wsDirection
	grace     time.Duration
	activity  atomic.Int64 // unix nanos of the last read in either direction
	// act is the instance's tracker of this WebSocket's frames (usage's
	// last_websocket_frame and websockets_silent); nil when not tracked.
	// A read of either direction counts as a frame: bytes moved are part
	// of one, and the splice does not parse frames on the way.
	act       *routes.WebSocketActivity
	closed    atomic.Bool
	closeOnce sync.Once
	timerMu   sync.Mutex
	timer     *time.Timer // the grace backstop after a revocation
	idleTimer *time.Timer
	// limit is the instance whose byte rate the frames are under (nil:
	// none); pause is where they wait it out (ratelimit.go), ended by
	// revoke and closeBoth.
	limit *routes.Instance
	pause throttlePause

	pumps   [2]*wsPump   // client to app, app to client
	parkMu  sync.Mutex   // orders parking against closeBoth
	running atomic.Int32 // directions not yet ended
	onDone  func()       // runs once both directions have ended

	// For a panic's log line: the server's logger and the connection.
	log *slog.Logger
	who *connInfo
	// fair admits chunks when contended (fair.go), as flow's; nil: off.
	fair *fairshare.Scheduler
	flow *fairshare.Flow
}

func newWSSplice(client, clientRaw, app net.Conn, grace time.Duration) *wsSplice {
	w := &wsSplice{}
	w.init(client, clientRaw, app, grace)
	return w
}

// init sets up a zero wsSplice (one embedded in a larger struct).
func (w *wsSplice) init(client, clientRaw, app net.Conn, grace time.Duration) {
	w.client, w.clientRaw, w.app = client, clientRaw, app
	w.toApp.dst, w.toApp.masked = app, true
	w.toClient.dst = client
	w.grace = grace
}

func (w *wsSplice) closeBoth() {
	w.pause.cancel()
	w.closeOnce.Do(func() {
		// A parked direction leaves the poller before its socket is
		// closed, and resumes to see the close and end.
		var resume []*wsPump
		w.parkMu.Lock()
		w.closed.Store(true)
		for _, p := range w.pumps {
			if p != nil && p.parked != 0 {
				if p.poller.cancel(p.parked) {
					resume = append(resume, p)
				}
				p.parked = 0
			}
		}
		w.parkMu.Unlock()
		_ = w.clientRaw.Close()
		_ = w.app.Close()
		for _, p := range resume {
			go p.run()
		}
		w.timerMu.Lock()
		if w.timer != nil {
			w.timer.Stop()
		}
		if w.idleTimer != nil {
			w.idleTimer.Stop()
		}
		w.timerMu.Unlock()
	})
}

// revoke ends the WebSocket: 1008 (policy) for a revoked route, 1001 on
// shutdown, sent to each side at its next frame boundary; whatever has not
// reached a boundary within the grace period is closed anyway.
func (w *wsSplice) revoke(cause error) {
	code, reason := uint16(1008), "route revoked: "+routes.CauseLabel(cause)
	switch {
	case errors.Is(cause, routes.ErrShutdown):
		code, reason = 1001, "going away"
	case errors.Is(cause, routes.ErrSleeping):
		code, reason = 1001, "going away: sandbox sleeping"
	case errors.Is(cause, errIdle):
		code, reason = 1001, "idle timeout"
	}
	w.pause.cancel() // a throttled direction goes on to its close frame
	a := w.toClient.requestClose(closeFrame(code, reason, false))
	b := w.toApp.requestClose(closeFrame(code, reason, true))
	if a && b {
		w.closeBoth()
		return
	}
	w.timerMu.Lock()
	if w.timer == nil {
		w.timer = time.AfterFunc(w.grace, w.closeBoth)
	}
	w.timerMu.Unlock()
}

// errIdle is the revocation cause of a WebSocket idle past its instance's
// idle timeout.
var errIdle = errors.New("idle timeout")

// startIdleTimer ends the WebSocket after d without a read in either
// direction (a close frame 1001 at the next boundary, as on shutdown).
func (w *wsSplice) startIdleTimer(d time.Duration) {
	w.activity.Store(time.Now().UnixNano())
	var check func()
	check = func() {
		idle := time.Since(time.Unix(0, w.activity.Load()))
		if idle >= d {
			w.revoke(errIdle)
			return
		}
		w.timerMu.Lock()
		if !w.closed.Load() {
			w.idleTimer = time.AfterFunc(d-idle, check)
		}
		w.timerMu.Unlock()
	}
	w.timerMu.Lock()
	w.idleTimer = time.AfterFunc(d, check)
	w.timerMu.Unlock()
}

// pumpSource is one direction's input: the reader, and, for parking while
// idle, the connection whose read deadline bounds a read (conn) and the
// socket whose readiness is awaited (raw). Without conn and raw the
// direction never parks.
type pumpSource struct {
	r    io.Reader
	conn net.Conn
	raw  net.Conn
}

// errParked ends a pump's goroutine whose direction was handed to the idle
// poller: the copy resumes in a new goroutine when bytes arrive.
var errParked = errors.New("parked")

// wsPump copies one direction of a WebSocket. It holds a pooled buffer
// only while bytes flow: a read that waits longer than parkAfter gives the
// buffer back and parks the direction in the idle poller, which ends the
// goroutine; an idle WebSocket thus holds neither buffers nor goroutines.
// Without a poller (or a file descriptor) it waits in place, still without
// a buffer.
type wsPump struct {
	w       *wsSplice
	src     pumpSource
	d       *wsDirection
	pending []byte // bytes that arrived with the heads, forwarded first
	pool    *sync.Pool
	poller  *idlePoller
	total   int64     // bytes forwarded; read once both directions ended
	parked  uint64    // the poller registration while parked; under w.parkMu
	parkAt  time.Time // the read deadline set by armPark; zero: none
}

// run copies until the direction ends or parks; the last direction to end
// finishes the splice.
func (p *wsPump) run() {
	ended := false // this direction was counted out of p.w.running
	defer func() {
		if r := recover(); r != nil {
			p.w.closeBoth() // this WebSocket only
			if !ended && p.w.running.Add(-1) == 0 && p.w.onDone != nil {
				p.w.onDone()
			}
			var who []any
			if ci := p.w.who; ci != nil {
				who = []any{"sni", ci.sni, "peer", ci.peer.String(), "route", routeName(ci.route)}
			}
			panicguard.Report(p.w.log, panicguard.WebSocket, r, who...)
		}
	}()
	if ci := p.w.who; ci != nil {
		panicguard.Point(panicguard.WebSocket, ci.sni)
	}
	p.w.parkMu.Lock()
	p.parked = 0
	p.w.parkMu.Unlock()
	if err := p.copy(); err == errParked {
		return
	}
	p.w.closeBoth()
	ended = true
	if p.w.running.Add(-1) == 0 && p.w.onDone != nil {
		p.w.onDone()
	}
}

// copy forwards src to d until src ends, d finishes, or the direction
// parks (errParked).
func (p *wsPump) copy() error {
	if len(p.pending) > 0 {
		pending := p.pending
		p.pending = nil
		p.w.act.Frame(time.Now())
		finished, err := p.d.write(pending)
		p.total += int64(len(pending))
		if finished || err != nil {
			return err
		}
	}
	var bp *[]byte
	defer func() {
		if bp != nil {
			p.pool.Put(bp)
		}
	}()
	src := p.src
	park := src.conn != nil && src.raw != nil
	p.parkAt = time.Time{}
	raw := p.rawSource() // the app's side: read as an event loop would (copyRaw)
	for {
		if bp == nil {
			bp = p.pool.Get().(*[]byte)
		}
		if park && p.parkAt.IsZero() {
			p.armPark(time.Now())
		}
		var err error
		if raw != nil {
			var stop bool
			var werr error
			if stop, werr, err = p.copyRaw(raw, *bp); stop {
				return werr
			}
		} else {
			var n int
			n, err = src.r.Read(*bp)
			if n > 0 {
				finished, werr := p.forward((*bp)[:n])
				if finished || werr != nil {
					return werr
				}
			}
			if err == nil {
				continue
			}
		}
		if park && isDeadline(err) {
			// Idle: give the buffer back and wait for the next bytes
			// without one, and if possible without this goroutine.
			p.pool.Put(bp)
			bp = nil
			_ = src.conn.SetReadDeadline(time.Time{})
			p.parkAt = time.Time{}
			if p.park() {
				return errParked
			}
			if err := sock.WaitReadable(src.raw); err != nil {
				return err
			}
			continue
		}
		if err == io.EOF {
			err = nil
		}
		return err
	}
}

// forward writes bytes read from the source to the destination, notes the
// activity and moves the parking deadline on (armPark).
func (p *wsPump) forward(b []byte) (bool, error) {
	now := time.Now()
	p.w.activity.Store(now.UnixNano())
	p.w.act.Frame(now)
	if !p.parkAt.IsZero() && p.parkAt.Sub(now) < parkAfter/2 {
		p.armPark(now)
	}
	p.throttle(len(b), now) // ratelimit.go; before the fair slot: a pause holds none
	t := p.w.admitChunk()
	finished, err := p.d.write(b)
	p.w.fair.Release(t)
	p.total += int64(len(b))
	return finished, err
}

// armPark sets the read deadline after which the direction parks. It is
// moved on only once half of it has passed (forward), not at every read:
// a direction parks after between parkAfter/2 and parkAfter of silence,
// and a busy one resets no timer per message.
func (p *wsPump) armPark(now time.Time) {
	p.parkAt = now.Add(parkAfter)
	_ = p.src.conn.SetReadDeadline(p.parkAt)
}

// park registers the direction with the idle poller; false means the
// caller waits in place (no poller, no descriptor, or the splice is
// closing and the next read fails at once).
func (p *wsPump) park() bool {
	if p.poller == nil {
		return false
	}
	fd, ok := sock.FD(p.src.raw)
	if !ok {
		return false
	}
	w := p.w
	w.parkMu.Lock()
	defer w.parkMu.Unlock()
	if w.closed.Load() {
		return false
	}
	id, err := p.poller.wait(fd, p.run)
	if err != nil {
		return false
	}
	p.parked = id
	return true
}
