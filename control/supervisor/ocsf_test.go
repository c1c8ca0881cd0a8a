package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/ocsf/ocsftest"
	"github.com/applistener/applistener/internal/testutil"
)

const rejectingDoc = `{"revision":"r1","instances":[
	{"workspace":"team","sandbox":"demo","services":[{"name":"web","port":8080}]},
	{"workspace":"team","sandbox":"bad","services":[{"name":"web","port":0}]},
	{"workspace":"team","sandbox":"worse","limitz":{}}]}`

// checkRejected checks that out holds one Entity Management record per
// rejected instance entry (sandboxes bad and worse): a Create that failed,
// with the reason, that validates against the class.
func checkRejected(t *testing.T, out *lockedBuffer) {
	t.Helper()
	recs := ocsftest.Records(out.String())
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2:\n%s", len(recs), out.String())
	}
	got := map[string]bool{}
	for _, r := range recs {
		if err := ocsftest.Validate(r); err != nil {
			t.Errorf("%v\n%s", err, r)
		}
		a := func(p string) string { return fmt.Sprint(ocsftest.Attr(r, p)) }
		if a("class_uid") != "3004" || a("activity_id") != "1" || a("status_id") != "2" || a("status_detail") == "" ||
			a("unmapped.workspace") != "team" || a("entity.version") != "r1" {
			t.Errorf("record: %s", r)
		}
		got[a("unmapped.sandbox")] = true
	}
	if !got["bad"] || !got["worse"] {
		t.Errorf("records for %v, want bad and worse", got)
	}
}

// TestOCSFFileSourceRejected: each instance entry of the routes file that
// fails validation gives one OCSF record.
func TestOCSFFileSourceRejected(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.json")
	writeAtomic(t, path, rejectingDoc)
	var out lockedBuffer
	src := &FileSource{Path: path, Sink: &countingSink{}, Refresh: time.Hour, Poll: 10 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), OCSF: ocsf.NewEmitter(&out, slog.LevelWarn, ocsf.Product{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testutil.Eventually(t, 5*time.Second, "two records", func() bool { return len(ocsftest.Records(out.String())) >= 2 })
	checkRejected(t, &out)
}

// TestOCSFGatewayRejected: the same for a document from the gateway.
func TestOCSFGatewayRejected(t *testing.T) {
	var out lockedBuffer
	c := &GatewayClient{Sink: &countingSink{}, Logger: slog.New(slog.DiscardHandler), Metrics: NewMetrics(nil),
		OCSF: ocsf.NewEmitter(&out, slog.LevelInfo, ocsf.Product{})}
	if err := c.applyDocument([]byte(rejectingDoc), "push", nil, ""); err != nil {
		t.Fatal(err)
	}
	checkRejected(t, &out)
}
