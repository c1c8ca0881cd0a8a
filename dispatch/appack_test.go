package dispatch

import (
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/applistener/applistener/routes"
)

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
			app := newRawApp(t)
			app.setAct(func(*http.Request, int) rawAction { return answerInTwoWrites })
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
					if st, _, body := c.do(t, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); st != 200 || body != "ok" {
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
