package ocsf_test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/ocsf/ocsftest"
)

var (
	t0     = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	client = netip.MustParseAddrPort("198.51.100.7:51234")
	local  = netip.MustParseAddrPort("10.0.0.5:8443")
	route  = ocsf.RouteRef{Workspace: "team", Sandbox: "demo", Service: "web", InstallationVersion: 7}
)

func httpRec(mod func(h *ocsf.HTTP)) *ocsf.Event {
	h := &ocsf.HTTP{
		Start: t0, End: t0.Add(1500 * time.Microsecond), Method: "GET", Path: "/index.html",
		Host: "team--demo--web.apps.example.com", Version: "1.1", Status: 200, Outcome: ocsf.Allowed,
		Src: client, Dst: local, TLSVersion: tls.VersionTLS13, BytesIn: 10, BytesOut: 2048,
		Connect: 200 * time.Microsecond, FirstByte: time.Millisecond, Route: route, Protocol: "h1",
	}
	if mod != nil {
		mod(h)
	}
	return ocsf.HTTPActivity(h)
}

// records is one record of every kind the listener writes.
func records() map[string]*ocsf.Event {
	m := map[string]*ocsf.Event{
		"http allowed": httpRec(nil),
		"http 421 h2": httpRec(func(h *ocsf.HTTP) {
			h.Status, h.Outcome, h.Reason, h.Version, h.Protocol = 421, ocsf.Denied, "the Host header does not match the TLS server name", "2", "h2"
		}),
		"http 503 revoked": httpRec(func(h *ocsf.HTTP) {
			h.Status, h.Outcome, h.Reason, h.Method = 503, ocsf.Denied, "this application route is no longer available", "POST"
		}),
		"http 400 before the request line": httpRec(func(h *ocsf.HTTP) {
			h.Status, h.Outcome, h.Reason, h.Method, h.Path = 400, ocsf.Denied, "malformed request", "", ""
			h.Connect, h.FirstByte = -1, -1
		}),
		"http 408 h2 connection": httpRec(func(h *ocsf.HTTP) {
			h.Status, h.Outcome, h.Method, h.Path, h.Start, h.Route = 408, ocsf.Denied, "", "", time.Time{}, ocsf.RouteRef{}
		}),
		"http 504": httpRec(func(h *ocsf.HTTP) {
			h.Status, h.Outcome, h.Reason, h.FirstByte = 504, ocsf.UpstreamError, "timed out waiting for the application's response", -1
		}),
		"http aborted": httpRec(func(h *ocsf.HTTP) { h.Status, h.Outcome = 499, ocsf.Aborted }),
		"http other method, IPv6": httpRec(func(h *ocsf.HTTP) {
			h.Method = "PROPFIND"
			h.Src = netip.MustParseAddrPort("[2001:db8::7]:40000")
		}),
		"http websocket": httpRec(func(h *ocsf.HTTP) { h.Status, h.Protocol = 101, "ws" }),
		"net accepted": ocsf.NetworkActivity(&ocsf.Connection{
			Time: t0, Activity: ocsf.NetOpen, Src: client, Dst: local, DstHost: "team--demo--web.apps.example.com",
			SNI: "team--demo--web.apps.example.com", TLSVersion: tls.VersionTLS13, Route: route,
		}),
		"net unknown sni": ocsf.NetworkActivity(&ocsf.Connection{
			Time: t0, Activity: ocsf.NetRefuse, Src: client, Dst: local, DstHost: "nope.apps.example.com", Reason: "unknown_sni",
		}),
		"net no sni": ocsf.NetworkActivity(&ocsf.Connection{Time: t0, Activity: ocsf.NetRefuse, Src: client, Dst: local, Reason: "no_sni"}),
		"net app dial failed (unix)": ocsf.NetworkActivity(&ocsf.Connection{
			Time: t0, Activity: ocsf.NetFail, DstName: "/run/sbx/demo/8080.sock", DstHost: "team--demo--web.apps.example.com",
			Reason: "connection refused", Route: route,
		}),
		"net app dial failed (tcp)": ocsf.NetworkActivity(&ocsf.Connection{
			Time: t0, Activity: ocsf.NetFail, Dst: netip.MustParseAddrPort("127.0.0.1:8080"), Reason: "i/o timeout", Route: route,
		}),
		"instance rejected": ocsf.InstanceRejected(&ocsf.InstanceRejection{
			Time: t0, Workspace: "team", Sandbox: "bad", Index: 2, Reason: "service \"web\": port 80800 out of range", Revision: "r3",
		}),
		"instance rejected without a name": ocsf.InstanceRejected(&ocsf.InstanceRejection{Time: t0, Index: 0, Reason: "sandbox: required"}),
	}
	for _, kind := range []string{"installed", "changed", "withdrawn", "rejected", "expired", "stopped", "shutdown", "something new"} {
		m["route "+kind] = ocsf.RouteEvent(&ocsf.RouteChange{
			Time: t0, Kind: kind, Host: "team--demo--web.apps.example.com", Port: 8080, Route: route, Streams: 3, Reason: "why",
		})
	}
	for _, kind := range []string{"renewed", "changed", "closed"} {
		m["table "+kind] = ocsf.TableEvent(&ocsf.TableChange{
			Time: t0, Kind: kind, Domain: "apps.example.com", Revision: "r42", Routes: 10000,
			Counts: map[string]int{"installed": 9000, "expired": 1}, Streams: 12, FreshFor: 30 * time.Second,
		})
	}
	return m
}

// TestRecordsValidate: every kind of record validates against its class in
// the OCSF 1.8.0 schema, with the class, severity and level chosen.
func TestRecordsValidate(t *testing.T) {
	em := ocsf.NewEmitter(nil, slog.LevelDebug, ocsf.Product{Version: "v1.2.3"})
	for name, ev := range records() {
		line := em.Append(nil, ev)
		if err := ocsftest.Validate(line); err != nil {
			t.Errorf("%s: %v\n%s", name, err, line)
		}
		if !bytes.HasSuffix(line, []byte("}\n")) || bytes.Count(line, []byte("\n")) != 1 {
			t.Errorf("%s: not one line: %q", name, line)
		}
	}
	want := map[string]struct {
		class, activity, severity, status int
		level                             slog.Level
	}{
		"http allowed":            {4002, 3, 1, 1, slog.LevelDebug},
		"http 421 h2":             {4002, 3, 2, 2, slog.LevelInfo},
		"http 503 revoked":        {4002, 6, 2, 2, slog.LevelInfo},
		"http 504":                {4002, 3, 3, 2, slog.LevelWarn},
		"net unknown sni":         {4001, 5, 2, 2, slog.LevelInfo},
		"net accepted":            {4001, 1, 1, 1, slog.LevelDebug},
		"route installed":         {3004, 1, 1, 1, slog.LevelInfo},
		"route withdrawn":         {3004, 4, 1, 1, slog.LevelInfo},
		"route expired":           {3004, 4, 3, 1, slog.LevelWarn},
		"instance rejected":       {3004, 1, 3, 2, slog.LevelWarn},
		"table renewed":           {3004, 3, 3, 1, slog.LevelWarn}, // an expiry among the counts
		"http other method, IPv6": {4002, 99, 1, 1, slog.LevelDebug},
	}
	recs := records()
	for name, w := range want {
		ev := recs[name]
		got := [...]int{ev.ClassUID, ev.ActivityID, ev.SeverityID, ev.StatusID}
		if got != [...]int{w.class, w.activity, w.severity, w.status} || ev.Level != w.level {
			t.Errorf("%s: class, activity, severity, status %v level %v; want %v %v",
				name, got, ev.Level, [...]int{w.class, w.activity, w.severity, w.status}, w.level)
		}
	}
}

// TestHTTPRecordFields: a request record carries the endpoints, the
// request and response, the decision reason and the route's owner.
func TestHTTPRecordFields(t *testing.T) {
	rec := httpRec(func(h *ocsf.HTTP) {
		h.Status, h.Outcome, h.Reason = 421, ocsf.Denied, "the Host header does not match the TLS server name"
	})
	line := ocsf.NewEmitter(nil, slog.LevelInfo, ocsf.Product{Version: "v9"}).Append(nil, rec)
	for path, want := range map[string]string{
		"class_uid": "4002", "category_uid": "4", "activity_id": "3", "type_uid": "400203",
		"src_endpoint.ip": "198.51.100.7", "src_endpoint.port": "51234",
		"dst_endpoint.ip": "10.0.0.5", "dst_endpoint.port": "8443", "dst_endpoint.hostname": "team--demo--web.apps.example.com",
		"http_request.http_method": "GET", "http_request.url.path": "/index.html", "http_request.version": "1.1",
		"http_response.code": "421", "status_detail": "the Host header does not match the TLS server name",
		"unmapped.workspace": "team", "unmapped.sandbox": "demo", "unmapped.service": "web",
		"metadata.product.name": "applistener", "metadata.product.vendor_name": "applistener",
		"metadata.product.version": "v9", "metadata.version": ocsf.SchemaVersion,
		"traffic.bytes_out": "10", "traffic.bytes_in": "2048", "tls.version": "1.3",
		"time": "1777636800001", "start_time": "1777636800000", "duration": "1",
	} {
		if got := ocsftest.Attr(line, path); got == nil || strings.Trim(jsonString(got), `"`) != want {
			t.Errorf("%s = %v, want %s", path, got, want)
		}
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestNoQueryInRecords: a query string or fragment never reaches a record.
func TestNoQueryInRecords(t *testing.T) {
	rec := httpRec(func(h *ocsf.HTTP) { h.Path = "/login?token=secret&x=1#frag" })
	line := ocsf.NewEmitter(nil, slog.LevelDebug, ocsf.Product{}).Append(nil, rec)
	for _, bad := range []string{"secret", "token", "?", "#frag"} {
		if bytes.Contains(line, []byte(bad)) {
			t.Errorf("record carries %q: %s", bad, line)
		}
	}
	if got := ocsftest.Attr(line, "http_request.url.path"); got != "/login" {
		t.Errorf("path %v, want /login", got)
	}
}

// TestEmitterLevel: the emitter filters by its own level; a nil emitter
// or one without a writer writes nothing; levels parse as slog's.
func TestEmitterLevel(t *testing.T) {
	var buf bytes.Buffer
	em := ocsf.NewEmitter(&buf, slog.LevelWarn, ocsf.Product{})
	recs := records()
	em.Emit(recs["http 421 h2"])   // info
	em.Emit(recs["route expired"]) // warn
	em.Emit(recs["http 504"])      // warn
	em.Emit(recs["net accepted"])  // debug
	if got := len(ocsftest.Records(buf.String())); got != 2 {
		t.Errorf("warn emitter wrote %d records, want 2:\n%s", got, buf.String())
	}
	if em.Enabled(slog.LevelInfo) || !em.Enabled(slog.LevelError) {
		t.Error("Enabled disagrees with the level")
	}
	var nilEm *ocsf.Emitter
	nilEm.Emit(recs["route expired"])
	if nilEm.Enabled(slog.LevelError) {
		t.Error("nil emitter enabled")
	}
	if ocsf.NewEmitter(nil, slog.LevelDebug, ocsf.Product{}).Enabled(slog.LevelError) {
		t.Error("emitter without a writer enabled")
	}
	if l, err := ocsf.ParseLevel("debug"); err != nil || l != slog.LevelDebug {
		t.Errorf("ParseLevel(debug) = %v, %v", l, err)
	}
	if _, err := ocsf.ParseLevel("loud"); err == nil {
		t.Error("ParseLevel(loud) accepted")
	}
}
