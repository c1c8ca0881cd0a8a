package dispatch

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/dispatch/internal/h2engine"
	"github.com/applistener/applistener/internal/testutil"
)

// TestH2MadeYouReset (CVE-2025-8671) through the listener: from one
// connection, requests that the client then makes invalid (a
// WINDOW_UPDATE of 0 on the stream, which the listener answers by
// resetting it) reach the app only until a bucket of the connection (the
// reset bucket, or the invalid-frame bucket, which the default settings
// make the smaller) is empty: then GOAWAY ENHANCE_YOUR_CALM closes the
// connection. Each stream waits for its reset, so none is refused
// (refusals take tokens too): the resets the listener sends are what
// empty the bucket. Every instance slot is released afterwards.
func TestH2MadeYouReset(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 2, Config{})
	tc, fr := h2RawConn(t, e, h2WebHost)
	fr.AllowIllegalWrites = true
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", h2WebHost}, {":path", "/events"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := append([]byte(nil), hb.Bytes()...)
	start := time.Now()
	var goAway *http2.GoAwayFrame
	streams := 0
	for id := uint32(1); id < 2*2000 && goAway == nil; id += 2 {
		// A write fails once the listener has closed the connection; its
		// GOAWAY is still to be read.
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true})
		if err == nil {
			err = fr.WriteWindowUpdate(id, 0)
		}
		if err == nil {
			streams++
		}
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			f, rerr := fr.ReadFrame()
			if rerr != nil {
				t.Fatalf("stream %d: waiting for its reset: %v", id, rerr)
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				goAway = g
				break
			}
			if r, ok := f.(*http2.RSTStreamFrame); ok && r.StreamID == id && err == nil {
				if r.ErrCode != http2.ErrCodeProtocol {
					t.Fatalf("stream %d reset with %v, want PROTOCOL_ERROR", id, r.ErrCode)
				}
				break
			}
		}
	}
	if goAway == nil {
		t.Fatalf("no GOAWAY after %d streams reset by the listener (%d requests reached the app)", streams, e.web.hits.Load())
	}
	if goAway.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %v (%q), want ENHANCE_YOUR_CALM", goAway.ErrCode, goAway.DebugData())
	}
	// Each reset takes a token from both of the connection's buckets (the
	// rapid-reset one and the invalid-frame one); the smaller empties
	// first.
	bound := int64(min(h2engine.DefaultMaxResetBurst, h2engine.DefaultMaxInvalidFrameBurst)) +
		int64(time.Since(start).Seconds()*max(h2engine.DefaultMaxResetRate, h2engine.DefaultMaxInvalidFrameRate)) + 1
	if n := int64(streams); n > bound {
		t.Fatalf("%d streams before GOAWAY, bound %d", n, bound)
	}
	if n := e.web.hits.Load(); n > int64(streams) {
		t.Fatalf("%d requests reached the app from %d streams", n, streams)
	}
	t.Logf("%d streams reset, %d requests reached the app, then GOAWAY (%s)", streams, e.web.hits.Load(), goAway.DebugData())
	inst := e.table.Lookup(h2WebHost).Instance
	testutil.Eventually(t, 10*time.Second, "every instance slot released", func() bool { return inst.Active() == 0 })
}
