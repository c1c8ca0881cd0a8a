package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// loginApp is a small app with a login flow as frameworks write it: the
// app builds its redirect from the Host it saw (127.0.0.1:PORT by
// default), so /login sets a session cookie and redirects to
// http://<Host>/home; /home greets a logged-in visitor; /away redirects to
// the URL in ?to= (another origin); /landing is a plain page.
func loginApp() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		switch r.URL.Path {
		case "/login":
			http.SetCookie(w, &http.Cookie{Name: "session", Value: "s1", Path: "/", Secure: true, HttpOnly: true})
			w.Header().Set("Location", "http://"+r.Host+"/home")
			w.WriteHeader(http.StatusFound)
		case "/home":
			if c, err := r.Cookie("session"); err == nil && c.Value == "s1" {
				_, _ = fmt.Fprint(w, "<p>welcome home</p>")
				return
			}
			_, _ = fmt.Fprint(w, "<p>not logged in</p>")
		case "/away":
			w.Header().Set("Location", r.URL.Query().Get("to"))
			w.WriteHeader(http.StatusFound)
		case "/landing":
			_, _ = fmt.Fprint(w, "<p>landed</p>")
		default:
			http.NotFound(w, r)
		}
	}))
}

// TestBrowserLoginRedirectStaysOnThePublicOrigin: in real Chromium, an
// app behind the default Host rewrite redirects a login to
// http://127.0.0.1:PORT/home; the browser ends on https://<host>:<port>/home
// with its session cookie, through the listener. A redirect to another
// origin is followed as the app wrote it.
func TestBrowserLoginRedirectStaysOnThePublicOrigin(t *testing.T) {
	t.Parallel()
	app := loginApp()
	t.Cleanup(app.Close)
	appPort := app.Listener.Addr().(*net.TCPAddr).Port
	p := startProc(t, routesDoc(service{Name: "web", Port: appPort, Revision: 1}, service{Name: "api", Port: appPort, Revision: 1}))
	_, port, err := net.SplitHostPort(p.appAddr)
	if err != nil {
		t.Fatal(err)
	}
	origin := fmt.Sprintf("https://%s:%s", hostWeb, port)
	b := newBrowser(t, testCAFile(t), domain)

	resp := b.navigate(t, origin+"/login")
	if resp == nil || resp.Status != 200 {
		t.Fatalf("the page after the login redirect: %+v; want 200", resp)
	}
	if got, want := b.eval(t, "location.href"), origin+"/home"; got != want {
		t.Fatalf("after the login redirect the browser is at %q; want %q", got, want)
	}
	if got := b.eval(t, "document.body.innerText"); !strings.Contains(got, "welcome home") {
		t.Errorf("the home page says %q; want the logged-in greeting", got)
	}
	if got := b.lastProtocol(); got != "h2" {
		t.Errorf("protocol %q; want h2", got)
	}

	other := fmt.Sprintf("https://%s:%s/landing", hostAPI, port)
	b.navigate(t, origin+"/away?to="+url.QueryEscape(other))
	if got := b.eval(t, "location.href"); got != other {
		t.Fatalf("after a redirect to another origin the browser is at %q; want %q", got, other)
	}
	if got := b.eval(t, "document.body.innerText"); !strings.Contains(got, "landed") {
		t.Errorf("the other origin's page says %q", got)
	}
}
