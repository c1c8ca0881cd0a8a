package e2e

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/applistener/applistener/internal/testutil"
)

// TestAccessLogTotalRate: the built binary with --access-log-total-rate
// holds the access log of the whole process to that bound even when the
// instance's own bound is lifted: of 8 requests over HTTP/1.1 and HTTP/2,
// one line (the burst of a 0.5 lines/s bound) is written and the others
// are counted in applistener_access_log_dropped_total.
func TestAccessLogTotalRate(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	p := startProc(t, routesDoc(service{Name: "web", Port: web.port, Revision: 1}),
		"--access-log", "json", "--access-log-rate", "-1", "--access-log-total-rate", "0.5")
	h1, _ := p.client(t, hostWeb)
	const requests = 8
	for i, c := range []*http.Client{h1, p.h2Client(t, hostWeb)} {
		for j := range requests / 2 {
			resp, err := c.Get(fmt.Sprintf("https://%s/r-%d-%d", hostWeb, i, j))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != 200 || resp.ProtoMajor != i+1 {
				t.Fatalf("%s status %d", resp.Proto, resp.StatusCode)
			}
		}
	}
	var lines int
	testutil.Eventually(t, waitTimeout, "every request logged or counted as dropped", func() bool {
		lines = len(accessLines(t, p, "msg", "access"))
		return lines+int(p.metric(t, "applistener_access_log_dropped_total")) == requests
	})
	// 0.5 lines a second: a second line would need 2 s more than the
	// requests took, which a loaded machine may take; never more than 3.
	if lines < 1 || lines > 3 {
		t.Errorf("%d access-log lines for %d requests with --access-log-total-rate 0.5", lines, requests)
	}
}
