package main

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runReport runs the command on a raw file and returns its markdown and
// JSON outputs.
func runReport(t *testing.T, raw string) (md string, doc map[string]any) {
	t.Helper()
	dir := t.TempDir()
	rawPath := filepath.Join(dir, "raw.tsv")
	if err := os.WriteFile(rawPath, []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	mdPath, jsonPath := filepath.Join(dir, "out.md"), filepath.Join(dir, "out.json")
	oldArgs, oldFlags := os.Args, flag.CommandLine
	defer func() { os.Args, flag.CommandLine = oldArgs, oldFlags }()
	flag.CommandLine = flag.NewFlagSet("benchreport", flag.ContinueOnError)
	os.Args = []string{"benchreport", "-raw", rawPath, "-md", mdPath, "-json", jsonPath}
	main()
	b, err := os.ReadFile(mdPath)
	if err != nil {
		t.Fatal(err)
	}
	j, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(j, &doc); err != nil {
		t.Fatal(err)
	}
	return string(b), doc
}

func TestMechanismSection(t *testing.T) {
	raw := strings.Join([]string{
		"applistener\tsmall_rps\t1\t30000",
		"haproxy\tsmall_rps\t1\t34000",
		"applistener\tsmall_cpu_us\t1\t27",
		"haproxy\tsmall_cpu_us\t1\t25",
		"applistener\tsmall_syscalls\t1\t6.5",
		"haproxy\tsmall_syscalls\t1\t4.2",
		"applistener\tsmall_sys_read\t1\t3",
		"applistener\tsmall_sys_write\t1\t2",
		"applistener\tsmall_sys_ppoll\t1\t1.5",
		"haproxy\tsmall_sys_recvfrom\t1\t2",
		"haproxy\tsmall_sys_sendto\t1\t2",
		"haproxy\tsmall_sys_epoll_wait\t1\t0.2",
		"applistener\tsmall_csw_vol\t1\t0.3",
		"haproxy\tsmall_csw_vol\t1\t0.05",
		"applistener\tsmall_csw_invol\t1\t0",
		"haproxy\tsmall_csw_invol\t1\t0",
		"applistener\tsmall_allocs\t1\t1.5",
	}, "\n") + "\n"
	md, doc := runReport(t, raw)

	sec, ok := strings.CutPrefix(md[strings.Index(md, "## Mechanism per request"):], "## Mechanism per request")
	if !ok {
		t.Fatalf("no mechanism section in\n%s", md)
	}
	sec = sec[:strings.Index(sec, "## Every figure")]
	for _, want := range []string{
		"### small requests, saturating",
		// read and recvfrom are the same class: 3 against 2.
		"| &nbsp;&nbsp;receive calls (read, readv, recvfrom, recvmsg, recvmmsg) | calls | 3.00 | 2.00 | +1.00 |",
		// ppoll and epoll_wait: readiness waits, 1.5 against 0.2.
		"| &nbsp;&nbsp;readiness waits (epoll_wait, epoll_pwait, epoll_pwait2, poll, ppoll, select, pselect6) | calls | 1.50 | 0.200 | +1.30 |",
		// A kind a counted target never made is 0 for it.
		"| &nbsp;&nbsp;&nbsp;&nbsp;recvfrom | calls | 0.000 | 2.00 | -2.00 |",
		"| voluntary context switches per request | switches | 0.300 | 0.050 | +0.250 |",
		"| Go heap allocations per request (applistener) | allocs | 1.50 | – | – |",
		"Differs most from HAProxy (count per request): **readiness waits",
	} {
		if !strings.Contains(sec, want) {
			t.Errorf("mechanism section lacks %q:\n%s", want, sec)
		}
	}
	// The main table carries the totals beside req/s.
	if !strings.Contains(md, "| &nbsp;&nbsp;system calls per request (separate perf pass) | calls ↓ | 6.50 | 4.20 |") {
		t.Errorf("main table lacks the system calls row:\n%s", md)
	}

	ids := map[string]bool{}
	for _, m := range doc["metrics"].([]any) {
		ids[m.(map[string]any)["id"].(string)] = true
	}
	for _, id := range []string{"small_syscalls", "small_sys_read", "small_sys_recvfrom", "small_csw_vol", "small_allocs"} {
		if !ids[id] {
			t.Errorf("JSON lacks metric %s", id)
		}
	}
}

func TestNoMechanismSectionWithoutFigures(t *testing.T) {
	md, _ := runReport(t, "applistener\tsmall_rps\t1\t30000\nhaproxy\tsmall_rps\t1\t34000\n")
	if strings.Contains(md, "Mechanism per request") {
		t.Errorf("mechanism section without mechanism figures:\n%s", md)
	}
}

func TestNoisySection(t *testing.T) {
	raw := strings.Join([]string{
		"applistener\tnoisy_h1_alone_p99_ms\t1\t1.6",
		"applistener\tnoisy_h1_alone_p99_ms\t2\t1.8",
		"applistener\tnoisy_h1_flood_p99_ms\t1\t2.4",
		"applistener\tnoisy_h1_ratio\t1\t1.5",
		"applistener\tnoisy_h1_ratio\t2\t1.05",
		"applistener\tnoisy_h1_ratio\t3\t1.0",
		"applistener\tnoisy_h1_a_rps\t1\t27000",
		"applistener-nofair\tnoisy_h1_ratio\t1\t9.8",
		"applistener-nofair\tnoisy_h1_a_rps\t1\t28000",
		"haproxy\tnoisy_h1_ratio\t1\t4.3",
		"haproxy\tnoisy_h1_a_rps\t1\t30000",
		"applistener\tnoisy10_h1_inst_ratio\t1\t2.5",
		"haproxy\tnoisy10_h1_inst_ratio\t1\t2.2",
		"applistener\tnoisy10_h1_median_ratio\t1\t1.2",
	}, "\n") + "\n"
	md, doc := runReport(t, raw)

	i := strings.Index(md, "## Noisy neighbours")
	if i < 0 {
		t.Fatalf("no noisy-neighbour section in\n%s", md)
	}
	sec := md[i:]
	if j := strings.Index(sec, "## Every figure"); j >= 0 {
		sec = sec[:j]
	}
	for _, want := range []string{
		"### noisy neighbours, HTTP/1.1",
		// Median of 1.5, 1.05, 1.0: within the bound and the goal, below HAProxy's 4.3.
		"| applistener | 1.05 | yes | yes | yes | 27000 |",
		"| applistener-nofair | 9.80 | **no** | **no** | **no** | 28000 |",
		"| haproxy | 4.30 | **no** | **no** | – | 30000 |",
		// 27,000 ÷ 28,000 = 0.96: within 10 %.
		"A's req/s, applistener ÷ applistener-nofair: 0.96 (at least 0.900: yes).",
		"### noisy neighbours, 10 instances",
		// The ten-instance verdict is on the worst per-instance ratio.
		"| applistener | 2.50 | **no** | **no** | **no** | – |",
		"| haproxy | 2.20 | **no** | **no** | – | – |",
	} {
		if !strings.Contains(sec, want) {
			t.Errorf("noisy-neighbour section lacks %q:\n%s", want, sec)
		}
	}
	if strings.Contains(sec, "### noisy neighbours, HTTP/2") {
		t.Errorf("section for a workload that did not run:\n%s", sec)
	}
	// The main table has applistener-nofair as a column after applistener.
	if !strings.Contains(md, "| workload | unit | applistener | applistener-nofair | haproxy |") {
		t.Errorf("main table header lacks the applistener-nofair column:\n%s", md)
	}
	if !strings.Contains(md, "| &nbsp;&nbsp;B's p99 flooded ÷ alone (bound 2, goal 1.1) | × ↓ | 1.05 | 9.80 | 4.30 |") {
		t.Errorf("main table lacks the ratio row:\n%s", md)
	}

	ids := map[string]bool{}
	for _, m := range doc["metrics"].([]any) {
		ids[m.(map[string]any)["id"].(string)] = true
	}
	for _, id := range []string{"noisy_h1_alone_p99_ms", "noisy_h1_flood_p99_ms", "noisy_h1_ratio", "noisy_h1_a_rps", "noisy10_h1_inst_ratio", "noisy10_h1_median_ratio"} {
		if !ids[id] {
			t.Errorf("JSON lacks metric %s", id)
		}
	}
	if tg := doc["targets"].([]any); len(tg) != 3 || tg[1] != "applistener-nofair" {
		t.Errorf("JSON targets = %v, want applistener, applistener-nofair, haproxy", tg)
	}
}

func TestNoNoisySectionWithoutFigures(t *testing.T) {
	md, _ := runReport(t, "applistener\tsmall_rps\t1\t30000\nhaproxy\tsmall_rps\t1\t34000\n")
	if strings.Contains(md, "Noisy neighbours") {
		t.Errorf("noisy-neighbour section without its figures:\n%s", md)
	}
}

// TestGRPCRows: the gRPC workloads have their rows in the main table (the
// ratio to the direct rate among them, direct-plain as a column) and their
// mechanism per call in the mechanism section.
func TestGRPCRows(t *testing.T) {
	raw := strings.Join([]string{
		"applistener\tgrpc_unary_rps\t1\t9000",
		"haproxy\tgrpc_unary_rps\t1\t15000",
		"direct-plain\tgrpc_unary_rps\t1\t20000",
		"applistener\tgrpc_unary_ratio\t1\t0.45",
		"haproxy\tgrpc_unary_ratio\t1\t0.75",
		"applistener\tgrpc_unary_cpu_us\t1\t80",
		"haproxy\tgrpc_unary_cpu_us\t1\t40",
		"applistener\tgrpc_unary_syscalls\t1\t5",
		"haproxy\tgrpc_unary_syscalls\t1\t3",
		"applistener\tgrpc_unary_sys_write\t1\t2",
		"haproxy\tgrpc_unary_sys_sendto\t1\t1",
		"applistener\tgrpc_unary_csw_vol\t1\t0.5",
		"haproxy\tgrpc_unary_csw_vol\t1\t0.1",
		"applistener\tgrpc_stream_rps\t1\t30000",
		"direct-plain\tgrpc_stream_rps\t1\t40000",
		"applistener\tgrpc_stream_ratio\t1\t0.75",
	}, "\n") + "\n"
	md, doc := runReport(t, raw)
	for _, want := range []string{
		"| workload | unit | applistener | haproxy | direct-plain |",
		"| gRPC unary calls, 4 connections × 16 in flight (grpc-go client and server, 64 B each way) | calls/s ↑ | 9000 | 15000 | 20000 |",
		"| &nbsp;&nbsp;÷ the direct rate (direct-plain: the client straight to the app's h2c port, same round; goal ≥ 0.6) | × ↑ | 0.450 | 0.750 | – |",
		"| &nbsp;&nbsp;proxy CPU per call | µs ↓ | 80.0 | 40.0 | – |",
		"| &nbsp;&nbsp;÷ the direct rate (direct-plain: the client straight to the app's h2c port, same round; goal ≥ 0.8) | × ↑ | 0.750 | – | – |",
		"### gRPC unary calls",
		"| &nbsp;&nbsp;send calls (write, writev, sendto, sendmsg, sendmmsg, sendfile, splice) | calls | 2.00 | 1.00 | – | +1.00 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	ids := map[string]bool{}
	for _, m := range doc["metrics"].([]any) {
		ids[m.(map[string]any)["id"].(string)] = true
	}
	for _, id := range []string{"grpc_unary_rps", "grpc_unary_ratio", "grpc_unary_sys_write", "grpc_stream_ratio"} {
		if !ids[id] {
			t.Errorf("JSON lacks metric %s", id)
		}
	}
}
