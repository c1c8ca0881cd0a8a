package dispatch

import (
	"errors"

	"github.com/applistener/applistener/internal/panicguard"
)

// errH2CReadPanic is what a read of an h2c app connection returns after
// a panic in it: h2client ends that connection (its streams fail).
var errH2CReadPanic = errors.New("h2c app connection: panic recovered in a read")

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
