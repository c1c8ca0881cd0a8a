package dispatch

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/wake"
)

// ocsfWakeRecords returns the HTTP Activity records written to l whose
// unmapped.wake is set, as (protocol, wake) → held milliseconds.
func ocsfWakeRecords(t *testing.T, l *lineLog) map[[2]string][]int64 {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[[2]string][]int64{}
	for _, line := range l.lines {
		var rec struct {
			ClassUID int `json:"class_uid"`
			Unmapped struct {
				Protocol   string `json:"protocol"`
				Wake       string `json:"wake"`
				WakeHeldMs *int64 `json:"wake_held_ms"`
			} `json:"unmapped"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("OCSF line is not JSON: %v: %q", err, line)
		}
		u := rec.Unmapped
		if rec.ClassUID != 4002 || u.Wake == "" {
			continue
		}
		if u.WakeHeldMs == nil {
			t.Fatalf("OCSF record with wake %q and no wake_held_ms: %q", u.Wake, line)
		}
		k := [2]string{u.Protocol, u.Wake}
		out[k] = append(out[k], *u.WakeHeldMs)
	}
	return out
}

// TestSleepAccessLogWakeFields: the access-log line and the OCSF record
// of a request for a sleeping instance say how it fared and how long it
// was held, on both protocols: not woken (an SSE request, 503 at once),
// timeout (held for hold_seconds), woken (held, then the app's answer);
// a request for an active instance has no wake field. No line carries
// a credential.
func TestSleepAccessLogWakeFields(t *testing.T) {
	const hold = 2
	alog, olog := &lineLog{}, &lineLog{}
	e := newSleepEnv(t, hold, wake.Options{}, func(c *Config) {
		c.AccessLog, c.AccessLogWriter = AccessLogJSON, alog
		c.OCSF = ocsf.NewEmitter(olog, slog.LevelDebug, ocsf.Product{})
	})
	now := time.Now()
	token, err := e.keys.Mint("k1", accesstoken.Claims{Workspace: "team", Sandbox: "demo", Service: "priv", IssuedAt: now, Expires: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	clients := map[bool]*http.Client{false: e.client(false), true: e.client(true)}
	// Not woken, and past the hold (both protocols at once: one hold).
	var wg sync.WaitGroup
	for _, h2 := range []bool{false, true} {
		c := clients[h2]
		wantSleeping(t, e.do(c, "GET", slpWeb, sse), "SSE")
		wg.Go(func() {
			r := e.do(c, "GET", slpAPI, map[string]string{"Accept": "application/json", "Sec-Fetch-Mode": "cors"})
			if r.status != 503 || !strings.Contains(r.body, `"starting"`) {
				t.Errorf("fetch past the hold: %d %q", r.status, r.body)
			}
		})
	}
	wg.Wait()
	// Woken: both held, then the platform wakes the instance.
	for _, h2 := range []bool{false, true} {
		c := clients[h2]
		wg.Go(func() {
			r := e.do(c, "GET", slpPriv, with(navigate, "X-Applistener-Token", token))
			if r.status != 200 {
				t.Errorf("held navigation: %d %q", r.status, r.body)
			}
		})
	}
	testutil.Eventually(t, 10*time.Second, "2 navigations held", func() bool { return e.coord.Held() == 2 })
	e.wakeUp()
	wg.Wait()
	for _, h2 := range []bool{false, true} {
		seen(t, e.do(clients[h2], "GET", slpWeb, navigate))
	}

	for _, proto := range []string{"h1", "h2"} {
		want := map[string]func(held float64) bool{
			"not_woken": func(held float64) bool { return held == 0 },
			"timeout":   func(held float64) bool { return held >= hold && held < hold+10 },
			"woken":     func(held float64) bool { return held > 0 && held < 30 },
		}
		for wakeName, ok := range want {
			testutil.Eventually(t, 5*time.Second, proto+" "+wakeName+" line", func() bool {
				n := 0
				for _, r := range alog.records(t, "wake", wakeName) {
					if r["protocol"] == proto {
						n++
					}
				}
				return n > 0
			})
			var recs []map[string]any
			for _, r := range alog.records(t, "wake", wakeName) {
				if r["protocol"] == proto {
					recs = append(recs, r)
				}
			}
			if len(recs) != 1 {
				t.Fatalf("%s: %d access-log lines with wake %s, want 1: %v", proto, len(recs), wakeName, recs)
			}
			held, _ := recs[0]["wake_held"].(float64)
			if !ok(held) {
				t.Errorf("%s: wake %s held %v s", proto, wakeName, recs[0]["wake_held"])
			}
			if wakeName == "woken" && (recs[0]["status"] != float64(200) || recs[0]["credential"] != "header") {
				t.Errorf("%s: woken line %v", proto, recs[0])
			}
			// The OCSF record is written beside the line, not before it.
			testutil.Eventually(t, 5*time.Second, proto+" "+wakeName+" OCSF record", func() bool {
				return len(ocsfWakeRecords(t, olog)[[2]string{proto, wakeName}]) > 0
			})
			oc := ocsfWakeRecords(t, olog)[[2]string{proto, wakeName}]
			// The same hold in whole milliseconds (a hold under one is
			// 0 there; the line above has it in seconds).
			if len(oc) != 1 || math.Abs(float64(oc[0])-held*1000) > 1 {
				t.Errorf("%s: OCSF records with wake %s: held ms %v, the line %v s", proto, wakeName, oc, held)
			}
		}
		// The request after the wake: no wake field.
		for _, r := range alog.records(t, "", nil) {
			if r["protocol"] == proto && r["status"] == float64(200) && r["service"] == "web" && r["wake"] != nil {
				t.Errorf("%s: a request for the active instance logged wake %v", proto, r["wake"])
			}
		}
	}
	if strings.Contains(alog.text(), token) || strings.Contains(olog.text(), token) {
		t.Error("a log line carries the token")
	}
}

// TestSleepHeldClientHangsUp: an HTTP/1.1 client that hangs up while its
// request is held gives up its place at once (not at the end of its 60 s
// hold), counted in applistener_wake_held_gone_total and logged as
// client_gone (499): one that sent nothing more (the socket turns
// readable at the hang-up) and one that sent body bytes nobody reads
// while it is held (polled). A held request whose client stays goes on
// to the app, its body intact, once the instance wakes.
func TestSleepHeldClientHangsUp(t *testing.T) {
	reg := prometheus.NewRegistry()
	alog := &lineLog{}
	e := newSleepEnv(t, 60, wake.Options{Registerer: reg}, func(c *Config) {
		c.AccessLog, c.AccessLogWriter = AccessLogJSON, alog
	})
	dial := func() net.Conn {
		t.Helper()
		c, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: slpAPI, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	write := func(c net.Conn, s string) {
		t.Helper()
		if _, err := io.WriteString(c, s); err != nil {
			t.Fatal(err)
		}
	}
	post := "POST / HTTP/1.1\r\nHost: " + slpAPI + "\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n"
	cases := []struct {
		name string
		then func(c net.Conn) // after the request is held, before the hang-up
	}{
		{"nothing more sent", func(net.Conn) {}},
		{"body bytes waiting", func(c net.Conn) { write(c, "hello") }},
	}
	for i, tc := range cases {
		c := dial()
		write(c, post)
		testutil.Eventually(t, 10*time.Second, tc.name+": held", func() bool { return e.coord.Held() == 1 })
		tc.then(c)
		start := time.Now()
		_ = c.Close()
		testutil.Eventually(t, 10*time.Second, tc.name+": its place given up", func() bool { return e.coord.Held() == 0 })
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%s: the held request ended %v after its client hung up; want at once, not at the end of the hold", tc.name, d)
		}
		if got := regCounter(t, reg, "applistener_wake_held_gone_total"); got != float64(i+1) {
			t.Fatalf("%s: applistener_wake_held_gone_total %v, want %d", tc.name, got, i+1)
		}
	}
	testutil.Eventually(t, 5*time.Second, "two client_gone lines", func() bool { return len(alog.records(t, "wake", "client_gone")) == 2 })
	for _, r := range alog.records(t, "wake", "client_gone") {
		if r["status"] != float64(499) || r["reason"] != "sleeping: client hung up while held" {
			t.Errorf("client_gone line %v", r)
		}
	}

	// A client that stays: its body waits in the socket while it is
	// held, then the app gets it.
	c := dial()
	write(c, post+"hello")
	testutil.Eventually(t, 10*time.Second, "held", func() bool { return e.coord.Held() == 1 })
	e.wakeUp()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the held POST got %d after the wake", resp.StatusCode)
	}
	if got := regCounter(t, reg, "applistener_wake_held_gone_total"); got != 2 {
		t.Fatalf("applistener_wake_held_gone_total %v after a released request, want 2", got)
	}
}

// regCounter reads an unlabelled counter from reg.
func regCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}
