// Command benchapp is the backend app of the side-by-side proxy benchmark
// (bench/run.sh): an HTTP/1.1 server with a small response at /, 64 KiB and
// 1 MiB bodies at /64k and /1m, and a WebSocket echo at /ws. It can serve
// plain HTTP and TLS at once; the TLS listener is the "direct" bound that no
// proxy can beat.
//
// By default it answers GET requests on a lean path (a request head parsed
// by hand, one prepared response written at once) so that the backend, which
// shares a core with the load generator, costs little and the proxy under
// test is what saturates. -nethttp serves everything with net/http instead.
// WebSocket upgrades always go to gorilla/websocket.
//
// -grpc-addr also serves gRPC in h2c (plaintext HTTP/2) on its own port:
// grpc_testing.TestService's UnaryCall and FullDuplexCall (grpc.go), for
// the gRPC workloads.
//
// -stats-addr serves GET /stats (plain HTTP, JSON): the connections
// accepted and the requests answered so far, from which run.sh derives how
// often a proxy opened a new connection to the app ("app dials per 1,000
// requests").
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

func body(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}

var (
	small = []byte(`{"ok":true,"app":"benchapp","msg":"hello from the benchmark backend, about one hundred bytes."}` + "\n")
	k64   = body(64 << 10)
	m1    = body(1 << 20)
)

var upgrader = websocket.Upgrader{ReadBufferSize: 4096, WriteBufferSize: 4096, CheckOrigin: func(*http.Request) bool { return true }}

func wsEcho(w http.ResponseWriter, r *http.Request) {
	c, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer func() { _ = c.Close() }()
	for {
		mt, p, err := c.ReadMessage()
		if err != nil {
			return
		}
		if err := c.WriteMessage(mt, p); err != nil {
			return
		}
	}
}

// Counters behind -stats-addr: connections accepted (plain, TLS and gRPC)
// and requests answered (WebSocket upgrades included; gRPC: unary calls and
// streamed messages).
var accepts, requests atomic.Uint64

func statsHandler(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, "{\"accepts\":%d,\"requests\":%d}\n", accepts.Load(), requests.Load())
}

func netHTTPHandler() http.Handler {
	serve := func(b []byte) http.HandlerFunc {
		n := strconv.Itoa(len(b))
		return func(w http.ResponseWriter, _ *http.Request) {
			requests.Add(1)
			h := w.Header()
			h["Content-Type"] = []string{"application/octet-stream"}
			h["Content-Length"] = []string{n}
			_, _ = w.Write(b)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", serve(small))
	mux.HandleFunc("/64k", serve(k64))
	mux.HandleFunc("/1m", serve(m1))
	mux.HandleFunc("/ws", wsEcho)
	return mux
}

// prepared responses of the lean path, head and body in one buffer.
func prepared(b []byte) []byte {
	head := "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n"
	return append([]byte(head), b...)
}

var (
	respSmall    = prepared(small)
	resp64k      = prepared(k64)
	resp1m       = prepared(m1)
	respNotFound = []byte("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
	respBad      = []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
)

// leanConn serves one connection: GET requests without bodies are answered
// from the prepared responses; a WebSocket upgrade is handed to gorilla.
func leanConn(c net.Conn) {
	defer func() { _ = c.Close() }()
	br := bufio.NewReaderSize(c, 4096)
	for {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Minute))
		line, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		// "GET /path HTTP/1.1"
		sp1 := bytes.IndexByte(line, ' ')
		if sp1 < 0 {
			_, _ = c.Write(respBad)
			return
		}
		rest := line[sp1+1:]
		sp2 := bytes.IndexByte(rest, ' ')
		if sp2 < 0 {
			_, _ = c.Write(respBad)
			return
		}
		method := string(line[:sp1])
		target := string(rest[:sp2])
		var hdr http.Header
		upgrade, closeAfter := false, false
		var length int64
		for {
			h, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(h) <= 2 {
				break
			}
			i := bytes.IndexByte(h, ':')
			if i < 0 {
				continue
			}
			name, val := h[:i], bytes.TrimSpace(h[i+1:])
			switch {
			case bytes.EqualFold(name, []byte("Upgrade")):
				upgrade = true
			case bytes.EqualFold(name, []byte("Connection")):
				closeAfter = bytes.EqualFold(val, []byte("close"))
			case bytes.EqualFold(name, []byte("Content-Length")):
				length, _ = strconv.ParseInt(string(val), 10, 64)
			}
			if hdr == nil {
				hdr = http.Header{}
			}
			hdr.Add(string(name), string(val))
		}
		if upgrade {
			u, err := url.ParseRequestURI(target)
			if err != nil || u.Path != "/ws" {
				_, _ = c.Write(respNotFound)
				return
			}
			r := &http.Request{Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: hdr, Host: hdr.Get("Host"), RequestURI: target, RemoteAddr: c.RemoteAddr().String()}
			_ = c.SetReadDeadline(time.Time{})
			requests.Add(1)
			wsEcho(&hijackWriter{c: c, br: br, h: http.Header{}}, r)
			return
		}
		if length > 0 {
			if _, err := io.CopyN(io.Discard, br, length); err != nil {
				return
			}
		}
		var resp []byte
		switch target {
		case "/":
			resp = respSmall
		case "/64k":
			resp = resp64k
		case "/1m":
			resp = resp1m
		default:
			resp = respNotFound
		}
		requests.Add(1)
		if _, err := c.Write(resp); err != nil || closeAfter {
			return
		}
	}
}

// hijackWriter is the http.ResponseWriter gorilla's Upgrade needs: it only
// hijacks.
type hijackWriter struct {
	c      net.Conn
	br     *bufio.Reader
	h      http.Header
	status int
}

func (w *hijackWriter) Header() http.Header { return w.h }
func (w *hijackWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.c.Write(b)
}
func (w *hijackWriter) WriteHeader(code int) {
	if w.status != 0 {
		return
	}
	w.status = code
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	_ = w.h.Write(&b)
	b.WriteString("Connection: close\r\n\r\n")
	_, _ = w.c.Write(b.Bytes())
}
func (w *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.status != 0 {
		return nil, nil, errors.New("response already written")
	}
	w.status = -1
	return w.c, bufio.NewReadWriter(w.br, bufio.NewWriter(w.c)), nil
}

func serveLean(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return err
		}
		accepts.Add(1)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		go leanConn(c)
	}
}

// tlsLean wraps accepted connections in TLS (handshake on first use, in the
// connection's goroutine).
type tlsLean struct {
	net.Listener
	cfg *tls.Config
}

func (l tlsLean) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return tls.Server(c, l.cfg), nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "plain HTTP/1.1 listen addresses, comma-separated (empty: none)")
	tlsAddr := flag.String("tls-addr", "", "TLS listen address (empty: none)")
	certFile := flag.String("cert", "", "TLS certificate (PEM)")
	keyFile := flag.String("key", "", "TLS key (PEM)")
	useNetHTTP := flag.Bool("nethttp", false, "serve with net/http instead of the lean path")
	statsAddr := flag.String("stats-addr", "", "plain HTTP address of GET /stats: connections accepted, requests answered (empty: none)")
	grpcAddr := flag.String("grpc-addr", "", "gRPC in h2c (plaintext HTTP/2) listen address: grpc_testing.TestService UnaryCall and FullDuplexCall (empty: none)")
	flag.Parse()

	if *statsAddr != "" {
		ln, err := net.Listen("tcp", *statsAddr)
		if err != nil {
			log.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/stats", statsHandler)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { log.Fatal(srv.Serve(ln)) }()
	}

	serve := func(ln net.Listener) {
		if *useNetHTTP {
			srv := &http.Server{
				Handler:           netHTTPHandler(),
				ReadHeaderTimeout: 30 * time.Second,
				IdleTimeout:       10 * time.Minute,
				TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
				ErrorLog:          log.New(os.Stderr, "benchapp: ", 0),
				ConnState: func(_ net.Conn, st http.ConnState) {
					if st == http.StateNew {
						accepts.Add(1)
					}
				},
			}
			log.Fatal(srv.Serve(ln))
		}
		log.Fatal(serveLean(ln))
	}
	for _, a := range strings.Split(*addr, ",") {
		if a == "" {
			continue
		}
		ln, err := net.Listen("tcp", a)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("plain %s\n", ln.Addr())
		go serve(ln)
	}
	if *tlsAddr != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			log.Fatal(err)
		}
		ln, err := net.Listen("tcp", *tlsAddr)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("tls %s\n", ln.Addr())
		cfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
		go serve(tlsLean{ln, cfg})
	}
	if *grpcAddr != "" {
		ln, err := net.Listen("tcp", *grpcAddr)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("grpc %s\n", ln.Addr())
		go func() { log.Fatal(serveGRPC(ln)) }()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
