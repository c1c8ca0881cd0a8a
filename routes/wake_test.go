package routes

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// wakeEntry is an instance entry with the given "state" (raw JSON value,
// "" for none) whose service "web" has the wake object given (raw JSON, ""
// for none); the unnamed service has none.
func wakeEntry(state, wake string) string {
	svc := `{"name":"web","port":8080`
	if wake != "" {
		svc += `,"wake":` + wake
	}
	e := `{"workspace":"team","sandbox":"demo","services":[` + svc + `},{"name":"","port":3000}]`
	if state != "" {
		e += `,"state":` + state
	}
	return e + `}`
}

func parseWake(t *testing.T, state, wake string) *Document {
	t.Helper()
	doc, err := ParseDocument([]byte(`{"instances":[` + wakeEntry(state, wake) + `]}`))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return doc
}

func TestWakeFieldsValid(t *testing.T) {
	hold := func(n int) *int { return &n }
	for _, tc := range []struct {
		state, wake  string
		sleeping     bool
		want         *WakePolicy
		mode         string
		holdDuration time.Duration
	}{
		{``, ``, false, nil, WakeNavigation, 30 * time.Second},
		{`"active"`, ``, false, nil, WakeNavigation, 30 * time.Second},
		{`"sleeping"`, ``, true, nil, WakeNavigation, 30 * time.Second},
		{`"sleeping"`, `{}`, true, &WakePolicy{}, WakeNavigation, 30 * time.Second},
		{``, `{"on":"navigation"}`, false, &WakePolicy{On: WakeNavigation}, WakeNavigation, 30 * time.Second},
		{``, `{"on":"any","hold_seconds":120}`, false, &WakePolicy{On: WakeAny, HoldSeconds: hold(120)}, WakeAny, 120 * time.Second},
		{``, `{"on":"never","hold_seconds":0}`, false, &WakePolicy{On: WakeNever, HoldSeconds: hold(0)}, WakeNever, 0},
		{``, `{"hold_seconds":5}`, false, &WakePolicy{HoldSeconds: hold(5)}, WakeNavigation, 5 * time.Second},
	} {
		t.Run(tc.state+tc.wake, func(t *testing.T) {
			doc := parseWake(t, tc.state, tc.wake)
			if len(doc.Rejected) != 0 {
				t.Fatalf("rejected: %s", doc.Rejected[0].Reason)
			}
			in := doc.Instances[0]
			if in.Sleeping() != tc.sleeping {
				t.Fatalf("Sleeping() = %v, want %v", in.Sleeping(), tc.sleeping)
			}
			if in.State != "" && in.State != StateSleeping {
				t.Fatalf("state %q not normalized", in.State)
			}
			got := in.Services[0].Wake
			if (got == nil) != (tc.want == nil) || got != nil && (got.On != tc.want.On || (got.HoldSeconds == nil) != (tc.want.HoldSeconds == nil)) {
				t.Fatalf("wake %+v, want %+v", got, tc.want)
			}
			if got.Mode() != tc.mode || got.Hold() != tc.holdDuration {
				t.Fatalf("Mode() %q Hold() %v, want %q %v", got.Mode(), got.Hold(), tc.mode, tc.holdDuration)
			}
			if in.Services[1].Wake != nil {
				t.Fatalf("unnamed service wake %+v, want nil", in.Services[1].Wake)
			}
		})
	}
}

func TestWakeFieldsProblems(t *testing.T) {
	for _, tc := range []struct {
		state, wake string
		path, msg   string
	}{
		{`"paused"`, ``, "state", `state "paused" not supported (use active or sleeping)`},
		{`"Sleeping"`, ``, "state", "not supported"},
		{`""`, `{"on":"sometimes"}`, "services[0].wake.on", `service "web": wake.on "sometimes" not supported (use navigation, any or never)`},
		{`true`, ``, "state", "must be a string"},
		{``, `{"hold_seconds":121}`, "services[0].wake.hold_seconds", "wake.hold_seconds 121 out of range 0..120"},
		{``, `{"hold_seconds":-1}`, "services[0].wake.hold_seconds", "out of range"},
		{``, `{"hold_seconds":"30"}`, "services[0].wake.hold_seconds", "must be a whole number, not a string"},
		{``, `{"hold_seconds":1.5}`, "services[0].wake.hold_seconds", "not a whole number"},
		{``, `{"on":"any","hold":30}`, "services[0].wake.hold", "unknown field"},
		{``, `"navigation"`, "services[0].wake", "must be an object, not a string"},
	} {
		t.Run(tc.state+tc.wake, func(t *testing.T) {
			doc := parseWake(t, tc.state, tc.wake)
			if len(doc.Rejected) != 1 {
				t.Fatalf("not rejected: %+v", doc.Instances)
			}
			rj := doc.Rejected[0]
			found := false
			for _, p := range rj.Problems {
				if p.Path == tc.path && strings.Contains(p.Msg, tc.msg) {
					found = true
				}
			}
			if !found {
				t.Fatalf("problems %+v; want %s: %q", rj.Problems, tc.path, tc.msg)
			}
		})
	}
}

// The fields survive a marshal and parse (the gateway stores documents
// and serves them again); absent ones stay absent.
func TestWakeFieldsRoundTrip(t *testing.T) {
	doc := parseWake(t, `"sleeping"`, `{"on":"any","hold_seconds":0}`)
	b, err := json.Marshal(doc.Instances[0])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(b), `"wake"`) != 1 || !strings.Contains(string(b), `"state":"sleeping"`) ||
		!strings.Contains(string(b), `"hold_seconds":0`) {
		t.Fatalf("marshalled %s: want the state, one wake object with its explicit hold of 0", b)
	}
	again, err := ParseDocument([]byte(`{"instances":[` + string(b) + `]}`))
	if err != nil || len(again.Instances) != 1 {
		t.Fatalf("round trip: %v %+v", err, again)
	}
	in := again.Instances[0]
	if !in.Sleeping() || !in.Services[0].Wake.Equal(doc.Instances[0].Services[0].Wake) || in.Services[1].Wake != nil {
		t.Fatalf("round trip changed the fields: %s", b)
	}
	active := parseWake(t, `"active"`, ``)
	b, _ = json.Marshal(active.Instances[0])
	if strings.Contains(string(b), "state") || strings.Contains(string(b), "wake") {
		t.Fatalf("an active instance without a wake policy marshals %s", b)
	}
}

func TestWakePolicyEqualClone(t *testing.T) {
	h30, h5 := 30, 5
	for _, tc := range []struct {
		a, b  *WakePolicy
		equal bool
	}{
		{nil, nil, true},
		{nil, &WakePolicy{}, true},
		{nil, &WakePolicy{On: WakeNavigation, HoldSeconds: &h30}, true},
		{nil, &WakePolicy{On: WakeAny}, false},
		{&WakePolicy{HoldSeconds: &h5}, &WakePolicy{HoldSeconds: &h30}, false},
		{&WakePolicy{On: WakeNever, HoldSeconds: &h5}, &WakePolicy{On: WakeNever, HoldSeconds: &h5}, true},
	} {
		if got := tc.a.Equal(tc.b); got != tc.equal {
			t.Errorf("%+v.Equal(%+v) = %v, want %v", tc.a, tc.b, got, tc.equal)
		}
		if got := tc.b.Equal(tc.a); got != tc.equal {
			t.Errorf("%+v.Equal(%+v) = %v, want %v", tc.b, tc.a, got, tc.equal)
		}
	}
	var nilPolicy *WakePolicy
	if nilPolicy.Clone() != nil {
		t.Fatal("Clone of nil is not nil")
	}
	p := &WakePolicy{On: WakeAny, HoldSeconds: &h5}
	c := p.Clone()
	*c.HoldSeconds = 7
	if *p.HoldSeconds != 5 || !p.Equal(&WakePolicy{On: WakeAny, HoldSeconds: &h5}) {
		t.Fatal("Clone shares HoldSeconds")
	}
}

// Going to sleep reinstalls the instance's routes and revokes their
// streams with ErrSleeping; waking is in place: the sleeping route (and
// what is held on it) is kept, Woken is closed. A change of wake policy
// alone keeps the route (and its streams) and is seen at once through
// Route.Wake.
func TestTableSleepWake(t *testing.T) {
	const web, unnamed = "team--demo--web.apps.test", "team--demo.apps.test"
	apply := func(t *testing.T, tbl *Table, state, wake string) ApplyResult {
		t.Helper()
		doc := parseWake(t, state, wake)
		if len(doc.Rejected) != 0 {
			t.Fatalf("rejected: %s", doc.Rejected[0].Reason)
		}
		return tbl.Apply(doc)
	}
	tbl, clk := newTB(t)
	apply(t, tbl, ``, ``)
	old := tbLookupAll(t, tbl, web, unnamed)
	if old[web].Sleeping() || old[web].Woken() != nil || old[web].Wake().Mode() != WakeNavigation || old[web].Wake().Hold() != 30*time.Second {
		t.Fatalf("active route: sleeping %v, wake %+v", old[web].Sleeping(), old[web].Wake())
	}
	streams := tbAttachAll(t, old)
	clk.Advance(time.Second)

	if res := apply(t, tbl, `"sleeping"`, ``); res != (ApplyResult{Changed: 2}) {
		t.Fatalf("to sleep: Apply = %+v, want both routes changed", res)
	}
	for _, h := range []string{web, unnamed} {
		wantCancelled(t, old[h], ErrSleeping)
		wantRevoked(t, streams[h], ErrSleeping)
	}
	asleep := tbLookupAll(t, tbl, web, unnamed)
	if !asleep[web].Sleeping() || !asleep[unnamed].Sleeping() || asleep[web].InstallationVersion <= old[web].InstallationVersion {
		t.Fatal("routes of a sleeping instance are not Sleeping, or kept their installation version")
	}
	if CauseLabel(ErrSleeping) != "sleeping" {
		t.Fatalf("CauseLabel(ErrSleeping) = %q", CauseLabel(ErrSleeping))
	}
	// Sleeping again changes nothing.
	if res := apply(t, tbl, `"sleeping"`, ``); res != (ApplyResult{Kept: 2}) {
		t.Fatalf("still sleeping: Apply = %+v", res)
	}

	// The wake policy changes in place.
	streams = tbAttachAll(t, asleep)
	if res := apply(t, tbl, `"sleeping"`, `{"on":"any","hold_seconds":10}`); res != (ApplyResult{Kept: 2}) {
		t.Fatalf("wake policy change: Apply = %+v, want both kept", res)
	}
	if r := tbl.Lookup(web); r != asleep[web] || r.Wake().Mode() != WakeAny || r.Wake().Hold() != 10*time.Second {
		t.Fatalf("after a wake policy change: same route %v, wake %+v", r == asleep[web], r.Wake())
	}
	if w := tbl.Lookup(unnamed).Wake(); w.Mode() != WakeNavigation || w.Hold() != 30*time.Second {
		t.Fatalf("unnamed service's wake %+v, want the defaults", w)
	}
	wantNotRevoked(t, streams[web])

	// Waking is in place: same route, same installation version, streams
	// kept, Woken closed.
	woken := asleep[web].Woken()
	if res := apply(t, tbl, `"active"`, `{"on":"any","hold_seconds":10}`); res != (ApplyResult{Kept: 2}) {
		t.Fatalf("wake: Apply = %+v, want both routes kept", res)
	}
	awake := tbl.Lookup(web)
	if awake != asleep[web] || awake.Sleeping() || awake.Wake().Hold() != 10*time.Second {
		t.Fatalf("woken route: same %v, sleeping %v, wake %+v", awake == asleep[web], awake.Sleeping(), awake.Wake())
	}
	select {
	case <-woken:
	default:
		t.Fatal("Woken not closed on waking")
	}
	wantNotRevoked(t, streams[web])
	wantLive(t, awake)
	// StopInstance keeps the state and the policy of the routes it reinstalls.
	tbl.StopInstance(InstanceKey{"team", "demo"})
	if r := tbl.Lookup(web); r == awake || r.Sleeping() || r.Wake().Mode() != WakeAny {
		t.Fatalf("after StopInstance: new route %v, sleeping %v, wake %+v", r != awake, r.Sleeping(), r.Wake())
	}
	apply(t, tbl, `"sleeping"`, ``)
	tbl.StopInstance(InstanceKey{"team", "demo"})
	if r := tbl.Lookup(web); !r.Sleeping() || r.Woken() == nil {
		t.Fatal("StopInstance woke a sleeping route")
	}
}
