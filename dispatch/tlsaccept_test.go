package dispatch

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// wildcardAuthority is a new CA named name and the certificate it issues
// for every name under h2Domain (valid an hour).
func wildcardAuthority(tb testing.TB, name string) (*tlsconf.Authority, tls.Certificate) {
	tb.Helper()
	ca, err := tlsconf.NewAuthority(name)
	if err != nil {
		tb.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue([]string{"*." + h2Domain}, time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	return ca, cert
}

// listenerTransport is a transport that trusts ca, dials addr whatever the
// URL names, and speaks only HTTP/2 (h2) or only HTTP/1.1; its idle
// connections are closed when tb ends.
func listenerTransport(tb testing.TB, ca *tlsconf.Authority, addr string, h2 bool) *http.Transport {
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool()},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}
	var p http.Protocols
	if h2 {
		p.SetHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	tr.Protocols = &p
	tb.Cleanup(tr.CloseIdleConnections)
	return tr
}

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

// listenerWSDialer returns a WebSocket dialer that speaks HTTP/1.1 to the
// listener at addr for host, trusting ca, with a 5 s handshake timeout.
func listenerWSDialer(ca *tlsconf.Authority, addr, host string) websocket.Dialer {
	return websocket.Dialer{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: host, NextProtos: []string{"http/1.1"}},
		NetDialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		HandshakeTimeout: 5 * time.Second,
	}
}
