package listener

import (
	"crypto/tls"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// syncLog is a log destination safe for concurrent writes.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPanicListenerConnClosesOnlyItsConnection: a panic in the
// per-connection goroutine (injected after the route lookup) closes that
// connection only, releases its slot (MaxConnections 1: the next
// connection is served), is logged once with its SNI and stack, and is
// counted; a connection of another sandbox is served.
func TestPanicListenerConnClosesOnlyItsConnection(t *testing.T) {
	const victim, bystander = "team--victim--web." + testDomain, "team--bystander--web." + testDomain
	logs := &syncLog{}
	table := routes.NewTable(routes.Options{Domain: testDomain, Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(table.Close)
	doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[
		{"workspace":"team","sandbox":"victim","generation":"1","services":[{"name":"web","port":8080,"revision":1}]},
		{"workspace":"team","sandbox":"bystander","generation":"1","services":[{"name":"web","port":8081,"revision":1}]}]}`))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	table.Apply(doc)
	l, h, ca := newTestListenerWith(t, nil, func(c *Config) {
		c.Routes = table
		c.MaxConnections = 1
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	restore := panicguard.SetTestHook(func(where, id string) {
		if where == panicguard.ListenerConn && id == victim {
			panic("injected panic at " + where)
		}
	})
	t.Cleanup(restore)
	before := panicguard.Count(panicguard.ListenerConn)

	dial := func(host string) error {
		c, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{ServerName: host, RootCAs: ca.Pool(), NextProtos: []string{"http/1.1"}})
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	if err := dial(victim); err == nil {
		t.Fatal("the victim's handshake succeeded; want its connection closed")
	}
	// The connection is closed before the panic is counted.
	testutil.Eventually(t, 5*time.Second, "the panic counted", func() bool {
		return panicguard.Count(panicguard.ListenerConn) >= before+1
	})
	if got := panicguard.Count(panicguard.ListenerConn); got != before+1 {
		t.Fatalf("applistener_panics_total{where=listener_conn} = %v; want %v", got, before+1)
	}
	// The slot was released (MaxConnections 1): the bystander is served.
	testutil.Eventually(t, 5*time.Second, "the bystander's connection handed off", func() bool {
		if err := dial(bystander); err != nil {
			return false
		}
		for _, c := range h.handedOff() {
			if c.c.SNI == bystander {
				return true
			}
		}
		return false
	})
	out := logs.String()
	if n := strings.Count(out, "panic recovered"); n != 1 {
		t.Fatalf("%d panic log lines; want 1:\n%s", n, out)
	}
	for _, want := range []string{`"where":"listener_conn"`, `"sni":"` + victim + `"`, `"stack":"goroutine `} {
		if !strings.Contains(out, want) {
			t.Errorf("the panic's log line lacks %s:\n%s", want, out)
		}
	}
}
