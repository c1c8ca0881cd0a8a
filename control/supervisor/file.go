// Package supervisor is the supervisor's side of the control plane: where
// its configuration comes from — the routes file (FileSource) or the
// session with the gateway (GatewayClient: a push session, polling while it
// is down) — and the Advertiser that tells the gateway which routes are
// installed. A source delivers complete configuration documents to a Sink —
// the route table — and renews freshness on every successful delivery. It
// never touches connections, and it never imports the gateway side
// (control/gateway): what both sides share is in control/api.
package supervisor

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/control/internal/pollfile"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/routes"
)

// Sink receives deliveries; *routes.Table implements it.
type Sink interface {
	// Apply installs a complete document and renews its routes.
	Apply(doc *routes.Document) routes.ApplyResult
	// Renew renews the installed routes without a new document.
	Renew()
}

// Source delivers configuration to a Sink until ctx ends.
type Source interface {
	Run(ctx context.Context) error
}

// FileSource reads the configuration document from a file. It re-reads the
// file when it changes and at least every Refresh; every good read is a
// delivery that renews the routes. A file that cannot be parsed is not
// applied and renews nothing; a missing file stops renewal, so the routes
// expire on time.
type FileSource struct {
	Path string
	Sink Sink
	// Refresh is the longest time between two reads (freshness/3 is right).
	Refresh time.Duration
	// Poll is how often the file's identity is checked for a change.
	Poll   time.Duration
	Logger *slog.Logger
	// Metrics, from NewMetrics; nil for none.
	Metrics *Metrics
	// OCSF receives a record per rejected instance entry; nil: none.
	OCSF *ocsf.Emitter
}

// Metrics counts deliveries.
type Metrics struct {
	deliveries *prometheus.CounterVec
	rejected   prometheus.Counter
	lastGood   prometheus.Gauge
}

// NewMetrics registers the control metrics on reg (which may be nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_config_deliveries_total", Help: "Configuration deliveries, by source and result.",
		}, []string{"source", "result"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_config_rejected_instances_total", Help: "Instance entries rejected by validation.",
		}),
		lastGood: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_config_last_success_timestamp_seconds", Help: "When the last successful delivery arrived.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.deliveries, m.rejected, m.lastGood)
	}
	return m
}

func (m *Metrics) delivery(source, result string) {
	if m == nil {
		return
	}
	m.deliveries.WithLabelValues(source, result).Inc()
	if result == "applied" || result == "renewed" {
		m.lastGood.SetToCurrentTime()
	}
}

// Run reads the file until ctx ends.
func (s *FileSource) Run(ctx context.Context) error {
	if s.Refresh <= 0 {
		s.Refresh = routes.DefaultFreshness / 3
	}
	if s.Poll <= 0 {
		s.Poll = 250 * time.Millisecond
	}
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	var last pollfile.Identity
	var lastRead time.Time
	var lastGood []byte // the bytes of the document last applied
	var lastErr string
	report := func(msg string, err error) {
		// Log a failure once per distinct error, not every poll.
		if text := err.Error(); text != lastErr {
			lastErr = text
			log.Error(msg, "path", s.Path, "err", err)
		}
	}
	ticker := time.NewTicker(s.Poll)
	defer ticker.Stop()
	for {
		id, err := pollfile.Stat(s.Path)
		switch {
		case err != nil:
			last = pollfile.Identity{}
			if errors.Is(err, fs.ErrNotExist) {
				s.Metrics.delivery("file", "missing")
				report("routes file missing; routes will expire unless it returns", err)
			} else {
				s.Metrics.delivery("file", "error")
				report("routes file unreadable", err)
			}
		case id != last || time.Since(lastRead) >= s.Refresh:
			data, rerr := pollfile.ReadLimited(s.Path, routes.MaxDocumentBytes)
			if rerr != nil {
				s.Metrics.delivery("file", "error")
				report("routes file unreadable", rerr)
				break
			}
			if lastGood != nil && bytes.Equal(data, lastGood) {
				// The document that is installed, read again: a renewal.
				// Re-parsing a large document every refresh would only burn
				// the data plane's CPU.
				last, lastRead = id, time.Now()
				if lastErr != "" {
					log.Info("routes file readable again", "path", s.Path)
					lastErr = ""
				}
				s.Sink.Renew()
				s.Metrics.delivery("file", "renewed")
				break
			}
			doc, perr := routes.ParseDocument(data)
			if perr != nil {
				s.Metrics.delivery("file", "unparsable")
				report("routes file not applied: cannot parse it; routes are not renewed", perr)
				// Retry at the next change or refresh, not every poll.
				last, lastRead = id, time.Now()
				break
			}
			changed := id != last
			last, lastRead = id, time.Now()
			if lastErr != "" {
				log.Info("routes file readable again", "path", s.Path)
				lastErr = ""
			}
			lastGood = data
			res := s.Sink.Apply(doc)
			s.Metrics.delivery("file", "applied")
			if changed || len(doc.Rejected) > 0 && res.Rejected > 0 {
				for _, rj := range doc.Rejected {
					if s.Metrics != nil {
						s.Metrics.rejected.Inc()
					}
					logRejected(log, rj)
					ocsfRejected(s.OCSF, doc, rj)
				}
			}
			if changed {
				log.Info("routes file applied", "path", s.Path, "revision", doc.Revision,
					"installed", res.Installed, "changed", res.Changed, "withdrawn", res.Withdrawn,
					"rejected", len(doc.Rejected), "rejected_routes", res.Rejected, "kept", res.Kept)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}
