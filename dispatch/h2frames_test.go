package dispatch

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestH2LastDataEndsStream: a response body of known length ends with its
// last DATA frame (END_STREAM on it), not with an empty DATA frame of its
// own; a body of unknown length still ends with one.
func TestH2LastDataEndsStream(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	tc, fr := h2RawConn(t, e, h2WebHost)
	// Window for the whole 5 MiB body at once.
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1}); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteWindowUpdate(0, 1<<31-1-65535); err != nil {
		t.Fatal(err)
	}
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, tt := range []struct {
		id        uint32
		path      string
		size      int
		emptyLast bool // an empty DATA frame ends the stream
	}{
		{1, "/?x", len("web x"), false},
		{3, "/big", len(h2Big), false},
		{5, "/events", -1, true},
	} {
		hb.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", h2WebHost}, {":path", tt.path}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: tt.id, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if tt.path == "/events" {
			e.web.unblock() // its last event comes at once
		}
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		got := 0
		for done := false; !done; {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("%s: %v", tt.path, err)
			}
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				if f.StreamID == tt.id && f.StreamEnded() {
					t.Fatalf("%s: the HEADERS frame ended the stream", tt.path)
				}
			case *http2.DataFrame:
				if f.StreamID != tt.id {
					continue
				}
				got += len(f.Data())
				if !f.StreamEnded() {
					continue
				}
				done = true
				if empty := len(f.Data()) == 0; empty != tt.emptyLast {
					t.Errorf("%s: the frame with END_STREAM carries %d bytes; want an empty one: %v", tt.path, len(f.Data()), tt.emptyLast)
				}
			case *http2.RSTStreamFrame, *http2.GoAwayFrame:
				t.Fatalf("%s: %v", tt.path, f)
			}
		}
		if tt.size >= 0 && got != tt.size {
			t.Errorf("%s: %d body bytes, want %d", tt.path, got, tt.size)
		}
	}
}
