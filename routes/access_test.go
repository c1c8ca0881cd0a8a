package routes

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// accessEntry is an instance entry whose service "web" has the access
// object given (raw JSON; "" for none).
func accessEntry(access string) string {
	svc := `{"name":"web","port":8080`
	if access != "" {
		svc += `,"access":` + access
	}
	return `{"workspace":"team","sandbox":"demo","services":[` + svc + `},{"name":"","port":3000}]}`
}

func parseAccess(t *testing.T, access string, opts parseOptions) *Document {
	t.Helper()
	doc, err := parseDocument([]byte(`{"instances":[`+accessEntry(access)+`]}`), opts)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return doc
}

// Mode token is accepted by validation (the data plane enforces it): the
// entry is valid, through the exported entry point too.
func TestAccessModeTokenAccepted(t *testing.T) {
	doc := parseAccess(t, `{"mode":"token","login_url":"https://login.example.com/"}`, parseOptions{})
	if len(doc.Instances) != 1 || len(doc.Rejected) != 0 || doc.Instances[0].Services[0].Access.Mode != AccessToken {
		t.Fatalf("instances %d, rejected %+v; want the entry valid", len(doc.Instances), doc.Rejected)
	}
	pub, err := ParseDocument([]byte(`{"instances":[` + accessEntry(`{"mode":"token"}`) + `]}`))
	if err != nil || len(pub.Instances) != 1 || len(pub.Rejected) != 0 {
		t.Fatalf("ParseDocument: %+v, %v", pub, err)
	}
}

// A table without access keys (Options.AccessTokens unset) refuses an
// instance with a token-mode service, with a one-line reason naming the
// service, and withdraws its routes if they were installed: a private
// preview is never served publicly. Other instances are untouched.
func TestTableRefusesTokenAccessWithoutKeys(t *testing.T) {
	tbl, _ := newTB(t)
	other := `{"workspace":"team","sandbox":"other","services":[{"name":"","port":3000}]}`
	doc, err := ParseDocument([]byte(`{"instances":[` + accessEntry(`{"mode":"token"}`) + `,` + other + `]}`))
	if err != nil || len(doc.Rejected) != 0 {
		t.Fatalf("parse: %v %+v", err, doc)
	}
	res := tbl.Apply(doc)
	if res.Installed != 1 || len(doc.Rejected) != 1 {
		t.Fatalf("Apply = %+v, rejected %+v; want the private instance refused, the other installed", res, doc.Rejected)
	}
	want := `service "web": ` + NoAccessKeysReason
	if rj := doc.Rejected[0]; rj.Reason != want || rj.Workspace != "team" || rj.Sandbox != "demo" || strings.Contains(rj.Reason, "\n") {
		t.Fatalf("rejection %+v, want reason %q", rj, want)
	}
	if tbl.Lookup("team--demo--web.apps.test") != nil || tbl.Lookup("team--demo.apps.test") != nil {
		t.Fatal("a route of the refused instance is installed")
	}
	if tbl.Lookup("team--other.apps.test") == nil {
		t.Fatal("the public instance is not installed")
	}
	// Installed as public, then made private without keys: withdrawn.
	pubDoc, _ := ParseDocument([]byte(`{"instances":[` + accessEntry(`{"mode":"public"}`) + `]}`))
	tbl.Apply(pubDoc)
	r := tbl.Lookup("team--demo--web.apps.test")
	if r == nil {
		t.Fatal("public route not installed")
	}
	priv, _ := ParseDocument([]byte(`{"instances":[` + accessEntry(`{"mode":"token"}`) + `]}`))
	if res := tbl.Apply(priv); res.Rejected != 2 {
		t.Fatalf("Apply = %+v, want both routes of the instance withdrawn as rejected", res)
	}
	wantCancelled(t, r, ErrRejected)
	// With keys the same document installs.
	withKeys, _ := newTB(t, func(o *Options) { o.AccessTokens = true })
	again, _ := ParseDocument([]byte(`{"instances":[` + accessEntry(`{"mode":"token"}`) + `]}`))
	if res := withKeys.Apply(again); res.Installed != 2 || len(again.Rejected) != 0 {
		t.Fatalf("with keys: Apply = %+v, rejected %+v", res, again.Rejected)
	}
	if got := withKeys.Lookup("team--demo--web.apps.test").Access.Mode; got != AccessToken {
		t.Fatalf("installed mode %q", got)
	}
}

func TestAccessPolicyValid(t *testing.T) {
	for _, access := range []string{
		``,
		`{"mode":"public"}`,
		`{"mode":"public","generation":3}`,
		`{"mode":"token","generation":9007199254740991,"login_url":"https://login.example.com/sso?app=1","cors_origins":["https://app.example.com","https://example.com:8443","http://localhost:5173","http://127.0.0.1:3000","http://[::1]:8080"],"bearer":true,"embed":true}`,
		`{"mode":"token","login_url":"http://localhost:8080/login"}`,
		`{"mode":"token","cors_origins":[]}`,
	} {
		t.Run(access, func(t *testing.T) {
			doc := parseAccess(t, access, parseOptions{})
			if len(doc.Rejected) != 0 {
				t.Fatalf("rejected: %s", doc.Rejected[0].Reason)
			}
			got := doc.Instances[0].Services[0].Access
			if access == "" {
				if got != nil {
					t.Fatalf("absent access parsed as %+v", got)
				}
				return
			}
			var want AccessPolicy
			if err := json.Unmarshal([]byte(access), &want); err != nil {
				t.Fatal(err)
			}
			if !got.Equal(&want) {
				t.Fatalf("parsed %+v, want %+v", got, want)
			}
		})
	}
}

func TestAccessPolicyProblems(t *testing.T) {
	for _, tc := range []struct {
		access string
		path   string
		msg    string
	}{
		{`{}`, "services[0].access.mode", "access.mode is required (public or token)"},
		{`{"login_url":"https://login.example.com/"}`, "services[0].access.mode", "access.mode is required"},
		{`{"mode":"private"}`, "services[0].access.mode", `access mode "private" not supported (use public or token)`},
		{`{"mode":"Token"}`, "services[0].access.mode", "not supported"},
		{`{"mode":"token","generation":-1}`, "services[0].access.generation", "access generation -1 out of range"},
		{`{"mode":"token","generation":9007199254740992}`, "services[0].access.generation", "out of range"},
		{`{"mode":"token","generation":"1"}`, "services[0].access.generation", "must be a whole number, not a string"},
		{`{"mode":"token","generation":1.5}`, "services[0].access.generation", "not a whole number"},
		{`{"mode":"token","login_url":"/login"}`, "services[0].access.login_url", "has no host"},
		{`{"mode":"token","login_url":"login.example.com"}`, "services[0].access.login_url", "has no host"},
		{`{"mode":"token","login_url":"http://login.example.com/"}`, "services[0].access.login_url", "must be https (http only for localhost)"},
		{`{"mode":"token","login_url":"javascript:alert(1)"}`, "services[0].access.login_url", "not a URL"},
		{`{"mode":"token","login_url":"ftp://login.example.com/"}`, "services[0].access.login_url", "must be https"},
		{`{"mode":"token","login_url":"https://user:pw@login.example.com/"}`, "services[0].access.login_url", "user information"},
		{`{"mode":"token","login_url":"https://login.example.com/#x"}`, "services[0].access.login_url", "fragment"},
		{`{"mode":"token","login_url":"https://login.example.com/a b"}`, "services[0].access.login_url", "space or control"},
		{`{"mode":"token","login_url":"https://login.example.com:99999/"}`, "services[0].access.login_url", "invalid port"},
		{`{"mode":"token","cors_origins":["*"]}`, "services[0].access.cors_origins[0]", "list exact origins"},
		{`{"mode":"token","cors_origins":["null"]}`, "services[0].access.cors_origins[0]", "list exact origins"},
		{`{"mode":"token","cors_origins":["https://*.example.com"]}`, "services[0].access.cors_origins[0]", "wildcard"},
		{`{"mode":"token","cors_origins":["https://app.example.com/"]}`, "services[0].access.cors_origins[0]", "without a path, query or trailing slash"},
		{`{"mode":"token","cors_origins":["https://app.example.com/x"]}`, "services[0].access.cors_origins[0]", "without a path"},
		{`{"mode":"token","cors_origins":["https://App.Example.com"]}`, "services[0].access.cors_origins[0]", `want "https://app.example.com"`},
		{`{"mode":"token","cors_origins":["https://app.example.com:443"]}`, "services[0].access.cors_origins[0]", `want "https://app.example.com"`},
		{`{"mode":"token","cors_origins":["HTTPS://app.example.com"]}`, "services[0].access.cors_origins[0]", `want "https://app.example.com"`},
		{`{"mode":"token","cors_origins":["http://app.example.com"]}`, "services[0].access.cors_origins[0]", "must be https"},
		{`{"mode":"token","cors_origins":["app.example.com"]}`, "services[0].access.cors_origins[0]", "has no host"},
		{`{"mode":"token","cors_origins":["https://a.example.com","https://b.example.com","https://a.example.com"]}`, "services[0].access.cors_origins[2]", "duplicate CORS origin"},
		{`{"mode":"token","cors_origins":"https://a.example.com"}`, "services[0].access.cors_origins", "must be an array, not a string"},
		{`{"mode":"token","cors_origins":[1]}`, "services[0].access.cors_origins[0]", "must be a string, not a number"},
		{`{"mode":"token","bearer":"yes"}`, "services[0].access.bearer", "must be true or false"},
		{`{"mode":"token","embded":true}`, "services[0].access.embded", "unknown field"},
		{`"token"`, "services[0].access", "must be an object, not a string"},
	} {
		t.Run(tc.access, func(t *testing.T) {
			doc := parseAccess(t, tc.access, parseOptions{})
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
			if strings.ContainsAny(rj.Reason, "\n\r") {
				t.Fatalf("reason %q is not one line", rj.Reason)
			}
		})
	}
	var many []string
	for i := 0; i <= MaxCORSOrigins; i++ {
		many = append(many, `"https://a`+strings.Repeat("a", i)+`.example.com"`)
	}
	doc := parseAccess(t, `{"mode":"token","cors_origins":[`+strings.Join(many, ",")+`]}`, parseOptions{})
	if len(doc.Rejected) != 1 || !strings.Contains(doc.Rejected[0].Reason, "more than 32") {
		t.Fatalf("33 origins: %+v", doc.Rejected)
	}
}

// The policy survives a marshal and parse (the gateway stores documents
// and serves them again); an absent policy stays absent.
func TestAccessPolicyRoundTrip(t *testing.T) {
	doc := parseAccess(t, `{"mode":"token","generation":4,"login_url":"https://login.example.com/","cors_origins":["https://app.example.com"],"bearer":true}`,
		parseOptions{})
	b, err := json.Marshal(doc.Instances[0])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(b), `"access"`) != 1 {
		t.Fatalf("marshalled %s: want one access object (none for the unnamed service)", b)
	}
	again, err := parseDocument([]byte(`{"instances":[`+string(b)+`]}`), parseOptions{})
	if err != nil || len(again.Instances) != 1 {
		t.Fatalf("round trip: %v %+v", err, again)
	}
	if !again.Instances[0].Services[0].Access.Equal(doc.Instances[0].Services[0].Access) || again.Instances[0].Services[1].Access != nil {
		t.Fatalf("round trip changed the policy: %s", b)
	}
}

// A change of policy reinstalls the route and revokes its streams (they
// are decided again under the new policy); the same policy spelled
// otherwise (absent or {"mode":"public"}) changes nothing.
func TestTableAccessPolicyChange(t *testing.T) {
	apply := func(t *testing.T, tbl *Table, access string) ApplyResult {
		t.Helper()
		doc := parseAccess(t, access, parseOptions{})
		if len(doc.Rejected) != 0 {
			t.Fatalf("rejected: %s", doc.Rejected[0].Reason)
		}
		return tbl.Apply(doc)
	}
	const web, unnamed = "team--demo--web.apps.test", "team--demo.apps.test"
	token := `{"mode":"token","generation":1,"cors_origins":["https://a.example.com"]}`
	for _, tc := range []struct {
		name     string
		from, to string
		changed  bool
	}{
		{"absent to public", ``, `{"mode":"public"}`, false},
		{"public to absent", `{"mode":"public"}`, ``, false},
		{"same token policy", token, token, false},
		{"public to token", ``, token, true},
		{"token to public", token, `{"mode":"public"}`, true},
		{"generation raised", token, strings.Replace(token, `"generation":1`, `"generation":2`, 1), true},
		{"origin added", token, strings.Replace(token, `"]`, `","https://b.example.com"]`, 1), true},
		{"login_url set", token, strings.Replace(token, `{`, `{"login_url":"https://l.example.com/",`, 1), true},
		{"bearer set", token, strings.Replace(token, `{`, `{"bearer":true,`, 1), true},
		{"embed set", token, strings.Replace(token, `{`, `{"embed":true,`, 1), true},
		{"public generation raised", `{"mode":"public"}`, `{"mode":"public","generation":5}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, clk := newTB(t, func(o *Options) { o.AccessTokens = true })
			apply(t, tbl, tc.from)
			old := tbLookupAll(t, tbl, web, unnamed)
			streams := tbAttachAll(t, old)
			clk.Advance(time.Second)
			res := apply(t, tbl, tc.to)
			if !tc.changed {
				if res != (ApplyResult{Kept: 2}) || tbl.Lookup(web) != old[web] {
					t.Fatalf("Apply = %+v, route replaced: %v", res, tbl.Lookup(web) != old[web])
				}
				wantNotRevoked(t, streams[web])
				return
			}
			if res != (ApplyResult{Changed: 1, Kept: 1}) {
				t.Fatalf("Apply = %+v, want the web route changed", res)
			}
			r := tbl.Lookup(web)
			if r == old[web] {
				t.Fatal("same route after its policy changed")
			}
			wantCancelled(t, old[web], ErrChanged)
			wantRevoked(t, streams[web], ErrChanged)
			wantNotRevoked(t, streams[unnamed])
			var want AccessPolicy
			if tc.to != "" {
				_ = json.Unmarshal([]byte(tc.to), &want)
			}
			if !r.Access.Equal(&want) {
				t.Fatalf("route policy %+v, want %+v", r.Access, want)
			}
			if tbl.Lookup(unnamed).Access.Mode != AccessPublic {
				t.Fatalf("unnamed service policy %+v, want public", tbl.Lookup(unnamed).Access)
			}
		})
	}
}
