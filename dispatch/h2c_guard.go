package dispatch

import (
	"errors"

	"github.com/applistener/applistener/internal/panicguard"
)

// errH2CReadPanic and errH2CWritePanic are what a read or a write of an
// h2c app connection returns after a panic in it: h2client ends that
// connection (its streams fail).
var (
	errH2CReadPanic  = errors.New("h2c app connection: panic recovered in a read")
	errH2CWritePanic = errors.New("h2c app connection: panic recovered in a write")
)

// Read reads from the app connection for h2client's read loop (a
// connector's connection may be ours).
// A panic is recovered (panicguard H2CRead): the connection closes, the
// read fails, and h2client ends that connection only (its streams
// fail; the next request dials anew), never the process.
func (c *h2cConn) Read(p []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			_ = c.Close()
			panicguard.Report(c.p.s.log, panicguard.H2CRead, r, "app", c.p.addr, "connector", c.p.bp.connector.String())
			n, err = 0, errH2CReadPanic
		}
	}()
	panicguard.Point(panicguard.H2CRead, c.p.addr)
	return c.Conn.Read(p)
}

// Write writes to the app connection for h2client (its writers: the
// control loop and the streams' senders). A panic is recovered (panicguard
// H2CConn): the connection closes, the write fails, and h2client ends that
// connection only.
func (c *h2cConn) Write(p []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			_ = c.Close()
			c.p.panicked(r)
			n, err = 0, errH2CWritePanic
		}
	}()
	panicguard.Point(panicguard.H2CConn, c.p.addr)
	c.p.writes.Add(1)
	return c.Conn.Write(p)
}

// panicked reports a panic recovered in one of the pool's app connections
// (h2client's frame loop, through Config.OnPanic, or a write); h2client
// closes that connection, and the next request dials anew.
func (p *h2cPool) panicked(r any) {
	panicguard.Report(p.s.log, panicguard.H2CConn, r, "app", p.addr, "connector", p.bp.connector.String())
}
