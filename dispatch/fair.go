package dispatch

import (
	"time"

	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/routes"
)

// wsChunkWait bounds how long a WebSocket chunk queues for fair admission:
// past it the chunk is relayed anyway (a frame is throttled, never cut),
// and a revoked splice notices its closed connections no later.
const wsChunkWait = 100 * time.Millisecond

// admitFair waits for the instance's turn under fair admission
// (Config.Fair): at once when the process is not busy, else behind the
// work of other instances in deficit round robin. It returns false when
// done closed first (the route was revoked, the stream reset).
func (s *Server) admitFair(inst *routes.Instance, done <-chan struct{}) (fairshare.Ticket, bool) {
	fair := s.cfg.Fair
	if fair == nil {
		return fairshare.Ticket{}, true
	}
	if t, ok := fair.TryAdmitFlow(&inst.Fair); ok {
		return t, true
	}
	s.pollBeforeQueueing()
	t, err := fair.Queue(&inst.Fair, fairshare.KindRequest, done, nil)
	return t, err == nil
}

// pollBeforeQueueing delivers a parked connection's request that has
// arrived (as pollParked does) before a request queues for admission: it
// would wait anyway, and while a flood's requests queue and wait for their
// apps, none of them ends to deliver (a flood whose requests all wait can
// go milliseconds without one ending; measured on one core, nine quiet
// instances beside a 100-connection flood with 17 slots: the p99 of a
// quiet request's wait before its head was read, 1.7 ms).
func (s *Server) pollBeforeQueueing() {
	if s.cfg.Fair.Busy() {
		s.idleH1.pollNow(true)
	}
}

// admitChunk admits one relayed WebSocket chunk, only when the scheduler
// is contended (two atomic loads otherwise). The caller releases the
// ticket once the chunk is written.
func (w *wsSplice) admitChunk() fairshare.Ticket {
	if !w.fair.Contended() || w.flow == nil {
		return fairshare.Ticket{}
	}
	t, _ := w.fair.Admit(w.flow, fairshare.KindWebSocket, nil, wsChunkWait)
	return t
}

// admitFair admits the stream under fair admission; false: the stream was
// reset or its route revoked while it queued (answered 503).
func (st *h2Stream) admitFair(inst *routes.Instance) bool {
	st.fair = fairshare.Ticket{}
	fair := st.s.cfg.Fair
	if fair == nil {
		return true
	}
	t, ok := fair.TryAdmitFlow(&inst.Fair)
	if !ok {
		st.s.pollBeforeQueueing()
		var err error
		t, err = fair.Queue(&inst.Fair, fairshare.KindRequest, st.es.Done(), st.hc.route.Lease.Done())
		if err != nil {
			st.deny(denyRevoked)
			return false
		}
	}
	st.fair = t
	return true
}

// releaseFair gives back the stream's fair admission, if it holds one.
func (st *h2Stream) releaseFair() {
	if st.fair.Valid() {
		st.s.cfg.Fair.Release(st.fair)
		st.fair = fairshare.Ticket{}
		st.s.pollParked(st.hc.route.Instance) // fairpoll.go
	}
}

// pauseFair gives the stream's slot back while it waits for its app,
// unless its instance has more than fairLightStreams requests in flight,
// as for HTTP/1.1 (clientConn.pauseFair). Measured on one core, a
// 4 × 25-stream flood: the quiet instance's p99 2.3 ms kept, 3.3 ms given
// back; the flood's throughput 0.65× (the slots bound its streams in
// flight, as its connections' on HTTP/1.1).
func (st *h2Stream) pauseFair() {
	st.fairPaused = st.s.givesFairBack(st.hc.route.Instance, st.fair)
	if st.fairPaused {
		st.releaseFair()
	}
}

// resumeFair takes a slot again once the app has answered, if pauseFair
// gave it back.
func (st *h2Stream) resumeFair() error {
	if !st.fairPaused {
		return nil
	}
	st.fairPaused = false
	lease := st.hc.route.Lease.Done()
	t, err := st.s.cfg.Fair.AdmitEither(&st.hc.route.Instance.Fair, fairshare.KindRequest, st.es.Done(), lease)
	if err != nil {
		return resumeFailure(lease)
	}
	st.fair = t
	return nil
}

// fairLightStreams is how many requests in flight an instance may have
// for its requests and streams to give their fair-admission slots back
// while they wait for the app (pauseFair).
const fairLightStreams = 2

// givesFairBack reports whether a request of inst holding ticket t gives
// it back while it waits for its app: it holds one, and inst has at most
// fairLightStreams requests in flight (see clientConn.pauseFair).
func (s *Server) givesFairBack(inst *routes.Instance, t fairshare.Ticket) bool {
	return t.Valid() && !s.holdFairAppWait && inst.Active() <= fairLightStreams
}

// pauseFair keeps an HTTP/1.1 request's slot while it waits for its app
// when its instance has more than fairLightStreams requests in flight (a
// flood): the slots then bound how many of the flood's requests are in
// flight at once, which is what keeps a neighbour's request near the
// front of the run queue (measured on one core: a quiet instance's p99
// under a 100-connection flood 1.5 ms with the slot kept, 4.9 ms given
// back, 3.2 ms without fair admission). The lease hands on a slot that
// waits long (a long poll). An instance with at most fairLightStreams in
// flight gives its slot back, so that quiet neighbours waiting for their
// apps do not shrink the slots left for the flood (nine of them cut its
// throughput by 40 %). HTTP/2 streams do the same (h2Stream.pauseFair).
func (c *clientConn) pauseFair() {
	c.fairPaused = c.s.givesFairBack(c.route.Instance, c.fair)
	if c.fairPaused {
		c.s.cfg.Fair.Release(c.fair)
		c.fair = fairshare.Ticket{}
	}
}

// resumeFair takes a slot again once the app has answered, if pauseFair
// gave it back.
func (c *clientConn) resumeFair() error {
	if !c.fairPaused {
		return nil
	}
	c.fairPaused = false
	t, err := c.s.cfg.Fair.Admit(&c.route.Instance.Fair, fairshare.KindRequest, c.route.Lease.Done(), 0)
	if err != nil {
		return errClientRevoked
	}
	c.fair = t
	return nil
}

// resumeFailure is the error of a resumeFair that ended while queued: the
// route's revocation, or else the stream's end.
func resumeFailure(lease <-chan struct{}) error {
	select {
	case <-lease:
		return errClientRevoked
	default:
		return errClientGone
	}
}

// appAnswerSpin is how long a light instance's request (one that gave its
// slot back for the wait, pauseFair) polls for its app's answer before it
// parks, while the scheduler is busy. A parked goroutine is woken by
// Go's network poller only once the run queue is empty, which behind a
// neighbour's flood on one core takes up to milliseconds; an app that
// answers within the spin skips that wait. A light instance has at most
// fairLightStreams requests in flight, so the CPU it spends is bounded by
// its request rate.
const appAnswerSpin = 25 * time.Microsecond

// answerSpin: see appAnswerSpin.
func (c *clientConn) answerSpin() time.Duration { return c.s.answerSpin(c.fairPaused) }

// answerSpin: see appAnswerSpin.
func (st *h2Stream) answerSpin() time.Duration { return st.s.answerSpin(st.fairPaused) }

// answerSpin is appAnswerSpin for a request that gave its slot back for
// the app wait (paused) while the scheduler is busy, else 0.
func (s *Server) answerSpin(paused bool) time.Duration {
	if paused && s.cfg.Fair.Busy() {
		return appAnswerSpin
	}
	return 0
}
