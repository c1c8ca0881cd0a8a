package gateway

import (
	"context"
	"errors"
	"strings"
	"time"
)

// The gateway's shared state lives in a store: a key-value map with
// revisions, expiring keys and a change feed. Every replica keeps a view of
// the whole map (view.go), fed by the store's change feed, and answers from
// that view; every change goes through the store first, so that a change
// accepted by one replica reaches the watchers of every replica.
//
// Keys, relative to the store's prefix:
//
//	docs/<supervisor>      the supervisor's configuration document (compact JSON)
//	ads/<supervisor>       its advertisement (advertisementRecord), expiring with its validity
//	sessions/<supervisor>  its current session (sessionRecord), expiring after the session TTL
//	pools/<supervisor>     the pool its id is bound to (the pool name)
//
// There are two stores: memoryStore (one process; the default) and
// etcdStore (every replica shares one etcd cluster).

// Key prefixes of the store.
const (
	keyDocs     = "docs/"
	keyAds      = "ads/"
	keySessions = "sessions/"
	keyPools    = "pools/"
)

// Conditions of a write: anyRevision (the zero value) writes
// unconditionally, mustNotExist only when the key does not exist, and a
// positive revision only when the key's modification revision is that one.
const (
	anyRevision  int64 = 0
	mustNotExist int64 = -1
)

// errStoreClosed is returned by the operations of a closed store.
var errStoreClosed = errors.New("store closed")

// errValueTooLarge refuses a value larger than the store takes (etcd's
// request limit, 1.5 MiB by default).
var errValueTooLarge = errors.New("value larger than the store accepts")

// kvPair is one key and value of the store, with the revision of its last
// modification.
type kvPair struct {
	key    string // relative to the prefix
	value  []byte
	modRev int64
}

// storeEvent is one change: a put (value not nil) or a deletion (value nil,
// also when the key expired).
type storeEvent struct {
	key    string // relative to the prefix
	value  []byte
	modRev int64
}

// putOptions qualify a write.
type putOptions struct {
	// ttl makes the key expire this long after the write (rounded up to
	// whole seconds, at least the store's minimum); 0 never expires.
	ttl time.Duration
	// renewable keys can have their ttl extended by renew.
	renewable bool
	// cond is anyRevision, mustNotExist or the key's expected modification
	// revision.
	cond int64
}

// storeSink receives the contents of a store and its changes, in order,
// never concurrently.
type storeSink interface {
	// storeLoaded replaces the whole view by kvs, the store's complete
	// contents at revision rev.
	storeLoaded(kvs []kvPair, rev int64)
	// storeChanged applies events, the changes up to revision rev.
	storeChanged(events []storeEvent, rev int64)
	// storeDown says that the view can no longer be vouched for (the store
	// is unreachable or lost quorum) until the next storeLoaded.
	storeDown(why string)
}

// store is the gateway's shared state.
type store interface {
	// run feeds sink until ctx ends: the contents, then every change; after
	// a failure, storeDown, then the contents again once the store is back.
	run(ctx context.Context, sink storeSink)
	// put writes key. ok is false when the condition did not hold; rev is
	// the store's revision after the write (or at the failed condition).
	put(ctx context.Context, key string, value []byte, o putOptions) (rev int64, ok bool, err error)
	// del removes key when cond holds (anyRevision: always). ok is false
	// when the condition did not hold; removing a missing key unconditionally
	// is ok.
	del(ctx context.Context, key string, cond int64) (rev int64, ok bool, err error)
	// renew extends the ttl of a renewable key; false when the key (or its
	// lease) no longer exists.
	renew(ctx context.Context, key string) (bool, error)
	// close releases the store's resources.
	close() error
}

// splitKey returns the kind prefix (keyDocs, ...) and the supervisor id of
// key, or "" when key is not one of the gateway's.
func splitKey(key string) (kind, sup string) {
	for _, k := range []string{keyDocs, keyAds, keySessions, keyPools} {
		if rest, ok := strings.CutPrefix(key, k); ok && rest != "" && validSupervisorID(rest) == nil {
			return k, rest
		}
	}
	return "", ""
}

// ttlSeconds rounds d up to whole seconds, at least min.
func ttlSeconds(d time.Duration, minimum int64) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, minimum)
}
