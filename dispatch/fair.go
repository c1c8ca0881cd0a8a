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
	if s.cfg.Fair == nil {
		return fairshare.Ticket{}, true
	}
	t, err := s.cfg.Fair.Admit(&inst.Fair, fairshare.KindRequest, done, 0)
	return t, err == nil
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
	if t, ok := fair.TryAdmitFlow(&inst.Fair); ok {
		st.fair = t
		return true
	}
	t, err := fair.AdmitEither(&inst.Fair, fairshare.KindRequest, st.es.Done(), st.hc.route.Lease.Done())
	if err != nil {
		st.deny(denyRevoked)
		return false
	}
	st.fair = t
	return true
}

// releaseFair gives back the stream's fair admission, if it holds one.
func (st *h2Stream) releaseFair() {
	st.s.cfg.Fair.Release(st.fair)
	st.fair = fairshare.Ticket{}
}

// pauseFair gives back the stream's slot while it waits for its app.
func (st *h2Stream) pauseFair() {
	if !st.s.holdFairAppWait {
		st.releaseFair()
	}
}

// resumeFair takes a slot again once the app has answered.
func (st *h2Stream) resumeFair() error {
	fair := st.s.cfg.Fair
	if fair == nil || st.s.holdFairAppWait {
		return nil
	}
	if t, ok := fair.TryAdmitFlow(&st.hc.route.Instance.Fair); ok {
		st.fair = t
		return nil
	}
	lease := st.hc.route.Lease.Done()
	t, err := fair.AdmitEither(&st.hc.route.Instance.Fair, fairshare.KindRequest, st.es.Done(), lease)
	if err != nil {
		return resumeFailure(lease)
	}
	st.fair = t
	return nil
}

// pauseFair keeps an HTTP/1.1 request's slot while it waits for its app:
// the slots then bound how many of one flooding instance's requests are in
// flight at once, which is what keeps a neighbour's request near the
// front of the run queue (measured: a quiet instance's p99 under a
// 100-connection flood 3.0 ms with the slot kept, 8.3 ms given back, 12.5
// ms without fair admission). The lease hands on a slot that waits long
// (a long poll). HTTP/2 streams give theirs back (h2Stream.pauseFair):
// kept, eight slots would cut a multiplexed connection's batching and
// its throughput by 40 %.
func (c *clientConn) pauseFair() {}

// resumeFair has nothing to take again (pauseFair kept the slot).
func (c *clientConn) resumeFair() error { return nil }

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
