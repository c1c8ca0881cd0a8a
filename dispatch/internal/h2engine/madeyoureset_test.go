package h2engine

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/internal/testutil"
)

// provokedReset is a way for a client to make the server reset a stream
// it opened (MadeYouReset): send opens stream id and sends what makes it
// invalid.
type provokedReset struct {
	name string
	send func(c *rawClient, id uint32) error
}

// invalidStreamFrames are the frames that make an open stream invalid,
// each after the HEADERS that opened it. The server's window is 1024
// bytes per stream (madeYouResetConfig).
var invalidStreamFrames = []provokedReset{
	{"WINDOW_UPDATE of 0", func(c *rawClient, id uint32) error {
		return c.open(id, false, func() error { return c.fr.WriteWindowUpdate(id, 0) })
	}},
	{"WINDOW_UPDATE overflowing the stream window", func(c *rawClient, id uint32) error {
		return c.open(id, false, func() error { return c.fr.WriteWindowUpdate(id, 1<<31-1) })
	}},
	{"DATA after END_STREAM", func(c *rawClient, id uint32) error {
		return c.open(id, true, func() error { return c.fr.WriteData(id, false, []byte("x")) })
	}},
	{"HEADERS after END_STREAM", func(c *rawClient, id uint32) error {
		return c.open(id, true, func() error { return c.trailers(id, true, "x-t", "1") })
	}},
	{"trailers without END_STREAM", func(c *rawClient, id uint32) error {
		return c.open(id, false, func() error { return c.trailers(id, false, "x-t", "1") })
	}},
	{"pseudo-header field in trailers", func(c *rawClient, id uint32) error {
		return c.open(id, false, func() error { return c.trailers(id, true, ":path", "/") })
	}},
	{"DATA beyond content-length", func(c *rawClient, id uint32) error {
		return c.open(id, false, func() error { return c.fr.WriteData(id, false, []byte("ab")) }, "content-length", "1")
	}},
	{"DATA short of content-length", func(c *rawClient, id uint32) error {
		return c.open(id, false, func() error { return c.fr.WriteData(id, true, []byte("ab")) }, "content-length", "5")
	}},
	{"DATA beyond the stream window", func(c *rawClient, id uint32) error {
		return c.open(id, false, func() error { return c.fr.WriteData(id, false, make([]byte, 2048)) })
	}},
	{"PRIORITY on itself", func(c *rawClient, id uint32) error {
		return c.open(id, false, func() error {
			return c.fr.WritePriority(id, http2.PriorityParam{StreamDep: id, Weight: 1})
		})
	}},
}

// open sends HEADERS opening stream id (a POST of /, with extra fields),
// then what then does.
func (c *rawClient) open(id uint32, endStream bool, then func() error, extra ...string) error {
	c.hbuf.Reset()
	fields := []string{":method", "POST", ":scheme", "http", ":authority", "localhost", ":path", "/"}
	fields = append(fields, extra...)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: endStream, EndHeaders: true}); err != nil {
		return err
	}
	return then()
}

// trailers sends a header block on stream id: the fields given.
func (c *rawClient) trailers(id uint32, endStream bool, fields ...string) error {
	c.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: endStream, EndHeaders: true})
}

// madeYouResetConfig: a small stream limit and reset bucket, an
// invalid-frame bucket that does not get in the way.
func madeYouResetConfig() Config {
	return Config{
		MaxConcurrentStreams: 4,
		InitialWindowSize:    1024,
		MaxResetBurst:        20,
		MaxResetRate:         1,
		MaxInvalidFrameBurst: 1 << 20,
		MaxInvalidFrameRate:  1 << 20,
	}
}

// handlerCount counts the handlers running and the most ever running
// at once.
type handlerCount struct {
	started, running, most atomic.Int64
}

func (h *handlerCount) enter() {
	h.started.Add(1)
	n := h.running.Add(1)
	for {
		m := h.most.Load()
		if n <= m || h.most.CompareAndSwap(m, n) {
			return
		}
	}
}

func (h *handlerCount) leave() { h.running.Add(-1) }

// TestMadeYouReset (CVE-2025-8671): a client provoking server-sent
// resets with each kind of invalid frame, from one connection. (1) One
// stream at a time, whose handler returns as soon as it sees the reset
// (as dispatch's closes the app connection): the resets are charged to
// the rapid-reset bucket, so the connection gets GOAWAY
// ENHANCE_YOUR_CALM once it is empty, after at most the bucket's burst
// and refill of requests have reached the handler. (2) Streams opened
// faster than handlers return, whose handlers hold on after the reset
// (an app exchange still running): no more than MaxConcurrentStreams
// handlers ever run at once, the rest are refused, and the connection
// ends at the bound as well.
func TestMadeYouReset(t *testing.T) {
	testutil.VerifyNone(t)
	cfg := madeYouResetConfig()
	for _, kind := range invalidStreamFrames {
		t.Run(strings.ReplaceAll(kind.name, " ", "_"), func(t *testing.T) {
			t.Run("one_at_a_time", func(t *testing.T) {
				var count handlerCount
				s := newTestServer(t, false, cfg, HandlerFunc(func(st *Stream) {
					count.enter()
					defer count.leave()
					<-st.Done()
				}))
				c := dialRaw(t, s)
				c.fr.AllowIllegalWrites = true
				start := time.Now()
				goAway := false
				for id := uint32(1); id < 2*500 && !goAway; id += 2 {
					// A write fails once the server has closed the
					// connection; its GOAWAY is still to be read.
					sendErr := kind.send(c, id)
					// The stream's reset, or the end of the connection.
					f := c.waitFor(10*time.Second, "RST_STREAM or GOAWAY", func(f http2.Frame) bool {
						switch f := f.(type) {
						case *http2.RSTStreamFrame:
							return f.StreamID == id && sendErr == nil
						case *http2.GoAwayFrame:
							return true
						}
						return false
					})
					if g, ok := f.(*http2.GoAwayFrame); ok {
						if g.ErrCode != http2.ErrCodeEnhanceYourCalm {
							t.Fatalf("GOAWAY %v (%q), want ENHANCE_YOUR_CALM", g.ErrCode, g.DebugData())
						}
						goAway = true
					}
				}
				if !goAway {
					t.Fatalf("no GOAWAY after 500 streams reset by the server (%d reached the handler)", count.started.Load())
				}
				bound := int64(cfg.MaxResetBurst) + int64(time.Since(start).Seconds()*cfg.MaxResetRate) + 1
				if n := count.started.Load(); n > bound {
					t.Fatalf("%d requests reached the handler, bound %d", n, bound)
				}
				if len(s.eventsWith("rapid reset")) != 1 {
					t.Fatalf("events %v", s.events)
				}
				c.waitClosed()
			})
			t.Run("many_at_once", func(t *testing.T) {
				var count handlerCount
				release := make(chan struct{})
				s := newTestServer(t, false, cfg, HandlerFunc(func(st *Stream) {
					count.enter()
					defer count.leave()
					<-st.Done()
					<-release
				}))
				defer close(release) // before the server's cleanup waits for handlers
				c := dialRaw(t, s)
				c.fr.AllowIllegalWrites = true
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					for id := uint32(1); id < 2*2000; id += 2 {
						if kind.send(c, id) != nil {
							return
						}
					}
				}()
				c.waitGoAway(http2.ErrCodeEnhanceYourCalm)
				c.waitClosed()
				wg.Wait()
				// The handlers started may still be on their way to
				// counting themselves; they stay until release.
				limit := int64(cfg.MaxConcurrentStreams)
				testutil.Eventually(t, 10*time.Second, "the limit's worth of handlers held", func() bool {
					return count.running.Load() >= limit
				})
				if n := count.most.Load(); n > limit {
					t.Fatalf("%d handlers ran at once, limit %d", n, limit)
				}
			})
		})
	}
}

// TestInvalidFrameBudget: invalid frames on streams that are not open
// (each answered by RST_STREAM, no stream to reset) empty the
// connection's invalid-frame bucket: GOAWAY ENHANCE_YOUR_CALM.
func TestInvalidFrameBudget(t *testing.T) {
	testutil.VerifyNone(t)
	for _, tt := range []provokedReset{
		{"WINDOW_UPDATE of 0 on a closed stream", func(c *rawClient, id uint32) error {
			return c.fr.WriteWindowUpdate(1, 0)
		}},
		{"DATA on a stream the client reset", func(c *rawClient, id uint32) error {
			return c.fr.WriteData(1, false, []byte("x"))
		}},
		{"PRIORITY on itself, idle stream", func(c *rawClient, id uint32) error {
			return c.fr.WritePriority(id, http2.PriorityParam{StreamDep: id, Weight: 1})
		}},
	} {
		t.Run(strings.ReplaceAll(tt.name, " ", "_"), func(t *testing.T) {
			cfg := Config{MaxInvalidFrameBurst: 20, MaxInvalidFrameRate: 1}
			s := newTestServer(t, false, cfg, HandlerFunc(blockHandler))
			c := dialRaw(t, s)
			c.fr.AllowIllegalWrites = true
			// Stream 1, reset by the client: closed.
			c.request(1, "/", false)
			if err := c.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := uint32(3); id < 2*2000; id += 2 {
					if tt.send(c, id) != nil {
						return
					}
				}
			}()
			c.waitGoAway(http2.ErrCodeEnhanceYourCalm)
			c.waitClosed()
			wg.Wait()
			if n := len(s.eventsWith("invalid frames")); n != 1 {
				t.Fatalf("events %v", s.events)
			}
			if n := len(s.eventsWith("")); n > cfg.MaxInvalidFrameBurst+10 {
				t.Fatalf("%d errors answered, bucket %d", n, cfg.MaxInvalidFrameBurst)
			}
		})
	}
}
