package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type gatewayMetrics struct {
	requests *prometheus.CounterVec
	watchers prometheus.Gauge
	reloads  *prometheus.CounterVec
	pushes   prometheus.Counter
}

func newGatewayMetrics(reg prometheus.Registerer) *gatewayMetrics {
	m := &gatewayMetrics{
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
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.watchers, m.reloads, m.pushes)
	}
	return m
}

// Request endpoints, the values of the "endpoint" label.
const (
	gwEndpointConfig        = "config"
	gwEndpointWatch         = "watch"
	gwEndpointInstallations = "installations"
	gwEndpointOther         = "other"
)

func (m *gatewayMetrics) request(endpoint string, code int) {
	m.requests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
}
