package e2e

import (
	"crypto/tls"
	"net/http"
	"testing"
)

// TestSNIAndHost checks that the Host must name the route the SNI chose,
// and that unknown or missing SNI is refused before any certificate is sent.
func TestSNIAndHost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.p

	t.Run("MisdirectedKeepsConnection", func(t *testing.T) {
		rc := p.raw(t, hostWeb)
		apiBefore := e.api.count()
		resp, body := rc.roundTrip(t, "GET /misdirected HTTP/1.1\r\nHost: "+hostAPI+"\r\n\r\n")
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Fatalf("SNI web, Host api: got %d %q; want 421", resp.StatusCode, body)
		}
		if resp.Close {
			t.Errorf("421 announced Connection: close; want the connection kept")
		}
		if n := e.api.count() - apiBefore; n != 0 {
			t.Errorf("the api app received %d request(s) for a connection whose SNI is web", n)
		}
		for _, r := range e.web.requests() {
			if r.URI == "/misdirected" {
				t.Errorf("the web app received the misdirected request")
			}
		}
		resp, body = rc.roundTrip(t, "GET /after-421 HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n")
		if resp.StatusCode != http.StatusOK || string(body) != "hello from web\n" {
			t.Fatalf("second request on the same connection: %d %q; want 200 from web", resp.StatusCode, body)
		}
	})

	t.Run("HostNormalization", func(t *testing.T) {
		for _, host := range []string{
			"TEAM--DEMO--WEB.apps.test.:443",
			hostWeb + ":443",
			hostWeb + ".",
			"Team--Demo--Web.Apps.Test",
		} {
			t.Run(host, func(t *testing.T) {
				rc := p.raw(t, hostWeb)
				resp, body := rc.roundTrip(t, "GET /norm HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
				if resp.StatusCode != http.StatusOK || string(body) != "hello from web\n" {
					t.Fatalf("Host %q with SNI %s: %d %q; want 200 from web", host, hostWeb, resp.StatusCode, body)
				}
			})
		}
	})

	t.Run("UpperCaseSNI", func(t *testing.T) {
		rc := p.raw(t, "TEAM--DEMO--WEB.APPS.TEST")
		resp, body := rc.roundTrip(t, "GET /upper-sni HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n")
		if resp.StatusCode != http.StatusOK || string(body) != "hello from web\n" {
			t.Fatalf("upper-case SNI: %d %q; want 200 from web", resp.StatusCode, body)
		}
	})

	t.Run("Refused", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			cfg  *tls.Config
		}{
			{"UnknownSandbox", tlsConfig("team--nope.apps.test")},
			{"UnknownService", tlsConfig("team--demo--nope.apps.test")},
			{"OtherWorkspace", tlsConfig("other--demo--web.apps.test")},
			{"BareDomain", tlsConfig("apps.test")},
			{"OtherDomain", tlsConfig("team--demo--web.other.test")},
			{"SuffixTrick", tlsConfig("team--demo--web.apps.test.evil.test")},
			{"NoSNI", &tls.Config{ServerName: "", InsecureSkipVerify: true}},
			{"IPAddress", &tls.Config{ServerName: "127.0.0.1", InsecureSkipVerify: true}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p.handshakeRefused(t, tc.cfg)
			})
		}
	})
}
