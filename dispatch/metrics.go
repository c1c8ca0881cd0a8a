package dispatch

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	requests         *prometheus.CounterVec
	denials          *prometheus.CounterVec
	connsActive      prometheus.Gauge
	streamsActive    prometheus.Gauge
	websocketsActive prometheus.Gauge
	bytesToClient    prometheus.Counter
	bytesToApp       prometheus.Counter
	dials            *prometheus.CounterVec
	staleConns       prometheus.Counter
	headersDropped   *prometheus.CounterVec
	cookieDomains    prometheus.Counter

	// reqDuration is applistener_request_duration_seconds, resolved per
	// protocol and outcome (accesslog.go) so that a request looks nothing up.
	reqDuration       [numProtos][numOutcomes]prometheus.Observer
	upstreamConnect   prometheus.Observer
	upstreamFirstByte prometheus.Observer
	accessLogDropped  prometheus.Counter
}

// latencyBuckets fit sub-millisecond proxy latencies as well as slow apps:
// 100 µs to 30 s, exponential (19 buckets, factor ≈ 2).
var latencyBuckets = prometheus.ExponentialBucketsRange(100e-6, 30, 19)

// newMetrics creates the data plane's metrics; parked reports how many
// WebSocket directions wait in the idle poller.
func newMetrics(reg prometheus.Registerer, parked func() float64) *metrics {
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "applistener_bytes_total", Help: "Body and stream bytes relayed, by direction.",
	}, []string{"direction"})
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_requests_total", Help: "Requests answered, by status class.",
		}, []string{"code"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_request_denials_total", Help: "Requests refused by the listener itself, by status code.",
		}, []string{"status"}),
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
		headersDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_request_headers_dropped_total",
			Help: "Request header fields not forwarded to apps, by reason (underscore: a name containing '_').",
		}, []string{"reason"}),
		cookieDomains: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_cookie_domains_removed_total",
			Help: "Set-Cookie Domain attributes removed because they named more than the request's host.",
		}),
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
	if reg != nil {
		reg.MustRegister(reqDuration, upstreamConnect, upstreamFirstByte, m.accessLogDropped)
		idle := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "applistener_websocket_directions_idle",
			Help: "WebSocket directions idle for 50 ms or more, parked without a goroutine or buffer (two per idle WebSocket).",
		}, parked)
		reg.MustRegister(m.requests, m.denials, m.connsActive, m.streamsActive, m.websocketsActive, bytes, m.dials, idle,
			m.staleConns, m.headersDropped, m.cookieDomains)
	}
	return m
}

func statusClass(code int) string {
	switch code / 100 {
	case 1:
		return "1xx"
	case 2:
		return "2xx"
	case 3:
		return "3xx"
	case 4:
		return "4xx"
	}
	return "5xx"
}
