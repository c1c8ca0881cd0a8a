package gateway

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// recordingSink keeps what a store tells it.
type recordingSink struct {
	mu     sync.Mutex
	loads  int
	downs  []string
	values map[string]string // the current contents
	rev    int64
}

func newRecordingSink() *recordingSink { return &recordingSink{values: make(map[string]string)} }

func (s *recordingSink) storeLoaded(kvs []kvPair, rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loads++
	s.values = make(map[string]string)
	for _, kv := range kvs {
		s.values[kv.key] = string(kv.value)
	}
	s.rev = rev
}

func (s *recordingSink) storeChanged(events []storeEvent, rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range events {
		if e.value == nil {
			delete(s.values, e.key)
		} else {
			s.values[e.key] = string(e.value)
		}
	}
	s.rev = rev
}

func (s *recordingSink) storeDown(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.downs = append(s.downs, why)
}

// value returns the sink's value of key and whether it has one.
func (s *recordingSink) value(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.values[key]
	return v, ok
}

// The memory and etcd stores behave alike: conditional writes, deletes,
// expiring and renewable keys, and a change feed that reaches the sink.
func TestStores(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		checkLeaks(t)
		testStore(t, newMemoryStore(), 300*time.Millisecond)
	})
	t.Run("etcd", func(t *testing.T) {
		checkLeaks(t)
		c := startEtcd(t, 1)
		s, err := newEtcdStore(EtcdConfig{Endpoints: c.endpoints(), Prefix: "/stores/"}, slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		testStore(t, s, 2*time.Second)
	})
}

// testStore checks st; ttl is the shortest TTL it honours exactly.
func testStore(t *testing.T, st store, ttl time.Duration) {
	sink := newRecordingSink()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		st.run(ctx, sink)
	}()
	defer func() {
		cancel()
		<-done
		if err := st.close(); err != nil {
			t.Error(err)
		}
	}()
	testutil.Eventually(t, 10*time.Second, "the load", func() bool { sink.mu.Lock(); defer sink.mu.Unlock(); return sink.loads > 0 })
	seen := func(key, want string) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, key+" = "+want, func() bool {
			v, ok := sink.value(key)
			if want == "" {
				return !ok
			}
			return ok && v == want
		})
	}
	bg := context.Background()

	rev1, ok, err := st.put(bg, "docs/a", []byte("one"), putOptions{})
	if err != nil || !ok || rev1 <= 0 {
		t.Fatalf("put: rev %d ok %v err %v", rev1, ok, err)
	}
	seen("docs/a", "one")
	if _, ok, err := st.put(bg, "docs/a", []byte("two"), putOptions{cond: mustNotExist}); err != nil || ok {
		t.Fatalf("create over an existing key: ok %v err %v", ok, err)
	}
	if _, ok, err := st.put(bg, "docs/a", []byte("two"), putOptions{cond: rev1 + 1000}); err != nil || ok {
		t.Fatalf("put with a wrong revision: ok %v err %v", ok, err)
	}
	rev2, ok, err := st.put(bg, "docs/a", []byte("two"), putOptions{cond: rev1})
	if err != nil || !ok || rev2 <= rev1 {
		t.Fatalf("put with the right revision: rev %d ok %v err %v", rev2, ok, err)
	}
	seen("docs/a", "two")
	if _, ok, err := st.del(bg, "docs/a", rev1); err != nil || ok {
		t.Fatalf("delete with a stale revision: ok %v err %v", ok, err)
	}
	if _, ok, err := st.del(bg, "docs/a", rev2); err != nil || !ok {
		t.Fatalf("delete: ok %v err %v", ok, err)
	}
	seen("docs/a", "")
	if _, ok, err := st.del(bg, "docs/missing", anyRevision); err != nil || !ok {
		t.Fatalf("delete of a missing key: ok %v err %v", ok, err)
	}
	if ok, err := st.renew(bg, "sessions/missing"); err != nil || ok {
		t.Fatalf("renew of a missing key: ok %v err %v", ok, err)
	}

	// A renewable key lives while it is renewed, then expires.
	if _, ok, err := st.put(bg, "sessions/s", []byte("s"), putOptions{ttl: ttl, renewable: true, cond: mustNotExist}); err != nil || !ok {
		t.Fatalf("put renewable: ok %v err %v", ok, err)
	}
	seen("sessions/s", "s")
	start := time.Now()
	for time.Since(start) < 2*ttl {
		if ok, err := st.renew(bg, "sessions/s"); err != nil || !ok {
			t.Fatalf("renew after %v: ok %v err %v", time.Since(start), ok, err)
		}
		time.Sleep(ttl / 4)
	}
	if _, ok := sink.value("sessions/s"); !ok {
		t.Fatal("a renewed key expired")
	}
	// Non-renewable keys expire on their own; they cannot be renewed
	// through the memory store (etcd's shared leases could be, and are not).
	if _, ok, err := st.put(bg, "ads/a", []byte("a"), putOptions{ttl: ttl}); err != nil || !ok {
		t.Fatalf("put with a ttl: ok %v err %v", ok, err)
	}
	seen("ads/a", "a")
	stopped := time.Now()
	testutil.Eventually(t, ttl+5*time.Second, "the keys to expire", func() bool {
		_, s := sink.value("sessions/s")
		_, a := sink.value("ads/a")
		return !s && !a
	})
	t.Logf("keys with a ttl of %v expired %v after the last renewal", ttl, time.Since(stopped).Round(time.Millisecond))
	if time.Since(stopped) < ttl/2 {
		t.Errorf("keys expired after %v, before their ttl %v", time.Since(stopped), ttl)
	}
}
