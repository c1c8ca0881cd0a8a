package routes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	tbDomain = "apps.test"
	tbFresh  = 30 * time.Second

	tbWeb  = "team--demo--web.apps.test" // team/demo, service "web", port 8080
	tbDemo = "team--demo.apps.test"      // team/demo, unnamed service, port 3000
	tbAPI  = "team--other--api.apps.test"
	tbShop = "acme--shop.apps.test"
)

var (
	tbAllHosts = []string{tbWeb, tbDemo, tbAPI, tbShop}
	tbKeyDemo  = InstanceKey{Workspace: "team", Sandbox: "demo"}
)

// tbBase returns the fixture's instances, freshly allocated so that a test
// may modify them: three instances, four routes.
func tbBase() []InstanceSpec {
	return []InstanceSpec{
		{
			Workspace: "team", Sandbox: "demo", Generation: "3",
			Connector: ConnectorSpec{Type: ConnectorTCP, Host: "127.0.0.1"},
			Limits:    Limits{MaxStreams: 256},
			Services:  []ServiceSpec{{Name: "web", Port: 8080, Revision: 7}, {Name: "", Port: 3000, Revision: 2}},
		},
		{
			Workspace: "team", Sandbox: "other", Generation: "1",
			Services: []ServiceSpec{{Name: "api", Port: 9000, Revision: 1}},
		},
		{
			Workspace: "acme", Sandbox: "shop", Generation: "a",
			Connector: ConnectorSpec{Type: ConnectorUnix, Path: "/run/sbx/shop/{port}.sock"},
			Limits:    Limits{MaxStreams: 2},
			Services:  []ServiceSpec{{Name: "", Port: 8000}},
		},
	}
}

// tbDocJSON renders a configuration document. Each entry is an
// InstanceSpec (marshalled with its JSON tags) or a raw JSON string.
func tbDocJSON(t testing.TB, revision string, entries ...any) []byte {
	t.Helper()
	raw := make([]json.RawMessage, 0, len(entries))
	for _, e := range entries {
		switch e := e.(type) {
		case string:
			raw = append(raw, json.RawMessage(e))
		case InstanceSpec:
			b, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			raw = append(raw, b)
		default:
			t.Fatalf("tbDocJSON: unsupported entry %T", e)
		}
	}
	data, err := json.Marshal(struct {
		Revision  string            `json:"revision"`
		Instances []json.RawMessage `json:"instances"`
	}{revision, raw})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// tbParse runs the document through ParseDocument (and so validation).
func tbParse(t testing.TB, revision string, entries ...any) *Document {
	t.Helper()
	data := tbDocJSON(t, revision, entries...)
	doc, err := ParseDocument(data)
	if err != nil {
		t.Fatalf("ParseDocument(%s): %v", data, err)
	}
	return doc
}

// tbSpecs converts instances to tbParse entries.
func tbSpecs(specs []InstanceSpec) []any {
	out := make([]any, len(specs))
	for i, s := range specs {
		out[i] = s
	}
	return out
}

// tbApply parses specs as document revision rev and applies it.
func tbApply(t testing.TB, tbl *Table, rev string, specs []InstanceSpec) ApplyResult {
	t.Helper()
	doc := tbParse(t, rev, tbSpecs(specs)...)
	if len(doc.Rejected) != 0 {
		t.Fatalf("fixture document has rejected entries: %+v", doc.Rejected)
	}
	return tbl.Apply(doc)
}

// newTB returns a table on a fake clock with the test domain and freshness.
// The table is closed when the test ends.
func newTB(t testing.TB, mods ...func(*Options)) (*Table, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	opts := Options{
		Domain:    tbDomain,
		Freshness: tbFresh,
		Clock:     clk,
		Logger:    slog.New(slog.DiscardHandler),
	}
	for _, m := range mods {
		m(&opts)
	}
	tbl := NewTable(opts)
	t.Cleanup(tbl.Close)
	return tbl, clk
}

// tbLookupAll returns the route of every host, failing if one is missing.
func tbLookupAll(t testing.TB, tbl *Table, hosts ...string) map[string]*Route {
	t.Helper()
	out := make(map[string]*Route, len(hosts))
	for _, h := range hosts {
		r := tbl.Lookup(h)
		if r == nil {
			t.Fatalf("Lookup(%q) = nil, want a route", h)
		}
		out[h] = r
	}
	return out
}

func tbMaxVersion(routes map[string]*Route) uint64 {
	var v uint64
	for _, r := range routes {
		v = max(v, r.InstallationVersion)
	}
	return v
}

// recStream is a Stream that records its revocations.
type recStream struct {
	name   string
	mu     sync.Mutex
	causes []error
}

func (s *recStream) Revoke(cause error) {
	s.mu.Lock()
	s.causes = append(s.causes, cause)
	s.mu.Unlock()
}

func (s *recStream) revocations() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.causes)
}

// tbAttach attaches a new recording stream to r's lease.
func tbAttach(t testing.TB, r *Route) *recStream {
	t.Helper()
	s := &recStream{name: fmt.Sprintf("%s#%d", r.Host, r.InstallationVersion)}
	if !r.Lease.Attach(s) {
		t.Fatalf("Attach to the live route %s (v%d) = false", r.Host, r.InstallationVersion)
	}
	return s
}

// tbAttachAll attaches one stream to each route.
func tbAttachAll(t testing.TB, routes map[string]*Route) map[string]*recStream {
	t.Helper()
	out := make(map[string]*recStream, len(routes))
	for h, r := range routes {
		out[h] = tbAttach(t, r)
	}
	return out
}

func wantRevoked(t testing.TB, s *recStream, cause error) {
	t.Helper()
	got := s.revocations()
	if len(got) != 1 || !errors.Is(got[0], cause) {
		t.Errorf("stream %s: revocations %v, want exactly one with %q", s.name, got, cause)
	}
}

func wantNotRevoked(t testing.TB, s *recStream) {
	t.Helper()
	if got := s.revocations(); len(got) != 0 {
		t.Errorf("stream %s: revoked with %v, want untouched", s.name, got)
	}
}

// wantCancelled checks that a route's lease is cancelled with cause.
func wantCancelled(t testing.TB, r *Route, cause error) {
	t.Helper()
	if r.Lease.Live() {
		t.Errorf("route %s v%d: lease still live, want cancelled with %q", r.Host, r.InstallationVersion, cause)
		return
	}
	if err := r.Lease.Err(); !errors.Is(err, cause) {
		t.Errorf("route %s v%d: lease cause %v, want %q", r.Host, r.InstallationVersion, err, cause)
	}
	select {
	case <-r.Lease.Done():
	default:
		t.Errorf("route %s v%d: Done not closed", r.Host, r.InstallationVersion)
	}
	if r.Usable() {
		t.Errorf("route %s v%d: Usable after cancellation", r.Host, r.InstallationVersion)
	}
}

func wantLive(t testing.TB, r *Route) {
	t.Helper()
	if !r.Lease.Live() || r.Lease.Err() != nil {
		t.Errorf("route %s v%d: lease cancelled (%v), want live", r.Host, r.InstallationVersion, r.Lease.Err())
	}
}

func TestTableInstall(t *testing.T) {
	tbl, clk := newTB(t)
	if tbl.Accepted() {
		t.Error("Accepted before any document")
	}
	if tbl.Fresh() {
		t.Error("Fresh before any document")
	}
	if r := tbl.Lookup(tbWeb); r != nil {
		t.Errorf("Lookup on an empty table = %v", r.Host)
	}
	tbl.Renew() // no document yet: nothing to renew
	if tbl.Accepted() || tbl.Snapshot().Len() != 0 {
		t.Error("Renew without a document changed the table")
	}
	if got := tbl.Domain(); got != tbDomain {
		t.Errorf("Domain = %q", got)
	}
	if got := tbl.Freshness(); got != tbFresh {
		t.Errorf("Freshness = %v", got)
	}

	res := tbApply(t, tbl, "r1", tbBase())
	if want := (ApplyResult{Installed: 4}); res != want {
		t.Errorf("Apply = %+v, want %+v", res, want)
	}
	if !tbl.Accepted() || !tbl.Fresh() {
		t.Errorf("after Apply: Accepted=%v Fresh=%v, want both", tbl.Accepted(), tbl.Fresh())
	}

	tests := []struct {
		host, ws, sb, svc string
		port              int
		gen               string
		conn              ConnectorSpec
		decl              int64
		maxStreams        int64
	}{
		{tbWeb, "team", "demo", "web", 8080, "3", ConnectorSpec{Type: "tcp", Host: "127.0.0.1"}, 7, 256},
		{tbDemo, "team", "demo", "", 3000, "3", ConnectorSpec{Type: "tcp", Host: "127.0.0.1"}, 2, 256},
		{tbAPI, "team", "other", "api", 9000, "1", ConnectorSpec{Type: "tcp", Host: "127.0.0.1"}, 1, 0},
		{tbShop, "acme", "shop", "", 8000, "a", ConnectorSpec{Type: "unix", Path: "/run/sbx/shop/{port}.sock"}, 0, 2},
	}
	versions := map[uint64]string{}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			r := tbl.Lookup(tt.host)
			if r == nil {
				t.Fatalf("Lookup(%q) = nil", tt.host)
			}
			if r.Host != tt.host || r.Workspace != tt.ws || r.Sandbox != tt.sb || r.Service != tt.svc ||
				r.Port != tt.port || r.Generation != tt.gen || r.Connector != tt.conn {
				t.Errorf("route = {%q %q %q %q %d %q %+v}, want {%q %q %q %q %d %q %+v}",
					r.Host, r.Workspace, r.Sandbox, r.Service, r.Port, r.Generation, r.Connector,
					tt.host, tt.ws, tt.sb, tt.svc, tt.port, tt.gen, tt.conn)
			}
			if got := r.DeclarationRevision(); got != tt.decl {
				t.Errorf("DeclarationRevision = %d, want %d", got, tt.decl)
			}
			if r.Instance == nil || r.Instance.Key != (InstanceKey{tt.ws, tt.sb}) {
				t.Fatalf("Instance = %+v, want key %s/%s", r.Instance, tt.ws, tt.sb)
			}
			if got := r.Instance.MaxStreams(); got != tt.maxStreams {
				t.Errorf("MaxStreams = %d, want %d", got, tt.maxStreams)
			}
			if r.InstallationVersion == 0 {
				t.Error("InstallationVersion = 0")
			}
			if other, dup := versions[r.InstallationVersion]; dup {
				t.Errorf("InstallationVersion %d also used by %s", r.InstallationVersion, other)
			}
			versions[r.InstallationVersion] = tt.host
			wantLive(t, r)
			if !r.Usable() {
				t.Error("Usable = false")
			}
			if want := fakeEpoch.Add(tbFresh); !r.FreshUntil().Equal(want) {
				t.Errorf("FreshUntil = %v, want %v", r.FreshUntil(), want)
			}
			if r.Lease.Streams() != 0 {
				t.Errorf("new lease has %d streams", r.Lease.Streams())
			}
			if again := tbl.Lookup(tt.host); again != r {
				t.Error("a second Lookup returned a different *Route")
			}
		})
	}
	if tbl.Lookup(tbWeb).Instance != tbl.Lookup(tbDemo).Instance {
		t.Error("the two services of team/demo do not share one *Instance")
	}

	snap := tbl.Snapshot()
	if snap.Len() != 4 || snap.Revision != "r1" {
		t.Errorf("Snapshot: Len %d Revision %q, want 4 r1", snap.Len(), snap.Revision)
	}
	rs := snap.Routes()
	if !slices.IsSortedFunc(rs, func(a, b *Route) int { return strings.Compare(a.Host, b.Host) }) {
		t.Error("Snapshot.Routes not sorted by hostname")
	}
	for _, r := range rs {
		if tbl.Lookup(r.Host) != r {
			t.Errorf("Snapshot route %s is not what Lookup returns", r.Host)
		}
	}

	for _, miss := range []string{
		"",
		"apps.test",
		"team--demo--nope.apps.test", // unknown service
		"team--nope.apps.test",       // unknown sandbox
		"team--other.apps.test",      // instance without an unnamed service
		"other--demo--web.apps.test", // same sandbox and service names, other workspace
		"other--demo.apps.test",      // ditto, unnamed service
		"demo--team--web.apps.test",  // names swapped
		"team--demo--web.apps.other", // other domain
		"team--demo--web.apps.test.", // not normalized: trailing dot
		"team--demo--web.apps.test:8443",
		"x.team--demo--web.apps.test", // no wildcard routes
		"team--demo--web",
		"team--demo--web.apps.test.evil",
	} {
		if r := tbl.Lookup(miss); r != nil {
			t.Errorf("Lookup(%q) = route %s, want nil", miss, r.Host)
		}
	}

	// A later installation gets a bigger version than every earlier one.
	before := tbLookupAll(t, tbl, tbAllHosts...)
	specs := tbBase()
	specs[0].Services = append(specs[0].Services, ServiceSpec{Name: "docs", Port: 8081})
	clk.Advance(time.Second)
	res = tbApply(t, tbl, "r2", specs)
	if want := (ApplyResult{Installed: 1, Kept: 4}); res != want {
		t.Errorf("Apply with one more service = %+v, want %+v", res, want)
	}
	docs := tbl.Lookup("team--demo--docs.apps.test")
	if docs == nil {
		t.Fatal("new service not routed")
	}
	if docs.InstallationVersion <= tbMaxVersion(before) {
		t.Errorf("new InstallationVersion %d not above the earlier ones (max %d)", docs.InstallationVersion, tbMaxVersion(before))
	}
	if docs.Instance != before[tbWeb].Instance {
		t.Error("a new service of an existing instance got another *Instance")
	}
}

// renewal keeps every route, version and stream, and moves the deadline.
func TestTableRenew(t *testing.T) {
	tests := []struct {
		name     string
		renew    func(t *testing.T, tbl *Table, doc *Document)
		revision string
	}{
		{"apply the same document again", func(t *testing.T, tbl *Table, doc *Document) {
			if res := tbApply(t, tbl, "r1", tbBase()); res != (ApplyResult{Kept: 4}) {
				t.Errorf("Apply = %+v, want Kept 4", res)
			}
		}, "r1"},
		{"apply the same *Document again", func(t *testing.T, tbl *Table, doc *Document) {
			if res := tbl.Apply(doc); res != (ApplyResult{Kept: 4}) {
				t.Errorf("Apply = %+v, want Kept 4", res)
			}
		}, "r1"},
		{"apply an equal document with a new revision", func(t *testing.T, tbl *Table, doc *Document) {
			if res := tbApply(t, tbl, "r2", tbBase()); res != (ApplyResult{Kept: 4}) {
				t.Errorf("Apply = %+v, want Kept 4", res)
			}
		}, "r2"},
		{"Renew", func(t *testing.T, tbl *Table, doc *Document) { tbl.Renew() }, "r1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, clk := newTB(t)
			doc := tbParse(t, "r1", tbSpecs(tbBase())...)
			tbl.Apply(doc)
			routes := tbLookupAll(t, tbl, tbAllHosts...)
			streams := tbAttachAll(t, routes)

			clk.Advance(20 * time.Second)
			tt.renew(t, tbl, doc)
			if want := fakeEpoch.Add(20*time.Second + tbFresh); !routes[tbWeb].FreshUntil().Equal(want) {
				t.Errorf("FreshUntil after renewal = %v, want %v", routes[tbWeb].FreshUntil(), want)
			}
			if got := tbl.Snapshot().Revision; got != tt.revision {
				t.Errorf("Snapshot.Revision = %q, want %q", got, tt.revision)
			}
			check := func(when string) {
				t.Helper()
				for _, h := range tbAllHosts {
					r := tbl.Lookup(h)
					if r != routes[h] {
						t.Errorf("%s: Lookup(%s) = %p, want the same *Route %p", when, h, r, routes[h])
						continue
					}
					if r.InstallationVersion != routes[h].InstallationVersion {
						t.Errorf("%s: %s version changed", when, h)
					}
					wantLive(t, r)
					wantNotRevoked(t, streams[h])
					if r.Lease.Streams() != 1 {
						t.Errorf("%s: %s lease has %d streams, want 1", when, h, r.Lease.Streams())
					}
				}
			}
			check("after renewal")

			// 40 s after the first delivery, 20 s after the renewal.
			clk.Advance(20 * time.Second)
			if !tbl.Fresh() {
				t.Fatal("renewal did not move the deadline: stale 20 s after it")
			}
			check("20 s after renewal")

			// Expiry follows the renewed deadline to the nanosecond.
			clk.Advance(10*time.Second - time.Nanosecond)
			check("1 ns before the renewed deadline")
			clk.Advance(time.Nanosecond)
			for _, h := range tbAllHosts {
				wantCancelled(t, routes[h], ErrExpired)
				wantRevoked(t, streams[h], ErrExpired)
			}
		})
	}
}

// A changed declaration revision alone is a renewal, not a reinstallation.
func TestTableDeclarationRevisionOnly(t *testing.T) {
	tbl, clk := newTB(t)
	tbApply(t, tbl, "r1", tbBase())
	routes := tbLookupAll(t, tbl, tbAllHosts...)
	streams := tbAttachAll(t, routes)

	clk.Advance(10 * time.Second)
	specs := tbBase()
	specs[0].Services[0].Revision = 8
	specs[0].Services[1].Revision = 0
	specs[2].Services[0].Revision = 99
	res := tbApply(t, tbl, "r2", specs)
	if want := (ApplyResult{Kept: 4}); res != want {
		t.Errorf("Apply = %+v, want %+v", res, want)
	}
	for host, want := range map[string]int64{tbWeb: 8, tbDemo: 0, tbAPI: 1, tbShop: 99} {
		r := tbl.Lookup(host)
		if r != routes[host] {
			t.Errorf("%s: reinstalled (v%d -> v%d), want the same route", host, routes[host].InstallationVersion, r.InstallationVersion)
			continue
		}
		if got := r.DeclarationRevision(); got != want {
			t.Errorf("%s: DeclarationRevision = %d, want %d", host, got, want)
		}
		wantLive(t, r)
		wantNotRevoked(t, streams[host])
	}
	if want := fakeEpoch.Add(10*time.Second + tbFresh); !tbl.Lookup(tbWeb).FreshUntil().Equal(want) {
		t.Errorf("FreshUntil = %v, want %v", tbl.Lookup(tbWeb).FreshUntil(), want)
	}
}

// start_grace_seconds is carried on the route, and a change of it alone
// is a renewal (the route is kept, its streams untouched).
func TestTableStartGrace(t *testing.T) {
	tbl, _ := newTB(t)
	specs := tbBase()
	specs[0].Services[0].StartGraceSeconds = new(12)
	specs[0].Services[1].StartGraceSeconds = new(0)
	tbApply(t, tbl, "r1", specs)
	want := func(host string, d time.Duration, ok bool) {
		t.Helper()
		if got, gotOK := tbl.Lookup(host).StartGrace(); got != d || gotOK != ok {
			t.Errorf("%s: StartGrace() = %v, %v; want %v, %v", host, got, gotOK, d, ok)
		}
	}
	want(tbWeb, 12*time.Second, true)
	want(tbDemo, 0, true)
	want(tbAPI, 0, false)
	web := tbl.Lookup(tbWeb)
	streams := tbAttachAll(t, map[string]*Route{tbWeb: web})

	specs = tbBase()
	specs[0].Services[1].StartGraceSeconds = new(3)
	if res := tbApply(t, tbl, "r2", specs); res != (ApplyResult{Kept: 4}) {
		t.Errorf("Apply = %+v; want every route kept", res)
	}
	if tbl.Lookup(tbWeb) != web {
		t.Errorf("a changed start_grace_seconds reinstalled %s", tbWeb)
	}
	wantNotRevoked(t, streams[tbWeb])
	want(tbWeb, 0, false)
	want(tbDemo, 3*time.Second, true)

	// A reinstallation (a stopped instance) keeps the value.
	tbl.StopInstance(InstanceKey{"team", "demo"})
	want(tbDemo, 3*time.Second, true)
}

// A change of target reinstalls exactly the affected routes.
func TestTableChange(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(s []InstanceSpec)
		changed []string
	}{
		{"port of a named service", func(s []InstanceSpec) { s[0].Services[0].Port = 8081 }, []string{tbWeb}},
		{"port of the unnamed service", func(s []InstanceSpec) { s[0].Services[1].Port = 3001 }, []string{tbDemo}},
		{"ports of two instances", func(s []InstanceSpec) { s[0].Services[0].Port = 1; s[2].Services[0].Port = 65535 }, []string{tbWeb, tbShop}},
		{"generation", func(s []InstanceSpec) { s[0].Generation = "4" }, []string{tbWeb, tbDemo}},
		{"generation to empty", func(s []InstanceSpec) { s[1].Generation = "" }, []string{tbAPI}},
		{"tcp connector host", func(s []InstanceSpec) { s[0].Connector.Host = "127.0.0.2" }, []string{tbWeb, tbDemo}},
		{"tcp connector to IPv6 loopback", func(s []InstanceSpec) { s[0].Connector.Host = "::1" }, []string{tbWeb, tbDemo}},
		{"connector type tcp to netns", func(s []InstanceSpec) {
			s[0].Connector = ConnectorSpec{Type: ConnectorNetns, Path: "/run/netns/demo"}
		}, []string{tbWeb, tbDemo}},
		{"unix connector path", func(s []InstanceSpec) { s[2].Connector.Path = "/run/sbx/shop2/{port}.sock" }, []string{tbShop}},
		{"connector type unix to tcp", func(s []InstanceSpec) { s[2].Connector = ConnectorSpec{} }, []string{tbShop}},
		{"protocol to h2c", func(s []InstanceSpec) { s[0].Services[0].Protocol = ProtocolH2C }, []string{tbWeb}},
		// Normalization: these spell the same target and change nothing.
		{"tcp host localhost is 127.0.0.1", func(s []InstanceSpec) { s[0].Connector.Host = "localhost" }, nil},
		{"missing connector is tcp 127.0.0.1", func(s []InstanceSpec) { s[0].Connector = ConnectorSpec{} }, nil},
		{"protocol http1 is the default", func(s []InstanceSpec) { s[0].Services[0].Protocol = ProtocolHTTP1 }, nil},
		{"limits and revisions only", func(s []InstanceSpec) { s[0].Limits.MaxStreams = 1; s[0].Services[0].Revision = 100 }, nil},
		{"services reordered", func(s []InstanceSpec) { slices.Reverse(s[0].Services) }, nil},
		{"instances reordered", func(s []InstanceSpec) { slices.Reverse(s) }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, clk := newTB(t)
			tbApply(t, tbl, "r1", tbBase())
			old := tbLookupAll(t, tbl, tbAllHosts...)
			streams := tbAttachAll(t, old)
			oldMax := tbMaxVersion(old)

			clk.Advance(time.Second)
			specs := tbBase()
			tt.mutate(specs)
			res := tbApply(t, tbl, "r2", specs)
			if want := (ApplyResult{Changed: len(tt.changed), Kept: 4 - len(tt.changed)}); res != want {
				t.Errorf("Apply = %+v, want %+v", res, want)
			}
			newVersions := map[uint64]bool{}
			for _, h := range tbAllHosts {
				r := tbl.Lookup(h)
				if r == nil {
					t.Errorf("Lookup(%s) = nil after the change", h)
					continue
				}
				if !slices.Contains(tt.changed, h) {
					if r != old[h] {
						t.Errorf("%s: reinstalled (v%d -> v%d), want untouched", h, old[h].InstallationVersion, r.InstallationVersion)
					}
					wantLive(t, old[h])
					wantNotRevoked(t, streams[h])
					continue
				}
				if r == old[h] {
					t.Errorf("%s: same *Route after its target changed", h)
					continue
				}
				if r.InstallationVersion <= oldMax || newVersions[r.InstallationVersion] {
					t.Errorf("%s: new InstallationVersion %d not fresh (old max %d, new so far %v)", h, r.InstallationVersion, oldMax, newVersions)
				}
				newVersions[r.InstallationVersion] = true
				wantCancelled(t, old[h], ErrChanged)
				wantRevoked(t, streams[h], ErrChanged)
				wantLive(t, r)
				if !r.Usable() || r.Lease.Streams() != 0 {
					t.Errorf("%s: new route Usable=%v Streams=%d", h, r.Usable(), r.Lease.Streams())
				}
				if r.Instance != old[h].Instance {
					t.Errorf("%s: new route has another *Instance (limits and active streams must carry over)", h)
				}
			}
			// The new routes carry the new targets.
			for _, spec := range specs {
				for _, svc := range spec.Services {
					host := Hostname(spec.Workspace, spec.Sandbox, svc.Name, tbDomain)
					r := tbl.Lookup(host)
					if r == nil {
						continue
					}
					want := spec.Connector
					if want == (ConnectorSpec{}) || want.Host == "localhost" {
						want = ConnectorSpec{Type: ConnectorTCP, Host: DefaultConnectorHost}
					}
					if r.Port != svc.Port || r.Generation != spec.Generation || r.Connector != want {
						t.Errorf("%s: target {%d %q %+v}, want {%d %q %+v}", host, r.Port, r.Generation, r.Connector, svc.Port, spec.Generation, want)
					}
					wantProto := svc.Protocol
					if wantProto == ProtocolHTTP1 {
						wantProto = ""
					}
					if r.Protocol != wantProto {
						t.Errorf("%s: Protocol %q, want %q", host, r.Protocol, wantProto)
					}
				}
			}
		})
	}
}

// Withdrawing part of the configuration revokes exactly that part.
func TestTableWithdraw(t *testing.T) {
	tests := []struct {
		name      string
		mutate    func(s []InstanceSpec) []InstanceSpec
		withdrawn []string
	}{
		{"one named service", func(s []InstanceSpec) []InstanceSpec {
			s[0].Services = s[0].Services[1:]
			return s
		}, []string{tbWeb}},
		{"the unnamed service", func(s []InstanceSpec) []InstanceSpec {
			s[0].Services = s[0].Services[:1]
			return s
		}, []string{tbDemo}},
		{"one instance", func(s []InstanceSpec) []InstanceSpec { return slices.Delete(s, 1, 2) }, []string{tbAPI}},
		{"an instance with two services", func(s []InstanceSpec) []InstanceSpec { return s[1:] }, []string{tbWeb, tbDemo}},
		{"every instance", func(s []InstanceSpec) []InstanceSpec { return nil }, tbAllHosts},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, clk := newTB(t)
			tbApply(t, tbl, "r1", tbBase())
			old := tbLookupAll(t, tbl, tbAllHosts...)
			streams := tbAttachAll(t, old)
			extra := tbAttach(t, old[tbAllHosts[0]]) // a second stream on one route

			clk.Advance(time.Second)
			res := tbApply(t, tbl, "r2", tt.mutate(tbBase()))
			n := len(tt.withdrawn)
			if want := (ApplyResult{Withdrawn: n, Kept: 4 - n}); res != want {
				t.Errorf("Apply = %+v, want %+v", res, want)
			}
			if got := tbl.Snapshot().Len(); got != 4-n {
				t.Errorf("Snapshot.Len = %d, want %d", got, 4-n)
			}
			for _, h := range tbAllHosts {
				if slices.Contains(tt.withdrawn, h) {
					if r := tbl.Lookup(h); r != nil {
						t.Errorf("Lookup(%s) after withdrawal = v%d, want nil", h, r.InstallationVersion)
					}
					wantCancelled(t, old[h], ErrWithdrawn)
					wantRevoked(t, streams[h], ErrWithdrawn)
					if h == tbAllHosts[0] {
						wantRevoked(t, extra, ErrWithdrawn)
					}
					continue
				}
				if r := tbl.Lookup(h); r != old[h] {
					t.Errorf("Lookup(%s) changed, want the untouched route", h)
				}
				wantLive(t, old[h])
				wantNotRevoked(t, streams[h])
				if h == tbAllHosts[0] {
					wantNotRevoked(t, extra)
				}
			}

			// Delivering it again installs it anew.
			clk.Advance(time.Second)
			res = tbApply(t, tbl, "r3", tbBase())
			if want := (ApplyResult{Installed: n, Kept: 4 - n}); res != want {
				t.Errorf("re-Apply = %+v, want %+v", res, want)
			}
			for _, h := range tt.withdrawn {
				r := tbl.Lookup(h)
				if r == nil || r.InstallationVersion <= tbMaxVersion(old) {
					t.Errorf("%s not reinstalled with a new version: %v", h, r)
				}
			}
		})
	}
}

// An invalid instance entry withdraws that instance's routes at once
// (fail closed) and leaves the other instances alone.
func TestTableReject(t *testing.T) {
	const rawTypo = `{"workspace":"team","sandbox":"demo","generation":"3","limits":{"max_stream":1},` +
		`"services":[{"name":"web","port":8080},{"name":"","port":3000}]}`
	tests := []struct {
		name     string
		entries  func() []any
		rejected []string // hosts whose routes are withdrawn as rejected
	}{
		{"port out of range", func() []any {
			s := tbBase()
			s[0].Services[0].Port = 70000
			return tbSpecs(s)
		}, []string{tbWeb, tbDemo}},
		{"port zero", func() []any {
			s := tbBase()
			s[2].Services[0].Port = 0
			return tbSpecs(s)
		}, []string{tbShop}},
		{"unknown field (typo in limits)", func() []any {
			s := tbSpecs(tbBase())
			s[0] = rawTypo
			return s
		}, []string{tbWeb, tbDemo}},
		{"connector not on loopback", func() []any {
			s := tbBase()
			s[0].Connector.Host = "10.0.0.1"
			return tbSpecs(s)
		}, []string{tbWeb, tbDemo}},
		{"invalid service name", func() []any {
			s := tbBase()
			s[1].Services[0].Name = "API"
			return tbSpecs(s)
		}, []string{tbAPI}},
		{"duplicate instance entry", func() []any {
			s := tbBase()
			dup := tbBase()[0]
			dup.Services = dup.Services[:1]
			return tbSpecs(append(s, dup))
		}, []string{tbWeb, tbDemo}},
		{"new invalid instance, never installed", func() []any {
			s := tbBase()
			bad := InstanceSpec{Workspace: "new", Sandbox: "one", Services: []ServiceSpec{{Port: -1}}}
			return tbSpecs(append(s, bad))
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, clk := newTB(t)
			tbApply(t, tbl, "r1", tbBase())
			old := tbLookupAll(t, tbl, tbAllHosts...)
			streams := tbAttachAll(t, old)

			clk.Advance(time.Second)
			doc := tbParse(t, "r2", tt.entries()...)
			if len(doc.Rejected) == 0 {
				t.Fatal("the document has no rejected entry; the test does not test rejection")
			}
			res := tbl.Apply(doc)
			n := len(tt.rejected)
			if want := (ApplyResult{Rejected: n, Kept: 4 - n}); res != want {
				t.Errorf("Apply = %+v, want %+v", res, want)
			}
			for _, h := range tbAllHosts {
				if slices.Contains(tt.rejected, h) {
					if r := tbl.Lookup(h); r != nil {
						t.Errorf("Lookup(%s) = v%d, want nil (rejected)", h, r.InstallationVersion)
					}
					wantCancelled(t, old[h], ErrRejected)
					wantRevoked(t, streams[h], ErrRejected)
					continue
				}
				if r := tbl.Lookup(h); r != old[h] {
					t.Errorf("Lookup(%s) changed, want the untouched route", h)
				}
				wantLive(t, old[h])
				wantNotRevoked(t, streams[h])
			}
			// The rejection renewed the accepted part of the document.
			clk.Advance(tbFresh - time.Nanosecond)
			for _, h := range tbAllHosts {
				if !slices.Contains(tt.rejected, h) && tbl.Lookup(h) != old[h] {
					t.Errorf("%s not renewed by the document that rejected another instance", h)
				}
			}

			// A later valid entry installs the instance again.
			res = tbApply(t, tbl, "r3", tbBase())
			if want := (ApplyResult{Installed: n, Kept: 4 - n}); res != want {
				t.Errorf("valid Apply after the rejection = %+v, want %+v", res, want)
			}
			tbLookupAll(t, tbl, tbAllHosts...)
		})
	}
}

// Routes expire on the timer, with no Lookup driving it, and come back with
// new installation versions on the next delivery.
func TestTableExpiry(t *testing.T) {
	tests := []struct {
		name    string
		recover func(t *testing.T, tbl *Table)
	}{
		{"Renew reinstalls the last document", func(t *testing.T, tbl *Table) { tbl.Renew() }},
		{"Apply reinstalls", func(t *testing.T, tbl *Table) {
			if res := tbApply(t, tbl, "r1", tbBase()); res != (ApplyResult{Installed: 4}) {
				t.Errorf("Apply after expiry = %+v, want Installed 4", res)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, clk := newTB(t)
			tbApply(t, tbl, "r1", tbBase())
			old := tbLookupAll(t, tbl, tbAllHosts...)
			streams := tbAttachAll(t, old)

			clk.Advance(tbFresh - time.Millisecond)
			// No Lookup from here on until the expiry has been checked.
			if !tbl.Fresh() {
				t.Fatal("stale before the deadline")
			}
			for _, h := range tbAllHosts {
				wantLive(t, old[h])
				wantNotRevoked(t, streams[h])
			}

			clk.Advance(time.Millisecond)
			for _, h := range tbAllHosts {
				wantCancelled(t, old[h], ErrExpired)
				wantRevoked(t, streams[h], ErrExpired)
			}
			if tbl.Fresh() {
				t.Error("Fresh after expiry")
			}
			if n := tbl.Snapshot().Len(); n != 0 {
				t.Errorf("Snapshot.Len after expiry = %d, want 0", n)
			}
			if !tbl.Accepted() {
				t.Error("Accepted = false after expiry; it stays true once a configuration was applied")
			}
			for _, h := range tbAllHosts {
				if r := tbl.Lookup(h); r != nil {
					t.Errorf("Lookup(%s) after expiry = v%d, want nil", h, r.InstallationVersion)
				}
			}

			// Time passing does not revoke anything twice.
			clk.Advance(time.Hour)
			for _, h := range tbAllHosts {
				wantRevoked(t, streams[h], ErrExpired)
			}

			tt.recover(t, tbl)
			if !tbl.Fresh() || !tbl.Accepted() {
				t.Errorf("after recovery: Fresh=%v Accepted=%v", tbl.Fresh(), tbl.Accepted())
			}
			now := tbLookupAll(t, tbl, tbAllHosts...)
			seen := map[uint64]bool{}
			for _, h := range tbAllHosts {
				r := now[h]
				if r == old[h] || r.InstallationVersion <= tbMaxVersion(old) || seen[r.InstallationVersion] {
					t.Errorf("%s: reinstalled as v%d, want a new unique version above %d", h, r.InstallationVersion, tbMaxVersion(old))
				}
				seen[r.InstallationVersion] = true
				wantLive(t, r)
				if want := clk.Now().Add(tbFresh); !r.FreshUntil().Equal(want) {
					t.Errorf("%s: FreshUntil = %v, want %v", h, r.FreshUntil(), want)
				}
				wantRevoked(t, streams[h], ErrExpired) // still exactly once
			}
			// ... and they expire again on time.
			clk.Advance(tbFresh)
			for _, h := range tbAllHosts {
				wantCancelled(t, now[h], ErrExpired)
			}
		})
	}
}

// Between the deadline and the expiry timer running, nothing is served.
func TestTableStaleBeforeTimer(t *testing.T) {
	tbl, clk := newTB(t)
	tbApply(t, tbl, "r1", tbBase())
	old := tbLookupAll(t, tbl, tbAllHosts...)
	streams := tbAttachAll(t, old)

	clk.Skip(tbFresh - time.Nanosecond)
	if !tbl.Fresh() {
		t.Fatal("stale 1 ns before the deadline")
	}
	tbLookupAll(t, tbl, tbAllHosts...)

	clk.Skip(time.Nanosecond) // the deadline; the timer has not run
	if tbl.Fresh() {
		t.Error("Fresh at the deadline")
	}
	for _, h := range tbAllHosts {
		if r := tbl.Lookup(h); r != nil {
			t.Errorf("Lookup(%s) at the deadline, timer not yet run = v%d, want nil", h, r.InstallationVersion)
		}
		if old[h].Usable() {
			t.Errorf("%s: Usable at the deadline", h)
		}
	}
	if n := tbl.Snapshot().Len(); n != 4 {
		t.Errorf("Snapshot.Len before the timer = %d; documented to still hold the 4 routes", n)
	}

	clk.Fire()
	for _, h := range tbAllHosts {
		wantCancelled(t, old[h], ErrExpired)
		wantRevoked(t, streams[h], ErrExpired)
	}
	if n := tbl.Snapshot().Len(); n != 0 {
		t.Errorf("Snapshot.Len after the timer = %d, want 0", n)
	}
}

// A delivery that arrives after the deadline but before the expiry timer has
// run: the routes had already expired (Lookup returned nil), so their leases
// must end as expired and the delivery installs them anew. The target did
// not change, so ErrChanged (documented as "generation, connector or port
// changed") is the wrong cause.
func TestTableDeliveryInStaleWindow(t *testing.T) {
	tests := []struct {
		name    string
		deliver func(t *testing.T, tbl *Table)
	}{
		{"Apply", func(t *testing.T, tbl *Table) {
			res := tbApply(t, tbl, "r1", tbBase())
			if res.Changed != 0 || res.Installed != 4 {
				t.Errorf("Apply in the stale window = %+v, want Installed 4 (the routes had expired, no target changed)", res)
			}
		}},
		{"Renew", func(t *testing.T, tbl *Table) { tbl.Renew() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, clk := newTB(t)
			tbApply(t, tbl, "r1", tbBase())
			old := tbLookupAll(t, tbl, tbAllHosts...)
			streams := tbAttachAll(t, old)

			clk.Skip(tbFresh + time.Second) // stale, timer not run
			tt.deliver(t, tbl)
			now := tbLookupAll(t, tbl, tbAllHosts...)
			for _, h := range tbAllHosts {
				if now[h] == old[h] || now[h].InstallationVersion <= tbMaxVersion(old) {
					t.Errorf("%s: expired route kept (v%d), want a new installation", h, now[h].InstallationVersion)
				}
				wantCancelled(t, old[h], ErrExpired)
				wantRevoked(t, streams[h], ErrExpired)
			}
			// The late timer must not touch the new routes.
			clk.Fire()
			for _, h := range tbAllHosts {
				wantLive(t, now[h])
				if tbl.Lookup(h) != now[h] {
					t.Errorf("%s: the late expiry timer replaced the new route", h)
				}
			}
		})
	}
}

func TestTableInstanceLimits(t *testing.T) {
	t.Run("from the document and the default", func(t *testing.T) {
		tbl, _ := newTB(t, func(o *Options) { o.DefaultMaxStreams = 3 })
		tbApply(t, tbl, "r1", tbBase())
		for host, want := range map[string]int64{tbWeb: 256, tbDemo: 256, tbAPI: 3, tbShop: 2} {
			if got := tbl.Lookup(host).Instance.MaxStreams(); got != want {
				t.Errorf("%s: MaxStreams = %d, want %d", host, got, want)
			}
		}
	})

	t.Run("acquire and release", func(t *testing.T) {
		tbl, _ := newTB(t)
		tbApply(t, tbl, "r1", tbBase())
		inst := tbl.Lookup(tbShop).Instance // max_streams 2
		steps := []struct {
			op     string // "acquire" or "release"
			ok     bool
			active int64
		}{
			{"acquire", true, 1},
			{"acquire", true, 2},
			{"acquire", false, 2},
			{"acquire", false, 2},
			{"release", true, 1},
			{"acquire", true, 2},
			{"acquire", false, 2},
			{"release", true, 1},
			{"release", true, 0},
		}
		for i, s := range steps {
			ok := true
			if s.op == "acquire" {
				ok = inst.Acquire()
			} else {
				inst.Release()
			}
			if ok != s.ok || inst.Active() != s.active {
				t.Errorf("step %d %s: ok=%v active=%d, want ok=%v active=%d", i, s.op, ok, inst.Active(), s.ok, s.active)
			}
		}
	})

	t.Run("no limit", func(t *testing.T) {
		tbl, _ := newTB(t) // DefaultMaxStreams 0: unlimited
		tbApply(t, tbl, "r1", tbBase())
		inst := tbl.Lookup(tbAPI).Instance
		if inst.MaxStreams() != 0 {
			t.Fatalf("MaxStreams = %d, want 0", inst.MaxStreams())
		}
		for i := range 10000 {
			if !inst.Acquire() {
				t.Fatalf("Acquire #%d refused without a limit", i)
			}
		}
	})

	t.Run("limit change applies without reinstalling", func(t *testing.T) {
		tbl, clk := newTB(t, func(o *Options) { o.DefaultMaxStreams = 3 })
		tbApply(t, tbl, "r1", tbBase())
		routes := tbLookupAll(t, tbl, tbAllHosts...)
		streams := tbAttachAll(t, routes)
		inst := routes[tbShop].Instance
		inst.Acquire()
		inst.Acquire() // at its limit of 2

		steps := []struct {
			limit      int   // max_streams in the document
			want       int64 // MaxStreams
			release    int   // slots released before trying
			acquirable int   // further Acquire calls that succeed
		}{
			{limit: 1, want: 1, release: 0, acquirable: 0}, // 2 active > 1
			{limit: 1, want: 1, release: 2, acquirable: 1},
			{limit: 5, want: 5, release: 0, acquirable: 4},
			{limit: 0, want: 3, release: 5, acquirable: 3}, // back to the default
		}
		for i, s := range steps {
			clk.Advance(time.Second)
			specs := tbBase()
			specs[2].Limits.MaxStreams = s.limit
			if res := tbApply(t, tbl, "r2", specs); res != (ApplyResult{Kept: 4}) {
				t.Errorf("step %d: Apply = %+v, want Kept 4", i, res)
			}
			if tbl.Lookup(tbShop) != routes[tbShop] || tbl.Lookup(tbShop).Instance != inst {
				t.Fatalf("step %d: limit change reinstalled the route or replaced its *Instance", i)
			}
			if got := inst.MaxStreams(); got != s.want {
				t.Errorf("step %d: MaxStreams = %d, want %d", i, got, s.want)
			}
			for range s.release {
				inst.Release()
			}
			n := 0
			for inst.Acquire() {
				n++
				if n > 100 {
					break
				}
			}
			if n != s.acquirable {
				t.Errorf("step %d: %d more streams acquired, want %d", i, n, s.acquirable)
			}
		}
		for _, h := range tbAllHosts {
			wantNotRevoked(t, streams[h])
		}
	})

	t.Run("idle timeout from the document, changed without reinstalling", func(t *testing.T) {
		tbl, clk := newTB(t)
		specs := tbBase()
		specs[0].Limits.IdleTimeoutSeconds = 60
		tbApply(t, tbl, "r1", specs)
		r := tbl.Lookup(tbWeb)
		if got := r.Instance.IdleTimeout(); got != time.Minute {
			t.Errorf("IdleTimeout = %v, want 1m", got)
		}
		if got := tbl.Lookup(tbAPI).Instance.IdleTimeout(); got != 0 {
			t.Errorf("IdleTimeout without a setting = %v, want 0", got)
		}
		clk.Advance(time.Second)
		specs[0].Limits.IdleTimeoutSeconds = 0
		if res := tbApply(t, tbl, "r2", specs); res != (ApplyResult{Kept: 4}) {
			t.Errorf("Apply = %+v, want Kept 4", res)
		}
		if tbl.Lookup(tbWeb) != r || r.Instance.IdleTimeout() != 0 {
			t.Errorf("idle timeout change: route replaced or IdleTimeout %v, want the same route and 0", r.Instance.IdleTimeout())
		}
	})

	t.Run("concurrent acquire respects the limit", func(t *testing.T) {
		tbl, _ := newTB(t)
		specs := tbBase()
		specs[1].Limits.MaxStreams = 10
		tbApply(t, tbl, "r1", specs)
		inst := tbl.Lookup(tbAPI).Instance
		var got atomic.Int64
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				for range 20 {
					if inst.Acquire() {
						got.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if got.Load() != 10 || inst.Active() != 10 {
			t.Errorf("%d acquired, Active %d, want 10 and 10", got.Load(), inst.Active())
		}
	})
}

func TestTableStopInstance(t *testing.T) {
	tbl, clk := newTB(t)
	tbApply(t, tbl, "r1", tbBase())
	old := tbLookupAll(t, tbl, tbAllHosts...)
	streams := tbAttachAll(t, old)
	extra := tbAttach(t, old[tbWeb])

	clk.Advance(time.Second)
	if n := tbl.StopInstance(tbKeyDemo); n != 3 {
		t.Errorf("StopInstance = %d streams closed, want 3", n)
	}
	for _, h := range []string{tbWeb, tbDemo} {
		wantCancelled(t, old[h], ErrStopped)
		wantRevoked(t, streams[h], ErrStopped)
		r := tbl.Lookup(h)
		if r == nil {
			t.Errorf("Lookup(%s) = nil after StopInstance, want the reinstalled route", h)
			continue
		}
		if r == old[h] || r.InstallationVersion <= tbMaxVersion(old) {
			t.Errorf("%s: not reinstalled with a new version (v%d, old max %d)", h, r.InstallationVersion, tbMaxVersion(old))
		}
		o := old[h]
		if r.Host != o.Host || r.Workspace != o.Workspace || r.Sandbox != o.Sandbox || r.Service != o.Service ||
			r.Port != o.Port || r.Generation != o.Generation || r.Connector != o.Connector ||
			r.DeclarationRevision() != o.DeclarationRevision() || r.Instance != o.Instance {
			t.Errorf("%s: reinstalled route differs from the stopped one", h)
		}
		wantLive(t, r)
		if !r.Usable() {
			t.Errorf("%s: reinstalled route not usable", h)
		}
	}
	wantRevoked(t, extra, ErrStopped)
	if tbl.Lookup(tbWeb).InstallationVersion == tbl.Lookup(tbDemo).InstallationVersion {
		t.Error("the two reinstalled routes share a version")
	}
	for _, h := range []string{tbAPI, tbShop} {
		if tbl.Lookup(h) != old[h] {
			t.Errorf("%s: another instance's route was replaced", h)
		}
		wantLive(t, old[h])
		wantNotRevoked(t, streams[h])
	}
	if s := tbl.Snapshot(); s.Len() != 4 || s.Revision != "r1" {
		t.Errorf("Snapshot after StopInstance: Len %d Revision %q", s.Len(), s.Revision)
	}
	if want := fakeEpoch.Add(tbFresh); !tbl.Lookup(tbWeb).FreshUntil().Equal(want) {
		t.Errorf("StopInstance changed freshness: %v, want %v", tbl.Lookup(tbWeb).FreshUntil(), want)
	}

	// The next delivery keeps the reinstalled routes.
	stopped := tbLookupAll(t, tbl, tbAllHosts...)
	if res := tbApply(t, tbl, "r2", tbBase()); res != (ApplyResult{Kept: 4}) {
		t.Errorf("Apply after StopInstance = %+v, want Kept 4", res)
	}
	for _, h := range tbAllHosts {
		if tbl.Lookup(h) != stopped[h] {
			t.Errorf("%s reinstalled again by the next delivery", h)
		}
	}

	// An unknown instance: nothing happens.
	if n := tbl.StopInstance(InstanceKey{"team", "nope"}); n != 0 {
		t.Errorf("StopInstance(unknown) = %d", n)
	}
	for _, h := range tbAllHosts {
		if tbl.Lookup(h) != stopped[h] {
			t.Errorf("StopInstance(unknown) replaced %s", h)
		}
	}
}

func TestTableClose(t *testing.T) {
	tbl, clk := newTB(t)
	tbApply(t, tbl, "r1", tbBase())
	old := tbLookupAll(t, tbl, tbAllHosts...)
	streams := tbAttachAll(t, old)

	tbl.Close()
	for _, h := range tbAllHosts {
		wantCancelled(t, old[h], ErrShutdown)
		wantRevoked(t, streams[h], ErrShutdown)
		if r := tbl.Lookup(h); r != nil {
			t.Errorf("Lookup(%s) after Close = v%d", h, r.InstallationVersion)
		}
	}
	if n := tbl.Snapshot().Len(); n != 0 {
		t.Errorf("Snapshot.Len after Close = %d", n)
	}
	if n := clk.Pending(); n != 0 {
		t.Errorf("%d timers pending after Close, want the expiry timer stopped", n)
	}

	if res := tbApply(t, tbl, "r2", tbBase()); res != (ApplyResult{}) {
		t.Errorf("Apply after Close = %+v, want zero", res)
	}
	tbl.Renew()
	if n := tbl.StopInstance(tbKeyDemo); n != 0 {
		t.Errorf("StopInstance after Close = %d", n)
	}
	clk.Advance(time.Hour)
	tbl.Close()
	for _, h := range tbAllHosts {
		if r := tbl.Lookup(h); r != nil {
			t.Errorf("Lookup(%s) after Close and Apply = v%d", h, r.InstallationVersion)
		}
		wantRevoked(t, streams[h], ErrShutdown) // still exactly once
	}
	if n := tbl.Snapshot().Len(); n != 0 {
		t.Errorf("Snapshot.Len after Close and Apply = %d", n)
	}
}

// Lookup matches exactly; normalizing a TLS server name or Host is the
// caller's job (NormalizeHost).
func TestTableLookupNeedsNormalizedHost(t *testing.T) {
	tbl, _ := newTB(t)
	tbApply(t, tbl, "r1", tbBase())
	tests := []struct{ raw, want string }{
		{"TEAM--DEMO--WEB.apps.test", tbWeb},
		{"Team--Demo--Web.Apps.Test", tbWeb},
		{"team--demo--web.apps.test.", tbWeb},
		{"team--demo--web.apps.test:8443", tbWeb},
		{"TEAM--DEMO.APPS.TEST.:443", tbDemo},
		{"Acme--Shop.apps.test", tbShop},
	}
	for _, tt := range tests {
		if r := tbl.Lookup(tt.raw); r != nil {
			t.Errorf("Lookup(%q) = %s, want nil (not normalized)", tt.raw, r.Host)
		}
		n, ok := NormalizeHost(tt.raw)
		if !ok {
			t.Errorf("NormalizeHost(%q) failed", tt.raw)
			continue
		}
		r := tbl.Lookup(n)
		if r == nil || r.Host != tt.want {
			t.Errorf("Lookup(NormalizeHost(%q) = %q) = %v, want %s", tt.raw, n, r, tt.want)
		}
	}
}

func TestTableRouteData(t *testing.T) {
	tbl, clk := newTB(t)
	tbApply(t, tbl, "r1", tbBase())
	r := tbl.Lookup(tbWeb)
	var calls atomic.Int32
	create := func() any { calls.Add(1); return new(int) }
	var wg sync.WaitGroup
	got := make([]any, 16)
	for i := range got {
		wg.Go(func() { got[i] = r.Data(create) })
	}
	wg.Wait()
	if calls.Load() != 1 {
		t.Errorf("create ran %d times, want 1", calls.Load())
	}
	for _, g := range got {
		if g != got[0] {
			t.Fatal("Data returned different values")
		}
	}
	clk.Advance(time.Second)
	specs := tbBase()
	specs[0].Services[0].Port = 8081
	tbApply(t, tbl, "r2", specs)
	if d := tbl.Lookup(tbWeb).Data(create); d == got[0] || calls.Load() != 2 {
		t.Error("a reinstalled route shares the old route's data")
	}
}

// capHandler is a slog.Handler that keeps records.
type capHandler struct {
	mu   sync.Mutex
	recs []capRecord
}

type capRecord struct {
	level slog.Level
	msg   string
	attrs map[string]slog.Value
}

func (h *capHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *capHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *capHandler) WithGroup(string) slog.Handler            { return h }
func (h *capHandler) Handle(_ context.Context, r slog.Record) error {
	rec := capRecord{level: r.Level, msg: r.Message, attrs: map[string]slog.Value{}}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value; return true })
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}

func (h *capHandler) take() []capRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.recs
	h.recs = nil
	return out
}

// Route changes are logged as Entity Management changes (class 3004),
// with the number of streams each revocation closed.
func TestTableEvents(t *testing.T) {
	tests := []struct {
		name        string
		act         func(t *testing.T, tbl *Table, clk *fakeClock)
		msg         string
		level       slog.Level
		host        string
		streams     int64 // streams_closed; 0: absent
		reason      bool
		wantVersion func(old, now *Route) uint64
	}{
		{"installed", func(t *testing.T, tbl *Table, clk *fakeClock) {
			specs := tbBase()
			specs[1].Services = append(specs[1].Services, ServiceSpec{Name: "new", Port: 1234})
			tbApply(t, tbl, "r2", specs)
		}, "route installed", slog.LevelInfo, "team--other--new.apps.test", 0, false, nil},
		{"changed", func(t *testing.T, tbl *Table, clk *fakeClock) {
			specs := tbBase()
			specs[0].Services[0].Port = 8081
			tbApply(t, tbl, "r2", specs)
		}, "route changed", slog.LevelInfo, tbWeb, 2, false, func(old, now *Route) uint64 { return now.InstallationVersion }},
		{"withdrawn", func(t *testing.T, tbl *Table, clk *fakeClock) {
			specs := tbBase()
			specs[0].Services = specs[0].Services[1:]
			tbApply(t, tbl, "r2", specs)
		}, "route withdrawn", slog.LevelInfo, tbWeb, 2, false, func(old, now *Route) uint64 { return old.InstallationVersion }},
		{"rejected", func(t *testing.T, tbl *Table, clk *fakeClock) {
			specs := tbBase()
			specs[0].Services[1].Port = 0
			tbl.Apply(tbParse(t, "r2", tbSpecs(specs)...))
		}, "route rejected", slog.LevelWarn, tbWeb, 2, true, func(old, now *Route) uint64 { return old.InstallationVersion }},
		{"expired", func(t *testing.T, tbl *Table, clk *fakeClock) {
			clk.Advance(tbFresh)
		}, "route expired", slog.LevelWarn, tbWeb, 2, false, func(old, now *Route) uint64 { return old.InstallationVersion }},
		{"stopped", func(t *testing.T, tbl *Table, clk *fakeClock) {
			tbl.StopInstance(tbKeyDemo)
		}, "route stopped", slog.LevelWarn, tbWeb, 2, false, func(old, now *Route) uint64 { return old.InstallationVersion }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &capHandler{}
			tbl, clk := newTB(t, func(o *Options) { o.Logger = slog.New(h) })
			tbApply(t, tbl, "r1", tbBase())
			if recs := h.take(); len(recs) != 4 {
				t.Errorf("installing 4 routes logged %d records, want 4", len(recs))
			}
			old := tbl.Lookup(tbWeb)
			tbAttach(t, old)
			tbAttach(t, old)
			tt.act(t, tbl, clk)
			var found *capRecord
			recs := h.take()
			for i := range recs {
				if recs[i].attrs["host"].String() == tt.host && recs[i].msg == tt.msg {
					found = &recs[i]
				}
			}
			if found == nil {
				t.Fatalf("no %q record for %s in %+v", tt.msg, tt.host, recs)
			}
			if found.level != tt.level {
				t.Errorf("level %v, want %v", found.level, tt.level)
			}
			if v := found.attrs["class_uid"]; v.Int64() != 3004 {
				t.Errorf("class_uid = %v, want 3004", v)
			}
			if _, ok := found.attrs["installation_version"]; !ok {
				t.Error("no installation_version")
			}
			if tt.wantVersion != nil {
				if want := tt.wantVersion(old, tbl.Lookup(tbWeb)); found.attrs["installation_version"].Uint64() != want {
					t.Errorf("installation_version = %v, want %d", found.attrs["installation_version"], want)
				}
			}
			if v, ok := found.attrs["streams_closed"]; tt.streams != 0 && (!ok || v.Int64() != tt.streams) {
				t.Errorf("streams_closed = %v (present %v), want %d: the log must say how many streams the revocation closed", v, ok, tt.streams)
			}
			if _, ok := found.attrs["reason"]; ok != tt.reason {
				t.Errorf("reason present = %v, want %v", ok, tt.reason)
			}
		})
	}
}

// The real clock: expiry happens on its own.
func TestTableExpiryRealClock(t *testing.T) {
	tbl := NewTable(Options{Domain: tbDomain, Freshness: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	defer tbl.Close()
	tbApply(t, tbl, "r1", tbBase())
	r := tbl.Lookup(tbWeb)
	if r == nil {
		t.Fatal("no route")
	}
	s := tbAttach(t, r)
	select {
	case <-r.Lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("route not expired 10 s after a 100 ms freshness")
	}
	wantCancelled(t, r, ErrExpired)
	wantRevoked(t, s, ErrExpired)
	if tbl.Lookup(tbWeb) != nil {
		t.Error("Lookup after expiry")
	}
	tbl.Renew()
	if r2 := tbl.Lookup(tbWeb); r2 == nil || r2.InstallationVersion <= r.InstallationVersion {
		t.Error("Renew after expiry did not reinstall")
	}
}

// Lookups never block on or observe a half-applied document (run with -race).
func TestTableConcurrentLookupApply(t *testing.T) {
	tbl, clk := newTB(t)
	specsA := tbBase()
	specsB := tbBase()
	specsB[0].Services[0].Port = 18080 // web changes on every swap
	specsB[0].Services[1].Revision = 3 // demo: declaration only
	docA := tbParse(t, "a", tbSpecs(specsA)...)
	docB := tbParse(t, "b", tbSpecs(specsB)...)
	tbl.Apply(docA)

	type held struct {
		r *Route
		s *recStream
	}
	const readers = 4
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		lookups  atomic.Int64
		webMiss  atomic.Int64
		attached = make([][]held, readers)
	)
	for g := range readers {
		wg.Go(func() {
			for i := 0; !stop.Load() || i < 1000; i++ {
				host := tbAllHosts[i%len(tbAllHosts)]
				r := tbl.Lookup(host)
				lookups.Add(1)
				if r == nil {
					// A reader that loaded the snapshot just before a swap may
					// see the replaced route's lease cancelled. Only routes
					// that change (web, and team/demo on StopInstance) may miss.
					if host == tbAPI || host == tbShop {
						t.Errorf("Lookup(%s) = nil while it is routed in every document", host)
						return
					}
					webMiss.Add(1)
					continue
				}
				if r.Host != host {
					t.Errorf("Lookup(%s) returned %s", host, r.Host)
					return
				}
				if host == tbWeb && r.Port != 8080 && r.Port != 18080 {
					t.Errorf("web port %d", r.Port)
				}
				if i%8 == 0 {
					s := &recStream{name: host}
					if r.Lease.Attach(s) {
						attached[g] = append(attached[g], held{r, s})
					}
				}
			}
		})
	}
	for i := range 400 {
		switch i % 4 {
		case 0:
			tbl.Apply(docB)
		case 1:
			tbl.Apply(docA)
		case 2:
			tbl.Renew()
		case 3:
			if i%12 == 3 {
				tbl.StopInstance(tbKeyDemo)
			} else {
				clk.Advance(time.Second)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	tbl.Close()
	t.Logf("%d lookups, %d transient misses of changing routes", lookups.Load(), webMiss.Load())

	n := 0
	for _, hs := range attached {
		for _, h := range hs {
			n++
			got := h.s.revocations()
			if len(got) != 1 {
				t.Errorf("stream on %s v%d revoked %d times, want 1", h.r.Host, h.r.InstallationVersion, len(got))
				continue
			}
			if got[0] != h.r.Lease.Err() {
				t.Errorf("stream cause %v, lease cause %v", got[0], h.r.Lease.Err())
			}
			if (h.r.Host == tbAPI || h.r.Host == tbShop) && got[0] != ErrShutdown {
				t.Errorf("stream on the never-changing route %s revoked with %v before Close", h.r.Host, got[0])
			}
		}
	}
	if n == 0 {
		t.Error("no stream was attached")
	}
}

// unstoppableClock models time.AfterFunc timers whose function has already
// started when Stop is called: Stop reports false and the function runs.
type unstoppableClock struct{ *fakeClock }

type unstoppableTimer struct{}

func (unstoppableTimer) Stop() bool { return false }

func (c unstoppableClock) AfterFunc(d time.Duration, f func()) Timer {
	c.fakeClock.AfterFunc(d, f)
	return unstoppableTimer{}
}

// An expiry timer that fires after a renewal (its Stop came too late), or
// after Close, must do nothing.
func TestTableLateExpiryTimer(t *testing.T) {
	fc := newFakeClock()
	tbl := NewTable(Options{Domain: tbDomain, Freshness: tbFresh, Clock: unstoppableClock{fc}, Logger: slog.New(slog.DiscardHandler)})
	defer tbl.Close()
	tbApply(t, tbl, "r1", tbBase())
	routes := tbLookupAll(t, tbl, tbAllHosts...)
	streams := tbAttachAll(t, routes)

	fc.Advance(20 * time.Second)
	tbl.Renew() // deadline +50 s; the +30 s timer still fires
	fc.Advance(10 * time.Second)
	for _, h := range tbAllHosts {
		wantLive(t, routes[h])
		wantNotRevoked(t, streams[h])
		if tbl.Lookup(h) != routes[h] {
			t.Errorf("%s: the stale timer of a renewed table removed the route", h)
		}
	}
	fc.Advance(20 * time.Second) // +50 s: the renewed deadline
	for _, h := range tbAllHosts {
		wantCancelled(t, routes[h], ErrExpired)
		wantRevoked(t, streams[h], ErrExpired)
	}

	// After Close, a late timer changes nothing.
	tbl.Renew() // reinstalls, new timer at +80 s
	now := tbLookupAll(t, tbl, tbAllHosts...)
	more := tbAttachAll(t, now)
	tbl.Close()
	fc.Advance(time.Hour)
	for _, h := range tbAllHosts {
		wantCancelled(t, now[h], ErrShutdown)
		wantRevoked(t, more[h], ErrShutdown)
	}
}

// metricValue returns the value of the metric name with the given labels
// (nil: the first series) from reg, and whether it exists.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue series
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func TestTableMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	tbl, clk := newTB(t, func(o *Options) { o.Registerer = reg })
	tbApply(t, tbl, "r1", tbBase())
	tbAttach(t, tbl.Lookup(tbWeb))
	tbl.Lookup(tbWeb).Instance.CountRequest() // team/demo has seen traffic
	// team/other never received a request: no series of its own.
	if v, ok := metricValue(t, reg, "applistener_instance_max_streams", map[string]string{"workspace": "team", "sandbox": "other"}); ok {
		t.Errorf("idle instance team/other has a series (%v)", v)
	}
	other := tbl.Lookup("team--other--api.apps.test").Instance
	if !other.Acquire() {
		t.Fatal("Acquire refused")
	}
	if v, ok := metricValue(t, reg, "applistener_instance_streams_active", map[string]string{"workspace": "team", "sandbox": "other"}); !ok || v != 1 {
		t.Errorf("team/other with a stream open: streams_active = %v (present %v); want 1", v, ok)
	}
	other.Release()

	clk.Advance(time.Second)
	specs := tbBase()
	specs[0].Services[0].Port = 8081   // web changed
	specs = slices.Delete(specs, 1, 2) // api withdrawn
	tbApply(t, tbl, "r2", specs)
	tbl.StopInstance(InstanceKey{"acme", "shop"})

	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"applistener_routes", nil, 3},
		{"applistener_route_renewals_total", nil, 2},
		{"applistener_route_revocations_total", map[string]string{"cause": "changed"}, 1},
		{"applistener_route_revocations_total", map[string]string{"cause": "withdrawn"}, 1},
		{"applistener_route_revocations_total", map[string]string{"cause": "stopped"}, 1},
		{"applistener_revocation_close_seconds", nil, 2}, // one observation per revoking change
		{"applistener_instance_max_streams", map[string]string{"workspace": "team", "sandbox": "demo"}, 256},
	}
	for _, tt := range tests {
		got, ok := metricValue(t, reg, tt.name, tt.labels)
		if !ok || got != tt.want {
			t.Errorf("%s%v = %v (present %v), want %v", tt.name, tt.labels, got, ok, tt.want)
		}
	}

	clk.Advance(tbFresh)
	if got, _ := metricValue(t, reg, "applistener_routes", nil); got != 0 {
		t.Errorf("applistener_routes after expiry = %v, want 0", got)
	}
	if got, _ := metricValue(t, reg, "applistener_route_revocations_total", map[string]string{"cause": "expired"}); got != 3 {
		t.Errorf("expired revocations = %v, want 3", got)
	}
}

// TestTableWeightInPlace: a change of limits.weight applies to the
// instance's fair-admission flow without reinstalling its routes.
func TestTableWeightInPlace(t *testing.T) {
	tbl, _ := newTB(t)
	tbApply(t, tbl, "r1", tbBase())
	before := tbLookupAll(t, tbl, tbAllHosts...)
	inst := tbl.Lookup(tbWeb).Instance
	if got := inst.Fair.Weight(); got != 1 {
		t.Errorf("default weight %d, want 1", got)
	}
	specs := tbBase()
	specs[0].Limits.Weight = 7
	if res := tbApply(t, tbl, "r2", specs); res != (ApplyResult{Kept: 4}) {
		t.Errorf("Apply = %+v, want Kept 4", res)
	}
	for host, r := range before {
		if tbl.Lookup(host) != r {
			t.Errorf("%s reinstalled by a change of weight", host)
		}
	}
	if got := tbl.Lookup(tbWeb).Instance.Fair.Weight(); got != 7 {
		t.Errorf("weight %d after the change, want 7", got)
	}
	if got := tbl.Lookup(tbAPI).Instance.Fair.Weight(); got != 1 {
		t.Errorf("another instance's weight %d, want 1", got)
	}
}
