package dispatch

import (
	"io"
	"net/http"
	"strconv"
	"testing"
)

// TestUnitRewriteRedirects: values pointing at the app's loopback origin
// (as the app saw it in Host) become the public origin, path, query and
// fragment kept; everything else is untouched.
func TestUnitRewriteRedirects(t *testing.T) {
	const pub = "https://" + testHost
	tests := []struct {
		name, field, value string
		appPort            int
		hostHeader         string // "" : 127.0.0.1:appPort
		publicPort         int
		want               string
	}{
		{"login redirect", "Location", "http://127.0.0.1:8080/home", 8080, "", 0, pub + "/home"},
		{"localhost, query, fragment", "Location", "http://localhost:8080/x?y#z", 8080, "", 0, pub + "/x?y#z"},
		{"host in upper case", "Location", "HTTP://LOCALHOST:8080/a", 8080, "", 0, pub + "/a"},
		{"origin only", "Location", "http://127.0.0.1:8080", 8080, "", 0, pub},
		{"query right after the origin", "Location", "http://127.0.0.1:8080?next=1", 8080, "", 0, pub + "?next=1"},
		{"public port kept", "Location", "http://127.0.0.1:8080/home", 8080, "", 8443, pub + ":8443/home"},
		{"port 80 omitted", "Location", "http://127.0.0.1/home", 80, "", 0, pub + "/home"},
		{"port 80 written", "Location", "http://localhost:80/home", 80, "", 0, pub + "/home"},
		{"port 80 empty", "Location", "http://localhost:/home", 80, "", 0, pub + "/home"},
		{"connector's own host", "Location", "http://[::1]:8080/v6", 8080, "[::1]:8080", 0, pub + "/v6"},
		{"Content-Location", "Content-Location", "http://127.0.0.1:8080/doc/1", 8080, "", 0, pub + "/doc/1"},
		{"content-location lower case", "content-location", "http://127.0.0.1:8080/doc/1", 8080, "", 0, pub + "/doc/1"},
		{"Refresh url=", "Refresh", "0; url=http://127.0.0.1:8080/a", 8080, "", 0, "0; url=" + pub + "/a"},
		{"Refresh URL quoted", "Refresh", "5;URL='http://localhost:8080/b'", 8080, "", 0, "5;URL='" + pub + "/b'"},
		{"Refresh spaces", "Refresh", "1 ; url = http://127.0.0.1:8080/c", 8080, "", 0, "1 ; url = " + pub + "/c"},
		{"Refresh comma, no url=", "Refresh", "0, http://127.0.0.1:8080/d", 8080, "", 0, "0, " + pub + "/d"},
		// Untouched.
		{"relative", "Location", "/home", 8080, "", 0, "/home"},
		{"scheme-relative", "Location", "//127.0.0.1:8080/home", 8080, "", 0, "//127.0.0.1:8080/home"},
		{"other origin", "Location", "https://accounts.example.com/login?next=/", 8080, "", 0, "https://accounts.example.com/login?next=/"},
		{"https to loopback", "Location", "https://127.0.0.1:8080/home", 8080, "", 0, "https://127.0.0.1:8080/home"},
		{"other port", "Location", "http://127.0.0.1:9090/home", 8080, "", 0, "http://127.0.0.1:9090/home"},
		{"no port, app not on 80", "Location", "http://127.0.0.1/home", 8080, "", 0, "http://127.0.0.1/home"},
		{"other loopback address", "Location", "http://127.0.0.2:8080/home", 8080, "", 0, "http://127.0.0.2:8080/home"},
		{"longer host", "Location", "http://localhost.evil.com:8080/", 8080, "", 0, "http://localhost.evil.com:8080/"},
		{"userinfo", "Location", "http://evil.com@127.0.0.1:8080/", 8080, "", 0, "http://evil.com@127.0.0.1:8080/"},
		{"port with userinfo", "Location", "http://127.0.0.1:8080@evil.com/", 8080, "", 0, "http://127.0.0.1:8080@evil.com/"},
		{"port too long", "Location", "http://127.0.0.1:008080/", 8080, "", 0, "http://127.0.0.1:008080/"},
		{"Refresh delay only", "Refresh", "30", 8080, "", 0, "30"},
		{"Refresh relative", "Refresh", "0; url=/next", 8080, "", 0, "0; url=/next"},
		{"Refresh other origin", "Refresh", "0; url=http://example.com:8080/", 8080, "", 0, "0; url=http://example.com:8080/"},
		{"other field", "Link", "<http://127.0.0.1:8080/a>; rel=preload", 8080, "", 0, "<http://127.0.0.1:8080/a>; rel=preload"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := New(Config{})
			hh := tc.hostHeader
			if hh == "" {
				hh = "127.0.0.1:" + strconv.Itoa(tc.appPort)
			}
			pool := &backendPool{port: tc.appPort, hostHeader: hh}
			resp := &response{fields: []headField{{[]byte("Content-Type"), []byte("text/html")}, {[]byte(tc.field), []byte(tc.value)}}}
			s.rewriteRedirects(resp, pool, testHost, tc.publicPort)
			if got := string(resp.fields[1].value); got != tc.want {
				t.Errorf("%s: %q became %q; want %q", tc.field, tc.value, got, tc.want)
			}
			if got := string(resp.fields[0].value); got != "text/html" {
				t.Errorf("Content-Type became %q", got)
			}
			// The app saw the public Host: nothing to rewrite.
			s = New(Config{PreserveHost: true})
			resp = &response{fields: []headField{{[]byte(tc.field), []byte(tc.value)}}}
			s.rewriteRedirects(resp, pool, testHost, tc.publicPort)
			if got := string(resp.fields[0].value); got != tc.value {
				t.Errorf("with PreserveHost: %q became %q", tc.value, got)
			}
		})
	}
}

// TestUnitHostPort: the port a client named in Host; 443 and none are the
// https default.
func TestUnitHostPort(t *testing.T) {
	for host, want := range map[string]int{
		testHost: 0, testHost + ":443": 0, testHost + ":8443": 8443, testHost + ":": 0,
		testHost + ":x1": 0, "[::1]": 0, "[::1]:9000": 9000,
	} {
		if got := hostPort([]byte(host)); got != want {
			t.Errorf("hostPort(%q) = %d; want %d", host, got, want)
		}
	}
}

// redirectResponse is a typical response head with nothing to rewrite.
func redirectResponse() *response {
	return &response{fields: []headField{
		{[]byte("Content-Type"), []byte("text/html; charset=utf-8")},
		{[]byte("Cache-Control"), []byte("no-store")},
		{[]byte("Location"), []byte("/home")},
		{[]byte("Content-Location"), []byte("https://cdn.example.com/a")},
		{[]byte("Refresh"), []byte("5; url=/next")},
		{[]byte("Set-Cookie"), []byte("sid=1; Path=/; HttpOnly")},
		{[]byte("Date"), []byte("Mon, 01 Jan 2026 00:00:00 GMT")},
		{[]byte("Content-Length"), []byte("42")},
	}}
}

// TestUnitRewriteRedirectsAllocs: a response with nothing to rewrite costs
// no allocation.
func TestUnitRewriteRedirectsAllocs(t *testing.T) {
	s := New(Config{})
	pool := &backendPool{port: 8080, hostHeader: "127.0.0.1:8080"}
	resp := redirectResponse()
	if n := testing.AllocsPerRun(1000, func() { s.rewriteRedirects(resp, pool, testHost, 8443) }); n != 0 {
		t.Errorf("rewriteRedirects allocates %v times per response with nothing to rewrite; want 0", n)
	}
}

// BenchmarkRewriteRedirects: the cost per response head, with nothing to
// rewrite (the common case, no allocation) and with a login redirect.
func BenchmarkRewriteRedirects(b *testing.B) {
	s := New(Config{})
	pool := &backendPool{port: 8080, hostHeader: "127.0.0.1:8080"}
	b.Run("none", func(b *testing.B) {
		resp := redirectResponse()
		b.ReportAllocs()
		for b.Loop() {
			s.rewriteRedirects(resp, pool, testHost, 8443)
		}
	})
	b.Run("location", func(b *testing.B) {
		resp := redirectResponse()
		loc := []byte("http://127.0.0.1:8080/home?next=%2Fa")
		b.ReportAllocs()
		for b.Loop() {
			resp.fields[2].value = loc
			s.rewriteRedirects(resp, pool, testHost, 8443)
		}
	})
}

// redirectApp answers /to?loc=URL with 302 Location URL, /refresh?url=URL
// with 200 and Refresh "0; url=URL", /cl?loc=URL with 200 and
// Content-Location URL, and /host with the Host it saw. A value "SELF"
// in loc stands for http://<Host the app saw>.
func redirectApp() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arg := func(name string) string {
			v := r.URL.Query().Get(name)
			if v == "SELF" {
				v = "http://" + r.Host + "/home"
			}
			return v
		}
		switch r.URL.Path {
		case "/to":
			w.Header().Set("Location", arg("loc"))
			w.WriteHeader(http.StatusFound)
		case "/refresh":
			w.Header().Set("Refresh", "0; url="+arg("url"))
		case "/cl":
			w.Header().Set("Content-Location", arg("loc"))
		case "/host":
			_, _ = io.WriteString(w, r.Host)
		}
	})
}

// TestRedirectToLoopbackReachesClientAsPublic: over HTTP/1.1 and HTTP/2, an
// app that saw Host 127.0.0.1:PORT and redirects to its own origin (a login
// redirect) sends the client to https://<public host>, port as the client
// named it; other origins and relative values are untouched.
func TestRedirectToLoopbackReachesClientAsPublic(t *testing.T) {
	h2Verify(t)
	p := newAppProxy(t, Config{}, redirectApp())
	app := "http://127.0.0.1:" + strconv.Itoa(p.appPort())
	appLocal := "http://localhost:" + strconv.Itoa(p.appPort())
	public := "https://" + testHost + ":" + strconv.Itoa(p.port())
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			c := p.client(proto)
			for _, tc := range []struct {
				path, field, want string
			}{
				{"/to?loc=SELF", "Location", public + "/home"},
				{"/to?loc=" + app + "/home", "Location", public + "/home"},
				{"/to?loc=" + appLocal + "%2Fx%3Fy%23z", "Location", public + "/x?y#z"},
				{"/to?loc=https://idp.example.com/authorize%3Fa%3D1", "Location", "https://idp.example.com/authorize?a=1"},
				{"/to?loc=/home", "Location", "/home"},
				{"/to?loc=http://127.0.0.1:1/home", "Location", "http://127.0.0.1:1/home"},
				{"/refresh?url=" + app + "/a", "Refresh", "0; url=" + public + "/a"},
				{"/cl?loc=" + app + "/doc", "Content-Location", public + "/doc"},
			} {
				resp, err := c.Get(public + tc.path)
				if err != nil {
					t.Fatalf("GET %s: %v", tc.path, err)
				}
				_ = resp.Body.Close()
				checkProto(t, resp, proto)
				if got := resp.Header.Get(tc.field); got != tc.want {
					t.Errorf("GET %s: %s %q; want %q", tc.path, tc.field, got, tc.want)
				}
			}
			// The client named no port (the default, 443): none in the
			// rewritten value.
			resp, err := c.Get("https://" + testHost + "/to?loc=SELF")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if got, want := resp.Header.Get("Location"), "https://"+testHost+"/home"; got != want {
				t.Errorf("without a port: Location %q; want %q", got, want)
			}
		})
	}
}

// TestPreserveHostKeepsThePublicPort: with PreserveHost the app sees the
// Host (HTTP/2: :authority) exactly as the client sent it, port included,
// and its redirects to that origin pass untouched.
func TestPreserveHostKeepsThePublicPort(t *testing.T) {
	h2Verify(t)
	p := newAppProxy(t, Config{PreserveHost: true}, redirectApp())
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			c := p.client(proto)
			for _, host := range []string{testHost + ":8443", testHost} {
				resp, err := c.Get("https://" + host + "/host")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				checkProto(t, resp, proto)
				if string(body) != host {
					t.Errorf("the app saw Host %q; want %q", body, host)
				}
				resp, err = c.Get("https://" + host + "/to?loc=SELF")
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				if got, want := resp.Header.Get("Location"), "http://"+host+"/home"; got != want {
					t.Errorf("Location %q; want the app's own %q", got, want)
				}
			}
		})
	}
}
