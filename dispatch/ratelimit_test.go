package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
	"github.com/applistener/applistener/wake"
)

// The rate-limit tests' hosts: team/limited (web and an h2c gRPC
// service) and team/other share one listener; team/limited's limits are
// the test's to change.
var (
	rlWeb   = routes.Hostname("team", "limited", "web", h2Domain)
	rlGRPC  = routes.Hostname("team", "limited", "grpc", h2Domain)
	rlOther = routes.Hostname("team", "other", "web", h2Domain)
)

// rlPattern is the body of /download?n=N: a repeating sequence whose
// length (251, a prime) makes a shifted or cut body show.
func rlPattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// rlEnv is a listener with real TLS in front of a real HTTP app and a real
// gRPC server, with team/limited under limits the test sets.
type rlEnv struct {
	t        *testing.T
	ca       *tlsconf.Authority
	ln       net.Listener
	table    *routes.Table
	srv      *Server
	appPort  int
	grpcPort int
	log      *lineLog // the access log (JSON)
	// sleeping installs team/limited asleep (wake on any request), with a
	// wake coordinator whose platform counts wakes and never wakes it.
	sleeping bool
	wakes    atomic.Int32
	wg       sync.WaitGroup
}

func newRLEnv(t *testing.T, limits string) *rlEnv { return newRLEnvWith(t, limits, false) }

func newRLEnvWith(t *testing.T, limits string, sleeping bool) *rlEnv {
	t.Helper()
	h2Verify(t)
	e := &rlEnv{t: t, sleeping: sleeping}
	ca, cert := wildcardAuthority(t, "rate limit test CA")
	e.ca = ca
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/download":
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			w.Header().Set("Content-Length", strconv.Itoa(n))
			_, _ = w.Write(rlPattern(n))
		case "/upload":
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			_, _ = fmt.Fprintf(w, "%d", n)
		case "/early": // answers having read only the start of the body
			_, _ = io.CopyN(io.Discard, r.Body, 16<<10+1)
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			w.(http.Flusher).Flush()
		case "/ws":
			c, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			for {
				op, msg, err := c.ReadMessage()
				if err != nil {
					return
				}
				if err := c.WriteMessage(op, msg); err != nil {
					return
				}
			}
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(app.Close)
	e.appPort = app.Listener.Addr().(*net.TCPAddr).Port
	e.grpcPort = startGRPCApp(t)
	e.table = routes.NewTable(routes.Options{Domain: h2Domain, Logger: slog.New(slog.DiscardHandler)})
	e.apply(limits)
	e.log = &lineLog{}
	cfg := Config{Logger: slog.New(slog.DiscardHandler), AccessLog: AccessLogJSON, AccessLogWriter: e.log}
	ctx, stopFollow := context.WithCancel(context.Background())
	var coord *wake.Coordinator
	var err error
	if sleeping {
		coord, err = wake.New(wake.Options{Logger: slog.New(slog.DiscardHandler),
			Waker: wake.WakerFunc(func(context.Context, wake.Key) error {
				e.wakes.Add(1)
				return nil
			})})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Wakes = coord
		e.wg.Go(func() { coord.FollowTable(ctx, e.table) })
	}
	e.srv = New(cfg)
	e.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveRoutesTLS(&e.wg, e.ln, cert, e.table, e.srv)
	t.Cleanup(func() {
		_ = e.ln.Close()
		stopFollow()
		if coord != nil {
			coord.Close()
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = e.srv.Shutdown(sctx)
		cancel()
		e.table.Close()
		e.wg.Wait()
	})
	return e
}

// apply installs team/limited with limits (a JSON object) and team/other
// without any; withLimited false withdraws team/limited.
func (e *rlEnv) applyDoc(limits string, withLimited bool) routes.ApplyResult {
	e.t.Helper()
	other := fmt.Sprintf(`{"workspace":"team","sandbox":"other","generation":"1","services":[{"name":"web","port":%d}]}`, e.appPort)
	entries := other
	if withLimited {
		state := "active"
		if e.sleeping {
			state = "sleeping"
		}
		entries = fmt.Sprintf(`{"workspace":"team","sandbox":"limited","generation":"1","state":%q,"limits":%s,"services":[`+
			`{"name":"web","port":%d,"wake":{"on":"any","hold_seconds":1}},{"name":"grpc","port":%d,"protocol":"h2c"}]},`,
			state, limits, e.appPort, e.grpcPort) + other
	}
	d, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[` + entries + `]}`))
	if err != nil || len(d.Rejected) > 0 {
		e.t.Fatalf("document: %v %+v", err, d.Rejected)
	}
	return e.table.Apply(d)
}

func (e *rlEnv) apply(limits string) routes.ApplyResult { return e.applyDoc(limits, true) }

func (e *rlEnv) client(h2 bool) *http.Client {
	return &http.Client{Transport: listenerTransport(e.t, e.ca, e.ln.Addr().String(), h2), Timeout: 30 * time.Second}
}

// get sends GET target to host with hdr and reads the whole answer.
func (e *rlEnv) get(c *http.Client, host, target string, hdr map[string]string) accessResp {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+host+target, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatalf("GET %s%s: %v", host, target, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("GET %s%s: body: %v", host, target, err)
	}
	return accessResp{status: resp.StatusCode, header: resp.Header, body: string(body), proto: resp.ProtoMajor}
}

// drain empties team/limited's request bucket: the next request within
// its interval is refused.
func (e *rlEnv) drain() {
	inst := e.table.Lookup(rlWeb).Instance
	for i := 0; ; i++ {
		if ok, _ := inst.AllowRequest(time.Now()); !ok {
			return
		}
		if i > 1_000_000 {
			e.t.Fatal("team/limited is not rate limited")
		}
	}
}

// refused runs attempt on a drained bucket until it is not admitted (a
// loaded machine may let the interval pass between the two); it fails
// after a few admissions in a row.
func refused[T any](e *rlEnv, attempt func() (T, bool)) T {
	e.t.Helper()
	var last T
	for range 5 {
		e.drain()
		var admitted bool
		if last, admitted = attempt(); !admitted {
			return last
		}
	}
	e.t.Fatal("five requests on a drained bucket were all admitted")
	return last
}

// want429 checks a 429 answer's Retry-After (whole seconds, 1 or 2 at one
// request per second) and its body's form.
func want429(t *testing.T, r accessResp, ctype, bodyHas string) {
	t.Helper()
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != http.StatusTooManyRequests || err != nil || ra < 1 || ra > 2 {
		t.Fatalf("status %d Retry-After %q, want 429 with Retry-After 1..2", r.status, r.header.Get("Retry-After"))
	}
	if got := r.header.Get("Content-Type"); got != ctype || !strings.Contains(r.body, bodyHas) {
		t.Fatalf("429 answer %q %q, want %s containing %q", got, r.body, ctype, bodyHas)
	}
	if ctype == "application/json" {
		var v struct {
			Error      string `json:"error"`
			RetryAfter int    `json:"retry_after"`
		}
		if err := json.Unmarshal([]byte(r.body), &v); err != nil || v.Error != "rate_limited" || v.RetryAfter != ra {
			t.Fatalf("429 JSON %q (%v), want rate_limited, retry_after %d", r.body, err, ra)
		}
	}
}

// TestRateLimitRequests: over its requests_per_second, an instance's
// requests are answered 429 with Retry-After, in JSON for a fetch and as a
// page for a navigation, on HTTP/1.1 and HTTP/2; the connection stays
// open; WebSocket handshakes count as requests on both protocols; another
// instance on the listener is unaffected.
func TestRateLimitRequests(t *testing.T) {
	e := newRLEnv(t, `{"requests_per_second":1,"requests_burst":1}`)
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			c := e.client(h2)
			var conns atomic.Int32
			tr := c.Transport.(*http.Transport)
			dial := tr.DialContext
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				conns.Add(1)
				return dial(ctx, network, addr)
			}
			fetch := refused(e, func() (accessResp, bool) {
				r := e.get(c, rlWeb, "/", map[string]string{"Accept": "application/json", "Sec-Fetch-Mode": "cors"})
				return r, r.status == http.StatusOK
			})
			want429(t, fetch, "application/json", `"rate_limited"`)
			rec := e.log.waitRecord(t, "request_id", fetch.header.Get("X-Request-Id"))
			if rec["status"] != float64(429) || rec["reason"] != reasonRateLimited || rec["sandbox"] != "limited" {
				t.Errorf("access log of the 429: %v, want status 429, reason %q", rec, reasonRateLimited)
			}
			nav := refused(e, func() (accessResp, bool) {
				r := e.get(c, rlWeb, "/", map[string]string{"Accept": "text/html", "Sec-Fetch-Mode": "navigate"})
				return r, r.status == http.StatusOK
			})
			want429(t, nav, "text/html; charset=utf-8", "Too many requests")
			head := refused(e, func() (accessResp, bool) {
				req, _ := http.NewRequest(http.MethodHead, "https://"+rlWeb+"/", nil)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				return accessResp{status: resp.StatusCode, header: resp.Header}, resp.StatusCode == http.StatusOK
			})
			if head.status != http.StatusTooManyRequests || head.header.Get("Retry-After") == "" {
				t.Fatalf("HEAD: %d, want 429 with Retry-After", head.status)
			}
			// The other instance is not held back by this one's limit.
			for range 20 {
				if r := e.get(c, rlOther, "/", nil); r.status != http.StatusOK {
					t.Fatalf("team/other: %d %q, want 200", r.status, r.body)
				}
			}
			if n := conns.Load(); n > 2 {
				t.Errorf("%d connections for two hosts: a 429 closed its connection", n)
			}
		})
	}

	t.Run("websocket h1", func(t *testing.T) {
		d := listenerWSDialer(e.ca, e.ln.Addr().String(), rlWeb)
		resp := refused(e, func() (*http.Response, bool) {
			ws, resp, err := d.Dial("wss://"+rlWeb+"/ws", nil)
			if err == nil {
				_ = ws.Close()
				return resp, true
			}
			if resp == nil {
				t.Fatalf("handshake: %v", err)
			}
			return resp, false
		})
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("handshake: %d, want 429 with Retry-After", resp.StatusCode)
		}
	})

	t.Run("websocket h2", func(t *testing.T) {
		cc := (&accessEnv{t: t, ca: e.ca, ln: e.ln}).dialH2Access(rlWeb)
		resp := refused(e, func() (*http.Response, bool) {
			ws, err := openAccessWS(t, cc, rlWeb, "/ws", nil)
			if err != nil {
				t.Fatalf("extended CONNECT: %v", err)
			}
			return ws.resp, ws.resp.StatusCode == http.StatusOK
		})
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("extended CONNECT: %d, want 429 with Retry-After", resp.StatusCode)
		}
	})

	t.Run("grpc", func(t *testing.T) {
		creds := credentials.NewTLS(&tls.Config{ServerName: rlGRPC, RootCAs: e.ca.Pool()})
		cc, err := grpc.NewClient("passthrough:///"+e.ln.Addr().String(), grpc.WithTransportCredentials(creds), grpc.WithAuthority(rlGRPC))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cc.Close() }()
		client := testpb.NewTestServiceClient(cc)
		call := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 3})
			return err
		}
		err = refused(e, func() (error, bool) {
			err := call()
			return err, err == nil
		})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("gRPC call over the rate: %v, want ResourceExhausted", err)
		}
	})

	t.Run("raised in place", func(t *testing.T) {
		c := e.client(false)
		r0 := e.table.Lookup(rlWeb)
		refused(e, func() (accessResp, bool) {
			r := e.get(c, rlWeb, "/", nil)
			return r, r.status == http.StatusOK
		})
		res := e.apply(`{"requests_per_second":1000,"requests_burst":100}`)
		if e.table.Lookup(rlWeb) != r0 || res.Changed != 0 || res.Installed != 0 {
			t.Fatalf("a change of rate limits reinstalled the route: %+v", res)
		}
		for i := range 50 {
			if r := e.get(c, rlWeb, "/", nil); r.status != http.StatusOK {
				t.Fatalf("request %d after raising the rate: %d, want 200", i, r.status)
			}
		}
		e.apply(`{"requests_per_second":1,"requests_burst":1}`)
	})
}

// TestRateLimitAccuracy: clients sending as fast as they can to an
// instance limited at 50 requests per second (burst 10) get no more than
// burst + rate × elapsed admitted (+10 %), and a good part of it, while a
// client of another instance on the same listener gets no 429.
func TestRateLimitAccuracy(t *testing.T) {
	const rate, burst = 50, 10
	e := newRLEnv(t, `{}`)
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			e.apply(`{}`) // a fresh, full bucket below
			e.apply(fmt.Sprintf(`{"requests_per_second":%d,"requests_burst":%d}`, rate, burst))
			c, quiet := e.client(h2), e.client(h2)
			var admitted, limited, other, otherBad atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			start := time.Now()
			for range 4 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						req, _ := http.NewRequest(http.MethodGet, "https://"+rlWeb+"/", nil)
						resp, err := c.Do(req)
						if err != nil {
							t.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						_ = resp.Body.Close()
						switch resp.StatusCode {
						case http.StatusOK:
							admitted.Add(1)
						case http.StatusTooManyRequests:
							limited.Add(1)
						default:
							t.Errorf("status %d", resp.StatusCode)
							return
						}
					}
				})
			}
			wg.Go(func() {
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					resp, err := quiet.Get("https://" + rlOther + "/")
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					other.Add(1)
					if resp.StatusCode != http.StatusOK {
						otherBad.Add(1)
					}
				}
			})
			time.Sleep(2 * time.Second) // the measurement's length; the bounds use the measured time
			close(stop)
			wg.Wait()
			elapsed := time.Since(start)
			want := burst + rate*elapsed.Seconds()
			got := float64(admitted.Load())
			t.Logf("admitted %.0f in %v (%.1f/s after the burst), refused %d; expected burst+rate×elapsed = %.1f (%.1f%%); other instance %d requests",
				got, elapsed.Round(time.Millisecond), (got-burst)/elapsed.Seconds(), limited.Load(), want, 100*got/want, other.Load())
			if got > want*1.1 {
				t.Errorf("admitted %.0f, more than burst+rate×elapsed %.1f + 10%%", got, want)
			}
			if got < want*0.5 || limited.Load() == 0 {
				t.Errorf("admitted %.0f (refused %d), want at least half of %.1f and some refused", got, limited.Load(), want)
			}
			if otherBad.Load() != 0 || other.Load() == 0 {
				t.Errorf("other instance: %d of %d requests not 200", otherBad.Load(), other.Load())
			}
		})
	}
}

// TestRateLimitBytes: under bytes_per_second 256 KiB (burst 64 KiB) a
// download of 512 KiB, an upload of 256 KiB and a WebSocket echo of
// 256 KiB (512 KiB relayed in both directions) are slowed to the rate and
// arrive intact, on HTTP/1.1 and HTTP/2.
func TestRateLimitBytes(t *testing.T) {
	const limits = `{"bytes_per_second":262144,"bytes_burst":65536}`
	e := newRLEnv(t, limits)
	inst := e.table.Lookup(rlWeb).Instance
	fresh := func() {
		e.apply(`{}`)
		e.apply(limits)
	}
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("download h2=%v", h2), func(t *testing.T) {
			fresh()
			c := e.client(h2)
			start := time.Now()
			r := e.get(c, rlWeb, "/download?n=524288", nil)
			took := time.Since(start)
			t.Logf("512 KiB at 256 KiB/s (burst 64 KiB) in %v (ideal 1.75 s)", took.Round(time.Millisecond))
			if r.status != 200 || !bytes.Equal([]byte(r.body), rlPattern(512<<10)) {
				t.Fatalf("download: %d, %d bytes, not intact", r.status, len(r.body))
			}
			if took < 1500*time.Millisecond {
				t.Errorf("download took %v, want at least 1.5 s at the rate", took)
			}
		})
		t.Run(fmt.Sprintf("upload h2=%v", h2), func(t *testing.T) {
			fresh()
			c := e.client(h2)
			start := time.Now()
			resp, err := c.Post("https://"+rlWeb+"/upload", "application/octet-stream", bytes.NewReader(rlPattern(256<<10)))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			took := time.Since(start)
			t.Logf("256 KiB upload at 256 KiB/s (burst 64 KiB) in %v (ideal 0.75 s)", took.Round(time.Millisecond))
			if err != nil || resp.StatusCode != 200 || string(body) != strconv.Itoa(256<<10) {
				t.Fatalf("upload: %d %q %v", resp.StatusCode, body, err)
			}
			if took < 600*time.Millisecond {
				t.Errorf("upload took %v, want at least 0.6 s at the rate", took)
			}
		})
	}
	msgs := make([][]byte, 8)
	for i := range msgs {
		msgs[i] = bytes.Repeat([]byte{byte('a' + i)}, 32<<10)
	}
	t.Run("websocket h1", func(t *testing.T) {
		fresh()
		_, pauses0 := inst.Throttled()
		d := listenerWSDialer(e.ca, e.ln.Addr().String(), rlWeb)
		ws, _, err := d.Dial("wss://"+rlWeb+"/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ws.Close() }()
		start := time.Now()
		for i, m := range msgs {
			_ = ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if err := ws.WriteMessage(websocket.BinaryMessage, m); err != nil {
				t.Fatal(err)
			}
			_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, got, err := ws.ReadMessage()
			if err != nil || !bytes.Equal(got, m) {
				t.Fatalf("echo %d: %d bytes, %v", i, len(got), err)
			}
		}
		took := time.Since(start)
		_, pauses := inst.Throttled()
		t.Logf("WebSocket echo of 256 KiB (512 KiB relayed) in %v (ideal 1.75 s), %d pauses", took.Round(time.Millisecond), pauses-pauses0)
		if took < 1200*time.Millisecond || pauses == pauses0 {
			t.Errorf("echo took %v with %d pauses, want at least 1.2 s at the rate", took, pauses-pauses0)
		}
	})
	t.Run("websocket h2", func(t *testing.T) {
		fresh()
		_, pauses0 := inst.Throttled()
		cc := (&accessEnv{t: t, ca: e.ca, ln: e.ln}).dialH2Access(rlWeb)
		ws, err := openAccessWS(t, cc, rlWeb, "/ws", nil)
		if err != nil || ws.resp.StatusCode != 200 {
			t.Fatalf("extended CONNECT: %v %v", ws, err)
		}
		start := time.Now()
		for _, m := range msgs {
			ws.echo(t, 2, m)
		}
		took := time.Since(start)
		_, pauses := inst.Throttled()
		t.Logf("HTTP/2 WebSocket echo of 256 KiB (512 KiB relayed) in %v (ideal 1.75 s), %d pauses", took.Round(time.Millisecond), pauses-pauses0)
		if took < 1200*time.Millisecond || pauses == pauses0 {
			t.Errorf("echo took %v with %d pauses, want at least 1.2 s at the rate", took, pauses-pauses0)
		}
	})
}

// TestRateLimitRevokeThrottled: withdrawing the route of an instance whose
// download is held back by its byte rate ends the download at once
// (HTTP/1.1 and HTTP/2), instead of after the minute the rate would take.
func TestRateLimitRevokeThrottled(t *testing.T) {
	const limits = `{"bytes_per_second":16384,"bytes_burst":16384}`
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			e := newRLEnv(t, limits)
			c := e.client(h2)
			resp, err := c.Get("https://" + rlWeb + "/download?n=1048576")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			if _, err := io.ReadFull(resp.Body, make([]byte, 8<<10)); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := io.Copy(io.Discard, resp.Body)
				done <- err
			}()
			inst := e.table.Lookup(rlWeb).Instance
			deadline := time.Now().Add(10 * time.Second)
			for _, pauses := inst.Throttled(); pauses == 0; _, pauses = inst.Throttled() {
				if time.Now().After(deadline) {
					t.Fatal("the download never paused")
				}
				time.Sleep(10 * time.Millisecond)
			}
			start := time.Now()
			e.applyDoc("", false)
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("the revoked download completed")
				}
				t.Logf("throttled download ended %v after the revocation: %v", time.Since(start).Round(time.Millisecond), err)
				// The listener's side ends as promptly: the paused relay
				// gives its stream slot back.
				testutil.Eventually(t, 1500*time.Millisecond, "the throttled stream released", func() bool { return inst.Active() == 0 })
			case <-time.After(2 * time.Second): // a pause of one 64 KiB buffer is 4 s
				t.Fatal("the throttled download went on 2 s after its route was withdrawn")
			}
		})
	}
}

// TestRateLimitWebSocketNotIdle: a WebSocket paused by its instance's byte
// rate for longer than its idle timeout is not idle: it is not closed,
// and carries the next message (HTTP/1.1 and HTTP/2).
func TestRateLimitWebSocketNotIdle(t *testing.T) {
	// 12 KiB up fits the 16 KiB burst; the 12 KiB echo then waits 2 s at
	// 4 KiB/s, twice the idle timeout.
	const limits = `{"bytes_per_second":4096,"bytes_burst":16384,"idle_timeout_seconds":1}`
	msg := bytes.Repeat([]byte("x"), 12<<10)
	check := func(t *testing.T, took time.Duration) {
		t.Helper()
		t.Logf("12 KiB echo paused %v with an idle timeout of 1 s", took.Round(time.Millisecond))
		if took < 1500*time.Millisecond {
			t.Errorf("echo took %v, want the 2 s pause", took)
		}
	}
	t.Run("h1", func(t *testing.T) {
		e := newRLEnv(t, limits)
		d := listenerWSDialer(e.ca, e.ln.Addr().String(), rlWeb)
		ws, _, err := d.Dial("wss://"+rlWeb+"/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ws.Close() }()
		start := time.Now()
		for i, m := range [][]byte{msg, []byte("still open")} {
			if err := ws.WriteMessage(websocket.BinaryMessage, m); err != nil {
				t.Fatal(err)
			}
			_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, got, err := ws.ReadMessage()
			if err != nil || !bytes.Equal(got, m) {
				t.Fatalf("echo %d: %d bytes, %v", i, len(got), err)
			}
			if i == 0 {
				check(t, time.Since(start))
			}
		}
	})
	t.Run("h2", func(t *testing.T) {
		e := newRLEnv(t, limits)
		cc := (&accessEnv{t: t, ca: e.ca, ln: e.ln}).dialH2Access(rlWeb)
		ws, err := openAccessWS(t, cc, rlWeb, "/ws", nil)
		if err != nil || ws.resp.StatusCode != 200 {
			t.Fatalf("extended CONNECT: %v %v", ws, err)
		}
		start := time.Now()
		ws.echo(t, 2, msg)
		check(t, time.Since(start))
		ws.echo(t, 2, []byte("still open"))
	})
}

// TestRateLimitUploadAnsweredEarly: when the app answers before reading
// the whole of a throttled upload, the request ends at once: the stopped
// body copy does not sit out its pause (HTTP/1.1 and HTTP/2).
func TestRateLimitUploadAnsweredEarly(t *testing.T) {
	// At 4 KiB/s, each buffer of the body beyond the burst waits up to 4 s:
	// the app reads one byte more than the burst, then answers while the
	// next buffer waits.
	const limits = `{"bytes_per_second":4096,"bytes_burst":16384}`
	ended := func(t *testing.T, inst *routes.Instance) {
		t.Helper()
		start := time.Now()
		testutil.Eventually(t, 1500*time.Millisecond, "the request ended", func() bool { return inst.Active() == 0 })
		_, pauses := inst.Throttled()
		t.Logf("request ended %v after the early answer (%d pauses)", time.Since(start).Round(time.Millisecond), pauses)
	}
	t.Run("h1", func(t *testing.T) {
		e := newRLEnv(t, limits)
		inst := e.table.Lookup(rlWeb).Instance
		// A client that keeps sending its body whatever the answer (Go's
		// stops at the answer), so that the listener has the next buffer.
		tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: rlWeb, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		defer wg.Wait()
		defer func() { _ = tc.Close() }()
		wg.Go(func() {
			_, _ = io.WriteString(tc, "POST /early HTTP/1.1\r\nHost: "+rlWeb+"\r\nContent-Length: 1048576\r\n\r\n")
			_, _ = tc.Write(rlPattern(1 << 20)) // ends when tc is closed
		})
		_ = tc.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want the app's 413", resp.StatusCode)
		}
		ended(t, inst)
	})
	t.Run("h2", func(t *testing.T) {
		e := newRLEnv(t, limits)
		inst := e.table.Lookup(rlWeb).Instance
		req, err := http.NewRequest(http.MethodPost, "https://"+rlWeb+"/early", bytes.NewReader(rlPattern(1<<20)))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := e.client(true).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want the app's 413", resp.StatusCode)
		}
		ended(t, inst)
	})
}

// TestThrottlePauseEnds: a pause ends at once when its pause is cancelled
// (Revoke, a request body's abort, a WebSocket's close), a cancelled
// pause stays cancelled, and a request body's pause is usable again for
// the next body.
func TestThrottlePauseEnds(t *testing.T) {
	timed := func(name string, a, b <-chan struct{}, cancel func()) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			pauseFor(time.Minute, a, b)
			close(done)
		}()
		if cancel != nil {
			cancel()
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the pause did not end", name)
		}
	}
	var p throttlePause
	timed("cancel", p.done(), nil, p.cancel)
	timed("after cancel", p.done(), nil, nil)
	var body deadlineReader
	body.start(newRecConn(), time.Second)
	timed("body abort", nil, body.pause.done(), body.abort)
	body.start(newRecConn(), time.Second)
	select {
	case <-body.pause.done():
		t.Fatal("the next body's pause is already cancelled")
	default:
	}
	var w wsSplice
	w.init(newRecConn(), newRecConn(), newRecConn(), time.Second)
	timed("websocket close", w.pause.done(), nil, w.closeBoth)
}

// TestRateLimitNeverWakes: a request refused by its instance's rate never
// wakes the sleeping instance (HTTP/1.1 and HTTP/2): the rate is checked
// before the hold.
func TestRateLimitNeverWakes(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			// A request the rate admits is held and wakes: on a loaded
			// machine that stalls past the bucket's second, start over.
			for range 3 {
				e := newRLEnvWith(t, `{"requests_per_second":1,"requests_burst":1}`, true)
				e.drain()
				r := e.get(e.client(h2), rlWeb, "/", map[string]string{"Accept": "text/html", "Sec-Fetch-Mode": "navigate"})
				if r.status != http.StatusTooManyRequests {
					continue
				}
				if n := e.wakes.Load(); n != 0 {
					t.Fatalf("%d wakes for a refused request, want none", n)
				}
				// An admitted request is held and wakes it (the count is live).
				e.apply(`{"requests_per_second":1000}`)
				e.get(e.client(h2), rlWeb, "/", map[string]string{"Accept": "text/html", "Sec-Fetch-Mode": "navigate"})
				if n := e.wakes.Load(); n != 1 {
					t.Fatalf("%d wakes for an admitted request, want 1", n)
				}
				return
			}
			t.Fatal("three requests on a drained bucket were all admitted")
		})
	}
}
