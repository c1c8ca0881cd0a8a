package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// countingSink records deliveries.
type countingSink struct {
	mu        sync.Mutex
	applied   []string // document revisions
	renewals  int
	instances int
}

func (c *countingSink) Apply(doc *routes.Document) routes.ApplyResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applied = append(c.applied, doc.Revision)
	c.instances = len(doc.Instances)
	return routes.ApplyResult{}
}

func (c *countingSink) Renew() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renewals++
}

func (c *countingSink) snapshot() ([]string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.applied...), c.renewals
}

func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const fileDoc = `{"revision":"%s","instances":[{"workspace":"team","sandbox":"demo","services":[{"name":"web","port":8080}]}]}`

// The routes file: a change is applied; re-reading the same document is a
// renewal without re-applying it; an unparsable or missing file delivers
// nothing (so routes go stale on time).
func TestFileSourceDeliveries(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "routes.json")
	writeAtomic(t, path, fmt.Sprintf(fileDoc, "r1"))
	sink := &countingSink{}
	metrics := NewMetrics(nil)
	src := &FileSource{Path: path, Sink: sink, Refresh: 30 * time.Millisecond, Poll: 10 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Metrics: metrics}
	seen := func(result string) float64 {
		return promtest.ToFloat64(metrics.deliveries.WithLabelValues("file", result))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	defer func() { cancel(); <-done }()

	testutil.Eventually(t, 5*time.Second, "r1 applied", func() bool { a, _ := sink.snapshot(); return len(a) == 1 && a[0] == "r1" })
	testutil.Eventually(t, 5*time.Second, "renewals by re-reading", func() bool { _, r := sink.snapshot(); return r >= 3 })
	if a, _ := sink.snapshot(); len(a) != 1 {
		t.Fatalf("the unchanged document was applied again: %v", a)
	}

	writeAtomic(t, path, fmt.Sprintf(fileDoc, "r2"))
	testutil.Eventually(t, 5*time.Second, "r2 applied", func() bool { a, _ := sink.snapshot(); return len(a) == 2 && a[1] == "r2" })

	// Unparsable: no apply, no renewal.
	writeAtomic(t, path, `{"revision": "r3", "instances": [`)
	testutil.Eventually(t, 5*time.Second, "the unparsable file read", func() bool { return seen("unparsable") >= 1 })
	a0, r0 := sink.snapshot()
	for range 10 {
		time.Sleep(20 * time.Millisecond)
		if a, r := sink.snapshot(); len(a) != len(a0) || r != r0 {
			t.Fatalf("an unparsable file delivered something: applied %v renewals %d→%d", a, r0, r)
		}
	}

	// Missing: no apply, no renewal; back: applied again.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the file seen missing", func() bool { return seen("missing") >= 1 })
	a0, r0 = sink.snapshot()
	for range 10 {
		time.Sleep(20 * time.Millisecond)
		if a, r := sink.snapshot(); len(a) != len(a0) || r != r0 {
			t.Fatalf("a missing file delivered something: applied %v renewals %d→%d", a, r0, r)
		}
	}
	writeAtomic(t, path, fmt.Sprintf(fileDoc, "r4"))
	testutil.Eventually(t, 5*time.Second, "r4 applied", func() bool { a, _ := sink.snapshot(); return len(a) == 3 && a[2] == "r4" })
}

// lockedBuffer is a bytes.Buffer safe for a logger and a test reading it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestFileSourceSummaryCountsRejected: the "routes file applied" summary
// counts the instance entries that validation rejected, also on the first
// read (it said rejected=0 right after the "instance rejected" warnings).
func TestFileSourceSummaryCountsRejected(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.json")
	writeAtomic(t, path, `{"revision":"r1","instances":[
		{"workspace":"team","sandbox":"demo","services":[{"name":"web","port":8080}]},
		{"workspace":"team","sandbox":"bad","services":[{"name":"web","port":0}]},
		{"workspace":"team","sandbox":"worse","limitz":{}}]}`)
	var logs lockedBuffer
	src := &FileSource{Path: path, Sink: &countingSink{}, Refresh: time.Hour, Poll: 10 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testutil.Eventually(t, 5*time.Second, "the summary line", func() bool {
		return strings.Contains(logs.String(), `"msg":"routes file applied"`)
	})
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"msg":"routes file applied"`) && !strings.Contains(line, `"rejected":2,`) {
			t.Errorf("summary %s; want rejected 2", line)
		}
	}
	if n := strings.Count(logs.String(), `"msg":"instance rejected"`); n != 2 {
		t.Errorf("%d instance rejected warnings; want 2", n)
	}
}
