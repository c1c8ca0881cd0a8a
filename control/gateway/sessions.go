package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/applistener/applistener/control/api"
)

// Sessions. A supervisor makes a session id at process start (32 lower-case
// hex characters) and sends it with every request (?session=, or "session"
// in an advertisement). The gateway keeps one session per supervisor id in
// the store (sessions/<id>, expiring after the session TTL):
//
//   - a request of that session renews it (poll, advertisement, stream end),
//     and so does an open push stream, at every keepalive it writes (and at
//     least every third of the TTL);
//   - every session has an order, assigned by the gateway when the session
//     opens (above every order the supervisor's record ever had: the
//     store's revision, which only grows, and survives the record's
//     expiry), stored in the record and told to the supervisor in the
//     X-Applistener-Session-Order header of every answer; the supervisor
//     sends it back (?order=) with every request;
//   - a request with another session id supersedes the current one at once
//     (push streams of the old session end), unless it names an order
//     below the current session's: that session was superseded, however
//     many sessions ago, and is refused with 409, so that a lingering old
//     process never takes the id back. A session id without an order is a
//     new process's first request, and opens a session of a new order;
//   - a withdrawal (DELETE .../installations?session=) removes the
//     session's advertisement and marks the session withdrawn; its later
//     requests get 409 too;
//   - a request without a session id (an old supervisor) uses the session
//     "": it is renewed and expires like any other, is superseded by any
//     real session, and never supersedes one (such a request is then served
//     its document, but its advertisements are refused with 409).
//
// An advertisement is published only while its session holds and is the
// supervisor's current one (discovery.go).

// DefaultSessionTTL is how long a session holds after its last request.
const DefaultSessionTTL = 15 * time.Second

// DiscoveryWarmupSlack is what DefaultDiscoveryWarmup adds to the session
// TTL: a supervisor's reconnection and first advertisement.
const DiscoveryWarmupSlack = 2 * time.Second

// DefaultDiscoveryWarmup is the warmup of a memory-store gateway whose
// session TTL is ttl (DefaultSessionTTL when not positive): one TTL plus
// DiscoveryWarmupSlack. A session silent for a TTL is over on a gateway
// that never stopped too, so after it the set is the one such a gateway
// would publish; a supervisor that still holds routes retries within a
// tenth of their validity (api.RetryBound), well within it.
func DefaultDiscoveryWarmup(ttl time.Duration) time.Duration {
	return cmp.Or(max(ttl, 0), DefaultSessionTTL) + DiscoveryWarmupSlack
}

// DefaultKeepaliveMin is the shortest keepalive interval granted to a push
// session.
const DefaultKeepaliveMin = 250 * time.Millisecond

// SessionOrderHeader is the response header that tells a supervisor the
// order of its session (a decimal integer), to be sent back as ?order=.
const SessionOrderHeader = api.SessionOrderHeader

// SessionTTLHeader is the response header that tells a supervisor the
// session TTL (api.SessionTTLHeader).
const SessionTTLHeader = api.SessionTTLHeader

// sessionOutcome is what touchSession made of a request's session.
type sessionOutcome struct {
	// current is true when the request's session is (now) the supervisor's
	// current session; false for a request without a session while a real
	// session holds.
	current bool
	// order is the session's order when current (SessionOrderHeader).
	order int64
	// code and why, when code is not 0, refuse the request.
	code int
	why  string
}

// touchSession records a request of supervisor sup's session sid of order
// order (0: not known yet), made from source: it renews the session,
// creates it, or supersedes the current one; or it refuses a superseded or
// withdrawn session (409), or answers 503 when the store cannot be
// written. The decision is made on the view and written on the condition
// that the stored record is still the one the view has (a compare and
// swap on its modification revision), so that two replicas never both
// decide on the same record.
func (g *Gateway) touchSession(ctx context.Context, sup, sid string, order int64, source string) sessionOutcome {
	key := keySessions + sup
	for range 4 {
		g.mu.Lock()
		cur, ok := g.sessions[sup]
		applied := g.applied.current()
		g.mu.Unlock()
		next := sessionRecord{Session: sid, Since: time.Now().UTC().Truncate(time.Millisecond), Source: source}
		cond := mustNotExist
		switch {
		case ok && sid != "" && cur.rec.Session != sid && cur.rec.Session != "" && order > 0 && order <= cur.rec.Order:
			return sessionOutcome{code: http.StatusConflict, why: "this session was superseded by a newer session of the same supervisor"}
		case ok && sid != "" && cur.rec.Session == sid && cur.rec.Withdrawn:
			return sessionOutcome{code: http.StatusConflict, why: "this session was withdrawn"}
		case ok && cur.rec.Session == sid && cur.holds():
			renewed, err := g.store.renew(ctx, key)
			if err != nil {
				g.log.Warn("session not renewed", "supervisor", sup, "err", err)
				return sessionOutcome{code: http.StatusServiceUnavailable, why: "the store cannot be written"}
			}
			if renewed {
				return sessionOutcome{current: true, order: cur.rec.Order}
			}
			// Its lease ended a moment ago: write it again.
			next.Since, next.Order, cond = cur.rec.Since, cur.rec.Order, cur.modRev
		case ok && sid == "" && cur.rec.Session != "" && cur.holds():
			return sessionOutcome{}
		case ok:
			cond = cur.modRev
		}
		if next.Order == 0 {
			next.Order = newSessionOrder(sid, order, applied, cur.rec.Order)
		}
		value, err := json.Marshal(next)
		if err != nil {
			return sessionOutcome{code: http.StatusInternalServerError, why: "cannot encode the session"}
		}
		rev, written, err := g.store.put(ctx, key, value, putOptions{ttl: g.sessionTTL, renewable: true, cond: cond})
		if err == nil {
			err = g.waitApplied(ctx, rev)
		}
		if err != nil {
			g.log.Warn("session not stored", "supervisor", sup, "err", err)
			return sessionOutcome{code: http.StatusServiceUnavailable, why: "the store cannot be written"}
		}
		if written {
			if ok && cur.rec.Session != sid && cur.holds() {
				g.log.Info("session superseded", "supervisor", sup, "old_session", cur.rec.Session, "session", sid, "remote", source)
			} else if !ok || cur.rec.Session != sid {
				g.log.Info("session opened", "supervisor", sup, "session", sid, "remote", source)
			}
			return sessionOutcome{current: true, order: next.Order}
		}
		// Another request changed the record first: the view has caught
		// up with it (waitApplied), look again.
	}
	return sessionOutcome{code: http.StatusServiceUnavailable, why: "the session record keeps changing; retry"}
}

// newSessionOrder returns the order of a session sid that opens (or takes
// the record back) with the request's order: its own when it has one (it
// opened before and is not older than the current session), else one
// above every order the record has had. The view has every write of the
// record up to applied (the write is conditional on that), and every order
// was at most the revision of the write that stored it, so applied+1 is
// above all of them; stored is the current record's, which the view has.
func newSessionOrder(sid string, order, applied, stored int64) int64 {
	if sid != "" && order > 0 {
		return order
	}
	return max(applied, stored) + 1
}

// withdrawSession removes the advertisement of sup's session sid and marks
// the session withdrawn (when it is the current one). Nothing stored is not
// an error.
func (g *Gateway) withdrawSession(ctx context.Context, sup, sid string) error {
	for range 4 {
		g.mu.Lock()
		adv, hasAdv := g.installations[sup]
		cur, hasSession := g.sessions[sup]
		g.mu.Unlock()
		retry := false
		if hasAdv && adv.session == sid {
			rev, ok, err := g.store.del(ctx, keyAds+sup, adv.modRev)
			if err == nil {
				err = g.waitApplied(ctx, rev)
			}
			if err != nil {
				return fmt.Errorf("remove the advertisement: %w", err)
			}
			retry = !ok
		}
		if hasSession && cur.rec.Session == sid && cur.holds() {
			rec := cur.rec
			rec.Withdrawn = true
			value, err := json.Marshal(rec)
			if err != nil {
				return fmt.Errorf("encode the session: %w", err)
			}
			// The record stays for one TTL so that a late request of the
			// withdrawn session is refused rather than reopening it.
			rev, ok, err := g.store.put(ctx, keySessions+sup, value, putOptions{ttl: g.sessionTTL, cond: cur.modRev})
			if err == nil {
				err = g.waitApplied(ctx, rev)
			}
			if err != nil {
				return fmt.Errorf("end the session: %w", err)
			}
			retry = retry || !ok
		}
		if !retry {
			return nil
		}
	}
	return fmt.Errorf("the records of supervisor %s keep changing", sup)
}

// keepaliveGrant returns the keepalive interval granted for a requested one
// ("" when none was asked): the request clamped to [keepaliveMin,
// keepalive].
func (g *Gateway) keepaliveGrant(requested string) (time.Duration, error) {
	if requested == "" {
		return g.keepalive, nil
	}
	d, err := time.ParseDuration(requested)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("keepalive %.40q: want a positive Go duration such as 10s", requested)
	}
	return min(max(d, g.keepaliveMin), g.keepalive), nil
}

// requestSession returns the session id of r (?session=) and the order the
// supervisor names (?order=, 0 when none); ok is false when either is not
// a valid one.
func requestSession(r *http.Request) (sid string, order int64, ok bool) {
	q := r.URL.Query()
	if len(q["session"]) > 1 || len(q["order"]) > 1 {
		return "", 0, false
	}
	sid = q.Get("session")
	if v := q.Get("order"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return "", 0, false
		}
		order = n
	}
	return sid, order, validSessionID(sid)
}

// setSessionOrder tells the supervisor the order of its current session.
func setSessionOrder(w http.ResponseWriter, out sessionOutcome) {
	if out.current && out.order > 0 {
		w.Header().Set(SessionOrderHeader, strconv.FormatInt(out.order, 10))
	}
}
