package routes

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/ocsf/ocsftest"
)

type ocsfBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *ocsfBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// take returns the records written since the last call, as
// "message activity_id" with the entity name, and checks each against
// its class.
func (s *ocsfBuf) take(t *testing.T) []string {
	t.Helper()
	s.mu.Lock()
	recs := ocsftest.Records(s.b.String())
	s.b.Reset()
	s.mu.Unlock()
	var out []string
	for _, r := range recs {
		if err := ocsftest.Validate(r); err != nil {
			t.Errorf("%v\n%s", err, r)
		}
		out = append(out, fmt.Sprintf("%v %v %v", ocsftest.Attr(r, "message"), ocsftest.Attr(r, "activity_id"), ocsftest.Attr(r, "entity.name")))
	}
	return out
}

func ocsfDoc(t *testing.T, instances ...string) *Document {
	t.Helper()
	doc, err := ParseDocument([]byte(`{"revision":"r","instances":[` + strings.Join(instances, ",") + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func demo(services string) string {
	return `{"workspace":"team","sandbox":"demo","generation":"1","services":[` + services + `]}`
}

// TestOCSFRouteRecords: installs are Entity Management Create records,
// changes Update, withdrawals, rejections and expiries Delete (the last
// two medium), renewals one table record at debug, closing one table
// record; each validates against the class.
func TestOCSFRouteRecords(t *testing.T) {
	out := &ocsfBuf{}
	clock := newFakeClock()
	table := NewTable(Options{Domain: "apps.test", Freshness: 30 * time.Second, Clock: clock,
		Logger: slog.New(slog.DiscardHandler), OCSF: ocsf.NewEmitter(out, slog.LevelDebug, ocsf.Product{})})
	web, api := "team--demo--web.apps.test", "team--demo--api.apps.test"
	want := func(step string, lines ...string) {
		t.Helper()
		got := out.take(t)
		if strings.Join(got, "\n") != strings.Join(lines, "\n") {
			t.Errorf("%s: records\n%s\nwant\n%s", step, strings.Join(got, "\n"), strings.Join(lines, "\n"))
		}
	}
	table.Apply(ocsfDoc(t, demo(`{"name":"web","port":8080},{"name":"api","port":9090}`)))
	// Route records of one change come in no particular order.
	sorted := func() []string {
		got := out.take(t)
		if len(got) > 1 {
			slices.Sort(got[:len(got)-1])
		}
		return got
	}
	if got := sorted(); !slices.Equal(got, []string{"route installed 1 " + api, "route installed 1 " + web, "routes renewed 3 apps.test"}) {
		t.Errorf("install: %q", got)
	}
	table.Apply(ocsfDoc(t, demo(`{"name":"web","port":8081}`)))
	if got := sorted(); !slices.Equal(got, []string{"route changed 3 " + web, "route withdrawn 4 " + api, "routes renewed 3 apps.test"}) {
		t.Errorf("change: %q", got)
	}
	table.Renew()
	want("renewal", "routes renewed 3 apps.test")
	table.Apply(ocsfDoc(t, demo(`{"name":"web","port":80800}`)))
	want("rejection", "route rejected 4 "+web, "routes renewed 3 apps.test")
	table.Apply(ocsfDoc(t, demo(`{"name":"web","port":8080}`)))
	want("reinstall", "route installed 1 "+web, "routes renewed 3 apps.test")
	clock.Advance(31 * time.Second)
	want("expiry", "route expired 4 "+web)
	table.Apply(ocsfDoc(t, demo(`{"name":"web","port":8080}`)))
	_ = out.take(t)
	table.Close()
	want("close", "routes closed 4 apps.test")
}

// TestOCSFLargeChange: a change of more than 64 routes is one table
// record at info; its route records are at debug only.
func TestOCSFLargeChange(t *testing.T) {
	var instances []string
	for i := range 100 {
		instances = append(instances, fmt.Sprintf(`{"workspace":"team","sandbox":"s%d","generation":"1","services":[{"name":"web","port":8080}]}`, i))
	}
	doc := ocsfDoc(t, instances...)
	if len(doc.Rejected) > 0 {
		t.Fatalf("rejected: %+v", doc.Rejected)
	}
	for _, c := range []struct {
		level slog.Level
		want  int
	}{{slog.LevelInfo, 1}, {slog.LevelDebug, 1 + 100 + 1}} {
		out := &ocsfBuf{}
		table := NewTable(Options{Domain: "apps.test", Logger: slog.New(slog.DiscardHandler),
			OCSF: ocsf.NewEmitter(out, c.level, ocsf.Product{})})
		table.Apply(doc)
		got := out.take(t)
		if len(got) != c.want || got[0] != "routes changed 3 apps.test" {
			t.Errorf("level %v: %d records (%q...), want %d starting with the summary", c.level, len(got), got[:min(3, len(got))], c.want)
		}
		table.Close()
	}
}
