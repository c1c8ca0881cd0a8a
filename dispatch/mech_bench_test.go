package dispatch

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/dispatch/internal/h2load"
)

// BenchmarkMechanism measures what the listener does per small request, not
// only how fast: the load client and the app run in a child process (this
// test binary again, see mechLoadEnv), so every figure of this process is
// the listener's alone. One op is one request.
//
//   - allocs/op, B/op: the listener's heap allocations per request.
//   - cpu-ns/req: the listener's CPU (user + system) per request.
//   - reads/req, writes/req: its read(2)/write(2)-family system calls per
//     request (/proc/self/io syscr, syscw), reads that found nothing
//     (EAGAIN, then a park in the netpoller) included. Ideal for HTTP/1.1
//     keep-alive with one request in flight: 2 and 2 (client, app).
//   - vcsw/req, ivcsw/req: voluntary and involuntary context switches of
//     its threads (/proc/self/task/*/status): a thread that blocks (the
//     netpoller's epoll wait, a futex) switches out voluntarily.
//   - goroutines/req: goroutines started per request
//     (/sched/goroutines-created).
//   - wakes/req: goroutine runnable→running transitions per request,
//     estimated as 8 × the samples of /sched/latencies (the runtime samples
//     every 8th transition of each goroutine): a goroutine woken by the
//     netpoller, by a channel or a lock, or newly started.
//
// Loads: h1-c1 (one keep-alive connection, one request at a time: nothing
// to batch), h1-c50 (as wrk -c50 in bench/run.sh), h2-c4m100 and h2-c50m1
// (as h2load -c4 -m100 and -c50 -m1). A/B a change of the engine with
//
//	go test -run '^$' -bench Mechanism -benchmem -count 6 ./dispatch/ | tee new.txt
//	benchstat old.txt new.txt
//
// The figures per request are far steadier than req/s on a loaded machine.
func BenchmarkMechanism(b *testing.B) {
	for _, load := range []struct {
		name         string
		proto        string
		conns, depth int
	}{
		{"h1-c1", "h1", 1, 1},
		{"h1-c50", "h1", 50, 1},
		{"h2-c4m100", "h2", 4, 100},
		{"h2-c50m1", "h2", 50, 1},
	} {
		b.Run(load.name, func(b *testing.B) { benchMechanism(b, load.proto, load.conns, load.depth) })
	}
}

// mechLoadEnv, set to 1, turns the test binary into the load process of
// BenchmarkMechanism (see mechLoadMain) before any test runs.
const mechLoadEnv = "APPLISTENER_MECH_LOAD"

func init() {
	if os.Getenv(mechLoadEnv) == "1" {
		if err := mechLoadMain(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "mechanism load:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// mechCounters are the listener process's counters that BenchmarkMechanism
// reports per request.
type mechCounters struct {
	cpu           int64 // ns
	reads, writes int64 // -1: unknown
	vcsw, ivcsw   int64 // -1: unknown
	goroutines    uint64
	schedSamples  uint64
}

func readMechCounters() mechCounters {
	c := mechCounters{cpu: processCPU()}
	c.reads, c.writes = procSyscalls()
	c.vcsw, c.ivcsw = threadContextSwitches()
	s := []rtmetrics.Sample{{Name: "/sched/goroutines-created:goroutines"}, {Name: "/sched/latencies:seconds"}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() == rtmetrics.KindUint64 {
		c.goroutines = s[0].Value.Uint64()
	}
	if s[1].Value.Kind() == rtmetrics.KindFloat64Histogram {
		for _, n := range s[1].Value.Float64Histogram().Counts {
			c.schedSamples += n
		}
	}
	return c
}

// threadContextSwitches sums the voluntary and involuntary context switches
// of the process's threads (-1, -1 without /proc).
func threadContextSwitches() (voluntary, involuntary int64) {
	dirs, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return -1, -1
	}
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join("/proc/self/task", d.Name(), "status"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			name, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				continue
			}
			switch name {
			case "voluntary_ctxt_switches":
				voluntary += n
			case "nonvoluntary_ctxt_switches":
				involuntary += n
			}
		}
	}
	return voluntary, involuntary
}

func benchMechanism(b *testing.B, proto string, conns, depth int) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	child := startMechLoad(b, exe)
	defer child.stop(b)
	port, err := strconv.Atoi(strings.TrimPrefix(child.expect(b, "app "), "app "))
	if err != nil {
		b.Fatal(err)
	}
	raw, err := json.Marshal(map[string]any{"revision": "bench", "instances": []any{map[string]any{
		"workspace": "team", "sandbox": "s0",
		"services": []any{map[string]any{"name": "web", "port": port}},
	}}})
	if err != nil {
		b.Fatal(err)
	}
	l := startBenchListener(b, benchListenerOptions{doc: raw})
	defer l.stop(b)
	caFile := filepath.Join(b.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, l.ca.CertPEM, 0o600); err != nil {
		b.Fatal(err)
	}
	child.send(b, fmt.Sprintf("dial %s %s %s %d %d %s", proto, l.addr, sharedBenchHost(0), conns, depth, caFile))
	child.expect(b, "ready")

	b.ReportAllocs()
	c0 := readMechCounters()
	b.ResetTimer()
	start := time.Now()
	child.send(b, "run "+strconv.Itoa(b.N))
	child.expect(b, "done")
	elapsed := time.Since(start)
	b.StopTimer()
	c1 := readMechCounters()

	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(c1.cpu-c0.cpu)/n, "cpu-ns/req")
	if c0.reads >= 0 && c1.reads >= 0 {
		b.ReportMetric(float64(c1.reads-c0.reads)/n, "reads/req")
		b.ReportMetric(float64(c1.writes-c0.writes)/n, "writes/req")
	}
	if c0.vcsw >= 0 && c1.vcsw >= 0 {
		b.ReportMetric(float64(c1.vcsw-c0.vcsw)/n, "vcsw/req")
		b.ReportMetric(float64(c1.ivcsw-c0.ivcsw)/n, "ivcsw/req")
	}
	b.ReportMetric(float64(c1.goroutines-c0.goroutines)/n, "goroutines/req")
	b.ReportMetric(8*float64(c1.schedSamples-c0.schedSamples)/n, "wakes/req")
}

// mechChild is the load process of one BenchmarkMechanism run: commands on
// its standard input, one line each, answers on its standard output.
type mechChild struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	read  sync.WaitGroup // the goroutine reading its output
}

func startMechLoad(b *testing.B, exe string) *mechChild {
	cmd := exec.Command(exe, "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), mechLoadEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c := &mechChild{cmd: cmd, in: in, lines: make(chan string, 4)}
	c.read.Go(func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	})
	return c
}

func (c *mechChild) send(b *testing.B, line string) {
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		b.Fatalf("load process: %v", err)
	}
}

// expect waits (up to a minute) for the next line of the load process,
// which must start with prefix.
func (c *mechChild) expect(b *testing.B, prefix string) string {
	select {
	case line, ok := <-c.lines:
		if !ok {
			b.Fatalf("load process ended before %q", prefix)
		}
		if !strings.HasPrefix(line, prefix) {
			b.Fatalf("load process: %q; want %q", line, prefix)
		}
		return line
	case <-time.After(time.Minute):
		b.Fatalf("load process: no %q within a minute", prefix)
	}
	return ""
}

// stop closes the load process's input (it then closes its connections
// and exits) and waits for it, killing it after 10 s.
func (c *mechChild) stop(b *testing.B) {
	_ = c.in.Close()
	done := make(chan error, 1)
	go func() {
		for range c.lines { // drain what is left, so the reader ends
		}
		c.read.Wait()
		done <- c.cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			b.Errorf("load process: %v", err)
		}
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		err := <-done
		b.Errorf("load process did not exit within 10 s of its input closing (killed: %v)", err)
	}
}

// mechLoad is the client side of the load process: run makes n requests
// over its connections and returns when all are answered.
type mechLoad interface {
	run(n int64) error
	close()
}

// mechLoadMain is the load process: a lean keep-alive HTTP/1.1 app (as
// sharedBenchApp) and, once told where the listener is, its clients.
// Commands: "dial h1|h2 ADDR HOST CONNS DEPTH CAFILE" (answer "ready" once
// warmed up), "run N" (answer "done"); the end of input ends it.
func mechLoadMain(in io.Reader, out io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("app listen: %w", err)
	}
	app := &sharedBenchApp{ln: ln, conns: map[net.Conn]struct{}{}}
	app.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			app.accepted.Add(1)
			app.mu.Lock()
			app.conns[c] = struct{}{}
			app.mu.Unlock()
			app.wg.Go(func() { app.serve(c) })
		}
	})
	defer app.close()
	if _, err := fmt.Fprintf(out, "app %d\n", app.port()); err != nil {
		return err
	}
	var load mechLoad
	defer func() {
		if load != nil {
			load.close()
		}
	}()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 7 && f[0] == "dial":
			conns, err1 := strconv.Atoi(f[4])
			depth, err2 := strconv.Atoi(f[5])
			if err := errors.Join(err1, err2); err != nil {
				return fmt.Errorf("dial command: %w", err)
			}
			load, err = dialMechLoad(f[1], f[2], f[3], conns, depth, f[6])
			if err != nil {
				return err
			}
			// Warm-up: app connections opened, pools filled.
			if err := load.run(int64(conns * depth * 4)); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
			if _, err := fmt.Fprintln(out, "ready"); err != nil {
				return err
			}
		case len(f) == 2 && f[0] == "run" && load != nil:
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return fmt.Errorf("run command: %w", err)
			}
			if err := load.run(n); err != nil {
				return fmt.Errorf("run %d: %w", n, err)
			}
			if _, err := fmt.Fprintln(out, "done"); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}

func dialMechLoad(proto, addr, host string, conns, depth int, caFile string) (mechLoad, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("CA: no certificate in " + caFile)
	}
	cfg := &tls.Config{ServerName: host, RootCAs: pool}
	switch proto {
	case "h1":
		if depth != 1 {
			return nil, errors.New("h1: one request in flight per connection")
		}
		ld := &mechH1Load{}
		for range conns {
			conn, err := tls.Dial("tcp", addr, cfg)
			if err != nil {
				ld.close()
				return nil, fmt.Errorf("h1 dial: %w", err)
			}
			ld.clients = append(ld.clients, &sharedBenchClient{conn: conn, br: bufio.NewReaderSize(conn, 4<<10),
				req: []byte("GET /bench HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n")})
		}
		return ld, nil
	case "h2":
		ld := &mechH2Load{depth: depth}
		for range conns {
			lc, err := h2load.Dial(addr, cfg, h2load.Request{Authority: host, Path: "/bench", UserAgent: "h2load nghttp2/1.52.0"})
			if err != nil {
				ld.close()
				return nil, err
			}
			ld.conns = append(ld.conns, lc)
		}
		return ld, nil
	}
	return nil, fmt.Errorf("unknown protocol %q", proto)
}

// mechH1Load keeps one request in flight on each HTTP/1.1 connection.
type mechH1Load struct{ clients []*sharedBenchClient }

func (ld *mechH1Load) run(n int64) error {
	var left atomic.Int64
	left.Store(n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for _, c := range ld.clients {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := c.do(); err != nil {
					mu.Lock()
					first = errors.Join(first, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

func (ld *mechH1Load) close() {
	for _, c := range ld.clients {
		_ = c.conn.Close()
	}
}

// mechH2Load keeps depth streams in flight on each HTTP/2 connection.
type mechH2Load struct {
	conns []*h2load.Conn
	depth int
}

func (ld *mechH2Load) run(n int64) error {
	var left atomic.Int64
	left.Store(n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for _, lc := range ld.conns {
		wg.Go(func() {
			if err := lc.Run(&left, ld.depth); err != nil {
				mu.Lock()
				first = errors.Join(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

func (ld *mechH2Load) close() {
	for _, lc := range ld.conns {
		_ = lc.Close()
	}
}
