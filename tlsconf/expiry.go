package tlsconf

import (
	"crypto/x509"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// expiryDesc is applistener_certificate_expiry_timestamp_seconds{name}.
var expiryDesc = prometheus.NewDesc("applistener_certificate_expiry_timestamp_seconds", expiryHelp, []string{"name"}, nil)

const expiryHelp = "NotAfter of a served certificate as a Unix time: the TLS directory's (name: its first DNS name, else its subject) and each managed (ACME) certificate served (name: the hostname)."

// ExpiryCollector exports applistener_certificate_expiry_timestamp_seconds
// for the store's current certificate. It reads the certificate at scrape
// time, so a reload (file change or SIGHUP) shows at the next scrape, and
// the replaced certificate's series goes away.
func (s *Store) ExpiryCollector() prometheus.Collector { return ExpiryCollector(s, nil) }

// ExpiryCollector exports applistener_certificate_expiry_timestamp_seconds
// for the store's current certificate and for each hostname the managed
// certificates served (up to MaxManagedExpiryNames, still allowed, with the
// latest NotAfter certmagic holds for it, so a renewal shows at the next
// scrape). Either may be nil. One collector for both: a Prometheus registry
// takes a metric's description from one collector only.
func ExpiryCollector(store *Store, managed *Managed) prometheus.Collector {
	return expiryCollector{store, managed}
}

type expiryCollector struct {
	s *Store
	m *Managed
}

func (c expiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- expiryDesc }

func (c expiryCollector) Collect(ch chan<- prometheus.Metric) {
	seen := map[string]bool{}
	if c.s != nil {
		if cert := c.s.Current(); cert != nil && cert.Leaf != nil {
			name := certificateName(cert.Leaf)
			seen[name] = true
			ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(cert.Leaf.NotAfter.Unix()), name)
		}
	}
	if c.m != nil {
		c.m.expiries.each(c.m, func(name string, notAfter time.Time) {
			if !seen[name] {
				seen[name] = true
				ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(notAfter.Unix()), name)
			}
		})
	}
}

// MaxManagedExpiryNames bounds the hostnames whose managed certificate
// expiry is exported (the metric's label cardinality); the hostnames served
// beyond it are not exported until earlier ones go away.
const MaxManagedExpiryNames = 1000

// managedExpiries are the hostnames a Managed served a certificate for.
type managedExpiries struct {
	names sync.Map // hostname → struct{}
	n     atomic.Int64
}

// served notes that a managed certificate was served for name.
func (e *managedExpiries) served(name string) {
	if _, ok := e.names.Load(name); ok || e.n.Load() >= MaxManagedExpiryNames {
		return
	}
	if _, loaded := e.names.LoadOrStore(name, struct{}{}); !loaded {
		e.n.Add(1)
	}
}

// each calls fn with each noted hostname that m still allows and holds a
// certificate for, and its latest NotAfter; it forgets the others.
func (e *managedExpiries) each(m *Managed, fn func(name string, notAfter time.Time)) {
	e.names.Range(func(k, _ any) bool {
		name := k.(string)
		var latest time.Time
		if m.allowed(name) {
			for _, c := range m.cache.AllMatchingCertificates(name) {
				if c.Leaf != nil && c.Leaf.NotAfter.After(latest) {
					latest = c.Leaf.NotAfter
				}
			}
		}
		if latest.IsZero() {
			e.names.Delete(name)
			e.n.Add(-1)
			return true
		}
		fn(name, latest)
		return true
	})
}

// certificateName names a certificate in metrics: its first DNS name, else
// its subject's common name, else its whole subject.
func certificateName(leaf *x509.Certificate) string {
	switch {
	case len(leaf.DNSNames) > 0:
		return leaf.DNSNames[0]
	case leaf.Subject.CommonName != "":
		return leaf.Subject.CommonName
	}
	return leaf.Subject.String()
}
