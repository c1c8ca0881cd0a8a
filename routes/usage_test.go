package routes

import (
	"log/slog"
	"testing"
	"time"
)

// TestUsage: the usage counters survive renewals, a withdrawn instance is
// reported (installed=false, withdrawn_at) for UsageRetention with what
// ended after its withdrawal, a re-install within the retention continues
// its counters, and after the retention it is gone.
func TestUsage(t *testing.T) {
	clock := newFakeClock()
	const retention = 10 * time.Minute
	table := NewTable(Options{Domain: tbDomain, Freshness: time.Hour, Clock: clock, UsageRetention: retention, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	const a = `{"workspace":"a","sandbox":"one","generation":"1","services":[{"name":"web","port":8080,"revision":1}]}`
	const b = `{"workspace":"b","sandbox":"two","generation":"1","services":[{"name":"web","port":8080,"revision":1}]}`
	apply := func(instances string) {
		t.Helper()
		d, err := ParseDocument([]byte(`{"revision":"r","instances":[` + instances + `]}`))
		if err != nil {
			t.Fatal(err)
		}
		table.Apply(d)
	}
	usage := func(ws string) (InstanceUsage, bool) {
		for _, u := range table.Usage() {
			if u.Workspace == ws {
				return u, true
			}
		}
		return InstanceUsage{}, false
	}
	apply(a + "," + b)
	inst := table.Lookup(Hostname("a", "one", "web", tbDomain)).Instance
	if u, _ := usage("a"); u.LastActivity != nil || u.Requests != 0 || !u.Installed {
		t.Errorf("before traffic: %+v", u)
	}
	inst.CountRequest()
	inst.CountEnded(100, 1000, 2*time.Second, clock.Now())
	apply(a + "," + b) // a renewal
	u, _ := usage("a")
	if u.BytesIn != 100 || u.BytesOut != 1000 || u.Requests != 1 || u.WebSocketSeconds != 2 ||
		u.LastActivity == nil || !u.LastActivity.Equal(fakeEpoch) || !u.Installed || u.WithdrawnAt != nil {
		t.Errorf("after a renewal: %+v", u)
	}
	if list := table.Usage(); len(list) != 2 || list[0].Workspace != "a" || list[1].Workspace != "b" {
		t.Errorf("usage list %+v; want a, b in key order", list)
	}

	clock.Advance(time.Minute)
	apply(b)                                           // a withdrawn
	inst.CountEnded(50, 500, time.Second, clock.Now()) // a WebSocket that ends after the withdrawal
	u, ok := usage("a")
	if !ok || u.Installed || u.WithdrawnAt == nil || !u.WithdrawnAt.Equal(fakeEpoch.Add(time.Minute)) ||
		u.BytesIn != 150 || u.BytesOut != 1500 || u.WebSocketSeconds != 3 {
		t.Errorf("withdrawn: %+v (listed %v)", u, ok)
	}

	apply(a + "," + b) // back within the retention: counters continue
	if u, _ := usage("a"); !u.Installed || u.BytesIn != 150 || u.Requests != 1 {
		t.Errorf("re-installed: %+v", u)
	}
	apply(b)
	clock.Advance(retention - time.Second)
	if _, ok := usage("a"); !ok {
		t.Error("withdrawn instance gone before the retention")
	}
	clock.Advance(time.Second)
	if u, ok := usage("a"); ok {
		t.Errorf("withdrawn instance still reported after the retention: %+v", u)
	}
	apply(a + "," + b)
	if u, _ := usage("a"); u.BytesIn != 0 || u.Requests != 0 {
		t.Errorf("installed after the retention: %+v; want new counters", u)
	}
}

// TestUsageOpenWebSockets: a WebSocket's seconds grow in the usage while
// it is open, it counts in websockets_open and active_streams, and once it
// ends its lifetime is counted exactly once.
func TestUsageOpenWebSockets(t *testing.T) {
	clock := newFakeClock()
	table := NewTable(Options{Domain: tbDomain, Freshness: time.Hour, Clock: clock, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	d, err := ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"a","sandbox":"one","generation":"1","services":[{"name":"web","port":8080,"revision":1}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	table.Apply(d)
	inst := table.Lookup(Hostname("a", "one", "web", tbDomain)).Instance
	usage := func() InstanceUsage {
		t.Helper()
		list := table.Usage()
		if len(list) != 1 {
			t.Fatalf("usage %+v; want one instance", list)
		}
		return list[0]
	}
	start := clock.Now()
	if !inst.Acquire() {
		t.Fatal("no stream slot")
	}
	inst.WebSocketOpened(start)
	clock.Advance(90 * time.Second)
	if u := usage(); u.WebSocketSeconds != 90 || u.WebSocketsOpen != 1 || u.ActiveStreams != 1 || u.LastActivity != nil {
		t.Errorf("a WebSocket open for 90 s: %+v; want 90 websocket_seconds, 1 open, 1 active, no last activity", u)
	}
	second := clock.Now()
	inst.WebSocketOpened(second)
	clock.Advance(10 * time.Second)
	if u := usage(); u.WebSocketSeconds != 110 || u.WebSocketsOpen != 2 {
		t.Errorf("two open (100 s and 10 s): %+v; want 110 websocket_seconds, 2 open", u)
	}
	end := clock.Now()
	inst.WebSocketClosed(start)
	inst.CountEnded(0, 0, end.Sub(start), end)
	inst.Release()
	inst.WebSocketClosed(second)
	inst.CountEnded(0, 0, end.Sub(second), end)
	clock.Advance(time.Hour)
	if u := usage(); u.WebSocketSeconds != 110 || u.WebSocketsOpen != 0 || u.ActiveStreams != 0 {
		t.Errorf("both ended an hour ago: %+v; want 110 websocket_seconds, none open", u)
	}
}
