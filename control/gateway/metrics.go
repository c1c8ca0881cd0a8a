package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the metrics of the control protocol, the store, the
// sessions and the write API (discovery has its own, discoveryMetrics).
type metrics struct {
	requests        *prometheus.CounterVec
	watchers        prometheus.Gauge
	reloads         *prometheus.CounterVec
	pushes          prometheus.Counter
	storeUp         prometheus.Gauge
	sessions        prometheus.Gauge
	endpointRefused prometheus.Counter
	rejected        prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_gateway_requests_total", Help: "Gateway requests, by endpoint and status code.",
		}, []string{"endpoint", "code"}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_gateway_watchers", Help: "Open configuration watch streams.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_gateway_reloads_total", Help: "Reads of the gateway's files, by file (config, tokens) and result (ok, failed).",
		}, []string{"file", "result"}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_gateway_pushes_total", Help: "Changed documents written to watch streams.",
		}),
		storeUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_gateway_store_up", Help: "1 while the gateway's store is loaded and reachable (with quorum), else 0 (the gateway answers 503).",
		}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_gateway_sessions", Help: "Supervisor sessions that hold (all replicas, as this replica's view has them).",
		}),
		endpointRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_gateway_endpoint_policy_refused_total", Help: "Advertised routes whose endpoint the endpoint policy refused (never published).",
		}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_gateway_installations_rejected_total", Help: "Advertised installations not published because they failed validation.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.watchers, m.reloads, m.pushes, m.storeUp, m.sessions, m.endpointRefused, m.rejected)
	}
	return m
}

// Request endpoints, the values of the "endpoint" label.
const (
	endpointConfig        = "config"
	endpointWatch         = "watch"
	endpointInstallations = "installations"
	endpointWithdraw      = "withdraw"
	endpointInstances     = "instances"
	endpointPoolMembers   = "pool_members"
	endpointSupervisors   = "supervisors"
	endpointWake          = "wake"
	endpointOther         = "other"
)

func (m *metrics) request(endpoint string, code int) {
	m.requests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
}
