// Command loadgen is the load generator of the side-by-side proxy benchmark
// (bench/run.sh). It dials 127.0.0.1 and sets the TLS server name itself, so
// no /etc/hosts entry is needed. Every mode prints one JSON object.
//
//	loadgen rate      open-loop requests at a fixed rate over keep-alive connections
//	loadgen hs        new TLS connections per second (handshake, one request, close)
//	loadgen wsecho    WebSocket echo round trips per second
//	loadgen idle      open many idle connections (-proto http1: TLS keep-alive
//	                  after one request; -proto ws: WebSockets after one echo),
//	                  print READY, hold them until SIGTERM
//	loadgen wsidle    idle -proto ws
//	loadgen routes    saturating keep-alive requests spread over many routes (routes.go)
//	loadgen quiet     one keep-alive connection per host at a fixed rate each,
//	                  HTTP/1.1 or HTTP/2, latency from the intended send time
//	                  (the noisy-neighbour workloads' quiet client; quiet.go)
//	loadgen grpc      gRPC unary calls or streamed ping-pong messages per second
//	                  with the grpc-go client, TLS or h2c (grpc.go)
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loadgen rate|hs|wsecho|idle|wsidle|routes|quiet|grpc [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "rate":
		err = runRate(os.Args[2:])
	case "hs":
		err = runHandshakes(os.Args[2:])
	case "wsecho":
		err = runWSEcho(os.Args[2:])
	case "wsidle", "idle":
		err = runIdle(os.Args[2:], os.Args[1])
	case "routes":
		err = runRoutes(os.Args[2:])
	case "quiet":
		err = runQuiet(os.Args[2:])
	case "grpc":
		err = runGRPC(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func targetFlags(fs *flag.FlagSet) *target {
	t := &target{}
	fs.StringVar(&t.addr, "addr", "127.0.0.1:8443", "address to connect to")
	fs.StringVar(&t.sni, "sni", "team--demo--web.apps.test", "TLS server name (empty: plain HTTP)")
	fs.StringVar(&t.host, "host", "team--demo--web.apps.test", "Host header")
	fs.StringVar(&t.path, "path", "/", "request path")
	fs.StringVar(&t.header, "header", "", "an extra request header line, \"Name: value\" (e.g. a private service's cookie)")
	return t
}

func emit(out map[string]any) {
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// runRate sends requests at a fixed total rate, spread over conns keep-alive
// connections, each on its own schedule. Latency is measured from the
// intended send time when the connection was still busy with the previous
// request at that time (so server stalls are not hidden: no coordinated
// omission), and from the actual send time otherwise (so the generator's own
// timer slack is not charged to the server).
func runRate(args []string) error {
	fs := flag.NewFlagSet("rate", flag.ExitOnError)
	t := targetFlags(fs)
	rate := fs.Float64("rate", 5000, "requests per second, in total")
	conns := fs.Int("conns", 50, "keep-alive connections")
	duration := fs.Duration("duration", 8*time.Second, "measured duration")
	warmup := fs.Duration("warmup", time.Second, "unrecorded warm-up before the measurement")
	watch := watchFlag(fs)
	_ = fs.Parse(args)
	w := newWatcher(*watch)

	cfg := t.tlsConfig()
	req := t.request()
	interval := time.Duration(float64(*conns) / *rate * 1e9)
	// Connect every connection before the clock starts.
	cs := make([]net.Conn, *conns)
	for i := range cs {
		c, err := t.dial(cfg, 5*time.Second)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		cs[i] = c
	}
	start := time.Now().Add(50 * time.Millisecond)
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*duration)
	hists := make([]hist, *conns)
	var errs, non2xx, reconnects atomic.Int64
	maxAt := make([]time.Duration, *conns)
	var wg sync.WaitGroup
	time.AfterFunc(time.Until(measureFrom), w.start)
	for i := range cs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := cs[i]
			br := bufio.NewReaderSize(c, 64<<10)
			h := &hists[i]
			next := start.Add(time.Duration(i) * interval / time.Duration(*conns))
			for next.Before(end) {
				var from time.Time
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
					from = time.Now()
				} else {
					from = next // busy at the intended time: charge the wait
				}
				var err error
				for {
					if c == nil {
						if c, err = t.dial(cfg, 5*time.Second); err != nil {
							errs.Add(1)
							time.Sleep(10 * time.Millisecond)
							if time.Now().After(end) {
								return
							}
							continue
						}
						reconnects.Add(1)
						br.Reset(c)
					}
					_ = c.SetDeadline(time.Now().Add(30 * time.Second))
					if _, err = c.Write(req); err == nil {
						var st int
						var closeConn bool
						st, closeConn, err = readResponse(br)
						if err == nil {
							if st/100 != 2 {
								non2xx.Add(1)
							}
							if closeConn {
								_ = c.Close()
								c = nil
							}
							break
						}
					}
					errs.Add(1)
					_ = c.Close()
					c = nil
					if time.Now().After(end) {
						return
					}
				}
				done := time.Now()
				if !next.Before(measureFrom) {
					lat := done.Sub(from)
					if int64(lat) > h.max {
						maxAt[i] = from.Sub(measureFrom)
					}
					h.record(lat)
				}
				next = next.Add(interval)
			}
			if c != nil {
				_ = c.Close()
			}
		}(i)
	}
	wg.Wait()
	var all hist
	var at time.Duration
	out := map[string]any{}
	w.stop(out)
	for i := range hists {
		if hists[i].max > all.max {
			at = maxAt[i]
		}
		all.merge(&hists[i])
	}
	for k, v := range map[string]any{"mode": "rate", "target_rps": *rate, "conns": *conns,
		"achieved_rps": round(float64(all.n)/duration.Seconds(), 1),
		"errors":       errs.Load(), "non_2xx": non2xx.Load(), "reconnects": reconnects.Load(),
		"max_at_s": round(at.Seconds(), 3)} {
		out[k] = v
	}
	all.summary(out)
	emit(out)
	return nil
}

// runHandshakes opens connections as fast as it can from conns workers:
// TCP connect, TLS handshake, one small request, close.
func runHandshakes(args []string) error {
	fs := flag.NewFlagSet("hs", flag.ExitOnError)
	t := targetFlags(fs)
	conns := fs.Int("conns", 32, "parallel workers")
	duration := fs.Duration("duration", 5*time.Second, "measured duration")
	warmup := fs.Duration("warmup", 500*time.Millisecond, "unrecorded warm-up")
	resume := fs.Bool("resume", false, "resume sessions with tickets (one cache per worker)")
	watch := watchFlag(fs)
	_ = fs.Parse(args)
	w := newWatcher(*watch)
	req := t.request()
	start := time.Now()
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*duration)
	hists := make([]hist, *conns)
	var errs, resumed, total, non2xx atomic.Int64
	var wg sync.WaitGroup
	time.AfterFunc(time.Until(measureFrom), w.start)
	for i := 0; i < *conns; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cfg := t.tlsConfig()
			if *resume {
				cfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
			}
			br := bufio.NewReaderSize(nil, 4096)
			for {
				t0 := time.Now()
				if t0.After(end) {
					return
				}
				c, err := t.dial(cfg, 5*time.Second)
				if err != nil {
					errs.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				br.Reset(c)
				var st int
				if _, err = c.Write(req); err == nil {
					st, _, err = readResponse(br)
				}
				didResume := false
				if tc, ok := c.(*tls.Conn); ok {
					didResume = tc.ConnectionState().DidResume
				}
				_ = c.Close()
				if err != nil {
					errs.Add(1)
					continue
				}
				if t0.Before(measureFrom) {
					continue
				}
				if st/100 != 2 {
					non2xx.Add(1)
				}
				total.Add(1)
				if didResume {
					resumed.Add(1)
				}
				hists[i].record(time.Since(t0))
			}
		}(i)
	}
	wg.Wait()
	var all hist
	for i := range hists {
		all.merge(&hists[i])
	}
	n := total.Load()
	out := map[string]any{"mode": "hs", "resume": *resume, "workers": *conns,
		"conns_per_s": round(float64(n)/duration.Seconds(), 1), "errors": errs.Load(), "non_2xx": non2xx.Load()}
	w.stop(out)
	if n > 0 {
		out["resumed_fraction"] = round(float64(resumed.Load())/float64(n), 3)
	}
	all.summary(out)
	emit(out)
	return nil
}

func wsDialer(t *target) (*websocket.Dialer, string) {
	d := &websocket.Dialer{
		NetDialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var nd net.Dialer
			return nd.DialContext(ctx, "tcp", t.addr)
		},
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   4096,
		WriteBufferSize:  4096,
	}
	scheme := "ws"
	if t.sni != "" {
		scheme = "wss"
		d.TLSClientConfig = t.tlsConfig()
	}
	return d, scheme + "://" + t.host + t.path
}

// runWSEcho measures WebSocket echo round trips per second: every connection
// sends a message and waits for its echo, over and over.
func runWSEcho(args []string) error {
	fs := flag.NewFlagSet("wsecho", flag.ExitOnError)
	t := targetFlags(fs)
	conns := fs.Int("conns", 100, "WebSocket connections")
	size := fs.Int("size", 64, "message size in bytes")
	duration := fs.Duration("duration", 5*time.Second, "measured duration")
	warmup := fs.Duration("warmup", 500*time.Millisecond, "unrecorded warm-up")
	watch := watchFlag(fs)
	_ = fs.Parse(args)
	w := newWatcher(*watch)
	if t.path == "/" {
		t.path = "/ws"
	}
	d, url := wsDialer(t)
	cs := make([]*websocket.Conn, *conns)
	for i := range cs {
		c, resp, err := d.Dial(url, nil)
		if err != nil {
			return fmt.Errorf("dial %s: %w", url, err)
		}
		if resp != nil && resp.Body != nil {
			_ = resp.Body.Close()
		}
		cs[i] = c
	}
	payload := make([]byte, *size)
	for i := range payload {
		payload[i] = 'x'
	}
	start := time.Now()
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*duration)
	hists := make([]hist, *conns)
	var errs atomic.Int64
	var wg sync.WaitGroup
	time.AfterFunc(time.Until(measureFrom), w.start)
	for i, c := range cs {
		wg.Add(1)
		go func(i int, c *websocket.Conn) {
			defer wg.Done()
			defer func() { _ = c.Close() }()
			for {
				t0 := time.Now()
				if t0.After(end) {
					return
				}
				if err := c.WriteMessage(websocket.BinaryMessage, payload); err != nil {
					errs.Add(1)
					return
				}
				if _, _, err := c.ReadMessage(); err != nil {
					errs.Add(1)
					return
				}
				if !t0.Before(measureFrom) {
					hists[i].record(time.Since(t0))
				}
			}
		}(i, c)
	}
	wg.Wait()
	var all hist
	for i := range hists {
		all.merge(&hists[i])
	}
	out := map[string]any{"mode": "wsecho", "conns": *conns, "size": *size,
		"msgs_per_s": round(float64(all.n)/duration.Seconds(), 1), "errors": errs.Load()}
	w.stop(out)
	all.summary(out)
	emit(out)
	return nil
}
