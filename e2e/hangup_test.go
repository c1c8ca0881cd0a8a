//go:build unix

package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// SIGHUP on serve, gateway and edge reloads what each reads and never
// ends the process (its default action would): a connection held through
// the edge and the supervisor carries a request after the three signals,
// and new connections are served.
func TestSIGHUPReloadsAndNeverEnds(t *testing.T) {
	pki := newSupervisorPKI(t)
	web := newBackend(t, "web1")
	gw := newDiscoveryGateway(t, map[string][]discoveryInstance{
		"sup-1": {{"demo", map[string]int{"web": web.port}}},
	})
	sup := gw.startSupervisor(t, pki, "sup-1", 101)
	edge := gw.startEdge(t)
	testutil.Eventually(t, waitTimeout, "the route through the edge", func() bool {
		body, _, err := getThroughEdge(edge.appAddr, pki.pool, demoHost)
		return err == nil && body == "hello from web1"
	})
	held := edgeConn(t, edge.appAddr, pki.pool, demoHost)
	get := func(what string) {
		t.Helper()
		_ = held.SetDeadline(time.Now().Add(waitTimeout))
		if _, err := fmt.Fprintf(held, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", demoHost); err != nil {
			t.Fatalf("%s: write on the held connection: %v", what, err)
		}
		resp, err := http.ReadResponse(held.br, nil)
		if err != nil {
			t.Fatalf("%s: the held connection: %v", what, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "hello from web1" {
			t.Fatalf("%s: %d %q", what, resp.StatusCode, b)
		}
	}
	get("before the signals")

	for _, c := range []struct {
		p    *proc
		logs []string // lines the signal must produce
	}{
		{gw.proc, []string{`"msg":"SIGHUP: reloaded","what":"tokens file, configuration file"`}},
		{sup.proc, []string{`"msg":"SIGHUP: reloading certificates"`}},
		{edge, []string{`"msg":"SIGHUP: reloaded","what":"gateway token file`, `"msg":"discovery watch reopened"`}},
	} {
		if err := c.p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatalf("SIGHUP to %s: %v", c.p.name, err)
		}
		for _, want := range c.logs {
			testutil.Eventually(t, waitTimeout, c.p.name+" logs "+want, func() bool {
				return strings.Contains(c.p.output(), want)
			})
		}
		if c.p.exited() {
			t.Fatalf("%s exited on SIGHUP (code %d)", c.p.name, c.p.exitCode)
		}
		if code := c.p.readyz(); code != http.StatusOK {
			t.Fatalf("%s /readyz %d after SIGHUP", c.p.name, code)
		}
	}
	get("after the signals")
	testutil.Eventually(t, waitTimeout, "a new connection through the edge", func() bool {
		body, _, err := getThroughEdge(edge.appAddr, pki.pool, demoHost)
		return err == nil && body == "hello from web1"
	})
	for _, p := range []*proc{gw.proc, sup.proc, edge} {
		if p.exited() {
			t.Fatalf("%s exited after SIGHUP", p.name)
		}
	}
}
