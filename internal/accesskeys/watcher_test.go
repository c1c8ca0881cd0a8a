package accesskeys

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func secretB64(b byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) }

// keysDoc is a keys file with one key per id, id:secret-byte pairs.
func keysDoc(keys ...string) string {
	var parts []string
	for _, k := range keys {
		id, b, _ := strings.Cut(k, ":")
		parts = append(parts, `{"id":"`+id+`","secret":"`+secretB64(b[0])+`"}`)
	}
	return `{"keys":[` + strings.Join(parts, ",") + `]}`
}

// writeFile replaces the file at path by a rename, as Kubernetes updates a
// mounted Secret.
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a log sink safe across goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// changes records OnChange calls.
type changes struct {
	mu   sync.Mutex
	list []Change
}

func (c *changes) add(ch Change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.list = append(c.list, ch)
}

func (c *changes) all() []Change {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Change(nil), c.list...)
}

func newWatcher(t *testing.T, initial string) (*Watcher, string, *changes, *syncBuffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.json")
	writeFile(t, path, initial)
	var ch changes
	logs := &syncBuffer{}
	w, err := New(Options{Path: path, Poll: 10 * time.Millisecond, OnChange: ch.add,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return w, path, &ch, logs
}

func TestNewRefusesABadFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(Options{Path: filepath.Join(dir, "missing.json")}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	writeFile(t, bad, `{"keys":[{"id":"k1","secret":"c2hvcnQ="}]}`)
	if _, err := New(Options{Path: bad}); err == nil || !strings.Contains(err.Error(), "keys[0].secret: 5 bytes") {
		t.Fatalf("short secret: %v", err)
	}
}

func TestReloadReportsRotation(t *testing.T) {
	w, path, ch, logs := newWatcher(t, keysDoc("k1:1"))
	if w.Version() != 1 || !w.Keys().Has("k1") {
		t.Fatalf("initial: version %d, ids %v", w.Version(), w.Keys().IDs())
	}
	steps := []struct {
		doc              string
		added, removed   string
		version          uint64
		wantErr, changed bool
	}{
		{doc: keysDoc("k1:1", "k2:2"), added: "k2", version: 2, changed: true},
		{doc: keysDoc("k2:2", "k1:1"), version: 2}, // reordered: the same keys
		{doc: keysDoc("k2:2"), removed: "k1", version: 3, changed: true},
		{doc: keysDoc("k2:9"), removed: "k2", added: "", version: 4, changed: true}, // new secret, same id
		{doc: `{"keys":[{"id":"k3"}]}`, version: 4, wantErr: true},
		{doc: keysDoc("k2:9", "k3:3"), added: "k3", version: 5, changed: true},
		{doc: `{"keys":[]}`, removed: "k2,k3", version: 6, changed: true}, // revoke everything
	}
	prevChanges := 0
	for i, s := range steps {
		writeFile(t, path, s.doc)
		err := w.Reload()
		if (err != nil) != s.wantErr {
			t.Fatalf("step %d: Reload = %v", i, err)
		}
		if (w.Err() != nil) != s.wantErr {
			t.Fatalf("step %d: Err = %v", i, w.Err())
		}
		if w.Version() != s.version {
			t.Fatalf("step %d: version %d, want %d", i, w.Version(), s.version)
		}
		all := ch.all()
		if !s.changed {
			if len(all) != prevChanges {
				t.Fatalf("step %d: OnChange called: %+v", i, all[len(all)-1])
			}
			continue
		}
		if len(all) != prevChanges+1 {
			t.Fatalf("step %d: %d changes, want %d", i, len(all), prevChanges+1)
		}
		prevChanges++
		last := all[len(all)-1]
		if got := strings.Join(last.Added, ","); got != s.added {
			t.Fatalf("step %d: added %q, want %q", i, got, s.added)
		}
		if got := strings.Join(last.Removed, ","); got != s.removed {
			t.Fatalf("step %d: removed %q, want %q", i, got, s.removed)
		}
		if last.Version != s.version || last.Keys != w.Keys() {
			t.Fatalf("step %d: change %+v", i, last)
		}
	}
	if n := strings.Count(logs.String(), "access keys file not applied"); n != 1 {
		t.Fatalf("%d failure lines, want 1:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), secretB64(9)) {
		t.Fatal("a secret was logged")
	}
}

func TestReloadKeepsKeysWhileTheFileIsMissingOrInvalid(t *testing.T) {
	w, path, ch, logs := newWatcher(t, keysDoc("k1:1"))
	keys := w.Keys()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := w.Reload(); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("missing file: %v", err)
		}
	}
	if w.Keys() != keys || w.Version() != 1 {
		t.Fatal("keys changed while the file was missing")
	}
	writeFile(t, path, keysDoc("k1:1")) // back, unchanged
	if err := w.Reload(); err != nil || w.Err() != nil {
		t.Fatalf("file back: %v / %v", err, w.Err())
	}
	writeFile(t, path, `{"keys":[`) // half written
	for range 3 {
		if err := w.Reload(); err == nil {
			t.Fatal("truncated file applied")
		}
	}
	if w.Keys() != keys || len(ch.all()) != 0 {
		t.Fatal("keys changed by an invalid file")
	}
	out := logs.String()
	if strings.Count(out, "access keys file not applied") != 2 || !strings.Contains(out, "readable again") {
		t.Fatalf("logs:\n%s", out)
	}
}

// TestRunFollowsTheFile: Run sees a rotation on its own and returns when
// its context ends, leaving no goroutine.
func TestRunFollowsTheFile(t *testing.T) {
	testutil.VerifyNone(t)
	w, path, ch, _ := newWatcher(t, keysDoc("k1:1"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	}()
	writeFile(t, path, keysDoc("k2:2"))
	// The new keys are current before OnChange runs: wait for both.
	testutil.Eventually(t, 10*time.Second, "the rotation to be seen and reported", func() bool {
		return w.Keys().Has("k2") && len(ch.all()) > 0
	})
	all := ch.all()
	if len(all) != 1 || strings.Join(all[0].Removed, ",") != "k1" || strings.Join(all[0].Added, ",") != "k2" {
		t.Fatalf("changes %+v", all)
	}
	tok, err := w.Keys().Mint("k2", accesstoken.Claims{Workspace: "team", Sandbox: "demo", Expires: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Keys().Verify(tok, &accesstoken.Request{Workspace: "team", Sandbox: "demo", Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
}
