package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Defaults of the etcd store.
const (
	// DefaultEtcdPrefix is the prefix of every key the gateway writes.
	DefaultEtcdPrefix = "/applistener/"
	// DefaultEtcdDialTimeout bounds the first connection to etcd.
	DefaultEtcdDialTimeout = 5 * time.Second
)

// Timing of the etcd store.
const (
	// etcdHealthPeriod is how often the store checks, with a linearizable
	// read, that its cluster still has a leader and quorum (the contract:
	// at least every 2 s).
	etcdHealthPeriod = time.Second
	// etcdHealthTimeout bounds that read.
	etcdHealthTimeout = 1500 * time.Millisecond
	// etcdOpTimeout bounds one read or write of a request.
	etcdOpTimeout = 3 * time.Second
	// etcdRetryMin and etcdRetryMax bound the wait between two attempts to
	// load the store after a failure.
	etcdRetryMin = 100 * time.Millisecond
	etcdRetryMax = 2 * time.Second
	// etcdMaxValueBytes is the largest value written: etcd refuses requests
	// over --max-request-bytes (1.5 MiB by default), key and framing
	// included.
	etcdMaxValueBytes = 1536<<10 - 8<<10
	// etcdMinTTL is the shortest lease etcd grants with its default timing
	// (1.5 election timeouts, rounded up); a shorter request gets this.
	etcdMinTTL = 2
)

// EtcdConfig configures the etcd store (--store etcd).
type EtcdConfig struct {
	// Endpoints are the etcd client URLs.
	Endpoints []string
	// Prefix is put before every key (DefaultEtcdPrefix when empty).
	Prefix string
	// CAFile verifies the etcd servers (system roots when empty); CertFile
	// and KeyFile are the client certificate, both or neither.
	CAFile, CertFile, KeyFile string
	// DialTimeout bounds the first connection (DefaultEtcdDialTimeout when
	// not positive).
	DialTimeout time.Duration
}

// etcdStore keeps the gateway's state in etcd, under a prefix: every
// replica reads the whole prefix, then watches it. Keys that expire are
// attached to leases: an advertisement to a lease shared by every key that
// expires in the same second, a session to a lease of its own that renew
// keeps alive.
type etcdStore struct {
	cli    *clientv3.Client
	prefix string
	log    *slog.Logger

	mu sync.Mutex
	// keyLease is the lease of each key that has one, as last seen (a write
	// of this replica or an event of the watch).
	keyLease map[string]clientv3.LeaseID
	// shared are the leases of non-renewable keys, by the Unix second at
	// which they expire.
	shared map[int64]clientv3.LeaseID

	// replica is this replica's liveness key (recovery.go); only follow
	// uses it.
	replica replicaKey
}

// newEtcdStore connects to etcd (without waiting for it: run loads the
// state once it answers).
func newEtcdStore(cfg EtcdConfig, log *slog.Logger) (*etcdStore, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcd store: no endpoints")
	}
	tlsCfg, err := etcdTLS(cfg)
	if err != nil {
		return nil, err
	}
	dial := cfg.DialTimeout
	if dial <= 0 {
		dial = DefaultEtcdDialTimeout
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          dial,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		TLS:                  tlsCfg,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd store: %w", err)
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = DefaultEtcdPrefix
	}
	return &etcdStore{
		cli:      cli,
		prefix:   prefix,
		log:      log,
		keyLease: make(map[string]clientv3.LeaseID),
		shared:   make(map[int64]clientv3.LeaseID),
		replica:  replicaKey{id: newReplicaID()},
	}, nil
}

// etcdTLS builds the client's TLS configuration, or nil when no file is
// given.
func etcdTLS(cfg EtcdConfig) (*tls.Config, error) {
	if cfg.CAFile == "" && cfg.CertFile == "" && cfg.KeyFile == "" {
		return nil, nil
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("etcd store: the client certificate and key go together")
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("etcd store: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd store: CA file %s: no PEM certificate", cfg.CAFile)
		}
		c.RootCAs = pool
	}
	if cfg.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("etcd store: client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// run loads the prefix and follows it until ctx ends, reloading after
// every failure (with backoff) and telling sink when the view cannot be
// vouched for.
func (s *etcdStore) run(ctx context.Context, sink storeSink) {
	wait := etcdRetryMin
	for ctx.Err() == nil {
		loaded, err := s.follow(ctx, sink)
		if ctx.Err() != nil {
			return
		}
		sink.storeDown(err.Error())
		if loaded {
			wait = etcdRetryMin
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, etcdRetryMax)
	}
}

// follow loads the prefix, hands it to sink and feeds it the watch until
// the watch or a health check fails (the error) or ctx ends (nil). loaded
// tells whether the load succeeded.
func (s *etcdStore) follow(ctx context.Context, sink storeSink) (loaded bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
	resp, err := s.cli.Get(lctx, s.prefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return false, fmt.Errorf("etcd: load %s: %w", s.prefix, err)
	}
	kvs := make([]kvPair, 0, len(resp.Kvs))
	s.mu.Lock()
	clear(s.keyLease)
	for _, kv := range resp.Kvs {
		key := strings.TrimPrefix(string(kv.Key), s.prefix)
		if key == keyReplicas+s.replica.id {
			continue // this replica's own liveness key, from a previous load
		}
		kvs = append(kvs, kvPair{key: key, value: kv.Value, modRev: kv.ModRevision})
		if kv.Lease != 0 {
			s.keyLease[key] = clientv3.LeaseID(kv.Lease)
		}
	}
	s.mu.Unlock()
	rev := resp.Header.Revision
	sink.storeLoaded(kvs, rev)
	// Alive from now on (after the load, which must not see this
	// replica's key): recovery.go.
	if err := s.keepReplicaAlive(ctx, sink); err != nil && ctx.Err() == nil {
		s.log.Warn("gateway replica liveness key not written; retrying at the next health check", "err", err)
	}

	// A watch that requires a leader is cancelled by the member it is
	// connected to when that member loses its leader.
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	wch := s.cli.Watch(wctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
	health := time.NewTicker(etcdHealthPeriod)
	defer health.Stop()
	for {
		select {
		case <-ctx.Done():
			return true, nil
		case wr, ok := <-wch:
			if !ok {
				return true, errors.New("etcd: the watch ended")
			}
			if err := wr.Err(); err != nil {
				return true, fmt.Errorf("etcd: watch: %w", err)
			}
			if wr.Canceled {
				return true, errors.New("etcd: the watch was cancelled")
			}
			if len(wr.Events) == 0 {
				continue // a progress notification
			}
			events := make([]storeEvent, 0, len(wr.Events))
			last := wr.Header.Revision
			s.mu.Lock()
			for _, ev := range wr.Events {
				key := strings.TrimPrefix(string(ev.Kv.Key), s.prefix)
				e := storeEvent{key: key, modRev: ev.Kv.ModRevision}
				if ev.Type == mvccpb.PUT {
					e.value = ev.Kv.Value
					if ev.Kv.Lease != 0 {
						s.keyLease[key] = clientv3.LeaseID(ev.Kv.Lease)
					} else {
						delete(s.keyLease, key)
					}
				} else {
					delete(s.keyLease, key)
				}
				last = max(last, ev.Kv.ModRevision)
				events = append(events, e)
			}
			s.mu.Unlock()
			sink.storeChanged(events, last)
		case <-health.C:
			hctx, cancel := context.WithTimeout(ctx, etcdHealthTimeout)
			// A linearizable read goes through the leader: it fails
			// without quorum.
			_, err := s.cli.Get(hctx, s.prefix+"health", clientv3.WithCountOnly())
			cancel()
			if err != nil && ctx.Err() == nil {
				return true, fmt.Errorf("etcd: linearizable read: %w", err)
			}
			if err := s.keepReplicaAlive(ctx, sink); err != nil && ctx.Err() == nil {
				s.log.Warn("gateway replica liveness key not renewed", "err", err)
			}
		}
	}
}

// cmpFor returns the condition of a transaction on key, or nil for none.
func (s *etcdStore) cmpFor(key string, cond int64) []clientv3.Cmp {
	switch cond {
	case anyRevision:
		return nil
	case mustNotExist:
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}
	default:
		return []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", cond)}
	}
}

func (s *etcdStore) put(ctx context.Context, key string, value []byte, o putOptions) (int64, bool, error) {
	if len(value) > etcdMaxValueBytes {
		return 0, false, fmt.Errorf("etcd: put %s: %w (%d bytes, limit %d)", key, errValueTooLarge, len(value), etcdMaxValueBytes)
	}
	ctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
	defer cancel()
	full := s.prefix + key
	for attempt := 0; ; attempt++ {
		var lease clientv3.LeaseID
		var err error
		if o.ttl > 0 {
			lease, err = s.lease(ctx, o)
			if err != nil {
				return 0, false, err
			}
		}
		var opts []clientv3.OpOption
		if lease != 0 {
			opts = append(opts, clientv3.WithLease(lease))
		}
		resp, err := s.cli.Txn(ctx).If(s.cmpFor(full, o.cond)...).Then(clientv3.OpPut(full, string(value), opts...)).Commit()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) && attempt == 0 && !o.renewable {
			// The shared lease expired between its use and now: take a
			// new one.
			s.dropShared(lease)
			continue
		}
		if err != nil {
			return 0, false, fmt.Errorf("etcd: put %s: %w", key, err)
		}
		if !resp.Succeeded {
			if o.renewable && lease != 0 {
				s.revokeUnused(lease)
			}
			return resp.Header.Revision, false, nil
		}
		if o.renewable {
			s.mu.Lock()
			s.keyLease[key] = lease
			s.mu.Unlock()
		}
		return resp.Header.Revision, true, nil
	}
}

// lease returns the lease for a key written with o: a new one for a
// renewable key, else the shared lease of the second at which the key
// expires.
func (s *etcdStore) lease(ctx context.Context, o putOptions) (clientv3.LeaseID, error) {
	if o.renewable {
		g, err := s.cli.Grant(ctx, ttlSeconds(o.ttl, etcdMinTTL))
		if err != nil {
			return 0, fmt.Errorf("etcd: grant a lease: %w", err)
		}
		return g.ID, nil
	}
	now := time.Now()
	exp := now.Add(o.ttl)
	sec := exp.Unix()
	if exp.Nanosecond() > 0 {
		sec++
	}
	s.mu.Lock()
	for k := range s.shared {
		if k <= now.Unix() {
			delete(s.shared, k)
		}
	}
	id, ok := s.shared[sec]
	s.mu.Unlock()
	if ok {
		return id, nil
	}
	g, err := s.cli.Grant(ctx, ttlSeconds(time.Unix(sec, 0).Sub(now), etcdMinTTL))
	if err != nil {
		return 0, fmt.Errorf("etcd: grant a lease: %w", err)
	}
	s.mu.Lock()
	if other, ok := s.shared[sec]; ok {
		// Granted concurrently: keep one, drop ours.
		s.mu.Unlock()
		s.revokeUnused(g.ID)
		return other, nil
	}
	s.shared[sec] = g.ID
	s.mu.Unlock()
	return g.ID, nil
}

// dropShared forgets a shared lease that etcd no longer has.
func (s *etcdStore) dropShared(id clientv3.LeaseID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.shared {
		if v == id {
			delete(s.shared, k)
		}
	}
}

// revokeUnused revokes a lease that no key uses, bounded in time;
// if it fails the lease simply expires.
func (s *etcdStore) revokeUnused(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), etcdOpTimeout)
	defer cancel()
	_, _ = s.cli.Revoke(ctx, id)
}

func (s *etcdStore) del(ctx context.Context, key string, cond int64) (int64, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
	defer cancel()
	full := s.prefix + key
	resp, err := s.cli.Txn(ctx).If(s.cmpFor(full, cond)...).Then(clientv3.OpDelete(full)).Commit()
	if err != nil {
		return 0, false, fmt.Errorf("etcd: delete %s: %w", key, err)
	}
	return resp.Header.Revision, resp.Succeeded, nil
}

func (s *etcdStore) renew(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	id, ok := s.keyLease[key]
	s.mu.Unlock()
	if !ok {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
	defer cancel()
	_, err := s.cli.KeepAliveOnce(ctx, id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("etcd: renew %s: %w", key, err)
	}
	return true, nil
}

func (s *etcdStore) close() error {
	if err := s.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("etcd: close: %w", err)
	}
	return nil
}
