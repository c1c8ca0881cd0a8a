package dispatch

import "github.com/applistener/applistener/internal/fairshare"

// releaseSlot gives back the max_streams slot of the request in flight
// after a panic in the connection's goroutine (abort): handle, which
// releases it when the request ends, did not get there. A WebSocket that
// the connection was handed off to owns the slot from then on and
// releases it itself.
func (c *clientConn) releaseSlot() {
	c.s.cfg.Fair.Release(c.fair)
	c.fair = fairshare.Ticket{}
	inst := c.slot
	if inst == nil || c.handedOff {
		return
	}
	c.slot = nil
	c.s.m.streamsActive.Dec()
	inst.Release()
}
