package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"sync"
	"testing"

	"github.com/applistener/applistener/internal/testutil"
)

// captureStdout runs f and returns what it printed on os.Stdout.
func captureStdout(t *testing.T, f func() error) []byte {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	ferr := f()
	os.Stdout = old
	_ = w.Close()
	out := <-done
	_ = r.Close()
	if ferr != nil {
		t.Fatalf("run: %v", ferr)
	}
	return out
}

// TestQuietOneConnectionPerHost runs the quiet client against a real TLS
// server offering HTTP/1.1 and HTTP/2: every host gets its own connection
// (SNI and Host set to it), every request uses the protocol asked for, and
// the report has every scheduled request of the window, per host.
func TestQuietOneConnectionPerHost(t *testing.T) {
	testutil.VerifyNone(t)
	var mu sync.Mutex
	hosts := map[string]int{}
	protos := map[int]int{}
	sni := map[string]bool{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts[r.Host]++
		protos[r.ProtoMajor]++
		if r.TLS != nil {
			sni[r.TLS.ServerName] = true
		}
		mu.Unlock()
		_, _ = w.Write([]byte("ok"))
	}))
	var conns int
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		proto string
		major int
	}{{"http1", 1}, {"h2", 2}} {
		t.Run(tc.proto, func(t *testing.T) {
			mu.Lock()
			clear(hosts)
			clear(protos)
			clear(sni)
			conns = 0
			mu.Unlock()
			// 200 req/s per host over a 300 ms window: 60 scheduled each.
			out := captureStdout(t, func() error {
				return runQuiet([]string{"-addr", srv.Listener.Addr().String(), "-sni", "x.test",
					"-hosts", "a.test,b.test", "-proto", tc.proto, "-rate", "200",
					"-duration", "300ms", "-warmup", "50ms"})
			})
			var res struct {
				Conns   int     `json:"conns"`
				Errors  int64   `json:"errors"`
				Non2xx  int64   `json:"non_2xx"`
				Samples uint64  `json:"samples"`
				Worst   float64 `json:"worst_p99_ms"`
				Median  float64 `json:"median_p99_ms"`
				P99     float64 `json:"p99_ms"`
				PerHost []struct {
					Host    string  `json:"host"`
					Samples uint64  `json:"samples"`
					P99     float64 `json:"p99_ms"`
				} `json:"per_host"`
			}
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatalf("output %q: %v", out, err)
			}
			if res.Conns != 2 || res.Errors != 0 || res.Non2xx != 0 {
				t.Errorf("conns %d, errors %d, non-2xx %d; want 2, 0, 0", res.Conns, res.Errors, res.Non2xx)
			}
			if len(res.PerHost) != 2 || res.PerHost[0].Host != "a.test" || res.PerHost[1].Host != "b.test" {
				t.Fatalf("per_host = %+v, want a.test then b.test", res.PerHost)
			}
			for _, h := range res.PerHost {
				if h.Samples < 59 || h.Samples > 61 {
					t.Errorf("%s: %d samples, want the 60 scheduled in the window", h.Host, h.Samples)
				}
				if h.P99 <= 0 || h.P99 > res.Worst {
					t.Errorf("%s: p99 %v, worst of the hosts %v", h.Host, h.P99, res.Worst)
				}
			}
			if res.Samples != res.PerHost[0].Samples+res.PerHost[1].Samples {
				t.Errorf("samples %d, per host %+v", res.Samples, res.PerHost)
			}
			if res.Median > res.Worst {
				t.Errorf("median p99 %v above the worst %v", res.Median, res.Worst)
			}
			mu.Lock()
			defer mu.Unlock()
			if conns != 2 {
				t.Errorf("the server saw %d connections, want one per host (2)", conns)
			}
			if protos[tc.major] == 0 || len(protos) != 1 {
				t.Errorf("requests by HTTP major version: %v, want all %d", protos, tc.major)
			}
			var names []string
			for n := range sni {
				names = append(names, n)
			}
			sort.Strings(names)
			if len(names) != 2 || names[0] != "a.test" || names[1] != "b.test" {
				t.Errorf("TLS server names %v, want a.test and b.test", names)
			}
			if hosts["a.test"] < 60 || hosts["b.test"] < 60 || len(hosts) != 2 {
				t.Errorf("requests by Host: %v, want a.test and b.test only (warm-up included)", hosts)
			}
		})
	}
}

func TestP99Spread(t *testing.T) {
	for _, tc := range []struct {
		in         []float64
		worst, med float64
	}{
		{nil, 0, 0},
		{[]float64{3}, 3, 3},
		{[]float64{5, 1, 3}, 5, 3},
		{[]float64{4, 1, 2, 8}, 8, 3},
	} {
		w, m := p99Spread(tc.in)
		if w != tc.worst || m != tc.med {
			t.Errorf("p99Spread(%v) = %v, %v; want %v, %v", tc.in, w, m, tc.worst, tc.med)
		}
	}
}
