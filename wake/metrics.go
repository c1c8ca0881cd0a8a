package wake

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/internal/buckets"
)

// metrics are the coordinator's Prometheus metrics.
type metrics struct {
	total     *prometheus.CounterVec
	seconds   prometheus.Histogram
	held      prometheus.Gauge
	inFlight  prometheus.Gauge
	coalesced prometheus.Counter
	overflow  prometheus.Counter
	cached    prometheus.Counter
	gone      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_wake_total",
			Help: "Wakes ended, by result: woken (the instance became active), refused (the platform cannot wake it), failed (the platform could not be asked), timeout (accepted, never active), accepted (a relay's wake, once the platform accepted it).",
		}, []string{"result"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "applistener_wake_seconds",
			Help:    "Time from the first request for a sleeping instance to the instance active.",
			Buckets: buckets.Seconds(0.01, 250),
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_wake_held_requests",
			Help: "Requests held while their instance wakes.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_wakes_in_progress",
			Help: "Wakes started and not ended.",
		}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_wake_coalesced_total",
			Help: "Requests that joined a wake another request started (single flight).",
		}),
		overflow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_wake_overflow_total",
			Help: "Requests refused at once because the bound of held requests (per instance or per process) was reached.",
		}),
		cached: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_wake_refused_cached_total",
			Help: "Requests refused from the negative cache: the platform said the instance cannot be woken less than the cache TTL ago.",
		}),
		gone: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_wake_held_gone_total",
			Help: "Held requests that gave up their place before the wake or the hold ended: the client hung up or went away, the route was withdrawn, the listener shut down.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.total, m.seconds, m.held, m.inFlight, m.coalesced, m.overflow, m.cached, m.gone)
	}
	return m
}
