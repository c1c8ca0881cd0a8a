package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// BenchmarkSharedListener measures small keep-alive requests per second
// through one shared listener (listener.New + dispatch.New + a route table,
// real TLS, real backends on loopback) with 2, 100 and 1,000 instances in the
// table. Every instance has its own route and backend pool (they share
// sharedBenchApps real backends). The client keeps sharedBenchConns
// connections per worker, bound to consecutive routes, and rotates its
// requests over them, so a request goes to a different route each time; the
// larger tables spread the traffic over up to 128 routes. The per-request
// cost must not depend on the number of routes.
//
// req/s is wall-clock throughput of the whole loop (client, listener and
// apps share the machine); cpu-ns/op is the CPU time this process (all
// three) spent per request, which other load on the machine disturbs less.
//
//	go test -run XXX -bench Shared ./dispatch/
func BenchmarkSharedListener(b *testing.B) {
	for _, n := range []int{2, 100, 1000} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			benchSharedListener(b, n)
		})
	}
}

const (
	sharedBenchDomain      = "bench.test"
	sharedBenchApps        = 4 // real backends
	sharedBenchParallelism = 8 // workers per GOMAXPROCS
	sharedBenchConns       = 8 // client connections per worker
	sharedBenchBody        = "ok"
	sharedBenchTimeout     = 10 * time.Second
)

// sharedBenchHost is the hostname of instance i.
func sharedBenchHost(i int) string {
	return "team--s" + strconv.Itoa(i) + "--web." + sharedBenchDomain
}

// sharedBenchApp is a lean keep-alive HTTP/1.1 app on loopback: it reads
// request heads (no bodies) and answers each with a fixed 200.
type sharedBenchApp struct {
	ln       net.Listener
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	accepted atomic.Int64 // connections accepted: the listener's dials
}

var sharedBenchResponse = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
	strconv.Itoa(len(sharedBenchBody)) + "\r\n\r\n" + sharedBenchBody)

func newSharedBenchApp(b *testing.B) *sharedBenchApp {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	a := &sharedBenchApp{ln: ln, conns: map[net.Conn]struct{}{}}
	a.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.accepted.Add(1)
			a.mu.Lock()
			a.conns[c] = struct{}{}
			a.mu.Unlock()
			a.wg.Go(func() { a.serve(c) })
		}
	})
	return a
}

func (a *sharedBenchApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *sharedBenchApp) serve(c net.Conn) {
	defer func() {
		a.mu.Lock()
		delete(a.conns, c)
		a.mu.Unlock()
		_ = c.Close()
	}()
	br := bufio.NewReaderSize(c, 8<<10)
	for {
		// One request head: lines up to an empty one.
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
		}
		if _, err := c.Write(sharedBenchResponse); err != nil {
			return
		}
	}
}

func (a *sharedBenchApp) close() {
	_ = a.ln.Close()
	a.mu.Lock()
	for c := range a.conns {
		_ = c.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
}

// sharedBenchClient is one keep-alive client connection bound to a route.
type sharedBenchClient struct {
	conn *tls.Conn
	br   *bufio.Reader
	req  []byte
}

// do sends one GET and reads the whole response.
func (c *sharedBenchClient) do() error {
	if _, err := c.conn.Write(c.req); err != nil {
		return err
	}
	status, err := c.br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(status, []byte("HTTP/1.1 200 ")) {
		return fmt.Errorf("status line %q", status)
	}
	length := -1
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			length, err = strconv.Atoi(string(bytes.TrimSpace(v)))
			if err != nil {
				return fmt.Errorf("Content-Length %q", v)
			}
		}
	}
	if length != len(sharedBenchBody) {
		return fmt.Errorf("Content-Length %d; want %d", length, len(sharedBenchBody))
	}
	_, err = c.br.Discard(length)
	return err
}

func benchSharedListener(b *testing.B, instances int) {
	apps := make([]*sharedBenchApp, sharedBenchApps)
	for i := range apps {
		apps[i] = newSharedBenchApp(b)
	}
	defer func() {
		for _, a := range apps {
			a.close()
		}
	}()

	// The route table: one instance per sandbox, each with its own route.
	raw := sharedBenchDoc(b, instances, func(i int) int { return apps[i%len(apps)].port() })
	l := startBenchListener(b, benchListenerOptions{doc: raw, protos: []string{"http/1.1"}})
	if l.installed != instances {
		l.stop(b)
		b.Fatalf("installed %d routes; want %d", l.installed, instances)
	}

	// The client connections, dialled before the timer starts: worker w
	// holds connections to routes w*C .. w*C+C-1 (mod the route count).
	workers := runtime.GOMAXPROCS(0) * sharedBenchParallelism
	sets := make(chan []*sharedBenchClient, workers)
	var all []*sharedBenchClient
	defer func() {
		for _, c := range all {
			_ = c.conn.Close()
		}
		l.stop(b)
	}()
	touched := map[int]bool{}
	for w := range workers {
		set := make([]*sharedBenchClient, sharedBenchConns)
		for j := range set {
			idx := (w*sharedBenchConns + j) % instances
			touched[idx] = true
			host := sharedBenchHost(idx)
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: sharedBenchTimeout}, "tcp", l.addr,
				&tls.Config{ServerName: host, RootCAs: l.ca.Pool(), NextProtos: []string{"http/1.1"}})
			if err != nil {
				b.Fatalf("dial %s: %v", host, err)
			}
			c := &sharedBenchClient{conn: conn, br: bufio.NewReaderSize(conn, 4<<10),
				req: []byte("GET /bench HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n")}
			all = append(all, c)
			set[j] = c
			// Warm up: the route's backend pool and the app connection.
			if err := c.do(); err != nil {
				b.Fatalf("warm-up request to %s: %v", host, err)
			}
		}
		sets <- set
	}

	b.ReportAllocs()
	b.SetParallelism(sharedBenchParallelism)
	cpu0 := time.Duration(processCPU())
	b.ResetTimer()
	cpu := runSharedBenchClients(b, sets, cpu0)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(len(touched)), "routes_used")
}

// benchListener is what every listener benchmark runs against: a real TLS
// listener with a wildcard certificate for sharedBenchDomain, serving a
// Server over a route table built from one configuration document.
type benchListener struct {
	ca        *tlsconf.Authority
	addr      string // the listener's address
	srv       *Server
	table     *routes.Table
	installed int // routes the document installed
	lis       *listener.Listener
	served    chan error
}

// benchListenerOptions configure startBenchListener.
type benchListenerOptions struct {
	doc    []byte        // the configuration document
	config Config        // the Server's (Logger defaults to a discarding one)
	protos []string      // ALPN protocols offered (default h2 and http/1.1)
	setup  func(*Server) // called before the listener serves, if set
}

// startBenchListener starts a benchListener; stop ends it. A document with
// a rejected instance fails the benchmark.
func startBenchListener(b *testing.B, o benchListenerOptions) *benchListener {
	b.Helper()
	discard := slog.New(slog.DiscardHandler)
	ca, err := tlsconf.NewAuthority("bench CA")
	if err != nil {
		b.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue([]string{"*." + sharedBenchDomain}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		b.Fatal(err)
	}
	doc, err := routes.ParseDocument(o.doc)
	if err != nil {
		b.Fatal(err)
	}
	if len(doc.Rejected) > 0 {
		b.Fatalf("rejected instances: %+v", doc.Rejected[0])
	}
	table := routes.NewTable(routes.Options{Domain: sharedBenchDomain, Freshness: time.Hour, Logger: discard})
	res := table.Apply(doc)
	if o.config.Logger == nil {
		o.config.Logger = discard
	}
	srv := New(o.config)
	if o.setup != nil {
		o.setup(srv)
	}
	protos := o.protos
	if len(protos) == 0 {
		protos = []string{"h2", "http/1.1"}
	}
	tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		table.Close()
		b.Fatal(err)
	}
	l := &benchListener{ca: ca, addr: tcpLn.Addr().String(), srv: srv, table: table, installed: res.Installed,
		served: make(chan error, 1)}
	l.lis = listener.New(tcpLn, listener.Config{
		TLS:     &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: protos},
		Routes:  table,
		Handler: srv,
		Logger:  discard,
	})
	go func() { l.served <- l.lis.Serve() }()
	return l
}

// stop shuts the listener down, waits for it and closes the route table.
func (l *benchListener) stop(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.lis.Shutdown(ctx); err != nil {
		b.Errorf("shutdown: %v", err)
	}
	if err := <-l.served; err != nil {
		b.Errorf("serve: %v", err)
	}
	l.table.Close()
}

// runSharedBenchClients runs b's parallel loop, each worker taking one
// prepared connection set from sets and sending requests round-robin over
// it, stops the timer and fails b on the first failed request; it returns
// the process CPU time used since cpu0.
func runSharedBenchClients(b *testing.B, sets chan []*sharedBenchClient, cpu0 time.Duration) time.Duration {
	b.Helper()
	var failMu sync.Mutex
	var failure error
	b.RunParallel(func(pb *testing.PB) {
		var set []*sharedBenchClient
		select {
		case set = <-sets:
		default:
			failMu.Lock()
			failure = errors.New("more workers than prepared connection sets")
			failMu.Unlock()
			for pb.Next() {
			}
			return
		}
		i := 0
		for pb.Next() {
			c := set[i%len(set)]
			i++
			_ = c.conn.SetDeadline(time.Now().Add(sharedBenchTimeout))
			if err := c.do(); err != nil {
				failMu.Lock()
				if failure == nil {
					failure = err
				}
				failMu.Unlock()
				for pb.Next() {
				}
				return
			}
		}
	})
	b.StopTimer()
	cpu := time.Duration(processCPU()) - cpu0
	if failure != nil {
		b.Fatalf("request failed: %v", failure)
	}
	return cpu
}

// sharedBenchDoc is a routes document of n instances team/s0 .. team/s<n-1>,
// each with one service "web" on port(i) of 127.0.0.1.
func sharedBenchDoc(b *testing.B, n int, port func(i int) int) []byte {
	b.Helper()
	type svc struct {
		Name     string `json:"name"`
		Port     int    `json:"port"`
		Revision int    `json:"revision"`
	}
	type inst struct {
		Workspace  string            `json:"workspace"`
		Sandbox    string            `json:"sandbox"`
		Generation string            `json:"generation"`
		Connector  map[string]string `json:"connector"`
		Services   []svc             `json:"services"`
	}
	list := make([]inst, n)
	for i := range list {
		list[i] = inst{
			Workspace: "team", Sandbox: "s" + strconv.Itoa(i), Generation: "1",
			Connector: map[string]string{"type": "tcp", "host": "127.0.0.1"},
			Services:  []svc{{Name: "web", Port: port(i), Revision: 1}},
		}
	}
	raw, err := json.Marshal(map[string]any{"revision": "bench", "instances": list})
	if err != nil {
		b.Fatal(err)
	}
	return raw
}
