package dispatch

import (
	"bufio"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/routes"
)

// nagleApp is a keep-alive HTTP/1.1 app that writes each response in two
// small writes with Nagle's algorithm on, as Python's http.server and
// werkzeug do: its second write waits until the first is acknowledged.
type nagleApp struct {
	ln net.Listener
	wg sync.WaitGroup
	mu sync.Mutex
	cs []net.Conn
}

func newNagleApp(t *testing.T) *nagleApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &nagleApp{ln: ln}
	a.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.cs = append(a.cs, c)
			a.mu.Unlock()
			a.wg.Go(func() { a.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		a.mu.Lock()
		for _, c := range a.cs {
			_ = c.Close()
		}
		a.mu.Unlock()
		a.wg.Wait()
	})
	return a
}

func (a *nagleApp) serve(c net.Conn) {
	_ = c.(*net.TCPConn).SetNoDelay(false)
	r := bufio.NewReader(c)
	for {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if strings.TrimSpace(line) == "" {
				break
			}
		}
		if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\n")); err != nil {
			return
		}
		if _, err := c.Write([]byte("hello")); err != nil {
			return
		}
	}
}

func (a *nagleApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

// TestAppResponseInTwoWritesNotDelayed: over HTTP/1.1 and HTTP/2, requests
// in a row on one route reuse one app connection within the kernel's
// delayed-ACK timeout; an app that writes its response in two small writes
// with Nagle on must not wait for the listener's delayed ACK (at least
// 40 ms, Linux's TCP_DELACK_MIN) before its second write goes out. Without
// the early acknowledgement every such request took 40 ms; the test
// counts requests slower than 35 ms and fails when most of them are: a
// starved machine under -race slows some requests, never nearly all.
func TestAppResponseInTwoWritesNotDelayed(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the early acknowledgement uses Linux's TCP_QUICKACK")
	}
	h2Verify(t)
	const requests, slowAllowed = 20, 14
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			app := newNagleApp(t)
			e := newH2Env(t, 0, Config{})
			doc, err := routes.ParseDocument([]byte(fmt.Sprintf(`{"revision":"r","instances":[`+
				`{"workspace":"team","sandbox":"nagle","services":[{"name":"web","port":%d}]}]}`, app.port())))
			if err != nil || len(doc.Rejected) > 0 {
				t.Fatalf("document: %v %+v", err, doc)
			}
			e.table.Apply(doc)
			host := "team--nagle--web." + h2Domain
			var do func()
			switch proto {
			case "h1":
				c := e.h1(host)
				do = func() {
					if st, _, body := c.do(t, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); st != 200 || body != "hello" {
						t.Fatalf("status %d body %q", st, body)
					}
				}
			case "h2":
				cc := e.dial(host)
				do = func() { h2MustDo(t, cc, h2Req(t, "GET", host, "/", nil), 200) }
			}
			do() // the app connection is dialled
			slow := 0
			var worst time.Duration
			for range requests {
				start := time.Now()
				do()
				d := time.Since(start)
				worst = max(worst, d)
				if d >= 35*time.Millisecond {
					slow++
				}
			}
			if slow > slowAllowed {
				t.Errorf("%d of %d requests took 35 ms or more (the slowest %v): the app's second write waited for a delayed ACK", slow, requests, worst)
			}
		})
	}
}
