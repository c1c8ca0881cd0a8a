package dispatch

// releaseSlot gives back the max_streams slot of the request in flight
// after a panic in the connection's goroutine (abort): handle, which
// releases it when the request ends, did not get there. A WebSocket that
// the connection was handed off to owns the slot from then on and
// releases it itself.
func (c *clientConn) releaseSlot() {
	inst := c.slot
	if inst == nil || c.handedOff {
		return
	}
	c.slot = nil
	c.s.m.streamsActive.Dec()
	inst.Release()
}
