package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	"github.com/applistener/applistener/control/internal/ndjson"
)

// openConfigWatch opens a push stream of sup on r with the query (session,
// keepalive) and returns it with the response.
func (r *replica) openConfigWatch(t *testing.T, sup, token, query string) (*configWatch, *http.Response) {
	t.Helper()
	resp := openWatch(t, r.client, r.srv.URL+"/v1/supervisors/"+sup+"/config?watch=1&"+query, token)
	w := &configWatch{t: t, resp: resp, lines: make(chan streamLine, 1024), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.lines)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			w.lines <- streamLine{text: sc.Text(), at: time.Now()}
		}
	}()
	t.Cleanup(w.close)
	return w, resp
}

// discoveryWatch opens a discovery watch of ws on r.
func (r *replica) discoveryWatch(t *testing.T, ws, token string) *routesWatch {
	t.Helper()
	resp := openWatch(t, r.client, r.srv.URL+"/v1/workspaces/"+ws+"/service-routes?watch=1", token)
	w := &routesWatch{t: t, resp: resp, lines: make(chan streamLine, 4096), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.lines)
		br := bufio.NewReaderSize(resp.Body, 1<<20)
		for {
			line, err := ndjson.ReadLine(br, 64<<20)
			if err != nil {
				if !errors.Is(err, io.EOF) {
					w.err = err
				}
				return
			}
			w.lines <- streamLine{text: strings.TrimSuffix(string(line), "\n"), at: time.Now()}
		}
	}()
	t.Cleanup(w.close)
	return w
}

// waitRoutes reads snapshot lines until one equals want.
func waitRoutes(w *routesWatch, within time.Duration, want ...string) time.Time {
	w.t.Helper()
	if want == nil {
		want = []string{}
	}
	deadline := time.Now().Add(within)
	for {
		s, at := w.next(time.Until(deadline))
		got := []string{}
		for _, r := range s.Routes {
			got = append(got, r.Hostname+"@"+r.Supervisor)
		}
		if slices.Equal(got, want) {
			return at
		}
	}
}

const webHost = "team--demo--web.apps.test"

func newMemoryReplica(t *testing.T, o replicaOptions) *replica {
	t.Helper()
	checkLeaks(t)
	if o.configPath == "" {
		o.configPath, o.tokensPath = replicaFiles(t)
	}
	return newReplica(t, o)
}

// A push request gets the keepalive it asks for, clamped to
// [--keepalive-min, --keepalive], in X-Applistener-Keepalive; keepalives
// come at that interval.
func TestSessionKeepaliveGrant(t *testing.T) {
	r := newMemoryReplica(t, replicaOptions{keepalive: time.Second, keepaliveMin: 50 * time.Millisecond})
	for _, c := range []struct{ ask, want string }{
		{"", "1s"}, {"keepalive=100ms", "100ms"}, {"keepalive=10ms", "50ms"}, {"keepalive=1m", "1s"},
	} {
		w, resp := r.openConfigWatch(t, "sup-1", routesTokSup1, "session="+sessionID(1)+"&"+c.ask)
		if got := resp.Header.Get(KeepaliveHeader); got != c.want {
			t.Errorf("asked %q: granted %q, want %q", c.ask, got, c.want)
		}
		w.nextDocument(time.Second)
		if c.want == "50ms" {
			start := time.Now()
			for range 3 {
				if l := w.next(time.Second); l.text != `{"keepalive":true}` {
					t.Fatalf("line %q, want a keepalive", l.text)
				}
			}
			if d := time.Since(start); d < 100*time.Millisecond || d > 900*time.Millisecond {
				t.Errorf("3 keepalives at 50ms took %v", d)
			}
		}
		w.close()
	}
	resp, body := r.do(http.MethodGet, "/v1/supervisors/sup-1/config?watch=1&keepalive=soon", routesTokSup1, nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad keepalive: %d %q", resp.StatusCode, body)
	}
	resp, body = r.do(http.MethodGet, "/v1/supervisors/sup-1/config?session=NOTHEX", routesTokSup1, nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad session: %d %q", resp.StatusCode, body)
	}
	checkOneLine(t, http.StatusBadRequest, body)
}

// A newer session supersedes the older at once: its push stream ends, its
// requests get 409, its advertisement is never published again.
func TestSessionSupersession(t *testing.T) {
	r := newMemoryReplica(t, replicaOptions{})
	old, oldResp := r.openConfigWatch(t, "sup-1", routesTokSup1, "session="+sessionID(1))
	old.nextDocument(time.Second)
	oldOrder := sessionOrder(t, oldResp)
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatalf("advertise: %d", code)
	}
	if got := r.snapshot("team", routesTokTeam); !slices.Equal(got, []string{webHost + "@sup-1"}) {
		t.Fatalf("published %v", got)
	}
	// The new process polls with its own session.
	resp, body := r.do(http.MethodGet, "/v1/supervisors/sup-1/config?session="+sessionID(2), routesTokSup1, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("new session poll: %d %q", resp.StatusCode, body)
	}
	old.waitEnd(time.Second)
	// The old session's advertisement is no longer published, before the
	// new one advertises anything.
	if got := r.snapshot("team", routesTokTeam); len(got) != 0 {
		t.Fatalf("published after supersession: %v", got)
	}
	checkSuperseded(t, r, "sup-1", routesTokSup1, sessionID(1), oldOrder)
	if code := r.advertise("sup-1", routesTokSup1, sessionID(2), webRoute(2)); code != http.StatusNoContent {
		t.Fatalf("advertisement of the new session: %d", code)
	}
	if got := r.snapshot("team", routesTokTeam); !slices.Equal(got, []string{webHost + "@sup-1"}) {
		t.Fatalf("published %v", got)
	}
	// A request without a session (an old supervisor) does not take the id
	// back: served its document, its advertisement refused.
	if resp, _ := r.do(http.MethodGet, "/v1/supervisors/sup-1/config", routesTokSup1, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("poll without a session: %d", resp.StatusCode)
	}
	if code := r.advertise("sup-1", routesTokSup1, "", webRoute(3)); code != http.StatusConflict {
		t.Errorf("advertisement without a session while one holds: %d", code)
	}
	if r.metric("applistener_gateway_sessions") != 1 {
		t.Errorf("sessions gauge %v", r.metric("applistener_gateway_sessions"))
	}
}

// sessionOrder returns the order the gateway told a session in resp
// (SessionOrderHeader); it fails the test when there is none.
func sessionOrder(t testing.TB, resp *http.Response) string {
	t.Helper()
	o := resp.Header.Get(SessionOrderHeader)
	if n, err := strconv.ParseInt(o, 10, 64); err != nil || n <= 0 {
		t.Fatalf("%s %q, want a positive integer", SessionOrderHeader, o)
	}
	return o
}

// checkSuperseded checks that session sid of sup, superseded, is refused
// with 409 on r when it names its order (as the supervisor's client does):
// its poll, its push stream and its advertisement.
func checkSuperseded(t testing.TB, r *replica, sup, token, sid, order string) {
	t.Helper()
	base := "/v1/supervisors/" + sup
	q := "session=" + sid + "&order=" + order
	for _, path := range []string{base + "/config?" + q, base + "/config?watch=1&" + q} {
		// Only the status is read: a watch that is wrongly accepted
		// streams on and must not hold the test up.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		_ = resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusConflict {
			t.Errorf("%s of the superseded session: %d", path, resp.StatusCode)
		}
	}
	resp, body := r.do(http.MethodPut, base+"/installations?order="+order, token, bytes.NewReader(advBody(sid, webRoute(1))))
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("advertisement of the superseded session: %d %q", resp.StatusCode, body)
	}
}

// supersedeMany opens n sessions of sup one after the other, as n new
// processes would (each first without an order, then naming the order it
// was told), spread over the replicas in turn, starting from session id
// first. It returns the last session's order.
func supersedeMany(t testing.TB, rs []*replica, sup, token string, first, n int) string {
	t.Helper()
	var order string
	prev := int64(0)
	for i := range n {
		r := rs[i%len(rs)]
		sid := sessionID(first + i)
		resp, body := r.do(http.MethodGet, "/v1/supervisors/"+sup+"/config?session="+sid, token, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("session %d's first poll: %d %q", i, resp.StatusCode, body)
		}
		order = sessionOrder(t, resp)
		if n, _ := strconv.ParseInt(order, 10, 64); n <= prev {
			t.Fatalf("session %d got order %d after %d: orders must grow", i, n, prev)
		} else {
			prev = n
		}
		resp, body = r.do(http.MethodGet, "/v1/supervisors/"+sup+"/config?session="+sid+"&order="+order, token, nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(SessionOrderHeader) != order {
			t.Fatalf("session %d's poll with its order: %d %q, order %q want %q", i, resp.StatusCode, body,
				resp.Header.Get(SessionOrderHeader), order)
		}
	}
	return order
}

// A session superseded by 100 later sessions never takes its supervisor id
// back (issue 23): the gateway decides by the order stored with the
// session, not by a memory of recent ids.
func TestSessionSupersededByManyNeverReturns(t *testing.T) {
	r := newMemoryReplica(t, replicaOptions{})
	old, oldResp := r.openConfigWatch(t, "sup-1", routesTokSup1, "session="+sessionID(1))
	old.nextDocument(time.Second)
	oldOrder := sessionOrder(t, oldResp)
	last := supersedeMany(t, []*replica{r}, "sup-1", routesTokSup1, 2, 100)
	old.waitEnd(time.Second)
	checkSuperseded(t, r, "sup-1", routesTokSup1, sessionID(1), oldOrder)
	// The current session still holds and keeps its order.
	q := "session=" + sessionID(101) + "&order=" + last
	if resp, body := r.do(http.MethodGet, "/v1/supervisors/sup-1/config?"+q, routesTokSup1, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("the current session: %d %q", resp.StatusCode, body)
	}
	// Every session but the last was superseded, however long ago.
	for _, i := range []int{2, 50, 99, 100} {
		resp, _ := r.do(http.MethodGet, "/v1/supervisors/sup-1/config?session="+sessionID(i)+"&order=1", routesTokSup1, nil)
		if resp.StatusCode != http.StatusConflict {
			t.Errorf("session %d: %d", i, resp.StatusCode)
		}
	}
	if r.metric("applistener_gateway_sessions") != 1 {
		t.Errorf("sessions gauge %v", r.metric("applistener_gateway_sessions"))
	}
}

// DELETE .../installations?session= removes the session's routes from
// discovery at once and ends the session.
func TestSessionWithdrawal(t *testing.T) {
	r := newMemoryReplica(t, replicaOptions{})
	w := r.discoveryWatch(t, "team", routesTokTeam)
	waitRoutes(w, time.Second)
	stream, _ := r.openConfigWatch(t, "sup-1", routesTokSup1, "session="+sessionID(1))
	stream.nextDocument(time.Second)
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatalf("advertise: %d", code)
	}
	waitRoutes(w, time.Second, webHost+"@sup-1")
	// Another session id removes nothing.
	resp, body := r.do(http.MethodDelete, "/v1/supervisors/sup-1/installations?session="+sessionID(9), routesTokSup1, nil)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("withdraw another session: %d %q", resp.StatusCode, body)
	}
	if got := r.snapshot("team", routesTokTeam); len(got) != 1 {
		t.Fatalf("a foreign withdrawal removed routes: %v", got)
	}
	sent := time.Now()
	resp, body = r.do(http.MethodDelete, "/v1/supervisors/sup-1/installations?session="+sessionID(1), routesTokSup1, nil)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("withdraw: %d %q", resp.StatusCode, body)
	}
	if got := r.snapshot("team", routesTokTeam); len(got) != 0 {
		t.Fatalf("published after the withdrawal: %v", got)
	}
	at := waitRoutes(w, time.Second)
	t.Logf("withdrawal reached the discovery watch in %v", at.Sub(sent))
	stream.waitEnd(time.Second)
	// Again: still 204. A late advertisement of the session is refused.
	if resp, _ := r.do(http.MethodDelete, "/v1/supervisors/sup-1/installations?session="+sessionID(1), routesTokSup1, nil); resp.StatusCode != http.StatusNoContent {
		t.Errorf("second withdrawal: %d", resp.StatusCode)
	}
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusConflict {
		t.Errorf("advertisement after the withdrawal: %d", code)
	}
	if resp, _ := r.do(http.MethodDelete, "/v1/supervisors/sup-1/installations?session="+sessionID(1), routesTokSup2, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("withdrawal with another supervisor's token: %d", resp.StatusCode)
	}
	if r.metric("applistener_gateway_requests_total", "endpoint", endpointWithdraw, "code", "204") != 3 {
		t.Errorf("withdraw requests %v", r.metric("applistener_gateway_requests_total", "endpoint", endpointWithdraw, "code", "204"))
	}
}

// A session that is neither renewed nor streaming expires after the
// session TTL: its routes leave discovery, and the other supervisor
// advertising the same hostname takes over at once.
func TestSessionExpiryTakeover(t *testing.T) {
	checkLeaks(t)
	const ttl = 600 * time.Millisecond
	configPath, tokensPath := replicaFiles(t)
	writeFileAtomic(t, configPath, sectionsConfig(map[string][]testInstance{
		"sup-1": {{"team", "demo", []string{"web"}}},
		"sup-2": {{"team", "demo", []string{"web"}}},
	}))
	r := newReplica(t, replicaOptions{configPath: configPath, tokensPath: tokensPath, sessionTTL: ttl})
	w := r.discoveryWatch(t, "team", routesTokTeam)
	waitRoutes(w, time.Second)
	two := webRoute(1)
	two.host = "10.0.0.2"
	if code := r.advertise("sup-2", routesTokSup2, sessionID(2), two); code != http.StatusNoContent {
		t.Fatal(code)
	}
	waitRoutes(w, time.Second, webHost+"@sup-2")
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatal(code)
	}
	// sup-1 holds its session with a push stream; sup-2 goes silent.
	stream, _ := r.openConfigWatch(t, "sup-1", routesTokSup1, "session="+sessionID(1))
	stream.nextDocument(time.Second)
	silent := time.Now()
	at := waitRoutes(w, 4*ttl, webHost+"@sup-1")
	took := at.Sub(silent)
	t.Logf("takeover %v after the incumbent went silent (session TTL %v)", took, ttl)
	if took < ttl/2 {
		t.Errorf("takeover after %v, before the session TTL %v", took, ttl)
	}
	// The stream keeps sup-1's session alive well past the TTL.
	w.noLine(3 * ttl)
	if got := r.snapshot("team", routesTokTeam); !slices.Equal(got, []string{webHost + "@sup-1"}) {
		t.Fatalf("published %v", got)
	}
}

// The advertised generation must be the document's; only supervisors
// without a session may leave it out.
func TestSessionGenerationMismatch(t *testing.T) {
	r := newMemoryReplica(t, replicaOptions{})
	stale := webRoute(1)
	stale.generation = "2"
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), stale); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if got := r.snapshot("team", routesTokTeam); len(got) != 0 {
		t.Fatalf("generation 2 against the document's 1 published: %v", got)
	}
	none := webRoute(1)
	none.generation = ""
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), none); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if got := r.snapshot("team", routesTokTeam); len(got) != 0 {
		t.Fatalf("no generation from a session-bound supervisor published: %v", got)
	}
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if got := r.snapshot("team", routesTokTeam); !slices.Equal(got, []string{webHost + "@sup-1"}) {
		t.Fatalf("matching generation: %v", got)
	}
	// An older supervisor (no session) without a generation is accepted.
	if code := r.advertise("sup-2", routesTokSup2, "", genRoute{testRoute{ws: "team", sb: "other", name: "web", version: 1, expires: time.Now().Add(time.Minute)}, ""}); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if got := r.snapshot("team", routesTokTeam); len(got) != 2 {
		t.Fatalf("a sessionless advertisement without a generation: %v", got)
	}
}

// Rotating a supervisor's token unpublishes what the old token advertised
// until the new token advertises again (the credential epoch).
func TestSessionTokenRotation(t *testing.T) {
	checkLeaks(t)
	configPath, tokensPath := replicaFiles(t)
	r := newReplica(t, replicaOptions{configPath: configPath, tokensPath: tokensPath})
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if got := r.snapshot("team", routesTokTeam); len(got) != 1 {
		t.Fatalf("published %v", got)
	}
	const rotated = "disc-sup-1-ROTATED-S3CRET"
	writeFileAtomic(t, tokensPath, strings.Replace(replicaTokens(), routesTokSup1, rotated, 1))
	if err := r.g.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := r.snapshot("team", routesTokTeam); len(got) != 0 {
		t.Fatalf("published after the token rotation: %v", got)
	}
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusUnauthorized {
		t.Errorf("advertisement with the old token: %d", code)
	}
	if code := r.advertise("sup-1", rotated, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if got := r.snapshot("team", routesTokTeam); len(got) != 1 {
		t.Fatalf("not published after a fresh advertisement: %v", got)
	}
	if strings.Contains(r.logs.String(), rotated) {
		t.Error("the rotated token appears in the logs")
	}
}

// --endpoint-policy=source publishes only endpoints on the advertisement's
// own source address; refusals are counted and warned about once.
func TestEndpointPolicySource(t *testing.T) {
	r := newMemoryReplica(t, replicaOptions{policy: EndpointPolicySource})
	foreign := webRoute(1) // endpoint 10.0.0.1, sent from 127.0.0.1
	for range 2 {
		if code := r.advertise("sup-1", routesTokSup1, sessionID(1), foreign); code != http.StatusNoContent {
			t.Fatal(code)
		}
	}
	if got := r.snapshot("team", routesTokTeam); len(got) != 0 {
		t.Fatalf("a foreign endpoint was published: %v", got)
	}
	if n := r.metric("applistener_gateway_endpoint_policy_refused_total"); n != 2 {
		t.Errorf("refused counter %v, want 2", n)
	}
	if n := strings.Count(r.logs.String(), "refused by the endpoint policy"); n != 1 {
		t.Errorf("%d warnings, want 1 per supervisor and endpoint", n)
	}
	own := webRoute(2)
	own.host = "127.0.0.1"
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), own); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if got := r.snapshot("team", routesTokTeam); !slices.Equal(got, []string{webHost + "@sup-1"}) {
		t.Fatalf("the source's own endpoint: %v", got)
	}
}

func TestEndpointPolicyParse(t *testing.T) {
	for _, c := range []struct {
		policy, source, host string
		ok                   bool
	}{
		{"any", "127.0.0.1", "10.0.0.1", true},
		{"", "127.0.0.1", "pod.example", true},
		{"source", "10.0.0.1", "10.0.0.1", true},
		{"source", "::ffff:10.0.0.1", "10.0.0.1", true},
		{"source", "10.0.0.2", "10.0.0.1", false},
		{"source", "10.0.0.1", "pod.example", false},
		{"cidr:10.0.0.0/8,fd00::/8", "1.2.3.4", "10.9.9.9", true},
		{"cidr:10.0.0.0/8,fd00::/8", "1.2.3.4", "fd00::1", true},
		{"cidr:10.0.0.0/8", "10.0.0.1", "192.168.0.1", false},
	} {
		p, err := parseEndpointPolicy(c.policy)
		if err != nil {
			t.Fatalf("%q: %v", c.policy, err)
		}
		if got := p.allows(c.source, c.host); got != c.ok {
			t.Errorf("%q from %s to %s: %v, want %v", c.policy, c.source, c.host, got, c.ok)
		}
	}
	for _, bad := range []string{"all", "cidr:", "cidr:10.0.0.0/33", "source,any"} {
		if ParseEndpointPolicy(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The write API: admin tokens PUT, DELETE and GET instances; every write is
// validated like a document entry and pushed to the supervisor's session
// at once.
func TestWriteAPI(t *testing.T) {
	r := newMemoryReplica(t, replicaOptions{})
	const path = "/v1/supervisors/sup-9/instances"
	entry := `{"workspace":"team","sandbox":"nine","generation":"4","connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"web","port":8080,"revision":1}]}`
	// sup-9 has no token of its own: it is a member of pool-a.
	stream, _ := r.openConfigWatch(t, "sup-9", repTokPoolA, "session="+sessionID(9))
	if l := stream.nextDocument(time.Second); l.text != emptyPoolDocument {
		t.Fatalf("first document %q", l.text)
	}
	for _, c := range []struct {
		name, method, path, token, body string
		code                            int
	}{
		{"no token", "PUT", path + "/team/nine", "", entry, 401},
		{"supervisor token", "PUT", path + "/team/nine", routesTokSup1, entry, 403},
		{"pool token", "PUT", path + "/team/nine", repTokPoolA, entry, 403},
		{"path differs", "PUT", path + "/team/ten", repTokAdmin, entry, 400},
		{"unknown field", "PUT", path + "/team/nine", repTokAdmin, strings.Replace(entry, `"generation"`, `"generatoin"`, 1), 400},
		{"bad port", "PUT", path + "/team/nine", repTokAdmin, strings.Replace(entry, "8080", "0", 1), 400},
		{"unknown access mode", "PUT", path + "/team/nine", repTokAdmin, strings.Replace(entry, `"revision":1}`, `"revision":1,"access":{"mode":"secret"}}`, 1), 400},
		{"not JSON", "PUT", path + "/team/nine", repTokAdmin, "{", 400},
		{"bad name", "PUT", path + "/team/Nine", repTokAdmin, entry, 400},
		{"delete absent", "DELETE", path + "/team/nine", repTokAdmin, "", 404},
		{"wrong method", "POST", path + "/team/nine", repTokAdmin, entry, 405},
	} {
		resp, body := r.do(c.method, c.path, c.token, strings.NewReader(c.body))
		if resp.StatusCode != c.code {
			t.Errorf("%s: %d %q, want %d", c.name, resp.StatusCode, body, c.code)
			continue
		}
		checkOneLine(t, c.code, body)
	}
	sent := time.Now()
	resp, body := r.do(http.MethodPut, path+"/team/nine", repTokAdmin, strings.NewReader(entry))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %d %q", resp.StatusCode, body)
	}
	var put struct{ Revision string }
	if err := json.Unmarshal([]byte(body), &put); err != nil || put.Revision == "" {
		t.Fatalf("PUT answer %q", body)
	}
	l := stream.nextDocument(10 * time.Second)
	t.Logf("write API → push stream in %v", l.at.Sub(sent))
	want := `{"revision":"` + put.Revision + `","instances":[` + entry + `]}`
	if l.text != want {
		t.Fatalf("pushed %q, want %q", l.text, want)
	}
	resp, body = r.do(http.MethodGet, path, repTokAdmin, nil)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(body) != want {
		t.Fatalf("GET: %d %q", resp.StatusCode, body)
	}
	// A second instance, then a replacement: one entry per instance.
	other := strings.Replace(entry, `"nine"`, `"eight"`, 1)
	if resp, body := r.do(http.MethodPut, path+"/team/eight", repTokAdmin, strings.NewReader(other)); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT eight: %d %q", resp.StatusCode, body)
	}
	changed := strings.Replace(entry, `"4"`, `"5"`, 1)
	if resp, body := r.do(http.MethodPut, path+"/team/nine", repTokAdmin, strings.NewReader(changed)); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT nine again: %d %q", resp.StatusCode, body)
	}
	// The two writes may be pushed as two documents or as one.
	l = stream.documentWhere(10*time.Second, "nine at generation 5", func(text string) bool {
		return strings.Contains(text, `"generation":"5"`)
	})
	var doc storedDocument
	if err := json.Unmarshal([]byte(l.text), &doc); err != nil || len(doc.Instances) != 2 ||
		!bytes.Contains(doc.Instances[1], []byte(`"generation":"5"`)) {
		t.Fatalf("document after two writes: %q", l.text)
	}
	if resp, body := r.do(http.MethodDelete, path+"/team/eight", repTokAdmin, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %d %q", resp.StatusCode, body)
	}
	l = stream.nextDocument(10 * time.Second)
	if strings.Contains(l.text, "eight") || !strings.Contains(l.text, "nine") {
		t.Fatalf("after DELETE: %q", l.text)
	}
	if n := r.metric("applistener_gateway_requests_total", "endpoint", endpointInstances, "code", "200"); n != 4 {
		t.Errorf("instances 200 requests %v, want 4", n)
	}
}

// The configuration file is imported into the store: the supervisors it
// names get its documents (it wins over the write API for them), others
// keep what the write API stored; a supervisor that leaves the file loses
// its document.
func TestConfigImport(t *testing.T) {
	checkLeaks(t)
	configPath, tokensPath := replicaFiles(t)
	r := newReplica(t, replicaOptions{configPath: configPath, tokensPath: tokensPath})
	entry := `{"workspace":"team","sandbox":"api","generation":"1","services":[{"name":"web","port":8080,"revision":1}]}`
	for _, sup := range []string{"sup-1", "sup-9"} {
		if resp, body := r.do(http.MethodPut, "/v1/supervisors/"+sup+"/instances/team/api", repTokAdmin, strings.NewReader(entry)); resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT %s: %d %q", sup, resp.StatusCode, body)
		}
	}
	doc := func(sup string) string {
		resp, body := r.do(http.MethodGet, "/v1/supervisors/"+sup+"/instances", repTokAdmin, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %q", sup, resp.StatusCode, body)
		}
		return body
	}
	if !strings.Contains(doc("sup-1"), `"sandbox":"api"`) {
		t.Fatal("the write API did not change sup-1")
	}
	// The file changes: sup-1 gets the file's document again, sup-2 leaves.
	writeFileAtomic(t, configPath, sectionsConfig(map[string][]testInstance{"sup-1": {{"team", "demo", []string{"web"}}}}))
	testutil.Eventually(t, 2*time.Second, "the file imported", func() bool {
		return !strings.Contains(doc("sup-1"), `"sandbox":"api"`) && strings.Contains(doc("sup-1"), `"sandbox":"demo"`)
	})
	if !strings.Contains(doc("sup-9"), `"sandbox":"api"`) {
		t.Error("a supervisor the file does not name lost its document")
	}
	if d := doc("sup-2"); d != emptyPoolDocument+"\n" {
		t.Errorf("sup-2 left the file; its document is %q", d)
	}
}
