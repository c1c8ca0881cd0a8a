package tlsconf

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"slices"
	"sync"
	"time"
)

// tls12CipherSuites are the only cipher suites accepted for TLS 1.2: ECDHE
// key exchange with an AEAD. TLS 1.3 suites are not configurable and are all
// AEADs.
var tls12CipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// ServerConfig returns the server TLS configuration of the app listener:
// TLS 1.2 minimum and TLS 1.3 allowed (the default maximum); for TLS 1.2
// only ECDHE cipher suites with AES-GCM or ChaCha20-Poly1305; Go's default
// key exchange preferences (including X25519MLKEM768); certificates from
// getCert (typically [Store.GetCertificate]); ALPN protocols nextProtos
// (copied). Session tickets are enabled; pass the result to
// [NewTicketKeyRotator] to rotate their keys.
func ServerConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), nextProtos []string) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		CipherSuites:   slices.Clone(tls12CipherSuites),
		GetCertificate: getCert,
		NextProtos:     slices.Clone(nextProtos),
	}
}

// DefaultTicketKeyPeriod is the rotation period [NewTicketKeyRotator] uses
// when it is given a non-positive period.
const DefaultTicketKeyPeriod = time.Hour

// ticketKeysKept is how many session ticket keys are installed: the newest,
// which encrypts new tickets, and the two before it, which still decrypt
// tickets issued during the previous two periods.
const ticketKeysKept = 3

// TicketKeyRotator rotates the session ticket keys of a server [tls.Config].
// Each rotation installs a new random 32-byte key for new tickets and keeps
// the two previous keys for resumption, so a ticket resumes for two to three
// periods and then stops working, which bounds how long a leaked ticket key
// can decrypt recorded sessions.
//
// Rotate the config that is actually served: a config obtained from
// [tls.Config.Clone] copies the key list at the time of the clone, and a
// config returned by GetConfigForClient that has its own keys overrides
// these. Methods are safe for concurrent use.
type TicketKeyRotator struct {
	cfg    *tls.Config
	period time.Duration

	mu        sync.Mutex
	keys      [][32]byte // newest first
	rotations uint64
}

// NewTicketKeyRotator installs a first random session ticket key on cfg
// right away (replacing crypto/tls's automatic keys) and returns a rotator
// that replaces it every period once [TicketKeyRotator.Run] is running. A
// non-positive period means DefaultTicketKeyPeriod.
func NewTicketKeyRotator(cfg *tls.Config, period time.Duration) *TicketKeyRotator {
	if period <= 0 {
		period = DefaultTicketKeyPeriod
	}
	r := &TicketKeyRotator{cfg: cfg, period: period}
	r.Rotate()
	return r
}

// Rotate installs a new random session ticket key now: new tickets are
// encrypted with it, and tickets encrypted with the two previous keys still
// resume. Older keys are dropped.
func (r *TicketKeyRotator) Rotate() {
	var key [32]byte
	_, _ = rand.Read(key[:]) // crypto/rand.Read never fails; it crashes the program instead.

	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append([][32]byte{key}, r.keys...)
	if len(r.keys) > ticketKeysKept {
		clear(r.keys[ticketKeysKept:])
		r.keys = r.keys[:ticketKeysKept]
	}
	r.rotations++
	r.cfg.SetSessionTicketKeys(slices.Clone(r.keys))
}

// Run calls [TicketKeyRotator.Rotate] every period until ctx is done. It
// blocks and starts no goroutines.
func (r *TicketKeyRotator) Run(ctx context.Context) {
	ticker := time.NewTicker(r.period)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			r.Rotate()
		}
	}
}
