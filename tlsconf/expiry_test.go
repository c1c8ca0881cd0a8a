package tlsconf

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
)

// TestExpiryCollector: the gauge is the served certificate's NotAfter,
// named by its first DNS name, and follows a reload (the replaced
// certificate's series goes away).
func TestExpiryCollector(t *testing.T) {
	ca := newTestAuthority(t)
	first := issue(t, ca, time.Hour, testDomainCert, "apps.test")
	dir, store, _ := newSecretStore(t, first)
	reg := prometheus.NewRegistry()
	reg.MustRegister(store.ExpiryCollector())
	srv := startServer(t, ServerConfig(store.GetCertificate, []string{"http/1.1"}))

	want := func(name string, notAfter time.Time) {
		t.Helper()
		exp := fmt.Sprintf(`
# HELP applistener_certificate_expiry_timestamp_seconds %s
# TYPE applistener_certificate_expiry_timestamp_seconds gauge
applistener_certificate_expiry_timestamp_seconds{name=%q} %d
`, expiryHelp, name, notAfter.Unix())
		if err := promtestutil.GatherAndCompare(reg, strings.NewReader(exp), "applistener_certificate_expiry_timestamp_seconds"); err != nil {
			t.Error(err)
		}
	}
	// The value is the NotAfter of the certificate a real handshake gets.
	c := mustDial(t, srv.addr, clientConfig(ca))
	served := c.ConnectionState().PeerCertificates[0].NotAfter
	_ = c.Close()
	if !served.Equal(leafOf(t, first.certPEM).NotAfter) {
		t.Fatalf("served NotAfter %v, issued %v", served, leafOf(t, first.certPEM).NotAfter)
	}
	want(testDomainCert, served)

	second := issue(t, ca, 48*time.Hour, "*.other.test")
	if err := WriteSecretDir(dir, second.certPEM, second.keyPEM); err != nil {
		t.Fatal(err)
	}
	if err := store.Reload(); err != nil {
		t.Fatal(err)
	}
	want("*.other.test", leafOf(t, second.certPEM).NotAfter)
}

func TestCertificateName(t *testing.T) {
	for _, tc := range []struct {
		leaf x509.Certificate
		want string
	}{
		{x509.Certificate{DNSNames: []string{"a.test", "b.test"}, Subject: pkix.Name{CommonName: "cn.test"}}, "a.test"},
		{x509.Certificate{Subject: pkix.Name{CommonName: "cn.test"}}, "cn.test"},
		{x509.Certificate{Subject: pkix.Name{Organization: []string{"Org"}}}, "O=Org"},
	} {
		if got := certificateName(&tc.leaf); got != tc.want {
			t.Errorf("certificateName(%v) = %q, want %q", tc.leaf.Subject, got, tc.want)
		}
	}
}
