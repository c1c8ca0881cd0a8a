// Package demoapp is the small web app that `applistener dev` serves
// behind the listener: an HTML page that shows what the app received, and
// a WebSocket echo at /ws.
package demoapp

import (
	"fmt"
	"html"
	"net/http"
	"sort"
	"strings"

	"github.com/gorilla/websocket"
)

// Handler returns the demo app. name is shown on the page.
func Handler(name string) http.Handler {
	mux := http.NewServeMux()
	upgrader := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		for {
			mt, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			if err := c.WriteMessage(mt, msg); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		names := make([]string, 0, len(r.Header))
		for k := range r.Header {
			names = append(names, k)
		}
		sort.Strings(names)
		if strings.Contains(r.Header.Get("Accept"), "text/html") {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = fmt.Fprintf(w, "<!doctype html><title>%s</title><h1>Hello from %s</h1><p>Host seen by the app: <code>%s</code></p><ul>",
				html.EscapeString(name), html.EscapeString(name), html.EscapeString(r.Host))
			for _, k := range names {
				_, _ = fmt.Fprintf(w, "<li><code>%s: %s</code></li>", html.EscapeString(k), html.EscapeString(strings.Join(r.Header[k], ", ")))
			}
			_, _ = fmt.Fprint(w, `</ul><p>WebSocket echo: <span id=ws>connecting…</span></p><script>
const s=new WebSocket((location.protocol==="https:"?"wss://":"ws://")+location.host+"/ws");
s.onopen=()=>s.send("hello over the listener");s.onmessage=e=>{document.getElementById("ws").textContent="echoed: "+e.data};
</script>`)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintf(w, "Hello from %s\nHost: %s\n", name, r.Host)
		for _, k := range names {
			_, _ = fmt.Fprintf(w, "%s: %s\n", k, strings.Join(r.Header[k], ", "))
		}
	})
	return mux
}
