package dispatch

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/routes"
)

// The forwarding rule table: every rule that applies between a client and
// an app, checked on the three paths a request can take, from real
// clients (written raw, so that they can send what net/http's clients
// refuse to) through the listener to one real app that speaks HTTP/1.1
// and h2c on the same port:
//
//	HTTP/1.1          TLS HTTP/1.1 client → HTTP/1.1 app
//	HTTP/2→HTTP/1.1   TLS HTTP/2 client   → HTTP/1.1 app
//	h2c               TLS HTTP/2 client   → h2c app (HTTP/2)
const (
	rulesH1Host  = "team--rules--h1.apps.test"  // service "h1": protocol http1
	rulesH2CHost = "team--rules--h2c.apps.test" // service "h2c": protocol h2c, same app
)

// rulesApp is the app of the rule table: net/http serving HTTP/1.1 and
// HTTP/2 with prior knowledge on one listener. It records the last
// request it received; /cookie sets a cookie for the whole app domain in
// its head and in a trailer, /status answers 999 (net/http sends any
// three digits), anything else reads the body and answers "ok".
type rulesApp struct {
	srv  *http.Server
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	hits int
	last *rulesSeen
}

// rulesSeen is what the app received.
type rulesSeen struct {
	proto, uri, host string
	header, trailer  http.Header
}

func newRulesApp(t *testing.T) *rulesApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &rulesApp{ln: ln}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	a.srv = &http.Server{Handler: http.HandlerFunc(a.serve), Protocols: &protos}
	a.wg.Go(func() { _ = a.srv.Serve(ln) })
	t.Cleanup(func() {
		_ = a.srv.Close()
		a.wg.Wait()
	})
	return a
}

func (a *rulesApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *rulesApp) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	seen := &rulesSeen{proto: r.Proto, uri: r.RequestURI, host: r.Host, header: r.Header.Clone(), trailer: r.Trailer.Clone()}
	a.mu.Lock()
	a.hits++
	a.last = seen
	a.mu.Unlock()
	switch r.URL.Path {
	case "/cookie":
		w.Header().Set("Set-Cookie", "sid=1; Domain=apps.test; Path=/")
		_, _ = io.WriteString(w, "cookies")
		w.Header().Set(http.TrailerPrefix+"Set-Cookie", "late=2; Path=/; Domain=.apps.test")
	case "/status":
		w.WriteHeader(999)
	default:
		_, _ = io.WriteString(w, "ok")
	}
}

// seen returns the app's hit count and the last request it received.
func (a *rulesApp) seen() (int, *rulesSeen) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hits, a.last
}

// ruleReq is a client's request, written as each protocol writes it.
type ruleReq struct {
	method, target string
	fields         [][2]string // canonical names (HTTP/2: lower-cased)
	body           string
	trailers       [][2]string
}

// ruleResp is the answer the client got: a status, or a stream reset by
// the listener (HTTP/2 only).
type ruleResp struct {
	status          int
	reset           http2.ErrCode
	wasReset        bool
	header, trailer http.Header
	body            string
}

// rulePath is one way from a client to the app.
type rulePath struct {
	name string
	h2c  bool // the app is spoken to in HTTP/2
	do   func(t *testing.T, e *h2Env, rq ruleReq) ruleResp
}

var rulePaths = []rulePath{
	{"HTTP/1.1", false, func(t *testing.T, e *h2Env, rq ruleReq) ruleResp { return h1RawExchange(t, e, rulesH1Host, rq) }},
	{"HTTP/2→HTTP/1.1", false, func(t *testing.T, e *h2Env, rq ruleReq) ruleResp { return h2RawExchange(t, e, rulesH1Host, rq) }},
	{"h2c", true, func(t *testing.T, e *h2Env, rq ruleReq) ruleResp { return h2RawExchange(t, e, rulesH2CHost, rq) }},
}

// h1RawExchange sends rq on a new HTTP/1.1 connection, as bytes.
func h1RawExchange(t *testing.T, e *h2Env, host string, rq ruleReq) ruleResp {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", rq.method, rq.target, host)
	for _, f := range rq.fields {
		fmt.Fprintf(&b, "%s: %s\r\n", f[0], f[1])
	}
	switch {
	case len(rq.trailers) > 0:
		names := make([]string, len(rq.trailers))
		for i, f := range rq.trailers {
			names[i] = f[0]
		}
		fmt.Fprintf(&b, "Transfer-Encoding: chunked\r\nTrailer: %s\r\n\r\n%x\r\n%s\r\n0\r\n", strings.Join(names, ", "), len(rq.body), rq.body)
		for _, f := range rq.trailers {
			fmt.Fprintf(&b, "%s: %s\r\n", f[0], f[1])
		}
		b.WriteString("\r\n")
	case rq.body != "":
		fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(rq.body), rq.body)
	default:
		b.WriteString("\r\n")
	}
	c := e.h1(host)
	if _, err := io.WriteString(c.conn, b.String()); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", firstLineOf(b.String()), err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body of the answer to %q: %v", firstLineOf(b.String()), err)
	}
	trailer := resp.Trailer
	if trailer == nil {
		trailer = http.Header{}
	}
	return ruleResp{status: resp.StatusCode, header: resp.Header, trailer: trailer, body: string(body)}
}

// h2RawExchange sends rq as stream 1 of a new HTTP/2 connection, frame by
// frame, and reads the answer: headers, body, trailers, or a reset.
func h2RawExchange(t *testing.T, e *h2Env, host string, rq ruleReq) ruleResp {
	t.Helper()
	tc, fr := h2RawConn(t, e, host)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	field := func(name, value string) { _ = enc.WriteField(hpack.HeaderField{Name: name, Value: value}) }
	field(":method", rq.method)
	field(":scheme", "https")
	field(":authority", host)
	field(":path", rq.target)
	for _, f := range rq.fields {
		field(strings.ToLower(f[0]), f[1])
	}
	if len(rq.trailers) > 0 {
		names := make([]string, len(rq.trailers))
		for i, f := range rq.trailers {
			names[i] = strings.ToLower(f[0])
		}
		field("trailer", strings.Join(names, ", "))
	}
	noBody := rq.body == "" && len(rq.trailers) == 0
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: noBody, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if rq.body != "" {
		if err := fr.WriteData(1, len(rq.trailers) == 0, []byte(rq.body)); err != nil {
			t.Fatal(err)
		}
	}
	if len(rq.trailers) > 0 {
		hb.Reset()
		for _, f := range rq.trailers {
			field(strings.ToLower(f[0]), f[1])
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	res := ruleResp{header: http.Header{}, trailer: http.Header{}}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("%s %q: reading the answer: %v", rq.method, rq.target, err)
		}
		if f.Header().StreamID != 1 {
			continue
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			into := res.trailer
			if res.status == 0 {
				status, err := strconv.Atoi(f.PseudoValue("status"))
				if err != nil {
					t.Fatalf("%s %q: :status %q", rq.method, rq.target, f.PseudoValue("status"))
				}
				if status < 200 {
					continue // interim
				}
				res.status, into = status, res.header
			}
			for _, hf := range f.RegularFields() {
				k := http.CanonicalHeaderKey(hf.Name)
				into[k] = append(into[k], hf.Value)
			}
			if f.StreamEnded() {
				return res
			}
		case *http2.DataFrame:
			res.body += string(f.Data())
			if f.StreamEnded() {
				return res
			}
		case *http2.RSTStreamFrame:
			res.reset, res.wasReset = f.ErrCode, true
			return res
		}
	}
}

// ruleRow is one rule: a request, and what must hold of the answer and of
// what the app received (seen is nil when the request did not reach it).
type ruleRow struct {
	name string
	req  ruleReq
	// clientError: the request is the client's error: 400 (or, on HTTP/2,
	// a stream the engine resets as malformed), logged as a denial, never
	// as an app failure, and the app receives nothing.
	clientError bool
	// appError: the app's answer is invalid: 502 with the reason, logged
	// as an invalid response from the app.
	appError bool
	check    func(t *testing.T, p rulePath, res ruleResp, seen *rulesSeen)
}

// headerNamed returns the values of every field of h whose name, read as
// CGI servers read it (case folded, '_' as '-'), is name.
func headerNamed(h http.Header, name string) []string {
	var out []string
	for k, vv := range h {
		if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), name) {
			out = append(out, vv...)
		}
	}
	return out
}

func wantOne(t *testing.T, where string, got []string, want string) {
	t.Helper()
	if len(got) != 1 || got[0] != want {
		t.Errorf("%s %q, want %q", where, got, want)
	}
}

var ruleRows = []ruleRow{
	{name: "target with a space", req: ruleReq{method: "GET", target: "/a b?q=1"}, clientError: true},
	{name: "target with a control byte", req: ruleReq{method: "GET", target: "/a\x01b"}, clientError: true},
	{name: "target with DEL", req: ruleReq{method: "GET", target: "/a\x7f"}, clientError: true},
	{name: "header value with a control byte", req: ruleReq{method: "GET", target: "/v", fields: [][2]string{{"X-Bad", "a\x01b"}}}, clientError: true},
	{
		name: "hop-by-hop and httpoxy fields",
		req:  ruleReq{method: "GET", target: "/hop", fields: [][2]string{{"Proxy-Authorization", "Basic eA=="}, {"Proxy", "http://evil.example"}, {"X-Fine", "yes"}}},
		check: func(t *testing.T, p rulePath, res ruleResp, seen *rulesSeen) {
			for _, k := range []string{"Proxy-Authorization", "Proxy"} {
				if v := headerNamed(seen.header, k); len(v) > 0 {
					t.Errorf("the app received %s: %q", k, v)
				}
			}
			wantOne(t, "X-Fine at the app", headerNamed(seen.header, "X-Fine"), "yes")
		},
	},
	{
		name: "forwarding claims of an untrusted client",
		req: ruleReq{method: "GET", target: "/claims", fields: [][2]string{
			{"X-Forwarded-For", "6.6.6.6"}, {"X-Forwarded-Host", "evil.example"}, {"X-Forwarded-Proto", "http"},
			{"Forwarded", "for=6.6.6.6"}, {"X-Real-IP", "6.6.6.6"}, {"X-Applistener-User", "mallory"},
			{"X-Forwarded-Client-Cert", "forged"},
		}},
		check: func(t *testing.T, p rulePath, res ruleResp, seen *rulesSeen) {
			host := rulesH1Host
			if p.h2c {
				host = rulesH2CHost
			}
			wantOne(t, "X-Forwarded-For at the app", headerNamed(seen.header, "X-Forwarded-For"), "127.0.0.1")
			wantOne(t, "X-Forwarded-Host at the app", headerNamed(seen.header, "X-Forwarded-Host"), host)
			wantOne(t, "X-Forwarded-Proto at the app", headerNamed(seen.header, "X-Forwarded-Proto"), "https")
			wantOne(t, "Forwarded at the app", headerNamed(seen.header, "Forwarded"), "for=127.0.0.1;host="+host+";proto=https")
			for _, k := range []string{"X-Real-IP", "X-Applistener-User", "X-Forwarded-Client-Cert"} {
				if v := headerNamed(seen.header, k); len(v) > 0 {
					t.Errorf("the app received %s: %q", k, v)
				}
			}
		},
	},
	{
		name: "names with '_'",
		req:  ruleReq{method: "GET", target: "/underscore", fields: [][2]string{{"X_Custom", "1"}, {"X_Forwarded_For", "6.6.6.6"}, {"Content_Length", "3"}}},
		check: func(t *testing.T, p rulePath, res ruleResp, seen *rulesSeen) {
			for k, v := range seen.header {
				if strings.Contains(k, "_") {
					t.Errorf("the app received %s: %q", k, v)
				}
			}
			wantOne(t, "X-Forwarded-For at the app", headerNamed(seen.header, "X-Forwarded-For"), "127.0.0.1")
		},
	},
	{
		name: "request trailers",
		req: ruleReq{method: "POST", target: "/trailers", body: "hello", trailers: [][2]string{
			{"X-Forwarded-For", "6.6.6.6"}, {"Forwarded", "for=6.6.6.6"}, {"X-Applistener-User", "mallory"},
			{"X-Real-IP", "6.6.6.6"}, {"X_Custom", "1"}, {"X-Req-Trailer", "ok"},
		}},
		check: func(t *testing.T, p rulePath, res ruleResp, seen *rulesSeen) {
			for _, h := range []http.Header{seen.header, seen.trailer} {
				for k, v := range h {
					if strings.Contains(k, "_") {
						t.Errorf("the app received %s: %q", k, v)
					}
				}
				for _, k := range []string{"X-Applistener-User", "X-Real-IP"} {
					if v := headerNamed(h, k); len(v) > 0 {
						t.Errorf("the app received %s: %q", k, v)
					}
				}
			}
			wantOne(t, "X-Forwarded-For at the app", headerNamed(seen.header, "X-Forwarded-For"), "127.0.0.1")
			for _, k := range []string{"X-Forwarded-For", "Forwarded"} {
				if v := headerNamed(seen.trailer, k); len(v) > 0 && v[0] != "" {
					t.Errorf("the app received the trailer %s: %q", k, v)
				}
			}
			// Trailers reach h2c apps (the allowed one is the control);
			// HTTP/1.1 apps get none.
			got := seen.trailer.Get("X-Req-Trailer")
			if want := map[bool]string{true: "ok", false: ""}[p.h2c]; got != want {
				t.Errorf("trailer X-Req-Trailer at the app %q, want %q", got, want)
			}
		},
	},
	{
		name: "cookie Domain in the response head and trailers",
		req:  ruleReq{method: "GET", target: "/cookie"},
		check: func(t *testing.T, p rulePath, res ruleResp, seen *rulesSeen) {
			if res.status != 200 {
				t.Fatalf("status %d, want 200", res.status)
			}
			wantOne(t, "Set-Cookie", res.header.Values("Set-Cookie"), "sid=1; Path=/")
			var late []string
			for _, h := range []http.Header{res.header, res.trailer} {
				for k, vv := range h {
					for _, v := range vv {
						if strings.Contains(strings.ToLower(v), "domain") {
							t.Errorf("%s: %q reached the client with a Domain", k, v)
						}
						if strings.HasPrefix(v, "late=") {
							late = append(late, v)
						}
					}
				}
			}
			// h2c clients get the app's trailers (the control);
			// HTTP/1.1 apps' trailers are not relayed.
			if p.h2c {
				wantOne(t, "the trailer cookie", late, "late=2; Path=/")
			} else if len(late) > 0 {
				t.Errorf("the trailer cookie %q relayed from an HTTP/1.1 app", late)
			}
		},
	},
	{name: "invalid status", req: ruleReq{method: "GET", target: "/status"}, appError: true},
}

// TestForwardingRuleTable: every forwarding rule holds on HTTP/1.1, on
// HTTP/2 to an HTTP/1.1 app and on h2c alike (see ruleRows): targets and
// field values that no app may be handed are the client's errors (400,
// logged as denials, nothing reaches the app); hop-by-hop, '_' and
// untrusted forwarding fields never reach the app, in the head or in
// trailers, and the listener's forwarding fields replace the client's;
// cookies for the app domain lose their Domain in the head and in
// trailers; an invalid status is a 502 logged as an invalid response.
func TestForwardingRuleTable(t *testing.T) {
	var logBuf syncBuffer
	e := newH2Env(t, 0, Config{Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	app := newRulesApp(t)
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"rules","instances":[
		{"workspace":"team","sandbox":"rules","generation":"1","services":[
			{"name":"h1","port":%d,"protocol":"http1"},{"name":"h2c","port":%d,"protocol":"h2c"}]}]}`, app.port(), app.port()))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	e.table.Apply(doc)

	for _, row := range ruleRows {
		for _, p := range rulePaths {
			t.Run(row.name+"/"+p.name, func(t *testing.T) {
				hits0, _ := app.seen()
				log0 := len(logBuf.String())
				res := p.do(t, e, row.req)
				hits, seen := app.seen()
				logged := logBuf.String()[log0:]
				appFailure := strings.Contains(logged, `msg="invalid response from app"`) || strings.Contains(logged, `msg="app connection failed"`)
				switch {
				case row.clientError:
					if hits != hits0 {
						t.Errorf("the request reached the app as %q", seen.uri)
					}
					switch {
					case res.wasReset && p.name != "HTTP/1.1" && res.reset == http2.ErrCodeProtocol:
						// The engine refused it as malformed.
					case res.status != 400:
						t.Errorf("answer %d (reset %v %v) %q, want 400", res.status, res.wasReset, res.reset, res.body)
					case !strings.Contains(logged, `msg="request denied"`) || !strings.Contains(logged, "status=400"):
						t.Errorf("not logged as a denial (400): %q", logged)
					}
					if appFailure {
						t.Errorf("a client's error logged as the app's: %q", logged)
					}
				case row.appError:
					if res.status != 502 || !strings.Contains(res.body, reasonBadResponse) {
						t.Errorf("answer %d %q, want 502 with %q", res.status, res.body, reasonBadResponse)
					}
					if !strings.Contains(logged, `msg="invalid response from app"`) {
						t.Errorf("not logged as an invalid response from the app: %q", logged)
					}
				default:
					if res.wasReset || res.status != 200 {
						t.Fatalf("answer %d (reset %v %v) %q, want 200", res.status, res.wasReset, res.reset, res.body)
					}
					if hits != hits0+1 {
						t.Fatalf("the app received %d requests, want 1", hits-hits0)
					}
					if wantProto := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[p.h2c]; seen.proto != wantProto {
						t.Errorf("the app was spoken to in %s, want %s", seen.proto, wantProto)
					}
					if appFailure {
						t.Errorf("logged as an app failure: %q", logged)
					}
					row.check(t, p, res, seen)
				}
			})
		}
	}
}
