#!/usr/bin/env bash
# bench/run.sh — applistener side by side with nginx, HAProxy and Caddy doing
# the same job on this machine: TLS termination on a loopback port, routing by
# SNI/Host (team--demo--web.apps.test) to one backend app over HTTP/1.1
# keep-alive, WebSocket upgrades; HTTP/2 from clients (h2load) for the
# proxies that terminate it. The app served directly (TLS and plain) is the
# bound no proxy can beat. `make bench-compare` runs it; bench/README.md
# explains every choice. Results: bench/results/latest.{md,json}.
#
# Environment:
#   BENCH_QUICK=1         one round, short durations (~7 minutes)
#   BENCH_ROUNDS=N        rounds (default 3; median reported, min/max as spread)
#   BENCH_TARGETS="..."   subset of: applistener applistener-nofair nginx haproxy caddy
#                         direct-tls direct-plain (applistener-nofair: serve with
#                         --fair-slots -1: the noisy-neighbour workloads and the saturating small, many, h2_mux and h2_one, the A/B pair of fair admission; by
#                         default it runs when the binary knows that flag)
#   BENCH_PROFILE=0|1     profile applistener where it is behind HAProxy (default 1; 0 in quick mode)
#   BENCH_SCHED=rr|nice|none  scheduling of the benchmark's processes (default rr:
#                         SCHED_RR priority BENCH_RT_PRIO=10; nice: nice -n BENCH_NICE=-10)
#   BENCH_PORT_BASE=N     first loopback port used (default 18400)
#   BENCH_KEEP=1          keep the temporary directory (configs, logs)
#   BENCH_RESULTS=DIR     write the results there instead of bench/results
#   BENCH_CADDY=PATH      a caddy $CADDY_VERSION binary to use instead of building one
#   BENCH_WORKLOADS="..." run only these workloads (names as in workloads_for, plus
#                         reload), e.g. "h2_mux h2_one" or "noisy_h1 noisy_h2
#                         noisy10_h1"; default: all
#   BENCH_NOISY_DUR=N     seconds each phase of a noisy-neighbour workload measures
#                         (default 10; quick: 5)
#   BENCH_NOISY_SPIN=0|1  keep the proxy's core from idling during the noisy-
#                         neighbour workloads (default 1; see spin_start)
#   BENCH_APPLISTENER_ARGS="..."  extra flags for applistener serve (A/B runs), e.g.
#                         "--access-log-total-rate=-1"
#   BENCH_IDLE_CONNS=N    idle connections held by idle_h1 / idle_ws (default
#                         100000; quick: 10000)
#   BENCH_MECH=0|1        per-request mechanism figures for the small-request
#                         HTTP/1.1 and HTTP/2 rows (default 1): context switches
#                         and allocations over the measured run, system calls by
#                         kind in a separate pass counted by perf (see mech_*)
#   BENCH_SYSCALL_DUR=N   seconds of that system-call pass (default 2)
#   (gRPC: grpc_unary and grpc_stream run against applistener, nginx, HAProxy
#   and direct-plain, the app's own h2c port; see wl_grpc)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=$ROOT/bench
RESULTS=${BENCH_RESULTS:-$BENCH/results}
cd "$ROOT"

QUICK=${BENCH_QUICK:-0}
if [[ $QUICK == 1 ]]; then
	ROUNDS=${BENCH_ROUNDS:-1}
	DUR=2          # seconds of the saturating small-request run
	SHORT_DUR=2    # seconds of the download, handshake and WebSocket-echo runs
	RATE_DUR=3     # seconds of the fixed-rate run (and of the route-replacement run)
	IDLE_N=${BENCH_IDLE_CONNS:-10000}   # idle connections held (idle_h1, idle_ws)
	NOISY_DUR=${BENCH_NOISY_DUR:-5}     # seconds of each phase of the noisy-neighbour workloads
	PROFILE=${BENCH_PROFILE:-0}
else
	ROUNDS=${BENCH_ROUNDS:-3}
	DUR=4
	SHORT_DUR=3
	RATE_DUR=5
	IDLE_N=${BENCH_IDLE_CONNS:-100000}
	NOISY_DUR=${BENCH_NOISY_DUR:-10}
	PROFILE=${BENCH_PROFILE:-1}
fi
TARGETS=${BENCH_TARGETS:-"applistener nginx haproxy caddy direct-tls direct-plain"}
# Scheduling of every benchmark process (proxy, backend, load generator):
# rr = SCHED_RR real-time priority (default as root): on a small VM shared
# with other work, wake-up latency behind other processes otherwise dominates
# loopback latencies and caps throughput; the kernel's RT throttle (95 %)
# keeps the machine responsive. nice = nice -n $BENCH_NICE. none = neither.
SCHED=${BENCH_SCHED:-rr}
RT_PRIO=${BENCH_RT_PRIO:-10}
NICE=${BENCH_NICE:--10}
PORT_BASE=${BENCH_PORT_BASE:-18400}
RATE=5000          # fixed-rate workload, requests/s in total
RATE_CONNS=50
SMALL_CONNS=50     # wrk connections, small requests
DL_CONNS=16        # wrk connections, 64 KiB / 1 MiB downloads
HS_WORKERS=32      # parallel connection openers
WS_CONNS=100       # WebSocket echo connections
MANY_CONNS=400     # wrk connections, small requests from many clients
H2_MUX_CONNS=4     # h2load: connections x streams, multiplexed
H2_MUX_STREAMS=100
H2_ONE_CONNS=50    # h2load: connections with one stream each
# gRPC (grpc_unary, grpc_stream; see wl_grpc): loadgen grpc, the grpc-go
# client, GRPC_CONNS connections x GRPC_STREAMS calls in flight (unary) or
# long-lived ping-pong streams (stream) each, 64-byte messages both ways.
GRPC_CONNS=4
GRPC_STREAMS=16
GRPC_SIZE=64
GRPC_HOST=team--demo--rpc.apps.test
RELOAD_ROUTES=10000
MR_ROUTES=10000    # many routes: routes installed (besides the benchmarked one) ...
MR_LIVE=1000       # ... the first of them pointing at the app, loaded evenly
MR_CONNS=1000      # keep-alive connections, for one route and for MR_LIVE routes alike
# Noisy neighbours (noisy_h1, noisy_h2, noisy10_h1): instance A
# (team--a--web) flooded, quiet instances B1..B9 (team--bK--web) each asked
# by one keep-alive connection at NOISY_RATE req/s; see wl_noisy.
NOISY_RATE=100        # quiet client: requests/s on each quiet connection
NOISY_CONNS=100       # wrk flood of A (HTTP/1.1): connections
NOISY_H2_CONNS=4      # h2load flood of A (HTTP/2): connections x streams, the
NOISY_H2_STREAMS=25   # same 100 requests in flight as wrk -c100
NOISY_QUIET=9         # quiet instances of noisy10_h1
NOISY_A=team--a--web.apps.test
# Idle scale: one source address (and one app address, for the proxies' own
# connections to the app) has only the ephemeral port range (~28,000 ports)
# towards one destination. The load generator spreads its connections over
# IDLE_SOURCES source addresses 127.0.0.2, 127.0.0.3, ...; the WebSockets are
# spread over IDLE_APPS routes (team--demo--web, team--demo1--web, ...), each
# proxied to the app on its own loopback address (127.0.0.1, 127.0.3.1, ...).
IDLE_SOURCES=$(( (IDLE_N + 19999) / 20000 + 1 ))
IDLE_APPS=$(( (IDLE_N + 19999) / 20000 ))
IDLE_PARALLEL=64
PROFILE_SECONDS=5
HOST=team--demo--web.apps.test
CADDY_VERSION=v2.11.9

# Ports (loopback only).
P_APP=$((PORT_BASE + 0))       # backend app, plain HTTP
P_APPSTATS=$((PORT_BASE + 1))  # backend app's counters (GET /stats)
P_APPQ=$((PORT_BASE + 2))      # the quiet instances' app (noisy-neighbour workloads)
P_APPGRPC=$((PORT_BASE + 3))   # backend app, gRPC in h2c (gRPC workloads)
P_AL=$((PORT_BASE + 43))       # applistener
P_ADMIN=$((PORT_BASE + 90))    # applistener admin (pprof)
P_NGINX=$((PORT_BASE + 44))
P_HAPROXY=$((PORT_BASE + 45))
P_CADDY=$((PORT_BASE + 46))
P_DTLS=$((PORT_BASE + 47))     # app directly, TLS
P_DPLAIN=$((PORT_BASE + 48))   # app directly, plain HTTP
P_NGINX_H2=$((PORT_BASE + 49)) # nginx, listen ... http2 (applistener offers h2 on its one port)
P_HAPROXY_H2=$((PORT_BASE + 50)) # HAProxy, bind ... alpn h2,http/1.1

# CPU pinning: the proxy under test owns core 0; the load generator and the
# backend app share core 1. With one core, everything shares it.
NPROC=$(nproc)
if ((NPROC >= 2)); then PROXY_CPU=0 LOAD_CPU=1; else PROXY_CPU=0 LOAD_CPU=0; fi
if [[ $(id -u) != 0 ]]; then
	[[ $SCHED != rr ]] || SCHED=none
	[[ $SCHED != nice ]] || ((NICE >= 0)) || NICE=0
fi
if [[ $SCHED == rr ]] && ! command -v chrt >/dev/null; then SCHED=nice; fi
# The noisy-neighbour workloads' quiet client and quiet app: one step above
# the rest (a lower nice value only where that is permitted).
QUIET_PRIO=$((RT_PRIO + 1)) QUIET_NICE=$NICE QUIET_SCHED=$SCHED
if [[ $(id -u) == 0 ]]; then QUIET_NICE=$((NICE - 1)); fi
if [[ $SCHED == nice && $(id -u) == 0 ]] && command -v chrt >/dev/null; then QUIET_SCHED=rr; fi
case $SCHED in
rr) SCHED_DESC="SCHED_RR priority $RT_PRIO" ;;
nice) SCHED_DESC="nice $NICE" ;;
*) SCHED_DESC="default scheduling" ;;
esac

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

TMP=$(mktemp -d /tmp/applistener-bench.XXXXXX)
STARTED=()       # PIDs this script started (killed on exit, one by one)
TARGET_PID=""
cleanup() {
	local rc=$?
	set +e
	for pid in "${STARTED[@]}"; do
		kill -TERM "$pid" 2>/dev/null
	done
	sleep 0.3
	for pid in "${STARTED[@]}"; do
		if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; fi
	done
	wait 2>/dev/null
	if [[ ${BENCH_KEEP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

forget() { # drop a PID from STARTED
	local keep=() p
	for p in "${STARTED[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
	STARTED=("${keep[@]}")
}

# ---------------------------------------------------------------- tools
install_tools() {
	local need=()
	command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || need+=(nginx)
	command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]] || need+=(haproxy)
	command -v wrk >/dev/null || need+=(wrk)
	command -v h2load >/dev/null || need+=(nghttp2-client)
	command -v openssl >/dev/null || need+=(openssl)
	command -v jq >/dev/null || need+=(jq)
	command -v curl >/dev/null || need+=(curl)
	command -v taskset >/dev/null || need+=(util-linux)
	[[ ${BENCH_MECH:-1} != 1 ]] || command -v perf >/dev/null || need+=(linux-perf)
	if ((${#need[@]})); then
		log "installing ${need[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	fi
	NGINX=$(command -v nginx || echo /usr/sbin/nginx)
	HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
	# The Debian packages may start their services; they listen on :80 only
	# and are left alone (no port of ours is shared).
	if [[ " $TARGETS " == *" caddy "* ]]; then
		CADDY=""
		local have
		have=${BENCH_CADDY:-$(command -v caddy || true)}
		# `caddy version` says "unknown" for `go install` builds: ask Go.
		if [[ -n $have ]] && { "$have" version 2>/dev/null | grep -q "^${CADDY_VERSION} " ||
			go version -m "$have" 2>/dev/null | grep -Eq "mod[[:space:]]+github.com/caddyserver/caddy/v2[[:space:]]+${CADDY_VERSION}[[:space:]]"; }; then
			CADDY=$have
		else
			local gobin
			gobin=$(mktemp -d "$TMP/caddybin.XXXX")
			log "building caddy $CADDY_VERSION (go install, temporary GOBIN)"
			(cd "$TMP" && GOBIN=$gobin GOFLAGS= go install "github.com/caddyserver/caddy/v2/cmd/caddy@${CADDY_VERSION}") ||
				die "go install caddy failed"
			CADDY=$gobin/caddy
		fi
	fi
}

# fair_targets: applistener-nofair runs only when this applistener's serve
# knows --fair-slots; by default (no BENCH_TARGETS) it then runs beside
# applistener. NOISY=1 when some target runs a noisy-neighbour workload:
# their instances are then configured everywhere (NOISY_ROUTES of them).
# GRPC=1 when some target runs a gRPC workload: the app then serves gRPC
# and every proxy gets the route GRPC_HOST (GRPC_ROUTES: 1).
fair_targets() {
	local help t keep=""
	help=$("$TMP/applistener" serve --help 2>&1 || true)
	if grep -q -- '-fair-slots' <<<"$help"; then
		[[ -n ${BENCH_TARGETS:-} || " $TARGETS " != *" applistener "* ]] || TARGETS=${TARGETS/applistener/applistener applistener-nofair}
	elif [[ " $TARGETS " == *" applistener-nofair "* ]]; then
		note "applistener-nofair not run: this applistener's serve has no --fair-slots flag"
		for t in $TARGETS; do [[ $t == applistener-nofair ]] || keep+="$t "; done
		TARGETS=$keep
	fi
	NOISY=0 NOISY_ROUTES=0 GRPC=0 GRPC_ROUTES=0
	for t in $TARGETS; do
		if [[ " $(workloads_for "$t") " == *" noisy"* ]]; then NOISY=1 NOISY_ROUTES=$((NOISY_QUIET + 1)); fi
		if [[ " $(workloads_for "$t") " == *" grpc_"* ]]; then GRPC=1 GRPC_ROUTES=1; fi
	done
}

build() {
	log "building applistener and the load tools"
	go build -o "$TMP/applistener" ./cmd/applistener
	go build -o "$TMP/benchapp" ./bench/cmd/benchapp
	go build -o "$TMP/loadgen" ./bench/cmd/loadgen
	go build -o "$TMP/benchreport" ./bench/cmd/benchreport
}

certs() {
	local d=$TMP/certs
	mkdir -p "$d"
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
		-subj "/CN=applistener bench CA" -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-subj "/CN=*.apps.test" -keyout "$d/tls.key" -out "$d/tls.csr" 2>/dev/null
	printf 'subjectAltName=DNS:*.apps.test,DNS:apps.test\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' >"$d/ext.cnf"
	openssl x509 -req -in "$d/tls.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 7 \
		-extfile "$d/ext.cnf" -out "$d/tls.crt" 2>/dev/null
	cat "$d/tls.crt" "$d/ca.crt" >"$d/chain.crt"
	cat "$d/chain.crt" "$d/tls.key" >"$d/haproxy.pem"
	mkdir -p "$d/applistener"
	cp "$d/chain.crt" "$d/applistener/tls.crt"
	cp "$d/tls.key" "$d/applistener/tls.key"
}

# ---------------------------------------------------------------- helpers
now() { date +%s.%N; }

# run_pinned CPU CMD... : a benchmark process, pinned, niced, GOMAXPROCS=1.
# PIN_PRIO / PIN_NICE, when set, replace RT_PRIO / NICE (the noisy-neighbour
# workloads' quiet path runs above the proxy, see wl_noisy).
# It execs, so the process keeps the PID of the subshell it is started in:
# call it only in a subshell (`run_pinned ... &`, `$(...)`, a pipeline), so
# that $! is the process itself and can be stopped by its PID.
run_pinned() {
	local cpu=$1
	shift
	case ${PIN_SCHED:-$SCHED} in
	rr) exec chrt -r "${PIN_PRIO:-$RT_PRIO}" taskset -c "$cpu" env GOMAXPROCS=1 "$@" ;;
	nice) exec nice -n "${PIN_NICE:-$NICE}" taskset -c "$cpu" env GOMAXPROCS=1 "$@" ;;
	*) exec taskset -c "$cpu" env GOMAXPROCS=1 "$@" ;;
	esac
}
load() { run_pinned "$LOAD_CPU" "$@"; }

# tree_pids PID: PID and its descendants (nginx: master + worker).
tree_pids() {
	local p=$1 c
	echo "$p"
	for c in $(pgrep -P "$p" 2>/dev/null); do tree_pids "$c"; done
}
watch_list() { tree_pids "$TARGET_PID" | paste -sd, -; }
rss_kib() {
	local sum=0 p v
	for p in $(tree_pids "$TARGET_PID"); do
		v=$(awk '/^VmRSS:/{print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
		sum=$((sum + ${v:-0}))
	done
	echo "$sum"
}
cpu_ticks() {
	local sum=0 p v
	for p in $(tree_pids "$TARGET_PID"); do
		v=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12+$13}')
		sum=$((sum + ${v:-0}))
	done
	echo "$sum"
}
CLK_TCK=$(getconf CLK_TCK)
calc() { awk "BEGIN{ printf \"%.6g\", $* }"; }

RAW=$TMP/raw.tsv
NOTES=$TMP/notes.txt
: >"$RAW"
: >"$NOTES"
RECORD=1
record() { # target metric round value
	[[ $RECORD == 1 ]] || return 0
	[[ -n $4 && $4 != null ]] || return 0
	printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RAW"
}
note() { grep -qxF -- "$*" "$NOTES" || echo "$*" >>"$NOTES"; }

port_free() { ! ss -Hltn "sport = :$1" | grep -q .; }

wait_ready() { # scheme port
	local i
	for i in $(seq 1 150); do
		if curl -fsk -o /dev/null --max-time 1 --resolve "$HOST:$2:127.0.0.1" "$1://$HOST:$2/"; then return 0; fi
		if [[ -n $TARGET_PID ]] && ! kill -0 "$TARGET_PID" 2>/dev/null; then return 1; fi
		sleep 0.1
	done
	return 1
}

# ---------------------------------------------------------------- mechanism per request
# For the small-request HTTP/1.1 and HTTP/2 rows (small, many, h2_mux,
# h2_one, rate), besides req/s and CPU per request, what the proxy did per
# request, so that a change is judged on its mechanism and not only on a
# noisy rate:
# - context switches (voluntary: the proxy blocked, e.g. in epoll_wait or a
#   futex; involuntary: it was preempted), summed over every thread of its
#   processes (/proc/PID/task/*/status), over the measured run (the CPU window);
# - Go allocations (applistener only: go_memstats_mallocs_total from its
#   admin /metrics, less what one scrape allocates), over the measured run;
# - system calls by kind, in a separate pass of the same workload
#   (BENCH_SYSCALL_DUR seconds), counted by `perf stat` on the syscalls:sys_enter_*
#   tracepoints of the proxy's threads: in-kernel counters, no ptrace, no
#   record of each call, but ~0.2 µs of kernel time per call, so they are not
#   taken during the run whose rate and CPU are reported. strace -c would
#   stop the proxy at every call (several times slower); bpftrace is not
#   packaged for every kernel; perf is Debian's linux-perf.
# Every figure is divided by the requests of its window: wrk's count for wrk,
# the app's for h2load and the fixed-rate run (the same as the CPU figures).
MECH=${BENCH_MECH:-1}
SYSCALL_DUR=${BENCH_SYSCALL_DUR:-2}
MECH_SYSCALLS=0  # 1 while a system-call pass runs
MECH_N=0         # requests of the last run's mechanism window
PERF=""
mech_setup() {
	[[ $MECH == 1 ]] || return 0
	if command -v perf >/dev/null && perf stat -x, -e syscalls:sys_enter_getpid -o /dev/null true 2>/dev/null; then
		PERF=$(command -v perf)
	else
		note "system calls per request not counted: perf cannot count the syscalls tracepoints here ($(perf stat -e syscalls:sys_enter_getpid true 2>&1 | head -n 1))"
	fi
}
# ctx_switches: "VOLUNTARY INVOLUNTARY", summed over the target's threads.
ctx_switches() {
	local p
	for p in $(tree_pids "$TARGET_PID"); do cat "/proc/$p"/task/*/status 2>/dev/null; done |
		awk '$1=="voluntary_ctxt_switches:"{v+=$2} $1=="nonvoluntary_ctxt_switches:"{n+=$2} END{printf "%d %d\n", v, n}'
}
go_mallocs() { # applistener's heap allocations so far (one scrape of /metrics)
	curl -fs --max-time 2 "http://127.0.0.1:$P_ADMIN/metrics" 2>/dev/null | awk '$1=="go_memstats_mallocs_total"{printf "%.0f\n", $2}'
}
mech_begin() {
	[[ $MECH == 1 ]] || return 0
	MECH_M0="" MECH_SCRAPE=0
	if [[ $TARGET == applistener ]]; then
		local m
		m=$(go_mallocs)
		MECH_M0=$(go_mallocs)
		[[ -z $m || -z $MECH_M0 ]] || MECH_SCRAPE=$((MECH_M0 - m))
	fi
	MECH_CS0=$(ctx_switches)
	[[ $MECH_SYSCALLS == 1 && -n $PERF ]] && perf_start
	return 0
}
mech_end() {
	[[ $MECH == 1 ]] || return 0
	[[ $MECH_SYSCALLS == 1 && -n $PERF ]] && perf_stop
	MECH_CS1=$(ctx_switches)
	MECH_M1=""
	[[ -z $MECH_M0 ]] || MECH_M1=$(go_mallocs)
	return 0
}
# mech_record PREFIX ROUND: the figures of the last measured run, per request.
mech_record() {
	[[ $MECH == 1 && ${MECH_N:-0} -gt 0 ]] || return 0
	local v0 n0 v1 n1
	read -r v0 n0 <<<"$MECH_CS0"
	read -r v1 n1 <<<"$MECH_CS1"
	record "$TARGET" "${1}_csw_vol" "$2" "$(calc "($v1 - $v0) / $MECH_N")"
	record "$TARGET" "${1}_csw_invol" "$2" "$(calc "($n1 - $n0) / $MECH_N")"
	if [[ -n $MECH_M0 && -n $MECH_M1 ]]; then
		record "$TARGET" "${1}_allocs" "$2" "$(calc "($MECH_M1 - $MECH_M0 - $MECH_SCRAPE) / $MECH_N")"
	fi
}
perf_start() {
	rm -f "$TMP/perf.ctl" "$TMP/perf.ack" "$TMP/perf.out"
	mkfifo "$TMP/perf.ctl" "$TMP/perf.ack"
	exec {PERF_CTL}<>"$TMP/perf.ctl" {PERF_ACK}<>"$TMP/perf.ack"
	# Opened disabled (-D -1) on every thread of the target (new threads
	# inherit), enabled through the control pipe: the window starts when perf
	# acknowledges, not when it has finished attaching some time later.
	taskset -c "$LOAD_CPU" "$PERF" stat -x, -D -1 --control "fd:$PERF_CTL,$PERF_ACK" \
		-e 'syscalls:sys_enter_*' -p "$(watch_list)" -o "$TMP/perf.out" 2>>"$TMP/perf.err" &
	PERF_PID=$!
	STARTED+=("$PERF_PID")
	local ack=""
	echo enable >&"$PERF_CTL"
	read -r -t 20 -u "$PERF_ACK" ack || note "$TARGET: perf did not acknowledge enabling its counters within 20 s"
}
perf_stop() {
	local ack=""
	echo disable >&"$PERF_CTL"
	read -r -t 10 -u "$PERF_ACK" ack || true
	kill -INT "$PERF_PID" 2>/dev/null || true
	wait "$PERF_PID" 2>/dev/null || true
	forget "$PERF_PID"
	exec {PERF_CTL}>&- {PERF_ACK}>&-
	# "COUNT,,syscalls:sys_enter_NAME,..." -> "NAME COUNT" for the calls made.
	awk -F, '$3 ~ /^syscalls:sys_enter_/ && $1 ~ /^[0-9]+$/ && $1 > 0 {sub(/^syscalls:sys_enter_/, "", $3); print $3, $1}' \
		"$TMP/perf.out" >"$TMP/perf.counts" 2>/dev/null || : >"$TMP/perf.counts"
}
# mech_syscall_pass PREFIX ROUND RUN-FUNCTION ARGS...: the same workload
# again, shorter, with perf counting; records PREFIX_syscalls (all kinds) and
# PREFIX_sys_KIND per request.
mech_syscall_pass() {
	[[ $MECH == 1 && -n $PERF && $RECORD == 1 ]] || return 0
	local prefix=$1 round=$2 name count total=0
	shift 2
	MECH_SYSCALLS=1
	"$@" >/dev/null
	MECH_SYSCALLS=0
	[[ ${MECH_N:-0} -gt 0 && -s $TMP/perf.counts ]] || { note "$TARGET $prefix: no system calls counted in the perf pass"; return 0; }
	while read -r name count; do
		total=$((total + count))
		record "$TARGET" "${prefix}_sys_${name}" "$round" "$(calc "$count / $MECH_N")"
	done <"$TMP/perf.counts"
	record "$TARGET" "${prefix}_syscalls" "$round" "$(calc "$total / $MECH_N")"
}

# ---------------------------------------------------------------- backend
# app_ip K: the app's address for route K (0: team--demo--web, the one every
# other workload uses; K >= 1: team--demoK--web, only idle_ws uses them).
app_ip() { if (($1 == 0)); then echo 127.0.0.1; else echo "127.0.3.$1"; fi; }
app_host() { if (($1 == 0)); then echo "$HOST"; else echo "team--demo$1--web.apps.test"; fi; }
app_addrs() {
	local k out=""
	for ((k = 0; k < IDLE_APPS; k++)); do out+="${out:+,}$(app_ip "$k"):$P_APP"; done
	echo "$out"
}
idle_hosts() {
	local k out=""
	for ((k = 0; k < IDLE_APPS; k++)); do out+="${out:+,}$(app_host "$k")"; done
	echo "$out"
}
start_backend() {
	"$TMP/benchapp" -h >/dev/null 2>&1 || true
	local grpc=()
	((GRPC == 0)) || grpc=(-grpc-addr "127.0.0.1:$P_APPGRPC")
	run_pinned "$LOAD_CPU" "$TMP/benchapp" -addr "$(app_addrs)" -stats-addr "127.0.0.1:$P_APPSTATS" "${grpc[@]}" >"$TMP/benchapp.log" 2>&1 &
	BACKEND_PID=$!
	STARTED+=("$BACKEND_PID")
	local i
	for i in $(seq 1 50); do
		curl -fs -o /dev/null "http://127.0.0.1:$P_APP/" && return 0
		sleep 0.1
	done
	die "backend app did not start: $(cat "$TMP/benchapp.log")"
}
# The quiet instances' own app (noisy-neighbour workloads): each sandbox has
# its own app; it runs with the quiet client, on the proxy's core above the
# proxy (see wl_noisy), so that B's figures are the proxy's, not core 1's.
start_quiet_backend() {
	PIN_SCHED=$QUIET_SCHED PIN_PRIO=$QUIET_PRIO PIN_NICE=$QUIET_NICE run_pinned "$PROXY_CPU" "$TMP/benchapp" -addr "127.0.0.1:$P_APPQ" >"$TMP/benchapp-quiet.log" 2>&1 &
	STARTED+=("$!")
	local i
	for i in $(seq 1 50); do
		curl -fs -o /dev/null "http://127.0.0.1:$P_APPQ/" && return 0
		sleep 0.1
	done
	die "quiet backend app did not start: $(cat "$TMP/benchapp-quiet.log")"
}

# app_stats: "ACCEPTS REQUESTS", the backend app's counters so far: the
# connections every proxy opened to it and the requests it answered.
app_stats() {
	curl -fs --max-time 2 "http://127.0.0.1:$P_APPSTATS/stats" | jq -r '"\(.accepts) \(.requests)"' 2>/dev/null || echo "0 0"
}
# app_delta BEFORE AFTER: sets APP_DIALS (connections opened) and APP_REQS
# (requests answered) between two app_stats readings, and APP_DIALS_K, the
# app connections opened per 1,000 requests.
app_delta() {
	local a0 r0 a1 r1
	read -r a0 r0 <<<"$1"
	read -r a1 r1 <<<"$2"
	APP_DIALS=$((a1 - a0)) APP_REQS=$((r1 - r0))
	if ((APP_REQS > 0)); then APP_DIALS_K=$(calc "$APP_DIALS * 1000 / $APP_REQS"); else APP_DIALS_K=""; fi
}

# ---------------------------------------------------------------- proxies
# routes_doc: the benchmarked route team/demo (with its gRPC service rpc, h2c
# to the app's gRPC port, when a gRPC workload runs: GRPC=1), the idle
# workloads' extra routes, the noisy-neighbour instances team/a (the app)
# and team/b1..b9 (the quiet app) when those workloads run (NOISY=1), then
# n more.
routes_doc() { # extra-route-count revision [live]: the first live extra routes point at the app too
	local n=$1 rev=$2 live=${3:-0}
	awk -v n="$n" -v rev="$rev" -v app="$P_APP" -v live="$live" -v apps="$IDLE_APPS" \
		-v noisy="$NOISY" -v quiet="$NOISY_QUIET" -v appq="$P_APPQ" -v grpc="$GRPC" -v appgrpc="$P_APPGRPC" 'BEGIN{
		printf "{\"revision\":\"%s\",\"instances\":[", rev
		printf "{\"workspace\":\"team\",\"sandbox\":\"demo\",\"generation\":\"1\",\"connector\":{\"type\":\"tcp\",\"host\":\"127.0.0.1\"},\"services\":[{\"name\":\"web\",\"port\":%d,\"revision\":1}", app
		if (grpc)
			printf ",{\"name\":\"rpc\",\"port\":%d,\"protocol\":\"h2c\",\"revision\":1}", appgrpc
		printf "]}"
		for (k = 1; k < apps; k++)
			printf ",\n{\"workspace\":\"team\",\"sandbox\":\"demo%d\",\"generation\":\"1\",\"connector\":{\"type\":\"tcp\",\"host\":\"127.0.3.%d\"},\"services\":[{\"name\":\"web\",\"port\":%d,\"revision\":1}]}", k, k, app
		if (noisy) {
			printf ",\n{\"workspace\":\"team\",\"sandbox\":\"a\",\"generation\":\"1\",\"connector\":{\"type\":\"tcp\",\"host\":\"127.0.0.1\"},\"services\":[{\"name\":\"web\",\"port\":%d,\"revision\":1}]}", app
			for (k = 1; k <= quiet; k++)
				printf ",\n{\"workspace\":\"team\",\"sandbox\":\"b%d\",\"generation\":\"1\",\"connector\":{\"type\":\"tcp\",\"host\":\"127.0.0.1\"},\"services\":[{\"name\":\"web\",\"port\":%d,\"revision\":1}]}", k, appq
		}
		for (i = 0; i < n; i++)
			printf ",\n{\"workspace\":\"ws%05d\",\"sandbox\":\"sb%05d\",\"generation\":\"%s\",\"connector\":{\"type\":\"tcp\",\"host\":\"127.0.0.1\"},\"services\":[{\"name\":\"web\",\"port\":%d,\"revision\":1}]}", i, i, rev, (i < live) ? app : 20000 + i
		printf "]}\n"
	}'
}
put_routes() { # file-content-command...: atomic replacement (rename)
	"$@" >"$TMP/routes.json.new"
	mv -f "$TMP/routes.json.new" "$TMP/routes.json"
}

# Many routes for nginx and HAProxy (when the manyroutes workload runs): the
# MR_ROUTES host names of routes_doc's extra routes, each its own upstream
# (backend) with keep-alive, the first MR_LIVE pointing at the app, the
# others at closed ports, as an operator of either would write one per
# sandbox: a map from the Host to the upstream's name.
mr_wanted() { [[ " $(workloads_for "$1") " == *" manyroutes "* ]]; }
mr_map() { # prefix: "host upstream" lines
	awk -v n="$MR_ROUTES" -v p="$1" 'BEGIN{ for (i = 0; i < n; i++) printf "ws%05d--sb%05d--web.apps.test %s%d\n", i, i, p, i }'
}
# (The configurations inline the same arithmetic: 10,000 command
# substitutions, one fork each, took minutes per start on a loaded machine.)
mr_port() { if (($1 < MR_LIVE)); then echo "$P_APP"; else echo $((20000 + $1)); fi; }

start_applistener() {
	put_routes routes_doc 0 base
	[[ -z ${BENCH_APPLISTENER_ARGS:-} ]] || note "$TARGET: started with the extra flags $BENCH_APPLISTENER_ARGS"
	# shellcheck disable=SC2086 # BENCH_APPLISTENER_ARGS: several flags
	run_pinned "$PROXY_CPU" "$TMP/applistener" serve --app-listener --app-domain apps.test \
		--app-address "127.0.0.1:$P_AL" --app-tls-dir "$TMP/certs/applistener" \
		--routes-file "$TMP/routes.json" --admin-address "127.0.0.1:$P_ADMIN" --admin-pprof \
		--default-max-streams 0 --drain-timeout 2s ${BENCH_APPLISTENER_ARGS:-} >>"$TMP/applistener.log" 2>&1 &
	TARGET_PID=$!
	PORT=$P_AL SCHEME=https H2PORT=$P_AL GRPCPORT=$P_AL
}
# applistener with fair admission off (--fair-slots -1; after any
# BENCH_APPLISTENER_ARGS, so it wins): the A/B partner of the noisy-neighbour
# workloads, run only when the binary knows the flag (see fair_targets).
start_applistener-nofair() {
	BENCH_APPLISTENER_ARGS="${BENCH_APPLISTENER_ARGS:-} --fair-slots -1" start_applistener
}

# Connection limits (CONN_LIMIT, set with the open-file limit below), the
# same for every proxy: room for the idle connections plus the other
# workloads' (HS_WORKERS, MANY_CONNS, ...). nginx's worker_connections
# counts the app side too (two per WebSocket); HAProxy's maxconn counts
# client connections. When the open-file limit is below what that needs,
# nginx logs that it could not raise it and HAProxy is told `no
# strict-limits` (otherwise it refuses to start): both then hold what the
# limit allows, and the idle workloads stay below it.
# nginx_noisy_conf: the noisy-neighbour instances for nginx, each its own
# upstream with keep-alive and its own server block on both ports (HTTP/1.1
# and HTTP/2), as for the benchmarked route.
nginx_noisy_conf() {
	local k h up
	for ((k = 0; k <= NOISY_QUIET; k++)); do
		if ((k == 0)); then h=$NOISY_A up="127.0.0.1:$P_APP"; else h=$(noisy_quiet_host "$k") up="127.0.0.1:$P_APPQ"; fi
		cat <<EOF
upstream noisy$k { server $up; keepalive 512; keepalive_requests 1000000; keepalive_timeout 60s; }
server {
    listen 127.0.0.1:$P_NGINX ssl;
    listen 127.0.0.1:$P_NGINX_H2 ssl http2;
    server_name $h;
    ssl_certificate $TMP/certs/chain.crt;
    ssl_certificate_key $TMP/certs/tls.key;
    location / {
        proxy_pass http://noisy$k;
        proxy_http_version 1.1;
        proxy_set_header Host \$host;
        proxy_set_header Connection "";
        proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto https;
    }
}
EOF
	done
}

start_nginx() {
	local d=$TMP/nginx k extra_up="" extra_srv=""
	mkdir -p "$d/logs" "$d/tmp"
	for ((k = 1; k < IDLE_APPS; k++)); do
		extra_up+="    upstream app$k { server $(app_ip "$k"):$P_APP; keepalive 512; keepalive_requests 1000000; keepalive_timeout 60s; }
"
		extra_srv+="    server {
        listen 127.0.0.1:$P_NGINX ssl;
        server_name $(app_host "$k");
        ssl_certificate $TMP/certs/chain.crt;
        ssl_certificate_key $TMP/certs/tls.key;
        location / {
            proxy_pass http://app$k;
            proxy_http_version 1.1;
            proxy_set_header Host \$host;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection \$connection_upgrade;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto https;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
        }
    }
"
	done
	if mr_wanted nginx; then
		{
			echo "map \$host \$mr_upstream {"
			echo "    default mr_none;"
			mr_map mr | sed 's/^/    /; s/$/;/'
			echo "}"
			echo "upstream mr_none { server 127.0.0.1:1; }"
			for ((k = 0; k < MR_ROUTES; k++)); do
				echo "upstream mr$k { server 127.0.0.1:$((k < MR_LIVE ? P_APP : 20000 + k)); keepalive 512; keepalive_requests 1000000; keepalive_timeout 60s; }"
			done
		} >"$d/manyroutes.conf"
		extra_up+="    include $d/manyroutes.conf;
"
		extra_srv+="    server {
        listen 127.0.0.1:$P_NGINX ssl;
        server_name ~^ws[0-9]+--sb[0-9]+--web\.apps\.test\$;
        ssl_certificate $TMP/certs/chain.crt;
        ssl_certificate_key $TMP/certs/tls.key;
        location / {
            proxy_pass http://\$mr_upstream;
            proxy_http_version 1.1;
            proxy_set_header Host \$host;
            proxy_set_header Connection \"\";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto https;
        }
    }
"
	fi
	if ((NOISY)); then
		nginx_noisy_conf >"$d/noisy.conf"
		extra_up+="    include $d/noisy.conf;
"
	fi
	if ((GRPC)); then
		# gRPC: HTTP/2 from the client (the http2 port), grpc_pass to the
		# app's h2c port over kept-alive upstream connections.
		extra_up+="    upstream grpcapp { server 127.0.0.1:$P_APPGRPC; keepalive 512; keepalive_requests 1000000; keepalive_timeout 60s; }
"
		extra_srv+="    server {
        listen 127.0.0.1:$P_NGINX_H2 ssl http2;
        server_name $GRPC_HOST;
        ssl_certificate $TMP/certs/chain.crt;
        ssl_certificate_key $TMP/certs/tls.key;
        location / {
            grpc_pass grpc://grpcapp;
            grpc_read_timeout 1h;
            grpc_send_timeout 1h;
        }
    }
"
	fi
	cat >"$d/nginx.conf" <<EOF
worker_processes 1;
worker_rlimit_nofile $((2 * CONN_LIMIT + 1000));
daemon off;
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
events { worker_connections $((2 * CONN_LIMIT)); }
http {
    access_log off;
    client_body_temp_path $d/tmp/body;
    proxy_temp_path $d/tmp/proxy;
    fastcgi_temp_path $d/tmp/fastcgi;
    uwsgi_temp_path $d/tmp/uwsgi;
    scgi_temp_path $d/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    map_hash_max_size 65536;
    map_hash_bucket_size 128;
    # nginx 1.22 leaves TLS 1.3 out by default, and the listen socket's
    # default server decides the version: set it for every server.
    ssl_protocols TLSv1.2 TLSv1.3;
    # Same cipher as the Go servers pick (AES-128-GCM): OpenSSL clients such
    # as wrk list AES-256-GCM first, and nginx follows the client by default.
    ssl_prefer_server_ciphers on;
    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256;
    upstream app {
        server 127.0.0.1:$P_APP;
        keepalive 512;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }
$extra_up    map \$http_upgrade \$connection_upgrade { default upgrade; '' ''; }
$extra_srv    server {
        listen 127.0.0.1:$P_NGINX ssl default_server;
        ssl_certificate $TMP/certs/chain.crt;
        ssl_certificate_key $TMP/certs/tls.key;
        ssl_reject_handshake on;
    }
    server {
        listen 127.0.0.1:$P_NGINX_H2 ssl http2 default_server;
        ssl_certificate $TMP/certs/chain.crt;
        ssl_certificate_key $TMP/certs/tls.key;
        ssl_reject_handshake on;
    }
    server {
        listen 127.0.0.1:$P_NGINX ssl;
        listen 127.0.0.1:$P_NGINX_H2 ssl http2;
        server_name $HOST;
        ssl_certificate $TMP/certs/chain.crt;
        ssl_certificate_key $TMP/certs/tls.key;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Host \$host;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection \$connection_upgrade;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto https;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
        }
    }
}
EOF
	run_pinned "$PROXY_CPU" "$NGINX" -p "$d" -c "$d/nginx.conf" -e "$d/logs/error.log" >>"$d/logs/stderr.log" 2>&1 &
	TARGET_PID=$!
	PORT=$P_NGINX SCHEME=https H2PORT=$P_NGINX_H2 GRPCPORT=$P_NGINX_H2
}

start_haproxy() {
	local d=$TMP/haproxy k extra_use="" extra_be=""
	mkdir -p "$d"
	for ((k = 1; k < IDLE_APPS; k++)); do
		extra_use+="    use_backend app$k if { ssl_fc_sni -m str $(app_host "$k") } { req.hdr(host),field(1,:),lower -m str $(app_host "$k") }
"
		extra_be+="backend app$k
    server s1 $(app_ip "$k"):$P_APP
"
	done
	if mr_wanted haproxy; then
		mr_map mr >"$d/manyroutes.map"
		extra_use+="    use_backend %[req.hdr(host),field(1,:),lower,map($d/manyroutes.map)] if { req.hdr(host),field(1,:),lower,map($d/manyroutes.map) -m found } { ssl_fc_sni,lower,map($d/manyroutes.map) -m found }
"
		for ((k = 0; k < MR_ROUTES; k++)); do
			extra_be+="backend mr$k
    server s1 127.0.0.1:$((k < MR_LIVE ? P_APP : 20000 + k))
"
		done
	fi
	if ((NOISY)); then
		# The noisy-neighbour instances: one backend each, chosen by SNI and Host.
		local h up
		for ((k = 0; k <= NOISY_QUIET; k++)); do
			if ((k == 0)); then h=$NOISY_A up="127.0.0.1:$P_APP"; else h=$(noisy_quiet_host "$k") up="127.0.0.1:$P_APPQ"; fi
			extra_use+="    use_backend noisy$k if { ssl_fc_sni -m str $h } { req.hdr(host),field(1,:),lower -m str $h }
"
			extra_be+="backend noisy$k
    server s1 $up
"
		done
	fi
	if ((GRPC)); then
		# gRPC: HTTP/2 from the client (the alpn h2 bind), HTTP/2 without
		# TLS to the app (proto h2).
		extra_use+="    use_backend grpcapp if { ssl_fc_sni -m str $GRPC_HOST } { req.hdr(host),field(1,:),lower -m str $GRPC_HOST }
"
		extra_be+="backend grpcapp
    server s1 127.0.0.1:$P_APPGRPC proto h2
"
	fi
	cat >"$d/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn $CONN_LIMIT
    no strict-limits
    # Same cipher as the Go servers pick (AES-128-GCM), server's choice.
    ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-keep-alive 120s
    timeout tunnel 1h
    option http-keep-alive
    http-reuse always
frontend fe
    bind 127.0.0.1:$P_HAPROXY ssl crt $TMP/certs/haproxy.pem alpn http/1.1
    bind 127.0.0.1:$P_HAPROXY_H2 ssl crt $TMP/certs/haproxy.pem alpn h2,http/1.1
    option forwardfor
    http-request set-header X-Forwarded-Proto https
    acl sni_ok ssl_fc_sni -m str $HOST
    acl host_ok req.hdr(host),field(1,:),lower -m str $HOST
    use_backend app if sni_ok host_ok
${extra_use}    default_backend none
backend app
    server s1 127.0.0.1:$P_APP
${extra_be}backend none
EOF
	run_pinned "$PROXY_CPU" "$HAPROXY" -db -f "$d/haproxy.cfg" >>"$d/haproxy.log" 2>&1 &
	TARGET_PID=$!
	PORT=$P_HAPROXY SCHEME=https H2PORT=$P_HAPROXY_H2 GRPCPORT=$P_HAPROXY_H2
}

start_caddy() {
	local d=$TMP/caddy
	mkdir -p "$d/home"
	cat >"$d/Caddyfile" <<EOF
{
    admin off
    auto_https off
    persist_config off
    servers {
        protocols h1
    }
}
https://$HOST:$P_CADDY {
    bind 127.0.0.1
    tls $TMP/certs/chain.crt $TMP/certs/tls.key
    reverse_proxy 127.0.0.1:$P_APP {
        transport http {
            keepalive 60s
            keepalive_idle_conns 256
            keepalive_idle_conns_per_host 256
        }
    }
}
EOF
	HOME=$d/home XDG_DATA_HOME=$d/home XDG_CONFIG_HOME=$d/home \
		run_pinned "$PROXY_CPU" "$CADDY" run --config "$d/Caddyfile" --adapter caddyfile >>"$d/caddy.log" 2>&1 &
	TARGET_PID=$!
	PORT=$P_CADDY SCHEME=https
}

# The app itself on the proxy's core: the bound no proxy can beat.
start_direct-tls() {
	run_pinned "$PROXY_CPU" "$TMP/benchapp" -addr "" -tls-addr "127.0.0.1:$P_DTLS" \
		-cert "$TMP/certs/chain.crt" -key "$TMP/certs/tls.key" >>"$TMP/direct.log" 2>&1 &
	TARGET_PID=$!
	PORT=$P_DTLS SCHEME=https
}
# The gRPC workloads' direct rate is the backend app's own h2c port, where
# the load generator meets the app on the load core as through every proxy
# (see wl_grpc).
start_direct-plain() {
	run_pinned "$PROXY_CPU" "$TMP/benchapp" -addr "127.0.0.1:$P_DPLAIN" >>"$TMP/direct.log" 2>&1 &
	TARGET_PID=$!
	PORT=$P_DPLAIN SCHEME=http
	((GRPC == 0)) || GRPCPORT=$P_APPGRPC
}

start_target() {
	TARGET=$1
	H2PORT="" GRPCPORT=""
	"start_$TARGET"
	STARTED+=("$TARGET_PID")
	wait_ready "$SCHEME" "$PORT" || die "$TARGET did not come up (see logs in $TMP; BENCH_KEEP=1 keeps them)"
	if [[ $SCHEME == https ]]; then
		SNI=$HOST
		# What an OpenSSL client (like wrk) negotiates: the same for all.
		local neg
		neg=$(openssl s_client -connect "127.0.0.1:$PORT" -servername "$HOST" -alpn http/1.1 </dev/null 2>/dev/null |
			awk '/^New, /{v=$2; c=$5} /Server Temp Key/{k=$4} END{gsub(/,/,"",v); gsub(/,/,"",k); print v, c, k}')
		grep -q "^$TARGET	" "$TMP/negotiated.tsv" 2>/dev/null || printf '%s\t%s\n' "$TARGET" "$neg" >>"$TMP/negotiated.tsv"
	else
		SNI=""
	fi
}

stop_target() {
	[[ -n $TARGET_PID ]] || return 0
	kill -TERM "$TARGET_PID" 2>/dev/null || true
	local i
	for i in $(seq 1 50); do
		kill -0 "$TARGET_PID" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$TARGET_PID" 2>/dev/null || true
	wait "$TARGET_PID" 2>/dev/null || true
	forget "$TARGET_PID"
	TARGET_PID=""
	sleep 0.5
}

# ---------------------------------------------------------------- workloads
# wrk: connects to 127.0.0.1 (bench/sni.lua overrides name resolution) while
# the URL's host is the SNI and the Host header.
to_ms() { # wrk latency: 1.23ms / 850.00us / 1.01s
	awk -v v="$1" 'BEGIN{
		if (v ~ /us$/) { sub(/us$/, "", v); printf "%.4f", v/1000 }
		else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.4f", v }
		else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.4f", v*1000 }
		else print "" }'
}
run_wrk() { # conns duration path -> sets WRK_OUT, WRK_CPU_S, WRK_WALL, APP_DIALS_K
	local c0 c1 t0 t1 s0 s1
	s0=$(app_stats)
	c0=$(cpu_ticks)
	mech_begin
	t0=$(now)
	WRK_OUT=$(load wrk -t1 -c"$1" -d"${2}s" --latency -s "$BENCH/sni.lua" "$SCHEME://$HOST:$PORT$3" 2>&1) || true
	t1=$(now)
	mech_end
	c1=$(cpu_ticks)
	s1=$(app_stats)
	app_delta "$s0" "$s1"
	WRK_CPU_S=$(calc "($c1 - $c0) / $CLK_TCK")
	WRK_WALL=$(calc "$t1 - $t0")
	echo "$WRK_OUT" >>"$TMP/wrk.log"
	WRK_RPS=$(awk '/^Requests\/sec:/{print $2}' <<<"$WRK_OUT")
	WRK_N=$(awk '/requests in/{print $1}' <<<"$WRK_OUT")
	local bad
	bad=$(awk '/Non-2xx|Socket errors/' <<<"$WRK_OUT")
	[[ -z $bad ]] || note "$TARGET $3: wrk reported: $(tr '\n' ' ' <<<"$bad")"
	[[ -n $WRK_RPS && ${WRK_N:-0} -gt 0 ]] || { note "$TARGET $3: wrk failed: $(tail -n 3 <<<"$WRK_OUT" | tr '\n' ' ')"; WRK_RPS=""; WRK_N=1; }
	MECH_N=$WRK_N
	[[ -n $WRK_RPS ]] || MECH_N=0
}

wl_warmup() { run_wrk "$SMALL_CONNS" 1 / >/dev/null; }

wl_small() { # round duration
	run_wrk "$SMALL_CONNS" "$2" /
	record "$TARGET" small_rps "$1" "$WRK_RPS"
	record "$TARGET" small_p50_ms "$1" "$(to_ms "$(awk '$1=="50%"{print $2}' <<<"$WRK_OUT")")"
	record "$TARGET" small_p99_ms "$1" "$(to_ms "$(awk '$1=="99%"{print $2}' <<<"$WRK_OUT")")"
	record "$TARGET" small_cpu_us "$1" "$(calc "$WRK_CPU_S * 1e6 / $WRK_N")"
	record "$TARGET" small_cpu_pct "$1" "$(calc "$WRK_CPU_S / $WRK_WALL * 100")"
	record "$TARGET" small_dials "$1" "$APP_DIALS_K"
	mech_record small "$1"
	mech_syscall_pass small "$1" run_wrk "$SMALL_CONNS" "$SYSCALL_DUR" /
}

# Many clients: 400 keep-alive connections. A 1 s warm-up at the same
# concurrency first, so that the figures are the steady state (the proxy's
# app connections already opened), as for every other workload.
wl_many() { # round duration
	run_wrk "$MANY_CONNS" 1 / >/dev/null
	run_wrk "$MANY_CONNS" "$2" /
	record "$TARGET" many_rps "$1" "$WRK_RPS"
	record "$TARGET" many_p50_ms "$1" "$(to_ms "$(awk '$1=="50%"{print $2}' <<<"$WRK_OUT")")"
	record "$TARGET" many_p99_ms "$1" "$(to_ms "$(awk '$1=="99%"{print $2}' <<<"$WRK_OUT")")"
	record "$TARGET" many_cpu_us "$1" "$(calc "$WRK_CPU_S * 1e6 / $WRK_N")"
	record "$TARGET" many_dials "$1" "$APP_DIALS_K"
	mech_record many "$1"
	mech_syscall_pass many "$1" run_wrk "$MANY_CONNS" "$SYSCALL_DUR" /
}

# HTTP/2 clients (h2load, TLS, ALPN h2), small responses; each proxy
# forwards HTTP/1.1 keep-alive to the app. h2load connects to 127.0.0.1
# (--connect-to) and sends the URL's host as SNI and :authority. A 1 s run
# at the same concurrency goes first, as for wl_many.
# - CPU per request: the proxy's CPU over the whole h2load run (its 1 s
#   warm-up included) per request the app answered in it. A busy process
#   that never sleeps (HAProxy under load) has its CPU time accounted only
#   when it is switched out, so it is read while the proxy is idle.
# - App dials per 1,000 requests: over h2load's measured period only (the
#   app's counters are read 1 s in). When a run ends h2load drops its
#   streams in flight, and a proxy that closes the app connections of
#   abandoned streams opens them again at the start of the next run.
run_h2load() { # conns streams duration -> sets H2_OUT, H2_RPS, H2_CPU_US, APP_DIALS_K
	local c0 c1 s0 s1 sm url="https://$HOST:$H2PORT/" mark=$TMP/h2load.mark marker
	(load h2load -t1 -c"$1" -m"$2" -D 1 --connect-to "127.0.0.1:$H2PORT" "$url" >/dev/null 2>&1) || true
	: >"$mark"
	s0=$(app_stats)
	c0=$(cpu_ticks)
	(
		sleep 1
		app_stats >"$mark"
	) &
	marker=$!
	mech_begin
	H2_OUT=$(load h2load -t1 -c"$1" -m"$2" -D "$3" --warm-up-time 1 --connect-to "127.0.0.1:$H2PORT" "$url" 2>&1) || true
	mech_end
	c1=$(cpu_ticks)
	s1=$(app_stats)
	wait "$marker" || true
	echo "$H2_OUT" >>"$TMP/h2load.log"
	H2_RPS=$(awk '/^finished in/{for (i = 1; i <= NF; i++) if ($i == "req/s,") print $(i-1)}' <<<"$H2_OUT")
	app_delta "$s0" "$s1"
	H2_CPU_US=""
	if ((APP_REQS > 0)); then H2_CPU_US=$(calc "($c1 - $c0) / $CLK_TCK * 1e6 / $APP_REQS"); fi
	MECH_N=$APP_REQS # the mechanism window is the CPU window
	sm=$(cat "$mark")
	if [[ -n $sm ]]; then app_delta "$sm" "$s1"; else APP_DIALS_K=""; fi
	local proto bad
	proto=$(awk -F': ' '/^Application protocol:/{print $2}' <<<"$H2_OUT")
	bad=$(awk '/^requests:/{if ($10 + $12 + $14 > 0) print} /^status codes:/{if ($5 + $7 + $9 > 0) print}' <<<"$H2_OUT")
	[[ $proto == h2 ]] || { note "$TARGET h2load -c$1 -m$2: negotiated '${proto:-nothing}', not h2: $(tail -n 2 <<<"$H2_OUT" | tr '\n' ' ')"; H2_RPS=""; }
	[[ -z $bad ]] || note "$TARGET h2load -c$1 -m$2: $bad"
}
wl_h2() { # round duration conns streams metric-prefix
	run_h2load "$3" "$4" "$2"
	[[ -n $H2_RPS ]] || return 0
	record "$TARGET" "${5}_rps" "$1" "$H2_RPS"
	record "$TARGET" "${5}_cpu_us" "$1" "$H2_CPU_US"
	record "$TARGET" "${5}_dials" "$1" "$APP_DIALS_K"
	mech_record "$5" "$1"
	mech_syscall_pass "$5" "$1" run_h2load "$3" "$4" "$SYSCALL_DUR"
}
wl_h2_mux() { wl_h2 "$1" "$2" "$H2_MUX_CONNS" "$H2_MUX_STREAMS" h2_mux; }
wl_h2_one() { wl_h2 "$1" "$2" "$H2_ONE_CONNS" 1 h2_one; }

wl_dl() { # round duration path metric-prefix bytes
	run_wrk "$DL_CONNS" "$2" "$3"
	[[ -n $WRK_RPS ]] || return 0
	record "$TARGET" "${4}_mibs" "$1" "$(calc "$WRK_RPS * $5 / 1048576")"
	record "$TARGET" "${4}_cpu_us" "$1" "$(calc "$WRK_CPU_S * 1e6 / ($WRK_N * $5 / 1048576)")"
}
wl_dl64k() { wl_dl "$1" "$2" /64k dl64k 65536; }
wl_dl1m() { wl_dl "$1" "$2" /1m dl1m 1048576; }

lg() { # mode flags... : loadgen against the current target, one JSON line
	local mode=$1
	shift
	load "$TMP/loadgen" "$mode" -addr "127.0.0.1:$PORT" -sni "$SNI" -host "$HOST" -watch "$(watch_list)" "$@" 2>>"$TMP/loadgen.err" | tee -a "$TMP/loadgen.log" | tail -n 1 || true
}
jget() { jq -r "$1 // empty" <<<"$2" 2>/dev/null || true; }
check_errors() { # label json
	local e n
	e=$(jget '.errors' "$2")
	n=$(jget '.non_2xx' "$2")
	if [[ ${e:-0} != 0 || ${n:-0} != 0 ]]; then note "$TARGET $1: ${e:-0} errors, ${n:-0} non-2xx responses"; fi
}

# run_rate DURATION: the fixed-rate run, its mechanism window around the
# whole loadgen run (warm-up included), MECH_N the requests the app answered
# in it (none for the direct targets: their app is not the counting one).
run_rate() {
	local s0 s1
	s0=$(app_stats)
	mech_begin
	RATE_JSON=$(lg rate -rate "$RATE" -conns "$RATE_CONNS" -duration "${1}s" -warmup 1s)
	mech_end
	s1=$(app_stats)
	app_delta "$s0" "$s1"
	MECH_N=$APP_REQS
}
wl_rate() { # round duration
	local j
	run_rate "$2"
	j=$RATE_JSON
	[[ -n $j ]] || { note "$TARGET rate: loadgen failed"; return 0; }
	check_errors rate "$j"
	record "$TARGET" rate_p50_ms "$1" "$(jget .p50_ms "$j")"
	record "$TARGET" rate_p99_ms "$1" "$(jget .p99_ms "$j")"
	record "$TARGET" rate_max_ms "$1" "$(jget .max_ms "$j")"
	record "$TARGET" rate_cpu_us "$1" "$(calc "$(jget .watch_cpu_s "$j") * 1e6 / $(jget .samples "$j")")"
	if [[ $TARGET == applistener ]]; then
		# The same run is the baseline of the route-replacement workload.
		record "$TARGET" reload_base_max_ms "$1" "$(jget .max_ms "$j")"
		record "$TARGET" reload_base_p99_ms "$1" "$(jget .p99_ms "$j")"
	fi
	mech_record rate "$1"
	mech_syscall_pass rate "$1" run_rate "$SYSCALL_DUR"
}

wl_hs() { # round duration resume(0|1)
	local j name=hs_full flag=""
	if [[ $3 == 1 ]]; then name=hs_resumed flag=-resume; fi
	j=$(lg hs -conns "$HS_WORKERS" -duration "${2}s" $flag)
	[[ -n $j ]] || { note "$TARGET $name: loadgen failed"; return 0; }
	check_errors "$name" "$j"
	local cps
	cps=$(jget .conns_per_s "$j")
	record "$TARGET" "${name}_cps" "$1" "$cps"
	record "$TARGET" "${name}_cpu_us" "$1" "$(calc "$(jget .watch_cpu_s "$j") * 1e6 / ($cps * $(jget .watch_wall_s "$j"))")"
	if [[ $3 == 1 ]]; then record "$TARGET" hs_resumed_frac "$1" "$(jget .resumed_fraction "$j")"; fi
}
wl_hs_full() { wl_hs "$1" "$2" 0; }
wl_hs_resumed() { wl_hs "$1" "$2" 1; }

wl_ws_echo() { # round duration
	local j
	j=$(lg wsecho -conns "$WS_CONNS" -size 64 -duration "${2}s")
	[[ -n $j ]] || { note "$TARGET ws_echo: loadgen failed ($(tail -n 1 "$TMP/loadgen.err"))"; return 0; }
	check_errors ws_echo "$j"
	local mps
	mps=$(jget .msgs_per_s "$j")
	record "$TARGET" ws_echo_mps "$1" "$mps"
	record "$TARGET" ws_echo_p99_ms "$1" "$(jget .p99_ms "$j")"
	record "$TARGET" ws_echo_cpu_us "$1" "$(calc "$(jget .watch_cpu_s "$j") * 1e6 / ($mps * $(jget .watch_wall_s "$j"))")"
}

# gRPC (grpc_unary, grpc_stream): loadgen grpc, the real grpc-go client,
# against the backend app's grpc-go server (grpc_testing.TestService, h2c on
# P_APPGRPC) through each proxy's HTTP/2 port (TLS, ALPN h2, SNI =
# :authority = GRPC_HOST): applistener's route team/demo/rpc with
# "protocol":"h2c", nginx grpc_pass, HAProxy proto h2. direct-plain is the
# same app's h2c port without a proxy, plaintext: the direct rate, with the
# client and the server where they are for every proxy (both on the load
# core; with the app on the proxy's core instead, as for the HTTP rows, the
# client and server would have a core each only without a proxy, and even a
# proxy that cost nothing would stay near 0.5x). GRPC_CONNS connections x
# GRPC_STREAMS calls in flight (unary) or ping-pong streams (stream),
# saturating; a 1 s warm-up inside the run.
# - rate: calls (unary) or messages (stream; one message each way, a round
#   trip) per second that started in the measured window;
# - ratio to direct: each round's rate over direct-plain's in the same round
#   (grpc_ratios, after the rounds);
# - proxy CPU per call and busy share: over exactly the measured window
#   (loadgen -watch); the mechanism per call (context switches, allocations,
#   system calls) as for the small-request rows, divided by every call the
#   run completed (warm-up included: the mechanism window is the whole run);
# - app connections opened per 1,000 calls;
# - the load core's busy share over the whole run (/proc/stat): the client
#   and the app share it, and when it is near 100 % they, not the proxy,
#   bound the rate.
# direct-plain has no proxy: its rate, latencies and load core only.
# core_ticks CPU: "BUSY TOTAL" clock ticks of that core so far (/proc/stat).
core_ticks() {
	awk -v c="cpu$1" '$1 == c { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat
}
run_grpc() { # unary|stream duration -> GRPC_JSON, MECH_N, APP_DIALS_K, LOAD_BUSY
	local s0 s1 b0 t0 b1 t1
	s0=$(app_stats)
	read -r b0 t0 <<<"$(core_ticks "$LOAD_CPU")"
	mech_begin
	GRPC_JSON=$(load "$TMP/loadgen" grpc -mode "$1" -addr "127.0.0.1:$GRPCPORT" -sni "${SNI:+$GRPC_HOST}" -host "$GRPC_HOST" \
		-conns "$GRPC_CONNS" -streams "$GRPC_STREAMS" -size "$GRPC_SIZE" -duration "${2}s" -warmup 1s -watch "$(watch_list)" \
		2>>"$TMP/loadgen.err" | tee -a "$TMP/loadgen.log" | tail -n 1 || true)
	mech_end
	read -r b1 t1 <<<"$(core_ticks "$LOAD_CPU")"
	LOAD_BUSY=""
	((t1 <= t0)) || LOAD_BUSY=$(calc "($b1 - $b0) * 100 / ($t1 - $t0)")
	s1=$(app_stats)
	app_delta "$s0" "$s1"
	MECH_N=$(jget .total "$GRPC_JSON")
	MECH_N=${MECH_N:-0}
}
wl_grpc() { # round duration unary|stream metric-prefix
	local j r n key=calls_per_s
	[[ -n $GRPCPORT ]] || return 0
	[[ $3 == unary ]] || key=msgs_per_s
	run_grpc "$3" "$2"
	j=$GRPC_JSON
	[[ -n $j ]] || { note "$TARGET $4: loadgen failed ($(tail -n 1 "$TMP/loadgen.err"))"; return 0; }
	[[ $(jget .errors "$j") == 0 ]] || note "$TARGET $4 round $1: $(jget .errors "$j") failed calls or messages, the first: $(jget .first_error "$j")"
	r=$(jget ".$key" "$j") n=$(jget .samples "$j")
	[[ -n $r && ${n:-0} -gt 0 ]] || { note "$TARGET $4 round $1: no call completed"; return 0; }
	record "$TARGET" "${4}_rps" "$1" "$r"
	record "$TARGET" "${4}_p50_ms" "$1" "$(jget .p50_ms "$j")"
	record "$TARGET" "${4}_p99_ms" "$1" "$(jget .p99_ms "$j")"
	record "$TARGET" "${4}_load_pct" "$1" "$LOAD_BUSY"
	[[ $TARGET != direct-plain ]] || return 0
	record "$TARGET" "${4}_cpu_us" "$1" "$(calc "$(jget .watch_cpu_s "$j") * 1e6 / $n")"
	record "$TARGET" "${4}_cpu_pct" "$1" "$(jget .watch_cpu_pct "$j")"
	record "$TARGET" "${4}_dials" "$1" "$APP_DIALS_K"
	mech_record "$4" "$1"
	mech_syscall_pass "$4" "$1" run_grpc "$3" "$SYSCALL_DUR"
}
wl_grpc_unary() { wl_grpc "$1" "$2" unary grpc_unary; }
wl_grpc_stream() { wl_grpc "$1" "$2" stream grpc_stream; }
# grpc_ratios: each target's gRPC rate over direct-plain's in the same
# round, as figures of their own (grpc_unary_ratio, grpc_stream_ratio).
grpc_ratios() {
	local w
	for w in grpc_unary grpc_stream; do
		awk -F'\t' -v m="${w}_rps" -v out="${w}_ratio" '$2 == m { v[$1, $3] = $4; t[$1] = 1; r[$3] = 1 }
			END {
				for (x in t) for (k in r)
					if (x != "direct-plain" && (x, k) in v && ("direct-plain", k) in v && v["direct-plain", k] > 0)
						printf "%s\t%s\t%s\t%.6g\n", x, out, k, v[x, k] / v["direct-plain", k]
			}' "$RAW" >"$TMP/grpc_ratios.tsv"
		cat "$TMP/grpc_ratios.tsv" >>"$RAW"
	done
}

# Idle scale (idle_h1, idle_ws): IDLE_N connections opened on a freshly
# started proxy (TLS keep-alive after one request, or WebSockets after one
# echo) and held idle. Figures: the proxy's RSS (VmRSS of all its
# processes) after minus before, per connection; and the new-connection
# rate (loadgen hs) while they are held, against the rate once they are
# closed (the same process, nothing held).
IDLE_PID=""
open_idle() { # proto conns -> IDLE_JSON ; leaves IDLE_PID holding them
	local out=$TMP/idle.out i hosts=$HOST
	[[ $1 == ws ]] && hosts=$(idle_hosts)
	: >"$out"
	load "$TMP/loadgen" idle -proto "$1" -addr "127.0.0.1:$PORT" -sni "$SNI" -host "$HOST" -hosts "$hosts" \
		-conns "$2" -parallel "$IDLE_PARALLEL" -sources "$IDLE_SOURCES" -hold 30m >"$out" 2>>"$TMP/loadgen.err" &
	IDLE_PID=$!
	STARTED+=("$IDLE_PID")
	IDLE_JSON=""
	for i in $(seq 1 9000); do # up to 15 minutes
		if grep -q '^READY' "$out"; then
			IDLE_JSON=$(sed -n 's/^READY //p' "$out")
			echo "$TARGET $1: $IDLE_JSON" >>"$TMP/idle.log"
			return 0
		fi
		kill -0 "$IDLE_PID" 2>/dev/null || break
		sleep 0.1
	done
	return 1
}
fd_count() {
	local sum=0 p
	for p in $(tree_pids "$TARGET_PID"); do sum=$((sum + $(ls "/proc/$p/fd" 2>/dev/null | wc -l))); done
	echo "$sum"
}
close_idle() { # and wait (up to 60 s) until the proxy has closed its side
	[[ -n $IDLE_PID ]] || return 0
	kill -TERM "$IDLE_PID" 2>/dev/null || true
	wait "$IDLE_PID" 2>/dev/null || true
	forget "$IDLE_PID"
	IDLE_PID=""
	local i
	for i in $(seq 1 120); do
		(($(fd_count) < 2000)) && break
		sleep 0.5
	done
	sleep 1
}
# gc_cycles: applistener's completed GC cycles so far (admin metrics); empty
# for the other proxies.
gc_cycles() {
	[[ $TARGET == applistener ]] || return 0
	curl -fs --max-time 2 "http://127.0.0.1:$P_ADMIN/metrics" 2>/dev/null | awk '$1=="go_gc_duration_seconds_count"{print $2}'
}
# idle_hs: the new-connection rate (full handshakes + one request), -> HS_CPS;
# applistener's GC cycles per second meanwhile -> HS_GC (for idle.log)
idle_hs() {
	local j g0 g1 t0 t1
	g0=$(gc_cycles) t0=$(date +%s.%N)
	j=$(lg hs -conns "$HS_WORKERS" -duration "${SHORT_DUR}s")
	g1=$(gc_cycles) t1=$(date +%s.%N)
	check_errors "$1" "$j"
	HS_CPS=$(jget .conns_per_s "$j")
	HS_GC=""
	if [[ -n $g0 && -n $g1 ]]; then HS_GC=$(calc "($g1 - $g0) / ($t1 - $t0)"); fi
}
wl_idle() { # round proto(http1|ws) name count
	local before after open hs_held gc_held n=$4
	sleep 0.5
	before=$(rss_kib)
	if ! open_idle "$2" "$n"; then
		note "$TARGET $3: could not open the connections ($(tail -n 1 "$TMP/loadgen.err"))"
		close_idle
		return 0
	fi
	sleep 2
	after=$(rss_kib)
	open=$(jget .open "$IDLE_JSON")
	if [[ ${open:-0} -lt $n ]]; then note "$TARGET $3: only ${open:-0} of $n opened ($(jget .first_error "$IDLE_JSON"))"; fi
	if [[ ${open:-0} -gt 0 ]]; then
		record "$TARGET" "${3}_kib" "$1" "$(calc "($after - $before) / $open")"
		record "$TARGET" "${3}_open" "$1" "$open"
	fi
	idle_hs "$3"
	hs_held=$HS_CPS gc_held=$HS_GC
	close_idle
	idle_hs "$3"
	record "$TARGET" "${3}_hs_cps" "$1" "$hs_held"
	if [[ -n $hs_held && -n $HS_CPS ]]; then
		record "$TARGET" "${3}_hs_ratio" "$1" "$(calc "$hs_held / $HS_CPS")"
		echo "$TARGET $3 round $1: RSS $before -> $after KiB with $open held; new connections/s $hs_held held, $HS_CPS none${HS_GC:+; GC cycles/s $gc_held held, $HS_GC none}" >>"$TMP/idle.log"
	fi
}

# applistener only: the routes file is replaced by one with 10,000 more
# routes (the benchmarked one unchanged) while a 5,000 req/s load runs; the
# longest request stall is compared with the same run without a change.
routes_installed() {
	curl -fs --max-time 1 "http://127.0.0.1:$P_ADMIN/metrics" 2>/dev/null | awk '$1=="applistener_routes"{print $2}'
}
wl_reload() { # round
	local j at
	put_routes routes_doc 0 "base-$1"
	sleep 1
	routes_doc "$RELOAD_ROUTES" "big-$1" >"$TMP/routes.big.json"
	at=$(calc "1 + $RATE_DUR / 3")
	# Replace the file at a third of the measured run, then watch the
	# route gauge until the new table is in (the file is polled every 250 ms).
	(
		sleep "$at"
		t0=$(now)
		mv -f "$TMP/routes.big.json" "$TMP/routes.json"
		# Poll every 100 ms: with 10,000 instances a /metrics scrape costs the
		# proxy ~10 ms of its only core, and scraping every 20 ms would
		# measure the scrapes rather than the table change.
		for _ in $(seq 1 40); do
			n=$(routes_installed)
			if [[ ${n:-0} -ge $((RELOAD_ROUTES + IDLE_APPS + NOISY_ROUTES + GRPC_ROUTES)) ]]; then
				calc "($(now) - $t0) * 1000" >"$TMP/reload.applied"
				exit 0
			fi
			sleep 0.1
		done
	) &
	local mover=$!
	: >"$TMP/reload.applied"
	j=$(lg rate -rate "$RATE" -conns "$RATE_CONNS" -duration "${RATE_DUR}s" -warmup 1s)
	wait "$mover" || true
	check_errors reload "$j"
	local seen
	seen=$(cat "$TMP/reload.applied")
	if [[ -z $seen ]]; then
		note "applistener reload round $1: the 10,000-route table was not seen installed (applistener_routes) within 4 s of the file change"
	else
		record "$TARGET" reload_seen_ms "$1" "$seen"
	fi
	record "$TARGET" reload_max_ms "$1" "$(jget .max_ms "$j")"
	record "$TARGET" reload_p99_ms "$1" "$(jget .p99_ms "$j")"
	echo "reload round $1: file replaced ${at}s into the run (after the 1 s warm-up: $(calc "$at - 1")s), new table seen after ${seen:-?} ms; the slowest request was sent $(jget .max_at_s "$j")s after the warm-up and took $(jget .max_ms "$j") ms" >>"$TMP/reload.log"
	put_routes routes_doc 0 "after-$1"
	sleep 1
}

# MR_ROUTES routes installed, the first MR_LIVE of them pointing at the app
# (applistener: each its own instance and pool, installed after the
# reference run; nginx and HAProxy: each its own upstream or backend with
# keep-alive, configured from the start, see mr_map); loadgen's routes mode
# with MR_CONNS keep-alive connections, saturating, first all on one of those
# routes, then spread evenly over the MR_LIVE routes (one connection each,
# SNI = Host = the route's name). Same process, table, tool and concurrency:
# only the spread differs. App dials are counted over the measured window.
# Before the table is installed, the same load on the one route of the usual
# table (team--demo--web) is the reference for the table's size alone.
MR_PATTERN='ws%05[1]d--sb%05[1]d--web.apps.test'
wl_manyroutes() { # round duration
	local i n j0 j1 j2
	# The same 1,000 clients on the benchmarked route of the usual
	# one-route table first: what 10,000 installed routes cost by themselves.
	j0=$(lg routes -host-pattern "$HOST" -routes 1 -conns "$MR_CONNS" -duration "${2}s" -warmup 1s -app-stats "http://127.0.0.1:$P_APPSTATS/stats")
	check_errors "manyroutes one-route table" "$j0"
	record "$TARGET" manyroutes_base_rps "$1" "$(jget .rps "$j0")"
	if [[ $TARGET == applistener ]]; then
		put_routes routes_doc "$MR_ROUTES" "many-$1" "$MR_LIVE"
		for i in $(seq 1 100); do
			n=$(routes_installed)
			[[ ${n:-0} -lt $((MR_ROUTES + IDLE_APPS + NOISY_ROUTES + GRPC_ROUTES)) ]] || break
			sleep 0.1
		done
		[[ ${n:-0} -ge $((MR_ROUTES + IDLE_APPS + NOISY_ROUTES + GRPC_ROUTES)) ]] || { note "applistener manyroutes: the $MR_ROUTES-route table was not installed"; return 0; }
	fi
	lg routes -host-pattern "$MR_PATTERN" -routes "$MR_LIVE" -conns "$MR_CONNS" -duration 1s -warmup 0s >/dev/null
	# One route then spread in odd rounds, the other way round in even
	# ones, so that an effect of the order cancels out over the rounds.
	if (($1 % 2)); then
		j1=$(lg routes -host-pattern "$MR_PATTERN" -routes 1 -conns "$MR_CONNS" -duration "${2}s" -warmup 1s -app-stats "http://127.0.0.1:$P_APPSTATS/stats")
		j2=$(lg routes -host-pattern "$MR_PATTERN" -routes "$MR_LIVE" -conns "$MR_CONNS" -duration "${2}s" -warmup 1s -app-stats "http://127.0.0.1:$P_APPSTATS/stats")
	else
		j2=$(lg routes -host-pattern "$MR_PATTERN" -routes "$MR_LIVE" -conns "$MR_CONNS" -duration "${2}s" -warmup 1s -app-stats "http://127.0.0.1:$P_APPSTATS/stats")
		j1=$(lg routes -host-pattern "$MR_PATTERN" -routes 1 -conns "$MR_CONNS" -duration "${2}s" -warmup 1s -app-stats "http://127.0.0.1:$P_APPSTATS/stats")
	fi
	[[ -n $j1 && -n $j2 ]] || { note "$TARGET manyroutes: loadgen failed ($(tail -n 1 "$TMP/loadgen.err"))"; return 0; }
	check_errors "manyroutes 1 route" "$j1"
	check_errors "manyroutes $MR_LIVE routes" "$j2"
	local r1 r2
	r1=$(jget .rps "$j1") r2=$(jget .rps "$j2")
	record "$TARGET" manyroutes_one_rps "$1" "$r1"
	record "$TARGET" manyroutes_one_cpu_us "$1" "$(calc "$(jget .watch_cpu_s "$j1") * 1e6 / ($r1 * $(jget .watch_wall_s "$j1"))")"
	record "$TARGET" manyroutes_one_dials "$1" "$(calc "$(jget .app_dials "$j1") * 1000 / $(jget .app_requests "$j1")")"
	record "$TARGET" manyroutes_rps "$1" "$r2"
	record "$TARGET" manyroutes_ratio "$1" "$(calc "$r2 / $r1")"
	record "$TARGET" manyroutes_p50_ms "$1" "$(jget .p50_ms "$j2")"
	record "$TARGET" manyroutes_p99_ms "$1" "$(jget .p99_ms "$j2")"
	record "$TARGET" manyroutes_cpu_us "$1" "$(calc "$(jget .watch_cpu_s "$j2") * 1e6 / ($r2 * $(jget .watch_wall_s "$j2"))")"
	record "$TARGET" manyroutes_dials "$1" "$(calc "$(jget .app_dials "$j2") * 1000 / $(jget .app_requests "$j2")")"
	[[ $TARGET != applistener ]] || { put_routes routes_doc 0 "after-many-$1"; sleep 1; }
}

# Noisy neighbours (noisy_h1, noisy_h2, noisy10_h1): several instances
# behind the one listener on the proxy's core. Instance A (team--a--web, the
# usual app) is flooded; each quiet instance (team--bK--web, their own app
# on P_APPQ) gets one keep-alive connection sending one small GET every
# 10 ms (loadgen quiet: open loop, one request at a time; HTTP/2: one
# stream at a time on one connection).
# - Phase 1: the quiet client alone, NOISY_DUR seconds after a 1 s warm-up.
# - Phase 2: A flooded (HTTP/1.1: wrk -t1 -c100; HTTP/2: h2load -t1 -c4
#   -m25, the same 100 requests in flight, multiplexed, so that the
#   flood's requests arrive on few connections as from an HTTP/2 client,
#   and admitting them per connection would not be enough) for
#   NOISY_DUR + 3 s; the quiet client starts 1 s in and measures as in
#   phase 1.
# The quiet client and the quiet app run on the proxy's core, one step
# above the proxy (SCHED_RR priority RT_PRIO+1, or one nice step lower):
# - not on the load core: wrk (or h2load) and A's app keep it fully busy,
#   and the kernel's real-time throttle (sched_rt_runtime_us, 95 %) then
#   stops every real-time task there for the last 50 ms of each second, the
#   quiet client too if it ran there (tried: B's max under the flood was
#   47-53 ms for every proxy, and the client's own send lateness p99 7-17
#   ms); at the flood's priority it would also wait out SCHED_RR's 100 ms
#   slices. Running the flood at nice instead left it to compete with the
#   machine's other work (wrk fell from ~27,000 to ~5,000 req/s here).
# - on the proxy's core they take ~1-5 % of it (9 x 100 requests a second
#   at most), the same for every proxy, and preempt the proxy the moment a
#   response for B arrives, so B's latency is the proxy's.
# The proxy's core hits the same throttle if the proxy is over 95 % busy:
# its busy share is recorded, and a note says when it was that high.
# Figures: B's p50/p99/max alone and under the flood, the ratio of the
# p99s, A's req/s under the flood, the proxy core's busy share over phase
# 2, and how late the quiet client itself sent (its own wake-ups, not the
# proxy's). noisy10_h1 (nine quiet instances): the worst and the median
# of their p99s alone and under the flood, their ratios, and the worst of
# the nine per-instance ratios.
# spin_start / spin_stop: a busy loop at SCHED_IDLE on the proxy's core for
# the noisy-neighbour workloads (BENCH_NOISY_SPIN=1, the default). Any other
# task preempts it at once, so it takes nothing from the proxy, the quiet
# client or the quiet app; it keeps the core from halting while they wait.
# Measured on this project's 2-vCPU VM: with the core idle between the
# quiet requests, the "alone" phase's p99 swung from 0.5 to 6 ms between
# runs (the host's latency in waking a halted vCPU, outside any proxy),
# which made the flooded / alone ratio meaningless; with the spinner the
# same phase stayed at 0.4-1.6 ms. It is the same for every target, like
# booting with idle=poll.
spin_start() {
	SPIN_PID=""
	[[ ${BENCH_NOISY_SPIN:-1} == 1 ]] || return 0
	chrt -i 0 taskset -c "$PROXY_CPU" sh -c 'while :; do :; done' &
	SPIN_PID=$!
	STARTED+=("$SPIN_PID")
}
spin_stop() {
	[[ -n ${SPIN_PID:-} ]] || return 0
	kill -TERM "$SPIN_PID" 2>/dev/null || true
	wait "$SPIN_PID" 2>/dev/null || true
	forget "$SPIN_PID"
	SPIN_PID=""
}
noisy_quiet_host() { echo "team--b$1--web.apps.test"; }
noisy_quiet_hosts() { # count
	local k out=""
	for ((k = 1; k <= $1; k++)); do out+="${out:+,}$(noisy_quiet_host "$k")"; done
	echo "$out"
}
quiet_lg() { # http1|h2 hosts duration: one JSON line
	local port=$PORT
	[[ $1 != h2 ]] || port=$H2PORT
	local qlog=()
	[[ -z ${NOISY_QLOG:-} ]] || qlog=(-log "$NOISY_QLOG")
	PIN_SCHED=$QUIET_SCHED PIN_PRIO=$QUIET_PRIO PIN_NICE=$QUIET_NICE run_pinned "$PROXY_CPU" "$TMP/loadgen" quiet -proto "$1" -addr "127.0.0.1:$port" \
		-sni "$SNI" -hosts "$2" -rate "$NOISY_RATE" -duration "${3}s" -warmup 1s "${qlog[@]}" 2>>"$TMP/loadgen.err" |
		tee -a "$TMP/loadgen.log" | tail -n 1 || true
}
noisy_flood_start() { # h1|h2 seconds: floods A in the background -> FLOOD_PID
	if [[ $1 == h2 ]]; then
		load h2load -t1 -c"$NOISY_H2_CONNS" -m"$NOISY_H2_STREAMS" -D "$2" --connect-to "127.0.0.1:$H2PORT" \
			"https://$NOISY_A:$H2PORT/" >"$TMP/flood.out" 2>&1 &
	else
		load wrk -t1 -c"$NOISY_CONNS" -d"${2}s" -s "$BENCH/sni.lua" "$SCHEME://$NOISY_A:$PORT/" >"$TMP/flood.out" 2>&1 &
	fi
	FLOOD_PID=$!
	STARTED+=("$FLOOD_PID")
}
noisy_flood_wait() { # h1|h2 label -> FLOOD_RPS (empty when the flood failed)
	local out bad proto
	wait "$FLOOD_PID" || true
	forget "$FLOOD_PID"
	out=$(cat "$TMP/flood.out")
	echo "$out" >>"$TMP/flood.log"
	if [[ $1 == h2 ]]; then
		FLOOD_RPS=$(awk '/^finished in/{for (i = 1; i <= NF; i++) if ($i == "req/s,") print $(i-1)}' <<<"$out")
		proto=$(awk -F': ' '/^Application protocol:/{print $2}' <<<"$out")
		[[ $proto == h2 ]] || { note "$TARGET $2: the h2load flood negotiated '${proto:-nothing}', not h2"; FLOOD_RPS=""; }
		bad=$(awk '/^requests:/{if ($10 + $12 + $14 > 0) print} /^status codes:/{if ($5 + $7 + $9 > 0) print}' <<<"$out")
	else
		FLOOD_RPS=$(awk '/^Requests\/sec:/{print $2}' <<<"$out")
		bad=$(awk '/Non-2xx|Socket errors/' <<<"$out")
	fi
	[[ -z $bad ]] || note "$TARGET $2 flood: $(tr '\n' ' ' <<<"$bad")"
	[[ -n $FLOOD_RPS ]] || note "$TARGET $2: the flood failed: $(tail -n 2 <<<"$out" | tr '\n' ' ')"
}
wl_noisy() { # round duration h1|h2 name quiet-count
	local r=$1 d=$2 proto=$3 name=$4 nq=$5 lp=http1 hosts j1 j2 c0 c1 t0 t1 a p busy
	[[ $proto != h2 ]] || lp=h2
	[[ $proto != h2 || -n $H2PORT ]] || return 0
	hosts=$(noisy_quiet_hosts "$nq")
	spin_start
	j1=$(quiet_lg "$lp" "$hosts" "$d")
	[[ -n $j1 ]] || { spin_stop; note "$TARGET $name: the quiet client failed alone ($(tail -n 1 "$TMP/loadgen.err"))"; return 0; }
	check_errors "$name quiet client alone" "$j1"
	c0=$(cpu_ticks) t0=$(now)
	noisy_flood_start "$proto" $((d + 3))
	sleep 1
	noisy_profile_start "$name" "$r" "$d"
	j2=$(quiet_lg "$lp" "$hosts" "$d")
	noisy_profile_wait
	noisy_flood_wait "$proto" "$name"
	c1=$(cpu_ticks) t1=$(now)
	spin_stop
	[[ -n $j2 ]] || { note "$TARGET $name: the quiet client failed under the flood ($(tail -n 1 "$TMP/loadgen.err"))"; return 0; }
	check_errors "$name quiet client under the flood" "$j2"
	record "$TARGET" "${name}_a_rps" "$r" "$FLOOD_RPS"
	busy=$(calc "($c1 - $c0) / $CLK_TCK / ($t1 - $t0) * 100")
	record "$TARGET" "${name}_busy_pct" "$r" "$busy"
	[[ -z $FLOOD_RPS || $FLOOD_RPS == 0 ]] || record "$TARGET" "${name}_us_per_req" "$r" "$(calc "$busy / 100 * 1000000 / $FLOOD_RPS")"
	if [[ $SCHED == rr ]] && awk -v b="$busy" 'BEGIN{exit !(b >= 93)}'; then
		note "$TARGET $name round $r: the proxy was ${busy} % busy under the flood; at over 95 % the real-time throttle stops it for 50 ms a second, which shows in B's max and p99"
	fi
	record "$TARGET" "${name}_late_ms" "$r" "$(jget .late_p99_ms "$j2")"
	if awk -v l="$(jget .late_p99_ms "$j2")" 'BEGIN{exit !(l > 2)}'; then
		note "$TARGET $name round $r: the quiet client itself sent late under the flood (p99 $(jget .late_p99_ms "$j2") ms, timer granularity ~1 ms): its core was not its own (the real-time throttle, or other real-time work on core $PROXY_CPU), and B's figures include that"
	fi
	if ((nq == 1)); then
		for p in p50 p99 max; do
			record "$TARGET" "${name}_alone_${p}_ms" "$r" "$(jget ".${p}_ms" "$j1")"
			record "$TARGET" "${name}_flood_${p}_ms" "$r" "$(jget ".${p}_ms" "$j2")"
		done
		a=$(jget .p99_ms "$j1")
		[[ -z $a || $a == 0 ]] || record "$TARGET" "${name}_ratio" "$r" "$(calc "$(jget .p99_ms "$j2") / $a")"
	else
		for p in worst median; do
			record "$TARGET" "${name}_alone_${p}_p99_ms" "$r" "$(jget ".${p}_p99_ms" "$j1")"
			record "$TARGET" "${name}_flood_${p}_p99_ms" "$r" "$(jget ".${p}_p99_ms" "$j2")"
			a=$(jget ".${p}_p99_ms" "$j1")
			[[ -z $a || $a == 0 ]] || record "$TARGET" "${name}_${p}_ratio" "$r" "$(calc "$(jget ".${p}_p99_ms" "$j2") / $a")"
		done
		# The worst of the per-instance ratios (flood p99 / alone p99, the
		# same instance): the issue's bound holds for every quiet instance.
		record "$TARGET" "${name}_inst_ratio" "$r" "$(jq -n --argjson a "$j1" --argjson b "$j2" \
			'[range(0; $a.per_host | length) | select($a.per_host[.].p99_ms > 0) | $b.per_host[.].p99_ms / $a.per_host[.].p99_ms] | max // empty' 2>/dev/null)"
	fi
	echo "$TARGET $name round $r: alone $(jq -c 'del(.per_host)' <<<"$j1"); flood $(jq -c 'del(.per_host)' <<<"$j2"); A $FLOOD_RPS req/s" >>"$TMP/noisy.log"
}
# noisy_profile_start / noisy_profile_wait (BENCH_NOISY_PROFILE=1, the
# applistener targets): a CPU profile of the proxy over the quiet client's
# measured run under the flood (BENCH_NOISY_TRACE=1: an execution trace of
# 2 s of it instead, for `go tool trace -pprof=sched`, where goroutines
# waited to run), and the quiet client's requests one by one (*.quiet.tsv:
# host, send and done times, status, to set beside the proxy's access log,
# bench/noisy_join.py), for where the flood's extra CPU per request
# goes, and the proxy's metrics before and after it; written to the
# results' profiles/ as <workload>-<target>-r<round>.*.
noisy_profile_start() { # name round seconds
	NOISY_PROF_PID=""
	[[ ${BENCH_NOISY_PROFILE:-0} == 1 && $TARGET == applistener* ]] || return 0
	mkdir -p "$RESULTS/profiles"
	local out=$RESULTS/profiles/$1-$TARGET-r$2
	if [[ ${BENCH_NOISY_TRACE:-0} == 1 ]]; then # an execution trace of 2 s instead
		(sleep 1; curl -fs -o "$out.trace" "http://127.0.0.1:$P_ADMIN/debug/pprof/trace?seconds=2") &
	else
		(sleep 1; curl -fs -o "$out.pprof" "http://127.0.0.1:$P_ADMIN/debug/pprof/profile?seconds=$(($3 - 1))" &&
			go tool pprof -top -nodecount=40 "$TMP/applistener" "$out.pprof" >"$out.txt" 2>&1) &
	fi
	NOISY_PROF_PID=$!
	NOISY_PROF_OUT=$out
	NOISY_QLOG=$out.quiet.tsv
	curl -fs "http://127.0.0.1:$P_ADMIN/metrics" >"$out.metrics.before" || true
}
noisy_profile_wait() {
	[[ -n ${NOISY_PROF_PID:-} ]] || return 0
	curl -fs "http://127.0.0.1:$P_ADMIN/metrics" >"$NOISY_PROF_OUT.metrics.after" || true
	wait "$NOISY_PROF_PID" || true
	# The quiet instances' access-log lines, for noisy_join.py.
	grep -F 'msg=access' "$TMP/applistener.log" 2>/dev/null | grep -F ' sandbox=b' >"$NOISY_PROF_OUT.access" || true
	NOISY_PROF_PID="" NOISY_QLOG=""
}
wl_noisy_h1() { wl_noisy "$1" "$2" h1 noisy_h1 1; }
wl_noisy_h2() { wl_noisy "$1" "$2" h2 noisy_h2 1; }
wl_noisy10_h1() { wl_noisy "$1" "$2" h1 noisy10_h1 "$NOISY_QUIET"; }

workloads_for() {
	local all w
	all=$(workloads_all "$1")
	[[ -n ${BENCH_WORKLOADS:-} ]] || { echo "$all"; return; }
	for w in $all; do
		if [[ " $BENCH_WORKLOADS " == *" $w "* ]]; then echo -n "$w "; fi
	done
	echo
}
workloads_all() {
	case $1 in
	direct-plain) echo "small rate dl64k dl1m ws_echo grpc_unary grpc_stream" ;;
	direct-tls) echo "small rate dl64k dl1m hs_full hs_resumed ws_echo" ;;
	caddy) echo "small rate dl64k dl1m hs_full hs_resumed ws_echo" ;;
	applistener) echo "idle_h1 idle_ws small many h2_mux h2_one rate dl64k dl1m hs_full hs_resumed ws_echo grpc_unary grpc_stream manyroutes noisy_h1 noisy_h2 noisy10_h1" ;;
	applistener-nofair) echo "small many h2_mux h2_one noisy_h1 noisy_h2 noisy10_h1" ;;
	*) echo "idle_h1 idle_ws small many h2_mux h2_one rate dl64k dl1m hs_full hs_resumed ws_echo grpc_unary grpc_stream manyroutes noisy_h1 noisy_h2 noisy10_h1" ;;
	esac
}

run_workload() { # name round
	case $1 in
	idle_h1) wl_idle "$2" http1 idle_h1 "$IDLE_N_H1" ;;
	idle_ws) wl_idle "$2" ws idle_ws "$IDLE_N_WS" ;;
	small) wl_small "$2" "$DUR" ;;
	many) wl_many "$2" "$DUR" ;;
	h2_mux) wl_h2_mux "$2" "$DUR" ;;
	h2_one) wl_h2_one "$2" "$DUR" ;;
	rate) wl_rate "$2" "$RATE_DUR" ;;
	dl64k) wl_dl64k "$2" "$SHORT_DUR" ;;
	dl1m) wl_dl1m "$2" "$SHORT_DUR" ;;
	hs_full) wl_hs_full "$2" "$SHORT_DUR" ;;
	hs_resumed) wl_hs_resumed "$2" "$SHORT_DUR" ;;
	ws_echo) wl_ws_echo "$2" "$SHORT_DUR" ;;
	grpc_unary) wl_grpc_unary "$2" "$DUR" ;;
	grpc_stream) wl_grpc_stream "$2" "$DUR" ;;
	manyroutes) wl_manyroutes "$2" "$DUR" ;;
	noisy_h1) wl_noisy_h1 "$2" "$NOISY_DUR" ;;
	noisy_h2) wl_noisy_h2 "$2" "$NOISY_DUR" ;;
	noisy10_h1) wl_noisy10_h1 "$2" "$NOISY_DUR" ;;
	esac
}

# ---------------------------------------------------------------- profiles
# applistener under one workload, with a CPU profile (a heap profile for
# idle WebSockets) taken from its admin endpoint while the load runs.
profile_workload() { # workload
	local w=$1 out=$RESULTS/profiles/$1.txt prof=$TMP/$1.pprof
	local pdur=$((PROFILE_SECONDS + 2)) cpid
	start_target applistener
	[[ $w == idle_* ]] || wl_warmup
	{
		echo "# applistener profile: workload $w ($(date -u +%FT%TZ))"
		echo "# GOMAXPROCS=1, pinned to core $PROXY_CPU; load generator and backend on core $LOAD_CPU"
		echo "# why: ${PROFILE_WHY:-}"
	} >"$out"
	case $w in
	idle_h1 | idle_ws)
		local proto=http1 n=$IDLE_N_H1
		[[ $w == idle_ws ]] && proto=ws n=$IDLE_N_WS
		open_idle "$proto" "$n" || true
		sleep 2
		curl -fs -o "$prof" "http://127.0.0.1:$P_ADMIN/debug/pprof/heap?gc=1" || true
		{
			echo "# (heap profile, in use after GC, with $(jget .open "$IDLE_JSON") idle $proto connections held)"
			echo "# goroutines: $(curl -fs "http://127.0.0.1:$P_ADMIN/debug/pprof/goroutine?debug=1" | head -n 1)"
			echo "# RSS of the process: $(rss_kib) KiB"
			go tool pprof -top -nodecount=20 -sample_index=inuse_space "$TMP/applistener" "$prof" 2>&1 || true
		} >>"$out"
		close_idle
		stop_target
		return 0
		;;
	reload)
		# The window spans the replacement of the table under 5,000 req/s.
		put_routes routes_doc 0 base-profile
		sleep 1.5
		routes_doc "$RELOAD_ROUTES" big-profile >"$TMP/routes.big.json"
		echo "# (3 s window; the 10,000-route file replaces the table 1 s into it, under $RATE req/s)" >>"$out"
		(sleep 1; curl -fs -o "$prof" "http://127.0.0.1:$P_ADMIN/debug/pprof/profile?seconds=3") &
		cpid=$!
		(sleep 2; mv -f "$TMP/routes.big.json" "$TMP/routes.json") &
		local mover=$!
		lg rate -rate "$RATE" -conns "$RATE_CONNS" -duration 4s -warmup 0.5s >/dev/null
		wait "$cpid" || true
		wait "$mover" || true
		stop_target
		{
			echo
			echo "## top 20 by flat CPU"
			go tool pprof -top -nodecount=20 "$TMP/applistener" "$prof" 2>&1 || true
			echo
			echo "## top 20 by cumulative CPU"
			go tool pprof -top -cum -nodecount=20 "$TMP/applistener" "$prof" 2>&1 || true
			echo
			echo "## top 20 by cumulative CPU, control plane only (focus: routes, control, slog, logsink)"
			go tool pprof -top -cum -nodecount=20 -focus='applistener/(routes|control|internal/logsink)|log/slog' "$TMP/applistener" "$prof" 2>&1 || true
		} >>"$out"
		return 0
		;;
	esac
	echo "# CPU profile over ${PROFILE_SECONDS}s while the workload runs (started 1 s into a $((PROFILE_SECONDS + 2))s run)" >>"$out"
	(sleep 1; curl -fs -o "$prof" "http://127.0.0.1:$P_ADMIN/debug/pprof/profile?seconds=$PROFILE_SECONDS") &
	cpid=$!
	RECORD=0
	case $w in
	rate) wl_rate 0 "$pdur" ;;
	*) "wl_$w" 0 "$pdur" ;;
	esac
	RECORD=1
	wait "$cpid" || true
	stop_target
	{
		echo
		echo "## top 20 by flat CPU"
		go tool pprof -top -nodecount=20 "$TMP/applistener" "$prof" 2>&1 || true
		echo
		echo "## top 20 by cumulative CPU"
		go tool pprof -top -cum -nodecount=20 "$TMP/applistener" "$prof" 2>&1 || true
	} >>"$out"
}

# ---------------------------------------------------------------- main
START=$(date +%s)
install_tools
mech_setup
build
fair_targets
certs
mkdir -p "$RESULTS/profiles"

for p in $P_APP $P_APPSTATS $P_APPQ $P_APPGRPC $P_AL $P_ADMIN $P_NGINX $P_HAPROXY $P_CADDY $P_DTLS $P_DPLAIN $P_NGINX_H2 $P_HAPROXY_H2; do
	port_free "$p" || die "port $p is in use (set BENCH_PORT_BASE)"
done

# File descriptors: the proxy holds two per idle WebSocket, the load tool
# one. As root the hard limit is raised to fs.nr_open; every process started
# here inherits it (Go programs raise their soft limit to it themselves).
# Where that is not allowed (a container without CAP_SYS_RESOURCE), the
# idle workloads hold what the limit allows, with 2,000 descriptors to spare:
# NOFILE - 2000 TLS connections, half as many WebSockets (two descriptors
# each in the proxy), and say so in the notes.
if [[ $(id -u) == 0 ]]; then ulimit -Hn "$(cat /proc/sys/fs/nr_open)" 2>/dev/null || true; fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
IDLE_N_H1=$IDLE_N IDLE_N_WS=$IDLE_N
if ((NOFILE - 2000 < IDLE_N_H1)); then
	IDLE_N_H1=$(( (NOFILE - 2000) / 1000 * 1000 ))
	note "idle_h1: the open-file limit is $NOFILE (its hard limit could not be raised), so $IDLE_N_H1 idle connections are held instead of $IDLE_N"
fi
if (((NOFILE - 2000) / 2 < IDLE_N_WS)); then
	IDLE_N_WS=$(( (NOFILE - 2000) / 2 / 1000 * 1000 ))
	note "idle_ws: the open-file limit is $NOFILE (its hard limit could not be raised), so $IDLE_N_WS idle WebSockets are held instead of $IDLE_N"
fi
CONN_LIMIT=$(( (IDLE_N_H1 > IDLE_N_WS ? IDLE_N_H1 : IDLE_N_WS) + 4000 ))

start_backend
((NOISY == 0)) || start_quiet_backend
log "rounds=$ROUNDS durations: small ${DUR}s, others ${SHORT_DUR}s, fixed rate ${RATE_DUR}s; idle connections $IDLE_N_H1 TLS, $IDLE_N_WS WebSockets (fd limit $NOFILE); targets: $TARGETS"

for round in $(seq 1 "$ROUNDS"); do
	for t in $TARGETS; do
		[[ -n $(workloads_for "$t" | tr -d ' ') || $t != applistener-nofair ]] || continue
		log "round $round/$ROUNDS: $t"
		start_target "$t"
		wl=$(workloads_for "$t")
		# The idle workloads first, each on a freshly started process; then
		# a warm-up and the rest.
		fresh=1
		for w in $wl; do
			[[ $w == idle_* ]] || continue
			((fresh)) || { stop_target; start_target "$t"; }
			run_workload "$w" "$round"
			fresh=0
		done
		rest=""
		for w in $wl; do [[ $w == idle_* ]] || rest+="$w "; done
		if [[ -n $rest || ( $t == applistener && ( -z ${BENCH_WORKLOADS:-} || " $BENCH_WORKLOADS " == *" reload "* ) ) ]]; then
			((fresh)) || { stop_target; start_target "$t"; }
			wl_warmup
		fi
		for w in $rest; do
			run_workload "$w" "$round"
		done
		if [[ $t == applistener && ( -z ${BENCH_WORKLOADS:-} || " $BENCH_WORKLOADS " == *" reload "* ) ]]; then wl_reload "$round"; fi
		stop_target
	done
done

((GRPC == 0)) || grpc_ratios

# Machine and run description.
META=$TMP/meta.tsv
{
	printf 'machine\t%s\n' "nproc $NPROC; $(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo); kernel $(uname -r); $(go version | awk '{print $3}'); $(date -u +%FT%TZ)"
	printf 'tools\t%s\n' "$("$NGINX" -v 2>&1 | sed 's/.*: //'); HAProxy $("$HAPROXY" -v | awk 'NR==1{print $3}'); Caddy $CADDY_VERSION; $(wrk -v 2>&1 | awk 'NR==1{print $1, $2}'); $(h2load --version 2>&1 | awk 'NR==1{print $1, $2}'); $(openssl version | awk '{print $1, $2}')"
	printf 'run\t%s\n' "$ROUNDS round(s), interleaved (every target once per round); runs of ${DUR}s (small requests), ${SHORT_DUR}s (downloads, handshakes, WebSocket echo), ${RATE_DUR}s (fixed rate)$( ((NOISY == 0)) || echo ", ${NOISY_DUR}s per noisy-neighbour phase"), after warm-ups; quick=$QUICK; took $(( $(date +%s) - START ))s"
	printf 'pinning\t%s\n' "proxy under test on core $PROXY_CPU (one worker/thread, GOMAXPROCS=1); load generator (wrk -t1, Go tools with GOMAXPROCS=1) and backend app (GOMAXPROCS=1) on core $LOAD_CPU; $SCHED_DESC$( ((NOISY == 0)) || echo "; noisy-neighbour quiet client and quiet app on core $PROXY_CPU, one step above the proxy (priority $QUIET_PRIO / nice $QUIET_NICE)")"
	printf 'TLS negotiated by an OpenSSL client\t%s\n' "$(awk -F'\t' '{sep = (NR > 1) ? "; " : ""; printf "%s%s: %s", sep, $1, $2}' "$TMP/negotiated.tsv" 2>/dev/null)"
	printf 'load average at the end\t%s\n' "$(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine adds noise)"
} >"$META"

# The results are written before the profiles are taken (and again after,
# with their notes), so that a failed profile never loses a run's figures.
write_results() {
	# The inputs are kept beside the outputs, so the tables can be rebuilt:
	#   go run ./bench/cmd/benchreport -raw bench/results/latest.raw.tsv \
	#     -meta bench/results/latest.meta.tsv -notes bench/results/latest.notes.txt \
	#     -md bench/results/latest.md -json bench/results/latest.json
	cp "$RAW" "$RESULTS/latest.raw.tsv"
	cp "$META" "$RESULTS/latest.meta.tsv"
	cp "$NOTES" "$RESULTS/latest.notes.txt"
	"$TMP/benchreport" -raw "$RAW" -meta "$META" -notes "$NOTES" -md "$RESULTS/latest.md" -json "$RESULTS/latest.json"
}
write_results

if [[ $PROFILE == 1 && " $TARGETS " == *" applistener "* && " $TARGETS " == *" haproxy "* ]]; then
	rm -f "$RESULTS"/profiles/*.txt
	"$TMP/benchreport" -raw "$RAW" -behind >"$TMP/behind.tsv"
	behind=$(cut -f1 "$TMP/behind.tsv")
	while IFS=$'\t' read -r w why; do
		[[ -n $w && $w != reload ]] || continue
		log "profiling applistener under $w (behind HAProxy: $why)"
		PROFILE_WHY="behind HAProxy in this run: $why"
		profile_workload "$w"
	done <"$TMP/behind.tsv"
	log "profiling applistener during a 10,000-route replacement"
	PROFILE_WHY="applistener only: where the request stall of a route-table replacement goes"
	profile_workload reload
	while IFS=$'\t' read -r w why; do
		[[ -n $w ]] && note "applistener behind HAProxy in $w ($why): profile in bench/results/profiles/$w.txt"
	done <"$TMP/behind.tsv"
fi

cat "$TMP/reload.log" >>"$NOTES" 2>/dev/null || true
write_results
log "done in $(( $(date +%s) - START ))s"
cat "$RESULTS/latest.md"
