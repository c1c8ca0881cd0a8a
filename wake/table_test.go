package wake

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/routes"

	itest "github.com/applistener/applistener/internal/testutil"
)

const webHost = "team--demo--web.apps.test"

// stateDocument is the document of instance team/demo (generation 1,
// service web) in the given state.
func stateDocument(state string) *routes.Document {
	doc, err := routes.ParseDocument([]byte(`{"instances":[{"workspace":"team","sandbox":"demo","generation":"1","state":"` + state +
		`","services":[{"name":"web","port":8080}]}]}`))
	if err != nil || len(doc.Rejected) != 0 {
		panic("test document does not parse")
	}
	return doc
}

func applyState(t *testing.T, tbl *routes.Table, state string) {
	t.Helper()
	tbl.Apply(stateDocument(state))
}

func newTable(t *testing.T) *routes.Table {
	tbl := routes.NewTable(routes.Options{Domain: "apps.test", Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(tbl.Close)
	return tbl
}

// A routes-file deployment: the platform's hook marks the instance active
// (here: applies the document to the table), FollowTable releases the
// held requests, which then find the active route.
func TestFollowTable(t *testing.T) {
	itest.VerifyNone(t)
	tbl := newTable(t)
	applyState(t, tbl, routes.StateSleeping)
	r := tbl.Lookup(webHost)
	if r == nil || !r.Sleeping() || KeyOf(r) != keyA {
		t.Fatalf("sleeping route %+v", r)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	p := newPlatform(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		wg.Go(func() {
			time.Sleep(100 * time.Millisecond) // the sandbox resumes
			tbl.Apply(stateDocument(routes.StateActive))
		})
	})
	c, _ := newCoordinator(t, p, Options{}, HookOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wg.Go(func() { c.FollowTable(ctx, tbl) })
	const n = 10
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Wait(context.Background(), KeyOf(r), 30*time.Second, nil)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("Wait: %v", err)
		}
	}
	if a := tbl.Lookup(webHost); a == nil || a.Sleeping() {
		t.Fatalf("after the wake: %+v", a)
	}
	if p.calls.Load() != 1 {
		t.Fatalf("%d hook calls, want 1", p.calls.Load())
	}
	if c.tracked.Load() != 0 {
		t.Fatalf("the wake is still tracked after the instance became active")
	}
}

// The route's Woken releases the held requests when the instance wakes,
// without FollowTable: a change the coordinator was not told of.
func TestWokenReleases(t *testing.T) {
	itest.VerifyNone(t)
	tbl := newTable(t)
	applyState(t, tbl, routes.StateSleeping)
	r := tbl.Lookup(webHost)
	p := newPlatform(t, nil)
	c, _ := newCoordinator(t, p, Options{}, HookOptions{})
	const n = 5
	results := make(chan result, n)
	for i := range n {
		go func() {
			tk, err := c.Wait(context.Background(), KeyOf(r), 30*time.Second, r.Woken())
			results <- result{tk, err}
		}()
		itest.Eventually(t, 10*time.Second, "held", func() bool { return c.Held() == i+1 })
	}
	applyState(t, tbl, routes.StateActive)
	if tbl.Lookup(webHost) != r || r.Sleeping() {
		t.Fatal("waking did not keep the route (in place)")
	}
	for range n {
		res := <-results
		if res.err != nil || res.t.Released != res.t.Arrival {
			t.Fatalf("Wait: %+v", res)
		}
	}
}
