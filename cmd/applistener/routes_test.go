package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
)

const (
	testUUID        = "0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1"
	testLongService = "jupyter-lab-notebook"
	testHashedHost  = "h-hvma5opumihpylo5tjmqpngfhtjz2hpvz23cxmap4z6s7jjnepgq.apps.example.com"
)

// `routes hostname` prints the readable hostname when it fits and the
// hashed one (the README's worked example) when it does not.
func TestRoutesHostnameCommand(t *testing.T) {
	common := []string{"routes", "hostname", "--domain", "apps.example.com", "--workspace", "team"}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // exact, without the newline
		stderr string // a substring
	}{
		{"readable", append(common, "--sandbox", "demo", "--service", "web"), 0, "team--demo--web.apps.example.com", ""},
		{"readable unnamed", append(common, "--sandbox", testUUID), 0, "team--" + testUUID + ".apps.example.com", ""},
		{"readable uuid", append(common, "--sandbox", testUUID, "--service", "web"), 0, "team--" + testUUID + "--web.apps.example.com", ""},
		{"hashed", append(common, "--sandbox", testUUID, "--service", testLongService), 0, testHashedHost, ""},
		{"no sandbox", common, 2, "", "--sandbox: name is empty"},
		{"bad service", append(common, "--sandbox", "demo", "--service", "a--b"), 2, "", `--service: name "a--b": must not contain "--"`},
		{"name too long", append(common, "--sandbox", strings.Repeat("s", 64)), 2, "", "longer than 63"},
		{"no domain", []string{"routes", "hostname", "--workspace", "team", "--sandbox", "demo"}, 2, "", "--app-domain is required"},
		{"bad domain", []string{"routes", "hostname", "--domain", "Apps.example.com", "--workspace", "team", "--sandbox", "demo"}, 2, "", "--domain"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.code || (tc.code == 0 && stdout.String() != tc.stdout+"\n") || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.name, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}

// The routes table shows the sandbox and service beside each hostname, so
// that a hashed hostname can be told apart.
func TestPrintRoutesShowsNames(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	s := &api.RouteSnapshot{Workspace: "team", Revision: "7", Routes: []api.ServiceRoute{
		{Hostname: testHashedHost, Workspace: "team", Sandbox: testUUID, Name: testLongService, Supervisor: "sup-1",
			InstallationVersion: 3, ExpiresAt: exp, Endpoint: api.RouteEndpoint{Host: "10.0.0.1", Port: 8443}},
		{Hostname: "team--demo.apps.example.com", Workspace: "team", Sandbox: "demo", Supervisor: "sup-2",
			InstallationVersion: 4, ExpiresAt: exp, Endpoint: api.RouteEndpoint{Host: "10.0.0.2", Port: 8443}},
	}}
	var out bytes.Buffer
	if err := printRoutes(&out, "table", s, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := [][]string{
		{"HOSTNAME", "SANDBOX", "SERVICE", "SUPERVISOR", "ENDPOINT", "VERSION", "EXPIRES"},
		{testHashedHost, testUUID, testLongService, "sup-1", "10.0.0.1:8443", "3", "2030-01-02T03:04:05Z"},
		{"team--demo.apps.example.com", "demo", "-", "sup-2", "10.0.0.2:8443", "4", "2030-01-02T03:04:05Z"},
	}
	if len(lines) != len(want) {
		t.Fatalf("table:\n%s", out.String())
	}
	for i, l := range lines {
		if got := strings.Fields(l); strings.Join(got, " ") != strings.Join(want[i], " ") {
			t.Errorf("line %d: %q, want fields %q", i, l, want[i])
		}
	}
}
