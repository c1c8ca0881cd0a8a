package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/applistener/applistener/internal/testutil"
)

// TestBrowserHarness checks the Chromium harness end to end against the
// real listener: the browser trusts the test CA, resolves the route's name
// to the listener, gets the app's page over HTTP/2, runs JavaScript in it,
// reads its cookie store, and a failed navigation is reported as one.
func TestBrowserHarness(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, port, err := net.SplitHostPort(e.p.appAddr)
	if err != nil {
		t.Fatal(err)
	}
	origin := fmt.Sprintf("https://%s:%s", hostWeb, port)
	b := newBrowser(t, testCAFile(t), domain)

	t.Run("PageOverH2", func(t *testing.T) {
		resp := b.navigate(t, origin+"/browser-page")
		if resp == nil {
			t.Fatal("no response recorded for the page")
		}
		if resp.Status != 200 {
			t.Errorf("page status %d; want 200", resp.Status)
		}
		if resp.Protocol != "h2" {
			t.Errorf("page protocol %q; want h2", resp.Protocol)
		}
		if got := b.lastProtocol(); got != "h2" {
			t.Errorf("lastProtocol() = %q; want h2", got)
		}
		if got := b.eval(t, "document.body.innerText"); !strings.Contains(got, "hello from web") {
			t.Errorf("page text %q; want it to contain %q", got, "hello from web")
		}
		if got := b.eval(t, "location.host"); got != hostWeb+":"+port {
			t.Errorf("location.host = %q; want %s:%s", got, hostWeb, port)
		}
		// The request went through the listener to the app.
		rec := appRecorded(t, e.web, "/browser-page")
		if rec.Host != e.web.hostPort() {
			t.Errorf("app saw Host %q; want %q", rec.Host, e.web.hostPort())
		}
	})

	t.Run("FetchAwaited", func(t *testing.T) {
		got := b.eval(t, `fetch("/browser-fetch", {cache: "no-store"}).then(r => r.text())`)
		if !strings.Contains(got, "hello from web") {
			t.Errorf("fetch body %q; want it to contain %q", got, "hello from web")
		}
		if got := b.lastProtocol(); got != "h2" {
			t.Errorf("fetch protocol %q; want h2", got)
		}
		appRecorded(t, e.web, "/browser-fetch")
	})

	t.Run("Cookies", func(t *testing.T) {
		b.eval(t, `document.cookie = "harness=ok; Secure; SameSite=Strict; path=/"`)
		var found *browserCookie
		for _, c := range b.cookies(t, origin+"/") {
			if c.Name == "harness" {
				found = &c
			}
		}
		switch {
		case found == nil:
			t.Fatal("the cookie set by the page is not in the browser's store")
		case found.Value != "ok" || !found.Secure || found.Domain != hostWeb:
			t.Errorf("cookie %+v; want value ok, Secure, domain %s", *found, hostWeb)
		}
		if cs := b.cookies(t, fmt.Sprintf("https://%s:%s/", hostAPI, port)); len(cs) != 0 {
			t.Errorf("another host's cookies: %+v; want none", cs)
		}
	})

	t.Run("FailedNavigation", func(t *testing.T) {
		// No route for this name: the listener refuses the handshake.
		url := fmt.Sprintf("https://team--demo--nope.%s:%s/", domain, port)
		if _, err := b.tryNavigate(url); err == nil {
			t.Fatalf("navigation to an unrouted name succeeded; want an error")
		} else if !strings.Contains(err.Error(), "net::ERR_") {
			t.Errorf("navigation error %q; want a Chromium net error", err)
		}
		if _, err := b.tryEval(`(() => { throw new Error("boom") })()`); err == nil || !strings.Contains(err.Error(), "boom") {
			t.Errorf("tryEval of a throwing script: %v; want the error boom", err)
		}
	})
}

// appRecorded is backend.last, after waiting a moment: the page's load event can
// come before the app has recorded a request that is not the document.
func appRecorded(t testing.TB, be *backend, uri string) *recorded {
	t.Helper()
	testutil.Eventually(t, waitTimeout, "the app to record "+uri, func() bool {
		for _, r := range be.requests() {
			if r.URI == uri {
				return true
			}
		}
		return false
	})
	return be.last(t, uri)
}
