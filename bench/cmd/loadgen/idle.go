package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

// sourceAddrs returns the loopback source addresses connections are spread
// over: 127.0.0.2, 127.0.0.3, ... (n of them; the loopback /8 answers for
// all). One source address has only the ephemeral port range (~28,000
// ports) towards one destination; 100,000 connections need several.
func sourceAddrs(n int) []*net.TCPAddr {
	if n <= 0 {
		return nil
	}
	out := make([]*net.TCPAddr, n)
	for i := range out {
		out[i] = &net.TCPAddr{IP: net.IPv4(127, 0, byte((2+i)>>8), byte(2+i))}
	}
	return out
}

// runIdle opens conns connections and holds them idle, printing a line
// starting with READY once they are open, until SIGTERM/SIGINT or -hold:
//
//	-proto http1  TLS (or plain) keep-alive: handshake, one request, then idle
//	-proto ws     a WebSocket (path /ws), one echo, then idle
//
// Only the TCP socket of each connection is kept: the TLS and WebSocket
// state of the client is dropped once the exchange is done (nothing more is
// sent on it), so that 100,000 connections cost the generator little memory.
// Closing them closes the sockets (no close_notify / close frame).
func runIdle(args []string, mode string) error {
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	t := targetFlags(fs)
	proto := fs.String("proto", "ws", "http1 (TLS keep-alive, one request) or ws (WebSocket, one echo)")
	if mode == "wsidle" {
		*proto = "ws"
	}
	conns := fs.Int("conns", 5000, "connections to hold")
	parallel := fs.Int("parallel", 50, "connections opened at once")
	hold := fs.Duration("hold", 2*time.Minute, "longest hold")
	sources := fs.Int("sources", 0, "spread connections over this many source addresses 127.0.0.2, 127.0.0.3, ... (0: the kernel's choice)")
	hosts := fs.String("hosts", "", "comma-separated names used in turn as SNI and Host (default: -host / -sni)")
	_ = fs.Parse(args)
	if *proto != "ws" && *proto != "http1" {
		return fmt.Errorf("-proto %q: want ws or http1", *proto)
	}
	if *proto == "ws" && t.path == "/" {
		t.path = "/ws"
	}
	nofile := raiseNoFile()
	srcs := sourceAddrs(*sources)
	targets := []*target{t}
	if *hosts != "" {
		targets = nil
		for _, h := range strings.Split(*hosts, ",") {
			tt := *t
			tt.host = h
			if tt.sni != "" {
				tt.sni = h
			}
			targets = append(targets, &tt)
		}
	}

	held := make([]net.Conn, *conns)
	var errs atomic.Int64
	var firstErr atomic.Value
	next := make(chan int)
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < *parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			br := bufio.NewReaderSize(nil, 4096)
			for i := range next {
				var laddr *net.TCPAddr
				if len(srcs) > 0 {
					laddr = srcs[i%len(srcs)]
				}
				tt := targets[i%len(targets)]
				var raw net.Conn
				var err error
				if *proto == "ws" {
					raw, err = openIdleWS(tt, laddr)
				} else {
					raw, err = openIdleHTTP(tt, laddr, br)
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				held[i] = raw
			}
		}()
	}
	for i := range held {
		next <- i
	}
	close(next)
	wg.Wait()
	open := 0
	for _, c := range held {
		if c != nil {
			open++
		}
	}
	out := map[string]any{"mode": mode, "proto": *proto, "requested": *conns, "open": open, "errors": errs.Load(),
		"open_seconds": round(time.Since(t0).Seconds(), 2), "sources": len(srcs), "nofile": nofile}
	if e := firstErr.Load(); e != nil {
		out["first_error"] = e
	}
	b, _ := json.Marshal(out)
	fmt.Printf("READY %s\n", b)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case <-time.After(*hold):
	}
	for _, c := range held {
		if c != nil {
			_ = c.Close()
		}
	}
	return nil
}

func dialFrom(ctx context.Context, addr string, laddr *net.TCPAddr) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	if laddr != nil {
		d.LocalAddr = laddr
	}
	return d.DialContext(ctx, "tcp", addr)
}

// openIdleHTTP connects, handshakes, sends one request, reads its response
// and returns the TCP socket.
func openIdleHTTP(t *target, laddr *net.TCPAddr, br *bufio.Reader) (net.Conn, error) {
	raw, err := dialFrom(context.Background(), t.addr, laddr)
	if err != nil {
		return nil, err
	}
	c := raw
	if t.sni != "" {
		c = tlsClient(raw, t)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err = c.Write(t.request()); err == nil {
		br.Reset(c)
		var st int
		var closeConn bool
		st, closeConn, err = readResponse(br)
		if err == nil && (st/100 != 2 || closeConn) {
			err = fmt.Errorf("response %d (close: %v)", st, closeConn)
		}
		if err == nil && br.Buffered() > 0 {
			err = errors.New("bytes after the response")
		}
	}
	br.Reset(nil)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return raw, nil
}

// openIdleWS opens a WebSocket, exchanges one echo and returns the TCP
// socket.
func openIdleWS(t *target, laddr *net.TCPAddr) (net.Conn, error) {
	var raw net.Conn
	d, url := wsDialer(t)
	d.NetDialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		c, err := dialFrom(ctx, t.addr, laddr)
		raw = c
		return c, err
	}
	d.ReadBufferSize, d.WriteBufferSize = 512, 512
	c, resp, err := d.Dial(url, nil)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		if raw != nil {
			_ = raw.Close()
		}
		return nil, err
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err = c.WriteMessage(websocket.TextMessage, []byte("hello")); err == nil {
		_, _, err = c.ReadMessage()
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return raw, nil
}

// tlsClient wraps raw in a TLS client for t (the handshake happens on the
// first write).
func tlsClient(raw net.Conn, t *target) net.Conn {
	return tls.Client(raw, t.tlsConfig())
}
