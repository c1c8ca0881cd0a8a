package dispatch

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/applistener/applistener/internal/panicguard"
)

// TestPanicRequestBodyEndsOnlyItsExchange: a panic in the goroutine that
// copies a request body to the app (injected through panicguard's test
// hook) ends that one exchange, on HTTP/1.1 and HTTP/2: the client gets
// a 502 (or, on HTTP/1.1, a closed connection), the panic is logged with
// the route and counted in applistener_panics_total{where="request_body"},
// a bystander sandbox's connections opened before keep working, and the
// victim's next upload goes through.
func TestPanicRequestBodyEndsOnlyItsExchange(t *testing.T) {
	const body = "a request body the copy never sends"
	upload := "POST /upload HTTP/1.1\r\nHost: " + panicVictimHost + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		t.Run(proto, func(t *testing.T) {
			h2Verify(t)
			e, logs := newPanicEnv(t)
			check1, check2 := bystanderH1(t, e), bystanderH2(t, e)
			before := panicguard.Count(panicguard.RequestBody)
			disarm := injectPanic(t, panicguard.RequestBody, panicVictimHost)

			var status int
			var after func() (int, string)
			if proto == "HTTP/1.1" {
				// The head alone: a body that arrived with it would be
				// written with the head, without the copy goroutine.
				c := e.h1(panicVictimHost)
				_, _ = io.WriteString(c.conn, strings.TrimSuffix(upload, body))
				if resp, err := http.ReadResponse(c.br, nil); err == nil {
					status = resp.StatusCode
					_ = resp.Body.Close()
				}
				after = func() (int, string) {
					s, _, b := e.h1(panicVictimHost).do(t, upload)
					return s, b
				}
			} else {
				cc := e.dial(panicVictimHost)
				if resp, err := cc.RoundTrip(h2Req(t, "POST", panicVictimHost, "/upload", strings.NewReader(body))); err == nil {
					status = resp.StatusCode
					_ = resp.Body.Close()
				}
				after = func() (int, string) { // the same connection: only the stream ended
					resp, err := cc.RoundTrip(h2Req(t, "POST", panicVictimHost, "/upload", strings.NewReader(body)))
					if err != nil {
						t.Fatalf("the victim's connection after the panic: %v", err)
					}
					b, _ := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					return resp.StatusCode, string(b)
				}
			}
			if status != 0 && status != http.StatusBadGateway {
				t.Fatalf("the victim's upload answered %d; want 502 or no answer", status)
			}
			expectPanicCount(t, panicguard.RequestBody, before+1)
			expectPanicLogged(t, logs, panicguard.RequestBody, panicVictimHost)
			check1("after the panic")
			check2("after the panic")
			disarm()
			if s, b := after(); s != http.StatusOK || !strings.HasPrefix(b, h2Sha([]byte(body))+" "+strconv.Itoa(len(body))) {
				t.Fatalf("the victim's upload after the panic: %d %q", s, b)
			}
			t.Logf("%s: the panicked upload's answer: %d (0: none)", proto, status)
		})
	}
}
