package dispatch

import (
	"net"

	"github.com/applistener/applistener/dispatch/internal/sock"
)

// appSource is what an app connection's input buffer reads from: the
// connection itself, except that when one response needs a second read the
// listener first acknowledges what it has read so far (TCP_QUICKACK, Linux).
//
// An app connection reused within the delayed-ACK timeout (about 40 ms)
// is in Linux's "pingpong" mode: the listener's ACK of a response segment
// waits to ride on the next request. An app that writes a response in
// several small writes with Nagle's algorithm on (TCP_NODELAY off, as
// Python's http.server and werkzeug do) holds its second write until the
// first is acknowledged: without the early ACK, every such response took
// the delayed-ACK timer, 40 ms. A response that arrives whole in one read
// (the common, fast case) pays nothing: no system call is added.
type appSource struct {
	conn  net.Conn
	reads int // reads of the current response
	ack   sock.QuickAck
}

func (s *appSource) init(conn net.Conn) {
	s.conn = conn
	s.ack.Init(conn)
}

// Read reads from the connection, acknowledging first when this is the
// response's second read.
func (s *appSource) Read(p []byte) (int, error) {
	s.reads++
	if s.reads == 2 {
		s.ack.Now()
	}
	return s.conn.Read(p)
}
