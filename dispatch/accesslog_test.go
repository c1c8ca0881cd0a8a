package dispatch

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/applistener/applistener/internal/logsink"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// lineLog collects the lines written to it (a Write is whole lines: one
// from the access log directly, several batched by the log writer); delay
// slows every write down.
type lineLog struct {
	mu    sync.Mutex
	lines []string
	delay time.Duration
}

func (l *lineLog) Write(p []byte) (int, error) {
	if l.delay > 0 {
		time.Sleep(l.delay)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !bytes.HasSuffix(p, []byte("\n")) {
		l.lines = append(l.lines, string(p)) // records fails on it
		return len(p), nil
	}
	for line := range strings.SplitAfterSeq(string(p), "\n") {
		if line != "" {
			l.lines = append(l.lines, line)
		}
	}
	return len(p), nil
}

// records returns the JSON access-log records whose field key has value
// want (any when key is empty), and the raw lines.
func (l *lineLog) records(t *testing.T, key string, want any) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range l.lines {
		if !strings.HasSuffix(line, "\n") || strings.Count(line, "\n") != 1 {
			t.Fatalf("not one line: %q", line)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("access-log line is not JSON: %v: %q", err, line)
		}
		if m["msg"] != "access" {
			continue
		}
		if key == "" || m[key] == want {
			out = append(out, m)
		}
	}
	return out
}

func (l *lineLog) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "")
}

// waitRecord waits for exactly one record with key = want and returns it.
func (l *lineLog) waitRecord(t *testing.T, key string, want any) map[string]any {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, fmt.Sprintf("an access-log line with %s=%v", key, want), func() bool {
		return len(l.records(t, key, want)) > 0
	})
	recs := l.records(t, key, want)
	if len(recs) != 1 {
		t.Fatalf("%d access-log lines with %s=%v, want 1: %v", len(recs), key, want, recs)
	}
	return recs[0]
}

// checkRecord compares the fields of rec with want, and checks that the
// timings are present and plausible.
func checkRecord(t *testing.T, rec map[string]any, want map[string]any, upstream bool) {
	t.Helper()
	for k, v := range want {
		if rec[k] != v {
			t.Errorf("%s = %#v, want %#v (record %v)", k, rec[k], v, rec)
		}
	}
	for _, k := range []string{"time", "workspace", "sandbox", "service", "host", "method", "path", "status",
		"bytes_in", "bytes_out", "duration", "protocol", "tls", "client", "installation_version",
		"request_id", "user_agent", "referer"} {
		if _, ok := rec[k]; !ok {
			t.Errorf("field %s missing from %v", k, rec)
		}
	}
	if ts, _ := rec["time"].(string); ts != "" {
		if tm, err := time.Parse(time.RFC3339Nano, ts); err != nil || time.Since(tm) > time.Minute || time.Since(tm) < 0 {
			t.Errorf("time %q: %v", ts, err)
		}
	}
	if d, _ := rec["duration"].(float64); d <= 0 || d > 10 {
		t.Errorf("duration = %v", rec["duration"])
	}
	if v, _ := rec["installation_version"].(float64); v < 1 {
		t.Errorf("installation_version = %v", rec["installation_version"])
	}
	for _, k := range []string{"upstream_connect", "upstream_first_byte"} {
		v, ok := rec[k].(float64)
		switch {
		case upstream && (!ok || v <= 0 || v > rec["duration"].(float64)):
			t.Errorf("%s = %v (duration %v)", k, rec[k], rec["duration"])
		case !upstream && ok:
			t.Errorf("%s = %v on a request that reached no app", k, v)
		}
	}
}

// histCount returns the sample count of the histogram name with labels.
func histCount(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// TestAccessLogOneLinePerRequest: over HTTP/1.1 and HTTP/2, one request
// gives exactly one access-log line with every field; neither the query
// string nor the Cookie or Authorization values appear; a denial logs its
// status and reason; the latency histograms get an observation each.
func TestAccessLogOneLinePerRequest(t *testing.T) {
	h2Verify(t)
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			out := &lineLog{}
			reg := prometheus.NewRegistry()
			e := newH2Env(t, 0, Config{AccessLog: AccessLogJSON, AccessLogWriter: out, Registerer: reg})
			switch proto {
			case "h1":
				c := e.h1(h2WebHost)
				if st, _, _ := c.do(t, "GET /first?token=secret HTTP/1.1\r\nHost: "+h2WebHost+
					"\r\nCookie: session=cookievalue\r\nAuthorization: Bearer authvalue\r\n\r\n"); st != 200 {
					t.Fatalf("status %d", st)
				}
				if st, _, _ := c.do(t, "POST /upload HTTP/1.1\r\nHost: "+h2WebHost+"\r\nContent-Length: 5\r\n\r\nhello"); st != 200 {
					t.Fatalf("upload status %d", st)
				}
				if st, _, _ := c.do(t, "GET /wrong?token=secret HTTP/1.1\r\nHost: "+h2APIHost+"\r\n\r\n"); st != 421 {
					t.Fatalf("misdirected status %d", st)
				}
			case "h2":
				cc := e.dial(h2WebHost)
				req := h2Req(t, "GET", h2WebHost, "/first?token=secret", nil)
				req.Header.Set("Cookie", "session=cookievalue")
				req.Header.Set("Authorization", "Bearer authvalue")
				h2MustDo(t, cc, req, 200)
				h2MustDo(t, cc, h2Req(t, "POST", h2WebHost, "/upload", strings.NewReader("hello")), 200)
				h2MustDo(t, cc, h2Req(t, "GET", h2APIHost, "/wrong?token=secret", nil), 421)
			}
			// The last request's line comes last on its connection: once it
			// is there, a second line for an earlier request would be too.
			wrong := out.waitRecord(t, "path", "/wrong")
			first := out.waitRecord(t, "path", "/first")
			upload := out.waitRecord(t, "path", "/upload")
			if n := len(out.records(t, "", nil)); n != 3 {
				t.Fatalf("%d access-log lines for 3 requests:\n%s", n, out.text())
			}
			base := map[string]any{"protocol": proto, "workspace": "team", "sandbox": "demo", "service": "web",
				"host": h2WebHost, "tls": "1.3", "client": "127.0.0.1", "level": "INFO"}
			with := func(kv ...any) map[string]any {
				m := map[string]any{}
				for k, v := range base {
					m[k] = v
				}
				for i := 0; i < len(kv); i += 2 {
					m[kv[i].(string)] = kv[i+1]
				}
				return m
			}
			checkRecord(t, first, with("method", "GET", "status", 200.0, "bytes_in", 0.0,
				"bytes_out", float64(len("web token=secret"))), true)
			checkRecord(t, upload, with("method", "POST", "status", 200.0, "bytes_in", 5.0), true)
			checkRecord(t, wrong, with("method", "GET", "status", 421.0, "bytes_in", 0.0, "reason", reasonMisdirected), false)
			if _, ok := first["reason"]; ok {
				t.Errorf("an answered request has a reason: %v", first)
			}
			// The instance's byte counters hold what the records say.
			var sumIn, sumOut uint64
			for _, r := range out.records(t, "", nil) {
				sumIn += uint64(r["bytes_in"].(float64))
				sumOut += uint64(r["bytes_out"].(float64))
			}
			if toApp, toClient := e.table.Lookup(h2WebHost).Instance.Bytes(); toApp != sumIn || toClient != sumOut || toApp != 5 {
				t.Errorf("instance bytes to_app %d, to_client %d; want %d (5), %d", toApp, toClient, sumIn, sumOut)
			}
			for _, s := range []string{"secret", "token", "cookievalue", "session", "authvalue", "Bearer", "?"} {
				if strings.Contains(out.text(), s) {
					t.Errorf("the access log holds %q:\n%s", s, out.text())
				}
			}

			for _, c := range []struct {
				outcome string
				want    uint64
			}{{"ok", 2}, {"denied", 1}} {
				if n := histCount(t, reg, "applistener_request_duration_seconds",
					map[string]string{"protocol": proto, "outcome": c.outcome}); n != c.want {
					t.Errorf("request_duration_seconds{protocol=%s,outcome=%s} count = %d, want %d", proto, c.outcome, n, c.want)
				}
			}
			for _, name := range []string{"applistener_upstream_connect_seconds", "applistener_upstream_first_byte_seconds"} {
				if n := histCount(t, reg, name, nil); n != 2 {
					t.Errorf("%s count = %d, want 2", name, n)
				}
			}
		})
	}
}

// TestAccessLogWebSocket: a WebSocket that lives about 2 s logs one line
// when it ends (none at the upgrade), with its duration and the bytes of
// both directions.
func TestAccessLogWebSocket(t *testing.T) {
	h2Verify(t)
	out := &lineLog{}
	reg := prometheus.NewRegistry()
	e := newH2Env(t, 0, Config{AccessLog: AccessLogJSON, AccessLogWriter: out, Registerer: reg})
	port := wsEchoApp(t)
	doc, err := routes.ParseDocument([]byte(fmt.Sprintf(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",`+
		`"connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"ws","port":%d,"revision":1}]}]}`, port)))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	e.table.Apply(doc)
	host := "team--demo--ws." + h2Domain
	dialer := websocket.Dialer{
		TLSClientConfig:  &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}},
		HandshakeTimeout: 5 * time.Second,
		NetDial:          func(string, string) (net.Conn, error) { return net.Dial("tcp", e.ln.Addr().String()) },
	}
	start := time.Now()
	c, resp, err := dialer.Dial("wss://"+host+"/ws?token=secret", nil)
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	_ = resp.Body.Close()
	defer func() { _ = c.Close() }()
	// The server's record starts before its 101, so before Dial returned:
	// 2 s from here bound its duration from below.
	opened := time.Now()
	// Messages every 100 ms for 2 s: client frames carry a 6-byte header
	// (masked), the app's a 2-byte one.
	var payload, frames int
	for i := 0; time.Since(opened) < 2*time.Second; i++ {
		msg := fmt.Sprintf("message %d", i)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := c.ReadMessage(); err != nil || string(got) != msg {
			t.Fatalf("echo %q, %v", got, err)
		}
		payload += len(msg)
		frames++
		if len(out.records(t, "", nil)) != 0 {
			t.Fatalf("a line before the WebSocket ended: %s", out.text())
		}
		time.Sleep(100 * time.Millisecond) // the WebSocket's life, not a wait for a condition
	}
	_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, _, err := c.ReadMessage(); err != nil {
			break
		}
	}
	_ = c.Close()
	rec := out.waitRecord(t, "protocol", "ws")
	lived := time.Since(start) // an upper bound: the line is there
	checkRecord(t, rec, map[string]any{"path": "/ws", "method": "GET", "status": 101.0, "service": "ws",
		"host": host, "sandbox": "demo"}, true)
	d := rec["duration"].(float64)
	if d < 2 || d > lived.Seconds() {
		t.Errorf("duration %v s, want between 2 and %v", d, lived.Seconds())
	}
	// Up: every client frame plus its close frame (6 + 2 bytes); down:
	// every echo plus the app's close frame (2 + 2).
	in, outB := rec["bytes_in"].(float64), rec["bytes_out"].(float64)
	if wantIn := float64(payload + 6*frames + 8); in != wantIn {
		t.Errorf("bytes_in = %v, want %v", in, wantIn)
	}
	if wantOut := float64(payload + 2*frames + 4); outB != wantOut {
		t.Errorf("bytes_out = %v, want %v", outB, wantOut)
	}
	if toApp, toClient := e.table.Lookup(host).Instance.Bytes(); toApp != uint64(payload+6*frames+8) || toClient != uint64(payload+2*frames+4) {
		t.Errorf("instance bytes to_app %d, to_client %d; want %d, %d", toApp, toClient, payload+6*frames+8, payload+2*frames+4)
	}
	if strings.Contains(out.text(), "secret") {
		t.Errorf("query logged: %s", out.text())
	}
	if n := len(out.records(t, "", nil)); n != 1 {
		t.Errorf("%d lines for one WebSocket:\n%s", n, out.text())
	}
	if n := histCount(t, reg, "applistener_request_duration_seconds", map[string]string{"protocol": "ws", "outcome": "ok"}); n != 1 {
		t.Errorf("request_duration_seconds{protocol=ws} count = %d, want 1", n)
	}
}

// TestAccessLogPerInstanceBound: one sandbox flooding requests through a
// slow log destination cannot push another sandbox's lines out: the
// noisy one is held to its token bucket (the excess dropped and counted),
// the quiet one's lines all arrive, and the log writer drops nothing.
func TestAccessLogPerInstanceBound(t *testing.T) {
	h2Verify(t)
	dst := &lineLog{delay: 2 * time.Millisecond}
	sink := logsink.New(dst, 32, time.Hour, true)
	t.Cleanup(func() { sink.Close(5 * time.Second) })
	const rate, burst = 10, 20
	e := newH2Env(t, 0, Config{AccessLog: AccessLogJSON, AccessLogWriter: sink, AccessLogRate: rate, AccessLogBurst: burst})
	doc, err := routes.ParseDocument([]byte(fmt.Sprintf(`{"revision":"r","instances":[`+
		`{"workspace":"team","sandbox":"quiet","services":[{"name":"web","port":%d}]},`+
		`{"workspace":"team","sandbox":"noisy","services":[{"name":"web","port":%d}]}]}`, e.web.port(), e.web.port())))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	e.table.Apply(doc)
	noisyHost, quietHost := "team--noisy--web."+h2Domain, "team--quiet--web."+h2Domain

	start := time.Now()
	var noisy atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var stopOnce sync.Once
	endFlood := func() {
		stopOnce.Do(func() { close(stop) })
		wg.Wait()
	}
	defer endFlood() // a failed wait below ends the flood before the cleanups close its connections
	for range 4 {
		cc := e.dial(noisyHost)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if res := h2Do(cc, h2Req(t, "GET", noisyHost, "/", nil)); res.err != nil || res.status != 200 {
					t.Errorf("noisy request: %d %v", res.status, res.err)
					return
				}
				noisy.Add(1)
			}
		})
	}
	// The quiet sandbox's requests, within its own burst, amid the flood.
	const quiet = 15
	cc := e.dial(quietHost)
	// The deadlines are generous: under -race on a loaded 2-core machine
	// the 1,000 requests have taken more than 10 s. The flood still far
	// outruns the bucket: at 60 s it would allow 621 lines.
	testutil.Eventually(t, 30*time.Second, "the flood under way", func() bool { return noisy.Load() > 100 })
	for range quiet {
		h2MustDo(t, cc, h2Req(t, "GET", quietHost, "/", nil), 200)
	}
	testutil.Eventually(t, 60*time.Second, "the flood at 1000 requests", func() bool { return noisy.Load() >= 1000 })
	endFlood()

	// A request's line is kept or dropped when its stream ends, which can
	// be after its client has the response: the bound's time runs until
	// the last of them is counted, not until the client's last answer.
	sent := noisy.Load()
	var elapsed time.Duration
	testutil.Eventually(t, 30*time.Second, "every line written and every drop counted", func() bool {
		got := int64(len(dst.records(t, "sandbox", "noisy")))
		ok := len(dst.records(t, "sandbox", "quiet")) == quiet &&
			got+int64(promtest.ToFloat64(e.srv.m.accessLogDropped)) == sent
		elapsed = time.Since(start) // after every count it read
		return ok
	})
	got := len(dst.records(t, "sandbox", "noisy"))
	if limit := burst + int(rate*elapsed.Seconds()) + 1; got > limit {
		t.Errorf("noisy sandbox logged %d lines in %v; the bound allows %d", got, elapsed, limit)
	}
	if got < burst {
		t.Errorf("noisy sandbox logged %d lines, fewer than its burst %d", got, burst)
	}
	if n := sink.Dropped(); n != 0 {
		t.Errorf("the log writer dropped %d lines", n)
	}
	t.Logf("noisy: %d requests, %d lines, %v dropped in %v", sent, got, promtest.ToFloat64(e.srv.m.accessLogDropped), elapsed)
}

// TestAccessLogProcessBound: over HTTP/1.1 and HTTP/2, requests spread
// over many sandboxes, each far within its own bound, are held together to
// the process-wide bound: at most its burst plus its rate over the run
// reach the log, and every other line is counted as dropped.
func TestAccessLogProcessBound(t *testing.T) {
	h2Verify(t)
	const sandboxes, perSandbox = 20, 5
	const totalRate, totalBurst = 5, 10
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			out := &lineLog{}
			e := newH2Env(t, 0, Config{AccessLog: AccessLogJSON, AccessLogWriter: out,
				AccessLogRate: 1000, AccessLogBurst: 2000, AccessLogTotalRate: totalRate, AccessLogTotalBurst: totalBurst})
			var inst []string
			for i := range sandboxes {
				inst = append(inst, fmt.Sprintf(`{"workspace":"team","sandbox":"s%d","services":[{"name":"web","port":%d}]}`, i, e.web.port()))
			}
			doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[` + strings.Join(inst, ",") + `]}`))
			if err != nil || len(doc.Rejected) > 0 {
				t.Fatalf("document: %v %+v", err, doc)
			}
			e.table.Apply(doc)
			var do []func()
			for i := range sandboxes {
				host := fmt.Sprintf("team--s%d--web.%s", i, h2Domain)
				switch proto {
				case "h1":
					c := e.h1(host)
					do = append(do, func() {
						if st, _, _ := c.do(t, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); st != 200 {
							t.Fatalf("%s: status %d", host, st)
						}
					})
				case "h2":
					cc := e.dial(host)
					do = append(do, func() { h2MustDo(t, cc, h2Req(t, "GET", host, "/", nil), 200) })
				}
			}
			start := time.Now()
			for range perSandbox {
				for _, f := range do {
					f()
				}
			}
			// A line is kept or dropped when its request ends, which can be
			// after the client has the response: the bound's time runs until
			// the last line is counted.
			const sent = sandboxes * perSandbox
			var elapsed time.Duration
			testutil.Eventually(t, 30*time.Second, "every line written or counted as dropped", func() bool {
				ok := len(out.records(t, "", nil))+int(promtest.ToFloat64(e.srv.m.accessLogDropped)) == sent
				elapsed = time.Since(start) // after every count it read
				return ok
			})
			got := len(out.records(t, "", nil))
			if limit := totalBurst + int(totalRate*elapsed.Seconds()) + 1; got > limit {
				t.Errorf("%d lines for %d requests in %v; the process-wide bound allows %d", got, sent, elapsed, limit)
			}
			if got < totalBurst {
				t.Errorf("%d lines, fewer than the process-wide burst %d", got, totalBurst)
			}
		})
	}
}

// TestAccessLogTextFormat: the text form is logfmt: bare values, quoted
// ones where needed (spaces, quotes, control bytes), no query (in the path
// or the referer), no user information in the referer, the request id, the
// user agent bounded.
func TestAccessLogTextFormat(t *testing.T) {
	l := newAccessLog(&Config{AccessLog: AccessLogText, AccessLogWriter: &lineLog{}}, prometheus.NewCounter(prometheus.CounterOpts{Name: "x"}))
	rt := &routes.Route{Workspace: "team", Sandbox: "demo", Service: "", InstallationVersion: 7}
	r := accessRecord{proto: protoH1, parsed: true, mb: []byte("GET"), pb: []byte("/a\"b\x01?token=secret"),
		status: 503, reason: reasonRevoked, bytesIn: 3, bytesOut: 4, connect: 1500 * time.Microsecond, firstByte: -1}
	r.id.n = uint8(copy(r.id.b[:], "0af7651916cd43dd8448eb211c80319c"))
	r.uab = []byte("curl/8.5.0 (x86_64) " + strings.Repeat("x", 2000))
	r.refb = []byte("https://user:pw@team--demo.apps.test:8443/from?token=secret#frag")
	ci := connInfo{route: rt, sni: "team--demo.apps.test", peer: netip.MustParseAddr("10.0.0.1"), tlsVer: tls.VersionTLS12}
	end := time.Date(2026, 12, 1, 15, 4, 5, 123456000, time.UTC)
	got := string(l.appendLine(nil, &r, &ci, end, 2*time.Millisecond))
	want := `time=2026-12-01T15:04:05.123456Z level=INFO msg=access request_id=0af7651916cd43dd8448eb211c80319c protocol=h1 workspace=team sandbox=demo service="" ` +
		`host=team--demo.apps.test method=GET path="/a\"b\u0001" status=503 bytes_in=3 bytes_out=4 duration=0.002000 ` +
		`upstream_connect=0.001500 tls=1.2 client=10.0.0.1 user_agent="curl/8.5.0 (x86_64) ` + strings.Repeat("x", maxLoggedField-20) + `" ` +
		`referer=team--demo.apps.test:8443/from reason="this application route is no longer available" installation_version=7` + "\n"
	if got != want {
		t.Errorf("text line\n got %s\nwant %s", got, want)
	}
	l.json = true
	line := l.appendLine(nil, &r, &ci, end, 2*time.Millisecond)
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatalf("json line %s: %v", line, err)
	}
	if m["path"] != "/a\"b\x01" || m["service"] != "" || m["upstream_connect"] != 0.0015 || bytes.Contains(line, []byte("secret")) ||
		m["request_id"] != "0af7651916cd43dd8448eb211c80319c" || m["referer"] != "team--demo.apps.test:8443/from" ||
		len(m["user_agent"].(string)) != maxLoggedField || bytes.Contains(line, []byte("pw")) {
		t.Errorf("json line %s", line)
	}
	// Detached (a streamed body, a WebSocket): the same values as strings.
	r.detach()
	if r.uab != nil || r.refb != nil || !bytes.Equal(l.appendLine(nil, &r, &ci, end, 2*time.Millisecond), line) {
		t.Errorf("detached record logged differently:\n%s", l.appendLine(nil, &r, &ci, end, 2*time.Millisecond))
	}
}

// TestAccessLogOff: with the access log off nothing is written, and the
// latency histograms still observe every request.
func TestAccessLogOff(t *testing.T) {
	h2Verify(t)
	out := &lineLog{}
	reg := prometheus.NewRegistry()
	e := newH2Env(t, 0, Config{AccessLog: AccessLogOff, AccessLogWriter: out, Registerer: reg})
	if e.srv.alog != nil {
		t.Fatal("an access log although it is off")
	}
	if st, _, _ := e.h1(h2WebHost).do(t, "GET / HTTP/1.1\r\nHost: "+h2WebHost+"\r\n\r\n"); st != 200 {
		t.Fatalf("status %d", st)
	}
	testutil.Eventually(t, 5*time.Second, "the request observed", func() bool {
		return histCount(t, reg, "applistener_request_duration_seconds", map[string]string{"protocol": "h1", "outcome": "ok"}) == 1
	})
	if s := out.text(); s != "" {
		t.Errorf("lines written with the access log off: %q", s)
	}
}

// TestAccessLogNoAllocations: ending a request allocates nothing, with the
// access log off or on (the line is formatted into a pooled buffer; only
// the log writer's copy of it, outside this test, allocates).
func TestAccessLogNoAllocations(t *testing.T) {
	rt := &routes.Route{Workspace: "team", Sandbox: "demo", Service: "web", InstallationVersion: 3, Instance: &routes.Instance{}}
	ci := connInfo{route: rt, sni: h2WebHost, peer: netip.MustParseAddr("10.1.2.3"), tlsVer: tls.VersionTLS13}
	method, path := []byte("GET"), []byte("/static/app.js?v=3")
	ua, ref := []byte("Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"), []byte("https://"+h2WebHost+"/dashboard?tab=1")
	for _, format := range []string{AccessLogOff, AccessLogText, AccessLogJSON} {
		s := New(Config{AccessLog: format, AccessLogWriter: io.Discard})
		var r accessRecord
		allocs := testing.AllocsPerRun(200, func() {
			r.begin(protoH1) // a new request id
			r.parsed, r.mb, r.pb, r.uab, r.refb = true, method, path, ua, ref
			r.status, r.bytesOut, r.connect, r.firstByte = 200, 1234, 80*time.Microsecond, 310*time.Microsecond
			s.endRequest(&r, &ci)
		})
		if allocs != 0 {
			t.Errorf("access log %s: %v allocations per request, want 0", format, allocs)
		}
	}
}
