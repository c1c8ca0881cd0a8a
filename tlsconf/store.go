package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultWatchInterval is the polling interval [Store.Watch] uses when it is
// given a non-positive interval.
const DefaultWatchInterval = time.Second

// Store holds the current serving certificate read from a TLS Secret
// directory (DIR/tls.crt with the chain, leaf first, and DIR/tls.key).
//
// The certificate is replaced only by a complete, valid pair: a missing,
// unparsable or mismatched pair is rejected and the previous certificate
// keeps being served. Handshakes read the current certificate with one
// atomic load. A Store must be created with [NewStore]; its methods are safe
// for concurrent use.
type Store struct {
	dir      string
	certPath string
	keyPath  string
	logger   *slog.Logger

	cur atomic.Pointer[tls.Certificate]

	ok     atomic.Uint64
	failed atomic.Uint64

	// reloadMu serializes reloads so that an older read never replaces a
	// newer one; it also guards seen.
	reloadMu sync.Mutex
	// seen is the state of the files as observed just before the last load
	// attempt; Watch reloads when the files no longer match it.
	seen fileSetState
}

// NewStore loads the certificate pair dir/tls.crt and dir/tls.key. It fails
// if either file is missing or unreadable, if the certificate or key cannot
// be parsed, or if they do not match; the error names the offending file. A
// leaf that is expired or not yet valid is loaded with a warning. A nil
// logger means [slog.Default].
func NewStore(dir string, logger *slog.Logger) (*Store, error) {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Store{
		dir:      dir,
		certPath: filepath.Join(dir, CertFile),
		keyPath:  filepath.Join(dir, KeyFile),
		logger:   logger,
	}
	s.seen = s.state()
	cert, err := loadKeyPair(s.certPath, s.keyPath)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: load certificate from %s: %w", dir, err)
	}
	s.cur.Store(cert)
	s.logLoaded(cert, "tls certificate loaded")
	return s, nil
}

// Reload re-reads the certificate pair. If the new pair cannot be read or
// parsed, or the key does not match the certificate, the current certificate
// is kept, the reason is logged at WARN and returned, and the failed counter
// rises. Otherwise the ok counter rises and, when the certificate chain
// differs from the current one, the new pair is installed and logged at INFO
// (subject, serial, notAfter). An identical pair leaves [Store.Current]
// unchanged. An expired or not yet valid leaf is installed with a warning.
func (s *Store) Reload() error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	s.seen = s.state()

	cert, err := loadKeyPair(s.certPath, s.keyPath)
	if err != nil {
		s.failed.Add(1)
		err = fmt.Errorf("tlsconf: reload certificate from %s: %w", s.dir, err)
		attrs := []any{"dir", s.dir, "error", err}
		if cur := s.cur.Load(); cur != nil && cur.Leaf != nil {
			attrs = append(attrs, "kept_serial", serialHex(cur.Leaf))
		}
		s.logger.Warn("tls certificate reload failed, keeping the current certificate", attrs...)
		return err
	}
	s.ok.Add(1)
	if cur := s.cur.Load(); cur != nil && slices.EqualFunc(cur.Certificate, cert.Certificate, bytes.Equal) {
		s.logger.Debug("tls certificate unchanged", "dir", s.dir, "serial", serialHex(cur.Leaf))
		return nil
	}
	s.cur.Store(cert)
	s.logLoaded(cert, "tls certificate reloaded")
	return nil
}

// Watch polls the certificate files every interval (DefaultWatchInterval if
// interval is not positive) and calls [Store.Reload] when they change. It
// compares, for both files, the modification time, size, device and inode
// of the file they resolve to, and the symlink-resolved path, so that the
// atomic "..data" symlink swap of a Kubernetes Secret volume is noticed even
// when the stat fields happen to be identical. A failed reload is not
// retried until the files change again.
//
// Watch blocks until ctx is done and starts no goroutines; run it in a
// goroutine of your own.
func (s *Store) Watch(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if s.changed() {
			s.logger.Debug("tls certificate files changed", "dir", s.dir)
			_ = s.Reload() // logged and counted by Reload
		}
	}
}

// GetCertificate returns the current certificate pair. Its signature fits
// [tls.Config.GetCertificate]; it ignores the ClientHello and costs one
// atomic load.
func (s *Store) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if cert := s.cur.Load(); cert != nil {
		return cert, nil
	}
	return nil, errNoCertificate
}

var errNoCertificate = errors.New("tlsconf: no certificate loaded")

// Current returns the current certificate pair, with Leaf parsed. The
// returned value is shared and must not be modified.
func (s *Store) Current() *tls.Certificate {
	return s.cur.Load()
}

// Reloads returns how many reloads succeeded (including reloads that found
// the same certificate) and how many failed since the Store was created. The
// initial load by [NewStore] is not counted.
func (s *Store) Reloads() (ok, failed uint64) {
	return s.ok.Load(), s.failed.Load()
}

// changed reports whether the certificate files differ from the state seen
// before the last load attempt.
func (s *Store) changed() bool {
	now := s.state()
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	return now != s.seen
}

// logLoaded logs a newly installed certificate at INFO, plus a warning when
// its leaf is outside its validity period.
func (s *Store) logLoaded(cert *tls.Certificate, msg string) {
	leaf := cert.Leaf
	s.logger.Info(msg,
		"dir", s.dir,
		"subject", leaf.Subject.String(),
		"dns_names", leaf.DNSNames,
		"serial", serialHex(leaf),
		"not_before", leaf.NotBefore.UTC(),
		"not_after", leaf.NotAfter.UTC(),
	)
	now := time.Now()
	switch {
	case now.After(leaf.NotAfter):
		s.logger.Warn("tls certificate is expired",
			"dir", s.dir, "serial", serialHex(leaf), "not_after", leaf.NotAfter.UTC())
	case now.Before(leaf.NotBefore):
		s.logger.Warn("tls certificate is not valid yet",
			"dir", s.dir, "serial", serialHex(leaf), "not_before", leaf.NotBefore.UTC())
	}
}

func serialHex(leaf *x509.Certificate) string {
	if leaf == nil || leaf.SerialNumber == nil {
		return ""
	}
	return leaf.SerialNumber.Text(16)
}

// loadKeyPair reads and checks a certificate chain and its private key. The
// error names the file at fault.
func loadKeyPair(certPath, keyPath string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("read certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("read private key: %w", err)
	}
	leaf, err := parseLeaf(certPEM)
	if err != nil {
		return nil, fmt.Errorf("parse certificate %s: %w", certPath, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("private key %s (for certificate %s): %w", keyPath, certPath, err)
	}
	pair.Leaf = leaf
	return &pair, nil
}

// parseLeaf parses the first CERTIFICATE block of a PEM chain.
func parseLeaf(certPEM []byte) (*x509.Certificate, error) {
	rest := certPEM
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("no CERTIFICATE PEM block found")
		}
		if block.Type == "CERTIFICATE" {
			return x509.ParseCertificate(block.Bytes)
		}
	}
}

// fileState is what Watch compares to notice that a file changed.
type fileState struct {
	target  string // filepath.EvalSymlinks result
	modTime int64  // UnixNano
	size    int64
	dev     uint64
	ino     uint64
	err     string // a stat or resolution error, so that appearing counts as a change
}

// fileSetState is the state of the certificate and key files.
type fileSetState [2]fileState

func (s *Store) state() fileSetState {
	return fileSetState{statFile(s.certPath), statFile(s.keyPath)}
}

func statFile(path string) fileState {
	var st fileState
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		st.err = err.Error()
		return st
	}
	st.target = target
	fi, err := os.Stat(path)
	if err != nil {
		st.err = err.Error()
		return st
	}
	st.modTime = fi.ModTime().UnixNano()
	st.size = fi.Size()
	st.dev, st.ino = fileID(fi)
	return st
}
