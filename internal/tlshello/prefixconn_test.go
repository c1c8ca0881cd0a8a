package tlshello

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

func TestPrefixConn(t *testing.T) {
	c1, c2 := net.Pipe()
	defer func() { _ = c1.Close() }()
	go func() {
		_, _ = c2.Write([]byte("world"))
		_ = c2.Close()
	}()
	pc := NewPrefixConn(c1, []byte("hello "))
	p := pc.(*PrefixConn)
	b := make([]byte, 4)
	n, err := pc.Read(b)
	if err != nil || string(b[:n]) != "hell" || p.Buffered() != 2 {
		t.Fatalf("first read %q %v", b[:n], err)
	}
	if n, err := pc.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read %d %v", n, err)
	}
	n, err = pc.Read(b)
	if err != nil || string(b[:n]) != "o " {
		t.Fatalf("second read %q %v (prefix and conn bytes must not mix)", b[:n], err)
	}
	if p.prefix != nil {
		t.Fatalf("prefix not released")
	}
	rest, err := io.ReadAll(pc)
	if err != nil || string(rest) != "world" {
		t.Fatalf("rest %q %v", rest, err)
	}
	if pc.LocalAddr() != c1.LocalAddr() || p.NetConn() != c1 {
		t.Fatalf("methods do not delegate")
	}
	if err := p.CloseWrite(); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("CloseWrite on a pipe: %v", err)
	}
	if NewPrefixConn(c1, []byte{}).(*PrefixConn).prefix != nil {
		t.Fatalf("empty prefix kept")
	}
}

func TestPrefixConnCloseWriteTCP(t *testing.T) {
	cli, srv := chTCPPair(t)
	pc := NewPrefixConn(srv, []byte("x")).(*PrefixConn)
	if err := pc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = cli.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := cli.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after CloseWrite: %d %v", n, err)
	}
}

// writeCountConn counts the Writes that reach a real connection.
type writeCountConn struct {
	net.Conn
	mu     sync.Mutex
	writes int
}

func (c *writeCountConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *writeCountConn) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// TestPrefixConnHeldWrites: under crypto/tls, a 64 KiB write is four TLS
// records; held, they reach the socket in one Write, and the peer decrypts
// exactly what was sent. Outside a hold, writes pass straight through.
func TestPrefixConnHeldWrites(t *testing.T) {
	cert, pool := chTestCert(t)
	cli, srv := chTCPPair(t)
	counted := &writeCountConn{Conn: srv}
	pc := NewPrefixConn(counted, nil).(*PrefixConn)
	server := tls.Server(pc, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13, DynamicRecordSizingDisabled: true})
	client := tls.Client(cli, &tls.Config{RootCAs: pool, ServerName: "team--demo--web.apps.test"})
	errc := make(chan error, 1)
	go func() { errc <- client.Handshake() }()
	if err := server.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 64<<10)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	got := make(chan []byte, 1)
	go func() {
		_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 2*len(payload))
		_, err := io.ReadFull(client, b)
		if err != nil {
			b = nil
		}
		got <- b
	}()

	before := counted.count()
	if _, err := server.Write(payload); err != nil { // not held: one Write per record
		t.Fatal(err)
	}
	if n := counted.count() - before; n < 4 {
		t.Fatalf("unheld 64 KiB write reached the socket in %d writes; want one per record (>= 4)", n)
	}
	before = counted.count()
	pc.HoldWrites()
	if _, err := server.Write(payload); err != nil {
		t.Fatal(err)
	}
	if n := counted.count() - before; n != 0 {
		t.Fatalf("%d writes reached the socket while held", n)
	}
	if err := pc.FlushWrites(); err != nil {
		t.Fatal(err)
	}
	if n := counted.count() - before; n != 1 {
		t.Fatalf("held 64 KiB write reached the socket in %d writes; want 1", n)
	}
	b := <-got
	if b == nil || !bytes.Equal(b[:len(payload)], payload) || !bytes.Equal(b[len(payload):], payload) {
		t.Fatal("the peer did not decrypt exactly what was written")
	}
	if err := pc.FlushWrites(); err != nil { // nothing held: a no-op
		t.Fatal(err)
	}
}
