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

// TestH2RequestIDNeverIndexed: the X-Request-Id of a response, unique to
// it, is sent as a field never indexed, so that it neither enters nor
// churns the connection's HPACK table; the other fields still are.
func TestH2RequestIDNeverIndexed(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	tc, fr := h2RawConn(t, e, h2WebHost)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	seen := map[string]bool{}
	for _, id := range []uint32{1, 3, 5} {
		hb.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", h2WebHost}, {":path", "/?x"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		var head *http2.MetaHeadersFrame
		for head == nil {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamID == id {
				head = h
			}
		}
		var got *hpack.HeaderField
		for i, f := range head.Fields {
			if f.Name == "x-request-id" {
				got = &head.Fields[i]
			} else if f.Sensitive {
				t.Errorf("stream %d: %s sent never-indexed", id, f.Name)
			}
		}
		switch {
		case got == nil:
			t.Fatalf("stream %d: no x-request-id in %v", id, head.Fields)
		case !got.Sensitive:
			t.Errorf("stream %d: x-request-id %q may be indexed; want never indexed", id, got.Value)
		case seen[got.Value]:
			t.Errorf("stream %d: x-request-id %q repeated", id, got.Value)
		}
		seen[got.Value] = true
	}
}
