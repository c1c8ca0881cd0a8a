package gateway

import (
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// footprint is what a gateway holds per supervisor id in memory: the
// view's maps, the state's documents and grants, the collector's map, the
// endpoint-policy warnings and the memory store's keys (-1 on etcd).
func (g *Gateway) footprint() map[string]int {
	st := g.state.Load()
	g.mu.Lock()
	out := map[string]int{
		"docs": len(st.docs), "grants": len(st.grants), "installations": len(g.installations),
		"sessions": len(g.sessions), "pools": len(g.pools), "policy_warned": len(g.policyWarned),
	}
	g.mu.Unlock()
	g.push.mu.Lock()
	out["watchers"] = len(g.push.watchers)
	g.push.mu.Unlock()
	out["idle_tracked"] = g.idle.tracked()
	out["store_keys"] = -1
	if ms, ok := g.store.(*memoryStore); ok {
		ms.mu.Lock()
		out["store_keys"] = len(ms.keys)
		ms.mu.Unlock()
	}
	return out
}

// pooledEntry is the instance entry team/<sb> with one web service.
func pooledEntry(sb string) string {
	return `{"workspace":"team","sandbox":"` + sb + `","generation":"g1","services":[{"name":"web","port":8080,"revision":1}]}`
}

// Supervisor ids come and go (pool Pods named after themselves, documents
// written and emptied through the write API, sessions withdrawn or simply
// abandoned): once they are idle for the grace, the store's keys and the
// gateway's maps return to their baseline, on etcd and in memory. What is
// still referenced stays: a document with instances and its id's pool
// binding, an empty document the configuration file names, the binding of
// a member that keeps polling.
func TestIdleSupervisorsCollected(t *testing.T) {
	for _, kind := range []string{"etcd", "memory"} {
		t.Run(kind, func(t *testing.T) {
			checkLeaks(t)
			configPath, tokensPath := replicaFiles(t)
			sections := map[string][]testInstance{
				"sup-1":     {{"team", "demo", []string{"web"}}},
				"cfg-empty": nil,
			}
			writeFileAtomic(t, configPath, sectionsConfig(sections))
			o := replicaOptions{configPath: configPath, tokensPath: tokensPath, sessionTTL: 2 * time.Second, idleGrace: time.Second}
			var keys func() int
			if kind == "etcd" {
				c := startEtcd(t, 1)
				o.etcd, o.prefix = c.endpoints(), "/gc/"
				keys = func() int { n, _ := etcdKeys(t, c.endpoints(), "/gc/"); return n }
			}
			r := newReplica(t, o)
			if keys == nil {
				keys = func() int { return r.g.footprint()["store_keys"] }
			}
			testIdleCollected(t, r, keys)
		})
	}
}

// requestStep is one request of a test and the status it must get.
type requestStep struct {
	what              string
	method, path, tok string
	body              string
	want              int
}

func testIdleCollected(t *testing.T, r *replica, keys func() int) {
	const pods = 100
	// "live" polls every 300 ms throughout, as a running supervisor does
	// (its session never lapses). r.do may not fail the test from another
	// goroutine: the poller reports a failed poll through t.Errorf.
	pollLive := func() int {
		req, err := http.NewRequest(http.MethodGet, r.srv.URL+"/v1/supervisors/live/config?session="+sessionID(1), nil)
		if err != nil {
			return 0
		}
		req.Header.Set("Authorization", "Bearer "+repTokPoolA)
		resp, err := r.client.Do(req)
		if err != nil {
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := pollLive(); code != http.StatusOK {
		t.Fatalf("first poll of live: %d", code)
	}
	stopLive := make(chan struct{})
	var poller sync.WaitGroup
	poller.Go(func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopLive:
				return
			case <-tick.C:
			}
			if code := pollLive(); code != http.StatusOK && code != http.StatusServiceUnavailable {
				t.Errorf("poll of live: %d", code)
			}
		}
	})
	defer func() {
		close(stopLive)
		poller.Wait()
	}()
	if resp, body := r.do(http.MethodGet, "/v1/supervisors/keeper/config?session="+sessionID(2), repTokPoolA, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("keeper: %d %q", resp.StatusCode, body)
	}
	if resp, body := r.do(http.MethodPut, "/v1/supervisors/keeper/instances/team/keeper", repTokAdmin, strings.NewReader(pooledEntry("keeper"))); resp.StatusCode != http.StatusOK {
		t.Fatalf("keeper's document: %d %q", resp.StatusCode, body)
	}
	testutil.Eventually(t, 20*time.Second, "the keeper's session to expire", func() bool {
		r.g.mu.Lock()
		defer r.g.mu.Unlock()
		_, s := r.g.sessions["keeper"]
		return !s
	})
	baseKeys, baseMem := keys(), r.g.footprint()
	t.Logf("baseline: %d keys, memory %v", baseKeys, baseMem)

	// The largest key count seen as ids finish (early ids may be cleaned
	// up before the last ones finish on a slow machine).
	var peakMu sync.Mutex
	peak := 0
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range pods {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			sup, sid := fmt.Sprintf("pod-%03d", i), sessionID(1000+i)
			inst := "/v1/supervisors/" + sup + "/instances/team/" + sup
			steps := []requestStep{
				{"session", http.MethodGet, "/v1/supervisors/" + sup + "/config?session=" + sid, repTokPoolA, "", http.StatusOK},
				{"document", http.MethodPut, inst, repTokAdmin, pooledEntry(sup), http.StatusOK},
				{"advertisement", http.MethodPut, "/v1/supervisors/" + sup + "/installations", repTokPoolA,
					string(advBody(sid, genRoute{testRoute{ws: "team", sb: sup, name: "web", version: 1, expires: time.Now().Add(2 * time.Second)}, "g1"})),
					http.StatusNoContent},
				{"last instance deleted", http.MethodDelete, inst, repTokAdmin, "", http.StatusNoContent},
			}
			if i%2 == 0 {
				// Half withdraw their session; the others just go away.
				steps = append(steps, requestStep{"withdrawal", http.MethodDelete, "/v1/supervisors/" + sup + "/installations?session=" + sid, repTokPoolA, "", http.StatusNoContent})
			}
			for _, s := range steps {
				// A 503 under load is retried, as clients do.
				deadline := time.Now().Add(30 * time.Second)
				for {
					resp, body := r.do(s.method, s.path, s.tok, strings.NewReader(s.body))
					if resp.StatusCode == s.want {
						break
					}
					if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
						t.Errorf("%s %s: %d %q", sup, s.what, resp.StatusCode, body)
						return
					}
					time.Sleep(50 * time.Millisecond) // a client's retry backoff, not a wait for a condition
				}
			}
			n := keys()
			peakMu.Lock()
			peak = max(peak, n)
			peakMu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("while %d supervisor ids came and went: up to %d keys (baseline %d)", pods, peak, baseKeys)
	// Each id left at least its empty document and its pool binding: the
	// counts of removed keys below prove it for every id.
	if peak < baseKeys+2 {
		t.Errorf("%d keys at the peak, want at least %d", peak, baseKeys+2)
	}
	start := time.Now()
	testutil.Eventually(t, 60*time.Second, fmt.Sprintf("the key count back to its baseline %d", baseKeys), func() bool {
		return keys() == baseKeys
	})
	t.Logf("keys back to the baseline %v after the last request (session TTL 2s, routes valid 2s, grace %v)",
		time.Since(start).Round(100*time.Millisecond), r.g.idle.grace)
	testutil.Eventually(t, 10*time.Second, "the memory footprint back to its baseline", func() bool {
		return maps.Equal(r.g.footprint(), baseMem)
	})
	if got := r.metric("applistener_gateway_idle_removed_total", "kind", "document"); got != pods {
		t.Errorf("documents removed: %v, want %d", got, pods)
	}
	if got := r.metric("applistener_gateway_idle_removed_total", "kind", "pool_binding"); got != pods {
		t.Errorf("pool bindings removed: %v, want %d", got, pods)
	}
	// What is referenced stayed.
	st := r.g.state.Load()
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	for _, sup := range []string{"keeper", "live"} {
		if r.g.pools[sup] != "pool-a" {
			t.Errorf("the pool binding of %s is gone", sup)
		}
	}
	for _, sup := range []string{"keeper", "cfg-empty", "sup-1"} {
		if _, ok := st.docs[sup]; !ok {
			t.Errorf("the document of %s is gone", sup)
		}
	}
	if !strings.Contains(r.logs.String(), "idle supervisor id cleaned up") {
		t.Error("no log line for the cleanup")
	}
}
