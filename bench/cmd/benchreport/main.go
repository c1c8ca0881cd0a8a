// Command benchreport turns the raw figures of bench/run.sh (one
// "target<TAB>metric<TAB>round<TAB>value" line each) into the markdown table
// and the JSON document under bench/results/, with every figure's median,
// spread (min, max), and ratios to nginx and to the app served directly over
// TLS. With -behind it instead lists the workloads where applistener is
// behind HAProxy (the ones run.sh profiles).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

type metric struct {
	ID       string `json:"id"`
	Workload string `json:"workload"`
	Title    string `json:"title"`
	Unit     string `json:"unit"`
	Better   string `json:"better"` // "higher" or "lower"
	// Primary marks the figures that decide "behind HAProxy".
	Primary bool `json:"-"`
}

var metrics = []metric{
	{"small_rps", "small", "small keep-alive requests, saturating (wrk -c50)", "req/s", "higher", true},
	{"small_p50_ms", "small", "  latency p50 at saturation", "ms", "lower", false},
	{"small_p99_ms", "small", "  latency p99 at saturation", "ms", "lower", false},
	{"small_cpu_us", "small", "  proxy CPU per request", "µs", "lower", true},
	{"small_cpu_pct", "small", "  proxy core busy", "%", "info", false},
	{"small_dials", "small", "  app connections opened per 1,000 requests", "dials", "lower", false},
	{"many_rps", "many", "small requests, 400 keep-alive clients (wrk -c400)", "req/s", "higher", true},
	{"many_p50_ms", "many", "  latency p50", "ms", "lower", false},
	{"many_p99_ms", "many", "  latency p99", "ms", "lower", false},
	{"many_cpu_us", "many", "  proxy CPU per request", "µs", "lower", true},
	{"many_dials", "many", "  app connections opened per 1,000 requests", "dials", "lower", false},
	{"h2_mux_rps", "h2_mux", "HTTP/2 small requests, 4 connections × 100 streams (h2load -c4 -m100)", "req/s", "higher", true},
	{"h2_mux_cpu_us", "h2_mux", "  proxy CPU per request", "µs", "lower", true},
	{"h2_mux_dials", "h2_mux", "  app connections opened per 1,000 requests", "dials", "lower", false},
	{"h2_one_rps", "h2_one", "HTTP/2 small requests, 50 connections × 1 stream (h2load -c50 -m1)", "req/s", "higher", true},
	{"h2_one_cpu_us", "h2_one", "  proxy CPU per request", "µs", "lower", true},
	{"h2_one_dials", "h2_one", "  app connections opened per 1,000 requests", "dials", "lower", false},
	{"rate_p50_ms", "rate", "small requests at a fixed 5,000 req/s: p50", "ms", "lower", false},
	{"rate_p99_ms", "rate", "  p99", "ms", "lower", true},
	{"rate_max_ms", "rate", "  max", "ms", "lower", false},
	{"rate_cpu_us", "rate", "  proxy CPU per request", "µs", "lower", true},
	{"dl64k_mibs", "dl64k", "64 KiB responses (wrk -c16)", "MiB/s", "higher", true},
	{"dl64k_cpu_us", "dl64k", "  proxy CPU per MiB", "µs", "lower", true},
	{"dl1m_mibs", "dl1m", "1 MiB responses (wrk -c16)", "MiB/s", "higher", true},
	{"dl1m_cpu_us", "dl1m", "  proxy CPU per MiB", "µs", "lower", true},
	{"hs_full_cps", "hs_full", "new TLS connections, full handshake (+1 request)", "conn/s", "higher", true},
	{"hs_full_cpu_us", "hs_full", "  proxy CPU per connection", "µs", "lower", true},
	{"hs_resumed_cps", "hs_resumed", "new TLS connections, resumed (session tickets)", "conn/s", "higher", true},
	{"hs_resumed_cpu_us", "hs_resumed", "  proxy CPU per connection", "µs", "lower", true},
	{"hs_resumed_frac", "hs_resumed", "  share actually resumed", "", "info", false},
	{"ws_echo_mps", "ws_echo", "WebSocket echo, 100 connections, 64 B messages", "msg/s", "higher", true},
	{"ws_echo_p99_ms", "ws_echo", "  round-trip p99", "ms", "lower", false},
	{"ws_echo_cpu_us", "ws_echo", "  proxy CPU per message (both directions)", "µs", "lower", true},
	{"grpc_unary_rps", "grpc_unary", "gRPC unary calls, 4 connections × 16 in flight (grpc-go client and server, 64 B each way)", "calls/s", "higher", true},
	{"grpc_unary_ratio", "grpc_unary", "  ÷ the direct rate (direct-plain: the client straight to the app's h2c port, same round; goal ≥ 0.6)", "×", "higher", false},
	{"grpc_unary_p50_ms", "grpc_unary", "  latency p50", "ms", "lower", false},
	{"grpc_unary_p99_ms", "grpc_unary", "  latency p99", "ms", "lower", false},
	{"grpc_unary_cpu_us", "grpc_unary", "  proxy CPU per call", "µs", "lower", true},
	{"grpc_unary_cpu_pct", "grpc_unary", "  proxy core busy", "%", "info", false},
	{"grpc_unary_dials", "grpc_unary", "  app connections opened per 1,000 calls", "dials", "lower", false},
	{"grpc_unary_load_pct", "grpc_unary", "  load core busy (client and app; near 100: they bound the rate)", "%", "info", false},
	{"grpc_stream_rps", "grpc_stream", "gRPC streaming, 4 connections × 16 FullDuplexCall streams, ping-pong 64 B messages", "msg/s", "higher", true},
	{"grpc_stream_ratio", "grpc_stream", "  ÷ the direct rate (direct-plain: the client straight to the app's h2c port, same round; goal ≥ 0.8)", "×", "higher", false},
	{"grpc_stream_p50_ms", "grpc_stream", "  round-trip p50", "ms", "lower", false},
	{"grpc_stream_p99_ms", "grpc_stream", "  round-trip p99", "ms", "lower", false},
	{"grpc_stream_cpu_us", "grpc_stream", "  proxy CPU per message (round trip)", "µs", "lower", true},
	{"grpc_stream_cpu_pct", "grpc_stream", "  proxy core busy", "%", "info", false},
	{"grpc_stream_dials", "grpc_stream", "  app connections opened per 1,000 messages", "dials", "lower", false},
	{"grpc_stream_load_pct", "grpc_stream", "  load core busy (client and app; near 100: they bound the rate)", "%", "info", false},
	{"idle_h1_kib", "idle_h1", "idle TLS keep-alive connection (HTTP/1.1, after one request): proxy RSS per connection", "KiB", "lower", true},
	{"idle_h1_open", "idle_h1", "  idle connections held", "conns", "info", false},
	{"idle_h1_hs_cps", "idle_h1", "  new TLS connections/s while they are held (loadgen hs)", "conn/s", "higher", false},
	{"idle_h1_hs_ratio", "idle_h1", "  new-connection rate while held ÷ rate with none held", "×", "higher", false},
	{"idle_ws_kib", "idle_ws", "idle proxied WebSocket (after one echo): proxy RSS per connection", "KiB", "lower", true},
	{"idle_ws_open", "idle_ws", "  idle WebSockets held", "conns", "info", false},
	{"idle_ws_hs_cps", "idle_ws", "  new TLS connections/s while they are held (loadgen hs)", "conn/s", "higher", false},
	{"idle_ws_hs_ratio", "idle_ws", "  new-connection rate while held ÷ rate with none held", "×", "higher", false},
	// The earlier 5,000-WebSocket row, for raw files from before idle_ws.
	{"ws_idle_kib", "ws_idle", "idle proxied WebSocket (5,000 held): proxy RSS per connection", "KiB", "lower", true},
	{"ws_idle_open", "ws_idle", "  idle WebSockets held", "conns", "info", false},
	{"reload_base_max_ms", "reload", "5,000 req/s, route table unchanged: max latency", "ms", "lower", false},
	{"reload_base_p99_ms", "reload", "  p99, table unchanged", "ms", "lower", false},
	{"reload_max_ms", "reload", "5,000 req/s while 10,000 routes are added to the table: max latency", "ms", "lower", false},
	{"reload_p99_ms", "reload", "  p99 while the table is replaced", "ms", "lower", false},
	{"reload_seen_ms", "reload", "  file renamed → new table seen in applistener_routes (file polled every 250 ms)", "ms", "info", false},
	{"manyroutes_base_rps", "manyroutes", "1,000 keep-alive clients on one route, one route installed (loadgen routes)", "req/s", "higher", false},
	{"manyroutes_one_rps", "manyroutes", "  the same, 10,000 routes installed", "req/s", "higher", false},
	{"manyroutes_one_cpu_us", "manyroutes", "  proxy CPU per request, one route", "µs", "lower", false},
	{"manyroutes_one_dials", "manyroutes", "  app connections opened per 1,000 requests, one route", "dials", "lower", false},
	{"manyroutes_rps", "manyroutes", "  the same 1,000 clients spread over 1,000 of the routes (SNI = Host rotating)", "req/s", "higher", false},
	{"manyroutes_ratio", "manyroutes", "  spread ÷ one route (target ≥ 0.95)", "", "higher", false},
	{"manyroutes_p50_ms", "manyroutes", "  latency p50, spread", "ms", "lower", false},
	{"manyroutes_p99_ms", "manyroutes", "  latency p99, spread", "ms", "lower", false},
	{"manyroutes_cpu_us", "manyroutes", "  proxy CPU per request, spread", "µs", "lower", false},
	{"manyroutes_dials", "manyroutes", "  app connections opened per 1,000 requests, spread", "dials", "lower", false},
}

func init() {
	metrics = append(metrics, noisyMetrics("noisy_h1", "HTTP/1.1", "wrk -c100")...)
	metrics = append(metrics, noisyMetrics("noisy_h2", "HTTP/2", "h2load -c4 -m25")...)
	metrics = append(metrics, noisy10Metrics("noisy10_h1", "HTTP/1.1", "wrk -c100")...)
}

// noisyMetrics are the rows of a two-instance noisy-neighbour workload w:
// quiet instance B (one keep-alive connection, 100 req/s) alone and while
// instance A is flooded through the same listener.
func noisyMetrics(w, proto, flood string) []metric {
	return []metric{
		{w + "_alone_p99_ms", w, "noisy neighbours, " + proto + ": quiet B's p99 alone (one keep-alive connection, 100 req/s)", "ms", "lower", false},
		{w + "_flood_p99_ms", w, "  B's p99 while A is flooded (" + flood + ")", "ms", "lower", false},
		{w + "_ratio", w, "  B's p99 flooded ÷ alone (bound 2, goal 1.1)", "×", "lower", false},
		{w + "_a_rps", w, "  A's req/s under the flood", "req/s", "higher", false},
		{w + "_alone_p50_ms", w, "  B's p50 alone", "ms", "lower", false},
		{w + "_flood_p50_ms", w, "  B's p50 flooded", "ms", "lower", false},
		{w + "_alone_max_ms", w, "  B's max alone", "ms", "lower", false},
		{w + "_flood_max_ms", w, "  B's max flooded", "ms", "lower", false},
		{w + "_busy_pct", w, "  proxy core busy during the flood", "%", "info", false},
		{w + "_us_per_req", w, "  proxy CPU per flood request (busy ÷ A's req/s; the quiet requests' share included)", "µs", "lower", false},
		{w + "_late_ms", w, "  quiet client's own send lateness p99 under the flood (the generator, not the proxy)", "ms", "info", false},
	}
}

// noisy10Metrics are the rows of the ten-instance workload w: A flooded,
// nine quiet instances with one client each.
func noisy10Metrics(w, proto, flood string) []metric {
	return []metric{
		{w + "_alone_worst_p99_ms", w, "noisy neighbours, 10 instances, " + proto + ": worst p99 of the 9 quiet ones, alone", "ms", "lower", false},
		{w + "_flood_worst_p99_ms", w, "  worst p99 while A is flooded (" + flood + ")", "ms", "lower", false},
		{w + "_inst_ratio", w, "  worst per-instance p99 flooded ÷ alone (bound 2, goal 1.1)", "×", "lower", false},
		{w + "_worst_ratio", w, "  worst p99 flooded ÷ worst p99 alone", "×", "lower", false},
		{w + "_alone_median_p99_ms", w, "  median p99 of the 9, alone", "ms", "lower", false},
		{w + "_flood_median_p99_ms", w, "  median p99 of the 9, flooded", "ms", "lower", false},
		{w + "_median_ratio", w, "  median p99 flooded ÷ median p99 alone", "×", "lower", false},
		{w + "_a_rps", w, "  A's req/s under the flood", "req/s", "higher", false},
		{w + "_busy_pct", w, "  proxy core busy during the flood", "%", "info", false},
		{w + "_us_per_req", w, "  proxy CPU per flood request (busy ÷ A's req/s; the quiet requests' share included)", "µs", "lower", false},
		{w + "_late_ms", w, "  quiet clients' own send lateness p99 under the flood (the generator, not the proxy)", "ms", "info", false},
	}
}

// noisyWorkloads are the noisy-neighbour workloads and the figure of each
// that the bound is on: the quiet instance's p99 flooded ÷ alone
// (for ten instances, the worst of the nine per-instance ratios).
var noisyWorkloads = []struct{ w, ratio string }{
	{"noisy_h1", "noisy_h1_ratio"},
	{"noisy_h2", "noisy_h2_ratio"},
	{"noisy10_h1", "noisy10_h1_inst_ratio"},
}

// Goals of the noisy-neighbour workloads (issue 31): the quiet instance's
// p99 under the flood at most noisyBound times its p99 alone (aim
// noisyGoal), below HAProxy's ratio, and the flooded instance's
// throughput within noisyThroughput of applistener without fair admission.
const (
	noisyBound      = 2.0
	noisyGoal       = 1.1
	noisyThroughput = 0.9
)

// mechWorkloads are the small-request HTTP/1.1 and HTTP/2 workloads and
// the gRPC ones for which run.sh measures the mechanism per request (per
// call, per streamed message: context switches, allocations, system calls
// by kind).
var mechWorkloads = []string{"small", "many", "h2_mux", "h2_one", "rate", "grpc_unary", "grpc_stream"}

// mechMetrics are the per-request mechanism rows of workload w, shown in the
// main table after its other rows. The system calls by kind
// (w_sys_KIND) are added from the raw figures by kindMetrics.
func mechMetrics(w string) []metric {
	return []metric{
		{w + "_syscalls", w, "  system calls per request (separate perf pass)", "calls", "lower", false},
		{w + "_csw_vol", w, "  voluntary context switches per request", "switches", "lower", false},
		{w + "_csw_invol", w, "  involuntary context switches per request", "switches", "lower", false},
		{w + "_allocs", w, "  Go heap allocations per request (applistener)", "allocs", "lower", false},
	}
}

// kindPrefix is the raw metric name of system calls of one kind: w_sys_KIND.
const kindPrefix = "_sys_"

func init() {
	// Insert each workload's mechanism rows after its last row.
	var out []metric
	for i, m := range metrics {
		out = append(out, m)
		last := i == len(metrics)-1 || metrics[i+1].Workload != m.Workload
		if last && contains(mechWorkloads, m.Workload) {
			out = append(out, mechMetrics(m.Workload)...)
		}
	}
	metrics = out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// kindMetrics are the metrics of the system calls by kind found in the raw
// figures, workload by workload, kinds in name order.
func kindMetrics(data map[string]map[string][]float64) []metric {
	var out []metric
	for _, w := range mechWorkloads {
		var kinds []string
		for id := range data {
			if k, ok := strings.CutPrefix(id, w+kindPrefix); ok {
				kinds = append(kinds, k)
			}
		}
		sort.Strings(kinds)
		for _, k := range kinds {
			out = append(out, metric{w + kindPrefix + k, w, "  system calls per request: " + k, "calls", "lower", false})
		}
	}
	return out
}

// workloadNames label the follow-up rows of a workload in the detailed
// table and in the JSON, where they stand alone.
var workloadNames = map[string]string{
	"small":       "small requests, saturating",
	"many":        "small requests, 400 clients",
	"h2_mux":      "HTTP/2, 4 × 100 streams",
	"h2_one":      "HTTP/2, 50 × 1 stream",
	"rate":        "small requests at 5,000 req/s",
	"dl64k":       "64 KiB responses",
	"dl1m":        "1 MiB responses",
	"hs_full":     "full TLS handshakes",
	"hs_resumed":  "resumed TLS handshakes",
	"ws_echo":     "WebSocket echo",
	"grpc_unary":  "gRPC unary calls",
	"grpc_stream": "gRPC streaming (ping-pong messages)",
	"idle_h1":     "idle TLS keep-alive connections",
	"idle_ws":     "idle WebSockets",
	"ws_idle":     "idle WebSockets (5,000)",
	"reload":      "route replacement",
	"manyroutes":  "many routes",
	"noisy_h1":    "noisy neighbours, HTTP/1.1",
	"noisy_h2":    "noisy neighbours, HTTP/2",
	"noisy10_h1":  "noisy neighbours, 10 instances",
}

// fullTitle is the title of m that stands alone.
func fullTitle(m metric) string {
	if strings.HasPrefix(m.Title, "  ") {
		return workloadNames[m.Workload] + ": " + strings.TrimSpace(m.Title)
	}
	return m.Title
}

var targetOrder = []string{"applistener", "applistener-nofair", "nginx", "haproxy", "caddy", "direct-tls", "direct-plain"}

type stat struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Rounds []float64 `json:"rounds"`
	// Ratios are this target's median divided by the reference's median.
	VsNginx     *float64 `json:"ratio_to_nginx,omitempty"`
	VsDirectTLS *float64 `json:"ratio_to_direct_tls,omitempty"`
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func main() {
	raw := flag.String("raw", "", "raw figures (target, metric, round, value; tab-separated)")
	meta := flag.String("meta", "", "machine and run description (key<TAB>value lines)")
	notes := flag.String("notes", "", "free-text notes, one per line")
	mdOut := flag.String("md", "", "markdown output")
	jsonOut := flag.String("json", "", "JSON output")
	behind := flag.Bool("behind", false, "print the workloads where applistener is behind HAProxy, one per line, and exit")
	flag.Parse()

	data := map[string]map[string][]float64{} // metric -> target -> rounds
	f, err := os.Open(*raw)
	if err != nil {
		fail(err)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) != 4 {
			continue
		}
		v, err := strconv.ParseFloat(fs[3], 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		if data[fs[1]] == nil {
			data[fs[1]] = map[string][]float64{}
		}
		data[fs[1]][fs[0]] = append(data[fs[1]][fs[0]], v)
	}
	_ = f.Close()

	kinds := kindMetrics(data)
	stats := map[string]map[string]*stat{}
	for _, m := range append(append([]metric(nil), metrics...), kinds...) {
		stats[m.ID] = map[string]*stat{}
		for t, vs := range data[m.ID] {
			s := &stat{Median: median(vs), Rounds: vs, Min: vs[0], Max: vs[0]}
			for _, v := range vs {
				s.Min, s.Max = math.Min(s.Min, v), math.Max(s.Max, v)
			}
			stats[m.ID][t] = s
		}
		for _, s := range stats[m.ID] {
			if ref := stats[m.ID]["nginx"]; ref != nil && ref.Median != 0 {
				r := s.Median / ref.Median
				s.VsNginx = &r
			}
			if ref := stats[m.ID]["direct-tls"]; ref != nil && ref.Median != 0 {
				r := s.Median / ref.Median
				s.VsDirectTLS = &r
			}
		}
	}

	if *behind {
		// One line per workload: the workload, a tab, why (every primary
		// figure where applistener's median is more than 3 % worse than
		// HAProxy's; closer than that is a tie on these machines).
		var order []string
		why := map[string][]string{}
		for _, m := range metrics {
			a, h := stats[m.ID]["applistener"], stats[m.ID]["haproxy"]
			if !m.Primary || a == nil || h == nil {
				continue
			}
			worse := (m.Better == "higher" && a.Median < h.Median*0.97) ||
				(m.Better == "lower" && a.Median > h.Median*1.03)
			if worse {
				if why[m.Workload] == nil {
					order = append(order, m.Workload)
				}
				why[m.Workload] = append(why[m.Workload], fmt.Sprintf("%s: applistener %s vs HAProxy %s %s",
					m.ID, num(a.Median), num(h.Median), m.Unit))
			}
		}
		for _, w := range order {
			fmt.Printf("%s\t%s\n", w, strings.Join(why[w], "; "))
		}
		return
	}

	metaKV := [][2]string{}
	if *meta != "" {
		if b, err := os.ReadFile(*meta); err == nil {
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if k, v, ok := strings.Cut(line, "\t"); ok {
					metaKV = append(metaKV, [2]string{k, v})
				}
			}
		}
	}
	var noteLines []string
	if *notes != "" {
		if b, err := os.ReadFile(*notes); err == nil {
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if strings.TrimSpace(l) != "" {
					noteLines = append(noteLines, l)
				}
			}
		}
	}
	var targets []string
	for _, t := range targetOrder {
		for _, m := range metrics {
			if stats[m.ID][t] != nil {
				targets = append(targets, t)
				break
			}
		}
	}

	if *jsonOut != "" {
		type jm struct {
			metric
			Results map[string]*stat `json:"results"`
		}
		doc := map[string]any{}
		mk := map[string]string{}
		for _, kv := range metaKV {
			mk[kv[0]] = kv[1]
		}
		doc["machine"] = mk
		doc["targets"] = targets
		doc["notes"] = noteLines
		var ms []jm
		for _, m := range append(append([]metric(nil), metrics...), kinds...) {
			if len(stats[m.ID]) == 0 {
				continue
			}
			m.Title = fullTitle(m)
			ms = append(ms, jm{m, stats[m.ID]})
		}
		doc["metrics"] = ms
		b, _ := json.MarshalIndent(doc, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			fail(err)
		}
	}

	var md strings.Builder
	fmt.Fprintf(&md, "# applistener side-by-side benchmark\n\n")
	for _, kv := range metaKV {
		if kv[0] == "machine" {
			fmt.Fprintf(&md, "**Machine:** %s\n\n", kv[1])
		}
	}
	for _, kv := range metaKV {
		if kv[0] != "machine" {
			fmt.Fprintf(&md, "- %s: %s\n", kv[0], kv[1])
		}
	}
	fmt.Fprintf(&md, "\nEach cell: median of the rounds. ↑ higher is better, ↓ lower is better. Ratios are applistener's median divided by the other's.\n\n")
	fmt.Fprintf(&md, "| workload | unit |")
	for _, t := range targets {
		fmt.Fprintf(&md, " %s |", t)
	}
	fmt.Fprintf(&md, " appl./nginx | appl./haproxy | appl./direct-tls |\n|---|---|")
	for range targets {
		md.WriteString("---:|")
	}
	md.WriteString("---:|---:|---:|\n")
	for _, m := range metrics {
		if len(stats[m.ID]) == 0 {
			continue
		}
		arrow := map[string]string{"higher": " ↑", "lower": " ↓"}[m.Better]
		title := m.Title
		if strings.HasPrefix(title, "  ") {
			title = "&nbsp;&nbsp;" + strings.TrimSpace(title)
		}
		fmt.Fprintf(&md, "| %s | %s%s |", title, m.Unit, arrow)
		for _, t := range targets {
			if s := stats[m.ID][t]; s != nil {
				fmt.Fprintf(&md, " %s |", num(s.Median))
			} else {
				md.WriteString(" – |")
			}
		}
		a := stats[m.ID]["applistener"]
		for _, ref := range []string{"nginx", "haproxy", "direct-tls"} {
			r := stats[m.ID][ref]
			// Dials per 1,000 requests are near zero when pooling works:
			// a ratio of two such figures says nothing.
			if a == nil || r == nil || r.Median == 0 || m.Better == "info" || strings.HasSuffix(m.ID, "_dials") {
				md.WriteString(" – |")
				continue
			}
			fmt.Fprintf(&md, " %.2f |", a.Median/r.Median)
		}
		md.WriteString("\n")
	}
	writeMechanism(&md, stats, targets, kinds)
	writeNoisy(&md, stats, targets)
	fmt.Fprintf(&md, "\n## Every figure with its spread and ratios\n\n")
	fmt.Fprintf(&md, "| figure | target | median | min | max | ÷ nginx | ÷ direct-tls |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, m := range metrics {
		for _, t := range targets {
			s := stats[m.ID][t]
			if s == nil {
				continue
			}
			unit := m.Unit
			if unit != "" {
				unit = " (" + unit + ")"
			}
			fmt.Fprintf(&md, "| %s%s | %s | %s | %s | %s | %s | %s |\n", fullTitle(m), unit, t,
				num(s.Median), num(s.Min), num(s.Max), ratio(s.VsNginx), ratio(s.VsDirectTLS))
		}
	}
	if len(noteLines) > 0 {
		fmt.Fprintf(&md, "\n## Notes\n\n")
		for _, l := range noteLines {
			fmt.Fprintf(&md, "- %s\n", l)
		}
	}
	if *mdOut != "" {
		if err := os.WriteFile(*mdOut, []byte(md.String()), 0o644); err != nil {
			fail(err)
		}
	} else {
		fmt.Print(md.String())
	}
}

// writeMechanism writes, for each small-request workload measured, the
// mechanism per request beside req/s and CPU: context switches, Go
// allocations and the system calls by kind (those made at least 0.01 times
// per request by some target), and which count differs most from HAProxy's.
func writeMechanism(md *strings.Builder, stats map[string]map[string]*stat, targets []string, kinds []metric) {
	var ws []string
	for _, w := range mechWorkloads {
		if len(stats[w+"_csw_vol"]) > 0 || len(stats[w+"_syscalls"]) > 0 {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return
	}
	fmt.Fprintf(md, "\n## Mechanism per request\n\n")
	fmt.Fprintf(md, "Per request (gRPC: per call, or per streamed message), medians of the rounds. Context switches (all threads, /proc/PID/task/*/status) and Go allocations (applistener's go_memstats_mallocs_total) over the measured run; system calls in a separate, shorter pass of the same workload, counted by `perf stat` on the syscalls:sys_enter_* tracepoints (in-kernel counters: ~0.2 µs more kernel time per call, so not during the measured run). These counts depend far less on other load on the machine than req/s does.\n")
	for _, w := range ws {
		first := ""
		for _, m := range metrics {
			if m.Workload == w {
				first = m.ID
				break
			}
		}
		rows := []string{first, w + "_cpu_us", w + "_syscalls"}
		var kindRows []string
		for _, k := range kinds {
			if k.Workload != w {
				continue
			}
			big := false
			for _, s := range stats[k.ID] {
				big = big || s.Median >= 0.01
			}
			if big {
				kindRows = append(kindRows, k.ID)
			}
		}
		// Sums by class (receive, send, readiness wait, ...), what differs
		// between proxies that call read or recvfrom for the same thing.
		var classRows []string
		for _, c := range syscallClasses {
			id := w + "_class_" + c.name
			st := map[string]*stat{}
			for _, t := range targets {
				if stats[w+"_syscalls"][t] == nil {
					continue
				}
				sum := 0.0
				for _, k := range kinds {
					if k.Workload == w && classOf(strings.TrimPrefix(k.ID, w+kindPrefix)) == c.name && stats[k.ID][t] != nil {
						sum += stats[k.ID][t].Median
					}
				}
				st[t] = &stat{Median: sum}
			}
			some := false
			for _, v := range st {
				some = some || v.Median >= 0.01
			}
			if some {
				stats[id] = st
				classRows = append(classRows, id)
			}
		}
		rows = append(rows, classRows...)
		rows = append(rows, kindRows...)
		rows = append(rows, w+"_csw_vol", w+"_csw_invol", w+"_allocs")
		fmt.Fprintf(md, "\n### %s\n\n| per request | unit |", workloadNames[w])
		for _, t := range targets {
			fmt.Fprintf(md, " %s |", t)
		}
		md.WriteString(" appl. − haproxy |\n|---|---|")
		for range targets {
			md.WriteString("---:|")
		}
		md.WriteString("---:|\n")
		byID := map[string]metric{}
		for _, m := range append(append([]metric(nil), metrics...), kinds...) {
			byID[m.ID] = m
		}
		for _, c := range syscallClasses {
			byID[w+"_class_"+c.name] = metric{w + "_class_" + c.name, w, "  " + c.title, "calls", "lower", false}
		}
		for _, id := range rows {
			m, ok := byID[id]
			if !ok || len(stats[id]) == 0 {
				continue
			}
			title := strings.TrimSpace(m.Title)
			if k, ok := strings.CutPrefix(id, w+kindPrefix); ok {
				title = "&nbsp;&nbsp;&nbsp;&nbsp;" + k
			} else if strings.HasPrefix(id, w+"_class_") {
				title = "&nbsp;&nbsp;" + title
			}
			fmt.Fprintf(md, "| %s | %s |", title, m.Unit)
			for _, t := range targets {
				if v, ok := mechValue(stats, w, id, t); ok {
					fmt.Fprintf(md, " %s |", num(v))
				} else {
					md.WriteString(" – |")
				}
			}
			a, aok := mechValue(stats, w, id, "applistener")
			h, hok := mechValue(stats, w, id, "haproxy")
			if aok && hok {
				fmt.Fprintf(md, " %s |\n", signed(a-h))
			} else {
				md.WriteString(" – |\n")
			}
		}
		// The count (a kind of system call, or of context switch) where
		// applistener differs most from HAProxy, per request. A kind one of
		// them never made counts as zero for it.
		bestID, bestD := "", 0.0
		for _, id := range append(append([]string(nil), classRows...), w+"_csw_vol", w+"_csw_invol") {
			a, aok := mechValue(stats, w, id, "applistener")
			h, hok := mechValue(stats, w, id, "haproxy")
			if !aok || !hok {
				continue
			}
			if d := a - h; math.Abs(d) > math.Abs(bestD) {
				bestID, bestD = id, d
			}
		}
		if bestID != "" {
			name := strings.TrimSpace(byID[bestID].Title)
			a, _ := mechValue(stats, w, bestID, "applistener")
			h, _ := mechValue(stats, w, bestID, "haproxy")
			fmt.Fprintf(md, "\nDiffers most from HAProxy (count per request): **%s**, %s (applistener %s, HAProxy %s).\n",
				name, signed(bestD), num(a), num(h))
		}
	}
}

// syscallClasses group the kinds of system call by what they do, so that
// proxies that use read or recvfrom, epoll_wait or epoll_pwait for the same
// thing compare.
var syscallClasses = []struct{ name, title string }{
	{"recv", "receive calls (read, readv, recvfrom, recvmsg, recvmmsg)"},
	{"send", "send calls (write, writev, sendto, sendmsg, sendmmsg, sendfile, splice)"},
	{"wait", "readiness waits (epoll_wait, epoll_pwait, epoll_pwait2, poll, ppoll, select, pselect6)"},
	{"epoll_ctl", "epoll_ctl calls"},
	{"futex", "futex calls (thread wakes and waits)"},
	{"conn", "connection calls (accept4, connect, close, shutdown, socket, setsockopt, getsockopt)"},
	{"other", "other calls"},
}

// classOf is the class of a kind of system call.
func classOf(kind string) string {
	switch kind {
	case "read", "readv", "recvfrom", "recvmsg", "recvmmsg":
		return "recv"
	case "write", "writev", "sendto", "sendmsg", "sendmmsg", "sendfile64", "sendfile", "splice":
		return "send"
	case "epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect6":
		return "wait"
	case "epoll_ctl":
		return "epoll_ctl"
	case "futex":
		return "futex"
	case "accept", "accept4", "connect", "close", "shutdown", "socket", "setsockopt", "getsockopt":
		return "conn"
	}
	return "other"
}

// mechValue is target t's median of figure id of workload w. A kind of
// system call that a target whose calls were counted never made is 0 for it.
func mechValue(stats map[string]map[string]*stat, w, id, t string) (float64, bool) {
	if s := stats[id][t]; s != nil {
		return s.Median, true
	}
	if strings.HasPrefix(id, w+kindPrefix) && stats[w+"_syscalls"][t] != nil {
		return 0, true
	}
	return 0, false
}

// signed is a difference with its sign, as num writes numbers.
func signed(d float64) string {
	if d >= 0 {
		return "+" + num(d)
	}
	return num(d)
}

func num(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1000:
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

func ratio(r *float64) string {
	if r == nil {
		return "–"
	}
	return fmt.Sprintf("%.2f", *r)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchreport:", err)
	os.Exit(1)
}

// writeNoisy writes, for each noisy-neighbour workload measured, every
// target's ratio of the quiet instance's p99 flooded to alone against the
// issue's bound and goal and against HAProxy's ratio in the same run, and
// applistener's flooded throughput against applistener-nofair's (fair
// admission off) when that ran.
func writeNoisy(md *strings.Builder, stats map[string]map[string]*stat, targets []string) {
	header := false
	for _, nw := range noisyWorkloads {
		if len(stats[nw.ratio]) == 0 {
			continue
		}
		if !header {
			fmt.Fprintf(md, "\n## Noisy neighbours\n\n")
			fmt.Fprintf(md, "Quiet instance's p99 while a neighbour behind the same listener is flooded, ÷ its p99 alone (medians of the rounds). Bound %s×, goal %s×, and below HAProxy's ratio; the flooded instance's req/s within %.0f %% of applistener without fair admission (applistener-nofair).\n", num(noisyBound), num(noisyGoal), (1-noisyThroughput)*100)
			header = true
		}
		fmt.Fprintf(md, "\n### %s\n\n| target | p99 flooded ÷ alone | ≤ %s× | ≤ %s× | below HAProxy's | A's req/s |\n|---|---:|:-:|:-:|:-:|---:|\n",
			workloadNames[nw.w], num(noisyBound), num(noisyGoal))
		h := stats[nw.ratio]["haproxy"]
		for _, t := range targets {
			s := stats[nw.ratio][t]
			if s == nil {
				continue
			}
			below := "–"
			if h != nil && t != "haproxy" {
				below = yesNo(s.Median < h.Median)
			}
			rps := "–"
			if a := stats[nw.w+"_a_rps"][t]; a != nil {
				rps = num(a.Median)
			}
			fmt.Fprintf(md, "| %s | %s | %s | %s | %s | %s |\n", t, num(s.Median),
				yesNo(s.Median <= noisyBound), yesNo(s.Median <= noisyGoal), below, rps)
		}
		a, off := stats[nw.w+"_a_rps"]["applistener"], stats[nw.w+"_a_rps"]["applistener-nofair"]
		if a != nil && off != nil && off.Median > 0 {
			r := a.Median / off.Median
			fmt.Fprintf(md, "\nA's req/s, applistener ÷ applistener-nofair: %.2f (at least %s: %s).\n", r, num(noisyThroughput), yesNo(r >= noisyThroughput))
		}
	}
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}
