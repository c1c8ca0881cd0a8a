package h2engine

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/testutil"
)

// TestHeadersPaddedWithPriority: a request whose HEADERS frame carries
// padding and a priority is served (the engine parses HEADERS payloads
// itself).
func TestHeadersPaddedWithPriority(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{}, HandlerFunc(testHandler))
	c := dialRaw(t, s)
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: 1, BlockFragment: c.block("/"), EndStream: true, EndHeaders: true,
		PadLength: 9, Priority: http2.PriorityParam{StreamDep: 0, Weight: 200, Exclusive: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := c.waitFor(10*time.Second, "the response", func(f http2.Frame) bool {
		return f.Header().StreamID == 1 && f.Header().Type == http2.FrameHeaders
	}).(*http2.MetaHeadersFrame)
	if st := f.PseudoValue("status"); st != "200" {
		t.Fatalf(":status %q", st)
	}
	c.waitEnd(1)
	// Padding longer than the payload: a connection error.
	if err := c.fr.WriteRawFrame(http2.FrameHeaders, http2.FlagHeadersPadded|http2.FlagHeadersEndHeaders, 3, []byte{5, 0x82}); err != nil {
		t.Fatal(err)
	}
	c.waitGoAway(http2.ErrCodeProtocol)
}

// TestHeadersLargerThanReadBuffer: with a MaxFrameSize above the 16 KiB
// read buffer, a HEADERS frame larger than the buffer is read into one of
// its own and parsed as the others (with padding and a priority): the
// request is served with every field, and the next one, from the read
// buffer again, too.
func TestHeadersLargerThanReadBuffer(t *testing.T) {
	testutil.VerifyNone(t)
	s := newTestServer(t, false, Config{MaxFrameSize: 1 << 16}, HandlerFunc(func(st *Stream) {
		n := 0
		for _, f := range st.Header {
			if f.Name == "x-big" {
				n = len(f.Value)
			}
		}
		_ = st.WriteHeaders(200, []HeaderField{{Name: "x-big-length", Value: strconv.Itoa(n)}}, true)
	}))
	c := dialRaw(t, s)
	big := strings.Repeat("b", 40<<10)
	for _, tt := range []struct {
		id   uint32
		want int
	}{{1, len(big)}, {3, 0}} {
		var block []byte
		if tt.want > 0 {
			block = c.block("/", "x-big", big)
		} else {
			block = c.block("/")
		}
		if tt.want > 0 && len(block) <= readBufferSize {
			t.Fatalf("a block of %d bytes fits the read buffer", len(block))
		}
		err := c.fr.WriteHeaders(http2.HeadersFrameParam{
			StreamID: tt.id, BlockFragment: block, EndStream: true, EndHeaders: true,
			PadLength: 7, Priority: http2.PriorityParam{StreamDep: 0, Weight: 20},
		})
		if err != nil {
			t.Fatal(err)
		}
		f := c.waitFor(10*time.Second, "the response", func(f http2.Frame) bool {
			return f.Header().StreamID == tt.id && f.Header().Type == http2.FrameHeaders
		}).(*http2.MetaHeadersFrame)
		if st, n := f.PseudoValue("status"), f.Fields[len(f.Fields)-1]; st != "200" || n.Value != strconv.Itoa(tt.want) {
			t.Fatalf("stream %d: :status %q, %v, want x-big of %d bytes", tt.id, st, n, tt.want)
		}
	}
}
