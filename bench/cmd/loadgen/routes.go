package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// routeHost is the hostname of route i (0-based) from a pattern with one
// integer verb, used with i for every verb that refers to it: "%[1]d" or
// "%05[1]d" (fmt's explicit argument index) may appear more than once.
func routeHost(pattern string, i int) string {
	if !strings.Contains(pattern, "%") {
		return pattern
	}
	return fmt.Sprintf(pattern, i)
}

// runRoutes is a closed-loop, saturating load of small keep-alive HTTPS
// requests spread over many routes: conns connections, connection c bound to
// route c mod routes (SNI = Host = its hostname, since a proxy that routes by
// SNI refuses a Host of another route on the same connection), so the
// connections are spread evenly over the routes. Every connection sends its
// next request as soon as the previous response is read. With -routes 1 and
// the same -conns it is the single-route figure at the same concurrency.
func runRoutes(args []string) error {
	fs := flag.NewFlagSet("routes", flag.ExitOnError)
	t := targetFlags(fs)
	pattern := fs.String("host-pattern", "ws%05[1]d--sb%05[1]d--web.apps.test",
		"hostname of route i (fmt verbs with argument index 1, e.g. %05[1]d); SNI and Host")
	nroutes := fs.Int("routes", 1000, "routes the connections are spread over (route i = pattern with i)")
	first := fs.Int("first", 0, "index of the first route")
	conns := fs.Int("conns", 1000, "keep-alive connections (connection c uses route c mod routes)")
	duration := fs.Duration("duration", 4*time.Second, "measured duration")
	warmup := fs.Duration("warmup", time.Second, "unrecorded warm-up before the measurement")
	parallel := fs.Int("parallel", 50, "connections opened at once before the run")
	appStats := fs.String("app-stats", "", "URL of the app's counters (benchapp -stats-addr: GET /stats); "+
		"app_dials and app_requests are then reported over the measured window")
	watch := watchFlag(fs)
	_ = fs.Parse(args)
	if *nroutes < 1 || *conns < 1 {
		return fmt.Errorf("-routes and -conns must be positive")
	}
	w := newWatcher(*watch)

	// One target per connection: its route's name as SNI and Host.
	targets := make([]*target, *conns)
	for c := range targets {
		h := routeHost(*pattern, *first+c%*nroutes)
		tc := *t
		tc.sni, tc.host = h, h
		if t.sni == "" {
			tc.sni = "" // plain HTTP: Host only
		}
		targets[c] = &tc
	}
	// Connect every connection before the clock starts.
	cs := make([]net.Conn, *conns)
	var dialErr atomic.Value
	next := make(chan int)
	var dwg sync.WaitGroup
	for range max(*parallel, 1) {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			for c := range next {
				conn, err := targets[c].dial(targets[c].tlsConfig(), 10*time.Second)
				if err != nil {
					dialErr.CompareAndSwap(nil, fmt.Errorf("connect %s: %w", targets[c].sni, err))
					continue
				}
				cs[c] = conn
			}
		}()
	}
	for c := range cs {
		next <- c
	}
	close(next)
	dwg.Wait()
	if e := dialErr.Load(); e != nil {
		for _, c := range cs {
			if c != nil {
				_ = c.Close()
			}
		}
		return e.(error)
	}

	start := time.Now()
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*duration)
	hists := make([]hist, *conns)
	var errs, non2xx, reconnects atomic.Int64
	var wg sync.WaitGroup
	atStart := make(chan appCounters, 1)
	time.AfterFunc(time.Until(measureFrom), func() {
		w.start()
		atStart <- readAppStats(*appStats)
	})
	for i := range cs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			t := targets[i]
			cfg := t.tlsConfig()
			req := t.request()
			c := cs[i]
			br := bufio.NewReaderSize(c, 16<<10)
			h := &hists[i]
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				if c == nil {
					var err error
					if c, err = t.dial(cfg, 5*time.Second); err != nil {
						errs.Add(1)
						time.Sleep(10 * time.Millisecond)
						continue
					}
					reconnects.Add(1)
					br.Reset(c)
				}
				_ = c.SetDeadline(t0.Add(30 * time.Second))
				_, err := c.Write(req)
				var st int
				var closeConn bool
				if err == nil {
					st, closeConn, err = readResponse(br)
				}
				if err != nil {
					errs.Add(1)
					_ = c.Close()
					c = nil
					continue
				}
				if closeConn {
					_ = c.Close()
					c = nil
				}
				done := time.Now()
				if t0.Before(measureFrom) || done.After(end) {
					continue
				}
				if st/100 != 2 {
					non2xx.Add(1)
				}
				h.record(done.Sub(t0))
			}
			if c != nil {
				_ = c.Close()
			}
		}(i)
	}
	wg.Wait()
	out := map[string]any{}
	w.stop(out)
	if *appStats != "" {
		stats0 := <-atStart
		if s1 := readAppStats(*appStats); stats0.ok && s1.ok {
			out["app_dials"] = s1.Accepts - stats0.Accepts
			out["app_requests"] = s1.Requests - stats0.Requests
		}
	}
	var all hist
	for i := range hists {
		all.merge(&hists[i])
	}
	for k, v := range map[string]any{"mode": "routes", "routes": *nroutes, "conns": *conns,
		"first_host": routeHost(*pattern, *first), "rps": round(float64(all.n)/duration.Seconds(), 1),
		"errors": errs.Load(), "non_2xx": non2xx.Load(), "reconnects": reconnects.Load()} {
		out[k] = v
	}
	all.summary(out)
	emit(out)
	return nil
}

// appCounters are benchapp's counters (GET /stats).
type appCounters struct {
	Accepts  uint64 `json:"accepts"`
	Requests uint64 `json:"requests"`
	ok       bool
}

func readAppStats(url string) appCounters {
	var c appCounters
	if url == "" {
		return c
	}
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return c
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&c) == nil {
		c.ok = true
	}
	return c
}
