//go:build unix

// The late app reserves its port with a socket that is bound but not yet
// listening (syscall.Socket, Bind, Listen), which only Unix offers in this
// form; the e2e tests run on Linux, and this keeps the package vetting on
// Windows.

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// lateApp is a real app whose port is bound from the start but which
// listens only when listen is called: until then connections to it are
// refused, as for an app that is still starting.
type lateApp struct {
	t    *testing.T
	port int
	mu   sync.Mutex
	fd   int
	srv  *http.Server
	done chan struct{}
}

func newLateApp(t *testing.T) *lateApp {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		_ = syscall.Close(fd)
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		_ = syscall.Close(fd)
		t.Fatal(err)
	}
	a := &lateApp{t: t, port: sa.(*syscall.SockaddrInet4).Port, fd: fd}
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.srv == nil {
			_ = syscall.Close(a.fd)
			return
		}
		_ = a.srv.Close()
		<-a.done
	})
	return a
}

// listen starts serving on the reserved port; safe from any goroutine.
func (a *lateApp) listen() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv != nil {
		return
	}
	if err := syscall.Listen(a.fd, 128); err != nil {
		a.t.Errorf("late app: listen: %v", err)
		return
	}
	f := os.NewFile(uintptr(a.fd), "late-app")
	ln, err := net.FileListener(f)
	_ = f.Close()
	if err != nil {
		a.t.Errorf("late app: %v", err)
		return
	}
	a.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "started "+r.URL.Path)
	})}
	a.done = make(chan struct{})
	go func() {
		defer close(a.done)
		_ = a.srv.Serve(ln)
	}()
}

// TestAppStartThroughBinary: through the built binary, over HTTP/1.1 and
// HTTP/2, a request to an app that binds its port 2 s after the request
// arrived gets the app's 200 (default --app-start-grace, 5 s); a request
// to an app that never listens gets, after the service's
// start_grace_seconds, 502 with Retry-After: a self-refreshing HTML page
// for a navigation, {"error":"app_not_listening","port":N} for anything
// else. The waits are counted and logged.
func TestAppStartThroughBinary(t *testing.T) {
	t.Parallel()
	late := newLateApp(t)
	never := newLateApp(t)
	oneSecond := 1
	p := startProc(t, routesDoc(
		service{Name: "late", Port: late.port, Revision: 1},
		service{Name: "never", Port: never.port, Revision: 1, StartGrace: &oneSecond},
	))
	hostLate, hostNever := "team--demo--late."+domain, "team--demo--never."+domain

	type result struct {
		resp *http.Response
		body string
		err  error
	}
	do := func(proto, host, path string, header map[string]string) <-chan result {
		tr := &http.Transport{DialContext: p.dial, TLSClientConfig: tlsConfig(host), ForceAttemptHTTP2: proto == "h2"}
		if proto == "h1" {
			tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
		}
		t.Cleanup(tr.CloseIdleConnections)
		req, err := http.NewRequestWithContext(context.Background(), "GET", "https://"+host+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		out := make(chan result, 1)
		go func() {
			resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
			if err != nil {
				out <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			out <- result{resp, string(b), err}
		}()
		return out
	}
	const waiting = "applistener_app_start_waiting"

	// The app starts listening 2 s after both requests are waiting for it.
	h1 := do("h1", hostLate, "/h1", nil)
	h2 := do("h2", hostLate, "/h2", nil)
	testutil.Eventually(t, waitTimeout, "both requests to wait for the app", func() bool { return p.metric(t, waiting) == 2 })
	timer := time.AfterFunc(2*time.Second, late.listen)
	defer timer.Stop()
	for proto, ch := range map[string]<-chan result{"h1": h1, "h2": h2} {
		r := <-ch
		if r.err != nil || r.resp.StatusCode != 200 || r.body != "started /"+proto {
			t.Errorf("%s to an app that started late: %v %q (%v); want 200", proto, r.resp, r.body, r.err)
		} else if want := map[string]int{"h1": 1, "h2": 2}[proto]; r.resp.ProtoMajor != want {
			t.Errorf("%s: answered over %s", proto, r.resp.Proto)
		}
	}

	// An app that never listens: after its 1 s grace, the answers.
	wantJSON := fmt.Sprintf(`{"error":"app_not_listening","port":%d}`+"\n", never.port)
	for _, proto := range []string{"h1", "h2"} {
		nav := do(proto, hostNever, "/page", map[string]string{"Sec-Fetch-Mode": "navigate", "Accept": "text/html,*/*;q=0.8"})
		api := do(proto, hostNever, "/api", map[string]string{"Accept": "application/json"})
		for kind, ch := range map[string]<-chan result{"navigation": nav, "fetch": api} {
			r := <-ch
			if r.err != nil || r.resp.StatusCode != http.StatusBadGateway {
				t.Errorf("%s %s: %v (%v); want 502", proto, kind, r.resp, r.err)
				continue
			}
			if ra := r.resp.Header.Get("Retry-After"); ra != "2" {
				t.Errorf("%s %s: Retry-After %q; want 2", proto, kind, ra)
			}
			ct := r.resp.Header.Get("Content-Type")
			if kind == "fetch" {
				if ct != "application/json" || r.body != wantJSON {
					t.Errorf("%s fetch: %q %q; want application/json %q", proto, ct, r.body, wantJSON)
				}
				continue
			}
			if !strings.HasPrefix(ct, "text/html") || !strings.Contains(r.body, `http-equiv="refresh"`) ||
				!strings.Contains(r.body, fmt.Sprintf("port %d", never.port)) {
				t.Errorf("%s navigation: %q %q; want a self-refreshing page naming port %d", proto, ct, r.body, never.port)
			}
		}
	}

	if n := p.metric(t, `applistener_app_start_waits_total{outcome="ready"}`); n != 2 {
		t.Errorf(`applistener_app_start_waits_total{outcome="ready"} = %v; want 2`, n)
	}
	if n := p.metric(t, `applistener_app_start_waits_total{outcome="timeout"}`); n != 4 {
		t.Errorf(`applistener_app_start_waits_total{outcome="timeout"} = %v; want 4`, n)
	}
	testutil.Eventually(t, waitTimeout, "the log records of the waits", func() bool {
		out := p.output()
		return strings.Count(out, `"msg":"app started listening"`) == 2 &&
			strings.Count(out, `"msg":"app not listening"`) == 4 &&
			strings.Contains(out, fmt.Sprintf(`"port":%d`, never.port))
	})
}
