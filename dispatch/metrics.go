package dispatch

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/internal/buckets"
)

type metrics struct {
	requests         *prometheus.CounterVec
	denials          *prometheus.CounterVec
	accessDenials    *prometheus.CounterVec
	connsActive      prometheus.Gauge
	streamsActive    prometheus.Gauge
	websocketsActive prometheus.Gauge
	bytesToClient    prometheus.Counter
	bytesToApp       prometheus.Counter
	dials            *prometheus.CounterVec
	staleConns       prometheus.Counter
	startWaits       *prometheus.CounterVec
	startWaiting     prometheus.Gauge
	headersDropped   *prometheus.CounterVec
	cookieDomains    prometheus.Counter

	// reqDuration is applistener_request_duration_seconds, resolved per
	// protocol and outcome (accesslog.go) so that a request looks nothing up.
	reqDuration       [numProtos][numOutcomes]prometheus.Observer
	upstreamConnect   prometheus.Observer
	upstreamFirstByte prometheus.Observer
	accessLogDropped  prometheus.Counter
	// answerSpins counts the polls for an app's answer (fair.go,
	// appAnswerSpin) by outcome: answered while polling, or parked.
	answerSpins [2]prometheus.Counter

	// requestsByCode and denialsByCode are requests and denials by code
	// (see request and denied).
	requestsByCode, denialsByCode byCode
}

// latencyBuckets fit sub-millisecond proxy latencies as well as slow apps:
// 100 µs to 50 s, the project's round bounds.
var latencyBuckets = buckets.Latency

// newMetrics creates the data plane's metrics; parked reports how many
// WebSocket directions wait in the idle poller.
func newMetrics(reg prometheus.Registerer, parked func() float64) *metrics {
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "applistener_bytes_total", Help: "Body and stream bytes relayed, by direction.",
	}, []string{"direction"})
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_requests_total", Help: "Requests answered, by status code (code: the three digits, as every applistener metric labels a status).",
		}, []string{"code"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_request_denials_total", Help: "Requests refused by the listener itself, by status code.",
		}, []string{"code"}),
		connsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_client_connections_active", Help: "Client connections being served.",
		}),
		streamsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_streams_active", Help: "Requests in flight and open WebSockets.",
		}),
		websocketsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_websockets_active", Help: "Open proxied WebSockets.",
		}),
		bytesToClient: bytes.WithLabelValues("to_client"),
		bytesToApp:    bytes.WithLabelValues("to_app"),
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_connector_dials_total", Help: "Connections opened to apps, by result.",
		}, []string{"result"}),
		staleConns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_app_connections_stale_total",
			Help: "Idle app connections found closed by the app when about to be reused (discarded before any request byte was written).",
		}),
		startWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_app_start_waits_total",
			Help: "Requests that waited for an app refusing connections (not listening yet), by how the wait ended: ready, timeout (answered 502 not listening), client_gone, revoked, shutdown, error.",
		}, []string{"outcome"}),
		startWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_app_start_waiting",
			Help: "Requests waiting now for their app to start listening.",
		}),
		headersDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_request_headers_dropped_total",
			Help: "Request header fields not forwarded to apps, by reason (underscore: a name containing '_').",
		}, []string{"reason"}),
		accessDenials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_access_denials_total",
			Help: "Requests to private services (access mode token) refused, by reason: no_credential, malformed, unknown_key, bad_signature, expired, lifetime, wrong_scope, revoked, origin_not_allowed, no_keys.",
		}, []string{"reason"}),
		cookieDomains: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_cookie_domains_removed_total",
			Help: "Set-Cookie Domain attributes removed because they named more than the request's host.",
		}),
	}
	m.requestsByCode.vec, m.denialsByCode.vec = m.requests, m.denials
	for _, r := range accessDenialReasons {
		m.accessDenials.WithLabelValues(r)
	}
	for _, o := range startOutcomes {
		m.startWaits.WithLabelValues(o) // every series exported from the start
	}
	reqDuration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "applistener_request_duration_seconds",
		Help:    "Requests from the complete request head to the end of the answer (WebSockets: to their end), by protocol (h1, h2, ws) and outcome (ok, denied, upstream_error, aborted).",
		Buckets: latencyBuckets,
	}, []string{"protocol", "outcome"})
	for p := range numProtos {
		for o := range numOutcomes {
			m.reqDuration[p][o] = reqDuration.WithLabelValues(protoNames[p], outcomeNames[o])
		}
	}
	upstreamConnect := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "applistener_upstream_connect_seconds",
		Help:    "Time to get an app connection (pooled or dialled) and write the request head on it.",
		Buckets: latencyBuckets,
	})
	upstreamFirstByte := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "applistener_upstream_first_byte_seconds",
		Help:    "Time from the request head written to the app to its final response head.",
		Buckets: latencyBuckets,
	})
	m.upstreamConnect, m.upstreamFirstByte = upstreamConnect, upstreamFirstByte
	m.accessLogDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "applistener_access_log_dropped_total",
		Help: "Access-log lines dropped by the per-instance rate bound.",
	})
	spins := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "applistener_app_answer_spins_total",
		Help: "Requests of a light instance that polled for their app's answer (up to 25 µs) instead of parking at once, while fair admission was contended, by outcome: answered (caught while polling) or parked (the app took longer).",
	}, []string{"outcome"})
	m.answerSpins = [2]prometheus.Counter{spins.WithLabelValues("parked"), spins.WithLabelValues("answered")}
	if reg != nil {
		reg.MustRegister(reqDuration, upstreamConnect, upstreamFirstByte, m.accessLogDropped, spins)
		idle := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "applistener_websocket_directions_idle",
			Help: "WebSocket directions idle for 50 ms or more, parked without a goroutine or buffer (two per idle WebSocket).",
		}, parked)
		reg.MustRegister(m.requests, m.denials, m.connsActive, m.streamsActive, m.websocketsActive, bytes, m.dials, idle,
			m.staleConns, m.startWaits, m.startWaiting, m.headersDropped, m.cookieDomains, m.accessDenials)
	}
	return m
}

// maxStatusCode is the largest status code a metric labels as itself;
// anything outside 100–599 (an app's nonstandard status) is labelled "other".
const maxStatusCode = 599

// codeCounter is one series of a by-code counter, cached (see byCode).
type codeCounter struct{ prometheus.Counter }

// byCode caches the series of a CounterVec labelled only by code, one per
// status, created on first use: counting an answer formats and hashes
// nothing after the first time.
type byCode struct {
	vec    *prometheus.CounterVec
	series [maxStatusCode + 1]atomic.Pointer[codeCounter]
}

// inc counts one answer with status code.
func (b *byCode) inc(code int) {
	if code < 100 || code > maxStatusCode {
		code = 0 // "other"
	}
	c := b.series[code].Load()
	if c == nil {
		b.series[code].CompareAndSwap(nil, &codeCounter{b.vec.WithLabelValues(codeLabel(code))})
		c = b.series[code].Load()
	}
	c.Inc()
}

// codeLabel is the code label value of a status: its three digits, or
// "other" outside 100–599. Every applistener metric that labels an HTTP
// status does so this way (the promhttp convention), so code="503" and
// code=~"5.." select the same answers on every metric.
func codeLabel(code int) string {
	if code < 100 || code > maxStatusCode {
		return "other"
	}
	return strconv.Itoa(code)
}

// request counts an answer with status code in applistener_requests_total.
func (m *metrics) request(code int) { m.requestsByCode.inc(code) }

// denied counts a refusal by the listener itself with status code, in
// applistener_request_denials_total and applistener_requests_total.
func (m *metrics) denied(code int) {
	m.requestsByCode.inc(code)
	m.denialsByCode.inc(code)
}
