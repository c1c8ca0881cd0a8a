package edge

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/ocsf/ocsftest"
	"github.com/applistener/applistener/internal/testutil"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) records() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ocsftest.Records(s.b.String())
}

// TestEdgeOCSF: the edge writes a Network Activity record for an unknown
// name (Refuse), a supervisor it cannot reach (Fail) and, at debug, a
// spliced connection (Open); each validates against the class.
func TestEdgeOCSF(t *testing.T) {
	ca := newCA(t)
	up, down := newFakeSupervisor(t, ca, "sup-1"), newFakeSupervisor(t, ca, "sup-2")
	down.close()
	src := newFakeSource()
	out := &syncBuf{}
	f := newEdgeFixtureConfig(t, Config{Source: src, Workspaces: []string{"team"}, WithdrawGrace: -1,
		HelloTimeout: 2 * time.Second, HalfCloseTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler),
		OCSF: ocsf.NewEmitter(out, slog.LevelDebug, ocsf.Product{})}, ca.Pool())
	exp := time.Now().Add(time.Minute)
	src.send(t, "team", routeTo(hostA, up, 1, exp), routeTo(hostB, down, 1, exp))
	f.expectOwner(hostA, up)
	f.expectUnrecognized("team--nope.apps.test")
	if c, err := f.dial(hostB); err == nil {
		_ = c.Close()
		t.Fatal("a route to a closed supervisor spliced")
	}
	testutil.Eventually(t, 5*time.Second, "three records", func() bool { return len(out.records()) >= 3 })
	got := map[string]string{}
	for _, r := range out.records() {
		if err := ocsftest.Validate(r); err != nil {
			t.Errorf("%v\n%s", err, r)
		}
		a := func(p string) string { return fmt.Sprint(ocsftest.Attr(r, p)) }
		got[a("activity_id")] = a("dst_endpoint.hostname") + " " + a("status_detail")
	}
	if len(out.records()) != 3 || got["1"] != hostA+" <nil>" || got["5"] != "team--nope.apps.test unknown_name" ||
		len(got["4"]) < len(hostB) || got["4"][:len(hostB)] != hostB {
		t.Errorf("records by activity: %q", got)
	}
}
