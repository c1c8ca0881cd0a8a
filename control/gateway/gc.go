package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Garbage collection of supervisor ids. What the store keeps per
// supervisor id, and what ends it:
//
//	sessions/<id>  expires one session TTL after the last request (a
//	               withdrawn record after one TTL too)
//	ads/<id>       expires with its longest route (at most
//	               MaxAdvertisedLifetime), or is removed by a withdrawal
//	docs/<id>      written by the configuration file's import or the write
//	               API; never expires
//	pools/<id>     written when a pool token first uses the id; never
//	               expires
//
// Left alone, a pool that names its members after Pods (a new id per Pod)
// would leave a pool binding per Pod that ever ran, and the write API a
// document {"instances":[]} per supervisor whose last instance was deleted.
// The collector removes those once nothing references them: an id is idle
// when it has no session record, no advertisement and no open push stream
// on this replica; an idle id's empty document (one with no instance
// entry, that the configuration file does not name) and its pool binding
// (when it has no document left) are removed once it has been idle for the
// grace. A document with instances is the operator's and stays (DELETE
// /v1/supervisors/{id} forgets it), and so does the binding of an id that
// has one. Every replica collects; the deletions are conditional (a
// document on its revision), so replicas that race remove a key once.
//
// What the view holds in memory follows the store (installations,
// sessions, pools, documents, grants), and the collector's own map holds
// only the ids that are candidates now, so the memory of a gateway returns
// to its baseline with the keys.

// DefaultIdleGrace is how long an idle supervisor id keeps its empty
// document and pool binding.
const DefaultIdleGrace = 5 * time.Minute

// maxCollectPeriod bounds the time between two sweeps.
const maxCollectPeriod = 30 * time.Second

// idleCollector is the collector's state: since when each candidate id has
// been idle, as this replica saw it.
type idleCollector struct {
	grace time.Duration
	// removed counts the keys removed, by kind ("document",
	// "pool_binding").
	removed *prometheus.CounterVec

	mu        sync.Mutex
	idleSince map[string]time.Time
}

func newIdleCollector(grace time.Duration, reg prometheus.Registerer) *idleCollector {
	c := &idleCollector{
		grace: grace,
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_gateway_idle_removed_total",
			Help: "Keys of idle supervisor ids removed after the idle grace, by kind (document: an empty document; pool_binding).",
		}, []string{"kind"}),
		idleSince: make(map[string]time.Time),
	}
	c.removed.WithLabelValues("document")
	c.removed.WithLabelValues("pool_binding")
	if reg != nil {
		reg.MustRegister(c.removed)
	}
	return c
}

// period is the time between two sweeps: a quarter of the grace, at most
// maxCollectPeriod.
func (c *idleCollector) period() time.Duration {
	return min(max(c.grace/4, 10*time.Millisecond), maxCollectPeriod)
}

// tracked returns how many ids the collector tracks (for tests).
func (c *idleCollector) tracked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idleSince)
}

// idleCandidate is an idle id with something to remove.
type idleCandidate struct {
	sup string
	// docRev is the revision of its empty document, 0 when it has none
	// to remove.
	docRev int64
	// pool is its pool binding, "" when it has none to remove.
	pool string
}

// collectIdle sweeps every period until ctx ends.
func (g *Gateway) collectIdle(ctx context.Context) {
	t := time.NewTicker(g.idle.period())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.sweepIdle(ctx, time.Now())
	}
}

// sweepIdle finds the idle ids, starts the grace of those newly idle,
// forgets those no longer idle, and removes what the ids idle for the
// grace leave. It returns how many keys it removed.
func (g *Gateway) sweepIdle(ctx context.Context, now time.Time) int {
	if g.storeUnusable() != "" {
		return 0
	}
	g.reloadMu.Lock()
	named := make(map[string]struct{}, len(g.fileDocs))
	for sup := range g.fileDocs {
		named[sup] = struct{}{}
	}
	g.reloadMu.Unlock()
	candidates := g.idleCandidates(named)

	c := g.idle
	var due []idleCandidate
	c.mu.Lock()
	for sup := range c.idleSince {
		if _, ok := candidates[sup]; !ok {
			delete(c.idleSince, sup)
		}
	}
	for sup, cand := range candidates {
		since, ok := c.idleSince[sup]
		if !ok {
			c.idleSince[sup] = now
			continue
		}
		if now.Sub(since) >= c.grace {
			due = append(due, cand)
		}
	}
	c.mu.Unlock()

	removed := 0
	for _, cand := range due {
		if ctx.Err() != nil {
			break
		}
		n, err := g.removeIdle(ctx, cand)
		removed += n
		if err != nil {
			g.log.Warn("idle supervisor id not cleaned up; retrying at the next sweep", "supervisor", cand.sup, "err", err)
			continue
		}
		c.mu.Lock()
		delete(c.idleSince, cand.sup)
		c.mu.Unlock()
	}
	return removed
}

// idleCandidates returns the idle ids that have an empty document (not
// named by the configuration file) or a pool binding without a document.
func (g *Gateway) idleCandidates(named map[string]struct{}) map[string]idleCandidate {
	st := g.state.Load()
	g.mu.Lock()
	defer g.mu.Unlock()
	watched := g.push.watched()
	idle := func(sup string) bool {
		_, s := g.sessions[sup]
		_, a := g.installations[sup]
		_, w := watched[sup]
		return !s && !a && !w
	}
	out := make(map[string]idleCandidate)
	for sup, d := range st.docs {
		if _, inFile := named[sup]; inFile || len(st.grants[sup]) > 0 || !idle(sup) || !emptyDocumentBody(d.body) {
			continue
		}
		out[sup] = idleCandidate{sup: sup, docRev: d.modRev, pool: g.pools[sup]}
	}
	for sup, pool := range g.pools {
		if _, hasDoc := st.docs[sup]; hasDoc || !idle(sup) {
			continue
		}
		out[sup] = idleCandidate{sup: sup, pool: pool}
	}
	return out
}

// emptyDocumentBody reports whether a stored document has no instance
// entry at all (what the write API leaves when it deletes the last one).
func emptyDocumentBody(body []byte) bool {
	var doc struct {
		Instances *[]json.RawMessage `json:"instances"`
	}
	return json.Unmarshal(body, &doc) == nil && doc.Instances != nil && len(*doc.Instances) == 0
}

// removeIdle removes the empty document and then the pool binding of an
// idle id. A document that changed since the sweep looked is left (and so
// is the binding). A binding removed while the id came back (a request
// that passed its pool check a moment before) is written back.
func (g *Gateway) removeIdle(ctx context.Context, cand idleCandidate) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*etcdOpTimeout)
	defer cancel()
	removed := 0
	if cand.docRev > 0 {
		rev, ok, err := g.store.del(ctx, keyDocs+cand.sup, cand.docRev)
		if err == nil {
			err = g.waitApplied(ctx, rev)
		}
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, nil // written again since: not idle after all
		}
		removed++
		g.idle.removed.WithLabelValues("document").Inc()
	}
	if cand.pool != "" {
		g.mu.Lock()
		_, s := g.sessions[cand.sup]
		g.mu.Unlock()
		if s {
			return removed, nil
		}
		rev, _, err := g.store.del(ctx, keyPools+cand.sup, anyRevision)
		if err == nil {
			err = g.waitApplied(ctx, rev)
		}
		if err != nil {
			return removed, err
		}
		removed++
		g.idle.removed.WithLabelValues("pool_binding").Inc()
		if err := g.rebindIfBack(ctx, cand); err != nil {
			return removed, err
		}
	}
	g.log.Info("idle supervisor id cleaned up", "supervisor", cand.sup, "document_removed", cand.docRev > 0,
		"pool_binding_removed", cand.pool, "idle_grace", g.idle.grace)
	return removed, nil
}

// rebindIfBack writes cand's pool binding back when the id got a session
// or an advertisement while the binding was being removed.
func (g *Gateway) rebindIfBack(ctx context.Context, cand idleCandidate) error {
	g.mu.Lock()
	_, s := g.sessions[cand.sup]
	_, a := g.installations[cand.sup]
	g.mu.Unlock()
	if !s && !a {
		return nil
	}
	rev, _, err := g.store.put(ctx, keyPools+cand.sup, []byte(cand.pool), putOptions{cond: mustNotExist})
	if err == nil {
		err = g.waitApplied(ctx, rev)
	}
	if err != nil {
		return errors.Join(errors.New("the id came back while its pool binding was removed; binding it again failed"), err)
	}
	return nil
}
