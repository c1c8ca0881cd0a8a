package dispatch

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/applistener/applistener/internal/testutil"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"

	"github.com/applistener/applistener/routes"
)

// wsFrame builds one WebSocket frame by hand. lenBytes forces the length
// encoding: 0 picks the minimal one, 2 the 16-bit form, 8 the 64-bit form.
func wsFrame(fin bool, opcode byte, payload []byte, mask bool, lenBytes int) []byte {
	b0 := opcode & 0x0f
	if fin {
		b0 |= 0x80
	}
	n := len(payload)
	if lenBytes == 0 {
		switch {
		case n < 126:
		case n <= 0xffff:
			lenBytes = 2
		default:
			lenBytes = 8
		}
	}
	f := []byte{b0, 0}
	switch lenBytes {
	case 2:
		f[1] = 126
		f = binary.BigEndian.AppendUint16(f, uint16(n))
	case 8:
		f[1] = 127
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	default:
		f[1] = byte(n)
	}
	p := append([]byte(nil), payload...)
	if mask {
		f[1] |= 0x80
		key := [4]byte{0x81, 0xfe, 0x7f, 0x00} // bytes that look like frame headers
		f = append(f, key[:]...)
		for i := range p {
			p[i] ^= key[i%4]
		}
	}
	return append(f, p...)
}

// wsStream concatenates frames and returns the offsets where each ends.
func wsStream(frames ...[]byte) (stream []byte, ends map[int]bool) {
	ends = map[int]bool{0: true}
	for _, f := range frames {
		stream = append(stream, f...)
		ends[len(stream)] = true
	}
	return stream, ends
}

func patterned(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(0x7e + i) // includes 0x7e/0x7f/0x80/0x81 and 126/127
	}
	return p
}

func testFrames() [][]byte {
	return [][]byte{
		wsFrame(true, 1, []byte("hello"), false, 0),
		wsFrame(true, 9, nil, false, 0),              // empty ping
		wsFrame(true, 10, nil, true, 0),              // empty masked pong
		wsFrame(true, 2, patterned(125), true, 0),    // 7-bit max
		wsFrame(true, 2, patterned(126), true, 0),    // 16-bit min
		wsFrame(true, 2, patterned(65535), false, 0), // 16-bit max
		wsFrame(true, 2, patterned(70000), true, 0),  // 64-bit
		wsFrame(true, 1, []byte("abc"), true, 2),     // non-minimal 16-bit
		wsFrame(true, 1, nil, false, 8),              // non-minimal 64-bit, empty
		wsFrame(false, 1, []byte("frag-"), true, 0),  // fragmented message
		wsFrame(false, 0, []byte("ment-"), true, 0),
		wsFrame(true, 9, []byte("ping in between"), true, 0),
		wsFrame(true, 0, []byte("ed"), true, 0),
		wsFrame(true, 2, patterned(300), false, 0),
		wsFrame(true, 8, []byte{0x03, 0xe8}, true, 0),
	}
}

func TestUnitFrameTrackerByteByByte(t *testing.T) {
	stream, ends := wsStream(testFrames()...)
	var tr frameTracker
	if !tr.atBoundary() {
		t.Fatal("new tracker is not at a boundary")
	}
	for i := range stream {
		tr.feed(stream[i : i+1])
		if got := tr.atBoundary(); got != ends[i+1] {
			t.Fatalf("after %d bytes: atBoundary = %v; want %v", i+1, got, ends[i+1])
		}
	}
}

func TestUnitFrameTrackerChunks(t *testing.T) {
	stream, ends := wsStream(testFrames()...)
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var tr frameTracker
		off := 0
		for off < len(stream) {
			n := 1 + rng.IntN(20)
			if rng.IntN(10) == 0 {
				n = 1 + rng.IntN(80000)
			}
			n = min(n, len(stream)-off)
			tr.feed(stream[off : off+n])
			off += n
			if got := tr.atBoundary(); got != ends[off] {
				t.Fatalf("seed %d: after %d bytes: atBoundary = %v; want %v", seed, off, got, ends[off])
			}
		}
	}
	// Each frame fed whole, and the whole stream in one call.
	var tr frameTracker
	for _, f := range testFrames() {
		tr.feed(f)
		if !tr.atBoundary() {
			t.Fatalf("not at a boundary after a whole frame %x…", f[:2])
		}
	}
	tr.feed(stream)
	if !tr.atBoundary() {
		t.Fatal("not at a boundary after the whole stream")
	}
	tr.feed(nil)
	if !tr.atBoundary() {
		t.Fatal("feeding nothing left the boundary")
	}
}

func TestUnitFrameTrackerHeaderOnly(t *testing.T) {
	tests := []struct {
		name string
		hdr  []byte
		left uint64
	}{
		{"7-bit unmasked", []byte{0x82, 5}, 5},
		{"7-bit masked", []byte{0x82, 0x85, 1, 2, 3, 4}, 5},
		{"16-bit", []byte{0x82, 126, 0x01, 0x00}, 256},
		{"16-bit masked", []byte{0x82, 0xfe, 0xff, 0xff, 1, 2, 3, 4}, 65535},
		{"64-bit", []byte{0x82, 127, 0, 0, 0, 1, 0, 0, 0, 0}, 1 << 32},
		{"64-bit masked huge", []byte{0x82, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4}, 1<<63 - 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var tr frameTracker
			for i := range tc.hdr {
				if i > 0 && tr.atBoundary() {
					t.Fatalf("at a boundary inside the header after %d bytes", i)
				}
				tr.feed(tc.hdr[i : i+1])
			}
			if tr.atBoundary() || tr.payload != tc.left {
				t.Fatalf("after the header: boundary=%v payload=%d; want false %d", tr.atBoundary(), tr.payload, tc.left)
			}
			chunk := make([]byte, 1<<20)
			tr.feed(chunk)
			if tc.left > 1<<20 && (tr.atBoundary() || tr.payload != tc.left-1<<20) {
				t.Fatalf("after 1 MiB: boundary=%v payload=%d", tr.atBoundary(), tr.payload)
			}
		})
	}
}

// parseCloseFrame decodes a close frame by hand per RFC 6455 §5.
func parseCloseFrame(t *testing.T, f []byte, wantMasked bool) (code uint16, reason string) {
	t.Helper()
	if len(f) < 2 {
		t.Fatalf("close frame too short: %x", f)
	}
	if f[0] != 0x88 {
		t.Fatalf("first byte %#x; want FIN + opcode 8, no RSV bits", f[0])
	}
	masked := f[1]&0x80 != 0
	if masked != wantMasked {
		t.Fatalf("masked = %v; want %v", masked, wantMasked)
	}
	n := int(f[1] & 0x7f)
	if n > 125 {
		t.Fatalf("control frame payload length %d > 125", n)
	}
	rest := f[2:]
	var key []byte
	if masked {
		key, rest = rest[:4], rest[4:]
	}
	if len(rest) != n {
		t.Fatalf("payload is %d bytes; header says %d", len(rest), n)
	}
	p := append([]byte(nil), rest...)
	for i := range p {
		if masked {
			p[i] ^= key[i%4]
		}
	}
	if n < 2 {
		t.Fatalf("close payload without a status code: %x", p)
	}
	return binary.BigEndian.Uint16(p), string(p[2:])
}

func TestUnitCloseFrame(t *testing.T) {
	long := strings.Repeat("r", 200)
	tests := []struct {
		code   uint16
		reason string
		want   string
	}{
		{1008, "route revoked: withdrawn", "route revoked: withdrawn"},
		{1001, "going away", "going away"},
		{1000, "", ""},
		{1008, long, long[:123]},
		{1008, long[:123], long[:123]},
	}
	for _, tc := range tests {
		for _, masked := range []bool{false, true} {
			f := closeFrame(tc.code, tc.reason, masked)
			code, reason := parseCloseFrame(t, f, masked)
			if code != tc.code || reason != tc.want {
				t.Errorf("closeFrame(%d, %q, %v) decodes to %d %q", tc.code, short(tc.reason), masked, code, short(reason))
			}
			// The tracker sees exactly one frame.
			var tr frameTracker
			tr.feed(f[:len(f)-1])
			if tr.atBoundary() && len(f) > 2 {
				t.Error("tracker at a boundary before the close frame ended")
			}
			tr.feed(f[len(f)-1:])
			if !tr.atBoundary() {
				t.Error("tracker not at a boundary after the close frame")
			}
		}
	}
	// Masking keys vary (RFC 6455 §5.3: unpredictable).
	a, b := closeFrame(1008, "x", true), closeFrame(1008, "x", true)
	c := closeFrame(1008, "x", true)
	if bytes.Equal(a[2:6], b[2:6]) && bytes.Equal(b[2:6], c[2:6]) {
		t.Error("three masked close frames share one masking key")
	}
}

// TestUnitCloseFrameUTF8: RFC 6455 §5.5.1 requires the close reason to be
// UTF-8; gorilla/websocket and browsers fail the connection otherwise.
// Truncating a long reason to 123 bytes must not split a rune.
func TestUnitCloseFrameUTF8(t *testing.T) {
	reason := "route revoked:  " + strings.Repeat("é", 100) // 16 ASCII bytes, then 2-byte runes
	for _, masked := range []bool{false, true} {
		_, got := parseCloseFrame(t, closeFrame(1008, reason, masked), masked)
		if !utf8.ValidString(got) {
			t.Errorf("closeFrame truncated the reason into invalid UTF-8: %q", got[len(got)-4:])
		}
	}
}

// TestUnitCloseFrameGorillaServer: a masked close frame (client → app
// direction) is accepted by a gorilla/websocket server.
func TestUnitCloseFrameGorillaServer(t *testing.T) {
	defer goleak.VerifyNone(t)
	got := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := websocket.Upgrader{}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			got <- err
			return
		}
		defer func() { _ = c.Close() }()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _, err = c.ReadMessage()
		got <- err
	}))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	key := "dGhlIHNhbXBsZSBub25jZQ=="
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: "+key+"\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	if _, err := conn.Write(closeFrame(1008, "route revoked: withdrawn", true)); err != nil {
		t.Fatal(err)
	}
	err = <-got
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != 1008 || ce.Text != "route revoked: withdrawn" {
		t.Fatalf("gorilla server read %v; want close 1008 \"route revoked: withdrawn\"", err)
	}
}

// TestUnitCloseFrameGorillaClient: an unmasked close frame (app → client
// direction) is accepted by a gorilla/websocket client.
func TestUnitCloseFrameGorillaClient(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	srvDone := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvDone <- err
			return
		}
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			srvDone <- err
			return
		}
		h := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		_, err = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Accept: "+base64.StdEncoding.EncodeToString(h[:])+"\r\n\r\n")
		if err == nil {
			_, err = c.Write(closeFrame(1001, "going away", false))
		}
		// Wait for the client's close reply or its hang-up.
		_, _ = io.Copy(io.Discard, c)
		srvDone <- err
	}()
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	c, resp, err := d.Dial("ws://"+ln.Addr().String()+"/", nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	_ = resp.Body.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err = c.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != 1001 || ce.Text != "going away" {
		t.Errorf("gorilla client read %v; want close 1001 \"going away\"", err)
	}
	_ = c.Close()
	if err := <-srvDone; err != nil {
		t.Fatal(err)
	}
}

func TestUnitWSDirectionCloseAtBoundary(t *testing.T) {
	dst := newRecConn()
	d := &wsDirection{dst: dst}
	frame := wsFrame(true, 1, []byte("hello"), false, 0)
	if fin, err := d.write(frame); fin || err != nil {
		t.Fatalf("write = %v, %v", fin, err)
	}
	cf := closeFrame(1008, "route revoked: withdrawn", false)
	if !d.requestClose(cf) {
		t.Fatal("requestClose at an idle boundary did not send at once")
	}
	if want := append(append([]byte(nil), frame...), cf...); !bytes.Equal(dst.written(), want) {
		t.Fatalf("dst got %x; want %x", dst.written(), want)
	}
	// Nothing more is written after the close frame.
	if fin, err := d.write([]byte("more")); !fin || err != nil {
		t.Errorf("write after close = %v, %v; want finished", fin, err)
	}
	if !bytes.HasSuffix(dst.written(), cf) {
		t.Error("bytes written after the close frame")
	}
	if !d.requestClose(cf) {
		t.Error("a second requestClose on a finished direction did not report done")
	}
}

func TestUnitWSDirectionCloseWaitsForBoundary(t *testing.T) {
	dst := newRecConn()
	d := &wsDirection{dst: dst, masked: true}
	frame := wsFrame(true, 2, patterned(1000), true, 0)
	if fin, _ := d.write(frame[:10]); fin {
		t.Fatal("finished mid-frame")
	}
	cf := closeFrame(1008, "route revoked: expired", true)
	if d.requestClose(cf) {
		t.Fatal("requestClose sent a close frame in the middle of a frame")
	}
	if !bytes.Equal(dst.written(), frame[:10]) {
		t.Fatal("requestClose wrote mid-frame")
	}
	// More of the frame: still no close.
	if fin, _ := d.write(frame[10:500]); fin {
		t.Fatal("finished mid-frame")
	}
	// The frame ends together with the start of the next one: the
	// boundary is not at the end of this write, so the close waits.
	next := wsFrame(true, 1, []byte("next"), true, 0)
	if fin, _ := d.write(append(append([]byte(nil), frame[500:]...), next[:3]...)); fin {
		t.Fatal("close sent while the next frame had started")
	}
	fin, err := d.write(next[3:])
	if !fin || err != nil {
		t.Fatalf("write reaching a boundary = %v, %v; want finished", fin, err)
	}
	want := append(append(append([]byte(nil), frame...), next...), cf...)
	if !bytes.Equal(dst.written(), want) {
		t.Fatal("the close frame did not follow the last complete frame exactly")
	}
	_, _ = parseCloseFrame(t, dst.written()[len(want)-len(cf):], true)
}

func TestUnitWSDirectionWriteError(t *testing.T) {
	dst := newRecConn()
	boom := errors.New("broken pipe")
	dst.setWriteErr(boom)
	d := &wsDirection{dst: dst}
	fin, err := d.write([]byte{0x81, 0})
	if !fin || !errors.Is(err, boom) {
		t.Fatalf("write = %v, %v; want finished with the error", fin, err)
	}
	if !d.requestClose(closeFrame(1001, "going away", false)) {
		t.Error("requestClose on a failed direction did not report done")
	}
}

func TestUnitWSSpliceRevokeIdle(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct {
		cause  error
		code   uint16
		reason string
	}{
		{routes.ErrWithdrawn, 1008, "route revoked: withdrawn"},
		{routes.ErrExpired, 1008, "route revoked: expired"},
		{routes.ErrShutdown, 1001, "going away"},
	} {
		client, raw, app := newRecConn(), newRecConn(), newRecConn()
		sp := newWSSplice(client, raw, app, time.Hour)
		sp.revoke(tc.cause)
		if !raw.isClosed() || !app.isClosed() {
			t.Fatalf("%v: idle splice not closed at once", tc.cause)
		}
		code, reason := parseCloseFrame(t, client.written(), false)
		if code != tc.code || reason != tc.reason {
			t.Errorf("%v: client got %d %q", tc.cause, code, reason)
		}
		code, reason = parseCloseFrame(t, app.written(), true)
		if code != tc.code || reason != tc.reason {
			t.Errorf("%v: app got %d %q", tc.cause, code, reason)
		}
	}
}

func TestUnitWSSpliceRevokeMidFrameGrace(t *testing.T) {
	defer goleak.VerifyNone(t)
	client, raw, app := newRecConn(), newRecConn(), newRecConn()
	sp := newWSSplice(client, raw, app, 20*time.Millisecond)
	// The app is in the middle of a frame towards the client.
	if fin, _ := sp.toClient.write(wsFrame(true, 2, patterned(100), false, 0)[:50]); fin {
		t.Fatal("finished")
	}
	start := time.Now()
	sp.revoke(routes.ErrWithdrawn)
	if raw.isClosed() || app.isClosed() {
		t.Fatal("closed at once although the client side was mid-frame")
	}
	// The app side was idle: it got its close frame already.
	if code, _ := parseCloseFrame(t, app.written(), true); code != 1008 {
		t.Errorf("app close code %d", code)
	}
	testutil.Eventually(t, 2*time.Second, "grace close", func() bool { return raw.isClosed() && app.isClosed() })
	if el := time.Since(start); el < 15*time.Millisecond {
		t.Errorf("closed after %v, before the grace period", el)
	}
	if len(client.written()) != 50 {
		t.Errorf("client got %d bytes; want only the 50 forwarded (no close frame mid-frame)", len(client.written()))
	}
}

func TestUnitWSSplicePump(t *testing.T) {
	client, app := newRecConn(), newRecConn()
	sp := newWSSplice(client, client, app, time.Hour)
	pending := wsFrame(true, 1, []byte("early"), true, 0)
	rest := wsFrame(true, 2, patterned(5000), true, 0)
	pool := &sync.Pool{New: func() any { b := make([]byte, 64); return &b }}
	p := &wsPump{w: sp, src: pumpSource{r: eofReader(rest)}, d: &sp.toApp, pending: pending, pool: pool}
	err := p.copy()
	if n := p.total; err != nil || n != int64(len(pending)+len(rest)) {
		t.Fatalf("pump = %d, %v", n, err)
	}
	if !bytes.Equal(app.written(), append(append([]byte(nil), pending...), rest...)) {
		t.Error("pump did not forward pending bytes then the stream, in order")
	}
	if !sp.toApp.tracker.atBoundary() {
		t.Error("tracker not at a boundary after whole frames")
	}
}

func eofReader(p []byte) io.Reader { return &errAfterReader{data: p, err: io.EOF} }
