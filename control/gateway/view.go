package gateway

import (
	"context"
	"fmt"
	"maps"
	"net/http"
)

// The view: every replica holds the whole store in memory, in the fields
// guarded by Gateway.mu (installations, sessions, pools) and in the
// immutable stateSnapshot (documents and grants). The store calls the
// storeSink methods below with its contents and each change; they update
// the view and feed it to the gateway's components: the push streams
// (push.go: changed documents, superseded or withdrawn sessions) and
// discovery (discovery.go).

// storeLoaded replaces the view by the store's contents (at start, and
// after every reconnection to etcd) and marks the store usable.
func (g *Gateway) storeLoaded(kvs []kvPair, rev int64) {
	docs := make(map[string]document)
	ads := make(map[string]advertisement)
	sessions := make(map[string]sessionView)
	pools := make(map[string]string)
	for _, kv := range kvs {
		kind, sup := splitKey(kv.key)
		switch kind {
		case keyDocs:
			docs[sup] = newDocument(kv.value, kv.modRev)
		case keyAds:
			if adv, err := decodeAdvertisement(sup, kv.value, kv.modRev); err == nil {
				ads[sup] = adv
			} else {
				g.log.Warn("stored advertisement ignored", "supervisor", sup, "err", err)
			}
		case keySessions:
			if s, err := decodeSession(kv.value, kv.modRev); err == nil {
				sessions[sup] = s
			} else {
				g.log.Warn("stored session ignored", "supervisor", sup, "err", err)
			}
		case keyPools:
			pools[sup] = string(kv.value)
		}
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.state.Load()
	next := &stateSnapshot{docs: docs, tokens: old.tokens, grants: discoveryGrants(docs)}
	g.state.Store(next)
	g.releaseWakes()
	changed := make(map[string]struct{})
	for sup := range old.docs {
		changed[sup] = struct{}{}
	}
	for sup := range docs {
		changed[sup] = struct{}{}
	}
	oldSessions := g.sessions
	// recovery.go: after every replica was down (etcd), advertisements
	// whose sessions expired meanwhile stay published.
	othersAlive, inherited := otherReplicas(kvs)
	fleetDown := g.storeKind == "etcd" && !othersAlive
	g.recovered = g.recoverOrphansLocked(ads, sessions, fleetDown, inherited)
	g.installations, g.sessions, g.pools = ads, sessions, pools
	sessionChanged := make(map[string]struct{}, len(oldSessions)+len(sessions))
	for sup := range oldSessions {
		sessionChanged[sup] = struct{}{}
	}
	for sup := range sessions {
		sessionChanged[sup] = struct{}{}
	}
	wasUp := g.storeUp.Swap(true)
	g.feedPushLocked(changed, sessionChanged)
	g.feedDiscoveryLocked(nil)
	g.applied.advance(rev)
	g.m.sessions.Set(float64(g.sessionsHoldingLocked()))
	if !wasUp {
		g.m.storeUp.Set(1)
		g.log.Info("gateway store loaded", "store", g.storeKind, "revision", rev, "documents", len(docs),
			"advertisements", len(ads), "sessions", len(sessions), "pool_bindings", len(pools))
	}
}

// feedDiscoveryLocked hands discovery a view of the current state, for it
// to republish the workspaces in touched (all when nil). g.mu is held; the
// maps handed over are never written again (storeChanged copies them
// first).
func (g *Gateway) feedDiscoveryLocked(touched map[string]struct{}) {
	g.discovery.update(&discoveryView{
		state:         g.state.Load(),
		installations: g.installations,
		sessions:      g.sessions,
		pools:         g.pools,
		recovered:     g.recovered,
		unusable:      g.storeUnusable(),
	}, touched)
}

// feedPushLocked hands the push streams a view of the current state, with
// the supervisors whose document (docsChanged) or session
// (sessionsChanged) changed. g.mu is held; the maps handed over are never
// written again (storeChanged copies them first).
func (g *Gateway) feedPushLocked(docsChanged, sessionsChanged map[string]struct{}) {
	g.push.update(&pushView{
		state:    g.state.Load(),
		sessions: g.sessions,
		pools:    g.pools,
		unusable: g.storeUnusable(),
	}, docsChanged, sessionsChanged)
}

// storeChanged applies the store's changes to the view.
func (g *Gateway) storeChanged(events []storeEvent, rev int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.state.Load()
	var docs map[string]document // copied on the first document change
	var grants map[string]map[grantKey]string
	docChanged := make(map[string]struct{})
	touched := make(map[string]struct{}) // supervisors whose publication may change
	sessionChanged := make(map[string]struct{})
	// Discovery holds the current maps: write copies.
	var copied [3]bool
	for _, ev := range events {
		kind, _ := splitKey(ev.key)
		switch {
		case kind == keyAds && !copied[0]:
			g.installations, copied[0] = maps.Clone(g.installations), true
		case kind == keySessions && !copied[1]:
			g.sessions, copied[1] = maps.Clone(g.sessions), true
		case kind == keyPools && !copied[2]:
			g.pools, copied[2] = maps.Clone(g.pools), true
		}
	}
	for _, ev := range events {
		kind, sup := splitKey(ev.key)
		switch kind {
		case keyDocs:
			if docs == nil {
				docs, grants = maps.Clone(old.docs), maps.Clone(old.grants)
			}
			if ev.value == nil {
				delete(docs, sup)
				delete(grants, sup)
			} else {
				d := newDocument(ev.value, ev.modRev)
				docs[sup] = d
				grants[sup] = documentGrants(d.body)
				if grants[sup] == nil {
					delete(grants, sup)
				}
			}
			docChanged[sup] = struct{}{}
		case keyAds:
			g.touchWorkspacesLocked(sup, touched)
			g.forgetRecoveredLocked(sup) // recovery.go
			if ev.value == nil {
				delete(g.installations, sup)
				continue
			}
			adv, err := decodeAdvertisement(sup, ev.value, ev.modRev)
			if err != nil {
				g.log.Warn("stored advertisement ignored", "supervisor", sup, "err", err)
				delete(g.installations, sup)
				continue
			}
			g.installations[sup] = adv
			g.touchWorkspacesLocked(sup, touched)
		case keySessions:
			g.forgetRecoveredLocked(sup)
			if ev.value == nil {
				delete(g.sessions, sup)
			} else if s, err := decodeSession(ev.value, ev.modRev); err == nil {
				g.sessions[sup] = s
			} else {
				g.log.Warn("stored session ignored", "supervisor", sup, "err", err)
				delete(g.sessions, sup)
			}
			sessionChanged[sup] = struct{}{}
		case keyPools:
			if ev.value == nil {
				delete(g.pools, sup)
			} else {
				g.pools[sup] = string(ev.value)
			}
			sessionChanged[sup] = struct{}{}
		}
	}
	if docs != nil {
		next := &stateSnapshot{docs: docs, tokens: old.tokens, grants: grants}
		g.state.Store(next)
		g.releaseWakes()
	}
	g.feedPushLocked(docChanged, sessionChanged)
	for sup := range docChanged {
		g.touchWorkspacesLocked(sup, touched)
	}
	for sup := range sessionChanged {
		g.touchWorkspacesLocked(sup, touched)
	}
	// Always fed (the view must be the current one), republishing only the
	// touched workspaces (none when touched is empty).
	g.feedDiscoveryLocked(touched)
	g.applied.advance(rev)
	g.m.sessions.Set(float64(g.sessionsHoldingLocked()))
}

// storeDown marks the store unusable: requests get 503 and every open
// stream ends (discovery must never feed stale data; supervisors fall back
// to polling and keep their routes until their own freshness ends).
func (g *Gateway) storeDown(why string) {
	g.storeWhy.Store(&why)
	g.mu.Lock()
	defer g.mu.Unlock()
	wasUp := g.storeUp.Swap(false)
	g.m.storeUp.Set(0)
	if wasUp {
		g.log.Error("gateway store unavailable; answering 503 until it is back", "store", g.storeKind, "err", why)
	} else {
		g.log.Debug("gateway store still unavailable", "store", g.storeKind, "err", why)
	}
	g.feedDiscoveryLocked(nil)
	g.feedPushLocked(nil, nil)
	g.applied.advance(0) // wake the waiters: they give up
}

// waitApplied waits until the view has the changes up to rev (a write of
// this request), so that the request's answer and the next request on this
// replica see it. It fails when ctx ends or the store goes down.
func (g *Gateway) waitApplied(ctx context.Context, rev int64) error {
	for {
		done, wake := g.applied.reached(rev)
		if done {
			return nil
		}
		if why := g.storeUnusable(); why != "" {
			return fmt.Errorf("the store went down: %s", why)
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("waiting for revision %d: %w", rev, ctx.Err())
		}
	}
}

// storeUnusable returns why the store cannot be used now, or "".
func (g *Gateway) storeUnusable() string {
	if g.storeUp.Load() {
		return ""
	}
	if why := g.storeWhy.Load(); why != nil {
		return "the gateway's store is unavailable: " + *why
	}
	return "the gateway's store is not loaded yet"
}

// unavailable answers 503 with Retry-After: 1.
func (g *Gateway) unavailable(w http.ResponseWriter, endpoint, why string) {
	w.Header().Set("Retry-After", "1")
	g.fail(w, endpoint, http.StatusServiceUnavailable, why)
}

// poolBinding returns the pool sup is bound to ("" when none) and the
// condition under which a binding may be written (mustNotExist when none
// exists).
func (g *Gateway) poolBinding(sup string) (string, int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p, ok := g.pools[sup]; ok {
		return p, anyRevision
	}
	return "", mustNotExist
}

// touchWorkspacesLocked adds the workspaces of sup's advertisement to set.
// g.mu is held.
func (g *Gateway) touchWorkspacesLocked(sup string, set map[string]struct{}) {
	for _, r := range g.installations[sup].routes {
		set[r.Workspace] = struct{}{}
	}
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
