package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Sessions. A supervisor makes a session id at process start (32 lower-case
// hex characters) and sends it with every request (?session=, or "session"
// in an advertisement). The gateway keeps one session per supervisor id in
// the store (sessions/<id>, expiring after the session TTL):
//
//   - a request of that session renews it (poll, advertisement, stream end),
//     and so does an open push stream, at every keepalive it writes (and at
//     least every third of the TTL);
//   - a request with another session id supersedes it at once: the record
//     names the new session and keeps the last superseded ids, whose
//     requests are then refused with 409 (so that a lingering old process
//     cannot take the id back), and push streams of the old session end;
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

// DefaultKeepaliveMin is the shortest keepalive interval granted to a push
// session.
const DefaultKeepaliveMin = 250 * time.Millisecond

// KeepaliveHeader is the response header of a push request that tells the
// granted keepalive interval (a Go duration).
const KeepaliveHeader = "X-Applistener-Keepalive"

// maxSupersededKept is how many superseded session ids a record keeps.
const maxSupersededKept = 8

// sessionRecord is the stored value of sessions/<supervisor>.
type sessionRecord struct {
	Session    string    `json:"session"`
	Since      time.Time `json:"since"`
	Source     string    `json:"source,omitempty"`
	Withdrawn  bool      `json:"withdrawn,omitempty"`
	Superseded []string  `json:"superseded,omitempty"`
}

// sessionView is a session record as the view holds it.
type sessionView struct {
	rec    sessionRecord
	modRev int64
}

// holds reports whether the session is live (not withdrawn).
func (s sessionView) holds() bool { return !s.rec.Withdrawn }

// validSessionID reports whether s is a session id: "" (none) or 32
// lower-case hexadecimal characters.
func validSessionID(s string) bool {
	if s == "" {
		return true
	}
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// sessionOutcome is what touchSession made of a request's session.
type sessionOutcome struct {
	// current is true when the request's session is (now) the supervisor's
	// current session; false for a request without a session while a real
	// session holds.
	current bool
	// code and why, when code is not 0, refuse the request.
	code int
	why  string
}

// touchSession records a request of supervisor sup's session sid, made
// from source: it renews the session, creates it, or supersedes the
// current one; or it refuses a superseded or withdrawn session (409), or
// answers 503 when the store cannot be written.
func (g *Gateway) touchSession(ctx context.Context, sup, sid, source string) sessionOutcome {
	key := keySessions + sup
	for range 4 {
		g.mu.Lock()
		cur, ok := g.sessions[sup]
		g.mu.Unlock()
		next := sessionRecord{Session: sid, Since: time.Now().UTC().Truncate(time.Millisecond), Source: source}
		cond := mustNotExist
		switch {
		case ok && sid != "" && slices.Contains(cur.rec.Superseded, sid):
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
				return sessionOutcome{current: true}
			}
			// Its lease ended a moment ago: write it again.
			next.Since, next.Superseded, cond = cur.rec.Since, cur.rec.Superseded, cur.modRev
		case ok && sid == "" && cur.rec.Session != "" && cur.holds():
			return sessionOutcome{}
		case ok:
			next.Superseded = cur.rec.Superseded
			if cur.rec.Session != "" && cur.rec.Session != sid {
				next.Superseded = append([]string{cur.rec.Session}, cur.rec.Superseded...)
			}
			next.Superseded = next.Superseded[:min(len(next.Superseded), maxSupersededKept)]
			cond = cur.modRev
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
			return sessionOutcome{current: true}
		}
		// Another request changed the record first: the view has caught
		// up with it (waitApplied), look again.
	}
	return sessionOutcome{code: http.StatusServiceUnavailable, why: "the session record keeps changing; retry"}
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

// sessionsHoldingLocked counts the sessions that hold, for the gauge. g.mu
// is held.
func (g *Gateway) sessionsHoldingLocked() int {
	n := 0
	for _, s := range g.sessions {
		if s.holds() {
			n++
		}
	}
	return n
}

// requestSession returns the session id of r (?session=); ok is false
// when it is not a valid one.
func requestSession(r *http.Request) (string, bool) {
	q := r.URL.Query()
	if len(q["session"]) > 1 {
		return "", false
	}
	sid := q.Get("session")
	return sid, validSessionID(sid)
}
