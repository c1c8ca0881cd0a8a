package e2e

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
)

// TestBrowserCookiesStayWithTheirSandbox: in real Chromium, sandbox A's app
// sets a cookie for the parent app domain (Domain=apps.test). The listener
// makes it host-only, so the page and the app of sandbox B never see it.
// With --app-pass-cookie-domain (for platforms whose app domain is on the
// Public Suffix List) the same cookie does reach B: the browser accepts
// parent-domain cookies here, so the first half can fail.
func TestBrowserCookiesStayWithTheirSandbox(t *testing.T) {
	t.Parallel()
	for _, pass := range []bool{false, true} {
		t.Run(fmt.Sprintf("pass=%v", pass), func(t *testing.T) {
			var extra []string
			if pass {
				extra = append(extra, "--app-pass-cookie-domain")
			}
			e := newEnv(t, extra...)
			_, port, err := net.SplitHostPort(e.p.appAddr)
			if err != nil {
				t.Fatal(err)
			}
			originA := fmt.Sprintf("https://%s:%s", hostWeb, port)
			originB := fmt.Sprintf("https://%s:%s", hostAPI, port)
			b := newBrowser(t, testCAFile(t), domain)

			cookie := "tossed=1; Domain=" + domain + "; Path=/; Secure; SameSite=Lax"
			if resp := b.navigate(t, originA+"/set-cookie?c="+url.QueryEscape(cookie)); resp == nil || resp.Status != 200 {
				t.Fatalf("sandbox A's page: %+v", resp)
			}
			var inA bool
			for _, c := range b.cookies(t, originA+"/") {
				if c.Name == "tossed" {
					inA = true
					wantDomain := hostWeb // host-only: scoped to the host that set it
					if pass {
						wantDomain = "." + domain
					}
					if c.Domain != wantDomain {
						t.Errorf("cookie domain %q; want %q", c.Domain, wantDomain)
					}
				}
			}
			if !inA {
				t.Fatal("sandbox A's cookie was not stored at all")
			}

			if resp := b.navigate(t, originB+"/page-b"); resp == nil || resp.Status != 200 {
				t.Fatalf("sandbox B's page: %+v", resp)
			}
			pageSees := strings.Contains(b.eval(t, "document.cookie"), "tossed=1")
			rec := appRecorded(t, e.api, "/page-b")
			appSees := strings.Contains(strings.Join(rec.Header.Values("Cookie"), ";"), "tossed=1")
			if pass {
				if !pageSees || !appSees {
					t.Errorf("with the Domain passed through, B's page sees the cookie: %v, B's app: %v; want both", pageSees, appSees)
				}
				return
			}
			if pageSees || appSees {
				t.Errorf("sandbox A's cookie reached sandbox B (page %v, app %v)", pageSees, appSees)
			}
		})
	}
}
