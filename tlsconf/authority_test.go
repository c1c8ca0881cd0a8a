package tlsconf

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// serveStaticPair writes pair to a fresh directory and serves it through a
// Store with ServerConfig.
func serveStaticPair(t *testing.T, pair testPair) *testServer {
	t.Helper()
	dir := t.TempDir()
	if err := WriteKeyPair(dir, pair.certPEM, pair.keyPEM); err != nil {
		t.Fatalf("WriteKeyPair: %v", err)
	}
	logger, _ := newTestLogger()
	store, err := NewStore(dir, logger)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	return startServer(t, ServerConfig(store.GetCertificate, []string{"http/1.1"}))
}

func TestIssuedWildcardVerifiesAgainstPool(t *testing.T) {
	ca := newTestAuthority(t)
	pair := issue(t, ca, time.Hour, testDomainCert)
	srv := serveStaticPair(t, pair)

	cfg := clientConfig(ca)
	cfg.NextProtos = []string{"http/1.1"}
	conn := mustDial(t, srv.addr, cfg)
	state := conn.ConnectionState()
	if len(state.VerifiedChains) == 0 {
		t.Fatal("no verified chains")
	}
	if got := peerSerial(conn); got != pair.serial {
		t.Errorf("serial = %s, want %s", got, pair.serial)
	}
	if state.NegotiatedProtocol != "http/1.1" {
		t.Errorf("ALPN = %q, want http/1.1", state.NegotiatedProtocol)
	}
	if len(state.PeerCertificates) != 2 {
		t.Errorf("server sent %d certificates, want leaf and CA", len(state.PeerCertificates))
	}
	echo(t, conn, "hello")

	// The wildcard covers exactly one label under apps.test, and nothing
	// else; a client trusting another authority refuses it.
	for _, name := range []string{"a.team--demo--web.apps.test", "team--demo--web.other.test"} {
		cfg := clientConfig(ca)
		cfg.ServerName = name
		if conn, err := dial(srv.addr, cfg); err == nil {
			_ = conn.Close()
			t.Errorf("ServerName %q verified, want a hostname error", name)
		} else if !errors.As(err, new(x509.HostnameError)) {
			t.Errorf("ServerName %q: error %v, want a hostname error", name, err)
		}
	}
	other := newTestAuthority(t)
	if conn, err := dial(srv.addr, clientConfig(other)); err == nil {
		_ = conn.Close()
		t.Error("certificate verified against an unrelated authority")
	} else if !errors.As(err, new(x509.UnknownAuthorityError)) {
		t.Errorf("unrelated authority: error %v, want unknown authority", err)
	}
}

func TestIssuedIPAddressSAN(t *testing.T) {
	ca := newTestAuthority(t)
	pair := issue(t, ca, time.Hour, "127.0.0.1", "localhost")
	leaf := leafOf(t, pair.certPEM)
	if len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("IP SANs = %v, want [127.0.0.1]", leaf.IPAddresses)
	}
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "localhost" {
		t.Errorf("DNS SANs = %v, want [localhost]", leaf.DNSNames)
	}
	srv := serveStaticPair(t, pair)
	cfg := clientConfig(ca)
	cfg.ServerName = "127.0.0.1"
	conn := mustDial(t, srv.addr, cfg)
	echo(t, conn, "ip")
}

func TestIssueCertificateProperties(t *testing.T) {
	ca := newTestAuthority(t)
	if !ca.Cert.IsCA || ca.Cert.Subject.CommonName != "tlsconf test CA" {
		t.Errorf("CA: IsCA=%v CN=%q", ca.Cert.IsCA, ca.Cert.Subject.CommonName)
	}
	if d := time.Until(ca.Cert.NotAfter); d < 9*365*24*time.Hour {
		t.Errorf("CA valid for %v, want about ten years", d)
	}
	if time.Since(ca.Cert.NotBefore) < 59*time.Minute {
		t.Errorf("CA NotBefore %v is not about an hour ago", ca.Cert.NotBefore)
	}

	certPEM, keyPEM, err := ca.Issue([]string{testDomainCert}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []*pem.Block
	for rest := certPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		blocks = append(blocks, b)
	}
	if len(blocks) != 2 || blocks[0].Type != "CERTIFICATE" || blocks[1].Type != "CERTIFICATE" {
		t.Fatalf("certificate PEM has %d blocks, want leaf and CA", len(blocks))
	}
	if string(pem.EncodeToMemory(blocks[1])) != string(ca.CertPEM) {
		t.Error("second certificate is not the CA")
	}
	leaf, err := x509.ParseCertificate(blocks[0].Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if leaf.IsCA || len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Errorf("leaf IsCA=%v ExtKeyUsage=%v", leaf.IsCA, leaf.ExtKeyUsage)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: testServerName}); err != nil {
		t.Errorf("verify leaf: %v", err)
	}
	keyBlock, _ := pem.Decode(keyPEM)
	if keyBlock == nil || keyBlock.Type != "PRIVATE KEY" {
		t.Fatalf("key PEM block type %v, want PRIVATE KEY", keyBlock)
	}
	if _, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes); err != nil {
		t.Errorf("key is not PKCS #8: %v", err)
	}

	expired := leafOf(t, issue(t, ca, -2*time.Hour, "old.apps.test").certPEM)
	if !expired.NotAfter.Before(time.Now()) || !expired.NotBefore.Before(expired.NotAfter) {
		t.Errorf("expired leaf validity %v..%v", expired.NotBefore, expired.NotAfter)
	}

	if _, _, err := ca.Issue(nil, time.Hour); err == nil {
		t.Error("Issue with no names succeeded")
	}
	if _, _, err := ca.Issue([]string{"a.test", ""}, time.Hour); err == nil {
		t.Error("Issue with an empty name succeeded")
	}
	if _, _, err := ca.Issue([]string{"a.test"}, 0); err == nil {
		t.Error("Issue with zero validity succeeded")
	}
}

func TestWriteKeyPair(t *testing.T) {
	ca := newTestAuthority(t)
	pair := issue(t, ca, time.Hour, testDomainCert)
	dir := filepath.Join(t.TempDir(), "new", "secret")
	if err := WriteKeyPair(dir, pair.certPEM, pair.keyPEM); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		data []byte
		mode fs.FileMode
	}{CertFile: {pair.certPEM, 0o644}, KeyFile: {pair.keyPEM, 0o600}} {
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want.mode {
			t.Errorf("%s mode %v, want %v", name, fi.Mode().Perm(), want.mode)
		}
		if got, _ := os.ReadFile(path); string(got) != string(want.data) {
			t.Errorf("%s content differs", name)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("directory has %d entries, want 2 (no temporary files left)", len(entries))
	}
}

func TestWriteSecretDirLayout(t *testing.T) {
	ca := newTestAuthority(t)
	dir := t.TempDir()
	var prevPayload string
	for i := range 3 {
		pair := issue(t, ca, time.Hour, testDomainCert)
		if err := WriteSecretDir(dir, pair.certPEM, pair.keyPEM); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		payload, err := os.Readlink(filepath.Join(dir, dataLink))
		if err != nil {
			t.Fatalf("..data: %v", err)
		}
		if !strings.HasPrefix(payload, "..20") || payload == prevPayload {
			t.Errorf("write %d: ..data -> %q (previous %q)", i, payload, prevPayload)
		}
		prevPayload = payload
		var names []string
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			names = append(names, e.Name())
		}
		want := []string{payload, dataLink, CertFile, KeyFile}
		if strings.Join(names, ",") != strings.Join(slices.Sorted(slices.Values(want)), ",") {
			t.Errorf("write %d: entries %v, want %v", i, names, slices.Sorted(slices.Values(want)))
		}
		for _, name := range []string{CertFile, KeyFile} {
			target, err := os.Readlink(filepath.Join(dir, name))
			if err != nil || target != filepath.Join(dataLink, name) {
				t.Errorf("%s -> %q (%v), want %s", name, target, err, filepath.Join(dataLink, name))
			}
		}
		if got, _ := os.ReadFile(filepath.Join(dir, CertFile)); string(got) != string(pair.certPEM) {
			t.Errorf("write %d: tls.crt content is not the new certificate", i)
		}
		if fi, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("write %d: tls.key stat %v %v", i, fi, err)
		}
	}
}

func TestIsPayloadDirName(t *testing.T) {
	for name, want := range map[string]bool{
		"..2026_01_02_03_04_05.000000001_123": true,
		"..":                                  false,
		"..data":                              false,
		"../etc":                              false,
		"..1/../..":                           false,
		"":                                    false,
		"tls.crt":                             false,
	} {
		if got := isPayloadDirName(name); got != want {
			t.Errorf("isPayloadDirName(%q) = %v, want %v", name, got, want)
		}
	}
}
