// Package accesskeys keeps the listener's access token keys: it loads the
// keys file (accesstoken.LoadKeysFile), re-reads it when it changes, and
// says which key ids a change removed, so that what was authenticated under
// them can be ended.
package accesskeys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/accesstoken"
)

// DefaultPoll is how often Run reads the keys file when Options.Poll is 0.
const DefaultPoll = time.Second

// Change is a new key set taking effect.
type Change struct {
	// Keys is the new key set (already current when OnChange runs).
	Keys *accesstoken.KeySet
	// Version counts the key sets loaded, the first being 1.
	Version uint64
	// Removed are the ids whose tokens no longer verify: gone from the
	// file, or with another secret. Streams authenticated under them must
	// be closed.
	Removed []string
	// Added are the ids that are new.
	Added []string
}

// Options configure a Watcher.
type Options struct {
	// Path is the keys file.
	Path string
	// Poll is how often Run reads the file (DefaultPoll when 0).
	Poll time.Duration
	// Logger receives a line per change and per distinct failure
	// (slog.Default() when nil). Lines name key ids, never secrets.
	Logger *slog.Logger
	// OnChange, when set, is called from Reload (and so from Run's
	// goroutine) after each change, in order.
	OnChange func(Change)
}

// Watcher holds the key set of a keys file. Keys is safe for concurrent
// use and costs one atomic load; the file is re-read by Run, which its
// owner runs and stops by cancelling its context, or by Reload.
type Watcher struct {
	opts    Options
	log     *slog.Logger
	keys    atomic.Pointer[accesstoken.KeySet]
	version atomic.Uint64

	mu       sync.Mutex // serialises Reload
	lastData []byte     // the file's bytes at the last successful read, good or bad
	dataErr  error      // why lastData is not applied; nil when it is
	lastErr  error      // the last read's error; nil when the file's contents are applied
}

// New loads the keys file and returns a Watcher holding its keys. A file
// that is missing, unreadable or invalid is an error: nothing starts
// without keys it can trust.
func New(opts Options) (*Watcher, error) {
	if opts.Poll <= 0 {
		opts.Poll = DefaultPoll
	}
	w := &Watcher{opts: opts, log: opts.Logger}
	if w.log == nil {
		w.log = slog.Default()
	}
	data, err := readFile(opts.Path)
	if err != nil {
		return nil, err
	}
	ks, err := accesstoken.ParseKeysFile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opts.Path, err)
	}
	w.lastData = data
	w.keys.Store(ks)
	w.version.Store(1)
	return w, nil
}

// Keys returns the current key set.
func (w *Watcher) Keys() *accesstoken.KeySet { return w.keys.Load() }

// Version counts the key sets loaded: 1 after New, one more per change.
func (w *Watcher) Version() uint64 { return w.version.Load() }

// Err is the error of the last read: nil when the file's current contents
// are the keys in use, otherwise why they are not (the previous keys stay).
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// Run reads the file every Poll until ctx ends, then returns nil.
func (w *Watcher) Run(ctx context.Context) error {
	ticker := time.NewTicker(w.opts.Poll)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			_ = w.Reload() // logged by Reload
		}
	}
}

// Reload reads the file now and, when its contents changed and are valid,
// makes them the current key set and reports the change. A file that is
// missing, unreadable or invalid keeps the current keys (to revoke every
// key, write {"keys":[]}); the failure is logged once per distinct error
// and returned.
func (w *Watcher) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	data, err := readFile(w.opts.Path)
	if err != nil {
		w.fail(err)
		return err
	}
	if bytes.Equal(data, w.lastData) {
		// Nothing new: the same keys, or the same invalid contents.
		if w.dataErr != nil {
			w.fail(w.dataErr)
		} else if w.lastErr != nil {
			w.log.Info("access keys file readable again", "path", w.opts.Path)
			w.lastErr = nil
		}
		return w.lastErr
	}
	w.lastData = data
	ks, err := accesstoken.ParseKeysFile(data)
	if err != nil {
		w.dataErr = fmt.Errorf("%s: %w", w.opts.Path, err)
		w.fail(w.dataErr)
		return w.lastErr
	}
	w.dataErr = nil
	if w.lastErr != nil {
		w.log.Info("access keys file valid again", "path", w.opts.Path)
		w.lastErr = nil
	}
	old := w.keys.Load()
	ch := Change{Keys: ks, Removed: ks.Removed(old)}
	for _, id := range ks.IDs() {
		if !old.Has(id) {
			ch.Added = append(ch.Added, id)
		}
	}
	if len(ch.Removed) == 0 && len(ch.Added) == 0 && slices.Equal(ks.IDs(), old.IDs()) {
		return nil // reformatted: the same keys
	}
	w.keys.Store(ks)
	ch.Version = w.version.Add(1)
	w.log.Info("access keys reloaded", "path", w.opts.Path, "version", ch.Version,
		"key_ids", ks.IDs(), "added", ch.Added, "removed", ch.Removed)
	if w.opts.OnChange != nil {
		w.opts.OnChange(ch)
	}
	return nil
}

// fail records a failed read, logging it when it differs from the last.
func (w *Watcher) fail(err error) {
	if w.lastErr == nil || w.lastErr.Error() != err.Error() {
		w.log.Error("access keys file not applied; keeping the current keys", "path", w.opts.Path, "err", err)
	}
	w.lastErr = err
}

// readFile reads the keys file, refusing one larger than
// accesstoken.MaxKeysFileBytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, accesstoken.MaxKeysFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > accesstoken.MaxKeysFileBytes {
		return nil, errors.New(path + ": keys file larger than 64 KiB")
	}
	return data, nil
}
