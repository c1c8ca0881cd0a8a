package dispatch

import (
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
)

// serveRoutesTLS is the listener's hand-off in small, for the tests that
// drive a Server over real TLS: it accepts on ln, completes each TLS
// handshake with cert (h2 or http/1.1 by ALPN, 5 s at most), looks the SNI
// up in table (no route: the connection is closed) and serves the
// connection with srv, each on a goroutine of wg. It returns at once; the
// loop ends when ln is closed.
func serveRoutesTLS(wg *sync.WaitGroup, ln net.Listener, cert tls.Certificate, table *routes.Table, srv *Server) {
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	wg.Go(func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				tc := tls.Server(raw, tlsCfg)
				_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
				if err := tc.Handshake(); err != nil {
					_ = raw.Close()
					return
				}
				_ = raw.SetDeadline(time.Time{})
				cs := tc.ConnectionState()
				route := table.Lookup(cs.ServerName)
				if route == nil {
					_ = raw.Close()
					return
				}
				lc := listener.Conn{Conn: tc, Raw: raw, SNI: cs.ServerName, Route: route}
				if cs.NegotiatedProtocol == "h2" {
					srv.ServeH2(lc)
				} else {
					srv.ServeConn(lc)
				}
			})
		}
	})
}
