//go:build unix

package dispatch

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// TestUnitWSPumpRawSocket: a direction whose source is a plain socket (the
// app's side) is copied by copyRaw inside one RawConn.Read: every byte is
// forwarded in order, through reads that fill the buffer and reads that
// drain the socket (after which it waits without a read that finds
// nothing), until the app closes; then the parking deadline still applies.
func TestUnitWSPumpRawSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	appSide, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = appSide.Close() }()
	ours, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ours.Close() }()

	client := newRecConn()
	sp := newWSSplice(client, client, ours, time.Hour)
	p := &wsPump{w: sp, src: pumpSource{r: ours, conn: ours, raw: ours}, d: &sp.toClient, pool: newTestPool(64)}
	if p.rawSource() == nil {
		t.Fatal("a TCP source is not read raw")
	}
	frames := [][]byte{
		wsFrame(true, 2, patterned(62), false, 0),   // exactly one 64-byte buffer
		wsFrame(true, 2, patterned(5000), false, 0), // many full buffers, then a drained read
		wsFrame(true, 1, []byte("tail"), false, 0),  // after the waits
	}
	var want []byte
	done := make(chan error, 1)
	go func() { done <- p.copy() }()
	for i, f := range frames {
		if _, err := appSide.Write(f); err != nil {
			t.Fatal(err)
		}
		want = append(want, f...)
		testutil.Eventually(t, 5*time.Second, "the frame forwarded", func() bool { return len(client.written()) >= len(want) })
		if !bytes.Equal(client.written(), want) {
			t.Fatalf("after frame %d the client got %d bytes, want %d in order", i, len(client.written()), len(want))
		}
	}
	_ = appSide.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("copy ended with %v after the app closed, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("copy did not end when the app closed")
	}
	if p.total != int64(len(want)) {
		t.Fatalf("total %d, want %d", p.total, len(want))
	}
}

// TestUnitWSPumpRawNotTLS: a direction read through another reader (TLS
// over the socket) is not read raw.
func TestUnitWSPumpRawNotTLS(t *testing.T) {
	c := newRecConn()
	p := &wsPump{src: pumpSource{r: eofReader(nil), conn: c, raw: c}}
	if p.rawSource() != nil {
		t.Fatal("a source read through another reader is read raw")
	}
}
