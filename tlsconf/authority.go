package tlsconf

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// authorityValidity is how long a certificate authority made by
// NewAuthority is valid.
const authorityValidity = 10 * 365 * 24 * time.Hour

// clockSkew is how far in the past generated certificates start to be valid,
// so that a peer whose clock is slightly behind still accepts them.
const clockSkew = time.Hour

// Authority is a self-signed certificate authority that issues leaf
// certificates for tests, end-to-end tests and the `applistener dev` demo
// command. It is not meant to protect production traffic.
type Authority struct {
	// Cert is the authority's self-signed certificate.
	Cert *x509.Certificate
	// Key is the authority's private key; it signs issued certificates.
	Key crypto.Signer
	// CertPEM is Cert encoded as a PEM "CERTIFICATE" block.
	CertPEM []byte
}

// NewAuthority creates a self-signed ECDSA P-256 certificate authority with
// the given common name, valid from one hour ago until ten years from now.
// An empty commonName is replaced by "applistener dev CA".
func NewAuthority(commonName string) (*Authority, error) {
	if commonName == "" {
		commonName = "applistener dev CA"
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("tlsconf: CA serial number: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(authorityValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: create CA certificate %q: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: parse CA certificate %q: %w", commonName, err)
	}
	return &Authority{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}, nil
}

// Issue creates an ECDSA P-256 server certificate for names, signed by the
// authority. A name that parses as an IP address becomes an IP SAN, every
// other name (including wildcards such as "*.apps.test") a DNS SAN; the first
// name is also the subject common name. The certificate is valid from one
// hour ago until validFor from now; a negative validFor yields an already
// expired certificate, which is useful in tests.
//
// certPEM holds the leaf followed by the authority's certificate; keyPEM
// holds the leaf's key as a PKCS #8 "PRIVATE KEY" block.
func (a *Authority) Issue(names []string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	if len(names) == 0 {
		return nil, nil, errors.New("tlsconf: issue certificate: no names")
	}
	if validFor == 0 {
		return nil, nil, errors.New("tlsconf: issue certificate: validity must not be zero")
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: names[0]},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, name := range names {
		if name == "" {
			return nil, nil, fmt.Errorf("tlsconf: issue certificate for %q: empty name", names)
		}
		if ip := net.ParseIP(name); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, name)
		}
	}
	now := time.Now()
	tmpl.NotAfter = now.Add(validFor)
	tmpl.NotBefore = now.Add(-clockSkew)
	if !tmpl.NotBefore.Before(tmpl.NotAfter) {
		tmpl.NotBefore = tmpl.NotAfter.Add(-clockSkew)
	}
	if tmpl.SerialNumber, err = randomSerial(); err != nil {
		return nil, nil, fmt.Errorf("tlsconf: issue certificate for %q: serial number: %w", names, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tlsconf: issue certificate for %q: generate key: %w", names, err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, key.Public(), a.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("tlsconf: issue certificate for %q: %w", names, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("tlsconf: issue certificate for %q: encode key: %w", names, err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	certPEM = append(certPEM, a.CertPEM...)
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	return certPEM, keyPEM, nil
}

// Pool returns a new certificate pool that trusts only the authority, for a
// client's [tls.Config.RootCAs].
func (a *Authority) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(a.Cert)
	return pool
}

// randomSerial returns a random positive 128-bit certificate serial number.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	n, err := rand.Int(rand.Reader, limit)
	if err != nil {
		return nil, err
	}
	if n.Sign() == 0 {
		n.SetInt64(1)
	}
	return n, nil
}
