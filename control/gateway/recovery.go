package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Recovery after every replica was down (etcd store; DESIGN, "Faults"):
// a session lives on a lease that the replicas renew for its supervisor.
// When every replica is down for longer than the session TTL, nobody can
// renew it and etcd expires it, while the supervisor still serves its
// routes and its advertisement stays stored until its expires_at. A
// replica that then started with the normal rule (an advertisement is
// published only while its session holds) would answer 200 without
// those routes, and every consumer would drop them. Instead, a replica
// that loads the store when no other replica is alive takes the
// advertisements whose session record is gone as "recovered": they stay
// published until they expire, are withdrawn or superseded (any write of
// the supervisor's session or advertisement puts it back under the
// normal rule; its supervisor's next request recreates the same session).
//
// Whether another replica is alive is told by the replicas' liveness
// keys (keyReplicas + a random id per process), each on a lease of
// replicaLeaseTTL that the replica renews while it follows the store; a
// replica that sees a live one knows that sessions which expired
// meanwhile expired under a replica's watch, as they should (a supervisor
// gone). The lease is shorter than any session can be left to expire
// after the last replica stopped (a stopping replica renews the sessions
// of its streams for a full TTL), so a fleet outage that cost sessions
// always leaves no live key behind. A liveness key holds its replica's
// recovered advertisements: a replica that starts beside one that
// recovered some (the second of a pair restarted together) recovers
// the same ones, so that no replica answers without them.

// keyReplicas is the prefix of the replicas' liveness keys (etcd only).
// splitKey does not know it: the view ignores these keys.
const keyReplicas = "replicas/"

// replicaLeaseTTL is the lease of a replica's liveness key, in seconds;
// it is renewed at every health check (etcdHealthPeriod).
const replicaLeaseTTL = 3

// MinEtcdSessionTTL is the shortest session TTL for which a session can
// only expire for the lack of every replica once their liveness keys
// have: twice the liveness lease.
const MinEtcdSessionTTL = 2 * replicaLeaseTTL * time.Second

// recoveredAd is an advertisement published without its session record:
// the session it was made in and its store revision (a rewrite of it is
// a new advertisement, under the normal rule).
type recoveredAd struct {
	Session string `json:"session"`
	ModRev  int64  `json:"mod_rev"`
}

// livenessValue is the value of a replica's liveness key.
type livenessValue struct {
	Recovered map[string]recoveredAd `json:"recovered,omitempty"`
}

// newReplicaID returns a random id for a replica's liveness key.
func newReplicaID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// otherReplicas returns whether kvs, the store as loaded, holds the
// liveness key of another replica (the etcd store leaves this replica's
// own key out), and the advertisements those replicas recovered.
func otherReplicas(kvs []kvPair) (alive bool, recovered map[string]recoveredAd) {
	for _, kv := range kvs {
		id, ok := strings.CutPrefix(kv.key, keyReplicas)
		if !ok || id == "" {
			continue
		}
		alive = true
		var v livenessValue
		if json.Unmarshal(kv.value, &v) != nil {
			continue
		}
		for sup, ad := range v.Recovered {
			if recovered == nil {
				recovered = make(map[string]recoveredAd)
			}
			recovered[sup] = ad
		}
	}
	return alive, recovered
}

// recoverOrphansLocked returns the recovered advertisements after a load
// of the store (storeLoaded): those of ads whose supervisor has no
// session record in sessions, when every replica was down (no other
// replica alive at the load: fleetDown), or when this replica or a live
// one recovered the same advertisement before (a reload after an etcd
// hiccup, a replica started beside one that recovered). g.mu is held.
func (g *Gateway) recoverOrphansLocked(ads map[string]advertisement, sessions map[string]sessionView, fleetDown bool, inherited map[string]recoveredAd) map[string]recoveredAd {
	var out map[string]recoveredAd
	for sup, adv := range ads {
		if _, ok := sessions[sup]; ok {
			continue
		}
		ad := recoveredAd{Session: adv.session, ModRev: adv.modRev}
		if !fleetDown && g.recovered[sup] != ad && inherited[sup] != ad {
			continue
		}
		if out == nil {
			out = make(map[string]recoveredAd)
		}
		out[sup] = ad
	}
	if len(out) > 0 && fleetDown {
		g.log.Info("every gateway replica was down: advertisements whose sessions expired meanwhile stay published until they expire, are withdrawn or superseded",
			"advertisements", len(out))
	} else if len(out) > 0 && len(g.recovered) == 0 {
		g.log.Info("advertisements recovered by another replica after every replica was down stay published until they expire, are withdrawn or superseded",
			"advertisements", len(out))
	}
	return out
}

// forgetRecoveredLocked puts sup's advertisement back under the normal
// rule (its session or advertisement was written). The map handed to
// discovery is never written: it is copied. g.mu is held.
func (g *Gateway) forgetRecoveredLocked(sup string) {
	if _, ok := g.recovered[sup]; !ok {
		return
	}
	next := maps.Clone(g.recovered)
	delete(next, sup)
	g.recovered = next
}

// livenessValue is what this replica's liveness key holds now (the etcd
// store writes it, and again when it changes).
func (g *Gateway) livenessValue() []byte {
	g.mu.Lock()
	v := livenessValue{Recovered: g.recovered}
	b, err := json.Marshal(v)
	g.mu.Unlock()
	if err != nil {
		return []byte("{}")
	}
	return b
}

// livenessValuer is the part of a storeSink that tells what its liveness
// key holds (the Gateway).
type livenessValuer interface {
	livenessValue() []byte
}

// replicaKey keeps this replica's liveness key.
type replicaKey struct {
	id    string
	lease clientv3.LeaseID
	value []byte // as last written
}

// keepReplicaAlive writes the liveness key on a new lease when it has
// none, else renews its lease (writing the key again when the lease is
// gone, or when the value sink gives has changed).
func (s *etcdStore) keepReplicaAlive(ctx context.Context, sink storeSink) error {
	value := []byte("{}")
	if lv, ok := sink.(livenessValuer); ok {
		value = lv.livenessValue()
	}
	ctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
	defer cancel()
	key := s.prefix + keyReplicas + s.replica.id
	if s.replica.lease != 0 {
		_, err := s.cli.KeepAliveOnce(ctx, s.replica.lease)
		switch {
		case err == nil && bytes.Equal(value, s.replica.value):
			return nil
		case err == nil:
			if _, err := s.cli.Put(ctx, key, string(value), clientv3.WithLease(s.replica.lease)); err != nil {
				return fmt.Errorf("etcd: write the replica's liveness key: %w", err)
			}
			s.replica.value = value
			return nil
		case !errors.Is(err, rpctypes.ErrLeaseNotFound):
			return fmt.Errorf("etcd: renew the replica's liveness key: %w", err)
		}
		s.replica.lease = 0
	}
	g, err := s.cli.Grant(ctx, replicaLeaseTTL)
	if err != nil {
		return fmt.Errorf("etcd: grant the replica's liveness lease: %w", err)
	}
	if _, err := s.cli.Put(ctx, key, string(value), clientv3.WithLease(g.ID)); err != nil {
		s.revokeUnused(g.ID)
		return fmt.Errorf("etcd: write the replica's liveness key: %w", err)
	}
	s.replica.lease, s.replica.value = g.ID, value
	return nil
}
