package tlsconf

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// newSecretStore writes pair as a Secret volume and opens a Store on it.
func newSecretStore(t *testing.T, pair testPair) (dir string, store *Store, logs *logBuffer) {
	t.Helper()
	dir = t.TempDir()
	if err := WriteSecretDir(dir, pair.certPEM, pair.keyPEM); err != nil {
		t.Fatalf("WriteSecretDir: %v", err)
	}
	logger, logs := newTestLogger()
	store, err := NewStore(dir, logger)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	return dir, store, logs
}

func TestStoreLoads(t *testing.T) {
	ca := newTestAuthority(t)
	pair := issue(t, ca, time.Hour, testDomainCert)
	_, store, logs := newSecretStore(t, pair)
	cur := store.Current()
	if cur == nil || cur.Leaf == nil {
		t.Fatal("Current() has no parsed leaf")
	}
	if got := cur.Leaf.SerialNumber.Text(16); got != pair.serial {
		t.Errorf("serial = %s, want %s", got, pair.serial)
	}
	got, err := store.GetCertificate(&tls.ClientHelloInfo{ServerName: testServerName})
	if err != nil || got != cur {
		t.Errorf("GetCertificate = %p, %v; want %p", got, err, cur)
	}
	if ok, failed := store.Reloads(); ok != 0 || failed != 0 {
		t.Errorf("Reloads() = %d, %d; want 0, 0", ok, failed)
	}
	if !logs.contains("level=INFO") || !logs.contains("serial="+pair.serial) {
		t.Errorf("load not logged at INFO with serial:\n%s", logs)
	}
}

func TestStoreRotatesSecretWhileServing(t *testing.T) {
	ca := newTestAuthority(t)
	oldPair := issue(t, ca, time.Hour, testDomainCert)
	dir, store, logs := newSecretStore(t, oldPair)
	srv := startServer(t, ServerConfig(store.GetCertificate, []string{"http/1.1"}))
	cfg := clientConfig(ca)

	before := mustDial(t, srv.addr, cfg)
	echo(t, before, "before rotation")
	if got := peerSerial(before); got != oldPair.serial {
		t.Fatalf("serial = %s, want %s", got, oldPair.serial)
	}

	runWatch(t, store, 50*time.Millisecond)
	newPair := issue(t, ca, time.Hour, testDomainCert)
	if newPair.serial == oldPair.serial {
		t.Fatal("issued the same serial twice")
	}
	if err := WriteSecretDir(dir, newPair.certPEM, newPair.keyPEM); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, "a handshake presenting the new serial", func() bool {
		return handshakeSerial(t, srv.addr, cfg) == newPair.serial
	})

	// The connection established before the swap keeps working.
	echo(t, before, "after rotation")
	if got := peerSerial(before); got != oldPair.serial {
		t.Errorf("old connection serial = %s, want %s", got, oldPair.serial)
	}
	if ok, failed := store.Reloads(); ok < 1 || failed != 0 {
		t.Errorf("Reloads() = %d, %d; want >= 1, 0", ok, failed)
	}
	if !logs.contains(`msg="tls certificate reloaded"`) || !logs.contains("serial="+newPair.serial) {
		t.Errorf("reload not logged with the new serial:\n%s", logs)
	}
}

func TestStoreWatchPlainFiles(t *testing.T) {
	ca := newTestAuthority(t)
	oldPair := issue(t, ca, time.Hour, testDomainCert)
	dir := t.TempDir()
	if err := WriteKeyPair(dir, oldPair.certPEM, oldPair.keyPEM); err != nil {
		t.Fatal(err)
	}
	logger, _ := newTestLogger()
	store, err := NewStore(dir, logger)
	if err != nil {
		t.Fatal(err)
	}
	runWatch(t, store, 20*time.Millisecond)
	newPair := issue(t, ca, time.Hour, testDomainCert)
	if err := WriteKeyPair(dir, newPair.certPEM, newPair.keyPEM); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, "the new certificate", func() bool {
		return store.Current().Leaf.SerialNumber.Text(16) == newPair.serial
	})
}

func TestStoreKeepsOldPairOnBadReload(t *testing.T) {
	ca := newTestAuthority(t)
	good := issue(t, ca, time.Hour, testDomainCert)
	other := issue(t, ca, time.Hour, testDomainCert)
	garbage := []byte("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")

	cases := []struct {
		name       string
		write      func(dir string) error
		wantInErr  string // a file name the error must mention
		wantInErr2 string
	}{
		{"garbage key", func(dir string) error {
			return WriteSecretDir(dir, other.certPEM, garbage)
		}, KeyFile, ""},
		{"key of another certificate", func(dir string) error {
			return WriteSecretDir(dir, other.certPEM, good.keyPEM)
		}, KeyFile, "does not match"},
		{"garbage certificate", func(dir string) error {
			return WriteSecretDir(dir, []byte("not a certificate"), other.keyPEM)
		}, CertFile, ""},
		{"missing key", func(dir string) error {
			return os.Remove(filepath.Join(dir, KeyFile))
		}, KeyFile, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, store, logs := newSecretStore(t, good)
			srv := startServer(t, ServerConfig(store.GetCertificate, nil))
			cfg := clientConfig(ca)
			before := store.Current()

			if err := tc.write(dir); err != nil {
				t.Fatal(err)
			}
			err := store.Reload()
			if err == nil {
				t.Fatal("Reload accepted a bad pair")
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, tc.wantInErr)) || !strings.Contains(err.Error(), tc.wantInErr2) {
				t.Errorf("error %q does not name %s / %q", err, tc.wantInErr, tc.wantInErr2)
			}
			if store.Current() != before {
				t.Error("Current() changed after a failed reload")
			}
			if ok, failed := store.Reloads(); ok != 0 || failed != 1 {
				t.Errorf("Reloads() = %d, %d; want 0, 1", ok, failed)
			}
			if got := handshakeSerial(t, srv.addr, cfg); got != good.serial {
				t.Errorf("handshake serial = %s, want the old %s", got, good.serial)
			}
			if !logs.contains("level=WARN") || !logs.contains("kept_serial="+good.serial) {
				t.Errorf("failed reload not logged at WARN:\n%s", logs)
			}

			// Repairing the secret is picked up again.
			if err := WriteSecretDir(dir, other.certPEM, other.keyPEM); err != nil {
				t.Fatal(err)
			}
			if err := store.Reload(); err != nil {
				t.Fatalf("Reload after repair: %v", err)
			}
			if got := handshakeSerial(t, srv.addr, cfg); got != other.serial {
				t.Errorf("handshake serial after repair = %s, want %s", got, other.serial)
			}
		})
	}
}

func TestStoreWatchKeepsOldPairOnBadSecret(t *testing.T) {
	ca := newTestAuthority(t)
	good := issue(t, ca, time.Hour, testDomainCert)
	other := issue(t, ca, time.Hour, testDomainCert)
	third := issue(t, ca, time.Hour, testDomainCert)
	dir, store, _ := newSecretStore(t, good)
	srv := startServer(t, ServerConfig(store.GetCertificate, nil))
	cfg := clientConfig(ca)
	runWatch(t, store, 20*time.Millisecond)

	if err := WriteSecretDir(dir, other.certPEM, third.keyPEM); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, "a failed reload", func() bool {
		_, failed := store.Reloads()
		return failed >= 1
	})
	if got := handshakeSerial(t, srv.addr, cfg); got != good.serial {
		t.Errorf("handshake serial = %s, want the old %s", got, good.serial)
	}

	if err := WriteSecretDir(dir, third.certPEM, third.keyPEM); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, "the repaired certificate", func() bool {
		return handshakeSerial(t, srv.addr, cfg) == third.serial
	})
}

func TestStoreReloadWithoutChange(t *testing.T) {
	ca := newTestAuthority(t)
	pair := issue(t, ca, time.Hour, testDomainCert)
	_, store, logs := newSecretStore(t, pair)
	srv := startServer(t, ServerConfig(store.GetCertificate, nil))
	before := store.Current()
	for range 3 {
		if err := store.Reload(); err != nil {
			t.Fatalf("Reload: %v", err)
		}
	}
	if store.Current() != before {
		t.Error("Current() replaced although nothing changed")
	}
	if ok, failed := store.Reloads(); ok != 3 || failed != 0 {
		t.Errorf("Reloads() = %d, %d; want 3, 0", ok, failed)
	}
	if got := handshakeSerial(t, srv.addr, clientConfig(ca)); got != pair.serial {
		t.Errorf("serial = %s, want %s", got, pair.serial)
	}
	if logs.contains("level=WARN") || logs.contains(`msg="tls certificate reloaded"`) {
		t.Errorf("unchanged reload logged as a change or warning:\n%s", logs)
	}
	if store.changed() {
		t.Error("Watch would see a change although nothing changed")
	}
}

func TestStoreConcurrentReloadAndHandshakes(t *testing.T) {
	ca := newTestAuthority(t)
	pairs := []testPair{issue(t, ca, time.Hour, testDomainCert), issue(t, ca, time.Hour, testDomainCert)}
	dir, store, _ := newSecretStore(t, pairs[0])
	srv := startServer(t, ServerConfig(store.GetCertificate, nil))
	valid := map[string]bool{pairs[0].serial: true, pairs[1].serial: true}

	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				conn, err := dial(srv.addr, clientConfig(ca))
				if err != nil {
					t.Errorf("handshake during reloads: %v", err)
					return
				}
				if got := peerSerial(conn); !valid[got] {
					t.Errorf("unexpected serial %s", got)
				}
				_ = conn.Close()
			}
		})
	}
	for i := range 20 {
		p := pairs[i%2]
		if err := WriteSecretDir(dir, p.certPEM, p.keyPEM); err != nil {
			t.Error(err)
		}
		if err := store.Reload(); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
}

func TestNewStoreErrors(t *testing.T) {
	ca := newTestAuthority(t)
	pair := issue(t, ca, time.Hour, testDomainCert)
	other := issue(t, ca, time.Hour, testDomainCert)

	missing := filepath.Join(t.TempDir(), "nope")
	if _, err := NewStore(missing, nil); err == nil || !strings.Contains(err.Error(), filepath.Join(missing, CertFile)) {
		t.Errorf("missing directory: error %v does not name tls.crt", err)
	}

	dir := t.TempDir()
	if err := WriteKeyPair(dir, pair.certPEM, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(dir, nil); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, KeyFile)) {
		t.Errorf("garbage key: error %v does not name tls.key", err)
	}

	dir = t.TempDir()
	if err := WriteKeyPair(dir, pair.certPEM, other.keyPEM); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(dir, nil); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("mismatched key: error %v", err)
	}

	dir = t.TempDir()
	if err := WriteKeyPair(dir, pair.keyPEM, pair.keyPEM); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(dir, nil); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, CertFile)) {
		t.Errorf("key in tls.crt: error %v does not name tls.crt", err)
	}
}

func TestStoreLoadsExpiredWithWarning(t *testing.T) {
	ca := newTestAuthority(t)
	good := issue(t, ca, time.Hour, testDomainCert)
	expired := issue(t, ca, -time.Minute, testDomainCert)
	dir, store, logs := newSecretStore(t, good)
	if err := WriteSecretDir(dir, expired.certPEM, expired.keyPEM); err != nil {
		t.Fatal(err)
	}
	if err := store.Reload(); err != nil {
		t.Fatalf("Reload of an expired pair: %v", err)
	}
	if got := store.Current().Leaf.SerialNumber.Text(16); got != expired.serial {
		t.Errorf("serial = %s, want the expired %s", got, expired.serial)
	}
	if !logs.contains(`level=WARN msg="tls certificate is expired"`) {
		t.Errorf("expired certificate not warned about:\n%s", logs)
	}
}

func TestGetCertificateDoesNotAllocate(t *testing.T) {
	ca := newTestAuthority(t)
	_, store, _ := newSecretStore(t, issue(t, ca, time.Hour, testDomainCert))
	hello := &tls.ClientHelloInfo{ServerName: testServerName}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := store.GetCertificate(hello); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("GetCertificate allocates %v times per call", allocs)
	}
}

func TestWatchReturnsWhenCancelledBeforeStart(t *testing.T) {
	ca := newTestAuthority(t)
	_, store, _ := newSecretStore(t, issue(t, ca, time.Hour, testDomainCert))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		store.Watch(ctx, time.Hour)
	}()
	select {
	case <-done:
	case <-time.After(ioTimeout):
		t.Fatal("Watch did not return for a cancelled context")
	}
}

func TestWatchNoticesSymlinkSwapWithIdenticalStat(t *testing.T) {
	ca := newTestAuthority(t)
	dir, store, _ := newSecretStore(t, issue(t, ca, time.Hour, testDomainCert))
	if store.changed() {
		t.Fatal("change reported right after loading")
	}
	// A second payload whose files are hard links to the current ones has
	// identical stat fields (inode, size, mtime); only the resolved path
	// differs.
	cur, err := os.Readlink(filepath.Join(dir, dataLink))
	if err != nil {
		t.Fatal(err)
	}
	next := "..2099_01_01_00_00_00.000000000_1"
	if err := os.Mkdir(filepath.Join(dir, next), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{CertFile, KeyFile} {
		if err := os.Link(filepath.Join(dir, cur, name), filepath.Join(dir, next, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := replaceSymlink(filepath.Join(dir, dataLink), next); err != nil {
		t.Fatal(err)
	}
	if !store.changed() {
		t.Fatal("..data swap to hard-linked files not noticed")
	}
	if err := store.Reload(); err != nil {
		t.Fatal(err)
	}
	if store.changed() {
		t.Error("change still reported after Reload")
	}
}
