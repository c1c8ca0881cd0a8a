package dispatch

// abandon releases what st holds after its handler panicked (ServeStream
// recovered it): the app connection attached to the stream is closed and
// forgotten by the client connection, which would otherwise keep it open
// until the client connection ends. The instance's stream slot and the
// gauges are released by the handler's own deferred calls; the engine
// resets the stream and frees its slot on the connection once ServeStream
// returns. st is not returned to the pool: its state is whatever the
// panic left. It must not panic itself (it runs inside the recovery), so
// it only reads st's atomics and closes.
func (st *h2Stream) abandon() {
	if st == nil || st.hc == nil {
		return
	}
	st.noReuse = true
	if bc := st.attached.Load(); bc != nil {
		st.hc.removeBackend(bc)
		_ = bc.conn.Close()
	}
}
