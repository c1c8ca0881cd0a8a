package routes

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// otherLabel names the series that sums instances beyond MaxInstanceLabels.
const otherLabel = "_other"

// instanceCollector exports per-instance series, labelled by workspace and
// sandbox, for the instances that have seen traffic (a request admitted or
// refused, or streams open), at most MaxInstanceLabels of them (in key
// order); the rest are summed under workspace="_other", sandbox="_other", so
// a shared host with many sandboxes cannot blow up the metric cardinality.
// Instances that never received a request have no series: a scrape of a
// table of 10,000 mostly idle instances stays small (formatting 40,000
// series would hold a one-core supervisor for milliseconds every scrape).
type instanceCollector struct {
	t        *Table
	active   *prometheus.Desc
	max      *prometheus.Desc
	requests *prometheus.Desc
	limited  *prometheus.Desc
	bytes    *prometheus.Desc
	// Fair admission (internal/fairshare): how often and how long the
	// instance's work queued because the listener was busy.
	fairWaits   *prometheus.Desc
	fairSeconds *prometheus.Desc
	// throttled counts rate-limit refusals (reason="requests") and pauses
	// (reason="bytes").
	throttled *prometheus.Desc
}

func newInstanceCollector(t *Table) *instanceCollector {
	labels := []string{"workspace", "sandbox"}
	return &instanceCollector{
		t:        t,
		active:   prometheus.NewDesc("applistener_instance_streams_active", "Requests in flight and open WebSockets of an instance.", labels, nil),
		max:      prometheus.NewDesc("applistener_instance_max_streams", "Stream limit of an instance (0: none).", labels, nil),
		requests: prometheus.NewDesc("applistener_instance_requests_total", "Requests admitted for an instance.", labels, nil),
		limited:  prometheus.NewDesc("applistener_instance_limit_rejections_total", "Requests refused with 503 because the instance was at max_streams.", labels, nil),
		bytes: prometheus.NewDesc("applistener_instance_bytes_total", "Body and stream bytes relayed for an instance, by direction (to_app, to_client), counted when each request or WebSocket ends.",
			[]string{"workspace", "sandbox", "direction"}, nil),
		fairWaits: prometheus.NewDesc("applistener_instance_fair_waits_total",
			"Requests, handshakes and WebSocket chunks of an instance that queued for fair admission because every slot was taken.", labels, nil),
		fairSeconds: prometheus.NewDesc("applistener_instance_fair_wait_seconds_total",
			"Time the instance's work spent queued for fair admission.", labels, nil),
		throttled: prometheus.NewDesc("applistener_instance_throttled_total", "Rate limiting of an instance, by reason: requests refused with 429 over limits.requests_per_second (requests), relay pauses over limits.bytes_per_second (bytes).",
			[]string{"workspace", "sandbox", "reason"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *instanceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.active
	ch <- c.max
	ch <- c.requests
	ch <- c.limited
	ch <- c.bytes
	ch <- c.fairWaits
	ch <- c.fairSeconds
	ch <- c.throttled
}

// Collect implements prometheus.Collector.
func (c *instanceCollector) Collect(ch chan<- prometheus.Metric) {
	c.t.mu.Lock()
	list := make([]*Instance, 0, len(c.t.instances))
	for _, i := range c.t.instances {
		if i.requests.Load() > 0 || i.limited.Load() > 0 || i.active.Load() > 0 || i.Fair.Waits() > 0 || i.rates.throttledRequests.Load() > 0 {
			list = append(list, i)
		}
	}
	c.t.mu.Unlock()
	slices.SortFunc(list, func(a, b *Instance) int {
		if n := strings.Compare(a.Key.Workspace, b.Key.Workspace); n != 0 {
			return n
		}
		return strings.Compare(a.Key.Sandbox, b.Key.Sandbox)
	})
	limit := c.t.opts.MaxInstanceLabels
	var oActive, oMax, oReq, oLim, oApp, oClient, oWaits, oWaitSec, oThrReq, oThrBytes float64
	for n, i := range list {
		active, max := float64(i.active.Load()), float64(i.maxStreams.Load())
		req, lim := float64(i.requests.Load()), float64(i.limited.Load())
		toApp, toClient := float64(i.bytesToApp.Load()), float64(i.bytesToClient.Load())
		waits, waitSec := float64(i.Fair.Waits()), i.Fair.WaitTime().Seconds()
		thrReq, thrBytes := i.Throttled()
		if n >= limit {
			oActive, oMax, oReq, oLim = oActive+active, oMax+max, oReq+req, oLim+lim
			oApp, oClient = oApp+toApp, oClient+toClient
			oWaits, oWaitSec = oWaits+waits, oWaitSec+waitSec
			oThrReq, oThrBytes = oThrReq+float64(thrReq), oThrBytes+float64(thrBytes)
			continue
		}
		ws, sb := i.Key.Workspace, i.Key.Sandbox
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, active, ws, sb)
		ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, max, ws, sb)
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, req, ws, sb)
		ch <- prometheus.MustNewConstMetric(c.limited, prometheus.CounterValue, lim, ws, sb)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, toApp, ws, sb, "to_app")
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, toClient, ws, sb, "to_client")
		ch <- prometheus.MustNewConstMetric(c.fairWaits, prometheus.CounterValue, waits, ws, sb)
		ch <- prometheus.MustNewConstMetric(c.fairSeconds, prometheus.CounterValue, waitSec, ws, sb)
		ch <- prometheus.MustNewConstMetric(c.throttled, prometheus.CounterValue, float64(thrReq), ws, sb, "requests")
		ch <- prometheus.MustNewConstMetric(c.throttled, prometheus.CounterValue, float64(thrBytes), ws, sb, "bytes")
	}
	if len(list) > limit {
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, oActive, otherLabel, otherLabel)
		ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, oMax, otherLabel, otherLabel)
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, oReq, otherLabel, otherLabel)
		ch <- prometheus.MustNewConstMetric(c.limited, prometheus.CounterValue, oLim, otherLabel, otherLabel)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, oApp, otherLabel, otherLabel, "to_app")
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, oClient, otherLabel, otherLabel, "to_client")
		ch <- prometheus.MustNewConstMetric(c.fairWaits, prometheus.CounterValue, oWaits, otherLabel, otherLabel)
		ch <- prometheus.MustNewConstMetric(c.fairSeconds, prometheus.CounterValue, oWaitSec, otherLabel, otherLabel)
		ch <- prometheus.MustNewConstMetric(c.throttled, prometheus.CounterValue, oThrReq, otherLabel, otherLabel, "requests")
		ch <- prometheus.MustNewConstMetric(c.throttled, prometheus.CounterValue, oThrBytes, otherLabel, otherLabel, "bytes")
	}
}
