package h2engine

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// FuzzServeConn feeds arbitrary frames (after the client preface) to a
// connection served with the test handler: the engine must neither
// panic nor hang, and Serve must return once the client hangs up.
func FuzzServeConn(f *testing.F) {
	f.Add(seedFrames(func(fr *http2.Framer, block []byte) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndStream: true, EndHeaders: true})
	}))
	f.Add(seedFrames(func(fr *http2.Framer, block []byte) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:3]})
		_ = fr.WriteContinuation(1, true, block[3:])
		_ = fr.WriteData(1, false, []byte("body"))
		_ = fr.WriteWindowUpdate(0, 1000)
		_ = fr.WritePing(false, [8]byte{1})
		_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
	}))
	f.Fuzz(func(t *testing.T, frames []byte) {
		cli, srv := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = ServeConn(srv, Config{WriteTimeout: time.Second, HeaderTimeout: time.Second}, HandlerFunc(testHandler))
		}()
		go func() { _, _ = io.Copy(io.Discard, cli) }()
		_ = cli.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = cli.Write([]byte(clientPreface))
		_, _ = cli.Write(frames)
		_ = cli.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return after the client hung up")
		}
	})
}

// seedFrames returns a SETTINGS frame and what write adds, given a
// request's header block.
func seedFrames(write func(fr *http2.Framer, block []byte)) []byte {
	var buf, hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "localhost"}, {":path", "/echo"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	fr := http2.NewFramer(&buf, nil)
	_ = fr.WriteSettings()
	write(fr, hbuf.Bytes())
	return buf.Bytes()
}
