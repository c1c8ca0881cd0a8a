package gateway

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// benchReplicas starts a 3-member etcd cluster and n replicas on it, for
// benchmarks (no leak checks: benchmarks run their function several
// times).
func benchReplicas(b *testing.B, n int) []*replica {
	b.Helper()
	c := startEtcd(b, 3)
	configPath, tokensPath := replicaFiles(b)
	var out []*replica
	for range n {
		r := newReplica(b, replicaOptions{etcd: c.endpoints(), configPath: configPath, tokensPath: tokensPath})
		out = append(out, r)
	}
	return out
}

// BenchmarkCrossReplicaDiscovery measures the time from an advertisement
// accepted by replica A to the discovery watch line on replica B (3-member
// etcd on loopback), and reports its median and 99th percentile.
func BenchmarkCrossReplicaDiscovery(b *testing.B) {
	rs := benchReplicas(b, 2)
	a, bb := rs[0], rs[1]
	w := bb.discoveryWatchTB(b, "team", routesTokTeam)
	var lat []time.Duration
	exp := time.Now().Add(10 * time.Minute)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		version := uint64(i + 1)
		route := webRoute(version)
		route.expires = exp
		sent := time.Now()
		if code := a.advertise("sup-1", routesTokSup1, sessionID(1), route); code != http.StatusNoContent {
			b.Fatal(code)
		}
		for {
			l, ok := <-w.lines
			if !ok {
				b.Fatal("the watch ended")
			}
			if strings.Contains(l.text, fmt.Sprintf(`"installation_version":%d,`, version)) {
				lat = append(lat, l.at.Sub(sent))
				break
			}
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkAdvertiseEtcd measures the advertisements one replica accepts
// per second against a 3-member etcd cluster: 100 supervisors (pool
// members with one route each), 16 concurrent clients, each request a
// session renewal and a store write that the replica waits to see in its
// view.
func BenchmarkAdvertiseEtcd(b *testing.B) {
	r := benchReplicas(b, 1)[0]
	const sups = 100
	for s := range sups {
		sup := fmt.Sprintf("host-%03d", s)
		sb := fmt.Sprintf("b%03d", s)
		entry := fmt.Sprintf(`{"workspace":"team","sandbox":"%s","generation":"1","services":[{"name":"web","port":8080,"revision":1}]}`, sb)
		if resp, body := r.do(http.MethodPut, "/v1/supervisors/"+sup+"/instances/team/"+sb, repTokAdmin, strings.NewReader(entry)); resp.StatusCode != http.StatusOK {
			b.Fatalf("PUT: %d %q", resp.StatusCode, body)
		}
	}
	bodies := make([][]byte, sups)
	exp := time.Now().Add(10 * time.Minute)
	for s := range sups {
		bodies[s] = advBody(sessionID(s+1000), genRoute{testRoute{ws: "team", sb: fmt.Sprintf("b%03d", s), name: "web", version: 1, expires: exp,
			host: fmt.Sprintf("10.2.0.%d", s+1)}, "1"})
	}
	// Every supervisor once before the clock starts: sessions open, ids
	// bound to the pool.
	for s := range sups {
		resp, body := r.do(http.MethodPut, fmt.Sprintf("/v1/supervisors/host-%03d/installations", s), repTokPoolA, bytes.NewReader(bodies[s]))
		if resp.StatusCode != http.StatusNoContent {
			b.Fatalf("PUT installations: %d %q", resp.StatusCode, body)
		}
	}
	var next atomic.Int64
	b.SetParallelism(8) // 16 goroutines on 2 cores
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s := int(next.Add(1)) % sups
			req, err := http.NewRequest(http.MethodPut, r.srv.URL+fmt.Sprintf("/v1/supervisors/host-%03d/installations", s), bytes.NewReader(bodies[s]))
			if err != nil {
				b.Error(err)
				return
			}
			req.Header.Set("Authorization", "Bearer "+repTokPoolA)
			resp, err := r.client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ads/s")
	if got := len(r.snapshot("team", routesTokTeam)); got != sups {
		b.Fatalf("%d routes published, want %d", got, sups)
	}
}

// discoveryWatchTB is discoveryWatch for benchmarks.
func (r *replica) discoveryWatchTB(b *testing.B, ws, token string) *routesWatch {
	b.Helper()
	req, err := http.NewRequest(http.MethodGet, r.srv.URL+"/v1/workspaces/"+ws+"/service-routes?watch=1", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := r.client.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("watch: %v %v", resp, err)
	}
	w := &routesWatch{resp: resp, lines: make(chan streamLine, 4096), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.lines)
		buf := make([]byte, 0, 1<<16)
		chunk := make([]byte, 1<<16)
		for {
			n, err := resp.Body.Read(chunk)
			buf = append(buf, chunk[:n]...)
			for {
				i := bytes.IndexByte(buf, '\n')
				if i < 0 {
					break
				}
				w.lines <- streamLine{text: string(buf[:i]), at: time.Now()}
				buf = buf[i+1:]
			}
			if err != nil {
				return
			}
		}
	}()
	b.Cleanup(w.close)
	return w
}
