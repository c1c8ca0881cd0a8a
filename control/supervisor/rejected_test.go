package supervisor

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// rejectedDocument has a valid instance, one whose service port is 0 and
// one with an unknown field and a service whose port is a string.
const rejectedDocument = `{"revision":"r1","instances":[
	{"workspace":"team","sandbox":"demo","generation":"3","services":[{"name":"web","port":8080,"revision":1}]},
	{"workspace":"team","sandbox":"bad","services":[{"name":"web","port":0}]},
	{"workspace":"team","sandbox":"worse","limitz":{},"services":[{"name":"web","port":"80"}]}]}`

// checkRejectedPaths checks the "instance rejected" lines of logs (JSON):
// each carries the full JSON path of the field at fault and every problem
// at its full path.
func checkRejectedPaths(t *testing.T, logs string) {
	t.Helper()
	for _, want := range []string{
		`"path":"instances[1].services[0].port"`,
		`"path":"instances[2].limitz"`,
		`instances[2].services[0].port: must be a whole number, not a string`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %s in the instance rejected lines:\n%s", want, logs)
		}
	}
}

// The routes file source logs the full JSON path of a rejected entry's
// field at fault.
func TestFileSourceRejectedPaths(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.json")
	writeAtomic(t, path, rejectedDocument)
	var logs lockedBuffer
	src := &FileSource{Path: path, Sink: &countingSink{}, Refresh: time.Hour, Poll: 10 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testutil.Eventually(t, 5*time.Second, "the rejected entries logged", func() bool {
		return strings.Count(logs.String(), `"msg":"instance rejected"`) == 2
	})
	checkRejectedPaths(t, logs.String())
}

// So does the gateway source, for a document it was pushed.
func TestGatewaySourceRejectedPaths(t *testing.T) {
	ca := newTestCA(t, "gateway CA")
	g := newFakeGateway(t, ca, rejectedDocument)
	c := newTestClient(t, g.url, 3*time.Second, ca)
	var logs lockedBuffer
	c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	c.run(t, false)
	testutil.Eventually(t, 5*time.Second, "the rejected entries logged", func() bool {
		return strings.Count(logs.String(), `"msg":"instance rejected"`) >= 2
	})
	checkRejectedPaths(t, logs.String())
}
