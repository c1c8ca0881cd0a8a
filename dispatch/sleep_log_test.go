package dispatch

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

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
			oc := ocsfWakeRecords(t, olog)[[2]string{proto, wakeName}]
			if len(oc) != 1 || !ok(float64(oc[0])/1000) {
				t.Errorf("%s: OCSF records with wake %s: held ms %v", proto, wakeName, oc)
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
