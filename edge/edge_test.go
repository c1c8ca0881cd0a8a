package edge

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/gateway"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/tlsconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	hostA = "team--a.apps.test"
	hostB = "team--b--web.apps.test"
)

// ---------------------------------------------------------------------------
// fake supervisors: TLS servers that greet with their name and echo

type fakeSupervisor struct {
	name   string
	serial string
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	served atomic.Int64
}

// newFakeSupervisor serves TLS with a fresh *.apps.test certificate of ca.
// After the handshake it writes "<name> <sni>\n", then echoes lines; at EOF
// from the client it writes "bye\n" and closes.
func newFakeSupervisor(t *testing.T, ca *tlsconf.Authority, name string) *fakeSupervisor {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue([]string{"*.apps.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeSupervisor{name: name, serial: leaf.SerialNumber.String(), ln: ln, conns: map[net.Conn]struct{}{}}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Go(func() {
				defer func() {
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
					_ = c.Close()
				}()
				tc := tls.Server(c, cfg)
				_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
				if err := tc.Handshake(); err != nil {
					return
				}
				_ = tc.SetDeadline(time.Time{})
				s.served.Add(1)
				_, _ = fmt.Fprintf(tc, "%s %s\n", name, tc.ConnectionState().ServerName)
				br := bufio.NewReader(tc)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						if errors.Is(err, io.EOF) {
							_, _ = io.WriteString(tc, "bye\n")
							_ = tc.CloseWrite()
						}
						return
					}
					if _, err := io.WriteString(tc, line); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(s.close)
	return s
}

func (s *fakeSupervisor) endpoint() api.RouteEndpoint {
	return api.RouteEndpoint{Host: "127.0.0.1", Port: s.ln.Addr().(*net.TCPAddr).Port}
}

func (s *fakeSupervisor) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// ---------------------------------------------------------------------------
// a Source fed by the test

type fakeSource struct {
	mu    sync.Mutex
	feeds map[string]chan fakeUpdate
}

type fakeUpdate struct {
	snap    *api.RouteSnapshot
	err     error // end the watch with this error instead
	applied chan struct{}
}

func newFakeSource() *fakeSource { return &fakeSource{feeds: map[string]chan fakeUpdate{}} }

func (f *fakeSource) feed(ws string) chan fakeUpdate {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := f.feeds[ws]
	if ch == nil {
		ch = make(chan fakeUpdate)
		f.feeds[ws] = ch
	}
	return ch
}

func (f *fakeSource) Watch(ctx context.Context, ws string, fn func(*api.RouteSnapshot)) error {
	ch := f.feed(ws)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case u := <-ch:
			if u.err != nil {
				close(u.applied)
				return u.err
			}
			fn(u.snap)
			close(u.applied)
		}
	}
}

// send delivers a snapshot of ws and returns once the edge applied it.
func (f *fakeSource) send(t *testing.T, ws string, rs ...api.ServiceRoute) {
	t.Helper()
	f.deliver(t, ws, fakeUpdate{snap: &api.RouteSnapshot{Workspace: ws, Revision: "1", Routes: rs}})
}

func (f *fakeSource) deliver(t *testing.T, ws string, u fakeUpdate) {
	t.Helper()
	u.applied = make(chan struct{})
	select {
	case f.feed(ws) <- u:
	case <-time.After(5 * time.Second):
		t.Fatal("the edge does not watch " + ws)
	}
	<-u.applied
}

func routeTo(host string, sup *fakeSupervisor, version uint64, expires time.Time) api.ServiceRoute {
	label, _, _ := strings.Cut(host, ".")
	parts := strings.Split(label, "--")
	r := api.ServiceRoute{Hostname: host, Workspace: parts[0], Sandbox: parts[1], Supervisor: sup.name,
		InstallationVersion: version, ExpiresAt: expires, Endpoint: sup.endpoint()}
	if len(parts) == 3 {
		r.Name = parts[2]
	}
	return r
}

// ---------------------------------------------------------------------------
// the edge under test

type edgeFixture struct {
	t    *testing.T
	e    *Edge
	addr string
	reg  *prometheus.Registry
	pool *x509.CertPool
	stop func()
}

// newEdgeFixture is an edge that closes the connections of a withdrawn
// route at once (no withdrawal grace: the fake supervisors never close
// them themselves).
func newEdgeFixture(t *testing.T, src Source, pool *x509.CertPool, workspaces ...string) *edgeFixture {
	t.Helper()
	return newEdgeFixtureGrace(t, -1, src, pool, workspaces...)
}

func newEdgeFixtureGrace(t *testing.T, grace time.Duration, src Source, pool *x509.CertPool, workspaces ...string) *edgeFixture {
	t.Helper()
	return newEdgeFixtureConfig(t, Config{
		Source:           src,
		Workspaces:       workspaces,
		HelloTimeout:     2 * time.Second,
		HalfCloseTimeout: 2 * time.Second,
		WithdrawGrace:    grace,
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, pool)
}

// newEdgeFixtureConfig serves an edge of cfg (its Registerer replaced).
func newEdgeFixtureConfig(t *testing.T, cfg Config, pool *x509.CertPool) *edgeFixture {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { e.Run(ctx) })
	wg.Go(func() {
		if err := e.Serve(ln); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	var once sync.Once
	f := &edgeFixture{t: t, e: e, addr: ln.Addr().String(), reg: reg, pool: pool}
	f.stop = func() {
		once.Do(func() {
			sctx, c := context.WithTimeout(context.Background(), time.Second)
			defer c()
			if err := e.Shutdown(sctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			cancel()
			wg.Wait()
		})
	}
	t.Cleanup(f.stop)
	return f
}

func (f *edgeFixture) metric(name string, labels ...string) float64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// histogramCount is the sample count of histogram name.
func (f *edgeFixture) histogramCount(name string) uint64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// clientConn is a TLS connection through the edge, verified end to end.
type clientConn struct {
	*tls.Conn
	br       *bufio.Reader
	greeting string
	serial   string
}

// dial connects through the edge with SNI host, verifies the supervisor's
// certificate against the CA, and reads the greeting.
func (f *edgeFixture) dial(host string) (*clientConn, error) {
	raw, err := net.DialTimeout("tcp", f.addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, &tls.Config{RootCAs: f.pool, ServerName: host, MinVersion: tls.VersionTLS12})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		_ = raw.Close()
		return nil, err
	}
	c := &clientConn{Conn: tc, br: bufio.NewReader(tc), serial: tc.ConnectionState().PeerCertificates[0].SerialNumber.String()}
	c.greeting, err = c.br.ReadString('\n')
	if err != nil {
		_ = tc.Close()
		return nil, fmt.Errorf("greeting: %w", err)
	}
	c.greeting = strings.TrimSpace(c.greeting)
	_ = tc.SetDeadline(time.Time{})
	return c, nil
}

func (f *edgeFixture) mustDial(host string) *clientConn {
	f.t.Helper()
	c, err := f.dial(host)
	if err != nil {
		f.t.Fatalf("dial %s through the edge: %v", host, err)
	}
	f.t.Cleanup(func() { _ = c.Close() })
	return c
}

// expectOwner checks that a new connection to host reaches sup.
func (f *edgeFixture) expectOwner(host string, sup *fakeSupervisor) {
	f.t.Helper()
	c := f.mustDial(host)
	defer func() { _ = c.Close() }()
	if c.greeting != sup.name+" "+host || c.serial != sup.serial {
		f.t.Fatalf("%s reached %q (certificate serial %s), want %s (serial %s)", host, c.greeting, c.serial, sup.name, sup.serial)
	}
	c.echo(f.t, "ping "+host)
}

func (c *clientConn) echo(t *testing.T, msg string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
	got, err := c.br.ReadString('\n')
	if err != nil || got != msg+"\n" {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

// expectClosed checks that the connection is closed by the edge within d
// and returns how long it took.
func (c *clientConn) expectClosed(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.br.ReadString('\n')
	var ne net.Error
	if err == nil {
		t.Fatal("connection still open: read a line")
	}
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection not closed within %v", d)
	}
	return time.Since(start)
}

// expectUnrecognized checks that a handshake with SNI host fails with the
// alert unrecognized_name and that no certificate reached the client.
func (f *edgeFixture) expectUnrecognized(host string) {
	f.t.Helper()
	raw, err := net.DialTimeout("tcp", f.addr, 2*time.Second)
	if err != nil {
		f.t.Fatal(err)
	}
	defer func() { _ = raw.Close() }()
	var sawCert bool
	cfg := &tls.Config{RootCAs: f.pool, ServerName: host, MinVersion: tls.VersionTLS12,
		VerifyConnection: func(tls.ConnectionState) error { sawCert = true; return nil }}
	if host == "" {
		cfg.InsecureSkipVerify = true // no SNI is sent
	}
	tc := tls.Client(raw, cfg)
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	err = tc.Handshake()
	if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		f.t.Fatalf("handshake with SNI %q: %v; want alert unrecognized_name", host, err)
	}
	if sawCert {
		f.t.Fatalf("SNI %q: a certificate reached the client", host)
	}
}

func newCA(t *testing.T) *tlsconf.Authority {
	t.Helper()
	ca, err := tlsconf.NewAuthority("edge test CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// ---------------------------------------------------------------------------

func TestEdgeRoutesBySNI(t *testing.T) {
	ca := newCA(t)
	sup1, sup2 := newFakeSupervisor(t, ca, "sup-1"), newFakeSupervisor(t, ca, "sup-2")
	if sup1.serial == sup2.serial {
		t.Fatal("the two supervisors have the same certificate serial")
	}
	src := newFakeSource()
	f := newEdgeFixture(t, src, ca.Pool(), "team")
	if ok, _ := f.e.Ready(); ok {
		t.Error("ready before the first snapshot")
	}
	exp := time.Now().Add(time.Minute)
	src.send(t, "team", routeTo(hostA, sup1, 1, exp), routeTo(hostB, sup2, 1, exp))
	if ok, why := f.e.Ready(); !ok {
		t.Errorf("not ready: %s", why)
	}
	f.expectOwner(hostA, sup1)
	f.expectOwner(hostB, sup2)
	// SNI is matched case-insensitively, as the listener does.
	c := f.mustDial("TEAM--A.apps.test")
	if c.serial != sup1.serial {
		t.Errorf("upper-case SNI reached %s", c.greeting)
	}
	_ = c.Close()

	f.expectUnrecognized("team--nope.apps.test")
	f.expectUnrecognized("")
	// An expired route is unknown even before the cache's timer runs.
	src.send(t, "team", routeTo(hostA, sup1, 1, exp), routeTo(hostB, sup2, 1, time.Now().Add(-time.Millisecond)))
	f.expectUnrecognized(hostB)
	// Plain HTTP gets a 400, not a hang.
	raw, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(raw, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, _ := io.ReadAll(raw)
	_ = raw.Close()
	if !bytes.HasPrefix(resp, []byte("HTTP/1.1 400 ")) {
		t.Errorf("plain HTTP answer %q", resp)
	}

	for _, c := range []struct {
		result string
		min    float64
	}{{resultSpliced, 3}, {resultUnknownName, 2}, {resultNoSNI, 1}, {resultNotTLS, 1}} {
		if n := f.metric("applistener_edge_connections_total", "result", c.result); n < c.min {
			t.Errorf("connections{result=%s} = %v, want ≥ %v", c.result, n, c.min)
		}
	}
}

// Moving a hostname to the other supervisor: new connections follow after
// one snapshot; existing spliced connections to the old owner are closed.
// Removing a hostname closes its connections; other hostnames are not
// touched; a new installation version at the same endpoint keeps them.
func TestEdgeMoveAndRemove(t *testing.T) {
	ca := newCA(t)
	sup1, sup2 := newFakeSupervisor(t, ca, "sup-1"), newFakeSupervisor(t, ca, "sup-2")
	src := newFakeSource()
	f := newEdgeFixture(t, src, ca.Pool(), "team")
	exp := time.Now().Add(time.Minute)
	src.send(t, "team", routeTo(hostA, sup1, 1, exp), routeTo(hostB, sup2, 1, exp))
	a1 := f.mustDial(hostA)
	b1 := f.mustDial(hostB)
	testutil.Eventually(t, time.Second, "2 active splices", func() bool { return f.metric("applistener_edge_active_splices") == 2 })

	// A new installation version at the same endpoint: connections stay.
	src.send(t, "team", routeTo(hostA, sup1, 2, exp), routeTo(hostB, sup2, 1, exp))
	a1.echo(t, "still here")

	// Move A to sup-2.
	moved := time.Now()
	src.send(t, "team", routeTo(hostA, sup2, 3, exp), routeTo(hostB, sup2, 1, exp))
	took := a1.expectClosed(t, 2*time.Second)
	t.Logf("spliced connection to the old owner closed %v after the snapshot (%v after the read started)",
		time.Since(moved).Round(time.Microsecond), took.Round(time.Microsecond))
	f.expectOwner(hostA, sup2)
	b1.echo(t, "b untouched")

	// Remove B.
	src.send(t, "team", routeTo(hostA, sup2, 3, exp))
	b1.expectClosed(t, 2*time.Second)
	f.expectUnrecognized(hostB)
	if n := f.metric("applistener_edge_splices_closed_total", "reason", "owner_changed"); n != 1 {
		t.Errorf("owner_changed closes %v", n)
	}
	if n := f.metric("applistener_edge_splices_closed_total", "reason", "route_gone"); n != 1 {
		t.Errorf("route_gone closes %v", n)
	}
	testutil.Eventually(t, time.Second, "no active splices", func() bool { return f.metric("applistener_edge_active_splices") == 0 })
}

// TestEdgeWithdrawGrace: the connections of a withdrawn route stay open
// for the withdrawal grace, so that their supervisor (which revokes the
// route as well) can close them with its own close frames; new connections
// are refused at once; what is left is closed when the grace ends. An
// expired route's connections are closed at once.
func TestEdgeWithdrawGrace(t *testing.T) {
	ca := newCA(t)
	sup1 := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	const grace = 2 * time.Second
	f := newEdgeFixtureGrace(t, grace, src, ca.Pool(), "team")
	exp := time.Now().Add(time.Minute)
	src.send(t, "team", routeTo(hostA, sup1, 1, exp), routeTo(hostB, sup1, 1, exp))
	a := f.mustDial(hostA)
	b := f.mustDial(hostB)
	withdrawn := time.Now()
	src.send(t, "team", routeTo(hostB, sup1, 1, exp))
	f.expectUnrecognized(hostA)
	// Within the grace the connection still carries bytes both ways.
	a.echo(t, "still open in the grace")
	if took := time.Since(withdrawn); took >= grace {
		t.Fatalf("the in-grace echo took until %v after the withdrawal; the grace is %v", took, grace)
	}
	a.expectClosed(t, grace+3*time.Second)
	if took := time.Since(withdrawn); took < grace {
		t.Errorf("closed %v after the withdrawal; want the %v grace", took, grace)
	}
	testutil.Eventually(t, time.Second, "the grace's close counted", func() bool {
		return f.metric("applistener_edge_splices_closed_total", "reason", "route_gone") == 1
	})
	b.echo(t, "b untouched")
}

// The cache drops a route at its expires_at by itself (the source is
// silent) and closes its connections.
func TestEdgeExpiry(t *testing.T) {
	ca := newCA(t)
	sup1 := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	f := newEdgeFixture(t, src, ca.Pool(), "team")
	// expires_at far enough ahead for both dials on a loaded CI machine;
	// the watch stays silent, so only the edge's own timer can close a.
	exp := time.Now().Add(1500 * time.Millisecond)
	src.send(t, "team", routeTo(hostA, sup1, 1, exp), routeTo(hostB, sup1, 1, time.Now().Add(time.Minute)))
	a := f.mustDial(hostA)
	b := f.mustDial(hostB)
	a.expectClosed(t, 10*time.Second)
	late := time.Since(exp)
	t.Logf("connection of the expired route closed %v after expires_at", late.Round(time.Millisecond))
	// Never before expires_at; promptly after it (a silent watch does not
	// keep it alive: without the timer it would live until the next
	// update, never in this test). The upper bound is generous for a
	// noisy 2-core machine running -race.
	if late < 0 || late > 5*time.Second {
		t.Errorf("closed %v after expires_at", late)
	}
	f.expectUnrecognized(hostA)
	b.echo(t, "b lives")
	if n := f.metric("applistener_edge_routes"); n != 1 {
		t.Errorf("routes gauge %v", n)
	}
}

// A refused watch (the token lost its grant) drops the workspace's routes.
func TestEdgeRefusalDropsWorkspace(t *testing.T) {
	ca := newCA(t)
	sup1 := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	f := newEdgeFixture(t, src, ca.Pool(), "team", "lab")
	exp := time.Now().Add(time.Minute)
	src.send(t, "team", routeTo(hostA, sup1, 1, exp))
	src.send(t, "lab", routeTo("lab--x.apps.test", sup1, 1, exp))
	// A route of another workspace in team's feed is ignored.
	src.send(t, "team", routeTo(hostA, sup1, 1, exp), routeTo("lab--y.apps.test", sup1, 1, exp))
	f.expectUnrecognized("lab--y.apps.test")
	a := f.mustDial(hostA)
	src.deliver(t, "team", fakeUpdate{err: &api.DiscoveryStatusError{Code: http.StatusForbidden, Body: "not granted"}})
	a.expectClosed(t, 2*time.Second)
	f.expectUnrecognized(hostA)
	f.expectOwner("lab--x.apps.test", sup1)
	if ok, _ := f.e.Ready(); ok {
		t.Error("ready with a refused workspace")
	}
}

// Half-close passes through: the client's end of stream reaches the
// supervisor, whose answer still reaches the client.
func TestEdgeHalfClose(t *testing.T) {
	ca := newCA(t)
	sup1 := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	f := newEdgeFixture(t, src, ca.Pool(), "team")
	src.send(t, "team", routeTo(hostA, sup1, 1, time.Now().Add(time.Minute)))
	c := f.mustDial(hostA)
	c.echo(t, "x")
	// close_notify, then a TCP FIN: both pass through the edge.
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := c.NetConn().(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(c.br)
	if err != nil || string(rest) != "bye\n" {
		t.Fatalf("after half-close: %q, %v", rest, err)
	}
	// Both directions ended: the splice ends without waiting for the
	// half-close timeout (2s here).
	start := time.Now()
	testutil.Eventually(t, time.Second, "no active splices", func() bool { return f.metric("applistener_edge_active_splices") == 0 })
	t.Logf("splice ended %v after the client read the end of stream", time.Since(start).Round(time.Millisecond))
}

// Shutdown lets spliced connections finish until its context ends, then
// closes them; new connections are refused.
func TestEdgeShutdownDrains(t *testing.T) {
	ca := newCA(t)
	sup1 := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	f := newEdgeFixture(t, src, ca.Pool(), "team")
	src.send(t, "team", routeTo(hostA, sup1, 1, time.Now().Add(time.Minute)))
	c := f.mustDial(hostA)
	// A connection stuck before its ClientHello is closed at once.
	idle, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = idle.Close() }()
	testutil.Eventually(t, time.Second, "the idle connection", func() bool {
		f.e.mu.Lock()
		defer f.e.mu.Unlock()
		return len(f.e.pending) == 1
	})
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		done <- f.e.Shutdown(ctx)
	}()
	_ = idle.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := idle.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("pending connection not closed: %v", err)
	}
	c.echo(t, "during drain")
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 2*time.Second {
		t.Errorf("Shutdown took %v (drain timeout 300ms)", d)
	}
	c.expectClosed(t, time.Second)
	if _, err := net.DialTimeout("tcp", f.addr, time.Second); err == nil {
		t.Error("the edge still accepts")
	}
	f.stop()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// The whole chain in one process: a real gateway, two supervisors
// advertising over HTTP, the discovery client as the edge's source.
func TestEdgeWithGateway(t *testing.T) {
	ca := newCA(t)
	sup1, sup2 := newFakeSupervisor(t, ca, "sup-1"), newFakeSupervisor(t, ca, "sup-2")
	dir := t.TempDir()
	cfgPath, tokPath := filepath.Join(dir, "gw.json"), filepath.Join(dir, "tokens.json")
	writeGatewayConfig := func(ownerOfA string) {
		other := map[string]string{"sup-1": "sup-2", "sup-2": "sup-1"}[ownerOfA]
		doc := func(insts ...map[string]any) map[string]any {
			return map[string]any{"revision": "r", "instances": insts}
		}
		inst := func(sb, svc string) map[string]any {
			return map[string]any{"workspace": "team", "sandbox": sb, "generation": "1",
				"services": []any{map[string]any{"name": svc, "port": 8080, "revision": 1}}}
		}
		b, _ := json.Marshal(map[string]any{"supervisors": map[string]any{
			ownerOfA: doc(inst("a", "")),
			other:    doc(inst("b", "web")),
		}})
		if err := os.WriteFile(cfgPath+".tmp", b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cfgPath+".tmp", cfgPath); err != nil {
			t.Fatal(err)
		}
	}
	writeGatewayConfig("sup-1")
	if err := os.WriteFile(tokPath, []byte(`{"tokens":[{"token":"s1","supervisor":"sup-1"},{"token":"s2","supervisor":"sup-2"},{"token":"edge","workspaces":["team"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{ConfigPath: cfgPath, TokensPath: tokPath, Keepalive: 100 * time.Millisecond,
		Poll: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	defer srv.Close()
	gctx, gcancel := context.WithCancel(context.Background())
	var gwg sync.WaitGroup
	gwg.Go(func() { gw.Run(gctx) })
	defer func() {
		gw.Close()
		gcancel()
		gwg.Wait()
	}()
	put := func(sup, token string, rs ...api.ServiceRoute) {
		t.Helper()
		if rs == nil {
			rs = []api.ServiceRoute{}
		}
		b, _ := json.Marshal(map[string]any{"installations": rs})
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/supervisors/"+sup+"/installations", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("PUT: %d", resp.StatusCode)
		}
	}
	tokFile := filepath.Join(dir, "edge-token")
	if err := os.WriteFile(tokFile, []byte("edge\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	client := &api.DiscoveryClient{Gateway: srv.URL, TokenFile: tokFile, StreamIdleTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	defer client.CloseIdleConnections()
	f := newEdgeFixture(t, client, ca.Pool(), "team")
	defer f.stop()

	exp := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond)
	put("sup-1", "s1", routeTo(hostA, sup1, 1, exp))
	put("sup-2", "s2", routeTo(hostB, sup2, 1, exp))
	testutil.Eventually(t, 2*time.Second, "both routes at the edge", func() bool {
		_, a := f.e.Lookup(hostA)
		_, b := f.e.Lookup(hostB)
		return a && b
	})
	f.expectOwner(hostA, sup1)
	f.expectOwner(hostB, sup2)
	a1 := f.mustDial(hostA)

	// The operator moves sandbox a to sup-2: sup-1's advertisement is no
	// longer granted (the route vanishes at once), then sup-2 advertises it.
	writeGatewayConfig("sup-2")
	if err := gw.Reload(); err != nil {
		t.Fatal(err)
	}
	a1.expectClosed(t, 2*time.Second)
	f.expectUnrecognized(hostA)
	put("sup-2", "s2", routeTo(hostA, sup2, 2, exp))
	put("sup-1", "s1", routeTo(hostB, sup1, 2, exp))
	testutil.Eventually(t, 2*time.Second, "the move", func() bool {
		ep, ok := f.e.Lookup(hostA)
		return ok && ep == sup2.endpoint().String()
	})
	f.expectOwner(hostA, sup2)
	f.expectOwner(hostB, sup1)
}

// The edge's traffic metrics: one time-to-first-byte observation per
// spliced connection (none for a refused one), and the bytes of both
// directions once the connections end.
func TestEdgeTrafficMetrics(t *testing.T) {
	ca := newCA(t)
	sup := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	f := newEdgeFixture(t, src, ca.Pool(), "team")
	src.send(t, "team", routeTo(hostA, sup, 1, time.Now().Add(time.Minute)))
	f.expectOwner(hostA, sup)
	for range 2 {
		c := f.mustDial(hostA)
		_ = c.Close()
	}
	f.expectUnrecognized("team--nope.apps.test")

	spliced := f.metric("applistener_edge_connections_total", "result", resultSpliced)
	testutil.Eventually(t, 10*time.Second, "every splice ended and counted", func() bool {
		return f.metric("applistener_edge_active_splices") == 0
	})
	if n := f.histogramCount("applistener_edge_first_byte_seconds"); n != uint64(spliced) || n < 3 {
		t.Errorf("first-byte observations %d, spliced connections %v (want equal, at least 3)", n, spliced)
	}
	// A TLS handshake each way: a ClientHello up, a ServerHello and the
	// certificate down.
	up := f.metric("applistener_edge_bytes_total", "direction", "client_to_supervisor")
	down := f.metric("applistener_edge_bytes_total", "direction", "supervisor_to_client")
	if up < 200 || down < 500 {
		t.Errorf("bytes up %v, down %v: want a handshake's worth each way", up, down)
	}
}
