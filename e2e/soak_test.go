package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestSoak runs mixed traffic through a gateway session for SOAK_DURATION
// (default 10m) while the gateway's configuration churns: keep-alive
// requests and WebSocket echoes on two stable services, traffic on churning
// services that are added and removed every few seconds. It reports the
// errors on the stable services (target 0) and the supervisor's goroutines
// and RSS at the start and the end, and fails if goroutines do not come
// back to the start + 20 once the load stops. Opt-in: SOAK=1 (make soak).
func TestSoak(t *testing.T) {
	if os.Getenv("SOAK") != "1" {
		t.Skip("soak test is opt-in: run it with SOAK=1 (make soak); SOAK_DURATION sets its length (default 10m)")
	}
	dur := 10 * time.Minute
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("SOAK_DURATION=%q: want a positive Go duration", s)
		}
		dur = d
	}
	const churnEvery = 2 * time.Second

	web, api, churn := newSoakBackend(t, "web"), newSoakBackend(t, "api"), newSoakBackend(t, "churn")
	churnNames := []string{"c1", "c2", "c3"}
	var stateMu sync.Mutex
	active := map[string]bool{"c1": true}
	doc := func() []byte {
		s := []service{{Name: "web", Port: web.port, Revision: 1}, {Name: "api", Port: api.port, Revision: 1}}
		for _, n := range churnNames {
			if active[n] {
				s = append(s, service{Name: n, Port: churn.port, Revision: 1})
			}
		}
		return routesDocument(docEntry{sandbox: "demo", services: s})
	}
	stateMu.Lock()
	first := doc()
	stateMu.Unlock()
	gw := newMemGateway(t, first)
	gw.start(t)
	p := gw.startSupervisor(t, supervisorConfig{})

	metric := func(name string) float64 { return metricAt(t, p.adminAddr, name, nil) }
	g0, rss0 := metric("go_goroutines"), metric("process_resident_memory_bytes")
	t.Logf("start: goroutines %v, RSS %.1f MiB; running %v", g0, rss0/(1<<20), dur)

	var (
		stableReqs, stableErrs atomic.Int64
		wsEchoes, wsErrs       atomic.Int64
		churnOK, churnRefused  atomic.Int64
		churnWSClosed          atomic.Int64
		edits                  atomic.Int64
		errMu                  sync.Mutex
		errSamples             []string
	)
	begin := time.Now()
	stableErr := func(format string, args ...any) {
		stableErrs.Add(1)
		errMu.Lock()
		if len(errSamples) < 20 {
			errSamples = append(errSamples, fmt.Sprintf("at %v: ", time.Since(begin).Round(time.Millisecond))+fmt.Sprintf(format, args...))
		}
		errMu.Unlock()
	}

	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	var clients []*http.Client
	newClient := func(host string) *http.Client {
		c, _ := p.client(t, host)
		clients = append(clients, c)
		return c
	}

	// Keep-alive requests on the stable services.
	for _, h := range []struct{ host, name string }{{hostWeb, "web"}, {hostWeb, "web"}, {hostAPI, "api"}, {hostAPI, "api"}} {
		c := newClient(h.host)
		wg.Go(func() {
			for ctx.Err() == nil {
				stableReqs.Add(1)
				if err := expect200(c, h.host, h.name); err != nil && ctx.Err() == nil {
					stableErr("%v", err)
				}
				sleepCtx(ctx, 5*time.Millisecond)
			}
		})
	}
	// WebSocket echoes on the stable services.
	for i, host := range []string{hostWeb, hostWeb, hostAPI, hostAPI} {
		wg.Go(func() {
			var ws *websocket.Conn
			defer func() {
				if ws != nil {
					_ = ws.Close()
				}
			}()
			for n := 0; ctx.Err() == nil; n++ {
				if ws == nil {
					c, err := p.wsTryDial(host)
					if err != nil {
						if ctx.Err() == nil {
							wsErrs.Add(1)
							stableErr("WebSocket dial %s: %v", host, err)
						}
						sleepCtx(ctx, 100*time.Millisecond)
						continue
					}
					ws = c
				}
				if err := wsEcho(ws, websocket.TextMessage, []byte(fmt.Sprintf("soak %d/%d", i, n))); err != nil {
					if ctx.Err() == nil {
						wsErrs.Add(1)
						stableErr("WebSocket %s: %v", host, err)
					}
					_ = ws.Close()
					ws = nil
					continue
				}
				wsEchoes.Add(1)
				sleepCtx(ctx, 20*time.Millisecond)
			}
		})
	}
	// Traffic on the churning services: errors are expected there.
	churnClients := map[string]*http.Client{}
	for _, n := range churnNames {
		churnClients[n] = newClient(serviceHost("team", "demo", n))
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			n := churnNames[rand.IntN(len(churnNames))]
			if err := expect200(churnClients[n], serviceHost("team", "demo", n), "churn"); err != nil {
				churnRefused.Add(1)
			} else {
				churnOK.Add(1)
			}
			sleepCtx(ctx, 10*time.Millisecond)
		}
	})
	wg.Go(func() {
		for ctx.Err() == nil {
			n := churnNames[rand.IntN(len(churnNames))]
			ws, err := p.wsTryDial(serviceHost("team", "demo", n))
			if err != nil {
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			for ctx.Err() == nil {
				if wsEcho(ws, websocket.TextMessage, []byte("churn")) != nil {
					churnWSClosed.Add(1)
					break
				}
				sleepCtx(ctx, 50*time.Millisecond)
			}
			_ = ws.Close()
		}
	})
	// Configuration churn.
	wg.Go(func() {
		for sleepCtx(ctx, churnEvery) {
			stateMu.Lock()
			n := churnNames[rand.IntN(len(churnNames))]
			active[n] = !active[n]
			d := doc()
			stateMu.Unlock()
			if err := writeFileAtomic(gw.configPath, d); err != nil {
				stableErr("writing the gateway config: %v", err)
				continue
			}
			edits.Add(1)
		}
	})
	// Progress.
	every := max(min(dur/10, time.Minute), 5*time.Second)
	var gPeak, rssPeak float64
	for sleepCtx(ctx, every) {
		g, _, _ := scrapeMetric(p.adminAddr, "go_goroutines", nil)
		r, _, _ := scrapeMetric(p.adminAddr, "process_resident_memory_bytes", nil)
		gPeak, rssPeak = max(gPeak, g), max(rssPeak, r)
		t.Logf("%v: stable requests %d (errors %d), WebSocket echoes %d (errors %d), churn ok/refused %d/%d, churn WebSockets closed %d, edits %d; goroutines %v, RSS %.1f MiB",
			time.Since(begin).Round(time.Second), stableReqs.Load(), stableErrs.Load(), wsEchoes.Load(), wsErrs.Load(),
			churnOK.Load(), churnRefused.Load(), churnWSClosed.Load(), edits.Load(), g, r/(1<<20))
	}
	wg.Wait()
	for _, c := range clients {
		c.Transport.(*http.Transport).CloseIdleConnections()
	}

	// Connections closed and churn over: goroutines come back.
	var g1 float64
	deadline := time.Now().Add(30 * time.Second)
	for {
		g1 = metric("go_goroutines")
		if g1 <= g0+20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rss1 := metric("process_resident_memory_bytes")
	t.Logf("soak %v: stable requests %d, errors %d; WebSocket echoes %d, errors %d; churn requests ok %d, refused %d; churn WebSockets closed %d; config edits %d",
		dur, stableReqs.Load(), stableErrs.Load(), wsEchoes.Load(), wsErrs.Load(), churnOK.Load(), churnRefused.Load(), churnWSClosed.Load(), edits.Load())
	t.Logf("supervisor goroutines: start %v, peak under load %v, end %v; RSS: start %.1f MiB, peak under load %.1f MiB, end %.1f MiB",
		g0, gPeak, g1, rss0/(1<<20), rssPeak/(1<<20), rss1/(1<<20))
	if n := stableErrs.Load(); n > 0 {
		errMu.Lock()
		t.Errorf("%d errors on the stable routes (want 0); first: %s", n, strings.Join(errSamples, "; "))
		errMu.Unlock()
	}
	if stableReqs.Load() == 0 || wsEchoes.Load() == 0 || edits.Load() == 0 {
		t.Errorf("the soak did not run: requests %d, echoes %d, edits %d", stableReqs.Load(), wsEchoes.Load(), edits.Load())
	}
	if g1 > g0+20 {
		t.Errorf("supervisor goroutines at the end %v > start %v + 20 (leak?)", g1, g0)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// writeFileAtomic replaces path by rename, reporting errors (for goroutines).
func writeFileAtomic(path string, doc []byte) error {
	data := append([]byte(`{"supervisors":{"`+supervisorID+`":`), doc...)
	data = append(data, "}}\n"...)
	tmp := path + ".soak-tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// soakBackend is an app that answers "hello from NAME" and echoes
// WebSockets on /ws without recording anything (a soak sends millions of
// requests).
type soakBackend struct {
	name string
	srv  *httptest.Server
	port int

	ws wsEchoes
}

func newSoakBackend(t testing.TB, name string) *soakBackend {
	t.Helper()
	b := &soakBackend{name: name}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	b.port = b.srv.Listener.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() {
		b.ws.closeAll()
		b.srv.Close()
		b.ws.wg.Wait()
	})
	return b
}

func (b *soakBackend) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/ws" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintf(w, "hello from %s\n", b.name)
		return
	}
	b.ws.serve(w, r)
}
