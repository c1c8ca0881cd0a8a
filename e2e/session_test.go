package e2e

// End-to-end tests of the supervisor's side of the issue 14 session (the
// built binary): its withdrawal on the way out happens while the app
// listener still accepts (observed from a gateway in this process that
// speaks the contract's HTTP protocol), a quiet push session with a long
// keepalive grant keeps a 2 s freshness window renewed (the reference
// gateway), several gateway endpoints with failover, and `applistener
// instances` against the reference gateway's admin API.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// ---------------------------------------------------------------------------
// a supervisor with any gateway endpoints

// sessSup starts `applistener serve --mode shared` against endpoints (a
// comma-separated list) with the token t1, advertising 127.0.0.1, and waits
// until /readyz answers 200. setup runs before Start (a stdin pipe). It is
// stopped with SIGTERM on cleanup.
func sessSup(t *testing.T, endpoints string, setup func(*exec.Cmd), extra ...string) *gatewaySupervisor {
	t.Helper()
	return launchSupervisor(t, endpoints, supervisorConfig{
		extra: append([]string{"--advertise-address", "127.0.0.1"}, extra...),
		setup: setup,
	})
}

// sessLogIndex returns the offset of the first log line whose msg is msg,
// -1 when there is none.
func sessLogIndex(stderr, msg string) int {
	return strings.Index(stderr, `"msg":"`+msg+`"`)
}

// ---------------------------------------------------------------------------
// a gateway in this process that records the withdrawal

// sessFakeGateway serves sup-1's document over push (keepalives every
// 200 ms, granted explicitly) and poll, accepts advertisements, and on the
// withdrawal probes the supervisor's app listener: a TLS handshake for a
// routed name must still succeed then.
type sessFakeGateway struct {
	srv *httptest.Server
	doc []byte

	mu        sync.Mutex
	probe     func() error   // set once the supervisor runs
	sessions  map[string]int // session ids seen, by request kind
	adSession string
	deleted   []sessWithdrawal
	end       chan struct{}
}

// sessWithdrawal is one DELETE the fake gateway received.
type sessWithdrawal struct {
	session  string
	at       time.Time
	probeErr error // the handshake with the supervisor during the DELETE
}

func newSessFakeGateway(t *testing.T, doc []byte) *sessFakeGateway {
	g := &sessFakeGateway{doc: doc, sessions: map[string]int{}, end: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(func() {
		close(g.end)
		g.srv.Close()
	})
	return g
}

func (g *sessFakeGateway) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+supervisorToken {
		http.Error(w, "401 Unauthorized", http.StatusUnauthorized)
		return
	}
	q := r.URL.Query()
	base := "/v1/supervisors/" + supervisorID
	kind := r.Method + " " + strings.TrimPrefix(r.URL.Path, base)
	if q.Get("watch") == "1" {
		kind += " watch"
	}
	if r.Method != http.MethodPut { // an advertisement names its session in its body
		g.mu.Lock()
		g.sessions[kind+" "+q.Get("session")]++
		g.mu.Unlock()
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == base+"/config" && q.Get("watch") == "1":
		w.Header().Set("X-Applistener-Keepalive", "200ms")
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write(append(append([]byte(nil), g.doc...), '\n'))
		w.(http.Flusher).Flush()
		tk := time.NewTicker(200 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-g.end:
				return
			case <-tk.C:
				if _, err := io.WriteString(w, `{"keepalive":true}`+"\n"); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		}
	case r.Method == http.MethodGet && r.URL.Path == base+"/config":
		_, _ = w.Write(append(append([]byte(nil), g.doc...), '\n'))
	case r.Method == http.MethodPut && r.URL.Path == base+"/installations":
		var set struct {
			Session string `json:"session"`
		}
		_ = json.NewDecoder(r.Body).Decode(&set)
		g.mu.Lock()
		g.adSession = set.Session
		g.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodDelete && r.URL.Path == base+"/installations":
		d := sessWithdrawal{session: q.Get("session"), at: time.Now()}
		g.mu.Lock()
		probe := g.probe
		g.mu.Unlock()
		if probe != nil {
			d.probeErr = probe()
		}
		g.mu.Lock()
		g.deleted = append(g.deleted, d)
		g.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "404 Not Found", http.StatusNotFound)
	}
}

func (g *sessFakeGateway) withdrawals() []sessWithdrawal {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]sessWithdrawal(nil), g.deleted...)
}

// TestSessionWithdrawalBeforeListenerCloses: on SIGTERM, SIGINT and the
// parent's death (stdin EOF) the supervisor sends DELETE
// .../installations?session= with its session while its app listener still
// completes handshakes for its routes; only then does the listener close,
// and the process exits 0. Every request of the process carried the same
// session, and so did its advertisement.
func TestSessionWithdrawalBeforeListenerCloses(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"SIGTERM", "SIGINT", "stdin EOF"} {
		t.Run(strings.ReplaceAll(how, " ", "_"), func(t *testing.T) {
			t.Parallel()
			web := newBackend(t, "web")
			g := newSessFakeGateway(t, routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}}))
			var stdin io.WriteCloser
			var extra []string
			var setup func(*exec.Cmd)
			if how == "stdin EOF" {
				extra = []string{"--parent-liveness-stdin"}
				setup = func(cmd *exec.Cmd) {
					var err error
					if stdin, err = cmd.StdinPipe(); err != nil {
						t.Fatal(err)
					}
				}
			}
			sup := sessSup(t, g.srv.URL, setup, extra...)
			g.mu.Lock()
			g.probe = func() error {
				if !sup.handshakeOK(hostWeb) {
					return fmt.Errorf("no TLS handshake for %s", hostWeb)
				}
				return nil
			}
			g.mu.Unlock()
			testutil.Eventually(t, waitTimeout, "an advertisement", func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				return g.adSession != ""
			})

			start := time.Now()
			switch how {
			case "SIGTERM":
				_ = sup.cmd.Process.Signal(syscall.SIGTERM)
			case "SIGINT":
				_ = sup.cmd.Process.Signal(syscall.SIGINT)
			default:
				_ = stdin.Close()
			}
			select {
			case <-sup.done:
			case <-time.After(waitTimeout):
				t.Fatalf("still running %v after %s", waitTimeout, how)
			}
			exited := time.Since(start)
			if sup.exitCode != 0 {
				t.Errorf("exit code %d after %s", sup.exitCode, how)
			}
			ws := g.withdrawals()
			if len(ws) != 1 {
				t.Fatalf("%d withdrawals; want 1", len(ws))
			}
			w := ws[0]
			if w.probeErr != nil {
				t.Errorf("during the withdrawal the app listener no longer served the route: %v", w.probeErr)
			}
			if sup.handshakeOK(hostWeb) {
				t.Error("the app listener still accepts after exit")
			}
			out := sup.stderr.String()
			if iw, is := sessLogIndex(out, "installations withdrawn from the gateway"), sessLogIndex(out, "stopped"); iw < 0 || is < 0 || iw > is {
				t.Errorf("log order: withdrawn at %d, stopped at %d", iw, is)
			}
			g.mu.Lock()
			sessions := map[string]bool{}
			for k := range g.sessions {
				sessions[k[strings.LastIndexByte(k, ' ')+1:]] = true
			}
			adSession := g.adSession
			g.mu.Unlock()
			if len(sessions) != 1 || !sessions[w.session] || adSession != w.session || len(w.session) != 32 {
				t.Errorf("sessions %v, advertised %q, withdrawn %q: want one 32-character session everywhere", sessions, adSession, w.session)
			}
			t.Logf("%s: withdrawal %v after, listener still serving then; exit %v after", how,
				w.at.Sub(start).Round(time.Microsecond), exited.Round(time.Millisecond))
		})
	}
}

// ---------------------------------------------------------------------------
// against the reference gateway

// sessTokens writes the tokens file of g: t1 for sup-1, t2 reading
// workspace team, ta an admin token.
func sessTokens(t *testing.T, g *memGateway) {
	writeAtomic(t, g.tokensPath, []byte(`{"tokens":[{"token":"`+supervisorToken+`","supervisor":"`+supervisorID+`"},`+
		`{"token":"t2","workspaces":["team"]},{"token":"ta","admin":true}]}`))
}

// sessTokenFile writes token to a file and returns its path.
func sessTokenFile(t *testing.T, token string) string {
	p := filepath.Join(t.TempDir(), "token")
	writeAtomic(t, p, []byte(token+"\n"))
	return p
}

// sessDeadEndpoint returns the URL of a loopback port nobody listens on.
// The port stays bound (deadPort), so none of the supervisor's own
// listeners can be given it: a port merely closed again once was, and the
// "dead" gateway then answered as the supervisor's app listener.
func sessDeadEndpoint(t *testing.T) string {
	return "http://127.0.0.1:" + strconv.Itoa(deadPort(t))
}

// TestSessionLongKeepaliveGrant: the reference gateway grants 5 s
// keepalives (--keepalive-min 5s) to a supervisor with a 2 s route
// freshness. The supervisor polls beside its push session, says why once,
// and for four freshness windows of a quiet session requests, readiness
// and the health port are never disturbed.
func TestSessionLongKeepaliveGrant(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	g := newMemGateway(t, routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}}),
		"--keepalive", "5s", "--keepalive-min", "5s")
	sessTokens(t, g)
	g.start(t)
	sup := sessSup(t, g.endpoint(), nil)
	c, dials := sup.client(t, hostWeb)
	if err := expect200(c, hostWeb, "web"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "the health port to accept connections", func() bool {
		return dialHealth(sup.healthAddr) == nil
	})
	holdsFor(t, 4*freshness,
		&periodicCheck{name: "keep-alive request every 250ms", every: 250 * time.Millisecond, fn: func() error {
			return expect200(c, hostWeb, "web")
		}},
		&periodicCheck{name: "/readyz 200", every: 100 * time.Millisecond, fn: func() error {
			if code, body := readyzAt(sup.adminAddr); code != http.StatusOK {
				return fmt.Errorf("/readyz %d %q", code, body)
			}
			return nil
		}},
		&periodicCheck{name: "health port open", every: 100 * time.Millisecond, fn: func() error {
			return dialHealth(sup.healthAddr)
		}},
	)
	if n := dials.Load(); n != 1 {
		t.Errorf("the keep-alive client dialed %d times; want 1", n)
	}
	fallback := metricAt(t, sup.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "fallback-poll"})
	polls := metricAt(t, sup.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "poll"})
	out := sup.stderr.String()
	t.Logf("polls beside the push session in %v: %v; polls with push down: %v", 4*freshness, fallback, polls)
	if fallback < 6 {
		t.Errorf("%v polls beside the push session in %v; want about one per 666ms", fallback, 4*freshness)
	}
	if polls != 0 {
		t.Errorf("%v polls with the push session down: the quiet session was dropped", polls)
	}
	if n := strings.Count(out, "polling beside the push session"); n != 1 || !strings.Contains(out, `"granted_keepalive":5,`) {
		t.Errorf("the reason was logged %d times (want once, with the grant of 5s)", n)
	}
}

// TestSessionGatewayFailover: a supervisor and the routes command given a
// dead endpoint and two reference gateways (one process each, the same
// configuration) use the first that works; when it dies the supervisor
// moves to the other without its route going stale, advertises there, and
// discovery through the list finds the route at the survivor.
func TestSessionGatewayFailover(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	doc := routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}})
	var gws []*memGateway
	for range 2 {
		g := newMemGateway(t, doc, "--keepalive", "250ms", "--keepalive-min", "250ms")
		sessTokens(t, g)
		g.start(t)
		gws = append(gws, g)
	}
	dead := sessDeadEndpoint(t)
	list := dead + "," + gws[0].endpoint() + "," + gws[1].endpoint()
	sup := sessSup(t, list, nil)
	testutil.Eventually(t, waitTimeout, "the push session at the first live gateway", func() bool {
		v, _, err := scrapeMetric(gws[0].adminAddr, "applistener_gateway_watchers", nil)
		return err == nil && v == 1
	})
	tok := sessTokenFile(t, "t2")
	testutil.Eventually(t, waitTimeout, "the route in discovery through the list", func() bool {
		out, _, code := runCommandOnce(t, "routes", "get", "--gateway", list, "--gateway-token-file", tok, "--workspace", "team", "--output", "json")
		return code == 0 && strings.Contains(out, hostWeb)
	})

	c, _ := sup.client(t, hostWeb)
	gws[0].kill(t)
	holdsFor(t, 2*freshness,
		&periodicCheck{name: "request every 100ms", every: 100 * time.Millisecond, fn: func() error {
			return expect200(c, hostWeb, "web")
		}},
	)
	testutil.Eventually(t, waitTimeout, "the push session at the second gateway", func() bool {
		v, _, err := scrapeMetric(gws[1].adminAddr, "applistener_gateway_watchers", nil)
		return err == nil && v == 1
	})
	if code, body := readyzAt(sup.adminAddr); code != http.StatusOK {
		t.Errorf("/readyz %d %q after the failover", code, body)
	}
	testutil.Eventually(t, waitTimeout, "the route in discovery at the survivor", func() bool {
		out, _, code := runCommandOnce(t, "routes", "get", "--gateway", list, "--gateway-token-file", tok, "--workspace", "team", "--output", "json")
		return code == 0 && strings.Contains(out, hostWeb)
	})
	t.Logf("failover: the route was served throughout the %v after the kill; discovery finds it at the survivor", 2*freshness)
}

// TestSessionInstancesCommand: `applistener instances` against the
// reference gateway's admin API. An instance put for sup-1 reaches the
// supervisor over its push session and is served; list shows it; delete
// withdraws it from the supervisor; the exit codes follow the answers.
func TestSessionInstancesCommand(t *testing.T) {
	t.Parallel()
	web, other := newBackend(t, "web"), newBackend(t, "other")
	g := newMemGateway(t, routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}}),
		"--keepalive", "250ms", "--keepalive-min", "250ms")
	sessTokens(t, g)
	g.start(t)
	sup := sessSup(t, g.endpoint(), nil)
	admin := sessTokenFile(t, "ta")
	endpoints := sessDeadEndpoint(t) + "," + g.endpoint()
	cli := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		return runBin(t, stdin, append([]string{"instances"}, args...)...)
	}
	common := []string{"--gateway", endpoints, "--gateway-token-file", admin, "--supervisor", supervisorID}
	const hostOther = "team--other--web." + domain
	entry := fmt.Sprintf(`{"workspace":"team","sandbox":"other","generation":"1","connector":{"type":"tcp","host":"127.0.0.1"},`+
		`"services":[{"name":"web","port":%d,"revision":1}]}`, other.port)
	entryFile := filepath.Join(t.TempDir(), "entry.json")
	if err := os.WriteFile(entryFile, []byte(entry), 0o644); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	out, errOut, code := cli("", append([]string{"put", "--file", entryFile}, common...)...)
	if code != 0 || !strings.Contains(out, "put team/other on supervisor sup-1: document revision") {
		t.Fatalf("put: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	testutil.Eventually(t, waitTimeout, "the new instance served by the supervisor", func() bool {
		return sup.handshakeOK(hostOther)
	})
	t.Logf("instances put -> served by the supervisor: %v", time.Since(start).Round(time.Millisecond))
	c, _ := sup.client(t, hostOther)
	if err := expect200(c, hostOther, "other"); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = cli("", append([]string{"list"}, common...)...)
	if code != 0 || !strings.Contains(out, "other") || !strings.Contains(out, "demo") {
		t.Errorf("list: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, _, code = cli("", append([]string{"list", "--output", "json"}, common...)...)
	var doc struct {
		Instances []struct{ Sandbox string } `json:"instances"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || len(doc.Instances) != 2 {
		t.Errorf("list --output json: exit %d, %q", code, out)
	}

	// Refusals: a bad entry (400), a supervisor token (403): exit 1 with
	// the gateway's reason; a contradictory flag: exit 2 before any request.
	bad := strings.Replace(entry, fmt.Sprintf(`"port":%d`, other.port), `"port":0`, 1)
	if _, errOut, code := cli(bad, append([]string{"put", "--file", "-"}, common...)...); code != 1 || !strings.Contains(errOut, "400") {
		t.Errorf("put of a bad entry: exit %d, stderr %q", code, errOut)
	}
	supTok := sessTokenFile(t, supervisorToken)
	if _, errOut, code := cli("", "list", "--gateway", g.endpoint(), "--gateway-token-file", supTok, "--supervisor", supervisorID); code != 1 || !strings.Contains(errOut, "403") {
		t.Errorf("list with a supervisor token: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := cli(entry, append([]string{"put", "--file", "-", "--sandbox", "demo"}, common...)...); code != 2 {
		t.Errorf("put with a contradictory --sandbox: exit %d, stderr %q", code, errOut)
	}

	start = time.Now()
	if out, errOut, code := cli("", append([]string{"delete", "--workspace", "team", "--sandbox", "other"}, common...)...); code != 0 || !strings.Contains(out, "deleted team/other") {
		t.Fatalf("delete: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	testutil.Eventually(t, waitTimeout, "the deleted instance refused by the supervisor", func() bool {
		return isUnrecognizedName(sup.handshakeErr(hostOther))
	})
	t.Logf("instances delete -> refused by the supervisor: %v", time.Since(start).Round(time.Millisecond))
	if _, errOut, code := cli("", append([]string{"delete", "--workspace", "team", "--sandbox", "other"}, common...)...); code != 1 || !strings.Contains(errOut, "404") {
		t.Errorf("delete of an absent instance: exit %d, stderr %q", code, errOut)
	}
	if !sup.handshakeOK(hostWeb) {
		t.Error("the file's instance was disturbed")
	}
}
