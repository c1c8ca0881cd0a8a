package gateway

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// listSupervisors GETs /v1/supervisors with the admin token, by id.
func (r *replica) listSupervisors(t *testing.T) map[string]supervisorInfo {
	t.Helper()
	resp, body := r.do(http.MethodGet, "/v1/supervisors", repTokAdmin, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/supervisors: %d %q", resp.StatusCode, body)
	}
	var list struct {
		Supervisors []supervisorInfo `json:"supervisors"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("GET /v1/supervisors: %v in %q", err, body)
	}
	out := make(map[string]supervisorInfo, len(list.Supervisors))
	var ids []string
	for _, s := range list.Supervisors {
		out[s.Supervisor] = s
		ids = append(ids, s.Supervisor)
	}
	if !slices.IsSorted(ids) {
		t.Errorf("the list is not sorted by id: %v", ids)
	}
	return out
}

// GET /v1/supervisors lists every known id with its state; DELETE
// /v1/supervisors/{id} on one replica forgets an id on both: its push
// stream ends, its routes leave discovery, its document and binding go,
// and its session cannot come back with the old id's order. Both need an
// admin token.
func TestWriteAPISupervisors(t *testing.T) {
	_, a, b := twoReplicas(t, 1, replicaOptions{})
	// sup-1 on B: a push stream, an advertisement, published.
	stream, _ := b.openConfigWatch(t, "sup-1", routesTokSup1, "session="+sessionID(1))
	stream.nextDocument(2 * time.Second)
	if code := b.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatal(code)
	}
	// host-7, a pool member, with a document.
	if resp, body := a.do(http.MethodGet, "/v1/supervisors/host-7/config?session="+sessionID(7), repTokPoolA, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("pool member: %d %q", resp.StatusCode, body)
	}
	if resp, body := a.do(http.MethodPut, "/v1/supervisors/host-7/instances/team/pooled", repTokAdmin, strings.NewReader(pooledEntry("pooled"))); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %d %q", resp.StatusCode, body)
	}
	testutil.Eventually(t, 5*time.Second, "sup-1 published on A", func() bool {
		return slices.Contains(a.snapshot("team", routesTokTeam), "team--demo--web.apps.test@sup-1")
	})

	before := time.Now().Add(-time.Minute)
	var list map[string]supervisorInfo
	testutil.Eventually(t, 5*time.Second, "both ids listed on A with their routes", func() bool {
		list = a.listSupervisors(t)
		return list["sup-1"].Routes == 1 && list["host-7"].Instances == 1
	})
	s1 := list["sup-1"]
	if !s1.Token || s1.Session != sessionActive || s1.SessionID != sessionID(1) || !s1.Document || s1.Instances != 2 ||
		s1.LastSeen == nil || s1.LastSeen.Before(before) || s1.Pool != "" {
		t.Errorf("sup-1: %+v", s1)
	}
	if h := list["host-7"]; h.Token || h.Pool != "pool-a" || h.Session != sessionActive || !h.Document || h.Instances != 1 || h.Routes != 0 {
		t.Errorf("host-7: %+v", h)
	}
	if s2 := list["sup-2"]; !s2.Token || s2.Session != sessionNone || s2.LastSeen != nil || !s2.Document || s2.Instances != 1 {
		t.Errorf("sup-2 (a token and a document, never connected): %+v", s2)
	}
	resp, body := b.do(http.MethodGet, "/v1/supervisors/host-7", repTokAdmin, nil)
	var one supervisorInfo
	if err := json.Unmarshal([]byte(body), &one); resp.StatusCode != http.StatusOK || err != nil || one.Supervisor != "host-7" || one.Pool != "pool-a" {
		t.Errorf("GET /v1/supervisors/host-7 on B: %d %q", resp.StatusCode, body)
	}

	// Admin only.
	for _, c := range []struct {
		method, path, token string
		want                int
	}{
		{http.MethodGet, "/v1/supervisors", "", http.StatusUnauthorized},
		{http.MethodGet, "/v1/supervisors", routesTokSup1, http.StatusForbidden},
		{http.MethodGet, "/v1/supervisors", repTokPoolA, http.StatusForbidden},
		{http.MethodGet, "/v1/supervisors", routesTokTeam, http.StatusForbidden},
		{http.MethodDelete, "/v1/supervisors/sup-1", routesTokSup1, http.StatusForbidden},
		{http.MethodDelete, "/v1/supervisors/host-7", repTokPoolA, http.StatusForbidden},
		{http.MethodPost, "/v1/supervisors", repTokAdmin, http.StatusMethodNotAllowed},
		{http.MethodPut, "/v1/supervisors/sup-1", repTokAdmin, http.StatusMethodNotAllowed},
		{http.MethodGet, "/v1/supervisors/nobody", repTokAdmin, http.StatusNotFound},
		{http.MethodDelete, "/v1/supervisors/nobody", repTokAdmin, http.StatusNotFound},
		{http.MethodDelete, "/v1/supervisors/bad%20id", repTokAdmin, http.StatusBadRequest},
	} {
		resp, body := a.do(c.method, c.path, c.token, nil)
		if resp.StatusCode != c.want {
			t.Errorf("%s %s with %q: %d %q, want %d", c.method, c.path, c.token, resp.StatusCode, body, c.want)
		}
		if c.want >= 400 {
			checkOneLine(t, resp.StatusCode, body)
		}
	}

	// Forget sup-1 on A: its stream on B ends (after the empty document,
	// when the stream wrote it before its end), its route leaves discovery
	// on both replicas.
	if resp, body := a.do(http.MethodDelete, "/v1/supervisors/sup-1", repTokAdmin, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE sup-1: %d %q", resp.StatusCode, body)
	}
	stream.waitEnd(5 * time.Second)
	for _, r := range []*replica{a, b} {
		testutil.Eventually(t, 5*time.Second, "sup-1 unpublished", func() bool {
			return !slices.ContainsFunc(r.snapshot("team", routesTokTeam), func(h string) bool { return strings.HasSuffix(h, "@sup-1") })
		})
	}
	if code := b.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(2)); code != http.StatusConflict {
		t.Errorf("an advertisement of the forgotten session: %d, want 409", code)
	}
	// B's view follows the store: wait for it.
	testutil.Eventually(t, 5*time.Second, "sup-1 forgotten in B's list", func() bool {
		s1 := b.listSupervisors(t)["sup-1"]
		return s1.Token && s1.Session == sessionWithdrawn && !s1.Document && s1.Instances == 0 && s1.Routes == 0
	})
	// Forget host-7: its document and pool binding go, another pool may
	// take the id.
	if resp, body := b.do(http.MethodDelete, "/v1/supervisors/host-7", repTokAdmin, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE host-7: %d %q", resp.StatusCode, body)
	}
	testutil.Eventually(t, 5*time.Second, "host-7 forgotten in A's list", func() bool {
		h := a.listSupervisors(t)["host-7"]
		return h.Pool == "" && !h.Document && h.Session == sessionWithdrawn
	})
	if resp, body := a.do(http.MethodGet, "/v1/supervisors/host-7/config?session="+sessionID(8), repTokPoolB, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("another pool takes the forgotten id: %d %q", resp.StatusCode, body)
	}
	if got := a.metric("applistener_gateway_requests_total", "endpoint", "supervisors", "code", "204"); got != 1 {
		t.Errorf("supervisors 204 on A: %v", got)
	}
}

// A configuration file or a write API PUT naming an id the gateway does
// not know is warned about and counted; with StrictSupervisors the file is
// refused (the stored documents stay) and the PUT gets 404.
func TestUnknownSupervisors(t *testing.T) {
	for _, strict := range []bool{false, true} {
		name := "warn"
		if strict {
			name = "strict"
		}
		t.Run(name, func(t *testing.T) {
			checkLeaks(t)
			configPath, tokensPath := replicaFiles(t)
			r := newReplica(t, replicaOptions{configPath: configPath, tokensPath: tokensPath, strict: strict})
			action := "warned"
			if strict {
				action = "refused"
			}
			if got := r.metric("applistener_gateway_unknown_supervisors_total", "source", "config", "action", action); got != 0 {
				t.Fatalf("the default file (ids with tokens) counted %v unknown", got)
			}
			// host-typo: no token, never connected.
			sections := map[string][]testInstance{
				"sup-1":     {{"team", "demo", []string{"web"}}, {"team", "extra", []string{"web"}}},
				"host-typo": {{"team", "typo", []string{"web"}}},
			}
			writeFileAtomic(t, configPath, sectionsConfig(sections))
			err := r.g.Reload()
			if strict != (err != nil) || strict && !strings.Contains(err.Error(), "host-typo") {
				t.Fatalf("Reload: %v", err)
			}
			if got := r.metric("applistener_gateway_unknown_supervisors_total", "source", "config", "action", action); got != 1 {
				t.Errorf("unknown ids counted: %v, want 1", got)
			}
			if !strings.Contains(r.logs.String(), "document for an unknown supervisor id") || !strings.Contains(r.logs.String(), "supervisor=host-typo") {
				t.Errorf("no warning naming host-typo in the logs:\n%s", r.logs.String())
			}
			st := r.g.state.Load()
			_, typo := st.docs["host-typo"]
			extra := strings.Contains(string(st.docs["sup-1"].body), `"extra"`)
			if typo == strict || extra == strict {
				t.Errorf("strict %v: host-typo stored %v, sup-1's new instance stored %v", strict, typo, extra)
			}
			if strict {
				// A token for host-typo arrives: the refused file is
				// imported at the tokens' reload.
				tokens := strings.Replace(replicaTokens(), `{"token": "`+repTokAdmin+`", "admin": true}`,
					`{"token": "`+repTokAdmin+`", "admin": true}, {"token": "rep-typo-S3CRET", "supervisor": "host-typo"}`, 1)
				writeFileAtomic(t, r.g.tokensPath, tokens)
				testutil.Eventually(t, 5*time.Second, "the refused file imported once host-typo has a token", func() bool {
					st := r.g.state.Load()
					_, typo := st.docs["host-typo"]
					return typo && strings.Contains(string(st.docs["sup-1"].body), `"extra"`)
				})
			}
			// The write API.
			resp, body := r.do(http.MethodPut, "/v1/supervisors/other-typo/instances/team/x", repTokAdmin, strings.NewReader(pooledEntry("x")))
			want := http.StatusOK
			if strict {
				want = http.StatusNotFound
			}
			if resp.StatusCode != want || !strict && !strings.Contains(resp.Header.Get(UnknownSupervisorHeader), "unknown supervisor id") {
				t.Errorf("PUT for an unknown id: %d %q (warning %q)", resp.StatusCode, body, resp.Header.Get(UnknownSupervisorHeader))
			}
			if got := r.metric("applistener_gateway_unknown_supervisors_total", "source", "write_api", "action", action); got != 1 {
				t.Errorf("unknown write API ids counted: %v, want 1", got)
			}
			// An id that connected once (a pool member) is known.
			if resp, body := r.do(http.MethodGet, "/v1/supervisors/host-9/config?session="+sessionID(9), repTokPoolA, nil); resp.StatusCode != http.StatusOK {
				t.Fatalf("pool member: %d %q", resp.StatusCode, body)
			}
			resp, body = r.do(http.MethodPut, "/v1/supervisors/host-9/instances/team/x", repTokAdmin, strings.NewReader(pooledEntry("x")))
			if resp.StatusCode != http.StatusOK || resp.Header.Get(UnknownSupervisorHeader) != "" {
				t.Errorf("PUT for a pool member that connected: %d %q (warning %q)", resp.StatusCode, body, resp.Header.Get(UnknownSupervisorHeader))
			}
		})
	}
}
