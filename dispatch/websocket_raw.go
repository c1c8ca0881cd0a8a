package dispatch

import (
	"syscall"

	"github.com/applistener/applistener/dispatch/internal/sock"
)

// rawSource returns the socket of a direction whose source is a plain
// socket (the app's side), for copyRaw; nil otherwise, and outside Unix,
// where every direction reads with its reader.
func (p *wsPump) rawSource() syscall.RawConn {
	if !sock.ReadLoopAvailable || p.src.raw == nil || p.src.r != p.src.raw {
		return nil
	}
	return sock.Raw(p.src.raw)
}

// copyRaw forwards what arrives on rc (through buf) the way an event loop
// does (sock.ReadLoop): it returns when the destination finished or failed
// (stop, with the write's error), or with the read's error: io.EOF, a
// deadline, a closed connection.
func (p *wsPump) copyRaw(rc syscall.RawConn, buf []byte) (stop bool, werr, rerr error) {
	return sock.ReadLoop(rc, buf, p.forward)
}
