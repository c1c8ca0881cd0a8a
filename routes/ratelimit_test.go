package routes

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
)

// rateInstance returns an Instance with limits applied as a document
// would.
func rateInstance(l Limits) *Instance {
	i := &Instance{}
	i.rates.setRates(&l)
	return i
}

// TestRequestBucket drives the request limiter with an injected clock: a
// full bucket admits the burst at once, then one request per interval;
// a refusal says when the next request is admitted.
func TestRequestBucket(t *testing.T) {
	base := time.Now()
	i := rateInstance(Limits{RequestsPerSecond: 50, RequestsBurst: 10})
	for n := range 10 {
		if ok, _ := i.AllowRequest(base); !ok {
			t.Fatalf("request %d of the burst refused", n+1)
		}
	}
	ok, retry := i.AllowRequest(base)
	if ok || retry != 20*time.Millisecond {
		t.Fatalf("request 11 at once: ok=%v retry=%v, want refused, retry 20ms", ok, retry)
	}
	if ok, retry := i.AllowRequest(base.Add(19 * time.Millisecond)); ok || retry != time.Millisecond {
		t.Fatalf("at 19ms: ok=%v retry=%v, want refused, retry 1ms", ok, retry)
	}
	if ok, _ := i.AllowRequest(base.Add(20 * time.Millisecond)); !ok {
		t.Fatal("at 20ms: refused, want admitted")
	}
	// Over one second from empty: 50 more, exactly.
	admitted := 0
	for ms := 21; ms <= 1020; ms++ {
		if ok, _ := i.AllowRequest(base.Add(time.Duration(ms) * time.Millisecond)); ok {
			admitted++
		}
	}
	if admitted != 50 {
		t.Errorf("admitted %d in the next second, want 50", admitted)
	}
	if req, _ := i.Throttled(); req != 2+(1000-50) {
		t.Errorf("throttled requests = %d, want %d", req, 2+(1000-50))
	}
	// Idle for long enough, the bucket is full again (the burst, no more).
	later := base.Add(time.Hour)
	admitted = 0
	for range 20 {
		if ok, _ := i.AllowRequest(later); ok {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("after an hour idle: %d admitted at once, want the burst of 10", admitted)
	}
}

// TestRequestBucketDefaultBurst: the burst defaults to the rate (at least
// one).
func TestRequestBucketDefaultBurst(t *testing.T) {
	for _, tt := range []struct{ rate, want int }{{1, 1}, {5, 5}, {100, 100}} {
		i := rateInstance(Limits{RequestsPerSecond: tt.rate})
		base := time.Now()
		n := 0
		for range 1000 {
			if ok, _ := i.AllowRequest(base); ok {
				n++
			}
		}
		if n != tt.want {
			t.Errorf("rate %d: burst %d, want %d", tt.rate, n, tt.want)
		}
	}
}

// TestByteBucket: bytes are never refused: within the burst they go at
// once, beyond it each relay is told to wait for its bytes at the rate.
func TestByteBucket(t *testing.T) {
	base := time.Now()
	i := rateInstance(Limits{BytesPerSecond: 256 << 10, BytesBurst: 64 << 10})
	if w := i.ThrottleBytes(64<<10, base); w != 0 {
		t.Fatalf("the burst waits %v, want 0", w)
	}
	if w := i.ThrottleBytes(32<<10, base); w != 125*time.Millisecond {
		t.Fatalf("32 KiB beyond the burst waits %v, want 125ms", w)
	}
	if w := i.ThrottleBytes(32<<10, base); w != 250*time.Millisecond {
		t.Fatalf("another 32 KiB waits %v, want 250ms", w)
	}
	// After the waits, the debt is paid; 448 KiB more at 256 KiB/s is 1.75s.
	now := base.Add(250 * time.Millisecond)
	var total time.Duration
	for range 14 {
		w := i.ThrottleBytes(32<<10, now)
		now = now.Add(w)
		total += w
	}
	if total != 1750*time.Millisecond {
		t.Errorf("448 KiB took %v of waits, want 1.75s", total)
	}
	if w := i.ThrottleBytes(0, now); w != 0 {
		t.Errorf("nothing relayed waits %v while in debt, want 0", w)
	}
	if _, pauses := i.Throttled(); pauses != 16 {
		t.Errorf("byte pauses = %d, want 16", pauses)
	}
	// The default burst: max(64 KiB, rate).
	if b := rateInstance(Limits{BytesPerSecond: 1 << 10}).rates.bytes.Load(); b.burst != 64<<10 {
		t.Errorf("default burst at 1 KiB/s = %d, want 64 KiB", b.burst)
	}
	if b := rateInstance(Limits{BytesPerSecond: 1 << 20}).rates.bytes.Load(); b.burst != 1<<20 {
		t.Errorf("default burst at 1 MiB/s = %d, want 1 MiB", b.burst)
	}
	if b := rateInstance(Limits{BytesPerSecond: MaxBytesPerSecond}).rates.bytes.Load(); b.burst != MaxBytesBurst {
		t.Errorf("default burst at the largest rate = %d, want %d", b.burst, MaxBytesBurst)
	}
}

// TestSetRatesInPlace: a document that keeps the limits keeps the
// buckets' state; a changed limit starts a full bucket; 0 removes it.
func TestSetRatesInPlace(t *testing.T) {
	base := time.Now()
	l := Limits{RequestsPerSecond: 1, RequestsBurst: 1, BytesPerSecond: 1 << 10, BytesBurst: 16 << 10}
	i := rateInstance(l)
	if ok, _ := i.AllowRequest(base); !ok {
		t.Fatal("first request refused")
	}
	i.ThrottleBytes(16<<10, base)
	i.rates.setRates(&l) // the same limits: state kept
	if ok, _ := i.AllowRequest(base); ok {
		t.Fatal("the same limits re-applied refilled the bucket")
	}
	if w := i.ThrottleBytes(1<<10, base); w != time.Second {
		t.Fatalf("byte wait after re-applying = %v, want 1s", w)
	}
	l.RequestsPerSecond, l.RequestsBurst = 100, 0
	l.BytesPerSecond = 1 << 20
	i.rates.setRates(&l)
	for n := range 100 {
		if ok, _ := i.AllowRequest(base); !ok {
			t.Fatalf("raised rate: request %d refused", n+1)
		}
	}
	if w := i.ThrottleBytes(16<<10, base); w != 0 {
		t.Fatalf("raised byte rate: wait %v, want 0", w)
	}
	i.rates.setRates(&Limits{})
	if i.LimitsRequests() || i.LimitsBytes() {
		t.Fatal("limits 0: still limited")
	}
	for range 1000 {
		if ok, _ := i.AllowRequest(base); !ok {
			t.Fatal("unlimited: refused")
		}
	}
}

// TestRateLimitAllocs: the unlimited checks and the limited allow path
// allocate nothing.
func TestRateLimitAllocs(t *testing.T) {
	now := time.Now()
	unlimited := rateInstance(Limits{})
	limited := rateInstance(Limits{RequestsPerSecond: MaxRequestsPerSecond, RequestsBurst: MaxRequestsBurst, BytesPerSecond: MaxBytesPerSecond})
	for name, f := range map[string]func(){
		"unlimited request": func() { unlimited.AllowRequest(now) },
		"unlimited bytes":   func() { unlimited.ThrottleBytes(1<<10, now) },
		"limited request":   func() { limited.AllowRequest(now) },
		"limited bytes":     func() { limited.ThrottleBytes(1<<10, now) },
	} {
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
}

// TestRateLimitConcurrent: requests racing on one bucket admit exactly
// the burst (the CAS loop loses none and admits none twice).
func TestRateLimitConcurrent(t *testing.T) {
	i := rateInstance(Limits{RequestsPerSecond: 1, RequestsBurst: 1000})
	now := time.Now()
	results := make(chan int, 8)
	for range 8 {
		go func() {
			n := 0
			for range 500 {
				if ok, _ := i.AllowRequest(now); ok {
					n++
				}
			}
			results <- n
		}()
	}
	total := 0
	for range 8 {
		total += <-results
	}
	if total != 1000 {
		t.Errorf("admitted %d of 4000 racing requests, want the burst of 1000", total)
	}
}

// TestThrottledMetric: applistener_instance_throttled_total counts 429s
// and pauses per instance, the rest under _other; an instance whose every
// request was refused still has its series.
func TestThrottledMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	table := NewTable(Options{Domain: tbDomain, Freshness: time.Hour, MaxInstanceLabels: 1, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	d, err := ParseDocument([]byte(`{"revision":"r","instances":[` +
		`{"workspace":"a","sandbox":"one","generation":"1","limits":{"requests_per_second":1,"bytes_per_second":1024},"services":[{"name":"web","port":8080,"revision":1}]},` +
		`{"workspace":"b","sandbox":"two","generation":"1","limits":{"requests_per_second":1},"services":[{"name":"web","port":8080,"revision":1}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	table.Apply(d)
	now := time.Now()
	a := table.Lookup(Hostname("a", "one", "web", tbDomain)).Instance
	b := table.Lookup(Hostname("b", "two", "web", tbDomain)).Instance
	for range 3 {
		a.AllowRequest(now) // 1 admitted, 2 refused
		b.AllowRequest(now)
	}
	a.ThrottleBytes(128<<10, now) // one pause
	want := `
# HELP applistener_instance_throttled_total Rate limiting of an instance, by reason: requests refused with 429 over limits.requests_per_second (requests), relay pauses over limits.bytes_per_second (bytes).
# TYPE applistener_instance_throttled_total counter
applistener_instance_throttled_total{reason="requests",sandbox="one",workspace="a"} 2
applistener_instance_throttled_total{reason="bytes",sandbox="one",workspace="a"} 1
applistener_instance_throttled_total{reason="requests",sandbox="_other",workspace="_other"} 2
applistener_instance_throttled_total{reason="bytes",sandbox="_other",workspace="_other"} 0
`
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want), "applistener_instance_throttled_total"); err != nil {
		t.Error(err)
	}
}

// TestRateLimitsKeepRoutes: a change of the rate limits alone keeps the
// installed routes (no revocation) and applies to later requests.
func TestRateLimitsKeepRoutes(t *testing.T) {
	table := NewTable(Options{Domain: tbDomain, Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	doc := func(limits string) *Document {
		t.Helper()
		d, err := ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"a","sandbox":"one","generation":"1","limits":` + limits + `,"services":[{"name":"web","port":8080,"revision":1}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	table.Apply(doc(`{"requests_per_second":1}`))
	host := Hostname("a", "one", "web", tbDomain)
	r := table.Lookup(host)
	now := time.Now()
	if ok, _ := r.Instance.AllowRequest(now); !ok {
		t.Fatal("first request refused")
	}
	if ok, _ := r.Instance.AllowRequest(now); ok {
		t.Fatal("second request at 1/s admitted")
	}
	res := table.Apply(doc(`{"requests_per_second":1000,"bytes_per_second":1048576}`))
	if res.Kept != 1 || res.Changed != 0 || res.Installed != 0 {
		t.Fatalf("apply = %+v, want the route kept", res)
	}
	if table.Lookup(host) != r || !r.Lease.Live() {
		t.Fatal("the route was replaced or revoked by a change of rate limits")
	}
	if ok, _ := r.Instance.AllowRequest(now); !ok {
		t.Error("raised rate: request refused")
	}
	if !r.Instance.LimitsBytes() {
		t.Error("bytes_per_second not applied in place")
	}
}
