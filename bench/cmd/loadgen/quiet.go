package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// runQuiet is the quiet client of the noisy-neighbour workloads: one
// keep-alive connection per host (SNI = Host = that host), each sending one
// small GET every 1/rate seconds on its own open-loop schedule, one request
// at a time (HTTP/2: one stream at a time on the one connection). The
// hosts' schedules are spread evenly over one interval.
//
// Latency is measured as in rate: from the intended send time when the
// connection was still busy with the previous request then (a stall of the
// proxy delays every request behind it, and all of that is counted: no
// coordinated omission), and from the actual send otherwise. Go's timers
// wake up to ~1 ms late here (the poller's timeout has millisecond
// granularity), as much as a proxy's whole latency at 100 req/s, so
// charging the generator's own wake-up to the proxy would hide the figure
// measured. How late the generator sent is reported apart (late_p99_ms,
// late_max_ms); p99_intended_ms is the p99 from the intended send time in
// every case.
//
// Figures: per host (in -hosts order) and over all hosts; worst_p99_ms and
// median_p99_ms are the worst and the median of the hosts' p99.
func runQuiet(args []string) error {
	fs := flag.NewFlagSet("quiet", flag.ExitOnError)
	t := targetFlags(fs)
	hostList := fs.String("hosts", "", "comma-separated hosts, one connection each (default: -host)")
	proto := fs.String("proto", "http1", "http1 or h2 (ALPN h2, one stream at a time)")
	rate := fs.Float64("rate", 100, "requests per second on each connection")
	duration := fs.Duration("duration", 10*time.Second, "measured duration")
	warmup := fs.Duration("warmup", time.Second, "unrecorded warm-up before the measurement")
	watch := watchFlag(fs)
	reqLog := fs.String("log", "", "append each measured request to this file: host, send and done times (Unix ns), status; for joining with the proxy's access log")
	_ = fs.Parse(args)
	w := newWatcher(*watch)
	if *proto != "http1" && *proto != "h2" {
		return fmt.Errorf("unknown -proto %q", *proto)
	}
	if *rate <= 0 {
		return fmt.Errorf("-rate must be positive, got %v", *rate)
	}
	hosts := []string{t.host}
	if *hostList != "" {
		hosts = strings.Split(*hostList, ",")
	}
	interval := time.Duration(float64(time.Second) / *rate)

	// Connect every client before the clock starts.
	clients := make([]quietClient, len(hosts))
	for i, h := range hosts {
		ht := *t
		ht.host = h
		if t.sni != "" {
			ht.sni = h
		}
		var err error
		if *proto == "h2" {
			clients[i], err = newQuietH2(&ht)
		} else {
			clients[i], err = newQuietH1(&ht)
		}
		if err != nil {
			for _, c := range clients[:i] {
				c.close()
			}
			return fmt.Errorf("connect %s: %w", h, err)
		}
	}

	start := time.Now().Add(50 * time.Millisecond)
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*duration)
	type result struct {
		lat, late, strict hist
		errs, non2xx      int64
		firstErr          string
		reconnects        int64
		maxAtFromWindow   time.Duration
	}
	results := make([]result, len(hosts))
	// Per-request records (-log), one slice per host, written at the end.
	type reqRecord struct {
		sent, done time.Time
		status     int
	}
	records := make([][]reqRecord, len(hosts))
	var wg sync.WaitGroup
	time.AfterFunc(time.Until(measureFrom), w.start)
	for i := range clients {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := &results[i]
			c := clients[i]
			defer func() { c.close() }()
			next := start.Add(time.Duration(i) * interval / time.Duration(len(clients)))
			for next.Before(end) {
				sent := next // busy at the intended time: charge the wait
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
					sent = time.Now()
				}
				st, err := c.get()
				if err != nil {
					r.errs++
					if r.firstErr == "" {
						r.firstErr = err.Error()
					}
					if time.Now().After(end) {
						return
					}
					// Reconnect and go on with the schedule: the requests
					// skipped meanwhile are charged to the next one.
					if err = c.reconnect(); err != nil {
						time.Sleep(10 * time.Millisecond)
					} else {
						r.reconnects++
					}
					next = next.Add(interval)
					continue
				}
				if st/100 != 2 {
					r.non2xx++
				}
				if !next.Before(measureFrom) {
					done := time.Now()
					lat := done.Sub(sent)
					if int64(lat) > r.lat.max {
						r.maxAtFromWindow = next.Sub(measureFrom)
					}
					r.lat.record(lat)
					if *reqLog != "" {
						records[i] = append(records[i], reqRecord{sent, done, st})
					}
					r.strict.record(done.Sub(next))
					if sent != next {
						r.late.record(sent.Sub(next))
					}
				}
				next = next.Add(interval)
			}
		}(i)
	}
	wg.Wait()
	if *reqLog != "" {
		var b strings.Builder
		for i, rs := range records {
			for _, r := range rs {
				fmt.Fprintf(&b, "%s\t%d\t%d\t%d\n", hosts[i], r.sent.UnixNano(), r.done.UnixNano(), r.status)
			}
		}
		if err := appendFile(*reqLog, b.String()); err != nil {
			return fmt.Errorf("-log: %w", err)
		}
	}

	out := map[string]any{}
	w.stop(out)
	var all, late, strict hist
	var errs, non2xx, reconnects int64
	firstErr := ""
	perHost := make([]map[string]any, len(hosts))
	p99s := make([]float64, len(hosts))
	for i := range results {
		r := &results[i]
		all.merge(&r.lat)
		late.merge(&r.late)
		strict.merge(&r.strict)
		errs += r.errs
		non2xx += r.non2xx
		reconnects += r.reconnects
		if firstErr == "" {
			firstErr = r.firstErr
		}
		ph := map[string]any{"host": hosts[i], "errors": r.errs, "non_2xx": r.non2xx,
			"max_at_s": round(r.maxAtFromWindow.Seconds(), 3)}
		r.lat.summary(ph)
		perHost[i] = ph
		p99s[i] = ph["p99_ms"].(float64)
	}
	worst, med := p99Spread(p99s)
	for k, v := range map[string]any{"mode": "quiet", "proto": *proto, "rate_per_conn": *rate,
		"conns": len(hosts), "errors": errs, "non_2xx": non2xx, "reconnects": reconnects,
		"per_host": perHost, "worst_p99_ms": worst, "median_p99_ms": med,
		"late_p99_ms": round(late.quantile(0.99)/1e6, 3), "late_max_ms": round(float64(late.max)/1e6, 3),
		"p99_intended_ms": round(strict.quantile(0.99)/1e6, 3)} {
		out[k] = v
	}
	if firstErr != "" {
		out["first_error"] = firstErr
	}
	all.summary(out)
	emit(out)
	return nil
}

// p99Spread is the worst and the median of the hosts' p99 figures.
func p99Spread(p99s []float64) (worst, med float64) {
	if len(p99s) == 0 {
		return 0, 0
	}
	s := append([]float64(nil), p99s...)
	sort.Float64s(s)
	n := len(s)
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return s[n-1], med
}

// quietClient sends one GET at a time on one connection.
type quietClient interface {
	get() (status int, err error)
	reconnect() error
	close()
}

// quietH1 is an HTTP/1.1 keep-alive connection (TLS when the target has an SNI).
type quietH1 struct {
	t   *target
	cfg *tls.Config
	req []byte
	c   net.Conn
	br  *bufio.Reader
}

func newQuietH1(t *target) (*quietH1, error) {
	q := &quietH1{t: t, cfg: t.tlsConfig(), req: t.request(), br: bufio.NewReaderSize(nil, 16<<10)}
	return q, q.reconnect()
}

func (q *quietH1) reconnect() error {
	q.close()
	c, err := q.t.dial(q.cfg, 5*time.Second)
	if err != nil {
		return err
	}
	q.c = c
	q.br.Reset(c)
	return nil
}

func (q *quietH1) get() (int, error) {
	if q.c == nil {
		return 0, errors.New("not connected")
	}
	_ = q.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := q.c.Write(q.req); err != nil {
		return 0, err
	}
	st, closeConn, err := readResponse(q.br)
	if err != nil {
		return 0, err
	}
	if closeConn {
		// Not expected from a keep-alive proxy; the next request reconnects.
		q.close()
		return st, errors.New("server closed the keep-alive connection")
	}
	return st, nil
}

func (q *quietH1) close() {
	if q.c != nil {
		_ = q.c.Close()
		q.c = nil
	}
}

// quietH2 is one HTTP/2 connection (TLS, ALPN h2) used one stream at a time.
type quietH2 struct {
	t   *target
	tr  *http.Transport
	cc  *http.ClientConn
	url string
}

func newQuietH2(t *target) (*quietH2, error) {
	if t.sni == "" {
		return nil, errors.New("-proto h2 needs TLS (-sni)")
	}
	q := &quietH2{t: t, url: "https://" + t.host + t.path}
	q.tr = &http.Transport{
		Protocols: new(http.Protocols),
		// Every connection is the target's own dial (its address, SNI
		// and roots), with ALPN h2 only.
		DialTLSContext: func(context.Context, string, string) (net.Conn, error) {
			cfg := q.t.tlsConfig()
			cfg.NextProtos = []string{"h2"}
			c, err := q.t.dial(cfg, 5*time.Second)
			if err != nil {
				return nil, err
			}
			if p := c.(*tls.Conn).ConnectionState().NegotiatedProtocol; p != "h2" {
				_ = c.Close()
				return nil, fmt.Errorf("negotiated %q, not h2", p)
			}
			return c, nil
		},
	}
	q.tr.Protocols.SetHTTP2(true)
	return q, q.reconnect()
}

func (q *quietH2) reconnect() error {
	q.close()
	cc, err := q.tr.NewClientConn(context.Background(), "https", net.JoinHostPort(q.t.host, "443"))
	if err != nil {
		return fmt.Errorf("h2 client connection: %w", err)
	}
	q.cc = cc
	return nil
}

func (q *quietH2) get() (int, error) {
	if q.cc == nil {
		return 0, errors.New("not connected")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, q.url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("User-Agent", "applistener-bench")
	if q.t.header != "" {
		if name, val, ok := strings.Cut(q.t.header, ":"); ok {
			req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(val))
		}
	}
	resp, err := q.cc.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, err
}

func (q *quietH2) close() {
	if q.cc != nil {
		_ = q.cc.Close()
		q.cc = nil
	}
}

// appendFile appends text to the file at path, creating it.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
