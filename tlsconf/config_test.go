package tlsconf

import (
	"context"
	"crypto/tls"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// newServingConfig serves a fresh wildcard certificate with ServerConfig.
func newServingConfig(t *testing.T) (*Authority, *tls.Config) {
	t.Helper()
	ca := newTestAuthority(t)
	_, store, _ := newSecretStore(t, issue(t, ca, time.Hour, testDomainCert))
	return ca, ServerConfig(store.GetCertificate, []string{"http/1.1"})
}

func TestServerConfigFields(t *testing.T) {
	protos := []string{"http/1.1"}
	cfg := ServerConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return nil, nil }, protos)
	protos[0] = "changed"
	if cfg.MinVersion != tls.VersionTLS12 || cfg.MaxVersion != 0 {
		t.Errorf("versions %x..%x, want TLS 1.2..default", cfg.MinVersion, cfg.MaxVersion)
	}
	if !slices.Equal(cfg.NextProtos, []string{"http/1.1"}) {
		t.Errorf("NextProtos = %v", cfg.NextProtos)
	}
	if cfg.CurvePreferences != nil || cfg.SessionTicketsDisabled || cfg.GetCertificate == nil {
		t.Errorf("CurvePreferences=%v SessionTicketsDisabled=%v GetCertificate set=%v",
			cfg.CurvePreferences, cfg.SessionTicketsDisabled, cfg.GetCertificate != nil)
	}
	insecure := map[uint16]bool{}
	for _, cs := range tls.InsecureCipherSuites() {
		insecure[cs.ID] = true
	}
	for _, id := range cfg.CipherSuites {
		name := tls.CipherSuiteName(id)
		if insecure[id] || !strings.HasPrefix(name, "TLS_ECDHE_") ||
			(!strings.Contains(name, "_GCM_") && !strings.Contains(name, "CHACHA20_POLY1305")) {
			t.Errorf("cipher suite %s is not ECDHE with an AEAD", name)
		}
	}
	if len(cfg.CipherSuites) != 6 {
		t.Errorf("%d cipher suites, want 6", len(cfg.CipherSuites))
	}
}

func TestProtocolVersionsAndCipherSuites(t *testing.T) {
	ca, cfg := newServingConfig(t)
	srv := startServer(t, cfg)

	t.Run("TLS 1.3 by default", func(t *testing.T) {
		c := clientConfig(ca)
		c.NextProtos = []string{"http/1.1"}
		conn := mustDial(t, srv.addr, c)
		st := conn.ConnectionState()
		if st.Version != tls.VersionTLS13 {
			t.Errorf("version %s, want TLS 1.3", tls.VersionName(st.Version))
		}
		if st.NegotiatedProtocol != "http/1.1" {
			t.Errorf("ALPN %q, want http/1.1", st.NegotiatedProtocol)
		}
		echo(t, conn, "tls13")
	})

	t.Run("TLS 1.2 with an AEAD suite", func(t *testing.T) {
		c := clientConfig(ca)
		c.MaxVersion = tls.VersionTLS12
		conn := mustDial(t, srv.addr, c)
		st := conn.ConnectionState()
		if st.Version != tls.VersionTLS12 || !slices.Contains(tls12CipherSuites, st.CipherSuite) {
			t.Errorf("negotiated %s %s", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite))
		}
		echo(t, conn, "tls12")
	})

	t.Run("TLS 1.1 refused", func(t *testing.T) {
		c := clientConfig(ca)
		c.MinVersion = tls.VersionTLS10
		c.MaxVersion = tls.VersionTLS11
		if conn, err := dial(srv.addr, c); err == nil {
			_ = conn.Close()
			t.Fatal("TLS 1.1 handshake succeeded")
		}
		if err := srv.handshakeErr(t); !strings.Contains(err.Error(), "version") {
			t.Errorf("server error %q, want a version error", err)
		}
	})

	t.Run("TLS 1.2 CBC only refused", func(t *testing.T) {
		c := clientConfig(ca)
		c.MaxVersion = tls.VersionTLS12
		c.CipherSuites = []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA,
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256,
		}
		if conn, err := dial(srv.addr, c); err == nil {
			_ = conn.Close()
			t.Fatal("TLS 1.2 CBC handshake succeeded")
		}
		if err := srv.handshakeErr(t); !strings.Contains(err.Error(), "cipher suite") {
			t.Errorf("server error %q, want a cipher suite error", err)
		}

		// The same client succeeds with an AEAD suite, so the refusal is
		// about the suite.
		c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}
		conn := mustDial(t, srv.addr, c)
		echo(t, conn, "gcm")
	})
}

// resumes connects with cache, exchanges bytes (so TLS 1.3 tickets are
// received) and reports whether the session was resumed.
func resumes(t *testing.T, addr string, ca *Authority, version uint16, cache tls.ClientSessionCache) bool {
	t.Helper()
	c := clientConfig(ca)
	c.MinVersion, c.MaxVersion = version, version
	c.ClientSessionCache = cache
	conn, err := dial(addr, c)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer func() { _ = conn.Close() }()
	if got := conn.ConnectionState().Version; got != version {
		t.Fatalf("negotiated %s, want %s", tls.VersionName(got), tls.VersionName(version))
	}
	echo(t, conn, "ticket")
	return conn.ConnectionState().DidResume
}

func TestSessionResumptionAndTicketKeyRotation(t *testing.T) {
	for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		t.Run(tls.VersionName(version), func(t *testing.T) {
			ca, cfg := newServingConfig(t)
			rot := NewTicketKeyRotator(cfg, time.Hour)
			srv := startServer(t, cfg)

			cache := tls.NewLRUClientSessionCache(4)
			if resumes(t, srv.addr, ca, version, cache) {
				t.Fatal("first connection resumed")
			}
			if !resumes(t, srv.addr, ca, version, cache) {
				t.Fatal("second connection did not resume")
			}

			// A ticket from two periods ago still resumes.
			cache = tls.NewLRUClientSessionCache(4)
			if resumes(t, srv.addr, ca, version, cache) {
				t.Fatal("fresh cache resumed")
			}
			rot.Rotate()
			rot.Rotate()
			if !resumes(t, srv.addr, ca, version, cache) {
				t.Fatal("ticket issued two rotations ago did not resume")
			}

			// A ticket from three periods ago does not.
			cache = tls.NewLRUClientSessionCache(4)
			if resumes(t, srv.addr, ca, version, cache) {
				t.Fatal("fresh cache resumed")
			}
			rot.Rotate()
			rot.Rotate()
			rot.Rotate()
			if resumes(t, srv.addr, ca, version, cache) {
				t.Fatal("ticket issued three rotations ago resumed")
			}
			// The full handshake issued a new ticket, which resumes.
			if !resumes(t, srv.addr, ca, version, cache) {
				t.Fatal("new ticket after a full handshake did not resume")
			}
		})
	}
}

func TestTicketKeyRotatorKeepsThreeKeys(t *testing.T) {
	cfg := ServerConfig(nil, nil)
	rot := NewTicketKeyRotator(cfg, 0)
	if rot.period != DefaultTicketKeyPeriod {
		t.Errorf("period = %v, want %v", rot.period, DefaultTicketKeyPeriod)
	}
	var history [][32]byte
	snapshot := func() [][32]byte {
		rot.mu.Lock()
		defer rot.mu.Unlock()
		return slices.Clone(rot.keys)
	}
	history = append(history, snapshot()[0])
	for i := 1; i <= 5; i++ {
		rot.Rotate()
		keys := snapshot()
		history = append(history, keys[0])
		var want [][32]byte // the newest keys, newest first
		for j := len(history) - 1; j >= 0 && len(want) < ticketKeysKept; j-- {
			want = append(want, history[j])
		}
		if !slices.Equal(keys, want) {
			t.Fatalf("after %d rotations keys are not the newest %d, newest first", i, ticketKeysKept)
		}
	}
	seen := map[[32]byte]bool{}
	for _, k := range history {
		if seen[k] || k == ([32]byte{}) {
			t.Fatal("ticket keys repeat or are zero")
		}
		seen[k] = true
	}
}

func TestTicketKeyRotatorRun(t *testing.T) {
	cfg := ServerConfig(nil, nil)
	rot := NewTicketKeyRotator(cfg, 5*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		rot.Run(ctx)
	}()
	testutil.Eventually(t, 2*time.Second, "three rotations by Run", func() bool {
		rot.mu.Lock()
		defer rot.mu.Unlock()
		return rot.rotations >= 4 // the initial key plus three rotations
	})
	cancel()
	select {
	case <-done:
	case <-time.After(ioTimeout):
		t.Fatal("Run did not return after cancel")
	}
}
