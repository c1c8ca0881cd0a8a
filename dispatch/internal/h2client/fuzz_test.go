package h2client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// FuzzPeerAnswer answers a request with arbitrary bytes after the peer's
// SETTINGS (a hostile app): the client must neither panic nor hang: the
// request fails or its body ends (cleanly or not) within the deadline,
// and the connection's goroutines end when it is closed.
func FuzzPeerAnswer(f *testing.F) {
	frames := func(w func(fr *http2.Framer)) []byte {
		var b bytes.Buffer
		fr := http2.NewFramer(&b, nil)
		fr.AllowIllegalWrites = true
		w(fr)
		return b.Bytes()
	}
	f.Add(frames(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200", "content-length", "5"), EndHeaders: true})
		_ = fr.WriteData(1, false, []byte("hel"))
		_ = fr.WriteData(1, true, []byte("lo"))
	}))
	f.Add(frames(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200"), EndHeaders: true})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("grpc-status", "0"), EndHeaders: true, EndStream: true})
	}))
	f.Add(frames(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "100"), EndHeaders: true})
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "204"), EndHeaders: false})
		_ = fr.WriteContinuation(1, true, nil)
	}))
	f.Add(frames(func(fr *http2.Framer) {
		_ = fr.WriteGoAway(0, http2.ErrCodeEnhanceYourCalm, []byte("calm"))
	}))
	f.Add(frames(func(fr *http2.Framer) {
		_ = fr.WriteRSTStream(1, http2.ErrCodeRefusedStream)
		_ = fr.WritePing(false, [8]byte{})
		_ = fr.WriteWindowUpdate(1, 1)
	}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, script []byte) {
		// net.Pipe, not loopback TCP: thousands of executions a second
		// would leave the machine's ephemeral ports in TIME_WAIT.
		cc, wait := pipePeer(func(fr *http2.Framer, c net.Conn) {
			if readUntilHeaders(fr) == nil {
				return
			}
			if _, err := c.Write(script); err != nil {
				return
			}
			// Then the peer hangs up.
		})
		defer wait()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := NewConn(cctx, cc, Config{StreamWindow: 65535, MaxResponseHeaderBytes: 8 << 10})
		ccancel()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := do(t, c, ctx, &Request{Method: "POST", Body: newBufferedBody([]byte("ping"))})
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the exchange did not end: %v", err)
		}
		_ = c.Close()
	})
}
