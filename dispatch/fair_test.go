package dispatch

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

const (
	fairHostA = "team--a--web.apps.test"
	fairHostB = "team--b--web.apps.test"
)

// fairEnv is the real listener and dispatch sharing one fair-admission
// scheduler, in front of an app serving two instances (team/a, team/b):
// /hold/NAME sends the response head, reports NAME's arrival and holds
// the body until released (the listener relays the body: it holds its
// slot); /wait/NAME reports NAME's arrival and holds before answering at
// all (the listener waits for its app: no slot held); any other path
// answers at once.
type fairEnv struct {
	t        *testing.T
	ca       *tlsconf.Authority
	addr     string
	sched    *fairshare.Scheduler
	reg      *prometheus.Registry
	table    *routes.Table
	arrivals chan string
	release  chan struct{}
	srv      *Server
}

func newFairEnv(t *testing.T, slots int, lease time.Duration) *fairEnv {
	t.Helper()
	return newFairEnvWith(t, slots, lease, func(*Server) {})
}

// newFairEnvWith is newFairEnv with configure applied to the server before
// it serves (e.g. holdFairAppWait).
func newFairEnvWith(t *testing.T, slots int, lease time.Duration, configure func(*Server)) *fairEnv {
	t.Helper()
	h2Verify(t)
	e := &fairEnv{t: t, arrivals: make(chan string, 64), release: make(chan struct{})}
	stop := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/hold/") {
			w.Header().Set("Content-Length", "2")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
		}
		name, hold := strings.CutPrefix(r.URL.Path, "/hold/")
		if !hold {
			name, hold = strings.CutPrefix(r.URL.Path, "/wait/")
		}
		if hold {
			e.arrivals <- name
			select {
			case <-e.release:
			case <-r.Context().Done():
				return
			case <-stop:
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	ca, cert := wildcardAuthority(t, "fair admission test CA")
	e.ca = ca
	discard := slog.New(slog.DiscardHandler)
	e.table = routes.NewTable(routes.Options{Domain: h2Domain, Freshness: time.Hour, Logger: discard})
	port := app.Listener.Addr().(*net.TCPAddr).Port
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"r","instances":[
		{"workspace":"team","sandbox":"a","generation":"1","services":[{"name":"web","port":%d,"revision":1}]},
		{"workspace":"team","sandbox":"b","generation":"1","services":[{"name":"web","port":%d,"revision":1}]}]}`, port, port))
	if err != nil {
		t.Fatal(err)
	}
	if res := e.table.Apply(doc); res.Installed != 2 {
		t.Fatalf("Apply = %+v", res)
	}
	e.reg = prometheus.NewRegistry()
	// A busy hold of an hour: a test that makes an instance queue sees it
	// as a flood's for as long as it runs, however slow the machine.
	e.sched = fairshare.New(fairshare.Config{Slots: slots, Lease: lease, Registerer: e.reg, BusyHold: time.Hour})
	srv := New(Config{Fair: e.sched, Logger: discard, Registerer: e.reg})
	configure(srv)
	e.srv = srv
	tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = tcpLn.Addr().String()
	lis := listener.New(tcpLn, listener.Config{
		TLS:     &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12},
		Routes:  e.table,
		Handler: srv,
		Fair:    e.sched,
		Logger:  discard,
	})
	served := make(chan error, 1)
	go func() { served <- lis.Serve() }()
	t.Cleanup(func() {
		close(stop)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := lis.Shutdown(ctx); err != nil {
			t.Errorf("listener shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		app.Close()
		e.table.Close()
		e.sched.Close()
	})
	return e
}

// dialTLS opens a TLS connection to host offering proto (ALPN); the
// handshake is done when it returns, before any slot is held.
func (e *fairEnv) dialTLS(host, proto string) *tls.Conn {
	e.t.Helper()
	tc, err := tls.Dial("tcp", e.addr, &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{proto}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tc.Close() })
	return tc
}

// fairClient sends one request at a time on one connection (HTTP/1.1) or
// concurrent streams on one (HTTP/2).
type fairClient interface {
	get(path string) (status int, err error)
}

type h1FairClient struct {
	mu   sync.Mutex
	host string
	c    *tls.Conn
	br   *bufio.Reader
}

func (c *h1FairClient) get(path string) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := fmt.Fprintf(c.c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, c.host); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, err
}

type h2FairClient struct {
	host string
	cc   *http.ClientConn
}

func (c *h2FairClient) get(path string) (int, error) {
	req, err := http.NewRequest("GET", "https://"+c.host+path, nil)
	if err != nil {
		return 0, err
	}
	r := h2Do(c.cc, req)
	return r.status, r.err
}

func (e *fairEnv) client(host string, h2 bool) fairClient {
	e.t.Helper()
	if !h2 {
		tc := e.dialTLS(host, "http/1.1")
		return &h1FairClient{host: host, c: tc, br: bufio.NewReader(tc)}
	}
	tc := e.dialTLS(host, "h2")
	cc, err := h2NewClientConn(tc)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cc.Close() })
	return &h2FairClient{host: host, cc: cc}
}

// send starts a request in the background; its status arrives on the
// returned channel.
func send(c fairClient, path string) <-chan error {
	done := make(chan error, 1)
	go func() {
		status, err := c.get(path)
		if err == nil && status != 200 {
			err = fmt.Errorf("%s: status %d", path, status)
		}
		done <- err
	}()
	return done
}

func (e *fairEnv) arrival() string {
	e.t.Helper()
	select {
	case name := <-e.arrivals:
		return name
	case <-time.After(10 * time.Second):
		e.t.Fatal("no request reached the app within 10 s")
		return ""
	}
}

func (e *fairEnv) waiting(n int) {
	e.t.Helper()
	testutil.Eventually(e.t, 10*time.Second, fmt.Sprintf("%d queued for fair admission", n), func() bool { return e.sched.Waiting() == n })
}

// TestFairAdmissionOrder: with one slot held by one of A's requests and
// three more of A's queued, B's request, queued last, reaches the app
// before A's remaining queue (deficit round robin, not first come first
// served), on HTTP/1.1 and HTTP/2. The order is set by the app's holds,
// not by timing: each admitted request keeps its slot until the app
// lets it go (holdFairAppWait; otherwise each would give its slot to the
// next while it waits for the app, and their arrivals would race).
func TestFairAdmissionOrder(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) {
			// Slots kept through the app wait; no takeover here.
			e := newFairEnvWith(t, 1, time.Hour, func(s *Server) { s.holdFairAppWait = true })
			// Every connection is open (handshake done) before the slot is held.
			var as []fairClient
			for range 4 {
				if h2 && len(as) > 0 {
					as = append(as, as[0]) // HTTP/2: streams of one connection
					continue
				}
				as = append(as, e.client(fairHostA, h2))
			}
			b := e.client(fairHostB, h2)
			for _, c := range append(as, b) {
				if status, err := c.get("/warm"); err != nil || status != 200 {
					t.Fatalf("warm-up: %d %v", status, err)
				}
			}
			var results []<-chan error
			results = append(results, send(as[0], "/hold/a1"))
			if got := e.arrival(); got != "a1" {
				t.Fatalf("first arrival %q, want a1", got)
			}
			// The warm-ups may have waited a moment each (an exchange
			// releases its admission just after its response): count from here.
			instA := e.table.Lookup(fairHostA).Instance
			instB := e.table.Lookup(fairHostB).Instance
			waitsA, waitsB := instA.Fair.Waits(), instB.Fair.Waits()
			observed := e.metric("applistener_fair_wait_seconds", "request")
			for i, name := range []string{"a2", "a3", "a4"} {
				results = append(results, send(as[i+1], "/hold/"+name))
				e.waiting(i + 1)
			}
			results = append(results, send(b, "/hold/b"))
			e.waiting(4)
			var order []string
			for range 4 {
				e.release <- struct{}{}
				order = append(order, e.arrival())
			}
			e.release <- struct{}{}
			want := []string{"a2", "b", "a3", "a4"}
			if strings.Join(order, ",") != strings.Join(want, ",") {
				t.Errorf("admitted after a1: %v, want %v (B before A's remaining queue)", order, want)
			}
			for _, r := range results {
				if err := <-r; err != nil {
					t.Error(err)
				}
			}
			if a, b := instA.Fair.Waits()-waitsA, instB.Fair.Waits()-waitsB; a != 3 || b != 1 {
				t.Errorf("fair waits A %d B %d, want 3 and 1", a, b)
			}
			if got := e.metric("applistener_fair_wait_seconds", "request") - observed; got != 4 {
				t.Errorf("request waits observed %v, want 4", got)
			}
			testutil.Eventually(t, 5*time.Second, "every slot free", func() bool { return !e.sched.Contended() })
		})
	}
}

// TestFairLeaseLongPoll: A's long polls (their heads answered, their
// bodies held: the listener relays them) hold every slot, yet B is
// served: a slot held past its lease is taken over for B (HTTP/1.1 and
// HTTP/2).
func TestFairLeaseLongPoll(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) {
			e := newFairEnv(t, 2, 20*time.Millisecond)
			a1, a2 := e.client(fairHostA, h2), e.client(fairHostA, h2)
			b := e.client(fairHostB, h2)
			r1, r2 := send(a1, "/hold/poll1"), send(a2, "/hold/poll2")
			for range 2 {
				if got := e.arrival(); !strings.HasPrefix(got, "poll") {
					t.Fatalf("arrival %q, want a long poll", got)
				}
			}
			// A's two requests in flight gave their slots back while
			// their app worked (fairLightStreams); they hold them again
			// once their heads are relayed, through the long bodies.
			testutil.Eventually(t, 5*time.Second, "A's long polls hold both slots", e.sched.Contended)
			for i := range 3 {
				status, err := b.get("/fast")
				if err != nil || status != 200 {
					t.Fatalf("B's request %d behind A's long polls: %d %v", i, status, err)
				}
			}
			if got := e.metric("applistener_fair_lease_takeovers_total", ""); got < 1 {
				t.Errorf("lease takeovers %v, want at least 1", got)
			}
			e.release <- struct{}{}
			e.release <- struct{}{}
			for _, r := range []<-chan error{r1, r2} {
				if err := <-r; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestFairAppWait: with one slot that a lease of 20 ms hands on, A's
// request waits at its app while B's requests are served. An HTTP/2
// stream waiting for its app holds no slot: no takeover was needed (before
// it gave the slot back, B waited for the lease). An HTTP/1.1 request
// keeps its slot while it waits (that bounds a flood's requests in flight,
// fair.go): B is served once the lease hands the slot on.
func TestFairAppWait(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) {
			e := newFairEnv(t, 1, 20*time.Millisecond)
			a, b := e.client(fairHostA, h2), e.client(fairHostB, h2)
			ra := send(a, "/wait/a")
			if got := e.arrival(); got != "a" {
				t.Fatalf("arrival %q, want a", got)
			}
			for i := range 3 {
				select {
				case err := <-send(b, "/fast"):
					if err != nil {
						t.Fatalf("B's request %d while A waits for its app: %v", i, err)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("B's request %d waited 10 s behind A's wait for its app", i)
				}
			}
			// A's one request in flight gave its slot back (a light
			// instance, TestFairAppWaitByLoad).
			if takeovers := e.metric("applistener_fair_lease_takeovers_total", ""); takeovers != 0 {
				t.Errorf("lease takeovers %v, want none (the request gave its slot back)", takeovers)
			}
			e.release <- struct{}{}
			if err := <-ra; err != nil {
				t.Error(err)
			}
			testutil.Eventually(t, 5*time.Second, "every slot free", func() bool { return !e.sched.Contended() })
		})
	}
}

// TestFairAppWaitByLoad: a request (HTTP/1.1) or stream (HTTP/2) gives
// its slot back while it waits for its app only while its instance has at
// most fairLightStreams requests in flight; beyond that (a flood) it
// keeps the slot, so that the slots bound the flood's requests in flight,
// and a neighbour queues behind it (with a lease of an hour, no takeover
// frees it).
func TestFairAppWaitByLoad(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) {
			e := newFairEnv(t, 1, time.Hour)
			// Connections first: a TLS handshake is admitted too.
			var as []fairClient
			for range fairLightStreams + 1 {
				as = append(as, e.client(fairHostA, h2))
			}
			b := e.client(fairHostB, h2)
			var pending []<-chan error
			for _, a := range as {
				pending = append(pending, send(a, "/wait/a"))
				if got := e.arrival(); got != "a" {
					t.Fatalf("arrival %q, want a", got)
				}
			}
			rb := send(b, "/fast")
			// The third of A's requests kept the only slot.
			e.waiting(1)
			select {
			case err := <-rb:
				t.Fatalf("B's request was served while A's third request held the only slot: %v", err)
			default:
			}
			for range pending {
				e.release <- struct{}{}
			}
			for _, p := range pending {
				if err := <-p; err != nil {
					t.Error(err)
				}
			}
			if err := <-rb; err != nil {
				t.Errorf("B's request after A's answers: %v", err)
			}
			testutil.Eventually(t, 5*time.Second, "every slot free", func() bool { return !e.sched.Contended() })
		})
	}
}

// metric returns the counter name's value, or the sample count of the
// histogram name's series of the given kind.
func (e *fairEnv) metric(name, kind string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				for _, l := range m.GetLabel() {
					if l.GetName() == "kind" && l.GetValue() == kind {
						return float64(h.GetSampleCount())
					}
				}
				continue
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestWebSocketChunkAdmission: a WebSocket chunk takes no admission while
// the scheduler is not contended (and allocates nothing), waits for its
// turn when it is, and is relayed anyway after wsChunkWait (a throttle,
// never a cut).
func TestWebSocketChunkAdmission(t *testing.T) {
	sched := fairshare.New(fairshare.Config{Slots: 1, Lease: time.Hour})
	defer sched.Close()
	var flow fairshare.Flow
	w := &wsSplice{fair: sched, flow: &flow}
	if allocs := testing.AllocsPerRun(100, func() {
		if tk := w.admitChunk(); tk.Valid() {
			t.Fatal("an admission taken while not contended")
		}
	}); allocs != 0 {
		t.Errorf("%v allocations per uncontended chunk", allocs)
	}
	held, _ := sched.TryAdmit()
	got := make(chan fairshare.Ticket, 1)
	go func() { got <- w.admitChunk() }()
	testutil.Eventually(t, 5*time.Second, "the chunk queued", func() bool { return sched.Waiting() == 1 })
	sched.Release(held)
	tk := <-got
	if !tk.Valid() {
		t.Fatal("the chunk was not admitted when the slot was released")
	}
	start := time.Now()
	if late := w.admitChunk(); late.Valid() {
		t.Error("admitted while the only slot was held")
	}
	if d := time.Since(start); d < wsChunkWait {
		t.Errorf("a contended chunk went on after %v, before wsChunkWait", d)
	}
	sched.Release(tk)
	if sched.Contended() || flow.Waits() != 2 {
		t.Errorf("contended %v, waits %d (want free, 2)", sched.Contended(), flow.Waits())
	}
	var off wsSplice // no scheduler: nothing to admit
	if off.admitChunk().Valid() {
		t.Error("admission without a scheduler")
	}
}

// TestAnswerSpin: while fair admission is contended, a light instance's
// request polls for its app's answer (appAnswerSpin) instead of parking at
// once, on both protocols, counted by outcome; while it is not, nothing
// polls.
func TestAnswerSpin(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) {
			e := newFairEnv(t, 9, time.Hour)
			b := e.client(fairHostB, h2)
			spins := func() float64 {
				mfs, err := e.reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				var n float64
				for _, mf := range mfs {
					if mf.GetName() == "applistener_app_answer_spins_total" {
						for _, m := range mf.GetMetric() {
							n += m.GetCounter().GetValue()
						}
					}
				}
				return n
			}
			if err := <-send(b, "/fast"); err != nil {
				t.Fatal(err)
			}
			if n := spins(); n != 0 {
				t.Fatalf("%v polls for the answer while nothing was contended, want 0", n)
			}
			// Every slot taken (as by a neighbour's flood): B, light, is
			// admitted beyond them and polls for its answer.
			release := e.holdEverySlot()
			defer release()
			if err := <-send(b, "/fast"); err != nil {
				t.Fatal(err)
			}
			if n := spins(); n != 1 {
				t.Fatalf("%v polls for the answer under contention, want 1", n)
			}
		})
	}
}

// TestQuietConnParksAtOnce: while fair admission is contended, an
// HTTP/1.1 keep-alive connection of a light instance parks with the idle
// poller as soon as its response is written (not after parkAfter, here an
// hour), and its next request is served from there; while nothing is
// contended it waits in place. (HTTP/2 connections do not park between
// requests; their streams' releases deliver parked HTTP/1.1 connections,
// s.pollParked, as HTTP/1.1 requests' do: TestPollNowDelivers.)
func TestQuietConnParksAtOnce(t *testing.T) {
	e := newFairEnvWith(t, 9, time.Hour, func(s *Server) { s.idleParkAfter = time.Hour })
	b := e.client(fairHostB, false)
	if err := <-send(b, "/fast"); err != nil {
		t.Fatal(err)
	}
	if n := e.srv.idleH1.waiters(); n != 0 {
		t.Fatalf("%d connections parked with nothing contended and an hour to wait first", n)
	}
	defer e.holdEverySlot()()
	if err := <-send(b, "/fast"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "B parked at once", func() bool { return e.srv.idleH1.waiters() == 1 })
	for range 3 {
		if err := <-send(b, "/fast"); err != nil {
			t.Fatalf("a request of the parked connection: %v", err)
		}
		testutil.Eventually(t, 5*time.Second, "B parked again", func() bool { return e.srv.idleH1.waiters() == 1 })
	}

	// An instance whose admissions queued lately is a flood's, however few
	// requests it has in flight for a moment: its connection does not park
	// at once (it would be delivered ahead of its neighbours').
	inst := e.table.Lookup(fairHostB).Instance
	beyond, ok := e.sched.TryAdmitFlow(&inst.Fair) // light B: beyond the slots
	if !ok {
		t.Fatal("light B not admitted beyond the slots")
	}
	if _, err := e.sched.Admit(&inst.Fair, fairshare.KindRequest, nil, time.Millisecond); err == nil {
		t.Fatal("admitted with every slot held and B holding its one beyond them")
	}
	e.sched.Release(beyond)
	if !e.sched.RecentlyQueued(&inst.Fair) {
		t.Fatal("B's admission queued, yet not recently queued")
	}
	if err := <-send(b, "/fast"); err != nil {
		t.Fatalf("a request of the parked connection: %v", err)
	}
	// Its response is read: the connection goes idle, in place.
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := e.srv.idleH1.waiters(); n != 0 {
			t.Fatalf("a connection of an instance that queued lately parked at once (%d parked)", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holdEverySlot takes every admission slot (as a neighbour's flood would)
// and returns what gives them back.
func (e *fairEnv) holdEverySlot() (release func()) {
	e.t.Helper()
	var held []fairshare.Ticket
	for range e.sched.Slots() {
		// A request just answered may not have given its slot back yet.
		testutil.Eventually(e.t, 5*time.Second, "a free slot", func() bool {
			tk, ok := e.sched.TryAdmit()
			if ok {
				held = append(held, tk)
			}
			return ok
		})
	}
	if !e.sched.Contended() {
		e.t.Fatal("every slot taken, yet not contended")
	}
	return func() {
		for _, tk := range held {
			e.sched.Release(tk)
		}
	}
}
