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
	if t, ok := fair.TryAdmit(); ok {
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
	if t, ok := fair.TryAdmit(); ok {
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

// pauseFair gives back the request's slot while it waits for its app.
func (c *clientConn) pauseFair() {
	if c.s.holdFairAppWait {
		return
	}
	c.s.cfg.Fair.Release(c.fair)
	c.fair = fairshare.Ticket{}
}

// resumeFair takes a slot again once the app has answered.
func (c *clientConn) resumeFair() error {
	if c.s.cfg.Fair == nil || c.s.holdFairAppWait {
		return nil
	}
	t, ok := c.s.admitFair(c.route.Instance, c.route.Lease.Done())
	if !ok {
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
