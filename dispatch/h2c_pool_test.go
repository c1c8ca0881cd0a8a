package dispatch

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// TestH2CPoolForgetsAConnectionGoneBeforeItWasAdded: an app that answers
// the preface with SETTINGS and GOAWAY at once (a gRPC server shutting
// down) may have its connection's state hook run before the dial adds the
// connection to the pool. Such a connection must not stay in the pool:
// the pool looks at its first maxH2CConns connections only, so four of
// them would make every later request dial again and again, never using
// the connections it dials.
func TestH2CPoolForgetsAConnectionGoneBeforeItWasAdded(t *testing.T) {
	e := newH2Env(t, 0, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const accepts = 40
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		// After accepts connections the app is gone: dials fail, and the
		// pool's get returns.
		defer func() { _ = ln.Close() }()
		for range accepts {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				br := bufio.NewReader(c)
				preface := make([]byte, len(http2.ClientPreface))
				if _, err := io.ReadFull(br, preface); err != nil {
					return
				}
				// SETTINGS and GOAWAY in one write.
				bw := bufio.NewWriter(c)
				fr := http2.NewFramer(bw, br)
				_ = fr.WriteSettings()
				_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
				if bw.Flush() != nil {
					return
				}
				_, _ = io.Copy(io.Discard, br)
			})
		}
	})
	port := ln.Addr().(*net.TCPAddr).Port
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		"connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"bye","port":%d,"protocol":"h2c"}]}]}`, port))
	if err != nil {
		t.Fatal(err)
	}
	e.table.Apply(doc)
	route := e.table.Lookup("team--demo--bye.apps.test")
	if route == nil {
		t.Fatal("no route for the app")
	}
	pool := e.srv.h2cPoolOf(route, e.srv.routePool(route))
	t.Cleanup(func() { pool.Revoke(nil) })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A stream may be reserved on a connection whose GOAWAY has not been
	// read yet; it is given back, and the pool asked again, until the
	// app is gone.
	for {
		cc, err := pool.get(ctx)
		if err != nil {
			break
		}
		cc.Unreserve()
	}
	if ctx.Err() != nil {
		t.Fatal("the pool did not give up once the app was gone")
	}
	testutil.Eventually(t, 10*time.Second, "no connection that takes no new streams left in the pool", func() bool {
		pool.mu.Lock()
		clients := append([]*h2cClient(nil), pool.clients...)
		pool.mu.Unlock()
		for _, c := range clients {
			if c.cc.Err() != nil {
				return false
			}
		}
		return true
	})
}
