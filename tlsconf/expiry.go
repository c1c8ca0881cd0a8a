package tlsconf

import (
	"crypto/x509"

	"github.com/prometheus/client_golang/prometheus"
)

// expiryDesc is applistener_certificate_expiry_timestamp_seconds{name}.
var expiryDesc = prometheus.NewDesc("applistener_certificate_expiry_timestamp_seconds",
	"NotAfter of the served certificate from the TLS directory, as a Unix time; name is its first DNS name, else its subject.",
	[]string{"name"}, nil)

// ExpiryCollector exports applistener_certificate_expiry_timestamp_seconds
// for the store's current certificate. It reads the certificate at scrape
// time, so a reload (file change or SIGHUP) shows at the next scrape, and
// the replaced certificate's series goes away.
func (s *Store) ExpiryCollector() prometheus.Collector { return expiryCollector{s} }

type expiryCollector struct{ s *Store }

func (c expiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- expiryDesc }

func (c expiryCollector) Collect(ch chan<- prometheus.Metric) {
	cert := c.s.Current()
	if cert == nil || cert.Leaf == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue,
		float64(cert.Leaf.NotAfter.Unix()), certificateName(cert.Leaf))
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
