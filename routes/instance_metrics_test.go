package routes

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/applistener/applistener/internal/fairshare"
)

// TestInstanceBytesMetric: applistener_instance_bytes_total has a series
// per direction for the first MaxInstanceLabels instances with traffic (in
// key order) and sums the rest under workspace="_other"; the counters
// survive a renewal of the instance's routes.
func TestInstanceBytesMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	table := NewTable(Options{Domain: tbDomain, Freshness: time.Hour, MaxInstanceLabels: 2, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	doc := `{"revision":"r","instances":[` +
		`{"workspace":"a","sandbox":"one","generation":"1","services":[{"name":"web","port":8080,"revision":1}]},` +
		`{"workspace":"b","sandbox":"two","generation":"1","services":[{"name":"web","port":8080,"revision":1}]},` +
		`{"workspace":"c","sandbox":"three","generation":"1","services":[{"name":"web","port":8080,"revision":1}]},` +
		`{"workspace":"d","sandbox":"four","generation":"1","services":[{"name":"web","port":8080,"revision":1}]}]}`
	apply := func() {
		t.Helper()
		d, err := ParseDocument([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		table.Apply(d)
	}
	apply()
	count := func(ws, sb string, toApp, toClient int64) {
		t.Helper()
		r := table.Lookup(Hostname(ws, sb, "web", tbDomain))
		if r == nil {
			t.Fatalf("no route for %s/%s", ws, sb)
		}
		r.Instance.CountRequest()
		r.Instance.CountEnded(toApp, toClient, 0, time.Now())
	}
	count("a", "one", 10, 100)
	count("b", "two", 20, 200)
	count("c", "three", 30, 300)
	count("d", "four", 40, 400)
	count("a", "one", 1, -1) // a negative count (nothing relayed) adds nothing
	apply()                  // a renewal keeps the counters
	want := `
# HELP applistener_instance_bytes_total Body and stream bytes relayed for an instance, by direction (to_app, to_client), counted when each request or WebSocket ends.
# TYPE applistener_instance_bytes_total counter
applistener_instance_bytes_total{direction="to_app",sandbox="one",workspace="a"} 11
applistener_instance_bytes_total{direction="to_client",sandbox="one",workspace="a"} 100
applistener_instance_bytes_total{direction="to_app",sandbox="two",workspace="b"} 20
applistener_instance_bytes_total{direction="to_client",sandbox="two",workspace="b"} 200
applistener_instance_bytes_total{direction="to_app",sandbox="_other",workspace="_other"} 70
applistener_instance_bytes_total{direction="to_client",sandbox="_other",workspace="_other"} 700
`
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want), "applistener_instance_bytes_total"); err != nil {
		t.Error(err)
	}
}

// TestInstanceFairMetrics: an instance whose work queued for fair admission
// has applistener_instance_fair_waits_total and _wait_seconds_total series,
// even before any request of it was counted.
func TestInstanceFairMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	table := NewTable(Options{Domain: tbDomain, Freshness: time.Hour, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	d, err := ParseDocument([]byte(`{"revision":"r","instances":[` +
		`{"workspace":"a","sandbox":"one","generation":"1","services":[{"name":"web","port":8080,"revision":1}]},` +
		`{"workspace":"b","sandbox":"two","generation":"1","services":[{"name":"web","port":8080,"revision":1}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	table.Apply(d)
	s := fairshare.New(fairshare.Config{Slots: 1, Lease: time.Hour})
	defer s.Close()
	held, _ := s.TryAdmit()
	r := table.Lookup(Hostname("b", "two", "web", tbDomain))
	if _, err := s.Admit(&r.Instance.Fair, fairshare.KindRequest, nil, time.Millisecond); err == nil {
		t.Fatal("admitted past the only slot")
	}
	s.Release(held)
	if n := promtestutil.CollectAndCount(reg, "applistener_instance_fair_waits_total"); n != 1 {
		t.Errorf("%d fair-wait series, want 1 (the instance that waited)", n)
	}
	want := `
# HELP applistener_instance_fair_waits_total Requests, handshakes and WebSocket chunks of an instance that queued for fair admission because every slot was taken.
# TYPE applistener_instance_fair_waits_total counter
applistener_instance_fair_waits_total{sandbox="two",workspace="b"} 1
`
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want), "applistener_instance_fair_waits_total"); err != nil {
		t.Error(err)
	}
	if r.Instance.Fair.WaitTime() < time.Millisecond {
		t.Errorf("wait time %v, want at least the 1 ms timeout", r.Instance.Fair.WaitTime())
	}
}
