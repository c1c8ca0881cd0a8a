package gateway

import (
	"context"
	"slices"
	"sync"
	"time"
)

// memoryStore is the store of a single gateway process (--store memory):
// a map in memory with revisions and expiring keys. Its changes reach the
// sink synchronously, before put or del returns, so a request sees its own
// write at once. It never goes down.
type memoryStore struct {
	mu     sync.Mutex
	sink   storeSink
	rev    int64
	keys   map[string]*memoryEntry
	closed bool
}

// memoryEntry is one key of a memoryStore.
type memoryEntry struct {
	value     []byte
	modRev    int64
	ttl       time.Duration
	renewable bool
	deadline  time.Time   // zero: never expires
	timer     *time.Timer // expiry; nil when the key never expires
}

func newMemoryStore() *memoryStore {
	return &memoryStore{keys: make(map[string]*memoryEntry)}
}

// attach sets the sink and hands it the current contents, synchronously.
func (s *memoryStore) attach(sink storeSink) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sink = sink
	kvs := make([]kvPair, 0, len(s.keys))
	for k, e := range s.keys {
		kvs = append(kvs, kvPair{key: k, value: e.value, modRev: e.modRev})
	}
	slices.SortFunc(kvs, func(a, b kvPair) int { return int(a.modRev - b.modRev) })
	sink.storeLoaded(kvs, s.rev)
}

// run waits for ctx: a memory store has nothing to follow.
func (s *memoryStore) run(ctx context.Context, sink storeSink) {
	s.mu.Lock()
	attached := s.sink != nil
	s.mu.Unlock()
	if !attached {
		s.attach(sink)
	}
	<-ctx.Done()
}

// condHolds reports whether cond holds for the entry e (nil: missing).
func condHolds(cond int64, e *memoryEntry) bool {
	switch cond {
	case anyRevision:
		return true
	case mustNotExist:
		return e == nil
	default:
		return e != nil && e.modRev == cond
	}
}

func (s *memoryStore) put(_ context.Context, key string, value []byte, o putOptions) (int64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, false, errStoreClosed
	}
	old := s.keys[key]
	if !condHolds(o.cond, old) {
		return s.rev, false, nil
	}
	if old != nil && old.timer != nil {
		old.timer.Stop()
	}
	s.rev++
	e := &memoryEntry{value: slices.Clone(value), modRev: s.rev, ttl: o.ttl, renewable: o.renewable}
	if o.ttl > 0 {
		// Exact, not rounded to seconds as etcd's leases are.
		e.deadline = time.Now().Add(o.ttl)
		e.timer = time.AfterFunc(time.Until(e.deadline), func() { s.expire(key, e) })
	}
	s.keys[key] = e
	s.notifyLocked([]storeEvent{{key: key, value: e.value, modRev: e.modRev}})
	return s.rev, true, nil
}

func (s *memoryStore) del(_ context.Context, key string, cond int64) (int64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, false, errStoreClosed
	}
	old := s.keys[key]
	if !condHolds(cond, old) {
		return s.rev, false, nil
	}
	if old == nil {
		return s.rev, true, nil
	}
	s.deleteLocked(key, old)
	return s.rev, true, nil
}

// deleteLocked removes key (whose entry is e) and tells the sink. s.mu is
// held.
func (s *memoryStore) deleteLocked(key string, e *memoryEntry) {
	if e.timer != nil {
		e.timer.Stop()
	}
	delete(s.keys, key)
	s.rev++
	s.notifyLocked([]storeEvent{{key: key, modRev: s.rev}})
}

func (s *memoryStore) renew(_ context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, errStoreClosed
	}
	e := s.keys[key]
	if e == nil || e.timer == nil || !e.renewable {
		return false, nil
	}
	e.deadline = time.Now().Add(e.ttl)
	e.timer.Reset(e.ttl)
	return true, nil
}

// expire removes key if it is still e and its deadline has passed (a
// renewal moves the deadline and resets the timer).
func (s *memoryStore) expire(key string, e *memoryEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.keys[key] != e {
		return
	}
	if wait := time.Until(e.deadline); wait > 0 {
		e.timer.Reset(wait)
		return
	}
	s.deleteLocked(key, e)
}

// notifyLocked hands events to the sink. s.mu is held, so that the sink
// sees the changes in order.
func (s *memoryStore) notifyLocked(events []storeEvent) {
	if s.sink != nil {
		s.sink.storeChanged(events, s.rev)
	}
}

func (s *memoryStore) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, e := range s.keys {
		if e.timer != nil {
			e.timer.Stop()
		}
	}
	return nil
}
