package dispatch

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/ocsf/ocsftest"
	"github.com/applistener/applistener/internal/testutil"
)

const h2DownHost = "team--demo--down.apps.test"

// ocsfLines returns the OCSF records written to l.
func (l *lineLog) ocsfLines() [][]byte { return ocsftest.Records(l.text()) }

// ocsfWith returns the records whose attribute path has value want.
func ocsfWith(recs [][]byte, path, want string) [][]byte {
	var out [][]byte
	for _, r := range recs {
		if v := ocsftest.Attr(r, path); v != nil && strings.Trim(jsonString(v), `"`) == want {
			out = append(out, r)
		}
	}
	return out
}

func jsonString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case interface{ String() string }:
		return x.String()
	}
	return ""
}

// ocsfRequests sends, over proto, an allowed GET with a query, a cookie
// and credentials, a misdirected request (421) and one to an app that is
// down (502).
func ocsfRequests(t *testing.T, e *h2Env, proto string) {
	switch proto {
	case "h1":
		c := e.h1(h2WebHost)
		if st, _, _ := c.do(t, "GET /first?token=secret HTTP/1.1\r\nHost: "+h2WebHost+
			"\r\nCookie: session=cookievalue\r\nAuthorization: Bearer authvalue\r\n\r\n"); st != 200 {
			t.Fatalf("status %d", st)
		}
		if st, _, _ := c.do(t, "GET /wrong?token=secret HTTP/1.1\r\nHost: "+h2APIHost+"\r\n\r\n"); st != 421 {
			t.Fatalf("misdirected status %d", st)
		}
		if st, _, _ := e.h1(h2DownHost).do(t, "GET /down HTTP/1.1\r\nHost: "+h2DownHost+"\r\n\r\n"); st != 502 {
			t.Fatalf("down status %d", st)
		}
	case "h2":
		cc := e.dial(h2WebHost)
		req := h2Req(t, "GET", h2WebHost, "/first?token=secret", nil)
		req.Header.Set("Cookie", "session=cookievalue")
		req.Header.Set("Authorization", "Bearer authvalue")
		h2MustDo(t, cc, req, 200)
		h2MustDo(t, cc, h2Req(t, "GET", h2APIHost, "/wrong?token=secret", nil), 421)
		h2MustDo(t, e.dial(h2DownHost), h2Req(t, "GET", h2DownHost, "/down", nil), 502)
	}
}

// checkOCSF validates every record and checks that none carries a query,
// a cookie or a credential.
func checkOCSF(t *testing.T, recs [][]byte) {
	t.Helper()
	for _, r := range recs {
		if err := ocsftest.Validate(r); err != nil {
			t.Errorf("record does not validate: %v\n%s", err, r)
		}
		for _, s := range []string{"secret", "token", "cookievalue", "session", "authvalue", "Bearer", "?"} {
			if strings.Contains(string(r), s) {
				t.Errorf("record holds %q: %s", s, r)
			}
		}
	}
}

// TestOCSFRequestRecords: over HTTP/1.1 and HTTP/2, at --ocsf-level info
// a refusal gives one HTTP Activity record (Low), an app that is down one
// HTTP Activity record (Medium) and one Network Activity record of the
// failed app connection, an allowed request none; at debug the allowed
// request has one too. Every record validates against its class and
// carries no query, cookie or credential.
func TestOCSFRequestRecords(t *testing.T) {
	h2Verify(t)
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			out := &lineLog{}
			em := ocsf.NewEmitter(out, slog.LevelInfo, ocsf.Product{Version: "test"})
			e := newH2Env(t, 0, Config{OCSF: em, AppStartGrace: -1})
			ocsfRequests(t, e, proto)
			// A request's record is written once its answer has gone out:
			// the 421's may come after the 502 was answered.
			testutil.Eventually(t, 5*time.Second, "the 421's and the 502's records", func() bool {
				return len(ocsfWith(out.ocsfLines(), "http_response.code", "421")) == 1 &&
					len(ocsfWith(out.ocsfLines(), "http_response.code", "502")) == 1 &&
					len(ocsfWith(out.ocsfLines(), "class_uid", "4001")) == 1
			})
			recs := out.ocsfLines()
			checkOCSF(t, recs)
			if len(recs) != 3 {
				t.Fatalf("%d records, want 3 (421, 502 and its app connection):\n%s", len(recs), out.text())
			}
			version := map[string]string{"h1": "1.1", "h2": "2"}[proto]
			for path, want := range map[string]string{
				"class_uid": "4002", "activity_id": "3", "severity_id": "2", "status_id": "2",
				"http_request.url.path": "/wrong", "http_request.version": version,
				"dst_endpoint.hostname": h2WebHost, "src_endpoint.ip": "127.0.0.1", "tls.version": "1.3",
				"status_detail": reasonMisdirected, "unmapped.workspace": "team", "unmapped.sandbox": "demo",
				"unmapped.service": "web", "unmapped.protocol": proto,
			} {
				got := ocsfWith(recs, "http_response.code", "421")
				if len(got) != 1 {
					t.Fatalf("%d records of the 421", len(got))
				}
				if v := jsonString(ocsftest.Attr(got[0], path)); v != want {
					t.Errorf("421 record: %s = %q, want %q", path, v, want)
				}
			}
			if p := ocsftest.Attr(ocsfWith(recs, "http_response.code", "421")[0], "src_endpoint.port"); p == nil || jsonString(p) == "0" {
				t.Errorf("421 record: no client port")
			}
			if got := ocsfWith(recs, "http_response.code", "502"); jsonString(ocsftest.Attr(got[0], "severity_id")) != "3" {
				t.Errorf("502 record severity: %s", got[0])
			}
			app := ocsfWith(recs, "class_uid", "4001")[0]
			for path, want := range map[string]string{"activity_id": "4", "dst_endpoint.ip": "127.0.0.1",
				"dst_endpoint.port": jsonString(ocsftest.Attr(app, "dst_endpoint.port")), "unmapped.service": "down"} {
				if v := jsonString(ocsftest.Attr(app, path)); v != want || v == "" {
					t.Errorf("app connection record: %s = %q, want %q", path, v, want)
				}
			}

			// At debug, the allowed request has its record too.
			out2 := &lineLog{}
			e2 := newH2Env(t, 0, Config{OCSF: ocsf.NewEmitter(out2, slog.LevelDebug, ocsf.Product{}), AppStartGrace: -1})
			ocsfRequests(t, e2, proto)
			testutil.Eventually(t, 5*time.Second, "the allowed request's record", func() bool {
				return len(ocsfWith(out2.ocsfLines(), "http_response.code", "200")) == 1
			})
			ok := ocsfWith(out2.ocsfLines(), "http_response.code", "200")[0]
			checkOCSF(t, out2.ocsfLines())
			if v := jsonString(ocsftest.Attr(ok, "severity_id")); v != "1" {
				t.Errorf("allowed request severity %s: %s", v, ok)
			}
			if v := jsonString(ocsftest.Attr(ok, "http_request.url.path")); v != "/first" {
				t.Errorf("allowed request path %q", v)
			}
		})
	}
}

// TestOCSFAccessLog: with --access-log=ocsf every request's access-log
// line is an HTTP Activity record that validates, and a refusal written
// by the access log is not written again by the OCSF emitter.
func TestOCSFAccessLog(t *testing.T) {
	h2Verify(t)
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			out := &lineLog{}
			em := ocsf.NewEmitter(out, slog.LevelInfo, ocsf.Product{Version: "test"})
			e := newH2Env(t, 0, Config{AccessLog: AccessLogOCSF, AccessLogWriter: out, OCSF: em, AppStartGrace: -1})
			ocsfRequests(t, e, proto)
			testutil.Eventually(t, 5*time.Second, "three HTTP Activity records", func() bool {
				return len(ocsfWith(out.ocsfLines(), "class_uid", "4002")) >= 3
			})
			recs := out.ocsfLines()
			checkOCSF(t, recs)
			for _, code := range []string{"200", "421", "502"} {
				if n := len(ocsfWith(recs, "http_response.code", code)); n != 1 {
					t.Errorf("%d records with status %s, want 1:\n%s", n, code, out.text())
				}
			}
			if n := len(ocsfWith(recs, "class_uid", "4002")); n != 3 {
				t.Errorf("%d HTTP Activity records, want 3", n)
			}
			if v := jsonString(ocsftest.Attr(ocsfWith(recs, "http_response.code", "200")[0], "metadata.product.version")); v != "test" {
				t.Errorf("product version %q", v)
			}
		})
	}
}

// TestOCSFH2HeadTimeout: an HTTP/2 connection closed because a head did
// not arrive in time (no request of its own) gives one HTTP Activity
// record with 408 that validates.
func TestOCSFH2HeadTimeout(t *testing.T) {
	h2Verify(t)
	out := &lineLog{}
	e := newH2Env(t, 0, Config{HeaderTimeout: h2TestHeadTimeout, OCSF: ocsf.NewEmitter(out, slog.LevelInfo, ocsf.Product{})})
	tc, _ := h2RawConn(t, e, h2WebHost)
	if _, err := tc.Write([]byte{0, 0, 10, 1}); err != nil { // an incomplete frame header
		t.Fatal(err)
	}
	h2ClosedWithin(t, tc, 20*h2TestHeadTimeout)
	testutil.Eventually(t, 5*time.Second, "the 408 record", func() bool { return len(out.ocsfLines()) >= 1 })
	recs := out.ocsfLines()
	checkOCSF(t, recs)
	if len(recs) != 1 || jsonString(ocsftest.Attr(recs[0], "http_response.code")) != "408" ||
		jsonString(ocsftest.Attr(recs[0], "unmapped.protocol")) != "h2" || jsonString(ocsftest.Attr(recs[0], "status_detail")) != reasonReqTimeout {
		t.Errorf("records: %s", recs)
	}
}
