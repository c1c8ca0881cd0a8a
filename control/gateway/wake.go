package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/wake"
)

// The wake endpoint, for a supervisor's session:
//
//	POST /v1/supervisors/{id}/instances/{ws}/{sb}/wake?session=<sid>[&order=N]
//
// asks the platform to wake a sleeping instance of the supervisor's
// document, through the gateway's wake hook (Config.WakeHook; a POST of
// {"workspace","sandbox","generation","supervisor"}, see package wake).
// The supervisor's token (or its pool's) and its current session are
// required. Answers, JSON {"state": ...}:
//
//	202 {"state":"waking"}                 the platform accepted; the instance
//	                                       becomes active through the document
//	200 {"state":"active"}                 the document has it active already
//	409 {"state":"sleeping","reason":"…"}  the platform cannot wake it (Retry-After:
//	                                       when the gateway asks the platform again)
//	404                                    no such instance in the supervisor's document
//	501                                    the gateway has no wake hook
//	502                                    the platform could not be asked (Retry-After)
//
// Requests for one instance share one hook call until the documents have
// it active (or wake.DefaultFlightTimeout passed), and a refusal is
// remembered for wake.DefaultNegativeTTL.

// wakeRequestTimeout bounds the wait of a wake request for the platform's
// answer: the hook's attempts with their backoff.
const wakeRequestTimeout = 30 * time.Second

// wakeAnswer is the body of a wake answer.
type wakeAnswer struct {
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// serveWake serves POST /v1/supervisors/{id}/instances/{ws}/{sb}/wake.
func (g *Gateway) serveWake(w http.ResponseWriter, r *http.Request) {
	const endpoint = endpointWake
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		g.fail(w, endpoint, http.StatusMethodNotAllowed, "use POST")
		return
	}
	sup, ws, sb := r.PathValue("id"), r.PathValue("ws"), r.PathValue("sb")
	if g.authorize(w, r, endpoint, sup) == nil {
		return
	}
	sid, _, ok := requestSession(r)
	if !ok || sid == "" {
		g.fail(w, endpoint, http.StatusBadRequest, "session must be 32 lower-case hexadecimal characters")
		return
	}
	for _, n := range []string{ws, sb} {
		if err := routes.ValidName(n); err != nil {
			g.fail(w, endpoint, http.StatusBadRequest, api.OneLineReason(err.Error()))
			return
		}
	}
	if why := g.storeUnusable(); why != "" {
		g.unavailable(w, endpoint, why)
		return
	}
	g.mu.Lock()
	s, found := g.sessions[sup]
	g.mu.Unlock()
	if !found || !s.holds() || s.rec.Session != sid {
		g.fail(w, endpoint, http.StatusForbidden, "the session does not hold: only the supervisor's current session may ask for a wake")
		return
	}
	if g.wake == nil {
		g.fail(w, endpoint, http.StatusNotImplemented, "this gateway has no wake hook (--wake-hook)")
		return
	}
	spec, found := g.documentInstance(sup, ws, sb)
	if !found {
		g.fail(w, endpoint, http.StatusNotFound, "no such instance in this supervisor's document")
		return
	}
	if !spec.Sleeping() {
		g.answerWake(w, http.StatusOK, wakeAnswer{State: routes.StateActive}, 0)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), wakeRequestTimeout)
	defer cancel()
	key := wake.Key{Workspace: ws, Sandbox: sb, Generation: spec.Generation, Supervisor: sup}
	// The document is read again under the coordinator's lock: it may have
	// turned the instance active since, and releaseWakes ended that wake.
	err := g.wake.RequestWhile(ctx, key, func() bool {
		now, ok := g.documentInstance(sup, ws, sb)
		return ok && now.Sleeping() && now.Generation == spec.Generation
	})
	var cw *wake.CannotWakeError
	switch {
	case errors.Is(err, wake.ErrNotSleeping):
		g.answerWake(w, http.StatusOK, wakeAnswer{State: routes.StateActive}, 0)
	case err == nil:
		g.answerWake(w, http.StatusAccepted, wakeAnswer{State: "waking"}, 0)
		g.log.Info("wake requested", "supervisor", sup, "instance", ws+"/"+sb, "generation", spec.Generation)
	case errors.As(err, &cw):
		g.answerWake(w, http.StatusConflict, wakeAnswer{State: routes.StateSleeping, Reason: cw.Reason}, wake.RetryAfter(err))
	default:
		g.log.Warn("wake not forwarded: the platform could not be asked", "supervisor", sup, "instance", ws+"/"+sb, "err", err)
		w.Header().Set("Retry-After", strconv.Itoa(int(wake.DefaultRetryAfter/time.Second)))
		g.fail(w, endpoint, http.StatusBadGateway, "the platform's wake hook could not be asked")
	}
}

// releaseWakes ends the wakes in progress whose instance the documents
// now have active (or no longer have, or at another generation), so that
// the next wake of the instance asks the platform again. It is called
// after each change of the documents; it costs nothing while no wake is in
// progress.
func (g *Gateway) releaseWakes() {
	if g.wake == nil {
		return
	}
	g.wake.Sync(func(k wake.Key) bool {
		spec, ok := g.documentInstance(k.Supervisor, k.Workspace, k.Sandbox)
		return !ok || !spec.Sleeping() || spec.Generation != k.Generation
	})
}

// answerWake writes a wake answer.
func (g *Gateway) answerWake(w http.ResponseWriter, code int, a wakeAnswer, retryAfter time.Duration) {
	body, _ := json.Marshal(a)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(code)
	g.m.request(endpointWake, code)
	_, _ = w.Write(append(body, '\n'))
}

// documentInstance returns the valid entry of ws/sb in supervisor sup's
// stored document.
func (g *Gateway) documentInstance(sup, ws, sb string) (routes.InstanceSpec, bool) {
	d, ok := g.state.Load().docs[sup]
	if !ok {
		return routes.InstanceSpec{}, false
	}
	var doc storedDocument
	if json.Unmarshal(d.body, &doc) != nil {
		return routes.InstanceSpec{}, false
	}
	for _, raw := range doc.Instances {
		var k instanceKeyOf
		if json.Unmarshal(raw, &k) != nil || k.Workspace != ws || k.Sandbox != sb {
			continue
		}
		parsed, err := routes.ParseDocument([]byte(`{"instances":[` + string(raw) + `]}`))
		if err != nil || len(parsed.Instances) != 1 {
			return routes.InstanceSpec{}, false
		}
		return parsed.Instances[0], true
	}
	return routes.InstanceSpec{}, false
}
