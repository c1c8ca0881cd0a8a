package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// twoReplicas starts n-member etcd and two gateways on it, sharing the
// configuration and tokens files.
func twoReplicas(t *testing.T, members int, o replicaOptions) (*etcdCluster, *replica, *replica) {
	t.Helper()
	checkLeaks(t)
	c := startEtcd(t, members)
	o.configPath, o.tokensPath = replicaFiles(t)
	o.etcd = c.endpoints()
	a := newReplica(t, o)
	b := newReplica(t, o)
	return c, a, b
}

// An advertisement accepted by one replica reaches a discovery watch on the
// other; a withdrawal on the second leaves the first's watch.
func TestReplicasDiscovery(t *testing.T) {
	_, a, b := twoReplicas(t, 1, replicaOptions{})
	wb := b.discoveryWatch(t, "team", routesTokTeam)
	waitRoutes(wb, time.Second)
	wa := a.discoveryWatch(t, "team", routesTokTeam)
	waitRoutes(wa, time.Second)
	sent := time.Now()
	if code := a.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatal(code)
	}
	at := waitRoutes(wb, 2*time.Second, webHost+"@sup-1")
	t.Logf("advertisement on replica A → discovery watch on replica B: %v", at.Sub(sent))
	if got := b.snapshot("team", routesTokTeam); !slices.Equal(got, []string{webHost + "@sup-1"}) {
		t.Fatalf("B's snapshot %v", got)
	}
	waitRoutes(wa, 2*time.Second, webHost+"@sup-1")
	// Withdrawal on B.
	if resp, body := b.do(http.MethodDelete, "/v1/supervisors/sup-1/installations?session="+sessionID(1), routesTokSup1, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("withdraw: %d %q", resp.StatusCode, body)
	}
	waitRoutes(wa, 2*time.Second)
	// The withdrawal is two writes, the advertisement's removal and then the
	// session's end: A's watch shows the first; its view must have the
	// second before A can refuse the session.
	testutil.Eventually(t, 2*time.Second, "the session withdrawn in A's view", func() bool {
		a.g.mu.Lock()
		defer a.g.mu.Unlock()
		s, ok := a.g.sessions["sup-1"]
		return ok && !s.holds()
	})
	if code := a.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusConflict {
		t.Errorf("advertisement of a withdrawn session on the other replica: %d", code)
	}
}

// A write API request on one replica reaches a push stream on the other;
// a newer session on one replica ends the older session's stream on the
// other.
func TestReplicasWriteAPIAndSupersession(t *testing.T) {
	_, a, b := twoReplicas(t, 1, replicaOptions{})
	stream, streamResp := b.openConfigWatch(t, "sup-1", routesTokSup1, "session="+sessionID(1))
	first := stream.nextDocument(2 * time.Second)
	order := sessionOrder(t, streamResp)
	if !strings.Contains(first.text, `"sandbox":"demo"`) {
		t.Fatalf("first document %q", first.text)
	}
	entry := `{"workspace":"team","sandbox":"api","generation":"1","services":[{"name":"web","port":8081,"revision":1}]}`
	sent := time.Now()
	resp, body := a.do(http.MethodPut, "/v1/supervisors/sup-1/instances/team/api", repTokAdmin, strings.NewReader(entry))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT on A: %d %q", resp.StatusCode, body)
	}
	l := stream.nextDocument(2 * time.Second)
	t.Logf("write API on replica A → push stream on replica B: %v", l.at.Sub(sent))
	if !strings.Contains(l.text, `"sandbox":"api"`) || !strings.Contains(l.text, `"sandbox":"demo"`) {
		t.Fatalf("pushed %q", l.text)
	}
	// Both replicas answer the new revision to a poll.
	var put struct{ Revision string }
	if err := json.Unmarshal([]byte(body), &put); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*replica{a, b} {
		resp, _ := r.do(http.MethodGet, "/v1/supervisors/sup-1/config?session="+sessionID(1), routesTokSup1, nil)
		if resp.Header.Get("ETag") != `"`+put.Revision+`"` {
			t.Errorf("ETag %q, want the revision %q", resp.Header.Get("ETag"), put.Revision)
		}
	}
	// A new session on A supersedes the stream's session on B.
	if resp, body := a.do(http.MethodGet, "/v1/supervisors/sup-1/config?session="+sessionID(2), routesTokSup1, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("poll of the new session: %d %q", resp.StatusCode, body)
	}
	stream.waitEnd(2 * time.Second)
	if resp, _ := b.do(http.MethodGet, "/v1/supervisors/sup-1/config?session="+sessionID(1)+"&order="+order, routesTokSup1, nil); resp.StatusCode != http.StatusConflict {
		t.Errorf("the superseded session on B: %d", resp.StatusCode)
	}
}

// A session superseded by 100 later sessions, opened on either replica,
// never takes its supervisor id back on either (issue 23), also once its
// own record would long have been forgotten by a bounded memory.
func TestReplicasSupersededByManyNeverReturns(t *testing.T) {
	_, a, b := twoReplicas(t, 1, replicaOptions{})
	stream, streamResp := a.openConfigWatch(t, "sup-1", routesTokSup1, "session="+sessionID(1))
	stream.nextDocument(2 * time.Second)
	order := sessionOrder(t, streamResp)
	last := supersedeMany(t, []*replica{a, b}, "sup-1", routesTokSup1, 2, 100)
	stream.waitEnd(2 * time.Second)
	for _, r := range []*replica{a, b} {
		checkSuperseded(t, r, "sup-1", routesTokSup1, sessionID(1), order)
		q := "session=" + sessionID(101) + "&order=" + last
		if resp, body := r.do(http.MethodGet, "/v1/supervisors/sup-1/config?"+q, routesTokSup1, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("the current session: %d %q", resp.StatusCode, body)
		}
	}
}

// A pool token binds the supervisor ids it opens sessions for; another
// pool's token gets 403 for them on every replica; a removed pool token
// unpublishes its members.
func TestReplicasPoolBinding(t *testing.T) {
	_, a, b := twoReplicas(t, 1, replicaOptions{})
	resp, body := a.do(http.MethodGet, "/v1/supervisors/host-7/config?session="+sessionID(7), repTokPoolA, nil)
	if resp.StatusCode != http.StatusOK || body != emptyPoolDocument+"\n" {
		t.Fatalf("first pool request: %d %q", resp.StatusCode, body)
	}
	for _, r := range []*replica{a, b} {
		if resp, body := r.do(http.MethodGet, "/v1/supervisors/host-7/config", repTokPoolB, nil); resp.StatusCode != http.StatusForbidden {
			t.Errorf("another pool's token: %d %q", resp.StatusCode, body)
		}
	}
	if resp, _ := b.do(http.MethodGet, "/v1/supervisors/host-7/config?session="+sessionID(7), repTokPoolA, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("the bound pool on the other replica: %d", resp.StatusCode)
	}
	if resp, _ := a.do(http.MethodGet, "/v1/supervisors/sup-1/config", repTokPoolA, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a pool token for an id with its own token: %d", resp.StatusCode)
	}
	// Members: the admin and the pool itself may read them.
	resp, body = b.do(http.MethodGet, "/v1/pools/pool-a/members", repTokAdmin, nil)
	var m struct {
		Members []poolMember `json:"members"`
	}
	if err := json.Unmarshal([]byte(body), &m); resp.StatusCode != http.StatusOK || err != nil ||
		len(m.Members) != 1 || m.Members[0].Supervisor != "host-7" || m.Members[0].Session != sessionID(7) || m.Members[0].Source != "127.0.0.1" {
		t.Fatalf("members: %d %q", resp.StatusCode, body)
	}
	if resp, _ := a.do(http.MethodGet, "/v1/pools/pool-a/members", repTokPoolA, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("members read by the pool: %d", resp.StatusCode)
	}
	if resp, _ := a.do(http.MethodGet, "/v1/pools/pool-a/members", repTokPoolB, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("members read by another pool: %d", resp.StatusCode)
	}
	// A document for the member, an advertisement, published.
	entry := `{"workspace":"team","sandbox":"pooled","generation":"g1","services":[{"name":"web","port":8080,"revision":1}]}`
	if resp, body := a.do(http.MethodPut, "/v1/supervisors/host-7/instances/team/pooled", repTokAdmin, strings.NewReader(entry)); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %d %q", resp.StatusCode, body)
	}
	route := genRoute{testRoute{ws: "team", sb: "pooled", name: "web", version: 1, expires: time.Now().Add(time.Minute)}, "g1"}
	if code := b.advertise("host-7", repTokPoolA, sessionID(7), route); code != http.StatusNoContent {
		t.Fatal(code)
	}
	const host = "team--pooled--web.apps.test@host-7"
	testutil.Eventually(t, 2*time.Second, "the pool member published on A", func() bool {
		return slices.Equal(a.snapshot("team", routesTokTeam), []string{host})
	})
	// The pool token leaves the tokens file: its members are unpublished.
	a.g.reloadMu.Lock()
	path := a.g.tokensPath
	a.g.reloadMu.Unlock()
	writeFileAtomic(t, path, strings.Replace(replicaTokens(), `{"token": "`+repTokPoolA+`", "pool": "pool-a"},`, "", 1))
	for _, r := range []*replica{a, b} {
		if err := r.g.Reload(); err != nil {
			t.Fatal(err)
		}
		if got := r.snapshot("team", routesTokTeam); len(got) != 0 {
			t.Errorf("published after the pool token was removed: %v", got)
		}
	}
}

// Quorum loss: with 2 of 3 members stopped, a replica answers 503 and ends
// its discovery watches within a few seconds; when they return it recovers
// by itself and publishes again.
func TestReplicasQuorumLoss(t *testing.T) {
	c, a, _ := twoReplicas(t, 3, replicaOptions{})
	if code := a.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatal(code)
	}
	w := a.discoveryWatch(t, "team", routesTokTeam)
	waitRoutes(w, time.Second, webHost+"@sup-1")
	stream, _ := a.openConfigWatch(t, "sup-1", routesTokSup1, "session="+sessionID(1))
	stream.nextDocument(time.Second)

	lost := time.Now()
	c.stop(1)
	c.stop(2)
	end := w.waitEnd(15 * time.Second)
	t.Logf("discovery watch ended %v after quorum was lost", end.Sub(lost).Round(time.Millisecond))
	stream.waitEnd(5 * time.Second)
	// The watches can end a moment before the replica has classified the
	// store as down (the member it talks to learns of the lost quorum
	// only after its election timeout, and the replica's reload may
	// still succeed meanwhile): wait for the verdict, then check what
	// clients get.
	testutil.Eventually(t, 15*time.Second, "store_up 0 without quorum", func() bool {
		return a.metric("applistener_gateway_store_up") == 0
	})
	for _, path := range []string{"/v1/workspaces/team/service-routes", "/v1/supervisors/sup-1/config?session=" + sessionID(1)} {
		resp, body := a.do(http.MethodGet, path, tokenFor(path), nil)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("GET %s without quorum: %d %q", path, resp.StatusCode, body)
		}
	}
	if code := a.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(2)); code != http.StatusServiceUnavailable {
		t.Errorf("advertisement without quorum: %d", code)
	}
	if ok, why := a.g.Ready(); ok || why == "" {
		t.Errorf("Ready() = %v, %q", ok, why)
	}

	back := time.Now()
	c.start(1, "existing")
	c.start(2, "existing")
	testutil.Eventually(t, 30*time.Second, "the replica to recover", func() bool { ok, _ := a.g.Ready(); return ok })
	t.Logf("replica usable again %v after the members returned", time.Since(back).Round(time.Millisecond))
	// The advertisement survived in etcd (its session is renewed by the
	// supervisor's next request).
	if code := a.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(3)); code != http.StatusNoContent {
		t.Fatalf("advertisement after recovery: %d", code)
	}
	if got := a.snapshot("team", routesTokTeam); !slices.Equal(got, []string{webHost + "@sup-1"}) {
		t.Fatalf("after recovery: %v", got)
	}
	if a.metric("applistener_gateway_store_up") != 1 {
		t.Error("store_up is not 1")
	}
}

// tokenFor returns the token a request path needs in the replica tests.
func tokenFor(path string) string {
	if strings.HasPrefix(path, "/v1/workspaces/") {
		return routesTokTeam
	}
	return routesTokSup1
}

// A replica that starts while etcd is unreachable answers 503 and loads the
// store once etcd is up.
func TestReplicaStartsWithoutEtcd(t *testing.T) {
	needEtcd(t)
	checkLeaks(t)
	configPath, tokensPath := replicaFiles(t)
	g, err := New(Config{ConfigPath: configPath, TokensPath: tokensPath,
		Etcd: &EtcdConfig{Endpoints: []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}, DialTimeout: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if ok, why := g.Ready(); ok || !strings.Contains(why, "not loaded") {
		t.Errorf("Ready() before Run = %v, %q", ok, why)
	}
}

// etcdKeys returns the number of keys under prefix and their total size
// (keys and values).
func etcdKeys(t testing.TB, endpoints []string, prefix string) (int, int) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		n += len(kv.Key) + len(kv.Value)
	}
	return len(resp.Kvs), n
}

// The footprint of 1,000 installed routes in etcd: 100 supervisors with 10
// routes each, their documents (from the configuration file), sessions,
// pool bindings and advertisements.
func TestEtcdFootprint(t *testing.T) {
	checkLeaks(t)
	c := startEtcd(t, 1)
	configPath, tokensPath := replicaFiles(t)
	const sups, perSup = 100, 10
	sections := make(map[string][]testInstance, sups)
	for s := range sups {
		sup := fmt.Sprintf("host-%03d", s)
		for i := range perSup {
			sections[sup] = append(sections[sup], testInstance{"team", fmt.Sprintf("s%03d-%02d", s, i), []string{"web"}})
		}
	}
	writeFileAtomic(t, configPath, sectionsConfig(sections))
	// Sessions live long enough for the count below on a slow machine
	// (they are not renewed here).
	r := newReplica(t, replicaOptions{etcd: c.endpoints(), configPath: configPath, tokensPath: tokensPath, prefix: "/fp/", sessionTTL: 5 * time.Minute})
	// 10 advertising at a time: etcd batches their writes.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 10)
	codes := make([]int, sups)
	for s := range sups {
		var rs []genRoute
		for i := range perSup {
			rs = append(rs, genRoute{testRoute{ws: "team", sb: fmt.Sprintf("s%03d-%02d", s, i), name: "web", version: uint64(i + 1),
				expires: time.Now().Add(time.Minute), host: fmt.Sprintf("10.1.%d.%d", s/250, s%250+1), domain: "apps.example.com"}, "1"})
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// A 503 (etcd or the replica's watch slow on a loaded
			// machine) is retried, as a supervisor retries it.
			deadline := time.Now().Add(60 * time.Second)
			for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
				codes[s] = r.advertise(fmt.Sprintf("host-%03d", s), repTokPoolA, sessionID(s+1), rs...)
				if codes[s] != http.StatusServiceUnavailable || time.Now().After(deadline) {
					break
				}
				time.Sleep(backoff) // the supervisor's retry backoff, not a wait for a condition
			}
		})
	}
	wg.Wait()
	for s, code := range codes {
		if code != http.StatusNoContent {
			t.Fatalf("advertisement of host-%03d: %d", s, code)
		}
	}
	// The discovery view follows etcd through a watch: wait for it.
	var routes int
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%d routes published", sups*perSup), func() bool {
		routes = len(r.snapshot("team", routesTokTeam))
		return routes == sups*perSup
	})
	keys, size := etcdKeys(t, c.endpoints(), "/fp/")
	t.Logf("etcd footprint of %d installed routes (%d supervisors × %d): %d keys, %d bytes (keys and values; %d per route)",
		routes, sups, perSup, keys, size, size/routes)
	if keys != 4*sups+1 {
		t.Errorf("%d keys, want %d (document, session, advertisement, pool binding per supervisor, and the replica's liveness key)", keys, 4*sups+1)
	}
	if size > 2<<20 {
		t.Errorf("%d bytes for 1,000 routes", size)
	}
}

// A value larger than etcd accepts is refused with 413, not retried as an
// outage.
func TestReplicaValueTooLarge(t *testing.T) {
	checkLeaks(t)
	c := startEtcd(t, 1)
	configPath, tokensPath := replicaFiles(t)
	r := newReplica(t, replicaOptions{etcd: c.endpoints(), configPath: configPath, tokensPath: tokensPath})
	var rs []genRoute
	for i := range 8000 {
		rs = append(rs, genRoute{testRoute{ws: "team", sb: "demo", name: fmt.Sprintf("s%d", i), version: 1,
			expires: time.Now().Add(time.Minute)}, "1"})
	}
	body := advBody(sessionID(1), rs...)
	if len(body) <= etcdMaxValueBytes || len(body) > MaxInstallationsBytes {
		t.Fatalf("body of %d bytes", len(body))
	}
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), rs...); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("advertisement of %d bytes: %d", len(body), code)
	}
	if ok, _ := r.g.Ready(); !ok {
		t.Error("the replica went down")
	}
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Errorf("a normal advertisement afterwards: %d", code)
	}
}
